// The writer a stage's builder appends its ops through (sim/stage_builder.hpp): one device's queues, links
// and copy engines, and the op records the engine runs.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hwmodels/system.hpp"
#include "sim/comm.hpp"
#include "sim/engine.hpp"
#include "sim/instances.hpp"

namespace hbmsim::build {

using sim::MemCategory;
using sim::Program;
using sim::ProgramOp;

// Per op: its queue, kept beside the (large) ops for dependency checks (per thread, for its capacity).
inline std::vector<std::uint16_t>& thread_queue_of() {
  thread_local std::vector<std::uint16_t> v;
  return v;
}

// Appends one device's ops to a program: built in place (they are large), named when asked, communication
// on the queue of its mesh axis with the link bandwidth it uses, copies on the copy engines over the host
// link (every ready copy at once, as XLA's async copies; `serial_copies`: one after another in issue order,
// as on one CUDA stream per direction).
class Writer {
 public:
  Writer(Program& p, const System& sys, const Network& net, std::vector<std::string>* names, int device, bool serial_copies)
      : p_(p), names_(names), device_(device), compute_(p.compute_queue(device)) {
    const auto copies = serial_copies ? sim::QueueKind::serial : sim::QueueKind::concurrent;
    d2h_ = p.queue("d2h", copies, true, device);
    h2d_ = p.queue("h2d", copies, true, device);
    d2h_link_ = p.resource("host link D2H", sys.host_d2h_bytes_per_s(), device);
    h2d_link_ = p.resource("host link H2D", sys.host_h2d_bytes_per_s(), device);
    if (sys.host_link.bidirectional_total_bytes_per_s)
      both_links_ = p.resource("host link both directions", *sys.host_link.bidirectional_total_bytes_per_s, device);
    for (int level : {kIntraDomain, kInterDomain}) {
      const PathCost& path = net.path(level);
      if (path.links.empty()) continue;
      links_[static_cast<std::size_t>(level)] = {link(net, level, true, device), link(net, level, false, device)};
    }
  }

  // A device's link out of (or into) it on a path level, created on first use.
  int link(const Network& net, int level, bool out, int device) {
    const PathCost& path = net.path(level);
    return p_.resource(path.bottleneck + (out ? " out" : " in"), path.bytes_per_s, device);
  }

  bool naming() const { return names_ != nullptr; }
  int device() const { return device_; }
  ProgramOp& op(int i) { return p_.ops[static_cast<std::size_t>(i)]; }
  // `gated` may start once `after` completes whatever the memory limit (see Program::gate_lifts).
  void gate_lift(int gated, int after) {
    if (after >= 0) p_.gate_lifts.push_back({gated, after});
  }
  int last_compute() const { return last_compute_; }
  int ops() const { return static_cast<int>(p_.ops.size()); }
  // The ops added since `begin` are one iteration of a layer loop.
  void mark_iteration(const sim::Mark& begin, int side = -1, int copy_of = 0) {
    p_.iterations.push_back({begin.ops, ops(), side, side >= 0 ? side + 1 : side, copy_of, begin.buffers,
                             static_cast<int>(p_.buffers.size())});
  }

  int compute(double seconds, bool memory_bound, double flops, char phase, int layer, std::string name) {
    ProgramOp& o = emplace(compute_, seconds, phase, layer);
    o.memory_bound = memory_bound;
    o.executed_flops = flops;
    last_compute_ = named(std::move(name));
    return last_compute_;
  }
  // `fraction` of a communication's cost (an overlapped collective is issued in two parts).
  int comm(Axis axis, const CommCost& cost, double fraction, char phase, int layer, std::string name) {
    return comm2(axis, cost, CommCost{}, fraction, phase, layer, std::move(name));
  }
  // Two communications issued as one op (a layer's dense and expert weights gathered together).
  int comm2(Axis axis, const CommCost& a, const CommCost& b, double fraction, char phase, int layer, std::string name) {
    const double seconds = (a.seconds + b.seconds) * fraction;
    emplace(queue(axis), seconds, phase, layer);
    const int id = named(std::move(name));
    for (const CommCost* c : {&a, &b})
      for (std::size_t level = 0; level < 2; ++level) {
        if (c->bytes[level] <= 0) continue;
        const double bytes = c->bytes[level] * fraction;
        op(id).bytes_sent += bytes;
        if (seconds <= 0) continue;
        // SPMD: each device receives what it sends, so both directions of the link carry the same rate.
        p_.use(id, links_[level].first, bytes / seconds);
        p_.use(id, links_[level].second, bytes / seconds);
      }
    return id;
  }
  // A pipeline send to another stage: out of this device's link, into the receiver's.
  int send(const Network& net, const CommCost& cost, int to_device, char phase, std::string name) {
    emplace(queue(Axis::pp), cost.seconds, phase, -1);
    const int id = named(std::move(name));
    for (int level : {kIntraDomain, kInterDomain}) {
      const double bytes = cost.bytes[static_cast<std::size_t>(level)];
      if (bytes <= 0) continue;
      op(id).bytes_sent += bytes;
      if (cost.seconds <= 0 || links_[static_cast<std::size_t>(level)].first < 0) continue;
      p_.use(id, links_[static_cast<std::size_t>(level)].first, bytes / cost.seconds);
      p_.use(id, link(net, level, false, to_device), bytes / cost.seconds);
    }
    return id;
  }
  // A copy holds its direction's copy engine while it runs: concurrent copies in one direction time-share it
  // (each at its solo rate over their number); a cap on both directions together limits the bytes moved.
  int copy(bool to_device, double bytes, double seconds, int layer, std::string name) {
    emplace(to_device ? h2d_ : d2h_, seconds, 'c', layer);
    const int id = named(std::move(name));
    const int link = to_device ? h2d_link_ : d2h_link_;
    p_.use(id, link, p_.resources[static_cast<std::size_t>(link)].capacity_bytes_per_s);
    if (both_links_ >= 0) p_.use(id, both_links_, bytes / seconds);
    return id;
  }
  // The point where a collective is issued: a zero-length op that starts once `after` completes (at the step's
  // start without it), on a concurrent queue of its own, whenever the collective's queue gets to run it. The
  // buffers it allocates come alive there, as XLA's static buffer assignment and PyTorch's allocator on the
  // issuing thread take them, so a faster network does not change when they do.
  int issue(int after, char phase, int layer, std::string name) {
    if (issue_ < 0) {
      issue_ = p_.queue("issue", sim::QueueKind::concurrent, false, device_);
      p_.queues[static_cast<std::size_t>(issue_)].marks = true;
    }
    emplace(issue_, 0.0, phase, layer);
    const int id = named(std::move(name));
    if (after >= 0) op(id).deps.push_back(after);
    return id;
  }
  // Work on the host CPU, a queue of its own (the CPU optimizer update).
  int host(double seconds, char phase, std::string name) {
    if (host_cpu_ < 0) host_cpu_ = p_.queue("host_cpu", sim::QueueKind::serial, false, device_);
    emplace(host_cpu_, seconds, phase, -1);
    return named(std::move(name));
  }
  // `op` waits for `producer` when they are on different queues (a queue runs its ops in order).
  void data_dep(int op_id, int producer) {
    if (producer >= 0 && queue_of_[static_cast<std::size_t>(producer)] != queue_of_[static_cast<std::size_t>(op_id)])
      op(op_id).deps.push_back(producer);
  }
  int add_buffer(double bytes, MemCategory c, bool host = false) { return p_.add_buffer(bytes, c, host, device_); }
  // Ops from `first` on were copied in (sim/instances.hpp): their queues are noted, and the copy's last
  // compute op becomes the last one.
  void adopt(int first, int last_compute) {
    for (int i = first; i < ops(); ++i) queue_of_.push_back(static_cast<std::uint16_t>(op(i).queue));
    last_compute_ = last_compute;
  }

 private:
  ProgramOp& emplace(int queue, double seconds, char phase, int layer) {
    queue_of_.push_back(static_cast<std::uint16_t>(queue));
    p_.ops.emplace_back(queue, seconds);
    ProgramOp& o = p_.ops.back();
    o.use_begin = static_cast<std::uint32_t>(p_.uses.size());
    o.phase = phase;
    if (layer < -1 || layer > std::numeric_limits<std::int16_t>::max()) throw std::logic_error("layer " + std::to_string(layer) + " out of an op's range");
    o.layer = static_cast<std::int16_t>(layer);
    return o;
  }
  int named(std::string name) {
    if (names_) names_->push_back(std::move(name));
    return static_cast<int>(p_.ops.size()) - 1;
  }
  // A communication axis's queue is created on first use and remembered; the pipeline's queue is charged
  // with the compute stream's waits on the other stages.
  int queue(Axis axis) {
    int& q = queues_[static_cast<std::size_t>(axis)];
    if (q < 0) {
      q = p_.queue(to_string(axis), sim::QueueKind::serial, false, device_);
      // A collective's output comes alive where it is issued; a pipeline receive's buffer where the receiving
      // stage posts it, which is its queue's order, not the sender's readiness.
      if (axis == Axis::pp) p_.queues[static_cast<std::size_t>(q)].receives = true;
      else p_.queues[static_cast<std::size_t>(q)].allocates_when_ready = true;
      // The expert all-to-all's kernels (the flex dispatcher's) hold SMs while they run.
      if (axis == Axis::ep && p_.comm_sm_share > 0) p_.queues[static_cast<std::size_t>(q)].takes_sms = true;
    }
    return q;
  }

  Program& p_;
  std::vector<std::string>* names_;
  int device_, compute_;
  int last_compute_ = -1;
  int d2h_ = -1, h2d_ = -1, d2h_link_ = -1, h2d_link_ = -1, both_links_ = -1, host_cpu_ = -1, issue_ = -1;
  std::array<int, kAxisCount> queues_{-1, -1, -1, -1, -1, -1};
  std::vector<std::uint16_t>& queue_of_ = thread_queue_of();
  std::array<std::pair<int, int>, 2> links_{std::pair{-1, -1}, std::pair{-1, -1}};  // per path level: out, in
};

}  // namespace hbmsim::build
