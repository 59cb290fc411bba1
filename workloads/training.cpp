#include "workloads/training.hpp"

#include "hwmodels/json_view.hpp"

namespace hbmsim {

static std::string str(std::int64_t v) { return std::to_string(v); }

void validate_training(TrainingSpec& t, const ModelSpec& m) {
  auto& p = t.parallelism;
  if (t.gpus <= 0) throw InputError("gpus = " + str(t.gpus) + " (must be > 0)");
  if (t.per_device_batch <= 0) throw InputError("batch = " + str(t.per_device_batch) + " (must be > 0)");
  if (t.seq_len <= 0) throw InputError("seq = " + str(t.seq_len) + " (must be > 0)");
  if (t.grad_accum <= 0) throw InputError("grad_accum = " + str(t.grad_accum) + " (must be > 0)");
  if (t.seq_len > (std::int64_t{1} << 24))
    throw InputError("seq = " + str(t.seq_len) + " (above the supported 16777216 tokens)");
  if (t.per_device_batch > (std::int64_t{1} << 20))
    throw InputError("batch = " + str(t.per_device_batch) + " (above the supported 1048576)");
  for (auto [name, v] : {std::pair{"tp", p.tp}, {"ep", p.ep}, {"dp", p.dp}})
    if (v <= 0) throw InputError(std::string(name) + " = " + str(v) + " (must be > 0)");
  if (p.fsdp < 0) throw InputError("fsdp = " + str(p.fsdp) + " (must be > 0)");
  // Each degree divides the GPU count, so none may exceed it (and the products below cannot overflow).
  for (auto [name, v] : {std::pair{"fsdp", p.fsdp}, {"tp", p.tp}, {"ep", p.ep}, {"dp", p.dp}})
    if (v > t.gpus)
      throw InputError(std::string(name) + " = " + str(v) + " (exceeds gpus = " + str(t.gpus) + ")");
  if (t.gpus > (std::int64_t{1} << 24)) throw InputError("gpus = " + str(t.gpus) + " (above the supported 16777216)");
  std::int64_t other = p.tp * p.ep * p.dp;
  if (p.fsdp == 0) {
    if (t.gpus % other != 0)
      throw InputError("gpus = " + str(t.gpus) + " (not divisible by tp*ep*dp = " + str(other) + ")");
    p.fsdp = t.gpus / other;
  }
  if (p.fsdp * other != t.gpus)
    throw InputError("gpus = " + str(t.gpus) + " (must equal fsdp*tp*ep*dp = " + str(p.fsdp) + "*" + str(p.tp) + "*" +
                     str(p.ep) + "*" + str(p.dp) + " = " + str(p.fsdp * other) + ")");
  if (m.num_query_heads % p.tp != 0)
    throw InputError("tp = " + str(p.tp) + " (num_query_heads = " + str(m.num_query_heads) + " is not divisible by it)");
  if (!m.is_mla() && m.num_kv_heads % p.tp != 0 && p.tp % m.num_kv_heads != 0)
    throw InputError("tp = " + str(p.tp) + " (num_kv_heads = " + str(m.num_kv_heads) + " neither divides nor is divided by it)");
  if (p.ep > 1 && m.num_experts == 0) throw InputError("ep = " + str(p.ep) + " (the model has no experts)");
  if (m.num_experts > 0 && m.num_experts % p.ep != 0)
    throw InputError("ep = " + str(p.ep) + " (num_experts = " + str(m.num_experts) + " is not divisible by it)");
  if (t.moe_batch_split <= 0) throw InputError("moe_batch_split = " + str(t.moe_batch_split) + " (must be > 0)");
  if (t.moe_batch_split > 1 && m.num_experts == 0)
    throw InputError("moe_batch_split = " + str(t.moe_batch_split) + " (the model has no MoE layers to split)");
  if (t.per_device_batch % t.moe_batch_split != 0)
    throw InputError("moe_batch_split = " + str(t.moe_batch_split) + " (batch = " + str(t.per_device_batch) +
                     " is not divisible by it)");
  if (m.mlp_dim % p.tp != 0) throw InputError("tp = " + str(p.tp) + " (mlp_dim is not divisible by it)");
}

}  // namespace hbmsim
