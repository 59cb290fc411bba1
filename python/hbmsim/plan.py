"""The planner's questions under the CLI's names: ``hbmsim.plan.layout(...)`` is ``hbmsim plan layout``.

Each is the function of the same name in :mod:`hbmsim` with the ``plan_`` prefix (``hbmsim.plan.layout`` is
``hbmsim.plan_layout``), returning the same DataFrames and dicts; their docstrings say what each answers.
"""
from .api import plan_best_policy as best_policy
from .api import plan_break_even as break_even
from .api import plan_hbm_needed as hbm_needed
from .api import plan_largest_batch as largest_batch
from .api import plan_layout as layout
from .api import plan_offload_layers as offload_layers
from .api import plan_recompute_layers as recompute_layers
from .api import plan_scale as scale

__all__ = ["best_policy", "break_even", "hbm_needed", "largest_batch", "layout", "offload_layers", "recompute_layers", "scale"]
