// What a simulated step reports: time, throughput, memory peaks with their breakdown, per-queue exposure,
// busy time and traffic, and (when asked) the memory timeline and a Chrome/Perfetto trace.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hwmodels/system.hpp"
#include "sim/engine.hpp"
#include "sim/peak_contents.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

// One pipeline stage's device (a representative of its devices: every one runs the same program).
struct StageReport {
  int stage = 0;
  std::string layers;  // its chunks' layers, "0-14" or "0-3,32-35"
  double hbm_peak_bytes = 0, hbm_peak_time_s = 0, host_peak_bytes = 0;
  std::map<std::string, double> hbm_breakdown_bytes;
  double compute_busy_s = 0;
  std::map<std::string, double> compute_s;  // compute_busy_s by phase: forward, backward, recompute, optimizer
  double idle_s = 0;    // the step less its compute stream's busy time: every wait
  // The pipeline's share of that: waits on other stages (to fill the pipeline, or for a neighbour's pass)
  // and the drain after its last op until the slowest stage ends.
  double bubble_s = 0;
  std::map<std::string, double> exposed_s, busy_s, comm_bytes;  // as StepReport's, for this stage
  bool fits = true;
  std::vector<PeakBuffer> peak_buffers;  // what its HBM holds at its peak (only with a recorded timeline)

  nlohmann::json to_json() const;
};

struct StepReport {
  std::string system_id, model_id, policy;
  double step_time_s = 0;
  double model_flops_per_device = 0;
  double executed_flops_per_device = 0;
  double tflops_per_device = 0;
  double mfu = 0;  // against the peak of the dtypes the compute actually runs in
  double tokens_per_device_per_step = 0, tokens_per_s_per_device = 0;
  std::int64_t global_batch = 0;  // sequences per step
  std::int64_t grad_accum = 1;
  std::string mesh;               // the layout, e.g. "fsdp 16 x tp 8 (maxtext order)"
  bool fits = true;
  std::string fits_reason;
  // The run ended when HBM first went over capacity (SimOptions::stop_above_hbm_bytes): it does not fit, and the
  // other figures cover only the time until then.
  bool stopped = false;
  double hbm_peak_bytes = 0, hbm_capacity_bytes = 0, hbm_peak_time_s = 0;
  // What LHS may fill HBM to with prefetches: memory_limit_slop of HBM less one backward iteration's needs.
  double prefetch_limit_bytes = 0;
  std::map<std::string, double> hbm_breakdown_bytes;
  double host_peak_bytes = 0, host_capacity_bytes = 0;
  // By queue (compute, fsdp, ep, tp, cp, dp, pp, d2h, h2d): time the compute stream waited on it; the union
  // of its busy spans; the bytes this device sent through it. With pipeline stages: the mean over stages
  // (and the memory figures above are the worst stage's).
  std::map<std::string, double> exposed_s, busy_s, comm_bytes;
  // The compute stream's busy time by phase (forward, backward with a split backward's weight gradients,
  // recompute, optimizer): with pipeline stages, the mean over stages.
  std::map<std::string, double> compute_s;
  std::vector<StageReport> stages;  // one per pipeline stage
  std::uint64_t events = 0;
  int replayed_iterations = 0;  // layer-loop iterations fast-forwarded (their events are in `events`)
  std::size_t ops = 0;
  std::vector<sim::MemorySample> timeline;
  std::string trace;  // Chrome trace JSON text (only with a recorded timeline; sim/chrome_trace.hpp)

  nlohmann::json to_json() const;  // the `simulate --json` object
};

// The queues every report lists (0 when a step has none), so that sweep rows have the same columns.
const std::vector<std::string>& report_queues();
// The compute_s keys, in sim::ComputePhase order.
const std::vector<std::string>& report_phases();

StepReport make_report(const StepGraph& g, const System& sys, const std::string& policy, const sim::Program& program,
                       const sim::EngineResult& r);

}  // namespace hbmsim
