#include "sim/repeats.hpp"

#include <cstddef>
#include <limits>
#include <cstdio>
#include <cstdlib>

namespace hbmsim::sim {

namespace {

// One candidate run of equal, back-to-back iterations, ops [lo, hi), `stride` ops each.
class RunCheck {
 public:
  RunCheck(const Program& p, const std::vector<int>& releases, const std::vector<int>& gate_after,
           const std::vector<int>& alloc_op, int lo, int hi, int stride)
      : p_(p), releases_(releases), gate_after_(gate_after), alloc_op_(alloc_op), lo_(lo), hi_(hi), s_(stride) {}

  // Iteration i + 1 is iteration i shifted.
  bool next_repeats(int i) const {
    const int base = lo_ + i * s_;
    for (int r = 0; r < s_; ++r)
      if (!same_op(base + r, base + r + s_)) return false;
    return true;
  }

 private:
  bool in(int op) const { return op >= lo_ && op < hi_; }
  // An op reference of x and the matching one of y = x + stride.
  bool same_ref(int a, int b) const { return in(a) ? b == a + s_ : !in(b); }
  bool same_buffer(int a, int b) const {
    const Buffer &x = p_.buffers[static_cast<std::size_t>(a)], &y = p_.buffers[static_cast<std::size_t>(b)];
    return x.bytes == y.bytes && x.category == y.category && x.host == y.host && x.device == y.device &&
           releases_[static_cast<std::size_t>(a)] == releases_[static_cast<std::size_t>(b)];
  }
  // A buffer reference: the same kind of buffer, made by the matching op (or both made outside the run).
  bool same_buffer_ref(int a, int b) const {
    if (!same_buffer(a, b)) return false;
    const int ma = alloc_op_[static_cast<std::size_t>(a)], mb = alloc_op_[static_cast<std::size_t>(b)];
    if (ma == kMany || mb == kMany) return false;
    return ma >= 0 && in(ma) ? mb == ma + s_ : mb < 0 || !in(mb);
  }

  bool same_op(int x, int y) const {
    const ProgramOp &a = p_.ops[static_cast<std::size_t>(x)], &b = p_.ops[static_cast<std::size_t>(y)];
    if (a.queue != b.queue || a.seconds != b.seconds || a.executed_flops != b.executed_flops ||
        a.bytes_sent != b.bytes_sent || a.gate_bytes != b.gate_bytes ||
        a.memory_bound != b.memory_bound || a.use_count != b.use_count || a.deps.size() != b.deps.size() ||
        a.allocs.size() != b.allocs.size() || a.releases.size() != b.releases.size())
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

 public:
  static constexpr int kMany = -2;  // a buffer allocated by more than one op

 private:
  const Program& p_;
  const std::vector<int>&releases_, &gate_after_, &alloc_op_;
  static constexpr int kUnset = std::numeric_limits<int>::min();
  mutable std::vector<int> priority_step_ = std::vector<int>(p_.resources.size(), kUnset);  // per link: per iteration
  int lo_, hi_, s_;
};

// Per buffer: the op that allocates it (-1: none, RunCheck::kMany: several).
const std::vector<int>& allocating_ops(const Program& p) {
  thread_local std::vector<int> alloc_op;
  alloc_op.assign(p.buffers.size(), -1);
  for (std::size_t i = 0; i < p.ops.size(); ++i)
    for (int b : p.ops[i].allocs) {
      int& a = alloc_op[static_cast<std::size_t>(b)];
      a = a == -1 ? static_cast<int>(i) : RunCheck::kMany;
    }
  return alloc_op;
}

constexpr int kMinIterations = 3;  // two to see the state repeat, at least one to skip

// The checked runs of a candidate of `count` iterations of `stride` ops from `lo`, taking `group`
// iterations at a time from `offset` (a scan body may hold two layers that differ, as with double buffering).
std::vector<Repeat> checked_runs(const Program& p, const std::vector<int>& releases, const std::vector<int>& gate_after,
                                 const std::vector<int>& alloc_op, int lo, int stride, int count, int group, int offset) {
  std::vector<Repeat> out;
  const int first = lo + offset * stride, s = group * stride, n = (count - offset) / group;
  if (n < kMinIterations) return out;
  RunCheck check(p, releases, gate_after, alloc_op, first, first + s * n, s);
  int start = 0;  // split where an iteration is not the one before shifted
  for (int i = 0; i < n; ++i) {
    if (i + 1 < n && check.next_repeats(i)) continue;
    if (i + 1 - start >= kMinIterations) out.push_back(Repeat{first + start * s, s, i + 1 - start});
    start = i + 1;
  }
  return out;
}

int covered_ops(const std::vector<Repeat>& runs) {
  int ops = 0;
  for (const Repeat& r : runs) ops += r.stride * r.count;
  return ops;
}

}  // namespace

std::vector<Repeat> find_repeats(const Program& p, const std::vector<int>& releases, const std::vector<int>& gate_after) {
  std::vector<Repeat> out;
  const auto& its = p.iterations;
  const std::vector<int>* alloc_op = nullptr;
  for (std::size_t a = 0; a < its.size();) {
    // A candidate: back-to-back iterations of one length.
    const int stride = its[a].end - its[a].first;
    std::size_t b = a + 1;
    while (b < its.size() && its[b].first == its[b - 1].end && its[b].end - its[b].first == stride) ++b;
    const int count = static_cast<int>(b - a);
    a = b;
    if (stride <= 0 || count < kMinIterations) continue;
    if (!alloc_op) alloc_op = &allocating_ops(p);
    // Single iterations first; groups of up to four where that leaves most of the candidate uncovered.
    std::vector<Repeat> best;
    for (int group = 1; group <= 4 && 2 * covered_ops(best) < stride * count; ++group)
      for (int offset = 0; offset < group && 2 * covered_ops(best) < stride * count; ++offset) {
        auto runs = checked_runs(p, releases, gate_after, *alloc_op, its[a - static_cast<std::size_t>(count)].first, stride, count, group, offset);
        if (covered_ops(runs) > covered_ops(best)) best = std::move(runs);
      }
    out.insert(out.end(), best.begin(), best.end());
  }
  return out;
}

}  // namespace hbmsim::sim
