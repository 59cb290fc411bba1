// reproduce, validate, sweep, plan, calibrate and bench subcommands.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/files.hpp"
#include "cli/format.hpp"
#include "cli/run_flags.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/reproduce.hpp"
#include "planner/run_summary.hpp"
#include "planner/sweep.hpp"

namespace hbmsim::cli {

namespace {

std::string pct(const std::optional<double>& e) { return e ? (*e >= 0 ? "+" : "") + fixed(100 * *e, 1) + "%" : "-"; }
std::string opt_num(const std::optional<double>& v, int digits) { return v ? fixed(*v, digits) : "-"; }

void print_repro(const std::vector<ReproRow>& rows, const std::vector<ClaimCheck>& claims, const std::string& calibration) {
  std::printf("GB200 NVL72, 128 GPUs: measured MaxText runs (seed documents) vs hbmsim (%s)\n\n",
              calibration.empty() ? "datasheet figures, no calibration" : ("calibration " + calibration).c_str());
  Table t{{"run", "policy", "LHS", "pipe", "TFLOP/s rep", "pred", "err", "HBM GiB rep", "pred", "err", "host GiB rep", "pred",
           "fits rep", "pred"},
          {}};
  for (auto& r : rows) {
    const auto& c = r.run.config;
    std::string policy = c.policy;
    if (!c.tensors.empty()) policy = c.tensors.begin()->second + " (" + std::to_string(c.tensors.size()) + " names)";
    t.rows.push_back({r.run.id, policy, c.lhs ? "on" : "off", c.pipelined_transfers ? "on" : "off",
                      opt_num(r.run.tflops_per_device, 1), fixed(r.predicted.tflops_per_device, 1), pct(r.tflops_error),
                      opt_num(r.run.hbm_gib, 1), gib(r.predicted.hbm_peak_bytes), pct(r.hbm_error),
                      opt_num(r.run.host_gib, 1), gib(r.predicted.host_peak_bytes),
                      r.run.fits ? (*r.run.fits ? "yes" : "OOM") : "-", r.predicted.fits ? "yes" : "OOM"});
  }
  std::cout << t.render() << "\nClaims from the seed documents:\n";
  Table c{{"claim", "reported", "predicted", "holds"}, {}};
  for (auto& cl : claims) c.rows.push_back({cl.claim, fixed(cl.reported, 1), fixed(cl.predicted, 1), cl.holds ? "yes" : "NO"});
  std::cout << c.render();
}

}  // namespace

void register_planner_commands(CLI::App& app) {
  // reproduce
  {
    auto* cmd = app.add_subcommand("reproduce", "Every measured GB200 run of the seed documents: reported vs predicted");
    auto json = std::make_shared<bool>(false);
    auto calibration = std::make_shared<std::string>();
    auto runs = std::make_shared<std::string>();
    auto configs = std::make_shared<std::string>();
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->add_option("--calibration", *calibration, "Calibration profile (file or built-in name, e.g. gb200-fitted)");
    cmd->add_option("--runs", *runs, "Measured runs file (seed_runs.json format); default: the built-in copy");
    cmd->add_option("--configs", *configs, "How to configure each run; default: data/reference/seed_configs.json");
    cmd->callback([=] {
      check_calibration(*calibration, "--calibration");  // named as the flag; the run reads the file
      auto rows = reproduce(load_reference_runs(*runs, *configs), *calibration);
      auto claims = check_claims(rows);
      if (*json) std::cout << dump_json(repro_json(rows, claims), 2) << "\n";
      else print_repro(rows, claims, *calibration);
    });
  }
  register_validate_command(app);
  // sweep
  {
    auto* cmd = app.add_subcommand("sweep", "Run the Cartesian product of --axis values; rows stream to --out as they finish");
    auto base = std::make_shared<std::string>();
    auto axes = std::make_shared<std::vector<std::string>>();
    auto where = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto format = std::make_shared<std::string>();
    auto jobs = std::make_shared<int>(1);
    auto resume = std::make_shared<bool>(false);
    auto progress = std::make_shared<std::string>("auto");
    // Base config: same flags as simulate.
    auto flags = make_run_flags(cmd);
    cmd->add_option("--axis", *axes, "FIELD=v1,v2,... (repeatable; fields as in simulate --config, or tensor.NAME)")->required();
    cmd->add_option("--where", *where, "Keep points where FIELD==V, FIELD!=V, FIELD<=N, ... (comma-separated, all must hold)");
    cmd->add_option("--out", *out, "Output file (CSV, or JSON lines when it ends in .jsonl); default stdout");
    cmd->add_option("--format", *format, "csv or jsonl (default from --out's extension)");
    cmd->add_option("--jobs", *jobs, "Worker threads");
    cmd->add_flag("--resume", *resume, "Keep the rows already in --out and run only the missing ones");
    cmd->add_option("--progress", *progress, kProgressHelp);
    cmd->callback([=] {
      const bool show = progress_wanted(*progress);
      std::vector<SweepAxis> parsed;
      std::set<std::string> varied;
      for (auto& a : *axes) {
        parsed.push_back(parse_axis(a));
        varied.insert(parsed.back().field);
      }
      RunConfig b = resolve_run_flags(*flags, varied);
      std::string fmt = *format;
      if (fmt.empty()) fmt = out->size() > 6 && out->substr(out->size() - 6) == ".jsonl" ? "jsonl" : "csv";
      if (fmt != "csv" && fmt != "jsonl") throw InputError("--format = \"" + fmt + "\" (expected csv or jsonl)");
      // A resumed file keeps its column order: the same axes given in another order are put in the file's.
      SweepFile prior;
      if (*resume && !out->empty()) {
        prior = read_sweep_file(*out);
        std::vector<SweepAxis> ordered;
        for (auto& name : prior.axes)
          for (auto& a : parsed)
            if (a.field == name) ordered.push_back(a);
        if (prior.rows > 0 && ordered.size() == parsed.size()) parsed = ordered;
        if (prior.rows > 0 && !prior.foreign && prior.format != fmt)  // a foreign file: resume_skip says so
          throw InputError(*out + ": holds " + prior.format + " rows; this sweep writes " + fmt + " (--format)");
      }
      auto points = expand_sweep(b, parsed, *where);
      if (!points.empty()) {
        try {
          print_warnings(run_warnings(points.front().config, prepare_run(points.front().config)));
        } catch (const InputError&) {
          // that point is bad input: its row says so
        }
      }
      std::set<std::size_t> skip;
      FILE* f = stdout;
      if (!out->empty()) {
        if (*resume) {
          skip = resume_skip(*out, prior, parsed, points);
          // Drop a torn last line a kill may have left, so appended rows start on a line of their own.
          truncate_to_last_newline(*out);
        }
        bool fresh = !*resume || !file_has_content(*out);
        f = std::fopen(out->c_str(), fresh ? "wb" : "ab");
        if (!f) throw InputError(*out + ": cannot be opened for writing");
        if (fresh && fmt == "csv") std::fputs(sweep_csv_header(parsed).c_str(), f);
      } else if (fmt == "csv") {
        std::fputs(sweep_csv_header(parsed).c_str(), f);
      }
      std::fflush(f);
      const std::size_t total = points.size(), todo = total - std::min(total, skip.size());
      std::size_t done = 0;
      auto t0 = std::chrono::steady_clock::now();
      run_sweep(points, *jobs, [&](const SweepRow& row) {
        std::string line = fmt == "csv" ? sweep_csv_line(row) : sweep_jsonl_line(parsed, row);
        std::fwrite(line.data(), 1, line.size(), f);  // whole lines, flushed: a kill never tears a finished row
        std::fflush(f);
        ++done;
        if (show && (done % 50 == 0 || done == todo)) {
          double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          double rate = done / std::max(s, 1e-9);
          std::fprintf(stderr, "\rsweep: %zu/%zu  %.0f configs/s  ETA %.0f s   ", done, todo, rate, (todo - done) / rate);
          if (done == todo) std::fputc('\n', stderr);
        }
      }, skip);
      if (f != stdout) std::fclose(f);
    });
  }
  register_plan_commands(app);
}

}  // namespace hbmsim::cli
