"""The JAX check's model, training shape and policy table, and the hbmsim commands that describe the same
program. Pure Python (no JAX): the comparison (scripts/jax_check/compare.py) and the tests import it on
machines without JAX; llama_offload_check.py builds its jax.checkpoint policies from the same table.

policies.json: {"policies": {NAME: {"save": [...], "offload": [...]}}}. A name in "save" stays on device, a
name in "offload" goes to pinned host memory, every other checkpoint name is rematerialized: in JAX via
save_only_these_names / save_and_offload_only_these_names, in hbmsim via --policy custom (everything remat)
plus --tensor NAME=device|offload for exactly those names.
"""

import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES_PATH = os.path.join(HERE, "policies.json")

MODEL = {
    "d_model": 2048,
    "num_layers": 16,
    "num_heads": 16,
    "num_kv_heads": 8,
    "head_dim": 128,
    "mlp_dim": 8192,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
}
TRAINING = {"batch": 4, "seq": 2048, "activation_dtype": "bfloat16", "param_dtype": "float32",
            "optimizer": "adamw (fp32 m and v)"}
SYSTEM = "h200-hgx"  # the hbmsim system the check's GPU (one H200) is simulated as

# Every name the JAX layer tags with checkpoint_name (llama_offload_check.run_worker), in layer order.
LAYER_CHECKPOINT_NAMES = ["decoder_layer_input", "query_proj", "key_proj", "value_proj", "context", "out_proj",
                          "mlpwi_0", "mlpwi_1", "mlpwo"]


def load_policies(path=POLICIES_PATH):
    """Returns {name: {"save": [...], "offload": [...], "description": str}}; ValueError on a bad table."""
    with open(path) as f:
        table = json.load(f)
    policies = table.get("policies")
    if not isinstance(policies, dict) or not policies:
        raise ValueError("%s: 'policies' must be a non-empty object" % path)
    for name, p in policies.items():
        for key in ("save", "offload"):
            if not isinstance(p.get(key), list):
                raise ValueError("%s: policies.%s.%s must be a list" % (path, name, key))
            for t in p[key]:
                if t not in LAYER_CHECKPOINT_NAMES:
                    raise ValueError("%s: policies.%s.%s: %r is not a checkpoint name of the JAX layer (%s)"
                                     % (path, name, key, t, ", ".join(LAYER_CHECKPOINT_NAMES)))
            if len(set(p[key])) != len(p[key]):
                raise ValueError("%s: policies.%s.%s lists a name twice" % (path, name, key))
        both = set(p["save"]) & set(p["offload"])
        if both:
            raise ValueError("%s: policies.%s saves and offloads %s" % (path, name, sorted(both)))
        if "decoder_layer_input" not in p["save"]:
            raise ValueError("%s: policies.%s must save decoder_layer_input (the remat boundary; hbmsim always keeps it)"
                             % (path, name))
    return policies


POLICIES = load_policies()
POLICY_NAMES = sorted(POLICIES)


def placements(policy):
    """{checkpoint name: "device" | "offload" | "remat"} for every name of the layer."""
    p = POLICIES[policy]
    out = {}
    for n in LAYER_CHECKPOINT_NAMES:
        out[n] = "device" if n in p["save"] else "offload" if n in p["offload"] else "remat"
    return out


def hbmsim_policy_flags(policy):
    """hbmsim flags for the policy: custom (all remat) plus each saved or offloaded name, as in the table."""
    p = POLICIES[policy]
    flags = ["--policy", "custom"]
    for n in p["save"]:
        flags += ["--tensor", n + "=device"]
    for n in p["offload"]:
        flags += ["--tensor", n + "=offload"]
    return flags


def hf_config():
    m = MODEL
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": m["d_model"],
        "intermediate_size": m["mlp_dim"],
        "num_attention_heads": m["num_heads"],
        "num_key_value_heads": m["num_kv_heads"],
        "num_hidden_layers": m["num_layers"],
        "vocab_size": m["vocab_size"],
        "head_dim": m["head_dim"],
        "max_position_embeddings": TRAINING["seq"],
        "rms_norm_eps": m["rms_norm_eps"],
        "rope_theta": m["rope_theta"],
        "tie_word_embeddings": False,
    }


def hbmsim_command(hbmsim, config_path, policy, lhs, calibration=None):
    """The `hbmsim simulate` command for one JAX configuration (one GPU, the table's policy, LHS on/off)."""
    cmd = [hbmsim, "simulate", "--system", SYSTEM, "--model", config_path, "--gpus", "1",
           "--batch", str(TRAINING["batch"]), "--seq", str(TRAINING["seq"])]
    cmd += hbmsim_policy_flags(policy) + ["--lhs", "on" if lhs else "off"]
    if calibration:
        cmd += ["--calibration", calibration]
    return cmd + ["--json"]


def run_hbmsim(cmd):
    """Runs one `hbmsim simulate --json` command: (its JSON, None), or (None, {command, error}) when it fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, {"command": cmd, "error": repr(e)}
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return None, {"command": cmd, "error": "exit %d: %s" % (p.returncode, err)}
    try:
        return json.loads(p.stdout), None
    except ValueError as e:
        return None, {"command": cmd, "error": "output is not JSON: %s" % e}


def write_json_atomically(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
