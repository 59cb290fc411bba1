#include "cli/run_flags.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "cli/commands.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/run_fields.hpp"
#include "sim/policy.hpp"
#include "workloads/model.hpp"
#include "workloads/training.hpp"

namespace hbmsim::cli {

namespace {

// Where each field of a resolved RunConfig came from, to name it in messages the way the user wrote it.
struct Sources {
  std::string config_file;                 // empty: no config file
  std::set<std::string> config_keys;       // top-level keys of the config file
  std::set<std::string> config_tensors;    // tensors.NAME keys of the config file
  std::set<std::string> flag_fields;       // fields given as flags
  std::set<std::string> flag_tensors;      // --tensor NAME=...

  // "--hbm-bytes", "run.json: hbm_bytes", or just "hbm_bytes" for a default value.
  std::string name(const std::string& field) const {
    if (flag_fields.count(field)) return flag_for_field(field);
    if (config_keys.count(field)) return config_file + ": " + field;
    return field;
  }
  std::string tensor_name(const std::string& tensor) const {
    if (flag_tensors.count(tensor)) return "--tensor " + tensor;
    if (config_tensors.count(tensor)) return config_file + ": tensors." + tensor;
    return "tensors." + tensor;
  }
  // A library message that starts with one of `fields` ("system = ...", "tp = 3 (...)") starts with the
  // name of where that field came from instead.
  // A policy message that starts "tensors.NAME " names the tensor the same way.
  std::string attribute(const std::string& message, std::initializer_list<std::string_view> fields) const {
    if (const auto end = message.find(' '); message.rfind("tensors.", 0) == 0 && end != std::string::npos)
      return tensor_name(message.substr(8, end - 8)) + message.substr(end);
    for (auto f : fields) {
      const std::string field(f);
      if (message.rfind(field + " = ", 0) == 0 || message.rfind(field + " (", 0) == 0)
        return name(field) + message.substr(field.size());
    }
    return message;
  }
};

template <class F>
auto attributed(const Sources& s, std::initializer_list<std::string_view> fields, F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    throw InputError(s.attribute(e.what(), fields));
  }
}

void check_dtype(const Sources& s, const std::string& field, const std::string& value, bool fp32_allowed) {
  std::optional<Dtype> d;
  try {
    d = parse_dtype(value);
  } catch (const InputError&) {
  }
  if (!d || (*d == Dtype::fp32 && !fp32_allowed))
    throw InputError(s.name(field) + " = " + quote(value) + " (" +
                     (d ? std::string("fp32 is not an MLP GEMM dtype") : std::string("unknown dtype")) +
                     (fp32_allowed ? "; expected bf16, fp8, mxfp8, nvfp4 or fp32)" : "; expected bf16, fp8, mxfp8 or nvfp4)"));
}

// A number flag past a double's range (--hbm-bytes 1e400) is out of range, not "not a number".
void check_number_range(const std::string& field, const std::string& text) {
  if (!find_what_if(field) && field != "memory_limit_slop") return;
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return;
  errno = 0;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  if (errno == ERANGE && end == text.c_str() + text.size())
    throw InputError(flag_for_field(field) + " = " + text + " (out of the range of a double)");
}

void check_run_config(const RunConfig& c, const Sources& s, const std::set<std::string>& varied) {
  auto fixed = [&](std::string_view field) { return varied.count(std::string(field)) == 0; };
  bool tensors_fixed = true;
  for (auto& v : varied) tensors_fixed = tensors_fixed && v.rfind("tensor.", 0) != 0;

  // What-if figures (a config file's were checked for > 0 when it was read; flags were not).
  check_what_ifs(c, [&](const std::string& f) { return s.name(f); }, [&](const std::string& f) { return !fixed(f); });

  // Each fixed field's own range (flags are read for their form only). Without it a search whose training shape
  // is partly varied would refuse every candidate for the same fixed value and print that as a result.
  for (const RunField& f : run_fields())
    if (const std::string field(f.name); fixed(field))
      if (const std::string why = f.range_problem(c); !why.empty())
        throw InputError(s.name(field) + " = " + f.json(c)->dump() + " (" + why + ")");

  if (fixed("system")) attributed(s, {"system"}, [&] { return resolve_system(c.system); });
  std::optional<System> run_system;  // the system as the run sees it, profile applied
  if (fixed("calibration")) {
    check_calibration(c.calibration, s.name("calibration"));
    if (fixed("system")) run_system = attributed(s, {"calibration"}, [&] { return resolve_run_system(c); });
  }
  std::optional<ModelSpec> model;
  if (fixed("model")) model = attributed(s, {"model"}, [&] { return resolve_model(c.model); });
  if (fixed("weights")) check_dtype(s, "weights", c.weights, false);
  if (fixed("attention_dtype")) check_dtype(s, "attention_dtype", c.attention_dtype, true);
  if (run_system)  // (a pair, not a structured binding: clang cannot capture those in a lambda)
    for (const auto& dt : {std::pair<const char*, const std::string*>{"weights", &c.weights}, {"attention_dtype", &c.attention_dtype}})
      if (fixed(dt.first))
        attributed(s, {dt.first}, [&] {
          check_gpu_dtype(*run_system, dt.first, parse_dtype(*dt.second));
          return 0;
        });

  if (fixed("policy") && tensors_fixed) {
    attributed(s, {"policy"}, [&] { return make_policy(c.policy, c.tensors); });
    if (fixed("stage_policies") && fixed("pp"))
      attributed(s, {"stage_policies"}, [&] { return make_stage_policy(c.policy, c.stage_policies, c.tensors, c.pp); });
  }

  // The training shape: every field validate_training reads.
  const std::initializer_list<std::string_view> shape = {
      "gpus", "batch", "micro_batch", "global_batch", "seq", "grad_accum", "microbatches", "fsdp", "tp", "ep", "dp", "cp",
      "pp", "vp", "pp_schedule", "first_stage_layers", "last_stage_layers", "embedding_as_layer", "loss_as_layer",
      "mesh_order", "sequence_parallel", "cp_exchange", "moe_batch_split", "mtp_layers", "pipeline_layout",
      "cp_shards_weights", "framework", "grad_reduce_dtype", "optimizer_moments_dtype", "optimizer", "muon_tp_mode", "optimizer_offload",
      "parameter_offload", "moe_dispatcher", "expert_tp", "moe_load_imbalance"};
  bool shape_fixed = model.has_value();
  for (auto f : shape) shape_fixed = shape_fixed && fixed(f);
  if (shape_fixed) {
    attributed(s, shape,
               [&] {
                 check_expert_tp(c, *model);
                 // Building the graph validates the shape (once: validate_training is not idempotent).
                 TrainingSpec t = training_shape(c);
                 if (tensors_fixed && !c.tensors.empty()) check_override_tensors(c.tensors, build_step_graph(*model, t));
                 else validate_training(t, *model);
                 return 0;
               });
  }
}

Sources load_config_file(const std::string& path, RunConfig& c) {
  Sources s;
  s.config_file = path;
  auto doc = parse_json_file(path);
  c = RunConfig::from_json(doc, path);
  for (auto& item : doc.items()) s.config_keys.insert(item.key());
  if (auto it = doc.find("tensors"); it != doc.end() && it->is_object())
    for (auto& item : it->items()) s.config_tensors.insert(item.key());
  return s;
}

}  // namespace

std::string flag_for_field(const std::string& field) {
  if (const RunField* f = find_run_field(field)) return std::string(f->flag);
  std::string flag = "--" + field;
  for (auto& ch : flag)
    if (ch == '_') ch = '-';
  return flag;
}

std::shared_ptr<RunFlags> make_run_flags(CLI::App* cmd) {
  auto f = std::make_shared<RunFlags>();
  cmd->add_option("--config", f->config_file, "Run configuration JSON; flags override its fields");
  for (const auto& field : run_fields()) {
    std::string name(field.name), help(field.help);
    if (auto d = field.default_text(); !d.empty()) help += " (default " + d + ")";
    RunFlags* raw = f.get();
    cmd->add_option_function<std::string>(
           std::string(field.flag), [raw, name](const std::string& v) { raw->values[name] = v; }, help)
        ->type_name(field.type() == "on/off" ? "on|off" : field.type() == "text" ? "TEXT" : field.type() == "integer" ? "INT" : "NUMBER");
  }
  std::string modules;
  for (const auto& n : module_tensor_names()) modules += (modules.empty() ? "" : ", ") + n;
  cmd->add_option("--tensor", f->tensors,
                  "Per checkpoint name: NAME=device|remat|offload (repeatable); under no_recompute and selective also "
                  "Megatron's module tensors " + modules + "; NAME@dense or NAME@moe: that kind of layer only");
  return f;
}

RunConfig resolve_run_flags(const RunFlags& f, const std::set<std::string>& varied) {
  RunConfig c;
  Sources s;
  if (!f.config_file.empty()) s = load_config_file(f.config_file, c);
  for (auto& [field, v] : f.values) {
    check_number_range(field, v);
    if (varied.count(field)) {  // read (a typo is still an error) but left out: the command sets the field itself
      RunConfig(c).set(field, v, flag_for_field(field));
      continue;
    }
    c.set(field, v, flag_for_field(field));
    s.flag_fields.insert(field);
  }
  for (auto& t : f.tensors) {
    auto eq = t.find('=');
    if (eq == std::string::npos || eq == 0) throw InputError("--tensor " + t + " (expected NAME=device|remat|offload)");
    if (!s.flag_tensors.insert(t.substr(0, eq)).second)
      throw InputError("--tensor " + t + " (" + t.substr(0, eq) + " is given twice; only the last placement would be read)");
    if (!varied.count("tensor." + t.substr(0, eq))) c.tensors[t.substr(0, eq)] = t.substr(eq + 1);
  }
  check_run_config(c, s, varied);
  // A flag typed for a field the command sets itself (a search's degrees, a sweep's axes) would be dropped without
  // a word; a config file's fields are not named (a saved run names them all).
  std::vector<std::string> unused;
  for (auto& [field, v] : f.values)
    if (varied.count(field)) unused.push_back(flag_for_field(field) + " " + v + " is not used: this command sets " + field + " itself");
  for (auto& t : f.tensors)
    if (auto eq = t.find('='); varied.count("tensor." + t.substr(0, eq)))
      unused.push_back("--tensor " + t + " is not used: this command sets tensor." + t.substr(0, eq) + " itself");
  print_warnings(unused);
  return c;
}

void check_run_config_file(const std::string& path) {
  RunConfig c;
  auto s = load_config_file(path, c);
  check_run_config(c, s, {});
}

}  // namespace hbmsim::cli
