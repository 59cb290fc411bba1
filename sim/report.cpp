#include "sim/report.hpp"

#include <algorithm>

namespace hbmsim {

using sim::MemCategory;

const std::vector<std::string>& report_queues() {
  static const std::vector<std::string> q = {"compute", "fsdp", "ep", "tp", "cp", "dp", "pp", "d2h", "h2d"};
  return q;
}

const std::vector<std::string>& report_phases() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (int c = 0; c < sim::kComputePhases; ++c) v.emplace_back(sim::to_string(static_cast<sim::ComputePhase>(c)));
    return v;
  }();
  return names;
}

namespace {

// The dense peak the compute runs against: every GEMM at the peak of its dtype, attention in bf16, weighted
// by the FLOPs each does (so an fp8 projection raises the denominator as it raises the speed).
double weighted_peak_flops(const StepGraph& g, const System& sys) {
  double flops = 0, seconds = 0;
  for (std::int64_t l = 0; l < g.model.stack_layers(); ++l)
    for (const auto& op : g.layer(l).ops) {
      if (op.kind != OpKind::gemm && op.kind != OpKind::attention && op.kind != OpKind::linear_attention) continue;
      flops += op.flops;
      seconds += op.flops / sys.gpu.peak_flops(op.kind == OpKind::gemm ? op.dtype : Dtype::bf16);
    }
  flops += g.unembed_flops;
  seconds += g.unembed_flops / sys.gpu.peak_flops(Dtype::bf16);
  return seconds > 0 ? flops / seconds : sys.gpu.peak_flops(Dtype::bf16);
}

}  // namespace

namespace {

std::string layer_ranges(const StepGraph& g, const StepGraph::Stage& st) {
  std::string out;
  for (int k : st.chunks) {
    const auto& c = g.chunks[static_cast<std::size_t>(k)];
    if (!out.empty()) out += ",";
    // A chunk without layers holds the embedding (E) or the loss (L), as Megatron's layouts write them.
    // MTP modules follow the decoder layers as "m", one per module.
    const std::int64_t end = std::min(c.end_layer, g.model.num_layers), decoder = end - c.first_layer;
    if (c.layers() == 0) out += c.embedding ? "E" : c.head ? "L" : "none";
    else if (decoder == 1) out += std::to_string(c.first_layer);
    else if (decoder > 1) out += std::to_string(c.first_layer) + "-" + std::to_string(end - 1);
    for (std::int64_t l = std::max(c.first_layer, g.model.num_layers); l < c.end_layer; ++l) out += decoder > 0 || l > c.first_layer ? "+m" : "m";
  }
  return out;
}

StageReport stage_report(const StepGraph& g, const System& sys, const sim::Program& program, const sim::EngineResult& r, int s) {
  StageReport st;
  st.stage = s;
  st.layers = layer_ranges(g, g.stages[static_cast<std::size_t>(s)]);
  const auto& m = r.memory[static_cast<std::size_t>(s)];
  st.hbm_peak_bytes = m.hbm_peak_bytes;
  st.hbm_peak_time_s = m.hbm_peak_time_s;
  st.host_peak_bytes = m.host_peak_bytes;
  for (int c = 0; c < sim::kMemCategories; ++c)
    st.hbm_breakdown_bytes[sim::to_string(static_cast<MemCategory>(c))] = m.hbm_at_peak[static_cast<std::size_t>(c)];
  for (const auto& q : report_queues()) {
    st.busy_s[q] = 0;
    st.comm_bytes[q] = 0;
    if (q != "compute") st.exposed_s[q] = 0;
  }
  for (std::size_t q = 0; q < program.queues.size(); ++q) {
    const auto& queue = program.queues[q];
    if (queue.device != s || queue.marks) continue;  // program points, not work
    st.busy_s[queue.name] = r.busy_s[q];
    st.comm_bytes[queue.name] = r.bytes_sent[q];
    if (queue.compute) {
      st.compute_busy_s = r.busy_s[q];
      st.bubble_s = r.end_time_s - r.last_end_s[q];
    } else {
      st.exposed_s[queue.name] = r.exposed_s[q];
    }
  }
  for (const char* q : {"compute", "d2h", "h2d"}) st.comm_bytes.erase(q);
  for (std::size_t c = 0; c < report_phases().size(); ++c) st.compute_s[report_phases()[c]] = r.compute_phase_s[static_cast<std::size_t>(s)][c];
  st.idle_s = r.end_time_s - st.compute_busy_s;
  st.bubble_s += st.exposed_s.at("pp");
  st.fits = st.hbm_peak_bytes <= sys.gpu.hbm_bytes && st.host_peak_bytes <= sys.host_capacity_bytes();
  return st;
}

}  // namespace

StepReport make_report(const StepGraph& g, const System& sys, const std::string& policy, const sim::Program& program,
                       const sim::EngineResult& r) {
  StepReport rep;
  rep.system_id = sys.id;
  rep.model_id = g.model.id;
  rep.policy = policy;
  rep.step_time_s = r.end_time_s;
  rep.model_flops_per_device = g.model_flops.total();
  rep.executed_flops_per_device = r.executed_flops / static_cast<double>(program.devices());
  rep.tflops_per_device = rep.model_flops_per_device / rep.step_time_s / 1e12;
  rep.mfu = rep.model_flops_per_device / rep.step_time_s / weighted_peak_flops(g, sys);
  rep.tokens_per_device_per_step = g.training.tokens_per_device_per_step();
  rep.tokens_per_s_per_device = rep.tokens_per_device_per_step / rep.step_time_s;
  rep.global_batch = g.training.global_sequences();
  rep.grad_accum = g.training.grad_accum;
  rep.mesh = g.mesh.describe();
  rep.hbm_capacity_bytes = sys.gpu.hbm_bytes;
  rep.host_capacity_bytes = sys.host_capacity_bytes();
  for (int s = 0; s < program.devices(); ++s) rep.stages.push_back(stage_report(g, sys, program, r, s));
  // The plan fits if its worst stage does; the memory figures are that stage's, the per-queue ones the mean.
  const StageReport* worst = &rep.stages.front();
  for (const auto& st : rep.stages) {
    if (st.hbm_peak_bytes > worst->hbm_peak_bytes) worst = &st;
    rep.host_peak_bytes = std::max(rep.host_peak_bytes, st.host_peak_bytes);
  }
  rep.hbm_peak_bytes = worst->hbm_peak_bytes;
  rep.hbm_peak_time_s = worst->hbm_peak_time_s;
  rep.hbm_breakdown_bytes = worst->hbm_breakdown_bytes;
  rep.prefetch_limit_bytes = program.hbm_limit_bytes.front();
  const double n = static_cast<double>(rep.stages.size());
  for (const auto& st : rep.stages)
    for (auto [field, mine] : {std::pair{&StageReport::exposed_s, &StepReport::exposed_s},
                               {&StageReport::busy_s, &StepReport::busy_s}, {&StageReport::comm_bytes, &StepReport::comm_bytes},
                               {&StageReport::compute_s, &StepReport::compute_s}})
      for (const auto& [q, v] : st.*field) (rep.*mine)[q] += v / n;
  const std::string where = rep.stages.size() > 1 ? " on stage " + std::to_string(worst->stage) : "";
  if (rep.hbm_peak_bytes > rep.hbm_capacity_bytes) {
    rep.fits = false;
    rep.fits_reason = "HBM peak exceeds capacity" + where;
  } else if (rep.host_peak_bytes > rep.host_capacity_bytes) {
    rep.fits = false;
    rep.fits_reason = "pinned host memory exceeds capacity";
  }
  rep.events = r.events;
  rep.replayed_iterations = r.replayed_iterations;
  rep.ops = program.ops.size();
  return rep;
}

nlohmann::json StepReport::to_json() const {
  nlohmann::json j = {{"system", system_id},
          {"model", model_id},
          {"policy", policy},
          {"mesh", mesh},
          {"step_time_s", step_time_s},
          {"tflops_per_device", tflops_per_device},
          {"model_flops_per_device", model_flops_per_device},
          {"executed_flops_per_device", executed_flops_per_device},
          {"mfu", mfu},
          {"tokens_per_device_per_step", tokens_per_device_per_step},
          {"tokens_per_s_per_device", tokens_per_s_per_device},
          {"global_batch", global_batch},
          {"grad_accum", grad_accum},
          {"fits", fits},
          {"fits_reason", fits_reason},
          {"hbm_peak_bytes", hbm_peak_bytes},
          {"hbm_peak_time_s", hbm_peak_time_s},
          {"hbm_capacity_bytes", hbm_capacity_bytes},
          {"prefetch_limit_bytes", prefetch_limit_bytes},
          {"hbm_breakdown_bytes", hbm_breakdown_bytes},
          {"host_peak_bytes", host_peak_bytes},
          {"host_capacity_bytes", host_capacity_bytes},
          {"exposed_s", exposed_s},
          {"busy_s", busy_s},
          {"comm_bytes", comm_bytes},
          {"compute_s", compute_s},
          {"events", events},
          {"replayed_iterations", replayed_iterations},
          {"ops", ops}};
  if (stages.size() > 1) {
    j["stages"] = nlohmann::json::array();
    for (const auto& st : stages) j["stages"].push_back(st.to_json());
  }
  if (!stages.empty() && !stages.front().peak_buffers.empty()) {
    j["peak_buffers"] = nlohmann::json::array();
    for (const auto& st : stages) {
      auto buffers = nlohmann::json::array();
      for (const auto& b : st.peak_buffers)
        buffers.push_back({{"made_by", b.made_by}, {"category", b.category}, {"bytes", b.bytes}, {"alloc_s", b.alloc_s}, {"free_s", b.free_s}});
      j["peak_buffers"].push_back({{"stage", st.stage}, {"buffers", std::move(buffers)}});
    }
  }
  return j;
}

nlohmann::json StageReport::to_json() const {
  return {{"stage", stage},
          {"layers", layers},
          {"hbm_peak_bytes", hbm_peak_bytes},
          {"hbm_peak_time_s", hbm_peak_time_s},
          {"hbm_breakdown_bytes", hbm_breakdown_bytes},
          {"host_peak_bytes", host_peak_bytes},
          {"compute_busy_s", compute_busy_s},
          {"compute_s", compute_s},
          {"idle_s", idle_s},
          {"bubble_s", bubble_s},
          {"exposed_s", exposed_s},
          {"busy_s", busy_s},
          {"comm_bytes", comm_bytes},
          {"fits", fits}};
}

}  // namespace hbmsim
