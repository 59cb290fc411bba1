// What a device's HBM holds at its peak, buffer by buffer, from a recorded timeline: the answer to "what do I
// cut to fit?" that the category breakdown only sums.
#pragma once
#include <string>
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim {

struct PeakBuffer {
  std::string made_by;  // the op that allocates it ("resident": alive the whole step)
  std::string category;
  double bytes = 0;
  double alloc_s = 0, free_s = -1;  // free_s -1: never freed
};

// Per device, the HBM buffers live at its peak (the first moment its live HBM reaches the recorded peak),
// largest first; their bytes add up to the peak. `r` must come from a run that recorded its timeline, and
// `names` name the program's ops.
std::vector<std::vector<PeakBuffer>> peak_buffers(const sim::Program& p, const sim::EngineResult& r, const std::vector<std::string>& names);

}  // namespace hbmsim
