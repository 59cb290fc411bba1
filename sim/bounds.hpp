// A lower bound of a step's time without simulating it, for searches that must skip what cannot win: every
// compute op runs alone at full speed (the engine only ever slows one), one after another on its stage's compute
// stream, which also waits for the collectives that hold it (without LHS, or in Megatron's program order) for at
// least their solo time; and a pipeline stage can start only after the earlier chunks' forwards of the first
// micro-batch (and, where its schedule ends with that chunk's backward, finish only before the earlier chunks'
// backwards).
#pragma once
#include <vector>

#include "hwmodels/system.hpp"
#include "sim/options.hpp"
#include "sim/policy.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

struct StepBound {
  std::vector<double> stage_compute_s;  // per stage: its layers' compute, every micro-batch (no waits)
  std::vector<double> stage_wait_s;     // per stage: its compute stream's waits for blocking collectives
  double step_s = 0;                    // the step is never shorter
};

StepBound step_lower_bound(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt);

}  // namespace hbmsim
