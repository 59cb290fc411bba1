#include "planner/layer_counts.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace hbmsim {

namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / 1073741824.0);
  return buf;
}

// The field a search sets.
std::int64_t& count_of(RunConfig& c, LayerCount what) { return what == LayerCount::offload ? c.offload_layers : c.recompute_layers; }

// The most layers the field can name: every layer to offload, the largest chunk's to recompute.
std::int64_t most_layers(const RunConfig& base, LayerCount what) {
  RunConfig c = base;
  c.offload_layers = c.recompute_layers = 0;
  const PreparedRun run = prepare_run(c);
  const StepGraph& g = run.graph;
  if (what == LayerCount::offload) return g.model.stack_layers();
  // Recomputing a layer in full changes nothing where every layer's policy already does.
  if (!run.policy.any_applied([](const Policy& q) { return q.preset != "full"; }))
    throw InputError("policy = " + base.policy + " (recomputes every layer in full already: recompute_layers searches how many "
                     "layers per chunk must be, the others keeping the policy given, e.g. no_recompute or selective)");
  std::int64_t most = 0;
  for (const PipelineChunk& chunk : g.chunks) most = std::max(most, chunk.layers());
  return most;
}

}  // namespace

void check_layer_count_search(const RunConfig& base, LayerCount what) {
  RunConfig c = base;
  count_of(c, what) = most_layers(base, what);
  (void)prepare_run(c);
}

const char* field_name(LayerCount what) { return what == LayerCount::offload ? "offload_layers" : "recompute_layers"; }

std::int64_t layer_count(const RunConfig& c, LayerCount what) {
  return what == LayerCount::offload ? c.offload_layers : c.recompute_layers;
}

const Candidate* LayerCountSearch::at(std::int64_t count) const {
  for (const auto& t : tried)
    if (layer_count(t.config, what) == count) return &t;
  return nullptr;
}

LayerCountSearch fewest_layers(const RunConfig& base, LayerCount what) {
  const std::int64_t L = most_layers(base, what);
  LayerCountSearch out;
  out.what = what;
  const std::string noun = what == LayerCount::offload ? "offloaded" : "recomputed";
  std::map<std::int64_t, bool> hbm_fits;
  auto test = [&](std::int64_t n) {
    if (auto it = hbm_fits.find(n); it != hbm_fits.end()) return it->second;
    RunConfig c = base;
    count_of(c, what) = n;
    const StepReport r = run_simulation(c);
    out.tried.push_back({c, r});
    return hbm_fits[n] = r.hbm_peak_bytes <= r.hbm_capacity_bytes;
  };
  if (!test(L)) {
    const StepReport& r = out.at(L)->report;
    out.why = "with " + std::to_string(L) + " layers " + noun + " it still needs " + gib(r.hbm_peak_bytes) + " GiB of HBM, over " +
              gib(r.hbm_capacity_bytes);
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
    out.why = std::to_string(good) + " layers " + noun + " fit HBM but need " + gib(r.host_peak_bytes) + " GiB of pinned host memory, over " +
              gib(r.host_capacity_bytes) + (what == LayerCount::offload ? "; more layers need more" : "");
    return out;
  }
  out.layers = good;
  out.why = good == 0 ? "fits as it is"
                      : std::to_string(good) + " of " + std::to_string(L) + " layers" +
                            (what == LayerCount::recompute ? " per chunk" : "") + "; " + std::to_string(good - 1) + " need " +
                            gib(out.at(good - 1)->report.hbm_peak_bytes) + " GiB of HBM, over " + gib(r.hbm_capacity_bytes);
  return out;
}

}  // namespace hbmsim
