// The latency-hiding list scheduler on hand-made iterations: which step issues when, worked out by hand.
#include <catch2/catch.hpp>

#include "sim/list_scheduler.hpp"

using hbmsim::ScheduleDag;

namespace {
constexpr int kComm = 1;  // any lane other than compute is a communication queue
}

TEST_CASE("a collective's flight time is filled with compute that does not need its result", "[scheduler]") {
  // 0: compute 1 s -> 1: all-to-all 3 s -> 2: compute 1 s (reads the all-to-all's result)
  //                   3: compute 2 s (reads only step 0's output)
  // Program order would be 0, 1, 2, 3 with 3 waiting behind 2. The scheduler issues 0 at t=0, the
  // collective at t=1 (on its own lane), then 3 at t=1 beside it (2 cannot start before t=4), then 2.
  ScheduleDag dag(4);
  dag.seconds = {1, 3, 1, 2};
  dag.lane = {ScheduleDag::kCompute, kComm, ScheduleDag::kCompute, ScheduleDag::kCompute};
  dag.edge(0, 1);
  dag.edge(1, 2);
  dag.edge(0, 3);
  CHECK(dag.list_schedule(false) == std::vector<std::size_t>{0, 1, 3, 2});
}

TEST_CASE("on a tie the collective goes first, then the longer critical path, then listing order", "[scheduler]") {
  // Three steps ready at t=0: compute 0 (1 s, nothing after it), compute 1 (1 s, then compute 3 of 5 s:
  // critical path 6 s) and a collective 2. The collective first; of the two compute steps the one heading
  // the longer chain (1), then 3 (ready at 1 s, ties with 0 which was ready at 0 but the compute lane is busy
  // until 1 s: both could start at 1 s; 3's remaining path, 5 s, beats 0's, 1 s).
  ScheduleDag dag(4);
  dag.seconds = {1, 1, 4, 5};
  dag.lane = {ScheduleDag::kCompute, ScheduleDag::kCompute, kComm, ScheduleDag::kCompute};
  dag.edge(1, 3);
  CHECK(dag.list_schedule(false) == std::vector<std::size_t>{2, 1, 3, 0});
  // Equal paths and durations: listing order.
  ScheduleDag even(2);
  even.seconds = {1, 1};
  CHECK(even.list_schedule(false) == std::vector<std::size_t>{0, 1});
}

TEST_CASE("feeding the next collective first gets a micro-batch to its dispatch before the other's work", "[scheduler]") {
  // Two micro-batches: A (steps 0 -> 1, 1 s each, then its dispatch 2, 2 s) and B (3 -> 4, 3 s each).
  ScheduleDag dag(5);
  dag.seconds = {1, 1, 2, 3, 3};
  dag.lane = {ScheduleDag::kCompute, ScheduleDag::kCompute, kComm, ScheduleDag::kCompute, ScheduleDag::kCompute};
  dag.edge(0, 1);
  dag.edge(1, 2);
  dag.edge(3, 4);
  // Without the rule ties go to the longer critical path (levels: 0: 4 s, 1: 3, 3: 6, 4: 3): B's 3 first
  // (t=0); at t=3 step 0 (level 4) beats 4 (3); at t=4 steps 1 and 4 tie in level and 1 is listed first;
  // at t=5 the dispatch and 4 tie and the collective goes first: the dispatch leaves at t=5.
  CHECK(dag.list_schedule(false) == std::vector<std::size_t>{3, 0, 1, 2, 4});
  // Feeding: 0 is 2 s of compute away from a collective, 3 never reaches one: A goes first, its dispatch
  // leaves at t=2 (not 5) and B runs under it.
  CHECK(dag.list_schedule(true) == std::vector<std::size_t>{0, 1, 2, 3, 4});
}
