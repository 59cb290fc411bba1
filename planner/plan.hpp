// Capacity questions: largest batch that fits, best per-tensor policy, Pareto front of HBM vs TFLOP/s,
// break-even host-link bandwidth, HBM needed for a target. Each answer carries runnable settings.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/run_config.hpp"

namespace hbmsim {

struct Candidate {
  RunConfig config;
  StepReport report;
};

// Largest batch that fits (assuming fitting is monotone in batch: doubling, then bisection), stepping one
// sequence per model replica's micro-batch at a time (or moe_batch_split of them): the smallest step any
// parallel layout runs, so with tp x cp x pp > 1 the per-device batch may be a fraction (1 / tp: one sequence
// per tensor-parallel replica). The answer is in the base's own field: the per-device batch (MaxText), or the
// micro-batch when the base gives micro_batch (Megatron's form). A global batch given scales with it, keeping
// the accumulation (micro-batch) count. max_batch bounds that field. `tried` lists every run simulated. With
// `powers_of_two` only 1, 2, 4, ... steps are candidates (the grid capacity experiments usually step through).
struct LargestBatch {
  std::string field = "batch";  // what `batch` is: "batch" (per device) or "micro_batch" (per model replica)
  double batch = 0;             // the answer (0: not even the smallest step fits)
  std::int64_t micro_batch = 0; // sequences per model replica per micro-step there (0: none fits)
  std::vector<Candidate> tried;
  // Why the search stopped: the smallest batch tried that does not fit and what it ran out of ("batch 6:
  // pinned host 183.0 > 178.8 GiB"), or that max_batch was reached.
  std::string stopped;
  // The run at the answer (nullptr when nothing fits).
  const Candidate* answer() const;
};
// The largest max_batch a search takes: the largest per-device batch a run accepts (workloads/training.cpp).
constexpr std::int64_t kMaxBatch = std::int64_t{1} << 20;
// An InputError for max_batch outside [1, kMaxBatch].
LargestBatch largest_batch(const RunConfig& base, std::int64_t max_batch = 4096, bool powers_of_two = false);
// The smallest per-device batch `base`'s layout runs: one sequence (or moe_batch_split) per model replica's
// micro-batch, 1 / tp without pipelining or cp.
double smallest_batch(const RunConfig& base);

// Policy variants for largest-batch: "label=field:value;field:value".
struct VariantSpec {
  std::string label;
  std::vector<std::pair<std::string, std::string>> settings;  // field, value, in the order given
};
VariantSpec split_variant(const std::string& spec);
std::pair<std::string, RunConfig> parse_variant(const RunConfig& base, const std::string& spec);
// Default variants: with per-tensor settings in `base`, those names kept on device, rematerialized,
// offloaded, and as given; otherwise the presets (Megatron's recompute choices under framework megatron,
// MaxText's otherwise).
std::vector<std::pair<std::string, RunConfig>> default_variants(const RunConfig& base);

// Best per-tensor policy: device / remat / offload for each of `names`, the highest TFLOP/s that fits.
// Exhaustive when 3^n <= exhaustive_limit, otherwise a local search (documented in the README): start from
// all-remat and from the base config's placement, repeatedly apply the single-name change that raises
// TFLOP/s most among fitting configs, until none does.
struct PolicySearch {
  Candidate best;
  std::vector<Candidate> evaluated;
  std::string method;
  bool found = false;
};
std::vector<std::string> default_search_names(const RunConfig& base);
// Refuses search names (given as `flag`: "--names", "--tensor") listed twice, or that no layer of the base run
// makes: a search would place the same tensor twice, or nothing.
void check_search_names(const RunConfig& base, const std::vector<std::string>& names, const std::string& flag);
// best_policy's names (--names): checkpoint names a policy can place, as check_search_names asks.
void check_policy_names(const RunConfig& base, const std::vector<std::string>& names);
PolicySearch best_policy(const RunConfig& base, const std::vector<std::string>& names, int jobs = 1,
                         std::size_t exhaustive_limit = 729);

// Points not dominated in (lower HBM peak, higher TFLOP/s), sorted by HBM.
std::vector<Candidate> pareto_front(const std::vector<Candidate>& points);
// How long a step's compute stream waited on host copies, both directions: what a placement's offload costs,
// beside the recompute it saves (compute_s).
double host_copies_exposed_s(const StepReport& r);

// Lowest host-link bandwidth (per GPU, per direction) at which `offload` is within `tolerance` of the best
// alternative that fits: the offloaded names kept on device if that fits, else rematerialized; when neither
// fits, on device with HBM capacity ignored (and `reference` says so).
struct BreakEven {
  double bytes_per_s = 0;  // 0: never within tolerance up to the highest bandwidth tried
  double reference_tflops = 0;
  std::string reference;   // "on device", "rematerialized (on device does not fit)", ...
  RunConfig reference_config;
  std::vector<std::pair<double, double>> curve;  // (bytes/s, TFLOP/s)
};
BreakEven break_even_bandwidth(const RunConfig& offload, double tolerance = 0.01, double lo = 1e9, double hi = 4e12);
// An InputError unless `offload` is a run break_even_bandwidth can search: one policy for every layer, offloading
// something (it checks this itself; a command that describes the run first checks before).
void check_break_even(const RunConfig& offload);

// HBM a config needs (its peak with capacity no object) and the pinned host memory. With LHS the capacity is an
// input of the schedule (a prefetch waits while it would take HBM past memory_limit_slop of it), so the step may
// still fit below that peak, slower: the least capacity at which it fits and the least at which it keeps the step
// it takes with HBM no object are found by bisection (to 0.1%; fitting and the step are taken as monotone in the
// capacity, laws the property suite checks). Without a prefetch the gate holds back, all three are the peak.
struct HbmNeeded {
  double hbm_bytes = 0, host_bytes = 0, capacity_bytes = 0;
  double step_time_s = 0;             // with HBM no object
  double fits_from_bytes = 0;         // the least HBM capacity at which the step fits
  double step_time_at_fit_s = 0;      // the step at that capacity (prefetches held back: no faster than step_time_s)
  double full_speed_from_bytes = 0;   // the least HBM capacity at which the step takes step_time_s (within 1e-9)
  StepReport report;                  // with HBM no object
};
HbmNeeded hbm_needed(const RunConfig& config);

}  // namespace hbmsim
