// What a run actually was, once resolved (the fsdp degree the GPUs left, the batch in both meanings, the
// calibration and where it came from), and the warnings a user should see before trusting the answer.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/run_config.hpp"

namespace hbmsim {

// The resolved run as JSON (`simulate --json`'s "run"): system, model, GPUs, layout and degrees, batch,
// micro-batch, global batch, accumulation, sequence, policy, dtypes, schedule flags, calibration.
nlohmann::json resolved_run(const RunConfig& config, const PreparedRun& run);
// The same as lines for a human report ("run          llama3.1-70b on 64 x gb200-nvl72 GPUs", ...).
std::vector<std::string> resolved_run_lines(const nlohmann::json& run);
// "datasheet (uncalibrated)" or "gb200-fitted (fitted on gb200-nvl72)".
std::string calibration_text(const System& system);

// Inputs that are legal but probably not what was meant, one line each: an MoE model with ep 1 on more
// than one GPU, a profile made on another system, a what-if figure an order of magnitude away from the
// system's own. They never change the result or the exit status.
std::vector<std::string> run_warnings(const RunConfig& config, const PreparedRun& run);

// One simulated run as every front end reports it (`simulate --json`, Python's simulate).
struct ResolvedSimulation {
  StepReport report;
  RunConfig config;  // as given, with fsdp resolved to the degree the GPUs left
  nlohmann::json run;
  std::vector<std::string> warnings;
  // The report's fields plus "config", "run" and "warnings".
  nlohmann::json to_json() const;
};
// fast_forward off: every event simulated (SimOptions::fast_forward), to check a result or time the engine.
ResolvedSimulation simulate_resolved(const RunConfig& config, bool trace = false, bool fast_forward = true);

}  // namespace hbmsim
