#include "workloads/training.hpp"

#include <algorithm>
#include <cmath>

#include "hwmodels/json_view.hpp"
#include "workloads/pipeline_split.hpp"

namespace hbmsim {

const char* to_string(CpExchange c) { return c == CpExchange::ring ? "ring" : "all_gather"; }

const char* to_string(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::zero_bubble_h1: return "zb-h1";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(const std::string& text, const std::string& where) {
  for (auto s : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::zero_bubble_h1})
    if (text == to_string(s)) return s;
  if (text == "interleaved") return PipelineSchedule::one_f_one_b;
  throw InputError(where + " = \"" + text + "\" (expected gpipe, 1f1b, interleaved (1f1b with vp > 1) or zb-h1)");
}

Mesh Parallelism::mesh() const {
  Mesh m;
  m.order = order;
  for (auto [axis, size] : {std::pair{Axis::dp, dp}, {Axis::pp, pp}, {Axis::fsdp, fsdp}, {Axis::ep, ep},
                            {Axis::cp, experts_inside_cp ? cp / ep : cp}, {Axis::tp, tp}})
    m.sizes[static_cast<std::size_t>(axis)] = size;
  if (experts_inside_cp) {  // the ep axis is cp's inner part: right inside the cp axis
    auto rest = std::remove(m.order.begin(), m.order.end(), Axis::ep);
    auto at = std::find(m.order.begin(), rest, Axis::cp) + 1;
    std::move_backward(at, rest, rest + 1);
    *at = Axis::ep;
  }
  return m;
}

std::string expert_group_span(const Parallelism& p) {
  if (p.experts_inside_cp) return "tp x " + std::to_string(p.ep) + " of the " + std::to_string(p.cp) + " cp ranks";
  return p.experts_fold_tp && p.cp > 1 ? "ep x cp x tp" : p.experts_fold_tp ? "ep x tp" : "ep";
}

AxisSet Parallelism::expert_axes() const {
  if (!experts_fold_tp) return AxisSet{Axis::ep};
  if (experts_inside_cp || cp == 1) return AxisSet{Axis::ep, Axis::tp};
  return AxisSet{Axis::ep, Axis::cp, Axis::tp};
}

std::int64_t TrainingSpec::replicas() const {
  const auto& p = parallelism;
  return gpus / (p.tp * p.cp * p.pp);
}

double TrainingSpec::device_batch() const {
  return static_cast<double>(replica_batch) / static_cast<double>(parallelism.tp * parallelism.cp * parallelism.pp);
}

double TrainingSpec::layer_tokens() const {
  return static_cast<double>(replica_batch) * static_cast<double>(seq_len) / static_cast<double>(parallelism.cp);
}

namespace {

// A count that may be fractional: whole values print as integers ("2000000", not "2e+06").
std::string count(double v) {
  return v == std::floor(v) && std::abs(v) < 1e15 ? std::to_string(static_cast<long long>(v)) : format_number(v);
}

void check_degrees(TrainingSpec& t) {
  auto& p = t.parallelism;
  if (t.gpus <= 0) throw InputError("gpus = " + str(t.gpus) + " (must be > 0)");
  if (t.gpus > (std::int64_t{1} << 24)) throw InputError("gpus = " + str(t.gpus) + " (above the supported 16777216)");
  for (auto [name, v] : {std::pair{"tp", p.tp}, {"ep", p.ep}, {"dp", p.dp}, {"cp", p.cp}, {"pp", p.pp}})
    if (v <= 0) throw InputError(std::string(name) + " = " + str(v) + " (must be > 0)");
  if (p.fsdp < 0) throw InputError("fsdp = " + str(p.fsdp) + " (must be > 0)");
  // Each degree divides the GPU count, so none may exceed it (and the products below cannot overflow). The
  // expert group is named as given: with experts folded it spans tp x cp, and the mesh's axis is ep / (tp x cp).
  for (auto [name, v] : {std::pair{"fsdp", p.fsdp}, {"tp", p.tp}, {"ep", p.expert_group()}, {"dp", p.dp}, {"cp", p.cp}, {"pp", p.pp}})
    if (v > t.gpus) throw InputError(std::string(name) + " = " + str(v) + " (exceeds gpus = " + str(t.gpus) + ")");
  // The degrees' product as errors spell it: "tp*ep*dp*cp*pp = 2*4*1*1*1" (only when one is thrown).
  auto product = [&](const std::string& lead, const std::string& lead_value) {
    std::string out = lead;
    if (p.experts_inside_cp) return out + "tp*dp*cp*pp = " + lead_value + str(p.tp) + "*" + str(p.dp) + "*" + str(p.cp) + "*" + str(p.pp);
    const std::string span = p.cp > 1 ? "(tp*cp)" : "tp";
    out += p.experts_fold_tp ? "tp*(ep/" + span + ")*dp*cp*pp = " : "tp*ep*dp*cp*pp = ";
    out += lead_value;
    out += str(p.tp) + "*";
    out += p.experts_fold_tp ? "(" + str(p.expert_group()) + "/" + str(p.fold_span()) + ")" : str(p.ep);
    out += "*" + str(p.dp) + "*" + str(p.cp) + "*" + str(p.pp);
    return out;
  };
  if (p.experts_inside_cp && (!p.experts_fold_tp || p.cp % p.ep != 0 || p.ep_shards_weights))
    throw InputError("ep = " + str(p.expert_group()) + " (an expert group inside tp x cp needs experts folded over tp, ep / tp "
                     "dividing cp = " + str(p.cp) + " and ep_shards_weights off)");
  std::int64_t other = 1;
  for (std::int64_t v : {p.tp, p.experts_inside_cp ? 1 : p.ep, p.dp, p.cp, p.pp}) {
    other *= v;
    if (other > t.gpus) throw InputError("gpus = " + str(t.gpus) + " (fewer than " + product("", "") + ")");
  }
  if (p.fsdp == 0) {
    if (t.gpus % other != 0)
      throw InputError("gpus = " + str(t.gpus) + " (not divisible by " + product("", "") + " = " + str(other) + ")");
    p.fsdp = t.gpus / other;
  }
  if (p.fsdp * other != t.gpus)
    throw InputError("gpus = " + str(t.gpus) + " (must equal " + product("fsdp*", str(p.fsdp) + "*") + " = " +
                     str(p.fsdp * other) + ")");
}

void check_model_split(const TrainingSpec& t, const ModelSpec& m) {
  const auto& p = t.parallelism;
  if (m.num_query_heads % p.tp != 0)
    throw InputError("tp = " + str(p.tp) + " (num_query_heads = " + str(m.num_query_heads) + " is not divisible by it)");
  if (!m.is_mla() && m.num_kv_heads % p.tp != 0 && p.tp % m.num_kv_heads != 0)
    throw InputError("tp = " + str(p.tp) + " (num_kv_heads = " + str(m.num_kv_heads) + " neither divides nor is divided by it)");
  // A Gated DeltaNet layer's heads are split over tp as Megatron's GatedDeltaNet splits them: whole key heads.
  if (!m.linear_attention_layer_ids.empty() && m.linear_num_key_heads % p.tp != 0)
    throw InputError("tp = " + str(p.tp) + " (linear_num_key_heads = " + str(m.linear_num_key_heads) + " is not divisible by it)");
  if (m.dense_layers() > 0 && m.mlp_dim % p.tp != 0)  // unused when every layer is MoE (Mixtral)
    throw InputError("tp = " + str(p.tp) + " (mlp_dim = " + str(m.mlp_dim) + " is not divisible by it)");
  if (m.num_experts > 0 && m.moe_mlp_dim % p.tp != 0)
    throw InputError("tp = " + str(p.tp) + " (moe_mlp_dim = " + str(m.moe_mlp_dim) + " is not divisible by it)");
  if (m.num_experts > 0 && m.shared_mlp_dim() % p.tp != 0)
    throw InputError("tp = " + str(p.tp) + " (the shared experts' width " + str(m.shared_mlp_dim()) + " is not divisible by it)");
  if (m.num_experts > 0 && p.tp > 1 && !p.sequence_parallel)
    throw InputError("sequence_parallel = off (MoE layers with tp > 1 need sequence parallelism, as Megatron-Core requires)");
  if (p.expert_group() > 1 && m.num_experts == 0) throw InputError("ep = " + str(p.expert_group()) + " (the model has no experts)");
  if (m.num_experts > 0 && m.num_experts % p.expert_group() != 0)
    throw InputError("ep = " + str(p.expert_group()) + " (num_experts = " + str(m.num_experts) + " is not divisible by it)");
  // Folded over cp the experts are partitioned there; MaxText's reading shards every weight over cp instead.
  if (p.experts_fold_tp && p.cp > 1 && p.cp_shards_weights)
    throw InputError("expert_tp = 1 (experts folded over tp and cp = " + str(p.cp) +
                     " while cp shards the other weights, MaxText's reading: not modelled; cp_shards_weights off is Megatron's)");
  // Causal load balancing gives each context rank two chunks of the sequence, one from each end.
  if (p.cp > 1 && t.seq_len % (2 * p.cp) != 0)
    throw InputError("cp = " + str(p.cp) + " (seq = " + str(t.seq_len) + " is not divisible by 2 x cp = " + str(2 * p.cp) +
                     ", which causal load balancing needs)");
  // Megatron runs a Gated DeltaNet layer over context ranks by trading sequence shards for head shards (an
  // all-to-all each way around the recurrence): each rank of tp x cp keeps whole key heads.
  if (p.cp > 1 && !m.linear_attention_layer_ids.empty() && m.linear_num_key_heads % (p.tp * p.cp) != 0)
    throw InputError("cp = " + str(p.cp) + " (linear_num_key_heads = " + str(m.linear_num_key_heads) +
                     " is not divisible by tp x cp = " + str(p.tp * p.cp) + ", as Megatron's Gated DeltaNet needs over cp)");
}

// The sequences one model replica runs per micro-step, from either meaning of the batch, and the
// accumulation count a global batch implies (with pp > 1: the pipeline's micro-batches).
void resolve_batch(TrainingSpec& t) {
  const auto& p = t.parallelism;
  const std::int64_t replicas = t.replicas();
  if (t.microbatches < 0) throw InputError("microbatches = " + str(t.microbatches) + " (must be > 0)");
  if (t.microbatches > 0 && p.pp == 1)
    throw InputError("microbatches = " + str(t.microbatches) + " (splits a pipeline's batch and needs pp > 1; with pp = 1 "
                     "use grad_accum)");
  if (t.grad_accum <= 0) throw InputError("grad_accum = " + str(t.grad_accum) + " (must be > 0)");
  if (t.micro_batch != 0) {
    if (t.per_device_batch)
      throw InputError("micro_batch = " + str(t.micro_batch) + " (give the batch either as batch, MaxText's per-device "
                       "batch, or as micro_batch/global_batch, Megatron's; not both)");
    if (t.micro_batch < 0) throw InputError("micro_batch = " + str(t.micro_batch) + " (must be > 0)");
    if (t.micro_batch > (std::int64_t{1} << 24)) throw InputError("micro_batch = " + str(t.micro_batch) + " (above the supported 16777216)");
    if (t.microbatches > 0)
      throw InputError("microbatches = " + str(t.microbatches) + " (with micro_batch the micro-batch count comes from "
                       "global_batch, Megatron's way)");
    t.replica_batch = t.micro_batch;
  } else {
    const double b = t.per_device_batch.value_or(1.0);
    if (!(b > 0) || !std::isfinite(b)) throw InputError("batch = " + count(b) + " (must be > 0)");
    if (b > static_cast<double>(std::int64_t{1} << 20)) throw InputError("batch = " + count(b) + " (above the supported 1048576)");
    // With pipelining a replica spans tp x cp x pp devices and its step's batch is split into micro-batches.
    const double per_replica = b * static_cast<double>(p.tp * p.cp * p.pp);
    const double whole = std::round(per_replica);
    const std::string product = p.pp > 1 ? "batch x tp x cp x pp = " + count(b) + " x " + str(p.tp) + " x " + str(p.cp) + " x " + str(p.pp)
                                         : "batch x tp x cp = " + count(b) + " x " + str(p.tp) + " x " + str(p.cp);
    if (whole < 1 || std::abs(per_replica - whole) > 1e-9 * whole)
      throw InputError("batch = " + count(b) + " (sequences per model replica, " + product + " = " + count(per_replica) + ", must be whole)");
    t.replica_batch = static_cast<std::int64_t>(whole);
    if (p.pp > 1) {
      if (t.grad_accum != 1)
        throw InputError("grad_accum = " + str(t.grad_accum) + " (with pp > 1 and batch, the pipeline's micro-batches are "
                         "set by microbatches)");
      const std::int64_t m = t.microbatches > 0 ? t.microbatches : p.pp;
      if (t.replica_batch % m != 0)
        throw InputError("microbatches = " + str(m) + " (a replica's " + str(t.replica_batch) + " sequences per step, " + product +
                         ", are not divisible by it)");
      t.replica_batch /= m;
      t.grad_accum = m;
    }
  }
  if (t.global_batch < 0) throw InputError("global_batch = " + str(t.global_batch) + " (must be > 0)");
  if (t.global_batch > 0) {
    const std::int64_t per_step = t.replica_batch * replicas;
    if (t.global_batch % per_step != 0)
      throw InputError("global_batch = " + str(t.global_batch) + " (not a multiple of sequences per replica x data-parallel replicas = " +
                       str(t.replica_batch) + " x " + str(replicas) + " = " + str(per_step) + ")");
    const std::int64_t accum = t.global_batch / per_step;
    if (t.grad_accum != 1 && t.grad_accum != accum)
      throw InputError("grad_accum = " + str(t.grad_accum) + " (global_batch = " + str(t.global_batch) + " implies " + str(accum) + ")");
    t.grad_accum = accum;
  }
}

// The schedule's demands on the micro-batch count and the virtual stages. The field named is the one that
// set the count.
void check_pipeline(const TrainingSpec& t) {
  const auto& p = t.parallelism;
  if (p.vp <= 0) throw InputError("vp = " + str(p.vp) + " (must be > 0)");
  if (p.vp > 1 && p.pp == 1) throw InputError("vp = " + str(p.vp) + " (virtual stages interleave a pipeline and need pp > 1)");
  if (p.vp > 1 && p.schedule != PipelineSchedule::one_f_one_b)
    throw InputError("vp = " + str(p.vp) + " (virtual stages run the interleaved 1f1b schedule; schedule = " +
                     std::string(to_string(p.schedule)) + ")");
  if (p.pp == 1) return;
  const std::int64_t m = t.grad_accum;
  const std::string count_field = t.micro_batch != 0 ? "global_batch = " + str(t.global_batch) + " (gives " + str(m) + " micro-batches, "
                                                     : "microbatches = " + str(m) + " (";
  if (p.schedule != PipelineSchedule::gpipe && m < p.pp)
    throw InputError(count_field + "fewer than pp = " + str(p.pp) + ", which " + to_string(p.schedule) + " needs at least)");
  if (p.vp > 1 && m % p.pp != 0)
    throw InputError(count_field + "not a multiple of pp = " + str(p.pp) + ", which the interleaved schedule needs)");
}

// At most every token of the expert group lands on one rank.
void check_load_imbalance(const TrainingSpec& t, const ModelSpec& m) {
  const double f = t.moe_load_imbalance;
  const std::string field = "moe_load_imbalance = " + format_number(f);
  if (!(f >= 1)) throw InputError(field + " (must be >= 1: the busiest rank's tokens over the mean)");
  if (f == 1) return;
  if (m.num_experts == 0) throw InputError(field + " (the model has no MoE layers)");
  const auto group = t.parallelism.expert_group();
  if (group <= 1) throw InputError(field + " (needs an expert group of more than one GPU: ep > 1)");
  if (f > static_cast<double>(group))
    throw InputError(field + " (more than the expert group's " + str(group) + " GPUs: at most every token on one rank)");
}

// Megatron's sync-free expert buffers: sized for at least the busiest rank's tokens (over them Megatron drops the
// tokens and reruns the step without padding), and the paged stash needs them.
void check_expert_buffers(const TrainingSpec& t, const ModelSpec& m) {
  const double c = t.moe_capacity_factor, s = t.moe_paged_stash, f = t.moe_load_imbalance;
  const std::string cap = "moe_capacity_factor = " + format_number(c), stash = "moe_paged_stash = " + format_number(s);
  if (!std::isfinite(c) || c < 0) throw InputError(cap + " (must be 0, none, or >= 1)");
  if (!std::isfinite(s) || s < 0) throw InputError(stash + " (must be 0, off, or >= 1)");
  if (c > 0) {
    if (m.num_experts == 0) throw InputError(cap + " (the model has no MoE layers)");
    if (c < 1) throw InputError(cap + " (below 1: the balanced tokens would not fit the buffers)");
    if (c < f)
      throw InputError(cap + " (below moe_load_imbalance = " + format_number(f) + ": the busiest rank's tokens overflow the "
                       "buffers, and Megatron reruns such a step without padding)");
  }
  if (s > 0) {
    if (c == 0) throw InputError(stash + " (Megatron's paged stash needs moe_capacity_factor: its pool pages the capacity-sized buffers)");
    if (s < f)
      throw InputError(stash + " (below moe_load_imbalance = " + format_number(f) + ": the busiest rank's saved tokens overflow "
                       "the pool, and Megatron reruns such a step without it)");
  }
}

}  // namespace

void validate_training(TrainingSpec& t, const ModelSpec& m) {
  if (t.seq_len <= 0) throw InputError("seq = " + str(t.seq_len) + " (must be > 0)");
  if (t.seq_len > (std::int64_t{1} << 24))
    throw InputError("seq = " + str(t.seq_len) + " (above the supported 16777216 tokens)");
  check_degrees(t);
  check_model_split(t, m);
  resolve_batch(t);
  check_pipeline(t);
  if (t.mtp_layers < 0 || t.mtp_layers > 16) throw InputError("mtp_layers = " + str(t.mtp_layers) + " (must be between 0 and 16)");
  ModelSpec trained = m;
  trained.mtp_layers = t.mtp_layers;
  pipeline_chunks(trained, t.parallelism);  // the layer split's errors
  check_load_imbalance(t, m);
  check_expert_buffers(t, m);
  if (t.moe_batch_split <= 0) throw InputError("moe_batch_split = " + str(t.moe_batch_split) + " (must be > 0)");
  if (t.moe_batch_split > 1 && m.num_experts == 0)
    throw InputError("moe_batch_split = " + str(t.moe_batch_split) + " (the model has no MoE layers to split)");
  if (t.replica_batch % t.moe_batch_split != 0)
    throw InputError("moe_batch_split = " + str(t.moe_batch_split) + " (sequences per model replica, batch x tp x cp = " +
                     str(t.replica_batch) + ", is not divisible by it)");
}

}  // namespace hbmsim
