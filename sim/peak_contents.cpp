#include "sim/peak_contents.hpp"

#include <algorithm>
#include <stdexcept>

namespace hbmsim {

std::vector<std::vector<PeakBuffer>> peak_buffers(const sim::Program& p, const sim::EngineResult& r, const std::vector<std::string>& names) {
  if (r.buffer_alloc_s.size() != p.buffers.size()) throw std::logic_error("peak_buffers needs a run that recorded its timeline");
  // Replay the allocations and frees in the order the engine made them, each device up to its first sample at
  // its peak (the engine records a new peak on the allocation that reaches it). A buffer belongs to one device.
  std::vector<char> live(p.buffers.size(), 0), at_peak(r.memory.size(), 0);
  for (const sim::MemorySample& m : r.timeline) {
    const auto d = static_cast<std::size_t>(m.device);
    if (m.buffer < 0 || at_peak[d] || p.buffers[static_cast<std::size_t>(m.buffer)].host) continue;
    live[static_cast<std::size_t>(m.buffer)] = m.freed ? 0 : 1;
    at_peak[d] = !m.freed && m.hbm_bytes >= r.memory[d].hbm_peak_bytes;
  }
  std::vector<int> made_by(p.buffers.size(), -1);
  for (std::size_t i = 0; i < p.ops.size(); ++i)
    for (int b : p.ops[i].allocs) made_by[static_cast<std::size_t>(b)] = static_cast<int>(i);
  std::vector<std::vector<PeakBuffer>> out(r.memory.size());
  for (std::size_t b = 0; b < p.buffers.size(); ++b) {
    if (!live[b]) continue;
    const int op = made_by[b];
    const std::string name = op < 0 ? "resident" : static_cast<std::size_t>(op) < names.size() ? names[static_cast<std::size_t>(op)] : "op " + std::to_string(op);
    out[static_cast<std::size_t>(p.buffers[b].device)].push_back(
        {name, sim::to_string(p.buffers[b].category), p.buffers[b].bytes, r.buffer_alloc_s[b], r.buffer_free_s[b]});
  }
  for (auto& list : out)
    std::stable_sort(list.begin(), list.end(), [](const PeakBuffer& a, const PeakBuffer& b) { return a.bytes > b.bytes; });
  return out;
}

}  // namespace hbmsim
