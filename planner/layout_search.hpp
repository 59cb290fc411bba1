// `plan layout`: the fastest parallel layout for a model on N GPUs of a system at a fixed global batch. It
// searches tp x cp x pp x vp x ep x the data axes (FSDP, data parallel with a sharded optimizer, or both) x the
// micro-batch x the activation policy, drops what cannot fit by a memory lower bound before simulating,
// simulates the rest fastest step-time bound first until no unsimulated candidate can enter the top list,
// and ranks by tokens/s per GPU (every candidate has the same tokens per step).
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "planner/run_config.hpp"

namespace hbmsim {

struct LayoutSearchOptions {
  std::int64_t top = 10;  // signed: a negative count from the CLI or Python is refused by name, not wrapped
  int jobs = 1;
  // Skip candidates whose HBM lower bound exceeds capacity, and those whose step-time lower bound cannot beat
  // the top list (off: simulate them all; the answer is the same, which the tests check).
  bool prune = true;
  // With prune: a simulation stops once HBM goes over capacity (what cannot fit needs no step time; the layout
  // that came closest is run in full if nothing fits). Off: every simulation runs whole; the answer is the same,
  // which the tests check.
  bool stop_early = true;
  std::vector<std::string> policies;  // empty: default_layout_policies(base)
  std::vector<std::int64_t> micro_batches = {1, 2};  // sequences per model replica per micro-step
  // A candidate whose HBM lower bound exceeds capacity is tried again with its optimizer state in pinned host
  // memory (updated on the GPU, then on the host CPU), then with its parameters there too (when the base
  // config offloads neither); under framework megatron only with Megatron's CPU optimizer (the host update).
  bool state_offload = true;
  // Fields the search holds to the values given instead of searching: any of tp, cp, pp, vp, ep, fsdp, dp, and
  // sharded_optimizer (0 off, 1 on) (the CLI's flags given for them, Python's keywords). A held value is tried even
  // where the search would not try it (cp 8, tp 16, seq / cp under 2,048).
  std::map<std::string, std::vector<std::int64_t>> held;
  // Called after each simulated candidate (from one thread at a time): done, total to simulate.
  std::function<void(std::size_t, std::size_t)> progress;
};

struct LayoutResult {
  RunConfig config;
  StepReport report;
  std::string limit;  // limiting_resource(report)
};

struct LayoutSearch {
  std::int64_t global_batch = 0;     // sequences per step, the same for every candidate
  std::vector<LayoutResult> top;     // fitting candidates, most tokens/s per GPU first
  std::size_t candidates = 0;        // layouts x micro-batches x policies enumerated
  std::size_t offloaded = 0;         // of them, tried again with their state in host memory (and counted again)
  std::size_t pruned = 0;            // dropped by the memory lower bound, never simulated
  std::size_t refused = 0;           // bad combinations (a degree that does not divide, too few micro-batches)
  std::size_t simulated = 0, fitting = 0;
  // Never simulated: their step-time lower bound was no faster than the top list's slowest (branch and bound).
  std::size_t skipped = 0;
  std::string none_fit;  // when nothing fits: why not (the candidate closest to fitting and its memory)
  nlohmann::json held = nlohmann::json::object();  // the fields held (LayoutSearchOptions::held) and their values
};

// The policies a search tries when none are given: MaxText's presets (remat policies, and offloading ones),
// or under framework megatron Megatron's choices (no recompute, selective, full, and for a model that has them
// the selective recompute modules recipes use: "no_recompute+moe_act+layernorm", "no_recompute+moe+layernorm",
// "no_recompute+mla_up_proj").
std::vector<std::string> default_layout_policies(const RunConfig& base);

// A search policy: a preset, or no_recompute / selective followed by Megatron recompute modules joined by "+"
// ("no_recompute+moe_act+layernorm"), whose tensors in `model` are rematerialized on top of the config's.
// Throws InputError naming `policies` for an unknown preset or module, a module after another preset, or a
// module the model has nothing of.
RunConfig with_layout_policy(RunConfig config, const std::string& policy, const ModelSpec& model);
// A config's policy as a search policy names it: the preset, "+" the modules its tensors are when they are
// exactly some (selective_recompute_modules), else the preset with "*" for other placements.
std::string layout_policy_label(const RunConfig& config);

// Sets the pipeline split of `layers` over c.pp x c.vp chunks: even; or, under framework megatron only (MaxText's
// pipeline takes no other), with the embedding and loss counted as layers (embedding_as_layer, loss_as_layer), else
// Megatron-Bridge's uneven layout (ceil_pipeline_layout, as pipeline_layout). False where none applies (the fields
// then cleared).
bool set_pipeline_split(RunConfig& c, std::int64_t layers);

// Every candidate the search considers, before pruning (configs hbmsim may still refuse).
std::vector<RunConfig> layout_candidates(const RunConfig& base, const LayoutSearchOptions& options);

// A lower bound of the HBM peak of `config` without simulating it: the worst stage's parameters, gradients,
// optimizer state and runtime reserve, plus the activations its layers must keep (on device: each layer's input
// and the checkpoint tensors the policy keeps) for every chunk forward its schedule runs before its first
// backward (1F1B's first stage: min(pp, micro-batches) micro-batches; interleaved 1F1B's more). Throws
// InputError as prepare_run does.
double hbm_lower_bound_bytes(const PreparedRun& run);

// What limits a run, in words: what it runs out of when it does not fit; otherwise the longest exposed wait of
// the compute stream ("tp collectives 0.41 s exposed (9%)", "pipeline bubble ...", "host link (h2d) ..."), or
// "compute" when waits are under 5% of the step; HBM over 95% full is added.
std::string limiting_resource(const StepReport& report);

// How the caller's user names the options in messages: the CLI's flags, or Python's keywords.
struct LayoutOptionNames {
  std::string top = "--top", jobs = "--jobs", policies = "--policies", micro_batches = "--micro-batches";
};
// The fields a search can hold (LayoutSearchOptions::held), and LayoutSearch::held in words ("tp 4 or 8, pp 8").
const std::vector<std::string>& holdable_layout_fields();
std::string held_text(const nlohmann::json& held);
// The held fields and their values: one value as itself, several as a list ({"tp": [4, 8], "pp": 8,
// "sharded_optimizer": true}).
nlohmann::json held_fields(const LayoutSearchOptions& options);
// Refuses options no search can use: top 0, jobs below 1, a micro-batch below 1, and a policy or micro-batch
// given twice (its layouts would be simulated and listed twice); a held field the search does not set, with no
// value or a value twice.
void check_layout_options(const LayoutSearchOptions& options, const LayoutOptionNames& names = {});
// Refuses held values no layout of `base` can have: a degree below 1 or that does not divide the GPUs, and single
// held degrees whose product does not (the message starts "field = value", as InputError's do).
void check_held_layout(const RunConfig& base, const LayoutSearchOptions& options);
LayoutSearch search_layouts(const RunConfig& base, const LayoutSearchOptions& options);

}  // namespace hbmsim
