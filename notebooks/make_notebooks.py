#!/usr/bin/python3
"""Writes the hbmsim notebooks (nbformat v4, no outputs) from the cell sources below.

    /usr/bin/python3 notebooks/make_notebooks.py [OUT_DIR]     # default: this directory

Edit the cells here, not the .ipynb files: tests/python/test_notebooks.py checks that the committed
notebooks equal what this script writes. The notebooks use only the hbmsim package (build it, then run
Jupyter with PYTHONPATH=<build>/python) and write their figures as PNGs into $HBMSIM_FIG_DIR (default
notebooks/figures).
"""
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

SETUP = '''\
%matplotlib inline
import os
from pathlib import Path

import numpy as np
import pandas as pd
from IPython.display import display

try:
    import hbmsim
    from hbmsim import plots
except ImportError as e:
    raise ImportError("build hbmsim first (cmake + ninja) and start Jupyter with PYTHONPATH=<build>/python") from e

FIG_DIR = Path(os.environ.get("HBMSIM_FIG_DIR") or ("notebooks/figures" if Path("notebooks").is_dir() else "figures"))
FIG_DIR.mkdir(parents=True, exist_ok=True)
GIB = 2**30
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 40)
print("hbmsim", hbmsim.__version__, "| figures ->", FIG_DIR.resolve())'''

NB1 = [
    ("md", '''\
# 01 Reproducing the measured GB200 NVL72 runs

The seed documents report MaxText training runs on 128 GB200 GPUs: DeepSeek-V3 671B with activations kept,
rematerialized or offloaded to pinned host memory (with and without the latency-hiding scheduler and pipelined
transfers), and Llama 3.1 405B with the QKV projections offloaded. `hbmsim.reproduce()` simulates every run with
its documented configuration (`data/reference/seed_configs.json`) and checks the claims the documents make.
Datasheet figures only (no calibration) here; notebook 03 adds a calibration profile.'''),
    ("code", SETUP),
    ("code", '''\
rep = hbmsim.reproduce()
cols = ["id", "policy", "batch", "lhs", "pipelined_transfers",
        "reported_tflops_per_device", "predicted_tflops_per_device", "tflops_error",
        "reported_hbm_gib", "predicted_hbm_gib", "hbm_error",
        "reported_host_gib", "predicted_host_gib", "reported_fits", "predicted_fits"]
rep.runs[cols].style.format(precision=1, na_rep="-").format(
    {"tflops_error": "{:+.1%}", "hbm_error": "{:+.1%}"}, na_rep="-")'''),
    ("md", "Claims of the seed documents (speed-up ratios in %, orderings as 1 = first is larger):"),
    ("code", '''\
rep.claims.style.format(precision=1)'''),
    ("code", '''\
fig = plots.predicted_vs_reported(rep, path=FIG_DIR / "01_predicted_vs_reported.png")
fig'''),
    ("md", '''\
## DeepSeek-V3: MLA and MoE up-projection activations offloaded, LHS and pipelined transfers on

The fastest measured DeepSeek-V3 configuration. With `trace=True` the result also carries the memory timeline
and a Chrome trace (`res.trace` can be saved as JSON and opened in Perfetto).'''),
    ("code", '''\
DSV3 = {"system": "gb200-nvl72", "model": "deepseek-v3-671b", "gpus": 128, "ep": 64, "batch": 8, "seq": 4096,
        "policy": "custom",
        "tensors": {"mla_q": "offload", "mla_kv": "offload", "moe_mlpwi_0": "offload", "moe_mlpwi_1": "offload"},
        "lhs": True, "pipelined_transfers": True}
res = hbmsim.simulate(DSV3, trace=True)
summary = pd.Series({
    "step time (s)": res.step_time_s,
    "TFLOP/s per device": res.tflops_per_device,
    "MFU": res.mfu,
    "fits": res.fits,
    "HBM peak (GiB)": res.hbm_peak_bytes / GIB,
    "HBM capacity (GiB)": res.hbm_capacity_bytes / GIB,
    "pinned host peak (GiB)": res.host_peak_bytes / GIB,
})
runs = rep.runs.set_index("id")
if "dsv3-offload-lhs-pipe-mbs8" in runs.index:
    r = runs.loc["dsv3-offload-lhs-pipe-mbs8"]
    summary["reported TFLOP/s per device"] = r.reported_tflops_per_device
    summary["reported HBM (GiB)"] = r.reported_hbm_gib
summary.to_frame("value")'''),
    ("code", '''\
pd.DataFrame({"exposed_s (compute waited on)": res.exposed_s, "busy_s": res.busy_s}).fillna(0)'''),
    ("md", "Where the compute stream's time goes: its busy time by phase (the recompute is what offload saves), and the rest of the step it waits."),
    ("code", '''\
phases = pd.Series(res.compute_s, name="seconds")
phases["idle"] = res.step_time_s - phases.sum()
phases.to_frame().assign(share=lambda f: f.seconds / res.step_time_s)'''),
    ("code", '''\
fig = plots.hbm_timeline(res, path=FIG_DIR / "01_dsv3_hbm_timeline.png")
fig'''),
    ("code", '''\
fig = plots.resource_timeline(res, path=FIG_DIR / "01_dsv3_resource_timeline.png")
fig'''),
    ("md", "Zoomed to half a second around the HBM peak: how copies, collectives and compute overlap there."),
    ("code", '''\
t0 = max(0.0, res.hbm_peak_time_s - 0.25)
fig = plots.resource_timeline(res, path=FIG_DIR / "01_dsv3_resource_timeline_zoom.png", window_s=(t0, t0 + 0.5))
fig'''),
]

NB2 = [
    ("md", '''\
# 02 Capacity planning

1. DeepSeek-V3 671B (128 GPUs, EP 64, sequence 4096) on GB200 NVL72, GB300 NVL72 and Vera Rubin NVL72 (`vr-nvl144`): which
   per-device batch fits for each placement of the MLA and MoE activations, and what it runs at.
2. The Pareto front of HBM peak against throughput over every placement of those four tensors.
3. Llama 3.1 405B QKV offload: the host-link bandwidth at which offloading the QKV projections breaks even.

Everything below is `hbmsim.sweep` (C++ threads; pass `client=` a `dask.distributed.Client` to run the same
sweeps on a cluster).'''),
    ("code", SETUP),
    ("code", '''\
SYSTEMS = ["gb200-nvl72", "gb300-nvl72", "vr-nvl144"]
BATCHES = [1, 2, 4, 8, 16, 32, 64]
DSV3 = {"model": "deepseek-v3-671b", "gpus": 128, "ep": 64, "seq": 4096, "policy": "custom",
        "lhs": True, "pipelined_transfers": True}
NAMES = ["mla_q", "mla_kv", "moe_mlpwi_0", "moe_mlpwi_1"]
PLACEMENTS = {
    "recompute all (remat)": dict.fromkeys(NAMES, "remat"),
    "keep all on device": dict.fromkeys(NAMES, "device"),
    "offload all": dict.fromkeys(NAMES, "offload"),
    "offload MLA, keep MoE": {"mla_q": "offload", "mla_kv": "offload", "moe_mlpwi_0": "device", "moe_mlpwi_1": "device"},
    "keep MLA, offload MoE": {"mla_q": "device", "mla_kv": "device", "moe_mlpwi_0": "offload", "moe_mlpwi_1": "offload"},
}
frames = []
for label, tensors in PLACEMENTS.items():
    df = hbmsim.sweep({"system": SYSTEMS, "batch": BATCHES}, base={**DSV3, "tensors": tensors}, jobs=2)
    df.insert(1, "placement", label)
    frames.append(df)
cap = pd.concat(frames, ignore_index=True)
print(len(cap), "points;", (cap.error != "").sum(), "bad-input points")
cap[["system", "placement", "batch", "tflops_per_device", "fits", "hbm_peak_bytes", "host_peak_bytes"]].head()'''),
    ("md", "Largest per-device batch that fits, per system and placement (blank: none fits):"),
    ("code", '''\
ok = cap[(cap.error == "") & (cap.fits == True)]
largest = ok.loc[ok.groupby(["system", "placement"])["batch"].idxmax()]
table = largest.pivot(index="placement", columns="system", values="batch").reindex(index=list(PLACEMENTS), columns=SYSTEMS)
table'''),
    ("code", '''\
at_largest = largest.assign(hbm_peak_gib=largest.hbm_peak_bytes / GIB, host_peak_gib=largest.host_peak_bytes / GIB)
at_largest[["system", "placement", "batch", "tflops_per_device", "hbm_peak_gib", "host_peak_gib"]].sort_values(
    ["system", "tflops_per_device"], ascending=[True, False]).style.format(precision=1)'''),
    ("code", '''\
for system in SYSTEMS:
    fig = plots.tflops_vs_batch(cap[cap.system == system], line="placement",
                                path=FIG_DIR / f"02_dsv3_tflops_vs_batch_{system}.png",
                                title=f"DeepSeek-V3 671B on {system}, 128 GPUs, EP 64")
    display(fig)'''),
    ("md", '''\
## Every placement of the four tensors on GB200 NVL72

3 placements ^ 4 tensors x 4 batches = 324 points. The front: configurations no other one beats on both less HBM
and more TFLOP/s.'''),
    ("code", '''\
axes = {"batch": [2, 4, 8, 16], **{f"tensor.{n}": ["remat", "device", "offload"] for n in NAMES}}
par = hbmsim.sweep(axes, base={**DSV3, "system": "gb200-nvl72"}, jobs=2)
par["placements"] = par.apply(plots.describe_placements, axis=1)  # e.g. "keep mla_q; offload mla_kv; recompute ..."
fits = par[par.fits == True]
front = plots.pareto_front(fits)
print(len(par), "points,", len(fits), "fit,", len(front), "on the Pareto front")
front[["batch", "placements", "tflops_per_device", "hbm_peak_bytes", "host_peak_bytes"]].assign(
    hbm_peak_gib=lambda d: d.hbm_peak_bytes / GIB, host_peak_gib=lambda d: d.host_peak_bytes / GIB).drop(
    columns=["hbm_peak_bytes", "host_peak_bytes"]).style.format(precision=1)'''),
    ("code", '''\
fig = plots.pareto(par, path=FIG_DIR / "02_dsv3_pareto_gb200-nvl72.png",
                   title="DeepSeek-V3 on GB200 NVL72: HBM peak vs TFLOP/s over all placements of 4 tensors")
fig'''),
    ("md", '''\
## Llama 3.1 405B: break-even host-link bandwidth for QKV offload

Three ways to treat the QKV projections: offload them (`qkv_proj_offloaded`), keep them (`save_qkv_proj`) or
recompute them (`full`), over a what-if host-link bandwidth per GPU and direction (`host_link_bytes_per_s`).
Offloading costs copies that the latency-hiding scheduler has to hide; keeping costs HBM.'''),
    ("code", '''\
LLAMA = {"system": "gb200-nvl72", "model": "llama3.1-405b", "gpus": 128, "batch": 2, "seq": 8192,
         "weights": "nvfp4", "policy": "qkv_proj_offloaded", "lhs": True}
bandwidths = [float(b) for b in np.geomspace(4e9, 4e11, 25)]
ll = hbmsim.sweep({"policy": ["qkv_proj_offloaded", "save_qkv_proj", "full"], "host_link_bytes_per_s": bandwidths},
                  base=LLAMA, jobs=2)
tf = ll.pivot(index="host_link_bytes_per_s", columns="policy", values="tflops_per_device")

def crossing(x, diff):
    """First bandwidth where diff goes from < 0 to >= 0, interpolated in log(bandwidth); NaN if never."""
    x, diff = np.asarray(x, float), np.asarray(diff, float)
    if diff[0] >= 0:
        return x[0]
    for i in range(1, len(x)):
        if diff[i - 1] < 0 <= diff[i]:
            f = -diff[i - 1] / (diff[i] - diff[i - 1])
            return float(np.exp(np.log(x[i - 1]) + f * (np.log(x[i]) - np.log(x[i - 1]))))
    return float("nan")

vs_recompute = crossing(tf.index, tf["qkv_proj_offloaded"] - tf["full"])
datasheet = hbmsim.system("gb200-nvl72")["host_h2d_bytes_per_s_per_gpu"]
at_datasheet = {p: hbmsim.simulate(LLAMA, policy=p) for p in ["qkv_proj_offloaded", "save_qkv_proj", "full"]}
pd.Series({
    "offload beats recompute above (GB/s per GPU)": vs_recompute / 1e9,
    "GB200 datasheet host link H2D (GB/s per GPU)": datasheet / 1e9,
    **{f"{p} at datasheet bandwidth: TFLOP/s": r.tflops_per_device for p, r in at_datasheet.items()},
    **{f"{p} at datasheet bandwidth: fits": r.fits for p, r in at_datasheet.items()},
    "offload / keep at the top of the sweep": tf["qkv_proj_offloaded"].iloc[-1] / tf["save_qkv_proj"].iloc[-1],
}).to_frame("value")'''),
    ("code", '''\
fig = plots.break_even(ll, marks={"offload = recompute": vs_recompute, "GB200 datasheet": datasheet},
                       path=FIG_DIR / "02_llama405b_host_link_break_even.png",
                       title="Llama 3.1 405B, GB200, 128 GPUs, batch 2, NVFP4 MLP: QKV offload vs keep vs recompute")
fig'''),
    ("md", '''\
Reading the plot: below the break-even bandwidth the copies cannot be hidden and recomputing the projections
(`full`) is faster; above it offloading wins, and it approaches keeping them (`save_qkv_proj`) as the copies
vanish behind compute. Keeping them is the fastest only where it fits in HBM (crosses: it does not).'''),
]

NB3 = [
    ("md", '''\
# 03 Calibration

A calibration profile (`docs/calibration-profile.md`) replaces datasheet figures with measured or fitted ones.
This notebook uses a shipped profile (`data/profiles/*.json`, compiled into hbmsim) or the file named by
`$HBMSIM_PROFILE`; without either it shows the datasheet results alone. It compares the system figures with and
without the profile, reruns the reproduction of the measured GB200 runs, and draws the residuals.'''),
    ("code", SETUP),
    ("code", '''\
shipped = [n[len("profiles/"):-len(".json")] for n in hbmsim.data_files("profiles/")]
PROFILE = os.environ.get("HBMSIM_PROFILE") or (shipped[0] if shipped else None)
SYSTEM = "gb200-nvl72"
CALIBRATED = f"calibrated ({Path(PROFILE).stem})" if PROFILE else None
print("shipped profiles:", shipped or "none")
print("using:", PROFILE or "none (datasheet figures only)")
if PROFILE:
    display(pd.json_normalize(hbmsim.profile(PROFILE)).T.rename(columns={0: "profile"}))'''),
    ("code", '''\
variants = {"datasheet": hbmsim.system(SYSTEM)}
if PROFILE:
    variants[CALIBRATED] = hbmsim.system(SYSTEM, PROFILE)
figures = pd.DataFrame({k: pd.json_normalize(v).iloc[0] for k, v in variants.items()})
figures'''),
    ("code", '''\
reps = {"datasheet": hbmsim.reproduce()}
if PROFILE:
    reps[CALIBRATED] = hbmsim.reproduce(PROFILE)
errors = pd.concat({k: r.runs.set_index("id")[["tflops_error", "hbm_error", "host_error"]] for k, r in reps.items()},
                   axis=1)
errors.style.format("{:+.1%}", na_rep="-")'''),
    ("code", '''\
pd.DataFrame({k: {"mean |TFLOP/s error|": r.runs.tflops_error.abs().mean(),
                  "mean |HBM error|": r.runs.hbm_error.abs().mean(),
                  "fits predicted right": f"{int(r.runs.fits_right.eq(True).sum())}/{int(r.runs.fits_right.notna().sum())}",
                  "claims that hold": f"{int(r.claims.holds.sum())}/{len(r.claims)}"}
              for k, r in reps.items()})'''),
    ("code", '''\
fig = plots.residuals(reps, what="tflops_error", path=FIG_DIR / "03_residuals_tflops.png")
fig'''),
    ("code", '''\
fig = plots.residuals(reps, what="hbm_error", path=FIG_DIR / "03_residuals_hbm.png")
fig'''),
    ("code", '''\
if PROFILE:
    fig = plots.predicted_vs_reported(reps[CALIBRATED],
                                      path=FIG_DIR / "03_predicted_vs_reported_calibrated.png")
    display(fig)
else:
    print("no calibration profile: nothing more to compare")'''),
    ("code", '''\
pd.concat({k: r.claims.set_index("claim")[["reported", "predicted", "holds"]] for k, r in reps.items()}, axis=1)'''),
]

NB4 = [
    ("md", """\
# 04 Choosing a parallel layout: Llama 3.1 405B and DeepSeek-V3 on GB200, GB300 and Vera Rubin

`hbmsim.plan_layout` searches tensor, context, pipeline (with virtual stages), expert and data parallelism,
the micro-batch and the activation policy at a fixed global batch, drops what cannot fit by a memory lower
bound, simulates the rest fastest bound first and stops once nothing left can enter the top list. Here: 128
GPUs of each system, a global batch of 128 sequences of 8192 for Llama 3.1 405B and 256 of 4096 for
DeepSeek-V3, three policies (MaxText's `minimal` and `qkv_proj_offloaded`, and `no_recompute`, what autograd
keeps), micro-batch 1. Datasheet figures (no calibration)."""),
    ("code", SETUP),
    ("code", """\
SYSTEMS = ["gb200-nvl72", "gb300-nvl72", "vr-nvl144"]
RUNS = {"llama3.1-405b": dict(seq=8192, global_batch=128), "deepseek-v3-671b": dict(seq=4096, global_batch=256)}
searches = {}
for model, shape in RUNS.items():
    for system in SYSTEMS:
        searches[model, system] = hbmsim.plan_layout(model=model, system=system, gpus=128, top=3, jobs=2,
                                                     policies=["minimal", "qkv_proj_offloaded", "no_recompute"],
                                                     micro_batches=[1], **shape)
best = pd.DataFrame([{"model": m, "system": s, **df.iloc[0].drop("settings").to_dict(),
                      "simulated": df.attrs["simulated"], "candidates": df.attrs["candidates"]}
                     for (m, s), df in searches.items()])
best["hbm_gib"] = best["hbm_peak_bytes"] / GIB
best["host_gib"] = best["host_peak_bytes"] / GIB
best[["model", "system", "tp", "cp", "pp", "vp", "ep", "fsdp", "dp", "policy", "tokens_per_s_per_device",
      "tflops_per_device", "hbm_gib", "host_gib", "limit", "simulated", "candidates"]].round(1)"""),
    ("md", """\
The three fastest layouts per system for Llama 3.1 405B, with what limits each (the longest wait of the
compute stream when it is over 5% of the step, else compute):"""),
    ("code", """\
for system in SYSTEMS:
    df = searches["llama3.1-405b", system]
    print(system)
    display(df[["tp", "cp", "pp", "vp", "fsdp", "dp", "policy", "tokens_per_s_per_device", "limit"]].round(1))"""),
    ("code", """\
import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for ax, model in zip(axes, RUNS):
    rows = best[best["model"] == model]
    bars = ax.bar(rows["system"], rows["tokens_per_s_per_device"], color=["#4c72b0", "#55a868", "#c44e52"])
    for bar, (_, r) in zip(bars, rows.iterrows()):
        ax.annotate(f"tp{r.tp} cp{r.cp} pp{r.pp} ep{r.ep}\\n{r.policy}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_title(f"{model}: fastest layout, 128 GPUs")
    ax.set_ylabel("tokens/s per GPU")
    ax.margins(y=0.25)
fig.tight_layout()
fig.savefig(FIG_DIR / "04_best_layout_per_system.png", dpi=120)"""),
    ("md", "The winner on GB200 as settings to run it with: a `simulate` config, MaxText keys, XLA flags and Megatron arguments."),
    ("code", """\
winner = searches["llama3.1-405b", "gb200-nvl72"].iloc[0]["settings"]
for key in ("maxtext", "megatron", "xla_flags"):
    print(f"{key}: {winner[key]}")"""),
    ("md", """A degree given as a keyword is held: a team that runs Megatron at tp 4 x pp 8 (NeMo's Llama 3.1 405B recipe on
128 GB200s, global batch 64) asks what else to set. The search tries only that tp and pp and finds the rest."""),
    ("code", """held = hbmsim.plan_layout(model="llama3.1-405b", system="gb200-nvl72", gpus=128, seq=8192, global_batch=64,
                          framework="megatron", tp_comm_overlap=True, tp=4, pp=8, top=3, jobs=2)
held[["tp", "cp", "pp", "vp", "dp", "sharded_optimizer", "policy", "tokens_per_s_per_device", "limit"]].round(1)"""),
    ("md", """How many GPUs, and how long: `hbmsim.plan.scale` runs the same search at several GPU counts at one global
batch (here Meta's 16 M tokens per step) and prices a 15 T-token budget at each count's fastest layout, with the
corpus fit's figures (datasheet figures predict the published GB200 runs 25-64% fast)."""),
    ("code", """scale = hbmsim.plan.scale(model="llama3.1-405b", system="gb200-nvl72", seq=8192, global_batch=2048,
                          gpus=[512, 1024, 2048, 4096], tokens=15e12, days=100, calibration="corpus-fitted", jobs=2)
print("fewest GPUs within 100 days:", scale.attrs["fewest_within_days"])
scale[["gpus", "tp", "cp", "fsdp", "dp", "policy", "step_time_s", "tokens_per_s_per_device", "scaling", "days",
       "gpu_hours", "limit"]].round(2)"""),
    ("md", """The same question on each rack one might book: a list of systems gives a plan per system in one DataFrame, and
`answer` marks each system's fewest GPUs within the deadline (`hbmsim plan scale --system a,b,c`). Vera Rubin, which no
published run measures yet, takes the corpus fit's pooled scales."""),
    ("code", """racks = hbmsim.plan.scale(model="llama3.1-405b", system=["gb200-nvl72", "gb300-nvl72", "vr-nvl144"], seq=8192,
                          global_batch=2048, gpus=[1024, 2048, 4096], tokens=15e12, days=100,
                          calibration="corpus-fitted", jobs=2)
racks[racks["answer"]][["system", "gpus", "tokens_per_s_per_device", "days", "gpu_hours", "policy"]].round(1)"""),
]

NOTEBOOKS = {
    "01_reproduce_gb200.ipynb": NB1,
    "02_capacity_planning.ipynb": NB2,
    "03_calibration.ipynb": NB3,
    "04_layout_planning.ipynb": NB4,
}


def build(cells):
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, source) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives identical files
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def main(out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), str(out_dir / name))
        print(out_dir / name)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent)
