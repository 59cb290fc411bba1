// Google Benchmark figures for the simulator core (issue 9). `hbmsim bench --json` reports the headline set.
#include <benchmark/benchmark.h>

#include "planner/bench_configs.hpp"

using namespace hbmsim;

namespace {

void BM_SimulatePrepared(benchmark::State& state, RunConfig c) {
  auto run = prepare_run(c);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(run.graph, run.system, run.policy, run.options));
}

void BM_PrepareAndSimulate(benchmark::State& state, RunConfig c) {
  for (auto _ : state) benchmark::DoNotOptimize(run_simulation(c));
}

// Cost against the number of layers: a Llama 8B shape with L layers.
void BM_LayersLinear(benchmark::State& state) {
  auto run = prepare_run(bench_scaling_base());
  auto model = run.graph.model;
  model.num_layers = state.range(0);
  auto graph = build_step_graph(model, run.graph.training);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(graph, run.system, run.policy, run.options));
  state.SetComplexityN(state.range(0));
}

void BM_GradAccumLinear(benchmark::State& state) {
  RunConfig c = bench_scaling_base();
  c.policy = "full";
  c.grad_accum = state.range(0);
  auto run = prepare_run(c);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(run.graph, run.system, run.policy, run.options));
  state.SetComplexityN(state.range(0));
}

}  // namespace

BENCHMARK_CAPTURE(BM_SimulatePrepared, dsv3_step, bench_dsv3())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SimulatePrepared, dsv3_split_step, bench_dsv3_split())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SimulatePrepared, llama405b_step, bench_llama405b())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SimulatePrepared, llama405b_tp8_cp2_step, bench_llama405b_tp_cp())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SimulatePrepared, llama405b_pp8_mb16_step, bench_llama405b_pp())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PrepareAndSimulate, dsv3_config, bench_dsv3())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PrepareAndSimulate, llama405b_config, bench_llama405b())->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayersLinear)->RangeMultiplier(2)->Range(8, 256)->Complexity(benchmark::oN)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GradAccumLinear)->RangeMultiplier(2)->Range(1, 16)->Complexity(benchmark::oN)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
