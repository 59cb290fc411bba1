// hbmsim command line: systems, models, graph, simulate, reproduce, sweep, plan, calibrate, bench.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

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

// Examples per command, shown under its --help: what a user of that command types first.
const std::map<std::string, std::string>& examples() {
  static const std::map<std::string, std::string> e = {
      {"", "  hbmsim systems\n"
           "  hbmsim reproduce\n"
           "  hbmsim simulate --system gb200-nvl72 --model llama3.1-405b --gpus 128 --batch 2 --seq 8192 \\\n"
           "                  --weights nvfp4 --policy qkv_proj_offloaded\n"
           "  hbmsim sweep --model deepseek-v3-671b --gpus 128 --ep 64 --axis batch=1,2,4 --out results.csv\n"
           "  hbmsim plan largest-batch --model deepseek-v3-671b --gpus 128 --ep 64 --seq 4096\n"
           "  hbmsim SUBCOMMAND --help   (each command's options and examples)\n"},
      {"validate", "  hbmsim validate\n  hbmsim validate --calibration gb200-fitted --markdown > docs/validation-gb200-fitted.md\n"
                   "  hbmsim validate --runs my_runs.csv --json\n  hbmsim validate --rows 46-50 --calibration corpus-fitted\n"},
      {"systems", "  hbmsim systems\n  hbmsim systems --json\n"},
      {"models", "  hbmsim models\n  hbmsim simulate --model path/to/huggingface/config.json --gpus 8\n"},
      {"fields", "  hbmsim fields\n  hbmsim fields --markdown > docs/run-fields.md\n"},
      {"graph", "  hbmsim graph --model llama3.1-8b --layer 0\n"
                "  hbmsim graph --model deepseek-v3-671b --layer 5 --dot > layer5.dot\n"},
      {"simulate", "  hbmsim simulate --model llama3.1-70b --gpus 64 --policy full\n"
                   "  hbmsim simulate --system gb200-nvl72 --model llama3.1-405b --gpus 128 --batch 2 --seq 8192 \\\n"
                   "                  --weights nvfp4 --policy qkv_proj_offloaded --calibration gb200-fitted --json\n"
                   "  hbmsim simulate --model llama3.1-405b --gpus 256 --tp 4 --pp 8 --vp 4 --micro-batch 1 \\\n"
                   "                  --global-batch 256 --seq 8192 --mesh-order megatron --trace step.json\n"},
      {"reproduce", "  hbmsim reproduce\n  hbmsim reproduce --calibration gb200-fitted --json\n"},
      {"sweep", "  hbmsim sweep --model deepseek-v3-671b --gpus 128 --ep 64 --seq 4096 --axis batch=1,2,4,8 \\\n"
                "               --axis policy=full,minimal --out results.csv\n"
                "  hbmsim sweep ... --out results.csv --resume   (after a kill: runs only the missing rows)\n"},
      {"plan", "  hbmsim plan largest-batch --model deepseek-v3-671b --gpus 128 --ep 64 --seq 4096\n"
               "  hbmsim plan best-policy --model llama3.1-405b --gpus 128 --batch 2 --seq 8192\n"
               "  hbmsim plan break-even --model llama3.1-405b --gpus 128 --batch 2 --policy qkv_proj_offloaded\n"
               "  hbmsim plan hbm-needed --model llama3.1-70b --gpus 8 --batch 4\n"
               "  hbmsim plan layout --model llama3.1-405b --gpus 1024 --system gb200-nvl72 --seq 8192\n"
               "  hbmsim plan scale --model llama3.1-405b --system gb200-nvl72 --seq 8192 --gpus 512,1024,2048 --tokens 15e12\n"},
      {"largest-batch", "  hbmsim plan largest-batch --model deepseek-v3-671b --gpus 128 --ep 64 --seq 4096\n"
                        "  hbmsim plan largest-batch --model llama3.1-405b --gpus 128 --seq 8192 --powers-of-two\n"},
      {"best-policy", "  hbmsim plan best-policy --model llama3.1-405b --gpus 128 --batch 2 --seq 8192 --pareto\n"},
      {"break-even", "  hbmsim plan break-even --model llama3.1-405b --gpus 128 --batch 2 --policy qkv_proj_offloaded\n"},
      {"hbm-needed", "  hbmsim plan hbm-needed --model llama3.1-70b --gpus 8 --batch 4 --policy minimal\n"
                     "  hbmsim plan hbm-needed --model deepseek-v3-671b --system vr-nvl144 --gpus 128 --ep 8 --seq 8192 --policy minimal_offloaded\n"
                     "    (under LHS also the least HBM that fits, prefetches held back, and the least that keeps the step)\n"},
      {"calibrate", "  hbmsim calibrate measure -o h200.json   (needs a GPU and the CUDA backend)\n"
                    "  hbmsim calibrate fit --leave-one-out -o fitted.json --name my-fit\n"},
      {"measure", "  hbmsim calibrate measure -o h200.json\n"},
      {"fit", "  hbmsim calibrate fit --leave-one-out -o fitted.json --name my-fit\n"
              "  hbmsim calibrate fit --maxtext metrics.jsonl=run.json --no-seed-runs -o mine.json\n"
              "  hbmsim calibrate fit --corpus --no-seed-runs --leave-one-source-out --max-evaluations 90 -o corpus.json   (about 40 min)\n"},
      {"bench", "  hbmsim bench\n  hbmsim bench --quick --json\n"},
  };
  return e;
}

constexpr const char* kExitStatus =
    "Exit status: 0 for any result (a plan that does not fit is a result), 2 for bad input, 1 for an internal error.";

// Each command gets its own examples (CLI11 copies a parent's footer into subcommands made after it, so footers are
// set here, once every command exists).
void set_footers(CLI::App& app) {
  for (auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    auto it = examples().find(sub->get_name());
    // Only the CUDA measurement has a fourth status: no GPU (or no backend built) is neither input nor a bug.
    const std::string status = sub->get_name() == "measure" || sub->get_name() == "calibrate"
                                   ? std::string(kExitStatus) + "\n`calibrate measure`: 3 when there is no CUDA device or no CUDA backend."
                                   : std::string(kExitStatus);
    // A command that wrote its own footer (plan layout, plan scale: what the flags mean, with examples) keeps it.
    const std::string own = sub->get_footer();
    sub->footer(!own.empty() ? own + "\n" + status : it == examples().end() ? status : "Examples:\n" + it->second + status);
    set_footers(*sub);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hbmsim " HBMSIM_VERSION ": predict step time, TFLOP/s and HBM use of LLM training steps (parallel layouts, "
               "remat, host offload, LHS)"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "hbmsim " HBMSIM_VERSION);
  hbmsim::cli::register_commands(app);
  app.footer("Examples:\n" + examples().at("") + kExitStatus);
  set_footers(app);
  try {
    check_subcommands(app, argc, argv);
    app.parse(argc, argv);
    // `hbmsim` or `hbmsim plan` alone: what the command can do, not a parse error.
    const CLI::App* chosen = &app;
    while (!chosen->get_subcommands().empty()) chosen = chosen->get_subcommands().front();
    if (!chosen->get_subcommands([](const CLI::App*) { return true; }).empty()) {
      std::cout << chosen->help();
      return 0;
    }
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
