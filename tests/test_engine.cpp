#include <catch2/catch.hpp>

#include <stdexcept>

#include "sim/engine.hpp"

using namespace hbmsim::sim;

namespace {
// A copy engine queue and its link: `bytes` at `bw` alone take bytes / bw seconds and hold the link whole.
struct Copies {
  int queue, link;
};
Copies copy_engine(Program& p, const char* name, double bw) {
  return {p.queue(name, QueueKind::concurrent, true), p.resource(std::string(name) + " link", bw)};
}
// Adds a copy of `bytes` at `bw` that holds its link whole; returns its id.
int add_copy(Program& p, const Copies& c, double bytes, double bw, std::vector<int> deps = {}, int priority = 0,
             double gate_bytes = 0, std::vector<int> allocs = {}) {
  ProgramOp o(c.queue, bytes / bw);
  o.deps = deps;
  o.priority = priority;
  o.gate_bytes = gate_bytes;
  o.allocs = allocs;
  int id = p.add(o);
  p.use(id, c.link, bw);
  return id;
}
ProgramOp compute(double seconds, std::vector<int> deps = {}) {
  ProgramOp o(kComputeQueue, seconds);
  o.deps = deps;
  return o;
}
}  // namespace

TEST_CASE("a GEMM and a copy on different queues overlap, and add up when the copy waits for the GEMM", "[engine]") {
  // GEMM: 1 s on the compute stream. Copy: 5 GB at 10 GB/s = 0.5 s on the D2H engine.
  Program overlap;
  auto d2h = copy_engine(overlap, "d2h", 10e9);
  overlap.add(compute(1.0));
  add_copy(overlap, d2h, 5e9, 10e9);
  CHECK(run_program(overlap, false).end_time_s == Approx(1.0));  // max(1, 0.5)
  Program serial;
  d2h = copy_engine(serial, "d2h", 10e9);
  serial.add(compute(1.0));
  add_copy(serial, d2h, 5e9, 10e9, {0});
  CHECK(run_program(serial, false).end_time_s == Approx(1.5));  // 1 + 0.5
}

TEST_CASE("two copies sharing one link direction each get half of it, busy time is their union", "[engine]") {
  // Each 1 GB at 10 GB/s would take 0.1 s alone; together each runs at 5 GB/s and both end at 0.2 s.
  Program p;
  auto h2d = copy_engine(p, "h2d", 10e9);
  add_copy(p, h2d, 1e9, 10e9);
  add_copy(p, h2d, 1e9, 10e9);
  auto r = run_program(p, true);
  CHECK(r.end_s[0] == Approx(0.2));
  CHECK(r.end_s[1] == Approx(0.2));
  // The two spans overlap entirely: the queue was busy 0.2 s, not 0.4 s.
  CHECK(r.busy_s[static_cast<std::size_t>(h2d.queue)] == Approx(0.2));
  // Opposite directions do not share (full duplex): both end at 0.1 s.
  Program q;
  auto in = copy_engine(q, "h2d", 10e9), out = copy_engine(q, "d2h", 10e9);
  add_copy(q, in, 1e9, 10e9);
  add_copy(q, out, 1e9, 10e9);
  CHECK(run_program(q, false).end_time_s == Approx(0.1));
  // Unless a resource caps both directions together at 15 GB/s: each gets 7.5 GB/s, 1/7.5 s.
  Program capped;
  in = copy_engine(capped, "h2d", 10e9);
  out = copy_engine(capped, "d2h", 10e9);
  int both = capped.resource("both", 15e9);
  capped.use(add_copy(capped, in, 1e9, 10e9), both, 10e9);
  capped.use(add_copy(capped, out, 1e9, 10e9), both, 10e9);
  CHECK(run_program(capped, false).end_time_s == Approx(1.0 / 7.5));
}

TEST_CASE("a more urgent class takes the whole link first", "[engine]") {
  // Priority 0 copy (1 GB) runs alone at 10 GB/s: 0.1 s; the priority 1 copy then takes 0.1 s more.
  Program p;
  auto h2d = copy_engine(p, "h2d", 10e9);
  add_copy(p, h2d, 1e9, 10e9, {}, 1);
  add_copy(p, h2d, 1e9, 10e9);
  auto r = run_program(p, true);
  CHECK(r.end_s[1] == Approx(0.1));
  CHECK(r.end_s[0] == Approx(0.2));
}

TEST_CASE("links are shared max-min fairly by transfers from any queue", "[engine]") {
  // Link X carries 10 GB/s, link Y 4 GB/s. Transfer A (queue a) moves 10 GB over X; transfer B (queue b)
  // moves 10 GB over both X and Y, each at 10 GB/s when alone. Progressive filling: both rise to rate 0.4,
  // where Y is full (B: 0.4 x 10 = 4 GB/s) and B freezes; A then takes the rest of X, 6 GB/s (rate 0.6).
  // B needs 10 / 4 = 2.5 s. A moves 6 GB/s until... it is done at 10/6 = 1.667 s, before B ends.
  Program p;
  int x = p.resource("X", 10e9), y = p.resource("Y", 4e9);
  int a = p.add(ProgramOp(p.queue("a"), 1.0));
  p.use(a, x, 10e9);
  int b = p.add(ProgramOp(p.queue("b"), 1.0));
  p.use(b, x, 10e9);
  p.use(b, y, 10e9);
  auto r = run_program(p, true);
  CHECK(r.end_s[0] == Approx(10.0 / 6.0));
  CHECK(r.end_s[1] == Approx(2.5));
  // Two transfers that each use less than half a link do not slow each other: 3 + 3 GB/s on 10 GB/s.
  Program q;
  int link = q.resource("NVLink", 10e9);
  ProgramOp c(q.queue("tp"), 1.0);
  c.bytes_sent = 3e9;
  q.use(q.add(c), link, 3e9);
  q.use(q.add(ProgramOp(q.queue("fsdp"), 1.0)), link, 3e9);
  auto s = run_program(q, false);
  CHECK(s.end_time_s == Approx(1.0));
  CHECK(s.bytes_sent[static_cast<std::size_t>(c.queue)] == 3e9);
}

TEST_CASE("a memory-bound kernel slows by the interference factor while a copy runs", "[engine]") {
  // Kernel: 1 s alone. Copy: 0.5 s. Interference 0.2: for the first 0.5 s the kernel runs at 0.8,
  // finishing 0.4 s of work; the remaining 0.6 s runs at full speed: total 1.1 s.
  Program p;
  p.copy_interference = 0.2;
  auto d2h = copy_engine(p, "d2h", 10e9);
  auto k = compute(1.0);
  k.memory_bound = true;
  p.add(k);
  add_copy(p, d2h, 5e9, 10e9);
  CHECK(run_program(p, false).end_time_s == Approx(1.1));
}

TEST_CASE("a compute kernel slows by the SM share a communication kernel holds while it runs", "[engine]") {
  // GEMM: 1 s alone. All-to-all on a queue that holds a quarter of the SMs: 0.5 s. For the first 0.5 s the GEMM
  // runs at 0.75 (0.375 s of its work), the remaining 0.625 s at full speed: it ends at 1.125 s. A memory-bound
  // kernel beside the same all-to-all keeps its speed (it ends at 1 s); so does the GEMM when the queue holds no SMs.
  for (const bool memory_bound : {false, true})
    for (const bool takes_sms : {true, false}) {
      Program p;
      p.comm_sm_share = 0.25;
      auto k = compute(1.0);
      k.memory_bound = memory_bound;
      p.add(k);
      const int ep = p.queue("ep");
      p.queues[static_cast<std::size_t>(ep)].takes_sms = takes_sms;
      p.add(ProgramOp(ep, 0.5));
      auto r = run_program(p, true);
      CHECK(r.end_s[1] == Approx(0.5));
      CHECK(r.end_s[0] == Approx(takes_sms && !memory_bound ? 1.125 : 1.0));
    }
}

TEST_CASE("buffers are live from their allocating op's start to their last release, and the peak is tracked", "[engine]") {
  Program p;
  int a = p.add_buffer(100, MemCategory::workspace);
  int b = p.add_buffer(50, MemCategory::saved_activations);
  auto first = compute(1.0);
  first.allocs = {a, b};
  first.releases = {a};
  p.add(first);
  auto second = compute(1.0, {0});
  second.releases = {b};
  p.add(second);
  auto r = run_program(p, true);
  CHECK(r.memory[0].hbm_peak_bytes == 150);
  CHECK(r.memory[0].hbm_at_peak[static_cast<int>(MemCategory::workspace)] == 100);
  CHECK(r.buffer_free_s[static_cast<std::size_t>(a)] == Approx(1.0));
  CHECK(r.buffer_free_s[static_cast<std::size_t>(b)] == Approx(2.0));
}

TEST_CASE("a collective's buffers come alive when it becomes ready, not when its queue gets to it", "[engine]") {
  // A 1 s kernel feeds a 1 s collective C2 that queues behind a 3 s collective C1 (no dependencies: it starts,
  // and takes its 100 bytes, at t = 0). C2 is issued, and takes its 50 bytes, when the kernel ends at t = 1;
  // it runs 3 -> 4. On a queue that allocates at the start the 50 bytes come alive at 3 instead.
  for (const bool when_ready : {true, false}) {
    Program p;
    const int tp = p.queue("tp");
    p.queues[static_cast<std::size_t>(tp)].allocates_when_ready = when_ready;
    const int first = p.add_buffer(100, MemCategory::collective_buffers);
    const int second = p.add_buffer(50, MemCategory::workspace);
    p.add(compute(1.0));
    ProgramOp c1(tp, 3.0);
    c1.allocs = {first};
    c1.releases = {first};
    p.add(c1);
    ProgramOp c2(tp, 1.0);
    c2.deps = {0};
    c2.allocs = {second};
    c2.releases = {second};
    p.add(c2);
    const auto r = run_program(p, true);
    INFO("allocates when ready: " << when_ready);
    CHECK(r.start_s[2] == Approx(3.0));
    CHECK(r.buffer_alloc_s[static_cast<std::size_t>(first)] == Approx(0.0));
    CHECK(r.buffer_alloc_s[static_cast<std::size_t>(second)] == Approx(when_ready ? 1.0 : 3.0));
    CHECK(r.buffer_free_s[static_cast<std::size_t>(second)] == Approx(4.0));
    CHECK(r.memory[0].hbm_peak_bytes == (when_ready ? 150 : 100));  // C1's 100 are freed at 3
  }
}

TEST_CASE("a collective issued at an instant takes its buffers after that instant's frees", "[engine]") {
  // A 1 s kernel issues a collective with 50 bytes; a 1 s copy holding 100 bytes ends at the same instant
  // (a later op: it completes after the kernel). The 100 are freed before the 50 are taken: the peak is 100
  // (the copy's, from t = 0), not 150, with or without fast-forward.
  Program p;
  const int tp = p.queue("tp");
  p.queues[static_cast<std::size_t>(tp)].allocates_when_ready = true;
  auto d2h = copy_engine(p, "d2h", 10e9);
  const int held = p.add_buffer(100, MemCategory::offload_buffers);
  const int out = p.add_buffer(50, MemCategory::collective_buffers);
  p.add(compute(1.0));
  const int copy = add_copy(p, d2h, 10e9, 10e9, {}, 0, 0, {held});
  p.ops[static_cast<std::size_t>(copy)].releases = {held};
  ProgramOp c(tp, 1.0);
  c.deps = {0};
  c.allocs = {out};
  c.releases = {out};
  p.add(c);
  for (const bool ff : {true, false}) {
    const auto r = run_program(p, true, ff);
    CHECK(r.buffer_alloc_s[static_cast<std::size_t>(out)] == Approx(1.0));
    CHECK(r.buffer_free_s[static_cast<std::size_t>(held)] == Approx(1.0));
    CHECK(r.memory[0].hbm_peak_bytes == 100);
  }
}

TEST_CASE("a prefetch gated by the memory limit waits until memory is freed", "[engine]") {
  // Limit 120 bytes; 100 are live until t = 1 s; a 50-byte prefetch may start only then.
  Program p;
  p.hbm_limit_bytes[0] = 120;
  auto h2d = copy_engine(p, "h2d", 10e9);
  int big = p.add_buffer(100, MemCategory::workspace);
  int fetched = p.add_buffer(50, MemCategory::offload_buffers);
  auto hold = compute(1.0);
  hold.allocs = {big};
  hold.releases = {big};
  p.add(hold);
  add_copy(p, h2d, 1e9, 10e9, {}, 0, 50, {fetched});
  auto r = run_program(p, true);
  CHECK(r.start_s[1] == Approx(1.0));
  CHECK(r.end_time_s == Approx(1.1));
  CHECK(r.memory[0].hbm_peak_bytes == 100);
}

TEST_CASE("a gated copy that could never fit starts when nothing else runs", "[engine]") {
  // Limit 10 bytes, the copy needs 50: with nothing running it is forced (XLA issues it anyway), at t = 0
  // when alone, or at t = 1 s behind a 1 s kernel it does not depend on.
  Program p;
  p.hbm_limit_bytes[0] = 10;
  auto h2d = copy_engine(p, "h2d", 10e9);
  p.add(compute(1.0));
  add_copy(p, h2d, 1e9, 10e9, {}, 0, 50);
  auto r = run_program(p, true);
  CHECK(r.start_s[1] == Approx(1.0));
  CHECK(r.end_time_s == Approx(1.1));
}

TEST_CASE("the compute stream's waiting time is blamed on the queue it waited for", "[engine]") {
  // Copy 0.5 s, then a compute op that needs it: compute waits 0.5 s on h2d.
  Program p;
  auto h2d = copy_engine(p, "h2d", 10e9);
  add_copy(p, h2d, 5e9, 10e9);
  p.add(compute(1.0, {0}));
  auto r = run_program(p, false);
  CHECK(r.exposed_s[static_cast<std::size_t>(h2d.queue)] == Approx(0.5));
  CHECK(r.end_time_s == Approx(1.5));
}

TEST_CASE("programs that break the engine's rules are builder bugs, not input errors", "[engine]") {
  Program p;
  p.add(compute(1.0, {0}));  // depends on itself
  CHECK_THROWS_AS(run_program(p, false), std::logic_error);
  Program q;
  int op = q.add(compute(1.0));
  CHECK_THROWS_AS(q.use(op, 3, 1e9), std::logic_error);  // no such resource
  q.resource("link", 1e9);
  q.add(compute(1.0));
  CHECK_THROWS_AS(q.use(op, 0, 1e9), std::logic_error);  // op 0 is no longer the last one
}

TEST_CASE("only transfers linked to an oversubscribed link slow down", "[engine]") {
  // Links X, Y, Z at 10 GB/s. A (1 GB) wants all of X; B (1 GB) all of X and of Y; C (0.5 GB) 5 GB/s of Y;
  // D (1 GB) all of Z. X is oversubscribed: A and B get 5 GB/s each (0.2 s). Y then carries B's 5 and C's 5:
  // C runs at full speed (0.1 s), as does D, on a link nobody shares (0.1 s).
  Program p;
  const int q = p.queue("xfer", QueueKind::concurrent);
  const int x = p.resource("X", 10e9), y = p.resource("Y", 10e9), z = p.resource("Z", 10e9);
  auto xfer = [&](double seconds, std::vector<std::pair<int, double>> uses) {
    int id = p.add(ProgramOp(q, seconds));
    for (auto [r, bw] : uses) p.use(id, r, bw);
    return id;
  };
  const int a = xfer(0.1, {{x, 10e9}}), b = xfer(0.1, {{x, 10e9}, {y, 10e9}}), c = xfer(0.1, {{y, 5e9}}),
            d = xfer(0.1, {{z, 10e9}});
  auto r = run_program(p, true);
  CHECK(r.end_s[static_cast<std::size_t>(a)] == Approx(0.2));
  CHECK(r.end_s[static_cast<std::size_t>(b)] == Approx(0.2));
  CHECK(r.end_s[static_cast<std::size_t>(c)] == Approx(0.1));
  CHECK(r.end_s[static_cast<std::size_t>(d)] == Approx(0.1));
}

TEST_CASE("a transfer away from the shared links leaves their rates, one that joins them is shared in", "[engine]") {
  // Links X and Z at 10 GB/s. A and B (1 GB each) want all of X from t = 0: 5 GB/s each. G (0.5 GB, all
  // of Z) runs from 0.05 to 0.1 s beside them without touching X (the engine keeps A's and B's rates without
  // sharing again). H (1 GB, all of X) joins at 0.1 s: A and B have 0.5 GB left and get a third of X each
  // until 0.25 s; H, 0.5 GB done by then, finishes alone at 0.3 s.
  Program p;
  const int q = p.queue("xfer", QueueKind::concurrent), other = p.queue("other", QueueKind::concurrent);
  const int x = p.resource("X", 10e9), z = p.resource("Z", 10e9);
  auto xfer = [&](int queue, double seconds, int link, std::vector<int> deps) {
    ProgramOp o(queue, seconds);
    o.deps = deps;
    const int id = p.add(o);
    p.use(id, link, 10e9);
    return id;
  };
  const int c1 = p.add(compute(0.05)), c2 = p.add(compute(0.05));
  const int a = xfer(q, 0.1, x, {}), b = xfer(q, 0.1, x, {}), h = xfer(q, 0.1, x, {c2}), g = xfer(other, 0.05, z, {c1});
  auto r = run_program(p, true);
  CHECK(r.end_s[static_cast<std::size_t>(g)] == Approx(0.1));
  CHECK(r.end_s[static_cast<std::size_t>(a)] == Approx(0.25));
  CHECK(r.end_s[static_cast<std::size_t>(b)] == Approx(0.25));
  CHECK(r.end_s[static_cast<std::size_t>(h)] == Approx(0.3));
}

// ---- SmallVec: inline room for N, then the heap (capacity bit_ceil(size), not stored). ----
namespace {
template <std::uint32_t N>
std::vector<int> as_vector(const SmallVec<int, N>& v) { return std::vector<int>(v.begin(), v.end()); }
}  // namespace

TEST_CASE("SmallVec holds what std::vector holds through growth, copies, moves and shrinking assigns", "[engine][small_vec]") {
  // Sizes 0..40 cross the inline room (3) and every doubling of the heap room (4, 8, 16, 32).
  SmallVec<int, 3> v;
  std::vector<int> ref;
  for (int i = 0; i < 40; ++i) {
    v.push_back(7 * i - 3);
    ref.push_back(7 * i - 3);
    REQUIRE(as_vector(v) == ref);
    SmallVec<int, 3> copy = v;  // a copy is its own list: changing it leaves v alone
    copy[0] = 1000;
    CHECK(v[0] == -3);
    CHECK(copy.size() == v.size());
  }
  SmallVec<int, 3> moved = std::move(v);
  CHECK(as_vector(moved) == ref);
  CHECK(v.empty());  // NOLINT(bugprone-use-after-move): a moved-from list is empty
  // Shrinking assigns: heap to a smaller heap, heap to inline, inline back to heap.
  const std::vector<int> five{1, 2, 3, 4, 5}, two{8, 9}, nine{1, 1, 2, 3, 5, 8, 13, 21, 34};
  moved = five;
  CHECK(as_vector(moved) == five);
  moved.push_back(6);  // 5 -> 6 within the heap room of 8 it kept
  CHECK(as_vector(moved) == std::vector<int>{1, 2, 3, 4, 5, 6});
  moved = two;
  CHECK(as_vector(moved) == two);
  moved = nine;
  CHECK(as_vector(moved) == nine);
  moved.clear();
  CHECK(moved.empty());
  moved.push_back(4);
  CHECK(as_vector(moved) == std::vector<int>{4});
}

TEST_CASE("SmallVec::step_on moves each id on by the step its model took", "[engine][small_vec]") {
  // A copy of iteration c made from iterations b and c: id y of c, x of b -> 2y - x (y + (y - x)).
  SmallVec<int, 3> before{10, 20, 30, 40, 50}, model{15, 22, 30, 47, 49};
  SmallVec<int, 3> copy = model;
  copy.step_on(before);
  CHECK(as_vector(copy) == std::vector<int>{20, 24, 30, 54, 48});
  SmallVec<int, 3> small_before{1, 2}, small{4, 3};
  small.step_on(small_before);
  CHECK(as_vector(small) == std::vector<int>{7, 4});
}

TEST_CASE("a program op packs into 96 bytes and a program refuses more queues than an op can name", "[engine]") {
  STATIC_REQUIRE(sizeof(ProgramOp) <= 96);
  Program p;
  for (int q = 1; q < kMaxQueues; ++q) p.queue("q" + std::to_string(q));
  CHECK(p.queues.size() == static_cast<std::size_t>(kMaxQueues));
  CHECK_THROWS_AS(p.queue("one too many"), std::logic_error);
  CHECK_THROWS_AS(p.add_device(), std::logic_error);
}

TEST_CASE("an issue order other than the program's runs each queue in that order, a cyclic one is refused", "[engine]") {
  // Compute stream: A (1 s), D (1 s, needs X), C (1 s, independent). ep stream: X (2 s, needs A). In program
  // order A, X, D, C the stream runs A 0-1, waits for X (1-3), runs D 3-4 and C 4-5. Issued A, X, C, D, C
  // fills the wait: A 0-1, C 1-2, X 1-3, D 3-4, so the step ends at 4 (the order combined 1F1B relies on).
  Program p;
  const int ep = p.queue("ep");
  const int a = p.add(compute(1.0));
  ProgramOp x(ep, 2.0);
  x.deps = {a};
  const int xi = p.add(x);
  const int d = p.add(compute(1.0, {xi}));
  const int c = p.add(compute(1.0));
  CHECK(run_program(p, false).end_time_s == Approx(5.0));
  p.issue_order = {a, xi, c, d};
  auto r = run_program(p, true);
  CHECK(r.end_time_s == Approx(4.0));
  CHECK(r.start_s[static_cast<std::size_t>(c)] == Approx(1.0));
  CHECK(r.start_s[static_cast<std::size_t>(d)] == Approx(3.0));
  // D ahead of A on the stream: D waits for X, X for A, A for D's place in the queue, and C behind A: all four.
  p.issue_order = {d, a, xi, c};
  CHECK_THROWS_WITH(run_program(p, false), Catch::Contains("cannot run to the end: 4 of 4 ops") &&
                                            Catch::Contains("op 2 (compute of device 0") && Catch::Contains("waits for op 1 (ep"));
  // Not a permutation of the ops.
  p.issue_order = {a, a, xi, c};
  CHECK_THROWS_WITH(run_program(p, false), Catch::Contains("does not name every op once"));
  p.issue_order = {a, xi, c};
  CHECK_THROWS_WITH(run_program(p, false), Catch::Contains("does not name every op once"));
}

TEST_CASE("a run given an HBM stop ends when live HBM first goes over it, and runs whole under it", "[engine]") {
  // Three 1 s compute ops in a chain, each allocating 10 GB when it starts and keeping it: live HBM is 10, 20, 30
  // GB from t = 0, 1 and 2 s. A stop at 25 GB ends the run at t = 2 s, when the third op starts (two completions),
  // with a peak of 30 GB; a stop at 30 GB (never exceeded) or none runs all 3 s.
  Program p;
  for (int i = 0; i < 3; ++i) {
    ProgramOp op = compute(1.0, i ? std::vector<int>{i - 1} : std::vector<int>{});
    op.allocs = {p.add_buffer(10e9, MemCategory::saved_activations)};
    p.add(op);
  }
  const auto stopped = run_program(p, false, true, 25e9);
  CHECK(stopped.stopped_over_hbm);
  CHECK(stopped.end_time_s == Approx(2.0));
  CHECK(stopped.events == 2);
  CHECK(stopped.memory[0].hbm_peak_bytes == Approx(30e9));
  for (double stop : {30e9, 0.0}) {
    const auto whole = run_program(p, false, true, stop);
    CHECK_FALSE(whole.stopped_over_hbm);
    CHECK(whole.end_time_s == Approx(3.0));
    CHECK(whole.events == 3);
  }
}
