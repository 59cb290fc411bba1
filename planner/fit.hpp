// Calibration fit: a few named physical parameters (data/fit/parameters.json), bounded, fitted by least
// squares to measured runs; residuals and leave-one-out errors reported; output is a calibration profile.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hwmodels/profile.hpp"
#include "planner/published_runs.hpp"
#include "planner/reproduce.hpp"

namespace hbmsim {

struct FitParameter {
  std::string name;
  double lo = 0, hi = 1, initial = 1;
  std::string meaning;
};
std::vector<FitParameter> load_fit_parameters(const std::string& path = "");

struct MeasuredRun {
  std::string id;
  std::string group;  // where it was published (a corpus row's source): leave-one-group-out leaves these out together
  RunConfig config;
  std::optional<double> tflops_per_device;
  std::optional<double> hbm_bytes;
};

std::vector<MeasuredRun> measured_from_reference(const std::vector<ReferenceRun>& runs);
// A MaxText metrics log (JSON lines with perf/step_time_seconds, perf/per_device_tflops_per_sec, and
// optionally memory/peak_bytes_in_use) and the RunConfig it ran. The first `skip_steps` steps are warm-up.
MeasuredRun measured_from_maxtext_log(const std::string& log_path, const std::string& config_path, int skip_steps = 2);
// The validation corpus's measured rows (planner/validation.hpp), as validate expresses them under `calibration`
// (an unstated recompute resolved there, then fixed): tokens/s per GPU as TFLOP/s per device in hbmsim's
// FLOP count (the ratio to a prediction is the same), grouped by source. Rows not expressed are skipped, and
// so are outliers: rows whose prediction under `calibration` is more than kCorpusOutlierRatio times off the
// measurement either way, which no efficiency scale explains (NeMo 25.04's DeepSeek-V3 on GB200 ran at a third
// of what the same model later ran on the same racks); a least-squares fit in log space would bend every
// scale toward one such row. They stay in validate's statistics.
constexpr double kCorpusOutlierRatio = 2;
struct CorpusRuns {
  std::vector<MeasuredRun> runs;
  std::vector<std::string> outliers;  // "corpus row 50 (DGXC-05): predicted 4.44x the measurement"
};
CorpusRuns measured_from_corpus(const std::vector<PublishedRun>& runs, const std::string& calibration, int jobs);

struct Residual {
  std::string id, group;  // the run's, and its MeasuredRun::group
  double measured = 0, predicted = 0;
  double error() const { return predicted / measured - 1; }
};

struct FitResult {
  std::map<std::string, double> parameters;
  std::vector<Residual> tflops, hbm;   // with the fitted parameters
  std::vector<Residual> leave_one_out; // TFLOP/s of each run predicted by a fit that excluded it
  std::vector<Residual> leave_one_group_out;  // ... by a fit that excluded its whole group (source)
  double rms_log_error = 0;
  int evaluations = 0;
  std::string system;  // the system every run was on ("" when they differ): the profile's "system"
  Profile profile(const std::string& name, const std::string& source) const;
  nlohmann::json to_json() const;
};

struct FitOptions {
  bool leave_one_out = false;
  bool leave_one_group_out = false;
  int max_evaluations = 400;
  int jobs = 2;
  // Called after every evaluation (a corpus fit runs for minutes): which fit ("all", "without SRC", "without
  // RUN"), its evaluation count and objective (mean squared log error).
  std::function<void(const std::string& fit, int evaluations, double objective)> progress;
};

// Deterministic: Nelder-Mead in a bounded (logistic) space from the parameters' initial values.
FitResult fit_parameters(const std::vector<MeasuredRun>& runs, const std::vector<FitParameter>& params,
                         const FitOptions& options);

// Predictions of every run under a set of parameter values (exposed for tests).
std::vector<StepReport> predict_with(const std::vector<MeasuredRun>& runs, const std::map<std::string, double>& params,
                                     int jobs = 1);

}  // namespace hbmsim
