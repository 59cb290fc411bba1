// hbmsim_stress: many more seeded random configurations than the suite draws. Each is simulated with the
// fast-forward, with every event, and (every fifth) with a recorded timeline, and the three are compared
// within 1e-9; every seventh is run again on a fresh thread (no per-thread program, scratch or placement
// cache left by the draws before it) and must come out identical; the physics laws of DESIGN.md and the
// report's own sums are checked on each. The suite's 160
// draws missed a fast-forward bug that seed 404 hits at draws 5,511 and 9,255 (3c576e4), so run this where a change
// touches the engine or the builder:
//   build/tests/hbmsim_stress --seed 1 --count 5000 [--pipelines] [--squeeze] [--rare] [--from N]
// Prints each finding with its configuration JSON (for `hbmsim simulate --config`; a comparison with better
// hardware or twice the work also names the fields that run changes) and exits 1 if any.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "hwmodels/json_view.hpp"
#include "planner/layout_search.hpp"
#include "planner/run_summary.hpp"
#include "workloads/model.hpp"
#include "better_hardware.hpp"
#include "random_configs.hpp"

using namespace hbmsim;

namespace {

// Every third draw a pipeline (with `pipelines`, every one), every other one with a memory lever or
// Megatron's settings on top.
RunConfig draw(std::mt19937& rng, int k, bool pipelines, bool rare) {
  RunConfig c = pipelines || k % 3 == 0 ? test::random_pipeline(rng) : test::random_config(rng);
  if (k % 2 == 1) test::add_levers(rng, c);
  if (rare) test::add_rare_fields(rng, c);
  return c;
}

// A pipeline's stages multiply the GPUs its layout needs, so most pipelined draws asked for more than they drew:
// the GPUs are doubled (up to 8x) while that is what prepare_run refuses.
void grow_gpus(RunConfig& c) {
  if (c.pp <= 1) return;
  for (int doublings = 0; doublings < 3; ++doublings) {
    try {
      prepare_run(c);
      return;
    } catch (const InputError& e) {
      if (std::string_view(e.what()).substr(0, 7) != "gpus = ") return;
    }
    c.gpus *= 2;
  }
}

// Counts and wall times are not results: the fast-forward simulates fewer events by design.
bool bookkeeping(const std::string& path) {
  for (const char* k : {"events", "replayed", "wall"})
    if (path.find(k) != std::string::npos) return true;
  return false;
}

// Where two result documents differ: numbers by more than `tol` relative, anything else at all.
void differences(const nlohmann::json& a, const nlohmann::json& b, const std::string& path, std::vector<std::string>& out,
                 double tol = 1e-9) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    if (!bookkeeping(path) && !(std::abs(x - y) <= tol * std::max({1.0, std::abs(x), std::abs(y)})))
      out.push_back(path + ": " + a.dump() + " against " + b.dump());
  } else if (a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it)
      differences(it.value(), b.contains(it.key()) ? b[it.key()] : nlohmann::json(), path + "/" + it.key(), out, tol);
  } else if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (std::size_t i = 0; i < a.size(); ++i) differences(a[i], b[i], path + "/" + std::to_string(i), out, tol);
  } else if (a != b) {
    out.push_back(path + ": " + a.dump().substr(0, 80) + " against " + b.dump().substr(0, 80));
  }
}

nlohmann::json results(const StepReport& r) {
  nlohmann::json j = r.to_json();
  j.erase("trace");
  j.erase("timeline");
  j.erase("peak_buffers");  // only a recorded run lists them (checked by peak_lists_add_up)
  return j;
}

// A recorded run's buffers at each stage's peak add up to that peak.
void peak_lists_add_up(const StepReport& r, std::vector<std::string>& out) {
  for (const StageReport& st : r.stages) {
    double sum = 0;
    for (const PeakBuffer& b : st.peak_buffers) sum += b.bytes;
    if (!(std::abs(sum - st.hbm_peak_bytes) <= 1e-9 * std::max(1.0, st.hbm_peak_bytes)))
      out.push_back("stage " + std::to_string(st.stage) + "'s buffers at its peak add up to " + std::to_string(sum) + ", not " +
                    std::to_string(st.hbm_peak_bytes));
  }
}

// The report agrees with itself, stage by stage: the breakdown sums to the peak, inside the step; no queue
// busier than the step; the waits blamed on queues, and the bubble, within the compute stream's idle time.
void consistent(const StepReport& r, std::vector<std::string>& out) {
  const double step = r.step_time_s, tol = 1e-9 * std::max(1.0, step);
  auto sum = [](const std::map<std::string, double>& m) {
    double s = 0;
    for (const auto& [k, v] : m) s += v;
    return s;
  };
  for (const StageReport& st : r.stages) {
    const std::string at = "stage " + std::to_string(st.stage) + ": ";
    const double parts = sum(st.hbm_breakdown_bytes);
    if (!(std::abs(parts - st.hbm_peak_bytes) <= 1e-9 * std::max(1.0, st.hbm_peak_bytes)))
      out.push_back(at + "HBM breakdown sums to " + std::to_string(parts) + " against a peak of " + std::to_string(st.hbm_peak_bytes));
    if (!(st.hbm_peak_time_s >= 0 && st.hbm_peak_time_s <= step + tol)) out.push_back(at + "HBM peak outside the step");
    for (const auto& [q, busy] : st.busy_s)
      if (!(busy >= 0 && busy <= step + tol)) out.push_back(at + q + " busy " + std::to_string(busy) + " s in a " + std::to_string(step) + " s step");
    if (!(st.idle_s >= -tol && std::abs(st.idle_s + st.compute_busy_s - step) <= tol)) out.push_back(at + "idle + busy is not the step");
    if (!(std::abs(sum(st.compute_s) - st.compute_busy_s) <= tol)) out.push_back(at + "compute by phase does not add up to the compute time");
    for (const auto& [phase, s] : st.compute_s)
      if (!(s >= 0)) out.push_back(at + phase + " compute " + std::to_string(s) + " s");
    if (!(sum(st.exposed_s) <= st.idle_s + tol)) out.push_back(at + "waits blamed on queues exceed the idle time");
    if (!(st.bubble_s >= -tol && st.bubble_s <= st.idle_s + tol)) out.push_back(at + "bubble outside the idle time");
  }
  if (r.fits != (r.hbm_peak_bytes <= r.hbm_capacity_bytes && r.host_peak_bytes <= r.host_capacity_bytes))
    out.push_back("fits says " + std::to_string(r.fits) + " against the peaks and capacities");
  if (!(std::abs(r.tokens_per_s_per_device * step - r.tokens_per_device_per_step) <= 1e-9 * r.tokens_per_device_per_step))
    out.push_back("tokens/s is not tokens per step over the step");
}

// The fields `other` sets differently from `c`, as JSON: laid over the printed config, they give the run a
// finding compares it with (`hbmsim simulate --config`).
std::string changed_fields(const RunConfig& c, const RunConfig& other) {
  const nlohmann::json a = c.to_json(), b = other.to_json();
  nlohmann::json changed = nlohmann::json::object();
  for (const auto& [key, value] : b.items())
    if (!a.contains(key) || a[key] != value) changed[key] = value;
  return " (" + changed.dump() + ")";
}

// DESIGN.md's laws on one result, and against the same run on better hardware and with twice the work
// (better_hardware.hpp).
void laws(const RunConfig& c, const StepReport& r, std::vector<std::string>& out) {
  if (!(r.mfu <= 1.0)) out.push_back("MFU " + std::to_string(r.mfu) + " above 1");
  if (!(r.executed_flops_per_device >= r.model_flops_per_device * (1 - 1e-12))) out.push_back("executed FLOPs below the model's");
  if (!(std::isfinite(r.step_time_s) && r.step_time_s > 0)) out.push_back("step time " + std::to_string(r.step_time_s));
  const PreparedRun prepared = prepare_run(c);
  const double slack = test::allowed_slowdown(c, prepared, r.fits);
  for (const auto& [what, better] : test::better_hardware(c, prepared.system)) {
    const StepReport b = run_simulation(better);
    if (b.step_time_s > r.step_time_s * (1 + test::allowed_slowdown_on(what, c, prepared, r)))
      out.push_back(what + " is slower: " + std::to_string(r.step_time_s) + " -> " + std::to_string(b.step_time_s) + " s" +
                    changed_fields(c, better));
    if (r.fits && !b.fits) out.push_back(what + " no longer fits" + changed_fields(c, better));
  }
  try {
    const RunConfig twice = test::twice_the_work(c);
    const StepReport t = run_simulation(twice);
    if (t.step_time_s < r.step_time_s * (1 - slack))
      out.push_back("twice the work is faster: " + std::to_string(r.step_time_s) + " -> " + std::to_string(t.step_time_s) + " s" +
                    changed_fields(c, twice));
    if (t.hbm_peak_bytes < test::least_peak_with_twice_the_work(c, r, t))
      out.push_back("twice the work peaks lower: " + std::to_string(r.hbm_peak_bytes / 1073741824.0) + " -> " +
                    std::to_string(t.hbm_peak_bytes / 1073741824.0) + " GiB" + changed_fields(c, twice));
  } catch (const InputError&) {
    // twice the work may be bad input (a layout whose batch no longer divides): not a finding
  }
}

// The findings for one configuration (empty: none); nothing for bad input, which is not a finding (its error
// goes to `bad_input`).
std::optional<std::vector<std::string>> check(const RunConfig& c, bool with_timeline, bool fresh_thread, std::string& bad_input) {
  std::vector<std::string> out;
  try {
    const StepReport plain = simulate_resolved(c, false, false).report;
    const StepReport fast = simulate_resolved(c, false, true).report;
    differences(results(fast), results(plain), "fast-forward", out);
    if (with_timeline) {
      const StepReport recorded = simulate_resolved(c, true, true).report;
      differences(results(recorded), results(plain), "recorded", out);
      peak_lists_add_up(recorded, out);
    }
    if (fresh_thread) {
      nlohmann::json fresh;
      std::string error;
      std::thread([&] {
        try {
          fresh = results(simulate_resolved(c, false, true).report);
        } catch (const std::exception& e) {
          error = e.what();
        }
      }).join();
      if (!error.empty()) out.push_back("throws on a fresh thread: " + error);
      else differences(fresh, results(fast), "fresh thread", out, 0.0);
    }
    consistent(fast, out);
    laws(c, fast, out);
  } catch (const InputError& e) {
    bad_input = e.what();
    return std::nullopt;
  } catch (const std::exception& e) {
    out.push_back(std::string("throws: ") + e.what());
  }
  return out;
}

struct Args {
  int seed = 1, count = 1000, from = 0;
  bool pipelines = false, squeeze = false, rare = false, why = false;
  std::string model;  // every draw with this model in place of its own ("": the drawn one)
};

// The draw with its HBM set to 0.97-1.06x its own peak (the what-if hbm_bytes), so that it sits at the edge
// of fitting, where LHS's memory gate holds prefetches back; nullopt for bad input; the draw as it is where
// simulating it fails otherwise (check() then reports that).
std::optional<RunConfig> squeezed(RunConfig c, std::mt19937& rng, std::string& bad_input) {
  double peak = 0;
  try {
    peak = run_simulation(c).hbm_peak_bytes;
  } catch (const InputError& e) {
    bad_input = e.what();
    return std::nullopt;
  } catch (const std::exception&) {
    return c;
  }
  c.hbm_bytes = peak * std::uniform_real_distribution<double>(0.97, 1.06)(rng);
  return c;
}

// A pipelined draw's split redone for another model's layer count (`--model`): the layout search's split
// (set_pipeline_split), or, with one chunk per stage, the first stage taking what an even split of the others
// leaves (workloads/pipeline_split.cpp); one chunk per stage where interleaving splits no way.
void resplit(RunConfig& c) {
  if (c.pp <= 1) return;
  const std::int64_t L = hbmsim::resolve_model(c.model).num_layers;
  c.first_stage_layers = c.last_stage_layers = 0;
  c.pipeline_layout.clear();
  for (;;) {
    if (set_pipeline_split(c, L)) return;
    if (c.vp == 1) {
      if (L > c.pp) c.first_stage_layers = L - (c.pp - 1) * (L / c.pp);
      return;
    }
    c.vp = 1;
    c.ep_overlap = c.delay_wgrad = false;  // Megatron merges pipelined passes only when interleaved
  }
}

// Strict: an unknown option or a value that is not a whole number is an error, not a default run.
std::optional<Args> parse(int argc, char** argv) {
  Args a;
  auto number = [&](int& i, int& out) {
    const std::string name = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
    const std::string v = argv[++i];
    std::size_t used = 0;
    try {
      out = std::stoi(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v.size()) throw std::invalid_argument(name + " = \"" + v + "\" (expected a whole number)");
  };
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") return std::nullopt;
    if (name == "--seed") number(i, a.seed);
    else if (name == "--count") number(i, a.count);
    else if (name == "--from") number(i, a.from);
    else if (name == "--pipelines") a.pipelines = true;
    else if (name == "--squeeze") a.squeeze = true;
    else if (name == "--rare") a.rare = true;
    else if (name == "--why") a.why = true;
    else if (name == "--model") {
      if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
      a.model = argv[++i];
    }
    else throw std::invalid_argument("unknown option \"" + name + "\"");
  }
  if (a.count <= 0) throw std::invalid_argument("--count = " + std::to_string(a.count) + " (must be positive)");
  if (a.from < 0) throw std::invalid_argument("--from = " + std::to_string(a.from) + " (must be 0 or more)");
  // A model that does not resolve would make every draw bad input: refused here instead.
  if (!a.model.empty()) {
    try {
      hbmsim::resolve_model(a.model);
    } catch (const hbmsim::InputError& e) {
      throw std::invalid_argument("--model: " + std::string(e.what()));
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Args> parsed;
  try {
    parsed = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "hbmsim_stress: " << e.what() << "\n";
    return 2;
  }
  if (!parsed) {
    std::cout << "usage: hbmsim_stress [--seed N] [--count N] [--pipelines] [--squeeze] [--rare] [--from N] [--model M] [--why]\n"
                 "  --seed N      the draws' random seed (default 1)\n"
                 "  --count N     how many configurations to draw (default 1000)\n"
                 "  --pipelines   every draw a pipeline (default: every third); a pipeline's GPUs are doubled,\n"
                 "                up to 8x, while its stages need more than it drew\n"
                 "  --squeeze     each draw's HBM set to 0.97-1.06x its own peak (the edge of fitting)\n"
                 "  --rare        also the fields the other draws leave at their defaults: Megatron's micro-batch and\n"
                 "                global batch, stage policies, the last stage's layers or a pipeline layout string,\n"
                 "                FSDP gathers not pipelined, the memory slop, Muon's blockwise tp mode\n"
                 "  --from N      check draws N on only (the ones before are drawn, and squeezed, to reach them)\n"
                 "  --model M     every draw with model M (a built-in or a HuggingFace config, e.g.\n"
                 "                hf/gpt-oss-20b.config.json) in place of its own, pipelines re-split for its layers,\n"
                 "                sequence parallelism on where M has experts; layouts M cannot take are skipped\n"
                 "  --why         print each skipped draw's bad-input error\n"
                 "Exit status: 0 no findings, 1 findings (printed with their configuration JSON), 2 bad arguments.\n";
    return 0;
  }
  const int seed = parsed->seed, count = parsed->count, from = parsed->from;
  const bool pipelines = parsed->pipelines, squeeze = parsed->squeeze;
  std::mt19937 rng(static_cast<unsigned>(seed));
  int findings = 0, simulated = 0;
  // MoE layers under tp need sequence parallelism (Megatron-Core's rule), which the draws of a built-in MoE model
  // have and a dense model's draws have only half the time: `--model` with an MoE model turns it on.
  const bool moe_model = !parsed->model.empty() && hbmsim::resolve_model(parsed->model).num_experts > 0;
  for (int k = 0; k < count; ++k) {
    std::optional<RunConfig> drawn = draw(rng, k, pipelines, parsed->rare);
    if (!parsed->model.empty()) {
      drawn->model = parsed->model;
      drawn->mtp_layers = 0;  // DeepSeek's MTP modules belong to the drawn model
      if (moe_model) drawn->sequence_parallel = true;
      resplit(*drawn);
    }
    grow_gpus(*drawn);
    std::string bad_input;
    if (squeeze) drawn = squeezed(*drawn, rng, bad_input);
    if (k < from) continue;
    const auto found = drawn ? check(*drawn, k % 5 == 0, k % 7 == 3, bad_input) : std::nullopt;
    if (!found && parsed->why) std::cout << "draw " << k << ": skipped, bad input: " << bad_input << "\n";
    if (found) {
      const RunConfig& c = *drawn;
      ++simulated;
      for (const auto& f : *found) std::cout << "draw " << k << ": " << f << "\n";
      if (!found->empty()) std::cout << "  config: " << c.to_json().dump() << "\n";
      findings += !found->empty();
    }
    if ((k + 1) % 500 == 0) std::cerr << "hbmsim_stress: " << k + 1 << " of " << count << " draws, " << findings << " with findings\n";
  }
  std::cout << "seed " << seed << ": " << count - std::min(from, count) << " draws checked, " << simulated << " simulated (the rest bad input), " << findings
            << " with findings\n";
  return findings > 0 ? 1 : 0;
}
