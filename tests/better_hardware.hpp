// "More memory or bandwidth is never slower" (DESIGN.md), as the property suite (test_invariants.cpp) and
// hbmsim_stress (stress.cpp) both check it: the same run on better hardware, and how much time a greedy
// schedule may lose there.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "planner/run_config.hpp"
#include "sim/simulator.hpp"

namespace test {

// The run with 1.5x the system's HBM, and with twice its faster host-link direction, each with its name.
inline std::vector<std::pair<std::string, hbmsim::RunConfig>> better_hardware(const hbmsim::RunConfig& c, const hbmsim::System& sys) {
  hbmsim::RunConfig more_hbm = c, faster_link = c;
  more_hbm.hbm_bytes = 1.5 * sys.gpu.hbm_bytes;
  faster_link.host_link_bytes_per_s = 2 * std::max(sys.host_h2d_bytes_per_s(), sys.host_d2h_bytes_per_s());
  return {{"1.5x the HBM", more_hbm}, {"twice the host link", faster_link}};
}

// The prepared run with twice the scale-up (NVLink) and scale-out (NIC) bandwidth per GPU: no run field says
// that, so the system is edited as prepared. An offloading pipeline ran 54% slower on it when host copies were
// ranked by layer alone (test_pipeline.cpp).
inline hbmsim::PreparedRun faster_network(hbmsim::PreparedRun run) {
  run.system.scale_up.per_gpu_bytes_per_s_per_direction *= 2;
  run.system.scale_out.per_gpu_bytes_per_s_per_direction *= 2;
  return run;
}

// The run simulated on each kind of better hardware above (`prepared` is prepare_run(c)), with its name.
inline std::vector<std::pair<std::string, hbmsim::StepReport>> on_better_hardware(const hbmsim::RunConfig& c,
                                                                                  const hbmsim::PreparedRun& prepared) {
  std::vector<std::pair<std::string, hbmsim::StepReport>> out;
  for (const auto& [what, better] : better_hardware(c, prepared.system)) out.emplace_back(what, hbmsim::run_simulation(better));
  const hbmsim::PreparedRun net = faster_network(prepared);
  out.emplace_back("twice the network", hbmsim::simulate(net.graph, net.system, net.policy, net.options));
  return out;
}

// The relative slowdown allowed on better hardware. Exact without host copies. With them, a greedy
// schedule's anomalies (notes/monotonicity.md: copies that move the compute, so that collectives meet at
// other moments) may cost a step that fits a little (a Llama 3.1 70B case lost 0.8% before XLA's prefetches
// were served in first-read order) and one whose prefetches are forced past the memory limit a few percent
// (that case from 1.0x HBM: 4.0% then).
inline double allowed_slowdown(const hbmsim::RunConfig& c, const hbmsim::PreparedRun& prepared, bool fits) {
  const bool copies = prepared.policy.offloads_any() || c.offload_layers > 0 || c.optimizer_offload != "off" || c.parameter_offload;
  return !copies ? 1e-9 : fits ? 1e-2 : 5e-2;
}

}  // namespace test
