// Sliding-window attention: which layers use a window (HF configs and model files), the attention work it
// leaves (executed, and as MaxText counts model FLOPs), and what a step simulates with it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <random>

#include "attention_masks.hpp"
#include "helpers.hpp"
#include "hwmodels/builtin.hpp"
#include "planner/run_summary.hpp"
#include "random_configs.hpp"
#include "workloads/step_graph.hpp"

using namespace hbmsim;

using test::attention_flops;
using test::hf_doc;
using test::training;

namespace {
// (A path, not string concatenation: GCC 12 warned of a bogus out-of-bounds copy in `std::string + const char*`.)
std::string mistral_path() { return (std::filesystem::path(HBMSIM_SOURCE_DIR) / "data/hf/mistral-7b-v0.1.config.json").string(); }
}  // namespace

TEST_CASE("Sliding window: the layers each HF config class puts in a window", "[workloads][hf][window]") {
  // Mistral 7B v0.1: sliding_window 4096 on all 32 layers.
  auto mistral = load_hf_config(hf_doc("mistral-7b-v0.1.config.json"), "mistral");
  CHECK(mistral.sliding_window == 4096);
  CHECK(mistral.window_layer_ids.size() == 32);
  CHECK(mistral.attention_window(0) == 4096);
  CHECK(mistral.attention_window(31) == 4096);
  // MistralConfig's default is 4096 when the key is absent; null means none (Mixtral's shipped config).
  auto doc = hf_doc("mistral-7b-v0.1.config.json");
  doc.erase("sliding_window");
  CHECK(load_hf_config(doc, "m").sliding_window == 4096);
  doc["sliding_window"] = nullptr;
  CHECK(load_hf_config(doc, "m").window_layer_ids.empty());
  CHECK(load_hf_config(hf_doc("mixtral-8x7b.config.json"), "x").sliding_window == 0);

  // Qwen: nothing unless use_sliding_window (every shipped Qwen config has it false) ...
  for (auto f : {"qwen2.5-7b.config.json", "qwen3-8b.config.json", "qwen2-57b-a14b.config.json", "qwen3-235b-a22b.config.json"}) {
    INFO(f);
    CHECK(load_hf_config(hf_doc(f), f).sliding_window == 0);
  }
  // ... then the layers from max_window_layers on (Qwen2.5-7B: 28 layers, here 20..27) ...
  doc = hf_doc("qwen2.5-7b.config.json");
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 1024;
  doc["max_window_layers"] = 20;
  auto q = load_hf_config(doc, "q");
  CHECK(q.window_layer_ids == std::vector<std::int64_t>{20, 21, 22, 23, 24, 25, 26, 27});
  CHECK(q.attention_window(19) == 0);
  CHECK(q.attention_window(20) == 1024);
  // ... or, given, layer_types, which wins over max_window_layers.
  doc["layer_types"] = nlohmann::json::array();
  for (int l = 0; l < 28; ++l) doc["layer_types"].push_back(l % 4 == 3 ? "full_attention" : "sliding_attention");
  auto typed = load_hf_config(doc, "q");
  CHECK(typed.window_layer_ids.size() == 21);
  CHECK(typed.attention_window(0) == 1024);
  CHECK(typed.attention_window(3) == 0);
  // GPT-OSS and Gemma: layer_types, by default sliding unless (i + 1) % p == 0: p = 2 for GPT-OSS (window 128)
  // and Gemma 2, Gemma 3's sliding_window_pattern (6) otherwise.
  struct Typed { const char* file; std::int64_t window, windowed, full_layer, sliding_layer; };
  for (auto t : {Typed{"gpt-oss-120b.config.json", 128, 18, 1, 0}, Typed{"gemma-2-9b.config.json", 4096, 21, 1, 0},
                 Typed{"gemma-3-27b.config.json", 1024, 62 - 10, 5, 6}, Typed{"gemma-3-1b.config.json", 512, 26 - 4, 11, 12}}) {
    INFO(t.file);
    auto m = load_hf_config(hf_doc(t.file), t.file);
    CHECK(m.sliding_window == t.window);
    CHECK(static_cast<std::int64_t>(m.window_layer_ids.size()) == t.windowed);
    CHECK(m.attention_window(t.full_layer) == 0);
    CHECK(m.attention_window(t.sliding_layer) == t.window);
  }
  // gpt-oss-20b's layer_types are its class's default: the same layers without them.
  doc = hf_doc("gpt-oss-20b.config.json");
  doc.erase("layer_types");
  CHECK(load_hf_config(doc, "oss").window_layer_ids == load_hf_config(hf_doc("gpt-oss-20b.config.json"), "oss").window_layer_ids);
  // Llama reads no window.
  doc = hf_doc("llama3.2-3b.config.json");
  doc["sliding_window"] = 128;
  CHECK(load_hf_config(doc, "l").sliding_window == 0);
}

TEST_CASE("Sliding window: Gemma's post-norms are ops of their own, before the residual adds", "[workloads][hf][window]") {
  // Gemma 2 9B: the attention's and the MLP's outputs each pass an RMSNorm (memory-bound, its backward reading
  // its input) before the residual add reads them.
  auto g2 = load_hf_config(hf_doc("gemma-2-9b.config.json"), "g2");
  auto g = build_step_graph(g2, training(8192));
  const LayerTemplate& t = g.layer(1);  // a full-attention layer
  for (const std::string block : {"attn", "mlp"}) {
    INFO(block);
    const int norm = t.find_tensor(block + "_post_norm");
    REQUIRE(norm >= 0);
    CHECK(t.tensors[static_cast<std::size_t>(norm)].bytes == 8192.0 * 3584 * 2);  // T x d, bf16
    bool read_by_residual = false;
    for (const auto& op : t.ops)
      if (op.name == (block == "attn" ? "residual_attn" : "residual_mlp"))
        read_by_residual = std::find(op.inputs.begin(), op.inputs.end(), norm) != op.inputs.end();
    CHECK(read_by_residual);
  }
  // Without post-norms (Mistral) there are none.
  CHECK(build_step_graph(load_hf_config(hf_doc("mistral-7b-v0.1.config.json"), "m"), training(4096)).layer(0).find_tensor("attn_post_norm") < 0);
}

TEST_CASE("Sliding window: bad windows and layer lists name the file, the path and the value", "[workloads][hf][window]") {
  auto doc = hf_doc("mistral-7b-v0.1.config.json");
  doc["sliding_window"] = -5;
  CHECK_THROWS_WITH(load_hf_config(doc, "m.json"), "m.json: sliding_window = -5 (must be > 0)");
  doc = hf_doc("qwen3-8b.config.json");
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 512;
  doc["layer_types"] = {"full_attention", "sliding_attention"};
  CHECK_THROWS_WITH(load_hf_config(doc, "q.json"), Catch::StartsWith("q.json: layer_types = ") &&
                                                     Catch::Contains("has 2 entries; expected num_hidden_layers = 36"));
  doc["layer_types"] = nlohmann::json::array();
  for (int l = 0; l < 36; ++l) doc["layer_types"].push_back(l == 7 ? "chunked_attention" : "full_attention");
  CHECK_THROWS_WITH(load_hf_config(doc, "q.json"), "q.json: layer_types[7] = \"chunked_attention\" (unknown layer type; "
                                                   "expected full_attention or sliding_attention)");
  doc["layer_types"][7] = "sliding_attention";
  doc["sliding_window"] = nullptr;
  CHECK_THROWS_WITH(load_hf_config(doc, "q.json"), Catch::Contains("names sliding_attention layers but sliding_window is null"));

  // Model files: window_layer_ids needs a window, lists layers in range, in order.
  auto m = load_hf_config(hf_doc("mistral-7b-v0.1.config.json"), "m").to_json();
  m["window_layer_ids"] = {0, 40};
  CHECK_THROWS_WITH(load_model(m, "f.json"), "f.json: window_layer_ids[1] = 40 (must be a layer index in [0, 32))");
  m["window_layer_ids"] = {3, 2};
  CHECK_THROWS_WITH(load_model(m, "f.json"), "f.json: window_layer_ids[1] = 2 (must be above the previous entry)");
  m.erase("sliding_window");
  CHECK_THROWS_WITH(load_model(m, "f.json"), Catch::StartsWith("f.json: window_layer_ids = ") && Catch::Contains("(needs sliding_window)"));
  // Without a list, a model file's window covers every layer.
  m = load_hf_config(hf_doc("mistral-7b-v0.1.config.json"), "m").to_json();
  m.erase("window_layer_ids");
  CHECK(load_model(m, "f.json").window_layer_ids.size() == 32);
}

TEST_CASE("Sliding window: model FLOPs and executed attention work, by hand", "[workloads][window]") {
  // Mistral 7B v0.1 (H 32, head_dim 128, 32 layers), batch 1 x 8192, window 4096. Per layer, full causal
  // attention is 4 x S^2 x H x hd / 2 = 4 x 8192^2 x 32 x 128 / 2 = 2^39 FLOPs forward.
  auto mistral = load_hf_config(hf_doc("mistral-7b-v0.1.config.json"), "m");
  auto full = mistral;
  full.sliding_window = 0;
  full.window_layer_ids.clear();
  const double per_layer = std::ldexp(1.0, 39);
  CHECK(full.model_flops(1, 8192).attention_flops == per_layer * 32 * 3);
  // MaxText counts a windowed layer as 4 x S x min(w, S) x H x hd, halved: half of 2^39 here.
  CHECK(mistral.model_flops(1, 8192).attention_flops == per_layer / 2 * 32 * 3);
  CHECK(mistral.model_flops(1, 8192).weights_flops == full.model_flops(1, 8192).weights_flops);
  // A window of the sequence or more is no window: 4096 tokens.
  CHECK(mistral.model_flops(1, 4096).attention_flops == full.model_flops(1, 4096).attention_flops);

  // Executed: the kernel visits S w - w^2 / 2 = 8192 x 4096 - 4096^2 / 2 pairs of the 8192^2 / 2: 3/4.
  auto g = build_step_graph(mistral, training(8192));
  REQUIRE(g.templates.size() == 2);  // the plain dense one (unused) and the windowed one
  CHECK(g.layer_template[0] == 1);
  CHECK(attention_flops(g.templates[1]) == per_layer * 0.75);
  CHECK(attention_flops(g.templates[0]) == per_layer);
  CHECK(g.model_flops.attention_flops == per_layer / 2 * 32 * 3);
  // At 4096 tokens no layer needs a template of its own.
  CHECK(build_step_graph(mistral, training(4096)).templates.size() == 1);

  // Qwen2.5-7B (H 28) windowed from layer 20 at 1024 tokens, sequence 4096: 20 full layers and 8 at a model
  // fraction of 1024 / 4096; executed (2 x 4096 x 1024 - 1024^2) / 4096^2 = 0.4375 of a full layer.
  auto doc = hf_doc("qwen2.5-7b.config.json");
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 1024;
  doc["max_window_layers"] = 20;
  auto q = load_hf_config(doc, "q");
  const double q_layer = 4.0 * 4096 * 4096 * 28 * 128 / 2;
  CHECK(q.model_flops(1, 4096).attention_flops == Approx(q_layer * (20 + 8 * 0.25) * 3).epsilon(1e-12));
  auto qg = build_step_graph(q, training(4096));
  CHECK(qg.layer_template[19] == 0);
  CHECK(qg.layer_template[20] == 1);
  CHECK(qg.layer_template[27] == 1);
  CHECK(attention_flops(qg.templates[1]) == Approx(attention_flops(qg.templates[0]) * 0.4375).epsilon(1e-12));
}

TEST_CASE("Sliding window: the work fractions obey their laws over random windows", "[workloads][window][property]") {
  // model <= executed <= 1 (executed >= model FLOPs), both non-decreasing in the window, 1 from w = S on.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> seq_pick(1, 1 << 17);
  for (int i = 0; i < 2000; ++i) {
    const double S = seq_pick(rng), w = std::uniform_int_distribution<int>(1, 2 * static_cast<int>(S))(rng);
    const double w2 = w + std::uniform_int_distribution<int>(0, 4096)(rng);
    INFO("S " << S << " w " << w << " w2 " << w2);
    const double m = model_window_fraction(S, w), e = executed_window_fraction(S, w);
    CHECK(m > 0);
    CHECK(m <= e);
    CHECK(e <= 1.0);
    CHECK(model_window_fraction(S, w2) >= m);
    CHECK(executed_window_fraction(S, w2) >= e);
    if (w >= S) CHECK((m == 1.0 && e == 1.0));
  }
}

TEST_CASE("Sliding window: a step with a shorter window is no slower and one of the sequence is no window",
          "[workloads][window][cli]") {
  // Mistral 7B v0.1 on 8 H200s (FSDP 8), batch 1: at 4096 tokens its window covers the sequence, so the run
  // equals the same model without a window byte for byte; at 16384 tokens the window cuts attention work.
  auto spec = load_hf_config(nlohmann::json::parse(test::slurp(mistral_path())), "m").to_json();
  auto run = [&](std::int64_t window, int seq) {
    auto m = spec;
    if (window > 0) m["sliding_window"] = window;
    else m.erase("sliding_window"), m.erase("window_layer_ids");
    const auto path = (test::temp_dir() / ("window_" + std::to_string(window) + ".json")).string();
    test::write(path, m.dump());
    auto r = test::cli("simulate --model " + path + " --system h200-hgx --gpus 8 --seq " + std::to_string(seq) + " --json");
    REQUIRE(r.status == 0);
    auto j = nlohmann::json::parse(r.out);
    j.erase("config");  // names the model file
    return j;
  };
  auto plain = run(0, 4096), covering = run(4096, 4096);
  CHECK(plain.dump() == covering.dump());
  double last = 0;
  for (std::int64_t w : {1024, 4096, 8192, 0}) {
    INFO("window " << w);
    auto j = run(w, 16384);
    const double step = j.at("step_time_s").get<double>();
    CHECK(step >= last);  // more work, never faster
    last = step;
    CHECK(j.at("mfu").get<double>() <= 1.0);
  }
}

TEST_CASE("Sliding window: physics holds for windowed models over random layouts", "[invariants][window]") {
  // The suite's random layouts with a windowed model in place of the drawn one (Mistral 7B v0.1, every layer at
  // 4096; gpt-oss-20b, every other layer at 128; Gemma 3 1B, five of six at 512, with post-norms) at a
  // sequence its windows cut: the laws of DESIGN.md, the
  // fast-forward equal to every event, and the same run without a window (more attention work) never faster.
  const auto checked = test::check_masked_draws(20261205, 400, 40, {"sliding_window", "window_layer_ids"}, "unwindowed",
                                                [](RunConfig& c, int k, std::mt19937& rng) {
                                                  const char* windowed[] = {"hf/mistral-7b-v0.1.config.json", "hf/gpt-oss-20b.config.json",
                                                                            "hf/gemma-3-1b.config.json"};
                                                  c.model = windowed[(k / 3) % 3];
                                                  c.seq = test::pick<std::int64_t>(rng, {8192, 16384});
                                                });
  CHECK(checked.size() >= 30);
  CHECK(std::count_if(checked.begin(), checked.end(), [](const std::string& m) { return m.find("gpt-oss") != std::string::npos; }) >= 8);
}

TEST_CASE("Sliding window: context parallelism's ring exchanges only the window's halo", "[workloads][window][cp]") {
  // Transformer Engine's p2p CP with a window: each rank's two chunks (of 2 cp per sequence) fetch the w keys and
  // values before them, when w fits in the cp - 1 chunks before; otherwise it all-gathers them.
  auto mistral = load_hf_config(hf_doc("mistral-7b-v0.1.config.json"), "m");  // w 4096, 8 KV heads of 128
  auto op_named = [](const LayerTemplate& t, const std::string& name) -> const OpDef* {
    for (const auto& op : t.ops)
      if (op.name == name) return &op;
    return nullptr;
  };
  auto ring = [&](std::int64_t seq, std::int64_t cp) {
    TrainingSpec t = training(seq);
    t.parallelism.cp = cp;
    t.parallelism.cp_exchange = CpExchange::ring;
    return build_step_graph(mistral, t);
  };
  // seq 65536, cp 4: chunks of 8192, w <= 3 x 8192. A device's T = 65536 tokens are 4 sequences' quarters; the
  // busiest rank's halo is 2 w = 8192 tokens per quarter, 32768 in all, of 4096 bytes each (K and V, 8 x 128,
  // bf16): 134,217,728 bytes, against the ring's 3 x 65536 x 4096.
  auto g = ring(65536, 4);
  REQUIRE(g.tokens == 65536);
  const LayerTemplate& windowed = g.layer(0);
  REQUIRE(op_named(windowed, "cp_halo_exchange"));
  CHECK(op_named(windowed, "cp_halo_exchange")->comm.bytes == 134217728.0);
  CHECK(op_named(windowed, "cp_send_recv_1") == nullptr);
  // The work is the window's, in two halves.
  CHECK(op_named(windowed, "attention_chunk_0")->flops + op_named(windowed, "attention_chunk_1")->flops ==
        Approx(4.0 * 65536 * 65536 * 32 * 128 / 2 * executed_window_fraction(65536, 4096)).epsilon(1e-12));
  // seq 8192, cp 8: chunks of 512, w = 4096 > 7 x 512: the keys and values are all-gathered.
  auto fallback = ring(8192, 8);
  CHECK(op_named(fallback.layer(0), "cp_all_gather_kv") != nullptr);
  CHECK(op_named(fallback.layer(0), "cp_halo_exchange") == nullptr);
  // seq 4096: the window covers the sequence, so the ring runs as without one.
  CHECK(op_named(ring(4096, 4).layer(0), "cp_send_recv_3") != nullptr);
}
