"""The hbmsim Python API: simulate one step, sweep configurations (locally or on Dask), list systems and
models, reproduce the measured reference runs.

Configurations are dicts with the keys of a ``simulate --config`` JSON file, plus ``tensors`` ({checkpoint
name: "device" | "remat" | "offload"}). Bad input raises ValueError naming the field and value. The fields,
from the simulator's own table (``field_table()``, ``hbmsim fields``):
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from . import _hbmsim

GIB = 1024.0**3

# Report columns of a sweep frame, in this order (the rest follow sorted).
_LEADING_COLUMNS = [
    "system", "model", "policy", "step_time_s", "tflops_per_device", "mfu", "fits", "fits_reason",
    "hbm_peak_bytes", "hbm_capacity_bytes", "hbm_peak_time_s", "host_peak_bytes", "host_capacity_bytes",
    "model_flops_per_device", "executed_flops_per_device",
]
_LEADING_GROUPS = ["exposed_s.", "busy_s.", "compute_s.", "hbm_breakdown_bytes."]


class HbmsimWarning(UserWarning):
    """An input that is legal but probably not what was meant (MoE with ep 1, a profile fitted on another
    system, a what-if an order of magnitude off the hardware); the CLI prints the same lines on stderr."""


class Result(dict):
    """One simulated step: the fields of ``hbmsim simulate --json`` (a dict, also readable as attributes).

    Keys: system, model, policy, step_time_s, tflops_per_device, mfu, fits, fits_reason, hbm_peak_bytes,
    hbm_peak_time_s, hbm_capacity_bytes, hbm_breakdown_bytes (at the peak, by category), host_peak_bytes,
    host_capacity_bytes, exposed_s / busy_s / comm_bytes (by queue), compute_s (the compute stream's busy time by
    phase: forward, backward, recompute, optimizer), tokens_per_device_per_step,
    tokens_per_s_per_device, global_batch, grad_accum, mesh, model_flops_per_device, executed_flops_per_device,
    events, ops, config (the configuration, fsdp resolved), run (the resolved run: degrees, batch in both meanings,
    schedule flags, calibration and the system it was fitted on), warnings (also issued as HbmsimWarning); with pipeline parallelism (pp > 1) also stages (one dict
    per stage: stage, layers, hbm_peak_bytes, hbm_breakdown_bytes, host_peak_bytes, compute_busy_s, compute_s, idle_s,
    bubble_s, exposed_s, busy_s, comm_bytes, fits; the top-level memory figures are the worst stage's, the
    per-queue ones the mean over stages). With ``trace=True`` also timeline ([[t_s, hbm_bytes, host_bytes], ...],
    of stage timeline_stage: the one with the highest HBM peak), peak_buffers (per stage, the buffers live at its
    HBM peak: peak_frame()) and trace (Chrome trace object, loadable in Perfetto; a process per stage).
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.keys()))

    def timeline_frame(self) -> pd.DataFrame:
        """The memory timeline as a DataFrame (t_s, hbm_bytes, host_bytes); needs ``trace=True``."""
        if "timeline" not in self:
            raise ValueError("this result has no timeline; simulate with trace=True")
        return pd.DataFrame(self["timeline"], columns=["t_s", "hbm_bytes", "host_bytes"])

    def peak_frame(self) -> pd.DataFrame:
        """What HBM holds at each stage's peak, a buffer a row: stage, made_by (the op that allocates it; resident:
        alive the whole step), category, bytes, alloc_s, free_s (-1: never freed), largest first per stage; a stage's
        bytes add up to its peak. Needs ``trace=True`` (as ``simulate --peak-buffers``)."""
        if "peak_buffers" not in self:
            raise ValueError("this result has no peak buffers; simulate with trace=True")
        rows = [(p["stage"], b["made_by"], b["category"], b["bytes"], b["alloc_s"], b["free_s"])
                for p in self["peak_buffers"] for b in p["buffers"]]
        return pd.DataFrame(rows, columns=["stage", "made_by", "category", "bytes", "alloc_s", "free_s"])

    def spans(self) -> pd.DataFrame:
        """Every op of the trace as a row: stage, stream, name, start_s, end_s, dur_s, layer, phase.

        Streams (queues): compute; fsdp, ep, tp, cp, dp, pp (collectives of each mesh axis, pipeline sends); d2h,
        h2d (copy engines); each pipeline stage has its own (stage 0 without pipelining). Phases: f forward,
        b backward, r recompute, w weight gradients (zero-bubble), o optimizer, c copy. Needs ``trace=True``.
        """
        if "trace" not in self:
            raise ValueError("this result has no trace; simulate with trace=True")
        events = self["trace"]["traceEvents"]
        # A queue whose ops overlap is drawn as several tracks ("d2h #2"); a span's stream is its queue.
        names = {e["tid"]: e["args"]["queue"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
        rows = [
            (e.get("pid", 0), names.get(e["tid"], str(e["tid"])), e["name"], e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6,
             e["dur"] * 1e-6, e.get("args", {}).get("layer", -1), e.get("args", {}).get("phase", ""))
            for e in events if e.get("ph") == "X"
        ]
        return pd.DataFrame(rows, columns=["stage", "stream", "name", "start_s", "end_s", "dur_s", "layer", "phase"])


@dataclass
class Reproduction:
    """Result of :func:`reproduce`.

    runs: one row per measured reference run (id, configuration summary, reported_* / predicted_* figures,
    relative errors predicted / reported - 1, fits_right). claims: the orderings and ratios the seed documents
    state, reported vs predicted, and whether each holds. raw: ``hbmsim reproduce --json`` as a dict.
    """

    runs: pd.DataFrame
    claims: pd.DataFrame
    raw: dict = field(repr=False)
    calibration: str = ""


# ---- inputs ----

def _load_config(config: Mapping[str, Any] | str | os.PathLike | None) -> tuple[dict, str]:
    """A config dict and the name errors give it: a mapping, a JSON file path, or None (defaults)."""
    if config is None:
        return {}, "config"
    if isinstance(config, Mapping):
        return dict(config), "config"
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        with open(path, encoding="utf-8") as f:
            try:
                return json.load(f), path
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
    raise TypeError(f"config must be a dict, a JSON file path or None, not {type(config).__name__}")


def _value_text(value: Any) -> str:
    """An axis value as the C++ sweep reads it (bool -> true/false, numbers in round-trip form)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if hasattr(value, "__index__"):  # int, numpy integers
        return str(int(value))
    if isinstance(value, float) or hasattr(value, "__float__"):
        return repr(float(value))
    return str(value)


def _axes(axes: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> tuple[list[tuple[str, list[str]]], dict[str, dict]]:
    """Axes as (field, [value text]) pairs, and per field the original value of each text."""
    items = list(axes.items()) if isinstance(axes, Mapping) else [tuple(a) for a in axes]
    out: list[tuple[str, list[str]]] = []
    originals: dict[str, dict] = {}
    for item in items:
        if len(item) != 2:
            raise ValueError(f"axes: expected (field, values) pairs, got {item!r}")
        name, values = item
        if not isinstance(name, str):
            raise TypeError(f"axes: field names must be str, got {name!r}")
        if name in originals:
            raise ValueError(f"axes: field {name!r} given twice")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            values = [values]
        texts = []
        originals[name] = {}
        for v in values:
            t = _value_text(v)
            texts.append(t)
            originals[name].setdefault(t, v)
        out.append((name, texts))
    return out, originals


def _field_types() -> dict[str, str]:
    """Config field -> its type in the simulator's table: text, integer, number or on/off."""
    global _FIELD_TYPES
    if _FIELD_TYPES is None:
        _FIELD_TYPES = {f["name"]: f["type"] for f in _hbmsim.field_table()}
    return _FIELD_TYPES


_FIELD_TYPES: dict[str, str] | None = None


def _config_with(config, fields: Mapping[str, Any]) -> tuple[dict, str]:
    """The config (dict, file or None) with keyword fields on top, each read as its CLI flag is; and its name."""
    doc, origin = _load_config(config)
    doc.update({k: _flag_value(k, v) for k, v in fields.items()})
    return doc, origin


def _flag_value(name: str, value: Any) -> Any:
    """A keyword value read as the CLI reads the same field's flag (``--lhs on``, ``--batch 2``): text for an
    on/off field (on/off, true/false, yes/no, 1/0) or a number field becomes the bool or number the flag would
    give, through the simulator's own flag parser. A bool, a number in a number field, and every text field pass
    through unchanged; so does anything the parser refuses to treat as text (the config check then names it)."""
    kind = _field_types().get(name)
    if kind is None or kind == "text" or isinstance(value, (bool, np.bool_)):
        return value
    if isinstance(value, bytes):
        value = value.decode()
    if kind == "on/off":
        as_text = isinstance(value, str) or hasattr(value, "__index__")  # "on", "yes", 1, 0 as --lhs 1 / --lhs 0
    else:
        as_text = isinstance(value, str)  # "2", "9.6e10" as --batch 2, --hbm-bytes 9.6e10
    if not as_text:
        return value
    text = _value_text(value)
    try:
        (point,) = _hbmsim.expand_sweep({}, [(name, [text])], "")
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg[len("--axis "):] if msg.startswith("--axis ") else msg) from None
    return point["config"][name]


# ---- results ----

def _flatten(report: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for k, v in report.items():
        if isinstance(v, Mapping):
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _report_columns(keys: set[str]) -> list[str]:
    lead = [c for c in _LEADING_COLUMNS if c in keys]
    groups = [c for g in _LEADING_GROUPS for c in sorted(k for k in keys if k.startswith(g))]
    rest = sorted(keys - set(lead) - set(groups))
    return lead + groups + rest


def _sweep_frame(rows: list[dict], axes: list[tuple[str, list[str]]], originals: dict[str, dict]) -> pd.DataFrame:
    """Sweep rows (as ``sweep --format jsonl``) as one DataFrame, sorted by index."""
    fields = [f for f, _ in axes]
    records, keys = [], set()
    for r in sorted(rows, key=lambda r: r["index"]):
        rec = {"index": r["index"]}
        for f in fields:
            rec[f] = originals[f].get(r[f], r[f])
        result = r.get("result")
        if result is not None:
            for k, v in _flatten(result):
                if k not in rec:  # an axis column wins over the report's own system/model/policy
                    rec[k] = v
                    keys.add(k)
        rec["error"] = r.get("error", "")
        records.append(rec)
    columns = ["index", *fields, *_report_columns(keys), "error"]
    df = pd.DataFrame.from_records(records, columns=columns)
    df["index"] = df["index"].astype("int64")
    return df.reset_index(drop=True)


# ---- API ----

def simulate(config: Mapping[str, Any] | str | os.PathLike | None = None, *, trace: bool = False,
             **fields: Any) -> Result:
    """Simulates one training step of one representative device.

    config: a dict with ``simulate --config`` keys, a path to such a JSON file, or None (defaults);
    keyword arguments override single keys, e.g. ``simulate(cfg, batch=4, policy="save_qkv_proj")``, and take
    what the same field's CLI flag takes: ``lhs="on"`` / ``"off"`` (or true/false, yes/no, 1/0, as ``--lhs``),
    ``batch="2"``, ``hbm_bytes="9.6e10"``. (A config dict or file is read as a ``--config`` JSON file is.)
    trace: also record the memory timeline and the Chrome trace (``Result.timeline`` / ``Result.trace``).
    Returns a :class:`Result` with the same fields as ``hbmsim simulate --json``.
    Raises ValueError for bad input; the message names the JSON path and the value.
    """
    doc, origin = _config_with(config, fields)
    result = Result(_hbmsim.simulate(doc, trace, origin))
    for message in result["warnings"]:  # what the CLI prints on stderr
        warnings.warn(message, HbmsimWarning, stacklevel=2)
    return result


def expand_sweep(axes: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
                 base: Mapping[str, Any] | str | os.PathLike | None = None, where: str = "") -> pd.DataFrame:
    """The points a sweep would run (index, axis values, config dict), without running them."""
    base_doc, _ = _load_config(base)
    axis_list, originals = _axes(axes)
    points = _hbmsim.expand_sweep(base_doc, axis_list, where)
    rows = [{"index": p["index"], **{f: originals[f].get(v, v) for (f, _), v in zip(axis_list, p["values"])},
             "config": p["config"]} for p in points]
    return pd.DataFrame(rows, columns=["index", *(f for f, _ in axis_list), "config"])


def _run_chunk(base: dict, axes: list[tuple[str, list[str]]], where: str, indices: list[int], jobs: int) -> list[dict]:
    """Runs the sweep points with these indices (on a Dask worker: imports hbmsim there)."""
    return _hbmsim.sweep(base, axes, where, jobs, indices)


def _row_text(row: dict) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def _merge_chunks(indices: list[int], chunk_rows: Iterable[list[dict]]) -> tuple[list[dict], list[int]]:
    """The rows of the sweep points ``indices``, one per index, from the chunks' results, and the indices no
    chunk returned. A row delivered twice (a chunk run again after its worker died, by a retry, ...) counts
    once; two different rows for one point, or a row for a point not asked for, are an error."""
    wanted = set(indices)
    by_index: dict[int, dict] = {}
    for rows in chunk_rows:
        for row in rows:
            i = row["index"]
            if i not in wanted:
                raise RuntimeError(f"hbmsim.sweep on Dask: a chunk returned point {i}, which was not asked for")
            if i in by_index and by_index[i] != row and _row_text(by_index[i]) != _row_text(row):  # NaN != NaN
                raise RuntimeError(f"hbmsim.sweep on Dask: point {i} came back twice with different results")
            by_index.setdefault(i, row)
    return [by_index[i] for i in indices if i in by_index], [i for i in indices if i not in by_index]


def _task_token(*what: Any) -> str:
    """A Dask task key part naming what a task computes: equal inputs, equal keys."""
    text = json.dumps(what, sort_keys=True, default=str)
    try:
        from dask.base import tokenize
        return tokenize(text)
    except ImportError:  # a client that is not Dask's: keys by content all the same
        import hashlib
        return hashlib.sha1(text.encode()).hexdigest()


def _sweep_on_dask(client: Any, base: dict, axes: list[tuple[str, list[str]]], where: str, jobs: int,
                   chunks: int | None) -> list[dict]:
    points = _hbmsim.expand_sweep(base, axes, where)  # bad axes or where fail here, before any submission
    indices = [p["index"] for p in points]
    if not indices:
        return []
    if chunks is None:
        workers = len(client.scheduler_info().get("workers", {})) or 1
        chunks = 4 * workers
    chunks = max(1, min(int(chunks), len(indices)))
    # Interleaved chunks balance the load when cost grows along an axis (batch, seq).
    parts = [indices[k::chunks] for k in range(chunks)]
    # Each task is keyed by what it computes (the sweep's configuration and the chunk's points): the scheduler
    # runs a task again when the worker that ran it or held its result dies, and a key names one result however
    # often it is computed. The rows are then merged by point index, each point exactly once.
    token = _task_token(base, axes, where)

    def submit(part: list[int], kind: str = "chunk") -> Any:
        return client.submit(_run_chunk, base, axes, where, part, jobs,
                             key=f"hbmsim-sweep-{kind}-{token}-{part[0]}-{len(part)}-{part[-1]}")

    rows, missing = _merge_chunks(indices, client.gather([submit(part) for part in parts]))
    if missing:  # no chunk returned these points: run them once more, then give up loudly rather than drop them
        more, missing = _merge_chunks(missing, client.gather([submit(missing, "rerun")]))
        rows += more
        if missing:
            raise RuntimeError(f"hbmsim.sweep on Dask: no result for points {missing[:10]}"
                               f"{' ...' if len(missing) > 10 else ''} after running them again")
    return rows


def sweep(axes: Mapping[str, Sequence[Any]] | Iterable[tuple[str, Sequence[Any]]],
          base: Mapping[str, Any] | str | os.PathLike | None = None, where: str = "", jobs: int = 1,
          client: Any = None, chunks: int | None = None) -> pd.DataFrame:
    """Simulates the Cartesian product of the axis values; one DataFrame row per point, sorted by index.

    axes: {field: [values]} (or (field, values) pairs), fields as in a config, or ``tensor.NAME`` for one
    checkpoint's placement; the last axis varies fastest. Values may be str, int, float or bool.
    base: the config every point starts from (dict, JSON file path, or None).
    where: keep only points where all conditions hold: ``FIELD==V,FIELD!=V,FIELD<=N,...`` over axis fields.
    jobs: C++ threads (per Dask task when ``client`` is given).
    client: a ``dask.distributed.Client``; the points are split into ``chunks`` (default 4 per worker)
    tasks, each worker imports hbmsim and runs its chunk through the C++ sweep, and the rows are gathered.
    The result equals the local one, also when workers die during the sweep: Dask runs their tasks again
    elsewhere, tasks are keyed by the points they compute, and the rows are merged by point, each once.
    The workers must be able to import this same hbmsim (same PYTHONPATH / install). To use an existing cluster::

        from dask.distributed import Client
        client = Client("tcp://scheduler:8786")
        df = hbmsim.sweep({"batch": [1, 2, 4, 8]}, base=cfg, client=client)

    or a local one: ``Client(LocalCluster(n_workers=4, threads_per_worker=1))``.

    Columns: index, one per axis (the values as given), the report fields (nested ones flattened as
    ``exposed_s.h2d``, ``hbm_breakdown_bytes.parameters``, ...; a report field named like an axis is left
    out), and error: "" or, for a point that is bad input, the message (its report columns are NaN).
    Bad axes, a bad base or a bad ``where`` raise ValueError before anything runs.
    """
    base_doc, _ = _load_config(base)
    axis_list, originals = _axes(axes)
    if client is None:
        rows = _hbmsim.sweep(base_doc, axis_list, where, jobs)
    else:
        rows = _sweep_on_dask(client, base_doc, axis_list, where, jobs, chunks)
    return _sweep_frame(rows, axis_list, originals)


def systems() -> pd.DataFrame:
    """Built-in systems, one row each (index: id), as ``hbmsim systems --json`` (peaks: dense_peak_flops.DTYPE)."""
    return pd.json_normalize(_hbmsim.systems()).set_index("id")


def system(name: str, calibration: str = "") -> dict:
    """One system's figures as a simulation sees them: built-in id or system JSON path, with the calibration
    profile ``calibration`` (file path or built-in profile name; "" = datasheet figures) applied."""
    return _hbmsim.system(name, calibration)


def models() -> pd.DataFrame:
    """Shipped models, built-in specs and HuggingFace configs, one row each (index: model, the name ``model``
    takes in a config), with total_params and activated_params."""
    return pd.json_normalize(_hbmsim.models()).set_index("model")


def fields() -> list[str]:
    """Config fields a sweep axis accepts (plus ``tensor.NAME``)."""
    return list(_hbmsim.fields())


def field_table() -> pd.DataFrame:
    """Every config field (index: name) with its CLI flag, type, default and meaning."""
    return pd.DataFrame(_hbmsim.field_table()).set_index("name")


# The module's documentation lists the fields from the same table the CLI's help is made from.
__doc__ += "\n" + "\n".join(
    f"- ``{f['name']}`` ({f['type']}{', default ' + f['default'] if f['default'] else ''}): {f['help']}"
    for f in _hbmsim.field_table()) + "\n"


def checkpoint_names() -> list[str]:
    """Checkpoint (tensor) names a custom policy can place with ``tensors`` / ``tensor.NAME``. Under no_recompute
    and selective Megatron's module tensors may be placed too (the CLI's ``--tensor`` help lists them), and any
    name may be given for one kind of layer as ``NAME@dense`` or ``NAME@moe``."""
    return list(_hbmsim.checkpoint_names())


def data_files(prefix: str = "") -> list[str]:
    """Data files compiled into hbmsim under ``prefix``, e.g. ``data_files("profiles/")``."""
    return list(_hbmsim.data_files(prefix))


def profile(path_or_name: str) -> dict:
    """A calibration profile (JSON file path, or the name of a built-in one), validated and normalised."""
    text = _hbmsim.data_file(f"profiles/{path_or_name}.json")
    if text is not None:
        return _hbmsim.profile(json.loads(text), f"builtin:profiles/{path_or_name}.json")
    doc, origin = _load_config(os.fspath(path_or_name))
    return _hbmsim.profile(doc, origin)


def _summary(config: Mapping[str, Any]) -> str:
    tensors = config.get("tensors") or {}
    if not tensors:
        return config.get("policy", "")
    placements = sorted(set(tensors.values()))
    return f"{config.get('policy', '')}: {'/'.join(placements)} {', '.join(sorted(tensors))}"


def plan_largest_batch(config: Mapping[str, Any] | str | os.PathLike | None = None, *,
                       variants: Sequence[str] = (), max_batch: int = 1024, powers_of_two: bool = False,
                       **fields: Any) -> pd.DataFrame:
    """Largest batch that fits, per policy variant (as ``hbmsim plan largest-batch --json``).

    variants: ``"LABEL=field:value;field:value"`` strings; none: on device / remat / offload of the config's
    ``tensors``, or the presets (under framework megatron no_recompute, selective and full; MaxText's
    otherwise). Returns one row per variant: variant, largest_batch (in the config's own batch field: the
    per-device batch, a fraction with tp x cp x pp > 1, or Megatron's micro_batch when the config gives one),
    micro_batch (sequences per model replica per micro-step there), stopped (the first batch that does not
    fit and what ran out, or that max_batch was reached), tflops_per_device and hbm_peak_bytes at the
    largest batch, and settings (simulate config, MaxText keys, XLA flags, Megatron arguments).
    """
    rows = []
    for v in _hbmsim.plan_largest_batch(_config_with(config, fields)[0], list(variants), max_batch, powers_of_two):
        rep = v.get("report", {})
        rows.append({"variant": v["variant"], "largest_batch": v["largest_batch"], "micro_batch": v["micro_batch"],
                     "stopped": v["stopped"],
                     "tflops_per_device": rep.get("tflops_per_device", np.nan),
                     "hbm_peak_bytes": rep.get("hbm_peak_bytes", np.nan), "settings": v.get("settings")})
    return pd.DataFrame(rows)


def plan_best_policy(config: Mapping[str, Any] | str | os.PathLike | None = None, *, names: Sequence[str] = (),
                     jobs: int = 1, batches: Sequence[float] = (), **fields: Any) -> dict | list:
    """Best device/remat/offload placement of ``names`` (default: the model's largest checkpoints) within HBM and
    host capacity, as ``hbmsim plan best-policy --json``: method, evaluated, found, best (a report), placement,
    settings, and pareto (HBM peak vs TFLOP/s over every placement evaluated, each point with its recompute_s and
    host_copies_exposed_s: what the placement trades). With ``batches``, one such dict
    per per-device batch with its ``batch``, as ``plan best-policy --batches ... --json``."""
    base = _config_with(config, fields)[0]
    if not batches:
        return _hbmsim.plan_best_policy(base, list(names), jobs)
    for i, b in enumerate(batches):  # all checked before the first search runs
        if not b > 0:
            raise ValueError(f"batches {b} (must be > 0)")
        if b in batches[:i]:
            raise ValueError(f"batches {b} (given twice)")
    out = []
    for b in batches:
        r = _hbmsim.plan_best_policy({**base, "batch": b}, list(names), jobs)
        r["batch"] = b
        out.append(r)
    return out


def plan_break_even(config: Mapping[str, Any] | str | os.PathLike | None = None, *, tolerance: float = 0.01,
                    **fields: Any) -> dict:
    """Lowest host-link bandwidth (bytes/s per GPU per direction) at which the config's offload is within
    ``tolerance`` of the best alternative that fits (the same tensors on device, else rematerialized), as
    ``hbmsim plan break-even --json``: break_even_bytes_per_s (0: never), reference, reference_tflops, curve."""
    return _hbmsim.plan_break_even(_config_with(config, fields)[0], tolerance)


_LAYOUT_COUNTS = ("candidates", "offloaded", "pruned", "skipped", "refused", "simulated", "fitting")


def _whole(name: str, value: Any) -> int:
    """A held degree's value as a whole number, or the ValueError the CLI's flag would give."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} = {value!r} (expected a whole number)")
    return int(value)


def _layout_part(doc: dict, top: int, policy: str, micro_batch: int, prune: bool, jobs: int, state_offload: bool,
                 held: dict) -> dict:
    return _hbmsim.plan_layout(doc, top, [policy], [micro_batch], prune, jobs, state_offload, held)


def _layout_on_dask(client: Any, doc: dict, top: int, policies: Sequence[str], micro_batches: Sequence[int],
                    prune: bool, jobs: int, state_offload: bool, held: dict) -> dict:
    """One task per (policy, micro-batch): each finds its own exact top list (its pruning only drops what
    cannot enter it), so the best `top` of their union is the whole search's."""
    _hbmsim.expand_sweep(doc, [], "")  # a bad config fails here, before anything is submitted
    defaults = _hbmsim.layout_defaults(doc)
    policies = list(policies) or list(defaults["policies"])
    micro_batches = [int(m) for m in micro_batches] or [int(m) for m in defaults["micro_batches"]]
    token = _task_token(doc, top, prune, state_offload, held)
    futures = [client.submit(_layout_part, doc, top, p, m, prune, jobs, state_offload, held, key=f"hbmsim-layout-{token}-{p}-{m}")
               for p in policies for m in micro_batches]
    parts = client.gather(futures)
    merged = {k: sum(part[k] for part in parts) for k in _LAYOUT_COUNTS}
    merged["global_batch"] = parts[0]["global_batch"]
    merged["held"] = parts[0]["held"]
    rows = sorted((t for part in parts for t in part["top"]),
                  key=lambda t: -t["report"]["tokens_per_s_per_device"])
    merged["top"] = rows[:top]
    merged["none_fit"] = "" if rows else next((part["none_fit"] for part in parts if part["none_fit"]), "")
    return merged


def _layout_keywords(config, fields: dict, policies: Sequence[str], micro_batches: Sequence[int]):
    """The config and a search's held degrees, policies and micro-batches from the keywords: a held degree's
    keyword is one value or a list of them, each read as the CLI reads its flag, and goes to the search, not into
    the config; ``policy=`` and ``micro_batch=`` are one-item lists."""
    held = {}
    for name in _hbmsim.layout_holdable_fields():
        if name in fields:
            value = fields.pop(name)
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            parsed = [_flag_value(name, v) for v in values]
            held[name] = [int(bool(v)) if name == "sharded_optimizer" else _whole(name, v) for v in parsed]
    doc = _config_with(config, fields)[0]
    for one, many, given in (("policy", "policies", policies), ("micro_batch", "micro_batches", micro_batches)):
        if one in fields and given:
            raise ValueError(f"{one} = {fields[one]!r} (with {many}: give the {many} to try in one of them)")
    if "policy" in fields:
        policies = [doc["policy"]]
    if "micro_batch" in fields:
        micro_batches = [doc["micro_batch"]]
    return doc, held, list(policies), [int(m) for m in micro_batches]


def _layout_row(t: dict) -> dict:
    """One layout of a search's top list as a DataFrame row."""
    rep = t["report"]
    return {**t["degrees"], "sharded_optimizer": t["sharded_optimizer"], "ep_overlap": t["ep_overlap"],
            "micro_batch": t["micro_batch"], "grad_accum": t["grad_accum"], "policy": t["policy"],
            "optimizer_offload": t["optimizer_offload"], "parameter_offload": t["parameter_offload"],
            "step_time_s": rep["step_time_s"], "tokens_per_s_per_device": rep["tokens_per_s_per_device"],
            "tflops_per_device": rep["tflops_per_device"], "hbm_peak_bytes": rep["hbm_peak_bytes"],
            "host_peak_bytes": rep["host_peak_bytes"], "limit": t["limit"], "settings": t["settings"]}


def plan_layout(config: Mapping[str, Any] | str | os.PathLike | None = None, *, top: int = 10,
                policies: Sequence[str] = (), micro_batches: Sequence[int] = (), prune: bool = True, jobs: int = 1,
                state_offload: bool = True, client: Any = None, **fields: Any) -> pd.DataFrame:
    """Fastest parallel layouts for the config's model, GPUs, system and global batch (default: one sequence per
    GPU), as ``hbmsim plan layout --json``: one row per layout, fastest first, with tp, cp, pp, vp, ep, expert_tp
    (1: experts folded over tp, which the search tries for MoE models under framework megatron), fsdp, dp,
    sharded_optimizer, ep_overlap (Megatron's combined 1F1B, tried likewise), micro_batch, grad_accum, policy, optimizer_offload, parameter_offload (a layout that
    cannot fit otherwise is tried with its optimizer state, then its parameters, in host memory;
    ``state_offload=False``: not), step_time_s, tokens_per_s_per_device, tflops_per_device, hbm_peak_bytes,
    host_peak_bytes, limit (what limits it) and settings (simulate config, MaxText, XLA flags, Megatron arguments). The search's
    counts (candidates, offloaded, pruned, skipped, refused, simulated, fitting, none_fit) and the held
    degrees (held: {"tp": 8, "pp": [4, 8]}) are in ``DataFrame.attrs``; no row and ``attrs["none_fit"]`` when nothing fits. ``policies`` defaults to the
    CLI's: MaxText's presets, or under framework megatron no_recompute, selective and full, and the recompute
    modules the model has as "no_recompute+moe_act+layernorm" (preset, then Megatron modules joined by "+").

    A degree given as a keyword (``tp=8``, ``pp=[4, 8]``, any of tp, cp, pp, vp, ep, fsdp, dp, sharded_optimizer)
    is held to that value or list, as the CLI's flags are (a config's are searched); ``policy=`` and
    ``micro_batch=`` are one-item ``policies`` and ``micro_batches``.

    client: a ``dask.distributed.Client``: one task per (policy, micro-batch), each an exact search of its
    share (``jobs`` threads each), merged into the same top list (the counts add up; each share prunes against
    its own top list, so more candidates are simulated in all than by one search)."""
    doc, held, policies, micro_batches = _layout_keywords(config, fields, policies, micro_batches)
    # before any task is sent
    _hbmsim.check_layout_options(doc, top, policies, micro_batches, jobs, held)
    if client is None:
        r = _hbmsim.plan_layout(doc, top, policies, micro_batches, prune, jobs, state_offload, held)
    else:
        r = _layout_on_dask(client, doc, top, policies, micro_batches, prune, jobs, state_offload, held)
    rows = [_layout_row(t) for t in r["top"]]
    df = pd.DataFrame(rows)
    df.attrs.update({k: r[k] for k in ("global_batch", *_LAYOUT_COUNTS, "none_fit", "held")})
    return df


def plan_scale(config: Mapping[str, Any] | str | os.PathLike | None = None, *, gpus: int | Sequence[int] | None = None,
               tokens: float = 0, days: float = 0, policies: Sequence[str] = (), micro_batches: Sequence[int] = (),
               prune: bool = True, jobs: int = 1, state_offload: bool = True, **fields: Any) -> pd.DataFrame:
    """The fastest layout at each GPU count in ``gpus``, all at one global batch (the config's ``global_batch``,
    else one sequence per GPU at the largest count), as ``hbmsim plan scale --json``: one row per count, ascending,
    with its layout and figures as :func:`plan_layout`'s rows, and system, gpus, fits, tokens_per_s (all GPUs),
    scaling (tokens/s per GPU over the smallest fitting count's), days and gpu_hours (what ``tokens`` take at the
    simulated rate; 0 without a budget), answer (the row a comparison of systems takes: the fewest GPUs within
    ``days``, else the most tokens/s) and none_fit (why nothing fits, where nothing does). ``attrs``: global_batch,
    seq, tokens, days, fewest_within_days (the fewest GPUs that meet ``days``; -1: none; 0: no deadline; with
    several systems a dict by system) and held. ``gpus`` None: the config's GPUs alone. ``system`` may be a list:
    a plan per system, in that order, as ``--system a,b``. The other keywords are :func:`plan_layout`'s (held
    degrees, ``policy=``, ``micro_batch=``)."""
    counts = [] if gpus is None else list(gpus) if isinstance(gpus, (list, tuple)) else [gpus]
    counts = [_whole("gpus", n) for n in counts]
    systems = fields.pop("system", None)
    several = isinstance(systems, (list, tuple))
    if several:
        if not systems or len(set(systems)) != len(systems):
            raise ValueError(f"system = {list(systems)!r} (give each system once)")
        docs = [_layout_keywords(config, {**fields, "system": s}, policies, micro_batches) for s in systems]
    else:
        docs = [_layout_keywords(config, fields if systems is None else {**fields, "system": systems}, policies, micro_batches)]
    for doc, *_ in docs:
        _hbmsim.expand_sweep(doc, [], "")  # every system's config checked before any is searched
    plans = [_hbmsim.plan_scale(doc, counts, float(tokens), float(days), p, m, prune, jobs, state_offload, held)
             for doc, held, p, m in docs]
    rows = []
    for r in plans:
        for row in r["rows"]:
            search = row["search"]
            layout = _layout_row(search["top"][0]) if search["top"] else {}
            rows.append({"system": r["system"], "gpus": row["gpus"], "fits": row["fits"], **layout,
                         "tokens_per_s": row["tokens_per_s"], "scaling": row["scaling"], "days": row["days"],
                         "gpu_hours": row["gpu_hours"], "answer": row["gpus"] == r["answer_gpus"],
                         "none_fit": search["none_fit"]})
    df = pd.DataFrame(rows)
    df.attrs.update({k: plans[0][k] for k in ("global_batch", "seq", "tokens", "days", "fewest_within_days")})
    if several:
        df.attrs["fewest_within_days"] = {r["system"]: r["fewest_within_days"] for r in plans}
    df.attrs["held"] = plans[0]["rows"][0]["search"]["held"]
    return df


def plan_offload_layers(config: Mapping[str, Any] | str | os.PathLike | None = None, **fields: Any) -> dict:
    """Fewest layers whose activations go to host (Megatron's cpu_offloading_num_layers) for the config to fit,
    as ``hbmsim plan offload-layers --json``: offload_layers (-1: no count fits), why, tried (each count
    simulated: HBM and host peaks, tokens/s per GPU, fits) and settings at the answer."""
    return _hbmsim.plan_offload_layers(_config_with(config, fields)[0])


def plan_recompute_layers(config: Mapping[str, Any] | str | os.PathLike | None = None, **fields: Any) -> dict:
    """Fewest layers per pipeline chunk recomputed in full (Megatron's recompute_num_layers, block method) for the
    config to fit, as ``hbmsim plan recompute-layers --json`` (the same keys as ``plan_offload_layers`` with
    recompute_layers)."""
    return _hbmsim.plan_recompute_layers(_config_with(config, fields)[0])


def plan_hbm_needed(config: Mapping[str, Any] | str | os.PathLike | None = None, **fields: Any) -> dict:
    """HBM and pinned host memory the config needs, as ``hbmsim plan hbm-needed --json``: hbm_needed_bytes (the peak
    with HBM no object), host_needed_bytes, hbm_capacity_bytes, breakdown, step_time_s, and, where LHS's memory limit
    shapes the schedule, hbm_fits_from_bytes with step_time_at_fit_s (the least HBM that fits, prefetches held back)
    and hbm_full_speed_from_bytes (the least that keeps step_time_s); without that all three are the peak."""
    return _hbmsim.plan_hbm_needed(_config_with(config, fields)[0])


def reproduce(calibration: str = "", runs_path: str = "", configs_path: str = "") -> Reproduction:
    """Simulates every measured reference run (GB200 NVL72, 128 GPUs) and checks the documented claims.

    calibration: profile file path or built-in profile name ("" = datasheet figures).
    runs_path / configs_path: other reference files (default: the built-in data/reference copies).
    Returns a :class:`Reproduction` (runs and claims DataFrames, plus the raw ``reproduce --json`` dict).
    """
    raw = _hbmsim.reproduce(calibration, runs_path, configs_path)
    rows = []
    for r in raw["runs"]:
        c, rep, pred, err = r["config"], r["reported"], r["predicted"], r["error"]
        rows.append({
            "id": r["id"],
            "model": c["model"],
            "policy": _summary(c),
            "batch": c["batch"],
            "seq": c["seq"],
            "lhs": c["lhs"],
            "pipelined_transfers": c["pipelined_transfers"],
            "reported_tflops_per_device": rep["tflops_per_device"],
            "predicted_tflops_per_device": pred["tflops_per_device"],
            "tflops_error": err["tflops"],
            "reported_hbm_gib": rep["hbm_gib"],
            "predicted_hbm_gib": pred["hbm_peak_bytes"] / GIB,
            "hbm_capacity_gib": pred["hbm_capacity_bytes"] / GIB,
            "hbm_error": err["hbm"],
            "reported_host_gib": rep["host_gib"],
            "predicted_host_gib": pred["host_peak_bytes"] / GIB,
            "host_error": err["host"],
            "reported_fits": rep["fits"],
            "predicted_fits": pred["fits"],
            "fits_right": r["fits_right"],
            "step_time_s": pred["step_time_s"],
        })
    runs = pd.DataFrame(rows)
    for col in ["reported_tflops_per_device", "tflops_error", "reported_hbm_gib", "hbm_error", "reported_host_gib",
                "host_error"]:
        runs[col] = runs[col].astype("float64")  # None (not reported) -> NaN
    claims = pd.DataFrame(raw["claims"], columns=["claim", "reported", "predicted", "holds", "test"])
    return Reproduction(runs=runs, claims=claims, raw=raw, calibration=calibration)


# Columns of :func:`validate`, in order: the row as published, how hbmsim read it, and the comparison.
VALIDATION_COLUMNS = ["row", "src", "container", "system", "gpus", "model", "prec", "hbmsim_system", "hbmsim_model", "layout", "recompute", "expressed",
                      "reason", "note", "measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu",
                      "predicted_tokens_per_s_per_gpu", "error", "predicted_tflops_per_gpu", "hbm_peak_gib", "fits",
                      "config"]
_VALIDATION_FLOATS = ["measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu", "predicted_tokens_per_s_per_gpu",
                      "error", "predicted_tflops_per_gpu", "hbm_peak_gib"]


def validate(calibration: str = "", runs_path: str = "", jobs: int = 2, rows: str = "") -> pd.DataFrame:
    """The published measured runs (Megatron-Bridge, NeMo, DGX Cloud recipes, FlagPerf) against hbmsim.

    One row per run of ``data/reference/published_runs.csv`` (or ``runs_path``), in file order, as ``hbmsim
    validate --json``: the row as published, the built-in system and model it maps to ("" when none), its layout and recompute as hbmsim reads them, whether it could be
    expressed (``reason`` says why not), measured and predicted tokens/s per GPU, ``error`` = predicted /
    measured - 1 (NaN where unmeasured or not expressed), predicted TFLOP/s, HBM peak, ``fits`` and the run
    ``config`` (None when not expressed). ``df.attrs`` holds ``calibration``, ``calibration_label``,
    ``runs_file`` and ``summary`` (MAPE, median and worst overall and per src, system, model).
    calibration: profile file path or built-in profile name ("" = datasheet figures).
    rows: only these data rows, by the file's numbers ("46,48-50"; "" = all), as ``hbmsim validate --rows``.
    """
    raw = _hbmsim.validate(calibration, os.fspath(runs_path), jobs, rows)
    df = pd.DataFrame.from_records(raw["rows"], columns=VALIDATION_COLUMNS)
    for col in _VALIDATION_FLOATS:
        df[col] = df[col].astype("float64")  # None -> NaN
    df.attrs.update({"calibration": raw["calibration"], "calibration_label": raw["calibration_label"],
                     "runs_file": raw["runs_file"], "summary": raw["summary"]})
    return df
