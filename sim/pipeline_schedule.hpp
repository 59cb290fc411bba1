// Pipeline schedules as data: for each stage, the ordered passes it runs (micro-batch, its chunk, forward or
// backward or weight-gradient). A new schedule is a new table; the program builder only follows tables.
#pragma once
#include <vector>

#include "workloads/training.hpp"

namespace hbmsim {

enum class Pass : char {
  forward = 'F',
  backward = 'B',      // the whole backward, or only its input gradients where the schedule splits it
  weight_grad = 'W',   // the weight gradients of a split backward
};

struct PipelineTask {
  int microbatch = 0;
  int chunk = 0;  // the stage's own chunk index: it holds model chunk chunk x stages + stage
  Pass pass = Pass::forward;
  // Combined 1F1B: this pass runs merged with the next one on the stage (a steady-state forward with its
  // backward; without pipelining a backward with the next micro-batch's forward).
  bool merged_with_next = false;
  bool operator==(const PipelineTask&) const = default;
};

// Whether the schedule runs weight gradients as passes of their own.
bool splits_backward(PipelineSchedule s);

// Per stage, its passes in order. `virtual_stages` > 1 interleaves (1f1b only); the counts are validated
// (validate_training) before they get here. `combined`: 1F1B with one more warm-up forward per stage, as
// Megatron's combined 1F1B (EP all-to-all overlap) runs it.
std::vector<std::vector<PipelineTask>> pipeline_schedule(PipelineSchedule s, int stages, int virtual_stages, int microbatches,
                                                         bool combined = false);

}  // namespace hbmsim
