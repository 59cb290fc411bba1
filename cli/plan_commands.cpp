// plan, calibrate and bench subcommands.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>

#include "cli/commands.hpp"
#include "cli/files.hpp"
#include "cli/format.hpp"
#include "cli/run_flags.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/fit.hpp"
#include "planner/layer_counts.hpp"
#include "planner/layout_search.hpp"
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/plan_json.hpp"
#include "planner/published_runs.hpp"
#include "planner/scale_plan.hpp"
#include "planner/sweep.hpp"

namespace hbmsim::cli {

namespace {

int g_status = 0;

// A held degree's flag text, one value or a comma-separated list, each read as the flag's own value would be
// ("--tp 4,8": 4 and 8; "--sharded-optimizer on": 1).
std::vector<std::int64_t> held_flag_values(const std::string& field, const std::string& text) {
  std::vector<std::int64_t> values;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    RunConfig c;
    c.set(field, text.substr(start, comma - start), flag_for_field(field));
    const nlohmann::json value = c.to_json()[field];
    values.push_back(value.is_boolean() ? value.get<bool>() : value.get<std::int64_t>());
    start = comma + 1;
  }
  return values;
}

// What a layout keeps in pinned host memory besides activations ("-": nothing).
std::string in_host(const RunConfig& c) {
  std::string s = c.optimizer_offload == "off" ? "" : "opt (" + c.optimizer_offload + ")";
  if (c.parameter_offload) s += s.empty() ? "params" : " + params";
  return s.empty() ? "-" : s;
}

// The CUDA measurement binary: next to hbmsim in the build tree, or on PATH.
std::string find_calibration_binary() {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto rel : {"hbmsim-calibrate-cuda", "../hwmodels/calibration/hbmsim-calibrate-cuda"}) {
      auto p = self.parent_path() / rel;
      if (fs::exists(p, ec)) return p.lexically_normal().string();
    }
  }
  return "hbmsim-calibrate-cuda";
}

void register_calibrate(CLI::App& app) {
  auto* cal = app.add_subcommand("calibrate", "Measure a GPU (CUDA backend) or fit parameters to measured runs");
  cal->require_subcommand(0, 1);
  {
    auto* cmd = cal->add_subcommand("measure", "Run the CUDA measurement on this machine's GPU and write a profile");
    auto out = std::make_shared<std::string>();
    auto raw = std::make_shared<std::string>();
    auto quick = std::make_shared<bool>(false);
    cmd->add_option("-o,--out", *out, "Profile JSON to write")->required();
    cmd->add_option("--raw", *raw, "Raw measurements JSON to write");
    cmd->add_flag("--quick", *quick, "Fewer sizes and repeats");
    cmd->callback([=] {
      check_writable(*out);  // before minutes of measurement
      if (!raw->empty()) check_writable(*raw);
      std::vector<std::string> args = {find_calibration_binary(), "-o", *out};
      if (!raw->empty()) args.insert(args.end(), {"--raw", *raw});
      if (*quick) args.push_back("--quick");
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      std::fflush(stdout);
      pid_t pid = fork();
      if (pid == 0) {
        execvp(argv[0], argv.data());
        std::fprintf(stderr, "hbmsim: calibrate measure: cannot run %s (built only where a CUDA compiler was found)\n", argv[0]);
        _exit(3);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      g_status = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    });
  }
  {
    auto* cmd = cal->add_subcommand("fit", "Fit the named parameters (data/fit/parameters.json) to measured runs");
    auto runs = std::make_shared<std::string>();
    auto configs = std::make_shared<std::string>();
    auto logs = std::make_shared<std::vector<std::string>>();
    auto params = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto name = std::make_shared<std::string>("fitted");
    auto loo = std::make_shared<bool>(false);
    auto json = std::make_shared<bool>(false);
    auto no_seed = std::make_shared<bool>(false);
    auto corpus = std::make_shared<bool>(false);
    auto corpus_runs = std::make_shared<std::string>();
    auto loso = std::make_shared<bool>(false);
    auto jobs = std::make_shared<int>(2);
    auto max_evals = std::make_shared<int>(400);
    cmd->add_option("--runs", *runs, "Measured runs in seed_runs.json format (default: the built-in GB200 runs)");
    cmd->add_option("--configs", *configs, "Configs for those runs (seed_configs.json format)");
    cmd->add_option("--maxtext", *logs, "LOG.jsonl=CONFIG.json: a MaxText metrics log and the run config it ran (repeatable)");
    cmd->add_flag("--no-seed-runs", *no_seed, "Fit only the --maxtext and --corpus runs");
    cmd->add_flag("--corpus", *corpus, "Also fit the validation corpus's measured rows (tokens/s per GPU, as hbmsim validate expresses them)");
    cmd->add_option("--corpus-runs", *corpus_runs, "The corpus (published_runs.csv columns; default the built-in one); implies --corpus");
    cmd->add_flag("--leave-one-source-out", *loso, "Also predict each source's runs from a fit without that source");
    cmd->add_option("--max-evaluations", *max_evals, "Evaluations per fit (each simulates every run once; the starting simplex takes the parameters + 1 whatever this says)");
    cmd->add_option("--parameters", *params, "Parameter list with bounds (default data/fit/parameters.json; with --corpus, data/fit/corpus_parameters.json)");
    cmd->add_option("-o,--out", *out, "Write the fitted profile here");
    cmd->add_option("--name", *name, "Profile name");
    cmd->add_flag("--leave-one-out", *loo, "Also predict each run from a fit that excluded it");
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->add_option("--jobs", *jobs, "Threads for the simulations of one evaluation");
    cmd->callback([=] {
      check_jobs(*jobs);
      if (!out->empty()) check_writable(*out);  // before the fit (a corpus fit runs for many minutes)
      std::vector<MeasuredRun> measured;
      if (!*no_seed) measured = measured_from_reference(load_reference_runs(*runs, *configs));
      for (auto& spec : *logs) {
        auto eq = spec.find('=');
        if (eq == std::string::npos) throw InputError("--maxtext " + spec + " (expected LOG.jsonl=CONFIG.json)");
        // The config first, on its own: an error found after loading it (an unknown system) names the file.
        check_run_config_file(spec.substr(eq + 1));
        measured.push_back(measured_from_maxtext_log(spec.substr(0, eq), spec.substr(eq + 1)));
      }
      const bool with_corpus = *corpus || !corpus_runs->empty();
      // Checked before the corpus is simulated. A corpus fit adjusts the scales the corpus constrains
      // (data/fit/corpus_parameters.json says why).
      auto ps = load_fit_parameters(params->empty() && with_corpus ? "builtin:fit/corpus_parameters.json" : *params);
      if (*max_evals < 1) throw InputError("--max-evaluations = " + std::to_string(*max_evals) + " (must be >= 1)");
      if (with_corpus) {
        // The corpus rows' unstated recompute is resolved once, on datasheet figures (it depends on memory).
        auto corpus_rows = measured_from_corpus(load_published_runs(*corpus_runs), "", *jobs);
        for (const auto& why : corpus_rows.outliers)
          std::fprintf(stderr, "calibrate fit: left out, more than %gx off on datasheet figures: %s\n", kCorpusOutlierRatio, why.c_str());
        measured.insert(measured.end(), corpus_rows.runs.begin(), corpus_rows.runs.end());
      }
      if (measured.empty()) throw InputError("calibrate fit: no measured runs (--no-seed-runs without --maxtext or --corpus)");
      FitOptions o;
      o.leave_one_out = *loo;
      o.leave_one_group_out = *loso;
      o.max_evaluations = *max_evals;
      // A line per 10 evaluations on stderr: a corpus fit simulates every row per evaluation (minutes).
      o.progress = [](const std::string& fit, int evaluations, double objective) {
        if (evaluations % 10 == 0)
          std::fprintf(stderr, "calibrate fit (%s): evaluation %d, its rms log error %.4f\n", fit.c_str(), evaluations, std::sqrt(objective));
      };
      o.jobs = *jobs;
      auto res = fit_parameters(measured, ps, o);
      std::string source = "hbmsim calibrate fit" + std::string(with_corpus ? " --corpus" : "") +
                           std::string(*no_seed ? " --no-seed-runs" : "") + std::string(*loo ? " --leave-one-out" : "") +
                           std::string(*loso ? " --leave-one-source-out" : "") + " over " + std::to_string(measured.size()) +
                           " measured runs";
      if (!out->empty()) write_file_atomically(*out, dump_json(res.profile(*name, source).to_json(), 2) + "\n");
      if (*json) {
        std::cout << dump_json(res.to_json(), 2) << "\n";
        return;
      }
      Table p{{"parameter", "fitted", "lo", "hi"}, {}};
      for (auto& f : ps) p.rows.push_back({f.name, fixed(res.parameters.at(f.name), 3), fixed(f.lo, 2), fixed(f.hi, 2)});
      // The pooled values the fit keeps for systems without a parameter of their own (planner/fit.cpp).
      for (const auto& parameter : res.parameters) {
        const std::string& name = parameter.first;
        if (std::none_of(ps.begin(), ps.end(), [&](const FitParameter& f) { return f.name == name; }))
          p.rows.push_back({name + " (pooled)", fixed(parameter.second, 3), "-", "-"});
      }
      std::cout << p.render() << "\n";
      Table r{{"run", "TFLOP/s measured", "fitted", "error", "leave-one-out", "error", "source left out", "error"}, {}};
      auto held_out = [](const std::vector<Residual>& rs, const std::string& id, std::vector<std::string>& row) {
        for (auto& l : rs)
          if (l.id == id) {
            row.push_back(fixed(l.predicted, 1));
            row.push_back(fixed(100 * l.error(), 1) + "%");
            return;
          }
        row.push_back("-");
        row.push_back("-");
      };
      for (auto& x : res.tflops) {
        std::vector<std::string> row{x.id, fixed(x.measured, 1), fixed(x.predicted, 1), fixed(100 * x.error(), 1) + "%"};
        held_out(res.leave_one_out, x.id, row);
        held_out(res.leave_one_group_out, x.id, row);
        r.rows.push_back(row);
      }
      std::cout << r.render() << "\n";
      // Mean absolute percentage errors per source: fitted, and each source predicted from the others.
      // (group "" stands for every run.) Returns the MAPE and how many runs it is over.
      auto mape = [](const std::vector<Residual>& rs, const std::string& group) -> std::pair<std::string, int> {
        double sum = 0;
        int n = 0;
        for (auto& x : rs)
          if (group.empty() || x.group == group) {
            sum += std::abs(x.error());
            ++n;
          }
        return {n ? fixed(100 * sum / n, 1) + "%" : "-", n};
      };
      std::vector<std::string> groups{""};
      for (auto& x : res.tflops)
        if (std::find(groups.begin(), groups.end(), x.group) == groups.end()) groups.push_back(x.group);
      Table g{{"group", "runs", "MAPE fitted", "MAPE source left out"}, {}};
      for (auto& grp : groups) {
        const auto [fitted, n] = mape(res.tflops, grp);
        g.rows.push_back({grp.empty() ? "all" : grp, std::to_string(n), fitted, mape(res.leave_one_group_out, grp).first});
      }
      std::cout << g.render() << "\n";
      Table h{{"run", "HBM GiB measured", "fitted", "error"}, {}};
      for (auto& x : res.hbm) h.rows.push_back({x.id, gib(x.measured), gib(x.predicted), fixed(100 * x.error(), 1) + "%"});
      std::cout << h.render();
      std::printf("\nrms log error %.4f after %d evaluations\n", res.rms_log_error, res.evaluations);
    });
  }
}

void print_settings(const RunConfig& c) {
  auto s = runnable_settings(c);
  std::printf("  simulate --config JSON: %s\n", dump_json(s["simulate_config"]).c_str());
  std::printf("  MaxText: %s\n", s["maxtext"].get<std::string>().c_str());
  std::printf("  XLA_FLAGS: %s\n", s["xla_flags"].get<std::string>().c_str());
  std::printf("  Megatron: %s\n", s["megatron"].get<std::string>().c_str());
}

// The options `plan layout` and `plan scale` share: how each count's search runs.
struct SearchFlags {
  int jobs = 2;
  std::vector<std::string> policies;
  std::vector<std::int64_t> micro_batches;
  bool no_prune = false, no_state_offload = false, json = false;
  std::string progress = "auto";
};

std::shared_ptr<SearchFlags> add_search_flags(CLI::App* cmd) {
  auto f = std::make_shared<SearchFlags>();
  cmd->add_option("--jobs", f->jobs, "Worker threads");
  auto defaults = [](const std::string& framework) {
    RunConfig c;
    c.framework = framework;
    std::string list;
    for (const auto& p : default_layout_policies(c)) list += (list.empty() ? "" : ", ") + p;
    return list;
  };
  cmd->add_option("--policies", f->policies,
                  "Policy presets to try (default: " + defaults("maxtext") + "; under --framework megatron " + defaults("megatron") + ")")
      ->delimiter(',');
  cmd->add_option("--micro-batches", f->micro_batches, "Micro-batch sizes to try (sequences per replica; default 1,2)")->delimiter(',');
  cmd->add_flag("--no-prune", f->no_prune, "Simulate every candidate, also those whose memory lower bound exceeds HBM");
  cmd->add_flag("--no-state-offload", f->no_state_offload,
                "Do not retry a layout that cannot fit with its optimizer state (then its parameters) in host memory");
  cmd->add_option("--progress", f->progress, kProgressHelp);
  cmd->add_flag("--json", f->json, "Machine-readable output");
  return f;
}

// The base config and the search's options from the flags: the degrees given as flags (a value or a
// comma-separated list) are held and come out of the flags first (a config file's values of them are searched);
// --policy and --micro-batch are one-item lists. `varied`: other fields the command sets itself.
std::pair<RunConfig, LayoutSearchOptions> resolve_search_flags(const RunFlags& flags, const SearchFlags& f, std::set<std::string> varied) {
  LayoutSearchOptions o;
  RunFlags rest = flags;
  varied.insert({"batch", "grad_accum", "microbatches"});
  for (const std::string& field : holdable_layout_fields()) {
    varied.insert(field);
    if (auto it = rest.values.find(field); it != rest.values.end()) {
      o.held[field] = held_flag_values(field, it->second);
      rest.values.erase(it);
    }
  }
  for (const char* field : {"policy", "micro_batch"})
    if (!flags.values.count(field)) varied.insert(field);
  auto base = resolve_run_flags(rest, varied);
  std::vector<std::string> policies = f.policies;
  std::vector<std::int64_t> mbs = f.micro_batches;
  if (flags.values.count("policy") && !policies.empty())
    throw InputError("--policy " + base.policy + " (with --policies: give the policies to try in one of them)");
  if (flags.values.count("micro_batch") && !mbs.empty())
    throw InputError("--micro-batch " + std::to_string(base.micro_batch) + " (with --micro-batches: give the sizes to try in one of them)");
  if (flags.values.count("policy")) policies = {base.policy};
  if (flags.values.count("micro_batch")) {
    if (base.micro_batch < 1) throw InputError("--micro-batch " + std::to_string(base.micro_batch) + " (must be at least 1)");
    mbs = {base.micro_batch};
  }
  for (auto& p : policies) (void)with_layout_policy(base, p, resolve_model(base.model));
  o.jobs = f.jobs;
  o.prune = !f.no_prune;
  o.state_offload = !f.no_state_offload;
  if (!policies.empty()) o.policies = policies;
  if (!mbs.empty()) o.micro_batches = mbs;
  return {base, o};
}

// Runs `check`; a message about a held degree or one of `fields` ("tp = 3 (...)") is renamed after its flag as
// typed ("--tp = 3 (...)"), the others (--top, --jobs: already flags) are left as they are.
void with_flag_names(const LayoutSearchOptions& o, const std::function<void()>& check, const std::set<std::string>& fields = {}) {
  try {
    check();
  } catch (const InputError& e) {
    const std::string m = e.what();
    const auto eq = m.find(" = ");
    const std::string field = eq == std::string::npos ? "" : m.substr(0, eq);
    if (field.empty() || (!o.held.count(field) && !fields.count(field))) throw;
    throw InputError(flag_for_field(field) + m.substr(eq));
  }
}

std::function<void(std::size_t, std::size_t)> search_progress(const std::string& what, std::chrono::steady_clock::time_point start) {
  return [what, start](std::size_t done, std::size_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\r%s: %zu/%zu simulated  %.0f s   ", what.c_str(), done, total, s);
  };
}

// A layout's degree columns: tp, cp, pp, vp, ep (Nf folded experts, No combined 1F1B), fsdp, dp (* sharded optimizer).
std::vector<std::string> degree_cells(const RunConfig& c) {
  return {std::to_string(c.tp), std::to_string(c.cp), std::to_string(c.pp), std::to_string(c.vp),
          std::to_string(c.ep) + (folds_experts(c) ? "f" : "") + (c.ep_overlap ? "o" : ""), std::to_string(c.fsdp),
          std::to_string(c.dp) + (c.sharded_optimizer ? "*" : "")};
}

// The legend of the marks degree_cells puts on the layouts listed.
std::string ep_legend(const std::vector<const RunConfig*>& listed) {
  std::string legend = "dp*: optimizer state sharded over dp";
  if (std::any_of(listed.begin(), listed.end(), [](const RunConfig* c) { return folds_experts(*c); }))
    legend += "; ep Nf: expert tensor parallelism 1, experts whole over an expert group of N GPUs spanning tp (and cp, or part of it)";
  if (std::any_of(listed.begin(), listed.end(), [](const RunConfig* c) { return c->ep_overlap; }))
    legend += "; ep No: expert all-to-alls overlapped with another micro-batch's compute (combined 1F1B, ep_overlap)";
  return legend;
}

// What a winner's line adds to its mesh: where folded experts live, combined 1F1B.
std::string layout_extra(const RunConfig& best) {
  std::string extra;
  if (folds_experts(best)) extra += ", experts whole over " + expert_group_span(training_shape(best).parallelism) + " = " + std::to_string(best.ep) + " GPUs";
  if (best.ep_overlap) extra += ", combined 1F1B";
  return extra;
}

void print_scale_plan(const RunConfig& base, const ScalePlanOptions& o, const ScalePlan& r, double seconds) {
  const double tokens_per_step = static_cast<double>(r.global_batch) * static_cast<double>(r.seq);
  std::string budget = o.tokens > 0 ? "; budget " + format_number(o.tokens / 1e12) + " T tokens" : "";
  if (o.days > 0) budget += " within " + format_number(o.days) + " days";
  const std::string held = o.search.held.empty() ? "" : "; held: " + held_text(held_fields(o.search));
  std::printf("scale: %s on %s GPUs, seq %lld, global batch %lld sequences (%.1f M tokens per step)%s%s (%.1f s)\n\n", base.model.c_str(),
              base.system.c_str(), static_cast<long long>(r.seq), static_cast<long long>(r.global_batch), tokens_per_step / 1e6, budget.c_str(),
              held.c_str(), seconds);
  std::vector<std::string> head = {"GPUs", "tp", "cp", "pp", "vp", "ep", "fsdp", "dp", "mbs", "GA", "policy", "step s", "tok/s/GPU", "tok/s", "scaling"};
  if (o.tokens > 0) head.insert(head.end(), {"days", "k GPU-hours"});
  head.insert(head.end(), {"HBM GiB", "limited by"});
  Table t{head, {}};
  t.text_last = true;
  std::vector<const RunConfig*> listed;
  std::vector<std::string> none;
  for (const ScaleRow& row : r.rows) {
    if (!row.fits()) {
      none.push_back(str(row.gpus) + " GPUs: " + row.search.none_fit);
      std::vector<std::string> cells(head.size(), "-");
      cells.front() = str(row.gpus);
      cells.back() = "nothing fits";
      t.rows.push_back(cells);
      continue;
    }
    const auto& [c, rep, limit] = row.search.top.front();
    listed.push_back(&c);
    std::vector<std::string> cells = {str(row.gpus)};
    for (auto& d : degree_cells(c)) cells.push_back(d);
    for (auto cell : {std::to_string(c.micro_batch), std::to_string(rep.grad_accum), layout_policy_label(c), fixed(rep.step_time_s, 2),
                      fixed(rep.tokens_per_s_per_device, 0), fixed(rep.tokens_per_s_per_device * static_cast<double>(row.gpus), 0), fixed(row.scaling, 2)})
      cells.push_back(cell);
    if (o.tokens > 0) cells.insert(cells.end(), {fixed(row.days, 1), fixed(row.gpu_hours / 1e3, 0)});
    cells.insert(cells.end(), {gib(rep.hbm_peak_bytes), limit});
    t.rows.push_back(cells);
  }
  std::cout << t.render();
  if (!listed.empty()) std::printf("(%s)\n", ep_legend(listed).c_str());
  for (const auto& why : none) std::printf("%s\n", why.c_str());
  if (o.days <= 0) return;
  if (r.fewest_within_days < 0) {
    std::printf("\nno count compared meets %s days\n", format_number(o.days).c_str());
    return;
  }
  for (const ScaleRow& row : r.rows)
    if (row.gpus == r.fewest_within_days) {
      std::printf("\nfewest GPUs within %s days: %lld (%.1f days, %s)\n", format_number(o.days).c_str(), static_cast<long long>(row.gpus), row.days,
                  row.search.top.front().report.mesh.c_str());
      print_settings(row.search.top.front().config);
    }
}

void register_plan(CLI::App& app) {
  auto* plan = app.add_subcommand("plan", "Capacity questions: largest batch, best policy, Pareto front, break-even link, HBM needed");
  plan->require_subcommand(0, 1);
  {
    auto* cmd = plan->add_subcommand("largest-batch", "Largest batch that fits (per device, or Megatron's micro-batch), per policy variant");
    auto flags = make_run_flags(cmd);
    auto variants = std::make_shared<std::vector<std::string>>();
    auto max_batch = std::make_shared<std::int64_t>(1024);
    auto json = std::make_shared<bool>(false);
    cmd->add_option("--variant", *variants, "LABEL=field:value;field:value (repeatable); default: device/remat/offload of the --tensor names, or the presets (Megatron's no_recompute, selective and full under --framework megatron; MaxText's otherwise)");
    cmd->add_option("--max-batch", *max_batch, "Upper end of the search (the per-device batch, or the micro-batch with --micro-batch)");
    auto pow2 = std::make_shared<bool>(false);
    cmd->add_flag("--powers-of-two", *pow2, "Only batches 1, 2, 4, ... (the grid capacity experiments usually step through)");
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([=] {
      if (*max_batch < 1 || *max_batch > kMaxBatch)
        throw InputError("--max-batch = " + std::to_string(*max_batch) + " (must be in [1, " + std::to_string(kMaxBatch) + "])");
      // The search sets the batch, and each variant the fields it names: the base is checked without them.
      std::set<std::string> varied = {"batch"};
      for (auto& v : *variants)
        for (auto& setting : split_variant(v).settings) varied.insert(setting.first);
      auto base = resolve_run_flags(*flags, varied);
      std::vector<std::pair<std::string, RunConfig>> vs;
      for (auto& v : *variants) vs.push_back(parse_variant(base, v));
      if (vs.empty()) vs = default_variants(base);
      announce_run(base, !*json, "base run (each variant sets its own fields and the batch searched):");
      auto arr = nlohmann::json::array();
      // The search steps the base's own batch field: the per-device batch, or Megatron's micro-batch.
      const bool micro_form = base.micro_batch > 0;
      Table t{{"variant", micro_form ? "largest micro-batch" : "largest batch", micro_form ? "global batch" : "micro-batch",
               "TFLOP/s there", "HBM GiB there", "recompute s", "copies exposed s", "stopped at"}, {}};
      t.text_last = true;
      std::optional<Candidate> winner;  // the fastest variant at its largest batch (a copy: `r` is per variant)
      std::string winner_label;
      for (std::size_t i = 0; i < vs.size(); ++i) {
        auto& [label, c] = vs[i];
        LargestBatch r;
        try {
          r = largest_batch(c, *max_batch, *pow2);
        } catch (const InputError& e) {
          // The base was checked up front: what fails now is a field the variant set (or the batch searched).
          if (variants->empty()) throw;
          throw InputError("--variant " + (*variants)[i] + ": " + e.what());
        }
        const Candidate* at = r.answer();
        if (at && (!winner || at->report.tflops_per_device > winner->report.tflops_per_device)) {
          winner = *at;
          winner_label = label;
        }
        arr.push_back(largest_batch_json(label, r));
        const std::string other = !at ? "-" : micro_form ? std::to_string(at->report.global_batch) : std::to_string(r.micro_batch);
        // There, what the variant trades: time recomputing against the compute stream's wait on host copies.
        t.rows.push_back({label, format_number(r.batch), other, at ? fixed(at->report.tflops_per_device, 1) : "-",
                          at ? gib(at->report.hbm_peak_bytes) : "-", at ? fixed(at->report.compute_s.at("recompute"), 3) : "-",
                          at ? fixed(host_copies_exposed_s(at->report), 3) : "-", r.stopped});
      }
      if (*json) { std::cout << dump_json(arr, 2) << "\n"; return; }
      std::cout << t.render();
      if (!winner) {
        std::printf("\nno variant fits even the smallest batch\n");
        return;
      }
      std::printf("\nfastest: %s at %s %s, %.1f TFLOP/s/device, HBM %s GiB\n", winner_label.c_str(), micro_form ? "micro-batch" : "batch",
                  micro_form ? std::to_string(winner->config.micro_batch).c_str() : format_number(*winner->config.batch).c_str(),
                  winner->report.tflops_per_device,
                  gib(winner->report.hbm_peak_bytes).c_str());
      print_settings(winner->config);
    });
  }
  {
    auto* cmd = plan->add_subcommand("best-policy", "Best device/remat/offload placement per checkpoint name within HBM and host capacity");
    auto flags = make_run_flags(cmd);
    auto names = std::make_shared<std::vector<std::string>>();
    auto jobs = std::make_shared<int>(2);
    auto json = std::make_shared<bool>(false);
    auto pareto = std::make_shared<bool>(false);
    cmd->add_option("--names", *names, "Checkpoint names to place (default: the model's 8 largest)")->delimiter(',');
    cmd->add_option("--jobs", *jobs, "Worker threads");
    cmd->add_flag("--pareto", *pareto, "Also print the Pareto front of HBM peak vs TFLOP/s over every evaluated placement");
    cmd->add_flag("--json", *json, "Machine-readable output");
    auto batches = std::make_shared<std::vector<double>>();
    cmd->add_option("--batches", *batches, "Per-device batches to search, each on its own (instead of --batch): the best placement per batch and the fastest overall")
        ->delimiter(',');
    cmd->callback([=] {
      check_jobs(*jobs);
      if (!batches->empty()) {
        for (double b : *batches)
          if (!(b > 0)) throw InputError("--batches " + format_number(b) + " (must be > 0)");
        if (auto b = first_repeat(*batches); b != batches->end()) throw InputError("--batches " + format_number(*b) + " (given twice)");
        auto base = resolve_run_flags(*flags, {"batch"});
        if (base.micro_batch > 0)
          throw InputError("--batches (per-device batches, MaxText's form) with micro_batch = " + std::to_string(base.micro_batch) +
                           " (Megatron's form): give one of the two; plan largest-batch searches micro-batches");
        if (!names->empty()) check_policy_names(base, *names);
        announce_run(base, !*json, "base run (the search sets the batch and replaces the policy):");
        auto ns = names->empty() ? default_search_names(base) : *names;
        auto arr = nlohmann::json::array();
        Table t{{"batch", "best placement", "TFLOP/s", "tok/s/GPU", "HBM GiB", "host GiB", "evaluated"}, {}};
        std::optional<Candidate> winner;
        for (double b : *batches) {
          RunConfig c = base;
          c.batch = b;
          auto res = best_policy(c, ns, *jobs);
          auto j = policy_search_json(res);
          j["batch"] = b;
          arr.push_back(j);
          if (!res.found) {
            t.rows.push_back({format_number(b), "nothing fits", "-", "-", "-", "-", std::to_string(res.evaluated.size())});
            continue;
          }
          const StepReport& r = res.best.report;
          t.rows.push_back({format_number(b), placement_label(res.best.config), fixed(r.tflops_per_device, 1), fixed(r.tokens_per_s_per_device, 0),
                            gib(r.hbm_peak_bytes), gib(r.host_peak_bytes), std::to_string(res.evaluated.size())});
          if (!winner || r.tflops_per_device > winner->report.tflops_per_device) winner = res.best;
        }
        if (*json) {
          std::cout << dump_json(arr, 2) << "\n";
          return;
        }
        std::cout << t.render();
        if (!winner) {
          std::printf("\nno placement fits at any batch\n");
          return;
        }
        std::printf("\nfastest: batch %s, %s, %.1f TFLOP/s/device\n", format_number(*winner->config.batch).c_str(),
                    placement_label(winner->config).c_str(), winner->report.tflops_per_device);
        print_settings(winner->config);
        return;
      }
      auto base = resolve_run_flags(*flags);  // checks --policy too, which the search replaces (custom)
      if (!names->empty()) check_policy_names(base, *names);
      announce_run(base, !*json, "base run (the search replaces the policy):");
      auto ns = names->empty() ? default_search_names(base) : *names;
      auto res = best_policy(base, ns, *jobs);
      auto front = pareto_front(res.evaluated);
      if (*json) {
        std::cout << dump_json(policy_search_json(res), 2) << "\n";
        return;
      }
      // The search is at one batch: say which (the default is 1 when --batch is not given).
      std::printf("searched %s at the batch above%s; %zu placements evaluated\n", res.method.c_str(),
                  base.batch || base.micro_batch > 0 ? "" : " (--batch not given: 1 per device)",
                  res.evaluated.size());
      if (!res.found) {
        std::printf("no placement fits\n");
        // The default batch of 1 per device is tp x cp x pp sequences per replica: say what smaller batches exist.
        const double smallest = smallest_batch(base);
        if (!base.batch && base.micro_batch == 0 && smallest < 1)
          std::printf("smaller batches run: from %s per device (one sequence per model replica's micro-batch); try --batches %s,%s or plan largest-batch\n",
                      format_number(smallest).c_str(), format_number(smallest).c_str(), format_number(2 * smallest).c_str());
        return;
      }
      const StepReport& best = res.best.report;
      std::printf("best: %s\n  %.1f TFLOP/s/device, HBM %s GiB, host %s GiB\n", placement_label(res.best.config).c_str(),
                  best.tflops_per_device, gib(best.hbm_peak_bytes).c_str(), gib(best.host_peak_bytes).c_str());
      // What the placement trades: time spent recomputing against time waiting for copies.
      std::printf("  step %.3f s: recompute %.3f s, waiting on host copies %.3f s\n", best.step_time_s, best.compute_s.at("recompute"),
                  host_copies_exposed_s(best));
      print_settings(res.best.config);
      if (*pareto) {
        Table t{{"placement (Pareto front)", "HBM GiB", "TFLOP/s", "recompute s", "copies exposed s"}, {}};
        for (auto& c : front)
          t.rows.push_back({placement_label(c.config), gib(c.report.hbm_peak_bytes), fixed(c.report.tflops_per_device, 1),
                            fixed(c.report.compute_s.at("recompute"), 3), fixed(host_copies_exposed_s(c.report), 3)});
        std::cout << "\n" << t.render();
      }
    });
  }
  {
    auto* cmd = plan->add_subcommand("break-even", "Lowest host-link bandwidth at which the offload policy costs at most 1% against the best alternative that fits (on device, else rematerialized)");
    auto flags = make_run_flags(cmd);
    auto tol = std::make_shared<double>(0.01);
    auto json = std::make_shared<bool>(false);
    cmd->add_option("--tolerance", *tol, "Allowed slowdown (0.01 = 1%)");
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([=] {
      if (!(*tol >= 0 && *tol < 1))
        throw InputError("--tolerance = " + format_number(*tol) + " (must be in [0, 1): the slowdown allowed, 0.01 = 1%)");
      auto c = resolve_run_flags(*flags, {"host_link_bytes_per_s"});  // the search sets the host link
      check_break_even(c);  // before the run is described: a refused run prints only its error
      announce_run(c, !*json, "run (the search sets the host link):");
      auto r = break_even_bandwidth(c, *tol);
      if (*json) {
        std::cout << dump_json(break_even_json(r, *tol), 2) << "\n";
        return;
      }
      std::printf("reference, %s: %.1f TFLOP/s/device\n", r.reference.c_str(), r.reference_tflops);
      if (r.bytes_per_s > 0) std::printf("break-even host link: %.1f GB/s per GPU per direction (within %.1f%%)\n\n", r.bytes_per_s / 1e9, 100 * *tol);
      else std::printf("offload never comes within %.1f%% up to 4 TB/s\n\n", 100 * *tol);
      Table t{{"host link GB/s", "TFLOP/s", "vs reference"}, {}};
      for (auto& [bw, tf] : r.curve) t.rows.push_back({fixed(bw / 1e9, 1), fixed(tf, 1), fixed(100 * (tf / r.reference_tflops - 1), 2) + "%"});
      std::cout << t.render();
    });
  }
  {
    auto* cmd = plan->add_subcommand("layout", "Fastest parallel layout, micro-batch and policy for a model on N GPUs at a fixed global batch");
    auto flags = make_run_flags(cmd);
    auto search = add_search_flags(cmd);
    auto top = std::make_shared<std::size_t>(10);
    cmd->add_option("--top", *top, "How many layouts to list");
    cmd->footer(
        "The global batch is --global-batch (default: one sequence per GPU); the search sets tp, cp, pp, vp, ep, fsdp, dp,\n"
        "the sharded optimizer, the micro-batch and the policy, and keeps every other field given. A degree given as a\n"
        "flag is held to that value or comma-separated list (--tp 8, --pp 4,8, --sharded-optimizer on), tried even\n"
        "where the search would not try it;\n"
        "--policy and --micro-batch are one-item --policies and --micro-batches (a config file's degrees are searched,\n"
        "as a saved run names them all). For an MoE model under\n"
        "--framework megatron it also tries expert tensor parallelism 1 wherever tp > 1 (experts whole over an expert\n"
        "group spanning tp, listed as ep Nf) and combined 1F1B where Megatron allows it (ep No); --expert-tp 1 folds\n"
        "every such layout, --ep-overlap on overlaps every one it can. A policy may name Megatron recompute modules\n"
        "after no_recompute or selective, joined by +: no_recompute+moe_act+layernorm (tried by default where the\n"
        "model has them under --framework megatron).\n"
        "Examples:\n"
        "  hbmsim plan layout --model llama3.1-405b --gpus 1024 --system gb200-nvl72 --seq 8192\n"
        "  hbmsim plan layout --model llama3.1-70b --gpus 64 --global-batch 256 --seq 8192 --weights fp8 --top 5");
    cmd->callback([=] {
      auto [base, o] = resolve_search_flags(*flags, *search, {});
      o.top = *top;
      with_flag_names(o, [&] {
        check_layout_options(o);
        check_held_layout(base, o);
      });
      const auto start = std::chrono::steady_clock::now();
      const bool show = progress_wanted(search->progress);
      if (show) o.progress = search_progress("plan layout", start);
      const std::string held_note = o.held.empty() ? "" : "; held: " + held_text(held_fields(o));
      if (!search->json)
        std::printf("search: %s on %lld x %s GPUs, seq %lld, global batch %lld sequences%s\n", base.model.c_str(),
                    static_cast<long long>(base.gpus), base.system.c_str(), static_cast<long long>(base.seq),
                    static_cast<long long>(base.global_batch > 0 ? base.global_batch : base.gpus), held_note.c_str());
      auto r = search_layouts(base, o);
      if (show) std::fprintf(stderr, "\n");
      if (search->json) {
        std::cout << dump_json(layout_search_json(r), 2) << "\n";
        return;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%zu candidates (%zu of them state-offload retries of layouts that cannot fit): %zu refused, %zu pruned by the "
                  "memory bound, %zu by the step-time bound; %zu simulated, %zu fit (%.1f s)\n\n",
                  r.candidates, r.offloaded, r.refused, r.pruned, r.skipped, r.simulated, r.fitting, s);
      if (r.top.empty()) {
        std::printf("%s\n", r.none_fit.c_str());
        return;
      }
      Table t{{"#", "tp", "cp", "pp", "vp", "ep", "fsdp", "dp", "mbs", "GA", "policy", "in host", "tok/s/GPU", "TFLOP/s", "HBM GiB", "host GiB", "limited by"}, {}};
      t.text_last = true;
      for (std::size_t i = 0; i < r.top.size(); ++i) {
        const auto& [c, rep, limit] = r.top[i];
        auto row = degree_cells(c);
        row.insert(row.begin(), std::to_string(i + 1));
        for (auto cell : {std::to_string(c.micro_batch), std::to_string(rep.grad_accum), layout_policy_label(c), in_host(c), fixed(rep.tokens_per_s_per_device, 0),
                          fixed(rep.tflops_per_device, 1), gib(rep.hbm_peak_bytes), gib(rep.host_peak_bytes), limit})
          row.push_back(cell);
        t.rows.push_back(row);
      }
      std::cout << t.render();
      std::vector<const RunConfig*> listed;
      for (const auto& x : r.top) listed.push_back(&x.config);
      const RunConfig& best = r.top[0].config;
      std::printf("(%s)\n\nfastest: %s%s, policy %s, micro-batch %lld\n", ep_legend(listed).c_str(), r.top[0].report.mesh.c_str(),
                  layout_extra(best).c_str(), layout_policy_label(best).c_str(), static_cast<long long>(best.micro_batch));
      print_settings(r.top[0].config);
    });
  }
  {
    auto* cmd = plan->add_subcommand("scale", "Fastest layout at each of several GPU counts at one global batch, and the days and GPU-hours a token budget takes");
    auto flags = make_run_flags(cmd);
    auto search = add_search_flags(cmd);
    auto tokens = std::make_shared<double>(0);
    auto days = std::make_shared<double>(0);
    cmd->add_option("--tokens", *tokens, "Training budget in tokens (e.g. 15e12): days and GPU-hours at each count (0: none)");
    cmd->add_option("--days", *days, "Deadline in days (needs --tokens): the fewest GPUs that meet it (0: none)");
    cmd->footer(
        "--gpus takes the counts to compare, comma-separated. Each count is a plan layout search (its fastest layout,\n"
        "the same flags: held degrees, --policies, --micro-batches), all at one global batch: --global-batch, default\n"
        "one sequence per GPU at the largest count. Days are the budget over the simulated tokens/s (no restarts,\n"
        "checkpoints or evaluation); scaling is tokens/s per GPU over the smallest count's that fits.\n"
        "Examples:\n"
        "  hbmsim plan scale --model llama3.1-405b --system gb200-nvl72 --seq 8192 --gpus 512,1024,2048 --global-batch 2048 --tokens 15e12\n"
        "  hbmsim plan scale --model llama3.1-70b --system h100-hgx --seq 8192 --gpus 64,128,256 --tokens 2e12 --days 30 --framework megatron");
    cmd->callback([=] {
      RunFlags rest = *flags;
      ScalePlanOptions o;
      if (auto it = rest.values.find("gpus"); it != rest.values.end()) {
        o.gpu_counts = held_flag_values("gpus", it->second);
        rest.values.erase(it);
      }
      auto [base, so] = resolve_search_flags(rest, *search, {"gpus"});
      o.search = std::move(so);
      o.tokens = *tokens;
      o.days = *days;
      if (o.gpu_counts.empty()) o.gpu_counts = {base.gpus};
      with_flag_names(o.search, [&] { check_scale_options(base, o); }, {"gpus", "tokens", "days"});
      const auto start = std::chrono::steady_clock::now();
      if (progress_wanted(search->progress)) {
        auto current = std::make_shared<std::string>();
        o.on_count = [current](std::int64_t gpus, std::size_t i, std::size_t n) {
          *current = "plan scale: " + str(gpus) + " GPUs (" + str(static_cast<std::int64_t>(i + 1)) + " of " + str(static_cast<std::int64_t>(n)) + ")";
          std::fprintf(stderr, "%s%s", i ? "\n" : "", current->c_str());
        };
        o.search.progress = [current, start](std::size_t done, std::size_t total) {
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          std::fprintf(stderr, "\r%s: %zu/%zu simulated  %.0f s   ", current->c_str(), done, total, s);
        };
        o.on_row = [current](const ScaleRow& row) {  // what this count found, before the next one starts
          std::fprintf(stderr, "\r%s: %s   ", current->c_str(),
                       row.fits() ? (fixed(row.search.top[0].report.tokens_per_s_per_device, 0) + " tokens/s per GPU, " + row.search.top[0].report.mesh).c_str()
                                  : "nothing fits");
        };
      }
      const ScalePlan r = plan_scale(base, o);
      if (o.on_count) std::fprintf(stderr, "\n");
      if (search->json) {
        std::cout << dump_json(scale_plan_json(r), 2) << "\n";
        return;
      }
      print_scale_plan(base, o, r, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    });
  }
  for (const LayerCount what : {LayerCount::offload, LayerCount::recompute}) {
    const bool offload = what == LayerCount::offload;
    const std::string field = field_name(what);
    auto* cmd = plan->add_subcommand(offload ? "offload-layers" : "recompute-layers",
                                     offload ? "Fewest layers whose activations go to host (Megatron cpu_offloading_num_layers) for the run to fit"
                                             : "Fewest layers per chunk recomputed in full (Megatron recompute_num_layers, block) for the run to fit");
    auto flags = make_run_flags(cmd);
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->footer(std::string("Example:\n  hbmsim plan ") + (offload ? "offload-layers" : "recompute-layers") +
                " --model llama3.1-70b --gpus 64 --batch 2 --seq 8192 --weights fp8 --policy no_recompute");
    cmd->callback([=] {
      auto base = resolve_run_flags(*flags, {field});
      check_layer_count_search(base, what);  // before the run is described: a refused run prints only its error
      const std::string heading = "run (the search sets " + field + "):";
      announce_run(base, !*json, heading.c_str());
      auto r = fewest_layers(base, what);
      const nlohmann::json doc = layer_count_json(r);
      if (*json) {
        std::cout << dump_json(doc, 2) << "\n";
        return;
      }
      // What each count costs: the time recomputing and the compute stream's wait on host copies.
      Table t{{offload ? "layers offloaded" : "layers recomputed", "HBM GiB", "host GiB", "tok/s/GPU", "recompute s", "copies exposed s", "fits"}, {}};
      for (const auto& row : doc["tried"])
        t.rows.push_back({std::to_string(row[field].get<std::int64_t>()), gib(row["hbm_peak_bytes"].get<double>()),
                          gib(row["host_peak_bytes"].get<double>()), fixed(row["tokens_per_s_per_device"].get<double>(), 0),
                          fixed(row["recompute_s"].get<double>(), 3), fixed(row["host_copies_exposed_s"].get<double>(), 3),
                          row["fits"].get<bool>() ? "yes" : "no"});
      std::cout << t.render();
      if (r.layers < 0) {
        std::printf("\nno count fits: %s\n", r.why.c_str());
        return;
      }
      std::printf("\nfewest that fit: %s\n", r.why.c_str());
      print_settings(r.at(r.layers)->config);
    });
  }
  {
    auto* cmd = plan->add_subcommand("hbm-needed", "HBM and pinned host memory a batch and policy need");
    auto flags = make_run_flags(cmd);
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([=] {
      auto c = resolve_run_flags(*flags);
      announce_run(c, !*json);
      auto r = hbm_needed(c);
      if (*json) {
        std::cout << dump_json(hbm_needed_json(r), 2) << "\n";
        return;
      }
      std::printf("HBM needed %s GiB (the system has %s GiB), pinned host %s GiB\n", gib(r.hbm_bytes).c_str(),
                  gib(r.capacity_bytes).c_str(), gib(r.host_bytes).c_str());
      for (auto& [k, v] : r.report.hbm_breakdown_bytes)
        if (v > 0) std::printf("  %-18s%10s GiB\n", k.c_str(), gib(v).c_str());
      print_settings(c);
    });
  }
}

}  // namespace

void register_plan_commands(CLI::App& app) {
  register_plan(app);
  register_calibrate(app);
  register_bench_command(app);
}

int plan_exit_status() { return g_status; }

}  // namespace hbmsim::cli
