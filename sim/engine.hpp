// Deterministic fluid discrete-event engine. A Program is a set of ops on streams with dependencies and
// buffers; the engine advances time from one completion to the next (ties broken by op sequence number),
// sharing bandwidth between the transfers that run at the same time.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/small_vec.hpp"

namespace hbmsim::sim {

enum Stream : int { compute = 0, collective = 1, expert_a2a = 2, d2h = 3, h2d = 4, stream_count = 5 };
const char* stream_name(int s);

enum class MemCategory : int {
  parameters, optimizer_state, gradients, gathered_weights, saved_activations, offload_buffers,
  collective_buffers, workspace, runtime_reserve, count
};
constexpr int kMemCategories = static_cast<int>(MemCategory::count);
const char* to_string(MemCategory c);

struct Buffer {
  double bytes = 0;
  MemCategory category = MemCategory::workspace;
  bool host = false;
};

struct ProgramOp {
  ProgramOp() = default;
  ProgramOp(int s, double amount_, double cap = 1) : stream(s), amount(amount_), rate_cap(cap) {}
  int stream = compute;
  double amount = 0;          // solo seconds (compute, collectives) or bytes (copies)
  double rate_cap = 1;        // copies: bytes/s this copy gets alone; others: 1 (solo speed)
  bool memory_bound = false;  // slowed while a host copy runs (HBM interference)
  double executed_flops = 0;
  double gate_bytes = 0;      // > 0: start only when live HBM + gate_bytes <= the memory limit
  int priority = 0;           // copies: a direction serves its lowest class first, sharing within it
  SmallVec<int, 4> deps;      // ops that must complete first
  SmallVec<int, 3> allocs;    // buffers that come alive when this op starts
  SmallVec<int, 3> releases;  // buffer references dropped when this op completes
  int layer = -1;
  char phase = 'f';           // f forward, b backward, r recompute, o optimizer, c copy
};

struct Program {
  std::vector<ProgramOp> ops;
  std::vector<Buffer> buffers;
  std::vector<int> resident;  // buffers alive for the whole step (allocated at t = 0, never freed)
  double hbm_limit_bytes = 0;                 // LHS memory limit for gated prefetches
  double bidirectional_total_bytes_per_s = 0; // 0: directions independent
  double copy_interference = 0;               // memory-bound slowdown while a host copy is active

  int add_buffer(double bytes, MemCategory c, bool host = false) {
    buffers.push_back(Buffer{bytes, c, host});
    return static_cast<int>(buffers.size()) - 1;
  }
  int add(ProgramOp op) {
    ops.push_back(std::move(op));
    return static_cast<int>(ops.size()) - 1;
  }
};

struct MemorySample {
  double time_s;
  double hbm_bytes;
  double host_bytes;
  std::array<double, kMemCategories> hbm_by_category;
};

struct EngineResult {
  double end_time_s = 0;
  std::vector<double> start_s, end_s;  // per op, only when asked (record_timeline)
  double hbm_peak_bytes = 0, hbm_peak_time_s = 0, host_peak_bytes = 0;
  std::array<double, kMemCategories> hbm_at_peak{};
  std::array<double, stream_count> exposed_s{};  // compute stream idle, blamed on the stream it waited for
  std::array<double, stream_count> busy_s{};
  double executed_flops = 0;
  std::vector<MemorySample> timeline;  // only when asked
  std::vector<double> buffer_alloc_s, buffer_free_s;  // only when asked; -1: never
  std::uint64_t events = 0;
};

// Runs the program to completion. Throws std::logic_error on a deadlock (a builder bug, never input).
EngineResult run_program(const Program& program, bool record_timeline);

}  // namespace hbmsim::sim
