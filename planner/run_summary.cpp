#include "planner/run_summary.hpp"

#include <cmath>
#include <numeric>

#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"

namespace hbmsim {

namespace {

// A what-if figure this many times larger or smaller than the system's own is another class of hardware
// or, more often, a unit slip (GB typed for bytes, GB/s for bytes/s). An order of magnitude: today's
// parts span about 3x in HBM per GPU (80-288 GB) and host link per GPU (64-450 GB/s per direction).
constexpr double kWhatIfWarnRatio = 10;

std::string on_off(bool b) { return b ? "on" : "off"; }

std::string number(double v, int digits = 6) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

std::string calibration_text(const System& s) {
  if (s.calibration.empty()) return "datasheet (uncalibrated)";
  return s.calibration + (s.calibration_system.empty() ? " (system it was made on not recorded)"
                                                        : " (fitted on " + s.calibration_system + ")");
}

nlohmann::json resolved_run(const RunConfig& c, const PreparedRun& run) {
  const TrainingSpec& t = run.graph.training;
  const Parallelism& p = t.parallelism;
  nlohmann::json j = {
      {"system", run.system.id},
      {"model", run.graph.model.id},
      {"gpus", t.gpus},
      {"layout", run.graph.mesh.describe()},
      {"degrees", {{"dp", p.dp}, {"pp", p.pp}, {"fsdp", p.fsdp}, {"ep", p.ep}, {"cp", p.cp}, {"tp", p.tp}, {"vp", p.vp}}},
      {"batch_meaning", c.micro_batch > 0 ? "megatron" : "maxtext"},  // which batch fields were given
      {"device_batch", t.device_batch()},
      {"replica_batch", t.replica_batch},
      {"global_batch", t.global_sequences()},
      {"grad_accum", t.grad_accum},
      {"seq", t.seq_len},
      {"policy", c.policy},
      {"framework", c.framework},
      {"grad_reduce_dtype", c.grad_reduce_dtype},
      {"optimizer_moments_dtype", c.optimizer_moments_dtype},
      {"optimizer", c.optimizer},
      {"muon_tp_mode", c.muon_tp_mode},
      {"weights", c.weights},
      {"attention_dtype", c.attention_dtype},
      {"lhs", c.lhs},
      {"pipelined_collectives", c.pipelined_collectives},
      {"pipelined_transfers", c.pipelined_transfers},
      {"double_buffering", c.double_buffering},
      {"hbm_bytes", run.system.gpu.hbm_bytes},
      {"calibration", run.system.calibration},
      {"calibration_system", run.system.calibration_system},
      {"calibration_text", calibration_text(run.system)}};
  if (!run.policy.layer_rules.empty()) j["layer_policies"] = layer_rules_text(run.policy);
  if (!c.tensors.empty()) j["tensors"] = c.tensors;  // the placements given on top of the preset
  if (p.expert_group() > 1) j["moe_dispatcher"] = c.moe_dispatcher;
  // The SMs its kernels hold while they run, where they are modelled (the GPU's count stated).
  if (p.expert_group() > 1 && run.system.gpu.sm_share(p.moe_dispatcher_sms) > 0) {
    j["moe_dispatcher_sms"] = p.moe_dispatcher_sms;
    j["gpu_sms"] = run.system.gpu.sms;
  }
  if (p.experts_fold_tp) {
    j["expert_group"] = p.expert_group();
    j["expert_group_span"] = expert_group_span(p);
  }
  if (c.moe_load_imbalance != 1) j["moe_load_imbalance"] = c.moe_load_imbalance;
  if (c.moe_capacity_factor > 0) j["moe_capacity_factor"] = c.moe_capacity_factor;
  if (c.moe_paged_stash > 0) j["moe_paged_stash"] = c.moe_paged_stash;
  if (p.pp > 1) {
    j["pp_schedule"] = c.pp_schedule;
    j["stage_policies"] = c.stage_policies;
  }
  return j;
}

std::vector<std::string> resolved_run_lines(const nlohmann::json& j) {
  auto s = [&](const char* k) { return j.at(k).get<std::string>(); };
  auto i = [&](const char* k) { return std::to_string(j.at(k).get<std::int64_t>()); };
  std::vector<std::string> lines;
  lines.push_back("run          " + s("model") + " on " + i("gpus") + " x " + s("system") + " GPUs");
  lines.push_back("layout       " + s("layout") +
                  (j.contains("expert_group") ? ", experts whole over " + s("expert_group_span") + " = " + i("expert_group") + " GPUs (expert_tp 1)"
                                              : "") +
                  (j.contains("moe_dispatcher") ? ", MoE dispatcher " + s("moe_dispatcher") : "") +
                  (j.contains("moe_dispatcher_sms") ? " (holding " + i("moe_dispatcher_sms") + " of " + i("gpu_sms") + " SMs)" : "") +
                  (j.contains("moe_load_imbalance") ? ", busiest expert rank " + number(j.at("moe_load_imbalance").get<double>()) + "x the mean tokens" : "") +
                  (j.contains("moe_capacity_factor") ? ", expert buffers for " + number(j.at("moe_capacity_factor").get<double>()) + "x the mean tokens" : "") +
                  (j.contains("moe_paged_stash") ? " (paged stash " + number(j.at("moe_paged_stash").get<double>()) + "x)" : ""));
  const auto& d = j.at("degrees");
  const bool replica_spans_devices = d.at("tp").get<std::int64_t>() * d.at("cp").get<std::int64_t>() * d.at("pp").get<std::int64_t>() > 1;
  // MaxText's per-device batch is per step under pipelining (split into micro-batches), per micro-step otherwise.
  const bool pipelined = d.at("pp").get<std::int64_t>() > 1;
  const double step_batch = j.at("device_batch").get<double>() * (pipelined ? j.at("grad_accum").get<double>() : 1.0);
  const std::string per = s("batch_meaning") == "megatron"
                              ? "micro-batch " + i("replica_batch") + " per model replica"
                          : pipelined ? number(step_batch) + " per device per step, micro-batch " + i("replica_batch") + " per model replica"
                                      : number(step_batch) + " per device" +
                                            (replica_spans_devices ? ", " + i("replica_batch") + " per model replica" : std::string());
  lines.push_back("batch        " + per + ", global " + i("global_batch") + " sequences (" +
                  (pipelined ? i("grad_accum") + " micro-batches" : "grad accum " + i("grad_accum")) + "), seq " + i("seq"));
  std::string policy = "policy       " + s("policy");
  if (j.contains("tensors")) {
    std::string given;
    for (const auto& [name, where] : j.at("tensors").items()) given += (given.empty() ? "" : ", ") + name + "=" + where.get<std::string>();
    policy += " with " + given;
  }
  if (j.contains("pp_schedule")) {
    if (!s("stage_policies").empty()) policy += " (stages: " + s("stage_policies") + ")";
    policy += ", pipeline " + s("pp_schedule");
  }
  if (j.contains("layer_policies")) policy += "; layers " + s("layer_policies");
  const std::string grads = s("grad_reduce_dtype"), moments = s("optimizer_moments_dtype");
  if (s("framework") == "megatron")
    policy += "; Megatron state (bf16 weights, " + grads + " gradients, fp32 master" +
              (moments == "fp32" ? " and moments" : ", " + moments + " moments") +
              (j.value("optimizer", "adam") == "muon" ? "; Muon for the layer matrices)" : ")");
  else if (grads != "fp32" || moments != "fp32")
    policy += "; " + grads + " gradients, " + moments + " moments";
  lines.push_back(policy + "; weights " + s("weights") + ", attention " + s("attention_dtype"));
  const std::string order = s("framework") == "megatron" ? "program order (Megatron)" : "LHS " + on_off(j.at("lhs"));
  lines.push_back("schedule     " + order + ", pipelined collectives " + on_off(j.at("pipelined_collectives")) +
                  ", pipelined transfers " + on_off(j.at("pipelined_transfers")) + ", double buffering " +
                  on_off(j.at("double_buffering")));
  lines.push_back("calibration  " + s("calibration_text"));
  return lines;
}

std::vector<std::string> run_warnings(const RunConfig& c, const PreparedRun& run) {
  std::vector<std::string> w;
  const TrainingSpec& t = run.graph.training;
  const ModelSpec& m = run.graph.model;
  if (m.num_experts > 0 && t.parallelism.expert_group() == 1 && t.gpus > 1)
    w.push_back(m.id + " is a mixture of experts run with ep 1 on " + std::to_string(t.gpus) +
                " GPUs: every GPU runs all " + std::to_string(m.num_experts) + " experts; set ep (up to " +
                std::to_string(std::gcd(m.num_experts, t.gpus)) + ", which divides both the experts and the GPUs)");
  if (!run.system.calibration_system.empty() && run.system.calibration_system != run.system.id)
    w.push_back("calibration " + run.system.calibration + " was fitted on " + run.system.calibration_system +
                " and is applied to " + run.system.id + " as a what-if");
  if (c.framework == "megatron" && !c.lhs)
    w.push_back("lhs = off does not apply to framework megatron: Megatron runs a layer in program order, with no "
                "latency-hiding scheduler to turn off");
  std::optional<System> datasheet;  // the system's own figures, before the what-ifs
  for (const auto& f : what_if_fields()) {
    const auto& value = c.*f.value;
    if (!value) continue;
    if (!datasheet) datasheet = resolve_system(c.system);
    const double own = f.own(*datasheet), ratio = *value / own;
    if (ratio >= 1 / kWhatIfWarnRatio && ratio <= kWhatIfWarnRatio) continue;
    w.push_back(std::string(f.field) + " = " + format_number(*value) + " " + f.unit + " is " + number(ratio, 3) + " x the " +
                datasheet->id + " figure (" + number(own, 3) + " " + f.unit + "); the field is in " + f.unit);
  }
  return w;
}

nlohmann::json ResolvedSimulation::to_json() const {
  auto j = report.to_json();
  j["config"] = config.to_json();
  j["run"] = run;
  j["warnings"] = warnings;
  return j;
}

ResolvedSimulation simulate_resolved(const RunConfig& config, bool trace, bool fast_forward) {
  auto prepared = prepare_run(config);
  prepared.options.record_trace = trace;
  prepared.options.fast_forward = fast_forward;
  ResolvedSimulation r;
  r.config = config;
  r.config.fsdp = prepared.graph.training.parallelism.fsdp;  // the degree the GPUs left, not "0: the rest"
  r.run = resolved_run(config, prepared);
  r.warnings = run_warnings(config, prepared);
  r.report = simulate(prepared.graph, prepared.system, prepared.policy, prepared.options);
  return r;
}

}  // namespace hbmsim
