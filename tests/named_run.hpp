// A run's program with its ops named, and its timeline: for tests that look at single ops.
#pragma once
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "planner/run_config.hpp"
#include "sim/program_builder.hpp"
#include "sim/simulator.hpp"

namespace test {

struct NamedRun {
  hbmsim::sim::Program p;
  std::vector<std::string> names;
  hbmsim::sim::EngineResult r;
  // The op called `name` on stage `device`.
  std::size_t op(const std::string& name, int device) const {
    for (std::size_t i = 0; i < p.ops.size(); ++i)
      if (names[i] == name && p.queues[static_cast<std::size_t>(p.ops[i].queue)].device == device) return i;
    FAIL("no op " << name << " on stage " << device);
    return p.ops.size();
  }
};

inline NamedRun named_run(const hbmsim::RunConfig& c) {
  const hbmsim::PreparedRun run = hbmsim::prepare_run(c);
  NamedRun n;
  n.p = hbmsim::build_program(run.graph, run.system, run.policy, run.options, &n.names);
  n.r = hbmsim::sim::run_program(n.p, true);
  return n;
}

}  // namespace test
