#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/run_config.hpp"

namespace hbmsim::cli {
void register_commands(CLI::App& app);
void register_planner_commands(CLI::App& app);  // reproduce, sweep
void register_plan_commands(CLI::App& app);     // plan, calibrate, bench
int plan_exit_status();
void register_layout_commands(CLI::App* plan);  // plan layout, plan scale (under `plan`)
// A plan's answer as settings to run it with: simulate config, MaxText keys, XLA flags, Megatron arguments.
void print_settings(const RunConfig& c);
void register_bench_command(CLI::App& app);
void register_validate_command(CLI::App& app);  // validate: the published measured runs
int exit_status();
// Warnings to stderr, one line each ("hbmsim: warning: ..."); they never change the exit status.
void print_warnings(const std::vector<std::string>& warnings);
// Resolves `config` as it will run, prints its warnings, and (human) its resolved-run lines under `title`;
// returns the resolved run as JSON for a --json output.
nlohmann::json announce_run(const RunConfig& config, bool human, const char* title = nullptr);  // set by commands that finish with a non-zero status without throwing
}  // namespace hbmsim::cli
