// The configurations hbmsim's speed figures are measured on, shared by `hbmsim bench` and the Google
// Benchmark target so that both time the same steps.
#pragma once
#include "planner/reproduce.hpp"

namespace hbmsim {

// Two of the measured GB200 runs (data/reference/seed_configs.json). The DeepSeek-V3 step is timed without
// the seed's MoE batch split (the workload the speed target was set on) and, separately, as reproduced
// with it: the split doubles the ops of every MoE layer.
inline RunConfig bench_dsv3_split() { return reference_config("dsv3-offload-lhs-pipe-mbs8"); }
inline RunConfig bench_dsv3() {
  RunConfig c = bench_dsv3_split();
  c.moe_batch_split = 1;
  return c;
}
inline RunConfig bench_llama405b() { return reference_config("llama405b-qkv-offload-lhs"); }
// The same run laid out as tensor parallelism 8 with sequence parallelism and context parallelism 2 (FSDP 8
// over the rest): every layer adds tensor-parallel collectives and a K/V all-gather. Per-device batch 2 is
// 32 sequences per replica.
inline RunConfig bench_llama405b_tp_cp() {
  RunConfig c = bench_llama405b();
  c.fsdp = 0;
  c.tp = 8;
  c.cp = 2;
  return c;
}

// The same run as a pipeline: tensor parallelism 4, 8 stages (the embedding and the loss counted as a
// layer each, so 126 layers split 15/16 x 6/15) and 16 micro-batches of 4 sequences, 1F1B: every stage is
// simulated as its own device, 8 x 16 x 2 passes.
inline RunConfig bench_llama405b_pp() {
  RunConfig c = bench_llama405b();
  c.fsdp = 0;
  c.tp = 4;
  c.pp = 8;
  c.microbatches = 16;
  c.embedding_as_layer = c.loss_as_layer = true;
  return c;
}

// The scaling shape: Llama 3.1 8B on 8 H200s with QKV offload, varied in layers or accumulation steps.
inline RunConfig bench_scaling_base() {
  RunConfig c;
  c.system = "h200-hgx";
  c.gpus = 8;
  c.model = "llama3.1-8b";
  c.policy = "qkv_proj_offloaded";
  return c;
}

}  // namespace hbmsim
