#include "cli/commands.hpp"

namespace hbmsim::cli {
void register_plan_commands(CLI::App&) {}
}  // namespace hbmsim::cli
