// Activation policy: for every MaxText checkpoint name, keep it on the device, rematerialize it in the
// backward pass, or offload it to pinned host memory. Presets follow MaxText's remat_policy values.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "workloads/pipeline_split.hpp"

namespace hbmsim {

enum class Placement { device, remat, offload };
const char* to_string(Placement p);
Placement parse_placement(const std::string& s, const std::string& where);

struct Policy {
  std::string preset = "full";
  // Checkpoint names not listed are rematerialized; module tensor names only under keep_backward_inputs.
  std::map<std::string, Placement> placements;
  // With pipeline parallelism, one policy per stage when they differ (the first stage offloading what the
  // last keeps); empty: this one everywhere.
  std::vector<Policy> stages;
  // Layer ranges with a policy of their own, ahead of the stage's (Megatron's CPU offload of N layers, full
  // recompute of N layers per chunk; MaxText keys applied to a layer subset). Disjoint, in model layers.
  std::vector<Policy> layer_rules;
  // Keep every tensor a backward op reads, as autograd does without recompute (preset no_recompute); a tensor
  // all-gathered for its reader (sequence parallelism) is kept sharded and gathered again in the backward, as
  // Megatron-Core does. Names placed explicitly override it.
  bool keep_backward_inputs = false;
  // Every tensor the layer keeps goes to host, its input included (a layer rule: Transformer Engine's CPU
  // offload sends every tensor the layer saves).
  bool offload_kept = false;
  std::int64_t first_layer = 0, last_layer = -1;  // a layer rule's range, inclusive

  const Policy& for_stage(std::size_t stage) const { return stages.empty() ? *this : stages.at(stage); }
  const Policy& for_layer(std::int64_t layer, std::size_t stage) const {
    for (const Policy& r : layer_rules)
      if (layer >= r.first_layer && layer <= r.last_layer) return r;
    return for_stage(stage);
  }
  // Whether `f` holds for a policy some layer runs under: this one or, when they are given, a stage's, or a
  // layer rule's.
  template <class F>
  bool any_applied(F f) const {
    if (stages.empty() ? f(*this) : std::any_of(stages.begin(), stages.end(), f)) return true;
    return std::any_of(layer_rules.begin(), layer_rules.end(), f);
  }
  // Whether any stage or layer sends a checkpoint name to host memory.
  bool offloads_any() const;
  // The preset, or the stages' presets joined by "/"; layer rules follow as " [0-39 name, ...]".
  std::string name() const;
  Placement placement(const std::string& name) const;
  // In a layer of `kind` ("dense", "moe"): NAME@kind where given, else NAME.
  Placement placement(const std::string& name, const std::string& kind) const;
  // Whether NAME or NAME@kind is placed outright.
  bool places(const std::string& name, const std::string& kind) const {
    return placements.count(name) > 0 || placements.count(name + "@" + kind) > 0;
  }
  // Whether any placement is for one kind of layer (else the name alone decides, without building keys).
  bool has_kind_keys() const {
    return std::any_of(placements.begin(), placements.end(), [](const auto& p) { return p.first.find('@') != std::string::npos; });
  }
  // Names whose placement is not remat, as "name=placement" (stable order), for reports.
  std::vector<std::string> describe() const;
};

// The layer rules in layer order, "0-39 minimal_offloaded, 40 full" ("" without any).
std::string layer_rules_text(const Policy& p);

const std::vector<std::string>& policy_presets();
// Whether the preset keeps what autograd saves (no_recompute, selective): the only presets that place the
// module tensor names.
bool keeps_backward_inputs(const std::string& preset);
// Why `name` may not be placed `where` under `preset` ("" when it may): a module tensor name is kept only by a
// preset that keeps what autograd saves; elsewhere only remat, what it gets anyway, says the same.
std::string module_tensor_refused(const std::string& name, const std::string& where, const std::string& preset);
// `overrides` are "name=device|remat|offload" (from --tensor); they apply on top of the preset.
Policy make_policy(const std::string& preset, const std::map<std::string, std::string>& overrides = {});
// `stage_presets`: comma-separated presets, one per pipeline stage ("" for `preset` on all); the overrides
// apply to every stage. Errors name stage_policies.
Policy make_stage_policy(const std::string& preset, const std::string& stage_presets,
                         const std::map<std::string, std::string>& overrides, std::int64_t stages);

// Layer rules. Each names its field in errors and refuses layers outside the model or already ruled.
// `text`: comma-separated "FIRST-LAST:PRESET" (or "LAYER:PRESET"), inclusive model layers; overrides apply.
void add_layer_policies(Policy& p, const std::string& text, const std::map<std::string, std::string>& overrides,
                        std::int64_t num_layers);
// The first `n` layers send to host memory what the policy keeps on device (Megatron cpu_offloading_num_layers:
// Transformer Engine offloads the saved activations of the first n layers in forward order).
void add_offload_layers(Policy& p, std::int64_t n, std::int64_t num_layers);
// The first `n` layers of every pipeline chunk fully rematerialized (Megatron recompute_granularity=full,
// recompute_method=block, recompute_num_layers=n: counted per model chunk).
void add_recompute_layers(Policy& p, std::int64_t n, const std::vector<PipelineChunk>& chunks);

}  // namespace hbmsim
