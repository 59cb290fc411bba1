// Calibration profile (docs/calibration-profile.md): measured or fitted figures that override a system's
// datasheet ones. Written by the CUDA backend and by the fitter; read by simulate --calibration.
#pragma once
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "hwmodels/system.hpp"

namespace hbmsim {

struct Profile {
  std::string name;
  std::string source;
  std::string system;  // the system id it was measured or fitted on ("": not recorded)
  std::string origin;  // the file or built-in it was read from ("": made in code), for errors
  std::map<std::string, std::string> metadata;
  std::optional<double> h2d_bytes_per_s, d2h_bytes_per_s, bidirectional_total_bytes_per_s, host_latency_s;
  std::optional<double> hbm_bandwidth_bytes_per_s, d2d_bandwidth_bytes_per_s, launch_overhead_s;
  std::optional<double> compute_slowdown_during_copy;
  std::optional<PiecewiseTable> gemm_bf16, gemm_fp8, gemm_nvfp4, attention, memory_bound, copy, collective;
  std::map<std::string, double> parameters;  // named fitted scalars, see fitted_parameter_names()

  nlohmann::json to_json() const;
};

// Names a profile's "parameters" may hold, what each multiplies, in the order the fitter uses.
const std::vector<std::string>& fitted_parameter_names();
// The parameter a profile key names: "gemm_scale", or "gemm_scale@gb200-nvl72" for one built-in system only (it
// then overrides the unqualified value on that system: sustained clocks under a power cap differ by system).
// Throws std::invalid_argument with the reason when the key names no such parameter or system.
struct ParameterKey {
  std::string name, system;  // system "": every system
};
ParameterKey parse_parameter_key(const std::string& key);

Profile load_profile(const nlohmann::json& doc, const std::string& origin);
Profile load_profile_file(const std::string& path);

// Measured values replace datasheet ones; fitted parameters then scale what they name. Throws InputError,
// naming the profile's keys, where the result leaves a kernel or link below kMinHardwareRate per second.
System apply_profile(System system, const Profile& profile);

}  // namespace hbmsim
