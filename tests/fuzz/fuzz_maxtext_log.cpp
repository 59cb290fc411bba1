// libFuzzer harness: MaxText metrics logs, JSON lines (hbmsim calibrate fit --maxtext LOG=CONFIG), with a
// fixed valid run config.
#include "fuzz_common.hpp"
#include <cmath>

#include "planner/fit.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string log = fuzz::scratch_path("metrics.jsonl");
  static const std::string config = [] {
    auto p = fuzz::scratch_path("run.json");
    fuzz::write_file(p, R"({"system": "h200-hgx", "model": "llama3.1-8b", "gpus": 8, "batch": 1, "seq": 2048})");
    return p;
  }();
  fuzz::write_file(log, fuzz::text(data, size));
  try {
    auto m = hbmsim::measured_from_maxtext_log(log, config);
    fuzz::require(m.tflops_per_device.has_value() && std::isfinite(*m.tflops_per_device) && *m.tflops_per_device > 0,
                  "a measured run has finite TFLOP/s > 0");
    if (m.hbm_bytes) fuzz::require(std::isfinite(*m.hbm_bytes) && *m.hbm_bytes > 0, "measured HBM finite and > 0");
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
