// hbmsim bench: the speed figures of issue 9, measured in this process.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <numeric>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/run_flags.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/bench_configs.hpp"
#include "planner/plan.hpp"
#include "planner/reproduce.hpp"
#include "planner/sweep.hpp"

namespace hbmsim::cli {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The mean time of `inner` simulations of a prepared step, in microseconds.
double batch_us(const PreparedRun& run, int inner) {
  auto t0 = clock_type::now();
  for (int i = 0; i < inner; ++i) (void)simulate(run.graph, run.system, run.policy, run.options);
  return seconds_since(t0) * 1e6 / inner;
}

void warm(const PreparedRun& run) {
  for (int i = 0; i < 2; ++i) (void)simulate(run.graph, run.system, run.policy, run.options);
}

// Median over `reps` batches of `inner` simulations of a prepared step, in microseconds.
double step_us(const PreparedRun& run, int reps, int inner) {
  warm(run);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(batch_us(run, inner));
  return median(std::move(t));
}

// Several steps timed in turn within each repetition, so that a drift of the machine's speed (this one's
// moves by tens of percent within minutes) affects each alike: per step, its batches' times.
std::vector<std::vector<double>> interleaved_us(const std::vector<PreparedRun>& runs, int reps, int inner) {
  for (const auto& r : runs) warm(r);
  std::vector<std::vector<double>> t(runs.size());
  for (int rep = 0; rep < reps; ++rep)
    for (std::size_t k = 0; k < runs.size(); ++k) t[k].push_back(batch_us(runs[k], inner));
  return t;
}

struct Line {
  double slope = 0, intercept = 0, r2 = 0;
};
Line fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  double n = static_cast<double>(x.size());
  double mx = std::accumulate(x.begin(), x.end(), 0.0) / n, my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  Line l;
  l.slope = sxy / sxx;
  l.intercept = my - l.slope * mx;
  l.r2 = syy > 0 ? sxy * sxy / (sxx * syy) : 1;
  return l;
}

std::size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::size_t>(u.ru_maxrss) * 1024;
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure simulator speed (step time, sweep rate, policy search, memory, scaling)");
  auto json = std::make_shared<bool>(false);
  auto jobs = std::make_shared<int>(2);
  auto quick = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Machine-readable output");
  cmd->add_option("--jobs", *jobs, "Threads for the sweep and the policy search");
  cmd->add_flag("--quick", *quick, "Smaller sweep and search (for smoke tests)");
  cmd->callback([=] {
    check_jobs(*jobs);
    const int reps = *quick ? 3 : 15, inner = *quick ? 3 : 20;
    nlohmann::json out;
    auto ds = prepare_run(bench_dsv3()), ll = prepare_run(bench_llama405b());
    out["dsv3_step_us"] = step_us(ds, reps, inner);
    out["dsv3_split_step_us"] = step_us(prepare_run(bench_dsv3_split()), reps, inner);
    out["llama405b_step_us"] = step_us(ll, reps, inner);
    auto every_event = ll;
    every_event.options.fast_forward = false;
    out["llama405b_step_every_event_us"] = step_us(every_event, reps, inner);
    out["llama405b_tp8_cp2_step_us"] = step_us(prepare_run(bench_llama405b_tp_cp()), reps, inner);
    out["tp8_cp2_over_fsdp"] = out["llama405b_tp8_cp2_step_us"].get<double>() / out["llama405b_step_us"].get<double>();
    out["llama405b_pp8_mb16_step_us"] = step_us(prepare_run(bench_llama405b_pp()), reps, std::max(1, inner / 4));
    out["pp8_mb16_over_single_step"] = out["llama405b_pp8_mb16_step_us"].get<double>() / out["llama405b_step_us"].get<double>();
    out["step_peak_rss_bytes"] = peak_rss_bytes();  // after step simulations only, trace off

    // Cost against layers and against gradient-accumulation steps (Llama 8B shape on H200).
    RunConfig small = bench_scaling_base();
    auto base = prepare_run(small);
    std::vector<double> xs, ys, ga, gy;
    std::vector<PreparedRun> depths;
    for (std::int64_t layers : {8, 16, 32, 64, 126}) {
      auto model = base.graph.model;
      model.num_layers = layers;
      depths.push_back(PreparedRun{base.system, build_step_graph(model, base.graph.training), base.policy, base.options});
      xs.push_back(static_cast<double>(layers));
    }
    const auto by_depth = interleaved_us(depths, reps, inner);
    for (const auto& t : by_depth) ys.push_back(median(t));
    // A Llama 405B depth against a Llama 8B one, same layer shape: the median of the ratios of batches
    // timed back to back.
    std::vector<double> deep_over_shallow;
    for (int r = 0; r < reps; ++r) deep_over_shallow.push_back(by_depth[4][static_cast<std::size_t>(r)] / by_depth[2][static_cast<std::size_t>(r)]);
    for (std::int64_t m : {1, 2, 4, 8}) {
      RunConfig c = small;
      c.grad_accum = m;
      ga.push_back(static_cast<double>(m));
      gy.push_back(step_us(prepare_run(c), reps, std::max(1, inner / 2)));
    }
    auto lf = fit_line(xs, ys), gf = fit_line(ga, gy);
    out["layers_us_per_layer"] = lf.slope;
    out["layers_126_over_32"] = median(std::move(deep_over_shallow));
    out["layers_r2"] = lf.r2;
    out["grad_accum_us_per_step"] = gf.slope;
    out["grad_accum_r2"] = gf.r2;

    // 10,000 mixed configurations (models, systems, batches, policies, LHS, pipelining) on the thread pool.
    RunConfig mix;
    mix.gpus = 128;
    std::vector<SweepAxis> axes = {
        {"model", {"llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "deepseek-v3-671b"}},
        {"system", {"gb200-nvl72", "gb300-nvl72", "vr-nvl144", "h100-hgx", "h200-hgx"}},
        {"batch", {"1", "2", "4", "8", "16"}},
        {"policy", {"full", "minimal", "save_qkv_proj", "qkv_proj_offloaded", "minimal_offloaded"}},
        {"lhs", {"on", "off"}},
        {"pipelined_transfers", {"on", "off"}},
        {"seq", {"2048", "4096", "8192", "16384", "32768"}}};
    auto points = expand_sweep(mix, axes);  // 20,000 points
    points.resize(*quick ? 500 : 10000);
    for (auto& p : points)
      if (p.config.model == "deepseek-v3-671b") p.config.ep = 64;
    std::size_t rows = 0;
    auto t0 = clock_type::now();
    run_sweep(points, *jobs, [&](const SweepRow&) { ++rows; });
    double sweep_s = seconds_since(t0);
    out["sweep_configs"] = rows;
    out["sweep_configs_per_s"] = static_cast<double>(rows) / sweep_s;

    // Exhaustive DeepSeek-V3 placement search: every device/remat/offload choice of its six largest
    // checkpoint names (3^6 = 729) at each batch 1..16.
    auto names = default_search_names(bench_dsv3());
    names.resize(6);
    t0 = clock_type::now();
    std::size_t evaluated = 0;
    for (std::int64_t b = 1; b <= (*quick ? 2 : 16); ++b) {
      RunConfig c = bench_dsv3();
      c.batch = b;
      c.tensors.clear();
      evaluated += best_policy(c, names, *jobs).evaluated.size();
    }
    out["policy_search_s"] = seconds_since(t0);
    out["policy_search_configs"] = evaluated;
    out["peak_rss_bytes"] = peak_rss_bytes();
    out["jobs"] = *jobs;
    if (*json) {
      std::cout << dump_json(out, 2) << "\n";
      return;
    }
    Table t{{"figure", "value"}, {}};
    for (auto& [k, v] : out.items()) t.rows.push_back({k, v.is_number_float() ? fixed(v.get<double>(), 3) : dump_json(v)});
    std::cout << t.render();
  });
}

}  // namespace hbmsim::cli
