// Gated DeltaNet layers (Qwen3-Next's linear_attention layer_types): parameter counts against the published
// size, MaxText's model FLOPs, the layer's ops and their tensor-parallel split, an end-to-end step, and the
// inputs refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <random>

#include "better_hardware.hpp"
#include "helpers.hpp"
#include "planner/run_summary.hpp"
#include "random_configs.hpp"
#include "workloads/step_graph.hpp"

using namespace hbmsim;
using test::hf_doc;

namespace {

ModelSpec qwen3_next(const nlohmann::json& doc) { return load_hf_config(doc, "qwen3-next.json"); }

// The sum of one kind of op's forward FLOPs in a layer template.
double flops_of(const LayerTemplate& t, OpKind kind) {
  double f = 0;
  for (const auto& op : t.ops)
    if (op.kind == kind) f += op.flops;
  return f;
}

}  // namespace

TEST_CASE("Gated DeltaNet: Qwen3-Next-80B-A3B's parameters by hand and against Qwen's 80B / 3B", "[workloads][hf][gdn]") {
  // d 2048, L 48 (every fourth full attention: 12, the rest Gated DeltaNet: 36), H 16, K 2, h 256, V 151936;
  // linear key heads 16, value heads 32, head dims 128, convolution 4 taps; 512 experts of 512, 10 per token, a
  // gated shared expert of 512 in every layer. Per layer:
  //   full attention: norms 2d + q with its gate 2*d*H*h + k, v 2*d*K*h + o H*h*d + q/k norms 2h = 27,267,584
  //   Gated DeltaNet (key dim Kd = 16*128 = 2048, value dim Vd = 32*128 = 4096): norms 2d + in_proj_qkvz
  //     d*(2Kd + 2Vd) + in_proj_ba d*2*32 + convolution (2Kd + Vd)*4 + dt_bias and A_log 2*32 + gated norm 128
  //     + out_proj Vd*d = 33,722,560
  //   MoE: router d*512 + experts 512*3*d*512 + shared expert 3*d*512 + its gate d = 1,614,809,088
  // Total 2*V*d + d + 12*27,267,584 + 36*33,722,560 + 48*1,614,809,088 = 79,674,391,296 (Qwen: 80B); active with
  // 10 experts 3,874,929,408, 3.25B without the two tables (Qwen: 3B).
  const auto m = qwen3_next(hf_doc("qwen3-next-80b-a3b.config.json"));
  CHECK(m.attention_params_per_layer() == 27267584.0);
  CHECK(m.linear_attention_params_per_layer() == 33722560.0);
  CHECK(m.total_params() == 79674391296.0);
  CHECK(m.activated_params() == 3874929408.0);
  CHECK(std::abs(m.total_params() - 80e9) <= 0.5e9);
  CHECK(std::abs(m.activated_params() - 2 * 151936.0 * 2048 - 3e9) <= 0.3e9);
  REQUIRE(m.linear_attention_layer_ids.size() == 36);
  CHECK(m.is_linear_attention_layer(0));
  CHECK(!m.is_linear_attention_layer(3));
  CHECK(!m.is_linear_attention_layer(47));
  CHECK((m.attention_output_gate && m.qk_norm && m.shared_expert_gate && !m.qkv_bias));
  CHECK(m.moe_layers() == 48);
  // Without layer_types the class puts full attention at each full_attention_interval-th layer (default 4).
  auto doc = hf_doc("qwen3-next-80b-a3b.config.json");
  doc.erase("layer_types");
  CHECK(qwen3_next(doc).linear_attention_layer_ids == m.linear_attention_layer_ids);
  doc.erase("full_attention_interval");
  CHECK(qwen3_next(doc).linear_attention_layer_ids == m.linear_attention_layer_ids);
  doc["full_attention_interval"] = 2;
  CHECK(qwen3_next(doc).linear_attention_layer_ids.size() == 24);
  // A model file keeps the layers and the shape.
  auto back = load_model(m.to_json(), "roundtrip");
  CHECK(back.to_json() == m.to_json());
  CHECK(back.total_params() == m.total_params());
}

TEST_CASE("Gated DeltaNet: Qwen3.5-35B-A3B's language model by hand and against Qwen's 35B / 3B", "[workloads][hf][gdn]") {
  // Qwen3_5MoeForConditionalGeneration's text_config: Qwen3-Next's layers (the same 27,267,584 per gated attention
  // layer and 33,722,560 per Gated DeltaNet layer) over 40 layers (10 attention), 256 experts of 512 with 8 per
  // token and the gated shared expert of 512 in every layer, V 248320, no intermediate_size (no dense layer):
  //   MoE per layer d*256 + 256*3*d*512 + 3*d*512 + d = 808,978,432
  //   total 2*V*d + d + 10*27,267,584 + 30*33,722,560 + 40*808,978,432 = 34,660,610,688 (Qwen: 35B)
  //   active with 8 experts: MoE per layer 28,837,888, in all 3,454,988,928 (Qwen: 3B; 2.44B without the tables)
  const auto doc = hf_doc("qwen3.5-35b-a3b.config.json");
  const auto m = load_hf_config(doc, "qwen3.5.json");
  CHECK(m.total_params() == 34660610688.0);
  CHECK(m.activated_params() == 3454988928.0);
  CHECK(std::abs(m.total_params() - 35e9) <= 0.5e9);
  CHECK(m.linear_attention_layer_ids.size() == 30);
  CHECK(m.moe_layers() == 40);
  CHECK(m.mlp_dim == m.moe_mlp_dim);  // no dense width given; no dense layer uses it
  // attn_output_gate false: 10 layers' gate halves of q_proj (16*256*2048 each) fewer.
  auto ungated = doc;
  ungated["text_config"]["attn_output_gate"] = false;
  CHECK(m.total_params() - load_hf_config(ungated, "q.json").total_params() == 10.0 * 16 * 256 * 2048);
  // A dense layer without a dense width is refused naming the key that made it.
  auto dense = doc;
  dense["text_config"]["mlp_only_layers"] = {3};
  CHECK_THROWS_WITH(load_hf_config(dense, "q.json"),
                    "q.json: text_config.mlp_only_layers = [3] (makes dense layers, but intermediate_size (their width) is missing)");
  // Simulated end to end: 32 GB200s, experts over 16, cp 2 over both mixers.
  auto res = test::cli("simulate --model hf/qwen3.5-35b-a3b.config.json --system gb200-nvl72 --gpus 32 --ep 16 --cp 2 --seq 16384 --json");
  REQUIRE(res.status == 0);
  auto j = nlohmann::json::parse(res.out);
  CHECK(j.at("mfu").get<double>() <= 1.0);
  CHECK(j.at("fits").get<bool>());
  CHECK(j.at("hbm_breakdown_bytes").at("parameters").get<double>() == Approx(34660610688.0 * 4 / 32).epsilon(1e-9));
}

TEST_CASE("Gated DeltaNet: Qwen3.5-397B-A17B's language model by hand and against Qwen's 397B / 17B", "[workloads][hf][gdn]") {
  // The same layer kinds at d 4096, V 248320, 60 layers (15 gated attention, every fourth), 512 experts of 1024
  // with 10 per token and a gated shared expert of 1024:
  //   gated attention: q with its gate 32*256*2*d + k, v 2*(2*256*d) + o 32*256*d + q/k norms 2*256 + 2d = 104,866,304
  //   Gated DeltaNet (16 key heads, 64 value heads, 128 wide): qkvz d*(2*16*128 + 2*64*128) + ba d*2*64
  //     + conv (2*16*128 + 64*128)*4 + A_log, dt_bias 2*64 + norm 128 + out 64*128*d + 2d = 118,022,400
  //   MoE: d*512 + 512*3*d*1024 + 3*d*1024 + d = 6,457,135,104
  //   total 2*V*d + d + 15*104,866,304 + 45*118,022,400 + 60*6,457,135,104 = 396,346,350,336 (Qwen: 397B)
  //   active with 10 experts: MoE per layer d*512 + 10*3*d*1024 + 3*d*1024 + d = 140,513,280, in all
  //   17,349,040,896 (Qwen: 17B)
  const auto m = load_hf_config(hf_doc("qwen3.5-397b-a17b.config.json"), "qwen3.5-397b.json");
  CHECK(m.total_params() == 396346350336.0);
  CHECK(m.activated_params() == 17349040896.0);
  CHECK(std::abs(m.total_params() - 397e9) <= 1e9);
  CHECK(std::abs(m.activated_params() - 17e9) <= 0.5e9);
  CHECK(m.linear_attention_layer_ids.size() == 45);
  CHECK(m.moe_layers() == 60);
}

TEST_CASE("Gated DeltaNet: model FLOPs follow MaxText's qwen3_next count", "[workloads][gdn]") {
  // MaxText calculate_tflops_training_per_device with calculate_gated_delta_net_flops_per_device, B 1, S 4096,
  // everything x3 (hbmsim counts the shared expert's gate logit in the router, 2 B S d (512 + 1)):
  //   MoE per layer 2BSd*513 + 6BS*512*d*10 + 6BS*512*d; full attention layers' qkv 2BSd*(16 + 4)*256 and
  //   projection 2BSd*16*256 (the output gate is not counted, as in MaxText); Gated DeltaNet layers' weights
  //   2BSd*(2*2048 + 2*4096 + 64) + 2BSd*4096 + 2BS*4*(2*2048 + 4096); unembedding 2BSdV.
  //   weights (48 MoE + 12 (qkv + proj) + 36 gdn + unembedding) x3 = 85,103,971,663,872
  //   attention (12 causal layers 4 B S^2 16*256 / 2 + 36 recurrences 8 B S 32*128*128) x3 = 6,803,228,196,864
  const auto m = qwen3_next(hf_doc("qwen3-next-80b-a3b.config.json"));
  const auto f = m.model_flops(1, 4096);
  CHECK(f.weights_flops == Approx(85103971663872.0).epsilon(1e-12));
  CHECK(f.attention_flops == Approx(6803228196864.0).epsilon(1e-12));
}

TEST_CASE("Gated DeltaNet: a layer's ops split over tp and run the recurrence at its FLOPs", "[workloads][gdn]") {
  const auto m = qwen3_next(hf_doc("qwen3-next-80b-a3b.config.json"));
  for (std::int64_t tp : {1, 2, 4}) {
    INFO("tp " << tp);
    TrainingSpec t;
    t.gpus = 8;
    t.per_device_batch = 1;
    t.seq_len = 4096;
    t.parallelism.tp = tp;
    t.parallelism.ep = 8 / tp;
    const StepGraph g = build_step_graph(m, t);
    const LayerTemplate &linear = g.layer(0), &full = g.layer(3);
    // The tensor-parallel group's tokens: a per-device batch of 1 gives a replica of tp devices tp sequences.
    const double T = g.tokens;
    CHECK(T == 4096.0 * static_cast<double>(tp));
    // The recurrence: 8 Dk Dv per token and value head, this rank's 32 / tp heads.
    CHECK(flops_of(linear, OpKind::linear_attention) == Approx(8.0 * T * (32.0 / tp) * 128 * 128).epsilon(1e-12));
    CHECK(flops_of(full, OpKind::linear_attention) == 0);
    // Its HBM traffic, bf16: queries and keys repeated to the value heads, values, output and the two gates per
    // token and head, 2 (2*128 + 2*128 + 2) bytes, and each 64-token chunk's 128 x 128 state written and read back.
    for (const auto& op : linear.ops)
      if (op.kind == OpKind::linear_attention)
        CHECK(op.bytes == Approx(T * (32.0 / tp) * 2 * (2 * 128 + 2 * 128 + 2) + 2 * (T / 64) * (32.0 / tp) * 128 * 128 * 2).epsilon(1e-12));
    CHECK(flops_of(linear, OpKind::attention) == 0);
    // The mixer's GEMMs (in_proj_qkv, in_proj_z, in_proj_ba, out_proj) on this rank's heads, against the gated
    // attention's (q and its gate 2 H / tp heads, k and v one of the 2 KV heads each once tp exceeds them, o).
    const double gdn = 2 * T * 2048 * (2 * 2048 + 2 * 4096 + 64) / tp + 2 * T * 4096 * 2048 / tp;
    const double kv_heads = std::max(1.0, 2.0 / tp);
    const double attention = 2 * T * 2048 * (2 * 16.0 / tp + 2 * kv_heads) * 256 + 2 * T * 16 * 256 * 2048 / tp;
    CHECK(flops_of(linear, OpKind::gemm) - flops_of(full, OpKind::gemm) == Approx(gdn - attention).epsilon(1e-12));
  }
}

TEST_CASE("Gated DeltaNet: over cp, all-to-alls trade sequence shards for head shards around the recurrence", "[workloads][gdn]") {
  // Megatron's GatedDeltaNet with cp: the projections' outputs (q, k, v; z; the decay and write strength) go
  // through tensor_a2a_cp2hp, the normed output back through hp2cp before out_proj. Each all-to-all moves the
  // rank's whole tensor re-split, so its bytes are the tensor's; the recurrence's work per rank is unchanged.
  const auto m = qwen3_next(hf_doc("qwen3-next-80b-a3b.config.json"));
  TrainingSpec t;
  t.gpus = 32;
  t.per_device_batch = 1;
  t.seq_len = 8192;
  t.parallelism.tp = 2;
  t.parallelism.cp = 2;
  t.parallelism.ep = 8;
  const StepGraph g = build_step_graph(m, t);
  const double T = g.tokens, a = 2, K = 16 / 2 * 128.0, V = 32 / 2 * 128.0, Hv = 32 / 2.0;
  CHECK(T == 8192.0 * 2 * 2 / 2);  // tp x cp sequences per replica, this rank's 1/cp of them
  std::vector<double> cp_bytes;
  for (const auto& op : g.layer(0).ops)
    if (op.kind == OpKind::comm && op.comm.axis == Axis::cp) {
      CHECK(op.comm.forward == CommKind::all_to_all);
      CHECK(op.comm.backward == CommKind::all_to_all);
      cp_bytes.push_back(op.comm.bytes);
    }
  CHECK(cp_bytes == std::vector<double>{T * (2 * K + V) * a, T * V * a, T * 2 * Hv * a, T * V * a});
  CHECK(flops_of(g.layer(0), OpKind::linear_attention) == Approx(8.0 * T * Hv * 128 * 128).epsilon(1e-12));
  auto res = test::cli("simulate --model hf/qwen3-next-80b-a3b.config.json --system gb200-nvl72 --gpus 32 --tp 2 --cp 2 --ep 8 "
                       "--seq 8192 --json");
  REQUIRE(res.status == 0);
  auto j = nlohmann::json::parse(res.out);
  CHECK(j.at("mfu").get<double>() <= 1.0);
  CHECK(j.at("executed_flops_per_device").get<double>() >= j.at("model_flops_per_device").get<double>());
}

TEST_CASE("Gated DeltaNet: Qwen3-Next simulates end to end within the physical laws", "[workloads][gdn][cli]") {
  auto res = test::cli("simulate --model hf/qwen3-next-80b-a3b.config.json --system h100-hgx --gpus 32 --ep 8 --tp 2 "
                       "--seq 4096 --batch 1 --json");
  REQUIRE(res.status == 0);
  auto j = nlohmann::json::parse(res.out);
  CHECK(j.at("mfu").get<double>() > 0.02);
  CHECK(j.at("mfu").get<double>() <= 1.0);
  CHECK(j.at("executed_flops_per_device").get<double>() >= j.at("model_flops_per_device").get<double>());
  CHECK(j.at("fits").get<bool>());
  // fp32 master weights of the whole model over the 32 devices.
  CHECK(j.at("hbm_breakdown_bytes").at("parameters").get<double>() == Approx(79674391296.0 * 4 / 32).epsilon(1e-9));
}

TEST_CASE("Gated DeltaNet: what is not modelled or malformed is refused with its field", "[workloads][gdn]") {
  auto res = test::cli("simulate --model hf/qwen3-next-80b-a3b.config.json --system h100-hgx --gpus 64 --tp 4 --cp 8 --seq 8192");
  CHECK(res.status == 2);
  CHECK_THAT(res.err, Catch::Contains("cp = 8 (linear_num_key_heads = 16 is not divisible by tp x cp = 32, as Megatron's Gated DeltaNet needs over cp)"));
  res = test::cli("simulate --model hf/qwen3-next-80b-a3b.config.json --system h100-hgx --gpus 32 --tp 32 --seq 4096");
  CHECK(res.status == 2);
  CHECK_THAT(res.err, Catch::Contains("tp = 32 (num_query_heads = 16 is not divisible by it)"));
  auto doc = hf_doc("qwen3-next-80b-a3b.config.json");
  doc["linear_num_value_heads"] = 24;
  CHECK_THROWS_WITH(qwen3_next(doc), "qwen3-next.json: linear_num_value_heads = 24 (must be a multiple of linear_num_key_heads = 16)");
  doc = hf_doc("qwen3-next-80b-a3b.config.json");
  doc["layer_types"][5] = "mamba";
  CHECK_THROWS_WITH(qwen3_next(doc), "qwen3-next.json: layer_types[5] = \"mamba\" (unknown layer type; expected full_attention or linear_attention)");
  doc = hf_doc("qwen3-next-80b-a3b.config.json");
  doc.erase("linear_conv_kernel_dim");
  CHECK_THROWS_WITH(qwen3_next(doc), "qwen3-next.json: linear_conv_kernel_dim is missing (required)");
  // Model files: the shape without layers, layers beside MLA.
  auto j = qwen3_next(hf_doc("qwen3-next-80b-a3b.config.json")).to_json();
  j.erase("linear_attention_layer_ids");
  CHECK_THROWS_WITH(load_model(j, "f.json"), Catch::StartsWith("f.json: linear_") && Catch::Contains("(needs linear_attention_layer_ids)"));
  auto ds = builtin_model("deepseek-v3-671b").to_json();
  ds["linear_attention_layer_ids"] = {1, 2};
  for (auto key : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"})
    ds[key] = 4;
  CHECK_THROWS_WITH(load_model(ds, "ds.json"),
                    "ds.json: linear_attention_layer_ids = [1,2] (Gated DeltaNet layers are modelled beside GQA attention only, not MLA)");
}

TEST_CASE("Gated DeltaNet: physics holds over random layouts", "[invariants][gdn]") {
  // The suite's random layouts (a third pipelines) with Qwen3-Next or Qwen3.5 in place of the drawn model: MFU at
  // most 1, executed FLOPs at least the model's (MaxText's count times the global batch), the fast-forward equal
  // to every event, and better hardware never slower beyond a greedy schedule's allowance (better_hardware.hpp).
  std::mt19937 rng(20261206);
  int checked = 0;
  for (int k = 0; k < 300 && checked < 16; ++k) {
    RunConfig c = k % 3 == 0 ? test::random_pipeline(rng) : test::random_config(rng);
    c.model = k % 2 == 0 ? "hf/qwen3-next-80b-a3b.config.json" : "hf/qwen3.5-35b-a3b.config.json";
    c.mtp_layers = 0;
    c.embedding_as_layer = c.loss_as_layer = false;
    std::optional<StepReport> r;
    try {
      r = run_simulation(c);
    } catch (const InputError&) {
      continue;  // a layout the model cannot take (heads, experts or layers not divisible)
    }
    INFO(c.to_json().dump());
    ++checked;
    CHECK(r->mfu <= 1.0);
    CHECK(r->executed_flops_per_device >= r->model_flops_per_device * (1 - 1e-12));
    CHECK(r->model_flops_per_device * static_cast<double>(c.gpus) ==
          Approx(static_cast<double>(r->global_batch) * resolve_model(c.model).model_flops(1, c.seq, 1).total()).epsilon(1e-9));
    const StepReport plain = simulate_resolved(c, false, false).report;
    CHECK(plain.step_time_s == Approx(r->step_time_s).epsilon(1e-9));
    CHECK(plain.hbm_peak_bytes == Approx(r->hbm_peak_bytes).epsilon(1e-9));
    const PreparedRun prepared = prepare_run(c);
    for (const auto& [what, better] : test::on_better_hardware(c, prepared)) {
      INFO(what);
      CHECK(better.step_time_s <= r->step_time_s * (1 + test::allowed_slowdown_on(what, c, prepared, *r)));
    }
  }
  CHECK(checked >= 12);
}
