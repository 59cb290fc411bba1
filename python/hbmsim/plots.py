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
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from .api import Result

GIB = 1024.0**3
# The queues of a step: compute, one per communication axis, the two copy engines.
STREAMS = ["compute", "fsdp", "ep", "tp", "cp", "dp", "d2h", "h2d"]
_STREAM_COLORS = {"compute": "tab:blue", "fsdp": "tab:orange", "ep": "tab:purple", "tp": "tab:brown",
                  "cp": "tab:pink", "dp": "tab:olive", "d2h": "tab:red", "h2d": "tab:green"}
_CATEGORY_ORDER = ["parameters", "optimizer_state", "gradients", "gathered_weights", "saved_activations",
                   "offload_buffers", "collective_buffers", "workspace", "runtime_reserve"]
# One colour per HBM category, used by every figure (the stacked area and the bar at the peak alike), whether or
# not a category is present in a given result. None of them is the black of the HBM total or the green of host.
CATEGORY_COLORS = {
    "parameters": "#1f77b4", "optimizer_state": "#ff7f0e", "gradients": "#bcbd22", "gathered_weights": "#d62728",
    "saved_activations": "#9467bd", "offload_buffers": "#8c564b", "collective_buffers": "#e377c2",
    "workspace": "#7f7f7f", "runtime_reserve": "#17becf",
}
_EXTRA_COLORS = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d"]
_AREA_ALPHA = 0.6


def category_color(category: str) -> str:
    """The fixed colour of an HBM category (a category outside the known ones gets a stable colour by name)."""
    if category in CATEGORY_COLORS:
        return CATEGORY_COLORS[category]
    return _EXTRA_COLORS[sum(map(ord, category)) % len(_EXTRA_COLORS)]


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
    result: HBM stacked by category over time (and its total as a black line), and on the right the breakdown
    at the peak (``hbm_breakdown_bytes``). Each category has one colour in both (``CATEGORY_COLORS``); the
    legend sits outside the axes, right of the bar, with each category's GiB at the peak."""
    if "timeline" not in result:
        raise ValueError("hbm_timeline needs a result simulated with trace=True")
    tl = np.asarray(result["timeline"], dtype=float).reshape(-1, 3)
    fig = _figure(12, 4.8)
    ax, bar = fig.subplots(1, 2, gridspec_kw={"width_ratios": [6, 1]})
    breakdown = {k: float(v) for k, v in result.get("hbm_breakdown_bytes", {}).items()}
    in_time: dict[str, np.ndarray] = {}
    if "timeline_hbm_by_category" in result:
        names = list(result["timeline_categories"])
        cats = np.asarray(result["timeline_hbm_by_category"], dtype=float).reshape(len(tl), len(names))
        in_time = {n: cats[:, i] for i, n in enumerate(names) if cats[:, i].max(initial=0) > 0}
    # Every category that shows anywhere (over time or at the peak), in the fixed order, one colour each.
    present = set(in_time) | {c for c, v in breakdown.items() if v > 0}
    order = [c for c in _CATEGORY_ORDER if c in present] + sorted(present - set(_CATEGORY_ORDER))
    stacked = [c for c in order if c in in_time]
    if stacked:
        ax.stackplot(tl[:, 0], *(in_time[c] / GIB for c in stacked), step="post", alpha=_AREA_ALPHA,
                     colors=[category_color(c) for c in stacked], labels=stacked, linewidth=0)
    lines = [
        ax.step(tl[:, 0], tl[:, 1] / GIB, where="post", color="black", lw=1, label="HBM in use (total)")[0],
        ax.step(tl[:, 0], tl[:, 2] / GIB, where="post", color="tab:green", lw=1.5, label="pinned host in use")[0],
        ax.axhline(result["hbm_capacity_bytes"] / GIB, color="black", ls="--", lw=1,
                   label=f"HBM capacity {result['hbm_capacity_bytes'] / GIB:.0f} GiB"),
    ]
    host_cap = result.get("host_capacity_bytes", 0)
    tops = [result["hbm_capacity_bytes"], result["hbm_peak_bytes"], tl[:, 1:].max(initial=0)]
    if host_cap and host_cap < 4 * max(result["hbm_capacity_bytes"], tl[:, 2].max(initial=0)):
        tops.append(host_cap)
        lines.append(ax.axhline(host_cap / GIB, color="tab:green", ls="--", lw=1,
                                label=f"host capacity per GPU {host_cap / GIB:.0f} GiB"))
    lines.append(ax.plot([result["hbm_peak_time_s"]], [result["hbm_peak_bytes"] / GIB], "v", color="black",
                         label=f"HBM peak {result['hbm_peak_bytes'] / GIB:.1f} GiB")[0])
    ax.set_xlabel("time in step (s)")
    ax.set_ylabel("GiB per device")
    ax.set_title(_title(result), fontsize=10)
    ax.set_xlim(0, max(result.get("step_time_s", 0), tl[-1, 0] if len(tl) else 0))
    ax.set_ylim(0, 1.08 * max(tops) / GIB)
    ax.grid(alpha=0.3)
    bottom = 0.0
    handles = []
    for cat in order:
        v = breakdown.get(cat, 0.0) / GIB
        (rect,) = bar.bar([0], [v], bottom=bottom, color=category_color(cat), alpha=_AREA_ALPHA, gid=f"peak:{cat}")
        rect.set_label(f"{cat}: {v:.1f} GiB at peak")
        handles.append(rect)
        bottom += v
    bar.set_xticks([0], ["at peak"])
    bar.set_ylim(ax.get_ylim())
    bar.tick_params(axis="y", labelleft=False)
    bar.grid(axis="y", alpha=0.3)
    bar.set_title(f"{result['hbm_peak_bytes'] / GIB:.1f} GiB", fontsize=9)
    # One legend outside the axes (right of the bar): the categories (same colours in area and bar), then the lines.
    bar.legend(handles=handles[::-1] + lines, fontsize=7, loc="upper left", bbox_to_anchor=(1.05, 1.0),
               borderaxespad=0, title="HBM by category (top first)", title_fontsize=7)
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


def _powers_of_two_wide(values: Any) -> bool:
    """True for positive whole powers of two spanning at least a factor 8 (1, 2, 4, 8, ...): a geometric sweep."""
    v = np.unique(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if len(v) < 3 or (v <= 0).any():
        return False
    e = np.log2(v)
    return bool(np.allclose(e, np.round(e)) and v.max() / v.min() >= 8)


def tflops_vs_batch(df: pd.DataFrame, path: str | os.PathLike | None = None, batch: str = "batch",
                    line: str = "policy", y: str = "tflops_per_device", title: str | None = None) -> Figure:
    """TFLOP/s per device against per-device batch, one line per ``line`` value (default: policy). Points
    that do not fit (``fits`` False) are drawn as crosses, with a legend entry; bad-input rows (``error``) are
    left out. The batch axis is linear, except for a sweep over powers of two spanning a factor 8 or more,
    which is drawn on a log2 axis with the batches themselves as tick labels."""
    d = df[df["error"] == ""] if "error" in df else df
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    any_oom = False
    for i, (key, g) in enumerate(d.groupby(line, sort=True)):
        g = g.sort_values(batch)
        color = f"C{i % 10}"
        fits = g["fits"].astype(bool) if "fits" in g else pd.Series(True, index=g.index)
        ax.plot(g[batch], g[y], "-", color=color, alpha=0.5)
        ax.plot(g.loc[fits, batch], g.loc[fits, y], "o", color=color, label=str(key))
        if (~fits).any():
            any_oom = True
            ax.plot(g.loc[~fits, batch], g.loc[~fits, y], "x", color=color, ms=8, mew=1.5)
    batches = np.unique(d[batch].astype(float)) if len(d) else np.array([])
    if _powers_of_two_wide(batches):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [f"{b:g}" for b in batches])
        ax.minorticks_off()
    handles, _ = ax.get_legend_handles_labels()
    if any_oom:
        handles.append(Line2D([], [], ls="none", marker="x", ms=8, mew=1.5, color="dimgray",
                              label="does not fit in HBM (cross, line's colour)"))
    ax.set_xlabel(f"per-device {batch}" + (" (log scale)" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel("model TFLOP/s per device")
    ax.set_title(title or "TFLOP/s per device vs per-device batch", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="best")
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


# How a checkpoint placement (``tensors`` / ``tensor.NAME``: "device" | "remat" | "offload") reads in a figure.
PLACEMENT_WORDS = {"device": "keep", "remat": "recompute", "offload": "offload"}


def describe_placements(row: Mapping[str, Any]) -> str:
    """A readable summary of a sweep row's ``tensor.NAME`` columns, e.g. ``"offload mla_q, mla_kv; recompute
    moe_mlpwi_0, moe_mlpwi_1"`` (placements in the order keep, offload, recompute; "" without such columns)."""
    groups: dict[str, list[str]] = {}
    for k, v in row.items():
        if isinstance(k, str) and k.startswith("tensor.") and isinstance(v, str):
            groups.setdefault(v, []).append(k[len("tensor."):])
    parts = []
    for placement in ["device", "offload", "remat", *sorted(set(groups) - set(PLACEMENT_WORDS))]:
        if placement in groups:
            parts.append(f"{PLACEMENT_WORDS.get(placement, placement)} {', '.join(groups[placement])}")
    return "; ".join(parts)


def _overlaps(a: Any, b: Any, pad: float = 1.0) -> bool:
    return not (a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0)


def pareto(df: pd.DataFrame, path: str | os.PathLike | None = None, x: str = "hbm_peak_bytes",
           y: str = "tflops_per_device", label: str | None = None, title: str | None = None,
           batch: str = "batch", max_labels: int = 14) -> Figure:
    """HBM peak (GiB) against TFLOP/s per device for every row, and the Pareto front (less HBM, more
    TFLOP/s) of the rows that fit (all rows when there is no ``fits`` column) highlighted.

    Front points are numbered where a number fits without touching another (the largest throughput steps
    first, at most ``max_labels``); the panel on the right spells each number out: batch, HBM, TFLOP/s and
    the configuration (column ``label`` if given, else the ``tensor.NAME`` placements in words, else
    ``placement`` or ``policy``). Dashed vertical lines: the HBM capacity of every system present (legend).
    Rows whose HBM peak is far past the largest capacity are drawn at the right edge as ">" markers (legend:
    how many) instead of stretching the axis."""
    d = df[df["error"] == ""] if "error" in df else df
    d = d.dropna(subset=[x, y])
    fits = d["fits"].astype(bool) if "fits" in d else pd.Series(True, index=d.index)
    front = pareto_front(d[fits], x, y)
    fig = _figure(13, 6.5)
    ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    scale = GIB if x.endswith("_bytes") else 1.0
    xs = d[x] / scale

    # HBM capacity of every system present, one legend entry each.
    caps: list[tuple[str, float]] = []
    if "hbm_capacity_bytes" in d and x == "hbm_peak_bytes" and len(d):
        by = d.groupby("system")["hbm_capacity_bytes"] if "system" in d else {"": d["hbm_capacity_bytes"]}.items()
        for name, col in by:
            for cap in sorted(set(col.dropna())):
                caps.append((str(name), cap / GIB))
    # The x range: everything that fits, capacities, and what does not fit up to 1.5 x the largest capacity.
    limit = None
    if caps and len(d):
        lo = min(xs.min(), min(c for _, c in caps))
        hi = max([c for _, c in caps] + list(xs[fits]))
        limit = max(1.5 * max(c for _, c in caps), 1.05 * hi)
        if xs.max() <= limit:
            limit = None
        else:
            ax.set_xlim(lo - 0.03 * (limit - lo), limit + 0.03 * (limit - lo))
    clipped = (xs > limit) if limit is not None else pd.Series(False, index=d.index)

    ax.scatter(xs[fits], d.loc[fits, y], s=14, color="tab:gray", alpha=0.6, label="fits")
    ax.scatter(xs[~fits & ~clipped], d.loc[~fits & ~clipped, y], s=16, marker="x", color="tab:red", alpha=0.6,
               label="does not fit")
    if clipped.any():
        ax.scatter(np.full(int(clipped.sum()), limit), d.loc[clipped, y], s=30, marker=">", color="tab:red",
                   alpha=0.6, zorder=4, gid="clipped",
                   label=f"does not fit, HBM peak beyond the axis ({int(clipped.sum())}: "
                         f"{xs[clipped].min():.0f}-{xs[clipped].max():.0f} GiB)")
    ax.step(front[x] / scale, front[y], where="post", color="tab:blue", lw=1.5)
    ax.scatter(front[x] / scale, front[y], s=40, color="tab:blue", zorder=3, label="Pareto front (fitting)")
    for k, (name, cap) in enumerate(caps):
        ax.axvline(cap, color="black", ls=["--", ":", "-.", (0, (5, 1))][k % 4], lw=1,
                   label=f"HBM capacity{' ' + name if name else ''}: {cap:.0f} GiB")
    ax.set_xlabel("HBM peak (GiB per device)" if scale == GIB else x)
    ax.set_ylabel("model TFLOP/s per device")
    ax.set_title(title or "HBM peak vs TFLOP/s per device (blue: Pareto front of the fitting configurations)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    # The legend goes under the table on the right, off the data.
    side.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="lower left", borderaxespad=0)

    # Number the front points where a number fits, largest throughput steps first.
    side.set_axis_off()
    rows: list[str] = []
    if len(front):
        fig.canvas.draw()  # lay out once; then freeze the layout so the numbers' positions stay where checked
        fig.set_layout_engine("none")
        renderer = fig.canvas.get_renderer()
        axbox = ax.get_window_extent(renderer)
        gain = front[y].diff().fillna(np.inf)
        placed: list[Any] = []
        # The markers of the fitting points are taken too: a number must not sit on a point.
        pts = ax.transData.transform(np.column_stack([xs[fits & ~clipped], d.loc[fits & ~clipped, y]]))
        r_px = 4.0 * fig.dpi / 72
        taken: list[Any] = [Bbox([[px - r_px, py - r_px], [px + r_px, py + r_px]]) for px, py in pts]
        offsets = [(dx, dy) for r_pt in (7, 13, 20) for dx, dy in
                   [(r_pt, -4), (-r_pt, 4), (r_pt, 4), (-r_pt, -10), (0, r_pt), (0, -r_pt - 6)]]
        chosen = []
        for idx in gain.sort_values(ascending=False, kind="stable").index:
            if len(chosen) >= max_labels:
                break
            r = front.loc[idx]
            for dx, dy in offsets:
                t = ax.annotate("00", (r[x] / scale, r[y]), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                                color="tab:blue", fontweight="bold", ha="left" if dx >= 0 else "right", zorder=5,
                                bbox=dict(boxstyle="square,pad=0.05", fc="white", ec="none", alpha=0.8),
                                arrowprops=dict(arrowstyle="-", lw=0.6, color="tab:blue", shrinkA=0, shrinkB=2))
                t.update_positions(renderer)
                box = Text.get_window_extent(t, renderer)  # the number alone, not its leader line
                inside = axbox.x0 <= box.x0 and box.x1 <= axbox.x1 and axbox.y0 <= box.y0 and box.y1 <= axbox.y1
                if inside and not any(_overlaps(box, b) for b in placed + taken):
                    placed.append(box)
                    chosen.append((idx, t))
                    break
                t.remove()
        chosen.sort(key=lambda it: (front.loc[it[0], x], -front.loc[it[0], y]))
        for n, (idx, t) in enumerate(chosen, start=1):
            t.set_text(str(n))  # placed as "00": no wider than that
            t.set_gid(f"front-label:{n}")
            r = front.loc[idx]
            what = str(r[label]) if label is not None and label in r else (
                describe_placements(r) or str(r.get("placement", r.get("policy", ""))))
            head = f"{n:>2}. batch {r[batch]:g}" if batch in r else f"{n:>2}."
            rows.append(f"{head}: {r[x] / scale:.1f} GiB, {r[y]:.0f} TFLOP/s\n      {what}")
    header = f"Pareto front: {len(front)} configurations" + (
        f", {len(rows)} numbered where there is room" if len(rows) < len(front) else "")
    side.text(0, 1, header, fontsize=8, fontweight="bold", va="top", transform=side.transAxes)
    side.text(0, 0.95, "\n".join(rows), fontsize=7, va="top", family="monospace", transform=side.transAxes,
              gid="front-table", linespacing=1.45)
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


# The y label of :func:`residuals` per error column: the quantity, its unit, what it is compared with.
RESIDUAL_LABELS = {
    "tflops_error": "TFLOP/s per device:\npredicted vs measured (%)",
    "hbm_error": "HBM peak (GiB per device):\npredicted vs measured (%)",
    "host_error": "pinned host peak (GiB per device):\npredicted vs measured (%)",
}


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
    ax.set_ylabel(RESIDUAL_LABELS.get(what, f"{what} (predicted / measured - 1, %)"))
    ax.set_title("Residuals per reference run: predicted / measured - 1 (runs without a measured figure: no bar)",
                 fontsize=10)
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


# The band of :func:`validation`: predictions within this fraction of the measurement.
VALIDATION_BAND = 0.10


def validation(df: pd.DataFrame, path: str | os.PathLike | None = None) -> Figure:
    """Predicted vs measured tokens/s per GPU of :func:`hbmsim.validate`'s rows, log-log: one point per row
    expressed and measured (coloured by hbmsim system), the y = x line and the +-10% band. Rows not expressed, or
    without a measured tokens/s, are not drawn; the title counts them and names the calibration."""
    drawn = df[df["expressed"].astype(bool) & df["measured_tokens_per_s_per_gpu"].notna()]
    unexpressed = int((~df["expressed"].astype(bool)).sum())
    unmeasured = int((df["expressed"].astype(bool) & df["measured_tokens_per_s_per_gpu"].isna()).sum())
    fig = _figure(7, 6.5)
    ax = fig.subplots()
    values = pd.concat([drawn["measured_tokens_per_s_per_gpu"], drawn["predicted_tokens_per_s_per_gpu"]])
    lo, hi = (values.min() / 1.5, values.max() * 1.5) if len(values) else (100.0, 1e5)
    xs = np.geomspace(lo, hi, 50)
    ax.fill_between(xs, xs * (1 - VALIDATION_BAND), xs * (1 + VALIDATION_BAND), color="tab:gray", alpha=0.2,
                    label=f"\u00b1{100 * VALIDATION_BAND:.0f}%")
    ax.plot(xs, xs, color="black", lw=1, label="y = x")
    systems = list(dict.fromkeys(drawn["hbmsim_system"]))
    for i, system in enumerate(systems):
        part = drawn[drawn["hbmsim_system"] == system]
        ax.scatter(part["measured_tokens_per_s_per_gpu"], part["predicted_tokens_per_s_per_gpu"], s=28,
                   color=_EXTRA_COLORS[i % len(_EXTRA_COLORS)] if i >= 10 else f"C{i}", label=system, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured tokens/s per GPU")
    ax.set_ylabel("predicted tokens/s per GPU")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    label = df.attrs.get("calibration_label", "")
    ax.set_title(f"Published runs vs hbmsim{', ' + label if label else ''}\n{len(drawn)} of {len(df)} runs "
                 f"drawn; {unexpressed} not expressed, {unmeasured} without measured tokens/s", fontsize=10)
    return _finish(fig, path)
