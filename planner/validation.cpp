#include "planner/validation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>

#include "hwmodels/json_view.hpp"
#include "planner/layer_counts.hpp"
#include "planner/sweep.hpp"
#include "workloads/model.hpp"
#include "workloads/pipeline_split.hpp"

namespace hbmsim {

namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The first whole number in `s` after position `from` (nullopt when none).
std::optional<std::int64_t> number_after(const std::string& s, std::size_t from) {
  auto b = s.find_first_of("0123456789", from);
  if (b == std::string::npos) return std::nullopt;
  auto e = s.find_first_not_of("0123456789", b);
  return std::stoll(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
}

// System column -> built-in system. GB200/GB300 rows ran on NVL72 racks (PUBLISHED_RUNS.md), DGX H100 and
// "H100 SXM" on 8-GPU HGX H100 nodes, DGX B200/B300 on air-cooled 8-GPU HGX Blackwell nodes.
std::optional<std::string> map_system(const std::string& s, std::string& why) {
  if (s == "DGX-GB200" || s == "GB200") return "gb200-nvl72";
  if (s == "DGX-GB300" || s == "GB300") return "gb300-nvl72";
  if (s == "DGX-B200") return "b200-hgx";
  if (s == "DGX-B300") return "b300-hgx";
  if (s == "DGX-H100" || s == "H100" || s.rfind("H100 SXM", 0) == 0) return "h100-hgx";
  why = "system " + quote(s) + ": no built-in system maps to it";
  return std::nullopt;
}

// Model column -> built-in model. Llama 3 and 3.1 share their shapes (8B, 70B; 405B is 3.1 only, the "Llama3-405B"
// rows are it); DeepSeek-V3 with or without MTP is deepseek-v3-671b (with it, mtp_layers 1); Mixtral
// 8x7B is its HuggingFace config shipped in data/hf.
std::optional<std::string> map_model(const std::string& m, std::string& why) {
  std::string base = m;
  if (auto p = base.find(" (no MTP)"); p != std::string::npos) base = base.substr(0, p);
  if (base == "Llama3-8B" || base == "Llama3.1-8B") return "llama3.1-8b";
  if (base == "Llama3-70B" || base == "Llama3.1-70B") return "llama3.1-70b";
  if (base == "Llama3-405B" || base == "Llama3.1-405B") return "llama3.1-405b";
  if (base == "DeepSeek-V3") return "deepseek-v3-671b";
  if (base == "Mixtral-8x7B") return "hf/mixtral-8x7b.config.json";
  why = "model " + quote(m) + ": no built-in model or shipped config maps to it";
  return std::nullopt;
}

// prec -> GEMM dtypes. Transformer Engine runs every linear layer (QKV, output projection, MLP, experts) in
// the recipe's precision, the core attention (softmax(QK^T)V) in bf16: hbmsim's weights (MLP) and
// attention_dtype (the projections; its core attention is always bf16) both get it. The per-tensor FP8 recipes
// (delayed, current "CS") are fp8; block-scaled MXFP8 is mxfp8.
std::optional<std::string> map_precision(const std::string& p, std::string& why) {
  if (p == "BF16") return "bf16";
  if (p == "FP8" || p == "FP8-CS" || p == "FP8 CS") return "fp8";
  if (p == "MXFP8") return "mxfp8";
  if (p == "NVFP4") return "nvfp4";
  why = "precision " + quote(p) + ": not a GEMM dtype hbmsim models (bf16, fp8, mxfp8, nvfp4)";
  return std::nullopt;
}

// The recompute or offload a row's recipe sets where the table states none, in the form the remat_offload
// column uses for rows read from a recipe.
// - Megatron-Bridge (MBA) DeepSeek-V3: every performance config of the 26.04 containers sets
//   recompute_granularity selective (scripts/performance/configs/deepseek/deepseek_llm_pretrain.py) with the
//   modules of deepseek_workload_base_configs.py beside it, unchanged from 2026-03-31 (801277876) to 2026-06-30
//   (bf07e5678): mla_up_proj on GB300, B300 and B200; mlp (the dense MLP submodule: DeepSeek-V3's first 3 layers)
//   on GB200. B200 MXFP8 at ep 32 (pp 8 x vp 2, DeepEP) recomputes both (so does perf_recipes/deepseek/b200 at
//   067f987df, which replaced that file).
// - Megatron-Bridge Llama FSDP rows: the FP8-CS configs with Megatron-FSDP offload the activations of their
//   first layers (cpu_offloading_num_layers, which scripts/performance/utils/overrides.py applies as
//   cpu_offloading on, weights not offloaded). 25.09 (llama3_70b_llm_pretrain.yaml and
//   llama31_405b_llm_pretrain.yaml as cherry-picked for 25.09, a28844195): Llama 3 70B on GB200 40 layers,
//   Llama 3.1 405B on GB200 (tp 2) 95. 26.04 (llama3_workload_base_configs.py, unchanged from v0.3.0 to
//   v0.4.0, 0fbfe7d3e): Llama 3 70B 20 layers on GB300, 40 on GB200. The other Llama configs of those
//   releases set neither recompute nor offload.
// - dgxc-benchmarking 25.05 (DGXC-05, deepseek_v3/pretraining/launch.sh at v25.05) runs NeMo's
//   scripts/performance/llm/pretrain_deepseek_v3.py at the NeMo commit its setup.sh pins (7a8f1cc) with
//   --recompute_modules mla_up_proj on H100 and core_attn on GB200, which that script applies as selective
//   recompute.
// Other rows: as stated (nothing).
std::string recipe_setting(const PublishedRun& r, const std::string& system, const std::string& model) {
  const bool fsdp = r.dp_fsdp.rfind("FSDP", 0) == 0, fp8 = r.prec == "FP8" || r.prec == "FP8-CS";
  if (r.src == "MBA" && model == "deepseek-v3-671b") {
    if (system == "gb200-nvl72") return "recipe@d69b428 sel. recompute mlp";
    if (system == "b200-hgx" && r.prec == "MXFP8" && r.ep == 32) return "recipe@d69b428 sel. recompute mla_up_proj mlp";
    if (system == "gb300-nvl72" || system == "b300-hgx" || system == "b200-hgx") return "recipe@d69b428 sel. recompute mla_up_proj";
  }
  if (r.src == "MBA" && fsdp && fp8 && r.container.rfind("25.09", 0) == 0 && system == "gb200-nvl72") {
    if (model == "llama3.1-70b") return "recipe@a28844195 CPU act-offload 40 layers";
    if (model == "llama3.1-405b") return "recipe@a28844195 CPU act-offload 95 layers";
  }
  if (r.src == "MBA" && fsdp && fp8 && r.container.rfind("26.04", 0) == 0 && model == "llama3.1-70b") {
    if (system == "gb300-nvl72") return "recipe@0fbfe7d3e CPU act-offload 20 layers";
    if (system == "gb200-nvl72") return "recipe@0fbfe7d3e CPU act-offload 40 layers";
  }
  if (r.src == "DGXC-05" && model == "deepseek-v3-671b") {
    if (system == "h100-hgx") return "recipe@7a8f1cc sel. recompute mla_up_proj";
    if (system == "gb200-nvl72") return "recipe@7a8f1cc sel. recompute core_attn";
  }
  return "";
}

// remat_offload -> policy. "recipe@REV" only says where the setting was read. Nothing stated is Megatron's
// default, no recompute: no_recompute, which keeps what each backward op reads (autograd's saved tensors).
// Megatron's selective recompute (the --recompute-activations flag is recompute_granularity=selective, module
// core_attn by default) recomputes the core attention: no_recompute with context=remat; its other modules
// (megatron_recompute_modules: mla_up_proj, mlp, moe, moe_act, shared_experts, layernorm) rematerialize their
// tensors the same way. A module the model has nothing of keeps all: no_recompute.
// Full recompute: full; of N layers per chunk ("block N layers", fewer than the chunk's layers): recompute_layers
// N. CPU activation offload of N layers: offload_layers N (the first N layers send what they keep to host).
// flash-attn2 and TE name the kernels: hbmsim's attention is a fused flash kernel, its GEMMs TE's.
bool map_recompute(const std::string& text, const ModelSpec& model, std::int64_t layers_per_chunk, RunMapping& m, RunConfig& c) {
  std::string rest = trim(text);
  if (rest.rfind("recipe@", 0) == 0) {
    auto sp = rest.find(' ');
    rest = sp == std::string::npos ? "" : trim(rest.substr(sp + 1));
  }
  c.policy = "no_recompute";
  m.recompute = "none stated (Megatron default: no recompute): no_recompute";
  m.recompute_unstated = true;
  std::string offload_text;
  std::size_t start = 0;
  while (start <= rest.size()) {
    auto semi = rest.find(';', start);
    std::string item = trim(rest.substr(start, semi == std::string::npos ? std::string::npos : semi - start));
    start = semi == std::string::npos ? rest.size() + 1 : semi + 1;
    if (item.empty() || item == "TE" || item.rfind("flash-attn", 0) == 0) continue;
    if (contains(item, "offload")) {
      // "CPU act-offload N layers" / "N of L layers": Megatron cpu_offloading_num_layers, the saved activations
      // of the first N layers sent to host (Transformer Engine's offload handler, in forward order).
      auto n = number_after(item, item.find("offload"));
      if (!n || *n <= 0) {
        m.reason = "\"" + item + "\": the number of offloaded layers is not stated";
        return false;
      }
      c.offload_layers = *n;
      offload_text = "; \"" + item + "\": offload_layers " + str(*n);
      continue;
    }
    if (contains(item, "full recompute")) {
      auto block = item.find("block");
      auto n = block == std::string::npos ? std::nullopt : number_after(item, block);
      if (n && *n < layers_per_chunk) {
        // recompute_method block: the first N layers of every model chunk recomputed, the others keep all.
        c.recompute_layers = *n;
        m.recompute = "\"" + item + "\": recompute_layers " + str(*n) + " of " + str(layers_per_chunk) + " per chunk";
        m.recompute_unstated = false;
        continue;
      }
      c.policy = "full";
      m.recompute = "\"" + item + "\": full";
      m.recompute_unstated = false;
      continue;
    }
    if (item == "recompute-activations" || item == "recompute-activations (selective)" || contains(item, "selective") ||
        item.rfind("sel. recompute", 0) == 0) {
      // The modules named after "sel. recompute", separated by spaces or commas; none named: core_attn.
      std::vector<std::string> modules;
      if (item.rfind("sel. recompute", 0) == 0) {
        std::string list = item.substr(14);
        std::replace(list.begin(), list.end(), ',', ' ');
        std::istringstream words(list);
        for (std::string w; words >> w;) modules.push_back(w);
      }
      if (modules.empty()) modules = {"core_attn"};
      m.recompute_unstated = false;
      c.policy = "no_recompute";
      std::string names, what;
      for (const std::string& module : modules) {
        const RecomputeModule* known = find_recompute_module(module);
        const auto tensors = known ? known->tensors_in(model) : std::vector<std::string>{};
        what += what.empty() ? "" : "; ";
        if (!tensors.empty()) {
          for (const auto& t : tensors) {
            c.tensors[t] = "remat";
            names += (names.empty() ? "" : ", ") + t;
          }
          what += known->what;
        } else if (known) {
          // A module this model has nothing of.
          what += module + (modules.size() == 1 ? " only" : " (nothing hbmsim recomputes)");
        } else {
          m.reason = "\"" + item + "\": no hbmsim preset recomputes only " + module;
          return false;
        }
      }
      m.recompute = "\"" + item + "\" (selective, " + what + "): no_recompute" + (names.empty() ? "" : " with " + names + "=remat");
      continue;
    }
    m.reason = "remat_offload item " + quote(item) + " not understood";
    return false;
  }
  m.recompute += offload_text;
  return true;
}

}  // namespace

RunMapping map_published_run(const PublishedRun& r) {
  RunMapping m;
  auto no = [&](const std::string& why) {
    m.reason = why;
    m.config.reset();
    return m;
  };
  std::string why, model_why;
  auto system = map_system(r.system, why);
  auto model = map_model(r.model, model_why);
  m.system_id = system.value_or("");
  m.model_id = model.value_or("");
  // Fine-tuning trains adapters or a subset with other optimizer state: hbmsim simulates pre-training steps.
  for (const auto* col : {&r.model, &r.notes, &r.remat_offload, &r.src})
    if (contains(*col, "SFT") || contains(*col, "LoRA"))
      return no("fine-tuning (SFT/LoRA): hbmsim simulates pre-training steps, every weight trained");
  if (!system) return no(why);
  if (!model) return no(model_why);
  auto dtype = map_precision(r.prec, why);
  if (!dtype) return no(why);

  RunConfig c;
  c.system = *system;
  c.model = *model;
  c.gpus = r.gpus;
  c.seq = r.seq;
  c.weights = c.attention_dtype = *dtype;
  // Transformer Engine's FP8, MXFP8 and NVFP4 recipes keep each linear layer's input quantized for its backward.
  c.fp8_saved_activations = *dtype != "bf16";
  // Megatron's batch: mbs sequences per model replica per micro-step, gbs per step.
  c.micro_batch = r.mbs;
  c.global_batch = r.gbs;
  c.tp = r.tp;
  c.pp = r.pp;
  c.vp = r.vp;
  c.cp = r.cp;
  c.ep = r.ep;
  // Megatron's training state (bf16 weights, main gradients, master weights in the optimizer state) and
  // program order, and its reading of the layout (the four layout fields left auto, layout_reading):
  // Megatron-Core's rank order (tp innermost, then cp, ep, dp, pp), its ring (p2p) context-parallel exchange,
  // context and expert-parallel ranks holding whole non-expert weights and summing their gradients with dp
  // (DDP's dense buffers sync over data parallelism with cp, which contains ep; the expert buffers over
  // expert data parallelism). Its default 1F1B schedule (interleaved when vp > 1) is set below.
  c.framework = "megatron";
  // The gradient buffer's dtype. Megatron-LM's --bf16 reduces gradients in fp32 (bare Megatron-Core scripts);
  // Megatron-Bridge's performance configs set grad_reduce_in_fp32 off for every model and precision (since
  // its 25.09 scripts). NeMo 25.04's performance scripts (7a8f1cc, scripts/performance/utils.py) set it off
  // for FP8, and the Llama and Mixtral recipes they build with performance_mode set it off for BF16 too
  // (pretrain_performance_optimizations); its DeepSeek-V3 script builds without it and keeps bf16_mixed's fp32.
  const bool nemo = r.container.rfind("NeMo", 0) == 0, bare = r.container.rfind("megatron-core", 0) == 0;
  const bool deepseek = m.model_id == "deepseek-v3-671b", mba = r.src == "MBA";
  c.grad_reduce_dtype = bare || (nemo && deepseek && *dtype == "bf16") ? "fp32" : "bf16";
  // Megatron-Bridge's and NeMo's performance recipes overlap the tensor-parallel all-gathers and
  // reduce-scatters with their GEMMs (Transformer Engine userbuffers, comm_overlap.tp_comm_overlap_cfg, e.g.
  // userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192 for Llama 3.1 405B) wherever tp > 1. A run from bare
  // Megatron-Core scripts (the container column names megatron-core) has Megatron's default: no overlap.
  // NeMo 25.04's DeepSeek-V3 script (scripts/performance/llm/pretrain_deepseek_v3.py at 7a8f1cc, the commit
  // dgxc-benchmarking 25.05 pins) turns it off (MegatronCommOverlapCallback(tp_comm_overlap=False)).
  c.tp_comm_overlap = r.tp > 1 && !bare && !(deepseek && nemo);
  // The MoE token dispatcher. Megatron-Bridge's DeepSeek-V3 performance configs name a flex backend for every
  // system (HybridEP; DeepEP for B200 MXFP8 at ep 32: configs/deepseek at 5776a6d and 2026-04). NeMo 25.04's
  // DeepSeek-V3 script keeps DeepSeekConfig's alltoall dispatcher on every system (with token drop at capacity
  // factor 1, padded: balanced loads, as hbmsim assumes); DeepEP entered that script in July 2025 (ba1ff16,
  // NeMo 2.5). Others keep alltoall.
  c.moe_dispatcher = deepseek && mba ? "flex" : "alltoall";
  // Their HybridEP kernels hold 32 SMs (scripts/performance/utils/overrides.py sets moe_hybridep_num_sms for every
  // HybridEP run, at 5776a6d and 2026-04); DeepEP, at B200 ep 32, keeps Megatron-Core's 20 (the field's default).
  c.moe_dispatcher_sms = c.moe_dispatcher == "flex" && !(*system == "b200-hgx" && r.ep == 32) ? 32 : 0;
  // Megatron-Bridge's DeepSeek-V3 recipe (recipes/deepseek at 5776a6d and 2026-04, which every performance
  // config starts from) sets the precision-aware optimizer with bf16 moments (exp_avg_dtype, exp_avg_sq_dtype).
  // NeMo 25.04's scripts set the optimizer for BF16 without changing the moments' dtype (fp32).
  c.optimizer_moments_dtype = deepseek && mba ? "bf16" : "fp32";
  c.pp_schedule = "1f1b";

  // Data parallelism. Megatron's data-parallel size is gpus / (tp x cp x pp), and expert parallelism is carved
  // out of those ranks; hbmsim's ep is a mesh axis of its own beside dp, which its replicas count too, so dp is
  // gpus / (tp x cp x pp x ep).
  const std::int64_t model_parallel = r.tp * r.cp * r.pp;
  if (r.gpus % model_parallel != 0)
    return no("gpus = " + str(r.gpus) + " is not divisible by tp x cp x pp = " + str(model_parallel));
  const std::int64_t replicas = r.gpus / model_parallel;
  // Expert tensor parallelism 1 under tp > 1 (Megatron's MoE parallel folding, "ep (ETP1)"): whole experts over
  // an expert group of ep GPUs that spans tp and cp, so ep / (tp x cp) of it is carved out of data parallelism.
  // Other ETPs (neither 1 nor tp) are not modelled.
  const bool fold = r.etp == 1 && r.tp > 1;
  if (r.etp > 0 && r.etp != r.tp && !fold)
    return no("expert tensor parallel ETP" + str(r.etp) + " is neither 1 nor tp = " + str(r.tp) +
              " (Megatron's MoE parallel folding with expert tensor parallelism: not modelled)");
  // A group inside tp x cp spans tp and part of cp: nothing is carved out of data parallelism.
  const bool inside = fold && r.ep < r.tp * r.cp;
  if (fold && !folded_group_fits(r.tp, r.cp, r.ep))
    return no("ep = " + str(r.ep) + " with ETP1 is neither a multiple of tp x cp = " + str(r.tp * r.cp) +
              " nor tp times a divisor of cp");
  const std::int64_t carved = inside ? 1 : fold ? r.ep / (r.tp * r.cp) : r.ep;  // the part of the expert group outside tp x cp
  if (fold) c.expert_tp = 1;
  if (replicas % carved != 0)
    return no("ep = " + str(r.ep) + " does not divide the data-parallel size gpus / (tp x cp x pp) = " + str(replicas) +
              (fold ? (r.cp > 1 ? " x tp x cp" : " x tp") : ""));
  const std::int64_t left = replicas / carved;
  const std::string& d = r.dp_fsdp;
  if (d == "DDP") {
    // DDP: data parallel with the distributed optimizer (PUBLISHED_RUNS.md), optimizer state sharded over dp x cp.
    c.fsdp = 1;
    c.dp = left;
    c.sharded_optimizer = true;
  } else if (d.rfind("FSDP", 0) == 0) {
    // Megatron FSDP (ZeRO-3: parameters, gradients and optimizer state sharded) over n GPUs (FSDP alone: all the
    // data-parallel ranks), replicated over the rest.
    std::int64_t n = left;
    if (d.size() > 4) {
      auto v = number_after(d, 4);
      if (!v || str(*v) != d.substr(4)) return no("dp_fsdp " + quote(d) + " not understood");
      n = *v;
    }
    if (n <= 0 || left % n != 0) return no("dp_fsdp " + d + ": " + str(n) + " does not divide the " + str(left) + " data-parallel ranks");
    c.fsdp = n;
    c.dp = left / n;
  } else if (d.rfind("DP", 0) == 0 && d.size() > 2) {
    // DPn: Megatron's data-parallel size n (expert ranks included), with the distributed optimizer as the NeMo
    // and Megatron-Bridge recipes default to (FlagPerf's tables do not say).
    auto v = number_after(d, 2);
    if (!v || str(*v) != d.substr(2)) return no("dp_fsdp " + quote(d) + " not understood");
    if (*v != replicas)
      return no("dp_fsdp " + d + " disagrees with gpus / (tp x cp x pp) = " + str(replicas));
    c.fsdp = 1;
    c.dp = left;
    c.sharded_optimizer = true;
  } else {
    return no("dp_fsdp " + quote(d) + " not understood (expected DDP, FSDP, FSDPn or DPn)");
  }

  // An even pipeline split needs pp x vp to divide the layers; Megatron's recipes for layer counts it does
  // not divide (Llama 3.1 405B's 126) count the embedding and the loss as a layer each
  // (account_for_embedding/loss_in_pipeline_split). Other splits are left to hbmsim, which names the problem.
  ModelSpec spec = resolve_model(c.model);
  const std::int64_t chunks = r.pp * r.vp;
  if (r.pp > 1 && spec.num_layers % chunks != 0 && (spec.num_layers + 2) % chunks == 0)
    c.embedding_as_layer = c.loss_as_layer = true;
  // DeepSeek-V3 trains one MTP module (Megatron-Bridge's DeepSeek-V3 recipes: mtp_num_layers 1) unless the
  // row says "no MTP".
  if (deepseek && !contains(r.model, "no MTP")) c.mtp_layers = 1;
  // DeepSeek-V3's 61 layers. NeMo 25.04's script (7a8f1cc) sets num_layers_in_first_pipeline_stage to
  // 64 / pp - 1 and num_layers_in_last_pipeline_stage to 64 / pp - 2 (pp 4: 15, 16, 16, 14), the MTP module
  // and the loss on the last stage. Megatron-Bridge's recipes give a layout per chunk count (its DeepSeek-V3
  // layout map for 4, 8 and 16 chunks, and "Et*4|(t*4|)*14tmL" in the pp 2 x vp 8 performance recipes): each
  // chunk ceil(61 / chunks) layers, the last one the rest with the MTP module and the loss.
  if (deepseek && nemo && r.pp >= 4 && r.vp == 1 && 64 % r.pp == 0) {
    const std::int64_t mid = 64 / r.pp;
    c.pipeline_layout = "Et*" + str(mid - 1) + "|(t*" + str(mid) + "|)*" + str(r.pp - 2) + "t*" + str(mid - 2) +
                        std::string(static_cast<std::size_t>(c.mtp_layers), 'm') + "L";
  } else if (r.pp > 1 && spec.num_layers % chunks != 0 && !c.embedding_as_layer && deepseek) {
    c.pipeline_layout = ceil_pipeline_layout(spec.num_layers, chunks, c.mtp_layers);
  }
  const std::int64_t units = spec.num_layers + (c.embedding_as_layer ? 2 : 0);
  const std::int64_t layers_per_chunk = std::max<std::int64_t>(1, units / std::max<std::int64_t>(1, chunks));
  const std::string recipe = r.remat_offload.empty() ? recipe_setting(r, *system, m.model_id) : "";
  if (!map_recompute(recipe.empty() ? r.remat_offload : recipe, spec, layers_per_chunk, m, c)) return no(m.reason);
  if (!recipe.empty()) {
    m.recompute = "none stated, its recipe's (" + recipe + "): " + m.recompute;
    m.recompute_unstated = false;  // the config read says all it recomputes, nothing where it names only offload
  }
  // Megatron-Bridge's B200 MXFP8 DeepSeek-V3 config since 2026-04-18 (#3368, the only B200 one at ep 32: pp 8 x
  // vp 2, DeepEP) sets moe_a2a_overlap, Megatron's combined 1F1B, which its overrides.py (d69b428) applies with
  // delay_wgrad_compute.
  c.ep_overlap = c.delay_wgrad = deepseek && mba && *system == "b200-hgx" && r.ep == 32;

  // A GAn note is the source's own accumulation count: say when the batch and layout give another.
  if (auto ga = r.notes.find("GA"); ga != std::string::npos) {
    if (auto n = number_after(r.notes, ga); n && r.gbs % (r.mbs * replicas) == 0 && *n != r.gbs / (r.mbs * replicas))
      m.remarks.push_back("notes say GA" + str(*n) + "; gbs / (mbs x data-parallel size) = " + str(r.gbs / (r.mbs * replicas)));
  }
  m.config = c;
  return m;
}

// A row that states no recompute setting is read as Megatron's default, no recompute; when that does not fit,
// the published run (which ran) cannot have used it, and its recipe set some recompute: read as the fewest
// layers per chunk recomputed in full (recompute_num_layers, block) with which it fits, the least a recipe
// must set (plan recompute-layers' answer). If no count fits, the row stays as read, marked not to fit.
static void fit_recompute_layers(ValidationRow& row, const std::string& calibration) {
  RunConfig c = *row.mapping.config;
  c.calibration = calibration;
  LayerCountSearch s;
  try {
    s = fewest_layers(c, LayerCount::recompute);
  } catch (const InputError&) {
    return;
  }
  if (s.layers < 0) return;
  const double gib = row.predicted->hbm_peak_bytes / 1073741824.0, cap = row.predicted->hbm_capacity_bytes / 1073741824.0;
  row.predicted = s.at(s.layers)->report;
  row.mapping.config->recompute_layers = s.layers;
  char buf[160];
  std::snprintf(buf, sizeof buf, "; no recompute needs %.0f of %.0f GiB: recompute_layers %lld per chunk, the fewest that fit", gib, cap,
                static_cast<long long>(s.layers));
  row.mapping.recompute += buf;
}

static void fit_unstated_recompute(std::vector<ValidationRow>& rows, const std::string& calibration, int jobs,
                                   const ValidationProgress& progress) {
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].predicted && !rows[i].predicted->fits && rows[i].mapping.recompute_unstated && rows[i].mapping.config)
      todo.push_back(i);
  std::mutex reporting;
  std::size_t done = 0;
  parallel_for(todo.size(), jobs, [&](std::size_t k) {
    fit_recompute_layers(rows[todo[k]], calibration);
    if (!progress) return;
    std::lock_guard lock(reporting);
    progress("recompute searches", ++done, todo.size());
  });
}

std::vector<ValidationRow> validate_runs(const std::vector<PublishedRun>& runs, const std::string& calibration, int jobs,
                                         const ValidationProgress& progress) {
  check_jobs(jobs);
  check_calibration(calibration, "calibration", true);  // once, not as every row's refusal
  // Map every row (cheap, here), then simulate the expressed ones on the sweep's thread pool: a config hbmsim
  // refuses comes back as the row's error, anything else ends the run.
  std::vector<ValidationRow> rows(runs.size());
  std::vector<SweepPoint> points;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    auto& row = rows[i];
    row.run = runs[i];
    try {
      row.mapping = map_published_run(runs[i]);
    } catch (const InputError& e) {
      row.mapping.reason = e.what();
    }
    if (!row.mapping.config) {
      row.reason = row.mapping.reason;
      continue;
    }
    RunConfig c = *row.mapping.config;
    c.calibration = calibration;
    points.push_back({i, {}, c});
  }
  std::size_t simulated = 0;
  run_sweep(points, jobs, [&](const SweepRow& r) {  // rows are handed over one at a time
    if (progress) progress("simulated", ++simulated, points.size());
    auto& row = rows[r.index];
    if (!r.report) {
      row.reason = "hbmsim refuses: " + r.error;
      return;
    }
    row.predicted = r.report;
  });
  fit_unstated_recompute(rows, calibration, jobs, progress);
  for (auto& row : rows)
    if (auto measured = measured_tok_s_gpu(row.run); row.predicted && measured)
      row.error = row.predicted->tokens_per_s_per_device / *measured - 1;
  return rows;
}

std::string validation_system_group(const ValidationRow& row) {
  return row.mapping.system_id.empty() ? row.run.system : row.mapping.system_id;
}

std::string validation_model_group(const ValidationRow& row) {
  return row.mapping.model_id.empty() ? row.run.model : row.mapping.model_id;
}

namespace {

ErrorSummary summarize_group(const std::string& group, const std::vector<const ValidationRow*>& rows) {
  ErrorSummary s;
  s.group = group;
  std::vector<double> abs_errors;
  for (const auto* r : rows) {
    ++s.total;
    if (r->expressed()) ++s.expressed;
    if (!r->error) continue;
    ++s.measured;
    const double a = std::fabs(*r->error);
    abs_errors.push_back(a);
    if (s.worst_row == 0 || a > std::fabs(s.worst_error)) {
      s.worst_row = r->run.row;
      s.worst_error = *r->error;
    }
  }
  if (abs_errors.empty()) return s;
  double sum = 0;
  for (double a : abs_errors) sum += a;
  s.mape = sum / static_cast<double>(abs_errors.size());
  std::sort(abs_errors.begin(), abs_errors.end());
  const std::size_t n = abs_errors.size();
  s.median_abs_error = n % 2 ? abs_errors[n / 2] : (abs_errors[n / 2 - 1] + abs_errors[n / 2]) / 2;
  return s;
}

template <class Key>
std::vector<ErrorSummary> by(const std::vector<ValidationRow>& rows, Key key) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const ValidationRow*>> groups;
  for (const auto& r : rows) {
    auto k = key(r);
    if (!groups.count(k)) order.push_back(k);
    groups[k].push_back(&r);
  }
  std::vector<ErrorSummary> out;
  for (const auto& k : order) out.push_back(summarize_group(k, groups[k]));
  return out;
}

}  // namespace

ValidationSummary summarize_validation(const std::vector<ValidationRow>& rows) {
  ValidationSummary s;
  std::vector<const ValidationRow*> all;
  for (const auto& r : rows) all.push_back(&r);
  s.overall = summarize_group("all", all);
  s.by_src = by(rows, [](const ValidationRow& r) { return r.run.src; });
  s.by_system = by(rows, validation_system_group);
  s.by_model = by(rows, validation_model_group);
  return s;
}

}  // namespace hbmsim
