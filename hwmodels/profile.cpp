#include "hwmodels/profile.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <tuple>

#include "hwmodels/builtin.hpp"

namespace hbmsim {

const std::vector<std::string>& fitted_parameter_names() {
  static const std::vector<std::string> names = {
      "gemm_scale",              // multiplies every GEMM efficiency table (all dtypes)
      "nvfp4_gemm_scale",        // multiplies the nvfp4 GEMM table on top (block-scaled GEMMs, less mature)
      "mxfp8_gemm_scale",        // multiplies the mxfp8 GEMM table (the fp8 one) on top (block-scaled FP8 GEMMs)
      "attention_scale",         // multiplies the attention table
      "collective_scale",        // multiplies the collective table
      "scale_out_collective_scale",  // multiplies it again on the path between scale-up domains (NICs)
      "host_link_scale",         // multiplies host-link bandwidth in both directions
      "copy_compute_interference",  // sets compute_slowdown_during_copy
  };
  return names;
}

ParameterKey parse_parameter_key(const std::string& key) {
  const auto at = key.find('@');
  ParameterKey k{key.substr(0, at), at == std::string::npos ? "" : key.substr(at + 1)};
  const auto& known = fitted_parameter_names();
  if (std::find(known.begin(), known.end(), k.name) == known.end()) {
    std::string list;
    for (auto& n : known) list += (list.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown parameter; known: " + list + " (each optionally @SYSTEM)");
  }
  if (at != std::string::npos && !builtin_file("systems/" + k.system + ".json"))
    throw std::invalid_argument("unknown system \"" + k.system + "\" after @ (expected a built-in system id)");
  return k;
}

namespace {

// A measured latency or launch overhead: >= 0 (a fit may drive it to zero) and at most kMaxHardwareSeconds.
double seconds(const JsonView& x) {
  double v = x.non_negative();
  if (v > kMaxHardwareSeconds)
    x.fail("implausibly large, max " + format_number(kMaxHardwareSeconds) + " s");
  return v;
}

double lowest(const PiecewiseTable& t) {
  double low = 1;
  for (const auto& [x, fraction] : t.points) low = std::min(low, fraction);
  return low;
}

// The profile's keys that set or scale a table or rate, in `keys` (parameters the system `id` reads).
std::string profile_keys(const Profile& p, const std::string& id, const std::optional<PiecewiseTable>& set, const std::string& table,
                         const std::vector<const char*>& scales) {
  std::string keys = set ? table + " (lowest fraction " + format_number(lowest(*set)) + ")" : "";
  for (const char* name : scales)
    for (const std::string& key : {std::string(name) + "@" + id, std::string(name)})
      if (p.parameters.count(key)) {
        keys += (keys.empty() ? "" : " and ") + ("parameters." + key + " = " + format_number(p.parameters.at(key)));
        break;
      }
  return keys;
}

// A rate below kMinHardwareRate per second is a typo (a scale of 1e-300), not a measurement: the floor a what-if
// or a system file's rates have. Checked where the profile's fractions (its tables and scales) take a kernel or
// link there, at the table's lowest point; its measured rates are checked as they are read. Every run applies its
// profile, so the keys are worked out only for a rate below the floor.
void check_rates(const System& s, const Profile& p) {
  const Efficiency& e = s.efficiency;
  auto check = [&](double rate, const char* unit, const std::string& what, auto keys_of, const std::string& measured = "") {
    if (rate >= kMinHardwareRate) return;
    const std::string keys = keys_of();
    if (keys.empty()) return;  // nothing of the profile's took it there
    const std::string where = p.origin.empty() ? "calibration profile " + quote(p.name) : p.origin;
    throw InputError(where + ": " + keys + (measured.empty() ? "" : ", with " + measured) + " (" + what + " at " + format_number(rate) +
                     " " + unit + " on " + s.id + ", implausibly small, min " + format_number(kMinHardwareRate) + " " + unit + ")");
  };
  for (auto [d, table, key, extra] : {std::tuple{Dtype::bf16, &e.gemm_bf16, "bf16", ""}, {Dtype::fp8, &e.gemm_fp8, "fp8", ""},
                                       {Dtype::mxfp8, &e.gemm_mxfp8, "fp8", "mxfp8_gemm_scale"},
                                       {Dtype::nvfp4, &e.gemm_nvfp4, "nvfp4", "nvfp4_gemm_scale"}}) {
    const auto& set = std::string(key) == "bf16" ? p.gemm_bf16 : std::string(key) == "fp8" ? p.gemm_fp8 : p.gemm_nvfp4;
    check(lowest(*table) * s.gpu.peak_flops(d), "FLOP/s", std::string(to_string(d)) + " GEMMs", [&, key = key, extra = extra] {
      return profile_keys(p, s.id, set, std::string("efficiency.gemm.") + key,
                          *extra ? std::vector<const char*>{"gemm_scale", extra} : std::vector<const char*>{"gemm_scale"});
    });
  }
  check(lowest(e.attention) * s.gpu.peak_flops(Dtype::bf16), "FLOP/s", "attention",
        [&] { return profile_keys(p, s.id, p.attention, "efficiency.attention", {"attention_scale"}); });
  check(lowest(e.memory_bound) * s.gpu.hbm_bandwidth_bytes_per_s, "bytes/s", "memory-bound kernels",
        [&] { return profile_keys(p, s.id, p.memory_bound, "efficiency.memory_bound", {}); },
        p.hbm_bandwidth_bytes_per_s ? "hbm_bandwidth_bytes_per_s = " + format_number(*p.hbm_bandwidth_bytes_per_s) : "");
  std::string link_figures;  // the profile's measured host link, named beside the fraction that slows it
  for (auto [key, value] : {std::pair{"host_link.h2d_bytes_per_s", p.h2d_bytes_per_s}, {"host_link.d2h_bytes_per_s", p.d2h_bytes_per_s},
                            {"host_link.bidirectional_total_bytes_per_s", p.bidirectional_total_bytes_per_s}})
    if (value) link_figures += (link_figures.empty() ? "" : " and ") + (key + (" = " + format_number(*value)));
  const double link = std::min(s.host_h2d_bytes_per_s(), s.host_d2h_bytes_per_s());
  check(link, "bytes/s", "the host link", [&] { return profile_keys(p, s.id, std::nullopt, "", {"host_link_scale"}); }, link_figures);
  check(lowest(e.copy) * link, "bytes/s", "host copies",
        [&] { return profile_keys(p, s.id, p.copy, "efficiency.copy", {"host_link_scale"}); }, link_figures);
  check(lowest(e.collective) * s.scale_up.per_gpu_bytes_per_s_per_direction, "bytes/s", "collectives",
        [&] { return profile_keys(p, s.id, p.collective, "efficiency.collective", {"collective_scale"}); });
  if (s.scale_out.per_gpu_bytes_per_s_per_direction > 0)
    check(lowest(e.collective) * e.scale_out_collective_factor * s.scale_out.per_gpu_bytes_per_s_per_direction, "bytes/s",
          "collectives between scale-up domains", [&] {
            return profile_keys(p, s.id, p.collective, "efficiency.collective", {"collective_scale", "scale_out_collective_scale"});
          });
}

}  // namespace

Profile load_profile(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  v.allow_only({"format", "name", "source", "system", "metadata", "host_link", "hbm_bandwidth_bytes_per_s",
                "d2d_bandwidth_bytes_per_s", "launch_overhead_s", "interference", "efficiency", "parameters"});
  auto fmt = v.at("format");
  if (fmt.string() != "hbmsim-profile/1") fmt.fail("unsupported format; expected \"hbmsim-profile/1\"");
  Profile p;
  p.origin = origin;
  if (auto n = v.find("name")) p.name = n->string();
  if (auto s = v.find("source")) p.source = s->string();
  if (auto s = v.find("system")) p.system = s->string();
  if (auto m = v.find("metadata")) {
    m->expect_object();
    for (auto& item : m->raw().items()) p.metadata[item.key()] = m->at(item.key()).string();
  }
  if (auto h = v.find("host_link")) {
    h->allow_only({"h2d_bytes_per_s", "d2h_bytes_per_s", "bidirectional_total_bytes_per_s", "latency_s"});
    if (auto x = h->find("h2d_bytes_per_s")) p.h2d_bytes_per_s = x->positive_at_most(kMaxHardwareBytesPerSecond, "bytes/s");
    if (auto x = h->find("d2h_bytes_per_s")) p.d2h_bytes_per_s = x->positive_at_most(kMaxHardwareBytesPerSecond, "bytes/s");
    if (auto x = h->find("bidirectional_total_bytes_per_s")) p.bidirectional_total_bytes_per_s = x->positive_at_most(kMaxHardwareBytesPerSecond, "bytes/s");
    if (auto x = h->find("latency_s")) p.host_latency_s = seconds(*x);
  }
  if (auto x = v.find("hbm_bandwidth_bytes_per_s")) p.hbm_bandwidth_bytes_per_s = x->positive_at_most(kMaxHardwareBytesPerSecond, "bytes/s");
  if (auto x = v.find("d2d_bandwidth_bytes_per_s")) p.d2d_bandwidth_bytes_per_s = x->positive_at_most(kMaxHardwareBytesPerSecond, "bytes/s");
  if (auto x = v.find("launch_overhead_s")) p.launch_overhead_s = seconds(*x);
  if (auto i = v.find("interference")) {
    i->allow_only({"compute_slowdown_during_copy"});
    if (auto x = i->find("compute_slowdown_during_copy")) {
      double s = x->non_negative();
      if (s >= 1) x->fail("must be in [0, 1)");
      p.compute_slowdown_during_copy = s;
    }
  }
  if (auto e = v.find("efficiency")) {
    e->allow_only({"gemm", "attention", "memory_bound", "copy", "collective"});
    if (auto g = e->find("gemm")) {
      g->allow_only({"bf16", "fp8", "nvfp4"});
      if (auto t = g->find("bf16")) p.gemm_bf16 = PiecewiseTable::from_json(*t);
      if (auto t = g->find("fp8")) p.gemm_fp8 = PiecewiseTable::from_json(*t);
      if (auto t = g->find("nvfp4")) p.gemm_nvfp4 = PiecewiseTable::from_json(*t);
    }
    if (auto t = e->find("attention")) p.attention = PiecewiseTable::from_json(*t);
    if (auto t = e->find("memory_bound")) p.memory_bound = PiecewiseTable::from_json(*t);
    if (auto t = e->find("copy")) p.copy = PiecewiseTable::from_json(*t);
    if (auto t = e->find("collective")) p.collective = PiecewiseTable::from_json(*t);
  }
  if (auto ps = v.find("parameters")) {
    ps->expect_object();
    for (auto& item : ps->raw().items()) {
      auto x = ps->at(item.key());
      ParameterKey key;
      try {
        key = parse_parameter_key(item.key());
      } catch (const std::invalid_argument& e) {
        x.fail(e.what());
      }
      double value = key.name == "copy_compute_interference" ? x.non_negative() : x.positive();
      if (key.name == "copy_compute_interference" && value >= 1) x.fail("must be in [0, 1)");
      p.parameters[item.key()] = value;
    }
  }
  return p;
}

Profile load_profile_file(const std::string& path) { return load_profile(parse_json_file(path), path); }

nlohmann::json Profile::to_json() const {
  nlohmann::json j = {{"format", "hbmsim-profile/1"}, {"name", name}, {"source", source}};
  if (!system.empty()) j["system"] = system;
  if (!metadata.empty()) j["metadata"] = metadata;
  nlohmann::json h = nlohmann::json::object();
  if (h2d_bytes_per_s) h["h2d_bytes_per_s"] = *h2d_bytes_per_s;
  if (d2h_bytes_per_s) h["d2h_bytes_per_s"] = *d2h_bytes_per_s;
  if (bidirectional_total_bytes_per_s) h["bidirectional_total_bytes_per_s"] = *bidirectional_total_bytes_per_s;
  if (host_latency_s) h["latency_s"] = *host_latency_s;
  if (!h.empty()) j["host_link"] = h;
  if (hbm_bandwidth_bytes_per_s) j["hbm_bandwidth_bytes_per_s"] = *hbm_bandwidth_bytes_per_s;
  if (d2d_bandwidth_bytes_per_s) j["d2d_bandwidth_bytes_per_s"] = *d2d_bandwidth_bytes_per_s;
  if (launch_overhead_s) j["launch_overhead_s"] = *launch_overhead_s;
  if (compute_slowdown_during_copy) j["interference"] = {{"compute_slowdown_during_copy", *compute_slowdown_during_copy}};
  nlohmann::json e = nlohmann::json::object(), g = nlohmann::json::object();
  if (gemm_bf16) g["bf16"] = gemm_bf16->to_json();
  if (gemm_fp8) g["fp8"] = gemm_fp8->to_json();
  if (gemm_nvfp4) g["nvfp4"] = gemm_nvfp4->to_json();
  if (!g.empty()) e["gemm"] = g;
  if (attention) e["attention"] = attention->to_json();
  if (memory_bound) e["memory_bound"] = memory_bound->to_json();
  if (copy) e["copy"] = copy->to_json();
  if (collective) e["collective"] = collective->to_json();
  if (!e.empty()) j["efficiency"] = e;
  if (!parameters.empty()) j["parameters"] = parameters;
  return j;
}

System apply_profile(System s, const Profile& p) {
  auto& e = s.efficiency;
  auto& l = s.host_link;
  if (p.h2d_bytes_per_s) l.measured_h2d_bytes_per_s = *p.h2d_bytes_per_s;
  if (p.d2h_bytes_per_s) l.measured_d2h_bytes_per_s = *p.d2h_bytes_per_s;
  if (p.bidirectional_total_bytes_per_s) l.bidirectional_total_bytes_per_s = *p.bidirectional_total_bytes_per_s;
  if (p.host_latency_s) l.latency_s = *p.host_latency_s;
  if (p.hbm_bandwidth_bytes_per_s) s.gpu.hbm_bandwidth_bytes_per_s = *p.hbm_bandwidth_bytes_per_s;
  if (p.launch_overhead_s) s.gpu.launch_overhead_s = *p.launch_overhead_s;
  if (p.d2d_bandwidth_bytes_per_s) s.gpu.measured_d2d_bytes_per_s = *p.d2d_bandwidth_bytes_per_s;
  if (p.compute_slowdown_during_copy) e.compute_slowdown_during_copy = *p.compute_slowdown_during_copy;
  if (p.gemm_bf16) e.gemm_bf16 = *p.gemm_bf16;
  if (p.gemm_fp8) e.gemm_fp8 = *p.gemm_fp8;
  e.gemm_mxfp8 = e.gemm_fp8;  // a measured fp8 table carries over to the block-scaled kernels too
  if (p.gemm_nvfp4) e.gemm_nvfp4 = *p.gemm_nvfp4;
  if (p.attention) e.attention = *p.attention;
  if (p.memory_bound) e.memory_bound = *p.memory_bound;
  if (p.copy) e.copy = *p.copy;
  if (p.collective) e.collective = *p.collective;
  // This system's own value of a parameter, else the one for every system (-1: none).
  auto param = [&](const char* k) {
    auto it = p.parameters.find(std::string(k) + "@" + s.id);
    if (it == p.parameters.end()) it = p.parameters.find(k);
    return it == p.parameters.end() ? -1.0 : it->second;
  };
  if (double f = param("gemm_scale"); f > 0)
    for (auto* t : {&e.gemm_bf16, &e.gemm_fp8, &e.gemm_mxfp8, &e.gemm_nvfp4}) t->scale(f);
  if (double f = param("nvfp4_gemm_scale"); f > 0) e.gemm_nvfp4.scale(f);
  if (double f = param("mxfp8_gemm_scale"); f > 0) e.gemm_mxfp8.scale(f);
  if (double f = param("attention_scale"); f > 0) e.attention.scale(f);
  if (double f = param("collective_scale"); f > 0) e.collective.scale(f);
  if (double f = param("scale_out_collective_scale"); f > 0) e.scale_out_collective_factor = f;
  if (double f = param("host_link_scale"); f > 0) {
    l.measured_h2d_bytes_per_s = s.host_h2d_bytes_per_s() * f;
    l.measured_d2h_bytes_per_s = s.host_d2h_bytes_per_s() * f;
  }
  if (double f = param("copy_compute_interference"); f >= 0) e.compute_slowdown_during_copy = f;
  s.calibration = p.name.empty() ? "unnamed profile" : p.name;
  s.calibration_system = p.system;
  check_rates(s, p);
  return s;
}

}  // namespace hbmsim
