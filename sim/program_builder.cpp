#include "sim/program_builder.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "hwmodels/json_view.hpp"
#include "sim/stage_builder.hpp"

namespace hbmsim {

namespace build {
namespace {

// The whole step: each layer template planned once per policy in use, every stage built, the pipeline's
// crossings joined.
class ProgramBuilder {
 public:
  ProgramBuilder(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                 std::vector<std::string>* names, Program& out)
      : g_(g), sys_(sys), opt_(opt), net_(sys, g.mesh), costs_{sys, net_}, prog_(out), names_(names) {
    thread_queue_of().clear();
    reserve();
    // One plan per layer template and policy in use: each stage's, then each layer rule's. A device's LHS
    // headroom covers every plan its layers use (its stage's policy always counts, so that an even run
    // keeps the headroom of all templates).
    const std::size_t T = g.templates.size(), L = g.layer_template.size();
    std::vector<const Policy*> used;
    auto variant = [&](const Policy* p) {
      auto it = std::find(used.begin(), used.end(), p);
      if (it != used.end()) return static_cast<std::size_t>(it - used.begin());
      used.push_back(p);
      return used.size() - 1;
    };
    for (std::size_t s = 1; s < g.stages.size(); ++s) prog_.add_device();
    std::vector<std::vector<std::size_t>> device_variants(g.stages.size());
    for (std::size_t s = 0; s < g.stages.size(); ++s) device_variants[s].push_back(variant(&policy.for_stage(s)));
    layer_plan_.resize(L);
    for (const PipelineChunk& c : g.chunks)
      for (auto l = c.first_layer; l < c.end_layer; ++l) {
        const std::size_t v = variant(&policy.for_layer(l, static_cast<std::size_t>(c.stage)));
        auto& dv = device_variants[static_cast<std::size_t>(c.stage)];
        if (std::find(dv.begin(), dv.end(), v) == dv.end()) dv.push_back(v);
        layer_plan_[static_cast<std::size_t>(l)] = v * T + static_cast<std::size_t>(g.layer_template[static_cast<std::size_t>(l)]);
      }
    plans_.resize(used.size() * T);
    for (std::size_t v = 0; v < used.size(); ++v)
      for (std::size_t i = 0; i < T; ++i) plan_template(g.templates[i], *used[v], costs_, g, opt, plans_[v * T + i]);
    double grad = 0;  // the headroom holds an iteration's own gradients; the reserve the earlier layers'
    for (std::size_t i = 0; i < T; ++i) grad = std::max(grad, g.grad_buffer_bytes(g.templates[i]));
    for (std::size_t d = 0; d < g.stages.size(); ++d) {
      double headroom = 0;
      for (std::size_t v : device_variants[d])
        for (std::size_t i = 0; i < T; ++i) headroom = std::max(headroom, plans_[v * T + i].backward_working_set_bytes);
      prog_.hbm_limit_bytes[d] = opt.memory_limit_slop * sys.gpu.hbm_bytes - headroom;
      prog_.scatter_reserve_bytes[d] = opt.reduce_scatter_lag() * grad;
    }
    prog_.copy_interference = sys.efficiency.compute_slowdown_during_copy;
    prog_.comm_sm_share = sys.gpu.sm_share(g.training.parallelism.moe_dispatcher_sms);
    plan_loop_bodies();
  }

  void build() {
    const auto V = g_.chunks.size();
    const auto m = static_cast<std::size_t>(g_.training.grad_accum);
    forward_in_.assign(m * V, Crossing{});
    backward_in_.assign(m * V, Crossing{});
    // The buffers a crossing lands in, on the receiving stage: activations going forward, gradients back.
    const double bytes = boundary_bytes(g_);
    for (std::size_t mb = 0; mb < m; ++mb)
      for (std::size_t k = 0; k < V; ++k) {
        if (k >= 1) forward_in_[mb * V + k].buf = prog_.add_buffer(bytes, MemCategory::saved_activations, false, g_.chunks[k].stage);
        if (k + 1 < V) backward_in_[mb * V + k].buf = prog_.add_buffer(bytes, MemCategory::workspace, false, g_.chunks[k].stage);
      }
    const auto& par = g_.training.parallelism;
    const auto tables = pipeline_schedule(par.schedule, static_cast<int>(par.pp), static_cast<int>(par.vp),
                                          static_cast<int>(g_.training.grad_accum), opt_.ep_overlap);
    BuildContext ctx{g_, sys_, opt_, net_, costs_, plans_, layer_plan_, fwd_body_end_, bwd_body_first_, forward_in_, backward_in_, names_};
    std::vector<std::vector<sim::PassSpan>> passes(g_.stages.size());
    for (std::size_t s = 0; s < g_.stages.size(); ++s) passes[s] = StageBuilder(ctx, prog_, static_cast<int>(s)).build(tables[s]);
    // Each stage's passes were written without the others: join every receive to its send, and every send
    // to the receiver's posting of it.
    for (auto* crossings : {&forward_in_, &backward_in_})
      for (const Crossing& c : *crossings) {
        if (c.recv >= 0) prog_.ops[static_cast<std::size_t>(c.recv)].deps.push_back(c.send);
        if (c.posted >= 0) prog_.ops[static_cast<std::size_t>(c.send)].deps.push_back(c.posted);
      }
    if (opt_.ep_overlap) combine_passes(passes);
  }

 private:
  // Combined 1F1B: each device's adjacent forward and backward passes issued layer by layer together. The
  // layer iterations' marks are dropped (the fast-forward compares queue positions in program order); the
  // engine checks the order before it runs it.
  void combine_passes(const std::vector<std::vector<sim::PassSpan>>& passes) {
    prog_.issue_order.resize(prog_.ops.size());
    for (std::size_t i = 0; i < prog_.ops.size(); ++i) prog_.issue_order[i] = static_cast<int>(i);
    for (std::size_t s = 0; s < passes.size(); ++s) sim::merge_passes(prog_, static_cast<int>(s), passes[s], prog_.issue_order);
    prog_.iterations.clear();
  }

  // Event budget (max_ops): a step larger than it would take seconds and gigabytes; refuse it up front. The op list
  // is reserved at an upper bound so that a thread's first step does not relocate it halfway.
  void reserve() {
    std::size_t ops_estimate = 0, ops_bound = 0;
    for (std::int64_t l = 0; l < g_.model.stack_layers(); ++l) {
      ops_estimate += 3 * g_.layer(l).ops.size() + 8;
      ops_bound += 5 * g_.layer(l).ops.size() + 3 * g_.layer(l).tensors.size() + 10;
    }
    const double total_ops = static_cast<double>(ops_estimate) * static_cast<double>(g_.training.grad_accum);
    if (total_ops > static_cast<double>(opt_.max_ops))
      throw InputError("layers x grad_accum = " + std::to_string(g_.model.stack_layers()) + " x " +
                       std::to_string(g_.training.grad_accum) + " (the step would need about " +
                       std::to_string(static_cast<long long>(total_ops)) + " simulated ops; the budget, max_ops, is " +
                       std::to_string(opt_.max_ops) + ")");
    const std::size_t stages = g_.stages.size();
    prog_.ops.reserve(ops_bound * static_cast<std::size_t>(g_.training.grad_accum) + 32 * stages);
    prog_.buffers.reserve(ops_bound * static_cast<std::size_t>(g_.training.grad_accum) + 32 * stages);
  }

  // With while-loop double buffering a scan body holds two consecutive layers of the same template (in
  // the order the loop runs them; a body never spans two scans), so LHS may move a transfer across the
  // first layer's iteration boundary (compute is not reordered across the two layers here). Without LHS
  // nothing moves it. Per layer: the layer after its forward body, and the first layer of its backward body
  // (the backward runs the layers in reverse). A scan is a run of layers with one plan (template and
  // policy) in one chunk.
  void plan_loop_bodies() {
    const auto L = static_cast<std::size_t>(g_.model.stack_layers());
    fwd_body_end_.resize(L);
    bwd_body_first_.resize(L);
    const std::size_t len = opt_.double_buffering && opt_.lhs ? 2 : 1;
    for (const PipelineChunk& c : g_.chunks) {
      const auto chunk_end = static_cast<std::size_t>(c.end_layer);
      for (auto first = static_cast<std::size_t>(c.first_layer); first < chunk_end;) {
        std::size_t end = first;
        while (end < chunk_end && layer_plan_[end] == layer_plan_[first]) ++end;
        for (std::size_t l = first; l < end; ++l) {
          fwd_body_end_[l] = std::min(first + (l - first) / len * len + len, end);
          bwd_body_first_[l] = end - 1 - (end - 1 - l) / len * len;
        }
        first = end;
      }
    }
  }

  const StepGraph& g_;
  const System& sys_;
  SimOptions opt_;
  Network net_;
  Costs costs_;
  Program& prog_;
  std::vector<std::string>* names_;
  std::vector<TemplatePlan>& plans_ = thread_scratch().plans;  // per (policy in use, layer template)
  std::vector<std::size_t>& layer_plan_ = thread_scratch().layer_plan;  // per layer: index into plans_
  std::vector<std::size_t> fwd_body_end_, bwd_body_first_;    // plan_loop_bodies()
  std::vector<Crossing> forward_in_, backward_in_;
};

}  // namespace
}  // namespace build

void build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                   std::vector<std::string>* op_names, sim::Program& out) {
  out.clear();
  build::ProgramBuilder(g, sys, policy, opt, op_names, out).build();
}

sim::Program build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                           std::vector<std::string>* op_names) {
  sim::Program p;
  build_program(g, sys, policy, opt, op_names, p);
  return p;
}

}  // namespace hbmsim
