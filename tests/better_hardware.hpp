// "More memory or bandwidth never slower, more work never less memory" (DESIGN.md), as the property suite
// (test_invariants.cpp) and hbmsim_stress (stress.cpp) both check them: the same run on better hardware or
// with twice the work, and how much time a greedy schedule may lose there.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "planner/run_config.hpp"
#include "sim/simulator.hpp"

namespace test {

// The run on a GPU twice as fast (`sys`: the run's system, prepare_run(c).system).
inline hbmsim::RunConfig on_faster_gpu(hbmsim::RunConfig c, const hbmsim::System& sys) {
  c.hbm_bandwidth_bytes_per_s = 2 * sys.gpu.hbm_bandwidth_bytes_per_s;
  c.bf16_flops_per_s = 2 * sys.gpu.peak_flops(hbmsim::Dtype::bf16);
  return c;
}
// That run, simulated.
inline hbmsim::StepReport run_on_faster_gpu(const hbmsim::RunConfig& c) {
  return hbmsim::run_simulation(on_faster_gpu(c, hbmsim::prepare_run(c).system));
}
// The run with twice the scale-up and scale-out bandwidth per GPU.
inline hbmsim::RunConfig on_faster_network(hbmsim::RunConfig c, const hbmsim::System& sys) {
  c.scale_up_bytes_per_s = 2 * sys.scale_up.per_gpu_bytes_per_s_per_direction;
  c.scale_out_bytes_per_s = 2 * sys.scale_out.per_gpu_bytes_per_s_per_direction;
  return c;
}

// The names of the better hardware that re-times a run's compute against its collectives (allowed_slowdown_on).
inline constexpr const char* kFasterGpu = "a GPU twice as fast";
inline constexpr const char* kFasterNetwork = "twice the network";

// The run with 1.5x the system's HBM and host memory, with twice its faster host-link direction, with a GPU twice as fast (twice
// its HBM bandwidth and every format's peak FLOP/s), and with twice its scale-up (NVLink) and scale-out (NIC)
// bandwidth per GPU, each with its name. A faster network made an offloading
// pipeline 54% slower when host copies were ranked by layer alone (test_pipeline.cpp).
inline std::vector<std::pair<std::string, hbmsim::RunConfig>> better_hardware(const hbmsim::RunConfig& c, const hbmsim::System& sys) {
  hbmsim::RunConfig more_hbm = c, faster_link = c;
  more_hbm.hbm_bytes = 1.5 * sys.gpu.hbm_bytes;
  more_hbm.host_memory_bytes = 1.5 * sys.host_cpu.memory_bytes;
  faster_link.host_link_bytes_per_s = 2 * std::max(sys.host_h2d_bytes_per_s(), sys.host_d2h_bytes_per_s());
  return {{"1.5x the HBM and host memory", more_hbm}, {"twice the host link", faster_link},
          {kFasterGpu, on_faster_gpu(c, sys)}, {kFasterNetwork, on_faster_network(c, sys)}};
}

// The run simulated on each kind of better hardware above (`prepared` is prepare_run(c)), with its name.
inline std::vector<std::pair<std::string, hbmsim::StepReport>> on_better_hardware(const hbmsim::RunConfig& c,
                                                                                  const hbmsim::PreparedRun& prepared) {
  std::vector<std::pair<std::string, hbmsim::StepReport>> out;
  for (const auto& [what, better] : better_hardware(c, prepared.system)) out.emplace_back(what, hbmsim::run_simulation(better));
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

// What the run may lose when its compute or its links get faster (less compute to do, a faster GPU or network):
// allowed_slowdown's, and up to 1% where the step is set by its collectives (every stage's compute stream busy
// under 60% of it). Re-timed, they overlap at other moments, and one that crosses both NVLink and the NICs runs
// at its slower link's share: the data-parallel sync that ends the step may share NVLink with more of the
// backward's collectives (notes/monotonicity.md, mechanism 2, which coupled flows on a real fabric show too;
// notes/routing_groups.md and notes/chunked_attention.md have the draws that met it).
inline double allowed_retiming(const hbmsim::RunConfig& c, const hbmsim::PreparedRun& prepared, const hbmsim::StepReport& r) {
  const double slack = allowed_slowdown(c, prepared, r.fits);
  double compute = 0;
  for (const auto& s : r.stages) compute = std::max(compute, s.compute_busy_s);
  return compute < 0.6 * r.step_time_s ? std::max(slack, 1e-2) : slack;
}
// The same for better hardware `what` (better_hardware's names): re-timing on a GPU twice as fast or twice the
// network; allowed_slowdown's for more memory or a faster host link.
inline double allowed_slowdown_on(const std::string& what, const hbmsim::RunConfig& c, const hbmsim::PreparedRun& prepared,
                                  const hbmsim::StepReport& r) {
  const bool retimes = what == kFasterGpu || what == kFasterNetwork;
  return retimes ? allowed_retiming(c, prepared, r) : allowed_slowdown(c, prepared, r.fits);
}

// The same run with twice the work: twice the sequences per step in micro-batches of the same size (twice
// the batch; in a pipeline also twice the micro-batches; in Megatron's terms twice the global batch).
inline hbmsim::RunConfig twice_the_work(const hbmsim::RunConfig& c) {
  hbmsim::RunConfig twice = c;
  if (c.micro_batch > 0) {
    twice.global_batch = 2 * c.global_batch;
    return twice;
  }
  twice.batch = 2 * c.batch.value_or(1);
  if (c.pp > 1) twice.microbatches = 2 * (c.microbatches > 0 ? c.microbatches : c.pp);
  return twice;
}

// The least HBM peak the run with twice the work may have ("more work never less memory", DESIGN.md): the
// run's own, except where XLA's LHS starts the reloads of offloaded tensors as early as its memory limit lets
// them, with pipelined transfers or without: it fills HBM with prefetches up to that limit either way, and a
// reload twice the size may wait until after a peak the smaller one was there for (stress seed 261, draw 25:
// 27 MiB at the peak, 8 MiB lower with twice the work, notes/monotonicity.md). Megatron has no such prefetch:
// Transformer Engine reloads a fixed window of layers ahead.
inline double least_peak_with_twice_the_work(const hbmsim::RunConfig& c, const hbmsim::StepReport& r,
                                             const hbmsim::StepReport& twice) {
  const bool fills_to_limit = c.lhs && c.framework != "megatron" && r.host_peak_bytes > 0;
  return (fills_to_limit ? std::min(r.hbm_peak_bytes, twice.prefetch_limit_bytes) : r.hbm_peak_bytes) * (1 - 1e-12);
}

}  // namespace test
