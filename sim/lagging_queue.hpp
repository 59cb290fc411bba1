// A queue that falls further behind a loop at every iteration, worked out on its own while the loop is
// fast-forwarded.
//
// A data-parallel gradient reduce-scatter slower than the backward layer that feeds it starts later after each
// layer: the engine's state at an iteration's start never repeats, so the loop is simulated event by event
// although everything else in it repeats. Where nothing in the loop waits for that queue, and its ops hold no
// memory and use links no other queue uses, the loop does not depend on it: the engine fast-forwards the loop
// without it and works out the queue's ops one after another (each starts once the one before it and its own
// dependencies have ended, and runs at full speed).
#pragma once
#include <cstddef>
#include <functional>
#include <limits>
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim::sim {

// The op runs at full speed whatever else runs and changes nothing but its successors' readiness: it holds
// no memory (allocates and releases nothing), waits for no memory gate and lifts none (`lifts`: per op, the
// engine's gate-lift device, -1: none), is not slowed by host copies, and every link it uses belongs to its
// queue alone and is not oversubscribed by it.
bool runs_alone(const Program& p, const std::vector<int>& lifts, int op);

struct LaggingOp {
  int op;
  double start_s, end_s;
};

struct LaggingWalk {
  std::vector<LaggingOp> ops;  // in queue order: the op running at the start (if any), then those started
  std::size_t next = 0;        // the queue position after the last op started
  // Events from this time on are not vouched for (infinity: every event up to the walk's end is).
  double vouched_until_s = std::numeric_limits<double>::infinity();
};

// What the walk needs to know of the rest of the program.
struct WalkContext {
  const Program& program;
  const std::vector<int>& lifts;       // runs_alone()
  const std::vector<int>& succ_start;  // successors, compressed: op i's are succ[succ_start[i] .. succ_start[i + 1])
  const std::vector<int>& succ;
  // When an op of another queue ends: infinity if not before the walk's end, NaN if unknown.
  std::function<double(int)> end_of;
  std::function<bool(int)> in_stretch;  // the op belongs to the stretch being fast-forwarded
  // When the engine completes an op due at `t`: at an instant of the loop's no more than `tol` before it
  // (the engine completes what is due within a hair of an instant at that instant), else at `t`.
  std::function<double(double t, double tol)> completes_at;
};

// The queue's ops (`order`, in queue order) from position `pos` on, from `from_s` to `until_s`: `running`
// (-1: none) started at `running_start_s` and ends at `running_end_s`. Stops early, at `vouched_until_s`, where
// it cannot vouch for what happens: an op that does not run alone, or lies outside the stretch, would start;
// a dependency's end is unknown; or a completion would make an op outside the stretch ready, or one inside it
// that allocates when it becomes ready (Queue::allocates_when_ready).
LaggingWalk walk_lagging(const WalkContext& c, const std::vector<int>& order, std::size_t pos, int running,
                         double running_start_s, double running_end_s, double from_s, double until_s);

}  // namespace hbmsim::sim
