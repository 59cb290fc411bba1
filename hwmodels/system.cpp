#include "hwmodels/system.hpp"

#include <algorithm>
#include <cmath>

#include "hwmodels/builtin.hpp"

namespace hbmsim {

const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::bf16: return "bf16";
    case Dtype::fp8: return "fp8";
    case Dtype::mxfp8: return "mxfp8";
    case Dtype::nvfp4: return "nvfp4";
    case Dtype::fp32: return "fp32";
  }
  return "?";
}

Dtype parse_dtype(const std::string& s, const JsonView* where) {
  if (s == "bf16" || s == "bfloat16") return Dtype::bf16;
  if (s == "fp8") return Dtype::fp8;
  if (s == "mxfp8") return Dtype::mxfp8;
  if (s == "nvfp4" || s == "fp4") return Dtype::nvfp4;
  if (s == "fp32" || s == "float32") return Dtype::fp32;
  if (where) where->fail("unknown dtype; expected bf16, fp8, mxfp8, nvfp4 or fp32");
  throw InputError("unknown dtype '" + s + "' (expected bf16, fp8, mxfp8, nvfp4 or fp32)");
}

double dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::bf16: return 2;
    case Dtype::fp8: return 1;
    // MXFP8: 8-bit values plus one E8M0 scale byte per 32-element block (OCP Microscaling spec v1.0).
    case Dtype::mxfp8: return 1 + 1.0 / 32;
    // NVFP4: 4-bit values plus one fp8 scale per 16-element block (NVIDIA's NVFP4 format).
    case Dtype::nvfp4: return 0.5 + 1.0 / 16;
    case Dtype::fp32: return 4;
  }
  return 2;
}

double PiecewiseTable::at(double x) const {
  if (points.empty()) return 1.0;
  if (points.size() == 1 || x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  auto hi = std::upper_bound(points.begin(), points.end(), x,
                             [](double v, const std::pair<double, double>& p) { return v < p.first; });
  auto lo = hi - 1;
  double t = (std::log(x) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
  return lo->second + t * (hi->second - lo->second);
}

PiecewiseTable PiecewiseTable::from_json(const JsonView& v) {
  PiecewiseTable t;
  if (v.size() == 0) v.fail("must hold at least one [x, fraction] pair");
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto p = v[i];
    if (p.size() != 2) p.fail("must be an [x, fraction] pair");
    double x = p[0].positive();
    double f = p[1].fraction();
    if (!t.points.empty() && x <= t.points.back().first) p[0].fail("x must be strictly increasing");
    t.points.emplace_back(x, f);
  }
  return t;
}

nlohmann::json PiecewiseTable::to_json() const {
  auto a = nlohmann::json::array();
  for (auto& [x, f] : points) a.push_back({x, f});
  return a;
}

void PiecewiseTable::scale(double factor) {
  for (auto& p : points) p.second = std::min(p.second * factor, 1.0);  // a profile's rate check refuses ~0
}

const PiecewiseTable& Efficiency::gemm(Dtype d) const {
  switch (d) {
    case Dtype::fp8: return gemm_fp8;
    case Dtype::mxfp8: return gemm_mxfp8;
    case Dtype::nvfp4: return gemm_nvfp4;
    default: return gemm_bf16;
  }
}

const char* to_string(LinkSharing s) {
  switch (s) {
    case LinkSharing::dedicated: return "dedicated";
    case LinkSharing::shared: return "shared";
    case LinkSharing::half_duplex: return "half_duplex";
  }
  return "?";
}

double GpuSpec::peak_flops(Dtype d) const {
  // A part without native support runs the op at the next wider format it has (nvfp4 or mxfp8 -> fp8 -> bf16).
  for (Dtype t : {d, Dtype::fp8, Dtype::bf16}) {
    if (t == Dtype::fp8 && d == Dtype::bf16) continue;
    auto it = dense_peak_flops.find(t);
    if (it != dense_peak_flops.end()) return it->second;
  }
  auto it = dense_peak_flops.find(Dtype::bf16);
  return it == dense_peak_flops.end() ? 1.0 : it->second;
}

static double link_share_per_gpu(const HostLinkSpec& l) {
  double per_gpu = l.per_direction_bytes_per_s / std::max(1, l.gpus_sharing);
  if (l.sharing == LinkSharing::half_duplex) per_gpu /= 2;  // both directions busy in a step
  return per_gpu;
}

double System::host_h2d_bytes_per_s() const {
  return host_link.measured_h2d_bytes_per_s.value_or(link_share_per_gpu(host_link));
}

double System::host_d2h_bytes_per_s() const {
  return host_link.measured_d2h_bytes_per_s.value_or(link_share_per_gpu(host_link));
}

double System::host_capacity_bytes() const {
  return host_cpu.memory_bytes * runtime.host_pinned_fraction / std::max(1, host_cpu.gpus_per_cpu);
}

nlohmann::json System::summary_json() const {
  nlohmann::json peaks = nlohmann::json::object();
  for (auto& [d, f] : gpu.dense_peak_flops) peaks[to_string(d)] = f;
  return {
      {"id", id},
      {"name", name},
      {"gpu", gpu.name},
      {"hbm_bytes", gpu.hbm_bytes},
      {"hbm_bandwidth_bytes_per_s", gpu.hbm_bandwidth_bytes_per_s},
      {"dense_peak_flops", peaks},
      {"host_cpu", host_cpu.name},
      {"host_memory_bytes", host_cpu.memory_bytes},
      {"gpus_per_cpu", host_cpu.gpus_per_cpu},
      {"host_link", host_link.name},
      {"host_link_sharing", to_string(host_link.sharing)},
      {"host_link_per_direction_bytes_per_s", host_link.per_direction_bytes_per_s},
      {"host_link_gpus_sharing", host_link.gpus_sharing},
      {"host_h2d_bytes_per_s_per_gpu", host_h2d_bytes_per_s()},
      {"host_d2h_bytes_per_s_per_gpu", host_d2h_bytes_per_s()},
      {"scale_up", scale_up.name},
      {"scale_up_per_gpu_bytes_per_s_per_direction", scale_up.per_gpu_bytes_per_s_per_direction},
      {"scale_up_domain_gpus", scale_up.domain_gpus},
      {"scale_out_per_gpu_bytes_per_s_per_direction", scale_out.per_gpu_bytes_per_s_per_direction},
      {"calibration", calibration},
  };
}

Efficiency load_efficiency(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  v.allow_only({"about", "source", "gemm", "attention", "memory_bound", "copy", "collective",
                "compute_slowdown_during_copy"});
  Efficiency e;
  e.source = v.at("source").string();
  auto g = v.at("gemm");
  g.allow_only({"bf16", "fp8", "nvfp4"});
  e.gemm_bf16 = PiecewiseTable::from_json(g.at("bf16"));
  e.gemm_fp8 = PiecewiseTable::from_json(g.at("fp8"));
  e.gemm_nvfp4 = PiecewiseTable::from_json(g.at("nvfp4"));
  e.gemm_mxfp8 = e.gemm_fp8;
  e.attention = PiecewiseTable::from_json(v.at("attention"));
  e.memory_bound = PiecewiseTable::from_json(v.at("memory_bound"));
  e.copy = PiecewiseTable::from_json(v.at("copy"));
  e.collective = PiecewiseTable::from_json(v.at("collective"));
  auto s = v.at("compute_slowdown_during_copy");
  e.compute_slowdown_during_copy = s.non_negative();
  if (e.compute_slowdown_during_copy >= 1) s.fail("must be in [0, 1)");
  return e;
}

static int positive_int(const JsonView& v, int max_value = 1 << 20) {
  auto x = v.positive_integer();
  if (x > max_value) v.fail("implausibly large, max " + std::to_string(max_value));
  return static_cast<int>(x);
}

System load_system(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  v.allow_only({"id", "name", "about", "gpu", "host_cpu", "host_link", "scale_up", "scale_out", "runtime",
                "efficiency"});
  System s;
  s.origin = origin;
  s.id = v.at("id").string();
  if (s.id.empty()) v.at("id").fail("must not be empty");
  s.name = v.at("name").string();

  auto g = v.at("gpu");
  g.allow_only({"name", "hbm_bytes", "hbm_bandwidth_bytes_per_s", "dense_peak_flops", "launch_overhead_s", "sms"});
  s.gpu.name = g.at("name").string();
  s.gpu.hbm_bytes = g.at("hbm_bytes").sourced_positive(kMaxHardwareBytes, "bytes");
  s.gpu.hbm_bandwidth_bytes_per_s = g.at("hbm_bandwidth_bytes_per_s").sourced_positive(kMaxHardwareBytesPerSecond, "bytes/s");
  s.gpu.launch_overhead_s = g.at("launch_overhead_s").sourced_positive(kMaxHardwareSeconds, "s");
  if (auto sms = g.find("sms")) {
    constexpr double kMaxSms = 4096;
    const double n = sms->sourced_positive(kMaxSms, "SMs");
    if (n != std::floor(n)) sms->at("value").fail("must be a whole number of SMs");
    s.gpu.sms = static_cast<int>(n);
  }
  auto peaks = g.at("dense_peak_flops");
  peaks.allow_only({"bf16", "fp8", "mxfp8", "nvfp4"});
  for (Dtype d : {Dtype::bf16, Dtype::fp8, Dtype::mxfp8, Dtype::nvfp4})
    if (auto p = peaks.find(to_string(d))) s.gpu.dense_peak_flops[d] = p->sourced_positive(kMaxHardwareFlopsPerSecond, "FLOP/s");
  if (!s.gpu.dense_peak_flops.count(Dtype::bf16)) peaks.fail("bf16 is required");

  auto c = v.at("host_cpu");
  c.allow_only({"name", "memory_bytes", "memory_bandwidth_bytes_per_s", "gpus_per_cpu"});
  s.host_cpu.name = c.at("name").string();
  s.host_cpu.memory_bytes = c.at("memory_bytes").sourced_positive(kMaxHardwareBytes, "bytes");
  s.host_cpu.memory_bandwidth_bytes_per_s = c.at("memory_bandwidth_bytes_per_s").sourced_positive(kMaxHardwareBytesPerSecond, "bytes/s");
  s.host_cpu.gpus_per_cpu = positive_int(c.at("gpus_per_cpu"), 64);

  auto l = v.at("host_link");
  l.allow_only({"name", "sharing", "gpus_sharing", "per_direction_bytes_per_s", "measured_h2d_bytes_per_s",
                "measured_d2h_bytes_per_s", "latency_s"});
  s.host_link.name = l.at("name").string();
  auto sharing = l.at("sharing");
  auto sh = sharing.string();
  if (sh == "dedicated") s.host_link.sharing = LinkSharing::dedicated;
  else if (sh == "shared") s.host_link.sharing = LinkSharing::shared;
  else if (sh == "half_duplex") s.host_link.sharing = LinkSharing::half_duplex;
  else sharing.fail("unknown sharing policy; expected dedicated, shared or half_duplex");
  s.host_link.gpus_sharing = positive_int(l.at("gpus_sharing"), 64);
  if (s.host_link.sharing == LinkSharing::dedicated && s.host_link.gpus_sharing != 1)
    l.at("gpus_sharing").fail("must be 1 for a dedicated link");
  if (s.host_link.gpus_sharing > s.host_cpu.gpus_per_cpu)
    l.at("gpus_sharing").fail("cannot exceed host_cpu.gpus_per_cpu = " + std::to_string(s.host_cpu.gpus_per_cpu));
  s.host_link.per_direction_bytes_per_s = l.at("per_direction_bytes_per_s").sourced_positive(kMaxHardwareBytesPerSecond, "bytes/s");
  if (auto m = l.find("measured_h2d_bytes_per_s")) s.host_link.measured_h2d_bytes_per_s = m->sourced_positive(kMaxHardwareBytesPerSecond, "bytes/s");
  if (auto m = l.find("measured_d2h_bytes_per_s")) s.host_link.measured_d2h_bytes_per_s = m->sourced_positive(kMaxHardwareBytesPerSecond, "bytes/s");
  s.host_link.latency_s = l.at("latency_s").sourced_positive(kMaxHardwareSeconds, "s");
  double share = s.host_link.per_direction_bytes_per_s / s.host_link.gpus_sharing;
  for (auto key : {"measured_h2d_bytes_per_s", "measured_d2h_bytes_per_s"})
    if (auto m = l.find(key); m && m->at("value").number() > share * 1.0001)
      m->at("value").fail("exceeds the link's per-GPU share " + format_number(share));

  auto u = v.at("scale_up");
  u.allow_only({"name", "per_gpu_bytes_per_s_per_direction", "domain_gpus", "latency_s"});
  s.scale_up.name = u.at("name").string();
  s.scale_up.per_gpu_bytes_per_s_per_direction = u.at("per_gpu_bytes_per_s_per_direction").sourced_positive(kMaxHardwareBytesPerSecond, "bytes/s");
  s.scale_up.domain_gpus = positive_int(u.at("domain_gpus"), 4096);
  s.scale_up.latency_s = u.at("latency_s").sourced_positive(kMaxHardwareSeconds, "s");

  auto o = v.at("scale_out");
  o.allow_only({"name", "per_gpu_bytes_per_s_per_direction", "latency_s"});
  s.scale_out.name = o.at("name").string();
  s.scale_out.per_gpu_bytes_per_s_per_direction = o.at("per_gpu_bytes_per_s_per_direction").sourced_positive(kMaxHardwareBytesPerSecond, "bytes/s");
  s.scale_out.latency_s = o.at("latency_s").sourced_positive(kMaxHardwareSeconds, "s");

  auto r = v.at("runtime");
  r.allow_only({"reserve_bytes", "host_pinned_fraction"});
  s.runtime.reserve_bytes = r.at("reserve_bytes").sourced_positive(kMaxHardwareBytes, "bytes");
  if (s.runtime.reserve_bytes >= s.gpu.hbm_bytes)
    r.at("reserve_bytes").at("value").fail("must be below gpu.hbm_bytes = " + format_number(s.gpu.hbm_bytes));
  {
    auto f = r.at("host_pinned_fraction");
    f.allow_only({"value", "source"});
    f.at("source").string();
    s.runtime.host_pinned_fraction = f.at("value").fraction();
  }

  auto e = v.at("efficiency");
  if (e.raw().is_string()) {
    std::string name = "efficiency/" + e.string() + ".json";
    auto text = builtin_file(name);
    if (!text) e.fail("no built-in efficiency table of that name");
    s.efficiency = load_efficiency(parse_json_text(*text, "builtin:" + name), "builtin:" + name);
  } else {
    e.expect_object();
    s.efficiency = load_efficiency(e.raw(), origin + ": efficiency");
  }
  return s;
}

}  // namespace hbmsim
