// _hbmsim: the C++ simulator for Python. Thin: every function takes and returns plain Python data (dicts,
// lists, str, numbers) in the JSON shapes the CLI prints; the package `hbmsim` (python/hbmsim) builds the
// friendly API on top. The GIL is released while C++ runs. hbmsim::InputError (bad input, a
// std::invalid_argument) arrives in Python as ValueError with the same message.
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "hwmodels/builtin.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"
#include "hwmodels/profile.hpp"
#include "planner/run_config.hpp"
#include "planner/plan.hpp"
#include "planner/plan_json.hpp"
#include "planner/run_fields.hpp"
#include "planner/run_summary.hpp"
#include "planner/sweep.hpp"
#include "workloads/model.hpp"
#include "workloads/step_graph.hpp"
#include "planner/reproduce.hpp"
#include "planner/validation_report.hpp"

namespace py = pybind11;
using nlohmann::json;

namespace {

// ---- JSON <-> Python (call with the GIL held) ----

// Built with the CPython API rather than pybind11's accessors: a simulate result is about 300 objects, and
// converting them cost a fifth of a simulate call from Python.
PyObject* new_py(const json& j) {
  switch (j.type()) {
    case json::value_t::null: Py_RETURN_NONE;
    case json::value_t::boolean: return PyBool_FromLong(j.get<bool>());
    case json::value_t::number_integer: return PyLong_FromLongLong(j.get<std::int64_t>());
    case json::value_t::number_unsigned: return PyLong_FromUnsignedLongLong(j.get<std::uint64_t>());
    case json::value_t::number_float: return PyFloat_FromDouble(j.get<double>());
    case json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
    }
    case json::value_t::array: {
      PyObject* out = PyList_New(static_cast<Py_ssize_t>(j.size()));
      if (!out) return nullptr;
      Py_ssize_t i = 0;
      for (const auto& v : j) {
        PyObject* item = new_py(v);
        if (!item) {
          Py_DECREF(out);
          return nullptr;
        }
        PyList_SET_ITEM(out, i++, item);  // steals the reference
      }
      return out;
    }
    case json::value_t::object: {
      PyObject* out = PyDict_New();
      if (!out) return nullptr;
      for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string& k = it.key();
        PyObject* key = PyUnicode_FromStringAndSize(k.data(), static_cast<Py_ssize_t>(k.size()));
        PyObject* value = key ? new_py(it.value()) : nullptr;
        const bool ok = value && PyDict_SetItem(out, key, value) == 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (!ok) {
          Py_DECREF(out);
          return nullptr;
        }
      }
      return out;
    }
    default: PyErr_SetString(PyExc_TypeError, "_hbmsim: unexpected JSON value type"); return nullptr;
  }
}

py::object to_py(const json& j) {
  PyObject* o = new_py(j);
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

json from_py(const py::handle& o, const std::string& path) {
  if (o.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(o)) return o.cast<bool>();
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  if (py::isinstance<py::dict>(o)) {
    json out = json::object();
    for (auto item : o.cast<py::dict>()) {
      if (!py::isinstance<py::str>(item.first))
        throw py::type_error(path + ": keys must be str, got " + py::repr(item.first).cast<std::string>());
      auto key = item.first.cast<std::string>();
      out[key] = from_py(item.second, path.empty() ? key : path + "." + key);
    }
    return out;
  }
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    json out = json::array();
    std::size_t i = 0;
    for (auto v : o) out.push_back(from_py(v, path + "[" + std::to_string(i++) + "]"));
    return out;
  }
  // JSON has no NaN or infinity (nlohmann would write null): named here, as the CLI names --batch = nan.
  auto finite = [&](double v) -> json {
    if (!std::isfinite(v))
      throw py::value_error((path.empty() ? std::string("value") : path) + " = " + py::repr(o).cast<std::string>() + " (must be finite)");
    return v;
  };
  if (py::isinstance<py::float_>(o)) return finite(o.cast<double>());
  if (py::hasattr(o, "dtype") && py::str(py::getattr(o.attr("dtype"), "kind", py::str(""))).cast<std::string>() == "b")
    return py::bool_(py::reinterpret_borrow<py::object>(o)).cast<bool>();  // numpy.bool_
  if (py::hasattr(o, "__index__")) {  // int, numpy integers
    py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(o.ptr()));
    if (!i) throw py::error_already_set();
    try {
      if (py::int_(0) <= i) return i.cast<std::uint64_t>();
      return i.cast<std::int64_t>();
    } catch (const py::cast_error&) {
      throw py::value_error((path.empty() ? std::string("value") : path) + " = " + py::repr(o).cast<std::string>() +
                            " (out of the 64-bit integer range)");
    }
  }
  if (py::hasattr(o, "__float__")) return finite(py::float_(o.attr("__float__")()).cast<double>());  // numpy floats
  throw py::type_error((path.empty() ? std::string("value") : path) + ": cannot be expressed in JSON (" +
                       py::repr(o).cast<std::string>() + ")");
}

// ---- Inputs ----

hbmsim::RunConfig config_from_py(const py::handle& config, const std::string& origin) {
  json doc = config.is_none() ? json::object() : from_py(config, "");
  return hbmsim::RunConfig::from_json(doc, origin);
}

std::vector<hbmsim::SweepAxis> axes_from_py(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes) {
  std::vector<hbmsim::SweepAxis> out;
  for (const auto& [field, values] : axes) out.push_back(hbmsim::SweepAxis{field, values});
  return out;
}

// ---- Functions ----

py::list systems() {
  json arr = json::array();
  {
    py::gil_scoped_release nogil;
    for (const auto& id : hbmsim::builtin_system_ids()) arr.push_back(hbmsim::builtin_system(id).summary_json());
  }
  return to_py(arr);
}

py::dict system_info(const std::string& name, const std::string& calibration) {
  json j;
  {
    py::gil_scoped_release nogil;
    hbmsim::RunConfig c;  // the system exactly as a run sees it (built-in or file, profile applied)
    c.system = name;
    c.calibration = calibration;
    j = hbmsim::resolve_run_system(c).summary_json();
  }
  return to_py(j);
}

py::list models() {
  json arr = json::array();
  {
    py::gil_scoped_release nogil;
    for (const auto& name : hbmsim::shipped_model_names()) arr.push_back(hbmsim::model_summary(name));
  }
  return to_py(arr);
}

py::dict simulate(const py::object& config, bool trace, const std::string& origin) {
  auto c = config_from_py(config, origin);
  json j;
  {
    py::gil_scoped_release nogil;
    auto res = hbmsim::simulate_resolved(c, trace);
    auto& report = res.report;
    j = res.to_json();
    if (trace) {
      // With pipeline stages, the timeline of the stage whose HBM peak is the report's.
      std::size_t stage = 0;
      for (std::size_t s = 0; s < report.stages.size(); ++s)
        if (report.stages[s].hbm_peak_bytes > report.stages[stage].hbm_peak_bytes) stage = s;
      j["timeline_stage"] = stage;
      json timeline = json::array();
      json by_category = json::array();
      for (const auto& m : report.timeline) {
        if (static_cast<std::size_t>(m.device) != stage) continue;
        timeline.push_back({m.time_s, m.hbm_bytes, m.host_bytes});
        by_category.push_back(m.hbm_by_category);
      }
      j["timeline"] = std::move(timeline);
      json names = json::array();
      for (int c = 0; c < hbmsim::sim::kMemCategories; ++c)
        names.push_back(hbmsim::sim::to_string(static_cast<hbmsim::sim::MemCategory>(c)));
      j["timeline_categories"] = std::move(names);
      j["timeline_hbm_by_category"] = std::move(by_category);
      j["trace"] = json::parse(report.trace);
    }
  }
  return to_py(j);
}

py::list expand_sweep(const py::object& base,
                      const std::vector<std::pair<std::string, std::vector<std::string>>>& axes,
                      const std::string& where) {
  auto b = config_from_py(base, "base");
  auto parsed = axes_from_py(axes);
  json arr = json::array();
  {
    py::gil_scoped_release nogil;
    for (const auto& p : hbmsim::expand_sweep(b, parsed, where))
      arr.push_back({{"index", p.index}, {"values", p.values}, {"config", p.config.to_json()}});
  }
  return to_py(arr);
}

py::list sweep(const py::object& base, const std::vector<std::pair<std::string, std::vector<std::string>>>& axes,
               const std::string& where, int jobs, const std::optional<std::vector<std::size_t>>& indices) {
  auto b = config_from_py(base, "base");
  auto parsed = axes_from_py(axes);
  json arr = json::array();
  {
    py::gil_scoped_release nogil;
    auto points = hbmsim::expand_sweep(b, parsed, where);
    std::set<std::size_t> skip;
    if (indices) {
      std::set<std::size_t> keep(indices->begin(), indices->end());
      for (const auto& p : points)
        if (!keep.count(p.index)) skip.insert(p.index);
    }
    hbmsim::run_sweep(points, jobs, [&](const hbmsim::SweepRow& row) { arr.push_back(hbmsim::sweep_row_json(parsed, row)); },
                      skip);
  }
  return to_py(arr);
}

py::dict reproduce(const std::string& calibration, const std::string& runs_path, const std::string& configs_path) {
  json j;
  {
    py::gil_scoped_release nogil;
    auto rows = hbmsim::reproduce(hbmsim::load_reference_runs(runs_path, configs_path), calibration);
    j = hbmsim::repro_json(rows, hbmsim::check_claims(rows));
  }
  return to_py(j);
}

// ---- Plans (the same answers as `hbmsim plan ... --json`) ----

py::list plan_largest_batch(const py::object& config, const std::vector<std::string>& variants, std::int64_t max_batch,
                            bool powers_of_two) {
  auto base = config_from_py(config, "config");
  json arr = json::array();
  {
    py::gil_scoped_release nogil;
    std::vector<std::pair<std::string, hbmsim::RunConfig>> vs;
    for (const auto& v : variants) vs.push_back(hbmsim::parse_variant(base, v));
    if (vs.empty()) vs = hbmsim::default_variants(base);
    for (const auto& [label, c] : vs) arr.push_back(hbmsim::largest_batch_json(label, hbmsim::largest_batch(c, max_batch, powers_of_two)));
  }
  return to_py(arr);
}

py::dict plan_best_policy(const py::object& config, const std::vector<std::string>& names, int jobs) {
  auto base = config_from_py(config, "config");
  json j;
  {
    py::gil_scoped_release nogil;
    hbmsim::check_jobs(jobs, "jobs");
    j = hbmsim::policy_search_json(hbmsim::best_policy(base, names.empty() ? hbmsim::default_search_names(base) : names, jobs));
  }
  return to_py(j);
}

py::dict plan_break_even(const py::object& config, double tolerance) {
  auto c = config_from_py(config, "config");
  if (!(tolerance >= 0 && tolerance < 1))
    throw hbmsim::InputError("tolerance = " + hbmsim::format_number(tolerance) + " (must be in [0, 1))");
  json j;
  {
    py::gil_scoped_release nogil;
    j = hbmsim::break_even_json(hbmsim::break_even_bandwidth(c, tolerance), tolerance);
  }
  return to_py(j);
}

hbmsim::LayoutSearchOptions layout_options(std::int64_t top, const std::vector<std::string>& policies,
                                           const std::vector<std::int64_t>& micro_batches, int jobs,
                                           const std::map<std::string, std::vector<std::int64_t>>& held = {}) {
  hbmsim::LayoutSearchOptions o;
  o.top = top;
  o.jobs = jobs;
  o.held = held;
  if (!policies.empty()) o.policies = policies;
  if (!micro_batches.empty()) o.micro_batches = micro_batches;
  hbmsim::check_layout_options(o, {"top", "jobs", "policies", "micro_batches"});
  return o;
}

py::dict plan_layout(const py::object& config, std::int64_t top, const std::vector<std::string>& policies,
                     const std::vector<std::int64_t>& micro_batches, bool prune, int jobs, bool state_offload,
                     const std::map<std::string, std::vector<std::int64_t>>& held) {
  auto base = config_from_py(config, "config");
  hbmsim::LayoutSearchOptions o = layout_options(top, policies, micro_batches, jobs, held);
  o.prune = prune;
  o.state_offload = state_offload;
  for (const auto& p : o.policies) (void)hbmsim::make_policy(p);
  json j;
  {
    py::gil_scoped_release nogil;
    j = hbmsim::layout_search_json(hbmsim::search_layouts(base, o));
  }
  return to_py(j);
}

py::dict plan_scale(const py::object& config, const std::vector<std::int64_t>& gpu_counts, double tokens, double days,
                    const std::vector<std::string>& policies, const std::vector<std::int64_t>& micro_batches, bool prune, int jobs,
                    bool state_offload, const std::map<std::string, std::vector<std::int64_t>>& held) {
  auto base = config_from_py(config, "config");
  hbmsim::ScalePlanOptions o;
  o.gpu_counts = gpu_counts.empty() ? std::vector<std::int64_t>{base.gpus} : gpu_counts;
  o.tokens = tokens;
  o.days = days;
  o.search = layout_options(1, policies, micro_batches, jobs, held);
  o.search.prune = prune;
  o.search.state_offload = state_offload;
  for (const auto& p : o.search.policies) (void)hbmsim::make_policy(p);
  json j;
  {
    py::gil_scoped_release nogil;
    j = hbmsim::scale_plan_json(hbmsim::plan_scale(base, o));
  }
  return to_py(j);
}

py::dict plan_layer_count(const py::object& config, hbmsim::LayerCount what) {
  auto c = config_from_py(config, "config");
  json j;
  {
    py::gil_scoped_release nogil;
    j = hbmsim::layer_count_json(hbmsim::fewest_layers(c, what));
  }
  return to_py(j);
}

py::dict plan_hbm_needed(const py::object& config) {
  auto c = config_from_py(config, "config");
  json j;
  {
    py::gil_scoped_release nogil;
    j = hbmsim::hbm_needed_json(hbmsim::hbm_needed(c));
  }
  return to_py(j);
}

py::dict validate(const std::string& calibration, const std::string& runs_path, int jobs, const std::string& rows_wanted) {
  json j;
  {
    py::gil_scoped_release nogil;
    auto rows = hbmsim::validate_runs(hbmsim::select_rows(hbmsim::load_published_runs(runs_path), rows_wanted), calibration, jobs);
    j = hbmsim::validation_json(rows, hbmsim::summarize_validation(rows), calibration, hbmsim::published_runs_origin(runs_path));
  }
  return to_py(j);
}

py::dict profile(const py::object& doc, const std::string& origin) {
  json d = from_py(doc, "");
  json j;
  {
    py::gil_scoped_release nogil;
    j = hbmsim::load_profile(d, origin).to_json();
  }
  return to_py(j);
}

py::object data_file(const std::string& name) {
  auto text = hbmsim::builtin_file(name);
  if (!text) return py::none();
  return py::str(text->data(), text->size());
}

}  // namespace

PYBIND11_MODULE(_hbmsim, m) {
  m.doc() = "hbmsim C++ core: LLM training-step memory and time simulator (see the hbmsim package for the API)";
  m.attr("__version__") = HBMSIM_VERSION;

  m.def("systems", &systems, "Built-in systems as a list of dicts (System::summary_json, as `hbmsim systems --json`).");
  m.def("system", &system_info, py::arg("name"), py::arg("calibration") = "",
        "One system (built-in id or system JSON path) as a run sees it, with calibration profile `calibration`\n"
        "(file or built-in profile name; \"\" = datasheet figures) applied. Returns System::summary_json.");
  m.def("models", &models,
        "Built-in models as a list of dicts (ModelSpec::to_json plus total_params and activated_params,\n"
        "as `hbmsim models --json`).");
  m.def("fields", &hbmsim::RunConfig::fields, "RunConfig field names a sweep axis accepts (plus tensor.NAME).");
  m.def("field_table", [] { return to_py(hbmsim::run_fields_json()); },
        "Every run field as a list of dicts {name, flag, type, default, help} (as `hbmsim fields --json`).");
  m.def("checkpoint_names", &hbmsim::checkpoint_names, "Checkpoint (tensor) names a policy can place.");
  m.def("simulate", &simulate, py::arg("config"), py::arg("trace") = false, py::arg("origin") = "config",
        "Simulates one training step.\n\n"
        "config: dict with RunConfig JSON keys (as `simulate --config FILE`); None = all defaults.\n"
        "trace: also return \"timeline\" (list of [t_s, hbm_bytes, host_bytes]), \"timeline_hbm_by_category\" (per sample,\n"
        "HBM bytes per category named in \"timeline_categories\"), \"peak_buffers\" (per stage, the buffers live at its HBM\n"
        "peak: made_by, category, bytes, alloc_s, free_s) and \"trace\" (Chrome trace).\n"
        "origin: the name error messages give the config.\n"
        "Returns StepReport::to_json() plus \"config\" (the resolved RunConfig), as `simulate --json`.\n"
        "Raises ValueError on bad input, naming the JSON path and value.");
  m.def("expand_sweep", &expand_sweep, py::arg("base"), py::arg("axes"), py::arg("where") = "",
        "The points of a sweep: list of {index, values (str per axis), config (RunConfig JSON)}.\n\n"
        "base: RunConfig dict; axes: list of (field, [value text, ...]) (a RunConfig field or tensor.NAME);\n"
        "where: FIELD==V, FIELD!=V, FIELD<=N, ... (comma-separated) over axis fields.");
  m.def("sweep", &sweep, py::arg("base"), py::arg("axes"), py::arg("where") = "", py::arg("jobs") = 1,
        py::arg("indices") = py::none(),
        "Runs a sweep on `jobs` C++ threads. Returns rows in completion order, each as `sweep --format jsonl`:\n"
        "{index, <axis field>: value text, ..., result: simulate dict} or {..., error: message} for a point\n"
        "that is bad input. indices: run only the points with these indices (None = all).");
  m.def("reproduce", &reproduce, py::arg("calibration") = "", py::arg("runs_path") = "", py::arg("configs_path") = "",
        "The measured reference runs next to hbmsim's predictions and the checked claims (as\n"
        "`hbmsim reproduce --json`). calibration: profile file or built-in name (\"\" = datasheet figures).");
  m.def("plan_largest_batch", &plan_largest_batch, py::arg("config"), py::arg("variants") = std::vector<std::string>{},
        py::arg("max_batch") = 1024, py::arg("powers_of_two") = false,
        "Largest batch that fits, per variant (\"LABEL=field:value;...\"; none: the default variants), as\n"
        "`plan largest-batch --json`: list of {variant, field, largest_batch, micro_batch, stopped, report, settings}.");
  m.def("plan_best_policy", &plan_best_policy, py::arg("config"), py::arg("names") = std::vector<std::string>{},
        py::arg("jobs") = 1, "Best device/remat/offload placement of `names`, as `plan best-policy --json`.");
  m.def("plan_break_even", &plan_break_even, py::arg("config"), py::arg("tolerance") = 0.01,
        "Lowest host-link bandwidth at which the offload policy is within `tolerance` of the best alternative\n"
        "that fits, as `plan break-even --json`.");
  m.def("layout_defaults", [](const py::object& config) {
    const hbmsim::LayoutSearchOptions o;
    return to_py(json{{"policies", hbmsim::default_layout_policies(config_from_py(config, "config"))}, {"micro_batches", o.micro_batches}});
  }, py::arg("config"), "The policies (they follow the config's framework) and micro-batches plan_layout searches by default.");
  m.def("check_layout_options", [](const py::object& config, std::int64_t top, const std::vector<std::string>& policies,
                                   const std::vector<std::int64_t>& micro_batches, int jobs,
                                   const std::map<std::string, std::vector<std::int64_t>>& held) {
          const auto o = layout_options(top, policies, micro_batches, jobs, held);
          hbmsim::check_held_layout(config_from_py(config, "config"), o);
        },
        py::arg("config"), py::arg("top"), py::arg("policies"), py::arg("micro_batches"), py::arg("jobs"), py::arg("held") = std::map<std::string, std::vector<std::int64_t>>{},
        "Refuses plan_layout options no search can use (top 0, jobs < 1, a micro-batch < 1, a policy or micro-batch given twice, "
        "held values that no layout of the config's GPUs can have).");
  m.def("layout_holdable_fields", &hbmsim::holdable_layout_fields, "The fields plan_layout holds when given as keywords.");
  m.def("plan_layout", &plan_layout, py::arg("config"), py::arg("top") = 10, py::arg("policies") = std::vector<std::string>{},
        py::arg("micro_batches") = std::vector<std::int64_t>{}, py::arg("prune") = true, py::arg("jobs") = 1, py::arg("state_offload") = true,
        py::arg("held") = std::map<std::string, std::vector<std::int64_t>>{},
        "Fastest parallel layout, micro-batch and policy at the config's global batch, as `plan layout --json`; `held`: field -> the "
        "values the search tries instead of its own (sharded_optimizer: 0 or 1).");
  m.def("plan_scale", &plan_scale, py::arg("config"), py::arg("gpu_counts"), py::arg("tokens") = 0.0, py::arg("days") = 0.0,
        py::arg("policies") = std::vector<std::string>{}, py::arg("micro_batches") = std::vector<std::int64_t>{}, py::arg("prune") = true,
        py::arg("jobs") = 1, py::arg("state_offload") = true, py::arg("held") = std::map<std::string, std::vector<std::int64_t>>{},
        "The fastest layout at each GPU count at one global batch (the config's, else one sequence per GPU at the largest count), "
        "with the days and GPU-hours `tokens` take, as `plan scale --json`.");
  m.def("plan_offload_layers", [](const py::object& c) { return plan_layer_count(c, hbmsim::LayerCount::offload); }, py::arg("config"),
        "Fewest layers offloaded (Megatron cpu_offloading_num_layers) for the config to fit, as `plan offload-layers --json`.");
  m.def("plan_recompute_layers", [](const py::object& c) { return plan_layer_count(c, hbmsim::LayerCount::recompute); }, py::arg("config"),
        "Fewest layers per chunk recomputed in full for the config to fit, as `plan recompute-layers --json`.");
  m.def("plan_hbm_needed", &plan_hbm_needed, py::arg("config"), "HBM and pinned host memory a config needs, as `plan hbm-needed --json`.");
  m.def("validate", &validate, py::arg("calibration") = "", py::arg("runs_path") = "", py::arg("jobs") = 2, py::arg("rows") = "",
        "The published measured runs (data/reference/published_runs.csv or runs_path; rows: only those data rows, e.g. "
        "\"46,48-50\"), measured vs predicted tokens/s per GPU, as `hbmsim validate --json [--rows]`.");
  m.def("profile", &profile, py::arg("doc"), py::arg("origin") = "profile",
        "Validates a calibration profile document (dict) and returns it normalised (Profile::to_json).");
  m.def("data_files", &hbmsim::builtin_files, py::arg("prefix") = "",
        "Names of the data files compiled into hbmsim under `prefix` (e.g. \"profiles/\"), sorted.");
  m.def("data_file", &data_file, py::arg("name"),
        "Text of a built-in data file (e.g. \"systems/gb200-nvl72.json\"), or None.");
}
