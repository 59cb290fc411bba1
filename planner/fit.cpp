#include "planner/fit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "hwmodels/builtin.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/sweep.hpp"
#include "planner/validation.hpp"

namespace hbmsim {

namespace {
// A MaxText metrics log has one line of a few hundred bytes per step: 1 GiB is millions of steps.
constexpr std::uintmax_t kMaxLogBytes = std::uintmax_t{1} << 30;
}  // namespace

std::vector<FitParameter> load_fit_parameters(const std::string& path) {
  // "" is the built-in list; "builtin:NAME" a built-in data file (fit/corpus_parameters.json).
  const std::string builtin = path.empty() ? "fit/parameters.json" : path.rfind("builtin:", 0) == 0 ? path.substr(8) : "";
  const std::string origin = builtin.empty() ? path : "builtin:" + builtin;
  nlohmann::json doc;
  if (builtin.empty()) {
    doc = parse_json_file(path);
  } else if (auto text = builtin_file(builtin)) {
    doc = parse_json_text(*text, origin);
  } else {
    throw InputError(origin + ": no such built-in file");
  }
  JsonView v(doc, origin);
  v.allow_only({"about", "parameters"});
  auto list = v.at("parameters");
  std::vector<FitParameter> out;
  if (list.size() > 6) list.fail("at most 6 parameters may be fitted");
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto p = list[i];
    p.allow_only({"name", "lo", "hi", "initial", "meaning"});
    FitParameter f{p.at("name").string(), p.at("lo").number(), p.at("hi").number(), p.at("initial").number(),
                   p.at("meaning").string()};
    ParameterKey key;
    try {
      key = parse_parameter_key(f.name);
    } catch (const std::invalid_argument& e) {
      p.at("name").fail(e.what());
    }
    if (!(f.lo < f.hi)) p.at("hi").fail("must be above lo");
    if (f.lo < 0) p.at("lo").fail("must be >= 0");
    // The fitted value must load back from the profile it is written to: the scales must stay > 0 (a
    // saturated logistic reaches lo exactly) and copy_compute_interference, a fraction, below 1.
    if (key.name == "copy_compute_interference") {
      if (f.hi >= 1) p.at("hi").fail("copy_compute_interference is a slowdown fraction: must be below 1");
    } else if (!(f.lo > 0)) {
      p.at("lo").fail(f.name + " multiplies a figure: must be > 0");
    }
    if (!(f.initial > f.lo && f.initial < f.hi)) p.at("initial").fail("must lie strictly between lo and hi");
    for (auto& o : out)
      if (o.name == f.name) p.at("name").fail("duplicate parameter");
    out.push_back(f);
  }
  return out;
}

std::vector<MeasuredRun> measured_from_reference(const std::vector<ReferenceRun>& runs) {
  std::vector<MeasuredRun> out;
  for (auto& r : runs) {
    if (!r.tflops_per_device && !r.hbm_gib) continue;
    MeasuredRun m{r.id, "seed runs", r.config, r.tflops_per_device, std::nullopt};
    if (r.hbm_gib) m.hbm_bytes = *r.hbm_gib * 1073741824.0;
    out.push_back(m);
  }
  return out;
}

MeasuredRun measured_from_maxtext_log(const std::string& log_path, const std::string& config_path, int skip_steps) {
  MeasuredRun m;
  m.id = log_path;
  m.group = log_path;  // each log its own source
  m.config = RunConfig::from_file(config_path);
  {
    std::error_code ec;
    if (!std::filesystem::exists(log_path, ec))
      throw InputError(log_path + ": cannot be opened (MaxText metrics log; file does not exist)");
  }
  // Logs are streamed line by line, but a device (/dev/zero) or pipe would never end: regular files only.
  require_regular_file(log_path, kMaxLogBytes, "a MaxText metrics log (JSON lines)");
  std::ifstream in(log_path);
  if (!in) throw InputError(log_path + ": cannot be opened (MaxText metrics log)");
  std::vector<double> tflops, step_s;
  std::string line;
  int lineno = 0, steps = 0;
  double peak = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto origin = log_path + ":" + std::to_string(lineno);
    auto doc = parse_json_text(line, origin);
    JsonView v(doc, origin);
    v.expect_object();
    if (auto x = v.find("memory/peak_bytes_in_use")) peak = std::max(peak, x->positive());
    bool step_line = v.has("perf/step_time_seconds") || v.has("perf/per_device_tflops_per_sec");
    if (!step_line) continue;
    std::optional<double> tf, st;  // validated on every line, warm-up included
    if (auto x = v.find("perf/per_device_tflops_per_sec")) tf = x->positive();
    if (auto x = v.find("perf/step_time_seconds")) st = x->positive();
    if (steps++ >= skip_steps) {
      if (tf) tflops.push_back(*tf);
      if (st) step_s.push_back(*st);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  if (!tflops.empty()) {
    m.tflops_per_device = median(tflops);
  } else if (!step_s.empty()) {
    // MaxText's TFLOP/s is model FLOPs over step time; recompute it from the config when only time is logged.
    auto prepared = prepare_run(m.config);
    m.tflops_per_device = prepared.graph.model_flops.total() / median(step_s) / 1e12;
    if (!std::isfinite(*m.tflops_per_device))
      throw InputError(log_path + ": perf/step_time_seconds median = " + format_number(median(step_s)) +
                       " (too small to give a finite TFLOP/s)");
  } else {
    throw InputError(log_path + ": no step lines after " + std::to_string(skip_steps) +
                     " warm-up steps (expected perf/step_time_seconds or perf/per_device_tflops_per_sec)");
  }
  if (peak > 0) m.hbm_bytes = peak;
  return m;
}

CorpusRuns measured_from_corpus(const std::vector<PublishedRun>& runs, const std::string& calibration, int jobs) {
  CorpusRuns out;
  for (const ValidationRow& row : validate_runs(runs, calibration, jobs)) {
    const auto measured = measured_tok_s_gpu(row.run);
    if (!row.predicted || !measured || !row.mapping.config) continue;
    const StepReport& p = *row.predicted;
    MeasuredRun m;
    m.id = "corpus row " + std::to_string(row.run.row) + " (" + row.run.src + ")";
    m.group = row.run.src;
    m.config = *row.mapping.config;
    m.config.calibration.clear();  // the fit sets the profile it tries
    m.tflops_per_device = *measured * p.model_flops_per_device / p.tokens_per_device_per_step / 1e12;
    const double ratio = p.tokens_per_s_per_device / *measured;
    if (ratio > kCorpusOutlierRatio || ratio < 1 / kCorpusOutlierRatio) {
      char x[32];
      std::snprintf(x, sizeof x, "%.2f", ratio);
      out.outliers.push_back(m.id + ": predicted " + std::string(x) + "x the measurement");
      continue;
    }
    out.runs.push_back(std::move(m));
  }
  return out;
}

std::vector<StepReport> predict_with(const std::vector<MeasuredRun>& runs, const std::map<std::string, double>& params,
                                     int jobs) {
  Profile p;
  p.name = "fit trial";
  p.parameters = params;
  std::vector<StepReport> out(runs.size());
  parallel_for(runs.size(), jobs, [&](std::size_t i) { out[i] = run_simulation(runs[i].config, false, &p); });
  return out;
}

namespace {

double sigmoid(double u) { return 1 / (1 + std::exp(-u)); }
double logit(double x) { return std::log(x / (1 - x)); }

std::map<std::string, double> to_params(const std::vector<FitParameter>& ps, const std::vector<double>& u) {
  std::map<std::string, double> m;
  for (std::size_t i = 0; i < ps.size(); ++i) m[ps[i].name] = ps[i].lo + (ps[i].hi - ps[i].lo) * sigmoid(u[i]);
  return m;
}

struct Objective {
  const std::vector<MeasuredRun>& runs;
  const std::vector<FitParameter>& ps;
  const std::map<std::string, double>& fixed;  // held at these values while `ps` move
  std::vector<double> u0;
  std::string label;
  const FitOptions& options;
  int evaluations = 0;

  double operator()(const std::vector<double>& u) {
    ++evaluations;
    auto params = fixed;
    for (const auto& [name, value] : to_params(ps, u)) params[name] = value;
    auto preds = predict_with(runs, params, options.jobs);
    double sum = 0;
    int n = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!runs[i].tflops_per_device) continue;
      double e = std::log(preds[i].tflops_per_device / *runs[i].tflops_per_device);
      sum += e * e;
      ++n;
    }
    // A weak pull towards the starting values keeps parameters no run constrains where they were.
    double ridge = 0;
    for (std::size_t i = 0; i < u.size(); ++i) ridge += (u[i] - u0[i]) * (u[i] - u0[i]);
    const double value = (n ? sum / n : 0) + 1e-6 * ridge;
    if (options.progress) options.progress(label, evaluations, value);
    return value;
  }
};

// The starting simplex takes n + 1 evaluations whatever the budget; after it no step evaluates past max_evals
// (a step cut short keeps what it evaluated).
std::vector<double> nelder_mead(Objective& f, std::vector<double> x0, int max_evals) {
  const std::size_t n = x0.size();
  std::vector<std::vector<double>> s(n + 1, x0);
  std::vector<double> fv(n + 1);
  for (std::size_t i = 0; i < n; ++i) s[i + 1][i] += 0.6;
  for (std::size_t i = 0; i <= n; ++i) fv[i] = f(s[i]);
  auto at = [&](const std::vector<double>& c, const std::vector<double>& w, double t) {
    std::vector<double> r(n);
    for (std::size_t k = 0; k < n; ++k) r[k] = c[k] + t * (w[k] - c[k]);
    return r;
  };
  auto budget_left = [&] { return f.evaluations < max_evals; };
  while (budget_left()) {
    std::vector<std::size_t> idx(n + 1);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return fv[a] < fv[b]; });
    std::vector<std::vector<double>> s2;
    std::vector<double> f2;
    for (auto i : idx) {
      s2.push_back(s[i]);
      f2.push_back(fv[i]);
    }
    s = s2;
    fv = f2;
    if (fv[n] - fv[0] < 1e-12) break;
    std::vector<double> c(n, 0);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < n; ++k) c[k] += s[i][k] / n;
    auto xr = at(c, s[n], -1.0);
    double fr = f(xr);
    if (fr < fv[0]) {
      if (!budget_left()) {
        s[n] = xr;
        fv[n] = fr;
        break;
      }
      auto xe = at(c, s[n], -2.0);
      double fe = f(xe);
      if (fe < fr) { s[n] = xe; fv[n] = fe; } else { s[n] = xr; fv[n] = fr; }
    } else if (fr < fv[n - 1]) {
      s[n] = xr;
      fv[n] = fr;
    } else {
      if (!budget_left()) break;
      auto xc = fr < fv[n] ? at(c, s[n], -0.5) : at(c, s[n], 0.5);
      double fc = f(xc);
      if (fc < std::min(fr, fv[n])) {
        s[n] = xc;
        fv[n] = fc;
      } else {
        for (std::size_t i = 1; i <= n && budget_left(); ++i) {
          s[i] = at(s[0], s[i], 0.5);
          fv[i] = f(s[i]);
        }
      }
    }
  }
  std::size_t best = static_cast<std::size_t>(std::min_element(fv.begin(), fv.end()) - fv.begin());
  return s[best];
}

std::map<std::string, double> fit_simplex(const std::vector<MeasuredRun>& runs, const std::vector<FitParameter>& ps,
                                          const std::map<std::string, double>& fixed, const FitOptions& o, int max_evaluations,
                                          int& evaluations, const std::string& label) {
  std::vector<double> u0;
  for (auto& p : ps) u0.push_back(logit((p.initial - p.lo) / (p.hi - p.lo)));
  Objective f{runs, ps, fixed, u0, label, o};
  auto u = nelder_mead(f, u0, max_evaluations);
  evaluations += f.evaluations;
  return to_params(ps, u);
}

// Parameters qualified with a system (NAME@SYSTEM) are fitted in two stages, so that a system none of `runs`
// is on takes a value these runs support rather than its starting value: first one NAME for every system
// (the pooled fit, a third of the evaluations), then each system's own from there; a system without runs
// keeps the pooled value. The pooled value also stays in the result under the bare NAME (unless NAME itself
// is fitted): a system with runs but no parameter of its own (B200 beside GB200) is fitted and predicted at
// it, not at the datasheet figures. Without qualified parameters, one stage.
std::map<std::string, double> fit_once(const std::vector<MeasuredRun>& runs, const std::vector<FitParameter>& ps,
                                       const FitOptions& o, int& evaluations, const std::string& label) {
  std::vector<FitParameter> pooled;
  for (const FitParameter& p : ps) {
    FitParameter q = p;
    q.name = parse_parameter_key(p.name).name;
    auto same = std::find_if(pooled.begin(), pooled.end(), [&](const FitParameter& x) { return x.name == q.name; });
    if (same == pooled.end()) {
      pooled.push_back(q);
    } else {  // one range covering every system's
      same->lo = std::min(same->lo, q.lo);
      same->hi = std::max(same->hi, q.hi);
    }
  }
  const bool qualified = std::any_of(ps.begin(), ps.end(), [](const FitParameter& p) { return p.name.find('@') != std::string::npos; });
  if (!qualified) return fit_simplex(runs, ps, {}, o, o.max_evaluations, evaluations, label);
  const int first = std::max(1, o.max_evaluations / 3);
  const auto pooled_values = fit_simplex(runs, pooled, {}, o, first, evaluations, label + ", pooled");
  std::map<std::string, double> out;  // held through the second stage, then the result
  for (const auto& pooled_value : pooled_values) {
    const std::string& name = pooled_value.first;
    if (std::none_of(ps.begin(), ps.end(), [&](const FitParameter& p) { return p.name == name; })) out[name] = pooled_value.second;
  }
  std::vector<FitParameter> own;
  for (const FitParameter& p : ps) {
    const ParameterKey key = parse_parameter_key(p.name);
    const double start = std::clamp(pooled_values.at(key.name), p.lo + 1e-6 * (p.hi - p.lo), p.hi - 1e-6 * (p.hi - p.lo));
    const bool constrained = key.system.empty() || std::any_of(runs.begin(), runs.end(), [&](const MeasuredRun& r) {
                               return r.tflops_per_device && r.config.system == key.system;
                             });
    if (constrained) {
      own.push_back(p);
      own.back().initial = start;
    } else {
      out[p.name] = start;
    }
  }
  if (!own.empty())
    for (const auto& [name, value] : fit_simplex(runs, own, out, o, std::max(1, o.max_evaluations - first), evaluations, label))
      out[name] = value;
  return out;
}

}  // namespace

FitResult fit_parameters(const std::vector<MeasuredRun>& runs, const std::vector<FitParameter>& ps, const FitOptions& o) {
  if (ps.empty()) throw InputError("fit: no parameters to fit");
  check_jobs(o.jobs);
  std::size_t with_tflops = 0;
  for (auto& r : runs) with_tflops += r.tflops_per_device ? 1 : 0;
  if (with_tflops == 0) throw InputError("fit: no measured run reports TFLOP/s");
  std::vector<std::string> groups;  // with a measured TFLOP/s, in first-appearance order
  for (auto& r : runs)
    if (r.tflops_per_device && std::find(groups.begin(), groups.end(), r.group) == groups.end()) groups.push_back(r.group);
  if (o.leave_one_group_out && groups.size() < 2)
    throw InputError("fit: leaving one source out needs measured runs from at least two sources (all " + std::to_string(with_tflops) +
                     " come from \"" + groups.front() + "\")");
  FitResult res;
  res.system = runs.empty() ? "" : runs.front().config.system;
  for (auto& r : runs)
    if (r.config.system != res.system) res.system.clear();
  res.parameters = fit_once(runs, ps, o, res.evaluations, "all");
  auto preds = predict_with(runs, res.parameters, o.jobs);
  double sum = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].tflops_per_device) {
      res.tflops.push_back({runs[i].id, runs[i].group, *runs[i].tflops_per_device, preds[i].tflops_per_device});
      double e = std::log(preds[i].tflops_per_device / *runs[i].tflops_per_device);
      sum += e * e;
    }
    if (runs[i].hbm_bytes) res.hbm.push_back({runs[i].id, runs[i].group, *runs[i].hbm_bytes, preds[i].hbm_peak_bytes});
  }
  res.rms_log_error = std::sqrt(sum / static_cast<double>(res.tflops.size()));
  if (o.leave_one_group_out) {
    for (const std::string& g : groups) {
      std::vector<MeasuredRun> rest, held;  // rest holds another group's measured runs: there are two or more
      for (auto& r : runs) (r.group == g ? held : rest).push_back(r);
      auto params = fit_once(rest, ps, o, res.evaluations, "without " + g);
      auto preds = predict_with(held, params, o.jobs);
      for (std::size_t i = 0; i < held.size(); ++i)
        if (held[i].tflops_per_device)
          res.leave_one_group_out.push_back({held[i].id, g, *held[i].tflops_per_device, preds[i].tflops_per_device});
    }
  }
  if (o.leave_one_out) {
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!runs[i].tflops_per_device) continue;
      std::vector<MeasuredRun> rest;
      for (std::size_t j = 0; j < runs.size(); ++j)
        if (j != i) rest.push_back(runs[j]);
      auto params = fit_once(rest, ps, o, res.evaluations, "without " + runs[i].id);
      auto pred = predict_with({runs[i]}, params, 1).front();
      res.leave_one_out.push_back({runs[i].id, runs[i].group, *runs[i].tflops_per_device, pred.tflops_per_device});
    }
  }
  return res;
}

Profile FitResult::profile(const std::string& name, const std::string& source) const {
  Profile p;
  p.name = name;
  p.source = source;
  p.system = system;
  p.parameters = parameters;
  return p;
}

nlohmann::json FitResult::to_json() const {
  auto rows = [](const std::vector<Residual>& rs) {
    auto a = nlohmann::json::array();
    for (auto& r : rs) a.push_back({{"id", r.id}, {"group", r.group}, {"measured", r.measured}, {"predicted", r.predicted}, {"error", r.error()}});
    return a;
  };
  return {{"parameters", parameters}, {"tflops_residuals", rows(tflops)}, {"hbm_residuals", rows(hbm)},
          {"leave_one_out", rows(leave_one_out)}, {"leave_one_group_out", rows(leave_one_group_out)}, {"rms_log_error", rms_log_error}, {"evaluations", evaluations}};
}

}  // namespace hbmsim
