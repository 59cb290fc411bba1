// Calibration fit: a few named physical parameters (data/fit/parameters.json), bounded, fitted by least
// squares to measured runs; residuals and leave-one-out errors reported; output is a calibration profile.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hwmodels/profile.hpp"
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
  RunConfig config;
  std::optional<double> tflops_per_device;
  std::optional<double> hbm_bytes;
};

std::vector<MeasuredRun> measured_from_reference(const std::vector<ReferenceRun>& runs);
// A MaxText metrics log (JSON lines with perf/step_time_seconds, perf/per_device_tflops_per_sec, and
// optionally memory/peak_bytes_in_use) and the RunConfig it ran. The first `skip_steps` steps are warm-up.
MeasuredRun measured_from_maxtext_log(const std::string& log_path, const std::string& config_path, int skip_steps = 2);

struct Residual {
  std::string id;
  double measured = 0, predicted = 0;
  double error() const { return predicted / measured - 1; }
};

struct FitResult {
  std::map<std::string, double> parameters;
  std::vector<Residual> tflops, hbm;   // with the fitted parameters
  std::vector<Residual> leave_one_out; // TFLOP/s of each run predicted by a fit that excluded it
  double rms_log_error = 0;
  int evaluations = 0;
  std::string system;  // the system every run was on ("" when they differ): the profile's "system"
  Profile profile(const std::string& name, const std::string& source) const;
  nlohmann::json to_json() const;
};

struct FitOptions {
  bool leave_one_out = false;
  int max_evaluations = 400;
  int jobs = 2;
};

// Deterministic: Nelder-Mead in a bounded (logistic) space from the parameters' initial values.
FitResult fit_parameters(const std::vector<MeasuredRun>& runs, const std::vector<FitParameter>& params,
                         const FitOptions& options);

// Predictions of every run under a set of parameter values (exposed for tests).
std::vector<StepReport> predict_with(const std::vector<MeasuredRun>& runs, const std::map<std::string, double>& params,
                                     int jobs = 1);

}  // namespace hbmsim
