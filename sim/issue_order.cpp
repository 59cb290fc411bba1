// Whether a program's issue order (Program::issue_order, set by combined 1F1B) can run to the end.
#include "sim/issue_order.hpp"

#include <stdexcept>
#include <string>

namespace hbmsim::sim::detail {

void check_issue_order(const Program& p, const std::vector<int>& start, const std::vector<int>& succ) {
  const std::size_t n = p.ops.size();
  if (p.issue_order.size() != n) throw std::logic_error("a program's issue order does not name every op once");
  std::vector<char> seen(n, 0);
  for (int i : p.issue_order) {
    if (i < 0 || static_cast<std::size_t>(i) >= n || seen[static_cast<std::size_t>(i)])
      throw std::logic_error("a program's issue order does not name every op once");
    seen[static_cast<std::size_t>(i)] = 1;
  }
  // Each op waits for its dependencies and for the op before it on its queue (serial or concurrent: a held
  // op holds the ones behind it); the order runs through iff every op is reached.
  std::vector<int> waits(n, 0), behind(n, -1), last(p.queues.size(), -1);
  for (int i : p.issue_order) {
    int& prev = last[p.ops[static_cast<std::size_t>(i)].queue];
    if (prev >= 0) {
      behind[static_cast<std::size_t>(prev)] = i;
      ++waits[static_cast<std::size_t>(i)];
    }
    prev = i;
  }
  for (std::size_t i = 0; i < n; ++i) waits[i] += static_cast<int>(p.ops[i].deps.size());
  std::vector<int> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (waits[i] == 0) ready.push_back(static_cast<int>(i));
  std::size_t done = 0;
  std::vector<char> ran(n, 0);
  auto release = [&](int o) {
    if (--waits[static_cast<std::size_t>(o)] == 0) ready.push_back(o);
  };
  while (!ready.empty()) {
    const int o = ready.back();
    ready.pop_back();
    ++done;
    ran[static_cast<std::size_t>(o)] = 1;
    for (int k = start[static_cast<std::size_t>(o)]; k < start[static_cast<std::size_t>(o) + 1]; ++k) release(succ[static_cast<std::size_t>(k)]);
    if (behind[static_cast<std::size_t>(o)] >= 0) release(behind[static_cast<std::size_t>(o)]);
  }
  if (done == n) return;
  // Name the first op left on each of the first queues that hold one, and what it waits for.
  auto describe = [&](int o) {
    const ProgramOp& op = p.ops[static_cast<std::size_t>(o)];
    const Queue& q = p.queues[op.queue];
    return "op " + std::to_string(o) + " (" + q.name + " of device " + std::to_string(q.device) + ", phase " + op.phase +
           ", layer " + std::to_string(op.layer) + ")";
  };
  std::string stuck;
  std::vector<char> named(p.queues.size(), 0);
  int shown = 0;
  for (int i : p.issue_order) {
    const int q = p.ops[static_cast<std::size_t>(i)].queue;
    if (ran[static_cast<std::size_t>(i)] || named[static_cast<std::size_t>(q)] || shown == 4) continue;
    named[static_cast<std::size_t>(q)] = 1;
    ++shown;
    stuck += "; " + describe(i) + " waits for";
    for (int d : p.ops[static_cast<std::size_t>(i)].deps)
      if (!ran[static_cast<std::size_t>(d)]) stuck += " " + describe(d);
  }
  throw std::logic_error("a program's issue order cannot run to the end: " + std::to_string(n - done) + " of " + std::to_string(n) +
                         " ops wait in a cycle of dependencies and queue order" + stuck);
}


}  // namespace hbmsim::sim::detail
