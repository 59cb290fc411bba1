// A stage's backward passes: each layer's backward and recompute, reloads of offloaded tensors, gradient
// reduce-scatters, then the embedding's backward or the send to the previous stage (sim/stage_builder.hpp).
#include "sim/stage_builder.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace hbmsim::build {

int StageBuilder::head_backward(const ChunkRecord& rec, int& grad) {
  const double act = dtype_bytes(g_.training.activation_dtype);
  const double T = g_.tokens, Ts = g_.sharded_tokens, d = static_cast<double>(g_.model.d_model);
  grad = w_.add_buffer(T * d * act, MemCategory::workspace);
  int unembed_bwd = w_.compute(costs_.gemm_s(2 * g_.unembed_flops, 2 * g_.logits_bytes, Dtype::bf16), false,
                               2 * g_.unembed_flops, 'b', -1, "unembed_bwd");
  w_.op(unembed_bwd).allocs.push_back(grad);
  w_.op(unembed_bwd).releases = {rec.logits, rec.head_buf, rec.head_input};
  w_.data_dep(unembed_bwd, rec.stats);
  if (multi(AxisSet{Axis::tp})) {
    int sharded = w_.add_buffer(Ts * d * act, MemCategory::workspace);
    int exit = transform(g_.head_enter, true, grad, sharded, unembed_bwd, 'b', "head_exit_bwd");
    w_.data_dep(w_.compute(0, false, 0, 'b', -1, w_.naming() ? "head_grad_ready" : ""), exit);
    grad = sharded;
  }
  return unembed_bwd;
}

int StageBuilder::backward_pass(int mb, int rank, int k, int slot, bool sync, ChunkRecord& rec, std::vector<int>& done, int previous_pass,
                                int posted, std::vector<Scatter>& scattering) {
  const PipelineChunk& c = chunk(k);
  const std::int64_t first = c.first_layer, n = c.layers(), last = c.end_layer - 1;
  int grad_carry, start;
  if (c.head) {
    start = head_backward(rec, grad_carry);
  } else {
    grad_carry = backward_in(mb, k).buf;
    start = receive(backward_in(mb, k), posted, 'b', "recv gradients", mb);
  }
  auto& bwd = scratch_.bwd;
  bwd.assign(at(n), BackwardLayer{});
  if (split_weights()) rec.weights.resize(at(n));
  if (opt_.pipelined_collectives && n > 0) bwd[at(n - 1)].gather = gather_layer(last, previous_pass, 'b');
  std::vector<int> reduce_scatter(at(n), -1);
  const bool sync_layers = sync && syncs() && !split_weights();
  // The last iterations' scatters are due at the end of the pass, where the embedding's backward waits for them
  // and frees their gradients; without the embedding they are carried to the stage's next pass (weight_pass).
  const std::int64_t lag = reduce_scatter_lag(), due = std::min(n, lag);
  const TeWindow te = te_window(first, n);
  if (opt_.te_offload) {
    rec.reload_op.resize(at(n));
    rec.reload_buf.resize(at(n));
    for (std::int64_t i = 0; i < n; ++i) {
      rec.reload_op[at(i)].assign(g_.layer(first + i).tensors.size(), -1);
      rec.reload_buf[at(i)].assign(g_.layer(first + i).tensors.size(), -1);
    }
  }
  auto& loop = scratch_.loop;
  loop.start(static_cast<int>(n));
  auto& reloaded = scratch_.reloaded;  // TE: the layers this iteration reloads
  for (std::int64_t i = n - 1; i >= 0; --i) {
    const sim::Mark begin = sim::mark(prog_);
    const int step = static_cast<int>(n - 1 - i);  // the loop runs the layers in reverse
    te_reloaded_by(first, i, n, te, reloaded);
    // Where none of this pass's scatters is due yet (its first iterations), the ones carried from the stage's
    // previous pass are (take_due; this pass's are not in the list: `step` of them issued so far).
    auto& carried = scratch_.due_scatters;
    carried.clear();
    if (!split_weights() && i + lag >= n) take_due(scattering, static_cast<std::size_t>(step), static_cast<std::size_t>(lag), carried);
    backward_inputs(first, i, rec, bwd, grad_carry, start, sync, reloaded, carried);
    const std::size_t had = done.size();
    sim::LoopInstances* across = across_passes(slot, 1, i);
    if (!copied_backward(first, i, step, bwd, grad_carry, reduce_scatter, done, across, mb, rec, reloaded)) {
      auto [grad, rs] = backward_layer(CopyRank{rank, n}, first, i, rec, bwd, grad_carry, start, sync, reloaded, carried);
      grad_carry = grad;
      reduce_scatter[at(i)] = rs;
      if (rs >= 0) {  // else its weight gradients come in a pass of their own
        done.push_back(rs);
        if (sync_layers && opt_.dp_overlap) done.push_back(grad_sync(plan(first + i), rs, -1, first + i));
      }
      backward_left(i, bwd, grad_carry, rs, done, had, rec, reloaded);
    }
    if (copying()) finish_iteration(loop, step, across, mb, sim::Span{begin, sim::mark(prog_)});
    w_.mark_iteration(begin, -1, copying() ? loop.copied_at(step) : 0);
  }
  if (!c.embedding) {
    Crossing& out = backward_in(mb, k - 1);
    send(out, grad_carry, k - 1, w_.last_compute(), 'b', "send gradients", mb);
    for (std::int64_t i = due - 1; i >= 0 && !split_weights(); --i)  // in the order they were issued
      scattering.push_back(Scatter{bwd[at(i)].reduce_scatter, bwd[at(i)].grad_buf});
    // The head's bucket, issued after them, is carried too: freed where the stage's next pass waits for it,
    // not when the transfer ends (then a faster GPU's next pass found it still live).
    if (c.head) scattering.push_back(head_table_gradients(c, start, sync, done));
    if (sync_layers && !opt_.dp_overlap)
      for (std::int64_t i = n - 1; i >= 0; --i) done.push_back(grad_sync(plan(first + i), reduce_scatter[at(i)], out.send, first + i));
    return start;
  }
  const double act = dtype_bytes(g_.training.activation_dtype);
  const double T = g_.tokens, d = static_cast<double>(g_.model.d_model);
  if (multi(AxisSet{Axis::tp})) {
    int whole = w_.add_buffer(T * d * act, MemCategory::workspace);
    int enter = transform(g_.embed_exit, true, grad_carry, whole, w_.last_compute(), 'b', "embedding_exit_bwd");
    grad_carry = whole;
    w_.data_dep(w_.compute(0, false, 0, 'b', -1, w_.naming() ? "embedding_grad_ready" : ""), enter);
  }
  // The table bucket: both tables when this chunk also holds the head, else the input table's.
  const double bucket = c.head ? table_grad_bytes(c) : g_.embedding_grad_bytes;
  int embed_grad = w_.add_buffer(g_.table_grad_buffer_bytes(bucket), MemCategory::collective_buffers);
  int scatter = w_.compute(costs_.memory_s(2 * T * d * act), true, 0, 'b', -1, "embedding_bwd");
  w_.op(scatter).allocs.push_back(embed_grad);
  w_.op(scatter).releases.push_back(grad_carry);
  for (std::int64_t i = 0; i < due && !split_weights(); ++i) wait_for(scatter, Scatter{bwd[at(i)].reduce_scatter, bwd[at(i)].grad_buf});
  // Freed where the backward's end waits for its reduce-scatters (Megatron-FSDP's and FSDP2's root post-backward
  // hook), not when the transfer ends: then a faster GPU's next backward found it still live. With the weight
  // gradients split off, the backward ends in the weight passes, which wait for it with the layers' scatters.
  const int rs = table_reduce_scatter(bucket, scatter, "reduce_scatter embedding", done);
  if (split_weights()) scattering.push_back(Scatter{rs, embed_grad});
  else wait_for(w_.compute(0, false, 0, 'b', -1, w_.naming() ? "wait reduce_scatter embedding" : ""), Scatter{rs, embed_grad});
  if (sync && syncs()) {
    // Without overlap every bucket is issued once the backward pass is done.
    if (sync_layers && !opt_.dp_overlap)
      for (std::int64_t i = n - 1; i >= 0; --i) done.push_back(grad_sync(plan(first + i), reduce_scatter[at(i)], scatter, first + i));
    table_sync(bucket, rs, done);
  }
  return start;
}

void StageBuilder::te_reloaded_by(std::int64_t first, std::int64_t i, std::int64_t n, const TeWindow& te,
                                  std::vector<std::int64_t>& out) const {
  out.clear();
  if (!opt_.te_offload) return;
  const std::int64_t lowest = i - te.lookahead, highest = i == n - 1 ? i : lowest;
  for (std::int64_t s = highest; s >= std::max<std::int64_t>(0, lowest); --s)
    if (offloads_any(first + s)) out.push_back(s);
}

void StageBuilder::issue_reloads(CopyRank rank, std::int64_t first, const std::vector<std::int64_t>& reloaded, ChunkRecord& rec, int after) {
  for (std::int64_t s : reloaded) {
    const std::int64_t l = first + s;
    const auto& p = plan(l);
    for (std::size_t k = 0; k < g_.layer(l).tensors.size(); ++k) {
      if (p.placement[k] != Placement::offload || p.last_read[k] < 0) continue;
      std::tie(rec.reload_op[at(s)][k], rec.reload_buf[at(s)][k]) = reload(rank, first, s, k, rec.layers[at(s)], after);
    }
  }
}

std::pair<int, int> StageBuilder::reload(CopyRank rank, std::int64_t first, std::int64_t i, std::size_t k, const ForwardLayer& f,
                                        int after) {
  const std::int64_t l = first + i;
  const auto& p = plan(l);
  const int dst = w_.add_buffer(p.kept_bytes[k], MemCategory::offload_buffers);
  // Transformer Engine allocates the reload's destination on the issuing thread, when it issues the copy, not
  // when the copy stream gets to it: taken there, the buffer's life does not follow the link's speed.
  const int issued = opt_.te_offload ? w_.issue(after, 'b', static_cast<int>(l), label("issue h2d ", g_.layer(l).tensors[k].name, l)) : -1;
  if (issued >= 0) w_.op(issued).allocs = {dst};
  const int copy = w_.copy(true, p.kept_bytes[k], p.h2d_s[k], static_cast<int>(l), label("h2d ", g_.layer(l).tensors[k].name, l));
  ProgramOp& c = w_.op(copy);
  if (issued >= 0) c.deps.push_back(issued);
  else c.allocs = {dst};
  c.releases = {f.host_buf[k]};
  if (after >= 0) c.deps.push_back(after);
  c.deps.push_back(f.d2h[k]);
  c.priority = h2d_priority(rank, i, std::max(p.first_read[k], 0));
  return {copy, dst};
}

int copy_priority(CopyRank r, std::int64_t block, int within) {
  if (within >= kCopyClasses) throw std::logic_error("a layer's backward has more steps than its copies have priority classes");
  // Blocks 0..layers per pass: the passes' blocks add up to (the stage's layers + chunks) x micro-batches,
  // which the ops budget (program_builder.cpp: 4,000,000, at least 38 per layer) keeps far below INT_MAX / 1024.
  const std::int64_t p = (static_cast<std::int64_t>(r.pass) * (r.layers + 1) + block) * kCopyClasses + within;
  if (p > std::numeric_limits<int>::max()) throw std::logic_error("host-link priority class out of range");
  return static_cast<int>(p);
}

std::pair<int, int> StageBuilder::backward_layer(CopyRank rank, std::int64_t first, std::int64_t i, ChunkRecord& rec, std::vector<BackwardLayer>& bwd,
                                               int grad_in, int backward_start, bool last_microbatch,
                                               const std::vector<std::int64_t>& reloaded, const std::vector<Scatter>& carried) {
  const std::int64_t l = first + i, n = static_cast<std::int64_t>(bwd.size());
  const ForwardLayer& f = rec.layers[at(i)];
  const auto& t = g_.layer(l);
  const auto& p = plan(l);
  const auto nt = t.tensors.size();
  const bool pipelined = opt_.lhs && opt_.pipelined_transfers;
  const bool split = p.split_weight_grads;
  WeightPass* wp = split ? &rec.weights[at(i)] : nullptr;
  if (wp) *wp = WeightPass{};
  const int iteration_start = w_.last_compute();
  auto& me = bwd[at(i)];
  me.iteration_start = iteration_start;
  // Transfers may start from the start of the loop body, which double buffering makes two layers long.
  const int body_start = bwd[c_.bwd_body_first[at(l)] - at(first)].iteration_start;
  // Issue the next layer's gather before this layer's reduce-scatter so the two never queue behind each
  // other; it may start once layer l+1 is done with its weights. With its shard copied in from host memory
  // (parameter offload) that copy waits for layer l+1 too, on the host link's queue, which starts its copies
  // in program order: it is issued after this layer's prefetches (below), or they would wait behind it until
  // the layer starts, pipelined or not.
  auto gather_next = [&] {
    if (i >= 1) bwd[at(i - 1)].gather = gather_layer(l - 1, i + 1 < n ? bwd[at(i + 1)].last : -1, 'b');
  };
  const bool gather_after_prefetch = opt_.pipelined_collectives && opt_.parameter_offload;
  if (!opt_.pipelined_collectives) me.gather = gather_layer(l, iteration_start, 'b');
  else if (!gather_after_prefetch) gather_next();
  issue_reloads(rank, first, reloaded, rec, iteration_start);

  const auto& steps = p.steps;
  const auto& last_read = p.last_read;
  auto read = [&](std::size_t k) { return last_read[k] >= 0; };

  // Per-tensor working lists, reset here (their capacity is kept across layers and steps).
  auto& buf = scratch_.buf;
  auto& h2d = scratch_.h2d;
  auto& grad = scratch_.grad;
  auto& val_op = scratch_.val_op;      // per tensor: the op that regenerated it in this iteration
  auto& grad_ops = scratch_.grad_ops;  // per tensor: the ops that wrote its gradient
  auto& tails = scratch_.tails;
  buf.assign(nt, -1);
  h2d.assign(nt, -1);
  grad.assign(nt, -1);
  val_op.assign(nt, -1);
  auto& lifted = scratch_.lifted;  // per tensor: its prefetch's gate lift is set
  lifted.assign(nt, 0);
  if (grad_ops.size() < nt) grad_ops.resize(nt);
  for (std::size_t k = 0; k < nt; ++k) grad_ops[k].clear();
  tails.clear();
  for (std::size_t k = 0; k < nt; ++k)
    if ((k == 0 && p.placement[0] != Placement::offload) || p.placement[k] == Placement::device) buf[k] = f.buf[k];
  if (opt_.te_offload) {  // reloaded from an earlier layer's backward (issue_reloads)
    h2d = rec.reload_op[at(i)];
    for (std::size_t k = 0; k < nt; ++k)
      if (h2d[k] >= 0) buf[k] = rec.reload_buf[at(i)][k];
  }
  auto make_h2d = [&](std::size_t k, int after) {
    std::tie(h2d[k], buf[k]) = reload(rank, first, i, k, f, after);
    if (opt_.lhs) w_.op(h2d[k]).gate_bytes = p.kept_bytes[k];
  };
  // With LHS the prefetch is hoisted to the iteration's start (pipelined: anywhere in the backward pass the
  // memory limit allows).
  // Issued in the order of first use: a copy queue starts its ops in order, so a prefetch held back by the
  // memory limit must not hold back one that is needed earlier.
  if (lhs_copies()) {
    auto& prefetch = scratch_.prefetch;
    prefetch.clear();
    for (std::size_t k = 0; k < nt; ++k)
      if (p.placement[k] == Placement::offload && read(k)) prefetch.push_back(static_cast<int>(k));
    std::stable_sort(prefetch.begin(), prefetch.end(), [&](int a, int b) {
      return p.first_read[static_cast<std::size_t>(a)] < p.first_read[static_cast<std::size_t>(b)];
    });
    for (int k : prefetch) make_h2d(static_cast<std::size_t>(k), pipelined ? backward_start : body_start);
  }
  if (gather_after_prefetch) gather_next();
  const Gather ag = me.gather;

  // The unsharded gradients: written here, or by the weight pass when it is split off.
  const int grad_buf = split ? -1 : w_.add_buffer(g_.grad_buffer_bytes(t), MemCategory::collective_buffers);
  grad[static_cast<std::size_t>(t.output_tensor)] = grad_in;
  // A reduce-scatter is an async collective of its loop iteration: it is done (and its input freed) by the
  // start of the next iteration, or with XLA's collective pipeliner the one after. That program point, not
  // the moment the transfer ends, frees the unsharded gradients: one or two layers of them are live in the
  // backward however fast the compute and the network are.
  const std::int64_t rs_lag = reduce_scatter_lag();
  const BackwardLayer* due = !split && i + rs_lag < n ? &bwd[at(i + rs_lag)] : nullptr;
  bool first_op = true;
  auto begin_iteration = [&](int id) {  // the first compute op waits for the weights and opens the gradients
    if (!first_op) return;
    wait_gather(id, ag);
    if (due) wait_for(id, Scatter{due->reduce_scatter, due->grad_buf});
    for (const Scatter& s : carried) wait_for(id, s);
    if (grad_buf >= 0) w_.op(id).allocs.push_back(grad_buf);
    first_op = false;
  };
  int waiting = -1;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const std::size_t o = steps[s].op;
    const auto& def = t.ops[o];
    const Kind kind = steps[s].kind;
    const bool replay = kind == Kind::replay;
    const auto& reads = step_reads(def, kind);
    if (split && kind == Kind::bwd_w) {  // left to the weight pass: it waits for and frees what this step would
      wp->seconds += p.seconds(steps[s]);
      wp->flops += def.bwd_flops / 2;
      for (int k : reads) {
        auto kk = static_cast<std::size_t>(k);
        if (val_op[kk] >= 0) wp->deps.push_back(val_op[kk]);
        if (h2d[kk] >= 0) wp->deps.push_back(h2d[kk]);
        if (last_read[kk] == static_cast<int>(s) && buf[kk] >= 0) wp->releases.push_back(buf[kk]);
      }
      for (int out : def.outputs)
        for (int g : grad_ops[static_cast<std::size_t>(out)]) wp->deps.push_back(g);
      if (p.grad_last[o] == static_cast<int>(s))
        for (int out : def.outputs)
          if (grad[static_cast<std::size_t>(out)] >= 0) wp->releases.push_back(grad[static_cast<std::size_t>(out)]);
      continue;
    }
    // Without LHS the copy starts right before the first op that reads it. With LHS that is the latest a
    // prefetch the memory limit holds back may start: the scheduler can shorten the overlap, not undo it.
    for (int k : reads) {
      auto kk = static_cast<std::size_t>(k);
      if (p.placement[kk] != Placement::offload) continue;
      if (h2d[kk] < 0) make_h2d(kk, w_.last_compute());
      else if (lhs_copies() && !lifted[kk] && w_.last_compute() >= 0) {
        w_.gate_lift(h2d[kk], w_.last_compute());
        lifted[kk] = 1;
      }
    }
    const char* prefix = replay ? "recompute " : kind == Kind::bwd ? "bwd " : kind == Kind::bwd_x ? "bwd_x " : "bwd_w ";
    std::string name = w_.naming() ? prefix + def.name + " L" + std::to_string(l) : std::string();
    int id;
    if (def.kind == OpKind::comm && def.comm.kind(!replay) != CommKind::none) {
      const Emitted e = emit_comm(def.comm, replay ? p.fwd_comm[o] : p.bwd_comm[o], replay ? 'r' : 'b', l, std::move(name));
      id = e.head;
      if (e.rest >= 0) tails.push_back(e.rest);
      if (iteration_start >= 0) w_.op(id).deps.push_back(iteration_start);  // collectives start with their iteration
      if (blocking(def.comm, !replay)) {
        if (w_.last_compute() >= 0) w_.op(id).deps.push_back(w_.last_compute());
        if (waiting >= 0) w_.op(id).deps.push_back(waiting);  // synchronous: after the one before it too
        waiting = id;
      }
    } else {
      const double flops = replay ? def.flops : kind == Kind::bwd ? def.bwd_flops : def.bwd_flops / 2;
      id = w_.compute(p.seconds(steps[s]), p.fwd_mem_bound[o], def.kind == OpKind::comm ? 0 : flops, replay ? 'r' : 'b',
                      static_cast<int>(l), std::move(name));
      begin_iteration(id);
      if (waiting >= 0) w_.op(id).deps.push_back(std::exchange(waiting, -1));
    }
    for (int k : reads) w_.data_dep(id, val_op[static_cast<std::size_t>(k)]);
    if (!replay)
      for (int out : def.outputs)
        for (int g : grad_ops[static_cast<std::size_t>(out)]) w_.data_dep(id, g);
    for (int k : reads) {
      auto kk = static_cast<std::size_t>(k);
      if (h2d[kk] >= 0) w_.op(id).deps.push_back(h2d[kk]);
      if (last_read[kk] == static_cast<int>(s) && buf[kk] >= 0) w_.op(id).releases.push_back(buf[kk]);
    }
    if (replay) {
      for (int out : def.outputs) {
        auto kk = static_cast<std::size_t>(out);
        val_op[kk] = id;
        if (buf[kk] >= 0 || p.placement[kk] == Placement::offload) continue;
        buf[kk] = w_.add_buffer(t.tensors[kk].bytes, MemCategory::workspace);
        w_.op(id).allocs.push_back(buf[kk]);
        if (!read(kk) || last_read[kk] <= static_cast<int>(s)) w_.op(id).releases.push_back(buf[kk]);
      }
      continue;
    }
    // A backward step writes the gradients of its inputs (the weight-gradient dot writes only the
    // layer's weight gradients) and, as their last reader, drops the gradients of its outputs.
    if (kind != Kind::bwd_w) {
      for (int in : def.inputs) {
        auto kk = static_cast<std::size_t>(in);
        if (grad[kk] < 0) {
          grad[kk] = w_.add_buffer(t.tensors[kk].bytes, MemCategory::workspace);
          w_.op(id).allocs.push_back(grad[kk]);
        }
        grad_ops[kk].push_back(id);
      }
    }
    if (p.grad_last[o] == static_cast<int>(s))
      for (int out : def.outputs)
        if (grad[static_cast<std::size_t>(out)] >= 0) w_.op(id).releases.push_back(grad[static_cast<std::size_t>(out)]);
  }
  if (waiting >= 0) throw std::logic_error("backward iteration ends in a synchronous collective");
  me.last = w_.last_compute();
  if (opt_.reshard_weights || last_microbatch) w_.op(me.last).releases.push_back(ag.buf);
  // Saved tensors nobody read, and host copies nobody fetched, go at the end of the iteration.
  for (std::size_t k = 0; k < nt; ++k) {
    if ((k == 0 || p.placement[k] == Placement::device) && buf[k] == f.buf[k] && !read(k))
      w_.op(me.last).releases.push_back(f.buf[k]);
    if (p.placement[k] == Placement::offload && h2d[k] < 0) w_.op(me.last).releases.push_back(f.host_buf[k]);
  }
  if (split) {
    for (int r : tails) wp->deps.push_back(r);
    return {grad[0], -1};
  }
  int rs = w_.comm2(Axis::fsdp, p.reduce_scatter, p.reduce_scatter_experts, 1.0, 'b', static_cast<int>(l), label("reduce_scatter", l));
  w_.op(rs).deps = {me.last};
  for (int r : tails) w_.op(rs).deps.push_back(r);
  me.reduce_scatter = rs;
  me.grad_buf = grad_buf;
  return {grad[0], rs};
}

}  // namespace hbmsim::build
