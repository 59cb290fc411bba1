// libFuzzer harness: HuggingFace config.json files (hbmsim simulate --model config.json).
#include "fuzz_common.hpp"
#include "workloads/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto doc = hbmsim::parse_json_text(fuzz::text(data, size), "fuzz-config.json");
    auto m = hbmsim::load_hf_config(doc, "fuzz-config.json");
    (void)m.to_json().dump();
    (void)m.total_params();
    (void)m.model_flops(1, 4096);
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
