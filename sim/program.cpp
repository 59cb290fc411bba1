// A program's queues, links and link uses (sim/engine.hpp); the engine that runs it is engine.cpp.
#include "sim/engine.hpp"

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>


namespace hbmsim::sim {

const char* to_string(MemCategory c) {
  static const char* names[] = {"parameters", "optimizer_state", "gradients", "gathered_weights",
                                "saved_activations", "offload_buffers", "collective_buffers", "workspace",
                                "runtime_reserve"};
  int i = static_cast<int>(c);
  return (i >= 0 && i < kMemCategories) ? names[i] : "?";
}

const char* to_string(ComputePhase c) {
  static const char* names[] = {"forward", "backward", "recompute", "optimizer"};
  int i = static_cast<int>(c);
  return (i >= 0 && i < kComputePhases) ? names[i] : "?";
}

void bad_compute_phase(char phase) {
  std::string what = "a compute op in phase '";
  what += phase;
  throw std::logic_error(what + "'");
}

namespace {

// Appends a queue to a program's and returns its index: at most kMaxQueues (an op names its queue in 16 bits).
int add_queue(std::vector<Queue>& queues, Queue q) {
  if (queues.size() >= static_cast<std::size_t>(kMaxQueues)) throw std::logic_error("a program has at most " + std::to_string(kMaxQueues) + " queues");
  queues.push_back(std::move(q));
  return static_cast<int>(queues.size()) - 1;
}

}  // namespace

void Program::clear() {
  queues.clear();
  resources.clear();
  ops.clear();
  uses.clear();
  gate_lifts.clear();
  buffers.clear();
  iterations.clear();
  issue_order.clear();
  resident.clear();
  hbm_limit_bytes.clear();
  scatter_reserve_bytes.clear();
  copy_interference = 0;
  comm_sm_share = 0;
  add_device();
}

int Program::add_device() {
  const int d = devices();
  add_queue(queues, Queue{"compute", QueueKind::serial, false, d, true, false});
  hbm_limit_bytes.push_back(0);
  scatter_reserve_bytes.push_back(0);
  return d;
}

int Program::compute_queue(int device) const {
  for (std::size_t i = 0; i < queues.size(); ++i)
    if (queues[i].compute && queues[i].device == device) return static_cast<int>(i);
  throw std::logic_error("no device " + std::to_string(device));
}

int Program::queue(const std::string& name, QueueKind kind, bool host_copy, int device) {
  for (std::size_t i = 0; i < queues.size(); ++i)
    if (queues[i].device == device && queues[i].name == name) return static_cast<int>(i);
  if (device < 0 || device >= devices()) throw std::logic_error("no device " + std::to_string(device));
  return add_queue(queues, Queue{name, kind, host_copy, device, false, false});
}

void Program::use(int op, int resource, double bytes_per_s) {
  if (resource < 0 || static_cast<std::size_t>(resource) >= resources.size() || !(bytes_per_s > 0))
    throw std::logic_error("program op " + std::to_string(op) + " uses no valid resource");
  if (op < 0 || static_cast<std::size_t>(op) + 1 != ops.size()) throw std::logic_error("link uses must be added to the last op");
  auto& o = ops.back();
  if (o.use_count == 0) o.use_begin = static_cast<std::uint32_t>(uses.size());
  if (o.use_count == std::numeric_limits<std::uint16_t>::max()) throw std::logic_error("program op " + std::to_string(op) + " uses too many links");
  uses.push_back(Use{resource, bytes_per_s});
  ++o.use_count;
  int& sole = resources[static_cast<std::size_t>(resource)].sole_queue;
  if (sole == kUnusedLink) sole = o.queue;
  else if (sole != o.queue) sole = kSharedLink;
}

int Program::resource(const std::string& name, double capacity_bytes_per_s, int device) {
  for (std::size_t i = 0; i < resources.size(); ++i)
    if (resources[i].device == device && resources[i].name == name) return static_cast<int>(i);
  resources.push_back(Resource{name, capacity_bytes_per_s, device});
  return static_cast<int>(resources.size()) - 1;
}

}  // namespace hbmsim::sim
