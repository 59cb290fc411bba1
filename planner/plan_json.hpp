// The plan answers as JSON, one form for every front end (`plan ... --json` and the Python plan functions).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/layout_search.hpp"
#include "planner/layer_counts.hpp"
#include "planner/plan.hpp"
#include "planner/scale_plan.hpp"

namespace hbmsim {

// "mlpwi_0=offload query_proj=device", "per stage: ...", or "all remat".
std::string placement_label(const RunConfig& config);

// One variant's largest batch: {variant, largest_batch, stopped, report, settings} (report and settings at
// that batch, absent when none fits).
nlohmann::json largest_batch_json(const std::string& label, const LargestBatch& r);
// {method, evaluated, found, best, settings, pareto: [{placement, hbm_peak_bytes, tflops_per_device}]}.
nlohmann::json policy_search_json(const PolicySearch& r);
nlohmann::json break_even_json(const BreakEven& r, double tolerance);
nlohmann::json hbm_needed_json(const HbmNeeded& r);
// {global_batch, candidates, pruned, refused, simulated, fitting, none_fit, top: [{rank, degrees, policy,
// micro_batch, grad_accum, limit, report, settings}]}.
nlohmann::json layout_search_json(const LayoutSearch& r);
// {global_batch, seq, tokens, days, fewest_within_days, rows: [{gpus, fits, tokens_per_s (all GPUs), days,
// gpu_hours, scaling, search (layout_search_json with its winner as top)}]}.
nlohmann::json scale_plan_json(const ScalePlan& r);
// {FIELD (offload_layers or recompute_layers; -1: none fits), why, tried: [{FIELD, hbm_peak_bytes,
// host_peak_bytes, tokens_per_s_per_device, fits}] by count, settings (at the answer)}.
nlohmann::json layer_count_json(const LayerCountSearch& r);

}  // namespace hbmsim
