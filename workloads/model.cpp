#include "workloads/model.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include "hwmodels/builtin.hpp"
#include "hwmodels/json_view.hpp"

namespace hbmsim {

const char* to_string(Architecture a) { return a == Architecture::llama ? "llama" : "deepseek_v3"; }

bool ModelSpec::is_moe_layer(std::int64_t layer) const {
  if (is_mtp_layer(layer)) return is_moe_layer(num_layers - 1);
  return num_experts > 0 && layer >= first_dense_layers &&
         !std::binary_search(dense_layer_ids.begin(), dense_layer_ids.end(), layer);
}

std::int64_t ModelSpec::attention_window(std::int64_t layer) const {
  if (is_mtp_layer(layer)) return attention_window(num_layers - 1);
  return std::binary_search(window_layer_ids.begin(), window_layer_ids.end(), layer) ? sliding_window : 0;
}

AttentionMask ModelSpec::attention_mask(std::int64_t layer) const {
  if (is_mtp_layer(layer)) return attention_mask(num_layers - 1);
  if (const std::int64_t w = attention_window(layer); w > 0) return {AttentionMask::Kind::sliding, w};
  if (std::binary_search(chunk_layer_ids.begin(), chunk_layer_ids.end(), layer)) return {AttentionMask::Kind::chunked, attention_chunk};
  return {};
}

bool ModelSpec::is_linear_attention_layer(std::int64_t layer) const {
  if (is_mtp_layer(layer)) return is_linear_attention_layer(num_layers - 1);
  return std::binary_search(linear_attention_layer_ids.begin(), linear_attention_layer_ids.end(), layer);
}

namespace {
// Whether a window of `window` tokens (0: none) cuts a sequence of `seq`: one of the sequence or more is none.
bool window_cuts(double seq, double window) { return window > 0 && window < seq; }
}  // namespace

bool mask_cuts(double seq, const AttentionMask& mask) {
  return mask.kind != AttentionMask::Kind::full && window_cuts(seq, static_cast<double>(mask.tokens));
}

namespace {
double chunked_fraction(double seq, double chunk) {
  const double n = std::floor(seq / chunk), r = seq - n * chunk;
  return (n * chunk * chunk + r * r) / (seq * seq);
}
}  // namespace

double executed_attention_fraction(double seq, const AttentionMask& mask) {
  if (!mask_cuts(seq, mask)) return 1.0;
  const double t = static_cast<double>(mask.tokens);
  return mask.kind == AttentionMask::Kind::sliding ? executed_window_fraction(seq, t) : chunked_fraction(seq, t);
}

double model_attention_fraction(double seq, const AttentionMask& mask) {
  if (!mask_cuts(seq, mask)) return 1.0;
  const double t = static_cast<double>(mask.tokens);
  return mask.kind == AttentionMask::Kind::sliding ? model_window_fraction(seq, t) : chunked_fraction(seq, t);
}

double executed_window_fraction(double seq, double window) {
  if (!window_cuts(seq, window)) return 1.0;
  return (2.0 * seq * window - window * window) / (seq * seq);
}

double model_window_fraction(double seq, double window) {
  if (!window_cuts(seq, window)) return 1.0;
  return window / seq;
}

std::int64_t ModelSpec::moe_layers() const {
  if (num_experts == 0) return 0;
  return num_layers - first_dense_layers - static_cast<std::int64_t>(dense_layer_ids.size());
}

double ModelSpec::attention_params_per_layer() const {
  const double d = static_cast<double>(d_model), H = static_cast<double>(num_query_heads);
  double p = (post_norms ? 4 : 2) * d;  // RMSNorm scales: before the attention and the MLP (and after them)
  if (is_mla()) {
    const double qk = static_cast<double>(qk_nope_head_dim + qk_rope_head_dim);
    if (q_lora_rank > 0) p += d * q_lora_rank + q_lora_rank + static_cast<double>(q_lora_rank) * H * qk;
    else p += d * H * qk;
    p += d * static_cast<double>(kv_lora_rank + qk_rope_head_dim) + kv_lora_rank;
    p += static_cast<double>(kv_lora_rank) * H * static_cast<double>(qk_nope_head_dim + v_head_dim);
    p += H * static_cast<double>(v_head_dim) * d;
  } else {
    const double hd = static_cast<double>(head_dim), qkv_width = hd * (H + 2.0 * num_kv_heads);
    p += d * qkv_width + H * hd * d;
    if (qkv_bias) p += qkv_width;
    if (out_bias) p += d;
    if (qk_norm) p += qk_norm_per_layer ? hd * (H + static_cast<double>(num_kv_heads)) : 2 * hd;
    if (attention_sinks) p += H;
    if (attention_output_gate) p += d * H * hd;
  }
  return p;
}

double ModelSpec::linear_attention_params_per_layer() const {
  const double d = static_cast<double>(d_model), Hv = static_cast<double>(linear_num_value_heads);
  const double K = static_cast<double>(linear_num_key_heads * linear_key_head_dim), V = Hv * static_cast<double>(linear_value_head_dim);
  double p = (post_norms ? 4 : 2) * d;
  p += d * (2 * K + 2 * V) + d * 2 * Hv;                          // in_proj_qkvz, in_proj_ba
  p += (2 * K + V) * static_cast<double>(linear_conv_kernel_dim);  // the depthwise convolution (no bias)
  p += 2 * Hv + static_cast<double>(linear_value_head_dim);         // dt_bias and A_log per value head, the gated norm
  p += V * d;                                                       // out_proj
  return p;
}

double ModelSpec::mixer_params(std::int64_t layer) const {
  return is_linear_attention_layer(layer) ? linear_attention_params_per_layer() : attention_params_per_layer();
}

double ModelSpec::dense_mlp_params_per_layer() const {
  return 3.0 * d_model * mlp_dim + (mlp_bias ? 2.0 * mlp_dim + d_model : 0.0);
}
double ModelSpec::expert_params() const {
  return 3.0 * d_model * moe_mlp_dim + (expert_bias ? 2.0 * moe_mlp_dim + d_model : 0.0);
}
double ModelSpec::expert_params_per_layer() const { return expert_params() * static_cast<double>(num_experts); }
double ModelSpec::moe_nonexpert_params_per_layer() const {
  return static_cast<double>(d_model) * num_experts + (router_bias ? num_experts : 0) +
         3.0 * d_model * shared_mlp_dim() + (shared_expert_gate ? d_model : 0);
}

std::vector<WeightMatrix> ModelSpec::layer_matrices(std::int64_t layer) const {
  using Split = WeightMatrix::Split;
  const double d = static_cast<double>(d_model), H = static_cast<double>(num_query_heads);
  std::vector<WeightMatrix> m;
  auto add = [&](double rows, double cols, Split split, double count = 1, bool expert = false) {
    m.push_back({rows, cols, count, expert, split});
  };
  if (is_linear_attention_layer(layer)) {
    // Gated DeltaNet (Megatron's gdn.py): one in_proj for q, k, v, z, beta and alpha; out_proj.
    const double K = static_cast<double>(linear_num_key_heads * linear_key_head_dim);
    const double Hv = static_cast<double>(linear_num_value_heads), V = Hv * static_cast<double>(linear_value_head_dim);
    add(2 * K + 2 * V + 2 * Hv, d, Split::rows);
    add(d, V, Split::cols);
  } else if (is_mla()) {
    // The down projections are TELinear duplicated over tp (multi_latent_attention.py).
    const double qk = static_cast<double>(qk_nope_head_dim + qk_rope_head_dim);
    if (q_lora_rank > 0) {
      add(static_cast<double>(q_lora_rank), d, Split::none);
      add(H * qk, static_cast<double>(q_lora_rank), Split::rows);
    } else {
      add(H * qk, d, Split::rows);
    }
    add(static_cast<double>(kv_lora_rank + qk_rope_head_dim), d, Split::none);
    add(H * static_cast<double>(qk_nope_head_dim + v_head_dim), static_cast<double>(kv_lora_rank), Split::rows);
    add(d, H * static_cast<double>(v_head_dim), Split::cols);
  } else {
    const double hd = static_cast<double>(head_dim), kv = static_cast<double>(num_kv_heads) * hd;
    add(H * hd, d, Split::rows, attention_output_gate ? 2 : 1);  // the queries (and the output gate, a fourth part)
    add(kv, d, Split::rows, 2);                                   // keys and values
    add(d, H * hd, Split::cols);
  }
  auto mlp = [&](double F, double count, bool expert) {
    add(2 * F, d, Split::rows, count, expert);  // fc1: gate and up
    add(d, F, Split::cols, count, expert);      // fc2
  };
  if (is_moe_layer(layer)) {
    add(static_cast<double>(num_experts), d, Split::none);  // the router
    mlp(static_cast<double>(moe_mlp_dim), static_cast<double>(num_experts), true);
    if (shared_mlp_dim() > 0) mlp(static_cast<double>(shared_mlp_dim()), 1, false);
    if (shared_expert_gate) add(1, d, Split::none);
  } else {
    mlp(static_cast<double>(mlp_dim), 1, false);
  }
  if (is_mtp_layer(layer)) add(d, 2 * d, Split::rows);  // eh_proj, column-parallel
  return m;
}

double ModelSpec::layer_params(std::int64_t layer) const {
  return mixer_params(layer) + (is_moe_layer(layer) ? expert_params_per_layer() + moe_nonexpert_params_per_layer()
                                                             : dense_mlp_params_per_layer()) +
         (is_mtp_layer(layer) ? mtp_extra_params() : 0.0);
}

double ModelSpec::total_params() const {
  // Embedding and unembedding tables (one when tied) and the final norm; MTP modules share them.
  double p = (tied_embeddings ? 1.0 : 2.0) * vocab_size * d_model + d_model;
  const double linear = static_cast<double>(linear_attention_layer_ids.size());
  p += (static_cast<double>(num_layers) - linear) * attention_params_per_layer() + linear * linear_attention_params_per_layer();
  p += dense_layers() * dense_mlp_params_per_layer();
  p += moe_layers() * (expert_params_per_layer() + moe_nonexpert_params_per_layer());
  for (std::int64_t l = num_layers; l < stack_layers(); ++l) p += layer_params(l);
  return p;
}

// Every parameter except the routed experts a token does not pick.
double ModelSpec::activated_params() const {
  double p = total_params();
  const double moe = static_cast<double>(moe_layers() + (is_moe_layer(num_layers) ? mtp_layers : 0));
  if (num_experts > 0) p -= moe * expert_params() * static_cast<double>(num_experts - experts_per_token);
  return p;
}

ModelSpec::Flops ModelSpec::model_flops(double B, std::int64_t S, std::int64_t grad_accum) const {
  const double BS = B * static_cast<double>(S), E = static_cast<double>(d_model), H = static_cast<double>(num_query_heads);
  const double L = static_cast<double>(num_layers);
  auto ffn = [&](double m) { return 6.0 * BS * m * E; };  // gated SwiGLU: wi_0, wi_1, wo
  double ffn_total = 0, qkv = 0, proj = 0, attn = 0;
  const double dense_ffn = ffn(static_cast<double>(mlp_dim));
  if (num_experts > 0) {
    double gate = 2.0 * BS * E * (static_cast<double>(num_experts) + (shared_expert_gate ? 1 : 0));
    const double moe_ffn = gate + ffn(static_cast<double>(moe_mlp_dim)) * static_cast<double>(experts_per_token) +
                           ffn(static_cast<double>(shared_mlp_dim()));
    ffn_total = dense_ffn * static_cast<double>(dense_layers()) + moe_ffn * static_cast<double>(moe_layers());
    ffn_total += (is_moe_layer(num_layers) ? moe_ffn : dense_ffn) * static_cast<double>(mtp_layers);
  } else {
    ffn_total = dense_ffn * static_cast<double>(stack_layers());
  }
  if (is_mla()) {
    const double qk = static_cast<double>(qk_nope_head_dim + qk_rope_head_dim);
    double q = q_lora_rank > 0 ? 2.0 * BS * (E * q_lora_rank + q_lora_rank * H * qk) : 2.0 * BS * E * H * qk;
    double kv = 2.0 * BS * (E * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank * H * (qk_nope_head_dim + v_head_dim));
    qkv = q + kv;
    attn = 2.0 * BS * S * H * (qk + v_head_dim) / 2;  // causal: half the score matrix
    proj = 2.0 * BS * E * H * v_head_dim;
  } else {
    qkv = 2.0 * BS * E * (H + 2.0 * num_kv_heads) * head_dim;
    attn = 4.0 * B * static_cast<double>(S) * static_cast<double>(S) * H * static_cast<double>(head_dim) / 2;
    proj = 2.0 * BS * E * H * head_dim;
  }
  double embedding = 2.0 * BS * E * vocab_size;  // the unembedding matmul (tied or not); the lookup is free
  // An MTP module adds a layer, its eh_proj (2 E -> E) and another pass through the head.
  const double M = static_cast<double>(mtp_layers), mtp = M * (2.0 * BS * 2 * E * E + embedding);
  // Layers' worth of full causal attention: a windowed or chunked layer counts its fraction (exactly L + M
  // without one).
  double attn_layers = L + M;
  for (std::int64_t l = 0; (sliding_window > 0 || attention_chunk > 0) && l < stack_layers(); ++l)
    attn_layers -= 1.0 - model_attention_fraction(static_cast<double>(S), attention_mask(l));
  // Gated DeltaNet layers (MaxText calculate_gated_delta_net_flops_per_device, after Megatron's count): their
  // projections and convolution as weights, and 8 Dk Dv per token and value head for the recurrence (its four
  // Dk x Dv products: k k^T, v k^T, the state's decay-and-update and its read by q), in place of attention.
  double linear = 0;
  for (std::int64_t l = 0; !linear_attention_layer_ids.empty() && l < stack_layers(); ++l) linear += is_linear_attention_layer(l);
  double gdn_weights = 0, gdn_core = 0;
  if (linear > 0) {
    const double Hv = static_cast<double>(linear_num_value_heads), K = static_cast<double>(linear_num_key_heads * linear_key_head_dim);
    const double V = Hv * static_cast<double>(linear_value_head_dim);
    gdn_weights = 2.0 * BS * E * (2 * K + 2 * V + 2 * Hv) + 2.0 * BS * E * V + 2.0 * BS * static_cast<double>(linear_conv_kernel_dim) * (2 * K + V);
    gdn_core = 8.0 * BS * Hv * static_cast<double>(linear_key_head_dim * linear_value_head_dim);
  }
  Flops f;
  f.weights_flops = (ffn_total + (qkv + proj) * (L + M - linear) + gdn_weights * linear + embedding + mtp) * 3 * grad_accum;
  f.attention_flops = (attn * (attn_layers - linear) + gdn_core * linear) * 3 * grad_accum;
  return f;
}

namespace {
// The optional boolean fields of a model JSON file, under the field's own name.
constexpr std::pair<const char*, bool ModelSpec::*> kFlags[] = {
    {"tied_embeddings", &ModelSpec::tied_embeddings}, {"qkv_bias", &ModelSpec::qkv_bias},
    {"out_bias", &ModelSpec::out_bias},               {"mlp_bias", &ModelSpec::mlp_bias},
    {"qk_norm", &ModelSpec::qk_norm},                 {"router_bias", &ModelSpec::router_bias},
    {"shared_expert_gate", &ModelSpec::shared_expert_gate}, {"expert_bias", &ModelSpec::expert_bias},
    {"attention_sinks", &ModelSpec::attention_sinks}, {"post_norms", &ModelSpec::post_norms},
    {"qk_norm_per_layer", &ModelSpec::qk_norm_per_layer}, {"attention_output_gate", &ModelSpec::attention_output_gate}};
// The Gated DeltaNet shape's fields, under the field's own name (a model file's and HF's keys alike).
constexpr std::pair<const char*, std::int64_t ModelSpec::*> kLinearShape[] = {
    {"linear_num_key_heads", &ModelSpec::linear_num_key_heads}, {"linear_num_value_heads", &ModelSpec::linear_num_value_heads},
    {"linear_key_head_dim", &ModelSpec::linear_key_head_dim},   {"linear_value_head_dim", &ModelSpec::linear_value_head_dim},
    {"linear_conv_kernel_dim", &ModelSpec::linear_conv_kernel_dim}};
}  // namespace

nlohmann::json ModelSpec::to_json() const {
  nlohmann::json j = {{"id", id}, {"name", name}, {"architecture", to_string(architecture)}, {"source", source},
                      {"num_layers", num_layers}, {"d_model", d_model}, {"num_query_heads", num_query_heads},
                      {"mlp_dim", mlp_dim}, {"vocab_size", vocab_size}};
  if (is_mla()) {
    j.update({{"q_lora_rank", q_lora_rank}, {"kv_lora_rank", kv_lora_rank}, {"qk_nope_head_dim", qk_nope_head_dim},
              {"qk_rope_head_dim", qk_rope_head_dim}, {"v_head_dim", v_head_dim}});
  } else {
    j.update({{"num_kv_heads", num_kv_heads}, {"head_dim", head_dim}});
  }
  if (num_experts > 0) {
    j.update({{"first_dense_layers", first_dense_layers}, {"num_experts", num_experts},
              {"experts_per_token", experts_per_token}, {"shared_experts", shared_experts}, {"moe_mlp_dim", moe_mlp_dim}});
    if (shared_expert_mlp_dim > 0) j["shared_expert_mlp_dim"] = shared_expert_mlp_dim;
    if (!dense_layer_ids.empty()) j["dense_layer_ids"] = dense_layer_ids;
    if (routing_groups > 0) j.update({{"routing_groups", routing_groups}, {"groups_per_token", groups_per_token}});
  }
  if (sliding_window > 0) j.update({{"sliding_window", sliding_window}, {"window_layer_ids", window_layer_ids}});
  if (attention_chunk > 0) j.update({{"attention_chunk", attention_chunk}, {"chunk_layer_ids", chunk_layer_ids}});
  if (!linear_attention_layer_ids.empty()) {
    for (auto [key, field] : kLinearShape) j[key] = this->*field;
    j["linear_attention_layer_ids"] = linear_attention_layer_ids;
  }
  // The flags only when set, so that the specs without them read as before.
  for (auto [key, flag] : kFlags)
    if (this->*flag) j[key] = true;
  return j;
}

// The deepest published LLMs have about 60-130 layers. 32767 (the simulator keeps an op's layer in 16 bits,
// sim/engine.hpp) leaves two orders of magnitude for experiments and refuses a typo or an overflowed count
// (10^12) here, before the step graph keeps one entry per layer.
constexpr std::int64_t kMaxLayers = 32767;

static std::int64_t layer_count(const JsonView& v) {
  auto n = v.positive_integer();
  if (n > kMaxLayers) v.fail("implausibly large, max " + std::to_string(kMaxLayers) + " layers");
  return n;
}

static void validate(ModelSpec& m, const JsonView& v, const char* heads_key, const char* kv_key,
                     const char* dense_key, const char* experts_key) {
  if (m.is_mla()) {
    m.num_kv_heads = m.num_query_heads;
    m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  } else if (m.num_query_heads % m.num_kv_heads != 0) {
    v.at(heads_key).fail("must be a multiple of " + std::string(kv_key) + " = " + std::to_string(m.num_kv_heads));
  }
  if (m.num_experts > 0) {
    if (m.first_dense_layers >= m.num_layers) v.at(dense_key).fail("must be below the number of layers");
    if (m.moe_layers() == 0) v.at(dense_key).fail("leaves no MoE layer");
    if (m.experts_per_token > m.num_experts)
      v.at(experts_key).fail("exceeds the number of experts, " + std::to_string(m.num_experts));
  }
}

// The key is there and not null (HF configs write null for "not set").
static bool given(const JsonView& v, const char* key) { return v.has(key) && !v.at(key).raw().is_null(); }

// Group-limited routing from `groups_key` and `per_token_key` (both or neither): groups that split the experts
// evenly, of which a token's experts fit in the ones it picks.
static void read_routing_groups(ModelSpec& m, const JsonView& v, const char* groups_key, const char* per_token_key,
                                const char* experts_key) {
  const bool groups = given(v, groups_key), picks = given(v, per_token_key);
  if (!groups && !picks) return;
  if (!groups || !picks) v.at(groups ? groups_key : per_token_key).fail(std::string("needs ") + (groups ? per_token_key : groups_key) + " too");
  m.routing_groups = v.at(groups_key).positive_integer();
  m.groups_per_token = v.at(per_token_key).positive_integer();
  if (m.num_experts % m.routing_groups != 0)
    v.at(groups_key).fail("must divide the number of experts, " + std::to_string(m.num_experts));
  if (m.groups_per_token > m.routing_groups)
    v.at(per_token_key).fail("exceeds " + std::string(groups_key) + " = " + std::to_string(m.routing_groups));
  const std::int64_t reachable = m.groups_per_token * (m.num_experts / m.routing_groups);
  if (m.experts_per_token > reachable)
    v.at(experts_key).fail("exceeds the " + std::to_string(reachable) + " experts of the " + std::to_string(m.groups_per_token) +
                           " groups a token picks (" + per_token_key + ")");
}

// Layer indices of `list` (an array of integers in [0, num_layers)) as a sorted set; `ascending` refuses an
// entry not above the previous one (a model file lists each once, in order).
static std::vector<std::int64_t> layer_list(const JsonView& list, std::int64_t num_layers, std::int64_t min_layer,
                                            bool ascending) {
  list.expect_array();
  std::vector<std::int64_t> layers;
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto e = list[i];
    auto l = e.integer();
    if (l < min_layer || l >= num_layers)
      e.fail("must be a layer index in [" + std::to_string(min_layer) + ", " + std::to_string(num_layers) + ")");
    if (ascending && !layers.empty() && l <= layers.back()) e.fail("must be above the previous entry");
    layers.push_back(l);
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  return layers;
}

// The Gated DeltaNet shape (kLinearShape) read from `v` once some layer is one: value heads that share the key
// heads evenly (each key head serves linear_num_value_heads / linear_num_key_heads of them, as GQA's do), softmax
// attention's layers kept to GQA (MLA's linear variant, Kimi Linear's KDA, is another mixer), and no linear
// layer that is also windowed or chunked (those are softmax attention's masks). `ids` names the layer list.
static void read_linear_shape(ModelSpec& m, const JsonView& v, const JsonView& ids) {
  for (auto [key, field] : kLinearShape) m.*field = v.at(key).positive_integer();
  if (m.linear_num_value_heads % m.linear_num_key_heads != 0)
    v.at("linear_num_value_heads").fail("must be a multiple of linear_num_key_heads = " + std::to_string(m.linear_num_key_heads));
  if (m.is_mla()) ids.fail("Gated DeltaNet layers are modelled beside GQA attention only, not MLA");
  for (std::int64_t layer : m.linear_attention_layer_ids)
    if (m.attention_mask(layer).kind != AttentionMask::Kind::full)
      ids.fail("names layer " + std::to_string(layer) + ", which is also a windowed or chunked attention layer");
}

ModelSpec load_model(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  std::vector<std::string_view> keys = {
      "id", "name", "architecture", "source", "num_layers", "d_model", "num_query_heads", "num_kv_heads",
      "head_dim", "mlp_dim", "vocab_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
      "qk_rope_head_dim", "v_head_dim", "first_dense_layers", "num_experts", "experts_per_token",
      "shared_experts", "moe_mlp_dim", "shared_expert_mlp_dim", "dense_layer_ids", "routing_groups", "groups_per_token",
      "sliding_window", "window_layer_ids", "attention_chunk", "chunk_layer_ids", "linear_attention_layer_ids"};
  for (auto [key, flag] : kFlags) keys.push_back(key);
  for (auto [key, field] : kLinearShape) keys.push_back(key);
  v.allow_only(keys);
  ModelSpec m;
  m.id = v.at("id").string();
  m.name = v.at("name").string();
  if (auto s = v.find("source")) m.source = s->string();
  auto arch = v.at("architecture");
  if (arch.string() == "llama") m.architecture = Architecture::llama;
  else if (arch.string() == "deepseek_v3") m.architecture = Architecture::deepseek_v3;
  else arch.fail("unknown architecture; expected llama or deepseek_v3");
  m.num_layers = layer_count(v.at("num_layers"));
  m.d_model = v.at("d_model").positive_integer();
  m.num_query_heads = v.at("num_query_heads").positive_integer();
  m.mlp_dim = v.at("mlp_dim").positive_integer();
  m.vocab_size = v.at("vocab_size").positive_integer();
  for (auto [key, flag] : kFlags)
    if (auto f = v.find(key)) m.*flag = f->boolean();
  if (m.is_mla()) {
    for (auto [key, field] : {std::pair{"kv_lora_rank", &m.kv_lora_rank}, {"qk_nope_head_dim", &m.qk_nope_head_dim},
                              {"qk_rope_head_dim", &m.qk_rope_head_dim}, {"v_head_dim", &m.v_head_dim}})
      *field = v.at(key).positive_integer();
    // MLA's projections have their own shapes: these would be silently miscounted.
    for (auto key : {"qkv_bias", "out_bias", "qk_norm", "qk_norm_per_layer", "attention_sinks", "attention_output_gate"})
      if (v.has(key)) v.at(key).fail("applies to llama (GQA) attention only");
    // 0 or absent: the query is projected directly, without a low-rank latent (DeepSeek-V2-Lite).
    if (auto q = v.find("q_lora_rank")) {
      m.q_lora_rank = q->integer();
      if (m.q_lora_rank < 0) q->fail("must be >= 0 (0: no query LoRA)");
    }
  } else {
    m.num_kv_heads = v.at("num_kv_heads").positive_integer();
    m.head_dim = v.at("head_dim").positive_integer();
    if (m.qk_norm_per_layer && !m.qk_norm) v.at("qk_norm_per_layer").fail("needs qk_norm");
  }
  if (v.has("num_experts")) {
    for (auto [key, field] : {std::pair{"num_experts", &m.num_experts}, {"experts_per_token", &m.experts_per_token},
                              {"moe_mlp_dim", &m.moe_mlp_dim}})
      *field = v.at(key).positive_integer();
    m.first_dense_layers = v.at("first_dense_layers").integer();
    if (m.first_dense_layers < 0) v.at("first_dense_layers").fail("must be >= 0");
    m.shared_experts = v.at("shared_experts").integer();
    if (m.shared_experts < 0) v.at("shared_experts").fail("must be >= 0");
    if (auto s = v.find("shared_expert_mlp_dim")) m.shared_expert_mlp_dim = s->positive_integer();
    if (auto l = v.find("dense_layer_ids")) {
      m.dense_layer_ids = layer_list(*l, m.num_layers, std::min(m.first_dense_layers, m.num_layers), true);
      if (m.moe_layers() == 0) l->fail("leaves no MoE layer");
    }
    read_routing_groups(m, v, "routing_groups", "groups_per_token", "experts_per_token");
  } else {
    // Without experts these would be silently meaningless.
    for (auto key : {"shared_expert_mlp_dim", "dense_layer_ids", "router_bias", "shared_expert_gate", "expert_bias",
                     "routing_groups", "groups_per_token"})
      if (v.has(key)) v.at(key).fail("needs num_experts");
  }
  if (m.post_norms && m.num_experts > 0) v.at("post_norms").fail("is modelled for dense MLPs only (Gemma), not with num_experts");
  if (auto w = v.find("sliding_window")) {
    m.sliding_window = w->positive_integer();
    if (auto l = v.find("window_layer_ids")) {
      m.window_layer_ids = layer_list(*l, m.num_layers, 0, true);
      if (m.window_layer_ids.empty()) l->fail("lists no layer (leave sliding_window out for none)");
    } else {
      for (std::int64_t l = 0; l < m.num_layers; ++l) m.window_layer_ids.push_back(l);  // every layer
    }
  } else if (v.has("window_layer_ids")) {
    v.at("window_layer_ids").fail("needs sliding_window");
  }
  if (auto c = v.find("attention_chunk")) {
    m.attention_chunk = c->positive_integer();
    if (auto l = v.find("chunk_layer_ids")) {
      m.chunk_layer_ids = layer_list(*l, m.num_layers, 0, true);
      if (m.chunk_layer_ids.empty()) l->fail("lists no layer (leave attention_chunk out for none)");
      for (std::int64_t layer : m.chunk_layer_ids)
        if (m.attention_window(layer) > 0) l->fail("names layer " + std::to_string(layer) + ", which window_layer_ids has too");
    } else {
      for (std::int64_t l = 0; l < m.num_layers; ++l) m.chunk_layer_ids.push_back(l);  // every layer
      if (m.sliding_window > 0) c->fail("needs chunk_layer_ids with sliding_window (no layer may be both)");
    }
  } else if (v.has("chunk_layer_ids")) {
    v.at("chunk_layer_ids").fail("needs attention_chunk");
  }
  if (auto l = v.find("linear_attention_layer_ids")) {
    m.linear_attention_layer_ids = layer_list(*l, m.num_layers, 0, true);
    if (m.linear_attention_layer_ids.empty()) l->fail("lists no layer (leave it out for none)");
    read_linear_shape(m, v, *l);
  } else {
    for (auto [key, field] : kLinearShape)
      if (v.has(key)) v.at(key).fail("needs linear_attention_layer_ids");
  }
  validate(m, v, "num_query_heads", "num_kv_heads", "first_dense_layers", "experts_per_token");
  return m;
}

namespace {
// How each supported HuggingFace architecture maps onto ModelSpec: which config.json keys its transformers
// implementation reads. Keys an architecture does not read are ignored, as transformers ignores them.
enum class HfMoe {
  none,
  mixtral,   // num_local_experts experts of intermediate_size in every layer, no shared expert (also GPT-OSS)
  qwen,      // num_experts of moe_intermediate_size; decoder_sparse_step and mlp_only_layers pick dense layers
  deepseek,  // n_routed_experts of moe_intermediate_size, n_shared_experts, first_k_dense_replace dense layers,
             // n_group/topk_group routing (also GLM-4 MoE)
  llama4,    // num_local_experts of intermediate_size and a shared one in the moe_layers (by default each
             // interleave_moe_layer_step-th), dense layers of intermediate_size_mlp
};
// Which layers attend within a sliding window, as each transformers config class decides it.
enum class HfWindow {
  none,     // no sliding_window key is read (Llama, DeepSeek-V3)
  every,    // sliding_window applies to every layer (Mistral, Mixtral)
  qwen,     // with use_sliding_window: layer_types, else the layers from max_window_layers (default 28) on
  typed,    // layer_types, by default every layer sliding but each window_period-th (GPT-OSS, Gemma)
};
struct HfArch {
  const char* name;
  bool mla = false;                   // DeepSeek's multi-head latent attention (q/kv LoRA ranks), else GQA
  bool qkv_bias = false;              // q/k/v biases always present
  bool reads_attention_bias = false;  // attention_bias adds q/k/v biases (and the output's, see output_bias)
  bool attention_bias = false;        // its default when absent
  bool output_bias = true;            // attention_bias adds the output projection's bias too (GLM-4 MoE: no)
  bool reads_mlp_bias = false;        // mlp_bias adds the dense MLP's biases
  bool qk_norm = false;               // q_norm/k_norm
  const char* qk_norm_key = nullptr;  // a key that turns q_norm/k_norm on (GLM-4 MoE's use_qk_norm; default off)
  const char* router_bias_key = nullptr;  // a key that gives the router its bias (MiniMax-M2's use_routing_bias)
  bool minimax_attention = false;     // qk_norm_type (per_layer: the norms span all heads) and attn_type_list
  // Gated DeltaNet layers where layer_types says linear_attention (else all but each full_attention_interval-th,
  // default 4) with the linear_* shape keys, and the softmax layers' sigmoid output gate (Qwen3-Next, Qwen3.5).
  bool gated_delta_net = false;
  const char* output_gate_key = nullptr;  // a key that can turn that gate off (Qwen3.5's attn_output_gate; default on)
  // intermediate_size may be absent when every layer is MoE (Qwen3.5's MoE text configs leave it out).
  bool dense_width_optional = false;
  bool reads_moe_layer_freq = false;  // deepseek: moe_layer_freq spaces the MoE layers past the dense ones
  bool head_dim_required = false;     // head_dim has a config default that is not hidden_size / num_attention_heads
  HfMoe moe = HfMoe::none;
  bool shared_expert = false;         // qwen: one gated shared expert of shared_expert_intermediate_size
  bool biased_experts = false;        // a router with a bias, experts with biases on their three projections
  bool attention_sinks = false;       // a learned sink logit per query head
  bool post_norms = false;            // RMSNorms after the attention and the MLP too (Gemma 2 and 3)
  HfWindow window = HfWindow::none;
  std::int64_t default_window = 0;    // the window when sliding_window is absent (0: none)
  std::int64_t window_period = 2;     // typed: layer i is full when (i + 1) % period == 0 (sliding_window_pattern)
  // The config class's defaults for the keys read here that its published configs may leave out (JSON; none
  // when every one is required), and whether the language model is the config's text_config (multimodal).
  const char* defaults = nullptr;
  bool text_config = false;
};
// Gemma's config classes (Gemma2Config, Gemma3TextConfig): the 2B-class model's shape, tied tables.
constexpr const char* kGemma2Defaults =
    R"({"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 4096,
        "tie_word_embeddings": true})";
constexpr const char* kGemma3Defaults =
    R"({"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 4096,
        "tie_word_embeddings": true})";
// Llama4TextConfig's: Scout's shape (16 experts in every layer), chunks of 8,192 tokens on all but every
// fourth layer.
constexpr const char* kLlama4Defaults =
    R"({"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
        "no_rope_layer_interval": 4, "attention_chunk_size": 8192})";
// MiniMaxM2Config's: the q/k norms over all heads at once, a routing bias.
constexpr const char* kMiniMaxM2Defaults = R"({"use_qk_norm": true, "qk_norm_type": "per_layer", "use_routing_bias": true})";
constexpr HfArch kHfArchs[] = {
    {.name = "LlamaForCausalLM", .reads_attention_bias = true, .reads_mlp_bias = true},
    {.name = "MistralForCausalLM", .window = HfWindow::every, .default_window = 4096},  // MixtralConfig's: None
    {.name = "Qwen2ForCausalLM", .qkv_bias = true, .window = HfWindow::qwen, .default_window = 4096},
    {.name = "Qwen3ForCausalLM", .reads_attention_bias = true, .qk_norm = true, .head_dim_required = true,
     .window = HfWindow::qwen, .default_window = 4096},
    {.name = "MixtralForCausalLM", .moe = HfMoe::mixtral, .window = HfWindow::every},
    {.name = "Qwen2MoeForCausalLM", .qkv_bias = true, .moe = HfMoe::qwen, .shared_expert = true,
     .window = HfWindow::qwen, .default_window = 4096},
    {.name = "Qwen3MoeForCausalLM", .reads_attention_bias = true, .qk_norm = true, .head_dim_required = true,
     .moe = HfMoe::qwen, .window = HfWindow::qwen, .default_window = 4096},
    {.name = "DeepseekV3ForCausalLM", .mla = true, .reads_moe_layer_freq = true, .moe = HfMoe::deepseek},
    // GLM-4.5 and 4.6/4.7 (Glm4MoeForCausalLM): GQA with q/k/v biases but none on o_proj, q/k norms when
    // use_qk_norm, DeepSeek-V3's MoE block (its router, shared experts, first_k_dense_replace).
    {.name = "Glm4MoeForCausalLM", .reads_attention_bias = true, .output_bias = false, .qk_norm_key = "use_qk_norm",
     .head_dim_required = true, .moe = HfMoe::deepseek},
    // MiniMax-M2 (and M2.1 to M2.7): every layer softmax attention with q/k norms over all heads at once and
    // num_local_experts experts of intermediate_size, no shared one, a routing bias with use_routing_bias.
    {.name = "MiniMaxM2ForCausalLM", .qk_norm_key = "use_qk_norm", .router_bias_key = "use_routing_bias",
     .minimax_attention = true, .head_dim_required = true, .moe = HfMoe::mixtral, .defaults = kMiniMaxM2Defaults},
    // Qwen3-Next (and Qwen3-Coder-Next): three Gated DeltaNet layers to one gated softmax attention layer with
    // per-head q/k norms, Qwen's MoE block with a gated shared expert in every layer.
    {.name = "Qwen3NextForCausalLM", .reads_attention_bias = true, .qk_norm = true, .gated_delta_net = true,
     .head_dim_required = true, .moe = HfMoe::qwen, .shared_expert = true},
    // Qwen3.5 and 3.6 (the language model of Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration,
    // or the text-only *ForCausalLM): Qwen3-Next's layers, with attn_output_gate; the MoE ones without a dense
    // width when every layer is MoE.
    {.name = "Qwen3_5MoeForConditionalGeneration", .reads_attention_bias = true, .qk_norm = true, .gated_delta_net = true,
     .output_gate_key = "attn_output_gate", .dense_width_optional = true, .head_dim_required = true, .moe = HfMoe::qwen,
     .shared_expert = true, .text_config = true},
    {.name = "Qwen3_5MoeForCausalLM", .reads_attention_bias = true, .qk_norm = true, .gated_delta_net = true,
     .output_gate_key = "attn_output_gate", .dense_width_optional = true, .head_dim_required = true, .moe = HfMoe::qwen,
     .shared_expert = true},
    {.name = "Qwen3_5ForConditionalGeneration", .reads_attention_bias = true, .qk_norm = true, .gated_delta_net = true,
     .output_gate_key = "attn_output_gate", .head_dim_required = true, .text_config = true},
    {.name = "Qwen3_5ForCausalLM", .reads_attention_bias = true, .qk_norm = true, .gated_delta_net = true,
     .output_gate_key = "attn_output_gate", .head_dim_required = true},
    {.name = "GptOssForCausalLM", .reads_attention_bias = true, .attention_bias = true, .head_dim_required = true,
     .moe = HfMoe::mixtral, .biased_experts = true, .attention_sinks = true, .window = HfWindow::typed,
     .default_window = 128},
    {.name = "Gemma2ForCausalLM", .reads_attention_bias = true, .post_norms = true, .window = HfWindow::typed,
     .defaults = kGemma2Defaults},
    {.name = "Gemma3ForCausalLM", .reads_attention_bias = true, .qk_norm = true, .post_norms = true,
     .window = HfWindow::typed, .window_period = 6, .defaults = kGemma3Defaults},
    {.name = "Gemma3ForConditionalGeneration", .reads_attention_bias = true, .qk_norm = true, .post_norms = true,
     .window = HfWindow::typed, .window_period = 6, .defaults = kGemma3Defaults, .text_config = true},
    {.name = "Llama4ForCausalLM", .reads_attention_bias = true, .moe = HfMoe::llama4, .defaults = kLlama4Defaults},
    {.name = "Llama4ForConditionalGeneration", .reads_attention_bias = true, .moe = HfMoe::llama4,
     .defaults = kLlama4Defaults, .text_config = true},
};

bool optional_flag(const JsonView& v, const char* key) { return v.has(key) && v.at(key).boolean(); }

// A per-layer list of an HF config (layer_types, no_rope_layers, attn_type_list): one entry per decoder layer.
void expect_one_per_layer(const JsonView& list, const ModelSpec& m) {
  if (list.size() != static_cast<std::size_t>(m.num_layers))
    list.fail("has " + std::to_string(list.size()) + " entries; expected num_hidden_layers = " + std::to_string(m.num_layers));
}

// The layers an HF layer_types list marks `kind` (one entry per layer); every other entry must be full_attention.
std::vector<std::int64_t> typed_layers(const JsonView& types, const ModelSpec& m, const std::string& kind) {
  types.expect_array();
  expect_one_per_layer(types, m);
  std::vector<std::int64_t> layers;
  for (std::size_t l = 0; l < types.size(); ++l) {
    const std::string t = types[l].string();
    if (t == kind) layers.push_back(static_cast<std::int64_t>(l));
    else if (t != "full_attention") types[l].fail("unknown layer type; expected full_attention or " + kind);
  }
  return layers;
}

// sliding_window as a window in tokens: null is none; otherwise a positive integer.
std::int64_t window_tokens(const JsonView& w) { return w.raw().is_null() ? 0 : w.positive_integer(); }

// The sliding window and the layers that use it (ModelSpec::sliding_window, window_layer_ids).
void read_hf_window(const JsonView& v, const HfArch& arch, ModelSpec& m) {
  // Qwen's config classes leave the window None unless use_sliding_window, whatever layer_types says.
  if (arch.window == HfWindow::none || (arch.window == HfWindow::qwen && !optional_flag(v, "use_sliding_window"))) return;
  const std::int64_t window = v.has("sliding_window") ? window_tokens(v.at("sliding_window")) : arch.default_window;
  if (arch.window == HfWindow::every) {
    for (std::int64_t l = 0; window > 0 && l < m.num_layers; ++l) m.window_layer_ids.push_back(l);
  } else {
    if (v.has("layer_types")) {
      const auto types = v.at("layer_types");
      m.window_layer_ids = typed_layers(types, m, "sliding_attention");
      if (!m.window_layer_ids.empty() && window == 0) types.fail("names sliding_attention layers but sliding_window is null");
    } else if (arch.window == HfWindow::typed) {
      const std::int64_t period = v.has("sliding_window_pattern") ? v.at("sliding_window_pattern").positive_integer() : arch.window_period;
      for (std::int64_t l = 0; l < m.num_layers; ++l)
        if ((l + 1) % period != 0) m.window_layer_ids.push_back(l);
    } else if (window > 0) {
      std::int64_t from = 28;  // the classes' default max_window_layers
      if (v.has("max_window_layers")) {
        from = v.at("max_window_layers").integer();
        if (from < 0) v.at("max_window_layers").fail("must be >= 0");
      }
      for (std::int64_t l = from; l < m.num_layers; ++l) m.window_layer_ids.push_back(l);
    }
  }
  m.sliding_window = m.window_layer_ids.empty() ? 0 : window;
  if (m.sliding_window == 0) m.window_layer_ids.clear();
}

// DeepSeek-V3's MoE block (GLM-4 MoE's too): routed experts of moe_intermediate_size with a routing bias
// (e_score_correction_bias), shared experts of the same width, dense layers before first_k_dense_replace.
void read_deepseek_moe(const JsonView& v, const HfArch& arch, ModelSpec& m) {
  m.num_experts = v.at("n_routed_experts").positive_integer();
  m.experts_per_token = v.at("num_experts_per_tok").positive_integer();
  m.shared_experts = v.at("n_shared_experts").integer();
  if (m.shared_experts < 0) v.at("n_shared_experts").fail("must be >= 0");
  m.moe_mlp_dim = v.at("moe_intermediate_size").positive_integer();
  m.first_dense_layers = v.at("first_k_dense_replace").integer();
  if (m.first_dense_layers < 0) v.at("first_k_dense_replace").fail("must be >= 0");
  m.router_bias = true;  // e_score_correction_bias
  read_routing_groups(m, v, "n_group", "topk_group", "num_experts_per_tok");
  if (!arch.reads_moe_layer_freq) return;
  // Past the first dense layers, layer i is MoE when i % moe_layer_freq == 0.
  const std::int64_t freq = v.has("moe_layer_freq") ? v.at("moe_layer_freq").positive_integer() : 1;
  for (std::int64_t l = m.first_dense_layers; l < m.num_layers; ++l)
    if (l % freq != 0) m.dense_layer_ids.push_back(l);
  if (m.first_dense_layers < m.num_layers && m.moe_layers() == 0) v.at("moe_layer_freq").fail("leaves no MoE layer");
}

// MiniMax: the q/k norms' span (qk_norm_type) and the layers' attention kind (attn_type_list: 1 softmax, 0 the
// linear "lightning" attention of MiniMax-Text-01, which is refused rather than simulated as softmax).
void read_minimax_attention(const JsonView& v, ModelSpec& m) {
  if (m.qk_norm && v.has("qk_norm_type")) {
    const auto type = v.at("qk_norm_type");
    const std::string t = type.string();
    if (t != "per_layer" && t != "per_head") type.fail("expected per_layer or per_head");
    m.qk_norm_per_layer = t == "per_layer";
  }
  if (!v.has("attn_type_list")) return;
  const auto types = v.at("attn_type_list");
  types.expect_array();
  expect_one_per_layer(types, m);
  for (std::size_t l = 0; l < types.size(); ++l) {
    const std::int64_t t = types[l].integer();
    if (t == 0) types[l].fail("is a linear (lightning) attention layer, which hbmsim does not model");
    if (t != 1) types[l].fail("must be 1 (softmax attention)");
  }
}

// Qwen3-Next's and Qwen3.5's Gated DeltaNet layers (ModelSpec::linear_attention_layer_ids) and their shape, and the
// attention layers' output gate (always there in Qwen3NextAttention; Qwen3.5's attn_output_gate, default on).
void read_gated_delta_net(const JsonView& v, const HfArch& arch, ModelSpec& m) {
  m.attention_output_gate = arch.output_gate_key && v.has(arch.output_gate_key) ? v.at(arch.output_gate_key).boolean() : true;
  if (v.has("layer_types")) {
    m.linear_attention_layer_ids = typed_layers(v.at("layer_types"), m, "linear_attention");
  } else {
    const std::int64_t interval = v.has("full_attention_interval") ? v.at("full_attention_interval").positive_integer() : 4;
    for (std::int64_t l = 0; l < m.num_layers; ++l)
      if ((l + 1) % interval != 0) m.linear_attention_layer_ids.push_back(l);
  }
  if (!m.linear_attention_layer_ids.empty()) read_linear_shape(m, v, v.has("layer_types") ? v.at("layer_types") : v);
}

// Llama 4: the experts and the layers they are in, and the chunked layers (ModelSpec::attention_chunk).
void read_llama4(const JsonView& v, ModelSpec& m) {
  m.moe_mlp_dim = m.mlp_dim;  // intermediate_size is the experts' width
  m.mlp_dim = v.at("intermediate_size_mlp").positive_integer();
  m.num_experts = v.at("num_local_experts").positive_integer();
  m.experts_per_token = v.at("num_experts_per_tok").positive_integer();
  m.shared_experts = 1;  // Llama4TextMoe's shared_expert, of intermediate_size
  // transformers: moe_layers, else every interleave_moe_layer_step-th layer from step - 1.
  std::vector<std::int64_t> moe;
  const bool listed = given(v, "moe_layers");
  if (listed) {
    moe = layer_list(v.at("moe_layers"), m.num_layers, 0, false);
  } else {
    const std::int64_t step = v.at("interleave_moe_layer_step").positive_integer();
    for (std::int64_t l = step - 1; l < m.num_layers; l += step) moe.push_back(l);
  }
  for (std::int64_t l = 0; l < m.num_layers; ++l)
    if (!std::binary_search(moe.begin(), moe.end(), l)) m.dense_layer_ids.push_back(l);
  if (moe.empty()) v.at(listed ? "moe_layers" : "interleave_moe_layer_step").fail("leaves no MoE layer");
  // The layers with RoPE attend within their chunk (no_rope_layers: 1 uses RoPE; by default all but each
  // no_rope_layer_interval-th), the NoPE ones over the whole prefix. attention_chunk_size null: no chunks.
  const auto chunk = v.at("attention_chunk_size");
  if (chunk.raw().is_null()) return;
  m.attention_chunk = chunk.positive_integer();
  if (v.has("no_rope_layers") && v.at("no_rope_layers").size() > 0) {
    auto flags = v.at("no_rope_layers");
    expect_one_per_layer(flags, m);
    for (std::size_t l = 0; l < flags.size(); ++l) {
      const std::int64_t f = flags[l].integer();
      if (f != 0 && f != 1) flags[l].fail("must be 0 (NoPE: full attention) or 1 (RoPE: chunked)");
      if (f == 1) m.chunk_layer_ids.push_back(static_cast<std::int64_t>(l));
    }
  } else {
    const std::int64_t interval = v.at("no_rope_layer_interval").positive_integer();
    for (std::int64_t l = 0; l < m.num_layers; ++l)
      if ((l + 1) % interval != 0) m.chunk_layer_ids.push_back(l);
  }
  if (m.chunk_layer_ids.empty()) m.attention_chunk = 0;
}
}  // namespace

ModelSpec load_hf_config(const nlohmann::json& doc, const std::string& origin) {
  JsonView top(doc, origin);
  top.expect_object();
  auto archs = top.at("architectures");
  if (archs.size() == 0) archs.fail("must name one architecture");
  const std::string arch_name = archs[0].string();
  const HfArch* arch = nullptr;
  for (const auto& a : kHfArchs)
    if (arch_name == a.name) arch = &a;
  if (!arch) {
    std::string known;
    for (const auto& a : kHfArchs) known += (known.empty() ? "" : ", ") + std::string(a.name);
    archs[0].fail("unsupported architecture; expected one of " + known);
  }
  // The language model's keys (a multimodal config's text_config: its vision tower is not simulated), over
  // the config class's defaults.
  const JsonView text = arch->text_config ? top.at("text_config") : top;
  text.expect_object();
  nlohmann::json keys = arch->defaults ? nlohmann::json::parse(arch->defaults) : nlohmann::json::object();
  keys.update(text.raw());
  const JsonView v(keys, origin, text.path());
  ModelSpec m;
  m.id = origin;
  m.source = origin + " (HuggingFace config.json)";
  m.name = arch_name;
  m.num_layers = layer_count(v.at("num_hidden_layers"));
  m.d_model = v.at("hidden_size").positive_integer();
  m.num_query_heads = v.at("num_attention_heads").positive_integer();
  const bool dense_width = !arch->dense_width_optional || given(v, "intermediate_size");
  if (dense_width) m.mlp_dim = v.at("intermediate_size").positive_integer();
  m.vocab_size = v.at("vocab_size").positive_integer();
  // The config classes default tie_word_embeddings to false, Gemma's (in `defaults`) to true.
  m.tied_embeddings = optional_flag(v, "tie_word_embeddings");
  const char* dense_key = "first_k_dense_replace";
  if (arch->mla) {
    m.architecture = Architecture::deepseek_v3;
    m.q_lora_rank = v.at("q_lora_rank").raw().is_null() ? 0 : v.at("q_lora_rank").positive_integer();
    m.kv_lora_rank = v.at("kv_lora_rank").positive_integer();
    m.qk_nope_head_dim = v.at("qk_nope_head_dim").positive_integer();
    m.qk_rope_head_dim = v.at("qk_rope_head_dim").positive_integer();
    m.v_head_dim = v.at("v_head_dim").positive_integer();
  } else {
    m.architecture = Architecture::llama;
    m.num_kv_heads = v.has("num_key_value_heads") ? v.at("num_key_value_heads").positive_integer() : m.num_query_heads;
    if (v.has("head_dim")) m.head_dim = v.at("head_dim").positive_integer();
    else if (arch->head_dim_required)
      throw InputError(origin + ": head_dim is missing (required for " + arch_name +
                       ", whose default is not hidden_size / num_attention_heads)");
    else if (m.d_model % m.num_query_heads != 0) v.at("hidden_size").fail("must be divisible by num_attention_heads");
    else m.head_dim = m.d_model / m.num_query_heads;
    m.qkv_bias = arch->qkv_bias;
    if (arch->reads_attention_bias) {
      m.qkv_bias = v.has("attention_bias") ? v.at("attention_bias").boolean() : arch->attention_bias;
      m.out_bias = m.qkv_bias && arch->output_bias;
    }
    m.attention_sinks = arch->attention_sinks;
    m.post_norms = arch->post_norms;
    if (arch->reads_mlp_bias) m.mlp_bias = optional_flag(v, "mlp_bias");
    m.qk_norm = arch->qk_norm_key ? optional_flag(v, arch->qk_norm_key) : arch->qk_norm;
    if (arch->minimax_attention) read_minimax_attention(v, m);
    if (arch->gated_delta_net) read_gated_delta_net(v, *arch, m);
  }
  if (arch->moe == HfMoe::deepseek) read_deepseek_moe(v, *arch, m);
  if (arch->moe == HfMoe::mixtral) {
    m.num_experts = v.at("num_local_experts").positive_integer();
    m.experts_per_token = v.at("num_experts_per_tok").positive_integer();
    m.moe_mlp_dim = m.mlp_dim;  // every layer is MoE: intermediate_size is the experts' width
    m.router_bias = m.expert_bias = arch->biased_experts;
    if (arch->router_bias_key) m.router_bias = optional_flag(v, arch->router_bias_key);
  } else if (arch->moe == HfMoe::qwen) {
    m.num_experts = v.at("num_experts").positive_integer();
    m.experts_per_token = v.at("num_experts_per_tok").positive_integer();
    m.moe_mlp_dim = v.at("moe_intermediate_size").positive_integer();
    if (arch->shared_expert) {
      const auto shared = v.at("shared_expert_intermediate_size");
      m.shared_expert_mlp_dim = shared.integer();
      if (m.shared_expert_mlp_dim < 0) shared.fail("must be >= 0");
      m.shared_experts = m.shared_expert_mlp_dim > 0 ? 1 : 0;
      m.shared_expert_gate = m.shared_experts > 0;
    }
    // transformers: layer i is MoE unless listed in mlp_only_layers or (i + 1) % decoder_sparse_step != 0.
    const std::int64_t step = v.has("decoder_sparse_step") ? v.at("decoder_sparse_step").positive_integer() : 1;
    if (v.has("mlp_only_layers")) m.dense_layer_ids = layer_list(v.at("mlp_only_layers"), m.num_layers, 0, false);
    for (std::int64_t l = 0; l < m.num_layers; ++l)
      if ((l + 1) % step != 0) m.dense_layer_ids.push_back(l);
    std::sort(m.dense_layer_ids.begin(), m.dense_layer_ids.end());
    m.dense_layer_ids.erase(std::unique(m.dense_layer_ids.begin(), m.dense_layer_ids.end()), m.dense_layer_ids.end());
    dense_key = step > 1 ? "decoder_sparse_step" : "mlp_only_layers";
  }
  if (arch->moe == HfMoe::llama4) {
    read_llama4(v, m);
    dense_key = "interleave_moe_layer_step";
  }
  read_hf_window(v, *arch, m);
  if (!dense_width) {  // no dense width: every layer must be MoE, and mlp_dim (then unused) takes the experts'
    if (m.dense_layers() > 0) v.at(dense_key).fail("makes dense layers, but intermediate_size (their width) is missing");
    m.mlp_dim = m.moe_mlp_dim;
  }
  validate(m, v, "num_attention_heads", "num_key_value_heads", dense_key, "num_experts_per_tok");
  return m;
}

std::vector<std::string> builtin_model_ids() {
  std::vector<std::string> ids;
  for (auto& f : builtin_files("models/")) ids.push_back(f.substr(7, f.size() - 7 - 5));
  return ids;
}

std::vector<std::string> shipped_model_names() {
  std::vector<std::string> names = builtin_model_ids();
  for (auto& f : builtin_files("hf/")) names.push_back(f);
  return names;
}

nlohmann::json model_summary(const std::string& name) {
  const ModelSpec m = resolve_model(name);
  nlohmann::json j = m.to_json();
  j["model"] = name;
  j["total_params"] = m.total_params();
  j["activated_params"] = m.activated_params();
  return j;
}

ModelSpec builtin_model(const std::string& id) {
  static std::mutex mu;  // parsed once per process, as systems are
  static std::map<std::string, ModelSpec> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(id); it != cache.end()) return it->second;
  auto name = "models/" + id + ".json";
  auto text = builtin_file(name);
  if (!text) {
    std::string known;
    for (auto& k : builtin_model_ids()) known += (known.empty() ? "" : ", ") + k;
    throw InputError("model = " + quote(id) + " (no such file or built-in model; built-ins: " + known + ")");
  }
  return cache[id] = load_model(parse_json_text(*text, "builtin:" + name), "builtin:" + name);
}

ModelSpec resolve_model(const std::string& name_or_path) {
  std::error_code ec;
  // A data file shipped in the binary ("hf/mixtral-8x7b.config.json") when no such file is on disk.
  if (!std::filesystem::exists(name_or_path, ec) && name_or_path.rfind("hf/", 0) == 0) {
    if (auto text = builtin_file(name_or_path)) {
      auto doc = parse_json_text(*text, "builtin:" + name_or_path);
      return load_hf_config(doc, "builtin:" + name_or_path);
    }
  }
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json") ||
      std::filesystem::exists(name_or_path, ec)) {
    auto doc = parse_json_file(name_or_path);
    if (doc.is_object() && doc.contains("architectures")) return load_hf_config(doc, name_or_path);
    return load_model(doc, name_or_path);
  }
  return builtin_model(name_or_path);
}

}  // namespace hbmsim
