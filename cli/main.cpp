// hbmsim command line: systems, models, graph, simulate, reproduce, sweep, plan, calibrate, bench.
#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "hwmodels/json_view.hpp"

namespace {

// CLI11 reports a misspelt subcommand ("hbmsim simulat") as "A subcommand is required" without the word, so
// the words before the first option are matched against the subcommand tree first.
void check_subcommands(const CLI::App& app, int argc, char** argv) {
  const CLI::App* cur = &app;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (word.empty() || word[0] == '-') return;
    auto subs = cur->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return;  // a leaf command: the rest are its own arguments
    const CLI::App* next = nullptr;
    std::string names;
    for (const auto* sub : subs) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      if (sub->check_name(word)) next = sub;
    }
    if (!next)
      throw hbmsim::InputError(path + (path.empty() ? "" : ": ") + "unknown subcommand " + hbmsim::quote(word) +
                               " (expected one of " + names + ")");
    cur = next;
    path += (path.empty() ? "" : " ") + next->get_name();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hbmsim: predict step time, TFLOP/s and HBM use of LLM training steps (remat, host offload, LHS)"};
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  hbmsim systems\n"
      "  hbmsim reproduce\n"
      "  hbmsim simulate --system gb200-nvl72 --model llama3.1-405b --gpus 128 --batch 2 --seq 8192 \\\n"
      "                  --weights nvfp4 --policy qkv_proj_offloaded --lhs on --json\n"
      "  hbmsim sweep --model deepseek-v3-671b --gpus 128 --ep 64 --seq 4096 --axis batch=1,2,4,8 \\\n"
      "               --axis policy=full,minimal --out results.csv\n"
      "  hbmsim plan largest-batch --model deepseek-v3-671b --gpus 128 --ep 64 --seq 4096\n"
      "Exit status: 0 for any result (a plan that does not fit is a result), 2 for bad input, 1 for an internal error.");
  hbmsim::cli::register_commands(app);
  try {
    check_subcommands(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "hbmsim: %s\n", hbmsim::escape_control_characters(e.what()).c_str());
    return 2;
  } catch (const hbmsim::InputError& e) {
    std::fprintf(stderr, "hbmsim: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hbmsim: internal error: %s\n", hbmsim::escape_control_characters(e.what()).c_str());
    return 1;
  }
  return hbmsim::cli::exit_status();
}
