// What the tests of windowed and chunked attention share (test_sliding_window.cpp, test_llama4.cpp): a shipped
// HF config, a one-sequence step at a given length and its attention op, and the laws a run of such a model
// keeps (DESIGN.md's on the run itself, the fast-forward equal to every event, and the same model without its
// mask, more attention work, never faster).
#pragma once
#include <catch2/catch.hpp>

#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "better_hardware.hpp"
#include "helpers.hpp"
#include "planner/run_summary.hpp"
#include "random_configs.hpp"
#include "workloads/step_graph.hpp"

namespace test {

// One sequence of `seq` tokens per device on 8 GPUs.
inline hbmsim::TrainingSpec training(std::int64_t seq) {
  hbmsim::TrainingSpec t;
  t.gpus = 8;
  t.per_device_batch = 1;
  t.seq_len = seq;
  return t;
}

// The attention op of a layer template: its forward FLOPs.
inline double attention_flops(const hbmsim::LayerTemplate& t) {
  for (const auto& op : t.ops)
    if (op.kind == hbmsim::OpKind::attention) return op.flops;
  FAIL("no attention op");
  return 0;
}

// `r` is run_simulation(c); `mask_keys` the model-file keys that make the mask, taken out for the comparison
// (`tag` names the temporary model file).
inline void check_masked_run(const hbmsim::RunConfig& c, const hbmsim::StepReport& r, std::initializer_list<const char*> mask_keys,
                             const std::string& tag) {
  using namespace hbmsim;
  CHECK(r.mfu <= 1.0);
  CHECK(r.executed_flops_per_device >= r.model_flops_per_device * (1 - 1e-12));
  const ModelSpec model = resolve_model(c.model);
  CHECK(r.model_flops_per_device * static_cast<double>(c.gpus) ==
        Approx(static_cast<double>(r.global_batch) * model.model_flops(1, c.seq, 1).total()).epsilon(1e-9));
  const StepReport plain = simulate_resolved(c, false, false).report;
  CHECK(plain.step_time_s == Approx(r.step_time_s).epsilon(1e-9));
  CHECK(plain.hbm_peak_bytes == Approx(r.hbm_peak_bytes).epsilon(1e-9));
  auto spec = model.to_json();
  for (const char* key : mask_keys) spec.erase(key);
  const auto path = (temp_dir() / (tag + ".json")).string();
  write(path, spec.dump());
  RunConfig full = c;
  full.model = path;
  const StepReport unmasked = run_simulation(full);
  // More attention work re-times the collectives as a slower GPU would (allowed_retiming).
  CHECK(unmasked.step_time_s >= r.step_time_s * (1 - allowed_retiming(c, prepare_run(c), r)));
  CHECK(unmasked.model_flops_per_device > r.model_flops_per_device);
}

// Seeded random layouts (a third of them pipelines), each with `setup(c, k, rng)` putting in a masked model and
// a sequence its mask cuts, no MTP: the layouts the model cannot take are skipped, the others checked with
// check_masked_run, until `wanted` are or `attempts` were drawn. Returns the models of the runs checked.
template <class Setup>
std::vector<std::string> check_masked_draws(std::uint32_t seed, int attempts, int wanted, std::initializer_list<const char*> mask_keys,
                                            const std::string& tag, Setup setup) {
  std::mt19937 rng(seed);
  std::vector<std::string> checked;
  for (int k = 0; k < attempts && static_cast<int>(checked.size()) < wanted; ++k) {
    hbmsim::RunConfig c = k % 3 == 0 ? random_pipeline(rng) : random_config(rng);
    setup(c, k, rng);
    c.mtp_layers = 0;
    std::optional<hbmsim::StepReport> r;
    try {
      r = hbmsim::run_simulation(c);
    } catch (const hbmsim::InputError&) {
      continue;  // a layout this model cannot take (heads, experts or layers not divisible)
    }
    INFO(c.to_json().dump());
    checked.push_back(c.model);
    check_masked_run(c, *r, mask_keys, tag + "_" + std::to_string(k));
  }
  return checked;
}

}  // namespace test
