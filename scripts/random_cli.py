#!/usr/bin/python3
"""Runs the hbmsim CLI with random flags and reports what no input may do (hbmsim_stress does the same for the
library's laws on drawn configurations; this drives the commands themselves, as a user would).

Every run must exit 0 (a result) or 2 (bad input, one line naming what), never anything else or "internal
error"; every JSON report must have MFU <= 1, executed FLOPs >= the model's and a finite, positive step. Modes:
  simulate  random layouts, schedules, policies, offload counts, overlaps and what-ifs; a run whose loop was
            fast-forwarded is run again with --no-fast-forward and must agree within 1e-9
  plan      the eight plans (largest-batch, best-policy, break-even, offload-layers, recompute-layers,
            hbm-needed, layout and scale with the drawn degrees held) over random layouts, with and without --json
  profiles  random calibration profiles (scales and tables from 1e-300 up, measured rates from 1 byte/s)
  systems   random system files: a shipped one (data/systems) with its figures (SMs among them) scaled by up to 30x
            either way and its counts (NVLink domain, GPUs per CPU and per host link) redrawn, simulated as in simulate
            mode
  models    random Hugging Face configs: a shipped one (data/hf) with its sizes redrawn (layers, widths, heads,
            experts, windows, layer patterns), simulated as in simulate mode
Prints each finding with its command line; exit status 1 if any, 0 if none.

    /usr/bin/python3 scripts/random_cli.py [build/cli/hbmsim] --mode plan [--seed 1] [--count 200]

Found (forty-eighth session): a deadlock and heap corruption in the fast-forward (a copy outlasting an iteration),
and plan largest-batch refusing its own Megatron MoE variants.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile

SYSTEMS = ["gb200-nvl72", "gb300-nvl72", "vr-nvl144", "h100-hgx", "h200-hgx", "b200-hgx", "b300-hgx"]
MODELS = ["llama3.1-8b", "llama3.1-70b", "hf/mixtral-8x7b.config.json", "hf/qwen3-30b-a3b.config.json",
          "hf/gemma-2-9b.config.json", "hf/gpt-oss-20b.config.json", "hf/llama3.2-3b.config.json",
          "hf/qwen3-next-80b-a3b.config.json"]
MOE = ("mixtral", "qwen3-30b", "gpt-oss", "qwen3-next")
POLICIES = ["full", "minimal", "save_qkv_proj", "qkv_proj_offloaded", "minimal_offloaded", "selective", "no_recompute",
            "minimal_with_context"]
# (flag, values, probability): the switches a run may also get.
SWITCHES = [("--tp-comm-overlap", ["on", "off"], 0.2), ("--dp-overlap", ["on", "off"], 0.2), ("--ep-overlap", ["on", "off"], 0.15),
            ("--double-buffering", ["on", "off"], 0.2), ("--sequence-parallel", ["on", "off"], 0.2),
            ("--reshard-weights", ["on", "off"], 0.2), ("--pipelined-collectives", ["on", "off"], 0.2),
            ("--pipelined-transfers", ["on", "off"], 0.3), ("--lhs", ["on", "off"], 0.3), ("--delay-wgrad", ["on", "off"], 0.1),
            ("--pp-p2p", ["blocking", "overlapped"], 0.15), ("--moe-dispatcher", ["alltoall", "flex"], 0.15),
            ("--fp8-saved-activations", ["on", "off"], 0.1), ("--mesh-order", ["maxtext", "megatron"], 0.2),
            ("--cp-exchange", ["all_gather", "ring"], 0.1), ("--sharded-optimizer", ["on", "off"], 0.15),
            ("--optimizer", ["adam", "muon"], 0.1), ("--optimizer-offload", ["host", "device"], 0.15),
            ("--parameter-offload", ["on"], 0.1), ("--weights", ["fp8", "bf16"], 0.3), ("--framework", ["megatron"], 0.35),
            ("--grad-accum", ["2", "4"], 0.15), ("--host-link-bw", ["10e9", "50e9", "200e9"], 0.2),
            ("--hbm-bytes", ["60e9", "100e9"], 0.1), ("--scale-out-bw", ["25e9", "100e9"], 0.1)]
PLANS = ["largest-batch", "best-policy", "break-even", "offload-layers", "recompute-layers", "hbm-needed", "layout", "scale"]


def layout(rng, model):
    """A model, system and random parallel layout, as flags."""
    args = ["--model", model, "--system", rng.choice(SYSTEMS), "--gpus", str(rng.choice([8, 16, 32, 64])),
            "--seq", str(rng.choice([1024, 2048, 4096, 8192]))]
    if rng.random() < 0.3:
        args += ["--tp", str(rng.choice([2, 4]))]
    if rng.random() < 0.45:
        pp = rng.choice([2, 4])
        args += ["--pp", str(pp), "--pp-schedule", rng.choice(["1f1b", "gpipe", "zb-h1"]),
                 "--microbatches", str(rng.choice([pp, 2 * pp, 4 * pp]))]
        if rng.random() < 0.3:
            args += ["--vp", "2"]
    if rng.random() < 0.15:
        args += ["--cp", "2"]
    if any(m in model for m in MOE) or (os.path.isabs(model) and has_experts(model) and rng.random() < 0.7):
        args += ["--ep", str(rng.choice([2, 4, 8]))]
    return args


def has_experts(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return any(k in text for k in ('"num_local_experts"', '"num_experts"', '"n_routed_experts"'))


def switches(rng):
    args = []
    for flag, values, probability in SWITCHES:
        if rng.random() < probability:
            args += [flag, rng.choice(values)]
    return args


def simulate_args(rng, model=None):
    args = ["simulate"] + layout(rng, model or rng.choice(MODELS)) + ["--policy", rng.choice(POLICIES), "--batch", str(rng.choice([1, 2, 4]))]
    draw = rng.random()
    if draw < 0.25:
        args += ["--offload-layers", str(rng.choice([1, 2, 4, 8, 12, 16, 20]))]
    elif draw < 0.4:
        args += ["--recompute-layers", str(rng.choice([1, 2, 4]))]
    return args + switches(rng)


def plan_args(rng):
    kind = rng.choice(PLANS)
    args = ["plan", kind] + layout(rng, rng.choice(MODELS))
    if rng.random() < 0.3:
        args += ["--framework", "megatron"]
    if kind == "break-even":
        args += ["--policy", rng.choice(["qkv_proj_offloaded", "minimal_offloaded"])]
    elif kind == "layout":
        # The layout's degrees given are held; one policy and micro-batch keep the search small.
        args += ["--top", "3", "--micro-batches", "1", "--progress", "off"]
        args += ["--policies" if rng.random() < 0.5 else "--policy", rng.choice(POLICIES)]
    elif kind == "scale":
        # The drawn count and twice it, each searched as layout is (degrees held), with a budget half the time.
        i = args.index("--gpus")
        args[i + 1] = f"{args[i + 1]},{2 * int(args[i + 1])}"
        args += ["--micro-batches", "1", "--progress", "off", "--policy", rng.choice(POLICIES)]
        if rng.random() < 0.5:
            args += ["--tokens", "1e12"] + (["--days", str(rng.choice([1, 30, 1000]))] if rng.random() < 0.5 else [])
        if rng.random() < 0.3:  # several systems compared
            j = args.index("--system")
            args[j + 1] = ",".join(rng.sample(SYSTEMS, 2))
    elif rng.random() < 0.5:
        args += ["--policy", rng.choice(POLICIES)]
    if kind != "largest-batch" and rng.random() < 0.6:
        args += ["--batch", str(rng.choice([1, 2, 4]))]
    return args + (["--json"] if rng.random() < 0.5 else [])


def random_profile(rng, path):
    """Writes a random calibration profile to `path`."""
    def scale():
        return rng.choice([1e-300, 1e-12, 1e-6, 1e-3, 0.5, 1.0, 2.0, 1e6, 1e300]) if rng.random() < 0.1 else 10 ** rng.uniform(-3, 0.5)

    def table():
        xs = sorted({10 ** rng.uniform(3, 13) for _ in range(rng.randint(1, 4))})
        return [[x, min(1.0, 10 ** rng.uniform(-4, 0))] for x in xs]

    names = ["gemm_scale", "nvfp4_gemm_scale", "mxfp8_gemm_scale", "attention_scale", "collective_scale",
             "scale_out_collective_scale", "host_link_scale"]
    doc = {"format": "hbmsim-profile/1", "name": "random", "source": "scripts/random_cli.py",
           "parameters": {n + ("@" + rng.choice(SYSTEMS) if rng.random() < 0.2 else ""): scale() for n in names if rng.random() < 0.4}}
    efficiency = {k: table() for k in ["attention", "memory_bound", "copy", "collective"] if rng.random() < 0.25}
    if rng.random() < 0.25:
        efficiency["gemm"] = {d: table() for d in ["bf16", "fp8", "nvfp4"] if rng.random() < 0.6}
    if efficiency:
        doc["efficiency"] = efficiency
    if rng.random() < 0.3:
        doc["host_link"] = {"h2d_bytes_per_s": 10 ** rng.uniform(0, 12), "d2h_bytes_per_s": 10 ** rng.uniform(0, 12)}
    if rng.random() < 0.2:
        doc["hbm_bandwidth_bytes_per_s"] = 10 ** rng.uniform(0, 13)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


HF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf")


def random_model(rng, path):
    """Writes a shipped HF config with its sizes redrawn to `path`: mostly consistent (heads divisible by KV
    heads, a layer list as long as the layers), sometimes not, which must then be bad input (exit 2)."""
    base = rng.choice(sorted(f for f in os.listdir(HF_DIR) if f.endswith(".json")))
    with open(os.path.join(HF_DIR, base), encoding="utf-8") as f:
        doc = json.load(f)
    d = doc["text_config"] if "text_config" in doc and "hidden_size" not in doc else doc
    shipped_layers = d.get("num_hidden_layers")
    layers = rng.choice([rng.randint(1, 24), 8 * rng.randint(1, 3)])  # often divisible by the pipeline's stages
    kv = rng.choice([1, 2, 4, 8])
    heads = kv * rng.choice([1, 2, 4, 8])
    head_dim = rng.choice([32, 64, 128, 256])
    draws = {"num_hidden_layers": layers, "num_key_value_heads": kv, "num_attention_heads": heads, "head_dim": head_dim,
             "hidden_size": rng.choice([256, 512, 1024, 2048, 2880, 4096]), "vocab_size": rng.choice([1000, 32000, 151936, 262144]),
             "intermediate_size": rng.choice([512, 1536, 2880, 8192, 14336]),
             "moe_intermediate_size": rng.choice([128, 512, 2048]),
             "shared_expert_intermediate_size": rng.choice([0, 512, 2048]),
             "sliding_window": rng.choice([None, 64, 512, 4096, 1 << 20]),
             "sliding_window_pattern": rng.choice([2, 3, 6]), "full_attention_interval": rng.choice([1, 2, 4]),
             "first_k_dense_replace": rng.randint(0, layers - 1), "kv_lora_rank": rng.choice([64, 512]),
             "q_lora_rank": rng.choice([None, 256, 1536]), "qk_rope_head_dim": rng.choice([32, 64]),
             "qk_nope_head_dim": rng.choice([64, 128]), "v_head_dim": rng.choice([64, 128]),
             "attention_chunk_size": rng.choice([512, 8192]), "no_rope_layer_interval": rng.choice([2, 4]),
             "interleave_moe_layer_step": rng.choice([1, 2]), "decoder_sparse_step": rng.choice([1, 2]),
             "tie_word_embeddings": rng.choice([True, False])}
    experts = rng.choice([2, 4, 8, 16, 64])
    for key in ["num_local_experts", "num_experts", "n_routed_experts"]:
        draws[key] = experts
    top = rng.randint(1, experts)
    for key in ["num_experts_per_tok", "experts_per_token"]:
        draws[key] = top
    together = {"num_attention_heads": "num_key_value_heads"}  # drawn as a pair: heads a multiple of KV heads
    for key, value in draws.items():
        if key in d and key not in together.values() and rng.random() < 0.8:
            d[key] = value
            if key in together and together[key] in d:
                d[together[key]] = draws[together[key]]
    for key, value in list(d.items()):
        if not isinstance(value, list) or not value or key == "architectures":
            continue
        if len(value) == shipped_layers:  # one entry per layer: a pattern of the shipped kinds, as long as the layers
            d[key] = [rng.choice(sorted(set(value), key=str)) for _ in range(d["num_hidden_layers"])]
        elif all(isinstance(x, int) for x in value):  # layer numbers: those that still exist
            d[key] = [x for x in value if x < d["num_hidden_layers"]]
    if rng.random() < 0.05:  # sometimes inconsistent on purpose: must be a clear error
        d[rng.choice(["num_hidden_layers", "hidden_size", "num_attention_heads"])] = rng.choice([0, -1, 3])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return base


def model_args(rng, path):
    random_model(rng, path)
    return simulate_args(rng, path)


SYSTEM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "systems")
FRACTIONS = ("host_pinned_fraction",)  # figures that are shares, at most 1


def random_system(rng, path):
    """Writes a shipped system file with its figures and counts redrawn to `path`."""
    base = rng.choice(sorted(f for f in os.listdir(SYSTEM_DIR) if f.endswith(".json")))
    with open(os.path.join(SYSTEM_DIR, base), encoding="utf-8") as f:
        doc = json.load(f)

    def redraw(node, key=""):
        if isinstance(node, dict):
            if isinstance(node.get("value"), (int, float)) and not isinstance(node["value"], bool):
                if rng.random() < 0.5:
                    v = node["value"] * 10 ** rng.uniform(-1.5, 1.5)
                    node["value"] = min(v, 1.0) if key in FRACTIONS else (round(v) if isinstance(node["value"], int) else v)
                return
            for k, v in node.items():
                if k == "domain_gpus" and isinstance(v, int) and rng.random() < 0.4:
                    node[k] = rng.choice([1, 2, 4, 8, 16, 36, 72, 144])
                elif k in ("gpus_per_cpu", "gpus_sharing"):
                    continue  # below, together
                else:
                    redraw(v, k)

    link = doc.get("host_link", {})
    measured = {k: v["value"] / link["per_direction_bytes_per_s"]["value"] for k, v in link.items() if k.startswith("measured_")}
    redraw(doc)
    for k, share in measured.items():  # a measured rate stays the share of the link it was
        link[k]["value"] = share * link["per_direction_bytes_per_s"]["value"]
    cpu = doc.get("host_cpu", {})
    if "gpus_per_cpu" in cpu and rng.random() < 0.4:
        cpu["gpus_per_cpu"] = rng.choice([1, 2, 4, 8])
    if "gpus_sharing" in link:  # as many GPUs as the CPU has, or fewer; one on a dedicated link
        per_cpu = cpu.get("gpus_per_cpu", 1)
        link["gpus_sharing"] = 1 if link.get("sharing") == "dedicated" else rng.choice([n for n in (1, 2, 4, 8) if n <= per_cpu])
    doc["id"] = "random-" + doc["id"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def system_args(rng, path):
    random_system(rng, path)
    args = simulate_args(rng)
    args[args.index("--system") + 1] = path
    return args


def profile_args(rng, path):
    random_profile(rng, path)
    return ["simulate"] + layout(rng, rng.choice(MODELS)) + ["--calibration", path, "--policy", rng.choice(POLICIES), "--json"]


def reports(doc):
    """Every step report in a command's JSON output (a simulate report, or those inside a plan's answer)."""
    if isinstance(doc, dict):
        if "step_time_s" in doc and "mfu" in doc:
            yield doc
        for v in doc.values():
            yield from reports(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from reports(v)


def broken_laws(report):
    step, mfu = report["step_time_s"], report["mfu"]
    if not (isinstance(step, (int, float)) and math.isfinite(step) and step > 0):
        return f"step time {step}"
    if mfu > 1:
        return f"MFU {mfu} above 1"
    if report["executed_flops_per_device"] < report["model_flops_per_device"] * (1 - 1e-12):
        return "executed FLOPs below the model's"
    return ""


def hbm_needed_order(doc):
    """plan hbm-needed's capacities: the least that fits <= the peak with HBM no object <= the least at full speed,
    and the step where it first fits no faster than at full speed ("" if they hold or the output is another's)."""
    if not isinstance(doc, dict) or "hbm_fits_from_bytes" not in doc:
        return ""
    fits, peak, full = doc["hbm_fits_from_bytes"], doc["hbm_needed_bytes"], doc["hbm_full_speed_from_bytes"]
    if not fits <= peak <= full:
        return f"hbm-needed: fits from {fits}, peak {peak}, full speed from {full} (not in that order)"
    if doc["step_time_at_fit_s"] < doc["step_time_s"] * (1 - 1e-9):
        return f"hbm-needed: step {doc['step_time_at_fit_s']} s where it first fits, faster than {doc['step_time_s']} s"
    return ""


def run(binary, args):
    return subprocess.run([binary] + args, capture_output=True, text=True, timeout=600)


EXITS = {}  # exit status -> runs (the summary line: how many gave a result)


def check(binary, args):
    """The finding of one command line ("" if none)."""
    r = run(binary, args)
    EXITS[r.returncode] = EXITS.get(r.returncode, 0) + 1
    if r.returncode not in (0, 2) or "internal error" in r.stderr:
        return f"exit {r.returncode}: {r.stderr.strip()[-300:]}"
    if r.returncode != 0 or "--json" not in args:
        return ""
    doc = json.loads(r.stdout)
    for report in reports(doc):
        if why := broken_laws(report):
            return why
    if why := hbm_needed_order(doc):
        return why
    if args[0] == "simulate" and doc.get("replayed_iterations", 0) > 0:
        return differs_without_fast_forward(binary, args, doc)
    return ""


def differs_without_fast_forward(binary, args, fast):
    r = run(binary, args + ["--no-fast-forward"])
    if r.returncode != 0:
        return f"--no-fast-forward: exit {r.returncode}: {r.stderr.strip()[-300:]}"
    plain = json.loads(r.stdout)
    for key in ["step_time_s", "hbm_peak_bytes", "host_peak_bytes", "executed_flops_per_device"]:
        a, b = fast[key], plain[key]
        if abs(a - b) > 1e-9 * max(abs(a), abs(b), 1e-300):
            return f"{key} {a} with fast-forward, {b} without"
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?", default="build/cli/hbmsim")
    parser.add_argument("--mode", choices=["simulate", "plan", "profiles", "models", "systems"], required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=200)
    o = parser.parse_args()
    if not os.access(o.binary, os.X_OK):
        sys.exit(f"random_cli.py: {o.binary} is not an executable (build first, or name the hbmsim binary)")
    rng = random.Random(o.seed)
    findings = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(o.count):
            args = {"simulate": lambda: simulate_args(rng), "plan": lambda: plan_args(rng),
                    "profiles": lambda: profile_args(rng, os.path.join(tmp, f"profile{i}.json")),
                    "models": lambda: model_args(rng, os.path.join(tmp, f"model{i}.config.json")),
                    "systems": lambda: system_args(rng, os.path.join(tmp, f"system{i}.json"))}[o.mode]()
            if o.mode in ("simulate", "models", "systems"):
                args.append("--json")
            why = check(o.binary, args)
            if why:
                findings += 1
                print(f"run {i}: {why}\n  hbmsim {' '.join(args)}", flush=True)
                if o.mode in ("profiles", "models", "systems"):  # the file goes with the folder: print what it held
                    held = args[args.index({"profiles": "--calibration", "models": "--model", "systems": "--system"}[o.mode]) + 1]
                    print(f"  {o.mode[:-1]}: " + open(held, encoding="utf-8").read(), flush=True)
    print(f"random_cli.py --mode {o.mode} --seed {o.seed}: {o.count} runs ({EXITS.get(0, 0)} results, "
          f"{EXITS.get(2, 0)} bad input), {findings} with findings")
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
