// validate: every published measured run (data/reference/published_runs.csv) simulated and compared.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/validation_report.hpp"

namespace hbmsim::cli {

namespace {

std::string pct(double e) { return (e >= 0 ? "+" : "") + fixed(100 * e, 1) + "%"; }
std::string opt_pct(const std::optional<double>& e) { return e ? fixed(100 * *e, 1) + "%" : "-"; }

void add_summary_rows(Table& t, const std::string& kind, const std::vector<ErrorSummary>& groups) {
  for (const auto& s : groups)
    t.rows.push_back({kind, s.group, std::to_string(s.total), std::to_string(s.expressed), std::to_string(s.measured), opt_pct(s.mape),
                      opt_pct(s.median_abs_error), s.worst_row ? "row " + std::to_string(s.worst_row) + " (" + pct(s.worst_error) + ")" : "-"});
}

void print_validation(const std::vector<ValidationRow>& rows, const ValidationSummary& summary, const std::string& calibration,
                      const std::string& origin) {
  std::cout << "Published measured runs (" << origin << ") vs hbmsim, " << calibration_label(calibration) << "\n\n";
  Table t{{"#", "src", "system", "GPUs", "model", "prec", "layout", "meas tok/s/GPU", "pred", "err", "TFLOP/s pred", "HBM GiB",
           "fits", "note"},
          {}};
  t.text_last = true;
  for (const auto& r : rows) {
    const auto& p = r.predicted;
    t.rows.push_back({std::to_string(r.run.row), r.run.src, r.run.system, std::to_string(r.run.gpus), r.run.model, r.run.prec,
                      validation_layout(r), r.run.tok_s_gpu ? fixed(*r.run.tok_s_gpu, 0) : "-",
                      p ? fixed(p->tokens_per_s_per_device, 0) : "-", r.error ? pct(*r.error) : "-", p ? fixed(p->tflops_per_device, 1) : "-",
                      p ? gib(p->hbm_peak_bytes) : "-", p ? (p->fits ? "yes" : "NO") : "-", validation_note(r)});
  }
  std::cout << t.render() << "\nTokens/s per GPU, error = predicted / measured - 1 (" << calibration_label(calibration) << "):\n";
  Table s{{"by", "group", "rows", "expressed", "measured", "MAPE", "median |err|", "worst"}, {}};
  add_summary_rows(s, "all", {summary.overall});
  add_summary_rows(s, "src", summary.by_src);
  add_summary_rows(s, "system", summary.by_system);
  add_summary_rows(s, "model", summary.by_model);
  std::cout << s.render();
}

}  // namespace

void register_validate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Every published measured run (Megatron/NeMo tables): measured vs predicted tokens/s");
  auto json = std::make_shared<bool>(false);
  auto csv = std::make_shared<bool>(false);
  auto markdown = std::make_shared<bool>(false);
  auto calibration = std::make_shared<std::string>();
  auto runs = std::make_shared<std::string>();
  auto jobs = std::make_shared<int>(2);
  auto rows_wanted = std::make_shared<std::string>();
  auto progress = std::make_shared<std::string>("auto");
  cmd->add_flag("--json", *json, "Machine-readable output");
  cmd->add_flag("--csv", *csv, "One CSV line per run");
  cmd->add_flag("--markdown", *markdown, "The Markdown report (docs/validation.md)");
  cmd->add_option("--calibration", *calibration, "Calibration profile (file or built-in name, e.g. gb200-fitted); default: datasheet figures");
  cmd->add_option("--runs", *runs, "Runs file (published_runs.csv columns); default: the built-in data/reference/published_runs.csv");
  cmd->add_option("--jobs", *jobs, "Worker threads (the output order is the file's either way)");
  cmd->add_option("--rows", *rows_wanted, "Only these data rows, by the file's numbers (e.g. 46,48 or 15-18); default: all");
  cmd->add_option("--progress", *progress, kProgressHelp);
  cmd->callback([=] {
    const bool show = progress_wanted(*progress);
    if (*json + *csv + *markdown > 1) throw InputError("--json, --csv and --markdown (give at most one)");
    const std::string origin = published_runs_origin(*runs);
    check_calibration(*calibration, "--calibration");  // named as the flag; the run reads the file
    ValidationProgress report;
    const auto start = std::chrono::steady_clock::now();
    if (show)
      report = [start](const std::string& phase, std::size_t done, std::size_t total) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "\rvalidate: %zu/%zu %s  %.0f s   %s", done, total, phase.c_str(), s, done == total ? "\n" : "");
      };
    auto rows = validate_runs(select_rows(load_published_runs(*runs), *rows_wanted), *calibration, *jobs, report);
    auto summary = summarize_validation(rows);
    if (*json) std::cout << dump_json(validation_json(rows, summary, *calibration, origin), 2) << "\n";
    else if (*csv) std::cout << validation_csv(rows);
    else if (*markdown) std::cout << validation_markdown(rows, summary, *calibration, origin);
    else print_validation(rows, summary, *calibration, origin);
  });
}

}  // namespace hbmsim::cli
