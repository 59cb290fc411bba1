// Megatron-Core's Muon (run field optimizer muon): which weights it takes, the state it keeps, and the Newton-Schulz
// work each device runs before the update, against counts by hand.
#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/run_config.hpp"
#include "workloads/model.hpp"

using namespace hbmsim;

namespace {

// One matrix of a x b (a <= b) through 5 quintic Newton-Schulz iterations: X X^T (2 a^2 b), A A (2 a^3) and
// B X (2 a^2 b) each.
double ns_flops(double a, double b) { return 5 * (4 * a * a * b + 2 * a * a * a); }

// Llama 3.1 8B (d 4096, 32 heads and 8 KV heads of 128, F 14336) under Megatron: micro-batch 1 x seq 4096 on 8
// H100s, the distributed optimizer over dp.
RunConfig llama8b(const std::string& optimizer, std::int64_t tp, std::int64_t dp) {
  RunConfig c;
  c.model = "llama3.1-8b";
  c.system = "h100-hgx";
  c.gpus = tp * dp;
  c.tp = tp;
  c.dp = dp;
  c.micro_batch = 1;
  c.seq = 4096;
  c.framework = "megatron";
  c.sharded_optimizer = true;
  c.policy = "full";
  c.optimizer = optimizer;
  return c;
}

// Per layer by hand: q 4096 x 4096, k and v 1024 x 4096, o 4096 x 4096, fc1 (gate and up) 28672 x 4096, fc2
// 4096 x 14336.
const double kLlamaLayerMatrixParams = 2 * 4096.0 * 4096 + 2 * 1024.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336;
const double kLlamaLayerNs = 2 * ns_flops(4096, 4096) + 2 * ns_flops(1024, 4096) + ns_flops(4096, 28672) + ns_flops(4096, 14336);

}  // namespace

TEST_CASE("Muon takes each layer's 2-D weights as Megatron stores them: fc1 fused, q, k and v apart", "[muon]") {
  const ModelSpec llama = resolve_model("llama3.1-8b");
  double params = 0;
  for (const WeightMatrix& m : llama.layer_matrices(0)) params += m.rows * m.cols * m.count;
  CHECK(params == kLlamaLayerMatrixParams);
  CHECK(llama.layer_params(0) - params == 2 * 4096);  // the two RMSNorm scales keep Adam
  // DeepSeek-V3's MoE layer: q down 1536 x 7168 and up 24576 x 1536 (128 heads of 192), kv down 576 x 7168 and up
  // 32768 x 512 (128 x (128 + 128)), o 7168 x 16384, the router 256 x 7168, 256 experts and one shared expert of
  // fc1 4096 x 7168 and fc2 7168 x 2048. Left to Adam: two layer norms, the q and kv latent norms, the router's
  // score-correction bias.
  const ModelSpec dsv3 = resolve_model("deepseek-v3-671b");
  const double mla = 1536.0 * 7168 + 24576.0 * 1536 + 576.0 * 7168 + 32768.0 * 512 + 7168.0 * 16384;
  const double moe = 256.0 * 7168 + 257 * (4096.0 * 7168 + 7168.0 * 2048);
  double dsv3_params = 0, experts = 0;
  for (const WeightMatrix& m : dsv3.layer_matrices(10)) {
    dsv3_params += m.rows * m.cols * m.count;
    if (m.expert) experts += m.count;
  }
  CHECK(dsv3_params == mla + moe);
  CHECK(experts == 2 * 256);  // fc1 and fc2 of each routed expert
  CHECK(dsv3.layer_params(10) - dsv3_params == 2 * 7168 + 1536 + 512 + 256);
  // Whole on every tp rank: MLA's down projections (TELinear, duplicated) and the router; split: the rest, the
  // output projection and each fc2 by columns (row-parallel), the others by rows (column-parallel).
  std::vector<double> whole, by_columns;
  for (const WeightMatrix& m : dsv3.layer_matrices(10)) {
    if (m.tp_split == WeightMatrix::Split::none) whole.push_back(m.rows);
    if (m.tp_split == WeightMatrix::Split::cols) by_columns.push_back(m.cols);
  }
  CHECK(whole == std::vector<double>{1536, 576, 256});
  CHECK(by_columns == std::vector<double>{16384, 2048, 2048});
}

TEST_CASE("every shipped model's layer matrices are its layer's parameters less a few vectors", "[muon]") {
  // What Muon leaves to Adam in a layer is norms, biases, sinks, a score-correction bias and a Gated DeltaNet's
  // convolution and decay parameters: at least none, and well under 1% of the layer.
  for (const std::string& name : shipped_model_names()) {
    ModelSpec m = resolve_model(name);
    m.mtp_layers = 1;  // an MTP module too: a layer with eh_proj (d x 2d) and two more norms
    for (std::int64_t l = 0; l < m.stack_layers(); ++l) {
      INFO(name << " layer " << l);
      double params = 0;
      for (const WeightMatrix& w : m.layer_matrices(l)) params += w.rows * w.cols * w.count;
      const double rest = m.layer_params(l) - params;
      CHECK(rest >= 0);
      CHECK(rest < 0.01 * m.layer_params(l));
    }
  }
}

TEST_CASE("Muon's Newton-Schulz iterations run on whole matrices, shared out over dp and duplicated over tp", "[muon]") {
  // The executed work grows by the iterations' GEMMs: 32 layers' matrices, a device doing 1/dp of them whole
  // (the layer-wise distributed optimizer), each tp rank every one (muon_tp_mode duplicated). The model's FLOPs
  // stay.
  for (auto [tp, dp] : {std::pair<std::int64_t, std::int64_t>{1, 8}, {2, 4}, {4, 2}}) {
    INFO("tp " << tp << " x dp " << dp);
    const StepReport adam = run_simulation(llama8b("adam", tp, dp)), muon = run_simulation(llama8b("muon", tp, dp));
    const double expected = 32 * kLlamaLayerNs / static_cast<double>(dp);
    CHECK(muon.executed_flops_per_device - adam.executed_flops_per_device == Approx(expected).epsilon(1e-9));
    CHECK(muon.model_flops_per_device == adam.model_flops_per_device);
    CHECK(muon.step_time_s > adam.step_time_s);
    // With tp the fp32 momentum of every matrix a device owns is gathered first: (tp - 1) / tp of it sent.
    const double gathered = 32 * kLlamaLayerMatrixParams * 4 / static_cast<double>(dp);
    const double sent = tp > 1 ? muon.comm_bytes.at("tp") - adam.comm_bytes.at("tp") : 0;
    CHECK(sent == Approx(gathered * static_cast<double>(tp - 1) / static_cast<double>(tp)).margin(1e-3));
  }
  // Megatron-Bridge's blockwise mode: each tp rank orthogonalizes its own shard and gathers nothing. At tp 2 the
  // shards are q 2048 x 4096, k and v 512 x 4096, o 4096 x 2048, fc1 14336 x 4096, fc2 4096 x 7168.
  RunConfig blockwise = llama8b("muon", 2, 4);
  blockwise.muon_tp_mode = "blockwise";
  const StepReport b = run_simulation(blockwise), b_adam = run_simulation(llama8b("adam", 2, 4));
  const double shards = 2 * ns_flops(2048, 4096) + 2 * ns_flops(512, 4096) + ns_flops(4096, 14336) + ns_flops(4096, 7168);
  CHECK(b.executed_flops_per_device - b_adam.executed_flops_per_device == Approx(32 * shards / 4).epsilon(1e-9));
  CHECK(b.comm_bytes.at("tp") == Approx(b_adam.comm_bytes.at("tp")).epsilon(1e-12));
  CHECK_THAT(megatron_settings(blockwise), Catch::Contains("--optimizer muon --muon-tp-mode blockwise"));
  // Without the distributed optimizer every rank orthogonalizes every matrix.
  RunConfig whole = llama8b("muon", 1, 8), whole_adam = llama8b("adam", 1, 8);
  whole.sharded_optimizer = whole_adam.sharded_optimizer = false;
  CHECK(run_simulation(whole).executed_flops_per_device - run_simulation(whole_adam).executed_flops_per_device ==
        Approx(32 * kLlamaLayerNs).epsilon(1e-9));
}

TEST_CASE("Muon's iterations hold the largest matrix's bf16 iterates, and its fp32 gather under tp", "[muon]") {
  // Llama 3.1 8B's largest matrix is fc1, 28672 x 4096 (a = 4096 <= b = 28672; a b = 117,440,512, a^2 = 16,777,216).
  // Whole (tp 1): the larger of the fp32 normalized copy with its bf16 cast (6 a b) and the iterations' bf16 X, A, B
  // and next X (2 (2 a b + 2 a^2)). Gathered over tp 2: the fp32 shards and their concatenation (8 a b) beside the
  // iterations. Blockwise at tp 2: fc1's shard 14336 x 4096.
  const double ab = 28672.0 * 4096, aa = 4096.0 * 4096;
  CHECK(prepare_run(llama8b("muon", 1, 8)).graph.stages[0].muon_working_bytes == std::max(6 * ab, 4 * ab + 4 * aa));
  CHECK(prepare_run(llama8b("muon", 2, 4)).graph.stages[0].muon_working_bytes == 8 * ab + 4 * ab + 4 * aa);
  RunConfig blockwise = llama8b("muon", 2, 4);
  blockwise.muon_tp_mode = "blockwise";
  CHECK(prepare_run(blockwise).graph.stages[0].muon_working_bytes == std::max(6 * ab / 2, 4 * ab / 2 + 4 * aa));
}

TEST_CASE("Muon keeps one fp32 momentum and the master weights for its matrices, Adam's 12 bytes for the rest", "[muon]") {
  // Llama 3.1 8B: 32 layers of Muon matrices; the two 128256 x 4096 tables, 32 x 2 norm scales and the final
  // norm keep Adam. Sharded over dp 8 (tp 1).
  const double muon_params = 32 * kLlamaLayerMatrixParams, adam_params = 2 * 128256.0 * 4096 + 32 * 2 * 4096 + 4096;
  const StepReport adam = run_simulation(llama8b("adam", 1, 8)), muon = run_simulation(llama8b("muon", 1, 8));
  CHECK(adam.hbm_breakdown_bytes.at("optimizer_state") == Approx(12 * (muon_params + adam_params) / 8).epsilon(1e-12));
  CHECK(muon.hbm_breakdown_bytes.at("optimizer_state") == Approx((8 * muon_params + 12 * adam_params) / 8).epsilon(1e-12));
  CHECK(muon.hbm_breakdown_bytes.at("parameters") == adam.hbm_breakdown_bytes.at("parameters"));
  CHECK(muon.hbm_breakdown_bytes.at("gradients") == adam.hbm_breakdown_bytes.at("gradients"));
}

TEST_CASE("Muon orthogonalizes a device's local experts, shared out over the experts' own data-parallel ranks", "[muon]") {
  // Mixtral 8x7B (d 4096, 32 heads and 8 KV heads of 128, 8 experts of F 14336) on 16 H100s, ep 8 x dp 2: each
  // device holds one expert, whose two matrices per layer are shared out over dp 2; the attention's and the
  // router's (8 x 4096) over dp x ep = 16, the ranks that sum their gradients.
  RunConfig c;
  c.model = "hf/mixtral-8x7b.config.json";
  c.system = "h100-hgx";
  c.gpus = 16;
  c.ep = 8;
  c.dp = 2;
  c.micro_batch = 1;
  c.seq = 4096;
  c.framework = "megatron";
  c.sharded_optimizer = true;
  c.policy = "full";
  RunConfig m = c;
  m.optimizer = "muon";
  const double dense = 2 * ns_flops(4096, 4096) + 2 * ns_flops(1024, 4096) + ns_flops(8, 4096);
  const double expert = ns_flops(4096, 28672) + ns_flops(4096, 14336);
  const double expected = 32 * (dense / 16 + expert / 2);
  CHECK(run_simulation(m).executed_flops_per_device - run_simulation(c).executed_flops_per_device ==
        Approx(expected).epsilon(1e-9));
}

TEST_CASE("Muon is bad input where Megatron does not run it", "[muon]") {
  RunConfig c = llama8b("muon", 1, 8);
  CHECK_NOTHROW(prepare_run(c));
  CHECK_THAT(megatron_settings(c), Catch::Contains("--optimizer muon") && Catch::Contains("--use-distributed-optimizer"));
  RunConfig maxtext = c;
  maxtext.framework = "maxtext";
  CHECK_THROWS_WITH(prepare_run(maxtext), Catch::Contains("optimizer = \"muon\"") && Catch::Contains("needs framework megatron"));
  RunConfig fsdp = c;
  fsdp.dp = 1;
  fsdp.fsdp = 8;
  CHECK_THROWS_WITH(prepare_run(fsdp), Catch::Contains("optimizer = \"muon\"") && Catch::Contains("Megatron-FSDP"));
  RunConfig moments = c;
  moments.optimizer_moments_dtype = "bf16";
  CHECK_THROWS_WITH(prepare_run(moments), Catch::Contains("optimizer_moments_dtype bf16"));
  RunConfig offload = c;
  offload.optimizer_offload = "host";
  CHECK_THROWS_WITH(prepare_run(offload), Catch::Contains("optimizer or parameter offload"));
  RunConfig other = c;
  other.optimizer = "lion";
  CHECK_THROWS_WITH(prepare_run(other), Catch::Contains("optimizer = \"lion\" (expected adam or muon)"));
  RunConfig mode = c;
  mode.muon_tp_mode = "distributed";
  CHECK_THROWS_WITH(prepare_run(mode), Catch::Contains("muon_tp_mode = \"distributed\"") && Catch::Contains("not modelled"));
  RunConfig adam = llama8b("adam", 1, 8);
  adam.muon_tp_mode = "blockwise";
  CHECK_THROWS_WITH(prepare_run(adam), Catch::Contains("muon_tp_mode = \"blockwise\" (only with optimizer muon)"));
}
