// Layer-loop iterations emitted as copies rather than built (issue 23: build a layer once per template and
// instantiate it). Where a loop body repeats, the iteration after c is c moved on as far as c moved from
// the one before it: every op and buffer reference, layer number and priority advances by the same step,
// and everything else is c's. The builder copies only where three iterations already continue one another
// and what the next one reads continues them too, so the program is the one it would have built (tests
// compare both on every built-in configuration).
#pragma once
#include <cstdint>
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim::sim {

// How far a program's arrays have grown: an iteration is what lies between two marks.
struct Mark {
  int ops = 0, buffers = 0, lifts = 0;
  std::uint32_t uses = 0;
};
Mark mark(const Program& p);

struct Span {
  Mark begin, end;
};

// Whether c continues a and b: the same numbers of ops, buffers, link uses and gate lifts, every field
// equal, and every reference, layer and priority moving from b to c by the step it moved from a to b.
bool continues(const Program& p, const Span& a, const Span& b, const Span& c);
// The same for lists of integers (what an iteration reads or leaves for later ones).
bool continues(const std::vector<int>& a, const std::vector<int>& b, const std::vector<int>& c);

// Appends the iteration after c (c moved on by the step from b to c) if the program ends where that
// iteration begins; returns whether it did. `out` receives its span.
bool extend(Program& p, const Span& b, const Span& c, Span& out);
// c moved on by the step from b to c.
void extend(const std::vector<int>& b, const std::vector<int>& c, std::vector<int>& out);

// The iterations of one layer loop, in the order the builder emits them: what each was and left, and
// which ones continue their predecessors one or two iterations back (a double-buffered body alternates).
class LoopInstances {
 public:
  void start(int iterations);
  // The period (0: none) at which iteration i may be a copy: iterations i - 3p, i - 2p and i - p continue
  // one another, and so do their inputs and i's (`inputs`: what iteration i reads). `only` 0: 1 or 2 (a
  // body of one plan, double-buffered or not); else that period alone (a pattern of plans, kMaxPeriod at most).
  int period(const Program& p, int i, const std::vector<int>& inputs, int only = 0);
  // Copies iteration i - period; `left` receives what it leaves for later iterations. False: the program
  // does not end where the copy would begin (nothing appended).
  bool copy(Program& p, int i, int period, std::vector<int>& left);
  // Records iteration i (built or copied): its span, inputs and what it left (the lists are taken: the
  // caller gets others back to refill).
  void finish(int i, const Span& span, std::vector<int>& inputs, std::vector<int>& left);
  // The period iteration i was copied at (0: built).
  int copied_at(int i) const { return its_[static_cast<std::size_t>(i)].copied_at; }

 private:
  struct Iteration {
    Span span;
    std::vector<int> inputs, left;
    int copied_at = 0;                  // the period it was copied at (0: built)
    std::int8_t continues[kMaxPeriod + 1] = {};  // per period: 0 unknown, 1 continues i - 2p and i - p, -1 does not
    bool done = false;
  };
  bool continues_at(const Program& p, int i, int period);
  std::vector<Iteration> its_;
};

}  // namespace hbmsim::sim
