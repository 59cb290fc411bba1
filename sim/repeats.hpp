// Runs of layer-loop iterations that are one iteration's ops shifted: what the engine may fast-forward.
#pragma once
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim::sim {

// Iterations i = 0 .. count-1 hold ops [first + i * stride, first + (i + 1) * stride); iteration i + 1 is
// iteration i with every op index, and every reference to an op or buffer of the run, moved one iteration
// on. References that leave the run (a backward op's dependency on a forward copy, a forward buffer freed
// in the backward) only have to agree in kind: the engine checks at run time that they cannot change
// what happens (dependencies already met, no outside op released).
struct Repeat {
  int first = 0, stride = 0, count = 0;
  bool contains(int op) const { return op >= first && op < first + stride * count; }
  int iteration(int op) const { return (op - first) / stride; }
};

// The checked runs of Program::iterations (at least three iterations each). `releases` per buffer: how many
// ops release it; `gate_after` per op: the op after which its memory gate opens (-1: none).
std::vector<Repeat> find_repeats(const Program& p, const std::vector<int>& releases, const std::vector<int>& gate_after);

}  // namespace hbmsim::sim
