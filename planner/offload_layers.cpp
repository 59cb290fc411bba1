#include "planner/offload_layers.hpp"

#include <cstdio>
#include <map>

namespace hbmsim {

namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / 1073741824.0);
  return buf;
}

}  // namespace

const Candidate* OffloadLayers::at(std::int64_t count) const {
  for (const auto& t : tried)
    if (t.config.offload_layers == count) return &t;
  return nullptr;
}

OffloadLayers fewest_offload_layers(const RunConfig& base) {
  const std::int64_t L = prepare_run(base).graph.model.num_layers;
  OffloadLayers out;
  std::map<std::int64_t, bool> hbm_fits;
  auto test = [&](std::int64_t n) {
    if (auto it = hbm_fits.find(n); it != hbm_fits.end()) return it->second;
    RunConfig c = base;
    c.offload_layers = n;
    const StepReport r = run_simulation(c);
    out.tried.push_back({c, r});
    return hbm_fits[n] = r.hbm_peak_bytes <= r.hbm_capacity_bytes;
  };
  if (!test(L)) {
    const StepReport& r = out.at(L)->report;
    out.why = "every layer offloaded still needs " + gib(r.hbm_peak_bytes) + " GiB of HBM, over " + gib(r.hbm_capacity_bytes);
    return out;
  }
  std::int64_t bad = -1, good = L;  // hbm_fits(good), and not hbm_fits(bad) (-1: nothing tried below)
  if (test(0)) good = 0;
  else bad = 0;
  while (good - bad > 1) {
    const std::int64_t mid = bad + (good - bad) / 2;
    (test(mid) ? good : bad) = mid;
  }
  const StepReport& r = out.at(good)->report;
  if (r.host_peak_bytes > r.host_capacity_bytes) {
    out.why = std::to_string(good) + " layers fit HBM but need " + gib(r.host_peak_bytes) + " GiB of pinned host memory, over " +
              gib(r.host_capacity_bytes) + "; more layers need more";
    return out;
  }
  out.layers = good;
  out.why = good == 0 ? "fits without offloading a layer"
                      : std::to_string(good) + " of " + std::to_string(L) + " layers; " + std::to_string(good - 1) + " need " +
                            gib(out.at(good - 1)->report.hbm_peak_bytes) + " GiB of HBM, over " + gib(r.hbm_capacity_bytes);
  return out;
}

}  // namespace hbmsim
