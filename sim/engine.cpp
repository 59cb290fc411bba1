// The event loop: starts, completions, link sharing and memory (the fast-forward is fast_forward.cpp).
#include "sim/engine_impl.hpp"
#include "sim/issue_order.hpp"

namespace hbmsim::sim {

namespace detail {

// Every member defined here is used only here: inline, so that a position-independent build may still inline
// them into the event loop (as it did when they were defined in the class).

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

inline Engine::Engine(const Program& p, bool timeline, bool fast_forward, double stop_above_hbm_bytes)
    : p_(p), record_(timeline), stop_hbm_(stop_above_hbm_bytes > 0 ? stop_above_hbm_bytes : std::numeric_limits<double>::infinity()) {
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
    if (p.issue_order.empty()) order_[static_cast<std::size_t>(op.queue)].push_back(static_cast<int>(i));
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
  if (!p.issue_order.empty()) {
    check_issue_order(p, succ_start_, succ_);  // a permutation that can run to the end, or a logic_error
    for (int i : p.issue_order) order_[static_cast<std::size_t>(op_queue_[static_cast<std::size_t>(i)])].push_back(i);
  }
  qs_.resize(nq);
  for (std::size_t q = 0; q < nq; ++q)
    qs_[q] = QueueState{order_[q].data(), order_[q].size(), 0, 0, 0.0, p.queues[q].device,
                        p.queues[q].kind == QueueKind::concurrent, p.queues[q].host_copy, p.queues[q].compute,
                        p.queues[q].allocates_when_ready, p.queues[q].takes_sms};
  dev_.assign(static_cast<std::size_t>(p.devices()), DeviceState{});
  for (std::size_t q = 0; q < nq; ++q)
    if (p.queues[q].receives) dev_[static_cast<std::size_t>(p.queues[q].device)].receive_queue = static_cast<int>(q);
  r_.memory.assign(static_cast<std::size_t>(p.devices()), DeviceMemory{});
  r_.exposed_s.assign(nq, 0);
  r_.busy_s.assign(nq, 0);
  r_.bytes_sent.assign(nq, 0);
  r_.last_end_s.assign(nq, 0);
  active_.clear();
  issued_.clear();
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

inline EngineResult Engine::run() {
  for (int b : p_.resident) alloc(b);
  sample_all();
  const std::size_t n = p_.ops.size();
  for (std::size_t q = 0; q < qs_.size(); ++q) mark(static_cast<int>(q));
  start_ready();
  at_anchor();
  auto& finished = finished_;
  while (done_ < n && !r_.stopped_over_hbm) {
    if (rates_stale_) update_rates();
    // The next completion: the earliest predicted end among the running ops (a dense array, so a scan).
    double next = std::numeric_limits<double>::infinity();
    for (double e : active_end_) next = std::min(next, e);
    if (!(next < std::numeric_limits<double>::infinity())) {
      if (!active_.empty()) throw std::logic_error("simulation stalled: no active op progresses");
      if (!force_gated()) throw std::logic_error(describe_deadlock());
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
  r_.compute_phase_s.clear();
  for (const auto& d : dev_) r_.compute_phase_s.push_back(d.compute_phase_s);
  if (record_) {
    r_.start_s = start_;
    r_.end_s = end_;
  }
  return std::move(r_);
}

// When nothing runs, an op held back by the memory limit would wait forever: XLA would issue it anyway
// (and the step then needs that memory), so start the first one that is otherwise ready.
inline bool Engine::force_gated() {
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

// Nothing runs and nothing can start: each waiting queue head (the first four) and the first dependency it
// lacks, which names the cycle the builder made.
inline std::string Engine::describe_deadlock() const {
  auto name = [&](int i) {
    const auto& op = p_.ops[static_cast<std::size_t>(i)];
    const auto& q = p_.queues[op.queue];
    std::string s = "op " + std::to_string(i) + " (" + (p_.devices() > 1 ? "device " + std::to_string(q.device) + " " : "") + q.name +
                    ", phase " + op.phase;
    if (op.layer >= 0) s += ", layer " + std::to_string(op.layer);
    return s + ")";
  };
  std::string out = "simulation deadlock at t = " + std::to_string(now_) + " s, " + std::to_string(done_) + " of " +
                    std::to_string(p_.ops.size()) + " ops done:";
  int listed = 0;
  for (const auto& q : qs_) {
    if (q.pos >= q.size || listed == 4) continue;
    const int head = q.ops[q.pos];
    const auto k = static_cast<std::size_t>(head);
    out += (listed++ ? "; " : " ") + name(head);
    const auto& deps = p_.ops[k].deps;
    const auto lacking = std::find_if(deps.begin(), deps.end(), [&](int d) { return end_[static_cast<std::size_t>(d)] < 0; });
    if (lacking != deps.end()) out += " waits for " + name(*lacking);
    else if (unmet_[k] != 0) out += " counts " + std::to_string(unmet_[k]) + " unmet dependencies with all of them done (an engine bug)";
    else out += " is held back by the memory limit";
  }
  return out;
}

inline bool Engine::can_start(int i) {
  const auto& op = p_.ops[static_cast<std::size_t>(i)];
  if (unmet_[static_cast<std::size_t>(i)] != 0) return false;
  if (op.gate_bytes <= 0) return true;
  if (const int after = gate_after_[static_cast<std::size_t>(i)]; after >= 0 && end_[static_cast<std::size_t>(after)] >= 0)
    return true;
  const auto device = static_cast<std::size_t>(qs_[static_cast<std::size_t>(op.queue)].device);
  const auto& dv = dev_[device];
  const double pending = std::max(0.0, p_.scatter_reserve_bytes[device] - dv.by_cat[static_cast<std::size_t>(MemCategory::collective_buffers)]);
  const double margin = p_.hbm_limit_bytes[device] - (dv.hbm_live + pending + op.gate_bytes);
  if (logging_) gates_.push_back(GateCheck{static_cast<int>(device), margin});
  return margin >= 0;
}

inline void Engine::start(int i) {
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
  if (allocates_at_start(op))
    for (int b : op.allocs) alloc(b);
  if (q.running++ == 0) q.busy_since = now_;
  if (q.host_copy && dv.copies_running++ == 0) interference_stale_ = rates_stale_ = true;
  if (q.takes_sms && dv.sm_takers_running++ == 0) interference_stale_ = rates_stale_ = true;
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
inline void Engine::transfer_changed(int i, double sign) {
  bool over = false;
  for (const auto& u : uses_of(i)) over = add_demand(u.resource, sign * u.bytes_per_s) || over;
  if (over || over_links_.empty()) rates_stale_ = true;
}


// The dependency that finished last is what the compute stream was waiting for; a wait on another device
// (a pipeline receive) is charged to this device's receiving queue.
inline int Engine::blame_queue(int i) const {
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

inline void Engine::complete(int i) {
  auto k = static_cast<std::size_t>(i);
  const auto& op = p_.ops[k];
  const auto q = static_cast<std::size_t>(op.queue);
  if (logging_) log_.push_back(LogEntry{i, now_, false});
  auto& qs = qs_[q];
  if (--qs.running == 0) r_.busy_s[q] += now_ - qs.busy_since;  // busy time is the union of the queue's spans
  auto& dv = dev_[static_cast<std::size_t>(qs.device)];
  if (qs.host_copy && --dv.copies_running == 0) interference_stale_ = rates_stale_ = true;
  if (qs.takes_sms && --dv.sm_takers_running == 0) interference_stale_ = rates_stale_ = true;
  if (op.use_count > 0) transfer_changed(i, -1.0);
  if (qs.compute) dv.compute_idle_since = now_;
  retire(i);
}

// Starts what can start on the queues whose heads may have changed, in queue order (as a scan of every
// queue would: a queue nothing happened to cannot start anything). Starting an op never makes another
// ready (only completions and frees do), so one pass suffices, unless a zero-length op completes on the
// spot and releases its successors.
inline void Engine::start_ready() {
  while (any_dirty_) {
    take_issued();
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

// Rates: ops that use no link run at full speed (memory-bound kernels slower while a host copy runs).
// Transfers run at full speed while no link is oversubscribed (the demand on each is kept as they start and
// end); otherwise they share the links max-min fairly by progressive filling, one priority class after
// another: a class takes what it can of every link before the next class sees what is left.
inline void Engine::update_rates() {
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
}  // namespace detail

EngineResult run_program(const Program& program, bool record_timeline, bool fast_forward, double stop_above_hbm_bytes) {
  // The repeat checks compare queue positions in program order: a program issued in another order runs
  // event by event.
  return detail::Engine(program, record_timeline, fast_forward && program.issue_order.empty(), stop_above_hbm_bytes).run();
}

}  // namespace hbmsim::sim
