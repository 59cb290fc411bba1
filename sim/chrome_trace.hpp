// The Chrome/Perfetto trace of a step run with a recorded timeline, as JSON text ending in a newline: a
// process per device (pipeline stage), a track per queue (more where its ops overlap: "d2h #2"), counters for
// memory. Written straight to text: a pipeline step has millions of events, and a JSON tree of them took 14 GB
// and 100 s (corpus row 8).
#pragma once
#include <string>
#include <vector>

#include "sim/engine.hpp"

namespace hbmsim {

std::string chrome_trace(const sim::Program& program, const sim::EngineResult& r, const std::vector<std::string>& names);

}  // namespace hbmsim
