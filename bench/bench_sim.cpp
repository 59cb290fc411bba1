// Google Benchmark figures for the simulator core (issue 9). `hbmsim bench --json` reports the headline set.
#include <benchmark/benchmark.h>

#include "planner/reproduce.hpp"

using namespace hbmsim;

namespace {

// The measured GB200 runs' configurations (data/reference/seed_configs.json).
RunConfig dsv3() { return reference_config("dsv3-offload-lhs-pipe-mbs8"); }
RunConfig llama405b() { return reference_config("llama405b-qkv-offload-lhs"); }

void BM_SimulatePrepared(benchmark::State& state, RunConfig c) {
  auto run = prepare_run(c);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(run.graph, run.system, run.policy, run.options));
}

void BM_PrepareAndSimulate(benchmark::State& state, RunConfig c) {
  for (auto _ : state) benchmark::DoNotOptimize(run_simulation(c));
}

// Cost against the number of layers: a Llama 8B shape with L layers.
void BM_LayersLinear(benchmark::State& state) {
  RunConfig c;
  c.system = "h200-hgx";
  c.gpus = 8;
  c.model = "llama3.1-8b";
  c.policy = "qkv_proj_offloaded";
  auto run = prepare_run(c);
  auto model = run.graph.model;
  model.num_layers = state.range(0);
  auto graph = build_step_graph(model, run.graph.training);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(graph, run.system, run.policy, run.options));
  state.SetComplexityN(state.range(0));
}

void BM_GradAccumLinear(benchmark::State& state) {
  RunConfig c;
  c.system = "h200-hgx";
  c.gpus = 8;
  c.model = "llama3.1-8b";
  c.grad_accum = state.range(0);
  auto run = prepare_run(c);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(run.graph, run.system, run.policy, run.options));
  state.SetComplexityN(state.range(0));
}

}  // namespace

BENCHMARK_CAPTURE(BM_SimulatePrepared, dsv3_step, dsv3())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SimulatePrepared, llama405b_step, llama405b())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PrepareAndSimulate, dsv3_config, dsv3())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PrepareAndSimulate, llama405b_config, llama405b())->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayersLinear)->RangeMultiplier(2)->Range(8, 256)->Complexity(benchmark::oN)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GradAccumLinear)->RangeMultiplier(2)->Range(1, 16)->Complexity(benchmark::oN)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
