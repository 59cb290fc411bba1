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
  copy_interference = 0;
  add_device();
}

int Program::add_device() {
  const int d = devices();
  add_queue(queues, Queue{"compute", QueueKind::serial, false, d, true, false});
  hbm_limit_bytes.push_back(0);
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

void check_issue_order(const Program& p) {
  const std::size_t n = p.ops.size();
  if (p.issue_order.size() != n) throw std::logic_error("a program's issue order does not name every op once");
  // Each op waits for its dependencies and for the op before it on its queue (serial or concurrent: a held
  // op holds the ones behind it); the order runs through iff every op is reached.
  std::vector<int> waits(n, 0), behind(n, -1), last(p.queues.size(), -1);
  std::vector<char> seen(n, 0);
  for (int i : p.issue_order) {
    if (i < 0 || static_cast<std::size_t>(i) >= n || seen[static_cast<std::size_t>(i)])
      throw std::logic_error("a program's issue order does not name every op once");
    seen[static_cast<std::size_t>(i)] = 1;
    const std::size_t q = p.ops[static_cast<std::size_t>(i)].queue;
    if (q >= p.queues.size()) throw std::logic_error("program op " + std::to_string(i) + " is on no queue");
    int& prev = last[q];
    if (prev >= 0) {
      behind[static_cast<std::size_t>(prev)] = i;
      ++waits[static_cast<std::size_t>(i)];
    }
    prev = i;
  }
  std::vector<int> start(n + 1, 0), succ;
  for (std::size_t i = 0; i < n; ++i) {
    waits[i] += static_cast<int>(p.ops[i].deps.size());
    for (int d : p.ops[i].deps) {
      if (d < 0 || static_cast<std::size_t>(d) >= n) throw std::logic_error("program op " + std::to_string(i) + " depends on no valid op");
      ++start[static_cast<std::size_t>(d) + 1];
    }
  }
  for (std::size_t i = 0; i < n; ++i) start[i + 1] += start[i];
  succ.resize(static_cast<std::size_t>(start[n]));
  std::vector<int> fill(start.begin(), start.end() - 1);
  for (std::size_t i = 0; i < n; ++i)
    for (int d : p.ops[i].deps) succ[static_cast<std::size_t>(fill[static_cast<std::size_t>(d)]++)] = static_cast<int>(i);
  std::vector<int> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (waits[i] == 0) ready.push_back(static_cast<int>(i));
  std::size_t done = 0;
  std::vector<char> ran(n, 0);
  auto release = [&](int o) {
    if (--waits[static_cast<std::size_t>(o)] == 0) ready.push_back(o);
  };
  while (!ready.empty()) {
    const int o = ready.back();
    ready.pop_back();
    ++done;
    ran[static_cast<std::size_t>(o)] = 1;
    for (int k = start[static_cast<std::size_t>(o)]; k < start[static_cast<std::size_t>(o) + 1]; ++k) release(succ[static_cast<std::size_t>(k)]);
    if (behind[static_cast<std::size_t>(o)] >= 0) release(behind[static_cast<std::size_t>(o)]);
  }
  if (done == n) return;
  // Name the first op left on each of the first queues that hold one, and what it waits for.
  auto describe = [&](int o) {
    const ProgramOp& op = p.ops[static_cast<std::size_t>(o)];
    const Queue& q = p.queues[op.queue];
    return "op " + std::to_string(o) + " (" + q.name + " of device " + std::to_string(q.device) + ", phase " + op.phase +
           ", layer " + std::to_string(op.layer) + ")";
  };
  std::string stuck;
  std::vector<char> named(p.queues.size(), 0);
  int shown = 0;
  for (int i : p.issue_order) {
    const int q = p.ops[static_cast<std::size_t>(i)].queue;
    if (ran[static_cast<std::size_t>(i)] || named[static_cast<std::size_t>(q)] || shown == 4) continue;
    named[static_cast<std::size_t>(q)] = 1;
    ++shown;
    stuck += "; " + describe(i) + " waits for";
    for (int d : p.ops[static_cast<std::size_t>(i)].deps)
      if (!ran[static_cast<std::size_t>(d)]) stuck += " " + describe(d);
  }
  throw std::logic_error("a program's issue order cannot run to the end: " + std::to_string(n - done) + " of " + std::to_string(n) +
                         " ops wait in a cycle of dependencies and queue order" + stuck);
}

}  // namespace hbmsim::sim
