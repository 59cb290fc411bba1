#include "cli/commands.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "cli/format.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/run_config.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim::cli {

namespace {

int g_exit_status = 0;

// Writes through a temporary file and a rename, so a reader never sees half a file.
void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(path + ": cannot be written");
    out << text;
    out.flush();
    if (!out) throw InputError(path + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw InputError(path + ": rename failed (" + ec.message() + ")");
}

}  // namespace

int exit_status() { return g_exit_status; }

// Flags shared by simulate, sweep and plan: each maps to one RunConfig field.
struct RunFlags {
  std::string config_file;
  std::map<std::string, std::string> values;  // field -> text, only the flags given
  std::vector<std::string> tensors;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--config", config_file, "Run configuration JSON; flags override its fields");
    struct F { const char* flag; const char* field; const char* help; };
    static const F flags[] = {
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
        {"--policy", "policy", "full, minimal, minimal_with_context, save_qkv_proj, qkv_proj_offloaded, minimal_offloaded, custom"},
        {"--lhs", "lhs", "Latency-hiding scheduler: on or off"},
        {"--pipelined-transfers", "pipelined_transfers", "Pipelined host offloading: on or off"},
        {"--memory-limit-slop", "memory_limit_slop", "Fraction of HBM the LHS may plan for (0.95)"},
        {"--host-link-bw", "host_link_bytes_per_s", "What-if: host-link bytes/s per GPU per direction"},
        {"--hbm-bytes", "hbm_bytes", "What-if: HBM capacity in bytes"},
        {"--calibration", "calibration", "Calibration profile JSON (or built-in profile name)"},
    };
    for (const auto& f : flags) {
      std::string field = f.field;
      cmd->add_option_function<std::string>(f.flag, [this, field](const std::string& v) { values[field] = v; }, f.help);
    }
    cmd->add_option("--tensor", tensors, "Per checkpoint name: NAME=device|remat|offload (repeatable)");
  }

  RunConfig resolve() const {
    RunConfig c = config_file.empty() ? RunConfig{} : RunConfig::from_file(config_file);
    for (auto& [field, v] : values) c.set(field, v, "--" + field);
    for (auto& t : tensors) {
      auto eq = t.find('=');
      if (eq == std::string::npos || eq == 0) throw InputError("--tensor " + t + " (expected NAME=device|remat|offload)");
      c.tensors[t.substr(0, eq)] = t.substr(eq + 1);
    }
    return c;
  }
};

void print_report(const StepReport& r) {
  std::printf("system %s, model %s, policy %s\n", r.system_id.c_str(), r.model_id.c_str(), r.policy.c_str());
  std::printf("step time           %10.3f s\n", r.step_time_s);
  std::printf("model TFLOP/s/dev   %10.1f   (MFU %.1f%%)\n", r.tflops_per_device, 100 * r.mfu);
  std::printf("fits                %10s   %s\n", r.fits ? "yes" : "NO", r.fits_reason.c_str());
  std::printf("HBM peak            %10s GiB of %s GiB at t=%.3f s\n", gib(r.hbm_peak_bytes).c_str(),
              gib(r.hbm_capacity_bytes).c_str(), r.hbm_peak_time_s);
  for (auto& [k, v] : r.hbm_breakdown_bytes)
    if (v > 0) std::printf("  %-18s%10s GiB\n", k.c_str(), gib(v).c_str());
  std::printf("pinned host peak    %10s GiB of %s GiB\n", gib(r.host_peak_bytes).c_str(), gib(r.host_capacity_bytes).c_str());
  std::printf("exposed (compute waited on):");
  for (auto& [k, v] : r.exposed_s) std::printf("  %s %.3f s", k.c_str(), v);
  std::printf("\n");
}

void register_commands(CLI::App& app) {
  // systems
  {
    auto* cmd = app.add_subcommand("systems", "List built-in systems with their key figures");
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([json] {
      auto arr = nlohmann::json::array();
      Table t{{"system", "GPU", "HBM GB", "HBM TB/s", "bf16 PF", "fp8 PF", "nvfp4 PF", "host link", "H2D GB/s/GPU", "D2H GB/s/GPU", "NVLink GB/s/dir", "domain"}, {}};
      for (auto& id : builtin_system_ids()) {
        auto s = builtin_system(id);
        arr.push_back(s.summary_json());
        auto pf = [&](Dtype d) { auto it = s.gpu.dense_peak_flops.find(d); return it == s.gpu.dense_peak_flops.end() ? std::string("-") : fixed(it->second / 1e15, 2); };
        t.rows.push_back({s.id, s.gpu.name, fixed(s.gpu.hbm_bytes / 1e9, 0), fixed(s.gpu.hbm_bandwidth_bytes_per_s / 1e12, 2),
                          pf(Dtype::bf16), pf(Dtype::fp8), pf(Dtype::nvfp4), s.host_link.name,
                          fixed(s.host_h2d_bytes_per_s() / 1e9, 1), fixed(s.host_d2h_bytes_per_s() / 1e9, 1),
                          fixed(s.scale_up.per_gpu_bytes_per_s_per_direction / 1e9, 0), std::to_string(s.scale_up.domain_gpus)});
      }
      if (*json) std::cout << arr.dump(2) << "\n";
      else std::cout << t.render();
    });
  }
  // models
  {
    auto* cmd = app.add_subcommand("models", "List built-in models");
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([json] {
      auto arr = nlohmann::json::array();
      Table t{{"model", "architecture", "layers", "d_model", "params B", "activated B"}, {}};
      for (auto& id : builtin_model_ids()) {
        auto m = builtin_model(id);
        auto j = m.to_json();
        j["total_params"] = m.total_params();
        j["activated_params"] = m.activated_params();
        arr.push_back(j);
        t.rows.push_back({m.id, to_string(m.architecture), std::to_string(m.num_layers), std::to_string(m.d_model),
                          fixed(m.total_params() / 1e9, 1), fixed(m.activated_params() / 1e9, 1)});
      }
      if (*json) std::cout << arr.dump(2) << "\n";
      else std::cout << t.render();
    });
  }
  // graph
  {
    auto* cmd = app.add_subcommand("graph", "Write one layer's op graph (Graphviz DOT) or tensor table");
    auto flags = std::make_shared<RunFlags>();
    flags->add_to(cmd);
    auto layer = std::make_shared<std::int64_t>(0);
    auto dot = std::make_shared<bool>(false);
    cmd->add_option("--layer", *layer, "Layer index");
    cmd->add_flag("--dot", *dot, "Graphviz DOT output");
    cmd->callback([flags, layer, dot] {
      auto run = prepare_run(flags->resolve());
      const auto& g = run.graph;
      if (*layer < 0 || *layer >= g.model.num_layers)
        throw InputError("--layer = " + std::to_string(*layer) + " (model has " + std::to_string(g.model.num_layers) + " layers)");
      const auto& t = g.layer(*layer);
      if (*dot) {
        std::cout << layer_dot(t, g.model.id + " layer " + std::to_string(*layer) + " (" + t.kind + ")");
        return;
      }
      Table tab{{"tensor", "MiB", "checkpoint", "placement"}, {}};
      for (auto& tensor : t.tensors)
        tab.rows.push_back({tensor.name, fixed(tensor.bytes / 1048576.0, 1), tensor.checkpoint ? "yes" : "",
                            tensor.checkpoint ? to_string(run.policy.placement(tensor.name)) : "remat"});
      std::cout << tab.render();
    });
  }
  // simulate
  {
    auto* cmd = app.add_subcommand("simulate", "Simulate one training step on one device");
    auto flags = std::make_shared<RunFlags>();
    flags->add_to(cmd);
    auto json = std::make_shared<bool>(false);
    auto trace = std::make_shared<std::string>();
    cmd->add_flag("--json", *json, "Print the report as one JSON object");
    cmd->add_option("--trace", *trace, "Write a Chrome/Perfetto trace JSON to this file");
    cmd->callback([flags, json, trace] {
      auto config = flags->resolve();
      auto report = run_simulation(config, !trace->empty());
      if (!trace->empty()) write_file_atomically(*trace, report.trace.dump() + "\n");
      if (*json) {
        auto j = report.to_json();
        j["config"] = config.to_json();
        std::cout << j.dump(2) << "\n";
      } else {
        print_report(report);
      }
    });
  }
  register_planner_commands(app);
}

}  // namespace hbmsim::cli
