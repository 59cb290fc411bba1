#!/usr/bin/env python3
"""Measure a small Llama-style JAX training step under the activation policies of policies.json, LHS on and off.

Policies (MaxText checkpoint names, jax.checkpoint over scanned layers), from scripts/jax_check/policies.json:
  device   - save QKV and the other layer outputs
  offload  - save the others, offload QKV to pinned host memory
  remat    - save the others, recompute QKV in the backward pass
The same table gives the hbmsim commands (policy_table.hbmsim_command: --policy custom plus --tensor
NAME=device|offload for exactly the names JAX saves or offloads), so both describe one program.
Each (policy, LHS) configuration runs in a fresh subprocess, because XLA_FLAGS
(--xla_gpu_enable_latency_hiding_scheduler) is read once when JAX starts. With --attention cudnn, the first
configuration whose cuDNN attention fails and whose XLA attention works decides XLA for all later ones.

Writes OUT/results.json (one object per config) and OUT/config.json (HuggingFace-style model config).
The predicted-vs-measured comparison normally runs afterwards on a machine with hbmsim
(scripts/gpu_compare.sh); --hbmsim PATH runs it here instead.
Exit status: 0 ok, 1 some configuration failed, 3 JAX is not importable.
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from policy_table import (MODEL, POLICIES, POLICY_NAMES, TRAINING, hbmsim_command, hf_config,  # noqa: E402
                          run_hbmsim, write_json_atomically)


# --------------------------------------------------------------------------------------------------
# Worker: one configuration, in its own process (JAX imported here only).
# --------------------------------------------------------------------------------------------------

def run_worker(policy_name, lhs, steps, warmup, attention):
    import functools

    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    m = MODEL
    B, S = TRAINING["batch"], TRAINING["seq"]
    D, L, H, KV, HD, F, V = (m["d_model"], m["num_layers"], m["num_heads"], m["num_kv_heads"],
                             m["head_dim"], m["mlp_dim"], m["vocab_size"])
    act = jnp.bfloat16

    cp = jax.checkpoint_policies
    table = POLICIES[policy_name]  # the same entry policy_table.hbmsim_command turns into hbmsim flags
    if table["offload"]:
        try:  # older JAX releases keep memory kinds (pinned_host) behind this flag
            jax.config.update("jax_enable_memories", True)
        except Exception:
            pass
        policy = cp.save_and_offload_only_these_names(
            names_which_can_be_saved=list(table["save"]), names_which_can_be_offloaded=list(table["offload"]),
            offload_src="device", offload_dst="pinned_host")
    else:
        policy = cp.save_only_these_names(*table["save"])

    def init_params(key):
        ks = jax.random.split(key, 10)

        def normal(k, shape, fan_in):
            return jax.random.normal(k, shape, jnp.float32) / math.sqrt(fan_in)

        return {
            "embed": normal(ks[0], (V, D), 1.0) * 0.02,
            "layers": {
                "attn_norm": jnp.ones((L, D), jnp.float32),
                "wq": normal(ks[1], (L, D, H * HD), D),
                "wk": normal(ks[2], (L, D, KV * HD), D),
                "wv": normal(ks[3], (L, D, KV * HD), D),
                "wo": normal(ks[4], (L, H * HD, D), H * HD),
                "mlp_norm": jnp.ones((L, D), jnp.float32),
                "wi_0": normal(ks[5], (L, D, F), D),
                "wi_1": normal(ks[6], (L, D, F), D),
                "wo_mlp": normal(ks[7], (L, F, D), F),
            },
            "final_norm": jnp.ones((D,), jnp.float32),
            "lm_head": normal(ks[8], (D, V), D),
        }

    def rms_norm(x, w):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + m["rms_norm_eps"])
        return (y * w).astype(act)

    def rope(x):  # x: [B, S, N, HD]
        half = HD // 2
        freq = m["rope_theta"] ** (-jnp.arange(half, dtype=jnp.float32) / half)
        ang = jnp.arange(S, dtype=jnp.float32)[:, None] * freq[None, :]
        cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
        xf = x.astype(jnp.float32)
        x1, x2 = xf[..., :half], xf[..., half:]
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(act)

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=attention)

    def layer(x, p):
        x = checkpoint_name(x, "decoder_layer_input")
        h = rms_norm(x, p["attn_norm"])
        q = checkpoint_name(h @ p["wq"].astype(act), "query_proj")
        k = checkpoint_name(h @ p["wk"].astype(act), "key_proj")
        v = checkpoint_name(h @ p["wv"].astype(act), "value_proj")
        q = rope(q.reshape(B, S, H, HD))
        k = rope(k.reshape(B, S, KV, HD))
        v = v.reshape(B, S, KV, HD)
        ctx = checkpoint_name(attend(q, k, v).reshape(B, S, H * HD), "context")
        x = x + checkpoint_name(ctx @ p["wo"].astype(act), "out_proj")
        h = rms_norm(x, p["mlp_norm"])
        g = checkpoint_name(h @ p["wi_0"].astype(act), "mlpwi_0")
        u = checkpoint_name(h @ p["wi_1"].astype(act), "mlpwi_1")
        y = checkpoint_name((jax.nn.silu(g) * u) @ p["wo_mlp"].astype(act), "mlpwo")
        return x + y, None

    body = jax.checkpoint(layer, policy=policy, prevent_cse=False)  # prevent_cse off under scan, as MaxText

    def loss_fn(params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]  # tokens: [B, S + 1]
        x = params["embed"].astype(act)[inputs]
        x, _ = jax.lax.scan(body, x, params["layers"])
        logits = rms_norm(x, params["final_norm"]) @ params["lm_head"].astype(act)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(nll)

    def adamw(params, grads, opt, lr=1e-4, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
        t = opt["t"] + 1
        mu = jax.tree_util.tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, opt["mu"], grads)
        nu = jax.tree_util.tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, opt["nu"], grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        new = jax.tree_util.tree_map(
            lambda p, m_, v_: p - lr * ((m_ / c1) / (jnp.sqrt(v_ / c2) + eps) + wd * p), params, mu, nu)
        return new, {"mu": mu, "nu": nu, "t": t}

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        params, opt = adamw(params, grads, opt)
        return params, opt, loss

    params = jax.jit(init_params)(jax.random.PRNGKey(0))
    zeros = jax.jit(lambda p: jax.tree_util.tree_map(jnp.zeros_like, p))
    opt = {"mu": zeros(params), "nu": zeros(params), "t": jnp.zeros((), jnp.float32)}
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, S + 1), 0, V, jnp.int32)
    n_params = sum(int(x.size) for x in jax.tree_util.tree_leaves(params))

    t0 = time.perf_counter()
    compiled = train_step.lower(params, opt, tokens).compile()
    compile_s = time.perf_counter() - t0
    mem = {}
    try:
        ma = compiled.memory_analysis()
        for key in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                    "alias_size_in_bytes", "generated_code_size_in_bytes", "host_temp_size_in_bytes",
                    "host_argument_size_in_bytes", "host_output_size_in_bytes", "host_alias_size_in_bytes"):
            if hasattr(ma, key):
                mem[key] = int(getattr(ma, key))
        if all(k in mem for k in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                                  "alias_size_in_bytes")):
            # What the compiled step itself needs on device: donated outputs alias their arguments.
            mem["device_total_bytes"] = (mem["argument_size_in_bytes"] + mem["output_size_in_bytes"]
                                         - mem["alias_size_in_bytes"] + mem["temp_size_in_bytes"])
    except Exception as e:  # memory_analysis is best effort across JAX versions
        mem["error"] = repr(e)

    times, losses = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        params, opt, loss = compiled(params, opt, tokens)
        loss.block_until_ready()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if i >= warmup:
            times.append(dt)
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "step_time_s": statistics.median(times),
        "step_times_s": times,
        "peak_hbm_bytes": stats.get("peak_bytes_in_use"),
        "peak_hbm_bytes_note": ("memory_stats()['peak_bytes_in_use'] since the process started: includes XLA's "
                                "autotuning buffers and init-time arrays, so it can exceed what the step needs; "
                                "compiled_memory_analysis.device_total_bytes is the compiled step's own figure"),
        "bytes_limit": stats.get("bytes_limit"),
        "compile_s": compile_s,
        "compiled_memory_analysis": mem,
        "losses": losses,
        "num_params": n_params,
        "jax_version": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        "attention_implementation": attention or "default",
    }


# --------------------------------------------------------------------------------------------------
# Parent: one subprocess per configuration, then the optional hbmsim comparison.
# --------------------------------------------------------------------------------------------------

def run_config(policy, lhs, args, timeout_s):
    env = dict(os.environ)
    flag = "--xla_gpu_enable_latency_hiding_scheduler=" + ("true" if lhs else "false")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    record = {"policy": policy, "lhs": lhs, "xla_flags": env["XLA_FLAGS"], "model": MODEL, "training": TRAINING,
              "policy_table": POLICIES[policy]}
    attempts = [args.attention, "xla"] if args.attention == "cudnn" else [args.attention]
    errors = []
    for attention in attempts:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", policy, "--lhs", "on" if lhs else "off",
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--attention", attention]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            errors.append("attention=%s: timed out after %.0f s" % (attention, timeout_s))
            break  # a second attempt would not fit either
        record["wall_s"] = time.perf_counter() - t0
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode == 0 and lines:
            record.update(json.loads(lines[-1][len("RESULT "):]))
            break
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        errors.append("attention=%s: exit %d: %s" % (attention, p.returncode, " | ".join(tail)))
        timeout_s = max(30.0, timeout_s - record["wall_s"])
    if "step_time_s" not in record:
        record["error"] = "; ".join(errors)
    elif errors:
        record["fallback_from"] = errors
    return record


def simulate(hbmsim, config_path, policy, lhs, calibration):
    cmd = hbmsim_command(hbmsim, config_path, policy, lhs, calibration)
    out, failed = run_hbmsim(cmd)
    if failed:
        return failed
    return {"command": cmd, "step_time_s": out.get("step_time_s"), "hbm_peak_bytes": out.get("hbm_peak_bytes"),
            "output": out}


def fmt(v, scale=1.0, digits=3):
    return "-" if v is None else ("%.*f" % (digits, v / scale))


def print_table(results):
    gib = float(1 << 30)
    head = "%-16s %10s %10s %8s %10s %10s  %s" % ("config", "meas s", "pred s", "err %", "meas GiB",
                                                   "pred GiB", "note")
    print(head)
    print("-" * len(head))
    for r in results:
        name = "%s/lhs-%s" % (r["policy"], "on" if r["lhs"] else "off")
        pred = r.get("hbmsim") or {}
        ms, ps = r.get("step_time_s"), pred.get("step_time_s")
        err = 100.0 * (ps - ms) / ms if (ms and isinstance(ps, (int, float))) else None
        note = r.get("error") or pred.get("error") or ""
        print("%-16s %10s %10s %8s %10s %10s  %s" % (name, fmt(ms), fmt(ps), fmt(err, digits=1),
                                                     fmt(r.get("peak_hbm_bytes"), gib, 2),
                                                     fmt(pred.get("hbm_peak_bytes"), gib, 2), note))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="jax_check_out", help="output directory (results.json, config.json)")
    ap.add_argument("--hbmsim", help="hbmsim binary: compare each config with `hbmsim simulate`")
    ap.add_argument("--calibration", help="calibration profile passed to hbmsim simulate")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per config (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation")
    ap.add_argument("--policies", default=",".join(POLICY_NAMES),
                    help="comma list of policies.json names (%s)" % ",".join(POLICY_NAMES))
    ap.add_argument("--lhs", default="on,off", help="comma list of on,off")
    ap.add_argument("--attention", default="cudnn", choices=["cudnn", "xla"],
                    help="jax.nn.dot_product_attention implementation (cudnn falls back to xla)")
    ap.add_argument("--time-budget-s", type=float, default=420.0, help="stop starting configs after this")
    ap.add_argument("--config-timeout-s", type=float, default=170.0, help="limit for one config")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if importlib.util.find_spec("jax") is None:
        print("llama_offload_check: JAX is not importable (%s); nothing measured" % sys.executable,
              file=sys.stderr)
        return 3

    if args.worker:
        result = run_worker(args.worker, args.lhs == "on", args.steps, args.warmup, args.attention)
        print("RESULT " + json.dumps(result))
        return 0

    policies = [p for p in args.policies.split(",") if p]
    lhs_values = [v == "on" for v in args.lhs.split(",") if v]
    for p in policies:
        if p not in POLICY_NAMES:
            ap.error("unknown policy %s" % p)
    os.makedirs(args.out, exist_ok=True)
    config_path = os.path.abspath(os.path.join(args.out, "config.json"))
    results_path = os.path.join(args.out, "results.json")
    write_json_atomically(config_path, hf_config())

    start = time.perf_counter()
    results = []
    attention_decided_by = None
    for lhs in lhs_values:
        for policy in policies:
            left = args.time_budget_s - (time.perf_counter() - start)
            if left < 45:
                results.append({"policy": policy, "lhs": lhs, "model": MODEL, "training": TRAINING,
                                "error": "skipped: time budget spent"})
                continue
            print("llama_offload_check: %s lhs=%s (%.0f s left)" % (policy, "on" if lhs else "off", left),
                  file=sys.stderr, flush=True)
            r = run_config(policy, lhs, args, min(args.config_timeout_s, left))
            if attention_decided_by:
                r["attention_decided_by"] = attention_decided_by
            elif args.attention == "cudnn" and r.get("fallback_from") and "step_time_s" in r:
                # cuDNN attention failed here and XLA's worked: decide once, not again in every process.
                args.attention = "xla"
                attention_decided_by = "%s/lhs-%s: cudnn failed (%s), xla worked" % (
                    policy, "on" if lhs else "off", r["fallback_from"][0][:300])
                r["attention_decided_by"] = attention_decided_by
                print("llama_offload_check: attention = xla for the remaining configs (%s)" % attention_decided_by,
                      file=sys.stderr, flush=True)
            results.append(r)
            write_json_atomically(results_path, results)  # partial results survive a later timeout

    if args.hbmsim:
        if os.path.exists(args.hbmsim):
            for r in results:
                r["hbmsim"] = simulate(args.hbmsim, config_path, r["policy"], r["lhs"], args.calibration)
        else:
            print("llama_offload_check: --hbmsim %s does not exist; no comparison" % args.hbmsim, file=sys.stderr)
    write_json_atomically(results_path, results)
    print_table(results)
    print("results: %s\nmodel config: %s" % (results_path, config_path))
    return 0 if all("step_time_s" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
