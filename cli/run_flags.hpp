// Flags shared by simulate, graph, sweep and plan: each maps to one RunConfig field.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "planner/run_config.hpp"

namespace hbmsim::cli {

struct RunFlags {
  std::string config_file;
  std::map<std::string, std::string> values;  // field -> text, only the flags given
  std::vector<std::string> tensors;
};

std::shared_ptr<RunFlags> make_run_flags(CLI::App* cmd);
// The flag as a user types it for a RunConfig field ("hbm_bytes" -> "--hbm-bytes"); "--" + field for a field
// without a flag of its own.
std::string flag_for_field(const std::string& field);

// The config file (if any), then every flag given on top of it, then a check of every field up front (system,
// calibration, model, dtypes, policy, training shape, what-if figures) before anything is simulated, so that
// an error names the flag as typed (--attention-dtype) or the config file and field (run.json: system), and
// a value the command would otherwise ignore (plan best-policy --policy fastest) is refused. `varied` names
// the fields the command itself sets per run (sweep axes, variants, largest-batch's batch, "tensor.NAME"):
// those, and the checks that depend on them, are left to each run.
RunConfig resolve_run_flags(const RunFlags& flags, const std::set<std::string>& varied = {});

// The same up-front check for a run config file on its own (calibrate fit --maxtext LOG=CONFIG).
void check_run_config_file(const std::string& path);

}  // namespace hbmsim::cli
