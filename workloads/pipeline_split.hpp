// Which layers each pipeline chunk (virtual stage) holds. Chunk k of pp x vp runs on stage k % pp as that
// stage's chunk k / pp (Megatron's interleaving: a rank holds every pp-th chunk of the model).
#pragma once
#include <cstdint>
#include <string>
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

// Megatron's pipeline_model_parallel_layout: chunks separated by "|", in each "E" (the embedding, first chunk
// only), "t" (a decoder layer), "m" (a multi-token-prediction module, last chunk only) and "L" (the loss, last
// chunk only); "X*N" repeats a symbol or a parenthesised group, commas and spaces are ignored.
// Returns the decoder layers per chunk; `mtp_layers` receives the count of "m". Errors name the layout.
std::vector<std::int64_t> parse_pipeline_layout(const std::string& layout, std::int64_t& mtp_layers);

// Megatron-Bridge's layout for a layer count that pp x vp chunks do not divide (its DeepSeek-V3 layout map):
// ceil(layers / chunks) layers in each chunk, the rest in the last one with `mtp_layers` MTP modules and the
// loss; e.g. 61 layers over 4 chunks "Et*16|(t*16|)*2t*13mL". Empty where the rest would be no layer.
std::string ceil_pipeline_layout(std::int64_t layers, std::int64_t chunks, std::int64_t mtp_layers);

// The chunks in model order, the model's MTP modules (ModelSpec::mtp_layers) at the end of the last one; a
// layout must name as many ("m"). Errors name the field that makes the split impossible.
std::vector<PipelineChunk> pipeline_chunks(const ModelSpec& model, const Parallelism& p);

}  // namespace hbmsim
