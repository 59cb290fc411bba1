// Flags shared by simulate, graph, sweep and plan: each maps to one RunConfig field.
#pragma once
#include <map>
#include <memory>
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
// The config file (if any), then every flag given on top of it.
RunConfig resolve_run_flags(const RunFlags& flags);

}  // namespace hbmsim::cli
