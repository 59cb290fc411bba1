#pragma once
#include <CLI/CLI.hpp>

namespace hbmsim::cli {
void register_commands(CLI::App& app);
void register_planner_commands(CLI::App& app);  // reproduce, sweep
void register_plan_commands(CLI::App& app);     // plan, calibrate, bench
int plan_exit_status();
void register_bench_command(CLI::App& app);
int exit_status();  // set by commands that finish with a non-zero status without throwing
}  // namespace hbmsim::cli
