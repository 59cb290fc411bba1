// Model architecture specs (dense GQA Llama, MLA + MoE DeepSeek-V3) and MaxText's model-FLOPs formula.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hbmsim {

enum class Architecture { llama, deepseek_v3 };
const char* to_string(Architecture a);

struct ModelSpec {
  std::string id, name, source;
  Architecture architecture = Architecture::llama;
  std::int64_t num_layers = 0, d_model = 0, num_query_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::int64_t mlp_dim = 0, vocab_size = 0;
  // MLA (DeepSeek-V3); num_kv_heads == num_query_heads there.
  std::int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // MoE; layers [0, first_dense_layers) use a dense MLP of mlp_dim.
  std::int64_t first_dense_layers = 0, num_experts = 0, experts_per_token = 0, shared_experts = 0, moe_mlp_dim = 0;

  bool is_mla() const { return architecture == Architecture::deepseek_v3; }
  bool is_moe_layer(std::int64_t layer) const { return num_experts > 0 && layer >= first_dense_layers; }
  std::int64_t moe_layers() const { return num_experts > 0 ? num_layers - first_dense_layers : 0; }
  std::int64_t dense_layers() const { return num_layers - moe_layers(); }

  // Parameter counts (embedding and unembedding included, norms included).
  double attention_params_per_layer() const;
  double dense_mlp_params_per_layer() const;
  double expert_params_per_layer() const;       // routed experts only
  double moe_nonexpert_params_per_layer() const;  // router + shared experts
  double layer_params(std::int64_t layer) const;  // one decoder layer's (every expert included)
  double total_params() const;
  double activated_params() const;  // all but the routed experts a token does not pick

  // MaxText calculate_tflops_training_per_device, in FLOPs (not TFLOPs), for one device's step.
  struct Flops {
    double weights_flops = 0;    // learnable-weight matmuls x3
    double attention_flops = 0;  // causal attention x3 (halved)
    double total() const { return weights_flops + attention_flops; }
  };
  // per_device_batch may be a fraction (MaxText allows one when each model replica's sequences are whole).
  Flops model_flops(double per_device_batch, std::int64_t seq_len, std::int64_t grad_accum = 1) const;

  nlohmann::json to_json() const;
};

ModelSpec load_model(const nlohmann::json& doc, const std::string& origin);
// HuggingFace config.json (LlamaForCausalLM, DeepseekV3ForCausalLM).
ModelSpec load_hf_config(const nlohmann::json& doc, const std::string& origin);
std::vector<std::string> builtin_model_ids();
ModelSpec builtin_model(const std::string& id);
// An existing file is read (HF config.json when it has "architectures"); otherwise a built-in id.
ModelSpec resolve_model(const std::string& name_or_path);

}  // namespace hbmsim
