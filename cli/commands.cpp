#include "cli/commands.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "cli/files.hpp"
#include "cli/format.hpp"
#include "cli/run_flags.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/run_config.hpp"
#include "planner/run_fields.hpp"
#include "planner/run_summary.hpp"
#include "sim/layer_plan.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim::cli {

namespace {

int g_exit_status = 0;

// The per-stage table of a pipelined step.
void print_stages(const StepReport& r) {
  Table t{{"stage", "layers", "HBM GiB", "saved act GiB", "host GiB", "compute s", "idle s", "bubble s", "bubble", "fits"}, {}};
  for (const auto& st : r.stages)
    t.rows.push_back({std::to_string(st.stage), st.layers, gib(st.hbm_peak_bytes), gib(st.hbm_breakdown_bytes.at("saved_activations")),
                      gib(st.host_peak_bytes), fixed(st.compute_busy_s, 3), fixed(st.idle_s, 3), fixed(st.bubble_s, 3),
                      fixed(100 * st.bubble_s / r.step_time_s, 1) + "%", st.fits ? "yes" : "NO"});
  std::printf("pipeline stages (idle: the step less the stage's compute; bubble: the part spent waiting on other stages "
              "and draining)\n%s", t.render().c_str());
}

// The `top` largest buffers each stage's HBM holds at its peak, and what the rest add up to.
void print_peak_buffers(const StepReport& r, int top) {
  for (const auto& st : r.stages) {
    std::printf("\nHBM at the peak%s (%s GiB at t=%.3f s): the %d largest of %zu buffers\n",
                r.stages.size() > 1 ? (" of stage " + std::to_string(st.stage)).c_str() : "", gib(st.hbm_peak_bytes).c_str(),
                st.hbm_peak_time_s, std::min<int>(top, static_cast<int>(st.peak_buffers.size())), st.peak_buffers.size());
    Table t{{"GiB", "category", "alive from s", "to s", "made by"}, {}, true};
    double rest = 0;
    for (std::size_t i = 0; i < st.peak_buffers.size(); ++i) {
      const PeakBuffer& b = st.peak_buffers[i];
      if (static_cast<int>(i) >= top) {
        rest += b.bytes;
        continue;
      }
      t.rows.push_back({gib(b.bytes, 3), b.category, fixed(b.alloc_s, 4), b.free_s < 0 ? "end" : fixed(b.free_s, 4), b.made_by});
    }
    if (rest > 0) t.rows.push_back({gib(rest, 3), "", "", "", "the other " + std::to_string(st.peak_buffers.size() - static_cast<std::size_t>(top)) + " buffers"});
    std::printf("%s", t.render().c_str());
  }
}

// A capacity too small to show in GiB (a what-if typed in GB: --hbm-bytes 288) is shown in bytes, not as 0.0.
std::string capacity(double bytes) {
  return bytes >= 0.05 * 1073741824.0 ? gib(bytes) + " GiB" : format_number(bytes) + " bytes";
}

}  // namespace

int exit_status() { return g_exit_status != 0 ? g_exit_status : plan_exit_status(); }

void print_warnings(const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) std::fprintf(stderr, "hbmsim: warning: %s\n", w.c_str());
}

nlohmann::json announce_run(const RunConfig& config, bool human, const char* title) {
  const auto prepared = prepare_run(config);
  print_warnings(run_warnings(config, prepared));
  auto run = resolved_run(config, prepared);
  if (human) {
    if (title) std::printf("%s\n", title);
    for (const auto& line : resolved_run_lines(run)) std::printf("%s\n", line.c_str());
    std::printf("\n");
  }
  return run;
}

void print_report(const StepReport& r, const nlohmann::json& run) {
  for (const auto& line : resolved_run_lines(run)) std::printf("%s\n", line.c_str());
  std::printf("tokens/device       %10.0f per step\n", r.tokens_per_device_per_step);
  std::printf("step time           %10.3f s\n", r.step_time_s);
  std::printf("model TFLOP/s/dev   %10.1f   (MFU %.1f%%)\n", r.tflops_per_device, 100 * r.mfu);
  std::printf("tokens/s/dev        %10.1f\n", r.tokens_per_s_per_device);
  std::printf("fits                %10s%s%s\n", r.fits ? "yes" : "NO", r.fits_reason.empty() ? "" : "   ", r.fits_reason.c_str());
  std::printf("HBM peak            %10s GiB of %s at t=%.3f s\n", gib(r.hbm_peak_bytes).c_str(),
              capacity(r.hbm_capacity_bytes).c_str(), r.hbm_peak_time_s);
  for (auto& [k, v] : r.hbm_breakdown_bytes)
    if (v > 0) std::printf("  %-18s%10s GiB\n", k.c_str(), gib(v).c_str());
  std::printf("pinned host peak    %10s GiB of %s\n", gib(r.host_peak_bytes).c_str(), capacity(r.host_capacity_bytes).c_str());
  // Queues the step used, in report order: how long compute waited on each, and what each sent.
  std::string exposed, sent;
  for (const auto& q : report_queues()) {
    if (q == "compute" || r.busy_s.at(q) <= 0) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, "  %s %.3f s", q.c_str(), r.exposed_s.at(q));
    exposed += buf;
    if (auto it = r.comm_bytes.find(q); it != r.comm_bytes.end() && it->second > 0) {
      std::snprintf(buf, sizeof buf, "  %s %s GiB", q.c_str(), gib(it->second).c_str());
      sent += buf;
    }
  }
  const char* mean = r.stages.size() > 1 ? " (mean over stages)" : "";
  // Where the compute stream's time goes: its phases, then what is left of the step (waits and the bubble).
  std::string phases;
  double busy = 0;
  for (const auto& name : report_phases()) {
    const double s = r.compute_s.at(name);
    busy += s;
    if (s <= 0) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, "  %s %.3f s", name.c_str(), s);
    phases += buf;
  }
  std::printf("compute time%s:%s  idle %.3f s\n", mean, phases.c_str(), std::max(0.0, r.step_time_s - busy));
  std::printf("exposed (compute waited on)%s:%s\n", mean, exposed.empty() ? "  nothing" : exposed.c_str());
  if (!sent.empty()) std::printf("sent per device%s:%s\n", mean, sent.c_str());
  if (r.stages.size() > 1) print_stages(r);
}

void register_commands(CLI::App& app) {
  // systems
  {
    auto* cmd = app.add_subcommand("systems", "List built-in systems with their key figures");
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([json] {
      auto arr = nlohmann::json::array();
      Table t{{"system", "GPU", "HBM GiB", "HBM TB/s", "bf16 PF", "fp8 PF", "nvfp4 PF", "host link", "H2D GB/s/GPU", "D2H GB/s/GPU", "NVLink GB/s/dir", "domain"}, {}};
      for (auto& id : builtin_system_ids()) {
        auto s = builtin_system(id);
        arr.push_back(s.summary_json());
        auto pf = [&](Dtype d) { auto it = s.gpu.dense_peak_flops.find(d); return it == s.gpu.dense_peak_flops.end() ? std::string("-") : fixed(it->second / 1e15, 2); };
        t.rows.push_back({s.id, s.gpu.name, gib(s.gpu.hbm_bytes), fixed(s.gpu.hbm_bandwidth_bytes_per_s / 1e12, 2),
                          pf(Dtype::bf16), pf(Dtype::fp8), pf(Dtype::nvfp4), s.host_link.name,
                          fixed(s.host_h2d_bytes_per_s() / 1e9, 1), fixed(s.host_d2h_bytes_per_s() / 1e9, 1),
                          fixed(s.scale_up.per_gpu_bytes_per_s_per_direction / 1e9, 0), std::to_string(s.scale_up.domain_gpus)});
      }
      if (*json) std::cout << dump_json(arr, 2) << "\n";
      else std::cout << t.render();
    });
  }
  // models
  {
    auto* cmd = app.add_subcommand("models", "List the shipped models: built-in specs and HuggingFace configs");
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->callback([json] {
      auto arr = nlohmann::json::array();
      Table t{{"model", "name", "layers", "d_model", "params B", "activated B", "window", "chunk"}, {}};
      auto tokens = [](const nlohmann::json& j, const char* key) {
        const auto n = j.value(key, std::int64_t{0});
        return n > 0 ? std::to_string(n) : std::string("-");
      };
      for (auto& name : shipped_model_names()) {
        auto j = model_summary(name);
        t.rows.push_back({name, j.at("name").get<std::string>(), std::to_string(j.at("num_layers").get<std::int64_t>()),
                          std::to_string(j.at("d_model").get<std::int64_t>()), fixed(j.at("total_params").get<double>() / 1e9, 1),
                          fixed(j.at("activated_params").get<double>() / 1e9, 1), tokens(j, "sliding_window"),
                          tokens(j, "attention_chunk")});
        arr.push_back(std::move(j));
      }
      if (*json) std::cout << dump_json(arr, 2) << "\n";
      else std::cout << t.render();
    });
  }
  // fields
  {
    auto* cmd = app.add_subcommand("fields", "List every run field: config key, flag, type, default, meaning");
    auto json = std::make_shared<bool>(false);
    auto markdown = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Machine-readable output");
    cmd->add_flag("--markdown", *markdown, "A Markdown table (docs/run-fields.md)");
    cmd->callback([json, markdown] {
      if (*json) {
        std::cout << dump_json(run_fields_json(), 2) << "\n";
      } else if (*markdown) {
        std::cout << run_fields_markdown();
      } else {
        Table t{{"field", "flag", "type", "default", "meaning"}, {}};
        t.text_last = true;
        for (const auto& f : run_fields_json())
          t.rows.push_back({f["name"], f["flag"], f["type"], f["default"], f["help"]});
        std::cout << t.render();
      }
    });
  }
  // graph
  {
    auto* cmd = app.add_subcommand("graph", "Write one layer's op graph (Graphviz DOT) or tensor table");
    auto flags = make_run_flags(cmd);
    auto layer = std::make_shared<std::int64_t>(0);
    auto dot = std::make_shared<bool>(false);
    cmd->add_option("--layer", *layer, "Layer index");
    cmd->add_flag("--dot", *dot, "Graphviz DOT output");
    cmd->callback([flags, layer, dot] {
      auto run = prepare_run(resolve_run_flags(*flags));
      const auto& g = run.graph;
      if (*layer < 0 || *layer >= g.model.num_layers)
        throw InputError("--layer = " + std::to_string(*layer) + " (model has " + std::to_string(g.model.num_layers) +
                         " layers, numbered from 0: expected 0 to " + std::to_string(g.model.num_layers - 1) + ")");
      const auto& t = g.layer(*layer);
      std::size_t stage = 0;
      for (const auto& c : g.chunks)
        if (*layer >= c.first_layer && *layer < c.end_layer) stage = static_cast<std::size_t>(c.stage);
      const Policy& policy = run.policy.for_layer(*layer, stage);
      if (*dot) {
        std::cout << layer_dot(t, g.model.id + " layer " + std::to_string(*layer) + " (" + t.kind + ")");
        return;
      }
      std::vector<Placement> placement;
      std::vector<bool> needed;
      std::vector<int> producer;
      place_tensors(t, policy, placement, needed, producer);
      Table tab{{"tensor", "MiB", "checkpoint", "placement"}, {}};
      for (std::size_t k = 0; k < t.tensors.size(); ++k)
        tab.rows.push_back({t.tensors[k].name, fixed(t.tensors[k].bytes / 1048576.0, 1),
                            t.tensors[k].checkpoint ? "yes" : is_module_tensor_name(t.tensors[k].name) ? "module" : "",
                            to_string(placement[k])});
      std::cout << tab.render();
    });
  }
  // simulate
  {
    auto* cmd = app.add_subcommand("simulate", "Simulate one training step: a device of each pipeline stage, every op and transfer");
    auto flags = make_run_flags(cmd);
    auto json = std::make_shared<bool>(false);
    auto trace = std::make_shared<std::string>();
    auto every_event = std::make_shared<bool>(false);
    auto top = std::make_shared<int>(0);
    cmd->add_flag("--json", *json, "Print the report as one JSON object");
    cmd->add_option("--trace", *trace, "Write a Chrome/Perfetto trace JSON to this file");
    cmd->add_option("--peak-buffers", *top,
                    "List the N largest buffers each stage's HBM holds at its peak, with the op that made each and when it "
                    "lives (the JSON report then has every one, under peak_buffers; 0: none)");
    cmd->add_flag("--no-fast-forward", *every_event,
                  "Build every layer iteration and simulate every event instead of copying and replaying repeating "
                  "ones (same results)");
    cmd->callback([flags, json, trace, every_event, top] {
      if (*top < 0) throw InputError("--peak-buffers = " + std::to_string(*top) + " (must be 0 or more)");
      if (!trace->empty()) check_writable(*trace);
      auto res = simulate_resolved(resolve_run_flags(*flags), !trace->empty() || *top > 0, !*every_event);
      print_warnings(res.warnings);
      if (!trace->empty()) write_file_atomically(*trace, res.report.trace);
      if (*json) {
        std::cout << dump_json(res.to_json(), 2) << "\n";
      } else {
        print_report(res.report, res.run);
        if (*top > 0) print_peak_buffers(res.report, *top);
      }
    });
  }
  register_planner_commands(app);
}

}  // namespace hbmsim::cli
