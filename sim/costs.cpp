#include "sim/costs.hpp"

#include <algorithm>

namespace hbmsim {

double Costs::gemm_s(double flops, double bytes, Dtype dt) const {
  double t_flops = flops / (sys.gpu.peak_flops(dt) * sys.efficiency.gemm(dt).at(flops));
  return std::max(t_flops, memory_s_raw(bytes)) + sys.gpu.launch_overhead_s;
}

double Costs::attention_s_raw(double flops) const {
  return flops / (sys.gpu.peak_flops(Dtype::bf16) * sys.efficiency.attention.at(flops));
}

double Costs::linear_attention_s(double flops, double bytes) const {
  return std::max(attention_s_raw(flops), memory_s_raw(bytes)) + sys.gpu.launch_overhead_s;
}

bool Costs::memory_bound_linear_attention(double flops, double bytes) const {
  return memory_s_raw(bytes) > attention_s_raw(flops);
}

double Costs::memory_s_raw(double bytes) const {
  return bytes / (sys.gpu.hbm_bandwidth_bytes_per_s * sys.efficiency.memory_bound.at(bytes));
}

bool Costs::memory_bound_gemm(double flops, double bytes, Dtype dt) const {
  return memory_s_raw(bytes) > flops / (sys.gpu.peak_flops(dt) * sys.efficiency.gemm(dt).at(flops));
}

double Costs::copy_rate(double bytes, bool to_device) const {
  double bw = to_device ? sys.host_h2d_bytes_per_s() : sys.host_d2h_bytes_per_s();
  return bw * sys.efficiency.copy.at(std::max(bytes, 1.0));
}

}  // namespace hbmsim
