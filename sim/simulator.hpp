// One training step of one representative device: the policy applied to the step graph (remat replays,
// offload copies, stream order as XLA would schedule it), run on the engine, summarised as a StepReport.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hwmodels/system.hpp"
#include "sim/engine.hpp"
#include "sim/policy.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

struct SimOptions {
  bool lhs = true;                 // xla_gpu_enable_latency_hiding_scheduler
  bool pipelined_transfers = false;  // xla_gpu_enable_pipelined_host_offloading
  double memory_limit_slop = 0.95;   // xla_gpu_memory_limit_slop_factor / 100
  bool pipelined_collectives = true;  // xla_gpu_enable_pipelined_all_gather: FSDP gathers one layer ahead
  bool double_buffering = false;      // xla_gpu_enable_while_loop_double_buffering: scan bodies hold two layers
  bool record_trace = false;
};

struct StepReport {
  std::string system_id, model_id, policy;
  double step_time_s = 0;
  double model_flops_per_device = 0;
  double executed_flops_per_device = 0;
  double tflops_per_device = 0;
  double mfu = 0;  // against the dtype-weighted dense peak
  bool fits = true;
  std::string fits_reason;
  double hbm_peak_bytes = 0, hbm_capacity_bytes = 0, hbm_peak_time_s = 0;
  std::map<std::string, double> hbm_breakdown_bytes;
  double host_peak_bytes = 0, host_capacity_bytes = 0;
  std::map<std::string, double> exposed_s;  // time the compute stream waited, by the stream it waited on
  std::map<std::string, double> busy_s;
  std::uint64_t events = 0;
  std::size_t ops = 0;
  std::vector<sim::MemorySample> timeline;
  nlohmann::json trace;  // Chrome trace (only with record_trace)

  nlohmann::json to_json() const;  // the `simulate --json` object
};

// Builds the engine program (exposed for tests and the trace).
sim::Program build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                           std::vector<std::string>* op_names = nullptr);

StepReport simulate(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt);

}  // namespace hbmsim
