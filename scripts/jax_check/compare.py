#!/usr/bin/env python3
"""Predicted vs measured, run where hbmsim is built (not on the GPU machine): reads the JAX check's
results.json (and the calibration profile the same run measured), runs `hbmsim simulate` for each
configuration with the commands policy_table.py generates from policies.json (the table the JAX run used),
once with the datasheet figures and once with the measured profile, and prints one table.

Usage: compare.py --results jax_results.json --hbmsim build/cli/hbmsim [--calibration profile.json]
                  [--json OUT.json]
Exit: 0 table printed, 1 an hbmsim run failed, 2 bad input. No JAX needed.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from policy_table import POLICIES, hbmsim_command, hf_config, run_hbmsim  # noqa: E402


def simulate(cmd):
    out, failed = run_hbmsim(cmd)
    if failed:
        return failed
    return {"command": cmd, "step_time_s": out.get("step_time_s"), "hbm_peak_bytes": out.get("hbm_peak_bytes"),
            "host_peak_bytes": out.get("host_peak_bytes"), "tensors": out.get("config", {}).get("tensors"),
            "calibration": out.get("run", {}).get("calibration_text")}


def pct(pred, meas):
    if not isinstance(pred, (int, float)) or not isinstance(meas, (int, float)) or not meas:
        return None
    return 100.0 * (pred - meas) / meas


def fmt(v, scale=1.0, digits=3):
    return "-" if v is None else ("%.*f" % (digits, v / scale))


def simulated_rows(results, args, config_path):
    """One row per measured result, with hbmsim's prediction on datasheet figures (and calibrated)."""
    rows, failed = [], False
    for r in results:
        policy, lhs = r.get("policy"), bool(r.get("lhs"))
        row = {"config": "%s/lhs-%s" % (policy, "on" if lhs else "off"), "policy": policy, "lhs": lhs,
               "measured_step_s": r.get("step_time_s"), "measured_peak_bytes": r.get("peak_hbm_bytes"),
               "compiled_device_bytes": (r.get("compiled_memory_analysis") or {}).get("device_total_bytes"),
               "attention": r.get("attention_implementation"), "notes": []}
        if r.get("error"):
            row["notes"].append("JAX: " + r["error"][:120])
        if policy not in POLICIES:
            row["notes"].append("policy %r is not in policies.json: not simulated" % policy)
            rows.append(row)
            continue
        if r.get("policy_table") and r["policy_table"] != POLICIES[policy]:
            row["notes"].append("measured with another policies.json entry than today's")
        row["datasheet"] = simulate(hbmsim_command(args.hbmsim, config_path, policy, lhs))
        if args.calibration:
            row["calibrated"] = simulate(hbmsim_command(args.hbmsim, config_path, policy, lhs, args.calibration))
        for k in ("datasheet", "calibrated"):
            if k in row and "error" in row[k]:
                failed = True
                row["notes"].append("hbmsim %s: %s" % (k, row[k]["error"][:160]))
        rows.append(row)
    return rows, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="the JAX check's results.json (jax_results.json in $OUT)")
    ap.add_argument("--hbmsim", required=True, help="hbmsim binary")
    ap.add_argument("--calibration", help="the profile.json measured in the same GPU run")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args()

    try:
        with open(args.results) as f:
            results = json.load(f)
        if not isinstance(results, list):
            raise ValueError("not a JSON list")
    except (OSError, ValueError) as e:
        print("compare: %s: %s" % (args.results, e), file=sys.stderr)
        return 2
    if not os.access(args.hbmsim, os.X_OK):
        print("compare: %s is not an executable hbmsim (build it: ./scripts/build.sh)" % args.hbmsim, file=sys.stderr)
        return 2

    # hbmsim reads the model from a file: the check's HF config, written to a folder removed afterwards.
    with tempfile.TemporaryDirectory(prefix="hbmsim-compare-") as tmp:
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w") as f:
            json.dump(hf_config(), f)
        rows, failed = simulated_rows(results, args, config_path)

    gib = float(1 << 30)
    head = "%-16s %8s %8s %7s %8s %7s %9s %9s %9s  %s" % (
        "config", "meas s", "data s", "err%", "calib s", "err%", "meas GiB", "xla GiB", "pred GiB", "notes")
    print(head)
    print("-" * len(head))
    for row in rows:
        d, c = row.get("datasheet") or {}, row.get("calibrated") or {}
        ms = row["measured_step_s"]
        pred_hbm = (c or d).get("hbm_peak_bytes")
        print("%-16s %8s %8s %7s %8s %7s %9s %9s %9s  %s" % (
            row["config"], fmt(ms), fmt(d.get("step_time_s")), fmt(pct(d.get("step_time_s"), ms), digits=1),
            fmt(c.get("step_time_s")), fmt(pct(c.get("step_time_s"), ms), digits=1),
            fmt(row["measured_peak_bytes"], gib, 2), fmt(row["compiled_device_bytes"], gib, 2),
            fmt(pred_hbm, gib, 2), "; ".join(row["notes"])))
    print("meas GiB: JAX peak_bytes_in_use (includes autotuning buffers); xla GiB: the compiled step's "
          "memory_analysis (arguments + outputs - aliases + temporaries); pred GiB: hbmsim's HBM peak "
          "(calibrated run when a profile was given). How to read it: docs/calibration-profile.md.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": args.results, "calibration": args.calibration, "rows": rows}, f, indent=2)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
