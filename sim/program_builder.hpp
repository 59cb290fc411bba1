// Builds the engine program of one training step: the policy applied to the step graph (remat replays,
// offload copies), communication ops on their axes' queues, and the stream order XLA (with or without LHS)
// or a framework would issue.
#pragma once
#include <string>
#include <vector>

#include "hwmodels/system.hpp"
#include "sim/engine.hpp"
#include "sim/options.hpp"
#include "sim/policy.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

// Fills `out` (its memory is reused); `op_names`, when given, receives one name per op.
void build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                   std::vector<std::string>* op_names, sim::Program& out);
sim::Program build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                           std::vector<std::string>* op_names = nullptr);

}  // namespace hbmsim
