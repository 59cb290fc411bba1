"""What hbmsim.plots draws, read back from the matplotlib objects (not just "a PNG was written").

Realistic inputs, as the notebooks use them: DeepSeek-V3 671B and Llama 3.1 on GB200 / GB300 NVL72."""
import re

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

import hbmsim
from hbmsim import plots

GIB = 2.0**30
DSV3 = {"model": "deepseek-v3-671b", "gpus": 128, "ep": 64, "seq": 4096, "policy": "custom", "lhs": True,
        "pipelined_transfers": True}
NAMES = ["mla_q", "mla_kv", "moe_mlpwi_0", "moe_mlpwi_1"]


def rgba(c):
    return tuple(np.round(mcolors.to_rgba(c), 4))


def overlap(a, b):
    return not (a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0)


def legend_texts(legend):
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def all_legends(fig):
    return [lg for lg in [*(a.get_legend() for a in fig.axes), *fig.legends] if lg is not None]


# ---- hbm_timeline ----

@pytest.fixture(scope="module")
def zero_at_peak_result():
    """Llama 3.1 8B, minimal_offloaded: offload and collective buffers are in use during the step but zero at
    the HBM peak, so the bar at the peak has fewer categories than the stacked area."""
    r = hbmsim.simulate(model="llama3.1-8b", gpus=8, batch=4, policy="minimal_offloaded", trace=True)
    names = list(r.timeline_categories)
    cats = np.asarray(r.timeline_hbm_by_category, dtype=float).reshape(len(r.timeline), len(names))
    over_time = {n for i, n in enumerate(names) if cats[:, i].max() > 0}
    at_peak = {c for c, v in r.hbm_breakdown_bytes.items() if v > 0}
    assert over_time - at_peak, "precondition: some category is used during the step but zero at the peak"
    return r


def test_hbm_timeline_one_colour_per_category_and_legend_off_the_data(zero_at_peak_result):
    r = zero_at_peak_result
    fig = plots.hbm_timeline(r)
    ax, bar = fig.axes[:2]
    names = set(r.timeline_categories)

    # The stacked area: one PolyCollection per category in use during the step, labelled with the category.
    area = {c.get_label(): rgba(c.get_facecolor()[0]) for c in ax.collections
            if isinstance(c, PolyCollection) and c.get_label() in names}
    assert set(area) == {n for n in names
                         if np.asarray(r.timeline_hbm_by_category).reshape(len(r.timeline), -1)[
                             :, list(r.timeline_categories).index(n)].max() > 0}
    assert len(set(area.values())) == len(area), "two categories share a colour in the area"

    # The bar at the peak: the segments with a height, bottom to top, are the categories with bytes at the peak
    # in the fixed category order; each has the colour its category has in the area.
    segments = [p for p in bar.patches if isinstance(p, Rectangle) and p.get_height() > 0]
    order = [c for c in plots._CATEGORY_ORDER if r.hbm_breakdown_bytes.get(c, 0) > 0]
    assert len(segments) == len(order)
    for seg, cat in zip(sorted(segments, key=lambda p: p.get_y()), order):
        assert seg.get_height() == pytest.approx(r.hbm_breakdown_bytes[cat] / GIB)
        assert rgba(seg.get_facecolor())[:3] == area[cat][:3], f"{cat}: bar and area colours differ"
    for cat, colour in area.items():  # the fixed map, the same in every figure
        assert colour[:3] == rgba(plots.category_color(cat))[:3]
    assert sum(p.get_height() for p in segments) == pytest.approx(r.hbm_peak_bytes / GIB, rel=1e-6)

    # The total, the capacity and the peak are drawn and named in the legend.
    texts = [t for lg in all_legends(fig) for t in legend_texts(lg)]
    assert any("HBM in use" in t for t in texts) and any("HBM capacity" in t for t in texts)
    assert any(t.startswith("HBM peak") for t in texts)
    for cat in order:
        assert any(t.startswith(cat) for t in texts), f"{cat} is not in the legend"

    # No legend covers either axes (and so none covers data).
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [a.get_window_extent(renderer) for a in (ax, bar)]
    legends = all_legends(fig)
    assert legends
    for lg in legends:
        lb = lg.get_window_extent(renderer)
        assert not any(overlap(lb, b) for b in boxes), "a legend sits on the axes"
        assert lb.x1 <= fig.bbox.x1 + 1 and lb.y0 >= -1, "a legend is cut off by the figure edge"


# ---- tflops_vs_batch ----

def test_tflops_vs_batch_linear_axis_for_a_linear_sweep():
    df = hbmsim.sweep({"policy": ["full", "save_qkv_proj"], "batch": [1, 2, 3, 4, 5, 6]},
                      base={"model": "llama3.1-70b", "gpus": 64}, jobs=4)
    fig = plots.tflops_vs_batch(df)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear"
    lo, hi = ax.get_xlim()
    assert lo <= 1 and hi >= 6
    # One line and one set of markers per policy, in the legend.
    assert set(legend_texts(ax.get_legend())) >= {"full", "save_qkv_proj"}


@pytest.fixture(scope="module")
def dsv3_batches():
    frames = []
    for placement in ["device", "offload"]:
        df = hbmsim.sweep({"batch": [1, 2, 4, 8, 16, 32, 64]},
                          base={**DSV3, "system": "gb200-nvl72", "tensors": dict.fromkeys(NAMES, placement)}, jobs=4)
        df.insert(1, "placement", f"{placement} all")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def test_tflops_vs_batch_powers_of_two_and_oom_crosses_in_the_legend(dsv3_batches):
    df = dsv3_batches
    assert (~df.fits).any() and df.fits.any(), "precondition: some batches do not fit"
    fig = plots.tflops_vs_batch(df, line="placement")
    ax = fig.axes[0]
    # Powers of two over 1..64: a log2 axis whose ticks are the batches themselves.
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16", "32", "64"]
    # The crosses: one marker per point that does not fit, and an entry for them in the legend.
    crosses = [ln for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata())]
    assert sum(len(ln.get_xdata()) for ln in crosses) == int((~df.fits).sum())
    legend = ax.get_legend()
    entries = dict(zip(legend_texts(legend), legend.legend_handles if hasattr(legend, "legend_handles")
                       else legend.legendHandles))
    oom = [t for t in entries if "does not fit" in t]
    assert len(oom) == 1, list(entries)
    assert isinstance(entries[oom[0]], Line2D) and entries[oom[0]].get_marker() == "x"
    assert {"device all", "offload all"} <= set(entries)


# ---- pareto ----

@pytest.fixture(scope="module")
def dsv3_placements():
    axes = {"system": ["gb200-nvl72", "gb300-nvl72"], "batch": [2, 4, 8, 16, 40],
            "tensor.mla_q": ["remat", "device", "offload"], "tensor.moe_mlpwi_0": ["remat", "device", "offload"]}
    return hbmsim.sweep(axes, base=DSV3, jobs=4)


def test_pareto_capacity_per_system_clipped_axis_and_readable_labels(dsv3_placements):
    df = dsv3_placements
    fig = plots.pareto(df)
    ax = fig.axes[0]
    caps = df.groupby("system")["hbm_capacity_bytes"].first() / GIB
    texts = [t for lg in all_legends(fig) for t in legend_texts(lg)]

    # A vertical capacity line for every system present, each named in the legend.
    vlines = {round(float(ln.get_xdata()[0]), 3) for ln in ax.get_lines()
              if len(set(map(float, ln.get_xdata()))) == 1 and ln.get_linestyle() != "None"}
    for system, cap in caps.items():
        assert round(float(cap), 3) in vlines, f"no capacity line for {system}"
        assert any(system in t and "capacity" in t for t in texts), f"{system} capacity not in the legend"
    title = ax.get_title()
    assert "capacity" not in title or vlines

    # Points far past the capacity do not stretch the HBM axis: it ends within 2x the largest capacity, and
    # the points beyond sit on its right edge as ">" markers with their own legend entry.
    hbm = df.hbm_peak_bytes / GIB
    assert hbm.max() > 2 * caps.max(), "precondition: some point is far past every capacity"
    lo, hi = ax.get_xlim()
    assert hbm[df.fits].max() <= hi <= 2 * caps.max()
    edge = [c for c in ax.collections if c.get_gid() == "clipped"]
    assert len(edge) == 1
    ex = edge[0].get_offsets()[:, 0]
    assert len(ex) == int((hbm > hi).sum()) and np.all((ex <= hi) & (ex >= hi - 0.05 * (hi - lo)))
    assert any("beyond the axis" in t for t in texts)

    # Front points are numbered; the numbers do not overlap each other, and each number's row in the table
    # on the right gives that point's batch and its placements in words (no R/D/O codes).
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if (t.get_gid() or "").startswith("front-label:") and t.get_text()]
    assert len(labels) >= 5
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the numbers, not their leader lines
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not overlap(boxes[i], boxes[j]), f"labels {labels[i].get_text()} and {labels[j].get_text()} overlap"
    table = [t for a in fig.axes for t in a.texts if t.get_gid() == "front-table"]
    assert len(table) == 1
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\s*(\d+)\. (.*)\n(.*)$", table[0].get_text(), re.M)}
    front = plots.pareto_front(df[df.fits])
    for t in labels:
        px, py = t.xy
        match = front[np.isclose(front.hbm_peak_bytes / GIB, px) & np.isclose(front.tflops_per_device, py)]
        assert len(match) == 1
        row = rows[t.get_text()]
        assert f"batch {match.batch.iloc[0]}:" in row
        assert plots.describe_placements(match.iloc[0]) in row
        assert re.search(r"\b(keep|offload|recompute) ", row)
    every_text = [t.get_text() for a in fig.axes for t in a.texts] + texts + [title]
    assert not any(re.search(r"\b[RDO]{3,}\b", t) for t in every_text), "cryptic placement codes"


def test_pareto_title_promises_no_capacity_line_it_does_not_draw(dsv3_placements):
    fig = plots.pareto(dsv3_placements, x="host_peak_bytes")  # no HBM capacity on a host-memory axis
    ax = fig.axes[0]
    assert not any("capacity" in t for lg in all_legends(fig) for t in legend_texts(lg))
    assert "capacity" not in ax.get_title().lower() and "dashed" not in ax.get_title().lower()


def test_describe_placements_spells_out_the_placements():
    row = {"batch": 8, "tensor.mla_q": "offload", "tensor.mla_kv": "remat", "tensor.moe_mlpwi_0": "device",
           "tensor.moe_mlpwi_1": "offload"}
    assert plots.describe_placements(row) == "keep moe_mlpwi_0; offload mla_q, moe_mlpwi_1; recompute mla_kv"
    assert plots.describe_placements({"batch": 1}) == ""


# ---- residuals ----

@pytest.mark.parametrize("what, words", [("tflops_error", ["TFLOP/s per device", "measured", "(%)"]),
                                         ("hbm_error", ["HBM", "GiB", "measured", "(%)"]),
                                         ("host_error", ["host", "GiB", "measured", "(%)"])])
def test_residuals_axis_label_names_the_quantity_and_unit(what, words):
    rep = hbmsim.reproduce()
    fig = plots.residuals({"datasheet": rep}, what=what)
    ax = fig.axes[0]
    label = ax.get_ylabel()
    for w in words:
        assert w in label, (w, label)
    assert "tflops error" not in label and "_error" not in label
    # One bar per reference run; runs without a measured figure have a zero-height bar.
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == len(rep.runs)
    expected = (rep.runs[what].astype(float) * 100).fillna(0).to_numpy()
    assert np.allclose([b.get_height() for b in bars], expected)
    assert [t.get_text() for t in ax.get_xticklabels()] == list(rep.runs["id"])
