#include <catch2/catch.hpp>

#include <algorithm>

#include "helpers.hpp"
#include "hwmodels/builtin.hpp"
#include "workloads/step_graph.hpp"

using namespace hbmsim;

namespace {
constexpr double MiB = 1048576.0, GiB = 1073741824.0;

TrainingSpec training(std::int64_t gpus, std::int64_t batch, std::int64_t seq) {
  TrainingSpec t;
  t.gpus = gpus;
  t.per_device_batch = batch;
  t.seq_len = seq;
  return t;
}
}  // namespace

TEST_CASE("Llama 3.1 405B model FLOPs per device match MaxText's formula", "[workloads]") {
  // B*S = 2*8192 = 16384 tokens, E = 16384, F = 53248, H = 128, Hkv = 8, D = 128, V = 128256, L = 126.
  // Per layer: FFN 6*BS*F*E = 8.5766e13; QKV 2*BS*E*(H+2Hkv)*D = 9.8956e12; out proj 2*BS*E*H*D = 8.7961e12
  // -> 1.04458e14 * 126 = 1.31617e16; unembedding 2*BS*E*V = 6.8857e13; x3 = 39,690 TFLOP.
  // Attention: 4*B*S^2*H*D / 2 (causal) = 4.3980e12 per layer * 126 * 3 = 1,662.5 TFLOP. Total 41,352.5 TFLOP.
  auto g = build_step_graph(builtin_model("llama3.1-405b"), training(128, 2, 8192));
  CHECK(g.model_flops.weights_flops == Approx(39690e12).epsilon(0.001));
  CHECK(g.model_flops.attention_flops == Approx(1662.5e12).epsilon(0.001));
  CHECK(g.model_flops.total() == Approx(41352.5e12).epsilon(0.001));
}

TEST_CASE("Llama 3.1 405B QKV activations are 576 MiB per layer and 70.875 GiB over 126 layers", "[workloads]") {
  // query_proj: 16384 tokens * 128 heads * 128 dims * 2 bytes = 512 MiB; key/value: 8 heads -> 32 MiB each.
  auto g = build_step_graph(builtin_model("llama3.1-405b"), training(128, 2, 8192));
  CHECK(g.tensor_bytes("query_proj") == 512 * MiB);
  CHECK(g.tensor_bytes("key_proj") == 32 * MiB);
  CHECK(g.tensor_bytes("value_proj") == 32 * MiB);
  double per_layer = g.tensor_bytes("query_proj") + g.tensor_bytes("key_proj") + g.tensor_bytes("value_proj");
  CHECK(per_layer * 126 == 70.875 * GiB);
  // mlpwi_0/1: 16384 tokens * 53248 * 2 bytes = 1664 MiB.
  CHECK(g.tensor_bytes("mlpwi_0") == 1664 * MiB);
  CHECK(g.tensor_bytes("mlpwi_1") == 1664 * MiB);
}

TEST_CASE("DeepSeek-V3 MLA and MoE activation sizes follow MaxText's shapes", "[workloads]") {
  // Per-device batch 8, seq 4096: T = 32768 tokens.
  auto g = build_step_graph(builtin_model("deepseek-v3-671b"), training(128, 8, 4096));
  const double T = 32768;
  CHECK(g.tensor_bytes("mla_q", "moe") == T * 1536 * 2);              // normed q LoRA latent [B,S,q_lora_rank]
  CHECK(g.tensor_bytes("mla_kv", "moe") == T * 512 * 2);              // normed kv latent [B,S,kv_lora_rank]
  CHECK(g.tensor_bytes("query_wa_proj", "moe") == T * 1536 * 2);
  CHECK(g.tensor_bytes("kv_wa_proj", "moe") == T * (512 + 64) * 2);   // latent plus the shared rope key
  CHECK(g.tensor_bytes("query_proj", "moe") == T * 128 * 192 * 2);    // [B,S,H,nope+rope]
  CHECK(g.tensor_bytes("value_proj", "moe") == T * 128 * 128 * 2);
  CHECK(g.tensor_bytes("moe_mlpwi_0", "moe") == T * 8 * 2048 * 2);    // one row per (token, chosen expert)
  CHECK(g.tensor_bytes("moe_mlpwi_1", "moe") == T * 8 * 2048 * 2);
  CHECK(g.tensor_bytes("mlpwi_0", "dense") == T * 18432 * 2);         // first three layers: dense MLP
  CHECK(g.tensor_bytes("mlpwi_0", "moe") == T * 2048 * 2);            // shared expert
}

TEST_CASE("DeepSeek-V3 model FLOPs per token match a hand derivation", "[workloads]") {
  // Per token, forward: q 2*(7168*1536 + 1536*128*192) = 97,517,568; kv 2*(7168*576 + 512*128*256) = 41,811,968;
  // out 2*7168*128*128 = 234,881,024 -> 374,210,560 * 61 = 22,826,844,160. Dense FFN 6*18432*7168 * 3 layers
  // = 2,378,170,368. MoE layer: router 2*7168*256 = 3,670,016 + 6*2048*7168*(8+1) = 792,723,456 -> *58 =
  // 46,190,821,376. Unembedding 2*7168*129280 = 1,853,358,080. Sum 73,249,193,984 * 3 = 219,747,581,952.
  // Attention at S = 4096: 2*S*128*(192+128)/2 = 167,772,160 per layer * 61 * 3 = 30,702,305,280.
  // Total 250,449,887,232 FLOP per token (MaxText's check value: about 250.45 GFLOP).
  auto m = builtin_model("deepseek-v3-671b");
  auto f = m.model_flops(1, 4096);
  CHECK(f.weights_flops / 4096 == Approx(219747581952.0).epsilon(1e-9));
  CHECK(f.attention_flops / 4096 == Approx(30702305280.0).epsilon(1e-9));
  CHECK(m.model_flops(8, 4096).total() == Approx(8 * 4096 * 250449887232.0).epsilon(1e-9));
}

TEST_CASE("parameter counts match the published model sizes", "[workloads]") {
  auto ds = builtin_model("deepseek-v3-671b");
  CHECK(ds.total_params() == Approx(671e9).epsilon(0.01));
  // Activated: 671.0B minus the 248 unpicked experts of 58 MoE layers (3*7168*2048 = 44,040,192 parameters
  // each): 671.0e9 - 633.47e9 = 37.55B. DeepSeek quotes "37B"; the exact count is 1.5% above that round figure.
  CHECK(ds.activated_params() == Approx(ds.total_params() - 58.0 * 248 * 3 * 7168 * 2048));
  CHECK(ds.activated_params() == Approx(37e9).epsilon(0.016));
  CHECK(builtin_model("llama3.1-405b").total_params() == Approx(405.9e9).epsilon(0.001));
  CHECK(builtin_model("llama3.1-70b").total_params() == Approx(70.6e9).epsilon(0.005));
  CHECK(builtin_model("llama3.1-8b").total_params() == Approx(8.03e9).epsilon(0.005));
}

TEST_CASE("DeepSeek-V3's MTP module: its parameters and model FLOPs by hand", "[workloads]") {
  // One MoE layer: attention 2*7168 + 7168*1536 + 1536 + 1536*128*192 + 7168*576 + 512 + 512*128*256 +
  // 128*128*7168 = 187,121,664; routed experts 3*7168*2048*256 = 11,274,289,152; router, its bias and the
  // shared expert 7168*256 + 256 + 3*7168*2048 = 45,875,456; eh_proj and three norms 2*7168^2 + 3*7168 =
  // 102,781,952. In all 11,610,068,224.
  auto m = builtin_model("deepseek-v3-671b");
  const double params = m.total_params(), activated = m.activated_params();
  const double flops = m.model_flops(1, 4096).total();
  m.mtp_layers = 1;
  CHECK(m.stack_layers() == 62);
  CHECK(m.is_moe_layer(61));
  CHECK(m.layer_params(61) == Approx(11610068224.0).epsilon(1e-12));
  CHECK(m.total_params() - params == Approx(11610068224.0).epsilon(1e-12));
  // The model card's 685B counts the module with its own copies of the embedding and the head (2 x
  // 129280 x 7168): 671.0B + 11.61B + 1.85B = 684.5B.
  CHECK(m.total_params() + 2.0 * 129280 * 7168 == Approx(685e9).epsilon(0.001));
  CHECK(activated - m.activated_params() + (m.total_params() - params) == Approx(248.0 * 3 * 7168 * 2048));
  // Per token, forward: q 97,517,568 + kv 41,811,968 + out 234,881,024 (as above), router and 9 experts
  // 3,670,016 + 792,723,456, eh_proj 2*14336*7168 = 205,520,896, the head again 2*7168*129280 =
  // 1,853,358,080: 3,229,483,008 x 3 = 9,688,449,024; attention 167,772,160 x 3 = 503,316,480.
  CHECK((m.model_flops(1, 4096).total() - flops) / 4096 == Approx(10191765504.0).epsilon(1e-9));
}

TEST_CASE("an MTP module runs on the last stage, which also stores the input table", "[workloads][pipeline]") {
  // Llama 3.1 8B over pp 2 (16 + 16 layers), one MTP module: the last stage gains a layer (218,112,000
  // parameters plus eh_proj and norms, 2*4096^2 + 3*4096) and a copy of the 128256 x 4096 input table.
  // The first stage is unchanged.
  ModelSpec m = builtin_model("llama3.1-8b");
  TrainingSpec t = training(8, 1, 4096);
  t.parallelism.pp = 2;
  t.parallelism.fsdp = 4;
  t.microbatches = 2;
  const StepGraph plain = build_step_graph(m, t);
  t.mtp_layers = 1;
  const StepGraph mtp = build_step_graph(m, t);
  REQUIRE(mtp.chunks.size() == 2);
  CHECK(mtp.chunks[1].end_layer == 33);
  CHECK(mtp.layer(32).kind == "mtp");
  CHECK(mtp.stages[0].local_params == plain.stages[0].local_params);
  const double layer = 218112000.0 + 2.0 * 4096 * 4096 + 3 * 4096, table = 128256.0 * 4096;
  CHECK(mtp.stages[1].local_params - plain.stages[1].local_params == Approx((layer + table) / 4));  // over fsdp 4
  // The module's template holds a decoder layer's ops and eh_proj, the head and the loss again.
  const auto& tpl = mtp.layer(32);
  const auto has = [&](const std::string& name) {
    return std::any_of(tpl.ops.begin(), tpl.ops.end(), [&](const OpDef& op) { return op.name == name; });
  };
  CHECK(has("eh_proj"));
  CHECK(has("mtp_unembed"));
  CHECK(has("mtp_cross_entropy"));
  CHECK(tpl.ops.size() > plain.layer(31).ops.size() + 5);
}

TEST_CASE("HuggingFace config.json files give the same specs as the built-ins", "[workloads]") {
  for (auto [hf, id] : {std::pair{"hf/llama3.1-405b.config.json", "llama3.1-405b"}, {"hf/deepseek-v3.config.json", "deepseek-v3-671b"}}) {
    INFO(hf);
    auto a = load_hf_config(nlohmann::json::parse(*builtin_file(hf)), hf);
    auto b = builtin_model(id);
    auto ja = a.to_json(), jb = b.to_json();
    for (auto key : {"id", "name", "source"}) {
      ja.erase(key);
      jb.erase(key);
    }
    CHECK(ja == jb);
    CHECK(a.total_params() == b.total_params());
    CHECK(a.model_flops(2, 4096).total() == b.model_flops(2, 4096).total());
  }
}

TEST_CASE("bad training specs exit with status 2 naming the field", "[workloads][cli]") {
  struct Case { std::string args, expect; };
  std::vector<Case> cases = {
      {"--model llama3.1-8b --gpus 8 --fsdp 3", "gpus = 8 (must equal fsdp*tp*ep*dp"},
      {"--model llama3.1-8b --gpus 8 --tp 3", "gpus = 8 (not divisible by tp*ep*dp*cp*pp = 3*1*1*1*1 = 3)"},
      {"--model llama3.1-405b --gpus 12 --tp 12", "tp = 12 (num_query_heads = 128 is not divisible by it)"},
      {"--model deepseek-v3-671b --gpus 96 --ep 96", "ep = 96 (num_experts = 256 is not divisible by it)"},
      {"--model llama3.1-8b --gpus 8 --ep 2", "ep = 2 (the model has no experts)"},
      {"--model llama3.1-8b --gpus 8 --batch 0", "batch = 0 (must be > 0)"},
      {"--model llama3.1-8b --gpus 8 --seq -5", "seq = -5 (must be > 0)"},
      {"--model llama3.1-8b --gpus 0", "gpus = 0 (must be > 0)"},
      {"--model gpt-17 --gpus 8", "model = \"gpt-17\" (no such file or built-in model"},
  };
  for (auto& c : cases) {
    INFO(c.args);
    auto r = test::cli("simulate " + c.args);
    CHECK(r.status == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
  }
  // An unknown architecture in a HuggingFace file names the file and the path.
  auto file = test::temp_dir() / "config.json";
  auto doc = nlohmann::json::parse(*builtin_file("hf/llama3.1-405b.config.json"));
  doc["architectures"] = {"GPT2LMHeadModel"};
  test::write(file, doc.dump());
  auto r = test::cli("simulate --model " + file.string() + " --gpus 8");
  CHECK(r.status == 2);
  CHECK(r.err.find(file.string() + ": architectures[0] = \"GPT2LMHeadModel\"") != std::string::npos);
  doc = nlohmann::json::parse(*builtin_file("hf/llama3.1-405b.config.json"));
  doc["hidden_size"] = 0;
  test::write(file, doc.dump());
  r = test::cli("simulate --model " + file.string() + " --gpus 8");
  CHECK(r.status == 2);
  CHECK(r.err.find("hidden_size = 0 (must be > 0)") != std::string::npos);
}

TEST_CASE("the layer graph is a DAG that graph --dot writes as Graphviz", "[workloads][cli]") {
  auto g = build_step_graph(builtin_model("deepseek-v3-671b"), [] { auto t = training(128, 1, 4096); t.parallelism.ep = 64; return t; }());
  auto dag = layer_dag(g.layer(10));
  CHECK(boost::num_vertices(dag) == g.layer(10).ops.size());
  auto r = test::cli("graph --model deepseek-v3-671b --gpus 128 --ep 64 --layer 10 --dot");
  CHECK(r.status == 0);
  CHECK(r.out.rfind("digraph", 0) == 0);
  CHECK(r.out.find("dispatch_a2a") != std::string::npos);
  CHECK(r.out.find("moe_mlpwi_0") != std::string::npos);
}

TEST_CASE("a MoE batch split halves each micro-batch and keeps the layer's work, bytes and tensors", "[workloads][split]") {
  // DeepSeek-V3, batch 8 x seq 4096 on 128 GPUs with EP 64. Split 2: two copies of the layer body over
  // 16384 tokens each. GEMM FLOPs are linear in tokens, MLA attention FLOPs (2*T*S*H*(dn+dr+dv)/2) too,
  // so each sum equals the unsplit layer's; so do all-to-all bytes and every checkpoint-named tensor.
  auto t = training(128, 8, 4096);
  t.parallelism.ep = 64;
  auto whole = build_step_graph(builtin_model("deepseek-v3-671b"), t);
  t.moe_batch_split = 2;
  auto split = build_step_graph(builtin_model("deepseek-v3-671b"), t);
  const auto& a = whole.templates[1];
  const auto& b = split.templates[1];
  REQUIRE(a.kind == "moe");
  REQUIRE(b.kind == "moe");
  auto sum = [](const LayerTemplate& l, OpKind k, bool bytes) {
    double s = 0;
    for (auto& op : l.ops)
      if (op.kind == k) s += !bytes ? op.flops : k == OpKind::comm ? op.comm.bytes : op.bytes;
    return s;
  };
  CHECK(sum(b, OpKind::gemm, false) == Approx(sum(a, OpKind::gemm, false)).epsilon(1e-12));
  CHECK(sum(b, OpKind::attention, false) == Approx(sum(a, OpKind::attention, false)).epsilon(1e-12));
  CHECK(sum(b, OpKind::comm, true) == Approx(sum(a, OpKind::comm, true)).epsilon(1e-12));
  // One body per micro-batch plus the merge; the dense template is not split.
  CHECK(b.ops.size() == 2 * a.ops.size() + 1);
  CHECK(split.templates[0].ops.size() == whole.templates[0].ops.size());
  int dispatches = 0;
  for (auto& op : b.ops) dispatches += op.name == "mb0/dispatch_a2a" || op.name == "mb1/dispatch_a2a";
  CHECK(dispatches == 2);
  for (auto name : {"mla_q", "mla_kv", "moe_mlpwi_0", "moe_mlpwi_1", "query_proj"})
    CHECK(split.tensor_bytes(name, "moe") == whole.tensor_bytes(name, "moe"));
  // Per micro-batch: half the tokens (16384 * 8 chosen experts * 2048 * 2 bytes).
  int wi0 = 0;
  for (auto& tensor : b.tensors)
    if (tensor.name == "moe_mlpwi_0") {
      CHECK(tensor.bytes == 16384.0 * 8 * 2048 * 2);
      ++wi0;
    }
  CHECK(wi0 == 2);
  // The layer input and output stay whole.
  CHECK(b.tensors[0].bytes == a.tensors[0].bytes);
  CHECK(b.tensors[static_cast<std::size_t>(b.output_tensor)].bytes == a.tensors[static_cast<std::size_t>(a.output_tensor)].bytes);
  CHECK(split.model_flops.total() == whole.model_flops.total());
}

TEST_CASE("a MoE batch split must divide the batch and needs MoE layers", "[workloads][split]") {
  auto t = training(128, 3, 4096);
  t.parallelism.ep = 64;
  t.moe_batch_split = 2;
  CHECK_THROWS_WITH(build_step_graph(builtin_model("deepseek-v3-671b"), t),
                    "moe_batch_split = 2 (sequences per model replica, batch x tp x cp = 3, is not divisible by it)");
  t.per_device_batch = 2;
  t.moe_batch_split = 0;
  CHECK_THROWS_WITH(build_step_graph(builtin_model("deepseek-v3-671b"), t), "moe_batch_split = 0 (must be > 0)");
  auto dense = training(8, 2, 4096);
  dense.moe_batch_split = 2;
  CHECK_THROWS_WITH(build_step_graph(builtin_model("llama3.1-8b"), dense),
                    "moe_batch_split = 2 (the model has no MoE layers to split)");
}
