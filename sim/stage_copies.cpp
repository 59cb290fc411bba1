// Layer iterations copied rather than built (sim/instances.hpp): what an iteration reads and leaves, and
// the copy from the pass's earlier iterations or the same layer in the chunk's earlier passes
// (sim/stage_builder.hpp).
#include "sim/stage_builder.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace hbmsim::build {

bool StageBuilder::same_plan_back(std::int64_t first, std::int64_t i, std::int64_t n, int dir) const {
  const std::int64_t back = dir > 0 ? i : n - 1 - i;  // iterations before this one
  if (back < 3) return false;
  for (std::int64_t k = 1; k <= std::min<std::int64_t>(6, back); ++k)
    if (c_.layer_plan[at(first + i - dir * k)] != c_.layer_plan[at(first + i)]) return false;
  return true;
}

int StageBuilder::copy_period(std::int64_t first, std::int64_t i, std::int64_t n, int dir) const {
  if (same_plan_back(first, i, n, dir)) return 0;
  const std::int64_t back = dir > 0 ? i : n - 1 - i;
  auto plan_at = [&](std::int64_t x) { return c_.layer_plan[at(first + x)]; };
  for (std::int64_t P = 2; P <= sim::kMaxPeriod && back >= 3 * P; ++P) {
    bool periodic = true;
    // From the layer one ahead (the backward gathers its weights) to six back, each has the plan P before it.
    for (std::int64_t j = -1; j <= 6 && periodic; ++j) {
      const std::int64_t x = i - dir * j, y = x - dir * P;
      if (x < 0 || x >= n) continue;
      periodic = y >= 0 && y < n && plan_at(x) == plan_at(y);
    }
    if (periodic) return static_cast<int>(P);
  }
  return -1;
}

void StageBuilder::start_across() {
  if (!across_worthwhile()) return;
  auto& loops = scratch_.across;
  loops.resize(info_.chunks.size() * 2 * most_chunk_layers());
  for (auto& l : loops) l.start(static_cast<int>(g_.training.grad_accum));
}

sim::LoopInstances* StageBuilder::across_passes(int slot, int direction, std::int64_t i) {
  if (!across_worthwhile()) return nullptr;
  const std::size_t at_slot = static_cast<std::size_t>(slot) * 2 + static_cast<std::size_t>(direction);
  return &scratch_.across[at_slot * most_chunk_layers() + at(i)];
}

void StageBuilder::finish_iteration(sim::LoopInstances& loop, int i, sim::LoopInstances* across, int mb, const sim::Span& span) {
  if (across) {
    scratch_.kept_inputs = scratch_.inputs;
    scratch_.kept_left = scratch_.left;
    across->finish(mb, span, scratch_.kept_inputs, scratch_.kept_left);
  }
  loop.finish(i, span, scratch_.inputs, scratch_.left);
}

bool StageBuilder::copy_iteration(int within, int i, sim::LoopInstances* across, int mb) {
  auto from = [&](sim::LoopInstances& loop, int at, int only) {
    const int period = loop.period(prog_, at, scratch_.inputs, only);
    return period > 0 && loop.copy(prog_, at, period, scratch_.left);
  };
  return (within >= 0 && from(scratch_.loop, i, within)) || (across && from(*across, mb, 0));
}

void StageBuilder::forward_inputs(std::int64_t first, std::int64_t i, int input_buf, const std::vector<ForwardLayer>& fwd,
                                const std::vector<std::vector<int>>& barrier, int sync, int previous_pass, std::int64_t waits_on,
                                std::int64_t frees) {
  auto& in = scratch_.inputs;
  in.clear();
  if (!copying()) return;
  const std::int64_t lag = opt_.pipelined_collectives ? 2 : 1;
  // Where its copies are due (the loop body's end) matters only to a layer that offloads on XLA's schedule.
  const bool offloads = offloads_any(first + i) && !opt_.te_offload;
  const std::size_t done_by = opt_.lhs && opt_.pipelined_transfers ? at(i + 2) : c_.fwd_body_end[at(first + i)] - at(first);
  in.assign({input_buf, sync, previous_pass, i >= lag, i >= lag ? fwd[at(i - lag)].last : previous_pass,
             offloads ? static_cast<int>(done_by) - static_cast<int>(i) : 0, w_.last_compute(),
             static_cast<int>(barrier[at(i)].size())});
  in.insert(in.end(), barrier[at(i)].begin(), barrier[at(i)].end());
  // TE: the earlier layers' copies it waits for and the device copies it frees.
  in.push_back(waits_on >= 0);
  if (waits_on >= 0) in.insert(in.end(), fwd[at(waits_on)].d2h.begin(), fwd[at(waits_on)].d2h.end());
  in.push_back(frees >= 0);
  if (frees >= 0)
    for (const auto* v : {&fwd[at(frees)].d2h, &fwd[at(frees)].buf}) in.insert(in.end(), v->begin(), v->end());
}

void StageBuilder::forward_left(std::int64_t i, const std::vector<ForwardLayer>& fwd, const std::vector<std::vector<int>>& barrier,
                              const std::array<std::size_t, 2>& had) {
  auto& left = scratch_.left;
  left.clear();
  if (!copying()) return;
  const ForwardLayer& st = fwd[at(i)];
  left.assign({st.last, st.output_buf, w_.last_compute()});
  for (const auto* v : {&st.buf, &st.host_buf, &st.d2h}) left.insert(left.end(), v->begin(), v->end());
  for (std::size_t o = 0; o < 2; ++o) {
    const auto& b = barrier[at(i) + 1 + o];
    left.push_back(static_cast<int>(b.size() - had[o]));
    left.insert(left.end(), b.begin() + static_cast<std::ptrdiff_t>(had[o]), b.end());
  }
}

bool StageBuilder::copied_forward(std::int64_t first, std::int64_t i, std::vector<ForwardLayer>& fwd,
                                  std::vector<std::vector<int>>& barrier, sim::LoopInstances* across, int mb) {
  if (!copying()) return false;
  const int begin = w_.ops();
  if (!copy_iteration(copy_period(first, i, static_cast<std::int64_t>(fwd.size()), 1), static_cast<int>(i), across, mb))
    return false;
  const auto& left = scratch_.left;
  ForwardLayer& st = fwd[at(i)];
  const std::size_t nt = g_.layer(first + i).tensors.size();
  auto it = left.begin();
  st.last = *it++;
  st.output_buf = *it++;
  const int last_compute = *it++;
  for (auto* v : {&st.buf, &st.host_buf, &st.d2h}) {
    v->assign(it, it + static_cast<std::ptrdiff_t>(nt));
    it += static_cast<std::ptrdiff_t>(nt);
  }
  for (std::size_t o = 0; o < 2; ++o)
    for (int count = *it++; count > 0; --count) barrier[at(i) + 1 + o].push_back(*it++);
  w_.adopt(begin, last_compute);
  return true;
}

void StageBuilder::backward_inputs(std::int64_t first, std::int64_t i, const ChunkRecord& rec, const std::vector<BackwardLayer>& bwd,
                                 int grad_in, int backward_start, bool last_microbatch, const std::vector<std::int64_t>& reloaded,
                                 const std::vector<Scatter>& carried) {
  auto& in = scratch_.inputs;
  in.clear();
  if (!copying()) return;
  const std::int64_t n = static_cast<std::int64_t>(bwd.size());
  const bool due = i + reduce_scatter_lag() < n;
  // The loop body's start matters only to prefetches LHS hoists there (offloaded tensors, not pipelined).
  const bool hoists = lhs_copies() && !opt_.pipelined_transfers && offloads_any(first + i);
  const std::int64_t body = hoists ? static_cast<std::int64_t>(c_.bwd_body_first[at(first + i)]) - first : i;
  const BackwardLayer& me = bwd[at(i)];
  in.assign({grad_in, backward_start, w_.last_compute(), i >= 1, i + 1 < n, i + 1 < n ? bwd[at(i + 1)].last : -1,
             me.gather.op, me.gather.buf, me.gather.shard, due, due ? bwd[at(i + reduce_scatter_lag())].reduce_scatter : -1,
             due ? bwd[at(i + reduce_scatter_lag())].grad_buf : -1, static_cast<int>(body - i),
             body != i ? bwd[at(body)].iteration_start : -1, last_microbatch, static_cast<int>(carried.size())});
  for (const Scatter& s : carried) in.insert(in.end(), {s.op, s.buf});
  const ForwardLayer& f = rec.layers[at(i)];
  for (const auto* v : {&f.buf, &f.host_buf, &f.d2h}) in.insert(in.end(), v->begin(), v->end());
  if (!opt_.te_offload) return;
  // TE: the reloads an earlier iteration issued for it, and the copies of the layers it reloads.
  for (const auto* v : {&rec.reload_op[at(i)], &rec.reload_buf[at(i)]}) in.insert(in.end(), v->begin(), v->end());
  in.push_back(static_cast<int>(reloaded.size()));
  for (std::int64_t s : reloaded) {
    in.push_back(static_cast<int>(s));
    const ForwardLayer& src = rec.layers[at(s)];
    for (const auto* v : {&src.host_buf, &src.d2h}) in.insert(in.end(), v->begin(), v->end());
  }
}

void StageBuilder::backward_left(std::int64_t i, const std::vector<BackwardLayer>& bwd, int grad_out, int rs, const std::vector<int>& done,
                               std::size_t had, const ChunkRecord& rec, const std::vector<std::int64_t>& reloaded) {
  auto& left = scratch_.left;
  left.clear();
  if (!copying()) return;
  const BackwardLayer& me = bwd[at(i)];
  const Gather next = i >= 1 ? bwd[at(i - 1)].gather : Gather{};
  left.assign({me.iteration_start, me.last, me.reduce_scatter, me.grad_buf, me.gather.op, me.gather.buf, me.gather.shard, next.op,
               next.buf, next.shard, grad_out, rs, w_.last_compute(), static_cast<int>(done.size() - had)});
  left.insert(left.end(), done.begin() + static_cast<std::ptrdiff_t>(had), done.end());
  // TE: the reloads it issued, per layer reloaded (te_reloaded_by's order).
  for (std::int64_t s : reloaded)
    for (const auto* v : {&rec.reload_op[at(s)], &rec.reload_buf[at(s)]}) left.insert(left.end(), v->begin(), v->end());
}

bool StageBuilder::copied_backward(std::int64_t first, std::int64_t i, int step, std::vector<BackwardLayer>& bwd, int& grad_carry,
                                 std::vector<int>& reduce_scatter, std::vector<int>& done, sim::LoopInstances* across, int mb,
                                 ChunkRecord& rec, const std::vector<std::int64_t>& reloaded) {
  if (!copying()) return false;
  // With pipelined collectives it also gathers the next layer's weights: that layer's plan too (the same
  // layer in another pass gathers the same one).
  int within = copy_period(first, i, static_cast<std::int64_t>(bwd.size()), -1);
  if (within == 0 && i >= 1 && c_.layer_plan[at(first + i - 1)] != c_.layer_plan[at(first + i)]) within = -1;
  const int begin = w_.ops();
  if (!copy_iteration(within, step, across, mb)) return false;
  const auto& left = scratch_.left;
  BackwardLayer& me = bwd[at(i)];
  auto it = left.begin();
  me.iteration_start = *it++;
  me.last = *it++;
  me.reduce_scatter = *it++;
  me.grad_buf = *it++;
  me.gather.op = *it++;
  me.gather.buf = *it++;
  me.gather.shard = *it++;
  const Gather next{*it++, *it++, *it++};
  if (i >= 1) bwd[at(i - 1)].gather = next;
  grad_carry = *it++;
  reduce_scatter[at(i)] = *it++;
  const int last_compute = *it++;
  for (int count = *it++; count > 0; --count) done.push_back(*it++);
  for (std::int64_t s : reloaded)
    for (auto* v : {&rec.reload_op[at(s)], &rec.reload_buf[at(s)]})
      for (int& x : *v) x = *it++;
  w_.adopt(begin, last_compute);
  return true;
}

}  // namespace hbmsim::build
