// libFuzzer harness: fit parameter lists (hbmsim calibrate fit --parameters FILE).
#include "fuzz_common.hpp"
#include "planner/fit.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = fuzz::scratch_path("parameters.json");
  fuzz::write_file(path, fuzz::text(data, size));
  try {
    auto ps = hbmsim::load_fit_parameters(path);
    for (auto& p : ps) fuzz::require(p.lo < p.initial && p.initial < p.hi, "lo < initial < hi");
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
