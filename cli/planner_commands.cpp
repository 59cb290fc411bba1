#include "cli/commands.hpp"

namespace hbmsim::cli {
void register_planner_commands(CLI::App&) {}
}  // namespace hbmsim::cli
