// Where the compute stream's time goes (the report's compute_s): its busy time by phase, against the program's
// own op durations and against what a policy recomputes.
#include <catch2/catch.hpp>

#include <array>
#include <map>
#include <string>
#include <vector>

#include "engine_checks.hpp"
#include "helpers.hpp"
#include "planner/bench_configs.hpp"
#include "planner/run_config.hpp"

using namespace hbmsim;

namespace {

using Phases = std::array<double, sim::kComputePhases>;

// Per phase, the solo seconds of the compute ops of device 0, read from the program (not from the engine).
// With names: only ops of a decoder layer (the embedding, head and loss have none) whose name does not start
// with one of `except`.
Phases program_seconds(const sim::Program& p, const std::vector<std::string>* names = nullptr,
                       const std::vector<std::string>& except = {}) {
  Phases s{};
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const auto& op = p.ops[i];
    const auto& q = p.queues[op.queue];
    if (!q.compute || q.device != 0) continue;
    if (names) {
      if (op.layer < 0) continue;
      bool left_out = false;
      for (const auto& e : except) left_out |= (*names)[i].rfind(e + " L", 0) == 0;
      if (left_out) continue;
    }
    s[static_cast<std::size_t>(sim::compute_phase(op.phase))] += op.seconds;
  }
  return s;
}

double at(const Phases& s, sim::ComputePhase c) { return s[static_cast<std::size_t>(c)]; }

// Llama 3.1 8B alone on one H200: no collective, no host copy and no SM-holding kernel, so every compute op runs
// at its solo speed and the stream's time by phase is the sum of its ops' durations.
RunConfig alone(const std::string& policy) {
  RunConfig c = test::llama8b_h200(policy);
  c.gpus = 1;
  c.batch = 1;
  return c;
}

}  // namespace

TEST_CASE("A compute stream that nothing slows spends, per phase, its ops' solo seconds", "[report][phases]") {
  for (const char* policy : {"full", "minimal", "no_recompute"}) {
    INFO(policy);
    auto run = prepare_run(alone(policy));
    const sim::Program p = build_program(run.graph, run.system, run.policy, run.options);
    const sim::EngineResult r = sim::run_program(p, false);
    const Phases want = program_seconds(p);
    REQUIRE(r.compute_phase_s.size() == 1);
    for (int c = 0; c < sim::kComputePhases; ++c) {
      INFO(sim::to_string(static_cast<sim::ComputePhase>(c)));
      CHECK(r.compute_phase_s[0][static_cast<std::size_t>(c)] == Approx(want[static_cast<std::size_t>(c)]).epsilon(1e-9));
    }
    // The report names them, and they add up to the compute stream's busy time.
    const StepReport rep = simulate(run.graph, run.system, run.policy, run.options);
    double sum = 0;
    for (const auto& [phase, s] : rep.compute_s) sum += s;
    CHECK(rep.compute_s.size() == 4);
    CHECK(rep.compute_s.at("forward") == Approx(at(want, sim::ComputePhase::forward)).epsilon(1e-9));
    CHECK(sum == Approx(rep.busy_s.at("compute")).epsilon(1e-9));
    CHECK(rep.compute_s.at("optimizer") > 0);
  }
}

TEST_CASE("Full recompute reruns each decoder layer's forward up to what the backward reads and no_recompute reruns nothing", "[report][phases]") {
  auto run = prepare_run(alone("full"));
  std::vector<std::string> names;
  const sim::Program p = build_program(run.graph, run.system, run.policy, run.options, &names);
  // MaxText's full policy saves only each layer's input: the backward recomputes the layer's forward but for
  // its last projection and residual add, whose outputs no backward op reads (wo's gradient needs its input and
  // the output's gradient). The embedding and the head are not part of the scanned layer and run once.
  const Phases rerun = program_seconds(p, &names, {"wo", "residual_mlp"});
  const StepReport full = simulate(run.graph, run.system, run.policy, run.options);
  CHECK(full.compute_s.at("recompute") == Approx(at(rerun, sim::ComputePhase::forward)).epsilon(1e-9));
  CHECK(full.compute_s.at("recompute") < full.compute_s.at("forward"));
  const StepReport none = run_simulation(alone("no_recompute"));
  CHECK(none.compute_s.at("recompute") == 0);
  CHECK(none.compute_s.at("forward") == Approx(full.compute_s.at("forward")).epsilon(1e-9));
}

TEST_CASE("Phase times do not depend on the fast-forward", "[report][phases][fast_forward]") {
  auto run = prepare_run(bench_llama405b());
  const sim::Program p = build_program(run.graph, run.system, run.policy, run.options);
  const sim::EngineResult ff = sim::run_program(p, false, true), plain = sim::run_program(p, false, false);
  REQUIRE(ff.replayed_iterations > 100);
  test::check_same(ff, plain);
  double sum = 0;
  for (double s : ff.compute_phase_s[0]) sum += s;
  CHECK(sum == Approx(ff.busy_s[static_cast<std::size_t>(p.compute_queue(0))]).epsilon(1e-9));
}

TEST_CASE("Each pipeline stage's phases add up to its compute time, and the step's are their mean", "[report][phases][pipeline]") {
  RunConfig c = test::llama8b_h200("full");
  c.tp = 2;
  c.pp = 4;
  c.microbatches = 8;
  c.pp_schedule = "zb-h1";  // the weight-gradient pass counts as backward
  const StepReport r = run_simulation(c);
  REQUIRE(r.stages.size() == 4);
  // The split backward's weight-gradient pass is backward work: the forward is 1F1B's.
  c.pp_schedule = "1f1b";
  const StepReport one_f_one_b = run_simulation(c);
  for (std::size_t s = 0; s < 4; ++s)
    CHECK(r.stages[s].compute_s.at("forward") == Approx(one_f_one_b.stages[s].compute_s.at("forward")).epsilon(1e-9));
  std::map<std::string, double> mean;
  for (const auto& st : r.stages) {
    double sum = 0;
    for (const auto& [phase, s] : st.compute_s) {
      sum += s;
      mean[phase] += s / 4;
    }
    CHECK(sum == Approx(st.compute_busy_s).epsilon(1e-9));
  }
  for (const auto& [phase, s] : mean) CHECK(r.compute_s.at(phase) == Approx(s).epsilon(1e-12));
  // Every stage runs its 8 layers' recompute; only the last one the head and loss.
  CHECK(r.stages[0].compute_s.at("recompute") == Approx(r.stages[3].compute_s.at("recompute")).epsilon(1e-9));
  CHECK(r.stages[3].compute_s.at("forward") > r.stages[1].compute_s.at("forward"));
}
