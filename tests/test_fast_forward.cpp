// Fast-forward (sim/engine.hpp, sim/repeats.hpp): replaying repeating loop iterations gives the event-by-event
// results, on hand-built loops and on every built-in configuration.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "planner/bench_configs.hpp"
#include "planner/reproduce.hpp"
#include "sim/engine.hpp"
#include "sim/program_builder.hpp"
#include "engine_checks.hpp"
#include "helpers.hpp"
#include "random_configs.hpp"

using namespace hbmsim;
using namespace hbmsim::sim;
using test::check_same;

namespace {

// A loop of `n` iterations: a 1 ms layer on the compute stream that saves `saved_bytes` (never freed when
// `keep`), and a 0.5 ms copy of them on a copy engine that frees them; the next layer waits for nothing
// but the stream. Returns the program with its iterations marked.
Program layer_loop(int n, double saved_bytes, bool keep, double gate_bytes = 0, double limit_bytes = 0) {
  Program p;
  const int copies = p.queue("d2h", QueueKind::concurrent, true);
  const int link = p.resource("host link", 1e9);
  p.hbm_limit_bytes[0] = limit_bytes;
  for (int i = 0; i < n; ++i) {
    const int first = static_cast<int>(p.ops.size());
    ProgramOp layer(kComputeQueue, 1e-3);
    layer.allocs.push_back(p.add_buffer(saved_bytes, MemCategory::saved_activations));
    const int l = p.add(layer);
    ProgramOp copy(copies, 0.5e-3);
    copy.deps.push_back(l);
    copy.gate_bytes = gate_bytes;
    if (!keep) copy.releases.push_back(p.ops[static_cast<std::size_t>(l)].allocs[0]);
    const int c = p.add(copy);
    p.use(c, link, 1e9);
    p.iterations.push_back({first, static_cast<int>(p.ops.size())});
  }
  return p;
}

// A loop of `n` layers of two shapes: each a 1 ms compute op whose 1 GB of saved activations a 0.5 ms copy
// frees, the layers where `longer(i)` holds with a second 0.5 ms compute op after the first.
template <class Longer>
Program shaped_loop(int n, Longer longer) {
  Program p;
  const int copies = p.queue("d2h", QueueKind::concurrent, true);
  const int link = p.resource("host link", 1e9);
  for (int i = 0; i < n; ++i) {
    const int first = static_cast<int>(p.ops.size());
    ProgramOp layer(kComputeQueue, 1e-3);
    const int saved = p.add_buffer(1e9, MemCategory::saved_activations);
    layer.allocs.push_back(saved);
    const int l = p.add(layer);
    if (longer(i)) p.add(ProgramOp(kComputeQueue, 0.5e-3));
    ProgramOp copy(copies, 0.5e-3);
    copy.deps.push_back(l);
    copy.releases.push_back(saved);
    const int c = p.add(copy);
    p.use(c, link, 1e9);
    p.iterations.push_back({first, static_cast<int>(p.ops.size())});
  }
  return p;
}

// The measured reference runs and the bench's configurations, by name, and Megatron's offload on Transformer
// Engine's schedule (its reloads and waits reach across many layers): the GB200 recipe's 40 of 80 layers, a
// range that is not the first layers, six micro-steps, and a pipeline.
std::vector<std::pair<std::string, RunConfig>> builtin_configs() {
  std::vector<std::pair<std::string, RunConfig>> configs;
  for (auto& r : load_reference_runs()) configs.emplace_back(r.id, r.config);
  configs.emplace_back("llama405b tp8 cp2", bench_llama405b_tp_cp());
  configs.emplace_back("llama405b pp8 x 16", bench_llama405b_pp());
  configs.emplace_back("llama 8B shape", bench_scaling_base());
  RunConfig te = test::llama70b_gb200("no_recompute");
  te.framework = "megatron";
  te.offload_layers = 40;
  configs.emplace_back("llama 70B megatron, 40 layers offloaded", te);
  auto megatron = [] {
    RunConfig c = bench_scaling_base();
    c.framework = "megatron";
    c.policy = "minimal";
    return c;
  };
  RunConfig range = megatron();
  range.layer_policies = "8-19:minimal_offloaded";
  configs.emplace_back("llama 8B shape megatron, layers 8-19 offloaded", range);
  RunConfig steps = megatron();
  steps.offload_layers = 10;
  steps.grad_accum = 6;
  configs.emplace_back("llama 8B shape megatron, 10 layers offloaded, 6 micro-steps", steps);
  RunConfig stages = megatron();
  stages.offload_layers = 6;
  stages.pp = 2;
  stages.batch = 2;
  stages.microbatches = 4;
  configs.emplace_back("llama 8B shape megatron, 6 layers offloaded, pp 2", stages);
  // A seeded random draw that deadlocked: Llama 405B over pp 4 x vp 2, its first 4 layers recomputed and
  // the rest offloaded, weights kept gathered (the last chunk's recomputed and offloaded layers have as many ops).
  RunConfig mixed;
  mixed.model = "llama3.1-405b";
  mixed.system = "gb300-nvl72";
  mixed.calibration = "gb200-fitted";
  mixed.gpus = 8;
  mixed.tp = 2;
  mixed.pp = 4;
  mixed.vp = 2;
  mixed.microbatches = 8;
  mixed.batch = 4;
  mixed.seq = 1024;
  mixed.embedding_as_layer = mixed.loss_as_layer = true;
  mixed.policy = "minimal_offloaded";
  mixed.recompute_layers = 4;
  mixed.lhs = false;
  mixed.reshard_weights = false;
  mixed.tp_comm_overlap = true;
  mixed.sequence_parallel = false;
  mixed.pipelined_transfers = true;
  mixed.grad_reduce_dtype = "bf16";
  mixed.weights = "fp8";
  configs.emplace_back("llama 405B pp 4 x vp 2, 4 layers recomputed and the rest offloaded", mixed);
  // Layer patterns: sliding-window and full layers alternating (GPT-OSS, period 2) and five windowed layers
  // to one full (Gemma 3, period 6), copied and fast-forwarded a pattern at a time.
  for (const char* model : {"hf/gpt-oss-20b.config.json", "hf/gemma-3-27b.config.json"}) {
    RunConfig c = bench_scaling_base();
    c.model = model;
    c.seq = 8192;
    configs.emplace_back(model, c);
  }
  // Llama 4 Maverick: dense and MoE layers in turn (no two iterations in a row of one shape), chunked attention
  // on three of four.
  RunConfig maverick = bench_scaling_base();
  maverick.model = "hf/llama4-maverick-17b-128e.config.json";
  maverick.gpus = 16;
  maverick.ep = 8;
  maverick.seq = 16384;
  configs.emplace_back(maverick.model, maverick);
  // Qwen3-Next: three Gated DeltaNet layers to one gated attention layer (stretches of three of one shape),
  // tp splitting both mixers, experts over 8.
  RunConfig next = bench_scaling_base();
  next.model = "hf/qwen3-next-80b-a3b.config.json";
  next.gpus = 16;
  next.tp = 2;
  next.ep = 8;
  next.seq = 8192;
  configs.emplace_back(next.model, next);
  RunConfig gemma = bench_scaling_base();
  gemma.model = "hf/gemma-3-1b.config.json";
  gemma.policy = "minimal_offloaded";
  gemma.grad_accum = 4;
  configs.emplace_back("gemma 3 1B offloaded, 4 micro-steps", gemma);
  // Reloads that outlast a backward layer on H200's PCIe, so a copy runs beside the next layer's counterpart:
  // Mixtral 8x7B, pp 2 ZB-H1, its first 20 layers offloaded (a random plan command met a deadlock here, and
  // then a heap corruption, before move_on read the running ops' state before writing any).
  RunConfig slow_reloads;
  slow_reloads.model = "hf/mixtral-8x7b.config.json";
  slow_reloads.system = "h200-hgx";
  slow_reloads.gpus = 32;
  slow_reloads.seq = 2048;
  slow_reloads.pp = 2;
  slow_reloads.pp_schedule = "zb-h1";
  slow_reloads.microbatches = 4;
  slow_reloads.ep = 4;
  slow_reloads.policy = "selective";
  slow_reloads.batch = 4;
  slow_reloads.offload_layers = 20;
  configs.emplace_back("mixtral ZB-H1, reloads longer than a layer", slow_reloads);
  return configs;
}

}  // namespace

TEST_CASE("a loop of identical layers is replayed, with the event-by-event results", "[engine][fast_forward]") {
  const Program p = layer_loop(20, 1e9, false);
  const auto ff = run_program(p, true, true);
  const auto plain = run_program(p, true, false);
  // By hand: 20 layers back to back (20 ms), the last copy 0.5 ms after the last layer; while layer i runs,
  // copy i-1 still holds its 1 GB for 0.5 ms, so 2 GB are live at the peak.
  CHECK(plain.end_time_s == Approx(20.5e-3));
  CHECK(plain.memory[0].hbm_peak_bytes == Approx(2e9));
  CHECK(plain.replayed_iterations == 0);
  // Two iterations to see the state repeat, two kept back for the loop's end: the rest are replayed.
  CHECK(ff.replayed_iterations >= 20 - 5);
  check_same(ff, plain);
  check_same(run_program(p, false, true), run_program(p, false, false));  // jumped in closed form
}

TEST_CASE("a memory gate that closes part-way through a loop stops the replay where it would change", "[engine][fast_forward]") {
  // Each layer keeps 1 GB; each copy is gated on 0.5 GB of headroom under an 8.2 GB limit: from the 8th
  // layer on, the copies wait, and the loop is no longer what it was.
  const Program p = layer_loop(20, 1e9, true, 0.5e9, 8.2e9);
  const auto ff = run_program(p, true, true);
  const auto plain = run_program(p, true, false);
  check_same(ff, plain);
  check_same(run_program(p, false, true), run_program(p, false, false));  // jumped in closed form
  // The gated copies start only when nothing else runs (the last one at the end of the last layer).
  CHECK(plain.end_time_s > 20.5e-3);
}

TEST_CASE("iterations marked as builder copies are still checked for what a copy cannot vouch for", "[engine][fast_forward]") {
  // The gated loop: each copy waits for 0.5 GB of headroom under a 2.9 GB limit, which it has (2 GB live
  // while layer i + 1 runs). Iterations 3 on are marked as copies (Program::Iteration::copy_of), and layer
  // 12's buffer is also released by an op after the loop, so its copy no longer frees it: from layer 13 on
  // 3 GB are live and every copy is held back until nothing else runs. By hand: layers end at 20 ms with
  // buffers 12-19 live (8 GB), the seven held copies are forced one after another (3.5 ms), then the 1 ms
  // op: 24.5 ms. A repeat check that trusted the marks would replay the ungated copies past layer 12.
  Program p = layer_loop(20, 1e9, false, 0.5e9, 2.9e9);
  for (std::size_t i = 3; i < p.iterations.size(); ++i) p.iterations[i].copy_of = 1;
  const int layer12 = p.iterations[12].first;
  ProgramOp tail(kComputeQueue, 1e-3);
  tail.deps.push_back(static_cast<int>(p.ops.size()) - 1);
  tail.releases.push_back(p.ops[static_cast<std::size_t>(layer12)].allocs[0]);
  p.add(tail);
  const auto ff = run_program(p, true, true);
  const auto plain = run_program(p, true, false);
  CHECK(plain.memory[0].hbm_peak_bytes == Approx(8e9));
  CHECK(plain.end_time_s == Approx(24.5e-3));
  check_same(ff, plain);
  check_same(run_program(p, false, true), run_program(p, false, false));  // jumped in closed form
  CHECK(ff.replayed_iterations > 0);  // the iterations before layer 12 repeat
}

TEST_CASE("a loop whose body holds two different layers is replayed two layers at a time", "[engine][fast_forward]") {
  Program p = layer_loop(24, 1e9, false);
  for (std::size_t i = 0; i < p.ops.size(); i += 4) p.ops[i].seconds = 2e-3;  // every other layer is longer
  const auto ff = run_program(p, true, true);
  check_same(ff, run_program(p, true, false));
  CHECK(ff.replayed_iterations >= 12 - 5);  // pairs of layers
  // A layer that differs from all others (the 15th) splits the loop; the results still agree.
  p.ops[28].seconds = 3e-3;
  check_same(run_program(p, true, true), run_program(p, true, false));
  check_same(run_program(p, false, true), run_program(p, false, false));
}

TEST_CASE("a loop of layers of alternating shapes is replayed a pair of layers at a time", "[engine][fast_forward]") {
  // 24 layers: each a 1 ms compute op whose 1 GB of saved activations a 0.5 ms copy frees; the odd ones have a
  // second 0.5 ms compute op after the first (a MoE layer after a dense one), so no two iterations in a row have
  // one shape and only pairs repeat.
  const Program p = shaped_loop(24, [](int i) { return i % 2 == 1; });
  const auto plain = run_program(p, true, false);
  // By hand: 12 x 1 ms + 12 x 1.5 ms of compute; the last copy ends with the last second op. A dense layer's
  // copy still holds its 1 GB while the next layer starts: 2 GB at the peak.
  CHECK(plain.end_time_s == Approx(30e-3));
  CHECK(plain.memory[0].hbm_peak_bytes == Approx(2e9));
  const auto ff = run_program(p, true, true);
  CHECK(ff.replayed_iterations >= 12 - 5);  // pairs of layers
  check_same(ff, plain);
  check_same(run_program(p, false, true), run_program(p, false, false));
}

TEST_CASE("a pattern of three layers of one shape and one of another is replayed four layers at a time", "[engine][fast_forward]") {
  // 48 layers as Qwen3-Next's: three with a second 0.5 ms compute op (Gated DeltaNet layers), then one without
  // (attention), each saving 1 GB that a 0.5 ms copy frees. Stretches of three iterations of one shape are each
  // too short to replay alone; the pattern of four repeats.
  const Program p = shaped_loop(48, [](int i) { return i % 4 != 3; });
  const auto plain = run_program(p, true, false);
  // By hand: 36 x 1.5 ms + 12 x 1 ms of compute, the last layer's copy ending 0.5 ms after it.
  CHECK(plain.end_time_s == Approx(66.5e-3));
  const auto ff = run_program(p, true, true);
  CHECK(ff.replayed_iterations >= 12 - 5);  // groups of four layers
  check_same(ff, plain);
  check_same(run_program(p, false, true), run_program(p, false, false));
}

TEST_CASE("a queue moves on by the ops the repeating iterations put on it, not the run's first iteration's", "[engine][fast_forward]") {
  // Three layers of a 1 ms compute op and its copy, then twelve of a 1 ms and a 0.2 ms compute op: every
  // iteration has two ops, so the engine takes all fifteen as one run, of which the last twelve repeat
  // (Megatron's recomputed layers after offloaded ones; a seeded random pipeline deadlocked this way: the
  // compute stream moved on by one op per replayed iteration, not two, and ran replayed ops again).
  // By hand: 3 ms, then 12 x 1.2 ms: 17.4 ms; the copies end by 3.5 ms.
  Program p;
  const int copies = p.queue("d2h", QueueKind::concurrent, true);
  const int link = p.resource("host link", 1e9);
  for (int i = 0; i < 15; ++i) {
    const int first = static_cast<int>(p.ops.size());
    ProgramOp layer(kComputeQueue, 1e-3);
    const int saved = p.add_buffer(1e9, MemCategory::saved_activations);
    layer.allocs.push_back(saved);
    const int l = p.add(layer);
    const bool offloaded = i < 3;
    ProgramOp second(offloaded ? copies : kComputeQueue, offloaded ? 0.5e-3 : 0.2e-3);
    second.deps.push_back(l);
    second.releases.push_back(saved);
    const int s = p.add(second);
    if (offloaded) p.use(s, link, 1e9);
    p.iterations.push_back({first, static_cast<int>(p.ops.size())});
  }
  const auto plain = run_program(p, true, false);
  CHECK(plain.end_time_s == Approx(17.4e-3));
  const auto ff = run_program(p, true, true);
  CHECK(ff.replayed_iterations > 0);
  check_same(ff, plain);
  check_same(run_program(p, false, true), run_program(p, false, false));  // jumped in closed form
}

TEST_CASE("a copy that outlasts an iteration is moved on beside its counterpart one iteration on", "[engine][fast_forward]") {
  // 20 layers of a 1 ms compute op, each saving 1 GB that a 2.5 ms copy (on a link wide enough for all of them)
  // frees: at every iteration's start three copies are running, each one iteration on from the next, so a
  // replay moves a running op onto another running op's place. By hand: the last copy ends 2.5 ms after the
  // last layer, 22.5 ms; just after a layer starts its buffer and the three copies' are live: 4 GB. (Here the
  // running set happens to list the newer copy first, which the old in-place move survived; the Mixtral ZB-H1
  // configuration in builtin_configs() lists the older first, and failed.)
  Program p;
  const int copies = p.queue("d2h", QueueKind::concurrent, true);
  const int link = p.resource("host link", 10e9);
  for (int i = 0; i < 20; ++i) {
    const int first = static_cast<int>(p.ops.size());
    ProgramOp layer(kComputeQueue, 1e-3);
    const int saved = p.add_buffer(1e9, MemCategory::saved_activations);
    layer.allocs.push_back(saved);
    const int l = p.add(layer);
    ProgramOp copy(copies, 2.5e-3);
    copy.deps.push_back(l);
    copy.releases.push_back(saved);
    p.use(p.add(copy), link, 1e9);
    p.iterations.push_back({first, static_cast<int>(p.ops.size())});
  }
  const auto plain = run_program(p, true, false);
  CHECK(plain.end_time_s == Approx(22.5e-3));
  CHECK(plain.memory[0].hbm_peak_bytes == Approx(4e9));
  const auto ff = run_program(p, true, true);
  CHECK(ff.replayed_iterations > 0);
  check_same(ff, plain);
  const auto jumped = run_program(p, false, true);
  CHECK(jumped.replayed_iterations > 0);
  check_same(jumped, run_program(p, false, false));  // jumped in closed form
}

TEST_CASE("every built-in configuration simulates the same with and without fast-forward", "[engine][fast_forward]") {
  auto configs = builtin_configs();
  for (auto& [name, c] : configs) {
    SECTION(name) {
      auto run = prepare_run(c);
      const Program p = build_program(run.graph, run.system, run.policy, run.options);
      const auto plain = run_program(p, true, false);
      check_same(run_program(p, true, true), plain);
      // Without a recorded timeline the intervals after the first are jumped in closed form.
      check_same(run_program(p, false, true), run_program(p, false, false));
    }
  }
}

namespace {

// Two programs are the same op for op, buffer for buffer.
void check_same_program(const Program& a, const Program& b) {
  REQUIRE(a.ops.size() == b.ops.size());
  REQUIRE(a.buffers.size() == b.buffers.size());
  CHECK(a.uses.size() == b.uses.size());
  REQUIRE(a.gate_lifts.size() == b.gate_lifts.size());
  REQUIRE(a.queues.size() == b.queues.size());
  REQUIRE(a.resources.size() == b.resources.size());
  std::size_t differing = 0, first = a.ops.size();
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const ProgramOp &x = a.ops[i], &y = b.ops[i];
    const bool same = x.queue == y.queue && x.seconds == y.seconds && x.executed_flops == y.executed_flops &&
                      x.bytes_sent == y.bytes_sent && x.gate_bytes == y.gate_bytes && x.priority == y.priority &&
                      x.layer == y.layer && x.memory_bound == y.memory_bound && x.phase == y.phase &&
                      x.use_begin == y.use_begin && x.use_count == y.use_count &&
                      std::vector<int>(x.deps.begin(), x.deps.end()) == std::vector<int>(y.deps.begin(), y.deps.end()) &&
                      std::vector<int>(x.allocs.begin(), x.allocs.end()) == std::vector<int>(y.allocs.begin(), y.allocs.end()) &&
                      std::vector<int>(x.releases.begin(), x.releases.end()) == std::vector<int>(y.releases.begin(), y.releases.end());
    if (!same) {
      ++differing;
      first = std::min(first, i);
    }
  }
  INFO("first differing op " << first);
  CHECK(differing == 0);
  for (std::size_t u = 0; u < std::min(a.uses.size(), b.uses.size()); ++u) {
    CHECK(a.uses[u].resource == b.uses[u].resource);
    CHECK(a.uses[u].bytes_per_s == b.uses[u].bytes_per_s);
  }
  for (std::size_t k = 0; k < a.buffers.size(); ++k) {
    CHECK(a.buffers[k].bytes == b.buffers[k].bytes);
    CHECK(a.buffers[k].category == b.buffers[k].category);
    CHECK(a.buffers[k].host == b.buffers[k].host);
    CHECK(a.buffers[k].device == b.buffers[k].device);
  }
  for (std::size_t k = 0; k < a.gate_lifts.size(); ++k) {
    CHECK(a.gate_lifts[k].op == b.gate_lifts[k].op);
    CHECK(a.gate_lifts[k].after == b.gate_lifts[k].after);
  }
  REQUIRE(a.iterations.size() == b.iterations.size());
  for (std::size_t k = 0; k < a.iterations.size(); ++k) {
    CHECK(a.iterations[k].first == b.iterations[k].first);
    CHECK(a.iterations[k].end == b.iterations[k].end);
    CHECK(a.iterations[k].side_first == b.iterations[k].side_first);
  }
  CHECK(a.resident == b.resident);
  CHECK(a.hbm_limit_bytes == b.hbm_limit_bytes);
}

}  // namespace

// The builder copies repeating layer iterations (sim/instances.hpp) unless asked for the plain build: the
// program must be the one it builds iteration by iteration, on every built-in configuration and on the
// schedule switches that change a layer's shape.
TEST_CASE("layer iterations copied rather than built give the program built layer by layer", "[engine][fast_forward]") {
  auto configs = builtin_configs();
  RunConfig db = bench_scaling_base();
  db.double_buffering = true;
  configs.emplace_back("llama 8B double-buffered", db);
  RunConfig pipelined = bench_scaling_base();
  pipelined.pipelined_transfers = true;
  pipelined.grad_accum = 2;
  configs.emplace_back("llama 8B pipelined transfers, 2 micro-steps", pipelined);
  RunConfig nolhs = bench_scaling_base();
  nolhs.lhs = false;
  nolhs.pipelined_collectives = false;
  configs.emplace_back("llama 8B without LHS", nolhs);
  // Layers copied from the same layer of earlier micro-steps as well as from earlier layers.
  RunConfig accumulating = bench_scaling_base();
  accumulating.grad_accum = 6;
  configs.emplace_back("llama 8B, 6 micro-steps", accumulating);
  for (auto& [name, c] : configs) {
    SECTION(name) {
      auto run = prepare_run(c);
      SimOptions plain = run.options;
      plain.fast_forward = false;
      const Program copied = build_program(run.graph, run.system, run.policy, run.options);
      const Program built = build_program(run.graph, run.system, run.policy, plain);
      check_same_program(copied, built);
    }
  }
}

namespace {

// Over `count` seeded random layouts, policies (per-layer offload counts among them), schedule switches and
// pipelines, each with one of `models` in place of its own (none: its own): a copy the builder should not
// have made shows up as a program that differs, one the engine should not have trusted as results that
// differ. Returns the configurations checked (draws that are bad input are skipped); `longest` receives the
// longest period any iteration was copied at.
int check_random_copies(std::uint32_t seed, int count, const std::vector<std::string>& models, int& longest) {
  std::mt19937 rng(seed);
  int checked = 0, tries = 0;
  while (checked < count && tries++ < 4000) {
    RunConfig c = checked % 4 == 3 ? test::random_pipeline(rng) : test::random_config(rng);
    // Half with a memory lever or Megatron's settings on top (recomputed layers among offloaded ones, ...).
    if (checked % 2 == 0) test::add_levers(rng, c);
    if (checked % 3 == 1) c.offload_layers = test::pick<std::int64_t>(rng, {1, 5, 12, 20});
    // Four or more micro-steps: layers are also copied from the same layer a micro-step before.
    if (checked % 4 == 1) c.grad_accum = test::pick<std::int64_t>(rng, {4, 5});
    // Megatron's offload on Transformer Engine's schedule.
    if (checked % 5 == 2) c.framework = "megatron";
    if (!models.empty()) {
      c.model = test::pick(rng, models);
      c.embedding_as_layer = c.loss_as_layer = false;
    }
    PreparedRun run;
    try {
      run = prepare_run(c);
    } catch (const InputError&) {
      continue;
    }
    ++checked;
    INFO(c.to_json().dump());
    SimOptions plain = run.options;
    plain.fast_forward = false;
    const Program copied = build_program(run.graph, run.system, run.policy, run.options);
    const Program built = build_program(run.graph, run.system, run.policy, plain);
    check_same_program(copied, built);
    for (const auto& it : copied.iterations) longest = std::max(longest, it.copy_of);
    // The engine trusts a copy for part of its repeat check (Repeats::copied): fast-forwarding the copied
    // program gives what simulating every event of the built one does.
    check_same(run_program(copied, false, true), run_program(built, false, false));
  }
  return checked;
}

}  // namespace

TEST_CASE("copied layer iterations match the built ones over random configurations", "[engine][fast_forward][invariants]") {
  int longest = 0;
  CHECK(check_random_copies(2026, 160, {}, longest) == 160);
  CHECK(longest == 2);  // double-buffered bodies
}

// Models whose layers alternate plans (sliding-window and full attention: GPT-OSS and Gemma 2 every other
// layer, Gemma 3 one in six; Llama 4 Maverick's chunked and full attention one in four over MoE and dense
// layers in turn) are copied a pattern at a time.
TEST_CASE("copied layer patterns match the built ones over random configurations", "[engine][fast_forward][invariants][window]") {
  int longest = 0;
  CHECK(check_random_copies(2027, 60, {"hf/gpt-oss-20b.config.json", "hf/gemma-2-9b.config.json", "hf/gemma-3-1b.config.json",
                                       "hf/gemma-3-27b.config.json", "hf/llama4-maverick-17b-128e.config.json"}, longest) == 60);
  CHECK(longest == 6);  // Gemma 3's pattern
}

TEST_CASE("fast-forward replays most of a long loop: the 405B reference run", "[engine][fast_forward]") {
  auto run = prepare_run(bench_llama405b());
  const Program p = build_program(run.graph, run.system, run.policy, run.options);
  const auto ff = run_program(p, false, true);
  // 126 layers forward and backward, two per scan body with LHS: at least half the iterations replayed.
  CHECK(ff.replayed_iterations >= 63);
}

TEST_CASE("a layer pattern is copied and fast-forwarded a pattern at a time: Gemma 3 27B", "[engine][fast_forward][window]") {
  // 62 layers, every sixth (5, 11, ..., 59) with full attention and the rest with a 1,024-token window: no
  // two consecutive stretches of single layers repeat, six-layer ones do. A copy at period 6 needs three
  // patterns before it (18 iterations) whose inputs continue one another; the first two layers of each pass
  // read what no later one does (no gather two layers back, the pass's input): so every forward iteration
  // from 20 on, and about as many backward ones, is a copy, and only of the layer six back.
  RunConfig c = bench_scaling_base();
  c.model = "hf/gemma-3-27b.config.json";
  c.seq = 8192;
  auto run = prepare_run(c);
  const Program p = build_program(run.graph, run.system, run.policy, run.options);
  REQUIRE(p.iterations.size() == 2 * 62);
  int at6 = 0, other = 0;
  for (const auto& it : p.iterations) (it.copy_of == 6 ? at6 : other) += it.copy_of > 0;
  CHECK(other == 0);
  CHECK(at6 >= 2 * (62 - 20) - 2);
  // Ten patterns a pass: two to see the state repeat and two kept back at the loop's end leave about six
  // to replay in each pass.
  const auto ff = run_program(p, false, true);
  CHECK(ff.replayed_iterations >= 2 * (10 - 5));
  check_same(ff, run_program(p, false, false));
}

TEST_CASE("a loop whose body holds six layers, one of them different, is replayed six layers at a time", "[engine][fast_forward]") {
  // Layers 3, 9, ..., 45 take 2 ms, the others 1 ms: the loop's middle layers (23 to 25) look alike, so only
  // a stretch of six layers tells the period.
  Program p = layer_loop(48, 1e9, false);
  for (std::size_t i = 2 * 3; i < p.ops.size(); i += 2 * 6) p.ops[i].seconds = 2e-3;
  const auto plain = run_program(p, true, false);
  // By hand: 8 x (5 x 1 + 2) ms of layers, the last copy 0.5 ms after the last layer.
  CHECK(plain.end_time_s == Approx(56.5e-3));
  const auto ff = run_program(p, true, true);
  CHECK(ff.replayed_iterations >= 8 - 5);  // groups of six layers
  check_same(ff, plain);
  check_same(run_program(p, false, true), run_program(p, false, false));
}
