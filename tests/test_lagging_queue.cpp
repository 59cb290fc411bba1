// A queue that falls further behind a loop at every iteration (sim/lagging_queue.hpp): the loop is
// fast-forwarded without it and its ops worked out one after another, with the event-by-event results.
#include <catch2/catch.hpp>

#include <array>
#include <random>
#include <type_traits>
#include <vector>

#include "engine_checks.hpp"
#include "planner/run_config.hpp"
#include "sim/engine.hpp"
#include "sim/program_builder.hpp"

using namespace hbmsim;
using namespace hbmsim::sim;
using test::check_same;

namespace {

struct Loop {
  Program program;
  int dp = -1;                  // the reduce-scatters' queue
  std::vector<int> layers, rs;  // per iteration: its layer and its reduce-scatter
};

// `n` iterations of a 1 ms layer on the compute stream and its 1.2 ms gradient reduce-scatter on a serial
// "dp" queue over a link of its own, then a 0.5 ms optimizer that waits for every reduce-scatter. Nothing
// in the loop waits for the reduce-scatters, which fall 0.2 ms further behind at every layer.
Loop lagging_loop(int n) {
  Loop l;
  Program& p = l.program;
  l.dp = p.queue("dp");
  const int link = p.resource("NIC out", 1e9);
  for (int i = 0; i < n; ++i) {
    const int first = static_cast<int>(p.ops.size());
    l.layers.push_back(p.add(ProgramOp(kComputeQueue, 1e-3)));
    ProgramOp rs(l.dp, 1.2e-3);
    rs.deps.push_back(l.layers.back());
    rs.bytes_sent = 1e6;
    l.rs.push_back(p.add(rs));
    p.use(l.rs.back(), link, 1e9);
    p.iterations.push_back({first, static_cast<int>(p.ops.size())});
  }
  ProgramOp opt(kComputeQueue, 0.5e-3);
  for (int r : l.rs) opt.deps.push_back(r);
  p.add(opt);
  return l;
}

}  // namespace

TEST_CASE("a queue that falls further behind every iteration no longer stops the loop's fast-forward", "[engine][fast_forward]") {
  const Loop l = lagging_loop(40);
  const auto plain = run_program(l.program, true, false);
  // By hand: reduce-scatter i starts when the one before it ends, from 1 ms on, so the last ends at
  // 1 + 40 x 1.2 = 49 ms and the optimizer at 49.5 ms. The dp queue is busy from 1 to 49 ms; the compute
  // stream waits for it from the last layer's end (40 ms) to 49 ms.
  CHECK(plain.end_time_s == Approx(49.5e-3));
  CHECK(plain.busy_s[static_cast<std::size_t>(l.dp)] == Approx(48e-3));
  CHECK(plain.exposed_s[static_cast<std::size_t>(l.dp)] == Approx(9e-3));
  CHECK(plain.bytes_sent[static_cast<std::size_t>(l.dp)] == Approx(40e6));
  const auto ff = run_program(l.program, true, true);
  // The reduce-scatters end 0.2 ms later relative to their layer at every iteration, and some end with a
  // layer (every fifth, at 7, 13, 19 ms, ...: one event, not two): the jump must count those instants once.
  CHECK(ff.replayed_iterations >= 40 - 5);
  check_same(ff, plain);
  check_same(run_program(l.program, false, true), run_program(l.program, false, false));  // jumped in closed form
}

TEST_CASE("a program knows the one queue that uses each link, so a lagging queue's links are seen to be its own", "[engine][fast_forward]") {
  Loop l = lagging_loop(3);
  Program& p = l.program;
  const int nic = 0, idle = p.resource("NIC in", 1e9);
  CHECK(p.resources[static_cast<std::size_t>(nic)].sole_queue == l.dp);  // three reduce-scatters, one queue
  CHECK(p.resources[static_cast<std::size_t>(idle)].sole_queue == kUnusedLink);
  const int tp = p.queue("tp");
  p.use(p.add(ProgramOp(tp, 1e-3)), nic, 1e8);  // another queue's op on the same link
  CHECK(p.resources[static_cast<std::size_t>(nic)].sole_queue == kSharedLink);
  p.use(p.add(ProgramOp(l.dp, 1e-3)), nic, 1e8);  // shared stays shared
  CHECK(p.resources[static_cast<std::size_t>(nic)].sole_queue == kSharedLink);
}

TEST_CASE("a lagging queue's completion that lets an op outside the loop start ends the fast-forward there", "[engine][fast_forward]") {
  Loop l = lagging_loop(40);
  // A probe on a queue of its own waits for reduce-scatter 20, which ends at 1 + 21 x 1.2 = 26.2 ms, in
  // the middle of the loop.
  ProgramOp probe(l.program.queue("probe"), 0.1e-3);
  probe.deps.push_back(l.rs[20]);
  const int at = l.program.add(probe);
  const auto plain = run_program(l.program, true, false);
  CHECK(plain.start_s[static_cast<std::size_t>(at)] == Approx(26.2e-3));
  const auto ff = run_program(l.program, true, true);
  check_same(ff, plain);
  check_same(run_program(l.program, false, true), run_program(l.program, false, false));
  CHECK(ff.replayed_iterations > 0);  // before and after the probe
}

TEST_CASE("a lagging queue that frees memory is simulated, not worked out on its own", "[engine][fast_forward]") {
  Loop l = lagging_loop(40);
  // Each layer keeps a 1 GB gradient its reduce-scatter frees. By hand, at layer j's start (j ms) j + 1
  // buffers have been made and floor((j - 1) / 1.2) reduce-scatters have ended: 9 GB at most (j = 38, 39).
  for (int i = 0; i < 40; ++i) {
    const int b = l.program.add_buffer(1e9, MemCategory::gradients);
    l.program.ops[static_cast<std::size_t>(l.layers[static_cast<std::size_t>(i)])].allocs.push_back(b);
    l.program.ops[static_cast<std::size_t>(l.rs[static_cast<std::size_t>(i)])].releases.push_back(b);
  }
  const auto plain = run_program(l.program, true, false);
  CHECK(plain.memory[0].hbm_peak_bytes == Approx(9e9));
  check_same(run_program(l.program, true, true), plain);
  check_same(run_program(l.program, false, true), run_program(l.program, false, false));
}

TEST_CASE("a loop that waits for a lagging queue's ops is not run ahead of it", "[engine][fast_forward]") {
  Loop l = lagging_loop(40);
  // Layer i + 3 waits for reduce-scatter i: the queue can be at most three layers behind, so the layers
  // slow to its pace (1.2 ms each) and the state repeats in the ordinary way.
  for (int i = 0; i + 3 < 40; ++i)
    l.program.ops[static_cast<std::size_t>(l.layers[static_cast<std::size_t>(i + 3)])].deps.push_back(l.rs[static_cast<std::size_t>(i)]);
  const auto plain = run_program(l.program, true, false);
  CHECK(plain.end_time_s == Approx(49.5e-3));  // the reduce-scatters still run back to back from 1 ms
  const auto ff = run_program(l.program, true, true);
  check_same(ff, plain);
  check_same(run_program(l.program, false, true), run_program(l.program, false, false));
  CHECK(ff.replayed_iterations >= 20);  // once the first layers have slowed to the queue's pace
}

// The peers' configuration (bench/peers.py): data parallelism's reduce-scatters (10.6 ms per layer) fall
// behind the backward (9.6 ms per layer) from its first layer on. Before the lagging queue was worked out
// on its own, 73 of its 160 iterations were replayed (the forward's); now the backward's are too.
TEST_CASE("the peers' configuration fast-forwards its backward while data parallelism falls behind", "[engine][fast_forward]") {
  const nlohmann::json doc = {{"system", "h100-hgx"}, {"model", "llama3.1-70b"}, {"gpus", 128}, {"tp", 8}, {"dp", 16},
                              {"fsdp", 1}, {"seq", 8192}, {"micro_batch", 1}, {"global_batch", 16}, {"policy", "full"},
                              {"sharded_optimizer", true}};
  const auto run = prepare_run(RunConfig::from_json(doc, "peers"));
  const Program p = build_program(run.graph, run.system, run.policy, run.options);
  const auto ff = run_program(p, false, true);
  CHECK(ff.replayed_iterations >= 140);
  check_same(ff, run_program(p, false, false));
  check_same(run_program(p, true, true), run_program(p, true, false));
}

namespace {

// A random loop around a reduce-scatter queue that may fall behind: its pace against the layers', whether
// its link is its own, whether its ops hold memory or wait for a memory gate, whether the loop waits for it
// some iterations back, and whether an op outside the loop waits for one of its ops. Every iteration is the
// same, so only the queue's drift keeps the state from repeating.
Program random_lagging_loop(std::mt19937& rng) {
  auto pick = [&](auto... v) {
    const std::array<std::common_type_t<decltype(v)...>, sizeof...(v)> a{v...};
    return a[std::uniform_int_distribution<std::size_t>(0, a.size() - 1)(rng)];
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  const int n = pick(12, 25, 40, 60);
  const double layer_s = 1e-3, rs_s = layer_s * pick(0.7, 1.0, 1.2, 1.5, 2.5);
  const bool shared_link = chance(0.2), frees = chance(0.2), gated = chance(0.15), probe = chance(0.3);
  const int waits_back = chance(0.2) ? pick(2, 3, 5) : 0;
  Program p;
  // A gate that never closes (the engine forces held-back ops only on copy queues): it still makes the
  // queue's ops something the walk does not vouch for.
  p.hbm_limit_bytes[0] = 1e12;
  const int dp = p.queue("dp"), other = p.queue("other");
  const int link = p.resource("NIC out", 1e9);
  const double bw = chance(0.1) ? 2e9 : 1e9;  // over its link alone, sometimes
  std::vector<int> layers, rs;
  for (int i = 0; i < n; ++i) {
    const int first = static_cast<int>(p.ops.size());
    ProgramOp layer(kComputeQueue, layer_s);
    if (waits_back > 0 && i >= waits_back) layer.deps.push_back(rs[static_cast<std::size_t>(i - waits_back)]);
    const int buf = frees ? p.add_buffer(1e9, MemCategory::gradients) : -1;
    if (buf >= 0) layer.allocs.push_back(buf);
    layers.push_back(p.add(layer));
    ProgramOp r(dp, rs_s);
    r.deps.push_back(layers.back());
    r.bytes_sent = 1e6;
    if (buf >= 0) r.releases.push_back(buf);
    if (gated) r.gate_bytes = 0.5e9;
    rs.push_back(p.add(r));
    p.use(rs.back(), link, bw);
    if (shared_link) {
      ProgramOp o(other, 0.3e-3);
      o.deps.push_back(layers.back());
      const int id = p.add(o);
      p.use(id, link, 1e9);
    }
    p.iterations.push_back({first, static_cast<int>(p.ops.size())});
  }
  if (probe) {
    ProgramOp o(p.queue("probe"), 0.1e-3);
    o.deps.push_back(rs[std::uniform_int_distribution<std::size_t>(0, rs.size() - 1)(rng)]);
    p.add(o);
  }
  ProgramOp opt(kComputeQueue, 0.5e-3);
  for (int r : rs) opt.deps.push_back(r);
  p.add(opt);
  return p;
}

}  // namespace

TEST_CASE("random loops around a queue that may fall behind simulate the same with and without fast-forward", "[engine][fast_forward][invariants]") {
  std::mt19937 rng(2026);
  int long_replays = 0;
  for (int k = 0; k < 300; ++k) {
    const Program p = random_lagging_loop(rng);
    INFO("program " << k);
    const auto ff = run_program(p, true, true);
    check_same(ff, run_program(p, true, false));
    check_same(run_program(p, false, true), run_program(p, false, false));
    long_replays += ff.replayed_iterations * 2 >= static_cast<int>(p.iterations.size());
  }
  CHECK(long_replays >= 100);  // most loops are replayed for at least half their iterations
}
