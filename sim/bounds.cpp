#include "sim/bounds.hpp"

#include <algorithm>
#include <utility>

#include "sim/comm.hpp"
#include "sim/costs.hpp"
#include "sim/layer_plan.hpp"
#include "sim/pipeline_schedule.hpp"

namespace hbmsim {

namespace {

// One micro-batch through a layer: its compute ops' solo seconds forward, and backward with the replays; and the
// compute stream's solo waits for the collectives that hold it.
struct LayerCompute {
  double forward_s = 0, backward_s = 0;
  double forward_wait_s = 0, backward_wait_s = 0;
};

LayerCompute layer_compute(const LayerTemplate& t, const TemplatePlan& p, const SimOptions& opt, double tp) {
  LayerCompute out;
  for (std::size_t o = 0; o < t.ops.size(); ++o) {
    if (t.ops[o].kind == OpKind::comm) continue;  // on a communication queue, not the compute stream
    out.forward_s += p.fwd_s[o];
    out.backward_s += p.bwd_s[o] + (p.replay[o] ? p.fwd_s[o] : 0);
  }
  // Combined 1F1B runs two micro-batches' passes on one stream: its collectives are left out.
  if (opt.ep_overlap) return out;
  auto solo = [&](const CommDef& c, CommKind kind, const CommCost& cost) {
    return cost.seconds * (userbuffer_overlapped(c, kind, opt) ? 1 / tp : 1.0);
  };
  // A blocking collective holds the compute stream for at least its solo time: it starts after the compute
  // before it and after the blocking collective issued before it (the builder chains them), and the compute
  // after waits for it (no layer ends in one: the builder refuses that).
  for (int oi : p.order) {  // the forward's issue order, as the builder emits it
    const auto o = static_cast<std::size_t>(oi);
    const OpDef& def = t.ops[o];
    if (def.kind == OpKind::comm && def.comm.forward != CommKind::none && blocks_compute(def.comm, false, opt))
      out.forward_wait_s += solo(def.comm, def.comm.forward, p.fwd_comm[o]);
  }
  for (const TemplatePlan::Step& st : p.steps) {  // one backward iteration, replays included
    const OpDef& def = t.ops[st.op];
    const bool replay = st.kind == TemplatePlan::Kind::replay;
    const CommKind kind = def.comm.kind(!replay);
    if (def.kind == OpKind::comm && kind != CommKind::none && blocks_compute(def.comm, !replay, opt))
      out.backward_wait_s += solo(def.comm, kind, replay ? p.fwd_comm[st.op] : p.bwd_comm[st.op]);
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
    cache.push_back({{t, p}, layer_compute(g.templates[static_cast<std::size_t>(t)], plan, opt, static_cast<double>(g.mesh.size(Axis::tp)))});
    return cache.back().second;
  };
  const auto m = static_cast<double>(g.training.grad_accum);
  // Per chunk, one micro-batch's forward and backward on its stage's compute stream: compute and waits.
  std::vector<LayerCompute> chunk(g.chunks.size());
  StepBound out;
  out.stage_compute_s.assign(g.stages.size(), 0);
  out.stage_wait_s.assign(g.stages.size(), 0);
  for (std::size_t k = 0; k < g.chunks.size(); ++k) {
    const PipelineChunk& c = g.chunks[k];
    for (auto l = c.first_layer; l < c.end_layer; ++l) {
      const LayerCompute lc = compute(l, static_cast<std::size_t>(c.stage));
      chunk[k].forward_s += lc.forward_s;
      chunk[k].backward_s += lc.backward_s;
      chunk[k].forward_wait_s += lc.forward_wait_s;
      chunk[k].backward_wait_s += lc.backward_wait_s;
      out.stage_compute_s[static_cast<std::size_t>(c.stage)] += m * (lc.forward_s + lc.backward_s);
      out.stage_wait_s[static_cast<std::size_t>(c.stage)] += m * (lc.forward_wait_s + lc.backward_wait_s);
    }
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
    out.step_s = std::max(out.step_s, before + out.stage_compute_s[s] + out.stage_wait_s[s] + (ends_with_first_chunk ? after : 0));
    before += chunk[s].forward_s + chunk[s].forward_wait_s;
    after += chunk[s].backward_s + chunk[s].backward_wait_s;
  }
  return out;
}

}  // namespace hbmsim
