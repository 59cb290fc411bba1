// One pipeline stage's ops (the whole step without pipelining), and the records its passes leave one
// another. The member functions live by concept: the stage's frame (resident state, parameter sync and
// weight gathers, crossings, the embedding and tables, gradient syncs, the optimizer) in stage_builder.cpp,
// the forward in stage_forward.cpp, the backward in stage_backward.cpp, layer iterations copied rather than
// built in stage_copies.cpp.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/combined_1f1b.hpp"
#include "sim/comm.hpp"
#include "sim/costs.hpp"
#include "sim/instances.hpp"
#include "sim/layer_plan.hpp"
#include "sim/op_writer.hpp"
#include "sim/options.hpp"
#include "sim/pipeline_schedule.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim::build {

using Kind = TemplatePlan::Kind;

// Host-link priority classes (a lower class is served first, sharing within it). A pass's copies rank by its
// place among the stage's passes of its kind (the k-th forward's D2H and the k-th backward's reloads share
// rank k), so a later pass never takes the link from an earlier one: ranked by layer alone, the next
// micro-batches' first layers overtook the one whose last layers a pipeline send waits for (54% slower on
// twice the network; notes/monotonicity.md). Within a rank each layer's copies take a block of kCopyClasses,
// in the order the passes need them: D2H the forward's earlier layer first, H2D the layer the backward
// reaches first. Within its block a reload ranks by the first backward step that reads it, so the link
// brings back what is needed first rather than splitting itself evenly over the layer's tensors (mechanism 1).
constexpr int kCopyClasses = 1024;
// A pass's place among the stage's passes of its kind, and how many layers its chunk has (its blocks).
struct CopyRank {
  int pass = 0;
  std::int64_t layers = 0;
};
int copy_priority(CopyRank r, std::int64_t block, int within);  // stage_backward.cpp
// Layer i of the chunk (from its first).
inline int d2h_priority(CopyRank r, std::int64_t i) { return copy_priority(r, i, 0); }
inline int h2d_priority(CopyRank r, std::int64_t i, int first_read) { return copy_priority(r, r.layers - i, first_read); }

// A weight gather: its op, the gathered buffer, and with the parameters in host memory the shard copied in
// for it (-1: none), which the op that waits for the gather frees.
struct Gather {
  int op = -1, buf = -1, shard = -1;
};

// A reduce-scatter and the unsharded gradients it reads, until a later op waits for it and frees them.
struct Scatter {
  int op = -1, buf = -1;
};

// A reduce-scatter is waited for, and its gradients freed, at the program point `lag` scatters after it was
// issued (reduce_scatter_lag(); FSDP2's compute stream waits for the previous reduce-scatter at each
// post-backward). Moves into `out` the scatters at the front of `in_flight` (oldest first) that are due at a
// point with `issued` more scatters issued after the list's last.
void take_due(std::vector<Scatter>& in_flight, std::size_t issued, std::size_t lag, std::vector<Scatter>& out);

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
double boundary_bytes(const StepGraph& g);

// One pipeline boundary crossing of one micro-batch: the buffer it lands in (on the receiving stage), the
// send (on the sending stage), the op the receiver's pass starts with, and the receiver's op at which it
// posts the receive (-1: at the step's start). A send is a rendezvous: NCCL moves nothing before the
// receive is posted, and Megatron creates the landing tensor in that call, so the send waits for `posted`.
struct Crossing {
  int buf = -1, send = -1, recv = -1, posted = -1;
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
  std::vector<Scatter> due_scatters;
};
Scratch& thread_scratch();  // this thread's

// The ops of one pipeline stage (the whole step without pipelining): its passes in the schedule's order,
// then the optimizer.
class StageBuilder {
 public:
  StageBuilder(BuildContext& ctx, Program& prog, int stage)
      : c_(ctx), g_(ctx.g), opt_(ctx.opt), net_(ctx.net), costs_(ctx.costs), prog_(prog), stage_(stage),
        info_(ctx.g.stages[static_cast<std::size_t>(stage)]),
        w_(prog, ctx.sys, ctx.net, ctx.names, stage, ctx.opt.te_offload) {}

  // Returns, with ep_overlap, the forward and backward passes as emitted (for the combined 1F1B issue order).
  std::vector<sim::PassSpan> build(const std::vector<PipelineTask>& tasks);

 private:
  bool offloaded_optimizer() const { return opt_.optimizer_offload != OptimizerOffload::off; }
  // The optimizer works through the stage's state in one chunk per layer (at least one).
  double optimizer_chunks() const;

  // What lives in host memory (the optimizer state, the parameters, or both) streamed through HBM for the
  // update: each chunk in, updated, out; a chunk comes in only once the one two before it has gone out, so at
  // most two are on the device.
  void streamed_update(const std::vector<int>& done);

  // CPU Adam on the host: each chunk's gradients out, the update on the host CPU at its memory bandwidth's
  // per-GPU share (the update touches the same bytes there), the updated parameters back in.
  void host_update(const std::vector<int>& done);

  // Muon's Newton-Schulz iterations before the update (StepGraph::Stage::muon_matrices): the momentum of the
  // matrices split over tp gathered, then one compute op of every iteration's three GEMMs. Returns what the
  // update waits for: that op, or `done` where the stage has no Muon matrices.
  std::vector<int> muon_iterations(const std::vector<int>& done);

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
  std::int64_t reduce_scatter_lag() const { return opt_.reduce_scatter_lag(); }

  bool blocking(const CommDef& c, bool backward) const { return blocks_compute(c, backward, opt_); }

  Emitted emit_comm(const CommDef& c, const CommCost& cost, char phase, std::int64_t layer, std::string name);

  // A communication of the embedding or head that turns buffer `from` into buffer `to` after `after`; an
  // identity direction is a free op on the compute stream.
  int transform(const CommDef& c, bool backward, int from, int to, int after, char phase, const std::string& name);

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
  ParameterSync parameter_sync();

  // A layer's weights, gathered over the weight shards; without resharding once per step (kept_weights_).
  Gather gather_layer(std::int64_t l, int after, char phase);
  // The two tables are gathered where they are used: the input embedding for the lookup (then freed; its
  // gradient is a scatter that does not read it), the unembedding one layer ahead of the head.
  Gather gather_table(const char* name, int after);

  // With the parameters in host memory, a weight gather starts from its shard copied in (MaxText
  // parameter_memory_host_offload, FSDP's CPU offload): the copy is issued where the gather would be, into
  // the buffer it sets as ag.shard, which lives until the op that waits for the gather (wait_gather). Returns
  // the copy (-1: parameters on the device).
  int parameters_in(double shard_bytes, int after, int layer, const std::string& name, Gather& ag);
  // A weight gather waits for its shard's copy, or else is issued once `after` completes, where its buffers
  // come alive (OpWriter::issue).
  void gather_after(const Gather& ag, int shard_in, int after, char phase, int layer, const std::string& name);
  // Op `id` waits for the gather and frees its shard: the program point where the gather is done (XLA's
  // all-gather-done, FSDP's wait for the unshard), so the shard's life does not follow the network's speed.
  void wait_gather(int id, const Gather& ag) {
    w_.op(id).deps.push_back(ag.op);
    if (ag.shard >= 0) w_.op(id).releases.push_back(ag.shard);
  }

  // A pass that starts from another stage's output: a free op on the compute stream that waits for it. Its
  // receive is posted at `posted` (Crossing::posted).
  int receive(Crossing& in, int posted, char phase, const char* what, int mb) {
    in.recv = w_.compute(0, false, 0, phase, -1, label_mb(what, mb));
    in.posted = posted;
    return in.recv;
  }
  // The send pass t (over chunk k) ends with, or -1.
  int sent_by(const PipelineTask& t, int k);
  // The stage's compute goes on only once pass t's send is done: right after t with blocking p2p
  // (SimOptions::blocking_p2p), before the stage's next pass that way with overlapped p2p. Returns the op that waits.
  int wait_for_send(int send, const PipelineTask& t);
  // Overlapped p2p: before pass t, the stage waits for its last send the same way (`unwaited`: per direction,
  // forward and backward), as Megatron waits for a step's p2p handles before its next forward or backward
  // step and XLA for a collective-permute before the next loop iteration. Clears what it waited for.
  struct SentBy {
    int op = -1;        // the send (-1: none)
    PipelineTask task;  // the pass that sent it
  };
  void overlapped_send_wait(const PipelineTask& t, std::array<SentBy, 2>& unwaited);
  // Without program_order (XLA) the buffer overlapped send `sent` carries is freed by `wait`, the op that waits
  // for the send, rather than by the send.
  void free_sent_at(int wait, int sent);
  // Sends buffer `from` (freed once sent, or where the send is waited for: free_sent_at) to the stage of chunk
  // `to_chunk`, where it lands in `in.buf`.
  void send(Crossing& in, int from, int to_chunk, int after, char phase, const char* what, int mb);

  // The embedding lookup: its table gathered, and with tp the partial sums of this rank's vocab shard leave
  // over tp. Returns the op the first layer waits for; `rec.input_buf` holds its output. The gather is issued
  // where a first layer's is, once the stage's previous pass is done (-1: at the step's start), and waits for
  // the table's parameter sync (-1: none); without resharding only the first pass gathers, and the table is kept
  // until the last micro-batch's lookup (kept_table_).
  int embedding(ChunkRecord& rec, int after_sync, int previous_pass, bool last_microbatch);

  // One micro-batch through chunk k: its input (looked up or received), its layers, then the head's forward
  // (the last chunk) or the send of its output to the next chunk's stage.
  // `rank`: its place among the stage's forwards (CopyRank); `posted`: where its receive is posted (build()).
  // Returns the pass's first op.
  int forward_pass(int mb, int rank, int k, int slot, const ParameterSync& param_sync, ChunkRecord& rec, int previous_pass,
                   int posted);

  // Final norm, unembedding and loss: the logits and what the loss keeps beside them until the backward
  // (TrainingSpec::loss_extra_bytes_per_logit: MaxText's fp32 exp and bf16 gradient, none for TE's fused loss).
  void head_forward(ChunkRecord& rec, const std::vector<ForwardLayer>& fwd, const std::vector<std::vector<int>>& barrier,
                    int chunk_start);

  // The head's backward: the gradient of the last layer's output. Returns the op it ends with; `grad`
  // receives the gradient buffer.
  int head_backward(const ChunkRecord& rec, int& grad);

  // One micro-batch's backward through chunk k: from the loss (the last chunk) or the gradient received,
  // the layers in reverse, then the embedding's backward (the first chunk) or the send of the input's
  // gradient to the previous chunk's stage. Adds what the optimizer waits for to `done`. `rank`: its place
  // among the stage's backwards (CopyRank); `posted` as for the forward; `scattering` as for weight_pass.
  int backward_pass(int mb, int rank, int k, int slot, bool sync, ChunkRecord& rec, std::vector<int>& done, int previous_pass,
                    int posted, std::vector<Scatter>& scattering);

  // The head's table bucket on a stage without the embedding: scattered once the head's backward is done. The
  // caller frees the bucket where a later op waits for the returned scatter.
  Scatter head_table_gradients(const PipelineChunk& c, int head_bwd, bool sync, std::vector<int>& done);
  // A table bucket's reduce-scatter over the weight shards once `after` is done (the caller frees the bucket).
  int table_reduce_scatter(double bucket, int after, const char* name, std::vector<int>& done);
  // Its shard summed over the gradient-sync axes (on the last micro-batch).
  void table_sync(double bucket, int rs, std::vector<int>& done);

  // A zero-bubble schedule's weight-gradient pass over chunk k: each layer's weight-gradient dots as one op,
  // then its reduce-scatter (and, on the last micro-batch, its sync). `scattering`: the stage's scatters not yet
  // waited for, carried from one weight pass to the next.
  int weight_pass(int k, bool sync, ChunkRecord& rec, std::vector<int>& done, std::vector<Scatter>& scattering);

  // Op `op` waits for the scatter and frees the gradients it read.
  void wait_for(int op, const Scatter& s) {
    w_.op(op).deps.push_back(s.op);
    w_.op(op).releases.push_back(s.buf);
  }

  // One layer's gradient bucket summed over the data-parallel axes, after its reduce-scatter.
  int grad_sync(const TemplatePlan& p, int after_rs, int after, std::int64_t l);
  int grad_sync(const CommCost& dense, const CommCost& experts, int after_rs, int after, std::int64_t l);

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
  bool same_plan_back(std::int64_t first, std::int64_t i, std::int64_t n, int dir) const;
  // The period at which layer first + i may copy the pass's earlier iterations: 0 where same_plan_back holds
  // (periods 1 and 2 are tried), P (2 .. kMaxPeriod) where the plans repeat every P layers (from one layer
  // ahead to six back each has the plan of the layer P before it, and 3P layers come before); -1: none.
  int copy_period(std::int64_t first, std::int64_t i, std::int64_t n, int dir) const;

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
  void start_across();
  // The loop of layer i of the chunk in slot `slot` of this stage, forward (0) or backward (1); none when
  // not worthwhile.
  sim::LoopInstances* across_passes(int slot, int direction, std::int64_t i);
  // Records the iteration, built or copied, in its pass's loop and in its layer's loop across passes.
  void finish_iteration(sim::LoopInstances& loop, int i, sim::LoopInstances* across, int mb, const sim::Span& span);
  // Appends iteration i of the pass as a copy, from the pass's earlier iterations (at copy_period `within`,
  // -1: not) or else from the same layer in the chunk's earlier passes; `left` receives what it leaves.
  bool copy_iteration(int within, int i, sim::LoopInstances* across, int mb);

  void forward_inputs(std::int64_t first, std::int64_t i, int input_buf, const std::vector<ForwardLayer>& fwd,
                      const std::vector<std::vector<int>>& barrier, int sync, int previous_pass, std::int64_t waits_on,
                      std::int64_t frees);
  // What forward iteration i leaves: its record, the stream's last compute op, what it added to the next
  // two iterations' barriers (each list had `had` entries before it).
  void forward_left(std::int64_t i, const std::vector<ForwardLayer>& fwd, const std::vector<std::vector<int>>& barrier,
                    const std::array<std::size_t, 2>& had);
  bool copied_forward(std::int64_t first, std::int64_t i, std::vector<ForwardLayer>& fwd, std::vector<std::vector<int>>& barrier,
                      sim::LoopInstances* across, int mb);

  // What backward iteration i reads, the scatters carried from the stage's previous pass that it waits for among them.
  void backward_inputs(std::int64_t first, std::int64_t i, const ChunkRecord& rec, const std::vector<BackwardLayer>& bwd,
                       int grad_in, int backward_start, bool last_microbatch, const std::vector<std::int64_t>& reloaded,
                       const std::vector<Scatter>& carried);
  // TE: the layers whose reloads the backward of layer i issues, the one needed soonest first: the layer
  // `lookahead` before it, and at the pass's first backward layer every layer less than `lookahead` from it.
  void te_reloaded_by(std::int64_t first, std::int64_t i, std::int64_t n, const TeWindow& te, std::vector<std::int64_t>& out) const;
  // What backward iteration i leaves: its record, the next layer's gather it issued, the gradient it
  // passes on, its reduce-scatter, the stream's last compute op, and what it added to `done` (from `had`).
  void backward_left(std::int64_t i, const std::vector<BackwardLayer>& bwd, int grad_out, int rs, const std::vector<int>& done,
                     std::size_t had, const ChunkRecord& rec, const std::vector<std::int64_t>& reloaded);
  bool copied_backward(std::int64_t first, std::int64_t i, int step, std::vector<BackwardLayer>& bwd, int& grad_carry,
                       std::vector<int>& reduce_scatter, std::vector<int>& done, sim::LoopInstances* across, int mb,
                       ChunkRecord& rec, const std::vector<std::int64_t>& reloaded);

  // Layer first + i of a forward pass: fills fwd[i] (its lists keep their capacity between steps).
  // `barrier[i]`: what iteration i waits for; this layer adds its copies and overlap tails to later ones.
  void forward_layer(CopyRank rank, std::int64_t first, std::int64_t i, int input_buf, std::vector<ForwardLayer>& fwd,
                     std::vector<std::vector<int>>& barrier, int param_sync, int previous_pass, std::int64_t waits_on,
                     std::int64_t frees);

  // TE: the reloads a layer's backward issues for the layers `reloaded` (te_reloaded_by), on the one H2D
  // stream in the order their tensors were saved, each after `after` (the work issued before that backward)
  // and its own D2H; each of the reloaded layer's readers waits for its tensor's reload alone.
  void issue_reloads(CopyRank rank, std::int64_t first, const std::vector<std::int64_t>& reloaded, ChunkRecord& rec, int after);
  // Tensor k of layer first + i copied back from host into a device buffer of its own, after `after` (-1:
  // nothing) and its D2H; the layer needed soonest goes first on a shared link (h2d_priority). Returns the
  // copy and the buffer.
  std::pair<int, int> reload(CopyRank rank, std::int64_t first, std::int64_t i, std::size_t k, const ForwardLayer& f, int after);

  // Layer first + i's backward iteration. `backward_start`: the pass's first op (pipelined prefetches may
  // start from it); kept weights are freed by the last micro-batch's; `carried`: the stage's earlier pass's
  // reduce-scatters it waits for, freeing their gradients, where none of this pass's is due yet. Returns the gradient of its input and its reduce-scatter (-1 when its weight gradients
  // are left to a pass of their own, recorded in rec.weights).
  std::pair<int, int> backward_layer(CopyRank rank, std::int64_t first, std::int64_t i, ChunkRecord& rec, std::vector<BackwardLayer>& bwd,
                                     int grad_in, int backward_start, bool last_microbatch,
                                     const std::vector<std::int64_t>& reloaded, const std::vector<Scatter>& carried);

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
  Gather kept_table_;                 // the same for the input embedding's table
};

}  // namespace hbmsim::build
