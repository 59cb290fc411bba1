// Megatron's expert-parallel all-to-all overlap ("combined 1F1B", overlap_moe_expert_parallel_comm) as an issue
// order: where a forward and a backward of different micro-batches follow each other on a device, their layers
// are issued in pairs (the forward's n-th layer with the backward's n-th), and within a pair the compute of the
// two passes alternates at each expert all-to-all, in Megatron's order: the backward's part before its first
// all-to-all, the forward's, the backward's next part, and so on. Each pass's own order is kept on every queue,
// so one pass's all-to-all runs while the other pass computes. Megatron-Core's schedule_layer_1f1b
// (megatron/core/models/common/model_chunk_schedule_plan.py) is the order followed.
#pragma once
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim::sim {

// One pass a device ran, as the builder emitted it: its ops [first_op, end_op) and its layer iterations
// Program::iterations[first_iteration, end_iteration), in the order the pass runs its layers.
struct PassSpan {
  bool forward = true;
  bool merged_with_next = false;  // the schedule runs it merged with the next pass (PipelineTask)
  int microbatch = 0;
  int first_op = 0, end_op = 0;
  int first_iteration = 0, end_iteration = 0;
};

// Reorders the ops of each pass the schedule merges with the next (PassSpan::merged_with_next), together with
// that next pass's, within `order` (the program's issue order, the ops' indices; a pair's ops are contiguous
// there). `device` names the compute and ep queues the pairing reads.
void merge_passes(const Program& program, int device, const std::vector<PassSpan>& passes, std::vector<int>& order);

}  // namespace hbmsim::sim
