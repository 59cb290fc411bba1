#include "sim/bounds.hpp"

#include <algorithm>

#include "sim/comm.hpp"
#include "sim/costs.hpp"
#include "sim/layer_plan.hpp"
#include "sim/pipeline_schedule.hpp"

namespace hbmsim {

namespace {

// One micro-batch through a layer: its compute ops' solo seconds forward, and backward with the replays.
struct LayerCompute {
  double forward_s = 0, backward_s = 0;
};

LayerCompute layer_compute(const LayerTemplate& t, const TemplatePlan& p) {
  LayerCompute out;
  for (std::size_t o = 0; o < t.ops.size(); ++o) {
    if (t.ops[o].kind == OpKind::comm) continue;  // on a communication queue, not the compute stream
    out.forward_s += p.fwd_s[o];
    out.backward_s += p.bwd_s[o] + (p.replay[o] ? p.fwd_s[o] : 0);
  }
  return out;
}

}  // namespace

StepBound step_lower_bound(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt) {
  const Network net(sys, g.mesh);
  const Costs costs{sys, net};
  // Plans per (template, policy in use), as the builder makes them.
  std::vector<std::pair<std::pair<int, const Policy*>, LayerCompute>> cache;
  TemplatePlan plan;
  auto compute = [&](std::int64_t l, std::size_t stage) {
    const int t = g.layer_template[static_cast<std::size_t>(l)];
    const Policy* p = &policy.for_layer(l, stage);
    for (const auto& [key, value] : cache)
      if (key.first == t && key.second == p) return value;
    plan_template(g.templates[static_cast<std::size_t>(t)], *p, costs, g, opt, plan);
    cache.push_back({{t, p}, layer_compute(g.templates[static_cast<std::size_t>(t)], plan)});
    return cache.back().second;
  };
  const auto m = static_cast<double>(g.training.grad_accum);
  std::vector<LayerCompute> chunk(g.chunks.size());
  StepBound out;
  out.stage_compute_s.assign(g.stages.size(), 0);
  for (std::size_t k = 0; k < g.chunks.size(); ++k) {
    const PipelineChunk& c = g.chunks[k];
    for (auto l = c.first_layer; l < c.end_layer; ++l) {
      const LayerCompute lc = compute(l, static_cast<std::size_t>(c.stage));
      chunk[k].forward_s += lc.forward_s;
      chunk[k].backward_s += lc.backward_s;
    }
    out.stage_compute_s[static_cast<std::size_t>(c.stage)] += m * (chunk[k].forward_s + chunk[k].backward_s);
  }
  const auto& par = g.training.parallelism;
  const auto tables = pipeline_schedule(par.schedule, static_cast<int>(par.pp), static_cast<int>(par.vp),
                                        static_cast<int>(g.training.grad_accum), opt.ep_overlap);
  // Stage s first runs its first chunk (model chunk s) on micro-batch 0, which needs chunks 0..s-1 done with it.
  double before = 0, after = 0;
  for (std::size_t s = 0; s < g.stages.size(); ++s) {
    const auto& last = tables[s].back();
    const bool ends_with_first_chunk = last.pass == Pass::backward && last.chunk == 0 &&
                                       last.microbatch + 1 == static_cast<int>(g.training.grad_accum);
    out.step_s = std::max(out.step_s, before + out.stage_compute_s[s] + (ends_with_first_chunk ? after : 0));
    before += chunk[s].forward_s;
    after += chunk[s].backward_s;
  }
  return out;
}

}  // namespace hbmsim
