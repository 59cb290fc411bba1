#include "workloads/step_graph.hpp"

#include <algorithm>
#include <sstream>

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

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::gemm: return "gemm";
    case OpKind::attention: return "attention";
    case OpKind::memory: return "memory";
    case OpKind::all_to_all: return "all_to_all";
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

  int tensor(const std::string& name, double bytes) {
    t_.tensors.push_back(TensorDef{name, bytes, is_checkpoint_name(name)});
    return static_cast<int>(t_.tensors.size()) - 1;
  }
  double bytes(int tensor) const { return t_.tensors[static_cast<std::size_t>(tensor)].bytes; }
  // With a batch split, each micro-batch's ops carry a name prefix and read only their share of the layer
  // input (one buffer, sliced).
  void micro_batch(int index, std::int64_t count) {
    prefix_ = count > 1 ? "mb" + std::to_string(index) + "/" : "";
    input_share_ = 1.0 / static_cast<double>(count);
  }
  double traffic(int tensor) const { return tensor == 0 ? bytes(tensor) * input_share_ : bytes(tensor); }

  // A GEMM [rows x k] x [k x n]: backward is dgrad + wgrad, twice the forward work; it reads its input.
  void gemm(const std::string& name, int in, int out, double rows, double k, double n, Dtype dtype, double act_bytes) {
    OpDef op;
    op.name = prefix_ + name;
    op.kind = OpKind::gemm;
    op.dtype = dtype;
    op.flops = 2 * rows * k * n;
    double weight_bytes = k * n * dtype_bytes(dtype);
    op.bytes = traffic(in) + weight_bytes + rows * n * act_bytes;
    op.bwd_flops = 2 * op.flops;
    op.bwd_bytes = 2 * op.bytes;
    op.inputs = {in};
    op.outputs = {out};
    op.saved = {in};
    t_.ops.push_back(op);
  }
  // Elementwise/norm kernels: HBM-bound; backward reads the saved tensors and the incoming gradient.
  void memory(const std::string& name, std::vector<int> in, std::vector<int> out, std::vector<int> saved) {
    OpDef op;
    op.name = prefix_ + name;
    op.kind = OpKind::memory;
    op.dtype = Dtype::bf16;
    for (int i : in) op.bytes += traffic(i);
    for (int o : out) op.bytes += bytes(o);
    op.bwd_bytes = 2 * op.bytes;
    op.flops = op.bytes;  // a few FLOPs per byte; irrelevant next to the bandwidth term
    op.bwd_flops = 2 * op.flops;
    op.inputs = std::move(in);
    op.outputs = std::move(out);
    op.saved = std::move(saved);
    t_.ops.push_back(op);
  }
  // Flash attention: forward FLOPs as MaxText counts them (causal half); backward recomputes the scores,
  // 5 matmuls against the forward's 2, so 2.5x.
  void attention(int q, int k, int v, int out, double flops) {
    OpDef op;
    op.name = prefix_ + "attention";
    op.kind = OpKind::attention;
    op.dtype = Dtype::bf16;
    op.flops = flops;
    op.bwd_flops = 2.5 * flops;
    op.bytes = bytes(q) + bytes(k) + bytes(v) + bytes(out);
    op.bwd_bytes = 2 * op.bytes;
    op.inputs = {q, k, v};
    op.outputs = {out};
    op.saved = {q, k, v, out};
    t_.ops.push_back(op);
  }
  void all_to_all(const std::string& name, int in, int out) {
    OpDef op;
    op.name = prefix_ + name;
    op.kind = OpKind::all_to_all;
    op.dtype = Dtype::bf16;
    op.bytes = bytes(in);
    op.bwd_bytes = bytes(in);
    op.inputs = {in};
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
  LayerTemplate t_;
  std::string prefix_;
  double input_share_ = 1;
};

}  // namespace

StepGraph build_step_graph(const ModelSpec& model, TrainingSpec training) {
  validate_training(training, model);
  StepGraph g;
  g.model = model;
  g.training = training;
  const auto& p = training.parallelism;
  const double T = static_cast<double>(training.tokens_per_device());
  const double S = static_cast<double>(training.seq_len);
  const double B = static_cast<double>(training.per_device_batch);
  const double a = dtype_bytes(training.activation_dtype);
  const double d = static_cast<double>(model.d_model);
  const double tp = static_cast<double>(p.tp);
  const double H = static_cast<double>(model.num_query_heads) / tp;
  const Dtype attn_dt = training.attention_gemm_dtype, mlp_dt = training.mlp_gemm_dtype;
  g.fsdp_group = p.fsdp * p.ep;
  g.expert_fsdp_group = p.fsdp;
  g.ep_group = p.ep;
  g.expert_fsdp_stride = p.ep * p.tp;

  // One layer body over T tokens (B sequences) that reads the layer input `dli`; returns its output tensor.
  auto body = [&](TemplateBuilder& b, int dli, bool moe, double T, double B) {
    int norm = b.tensor("attn_norm", T * d * a);
    b.memory("attn_norm", {dli}, {norm}, {dli});
    int ctx;
    if (model.is_mla()) {
      const double qlr = static_cast<double>(model.q_lora_rank), kvlr = static_cast<double>(model.kv_lora_rank);
      const double dn = static_cast<double>(model.qk_nope_head_dim), dr = static_cast<double>(model.qk_rope_head_dim);
      const double dv = static_cast<double>(model.v_head_dim);
      int q;
      if (model.q_lora_rank > 0) {
        int qwa = b.tensor("query_wa_proj", T * qlr * a);
        b.gemm("wq_a", norm, qwa, T, d, qlr, attn_dt, a);
        int mq = b.tensor("mla_q", T * qlr * a);
        b.memory("q_norm", {qwa}, {mq}, {qwa});
        q = b.tensor("query_proj", T * H * (dn + dr) * a);
        b.gemm("wq_b", mq, q, T, qlr, H * (dn + dr), attn_dt, a);
      } else {
        q = b.tensor("query_proj", T * H * (dn + dr) * a);
        b.gemm("wq", norm, q, T, d, H * (dn + dr), attn_dt, a);
      }
      int kvwa = b.tensor("kv_wa_proj", T * (kvlr + dr) * a);
      b.gemm("wkv_a", norm, kvwa, T, d, kvlr + dr, attn_dt, a);
      int mkv = b.tensor("mla_kv", T * kvlr * a);
      b.memory("kv_norm", {kvwa}, {mkv}, {kvwa});
      int kv = b.tensor("kv_up", T * H * (dn + dv) * a);
      b.gemm("wkv_b", mkv, kv, T, kvlr, H * (dn + dv), attn_dt, a);
      // Keys get the shared rope part broadcast to every head (MaxText key_proj is [B,S,H,dn+dr]).
      int k = b.tensor("key_proj", T * H * (dn + dr) * a);
      int v = b.tensor("value_proj", T * H * dv * a);
      b.memory("split_kv_rope", {kv, kvwa}, {k, v}, {});
      ctx = b.tensor("context", T * H * dv * a);
      b.attention(q, k, v, ctx, 2.0 * T * S * H * (dn + dr + dv) / 2);
      int o = b.tensor("out_proj", T * d * a);
      b.gemm("wo_attn", ctx, o, T, H * dv, d, attn_dt, a);
      ctx = o;
    } else {
      const double hd = static_cast<double>(model.head_dim);
      const double Hkv = std::max(1.0, static_cast<double>(model.num_kv_heads) / tp);
      int q = b.tensor("query_proj", T * H * hd * a);
      int k = b.tensor("key_proj", T * Hkv * hd * a);
      int v = b.tensor("value_proj", T * Hkv * hd * a);
      b.gemm("wq", norm, q, T, d, H * hd, attn_dt, a);
      b.gemm("wk", norm, k, T, d, Hkv * hd, attn_dt, a);
      b.gemm("wv", norm, v, T, d, Hkv * hd, attn_dt, a);
      int c = b.tensor("context", T * H * hd * a);
      b.attention(q, k, v, c, 4.0 * B * S * S * H * hd / 2);
      int o = b.tensor("out_proj", T * d * a);
      b.gemm("wo_attn", c, o, T, H * hd, d, attn_dt, a);
      ctx = o;
    }
    int res = b.tensor("attention_out", T * d * a);
    b.memory("residual_attn", {dli, ctx}, {res}, {});
    int mnorm = b.tensor("mlp_norm", T * d * a);
    b.memory("mlp_norm", {res}, {mnorm}, {res});
    auto mlp = [&](const std::string& prefix, int in, double rows, double F, int& out) {
      int w0 = b.tensor(prefix + "mlpwi_0", rows * F * a);
      int w1 = b.tensor(prefix + "mlpwi_1", rows * F * a);
      b.gemm(prefix + "wi_0", in, w0, rows, d, F, mlp_dt, a);
      b.gemm(prefix + "wi_1", in, w1, rows, d, F, mlp_dt, a);
      int act = b.tensor(prefix + "mlp_act", rows * F * a);
      b.memory(prefix + "swiglu", {w0, w1}, {act}, {w0, w1});
      out = b.tensor(prefix + "mlpwo", rows * d * a);
      b.gemm(prefix + "wo", act, out, rows, F, d, mlp_dt, a);
    };
    int out;
    if (!moe) {
      int wo;
      mlp("", mnorm, T, static_cast<double>(model.mlp_dim) / tp, wo);
      out = b.tensor("layer_output", T * d * a);
      b.memory("residual_mlp", {res, wo}, {out}, {});
    } else {
      const double X = static_cast<double>(model.num_experts), k = static_cast<double>(model.experts_per_token);
      const double Fm = static_cast<double>(model.moe_mlp_dim) / tp;
      int logits = b.tensor("router_logits", T * X * 4);
      b.gemm("router", mnorm, logits, T, d, X, Dtype::bf16, 4);
      int disp = b.tensor("moe_permuted", T * k * d * a);
      b.memory("route_permute", {logits, mnorm}, {disp}, {logits});
      int moe_in = disp;
      if (p.ep > 1) {
        moe_in = b.tensor("moe_dispatched", T * k * d * a);
        b.all_to_all("dispatch_a2a", disp, moe_in);
      }
      int moe_wo;
      mlp("moe_", moe_in, T * k, Fm, moe_wo);
      int back = moe_wo;
      if (p.ep > 1) {
        back = b.tensor("moe_returned", T * k * d * a);
        b.all_to_all("combine_a2a", moe_wo, back);
      }
      int moe_out = b.tensor("moe_out", T * d * a);
      b.memory("unpermute_combine", {back, logits}, {moe_out}, {back, logits});
      int parts = moe_out;
      if (model.shared_experts > 0) {
        int shared_wo;
        mlp("", mnorm, T, Fm * static_cast<double>(model.shared_experts), shared_wo);
        parts = shared_wo;
      }
      out = b.tensor("layer_output", T * d * a);
      std::vector<int> ins = {res, moe_out};
      if (parts != moe_out) ins.push_back(parts);
      b.memory("residual_mlp", ins, {out}, {});
    }
    return out;
  };
  auto build = [&](bool moe) {
    TemplateBuilder b(moe ? "moe" : "dense");
    int dli = b.tensor("decoder_layer_input", T * d * a);
    const std::int64_t split = moe ? training.moe_batch_split : 1;
    int out;
    if (split == 1) {
      out = body(b, dli, moe, T, B);
    } else {
      const double n = static_cast<double>(split);
      std::vector<int> parts;
      for (std::int64_t m = 0; m < split; ++m) {
        b.micro_batch(static_cast<int>(m), split);
        parts.push_back(body(b, dli, moe, T / n, B / n));
      }
      b.micro_batch(0, 1);
      out = b.tensor("layer_output", T * d * a);
      b.merge("batch_merge", std::move(parts), out);
    }
    auto t = b.finish(out);
    // FSDP traffic: weights gathered in the GEMM dtype (quantized before the gather, as TE does),
    // gradients reduce-scattered in the weight storage dtype.
    double attn_params = model.attention_params_per_layer() / tp;
    double mlp_params = moe ? model.moe_nonexpert_params_per_layer() / tp : model.dense_mlp_params_per_layer() / tp;
    double expert_params = moe ? model.expert_params_per_layer() / (tp * static_cast<double>(p.ep)) : 0;
    t.gathered_dense_bytes = attn_params * dtype_bytes(attn_dt) + mlp_params * dtype_bytes(mlp_dt);
    t.gathered_expert_bytes = expert_params * dtype_bytes(mlp_dt);
    double wb = dtype_bytes(training.weight_storage_dtype);
    t.grad_dense_bytes = (attn_params + mlp_params) * wb;
    t.grad_expert_bytes = expert_params * wb;
    return t;
  };

  g.templates.push_back(build(false));
  if (model.num_experts > 0) g.templates.push_back(build(true));
  for (std::int64_t i = 0; i < model.num_layers; ++i) g.layer_template.push_back(model.is_moe_layer(i) ? 1 : 0);

  g.model_flops = model.model_flops(training.per_device_batch, training.seq_len, training.grad_accum);
  const double shards = static_cast<double>(p.fsdp * p.ep * p.tp);
  g.local_params = model.total_params() / shards;
  g.parameter_bytes = g.local_params * dtype_bytes(training.weight_storage_dtype);
  g.optimizer_bytes = g.local_params * training.optimizer_bytes_per_param;
  g.gradient_bytes = g.local_params * training.gradient_bytes_per_param;
  const double V = static_cast<double>(model.vocab_size);
  g.embed_gathered_bytes = 2 * V * d / tp * dtype_bytes(Dtype::bf16);
  g.embed_grad_bytes = 2 * V * d / tp * dtype_bytes(training.weight_storage_dtype);
  g.logits_bytes = T * V / tp * a;
  g.unembed_flops = 2 * T * d * V / tp;
  // Adam reads param, gradient and two moments and writes param and moments.
  g.optimizer_update_bytes = g.local_params * (2 * dtype_bytes(training.weight_storage_dtype) +
                                               training.gradient_bytes_per_param + 2 * training.optimizer_bytes_per_param);
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
    if (op.kind == OpKind::gemm || op.kind == OpKind::attention) os << " " << op.flops / 1e12 << " TFLOP";
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
