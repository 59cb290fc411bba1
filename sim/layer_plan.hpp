// What the policy and the schedule imply for one layer template, computed once per step and reused by
// every layer of that template: each tensor's placement, which forward ops the backward replays, the
// issue order of the forward and of one backward iteration, op durations, and the prefetch headroom.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/costs.hpp"
#include "sim/options.hpp"
#include "sim/policy.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

struct TemplatePlan {
  std::vector<Placement> placement;    // per tensor (internal tensors: remat)
  std::vector<bool> needed_in_bwd;     // read by some backward op
  std::vector<bool> replay;            // per op: replayed in the backward pass
  std::vector<int> producer;           // per tensor: op index, -1 for the layer input
  std::vector<int> last_fwd_use;       // per tensor: last forward op reading it (-1: none)
  std::vector<double> fwd_s, bwd_s;    // per op
  std::vector<double> dot_s;           // GEMMs: each of the two backward dots (input and weight gradient)
  std::vector<CommCost> fwd_comm, bwd_comm;  // communication ops: each direction's cost
  std::vector<int> fwd_lane, bwd_lane; // per op: ScheduleDag lane (compute, or 1 + the comm axis)
  std::vector<int> order;              // forward (and replay) issue order of the ops
  std::vector<bool> fwd_mem_bound;
  double backward_working_set_bytes = 0;  // transient peak of one backward iteration (prefetch headroom)
  CommCost gather, reduce_scatter;        // this layer's weight all-gather and gradient reduce-scatter
  CommCost gather_experts, reduce_scatter_experts;
  // Its gradient shards summed over the sync axes, and (sharded optimizer) the updated shards gathered back
  // at the step's start: the dense and expert parts apart where their sync axes differ (else all in the first).
  CommCost grad_sync, grad_sync_experts, param_sync, param_sync_experts;
  std::vector<double> kept_bytes;         // per tensor: its forward buffer and kept copy (fp8 where TE stores it so)
  std::vector<double> d2h_s, h2d_s;       // per tensor: copy time of its kept copy
  bool scheduled = false;  // LHS orders its ops by data dependencies (it has communication to hide)
  // The order waits for the reloads of offloaded tensors, issued at the loop body's start (not pipelined).
  bool reloads_in_order = false;
  // A GEMM's backward is two steps, the weight-gradient one run in a pass of its own (zero-bubble pipelines).
  bool split_weight_grads = false;
  // A GEMM's backward is two steps in program order, input gradient first, so that the collective of the input
  // gradient runs beside the weight-gradient GEMM (Transformer Engine's bulk overlap under Megatron).
  bool dgrad_first = false;
  // Megatron's delay_wgrad_compute (under ep_overlap): a GEMM's weight gradient waits until its module's
  // input-gradient chain is done (the MLP's just before the dispatch all-to-all's backward, the attention's at
  // the layer's end), so the all-to-all and the next layer's combine run beside weight-gradient GEMMs.
  bool delay_wgrad = false;

  // One backward iteration: replays of forward ops, and backward ops. In a scheduled layer (or with the
  // weight gradients split off) a GEMM's backward is two steps (input-gradient and weight-gradient dots).
  enum class Kind : std::uint8_t { replay, bwd, bwd_x, bwd_w };
  struct Step { Kind kind; std::size_t op; };
  std::vector<Step> steps;     // issue order
  std::vector<int> first_read, last_read;  // per tensor: the first / last step that reads its forward value (-1: none)
  std::vector<int> grad_last;  // per op: the last step that reads the gradients of its outputs

  double seconds(const Step& st) const;
  int lane(const Step& st) const { return st.kind == Kind::replay ? fwd_lane[st.op] : bwd_lane[st.op]; }
};

// What a step reads of the forward values: a replay its inputs; a backward its saved tensors; the input-
// gradient dot of a GEMM only the weights.
const std::vector<int>& step_reads(const OpDef& def, TemplatePlan::Kind k);

// Whether a layer's collective holds the compute stream (the compute before it and the compute after it wait for
// it): without LHS, and in Megatron's program order, unless a library issues it asynchronously (the CP ring), the
// expert all-to-all runs under ep_overlap, or it is a backward tp collective under tp_comm_overlap.
bool blocks_compute(const CommDef& c, bool backward, const SimOptions& opt);
// Whether Transformer Engine's userbuffers (tp_comm_overlap) split a collective going `kind`: a tp all-gather or
// reduce-scatter exposes one of tp chunks and hides the rest under the GEMM it pairs.
bool userbuffer_overlapped(const CommDef& c, CommKind kind, const SimOptions& opt);

// The lane of a communication axis in a ScheduleDag, and the host link's (offloaded tensors' reloads).
inline int comm_lane(Axis a) { return 1 + static_cast<int>(a); }
constexpr int kHostCopyLane = 1 + kAxisCount;

// Where each tensor of a layer lives under `policy` (internal tensors: remat, unless the policy keeps what the
// backward reads), which tensors the backward reads, and each tensor's producing op (-1: the layer input).
void place_tensors(const LayerTemplate& t, const Policy& policy, std::vector<Placement>& placement,
                   std::vector<bool>& needed_in_bwd, std::vector<int>& producer);

// Fills p.kept_bytes from p.placement and p.producer (set by place_tensors) and the training's
// fp8_saved_activations.
void plan_kept_bytes(const LayerTemplate& t, const StepGraph& g, TemplatePlan& p);

// Fills `out` (its lists keep their capacity: the builder reuses plans between steps).
void plan_template(const LayerTemplate& t, const Policy& policy, const Costs& c, const StepGraph& g,
                   const SimOptions& opt, TemplatePlan& out);

}  // namespace hbmsim
