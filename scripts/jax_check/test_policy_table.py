#!/usr/bin/env python3
"""The JAX check and the hbmsim commands it is compared with describe the same program.

Runs without JAX (a stand-in `jax` module records which names the JAX script saves and offloads):
  - policy_table and llama_offload_check import without JAX;
  - for every policy of policies.json, the hbmsim flags are --policy custom plus --tensor NAME=device for
    exactly the names JAX saves and NAME=offload for exactly the names it offloads (every other name is
    rematerialized on both sides);
  - llama_offload_check.run_worker hands JAX exactly those names;
  - with --hbmsim: hbmsim itself resolves each generated command to that policy (config.policy, config.tensors),
    and scripts/gpu_compare.sh turns a returned GPU-run folder into the predicted-vs-measured table.
Usage: test_policy_table.py [--hbmsim PATH] [--repo REPO]      (also collected by pytest)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


class _NoJax:
    """Makes `import jax` fail loudly, so a module that needs JAX at import time is caught."""

    def find_spec(self, name, path=None, target=None):
        if name == "jax" or name.startswith("jax."):
            raise ImportError("test: jax must not be imported here")
        return None


def import_without_jax():
    blocker = _NoJax()
    sys.meta_path.insert(0, blocker)
    try:
        import llama_offload_check  # noqa: F401
        import policy_table  # noqa: F401
        import compare  # noqa: F401
    finally:
        sys.meta_path.remove(blocker)
    return policy_table, llama_offload_check


def expected_tensors(policy):
    import policy_table
    p = policy_table.POLICIES[policy]
    return {**{n: "device" for n in p["save"]}, **{n: "offload" for n in p["offload"]}}


def tensors_from_flags(flags):
    assert flags[:2] == ["--policy", "custom"], flags
    rest = flags[2:]
    assert len(rest) % 2 == 0 and all(f == "--tensor" for f in rest[0::2]), flags
    out = {}
    for spec in rest[1::2]:
        name, _, where = spec.partition("=")
        assert name not in out, "tensor %s given twice" % name
        out[name] = where
    return out


def test_imports_without_jax():
    policy_table, check = import_without_jax()
    assert "jax" not in sys.modules
    assert check.POLICIES is policy_table.POLICIES  # one table, not a copy
    assert set(policy_table.POLICY_NAMES) == {"device", "offload", "remat"}


def test_hbmsim_flags_are_the_jax_policy():
    import policy_table
    for policy in policy_table.POLICY_NAMES:
        got = tensors_from_flags(policy_table.hbmsim_policy_flags(policy))
        assert got == expected_tensors(policy), (policy, got)
        # Names neither saved nor offloaded are remat on both sides.
        for name, where in policy_table.placements(policy).items():
            assert got.get(name, "remat") == where, (policy, name)
        cmd = policy_table.hbmsim_command("hbmsim", "cfg.json", policy, True, "p.json")
        i = cmd.index("--policy")
        assert cmd.count("--policy") == 1 and cmd[i + 1] == "custom"
        assert cmd[cmd.index("--lhs") + 1] == "on" and cmd[cmd.index("--calibration") + 1] == "p.json"
        assert cmd[cmd.index("--batch") + 1] == str(policy_table.TRAINING["batch"])
        assert cmd[cmd.index("--seq") + 1] == str(policy_table.TRAINING["seq"])


def test_the_qkv_policies_differ_only_in_qkv():
    import policy_table
    qkv = {"query_proj", "key_proj", "value_proj"}
    d, o, r = (expected_tensors(p) for p in ("device", "offload", "remat"))
    assert {k: v for k, v in d.items() if k not in qkv} == r == {k: v for k, v in o.items() if k not in qkv}
    assert all(d[n] == "device" and o[n] == "offload" and n not in r for n in qkv)
    assert policy_table.placements("remat")["query_proj"] == "remat"


class _Stop(Exception):
    pass


def fake_jax(calls):
    """A stand-in jax: records the checkpoint policy run_worker builds, then stops it at the first jit."""
    jax = types.ModuleType("jax")

    class Policies:
        @staticmethod
        def save_only_these_names(*names):
            calls.append(("save", list(names), []))
            return "policy"

        @staticmethod
        def save_and_offload_only_these_names(names_which_can_be_saved, names_which_can_be_offloaded,
                                              offload_src, offload_dst):
            calls.append(("offload", list(names_which_can_be_saved), list(names_which_can_be_offloaded)))
            assert (offload_src, offload_dst) == ("device", "pinned_host")
            return "policy"

    def stop(*a, **k):
        raise _Stop()

    jax.checkpoint_policies = Policies
    jax.config = types.SimpleNamespace(update=lambda *a: None)
    jax.checkpoint = lambda f, policy=None, prevent_cse=True: f
    jax.jit = stop
    jnp = types.ModuleType("jax.numpy")
    jnp.bfloat16 = "bfloat16"
    jnp.float32 = "float32"
    ad = types.ModuleType("jax.ad_checkpoint")
    ad.checkpoint_name = lambda x, name: x
    jax.numpy, jax.ad_checkpoint = jnp, ad
    return {"jax": jax, "jax.numpy": jnp, "jax.ad_checkpoint": ad}


def test_jax_worker_saves_and_offloads_the_table():
    import llama_offload_check
    for policy in llama_offload_check.POLICY_NAMES:
        calls = []
        saved = {k: sys.modules.get(k) for k in ("jax", "jax.numpy", "jax.ad_checkpoint")}
        sys.modules.update(fake_jax(calls))
        try:
            llama_offload_check.run_worker(policy, True, 1, 0, "xla")
            raise AssertionError("the stand-in jax.jit did not stop run_worker")
        except _Stop:
            pass
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
        assert len(calls) == 1, calls
        kind, save, offload = calls[0]
        got = {**{n: "device" for n in save}, **{n: "offload" for n in offload}}
        assert got == expected_tensors(policy), (policy, got)
        assert kind == ("offload" if offload else "save")


def check_with_hbmsim(hbmsim, repo):
    # Its files (config, a made-up GPU run, the comparison) go in a folder removed afterwards, pass or fail.
    with tempfile.TemporaryDirectory(prefix="policy-table-test-") as tmp:
        return check_in(hbmsim, repo, tmp)


def check_in(hbmsim, repo, tmp):
    import policy_table
    cfg = os.path.join(tmp, "config.json")
    with open(cfg, "w") as f:
        json.dump(policy_table.hf_config(), f)
    steps = {}
    for policy in policy_table.POLICY_NAMES:
        for lhs in (True, False):
            cmd = policy_table.hbmsim_command(hbmsim, cfg, policy, lhs)
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, (cmd, p.stderr)
            out = json.loads(p.stdout)
            assert out["config"]["policy"] == "custom", out["config"]["policy"]
            assert out["config"]["tensors"] == expected_tensors(policy), (policy, out["config"]["tensors"])
            assert out["config"]["lhs"] == lhs
            steps[(policy, lhs)] = out
    # The table matters to hbmsim: saving QKV needs more HBM than recomputing or offloading it.
    hbm = {p: steps[(p, True)]["hbm_peak_bytes"] for p in policy_table.POLICY_NAMES}
    assert hbm["device"] > hbm["remat"] and hbm["device"] > hbm["offload"], hbm

    # gpu_compare.sh on a folder as a GPU run returns it (made-up measurements, a real profile).
    outdir = os.path.join(tmp, "gpu-out")
    os.makedirs(outdir)
    results = [{"policy": p, "lhs": lhs, "step_time_s": 0.12, "peak_hbm_bytes": 40e9,
                "compiled_memory_analysis": {"device_total_bytes": 30e9},
                "policy_table": policy_table.POLICIES[p]} for p in policy_table.POLICY_NAMES for lhs in (True, False)]
    results.append({"policy": "remat", "lhs": False, "error": "skipped: time budget spent"})
    with open(os.path.join(outdir, "jax_results.json"), "w") as f:
        json.dump(results, f)
    profile = os.path.join(repo, "data", "profiles", "gb200-fitted.json")
    with open(profile) as src, open(os.path.join(outdir, "profile.json"), "w") as dst:
        dst.write(src.read())
    cmp_json = os.path.join(tmp, "compare.json")
    p = subprocess.run(["bash", os.path.join(repo, "scripts", "gpu_compare.sh"), outdir, cmp_json],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, HBMSIM=hbmsim))
    assert p.returncode == 0, (p.stdout, p.stderr)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("device/", "offload/", "remat/"))]
    assert len(lines) == len(results), p.stdout
    rows = json.load(open(cmp_json))["rows"]
    for row in rows[:-1]:
        assert row["datasheet"]["tensors"] == expected_tensors(row["policy"])
        assert row["calibrated"]["step_time_s"] != row["datasheet"]["step_time_s"], row
    assert "time budget" in rows[-1]["notes"][0]
    # A folder without the JAX results is a clear error, not an empty table.
    os.remove(os.path.join(outdir, "jax_results.json"))
    p = subprocess.run(["bash", os.path.join(repo, "scripts", "gpu_compare.sh"), outdir],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, HBMSIM=hbmsim))
    assert p.returncode == 2 and "jax_results.json is missing" in p.stderr, (p.returncode, p.stderr)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hbmsim")
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(HERE)))
    args = ap.parse_args()
    tests = [test_imports_without_jax, test_hbmsim_flags_are_the_jax_policy, test_the_qkv_policies_differ_only_in_qkv,
             test_jax_worker_saves_and_offloads_the_table]
    for t in tests:
        t()
        print("ok:", t.__name__)
    if args.hbmsim:
        table = check_with_hbmsim(args.hbmsim, args.repo)
        print("ok: hbmsim resolves every generated command to the JAX policy; gpu_compare.sh table:\n" + table)
    print("policy table test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
