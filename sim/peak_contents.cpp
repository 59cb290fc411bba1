#include "sim/peak_contents.hpp"

#include <algorithm>
#include <stdexcept>

namespace hbmsim {

std::vector<PeakBuffer> peak_buffers(const sim::Program& p, const sim::EngineResult& r, const std::vector<std::string>& names,
                                     int device) {
  if (r.buffer_alloc_s.size() != p.buffers.size()) throw std::logic_error("peak_buffers needs a run that recorded its timeline");
  const double peak = r.memory.at(static_cast<std::size_t>(device)).hbm_peak_bytes;
  // Replay the device's allocations and frees in the order the engine made them, up to the first sample at
  // the peak (the engine records a new peak on the allocation that reaches it).
  std::vector<char> live(p.buffers.size(), 0);
  for (const sim::MemorySample& m : r.timeline) {
    if (m.device != device || m.buffer < 0) continue;
    const auto& b = p.buffers[static_cast<std::size_t>(m.buffer)];
    if (b.host) continue;
    live[static_cast<std::size_t>(m.buffer)] = m.freed ? 0 : 1;
    if (!m.freed && m.hbm_bytes >= peak) break;
  }
  std::vector<int> made_by(p.buffers.size(), -1);
  for (std::size_t i = 0; i < p.ops.size(); ++i)
    for (int b : p.ops[i].allocs) made_by[static_cast<std::size_t>(b)] = static_cast<int>(i);
  std::vector<PeakBuffer> out;
  for (std::size_t b = 0; b < p.buffers.size(); ++b) {
    if (!live[b]) continue;
    const int op = made_by[b];
    const std::string name = op < 0 ? "resident" : static_cast<std::size_t>(op) < names.size() ? names[static_cast<std::size_t>(op)] : "op " + std::to_string(op);
    out.push_back({name, sim::to_string(p.buffers[b].category), p.buffers[b].bytes, r.buffer_alloc_s[b], r.buffer_free_s[b]});
  }
  std::stable_sort(out.begin(), out.end(), [](const PeakBuffer& a, const PeakBuffer& b) { return a.bytes > b.bytes; });
  return out;
}

}  // namespace hbmsim
