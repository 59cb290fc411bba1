#include "sim/layer_plan.hpp"

#include <algorithm>

#include "sim/list_scheduler.hpp"
#include "sim/pipeline_schedule.hpp"

namespace hbmsim {

bool blocks_compute(const CommDef& c, bool backward, const SimOptions& opt) {
  if (c.async) return false;  // the library overlaps it either way
  if (!opt.program_order) return !opt.lhs;
  if (c.axis == Axis::ep && opt.ep_overlap) return false;
  return !(c.axis == Axis::tp && opt.tp_comm_overlap && backward);
}

bool userbuffer_overlapped(const CommDef& c, CommKind kind, const SimOptions& opt) {
  return opt.tp_comm_overlap && c.axis == Axis::tp && (kind == CommKind::all_gather || kind == CommKind::reduce_scatter);
}

double TemplatePlan::seconds(const Step& st) const {
  switch (st.kind) {
    case Kind::replay: return fwd_s[st.op];
    case Kind::bwd: return bwd_s[st.op];
    case Kind::bwd_x:
    case Kind::bwd_w: return dot_s[st.op];
  }
  return 0.0;
}

// What a step reads of the forward values: a replay its inputs; a backward its saved tensors; the input-
// gradient dot of a GEMM only the weights.
const std::vector<int>& step_reads(const OpDef& def, TemplatePlan::Kind k) {
  static const std::vector<int> none;
  if (k == TemplatePlan::Kind::replay) return def.inputs;
  return k == TemplatePlan::Kind::bwd_x ? none : def.saved;
}

namespace {

// The op `producer` when it is a forward all-gather (a sequence-parallel input gathered for its GEMM), else null.
const OpDef* forward_gather(const LayerTemplate& t, int producer) {
  if (producer < 0) return nullptr;
  const OpDef& op = t.ops[static_cast<std::size_t>(producer)];
  return op.kind == OpKind::comm && op.comm.forward == CommKind::all_gather ? &op : nullptr;
}

// Whether the policy names tensor i outright: NAME, or NAME@kind where it has such keys (`kinds`: else the name
// alone decides, without building keys).
bool names_tensor(const Policy& policy, bool kinds, const LayerTemplate& t, std::size_t i) {
  const std::string& name = t.tensors[i].name;
  return kinds ? policy.places(name, t.kind) : policy.placements.count(name) > 0;
}

bool has_comm(const LayerTemplate& t) {
  return std::any_of(t.ops.begin(), t.ops.end(), [](const OpDef& op) { return op.kind == OpKind::comm; });
}

// The issue order of one backward iteration. Unscheduled it is program order: replays in forward order,
// then the backward ops reversed. Scheduled (LHS, with communication to hide) it is what a latency-hiding
// list scheduler produces from the iteration's data dependencies and solo durations: each step issues at the
// earliest time its inputs and its queue allow (ties: communication first, then the longer critical path,
// then program order), so compute that does not need a collective in flight runs beside it and its
// consumers wait until it ends.
void plan_backward_steps(const LayerTemplate& t, TemplatePlan& p) {
  using Kind = TemplatePlan::Kind;
  const auto no = t.ops.size(), nt = t.tensors.size();
  const bool schedule = p.scheduled;
  auto& steps = p.steps;
  steps.clear();
  for (int o : p.order)
    if (p.replay[static_cast<std::size_t>(o)]) steps.push_back({Kind::replay, static_cast<std::size_t>(o)});
  // Megatron's delay_wgrad_compute: a module's weight gradients wait until its input-gradient chain is done,
  // the MLP's (experts) just before the dispatch all-to-all's backward, the attention's at the layer's end.
  const bool delay = p.delay_wgrad && !schedule && !p.split_weight_grads;
  std::vector<TemplatePlan::Step> delayed;
  auto flush = [&] {
    steps.insert(steps.end(), delayed.begin(), delayed.end());
    delayed.clear();
  };
  const int mlp_norm = t.find_tensor("mlp_norm");
  for (std::size_t o = no; o-- > 0;) {
    const OpDef& op = t.ops[o];
    const bool a2a = op.kind == OpKind::comm && op.comm.axis == Axis::ep && op.comm.backward == CommKind::all_to_all;
    if (delay && (a2a || std::find(op.outputs.begin(), op.outputs.end(), mlp_norm) != op.outputs.end())) flush();
    if ((schedule || p.split_weight_grads || p.dgrad_first || delay) && op.kind == OpKind::gemm) {
      steps.push_back({Kind::bwd_x, o});
      (delay ? delayed : steps).push_back({Kind::bwd_w, o});
    } else {
      steps.push_back({Kind::bwd, o});
    }
  }
  flush();
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
    // The reloads of offloaded tensors, as XLA's scheduler sees its async host copies: without pipelined
    // transfers each starts with the loop body (where the builder issues it) and takes its copy time on the
    // host link, and the steps that read the tensor wait for it. Without them a faster network could move a
    // step that reads a reload ahead of compute that would have covered the copy (notes/monotonicity.md, the
    // LHS-order case). Pipelined, a copy starts in an earlier iteration and XLA counts its latency as hidden.
    std::vector<int> reload(nt, -1);
    int reloads = 0;
    for (std::size_t i = 0; i < n && p.reloads_in_order; ++i)
      for (int k : step_reads(t.ops[steps[i].op], steps[i].kind))
        if (p.placement[static_cast<std::size_t>(k)] == Placement::offload && reload[static_cast<std::size_t>(k)] < 0)
          reload[static_cast<std::size_t>(k)] = reloads++;
    const auto r = static_cast<std::size_t>(reloads);  // DAG nodes [0, r) are the reloads, then the steps
    ScheduleDag dag(r + n);
    for (std::size_t k = 0; k < nt; ++k)
      if (reload[k] >= 0) {
        dag.seconds[static_cast<std::size_t>(reload[k])] = p.h2d_s[k];
        dag.lane[static_cast<std::size_t>(reload[k])] = kHostCopyLane;
      }
    auto node = [&](int step) { return step < 0 ? -1 : step + reloads; };
    for (std::size_t i = 0; i < n; ++i) {
      const auto& def = t.ops[steps[i].op];
      dag.seconds[r + i] = p.seconds(steps[i]);
      dag.lane[r + i] = p.lane(steps[i]);
      for (int k : step_reads(def, steps[i].kind)) {  // forward values regenerated in this iteration, or reloaded
        const auto kk = static_cast<std::size_t>(k);
        int prod = p.producer[kk];
        if (prod >= 0 && p.placement[kk] == Placement::remat) dag.edge(node(replay_step[static_cast<std::size_t>(prod)]), r + i);
        dag.edge(reload[kk], r + i);
      }
      if (steps[i].kind == Kind::replay) continue;
      for (int out : def.outputs)  // the gradient of each output, from every consumer's backward
        for (int c : consumers[static_cast<std::size_t>(out)]) dag.edge(node(grad_step[static_cast<std::size_t>(c)]), r + i);
    }
    std::vector<TemplatePlan::Step> order;
    order.reserve(n);
    for (std::size_t i : dag.list_schedule(false))
      if (i >= r) order.push_back(steps[i - r]);
    steps = std::move(order);
  }
  p.first_read.assign(nt, -1);
  p.last_read.assign(nt, -1);
  p.grad_last.assign(no, -1);
  // Split off (ZB-H1), the weight-gradient steps run in the weight pass, after every other step of the iteration
  // whatever their place in the list: they read last. (Read in list order, a list that put out_proj's before the
  // attention's backward freed the attention output there, and which it did followed the solo durations: a GPU
  // twice as fast held 4 GiB more.)
  auto read_in = [&](bool weight_pass) {
    for (std::size_t s = 0; s < steps.size(); ++s) {
      if ((p.split_weight_grads && steps[s].kind == Kind::bwd_w) != weight_pass) continue;
      const auto& def = t.ops[steps[s].op];
      for (int k : step_reads(def, steps[s].kind)) {
        const auto kk = static_cast<std::size_t>(k);
        if (p.first_read[kk] < 0) p.first_read[kk] = static_cast<int>(s);
        p.last_read[kk] = static_cast<int>(s);
      }
      if (steps[s].kind != Kind::replay) p.grad_last[steps[s].op] = static_cast<int>(s);
    }
  };
  read_in(false);
  if (p.split_weight_grads) read_in(true);
}

// What one backward iteration allocates beyond prefetched tensors: gathered weights, the gradient
// buffer, replayed tensors and activation gradients. LHS keeps this much free when it hoists prefetches.
double backward_working_set(const LayerTemplate& t, const TemplatePlan& p, const StepGraph& g) {
  const auto& steps = p.steps;
  const auto& last_read = p.last_read;
  double live = g.weight_buffer_bytes(t) + g.grad_buffer_bytes(t) + t.tensors[0].bytes;  // + the incoming gradient
  double peak = live;
  std::vector<bool> replayed(t.tensors.size(), false), grad(t.tensors.size(), false);
  using Kind = TemplatePlan::Kind;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const auto& def = t.ops[steps[s].op];
    const Kind kind = steps[s].kind;
    if (kind == Kind::replay) {
      double unread = 0;  // a module's last output, made again and dropped (plan_template)
      for (int out : def.outputs) {
        auto k = static_cast<std::size_t>(out);
        if (p.placement[k] != Placement::remat || replayed[k]) continue;
        replayed[k] = true;
        live += t.tensors[k].bytes;
        if (last_read[k] < 0) unread += t.tensors[k].bytes;
      }
      peak = std::max(peak, live);
      live -= unread;
    } else if (kind != Kind::bwd_w) {
      for (int in : def.inputs)
        if (!grad[static_cast<std::size_t>(in)]) {
          grad[static_cast<std::size_t>(in)] = true;
          live += t.tensors[static_cast<std::size_t>(in)].bytes;
        }
    }
    peak = std::max(peak, live);
    if (p.split_weight_grads && kind == Kind::bwd_w) continue;  // its frees come in the weight pass, after the iteration
    for (int k : step_reads(def, kind))
      if (last_read[static_cast<std::size_t>(k)] == static_cast<int>(s) && replayed[static_cast<std::size_t>(k)])
        live -= t.tensors[static_cast<std::size_t>(k)].bytes;
    if (kind != Kind::replay && p.grad_last[steps[s].op] == static_cast<int>(s))
      for (int out : def.outputs)
        if (grad[static_cast<std::size_t>(out)]) live -= t.tensors[static_cast<std::size_t>(out)].bytes;
  }
  return peak;
}

}  // namespace

// Bytes of each tensor's kept copy: its size, or with fp8_saved_activations, for a kept input of a
// low-precision GEMM (or the kept tensor all-gathered into one), the GEMM's own format, as Transformer Engine
// saves the quantized input for the backward whatever the recipe (dtype_bytes: fp8 one byte per element with
// one scale per tensor, mxfp8 one byte plus a scale byte per 32, nvfp4 half a byte plus a scale byte per 16).
// An input of GEMMs of both kinds keeps the larger.
namespace {
double quantized_bytes_per_element(Dtype d) {
  return d == Dtype::fp8 || d == Dtype::mxfp8 || d == Dtype::nvfp4 ? dtype_bytes(d) : 0;  // 0: not quantized
}
}  // namespace

void plan_kept_bytes(const LayerTemplate& t, const StepGraph& g, TemplatePlan& p) {
  p.kept_bytes.clear();
  for (const auto& tensor : t.tensors) p.kept_bytes.push_back(tensor.bytes);
  if (!g.training.fp8_saved_activations) return;
  const double per_element = dtype_bytes(g.training.activation_dtype);
  std::vector<double> quantized(t.tensors.size(), 0);  // bytes per element kept, 0: not an input of one
  auto quantize = [&](int k, double bytes_per_element) {
    const auto kk = static_cast<std::size_t>(k);
    if (p.placement[kk] == Placement::remat) return;
    quantized[kk] = std::max(quantized[kk], bytes_per_element);
    p.kept_bytes[kk] = t.tensors[kk].bytes / per_element * quantized[kk];
  };
  for (const OpDef& op : t.ops) {
    const double bytes = op.kind == OpKind::gemm ? quantized_bytes_per_element(op.dtype) : 0;
    if (bytes == 0) continue;
    for (int in : op.inputs) {
      quantize(in, bytes);
      if (const OpDef* gather = forward_gather(t, p.producer[static_cast<std::size_t>(in)]))
        for (int src : gather->inputs) quantize(src, bytes);
    }
  }
}

namespace {

// The forward issue order. Without LHS (or without communication to hide) it is program order and a
// collective blocks the compute stream. With LHS the list scheduler orders the ops by their data
// dependencies, so work that does not need a collective in flight (the shared expert; with a batch split,
// the other micro-batch; a weight-gradient dot) runs beside it.
void plan_forward_order(const LayerTemplate& t, TemplatePlan& p) {
  const auto no = t.ops.size();
  p.order.clear();
  if (!p.scheduled) {
    for (std::size_t o = 0; o < no; ++o) p.order.push_back(static_cast<int>(o));
    return;
  }
  ScheduleDag dag(no);
  for (std::size_t o = 0; o < no; ++o) {
    dag.seconds[o] = p.fwd_s[o];
    dag.lane[o] = p.fwd_lane[o];
    for (int in : t.ops[o].inputs) dag.edge(p.producer[static_cast<std::size_t>(in)], o);
  }
  for (std::size_t o : dag.list_schedule(true)) p.order.push_back(static_cast<int>(o));
}

}  // namespace

void place_tensors(const LayerTemplate& t, const Policy& policy, std::vector<Placement>& placement,
                   std::vector<bool>& needed_in_bwd, std::vector<int>& producer) {
  const auto nt = t.tensors.size(), no = t.ops.size();
  placement.assign(nt, Placement::remat);
  needed_in_bwd.assign(nt, false);
  producer.assign(nt, -1);
  for (std::size_t o = 0; o < no; ++o) {
    for (int out : t.ops[o].outputs) producer[static_cast<std::size_t>(out)] = static_cast<int>(o);
    for (int s : t.ops[o].saved) needed_in_bwd[static_cast<std::size_t>(s)] = true;
  }
  if (policy.keep_backward_inputs)
    for (std::size_t i = 0; i < nt; ++i) {
      if (!needed_in_bwd[i]) continue;
      const OpDef* gather = forward_gather(t, producer[i]);
      if (!gather) placement[i] = Placement::device;
      else
        for (int in : gather->inputs) placement[static_cast<std::size_t>(in)] = Placement::device;
    }
  // Keeping what autograd saves, a named tensor (checkpoint or module tensor) is placed only where named (for
  // every layer, or for this kind of layer).
  const bool kinds = policy.has_kind_keys();
  for (std::size_t i = 0; i < nt; ++i) {
    const std::string& name = t.tensors[i].name;
    if (policy.keep_backward_inputs ? names_tensor(policy, kinds, t, i) : t.tensors[i].checkpoint)
      placement[i] = kinds ? policy.placement(name, t.kind) : policy.placement(name);
  }
  placement[0] = Placement::device;
  if (policy.offload_kept)
    for (auto& where : placement)
      if (where == Placement::device) where = Placement::offload;
}

void plan_template(const LayerTemplate& t, const Policy& policy, const Costs& c, const StepGraph& g,
                   const SimOptions& opt, TemplatePlan& p) {
  const auto nt = t.tensors.size(), no = t.ops.size();
  for (auto* v : {&p.fwd_s, &p.bwd_s, &p.dot_s, &p.d2h_s, &p.h2d_s}) v->clear();
  for (auto* v : {&p.fwd_lane, &p.bwd_lane}) v->clear();
  p.fwd_mem_bound.clear();
  p.fwd_comm.clear();
  p.bwd_comm.clear();
  p.replay.assign(no, false);
  p.last_fwd_use.assign(nt, -1);
  place_tensors(t, policy, p.placement, p.needed_in_bwd, p.producer);
  // A layer that keeps only its input is checkpointed whole. PyTorch's checkpoint (Megatron's full recompute)
  // runs the layer's forward again entirely; XLA's rematerialization only what the backward reads.
  const auto remat = [](Placement w) { return w == Placement::remat; };
  const bool whole = opt.program_order && std::all_of(p.placement.begin() + 1, p.placement.end(), remat);
  if (whole) p.replay.assign(no, true);
  // Otherwise tensors the backward needs but nobody saved are recomputed, and so are whatever their producers
  // need. In Megatron's program, where autograd's tensors are kept, a tensor named remat is a recompute module's
  // (megatron_recompute_modules): its checkpoint runs the whole function again, so the tensor is made again even
  // where the backward does not read it (the moe module's combine, and the experts' down projection before it).
  std::vector<int> work;
  const bool kinds = policy.has_kind_keys();
  const bool modules = opt.program_order && policy.keep_backward_inputs;  // a tensor named remat names a module
  for (std::size_t i = 0; i < nt && !whole; ++i) {
    if (p.placement[i] != Placement::remat) continue;
    const bool named = modules && names_tensor(policy, kinds, t, i);
    if (p.needed_in_bwd[i] || named) work.push_back(static_cast<int>(i));
  }
  while (!work.empty()) {
    int tensor = work.back();
    work.pop_back();
    int op = p.producer[static_cast<std::size_t>(tensor)];
    if (op < 0 || p.replay[static_cast<std::size_t>(op)]) continue;
    p.replay[static_cast<std::size_t>(op)] = true;
    for (int in : t.ops[static_cast<std::size_t>(op)].inputs)
      if (p.placement[static_cast<std::size_t>(in)] == Placement::remat) work.push_back(in);
  }
  // A module that ends in a row-parallel linear (the MLP's fc2) reduces that linear's output over tp inside its
  // forward (Transformer Engine's reduce-scatter, or all-reduce without sequence parallelism), so the checkpoint
  // runs that reduction again too, though the backward reads nothing it makes.
  for (std::size_t o = 0; o < no && !whole && modules; ++o) {
    const OpDef& op = t.ops[o];
    const bool reduces = op.comm.forward == CommKind::reduce_scatter || op.comm.forward == CommKind::all_reduce;
    if (op.kind != OpKind::comm || op.comm.axis != Axis::tp || !reduces || op.inputs.size() != 1) continue;
    const auto in = static_cast<std::size_t>(op.inputs[0]);
    if (p.placement[in] == Placement::remat && names_tensor(policy, kinds, t, in)) p.replay[o] = true;
  }
  for (const auto& op : t.ops) {
    double f = 0, b = 0, dot = 0;
    bool mb = false;
    CommCost fc, bc;
    int fl = ScheduleDag::kCompute, bl = ScheduleDag::kCompute;
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
      case OpKind::linear_attention:
        f = c.linear_attention_s(op.flops, op.bytes);
        b = c.linear_attention_s(op.bwd_flops, op.bwd_bytes);
        mb = c.memory_bound_linear_attention(op.flops, op.bytes);
        break;
      case OpKind::memory:
        f = c.memory_s(op.bytes);
        b = c.memory_s(op.bwd_bytes);
        mb = true;
        break;
      case OpKind::comm:
        // A direction without communication is an identity: a free op on the compute stream.
        fc = c.comm(op.comm, false);
        bc = c.comm(op.comm, true);
        f = fc.seconds;
        b = bc.seconds;
        if (op.comm.forward != CommKind::none) fl = comm_lane(op.comm.axis);
        if (op.comm.backward != CommKind::none) bl = comm_lane(op.comm.axis);
        break;
    }
    p.fwd_s.push_back(f);
    p.bwd_s.push_back(b);
    p.dot_s.push_back(dot);
    p.fwd_mem_bound.push_back(mb);
    p.fwd_comm.push_back(fc);
    p.bwd_comm.push_back(bc);
    p.fwd_lane.push_back(fl);
    p.bwd_lane.push_back(bl);
  }
  p.scheduled = opt.lhs && !opt.program_order && has_comm(t);
  p.reloads_in_order = !opt.pipelined_transfers;
  p.dgrad_first = opt.program_order && opt.tp_comm_overlap;
  p.delay_wgrad = opt.program_order && opt.delay_wgrad;
  p.split_weight_grads = splits_backward(g.training.parallelism.schedule) && g.training.parallelism.pp > 1;
  plan_forward_order(t, p);
  for (int o : p.order)
    for (int in : t.ops[static_cast<std::size_t>(o)].inputs) p.last_fwd_use[static_cast<std::size_t>(in)] = o;
  plan_kept_bytes(t, g, p);
  for (double bytes : p.kept_bytes) {
    p.d2h_s.push_back(c.copy_s(bytes, false));
    p.h2d_s.push_back(c.copy_s(bytes, true));
  }
  plan_backward_steps(t, p);
  p.backward_working_set_bytes = backward_working_set(t, p, g);
  p.gather = c.net.cost(CommKind::all_gather, t.gathered_dense_bytes, g.dense_shard);
  p.gather_experts = c.net.cost(CommKind::all_gather, t.gathered_expert_bytes, g.expert_shard);
  p.reduce_scatter = c.net.cost(CommKind::reduce_scatter, t.grad_dense_bytes, g.dense_shard);
  p.reduce_scatter_experts = c.net.cost(CommKind::reduce_scatter, t.grad_expert_bytes, g.expert_shard);
  // What is left of the gradients after the reduce-scatters is one bucket per layer for the sync axes.
  const double dense = t.grad_dense_bytes / static_cast<double>(g.mesh.size(g.dense_shard));
  const double experts = t.grad_expert_bytes / static_cast<double>(g.mesh.size(g.expert_shard));
  const CommKind sync = g.training.parallelism.sharded_optimizer ? CommKind::reduce_scatter : CommKind::all_reduce;
  // The updated parameters come back in the weights' storage dtype, not the gradients'.
  const double w = g.weight_bytes_per_gradient_byte();
  if (g.grad_sync == g.expert_grad_sync) {
    p.grad_sync = c.net.cost(sync, dense + experts, g.grad_sync);
    p.param_sync = c.net.cost(CommKind::all_gather, (dense + experts) * w, g.grad_sync);
    p.grad_sync_experts = p.param_sync_experts = CommCost{};  // the plan is reused from the last run
  } else {
    p.grad_sync = c.net.cost(sync, dense, g.grad_sync);
    p.grad_sync_experts = c.net.cost(sync, experts, g.expert_grad_sync);
    p.param_sync = c.net.cost(CommKind::all_gather, dense * w, g.grad_sync);
    p.param_sync_experts = c.net.cost(CommKind::all_gather, experts * w, g.expert_grad_sync);
  }
}

}  // namespace hbmsim
