// No dead profile field: every field the profile format's documentation shows (docs/calibration-profile.md,
// its example) loads, and each one alone, set to a worse value, makes a step that uses it slower.
#include <catch2/catch.hpp>

#include <fstream>
#include <functional>

#include "helpers.hpp"
#include "hwmodels/profile.hpp"
#include "planner/run_config.hpp"

using namespace hbmsim;

namespace {

nlohmann::json documented_example() {
  std::ifstream in(std::string(HBMSIM_SOURCE_DIR) + "/docs/calibration-profile.md");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto open = text.find("```json\n");
  REQUIRE(open != std::string::npos);
  const auto close = text.find("```", open + 8);
  return nlohmann::json::parse(text.substr(open + 8, close - open - 8));
}

// Leaf paths ("host_link/latency_s", "efficiency/gemm/bf16") of the fields that change the hardware.
void leaves(const nlohmann::json& j, const std::string& path, std::vector<std::string>& out) {
  if (!j.is_object()) {
    out.push_back(path);
    return;
  }
  for (auto& [k, v] : j.items()) leaves(v, path.empty() ? k : path + "/" + k, out);
}

// A value of the field's kind that makes hardware slower than any datasheet figure: a 1 GB/s link, a 1 ms
// latency or launch, half the speed while copying, a 5% efficiency table, a fitted scale of one half.
nlohmann::json worse(const std::string& path) {
  if (path.rfind("efficiency/", 0) == 0) return nlohmann::json::parse("[[1, 0.05], [1e15, 0.05]]");
  if (path.rfind("parameters/", 0) == 0) return 0.5;
  if (path.ends_with("_bytes_per_s")) return 1e9;
  if (path.ends_with("_s")) return 1e-3;
  if (path.ends_with("compute_slowdown_during_copy")) return 0.5;
  FAIL("no worse value for " << path);
  return nullptr;
}

}  // namespace

TEST_CASE("every field the profile documentation shows loads, and each alone changes the simulated step", "[profile]") {
  const auto example = documented_example();
  REQUIRE_NOTHROW(load_profile(example, "docs/calibration-profile.md"));
  std::vector<std::string> paths;
  leaves(example, "", paths);
  int checked = 0;
  for (const auto& path : paths) {
    if (path == "format" || path == "name" || path == "source" || path == "system" || path.rfind("metadata/", 0) == 0)
      continue;
    INFO(path);
    // A step that uses every part a profile can change: GEMMs in the dtype of the table, attention,
    // memory-bound kernels, FSDP collectives, host copies both ways with LHS and pipelined (staged) transfers.
    RunConfig c;
    c.system = "gb200-nvl72";
    c.model = "llama3.1-8b";
    c.gpus = 8;
    c.seq = 2048;
    c.policy = "qkv_proj_offloaded";
    c.pipelined_transfers = true;
    if (path.find("/fp8") != std::string::npos) c.weights = "fp8";
    if (path.find("/nvfp4") != std::string::npos || path.find("nvfp4") != std::string::npos) c.weights = "nvfp4";
    const double base = run_simulation(c).step_time_s;
    nlohmann::json profile = {{"format", "hbmsim-profile/1"}, {"name", "one field"}};
    profile[nlohmann::json::json_pointer("/" + path)] = worse(path);
    const auto file = test::temp_dir() / "one-field-profile.json";
    test::write(file, profile.dump());
    c.calibration = file.string();
    const double with = run_simulation(c).step_time_s;
    CHECK(with > base * (1 + 1e-6));
    ++checked;
  }
  // The example documents the host link (4), HBM, D2D, launch, interference, 8 efficiency tables and a
  // fitted parameter: 16 fields.
  CHECK(checked == 16);
}
