#include "planner/plan.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "hwmodels/json_view.hpp"
#include "planner/layout_search.hpp"
#include "planner/sweep.hpp"
#include "sim/simulator.hpp"

namespace hbmsim {

namespace {

// The memory a batch that does not fit ran out of, with the figures ("batch 6: pinned host 183.0 > 178.8 GiB").
std::string ran_out(const std::string& batch, const StepReport& r) {
  auto over = [](const char* what, double need, double have) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s %.1f > %.1f GiB", what, need / 1073741824.0, have / 1073741824.0);
    return std::string(buf);
  };
  std::string text;
  if (r.hbm_peak_bytes > r.hbm_capacity_bytes) text = over("HBM", r.hbm_peak_bytes, r.hbm_capacity_bytes);
  if (r.host_peak_bytes > r.host_capacity_bytes)
    text += (text.empty() ? "" : ", ") + over("pinned host", r.host_peak_bytes, r.host_capacity_bytes);
  return batch + ": " + (text.empty() ? r.fits_reason : text);
}

// The configs largest_batch steps through: step k runs k x moe_batch_split sequences per model replica's
// micro-batch, set in the base's own field.
class BatchSteps {
 public:
  explicit BatchSteps(const RunConfig& base) : base_(base), split_(std::max<std::int64_t>(1, base.moe_batch_split)) {
    // Per-device batch form: a replica spans tp x cp x pp devices, and with pp > 1 its step is m micro-batches.
    const std::int64_t m = base.pp > 1 ? (base.microbatches > 0 ? base.microbatches : base.pp) : 1;
    devices_per_sequence_ = static_cast<double>(std::max<std::int64_t>(1, base.tp * base.cp * base.pp)) / static_cast<double>(m);
  }
  bool micro_form() const { return base_.micro_batch > 0; }
  std::int64_t micro_batch(std::int64_t k) const { return k * split_; }
  // The per-device batch at step k.
  double per_device(std::int64_t k) const { return static_cast<double>(micro_batch(k)) / devices_per_sequence_; }
  // The field's value at step k: per-device batch, or micro-batch.
  double value(std::int64_t k) const { return micro_form() ? static_cast<double>(micro_batch(k)) : per_device(k); }
  // The last step whose value is within max_batch.
  std::int64_t max_step(std::int64_t max_batch) const {
    std::int64_t k = static_cast<std::int64_t>(std::floor(static_cast<double>(max_batch) / value(1) + 1e-9));
    while (k > 0 && value(k) > static_cast<double>(max_batch)) --k;
    return k;
  }
  // A global batch given is scaled with the step, keeping the accumulation (micro-batch) count: a step's
  // sequences per replica are whole, so the scaled global batch is too.
  RunConfig config(std::int64_t k) const {
    RunConfig c = base_;
    const double given = micro_form() ? static_cast<double>(base_.micro_batch) : base_.batch.value_or(1.0);
    if (micro_form()) c.micro_batch = micro_batch(k);
    else c.batch = value(k);
    if (base_.global_batch > 0)
      c.global_batch = std::llround(static_cast<double>(base_.global_batch) * value(k) / given);
    return c;
  }
  std::string label(std::int64_t k) const {
    return micro_form() ? "micro-batch " + std::to_string(micro_batch(k)) : "batch " + format_number(value(k));
  }

 private:
  const RunConfig& base_;
  std::int64_t split_;
  double devices_per_sequence_ = 1;  // per-device batch form: devices per sequence of a replica's micro-batch
};

}  // namespace

const Candidate* LargestBatch::answer() const {
  if (micro_batch == 0) return nullptr;
  for (const auto& t : tried)
    if (field == "micro_batch" ? t.config.micro_batch == micro_batch : t.config.batch == batch) return &t;
  return nullptr;
}

double smallest_batch(const RunConfig& base) { return BatchSteps(base).per_device(1); }

LargestBatch largest_batch(const RunConfig& base, std::int64_t max_batch, bool powers_of_two) {
  if (max_batch < 1 || max_batch > kMaxBatch)
    throw InputError("max_batch = " + std::to_string(max_batch) + " (must be in [1, " + std::to_string(kMaxBatch) + "])");
  LargestBatch out;
  const BatchSteps steps(base);
  if (steps.micro_form()) out.field = "micro_batch";
  const std::int64_t max_k = steps.max_step(max_batch);
  std::map<std::int64_t, std::size_t> run;  // step -> its index in out.tried
  auto test = [&](std::int64_t k) {
    auto it = run.find(k);
    if (it == run.end()) {
      RunConfig c = steps.config(k);
      auto r = run_simulation(c);
      out.tried.push_back({std::move(c), std::move(r)});
      it = run.emplace(k, out.tried.size() - 1).first;
    }
    return out.tried[it->second].report.fits;
  };
  // Why a tried step does not fit ("batch 6: pinned host 183.0 > 178.8 GiB").
  auto why = [&](std::int64_t k) { return ran_out(steps.label(k), out.tried[run.at(k)].report); };
  if (max_k < 1) {
    out.stopped = "max_batch " + std::to_string(max_batch) + " is below the smallest candidate, " + format_number(steps.value(1));
    return out;
  }
  if (!test(1)) {
    out.stopped = why(1);
    return out;
  }
  std::int64_t good = 1, bad = 0;
  for (std::int64_t k = 2; k <= max_k; k *= 2) {
    if (test(k)) good = k;
    else { bad = k; break; }
  }
  if (!powers_of_two) {
    if (bad == 0) {
      if (good < max_k && test(max_k)) good = max_k;
      else if (good < max_k) bad = max_k;
    }
    while (bad > good + 1) {
      auto mid = good + (bad - good) / 2;
      if (test(mid)) good = mid;
      else bad = mid;
    }
  }
  out.batch = steps.value(good);
  out.micro_batch = steps.micro_batch(good);
  std::int64_t first_bad = 0;  // the smallest step tried above the answer that does not fit
  for (const auto& [k, i] : run)
    if (!out.tried[i].report.fits && k > good && (first_bad == 0 || k < first_bad)) first_bad = k;
  out.stopped = first_bad > 0 ? why(first_bad) : "reached max_batch " + std::to_string(max_batch);
  return out;
}

VariantSpec split_variant(const std::string& spec) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) throw InputError("--variant " + spec + " (expected LABEL=field:value;field:value)");
  VariantSpec v{spec.substr(0, eq), {}};
  std::string rest = spec.substr(eq + 1);
  std::size_t pos = 0;
  while (pos <= rest.size()) {
    auto end = rest.find(';', pos);
    auto item = rest.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (!item.empty()) {
      auto colon = item.find(':');
      if (colon == std::string::npos) throw InputError("--variant " + spec + " (\"" + item + "\" is not field:value)");
      v.settings.emplace_back(item.substr(0, colon), item.substr(colon + 1));
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return v;
}

std::pair<std::string, RunConfig> parse_variant(const RunConfig& base, const std::string& spec) {
  auto v = split_variant(spec);
  RunConfig c = base;
  for (auto& [field, value] : v.settings) c.set(field, value, "--variant " + spec);
  return {v.label, c};
}

std::vector<std::pair<std::string, RunConfig>> default_variants(const RunConfig& base) {
  std::vector<std::pair<std::string, RunConfig>> out;
  if (!base.tensors.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, where] : base.tensors) names.push_back(name);
    check_search_names(base, names, "--tensor");
    for (auto where : {"device", "remat", "offload"}) {
      RunConfig c = base;
      for (auto& [name, value] : c.tensors) value = where;
      std::string label = std::string(where) + " (";
      bool first = true;
      for (auto& [name, value] : c.tensors) { label += (first ? "" : ",") + name; first = false; }
      out.emplace_back(label + ")", c);
    }
    return out;
  }
  // Megatron's recompute choices under framework megatron (the ones plan layout tries), else MaxText's presets.
  // A Megatron choice may name recompute modules ("no_recompute+moe_act+layernorm"), whose tensors in the model
  // are then remat: the model is needed only there.
  const bool megatron = base.framework == "megatron";
  const std::vector<std::string> policies =
      megatron ? default_layout_policies(base)
               : std::vector<std::string>{"full", "save_qkv_proj", "qkv_proj_offloaded", "minimal", "minimal_offloaded"};
  const ModelSpec model = megatron ? resolve_model(base.model) : ModelSpec{};
  for (const auto& p : policies) out.emplace_back(p, with_layout_policy(base, p, model));
  return out;
}

std::vector<std::string> default_search_names(const RunConfig& base) {
  // The checkpoint names this model's layers actually have, largest first, at most 8.
  auto run = prepare_run(base);
  std::map<std::string, double> bytes;
  for (auto& t : run.graph.templates)
    for (auto& tensor : t.tensors)
      if (tensor.checkpoint && tensor.name != "decoder_layer_input") bytes[tensor.name] += tensor.bytes;
  std::vector<std::pair<double, std::string>> order;
  for (auto& [n, b] : bytes) order.emplace_back(-b, n);
  std::sort(order.begin(), order.end());
  std::vector<std::string> names;
  for (auto& [b, n] : order)
    if (names.size() < 8) names.push_back(n);
  return names;
}

namespace {

// dump_json: a path that is not UTF-8 (the model) must not throw; every key of one search shares it.
std::string key_of(const RunConfig& c) { return dump_json(c.to_json()); }

struct Evaluator {
  int jobs;
  std::map<std::string, Candidate> seen;
  std::vector<std::string> order;

  // Simulates the configs not seen yet (in parallel) and returns their candidates in input order.
  std::vector<const Candidate*> eval(const std::vector<RunConfig>& configs) {
    std::vector<SweepPoint> todo;
    std::vector<std::string> keys, todo_keys;
    std::set<std::string> queued;
    for (auto& c : configs) {
      auto k = key_of(c);
      keys.push_back(k);
      if (!seen.count(k) && queued.insert(k).second) {
        todo.push_back({todo.size(), {}, c});
        todo_keys.push_back(k);
      }
    }
    std::vector<std::optional<StepReport>> results(todo.size());
    std::string error;
    run_sweep(todo, jobs, [&](const SweepRow& row) {
      if (row.report) results[row.index] = row.report;
      else if (error.empty()) error = row.error;
    });
    if (!error.empty()) throw InputError(error);
    for (std::size_t i = 0; i < todo.size(); ++i) {
      seen[todo_keys[i]] = Candidate{todo[i].config, *results[i]};
      order.push_back(todo_keys[i]);
    }
    std::vector<const Candidate*> out;
    for (auto& k : keys) out.push_back(&seen.at(k));
    return out;
  }
};

bool better(const Candidate& a, const Candidate* b) {
  return a.report.fits && (!b || a.report.tflops_per_device > b->report.tflops_per_device);
}

// With pipeline stages the policy may differ per stage (the first stage holds the most micro-batches in
// flight): coordinate descent over one preset per stage, from the base preset on every stage, taking at
// each stage the preset that fits and raises TFLOP/s most, until a round changes nothing.
// Under framework megatron the presets are Megatron's recompute choices.
const Candidate* best_stage_presets(const RunConfig& base, Evaluator& ev) {
  std::vector<std::string> presets;
  if (base.framework == "megatron") {
    // Recompute modules are tensor placements, the same on every stage (as Megatron's --recompute-modules): not a
    // preset one stage can take alone.
    for (const auto& p : default_layout_policies(base))
      if (p.find('+') == std::string::npos) presets.push_back(p);
  } else
    for (const auto& p : policy_presets())
      if (p != "custom") presets.push_back(p);
  std::vector<std::string> current(static_cast<std::size_t>(base.pp), base.policy == "custom" ? "full" : base.policy);
  // One preset on every stage is that preset, with no stage list (the same run, said the plain way).
  auto config_of = [&](const std::vector<std::string>& stages) {
    RunConfig c = base;
    c.tensors.clear();
    c.policy = stages.front();
    c.stage_policies.clear();
    if (std::all_of(stages.begin(), stages.end(), [&](const std::string& st) { return st == stages.front(); })) return c;
    for (const auto& st : stages) c.stage_policies += (c.stage_policies.empty() ? "" : ",") + st;
    return c;
  };
  const Candidate* cur = ev.eval({config_of(current)}).front();
  for (int round = 0; round < 4; ++round) {
    bool moved = false;
    for (std::size_t s = 0; s < current.size(); ++s) {
      std::vector<RunConfig> moves;
      std::vector<std::string> tried;
      for (const auto& p : presets)
        if (p != current[s]) {
          auto next = current;
          next[s] = p;
          moves.push_back(config_of(next));
          tried.push_back(p);
        }
      auto results = ev.eval(moves);
      for (std::size_t i = 0; i < results.size(); ++i)
        if (better(*results[i], cur) || (!cur->report.fits && results[i]->report.fits)) {
          cur = results[i];
          current[s] = tried[i];
          moved = true;
        }
    }
    if (!moved) break;
  }
  return cur;
}

}  // namespace

void check_search_names(const RunConfig& base, const std::vector<std::string>& names, const std::string& flag) {
  if (auto n = first_repeat(names); n != names.end()) throw InputError(flag + " " + *n + " (given twice)");
  RunConfig c = BatchSteps(base).config(1);  // the batch and the placements change no layer's tensors
  c.tensors.clear();
  const StepGraph graph = prepare_run(c).graph;
  for (const auto& n : names)
    if (const std::string why = missing_tensor(graph, n); !why.empty()) throw InputError(flag + " " + n + " (" + why + ")");
}

void check_policy_names(const RunConfig& base, const std::vector<std::string>& names) {
  for (auto& n : names)
    if (!is_checkpoint_name(n) || n == "decoder_layer_input")
      throw InputError("--names " + n + " (not a checkpoint name a policy can place)");
  check_search_names(base, names, "--names");
}

PolicySearch best_policy(const RunConfig& base, const std::vector<std::string>& names, int jobs,
                         std::size_t exhaustive_limit) {
  check_policy_names(base, names);
  PolicySearch out;
  Evaluator ev{jobs, {}, {}};
  static const char* places[] = {"remat", "device", "offload"};
  auto with = [&](const std::map<std::string, std::string>& placement) {
    RunConfig c = base;
    c.policy = "custom";
    c.tensors.clear();
    for (auto& [n, p] : placement)
      if (p != "remat") c.tensors[n] = p;
    // Names outside the search keep what the base config gave them.
    for (auto& [n, p] : base.tensors)
      if (std::find(names.begin(), names.end(), n) == names.end()) c.tensors[n] = p;
    return c;
  };
  const Candidate* best = nullptr;
  double total = std::pow(3.0, static_cast<double>(names.size()));
  if (total <= static_cast<double>(exhaustive_limit)) {
    out.method = "exhaustive over " + std::to_string(static_cast<long>(total)) + " placements";
    std::vector<RunConfig> all;
    for (long i = 0; i < static_cast<long>(total); ++i) {
      std::map<std::string, std::string> pl;
      long rest = i;
      for (auto& n : names) {
        pl[n] = places[rest % 3];
        rest /= 3;
      }
      all.push_back(with(pl));
    }
    for (auto* c : ev.eval(all))
      if (better(*c, best)) best = c;
  } else {
    out.method = "local search (single-name moves from all-remat and from the given placement)";
    std::vector<std::map<std::string, std::string>> starts(2);
    for (auto& n : names) {
      starts[0][n] = "remat";
      auto it = base.tensors.find(n);
      starts[1][n] = it == base.tensors.end() ? "remat" : it->second;
    }
    for (auto& start : starts) {
      auto current = start;
      const Candidate* cur = ev.eval({with(current)}).front();
      for (int round = 0; round < 64; ++round) {
        std::vector<RunConfig> moves;
        std::vector<std::map<std::string, std::string>> placements;
        for (auto& n : names)
          for (auto p : places)
            if (current[n] != p) {
              auto next = current;
              next[n] = p;
              placements.push_back(next);
              moves.push_back(with(next));
            }
        auto results = ev.eval(moves);
        const Candidate* step = nullptr;
        std::size_t pick = 0;
        for (std::size_t i = 0; i < results.size(); ++i)
          if (better(*results[i], step)) { step = results[i]; pick = i; }
        // Accept a move that fits and beats the current point (or makes a non-fitting start fit).
        if (!step || (cur->report.fits && step->report.tflops_per_device <= cur->report.tflops_per_device)) break;
        current = placements[pick];
        cur = step;
      }
      if (better(*cur, best)) best = cur;
    }
  }
  if (base.pp > 1) {
    if (const Candidate* staged = best_stage_presets(base, ev); staged && better(*staged, best)) best = staged;
    out.method += "; then a preset per pipeline stage by coordinate descent";
  }
  for (auto& k : ev.order) out.evaluated.push_back(ev.seen.at(k));
  if (best) {
    out.best = *best;
    out.found = true;
  }
  return out;
}

double host_copies_exposed_s(const StepReport& r) { return r.exposed_s.at("d2h") + r.exposed_s.at("h2d"); }

std::vector<Candidate> pareto_front(const std::vector<Candidate>& points) {
  std::vector<Candidate> sorted;
  for (auto& p : points)
    if (p.report.fits) sorted.push_back(p);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Candidate& a, const Candidate& b) {
    if (a.report.hbm_peak_bytes != b.report.hbm_peak_bytes) return a.report.hbm_peak_bytes < b.report.hbm_peak_bytes;
    return a.report.tflops_per_device > b.report.tflops_per_device;
  });
  std::vector<Candidate> front;
  double best = -1;
  for (auto& p : sorted)
    if (p.report.tflops_per_device > best) {
      front.push_back(p);
      best = p.report.tflops_per_device;
    }
  return front;
}

namespace {

// Whether the config's policy sends any checkpoint name to host memory.
bool offloads_any(const RunConfig& c) { return prepare_run(c).policy.offloads_any(); }

// The config with every offloaded checkpoint name placed `instead` (device or remat), as a custom policy; a
// preset's names the model (`graph`, c's) has no tensor for are left out.
RunConfig offload_as(const RunConfig& c, Placement instead, const StepGraph& graph) {
  const Policy policy = make_policy(c.policy, c.tensors);
  RunConfig out = c;
  out.policy = "custom";
  out.tensors.clear();
  for (const auto& name : checkpoint_names()) {
    const Placement p = policy.placement(name);
    if (missing_tensor(graph, name).empty()) out.tensors[name] = to_string(p == Placement::offload ? instead : p);
  }
  for (const auto& [key, p] : policy.placements)  // NAME@kind: that kind of layer's own placement
    if (key.find('@') != std::string::npos && is_checkpoint_name(split_tensor_key(key).name) && missing_tensor(graph, key).empty())
      out.tensors[key] = to_string(p == Placement::offload ? instead : p);
  return out;
}

}  // namespace

void check_break_even(const RunConfig& offload) {
  if (!offload.layer_policies.empty() || offload.offload_layers > 0 || offload.recompute_layers > 0 || !offload.stage_policies.empty())
    throw InputError("plan break-even: per-layer and per-stage policies are not supported (give one policy for every layer)");
  if (!offloads_any(offload)) throw InputError("plan break-even: the config offloads nothing (use an *_offloaded policy or --tensor NAME=offload)");
}

BreakEven break_even_bandwidth(const RunConfig& offload, double tolerance, double lo, double hi) {
  check_break_even(offload);
  BreakEven out;
  // The alternative a planner would take: on device if it fits, else recompute; offload is worth it only
  // against what could run instead.
  const StepGraph graph = prepare_run(offload).graph;
  RunConfig on_device = offload_as(offload, Placement::device, graph);
  auto device_run = run_simulation(on_device);
  const RunConfig remat = offload_as(offload, Placement::remat, graph);
  if (device_run.fits) {
    out.reference = "the same tensors on device";
    out.reference_config = on_device;
    out.reference_tflops = device_run.tflops_per_device;
  } else if (auto r = run_simulation(remat); r.fits) {
    out.reference = "the same tensors rematerialized (on device does not fit)";
    out.reference_config = remat;
    out.reference_tflops = r.tflops_per_device;
  } else {
    on_device.hbm_bytes = 1e15;
    out.reference = "the same tensors on device, HBM capacity ignored (neither on device nor rematerialized fits)";
    out.reference_config = on_device;
    out.reference_tflops = run_simulation(on_device).tflops_per_device;
  }
  auto at = [&](double bw) {
    RunConfig c = offload;
    c.host_link_bytes_per_s = bw;
    double t = run_simulation(c).tflops_per_device;
    out.curve.emplace_back(bw, t);
    return t;
  };
  const int points = 24;
  double first_ok = 0, last_bad = 0;
  for (int i = 0; i < points; ++i) {
    double bw = lo * std::pow(hi / lo, i / double(points - 1));
    if (at(bw) >= (1 - tolerance) * out.reference_tflops) {
      first_ok = bw;
      break;
    }
    last_bad = bw;
  }
  if (first_ok > 0 && last_bad > 0) {
    for (int i = 0; i < 20; ++i) {  // bisection in log space to about 1%
      double mid = std::sqrt(first_ok * last_bad);
      if (at(mid) >= (1 - tolerance) * out.reference_tflops) first_ok = mid;
      else last_bad = mid;
      if (first_ok / last_bad < 1.005) break;
    }
  }
  out.bytes_per_s = first_ok;
  std::sort(out.curve.begin(), out.curve.end());
  return out;
}

namespace {

// The run at HBM capacity `bytes` (what-if), stopped once HBM goes over it (then only "does not fit" is known).
StepReport at_hbm_capacity(const RunConfig& config, double bytes) {
  RunConfig c = config;
  c.hbm_bytes = bytes;
  PreparedRun run = prepare_run(c);
  run.options.stop_above_hbm_bytes = bytes;
  return simulate(run.graph, run.system, run.policy, run.options);
}

bool hbm_fits(const StepReport& r) { return !r.stopped && r.hbm_peak_bytes <= r.hbm_capacity_bytes; }

// The least capacity in (lo, hi] at which `ok` holds, given that it holds at hi and not at lo, to 0.1%; the
// report at that capacity.
template <class Ok>
std::pair<double, StepReport> least_capacity(const RunConfig& c, double lo, double hi, StepReport at_hi, Ok ok) {
  while (hi / lo > 1.001) {
    const double mid = std::sqrt(lo * hi);
    StepReport r = at_hbm_capacity(c, mid);
    if (ok(r)) {
      hi = mid;
      at_hi = std::move(r);
    } else {
      lo = mid;
    }
  }
  return {hi, std::move(at_hi)};
}

}  // namespace

HbmNeeded hbm_needed(const RunConfig& config) {
  constexpr double kNoObject = 1e15;  // bytes: no step comes near it
  HbmNeeded out;
  out.capacity_bytes = prepare_run(config).system.gpu.hbm_bytes;
  RunConfig c = config;
  c.hbm_bytes = kNoObject;
  out.report = run_simulation(c);
  out.hbm_bytes = out.report.hbm_peak_bytes;
  out.host_bytes = out.report.host_peak_bytes;
  out.step_time_s = out.report.step_time_s;
  out.fits_from_bytes = out.full_speed_from_bytes = out.hbm_bytes;
  out.step_time_at_fit_s = out.step_time_s;
  const double peak = out.hbm_bytes;
  if (!(peak > 0)) return out;
  const auto full_speed = [&](const StepReport& r) { return hbm_fits(r) && r.step_time_s <= out.step_time_s * (1 + 1e-9); };
  // At its own peak the step fits and keeps its time unless a prefetch was held back: then search below and above.
  StepReport at_peak = at_hbm_capacity(config, peak);
  if (!hbm_fits(at_peak)) return out;  // (fitting not monotone in the capacity: a law the suite checks; keep the peak)
  if (!full_speed(at_peak)) {
    double hi = peak;
    StepReport at_hi;
    do {  // up to where the step is as fast as with HBM no object (that capacity itself at the most)
      hi = std::min(2 * hi, kNoObject);
      at_hi = at_hbm_capacity(config, hi);
    } while (!full_speed(at_hi) && hi < kNoObject);
    out.full_speed_from_bytes = least_capacity(config, hi / 2, hi, std::move(at_hi), full_speed).first;
  }
  const StepReport below = at_hbm_capacity(config, peak / 1.001);
  if (!hbm_fits(below)) {
    out.step_time_at_fit_s = at_peak.step_time_s;
    return out;
  }
  double hi = peak / 1.001, lo = hi;
  StepReport at_hi = below, at_lo = below;
  while (hbm_fits(at_lo)) {  // down to a capacity that does not fit (the resident state alone takes some)
    hi = lo;
    at_hi = std::move(at_lo);
    lo /= 2;
    at_lo = at_hbm_capacity(config, lo);
  }
  auto [bytes, at_fit] = least_capacity(config, lo, hi, std::move(at_hi), hbm_fits);
  out.fits_from_bytes = bytes;
  out.step_time_at_fit_s = at_fit.step_time_s;
  return out;
}

}  // namespace hbmsim
