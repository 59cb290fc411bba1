// The ops and tensors of one training step on one device. Layers are instances of a scanned layer
// template (MaxText scan_layers=True); every activation carries its MaxText checkpoint name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "hwmodels/system.hpp"
#include "workloads/model.hpp"
#include "workloads/pipeline_split.hpp"
#include "workloads/training.hpp"

namespace hbmsim {

// MaxText checkpoint names that a remat policy can address, in layer order.
const std::vector<std::string>& checkpoint_names();
bool is_checkpoint_name(const std::string& name);
// Tensors without a MaxText name that Megatron's selective recompute modules drop (the norm outputs for
// layernorm, the experts' activation output for moe_act, the router's logits and the tokens dispatched to and
// returned from the experts for moe, an MLP's activation output for mlp and shared_experts). Only a policy that keeps what autograd saves
// (no_recompute, selective) keeps them, so only such a policy places them.
const std::vector<std::string>& module_tensor_names();
bool is_module_tensor_name(const std::string& name);
// A placement's key: a tensor name, or NAME@dense / NAME@moe for that kind of layer only (a dense MLP and a
// MoE layer's shared experts carry the same MaxText names; Megatron recomputes them as different modules).
struct TensorKey {
  std::string name, kind;  // kind "" : every layer
};
TensorKey split_tensor_key(const std::string& key);
// Why `key` names no tensor a policy can place ("unknown checkpoint name", "unknown layer kind ..."); "" if it does.
std::string tensor_key_error(const std::string& key);

// linear_attention: a Gated DeltaNet layer's chunked recurrence (ModelSpec::linear_attention_layer_ids).
enum class OpKind { gemm, attention, linear_attention, memory, comm };
const char* to_string(OpKind k);

enum class CommKind : std::uint8_t { none, all_gather, reduce_scatter, all_reduce, all_to_all, send_recv };
const char* to_string(CommKind k);

// How an expert all-to-all's copies of a token spread: `per_token` of `experts` experts, chosen alike and
// laid evenly over the group. Empty (per_token 0): one copy per chosen expert, what Megatron's alltoall
// dispatcher and MaxText's ragged all-to-all send. Given: one copy per destination GPU inside the sender's
// domain and one per destination domain beyond it, forwarded there over the scale-up path (DeepEP, HybridEP:
// Megatron's flex dispatcher). With group-limited routing (`groups` > 0) the experts are `groups` runs of
// consecutive ones and a token's are drawn from `groups_per_token` of them, alike among the groups.
struct TokenRouting {
  double experts = 0, per_token = 0;
  double groups = 0, groups_per_token = 0;
  bool deduplicated() const { return per_token > 0; }
};

// A communication op as data: what it does in each direction (none: an identity, free), the mesh axis whose
// queue issues it, the axes its group spans, and its buffer (the whole gathered buffer for all-gather,
// reduce-scatter and all-reduce; what each device sends for all-to-all and send/recv; for a deduplicated
// all-to-all, one copy per chosen expert before deduplication).
struct CommDef {
  CommKind forward = CommKind::none, backward = CommKind::none;
  Axis axis = Axis::tp;
  AxisSet group;
  double bytes = 0;  // in the format it travels in (a quantized gather's FP8, the loss statistics' fp32)
  bool async = false;  // issued asynchronously by its library even without LHS (the CP ring's send/recv)
  TokenRouting routing;
  // The backward collective's bytes where they differ from the forward's (a quantized all-gather's bf16
  // gradient reduce-scatter); < 0: the same.
  double backward_bytes = -1;
  CommKind kind(bool backward_pass) const { return backward_pass ? backward : forward; }
  double bytes_in(bool backward_pass) const { return backward_pass && backward_bytes >= 0 ? backward_bytes : bytes; }
};

struct TensorDef {
  std::string name;
  double bytes = 0;         // its buffer
  bool checkpoint = false;  // a MaxText checkpoint name a policy can save or offload
  // The buffer over the bytes kernels read and write (> 1: Megatron's expert buffers sized for a capacity).
  double padding = 1;
};

struct OpDef {
  std::string name;
  OpKind kind = OpKind::memory;
  Dtype dtype = Dtype::bf16;
  double flops = 0;      // forward, executed
  double bytes = 0;      // forward HBM traffic (inputs + weights + outputs); a collective's are comm.bytes
  double bwd_flops = 0;  // backward, executed
  double bwd_bytes = 0;
  CommDef comm;              // kind == comm
  std::vector<int> inputs;   // tensor indices in the template
  std::vector<int> outputs;
  std::vector<int> saved;    // forward tensors the backward op reads
};

struct LayerTemplate {
  std::string kind;  // "dense" or "moe"
  std::vector<TensorDef> tensors;  // tensors[0] is decoder_layer_input, produced by the previous layer
  std::vector<OpDef> ops;          // forward program order; backward runs them in reverse
  int output_tensor = -1;          // becomes the next layer's decoder_layer_input
  // Weight traffic of one layer, per device (this device's tensor-parallel share of the layer).
  double gathered_dense_bytes = 0;   // non-expert weights, gathered over StepGraph::dense_shard
  double gathered_expert_bytes = 0;  // local experts' weights, gathered over StepGraph::expert_shard
  double grad_dense_bytes = 0;       // unsharded gradients, reduce-scattered (weight storage dtype)
  double grad_expert_bytes = 0;
  // Where the weights are whole on the device (not gathered), the copy its GEMMs read: the part whose GEMM
  // dtype is not the storage dtype (XLA's bf16 cast of fp32 weights, Transformer Engine's quantized weights);
  // none where the GEMMs read the stored weights (Megatron's bf16 weights in bf16 GEMMs).
  double cast_dense_bytes = 0;
  double cast_expert_bytes = 0;

  int find_tensor(const std::string& name) const;
};

struct StepGraph {
  ModelSpec model;
  TrainingSpec training;
  std::vector<LayerTemplate> templates;
  std::vector<int> layer_template;  // per layer, index into templates
  ModelSpec::Flops model_flops;     // MaxText model FLOPs for the whole step, per device (averaged over stages)
  // Embedding and head (unembedding + loss), per micro-batch.
  double table_gathered_bytes = 0;   // one vocab table as the lookup or the head gathers it (this tp shard)
  double embedding_grad_bytes = 0;   // the input table's gradients
  double head_grad_bytes = 0;        // the unembedding table's and the final norm's
  // With tied tables (ModelSpec::tied_embeddings) a stage that also holds the lookup stores the one table and
  // its gradient once, in the embedding's bucket, so its head adds only the final norm's. A head on another
  // stage keeps its own copy of the table, as Megatron does (the copies' gradient sum is not modelled).
  double final_norm_grad_bytes = 0;
  double logits_bytes = 0;          // this device's vocab shard of the logits, activation dtype
  double unembed_flops = 0;
  // Pipeline parallelism: the chunks in model order (one, all layers, without it) and per stage what its
  // devices store.
  std::vector<PipelineChunk> chunks;
  struct Stage {
    std::vector<int> chunks;  // indices into StepGraph::chunks, in the order the stage holds them
    bool embedding = false;   // holds the model's first chunk (the lookup table)
    double local_params = 0;         // parameters each of its devices stores
    double local_expert_params = 0;  // of them, routed experts' (their optimizer shard has its own sync axes)
    double parameter_bytes = 0, optimizer_bytes = 0, gradient_bytes = 0;
    double optimizer_update_bytes = 0;  // HBM traffic of the Adam update
    // Muon (TrainingSpec::muon): the whole matrices (rows x cols, the count this device orthogonalizes, a mean
    // over the ranks that share them out) whose Newton-Schulz iterations it runs, the fp32 momentum bytes it
    // gathers over tp for them, and what the largest one's iteration holds at once.
    std::vector<WeightMatrix> muon_matrices;
    double muon_gather_bytes = 0, muon_working_bytes = 0;
  };
  std::vector<Stage> stages;
  Mesh mesh;
  // Bytes of a stored weight per byte of its gradient: the parameter all-gathers of a sharded optimizer send
  // the weights back in their storage dtype, where the syncs before them summed gradients.
  double weight_bytes_per_gradient_byte() const {
    return dtype_bytes(training.weight_storage_dtype) / training.gradient_bytes_per_param;
  }
  // Weights are sharded over these groups (gathered before use, gradients reduce-scattered back), and the
  // gradient shards are then summed over the sync groups: the axes that see other data but hold the same
  // weights (grad_sync for the non-expert weights and the tables, expert_grad_sync for the routed experts).
  // cp joins the shards or both syncs (Parallelism::cp_shards_weights), ep the dense shards or the dense
  // sync (Parallelism::ep_shards_weights); the experts are partitioned over ep either way.
  AxisSet dense_shard{Axis::fsdp, Axis::ep}, expert_shard{Axis::fsdp}, grad_sync{Axis::dp, Axis::cp},
      expert_grad_sync{Axis::dp, Axis::cp};
  // Embedding and head with tensor parallelism (vocab-parallel tables): the lookup's partial sums leave
  // over tp, the head's input is gathered over tp, and the loss reduces its statistics over tp.
  CommDef embed_exit, head_enter, loss_stats;
  double tokens = 0;          // layer_tokens: what the column-parallel GEMMs see per micro-step
  double sharded_tokens = 0;  // tokens of the sequence-parallel (norm/residual) activations

  // Whether the head's `stage` stores a copy of the input table for the MTP modules' lookups (it lacks the
  // embedding's own; the copies' gradient sum is not modelled, as for tied tables).
  bool mtp_table_copy(const Stage& stage) const { return model.mtp_layers > 0 && !stage.embedding; }
  // The head's table bucket on `stage` (see final_norm_grad_bytes), with the MTP's copy of the input table.
  double head_grad_bytes_on(const Stage& stage) const {
    const bool copy = mtp_table_copy(stage);
    return (model.tied_embeddings && (stage.embedding || copy) ? final_norm_grad_bytes : head_grad_bytes) +
           (copy ? embedding_grad_bytes : 0);
  }
  const LayerTemplate& layer(std::int64_t i) const { return templates[static_cast<std::size_t>(layer_template[static_cast<std::size_t>(i)])]; }
  // Device bytes one layer's weights take for its GEMMs: gathered over their shards, or where they are whole
  // their cast copy (LayerTemplate::cast_dense_bytes).
  double weight_buffer_bytes(const LayerTemplate& t) const;
  // Device bytes of a layer's unsharded gradients before their reduce-scatter (`bytes` of them); none where
  // its weights are whole and the gradients go straight into the gradient buffer
  // (TrainingSpec::wgrad_into_grad_buffer). The same for a table's bucket, with the non-expert weights' shards.
  double grad_buffer_bytes(const LayerTemplate& t) const;
  double table_grad_buffer_bytes(double bucket) const;
  // Device bytes of a vocab table as the lookup or the head reads it: gathered, or whole and its cast copy.
  double table_buffer_bytes() const;
  // Bytes of one checkpoint-named tensor in one layer of the given kind (0 when absent).
  double tensor_bytes(const std::string& name, const std::string& kind = "") const;
};

// Validates `training` against `model` (filling fsdp) and builds the step.
StepGraph build_step_graph(const ModelSpec& model, TrainingSpec training);

// One layer template as a Boost.Graph DAG: vertices are ops, edges are tensors flowing between them.
using OpGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, int, int>;
OpGraph layer_dag(const LayerTemplate& t);
std::string layer_dot(const LayerTemplate& t, const std::string& title);

}  // namespace hbmsim
