// A stage's frame: its resident state and passes in schedule order, the optimizer, parameter sync and weight
// gathers, pipeline crossings, the embedding and vocab tables, gradient syncs (sim/stage_builder.hpp).
#include "sim/stage_builder.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

namespace hbmsim::build {

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

double boundary_bytes(const StepGraph& g) {
  return g.sharded_tokens * static_cast<double>(g.model.d_model) * dtype_bytes(g.training.activation_dtype);
}

std::vector<sim::PassSpan> StageBuilder::build(const std::vector<PipelineTask>& tasks) {
  for (auto [bytes, cat] : {std::pair{info_.parameter_bytes, MemCategory::parameters},
                            {info_.optimizer_bytes, MemCategory::optimizer_state},
                            {info_.gradient_bytes, MemCategory::gradients},
                            {c_.sys.runtime.reserve_bytes, MemCategory::runtime_reserve}})
    prog_.resident.push_back(w_.add_buffer(bytes, cat, (cat == MemCategory::optimizer_state && offloaded_optimizer()) ||
                                                           (cat == MemCategory::parameters && opt_.parameter_offload)));
  const ParameterSync param_sync = parameter_sync();
  auto& records = scratch_.records;
  const std::size_t slots = static_cast<std::size_t>(g_.training.grad_accum) * info_.chunks.size();
  if (records.size() < slots) records.resize(slots);
  std::vector<int> done;  // what the optimizer waits for
  // Weight gathers a pass issues before it has anything to wait for wait for the previous pass to start:
  // prefetching runs at most one pass ahead (else a stage's zero-wait gathers for every micro-batch would
  // all be in memory at the step's start).
  int previous_pass = -1;
  // A receive is posted one pass ahead, when the stage starts the pass before, so that it lands while that
  // pass runs. Megatron with overlapped p2p calls it after launching a pass, and the NCCL stream waits for
  // the compute stream at each call, so on the GPU it starts as that pass ends, where the next one starts. A
  // pass merged with the one before it (combined 1F1B) posts where that one did: the pair is issued as one.
  // With blocking p2p (SimOptions::blocking_p2p) it is posted in the call that ends the pass before: batched
  // with that pass's send when the two go opposite ways (Megatron's steady state: send_forward_recv_backward),
  // so once its compute is done; in a call of its own after that send when they go the same way (warm-up's
  // send_forward then recv_forward, cool-down's backward pair), so once the send is done.
  int posted = -1, computed = -1, waited = -1;
  Pass before = Pass::weight_grad;
  bool merged = false;
  start_across();
  std::vector<sim::PassSpan> passes;
  std::vector<Scatter> scattering;  // reduce-scatters not yet waited for, carried between passes (weight_pass)
  int forwards = 0, backwards = 0;  // passes so far: each pass's host copies rank by its place (copy_priority)
  // Overlapped p2p: the stage's last send each way (forward, backward), waited for before its next pass that
  // way (overlapped_send_wait).
  std::array<SentBy, 2> unwaited{};
  for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
    const PipelineTask& t = tasks[ti];
    const int k = info_.chunks[static_cast<std::size_t>(t.chunk)];
    if (!opt_.blocking_p2p && !merged) {  // a merged pair is issued as one: both its waits come first
      overlapped_send_wait(t, unwaited);
      if (t.merged_with_next && ti + 1 < tasks.size()) overlapped_send_wait(tasks[ti + 1], unwaited);
    }
    const sim::PassSpan begin{t.pass == Pass::forward, t.merged_with_next, t.microbatch, w_.ops(), 0,
                              static_cast<int>(prog_.iterations.size()), 0};
    ChunkRecord& rec = records[static_cast<std::size_t>(t.microbatch) * info_.chunks.size() + static_cast<std::size_t>(t.chunk)];
    const bool sync = t.microbatch + 1 == g_.training.grad_accum;
    if (!merged) posted = !opt_.blocking_p2p ? previous_pass : waited >= 0 && before == t.pass ? waited : computed;
    merged = t.merged_with_next;
    switch (t.pass) {
      case Pass::forward: previous_pass = forward_pass(t.microbatch, forwards++, k, t.chunk, param_sync, rec, previous_pass, posted); break;
      case Pass::backward:
        previous_pass = backward_pass(t.microbatch, backwards++, k, t.chunk, sync, rec, done, previous_pass, posted, scattering);
        break;
      case Pass::weight_grad: previous_pass = weight_pass(k, sync, rec, done, scattering); break;
    }
    if (opt_.blocking_p2p) {
      computed = w_.last_compute();
      const int sent = sent_by(t, k);
      waited = sent >= 0 ? wait_for_send(sent, t) : -1;
      before = t.pass;
    } else if (const int sent = sent_by(t, k); sent >= 0) {
      unwaited[t.pass == Pass::forward ? 0 : 1] = SentBy{sent, t};
    }
    if (opt_.ep_overlap && t.pass != Pass::weight_grad) {
      passes.push_back(begin);
      passes.back().end_op = w_.ops();
      passes.back().end_iteration = static_cast<int>(prog_.iterations.size());
    }
  }
  if (unwaited[0].op >= 0 || unwaited[1].op >= 0) {  // the schedule's end waits for the sends still in flight
    const int end = w_.compute(0, false, 0, 'w', -1, w_.naming() ? "wait sends" : "");
    for (const SentBy& sent : unwaited)
      if (sent.op >= 0) {
        w_.op(end).deps.push_back(sent.op);
        free_sent_at(end, sent.op);
      }
  }
  if (!scattering.empty()) {  // the last pass's scatters are due before the optimizer
    const int end = w_.compute(0, false, 0, 'w', -1, w_.naming() ? "weight_grads done" : "");
    for (const Scatter& rs : scattering) wait_for(end, rs);
  }
  switch (opt_.optimizer_offload) {
    case OptimizerOffload::off: {
      if (opt_.parameter_offload) {
        streamed_update(done);
        break;
      }
      const std::vector<int> ready = muon_iterations(done);  // issued before the update on the compute stream
      int opt = w_.compute(costs_.memory_s(info_.optimizer_update_bytes), true, 0, 'o', -1, "optimizer_update");
      for (int r : ready) w_.op(opt).deps.push_back(r);
      break;
    }
    case OptimizerOffload::device: streamed_update(done); break;
    case OptimizerOffload::host: host_update(done); break;
  }
  return passes;
}

std::vector<int> StageBuilder::muon_iterations(const std::vector<int>& done) {
  if (info_.muon_matrices.empty()) return done;
  // Each iteration on an a x b matrix (a <= b) runs X X^T (2 a^2 b FLOPs), A A plus a multiple of A (2 a^3) and
  // B X plus a multiple of X (2 a^2 b). Under Megatron's muon_fp32_matmul_prec medium the fp32 momentum is normalized, cast to bf16 for
  // bf16-in, bf16-out GEMMs and cast back (emerging_optimizers' newton_schulz): memory-bound passes of about
  // 24 bytes per element around them.
  double seconds = 0, flops = 0;
  const double steps = static_cast<double>(g_.training.muon_ns_steps);
  for (const WeightMatrix& m : info_.muon_matrices) {
    const double a = std::min(m.rows, m.cols), b = std::max(m.rows, m.cols);
    const double xxt = costs_.gemm_s(2 * a * a * b, 2 * (a * b + a * a), Dtype::bf16);
    const double aa = costs_.gemm_s(2 * a * a * a, 2 * 3 * a * a, Dtype::bf16);
    const double bx = costs_.gemm_s(2 * a * a * b, 2 * (a * a + 3 * a * b), Dtype::bf16);
    seconds += m.count * (steps * (xxt + aa + bx) + costs_.memory_s(24 * a * b));
    flops += m.count * steps * (4 * a * a * b + 2 * a * a * a);
  }
  int after = -1;
  if (info_.muon_gather_bytes > 0) {
    const CommCost cost = net_.cost(CommKind::all_gather, info_.muon_gather_bytes, AxisSet{Axis::tp});
    after = w_.comm(Axis::tp, cost, 1.0, 'o', -1, "all_gather muon momentum");
    w_.op(after).deps = done;
  }
  const int ns = w_.compute(seconds, false, flops, 'o', -1, "muon newton_schulz");
  if (after >= 0) w_.op(ns).deps.push_back(after);
  else w_.op(ns).deps = done;
  const int work = w_.add_buffer(info_.muon_working_bytes, MemCategory::workspace);
  w_.op(ns).allocs.push_back(work);
  w_.op(ns).releases.push_back(work);
  return {ns};
}

double StageBuilder::optimizer_chunks() const {
  std::int64_t layers = 0;
  for (int k : info_.chunks) layers += chunk(k).layers();
  return static_cast<double>(std::max<std::int64_t>(1, layers));
}

void StageBuilder::streamed_update(const std::vector<int>& done) {
  const double n = optimizer_chunks(), update = info_.optimizer_update_bytes / n;
  const double state = offloaded_optimizer() ? info_.optimizer_bytes / n : 0;
  const double params = opt_.parameter_offload ? info_.parameter_bytes / n : 0;
  const char* what = state > 0 && params > 0 ? "optimizer state and parameters" : state > 0 ? "optimizer state" : "parameters";
  std::vector<int> out;
  for (int k = 0; k < static_cast<int>(n); ++k) {
    const int in = w_.copy(true, state + params, costs_.copy_s(state + params, true), -1, label_chunk((std::string(what) + " in").c_str(), k));
    w_.op(in).deps = done;
    w_.op(in).priority = k;  // a shared link serves the chunk needed first first, as it does prefetches
    if (k >= 2) w_.op(in).deps.push_back(out[static_cast<std::size_t>(k - 2)]);
    for (auto [bytes, cat] : {std::pair{state, MemCategory::optimizer_state}, {params, MemCategory::parameters}})
      if (bytes > 0) w_.op(in).allocs.push_back(w_.add_buffer(bytes, cat));
    const int up = w_.compute(costs_.memory_s(update), true, 0, 'o', -1, label_chunk("optimizer_update", k));
    w_.op(up).deps.push_back(in);
    out.push_back(w_.copy(false, state + params, costs_.copy_s(state + params, false), -1, label_chunk((std::string(what) + " out").c_str(), k)));
    w_.op(out.back()).deps = {up};
    w_.op(out.back()).priority = k;
    for (int b : w_.op(in).allocs) w_.op(out.back()).releases.push_back(b);
  }
}

void StageBuilder::host_update(const std::vector<int>& done) {
  const double n = optimizer_chunks();
  const double cpu_bytes_per_s = c_.sys.host_cpu.memory_bandwidth_bytes_per_s / std::max(1, c_.sys.host_cpu.gpus_per_cpu);
  const double grads = info_.gradient_bytes / n, params = info_.parameter_bytes / n;
  // The CPU optimizer's gradient partition is pinned once and kept (ZeRO-Offload's and Megatron's hybrid
  // optimizer's host copies of the gradients), so the host holds all of it whatever the link's speed: sized
  // per copy as it arrives, a faster link would stage more at once and raise the host peak.
  prog_.resident.push_back(w_.add_buffer(info_.gradient_bytes, MemCategory::offload_buffers, true));
  for (int k = 0; k < static_cast<int>(n); ++k) {
    const int out = w_.copy(false, grads, costs_.copy_s(grads, false), -1, label_chunk("gradients out", k));
    w_.op(out).deps = done;
    w_.op(out).priority = k;  // in chunk order on a shared link (streamed_update)
    const int up = w_.host(info_.optimizer_update_bytes / n / cpu_bytes_per_s, 'o', label_chunk("host optimizer_update", k));
    w_.op(up).deps.push_back(out);
    if (opt_.parameter_offload) continue;  // updated where they live
    const int in = w_.copy(true, params, costs_.copy_s(params, true), -1, label_chunk("parameters in", k));
    w_.op(in).deps = {up};
    w_.op(in).priority = k;
  }
}

Emitted StageBuilder::emit_comm(const CommDef& c, const CommCost& cost, char phase, std::int64_t layer, std::string name) {
  const bool overlap = userbuffer_overlapped(c, c.kind(phase == 'b'), opt_);
  const double head = overlap ? 1.0 / static_cast<double>(g_.mesh.size(Axis::tp)) : 1.0;
  Emitted e;
  e.head = w_.comm(c.axis, cost, head, phase, static_cast<int>(layer), name);
  if (overlap) e.rest = w_.comm(c.axis, cost, 1 - head, phase, static_cast<int>(layer), name + (w_.naming() ? " (overlapped)" : ""));
  return e;
}

int StageBuilder::transform(const CommDef& c, bool backward, int from, int to, int after, char phase, const std::string& name) {
  int id;
  if (c.kind(backward) == CommKind::none) {
    id = w_.compute(0, false, 0, phase, -1, name);
  } else {
    id = w_.comm(c.axis, costs_.comm(c, backward), 1.0, phase, -1, name);
    if (after >= 0) w_.op(id).deps.push_back(after);
  }
  w_.op(id).allocs.push_back(to);
  w_.op(id).releases.push_back(from);
  return id;
}

StageBuilder::ParameterSync StageBuilder::parameter_sync() {
  ParameterSync ps;
  ps.layers.assign(at(g_.model.stack_layers()), -1);
  if (!g_.training.parallelism.sharded_optimizer || !syncs()) return ps;
  if (const double tables = table_grad_bytes(); tables > 0)
    ps.tables = w_.comm(Axis::dp, net_.cost(CommKind::all_gather, table_shard_bytes(tables) * g_.weight_bytes_per_gradient_byte(), g_.grad_sync), 1.0, 'f', -1,
                        "all_gather parameters embedding");
  for (int k : info_.chunks)
    for (std::int64_t l = chunk(k).first_layer; l < chunk(k).end_layer; ++l) {
      ps.layers[at(l)] = w_.comm2(Axis::dp, plan(l).param_sync, plan(l).param_sync_experts, 1.0, 'f', static_cast<int>(l),
                                  label("all_gather parameters", l));
    }
  return ps;
}

Gather StageBuilder::gather_layer(std::int64_t l, int after, char phase) {
  if (!opt_.reshard_weights && kept_weights_.empty()) kept_weights_.assign(at(g_.model.stack_layers()), Gather{});
  if (!opt_.reshard_weights && kept_weights_[at(l)].op >= 0) return kept_weights_[at(l)];
  const auto& t = g_.layer(l);
  const auto& p = plan(l);
  Gather ag;
  ag.buf = w_.add_buffer(g_.weight_buffer_bytes(t), MemCategory::gathered_weights);
  const double shard = t.gathered_dense_bytes / static_cast<double>(g_.mesh.size(g_.dense_shard)) +
                       t.gathered_expert_bytes / static_cast<double>(g_.mesh.size(g_.expert_shard));
  const int in = parameters_in(shard, after, static_cast<int>(l), label("parameters in", l), ag);
  const std::string name = label(phase == 'f' ? "all_gather" : "all_gather bwd", l);
  ag.op = w_.comm2(Axis::fsdp, p.gather, p.gather_experts, 1.0, phase, static_cast<int>(l), name);
  gather_after(ag, in, after, phase, static_cast<int>(l), name);
  if (!opt_.reshard_weights) kept_weights_[at(l)] = Gather{ag.op, ag.buf, -1};  // the first user frees the shard
  return ag;
}

Gather StageBuilder::gather_table(const char* name, int after) {
  const CommCost cost = net_.cost(CommKind::all_gather, g_.table_gathered_bytes, g_.dense_shard);
  Gather ag;
  const int in = parameters_in(table_shard_bytes(g_.table_gathered_bytes), after, -1, std::string("parameters in ") + name, ag);
  ag.op = w_.comm(Axis::fsdp, cost, 1.0, 'f', -1, name);
  ag.buf = w_.add_buffer(g_.table_buffer_bytes(), MemCategory::gathered_weights);
  gather_after(ag, in, after, 'f', -1, name);
  return ag;
}

int StageBuilder::parameters_in(double shard_bytes, int after, int layer, const std::string& name, Gather& ag) {
  if (!opt_.parameter_offload || shard_bytes <= 0) return -1;
  const int in = w_.copy(true, shard_bytes, costs_.copy_s(shard_bytes, true), layer, w_.naming() ? name : std::string());
  if (after >= 0) w_.op(in).deps.push_back(after);
  ag.shard = w_.add_buffer(shard_bytes, MemCategory::parameters);
  return in;
}

void StageBuilder::gather_after(const Gather& ag, int shard_in, int after, char phase, int layer, const std::string& name) {
  // With the shard copied in from host memory, the copy comes first.
  const int from = shard_in >= 0 ? shard_in : after;
  // The buffers come alive where the gather is issued, once `after` completes, whenever the gather's queue (or
  // the shard's copy queue) gets to them: the shard's with the gathered one, as FSDP's unshard takes both.
  const int issued = w_.issue(after, phase, layer, w_.naming() ? "issue " + name : std::string());
  w_.op(issued).allocs = {ag.buf};
  if (shard_in >= 0) {
    w_.op(issued).allocs.push_back(ag.shard);
    w_.op(shard_in).deps.push_back(issued);
  }
  if (from >= 0) w_.op(ag.op).deps.push_back(from);
}

int StageBuilder::sent_by(const PipelineTask& t, int k) {
  if (t.pass == Pass::forward) return chunk(k).head ? -1 : forward_in(t.microbatch, k + 1).send;
  if (t.pass == Pass::backward) return chunk(k).embedding ? -1 : backward_in(t.microbatch, k - 1).send;
  return -1;
}

int StageBuilder::wait_for_send(int send, const PipelineTask& t) {
  const char phase = t.pass == Pass::forward ? 'f' : 'b';
  const int wait = w_.compute(0, false, 0, phase, -1, label_mb(t.pass == Pass::forward ? "wait send activations" : "wait send gradients", t.microbatch));
  w_.op(wait).deps.push_back(send);
  return wait;
}

void StageBuilder::overlapped_send_wait(const PipelineTask& t, std::array<SentBy, 2>& unwaited) {
  if (t.pass == Pass::weight_grad) return;
  SentBy& sent = unwaited[t.pass == Pass::forward ? 0 : 1];
  if (sent.op < 0) return;
  free_sent_at(wait_for_send(sent.op, sent.task), sent.op);
  sent = SentBy{};
}

void StageBuilder::free_sent_at(int wait, int sent) {
  // XLA's live range of the sent buffer ends at the collective-permute-done, this program point; PyTorch's
  // caching allocator takes it back when the NCCL stream is done with it, at the send's end.
  if (opt_.program_order) return;
  auto& freed = w_.op(sent).releases;
  for (int b : freed) w_.op(wait).releases.push_back(b);
  freed.clear();
}

void StageBuilder::send(Crossing& in, int from, int to_chunk, int after, char phase, const char* what, int mb) {
  const int to = chunk(to_chunk).stage;
  in.send = w_.send(net_, net_.point_to_point(boundary_bytes(g_), Axis::pp, stage_, to), to, phase, label_mb(what, mb));
  w_.op(in.send).deps.push_back(after);
  w_.op(in.send).allocs.push_back(in.buf);
  w_.op(in.send).releases.push_back(from);
}

int StageBuilder::embedding(ChunkRecord& rec, int after_sync, int previous_pass, bool last_microbatch) {
  const double act = dtype_bytes(g_.training.activation_dtype);
  const double T = g_.tokens, d = static_cast<double>(g_.model.d_model);
  const bool tp = multi(AxisSet{Axis::tp});
  // Where a first layer's gather is issued: after the sync alone, every pass's table would be live at the step's start.
  Gather embed = kept_table_;
  if (opt_.reshard_weights || embed.op < 0) {
    embed = gather_table("all_gather embedding", previous_pass >= 0 ? previous_pass : after_sync);
    if (after_sync >= 0 && previous_pass >= 0) w_.op(embed.op).deps.push_back(after_sync);
    if (!opt_.reshard_weights) kept_table_ = Gather{embed.op, embed.buf, -1};  // the first lookup frees the shard
  }
  rec.input_buf = w_.add_buffer(g_.sharded_tokens * d * act, MemCategory::saved_activations);
  const int lookup_buf = tp ? w_.add_buffer(T * d * act, MemCategory::workspace) : rec.input_buf;
  int lookup = w_.compute(costs_.memory_s(2 * T * d * act), true, 0, 'f', -1, "embedding_lookup");
  wait_gather(lookup, embed);
  w_.op(lookup).allocs.push_back(lookup_buf);
  if (opt_.reshard_weights || last_microbatch) w_.op(lookup).releases.push_back(embed.buf);
  if (tp) return transform(g_.embed_exit, false, lookup_buf, rec.input_buf, lookup, 'f', "embedding_exit");
  return lookup;
}

Scatter StageBuilder::head_table_gradients(const PipelineChunk& c, int head_bwd, bool sync, std::vector<int>& done) {
  const double bucket = table_grad_bytes(c);
  int grad = w_.add_buffer(g_.table_grad_buffer_bytes(bucket), MemCategory::collective_buffers);
  w_.op(head_bwd).allocs.push_back(grad);
  const int rs = table_reduce_scatter(bucket, head_bwd, "reduce_scatter unembedding", done);
  if (sync && multi(g_.grad_sync)) table_sync(bucket, rs, done);
  return Scatter{rs, grad};
}

int StageBuilder::table_reduce_scatter(double bucket, int after, const char* name, std::vector<int>& done) {
  int rs = w_.comm(Axis::fsdp, net_.cost(CommKind::reduce_scatter, bucket, g_.dense_shard), 1.0, 'b', -1, name);
  w_.op(rs).deps = {after};
  done.push_back(rs);
  return rs;
}

void StageBuilder::table_sync(double bucket, int rs, std::vector<int>& done) {
  const auto kind = g_.training.parallelism.sharded_optimizer ? CommKind::reduce_scatter : CommKind::all_reduce;
  done.push_back(grad_sync(net_.cost(kind, table_shard_bytes(bucket), g_.grad_sync), CommCost{}, rs, -1, -1));
}

void take_due(std::vector<Scatter>& in_flight, std::size_t issued, std::size_t lag, std::vector<Scatter>& out) {
  out.clear();
  std::size_t n = 0;
  while (n < in_flight.size() && in_flight.size() - n + issued >= lag) out.push_back(in_flight[n++]);
  in_flight.erase(in_flight.begin(), in_flight.begin() + static_cast<std::ptrdiff_t>(n));
}

int StageBuilder::weight_pass(int k, bool sync, ChunkRecord& rec, std::vector<int>& done, std::vector<Scatter>& scattering) {
  const PipelineChunk& c = chunk(k);
  // Each scatter is due at the weight op reduce_scatter_lag() layers on, in this pass or the stage's next one
  // (take_due). Freed when the transfer ended, gradients piled up behind a slow network and the peak followed
  // its timing.
  const auto lag = static_cast<std::size_t>(reduce_scatter_lag());
  auto& due = scratch_.due_scatters;
  int first_op = -1;
  for (std::int64_t i = c.layers() - 1; i >= 0; --i) {
    const std::int64_t l = c.first_layer + i;
    const auto& t = g_.layer(l);
    WeightPass& wp = rec.weights[at(i)];
    int grad_buf = w_.add_buffer(g_.grad_buffer_bytes(t), MemCategory::collective_buffers);
    int id = w_.compute(wp.seconds, false, wp.flops, 'w', static_cast<int>(l), label("weight_grads", l));
    if (first_op < 0) first_op = id;
    for (int d : wp.deps) w_.op(id).deps.push_back(d);
    take_due(scattering, 0, lag, due);  // this pass's own scatters are in the list
    for (const Scatter& s : due) wait_for(id, s);
    w_.op(id).allocs.push_back(grad_buf);
    for (int b : wp.releases) w_.op(id).releases.push_back(b);
    const auto& p = plan(l);
    int rs = w_.comm2(Axis::fsdp, p.reduce_scatter, p.reduce_scatter_experts, 1.0, 'b', static_cast<int>(l), label("reduce_scatter", l));
    w_.op(rs).deps = {id};
    scattering.push_back(Scatter{rs, grad_buf});
    done.push_back(rs);
    if (sync && syncs()) done.push_back(grad_sync(p, rs, -1, l));
  }
  return first_op;
}

int StageBuilder::grad_sync(const TemplatePlan& p, int after_rs, int after, std::int64_t l) {
  return grad_sync(p.grad_sync, p.grad_sync_experts, after_rs, after, l);
}

int StageBuilder::grad_sync(const CommCost& dense, const CommCost& experts, int after_rs, int after, std::int64_t l) {
  const char* what = g_.training.parallelism.sharded_optimizer ? "reduce_scatter grads" : "all_reduce grads";
  int id = w_.comm2(Axis::dp, dense, experts, 1.0, 'b', static_cast<int>(l),
                    l >= 0 ? label(what, l) : std::string(what) + " embedding");
  w_.op(id).deps.push_back(after_rs);
  if (after >= 0) w_.op(id).deps.push_back(after);
  return id;
}

}  // namespace hbmsim::build
