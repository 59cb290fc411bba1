// Llama 4 (Scout and Maverick): experts in every or every other layer beside a shared one, dense layers of their
// own width, and chunked attention on three layers of four. The chunked layers' attention work (executed, and
// as MaxText counts model FLOPs) and what a step simulates with it.
#include <catch2/catch.hpp>

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
const char* const kScout = "llama4-scout-17b-16e.config.json";
const char* const kMaverick = "llama4-maverick-17b-128e.config.json";
}  // namespace

TEST_CASE("Llama 4: the HF configs' experts, dense layers and chunked layers", "[workloads][hf][llama4]") {
  const auto scout = load_hf_config(hf_doc(kScout), "scout");
  const auto maverick = load_hf_config(hf_doc(kMaverick), "maverick");
  // Scout: 16 experts in every layer; Maverick: 128 in the odd layers (interleave_moe_layer_step 2), the even ones
  // dense at intermediate_size_mlp.
  CHECK(scout.moe_layers() == 48);
  CHECK(maverick.moe_layers() == 24);
  CHECK_FALSE(maverick.is_moe_layer(0));
  CHECK(maverick.is_moe_layer(1));
  CHECK(maverick.mlp_dim == 16384);
  CHECK(maverick.moe_mlp_dim == 8192);
  CHECK(maverick.shared_mlp_dim() == 8192);
  // Chunks of 8192 on the RoPE layers, all but every fourth (3, 7, ..., 47: NoPE, full attention).
  for (const auto* m : {&scout, &maverick}) {
    CHECK(m->attention_chunk == 8192);
    CHECK(m->chunk_layer_ids.size() == 36);
    CHECK(m->attention_mask(0).kind == AttentionMask::Kind::chunked);
    CHECK(m->attention_mask(3).kind == AttentionMask::Kind::full);
    CHECK(m->attention_mask(47).kind == AttentionMask::Kind::full);
  }
  // Parameters by hand (d 5120, 40 heads and 8 KV heads of 128, vocabulary 202,048, untied, no biases; Llama 4's
  // q/k norm is an L2 norm without weights). A layer's attention: two RMSNorms, q and o (d x 5120 each), k and v
  // (d x 1024 each). An expert or the shared one: 3 x d x 8192; the router d x E; a dense MLP 3 x d x 16384.
  const double d = 5120, V = 202048;
  const double attention = 2 * d + d * 5120 * 2 + d * 1024 * 2, expert = 3 * d * 8192, dense = 3 * d * 16384;
  const double tables = 2 * V * d + d;  // and the final norm
  CHECK(scout.total_params() == Approx(tables + 48 * (attention + 16 * expert + d * 16 + expert)).epsilon(1e-12));
  CHECK(scout.activated_params() == Approx(tables + 48 * (attention + expert + d * 16 + expert)).epsilon(1e-12));
  CHECK(maverick.total_params() ==
        Approx(tables + 48 * attention + 24 * dense + 24 * (128 * expert + d * 128 + expert)).epsilon(1e-12));
  CHECK(maverick.activated_params() ==
        Approx(tables + 48 * attention + 24 * dense + 24 * (expert + d * 128 + expert)).epsilon(1e-12));
  // Meta's model cards: 17B active for both; 109B and 400B total with the vision encoder (under 1B), which hbmsim
  // does not simulate.
  CHECK(scout.activated_params() == Approx(17e9).epsilon(0.02));
  CHECK(maverick.activated_params() == Approx(17e9).epsilon(0.02));
  CHECK(scout.total_params() == Approx(108.5e9).epsilon(0.01));
  CHECK(maverick.total_params() == Approx(400e9).epsilon(0.01));
  // A model file keeps the chunks.
  const auto back = load_model(maverick.to_json(), "roundtrip");
  CHECK(back.to_json() == maverick.to_json());
  CHECK(back.chunk_layer_ids == maverick.chunk_layer_ids);
  // no_rope_layers, given, wins over the interval; attention_chunk_size null is no chunking.
  auto doc = hf_doc(kScout);
  doc["text_config"]["no_rope_layers"] = nlohmann::json::array();
  for (int l = 0; l < 48; ++l) doc["text_config"]["no_rope_layers"].push_back(l < 40 ? 1 : 0);
  CHECK(load_hf_config(doc, "s").chunk_layer_ids.size() == 40);
  doc["text_config"]["attention_chunk_size"] = nullptr;
  CHECK(load_hf_config(doc, "s").attention_chunk == 0);
}

TEST_CASE("Llama 4: chunked attention's work, executed and in model FLOPs, by hand", "[workloads][llama4]") {
  const AttentionMask chunk{AttentionMask::Kind::chunked, 8192};
  // 32,768 tokens: four whole chunks, each c^2 / 2 of the S^2 / 2 pairs: a quarter.
  CHECK(executed_attention_fraction(32768, chunk) == Approx(0.25).epsilon(1e-15));
  CHECK(model_attention_fraction(32768, chunk) == Approx(0.25).epsilon(1e-15));
  // 20,000: two chunks and a rest of 3,616: (2 x 8192^2 + 3616^2) / 20000^2.
  CHECK(executed_attention_fraction(20000, chunk) == Approx((2.0 * 8192 * 8192 + 3616.0 * 3616) / (20000.0 * 20000)).epsilon(1e-15));
  // A chunk of the sequence or more cuts nothing.
  CHECK(executed_attention_fraction(8192, chunk) == 1.0);
  CHECK_FALSE(mask_cuts(8192, chunk));

  const auto scout = load_hf_config(hf_doc(kScout), "scout");
  auto g = build_step_graph(scout, training(32768));
  CHECK(attention_flops(g.layer(0)) == Approx(attention_flops(g.layer(3)) / 4).epsilon(1e-12));
  // Model FLOPs: 12 full layers and 36 at a quarter, 21 layers' worth of causal attention, against 48.
  const double B = 1, S = 32768, H = 40, hd = 128;
  const double full_layer = 4.0 * B * S * S * H * hd / 2 * 3;  // forward and backward
  CHECK(scout.model_flops(B, 32768).attention_flops == Approx(21 * full_layer).epsilon(1e-12));
  // At 8,192 tokens every layer attends over the whole sequence: no template beyond the dense and the MoE one.
  CHECK(build_step_graph(scout, training(8192)).templates.size() == 2);
  CHECK(scout.model_flops(B, 8192).attention_flops == Approx(48 * 4.0 * 8192 * 8192 * H * hd / 2 * 3).epsilon(1e-12));
}

TEST_CASE("Llama 4: bad chunk settings name the file, the path and the value", "[workloads][hf][llama4]") {
  auto doc = hf_doc(kScout);
  doc["text_config"]["attention_chunk_size"] = 0;
  CHECK_THROWS_WITH(load_hf_config(doc, "s.json"), "s.json: text_config.attention_chunk_size = 0 (must be > 0)");
  doc = hf_doc(kScout);
  doc["text_config"]["no_rope_layers"] = {1, 0};
  CHECK_THROWS_WITH(load_hf_config(doc, "s.json"), Catch::StartsWith("s.json: text_config.no_rope_layers = ") &&
                                                    Catch::Contains("has 2 entries; expected num_hidden_layers = 48"));
  doc["text_config"]["no_rope_layers"] = nlohmann::json::array();
  for (int l = 0; l < 48; ++l) doc["text_config"]["no_rope_layers"].push_back(l == 5 ? 2 : 1);
  CHECK_THROWS_WITH(load_hf_config(doc, "s.json"), "s.json: text_config.no_rope_layers[5] = 2 (must be 0 (NoPE: full attention) or 1 (RoPE: chunked))");
  doc = hf_doc(kMaverick);
  doc["text_config"]["interleave_moe_layer_step"] = 49;
  CHECK_THROWS_WITH(load_hf_config(doc, "m.json"), "m.json: text_config.interleave_moe_layer_step = 49 (leaves no MoE layer)");
  doc["text_config"]["moe_layers"] = nullptr;  // null is not given: the step decides, and is named
  CHECK_THROWS_WITH(load_hf_config(doc, "m.json"), "m.json: text_config.interleave_moe_layer_step = 49 (leaves no MoE layer)");
  doc["text_config"]["moe_layers"] = nlohmann::json::array();
  CHECK_THROWS_WITH(load_hf_config(doc, "m.json"), "m.json: text_config.moe_layers = [] (leaves no MoE layer)");
  // Model files: chunk_layer_ids needs attention_chunk, and no layer is both windowed and chunked.
  auto m = load_hf_config(hf_doc(kMaverick), "m").to_json();
  m.erase("attention_chunk");
  CHECK_THROWS_WITH(load_model(m, "f.json"), Catch::StartsWith("f.json: chunk_layer_ids = [0,1,2,4") && Catch::Contains("needs attention_chunk"));
  m["attention_chunk"] = 8192;
  m["sliding_window"] = 1024;
  m["window_layer_ids"] = {2, 3};
  CHECK_THROWS_WITH(load_model(m, "f.json"), Catch::StartsWith("f.json: chunk_layer_ids = [0,1,2,4") && Catch::Contains("names layer 2, which window_layer_ids has too"));
  m.erase("chunk_layer_ids");
  CHECK_THROWS_WITH(load_model(m, "f.json"), "f.json: attention_chunk = 8192 (needs chunk_layer_ids with sliding_window (no layer may be both))");
}

TEST_CASE("Llama 4: physics holds over random layouts", "[invariants][llama4]") {
  // The suite's random layouts with a Llama 4 model in place of the drawn one at a sequence its chunks cut: the
  // laws of DESIGN.md, the fast-forward equal to every event, and the same run without chunks (more attention
  // work) never faster.
  const auto checked = test::check_masked_draws(20261206, 300, 24, {"attention_chunk", "chunk_layer_ids"}, "unchunked",
                                                [](RunConfig& c, int k, std::mt19937& rng) {
                                                  c.model = k % 2 == 0 ? "hf/llama4-scout-17b-16e.config.json"
                                                                       : "hf/llama4-maverick-17b-128e.config.json";
                                                  c.seq = test::pick<std::int64_t>(rng, {16384, 32768});
                                                  c.embedding_as_layer = c.loss_as_layer = false;
                                                });
  CHECK(checked.size() >= 16);
}
