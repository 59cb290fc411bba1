// libFuzzer harness: system files (hbmsim simulate --system FILE).
#include "fuzz_common.hpp"
#include "hwmodels/system.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto doc = hbmsim::parse_json_text(fuzz::text(data, size), "fuzz-system.json");
    auto s = hbmsim::load_system(doc, "fuzz-system.json");
    // What `hbmsim systems` and the simulator read from an accepted system.
    (void)s.summary_json().dump();
    fuzz::require(s.host_h2d_bytes_per_s() > 0 && s.host_d2h_bytes_per_s() > 0, "host-link bandwidth > 0");
    fuzz::require(s.host_capacity_bytes() > 0, "pinned host capacity > 0");
    for (auto d : {hbmsim::Dtype::bf16, hbmsim::Dtype::fp8, hbmsim::Dtype::nvfp4})
      fuzz::require(s.gpu.peak_flops(d) > 0, "peak FLOP/s > 0");
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
