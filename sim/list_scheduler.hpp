// The latency-hiding list scheduler of one loop iteration: steps on lanes (the compute stream and one lane per
// communication queue) with data dependencies; each step issues at the earliest time its inputs and its lane
// allow. Public so that its rules are unit-tested on hand-made graphs.
#pragma once
#include <cstddef>
#include <vector>

namespace hbmsim {

struct ScheduleDag {
  static constexpr int kCompute = 0;  // lane of the compute stream; any other lane is a communication queue

  std::vector<double> seconds;  // solo duration of each step
  std::vector<int> lane;
  std::vector<std::vector<int>> succ;
  std::vector<int> indeg;

  explicit ScheduleDag(std::size_t n) : seconds(n, 0.0), lane(n, kCompute), succ(n), indeg(n, 0) {}
  // `to` needs `from` (a negative `from` is ignored). Steps must be listed in a topological order.
  void edge(int from, std::size_t to);

  // The issue order. Ties between steps that could start at the same time: a communication step first;
  // with `feed_comm_first`, the compute step closest to starting the next communication step (so a
  // micro-batch reaches its dispatch before the other's attention runs beside it); then the longer critical
  // path; then listing order.
  std::vector<std::size_t> list_schedule(bool feed_comm_first) const;
};

}  // namespace hbmsim
