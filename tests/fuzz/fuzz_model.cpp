// libFuzzer harness: hbmsim model files (hbmsim simulate --model FILE).
#include "fuzz_common.hpp"
#include "workloads/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto doc = hbmsim::parse_json_text(fuzz::text(data, size), "fuzz-model.json");
    auto m = hbmsim::load_model(doc, "fuzz-model.json");
    (void)m.to_json().dump();
    (void)m.total_params();
    (void)m.activated_params();
    (void)m.model_flops(1, 4096);
    // An accepted model reloads from its own JSON.
    auto again = hbmsim::load_model(m.to_json(), "fuzz-model.json (round trip)");
    fuzz::require(again.to_json() == m.to_json(), "model round trip");
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
