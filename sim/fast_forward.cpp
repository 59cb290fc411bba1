// Fast-forward through repeating loop iterations (run_program, sim/engine.hpp): compare the state at an
// iteration's start with the previous one's, replay the recorded interval once, jump the following ones in
// closed form, and work out a queue that falls behind the loop on its own (sim/lagging_queue.hpp).
#include "sim/engine_impl.hpp"

namespace hbmsim::sim::detail {

// on_anchor() is the way in (Engine::at_anchor); the rest is used only here, so inline (engine.cpp says why).

// After each pass of starts: if an iteration's first op started in it, compare the state with the one at
// the previous iteration's start; when they match, replay the recorded events iteration after iteration.
void Engine::on_anchor() {
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

// The state now, ops of the run counted from iteration `it`'s first op. False if an op outside the run is
// active (then the state cannot repeat).
inline bool Engine::capture(Snapshot& s, const Repeat& run, int ri, int it) {
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
  s.sm_takers.resize(nd);
  for (std::size_t d = 0; d < nd; ++d) {
    s.idle_since_s[d] = dev_[d].compute_idle_since;
    s.hbm_bytes[d] = dev_[d].hbm_live;
    s.copies[d] = dev_[d].copies_running;
    s.sm_takers[d] = dev_[d].sm_takers_running;
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
inline bool Engine::same_since(double a, double ta, double b, double tb, bool& shifts) {
  shifts = !close(a, b);
  return !shifts || close(a - ta, b - tb);
}

// The state now is the previous iteration's moved on by one iteration, and the recorded interval holds
// only the run's ops. Failing that, it is so for everything but one serial queue that falls further
// behind at every iteration (lagging_): the fast-forward then works that queue out on its own.
inline bool Engine::same_state(const Repeat& run) {
  lagging_ = -1;
  if (repeats_without(run, -1)) return true;
  const int q = lagging_candidate();
  if (q < 0 || !repeats_without(run, q)) return false;
  lagging_ = q;
  return true;
}

// The state repeats, leaving out queue `skip`'s ops, head and links (-1: leaving out nothing).
inline bool Engine::repeats_without(const Repeat& run, int skip) {
  const Snapshot &a = before_, &b = now_snap_;
  if (a.over != b.over || a.contended != b.contended || a.stale != b.stale || a.interference_stale != b.interference_stale ||
      a.copies != b.copies || a.sm_takers != b.sm_takers)
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
    if (!same_active(a.active[i], b.active[j])) return false;
  }
  shift_busy_.assign(a.heads.size(), 0);
  for (std::size_t q = 0; q < a.heads.size(); ++q) {
    if (static_cast<int>(q) == skip) continue;
    const auto &x = a.heads[q], &y = b.heads[q];
    if (!same_head(x, y)) return false;
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
    if (!(skip >= 0 && p_.resources[r].sole_queue == skip) && !close(a.demand[r], b.demand[r])) return false;
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
inline int Engine::lagging_candidate() {
  const Snapshot &a = before_, &b = now_snap_;
  auto running = [&](const Snapshot& s, std::size_t q) -> const Snapshot::Active* {
    for (const auto& x : s.active)
      if (static_cast<std::size_t>(p_.ops[static_cast<std::size_t>(x.op)].queue) == q) return &x;  // a serial queue runs one op at most
    return nullptr;
  };
  for (std::size_t q = 0; q < qs_.size(); ++q) {
    if (qs_[q].concurrent || qs_[q].compute || qs_[q].host_copy || qs_[q].takes_sms) continue;  // they slow the loop
    const auto *ra = running(a, q), *rb = running(b, q);
    const bool same_running = ra == nullptr ? rb == nullptr : rb != nullptr && same_active(*ra, *rb);
    if (!same_head(a.heads[q], b.heads[q]) || !same_running) return static_cast<int>(q);
  }
  return -1;
}

// How many iterations may be replayed, then replays them; returns that number (0: none).
inline int Engine::fast_forward(int ri) {
  const Repeat& run = repeats_.runs()[static_cast<std::size_t>(ri)];
  const Snapshot &a = before_, &b = now_snap_;
  const double period = b.time_s - a.time_s;
  if (!(period > 0) || log_.empty()) return 0;
  // The iterations the interval and the states refer to, [lowest, top]: each must be the one before
  // shifted, as must those the replays move them to, with an iteration to spare.
  int lowest = b.iteration, top = b.iteration;
  auto see = [&](int op) {
    if (lagging_ >= 0 && p_.ops[static_cast<std::size_t>(op)].queue == lagging_) return;  // walked, not replayed
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

// The lagging queue's ops through the next k intervals. An op of the run that has not ended yet ends
// where its counterpart in the recorded interval did, a period later per iteration between them.
inline LaggingWalk Engine::walk_queue(const Repeat& run, int k, double period) {
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
  if (running >= 0 && (rate_[static_cast<std::size_t>(running)] != 1.0 || !runs_alone(p_, lifts_, running))) {
    LaggingWalk none;
    none.vouched_until_s = from;
    return none;
  }
  const WalkContext c{p_, lifts_, succ_start_, succ_, end_of, [&](int op) { return in(op); },
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
inline void Engine::apply_walk(const LaggingWalk& w, double until, int done, double period) {
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
    if (--qs.running == 0) r_.busy_s[q] += o.end_s - qs.busy_since;
    now_ = o.end_s;
    retire<false>(o.op);  // it releases nothing (runs_alone): its end, the totals, its successors' counts
    take_issued();
    // A completion is an event of its own unless ops of the loop complete at that instant too (a zero-length
    // op completes at the instant that started it).
    double at = 0;
    if (op.seconds > 0 && !loop_instant(o.end_s, 0, done, period, at)) ++r_.events;
  }
  now_ = until;
}

// The earliest instant of the loop (its ops' completions, not the lagging queue's) in the `done` intervals
// replayed that lies in [t - tol, t], or equals t within 1e-12 relative: the engine completes an op due at
// t there. False if there is none.
inline bool Engine::loop_instant(double t, double tol, int done, double period, double& at) const {
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

// Intervals 2..k (they repeat the first, which replay() just did): each op's start and end, its
// releases' reference counts and its successors' dependency counts moved on per interval, and the
// totals, live memory and peaks by the first interval's change times the intervals. Returns the
// intervals done in all (an interval whose frees differ from the first's, or that would release an op
// outside the run, is not done).
inline int Engine::jump(const Repeat& run, int k, double period, const Totals& before) {
  int done = 1;
  const RunBounds in{run};
  while (done < k && jump_interval(in, done + 1, period)) ++done;
  if (done > 1) add_jumped(done, period, before);
  return done;
}

// Intervals 2..done, jumped: what the first one changed, `done - 1` times more.
inline void Engine::add_jumped(int done, double period, const Totals& before) {
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
      if (mem.hbm_peak_bytes > stop_hbm_) r_.stopped_over_hbm = true;
      for (std::size_t c = 0; c < mem.hbm_at_peak.size(); ++c) mem.hbm_at_peak[c] = x.by_cat[c] + n * (dv.by_cat[c] - was.by_cat[c]);
    }
    if (host > 0) mem.host_peak_bytes = std::max(mem.host_peak_bytes, x.host_bytes + n * host);
    for (std::size_t c = 0; c < dv.compute_phase_s.size(); ++c) dv.compute_phase_s[c] += n * (dv.compute_phase_s[c] - was.compute_phase_s[c]);
    for (std::size_t c = 0; c < dv.by_cat.size(); ++c) dv.by_cat[c] += n * (dv.by_cat[c] - was.by_cat[c]);
    dv.hbm_live += n * hbm;
    dv.host_live += n * host;
  }
}

// Interval m's per-op changes; undone (false) where it is not replayable (an op outside the run it waits
// on has not ended, or one it would release) or where one of its releases frees, or does not free, where
// the first interval's did not, or did (a buffer released from outside the run at other times).
inline bool Engine::jump_interval(const RunBounds& in, int m, double period) {
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
inline void Engine::prepare_replay(const Repeat& run) {
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
inline bool Engine::replayable(const Repeat& run, int m) {
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
inline void Engine::replay(int m, double period) {
  if (track_) {
    freed_.clear();
    excursion_.resize(dev_.size());
    for (std::size_t d = 0; d < dev_.size(); ++d)
      excursion_[d] = Excursion{dev_[d].hbm_live, dev_[d].host_live, now_, dev_[d].by_cat};
  }
  for (const ReplayStep& e : steps_) {
    const int i = e.op + m * e.stride;
    const auto k = static_cast<std::size_t>(i);
    const double t = e.time_s + m * period;
    if (e.start || t != now_) take_issued();  // as the event loop takes them: before an instant's starts
    now_ = t;
    if (e.start) {
      start_[k] = now_;
      if (allocates_at_start(p_.ops[k]))
        for (int b : p_.ops[k].allocs) alloc(b);
    } else {
      if (track_)
        for (int b : p_.ops[k].releases) freed_.push_back(refs_[static_cast<std::size_t>(b)] == 1);
      retire<false>(i);
    }
  }
  take_issued();
}

// After `m` replayed intervals: the running ops, queues and spans are the current ones moved on by m
// iterations; the per-queue times grew by m intervals' worth.
inline void Engine::move_on(const Repeat& run, int m, double period) {
  const Snapshot &a = before_, &b = now_snap_;
  const double dt = m * period;
  now_ = b.time_s + dt;
  // An op that runs longer than an iteration (a copy on a slow link) is running beside its counterpart one
  // iteration on, which is itself moved on: read every running op's state before writing any.
  auto& moves = moves_;
  moves.clear();
  for (std::size_t pos = 0; pos < active_.size(); ++pos) {
    const auto from = static_cast<std::size_t>(active_[pos]);
    if (lagging_ >= 0 && p_.ops[from].queue == lagging_) continue;  // apply_walk()
    moves.push_back({pos, static_cast<std::size_t>(run.moved(active_[pos], m)), remaining_[from], rate_[from], updated_[from] + dt});
    active_pos_[from] = -1;
  }
  for (const ActiveMove& x : moves) {
    active_[x.pos] = static_cast<int>(x.to);
    active_pos_[x.to] = static_cast<int>(x.pos);
    remaining_[x.to] = x.remaining;
    rate_[x.to] = x.rate;
    updated_[x.to] = x.updated;
    active_end_[x.pos] += dt;
  }
  // Each queue moves on by its ops in one iteration: the current one's, which fast_forward() checked
  // repeats. (Not the run's first: a run only groups iterations of one op count, and layers with another
  // policy, Megatron's recomputed ones among offloaded ones, may have as many ops on other queues.)
  auto& per_queue = per_queue_;
  per_queue.assign(qs_.size(), 0);
  for (const Segment* seg : {&run.main, &run.side})
    for (int i = seg->first + b.iteration * seg->stride; i < seg->first + (b.iteration + 1) * seg->stride; ++i)
      ++per_queue[static_cast<std::size_t>(p_.ops[static_cast<std::size_t>(i)].queue)];
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

}  // namespace hbmsim::sim::detail
