"""hbmsim: simulate the memory and time of one LLM training step (HBM, pinned host memory, offload copies).

The C++ simulator (extension module ``hbmsim._hbmsim``) does the work; this package turns its results into
dicts and pandas DataFrames and draws them (``hbmsim.plots``).

    >>> import hbmsim
    >>> r = hbmsim.simulate(system="gb200-nvl72", model="llama3.1-405b", gpus=128, batch=2, seq=8192,
    ...                     weights="nvfp4", policy="qkv_proj_offloaded")
    >>> r.step_time_s, r.hbm_peak_bytes / 2**30
    >>> df = hbmsim.sweep({"batch": [1, 2, 4], "policy": ["full", "save_qkv_proj"]}, base={...})

Sweeps run on C++ threads (``jobs``) or on a Dask cluster (``client``, see :func:`hbmsim.sweep`).
"""
from . import _hbmsim, plan
from .api import (
    HbmsimWarning,
    Reproduction,
    Result,
    checkpoint_names,
    data_files,
    expand_sweep,
    field_table,
    fields,
    models,
    plan_best_policy,
    plan_break_even,
    plan_hbm_needed,
    plan_largest_batch,
    plan_layout,
    plan_offload_layers,
    plan_recompute_layers,
    plan_scale,
    profile,
    reproduce,
    simulate,
    sweep,
    system,
    systems,
    validate,
)

__version__ = _hbmsim.__version__

__all__ = [
    "HbmsimWarning",
    "Reproduction",
    "Result",
    "checkpoint_names",
    "data_files",
    "expand_sweep",
    "field_table",
    "fields",
    "models",
    "plan",
    "plan_best_policy",
    "plan_break_even",
    "plan_hbm_needed",
    "plan_largest_batch",
    "plan_layout",
    "plan_offload_layers",
    "plan_recompute_layers",
    "plan_scale",
    "profile",
    "reproduce",
    "simulate",
    "sweep",
    "system",
    "systems",
    "validate",
    "__version__",
]
