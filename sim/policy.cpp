#include "sim/policy.hpp"

#include <algorithm>

#include "hwmodels/json_view.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

const char* to_string(Placement p) {
  switch (p) {
    case Placement::device: return "device";
    case Placement::remat: return "remat";
    case Placement::offload: return "offload";
  }
  return "?";
}

Placement parse_placement(const std::string& s, const std::string& where) {
  if (s == "device") return Placement::device;
  if (s == "remat") return Placement::remat;
  if (s == "offload") return Placement::offload;
  throw InputError(where + " = \"" + s + "\" (expected device, remat or offload)");
}

Placement Policy::placement(const std::string& name) const {
  if (name == "decoder_layer_input") return Placement::device;  // the remat boundary is always saved
  auto it = placements.find(name);
  return it == placements.end() ? Placement::remat : it->second;
}

std::vector<std::string> Policy::describe() const {
  std::vector<std::string> out;
  for (auto& n : checkpoint_names()) {
    auto p = placement(n);
    if (p != Placement::remat && n != "decoder_layer_input") out.push_back(n + "=" + to_string(p));
  }
  return out;
}

std::string Policy::name() const {
  if (stages.empty()) return preset;
  std::string out;
  for (const auto& st : stages) out += (out.empty() ? "" : "/") + st.preset;
  return out;
}

Policy make_stage_policy(const std::string& preset, const std::string& stage_presets,
                         const std::map<std::string, std::string>& overrides, std::int64_t stages) {
  Policy p = make_policy(preset, overrides);
  if (stage_presets.empty()) return p;
  std::vector<std::string> names;
  for (std::size_t start = 0;;) {
    const auto comma = stage_presets.find(',', start);
    names.push_back(stage_presets.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<std::int64_t>(names.size()) != stages)
    throw InputError("stage_policies = \"" + stage_presets + "\" (" + std::to_string(names.size()) + " policies for pp = " +
                     std::to_string(stages) + " stages)");
  for (std::size_t i = 0; i < names.size(); ++i) {
    try {
      p.stages.push_back(make_policy(names[i], overrides));
    } catch (const InputError& e) {
      throw InputError("stage_policies = \"" + stage_presets + "\" (stage " + std::to_string(i) + ": " + e.what() + ")");
    }
  }
  return p;
}

const std::vector<std::string>& policy_presets() {
  static const std::vector<std::string> p = {"full",         "minimal",            "minimal_with_context",
                                             "save_qkv_proj", "qkv_proj_offloaded", "minimal_offloaded",
                                             "custom"};
  return p;
}

Policy make_policy(const std::string& preset, const std::map<std::string, std::string>& overrides) {
  Policy p;
  p.preset = preset;
  // MaxText's minimal list (decoders.py): the projections and MLP matmul outputs.
  const std::vector<std::string> minimal = {"query_proj", "key_proj", "value_proj", "qkv_proj",
                                            "out_proj",   "mlpwi_0",  "mlpwi_1",    "mlpwo"};
  const std::vector<std::string> qkv = {"query_proj", "key_proj", "value_proj", "qkv_proj"};
  auto set = [&](const std::vector<std::string>& names, Placement where) {
    for (auto& n : names) p.placements[n] = where;
  };
  if (preset == "full" || preset == "custom") {
  } else if (preset == "minimal") {
    set(minimal, Placement::device);
  } else if (preset == "minimal_with_context") {
    set(minimal, Placement::device);
    p.placements["context"] = Placement::device;
  } else if (preset == "save_qkv_proj") {
    set(qkv, Placement::device);
  } else if (preset == "qkv_proj_offloaded") {
    set(qkv, Placement::offload);
  } else if (preset == "minimal_offloaded") {
    set(minimal, Placement::offload);
  } else {
    std::string list;
    for (auto& n : policy_presets()) list += (list.empty() ? "" : ", ") + n;
    throw InputError("policy = \"" + preset + "\" (unknown; expected one of " + list + ")");
  }
  for (auto& [name, value] : overrides) {
    if (!is_checkpoint_name(name)) {
      std::string list;
      for (auto& n : checkpoint_names()) list += (list.empty() ? "" : ", ") + n;
      throw InputError("--tensor " + name + " (unknown checkpoint name; expected one of " + list + ")");
    }
    auto where = parse_placement(value, "--tensor " + name);
    if (name == "decoder_layer_input" && where != Placement::device)
      throw InputError("--tensor decoder_layer_input=" + value + " (the layer input is the remat boundary and stays on device)");
    p.placements[name] = where;
  }
  return p;
}

}  // namespace hbmsim
