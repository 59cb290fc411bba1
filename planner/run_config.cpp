#include "planner/run_config.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <mutex>
#include <cmath>

#include "hwmodels/builtin.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"
#include "hwmodels/profile.hpp"
#include "planner/run_fields.hpp"

namespace hbmsim {

const std::vector<std::string>& RunConfig::fields() {
  static const std::vector<std::string> f = [] {
    std::vector<std::string> names;
    for (const auto& field : run_fields()) names.emplace_back(field.name);
    return names;
  }();
  return f;
}

namespace {

// Built-in profiles are parsed once per process: sweeps resolve one per point.
const Profile& builtin_profile(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, Profile> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto file = "profiles/" + name + ".json";
  auto text = builtin_file(file);
  return cache[name] = load_profile(parse_json_text(*text, "builtin:" + file), "builtin:" + file);
}

}  // namespace

void RunConfig::set(const std::string& field, const std::string& value, const std::string& where) {
  if (const RunField* f = find_run_field(field)) {
    f->set(*this, value, where);
  } else if (field.rfind("tensor.", 0) == 0 && field.size() > 7) {
    tensors[field.substr(7)] = value;
  } else {
    std::string list;
    for (auto& f : fields()) list += (list.empty() ? "" : ", ") + f;
    throw InputError(where + " (unknown field \"" + field + "\"; fields: " + list + ", tensor.NAME)");
  }
}

nlohmann::json RunConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : run_fields())
    if (auto v = f.json(*this)) j[std::string(f.name)] = *v;
  j["tensors"] = tensors;
  return j;
}

RunConfig RunConfig::from_json(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  std::vector<std::string_view> keys = {"tensors", "about"};
  for (const auto& f : run_fields()) keys.push_back(f.name);
  v.allow_only(keys);
  RunConfig c;
  for (const auto& f : run_fields())
    if (auto x = v.find(f.name)) f.read(c, *x);
  if (auto x = v.find("tensors")) {
    x->expect_object();
    for (auto& item : x->raw().items()) {
      auto t = x->at(item.key());
      auto value = t.string();
      if (const std::string why = tensor_key_error(item.key()); !why.empty()) t.fail(why);
      if (value != "device" && value != "remat" && value != "offload") t.fail("expected device, remat or offload");
      c.tensors[item.key()] = value;
    }
  }
  return c;
}

RunConfig RunConfig::from_file(const std::string& path) { return from_json(parse_json_file(path), path); }

const std::vector<WhatIfField>& what_if_fields() {
  static const std::vector<WhatIfField> fields = {
      {"host_link_bytes_per_s", &RunConfig::host_link_bytes_per_s, "bytes/s",
       [](const System& s) { return s.host_h2d_bytes_per_s(); },
       [](System& s, double v) { s.host_link.measured_h2d_bytes_per_s = s.host_link.measured_d2h_bytes_per_s = v; }},
      {"scale_up_bytes_per_s", &RunConfig::scale_up_bytes_per_s, "bytes/s",
       [](const System& s) { return s.scale_up.per_gpu_bytes_per_s_per_direction; },
       [](System& s, double v) { s.scale_up.per_gpu_bytes_per_s_per_direction = v; }},
      {"scale_out_bytes_per_s", &RunConfig::scale_out_bytes_per_s, "bytes/s",
       [](const System& s) { return s.scale_out.per_gpu_bytes_per_s_per_direction; },
       [](System& s, double v) { s.scale_out.per_gpu_bytes_per_s_per_direction = v; }},
      {"hbm_bytes", &RunConfig::hbm_bytes, "bytes", [](const System& s) { return s.gpu.hbm_bytes; },
       [](System& s, double v) { s.gpu.hbm_bytes = v; }},
      {"host_memory_bytes", &RunConfig::host_memory_bytes, "bytes", [](const System& s) { return s.host_cpu.memory_bytes; },
       [](System& s, double v) { s.host_cpu.memory_bytes = v; }},
      {"hbm_bandwidth_bytes_per_s", &RunConfig::hbm_bandwidth_bytes_per_s, "bytes/s",
       [](const System& s) { return s.gpu.hbm_bandwidth_bytes_per_s; },
       [](System& s, double v) {  // a profile's measured device-to-device copy rate moves with it
         if (s.gpu.measured_d2d_bytes_per_s) *s.gpu.measured_d2d_bytes_per_s *= v / s.gpu.hbm_bandwidth_bytes_per_s;
         s.gpu.hbm_bandwidth_bytes_per_s = v;
       }},
      // Every format's peak scales with BF16's, so a what-if GPU keeps the part's ratios between them.
      {"bf16_flops_per_s", &RunConfig::bf16_flops_per_s, "FLOP/s", [](const System& s) { return s.gpu.peak_flops(Dtype::bf16); },
       [](System& s, double v) {
         const double scale = v / s.gpu.peak_flops(Dtype::bf16);
         for (auto& [dtype, flops] : s.gpu.dense_peak_flops) flops *= scale;
       }},
  };
  return fields;
}

const WhatIfField* find_what_if(const std::string& field) {
  for (const auto& w : what_if_fields())
    if (field == w.field) return &w;
  return nullptr;
}

std::optional<std::string> what_if_problem(const std::string& field, double v) {
  const WhatIfField* w = find_what_if(field);
  if (!w) throw std::logic_error("what_if_problem: not a what-if field: " + field);
  if (!(v > 0) || !std::isfinite(v)) return "must be > 0";
  const std::string unit = w->unit;
  const double max = unit == "bytes" ? kMaxHardwareBytes : unit == "FLOP/s" ? kMaxHardwareFlopsPerSecond : kMaxHardwareBytesPerSecond;
  if (std::string why = hardware_bounds_problem(v, max, unit); !why.empty()) return why;
  return std::nullopt;
}

void check_what_ifs(const RunConfig& c, const std::function<std::string(const std::string&)>& name,
                    const std::function<bool(const std::string&)>& skip) {
  auto named = [&](const std::string& field) { return name ? name(field) : field; };
  auto checked = [&](const std::string& field) { return !skip || !skip(field); };
  if (checked("memory_limit_slop") && !(c.memory_limit_slop > 0 && c.memory_limit_slop <= 1))
    throw InputError(named("memory_limit_slop") + " = " + format_number(c.memory_limit_slop) + " (must be in (0, 1])");
  if (checked("max_ops") && c.max_ops <= 0) throw InputError(named("max_ops") + " = " + std::to_string(c.max_ops) + " (must be > 0)");
  for (const auto& w : what_if_fields()) {
    const auto& v = c.*w.value;
    if (!v || !checked(w.field)) continue;
    if (auto why = what_if_problem(w.field, *v)) throw InputError(named(w.field) + " = " + format_number(*v) + " (" + *why + ")");
  }
}

void check_calibration(const std::string& calibration, const std::string& named, bool read) {
  if (calibration.empty() || builtin_file("profiles/" + calibration + ".json")) return;
  std::error_code ec;
  if (std::filesystem::exists(calibration, ec)) {  // a file: its own errors name it
    if (read) (void)load_profile_file(calibration);
    return;
  }
  if (calibration.find('/') != std::string::npos || calibration.ends_with(".json"))
    throw InputError(named + " = " + quote(calibration) + " (file does not exist)");
  std::string known;
  for (auto& f : builtin_files("profiles/")) known += (known.empty() ? "" : ", ") + f.substr(9, f.size() - 9 - 5);
  throw InputError(named + " = " + quote(calibration) + " (file does not exist and no built-in profile has that name; built-ins: " +
                   known + ")");
}

System resolve_run_system(const RunConfig& c, const Profile* extra) {
  System sys = resolve_system(c.system);
  if (!c.calibration.empty()) {
    auto name = "profiles/" + c.calibration + ".json";
    if (builtin_file(name))
      sys = apply_profile(sys, builtin_profile(c.calibration));
    else
      sys = apply_profile(sys, load_profile_file(c.calibration));
  }
  if (extra) sys = apply_profile(sys, *extra);
  check_what_ifs(c);
  for (const auto& w : what_if_fields())
    if (const auto& v = c.*w.value) w.apply(sys, *v);
  return sys;
}

void check_gpu_dtype(const System& sys, const std::string& field, Dtype dtype) {
  if (dtype == Dtype::fp32 || sys.gpu.dense_peak_flops.count(dtype)) return;
  std::string has;
  for (const auto& [d, flops] : sys.gpu.dense_peak_flops) has += (has.empty() ? "" : ", ") + std::string(to_string(d));
  throw InputError(field + " = " + to_string(dtype) + " (" + sys.id + "'s " + sys.gpu.name + " has no " + to_string(dtype) +
                   " tensor cores; it has " + has + ")");
}

void check_expert_tp(const RunConfig& c, const ModelSpec& model) {
  if (folds_experts(c) && model.num_experts == 0) throw InputError("expert_tp = 1 (the model has no experts to fold over tp)");
}

TrainingSpec training_shape(const RunConfig& c) {
  TrainingSpec t;
  t.gpus = c.gpus;
  t.per_device_batch = c.batch;
  t.micro_batch = c.micro_batch;
  t.global_batch = c.global_batch;
  t.seq_len = c.seq;
  t.grad_accum = c.grad_accum;
  t.microbatches = c.microbatches;
  t.moe_batch_split = c.moe_batch_split;
  t.moe_load_imbalance = c.moe_load_imbalance;
  t.moe_capacity_factor = c.moe_capacity_factor;
  t.moe_paged_stash = c.moe_paged_stash;
  t.mtp_layers = c.mtp_layers;
  t.fp8_saved_activations = c.fp8_saved_activations;
  auto& p = t.parallelism;
  p.fsdp = c.fsdp;
  p.tp = c.tp;
  p.ep = c.ep;
  p.dp = c.dp;
  p.cp = c.cp;
  p.pp = c.pp;
  p.vp = c.vp;
  p.schedule = parse_pipeline_schedule(c.pp_schedule, "pp_schedule");
  p.split = {c.first_stage_layers, c.last_stage_layers, c.embedding_as_layer, c.loss_as_layer, c.pipeline_layout};
  const LayoutReading reading = layout_reading(c);
  p.order = parse_mesh_order(reading.mesh_order, "mesh_order");
  p.sequence_parallel = c.sequence_parallel;
  if (reading.cp_exchange == "ring") p.cp_exchange = CpExchange::ring;
  else if (reading.cp_exchange == "all_gather") p.cp_exchange = CpExchange::all_gather;
  else throw InputError("cp_exchange = " + quote(c.cp_exchange) + " (expected ring, all_gather or auto)");
  p.sharded_optimizer = c.sharded_optimizer;
  p.cp_shards_weights = reading.cp_shards_weights;
  p.ep_shards_weights = reading.ep_shards_weights;
  // Folding: the user's ep is Megatron's expert group (expert_model_parallel_size), which spans tp and cp; the
  // mesh's ep axis is the part of it carved out of data parallelism, or, for a group inside tp x cp (ep 8 at
  // tp 4 x cp 4), the part of cp it spans.
  if (folds_experts(c)) {
    const std::string span = c.cp > 1 ? "tp x cp = " + std::to_string(c.tp * c.cp) : "tp = " + std::to_string(c.tp);
    const bool inside = experts_inside_cp(c);
    if (!folded_group_fits(c.tp, c.cp, c.ep))
      throw InputError("ep = " + std::to_string(c.ep) + " (with expert_tp = 1 the expert group spans " + span +
                       ": ep must be a multiple of it" + (c.cp > 1 ? ", or tp times a divisor of cp" : "") + ")");
    if (inside && reading.ep_shards_weights)
      throw InputError("ep = " + std::to_string(c.ep) + " (an expert group inside " + span +
                       " is part of the cp ranks, which hold the other weights whole: needs ep_shards_weights off, as Megatron's)");
    p.ep = expert_axis(c);
    p.experts_fold_tp = true;
    p.experts_inside_cp = inside;
  } else if (c.expert_tp != 0 && c.expert_tp != c.tp) {
    throw InputError("expert_tp = " + std::to_string(c.expert_tp) + " (expected 0 or tp = " + std::to_string(c.tp) +
                     ", or 1: experts folded over tp)");
  }
  if (c.moe_dispatcher == "flex") p.moe_dispatcher = MoeDispatcher::flex;
  else if (c.moe_dispatcher != "alltoall")
    throw InputError("moe_dispatcher = " + quote(c.moe_dispatcher) + " (expected alltoall or flex)");
  // Megatron-Core gives DeepEP 20 SMs when moe_flex_dispatcher_num_sms is unset (token_dispatcher.py).
  constexpr std::int64_t kMegatronFlexSms = 20;
  if (p.moe_dispatcher == MoeDispatcher::flex) p.moe_dispatcher_sms = c.moe_dispatcher_sms > 0 ? c.moe_dispatcher_sms : kMegatronFlexSms;
  else if (c.moe_dispatcher_sms > 0)
    throw InputError("moe_dispatcher_sms = " + std::to_string(c.moe_dispatcher_sms) + " (only the flex dispatcher's SMs are modelled: needs moe_dispatcher flex)");
  // Bytes of training state per parameter. MaxText keeps fp32 weights (weight_dtype float32) and fp32
  // gradients, Adam's two fp32 moments in the optimizer. Megatron-Core's mixed precision keeps bf16 weights,
  // fp32 main gradients (grad_reduce_in_fp32) and fp32 master weights beside the two moments in the optimizer
  // state: 2 + 4 + 12 bytes, the 12 divided over the data-parallel ranks by the distributed optimizer
  // (Megatron-Core's distributed optimizer docs: "6 + 12/d" bytes per parameter for bf16 weights, fp32 grads).
  // Megatron's loss is Transformer Engine's fused cross-entropy, in place in the bf16 logits.
  if (c.framework == "megatron") {
    t.weight_storage_dtype = Dtype::bf16;
    t.gradient_bytes_per_param = 4;
    t.optimizer_bytes_per_param = 12;
    t.loss_extra_bytes_per_logit = 0;
    t.wgrad_into_grad_buffer = true;
    t.moe_probs_in_activation = true;
  } else if (c.framework != "maxtext") {
    throw InputError("framework = " + quote(c.framework) + " (expected maxtext or megatron)");
  }
  // Megatron's grad_reduce_in_fp32 off: the gradient buffer (main_grad) and its reduce-scatters in bf16.
  if (c.grad_reduce_dtype == "bf16") t.gradient_bytes_per_param = 2;
  else if (c.grad_reduce_dtype != "fp32")
    throw InputError("grad_reduce_dtype = " + quote(c.grad_reduce_dtype) + " (expected fp32 or bf16)");
  // Megatron's precision-aware optimizer with exp_avg_dtype and exp_avg_sq_dtype bf16 (Megatron-Bridge's DeepSeek-V3
  // recipes): each moment 2 bytes instead of 4; the fp32 master weights stay.
  if (c.optimizer_moments_dtype == "bf16") t.optimizer_bytes_per_param -= 2 * 2;
  else if (c.optimizer_moments_dtype != "fp32")
    throw InputError("optimizer_moments_dtype = " + quote(c.optimizer_moments_dtype) + " (expected fp32 or bf16)");
  if (c.optimizer == "muon") {
    t.muon = true;
    auto refuse = [&](const std::string& why) { throw InputError("optimizer = \"muon\" (" + why + ")"); };
    if (c.framework != "megatron") refuse("modelled as Megatron-Core's Muon: needs framework megatron");
    if (c.optimizer_moments_dtype != "fp32")
      refuse("with optimizer_moments_dtype " + c.optimizer_moments_dtype + ": Megatron's Muon has no precision-aware optimizer");
    if (c.optimizer_offload != "off" || c.parameter_offload)
      refuse("with optimizer or parameter offload: Megatron offloads Adam's state only");
  } else if (c.optimizer != "adam") {
    throw InputError("optimizer = " + quote(c.optimizer) + " (expected adam or muon)");
  }
  if (c.muon_tp_mode == "blockwise") t.muon_blockwise = true;
  else if (c.muon_tp_mode != "duplicated")
    throw InputError("muon_tp_mode = " + quote(c.muon_tp_mode) + " (expected duplicated or blockwise; distributed is not modelled)");
  if (t.muon_blockwise && !t.muon) throw InputError("muon_tp_mode = \"blockwise\" (only with optimizer muon)");
  return t;
}

std::string missing_tensor(const StepGraph& g, const std::string& key) {
  const TensorKey k = split_tensor_key(key);
  auto of_kind = [&](const LayerTemplate& t) { return k.kind.empty() || t.kind == k.kind; };
  auto makes = [&](const LayerTemplate& t) { return of_kind(t) && t.find_tensor(k.name) >= 0; };
  if (std::any_of(g.templates.begin(), g.templates.end(), makes)) return "";
  if (std::none_of(g.templates.begin(), g.templates.end(), of_kind)) return g.model.name + " has no " + k.kind + " layers";
  std::vector<std::string> names;  // what a policy could name instead, in layer order
  for (const LayerTemplate& t : g.templates)
    if (of_kind(t))
      for (const TensorDef& d : t.tensors)
        if ((is_checkpoint_name(d.name) || is_module_tensor_name(d.name)) && std::find(names.begin(), names.end(), d.name) == names.end())
          names.push_back(d.name);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return g.model.name + "'s " + (k.kind.empty() ? "" : k.kind + " ") + "layers have no tensor " + k.name + "; they have " + list;
}

// Keeping or offloading a tensor the model's layers never make would change nothing (Llama's attention saves
// query_proj, key_proj and value_proj, never qkv_proj). Remat of it is what happens anyway, so a policy written
// for several models may say it.
void check_override_tensors(const std::map<std::string, std::string>& tensors, const StepGraph& g) {
  for (const auto& [key, value] : tensors)
    if (value != "remat")
      if (const std::string why = missing_tensor(g, key); !why.empty()) throw InputError("tensors." + key + " = " + quote(value) + " (" + why + ")");
}

Policy resolve_policy(const RunConfig& c, const StepGraph& g) {
  Policy p = make_stage_policy(c.policy, c.stage_policies, c.tensors, g.training.parallelism.pp);
  check_override_tensors(c.tensors, g);
  add_layer_policies(p, c.layer_policies, c.tensors, g.model.stack_layers());
  add_offload_layers(p, c.offload_layers, g.model.stack_layers());
  add_recompute_layers(p, c.recompute_layers, g.chunks);
  return p;
}

namespace {

// Pipeline sends block both ends (SimOptions::blocking_p2p): pp_p2p, with auto as Megatron does it. Megatron
// overlaps them only in its interleaved schedule: arguments.py turns overlap_p2p_comm off without a virtual
// pipeline, and schedules.py refuses it there.
bool blocking_p2p(const RunConfig& c) {
  const bool megatron_plain = c.framework == "megatron" && c.vp == 1;
  if (c.pp_p2p == "auto") return megatron_plain;
  if (c.pp_p2p == "blocking") {
    // Megatron's interleaved schedule without overlap sends a forward's output and a backward's gradient in
    // one call after the pair: not modelled (per pass, the interleaved table's wrap-around can deadlock).
    if (c.vp > 1 && c.pp > 1)
      throw InputError("pp_p2p = \"blocking\" (modelled for schedules without a virtual pipeline: vp = 1, not " + std::to_string(c.vp) + ")");
    return true;
  }
  if (c.pp_p2p != "overlapped") throw InputError("pp_p2p = " + quote(c.pp_p2p) + " (expected auto, overlapped or blocking)");
  if (megatron_plain && c.pp > 1)
    throw InputError("pp_p2p = \"overlapped\" (Megatron overlaps pipeline sends only in its interleaved schedule: vp > 1)");
  return false;
}

// Megatron-Core's rules for overlap_moe_expert_parallel_comm (TransformerConfig: expert parallelism, the
// alltoall or flex dispatcher, no full recompute and no recompute method, a virtual pipeline with pp > 1), and
// what hbmsim does not model with it (host offload, schedules other than 1F1B).
void check_ep_overlap(const RunConfig& c, const PreparedRun& r) {
  const auto& p = r.graph.training.parallelism;
  auto no = [](const std::string& why) { throw InputError("ep_overlap = on (" + why + ")"); };
  if (p.expert_group() <= 1) no("needs expert parallelism: ep > 1");
  if (p.schedule != PipelineSchedule::one_f_one_b) no("combined 1F1B needs pp_schedule 1f1b, not " + c.pp_schedule);
  if (p.pp > 1 && p.vp <= 1) no("with pp = " + std::to_string(p.pp) + " Megatron needs a virtual pipeline: vp > 1");
  if (c.recompute_layers > 0)
    no("recompute_layers = " + std::to_string(c.recompute_layers) + ": Megatron refuses a recompute method with it");
  if (r.policy.any_applied([](const Policy& q) { return q.preset == "full"; })) no("full recompute: Megatron refuses it with the overlap; use a selective policy");
  if (r.policy.offloads_any() || c.offload_layers > 0) no("with host offload: not modelled");
  // Megatron-Core refuses "moe" among the recompute modules with the overlap (transformer_config.py).
  if (recomputes_moe_module(c, r.graph.model)) no("the MoE layer recomputed (recompute module moe): Megatron refuses it with the overlap");
}

// Megatron's sync-free experts (moe_expert_rank_capacity_factor) need HybridEP and its paged stash no CPU
// offload of the layers or of the tensors it pages (Megatron-LM docs/user-guide/features/paged_stash.md).
void check_sync_free_experts(const RunConfig& c, const PreparedRun& r) {
  if (c.moe_capacity_factor == 0 && c.moe_paged_stash == 0) return;
  const std::string field = c.moe_capacity_factor > 0 ? "moe_capacity_factor = " + format_number(c.moe_capacity_factor)
                                                      : "moe_paged_stash = " + format_number(c.moe_paged_stash);
  auto no = [&](const std::string& why) { throw InputError(field + " (" + why + ")"); };
  if (c.framework != "megatron") no("Megatron's sync-free experts: needs framework megatron");
  if (r.graph.training.parallelism.expert_group() <= 1) no("sizes the buffers experts are dispatched into: needs ep > 1");
  if (c.moe_dispatcher != "flex") no("Megatron sizes HybridEP's buffers with it: needs moe_dispatcher flex, not " + c.moe_dispatcher);
  if (c.moe_paged_stash == 0) return;
  const std::string stash = "moe_paged_stash = " + format_number(c.moe_paged_stash);
  if (c.offload_layers > 0)
    throw InputError(stash + " (with offload_layers = " + std::to_string(c.offload_layers) + ": Megatron refuses cpu_offloading with the paged stash)");
  for (const char* name : {"moe_dispatched", "moe_dispatched_gathered", "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlp_act"})
    if (r.policy.any_applied([&](const Policy& q) { return q.placement(name, "moe") == Placement::offload; }))
      throw InputError(stash + " (with " + name + " offloaded: the paged stash keeps the expert MLP's saved tensors, which "
                       "Megatron then refuses to offload)");
}

}  // namespace

namespace {

// Each framework's reading of the layout fields left auto.
const LayoutReading kMaxtextReading{"maxtext", "all_gather", true, true};
const LayoutReading kMegatronReading{"megatron", "ring", false, false};

// The FSDP degree a config runs at: given, or what the other axes leave of the GPUs (validate_training fills it
// so; 0 where they leave no whole number).
std::int64_t fsdp_degree(const RunConfig& c) {
  if (c.fsdp > 0) return c.fsdp;
  std::int64_t other = 1;
  for (std::int64_t v : {c.tp, experts_inside_cp(c) ? std::int64_t{1} : expert_axis(c), c.dp, c.cp, c.pp}) {
    if (v <= 0 || other > c.gpus / v) return 0;
    other *= v;
  }
  return c.gpus % other == 0 ? c.gpus / other : 0;
}

// Megatron-Core's reading of a config's layout. Megatron-FSDP shards the weights over the whole data-parallel
// group with its context ranks (its dp_cp group, mcore_fsdp_adapter.py), which holds the expert ranks too: under
// it the context and expert axes shard the other weights, where DDP and the distributed optimizer keep them whole.
// (Experts folded over tp keep DDP's reading: their group's place in the shards is not modelled.)
LayoutReading megatron_reading(const RunConfig& c) {
  LayoutReading m = kMegatronReading;
  if (fsdp_degree(c) > 1 && !folds_experts(c)) m.cp_shards_weights = m.ep_shards_weights = true;
  return m;
}

LayoutReading read_layout(const RunConfig& c, const LayoutReading& framework) {
  return {c.mesh_order == "auto" ? framework.mesh_order : c.mesh_order,
          c.cp_exchange == "auto" ? framework.cp_exchange : c.cp_exchange,
          c.cp_shards_weights.on(framework.cp_shards_weights), c.ep_shards_weights.on(framework.ep_shards_weights)};
}

}  // namespace

const std::vector<RecomputeModule>& megatron_recompute_modules() {
  static const std::vector<RecomputeModule> modules = {
      // name, what; tensors in every model, in MLA models, in MoE models, with shared experts, with dense layers
      {"core_attn", "core attention", {"context"}, {}, {}, {}, {}},
      {"mla_up_proj", "MLA up-projections", {}, {"query_proj", "key_proj", "value_proj"}, {}, {}, {}},
      // A module's last output is listed though the backward does not read it (the MLP's mlpwo; the combine's
      // moe_returned, TrainingSpec::moe_probs_in_activation): Megatron's checkpoint runs the whole function again,
      // fc2 and the combine included, and a tensor named remat is made again (plan_template).
      {"mlp", "dense MLP", {}, {}, {}, {}, {"mlp_norm@dense", "mlpwi_0@dense", "mlpwi_1@dense", "mlp_act@dense", "mlpwo@dense"}},
      // Before moe_act and shared_experts, whose tensors it includes: a policy that recomputes the whole layer
      // is named moe.
      {"moe", "MoE layer", {}, {}, {"router_logits", "moe_dispatched", "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlp_act", "moe_returned"},
       {"mlpwi_0@moe", "mlpwi_1@moe", "mlp_act@moe", "mlpwo@moe"}, {}},
      {"moe_act", "expert activation function", {}, {}, {"moe_mlp_act"}, {}, {}},
      {"shared_experts", "shared experts", {}, {}, {}, {"mlpwi_0@moe", "mlpwi_1@moe", "mlp_act@moe", "mlpwo@moe"}, {}},
      {"layernorm", "norms outside a fused GEMM", {}, {"attn_norm"}, {"mlp_norm@moe"}, {}, {}}};
  return modules;
}

const RecomputeModule* find_recompute_module(const std::string& name) {
  const auto& modules = megatron_recompute_modules();
  const auto m = std::find_if(modules.begin(), modules.end(), [&](const RecomputeModule& k) { return k.name == name; });
  return m == modules.end() ? nullptr : &*m;
}

std::vector<std::string> RecomputeModule::tensors_in(const ModelSpec& model) const {
  std::vector<std::string> out = tensors;
  auto add = [&](const std::vector<std::string>& v) { out.insert(out.end(), v.begin(), v.end()); };
  if (model.is_mla()) add(mla_tensors);
  if (model.moe_layers() > 0) add(moe_tensors);
  if (model.moe_layers() > 0 && model.shared_experts > 0) add(shared_tensors);
  if (model.dense_layers() > 0) add(dense_tensors);
  // A model of one kind of layer needs no kind: its names go unqualified.
  if (model.dense_layers() == 0 || model.moe_layers() == 0)
    for (auto& key : out) key = split_tensor_key(key).name;
  return out;
}

bool recomputes_moe_module(const RunConfig& c, const ModelSpec& model) {
  const auto moe = find_recompute_module("moe")->tensors_in(model);
  return !moe.empty() && std::all_of(moe.begin(), moe.end(), [&](const std::string& key) {
    const auto given = c.tensors.find(key);
    return given != c.tensors.end() && given->second == "remat";
  });
}

LayoutReading layout_reading(const RunConfig& c) {
  return read_layout(c, c.framework == "megatron" ? megatron_reading(c) : kMaxtextReading);
}

LayoutReading folded_layout_reading(const RunConfig& c) {
  return read_layout(c, c.framework == "megatron" ? kMegatronReading : kMaxtextReading);
}

std::string megatron_reading_flags(const RunConfig& c) {
  const LayoutReading m = megatron_reading(c);
  const LayoutReading r = read_layout(c, m);
  auto on_off = [](bool v) { return v ? " on" : " off"; };
  std::string flags;
  int axes = 0;
  for (std::int64_t d : {c.tp, c.cp, c.ep, c.fsdp, c.dp, c.pp}) axes += d > 1;
  if (axes >= 2 && r.mesh_order != m.mesh_order) flags += " --mesh-order " + m.mesh_order;
  if (c.cp > 1 && r.cp_exchange != m.cp_exchange) flags += " --cp-exchange " + m.cp_exchange;
  if (c.cp > 1 && r.cp_shards_weights != m.cp_shards_weights) flags += std::string(" --cp-shards-weights") + on_off(m.cp_shards_weights);
  if (c.ep > 1 && r.ep_shards_weights != m.ep_shards_weights) flags += std::string(" --ep-shards-weights") + on_off(m.ep_shards_weights);
  return flags;
}

PreparedRun prepare_run(const RunConfig& c, const Profile* extra) {
  System sys = resolve_run_system(c, extra);
  ModelSpec model = resolve_model(c.model);
  check_expert_tp(c, model);
  TrainingSpec t = training_shape(c);
  // The field named in the message: these come from sweep axes and Python as well as from flags.
  auto dtype = [](const std::string& value, const char* field) {
    try {
      return parse_dtype(value);
    } catch (const InputError& e) {
      throw InputError(std::string(field) + ": " + e.what());
    }
  };
  t.mlp_gemm_dtype = dtype(c.weights, "weights");
  t.attention_gemm_dtype = dtype(c.attention_dtype, "attention_dtype");
  if (t.mlp_gemm_dtype == Dtype::fp32) throw InputError("weights = fp32 (expected bf16, fp8, mxfp8 or nvfp4)");
  check_gpu_dtype(sys, "weights", t.mlp_gemm_dtype);
  check_gpu_dtype(sys, "attention_dtype", t.attention_gemm_dtype);
  if (const auto sms = t.parallelism.moe_dispatcher_sms; sys.gpu.sms > 0 && sms >= sys.gpu.sms)
    throw InputError("moe_dispatcher_sms = " + std::to_string(sms) + " (" + sys.id + "'s " + sys.gpu.name + " has " +
                     std::to_string(sys.gpu.sms) + " SMs: the dispatcher must leave some to compute)");
  PreparedRun r{sys, build_step_graph(model, t), Policy{}, SimOptions{}};
  r.policy = resolve_policy(c, r.graph);
  r.options.lhs = c.lhs;
  r.options.pipelined_transfers = c.pipelined_transfers;
  r.options.te_offload = c.framework == "megatron";  // Megatron's activation offload is Transformer Engine's
  r.options.pipelined_collectives = c.pipelined_collectives;
  r.options.double_buffering = c.double_buffering;
  r.options.memory_limit_slop = c.memory_limit_slop;
  r.options.max_ops = c.max_ops;
  r.options.tp_comm_overlap = c.tp_comm_overlap;
  r.options.dp_overlap = c.dp_overlap;
  r.options.ep_overlap = c.ep_overlap;
  r.options.program_order = c.framework == "megatron";
  r.options.blocking_p2p = blocking_p2p(c);
  if (c.ep_overlap) check_ep_overlap(c, r);
  check_sync_free_experts(c, r);
  // Without sequence parallelism tp's traffic is all-reduces, and Megatron-LM asserts sequence_parallel with
  // tp_comm_overlap (arguments.py): its userbuffers overlap the all-gathers and reduce-scatters only.
  if (c.tp_comm_overlap && c.framework == "megatron" && c.tp > 1 && !c.sequence_parallel)
    throw InputError("tp_comm_overlap = on (Megatron overlaps tp communication with its GEMMs only with sequence_parallel on, "
                     "as Megatron-LM requires)");
  if (c.delay_wgrad && !(c.ep_overlap && c.framework == "megatron"))
    throw InputError("delay_wgrad = on (Megatron's delay_wgrad_compute: needs ep_overlap on and framework megatron, as "
                     "Megatron-Core requires overlap_moe_expert_parallel_comm)");
  r.options.delay_wgrad = c.delay_wgrad;
  r.options.reshard_weights = c.reshard_weights;
  if (c.optimizer_offload == "device") r.options.optimizer_offload = OptimizerOffload::device;
  else if (c.optimizer_offload == "host") r.options.optimizer_offload = OptimizerOffload::host;
  else if (c.optimizer_offload != "off")
    throw InputError("optimizer_offload = " + quote(c.optimizer_offload) + " (expected off, device or host)");
  r.options.parameter_offload = c.parameter_offload;
  if (r.options.optimizer_offload != OptimizerOffload::off || c.parameter_offload) {
    // What is offloaded must fit in the pinned host memory a GPU has, before anything else goes there (with
    // the CPU update, the gradient partition it reads as well).
    const bool host_update = r.options.optimizer_offload == OptimizerOffload::host;
    double worst = 0;
    for (const auto& st : r.graph.stages)
      worst = std::max(worst, (r.options.optimizer_offload != OptimizerOffload::off ? st.optimizer_bytes : 0) +
                                  (host_update ? st.gradient_bytes : 0) + (c.parameter_offload ? st.parameter_bytes : 0));
    if (worst > r.system.host_capacity_bytes()) {
      const std::string field = c.parameter_offload ? "parameter_offload = true" : "optimizer_offload = " + c.optimizer_offload;
      const bool state = r.options.optimizer_offload != OptimizerOffload::off;
      const std::string what = host_update && c.parameter_offload ? "the optimizer state, gradients and parameters"
                               : state && c.parameter_offload     ? "the optimizer state and parameters"
                               : host_update                      ? "the optimizer state and gradients"
                               : state                            ? "the optimizer state"
                                                                  : "the parameters";
      throw InputError(field + " (" + what + ", " + format_number(worst / 1073741824.0) + " GiB per GPU, " +
                       (c.parameter_offload || host_update ? "exceed" : "exceeds") + " the pinned host memory per GPU, " +
                       format_number(r.system.host_capacity_bytes() / 1073741824.0) + " GiB)");
    }
  }
  return r;
}

StepReport run_simulation(const RunConfig& c, bool trace, const Profile* extra) {
  auto r = prepare_run(c, extra);
  r.options.record_trace = trace;
  return simulate(r.graph, r.system, r.policy, r.options);
}

}  // namespace hbmsim
