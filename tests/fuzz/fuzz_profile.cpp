// libFuzzer harness: calibration profiles (hbmsim simulate --calibration FILE).
#include "fuzz_common.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto doc = hbmsim::parse_json_text(fuzz::text(data, size), "fuzz-profile.json");
    auto p = hbmsim::load_profile(doc, "fuzz-profile.json");
    // What a profile writes (calibrate fit -o) must load again, unchanged.
    auto j = p.to_json();
    (void)j.dump();
    try {
      auto again = hbmsim::load_profile(j, "fuzz-profile.json (round trip)");
      fuzz::require(again.to_json() == j, "profile round trip");
    } catch (const hbmsim::InputError& e) {
      std::fprintf(stderr, "an accepted profile does not reload: %s\n", e.what());
      fuzz::require(false, "profile round trip");
    }
    static const auto base = hbmsim::builtin_system("h200-hgx");
    auto s = hbmsim::apply_profile(base, p);
    (void)s.summary_json().dump();
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
