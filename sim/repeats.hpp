// Runs of layer-loop iterations that are one iteration's ops shifted: what the engine may fast-forward.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim::sim {

// A segment of a run: iteration i holds ops [first + i * stride, first + (i + 1) * stride).
struct Segment {
  int first = 0, stride = 0;  // stride 0: no such segment
  // Where `count` iterations of it end: its ops are [first, end(count)).
  int end(int count) const { return first + stride * count; }
};

// Iterations i = 0 .. count-1 of a run hold ops from its main segment (the loop body) and its side segment
// (ops issued earlier that belong to the iteration, one layer's parameter all-gather each). Iteration i + 1
// is iteration i with every op index, and every reference to an op or buffer of the run, moved one
// iteration on. References that leave the run (a backward op's dependency on a forward copy, a forward
// buffer freed in the backward) only have to agree in kind: the engine checks at run time that they cannot
// change what happens (dependencies already met, no outside op released).
struct Repeat {
  Segment main, side;
  int count = 0;
  int first_iteration = 0, group = 1;  // Program::iterations[first_iteration ...], `group` per iteration

  // 0: main, 1: side, -1: not in the run.
  int segment(int op) const {
    if (op >= main.first && op < main.end(count)) return 0;
    if (op >= side.first && op < side.end(count)) return 1;
    return -1;
  }
  bool contains(int op) const { return segment(op) >= 0; }
  const Segment& of(int op) const { return segment(op) == 0 ? main : side; }
  int iteration(int op) const { return (op - of(op).first) / of(op).stride; }
  // The op's counterpart m iterations on.
  int moved(int op, int m) const { return op + m * of(op).stride; }
  // The op as seen from iteration `it`: its segment and its place from that iteration's start.
  std::int64_t offset(int op, int it) const {
    const Segment& s = of(op);
    return (static_cast<std::int64_t>(segment(op)) << 40) + (op - s.first - it * s.stride);
  }
};

// The loops of a program as runs, checked lazily: an iteration is compared with the one before only when
// the engine is about to rely on it (most of a step's iterations never are, when its state does not
// repeat), and the answer is remembered.
class Repeats {
 public:
  static constexpr int kManyAllocs = -2;  // alloc_op of a buffer several ops allocate
  // Runs from Program::iterations: back-to-back iterations of one shape, taken one at a time or, where
  // single iterations differ (a double-buffered scan body holds two layers; Gemma 3 has a full-attention
  // layer every sixth), up to kMaxPeriod at a time: the fewest whose iterations repeat over a stretch of
  // about kMaxPeriod layers mid-run (the middle two layers alone may look alike within a pattern). Back-to-back
  // iterations of alternating shapes (Llama 4 Maverick's dense and MoE layers) are grouped the same way, two or
  // more at a time, where the groups span alike.
  // Per op, `gate_after`: the op after which its memory gate opens (-1: none); per buffer, `alloc_op`: the
  // op that allocates it (-1: none, kManyAllocs) and `releases`: how many ops release it (the engine counts
  // both while it sets up). They must outlive the checks.
  void find(const Program& p, const std::vector<int>& gate_after, const std::vector<int>& alloc_op,
            const std::vector<int>& releases);
  const std::vector<Repeat>& runs() const { return runs_; }
  // The first iteration in [first, last] of run r that is not the one before it shifted (last + 1: none).
  int first_break(int r, int first, int last);

 private:
  // Iteration i continues iteration i - 1 back to back (its side ops too, or neither has any).
  static bool adjoins(const std::vector<Program::Iteration>& its, std::size_t i);
  // Keeps `run` if its middle iterations repeat (a stretch of about kMaxPeriod layers from the middle).
  bool try_run(const Repeat& run);
  // Iterations [from, to), back to back but of alternating shapes, as groups of several that span alike;
  // whether a run was kept.
  bool mixed_groups(const std::vector<Program::Iteration>& its, std::size_t from, std::size_t to);
  // Iterations [a, b) of one shape: the builder's copies at their period, else the fewest per group that repeat.
  void one_shape(const std::vector<Program::Iteration>& its, std::size_t a, std::size_t b);
  bool repeats_previous(int r, int i);
  // Iterations i - 1 and i of run r are builder copies at a period dividing the run's group
  // (Program::Iteration::copy_of), so that i - 2, i - 1 and i continue one another.
  bool copied(int r, int i) const;
  const Program* p_ = nullptr;
  const std::vector<int>* gate_after_ = nullptr;
  std::vector<Repeat> runs_;
  std::vector<std::vector<char>> known_;      // per run, per iteration: 0 unchecked, 1 repeats, 2 does not
  std::vector<std::vector<int>> priority_step_;  // per run, per link: the priority change per iteration
  const std::vector<int>*alloc_op_ = nullptr, *releases_ = nullptr;
};

}  // namespace hbmsim::sim
