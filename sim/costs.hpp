// Solo durations of ops on one system: roofline with the efficiency tables plus launch overhead for
// compute; the network (sim/comm.hpp) for communication; the host link's per-GPU share for copies.
#pragma once
#include "hwmodels/system.hpp"
#include "sim/comm.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

struct Costs {
  const System& sys;
  const Network& net;

  double gemm_s(double flops, double bytes, Dtype dt) const;
  double attention_s_raw(double flops) const;  // without the launch
  double attention_s(double flops) const { return attention_s_raw(flops) + sys.gpu.launch_overhead_s; }
  // A Gated DeltaNet recurrence: its tensor-core work at flash attention's efficiency (a tiled kernel of the same
  // kind; no measurement of its own yet), or the HBM traffic of its chunk states and inputs where that is longer.
  double linear_attention_s(double flops, double bytes) const;
  bool memory_bound_linear_attention(double flops, double bytes) const;
  double memory_s_raw(double bytes) const;
  double memory_s(double bytes) const { return memory_s_raw(bytes) + sys.gpu.launch_overhead_s; }
  bool memory_bound_gemm(double flops, double bytes, Dtype dt) const;
  // A copy of `bytes` from one HBM buffer to another (the pipelined-offload staging copy).
  double device_copy_s(double bytes) const {
    return sys.gpu.measured_d2d_bytes_per_s ? bytes / *sys.gpu.measured_d2d_bytes_per_s + sys.gpu.launch_overhead_s
                                            : memory_s(2 * bytes);
  }
  // A collective in the forward or the backward pass (its mirror).
  CommCost comm(const CommDef& c, bool backward) const { return net.cost(c.kind(backward), c.bytes_in(backward), c.group, c.routing); }
  // Copies: the per-GPU share of the host link times the copy efficiency for this size.
  double copy_rate(double bytes, bool to_device) const;
  double copy_s(double bytes, bool to_device) const {
    return bytes / copy_rate(bytes, to_device) + sys.host_link.latency_s;
  }
};

}  // namespace hbmsim
