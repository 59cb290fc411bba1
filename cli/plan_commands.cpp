// plan (its layout-search subcommands are cli/layout_commands.cpp), calibrate and bench subcommands.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
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
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/plan_json.hpp"
#include "planner/published_runs.hpp"
#include "planner/sweep.hpp"

namespace hbmsim::cli {

namespace {

int g_status = 0;

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

void register_plan(CLI::App& app) {
  auto* plan = app.add_subcommand("plan", "Capacity questions: largest batch, best policy, Pareto front, break-even link, HBM needed, fastest layout, GPU count");
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
  register_layout_commands(plan);
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
      if (r.fits_from_bytes < r.hbm_bytes || r.full_speed_from_bytes > r.hbm_bytes)
        std::printf("The capacity shapes the schedule (LHS holds a prefetch back while HBM would pass %s%% of it, less a backward\n"
                    "iteration's needs): the step fits from %s GiB (%.3f s, %+.1f%%) and takes its %.3f s from %s GiB\n",
                    format_number(100 * c.memory_limit_slop).c_str(), gib(r.fits_from_bytes).c_str(), r.step_time_at_fit_s,
                    100 * (r.step_time_at_fit_s / r.step_time_s - 1), r.step_time_s, gib(r.full_speed_from_bytes).c_str());
      print_settings(c);
    });
  }
}

}  // namespace

void print_settings(const RunConfig& c) {
  auto s = runnable_settings(c);
  std::printf("  simulate --config JSON: %s\n", dump_json(s["simulate_config"]).c_str());
  std::printf("  MaxText: %s\n", s["maxtext"].get<std::string>().c_str());
  std::printf("  XLA_FLAGS: %s\n", s["xla_flags"].get<std::string>().c_str());
  std::printf("  Megatron: %s\n", s["megatron"].get<std::string>().c_str());
}

void register_plan_commands(CLI::App& app) {
  register_plan(app);
  register_calibrate(app);
  register_bench_command(app);
}

int plan_exit_status() { return g_status; }

}  // namespace hbmsim::cli
