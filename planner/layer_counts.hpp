// `plan offload-layers` / `plan recompute-layers`: the fewest layers that must send their activations to host
// (Megatron's cpu_offloading_num_layers) or be recomputed in full (recompute_num_layers, block method, per chunk)
// for a run to fit. Each such layer takes what it keeps off the device and slows the step, so the fewest that
// fit is the fastest that fits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/plan.hpp"

namespace hbmsim {

enum class LayerCount { offload, recompute };
const char* field_name(LayerCount what);  // "offload_layers", "recompute_layers"
std::int64_t layer_count(const RunConfig& config, LayerCount what);  // the config's value of that field

struct LayerCountSearch {
  LayerCount what = LayerCount::offload;
  std::int64_t layers = -1;       // the fewest that fit; -1: no count fits
  std::vector<Candidate> tried;   // every count simulated, in the order tried
  std::string why;                // the answer in words, or why no count fits (what ran out, with the figures)
  const Candidate* at(std::int64_t count) const;
};

// Bisection over 0..the most layers the field allows (the model's layers to offload; a chunk's to recompute) on
// the HBM fit, which more such layers never lose; the answer must then fit pinned host memory too, which more
// offloaded layers only fill further (recompute does not touch it), so when it does not no count fits.
// Overwrites the config's field.
LayerCountSearch fewest_layers(const RunConfig& base, LayerCount what);
// The InputError fewest_layers would throw at its first simulation (a policy with nothing to offload or recompute,
// a count the run cannot take), found without simulating: a command checks it before it describes the run.
void check_layer_count_search(const RunConfig& base, LayerCount what);

}  // namespace hbmsim
