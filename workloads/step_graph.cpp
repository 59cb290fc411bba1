#include "workloads/step_graph.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include <boost/graph/topological_sort.hpp>

#include "hwmodels/json_view.hpp"

namespace hbmsim {

const std::vector<std::string>& checkpoint_names() {
  static const std::vector<std::string> names = {
      "decoder_layer_input", "query_wa_proj", "mla_q", "kv_wa_proj", "mla_kv", "query_proj", "key_proj",
      "value_proj", "qkv_proj", "context", "out_proj", "attention_out", "mlpwi_0", "mlpwi_1", "mlpwo",
      "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo"};
  return names;
}

bool is_checkpoint_name(const std::string& name) {
  const auto& n = checkpoint_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

const std::vector<std::string>& module_tensor_names() {
  static const std::vector<std::string> names = {"attn_norm",     "mlp_norm",       "mlp_act",     "moe_mlp_act",
                                                 "router_logits", "moe_dispatched", "moe_returned"};
  return names;
}

bool is_module_tensor_name(const std::string& name) {
  const auto& n = module_tensor_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

TensorKey split_tensor_key(const std::string& key) {
  const auto at = key.find('@');
  if (at == std::string::npos) return {key, ""};
  return {key.substr(0, at), key.substr(at + 1)};
}

std::string tensor_key_error(const std::string& key) {
  const TensorKey k = split_tensor_key(key);
  if (!is_checkpoint_name(k.name) && !is_module_tensor_name(k.name)) return "unknown checkpoint name";
  if (key.find('@') != std::string::npos && k.kind != "dense" && k.kind != "moe")
    return "unknown layer kind \"" + k.kind + "\" after @; expected dense or moe";
  return "";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::gemm: return "gemm";
    case OpKind::attention: return "attention";
    case OpKind::linear_attention: return "linear_attention";
    case OpKind::memory: return "memory";
    case OpKind::comm: return "comm";
  }
  return "?";
}

const char* to_string(CommKind k) {
  switch (k) {
    case CommKind::none: return "none";
    case CommKind::all_gather: return "all_gather";
    case CommKind::reduce_scatter: return "reduce_scatter";
    case CommKind::all_reduce: return "all_reduce";
    case CommKind::all_to_all: return "all_to_all";
    case CommKind::send_recv: return "send_recv";
  }
  return "?";
}

int LayerTemplate::find_tensor(const std::string& name) const {
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == name) return static_cast<int>(i);
  return -1;
}

double StepGraph::tensor_bytes(const std::string& name, const std::string& kind) const {
  for (auto& t : templates) {
    if (!kind.empty() && t.kind != kind) continue;
    double sum = 0;  // with a batch split, each micro-batch has its own
    for (const auto& tensor : t.tensors)
      if (tensor.name == name) sum += tensor.bytes;
    if (sum > 0) return sum;
  }
  return 0;
}

namespace {

// Builds one template; `add_*` keep op and tensor bookkeeping in one place.
class TemplateBuilder {
 public:
  explicit TemplateBuilder(std::string kind) { t_.kind = std::move(kind); }

  // A tensor of `bytes` in a buffer `padding` times as large.
  int tensor(const std::string& name, double bytes, double padding = 1) {
    t_.tensors.push_back(TensorDef{name, bytes * padding, is_checkpoint_name(name), padding});
    return static_cast<int>(t_.tensors.size()) - 1;
  }
  // What kernels read or write of it.
  double bytes(int tensor) const {
    const TensorDef& t = t_.tensors[static_cast<std::size_t>(tensor)];
    return t.bytes / t.padding;
  }
  // With a batch split, each micro-batch's ops carry a name prefix and read only their share of the layer
  // input (one buffer, sliced).
  void micro_batch(int index, std::int64_t count) {
    prefix_ = count > 1 ? "mb" + std::to_string(index) + "/" : "";
    input_share_ = 1.0 / static_cast<double>(count);
  }
  double traffic(int tensor) const { return tensor == 0 ? bytes(tensor) * input_share_ : bytes(tensor); }

  // A GEMM [rows x k] x [k x n]: backward is dgrad + wgrad, twice the forward work; it reads its input.
  // `load`: the rows this device runs over the rows its tensors hold (the busiest rank of a MoE layer).
  void gemm(const std::string& name, int in, int out, double rows, double k, double n, Dtype dtype, double act_bytes,
            double load = 1) {
    OpDef op;
    op.name = prefix_ + name;
    op.kind = OpKind::gemm;
    op.dtype = dtype;
    op.flops = 2 * rows * load * k * n;
    double weight_bytes = k * n * dtype_bytes(dtype);
    op.bytes = (traffic(in) + rows * n * act_bytes) * load + weight_bytes;
    op.bwd_flops = 2 * op.flops;
    op.bwd_bytes = 2 * op.bytes;
    op.inputs = {in};
    op.outputs = {out};
    op.saved = {in};
    t_.ops.push_back(op);
  }
  // Elementwise/norm kernels: HBM-bound; backward reads the saved tensors and the incoming gradient.
  void memory(const std::string& name, std::vector<int> in, std::vector<int> out, std::vector<int> saved, double load = 1) {
    OpDef op;
    op.name = prefix_ + name;
    op.kind = OpKind::memory;
    op.dtype = Dtype::bf16;
    for (int i : in) op.bytes += traffic(i);
    for (int o : out) op.bytes += bytes(o);
    op.bytes *= load;
    op.bwd_bytes = 2 * op.bytes;
    op.flops = op.bytes;  // a few FLOPs per byte; irrelevant next to the bandwidth term
    op.bwd_flops = 2 * op.flops;
    op.inputs = std::move(in);
    op.outputs = std::move(out);
    op.saved = std::move(saved);
    t_.ops.push_back(op);
  }
  // Flash attention: forward FLOPs as MaxText counts them (causal half); backward recomputes the scores,
  // 5 matmuls against the forward's 2, so 2.5x. `saved`: what its backward reads (inputs and the output).
  void attention(const std::string& name, std::vector<int> in, int out, double flops, std::vector<int> saved) {
    double traffic = 0;
    for (int i : in) traffic += bytes(i);
    traffic += bytes(out);
    mixer(name, OpKind::attention, std::move(in), out, flops, traffic, 2, std::move(saved));
  }
  // A Gated DeltaNet recurrence of `flops` moving `traffic` through HBM (its inputs, output and chunk states). Its
  // backward recomputes the chunk states and then runs about twice the forward's products and traffic (FLA's
  // chunk_gated_delta_rule backward, which Megatron and MaxText's kernels follow): 2.5x, as flash attention's.
  void linear_attention(const std::string& name, std::vector<int> in, int out, double flops, double traffic, std::vector<int> saved) {
    mixer(name, OpKind::linear_attention, std::move(in), out, flops, traffic, 2.5, std::move(saved));
  }
  // A collective: its backward is the mirrored collective (CommDef::backward) and reads no forward value.
  void comm(const std::string& name, std::vector<int> in, int out, const CommDef& c) {
    OpDef op;
    op.name = prefix_ + name;
    op.kind = OpKind::comm;
    op.comm = c;  // its bytes are the CommDef's: OpDef::bytes stays 0
    op.inputs = std::move(in);
    op.outputs = {out};
    t_.ops.push_back(op);
  }
  // The micro-batches' outputs are slices of one layer output: no traffic, one launch.
  void merge(const std::string& name, std::vector<int> parts, int out) {
    OpDef op;
    op.name = name;
    op.kind = OpKind::memory;
    op.inputs = std::move(parts);
    op.outputs = {out};
    t_.ops.push_back(op);
  }
  LayerTemplate finish(int output) {
    t_.output_tensor = output;
    return std::move(t_);
  }
  LayerTemplate& get() { return t_; }

 private:
  // A token mixer's kernel (bf16): backward FLOPs 2.5x the forward's, backward traffic `bwd_traffic` times.
  void mixer(const std::string& name, OpKind kind, std::vector<int> in, int out, double flops, double traffic, double bwd_traffic,
             std::vector<int> saved) {
    OpDef op;
    op.name = prefix_ + name;
    op.kind = kind;
    op.dtype = Dtype::bf16;
    op.flops = flops;
    op.bwd_flops = 2.5 * flops;
    op.bytes = traffic;
    op.bwd_bytes = bwd_traffic * traffic;
    op.inputs = std::move(in);
    op.outputs = {out};
    op.saved = std::move(saved);
    t_.ops.push_back(op);
  }

  LayerTemplate t_;
  std::string prefix_;
  double input_share_ = 1;
};

}  // namespace

namespace {

// How many rows an expert MLP's buffers hold per row routed on average: its tensors kept for the backward
// (`saved`: fc1's input and outputs, the activation) and the rest (`transient`).
struct BufferRows {
  double saved = 1, transient = 1;
};

// The blocks of one layer body over T tokens (the tensor-parallel group's tokens of one micro-batch slice),
// on this device's share of the heads and MLP width. Each block returns the tensor it produces.
class BodyBuilder {
 public:
  // `mask`: what the layer's queries attend to (a sliding window, a chunk, or the whole prefix); `linear`: its
  // token mixer is a Gated DeltaNet instead.
  BodyBuilder(TemplateBuilder& b, const ModelSpec& m, const TrainingSpec& t, const AttentionMask& mask, bool linear)
      : b_(b), m_(m), linear_(linear) {
    const auto& p = t.parallelism;
    a_ = dtype_bytes(t.activation_dtype);
    d_ = static_cast<double>(m.d_model);
    tp_ = static_cast<double>(p.tp);
    cp_ = p.cp;
    sp_ = p.sequence_parallel && p.tp > 1;
    cp_exchange_ = p.cp_exchange;
    ep_ = p.ep;
    fold_ = p.experts_fold_tp && p.tp > 1;
    context_ = p.context_axes();
    expert_axes_ = p.expert_axes();
    dispatcher_ = p.moe_dispatcher;
    heads_ = static_cast<double>(m.num_query_heads) / tp_;
    seq_ = static_cast<double>(t.seq_len);
    window_ = static_cast<double>(mask.tokens);
    windowed_ = mask_cuts(seq_, mask);
    window_fraction_ = executed_attention_fraction(seq_, mask);
    attn_dt_ = t.attention_gemm_dtype;
    mlp_dt_ = t.mlp_gemm_dtype;
    quantized_gather_ = t.fp8_saved_activations;
    load_ = t.moe_load_imbalance;
    capacity_ = t.moe_capacity_factor;
    stash_ = t.moe_paged_stash;
    probs_in_activation_ = t.moe_probs_in_activation;
  }

  // Tokens of the norm/residual activations: sharded over tp with sequence parallelism.
  double sharded(double T) const { return sp_ ? T / tp_ : T; }

  int layer(int input, bool moe, double T) {
    const int res = attention_block(input, T);
    return moe ? moe_block(res, T) : dense_mlp_block(res, T);
  }

  // A multi-token prediction module on hidden state `h` (DeepSeek-V3, Megatron's MultiTokenPredictionLayer):
  // the next tokens' embeddings looked up (vocab-parallel: partial sums that leave over tp), both inputs
  // normed and projected back to d_model (eh_proj, column-parallel on the gathered pair, its output gathered
  // over tp), one decoder layer, then its final norm, the shared head and the loss. The layer's output goes
  // on to the next module; the logits stay for the loss's backward.
  int mtp_module(int h, bool moe, double T, double vocab) {
    const double a = a_, d = d_, Ts = sharded(T);
    int looked_up = b_.tensor("mtp_embedding", T * d * a);
    b_.memory("mtp_embedding_lookup", {}, {looked_up}, {});
    const int e = tp_exit("mtp_embedding", looked_up, Ts * d * a);
    int both = b_.tensor("mtp_norms", 2 * Ts * d * a);
    b_.memory("mtp_norms", {h, e}, {both}, {h, e});
    const int x = tp_enter("mtp_norms", both, 2 * T * d * a);
    int columns = b_.tensor("eh_proj", T * d / tp_ * a);
    b_.gemm("eh_proj", x, columns, T, 2 * d, d / tp_, attn_dt_, a);
    int projected = columns;
    if (tp_ > 1) {
      projected = b_.tensor("eh_proj_gathered", Ts * d * a);  // gathered over tp, this rank's tokens kept
      b_.comm("eh_proj_all_gather", {columns}, projected, tp_comm(CommKind::all_gather, CommKind::reduce_scatter, T * d * a));
    }
    const int out = layer(projected, moe, T);
    int normed = b_.tensor("mtp_final_norm", Ts * d * a);
    b_.memory("mtp_final_norm", {out}, {normed}, {out});
    const int y = tp_enter("mtp_head", normed, T * d * a);
    int logits = b_.tensor("mtp_logits", T * vocab / tp_ * a);
    b_.gemm("mtp_unembed", y, logits, T, d, vocab / tp_, Dtype::bf16, a);
    std::vector<int> ce_in = {logits};
    if (tp_ > 1) {  // the vocab-parallel loss sums its per-token statistics (max, sum of exponentials) over tp
      int local = b_.tensor("mtp_loss_stats", T * 4 * 2);
      b_.memory("mtp_loss_stats", {logits}, {local}, {});
      int stats = b_.tensor("mtp_loss_stats_reduced", T * 4 * 2);
      b_.comm("mtp_loss_all_reduce", {local}, stats, tp_comm(CommKind::all_reduce, CommKind::none, T * 4 * 2));
      ce_in.push_back(stats);
    }
    int loss = b_.tensor("mtp_loss", T * 4);
    b_.memory("mtp_cross_entropy", ce_in, {loss}, {logits});
    return out;
  }

 private:
  CommDef tp_comm(CommKind fwd, CommKind bwd, double bytes) const {
    return CommDef{fwd, bwd, Axis::tp, AxisSet{Axis::tp}, bytes, false, {}};
  }
  // Into a tensor-parallel block: with sequence parallelism the sharded input is all-gathered (its
  // backward reduce-scatters the gradient); without, the input is already whole and the backward
  // all-reduces its gradient (Megatron's f).
  // `gemm`: the dtype of the GEMM the gathered input feeds. Transformer Engine quantizes the norm's output
  // before the sequence-parallel all-gather (LayerNormLinear's quantized norm), so a low-precision GEMM's
  // input is gathered in its format; the gradient's reduce-scatter stays in the activation dtype.
  int tp_enter(const std::string& name, int x, double full_bytes, std::optional<Dtype> gemm = std::nullopt) {
    if (tp_ == 1) return x;
    int out = b_.tensor(name + (sp_ ? "_gathered" : "_tp"), full_bytes);
    CommDef c = sp_ ? tp_comm(CommKind::all_gather, CommKind::reduce_scatter, full_bytes)
                    : tp_comm(CommKind::none, CommKind::all_reduce, full_bytes);
    if (sp_ && gemm && quantized_gather_ && dtype_bytes(*gemm) < a_) {
      c.bytes = full_bytes / a_ * dtype_bytes(*gemm);
      c.backward_bytes = full_bytes;
    }
    b_.comm(name + (sp_ ? "_all_gather" : "_tp_enter"), {x}, out, c);
    return out;
  }
  // Out of one: the partial sums are reduce-scattered (sequence parallelism; the backward all-gathers) or
  // all-reduced (Megatron's g; the backward is an identity).
  int tp_exit(const std::string& name, int x, double sharded_bytes) {
    if (tp_ == 1) return x;
    const double full = b_.bytes(x);
    int out = b_.tensor(name + (sp_ ? "_scattered" : "_reduced"), sp_ ? sharded_bytes : full);
    b_.comm(name + (sp_ ? "_reduce_scatter" : "_all_reduce"), {x}, out,
            sp_ ? tp_comm(CommKind::reduce_scatter, CommKind::all_gather, full)
                : tp_comm(CommKind::all_reduce, CommKind::none, full));
    return out;
  }

  // Causal attention over this device's queries (T tokens, a 1/cp share of each sequence, load-balanced)
  // against the whole sequence: `flops` in all. With cp > 1 the other ranks' keys and values arrive by
  // all-gather, or by a ring of send/recv steps each overlapped with the attention over the chunk in hand.
  int attention_core(int q, int k, int v, double ctx_bytes, double flops) {
    int ctx = b_.tensor("context", ctx_bytes);
    if (cp_ == 1) {
      b_.attention("attention", {q, k, v}, ctx, flops, {q, k, v, ctx});
      return ctx;
    }
    const double kv_bytes = b_.bytes(k) + b_.bytes(v);
    const CommDef base{CommKind::none, CommKind::none, Axis::cp, context_, 0, false, {}};
    // A sliding window under the ring (Transformer Engine's p2p): each of a rank's two chunks (of 2 cp per
    // sequence) fetches only the window's keys and values before it, its halo, when the window fits in the
    // cp - 1 chunks before; a longer one falls back to the all-gather. An attention chunk of c tokens needs
    // at most the c before (its own chunk's start): taken as a window of c, a bound.
    const double chunk_tokens = seq_ / (2.0 * static_cast<double>(cp_));
    if (cp_exchange_ == CpExchange::ring && windowed_ && window_ <= static_cast<double>(cp_ - 1) * chunk_tokens)
      return halo_attention(q, k, v, ctx, kv_bytes, flops, base);
    if (cp_exchange_ == CpExchange::all_gather || windowed_) {
      const double gathered = kv_bytes * static_cast<double>(cp_);
      int kvg = b_.tensor("kv_gathered", gathered);
      CommDef c = base;
      c.forward = CommKind::all_gather;
      c.backward = CommKind::reduce_scatter;
      c.bytes = gathered;
      b_.comm("cp_all_gather_kv", {k, v}, kvg, c);
      b_.attention("attention", {q, kvg}, ctx, flops, {q, kvg, ctx});
      return ctx;
    }
    CommDef step = base;
    step.forward = step.backward = CommKind::send_recv;
    step.bytes = kv_bytes;
    step.async = true;
    std::vector<int> kv = {k, v};
    int partial = -1;
    for (std::int64_t j = 0; j < cp_; ++j) {
      const std::string n = std::to_string(j);
      if (j > 0) {
        int next = b_.tensor("kv_ring_" + n, kv_bytes);
        b_.comm("cp_send_recv_" + n, kv, next, step);
        kv = {next};
      }
      int out = j + 1 == cp_ ? ctx : b_.tensor("attention_partial_" + n, ctx_bytes);
      std::vector<int> in = {q}, saved = {q};
      in.insert(in.end(), kv.begin(), kv.end());
      saved.insert(saved.end(), kv.begin(), kv.end());
      saved.push_back(ctx);
      if (partial >= 0) in.push_back(partial);
      b_.attention("attention_chunk_" + n, std::move(in), out, flops / static_cast<double>(cp_), std::move(saved));
      partial = out;
    }
    return ctx;
  }

  // The halo exchange: the busiest rank receives the window's tokens before each of its two chunks (2 w of
  // the S / cp its own keys and values cover) while it attends over the chunk whose halo it holds already
  // (TE orders the half that needs no message first), then over the other.
  int halo_attention(int q, int k, int v, int ctx, double kv_bytes, double flops, const CommDef& base) {
    CommDef exchange = base;
    exchange.forward = exchange.backward = CommKind::send_recv;
    exchange.bytes = kv_bytes * 2.0 * window_ / (seq_ / static_cast<double>(cp_));
    exchange.async = true;
    int halo = b_.tensor("kv_halo", exchange.bytes);
    b_.comm("cp_halo_exchange", {k, v}, halo, exchange);
    int partial = b_.tensor("attention_partial_0", b_.bytes(ctx));
    b_.attention("attention_chunk_0", {q, k, v}, partial, flops / 2, {q, k, v, ctx});
    b_.attention("attention_chunk_1", {q, k, v, halo, partial}, ctx, flops / 2, {q, k, v, halo, ctx});
    return ctx;
  }

  // A layer's token-mixing block: the input norm (and tp's gather), the mixer (softmax attention, or a Gated
  // DeltaNet for linear_), whose context of ctx_width features per token out_proj maps back to d_model (and tp
  // reduces), then the residual add.
  int attention_block(int dli, double T) {
    const double a = a_, d = d_;
    int norm = b_.tensor("attn_norm", sharded(T) * d * a);
    b_.memory("attn_norm", {dli}, {norm}, {dli});
    int x = tp_enter("attn_norm", norm, T * d * a, attn_dt_);
    const auto [ctx, ctx_width] = linear_ ? gated_delta_net(x, T) : softmax_attention(x, T);
    int o = b_.tensor("out_proj", T * d * a);
    b_.gemm("wo_attn", ctx, o, T, ctx_width, d, attn_dt_, a);
    int r = post_norm("attn", tp_exit("attn_out", o, sharded(T) * d * a), T);
    int res = b_.tensor("attention_out", sharded(T) * d * a);
    b_.memory("residual_attn", {dli, r}, {res}, {});
    return res;
  }

  struct Context {
    int tensor;
    double width;  // features per token
  };

  // Softmax attention (GQA or MLA) over x, the normed input: its context.
  Context softmax_attention(int x, double T) {
    const double a = a_, d = d_, H = heads_;
    int ctx;
    double ctx_width;
    if (m_.is_mla()) {
      const double qlr = static_cast<double>(m_.q_lora_rank), kvlr = static_cast<double>(m_.kv_lora_rank);
      const double dn = static_cast<double>(m_.qk_nope_head_dim), dr = static_cast<double>(m_.qk_rope_head_dim);
      const double dv = static_cast<double>(m_.v_head_dim);
      int q;
      // The low-rank down-projections are not split over tp: every rank runs them on the whole input.
      if (m_.q_lora_rank > 0) {
        int qwa = b_.tensor("query_wa_proj", T * qlr * a);
        b_.gemm("wq_a", x, qwa, T, d, qlr, attn_dt_, a);
        int mq = b_.tensor("mla_q", T * qlr * a);
        b_.memory("q_norm", {qwa}, {mq}, {qwa});
        q = b_.tensor("query_proj", T * H * (dn + dr) * a);
        b_.gemm("wq_b", mq, q, T, qlr, H * (dn + dr), attn_dt_, a);
      } else {
        q = b_.tensor("query_proj", T * H * (dn + dr) * a);
        b_.gemm("wq", x, q, T, d, H * (dn + dr), attn_dt_, a);
      }
      int kvwa = b_.tensor("kv_wa_proj", T * (kvlr + dr) * a);
      b_.gemm("wkv_a", x, kvwa, T, d, kvlr + dr, attn_dt_, a);
      int mkv = b_.tensor("mla_kv", T * kvlr * a);
      b_.memory("kv_norm", {kvwa}, {mkv}, {kvwa});
      int kv = b_.tensor("kv_up", T * H * (dn + dv) * a);
      b_.gemm("wkv_b", mkv, kv, T, kvlr, H * (dn + dv), attn_dt_, a);
      // Keys get the shared rope part broadcast to every head (MaxText key_proj is [B,S,H,dn+dr]).
      int k = b_.tensor("key_proj", T * H * (dn + dr) * a);
      int v = b_.tensor("value_proj", T * H * dv * a);
      b_.memory("split_kv_rope", {kv, kvwa}, {k, v}, {});
      ctx = attention_core(q, k, v, T * H * dv * a, 2.0 * T * seq_ * H * (dn + dr + dv) / 2 * window_fraction_);
      ctx_width = H * dv;
    } else {
      const double hd = static_cast<double>(m_.head_dim);
      // With tp above the KV head count each rank keeps a replica of one KV head.
      const double Hkv = std::max(1.0, static_cast<double>(m_.num_kv_heads) / tp_);
      int q = b_.tensor("query_proj", T * H * hd * a);
      int k = b_.tensor("key_proj", T * Hkv * hd * a);
      int v = b_.tensor("value_proj", T * Hkv * hd * a);
      b_.gemm("wq", x, q, T, d, H * hd, attn_dt_, a);
      b_.gemm("wk", x, k, T, d, Hkv * hd, attn_dt_, a);
      b_.gemm("wv", x, v, T, d, Hkv * hd, attn_dt_, a);
      int gate = -1;  // the output gate's logits: the query projection's second half (Qwen3-Next's q_proj)
      if (m_.attention_output_gate) {
        gate = b_.tensor("attention_gate", T * H * hd * a);
        b_.gemm("wq_gate", x, gate, T, d, H * hd, attn_dt_, a);
      }
      // Qwen3's and OLMo 2's RMSNorm over each query and key head (Megatron q_layernorm / k_layernorm, MaxText
      // query_norm / key_norm) after the projections: its backward reads the projections.
      if (m_.qk_norm) {
        int qn = b_.tensor("query_norm", T * H * hd * a);
        int kn = b_.tensor("key_norm", T * Hkv * hd * a);
        b_.memory("qk_norm", {q, k}, {qn, kn}, {q, k});
        q = qn;
        k = kn;
      }
      ctx = attention_core(q, k, v, T * H * hd * a, 4.0 * T * seq_ * H * hd / 2 * window_fraction_);
      ctx_width = H * hd;
      if (gate >= 0) {  // context x sigmoid(gate): its backward reads both
        int gated = b_.tensor("gated_context", T * H * hd * a);
        b_.memory("output_gate", {ctx, gate}, {gated}, {ctx, gate});
        ctx = gated;
      }
    }
    return {ctx, ctx_width};
  }

  // A Gated DeltaNet mixer (Qwen3-Next's Qwen3NextGatedDeltaNet, Megatron's GatedDeltaNet) over x, this rank's
  // share of the heads: the projections to queries and keys (key heads), values and the output gate z (value
  // heads), and the decay and write strength per value head; the depthwise causal convolution (with SiLU) over
  // queries, keys and values; the chunked recurrence; the norm gated by z: its context.
  Context gated_delta_net(int x, double T) {
    const double a = a_, d = d_;
    const double Hv = static_cast<double>(m_.linear_num_value_heads) / tp_;
    const double Dk = static_cast<double>(m_.linear_key_head_dim), Dv = static_cast<double>(m_.linear_value_head_dim);
    const double K = static_cast<double>(m_.linear_num_key_heads) / tp_ * Dk, V = Hv * Dv;
    int qkv = b_.tensor("qkv_proj", T * (2 * K + V) * a);
    b_.gemm("in_proj_qkv", x, qkv, T, d, 2 * K + V, attn_dt_, a);
    int z = b_.tensor("linear_gate", T * V * a);
    b_.gemm("in_proj_z", x, z, T, d, V, attn_dt_, a);
    int ba = b_.tensor("linear_decay", T * 2 * Hv * a);
    b_.gemm("in_proj_ba", x, ba, T, d, 2 * Hv, attn_dt_, a);
    // Over cp, Megatron trades this rank's share of the sequence for a 1/cp share of the heads over the whole
    // sequence before the convolution (tensor_a2a_cp2hp), and back before out_proj: the same elements per rank.
    qkv = heads_over_sequence("qkv_heads", qkv);
    z = heads_over_sequence("linear_gate_heads", z);
    ba = heads_over_sequence("linear_decay_heads", ba);
    int conv = b_.tensor("linear_conv", T * (2 * K + V) * a);
    b_.memory("linear_conv", {qkv}, {conv}, {qkv});
    // The kernel reads queries and keys repeated to the value heads, the values and both gates, and writes the
    // output; its forward writes each chunk's state (Dk x Dv per value head) and reads it back for the output.
    const double tokens = T * Hv;
    const double bytes = tokens * (2 * Dk + 2 * Dv + 2) * a + 2 * (T / kGdnChunkTokens) * Hv * Dk * Dv * a;
    int o = b_.tensor("context", T * V * a);
    b_.linear_attention("gated_delta_rule", {conv, ba}, o, 8.0 * tokens * Dk * Dv, bytes, {conv, ba, o});
    int gated = b_.tensor("linear_gated_norm", T * V * a);
    b_.memory("gated_norm", {o, z}, {gated}, {o, z});
    return {heads_over_sequence("linear_sequence_shard", gated), V};
  }

  // With cp > 1 an all-to-all over the context axis (its backward another): the rank's tensor re-split the other
  // way, sequence shards for head shards or back (Megatron's tensor_a2a_cp2hp / hp2cp); as it is without cp.
  int heads_over_sequence(const std::string& name, int x) {
    if (cp_ == 1) return x;
    int out = b_.tensor(name, b_.bytes(x));
    b_.comm(name + "_all_to_all", {x}, out, CommDef{CommKind::all_to_all, CommKind::all_to_all, Axis::cp, context_, b_.bytes(x), false, {}});
    return out;
  }

  // A gated MLP of width F (this rank's share) over `rows` rows, run `load` times over; returns its output.
  int mlp(const std::string& prefix, int in, double rows, double F, double load = 1, BufferRows buffers = {}) {
    int w0 = b_.tensor(prefix + "mlpwi_0", rows * F * a_, buffers.saved);
    int w1 = b_.tensor(prefix + "mlpwi_1", rows * F * a_, buffers.saved);
    b_.gemm(prefix + "wi_0", in, w0, rows, d_, F, mlp_dt_, a_, load);
    b_.gemm(prefix + "wi_1", in, w1, rows, d_, F, mlp_dt_, a_, load);
    int act = b_.tensor(prefix + "mlp_act", rows * F * a_, buffers.saved);
    b_.memory(prefix + "swiglu", {w0, w1}, {act}, {w0, w1}, load);
    int out = b_.tensor(prefix + "mlpwo", rows * d_ * a_, buffers.transient);
    b_.gemm(prefix + "wo", act, out, rows, F, d_, mlp_dt_, a_, load);
    return out;
  }

  int mlp_norm(int res, double T) {
    int mnorm = b_.tensor("mlp_norm", sharded(T) * d_ * a_);
    b_.memory("mlp_norm", {res}, {mnorm}, {res});
    return mnorm;
  }

  // Gemma's RMSNorm of a block's output before the residual add (ModelSpec::post_norms); its backward reads
  // its input. Without it, the output itself.
  int post_norm(const std::string& block, int x, double T) {
    if (!m_.post_norms) return x;
    int n = b_.tensor(block + "_post_norm", sharded(T) * d_ * a_);
    b_.memory(block + "_post_norm", {x}, {n}, {x});
    return n;
  }

  int dense_mlp_block(int res, double T) {
    int mnorm = mlp_norm(res, T);
    int x = tp_enter("mlp_norm", mnorm, T * d_ * a_, mlp_dt_);
    int wo = mlp("", x, T, static_cast<double>(m_.mlp_dim) / tp_);
    int r = post_norm("mlp", tp_exit("mlp_out", wo, sharded(T) * d_ * a_), T);
    int out = b_.tensor("layer_output", sharded(T) * d_ * a_);
    b_.memory("residual_mlp", {res, r}, {out}, {});
    return out;
  }

  // Routed experts as Megatron-Core runs them under tp: each rank routes its sequence shard, the tokens
  // travel to their experts' ranks (all-to-all over ep), are all-gathered over tp (each tp rank holds a
  // slice of every local expert's width), and return the same way. Folded (expert tensor parallelism 1):
  // the experts are whole and the all-to-all spans ep x tp, so each rank computes its own shard's tokens.
  int moe_block(int res, double T) {
    const double a = a_, d = d_;
    const double X = static_cast<double>(m_.num_experts), k = static_cast<double>(m_.experts_per_token);
    const double Fm = static_cast<double>(m_.moe_mlp_dim) / (fold_ ? 1 : tp_);
    const double Ts = sharded(T);
    const bool tp_gather = tp_ > 1 && !fold_;
    // The busiest rank of the expert group receives `load` times the mean tokens and sends as many back. Its
    // buffers hold the mean (the busiest rank changes from layer to layer), or with Megatron's sync-free experts
    // the capacity, and what the paged stash keeps of the saved ones (TrainingSpec).
    const double load = load_;
    const BufferRows buffers = expert_buffers();
    int mnorm = mlp_norm(res, T);
    int logits = b_.tensor("router_logits", Ts * X * 4);
    b_.gemm("router", mnorm, logits, Ts, d, X, Dtype::bf16, 4);
    int disp = b_.tensor("moe_permuted", Ts * k * d * a);
    b_.memory("route_permute", {logits, mnorm}, {disp}, {logits});
    CommDef a2a{CommKind::all_to_all, CommKind::all_to_all, Axis::ep, expert_axes_, Ts * k * d * a * load, false, {}};
    if (dispatcher_ == MoeDispatcher::flex)
      a2a.routing = {X, k, static_cast<double>(m_.routing_groups), static_cast<double>(m_.groups_per_token)};
    const bool exchange = ep_ > 1 || fold_;
    int moe_in = disp;
    if (exchange) {
      // fc1's input unless the experts' tp all-gather makes another.
      moe_in = b_.tensor("moe_dispatched", Ts * k * d * a, tp_gather ? buffers.transient : buffers.saved);
      b_.comm("dispatch_a2a", {disp}, moe_in, a2a);
    }
    if (tp_gather) {
      int g = b_.tensor("moe_dispatched_gathered", T * k * d * a, buffers.saved);
      b_.comm("moe_all_gather", {moe_in}, g, tp_comm(CommKind::all_gather, CommKind::reduce_scatter, T * k * d * a * load));
      moe_in = g;
    }
    int back = mlp("moe_", moe_in, (tp_gather ? T : Ts) * k, Fm, load, buffers);
    if (tp_gather) {
      int s = b_.tensor("moe_returned_scattered", Ts * k * d * a, buffers.transient);
      b_.comm("moe_reduce_scatter", {back}, s, tp_comm(CommKind::reduce_scatter, CommKind::all_gather, T * k * d * a * load));
      back = s;
    }
    if (exchange) {
      int ret = b_.tensor("moe_returned", Ts * k * d * a, buffers.transient);
      b_.comm("combine_a2a", {back}, ret, a2a);
      back = ret;
    }
    int moe_out = b_.tensor("moe_out", Ts * d * a);
    const std::vector<int> combine_saved = probs_in_activation_ ? std::vector<int>{logits} : std::vector<int>{back, logits};
    b_.memory("unpermute_combine", {back, logits}, {moe_out}, combine_saved);
    std::vector<int> ins = {res, moe_out};
    if (m_.shared_experts > 0) {
      int x = tp_enter("mlp_norm", mnorm, T * d * a);
      // Qwen2-MoE's shared-expert gate (d_model -> 1 per token) is left out: a GEMV of negligible time.
      int shared = mlp("", x, T, static_cast<double>(m_.shared_mlp_dim()) / tp_);
      ins.push_back(tp_exit("shared_out", shared, Ts * d * a));
    }
    int out = b_.tensor("layer_output", Ts * d * a);
    b_.memory("residual_mlp", ins, {out}, {});
    return out;
  }

  BufferRows expert_buffers() const {
    const double transient = capacity_ > 0 ? capacity_ : 1;
    return {stash_ > 0 ? stash_ : transient, transient};
  }

  // FLA's chunked Gated DeltaNet kernels (which Megatron calls; MaxText's gdn_chunk_size defaults to the same)
  // carry the state from one chunk of 64 tokens to the next.
  static constexpr double kGdnChunkTokens = 64;

  TemplateBuilder& b_;
  const ModelSpec& m_;
  bool linear_ = false;  // a Gated DeltaNet layer
  double a_ = 2, d_ = 0, tp_ = 1, heads_ = 0, seq_ = 0;
  double window_ = 0;           // the layer's attention window or chunk in tokens (0: none)
  bool windowed_ = false;       // it cuts the sequence (mask_cuts)
  double window_fraction_ = 1;  // the attention's work with the layer's mask over without (executed_attention_fraction)
  std::int64_t cp_ = 1, ep_ = 1;
  bool sp_ = false, fold_ = false;
  double load_ = 1;  // TrainingSpec::moe_load_imbalance
  double capacity_ = 0, stash_ = 0;  // TrainingSpec::moe_capacity_factor, moe_paged_stash
  bool probs_in_activation_ = false;  // TrainingSpec::moe_probs_in_activation
  bool quantized_gather_ = false;  // TE gathers a low-precision GEMM's input quantized (fp8_saved_activations)
  CpExchange cp_exchange_ = CpExchange::all_gather;
  MoeDispatcher dispatcher_ = MoeDispatcher::alltoall;
  AxisSet context_, expert_axes_;
  Dtype attn_dt_ = Dtype::bf16, mlp_dt_ = Dtype::bf16;
};

// The GPUs one routed expert's weights are divided over: split over tp (expert tensor parallelism = tp) and
// partitioned over ep, or whole and partitioned over the folded expert group.
double expert_split(const Parallelism& p) {
  return static_cast<double>(p.experts_fold_tp ? p.expert_group() : p.tp * p.ep);
}

// Muon's share of one layer's matrices on a device of `st` (StepGraph::Stage::muon_matrices): a device
// orthogonalizes only its local experts; a matrix split over tp whole on every tp rank, its fp32 momentum gathered
// first (muon_tp_mode duplicated), or its own shard (blockwise); and the layer-wise distributed optimizer shares the
// matrices out over the ranks that sum their gradients. `local` and `local_experts` gain the parameters the device
// stores of them.
void add_muon_matrices(const std::vector<WeightMatrix>& matrices, const StepGraph& g, StepGraph::Stage& st, double& local,
                       double& local_experts) {
  const Parallelism& p = g.training.parallelism;
  const double tp = static_cast<double>(p.tp);
  for (const WeightMatrix& m : matrices) {
    const double split = m.expert ? expert_split(p) : tp;  // the devices one such matrix is divided over (as stored)
    const double params = m.rows * m.cols * m.count / split;
    local += params;
    if (m.expert) local_experts += params;
    const bool tp_split = p.tp > 1 && m.tp_split != WeightMatrix::Split::none && !(m.expert && p.experts_fold_tp);
    const double partition = m.expert ? split / (tp_split ? tp : 1) : 1;  // the devices the experts are spread over
    const double owners = !p.sharded_optimizer ? 1 : static_cast<double>(g.mesh.size(m.expert ? g.expert_grad_sync : g.grad_sync));
    const double count = m.count / partition / owners;
    const bool gathered = tp_split && !g.training.muon_blockwise;  // else each tp rank iterates on its own block
    WeightMatrix mine{m.rows, m.cols, count, m.expert, m.tp_split};
    if (gathered) st.muon_gather_bytes += count * m.rows * m.cols * 4;
    else if (tp_split) (m.tp_split == WeightMatrix::Split::rows ? mine.rows : mine.cols) /= tp;
    // What one matrix's iterations hold at once (emerging_optimizers' newton_schulz): X, its Gram matrix A, B and
    // the next X in bf16; beside them the gathered shards and their fp32 concatenation when gathered, else the
    // larger of the fp32 normalized copy with its bf16 cast and the iterations' set.
    const double ab = mine.rows * mine.cols, aa = std::min(mine.rows, mine.cols) * std::min(mine.rows, mine.cols);
    const double iterations = 2 * (2 * ab + 2 * aa);
    st.muon_working_bytes = std::max(st.muon_working_bytes, gathered ? 8 * ab + iterations : std::max(6 * ab, iterations));
    auto same = [&](const WeightMatrix& o) { return o.rows == mine.rows && o.cols == mine.cols && o.expert == mine.expert; };
    auto it = std::find_if(st.muon_matrices.begin(), st.muon_matrices.end(), same);
    if (it == st.muon_matrices.end()) st.muon_matrices.push_back(mine);
    else it->count += count;
  }
}

LayerTemplate build_template(const ModelSpec& model, const TrainingSpec& training, bool moe, bool mtp, const AttentionMask& mask,
                             bool linear) {
  TemplateBuilder b(mtp ? "mtp" : moe ? "moe" : "dense");
  BodyBuilder body(b, model, training, mask, linear);
  const double T = training.layer_tokens();
  const double a = dtype_bytes(training.activation_dtype), d = static_cast<double>(model.d_model);
  int dli = b.tensor("decoder_layer_input", body.sharded(T) * d * a);
  const std::int64_t split = moe && !mtp ? training.moe_batch_split : 1;
  int out;
  if (mtp) {
    out = body.mtp_module(dli, moe, T, static_cast<double>(model.vocab_size));
  } else if (split == 1) {
    out = body.layer(dli, moe, T);
  } else {
    const double n = static_cast<double>(split);
    std::vector<int> parts;
    for (std::int64_t m = 0; m < split; ++m) {
      b.micro_batch(static_cast<int>(m), split);
      parts.push_back(body.layer(dli, moe, T / n));
    }
    b.micro_batch(0, 1);
    out = b.tensor("layer_output", body.sharded(T) * d * a);
    b.merge("batch_merge", std::move(parts), out);
  }
  auto t = b.finish(out);
  // Weights are gathered in the GEMM dtype (quantized before the gather, as TE does), gradients
  // reduce-scattered in the weight storage dtype.
  const auto& p = training.parallelism;
  const double tp = static_cast<double>(p.tp);
  const double mixer = linear ? model.linear_attention_params_per_layer() : model.attention_params_per_layer();
  double attn_params = (mixer + (mtp ? model.mtp_extra_params() : 0)) / tp;
  double mlp_params = moe ? model.moe_nonexpert_params_per_layer() / tp : model.dense_mlp_params_per_layer() / tp;
  double expert_params = moe ? model.expert_params_per_layer() / expert_split(p) : 0;
  t.gathered_dense_bytes = attn_params * dtype_bytes(training.attention_gemm_dtype) + mlp_params * dtype_bytes(training.mlp_gemm_dtype);
  t.gathered_expert_bytes = expert_params * dtype_bytes(training.mlp_gemm_dtype);
  auto cast = [&](double params, Dtype gemm) { return gemm == training.weight_storage_dtype ? 0.0 : params * dtype_bytes(gemm); };
  t.cast_dense_bytes = cast(attn_params, training.attention_gemm_dtype) + cast(mlp_params, training.mlp_gemm_dtype);
  t.cast_expert_bytes = cast(expert_params, training.mlp_gemm_dtype);
  // Unsharded gradients are reduced in the gradient buffer's precision (fp32 in both frameworks' defaults).
  const double gb = training.gradient_bytes_per_param;
  t.grad_dense_bytes = (attn_params + mlp_params) * gb;
  t.grad_expert_bytes = expert_params * gb;
  return t;
}

}  // namespace

double StepGraph::weight_buffer_bytes(const LayerTemplate& t) const {
  return (mesh.size(dense_shard) > 1 ? t.gathered_dense_bytes : t.cast_dense_bytes) +
         (mesh.size(expert_shard) > 1 ? t.gathered_expert_bytes : t.cast_expert_bytes);
}

double StepGraph::grad_buffer_bytes(const LayerTemplate& t) const {
  const bool whole = mesh.size(dense_shard) == 1 && mesh.size(expert_shard) == 1;
  return whole && training.wgrad_into_grad_buffer ? 0 : t.grad_dense_bytes + t.grad_expert_bytes;
}

double StepGraph::table_grad_buffer_bytes(double bucket) const {
  return mesh.size(dense_shard) == 1 && training.wgrad_into_grad_buffer ? 0 : bucket;
}

double StepGraph::table_buffer_bytes() const {
  const bool cast = training.weight_storage_dtype != Dtype::bf16;  // the tables' GEMMs run in bf16
  return mesh.size(dense_shard) > 1 || cast ? table_gathered_bytes : 0;
}

StepGraph build_step_graph(const ModelSpec& decoder, TrainingSpec training) {
  validate_training(training, decoder);
  StepGraph g;
  g.model = decoder;
  g.model.mtp_layers = training.mtp_layers;
  const ModelSpec& model = g.model;  // the trained stack: the decoder and its MTP modules
  g.training = training;
  const auto& p = training.parallelism;
  g.mesh = p.mesh();
  g.dense_shard = g.expert_shard = AxisSet{Axis::fsdp};
  g.grad_sync = g.expert_grad_sync = AxisSet{Axis::dp};
  const AxisSet cp = p.context_axes(), ep{Axis::ep};
  if (p.cp_shards_weights) {
    g.dense_shard = g.dense_shard | cp;
    g.expert_shard = g.expert_shard | cp;
  } else {
    g.grad_sync = g.grad_sync | cp;
    // Folded over cp, cp ranks hold other experts; folded inside it, the cp axis (cp's outer part) repeats them.
    if (!p.experts_fold_tp || p.experts_inside_cp) g.expert_grad_sync = g.expert_grad_sync | AxisSet{Axis::cp};
  }
  if (p.ep_shards_weights) g.dense_shard = g.dense_shard | ep;
  else g.grad_sync = g.grad_sync | ep;
  g.tokens = training.layer_tokens();
  const bool sp = p.sequence_parallel && p.tp > 1;
  g.sharded_tokens = sp ? g.tokens / static_cast<double>(p.tp) : g.tokens;

  g.templates.push_back(build_template(model, training, false, false, {}, false));
  if (model.num_experts > 0) g.templates.push_back(build_template(model, training, true, false, {}, false));
  // A layer whose window or chunk cuts the sequence, or whose mixer is a Gated DeltaNet, has a template of its
  // own per kind, mask and mixer.
  std::map<std::tuple<int, AttentionMask, bool>, int> variants;
  auto template_of = [&](std::int64_t layer, int plain) {
    const AttentionMask mask = model.attention_mask(layer);
    const bool linear = model.is_linear_attention_layer(layer);
    if (!linear && !mask_cuts(static_cast<double>(training.seq_len), mask)) return plain;
    auto [it, made] = variants.try_emplace({plain, mask, linear}, static_cast<int>(g.templates.size()));
    if (made)
      g.templates.push_back(build_template(model, training, model.is_moe_layer(layer), model.is_mtp_layer(layer), mask, linear));
    return it->second;
  };
  for (std::int64_t i = 0; i < model.num_layers; ++i) g.layer_template.push_back(template_of(i, model.is_moe_layer(i) ? 1 : 0));
  if (model.mtp_layers > 0) {
    g.templates.push_back(build_template(model, training, model.is_moe_layer(model.num_layers), true, {}, false));
    const int mtp = template_of(model.num_layers, static_cast<int>(g.templates.size()) - 1);
    g.layer_template.insert(g.layer_template.end(), static_cast<std::size_t>(model.mtp_layers), mtp);
  }

  g.model_flops = model.model_flops(training.device_batch(), training.seq_len, training.grad_accum);
  const double T = g.tokens;
  const double a = dtype_bytes(training.activation_dtype);
  const double d = static_cast<double>(model.d_model);
  const double tp = static_cast<double>(p.tp);
  const double V = static_cast<double>(model.vocab_size);
  g.table_gathered_bytes = V * d / tp * dtype_bytes(Dtype::bf16);
  const double wb = dtype_bytes(training.weight_storage_dtype), gb = training.gradient_bytes_per_param;
  g.embedding_grad_bytes = V * d / tp * gb;
  g.head_grad_bytes = (V * d / tp + d) * gb;
  g.final_norm_grad_bytes = d * gb;
  // Every weight is split over tp and sharded over its shard axes; the routed experts are also partitioned
  // over ep. What a device stores of each, and of its optimizer state (sharded over the sync axes too).
  const double tp_dense = tp * static_cast<double>(g.mesh.size(g.dense_shard));
  const double tp_expert = expert_split(p) * static_cast<double>(g.mesh.size(g.expert_shard));
  const double dense_sync = static_cast<double>(g.mesh.size(g.grad_sync)), expert_sync = static_cast<double>(g.mesh.size(g.expert_grad_sync));
  const double weight_shards = static_cast<double>(std::max(g.mesh.size(g.dense_shard), g.mesh.size(g.expert_shard)));
  if (training.muon && weight_shards > 1)
    throw InputError("optimizer = \"muon\" (with the weights sharded over " + std::to_string(static_cast<std::int64_t>(weight_shards)) +
                     " GPUs: fsdp, or cp or ep as MaxText reads them; Megatron refuses Muon with Megatron-FSDP, and its Muon "
                     "orthogonalizes whole matrices)");
  g.chunks = pipeline_chunks(model, p);
  g.stages.resize(static_cast<std::size_t>(p.pp));
  std::vector<double> muon_local(g.stages.size(), 0), muon_local_experts(g.stages.size(), 0);
  for (const auto& c : g.chunks)
    if (c.embedding) g.stages[static_cast<std::size_t>(c.stage)].embedding = true;
  for (std::size_t k = 0; k < g.chunks.size(); ++k) {
    const auto& c = g.chunks[k];
    auto& st = g.stages[static_cast<std::size_t>(c.stage)];
    st.chunks.push_back(static_cast<int>(k));
    // The MTP modules' stage keeps its own copy of the input table when it lacks the lookup (Megatron builds
    // the embedding where they run); a tied head reads the stage's input table: only the final norm is its own.
    const bool table_copy = c.head && g.mtp_table_copy(st);
    const bool shares_table = model.tied_embeddings && (st.embedding || table_copy);
    double params = (c.embedding || table_copy ? V * d : 0) + (c.head ? (shares_table ? 0 : V * d) + d : 0), experts = 0;
    for (std::int64_t l = c.first_layer; l < c.end_layer; ++l) {
      params += model.layer_params(l);
      if (model.is_moe_layer(l)) experts += model.expert_params_per_layer();
      if (training.muon) add_muon_matrices(model.layer_matrices(l), g, st, muon_local[static_cast<std::size_t>(c.stage)],
                                           muon_local_experts[static_cast<std::size_t>(c.stage)]);
    }
    st.local_params += (params - experts) / tp_dense + experts / tp_expert;
    st.local_expert_params += experts / tp_expert;
  }
  for (std::size_t s = 0; s < g.stages.size(); ++s) {
    auto& st = g.stages[s];
    st.parameter_bytes = st.local_params * wb;
    // The distributed optimizer's shard: what the device stores, over the axes that sum its gradients.
    auto owned = [&](double all, double experts) {
      return p.sharded_optimizer ? (all - experts) / dense_sync + experts / expert_sync : all;
    };
    const double owned_muon = owned(muon_local[s], muon_local_experts[s]);
    const double owned_adam = owned(st.local_params, st.local_expert_params) - owned_muon;
    const double state_bytes = owned_adam * training.optimizer_bytes_per_param + owned_muon * training.muon_bytes_per_param;
    st.optimizer_bytes = state_bytes;
    st.gradient_bytes = st.local_params * training.gradient_bytes_per_param;
    // The update reads param, gradient and its state and writes param and state (its shard of them).
    st.optimizer_update_bytes = (owned_adam + owned_muon) * (2 * wb + training.gradient_bytes_per_param) + 2 * state_bytes;
  }
  g.logits_bytes = T * V / tp * a;
  g.unembed_flops = 2 * T * d * V / tp;
  if (p.tp > 1) {
    const CommDef tp_base{CommKind::none, CommKind::none, Axis::tp, AxisSet{Axis::tp}, T * d * a, false, {}};
    g.embed_exit = g.head_enter = tp_base;
    g.embed_exit.forward = sp ? CommKind::reduce_scatter : CommKind::all_reduce;
    g.embed_exit.backward = sp ? CommKind::all_gather : CommKind::none;
    g.head_enter.forward = sp ? CommKind::all_gather : CommKind::none;
    g.head_enter.backward = sp ? CommKind::reduce_scatter : CommKind::all_reduce;
    // Vocab-parallel cross-entropy: the max, the sum of exponentials and the target logit per token, fp32.
    g.loss_stats = tp_base;
    g.loss_stats.forward = CommKind::all_reduce;
    g.loss_stats.bytes = 3 * T * 4;
  }
  return g;
}

OpGraph layer_dag(const LayerTemplate& t) {
  OpGraph dag(t.ops.size());
  std::vector<int> producer(t.tensors.size(), -1);
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    dag[i] = static_cast<int>(i);
    for (int in : t.ops[i].inputs)
      if (producer[static_cast<std::size_t>(in)] >= 0)
        boost::add_edge(static_cast<std::size_t>(producer[static_cast<std::size_t>(in)]), i, in, dag);
    for (int out : t.ops[i].outputs) producer[static_cast<std::size_t>(out)] = static_cast<int>(i);
  }
  return dag;
}

std::string layer_dot(const LayerTemplate& t, const std::string& title) {
  auto dag = layer_dag(t);
  std::vector<std::size_t> order;
  boost::topological_sort(dag, std::back_inserter(order));  // throws not_a_dag on a cycle: a builder bug
  std::ostringstream os;
  os << "digraph \"" << title << "\" {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\"];\n";
  os << "  input [label=\"decoder_layer_input\", shape=ellipse];\n";
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const auto& op = t.ops[i];
    os << "  op" << i << " [label=\"" << op.name << "\\n" << to_string(op.kind);
    if (op.kind == OpKind::gemm || op.kind == OpKind::attention || op.kind == OpKind::linear_attention)
      os << " " << op.flops / 1e12 << " TFLOP";
    if (op.kind == OpKind::comm)
      os << " " << to_string(op.comm.forward) << "/" << to_string(op.comm.backward) << " over " << op.comm.group.name();
    os << "\"];\n";
  }
  auto [e, end] = boost::edges(dag);
  for (; e != end; ++e) {
    const auto& tensor = t.tensors[static_cast<std::size_t>(dag[*e])];
    os << "  op" << boost::source(*e, dag) << " -> op" << boost::target(*e, dag) << " [label=\"" << tensor.name << "\\n"
       << tensor.bytes / (1 << 20) << " MiB\"" << (tensor.checkpoint ? ", penwidth=2" : "") << "];\n";
  }
  for (std::size_t i = 0; i < t.ops.size(); ++i)
    for (int in : t.ops[i].inputs)
      if (in == 0) os << "  input -> op" << i << ";\n";
  os << "}\n";
  return os.str();
}

}  // namespace hbmsim
