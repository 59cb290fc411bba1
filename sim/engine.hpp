// Deterministic fluid discrete-event engine. A Program is ops on queues with dependencies, buffers and the
// link bandwidth they use; the engine advances time from one completion to the next (ties broken by op
// sequence number). Ops that use the same link share it max-min fairly (a more urgent class first), whatever
// queue they come from, so a new kind of communication needs no engine code.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/small_vec.hpp"

namespace hbmsim::sim {

// serial: one op at a time, in program order (the compute stream, one NCCL-style stream per mesh axis).
// concurrent: every ready op starts at once, in program order; a held-back op holds the ones behind it
// (the copy engines).
enum class QueueKind : std::uint8_t { serial, concurrent };

struct Queue {
  std::string name;
  QueueKind kind = QueueKind::serial;
  bool host_copy = false;  // its ops take HBM bandwidth from memory-bound kernels (Program::copy_interference)
  int device = 0;          // the GPU it belongs to (a pipeline stage; 0 without pipeline parallelism)
  bool compute = false;    // the device's compute stream: its idle time is blamed on what it waited for
  bool receives = false;   // charged with the compute stream's waits on another device (pipeline receives)
  bool marks = false;      // its ops mark program points (where a collective is issued), not work: traces leave them out
  // Its ops' buffers come alive when the op becomes ready (its last dependency completes: where the program
  // issues it), not when the queue gets to it: XLA assigns a collective's output from the start op's place in
  // the schedule and PyTorch's allocator on the issuing thread, so a faster link does not move them. An op
  // with no dependencies allocates when it starts.
  bool allocates_when_ready = false;
  bool takes_sms = false;  // its ops hold SMs the device's compute kernels then lack (Program::comm_sm_share)
};

constexpr int kUnusedLink = -1, kSharedLink = -2;  // Resource::sole_queue

// A physical link direction (NVLink out, NIC in, host link H2D, ...), bytes per second.
struct Resource {
  std::string name;
  double capacity_bytes_per_s = 0;
  int device = 0;  // whose link it is
  // The one queue whose ops use it (kUnusedLink: none; kSharedLink: ops of several queues), kept by
  // Program::use: a link no other queue touches lets the fast-forward work its queue out alone.
  int sole_queue = kUnusedLink;
};

// What an op moves through a resource while it runs at full speed (bytes/s).
struct Use {
  int resource = -1;
  double bytes_per_s = 0;
};

enum class MemCategory : std::uint8_t {  // one byte: a Buffer packs into 16
  parameters, optimizer_state, gradients, gathered_weights, saved_activations, offload_buffers,
  collective_buffers, workspace, runtime_reserve, count
};
constexpr int kMemCategories = static_cast<int>(MemCategory::count);
const char* to_string(MemCategory c);

struct Buffer {
  double bytes = 0;
  MemCategory category = MemCategory::workspace;
  bool host = false;
  int device = 0;  // whose HBM (or pinned host memory) it takes
};
static_assert(sizeof(Buffer) <= 16, "a buffer outgrew its 16 bytes");

constexpr int kComputeQueue = 0;  // every program's first queue: device 0's compute stream
// The longest layer pattern a loop is copied and fast-forwarded at, in iterations: Gemma 3 alternates five
// sliding-window layers with a full one (6); a double-buffered scan body holds two layers.
constexpr int kMaxPeriod = 8;
constexpr int kMaxQueues = 4096;  // a program's queues (an op stores its queue in 16 bits)

// Fields ordered by size so that an op packs into 96 bytes: the engine walks thousands per step, and at the
// depth of a large model they no longer all fit in cache (a 128-byte op made a 126-layer step cost more per
// layer than a 32-layer one).
struct ProgramOp {
  ProgramOp() = default;
  ProgramOp(int q, double s) : seconds(s), queue(static_cast<std::uint16_t>(q)) {}
  double seconds = 0;         // alone, at full speed
  double executed_flops = 0;
  double bytes_sent = 0;      // communication this device sends (reports)
  double gate_bytes = 0;      // > 0: start only when live HBM + gate_bytes <= the memory limit
  // Its link uses, Program::uses[use_begin, use_begin + use_count): sharing a saturated link slows the op.
  std::uint32_t use_begin = 0;
  int priority = 0;           // on a shared link, a lower class is served first, sharing within it
  std::int16_t layer = -1;    // -1: none (a model file has at most 32,767 layers)
  std::uint16_t queue = kComputeQueue;  // (a program has at most kMaxQueues)
  std::uint16_t use_count = 0;
  bool memory_bound = false;  // slowed while a host copy runs (HBM interference)
  char phase = 'f';           // f forward, b backward, w weight gradients, r recompute, o optimizer, c copy
  SmallVec<int, 3> deps;      // ops that must complete first
  SmallVec<int, 3> allocs;    // buffers that come alive when this op starts
  SmallVec<int, 3> releases;  // buffer references dropped when this op completes
};
static_assert(sizeof(ProgramOp) <= 96, "a program op outgrew its 96 bytes");

// Ops on the queues of one or more devices (each pipeline stage is a device: its own compute stream,
// communication queues, copy engines, HBM and host counters), joined by whatever dependencies and link uses
// the ops carry.
struct Program {
  Program() { clear(); }

  std::vector<Queue> queues;
  std::vector<Resource> resources;
  std::vector<ProgramOp> ops;
  std::vector<Use> uses;  // every op's link uses, contiguous per op (kept apart: most ops have none)
  // A gated op's gate also opens once `after` completes, whatever the memory: the point where the schedule
  // without LHS issues the copy, so a held-back prefetch starts no later than that (kept apart: few ops).
  struct GateLift {
    int op, after;
  };
  std::vector<GateLift> gate_lifts;
  std::vector<Buffer> buffers;
  // Where each iteration of a layer loop begins and ends (ops [first, end)), in program order, with the ops
  // issued earlier that belong to it ([side_first, side_end): a layer's parameter all-gather, issued at the
  // step's start): a hint the engine checks (sim/repeats.hpp) before it fast-forwards through iterations
  // that repeat.
  struct Iteration {
    int first, end;
    int side_first = -1, side_end = -1;  // none: -1
    // > 0: the builder emitted it as the iteration that many back moved on (sim/instances.hpp), which
    // continues the two before it at that period (at most kMaxPeriod); the engine then checks only what a
    // copy cannot vouch for.
    int copy_of = 0;
    int buffers_first = 0, buffers_end = 0;  // the buffers created with it (a copy's repeat its model's)
  };
  std::vector<Iteration> iterations;
  // The order in which ops are issued to their queues, a permutation of the ops; empty: program order. A
  // builder that interleaves two passes (combined 1F1B) sets it; it must keep each pass's own order on every
  // queue (a queue's order stands in for dependencies between its ops) and be free of cycles with the
  // dependencies (run_program checks both: sim/issue_order.hpp). Such a program runs without fast-forward.
  std::vector<int> issue_order;
  std::vector<int> resident;            // buffers alive for the whole step (allocated at t = 0, never freed)
  std::vector<double> hbm_limit_bytes;  // per device: the LHS memory limit for gated prefetches
  // Per device: unsharded gradients a backward iteration holds for the reduce-scatters of the layers before it.
  // A gated prefetch counts them as taken while fewer are (they are, from the backward's first iterations on).
  std::vector<double> scatter_reserve_bytes;
  double copy_interference = 0;         // memory-bound slowdown while a host copy is active on the device
  // The share of a device's SMs its takes_sms queues' kernels hold while one runs: the compute stream's
  // kernels that are not memory-bound run that much slower meanwhile (a GEMM's tiles queue for fewer SMs).
  double comm_sm_share = 0;

  // Empties the program (keeping its memory): one device with its compute queue.
  void clear();
  int devices() const { return static_cast<int>(hbm_limit_bytes.size()); }
  // Adds a device (with its compute queue); returns its index.
  int add_device();
  int compute_queue(int device) const;
  // The queue of that name on that device, created on first use.
  int queue(const std::string& name, QueueKind kind = QueueKind::serial, bool host_copy = false, int device = 0);
  // The link of that name on that device, created on first use.
  int resource(const std::string& name, double capacity_bytes_per_s, int device = 0);

  int add_buffer(double bytes, MemCategory c, bool host = false, int device = 0) {
    buffers.push_back(Buffer{bytes, c, host, device});
    return static_cast<int>(buffers.size()) - 1;
  }
  int add(ProgramOp op) {
    op.use_begin = static_cast<std::uint32_t>(uses.size());
    op.use_count = 0;
    ops.push_back(std::move(op));
    return static_cast<int>(ops.size()) - 1;
  }
  // Op `op` (the last one added) moves `bytes_per_s` through `resource` at full speed.
  void use(int op, int resource, double bytes_per_s);
};

// What a device's compute stream spends its busy time on (reports): an op's phase, with a split backward's
// weight-gradient pass (w) counted as backward.
enum class ComputePhase : std::uint8_t { forward, backward, recompute, optimizer, count };
constexpr int kComputePhases = static_cast<int>(ComputePhase::count);
const char* to_string(ComputePhase c);
[[noreturn]] void bad_compute_phase(char phase);  // a logic_error: a phase no compute op has (a builder's mistake)
// A compute op's phase (inline: the engine asks it for every compute op of a step).
inline ComputePhase compute_phase(char phase) {
  switch (phase) {
    case 'f': return ComputePhase::forward;
    case 'b':
    case 'w': return ComputePhase::backward;
    case 'r': return ComputePhase::recompute;
    case 'o': return ComputePhase::optimizer;
    default: bad_compute_phase(phase);
  }
}

struct MemorySample {
  double time_s;
  int device;
  double hbm_bytes;
  double host_bytes;
  std::array<double, kMemCategories> hbm_by_category;
  int buffer = -1;     // the buffer whose allocation (or, `freed`, release) made it; -1: a snapshot of the device
  bool freed = false;
};

// One device's memory over the step.
struct DeviceMemory {
  double hbm_peak_bytes = 0, hbm_peak_time_s = 0, host_peak_bytes = 0;
  std::array<double, kMemCategories> hbm_at_peak{};
};

struct EngineResult {
  double end_time_s = 0;
  std::vector<double> start_s, end_s;  // per op, only when asked (record_timeline)
  std::vector<DeviceMemory> memory;    // per device
  // Per queue: compute idle time blamed on the queue it waited for; union of the queue's busy spans; bytes
  // its ops sent.
  std::vector<double> exposed_s, busy_s, bytes_sent;
  std::vector<double> last_end_s;  // per queue: when its last op ended
  // Per device: its compute stream's busy time by phase (they add up to the compute queue's busy_s).
  std::vector<std::array<double, kComputePhases>> compute_phase_s;
  double executed_flops = 0;
  std::vector<MemorySample> timeline;  // only when asked: a sample of a device at each change of its memory
  std::vector<double> buffer_alloc_s, buffer_free_s;  // only when asked; -1: never
  // The run ended early because a device's live HBM went over the stop given to run_program: the step does not
  // fit, and every other figure covers only the time until then.
  bool stopped_over_hbm = false;
  std::uint64_t events = 0;      // completions, replayed ones included
  int replayed_iterations = 0;   // loop iterations fast-forwarded rather than simulated
};

// Runs the program to completion. Throws std::logic_error on a deadlock or an issue order that cannot run to
// the end (a builder bug, never input).
// fast_forward: once the state at the start of a loop iteration repeats the previous one's (shifted by an
// iteration), the engine replays that iteration's events instead of simulating them (same results within
// 1e-9 relative; off: every event simulated).
// stop_above_hbm_bytes > 0: end the run as soon as a device's live HBM exceeds it (EngineResult::stopped_over_hbm),
// for a search that only needs to know the step does not fit.
EngineResult run_program(const Program& program, bool record_timeline, bool fast_forward = true, double stop_above_hbm_bytes = 0);

}  // namespace hbmsim::sim
