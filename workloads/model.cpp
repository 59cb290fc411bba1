#include "workloads/model.hpp"

#include <filesystem>
#include <map>
#include <mutex>

#include "hwmodels/builtin.hpp"
#include "hwmodels/json_view.hpp"

namespace hbmsim {

const char* to_string(Architecture a) { return a == Architecture::llama ? "llama" : "deepseek_v3"; }

double ModelSpec::attention_params_per_layer() const {
  const double d = static_cast<double>(d_model), H = static_cast<double>(num_query_heads);
  double p = 2 * d;  // two RMSNorm scales per layer
  if (is_mla()) {
    const double qk = static_cast<double>(qk_nope_head_dim + qk_rope_head_dim);
    if (q_lora_rank > 0) p += d * q_lora_rank + q_lora_rank + static_cast<double>(q_lora_rank) * H * qk;
    else p += d * H * qk;
    p += d * static_cast<double>(kv_lora_rank + qk_rope_head_dim) + kv_lora_rank;
    p += static_cast<double>(kv_lora_rank) * H * static_cast<double>(qk_nope_head_dim + v_head_dim);
    p += H * static_cast<double>(v_head_dim) * d;
  } else {
    p += d * static_cast<double>(head_dim) * (H + 2.0 * num_kv_heads) + H * head_dim * d;
  }
  return p;
}

double ModelSpec::dense_mlp_params_per_layer() const { return 3.0 * d_model * mlp_dim; }
double ModelSpec::expert_params_per_layer() const { return 3.0 * d_model * moe_mlp_dim * num_experts; }
double ModelSpec::moe_nonexpert_params_per_layer() const {
  return static_cast<double>(d_model) * num_experts + num_experts /* router bias */ +
         3.0 * d_model * moe_mlp_dim * shared_experts;
}

double ModelSpec::layer_params(std::int64_t layer) const {
  return attention_params_per_layer() + (is_moe_layer(layer) ? expert_params_per_layer() + moe_nonexpert_params_per_layer()
                                                             : dense_mlp_params_per_layer());
}

double ModelSpec::total_params() const {
  double p = 2.0 * vocab_size * d_model + d_model;  // embedding, unembedding, final norm
  p += num_layers * attention_params_per_layer();
  p += dense_layers() * dense_mlp_params_per_layer();
  p += moe_layers() * (expert_params_per_layer() + moe_nonexpert_params_per_layer());
  return p;
}

// Every parameter except the routed experts a token does not pick.
double ModelSpec::activated_params() const {
  double p = total_params();
  if (num_experts > 0)
    p -= moe_layers() * 3.0 * d_model * moe_mlp_dim * (num_experts - experts_per_token);
  return p;
}

ModelSpec::Flops ModelSpec::model_flops(double B, std::int64_t S, std::int64_t grad_accum) const {
  const double BS = B * static_cast<double>(S), E = static_cast<double>(d_model), H = static_cast<double>(num_query_heads);
  const double L = static_cast<double>(num_layers);
  auto ffn = [&](double m) { return 6.0 * BS * m * E; };  // gated SwiGLU: wi_0, wi_1, wo
  double ffn_total = 0, qkv = 0, proj = 0, attn = 0;
  if (num_experts > 0) {
    double gate = 2.0 * BS * E * num_experts;
    ffn_total = ffn(static_cast<double>(mlp_dim)) * first_dense_layers +
                (gate + ffn(static_cast<double>(moe_mlp_dim)) * (shared_experts + experts_per_token)) * moe_layers();
  } else {
    ffn_total = ffn(static_cast<double>(mlp_dim)) * L;
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
  double embedding = 2.0 * BS * E * vocab_size;  // the unembedding matmul; the lookup is free
  Flops f;
  f.weights_flops = (ffn_total + (qkv + proj) * L + embedding) * 3 * grad_accum;
  f.attention_flops = attn * L * 3 * grad_accum;
  return f;
}

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
  if (num_experts > 0)
    j.update({{"first_dense_layers", first_dense_layers}, {"num_experts", num_experts},
              {"experts_per_token", experts_per_token}, {"shared_experts", shared_experts}, {"moe_mlp_dim", moe_mlp_dim}});
  return j;
}

// The deepest published LLMs have about 60-130 layers. 100000 leaves three orders of magnitude for
// experiments and still refuses a typo or an overflowed count (10^12) here, before the step graph keeps one
// entry per layer and the simulator's event budget (which allows far fewer layers) is ever reached.
constexpr std::int64_t kMaxLayers = 100000;

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
    if (m.experts_per_token > m.num_experts)
      v.at(experts_key).fail("exceeds the number of experts, " + std::to_string(m.num_experts));
  }
}

ModelSpec load_model(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  v.allow_only({"id", "name", "architecture", "source", "num_layers", "d_model", "num_query_heads", "num_kv_heads",
                "head_dim", "mlp_dim", "vocab_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "first_dense_layers", "num_experts", "experts_per_token",
                "shared_experts", "moe_mlp_dim"});
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
  if (m.is_mla()) {
    for (auto [key, field] : {std::pair{"kv_lora_rank", &m.kv_lora_rank}, {"qk_nope_head_dim", &m.qk_nope_head_dim},
                              {"qk_rope_head_dim", &m.qk_rope_head_dim}, {"v_head_dim", &m.v_head_dim}})
      *field = v.at(key).positive_integer();
    // 0 or absent: the query is projected directly, without a low-rank latent (DeepSeek-V2-Lite).
    if (auto q = v.find("q_lora_rank")) {
      m.q_lora_rank = q->integer();
      if (m.q_lora_rank < 0) q->fail("must be >= 0 (0: no query LoRA)");
    }
  } else {
    m.num_kv_heads = v.at("num_kv_heads").positive_integer();
    m.head_dim = v.at("head_dim").positive_integer();
  }
  if (v.has("num_experts")) {
    for (auto [key, field] : {std::pair{"num_experts", &m.num_experts}, {"experts_per_token", &m.experts_per_token},
                              {"moe_mlp_dim", &m.moe_mlp_dim}})
      *field = v.at(key).positive_integer();
    m.first_dense_layers = v.at("first_dense_layers").integer();
    if (m.first_dense_layers < 0) v.at("first_dense_layers").fail("must be >= 0");
    m.shared_experts = v.at("shared_experts").integer();
    if (m.shared_experts < 0) v.at("shared_experts").fail("must be >= 0");
  }
  validate(m, v, "num_query_heads", "num_kv_heads", "first_dense_layers", "experts_per_token");
  return m;
}

ModelSpec load_hf_config(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  v.expect_object();
  auto archs = v.at("architectures");
  if (archs.size() == 0) archs.fail("must name one architecture");
  std::string arch = archs[0].string();
  ModelSpec m;
  m.id = origin;
  m.source = origin + " (HuggingFace config.json)";
  m.name = arch;
  m.num_layers = layer_count(v.at("num_hidden_layers"));
  m.d_model = v.at("hidden_size").positive_integer();
  m.num_query_heads = v.at("num_attention_heads").positive_integer();
  m.mlp_dim = v.at("intermediate_size").positive_integer();
  m.vocab_size = v.at("vocab_size").positive_integer();
  if (arch == "LlamaForCausalLM") {
    m.architecture = Architecture::llama;
    m.num_kv_heads = v.has("num_key_value_heads") ? v.at("num_key_value_heads").positive_integer() : m.num_query_heads;
    if (v.has("head_dim")) m.head_dim = v.at("head_dim").positive_integer();
    else if (m.d_model % m.num_query_heads != 0) v.at("hidden_size").fail("must be divisible by num_attention_heads");
    else m.head_dim = m.d_model / m.num_query_heads;
  } else if (arch == "DeepseekV3ForCausalLM") {
    m.architecture = Architecture::deepseek_v3;
    m.q_lora_rank = v.at("q_lora_rank").raw().is_null() ? 0 : v.at("q_lora_rank").positive_integer();
    m.kv_lora_rank = v.at("kv_lora_rank").positive_integer();
    m.qk_nope_head_dim = v.at("qk_nope_head_dim").positive_integer();
    m.qk_rope_head_dim = v.at("qk_rope_head_dim").positive_integer();
    m.v_head_dim = v.at("v_head_dim").positive_integer();
    m.num_experts = v.at("n_routed_experts").positive_integer();
    m.experts_per_token = v.at("num_experts_per_tok").positive_integer();
    m.shared_experts = v.at("n_shared_experts").integer();
    if (m.shared_experts < 0) v.at("n_shared_experts").fail("must be >= 0");
    m.moe_mlp_dim = v.at("moe_intermediate_size").positive_integer();
    m.first_dense_layers = v.at("first_k_dense_replace").integer();
    if (m.first_dense_layers < 0) v.at("first_k_dense_replace").fail("must be >= 0");
  } else {
    archs[0].fail("unsupported architecture; expected LlamaForCausalLM or DeepseekV3ForCausalLM");
  }
  validate(m, v, "num_attention_heads", "num_key_value_heads", "first_k_dense_replace", "num_experts_per_tok");
  return m;
}

std::vector<std::string> builtin_model_ids() {
  std::vector<std::string> ids;
  for (auto& f : builtin_files("models/")) ids.push_back(f.substr(7, f.size() - 7 - 5));
  return ids;
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
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json") ||
      std::filesystem::exists(name_or_path, ec)) {
    auto doc = parse_json_file(name_or_path);
    if (doc.is_object() && doc.contains("architectures")) return load_hf_config(doc, name_or_path);
    return load_model(doc, name_or_path);
  }
  return builtin_model(name_or_path);
}

}  // namespace hbmsim
