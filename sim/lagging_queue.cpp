#include "sim/lagging_queue.hpp"

#include <algorithm>
#include <cmath>

namespace hbmsim::sim {

bool runs_alone(const Program& p, const std::vector<int>& lifts, int op) {
  const ProgramOp& o = p.ops[static_cast<std::size_t>(op)];
  if (!o.allocs.empty() || !o.releases.empty() || o.memory_bound || o.gate_bytes > 0 || lifts[static_cast<std::size_t>(op)] >= 0)
    return false;
  for (std::uint32_t u = o.use_begin; u < o.use_begin + o.use_count; ++u) {
    const Use& use = p.uses[u];
    const auto r = static_cast<std::size_t>(use.resource);
    // The engine counts a link as oversubscribed above capacity x (1 + 1e-9).
    if (p.resources[r].sole_queue != o.queue || use.bytes_per_s > p.resources[r].capacity_bytes_per_s * (1 + 1e-9)) return false;
  }
  return true;
}

namespace {

class Walker {
 public:
  Walker(const WalkContext& c, double until_s) : c_(c), until_s_(until_s) {}

  LaggingWalk walk(const std::vector<int>& order, std::size_t pos, int running, double running_start_s,
                   double running_end_s, double from_s) {
    w_.next = pos;
    if (pos > 0) last_done_ = order[pos - 1];  // ended, or running (then it completes first)
    queue_ = order.empty() ? -1 : c_.program.ops[static_cast<std::size_t>(order[0])].queue;
    double free_s = from_s;  // when the queue is next free
    if (running >= 0) {
      const double end_s = settled(running, running_end_s);
      w_.ops.push_back({running, running_start_s, end_s});
      if (end_s > until_s_) return w_;
      complete(running, end_s);
      free_s = end_s;
    }
    while (w_.next < order.size()) {
      const int y = order[w_.next];
      double ready = free_s;
      for (int d : c_.program.ops[static_cast<std::size_t>(y)].deps) {
        const double e = end_of(d);
        if (std::isnan(e)) return stop(free_s);
        ready = std::max(ready, e);
      }
      if (ready > until_s_) break;  // it waits past the walk's end (or for ever)
      if (!c_.in_stretch(y) || !runs_alone(c_.program, c_.lifts, y)) return stop(ready);
      const double seconds = c_.program.ops[static_cast<std::size_t>(y)].seconds;
      const double end_s = seconds > 0 ? settled(y, ready + seconds) : ready;
      w_.ops.push_back({y, ready, end_s});
      ++w_.next;
      if (end_s > until_s_) break;
      complete(y, end_s);
      free_s = end_s;
    }
    return w_;
  }

 private:
  // When the engine completes the op due at `due_s`: at a loop instant due_s falls within the engine's
  // tolerance of (1e-12 x max(1, seconds) at full speed), else then.
  double settled(int op, double due_s) const {
    return c_.completes_at(due_s, 1e-12 * std::max(1.0, c_.program.ops[static_cast<std::size_t>(op)].seconds));
  }

  LaggingWalk stop(double at_s) {
    w_.vouched_until_s = std::min(w_.vouched_until_s, at_s);
    return w_;
  }

  // The queue runs its ops in program order, so one of its own has ended (no later than now) if it is not
  // past the last one completed, and will not end before the walk's end otherwise; the caller knows the
  // others.
  double end_of(int op) const {
    if (c_.program.ops[static_cast<std::size_t>(op)].queue == queue_)
      return op <= last_done_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return c_.end_of(op);
  }

  // A completion may make an op outside the stretch ready: the walk cannot vouch for anything from then on.
  void complete(int op, double at_s) {
    last_done_ = op;
    const auto k = static_cast<std::size_t>(op);
    for (int s = c_.succ_start[k]; s < c_.succ_start[k + 1]; ++s) {
      const int succ = c_.succ[static_cast<std::size_t>(s)];
      if (!c_.in_stretch(succ)) check_outside(succ, at_s);
      else if (allocates_when_ready(succ)) stop(at_s);  // its buffers may come alive here, which the loop's replay does not do
    }
  }

  // When `succ` becomes ready, its dependencies read in order from where the last look stopped (the
  // optimizer waits for every layer's reduce-scatter: each completion would otherwise read them all again).
  void check_outside(int succ, double at_s) {
    auto it = std::find_if(seen_.begin(), seen_.end(), [&](const Seen& x) { return x.op == succ; });
    if (it == seen_.end()) it = seen_.insert(seen_.end(), Seen{succ, 0, at_s});
    const auto& deps = c_.program.ops[static_cast<std::size_t>(succ)].deps;
    it->ready_s = std::max(it->ready_s, at_s);
    for (; it->next < deps.size(); ++it->next) {
      const double e = end_of(deps[it->next]);
      if (std::isnan(e)) {  // unknown: not vouched for from this completion on
        stop(at_s);
        return;
      }
      if (e > until_s_) return;  // it waits past the walk's end
      it->ready_s = std::max(it->ready_s, e);
    }
    if (it->ready_s <= until_s_) stop(it->ready_s);
  }

  bool allocates_when_ready(int op) const {
    const ProgramOp& o = c_.program.ops[static_cast<std::size_t>(op)];
    return !o.allocs.empty() && c_.program.queues[o.queue].allocates_when_ready;
  }

  struct Seen {
    int op;
    std::size_t next;  // its first dependency not known to end by ready_s
    double ready_s;
  };
  std::vector<Seen> seen_;
  const WalkContext& c_;
  double until_s_;
  int queue_ = -1, last_done_ = -1;
  LaggingWalk w_;
};

}  // namespace

LaggingWalk walk_lagging(const WalkContext& c, const std::vector<int>& order, std::size_t pos, int running,
                         double running_start_s, double running_end_s, double from_s, double until_s) {
  return Walker(c, until_s).walk(order, pos, running, running_start_s, running_end_s, from_s);
}

}  // namespace hbmsim::sim
