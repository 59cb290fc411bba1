#include "planner/scale_plan.hpp"

#include <algorithm>
#include <cmath>

namespace hbmsim {

namespace {

constexpr double kSecondsPerDay = 86400;

RunConfig at_count(RunConfig c, std::int64_t gpus, std::int64_t global_batch) {
  c.gpus = gpus;
  c.global_batch = global_batch;
  return c;
}

void check_budget(const char* field, double value) {
  if (!std::isfinite(value) || value < 0) throw InputError(std::string(field) + " = " + format_number(value) + " (must be a finite number, at least 0)");
}

}  // namespace

std::int64_t scale_global_batch(const RunConfig& base, const std::vector<std::int64_t>& gpu_counts) {
  if (base.global_batch > 0) return base.global_batch;
  return gpu_counts.empty() ? base.gpus : *std::max_element(gpu_counts.begin(), gpu_counts.end());
}

void check_scale_options(const RunConfig& base, const ScalePlanOptions& o) {
  if (o.gpu_counts.empty()) throw InputError("gpus = [] (give the GPU counts to compare)");
  for (std::int64_t n : o.gpu_counts)
    if (n < 1) throw InputError("gpus = " + str(n) + " (a GPU count must be at least 1)");
  if (auto twice = first_repeat(o.gpu_counts); twice != o.gpu_counts.end())
    throw InputError("gpus = " + str(*twice) + " (given twice)");
  check_budget("tokens", o.tokens);
  check_budget("days", o.days);
  if (o.days > 0 && o.tokens <= 0) throw InputError("days = " + format_number(o.days) + " (a deadline needs a token budget)");
  check_layout_options(o.search);
  const std::int64_t g = scale_global_batch(base, o.gpu_counts);
  for (std::int64_t n : o.gpu_counts) {
    try {
      check_held_layout(at_count(base, n, g), o.search);
    } catch (const InputError& e) {  // which count it is
      throw InputError(std::string(e.what()) + " at " + str(n) + " GPUs");
    }
  }
}

ScalePlan plan_scale(const RunConfig& base, const ScalePlanOptions& o) {
  check_scale_options(base, o);
  ScalePlan out;
  out.system = base.system;
  out.global_batch = scale_global_batch(base, o.gpu_counts);
  out.seq = base.seq;
  std::vector<std::int64_t> counts = o.gpu_counts;
  std::sort(counts.begin(), counts.end());
  LayoutSearchOptions search = o.search;
  search.top = 1;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (o.on_count) o.on_count(counts[i], i, counts.size());
    ScaleRow row;
    row.gpus = counts[i];
    row.search = search_layouts(at_count(base, counts[i], out.global_batch), search);
    if (o.on_row) o.on_row(row);
    out.rows.push_back(std::move(row));
  }
  price_scale_plan(out, o.tokens, o.days);
  return out;
}

void price_scale_plan(ScalePlan& plan, double tokens, double days) {
  plan.tokens = tokens;
  plan.days = days;
  const ScaleRow* first = nullptr;
  for (ScaleRow& row : plan.rows) {
    row.days = row.gpu_hours = row.scaling = 0;
    if (!row.fits()) continue;
    const double per_gpu = row.search.top.front().report.tokens_per_s_per_device;
    if (!first) first = &row;
    row.scaling = per_gpu / first->search.top.front().report.tokens_per_s_per_device;
    if (tokens <= 0 || !(per_gpu > 0)) continue;
    const double seconds = tokens / (per_gpu * static_cast<double>(row.gpus));
    row.days = seconds / kSecondsPerDay;
    row.gpu_hours = seconds / 3600 * static_cast<double>(row.gpus);
  }
  plan.fewest_within_days = 0;
  if (days <= 0) return;
  plan.fewest_within_days = -1;
  for (const ScaleRow& row : plan.rows)
    if (row.fits() && row.days <= days) {
      plan.fewest_within_days = row.gpus;
      return;
    }
}

const ScaleRow* scale_answer(const ScalePlan& plan) {
  const ScaleRow* best = nullptr;
  for (const ScaleRow& row : plan.rows) {
    if (plan.days > 0 ? row.gpus == plan.fewest_within_days : row.fits() && (!best || row.tokens_per_s() > best->tokens_per_s())) best = &row;
  }
  return best;
}

}  // namespace hbmsim
