#include "planner/layout_search.hpp"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <sstream>

#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/sweep.hpp"
#include "sim/bounds.hpp"
#include "sim/layer_plan.hpp"
#include "sim/pipeline_schedule.hpp"
#include "sim/simulator.hpp"
#include "workloads/pipeline_split.hpp"

namespace hbmsim {

namespace {

// The deepest interleaving searched: published recipes go up to 8 virtual stages per rank (Llama 3.1 405B at pp 8
// or 16 with vp 8, PUBLISHED_RUNS.md), and deeper chunks only add sends for a bubble already small.
constexpr std::int64_t kMaxInterleaving = 8;

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Sequences per step when the base config gives none: one per GPU.
std::int64_t search_global_batch(const RunConfig& base) { return base.global_batch > 0 ? base.global_batch : base.gpus; }

// The data axes for `rest` GPUs per (tp, cp, pp, ep) group: FSDP over all of them; data parallel with the
// optimizer state sharded over it (Megatron's distributed optimizer, ZeRO-1); and, when it differs from both,
// FSDP within the scale-up domain and data parallel across (hybrid sharding). `whole_weights` (Muon, which
// Megatron refuses with FSDP): data parallel only.
struct DataAxes {
  std::int64_t fsdp, dp;
  bool sharded_optimizer;
};
std::vector<DataAxes> data_axes(std::int64_t rest, std::int64_t model_parallel, std::int64_t domain_gpus, bool whole_weights) {
  if (whole_weights) return {{1, rest, rest > 1}};
  std::vector<DataAxes> out = {{rest, 1, false}};
  if (rest > 1) out.push_back({1, rest, true});
  std::int64_t f = 1;
  while (f * 2 <= rest && rest % (f * 2) == 0 && model_parallel * f * 2 <= domain_gpus) f *= 2;
  if (f > 1 && f < rest) out.push_back({f, rest / f, false});
  return out;
}

// Whether `field` is unheld, or held with `value` among its values.
bool allows(const LayoutSearchOptions& o, const std::string& field, std::int64_t value) {
  const auto it = o.held.find(field);
  return it == o.held.end() || std::find(it->second.begin(), it->second.end(), value) != it->second.end();
}

// The data axes with any of fsdp, dp and sharded_optimizer held: every split of `rest` the held values allow (the
// sharded optimizer only where dp > 1), or, with only the sharded optimizer held, data_axes's that it allows.
std::vector<DataAxes> held_data_axes(std::vector<DataAxes> searched, std::int64_t rest, const LayoutSearchOptions& o) {
  if (o.held.count("fsdp") || o.held.count("dp")) {
    searched.clear();
    for (std::int64_t f = 1; f <= rest; ++f)
      if (rest % f == 0)
        for (bool so : {false, true})
          if (!so || rest / f > 1) searched.push_back({f, rest / f, so});
  }
  std::erase_if(searched, [&](const DataAxes& d) {
    return !allows(o, "fsdp", d.fsdp) || !allows(o, "dp", d.dp) || !allows(o, "sharded_optimizer", d.sharded_optimizer ? 1 : 0);
  });
  return searched;
}

// A config's degrees in mesh-axis order: (field, value).
std::vector<std::pair<std::string, std::int64_t>> degrees(const RunConfig& c) {
  return {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"vp", c.vp}, {"ep", c.ep}, {"fsdp", c.fsdp}, {"dp", c.dp}};
}

// A candidate's degrees in words: "tp 4 x pp 8 x fsdp 32" (the ones above 1; "one GPU" when none).
std::string degrees_text(const RunConfig& c) {
  std::string out;
  for (const auto& [name, value] : degrees(c))
    if (value > 1) out += (out.empty() ? "" : " x ") + name + " " + str(value);
  return out.empty() ? "one GPU" : out;
}

// The values a search tries for a degree: `searched`, or the held ones.
std::vector<std::int64_t> axis(const LayoutSearchOptions& o, const std::string& field, std::vector<std::int64_t> searched) {
  const auto it = o.held.find(field);
  return it == o.held.end() ? searched : it->second;
}

// Bytes a layer keeps on device per micro-batch under its policy: what the simulation keeps (its input, and
// every tensor placed on device at its kept size).
double kept_bytes(const LayerTemplate& t, const Policy& policy, const StepGraph& g) {
  TemplatePlan p;
  place_tensors(t, policy, p.placement, p.needed_in_bwd, p.producer);
  plan_kept_bytes(t, g, p);
  double bytes = 0;
  for (std::size_t k = 0; k < t.tensors.size(); ++k)
    if (p.placement[k] == Placement::device) bytes += p.kept_bytes[k];
  return bytes;
}

// Expert tensor parallelism to try: as tp (0) always; also 1, Megatron's MoE parallel folding (experts whole
// over an expert group that spans tp and cp), for an MoE model under Megatron's state or when the base asks for it.
// With expert_tp 1 given, every layout with tp > 1 folds.
std::vector<std::int64_t> expert_tp_choices(const RunConfig& base, const ModelSpec& model) {
  if (model.num_experts == 0) return {0};
  if (base.expert_tp == 1) return {1};
  return base.framework == "megatron" ? std::vector<std::int64_t>{0, 1} : std::vector<std::int64_t>{0};
}

// The expert groups a folded layout tries: ep_axis x tp x cp GPUs; with no ep axis carved out and cp > 1, also
// tp x k for every k dividing cp below it (the group inside tp x cp, as Megatron's ep 8 at tp 4 x cp 4).
std::vector<std::int64_t> folded_groups(std::int64_t tp, std::int64_t cp, std::int64_t ep_axis, bool inside) {
  std::vector<std::int64_t> groups;
  if (inside && ep_axis == 1)
    for (std::int64_t k = 1; k < cp; ++k)
      if (cp % k == 0) groups.push_back(tp * k);
  groups.push_back(ep_axis * tp * cp);
  return groups;
}

// Combined 1F1B to try: off always; also on for an MoE model under Megatron's state; only on when the base
// sets it. Tried only where Megatron allows it (layout_candidates).
std::vector<bool> ep_overlap_choices(const RunConfig& base, const ModelSpec& model) {
  if (model.num_experts == 0) return {false};
  if (base.ep_overlap) return {true};
  return base.framework == "megatron" ? std::vector<bool>{false, true} : std::vector<bool>{false};
}

bool is_offload_queue(const std::string& q) { return q == "d2h" || q == "h2d"; }

// Where a layout that cannot fit keeps its state instead, in the order tried: (optimizer_offload,
// parameter_offload). Megatron has one of them, its CPU optimizer (--optimizer-cpu-offload: the update on the
// host); MaxText streams the state through HBM for the GPU update or updates it on the host, and can keep the
// parameters there too.
const std::vector<std::pair<std::string, bool>>& state_offload_retries(const RunConfig& base) {
  static const std::vector<std::pair<std::string, bool>> maxtext = {{"device", false}, {"host", false}, {"device", true}, {"host", true}},
                                                         megatron = {{"host", false}};
  return base.framework == "megatron" ? megatron : maxtext;
}

}  // namespace

bool set_pipeline_split(RunConfig& c, std::int64_t layers) {
  const std::int64_t chunks = c.pp * c.vp;
  c.embedding_as_layer = c.loss_as_layer = false;
  c.pipeline_layout.clear();
  if (layers % chunks == 0 && chunks <= layers) return true;
  // MaxText's pipeline takes only even splits (stages x repeats x layers per stage = layers, configs/types.py);
  // Megatron also counts the embedding and loss as layers, or takes a pipeline layout.
  if (c.framework != "megatron" || c.pp == 1) return false;
  if ((layers + 2) % chunks == 0 && chunks <= layers + 2) {
    c.embedding_as_layer = c.loss_as_layer = true;
    return true;
  }
  c.pipeline_layout = ceil_pipeline_layout(layers, chunks, c.mtp_layers);
  return !c.pipeline_layout.empty();
}

std::vector<std::string> default_layout_policies(const RunConfig& base) {
  if (base.framework != "megatron")
    return {"full", "minimal", "save_qkv_proj", "minimal_with_context", "qkv_proj_offloaded", "minimal_offloaded"};
  std::vector<std::string> out = {"no_recompute", "selective", "full"};
  // The module sets published Megatron recipes use (the MoE zoo's "norm, act" and long-context "layernorm moe",
  // Megatron-Bridge's DeepSeek-V3 mla_up_proj), where the model has them.
  const ModelSpec model = resolve_model(base.model);
  auto has = [&](const char* module) { return !find_recompute_module(module)->tensors_in(model).empty(); };
  if (has("moe_act") && has("layernorm")) out.push_back("no_recompute+moe_act+layernorm");
  if (has("moe") && has("layernorm")) out.push_back("no_recompute+moe+layernorm");
  if (has("mla_up_proj")) out.push_back("no_recompute+mla_up_proj");
  return out;
}

RunConfig with_layout_policy(RunConfig c, const std::string& policy, const ModelSpec& model) {
  const auto plus = policy.find('+');
  c.policy = policy.substr(0, plus);
  (void)make_policy(c.policy);  // an unknown preset names policy
  if (plus == std::string::npos) return c;
  if (!keeps_backward_inputs(c.policy))
    throw InputError("policies = " + quote(policy) + " (recompute modules follow no_recompute or selective)");
  std::size_t start = plus + 1;
  while (start <= policy.size()) {
    const auto next = policy.find('+', start);
    const std::string name = policy.substr(start, next == std::string::npos ? std::string::npos : next - start);
    start = next == std::string::npos ? policy.size() + 1 : next + 1;
    const RecomputeModule* m = find_recompute_module(name);
    if (!m) {
      std::string list;
      for (const auto& k : megatron_recompute_modules()) list += (list.empty() ? "" : ", ") + std::string(k.name);
      throw InputError("policies = " + quote(policy) + " (unknown recompute module " + quote(name) + "; expected " + list + ")");
    }
    const auto tensors = m->tensors_in(model);
    if (tensors.empty())
      throw InputError("policies = " + quote(policy) + " (" + model.name + " has nothing module " + name + " recomputes)");
    for (const auto& t : tensors) c.tensors.emplace(t, "remat");  // a placement the config gives wins
  }
  return c;
}

std::string layout_policy_label(const RunConfig& c) {
  if (c.tensors.empty()) return c.policy;
  const auto modules = selective_recompute_modules(c);
  if (!modules) return c.policy + "*";
  std::string out = c.policy;
  std::istringstream words(*modules);
  for (std::string m; words >> m;)
    if (!(c.policy == "selective" && m == "core_attn")) out += "+" + m;  // selective is core_attn already
  return out;
}

std::vector<RunConfig> layout_candidates(const RunConfig& base, const LayoutSearchOptions& o) {
  const std::vector<std::string> policies = o.policies.empty() ? default_layout_policies(base) : o.policies;
  const ModelSpec model = resolve_model(base.model);
  const System sys = resolve_run_system(base);
  const std::int64_t G = search_global_batch(base), L = model.num_layers;
  std::vector<std::int64_t> eps = {1};  // the mesh's expert axis: GPUs carved out of data parallelism
  if (model.num_experts > 0)
    for (std::int64_t e : {8, 16, 32, 64})
      if (model.num_experts % e == 0) eps.push_back(e);
  // A held ep is the layout's whole expert group: an axis of its own, or folded over tp (and cp) from a smaller one.
  for (std::int64_t e : axis(o, "ep", {}))
    if (std::find(eps.begin(), eps.end(), e) == eps.end()) eps.push_back(e);
  const std::vector<std::int64_t> etps = expert_tp_choices(base, model);
  // Experts folded over cp too need cp ranks holding the other weights whole (Megatron's reading); inside tp x cp,
  // ep ranks too.
  const LayoutReading reading = folded_layout_reading(base);
  const bool folds_over_cp = !reading.cp_shards_weights, folds_inside_cp = folds_over_cp && !reading.ep_shards_weights;
  const std::vector<bool> overlaps = ep_overlap_choices(base, model);
  // Each policy read once (preset and tensors); Megatron's combined 1F1B takes no full recompute, no activation
  // offload and no recomputed MoE module.
  std::vector<RunConfig> chosen;
  std::vector<char> overlappable;
  for (const std::string& policy : policies) {
    const RunConfig& c = chosen.emplace_back(with_layout_policy(base, policy, model));
    overlappable.push_back(c.policy != "full" && !make_policy(c.policy, c.tensors).offloads_any() && base.offload_layers == 0 &&
                           base.recompute_layers == 0 && !recomputes_moe_module(c, model));
  }
  std::vector<RunConfig> out;
  // A layout with the search's batch, data-axes and policy fields set.
  auto add = [&](RunConfig c, const DataAxes& d, std::int64_t mbs, const RunConfig& policy) {
    c.fsdp = d.fsdp, c.dp = d.dp, c.sharded_optimizer = d.sharded_optimizer;
    c.batch.reset();
    c.grad_accum = 1;
    c.micro_batch = mbs;
    c.global_batch = G;
    c.microbatches = 0;
    c.stage_policies.clear();
    c.policy = policy.policy;
    c.tensors = policy.tensors;
    out.push_back(std::move(c));
  };
  // A layout over every data-axes split, micro-batch, policy and overlap choice; `group`: the GPUs of one replica.
  auto add_batches = [&](RunConfig& layout, std::int64_t group) {
    const std::int64_t tp = layout.tp, cp = layout.cp;
    const std::int64_t rest = base.gpus / group;
    for (const DataAxes& d : held_data_axes(data_axes(rest, tp * cp, sys.scale_up.domain_gpus, base.optimizer == "muon"), rest, o))
      for (std::int64_t mbs : o.micro_batches) {
        // Megatron merges passes with experts over ep > 1 and, pipelined, interleaved; without pipelining a
        // micro-batch's backward with the next one's forward, so it needs two of them.
        const bool mergeable = layout.ep > 1 && (layout.pp > 1 ? layout.vp > 1 : G > mbs * (base.gpus / (tp * cp)));
        for (std::size_t k = 0; k < policies.size(); ++k)
          for (bool overlap : overlaps) {
            if (overlap && !(mergeable && overlappable[k])) continue;
            layout.ep_overlap = overlap;
            // Megatron-Bridge's moe_a2a_overlap turns on both (overrides.py); MaxText's reading has neither.
            layout.delay_wgrad = overlap && base.framework == "megatron";
            add(layout, d, mbs, chosen[k]);
          }
      }
  };
  const bool cp_held = o.held.count("cp") > 0;
  std::vector<std::int64_t> interleavings;
  for (std::int64_t vp = 1; vp <= kMaxInterleaving; ++vp) interleavings.push_back(vp);
  for (std::int64_t tp : axis(o, "tp", {1, 2, 4, 8}))
    for (std::int64_t cp : axis(o, "cp", {1, 2, 4}))
      for (std::int64_t pp : axis(o, "pp", {1, 2, 4, 8, 16}))
        for (std::int64_t vp : axis(o, "vp", interleavings))
          for (std::int64_t ep_axis : eps)
            for (std::int64_t etp : etps) {
              // (vp > 1 at a held pp 1 is left to the simulation's refusal, which says why)
              if ((pp == 1 && vp > 1 && !o.held.count("pp")) || (cp > 1 && base.seq / cp < 2048 && !cp_held)) continue;
              // Folding puts whole experts over an expert group of ep_axis x tp x cp GPUs (needs tp > 1), or,
              // with no ep axis carved out, over tp and a part of cp (tp x k of the cp ranks, k dividing cp).
              const bool fold = etp == 1 && tp > 1;
              if (etp == 1 && !fold && etps.size() > 1) continue;  // at tp 1 the folded layout is the plain one
              if (fold && cp > 1 && !folds_over_cp) continue;
              const std::int64_t group = tp * cp * pp * ep_axis;
              if (base.gpus % group != 0) continue;
              for (std::int64_t ep : fold ? folded_groups(tp, cp, ep_axis, folds_inside_cp) : std::vector<std::int64_t>{ep_axis}) {
                if ((fold && model.num_experts % ep != 0) || !allows(o, "ep", ep)) continue;
                RunConfig layout = base;
                layout.tp = tp, layout.cp = cp, layout.pp = pp, layout.vp = vp;
                layout.ep = ep;
                layout.expert_tp = fold ? 1 : 0;
                layout.first_stage_layers = layout.last_stage_layers = 0;
                if (!set_pipeline_split(layout, L)) break;  // no split of the layers into pp x vp chunks, whatever ep
                add_batches(layout, group);
              }
            }
  return out;
}

double hbm_lower_bound_bytes(const PreparedRun& run) {
  const StepGraph& g = run.graph;
  const Parallelism& p = g.training.parallelism;
  // Each stage's passes in order: when its first backward starts, every chunk forward it ran before is alive
  // (1F1B's p - s micro-batches; interleaved 1F1B's (p - s - 1) x 2 + (v - 1) x p + 1 chunks, more than p - s
  // micro-batches' worth; GPipe's every micro-batch; one without pipelining). A forward merged with that
  // backward (combined 1F1B) has only started.
  const auto tables = pipeline_schedule(p.schedule, static_cast<int>(p.pp), static_cast<int>(p.vp), static_cast<int>(g.training.grad_accum),
                                        run.options.ep_overlap);
  double bound = 0;
  for (std::size_t s = 0; s < g.stages.size(); ++s) {
    const auto& st = g.stages[s];
    std::vector<double> chunk_act;  // kept activations of one micro-batch, per chunk the stage holds
    for (int k : st.chunks) {
      const PipelineChunk& c = g.chunks[static_cast<std::size_t>(k)];
      double act = 0;
      for (std::int64_t l = c.first_layer; l < c.end_layer; ++l) act += kept_bytes(g.layer(l), run.policy.for_layer(l, s), g);
      chunk_act.push_back(act);
    }
    double held = 0;
    for (const PipelineTask& t : tables[s]) {
      if (t.pass != Pass::forward) break;
      if (!t.merged_with_next) held += chunk_act[static_cast<std::size_t>(t.chunk)];
    }
    const double optimizer = run.options.optimizer_offload == OptimizerOffload::off ? st.optimizer_bytes : 0;
    const double parameters = run.options.parameter_offload ? 0 : st.parameter_bytes;
    bound = std::max(bound, parameters + st.gradient_bytes + optimizer + run.system.runtime.reserve_bytes + held);
  }
  return bound;
}

std::string limiting_resource(const StepReport& r) {
  if (!r.fits) return r.fits_reason;
  std::string what;
  double worst = 0;
  for (const auto& [q, s] : r.exposed_s)
    if (s > worst) {
      worst = s;
      what = q == "pp" ? "pipeline bubble" : is_offload_queue(q) ? "host link (" + q + ")" : q + " collectives";
    }
  // A compute-bound step that spends a share of it recomputing may go faster with offload instead: say how much.
  const auto recompute = r.compute_s.find("recompute");
  const double rerun = recompute == r.compute_s.end() ? 0 : recompute->second / r.step_time_s;
  std::string out = worst < 0.05 * r.step_time_s
                        ? "compute (MFU " + fixed(100 * r.mfu, 1) + "%" + (rerun >= 0.005 ? ", recompute " + fixed(100 * rerun, 0) + "% of the step" : "") + ")"
                        : what + " " + fixed(worst, 2) + " s exposed (" + fixed(100 * worst / r.step_time_s, 0) + "% of the step)";
  if (r.hbm_peak_bytes > 0.95 * r.hbm_capacity_bytes)
    out += "; HBM " + fixed(100 * r.hbm_peak_bytes / r.hbm_capacity_bytes, 0) + "% full";
  return out;
}

void check_layout_options(const LayoutSearchOptions& o, const LayoutOptionNames& names) {
  check_jobs(o.jobs, names.jobs);
  if (o.top < 1) throw InputError(names.top + " = " + std::to_string(o.top) + " (must be at least 1)");
  for (auto m : o.micro_batches)
    if (m < 1) throw InputError(names.micro_batches + " " + std::to_string(m) + " (must be at least 1)");
  if (auto m = first_repeat(o.micro_batches); m != o.micro_batches.end())
    throw InputError(names.micro_batches + " " + std::to_string(*m) + " (given twice)");
  if (auto p = first_repeat(o.policies); p != o.policies.end()) throw InputError(names.policies + " " + *p + " (given twice)");
  const auto& holdable = holdable_layout_fields();
  for (const auto& [field, values] : o.held) {
    if (std::find(holdable.begin(), holdable.end(), field) == holdable.end())
      throw InputError("held = " + quote(field) + " (the search holds only tp, cp, pp, vp, ep, fsdp, dp and sharded_optimizer)");
    if (values.empty()) throw InputError(field + " = [] (no value to hold)");
    if (auto v = first_repeat(values); v != values.end()) throw InputError(field + " = " + str(*v) + " (given twice)");
  }
}

std::string held_text(const nlohmann::json& held) {
  auto text = [](const nlohmann::json& v) { return v.is_boolean() ? std::string(v.get<bool>() ? "on" : "off") : str(v.get<std::int64_t>()); };
  std::string out;
  for (const auto& field : holdable_layout_fields()) {
    const auto it = held.find(field);
    if (it == held.end()) continue;
    std::string values;
    for (const auto& v : it->is_array() ? *it : nlohmann::json::array({*it})) values += (values.empty() ? "" : " or ") + text(v);
    out += (out.empty() ? "" : ", ") + field + " " + values;
  }
  return out;
}

nlohmann::json held_fields(const LayoutSearchOptions& o) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& field : holdable_layout_fields()) {
    const auto it = o.held.find(field);
    if (it == o.held.end()) continue;
    nlohmann::json values = nlohmann::json::array();
    for (std::int64_t v : it->second) values.push_back(field == "sharded_optimizer" ? nlohmann::json(v != 0) : nlohmann::json(v));
    out[field] = values.size() == 1 ? values[0] : values;
  }
  return out;
}

const std::vector<std::string>& holdable_layout_fields() {
  static const std::vector<std::string> fields = {"tp", "cp", "pp", "vp", "ep", "fsdp", "dp", "sharded_optimizer"};
  return fields;
}

void check_held_layout(const RunConfig& base, const LayoutSearchOptions& o) {
  std::int64_t product = 1;
  std::string named;
  bool single = true;
  for (const auto& field : holdable_layout_fields()) {
    const auto it = o.held.find(field);
    if (it == o.held.end() || field == "sharded_optimizer") continue;
    // vp counts chunks per rank and ep may fold over tp and cp: neither takes GPUs of its own here.
    const bool takes_gpus = field != "vp" && field != "ep";
    for (std::int64_t value : it->second) {
      if (value < 1) throw InputError(field + " = " + str(value) + " (a degree the search holds must be at least 1)");
      if (takes_gpus && base.gpus % value != 0)
        throw InputError(field + " = " + str(value) + " (it does not divide the " + str(base.gpus) + " GPUs)");
    }
    if (!takes_gpus) continue;
    single = single && it->second.size() == 1;
    product *= it->second.front();
    named += (named.empty() ? "" : " x ") + field + " " + str(it->second.front());
    if (single && base.gpus % product != 0)
      throw InputError(field + " = " + str(it->second.front()) + " (the held degrees " + named + " = " + str(product) + " do not divide the " +
                       str(base.gpus) + " GPUs)");
  }
}

LayoutSearch search_layouts(const RunConfig& base, const LayoutSearchOptions& o) {
  check_layout_options(o);
  check_held_layout(base, o);
  LayoutSearch out;
  out.global_batch = search_global_batch(base);
  out.held = held_fields(o);
  const std::vector<RunConfig> all = layout_candidates(base, o);
  out.candidates = all.size();
  const double capacity = resolve_run_system(base).gpu.hbm_bytes;
  // Bounds first, without simulating: a candidate whose HBM lower bound exceeds capacity cannot fit; the
  // others are simulated fastest bound first. Candidates hbmsim refuses are counted, not simulated.
  struct Bounded {
    const RunConfig* config;
    double step_s;
  };
  std::vector<Bounded> queue;
  double closest_bound = 0;
  const RunConfig* closest = nullptr;
  std::deque<RunConfig> variants;  // state-offload retries (a deque: the queue points into it)
  // Megatron offloads Adam's state only: a Muon base is not retried.
  const bool retry = o.state_offload && base.optimizer_offload == "off" && !base.parameter_offload && base.optimizer != "muon";
  std::map<std::string, std::size_t> refusals;  // why candidates were refused, and how many for each reason
  // Bounds a candidate and queues it unless its bound exceeds HBM or hbmsim refuses it.
  enum class Verdict { queued, over, refused };
  auto consider = [&](const RunConfig& c) {
    double hbm = 0, step = 0;
    try {
      const PreparedRun run = prepare_run(c);
      hbm = hbm_lower_bound_bytes(run);
      step = o.prune ? step_lower_bound(run.graph, run.system, run.policy, run.options).step_s : 0;
    } catch (const InputError& e) {
      ++out.refused;
      ++refusals[e.what()];
      return Verdict::refused;
    }
    if (hbm > capacity) {
      if (!closest || hbm < closest_bound) closest_bound = hbm, closest = &c;
      if (o.prune) {
        ++out.pruned;
        return Verdict::over;
      }
    }
    queue.push_back({&c, step});  // without pruning, also what cannot fit (the answer is the same)
    return hbm > capacity ? Verdict::over : Verdict::queued;
  };
  // A layout that cannot fit (by its bound, or simulated) is tried again with its state off the GPU: the retries
  // in order from `from` on, up to the first whose bound fits. Per queued config, the retry to try after it (a
  // layout whose bound fits may still not fit simulated: its state and the HBM the bound leaves out).
  const auto& retries = state_offload_retries(base);
  std::map<const RunConfig*, std::pair<const RunConfig*, std::size_t>> next_retry;  // config -> (layout, retry)
  auto try_retries = [&](const RunConfig& layout, std::size_t from, double at_least_s) {
    const std::size_t queued_before = queue.size();
    for (std::size_t k = from; k < retries.size(); ++k) {
      RunConfig& v = variants.emplace_back(layout);
      v.optimizer_offload = retries[k].first;
      v.parameter_offload = retries[k].second;
      ++out.candidates;
      if (consider(v) == Verdict::queued) {
        next_retry[&v] = {&layout, k + 1};
        break;
      }
    }
    // A retry keeps its layout's GPU compute, or moves the optimizer's update to the host after the last gradient,
    // where it takes longer (host memory bandwidth per GPU is far below HBM's on every system shipped), so its step
    // is no shorter than its layout's bound: queued no earlier, and a layout the search stops before needs no retry
    // for the answer to be exact.
    for (std::size_t i = queued_before; i < queue.size(); ++i) queue[i].step_s = std::max(queue[i].step_s, at_least_s);
  };
  for (const RunConfig& c : all) {
    const Verdict verdict = consider(c);
    if (verdict == Verdict::queued) next_retry[&c] = {&c, 0};
    if (verdict != Verdict::over || !retry) continue;
    ++out.offloaded;
    try_retries(c, 0, 0);
  }
  auto by_bound = [](const Bounded& a, const Bounded& b) { return a.step_s < b.step_s; };
  std::stable_sort(queue.begin(), queue.end(), by_bound);
  // Every candidate has the same tokens per step, so the fastest step wins. Simulate in slices; stop once the
  // top list is full and its slowest member is no slower than the next candidate's bound (branch and bound).
  std::vector<LayoutResult> fitting;
  StepReport nearest;
  bool any = false;
  // A pruned search needs of a layout that cannot fit only that it does not: its run stops once HBM is over
  // capacity (the retries and the answer are the same; 40% of a Megatron search's time, where two thirds of what
  // is simulated does not fit). Those runs are kept to say, if nothing fits, which layout came closest (then run
  // in full).
  std::vector<const RunConfig*> stopped;
  auto simulate_point = [&](const RunConfig& c) {
    PreparedRun run = prepare_run(c);
    if (o.prune && o.stop_early) run.options.stop_above_hbm_bytes = run.system.gpu.hbm_bytes;
    return simulate(run.graph, run.system, run.policy, run.options);
  };
  auto note_nearest = [&](const StepReport& r) {
    if (!any || r.hbm_peak_bytes < nearest.hbm_peak_bytes) {
      nearest = r;
      any = true;
    }
  };
  std::size_t done = 0, next = 0;
  std::vector<std::size_t> overflowed;  // the slice's points simulated over HBM
  const auto top = static_cast<std::size_t>(o.top);  // (at least 1: checked above)
  auto kth_step = [&] {
    std::vector<double> steps;
    for (const auto& f : fitting) steps.push_back(f.report.step_time_s);
    std::nth_element(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(top - 1), steps.end());
    return steps[top - 1];
  };
  // A fixed slice (not one per thread) keeps the counts the same whatever the thread count.
  const std::size_t slice = 16;
  while (next < queue.size()) {
    if (o.prune && fitting.size() >= top && kth_step() <= queue[next].step_s) break;
    std::vector<SweepPoint> points;
    std::vector<Bounded> sources;
    for (; next < queue.size() && points.size() < slice; ++next) {
      sources.push_back(queue[next]);
      points.push_back({points.size(), {}, *queue[next].config});
    }
    run_sweep(points, o.jobs, [&](const SweepRow& row) {
      if (!row.report) {
        ++out.refused;
      } else {
        ++out.simulated;
        const StepReport& r = *row.report;
        if (r.fits) {
          ++out.fitting;
          fitting.push_back({points[row.index].config, r, limiting_resource(r)});
        } else {
          if (r.stopped) stopped.push_back(sources[row.index].config);
          else note_nearest(r);
          if (retry && r.hbm_peak_bytes > r.hbm_capacity_bytes) overflowed.push_back(row.index);
        }
      }
      if (o.progress) o.progress(++done, queue.size());
    }, {}, simulate_point);
    // Retries of what did not fit in HBM join the queue in bound order (so the stop test above still holds), taken
    // in the slice's order whatever order the threads finished in.
    if (overflowed.empty()) continue;
    std::sort(overflowed.begin(), overflowed.end());
    for (std::size_t i : overflowed) {
      const Bounded& b = sources[i];
      const auto it = next_retry.find(b.config);  // none: retried by its bound already (an unpruned search queues it)
      if (it == next_retry.end()) continue;
      const auto [layout, from] = it->second;
      if (from == 0) ++out.offloaded;
      try_retries(*layout, from, b.step_s);
    }
    overflowed.clear();
    std::stable_sort(queue.begin() + static_cast<std::ptrdiff_t>(next), queue.end(), by_bound);
  }
  out.skipped = queue.size() - next;
  // Fastest first; ties (equal tokens/s) by lower HBM, then by enumeration order for a stable answer.
  std::stable_sort(fitting.begin(), fitting.end(), [](const LayoutResult& a, const LayoutResult& b) {
    if (a.report.tokens_per_s_per_device != b.report.tokens_per_s_per_device)
      return a.report.tokens_per_s_per_device > b.report.tokens_per_s_per_device;
    if (a.report.hbm_peak_bytes != b.report.hbm_peak_bytes) return a.report.hbm_peak_bytes < b.report.hbm_peak_bytes;
    return config_id(a.config) < config_id(b.config);
  });
  if (fitting.size() > top) fitting.resize(top);
  out.top = std::move(fitting);
  if (out.top.empty() && !stopped.empty()) {  // the closest of the runs that stopped early, run in full
    std::vector<SweepPoint> points;
    for (const RunConfig* c : stopped) points.push_back({points.size(), {}, *c});
    run_sweep(points, o.jobs, [&](const SweepRow& row) {
      if (row.report) note_nearest(*row.report);
    });
  }
  if (out.top.empty()) {
    if (any) out.none_fit = "nothing fits; the closest simulated candidate (" + nearest.mesh + ", policy " + nearest.policy + "): " +
                            nearest.fits_reason + ", " + fixed(nearest.hbm_peak_bytes / 1073741824.0, 1) + " of " +
                            fixed(capacity / 1073741824.0, 1) + " GiB HBM";
    else if (closest) out.none_fit = "nothing fits; every candidate needs more HBM than " + fixed(capacity / 1073741824.0, 1) +
                                     " GiB before simulating (the least: " + fixed(closest_bound / 1073741824.0, 1) + " GiB, " +
                                     degrees_text(*closest) + ", micro-batch " + str(closest->micro_batch) + ", policy " +
                                     layout_policy_label(*closest) +
                                     (closest->optimizer_offload == "off" ? "" : ", optimizer state in host memory") +
                                     (closest->parameter_offload ? ", parameters in host memory" : "") + ")";
    else if (all.empty()) {
      const std::string held = held_text(out.held);
      const std::string split = base.framework == "megatron" ? "a pipeline's pp x vp chunks must split its " + str(resolve_model(base.model).num_layers) + " layers"
                                                             : "MaxText's pipeline splits its " + str(resolve_model(base.model).num_layers) +
                                                                   " layers evenly over pp x vp chunks; --framework megatron also unevenly";
      out.none_fit = "no candidate layout: none of the search's layouts of " + str(base.gpus) + " GPUs has " + held + " (" + split + ")";
    } else {
      // Say the most common reason: a base setting no layout can take shows as every candidate's.
      auto most = std::max_element(refusals.begin(), refusals.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
      out.none_fit = "no candidate layout: every combination was refused (GPUs " + str(base.gpus) + ")" +
                     (most == refusals.end() ? "" : "; the most common reason (" + str(static_cast<std::int64_t>(most->second)) + " of " +
                                                        str(static_cast<std::int64_t>(out.refused)) + "): " + most->first);
    }
  }
  return out;
}

}  // namespace hbmsim
