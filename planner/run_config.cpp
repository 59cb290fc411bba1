#include "planner/run_config.hpp"

#include <charconv>
#include <map>
#include <mutex>
#include <cmath>

#include "hwmodels/builtin.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"
#include "hwmodels/profile.hpp"

namespace hbmsim {

const std::vector<std::string>& RunConfig::fields() {
  static const std::vector<std::string> f = {
      "system", "model", "gpus", "batch", "seq", "grad_accum", "fsdp", "tp", "ep", "dp", "moe_batch_split",
      "weights", "attention_dtype", "policy", "lhs", "pipelined_transfers", "pipelined_collectives", "double_buffering",
      "memory_limit_slop", "host_link_bytes_per_s", "hbm_bytes", "calibration"};
  return f;
}

namespace {

std::int64_t parse_int(const std::string& v, const std::string& where) {
  std::int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec == std::errc::result_out_of_range) throw InputError(where + " = " + v + " (out of range)");
  if (ec != std::errc() || ptr != v.data() + v.size()) throw InputError(where + " = \"" + v + "\" (expected an integer)");
  return out;
}

double parse_double(const std::string& v, const std::string& where) {
  try {
    std::size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size()) throw std::invalid_argument("trailing");
    if (!std::isfinite(d)) throw InputError(where + " = " + v + " (must be finite)");
    return d;
  } catch (const InputError&) {
    throw;
  } catch (const std::out_of_range&) {
    throw InputError(where + " = " + v + " (out of the range of a double)");
  } catch (const std::exception&) {
    throw InputError(where + " = \"" + v + "\" (expected a number)");
  }
}

bool parse_bool(const std::string& v, const std::string& where) {
  if (v == "on" || v == "true" || v == "1" || v == "yes") return true;
  if (v == "off" || v == "false" || v == "0" || v == "no") return false;
  throw InputError(where + " = \"" + v + "\" (expected on or off)");
}

// Built-in profiles are parsed once per process: sweeps resolve one per point.
const Profile& builtin_profile(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, Profile> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto file = "profiles/" + name + ".json";
  auto text = builtin_file(file);
  return cache[name] = load_profile(parse_json_text(*text, "builtin:" + file), "builtin:" + file);
}

}  // namespace

void RunConfig::set(const std::string& field, const std::string& value, const std::string& where) {
  if (field == "system") system = value;
  else if (field == "model") model = value;
  else if (field == "gpus") gpus = parse_int(value, where);
  else if (field == "batch") batch = parse_int(value, where);
  else if (field == "seq") seq = parse_int(value, where);
  else if (field == "grad_accum") grad_accum = parse_int(value, where);
  else if (field == "fsdp") fsdp = parse_int(value, where);
  else if (field == "tp") tp = parse_int(value, where);
  else if (field == "ep") ep = parse_int(value, where);
  else if (field == "dp") dp = parse_int(value, where);
  else if (field == "moe_batch_split") moe_batch_split = parse_int(value, where);
  else if (field == "weights") weights = value;
  else if (field == "attention_dtype") attention_dtype = value;
  else if (field == "policy") policy = value;
  else if (field == "lhs") lhs = parse_bool(value, where);
  else if (field == "pipelined_transfers") pipelined_transfers = parse_bool(value, where);
  else if (field == "pipelined_collectives") pipelined_collectives = parse_bool(value, where);
  else if (field == "double_buffering") double_buffering = parse_bool(value, where);
  else if (field == "memory_limit_slop") memory_limit_slop = parse_double(value, where);
  else if (field == "host_link_bytes_per_s") host_link_bytes_per_s = parse_double(value, where);
  else if (field == "hbm_bytes") hbm_bytes = parse_double(value, where);
  else if (field == "calibration") calibration = value;
  else if (field.rfind("tensor.", 0) == 0 && field.size() > 7) tensors[field.substr(7)] = value;
  else {
    std::string list;
    for (auto& f : fields()) list += (list.empty() ? "" : ", ") + f;
    throw InputError(where + " (unknown field \"" + field + "\"; fields: " + list + ", tensor.NAME)");
  }
}

nlohmann::json RunConfig::to_json() const {
  nlohmann::json j = {{"system", system}, {"model", model}, {"gpus", gpus}, {"batch", batch}, {"seq", seq},
                      {"grad_accum", grad_accum}, {"fsdp", fsdp}, {"tp", tp}, {"ep", ep}, {"dp", dp},
                      {"moe_batch_split", moe_batch_split}, {"weights", weights}, {"attention_dtype", attention_dtype}, {"policy", policy},
                      {"tensors", tensors}, {"lhs", lhs}, {"pipelined_transfers", pipelined_transfers},
                      {"pipelined_collectives", pipelined_collectives}, {"double_buffering", double_buffering},
                      {"memory_limit_slop", memory_limit_slop}, {"calibration", calibration}};
  if (host_link_bytes_per_s) j["host_link_bytes_per_s"] = *host_link_bytes_per_s;
  if (hbm_bytes) j["hbm_bytes"] = *hbm_bytes;
  return j;
}

RunConfig RunConfig::from_json(const nlohmann::json& doc, const std::string& origin) {
  JsonView v(doc, origin);
  v.allow_only({"system", "model", "gpus", "batch", "seq", "grad_accum", "fsdp", "tp", "ep", "dp", "moe_batch_split", "weights",
                "attention_dtype", "policy", "tensors", "lhs", "pipelined_transfers", "pipelined_collectives", "double_buffering",
                "memory_limit_slop", "host_link_bytes_per_s", "hbm_bytes", "calibration", "about"});
  RunConfig c;
  if (auto x = v.find("system")) c.system = x->string();
  if (auto x = v.find("model")) c.model = x->string();
  for (auto [key, field] : {std::pair{"gpus", &c.gpus}, {"batch", &c.batch}, {"seq", &c.seq},
                            {"grad_accum", &c.grad_accum}, {"tp", &c.tp}, {"ep", &c.ep}, {"dp", &c.dp},
                            {"moe_batch_split", &c.moe_batch_split}})
    if (auto x = v.find(key)) *field = x->positive_integer();
  if (auto x = v.find("fsdp")) {
    c.fsdp = x->integer();
    if (c.fsdp < 0) x->fail("must be >= 0 (0: the GPUs left over)");
  }
  if (auto x = v.find("weights")) c.weights = x->string();
  if (auto x = v.find("attention_dtype")) c.attention_dtype = x->string();
  if (auto x = v.find("policy")) c.policy = x->string();
  if (auto x = v.find("tensors")) {
    x->expect_object();
    for (auto& item : x->raw().items()) {
      auto t = x->at(item.key());
      auto value = t.string();
      if (!is_checkpoint_name(item.key())) t.fail("unknown checkpoint name");
      if (value != "device" && value != "remat" && value != "offload") t.fail("expected device, remat or offload");
      c.tensors[item.key()] = value;
    }
  }
  if (auto x = v.find("lhs")) c.lhs = x->boolean();
  if (auto x = v.find("pipelined_transfers")) c.pipelined_transfers = x->boolean();
  if (auto x = v.find("pipelined_collectives")) c.pipelined_collectives = x->boolean();
  if (auto x = v.find("double_buffering")) c.double_buffering = x->boolean();
  if (auto x = v.find("memory_limit_slop")) c.memory_limit_slop = x->fraction();
  if (auto x = v.find("host_link_bytes_per_s")) c.host_link_bytes_per_s = x->positive();
  if (auto x = v.find("hbm_bytes")) c.hbm_bytes = x->positive();
  if (auto x = v.find("calibration")) c.calibration = x->string();
  return c;
}

RunConfig RunConfig::from_file(const std::string& path) { return from_json(parse_json_file(path), path); }

std::optional<std::string> what_if_problem(const std::string& field, double v) {
  const bool bandwidth = field == "host_link_bytes_per_s";
  if (!bandwidth && field != "hbm_bytes") throw std::logic_error("what_if_problem: not a what-if field: " + field);
  if (!(v > 0) || !std::isfinite(v)) return "must be > 0";
  const double max = bandwidth ? kMaxHardwareBytesPerSecond : kMaxHardwareBytes;
  if (v > max) return "implausibly large, max " + format_number(max) + (bandwidth ? " bytes/s" : " bytes");
  return std::nullopt;
}

System resolve_run_system(const RunConfig& c, const Profile* extra) {
  System sys = resolve_system(c.system);
  if (!c.calibration.empty()) {
    auto name = "profiles/" + c.calibration + ".json";
    if (builtin_file(name))
      sys = apply_profile(sys, builtin_profile(c.calibration));
    else
      sys = apply_profile(sys, load_profile_file(c.calibration));
  }
  if (extra) sys = apply_profile(sys, *extra);
  auto what_if = [](const char* field, double v) {
    if (auto why = what_if_problem(field, v)) throw InputError(std::string(field) + " = " + format_number(v) + " (" + *why + ")");
    return v;
  };
  if (c.host_link_bytes_per_s) {
    const double bw = what_if("host_link_bytes_per_s", *c.host_link_bytes_per_s);
    sys.host_link.measured_h2d_bytes_per_s = bw;
    sys.host_link.measured_d2h_bytes_per_s = bw;
  }
  if (c.hbm_bytes) sys.gpu.hbm_bytes = what_if("hbm_bytes", *c.hbm_bytes);
  if (!(c.memory_limit_slop > 0 && c.memory_limit_slop <= 1))
    throw InputError("memory_limit_slop = " + format_number(c.memory_limit_slop) + " (must be in (0, 1])");
  return sys;
}

TrainingSpec training_shape(const RunConfig& c) {
  TrainingSpec t;
  t.gpus = c.gpus;
  t.per_device_batch = c.batch;
  t.seq_len = c.seq;
  t.grad_accum = c.grad_accum;
  t.moe_batch_split = c.moe_batch_split;
  t.parallelism = Parallelism{c.fsdp, c.tp, c.ep, c.dp};
  return t;
}

PreparedRun prepare_run(const RunConfig& c, const Profile* extra) {
  System sys = resolve_run_system(c, extra);
  ModelSpec model = resolve_model(c.model);
  TrainingSpec t = training_shape(c);
  // The field named in the message: these come from sweep axes and Python as well as from flags.
  auto dtype = [](const std::string& value, const char* field) {
    try {
      return parse_dtype(value);
    } catch (const InputError& e) {
      throw InputError(std::string(field) + ": " + e.what());
    }
  };
  t.mlp_gemm_dtype = dtype(c.weights, "weights");
  t.attention_gemm_dtype = dtype(c.attention_dtype, "attention_dtype");
  if (t.mlp_gemm_dtype == Dtype::fp32) throw InputError("weights = fp32 (expected bf16, fp8 or nvfp4)");
  PreparedRun r{sys, build_step_graph(model, t), make_policy(c.policy, c.tensors), SimOptions{}};
  r.options.lhs = c.lhs;
  r.options.pipelined_transfers = c.pipelined_transfers;
  r.options.pipelined_collectives = c.pipelined_collectives;
  r.options.double_buffering = c.double_buffering;
  r.options.memory_limit_slop = c.memory_limit_slop;
  return r;
}

StepReport run_simulation(const RunConfig& c, bool trace, const Profile* extra) {
  auto r = prepare_run(c, extra);
  r.options.record_trace = trace;
  return simulate(r.graph, r.system, r.policy, r.options);
}

}  // namespace hbmsim
