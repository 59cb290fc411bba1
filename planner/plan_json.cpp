#include "planner/plan_json.hpp"

#include <algorithm>
#include <cmath>

#include "planner/framework_settings.hpp"
#include "sim/policy.hpp"

namespace hbmsim {

namespace {

// What a placement or layer count trades, beside its memory: time recomputing against the wait on host copies.
nlohmann::json with_trades(nlohmann::json row, const StepReport& r) {
  row["recompute_s"] = r.compute_s.at("recompute");
  row["host_copies_exposed_s"] = host_copies_exposed_s(r);
  return row;
}

}  // namespace

std::string placement_label(const RunConfig& c) {
  if (!c.stage_policies.empty()) return "per stage: " + c.stage_policies;
  if (c.tensors.empty() && c.policy != "custom") return c.policy;  // a preset by its name (no_recompute describes no remat)
  std::string out;
  for (auto& x : make_policy(c.policy, c.tensors).describe()) out += (out.empty() ? "" : " ") + x;
  return out.empty() ? "all remat" : out;
}

nlohmann::json largest_batch_json(const std::string& label, const LargestBatch& r) {
  // A whole answer is written as an integer (a fraction only where tp x cp x pp makes one).
  const nlohmann::json batch = r.batch == std::floor(r.batch) ? nlohmann::json(static_cast<std::int64_t>(r.batch)) : nlohmann::json(r.batch);
  nlohmann::json j = {{"variant", label}, {"field", r.field}, {"largest_batch", batch}, {"micro_batch", r.micro_batch},
                      {"stopped", r.stopped}};
  if (const Candidate* t = r.answer()) {
    j["report"] = t->report.to_json();
    j["settings"] = runnable_settings(t->config);
  }
  return j;
}

nlohmann::json policy_search_json(const PolicySearch& r) {
  nlohmann::json j = {{"method", r.method}, {"evaluated", r.evaluated.size()}, {"found", r.found}};
  if (r.found) {
    j["best"] = r.best.report.to_json();
    j["settings"] = runnable_settings(r.best.config);
    j["placement"] = placement_label(r.best.config);
  }
  auto front = nlohmann::json::array();
  for (const auto& c : pareto_front(r.evaluated))
    front.push_back(with_trades({{"placement", placement_label(c.config)}, {"hbm_peak_bytes", c.report.hbm_peak_bytes},
                                 {"tflops_per_device", c.report.tflops_per_device}},
                                c.report));
  j["pareto"] = front;
  return j;
}

nlohmann::json break_even_json(const BreakEven& r, double tolerance) {
  auto curve = nlohmann::json::array();
  for (const auto& [bw, t] : r.curve) curve.push_back({{"host_link_bytes_per_s", bw}, {"tflops_per_device", t}});
  return {{"break_even_bytes_per_s", r.bytes_per_s}, {"reference_tflops", r.reference_tflops}, {"reference", r.reference},
          {"reference_settings", runnable_settings(r.reference_config)}, {"tolerance", tolerance}, {"curve", curve}};
}

nlohmann::json hbm_needed_json(const HbmNeeded& r) {
  return {{"hbm_needed_bytes", r.hbm_bytes}, {"host_needed_bytes", r.host_bytes}, {"hbm_capacity_bytes", r.capacity_bytes},
          {"breakdown", r.report.hbm_breakdown_bytes}, {"step_time_s", r.step_time_s}, {"hbm_fits_from_bytes", r.fits_from_bytes},
          {"step_time_at_fit_s", r.step_time_at_fit_s}, {"hbm_full_speed_from_bytes", r.full_speed_from_bytes}};
}

nlohmann::json layout_search_json(const LayoutSearch& r) {
  auto top = nlohmann::json::array();
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const RunConfig& c = r.top[i].config;
    top.push_back({{"rank", i + 1},
                   {"degrees", {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"vp", c.vp}, {"ep", c.ep}, {"expert_tp", c.expert_tp}, {"fsdp", c.fsdp}, {"dp", c.dp}}},
                   {"sharded_optimizer", c.sharded_optimizer},
                   {"ep_overlap", c.ep_overlap},
                   {"optimizer_offload", c.optimizer_offload},
                   {"parameter_offload", c.parameter_offload},
                   {"policy", layout_policy_label(c)},
                   {"micro_batch", c.micro_batch},
                   {"grad_accum", r.top[i].report.grad_accum},
                   {"limit", r.top[i].limit},
                   {"report", r.top[i].report.to_json()},
                   {"settings", runnable_settings(c)}});
  }
  return {{"global_batch", r.global_batch}, {"candidates", r.candidates}, {"offloaded", r.offloaded}, {"pruned", r.pruned}, {"skipped", r.skipped}, {"refused", r.refused},
          {"simulated", r.simulated}, {"fitting", r.fitting}, {"none_fit", r.none_fit}, {"held", r.held}, {"top", top}};
}

nlohmann::json scale_plan_json(const ScalePlan& r) {
  auto rows = nlohmann::json::array();
  for (const ScaleRow& row : r.rows) {
    rows.push_back({{"gpus", row.gpus}, {"fits", row.fits()}, {"tokens_per_s", row.tokens_per_s()}, {"days", row.days},
                    {"gpu_hours", row.gpu_hours}, {"scaling", row.scaling}, {"search", layout_search_json(row.search)}});
  }
  const ScaleRow* answer = scale_answer(r);
  return {{"system", r.system}, {"global_batch", r.global_batch}, {"seq", r.seq}, {"tokens", r.tokens}, {"days", r.days},
          {"fewest_within_days", r.fewest_within_days}, {"answer_gpus", answer ? answer->gpus : 0}, {"rows", rows}};
}

nlohmann::json layer_count_json(const LayerCountSearch& r) {
  const std::string field = field_name(r.what);
  auto count = [&](const Candidate* t) { return layer_count(t->config, r.what); };
  std::vector<const Candidate*> tried;
  for (const auto& t : r.tried) tried.push_back(&t);
  std::sort(tried.begin(), tried.end(), [&](const Candidate* a, const Candidate* b) { return count(a) < count(b); });
  auto rows = nlohmann::json::array();
  for (const Candidate* t : tried)
    rows.push_back(with_trades({{field, count(t)}, {"hbm_peak_bytes", t->report.hbm_peak_bytes}, {"host_peak_bytes", t->report.host_peak_bytes},
                                {"tokens_per_s_per_device", t->report.tokens_per_s_per_device}, {"fits", t->report.fits}},
                               t->report));
  nlohmann::json j = {{field, r.layers}, {"why", r.why}, {"tried", rows}};
  if (r.layers >= 0) j["settings"] = runnable_settings(r.at(r.layers)->config);
  return j;
}

}  // namespace hbmsim
