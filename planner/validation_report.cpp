#include "planner/validation_report.hpp"

#include <cmath>
#include <cstdio>
#include <map>

namespace hbmsim {

namespace {

// The row's policy with its Megatron layer counts.
std::string policy_text(const RunConfig& c) {
  std::string out = c.policy;
  for (const auto& [name, where] : c.tensors) out += " " + name + "=" + where;
  if (c.offload_layers > 0) out += ", offload_layers " + std::to_string(c.offload_layers);
  if (c.recompute_layers > 0) out += ", recompute_layers " + std::to_string(c.recompute_layers);
  return out;
}

std::string fmt(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
std::string pct(double e) { return (e >= 0 ? "+" : "") + fmt(100 * e, 1) + "%"; }
std::string opt_pct(const std::optional<double>& e) { return e ? fmt(100 * *e, 1) + "%" : "-"; }
nlohmann::json opt(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
std::string md_cell(std::string s) {
  std::string out;
  for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

nlohmann::json summary_json(const ErrorSummary& s) {
  return {{"group", s.group},       {"rows", s.total},
          {"expressed", s.expressed}, {"measured", s.measured},
          {"mape", opt(s.mape)},    {"median_abs_error", opt(s.median_abs_error)},
          {"worst_row", s.worst_row ? nlohmann::json(s.worst_row) : nlohmann::json(nullptr)},
          {"worst_error", s.worst_row ? nlohmann::json(s.worst_error) : nlohmann::json(nullptr)}};
}

std::string summary_md_row(const std::string& kind, const ErrorSummary& s) {
  return "| " + kind + " | " + md_cell(s.group) + " | " + std::to_string(s.total) + " | " + std::to_string(s.expressed) + " | " +
         std::to_string(s.measured) + " | " + opt_pct(s.mape) + " | " + opt_pct(s.median_abs_error) + " | " +
         (s.worst_row ? "row " + std::to_string(s.worst_row) + " (" + pct(s.worst_error) + ")" : "-") + " |\n";
}

// The kind of a reason, for the counts: refusals and other reasons by their text, the per-row variants of one
// limitation together.
std::string reason_kind(const std::string& reason) {
  auto has = [&](const char* w) { return reason.find(w) != std::string::npos; };
  if (reason.rfind("hbmsim refuses: ", 0) == 0) return reason;
  if (has("MoE parallel folding")) return "expert tensor parallel (ETP) neither 1 nor tp: Megatron's MoE parallel folding with ETP > 1";
  return reason;
}

}  // namespace

std::string calibration_label(const std::string& calibration) {
  return calibration.empty() ? "datasheet figures (no calibration)" : "calibration " + calibration;
}

std::string validation_layout(const ValidationRow& row) {
  if (row.mapping.config) {
    const auto& c = *row.mapping.config;
    std::string s = "tp" + std::to_string(c.tp) + " pp" + std::to_string(c.pp) + " vp" + std::to_string(c.vp) + " cp" +
                    std::to_string(c.cp) + " ep" + std::to_string(c.ep) + " dp" + std::to_string(c.dp);
    if (c.fsdp > 1) s += " fsdp" + std::to_string(c.fsdp);
    if (c.ep_overlap) s += " ep-overlap";  // Megatron's combined 1F1B
    if (c.delay_wgrad) s += " delay-wgrad";
    return s;
  }
  const auto& r = row.run;
  return "tp" + std::to_string(r.tp) + " pp" + std::to_string(r.pp) + " vp" + std::to_string(r.vp) + " cp" + std::to_string(r.cp) +
         " ep" + std::to_string(r.ep) + (r.etp ? " etp" + std::to_string(r.etp) : "") + " " + r.dp_fsdp;
}

std::string validation_note(const ValidationRow& row) {
  std::string note = row.reason;
  if (note.empty() && !measured_tok_s_gpu(row.run)) note = "no measured tokens/s";
  if (tok_s_from_step_time(row.run)) note += std::string(note.empty() ? "" : "; ") + "measured tokens/s from step_s";
  for (const auto& r : row.mapping.remarks) note += (note.empty() ? "" : "; ") + r;
  return note;
}

const std::vector<std::string>& validation_rules() {
  static const std::vector<std::string> rules = {
      "Only the row's columns decide its configuration: nothing is fitted, no row is special-cased, no model parameter "
      "was tuned for this corpus.",
      "**system**: DGX-GB200 / GB200 -> `gb200-nvl72`, DGX-GB300 -> `gb300-nvl72` (NVL72 racks, PUBLISHED_RUNS.md); "
      "DGX-H100 / H100 / H100 SXM -> `h100-hgx`, DGX-B200 -> `b200-hgx`, DGX-B300 -> `b300-hgx` (8-GPU HGX nodes; "
      "the B200/B300 ones air-cooled, at 1000 W and 1100 W).",
      "**model**: Llama3-8B -> `llama3.1-8b`, Llama3-70B -> `llama3.1-70b` (Llama 3 and 3.1 share their shapes), "
      "Llama3-405B / Llama3.1-405B -> `llama3.1-405b`, DeepSeek-V3 -> `deepseek-v3-671b` with one MTP module "
      "(`mtp_layers 1`, Megatron-Bridge's recipes' mtp_num_layers) unless the row says no MTP, Mixtral-8x7B -> `hf/mixtral-8x7b.config.json` (the HuggingFace config shipped in data/hf).",
      "**prec**: BF16 -> bf16; FP8, FP8-CS, FP8 CS -> fp8 (per-tensor scaling); MXFP8 -> mxfp8 (a scale per 32 "
      "elements: the fp8 GEMM table, times a profile's `mxfp8_gemm_scale` where it sets one); NVFP4 -> nvfp4, "
      "for both `weights` (MLP and expert GEMMs) and `attention_dtype` (QKV and output projections): Transformer Engine runs every linear "
      "layer in the recipe's precision and the core attention in bf16, as hbmsim's attention always is. With fp8, "
      "mxfp8 or nvfp4, `fp8_saved_activations on`: each linear layer's input is kept quantized for its backward, as "
      "Transformer Engine's recipes save it (fp8: 1 byte per element; mxfp8: 1 byte and a scale byte per 32; nvfp4: "
      "half a byte and a scale byte per 16), and a sequence-parallel all-gather into it moves the quantized input.",
      "**gradients**: `grad_reduce_dtype bf16` (Megatron's grad_reduce_in_fp32 off: the gradient buffer and its "
      "reduce-scatters in bf16) for Megatron-Bridge rows, whose performance configs set it for every model and "
      "precision, and for NeMo's rows (NeMo 25.04's performance scripts for FP8; its Llama and Mixtral recipes in "
      "performance mode for BF16 as well); fp32 for NeMo's BF16 DeepSeek-V3 rows (that script's recipe keeps "
      "bf16_mixed's default) and bare Megatron-Core scripts (Megatron-LM's --bf16 accumulates and reduces gradients "
      "in fp32). "
      "Megatron-Bridge's DeepSeek-V3 rows: `optimizer_moments_dtype bf16` (the recipe's precision-aware optimizer "
      "with bf16 exp_avg and exp_avg_sq: 8 bytes of optimizer state per parameter, not 12).",
      "**batch** (Megatron): mbs -> `micro_batch`, gbs -> `global_batch`; the accumulation / micro-batch count is "
      "gbs / (mbs x gpus / (tp x cp x pp)). A `GAn` note that disagrees is shown as a remark.",
      "**layout**: tp, pp, vp, cp, ep as given ('-' = 1), read as `framework megatron` reads it: Megatron-Core's rank "
      "order (`mesh_order megatron`); context parallelism as its ring (`cp_exchange ring`, `cp_shards_weights off`); "
      "expert parallelism partitions only the experts: the other weights are whole on every expert-parallel rank and "
      "their gradients summed with dp (`ep_shards_weights off`, Megatron-Core's dense and expert DDP buffers); "
      "pipeline schedule 1F1B, interleaved when vp > 1 "
      "(Megatron's default). Sequence parallelism is on with tp > 1 (hbmsim's default; the sources' recipes set it), "
      "TP communication overlapped with the GEMMs wherever tp > 1 (`tp_comm_overlap on`: the NeMo and Megatron-Bridge "
      "performance recipes' userbuffers; off for bare Megatron-Core scripts, Megatron's default, and for NeMo 25.04's "
      "DeepSeek-V3 script, which turns it off), gradient and parameter "
      "collectives overlapped (hbmsim's defaults). As `framework megatron`, each layer runs in program order (no "
      "latency-hiding scheduler): a collective that no library overlaps, such as the expert all-to-all, holds the compute "
      "stream; pipeline sends overlap compute in the interleaved schedule and block both ends without it (`pp_p2p auto`: "
      "Megatron refuses overlap_p2p_comm there). MoE tokens travel by Megatron's flex dispatcher "
      "(`moe_dispatcher flex`: a copy per destination GPU and one per destination node, forwarded there over NVLink) "
      "for DeepSeek-V3 rows whose recipes name a DeepEP or HybridEP backend (Megatron-Bridge's, every system), by the "
      "alltoall dispatcher (a copy per chosen expert) otherwise (NeMo 25.04's DeepSeek-V3 script keeps it, with token "
      "drop at capacity factor 1: balanced loads).",
      "**pipeline split**: even; when pp x vp does not divide the layers but does divide them plus two, the embedding "
      "and the loss count as a layer each (Megatron's account_for_embedding/loss_in_pipeline_split, which the Llama 3.1 "
      "405B recipes set for its 126 layers; over pp 16 x vp 8 the first chunk is the embedding alone and the last the loss "
      "alone). DeepSeek-V3's 61 layers over c chunks take Megatron-Bridge's layout (its DeepSeek-V3 layout map for 4, 8 "
      "and 16 chunks; `Et*4|(t*4|)*14tmL` in the pp 2 x vp 8 performance recipes): ceil(61 / c) layers per chunk, the "
      "rest in the last with the MTP module and the loss, as `pipeline_layout`; dgxc-benchmarking's rows take NeMo 25.04's "
      "script (64 / pp - 1 layers on the first stage, 64 / pp - 2 on the last with the MTP module and the loss, 64 / pp "
      "on the others: `Et*3|(t*4|)*14t*2mL` at pp 16). Other splits are left to hbmsim, which refuses them naming the field.",
      "**dp_fsdp**: Megatron's data-parallel size is gpus / (tp x cp x pp), and expert parallelism is carved out of it; "
      "hbmsim's replicas count its `ep` axis too, so `dp` = gpus / (tp x cp x pp x ep). DDP -> that dp with the "
      "distributed optimizer (`sharded_optimizer on`, `fsdp 1`); FSDP / FSDPn -> `fsdp` n (all of those ranks when n is "
      "not given; Megatron FSDP shards parameters, gradients and optimizer state, as ZeRO-3), `dp` the rest; DPn -> "
      "Megatron data-parallel size n (checked against the layout), with the distributed optimizer as DDP (the NeMo and "
      "Megatron-Bridge recipes' default; the FlagPerf tables do not say). `ep (ETP1)` with tp > 1 is Megatron's MoE parallel "
      "folding: `expert_tp 1`, whole experts over an expert group of ep GPUs that spans tp, so that ep / tp of it is "
      "carved out of the replicas (`dp` = gpus x tp / (tp x cp x pp x ep)); `ep (ETPn)` with n neither 1 nor tp is "
      "not expressible.",
      "**remat_offload** (`recipe@REV` only says where the setting was read): nothing stated -> Megatron's default, no "
      "recompute: `no_recompute`, which keeps what every backward op reads, as autograd does (each linear layer's "
      "input, sharded where sequence parallelism gathers it again in the backward; q, k, v and the attention output; "
      "each norm's input; the SwiGLU inputs and output; the MoE dispatched tokens). When that does not fit, the run "
      "(which ran) cannot have used it: its recipe set some recompute, read as the fewest layers per chunk recomputed in "
      "full (`recompute_layers N`, block) with which it fits, as `plan recompute-layers` finds it (the note says so; "
      "no count fitting leaves the row as read, marked not to fit). Selective recompute "
      "(`recompute-activations`, `(selective)`: Megatron's recompute_granularity=selective, module core_attn) -> "
      "`no_recompute` with `context=remat`, the core attention recomputed; `sel. recompute mla_up_proj` on an MLA model -> "
      "`no_recompute` with `query_proj`, `key_proj`, `value_proj=remat` (the per-head q, k, v); `moe_act` on a MoE model "
      "-> `moe_mlp_act=remat` (the experts' activation output); `moe` on a MoE model -> "
      "`router_logits`, `moe_dispatched`, `moe_mlpwi_0`, `moe_mlpwi_1`, `moe_mlp_act`, `moe_returned=remat` (the whole "
      "MoE layer run again, its all-to-alls included) and, with shared experts, theirs; `shared_experts` -> `mlpwi_0`, "
      "`mlpwi_1`, `mlp_act`, `mlpwo=remat` in the MoE layers; `mlp` -> `mlp_norm`, `mlpwi_0`, `mlpwi_1`, `mlp_act`, "
      "`mlpwo=remat` in the dense layers (the MLP with its fused norm; a module's last output, which no backward reads, "
      "names what Megatron's checkpoint runs again: fc2 with its tp reduction, the combine); `layernorm` -> `mlp_norm=remat` in the MoE layers (the "
      "pre-MLP norm, a module of its own there) and `attn_norm=remat` on an MLA model (the input norm); names qualified "
      "`@dense` or `@moe` where the model has both kinds of layer; a module the "
      "model has nothing of -> `no_recompute`; several modules in one item, each so. A DeepSeek-V3 row that states nothing takes its recipe's modules: "
      "Megatron-Bridge's performance configs (the 26.04 containers': `mla_up_proj` on GB300, B300 and B200, `mlp` on "
      "GB200) and dgxc-benchmarking 25.05's launch script (`mla_up_proj` on H100, `core_attn` on GB200, applied by NeMo "
      "25.04's script at the commit it pins, 7a8f1cc); a Megatron-Bridge Llama FP8 row with Megatron-FSDP that states "
      "nothing takes its config's CPU activation offload (25.09 on GB200: 40 layers for Llama 3 70B, 95 for Llama 3.1 "
      "405B; 26.04, Llama 3 70B: 20 on GB300, 40 on GB200); `validate --json` says so in `recompute`. On B200 at ep 32 (the "
      "Megatron-Bridge config since 2026-04-18) it also takes the all-to-all overlap, `ep_overlap`. Full recompute -> `full`; of N layers per pipeline chunk (\"block N "
      "layers\", N fewer than the chunk's layers) -> `recompute_layers N`, the first N layers of every chunk fully "
      "recomputed and the rest kept. CPU activation offload of N layers -> `offload_layers N`: the first N layers send "
      "every tensor they save, their input included, to host, on Transformer Engine's schedule (`framework "
      "megatron`: each copy direction one stream; a layer's D2H waited for n - N layers on, its reload issued "
      "n - 1 - N layers ahead; TE 2.10's cpu_offload.py). "
      "flash-attn2 and TE name the kernels hbmsim's costs already assume.",
      "**SFT / LoRA** rows: not expressible (hbmsim simulates pre-training steps). A row without tok_s_gpu takes its "
      "measured tokens/s from its step time, gbs x seq / (step_s x GPUs) (the dgxc-benchmarking READMEs print the "
      "step time and the total tokens/s); a row with neither is simulated when expressible but is in no error statistic. A configuration hbmsim refuses is listed with its "
      "error text.",
      "**error** = predicted / measured tokens/s per GPU - 1; MAPE is the mean of |error| over the expressed, measured "
      "rows, the median is of |error|. Rows predicted not to fit are kept in the statistics and marked in `fits`.",
  };
  return rules;
}

nlohmann::json validation_json(const std::vector<ValidationRow>& rows, const ValidationSummary& summary,
                               const std::string& calibration, const std::string& origin) {
  auto arr = nlohmann::json::array();
  for (const auto& r : rows) {
    const auto& p = r.predicted;
    arr.push_back({{"row", r.run.row},
                   {"src", r.run.src},
                   {"container", r.run.container},
                   {"system", r.run.system},
                   {"gpus", r.run.gpus},
                   {"model", r.run.model},
                   {"prec", r.run.prec},
                   {"hbmsim_system", r.mapping.system_id},
                   {"hbmsim_model", r.mapping.model_id},
                   {"layout", validation_layout(r)},
                   {"recompute", r.mapping.recompute},
                   {"expressed", r.expressed()},
                   {"reason", r.reason},
                   {"note", validation_note(r)},
                   {"measured_tokens_per_s_per_gpu", opt(measured_tok_s_gpu(r.run))},
                   {"measured_tflops_per_gpu", opt(r.run.tflops_gpu)},
                   {"predicted_tokens_per_s_per_gpu", p ? nlohmann::json(p->tokens_per_s_per_device) : nlohmann::json(nullptr)},
                   {"error", opt(r.error)},
                   {"predicted_tflops_per_gpu", p ? nlohmann::json(p->tflops_per_device) : nlohmann::json(nullptr)},
                   {"hbm_peak_gib", p ? nlohmann::json(p->hbm_peak_bytes / 1073741824.0) : nlohmann::json(nullptr)},
                   {"fits", p ? nlohmann::json(p->fits) : nlohmann::json(nullptr)},
                   {"config", r.mapping.config ? r.mapping.config->to_json() : nlohmann::json(nullptr)}});
  }
  auto groups = [](const std::vector<ErrorSummary>& v) {
    auto a = nlohmann::json::array();
    for (const auto& s : v) a.push_back(summary_json(s));
    return a;
  };
  return {{"calibration", calibration},
          {"calibration_label", calibration_label(calibration)},
          {"runs_file", origin},
          {"rows", arr},
          {"summary",
           {{"overall", summary_json(summary.overall)},
            {"by_src", groups(summary.by_src)},
            {"by_system", groups(summary.by_system)},
            {"by_model", groups(summary.by_model)}}}};
}

std::string validation_csv(const std::vector<ValidationRow>& rows) {
  auto q = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string out = "\"";
    for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return out + "\"";
  };
  std::string out = "row,src,system,gpus,model,prec,layout,measured_tok_s_gpu,predicted_tok_s_gpu,error,predicted_tflops_gpu,"
                    "hbm_peak_gib,fits,note\n";
  for (const auto& r : rows) {
    const auto& p = r.predicted;
    out += std::to_string(r.run.row) + "," + q(r.run.src) + "," + q(r.run.system) + "," + std::to_string(r.run.gpus) + "," +
           q(r.run.model) + "," + q(r.run.prec) + "," + q(validation_layout(r)) + "," + (measured_tok_s_gpu(r.run) ? fmt(*measured_tok_s_gpu(r.run), 1) : "") +
           "," + (p ? fmt(p->tokens_per_s_per_device, 1) : "") + "," + (r.error ? fmt(*r.error, 4) : "") + "," +
           (p ? fmt(p->tflops_per_device, 1) : "") + "," + (p ? fmt(p->hbm_peak_bytes / 1073741824.0, 1) : "") + "," +
           (p ? (p->fits ? "yes" : "no") : "") + "," + q(validation_note(r)) + "\n";
  }
  return out;
}

std::string validation_markdown(const std::vector<ValidationRow>& rows, const ValidationSummary& summary,
                                const std::string& calibration, const std::string& origin) {
  std::string out = "# Validation against published measured runs: " + calibration_label(calibration) + "\n\n";
  out += "Generated by `hbmsim validate --markdown" + (calibration.empty() ? std::string() : " --calibration " + calibration) +
         "` from `" + origin + "` (data/reference/published_runs.csv, " + std::to_string(rows.size()) +
         " runs; sources in data/reference/PUBLISHED_RUNS.md). Predicted: hbmsim with " + calibration_label(calibration) +
         ". tests/test_validation.cpp re-runs it and fails when a number or a reason here moves: regenerate this file in "
         "the commit that moves it.\n\n";
  out += "## Summary\n\nTokens/s per GPU, error = predicted / measured - 1, over the rows expressed and measured.\n\n";
  out += "| by | group | rows | expressed | measured | MAPE | median abs. error | worst |\n|---|---|---|---|---|---|---|---|\n";
  out += summary_md_row("all", summary.overall);
  for (const auto& s : summary.by_src) out += summary_md_row("src", s);
  for (const auto& s : summary.by_system) out += summary_md_row("system", s);
  for (const auto& s : summary.by_model) out += summary_md_row("model", s);
  std::map<std::string, int> kinds;
  std::vector<std::string> order;
  for (const auto& r : rows)
    if (!r.expressed()) {
      auto k = reason_kind(r.reason);
      if (!kinds.count(k)) order.push_back(k);
      ++kinds[k];
    }
  out += "\n## Not expressed\n\n";
  if (order.empty()) out += "Every row is expressed.\n";
  else out += "| rows | reason |\n|---|---|\n";
  for (const auto& k : order) out += "| " + std::to_string(kinds[k]) + " | " + md_cell(k) + " |\n";
  out += "\n## Runs\n\n";
  out += "| # | src | system | GPUs | model | prec | layout | policy | measured tok/s/GPU | predicted | error | TFLOP/s pred | HBM GiB | "
         "fits | note |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    const auto& p = r.predicted;
    out += "| " + std::to_string(r.run.row) + " | " + md_cell(r.run.src) + " | " + md_cell(r.run.system) + " | " +
           std::to_string(r.run.gpus) + " | " + md_cell(r.run.model) + " | " + md_cell(r.run.prec) + " | " + md_cell(validation_layout(r)) +
           " | " + (r.mapping.config ? policy_text(*r.mapping.config) : "-") + " | " + (measured_tok_s_gpu(r.run) ? fmt(*measured_tok_s_gpu(r.run), 0) : "-") +
           " | " + (p ? fmt(p->tokens_per_s_per_device, 0) : "-") + " | " + (r.error ? pct(*r.error) : "-") + " | " +
           (p ? fmt(p->tflops_per_device, 1) : "-") + " | " + (p ? fmt(p->hbm_peak_bytes / 1073741824.0, 1) : "-") + " | " +
           (p ? (p->fits ? "yes" : "**no**") : "-") + " | " + md_cell(validation_note(r)) + " |\n";
  }
  out += "\n## How a row becomes a run\n\n";
  for (const auto& rule : validation_rules()) out += "- " + rule + "\n";
  return out;
}

}  // namespace hbmsim
