// Tensor, sequence, data and context parallelism against hand-derived figures.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "better_hardware.hpp"
#include "helpers.hpp"
#include "named_run.hpp"
#include "hwmodels/builtin.hpp"
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/run_config.hpp"
#include "planner/run_summary.hpp"
#include "sim/layer_plan.hpp"
#include "workloads/model.hpp"

using namespace hbmsim;

namespace {

// Llama 3.1 8B on 8 GPUs of `system` with `dp` data-parallel replicas (FSDP over the rest).
RunConfig llama8b_dp(const std::string& system, std::int64_t dp) {
  RunConfig c;
  c.system = system;
  c.model = "llama3.1-8b";
  c.gpus = 8;
  c.dp = dp;
  return c;
}

RunConfig llama8b_h100(std::int64_t tp) {
  RunConfig c;
  c.system = "h100-hgx";
  c.model = "llama3.1-8b";
  c.gpus = 8;
  c.tp = tp;
  c.batch = 2;
  c.seq = 8192;
  return c;
}
}  // namespace

TEST_CASE("tensor parallelism keeps model FLOPs per device and sends the Megatron-SP bytes per layer", "[parallel][tp]") {
  // Llama 3.1 8B (L = 32, d = 4096, 32 heads, 8 KV heads, F = 14336, V = 128256) on 8 H100s, per-device batch
  // 2 x 8192: each device's share of the model FLOPs does not depend on tp (MaxText counts per device).
  // With sequence parallelism every layer all-gathers the normed input of attention and of the MLP and
  // reduce-scatters their outputs: 2 AG + 2 RS forward, mirrored backward (2 RS + 2 AG), and the backward
  // gathers both inputs again for the weight gradients (attention_out saved, so no other replay). Each moves
  // the tp group's activation, T x d x 2 bytes with T = batch x tp x seq tokens, of which a device sends
  // (tp-1)/tp. The embedding and head add one RS + AG (the lookup's partial sums) and one AG + RS (the head's
  // input), and the loss all-reduces 3 fp32 statistics per token (2 (tp-1)/tp x 12 T bytes).
  const double model_flops = run_simulation(llama8b_h100(1)).model_flops_per_device;
  double prev_step = 0;
  for (std::int64_t tp : {1, 2, 4, 8}) {
    INFO("tp " << tp);
    RunConfig c = llama8b_h100(tp);
    c.policy = "custom";
    c.tensors = {{"attention_out", "device"}};
    c.lhs = false;  // synchronous collectives, as without comm/GEMM overlap
    auto r = run_simulation(c);
    CHECK(r.model_flops_per_device == Approx(model_flops).epsilon(1e-12));
    CHECK(r.mfu <= 1.0);
    CHECK(r.executed_flops_per_device >= r.model_flops_per_device);
    const double T = 2.0 * static_cast<double>(tp) * 8192, f = (tp - 1.0) / static_cast<double>(tp);
    const double act = T * 4096 * 2;
    const double expected = 32 * 10 * f * act + 4 * f * act + 2 * f * 12 * T;
    CHECK(r.comm_bytes.at("tp") == Approx(expected).epsilon(1e-9));
    // Without overlap the collectives add to the step: more tp, more exposed time.
    CHECK(r.step_time_s > prev_step);
    if (tp > 1) CHECK(r.exposed_s.at("tp") > 0);
    prev_step = r.step_time_s;
  }
}

TEST_CASE("Transformer Engine gathers an FP8 GEMM's input over tp in FP8, the gradient's reduce-scatter stays bf16",
          "[parallel][tp][fp8]") {
  // The test above's 10 collectives per layer, T x d elements each: with fp8_saved_activations (TE's quantized
  // linear inputs) the norm output is quantized before its sequence-parallel all-gather, so the forward
  // gathers of the QKV and MLP inputs and their replays for the weight gradients move 1 byte an element;
  // the reduce-scatters of their gradients, the output reduce-scatters and their backward gathers stay
  // 2 bytes. With the attention GEMMs in bf16 only the MLP input's two gathers shrink. Off: all 2 bytes.
  const std::int64_t tp = 4;
  const double T = 2.0 * tp * 8192, f = (tp - 1.0) / tp, Td = T * 4096;
  const double rest = 4 * f * Td * 2 + 2 * f * 12 * T;  // embedding, head and loss, as above
  struct Case {
    const char* attention;
    bool quantized_inputs;
    double layer_bytes;
  };
  for (const Case& k : {Case{"fp8", true, 4 * 1 + 6 * 2}, Case{"bf16", true, 2 * 1 + 8 * 2}, Case{"fp8", false, 10 * 2}}) {
    INFO("attention " << k.attention << ", fp8_saved_activations " << k.quantized_inputs);
    RunConfig c = llama8b_h100(tp);
    c.policy = "custom";
    c.tensors = {{"attention_out", "device"}};
    c.weights = "fp8";
    c.attention_dtype = k.attention;
    c.fp8_saved_activations = k.quantized_inputs;
    const auto r = run_simulation(c);
    CHECK(r.comm_bytes.at("tp") == Approx(32 * f * Td * k.layer_bytes + rest).epsilon(1e-9));
  }
}

TEST_CASE("without sequence parallelism tensor parallelism all-reduces, twice the bytes of each RS or AG", "[parallel][tp]") {
  // Megatron's f and g: an all-reduce after each row-parallel GEMM (forward) and before each column-parallel
  // one (backward). A ring all-reduce sends 2 (tp-1)/tp of the buffer: per layer 2 forward + 2 backward,
  // and nothing is gathered again. Embedding exit AR forward, head entry AR backward, the loss AR.
  RunConfig c = llama8b_h100(4);
  c.sequence_parallel = false;
  c.policy = "custom";
  c.tensors = {{"attention_out", "device"}};
  auto r = run_simulation(c);
  const double T = 2.0 * 4 * 8192, f = 3.0 / 4, act = T * 4096 * 2;
  CHECK(r.comm_bytes.at("tp") == Approx(32 * 4 * 2 * f * act + 2 * 2 * f * act + 2 * f * 12 * T).epsilon(1e-9));
  // The norm and residual activations are whole on every rank: the saved layer inputs are 4x those with SP.
  c.sequence_parallel = true;
  auto sp = run_simulation(c);
  CHECK(r.hbm_breakdown_bytes.at("saved_activations") > sp.hbm_breakdown_bytes.at("saved_activations"));
}

TEST_CASE("comm/GEMM overlap exposes only the first chunk of each tensor-parallel collective", "[parallel][tp]") {
  RunConfig c = llama8b_h100(8);
  c.lhs = false;
  auto plain = run_simulation(c);
  c.tp_comm_overlap = true;
  auto overlapped = run_simulation(c);
  CHECK(overlapped.comm_bytes.at("tp") == Approx(plain.comm_bytes.at("tp")).epsilon(1e-12));
  CHECK(overlapped.exposed_s.at("tp") < 0.5 * plain.exposed_s.at("tp"));
  CHECK(overlapped.step_time_s < plain.step_time_s);
}

TEST_CASE("data-parallel replicas all-reduce every gradient once per step by the ring formula", "[parallel][dp]") {
  // Llama 3.1 8B on 8 GPUs with dp 8 (no FSDP): each device holds all P parameters and sums its fp32
  // gradients with the other seven: a ring all-reduce sends 2 (dp-1)/dp x 4P bytes.
  RunConfig c = llama8b_dp("gb300-nvl72", 8);
  const double P = builtin_model("llama3.1-8b").total_params();
  auto r = run_simulation(c);
  CHECK(r.comm_bytes.at("dp") == Approx(2 * 7.0 / 8 * 4 * P).epsilon(1e-9));
  CHECK(r.busy_s.at("dp") > 0);
  CHECK(r.comm_bytes.at("fsdp") == 0);
  // Issued as each layer's backward ends, most of it hides behind the rest of the backward; after the
  // backward it is all exposed.
  c.dp_overlap = false;
  auto late = run_simulation(c);
  CHECK(late.comm_bytes.at("dp") == Approx(r.comm_bytes.at("dp")).epsilon(1e-12));
  CHECK(late.exposed_s.at("dp") > r.exposed_s.at("dp"));
  CHECK(late.step_time_s > r.step_time_s);
  // A sharded optimizer reduce-scatters the gradients and all-gathers the parameters: the same bytes, and
  // the optimizer state per device is 1/dp (Adam: 8 bytes per parameter).
  c.dp_overlap = true;
  c.sharded_optimizer = true;
  auto sharded = run_simulation(c);
  CHECK(sharded.comm_bytes.at("dp") == Approx(r.comm_bytes.at("dp")).epsilon(1e-9));
  CHECK(sharded.hbm_breakdown_bytes.at("optimizer_state") == Approx(8 * P / 8).epsilon(1e-12));
  CHECK(r.hbm_breakdown_bytes.at("optimizer_state") == Approx(8 * P).epsilon(1e-12));
}

TEST_CASE("FSDP inside data-parallel replicas syncs only each device's gradient shard", "[parallel][dp]") {
  // MaxText's hybrid layout: dp 2 outside fsdp 4. The reduce-scatter over fsdp leaves each device P/4 of the
  // gradients, which it all-reduces with its replica: 2 (2-1)/2 x 4P/4 bytes.
  RunConfig c = llama8b_dp("gb200-nvl72", 2);
  const double P = builtin_model("llama3.1-8b").total_params();
  auto r = run_simulation(c);
  CHECK(r.comm_bytes.at("dp") == Approx(2 * 0.5 * 4 * P / 4).epsilon(1e-9));
  CHECK(r.hbm_breakdown_bytes.at("parameters") == Approx(4 * P / 4).epsilon(1e-12));
}

TEST_CASE("Megatron's expert parallelism keeps the non-expert weights whole and sums their gradients over ep", "[parallel][ep]") {
  // DeepSeek-V3 on 64 GB200s, ep 64 (dp 1, fsdp 1), Megatron state with the distributed optimizer. Megatron-Core
  // partitions only the experts over ep: every expert-parallel rank holds all the other weights (2 bytes each)
  // and their fp32 gradients, and its DDP sums those over data parallelism, which contains the ep ranks; the
  // experts' gradients stay within expert data parallelism (here 1 rank). MaxText's rules shard the other
  // weights over ep as well, FSDP-style.
  RunConfig c;
  c.model = "deepseek-v3-671b";
  c.system = "gb200-nvl72";
  c.gpus = 64;
  c.ep = 64;
  c.seq = 1024;
  c.batch = 1;
  c.policy = "full";
  c.framework = "megatron";
  c.sharded_optimizer = true;
  const ModelSpec m = builtin_model(c.model);
  const double P = m.total_params(), P_expert = static_cast<double>(m.moe_layers()) * m.expert_params_per_layer();
  const double P_dense = P - P_expert;
  c.ep_shards_weights = false;
  const auto megatron = run_simulation(c);
  CHECK(megatron.hbm_breakdown_bytes.at("parameters") == Approx(2 * (P_dense + P_expert / 64)).epsilon(1e-12));
  CHECK(megatron.hbm_breakdown_bytes.at("gradients") == Approx(4 * (P_dense + P_expert / 64)).epsilon(1e-12));
  // 12 bytes of optimizer state per parameter, the dense ones' split over the 64 ranks that sum them.
  CHECK(megatron.hbm_breakdown_bytes.at("optimizer_state") == Approx(12 * (P_dense / 64 + P_expert / 64)).epsilon(1e-12));
  // Nothing is gathered before use; the dense gradients (fp32) are reduce-scattered over the 64 ranks once per
  // step and the updated weights (bf16) all-gathered back: 63/64 x (4 + 2) P_dense bytes out of each device.
  CHECK(megatron.comm_bytes.at("fsdp") == 0);
  CHECK(megatron.comm_bytes.at("dp") == Approx(63.0 / 64 * (4 + 2) * P_dense).epsilon(1e-9));
  c.ep_shards_weights = true;  // MaxText: everything over ep, nothing left to sum
  const auto maxtext = run_simulation(c);
  CHECK(maxtext.hbm_breakdown_bytes.at("parameters") == Approx(2 * P / 64).epsilon(1e-12));
  CHECK(maxtext.hbm_breakdown_bytes.at("optimizer_state") == Approx(12 * P / 64).epsilon(1e-12));
  CHECK(maxtext.comm_bytes.at("fsdp") > 0);
}

TEST_CASE("Megatron's DDP buffers: GEMMs read the stored weights and gradients land in main_grad, in place", "[parallel][megatron]") {
  // Llama 3.1 8B on 8 GB200s, dp 8 with the distributed optimizer, Megatron state (bf16 weights, fp32 main
  // gradients). Megatron-Core's param_and_grad_buffer.py all-gathers the updated weights into the bf16 param
  // buffer and reduce-scatters the gradient buffer in place, and TE's wgrad GEMMs accumulate into main_grad:
  // beside parameters (2 B), gradients (4 B) and optimizer state (12 B / 8) per parameter nothing is held
  // per layer, where XLA holds a layer's bf16 cast of its fp32 weights and its unsharded fp32 gradients.
  RunConfig c = llama8b_dp("gb200-nvl72", 8);
  c.fsdp = 1;
  c.framework = "megatron";
  c.sharded_optimizer = true;
  c.policy = "full";
  const ModelSpec m = builtin_model(c.model);
  const double P = m.total_params();
  // One layer's parameters: the SwiGLU MLP, and q, k, v, o with the layer's two RMSNorm weights.
  const double mlp = 3.0 * 4096 * 14336, attn = 4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096 + 2 * 4096;
  const PreparedRun run = prepare_run(c);
  const LayerTemplate& layer = run.graph.layer(0);
  CHECK(run.graph.weight_buffer_bytes(layer) == 0);
  CHECK(run.graph.grad_buffer_bytes(layer) == 0);
  CHECK(run.graph.table_buffer_bytes() == 0);
  const StepReport r = run_simulation(c);
  CHECK(r.hbm_breakdown_bytes.at("gathered_weights") == 0);
  CHECK(r.hbm_breakdown_bytes.at("collective_buffers") == 0);
  CHECK(r.hbm_breakdown_bytes.at("parameters") == Approx(2 * P).epsilon(1e-12));
  CHECK(r.hbm_breakdown_bytes.at("gradients") == Approx(4 * P).epsilon(1e-12));
  // FP8 GEMMs in the MLP read Transformer Engine's quantized copy of its weights: 1 byte per MLP parameter of
  // the layer (the attention's GEMMs stay bf16 and read the stored weights).
  RunConfig fp8 = c;
  fp8.weights = "fp8";
  const PreparedRun q = prepare_run(fp8);
  CHECK(q.graph.weight_buffer_bytes(q.graph.layer(0)) == Approx(mlp * 1).epsilon(1e-12));
  // Megatron FSDP over the 8 GPUs gathers each layer's bf16 weights and reduce-scatters its fp32 gradients out of
  // buffers of their own.
  RunConfig fsdp = c;
  fsdp.dp = 1;
  fsdp.fsdp = 8;
  const PreparedRun f = prepare_run(fsdp);
  CHECK(f.graph.weight_buffer_bytes(f.graph.layer(0)) == Approx(2 * (mlp + attn)).epsilon(1e-12));
  CHECK(f.graph.grad_buffer_bytes(f.graph.layer(0)) == Approx(4 * (mlp + attn)).epsilon(1e-12));
  // MaxText at dp 8 (fp32 weights): the bf16 cast and the unsharded gradients, as before.
  RunConfig maxtext = c;
  maxtext.framework = "maxtext";
  const PreparedRun x = prepare_run(maxtext);
  CHECK(x.graph.weight_buffer_bytes(x.graph.layer(0)) == Approx(2 * (mlp + attn)).epsilon(1e-12));
  CHECK(x.graph.grad_buffer_bytes(x.graph.layer(0)) == Approx(4 * (mlp + attn)).epsilon(1e-12));
  CHECK(run_simulation(maxtext).hbm_breakdown_bytes.at("gathered_weights") > 0);
}

TEST_CASE("the layout fields left auto read a config as its framework does, given ones win", "[parallel][megatron]") {
  RunConfig c;
  LayoutReading r = layout_reading(c);  // maxtext
  CHECK((r.mesh_order == "maxtext" && r.cp_exchange == "all_gather" && r.cp_shards_weights && r.ep_shards_weights));
  // Megatron's DDP and distributed optimizer (fsdp 1): context and expert ranks hold the other weights whole.
  c.framework = "megatron";
  c.fsdp = 1;
  c.dp = 8;
  r = layout_reading(c);
  CHECK((r.mesh_order == "megatron" && r.cp_exchange == "ring" && !r.cp_shards_weights && !r.ep_shards_weights));
  // Megatron-FSDP (fsdp > 1, given or filling the GPUs) shards them over its whole data-parallel group with the
  // context ranks, which holds the expert ranks too (mcore_fsdp_adapter.py's dp_cp group).
  for (std::int64_t fsdp : {0, 8}) {
    c.fsdp = fsdp;
    c.dp = 1;
    r = layout_reading(c);
    CHECK((r.mesh_order == "megatron" && r.cp_exchange == "ring" && r.cp_shards_weights && r.ep_shards_weights));
  }
  c.fsdp = 1;
  c.dp = 8;
  c.mesh_order = "dp,pp,fsdp,ep,cp,tp";
  c.cp_exchange = "all_gather";
  c.ep_shards_weights = true;
  r = layout_reading(c);
  CHECK((r.mesh_order == "dp,pp,fsdp,ep,cp,tp" && r.cp_exchange == "all_gather" && !r.cp_shards_weights && r.ep_shards_weights));

  // A run: Llama 3.1 8B on 16 H100s, tp 2 x cp 2 x fsdp 4 under Megatron's state (Megatron-FSDP). Left auto, it is
  // the run with Megatron-Core's readings given outright, its FSDP shards spanning cp: 2 bytes per parameter over
  // tp 2 x fsdp 4 x cp 2, half of what context ranks holding the weights whole (DDP's reading) keep.
  RunConfig run;
  run.system = "h100-hgx";
  run.model = "llama3.1-8b";
  run.gpus = 16;
  run.tp = 2;
  run.cp = 2;
  run.framework = "megatron";
  const StepReport automatic = run_simulation(run);
  RunConfig given = run;
  given.mesh_order = "megatron";
  given.cp_exchange = "ring";
  given.cp_shards_weights = given.ep_shards_weights = true;
  const StepReport megatron = run_simulation(given);
  CHECK(automatic.step_time_s == megatron.step_time_s);
  CHECK(automatic.hbm_peak_bytes == megatron.hbm_peak_bytes);
  CHECK(automatic.comm_bytes == megatron.comm_bytes);
  given.cp_shards_weights = given.ep_shards_weights = false;
  const StepReport whole = run_simulation(given);
  CHECK(megatron.hbm_breakdown_bytes.at("parameters") == Approx(whole.hbm_breakdown_bytes.at("parameters") / 2).epsilon(1e-12));
  // The same mesh with the 4 data-parallel ranks plain replicas (DDP): auto is DDP's reading, the weights whole.
  RunConfig ddp = run;
  ddp.fsdp = 1;
  ddp.dp = 4;
  RunConfig ddp_given = ddp;
  ddp_given.mesh_order = "megatron";
  ddp_given.cp_exchange = "ring";
  ddp_given.cp_shards_weights = ddp_given.ep_shards_weights = false;
  const StepReport ddp_auto = run_simulation(ddp), ddp_whole = run_simulation(ddp_given);
  CHECK(ddp_auto.step_time_s == ddp_whole.step_time_s);
  CHECK(ddp_auto.hbm_peak_bytes == ddp_whole.hbm_peak_bytes);

  // auto travels as a value: written, read back, and taken from the flag's text; anything else is refused.
  CHECK(run.to_json().at("cp_shards_weights") == "auto");
  CHECK(run.to_json().at("mesh_order") == "auto");
  CHECK(RunConfig::from_json(run.to_json(), "test").cp_shards_weights.is_auto());
  CHECK(RunConfig::from_json(given.to_json(), "test").cp_shards_weights == Switch(false));
  run.set("ep_shards_weights", "off", "--ep-shards-weights");
  CHECK(run.ep_shards_weights == Switch(false));
  run.set("ep_shards_weights", "auto", "--ep-shards-weights");
  CHECK(run.ep_shards_weights.is_auto());
  CHECK_THROWS_WITH(run.set("ep_shards_weights", "maybe", "--ep-shards-weights"),
                    "--ep-shards-weights = \"maybe\" (expected on, off or auto)");
}

TEST_CASE("expert_tp 1 folds the experts over tp: whole experts, one all-to-all over ep x tp, no tp gather", "[parallel][ep]") {
  // DeepSeek-V3 on 64 GB200s at tp 2, Megatron state, distributed optimizer, every GPU holding 1/64 of the
  // experts' weights in one of two ways:
  // - as today (expert tensor parallelism = tp): ep 32 beside tp 2; each GPU has 8 experts, each split over tp;
  //   the dispatched tokens are all-gathered over tp before the experts and reduce-scattered after them;
  // - folded (expert_tp 1, Megatron's MoE parallel folding): an expert group of 64 that spans tp (ep axis 32
  //   x tp 2); each GPU has 4 whole experts and runs its own sequence shard's tokens through them.
  // Worked out by hand:
  // - the same bytes per GPU: 2 x (P_dense / 2 + P_expert / 64);
  // - the same expert GEMM FLOPs per GPU: (T / 2) k tokens x the whole width = T k tokens x half of it;
  // - the same T / 2 x k tokens per GPU into the all-to-all, of which (G - 1) / G leave: G = 64 against 32;
  // - the same gradient sums (expert data parallelism 1, the dense weights over dp x ep = 32 in both);
  // - less tp traffic: the tokens' gathers and scatters are gone.
  RunConfig c;
  c.model = "deepseek-v3-671b";
  c.system = "gb200-nvl72";
  c.gpus = 64;
  c.tp = 2;
  c.ep = 32;
  c.seq = 1024;
  c.micro_batch = 1;
  c.policy = "full";
  c.framework = "megatron";
  c.mesh_order = "megatron";
  c.sharded_optimizer = true;
  c.ep_shards_weights = false;
  c.hbm_bytes = 1e13;  // only the accounting matters here
  const ModelSpec m = builtin_model(c.model);
  const double P = m.total_params(), P_expert = static_cast<double>(m.moe_layers()) * m.expert_params_per_layer();
  const auto split = run_simulation(c);
  c.expert_tp = 1;
  c.ep = 64;
  const auto folded = run_simulation(c);
  const auto graph = prepare_run(c).graph;
  CHECK(graph.mesh.size(Axis::ep) == 32);
  CHECK(graph.mesh.size(Axis::dp) == 1);
  CHECK(folded.hbm_breakdown_bytes.at("parameters") == Approx(2 * ((P - P_expert) / 2 + P_expert / 64)).epsilon(1e-12));
  CHECK(folded.hbm_breakdown_bytes.at("parameters") == Approx(split.hbm_breakdown_bytes.at("parameters")).epsilon(1e-12));
  CHECK(folded.executed_flops_per_device == Approx(split.executed_flops_per_device).epsilon(1e-12));
  CHECK(folded.comm_bytes.at("ep") == Approx(split.comm_bytes.at("ep") * (63.0 / 64) / (31.0 / 32)).epsilon(1e-12));
  CHECK(folded.comm_bytes.at("dp") == Approx(split.comm_bytes.at("dp")).epsilon(1e-12));
  CHECK(folded.comm_bytes.at("tp") < split.comm_bytes.at("tp"));
  const LayerTemplate& moe = graph.templates[static_cast<std::size_t>(graph.layer_template.back())];
  REQUIRE(moe.kind == "moe");
  for (const OpDef& op : moe.ops) {
    CHECK(op.name != "moe_all_gather");
    if (op.name == "dispatch_a2a") CHECK(op.comm.group == (AxisSet{Axis::ep, Axis::tp}));
  }
  CHECK(megatron_settings(c).find("--expert-tensor-parallel-size 1") != std::string::npos);

  // Folded over cp too (Megatron's folding maps the expert group onto tp x cp x dp ranks): cp 2 halves each
  // GPU's tokens, so the expert group of 64 now spans tp 2 x cp 2 x an ep axis of 16, with dp 1. By hand:
  // - the same bytes per GPU: the dense weights split over tp only (cp ranks hold them whole, as Megatron's
  //   do), every expert whole on one of the 64 GPUs;
  // - half the tokens per GPU, so half the FLOPs (attention too: causal load balancing) and half the bytes into
  //   the same group's all-to-all;
  // - the dense gradients summed over cp x ep = 32 ranks as before over ep; the experts' over nothing (each
  //   cp rank holds other experts), as before.
  RunConfig cp = c;
  cp.cp = 2;
  cp.cp_shards_weights = false;
  const auto with_cp = run_simulation(cp);
  const auto cp_graph = prepare_run(cp).graph;
  CHECK(cp_graph.mesh.size(Axis::ep) == 16);
  CHECK(cp_graph.mesh.size(Axis::dp) == 1);
  CHECK(with_cp.hbm_breakdown_bytes.at("parameters") == Approx(folded.hbm_breakdown_bytes.at("parameters")).epsilon(1e-12));
  CHECK(with_cp.executed_flops_per_device == Approx(0.5 * folded.executed_flops_per_device).epsilon(1e-12));
  CHECK(with_cp.comm_bytes.at("ep") == Approx(0.5 * folded.comm_bytes.at("ep")).epsilon(1e-12));
  CHECK(with_cp.comm_bytes.at("dp") == Approx(folded.comm_bytes.at("dp")).epsilon(1e-12));
  const LayerTemplate& cp_moe = cp_graph.templates[static_cast<std::size_t>(cp_graph.layer_template.back())];
  for (const OpDef& op : cp_moe.ops)
    if (op.name == "dispatch_a2a") CHECK(op.comm.group == (AxisSet{Axis::ep, Axis::cp, Axis::tp}));
  // MaxText's reading shards the weights over cp, which experts partitioned over cp cannot be.
  cp.cp_shards_weights = true;
  CHECK_THROWS_WITH(run_simulation(cp), Catch::Contains("expert_tp = 1 (experts folded over tp and cp = 2 while cp shards"));

  // An expert group inside tp x cp (ep 4 at tp 2 x cp 4): Megatron's ranks run tp innermost, then cp, so the
  // group is tp 2 x the first 2 of each 4 cp ranks; the mesh splits cp into an inner ep axis of 2 and an outer
  // cp axis of 2, inside dp 8 (fsdp 1). Against the whole group over tp x cp (ep 64 = ep axis 8 x tp 2 x cp 4), by hand:
  // - the same tokens per GPU (cp 4 in both), so the same FLOPs;
  // - the all-to-all's group is 4 GPUs, not 64: (4 - 1) / 4 of the same bytes leave instead of 63 / 64;
  // - each GPU holds 256 / 4 experts, not 256 / 64: parameters 2 x ((P - P_expert) / 2 + P_expert / 4);
  // - the dense gradients summed over dp 8 x cp 4 = 32 ranks as before; the experts' over the 16 ranks that
  //   hold the same ones (dp 8 x the 2 outer cp ranks), where the whole group had none.
  cp.cp_shards_weights = false;
  cp.cp = 4;
  const auto over = run_simulation(cp);
  RunConfig inside = cp;
  inside.ep = 4;
  inside.fsdp = 1;
  inside.dp = 8;
  const auto in = run_simulation(inside);
  const auto in_graph = prepare_run(inside).graph;
  CHECK(in_graph.mesh.size(Axis::ep) == 2);
  CHECK(in_graph.mesh.size(Axis::cp) == 2);
  CHECK(in_graph.mesh.size(AxisSet{Axis::dp, Axis::fsdp}) == 8);
  CHECK(in_graph.mesh.order == (MeshOrder{Axis::pp, Axis::dp, Axis::fsdp, Axis::cp, Axis::ep, Axis::tp}));
  CHECK(in_graph.mesh.size(in_graph.grad_sync) == 32);
  CHECK(in_graph.mesh.size(in_graph.expert_grad_sync) == 16);
  CHECK(prepare_run(cp).graph.mesh.size(prepare_run(cp).graph.expert_grad_sync) == 1);
  CHECK(in.executed_flops_per_device == Approx(over.executed_flops_per_device).epsilon(1e-12));
  CHECK(in.comm_bytes.at("ep") == Approx(over.comm_bytes.at("ep") * (3.0 / 4) / (63.0 / 64)).epsilon(1e-12));
  CHECK(in.hbm_breakdown_bytes.at("parameters") == Approx(2 * ((P - P_expert) / 2 + P_expert / 4)).epsilon(1e-12));
  CHECK(in.comm_bytes.at("dp") > over.comm_bytes.at("dp"));  // the experts' gradients are summed now
  const LayerTemplate& in_moe = in_graph.templates[static_cast<std::size_t>(in_graph.layer_template.back())];
  int a2a = 0, cp_steps = 0;  // every all-to-all over the group, every context exchange over all cp ranks
  for (const OpDef& op : in_moe.ops) {
    if (op.name == "dispatch_a2a") a2a += op.comm.group == (AxisSet{Axis::ep, Axis::tp}) ? 1 : -100;
    if (op.comm.axis == Axis::cp) cp_steps += op.comm.group == (AxisSet{Axis::cp, Axis::ep}) ? 1 : -100;
  }
  CHECK(a2a == 1);
  CHECK(cp_steps > 0);
  CHECK(resolved_run_lines(resolved_run(inside, prepare_run(inside)))[1].find("experts whole over tp x 2 of the 4 cp ranks = 4 GPUs") !=
        std::string::npos);
  // Refused: a group that is not tp times a divisor of cp, and the cp ranks sharding the other weights.
  inside.ep = 6;
  CHECK_THROWS_WITH(run_simulation(inside), Catch::Contains("ep = 6 (with expert_tp = 1 the expert group spans tp x cp = 8: "
                                                            "ep must be a multiple of it, or tp times a divisor of cp)"));
  inside.ep = 4;
  inside.ep_shards_weights = true;
  CHECK_THROWS_WITH(run_simulation(inside), Catch::Contains("needs ep_shards_weights off"));

  // The expert group must be a multiple of tp, and only 1 or tp are expert tensor parallel degrees hbmsim runs.
  c.ep = 8;
  c.tp = 4;
  c.gpus = 32;
  c.expert_tp = 2;
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("expert_tp = 2 (expected 0 or tp = 4, or 1"));
  c.expert_tp = 1;
  c.ep = 6;
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("ep = 6 (with expert_tp = 1 the expert group spans tp = 4"));
}

TEST_CASE("an expert group inside tp x cp splits the cp axis in place, whatever the mesh order", "[parallel][ep]") {
  // ep 4 at tp 2 x cp 4: the ep axis (2 ranks) becomes the inner part of cp, right inside the cp axis (2 ranks), the
  // other axes where the order puts them; the product of the mesh is the GPU count (8 x 2 x 2 x 2 = 64).
  Parallelism p;
  p.tp = 2, p.cp = 4, p.ep = 2, p.dp = 8, p.fsdp = 1;
  p.experts_fold_tp = p.experts_inside_cp = true;
  p.cp_shards_weights = p.ep_shards_weights = false;
  for (const auto& [order, split] : {std::pair{megatron_mesh_order(), MeshOrder{Axis::pp, Axis::dp, Axis::fsdp, Axis::cp, Axis::ep, Axis::tp}},
                                     {maxtext_mesh_order(), MeshOrder{Axis::dp, Axis::pp, Axis::fsdp, Axis::cp, Axis::ep, Axis::tp}},
                                     {parse_mesh_order("cp,dp,pp,fsdp,tp,ep", "test"),
                                      MeshOrder{Axis::cp, Axis::ep, Axis::dp, Axis::pp, Axis::fsdp, Axis::tp}}}) {
    p.order = order;
    const Mesh m = p.mesh();
    CHECK(m.order == split);
    CHECK(m.size(Axis::cp) == 2);
    CHECK(m.size(Axis::ep) == 2);
    CHECK(m.devices() == 64);
    CHECK(m.size(p.context_axes()) == 4);  // every context rank
    CHECK(m.size(p.expert_axes()) == 4);   // the expert group: tp x 2 of the cp ranks
  }
  CHECK(p.expert_group() == 4);
  CHECK(expert_group_span(p) == "tp x 2 of the 4 cp ranks");
  p.experts_inside_cp = false;
  p.ep = 1;  // the whole group over tp x cp: 8 GPUs, no ep axis of its own
  CHECK(p.expert_group() == 8);
  CHECK(p.expert_axes() == (AxisSet{Axis::ep, Axis::cp, Axis::tp}));
  CHECK(expert_group_span(p) == "ep x cp x tp");
  p.cp = 1;
  CHECK(expert_group_span(p) == "ep x tp");
  p.experts_fold_tp = false;
  CHECK(expert_group_span(p) == "ep");
}

TEST_CASE("dropless routing's load imbalance slows the busiest expert rank's all-to-alls and GEMMs, not its memory",
          "[parallel][ep]") {
  // Mixtral 8x7B on 8 H100s, tp 2 with sequence parallelism, ep 4 with whole experts (expert tp 1), batch 1 x
  // seq 4096, Megatron, no recompute: each GPU routes Ts = 4096 tokens to k = 2 of 8 experts, so it receives
  // Ts x k = 8192 rows on average. With moe_load_imbalance f the device simulated is the busiest rank: f x 8192
  // rows through its experts (d = 4096, F = 14336: three GEMMs of 2 x rows x d x F FLOPs forward, twice that
  // backward) and its activation (a memory op over its 3 x 224 MiB, counted as FLOPs one per byte, twice
  // backward), and f times the bytes over ep in each all-to-all. By hand, per MoE layer and unit of f:
  //   GEMMs      3 x (2 x 8192 x 4096 x 14336) x 3 (forward, two backward dots)
  //   activation 3 x 224 MiB x 3
  RunConfig c = test::mixtral_h100_folded();
  const auto balanced = run_simulation(c);
  c.moe_load_imbalance = 1.5;
  const auto skewed = run_simulation(c);
  const double gemm = 3 * (2 * 8192.0 * 4096 * 14336) * 3, act = 3 * 224.0 * (1 << 20) * 3;
  CHECK(skewed.executed_flops_per_device - balanced.executed_flops_per_device == Approx(0.5 * 32 * (gemm + act)).epsilon(1e-9));
  CHECK(skewed.comm_bytes.at("ep") == Approx(1.5 * balanced.comm_bytes.at("ep")).epsilon(1e-12));
  CHECK(skewed.comm_bytes.at("tp") == balanced.comm_bytes.at("tp"));
  CHECK(skewed.model_flops_per_device == balanced.model_flops_per_device);
  CHECK(skewed.hbm_breakdown_bytes.at("saved_activations") == balanced.hbm_breakdown_bytes.at("saved_activations"));
  CHECK(skewed.step_time_s > balanced.step_time_s);
  // Bad input: below 1, not a number, more than the expert group (4 GPUs) could concentrate, or no experts.
  for (const auto& [f, why] : std::vector<std::pair<double, std::string>>{
           {0.9, "moe_load_imbalance = 0.9 (must be >= 1"},
           {std::nan(""), "(must be >= 1"},
           {4.5, "moe_load_imbalance = 4.5 (more than the expert group's 4 GPUs"}}) {
    c.moe_load_imbalance = f;
    CHECK_THROWS_WITH(run_simulation(c), Catch::Contains(why));
  }
  RunConfig dense = llama8b_h100(2);
  dense.moe_load_imbalance = 1.2;
  CHECK_THROWS_WITH(run_simulation(dense), Catch::Contains("moe_load_imbalance = 1.2 (the model has no MoE layers)"));
}

TEST_CASE("context parallelism divides activations by cp and exchanges keys and values by hand formula", "[parallel][cp]") {
  // Llama 3.1 70B (L = 80, d = 8192, 8 KV heads of 128) with tp 8, one sequence per replica (micro_batch 1).
  // Each context rank holds seq/cp tokens, so every activation of a layer is 1/cp of the cp = 1 one, and so
  // is the memory the saved layer inputs take at the end of the forward pass (policy full: only
  // decoder_layer_input, (seq/cp)/tp x d x 2 bytes per layer). Keys and values of a rank: 2 x (seq/cp) x 1 head x
  // 128 x 2 bytes. The forward sends cp-1 such blocks (ring steps, or an all-gather's (cp-1)/cp of cp
  // blocks); the backward sends them again for the recomputed attention and sends their gradients back.
  for (std::int64_t seq : {32768, 131072})
    for (const char* exchange : {"ring", "all_gather"}) {
      double saved_cp1 = 0;
      StepGraph graph_cp1;
      for (std::int64_t cp : {1, 2, 4}) {
        INFO("seq " << seq << " cp " << cp << " " << exchange);
        RunConfig c;
        c.system = "gb200-nvl72";
        c.model = "llama3.1-70b";
        c.gpus = 8 * cp;
        c.tp = 8;
        c.cp = cp;
        c.micro_batch = 1;
        c.seq = seq;
        c.cp_exchange = exchange;
        c.hbm_bytes = 1e13;  // only the accounting matters here
        auto r = run_simulation(c);
        auto graph = prepare_run(c).graph;
        // Saved layer inputs at the end of the forward pass: all 80 of them, plus the last layer's output.
        const double saved = 81 * graph.tensor_bytes("decoder_layer_input");
        CHECK(saved == Approx(81 * (static_cast<double>(seq / cp) / 8) * 8192 * 2).epsilon(1e-12));
        if (cp == 1) {
          saved_cp1 = saved;
          graph_cp1 = graph;
        } else {
          CHECK(saved == Approx(saved_cp1 / static_cast<double>(cp)).epsilon(1e-12));
          for (const char* name : {"query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwo"})
            CHECK(graph.tensor_bytes(name) == Approx(graph_cp1.tensor_bytes(name) / static_cast<double>(cp)).epsilon(1e-12));
        }
        const double kv = 2.0 * static_cast<double>(seq / cp) * 1 * 128 * 2;
        CHECK(r.comm_bytes.at("cp") == Approx(80 * 3 * (cp - 1) * kv).epsilon(1e-9));
      }
    }
}

TEST_CASE("degrees that do not divide the model, the GPUs or the sequence exit 2 naming the field", "[parallel][errors]") {
  auto error_of = [](RunConfig c) {
    try {
      run_simulation(c);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  RunConfig c = llama8b_h100(1);
  c.tp = 3;
  c.gpus = 6;
  CHECK(error_of(c) == "tp = 3 (num_query_heads = 32 is not divisible by it)");
  c = llama8b_h100(1);
  c.gpus = 16;
  c.tp = 16;  // 32 heads split 16 ways is fine; 8 KV heads are replicated, 16 is a multiple of 8
  CHECK(error_of(c) == "no error");
  c.model = "llama3.1-405b";  // 128 heads, 8 KV heads: tp 12 divides neither
  c.gpus = 12;
  c.tp = 12;
  CHECK(error_of(c) == "tp = 12 (num_query_heads = 128 is not divisible by it)");
  c = llama8b_h100(1);
  c.cp = 3;
  c.gpus = 6;
  CHECK(error_of(c) == "cp = 3 (seq = 8192 is not divisible by 2 x cp = 6, which causal load balancing needs)");
  c = llama8b_h100(1);
  c.cp = 2;
  c.tp = 8;
  CHECK(error_of(c) == "gpus = 8 (fewer than tp*ep*dp*cp*pp = 8*1*1*2*1)");
  c = llama8b_h100(1);
  c.batch = 0.5;
  CHECK(error_of(c) == "batch = 0.5 (sequences per model replica, batch x tp x cp = 0.5 x 1 x 1 = 0.5, must be whole)");
  c.tp = 2;
  CHECK(error_of(c) == "no error");
  c = llama8b_h100(1);
  c.micro_batch = 2;
  CHECK(error_of(c).find("micro_batch = 2 (give the batch either as batch") == 0);
  c.batch.reset();
  c.global_batch = 20;  // 8 replicas x 2 = 16 sequences per micro-step
  CHECK(error_of(c) == "global_batch = 20 (not a multiple of sequences per replica x data-parallel replicas = 2 x 8 = 16)");
  c.global_batch = 64;
  auto r = run_simulation(c);
  CHECK(r.grad_accum == 4);
  CHECK(r.global_batch == 64);
  c = llama8b_h100(1);
  c.model = "deepseek-v3-671b";
  c.gpus = 6;
  c.ep = 3;
  CHECK(error_of(c) == "ep = 3 (num_experts = 256 is not divisible by it)");
  c.ep = 1;
  c.pp = 2;
  CHECK(error_of(c).find("pp = 2 (num_layers = 61 is not divisible by pp x vp = 2") == 0);
}

TEST_CASE("reports give tokens per device, the global batch and the layout", "[parallel]") {
  // 8 GPUs, tp 2, per-device batch 2 at seq 4096 with 2 accumulation steps: 4 replicas of 2 devices, each
  // running 4 sequences per micro-step, 32 sequences per step; per device 2 x 4096 x 2 tokens per step.
  RunConfig c;
  c.system = "h200-hgx";
  c.gpus = 8;
  c.tp = 2;
  c.batch = 2;
  c.grad_accum = 2;
  auto r = run_simulation(c);
  CHECK(r.global_batch == 32);
  CHECK(r.tokens_per_device_per_step == 2.0 * 4096 * 2);
  CHECK(r.tokens_per_s_per_device == Approx(r.tokens_per_device_per_step / r.step_time_s));
  CHECK(r.mesh == "fsdp 4 x tp 2 (maxtext order)");
}

TEST_CASE("Megatron runs in program order: a collective no library overlaps holds the compute stream throughout",
          "[parallelism][megatron]") {
  // PyTorch has no latency-hiding scheduler: a synchronous collective waits for the compute before it and the
  // compute after it waits for it, so the compute stream idles for exactly its length: exposed = busy.
  RunConfig moe;
  moe.model = "hf/qwen3-30b-a3b.config.json";
  moe.system = "h100-hgx";
  moe.gpus = 8;
  moe.ep = 8;
  moe.seq = 2048;
  moe.batch = 1;
  moe.ep_shards_weights = false;  // one layout reading under both frameworks (auto differs between them)
  moe.framework = "megatron";
  const StepReport a2a = run_simulation(moe);
  REQUIRE(a2a.busy_s.at("ep") > 0.01);
  CHECK(a2a.exposed_s.at("ep") == Approx(a2a.busy_s.at("ep")).epsilon(1e-9));
  // XLA's LHS (maxtext) runs the shared expert and other independent work beside the all-to-alls.
  moe.framework = "maxtext";
  const StepReport xla = run_simulation(moe);
  CHECK(xla.busy_s.at("ep") == Approx(a2a.busy_s.at("ep")).epsilon(1e-9));
  CHECK(xla.exposed_s.at("ep") < 0.9 * xla.busy_s.at("ep"));

  // Tensor parallelism: synchronous without Transformer Engine's userbuffers; with them only the first of tp
  // chunks of a collective its GEMM waits for is exposed, so most of the time hides.
  RunConfig dense = llama8b_h100(8);
  dense.framework = "megatron";
  dense.batch.reset();
  dense.micro_batch = 1;
  dense.global_batch = 1;
  const StepReport sync = run_simulation(dense);
  CHECK(sync.exposed_s.at("tp") == Approx(sync.busy_s.at("tp")).epsilon(1e-9));
  dense.tp_comm_overlap = true;
  const StepReport te = run_simulation(dense);
  CHECK(te.busy_s.at("tp") == Approx(sync.busy_s.at("tp")).epsilon(1e-9));
  CHECK(te.exposed_s.at("tp") < 0.5 * te.busy_s.at("tp"));
}

TEST_CASE("without LHS a layer's collectives run one at a time, each after the one issued before it",
          "[parallelism][maxtext]") {
  // XLA without the latency-hiding scheduler puts each collective's done right after its start, so two issued
  // back to back (the backward of a MoE layer with a shared expert replays the combine all-to-all and then the
  // tp all-gather of the MLP's normed input, nothing computed between them) run one after the other, not side
  // by side on their two links. Qwen1.5-MoE-A2.7B on 8 H100s, tp 2 x ep 4: no tp op overlaps an ep op (24
  // such pairs did, one per layer, when the compute after them waited only for the second).
  RunConfig c;
  c.model = "hf/qwen1.5-moe-a2.7b.config.json";
  c.system = "h100-hgx";
  c.gpus = 8;
  c.tp = 2;
  c.ep = 4;
  c.seq = 2048;
  c.batch = 1;
  c.lhs = false;
  c.policy = "full";
  const test::NamedRun run = test::named_run(c);
  struct Span { double start_s, end_s; std::string name; };
  std::vector<Span> spans;
  for (std::size_t i = 0; i < run.p.ops.size(); ++i) {
    const std::string& q = run.p.queues[static_cast<std::size_t>(run.p.ops[i].queue)].name;
    if ((q == "tp" || q == "ep") && run.r.end_s[i] > run.r.start_s[i]) spans.push_back({run.r.start_s[i], run.r.end_s[i], run.names[i]});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start_s < b.start_s; });
  REQUIRE(spans.size() > 100);
  std::size_t overlapping = 0;
  std::string first;
  for (std::size_t i = 1; i < spans.size(); ++i)
    if (spans[i].start_s < spans[i - 1].end_s * (1 - 1e-12) && overlapping++ == 0)
      first = spans[i - 1].name + " and " + spans[i].name;
  INFO("first overlap: " << first);
  CHECK(overlapping == 0);
}

TEST_CASE("Megatron's backward is program order, each GEMM's input gradient before its weight gradient",
          "[parallelism][megatron]") {
  // Autograd runs a layer's backward in reverse: each op's backward after the one after it, and Transformer
  // Engine computes a GEMM's dgrad before its wgrad (so the dgrad's collective may run beside the wgrad).
  RunConfig c = llama8b_h100(8);
  c.framework = "megatron";
  c.tp_comm_overlap = true;
  c.policy = "minimal";  // nothing replayed: the backward steps only
  const PreparedRun run = prepare_run(c);
  const LayerTemplate& t = run.graph.templates.front();
  const Network net(run.system, run.graph.mesh);
  const Costs costs{run.system, net};
  TemplatePlan plan;
  plan_template(t, run.policy, costs, run.graph, run.options, plan);
  CHECK_FALSE(plan.scheduled);
  std::vector<std::pair<TemplatePlan::Kind, std::size_t>> expected;
  for (std::size_t o = t.ops.size(); o-- > 0;) {
    if (t.ops[o].kind == OpKind::gemm) {
      expected.push_back({TemplatePlan::Kind::bwd_x, o});
      expected.push_back({TemplatePlan::Kind::bwd_w, o});
    } else {
      expected.push_back({TemplatePlan::Kind::bwd, o});
    }
  }
  std::vector<std::pair<TemplatePlan::Kind, std::size_t>> got;
  for (const auto& s : plan.steps)
    if (s.kind != TemplatePlan::Kind::replay) got.push_back({s.kind, s.op});
  CHECK(got == expected);
  // The same layer under XLA's LHS is list-scheduled.
  c.framework = "maxtext";
  const PreparedRun xla = prepare_run(c);
  plan_template(t, xla.policy, costs, xla.graph, xla.options, plan);
  CHECK(plan.scheduled);
}

TEST_CASE("a collective's output is taken where it is issued, so twice the network holds no more at the peak",
          "[parallelism][invariants]") {
  // A stress draw (seed 100, --squeeze): Qwen3-235B-A22B on 128 B200s, tp 8 x cp 4 (ring) x dp 4, `selective`
  // under LHS. At the peak (the MTP layer's expert backward) twice the network had finished the reduce-scatter
  // before it on the tensor-parallel queue and started the next all-gather, whose 512 MiB output came alive
  // when it started; on the base network it had not started (386.6 against 387.1 GiB). The output now comes
  // alive when the all-gather is ready, as XLA assigns it from its start's place in the schedule, on both.
  const auto doc = nlohmann::json::parse(R"({"model": "hf/qwen3-235b-a22b.config.json", "system": "b200-hgx", "gpus": 128,
      "tp": 8, "cp": 4, "cp_exchange": "ring", "dp": 4, "batch": 4, "seq": 2048, "attention_dtype": "fp8", "policy": "selective",
      "tensors": {"mlp_act": "remat", "mlp_norm": "remat", "moe_dispatched": "remat"}, "moe_dispatcher": "flex",
      "mtp_layers": 1, "tp_comm_overlap": true, "reshard_weights": false, "lhs": true, "pipelined_collectives": true})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const StepReport base = run_simulation(c);
  const StepReport faster = run_simulation(test::on_faster_network(c, prepare_run(c).system));
  REQUIRE(faster.step_time_s < base.step_time_s);
  CHECK(faster.hbm_peak_bytes <= base.hbm_peak_bytes * (1 + 1e-12));
}
