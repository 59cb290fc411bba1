// The engine's internals (sim/engine.hpp is its interface): the per-thread working arrays and the Engine
// class, shared by the event loop (engine.cpp) and the fast-forward through repeating loop iterations
// (fast_forward.cpp).
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/engine.hpp"
#include "sim/lagging_queue.hpp"
#include "sim/repeats.hpp"

namespace hbmsim::sim::detail {

// Per-thread working arrays, kept between runs: a sweep simulates thousands of steps per thread, and
// fresh arrays each time cost more in page faults than the simulation itself.
// Per queue: its ops in program order, the next to start, how many run, since when it is busy.
struct QueueState {
  const int* ops;
  std::size_t size, pos;
  int running;
  double busy_since;
  int device;
  bool concurrent, host_copy, compute, allocates_when_ready, takes_sms;
};

// Per device: live memory, host copies running (they slow its memory-bound kernels), and since when its
// compute stream has been idle (-1: busy).
struct DeviceState {
  double hbm_live = 0, host_live = 0;
  std::array<double, kMemCategories> by_cat{};
  int copies_running = 0;
  int sm_takers_running = 0;  // ops of takes_sms queues running (they slow its compute kernels)
  std::array<double, kComputePhases> compute_phase_s{};  // its compute stream's busy time so far, by phase
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
  double margin_bytes;  // limit - (live + pending gradients + gate): it opened when >= 0
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
  std::vector<int> copies, sm_takers;
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

// A running op moved on by a fast-forward (move_on): its place in the running set, its counterpart, its state.
struct ActiveMove {
  std::size_t pos, to;
  double remaining, rate, updated;
};

struct Scratch {
  std::vector<Flow> flows, sharing;
  std::vector<int> unmet, op_queue, succ_start, succ, refs, fill, active, active_pos, finished, unfrozen, zero, zeros, lifts, gate_after, issued;
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
  std::vector<ActiveMove> moves;
  Snapshot before, now;
};
Scratch& scratch();  // this thread's (engine.cpp)

// One run of a program (run_program): the event loop, link sharing and memory in engine.cpp, the
// fast-forward in fast_forward.cpp, the small steps both take here.
class Engine {
 public:
  Engine(const Program& p, bool timeline, bool fast_forward, double stop_above_hbm_bytes);

  EngineResult run();

 private:
  bool force_gated();

  // ---- Fast-forward (sim/fast_forward.cpp) ----
  // After each pass of starts: when an iteration's first op started in it (pending_anchor_), compare the
  // state with the previous iteration's and fast-forward where it repeats.
  void at_anchor() {
    if (pending_anchor_ >= 0) on_anchor();
  }
  void on_anchor();
  static bool close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max({1.0, std::abs(a), std::abs(b)}); }
  // A queue's head in two snapshots is the same op of the run (or the same op outside it), as busy.
  static bool same_head(const Snapshot::Head& x, const Snapshot::Head& y) {
    return x.in_run == y.in_run && (x.in_run ? x.at == y.at : x.op == y.op) && x.running == y.running;
  }
  // An op running in two snapshots is the same op of the run, as far from its end, at the same rate.
  static bool same_active(const Snapshot::Active& x, const Snapshot::Active& y) {
    return x.at == y.at && close(x.remaining, y.remaining) && close(x.rate, y.rate) && close(x.end_in_s, y.end_in_s);
  }
  bool capture(Snapshot& s, const Repeat& run, int ri, int it);
  static bool same_since(double a, double ta, double b, double tb, bool& shifts);
  bool same_state(const Repeat& run);
  bool repeats_without(const Repeat& run, int skip);
  int lagging_candidate();
  int fast_forward(int ri);
  // ---- A queue falling behind the loop (sim/lagging_queue.hpp). ----
  LaggingWalk walk_queue(const Repeat& run, int k, double period);
  void apply_walk(const LaggingWalk& w, double until, int done, double period);
  bool loop_instant(double t, double tol, int done, double period, double& at) const;
  // ---- Intervals after the first, in closed form. ----
  // What the run has done so far: totals the first replayed interval moves by a fixed amount.
  struct Totals {
    std::size_t done = 0;
    double flops = 0;
    std::vector<double> bytes_sent;  // per queue
    std::vector<DeviceState> devices;
  };
  Totals totals() const { return Totals{done_, r_.executed_flops, r_.bytes_sent, dev_}; }
  int jump(const Repeat& run, int k, double period, const Totals& before);
  void add_jumped(int done, double period, const Totals& before);
  bool jump_interval(const RunBounds& in, int m, double period);
  void prepare_replay(const Repeat& run);
  bool replayable(const Repeat& run, int m);
  void replay(int m, double period);
  void move_on(const Repeat& run, int m, double period);

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
    // A bookkeeping slip must end as an internal error, not as a write before the array (a fast-forward that
    // lost a running op once corrupted the heap this way).
    if (active_pos_[k] < 0) throw std::logic_error("op " + std::to_string(i) + " leaves the running set it is not in");
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

  std::string describe_deadlock() const;
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

  // ---- Memory and completions (both halves) ----
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
        if (d.hbm_live > stop_hbm_) r_.stopped_over_hbm = true;
      }
    }
    if (track_) {
      Excursion& x = excursion_[static_cast<std::size_t>(buf.device)];
      x.host_bytes = std::max(x.host_bytes, d.host_live);
      if (d.hbm_live > x.hbm_bytes) x = Excursion{d.hbm_live, x.host_bytes, now_, d.by_cat};
    }
    sample(buf.device, b);
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
    sample(buf.device, b, true);
  }

  // With a recorded timeline, a sample of a device's memory at each change.
  void sample(int device, int buffer = -1, bool freed = false) {
    if (!record_) return;
    const auto& d = dev_[static_cast<std::size_t>(device)];
    r_.timeline.push_back(MemorySample{now_, device, d.hbm_live, d.host_live, d.by_cat, buffer, freed});
  }
  void sample_all() {
    for (int d = 0; d < p_.devices(); ++d) sample(d);
  }

  // ---- The event loop (engine.cpp) ----
  bool can_start(int i);
  void start(int i);
  void transfer_changed(int i, double sign);
  int blame_queue(int i) const;
  [[gnu::always_inline]] void complete(int i);

  // What a completion changes besides the running set (also for a replayed one): its end, the totals, its
  // frees, and (Marks) the queues it may let start.
  template <bool Marks = true>
  [[gnu::always_inline]] void retire(int i) {
    auto k = static_cast<std::size_t>(i);
    const auto& op = p_.ops[k];
    const auto q = static_cast<std::size_t>(op.queue);
    end_[k] = now_;
    ++done_;
    if (qs_[q].compute)  // one op at a time: its spans add up to the stream's busy time
      dev_[static_cast<std::size_t>(qs_[q].device)].compute_phase_s[static_cast<std::size_t>(compute_phase(op.phase))] += now_ - start_[k];
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
      if (--unmet_[static_cast<std::size_t>(succ)] != 0) continue;
      const int sq = op_queue_[static_cast<std::size_t>(succ)];
      if (qs_[static_cast<std::size_t>(sq)].allocates_when_ready && !p_.ops[static_cast<std::size_t>(succ)].allocs.empty())
        issued_.push_back(succ);
      if constexpr (Marks) mark(sq);
    }
  }
  // Whether an op's buffers come alive when it starts (else when it became ready: Queue::allocates_when_ready).
  bool allocates_at_start(const ProgramOp& op) const {
    return !qs_[op.queue].allocates_when_ready || op.deps.empty();
  }
  // The buffers of the ops made ready by the completions of this instant, taken after all of those
  // completions' frees (as an op's start takes its own), in the order they became ready.
  void take_issued() {
    for (int i : issued_)
      for (int b : p_.ops[static_cast<std::size_t>(i)].allocs) alloc(b);
    issued_.clear();
  }

  [[gnu::always_inline]] void start_ready();

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

  // Memory-bound kernels lose HBM bandwidth to host copies; the compute stream's other kernels lose the SMs a
  // communication kernel holds (memory-bound ones still fill HBM's bandwidth from the SMs left).
  double solo_rate(const ProgramOp& op) const {
    const auto& q = qs_[static_cast<std::size_t>(op.queue)];
    const auto& d = dev_[static_cast<std::size_t>(q.device)];
    if (op.memory_bound) return d.copies_running > 0 ? 1.0 - p_.copy_interference : 1.0;
    return q.compute && d.sm_takers_running > 0 ? 1.0 - p_.comm_sm_share : 1.0;
  }

  void update_rates();

  const Program& p_;
  bool record_;
  double stop_hbm_;  // live HBM above it ends the run (infinity: never)
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
  std::vector<int>& issued_ = scratch().issued;  // ops made ready whose buffers are not yet taken (take_issued)
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
  std::vector<ActiveMove>& moves_ = scratch().moves;
  Snapshot &before_ = scratch().before, &now_snap_ = scratch().now;
  std::vector<char> shift_busy_, shift_idle_;  // per queue / device: its open span moves with the replay
  bool track_ = false;  // the first replayed interval: record its frees and each device's high point
  std::vector<char>& freed_ = scratch().freed;  // per release of the first interval, in order: it freed the buffer
  std::vector<Excursion>& excursion_ = scratch().excursion;  // per device: the first interval's high point
  // A serial queue falling behind the loop being fast-forwarded (-1: none), per link the queue that owns it
  // (computed on first need), whether the loop waits for that queue, and the recorded interval's completion
  // instants: those of loop ops (times), and how many had only the lagging queue's.
  int lagging_ = -1;
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

}  // namespace hbmsim::sim::detail
