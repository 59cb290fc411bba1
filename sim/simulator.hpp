// One training step of one representative device: the program built from the step graph (sim/
// program_builder.hpp), run on the engine, summarised as a StepReport (sim/report.hpp).
#pragma once
#include "hwmodels/system.hpp"
#include "sim/options.hpp"
#include "sim/policy.hpp"
#include "sim/program_builder.hpp"
#include "sim/report.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

StepReport simulate(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt);

}  // namespace hbmsim
