#include "sim/list_scheduler.hpp"

#include <algorithm>
#include <limits>

namespace hbmsim {

void ScheduleDag::edge(int from, std::size_t to) {
  if (from < 0) return;
  succ[static_cast<std::size_t>(from)].push_back(static_cast<int>(to));
  ++indeg[to];
}

std::vector<std::size_t> ScheduleDag::list_schedule(bool feed_comm_first) const {
  const auto n = seconds.size();
  if (n == 0) return {};
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<double> level(n, 0.0);      // bottom level: the longest chain of durations to the iteration's end
  std::vector<double> to_comm(n, kNever);  // compute seconds from a step's start to the next communication step
  for (std::size_t i = n; i-- > 0;) {
    double tail = 0, next = kNever;
    for (int s2 : succ[i]) {
      auto j = static_cast<std::size_t>(s2);
      tail = std::max(tail, level[j]);
      next = std::min(next, lane[j] != kCompute ? 0.0 : to_comm[j]);
    }
    level[i] = seconds[i] + tail;
    to_comm[i] = lane[i] != kCompute ? 0.0 : seconds[i] + next;
  }
  std::vector<int> deg = indeg;
  std::vector<double> ready(n, 0.0);
  std::vector<int> avail;
  for (std::size_t i = 0; i < n; ++i)
    if (deg[i] == 0) avail.push_back(static_cast<int>(i));
  std::vector<double> free_at(static_cast<std::size_t>(*std::max_element(lane.begin(), lane.end())) + 1, 0.0);
  std::vector<std::size_t> order;
  order.reserve(n);
  // Is step i, starting at start_i, a better choice than step j starting at start_j?
  auto better = [&](std::size_t i, double start_i, std::size_t j, double start_j) {
    if (start_i != start_j) return start_i < start_j;
    const bool ci = lane[i] != kCompute, cj = lane[j] != kCompute;
    if (ci != cj) return ci;
    if (feed_comm_first && to_comm[i] != to_comm[j]) return to_comm[i] < to_comm[j];
    if (level[i] != level[j]) return level[i] > level[j];
    return i < j;
  };
  while (!avail.empty()) {
    std::size_t best = 0;
    double best_start = 0;
    for (std::size_t a = 0; a < avail.size(); ++a) {
      auto i = static_cast<std::size_t>(avail[a]);
      double start = std::max(ready[i], free_at[static_cast<std::size_t>(lane[i])]);
      if (a == 0 || better(i, start, static_cast<std::size_t>(avail[best]), best_start)) {
        best = a;
        best_start = start;
      }
    }
    auto i = static_cast<std::size_t>(avail[best]);
    avail.erase(avail.begin() + static_cast<long>(best));
    double end = best_start + seconds[i];
    free_at[static_cast<std::size_t>(lane[i])] = end;
    order.push_back(i);
    for (int s2 : succ[i]) {
      auto j = static_cast<std::size_t>(s2);
      ready[j] = std::max(ready[j], end);
      if (--deg[j] == 0) avail.push_back(s2);
    }
  }
  return order;
}

}  // namespace hbmsim
