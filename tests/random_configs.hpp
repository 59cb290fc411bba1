// Seeded random configurations for the property tests (tests/test_invariants.cpp, test_fast_forward.cpp).
#pragma once
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "planner/run_config.hpp"
#include "workloads/model.hpp"
#include "workloads/step_graph.hpp"

namespace test {

using hbmsim::RunConfig;

template <class T>
const T& pick(std::mt19937& rng, const std::vector<T>& xs) {
  return xs[std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng)];
}

// A random run: model, system, layout, batch, policy and every schedule switch. Some draws are bad input
// (a degree that does not divide); the caller skips those.
inline RunConfig random_config(std::mt19937& rng) {
  RunConfig c;
  c.model = pick<std::string>(rng, {"llama3.1-8b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "deepseek-v3-671b"});
  c.system = pick<std::string>(rng, {"gb200-nvl72", "gb300-nvl72", "vr-nvl144", "h100-hgx", "h200-hgx", "b200-hgx", "b300-hgx"});
  const bool moe = c.model == "deepseek-v3-671b";
  c.gpus = pick<std::int64_t>(rng, moe ? std::vector<std::int64_t>{64, 128, 256} : std::vector<std::int64_t>{8, 16, 32, 64, 128});
  c.tp = pick<std::int64_t>(rng, {1, 1, 2, 4, 8});
  c.cp = pick<std::int64_t>(rng, {1, 1, 2, 4});
  c.dp = pick<std::int64_t>(rng, {1, 1, 2, 4});
  if (moe) c.ep = pick<std::int64_t>(rng, {1, 8, 16, 32, 64});
  c.seq = pick<std::int64_t>(rng, {1024, 2048, 4096, 8192});
  c.batch = pick<double>(rng, {0.25, 0.5, 1, 1, 2, 4});
  c.grad_accum = pick<std::int64_t>(rng, {1, 1, 2});
  c.policy = pick<std::string>(rng, {"full", "minimal", "minimal_with_context", "save_qkv_proj", "qkv_proj_offloaded",
                                     "minimal_offloaded"});
  c.weights = pick<std::string>(rng, {"bf16", "fp8", "mxfp8", "nvfp4"});
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  c.lhs = coin();
  c.pipelined_transfers = coin();
  c.double_buffering = coin();
  c.sequence_parallel = moe || coin();
  c.tp_comm_overlap = coin();
  c.dp_overlap = coin();
  c.sharded_optimizer = coin();
  // The layout fields given outright or left to the framework (auto).
  auto on_off_auto = [&] { return pick<int>(rng, {0, 1, 2}); };
  c.cp_exchange = pick<std::string>(rng, {"ring", "all_gather", "auto"});
  if (const int v = on_off_auto(); v < 2) c.cp_shards_weights = v == 1;
  c.mesh_order = pick<std::string>(rng, {"maxtext", "megatron", "auto"});
  c.calibration = coin() ? "gb200-fitted" : "";
  if (const int v = on_off_auto(); v < 2) c.ep_shards_weights = v == 1;
  if (moe) {
    c.moe_dispatcher = coin() ? "flex" : "alltoall";
    c.mtp_layers = coin() ? 1 : 0;
    // Half the flex draws with HybridEP's 32 SMs, half with Megatron-Core's default (tied to a draw already made,
    // so that the sequences other tests draw stay as they were).
    if (c.moe_dispatcher == "flex" && c.mtp_layers == 1) c.moe_dispatcher_sms = 32;
    if (c.tp > 1 && c.cp == 1 && c.ep % c.tp == 0 && coin()) c.expert_tp = 1;  // experts folded over tp
    // Megatron's combined 1F1B, where it allows it (selective policies on device).
    c.ep_overlap = c.ep > 1 && c.policy != "full" && c.policy.find("offloaded") == std::string::npos && coin();
  }
  c.optimizer_moments_dtype = coin() ? "bf16" : "fp32";
  return c;
}

// A random pipelined run: the random layout with 2-8 stages, a schedule, interleaving and micro-batches.
inline RunConfig random_pipeline(std::mt19937& rng) {
  RunConfig c = random_config(rng);
  c.pp = pick<std::int64_t>(rng, {2, 4, 8});
  c.pp_schedule = pick<std::string>(rng, {"1f1b", "1f1b", "gpipe", "zb-h1"});
  c.vp = c.pp_schedule == "1f1b" ? pick<std::int64_t>(rng, {1, 2}) : 1;
  c.microbatches = c.pp * pick<std::int64_t>(rng, {1, 2});
  c.grad_accum = 1;
  c.batch = static_cast<double>(c.microbatches) / static_cast<double>(c.pp) * pick<double>(rng, {0.5, 1, 2});
  // Llama 405B's 126 and DeepSeek-V3's 61 layers split with the embedding and loss as layers, or unevenly.
  if (c.model == "llama3.1-405b") c.embedding_as_layer = c.loss_as_layer = true;
  if (c.model == "deepseek-v3-671b") {
    c.vp = 1;
    c.first_stage_layers = 61 - 15 * (c.pp - 1);
  }
  c.stage_policies.clear();
  c.ep_overlap = c.ep_overlap && c.pp_schedule == "1f1b" && c.vp > 1;  // Megatron: interleaved with pp > 1
  c.pp_p2p = c.vp > 1 ? "auto" : pick<std::string>(rng, {"auto", "overlapped", "blocking"});
  return c;
}

// The levers and settings the draws above leave at their defaults, on top of one: Megatron's state layout and
// bf16 gradients, weights kept gathered, FP8 attention, one memory lever at a time (activation offload of the
// first layers, recomputed layers, optimizer or parameter offload, FP8-saved activations, a layer range with a
// policy of its own, the MoE batch split, Megatron's selective recompute modules), and a model from a HuggingFace config (Qwen3-235B-A22B) for half
// of the MoE draws, half of which route with a busiest expert rank 1.5x the mean, and half of those with tp and cp > 1 fold
// their experts over or inside tp x cp; half the Megatron draws with ep_overlap delay their weight gradients; Muon for
// the Megatron draws that allow it (below). Some combinations are bad input; the caller skips those.
inline void add_levers(std::mt19937& rng, RunConfig& c) {
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  if (coin()) c.framework = "megatron";
  if (coin()) c.grad_reduce_dtype = "bf16";
  if (coin()) c.reshard_weights = false;
  if (coin()) c.attention_dtype = "fp8";
  switch (std::uniform_int_distribution<int>(0, 7)(rng)) {
    case 0: c.offload_layers = pick<std::int64_t>(rng, {1, 4, 10}); break;
    case 1: if (c.policy != "full") c.recompute_layers = pick<std::int64_t>(rng, {1, 2, 4}); break;
    case 2: c.optimizer_offload = pick<std::string>(rng, {"device", "host"}); break;
    case 3: c.parameter_offload = true; break;
    case 4: c.fp8_saved_activations = true; break;
    case 5: c.layer_policies = "0-3:minimal_offloaded"; break;
    case 6: if (c.model == "deepseek-v3-671b") c.moe_batch_split = 2; break;
    default:  // Megatron's selective recompute: what autograd keeps, some of its modules' tensors recomputed
      c.policy = pick<std::string>(rng, {"no_recompute", "selective"});
      for (const auto& name : hbmsim::module_tensor_names())
        if (coin()) c.tensors[name] = "remat";
      break;
  }
  if (c.model == "deepseek-v3-671b" && coin()) c.model = "hf/qwen3-235b-a22b.config.json";
  const bool moe = c.model == "deepseek-v3-671b" || c.model == "hf/qwen3-235b-a22b.config.json";
  if (moe && c.ep > 1 && coin()) c.moe_load_imbalance = 1.5;  // dropless routing's busiest expert rank
  // Experts folded over tp x cp (times an ep axis of 1 or 2), or inside it (tp x half the cp ranks), under
  // Megatron's reading: cp and ep ranks hold the other weights whole.
  if (moe && c.tp > 1 && c.cp > 1 && coin()) {
    c.expert_tp = 1;
    c.cp_shards_weights = c.ep_shards_weights = false;
    c.ep = c.tp * pick<std::int64_t>(rng, {c.cp / 2, c.cp, 2 * c.cp});
  }
  if (c.ep_overlap && c.framework == "megatron" && coin()) c.delay_wgrad = true;  // Megatron-Bridge's MoE recipes' pair
  // Megatron's sync-free experts (the 26.08 recipes: capacity 1.5, paged stash 1.2), on HybridEP.
  if (moe && c.framework == "megatron" && c.moe_dispatcher == "flex" && coin()) {
    c.moe_capacity_factor = 1.5;
    if (coin()) c.moe_paged_stash = 1.2;
  }
  // Megatron's Muon on the Megatron draws with bf16 gradients and fp32 moments that offload no state (tied to
  // draws already made): whole weights on every rank, so the GPUs fsdp would take go to dp.
  const std::int64_t model_parallel = c.tp * c.cp * c.ep * c.pp;
  if (c.framework == "megatron" && c.grad_reduce_dtype == "bf16" && c.optimizer_moments_dtype == "fp32" &&
      c.optimizer_offload == "off" && !c.parameter_offload && c.expert_tp != 1 && c.gpus % model_parallel == 0) {
    c.optimizer = "muon";
    c.dp = c.gpus / model_parallel;
    c.fsdp = 1;
    c.cp_shards_weights = c.ep_shards_weights = false;
  }
}

// The fields no draw above sets (hbmsim_stress --rare): Megatron's batch (micro-batch and global batch), a policy
// per stage, the last stage's layer count or a whole Megatron pipeline layout, FSDP gathers not pipelined, the
// LHS's memory slop, and Muon's blockwise tp mode. Kept apart from add_levers so that the sequences the suite's
// tests draw stay as they were. Some combinations are bad input; the caller skips those.
inline void add_rare_fields(std::mt19937& rng, RunConfig& c) {
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  const std::int64_t replicas = std::max<std::int64_t>(1, c.gpus / (c.tp * c.cp * c.pp));
  if (coin()) {  // Megatron's batch: sequences per replica per micro-step, and per step
    c.batch.reset();
    c.micro_batch = pick<std::int64_t>(rng, {1, 1, 2});
    c.global_batch = c.micro_batch * replicas * c.pp * pick<std::int64_t>(rng, {1, 2, 4});  // at least pp micro-batches
    c.grad_accum = 1;
    c.microbatches = 0;
  }
  const std::vector<std::string> presets = {"full", "minimal", "minimal_with_context", "save_qkv_proj", "qkv_proj_offloaded",
                                            "minimal_offloaded"};
  if (c.pp > 1 && coin()) {
    std::string stages;
    for (std::int64_t s = 0; s < c.pp; ++s) stages += (s ? "," : "") + pick(rng, presets);
    c.stage_policies = stages;
  }
  if (c.pp > 1) {
    const std::int64_t layers = hbmsim::resolve_model(c.model).num_layers;
    switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
      case 0:  // a last stage lighter than the others, which split the rest evenly (one chunk per stage)
        if (c.vp == 1 && c.first_stage_layers == 0 && !c.embedding_as_layer && !c.loss_as_layer) {
          const std::int64_t rest = (layers + c.pp - 1) / c.pp;
          c.last_stage_layers = layers - (c.pp - 1) * rest;
          if (c.last_stage_layers <= 0) c.last_stage_layers = 0;
        }
        break;
      case 1: {  // Megatron's layout string: every chunk's layers outright, the embedding first and the loss last
        const std::int64_t chunks = c.pp * c.vp;
        std::vector<std::int64_t> per(static_cast<std::size_t>(chunks), layers / chunks);
        for (std::int64_t i = 0; i < layers % chunks; ++i) ++per[static_cast<std::size_t>(i)];
        if (chunks > 1 && per[0] > 1 && coin()) {  // one layer moved from the first chunk to the last (an uneven split)
          --per.front();
          ++per.back();
        }
        std::string layout = "E";
        for (std::size_t i = 0; i < per.size(); ++i) layout += (i ? "|" : "") + std::string(static_cast<std::size_t>(per[i]), 't');
        c.pipeline_layout = layout + std::string(static_cast<std::size_t>(c.mtp_layers), 'm') + "L";
        c.first_stage_layers = c.last_stage_layers = 0;
        c.embedding_as_layer = c.loss_as_layer = false;
        break;
      }
      default: break;
    }
  }
  if (coin()) c.pipelined_collectives = false;
  if (coin()) c.memory_limit_slop = pick<double>(rng, {0.8, 1.0});
  if (c.optimizer == "muon" && coin()) c.muon_tp_mode = "blockwise";
}

}  // namespace test
