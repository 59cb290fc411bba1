// Activation policy: for every MaxText checkpoint name, keep it on the device, rematerialize it in the
// backward pass, or offload it to pinned host memory. Presets follow MaxText's remat_policy values.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hbmsim {

enum class Placement { device, remat, offload };
const char* to_string(Placement p);
Placement parse_placement(const std::string& s, const std::string& where);

struct Policy {
  std::string preset = "full";
  std::map<std::string, Placement> placements;  // checkpoint names not listed are rematerialized
  // With pipeline parallelism, one policy per stage when they differ (the first stage offloading what the
  // last keeps); empty: this one everywhere.
  std::vector<Policy> stages;

  const Policy& for_stage(std::size_t stage) const { return stages.empty() ? *this : stages.at(stage); }
  std::string name() const;  // the preset, or the stages' presets joined by "/"
  Placement placement(const std::string& name) const;
  // Names whose placement is not remat, as "name=placement" (stable order), for reports.
  std::vector<std::string> describe() const;
};

const std::vector<std::string>& policy_presets();
// `overrides` are "name=device|remat|offload" (from --tensor); they apply on top of the preset.
Policy make_policy(const std::string& preset, const std::map<std::string, std::string>& overrides = {});
// `stage_presets`: comma-separated presets, one per pipeline stage ("" for `preset` on all); the overrides
// apply to every stage. Errors name stage_policies.
Policy make_stage_policy(const std::string& preset, const std::string& stage_presets,
                         const std::map<std::string, std::string>& overrides, std::int64_t stages);

}  // namespace hbmsim
