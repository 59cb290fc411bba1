// Activation policy: for every MaxText checkpoint name, keep it on the device, rematerialize it in the
// backward pass, or offload it to pinned host memory. Presets follow MaxText's remat_policy values.
#pragma once
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

  Placement placement(const std::string& name) const;
  // Names whose placement is not remat, as "name=placement" (stable order), for reports.
  std::vector<std::string> describe() const;
};

const std::vector<std::string>& policy_presets();
// `overrides` are "name=device|remat|offload" (from --tensor); they apply on top of the preset.
Policy make_policy(const std::string& preset, const std::map<std::string, std::string>& overrides = {});

}  // namespace hbmsim
