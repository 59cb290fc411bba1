// libFuzzer harness: MaxText metrics logs, JSON lines (hbmsim calibrate fit --maxtext LOG=CONFIG), with a
// fixed valid run config.
#include "fuzz_common.hpp"
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
    fuzz::require(m.tflops_per_device.has_value() && *m.tflops_per_device > 0, "a measured run has TFLOP/s > 0");
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
