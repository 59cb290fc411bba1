// libFuzzer harness: the hbmsim command line. The input is argv without the program name, one argument per
// NUL-separated piece. Each input gets a fresh CLI::App from the CLI's own register_commands, parsed the
// way cli/main.cpp does; the subcommand callbacks run for real. To keep one input around a millisecond,
// only `simulate`, `systems`, `models` and `graph` are fuzzed: inputs naming the planner subcommands
// (reproduce, validate, sweep, plan, calibrate, which run many simulations), --trace (writes files) or device and
// pseudo files (/dev, /proc, /sys: endless or special reads) are skipped. CLI::ParseError and
// hbmsim::InputError are the expected outcomes of bad input; anything else is a finding.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "fuzz_common.hpp"

namespace {

bool allowed(const std::vector<std::string>& args) {
  if (args.empty()) return true;  // "A subcommand is required"
  static const char* const fuzzed[] = {"simulate", "systems", "models", "graph"};
  bool known = false;
  for (auto* f : fuzzed) known = known || args[0] == f;
  if (!known) return false;
  for (auto& a : args) {
    if (a == "reproduce" || a == "validate" || a == "sweep" || a == "plan" || a == "calibrate" || a == "bench") return false;
    if (a.find("--trace") != std::string::npos) return false;
    for (auto* special : {"/dev", "/proc", "/sys"})
      if (a.find(special) != std::string::npos) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The commands print reports on stdout; libFuzzer reports on stderr.
  if (!std::freopen("/dev/null", "w", stdout)) return 1;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args;
  std::string cur;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (size > 0) args.push_back(cur);
  if (args.size() > 64 || !allowed(args)) return -1;  // -1: not added to the corpus

  std::vector<char*> argv;
  std::string program = "hbmsim";
  argv.push_back(program.data());
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  CLI::App app{"hbmsim (fuzzed)"};
  app.require_subcommand(1);
  hbmsim::cli::register_commands(app);
  try {
    app.parse(static_cast<int>(args.size() + 1), argv.data());
  } catch (const CLI::ParseError&) {
  } catch (const hbmsim::InputError&) {
  }
  std::fflush(stdout);
  return 0;
}
