#include "sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hwmodels/topology.hpp"

namespace hbmsim {

using sim::MemCategory;
using sim::Program;
using sim::ProgramOp;

namespace {

// Solo durations of ops on this system: roofline with the efficiency tables, plus launch overhead.
struct Costs {
  const System& sys;
  const Topology& topo;

  double gemm_s(double flops, double bytes, Dtype dt) const {
    const auto& e = sys.efficiency;
    double t_flops = flops / (sys.gpu.peak_flops(dt) * e.gemm(dt).at(flops));
    return std::max(t_flops, memory_s_raw(bytes)) + sys.gpu.launch_overhead_s;
  }
  double attention_s(double flops) const {
    return flops / (sys.gpu.peak_flops(Dtype::bf16) * sys.efficiency.attention.at(flops)) + sys.gpu.launch_overhead_s;
  }
  double memory_s_raw(double bytes) const {
    return bytes / (sys.gpu.hbm_bandwidth_bytes_per_s * sys.efficiency.memory_bound.at(bytes));
  }
  double memory_s(double bytes) const { return memory_s_raw(bytes) + sys.gpu.launch_overhead_s; }
  double collective_eff(double bytes) const { return sys.efficiency.collective.at(std::max(bytes, 1.0)); }
  double all_gather_s(double bytes, std::int64_t group, std::int64_t stride = 1) const {
    return topo.all_gather_s(bytes, static_cast<int>(group), collective_eff(bytes), static_cast<int>(stride));
  }
  double reduce_scatter_s(double bytes, std::int64_t group, std::int64_t stride = 1) const {
    return topo.reduce_scatter_s(bytes, static_cast<int>(group), collective_eff(bytes), static_cast<int>(stride));
  }
  double all_to_all_s(double bytes, std::int64_t group) const {
    return topo.all_to_all_s(bytes, static_cast<int>(group), collective_eff(bytes));
  }
  // Copies: the per-GPU share of the host link times the copy efficiency for this size.
  double copy_rate(double bytes, bool to_device) const {
    double bw = to_device ? sys.host_h2d_bytes_per_s() : sys.host_d2h_bytes_per_s();
    return bw * sys.efficiency.copy.at(std::max(bytes, 1.0));
  }
  bool memory_bound_gemm(double flops, double bytes, Dtype dt) const {
    return memory_s_raw(bytes) > flops / (sys.gpu.peak_flops(dt) * sys.efficiency.gemm(dt).at(flops));
  }
};

// What the policy implies for one layer template, computed once and reused by every layer.
struct TemplatePlan {
  std::vector<Placement> placement;    // per tensor (internal tensors: remat)
  std::vector<bool> needed_in_bwd;     // read by some backward op
  std::vector<bool> replay;            // per op: replayed in the backward pass
  std::vector<int> producer;           // per tensor: op index, -1 for the layer input
  std::vector<int> last_fwd_use;       // per tensor: last forward op reading it (-1: none)
  std::vector<double> fwd_s, bwd_s;    // per op
  std::vector<double> dot_s;           // GEMMs: each of the two backward dots (input and weight gradient)
  std::vector<int> order;              // forward (and replay) issue order of the ops
  std::vector<bool> fwd_mem_bound;
  std::vector<int> offloaded;          // tensors offloaded
  double backward_working_set_bytes = 0;  // transient peak of one backward iteration (prefetch headroom)
  double gather_s = 0, reduce_scatter_s = 0;  // this layer's FSDP collectives
  std::vector<double> d2h_rate, h2d_rate;      // per tensor: copy rate at its size
  // One backward iteration: replays of forward ops, and backward ops. With LHS in a layer that has an
  // all-to-all, a GEMM's backward is two steps (input-gradient and weight-gradient dots).
  enum class Kind : std::uint8_t { replay, bwd, bwd_x, bwd_w };
  struct Step { Kind kind; std::size_t op; };
  std::vector<Step> steps;     // issue order
  std::vector<int> last_read;  // per tensor: the last step that reads its forward value (-1: none)
  std::vector<int> grad_last;  // per op: the last step that reads the gradients of its outputs

  double seconds(const Step& st) const {
    switch (st.kind) {
      case Kind::replay: return fwd_s[st.op];
      case Kind::bwd: return bwd_s[st.op];
      case Kind::bwd_x:
      case Kind::bwd_w: return dot_s[st.op];
    }
    return 0.0;
  }
};

// What a step reads of the forward values: a replay its inputs; a backward its saved tensors; the input-
// gradient dot of a GEMM only the weights.
const std::vector<int>& step_reads(const OpDef& def, TemplatePlan::Kind k) {
  static const std::vector<int> none;
  if (k == TemplatePlan::Kind::replay) return def.inputs;
  return k == TemplatePlan::Kind::bwd_x ? none : def.saved;
}

bool has_all_to_all(const LayerTemplate& t) {
  return std::any_of(t.ops.begin(), t.ops.end(), [](const OpDef& op) { return op.kind == OpKind::all_to_all; });
}

// Steps of one layer iteration and their data dependencies, listed in a topological order.
struct ScheduleDag {
  std::vector<double> seconds;
  std::vector<bool> a2a;  // runs on the all-to-all stream; everything else on the compute stream
  std::vector<std::vector<int>> succ;
  std::vector<int> indeg;

  explicit ScheduleDag(std::size_t n) : seconds(n, 0.0), a2a(n, false), succ(n), indeg(n, 0) {}
  void edge(int from, std::size_t to) {
    if (from < 0) return;
    succ[static_cast<std::size_t>(from)].push_back(static_cast<int>(to));
    ++indeg[to];
  }
  // What a latency-hiding list scheduler produces: each step issues at the earliest time its inputs and its
  // stream allow. Ties: an all-to-all first; with `feed_a2a_first`, the compute step closest to starting the
  // next all-to-all (so a micro-batch reaches its dispatch before the other's attention runs beside it);
  // then the longer critical path; then listing order. The backward keeps critical path first: it has
  // weight-gradient dots to fill the all-to-alls with, and feeding them first was slower there.
  std::vector<std::size_t> list_schedule(bool feed_a2a_first) const {
    const auto n = seconds.size();
    constexpr double kNever = std::numeric_limits<double>::infinity();
    std::vector<double> level(n, 0.0);  // bottom level: the longest chain of durations to the iteration's end
    std::vector<double> to_a2a(n, kNever);  // compute seconds from a step's start to the next all-to-all
    for (std::size_t i = n; i-- > 0;) {
      double tail = 0, next = kNever;
      for (int s2 : succ[i]) {
        auto j = static_cast<std::size_t>(s2);
        tail = std::max(tail, level[j]);
        next = std::min(next, a2a[j] ? 0.0 : to_a2a[j]);
      }
      level[i] = seconds[i] + tail;
      to_a2a[i] = a2a[i] ? 0.0 : seconds[i] + next;
    }
    std::vector<int> deg = indeg;
    std::vector<double> ready(n, 0.0);
    std::vector<int> avail;
    for (std::size_t i = 0; i < n; ++i)
      if (deg[i] == 0) avail.push_back(static_cast<int>(i));
    double free_at[2] = {0, 0};  // compute, all-to-all
    std::vector<std::size_t> order;
    order.reserve(n);
    while (!avail.empty()) {
      std::size_t best = 0;
      double best_start = 0;
      bool best_a2a = false;
      for (std::size_t a = 0; a < avail.size(); ++a) {
        auto i = static_cast<std::size_t>(avail[a]);
        bool on_a2a = a2a[i];
        double start = std::max(ready[i], free_at[on_a2a ? 1 : 0]);
        auto j = static_cast<std::size_t>(avail[best]);
        bool better = a == 0 || start < best_start ||
                      (start == best_start &&
                       (on_a2a > best_a2a ||
                        (on_a2a == best_a2a &&
                         ((feed_a2a_first && to_a2a[i] < to_a2a[j]) ||
                          ((!feed_a2a_first || to_a2a[i] == to_a2a[j]) &&
                           (level[i] > level[j] || (level[i] == level[j] && avail[a] < avail[best])))))));
        if (better) {
          best = a;
          best_start = start;
          best_a2a = on_a2a;
        }
      }
      auto i = static_cast<std::size_t>(avail[best]);
      avail.erase(avail.begin() + static_cast<long>(best));
      double end = best_start + seconds[i];
      free_at[best_a2a ? 1 : 0] = end;
      order.push_back(i);
      for (int s2 : succ[i]) {
        auto j = static_cast<std::size_t>(s2);
        ready[j] = std::max(ready[j], end);
        if (--deg[j] == 0) avail.push_back(s2);
      }
    }
    return order;
  }
};

// The issue order of one backward iteration. Without LHS (or without an all-to-all to hide) it is program
// order: replays in forward order, then the backward ops reversed. With LHS it is what a latency-hiding list
// scheduler produces from the iteration's data dependencies and solo durations: each step issues at the
// earliest time its inputs and its resource allow (ties: all-to-all first, then the longer critical path,
// then program order), so compute that does not need an all-to-all in flight runs beside it and its
// consumers wait until it ends.
void plan_backward_steps(const LayerTemplate& t, bool lhs, TemplatePlan& p) {
  using Kind = TemplatePlan::Kind;
  const auto no = t.ops.size(), nt = t.tensors.size();
  const bool schedule = lhs && has_all_to_all(t);
  auto& steps = p.steps;
  steps.clear();
  for (int o : p.order)
    if (p.replay[static_cast<std::size_t>(o)]) steps.push_back({Kind::replay, static_cast<std::size_t>(o)});
  for (std::size_t o = no; o-- > 0;) {
    if (schedule && t.ops[o].kind == OpKind::gemm) {
      steps.push_back({Kind::bwd_x, o});
      steps.push_back({Kind::bwd_w, o});
    } else {
      steps.push_back({Kind::bwd, o});
    }
  }
  if (schedule) {
    const auto n = steps.size();
    std::vector<int> replay_step(no, -1), grad_step(no, -1);  // grad_step: writes the op's input gradients
    for (std::size_t i = 0; i < n; ++i) {
      if (steps[i].kind == Kind::replay) replay_step[steps[i].op] = static_cast<int>(i);
      if (steps[i].kind == Kind::bwd || steps[i].kind == Kind::bwd_x) grad_step[steps[i].op] = static_cast<int>(i);
    }
    std::vector<std::vector<int>> consumers(nt);
    for (std::size_t o = 0; o < no; ++o)
      for (int in : t.ops[o].inputs) consumers[static_cast<std::size_t>(in)].push_back(static_cast<int>(o));
    ScheduleDag dag(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& def = t.ops[steps[i].op];
      dag.seconds[i] = p.seconds(steps[i]);
      dag.a2a[i] = def.kind == OpKind::all_to_all;
      for (int k : step_reads(def, steps[i].kind)) {  // forward values regenerated in this iteration
        int prod = p.producer[static_cast<std::size_t>(k)];
        if (prod >= 0 && p.placement[static_cast<std::size_t>(k)] == Placement::remat)
          dag.edge(replay_step[static_cast<std::size_t>(prod)], i);
      }
      if (steps[i].kind == Kind::replay) continue;
      for (int out : def.outputs)  // the gradient of each output, from every consumer's backward
        for (int c : consumers[static_cast<std::size_t>(out)]) dag.edge(grad_step[static_cast<std::size_t>(c)], i);
    }
    std::vector<TemplatePlan::Step> order;
    order.reserve(n);
    for (std::size_t i : dag.list_schedule(false)) order.push_back(steps[i]);
    steps = std::move(order);
  }
  p.last_read.assign(nt, -1);
  p.grad_last.assign(no, -1);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const auto& def = t.ops[steps[s].op];
    for (int k : step_reads(def, steps[s].kind)) p.last_read[static_cast<std::size_t>(k)] = static_cast<int>(s);
    if (steps[s].kind != Kind::replay) p.grad_last[steps[s].op] = static_cast<int>(s);
  }
}

// What one backward iteration allocates beyond prefetched tensors: gathered weights, the gradient
// buffer, replayed tensors and activation gradients. LHS keeps this much free when it hoists prefetches.
double backward_working_set(const LayerTemplate& t, const TemplatePlan& p) {
  const auto& steps = p.steps;
  const auto& last_read = p.last_read;
  double live = t.gathered_dense_bytes + t.gathered_expert_bytes + t.grad_dense_bytes + t.grad_expert_bytes +
                t.tensors[0].bytes;  // incoming gradient
  double peak = live;
  std::vector<bool> replayed(t.tensors.size(), false), grad(t.tensors.size(), false);
  using Kind = TemplatePlan::Kind;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const auto& def = t.ops[steps[s].op];
    const Kind kind = steps[s].kind;
    if (kind == Kind::replay) {
      for (int out : def.outputs) {
        auto k = static_cast<std::size_t>(out);
        if (p.placement[k] != Placement::remat || replayed[k]) continue;
        replayed[k] = true;
        live += t.tensors[k].bytes;
      }
    } else if (kind != Kind::bwd_w) {
      for (int in : def.inputs)
        if (!grad[static_cast<std::size_t>(in)]) {
          grad[static_cast<std::size_t>(in)] = true;
          live += t.tensors[static_cast<std::size_t>(in)].bytes;
        }
    }
    peak = std::max(peak, live);
    for (int k : step_reads(def, kind))
      if (last_read[static_cast<std::size_t>(k)] == static_cast<int>(s) && replayed[static_cast<std::size_t>(k)])
        live -= t.tensors[static_cast<std::size_t>(k)].bytes;
    if (kind != Kind::replay && p.grad_last[steps[s].op] == static_cast<int>(s))
      for (int out : def.outputs)
        if (grad[static_cast<std::size_t>(out)]) live -= t.tensors[static_cast<std::size_t>(out)].bytes;
  }
  return peak;
}

// The forward issue order. Without LHS (or without an all-to-all to hide) it is program order and an
// all-to-all blocks the compute stream. With LHS the list scheduler orders the ops by their data
// dependencies, so work that does not need an all-to-all in flight (the shared expert; with a batch split,
// the other micro-batch) runs beside it.
void plan_forward_order(const LayerTemplate& t, bool lhs, TemplatePlan& p) {
  const auto no = t.ops.size();
  p.order.clear();
  if (!lhs || !has_all_to_all(t)) {
    for (std::size_t o = 0; o < no; ++o) p.order.push_back(static_cast<int>(o));
    return;
  }
  ScheduleDag dag(no);
  for (std::size_t o = 0; o < no; ++o) {
    dag.seconds[o] = p.fwd_s[o];
    dag.a2a[o] = t.ops[o].kind == OpKind::all_to_all;
    for (int in : t.ops[o].inputs) dag.edge(p.producer[static_cast<std::size_t>(in)], o);
  }
  for (std::size_t o : dag.list_schedule(true)) p.order.push_back(static_cast<int>(o));
}

TemplatePlan plan_template(const LayerTemplate& t, const Policy& policy, const Costs& c, const StepGraph& g, bool lhs) {
  TemplatePlan p;
  const auto nt = t.tensors.size(), no = t.ops.size();
  p.placement.assign(nt, Placement::remat);
  p.needed_in_bwd.assign(nt, false);
  p.replay.assign(no, false);
  p.producer.assign(nt, -1);
  p.last_fwd_use.assign(nt, -1);
  for (std::size_t i = 0; i < nt; ++i)
    if (t.tensors[i].checkpoint) p.placement[i] = policy.placement(t.tensors[i].name);
  p.placement[0] = Placement::device;
  for (std::size_t o = 0; o < no; ++o) {
    for (int out : t.ops[o].outputs) p.producer[static_cast<std::size_t>(out)] = static_cast<int>(o);
    for (int s : t.ops[o].saved) p.needed_in_bwd[static_cast<std::size_t>(s)] = true;
  }
  // Tensors the backward needs but nobody saved are recomputed, and so are whatever their producers need.
  std::vector<int> work;
  for (std::size_t i = 0; i < nt; ++i)
    if (p.needed_in_bwd[i] && p.placement[i] == Placement::remat) work.push_back(static_cast<int>(i));
  while (!work.empty()) {
    int tensor = work.back();
    work.pop_back();
    int op = p.producer[static_cast<std::size_t>(tensor)];
    if (op < 0 || p.replay[static_cast<std::size_t>(op)]) continue;
    p.replay[static_cast<std::size_t>(op)] = true;
    for (int in : t.ops[static_cast<std::size_t>(op)].inputs)
      if (p.placement[static_cast<std::size_t>(in)] == Placement::remat) work.push_back(in);
  }
  for (std::size_t i = 0; i < nt; ++i)
    if (p.placement[i] == Placement::offload) p.offloaded.push_back(static_cast<int>(i));
  for (const auto& op : t.ops) {
    double f = 0, b = 0, dot = 0;
    bool mb = false;
    switch (op.kind) {
      case OpKind::gemm:
        // The backward is two dots of the forward's size, each with its own efficiency and launch.
        f = c.gemm_s(op.flops, op.bytes, op.dtype);
        dot = c.gemm_s(op.bwd_flops / 2, op.bwd_bytes / 2, op.dtype);
        b = 2 * dot;
        mb = c.memory_bound_gemm(op.flops, op.bytes, op.dtype);
        break;
      case OpKind::attention:
        f = c.attention_s(op.flops);
        b = c.attention_s(op.bwd_flops);
        break;
      case OpKind::memory:
        f = c.memory_s(op.bytes);
        b = c.memory_s(op.bwd_bytes);
        mb = true;
        break;
      case OpKind::all_to_all:
        f = c.all_to_all_s(op.bytes, g.ep_group);
        b = c.all_to_all_s(op.bwd_bytes, g.ep_group);
        break;
    }
    p.fwd_s.push_back(f);
    p.bwd_s.push_back(b);
    p.dot_s.push_back(dot);
    p.fwd_mem_bound.push_back(mb);
  }
  plan_forward_order(t, lhs, p);
  for (int o : p.order)
    for (int in : t.ops[static_cast<std::size_t>(o)].inputs) p.last_fwd_use[static_cast<std::size_t>(in)] = o;
  plan_backward_steps(t, lhs, p);
  p.backward_working_set_bytes = backward_working_set(t, p);
  p.gather_s = c.all_gather_s(t.gathered_dense_bytes, g.fsdp_group) +
               c.all_gather_s(t.gathered_expert_bytes, g.expert_fsdp_group, g.expert_fsdp_stride);
  p.reduce_scatter_s = c.reduce_scatter_s(t.grad_dense_bytes, g.fsdp_group) +
                       c.reduce_scatter_s(t.grad_expert_bytes, g.expert_fsdp_group, g.expert_fsdp_stride);
  for (auto& tensor : t.tensors) {
    p.d2h_rate.push_back(c.copy_rate(tensor.bytes, false));
    p.h2d_rate.push_back(c.copy_rate(tensor.bytes, true));
  }
  return p;
}

class ProgramBuilder {
 public:
  ProgramBuilder(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                 std::vector<std::string>* names, Program& out)
      : g_(g), sys_(sys), opt_(opt), topo_(sys, static_cast<int>(g.training.gpus)), costs_{sys, topo_}, names_(names),
        prog_(out) {
    prog_.ops.clear();
    prog_.buffers.clear();
    prog_.resident.clear();
    double headroom = 0;
    std::size_t ops_estimate = 0;
    std::size_t ops_bound = 0;  // per layer at most: forward, replay and two backward dots per op, stage, D2H
                                // and H2D per tensor, gathers and reduce-scatter (reserved: no relocation)
    for (std::int64_t l = 0; l < g.model.num_layers; ++l) {
      ops_estimate += 3 * g.layer(l).ops.size() + 8;
      ops_bound += 4 * g.layer(l).ops.size() + 3 * g.layer(l).tensors.size() + 8;
    }
    // Event budget: a step larger than this would take seconds and gigabytes; refuse it up front.
    constexpr std::size_t kMaxOps = 4'000'000;
    const double total_ops = static_cast<double>(ops_estimate) * static_cast<double>(g.training.grad_accum);
    if (total_ops > kMaxOps)
      throw InputError("layers x grad_accum = " + std::to_string(g.model.num_layers) + " x " +
                       std::to_string(g.training.grad_accum) + " (the step would need about " +
                       std::to_string(static_cast<long long>(total_ops)) + " simulated ops; the budget is 4000000)");
    prog_.ops.reserve(ops_bound * static_cast<std::size_t>(g.training.grad_accum) + 16);
    prog_.buffers.reserve(ops_bound * static_cast<std::size_t>(g.training.grad_accum) + 16);
    for (auto& t : g.templates) {
      plans_.push_back(plan_template(t, policy, costs_, g, opt.lhs));
      headroom = std::max(headroom, plans_.back().backward_working_set_bytes);
    }
    prog_.hbm_limit_bytes = opt.memory_limit_slop * sys.gpu.hbm_bytes - headroom;
    prog_.copy_interference = sys.efficiency.compute_slowdown_during_copy;
    plan_loop_bodies();
  }

  void build() {
    for (auto [bytes, cat] : {std::pair{g_.parameter_bytes, MemCategory::parameters},
                              {g_.optimizer_bytes, MemCategory::optimizer_state},
                              {g_.gradient_bytes, MemCategory::gradients},
                              {sys_.runtime.reserve_bytes, MemCategory::runtime_reserve}})
      prog_.resident.push_back(prog_.add_buffer(bytes, cat));
    std::vector<int> rs_ops;
    for (std::int64_t m = 0; m < g_.training.grad_accum; ++m) micro_batch(rs_ops);
    int opt = compute_op(costs_.memory_s(g_.optimizer_update_bytes), true, 0, 'o', -1, "optimizer_update");
    for (int r : rs_ops) op(opt).deps.push_back(r);
  }

 private:
  struct LayerState {
    int input_buf = -1, output_buf = -1;
    std::vector<int> buf;       // per tensor: forward buffer (-1: none)
    std::vector<int> host_buf;  // per tensor: pinned host copy (-1: not offloaded)
    std::vector<int> d2h;       // per tensor: the D2H op
    int fwd_first = -1, fwd_last = -1, bwd_last = -1;
    int ag_bwd = -1, gathered_bwd = -1;  // backward all-gather, issued one layer ahead
    int bwd_iteration_start = -1;        // the op the layer's backward iteration starts after
  };

  // With while-loop double buffering a scan body holds two consecutive layers of the same template (in
  // the order the loop runs them; a body never spans two scans), so LHS may move a transfer across the
  // first layer's iteration boundary (compute is not reordered across the two layers here). Without LHS
  // nothing moves it. Per layer: the layer after its forward body, and the first layer of its backward body
  // (the backward runs the layers in reverse).
  void plan_loop_bodies() {
    const auto L = static_cast<std::size_t>(g_.model.num_layers);
    fwd_body_end_.resize(L);
    bwd_body_first_.resize(L);
    const std::size_t len = opt_.double_buffering && opt_.lhs ? 2 : 1;
    for (std::size_t first = 0; first < L;) {  // one scan per run of layers of the same template
      std::size_t end = first;
      while (end < L && g_.layer_template[end] == g_.layer_template[first]) ++end;
      for (std::size_t l = first; l < end; ++l) {
        fwd_body_end_[l] = static_cast<std::int64_t>(std::min(first + (l - first) / len * len + len, end));
        bwd_body_first_[l] = static_cast<std::int64_t>(end - 1 - (end - 1 - l) / len * len);
      }
      first = end;
    }
  }

  // With LHS a layer's ops come in the list scheduler's order and cross-stream dependencies are explicit (an
  // all-to-all waits for the ops that wrote its input; only the ops that read its result wait for it).
  // Without LHS an all-to-all blocks the compute stream between its neighbours in program order.
  bool scheduled_by_lhs() const { return opt_.lhs; }

  std::string label(const std::string& what, std::int64_t layer) const {
    return names_ ? what + " L" + std::to_string(layer) : std::string();
  }
  std::string label(const char* prefix, const std::string& what, std::int64_t layer) const {
    return names_ ? prefix + what + " L" + std::to_string(layer) : std::string();
  }
  // Ops are built in place (they are large) and named when complete, in creation order.
  ProgramOp& emplace(int stream, double amount, double cap = 1) {
    prog_.ops.emplace_back(stream, amount, cap);
    return prog_.ops.back();
  }
  int named(std::string name) {
    if (names_) names_->push_back(std::move(name));
    return static_cast<int>(prog_.ops.size()) - 1;
  }
  // `independent`: does not wait for the all-to-all in flight (its dependencies are explicit).
  int compute_op(double seconds, bool mem_bound, double flops, char phase, int layer, std::string name,
                 bool independent = false) {
    ProgramOp& o = emplace(sim::compute, seconds);
    o.memory_bound = mem_bound;
    o.executed_flops = flops;
    o.phase = phase;
    o.layer = layer;
    if (pending_a2a_ >= 0 && !independent) o.deps.push_back(std::exchange(pending_a2a_, -1));
    last_compute_ = named(std::move(name));
    return last_compute_;
  }
  // Chained: the all-to-all waits for the compute before it, and the compute after it waits for it.
  // Otherwise the caller adds its dependencies.
  int a2a_op(double seconds, char phase, int layer, std::string name, bool chain = true) {
    ProgramOp& o = emplace(sim::expert_a2a, seconds);
    if (chain && last_compute_ >= 0) o.deps.push_back(last_compute_);
    o.phase = phase;
    o.layer = layer;
    int id = named(std::move(name));
    if (chain) pending_a2a_ = id;
    return id;
  }
  ProgramOp& op(int i) { return prog_.ops[static_cast<std::size_t>(i)]; }
  const TemplatePlan& plan(std::int64_t l) const {
    return plans_[static_cast<std::size_t>(g_.layer_template[static_cast<std::size_t>(l)])];
  }

  void micro_batch(std::vector<int>& rs_ops) {
    const auto L = g_.model.num_layers;
    const double act = dtype_bytes(g_.training.activation_dtype);
    const double T = static_cast<double>(g_.training.tokens_per_device());
    const double d = static_cast<double>(g_.model.d_model);

    // The two tables are gathered where they are used: the input embedding for the lookup (then freed; its
    // gradient is a scatter that does not read it), the unembedding one layer ahead of the head.
    const double table_bytes = g_.embed_gathered_bytes / 2;
    auto gather_table = [&](const char* name, int after) {
      int buf = prog_.add_buffer(table_bytes, MemCategory::gathered_weights);
      ProgramOp& ag = emplace(sim::collective, costs_.all_gather_s(table_bytes, g_.fsdp_group));
      ag.allocs = {buf};
      if (after >= 0) ag.deps.push_back(after);
      return std::pair{named(name), buf};
    };
    auto [ag_embed, embed_buf] = gather_table("all_gather embedding", -1);
    int input_buf = prog_.add_buffer(T * d * act, MemCategory::saved_activations);
    int lookup = compute_op(costs_.memory_s(2 * T * d * act), true, 0, 'f', -1, "embedding_lookup");
    op(lookup).deps.push_back(ag_embed);
    op(lookup).allocs.push_back(input_buf);
    op(lookup).releases.push_back(embed_buf);

    std::vector<LayerState> layers(static_cast<std::size_t>(L));
    std::vector<std::vector<int>> barrier(static_cast<std::size_t>(L) + 2);  // copies iteration l must wait for
    for (std::int64_t l = 0; l < L; ++l) {
      auto& st = layers[static_cast<std::size_t>(l)];
      st.input_buf = input_buf;
      forward_layer(l, layers, barrier);
      input_buf = st.output_buf;
    }
    auto [ag_head, head_buf] = gather_table("all_gather unembedding", L >= 2 ? layers[static_cast<std::size_t>(L - 2)].fwd_last : lookup);

    // Head: final norm, unembedding and loss, then their backward. The loss runs in fp32 (MaxText casts
    // logits to float32 for cross-entropy): bf16 logits, their fp32 copy and the fp32 gradient.
    const double logit_elems = g_.logits_bytes / act;
    int logits = prog_.add_buffer(logit_elems * (act + 4 + 4), MemCategory::workspace);
    int norm = compute_op(costs_.memory_s(2 * T * d * act), true, 0, 'f', -1, "final_norm");
    for (auto& b : {barrier[static_cast<std::size_t>(L)], barrier[static_cast<std::size_t>(L) + 1]})
      for (int c : b) op(norm).deps.push_back(c);
    int unembed = compute_op(costs_.gemm_s(g_.unembed_flops, g_.logits_bytes, Dtype::bf16), false, g_.unembed_flops,
                             'f', -1, "unembed");
    op(unembed).allocs.push_back(logits);
    op(unembed).deps.push_back(ag_head);
    compute_op(costs_.memory_s(3 * g_.logits_bytes), true, 0, 'f', -1, "softmax_cross_entropy");
    int grad_carry = prog_.add_buffer(T * d * act, MemCategory::workspace);
    int unembed_bwd = compute_op(costs_.gemm_s(2 * g_.unembed_flops, 2 * g_.logits_bytes, Dtype::bf16), false,
                                 2 * g_.unembed_flops, 'b', -1, "unembed_bwd");
    op(unembed_bwd).allocs.push_back(grad_carry);
    op(unembed_bwd).releases = {logits, head_buf, input_buf};
    backward_start_ = unembed_bwd;

    if (opt_.pipelined_collectives) prefetch_backward_gather(L - 1, layers);
    for (std::int64_t l = L - 1; l >= 0; --l) grad_carry = backward_layer(l, layers, grad_carry, rs_ops);

    int embed_grad = prog_.add_buffer(g_.embed_grad_bytes, MemCategory::collective_buffers);
    int scatter = compute_op(costs_.memory_s(2 * T * d * act), true, 0, 'b', -1, "embedding_bwd");
    op(scatter).allocs.push_back(embed_grad);
    op(scatter).releases.push_back(grad_carry);
    ProgramOp& rs = emplace(sim::collective, costs_.reduce_scatter_s(g_.embed_grad_bytes, g_.fsdp_group));
    rs.deps = {scatter};
    rs.releases = {embed_grad};
    rs.phase = 'b';
    rs_ops.push_back(named("reduce_scatter embedding"));
  }

  int gather_layer(const LayerTemplate& t, std::int64_t l, int after, char phase) {
    int gathered = prog_.add_buffer(t.gathered_dense_bytes + t.gathered_expert_bytes, MemCategory::gathered_weights);
    ProgramOp& ag = emplace(sim::collective, plan(l).gather_s);
    ag.allocs = {gathered};
    ag.layer = static_cast<int>(l);
    ag.phase = phase;
    if (after >= 0) ag.deps.push_back(after);
    gather_buf_ = gathered;
    return named(label(phase == 'f' ? "all_gather" : "all_gather bwd", l));
  }

  void forward_layer(std::int64_t l, std::vector<LayerState>& layers, std::vector<std::vector<int>>& barrier) {
    auto& st = layers[static_cast<std::size_t>(l)];
    const auto& t = g_.layer(l);
    const auto& p = plan(l);
    const auto nt = t.tensors.size();
    const bool pipelined = opt_.lhs && opt_.pipelined_transfers;
    // FSDP all-gather one layer ahead: it may start once layer l-2 is done with its weights.
    // Pipelined collectives gather one layer ahead (from when layer l-2 is done with its weights); without
    // them the gather sits at the top of its own iteration and the layer waits for it.
    const auto prior = static_cast<std::size_t>(opt_.pipelined_collectives ? l - 2 : l - 1);
    int ag_op = gather_layer(t, l, l >= (opt_.pipelined_collectives ? 2 : 1) ? layers[prior].fwd_last : -1, 'f');
    int gathered = gather_buf_;

    st.buf.assign(nt, -1);
    st.host_buf.assign(nt, -1);
    st.d2h.assign(nt, -1);
    st.buf[0] = st.input_buf;
    for (std::size_t k = 1; k < nt; ++k) {
      MemCategory cat = MemCategory::workspace;
      if (p.placement[k] == Placement::device || static_cast<int>(k) == t.output_tensor) cat = MemCategory::saved_activations;
      else if (p.placement[k] == Placement::offload) cat = MemCategory::offload_buffers;
      st.buf[k] = prog_.add_buffer(t.tensors[k].bytes, cat);
    }
    st.output_buf = st.buf[static_cast<std::size_t>(t.output_tensor)];

    auto& pending = pending_;
    pending.clear();
    auto& op_id = op_id_;
    op_id.assign(t.ops.size(), -1);
    const bool scheduled = scheduled_by_lhs();
    for (int oi : p.order) {
      const auto o = static_cast<std::size_t>(oi);
      const auto& def = t.ops[o];
      const bool a2a = def.kind == OpKind::all_to_all;
      int id = a2a ? a2a_op(p.fwd_s[o], 'f', static_cast<int>(l), label(def.name, l), !scheduled)
                   : compute_op(p.fwd_s[o], p.fwd_mem_bound[o], def.flops, 'f', static_cast<int>(l), label(def.name, l),
                                scheduled);
      op_id[o] = id;
      if (scheduled)
        for (int in : def.inputs)
          if (int prod = p.producer[static_cast<std::size_t>(in)]; prod >= 0) {
            int pid = op_id[static_cast<std::size_t>(prod)];
            if (a2a || op(pid).stream == sim::expert_a2a) op(id).deps.push_back(pid);
          }
      if (st.fwd_first < 0) {
        st.fwd_first = id;
        op(id).deps.push_back(ag_op);
        for (int c : barrier[static_cast<std::size_t>(l)]) op(id).deps.push_back(c);
      }
      for (int out : def.outputs) op(id).allocs.push_back(st.buf[static_cast<std::size_t>(out)]);
      for (int out : def.outputs) {
        auto k = static_cast<std::size_t>(out);
        if (p.placement[k] != Placement::offload) continue;
        int src = st.buf[k], after = id;
        if (pipelined) {
          // Staged through a loop-carried device buffer so the copy may finish in a later iteration.
          int staged = prog_.add_buffer(t.tensors[k].bytes, MemCategory::offload_buffers);
          after = compute_op(costs_.memory_s(2 * t.tensors[k].bytes), true, 0, 'f', static_cast<int>(l),
                             label("stage ", t.tensors[k].name, l));
          op(after).allocs.push_back(staged);
          op(after).releases.push_back(src);  // the stage copy is one more reader of the original
          src = staged;
        }
        pending.push_back({k, after, src});
      }
    }
    st.fwd_last = last_compute_;
    // Copies are added after the layer's ops: without LHS an async copy starts right before the op that
    // waits for it, which is the iteration's end; with LHS right after its producer. LHS: done by the end of
    // this iteration (double buffering: of this loop body); pipelined: by the end of the next one.
    const auto done_by = static_cast<std::size_t>(pipelined ? l + 2 : fwd_body_end_[static_cast<std::size_t>(l)]);
    for (auto& pc : pending) {
      const auto k = pc.tensor;
      int host = prog_.add_buffer(t.tensors[k].bytes, MemCategory::offload_buffers, true);
      ProgramOp& copy = emplace(sim::d2h, t.tensors[k].bytes, p.d2h_rate[k]);
      copy.deps = {opt_.lhs ? pc.after : st.fwd_last};
      copy.priority = static_cast<int>(l);
      copy.allocs = {host};
      copy.releases = {pc.src};
      copy.layer = static_cast<int>(l);
      copy.phase = 'c';
      st.host_buf[k] = host;
      st.d2h[k] = named(label("d2h ", t.tensors[k].name, l));
      barrier[done_by].push_back(st.d2h[k]);
    }
    // Forward-only tensors die after their last forward reader (or at once if nobody reads them).
    for (std::size_t k = 1; k < nt; ++k) {
      if (static_cast<int>(k) == t.output_tensor || p.placement[k] == Placement::device) continue;
      if (p.placement[k] == Placement::offload && pipelined) continue;  // released by its stage copy
      int reader = p.last_fwd_use[k] >= 0 ? op_id[static_cast<std::size_t>(p.last_fwd_use[k])]
                                          : op_id[static_cast<std::size_t>(p.producer[k])];
      if (p.placement[k] == Placement::offload && p.last_fwd_use[k] < 0) continue;  // the D2H releases it
      op(reader).releases.push_back(st.buf[k]);
    }
    op(st.fwd_last).releases.push_back(gathered);
  }

  void prefetch_backward_gather(std::int64_t l, std::vector<LayerState>& layers) {
    const auto L = g_.model.num_layers;
    auto& st = layers[static_cast<std::size_t>(l)];
    st.ag_bwd = gather_layer(g_.layer(l), l, l + 2 < L ? layers[static_cast<std::size_t>(l + 2)].bwd_last : -1, 'b');
    st.gathered_bwd = gather_buf_;
  }

  int backward_layer(std::int64_t l, std::vector<LayerState>& layers, int grad_in, std::vector<int>& rs_ops) {
    auto& st = layers[static_cast<std::size_t>(l)];
    const auto& t = g_.layer(l);
    const auto& p = plan(l);
    const auto nt = t.tensors.size();
    const bool pipelined = opt_.lhs && opt_.pipelined_transfers;
    const int iteration_start = last_compute_;
    st.bwd_iteration_start = iteration_start;
    // Transfers may start from the start of the loop body, which double buffering makes two layers long.
    const int body_start = layers[static_cast<std::size_t>(bwd_body_first_[static_cast<std::size_t>(l)])].bwd_iteration_start;
    // Issue the next layer's gather before this layer's reduce-scatter so the two never queue behind
    // each other; it may start once layer l+1 is done with its weights.
    if (opt_.pipelined_collectives) {
      if (l >= 1) prefetch_backward_gather(l - 1, layers);
    } else {
      st.ag_bwd = gather_layer(t, l, iteration_start, 'b');
      st.gathered_bwd = gather_buf_;
    }
    const int ag_op = st.ag_bwd, gathered = st.gathered_bwd;

    const auto& steps = p.steps;
    const auto& last_read = p.last_read;
    auto read = [&](std::size_t k) { return last_read[k] >= 0; };

    auto& buf = buf_;
    auto& h2d = h2d_;
    buf.assign(nt, -1);
    h2d.assign(nt, -1);
    for (std::size_t k = 0; k < nt; ++k)
      if (k == 0 || p.placement[k] == Placement::device) buf[k] = st.buf[k];
    auto make_h2d = [&](std::size_t k, std::vector<int> deps) {
      int dst = prog_.add_buffer(t.tensors[k].bytes, MemCategory::offload_buffers);
      ProgramOp& copy = emplace(sim::h2d, t.tensors[k].bytes, p.h2d_rate[k]);
      copy.allocs = {dst};
      copy.releases = {st.host_buf[k]};
      copy.deps = deps;
      copy.deps.push_back(st.d2h[k]);
      copy.layer = static_cast<int>(l);
      copy.phase = 'c';
      copy.priority = static_cast<int>(g_.model.num_layers - l);  // the layer needed soonest goes first
      if (opt_.lhs) copy.gate_bytes = t.tensors[k].bytes;
      h2d[k] = named(label("h2d ", t.tensors[k].name, l));
      buf[k] = dst;
    };
    // With LHS the prefetch is hoisted to the iteration's start (pipelined: the previous iteration's).
    if (opt_.lhs) {
      for (std::size_t k = 1; k < nt; ++k) {
        if (p.placement[k] != Placement::offload) continue;
        if (!read(k)) continue;
        std::vector<int> deps;
        if (pipelined) {
          // Pipelined: the copy may cross iteration boundaries back to the start of the backward pass;
          // the memory limit is what holds it back.
          deps.push_back(backward_start_);
        } else if (body_start >= 0) {
          deps.push_back(body_start);
        }
        make_h2d(k, std::move(deps));
      }
    }

    int grad_buf = prog_.add_buffer(t.grad_dense_bytes + t.grad_expert_bytes, MemCategory::collective_buffers);
    auto& grad = grad_;
    grad.assign(nt, -1);
    grad[static_cast<std::size_t>(t.output_tensor)] = grad_in;
    using Kind = TemplatePlan::Kind;
    const bool scheduled = scheduled_by_lhs();
    bool first = true;
    auto begin_iteration = [&](int id) {  // the first compute op waits for the weights and opens the gradients
      if (!first) return;
      op(id).deps.push_back(ag_op);
      op(id).allocs.push_back(grad_buf);
      first = false;
    };
    auto& val_op = val_op_;      // per tensor: the op that regenerated its value in this iteration (-1: none)
    auto& grad_ops = grad_ops_;  // per tensor: the ops that wrote its gradient in this iteration
    val_op.assign(nt, -1);
    if (grad_ops.size() < nt) grad_ops.resize(nt);
    for (std::size_t k = 0; k < nt; ++k) grad_ops[k].clear();
    auto is_a2a = [&](int id) { return op(id).stream == sim::expert_a2a; };
    for (std::size_t s = 0; s < steps.size(); ++s) {
      const std::size_t o = steps[s].op;
      const auto& def = t.ops[o];
      const Kind kind = steps[s].kind;
      const bool replay = kind == Kind::replay;
      const auto& reads = step_reads(def, kind);
      // Without LHS the copy starts right before the first op that reads it.
      for (int k : reads) {
        auto kk = static_cast<std::size_t>(k);
        if (p.placement[kk] == Placement::offload && h2d[kk] < 0 && !opt_.lhs)
          make_h2d(kk, last_compute_ >= 0 ? std::vector<int>{last_compute_} : std::vector<int>{});
      }
      const double seconds = p.seconds(steps[s]);
      double flops = replay ? def.flops : kind == Kind::bwd ? def.bwd_flops : def.bwd_flops / 2;
      const char* prefix = replay ? "recompute " : kind == Kind::bwd ? "bwd " : kind == Kind::bwd_x ? "bwd_x " : "bwd_w ";
      std::string name = names_ ? prefix + def.name + " L" + std::to_string(l) : std::string();
      int id;
      if (def.kind == OpKind::all_to_all) {
        id = a2a_op(seconds, replay ? 'r' : 'b', static_cast<int>(l), std::move(name), !scheduled);
        if (scheduled) {
          if (replay) {
            for (int in : def.inputs)
              if (val_op[static_cast<std::size_t>(in)] >= 0) op(id).deps.push_back(val_op[static_cast<std::size_t>(in)]);
          } else {
            for (int out : def.outputs) {
              for (int g : grad_ops[static_cast<std::size_t>(out)]) op(id).deps.push_back(g);
              if (out == t.output_tensor && iteration_start >= 0) op(id).deps.push_back(iteration_start);
            }
          }
        }
      } else {
        id = compute_op(seconds, p.fwd_mem_bound[o], flops, replay ? 'r' : 'b', static_cast<int>(l), std::move(name));
        begin_iteration(id);
        if (scheduled) {
          for (int k : reads)
            if (int v = val_op[static_cast<std::size_t>(k)]; v >= 0 && is_a2a(v)) op(id).deps.push_back(v);
          if (!replay)
            for (int out : def.outputs)
              for (int g : grad_ops[static_cast<std::size_t>(out)])
                if (is_a2a(g)) op(id).deps.push_back(g);
        }
      }
      for (int k : reads) {
        auto kk = static_cast<std::size_t>(k);
        if (h2d[kk] >= 0) op(id).deps.push_back(h2d[kk]);
        if (last_read[kk] == static_cast<int>(s) && buf[kk] >= 0) op(id).releases.push_back(buf[kk]);
      }
      if (replay) {
        for (int out : def.outputs) {
          auto kk = static_cast<std::size_t>(out);
          val_op[kk] = id;
          if (buf[kk] >= 0 || p.placement[kk] == Placement::offload) continue;
          buf[kk] = prog_.add_buffer(t.tensors[kk].bytes, MemCategory::workspace);
          op(id).allocs.push_back(buf[kk]);
          if (!read(kk) || last_read[kk] <= static_cast<int>(s)) op(id).releases.push_back(buf[kk]);
        }
        continue;
      }
      // A backward step writes the gradients of its inputs (the weight-gradient dot writes only the
      // layer's weight gradients) and, as their last reader, drops the gradients of its outputs.
      if (kind != Kind::bwd_w) {
        for (int in : def.inputs) {
          auto kk = static_cast<std::size_t>(in);
          if (grad[kk] < 0) {
            grad[kk] = prog_.add_buffer(t.tensors[kk].bytes, MemCategory::workspace);
            op(id).allocs.push_back(grad[kk]);
          }
          grad_ops[kk].push_back(id);
        }
      }
      if (p.grad_last[o] == static_cast<int>(s))
        for (int out : def.outputs)
          if (grad[static_cast<std::size_t>(out)] >= 0) op(id).releases.push_back(grad[static_cast<std::size_t>(out)]);
    }
    st.bwd_last = last_compute_;
    op(st.bwd_last).releases.push_back(gathered);
    // Saved tensors nobody read, and host copies nobody fetched, go at the end of the iteration.
    for (std::size_t k = 1; k < nt; ++k) {
      if (p.placement[k] == Placement::device && !read(k)) op(st.bwd_last).releases.push_back(st.buf[k]);
      if (p.placement[k] == Placement::offload && h2d[k] < 0) op(st.bwd_last).releases.push_back(st.host_buf[k]);
    }
    if (!read(0)) op(st.bwd_last).releases.push_back(st.buf[0]);
    ProgramOp& rs = emplace(sim::collective, p.reduce_scatter_s);
    rs.deps = {st.bwd_last};
    rs.releases = {grad_buf};
    rs.layer = static_cast<int>(l);
    rs.phase = 'b';
    rs_ops.push_back(named(label("reduce_scatter", l)));
    return grad[0];
  }

  const StepGraph& g_;
  const System& sys_;
  SimOptions opt_;
  Topology topo_;
  Costs costs_;
  std::vector<std::string>* names_;
  std::vector<TemplatePlan> plans_;
  Program& prog_;
  int last_compute_ = -1;
  int pending_a2a_ = -1;
  int gather_buf_ = -1;
  int backward_start_ = -1;
  struct PendingCopy { std::size_t tensor; int after, src; };
  std::vector<int> val_op_;
  std::vector<std::vector<int>> grad_ops_;
  std::vector<PendingCopy> pending_;  // scratch, reused by every layer
  std::vector<int> op_id_, buf_, h2d_, grad_;
  std::vector<std::int64_t> fwd_body_end_, bwd_body_first_;  // plan_loop_bodies()
};

// Dense peak weighted by where the model FLOPs run: MLP GEMMs in their dtype, the rest in bf16.
double weighted_peak_flops(const StepGraph& g, const System& sys) {
  double mlp = 0, other = 0;
  for (std::int64_t l = 0; l < g.model.num_layers; ++l)
    for (const auto& op : g.layer(l).ops) {
      if (op.kind != OpKind::gemm && op.kind != OpKind::attention) continue;
      (op.dtype == g.training.mlp_gemm_dtype && op.kind == OpKind::gemm ? mlp : other) += op.flops;
    }
  double t = mlp / sys.gpu.peak_flops(g.training.mlp_gemm_dtype) + other / sys.gpu.peak_flops(Dtype::bf16);
  return t > 0 ? (mlp + other) / t : sys.gpu.peak_flops(Dtype::bf16);
}

}  // namespace

sim::Program build_program(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt,
                           std::vector<std::string>* op_names) {
  sim::Program p;
  ProgramBuilder(g, sys, policy, opt, op_names, p).build();
  return p;
}

StepReport simulate(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt) {
  std::vector<std::string> names;
  // Reused per thread: sweeps simulate thousands of steps, and a fresh program each time costs page faults.
  thread_local sim::Program program;
  ProgramBuilder(g, sys, policy, opt, opt.record_trace ? &names : nullptr, program).build();
  auto r = sim::run_program(program, opt.record_trace);
  StepReport rep;
  rep.system_id = sys.id;
  rep.model_id = g.model.id;
  rep.policy = policy.preset;
  rep.step_time_s = r.end_time_s;
  rep.model_flops_per_device = g.model_flops.total();
  rep.executed_flops_per_device = r.executed_flops;
  rep.tflops_per_device = rep.model_flops_per_device / rep.step_time_s / 1e12;
  rep.mfu = rep.model_flops_per_device / rep.step_time_s / weighted_peak_flops(g, sys);
  rep.hbm_peak_bytes = r.hbm_peak_bytes;
  rep.hbm_peak_time_s = r.hbm_peak_time_s;
  rep.hbm_capacity_bytes = sys.gpu.hbm_bytes;
  for (int c = 0; c < sim::kMemCategories; ++c)
    rep.hbm_breakdown_bytes[sim::to_string(static_cast<MemCategory>(c))] = r.hbm_at_peak[static_cast<std::size_t>(c)];
  rep.host_peak_bytes = r.host_peak_bytes;
  rep.host_capacity_bytes = sys.host_capacity_bytes();
  if (rep.hbm_peak_bytes > rep.hbm_capacity_bytes) {
    rep.fits = false;
    rep.fits_reason = "HBM peak exceeds capacity";
  } else if (rep.host_peak_bytes > rep.host_capacity_bytes) {
    rep.fits = false;
    rep.fits_reason = "pinned host memory exceeds capacity";
  }
  for (int s = 1; s < sim::stream_count; ++s) rep.exposed_s[sim::stream_name(s)] = r.exposed_s[static_cast<std::size_t>(s)];
  for (int s = 0; s < sim::stream_count; ++s) rep.busy_s[sim::stream_name(s)] = r.busy_s[static_cast<std::size_t>(s)];
  rep.events = r.events;
  rep.ops = program.ops.size();
  if (opt.record_trace) {
    rep.timeline = r.timeline;
    auto events = nlohmann::json::array();
    events.push_back({{"ph", "M"}, {"pid", 0}, {"name", "process_name"}, {"args", {{"name", "hbmsim device 0"}}}});
    for (int s = 0; s < sim::stream_count; ++s)
      events.push_back({{"ph", "M"}, {"pid", 0}, {"tid", s}, {"name", "thread_name"}, {"args", {{"name", sim::stream_name(s)}}}});
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      const auto& o = program.ops[i];
      events.push_back({{"ph", "X"}, {"pid", 0}, {"tid", o.stream}, {"name", names[i]},
                        {"ts", r.start_s[i] * 1e6}, {"dur", (r.end_s[i] - r.start_s[i]) * 1e6},
                        {"args", {{"layer", o.layer}, {"phase", std::string(1, o.phase)}}}});
    }
    for (const auto& m : r.timeline) {
      events.push_back({{"ph", "C"}, {"pid", 0}, {"name", "memory GiB"}, {"ts", m.time_s * 1e6},
                        {"args", {{"hbm", m.hbm_bytes / 1073741824.0}, {"host", m.host_bytes / 1073741824.0}}}});
      nlohmann::json cats = nlohmann::json::object();
      for (int c = 0; c < sim::kMemCategories; ++c)
        cats[sim::to_string(static_cast<MemCategory>(c))] = m.hbm_by_category[static_cast<std::size_t>(c)] / 1073741824.0;
      events.push_back({{"ph", "C"}, {"pid", 0}, {"name", "HBM by category GiB"}, {"ts", m.time_s * 1e6}, {"args", cats}});
    }
    rep.trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  }
  return rep;
}

nlohmann::json StepReport::to_json() const {
  return {{"system", system_id},
          {"model", model_id},
          {"policy", policy},
          {"step_time_s", step_time_s},
          {"tflops_per_device", tflops_per_device},
          {"model_flops_per_device", model_flops_per_device},
          {"executed_flops_per_device", executed_flops_per_device},
          {"mfu", mfu},
          {"fits", fits},
          {"fits_reason", fits_reason},
          {"hbm_peak_bytes", hbm_peak_bytes},
          {"hbm_peak_time_s", hbm_peak_time_s},
          {"hbm_capacity_bytes", hbm_capacity_bytes},
          {"hbm_breakdown_bytes", hbm_breakdown_bytes},
          {"host_peak_bytes", host_peak_bytes},
          {"host_capacity_bytes", host_capacity_bytes},
          {"exposed_s", exposed_s},
          {"busy_s", busy_s},
          {"events", events},
          {"ops", ops}};
}

}  // namespace hbmsim
