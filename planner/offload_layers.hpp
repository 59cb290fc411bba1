// `plan offload-layers`: the fewest layers whose activations must go to host (Megatron's
// cpu_offloading_num_layers) for a run to fit. Each layer offloaded moves what it keeps off the device and
// slows the step a little, so the fewest that fit is the fastest that fits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/plan.hpp"

namespace hbmsim {

struct OffloadLayers {
  std::int64_t layers = -1;       // the fewest that fit; -1: no count fits
  std::vector<Candidate> tried;   // every count simulated, in the order tried
  std::string why;                // the answer in words, or why no count fits (what ran out, with the figures)
  const Candidate* at(std::int64_t count) const;
};

// Bisection over 0..num_layers on the HBM fit, which more layers offloaded never loses (each takes its kept
// tensors off the device); the answer must then fit pinned host memory too, which more layers only fill
// further, so when it does not no count fits. Overwrites the config's offload_layers.
OffloadLayers fewest_offload_layers(const RunConfig& base);

}  // namespace hbmsim
