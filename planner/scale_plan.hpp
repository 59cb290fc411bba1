// `plan scale`: the fastest layout at each of several GPU counts, at one global batch, and what a token budget
// takes at each (days, GPU-hours): how many GPUs a run needs, asked before a rack is booked. Each count is a
// `plan layout` search (its winner only), so the rows are exactly what `plan layout --gpus N` ranks first.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/layout_search.hpp"

namespace hbmsim {

struct ScaleRow {
  std::int64_t gpus = 0;
  LayoutSearch search;  // search.top: the fastest layout (empty when none fits; search.none_fit says why)
  // With a budget: tokens / (tokens/s per GPU x gpus) in days, and gpus x those hours; 0 without one or a layout.
  double days = 0, gpu_hours = 0;
  // Tokens/s per GPU over that of the fewest GPUs that fit (1 there; 0 where nothing fits).
  double scaling = 0;
  bool fits() const { return !search.top.empty(); }
  // Tokens/s over all its GPUs (0 where nothing fits).
  double tokens_per_s() const { return fits() ? search.top.front().report.tokens_per_s_per_device * static_cast<double>(gpus) : 0; }
};

struct ScalePlanOptions {
  std::vector<std::int64_t> gpu_counts;  // each >= 1, none twice; searched in this order, reported ascending
  double tokens = 0;  // the training budget in tokens (0: none, so no days or GPU-hours)
  double days = 0;    // > 0 (with tokens): the deadline the fewest-GPU answer must meet
  // The search at each count: its policies, micro-batches, held degrees, jobs and state offload (its top is 1:
  // only the winner is kept, which prunes hardest). Its progress is called per count as done, total.
  LayoutSearchOptions search;
  // Called before each count's search: the count, its index and how many there are.
  std::function<void(std::int64_t, std::size_t, std::size_t)> on_count;
  // Called with each count's row as its search ends (its days and scaling not yet set): a long plan shows what
  // it has found so far.
  std::function<void(const ScaleRow&)> on_row;
};

struct ScalePlan {
  std::string system;             // the config's (a built-in id or a file)
  std::int64_t global_batch = 0;  // sequences per step, the same at every count
  std::int64_t seq = 0;
  double tokens = 0, days = 0;    // the budget and deadline asked (0: none)
  std::vector<ScaleRow> rows;     // by GPU count, ascending
  // The fewest GPUs whose run meets the deadline (-1: none does; 0: no deadline asked).
  std::int64_t fewest_within_days = 0;
};

// Refuses options no plan can use: no count, a count below 1 or twice, a budget or deadline that is negative or
// not finite, a deadline without a budget, and the layout search's own refusals (at every count, so a held
// degree that does not divide one of them is named with it). Messages start "field = value".
void check_scale_options(const RunConfig& base, const ScalePlanOptions& options);
// The global batch a scale plan holds at every count when the config gives none: one sequence per GPU at the
// largest count.
std::int64_t scale_global_batch(const RunConfig& base, const std::vector<std::int64_t>& gpu_counts);
ScalePlan plan_scale(const RunConfig& base, const ScalePlanOptions& options);
// The row that answers a plan when plans are compared (one per system): with a deadline, the fewest GPUs that meet
// it; without one, the count with the most tokens/s in all (the fewer GPUs on a tie). nullptr: nothing fits, or no
// count meets the deadline.
const ScaleRow* scale_answer(const ScalePlan& plan);
// Prices a plan's rows for a budget of `tokens` (0: none) and a deadline of `days` (0: none): each row's days,
// GPU-hours and scaling, and the plan's fewest GPUs within the deadline (plan_scale calls it).
void price_scale_plan(ScalePlan& plan, double tokens, double days);

}  // namespace hbmsim
