"""Figures of hbmsim results (matplotlib, object-oriented: no pyplot state, works headless).

Every function returns a ``matplotlib.figure.Figure`` and, given ``path``, also writes it there (PNG by
extension). In Jupyter, a returned Figure displays as the cell's value.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .api import Result

GIB = 1024.0**3
# The queues of a step: compute, one per communication axis, the two copy engines.
STREAMS = ["compute", "fsdp", "ep", "tp", "cp", "dp", "d2h", "h2d"]
_STREAM_COLORS = {"compute": "tab:blue", "fsdp": "tab:orange", "ep": "tab:purple", "tp": "tab:brown",
                  "cp": "tab:pink", "dp": "tab:olive", "d2h": "tab:red", "h2d": "tab:green"}
_CATEGORY_ORDER = ["parameters", "optimizer_state", "gradients", "gathered_weights", "saved_activations",
                   "offload_buffers", "collective_buffers", "workspace", "runtime_reserve"]


def _figure(width: float = 9, height: float = 4.5) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _finish(fig: Figure, path: str | os.PathLike | None) -> Figure:
    if path is not None:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        fig.savefig(path)
    return fig


def _title(result: Mapping[str, Any]) -> str:
    c = result.get("config", {})
    return (f"{result.get('model', c.get('model', ''))} on {result.get('system', c.get('system', ''))}, "
            f"batch {c.get('batch', '?')}, policy {result.get('policy', c.get('policy', ''))}")


def hbm_timeline(result: Mapping[str, Any], path: str | os.PathLike | None = None) -> Figure:
    """HBM and pinned-host memory over one step, with both capacities, from a ``simulate(..., trace=True)``
    result: HBM stacked by category over time (and its total as a line), and on the right the breakdown at
    the peak (``hbm_breakdown_bytes``)."""
    if "timeline" not in result:
        raise ValueError("hbm_timeline needs a result simulated with trace=True")
    tl = np.asarray(result["timeline"], dtype=float).reshape(-1, 3)
    fig = _figure(10, 4.5)
    ax, bar = fig.subplots(1, 2, gridspec_kw={"width_ratios": [5, 1]})
    if "timeline_hbm_by_category" in result:
        # Stacked by category over the step; the line on top is the total.
        names = list(result["timeline_categories"])
        cats = np.asarray(result["timeline_hbm_by_category"], dtype=float).reshape(len(tl), len(names))
        order = [names.index(c) for c in _CATEGORY_ORDER if c in names] + \
            [i for i, c in enumerate(names) if c not in _CATEGORY_ORDER]
        order = [i for i in order if cats[:, i].max(initial=0) > 0]
        ax.stackplot(tl[:, 0], *(cats[:, i] / GIB for i in order), step="post", alpha=0.6,
                     labels=[names[i] for i in order], colors=[f"C{k % 10}" for k in range(len(order))])
    ax.step(tl[:, 0], tl[:, 1] / GIB, where="post", color="tab:blue", label="HBM in use")
    ax.step(tl[:, 0], tl[:, 2] / GIB, where="post", color="tab:green", label="pinned host in use")
    ax.axhline(result["hbm_capacity_bytes"] / GIB, color="tab:blue", ls="--", lw=1, label="HBM capacity")
    host_cap = result.get("host_capacity_bytes", 0)
    if host_cap and host_cap < 4 * max(result["hbm_capacity_bytes"], tl[:, 2].max(initial=0)):
        ax.axhline(host_cap / GIB, color="tab:green", ls="--", lw=1, label="host capacity per GPU")
    ax.plot([result["hbm_peak_time_s"]], [result["hbm_peak_bytes"] / GIB], "v", color="black",
            label=f"HBM peak {result['hbm_peak_bytes'] / GIB:.1f} GiB")
    ax.set_xlabel("time in step (s)")
    ax.set_ylabel("GiB per device")
    ax.set_title(_title(result), fontsize=10)
    ax.set_xlim(0, max(result.get("step_time_s", 0), tl[-1, 0] if len(tl) else 0))
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    breakdown = result.get("hbm_breakdown_bytes", {})
    bottom = 0.0
    cats = [c for c in _CATEGORY_ORDER if breakdown.get(c, 0) > 0] + \
        sorted(c for c in breakdown if c not in _CATEGORY_ORDER and breakdown[c] > 0)
    for i, cat in enumerate(cats):
        v = breakdown[cat] / GIB
        bar.bar([0], [v], bottom=bottom, color=f"C{i % 10}", label=f"{cat} {v:.1f}")
        bottom += v
    bar.set_xticks([0], ["at peak"])
    bar.set_ylim(ax.get_ylim())
    bar.set_yticklabels([])
    bar.legend(fontsize=6, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)
    return _finish(fig, path)


def _spans(result: Mapping[str, Any]) -> pd.DataFrame:
    if "trace" not in result:
        raise ValueError("resource_timeline needs a result simulated with trace=True")
    return Result(result).spans()


def resource_timeline(result: Mapping[str, Any], path: str | os.PathLike | None = None,
                      window_s: tuple[float, float] | None = None, stage: int | None = None) -> Figure:
    """When each queue (compute; fsdp, ep, tp, cp, dp collectives; pp sends; d2h, h2d copies) is busy over one step,
    one row of bars per stream, from the trace of a ``simulate(..., trace=True)`` result. ``window_s`` zooms to
    (t0, t1). With pipeline stages, one stage's queues: ``stage``, by default the one the timeline shows."""
    spans = _spans(result)
    spans = spans[spans["stage"] == (result.get("timeline_stage", 0) if stage is None else stage)]
    streams = [s for s in STREAMS if s in set(spans["stream"])] + sorted(set(spans["stream"]) - set(STREAMS))
    fig = _figure(10, 0.6 * len(streams) + 1.8)
    ax = fig.subplots()
    for row, stream in enumerate(reversed(streams)):
        s = spans[spans["stream"] == stream]
        busy = result.get("busy_s", {}).get(stream)
        ax.broken_barh(list(zip(s["start_s"], s["dur_s"])), (row - 0.4, 0.8),
                       facecolors=_STREAM_COLORS.get(stream, "tab:gray"), linewidth=0)
        label = f"{stream}" + (f"\nbusy {busy:.2f} s" if busy is not None else "")
        exposed = result.get("exposed_s", {}).get(stream)
        if exposed:
            label += f", exposed {exposed:.2f} s"
        ax.text(1.005, row, label, transform=ax.get_yaxis_transform(), va="center", fontsize=7)
    ax.set_yticks(range(len(streams)), list(reversed(streams)))
    ax.set_xlabel("time in step (s)")
    ax.set_title(_title(result), fontsize=10)
    t_end = result.get("step_time_s", float(spans.eval("start_s + dur_s").max()) if len(spans) else 1.0)
    ax.set_xlim(*(window_s or (0, t_end)))
    ax.grid(axis="x", alpha=0.3)
    return _finish(fig, path)


def tflops_vs_batch(df: pd.DataFrame, path: str | os.PathLike | None = None, batch: str = "batch",
                    line: str = "policy", y: str = "tflops_per_device", title: str | None = None) -> Figure:
    """TFLOP/s per device against per-device batch, one line per ``line`` value (default: policy). Points
    that do not fit (``fits`` False) are drawn as crosses; bad-input rows (``error``) are left out."""
    d = df[df["error"] == ""] if "error" in df else df
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    for i, (key, g) in enumerate(d.groupby(line, sort=True)):
        g = g.sort_values(batch)
        color = f"C{i % 10}"
        ax.plot(g[batch], g[y], "-", color=color, alpha=0.5)
        fits = g["fits"].astype(bool) if "fits" in g else pd.Series(True, index=g.index)
        ax.plot(g.loc[fits, batch], g.loc[fits, y], "o", color=color, label=str(key))
        ax.plot(g.loc[~fits, batch], g.loc[~fits, y], "x", color=color, ms=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"per-device {batch}")
    ax.set_ylabel("model TFLOP/s per device")
    ax.set_title(title or "TFLOP/s vs batch (x: does not fit)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _finish(fig, path)


def pareto_front(df: pd.DataFrame, x: str = "hbm_peak_bytes", y: str = "tflops_per_device") -> pd.DataFrame:
    """Rows no other row beats on both lower ``x`` and higher ``y``, sorted by ``x``."""
    d = df.dropna(subset=[x, y]).sort_values([x, y], ascending=[True, False])
    best, keep = -np.inf, []
    for idx, v in zip(d.index, d[y]):
        if v > best:
            keep.append(idx)
            best = v
    return d.loc[keep]


def pareto(df: pd.DataFrame, path: str | os.PathLike | None = None, x: str = "hbm_peak_bytes",
           y: str = "tflops_per_device", label: str | None = None, title: str | None = None) -> Figure:
    """HBM peak (GiB) against TFLOP/s per device for every row, and the Pareto front (less HBM, more
    TFLOP/s) of the rows that fit (all rows when there is no ``fits`` column) highlighted; front points are
    labelled with column ``label`` where there is room. Dashed: the HBM capacity."""
    d = df[df["error"] == ""] if "error" in df else df
    fits = d["fits"].astype(bool) if "fits" in d else pd.Series(True, index=d.index)
    front = pareto_front(d[fits], x, y)
    fig = _figure(8, 5)
    ax = fig.subplots()
    scale = GIB if x.endswith("_bytes") else 1.0
    ax.scatter(d.loc[fits, x] / scale, d.loc[fits, y], s=14, color="tab:gray", alpha=0.6, label="fits")
    ax.scatter(d.loc[~fits, x] / scale, d.loc[~fits, y], s=14, marker="x", color="tab:red", alpha=0.5,
               label="does not fit")
    ax.step(front[x] / scale, front[y], where="post", color="tab:blue", lw=1.5)
    ax.scatter(front[x] / scale, front[y], s=40, color="tab:blue", zorder=3, label="Pareto front (fitting)")
    if "hbm_capacity_bytes" in d and x == "hbm_peak_bytes" and len(d):
        for cap in sorted(set(d["hbm_capacity_bytes"].dropna())):
            ax.axvline(cap / GIB, color="black", ls="--", lw=1)
    if label is not None and len(d):
        # Skip labels that would land on the previous one (in axis fractions).
        xr = (d[x].max() - d[x].min()) / scale or 1.0
        yr = (d[y].max() - d[y].min()) or 1.0
        last = None
        for _, r in front.iterrows():
            px, py = r[x] / scale, r[y]
            if last is None or abs(px - last[0]) / xr > 0.06 or abs(py - last[1]) / yr > 0.04:
                ax.annotate(str(r[label]), (px, py), fontsize=6, xytext=(4, -8), textcoords="offset points")
                last = (px, py)
    ax.set_xlabel("HBM peak (GiB per device)" if scale == GIB else x)
    ax.set_ylabel("model TFLOP/s per device")
    ax.set_title(title or "HBM vs throughput (dashed: HBM capacity)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _finish(fig, path)


def predicted_vs_reported(repro: Any, path: str | os.PathLike | None = None) -> Figure:
    """Grouped bars per reference run, reported vs predicted: TFLOP/s per device (top) and HBM GiB
    (bottom). ``repro`` is :func:`hbmsim.reproduce`'s result or its ``runs`` DataFrame. Unreported
    figures have no bar."""
    runs = repro.runs if hasattr(repro, "runs") else repro
    fig = _figure(11, 7)
    axes = fig.subplots(2, 1, sharex=True)
    xs = np.arange(len(runs))
    w = 0.38
    for ax, (what, unit) in zip(axes, [("tflops_per_device", "TFLOP/s per device"), ("hbm_gib", "HBM GiB")]):
        rep = runs[f"reported_{what}"].astype(float)
        pred = runs[f"predicted_{what}"].astype(float)
        ax.bar(xs - w / 2, rep.fillna(0), w, color="tab:gray", label="reported")
        ax.bar(xs + w / 2, pred, w, color="tab:blue", label="predicted")
        err_col = "tflops_error" if what == "tflops_per_device" else "hbm_error"
        for x, p, e in zip(xs, pred, runs[err_col]):
            if pd.notna(e):
                ax.text(x + w / 2, p, f"{100 * e:+.0f}%", ha="center", va="bottom", fontsize=7)
        if what == "hbm_gib" and "hbm_capacity_gib" in runs:
            for cap in sorted(set(runs["hbm_capacity_gib"].dropna())):
                ax.axhline(cap, color="black", ls="--", lw=1, label=f"HBM capacity {cap:.0f} GiB")
        if "reported_fits" in runs:
            for x, f in zip(xs, runs["reported_fits"]):
                if f is False:
                    ax.text(x - w / 2, 0, "OOM", ha="center", va="bottom", fontsize=7, color="tab:red")
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[1].set_xticks(xs, runs["id"], rotation=30, ha="right", fontsize=8)
    axes[0].set_title("Measured GB200 runs: reported vs predicted (labels: predicted / reported - 1)", fontsize=10)
    return _finish(fig, path)


def residuals(reproductions: Mapping[str, Any], path: str | os.PathLike | None = None,
              what: str = "tflops_error") -> Figure:
    """Relative errors (predicted / reported - 1, in %) per reference run, one bar group per labelled
    reproduction, e.g. ``{"datasheet": reproduce(), "calibrated": reproduce("gb200-fitted")}``."""
    frames = {k: (v.runs if hasattr(v, "runs") else v) for k, v in reproductions.items()}
    ids = list(dict.fromkeys(i for f in frames.values() for i in f["id"]))
    fig = _figure(11, 4.5)
    ax = fig.subplots()
    xs = np.arange(len(ids))
    w = 0.8 / max(1, len(frames))
    for k, (label, f) in enumerate(frames.items()):
        err = f.set_index("id")[what].reindex(ids).astype(float) * 100
        ax.bar(xs - 0.4 + w * (k + 0.5), err.fillna(0), w, label=label, color=f"C{k}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(xs, ids, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{what.replace('_error', '')} error (%)")
    ax.set_title("Residuals per reference run (runs without a reported figure: no bar)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, path)


def break_even(df: pd.DataFrame, path: str | os.PathLike | None = None, x: str = "host_link_bytes_per_s",
               line: str = "policy", y: str = "tflops_per_device", marks: Mapping[str, float] | None = None,
               title: str | None = None) -> Figure:
    """``y`` against a swept bandwidth ``x`` (bytes/s, drawn in GB/s, log scale), one line per ``line``
    value (crosses: does not fit); ``marks`` ({label: bytes/s}) draws vertical lines, e.g. a break-even
    bandwidth or the datasheet one."""
    d = df[df["error"] == ""] if "error" in df else df
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    for i, (key, g) in enumerate(d.groupby(line, sort=True)):
        g = g.sort_values(x)
        gx = g[x].astype(float) / 1e9
        fits = g["fits"].astype(bool) if "fits" in g else pd.Series(True, index=g.index)
        label = str(key) + ("" if fits.all() else " (x: does not fit)")
        ax.plot(gx, g[y], "-", color=f"C{i % 10}", label=label)
        ax.plot(gx[fits], g.loc[fits, y], "o", ms=3, color=f"C{i % 10}")
        ax.plot(gx[~fits], g.loc[~fits, y], "x", ms=5, color=f"C{i % 10}")
    for k, (label, value) in enumerate((marks or {}).items()):
        if value is not None and np.isfinite(value):
            ax.axvline(value / 1e9, color="black", ls=["--", ":", "-."][k % 3], lw=1, label=f"{label}: {value / 1e9:.0f} GB/s")
    ax.set_xscale("log")
    ax.set_xlabel("host link GB/s per GPU per direction")
    ax.set_ylabel("model TFLOP/s per device")
    ax.set_title(title or "Offload vs keep vs recompute: throughput against host-link bandwidth", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _finish(fig, path)
