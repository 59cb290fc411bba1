// Shared engine checks: two runs of one program report the same, within 1e-9 relative.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "sim/engine.hpp"

namespace test {

inline bool near(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1e-12, std::abs(a), std::abs(b)}); }

// Everything the engine reports, fast-forwarded and not, agrees within 1e-9 relative (events exactly).
inline void check_same(const hbmsim::sim::EngineResult& ff, const hbmsim::sim::EngineResult& plain) {
  CHECK(near(ff.end_time_s, plain.end_time_s));
  CHECK(near(ff.executed_flops, plain.executed_flops));
  CHECK(ff.events == plain.events);
  REQUIRE(ff.memory.size() == plain.memory.size());
  for (std::size_t d = 0; d < ff.memory.size(); ++d) {
    CHECK(near(ff.memory[d].hbm_peak_bytes, plain.memory[d].hbm_peak_bytes));
    CHECK(near(ff.memory[d].host_peak_bytes, plain.memory[d].host_peak_bytes));
    CHECK(near(ff.memory[d].hbm_peak_time_s, plain.memory[d].hbm_peak_time_s));
    for (std::size_t c = 0; c < ff.memory[d].hbm_at_peak.size(); ++c)
      CHECK(near(ff.memory[d].hbm_at_peak[c], plain.memory[d].hbm_at_peak[c]));
  }
  for (std::size_t q = 0; q < plain.exposed_s.size(); ++q) {
    CHECK(near(ff.exposed_s[q], plain.exposed_s[q]));
    CHECK(near(ff.busy_s[q], plain.busy_s[q]));
    CHECK(near(ff.bytes_sent[q], plain.bytes_sent[q]));
    CHECK(near(ff.last_end_s[q], plain.last_end_s[q]));
  }
  REQUIRE(ff.compute_phase_s.size() == plain.compute_phase_s.size());
  for (std::size_t d = 0; d < plain.compute_phase_s.size(); ++d)
    for (std::size_t c = 0; c < plain.compute_phase_s[d].size(); ++c) CHECK(near(ff.compute_phase_s[d][c], plain.compute_phase_s[d][c]));
  REQUIRE(ff.start_s.size() == plain.start_s.size());
  for (std::size_t i = 0; i < plain.start_s.size(); ++i) {
    CHECK(near(ff.start_s[i], plain.start_s[i]));
    CHECK(near(ff.end_s[i], plain.end_s[i]));
  }
}

}  // namespace test
