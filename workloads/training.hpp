// Training configuration of one run: batch, sequence, dtypes and the parallel layout (a device mesh), validated.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "hwmodels/mesh.hpp"
#include "hwmodels/system.hpp"
#include "workloads/model.hpp"

namespace hbmsim {

// How context-parallel attention gets the other ranks' keys and values: a ring of send/recv steps, each
// overlapped with the attention over the chunk in hand (Megatron-Core's p2p), or one all-gather before the
// attention (MaxText's).
enum class CpExchange { ring, all_gather };
const char* to_string(CpExchange c);

// How expert parallelism moves tokens to their experts (Megatron's moe_token_dispatcher_type): alltoall sends
// one copy per chosen expert (also MaxText's ragged all-to-all); flex (DeepEP or HybridEP) one per destination
// GPU, and one per destination scale-up domain, forwarded inside it over the scale-up path.
enum class MoeDispatcher { alltoall, flex };

// The order a pipeline stage runs its micro-batches' forward and backward passes in. gpipe: every forward,
// then every backward; one_f_one_b: PipeDream-flush (Megatron's default; interleaved with vp > 1);
// zero_bubble_h1: 1F1B with each backward split into its input-gradient and weight-gradient passes, the
// weight passes moved into the bubble (ZB-H1, Qi et al. 2023), at 1F1B's activation memory.
enum class PipelineSchedule { gpipe, one_f_one_b, zero_bubble_h1 };
const char* to_string(PipelineSchedule s);  // "gpipe", "1f1b", "zb-h1"
PipelineSchedule parse_pipeline_schedule(const std::string& text, const std::string& where);

// How the layers are split into pipeline stages (Megatron-Core's options): an even split by default; given
// first/last stage layer counts, the middle stages split the rest evenly; the embedding and the loss may
// count as a layer each in the split (account_for_embedding/loss_in_pipeline_split).
// A layout (Megatron's pipeline_model_parallel_layout) gives every chunk's layers outright.
struct PipelineSplit {
  std::int64_t first_stage_layers = 0, last_stage_layers = 0;  // 0: from the even split
  bool embedding_as_layer = false, loss_as_layer = false;
  std::string layout;  // "Et*4|(t*4|)*14tmL": E embedding, t layer, m MTP, L loss, | between chunks ("": none)
};

struct Parallelism {
  std::int64_t fsdp = 0;  // 0: whatever the GPU count leaves after the other axes
  std::int64_t tp = 1, ep = 1, dp = 1, cp = 1, pp = 1;
  std::int64_t vp = 1;  // virtual pipeline stages (model chunks) per pp rank: Megatron's interleaving, MaxText's repeats
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  PipelineSplit split;
  MeshOrder order = maxtext_mesh_order();
  bool sequence_parallel = true;  // norm/residual activations sharded over tp; AG/RS around each block
  CpExchange cp_exchange = CpExchange::all_gather;
  bool sharded_optimizer = false;  // optimizer state sharded over the gradient-sync axes (distributed optimizer)
  // The context axis shards the weights too, FSDP-style (MaxText's logical rules put "context" among the
  // embed sharding axes); off: context ranks hold the same weights and sum their gradients (Megatron-Core).
  bool cp_shards_weights = true;
  // The expert axis shards the non-expert weights too, FSDP-style (MaxText's logical rules shard "embed" over
  // it); off: expert-parallel ranks hold those weights whole and sum their gradients with dp, and only the
  // experts' gradients stay within expert data parallelism (Megatron-Core's dense and expert DDP buffers).
  bool ep_shards_weights = true;
  MoeDispatcher moe_dispatcher = MoeDispatcher::alltoall;
  // SMs the flex dispatcher's kernels hold while they run (0: none modelled, as for NCCL's all-to-all).
  std::int64_t moe_dispatcher_sms = 0;
  // Megatron's MoE parallel folding with expert_tensor_parallel_size 1 under tp > 1: the routed experts are
  // whole on each GPU and partitioned over ep x cp x tp (the ep axis is the expert group divided by tp x cp);
  // each tp and cp rank routes its own sequence shard over that group, with no tp gather of the dispatched
  // tokens.
  bool experts_fold_tp = false;
  // Folded with an expert group smaller than tp x cp (ep 8 at tp 4 x cp 4): Megatron's rank order puts tp
  // innermost, then cp, so the group is tp times the first ep / tp cp ranks. The mesh splits cp there: its ep
  // axis is the inner part of cp (ep / tp ranks, inside the cp axis and outside tp), its cp axis the outer part.
  bool experts_inside_cp = false;
  // The GPUs of the expert group that are also tp and cp ranks besides the ep axis (1 unless folded).
  std::int64_t fold_span() const { return experts_fold_tp ? (experts_inside_cp ? tp : tp * cp) : 1; }
  // The GPUs the routed experts are partitioned over: the ep axis, times tp (x cp) when folded.
  std::int64_t expert_group() const { return ep * fold_span(); }
  // The mesh axes of the context-parallel ranks, and of the expert group (its all-to-all).
  AxisSet context_axes() const { return experts_inside_cp ? AxisSet{Axis::cp, Axis::ep} : AxisSet{Axis::cp}; }
  AxisSet expert_axes() const;

  Mesh mesh() const;  // needs fsdp resolved
};

// What a folded expert group spans, for reports: "ep x cp x tp", "ep x tp", or "tp x 2 of the 4 cp ranks".
std::string expert_group_span(const Parallelism& p);

struct TrainingSpec {
  std::int64_t gpus = 0;
  // The batch, in one of two meanings. MaxText: per_device_batch (per_device_batch_size; global batch =
  // per_device_batch x GPUs; a fraction is allowed when the sequences per model replica come out whole).
  // Megatron: micro_batch (sequences per model replica per micro-step) and global_batch (sequences per step),
  // gradient accumulation = global / (micro x data-parallel replicas).
  std::optional<double> per_device_batch;  // default 1 when micro_batch is not given
  std::int64_t micro_batch = 0;            // 0: from per_device_batch
  std::int64_t global_batch = 0;           // 0: from the rest
  std::int64_t seq_len = 4096;
  std::int64_t grad_accum = 1;  // micro-steps per step: gradient accumulation, or the pipeline's micro-batches
  // MaxText num_pipeline_microbatches: with pp > 1 and the MaxText batch, a replica's batch of the step
  // (per_device_batch x tp x cp x pp sequences) is split into this many micro-batches (0: pp of them).
  std::int64_t microbatches = 0;
  // MaxText use_batch_split_schedule/batch_split_factor (DeepSeek): each MoE layer runs as this many
  // micro-batches so that one micro-batch's all-to-all can overlap another's compute.
  std::int64_t moe_batch_split = 1;
  // Dropless routing's load imbalance: the tokens the busiest rank of an expert group receives in a MoE layer,
  // over the mean (1: balanced, as Megatron's --moe-router-force-load-balancing measures). Every rank waits for
  // the busiest at the combine all-to-all, so the device simulated does its work: the all-to-alls and the
  // experts' GEMMs and activation scale by it. Saved tensors keep the mean size: the busiest rank changes from
  // layer to layer, and memory sums over many.
  double moe_load_imbalance = 1;
  // Megatron's sync-free experts (moe_expert_rank_capacity_factor): the dispatched tokens' and the expert MLP's
  // buffers are allocated for this many times the balanced tokens (0: for the tokens routed, the mean as above).
  double moe_capacity_factor = 0;
  // Megatron's paged stash (moe_paged_stash_buffer_size_factor_cuda): the expert MLP's saved tensors live in a
  // page pool of this many times the balanced tokens rather than in the capacity-sized buffers (0: off).
  double moe_paged_stash = 0;
  // Multi-token prediction modules trained after the decoder layers (ModelSpec::mtp_layers), on the last
  // pipeline stage (Megatron mtp_num_layers, MaxText mtp_num_layers).
  std::int64_t mtp_layers = 0;
  // Transformer Engine keeps a low-precision linear layer's input quantized for its backward: a GEMM input kept
  // for the backward (or the sharded tensor all-gathered into one) is stored in that GEMM's format (fp8, mxfp8
  // or nvfp4, with its scales: dtype_bytes). Off: kept in the activation dtype (XLA, bf16 recipes).
  bool fp8_saved_activations = false;
  Parallelism parallelism;
  Dtype activation_dtype = Dtype::bf16;
  Dtype mlp_gemm_dtype = Dtype::bf16;        // --weights nvfp4/fp8: MaxText te_nvfp4 / fp8 recipes
  Dtype attention_gemm_dtype = Dtype::bf16;  // projections and attention stay bf16 unless asked
  Dtype weight_storage_dtype = Dtype::fp32;  // MaxText weight_dtype default float32
  double optimizer_bytes_per_param = 8;      // Adam: two fp32 moments
  // Megatron-Core's Muon (--optimizer muon): each 2-D layer weight (ModelSpec::layer_matrices) keeps one momentum
  // in the master weights' fp32 and its update is orthogonalized by muon_ns_steps Newton-Schulz iterations, each
  // rank of the data-parallel group doing its own matrices (the layer-wise distributed optimizer); the other
  // parameters keep Adam (muon_scalar_optimizer).
  bool muon = false;
  // muon_tp_mode blockwise (Megatron-Bridge's recipes): each tp rank orthogonalizes its own shard, nothing
  // gathered; off: duplicated (Megatron-Core's default), the whole matrix gathered and orthogonalized on every rank.
  bool muon_blockwise = false;
  std::int64_t muon_ns_steps = 5;            // Megatron's muon_num_ns_steps default
  double muon_bytes_per_param = 8;           // Megatron's: the fp32 master weight and the momentum
  double gradient_bytes_per_param = 4;       // fp32 gradient accumulation buffer
  // Megatron-Core's DDP: weight-gradient GEMMs accumulate into the gradient buffer (main_grad,
  // gradient_accumulation_fusion) and its reduce-scatter runs in place on that buffer
  // (param_and_grad_buffer.py), so a layer whose weights are whole on the device has no unsharded gradients
  // of its own. Off (XLA): a layer's gradients are made, then reduced and added.
  bool wgrad_into_grad_buffer = false;
  // Megatron-Core's experts scale their activation by the router's probabilities (the weighted SwiGLU of
  // experts.py, fed permuted_probs by every dispatcher), so the combine is a plain sum of the returned tokens
  // whose backward reads nothing back. Off (MaxText's unpermute): the combine weighs the expert outputs, and the
  // probabilities' gradient needs them kept for the backward (k x d_model per token and MoE layer).
  bool moe_probs_in_activation = false;
  // Bytes per logit the loss holds beyond the bf16 logits, from the unembedding to its backward. MaxText casts
  // the logits to fp32 and its cross-entropy is a custom VJP that saves exp(logits - max) in fp32 for the
  // backward: 4. The fp32 copy itself and the fp32 gradient need not exist (XLA's GPU fusion duplicates the
  // cheap convert into each consumer, and the gradient's cast back to bf16 fuses into the fusion that makes
  // it): a bf16 gradient, 2. Of the candidates (2: the exp recomputed too; 6; 8: fp32 copy and fp32 gradient),
  // the two MaxText memory measurements select 6: DeepSeek-V3 on GB200 peaks at 145.6 GiB (2 predicts 9% low,
  // 6 and 8 within 5%), and Llama 3 70B on 128 H100s at batch 2 x 8192 ran (8 predicts it out of memory).
  // Transformer Engine's fused cross-entropy (Megatron cross_entropy_fusion_impl "te", what Megatron-Bridge's
  // recipes set) writes the gradient into the logits in place: 0.
  double loss_extra_bytes_per_logit = 6;

  // Set by validate_training.
  std::int64_t replica_batch = 0;  // sequences one model replica (its tp x cp x pp devices) runs per micro-step

  // Data-parallel replicas of the model: the GPUs over the model-parallel axes.
  std::int64_t replicas() const;
  // Sequences per device per micro-step, averaged over the replica's devices: replica_batch / (tp x cp x pp)
  // (MaxText per_device_batch_size without pipelining).
  double device_batch() const;
  std::int64_t global_sequences() const { return replica_batch * replicas() * grad_accum; }
  double tokens_per_device_per_step() const { return device_batch() * static_cast<double>(seq_len * grad_accum); }
  // Tokens each device's column-parallel GEMMs see per micro-step: its replica's sequences over its
  // context shard (the whole tensor-parallel group's tokens).
  double layer_tokens() const;
};

// Fills fsdp and the batch, and checks every degree against the GPU count and the model; errors name the
// field ("tp = 3 (num_query_heads = 32 is not divisible by it)"). Once per spec: a pipeline's micro-batch count
// becomes its grad_accum, which a second call refuses (build_step_graph calls it on its own copy).
void validate_training(TrainingSpec& t, const ModelSpec& m);

}  // namespace hbmsim
