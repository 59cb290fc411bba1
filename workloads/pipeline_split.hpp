// Which layers each pipeline chunk (virtual stage) holds. Chunk k of pp x vp runs on stage k % pp as that
// stage's chunk k / pp (Megatron's interleaving: a rank holds every pp-th chunk of the model).
#pragma once
#include <cstdint>
#include <vector>

#include "workloads/model.hpp"
#include "workloads/training.hpp"

namespace hbmsim {

struct PipelineChunk {
  std::int64_t first_layer = 0, end_layer = 0;  // layers [first_layer, end_layer)
  int stage = 0;                                // the pp rank that runs it
  bool embedding = false, head = false;         // the model's first chunk looks up the input, its last one the loss
  std::int64_t layers() const { return end_layer - first_layer; }
};

// The chunks in model order; errors name the field that makes the split impossible.
std::vector<PipelineChunk> pipeline_chunks(const ModelSpec& model, const Parallelism& p);

}  // namespace hbmsim
