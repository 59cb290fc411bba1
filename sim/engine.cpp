#include "sim/engine.hpp"

#include <algorithm>
#include <cmath>
#include <bit>
#include <limits>
#include <stdexcept>
#include <utility>

#include "sim/lagging_queue.hpp"
#include "sim/repeats.hpp"

namespace hbmsim::sim {

const char* to_string(MemCategory c) {
  static const char* names[] = {"parameters", "optimizer_state", "gradients", "gathered_weights",
                                "saved_activations", "offload_buffers", "collective_buffers", "workspace",
                                "runtime_reserve"};
  int i = static_cast<int>(c);
  return (i >= 0 && i < kMemCategories) ? names[i] : "?";
}

namespace {

// Appends a queue to a program's and returns its index: at most kMaxQueues (an op names its queue in 16 bits).
int add_queue(std::vector<Queue>& queues, Queue q) {
  if (queues.size() >= static_cast<std::size_t>(kMaxQueues)) throw std::logic_error("a program has at most " + std::to_string(kMaxQueues) + " queues");
  queues.push_back(std::move(q));
  return static_cast<int>(queues.size()) - 1;
}

}  // namespace

void Program::clear() {
  queues.clear();
  resources.clear();
  ops.clear();
  uses.clear();
  gate_lifts.clear();
  buffers.clear();
  iterations.clear();
  resident.clear();
  hbm_limit_bytes.clear();
  copy_interference = 0;
  add_device();
}

int Program::add_device() {
  const int d = devices();
  add_queue(queues, Queue{"compute", QueueKind::serial, false, d, true, false});
  hbm_limit_bytes.push_back(0);
  return d;
}

int Program::compute_queue(int device) const {
  for (std::size_t i = 0; i < queues.size(); ++i)
    if (queues[i].compute && queues[i].device == device) return static_cast<int>(i);
  throw std::logic_error("no device " + std::to_string(device));
}

int Program::queue(const std::string& name, QueueKind kind, bool host_copy, int device) {
  for (std::size_t i = 0; i < queues.size(); ++i)
    if (queues[i].device == device && queues[i].name == name) return static_cast<int>(i);
  if (device < 0 || device >= devices()) throw std::logic_error("no device " + std::to_string(device));
  return add_queue(queues, Queue{name, kind, host_copy, device, false, false});
}

void Program::use(int op, int resource, double bytes_per_s) {
  if (resource < 0 || static_cast<std::size_t>(resource) >= resources.size() || !(bytes_per_s > 0))
    throw std::logic_error("program op " + std::to_string(op) + " uses no valid resource");
  if (op < 0 || static_cast<std::size_t>(op) + 1 != ops.size()) throw std::logic_error("link uses must be added to the last op");
  auto& o = ops.back();
  if (o.use_count == 0) o.use_begin = static_cast<std::uint32_t>(uses.size());
  if (o.use_count == std::numeric_limits<std::uint16_t>::max()) throw std::logic_error("program op " + std::to_string(op) + " uses too many links");
  uses.push_back(Use{resource, bytes_per_s});
  ++o.use_count;
}

int Program::resource(const std::string& name, double capacity_bytes_per_s, int device) {
  for (std::size_t i = 0; i < resources.size(); ++i)
    if (resources[i].device == device && resources[i].name == name) return static_cast<int>(i);
  resources.push_back(Resource{name, capacity_bytes_per_s, device});
  return static_cast<int>(resources.size()) - 1;
}

namespace {

// Per-thread working arrays, kept between runs: a sweep simulates thousands of steps per thread, and
// fresh arrays each time cost more in page faults than the simulation itself.
// Per queue: its ops in program order, the next to start, how many run, since when it is busy.
struct QueueState {
  const int* ops;
  std::size_t size, pos;
  int running;
  double busy_since;
  int device;
  bool concurrent, host_copy, compute;
};

// Per device: live memory, host copies running (they slow its memory-bound kernels), and since when its
// compute stream has been idle (-1: busy).
struct DeviceState {
  double hbm_live = 0, host_live = 0;
  std::array<double, kMemCategories> by_cat{};
  int copies_running = 0;
  double compute_idle_since = 0;
  int receive_queue = -1;  // charged with waits on other devices (-1: the sender's queue is)
};

// A transfer in a rate computation, with its priority class read once from the program.
struct Flow {
  int op, priority;
};

// Fast-forward (see run_program): what happened between two iteration starts, and the state at each.
struct LogEntry {
  int op;
  double time_s;
  bool start;  // else a completion
};
// A memory gate's verdict depends on live HBM, which may grow or shrink by a fixed amount per iteration.
struct GateCheck {
  int device;
  double margin_bytes;  // limit - (live + gate): it opened when >= 0
};
// The engine's state after the start of an iteration's first op, ops counted from that iteration's first
// op where they belong to the run (`in_run`), as themselves otherwise.
struct Snapshot {
  int repeat = -1, iteration = -1;
  double time_s = 0;
  struct Active {
    int op;
    std::int64_t at;  // Repeat::offset
    double remaining, rate, end_in_s;
    bool operator<(const Active& o) const { return at < o.at; }
  };
  struct Head {
    int op, running;  // op -1: drained
    std::int64_t at;  // Repeat::offset where in_run
    bool in_run;
    double busy_since_s;
  };
  std::vector<Active> active;
  std::vector<Head> heads;  // per queue (op -1: drained)
  std::vector<double> idle_since_s, hbm_bytes, demand, busy_s, exposed_s;  // per device / link / queue
  std::vector<int> copies;
  std::uint64_t events = 0;
  int over = 0;
  bool contended = false, stale = false, interference_stale = false;
};

// A recorded event as the replay moves it: op + m * stride at time_s + m * period.
struct ReplayStep {
  int op, stride;
  double time_s;
  bool start;
  bool outside;  // a start that waits on ops outside the run
};

// A run's op ranges, for the replay's membership tests.
struct RunBounds {
  int main_first, main_end, side_first, side_end;
  explicit RunBounds(const Repeat& r)
      : main_first(r.main.first), main_end(r.main.end(r.count)), side_first(r.side.first), side_end(r.side.end(r.count)) {}
  bool operator()(int op) const { return (op >= main_first && op < main_end) || (op >= side_first && op < side_end); }
};

// A device's highest live memory within the first replayed interval, when, and by category then.
struct Excursion {
  double hbm_bytes = 0, host_bytes = 0, time_s = 0;
  std::array<double, kMemCategories> by_cat{};
};

struct Scratch {
  std::vector<Flow> flows, sharing;
  std::vector<int> unmet, op_queue, succ_start, succ, refs, fill, active, active_pos, finished, unfrozen, zero, zeros, lifts, gate_after;
  std::vector<std::uint64_t> dirty;
  std::vector<char> in_part;
  std::vector<int> touched, over_links;
  std::vector<double> remaining, rate, updated, start, end, cap_left, weight, demand, fill_rate;
  std::vector<double> active_end;
  std::vector<std::vector<int>> device_copy_queues;
  std::vector<std::vector<int>> queues;
  std::vector<QueueState> queue_states;
  std::vector<DeviceState> devices;
  std::vector<int> anchor_of, per_queue, pending, alloc_op, release_count;
  Repeats repeats;
  std::vector<LogEntry> log;
  std::vector<ReplayStep> steps;
  std::vector<char> freed;
  std::vector<Excursion> excursion;
  std::vector<GateCheck> gates;
  Snapshot before, now;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

class Engine {
 public:
  Engine(const Program& p, bool timeline, bool fast_forward) : p_(p), record_(timeline) {
    const auto n = p.ops.size();
    const auto nq = p.queues.size();
    if (nq > static_cast<std::size_t>(kMaxQueues)) throw std::logic_error("a program has at most " + std::to_string(kMaxQueues) + " queues");
    unmet_.resize(n);
    op_queue_.resize(n);
    succ_start_.assign(n + 1, 0);
    refs_.assign(p.buffers.size(), 0);
    if (fast_forward) alloc_op_.assign(p.buffers.size(), -1);
    if (order_.size() < nq) order_.resize(nq);
    for (std::size_t q = 0; q < nq; ++q) order_[q].clear();
    // One pass over the ops for what each needs (they are large: every pass reads them all from memory).
    for (std::size_t i = 0; i < n; ++i) {
      const auto& op = p.ops[i];
      if (static_cast<std::size_t>(op.queue) >= nq) throw std::logic_error("program op " + std::to_string(i) + " is on no queue");
      order_[static_cast<std::size_t>(op.queue)].push_back(static_cast<int>(i));
      op_queue_[i] = op.queue;
      unmet_[i] = static_cast<int>(op.deps.size());
      for (int d : op.deps) {
        if (d < 0 || static_cast<std::size_t>(d) >= n || static_cast<std::size_t>(d) == i)
          throw std::logic_error("program op " + std::to_string(i) + " depends on no valid op");
        ++succ_start_[static_cast<std::size_t>(d) + 1];
      }
      for (int b : op.releases) ++refs_[static_cast<std::size_t>(b)];
      if (fast_forward)
        for (int b : op.allocs) {
          int& a = alloc_op_[static_cast<std::size_t>(b)];
          a = a == -1 ? static_cast<int>(i) : Repeats::kManyAllocs;
        }
    }
    lifts_.assign(n, -1);
    gate_after_.assign(n, -1);
    for (const auto& g : p.gate_lifts) {
      if (g.op < 0 || g.after < 0 || static_cast<std::size_t>(g.op) >= n || static_cast<std::size_t>(g.after) >= n)
        throw std::logic_error("program gate lift " + std::to_string(g.op) + " after " + std::to_string(g.after) + " names no valid op");
      gate_after_[static_cast<std::size_t>(g.op)] = g.after;
      lifts_[static_cast<std::size_t>(g.after)] = p.queues[static_cast<std::size_t>(p.ops[static_cast<std::size_t>(g.op)].queue)].device;
    }
    for (std::size_t i = 0; i < n; ++i) succ_start_[i + 1] += succ_start_[i];
    succ_.resize(succ_start_[n]);
    auto& fill = scratch().fill;
    fill.assign(succ_start_.begin(), succ_start_.end() - 1);
    for (std::size_t i = 0; i < n; ++i)
      for (int d : p.ops[i].deps) succ_[static_cast<std::size_t>(fill[static_cast<std::size_t>(d)]++)] = static_cast<int>(i);
    qs_.resize(nq);
    for (std::size_t q = 0; q < nq; ++q)
      qs_[q] = QueueState{order_[q].data(), order_[q].size(), 0, 0, 0.0, p.queues[q].device,
                          p.queues[q].kind == QueueKind::concurrent, p.queues[q].host_copy, p.queues[q].compute};
    dev_.assign(static_cast<std::size_t>(p.devices()), DeviceState{});
    for (std::size_t q = 0; q < nq; ++q)
      if (p.queues[q].receives) dev_[static_cast<std::size_t>(p.queues[q].device)].receive_queue = static_cast<int>(q);
    r_.memory.assign(static_cast<std::size_t>(p.devices()), DeviceMemory{});
    r_.exposed_s.assign(nq, 0);
    r_.busy_s.assign(nq, 0);
    r_.bytes_sent.assign(nq, 0);
    r_.last_end_s.assign(nq, 0);
    active_.clear();
    if (record_) {
      r_.buffer_alloc_s.assign(p.buffers.size(), -1);
      r_.buffer_free_s.assign(p.buffers.size(), -1);
    }
    start_.assign(n, -1);
    end_.assign(n, -1);
    demand_.assign(p.resources.size(), 0.0);
    // Per-op state that start() writes before anything reads it: sized, not cleared (a run of a large step
    // would otherwise spend as long clearing arrays as simulating).
    for (auto* v : {&remaining_, &rate_, &updated_, &fill_rate_}) v->resize(n);
    active_pos_.resize(n);
    active_end_.clear();
    zero_.clear();
    dirty_.assign((nq + 63) / 64, 0);
    any_dirty_ = false;
    over_links_.clear();
    in_part_.assign(p.resources.size(), 0);
    // Per device, its concurrent queues: a memory release may let their held-back heads start.
    copy_queues_.resize(static_cast<std::size_t>(p.devices()));
    for (auto& v : copy_queues_) v.clear();
    for (std::size_t q = 0; q < nq; ++q)
      if (p.queues[q].kind == QueueKind::concurrent) copy_queues_[static_cast<std::size_t>(p.queues[q].device)].push_back(static_cast<int>(q));
    anchor_of_.clear();
    if (fast_forward) {
      release_count_ = refs_;  // the run counts refs_ down; the repeat checks need the program's counts
      repeats_.find(p, gate_after_, alloc_op_, release_count_);
    }
    if (fast_forward && !repeats_.runs().empty()) {
      anchor_of_.assign(n, -1);
      retry_.assign(repeats_.runs().size(), Retry{});
      for (std::size_t r = 0; r < repeats_.runs().size(); ++r) {
        const Repeat& run = repeats_.runs()[r];
        for (int i = 0; i < run.count; ++i) anchor_of_[static_cast<std::size_t>(run.main.first + i * run.main.stride)] = static_cast<int>(r);
      }
    }
    logging_ = false;
    pending_anchor_ = -1;
    before_.repeat = -1;
  }

  EngineResult run() {
    for (int b : p_.resident) alloc(b);
    sample_all();
    const std::size_t n = p_.ops.size();
    for (std::size_t q = 0; q < qs_.size(); ++q) mark(static_cast<int>(q));
    start_ready();
    at_anchor();
    auto& finished = finished_;
    while (done_ < n) {
      if (rates_stale_) update_rates();
      // The next completion: the earliest predicted end among the running ops (a dense array, so a scan).
      double next = std::numeric_limits<double>::infinity();
      for (double e : active_end_) next = std::min(next, e);
      if (!(next < std::numeric_limits<double>::infinity())) {
        if (!active_.empty()) throw std::logic_error("simulation stalled: no active op progresses");
        if (!force_gated()) throw std::logic_error("simulation deadlock at op " + std::to_string(first_unstarted()));
        at_anchor();
        continue;
      }
      now_ = next;
      ++r_.events;
      // Complete every op that finishes now (within rounding), in sequence order.
      // (The running set read through local pointers: pushing to `finished` could otherwise alias them, and
      // the compiler would reload them at every op.)
      finished.clear();
      const double* ends = active_end_.data();
      const int* running = active_.data();
      const double cut = now_ + 1e-9;
      for (std::size_t a = 0, na = active_.size(); a < na; ++a) {
        if (ends[a] > cut) continue;
        const auto k = static_cast<std::size_t>(running[a]);
        if ((ends[a] - now_) * rate_[k] <= 1e-12 * std::max(1.0, p_.ops[k].seconds)) finished.push_back(running[a]);
      }
      if (finished.size() > 1) std::sort(finished.begin(), finished.end());
      for (int i : finished) {
        deactivate(i);
        complete(i);
      }
      start_ready();
      at_anchor();
    }
    r_.end_time_s = now_;
    sample_all();
    if (record_) {
      r_.start_s = start_;
      r_.end_s = end_;
    }
    return std::move(r_);
  }

 private:
  // When nothing runs, an op held back by the memory limit would wait forever: XLA would issue it anyway
  // (and the step then needs that memory), so start the first one that is otherwise ready.
  bool force_gated() {
    for (std::size_t qi = 0; qi < qs_.size(); ++qi) {
      auto& q = qs_[qi];
      if (!q.concurrent) continue;
      if (q.pos < q.size && unmet_[static_cast<std::size_t>(q.ops[q.pos])] == 0) {
        forced_ = true;  // not a function of the state a fast-forward compares
        start(q.ops[q.pos++]);
        mark(static_cast<int>(qi));
        start_ready();
        return true;
      }
    }
    return false;
  }

  // ---- Fast-forward through repeating loop iterations (run_program). ----
  // After each pass of starts: if an iteration's first op started in it, compare the state with the one at
  // the previous iteration's start; when they match, replay the recorded events iteration after iteration.
  void at_anchor() {
    if (pending_anchor_ < 0) return;
    const int op = std::exchange(pending_anchor_, -1);
    const int ri = anchor_of_[static_cast<std::size_t>(op)];
    const Repeat& run = repeats_.runs()[static_cast<std::size_t>(ri)];
    const int it = run.iteration(op);
    auto& retry = retry_[static_cast<std::size_t>(ri)];
    if (it + 1 < retry.at) {  // backing off: record nothing until the iteration before the next try
      logging_ = false;
      before_.repeat = -1;
      return;
    }
    const bool pure = capture(now_snap_, run, ri, it);
    if (pure && logging_ && !forced_ && before_.repeat == ri && before_.iteration == it - 1) {
      const int k = same_state(run) ? fast_forward(ri) : 0;
      if (k > 0) {
        r_.replayed_iterations += k;
        logging_ = false;
        before_.repeat = -1;
        return;
      }
      // A state that does not repeat (a queue falling further behind every iteration) usually keeps not
      // repeating: try again after as many iterations as it has failed.
      retry.at = it + ++retry.failures;
    }
    std::swap(before_, now_snap_);
    logging_ = pure;
    forced_ = false;
    log_.clear();
    gates_.clear();
  }

  static bool close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max({1.0, std::abs(a), std::abs(b)}); }

  // The state now, ops of the run counted from iteration `it`'s first op. False if an op outside the run is
  // active (then the state cannot repeat).
  bool capture(Snapshot& s, const Repeat& run, int ri, int it) {
    s.repeat = ri;
    s.iteration = it;
    s.time_s = now_;
    s.active.clear();
    for (std::size_t a = 0; a < active_.size(); ++a) {
      const int i = active_[a];
      if (!run.contains(i)) return false;
      const auto k = static_cast<std::size_t>(i);
      s.active.push_back({i, run.offset(i, it), remaining_[k] - rate_[k] * (now_ - updated_[k]), rate_[k], active_end_[a] - now_});
    }
    std::sort(s.active.begin(), s.active.end());
    s.heads.resize(qs_.size());
    for (std::size_t q = 0; q < qs_.size(); ++q) {
      const auto& qs = qs_[q];
      const int head = qs.pos < qs.size ? qs.ops[qs.pos] : -1;
      const bool in_run = head >= 0 && run.contains(head);
      s.heads[q] = {head, qs.running, in_run ? run.offset(head, it) : 0, in_run, qs.busy_since};
    }
    const std::size_t nd = dev_.size();
    s.idle_since_s.resize(nd);
    s.hbm_bytes.resize(nd);
    s.copies.resize(nd);
    for (std::size_t d = 0; d < nd; ++d) {
      s.idle_since_s[d] = dev_[d].compute_idle_since;
      s.hbm_bytes[d] = dev_[d].hbm_live;
      s.copies[d] = dev_[d].copies_running;
    }
    s.demand = demand_;
    s.busy_s = r_.busy_s;
    s.exposed_s = r_.exposed_s;
    s.events = r_.events;
    s.over = static_cast<int>(over_links_.size());
    s.contended = was_contended_;
    s.stale = rates_stale_;
    s.interference_stale = interference_stale_;
    return true;
  }

  // A span that began before both snapshots and is still open, or one that began as far before each.
  static bool same_since(double a, double ta, double b, double tb, bool& shifts) {
    shifts = !close(a, b);
    return !shifts || close(a - ta, b - tb);
  }

  // The state now is the previous iteration's moved on by one iteration, and the recorded interval holds
  // only the run's ops. Failing that, it is so for everything but one serial queue that falls further
  // behind at every iteration (lagging_): the fast-forward then works that queue out on its own.
  bool same_state(const Repeat& run) {
    lagging_ = -1;
    if (repeats_without(run, -1)) return true;
    const int q = lagging_candidate();
    if (q < 0 || !repeats_without(run, q)) return false;
    lagging_ = q;
    return true;
  }

  // The state repeats, leaving out queue `skip`'s ops, head and links (-1: leaving out nothing).
  bool repeats_without(const Repeat& run, int skip) {
    const Snapshot &a = before_, &b = now_snap_;
    if (a.over != b.over || a.contended != b.contended || a.stale != b.stale || a.interference_stale != b.interference_stale ||
        a.copies != b.copies)
      return false;
    if (skip < 0 && a.active.size() != b.active.size()) return false;
    auto skipped = [&](const Snapshot::Active& x) { return skip >= 0 && p_.ops[static_cast<std::size_t>(x.op)].queue == skip; };
    for (std::size_t i = 0, j = 0;; ++i, ++j) {
      while (i < a.active.size() && skipped(a.active[i])) ++i;
      while (j < b.active.size() && skipped(b.active[j])) ++j;
      if (i == a.active.size() || j == b.active.size()) {
        if (i != a.active.size() || j != b.active.size()) return false;
        break;
      }
      const auto &x = a.active[i], &y = b.active[j];
      if (x.at != y.at || !close(x.remaining, y.remaining) || !close(x.rate, y.rate) || !close(x.end_in_s, y.end_in_s)) return false;
    }
    shift_busy_.assign(a.heads.size(), 0);
    for (std::size_t q = 0; q < a.heads.size(); ++q) {
      if (static_cast<int>(q) == skip) continue;
      const auto &x = a.heads[q], &y = b.heads[q];
      if (x.in_run != y.in_run || (x.in_run ? x.at != y.at : x.op != y.op) || x.running != y.running) return false;
      bool shifts = false;
      if (x.running > 0 && !same_since(x.busy_since_s, a.time_s, y.busy_since_s, b.time_s, shifts)) return false;
      shift_busy_[q] = shifts;
    }
    shift_idle_.assign(a.idle_since_s.size(), 0);
    for (std::size_t d = 0; d < a.idle_since_s.size(); ++d) {
      const double x = a.idle_since_s[d], y = b.idle_since_s[d];
      if ((x < 0) != (y < 0)) return false;
      bool shifts = false;
      if (x >= 0 && !same_since(x, a.time_s, y, b.time_s, shifts)) return false;
      shift_idle_[d] = shifts;
    }
    for (std::size_t r = 0; r < a.demand.size(); ++r)
      if (!(skip >= 0 && link_owner_[r] == skip) && !close(a.demand[r], b.demand[r])) return false;
    // Nothing waited for the left-out queue (its share of the compute stream's idle time did not grow).
    if (skip >= 0 && !close(a.exposed_s[static_cast<std::size_t>(skip)], b.exposed_s[static_cast<std::size_t>(skip)])) return false;
    for (const LogEntry& e : log_) {
      if (!run.contains(e.op)) return false;
      // What started may not have waited on an op outside the run finishing in the interval (the next
      // iteration's counterpart would not wait for it).
      if (e.start)
        for (int d : p_.ops[static_cast<std::size_t>(e.op)].deps)
          if (!run.contains(d) && !(end_[static_cast<std::size_t>(d)] >= 0 && end_[static_cast<std::size_t>(d)] <= a.time_s)) return false;
    }
    return true;
  }

  // The first serial communication queue whose head or running op differs between the two snapshots: one
  // that may be falling behind (-1: none).
  int lagging_candidate() {
    const Snapshot &a = before_, &b = now_snap_;
    auto running = [&](const Snapshot& s, std::size_t q) -> const Snapshot::Active* {
      for (const auto& x : s.active)
        if (static_cast<std::size_t>(p_.ops[static_cast<std::size_t>(x.op)].queue) == q) return &x;  // a serial queue runs one op at most
      return nullptr;
    };
    for (std::size_t q = 0; q < qs_.size(); ++q) {
      if (qs_[q].concurrent || qs_[q].compute || qs_[q].host_copy) continue;
      const auto &x = a.heads[q], &y = b.heads[q];
      bool differs = x.in_run != y.in_run || (x.in_run ? x.at != y.at : x.op != y.op) || x.running != y.running;
      if (!differs) {
        const auto *ra = running(a, q), *rb = running(b, q);
        differs = (ra == nullptr) != (rb == nullptr) ||
                  (ra && (ra->at != rb->at || !close(ra->remaining, rb->remaining) || !close(ra->end_in_s, rb->end_in_s)));
      }
      if (differs) {
        if (link_owner_.size() != p_.resources.size()) link_owner_ = link_owners(p_);
        return static_cast<int>(q);
      }
    }
    return -1;
  }

  // How many iterations may be replayed, then replays them; returns that number (0: none).
  int fast_forward(int ri) {
    const Repeat& run = repeats_.runs()[static_cast<std::size_t>(ri)];
    const Snapshot &a = before_, &b = now_snap_;
    const double period = b.time_s - a.time_s;
    if (!(period > 0) || log_.empty()) return 0;
    // The iterations the interval and the states refer to, [lowest, top]: each must be the one before
    // shifted, as must those the replays move them to, with an iteration to spare.
    int lowest = b.iteration, top = b.iteration;
    auto see = [&](int op) {
      lowest = std::min(lowest, run.iteration(op));
      top = std::max(top, run.iteration(op));
    };
    for (const LogEntry& e : log_) see(e.op);
    for (const Snapshot* s : {&a, &b}) {
      for (const auto& x : s->active) see(x.op);
      for (const auto& h : s->heads)
        if (h.in_run) see(h.op);
    }
    if (repeats_.first_break(ri, lowest + 1, top + 1) <= top + 1) return 0;
    std::int64_t k = run.count - 2 - top;
    if (k <= 0) return 0;
    k = std::min<std::int64_t>(k, repeats_.first_break(ri, top + 2, top + 1 + static_cast<int>(k)) - (top + 2));
    // A memory gate keeps its verdict while live HBM moves by whole iterations' changes.
    for (const GateCheck& g : gates_) {
      const double delta = b.hbm_bytes[static_cast<std::size_t>(g.device)] - a.hbm_bytes[static_cast<std::size_t>(g.device)];
      if (std::abs(delta) <= 1e-9 * std::max(1.0, std::abs(g.margin_bytes))) continue;
      const double turns = g.margin_bytes / delta;  // after this many iterations the margin is zero
      if (g.margin_bytes >= 0 && delta > 0) k = std::min<std::int64_t>(k, static_cast<std::int64_t>(std::floor(turns)));
      if (g.margin_bytes < 0 && delta < 0) k = std::min<std::int64_t>(k, static_cast<std::int64_t>(std::ceil(turns)) - 1);
    }
    if (k <= 0) return 0;
    prepare_replay(run);
    if (lag_blocked_ || !replayable(run, 1)) return 0;
    LaggingWalk walk;
    if (lagging_ >= 0) {  // stop the stretch before the lagging queue does what the walk cannot vouch for
      walk = walk_queue(run, static_cast<int>(k), period);
      if (walk.vouched_until_s < std::numeric_limits<double>::infinity()) {
        auto m = static_cast<std::int64_t>(std::ceil((walk.vouched_until_s - b.time_s) / period)) - 1;
        while (m > 0 && b.time_s + static_cast<double>(m) * period >= walk.vouched_until_s) --m;
        k = std::min(k, m);
        if (k <= 0) return 0;
      }
    }
    int done = 1;
    if (record_) {  // the timeline needs every change: each interval replayed
      replay(1, period);
      while (done < k && replayable(run, done + 1)) replay(++done, period);
    } else {
      const Totals before = totals();
      track_ = true;
      replay(1, period);
      track_ = false;
      done = jump(run, static_cast<int>(k), period, before);
    }
    move_on(run, done, period);
    if (lagging_ >= 0) apply_walk(walk, b.time_s + done * period, done, period);
    return done;
  }

  // ---- A queue falling behind the loop (sim/lagging_queue.hpp). ----
  // The lagging queue's ops through the next k intervals. An op of the run that has not ended yet ends
  // where its counterpart in the recorded interval did, a period later per iteration between them.
  LaggingWalk walk_queue(const Repeat& run, int k, double period) {
    const double from = now_snap_.time_s, until = from + k * period;
    class_ends_.clear();
    for (const ReplayStep& e : steps_)
      if (!e.start) class_ends_.push_back({run.offset(e.op, run.iteration(e.op)), e.time_s, run.iteration(e.op)});
    std::sort(class_ends_.begin(), class_ends_.end(), [](const ClassEnd& x, const ClassEnd& y) { return x.at < y.at; });
    const RunBounds in{run};
    auto end_of = [&](int op) -> double {
      const double e = end_[static_cast<std::size_t>(op)];
      if (e >= 0) return e;
      if (!in(op)) return std::numeric_limits<double>::infinity();  // nothing outside the run runs in the stretch
      const std::int64_t at = run.offset(op, run.iteration(op));
      auto it = std::lower_bound(class_ends_.begin(), class_ends_.end(), at, [](const ClassEnd& x, std::int64_t v) { return x.at < v; });
      const int m = it == class_ends_.end() || it->at != at ? 0 : run.iteration(op) - it->iteration;
      return m >= 1 ? it->time_s + m * period : std::numeric_limits<double>::quiet_NaN();
    };
    int running = -1;
    double running_end = 0;
    for (std::size_t a = 0; a < active_.size(); ++a)
      if (p_.ops[static_cast<std::size_t>(active_[a])].queue == lagging_) {
        running = active_[a];
        running_end = active_end_[a];
      }
    if (running >= 0 && (rate_[static_cast<std::size_t>(running)] != 1.0 || !runs_alone(p_, link_owner_, lifts_, running))) {
      LaggingWalk none;
      none.vouched_until_s = from;
      return none;
    }
    const WalkContext c{p_, link_owner_, lifts_, succ_start_, succ_, end_of, [&](int op) { return in(op); },
                        [&](double t, double tol) {
                          double at = t;
                          return loop_instant(t, tol, k, period, at) ? at : t;
                        }};
    const auto q = static_cast<std::size_t>(lagging_);
    return walk_lagging(c, order_[q], qs_[q].pos, running, running >= 0 ? start_[static_cast<std::size_t>(running)] : 0,
                        running_end, from, until);
  }

  // The walk's events up to `until` (the stretch's end, `done` intervals on): what start() and complete()
  // would have done for each, the op still running then joining the running set.
  void apply_walk(const LaggingWalk& w, double until, int done, double period) {
    const auto q = static_cast<std::size_t>(lagging_);
    auto& qs = qs_[q];
    for (const LaggingOp& o : w.ops) {
      if (o.start_s > until) break;
      const auto k = static_cast<std::size_t>(o.op);
      const ProgramOp& op = p_.ops[k];
      const bool was_running = start_[k] >= 0;
      if (!was_running) {
        start_[k] = o.start_s;
        ++qs.pos;
        if (qs.running++ == 0) qs.busy_since = o.start_s;
      }
      if (o.end_s > until) {
        if (!was_running) {
          remaining_[k] = op.seconds;
          rate_[k] = 1.0;
          updated_[k] = o.start_s;
          active_pos_[k] = static_cast<int>(active_.size());
          active_.push_back(o.op);
          active_end_.push_back(o.end_s);
          for (const auto& u : uses_of(o.op)) add_demand(u.resource, u.bytes_per_s);
        }
        break;
      }
      if (was_running) {
        deactivate(o.op);
        for (const auto& u : uses_of(o.op)) add_demand(u.resource, -u.bytes_per_s);
      }
      end_[k] = o.end_s;
      ++done_;
      r_.executed_flops += op.executed_flops;
      r_.bytes_sent[q] += op.bytes_sent;
      r_.last_end_s[q] = o.end_s;
      if (--qs.running == 0) r_.busy_s[q] += o.end_s - qs.busy_since;
      for (int s = succ_start_[k]; s < succ_start_[k + 1]; ++s) --unmet_[static_cast<std::size_t>(succ_[static_cast<std::size_t>(s)])];
      // A completion is an event of its own unless ops of the loop complete at that instant too (a zero-length
      // op completes at the instant that started it).
      double at = 0;
      if (op.seconds > 0 && !loop_instant(o.end_s, 0, done, period, at)) ++r_.events;
    }
  }

  // The earliest instant of the loop (its ops' completions, not the lagging queue's) in the `done` intervals
  // replayed that lies in [t - tol, t], or equals t within 1e-12 relative: the engine completes an op due at
  // t there. False if there is none.
  bool loop_instant(double t, double tol, int done, double period, double& at) const {
    const double base = now_snap_.time_s;
    const auto m0 = static_cast<int>(std::floor((t - base) / period));
    bool found = false;
    at = t;
    auto take = [&](double x) {
      if ((x <= t && x >= t - tol) || close(x, t)) {
        at = found ? std::min(at, x) : x;
        found = true;
      }
    };
    for (int m = std::max(1, m0); m <= std::min(done, m0 + 2); ++m) {
      const double shift = m * period;
      auto it = std::lower_bound(lag_instants_.begin(), lag_instants_.end(), t - tol - shift);
      if (it != lag_instants_.begin()) take(*std::prev(it) + shift);
      for (; it != lag_instants_.end() && *it + shift <= t + tol + 1e-12 * std::max(1.0, std::abs(t)); ++it) take(*it + shift);
    }
    return found;
  }

  // ---- Intervals after the first, in closed form. ----
  // What the run has done so far: totals the first replayed interval moves by a fixed amount.
  struct Totals {
    std::size_t done = 0;
    double flops = 0;
    std::vector<double> bytes_sent;  // per queue
    std::vector<DeviceState> devices;
  };
  Totals totals() const { return Totals{done_, r_.executed_flops, r_.bytes_sent, dev_}; }

  // Intervals 2..k (they repeat the first, which replay() just did): each op's start and end, its
  // releases' reference counts and its successors' dependency counts moved on per interval, and the
  // totals, live memory and peaks by the first interval's change times the intervals. Returns the
  // intervals done in all (an interval whose frees differ from the first's, or that would release an op
  // outside the run, is not done).
  int jump(const Repeat& run, int k, double period, const Totals& before) {
    int done = 1;
    const RunBounds in{run};
    while (done < k && jump_interval(in, done + 1, period)) ++done;
    if (done > 1) add_jumped(done, period, before);
    return done;
  }

  // Intervals 2..done, jumped: what the first one changed, `done - 1` times more.
  void add_jumped(int done, double period, const Totals& before) {
    const double n = done - 1;
    done_ += static_cast<std::size_t>(done - 1) * (done_ - before.done);
    r_.executed_flops += n * (r_.executed_flops - before.flops);
    for (std::size_t q = 0; q < qs_.size(); ++q) r_.bytes_sent[q] += n * (r_.bytes_sent[q] - before.bytes_sent[q]);
    for (const ReplayStep& e : steps_)
      if (!e.start) r_.last_end_s[static_cast<std::size_t>(p_.ops[static_cast<std::size_t>(e.op)].queue)] = e.time_s + done * period;
    for (std::size_t d = 0; d < dev_.size(); ++d) {
      auto& dv = dev_[d];
      const auto& was = before.devices[d];
      const double hbm = dv.hbm_live - was.hbm_live, host = dv.host_live - was.host_live;
      auto& mem = r_.memory[d];
      // Live memory moves by the same amount every interval: where it grows, the last interval's high point
      // is the highest; where it does not, none beats the first's.
      const Excursion& x = excursion_[d];
      if (hbm > 0 && x.hbm_bytes + n * hbm > mem.hbm_peak_bytes) {
        mem.hbm_peak_bytes = x.hbm_bytes + n * hbm;
        mem.hbm_peak_time_s = x.time_s + n * period;
        for (std::size_t c = 0; c < mem.hbm_at_peak.size(); ++c) mem.hbm_at_peak[c] = x.by_cat[c] + n * (dv.by_cat[c] - was.by_cat[c]);
      }
      if (host > 0) mem.host_peak_bytes = std::max(mem.host_peak_bytes, x.host_bytes + n * host);
      for (std::size_t c = 0; c < dv.by_cat.size(); ++c) dv.by_cat[c] += n * (dv.by_cat[c] - was.by_cat[c]);
      dv.hbm_live += n * hbm;
      dv.host_live += n * host;
    }
  }

  // Interval m's per-op changes; undone (false) where it is not replayable (an op outside the run it waits
  // on has not ended, or one it would release) or where one of its releases frees, or does not free, where
  // the first interval's did not, or did (a buffer released from outside the run at other times).
  bool jump_interval(const RunBounds& in, int m, double period) {
    std::size_t slot = 0;
    bool same = true;
    for (const ReplayStep& e : steps_) {
      const auto i = static_cast<std::size_t>(e.op + m * e.stride);
      const double t = e.time_s + m * period;
      if (e.start) {
        start_[i] = t;
        if (e.outside)
          for (int d : p_.ops[i].deps) same &= in(d) || end_[static_cast<std::size_t>(d)] >= 0;
        continue;
      }
      end_[i] = t;
      for (int b : p_.ops[i].releases) same &= (--refs_[static_cast<std::size_t>(b)] == 0) == (freed_[slot++] != 0);
      for (int s = succ_start_[i]; s < succ_start_[i + 1]; ++s) {
        const int succ = succ_[static_cast<std::size_t>(s)];
        if (--unmet_[static_cast<std::size_t>(succ)] == 0 && !in(succ)) same = false;
      }
    }
    if (same) return true;
    for (const ReplayStep& e : steps_) {
      const auto i = static_cast<std::size_t>(e.op + m * e.stride);
      if (e.start) {
        start_[i] = -1;
        continue;
      }
      end_[i] = -1;
      for (int b : p_.ops[i].releases) ++refs_[static_cast<std::size_t>(b)];
      for (int s = succ_start_[i]; s < succ_start_[i + 1]; ++s) ++unmet_[static_cast<std::size_t>(succ_[static_cast<std::size_t>(s)])];
    }
    return false;
  }

  // The recorded interval as replay steps: each entry's op and how far it moves per iteration, whether it
  // waits on ops outside the run, and whether any of its successors lies outside it (computed once per jump).
  // A lagging queue's events are left out (walk_queue works them out); the loop may not wait for it
  // (lag_blocked_), and the instants at which only it completed ops are counted apart.
  void prepare_replay(const Repeat& run) {
    steps_.clear();
    lag_blocked_ = false;
    lag_only_instants_ = 0;
    lag_instants_.clear();
    const RunBounds in{run};
    for (const LogEntry& e : log_) {
      const auto k = static_cast<std::size_t>(e.op);
      if (lagging_ >= 0 && p_.ops[k].queue == lagging_) continue;
      bool outside = false;
      if (e.start) {
        for (int d : p_.ops[k].deps) {
          outside |= !in(d);
          lag_blocked_ |= lagging_ >= 0 && p_.ops[static_cast<std::size_t>(d)].queue == lagging_;
        }
      }
      steps_.push_back(ReplayStep{e.op, run.of(e.op).stride, e.time_s, e.start, outside});
    }
    if (lagging_ < 0) return;
    // The log is in time order: an instant's completions (and the starts between them) are contiguous.
    for (std::size_t i = 0; i < log_.size();) {
      bool loop = false, lagging = false;
      std::size_t j = i;
      for (; j < log_.size() && log_[j].time_s == log_[i].time_s; ++j)
        if (!log_[j].start) (p_.ops[static_cast<std::size_t>(log_[j].op)].queue == lagging_ ? lagging : loop) = true;
      if (loop) lag_instants_.push_back(log_[i].time_s);
      else if (lagging) ++lag_only_instants_;
      i = j;
    }
  }

  // Replaying interval m meets every outside dependency it needs and releases no outside op. Only entries
  // with outside dependencies, and completions (whose successors may lie outside), are looked at.
  bool replayable(const Repeat& run, int m) {
    const RunBounds in{run};
    auto& pending = pending_;
    pending.clear();
    for (const ReplayStep& e : steps_) {
      const auto k = static_cast<std::size_t>(e.op + m * e.stride);
      if (e.start) {
        if (e.outside)
          for (int d : p_.ops[k].deps)
            if (!in(d) && end_[static_cast<std::size_t>(d)] < 0) return false;
        continue;
      }
      for (int s = succ_start_[k]; s < succ_start_[k + 1]; ++s) {
        const int succ = succ_[static_cast<std::size_t>(s)];
        if (!in(succ)) pending.push_back(succ);
      }
    }
    if (pending.size() > 1) std::sort(pending.begin(), pending.end());
    for (std::size_t i = 0; i < pending.size();) {
      std::size_t j = i;
      while (j < pending.size() && pending[j] == pending[i]) ++j;
      if (unmet_[static_cast<std::size_t>(pending[i])] <= static_cast<int>(j - i)) return false;
      i = j;
    }
    return true;
  }

  // Interval m's events: the recorded ones moved on by m iterations (what a start or a completion changes
  // outside the running set; move_on() sets that set). Nothing is marked startable: move_on() clears the
  // marks, nothing more can start at the replay's end.
  void replay(int m, double period) {
    if (track_) {
      freed_.clear();
      excursion_.resize(dev_.size());
      for (std::size_t d = 0; d < dev_.size(); ++d)
        excursion_[d] = Excursion{dev_[d].hbm_live, dev_[d].host_live, now_, dev_[d].by_cat};
    }
    for (const ReplayStep& e : steps_) {
      const int i = e.op + m * e.stride;
      const auto k = static_cast<std::size_t>(i);
      now_ = e.time_s + m * period;
      if (e.start) {
        start_[k] = now_;
        for (int b : p_.ops[k].allocs) alloc(b);
      } else {
        if (track_)
          for (int b : p_.ops[k].releases) freed_.push_back(refs_[static_cast<std::size_t>(b)] == 1);
        retire<false>(i);
      }
    }
  }

  // After `m` replayed intervals: the running ops, queues and spans are the current ones moved on by m
  // iterations; the per-queue times grew by m intervals' worth.
  void move_on(const Repeat& run, int m, double period) {
    const Snapshot &a = before_, &b = now_snap_;
    const double dt = m * period;
    now_ = b.time_s + dt;
    for (std::size_t pos = 0; pos < active_.size(); ++pos) {
      if (lagging_ >= 0 && p_.ops[static_cast<std::size_t>(active_[pos])].queue == lagging_) continue;  // apply_walk()
      const auto from = static_cast<std::size_t>(active_[pos]), to = static_cast<std::size_t>(run.moved(active_[pos], m));
      active_[pos] = static_cast<int>(to);
      active_pos_[to] = static_cast<int>(pos);
      active_pos_[from] = -1;
      remaining_[to] = remaining_[from];
      rate_[to] = rate_[from];
      updated_[to] = updated_[from] + dt;
      active_end_[pos] += dt;
    }
    auto& per_queue = per_queue_;
    per_queue.assign(qs_.size(), 0);
    for (const Segment* seg : {&run.main, &run.side})
      for (int i = seg->first; i < seg->first + seg->stride; ++i) ++per_queue[static_cast<std::size_t>(p_.ops[static_cast<std::size_t>(i)].queue)];
    for (std::size_t q = 0; q < qs_.size(); ++q) {
      if (static_cast<int>(q) == lagging_) continue;  // apply_walk()
      if (b.heads[q].in_run) qs_[q].pos += static_cast<std::size_t>(m * per_queue[q]);  // else nothing of it started
      if (shift_busy_[q]) qs_[q].busy_since += dt;
      r_.busy_s[q] += m * (b.busy_s[q] - a.busy_s[q]);
      r_.exposed_s[q] += m * (b.exposed_s[q] - a.exposed_s[q]);
    }
    for (std::size_t d = 0; d < dev_.size(); ++d)
      if (shift_idle_[d]) dev_[d].compute_idle_since += dt;
    r_.events += static_cast<std::uint64_t>(m) * (b.events - a.events - static_cast<std::uint64_t>(lag_only_instants_));
    std::fill(dirty_.begin(), dirty_.end(), 0);  // the replayed completions' marks: nothing more can start now
    any_dirty_ = false;
  }

  // An active op's rate from now on: its progress so far is banked and its end predicted anew.
  void set_rate(int i, double rate) {
    const auto k = static_cast<std::size_t>(i);
    if (rate == rate_[k]) return;
    remaining_[k] = std::max(0.0, remaining_[k] - rate_[k] * (now_ - updated_[k]));
    updated_[k] = now_;
    rate_[k] = rate;
    active_end_[static_cast<std::size_t>(active_pos_[k])] = predicted_end(k);
  }
  double predicted_end(std::size_t k) const {
    return rate_[k] > 0 ? updated_[k] + remaining_[k] / rate_[k] : std::numeric_limits<double>::infinity();
  }
  void deactivate(int i) {
    const auto k = static_cast<std::size_t>(i);
    const auto pos = static_cast<std::size_t>(active_pos_[k]);
    const int moved = active_.back();
    active_[pos] = moved;
    active_end_[pos] = active_end_.back();
    active_pos_[static_cast<std::size_t>(moved)] = static_cast<int>(pos);
    active_.pop_back();
    active_end_.pop_back();
    active_pos_[k] = -1;
  }
  // A queue whose head may have become startable (a bit per queue, so that a scan runs in queue order).
  void mark(int q) {
    dirty_[static_cast<std::size_t>(q) >> 6] |= std::uint64_t{1} << (static_cast<unsigned>(q) & 63u);
    any_dirty_ = true;
  }

  int first_unstarted() const {
    for (std::size_t i = 0; i < p_.ops.size(); ++i)
      if (start_[i] < 0) return static_cast<int>(i);
    return -1;
  }

  void alloc(int b) {
    const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
    if (record_) r_.buffer_alloc_s[static_cast<std::size_t>(b)] = now_;
    auto& d = dev_[static_cast<std::size_t>(buf.device)];
    auto& m = r_.memory[static_cast<std::size_t>(buf.device)];
    if (buf.host) {
      d.host_live += buf.bytes;
      m.host_peak_bytes = std::max(m.host_peak_bytes, d.host_live);
    } else {
      d.hbm_live += buf.bytes;
      d.by_cat[static_cast<std::size_t>(buf.category)] += buf.bytes;
      if (d.hbm_live > m.hbm_peak_bytes) {
        m.hbm_peak_bytes = d.hbm_live;
        m.hbm_peak_time_s = now_;
        m.hbm_at_peak = d.by_cat;
      }
    }
    if (track_) {
      Excursion& x = excursion_[static_cast<std::size_t>(buf.device)];
      x.host_bytes = std::max(x.host_bytes, d.host_live);
      if (d.hbm_live > x.hbm_bytes) x = Excursion{d.hbm_live, x.host_bytes, now_, d.by_cat};
    }
    sample(buf.device);
  }

  template <bool Marks = true>
  void release(int b) {
    if (--refs_[static_cast<std::size_t>(b)] > 0) return;
    const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
    if (record_) r_.buffer_free_s[static_cast<std::size_t>(b)] = now_;
    auto& d = dev_[static_cast<std::size_t>(buf.device)];
    if (buf.host) {
      d.host_live -= buf.bytes;
    } else {
      d.hbm_live -= buf.bytes;
      d.by_cat[static_cast<std::size_t>(buf.category)] -= buf.bytes;
      if constexpr (Marks)
        for (int q : copy_queues_[static_cast<std::size_t>(buf.device)]) mark(q);  // held-back prefetches may fit now
    }
    sample(buf.device);
  }

  // With a recorded timeline, a sample of a device's memory at each change.
  void sample(int device) {
    if (!record_) return;
    const auto& d = dev_[static_cast<std::size_t>(device)];
    r_.timeline.push_back(MemorySample{now_, device, d.hbm_live, d.host_live, d.by_cat});
  }
  void sample_all() {
    for (int d = 0; d < p_.devices(); ++d) sample(d);
  }

  bool can_start(int i) {
    const auto& op = p_.ops[static_cast<std::size_t>(i)];
    if (unmet_[static_cast<std::size_t>(i)] != 0) return false;
    if (op.gate_bytes <= 0) return true;
    if (const int after = gate_after_[static_cast<std::size_t>(i)]; after >= 0 && end_[static_cast<std::size_t>(after)] >= 0)
      return true;
    const int device = qs_[static_cast<std::size_t>(op.queue)].device;
    const double margin = p_.hbm_limit_bytes[static_cast<std::size_t>(device)] - (dev_[static_cast<std::size_t>(device)].hbm_live + op.gate_bytes);
    if (logging_) gates_.push_back(GateCheck{device, margin});
    return margin >= 0;
  }

  void start(int i) {
    auto k = static_cast<std::size_t>(i);
    const auto& op = p_.ops[k];
    auto& q = qs_[static_cast<std::size_t>(op.queue)];
    auto& dv = dev_[static_cast<std::size_t>(q.device)];
    if (q.compute && dv.compute_idle_since >= 0) {
      double gap = now_ - dv.compute_idle_since;
      if (gap > 0) r_.exposed_s[static_cast<std::size_t>(blame_queue(i))] += gap;
      dv.compute_idle_since = -1;
    }
    start_[k] = now_;
    if (logging_) log_.push_back(LogEntry{i, now_, true});
    if (!anchor_of_.empty() && anchor_of_[k] >= 0) pending_anchor_ = i;
    remaining_[k] = op.seconds;
    for (int b : op.allocs) alloc(b);
    if (q.running++ == 0) q.busy_since = now_;
    if (q.host_copy && dv.copies_running++ == 0) interference_stale_ = rates_stale_ = true;
    active_pos_[k] = static_cast<int>(active_.size());
    active_.push_back(i);
    active_end_.push_back(0);
    updated_[k] = now_;
    // A transfer adds to its links' demand (full speed unless a link is now oversubscribed: update_rates);
    // anything else only needs its own rate.
    if (op.use_count > 0) {
      transfer_changed(i, 1.0);
      rate_[k] = 1.0;
    } else {
      rate_[k] = solo_rate(op);
    }
    // A zero-length op completes on the spot (start_ready), never as an event.
    active_end_.back() = op.seconds <= 0 ? std::numeric_limits<double>::infinity() : predicted_end(k);
    if (op.seconds <= 0) {
      remaining_[k] = 0;
      zero_.push_back(i);
    }
  }

  // A transfer starts (+1) or ends (-1). While links are shared (some link is oversubscribed), the rates need
  // computing again only if it uses a link that is or was oversubscribed: the others never limit anyone
  // (update_rates), so every other rate stands and its own is full speed.
  void transfer_changed(int i, double sign) {
    bool over = false;
    for (const auto& u : uses_of(i)) over = add_demand(u.resource, sign * u.bytes_per_s) || over;
    if (over || over_links_.empty()) rates_stale_ = true;
  }

  // Link demand, with the oversubscribed links kept as it changes; returns whether the link was or is
  // oversubscribed.
  bool add_demand(int resource, double bytes_per_s) {
    const auto r = static_cast<std::size_t>(resource);
    const double cap = p_.resources[r].capacity_bytes_per_s * (1 + 1e-9);
    const bool was = demand_[r] > cap;
    demand_[r] += bytes_per_s;
    const bool is = demand_[r] > cap;
    if (is && !was) over_links_.push_back(resource);
    if (was && !is) {
      auto at = std::find(over_links_.begin(), over_links_.end(), resource);
      *at = over_links_.back();
      over_links_.pop_back();
    }
    return was || is;
  }

  // The dependency that finished last is what the compute stream was waiting for; a wait on another device
  // (a pipeline receive) is charged to this device's receiving queue.
  int blame_queue(int i) const {
    double latest = -1;
    const int own = p_.ops[static_cast<std::size_t>(i)].queue;
    int queue = own;
    for (int d : p_.ops[static_cast<std::size_t>(i)].deps) {
      double e = end_[static_cast<std::size_t>(d)];
      if (e > latest) {
        latest = e;
        queue = p_.ops[static_cast<std::size_t>(d)].queue;
      }
    }
    const int device = qs_[static_cast<std::size_t>(own)].device;
    const int receiver = dev_[static_cast<std::size_t>(device)].receive_queue;
    if (receiver >= 0 && qs_[static_cast<std::size_t>(queue)].device != device) return receiver;
    return queue;
  }

  [[gnu::always_inline]] void complete(int i) {
    auto k = static_cast<std::size_t>(i);
    const auto& op = p_.ops[k];
    const auto q = static_cast<std::size_t>(op.queue);
    if (logging_) log_.push_back(LogEntry{i, now_, false});
    auto& qs = qs_[q];
    if (--qs.running == 0) r_.busy_s[q] += now_ - qs.busy_since;  // busy time is the union of the queue's spans
    auto& dv = dev_[static_cast<std::size_t>(qs.device)];
    if (qs.host_copy && --dv.copies_running == 0) interference_stale_ = rates_stale_ = true;
    if (op.use_count > 0) transfer_changed(i, -1.0);
    if (qs.compute) dv.compute_idle_since = now_;
    retire(i);
  }

  // What a completion changes besides the running set (also for a replayed one): its end, the totals, its
  // frees, and (Marks) the queues it may let start.
  template <bool Marks = true>
  [[gnu::always_inline]] void retire(int i) {
    auto k = static_cast<std::size_t>(i);
    const auto& op = p_.ops[k];
    const auto q = static_cast<std::size_t>(op.queue);
    end_[k] = now_;
    ++done_;
    r_.executed_flops += op.executed_flops;
    r_.bytes_sent[q] += op.bytes_sent;
    r_.last_end_s[q] = now_;
    for (int b : op.releases) release<Marks>(b);
    if constexpr (Marks) {
      if (lifts_[k] >= 0)  // a held-back prefetch's latest start has come
        for (int cq : copy_queues_[static_cast<std::size_t>(lifts_[k])]) mark(cq);
      mark(op.queue);
    }
    for (int s = succ_start_[k]; s < succ_start_[k + 1]; ++s) {
      const int succ = succ_[static_cast<std::size_t>(s)];
      if (--unmet_[static_cast<std::size_t>(succ)] == 0 && Marks) mark(op_queue_[static_cast<std::size_t>(succ)]);
    }
  }

  // Starts what can start on the queues whose heads may have changed, in queue order (as a scan of every
  // queue would: a queue nothing happened to cannot start anything). Starting an op never makes another
  // ready (only completions and frees do), so one pass suffices, unless a zero-length op completes on the
  // spot and releases its successors.
  [[gnu::always_inline]] void start_ready() {
    while (any_dirty_) {
      any_dirty_ = false;
      for (std::size_t w = 0; w < dirty_.size(); ++w) {
        std::uint64_t bits = std::exchange(dirty_[w], 0);
        while (bits) {
          const int qi = static_cast<int>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
          bits &= bits - 1;
          auto& q = qs_[static_cast<std::size_t>(qi)];
          if (q.concurrent) {
            while (q.pos < q.size && can_start(q.ops[q.pos])) start(q.ops[q.pos++]);
          } else if (q.running == 0 && q.pos < q.size && can_start(q.ops[q.pos])) {
            start(q.ops[q.pos++]);
          }
        }
      }
      if (zero_.empty()) continue;
      std::sort(zero_.begin(), zero_.end());
      zeros_.swap(zero_);
      zero_.clear();
      for (int i : zeros_) {
        deactivate(i);
        complete(i);
      }
    }
  }

  struct Span {
    const Use *b, *e;
    const Use* begin() const { return b; }
    const Use* end() const { return e; }
  };
  Span uses_of(int i) const {
    const auto& op = p_.ops[static_cast<std::size_t>(i)];
    const Use* first = p_.uses.data() + op.use_begin;
    return {first, first + op.use_count};
  }

  double solo_rate(const ProgramOp& op) const {
    if (!op.memory_bound) return 1.0;
    const auto& d = dev_[static_cast<std::size_t>(qs_[static_cast<std::size_t>(op.queue)].device)];
    return d.copies_running > 0 ? 1.0 - p_.copy_interference : 1.0;
  }

  // Rates: ops that use no link run at full speed (memory-bound kernels slower while a host copy runs).
  // Transfers run at full speed while no link is oversubscribed (the demand on each is kept as they start and
  // end); otherwise they share the links max-min fairly by progressive filling, one priority class after
  // another: a class takes what it can of every link before the next class sees what is left.
  void update_rates() {
    rates_stale_ = false;
    if (interference_stale_) {
      interference_stale_ = false;
      for (std::size_t a = 0; a < active_.size(); ++a) {
        const int i = active_[a];
        if (p_.ops[static_cast<std::size_t>(i)].use_count == 0) set_rate(i, solo_rate(p_.ops[static_cast<std::size_t>(i)]));
      }
    }
    const auto nr = p_.resources.size();
    if (over_links_.empty()) {
      if (was_contended_)
        for (std::size_t a = 0; a < active_.size(); ++a)
          if (p_.ops[static_cast<std::size_t>(active_[a])].use_count > 0) set_rate(active_[a], 1.0);
      was_contended_ = false;
      return;
    }
    was_contended_ = true;
    // Max-min fairness: a link that is not oversubscribed never limits a transfer (all of its transfers fit
    // it at full speed), so only the transfers that use an oversubscribed link are shared, and only over
    // such links; every other one runs at full speed. (The links may come in any order: each one's share
    // depends only on its own demand and capacity.)
    touched_.assign(over_links_.begin(), over_links_.end());
    for (int r : touched_) in_part_[static_cast<std::size_t>(r)] = 1;
    auto& sharing = sharing_;
    sharing.clear();
    for (int i : active_) {
      const auto& op = p_.ops[static_cast<std::size_t>(i)];
      if (op.use_count == 0) continue;
      bool over = false;
      for (const auto& u : uses_of(i)) over = over || in_part_[static_cast<std::size_t>(u.resource)];
      if (over) sharing.push_back(Flow{i, op.priority});
      else set_rate(i, 1.0);
    }
    auto& flows = flows_;
    flows.assign(sharing.begin(), sharing.end());  // every shared transfer gets its new rate at the end
    // The transfers, with their class read once; classes are served best first (no sort: usually the first
    // class fills the links the rest would use, and they all get nothing).
    auto& rate = fill_rate_;
    cap_left_.resize(nr);
    weight_.resize(nr);
    for (int r : touched_) cap_left_[static_cast<std::size_t>(r)] = p_.resources[static_cast<std::size_t>(r)].capacity_bytes_per_s;
    // A transfer can go faster only while every oversubscribed link it uses has capacity left.
    auto has_room = [&](int i) {
      for (const auto& u : uses_of(i)) {
        const auto r = static_cast<std::size_t>(u.resource);
        if (in_part_[r] && cap_left_[r] <= 1e-12 * p_.resources[r].capacity_bytes_per_s) return false;
      }
      return true;
    };
    auto& unfrozen = unfrozen_;
    while (!flows.empty()) {
      int cls = flows[0].priority;
      for (const Flow& f : flows) cls = std::min(cls, f.priority);
      unfrozen.clear();
      std::size_t kept_flows = 0;
      for (const Flow& f : flows) {
        if (f.priority == cls) unfrozen.push_back(f.op);
        else flows[kept_flows++] = f;
      }
      flows.resize(kept_flows);
      bool room = false;
      for (int i : unfrozen) room = room || has_room(i);
      double level = 0;  // every unfrozen flow of the class runs at this rate
      while (room && !unfrozen.empty()) {
        for (int r : touched_) weight_[static_cast<std::size_t>(r)] = 0.0;
        for (int i : unfrozen)
          for (const auto& u : uses_of(i))
            if (in_part_[static_cast<std::size_t>(u.resource)]) weight_[static_cast<std::size_t>(u.resource)] += u.bytes_per_s;
        double inc = 1.0 - level;
        for (int r : touched_)
          if (weight_[static_cast<std::size_t>(r)] > 0)
            inc = std::min(inc, std::max(0.0, cap_left_[static_cast<std::size_t>(r)]) / weight_[static_cast<std::size_t>(r)]);
        level += inc;
        for (int r : touched_) cap_left_[static_cast<std::size_t>(r)] -= inc * weight_[static_cast<std::size_t>(r)];
        std::size_t kept = 0;
        for (int i : unfrozen) {
          rate[static_cast<std::size_t>(i)] = level;
          if (level < 1.0 - 1e-12 && has_room(i)) unfrozen[kept++] = i;
        }
        unfrozen.resize(kept);
      }
      for (int i : unfrozen) rate[static_cast<std::size_t>(i)] = level;  // a class with no room at all
      // When no link the remaining classes use has room left, they all wait.
      bool any_room = false;
      for (const Flow& f : flows) any_room = any_room || has_room(f.op);
      if (!any_room) {
        for (const Flow& f : flows) rate[static_cast<std::size_t>(f.op)] = 0;
        break;
      }
    }
    for (const Flow& f : sharing) set_rate(f.op, rate[static_cast<std::size_t>(f.op)]);
    for (int r : touched_) in_part_[static_cast<std::size_t>(r)] = 0;  // all clear for the next time
  }

  const Program& p_;
  bool record_;
  EngineResult r_;
  double now_ = 0;
  std::vector<int>&unmet_ = scratch().unmet, &op_queue_ = scratch().op_queue, &succ_start_ = scratch().succ_start, &succ_ = scratch().succ,
                  &refs_ = scratch().refs;
  std::vector<std::vector<int>>& order_ = scratch().queues;
  std::vector<QueueState>& qs_ = scratch().queue_states;
  std::vector<DeviceState>& dev_ = scratch().devices;
  std::vector<int>&active_ = scratch().active, &active_pos_ = scratch().active_pos, &finished_ = scratch().finished,
                  &unfrozen_ = scratch().unfrozen, &zero_ = scratch().zero, &zeros_ = scratch().zeros;
  std::vector<std::uint64_t>& dirty_ = scratch().dirty;  // a bit per queue: mark()
  bool any_dirty_ = false;
  std::vector<Flow>& flows_ = scratch().flows;
  std::vector<Flow>& sharing_ = scratch().sharing;
  std::vector<char>& in_part_ = scratch().in_part;  // per link: in the part of the network being shared
  std::vector<int>& touched_ = scratch().touched;   // those links
  std::vector<double>&remaining_ = scratch().remaining, &rate_ = scratch().rate, &updated_ = scratch().updated,
                     &start_ = scratch().start, &end_ = scratch().end, &cap_left_ = scratch().cap_left,
                     &weight_ = scratch().weight, &demand_ = scratch().demand, &fill_rate_ = scratch().fill_rate;
  std::vector<double>& active_end_ = scratch().active_end;  // beside active_: each one's predicted end
  std::vector<std::vector<int>>& copy_queues_ = scratch().device_copy_queues;
  std::vector<int>& lifts_ = scratch().lifts;  // per op: the device whose gated prefetch it lifts (-1: none)
  std::vector<int>& gate_after_ = scratch().gate_after;  // per op: the op after which its gate opens (-1: none)
  // Fast-forward: the checked runs, per op the run whose iteration it starts (-1: none; empty: no runs).
  Repeats& repeats_ = scratch().repeats;
  // Per buffer, for the repeat checks: the op that allocates it, and how many release it.
  std::vector<int>&alloc_op_ = scratch().alloc_op, &release_count_ = scratch().release_count;
  struct Retry {
    int failures = 0, at = 0;  // per run: comparisons failed, the iteration to compare at next
  };
  std::vector<Retry> retry_;
  std::vector<int>&anchor_of_ = scratch().anchor_of, &per_queue_ = scratch().per_queue, &pending_ = scratch().pending;
  std::vector<LogEntry>& log_ = scratch().log;   // the interval since the last iteration start
  std::vector<ReplayStep>& steps_ = scratch().steps;  // log_ as replay steps (prepare_replay)
  std::vector<GateCheck>& gates_ = scratch().gates;
  Snapshot &before_ = scratch().before, &now_snap_ = scratch().now;
  std::vector<char> shift_busy_, shift_idle_;  // per queue / device: its open span moves with the replay
  bool track_ = false;  // the first replayed interval: record its frees and each device's high point
  std::vector<char>& freed_ = scratch().freed;  // per release of the first interval, in order: it freed the buffer
  std::vector<Excursion>& excursion_ = scratch().excursion;  // per device: the first interval's high point
  // A serial queue falling behind the loop being fast-forwarded (-1: none), per link the queue that owns it
  // (computed on first need), whether the loop waits for that queue, and the recorded interval's completion
  // instants: those of loop ops (times), and how many had only the lagging queue's.
  int lagging_ = -1;
  std::vector<int> link_owner_;
  bool lag_blocked_ = false;
  std::vector<double> lag_instants_;
  int lag_only_instants_ = 0;
  struct ClassEnd {
    std::int64_t at;  // Repeat::offset of the op from its own iteration's start
    double time_s;
    int iteration;
  };
  std::vector<ClassEnd> class_ends_;  // the recorded interval's completions, by place in their iteration
  int pending_anchor_ = -1;  // an iteration's first op started in this pass
  bool logging_ = false;
  bool forced_ = false;      // a gated op was forced in the interval
  std::vector<int>& over_links_ = scratch().over_links;  // the links whose demand exceeds their capacity
  bool rates_stale_ = true;          // a transfer or copy started or ended since the rates were computed
  bool interference_stale_ = false;  // host copies started or all ended: memory-bound kernels change speed
  bool was_contended_ = false;       // the last rates came from sharing an oversubscribed link
  std::size_t done_ = 0;
};

}  // namespace

EngineResult run_program(const Program& program, bool record_timeline, bool fast_forward) {
  return Engine(program, record_timeline, fast_forward).run();
}

}  // namespace hbmsim::sim
