#include <catch2/catch.hpp>

#include "sim/engine.hpp"

using namespace hbmsim::sim;

namespace {
ProgramOp op(int stream, double amount, double cap = 1, std::vector<int> deps = {}) {
  ProgramOp o(stream, amount, cap);
  o.deps = std::move(deps);
  return o;
}
}  // namespace

TEST_CASE("a GEMM and a copy on different engines overlap, and add up when the copy waits for the GEMM", "[engine]") {
  // GEMM: 1 s on the compute stream. Copy: 5 GB at 10 GB/s = 0.5 s on the D2H engine.
  Program overlap;
  overlap.add(op(compute, 1.0));
  overlap.add(op(d2h, 5e9, 10e9));
  CHECK(run_program(overlap, false).end_time_s == Approx(1.0));  // max(1, 0.5)
  Program serial;
  serial.add(op(compute, 1.0));
  serial.add(op(d2h, 5e9, 10e9, {0}));
  CHECK(run_program(serial, false).end_time_s == Approx(1.5));  // 1 + 0.5
}

TEST_CASE("two copies sharing one link direction each get half of it", "[engine]") {
  // Each 1 GB at 10 GB/s would take 0.1 s alone; together each runs at 5 GB/s and both end at 0.2 s.
  Program p;
  p.add(op(h2d, 1e9, 10e9));
  p.add(op(h2d, 1e9, 10e9));
  auto r = run_program(p, true);
  CHECK(r.end_s[0] == Approx(0.2));
  CHECK(r.end_s[1] == Approx(0.2));
  // Opposite directions do not share (full duplex): both end at 0.1 s.
  Program q;
  q.add(op(h2d, 1e9, 10e9));
  q.add(op(d2h, 1e9, 10e9));
  CHECK(run_program(q, false).end_time_s == Approx(0.1));
  // Unless the link caps both directions together at 15 GB/s: each gets 7.5 GB/s, 1/7.5 s.
  q.bidirectional_total_bytes_per_s = 15e9;
  CHECK(run_program(q, false).end_time_s == Approx(1.0 / 7.5));
}

TEST_CASE("a more urgent copy class takes the whole direction first", "[engine]") {
  // Priority 0 copy (1 GB) runs alone at 10 GB/s: 0.1 s; the priority 1 copy then takes 0.1 s more.
  Program p;
  auto a = op(h2d, 1e9, 10e9);
  a.priority = 1;
  p.add(a);
  p.add(op(h2d, 1e9, 10e9));
  auto r = run_program(p, true);
  CHECK(r.end_s[1] == Approx(0.1));
  CHECK(r.end_s[0] == Approx(0.2));
}

TEST_CASE("a memory-bound kernel slows by the interference factor while a copy runs", "[engine]") {
  // Kernel: 1 s alone. Copy: 0.5 s. Interference 0.2: for the first 0.5 s the kernel runs at 0.8,
  // finishing 0.4 s of work; the remaining 0.6 s runs at full speed: total 1.1 s.
  Program p;
  p.copy_interference = 0.2;
  auto k = op(compute, 1.0);
  k.memory_bound = true;
  p.add(k);
  p.add(op(d2h, 5e9, 10e9));
  CHECK(run_program(p, false).end_time_s == Approx(1.1));
}

TEST_CASE("buffers are live from their allocating op's start to their last release, and the peak is tracked", "[engine]") {
  Program p;
  int a = p.add_buffer(100, MemCategory::workspace);
  int b = p.add_buffer(50, MemCategory::saved_activations);
  auto first = op(compute, 1.0);
  first.allocs = {a, b};
  first.releases = {a};
  p.add(first);
  auto second = op(compute, 1.0, 1, {0});
  second.releases = {b};
  p.add(second);
  auto r = run_program(p, true);
  CHECK(r.hbm_peak_bytes == 150);
  CHECK(r.hbm_at_peak[static_cast<int>(MemCategory::workspace)] == 100);
  CHECK(r.buffer_free_s[static_cast<std::size_t>(a)] == Approx(1.0));
  CHECK(r.buffer_free_s[static_cast<std::size_t>(b)] == Approx(2.0));
}

TEST_CASE("a prefetch gated by the memory limit waits until memory is freed", "[engine]") {
  // Limit 120 bytes; 100 are live until t = 1 s; a 50-byte prefetch may start only then.
  Program p;
  p.hbm_limit_bytes = 120;
  int big = p.add_buffer(100, MemCategory::workspace);
  int fetched = p.add_buffer(50, MemCategory::offload_buffers);
  auto hold = op(compute, 1.0);
  hold.allocs = {big};
  hold.releases = {big};
  p.add(hold);
  auto copy = op(h2d, 1e9, 10e9);
  copy.gate_bytes = 50;
  copy.allocs = {fetched};
  p.add(copy);
  auto r = run_program(p, true);
  CHECK(r.start_s[1] == Approx(1.0));
  CHECK(r.end_time_s == Approx(1.1));
  CHECK(r.hbm_peak_bytes == 100);
}

TEST_CASE("the compute stream's waiting time is blamed on the stream it waited for", "[engine]") {
  // Copy 0.5 s, then a compute op that needs it: compute waits 0.5 s on h2d.
  Program p;
  p.add(op(h2d, 5e9, 10e9));
  p.add(op(compute, 1.0, 1, {0}));
  auto r = run_program(p, false);
  CHECK(r.exposed_s[h2d] == Approx(0.5));
  CHECK(r.end_time_s == Approx(1.5));
}
