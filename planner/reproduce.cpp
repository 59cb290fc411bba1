#include "planner/reproduce.hpp"

#include <cmath>

#include "hwmodels/builtin.hpp"
#include "hwmodels/json_view.hpp"

namespace hbmsim {

namespace {

nlohmann::json load_doc(const std::string& path, const std::string& builtin, std::string& origin) {
  if (!path.empty()) {
    origin = path;
    return parse_json_file(path);
  }
  origin = "builtin:" + builtin;
  auto text = builtin_file(builtin);
  if (!text) throw std::logic_error("missing built-in " + builtin);
  return parse_json_text(*text, origin);
}

const ReproRow* find(const std::vector<ReproRow>& rows, const std::string& id) {
  for (auto& r : rows)
    if (r.run.id == id) return &r;
  return nullptr;
}

}  // namespace

std::vector<ReferenceRun> load_reference_runs(const std::string& runs_path, const std::string& configs_path) {
  std::string runs_origin, cfg_origin;
  auto runs_doc = load_doc(runs_path, "reference/seed_runs.json", runs_origin);
  auto cfg_doc = load_doc(configs_path, "reference/seed_configs.json", cfg_origin);
  JsonView cfg(cfg_doc, cfg_origin);
  cfg.allow_only({"about", "runs", "unreported"});
  auto cfg_runs = cfg.at("runs");
  cfg_runs.expect_object();
  JsonView runs(runs_doc, runs_origin);
  runs.expect_object();
  std::vector<ReferenceRun> out;
  auto list = runs.at("runs");
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto r = list[i];
    ReferenceRun run;
    run.id = r.at("id").string();
    auto c = cfg_runs.find(run.id);
    if (!c) r.at("id").fail("has no configuration in " + cfg_origin + " runs");
    run.config = RunConfig::from_json(c->raw(), cfg_origin + ": runs." + run.id);
    auto rep = r.at("reported");
    rep.expect_object();
    if (auto x = rep.find("tflops_per_device"); x && !x->raw().is_null()) run.tflops_per_device = x->positive();
    if (auto x = rep.find("hbm_gib"); x && !x->raw().is_null()) run.hbm_gib = x->positive();
    if (auto x = rep.find("host_gib_total_qkv"); x && !x->raw().is_null()) run.host_gib = x->positive();
    if (auto x = rep.find("fits"); x && !x->raw().is_null()) run.fits = x->boolean();
    out.push_back(std::move(run));
  }
  return out;
}

RunConfig reference_config(const std::string& id) {
  for (auto& r : load_reference_runs())
    if (r.id == id) return r.config;
  throw InputError("reference run \"" + id + "\" (no such id in the built-in seed_runs.json)");
}

std::vector<ReproRow> reproduce(const std::vector<ReferenceRun>& runs, const std::string& calibration) {
  check_calibration(calibration, "calibration", true);
  std::vector<ReproRow> rows;
  for (const auto& run : runs) {
    ReproRow row{run, {}, {}, {}, {}, {}};
    if (!calibration.empty()) row.run.config.calibration = calibration;
    row.predicted = run_simulation(row.run.config);
    const auto& p = row.predicted;
    if (run.tflops_per_device) row.tflops_error = p.tflops_per_device / *run.tflops_per_device - 1;
    if (run.hbm_gib) row.hbm_error = p.hbm_peak_bytes / 1073741824.0 / *run.hbm_gib - 1;
    if (run.host_gib) row.host_error = p.host_peak_bytes / 1073741824.0 / *run.host_gib - 1;
    if (run.fits) row.fits_right = p.fits == *run.fits;
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<ClaimCheck> check_claims(const std::vector<ReproRow>& rows) {
  std::vector<ClaimCheck> out;
  auto tf = [&](const std::string& id, bool reported) -> std::optional<double> {
    auto r = find(rows, id);
    if (!r) return std::nullopt;
    if (reported) return r->run.tflops_per_device;
    return r->predicted.tflops_per_device;
  };
  // A speed-up claim: (a / b - 1) in percent, right when within 5 percentage points of the reported one.
  auto ratio = [&](const std::string& claim, const std::string& a, const std::string& b) {
    auto ra = tf(a, true), rb = tf(b, true), pa = tf(a, false), pb = tf(b, false);
    if (!ra || !rb || !pa || !pb) return;
    ClaimCheck c{claim, 100 * (*ra / *rb - 1), 100 * (*pa / *pb - 1), false, ""};
    c.holds = std::fabs(c.predicted - c.reported) <= 5.0 && (c.predicted > 0) == (c.reported > 0);
    c.detail = "within 5 percentage points, same sign";
    out.push_back(c);
  };
  ratio("dsv3: offload+LHS+pipelining vs remat (%)", "dsv3-offload-lhs-pipe-mbs8", "dsv3-remat-mbs8");
  ratio("dsv3: offload+LHS+pipelining vs offload without LHS or pipelining (%)", "dsv3-offload-lhs-pipe-mbs8", "dsv3-offload-mbs8");
  ratio("llama405b: QKV offload with LHS vs baseline (%)", "llama405b-qkv-offload-lhs", "llama405b-qkv-remat");
  ratio("llama405b: QKV offload without LHS vs baseline (%)", "llama405b-qkv-offload-nolhs", "llama405b-qkv-remat");
  ratio("llama405b: QKV offload with LHS and pipelining vs baseline (%)", "llama405b-qkv-offload-lhs-pipe", "llama405b-qkv-remat");
  // Orderings.
  auto order = [&](const std::string& claim, double reported_diff, double predicted_diff) {
    ClaimCheck c{claim, reported_diff > 0 ? 1.0 : 0.0, predicted_diff > 0 ? 1.0 : 0.0, (reported_diff > 0) == (predicted_diff > 0),
                 "ordering (1 = first is larger)"};
    out.push_back(c);
  };
  if (auto pipe = find(rows, "llama405b-qkv-offload-lhs-pipe"), lhs = find(rows, "llama405b-qkv-offload-lhs"); pipe && lhs)
    order("llama405b: pipelining does not help once LHS hides the copies (LHS-only faster)",
          *lhs->run.tflops_per_device - *pipe->run.tflops_per_device,
          lhs->predicted.tflops_per_device - pipe->predicted.tflops_per_device);
  if (auto a = find(rows, "dsv3-offload-lhs-pipe-mbs8"), b = find(rows, "dsv3-offload-mbs8"); a && b && a->run.hbm_gib && b->run.hbm_gib)
    order("dsv3: LHS+pipelining uses more HBM than offload without them", *a->run.hbm_gib - *b->run.hbm_gib,
          a->predicted.hbm_peak_bytes - b->predicted.hbm_peak_bytes);
  // Pipelining helps DeepSeek-V3: compare against the same offload with LHS alone (not measured, simulated).
  if (auto pipe = find(rows, "dsv3-offload-lhs-pipe-mbs8")) {
    auto text = builtin_file("reference/seed_configs.json");
    auto doc = parse_json_text(*text, "builtin:reference/seed_configs.json");
    RunConfig c = RunConfig::from_json(doc.at("unreported").at("dsv3-offload-lhs-mbs8"),
                                       "builtin:reference/seed_configs.json: unreported.dsv3-offload-lhs-mbs8");
    c.calibration = pipe->run.config.calibration;
    auto lhs_only = run_simulation(c);
    order("dsv3: pipelined transfers help (LHS+pipelining faster than LHS alone)", 1.0,
          pipe->predicted.tflops_per_device - lhs_only.tflops_per_device);
  }
  return out;
}

nlohmann::json repro_json(const std::vector<ReproRow>& rows, const std::vector<ClaimCheck>& claims) {
  auto arr = nlohmann::json::array();
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  for (auto& r : rows) {
    arr.push_back({{"id", r.run.id},
                   {"config", r.run.config.to_json()},
                   {"reported", {{"tflops_per_device", opt(r.run.tflops_per_device)}, {"hbm_gib", opt(r.run.hbm_gib)},
                                 {"host_gib", opt(r.run.host_gib)},
                                 {"fits", r.run.fits ? nlohmann::json(*r.run.fits) : nlohmann::json(nullptr)}}},
                   {"predicted", r.predicted.to_json()},
                   {"error", {{"tflops", opt(r.tflops_error)}, {"hbm", opt(r.hbm_error)}, {"host", opt(r.host_error)}}},
                   {"fits_right", r.fits_right ? nlohmann::json(*r.fits_right) : nlohmann::json(nullptr)}});
  }
  auto cl = nlohmann::json::array();
  for (auto& c : claims)
    cl.push_back({{"claim", c.claim}, {"reported", c.reported}, {"predicted", c.predicted}, {"holds", c.holds}, {"test", c.detail}});
  return {{"runs", arr}, {"claims", cl}};
}

}  // namespace hbmsim
