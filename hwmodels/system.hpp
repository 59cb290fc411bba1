// Hardware model of one training system: GPU, host CPU, host link, scale-up and scale-out fabrics, and
// efficiency tables. Plain values with units in the names, converted once at load time.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hwmodels/json_view.hpp"

namespace hbmsim {

// fp8: per-tensor scaled FP8 (delayed or current scaling); mxfp8: FP8 with an E8M0 scale per 32 elements
// (OCP microscaling, Blackwell's block-scaled tensor cores); nvfp4: 4-bit with an FP8 scale per 16.
enum class Dtype { bf16, fp8, mxfp8, nvfp4, fp32 };
const char* to_string(Dtype d);
Dtype parse_dtype(const std::string& s, const JsonView* where = nullptr);
double dtype_bytes(Dtype d);  // storage bytes per element (block-scaled ones with their scales, see .cpp)

// Piecewise-linear in log(x), clamped at both ends. x: FLOPs of one op or bytes moved by one op.
struct PiecewiseTable {
  std::vector<std::pair<double, double>> points;
  double at(double x) const;
  static PiecewiseTable constant(double fraction) { return PiecewiseTable{{{1.0, fraction}}}; }
  static PiecewiseTable from_json(const JsonView& v);
  nlohmann::json to_json() const;
  void scale(double factor);  // multiplies every fraction, capped at 1
};

struct Efficiency {
  PiecewiseTable gemm_bf16, gemm_fp8, gemm_nvfp4;
  // Block-scaled MXFP8 GEMMs: the fp8 table (the same tensor-core rate on the datasheet; no public figures by
  // size for the block-scaled kernels), times a calibration profile's mxfp8_gemm_scale where it sets one.
  PiecewiseTable gemm_mxfp8;
  PiecewiseTable attention;     // flash attention forward/backward, fraction of bf16 peak
  PiecewiseTable memory_bound;  // elementwise/norm/softmax kernels, fraction of HBM bandwidth
  PiecewiseTable copy;          // host copies, fraction of the link's per-GPU share
  PiecewiseTable collective;    // NCCL-style collectives, fraction of algorithm bandwidth
  // On the path between scale-up domains (the NICs: InfiniBand, Ethernet) `collective` is multiplied by this:
  // 1 unless a calibration profile's scale_out_collective_scale sets it.
  double scale_out_collective_factor = 1;
  double compute_slowdown_during_copy = 0;  // memory-bound kernels slow by this while a host copy runs
  std::string source;
  const PiecewiseTable& gemm(Dtype d) const;
};

enum class LinkSharing {
  dedicated,    // one link per GPU, full duplex
  shared,       // one link for `gpus_sharing` GPUs, full duplex: each direction's capacity is split
  half_duplex,  // one capacity for both directions together (and for all sharers)
};
const char* to_string(LinkSharing s);

struct GpuSpec {
  std::string name;
  double hbm_bytes = 0;
  double hbm_bandwidth_bytes_per_s = 0;
  std::map<Dtype, double> dense_peak_flops;  // absent dtype: not supported in hardware
  double launch_overhead_s = 0;
  // Streaming multiprocessors (0: not stated): a communication kernel that holds some of them (the flex MoE
  // dispatcher's) slows the compute kernels beside it by that share.
  int sms = 0;
  // The share of them `held` SMs are (0 where either count is not stated).
  double sm_share(std::int64_t held) const { return held > 0 && sms > 0 ? static_cast<double>(held) / sms : 0; }
  // A calibration profile's cudaMemcpy device-to-device rate (bytes copied per second); without one a
  // device copy is an HBM streaming kernel reading and writing its bytes.
  std::optional<double> measured_d2d_bytes_per_s;
  double peak_flops(Dtype d) const;          // falls back to the next wider dtype the part has
};

struct HostCpuSpec {
  std::string name;
  double memory_bytes = 0;
  double memory_bandwidth_bytes_per_s = 0;
  int gpus_per_cpu = 1;
};

struct HostLinkSpec {
  std::string name;
  LinkSharing sharing = LinkSharing::dedicated;
  int gpus_sharing = 1;
  double per_direction_bytes_per_s = 0;      // whole link, one direction (nominal)
  std::optional<double> measured_h2d_bytes_per_s;  // per GPU, all sharers active (published)
  std::optional<double> measured_d2h_bytes_per_s;
  // Per GPU, both directions at once, when that is below the sum of the two (measured by a profile).
  std::optional<double> bidirectional_total_bytes_per_s;
  double latency_s = 0;
};

struct ScaleUpSpec {
  std::string name;
  double per_gpu_bytes_per_s_per_direction = 0;
  int domain_gpus = 1;
  double latency_s = 0;
};

struct ScaleOutSpec {
  std::string name;
  double per_gpu_bytes_per_s_per_direction = 0;
  double latency_s = 0;
};

struct RuntimeSpec {
  double reserve_bytes = 0;           // CUDA context, XLA/NCCL runtime, allocator slack
  double host_pinned_fraction = 1;    // share of host memory that may be pinned for offload
};

struct System {
  std::string id;
  std::string name;
  std::string origin;  // file the system came from
  GpuSpec gpu;
  HostCpuSpec host_cpu;
  HostLinkSpec host_link;
  ScaleUpSpec scale_up;
  ScaleOutSpec scale_out;
  RuntimeSpec runtime;
  Efficiency efficiency;
  std::string calibration;  // name of the applied profile, empty for datasheet figures
  std::string calibration_system;  // the system that profile was measured or fitted on ("": not recorded)

  // What one GPU gets from the host link per direction while every sharer does the same (SPMD).
  double host_h2d_bytes_per_s() const;
  double host_d2h_bytes_per_s() const;
  double host_capacity_bytes() const;  // pinned host bytes available to one GPU

  nlohmann::json summary_json() const;
};

// Loads a system file. `efficiency_lookup` resolves the "efficiency" name to a JSON document.
System load_system(const nlohmann::json& doc, const std::string& origin);
Efficiency load_efficiency(const nlohmann::json& doc, const std::string& origin);

}  // namespace hbmsim
