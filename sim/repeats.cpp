#include "sim/repeats.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace hbmsim::sim {

namespace {

constexpr int kMany = Repeats::kManyAllocs;
constexpr int kMinIterations = 3;  // two to see the state repeat, at least one to skip
constexpr int kUnset = std::numeric_limits<int>::min();

// One candidate run: whether iteration i + 1 is iteration i shifted, op by op, in both segments.
class RunCheck {
 public:
  RunCheck(const Program& p, const std::vector<int>& releases, const std::vector<int>& gate_after,
           const std::vector<int>& alloc_op, const Repeat& run, std::vector<int>& priority_step)
      : p_(p), releases_(releases), gate_after_(gate_after), alloc_op_(alloc_op), run_(run), priority_step_(priority_step) {}

  bool next_repeats(int i) const {
    for (const Segment* s : {&run_.main, &run_.side}) {
      const int base = s->first + i * s->stride;
      for (int r = 0; r < s->stride; ++r)
        if (!same_op(base + r, base + r + s->stride)) return false;
    }
    return true;
  }

  // Iterations [from, to], each against the one before, knowing that from - 1 repeats from - 2 and that
  // from - 2 .. to are builder copies (Repeats::copied): every reference moves on by the step it took from
  // from - 2 to from - 1. A reference that was outside the run must stay outside: where each one's
  // progression would enter the run is worked out once. Buffers are compared iteration by iteration (how
  // often a buffer is released, and by which op it is made, are facts of the whole program), their fields
  // only where one was not created with its iteration. Side ops get the full comparison. Returns the first
  // iteration that does not repeat (to + 1: none).
  int copied_break(int from, int to, const std::vector<Program::Iteration>& its) const {
    const int S = run_.main.stride, t = from - 1;
    const int base = run_.main.first + t * S;
    int limit = to + 1;
    auto enters = [&](int b, int step) {  // the first m >= 1 at which b + m * step is in the run (0: never)
      if (step == 0) return 0;
      int best = 0;
      for (auto [lo, hi] : {std::pair{run_.main.first, run_.main.end(run_.count)},
                            std::pair{run_.side.first, run_.side.end(run_.count)}}) {
        if (hi <= lo) continue;
        int m = 0;
        if (step > 0 && b < lo) m = (lo - b + step - 1) / step;
        if (step < 0 && b >= hi) m = (b - (hi - 1) + (-step) - 1) / (-step);
        if (m > 0 && b + m * step >= lo && b + m * step < hi && (best == 0 || m < best)) best = m;
      }
      return best;
    };
    slots_.clear();
    for (int r = 0; r < S; ++r) {
      const int x = base + r;
      const ProgramOp &a = p_.ops[static_cast<std::size_t>(x - S)], &b = p_.ops[static_cast<std::size_t>(x)];
      for (std::size_t d = 0; d < b.deps.size(); ++d)
        if (!run_.contains(b.deps[d]))
          if (const int m = enters(b.deps[d], b.deps[d] - a.deps[d]); m > 0) limit = std::min(limit, t + m);
      const int ga = gate_after_[static_cast<std::size_t>(x - S)], gb = gate_after_[static_cast<std::size_t>(x)];
      if (gb >= 0 && !run_.contains(gb))
        if (const int m = enters(gb, gb - ga); m > 0) limit = std::min(limit, t + m);
      for (std::size_t k = 0; k < b.allocs.size(); ++k) slots_.push_back({b.allocs[k], b.allocs[k] - a.allocs[k], x, true, false});
      for (std::size_t k = 0; k < b.releases.size(); ++k)
        slots_.push_back({b.releases[k], b.releases[k] - a.releases[k], x, false, false});
    }
    // A buffer created with its iteration, at the same place in it as its model, has its model's fields.
    const int first_it = run_.first_iteration, G = run_.group;
    const int made_first = its[static_cast<std::size_t>(first_it + t * G)].buffers_first;
    const int made_end = its[static_cast<std::size_t>(first_it + t * G + G - 1)].buffers_end;
    const int made_step = made_first - its[static_cast<std::size_t>(first_it + (t - 1) * G)].buffers_first;
    for (Slot& sl : slots_) sl.made = sl.step == made_step && sl.buffer >= made_first && sl.buffer < made_end;
    for (int j = from; j < limit; ++j) {
      for (Slot& sl : slots_) {
        const int bw = sl.buffer, bn = sl.buffer + sl.step, xw = sl.op, xn = sl.op + S;
        sl.buffer = bn;  // on to the next iteration
        sl.op = xn;
        if (!(sl.made ? releases_[static_cast<std::size_t>(bw)] == releases_[static_cast<std::size_t>(bn)] : same_buffer(bw, bn)))
          return j;
        if (sl.alloc ? alloc_op_[static_cast<std::size_t>(bw)] != xw || alloc_op_[static_cast<std::size_t>(bn)] != xn
                     : !same_maker(bw, bn))
          return j;
      }
      const Segment& side = run_.side;
      for (int r = 0; r < side.stride; ++r)
        if (!same_op(side.first + (j - 1) * side.stride + r, side.first + j * side.stride + r)) return j;
    }
    return limit;
  }

 private:
  // An op reference of x and the matching one of x's counterpart an iteration on.
  bool same_ref(int a, int b) const { return run_.contains(a) ? b == run_.moved(a, 1) : !run_.contains(b); }
  bool same_buffer(int a, int b) const {
    const Buffer &x = p_.buffers[static_cast<std::size_t>(a)], &y = p_.buffers[static_cast<std::size_t>(b)];
    return x.bytes == y.bytes && x.category == y.category && x.host == y.host && x.device == y.device &&
           releases_[static_cast<std::size_t>(a)] == releases_[static_cast<std::size_t>(b)];
  }
  // Two buffers made by matching ops (or both outside the run).
  bool same_maker(int a, int b) const {
    const int ma = alloc_op_[static_cast<std::size_t>(a)], mb = alloc_op_[static_cast<std::size_t>(b)];
    if (ma == kMany || mb == kMany) return false;
    return ma >= 0 && run_.contains(ma) ? mb == run_.moved(ma, 1) : mb < 0 || !run_.contains(mb);
  }
  // A buffer reference: the same kind of buffer, made by the matching op.
  bool same_buffer_ref(int a, int b) const { return same_buffer(a, b) && same_maker(a, b); }

  bool same_op(int x, int y) const {
    const ProgramOp &a = p_.ops[static_cast<std::size_t>(x)], &b = p_.ops[static_cast<std::size_t>(y)];
    if (a.queue != b.queue || a.seconds != b.seconds || a.executed_flops != b.executed_flops ||
        a.bytes_sent != b.bytes_sent || a.gate_bytes != b.gate_bytes || a.memory_bound != b.memory_bound ||
        a.use_count != b.use_count || a.deps.size() != b.deps.size() || a.allocs.size() != b.allocs.size() ||
        a.releases.size() != b.releases.size())
      return false;
    for (std::uint32_t u = 0; u < a.use_count; ++u) {
      const Use &ua = p_.uses[a.use_begin + u], &ub = p_.uses[b.use_begin + u];
      if (ua.resource != ub.resource || ua.bytes_per_s != ub.bytes_per_s) return false;
      // Priorities may move with the layer (copies: the layer needed soonest first), by the same step for
      // every transfer on a link, so that the order among them holds.
      int& step = priority_step_[static_cast<std::size_t>(ua.resource)];
      if (step == kUnset) step = b.priority - a.priority;
      if (step != b.priority - a.priority) return false;
    }
    for (std::size_t d = 0; d < a.deps.size(); ++d)
      if (!same_ref(a.deps[d], b.deps[d])) return false;
    const int ga = gate_after_[static_cast<std::size_t>(x)], gb = gate_after_[static_cast<std::size_t>(y)];
    if ((ga < 0) != (gb < 0) || (ga >= 0 && !same_ref(ga, gb))) return false;
    for (std::size_t k = 0; k < a.allocs.size(); ++k)
      if (!same_buffer(a.allocs[k], b.allocs[k]) || alloc_op_[static_cast<std::size_t>(a.allocs[k])] != x ||
          alloc_op_[static_cast<std::size_t>(b.allocs[k])] != y)
        return false;
    for (std::size_t k = 0; k < a.releases.size(); ++k)
      if (!same_buffer_ref(a.releases[k], b.releases[k])) return false;
    return true;
  }

  struct Slot {
    int buffer, step, op;  // in iteration from - 1 (then the one being compared), how far it moves per iteration
    bool alloc;            // else a release
    bool made = false;     // created with its iteration, at its model's place
  };
  mutable std::vector<Slot> slots_;

  const Program& p_;
  const std::vector<int>&releases_, &gate_after_, &alloc_op_;
  const Repeat& run_;
  std::vector<int>& priority_step_;  // per link: the priority change per iteration (kUnset: none seen)
};

}  // namespace

void Repeats::find(const Program& p, const std::vector<int>& gate_after, const std::vector<int>& alloc_op,
                   const std::vector<int>& releases) {
  p_ = &p;
  gate_after_ = &gate_after;
  alloc_op_ = &alloc_op;
  releases_ = &releases;
  runs_.clear();
  known_.clear();
  priority_step_.clear();
  const auto& its = p.iterations;
  // Stretches shorter than a pattern (below kMaxPeriod iterations: Qwen3-Next's three Gated DeltaNet layers
  // between its attention layers) are gathered while they lie back to back and first grouped together; those
  // long enough to repeat alone are tried alone only where no grouping of the whole gathering repeats.
  std::size_t mixed_from = 0;  // the first of the gathered stretches
  std::vector<std::pair<std::size_t, std::size_t>> alone;  // gathered stretches of kMinIterations or more
  auto flush = [&](std::size_t to) {
    if (!mixed_groups(its, mixed_from, to))
      for (auto [a, b] : alone) one_shape(its, a, b);
    alone.clear();
    mixed_from = to;
  };
  for (std::size_t a = 0; a < its.size();) {
    // A candidate: back-to-back iterations of one shape (their side ops back to back too, if any).
    const auto& f = its[a];
    const int stride = f.end - f.first, side = f.side_end - f.side_first;
    std::size_t b = a + 1;
    while (b < its.size() && its[b].first == its[b - 1].end && its[b].end - its[b].first == stride &&
           its[b].side_end - its[b].side_first == side && (side == 0 || its[b].side_first == its[b - 1].side_end))
      ++b;
    const int count = static_cast<int>(b - a);
    const bool short_stretch = stride > 0 && count < kMaxPeriod;
    if (!short_stretch || !adjoins(its, a)) flush(a);
    if (short_stretch) {
      if (count >= kMinIterations) alone.emplace_back(a, b);
      if (b == its.size()) flush(b);
    } else {
      mixed_from = b;
      if (stride > 0) one_shape(its, a, b);
    }
    a = b;
  }
}

void Repeats::one_shape(const std::vector<Program::Iteration>& its, std::size_t a, std::size_t b) {
  const auto& f = its[a];
  const int stride = f.end - f.first, side = f.side_end - f.side_first;
  const int count = static_cast<int>(b - a);
  // Where the builder copied iterations (Program::Iteration::copy_of; the last copies of a stretch are
  // looked at), they repeat at its period: taken without a check (each replay checks what it relies on).
  std::size_t last_copy = b - 1;
  while (last_copy > a && its[last_copy].copy_of == 0) --last_copy;
  if (const int period = its[last_copy].copy_of;
      period > 0 && period <= kMaxPeriod && last_copy > a && its[last_copy - 1].copy_of == period) {
    if (count / period < kMinIterations) return;
    runs_.push_back(Repeat{{f.first, period * stride}, {f.side_first, period * side}, count / period, static_cast<int>(a), period});
    known_.emplace_back(static_cast<std::size_t>(count / period), 0);
    priority_step_.emplace_back(p_->resources.size(), kUnset);
    return;
  }
  // The grouping whose middle iterations repeat: single iterations first.
  for (int group = 1; group <= kMaxPeriod; ++group)
    for (int offset = 0; offset < group; ++offset)
      if (try_run(Repeat{{f.first + offset * stride, group * stride}, {f.side_first + offset * side, group * side},
                         (count - offset) / group, static_cast<int>(a) + offset, group}))
        return;
}

bool Repeats::adjoins(const std::vector<Program::Iteration>& its, std::size_t i) {
  if (i == 0) return false;
  const auto &x = its[i - 1], &y = its[i];
  const bool sided = y.side_end > y.side_first;
  return y.first == x.end && sided == (x.side_end > x.side_first) && (!sided || y.side_first == x.side_end);
}

bool Repeats::try_run(const Repeat& run) {
  if (run.count < kMinIterations) return false;
  runs_.push_back(run);
  known_.emplace_back(static_cast<std::size_t>(run.count), 0);
  priority_step_.emplace_back(p_->resources.size(), kUnset);
  const int mid = run.count / 2, last = std::min(run.count - 1, mid + std::max(1, (kMaxPeriod + run.group - 1) / run.group));
  if (first_break(static_cast<int>(runs_.size()) - 1, mid, last) > last) return true;
  runs_.pop_back();
  known_.pop_back();
  priority_step_.pop_back();
  return false;
}

bool Repeats::mixed_groups(const std::vector<Program::Iteration>& its, std::size_t from, std::size_t to) {
  if (to - from < 2 * static_cast<std::size_t>(kMinIterations)) return false;
  for (std::size_t i = from + 1; i < to; ++i)
    if (!adjoins(its, i)) return false;
  // Groups of 2 .. kMaxPeriod iterations, the fewest whose groups span alike and repeat mid-stretch.
  for (int group = 2; group <= kMaxPeriod; ++group)
    for (int offset = 0; offset < group; ++offset) {
      const std::size_t first = from + static_cast<std::size_t>(offset), G = static_cast<std::size_t>(group);
      if (first + G > to) break;
      auto span = [&](std::size_t g0) { return its[g0 + G - 1].end - its[g0].first; };
      auto side_span = [&](std::size_t g0) { return its[g0 + G - 1].side_end - its[g0].side_first; };
      int count = 1;
      while (first + (static_cast<std::size_t>(count) + 1) * G <= to && span(first + count * G) == span(first) &&
             side_span(first + count * G) == side_span(first))
        ++count;
      const auto& f = its[first];
      if (try_run(Repeat{{f.first, span(first)}, {f.side_first, side_span(first)}, count, static_cast<int>(first), group})) return true;
    }
  return false;
}

int Repeats::first_break(int r, int first, int last) {
  const auto& run = runs_[static_cast<std::size_t>(r)];
  first = std::max(first, 1);
  last = std::min(last, run.count - 1);
  auto& known = known_[static_cast<std::size_t>(r)];
  for (int i = first; i <= last; ++i) {
    // Copies after an iteration known to repeat: checked at once, for what a copy cannot vouch for.
    if (known[static_cast<std::size_t>(i)] == 0 && i >= 2 && known[static_cast<std::size_t>(i - 1)] == 1 && copied(r, i)) {
      int end = i;
      while (end < last && copied(r, end + 1)) ++end;
      RunCheck check(*p_, *releases_, *gate_after_, *alloc_op_, run, priority_step_[static_cast<std::size_t>(r)]);
      const int broken = check.copied_break(i, end, p_->iterations);
      for (int j = i; j < broken; ++j) known[static_cast<std::size_t>(j)] = 1;
      if (broken <= end) {
        known[static_cast<std::size_t>(broken)] = 2;
        return broken;
      }
      i = end;
      continue;
    }
    if (!repeats_previous(r, i)) return i;
  }
  return last + 1;
}

bool Repeats::repeats_previous(int r, int i) {
  char& k = known_[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
  if (k == 0) {
    RunCheck check(*p_, *releases_, *gate_after_, *alloc_op_, runs_[static_cast<std::size_t>(r)], priority_step_[static_cast<std::size_t>(r)]);
    k = check.next_repeats(i - 1) ? 1 : 2;
  }
  return k == 1;
}

bool Repeats::copied(int r, int i) const {
  const Repeat& run = runs_[static_cast<std::size_t>(r)];
  const int first = run.first_iteration + (i - 1) * run.group;
  const int period = p_->iterations[static_cast<std::size_t>(first)].copy_of;
  if (period <= 0 || run.group % period != 0) return false;
  for (int k = first; k < first + 2 * run.group; ++k)
    if (p_->iterations[static_cast<std::size_t>(k)].copy_of != period) return false;
  return true;
}

}  // namespace hbmsim::sim
