// One simulation run as data: every field a sweep axis or a CLI flag can set, loadable from JSON.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hwmodels/profile.hpp"
#include "hwmodels/system.hpp"
#include "sim/simulator.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

// An on/off field whose default follows the framework (auto). A bool sets it; it is read through
// layout_reading, never as a bool.
struct Switch {
  enum class State : std::uint8_t { automatic, off, on };
  State state = State::automatic;
  Switch() = default;
  Switch(bool v) : state(v ? State::on : State::off) {}  // NOLINT(google-explicit-constructor): set like a bool
  bool is_auto() const { return state == State::automatic; }
  bool on(bool automatic) const { return is_auto() ? automatic : state == State::on; }
  bool operator==(const Switch&) const = default;
};

// Every field is listed once, with its JSON key, flag, help and check, in planner/run_fields.cpp; set,
// to_json and from_json read that table.
struct RunConfig {
  std::string system = "gb200-nvl72";
  std::string model = "llama3.1-8b";
  std::int64_t gpus = 8;
  // The batch in MaxText's meaning (per-device batch; 1 when neither it nor micro_batch is given), or in
  // Megatron's: micro_batch sequences per model replica, global_batch sequences per step (0: not given).
  std::optional<double> batch;
  std::int64_t micro_batch = 0, global_batch = 0;
  std::int64_t seq = 4096;
  std::int64_t grad_accum = 1;
  std::int64_t fsdp = 0, tp = 1, ep = 1, dp = 1, cp = 1, pp = 1;
  std::int64_t vp = 1;                  // virtual pipeline stages per pp rank
  std::string pp_schedule = "1f1b";     // 1f1b (interleaved with vp > 1), gpipe, zb-h1
  std::string pp_p2p = "auto";          // pipeline sends: overlapped, blocking, or auto (as the framework does)
  std::int64_t microbatches = 0;        // MaxText num_pipeline_microbatches (0: pp)
  std::int64_t first_stage_layers = 0, last_stage_layers = 0;  // 0: an even split
  bool embedding_as_layer = false, loss_as_layer = false;
  std::string pipeline_layout;          // Megatron pipeline_model_parallel_layout ("": the split above)
  bool reshard_weights = true;          // FSDP frees gathered weights after each use
  std::string mesh_order = "auto";      // maxtext, megatron, the axes outermost first, or auto (layout_reading)
  bool sequence_parallel = true;
  std::string cp_exchange = "auto";     // ring (Megatron p2p), all_gather (MaxText), or auto (layout_reading)
  bool sharded_optimizer = false;
  std::string framework = "maxtext";    // whose training state layout: maxtext (fp32 weights) or megatron
  std::string grad_reduce_dtype = "fp32";  // the gradient buffer and its reductions: fp32 or bf16
  std::string optimizer_moments_dtype = "fp32";  // Adam's two moments: fp32 or bf16 (precision-aware optimizer)
  std::string optimizer = "adam";       // adam, or muon (Megatron-Core's, for the 2-D layer weights)
  std::string muon_tp_mode = "duplicated";  // Muon under tp: duplicated (Megatron-Core) or blockwise (Megatron-Bridge)
  Switch cp_shards_weights;  // the context axis shards the weights FSDP-style (MaxText); auto: layout_reading
  Switch ep_shards_weights;  // the expert axis shards the non-expert weights too (MaxText); auto: layout_reading
  std::string moe_dispatcher = "alltoall";  // alltoall (a copy per chosen expert) or flex (DeepEP, HybridEP)
  std::int64_t moe_dispatcher_sms = 0;  // SMs the flex dispatcher's kernels hold (0: Megatron-Core's default, 20)
  std::int64_t expert_tp = 0;  // Megatron expert_tensor_parallel_size: 0 (= tp) or 1 (experts folded over tp)
  bool tp_comm_overlap = false;
  bool dp_overlap = true;
  bool ep_overlap = false;  // Megatron overlap_moe_expert_parallel_comm: combined 1F1B
  bool delay_wgrad = false; // Megatron delay_wgrad_compute (with ep_overlap)
  std::int64_t moe_batch_split = 1;     // MoE layers run as this many micro-batches (MaxText batch split)
  double moe_load_imbalance = 1;        // the busiest expert rank's tokens over the mean (dropless routing)
  double moe_capacity_factor = 0;       // Megatron moe_expert_rank_capacity_factor: expert buffers' size (0: none)
  double moe_paged_stash = 0;           // Megatron moe_paged_stash's CUDA buffer factor (0: off)
  std::int64_t mtp_layers = 0;          // multi-token prediction modules after the decoder layers (DeepSeek-V3)
  std::string weights = "bf16";         // MLP GEMM dtype: bf16, fp8, mxfp8, nvfp4
  std::string attention_dtype = "bf16"; // projection/attention GEMM dtype
  std::string policy = "full";
  std::string stage_policies;           // per pipeline stage, comma-separated presets ("": policy on all)
  std::string layer_policies;           // "FIRST-LAST:PRESET,...": layer ranges with a policy of their own
  std::int64_t offload_layers = 0;      // the first N layers offload what the policy keeps (Megatron CPU offload)
  std::int64_t recompute_layers = 0;    // the first N layers of each chunk fully recomputed (Megatron block)
  std::map<std::string, std::string> tensors;  // per checkpoint name: device | remat | offload
  bool fp8_saved_activations = false;   // TE keeps fp8 GEMM inputs quantized for the backward
  std::string optimizer_offload = "off";  // off, device (state streamed through HBM), host (CPU update)
  bool parameter_offload = false;         // parameters in pinned host memory, copied in per weight gather
  bool lhs = true;
  bool pipelined_transfers = false;
  bool pipelined_collectives = true;    // FSDP all-gathers issued one layer ahead (XLA collective pipeliner)
  bool double_buffering = false;        // XLA while-loop double buffering: two layers per scan body
  double memory_limit_slop = 0.95;
  std::int64_t max_ops = 4'000'000;  // the simulated-op budget (SimOptions::max_ops)
  // What-if overrides of the system's figures (what_if_fields() below).
  std::optional<double> host_link_bytes_per_s;  // per GPU, per direction
  std::optional<double> scale_up_bytes_per_s;   // per GPU, per direction
  std::optional<double> scale_out_bytes_per_s;  // per GPU, per direction
  std::optional<double> hbm_bytes;
  std::optional<double> hbm_bandwidth_bytes_per_s;
  std::optional<double> bf16_flops_per_s;  // dense BF16 peak; the other formats' peaks scale with it
  std::optional<double> host_memory_bytes;  // per host CPU, as a system file gives it
  std::string calibration;                      // profile file, or "" for datasheet figures

  // Field names a sweep axis or `set` accepts.
  static const std::vector<std::string>& fields();
  // Sets one field from text; `where` names the flag or axis for errors.
  void set(const std::string& field, const std::string& value, const std::string& where);
  nlohmann::json to_json() const;
  static RunConfig from_json(const nlohmann::json& doc, const std::string& origin);
  static RunConfig from_file(const std::string& path);
};

struct PreparedRun {
  System system;
  StepGraph graph;
  Policy policy;
  SimOptions options;
};

// A what-if override: a figure of the config's system that the run replaces, in `unit` ("bytes" or "bytes/s").
struct WhatIfField {
  const char* field;
  std::optional<double> RunConfig::*value;
  const char* unit;
  double (*own)(const System&);         // the system's figure the override replaces (for a warning far from it)
  void (*apply)(System&, double value);
};
const std::vector<WhatIfField>& what_if_fields();
const WhatIfField* find_what_if(const std::string& field);  // nullptr: not a what-if field
// Why a what-if override cannot be used, e.g. "must be > 0"; nullopt when it can. One rule for every front end:
// flags, config files, sweep axes, Python.
std::optional<std::string> what_if_problem(const std::string& field, double value);
// Throws for memory_limit_slop, max_ops or a what-if figure that cannot be used, the message starting with `name(field)`
// (the field itself when `name` is empty). Fields `skip` says yes to are left out (a sweep's varied axes).
void check_what_ifs(const RunConfig& config, const std::function<std::string(const std::string&)>& name = {},
                    const std::function<bool(const std::string&)>& skip = {});
// An InputError unless `calibration` is empty, a built-in profile's name or an existing file, naming the value as
// `named` ("--calibration", "calibration") and the built-in names; `read`: the file is read too, so that a command
// running many configs with it (validate, reproduce) refuses a bad profile once, not in every row.
void check_calibration(const std::string& calibration, const std::string& named, bool read = false);
// The system a run sees: the config's system with its calibration profile and what-if overrides applied.
System resolve_run_system(const RunConfig& config, const Profile* extra = nullptr);
// `extra` (optional) is applied after the config's own calibration: the fitter's trial parameters.
PreparedRun prepare_run(const RunConfig& config, const Profile* extra = nullptr);
// A GEMM dtype the system's GPU has no tensor cores for (nvfp4 on Hopper) is bad input, not a silent fallback;
// the message starts with the field ("weights = nvfp4 (...)").
void check_gpu_dtype(const System& system, const std::string& field, Dtype dtype);
// Why no layer of the graph makes the tensor NAME (of that kind of layer with NAME@KIND), naming the ones they
// make; empty when one does.
std::string missing_tensor(const StepGraph& graph, const std::string& key);
// Refuses keeping or offloading (tensors.NAME[@KIND] = device or offload) a tensor the graph's layers never make.
void check_override_tensors(const std::map<std::string, std::string>& tensors, const StepGraph& graph);
// The config's policy for that step: its preset, stage policies and layer rules (errors name the field).
Policy resolve_policy(const RunConfig& config, const StepGraph& graph);
// Megatron's MoE parallel folding: experts whole over an expert group of ep GPUs that spans tp and cp
// (expert_tp 1 under tp > 1); the mesh's expert axis is then ep / (tp x cp).
inline bool folds_experts(const RunConfig& c) { return c.expert_tp == 1 && c.tp > 1; }
// Whether a folded expert group of ep GPUs sits on tp x cp ranks: a multiple of tp x cp, or inside them as tp
// times a divisor of cp (the config's check and the validation mapping's).
inline bool folded_group_fits(std::int64_t tp, std::int64_t cp, std::int64_t ep) {
  return ep < tp * cp ? ep % tp == 0 && cp % (ep / tp) == 0 : ep % (tp * cp) == 0;
}
// Folded with an expert group smaller than tp x cp: it spans tp and ep / tp of the cp ranks (ep 8 at tp 4 x cp 4).
inline bool experts_inside_cp(const RunConfig& c) { return folds_experts(c) && c.cp > 1 && c.ep < c.tp * c.cp; }
// The mesh's expert axis: under folding the expert group spans tp x cp, and only the rest is an axis of its own
// (carved out of data parallelism); inside tp x cp it is the part of cp the group spans.
inline std::int64_t expert_axis(const RunConfig& c) {
  if (experts_inside_cp(c)) return c.ep / c.tp;
  return folds_experts(c) ? c.ep / (c.tp * c.cp) : c.ep;
}

// Megatron's selective-recompute modules that hbmsim has tensors for (recompute_modules): the tensors a module
// rematerializes, the rest kept as no_recompute keeps them. core_attn is the core attention's output;
// mla_up_proj MLA's per-head q, k and v, recomputed from the kept latents; moe_act the experts' activation
// output, recomputed from their first GEMMs' outputs; layernorm the outputs of the norms that are modules of
// their own (Transformer Engine fuses the others into the GEMM after them): the pre-MLP norm of MoE layers,
// which the router reads too, and MLA's input norm, which both down-projections read (a module of its own
// until Megatron-LM fused the MLA down-projections, 8fd390d, 2026-03); moe the whole MoE layer from its
// input, the pre-MLP norm's output (MoELayer's checkpointed forward: router, dispatch, experts, combine, and the
// shared experts); shared_experts the shared experts alone; mlp a dense layer's MLP from the layer's residual
// (Transformer Engine fuses its norm into the first GEMM). The shared experts carry the dense MLP's names, so
// these name them for one kind of layer (NAME@moe, NAME@dense). The validation reads a row's module this way,
// and the Megatron arguments print a policy back.
struct RecomputeModule {
  const char* name;
  const char* what;                         // for messages
  std::vector<std::string> tensors;         // rematerialized in every model
  std::vector<std::string> mla_tensors;     // and in MLA models
  std::vector<std::string> moe_tensors;     // and in MoE models
  std::vector<std::string> shared_tensors;  // and in models with shared experts
  std::vector<std::string> dense_tensors;   // and in models with dense layers
  // The names this module rematerializes in `model`, qualified by layer kind only where the model has both
  // kinds; empty: the model has nothing of it.
  std::vector<std::string> tensors_in(const ModelSpec& model) const;
};
const std::vector<RecomputeModule>& megatron_recompute_modules();
// The module Megatron names `name`; nullptr: none hbmsim knows.
const RecomputeModule* find_recompute_module(const std::string& name);
// Every tensor of Megatron's "moe" recompute module given as rematerialized (how a recompute-modules choice reads),
// which Megatron-Core refuses beside its expert all-to-all overlap.
bool recomputes_moe_module(const RunConfig& config, const ModelSpec& model);

// How the layout fields read a config: as given, or (auto) as its framework does: Megatron-Core's rank order
// (tp innermost, then cp, ep, dp, pp), its ring context exchange, and context and expert ranks holding the
// other weights whole under framework megatron (sharding them with the rest of the data-parallel group under
// Megatron-FSDP, fsdp > 1); MaxText's (its mesh order, all-gathered keys and values, weights sharded over cp and
// ep FSDP-style) otherwise.
struct LayoutReading {
  std::string mesh_order, cp_exchange;
  bool cp_shards_weights = true, ep_shards_weights = true;
};
LayoutReading layout_reading(const RunConfig& config);
// The reading a layout of the config's with its experts folded over tp (expert_tp 1) takes: under framework
// megatron, DDP's (Megatron-FSDP's reading is not modelled for folded experts), the fields given outright winning.
LayoutReading folded_layout_reading(const RunConfig& config);

// The layout fields given a MaxText value where Megatron-Core's differs, as the flags that read the config
// Megatron's way under framework megatron: the rank order (with two parallel axes or more), the context
// exchange, the context and expert axes sharding the other weights. Empty: none, or none matters here.
std::string megatron_reading_flags(const RunConfig& config);

// expert_tp 1 needs experts (checked before training_shape, whose expert group it would otherwise question).
void check_expert_tp(const RunConfig& config, const ModelSpec& model);
// The training shape (GPUs, batch, sequence, accumulation, parallel degrees) of a config, unchecked.
TrainingSpec training_shape(const RunConfig& config);
StepReport run_simulation(const RunConfig& config, bool trace = false, const Profile* extra = nullptr);

}  // namespace hbmsim
