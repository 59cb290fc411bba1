#include "sim/pipeline_schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace hbmsim {

bool splits_backward(PipelineSchedule s) { return s == PipelineSchedule::zero_bubble_h1; }

namespace {

using Table = std::vector<std::vector<PipelineTask>>;

// Every forward, then every backward (in micro-batch order).
Table gpipe(int p, int m) {
  Table t(static_cast<std::size_t>(p));
  for (auto& stage : t) {
    for (int i = 0; i < m; ++i) stage.push_back({i, 0, Pass::forward});
    for (int i = 0; i < m; ++i) stage.push_back({i, 0, Pass::backward});
  }
  return t;
}

// Megatron's interleaved 1F1B (plain 1F1B at v = 1): virtual micro-batch k runs micro-batch
// (k / (p v)) p + k % p on chunk (k / p) % v going forward, chunk v - 1 - (k / p) % v going backward. Stage s
// warms up with (p - s - 1) x 2 + (v - 1) x p forwards (p - s - 1 at v = 1), alternates one forward and one
// backward, and drains the backwards left. Combined 1F1B (Megatron's EP all-to-all overlap) warms up with one
// forward more at p > 1 (schedules.py: num_warmup_microbatches += 1), so that each steady forward and the
// backward after it belong to different micro-batches and can run merged.
Table interleaved_1f1b(int p, int v, int m, bool combined) {
  Table t(static_cast<std::size_t>(p));
  const int total = m * v;
  auto task = [&](int k, bool forward) {
    const int group = k / p;
    const int chunk = forward ? group % v : v - 1 - group % v;
    return PipelineTask{(k / (p * v)) * p + k % p, chunk, forward ? Pass::forward : Pass::backward};
  };
  for (int s = 0; s < p; ++s) {
    auto& stage = t[static_cast<std::size_t>(s)];
    const int warmup = std::min(total, (v == 1 ? p - s - 1 : (p - s - 1) * 2 + (v - 1) * p) + (combined && p > 1 ? 1 : 0));
    for (int k = 0; k < warmup; ++k) stage.push_back(task(k, true));
    for (int k = 0; k < total - warmup; ++k) {
      stage.push_back(task(warmup + k, true));
      stage.back().merged_with_next = combined && p > 1;
      stage.push_back(task(k, false));
      // Without pipelining Megatron merges each backward with the next micro-batch's forward
      // (combined_1f1b_schedule_for_no_pipelining).
      stage.back().merged_with_next = combined && p == 1 && k + 1 < total - warmup;
    }
    for (int k = total - warmup; k < total; ++k) stage.push_back(task(k, false));
  }
  return t;
}

// ZB-H1 (Qi et al. 2023, section 2.1): 1F1B's forwards and input-gradient backwards, with stage s starting
// its weight-gradient passes s backwards late, so that every stage holds p micro-batches in flight (forward
// done, weight gradients not) as 1F1B's first stage does, and the delayed passes fill the drain. With equal
// pass times the bubble is (p-1)(F+B-W).
Table zero_bubble_h1(int p, int m) {
  Table t(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& stage = t[static_cast<std::size_t>(s)];
    int f = 0, b = 0, w = 0;
    for (; f < std::min(p - 1 - s, m); ++f) stage.push_back({f, 0, Pass::forward});
    auto backward = [&] {
      stage.push_back({b++, 0, Pass::backward});
      if (b > s) stage.push_back({w++, 0, Pass::weight_grad});
    };
    for (; f < m; ++f) {
      stage.push_back({f, 0, Pass::forward});
      backward();
    }
    while (b < m) backward();
    while (w < m) stage.push_back({w++, 0, Pass::weight_grad});
  }
  return t;
}

}  // namespace

std::vector<std::vector<PipelineTask>> pipeline_schedule(PipelineSchedule s, int stages, int virtual_stages, int microbatches, bool combined) {
  if (stages <= 0 || virtual_stages <= 0 || microbatches <= 0) throw std::logic_error("pipeline_schedule: empty pipeline");
  // One stage is no pipeline: each micro-batch's forward then its backward (gradient accumulation), whatever
  // the schedule named; the builder splits weight gradients off only with pp > 1 (TemplatePlan).
  if (stages == 1) s = PipelineSchedule::one_f_one_b;
  switch (s) {
    case PipelineSchedule::gpipe: return gpipe(stages, microbatches);
    case PipelineSchedule::one_f_one_b: return interleaved_1f1b(stages, virtual_stages, microbatches, combined);
    case PipelineSchedule::zero_bubble_h1: return zero_bubble_h1(stages, microbatches);
  }
  throw std::logic_error("pipeline_schedule: unknown schedule");
}

}  // namespace hbmsim
