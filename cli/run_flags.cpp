#include "cli/run_flags.hpp"

#include "hwmodels/json_view.hpp"

namespace hbmsim::cli {

std::shared_ptr<RunFlags> make_run_flags(CLI::App* cmd) {
  auto f = std::make_shared<RunFlags>();
  cmd->add_option("--config", f->config_file, "Run configuration JSON; flags override its fields");
  struct Flag { const char* flag; const char* field; const char* help; };
  static const Flag flags[] = {
      {"--system", "system", "Built-in system id or system JSON file (default gb200-nvl72)"},
      {"--model", "model", "Built-in model id, model JSON or HuggingFace config.json"},
      {"--gpus", "gpus", "Number of GPUs"},
      {"--batch", "batch", "Per-device batch"},
      {"--seq", "seq", "Sequence length"},
      {"--grad-accum", "grad_accum", "Gradient accumulation steps"},
      {"--fsdp", "fsdp", "FSDP degree (default: the GPUs left after tp, ep, dp)"},
      {"--tp", "tp", "Tensor parallel degree"},
      {"--ep", "ep", "Expert parallel degree"},
      {"--dp", "dp", "Data parallel (replica) degree"},
      {"--weights", "weights", "MLP GEMM dtype: bf16, fp8, nvfp4"},
      {"--attention-dtype", "attention_dtype", "Attention/projection GEMM dtype"},
      {"--policy", "policy",
       "full, minimal, minimal_with_context, save_qkv_proj, qkv_proj_offloaded, minimal_offloaded, custom"},
      {"--lhs", "lhs", "Latency-hiding scheduler: on or off"},
      {"--pipelined-transfers", "pipelined_transfers", "Pipelined host offloading: on or off"},
      {"--pipelined-collectives", "pipelined_collectives", "FSDP all-gathers one layer ahead: on (default) or off"},
      {"--memory-limit-slop", "memory_limit_slop", "Fraction of HBM the LHS may plan for (0.95)"},
      {"--host-link-bw", "host_link_bytes_per_s", "What-if: host-link bytes/s per GPU per direction"},
      {"--hbm-bytes", "hbm_bytes", "What-if: HBM capacity in bytes"},
      {"--calibration", "calibration", "Calibration profile JSON (or built-in profile name)"},
  };
  for (const auto& fl : flags) {
    std::string field = fl.field;
    RunFlags* raw = f.get();
    cmd->add_option_function<std::string>(
        fl.flag, [raw, field](const std::string& v) { raw->values[field] = v; }, fl.help);
  }
  cmd->add_option("--tensor", f->tensors, "Per checkpoint name: NAME=device|remat|offload (repeatable)");
  return f;
}

RunConfig resolve_run_flags(const RunFlags& f) {
  RunConfig c = f.config_file.empty() ? RunConfig{} : RunConfig::from_file(f.config_file);
  for (auto& [field, v] : f.values) c.set(field, v, "--" + field);
  for (auto& t : f.tensors) {
    auto eq = t.find('=');
    if (eq == std::string::npos || eq == 0) throw InputError("--tensor " + t + " (expected NAME=device|remat|offload)");
    c.tensors[t.substr(0, eq)] = t.substr(eq + 1);
  }
  return c;
}

}  // namespace hbmsim::cli
