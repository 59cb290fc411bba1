// Shared test helpers: run the CLI, write temporary files.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "hwmodels/builtin.hpp"
#include "planner/run_config.hpp"

namespace test {

struct CliResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

// One folder per test process, removed when the process exits (ctest starts hundreds of them; a child that
// forks leaves by exec or _exit, which run no destructors).
inline std::filesystem::path temp_dir() {
  struct Folder {
    std::filesystem::path path;
    ~Folder() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Folder folder{std::filesystem::temp_directory_path() / ("hbmsim-tests-" + std::to_string(::getpid()))};
  std::filesystem::create_directories(folder.path);
  return folder.path;
}

// A HuggingFace config shipped under data/hf, as JSON.
inline nlohmann::json hf_doc(const std::string& file) { return nlohmann::json::parse(*hbmsim::builtin_file("hf/" + file)); }

// A config drawn on Vera Rubin as data/systems/vr-nvl144.json stood when the tests' stress draws on it were
// found (tests/systems/vr-nvl144-as-drawn.json: 13 TB/s HBM4, 4 and 8 PF BF16 and FP8), so that each such
// regression test still runs the step that showed its bug. `json`: the config without its system.
inline nlohmann::json on_vr_as_drawn(const std::string& json) {
  auto doc = nlohmann::json::parse(json);
  doc["system"] = std::string(HBMSIM_SOURCE_DIR) + "/tests/systems/vr-nvl144-as-drawn.json";
  return doc;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// Runs `hbmsim ARGS` through the shell; stdout and stderr captured separately.
inline CliResult cli(const std::string& args) {
  static int n = 0;
  auto dir = temp_dir();
  auto out = dir / ("out" + std::to_string(n) + ".txt");
  auto err = dir / ("err" + std::to_string(n++) + ".txt");
  std::string cmd = std::string(HBMSIM_CLI) + " " + args + " >" + out.string() + " 2>" + err.string() + " </dev/null";
  int raw = std::system(cmd.c_str());
  CliResult r;
  if (WIFEXITED(raw)) r.status = WEXITSTATUS(raw);
  else if (WIFSIGNALED(raw)) r.status = 128 + WTERMSIG(raw);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// The suite's small real run: Llama 3.1 8B on 8 H200s (FSDP 8), batch 2 x seq 4096, so T = 8192 tokens per
// device per micro-step.
inline hbmsim::RunConfig llama8b_h200(const std::string& policy, bool lhs = true) {
  hbmsim::RunConfig c;
  c.system = "h200-hgx";
  c.model = "llama3.1-8b";
  c.gpus = 8;
  c.batch = 2;
  c.seq = 4096;
  c.policy = policy;
  c.lhs = lhs;
  return c;
}

// Llama 3.1 70B on 64 GB200s (FSDP 64), batch 2 x 8192, fp8 GEMMs for the MLP: the README's per-layer example.
inline hbmsim::RunConfig llama70b_gb200(const std::string& policy) {
  hbmsim::RunConfig c;
  c.system = "gb200-nvl72";
  c.model = "llama3.1-70b";
  c.gpus = 64;
  c.batch = 2;
  c.seq = 8192;
  c.weights = "fp8";
  c.policy = policy;
  return c;
}

// Mixtral 8x7B on 8 H100s under Megatron with no recompute: tp 2 with sequence parallelism, ep 4 with the
// experts whole (expert tp 1), batch 1 x seq 4096, so each GPU routes Ts = 4096 tokens to k = 2 of 8 experts.
inline hbmsim::RunConfig mixtral_h100_folded() {
  hbmsim::RunConfig c;
  c.model = "hf/mixtral-8x7b.config.json";
  c.system = "h100-hgx";
  c.gpus = 8;
  c.tp = 2;
  c.ep = 4;
  c.expert_tp = 1;
  c.batch = 1;
  c.seq = 4096;
  c.framework = "megatron";
  c.policy = "no_recompute";
  return c;
}

}  // namespace test
