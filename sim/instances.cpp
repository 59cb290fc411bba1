#include "sim/instances.hpp"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace hbmsim::sim {

namespace {

int ops(const Span& s) { return s.end.ops - s.begin.ops; }
int buffers(const Span& s) { return s.end.buffers - s.begin.buffers; }
int lifts(const Span& s) { return s.end.lifts - s.begin.lifts; }
std::uint32_t uses(const Span& s) { return s.end.uses - s.begin.uses; }

bool same_shape(const Span& a, const Span& b) {
  return ops(a) == ops(b) && buffers(a) == buffers(b) && lifts(a) == lifts(b) && uses(a) == uses(b);
}

// x, y, z move by one step.
bool steps(long long x, long long y, long long z) { return y - x == z - y; }

template <class List>
bool lists_step(const List& x, const List& y, const List& z) {
  if (x.size() != y.size() || x.size() != z.size()) return false;
  for (std::size_t k = 0; k < x.size(); ++k)
    if (!steps(x[k], y[k], z[k])) return false;
  return true;
}

bool same_fields(const ProgramOp& a, const ProgramOp& b) {
  return a.queue == b.queue && a.seconds == b.seconds && a.executed_flops == b.executed_flops &&
         a.bytes_sent == b.bytes_sent && a.gate_bytes == b.gate_bytes && a.memory_bound == b.memory_bound &&
         a.phase == b.phase && a.use_count == b.use_count;
}

bool ops_continue(const Program& p, int x, int y, int z) {
  const ProgramOp &a = p.ops[static_cast<std::size_t>(x)], &b = p.ops[static_cast<std::size_t>(y)],
                  &c = p.ops[static_cast<std::size_t>(z)];
  if (!same_fields(a, b) || !same_fields(b, c) || !steps(a.layer, b.layer, c.layer) ||
      !steps(a.priority, b.priority, c.priority))
    return false;
  if (!lists_step(a.deps, b.deps, c.deps) || !lists_step(a.allocs, b.allocs, c.allocs) ||
      !lists_step(a.releases, b.releases, c.releases))
    return false;
  for (std::uint32_t u = 0; u < a.use_count; ++u) {
    const Use &ua = p.uses[a.use_begin + u], &ub = p.uses[b.use_begin + u], &uc = p.uses[c.use_begin + u];
    if (ua.resource != ub.resource || ub.resource != uc.resource || ua.bytes_per_s != ub.bytes_per_s ||
        ub.bytes_per_s != uc.bytes_per_s)
      return false;
  }
  return true;
}

// Appends v[first, first + n) to v (a vector may not insert its own elements).
template <class T>
void append_copy(std::vector<T>& v, std::size_t first, std::size_t n) {
  const std::size_t at = v.size();
  v.resize(at + n);
  std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(first), n, v.begin() + static_cast<std::ptrdiff_t>(at));
}

bool same_buffer(const Buffer& a, const Buffer& b) {
  return a.bytes == b.bytes && a.category == b.category && a.host == b.host && a.device == b.device;
}

}  // namespace

Mark mark(const Program& p) {
  return Mark{static_cast<int>(p.ops.size()), static_cast<int>(p.buffers.size()), static_cast<int>(p.gate_lifts.size()),
              static_cast<std::uint32_t>(p.uses.size())};
}

bool continues(const Program& p, const Span& a, const Span& b, const Span& c) {
  if (!same_shape(a, b) || !same_shape(b, c)) return false;
  for (int k = 0; k < ops(a); ++k)
    if (!ops_continue(p, a.begin.ops + k, b.begin.ops + k, c.begin.ops + k)) return false;
  for (int k = 0; k < buffers(a); ++k) {
    const auto x = static_cast<std::size_t>(a.begin.buffers + k), y = static_cast<std::size_t>(b.begin.buffers + k),
               z = static_cast<std::size_t>(c.begin.buffers + k);
    if (!same_buffer(p.buffers[x], p.buffers[y]) || !same_buffer(p.buffers[y], p.buffers[z])) return false;
  }
  for (int k = 0; k < lifts(a); ++k) {
    const auto &x = p.gate_lifts[static_cast<std::size_t>(a.begin.lifts + k)],
               &y = p.gate_lifts[static_cast<std::size_t>(b.begin.lifts + k)],
               &z = p.gate_lifts[static_cast<std::size_t>(c.begin.lifts + k)];
    if (!steps(x.op, y.op, z.op) || !steps(x.after, y.after, z.after)) return false;
  }
  return true;
}

bool continues(const std::vector<int>& a, const std::vector<int>& b, const std::vector<int>& c) {
  return lists_step(a, b, c);
}

bool extend(Program& p, const Span& b, const Span& c, Span& out) {
  out.begin = mark(p);
  const Mark& at = out.begin;
  // The copy's own ops, buffers, uses and lifts land where c's step says they do.
  if (at.ops - c.begin.ops != c.begin.ops - b.begin.ops || at.buffers - c.begin.buffers != c.begin.buffers - b.begin.buffers ||
      at.lifts - c.begin.lifts != c.begin.lifts - b.begin.lifts || at.uses - c.begin.uses != c.begin.uses - b.begin.uses)
    return false;
  // Reserved up front: the copies are read from the vector they are appended to.
  if (p.ops.capacity() < p.ops.size() + static_cast<std::size_t>(ops(c)))
    p.ops.reserve(std::max(2 * p.ops.capacity(), p.ops.size() + static_cast<std::size_t>(ops(c))));
  const std::uint32_t use_shift = at.uses - c.begin.uses;  // c's uses are contiguous, in op order: so are the copy's
  for (int k = 0; k < ops(c); ++k) {
    const ProgramOp &x = p.ops[static_cast<std::size_t>(b.begin.ops + k)], &y = p.ops[static_cast<std::size_t>(c.begin.ops + k)];
    ProgramOp& op = p.ops.emplace_back(y);
    op.priority = 2 * y.priority - x.priority;
    op.layer = static_cast<std::int16_t>(2 * y.layer - x.layer);  // a layer of the model: in range
    op.deps.step_on(x.deps);
    op.allocs.step_on(x.allocs);
    op.releases.step_on(x.releases);
    op.use_begin = y.use_begin + use_shift;
  }
  append_copy(p.uses, c.begin.uses, uses(c));
  append_copy(p.buffers, static_cast<std::size_t>(c.begin.buffers), static_cast<std::size_t>(buffers(c)));
  for (int k = 0; k < lifts(c); ++k) {
    const auto x = p.gate_lifts[static_cast<std::size_t>(b.begin.lifts + k)], y = p.gate_lifts[static_cast<std::size_t>(c.begin.lifts + k)];
    p.gate_lifts.push_back({2 * y.op - x.op, 2 * y.after - x.after});
  }
  out.end = mark(p);
  return true;
}

void extend(const std::vector<int>& b, const std::vector<int>& c, std::vector<int>& out) {
  out.resize(c.size());
  for (std::size_t k = 0; k < c.size(); ++k) out[k] = 2 * c[k] - b[k];
}

void LoopInstances::start(int iterations) {
  its_.resize(static_cast<std::size_t>(iterations));
  for (auto& it : its_) {
    it.done = false;
    it.copied_at = 0;
    std::fill(std::begin(it.continues), std::end(it.continues), std::int8_t{0});
  }
}

bool LoopInstances::continues_at(const Program& p, int i, int period) {
  if (i - 2 * period < 0) return false;
  Iteration& c = its_[static_cast<std::size_t>(i)];
  std::int8_t& known = c.continues[period];
  if (known == 0) {
    const Iteration &a = its_[static_cast<std::size_t>(i - 2 * period)], &b = its_[static_cast<std::size_t>(i - period)];
    const bool yes = a.done && b.done && c.done && continues(a.inputs, b.inputs, c.inputs) &&
                     continues(a.left, b.left, c.left) && continues(p, a.span, b.span, c.span);
    known = yes ? 1 : -1;
  }
  return known == 1;
}

int LoopInstances::period(const Program& p, int i, const std::vector<int>& inputs, int only) {
  const int lowest = only > 0 ? only : 1, highest = only > 0 ? only : 2;
  for (int period = lowest; period <= highest; ++period) {
    if (i - 3 * period < 0) break;
    const Iteration &a = its_[static_cast<std::size_t>(i - 2 * period)], &b = its_[static_cast<std::size_t>(i - period)];
    if (continues_at(p, i - period, period) && continues(a.inputs, b.inputs, inputs)) return period;
  }
  return 0;
}

bool LoopInstances::copy(Program& p, int i, int period, std::vector<int>& left) {
  const Iteration &b = its_[static_cast<std::size_t>(i - 2 * period)], &c = its_[static_cast<std::size_t>(i - period)];
  Span span;
  if (!extend(p, b.span, c.span, span)) return false;
  extend(b.left, c.left, left);
  its_[static_cast<std::size_t>(i)].copied_at = period;
  return true;
}

void LoopInstances::finish(int i, const Span& span, std::vector<int>& inputs, std::vector<int>& left) {
  Iteration& it = its_[static_cast<std::size_t>(i)];
  it.span = span;
  it.inputs.swap(inputs);
  it.left.swap(left);
  it.done = true;
  if (it.copied_at > 0) it.continues[it.copied_at] = 1;
}

}  // namespace hbmsim::sim
