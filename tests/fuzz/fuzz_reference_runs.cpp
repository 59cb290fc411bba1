// libFuzzer harness: measured-run files (hbmsim reproduce --runs FILE, calibrate fit --runs FILE), read
// with the built-in run configs.
#include "fuzz_common.hpp"
#include "planner/fit.hpp"
#include "planner/reproduce.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = fuzz::scratch_path("runs.json");
  fuzz::write_file(path, fuzz::text(data, size));
  try {
    auto runs = hbmsim::load_reference_runs(path, "");
    (void)hbmsim::measured_from_reference(runs);
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
