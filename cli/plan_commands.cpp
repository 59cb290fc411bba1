// plan, calibrate and bench subcommands.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/files.hpp"
#include "cli/format.hpp"
#include "cli/run_flags.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/fit.hpp"

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
  cal->require_subcommand(1);
  {
    auto* cmd = cal->add_subcommand("measure", "Run the CUDA measurement on this machine's GPU and write a profile");
    auto out = std::make_shared<std::string>();
    auto raw = std::make_shared<std::string>();
    auto quick = std::make_shared<bool>(false);
    cmd->add_option("-o,--out", *out, "Profile JSON to write")->required();
    cmd->add_option("--raw", *raw, "Raw measurements JSON to write");
    cmd->add_flag("--quick", *quick, "Fewer sizes and repeats");
    cmd->callback([=] {
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
    auto jobs = std::make_shared<int>(2);
    cmd->add_option("--runs", *runs, "Measured runs in seed_runs.json format (default: the built-in GB200 runs)");
    cmd->add_option("--configs", *configs, "Configs for those runs (seed_configs.json format)");
    cmd->add_option("--maxtext", *logs, "LOG.jsonl=CONFIG.json: a MaxText metrics log and the run config it ran (repeatable)");
    cmd->add_flag("--no-seed-runs", *no_seed, "Fit only the --maxtext runs");
    cmd->add_option("--parameters", *params, "Parameter list with bounds (default data/fit/parameters.json)");
    cmd->add_option("-o,--out", *out, "Write the fitted profile here");
    cmd->add_option("--name", *name, "Profile name");
    cmd->add_flag("--leave-one-out", *loo, "Also predict each run from a fit that excluded it");
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->add_option("--jobs", *jobs, "Threads for the simulations of one evaluation");
    cmd->callback([=] {
      std::vector<MeasuredRun> measured;
      if (!*no_seed) measured = measured_from_reference(load_reference_runs(*runs, *configs));
      for (auto& spec : *logs) {
        auto eq = spec.find('=');
        if (eq == std::string::npos) throw InputError("--maxtext " + spec + " (expected LOG.jsonl=CONFIG.json)");
        measured.push_back(measured_from_maxtext_log(spec.substr(0, eq), spec.substr(eq + 1)));
      }
      FitOptions o;
      o.leave_one_out = *loo;
      o.jobs = *jobs;
      auto ps = load_fit_parameters(*params);
      auto res = fit_parameters(measured, ps, o);
      std::string source = "hbmsim calibrate fit" + std::string(*loo ? " --leave-one-out" : "") + " over " +
                           std::to_string(measured.size()) + " measured runs";
      if (!out->empty()) write_file_atomically(*out, res.profile(*name, source).to_json().dump(2) + "\n");
      if (*json) {
        std::cout << res.to_json().dump(2) << "\n";
        return;
      }
      Table p{{"parameter", "fitted", "lo", "hi"}, {}};
      for (auto& f : ps) p.rows.push_back({f.name, fixed(res.parameters.at(f.name), 3), fixed(f.lo, 2), fixed(f.hi, 2)});
      std::cout << p.render() << "\n";
      Table r{{"run", "TFLOP/s measured", "fitted", "error", "leave-one-out", "error"}, {}};
      for (auto& x : res.tflops) {
        std::string loo_v = "-", loo_e = "-";
        for (auto& l : res.leave_one_out)
          if (l.id == x.id) {
            loo_v = fixed(l.predicted, 1);
            loo_e = fixed(100 * l.error(), 1) + "%";
          }
        r.rows.push_back({x.id, fixed(x.measured, 1), fixed(x.predicted, 1), fixed(100 * x.error(), 1) + "%", loo_v, loo_e});
      }
      std::cout << r.render() << "\n";
      Table h{{"run", "HBM GiB measured", "fitted", "error"}, {}};
      for (auto& x : res.hbm) h.rows.push_back({x.id, gib(x.measured), gib(x.predicted), fixed(100 * x.error(), 1) + "%"});
      std::cout << h.render();
      std::printf("\nrms log error %.4f after %d evaluations\n", res.rms_log_error, res.evaluations);
    });
  }
}

}  // namespace

void register_plan_commands(CLI::App& app) {
  register_calibrate(app);
  (void)g_status;
}

int plan_exit_status() { return g_status; }

}  // namespace hbmsim::cli
