#include "sim/policy.hpp"

#include <algorithm>
#include <stdexcept>

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

Placement Policy::placement(const std::string& name, const std::string& kind) const {
  auto it = placements.find(name + "@" + kind);
  return it == placements.end() ? placement(name) : it->second;
}

std::vector<std::string> Policy::describe() const {
  std::vector<std::string> out;
  for (auto& n : checkpoint_names()) {
    auto p = placement(n);
    if (p != Placement::remat && n != "decoder_layer_input") out.push_back(n + "=" + to_string(p));
  }
  for (auto& n : module_tensor_names()) {
    auto it = placements.find(n);
    if (it != placements.end() && it->second != Placement::remat) out.push_back(n + "=" + to_string(it->second));
  }
  // Kind-qualified keys, every one: remat there may differ from the name's placement elsewhere.
  for (const auto& [key, where] : placements)
    if (key.find('@') != std::string::npos) out.push_back(key + "=" + to_string(where));
  return out;
}

std::string Policy::name() const {
  std::string out;
  if (stages.empty()) out = preset;
  for (const auto& st : stages) {
    if (!out.empty()) out += '/';
    out += st.preset;
  }
  return layer_rules.empty() ? out : out + " [" + layer_rules_text(*this) + "]";
}

std::string layer_rules_text(const Policy& p) {
  std::vector<const Policy*> rules;
  for (const auto& r : p.layer_rules) rules.push_back(&r);
  std::sort(rules.begin(), rules.end(), [](const Policy* a, const Policy* b) { return a->first_layer < b->first_layer; });
  std::string list;
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on the chain of temporaries.
  for (const Policy* r : rules) {
    if (!list.empty()) list += ", ";
    list += std::to_string(r->first_layer);
    if (r->last_layer > r->first_layer) {
      list += '-';
      list += std::to_string(r->last_layer);
    }
    list += ' ';
    list += r->preset;
  }
  return list;
}

bool Policy::offloads_any() const {
  return any_applied([](const Policy& p) {
    if (p.offload_kept) return true;
    for (const auto& [name, where] : p.placements)
      if (where == Placement::offload) return true;
    return false;
  });
}

namespace {

// Adds `rule` for layers [first, last]; `field` (with its value) starts any error.
void add_rule(Policy& p, Policy rule, std::int64_t first, std::int64_t last, std::int64_t num_layers, const std::string& field) {
  if (last < first)
    throw InputError(field + " (layers " + str(first) + "-" + str(last) + ": the first layer is after the last)");
  if (first < 0 || last >= num_layers)
    throw InputError(field + " (layers " + str(first) + "-" + str(last) + " are outside the model's layers 0-" +
                     str(num_layers - 1) + ")");
  for (const Policy& r : p.layer_rules)
    if (first <= r.last_layer && r.first_layer <= last)
      throw InputError(field + " (layers " + str(first) + "-" + str(last) + " overlap layers " + str(r.first_layer) + "-" +
                       str(r.last_layer) + ", which already have the policy " + r.preset + ")");
  rule.first_layer = first;
  rule.last_layer = last;
  rule.stages.clear();
  rule.layer_rules.clear();
  p.layer_rules.push_back(std::move(rule));
}

std::int64_t layer_number(const std::string& text, const std::string& field) {
  std::int64_t v = 0;
  std::size_t used = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw InputError(field + " (\"" + text + "\" is not a layer number)");
  return v;
}

}  // namespace

void add_layer_policies(Policy& p, const std::string& text, const std::map<std::string, std::string>& overrides,
                        std::int64_t num_layers) {
  const std::string field = "layer_policies = \"" + text + "\"";
  for (std::size_t start = 0; start < text.size();) {
    const auto comma = text.find(',', start);
    // Spaces around the parts are allowed ("0-39: minimal_offloaded, 40-79: full"), as written by hand.
    const std::string item = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? text.size() : comma + 1;
    const auto colon = item.find(':');
    if (colon == std::string::npos) throw InputError(field + " (item \"" + item + "\": expected FIRST-LAST:PRESET)");
    const std::string range = trim(item.substr(0, colon));
    const auto dash = range.find('-', 1);
    const std::int64_t first = layer_number(trim(range.substr(0, dash)), field);
    const std::int64_t last = dash == std::string::npos ? first : layer_number(trim(range.substr(dash + 1)), field);
    Policy rule;
    try {
      rule = make_policy(trim(item.substr(colon + 1)), overrides);
    } catch (const InputError& e) {
      throw InputError(field + " (item \"" + item + "\": " + e.what() + ")");
    }
    add_rule(p, std::move(rule), first, last, num_layers, field);
  }
}

void add_offload_layers(Policy& p, std::int64_t n, std::int64_t num_layers) {
  if (n == 0) return;
  const std::string field = "offload_layers = " + str(n);
  if (n < 0 || n > num_layers) throw InputError(field + " (must be between 0 and num_layers = " + str(num_layers) + ")");
  if (!p.stages.empty()) throw InputError(field + " (with stage_policies: give the offloaded layers in layer_policies)");
  bool any = p.keep_backward_inputs;
  for (const auto& [name, where] : p.placements) any = any || where == Placement::device;
  if (!any) throw InputError(field + " (policy " + p.preset + " keeps nothing on device to offload)");
  Policy rule = p;
  rule.offload_kept = true;
  rule.preset = p.preset + (p.preset.size() > 10 && p.preset.substr(p.preset.size() - 10) == "_offloaded" ? "" : "_offloaded");
  add_rule(p, std::move(rule), 0, n - 1, num_layers, field);
}

void add_recompute_layers(Policy& p, std::int64_t n, const std::vector<PipelineChunk>& chunks) {
  if (n == 0) return;
  const std::string field = "recompute_layers = " + str(n);
  const std::int64_t num_layers = chunks.empty() ? 0 : chunks.back().end_layer;
  std::int64_t largest = 0;
  for (const PipelineChunk& c : chunks) largest = std::max(largest, c.layers());
  if (n < 0 || n > largest)
    throw InputError(field + " (must be between 0 and the layers of the largest pipeline chunk, " + str(largest) + ")");
  // Megatron's block method checkpoints layers [0, n) of each chunk: all of a chunk with fewer.
  for (const PipelineChunk& c : chunks) {
    const std::int64_t k = std::min(n, c.layers());
    if (k > 0) add_rule(p, make_policy("full"), c.first_layer, c.first_layer + k - 1, num_layers, field);
  }
}

Policy make_stage_policy(const std::string& preset, const std::string& stage_presets,
                         const std::map<std::string, std::string>& overrides, std::int64_t stages) {
  Policy p = make_policy(preset, overrides);
  if (stage_presets.empty()) return p;
  std::vector<std::string> names;
  for (std::size_t start = 0;;) {
    const auto comma = stage_presets.find(',', start);
    names.push_back(trim(stage_presets.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
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
  static const std::vector<std::string> p = {"full",          "minimal",           "minimal_with_context",
                                             "save_qkv_proj", "qkv_proj_offloaded", "minimal_offloaded",
                                             "no_recompute",  "selective",         "custom"};
  return p;
}

bool keeps_backward_inputs(const std::string& preset) { return preset == "no_recompute" || preset == "selective"; }

std::string module_tensor_refused(const std::string& name, const std::string& where, const std::string& preset) {
  if (!is_module_tensor_name(name) || where == "remat" || keeps_backward_inputs(preset)) return "";
  return "policy " + preset + " keeps only MaxText checkpoint names; " + name + " is kept only by no_recompute or selective";
}

Policy make_policy(const std::string& preset, const std::map<std::string, std::string>& overrides) {
  Policy p;
  p.preset = preset;
  p.keep_backward_inputs = keeps_backward_inputs(preset);
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
  } else if (preset == "no_recompute") {
  } else if (preset == "selective") {
    // Megatron's --recompute-granularity selective (recompute_modules core_attn, its default): what autograd
    // keeps, but the core attention is run again in the backward from the kept projections.
    p.placements["context"] = Placement::remat;
  } else {
    std::string list;
    for (auto& n : policy_presets()) list += (list.empty() ? "" : ", ") + n;
    throw InputError("policy = \"" + preset + "\" (unknown; expected one of " + list + ")");
  }
  for (auto& [key, value] : overrides) {
    // Messages name the tensor by its config path; the CLI renames it to the flag or file it came from.
    const std::string field = "tensors." + key;
    const std::string name = split_tensor_key(key).name;
    if (const std::string why = tensor_key_error(key); !why.empty()) {
      if (is_checkpoint_name(name) || is_module_tensor_name(name)) throw InputError(field + " = \"" + value + "\" (" + why + ")");
      std::string list, modules;
      for (auto& n : checkpoint_names()) list += (list.empty() ? "" : ", ") + n;
      for (auto& n : module_tensor_names()) modules += (modules.empty() ? "" : ", ") + n;
      throw InputError(field + " = \"" + value + "\" (" + why + "; expected one of " + list +
                       ", or under no_recompute or selective one of " + modules + ", each optionally @dense or @moe)");
    }
    auto where = parse_placement(value, field);
    if (const std::string why = module_tensor_refused(name, value, preset); !why.empty())
      throw InputError(field + " = \"" + value + "\" (" + why + ")");
    if (name == "decoder_layer_input" && where != Placement::device)
      throw InputError(field + " = \"" + value + "\" (the layer input is the remat boundary and stays on device)");
    p.placements[key] = where;
  }
  return p;
}

}  // namespace hbmsim
