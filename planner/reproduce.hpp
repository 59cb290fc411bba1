// The measured GB200 runs (data/reference/seed_runs.json) next to what hbmsim predicts for them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/run_config.hpp"

namespace hbmsim {

struct ReferenceRun {
  std::string id;
  RunConfig config;  // the documented choices for what the seed did not report (data/reference/seed_configs.json)
  std::optional<double> tflops_per_device, hbm_gib, host_gib;
  std::optional<bool> fits;
};

// Loads the reference runs and the configs that reproduce them (built-in unless paths are given).
std::vector<ReferenceRun> load_reference_runs(const std::string& runs_path = "", const std::string& configs_path = "");

// The config of one built-in reference run by id (e.g. "dsv3-offload-lhs-pipe-mbs8"); benchmarks use these.
RunConfig reference_config(const std::string& id);

struct ReproRow {
  ReferenceRun run;
  StepReport predicted;
  // Relative errors (predicted / reported - 1) where reported.
  std::optional<double> tflops_error, hbm_error, host_error;
  std::optional<bool> fits_right;
};

// Simulates every reference run; `calibration` is a profile path or built-in name ("" = datasheet figures).
std::vector<ReproRow> reproduce(const std::vector<ReferenceRun>& runs, const std::string& calibration);

struct ClaimCheck {
  std::string claim;
  double reported = 0, predicted = 0;  // the claimed quantity (a ratio in %, or an ordering as 1/0)
  bool holds = false;                  // ordering right / ratio within tolerance
  std::string detail;
};
// The orderings and ratios stated in seed_runs.json "claims", checked on reproduce rows.
std::vector<ClaimCheck> check_claims(const std::vector<ReproRow>& rows);

nlohmann::json repro_json(const std::vector<ReproRow>& rows, const std::vector<ClaimCheck>& claims);

}  // namespace hbmsim
