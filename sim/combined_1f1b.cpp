#include "sim/combined_1f1b.hpp"

#include <algorithm>
#include <compare>
#include <stdexcept>
#include <string>

namespace hbmsim::sim {

namespace {

struct Key {
  int step, slot;
  auto operator<=>(const Key&) const = default;
};

// The device's compute and expert queues, which the keys read.
struct Queues {
  int compute, ep;
};

// Keys for one pass's ops, `keys[i - base]` for op i; the pair's other pass, if issued first, is keyed already.
// A compute op's key is (step, slot): its layer iteration's place in the pass (-1 before the first, the count
// after the last) and 2 x its part of that layer + 1 for the forward (a part ends at an all-to-all: the first
// compute op after one starts the next), so the two passes' parts alternate backward first, as Megatron
// issues them. Any other op (an all-to-all, a gather, a reduce-scatter, a send) is keyed by what it waits for
// within the pair: it is issued once those are, not behind the other pass's collectives that wait for later
// compute. Every key is at least the key of the pass's previous op on the same queue, so each queue keeps
// the pass's own order (a queue's order stands in for dependencies between its ops).
void key_pass(const Program& p, Queues qs, const PassSpan& s, bool issued_first, int base, std::vector<Key>& keys) {
  const int layers = s.end_iteration - s.first_iteration;
  int step = -1, part = 0, next = s.first_iteration;
  bool after_all_to_all = false;
  auto enter = [&](int st) {
    step = st;
    part = 0;
    after_all_to_all = false;
  };
  std::vector<Key> last(p.queues.size(), Key{-2, 0});
  const int end = static_cast<int>(keys.size()) + base;
  for (int i = s.first_op; i < s.end_op; ++i) {
    while (next < s.end_iteration && i >= p.iterations[static_cast<std::size_t>(next)].first) enter(next++ - s.first_iteration);
    if (layers > 0 && step == layers - 1 && i >= p.iterations[static_cast<std::size_t>(s.end_iteration - 1)].end) enter(layers);
    const ProgramOp& op = p.ops[static_cast<std::size_t>(i)];
    Key k{-2, 0};
    if (op.queue == qs.ep) after_all_to_all = true;
    if (op.queue == qs.compute) {
      if (after_all_to_all) {
        ++part;
        after_all_to_all = false;
      }
      k = {step, step < 0 ? (issued_first ? 0 : 1) : 2 * part + (s.forward ? 1 : 0)};
    }
    for (int d : op.deps)
      if (d >= base && d < end) k = std::max(k, keys[static_cast<std::size_t>(d - base)]);
    k = std::max(k, last[op.queue]);
    last[op.queue] = k;
    keys[static_cast<std::size_t>(i - base)] = k;
  }
}

void merge_pair(const Program& p, Queues qs, const PassSpan& a, const PassSpan& b, std::vector<int>& order) {
  if (a.end_op != b.first_op) throw std::logic_error("combined 1F1B: passes " + std::to_string(a.first_op) + " and " +
                                                     std::to_string(b.first_op) + " are not adjacent");
  std::vector<Key> keys(static_cast<std::size_t>(b.end_op - a.first_op));
  key_pass(p, qs, a, true, a.first_op, keys);
  key_pass(p, qs, b, false, a.first_op, keys);
  auto first = order.begin() + a.first_op, last = order.begin() + b.end_op;
  std::stable_sort(first, last, [&](int x, int y) {
    return keys[static_cast<std::size_t>(x - a.first_op)] < keys[static_cast<std::size_t>(y - a.first_op)];
  });
}

}  // namespace

void merge_passes(const Program& p, int device, const std::vector<PassSpan>& passes, std::vector<int>& order) {
  Queues qs{p.compute_queue(device), -1};
  for (std::size_t q = 0; q < p.queues.size(); ++q)
    if (p.queues[q].device == device && p.queues[q].name == "ep") qs.ep = static_cast<int>(q);
  for (std::size_t i = 0; i + 1 < passes.size(); ++i)
    if (passes[i].merged_with_next) {
      const PassSpan &a = passes[i], &b = passes[i + 1];
      if (a.forward == b.forward || a.microbatch == b.microbatch)
        throw std::logic_error("combined 1F1B: a merged pair must be a forward and a backward of different micro-batches");
      merge_pair(p, qs, a, b, order);
      ++i;
    }
}

}  // namespace hbmsim::sim
