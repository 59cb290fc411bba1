// A stage's forward passes: each layer's ops, offload copies and weight gathers, then the head's forward or
// the send to the next stage (sim/stage_builder.hpp).
#include "sim/stage_builder.hpp"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hbmsim::build {

int StageBuilder::forward_pass(int mb, int rank, int k, int slot, const ParameterSync& param_sync, ChunkRecord& rec, int previous_pass,
                               int posted) {
  const PipelineChunk& c = chunk(k);
  const std::int64_t first = c.first_layer, n = c.layers();
  int layer_in_op;
  if (c.embedding) {
    layer_in_op = embedding(rec, param_sync.tables, previous_pass, mb + 1 == g_.training.grad_accum);
  } else {
    rec.input_buf = forward_in(mb, k).buf;
    layer_in_op = receive(forward_in(mb, k), posted, 'f', "recv activations", mb);
  }
  auto& fwd = rec.layers;
  fwd.resize(at(n));
  auto& barrier = scratch_.barrier;  // per iteration of the chunk: the ops it must wait for
  barrier.resize(at(n) + 2);
  for (auto& b : barrier) b.clear();
  barrier[0].push_back(layer_in_op);
  int input_buf = rec.input_buf;
  const TeWindow te = te_window(first, n);
  auto& loop = scratch_.loop;
  loop.start(static_cast<int>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const sim::Mark begin = sim::mark(prog_);
    const int sync = param_sync.layers[at(first + i)];
    // TE: the layer whose copies this one waits for at its start, and whose device copies it frees at its end.
    const std::int64_t waits_on = te_waits_on(first, i, te), frees = te_frees(first, i, n, te);
    forward_inputs(first, i, input_buf, fwd, barrier, sync, previous_pass, waits_on, frees);
    const std::array<std::size_t, 2> had{barrier[at(i) + 1].size(), barrier[at(i) + 2].size()};
    sim::LoopInstances* across = across_passes(slot, 0, i);
    if (!copied_forward(first, i, fwd, barrier, across, mb)) {
      forward_layer(CopyRank{rank, n}, first, i, input_buf, fwd, barrier, sync, previous_pass, waits_on, frees);
      forward_left(i, fwd, barrier, had);
    }
    if (copying()) finish_iteration(loop, static_cast<int>(i), across, mb, sim::Span{begin, sim::mark(prog_)});
    // The first forward through the layer owns its sync.
    w_.mark_iteration(begin, mb == 0 ? sync : -1, copying() ? loop.copied_at(static_cast<int>(i)) : 0);
    input_buf = fwd[at(i)].output_buf;
  }
  // TE: the copies no later layer's forward waits for are waited for at the pass's end.
  if (opt_.te_offload)
    for (std::int64_t s = std::max<std::int64_t>(0, n - te.gap); s < n; ++s)
      for (int copy : fwd[at(s)].d2h)
        if (copy >= 0) barrier[at(n)].push_back(copy);
  if (c.head) {
    head_forward(rec, fwd, barrier, layer_in_op);
    return layer_in_op;
  }
  // The chunk's last iteration closes on the compute stream, as the head's final norm closes it: a scan's
  // async copies and overlapped tails end inside the loop, so the stage's next pass starts after them. Then
  // the output is sent; a chunk without layers passes its input on.
  int closed = n > 0 ? fwd[at(n - 1)].last : layer_in_op;
  if (!barrier[at(n)].empty() || !barrier[at(n) + 1].empty()) {
    const int last = closed;
    closed = w_.compute(0, false, 0, 'f', -1, w_.naming() ? label_mb("forward done", mb) : std::string());
    if (last >= 0) w_.op(closed).deps.push_back(last);
    for (auto& b : {barrier[at(n)], barrier[at(n) + 1]})
      for (int op : b) w_.op(closed).deps.push_back(op);
  }
  Crossing& out = forward_in(mb, k + 1);
  send(out, input_buf, k + 1, closed, 'f', "send activations", mb);
  return layer_in_op;
}

void StageBuilder::head_forward(ChunkRecord& rec, const std::vector<ForwardLayer>& fwd, const std::vector<std::vector<int>>& barrier,
                              int chunk_start) {
  const double act = dtype_bytes(g_.training.activation_dtype);
  const double Ts = g_.sharded_tokens, d = static_cast<double>(g_.model.d_model);
  const bool tp = multi(AxisSet{Axis::tp});
  const std::size_t n = fwd.size();
  const Gather head = gather_table("all_gather unembedding", n >= 2 ? fwd[n - 2].last : chunk_start);
  rec.head_buf = head.buf;
  const double logit_elems = g_.logits_bytes / act;
  rec.logits = w_.add_buffer(logit_elems * (act + g_.training.loss_extra_bytes_per_logit), MemCategory::workspace);
  int norm = w_.compute(costs_.memory_s(2 * Ts * d * act), true, 0, 'f', -1, "final_norm");
  for (auto& b : {barrier[n], barrier[n + 1]})
    for (int op : b) w_.op(norm).deps.push_back(op);
  int head_in = -1;
  if (tp && g_.head_enter.forward != CommKind::none) {
    head_in = w_.comm(Axis::tp, costs_.comm(g_.head_enter, false), 1.0, 'f', -1, "head_all_gather");
    w_.op(head_in).deps.push_back(norm);
  }
  int unembed = w_.compute(costs_.gemm_s(g_.unembed_flops, g_.logits_bytes, Dtype::bf16), false, g_.unembed_flops,
                           'f', -1, "unembed");
  w_.op(unembed).allocs.push_back(rec.logits);
  wait_gather(unembed, head);
  w_.data_dep(unembed, head_in);
  int loss = w_.compute(costs_.memory_s(3 * g_.logits_bytes), true, 0, 'f', -1, "softmax_cross_entropy");
  rec.stats = -1;
  if (tp) {
    rec.stats = w_.comm(Axis::tp, costs_.comm(g_.loss_stats, false), 1.0, 'f', -1, "loss_all_reduce");
    w_.op(rec.stats).deps.push_back(loss);
  }
  rec.head_input = n > 0 ? fwd[n - 1].output_buf : rec.input_buf;  // what the head read: freed by its backward
}

void StageBuilder::forward_layer(CopyRank rank, std::int64_t first, std::int64_t i, int input_buf, std::vector<ForwardLayer>& fwd,
                               std::vector<std::vector<int>>& barrier, int param_sync, int previous_pass, std::int64_t waits_on,
                               std::int64_t frees) {
  const std::int64_t l = first + i;
  const auto& prev = fwd;
  const auto& t = g_.layer(l);
  const auto& p = plan(l);
  const auto nt = t.tensors.size();
  const bool pipelined = lhs_copies() && opt_.pipelined_transfers;
  // Pipelined collectives gather one layer ahead (from when layer l-2 is done with its weights); without
  // them the gather sits at the top of its own iteration and the layer waits for it.
  const std::int64_t lag = opt_.pipelined_collectives ? 2 : 1;
  const Gather ag = gather_layer(l, i >= lag ? prev[at(i - lag)].last : previous_pass, 'f');
  if (param_sync >= 0) w_.op(ag.op).deps.push_back(param_sync);

  ForwardLayer& st = fwd[at(i)];
  st.last = -1;
  st.buf.assign(nt, -1);
  st.host_buf.assign(nt, -1);
  st.d2h.assign(nt, -1);
  st.buf[0] = input_buf;
  for (std::size_t k = 1; k < nt; ++k) {
    MemCategory cat = MemCategory::workspace;
    if (p.placement[k] == Placement::device || static_cast<int>(k) == t.output_tensor) cat = MemCategory::saved_activations;
    else if (p.placement[k] == Placement::offload) cat = MemCategory::offload_buffers;
    st.buf[k] = w_.add_buffer(p.kept_bytes[k], cat);  // a tensor not kept has its full size
  }
  st.output_buf = st.buf[static_cast<std::size_t>(t.output_tensor)];

  auto& pending = scratch_.pending;
  auto& op_id = scratch_.op_id;
  auto& tails = scratch_.tails;
  pending.clear();
  op_id.assign(t.ops.size(), -1);
  tails.clear();
  int waiting = -1;  // a synchronous collective the next compute op waits for
  bool first_op = true;
  const std::size_t done_by = pipelined ? at(i + 2) : c_.fwd_body_end[at(l)] - at(first);
  for (int oi : p.order) {
    const auto o = static_cast<std::size_t>(oi);
    const auto& def = t.ops[o];
    int id;
    if (def.kind == OpKind::comm && def.comm.forward != CommKind::none) {
      const Emitted e = emit_comm(def.comm, p.fwd_comm[o], 'f', l, label(def.name, l));
      id = e.head;
      if (e.rest >= 0) tails.push_back(e.rest);
      if (blocking(def.comm, false)) {
        if (w_.last_compute() >= 0) w_.op(id).deps.push_back(w_.last_compute());
        if (waiting >= 0) w_.op(id).deps.push_back(waiting);  // synchronous: after the one before it too
        waiting = id;
      }
    } else {
      id = w_.compute(p.fwd_s[o], p.fwd_mem_bound[o], def.flops, 'f', static_cast<int>(l), label(def.name, l));
      if (waiting >= 0) w_.op(id).deps.push_back(std::exchange(waiting, -1));
    }
    op_id[o] = id;
    for (int in : def.inputs)
      if (int prod = p.producer[static_cast<std::size_t>(in)]; prod >= 0) w_.data_dep(id, op_id[static_cast<std::size_t>(prod)]);
    if (first_op) {  // the iteration's first op waits for its weights and the copies due
      first_op = false;
      wait_gather(id, ag);
      for (int c : barrier[at(i)]) w_.op(id).deps.push_back(c);
      if (waits_on >= 0)
        for (int c : fwd[at(waits_on)].d2h)
          if (c >= 0) w_.op(id).deps.push_back(c);
      if (p.placement[0] == Placement::offload) pending.push_back({0, id, st.buf[0]});  // the input is here by now
    }
    for (int out : def.outputs) w_.op(id).allocs.push_back(st.buf[static_cast<std::size_t>(out)]);
    for (int out : def.outputs) {
      auto k = static_cast<std::size_t>(out);
      if (p.placement[k] != Placement::offload) continue;
      int src = st.buf[k], after = id;
      if (pipelined) {
        // Staged through a loop-carried device buffer so the copy may finish in a later iteration.
        int staged = w_.add_buffer(p.kept_bytes[k], MemCategory::offload_buffers);
        after = w_.compute(costs_.device_copy_s(p.kept_bytes[k]), true, 0, 'f', static_cast<int>(l),
                           label("stage ", t.tensors[k].name, l));
        w_.op(after).allocs.push_back(staged);
        w_.op(after).releases.push_back(src);  // the stage copy is one more reader of the original
        src = staged;
      }
      pending.push_back({k, after, src});
    }
  }
  if (waiting >= 0) throw std::logic_error("layer template ends in a synchronous collective");
  st.last = w_.last_compute();
  // Copies are added after the layer's ops: without LHS an async copy starts right before the op that
  // waits for it, which is the iteration's end; with LHS right after its producer. LHS: done by the end of
  // this iteration (double buffering: of this loop body); pipelined: by the end of the next one. TE: after
  // its producer, waited for by a later layer (te_waits_on) or the pass's end.
  for (auto& pc : pending) {
    const auto k = pc.tensor;
    int host = w_.add_buffer(p.kept_bytes[k], MemCategory::offload_buffers, true);
    int copy = w_.copy(false, p.kept_bytes[k], p.d2h_s[k], static_cast<int>(l), label("d2h ", t.tensors[k].name, l));
    w_.op(copy).deps = {opt_.lhs || opt_.te_offload ? pc.after : st.last};
    w_.op(copy).priority = d2h_priority(rank, i);
    w_.op(copy).allocs = {host};
    w_.op(copy).releases = {pc.src};
    st.host_buf[k] = host;
    st.d2h[k] = copy;
    if (!opt_.te_offload) barrier[done_by].push_back(copy);
  }
  // TE keeps a layer's offloaded tensors on the device until the layer that waits for their copies starts.
  if (frees >= 0)
    for (std::size_t k = 0; k < fwd[at(frees)].d2h.size(); ++k)
      if (fwd[at(frees)].d2h[k] >= 0) w_.op(st.last).releases.push_back(fwd[at(frees)].buf[k]);
  for (int r : tails) barrier[at(i + 1)].push_back(r);
  // An offloaded input's device copy lives until its last forward reader too (the D2H holds the other reference).
  if (p.placement[0] == Placement::offload && p.last_fwd_use[0] >= 0)
    w_.op(op_id[static_cast<std::size_t>(p.last_fwd_use[0])]).releases.push_back(st.buf[0]);
  // Forward-only tensors die after their last forward reader (or at once if nobody reads them).
  for (std::size_t k = 1; k < nt; ++k) {
    if (static_cast<int>(k) == t.output_tensor || p.placement[k] == Placement::device) continue;
    if (p.placement[k] == Placement::offload && pipelined) continue;  // released by its stage copy
    if (p.placement[k] == Placement::offload && p.last_fwd_use[k] < 0) continue;  // the D2H releases it
    int reader = p.last_fwd_use[k] >= 0 ? op_id[static_cast<std::size_t>(p.last_fwd_use[k])]
                                        : op_id[static_cast<std::size_t>(p.producer[k])];
    w_.op(reader).releases.push_back(st.buf[k]);
  }
  if (opt_.reshard_weights) w_.op(st.last).releases.push_back(ag.buf);
}

}  // namespace hbmsim::build
