#include "sim/program_builder.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "hwmodels/json_view.hpp"
#include "sim/combined_1f1b.hpp"
#include "sim/comm.hpp"
#include "sim/costs.hpp"
#include "sim/instances.hpp"
#include "sim/layer_plan.hpp"
#include "sim/pipeline_schedule.hpp"

namespace hbmsim {

using sim::MemCategory;
using sim::Program;
using sim::ProgramOp;
using Kind = TemplatePlan::Kind;

namespace {

// Per op: its queue, kept beside the (large) ops for dependency checks (per thread, for its capacity).
std::vector<std::uint16_t>& thread_queue_of() {
  thread_local std::vector<std::uint16_t> v;
  return v;
}

// Appends one device's ops to a program: built in place (they are large), named when asked, communication
// on the queue of its mesh axis with the link bandwidth it uses, copies on the copy engines over the host
// link (every ready copy at once, as XLA's async copies; `serial_copies`: one after another in issue order,
// as on one CUDA stream per direction).
class Writer {
 public:
  Writer(Program& p, const System& sys, const Network& net, std::vector<std::string>* names, int device, bool serial_copies)
      : p_(p), names_(names), device_(device), compute_(p.compute_queue(device)) {
    const auto copies = serial_copies ? sim::QueueKind::serial : sim::QueueKind::concurrent;
    d2h_ = p.queue("d2h", copies, true, device);
    h2d_ = p.queue("h2d", copies, true, device);
    d2h_link_ = p.resource("host link D2H", sys.host_d2h_bytes_per_s(), device);
    h2d_link_ = p.resource("host link H2D", sys.host_h2d_bytes_per_s(), device);
    if (sys.host_link.bidirectional_total_bytes_per_s)
      both_links_ = p.resource("host link both directions", *sys.host_link.bidirectional_total_bytes_per_s, device);
    for (int level : {kIntraDomain, kInterDomain}) {
      const PathCost& path = net.path(level);
      if (path.links.empty()) continue;
      links_[static_cast<std::size_t>(level)] = {link(net, level, true, device), link(net, level, false, device)};
    }
  }

  // A device's link out of (or into) it on a path level, created on first use.
  int link(const Network& net, int level, bool out, int device) {
    const PathCost& path = net.path(level);
    return p_.resource(path.bottleneck + (out ? " out" : " in"), path.bytes_per_s, device);
  }

  bool naming() const { return names_ != nullptr; }
  int device() const { return device_; }
  ProgramOp& op(int i) { return p_.ops[static_cast<std::size_t>(i)]; }
  // `gated` may start once `after` completes whatever the memory limit (see Program::gate_lifts).
  void gate_lift(int gated, int after) {
    if (after >= 0) p_.gate_lifts.push_back({gated, after});
  }
  int last_compute() const { return last_compute_; }
  int ops() const { return static_cast<int>(p_.ops.size()); }
  // The ops added since `begin` are one iteration of a layer loop.
  void mark_iteration(const sim::Mark& begin, int side = -1, int copy_of = 0) {
    p_.iterations.push_back({begin.ops, ops(), side, side >= 0 ? side + 1 : side, copy_of, begin.buffers,
                             static_cast<int>(p_.buffers.size())});
  }

  int compute(double seconds, bool memory_bound, double flops, char phase, int layer, std::string name) {
    ProgramOp& o = emplace(compute_, seconds, phase, layer);
    o.memory_bound = memory_bound;
    o.executed_flops = flops;
    last_compute_ = named(std::move(name));
    return last_compute_;
  }
  // `fraction` of a communication's cost (an overlapped collective is issued in two parts).
  int comm(Axis axis, const CommCost& cost, double fraction, char phase, int layer, std::string name) {
    return comm2(axis, cost, CommCost{}, fraction, phase, layer, std::move(name));
  }
  // Two communications issued as one op (a layer's dense and expert weights gathered together).
  int comm2(Axis axis, const CommCost& a, const CommCost& b, double fraction, char phase, int layer, std::string name) {
    const double seconds = (a.seconds + b.seconds) * fraction;
    emplace(queue(axis), seconds, phase, layer);
    const int id = named(std::move(name));
    for (const CommCost* c : {&a, &b})
      for (std::size_t level = 0; level < 2; ++level) {
        if (c->bytes[level] <= 0) continue;
        const double bytes = c->bytes[level] * fraction;
        op(id).bytes_sent += bytes;
        if (seconds <= 0) continue;
        // SPMD: each device receives what it sends, so both directions of the link carry the same rate.
        p_.use(id, links_[level].first, bytes / seconds);
        p_.use(id, links_[level].second, bytes / seconds);
      }
    return id;
  }
  // A pipeline send to another stage: out of this device's link, into the receiver's.
  int send(const Network& net, const CommCost& cost, int to_device, char phase, std::string name) {
    emplace(queue(Axis::pp), cost.seconds, phase, -1);
    const int id = named(std::move(name));
    for (int level : {kIntraDomain, kInterDomain}) {
      const double bytes = cost.bytes[static_cast<std::size_t>(level)];
      if (bytes <= 0) continue;
      op(id).bytes_sent += bytes;
      if (cost.seconds <= 0 || links_[static_cast<std::size_t>(level)].first < 0) continue;
      p_.use(id, links_[static_cast<std::size_t>(level)].first, bytes / cost.seconds);
      p_.use(id, link(net, level, false, to_device), bytes / cost.seconds);
    }
    return id;
  }
  // A copy holds its direction's copy engine while it runs: concurrent copies in one direction time-share it
  // (each at its solo rate over their number); a cap on both directions together limits the bytes moved.
  int copy(bool to_device, double bytes, double seconds, int layer, std::string name) {
    emplace(to_device ? h2d_ : d2h_, seconds, 'c', layer);
    const int id = named(std::move(name));
    const int link = to_device ? h2d_link_ : d2h_link_;
    p_.use(id, link, p_.resources[static_cast<std::size_t>(link)].capacity_bytes_per_s);
    if (both_links_ >= 0) p_.use(id, both_links_, bytes / seconds);
    return id;
  }
  // Work on the host CPU, a queue of its own (the CPU optimizer update).
  int host(double seconds, char phase, std::string name) {
    if (host_cpu_ < 0) host_cpu_ = p_.queue("host_cpu", sim::QueueKind::serial, false, device_);
    emplace(host_cpu_, seconds, phase, -1);
    return named(std::move(name));
  }
  // `op` waits for `producer` when they are on different queues (a queue runs its ops in order).
  void data_dep(int op_id, int producer) {
    if (producer >= 0 && queue_of_[static_cast<std::size_t>(producer)] != queue_of_[static_cast<std::size_t>(op_id)])
      op(op_id).deps.push_back(producer);
  }
  int add_buffer(double bytes, MemCategory c, bool host = false) { return p_.add_buffer(bytes, c, host, device_); }
  // Ops from `first` on were copied in (sim/instances.hpp): their queues are noted, and the copy's last
  // compute op becomes the last one.
  void adopt(int first, int last_compute) {
    for (int i = first; i < ops(); ++i) queue_of_.push_back(static_cast<std::uint16_t>(op(i).queue));
    last_compute_ = last_compute;
  }

 private:
  ProgramOp& emplace(int queue, double seconds, char phase, int layer) {
    queue_of_.push_back(static_cast<std::uint16_t>(queue));
    p_.ops.emplace_back(queue, seconds);
    ProgramOp& o = p_.ops.back();
    o.use_begin = static_cast<std::uint32_t>(p_.uses.size());
    o.phase = phase;
    if (layer < -1 || layer > std::numeric_limits<std::int16_t>::max()) throw std::logic_error("layer " + std::to_string(layer) + " out of an op's range");
    o.layer = static_cast<std::int16_t>(layer);
    return o;
  }
  int named(std::string name) {
    if (names_) names_->push_back(std::move(name));
    return static_cast<int>(p_.ops.size()) - 1;
  }
  // A communication axis's queue is created on first use and remembered; the pipeline's queue is charged
  // with the compute stream's waits on the other stages.
  int queue(Axis axis) {
    int& q = queues_[static_cast<std::size_t>(axis)];
    if (q < 0) {
      q = p_.queue(to_string(axis), sim::QueueKind::serial, false, device_);
      if (axis == Axis::pp) p_.queues[static_cast<std::size_t>(q)].receives = true;
    }
    return q;
  }

  Program& p_;
  std::vector<std::string>* names_;
  int device_, compute_;
  int last_compute_ = -1;
  int d2h_ = -1, h2d_ = -1, d2h_link_ = -1, h2d_link_ = -1, both_links_ = -1, host_cpu_ = -1;
  std::array<int, kAxisCount> queues_{-1, -1, -1, -1, -1, -1};
  std::vector<std::uint16_t>& queue_of_ = thread_queue_of();
  std::array<std::pair<int, int>, 2> links_{std::pair{-1, -1}, std::pair{-1, -1}};  // per path level: out, in
};

struct Gather {
  int op = -1, buf = -1;
};

// What a layer's forward leaves for its backward.
struct ForwardLayer {
  std::vector<int> buf;       // per tensor: forward buffer (-1: none)
  std::vector<int> host_buf;  // per tensor: pinned host copy (-1: not offloaded)
  std::vector<int> d2h;       // per tensor: the D2H op
  int output_buf = -1;
  int last = -1;              // its last compute op
};

// A layer's weight-gradient pass, split off its backward (zero-bubble schedules): what it waits for and
// frees, gathered while the backward is emitted.
struct WeightPass {
  double seconds = 0, flops = 0;
  std::vector<int> deps, releases;
};

// What a forward pass of one micro-batch through one chunk leaves for its backward (and weight) pass.
struct ChunkRecord {
  std::vector<ForwardLayer> layers;  // per layer of the chunk
  std::vector<WeightPass> weights;   // per layer, with split weight gradients
  int input_buf = -1;                // the chunk's input (the embedding's output, or what was received)
  int logits = -1, head_buf = -1, stats = -1, head_input = -1;  // the head's (last chunk)
  // Transformer Engine's offload (SimOptions::te_offload): per layer, per tensor, the reload issued by the
  // backward of a later layer, and the device buffer it fills (-1: none).
  std::vector<std::vector<int>> reload_op, reload_buf;
};

struct BackwardLayer {
  Gather gather;             // its weights, gathered one layer ahead with pipelined collectives
  int iteration_start = -1;  // the op its backward iteration starts after
  int last = -1;             // its last compute op
  int reduce_scatter = -1;   // its gradients' reduce-scatter
  int grad_buf = -1;         // the unsharded gradients it reads, held until the scatter is done
};

// Transformer Engine's offload window over a pass (SimOptions::te_offload): a layer's device copies are
// held until the forward of the layer `gap` on, which waits for its D2H, and its reload is issued at the
// start of the backward of the layer `lookahead` on. With N of the pass's n layers offloading, TE's gap is
// n - N and its lookahead n - 1 - N (it offloads the first N, N < n); at least 1 and 0 here, so that a pass
// offloading every layer waits for each layer's copies at the next one and reloads it at its own backward.
struct TeWindow {
  std::int64_t gap = 1, lookahead = 0;
};

// A communication op emitted for a template op: readers wait for `head`; with comm/GEMM overlap the `rest`
// runs on behind the GEMM and only the end of the iteration waits for it.
struct Emitted {
  int head = -1, rest = -1;
};

// What one micro-batch sends across a pipeline boundary, either way: its activations (sequence-parallel:
// this tp rank's share), or their gradients.
double boundary_bytes(const StepGraph& g) {
  return g.sharded_tokens * static_cast<double>(g.model.d_model) * dtype_bytes(g.training.activation_dtype);
}

// One pipeline boundary crossing of one micro-batch: the buffer it lands in (on the receiving stage), the
// send (on the sending stage) and the op the receiver's pass starts with.
struct Crossing {
  int buf = -1, send = -1, recv = -1;
};

// What every stage's builder reads: the step, the plans of its layer templates, where its scans' loop
// bodies end, and the pipeline's crossings (each written by the two stages it joins).
struct BuildContext {
  const StepGraph& g;
  const System& sys;
  const SimOptions& opt;
  const Network& net;
  const Costs& costs;
  const std::vector<TemplatePlan>& plans;     // per (policy in use, layer template)
  const std::vector<std::size_t>& layer_plan;  // per layer: its plan
  const std::vector<std::size_t>& fwd_body_end;    // per layer: the layer after its forward loop body
  const std::vector<std::size_t>& bwd_body_first;  // per layer: the first layer of its backward loop body
  std::vector<Crossing>& forward_in;   // [micro-batch x chunks + k]: activations into chunk k (k >= 1)
  std::vector<Crossing>& backward_in;  // [micro-batch x chunks + k]: gradients into chunk k (k < chunks - 1)
  std::vector<std::string>* names;
};

// Working lists, kept per thread between steps for their capacity only: each function that uses one resets
// it first, so nothing passes between calls through them (a sweep builds thousands of steps per thread).
struct PendingCopy {
  std::size_t tensor;
  int after, src;
};
struct Scratch {
  std::vector<int> buf, h2d, grad, val_op, tails, op_id, prefetch;
  std::vector<char> lifted;
  std::vector<std::vector<int>> grad_ops, barrier;
  std::vector<PendingCopy> pending;
  std::vector<ChunkRecord> records;
  std::vector<BackwardLayer> bwd;
  std::vector<TemplatePlan> plans;
  std::vector<std::size_t> layer_plan;
  sim::LoopInstances loop;
  // Per stage: a layer's iterations across the passes of its chunk, one loop per (chunk, direction, layer),
  // indexed by micro-batch (StageBuilder::across_passes).
  std::vector<sim::LoopInstances> across;
  std::vector<int> inputs, left, kept_inputs, kept_left;
  std::vector<std::int64_t> reloaded;
};
Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// The ops of one pipeline stage (the whole step without pipelining): its passes in the schedule's order,
// then the optimizer.
class StageBuilder {
 public:
  StageBuilder(BuildContext& ctx, Program& prog, int stage)
      : c_(ctx), g_(ctx.g), opt_(ctx.opt), net_(ctx.net), costs_(ctx.costs), prog_(prog), stage_(stage),
        info_(ctx.g.stages[static_cast<std::size_t>(stage)]),
        w_(prog, ctx.sys, ctx.net, ctx.names, stage, ctx.opt.te_offload) {}

  // Returns, with ep_overlap, the forward and backward passes as emitted (for the combined 1F1B issue order).
  std::vector<sim::PassSpan> build(const std::vector<PipelineTask>& tasks) {
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
    start_across();
    std::vector<sim::PassSpan> passes;
    for (const PipelineTask& t : tasks) {
      const int k = info_.chunks[static_cast<std::size_t>(t.chunk)];
      const sim::PassSpan begin{t.pass == Pass::forward, t.merged_with_next, t.microbatch, w_.ops(), 0,
                                static_cast<int>(prog_.iterations.size()), 0};
      ChunkRecord& rec = records[static_cast<std::size_t>(t.microbatch) * info_.chunks.size() + static_cast<std::size_t>(t.chunk)];
      const bool sync = t.microbatch + 1 == g_.training.grad_accum;
      switch (t.pass) {
        case Pass::forward: previous_pass = forward_pass(t.microbatch, k, t.chunk, param_sync, rec, previous_pass); break;
        case Pass::backward: previous_pass = backward_pass(t.microbatch, k, t.chunk, sync, rec, done, previous_pass); break;
        case Pass::weight_grad: previous_pass = weight_pass(k, sync, rec, done); break;
      }
      if (opt_.ep_overlap && t.pass != Pass::weight_grad) {
        passes.push_back(begin);
        passes.back().end_op = w_.ops();
        passes.back().end_iteration = static_cast<int>(prog_.iterations.size());
      }
    }
    switch (opt_.optimizer_offload) {
      case OptimizerOffload::off: {
        if (opt_.parameter_offload) {
          streamed_update(done);
          break;
        }
        int opt = w_.compute(costs_.memory_s(info_.optimizer_update_bytes), true, 0, 'o', -1, "optimizer_update");
        for (int r : done) w_.op(opt).deps.push_back(r);
        break;
      }
      case OptimizerOffload::device: streamed_update(done); break;
      case OptimizerOffload::host: host_update(done); break;
    }
    return passes;
  }

 private:
  bool offloaded_optimizer() const { return opt_.optimizer_offload != OptimizerOffload::off; }
  // The optimizer works through the stage's state in one chunk per layer (at least one).
  double optimizer_chunks() const {
    std::int64_t layers = 0;
    for (int k : info_.chunks) layers += chunk(k).layers();
    return static_cast<double>(std::max<std::int64_t>(1, layers));
  }

  // What lives in host memory (the optimizer state, the parameters, or both) streamed through HBM for the
  // update: each chunk in, updated, out; a chunk comes in only once the one two before it has gone out, so at
  // most two are on the device.
  void streamed_update(const std::vector<int>& done) {
    const double n = optimizer_chunks(), update = info_.optimizer_update_bytes / n;
    const double state = offloaded_optimizer() ? info_.optimizer_bytes / n : 0;
    const double params = opt_.parameter_offload ? info_.parameter_bytes / n : 0;
    const char* what = state > 0 && params > 0 ? "optimizer state and parameters" : state > 0 ? "optimizer state" : "parameters";
    std::vector<int> out;
    for (int k = 0; k < static_cast<int>(n); ++k) {
      const int in = w_.copy(true, state + params, costs_.copy_s(state + params, true), -1, label_chunk((std::string(what) + " in").c_str(), k));
      w_.op(in).deps = done;
      if (k >= 2) w_.op(in).deps.push_back(out[static_cast<std::size_t>(k - 2)]);
      for (auto [bytes, cat] : {std::pair{state, MemCategory::optimizer_state}, {params, MemCategory::parameters}})
        if (bytes > 0) w_.op(in).allocs.push_back(w_.add_buffer(bytes, cat));
      const int up = w_.compute(costs_.memory_s(update), true, 0, 'o', -1, label_chunk("optimizer_update", k));
      w_.op(up).deps.push_back(in);
      out.push_back(w_.copy(false, state + params, costs_.copy_s(state + params, false), -1, label_chunk((std::string(what) + " out").c_str(), k)));
      w_.op(out.back()).deps = {up};
      for (int b : w_.op(in).allocs) w_.op(out.back()).releases.push_back(b);
    }
  }

  // CPU Adam on the host: each chunk's gradients out, the update on the host CPU at its memory bandwidth's
  // per-GPU share (the update touches the same bytes there), the updated parameters back in.
  void host_update(const std::vector<int>& done) {
    const double n = optimizer_chunks();
    const double cpu_bytes_per_s = c_.sys.host_cpu.memory_bandwidth_bytes_per_s / std::max(1, c_.sys.host_cpu.gpus_per_cpu);
    const double grads = info_.gradient_bytes / n, params = info_.parameter_bytes / n;
    for (int k = 0; k < static_cast<int>(n); ++k) {
      const int staged = w_.add_buffer(grads, MemCategory::offload_buffers, true);
      const int out = w_.copy(false, grads, costs_.copy_s(grads, false), -1, label_chunk("gradients out", k));
      w_.op(out).deps = done;
      w_.op(out).allocs = {staged};
      const int up = w_.host(info_.optimizer_update_bytes / n / cpu_bytes_per_s, 'o', label_chunk("host optimizer_update", k));
      w_.op(up).deps.push_back(out);
      w_.op(up).releases.push_back(staged);
      if (opt_.parameter_offload) continue;  // updated where they live
      const int in = w_.copy(true, params, costs_.copy_s(params, true), -1, label_chunk("parameters in", k));
      w_.op(in).deps = {up};
    }
  }

  const PipelineChunk& chunk(int k) const { return g_.chunks[static_cast<std::size_t>(k)]; }
  std::size_t chunks() const { return g_.chunks.size(); }
  Crossing& forward_in(int mb, int k) { return c_.forward_in[static_cast<std::size_t>(mb) * chunks() + static_cast<std::size_t>(k)]; }
  Crossing& backward_in(int mb, int k) { return c_.backward_in[static_cast<std::size_t>(mb) * chunks() + static_cast<std::size_t>(k)]; }
  const TemplatePlan& plan(std::int64_t l) const {
    return c_.plans[c_.layer_plan[static_cast<std::size_t>(l)]];
  }
  std::string label(const std::string& what, std::int64_t layer) const {
    return w_.naming() ? what + " L" + std::to_string(layer) : std::string();
  }
  std::string label(const char* prefix, const std::string& what, std::int64_t layer) const {
    return w_.naming() ? prefix + what + " L" + std::to_string(layer) : std::string();
  }
  std::string label_chunk(const char* what, int k) const {
    return w_.naming() ? std::string(what) + " chunk " + std::to_string(k) : std::string();
  }
  std::string label_mb(const char* what, int mb) const {
    return w_.naming() ? std::string(what) + " mb" + std::to_string(mb) : std::string();
  }
  std::size_t at(std::int64_t l) const { return static_cast<std::size_t>(l); }
  bool multi(AxisSet group) const { return g_.mesh.size(group) > 1; }
  // Some gradients are summed over more than one device: the dense ones, or the experts'.
  bool syncs() const { return multi(g_.grad_sync) || multi(g_.expert_grad_sync); }
  bool split_weights() const { return c_.plans.front().split_weight_grads; }
  // Layers of backward iterations a gradient reduce-scatter may run into: 1, or 2 with pipelined collectives.
  std::int64_t reduce_scatter_lag() const { return opt_.pipelined_collectives ? 2 : 1; }

  // Without LHS a collective is synchronous: it waits for the compute before it and the compute after it
  // waits for it. Libraries that issue it asynchronously themselves (the CP ring) overlap it either way.
  bool blocking(const CommDef& c) const { return !opt_.lhs && !c.async; }

  Emitted emit_comm(const CommDef& c, const CommCost& cost, char phase, std::int64_t layer, std::string name) {
    const CommKind kind = c.kind(phase == 'b');
    const bool overlap = opt_.tp_comm_overlap && c.axis == Axis::tp &&
                         (kind == CommKind::all_gather || kind == CommKind::reduce_scatter);
    const double head = overlap ? 1.0 / static_cast<double>(g_.mesh.size(Axis::tp)) : 1.0;
    Emitted e;
    e.head = w_.comm(c.axis, cost, head, phase, static_cast<int>(layer), name);
    if (overlap) e.rest = w_.comm(c.axis, cost, 1 - head, phase, static_cast<int>(layer), name + (w_.naming() ? " (overlapped)" : ""));
    return e;
  }

  // A communication of the embedding or head that turns buffer `from` into buffer `to` after `after`; an
  // identity direction is a free op on the compute stream.
  int transform(const CommDef& c, bool backward, int from, int to, int after, char phase, const std::string& name) {
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

  // The vocab tables' gradients this stage holds (the input table with the embedding, the unembedding
  // and final norm with the head; a tied table once), synced as one bucket.
  double table_grad_bytes(const PipelineChunk& c) const {
    return (c.embedding ? g_.embedding_grad_bytes : 0) + (c.head ? g_.head_grad_bytes_on(info_) : 0);
  }
  double table_grad_bytes() const {
    double bytes = 0;
    for (int k : info_.chunks) bytes += table_grad_bytes(chunk(k));
    return bytes;
  }
  // What is left of a table bucket after its reduce-scatter over the weight shards.
  double table_shard_bytes(double bytes) const { return bytes / static_cast<double>(g_.mesh.size(g_.dense_shard)); }

  // With a sharded optimizer each layer's updated parameter shard is all-gathered over the sync axes; the
  // next step's forward overlaps it (Megatron overlap_param_gather), so it is issued at the step's start and
  // each layer's weight gather waits for its bucket.
  // The table bucket (its tables and the final norm) comes first: the lookup's table gather waits for it.
  struct ParameterSync {
    int tables = -1;
    std::vector<int> layers;  // per layer (-1: none)
  };
  ParameterSync parameter_sync() {
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

  // A layer's weights, gathered over the weight shards; without resharding once per step (kept_weights_).
  Gather gather_layer(std::int64_t l, int after, char phase) {
    if (!opt_.reshard_weights && kept_weights_.empty()) kept_weights_.assign(at(g_.model.stack_layers()), Gather{});
    if (!opt_.reshard_weights && kept_weights_[at(l)].op >= 0) return kept_weights_[at(l)];
    const auto& t = g_.layer(l);
    const auto& p = plan(l);
    Gather ag;
    ag.buf = w_.add_buffer(t.gathered_dense_bytes + t.gathered_expert_bytes, MemCategory::gathered_weights);
    const double shard = t.gathered_dense_bytes / static_cast<double>(g_.mesh.size(g_.dense_shard)) +
                         t.gathered_expert_bytes / static_cast<double>(g_.mesh.size(g_.expert_shard));
    const int in = parameters_in(shard, after, static_cast<int>(l), label("parameters in", l));
    ag.op = w_.comm2(Axis::fsdp, p.gather, p.gather_experts, 1.0, phase, static_cast<int>(l),
                     label(phase == 'f' ? "all_gather" : "all_gather bwd", l));
    w_.op(ag.op).allocs = {ag.buf};
    gather_after(ag.op, in, after);
    if (!opt_.reshard_weights) kept_weights_[at(l)] = ag;
    return ag;
  }
  // The two tables are gathered where they are used: the input embedding for the lookup (then freed; its
  // gradient is a scatter that does not read it), the unembedding one layer ahead of the head.
  Gather gather_table(const char* name, int after) {
    const CommCost cost = net_.cost(CommKind::all_gather, g_.table_gathered_bytes, g_.dense_shard);
    const int in = parameters_in(table_shard_bytes(g_.table_gathered_bytes), after, -1, std::string("parameters in ") + name);
    Gather ag{w_.comm(Axis::fsdp, cost, 1.0, 'f', -1, name), w_.add_buffer(g_.table_gathered_bytes, MemCategory::gathered_weights)};
    w_.op(ag.op).allocs = {ag.buf};
    gather_after(ag.op, in, after);
    return ag;
  }

  // With the parameters in host memory, a weight gather starts from its shard copied in (MaxText
  // parameter_memory_host_offload, FSDP's CPU offload): the copy is issued where the gather would be, and
  // its buffer lives until the gather has sent it. Returns the copy (-1: parameters on the device).
  int parameters_in(double shard_bytes, int after, int layer, const std::string& name) {
    if (!opt_.parameter_offload || shard_bytes <= 0) return -1;
    const int in = w_.copy(true, shard_bytes, costs_.copy_s(shard_bytes, true), layer, w_.naming() ? name : std::string());
    if (after >= 0) w_.op(in).deps.push_back(after);
    w_.op(in).allocs = {w_.add_buffer(shard_bytes, MemCategory::parameters)};
    return in;
  }
  // A weight gather waits for its shard's copy (and frees it once sent), or else for `after`.
  void gather_after(int gather, int shard_in, int after) {
    if (shard_in >= 0) {
      w_.op(gather).deps.push_back(shard_in);
      w_.op(gather).releases = w_.op(shard_in).allocs;
    } else if (after >= 0) {
      w_.op(gather).deps.push_back(after);
    }
  }

  // A pass that starts from another stage's output: a free op on the compute stream that waits for it.
  int receive(Crossing& in, char phase, const char* what, int mb) {
    in.recv = w_.compute(0, false, 0, phase, -1, label_mb(what, mb));
    return in.recv;
  }
  // Sends buffer `from` (freed here once sent) to the stage of chunk `to_chunk`, where it lands in `in.buf`.
  void send(Crossing& in, int from, int to_chunk, int after, char phase, const char* what, int mb) {
    const int to = chunk(to_chunk).stage;
    in.send = w_.send(net_, net_.point_to_point(boundary_bytes(g_), Axis::pp, stage_, to), to, phase, label_mb(what, mb));
    w_.op(in.send).deps.push_back(after);
    w_.op(in.send).allocs.push_back(in.buf);
    w_.op(in.send).releases.push_back(from);
  }

  // The embedding lookup: its table gathered, and with tp the partial sums of this rank's vocab shard leave
  // over tp. Returns the op the first layer waits for; `rec.input_buf` holds its output.
  int embedding(ChunkRecord& rec, int after_sync) {
    const double act = dtype_bytes(g_.training.activation_dtype);
    const double T = g_.tokens, d = static_cast<double>(g_.model.d_model);
    const bool tp = multi(AxisSet{Axis::tp});
    const Gather embed = gather_table("all_gather embedding", after_sync);
    rec.input_buf = w_.add_buffer(g_.sharded_tokens * d * act, MemCategory::saved_activations);
    const int lookup_buf = tp ? w_.add_buffer(T * d * act, MemCategory::workspace) : rec.input_buf;
    int lookup = w_.compute(costs_.memory_s(2 * T * d * act), true, 0, 'f', -1, "embedding_lookup");
    w_.op(lookup).deps.push_back(embed.op);
    w_.op(lookup).allocs.push_back(lookup_buf);
    w_.op(lookup).releases.push_back(embed.buf);
    if (tp) return transform(g_.embed_exit, false, lookup_buf, rec.input_buf, lookup, 'f', "embedding_exit");
    return lookup;
  }

  // One micro-batch through chunk k: its input (looked up or received), its layers, then the head's forward
  // (the last chunk) or the send of its output to the next chunk's stage.
  // Returns the pass's first op.
  int forward_pass(int mb, int k, int slot, const ParameterSync& param_sync, ChunkRecord& rec, int previous_pass) {
    const PipelineChunk& c = chunk(k);
    const std::int64_t first = c.first_layer, n = c.layers();
    int layer_in_op;
    if (c.embedding) {
      layer_in_op = embedding(rec, param_sync.tables);
    } else {
      rec.input_buf = forward_in(mb, k).buf;
      layer_in_op = receive(forward_in(mb, k), 'f', "recv activations", mb);
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
        forward_layer(first, i, input_buf, fwd, barrier, sync, previous_pass, waits_on, frees);
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
    // The send waits for the chunk's last iteration to close (its copies and overlapped tails); a chunk
    // without layers passes its input on.
    Crossing& out = forward_in(mb, k + 1);
    send(out, input_buf, k + 1, n > 0 ? fwd[at(n - 1)].last : layer_in_op, 'f', "send activations", mb);
    for (auto& b : {barrier[at(n)], barrier[at(n) + 1]})
      for (int op : b) w_.op(out.send).deps.push_back(op);
    return layer_in_op;
  }

  // Final norm, unembedding and loss: the logits and what the loss keeps beside them until the backward
  // (TrainingSpec::loss_extra_bytes_per_logit: MaxText's fp32 exp and bf16 gradient, none for TE's fused loss).
  void head_forward(ChunkRecord& rec, const std::vector<ForwardLayer>& fwd, const std::vector<std::vector<int>>& barrier,
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
    w_.op(unembed).deps.push_back(head.op);
    w_.data_dep(unembed, head_in);
    int loss = w_.compute(costs_.memory_s(3 * g_.logits_bytes), true, 0, 'f', -1, "softmax_cross_entropy");
    rec.stats = -1;
    if (tp) {
      rec.stats = w_.comm(Axis::tp, costs_.comm(g_.loss_stats, false), 1.0, 'f', -1, "loss_all_reduce");
      w_.op(rec.stats).deps.push_back(loss);
    }
    rec.head_input = n > 0 ? fwd[n - 1].output_buf : rec.input_buf;  // what the head read: freed by its backward
  }

  // The head's backward: the gradient of the last layer's output. Returns the op it ends with; `grad`
  // receives the gradient buffer.
  int head_backward(const ChunkRecord& rec, int& grad) {
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

  // One micro-batch's backward through chunk k: from the loss (the last chunk) or the gradient received,
  // the layers in reverse, then the embedding's backward (the first chunk) or the send of the input's
  // gradient to the previous chunk's stage. Adds what the optimizer waits for to `done`.
  int backward_pass(int mb, int k, int slot, bool sync, ChunkRecord& rec, std::vector<int>& done, int previous_pass) {
    const PipelineChunk& c = chunk(k);
    const std::int64_t first = c.first_layer, n = c.layers(), last = c.end_layer - 1;
    int grad_carry, start;
    if (c.head) {
      start = head_backward(rec, grad_carry);
    } else {
      grad_carry = backward_in(mb, k).buf;
      start = receive(backward_in(mb, k), 'b', "recv gradients", mb);
    }
    auto& bwd = scratch_.bwd;
    bwd.assign(at(n), BackwardLayer{});
    if (split_weights()) rec.weights.resize(at(n));
    if (opt_.pipelined_collectives && n > 0) bwd[at(n - 1)].gather = gather_layer(last, previous_pass, 'b');
    std::vector<int> reduce_scatter(at(n), -1);
    const bool sync_layers = sync && syncs() && !split_weights();
    // The last iterations' scatters are due at the end of the pass: its final op waits for them and frees
    // their gradients (the embedding's scatter, or the send).
    const std::int64_t due = std::min(n, reduce_scatter_lag());
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
      backward_inputs(first, i, rec, bwd, grad_carry, start, sync, reloaded);
      const std::size_t had = done.size();
      // Those last iterations' reduce-scatters are given their gradients' release after the loop (below): a
      // copy across passes would copy that release too.
      sim::LoopInstances* across = i < due ? nullptr : across_passes(slot, 1, i);
      if (!copied_backward(first, i, step, bwd, grad_carry, reduce_scatter, done, across, mb, rec, reloaded)) {
        auto [grad, rs] = backward_layer(first, i, rec, bwd, grad_carry, start, sync, reloaded);
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
      for (std::int64_t i = 0; i < due && !split_weights(); ++i) {
        w_.op(bwd[at(i)].reduce_scatter).releases.push_back(bwd[at(i)].grad_buf);
      }
      if (c.head) head_table_gradients(c, start, sync, done);
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
    int embed_grad = w_.add_buffer(bucket, MemCategory::collective_buffers);
    int scatter = w_.compute(costs_.memory_s(2 * T * d * act), true, 0, 'b', -1, "embedding_bwd");
    w_.op(scatter).allocs.push_back(embed_grad);
    w_.op(scatter).releases.push_back(grad_carry);
    for (std::int64_t i = 0; i < due && !split_weights(); ++i) {
      w_.op(scatter).deps.push_back(bwd[at(i)].reduce_scatter);
      w_.op(scatter).releases.push_back(bwd[at(i)].grad_buf);
    }
    const int rs = table_reduce_scatter(bucket, scatter, embed_grad, "reduce_scatter embedding", done);
    if (sync && syncs()) {
      // Without overlap every bucket is issued once the backward pass is done.
      if (sync_layers && !opt_.dp_overlap)
        for (std::int64_t i = n - 1; i >= 0; --i) done.push_back(grad_sync(plan(first + i), reduce_scatter[at(i)], scatter, first + i));
      table_sync(bucket, rs, done);
    }
    return start;
  }

  // The head's table bucket on a stage without the embedding: scattered once the head's backward is done.
  void head_table_gradients(const PipelineChunk& c, int head_bwd, bool sync, std::vector<int>& done) {
    const double bucket = table_grad_bytes(c);
    int grad = w_.add_buffer(bucket, MemCategory::collective_buffers);
    w_.op(head_bwd).allocs.push_back(grad);
    const int rs = table_reduce_scatter(bucket, head_bwd, grad, "reduce_scatter unembedding", done);
    if (sync && multi(g_.grad_sync)) table_sync(bucket, rs, done);
  }
  // A table bucket's reduce-scatter over the weight shards once `after` is done, freeing `buffer`.
  int table_reduce_scatter(double bucket, int after, int buffer, const char* name, std::vector<int>& done) {
    int rs = w_.comm(Axis::fsdp, net_.cost(CommKind::reduce_scatter, bucket, g_.dense_shard), 1.0, 'b', -1, name);
    w_.op(rs).deps = {after};
    w_.op(rs).releases = {buffer};
    done.push_back(rs);
    return rs;
  }
  // Its shard summed over the gradient-sync axes (on the last micro-batch).
  void table_sync(double bucket, int rs, std::vector<int>& done) {
    const auto kind = g_.training.parallelism.sharded_optimizer ? CommKind::reduce_scatter : CommKind::all_reduce;
    done.push_back(grad_sync(net_.cost(kind, table_shard_bytes(bucket), g_.grad_sync), CommCost{}, rs, -1, -1));
  }

  // A zero-bubble schedule's weight-gradient pass over chunk k: each layer's weight-gradient dots as one op,
  // then its reduce-scatter (and, on the last micro-batch, its sync).
  int weight_pass(int k, bool sync, ChunkRecord& rec, std::vector<int>& done) {
    const PipelineChunk& c = chunk(k);
    int first_op = -1;
    for (std::int64_t i = c.layers() - 1; i >= 0; --i) {
      const std::int64_t l = c.first_layer + i;
      const auto& t = g_.layer(l);
      WeightPass& wp = rec.weights[at(i)];
      int grad_buf = w_.add_buffer(t.grad_dense_bytes + t.grad_expert_bytes, MemCategory::collective_buffers);
      int id = w_.compute(wp.seconds, false, wp.flops, 'w', static_cast<int>(l), label("weight_grads", l));
      if (first_op < 0) first_op = id;
      for (int d : wp.deps) w_.op(id).deps.push_back(d);
      w_.op(id).allocs.push_back(grad_buf);
      for (int b : wp.releases) w_.op(id).releases.push_back(b);
      const auto& p = plan(l);
      int rs = w_.comm2(Axis::fsdp, p.reduce_scatter, p.reduce_scatter_experts, 1.0, 'b', static_cast<int>(l), label("reduce_scatter", l));
      w_.op(rs).deps = {id};
      w_.op(rs).releases = {grad_buf};
      done.push_back(rs);
      if (sync && syncs()) done.push_back(grad_sync(p, rs, -1, l));
    }
    return first_op;
  }

  // One layer's gradient bucket summed over the data-parallel axes, after its reduce-scatter.
  int grad_sync(const TemplatePlan& p, int after_rs, int after, std::int64_t l) {
    return grad_sync(p.grad_sync, p.grad_sync_experts, after_rs, after, l);
  }
  int grad_sync(const CommCost& dense, const CommCost& experts, int after_rs, int after, std::int64_t l) {
    const char* what = g_.training.parallelism.sharded_optimizer ? "reduce_scatter grads" : "all_reduce grads";
    int id = w_.comm2(Axis::dp, dense, experts, 1.0, 'b', static_cast<int>(l),
                      l >= 0 ? label(what, l) : std::string(what) + " embedding");
    w_.op(id).deps.push_back(after_rs);
    if (after >= 0) w_.op(id).deps.push_back(after);
    return id;
  }

  // ---- Layer iterations copied rather than built (sim/instances.hpp). ----
  // An iteration is a function of what it reads (its inputs: buffers and ops of earlier iterations, the
  // body's shape) and of its layer's plan: where three iterations and the inputs of the next continue one
  // another with one plan, the next is the last one moved on. Not when naming ops (names carry the layer),
  // when weights are kept across micro-batches (their gathers are shared), or for split weight gradients.
  bool copying() const { return opt_.fast_forward && !w_.naming() && opt_.reshard_weights && !split_weights(); }
  // Layer l's plan offloads some tensor.
  bool offloads_any(std::int64_t l) const {
    const auto& placement = plan(l).placement;
    return std::find(placement.begin(), placement.end(), Placement::offload) != placement.end();
  }
  // XLA's latency-hiding scheduler places the offload copies (prefetches hoisted under a memory limit,
  // pipelined transfers); on Transformer Engine's schedule (te_offload) it does not.
  bool lhs_copies() const { return opt_.lhs && !opt_.te_offload; }
  TeWindow te_window(std::int64_t first, std::int64_t n) const {
    if (!opt_.te_offload) return {};
    std::int64_t offloading = 0;
    for (std::int64_t i = 0; i < n; ++i) offloading += offloads_any(first + i);
    return {std::max<std::int64_t>(1, n - offloading), std::max<std::int64_t>(0, n - 1 - offloading)};
  }
  // TE: the layer whose offloaded copies the forward of layer i waits for at its start (`gap` back) and
  // frees at its end (`gap - 1` back; not in the pass's last layer: the pass's end waits for the copies of
  // its last `gap` layers, which their D2H frees); -1: none.
  std::int64_t te_waits_on(std::int64_t first, std::int64_t i, const TeWindow& w) const {
    const std::int64_t s = i - w.gap;
    return opt_.te_offload && s >= 0 && offloads_any(first + s) ? s : -1;
  }
  std::int64_t te_frees(std::int64_t first, std::int64_t i, std::int64_t n, const TeWindow& w) const {
    const std::int64_t s = i + 1 - w.gap;
    return opt_.te_offload && s >= 0 && i + 1 < n && offloads_any(first + s) ? s : -1;
  }
  // Layer first + i and the up to six before it in the loop (`dir` +1: forward, -1: backward, which runs
  // the layers in reverse) have one plan, and at least three come before it: what a copy looks back on.
  bool same_plan_back(std::int64_t first, std::int64_t i, std::int64_t n, int dir) const {
    const std::int64_t back = dir > 0 ? i : n - 1 - i;  // iterations before this one
    if (back < 3) return false;
    for (std::int64_t k = 1; k <= std::min<std::int64_t>(6, back); ++k)
      if (c_.layer_plan[at(first + i - dir * k)] != c_.layer_plan[at(first + i)]) return false;
    return true;
  }

  // Layer i of a chunk is a function of what it reads whichever pass it is in, so once three of a chunk's
  // passes (one per micro-batch, in order) continue one another, the layer's next instance may be the last
  // one moved on, as within a pass: in a steady pipeline schedule the program between two passes of a chunk
  // is the same length each time. Worth recording only where a fourth pass can come (micro-batches >= 4).
  bool across_worthwhile() const { return copying() && g_.training.grad_accum >= 4; }
  std::size_t most_chunk_layers() const {
    std::int64_t most = 0;
    for (int k : info_.chunks) most = std::max(most, chunk(k).layers());
    return at(most);
  }
  void start_across() {
    if (!across_worthwhile()) return;
    auto& loops = scratch_.across;
    loops.resize(info_.chunks.size() * 2 * most_chunk_layers());
    for (auto& l : loops) l.start(static_cast<int>(g_.training.grad_accum));
  }
  // The loop of layer i of the chunk in slot `slot` of this stage, forward (0) or backward (1); none when
  // not worthwhile.
  sim::LoopInstances* across_passes(int slot, int direction, std::int64_t i) {
    if (!across_worthwhile()) return nullptr;
    const std::size_t at_slot = static_cast<std::size_t>(slot) * 2 + static_cast<std::size_t>(direction);
    return &scratch_.across[at_slot * most_chunk_layers() + at(i)];
  }
  // Records the iteration, built or copied, in its pass's loop and in its layer's loop across passes.
  void finish_iteration(sim::LoopInstances& loop, int i, sim::LoopInstances* across, int mb, const sim::Span& span) {
    if (across) {
      scratch_.kept_inputs = scratch_.inputs;
      scratch_.kept_left = scratch_.left;
      across->finish(mb, span, scratch_.kept_inputs, scratch_.kept_left);
    }
    loop.finish(i, span, scratch_.inputs, scratch_.left);
  }
  // Appends iteration i of the pass as a copy, from the pass's earlier iterations (when the plan allows)
  // or else from the same layer in the chunk's earlier passes; `left` receives what it leaves.
  bool copy_iteration(bool within, int i, sim::LoopInstances* across, int mb) {
    auto from = [&](sim::LoopInstances& loop, int at) {
      const int period = loop.period(prog_, at, scratch_.inputs);
      return period > 0 && loop.copy(prog_, at, period, scratch_.left);
    };
    return (within && from(scratch_.loop, i)) || (across && from(*across, mb));
  }

  void forward_inputs(std::int64_t first, std::int64_t i, int input_buf, const std::vector<ForwardLayer>& fwd,
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
  // What forward iteration i leaves: its record, the stream's last compute op, what it added to the next
  // two iterations' barriers (each list had `had` entries before it).
  void forward_left(std::int64_t i, const std::vector<ForwardLayer>& fwd, const std::vector<std::vector<int>>& barrier,
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
  bool copied_forward(std::int64_t first, std::int64_t i, std::vector<ForwardLayer>& fwd, std::vector<std::vector<int>>& barrier,
                      sim::LoopInstances* across, int mb) {
    if (!copying()) return false;
    const int begin = w_.ops();
    if (!copy_iteration(same_plan_back(first, i, static_cast<std::int64_t>(fwd.size()), 1), static_cast<int>(i), across, mb))
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

  void backward_inputs(std::int64_t first, std::int64_t i, const ChunkRecord& rec, const std::vector<BackwardLayer>& bwd,
                       int grad_in, int backward_start, bool last_microbatch, const std::vector<std::int64_t>& reloaded) {
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
               me.gather.op, me.gather.buf, due, due ? bwd[at(i + reduce_scatter_lag())].reduce_scatter : -1,
               due ? bwd[at(i + reduce_scatter_lag())].grad_buf : -1, static_cast<int>(body - i),
               body != i ? bwd[at(body)].iteration_start : -1, last_microbatch});
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
  // TE: the layers whose reloads the backward of layer i issues, the one needed soonest first: the layer
  // `lookahead` before it, and at the pass's first backward layer every layer less than `lookahead` from it.
  void te_reloaded_by(std::int64_t first, std::int64_t i, std::int64_t n, const TeWindow& te, std::vector<std::int64_t>& out) const {
    out.clear();
    if (!opt_.te_offload) return;
    const std::int64_t lowest = i - te.lookahead, highest = i == n - 1 ? i : lowest;
    for (std::int64_t s = highest; s >= std::max<std::int64_t>(0, lowest); --s)
      if (offloads_any(first + s)) out.push_back(s);
  }
  // What backward iteration i leaves: its record, the next layer's gather it issued, the gradient it
  // passes on, its reduce-scatter, the stream's last compute op, and what it added to `done` (from `had`).
  void backward_left(std::int64_t i, const std::vector<BackwardLayer>& bwd, int grad_out, int rs, const std::vector<int>& done,
                     std::size_t had, const ChunkRecord& rec, const std::vector<std::int64_t>& reloaded) {
    auto& left = scratch_.left;
    left.clear();
    if (!copying()) return;
    const BackwardLayer& me = bwd[at(i)];
    const Gather next = i >= 1 ? bwd[at(i - 1)].gather : Gather{};
    left.assign({me.iteration_start, me.last, me.reduce_scatter, me.grad_buf, me.gather.op, me.gather.buf, next.op, next.buf,
                 grad_out, rs, w_.last_compute(), static_cast<int>(done.size() - had)});
    left.insert(left.end(), done.begin() + static_cast<std::ptrdiff_t>(had), done.end());
    // TE: the reloads it issued, per layer reloaded (te_reloaded_by's order).
    for (std::int64_t s : reloaded)
      for (const auto* v : {&rec.reload_op[at(s)], &rec.reload_buf[at(s)]}) left.insert(left.end(), v->begin(), v->end());
  }
  bool copied_backward(std::int64_t first, std::int64_t i, int step, std::vector<BackwardLayer>& bwd, int& grad_carry,
                       std::vector<int>& reduce_scatter, std::vector<int>& done, sim::LoopInstances* across, int mb,
                       ChunkRecord& rec, const std::vector<std::int64_t>& reloaded) {
    if (!copying()) return false;
    // With pipelined collectives it also gathers the next layer's weights: that layer's plan too (the same
    // layer in another pass gathers the same one).
    const bool within = same_plan_back(first, i, static_cast<std::int64_t>(bwd.size()), -1) &&
                        !(i >= 1 && c_.layer_plan[at(first + i - 1)] != c_.layer_plan[at(first + i)]);
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
    const Gather next{*it++, *it++};
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

  // Layer first + i of a forward pass: fills fwd[i] (its lists keep their capacity between steps).
  // `barrier[i]`: what iteration i waits for; this layer adds its copies and overlap tails to later ones.
  void forward_layer(std::int64_t first, std::int64_t i, int input_buf, std::vector<ForwardLayer>& fwd,
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
        if (blocking(def.comm)) {
          if (w_.last_compute() >= 0) w_.op(id).deps.push_back(w_.last_compute());
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
        w_.op(id).deps.push_back(ag.op);
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
      w_.op(copy).priority = static_cast<int>(l);
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

  // TE: the reloads a layer's backward issues for the layers `reloaded` (te_reloaded_by), on the one H2D
  // stream in the order their tensors were saved, each after `after` (the work issued before that backward)
  // and its own D2H; each of the reloaded layer's readers waits for its tensor's reload alone.
  void issue_reloads(std::int64_t first, const std::vector<std::int64_t>& reloaded, ChunkRecord& rec, int after) {
    for (std::int64_t s : reloaded) {
      const std::int64_t l = first + s;
      const auto& p = plan(l);
      for (std::size_t k = 0; k < g_.layer(l).tensors.size(); ++k) {
        if (p.placement[k] != Placement::offload || p.last_read[k] < 0) continue;
        std::tie(rec.reload_op[at(s)][k], rec.reload_buf[at(s)][k]) = reload(l, k, rec.layers[at(s)], after);
      }
    }
  }
  // Tensor k of layer l copied back from host into a device buffer of its own, after `after` (-1: nothing)
  // and its D2H; the layer needed soonest goes first on a shared link. Returns the copy and the buffer.
  std::pair<int, int> reload(std::int64_t l, std::size_t k, const ForwardLayer& f, int after) {
    const auto& p = plan(l);
    const int dst = w_.add_buffer(p.kept_bytes[k], MemCategory::offload_buffers);
    const int copy = w_.copy(true, p.kept_bytes[k], p.h2d_s[k], static_cast<int>(l), label("h2d ", g_.layer(l).tensors[k].name, l));
    ProgramOp& c = w_.op(copy);
    c.allocs = {dst};
    c.releases = {f.host_buf[k]};
    if (after >= 0) c.deps.push_back(after);
    c.deps.push_back(f.d2h[k]);
    c.priority = static_cast<int>(g_.model.stack_layers() - l);
    return {copy, dst};
  }

  // Layer first + i's backward iteration. `backward_start`: the pass's first op (pipelined prefetches may
  // start from it); kept weights are freed by the last micro-batch's. Returns the gradient of its input and its reduce-scatter (-1 when its weight gradients
  // are left to a pass of their own, recorded in rec.weights).
  std::pair<int, int> backward_layer(std::int64_t first, std::int64_t i, ChunkRecord& rec, std::vector<BackwardLayer>& bwd,
                                     int grad_in, int backward_start, bool last_microbatch,
                                     const std::vector<std::int64_t>& reloaded) {
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
    // other; it may start once layer l+1 is done with its weights.
    if (opt_.pipelined_collectives) {
      if (i >= 1) bwd[at(i - 1)].gather = gather_layer(l - 1, i + 1 < n ? bwd[at(i + 1)].last : -1, 'b');
    } else {
      me.gather = gather_layer(l, iteration_start, 'b');
    }
    const Gather ag = me.gather;
    issue_reloads(first, reloaded, rec, iteration_start);

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
      std::tie(h2d[k], buf[k]) = reload(l, k, f, after);
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

    // The unsharded gradients: written here, or by the weight pass when it is split off.
    const int grad_buf = split ? -1 : w_.add_buffer(t.grad_dense_bytes + t.grad_expert_bytes, MemCategory::collective_buffers);
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
      w_.op(id).deps.push_back(ag.op);
      if (due) {
        w_.op(id).deps.push_back(due->reduce_scatter);
        w_.op(id).releases.push_back(due->grad_buf);
      }
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
        if (blocking(def.comm)) {
          if (w_.last_compute() >= 0) w_.op(id).deps.push_back(w_.last_compute());
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

  BuildContext& c_;
  const StepGraph& g_;
  const SimOptions& opt_;
  const Network& net_;
  const Costs& costs_;
  Program& prog_;
  const int stage_;
  const StepGraph::Stage& info_;
  Writer w_;
  Scratch& scratch_ = thread_scratch();
  std::vector<Gather> kept_weights_;  // per layer, without resharding: its one gather of the step
};

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
      for (std::size_t i = 0; i < T; ++i) plan_template(g.templates[i], *used[v], costs_, g, opt.lhs, plans_[v * T + i]);
    for (std::size_t d = 0; d < g.stages.size(); ++d) {
      double headroom = 0;
      for (std::size_t v : device_variants[d])
        for (std::size_t i = 0; i < T; ++i) headroom = std::max(headroom, plans_[v * T + i].backward_working_set_bytes);
      prog_.hbm_limit_bytes[d] = opt.memory_limit_slop * sys.gpu.hbm_bytes - headroom;
    }
    prog_.copy_interference = sys.efficiency.compute_slowdown_during_copy;
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
    // Each stage's passes were written without the others: join every receive to its send.
    for (auto* crossings : {&forward_in_, &backward_in_})
      for (const Crossing& c : *crossings)
        if (c.recv >= 0) prog_.ops[static_cast<std::size_t>(c.recv)].deps.push_back(c.send);
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

  // Event budget: a step larger than this would take seconds and gigabytes; refuse it up front. The op list
  // is reserved at an upper bound so that a thread's first step does not relocate it halfway.
  void reserve() {
    std::size_t ops_estimate = 0, ops_bound = 0;
    for (std::int64_t l = 0; l < g_.model.stack_layers(); ++l) {
      ops_estimate += 3 * g_.layer(l).ops.size() + 8;
      ops_bound += 5 * g_.layer(l).ops.size() + 3 * g_.layer(l).tensors.size() + 10;
    }
    constexpr std::size_t kMaxOps = 4'000'000;
    const double total_ops = static_cast<double>(ops_estimate) * static_cast<double>(g_.training.grad_accum);
    if (total_ops > kMaxOps)
      throw InputError("layers x grad_accum = " + std::to_string(g_.model.stack_layers()) + " x " +
                       std::to_string(g_.training.grad_accum) + " (the step would need about " +
                       std::to_string(static_cast<long long>(total_ops)) + " simulated ops; the budget is 4000000)");
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

void build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                   std::vector<std::string>* op_names, sim::Program& out) {
  out.clear();
  ProgramBuilder(g, sys, policy, opt, op_names, out).build();
}

sim::Program build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                           std::vector<std::string>* op_names) {
  sim::Program p;
  build_program(g, sys, policy, opt, op_names, p);
  return p;
}

}  // namespace hbmsim
