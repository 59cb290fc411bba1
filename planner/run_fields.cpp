#include "planner/run_fields.hpp"

#include <charconv>
#include <cmath>

namespace hbmsim {

namespace {

using C = RunConfig;

// name, flag, help (the default is added from a default RunConfig), member, check.
const std::vector<RunField> kFields = {
    {"system", "--system", "Built-in system id or system JSON file", &C::system},
    {"model", "--model", "Built-in model id, model JSON or HuggingFace config.json", &C::model},
    {"gpus", "--gpus", "Number of GPUs", &C::gpus, FieldCheck::positive},
    {"batch", "--batch",
     "Per-device batch (MaxText per_device_batch_size; global batch = batch x GPUs; a fraction when batch x tp x cp "
     "is whole; 1 when micro_batch is not given either)",
     &C::batch, FieldCheck::positive},
    {"micro_batch", "--micro-batch",
     "Megatron micro-batch: sequences per model replica per micro-step (instead of --batch; 0: not given)",
     &C::micro_batch, FieldCheck::non_negative},
    {"global_batch", "--global-batch",
     "Sequences per step; sets the gradient accumulation (global / (sequences per replica x replicas); 0: not given)",
     &C::global_batch, FieldCheck::non_negative},
    {"seq", "--seq", "Sequence length", &C::seq, FieldCheck::positive},
    {"grad_accum", "--grad-accum", "Gradient accumulation steps", &C::grad_accum, FieldCheck::positive},
    {"fsdp", "--fsdp", "FSDP degree (0: the GPUs left after tp, ep, dp, cp, pp)", &C::fsdp, FieldCheck::non_negative},
    {"tp", "--tp", "Tensor parallel degree", &C::tp, FieldCheck::positive},
    {"ep", "--ep", "Expert parallel degree", &C::ep, FieldCheck::positive},
    {"dp", "--dp", "Data parallel (replica) degree: weights replicated, gradients summed across", &C::dp, FieldCheck::positive},
    {"cp", "--cp", "Context parallel degree (sequence split, causally load-balanced)", &C::cp, FieldCheck::positive},
    {"pp", "--pp", "Pipeline parallel degree: stages simulated as devices joined by send/recv", &C::pp, FieldCheck::positive},
    {"vp", "--vp",
     "Virtual pipeline stages (model chunks) per pp rank: Megatron's interleaved 1F1B, MaxText's pipeline repeats",
     &C::vp, FieldCheck::positive},
    {"pp_schedule", "--pp-schedule",
     "Pipeline schedule: 1f1b (interleaved with vp > 1), gpipe, or zb-h1 (zero-bubble, weight gradients split off)",
     &C::pp_schedule},
    {"pp_p2p", "--pp-p2p",
     "Pipeline sends: overlapped (a receive posted as the pass before starts; the sender waits for a send only before its next pass the same way), blocking "
     "(each send batched with the receive after it and waited for at both ends: Megatron's non-interleaved schedule; "
     "vp = 1 only), or auto (blocking for framework megatron without a virtual pipeline, else "
     "overlapped)",
     &C::pp_p2p},
    {"microbatches", "--microbatches",
     "With pp > 1 and --batch: micro-batches a replica's step is split into (MaxText num_pipeline_microbatches; 0: pp)",
     &C::microbatches, FieldCheck::non_negative},
    {"first_stage_layers", "--first-stage-layers",
     "Layers on the first pipeline stage, the middle stages splitting the rest evenly (0: an even split)",
     &C::first_stage_layers, FieldCheck::non_negative},
    {"last_stage_layers", "--last-stage-layers", "Layers on the last pipeline stage (0: an even split)",
     &C::last_stage_layers, FieldCheck::non_negative},
    {"embedding_as_layer", "--embedding-as-layer",
     "The embedding counts as a layer in the even pipeline split (Megatron account_for_embedding_in_pipeline_split)",
     &C::embedding_as_layer},
    {"loss_as_layer", "--loss-as-layer",
     "The head and loss count as a layer in the even pipeline split (Megatron account_for_loss_in_pipeline_split)",
     &C::loss_as_layer},
    {"pipeline_layout", "--pipeline-layout",
     "Megatron pipeline_model_parallel_layout: chunks split by |, E embedding, t layer, m an MTP module (as many "
     "as mtp_layers, in the last chunk), L loss, X*N repeats (e.g. Et*4|(t*4|)*14tmL); every chunk's layers outright",
     &C::pipeline_layout},
    {"mesh_order", "--mesh-order",
     "Device mesh order, outermost first: maxtext (dp,pp,fsdp,cp,tp,ep), megatron (pp,dp,fsdp,ep,cp,tp), a list, "
     "or auto (the framework's)",
     &C::mesh_order},
    {"sequence_parallel", "--sequence-parallel",
     "With tp: norm/residual activations sharded over tp, all-gather/reduce-scatter around each block (off: all-reduce)",
     &C::sequence_parallel},
    {"cp_exchange", "--cp-exchange",
     "How context parallelism exchanges keys and values: all_gather (MaxText), ring (Megatron p2p, overlapped), or "
     "auto (the framework's)",
     &C::cp_exchange},
    {"cp_shards_weights", "--cp-shards-weights",
     "The context axis shards the weights FSDP-style (MaxText, and Megatron-FSDP: fsdp > 1 under framework "
     "megatron); off: context ranks hold them whole and sum their gradients with dp (Megatron-Core's DDP and "
     "distributed optimizer); auto: the framework's",
     &C::cp_shards_weights},
    {"ep_shards_weights", "--ep-shards-weights",
     "The expert axis shards the non-expert weights FSDP-style (MaxText, and Megatron-FSDP: fsdp > 1 under "
     "framework megatron); off: expert-parallel ranks hold them whole and sum their gradients with dp, the "
     "experts' gradients only over expert data parallelism (Megatron-Core's DDP and distributed optimizer); auto: "
     "the framework's",
     &C::ep_shards_weights},
    {"moe_dispatcher", "--moe-dispatcher",
     "How ep moves tokens to their experts (Megatron's moe_token_dispatcher_type): alltoall (one copy per chosen "
     "expert; MaxText's ragged all-to-all too) or flex (DeepEP, HybridEP: one copy per destination GPU and one "
     "per destination scale-up domain, forwarded inside it over the scale-up path)",
     &C::moe_dispatcher},
    {"moe_dispatcher_sms", "--moe-dispatcher-sms",
     "SMs the flex dispatcher's dispatch and combine kernels hold while they run (Megatron "
     "moe_flex_dispatcher_num_sms, formerly moe_deepep_num_sms / moe_hybridep_num_sms; the 26.08 performance recipes "
     "set 32, 16 on B200): compute kernels beside them run on the other SMs, at (gpu.sms - this) / gpu.sms of their "
     "speed (memory-bound kernels keep theirs). 0: Megatron-Core's default, 20 (DeepEP's). Only with moe_dispatcher "
     "flex (NCCL's all-to-all SMs are not modelled) and a system that states gpu.sms",
     &C::moe_dispatcher_sms, FieldCheck::non_negative},
    {"expert_tp", "--expert-tp",
     "Expert tensor parallelism (Megatron expert_tensor_parallel_size): 0 (as tp: each tp rank holds a slice of "
     "every local expert) or 1 with tp > 1 (MoE parallel folding: experts whole, partitioned over an expert group "
     "of ep GPUs that spans tp and cp, ep a multiple of tp x cp, or inside them: tp times a divisor of cp; each "
     "rank routes its own sequence shard)",
     &C::expert_tp, FieldCheck::non_negative},
    {"grad_reduce_dtype", "--grad-reduce-dtype",
     "The gradient buffer's dtype and its reductions' (Megatron's grad_reduce_in_fp32): fp32 (MaxText; Megatron-LM "
     "with bf16) or bf16 (Megatron-Bridge's and NeMo's performance recipes set grad_reduce_in_fp32 off)",
     &C::grad_reduce_dtype},
    {"optimizer_moments_dtype", "--optimizer-moments-dtype",
     "Adam's two moments' dtype: fp32, or bf16 (Megatron's precision-aware optimizer with exp_avg_dtype and "
     "exp_avg_sq_dtype bf16, as Megatron-Bridge's DeepSeek-V3 recipes set: 4 bytes per parameter less optimizer "
     "state; the fp32 master weights stay)",
     &C::optimizer_moments_dtype},
    {"optimizer", "--optimizer",
     "adam, or muon: Megatron-Core's Muon (--optimizer muon; with sharded_optimizer its layer-wise distributed "
     "optimizer) for every 2-D layer weight, Adam for the embedding, head, norms and biases. A Muon weight keeps one "
     "fp32 momentum beside its fp32 master copy (8 bytes per parameter against Adam's 12); before the update each "
     "device runs 5 Newton-Schulz iterations (three GEMMs each, as bf16 GEMMs: muon_fp32_matmul_prec medium) on the "
     "whole of each matrix it owns (fc1 fused, q, k and v apart), a matrix split over tp gathered first and "
     "orthogonalized on every tp rank (muon_tp_mode duplicated). Needs framework megatron, no fsdp, fp32 moments "
     "and no optimizer or parameter offload",
     &C::optimizer},
    {"muon_tp_mode", "--muon-tp-mode",
     "How Muon treats a matrix split over tp (Megatron's muon_tp_mode): duplicated (Megatron-Core's default: the whole "
     "matrix's fp32 momentum gathered over tp and orthogonalized on every tp rank) or blockwise (Megatron-Bridge's "
     "recipes: each rank orthogonalizes its own shard, nothing gathered). Only with optimizer muon",
     &C::muon_tp_mode},
    {"framework", "--framework",
     "Training state per parameter: maxtext (fp32 weights and gradients, Adam moments 8 bytes) or megatron (bf16 "
     "weights, fp32 main gradients unless grad_reduce_dtype is bf16, fp32 master weights with the moments in the optimizer: 12 bytes); the loss "
     "keeps its fp32 exp and a bf16 gradient beside the bf16 logits (maxtext) or works in place in them "
     "(megatron: Transformer Engine's fused cross-entropy); offloaded activations are copied on XLA's schedule "
     "(maxtext: lhs and pipelined_transfers) or on Transformer Engine's CPU-offload schedule (megatron: each "
     "copy direction one stream, of N offloaded layers out of n a layer kept on device until the forward n - N "
     "layers on and reloaded from the backward n - 1 - N layers ahead); a layer's ops run as XLA's latency-hiding "
     "scheduler orders them (maxtext, with lhs) or in program order (megatron: no such scheduler, lhs does not "
     "apply; a collective holds the compute stream unless a library overlaps it: the CP ring, the expert "
     "all-to-all under ep_overlap, tp under tp_comm_overlap); recompute replays only what the backward reads "
     "(maxtext: XLA's rematerialization) or the checkpointed function whole (megatron: PyTorch's checkpoint); a "
     "MoE combine keeps the expert outputs for the backward (maxtext: its unpermute weighs them) or nothing "
     "(megatron: the experts scale their activation by the router's probabilities); it also sets what mesh_order, cp_exchange, "
     "cp_shards_weights and ep_shards_weights mean when auto (their default): Megatron-Core's rank order, ring "
     "and whole weights on context and expert ranks, or MaxText's",
     &C::framework},
    {"sharded_optimizer", "--sharded-optimizer",
     "Optimizer state sharded over the gradient-sync axes, dp (x cp when cp does not shard weights, and for the "
     "non-expert weights x ep when ep does not shard them) (Megatron distributed optimizer): gradients "
     "reduce-scattered, parameters all-gathered",
     &C::sharded_optimizer},
    {"tp_comm_overlap", "--tp-comm-overlap",
     "TP all-gathers/reduce-scatters overlapped chunk by chunk with their GEMM (TE userbuffers, XLA collective matmul)",
     &C::tp_comm_overlap},
    {"dp_overlap", "--dp-overlap", "Gradient sync over dp x cp bucketed per layer during the backward (off: after it)",
     &C::dp_overlap},
    {"ep_overlap", "--ep-overlap",
     "Megatron's expert-parallel all-to-all overlap (overlap_moe_expert_parallel_comm, combined 1F1B): a forward and "
     "a backward of different micro-batches run layer by layer together, each one's all-to-alls beside the other's "
     "compute (MoE with ep > 1; 1f1b, interleaved when pp > 1; no full recompute, no offload)",
     &C::ep_overlap},
    {"delay_wgrad", "--delay-wgrad",
     "Megatron's delay_wgrad_compute (needs ep_overlap and framework megatron): each module's weight-gradient GEMMs "
     "after its input-gradient chain, the experts' before the dispatch all-to-all's backward, the attention's at the "
     "layer's end, so those all-to-alls run beside them",
     &C::delay_wgrad},
    {"reshard_weights", "--reshard-weights",
     "FSDP gathers a layer's weights for every micro-batch's forward and backward and frees them after use (off: once "
     "per step, kept until the layer's last backward, and the input embedding's table until the last micro-batch's "
     "lookup, as PyTorch FSDP reshard_after_forward=False)",
     &C::reshard_weights},
    {"moe_batch_split", "--moe-batch-split",
     "MoE layers as this many micro-batches, so one's all-to-all overlaps another's compute under LHS",
     &C::moe_batch_split, FieldCheck::positive},
    {"moe_load_imbalance", "--moe-load-imbalance",
     "Dropless routing's imbalance: the tokens the busiest rank of an expert group receives in a MoE layer over the "
     "mean, >= 1 (1: balanced, as Megatron's --moe-router-force-load-balancing benchmarks run); every rank waits for "
     "the busiest, so the all-to-alls and the experts' GEMMs take this much longer (memory: the mean)",
     &C::moe_load_imbalance, FieldCheck::positive},
    {"moe_capacity_factor", "--moe-capacity-factor",
     "Megatron's moe_expert_rank_capacity_factor (sync-free experts: HybridEP, framework megatron): the dispatched "
     "tokens' buffers and the expert MLP's tensors are sized for this many times the balanced tokens, >= "
     "moe_load_imbalance (Megatron reruns a step whose busiest rank overflows them); the GEMMs still run the tokens "
     "routed. 0: none (buffers of the tokens routed)",
     &C::moe_capacity_factor, FieldCheck::non_negative},
    {"moe_paged_stash", "--moe-paged-stash",
     "Megatron's moe_paged_stash with this CUDA buffer factor (moe_paged_stash_buffer_size_factor_cuda; Megatron's "
     "default 1.1, the 26.08 recipes 1.2): the expert MLP's saved inputs and activations are packed into pages of a "
     "pool this many times the balanced tokens, so they keep that size instead of moe_capacity_factor's (which it "
     "needs); no activation offload with it. 0: off",
     &C::moe_paged_stash, FieldCheck::non_negative},
    {"mtp_layers", "--mtp-layers",
     "Multi-token prediction modules trained after the decoder layers, on the last pipeline stage (DeepSeek-V3's "
     "MTP; Megatron and MaxText mtp_num_layers): each a decoder layer of the last layer's kind, two input norms, "
     "eh_proj (2 d x d) and another pass through the shared head and loss; that stage also stores the input "
     "embedding table (Megatron)",
     &C::mtp_layers, FieldCheck::non_negative},
    {"weights", "--weights",
     "MLP GEMM dtype: bf16, fp8 (per-tensor scaling: delayed or current), mxfp8 (a scale per 32 elements; "
     "Blackwell), nvfp4",
     &C::weights},
    {"attention_dtype", "--attention-dtype", "Attention/projection GEMM dtype", &C::attention_dtype},
    {"policy", "--policy",
     "full, minimal, minimal_with_context, save_qkv_proj, qkv_proj_offloaded, minimal_offloaded (MaxText's), "
     "no_recompute (what autograd saves: Megatron's default), selective (no_recompute with the core attention "
     "recomputed: Megatron's selective recompute), custom", &C::policy},
    {"stage_policies", "--stage-policies",
     "With pp > 1: a policy preset per stage, comma-separated (the first stage may offload what the last keeps; "
     "empty: policy on every stage); tensor overrides apply to all",
     &C::stage_policies},
    {"layer_policies", "--layer-policies",
     "Layer ranges with a policy of their own, comma-separated FIRST-LAST:PRESET (model layers from 0, inclusive; "
     "e.g. 0-39:minimal_offloaded); the other layers take policy; tensor overrides apply to all",
     &C::layer_policies},
    {"offload_layers", "--offload-layers",
     "The first N layers send to host what the policy keeps on device (Megatron cpu_offloading_num_layers)",
     &C::offload_layers, FieldCheck::non_negative},
    {"recompute_layers", "--recompute-layers",
     "The first N layers of every pipeline chunk fully recomputed, all of a chunk with fewer (Megatron "
     "recompute_num_layers, method block)",
     &C::recompute_layers, FieldCheck::non_negative},
    {"fp8_saved_activations", "--fp8-saved-activations",
     "A low-precision GEMM's input kept for the backward is stored in the GEMM's format: fp8, 1 byte per element "
     "(one scale per tensor); mxfp8, 1 byte and a scale byte per 32; nvfp4, half a byte and an FP8 scale byte per "
     "16 (Transformer Engine's FP8, MXFP8 and NVFP4 recipes; off: the activation dtype); with sequence parallelism "
     "the norm's output is quantized before it is all-gathered over tp, so the gather moves that format too",
     &C::fp8_saved_activations},
    {"optimizer_offload", "--optimizer-offload",
     "Optimizer state in pinned host memory: off; device (streamed through HBM and updated on the GPU, MaxText "
     "optimizer_memory_host_offload); host (updated by the host CPU at its memory bandwidth, gradients out and "
     "parameters back over the host link, ZeRO-Offload)",
     &C::optimizer_offload},
    {"parameter_offload", "--parameter-offload",
     "Parameters in pinned host memory: each weight gather starts from its shard copied in, the update streams "
     "them through HBM (MaxText parameter_memory_host_offload, FSDP CPUOffloadPolicy)",
     &C::parameter_offload},
    {"lhs", "--lhs", "XLA latency-hiding scheduler (framework maxtext; megatron runs in program order)", &C::lhs},
    {"pipelined_transfers", "--pipelined-transfers", "XLA pipelined host offloading", &C::pipelined_transfers},
    {"pipelined_collectives", "--pipelined-collectives", "FSDP all-gathers one layer ahead", &C::pipelined_collectives},
    {"double_buffering", "--double-buffering",
     "XLA while-loop double buffering (two layers per scan body, so transfers cross one layer boundary)",
     &C::double_buffering},
    {"memory_limit_slop", "--memory-limit-slop", "Fraction of HBM the LHS may plan for", &C::memory_limit_slop,
     FieldCheck::fraction},
    {"max_ops", "--max-ops",
     "Simulated-op budget: a step estimated to need more ops is refused before it is built (each op costs about "
     "160 bytes and 0.5 us; 4 M ops: about 0.7 GB and 2 s)",
     &C::max_ops, FieldCheck::positive},
    {"host_link_bytes_per_s", "--host-link-bw", "What-if: host-link bytes/s per GPU per direction",
     &C::host_link_bytes_per_s, FieldCheck::positive},
    {"scale_up_bytes_per_s", "--scale-up-bw", "What-if: scale-up (NVLink) bytes/s per GPU per direction",
     &C::scale_up_bytes_per_s, FieldCheck::positive},
    {"scale_out_bytes_per_s", "--scale-out-bw", "What-if: scale-out (NIC) bytes/s per GPU per direction",
     &C::scale_out_bytes_per_s, FieldCheck::positive},
    {"hbm_bytes", "--hbm-bytes", "What-if: HBM capacity in bytes", &C::hbm_bytes, FieldCheck::positive},
    {"hbm_bandwidth_bytes_per_s", "--hbm-bw", "What-if: HBM bandwidth in bytes/s (memory-bound kernels and device copies)",
     &C::hbm_bandwidth_bytes_per_s, FieldCheck::positive},
    {"host_memory_bytes", "--host-memory-bytes",
     "What-if: host CPU memory in bytes (its pinned share per GPU holds offloaded tensors and state)",
     &C::host_memory_bytes, FieldCheck::positive},
    {"bf16_flops_per_s", "--bf16-flops", "What-if: dense BF16 tensor-core FLOP/s per GPU (the other formats' peaks scale with it)",
     &C::bf16_flops_per_s, FieldCheck::positive},
    {"calibration", "--calibration", "Calibration profile JSON or built-in profile name (empty: datasheet figures)",
     &C::calibration},
};

}  // namespace

std::int64_t parse_int_text(const std::string& v, const std::string& where) {
  std::int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec == std::errc::result_out_of_range) throw InputError(where + " = " + v + " (out of range)");
  if (ec != std::errc() || ptr != v.data() + v.size()) throw InputError(where + " = \"" + v + "\" (expected an integer)");
  return out;
}

double parse_double_text(const std::string& v, const std::string& where) {
  try {
    std::size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size()) throw std::invalid_argument("trailing");
    if (!std::isfinite(d)) throw InputError(where + " = " + v + " (must be finite)");
    return d;
  } catch (const InputError&) {
    throw;
  } catch (const std::out_of_range&) {
    throw InputError(where + " = " + v + " (out of the range of a double)");
  } catch (const std::exception&) {
    throw InputError(where + " = \"" + v + "\" (expected a number)");
  }
}

namespace {
// The on/off spellings the CLI reads (nullopt: none of them).
std::optional<bool> on_off_text(const std::string& v) {
  if (v == "on" || v == "true" || v == "1" || v == "yes") return true;
  if (v == "off" || v == "false" || v == "0" || v == "no") return false;
  return std::nullopt;
}
}  // namespace

bool parse_bool_text(const std::string& v, const std::string& where) {
  if (const auto b = on_off_text(v)) return *b;
  throw InputError(where + " = \"" + v + "\" (expected on or off)");
}

Switch parse_switch_text(const std::string& v, const std::string& where) {
  if (v == "auto") return Switch{};
  if (const auto b = on_off_text(v)) return Switch(*b);
  throw InputError(where + " = \"" + v + "\" (expected on, off or auto)");
}

const std::vector<RunField>& run_fields() { return kFields; }

const RunField* find_run_field(std::string_view name) {
  for (const auto& f : kFields)
    if (f.name == name) return &f;
  return nullptr;
}

nlohmann::json run_fields_json() {
  auto out = nlohmann::json::array();
  for (const auto& f : kFields)
    out.push_back({{"name", f.name}, {"flag", f.flag}, {"type", f.type()}, {"default", f.default_text()}, {"help", f.help}});
  return out;
}

std::string run_fields_markdown() {
  std::string out =
      "# Run fields\n\n"
      "Every field of a run: its key in a `--config` JSON file, a sweep axis or a Python config dict, its flag, its\n"
      "type and default. Generated by `hbmsim fields --markdown` from the one table in planner/run_fields.cpp.\n"
      "Per-tensor placements are `tensors` in JSON (`{\"mla_q\": \"offload\"}`), `--tensor NAME=PLACEMENT` as a\n"
      "flag and `tensor.NAME` as a sweep axis; `NAME@dense` or `NAME@moe` places it in that kind of layer only.\n\n"
      "| field | flag | type | default | meaning |\n|---|---|---|---|---|\n";
  for (const auto& f : run_fields_json()) {
    std::string def = f["default"].get<std::string>();
    out += "| `" + f["name"].get<std::string>() + "` | `" + f["flag"].get<std::string>() + "` | " + f["type"].get<std::string>() +
           " | " + (def.empty() ? "-" : "`" + def + "`") + " | " + f["help"].get<std::string>() + " |\n";
  }
  return out;
}

std::string RunField::type() const {
  struct {
    std::string operator()(std::string RunConfig::*) const { return "text"; }
    std::string operator()(std::int64_t RunConfig::*) const { return "integer"; }
    std::string operator()(bool RunConfig::*) const { return "on/off"; }
    std::string operator()(double RunConfig::*) const { return "number"; }
    std::string operator()(std::optional<double> RunConfig::*) const { return "number"; }
    std::string operator()(Switch RunConfig::*) const { return "on/off"; }
  } visit;
  return std::visit(visit, member);
}

std::string RunField::default_text() const {
  const RunConfig c;
  auto j = json(c);
  if (!j) return "";
  if (j->is_string()) return j->get<std::string>();
  if (j->is_boolean()) return j->get<bool>() ? "on" : "off";
  return j->dump();
}

void RunField::set(RunConfig& c, const std::string& text, const std::string& where) const {
  // Only the form is checked here: a value out of range is bad input of the run it is in (a sweep keeps
  // going and reports that row's error), checked when the run is prepared.
  struct {
    const std::string& text;
    const std::string& where;
    RunConfig& c;
    void operator()(std::string RunConfig::*m) const { c.*m = text; }
    void operator()(std::int64_t RunConfig::*m) const { c.*m = parse_int_text(text, where); }
    void operator()(bool RunConfig::*m) const { c.*m = parse_bool_text(text, where); }
    void operator()(double RunConfig::*m) const { c.*m = parse_double_text(text, where); }
    void operator()(std::optional<double> RunConfig::*m) const { c.*m = parse_double_text(text, where); }
    void operator()(Switch RunConfig::*m) const { c.*m = parse_switch_text(text, where); }
  } visit{text, where, c};
  std::visit(visit, member);
}

std::string RunField::range_problem(const RunConfig& c) const {
  std::optional<double> v;
  if (auto* m = std::get_if<std::int64_t RunConfig::*>(&member)) v = static_cast<double>(c.**m);
  if (auto* m = std::get_if<double RunConfig::*>(&member)) v = c.**m;
  if (auto* m = std::get_if<std::optional<double> RunConfig::*>(&member)) v = c.**m;
  if (!v) return "";
  switch (check) {
    case FieldCheck::positive: return *v > 0 && std::isfinite(*v) ? "" : "must be > 0";
    case FieldCheck::non_negative: return *v >= 0 && std::isfinite(*v) ? "" : "must be >= 0";
    case FieldCheck::fraction: return *v > 0 && *v <= 1 ? "" : "must be in (0, 1]";
    case FieldCheck::none: break;
  }
  return "";
}

void RunField::read(RunConfig& c, const JsonView& v) const {
  const std::string where = v.where();
  struct {
    RunConfig& c;
    const JsonView& v;
    const std::string& where;
    void operator()(std::string RunConfig::*m) const { c.*m = v.string(); }
    void operator()(std::int64_t RunConfig::*m) const { c.*m = v.integer(); }
    void operator()(bool RunConfig::*m) const {
      c.*m = v.raw().is_string() ? parse_bool_text(v.string(), where) : v.boolean();
    }
    void operator()(double RunConfig::*m) const { c.*m = v.number(); }
    void operator()(std::optional<double> RunConfig::*m) const { c.*m = v.number(); }
    void operator()(Switch RunConfig::*m) const {
      c.*m = v.raw().is_string() ? parse_switch_text(v.string(), where) : Switch(v.boolean());
    }
  } visit{c, v, where};
  std::visit(visit, member);
  if (const std::string why = range_problem(c); !why.empty()) v.fail(why);  // the rule the CLI's flags get too
}

std::optional<nlohmann::json> RunField::json(const RunConfig& c) const {
  auto number = [](double v) -> nlohmann::json {
    if (std::abs(v) < 1e15 && v == std::floor(v)) return static_cast<std::int64_t>(v);
    return v;
  };
  struct {
    const RunConfig& c;
    decltype(number)& num;
    std::optional<nlohmann::json> operator()(std::string RunConfig::*m) const { return nlohmann::json(c.*m); }
    std::optional<nlohmann::json> operator()(std::int64_t RunConfig::*m) const { return nlohmann::json(c.*m); }
    std::optional<nlohmann::json> operator()(bool RunConfig::*m) const { return nlohmann::json(c.*m); }
    std::optional<nlohmann::json> operator()(double RunConfig::*m) const { return num(c.*m); }
    std::optional<nlohmann::json> operator()(std::optional<double> RunConfig::*m) const {
      if (!(c.*m)) return std::nullopt;
      return num(*(c.*m));
    }
    std::optional<nlohmann::json> operator()(Switch RunConfig::*m) const {
      const Switch s = c.*m;
      return s.is_auto() ? nlohmann::json("auto") : nlohmann::json(s.on(false));
    }
  } visit{c, number};
  return std::visit(visit, member);
}

}  // namespace hbmsim
