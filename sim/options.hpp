// How the step is scheduled: the XLA and framework switches the simulator models.
#pragma once

namespace hbmsim {

// Where the optimizer state lives and where its update runs. off: in HBM, updated on the GPU. device: in pinned
// host memory, streamed through HBM for the update on the GPU (MaxText optimizer_memory_host_offload). host: in
// host memory, updated by the host CPU, gradients copied out and parameters back in (ZeRO-Offload's CPU Adam).
enum class OptimizerOffload { off, device, host };

struct SimOptions {
  bool lhs = true;                   // xla_gpu_enable_latency_hiding_scheduler
  bool pipelined_transfers = false;  // xla_gpu_enable_pipelined_host_offloading
  double memory_limit_slop = 0.95;   // xla_gpu_memory_limit_slop_factor / 100
  // A step estimated to need more simulated ops is refused before it is built (seconds and gigabytes above it).
  std::int64_t max_ops = 4'000'000;
  bool pipelined_collectives = true; // xla_gpu_enable_pipelined_all_gather: FSDP gathers one layer ahead
  // Layers of backward iterations a gradient reduce-scatter may run into (its input is freed by the first op
  // that many iterations on): 1, or 2 with pipelined collectives.
  int reduce_scatter_lag() const { return pipelined_collectives ? 2 : 1; }
  bool double_buffering = false;     // xla_gpu_enable_while_loop_double_buffering: scan bodies hold two layers
  // Tensor-parallel all-gathers and reduce-scatters run chunk by chunk beside their GEMM (Transformer
  // Engine's userbuffers, XLA's collective matmul): only the first of tp chunks is exposed.
  bool tp_comm_overlap = false;
  // Gradient sync over the data-parallel axes bucketed per layer and issued as each layer's backward ends
  // (Megatron overlap_grad_reduce, DDP buckets); off: all of it after the backward pass.
  bool dp_overlap = true;
  // FSDP gathers a layer's weights for every micro-batch's forward and backward and frees them after each
  // use; off: once per step, kept until the layer's last backward (more memory, less traffic).
  bool reshard_weights = true;
  OptimizerOffload optimizer_offload = OptimizerOffload::off;
  // Parameters in pinned host memory: each weight gather starts from its shard copied in, and the update
  // streams them through HBM (or runs where they are, with optimizer_offload host).
  bool parameter_offload = false;
  // Activation offload copies follow Transformer Engine's CPU offload (Megatron's cpu_offloading; TE 2.10's
  // cpu_offload.py) instead of XLA's schedule: the copies of each direction run one after another in issue
  // order; of a pass of n layers, N of which offload, a layer keeps its device copies until the forward of
  // the layer n - N on, which waits for its D2H; its reload is issued at the start of the backward of the
  // layer n - 1 - N on, with no memory gate, and each reader waits for its own tensor. lhs and
  // pipelined_transfers do not apply to these copies.
  bool te_offload = false;
  // Megatron's expert-parallel all-to-all overlap (overlap_moe_expert_parallel_comm, "combined 1F1B"): a
  // forward and a backward of different micro-batches that follow each other on a device run merged layer by
  // layer, each pass's expert all-to-alls issued beside the other pass's compute (the build's issue order,
  // sim/program_builder.cpp).
  bool ep_overlap = false;
  // Megatron's delay_wgrad_compute (needs ep_overlap): each module's weight-gradient GEMMs after its
  // input-gradient chain (TemplatePlan::delay_wgrad).
  bool delay_wgrad = false;
  // Megatron (PyTorch) runs a layer's ops in program order, with no latency-hiding scheduler: `lhs` does not
  // apply, and a collective blocks the compute stream unless a library overlaps it (the CP ring; the expert
  // all-to-all under ep_overlap; with tp_comm_overlap Transformer Engine's userbuffers, which expose one of tp
  // chunks of a forward tp collective and hide the backward ones under the dgrad and wgrad GEMMs they pair).
  bool program_order = false;
  // Pipeline sends block both ends (Megatron's non-interleaved schedule, which refuses overlap_p2p_comm and
  // batches each send with the receive that follows it, then waits for both): a stage posts a receive in the
  // call that ends its previous pass (StageBuilder::build), and its compute goes on only once its send is done.
  // Off: a receive is posted as the pass before starts, and a stage waits for its last send each way only
  // before its next pass that way (Megatron's p2p wait handles, XLA's collective-permute-done).
  bool blocking_p2p = false;
  bool record_trace = false;
  // > 0: the run ends once a device's live HBM exceeds it (a search's shortcut: the report then says the step does
  // not fit, StepReport::stopped, and its other figures cover only the time until then).
  double stop_above_hbm_bytes = 0;
  // Copy repeating layer iterations instead of building them (sim/instances.hpp) and replay their events
  // instead of simulating them (sim/engine.hpp); same program, same results. Off: the plain run.
  bool fast_forward = true;
};

}  // namespace hbmsim
