// Model architecture specs (dense GQA Llama and its relatives, MLA + MoE DeepSeek-V3, GQA + MoE Mixtral/Qwen-MoE)
// and MaxText's model-FLOPs formula.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hbmsim {

enum class Architecture { llama, deepseek_v3 };
const char* to_string(Architecture a);

// One weight matrix of a layer as Megatron-Core stores it (rows = output features), `count` alike: what Muon
// orthogonalizes as a whole. `expert`: a routed expert's (partitioned over the expert group). `tp_split`: how
// tensor parallelism divides it: a column-parallel linear its rows, a row-parallel one its columns; none where
// every tp rank holds it whole (the router, MLA's down projections).
struct WeightMatrix {
  enum class Split : std::uint8_t { rows, cols, none };
  double rows = 0, cols = 0, count = 1;
  bool expert = false;
  Split tp_split = Split::none;
};

// What a layer's queries attend to: the whole causal prefix; the last `tokens` of it, their own included (a
// sliding window: Mistral, GPT-OSS, Gemma); or the earlier tokens of their own chunk of `tokens` (chunked
// attention: Llama 4's attention_chunk_size, MaxText's chunk_attn_window_size).
struct AttentionMask {
  enum class Kind : std::uint8_t { full, sliding, chunked };
  Kind kind = Kind::full;
  std::int64_t tokens = 0;
  auto operator<=>(const AttentionMask&) const = default;
};

struct ModelSpec {
  std::string id, name, source;
  Architecture architecture = Architecture::llama;
  std::int64_t num_layers = 0, d_model = 0, num_query_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::int64_t mlp_dim = 0, vocab_size = 0;
  // MLA (DeepSeek-V3); num_kv_heads == num_query_heads there.
  std::int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // The head reuses the input embedding table (HF tie_word_embeddings): the table is stored, trained and
  // synced once, while the unembedding matmul still runs.
  bool tied_embeddings = false;
  // Small per-layer extras that only change parameter counts (their FLOPs and bytes are negligible); the
  // attention ones apply to GQA attention only:
  bool qkv_bias = false;       // biases on the q, k and v projections (Qwen2, Llama/Qwen3 attention_bias)
  bool out_bias = false;       // a bias on the attention output projection (Llama/Qwen3 attention_bias)
  bool mlp_bias = false;       // biases on the dense MLP's gate, up and down projections (Llama mlp_bias)
  bool qk_norm = false;        // per-head RMSNorm scales of queries and keys, head_dim each (Qwen3)
  // The q and k norms span every head's features at once (MiniMax-M2's qk_norm_type per_layer): H h and K h
  // scales rather than h each.
  bool qk_norm_per_layer = false;
  bool router_bias = false;    // one routing bias per expert (DeepSeek-V3's e_score_correction_bias, GPT-OSS's router)
  bool expert_bias = false;    // biases on each routed expert's gate, up and down projections (GPT-OSS)
  bool attention_sinks = false;  // one learned sink logit per query head (GPT-OSS)
  bool post_norms = false;     // RMSNorms on the attention's and the dense MLP's outputs too (Gemma 2 and 3)
  // MoE; layers [0, first_dense_layers) and those in dense_layer_ids use a dense MLP of mlp_dim, the others
  // num_experts routed experts of moe_mlp_dim plus shared_experts always-on experts of shared_expert_mlp_dim.
  std::int64_t first_dense_layers = 0, num_experts = 0, experts_per_token = 0, shared_experts = 0, moe_mlp_dim = 0;
  std::int64_t shared_expert_mlp_dim = 0;    // one shared expert's width; 0: moe_mlp_dim (DeepSeek-V3)
  bool shared_expert_gate = false;           // a d_model -> 1 sigmoid gate scales the shared output (Qwen2-MoE)
  std::vector<std::int64_t> dense_layer_ids;  // sorted, each >= first_dense_layers (Qwen-MoE mlp_only_layers)
  // Group-limited routing (DeepSeek-V3's n_group and topk_group; Megatron's moe_router_num_groups and
  // moe_router_group_topk; MaxText's n_routing_groups and topk_routing_group): the experts in routing_groups
  // equal groups of consecutive experts, and a token's experts chosen from groups_per_token of them. It bounds
  // the GPUs and nodes a token travels to (DeepSeek-V3: 4 of 8 groups). 0: any expert.
  std::int64_t routing_groups = 0, groups_per_token = 0;
  // Multi-token prediction modules trained after the decoder layers (DeepSeek-V3's MTP, Megatron's and MaxText's
  // mtp_num_layers): each is a decoder layer of the last layer's kind with RMSNorms of its two inputs (the
  // previous hidden state and the next token's embedding), their projection back to d_model (eh_proj, 2 d x d)
  // and a final norm, and its loss goes through the shared head. Layers [num_layers, stack_layers()) are
  // they. Set from the run (TrainingSpec::mtp_layers): model files do not carry it.
  std::int64_t mtp_layers = 0;
  // Sliding-window attention (Mistral's sliding_window; Qwen's use_sliding_window from max_window_layers on; HF
  // layer_types): each query of the layers in window_layer_ids attends to the last `sliding_window` tokens,
  // itself included, instead of to every earlier one. Flash attention keeps no score matrix, so only the
  // attention's work changes, not its memory.
  std::int64_t sliding_window = 0;             // tokens; 0: every layer attends over the whole causal prefix
  std::vector<std::int64_t> window_layer_ids;  // sorted decoder layers
  // The window `layer` attends within (0: none); an MTP module's is the last decoder layer's, as its kind is.
  std::int64_t attention_window(std::int64_t layer) const;
  // Chunked attention (Llama 4): the layers in chunk_layer_ids attend within their chunk of attention_chunk
  // tokens (0: none); no layer is both windowed and chunked.
  std::int64_t attention_chunk = 0;
  std::vector<std::int64_t> chunk_layer_ids;  // sorted decoder layers
  AttentionMask attention_mask(std::int64_t layer) const;  // an MTP module's is the last decoder layer's
  // Gated DeltaNet layers (Qwen3-Next and Qwen3.5's linear_attention layer_types; Megatron's
  // experimental_attention_variant gated_delta_net; MaxText's qwen3_next gdn_*): the layers in
  // linear_attention_layer_ids mix tokens through a recurrent state per value head instead of softmax
  // attention. in_proj_qkvz projects to queries and keys (linear_num_key_heads x linear_key_head_dim each),
  // values and an output gate (linear_num_value_heads x linear_value_head_dim each), in_proj_ba to a decay and
  // a write strength per value head; a depthwise causal convolution of linear_conv_kernel_dim taps runs over
  // the queries, keys and values; a gated RMSNorm and out_proj follow. Not with MLA (Kimi Linear's KDA).
  std::int64_t linear_num_key_heads = 0, linear_num_value_heads = 0, linear_key_head_dim = 0, linear_value_head_dim = 0;
  std::int64_t linear_conv_kernel_dim = 0;
  std::vector<std::int64_t> linear_attention_layer_ids;  // sorted decoder layers
  // Whether `layer` is a Gated DeltaNet layer; an MTP module's kind is the last decoder layer's.
  bool is_linear_attention_layer(std::int64_t layer) const;
  // The softmax attention's output is scaled by sigmoid(x W_g), W_g a second half of the query projection
  // (Qwen3-Next's and Qwen3.5's attn_output_gate; Megatron's attention_output_gate): H x head_dim x d_model more.
  bool attention_output_gate = false;

  bool is_mla() const { return architecture == Architecture::deepseek_v3; }
  std::int64_t stack_layers() const { return num_layers + mtp_layers; }  // what a step runs, MTP modules last
  bool is_mtp_layer(std::int64_t layer) const { return layer >= num_layers; }
  bool is_moe_layer(std::int64_t layer) const;  // an MTP module's layer is of the last decoder layer's kind
  std::int64_t moe_layers() const;               // decoder layers only
  std::int64_t dense_layers() const { return num_layers - moe_layers(); }
  std::int64_t shared_mlp_dim() const {  // all shared experts' width together
    return shared_experts * (shared_expert_mlp_dim > 0 ? shared_expert_mlp_dim : moe_mlp_dim);
  }

  // Parameter counts (embedding and unembedding included, once when tied; norms and biases included).
  double attention_params_per_layer() const;       // a softmax attention layer's mixer and norms
  double linear_attention_params_per_layer() const;  // a Gated DeltaNet layer's mixer and norms
  double mixer_params(std::int64_t layer) const;     // whichever of the two `layer` has
  double dense_mlp_params_per_layer() const;
  double expert_params() const;                 // one routed expert's
  double expert_params_per_layer() const;       // routed experts only
  double moe_nonexpert_params_per_layer() const;  // router + shared experts (and their gate)
  double layer_params(std::int64_t layer) const;  // one decoder layer's or MTP module's (every expert included)
  double mtp_extra_params() const { return 2.0 * d_model * d_model + 3.0 * d_model; }  // eh_proj and three norms
  // The 2-D weights of `layer` in Megatron-Core's modules (fc1's gate and up projections fused, the attention's
  // q, k and v split as Megatron's Muon splits them by default); norms, biases, sinks and the convolution are not
  // among them.
  std::vector<WeightMatrix> layer_matrices(std::int64_t layer) const;
  double total_params() const;
  double activated_params() const;  // all but the routed experts a token does not pick

  // MaxText calculate_tflops_training_per_device, in FLOPs (not TFLOPs), for one device's step.
  struct Flops {
    double weights_flops = 0;    // learnable-weight matmuls x3
    double attention_flops = 0;  // causal attention x3 (halved); a Gated DeltaNet layer's recurrence
    double total() const { return weights_flops + attention_flops; }
  };
  // per_device_batch may be a fraction (MaxText allows one when each model replica's sequences are whole).
  Flops model_flops(double per_device_batch, std::int64_t seq_len, std::int64_t grad_accum = 1) const;

  nlohmann::json to_json() const;
};

// A layer's causal attention work with a window of `window` tokens (0: none) over a sequence of `seq`, as a
// fraction of the work without one. Executed: the (query, key) pairs a flash-attention kernel visits,
// seq w - w^2 / 2 against seq^2 / 2 (the continuous count MaxText's causal half uses). Model FLOPs: MaxText's
// calculate_tflops_training_per_device, which counts a windowed layer as seq x min(w, seq), halved like the
// causal one. Both are exactly 1 without a window or with one of seq or more.
double executed_window_fraction(double seq, double window);
double model_window_fraction(double seq, double window);
// The same for any mask. A chunk of c tokens cuts a sequence of seq > c into n = floor(seq / c) chunks and a
// rest r, each attended causally: (n c^2 + r^2) / seq^2 of the full layer's pairs, executed and in MaxText's
// model FLOPs alike (calculate_llama4_attention_tflops).
bool mask_cuts(double seq, const AttentionMask& mask);
double executed_attention_fraction(double seq, const AttentionMask& mask);
double model_attention_fraction(double seq, const AttentionMask& mask);

ModelSpec load_model(const nlohmann::json& doc, const std::string& origin);
// HuggingFace config.json: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2/3 (dense);
// MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM, Glm4MoeForCausalLM,
// GptOssForCausalLM, MiniMaxM2ForCausalLM, Llama 4 (MoE); Qwen3NextForCausalLM (Gated DeltaNet + MoE).
ModelSpec load_hf_config(const nlohmann::json& doc, const std::string& origin);
std::vector<std::string> builtin_model_ids();
// Every model shipped in the binary by the name --model takes: the built-in ids, then the HuggingFace configs
// under data/hf ("hf/gpt-oss-120b.config.json").
std::vector<std::string> shipped_model_names();
// One entry of `hbmsim models` and hbmsim.models(): the spec (ModelSpec::to_json), the name it was resolved
// from ("model") and its total and activated parameters.
nlohmann::json model_summary(const std::string& name);
ModelSpec builtin_model(const std::string& id);
// An existing file is read (HF config.json when it has "architectures"); otherwise a built-in id, or one of the
// HuggingFace configs shipped under data/hf by its data name ("hf/mixtral-8x7b.config.json").
ModelSpec resolve_model(const std::string& name_or_path);

}  // namespace hbmsim
