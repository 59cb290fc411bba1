// The settings that realise a simulated run in the frameworks: MaxText keys, XLA flags, Megatron-LM arguments, and
// the simulate config itself (plans print them beside each answer).
#include "planner/framework_settings.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"
#include "hwmodels/mesh.hpp"
#include "hwmodels/topology.hpp"

namespace hbmsim {

namespace {

// Megatron-Core and MaxText run one low-precision recipe over every linear layer: the MLP's dtype where it
// has one, else the projections'. A config with two dtypes says which one its settings run.
Dtype linear_dtype(const RunConfig& c) {
  const Dtype mlp = parse_dtype(c.weights);
  return mlp != Dtype::bf16 ? mlp : parse_dtype(c.attention_dtype);
}

// Each recipe as the frameworks spell it. Megatron-Core: FP8 per-tensor (delayed by default) with E4M3 forward
// and E5M2 gradients; MXFP8 E4M3 throughout (its block scales carry the range); NVFP4 E2M1 with FP8 scales.
// MaxText's quantization values for NVIDIA GPUs (configs/types.py): its own fp8 GEMMs, Transformer Engine's
// block-scaled recipes.
struct Recipe {
  Dtype dtype;
  const char *megatron, *maxtext;
};
constexpr Recipe kRecipes[] = {{Dtype::fp8, " --fp8-format hybrid", " quantization=fp8"},
                               {Dtype::mxfp8, " --fp8-format e4m3 --fp8-recipe mxfp8", " quantization=te_mxfp8"},
                               {Dtype::nvfp4, " --fp4-format e2m1 --fp4-recipe nvfp4", " quantization=te_nvfp4"}};
// The config's recipe (nullptr: bf16 throughout).
const Recipe* recipe(const RunConfig& c) {
  const Dtype d = linear_dtype(c);
  for (const Recipe& r : kRecipes)
    if (r.dtype == d) return &r;
  return nullptr;
}
// DDP's overlaps. hbmsim buckets the gradient sync per layer in the backward under dp_overlap, and always
// issues a sharded optimizer's parameter all-gathers per layer for the forward to wait on, which Megatron
// (arguments.py) allows only with --overlap-param-gather, and that only with --overlap-grad-reduce.
std::string gradient_sync_settings(const RunConfig& c) {
  std::string out = c.grad_reduce_dtype == "bf16" ? " --grad-reduce-in-bf16" : "";
  // Expert ranks are carved out of data parallelism: the other weights' gradients are summed over them too.
  const bool synced = c.dp * c.cp * expert_axis(c) > 1 || c.fsdp > 1, sharded = c.fsdp > 1 || c.sharded_optimizer;
  if (!synced) return out;
  if (c.dp_overlap) return out + " --overlap-grad-reduce" + (sharded ? " --overlap-param-gather" : "");
  if (sharded)
    out += " (dp_overlap off: Megatron overlaps parameter gathers only beside an overlapped gradient reduce, so it "
           "gathers them after the optimizer step, where hbmsim overlaps them with the forward)";
  return out;
}
// The flags that would simulate the config as Megatron runs it (empty: it is simulated so already).
std::string megatron_semantics_note(const RunConfig& c) {
  const std::string flags = (c.framework != "megatron" ? " --framework megatron" : "") + megatron_reading_flags(c);
  return flags.empty() ? "" : " (simulated otherwise than Megatron runs it; as Megatron:" + flags + ")";
}
std::string mixed_dtype_note(const RunConfig& c) {
  const Dtype mlp = parse_dtype(c.weights), projections = parse_dtype(c.attention_dtype);
  if (mlp == projections) return "";
  return std::string(" (MLP GEMMs ") + to_string(mlp) + ", projections " + to_string(projections) +
         ": one recipe covers every linear layer, so these settings run both as " + to_string(linear_dtype(c)) + ")";
}
// What hbmsim resolves from a config that the frameworks' settings must spell out: the FSDP degree filling the
// GPUs left over (fsdp 0), and the batch in both frameworks' terms. Empty when the config does not resolve.
struct ResolvedShape {
  std::int64_t fsdp = 0;
  std::int64_t replica_batch = 0;  // sequences per model replica per micro-step (Megatron's micro-batch)
  std::int64_t global_batch = 0;
  std::int64_t grad_accum = 1;     // micro-steps per step (the pipeline's micro-batches with pp > 1)
  double device_batch = 0;         // sequences per device per micro-step
};
std::optional<ResolvedShape> resolved_shape(const RunConfig& c) {
  try {
    TrainingSpec t = training_shape(c);
    validate_training(t, resolve_model(c.model));
    return ResolvedShape{t.parallelism.fsdp, t.replica_batch, t.global_sequences(), t.grad_accum, t.device_batch()};
  } catch (const InputError&) {
    return std::nullopt;
  }
}

// Megatron's left-over GPUs are plain data parallelism, so an FSDP degree hbmsim filled in must be named, and a
// batch given MaxText's way becomes Megatron's micro-batch and global batch.
RunConfig with_megatron_batch_and_fsdp(RunConfig c) {
  if (const auto r = resolved_shape(c)) {
    if (c.fsdp == 0) c.fsdp = r->fsdp;
    if (c.micro_batch == 0) {
      c.micro_batch = r->replica_batch;
      c.global_batch = r->global_batch;
    }
  }
  return c;
}

// MaxText's mesh keys, each axis split as its hybrid mesh splits it: the members inside one slice (ici_*) and the
// slices it spans (dcn_*). On GPUs a slice is a fast-interconnect domain (XLA gives the GPUs of one NVLink domain
// one slice_index, openxla/xla#24473; on HGX the eight GPUs of a host), so the split is where the simulated mesh,
// in MaxText's axis order, puts each axis's members. A layout whose axes do not split into whole domains is one
// no hybrid mesh places: every axis is then named ici_*, with a note.
std::string maxtext_mesh(const RunConfig& c, std::int64_t fsdp) {
  struct Key {
    const char* name;
    Axis axis;
    std::int64_t size;
  };
  const Key keys[] = {{"data", Axis::dp, c.dp},     {"pipeline", Axis::pp, c.pp}, {"fsdp", Axis::fsdp, fsdp},
                      {"context", Axis::cp, c.cp},  {"tensor", Axis::tp, c.tp},   {"expert", Axis::ep, expert_axis(c)}};
  Mesh mesh;
  mesh.order = maxtext_mesh_order();
  for (const Key& k : keys) mesh.sizes[static_cast<std::size_t>(k.axis)] = k.size;
  std::optional<System> system;
  try {
    system = resolve_system(c.system);
  } catch (const InputError&) {
  }
  auto key = [](const char* part, const Key& k, std::int64_t n) {
    return n > 1 ? std::string(" ") + part + "_" + k.name + "_parallelism=" + std::to_string(n) : std::string();
  };
  std::string ici, dcn;
  // Only a layout that fills its GPUs can be placed (one that does not is bad input, reported where it runs).
  const bool placed = system.has_value() && mesh.devices() == c.gpus && c.gpus <= std::numeric_limits<int>::max();
  bool whole = placed;
  if (placed) {
    const Topology topo(*system, static_cast<int>(c.gpus));
    std::int64_t ici_product = 1;
    for (const Key& k : keys) {
      const GroupPlacement g = place_group(topo, mesh, AxisSet{k.axis});
      whole = whole && g.per_domain * g.domains == k.size;
      ici_product *= g.per_domain;
      ici += key("ici", k, g.per_domain);
      dcn += key("dcn", k, g.domains);
    }
    whole = whole && ici_product == topo.domain_gpus();
  }
  if (whole) return dcn + ici;
  std::string all;
  for (const Key& k : keys) all += key("ici", k, k.size);
  return all + (placed ? " (this layout's axes do not split into whole NVLink domains, which MaxText's hybrid mesh needs: "
                         "ici_* here name whole axes)"
                       : "");
}

// Megatron-Core's CPU offloading of activations (cpu_offloading_num_layers) refuses pipelining, any activation
// recompute and offloading every layer (transformer_config.py): a config asking for one of them is said to be
// none Megatron runs (hbmsim simulates it as if Megatron could).
std::string cpu_offloading_note(const RunConfig& c, bool recomputes) {
  std::vector<std::string> refused;
  if (c.pp > 1) refused.push_back("pipeline parallelism");
  if (recomputes) refused.push_back("activation recompute");
  try {
    if (c.offload_layers >= resolve_model(c.model).num_layers) refused.push_back("offloading every layer");
  } catch (const InputError&) {
  }
  if (refused.empty()) return "";
  std::string what;
  for (std::size_t i = 0; i < refused.size(); ++i) what += (i == 0 ? "" : i + 1 == refused.size() ? " and " : ", ") + refused[i];
  return " (Megatron-Core's CPU offloading refuses " + what + ", transformer_config.py: no Megatron run realises this one)";
}

// MaxText's pipeline keys. Its stages x num_pipeline_repeats x num_layers_per_pipeline_stage must equal the
// pipelined layers (configs/types.py), and its defaults (one layer per stage, the repeats derived) make a circular
// pipeline of single layers, so both are spelled out; with the DeepSeek decoder block it pipelines only the MoE
// layers (pipeline_parallel_layers), the dense ones running outside with the stage axis as data parallelism.
std::string maxtext_pipeline(const RunConfig& c, std::int64_t microbatches) {
  std::string out = " num_pipeline_microbatches=" + std::to_string(microbatches);
  std::optional<ModelSpec> model;
  try {
    model = resolve_model(c.model);
  } catch (const InputError&) {
  }
  const std::int64_t chunks = c.pp * c.vp;
  const bool uneven = !c.pipeline_layout.empty() || c.first_stage_layers > 0 || c.last_stage_layers > 0 ||
                      c.embedding_as_layer || c.loss_as_layer || (model && model->num_layers % chunks != 0);
  const bool dense_first = model && model->first_dense_layers > 0;
  if (model && !uneven && !dense_first) out += " num_layers_per_pipeline_stage=" + std::to_string(model->num_layers / chunks);
  out += " num_pipeline_repeats=" + std::to_string(c.vp);
  if (dense_first)
    out += " (MaxText pipelines only a DeepSeek-style model's MoE layers, its dense layers outside the pipeline with the "
           "stage axis as data parallelism: pipeline_parallel_layers; hbmsim pipelines every layer)";
  else if (uneven)
    out += " (an uneven pipeline split: MaxText's stages x num_pipeline_repeats x num_layers_per_pipeline_stage must equal "
           "the layers, so MaxText has no equivalent of this one)";
  if (microbatches % c.pp != 0)
    out += " (MaxText needs num_pipeline_microbatches divisible by the stages: " + std::to_string(microbatches) + " over pp " +
           std::to_string(c.pp) + " is no MaxText run)";
  return out;
}

}  // namespace

// Megatron's selective recompute modules that a policy is (megatron_recompute_modules): the modules whose
// tensors, and only those, it rematerializes, the rest kept (no_recompute). "core_attn" alone is Megatron's
// default module. nullopt: not such a policy.
std::optional<std::string> selective_recompute_modules(const RunConfig& c) {
  if (c.policy != "no_recompute" && c.policy != "selective") return std::nullopt;
  std::set<std::string> remat;
  if (c.policy == "selective") remat.insert("context");
  for (const auto& [name, where] : c.tensors) {
    if (where != "remat") return std::nullopt;
    remat.insert(name);
  }
  if (remat.empty()) return std::nullopt;  // no_recompute alone: no module to name, no model to read
  std::optional<ModelSpec> model;  // unresolved: only the modules every model has
  try {
    model = resolve_model(c.model);
  } catch (const InputError&) {
  }
  std::string modules;
  for (const auto& k : megatron_recompute_modules()) {
    const auto tensors = model ? k.tensors_in(*model) : k.tensors;
    if (tensors.empty() || !std::all_of(tensors.begin(), tensors.end(), [&](const std::string& t) { return remat.count(t) > 0; }))
      continue;
    for (const auto& t : tensors) remat.erase(t);
    modules += (modules.empty() ? "" : " ") + std::string(k.name);
  }
  if (!remat.empty() || modules.empty()) return std::nullopt;
  return modules;
}

std::string maxtext_settings(const RunConfig& c) {
  auto policy = make_policy(c.policy, c.tensors);
  // MaxText's per-device batch is per step under pipelining (split into num_pipeline_microbatches), per micro-step
  // otherwise (gradient_accumulation_steps of them).
  const auto shape = resolved_shape(c);
  const std::int64_t accum = shape ? shape->grad_accum : c.pp > 1 ? (c.microbatches > 0 ? c.microbatches : c.pp) : c.grad_accum;
  const double per_device = shape ? shape->device_batch * static_cast<double>(c.pp > 1 ? accum : 1)
                            : c.batch ? *c.batch
                                      : 1.0;
  std::string out = "per_device_batch_size=" + format_number(per_device) + " max_target_length=" + std::to_string(c.seq);
  if (c.pp == 1 && accum > 1) out += " gradient_accumulation_steps=" + std::to_string(accum);
  out += maxtext_mesh(c, shape ? shape->fsdp : c.fsdp);
  // ZeRO-1 over the data axis (MaxText's shard_optimizer_over_data); with fsdp alone the state is sharded already.
  if (c.sharded_optimizer && c.dp > 1) out += " shard_optimizer_over_data=true";
  if (c.cp > 1) out += std::string(" context_parallel_load_balance=true");
  if (c.pp > 1) out += maxtext_pipeline(c, accum);
  if (policy.keep_backward_inputs) {
    const bool selective = c.policy == "selective";  // the core attention recomputed: MaxText's minimal keeps no context either
    out += " (" + c.policy + " keeps what autograd saves" + (selective ? " but the core attention" : "") +
           "; MaxText names checkpoints instead: nearest remat_policy=" + (selective ? "minimal" : "minimal_with_context") + ")";
  }
  out += " remat_policy=custom";
  for (auto& n : checkpoint_names()) {
    if (n == "decoder_layer_input") continue;
    auto p = policy.placement(n);
    if (p != Placement::remat) out += " " + n + "=" + to_string(p);
  }
  if (std::any_of(c.tensors.begin(), c.tensors.end(), [](const auto& t) { return t.first.find('@') != std::string::npos; }))
    out += " (NAME@dense / NAME@moe: MaxText places a checkpoint name alike in every kind of layer)";
  if (!c.stage_policies.empty()) out += " (the first stage's policy: MaxText has one remat policy for every stage)";
  if (c.optimizer_offload == "device") out += " optimizer_memory_host_offload=true";
  if (c.parameter_offload) out += " parameter_memory_host_offload=true";
  if (c.optimizer_offload == "host") out += " (optimizer_offload host: a CPU optimizer, which MaxText does not have)";
  if (!c.layer_policies.empty() || c.offload_layers > 0 || c.recompute_layers > 0)
    out += " (every layer's: per-layer policies are Megatron settings, or a MaxText model split into scans per policy)";
  out += " scan_layers=true";
  if (c.moe_batch_split > 1)
    out += " use_batch_split_schedule=true batch_split_factor=" + std::to_string(c.moe_batch_split);
  if (c.ep_overlap)
    out += " (ep_overlap: Megatron's combined 1F1B, which MaxText does not have; its nearest is use_batch_split_schedule)";
  if (folds_experts(c))
    out += " (expert_tp 1: MaxText shards every expert over tensor parallelism; folding them over it is a Megatron setting, so "
           "MaxText runs this mesh with its experts split over tp)";
  if (c.ep > 1 && c.moe_dispatcher == "flex")
    out += " (moe_dispatcher flex: DeepEP/HybridEP deduplication, which MaxText's ragged all-to-all does not do)";
  if (c.mtp_layers > 0) out += " mtp_num_layers=" + std::to_string(c.mtp_layers);
  if (const Recipe* r = recipe(c)) out += r->maxtext;
  out += mixed_dtype_note(c);
  if (c.optimizer_moments_dtype == "bf16")
    out += " mu_dtype=bfloat16 (optimizer_moments_dtype bf16: MaxText's mu_dtype stores only the first moment in bf16)";
  if (c.optimizer == "muon") out += " (optimizer muon: simulated as Megatron-Core's Muon; no MaxText equivalent is modelled)";
  return out;
}

std::string xla_flags(const RunConfig& c) {
  const bool offload = prepare_run(c).policy.offloads_any();
  std::string out = std::string("--xla_gpu_enable_latency_hiding_scheduler=") + (c.lhs ? "true" : "false");
  out += std::string(" --xla_gpu_enable_host_memory_offloading=") + (offload ? "true" : "false");
  out += std::string(" --xla_gpu_enable_pipelined_host_offloading=") + (c.pipelined_transfers ? "true" : "false");
  out += std::string(" --xla_gpu_enable_pipelined_all_gather=") + (c.pipelined_collectives ? "true" : "false");
  out += std::string(" --xla_gpu_enable_pipelined_reduce_scatter=") + (c.pipelined_collectives ? "true" : "false");
  out += std::string(" --xla_gpu_enable_while_loop_double_buffering=") + (c.double_buffering ? "true" : "false");
  out += " --xla_gpu_memory_limit_slop_factor=" + std::to_string(static_cast<int>(std::lround(c.memory_limit_slop * 100)));
  return out;
}

std::string megatron_settings(const RunConfig& given) {
  const RunConfig c = with_megatron_batch_and_fsdp(given);
  std::string out = "--tensor-model-parallel-size " + std::to_string(c.tp) + " --pipeline-model-parallel-size " + std::to_string(c.pp);
  // Megatron-LM takes the interleaving as stages per rank (virtual_pipeline_model_parallel_size has no flag), or
  // from a pipeline layout's chunk count, and refuses both at once (arguments.py).
  if (c.vp > 1 && c.pipeline_layout.empty()) out += " --num-virtual-stages-per-pipeline-rank " + std::to_string(c.vp);
  if (c.embedding_as_layer) out += " --account-for-embedding-in-pipeline-split";
  if (c.loss_as_layer) out += " --account-for-loss-in-pipeline-split";
  if (!c.pipeline_layout.empty()) out += " --pipeline-model-parallel-layout \"" + c.pipeline_layout + "\"";
  if (c.first_stage_layers > 0) out += " --decoder-first-pipeline-num-layers " + std::to_string(c.first_stage_layers);
  if (c.last_stage_layers > 0) out += " --decoder-last-pipeline-num-layers " + std::to_string(c.last_stage_layers);
  // Megatron-LM's schedules are 1F1B and its interleaved form (schedules.py); GPipe and ZB-H1 are not among them.
  if (c.pp > 1 && c.pp_schedule != "1f1b") out += " (pp_schedule " + c.pp_schedule + ": no Megatron equivalent; Megatron runs 1F1B)";
  out += " --context-parallel-size " + std::to_string(c.cp) + " --expert-model-parallel-size " + std::to_string(c.ep);
  // DeepEP and HybridEP move the same bytes in hbmsim; DeepEP runs on Hopper and the HGX Blackwells, HybridEP on NVL72 too.
  if (c.ep > 1)
    out += c.moe_dispatcher == "flex" ? " --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep (or hybridep)"
                                      : " --moe-token-dispatcher-type alltoall";
  if (c.ep > 1 && c.moe_dispatcher == "flex" && c.moe_dispatcher_sms > 0)
    out += " --moe-flex-dispatcher-num-sms " + std::to_string(c.moe_dispatcher_sms);
  if (folds_experts(c)) out += " --expert-tensor-parallel-size 1";
  if (c.moe_capacity_factor > 0) out += " --moe-expert-rank-capacity-factor " + format_number(c.moe_capacity_factor);
  if (c.moe_paged_stash > 0) out += " --moe-paged-stash --moe-paged-stash-buffer-size-factor-cuda " + format_number(c.moe_paged_stash);
  if (c.ep_overlap) out += " --overlap-moe-expert-parallel-comm";
  if (c.delay_wgrad) out += " --delay-wgrad-compute";
  if (c.tp > 1 && c.sequence_parallel) out += " --sequence-parallel";
  if (c.tp > 1 && c.tp_comm_overlap) out += " --tp-comm-overlap";  // Megatron turns sequence parallelism off at tp 1, then refuses it
  if (c.mtp_layers > 0) out += " --mtp-num-layers " + std::to_string(c.mtp_layers);
  if (c.micro_batch > 0) out += " --micro-batch-size " + std::to_string(c.micro_batch);
  if (c.global_batch > 0) out += " --global-batch-size " + std::to_string(c.global_batch);
  // Megatron-FSDP (its default strategy shards optimizer state, gradients and parameters) refuses any checkpoint
  // format but fsdp_dtensor (arguments.py). With data-parallel replicas beside the shards it is hybrid (HSDP): one
  // optimizer instance per replica, and the state sharded over the replicas too where the run shards it over dp.
  if (c.fsdp > 1) {
    out += " --use-megatron-fsdp --ckpt-format fsdp_dtensor";
    if (c.dp > 1)
      out += " --num-distributed-optimizer-instances " + std::to_string(c.dp) + (c.sharded_optimizer ? " --outer-dp-sharding-strategy optim" : "");
  } else if (c.sharded_optimizer) {
    out += " --use-distributed-optimizer";
  }
  out += gradient_sync_settings(c);
  // Megatron's CPU optimizer runs on the precision-aware optimizer's code path and asserts the flag (arguments.py).
  if (c.optimizer_moments_dtype == "bf16" || c.optimizer_offload == "host") out += " --use-precision-aware-optimizer";
  if (c.optimizer_moments_dtype == "bf16") out += " --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16";
  if (c.optimizer == "muon") out += " --optimizer muon" + std::string(c.tp > 1 ? " --muon-tp-mode " + c.muon_tp_mode : "");
  if (const Recipe* r = recipe(c)) out += r->megatron;
  out += mixed_dtype_note(c);
  // no_recompute is Megatron's default; with the attention output recomputed, its selective recompute.
  const auto modules = selective_recompute_modules(c);
  const bool recomputes = c.policy == "full" || modules || c.recompute_layers > 0;
  if (c.policy == "full") out += " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  else if (modules) out += " --recompute-granularity selective" + (*modules == "core_attn" ? "" : " --recompute-modules " + *modules);
  else if (c.policy != "no_recompute" || !c.tensors.empty())
    out += " (policy " + c.policy + ": MaxText per-tensor placement, no Megatron equivalent; nearest: " +
           (c.policy == "minimal" ? "--recompute-granularity selective" : "no recompute") + ")";
  if (c.recompute_layers > 0)
    out += " --recompute-granularity full --recompute-method block --recompute-num-layers " + std::to_string(c.recompute_layers) +
           (modules ? " (Megatron takes one recompute granularity: the first layers recomputed whole beside the others' "
                      "selective recompute is no Megatron run)"
                    : "");
  if (c.offload_layers > 0)
    // Megatron-LM turns the offloading on from the layer count (cpu_offloading has no flag: arguments.py excludes it).
    out += " --cpu-offloading-num-layers " + std::to_string(c.offload_layers) + cpu_offloading_note(c, recomputes);
  // Megatron's offload runs on Transformer Engine's schedule, which hides copies that XLA's exposes.
  if (c.offload_layers > 0 && c.framework != "megatron")
    out += " (simulated on XLA's offload schedule; Transformer Engine's hides more of the copies: see --framework megatron)";
  if (!c.layer_policies.empty()) out += " (layer_policies " + c.layer_policies + ": no Megatron equivalent)";
  if (!c.stage_policies.empty())
    out += " (stage_policies " + c.stage_policies + ": no Megatron equivalent; Megatron recomputes alike on every stage)";
  if (c.optimizer_offload == "host") out += " --optimizer-cpu-offload --optimizer-offload-fraction 1.0";
  if (c.optimizer_offload == "device") out += " (optimizer_offload device: state streamed to the GPU, no Megatron equivalent)";
  if (c.parameter_offload) out += " (parameter_offload: no Megatron equivalent; PyTorch FSDP2 CPUOffloadPolicy)";
  return out + megatron_semantics_note(c);
}


nlohmann::json runnable_settings(const RunConfig& c) {
  return {{"simulate_config", c.to_json()}, {"maxtext", maxtext_settings(c)}, {"xla_flags", xla_flags(c)},
          {"megatron", megatron_settings(c)}};
}

}  // namespace hbmsim
