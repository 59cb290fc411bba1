// hbmsim against the published measured runs (data/reference/published_runs.csv): each row mapped to a
// RunConfig by rules on its columns alone (nothing fitted, nothing per row), simulated, and its tokens/s per GPU
// compared with the measured figure. Rows the rules cannot express, or hbmsim refuses, are kept with the reason.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "planner/published_runs.hpp"
#include "planner/run_config.hpp"

namespace hbmsim {

struct RunMapping {
  std::optional<RunConfig> config;  // set when the row is expressible
  std::string reason;               // why not, when config is empty
  std::string recompute;            // how remat_offload was read ("none stated: minimal_with_context", ...)
  bool recompute_unstated = false;  // no recompute setting was given (see validate_runs)
  std::vector<std::string> remarks; // consistency remarks that do not stop the row (a GAn note that disagrees)
  std::string system_id, model_id;  // the built-in system and model the row maps to ("" when they do not)
};

// The mapping rules (documented where they are applied in validation.cpp, and in docs/validation.md).
RunMapping map_published_run(const PublishedRun& run);

struct ValidationRow {
  PublishedRun run;
  RunMapping mapping;
  std::optional<StepReport> predicted;  // set when simulated
  std::string reason;                   // not expressed: the mapping's reason or "hbmsim refuses: ..."
  std::optional<double> error;          // predicted / measured tokens/s per GPU - 1 (measured rows only)
  bool expressed() const { return predicted.has_value(); }
};

// Called as rows finish: the phase ("simulated", then "recompute searches" for rows that state no recompute and
// do not fit), how many of its rows are done and how many it has. Never called concurrently.
using ValidationProgress = std::function<void(const std::string& phase, std::size_t done, std::size_t total)>;

// Simulates every row on `jobs` threads; rows come back in the input order. `calibration`: a profile file or
// built-in name ("" = datasheet figures).
std::vector<ValidationRow> validate_runs(const std::vector<PublishedRun>& runs, const std::string& calibration, int jobs = 2,
                                         const ValidationProgress& progress = {});

struct ErrorSummary {
  std::string group;                   // "all", or the src / system / model
  int total = 0, expressed = 0, measured = 0;  // rows; expressed; expressed with a measured tokens/s (the statistics')
  std::optional<double> mape, median_abs_error;  // fractions
  int worst_row = 0;                   // the row with the largest |error| (0: none)
  double worst_error = 0;
};

struct ValidationSummary {
  ErrorSummary overall;
  std::vector<ErrorSummary> by_src, by_system, by_model;  // each in first-appearance order
};

ValidationSummary summarize_validation(const std::vector<ValidationRow>& rows);
// The hbmsim system and model ids a row's statistics group under (the CSV's text when the row maps to none).
std::string validation_system_group(const ValidationRow& row);
std::string validation_model_group(const ValidationRow& row);

}  // namespace hbmsim
