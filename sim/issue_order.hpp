// A program's issue order (Program::issue_order) checked before a run, on the engine's own successor lists.
#pragma once
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim::sim::detail {

// Throws std::logic_error unless the issue order names every op once, or, naming the stuck ops, when with the
// dependencies it can never run to the end: a queue's next op waits (through dependencies and other queues)
// for an op behind it. Kahn's algorithm over the dependencies (successors of op i: succ[start[i],
// start[i + 1])) and each queue's order, O(ops + dependencies). The engine calls it once it has checked every
// op's queue and dependencies.
void check_issue_order(const Program& p, const std::vector<int>& start, const std::vector<int>& succ);

}  // namespace hbmsim::sim::detail
