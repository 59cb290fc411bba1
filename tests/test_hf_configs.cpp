// HuggingFace config.json import: the Llama relatives (Mistral, Qwen2, Qwen3), the MoE families (Mixtral,
// Qwen2-MoE, Qwen3-MoE) and tied embeddings, checked against parameter counts derived by hand and the
// published model sizes.
#include <catch2/catch.hpp>

#include <cmath>

#include "helpers.hpp"
#include "hwmodels/builtin.hpp"
#include "workloads/step_graph.hpp"

using namespace hbmsim;
using test::hf_doc;

namespace {

ModelSpec hf(const std::string& file) {
  const std::string name = "hf/" + file;
  auto text = builtin_file(name);
  REQUIRE(text);
  return load_hf_config(nlohmann::json::parse(*text), name);
}


struct Expected {
  const char* file;
  // Exact counts from the formula below, evaluated independently of hbmsim (by hand/Python from config.json).
  double total, active;
  // The publisher's figures and the unit of their last digit (published sizes are rounded, or truncated as
  // Qwen does: its card gives 7.61B for Qwen2.5-7B's 7,615,616,512): the count must lie within one unit.
  double published_total, published_active, unit;
};

// Exact parameter counts, as transformers instantiates these models (d hidden, L layers, H/K query/KV heads,
// h head_dim, V vocab, F intermediate, X experts, k per token, Fm expert width, Fs shared width):
//   tables V*d, twice unless tie_word_embeddings; final norm d
//   per layer: 2 norms 2d; q,k,v,o d*h*(H+2K) + H*h*d; + q/k/v bias h*(H+2K) (Qwen2, Qwen2-MoE);
//              + q/k norm 2h (Qwen3, Qwen3-MoE)
//   dense MLP 3*d*F; MoE: router d*X + experts X*3*d*Fm (+ shared 3*d*Fs + its gate d: Qwen2-MoE)
//   active: the same with k experts instead of X.
// Llama 3.2 3B: 128256*3072 + 3072 + 28*(6144 + 3072*128*40 + 3072*3072 + 3*3072*8192) = 3,212,749,824
//   (3.61 B if the tied head were counted twice: 394,002,432 more).
// Mixtral 8x7B: 2*32000*4096 + 4096 + 32*(8192 + 4096*128*48 + 4096*4096 + 4096*8 + 8*3*4096*14336)
//   = 46,702,792,704; active with 2 of 8 experts 12,879,925,248.
// Qwen3-30B-A3B: 2*151936*2048 + 2048 + 48*(4096 + 2048*128*40 + 4096*2048 + 256 + 2048*128 + 128*3*2048*768)
//   = 30,532,122,624; active with 8 of 128: 3,353,032,704.
// Qwen3-235B-A22B: 2*151936*4096 + 4096 + 94*(8192 + 4096*128*72 + 8192*4096 + 256 + 4096*128 + 128*3*4096*1536)
//   = 235,093,634,560; active with 8 of 128: 22,190,763,520.
// Qwen2-57B-A14B: 2*151936*3584 + 3584 + 28*(7168 + 3584*128*36 + 3584*3584 + 128*36 + 3584*64
//   + 64*3*3584*2560 + 3*3584*20480 + 3584) = 57,408,658,944; active with 8 of 64: 14,249,270,784.
const Expected kExpected[] = {
    {"llama3.2-3b.config.json", 3212749824, 3212749824, 3.21e9, 3.21e9, 0.01e9},
    {"mistral-7b-v0.1.config.json", 7241732096, 7241732096, 7.24e9, 7.24e9, 0.01e9},
    {"qwen2.5-7b.config.json", 7615616512, 7615616512, 7.61e9, 7.61e9, 0.01e9},  // Qwen's card: 7.61B
    {"qwen3-8b.config.json", 8190735360, 8190735360, 8.2e9, 8.2e9, 0.1e9},       // Qwen's card: 8.2B
    {"mixtral-8x7b.config.json", 46702792704, 12879925248, 46.7e9, 12.9e9, 0.1e9},
    {"qwen1.5-moe-a2.7b.config.json", 14315784192, 2689173504, 14.3e9, 2.7e9, 0.1e9},
    {"qwen3-30b-a3b.config.json", 30532122624, 3353032704, 30.5e9, 3.3e9, 0.1e9},
    {"qwen2-57b-a14b.config.json", 57408658944, 14249270784, 57e9, 14e9, 1e9},  // Qwen2 report: 57B, 14B
    {"qwen3-235b-a22b.config.json", 235093634560, 22190763520, 235e9, 22e9, 0.5e9},  // Qwen's card: 235B, 22B
};

// The GQA configs: those above, GPT-OSS and Gemma (whose published counts are checked on their own below).
std::vector<std::string> gqa_files() {
  std::vector<std::string> files = {"gpt-oss-120b.config.json", "gpt-oss-20b.config.json", "gemma-2-9b.config.json",
                                    "gemma-3-1b.config.json", "gemma-3-27b.config.json", "glm-4.5.config.json",
                                    "glm-4.5-air.config.json", "minimax-m2.config.json"};
  for (const auto& e : kExpected) files.emplace_back(e.file);
  return files;
}

TrainingSpec training(std::int64_t gpus, std::int64_t ep = 1, std::int64_t pp = 1) {
  TrainingSpec t;
  t.gpus = gpus;
  t.per_device_batch = 1;
  t.seq_len = 4096;
  t.parallelism.ep = ep;
  t.parallelism.pp = pp;
  return t;
}

}  // namespace

TEST_CASE("HF configs: parameter counts match the exact formula and the published sizes", "[workloads][hf]") {
  for (const auto& e : kExpected) {
    INFO(e.file);
    auto m = hf(e.file);
    CHECK(m.total_params() == Approx(e.total).epsilon(1e-12));
    CHECK(m.activated_params() == Approx(e.active).epsilon(1e-12));
    CHECK(std::abs(m.total_params() - e.published_total) <= e.unit);
    CHECK(std::abs(m.activated_params() - e.published_active) <= e.unit);
  }
  // GPT-OSS (d 2880, H 64, K 8, h 64, V 201088, F = Fm 2880, k 4; L 36 with X 128, or L 24 with X 32). Per
  // layer: norms 2d; q,k,v,o d*h*(H+2K) + H*h*d with their biases h*(H+2K) + d; sinks H; router d*X + X;
  // each expert 3*d*Fm plus biases 2*Fm + d:
  //   attention 5760 + 14,745,600 + 11,796,480 + 5120 + 2880 + 64 = 26,555,904; expert 24,891,840
  //   120b: 2*V*d + d + 36*(26,555,904 + 368,768 + 128*24,891,840) = 116,829,156,672
  //         active with 4 experts: 2*V*d + d + 36*(26,555,904 + 368,768 + 4*24,891,840) = 5,711,982,912
  //   20b:  2*V*d + d + 24*(26,555,904 + 92,192 + 32*24,891,840) = 20,914,757,184; active 4,187,440,704
  // OpenAI's model card gives 116.83B and 20.91B total, 5.13B and 3.61B active, counting the unembedding but
  // not the input table (V*d = 579,133,440).
  struct Oss { const char* file; double total, active, card_total, card_active; };
  for (auto o : {Oss{"gpt-oss-120b.config.json", 116829156672, 5711982912, 116.83e9, 5.13e9},
                 Oss{"gpt-oss-20b.config.json", 20914757184, 4187440704, 20.91e9, 3.61e9}}) {
    INFO(o.file);
    auto m = hf(o.file);
    CHECK(m.total_params() == o.total);
    CHECK(m.activated_params() == o.active);
    CHECK(std::abs(m.total_params() - o.card_total) <= 0.01e9);
    CHECK(std::abs(m.activated_params() - 201088.0 * 2880 - o.card_active) <= 0.01e9);
  }
  // Gemma (tied tables; four RMSNorms per layer, Gemma 3 also q/k norms of h each). Gemma 2 9B (d 3584, L 42, H 16,
  // K 8, h 256, F 14336, V 256000): 42*(4*3584 + 3584*256*(16+16) + 16*256*3584 + 3*3584*14336) + V*d + d
  //   = 42*198,195,200 + 917,504,000 + 3584 = 9,241,705,984 (Google's card: 9.24B).
  // Gemma 3 (its report, table 1, non-embedding / embedding parameters): 1B (d 1152, L 26, H 4, K 1, h 256,
  // F 6912, V 262144): 26*(4*1152 + 512 + 1152*256*6 + 4*256*1152 + 3*1152*6912) + d = 697,896,064 and
  // V*d = 301,989,888 (698M and 302M); 27B (d 5376, L 62, H 32, K 16, h 128, F 21504): 62*(4*5376 + 256
  // + 5376*128*64 + 32*128*5376 + 3*5376*21504) + d = 25,599,716,096 (25,600M; its vision tower is not read).
  auto g2 = hf("gemma-2-9b.config.json"), g1 = hf("gemma-3-1b.config.json"), g27 = hf("gemma-3-27b.config.json");
  CHECK(g2.total_params() == 9241705984.0);
  CHECK(std::abs(g2.total_params() - 9.24e9) <= 0.01e9);
  auto non_embedding = [](const ModelSpec& m) { return m.total_params() - static_cast<double>(m.vocab_size) * m.d_model; };
  CHECK(non_embedding(g1) == 697896064.0);
  CHECK(g1.total_params() - non_embedding(g1) == 301989888.0);
  CHECK(non_embedding(g27) == 25599716096.0);
  CHECK(std::abs(non_embedding(g27) - 25.6e9) <= 0.001e9);
  // The Qwen cards also give the non-embedding counts (both tables off): 6.53B and 6.95B.
  auto q25 = hf("qwen2.5-7b.config.json"), q3 = hf("qwen3-8b.config.json");
  CHECK(std::abs(q25.total_params() - 2.0 * q25.vocab_size * q25.d_model - 6.53e9) <= 0.01e9);
  CHECK(std::abs(q3.total_params() - 2.0 * q3.vocab_size * q3.d_model - 6.95e9) <= 0.01e9);
}

TEST_CASE("HF configs: a tied head counts once in parameters but still runs its GEMM", "[workloads][hf]") {
  auto tied = hf("llama3.2-3b.config.json");
  CHECK(tied.tied_embeddings);
  auto doc = hf_doc("llama3.2-3b.config.json");
  doc["tie_word_embeddings"] = false;
  auto untied = load_hf_config(doc, "untied");
  const double table = 128256.0 * 3072;
  CHECK(untied.total_params() - tied.total_params() == table);
  CHECK(tied.model_flops(1, 4096).total() == untied.model_flops(1, 4096).total());

  // What a device stores: one table on a single stage (fsdp 8: an eighth of everything) ...
  auto g = build_step_graph(tied, training(8));
  REQUIRE(g.stages.size() == 1);
  CHECK(g.stages[0].local_params * 8 == Approx(tied.total_params()).epsilon(1e-12));
  CHECK(g.head_grad_bytes_on(g.stages[0]) == g.final_norm_grad_bytes);
  auto gu = build_step_graph(untied, training(8));
  CHECK(gu.head_grad_bytes_on(gu.stages[0]) == gu.head_grad_bytes);
  CHECK(gu.stages[0].local_params * 8 == Approx(untied.total_params()).epsilon(1e-12));
  // ... and a copy on the head's stage when the pipeline puts it elsewhere (Megatron's layout).
  auto gp = build_step_graph(tied, training(8, 1, 2));
  REQUIRE(gp.stages.size() == 2);
  CHECK((gp.stages[0].local_params + gp.stages[1].local_params) * 4 == Approx(tied.total_params() + table).epsilon(1e-12));
  CHECK(gp.head_grad_bytes_on(gp.stages[1]) == gp.head_grad_bytes);
}

TEST_CASE("HF configs: model FLOPs per token are 6x the matmul parameters a token uses", "[workloads][hf]") {
  // weights_flops / tokens = 6 * (activated parameters - the lookup table when untied - norms, biases and
  // router biases, which no GEMM uses). The left-out terms are below 0.1% for every model here.
  for (const auto& file : gqa_files()) {
    INFO(file);
    auto m = hf(file);
    const double S = 4096, table = static_cast<double>(m.vocab_size) * static_cast<double>(m.d_model);
    const double matmul_params = m.activated_params() - (m.tied_embeddings ? 0 : table);
    CHECK(m.model_flops(1, 4096).weights_flops / S / 6 == Approx(matmul_params).epsilon(1e-3));
  }
}

TEST_CASE("HF configs map onto the spec's fields", "[workloads][hf]") {
  auto mistral = hf("mistral-7b-v0.1.config.json");
  CHECK(mistral.head_dim == 128);
  CHECK_FALSE(mistral.qkv_bias);
  CHECK(mistral.num_experts == 0);

  auto q25 = hf("qwen2.5-7b.config.json");
  CHECK(q25.qkv_bias);
  CHECK_FALSE(q25.out_bias);
  CHECK_FALSE(q25.qk_norm);

  // Qwen3-30B-A3B: head_dim 128 is not hidden_size / heads (64); every layer MoE, no shared expert.
  auto q3moe = hf("qwen3-30b-a3b.config.json");
  CHECK(q3moe.head_dim == 128);
  CHECK(q3moe.qk_norm);
  CHECK(q3moe.moe_layers() == 48);
  CHECK(q3moe.shared_mlp_dim() == 0);
  CHECK(q3moe.moe_mlp_dim == 768);

  auto mixtral = hf("mixtral-8x7b.config.json");
  CHECK(mixtral.num_experts == 8);
  CHECK(mixtral.experts_per_token == 2);
  CHECK(mixtral.moe_mlp_dim == 14336);
  CHECK(mixtral.moe_layers() == 32);
  CHECK(mixtral.shared_mlp_dim() == 0);
  CHECK_FALSE(mixtral.router_bias);

  // GPT-OSS: biased attention (attention_bias defaults to true), sinks, a biased router and biased experts in
  // every layer (its windows: test_sliding_window.cpp).
  auto oss = hf("gpt-oss-120b.config.json");
  CHECK(oss.head_dim == 64);
  CHECK((oss.qkv_bias && oss.out_bias && oss.attention_sinks && oss.router_bias && oss.expert_bias));
  CHECK(oss.moe_layers() == 36);
  CHECK(oss.moe_mlp_dim == 2880);
  auto oss_doc = hf_doc("gpt-oss-20b.config.json");
  oss_doc.erase("attention_bias");
  CHECK(load_hf_config(oss_doc, "oss").total_params() == hf("gpt-oss-20b.config.json").total_params());

  // Gemma 3: tied, q/k norms, post-norms; its keys from text_config (27B) over Gemma3TextConfig's defaults (27B's
  // text_config leaves vocab_size out: 262208).
  auto g27 = hf("gemma-3-27b.config.json");
  CHECK((g27.tied_embeddings && g27.qk_norm && g27.post_norms && !g27.qkv_bias));
  CHECK(g27.vocab_size == 262208);
  CHECK(g27.head_dim == 128);
  auto g27_doc = hf_doc("gemma-3-27b.config.json");
  g27_doc["text_config"]["hidden_size"] = 0;
  CHECK_THROWS_WITH(load_hf_config(g27_doc, "g.json"), "g.json: text_config.hidden_size = 0 (must be > 0)");
  g27_doc.erase("text_config");
  CHECK_THROWS_WITH(load_hf_config(g27_doc, "g.json"), "g.json: text_config is missing (required)");
  // Gemma 2: no q/k norms.
  auto g2 = hf("gemma-2-9b.config.json");
  CHECK((g2.post_norms && !g2.qk_norm && g2.tied_embeddings));

  auto q2moe = hf("qwen2-57b-a14b.config.json");
  CHECK(q2moe.shared_mlp_dim() == 20480);
  CHECK(q2moe.shared_expert_gate);
  CHECK(q2moe.qkv_bias);

  // Llama's attention_bias covers q, k, v and o; mlp_bias the MLP's three projections.
  auto doc = hf_doc("llama3.2-3b.config.json");
  doc["attention_bias"] = true;
  doc["mlp_bias"] = true;
  auto biased = load_hf_config(doc, "biased");
  CHECK(biased.total_params() - hf("llama3.2-3b.config.json").total_params() ==
        28.0 * (128 * (24 + 2 * 8) + 3072 + 2 * 8192 + 3072));
  // Mistral ignores attention_bias, as transformers' MistralAttention does.
  doc = hf_doc("mistral-7b-v0.1.config.json");
  doc["attention_bias"] = true;
  CHECK(load_hf_config(doc, "mistral").total_params() == mistral.total_params());
}

TEST_CASE("HF configs: GLM-4 MoE is GQA with q/k/v biases over DeepSeek-V3's MoE block", "[workloads][hf]") {
  // transformers' Glm4MoeForCausalLM: q/k/v biases (attention_bias) but none on o_proj, per-head q/k RMSNorms
  // when use_qk_norm, DeepSeek-V3's router (weight and e_score_correction_bias) and shared experts of
  // moe_intermediate_size, dense layers of intermediate_size before first_k_dense_replace. Per layer (d, H, K,
  // h = 128, Fm, X, F): norms 2d; attention d*h*(H+2K) + h*(H+2K) + H*h*d (+ 2h); MoE X*d + X + 3*d*Fm*(X + 1).
  // GLM-4.5 (d 5120, L 92, H 96, K 8, Fm 1536, X 160, F 12288, 3 dense, V 151552, q/k norms):
  //   attention 136,339,712; MoE layer 3,799,285,920; dense MLP 188,743,680; tables 2*V*d + d = 1,551,897,600
  //   total = tables + 92*attention + 3*dense + 89*MoE = 352,797,829,024
  //   active with 8 of 160 experts: 33,632,266,144
  // GLM-4.5-Air (d 4096, L 46, Fm 1408, X 128, F 10944, 1 dense, no q/k norms): 106,852,251,264; 13,424,129,664.
  auto glm = hf("glm-4.5.config.json"), air = hf("glm-4.5-air.config.json");
  CHECK(glm.total_params() == 352797829024.0);
  CHECK(glm.activated_params() == 33632266144.0);
  CHECK(air.total_params() == 106852251264.0);
  CHECK(air.activated_params() == 13424129664.0);
  // Zhipu's figures: 355B total with 32B active, and 106B with 12B. The active ones leave both tables out
  // (32.08B and 12.18B); 355B lies between the decoder alone and the decoder with its one MTP module
  // (num_nextn_predict_layers, which transformers does not build: a run's mtp_layers adds it): a MoE layer,
  // eh_proj 2d^2 and three norms: 352,797,829,024 + 136,339,712 + 3,799,285,920 + 52,428,800 + 15,360 = 356,785,898,816.
  CHECK(std::abs(glm.activated_params() - 2 * 151552.0 * 5120 - 32e9) <= 0.1e9);
  CHECK(std::abs(air.activated_params() - 2 * 151552.0 * 4096 - 12e9) <= 0.2e9);
  CHECK(std::abs(air.total_params() - 106e9) <= 1e9);
  auto with_mtp = glm;
  with_mtp.mtp_layers = 1;
  CHECK(with_mtp.total_params() == 356785898816.0);
  CHECK((glm.total_params() < 355e9 && 355e9 < with_mtp.total_params()));

  CHECK(glm.architecture == Architecture::llama);
  CHECK((glm.qkv_bias && !glm.out_bias && glm.qk_norm && glm.router_bias && !air.qk_norm));
  CHECK(glm.head_dim == 128);
  CHECK(glm.num_kv_heads == 8);
  CHECK(glm.first_dense_layers == 3);
  CHECK(glm.moe_layers() == 89);
  CHECK(glm.shared_mlp_dim() == 1536);
  CHECK(air.first_dense_layers == 1);
  // n_group 1 with topk_group 1: one group of every expert, so a token may reach any of them.
  CHECK(glm.routing_groups == 1);
  // The class defaults: no q/k norms, no attention biases; moe_layer_freq is DeepSeek's key, not GLM's.
  auto doc = hf_doc("glm-4.5.config.json");
  doc.erase("use_qk_norm");
  doc.erase("attention_bias");
  doc["moe_layer_freq"] = 2;
  auto plain = load_hf_config(doc, "glm");
  CHECK((!plain.qk_norm && !plain.qkv_bias && !plain.out_bias));
  CHECK(plain.moe_layers() == 89);
  CHECK(glm.total_params() - plain.total_params() == 92.0 * (128 * (96 + 2 * 8) + 2 * 128));
  doc.erase("head_dim");
  CHECK_THROWS_WITH(load_hf_config(doc, "glm.json"), Catch::StartsWith("glm.json: head_dim is missing (required for Glm4MoeForCausalLM"));
}

TEST_CASE("HF configs: Kimi K2 is DeepSeek-V3's architecture with 384 experts and 64 heads", "[workloads][hf]") {
  // MLA per layer (d 7168, H 64, q rank 1536, kv rank 512, nope 128, rope 64, v 128): norms 2d, d*1536 + 1536
  // + 1536*H*192 + d*576 + 512 + 512*H*256 + H*128*d = 101,138,432. One dense MLP of F 18432 (3dF =
  // 396,361,728), 60 MoE blocks of 384 experts and a shared one of 2048 with the router (384 d + 384):
  // 16,958,226,816 each. Tables 2*163840*d + d = 2,348,817,408. Total 1,026,408,232,448; active with 8 experts
  // 32,861,500,928.
  auto k2 = hf("kimi-k2.config.json");
  CHECK(k2.total_params() == 1026408232448.0);
  CHECK(k2.activated_params() == 32861500928.0);
  CHECK(k2.routing_groups == 1);
  CHECK(k2.first_dense_layers == 1);
  // Moonshot's figures: 32B activated (as DeepSeek's 37B for V3, without the input table: 31.7B here) and
  // 1.04T total in its report (1T on the model card): 1.3% above hbmsim's count of the same tensors.
  CHECK(std::abs(k2.activated_params() - 163840.0 * 7168 - 32e9) <= 0.5e9);
  auto ds = hf("deepseek-v3.config.json");
  CHECK(std::abs(ds.activated_params() - 129280.0 * 7168 - 37e9) <= 0.5e9);
  CHECK(std::abs(k2.total_params() / 1.04e12 - 1) <= 0.015);
}

TEST_CASE("HF configs: MiniMax-M2 normalises queries and keys over all heads at once", "[workloads][hf]") {
  // MiniMaxM2ForCausalLM (d 3072, L 62, H 48, K 8, h 128, V 200064): q/k RMSNorms over the whole projection
  // (qk_norm_type per_layer: H*h and K*h scales), 256 experts of intermediate_size 1536 in every layer with a
  // routing bias, no shared expert. Per layer: norms 2d + q,k,v,o d*h*(H+2K) + H*h*d + norms h*(H+K) =
  // 44,053,504; router 256 d + 256 and experts 256*3*d*1536: 3,624,665,344. Tables 2*V*d + d.
  // Total 228,689,764,864 (MiniMax: 230B); active with 8 experts 11,030,553,088, 9.80B without the tables (10B).
  auto m2 = hf("minimax-m2.config.json");
  CHECK(m2.total_params() == 228689764864.0);
  CHECK(m2.activated_params() == 11030553088.0);
  CHECK(std::abs(m2.activated_params() - 2 * 200064.0 * 3072 - 10e9) <= 0.25e9);
  CHECK((m2.qk_norm && m2.qk_norm_per_layer && m2.router_bias && !m2.expert_bias && !m2.qkv_bias));
  CHECK(m2.moe_layers() == 62);
  CHECK(m2.shared_mlp_dim() == 0);
  // MiniMaxM2Config's defaults: the same model without the three keys; per-head norms count 2h a layer.
  auto doc = hf_doc("minimax-m2.config.json");
  for (auto key : {"use_qk_norm", "qk_norm_type", "use_routing_bias"}) doc.erase(key);
  CHECK(load_hf_config(doc, "m2").total_params() == m2.total_params());
  doc["qk_norm_type"] = "per_head";
  CHECK(m2.total_params() - load_hf_config(doc, "m2").total_params() == 62.0 * (128 * (48 + 8) - 2 * 128));
  doc["qk_norm_type"] = "per_token";
  CHECK_THROWS_WITH(load_hf_config(doc, "m2.json"), "m2.json: qk_norm_type = \"per_token\" (expected per_layer or per_head)");
  // MiniMax-Text-01's lightning (linear) attention layers are refused, not simulated as softmax ones.
  doc = hf_doc("minimax-m2.config.json");
  doc["attn_type_list"][7] = 0;
  CHECK_THROWS_WITH(load_hf_config(doc, "m2.json"),
                    "m2.json: attn_type_list[7] = 0 (is a linear (lightning) attention layer, which hbmsim does not model)");
  // A model file keeps the per-layer norms, and refuses them without qk_norm.
  auto j = m2.to_json();
  CHECK(j.at("qk_norm_per_layer").get<bool>());
  j.erase("qk_norm");
  CHECK_THROWS_WITH(load_model(j, "f.json"), "f.json: qk_norm_per_layer = true (needs qk_norm)");
}

TEST_CASE("HF configs: GLM-4.5-Air simulates, its one routing group reaching every expert", "[workloads][hf][cli]") {
  // 64 GB200s, experts over 32, the flex dispatcher (whose copies follow the routing): n_group 1 and
  // topk_group 1 leave a token free to pick any expert, so the step equals the one without the keys.
  auto doc = hf_doc("glm-4.5-air.config.json");
  doc.erase("n_group");
  doc.erase("topk_group");
  const auto ungrouped = test::temp_dir() / "glm-air-ungrouped.json";
  test::write(ungrouped, doc.dump());
  const std::string flags = " --system gb200-nvl72 --gpus 64 --ep 32 --moe-dispatcher flex --seq 4096 --json";
  auto grouped = test::cli("simulate --model hf/glm-4.5-air.config.json" + flags);
  auto free = test::cli("simulate --model " + ungrouped.string() + flags);
  REQUIRE(grouped.status == 0);
  REQUIRE(free.status == 0);
  auto a = nlohmann::json::parse(grouped.out), b = nlohmann::json::parse(free.out);
  CHECK(a.at("step_time_s") == b.at("step_time_s"));
  CHECK(a.at("hbm_peak_bytes") == b.at("hbm_peak_bytes"));
  CHECK(a.at("mfu").get<double>() > 0.05);
  CHECK(a.at("mfu").get<double>() <= 1.0);
  CHECK(a.at("fits").get<bool>());
  // fp32 master weights of the whole model over the 64 devices (experts over ep 32, the rest over fsdp 2 x ep).
  CHECK(a.at("hbm_breakdown_bytes").at("parameters").get<double>() == Approx(106852251264.0 * 4 / 64).epsilon(1e-9));
}

TEST_CASE("HF configs: decoder_sparse_step, mlp_only_layers and moe_layer_freq choose the dense layers", "[workloads][hf]") {
  // transformers: Qwen-MoE layer i is sparse unless i is in mlp_only_layers or (i + 1) % decoder_sparse_step != 0.
  auto doc = hf_doc("qwen3-30b-a3b.config.json");
  doc["decoder_sparse_step"] = 2;
  doc["mlp_only_layers"] = {5, 1, 5};
  auto m = load_hf_config(doc, "sparse");
  CHECK_FALSE(m.is_moe_layer(0));
  CHECK_FALSE(m.is_moe_layer(1));
  CHECK(m.is_moe_layer(3));
  CHECK_FALSE(m.is_moe_layer(5));
  CHECK(m.is_moe_layer(47));
  CHECK(m.moe_layers() == 22);  // the 24 odd layers less 1 and 5
  auto full = hf("qwen3-30b-a3b.config.json");
  CHECK(full.total_params() - m.total_params() ==
        26.0 * (full.expert_params_per_layer() + full.moe_nonexpert_params_per_layer() - 3.0 * 2048 * 6144));
  auto g = build_step_graph(m, training(8, 8));
  CHECK(g.layer_template[1] == 0);
  CHECK(g.layer_template[3] == 1);
  CHECK(g.layer_template[5] == 0);

  // DeepSeek-V3: past first_k_dense_replace, layer i is MoE when i % moe_layer_freq == 0.
  auto ds_doc = hf_doc("deepseek-v3.config.json");
  ds_doc["moe_layer_freq"] = 2;
  auto ds = load_hf_config(ds_doc, "ds");
  CHECK_FALSE(ds.is_moe_layer(2));
  CHECK_FALSE(ds.is_moe_layer(3));
  CHECK(ds.is_moe_layer(4));
  CHECK(ds.moe_layers() == 29);  // 4, 6, ..., 60
  // Its group-limited routing (n_group 8, topk_group 4), as the built-in model file has it.
  CHECK(ds.routing_groups == 8);
  CHECK(ds.groups_per_token == 4);
  CHECK(builtin_model("deepseek-v3-671b").routing_groups == 8);
  CHECK(builtin_model("deepseek-v3-671b").groups_per_token == 4);
  CHECK(load_model(ds.to_json(), "roundtrip").groups_per_token == 4);
  // Without them, any expert (DeepSeek-V2-Lite's configs set n_group 1, topk_group 1: the same).
  ds_doc.erase("n_group");
  ds_doc.erase("topk_group");
  CHECK(load_hf_config(ds_doc, "ds").routing_groups == 0);
  // Groups that cannot hold a token's experts, or one key without the other, name the key and the value.
  ds_doc["n_group"] = 8;
  CHECK_THROWS_WITH(load_hf_config(ds_doc, "ds.json"), Catch::Contains("ds.json: n_group = 8") && Catch::Contains("needs topk_group too"));
  ds_doc["topk_group"] = 9;
  CHECK_THROWS_WITH(load_hf_config(ds_doc, "ds.json"), Catch::Contains("ds.json: topk_group = 9") && Catch::Contains("exceeds n_group = 8"));
  ds_doc["topk_group"] = 1;  // 32 experts in one group, 8 per token: fine
  CHECK(load_hf_config(ds_doc, "ds").groups_per_token == 1);
  ds_doc["n_group"] = 64;  // 4 experts a group, one group: not 8
  CHECK_THROWS_WITH(load_hf_config(ds_doc, "ds.json"),
                    Catch::Contains("ds.json: num_experts_per_tok = 8") && Catch::Contains("exceeds the 4 experts of the 1 groups"));
  ds_doc["n_group"] = 7;
  CHECK_THROWS_WITH(load_hf_config(ds_doc, "ds.json"), Catch::Contains("ds.json: n_group = 7") && Catch::Contains("must divide the number of experts, 256"));

  // A model file keeps the list: to_json reads back to the same spec.
  auto back = load_model(m.to_json(), "roundtrip");
  CHECK(back.to_json() == m.to_json());
  CHECK(back.total_params() == m.total_params());
}

TEST_CASE("HF configs read back from to_json as model files", "[workloads][hf]") {
  for (const auto& file : gqa_files()) {
    INFO(file);
    auto m = hf(file);
    auto back = load_model(m.to_json(), "roundtrip");
    CHECK(back.to_json() == m.to_json());
    CHECK(back.total_params() == m.total_params());
    CHECK(back.activated_params() == m.activated_params());
  }
}

TEST_CASE("HF configs: unsupported or incomplete files name the file, the path and the value", "[workloads][hf]") {
  auto doc = hf_doc("qwen2.5-7b.config.json");
  doc["architectures"] = {"Phi3ForCausalLM"};
  try {
    load_hf_config(doc, "phi.json");
    FAIL("accepted an unsupported architecture");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("phi.json: architectures[0] = \"Phi3ForCausalLM\" (unsupported architecture") &&
                             Catch::Contains("Qwen2MoeForCausalLM"));
  }
  doc = hf_doc("mixtral-8x7b.config.json");
  doc.erase("num_local_experts");
  CHECK_THROWS_WITH(load_hf_config(doc, "mixtral.json"), "mixtral.json: num_local_experts is missing (required)");
  doc = hf_doc("qwen3-8b.config.json");
  doc.erase("head_dim");
  CHECK_THROWS_WITH(load_hf_config(doc, "qwen3.json"), Catch::StartsWith("qwen3.json: head_dim is missing"));
  doc = hf_doc("qwen3-30b-a3b.config.json");
  doc["mlp_only_layers"] = {-1};
  CHECK_THROWS_WITH(load_hf_config(doc, "q.json"), Catch::StartsWith("q.json: mlp_only_layers[0] = -1 (must be a layer index in [0, 48))"));
}

TEST_CASE("HF configs simulate end to end on 8 H200s with plausible results", "[workloads][hf][cli]") {
  struct Run { const char* file; const char* flags; };
  for (auto r : {Run{"llama3.2-3b", ""}, {"mistral-7b-v0.1", ""}, {"qwen2.5-7b", ""}, {"qwen3-8b", ""},
                 {"mixtral-8x7b", " --ep 8"}, {"qwen1.5-moe-a2.7b", " --ep 4"}, {"qwen3-30b-a3b", " --ep 8"},
                 {"qwen2-57b-a14b", " --ep 8"}, {"gpt-oss-20b", " --ep 8"}, {"gemma-2-9b", ""}, {"gemma-3-1b", ""}}) {
    INFO(r.file);
    // Appended piece by piece: GCC 12 warns (-Warray-bounds, a false positive) on the chain of temporaries.
    std::string path = HBMSIM_SOURCE_DIR;
    path += "/data/hf/";
    path += r.file;
    path += ".config.json";
    auto res = test::cli("simulate --model " + path + " --system h200-hgx --gpus 8 --json" + r.flags);
    REQUIRE(res.status == 0);
    auto j = nlohmann::json::parse(res.out);
    CHECK(j.at("mfu").get<double>() > 0.05);
    CHECK(j.at("mfu").get<double>() <= 1.0);
    CHECK(j.at("fits").get<bool>());  // each fits 141 GB at batch 1 x 4096 with its weights over 8 GPUs
    // The stored weights are the model's total over the 8 devices (the experts split over ep, the rest over
    // fsdp and ep): fp32 master weights, 4 bytes each.
    auto m = load_hf_config(nlohmann::json::parse(test::slurp(path)), path);
    CHECK(j.at("hbm_breakdown_bytes").at("parameters").get<double>() == Approx(m.total_params() * 4 / 8).epsilon(1e-9));
  }
}

TEST_CASE("HF configs: a shipped config resolves by its data name from any directory", "[hf]") {
  auto m = resolve_model("hf/mixtral-8x7b.config.json");
  CHECK(m.num_experts == 8);
  CHECK(m.num_layers == 32);
}
