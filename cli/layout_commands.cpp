// plan layout and plan scale: the layout search's subcommands (their flags, held degrees and tables).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <set>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/run_flags.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/framework_settings.hpp"
#include "planner/layout_search.hpp"
#include "planner/plan_json.hpp"
#include "planner/scale_plan.hpp"

namespace hbmsim::cli {

namespace {

// A flag's comma-separated items, empty ones kept (each flag says why an empty item is bad).
std::vector<std::string> comma_items(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

// A held degree's flag text, one value or a comma-separated list, each read as the flag's own value would be
// ("--tp 4,8": 4 and 8; "--sharded-optimizer on": 1).
std::vector<std::int64_t> held_flag_values(const std::string& field, const std::string& text) {
  std::vector<std::int64_t> values;
  for (const std::string& item : comma_items(text)) {
    RunConfig c;
    c.set(field, item, flag_for_field(field));
    const nlohmann::json value = c.to_json()[field];
    values.push_back(value.is_boolean() ? value.get<bool>() : value.get<std::int64_t>());
  }
  return values;
}

// What a layout keeps in pinned host memory besides activations ("-": nothing).
std::string in_host(const RunConfig& c) {
  std::string s = c.optimizer_offload == "off" ? "" : "opt (" + c.optimizer_offload + ")";
  if (c.parameter_offload) s += s.empty() ? "params" : " + params";
  return s.empty() ? "-" : s;
}

// The options `plan layout` and `plan scale` share: how each count's search runs.
struct SearchFlags {
  int jobs = 2;
  std::vector<std::string> policies;
  std::vector<std::int64_t> micro_batches;
  bool no_prune = false, no_state_offload = false, json = false;
  std::string progress = "auto";
};

std::shared_ptr<SearchFlags> add_search_flags(CLI::App* cmd) {
  auto f = std::make_shared<SearchFlags>();
  cmd->add_option("--jobs", f->jobs, "Worker threads");
  auto defaults = [](const std::string& framework) {
    RunConfig c;
    c.framework = framework;
    std::string list;
    for (const auto& p : default_layout_policies(c)) list += (list.empty() ? "" : ", ") + p;
    return list;
  };
  cmd->add_option("--policies", f->policies,
                  "Policy presets to try (default: " + defaults("maxtext") + "; under --framework megatron " + defaults("megatron") + ")")
      ->delimiter(',');
  cmd->add_option("--micro-batches", f->micro_batches, "Micro-batch sizes to try (sequences per replica; default 1,2)")->delimiter(',');
  cmd->add_flag("--no-prune", f->no_prune, "Simulate every candidate, also those whose memory lower bound exceeds HBM");
  cmd->add_flag("--no-state-offload", f->no_state_offload,
                "Do not retry a layout that cannot fit with its optimizer state (then its parameters) in host memory");
  cmd->add_option("--progress", f->progress, kProgressHelp);
  cmd->add_flag("--json", f->json, "Machine-readable output");
  return f;
}

// The base config and the search's options from the flags: the degrees given as flags (a value or a
// comma-separated list) are held and come out of the flags first (a config file's values of them are searched);
// --policy and --micro-batch are one-item lists. `varied`: other fields the command sets itself.
std::pair<RunConfig, LayoutSearchOptions> resolve_search_flags(const RunFlags& flags, const SearchFlags& f, std::set<std::string> varied) {
  LayoutSearchOptions o;
  RunFlags rest = flags;
  varied.insert({"batch", "grad_accum", "microbatches"});
  for (const std::string& field : holdable_layout_fields()) {
    varied.insert(field);
    if (auto it = rest.values.find(field); it != rest.values.end()) {
      o.held[field] = held_flag_values(field, it->second);
      rest.values.erase(it);
    }
  }
  for (const char* field : {"policy", "micro_batch"})
    if (!flags.values.count(field)) varied.insert(field);
  auto base = resolve_run_flags(rest, varied);
  std::vector<std::string> policies = f.policies;
  std::vector<std::int64_t> mbs = f.micro_batches;
  if (flags.values.count("policy") && !policies.empty())
    throw InputError("--policy " + base.policy + " (with --policies: give the policies to try in one of them)");
  if (flags.values.count("micro_batch") && !mbs.empty())
    throw InputError("--micro-batch " + std::to_string(base.micro_batch) + " (with --micro-batches: give the sizes to try in one of them)");
  if (flags.values.count("policy")) policies = {base.policy};
  if (flags.values.count("micro_batch")) {
    if (base.micro_batch < 1) throw InputError("--micro-batch " + std::to_string(base.micro_batch) + " (must be at least 1)");
    mbs = {base.micro_batch};
  }
  for (auto& p : policies) (void)with_layout_policy(base, p, resolve_model(base.model));
  o.jobs = f.jobs;
  o.prune = !f.no_prune;
  o.state_offload = !f.no_state_offload;
  if (!policies.empty()) o.policies = policies;
  if (!mbs.empty()) o.micro_batches = mbs;
  return {base, o};
}

// Runs `check`; a message about a held degree or one of `fields` ("tp = 3 (...)") is renamed after its flag as
// typed ("--tp = 3 (...)"), the others (--top, --jobs: already flags) are left as they are.
void with_flag_names(const LayoutSearchOptions& o, const std::function<void()>& check, const std::set<std::string>& fields = {}) {
  try {
    check();
  } catch (const InputError& e) {
    const std::string m = e.what();
    const auto eq = m.find(" = ");
    const std::string field = eq == std::string::npos ? "" : m.substr(0, eq);
    if (field.empty() || (!o.held.count(field) && !fields.count(field))) throw;
    throw InputError(flag_for_field(field) + m.substr(eq));
  }
}

// A search's progress line on stderr under `what` (plan scale changes it at each count).
std::function<void(std::size_t, std::size_t)> search_progress(std::shared_ptr<const std::string> what, std::chrono::steady_clock::time_point start) {
  return [what, start](std::size_t done, std::size_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\r%s: %zu/%zu simulated  %.0f s   ", what->c_str(), done, total, s);
  };
}

// A layout's degree columns: tp, cp, pp, vp, ep (Nf folded experts, No combined 1F1B), fsdp, dp (* sharded optimizer).
std::vector<std::string> degree_cells(const RunConfig& c) {
  return {std::to_string(c.tp), std::to_string(c.cp), std::to_string(c.pp), std::to_string(c.vp),
          std::to_string(c.ep) + (folds_experts(c) ? "f" : "") + (c.ep_overlap ? "o" : ""), std::to_string(c.fsdp),
          std::to_string(c.dp) + (c.sharded_optimizer ? "*" : "")};
}

// The legend of the marks degree_cells puts on the layouts listed, as a line of its own ("": none is).
std::string marks_legend(const std::vector<const RunConfig*>& listed) {
  auto any = [&](bool (*marked)(const RunConfig&)) { return std::any_of(listed.begin(), listed.end(), [&](const RunConfig* c) { return marked(*c); }); };
  std::string legend;
  auto add = [&](const char* text) { legend += (legend.empty() ? "" : "; ") + std::string(text); };
  if (any([](const RunConfig& c) { return c.sharded_optimizer; })) add("dp*: optimizer state sharded over dp");
  if (any([](const RunConfig& c) { return folds_experts(c); }))
    add("ep Nf: expert tensor parallelism 1, experts whole over an expert group of N GPUs spanning tp (and cp, or part of it)");
  if (any([](const RunConfig& c) { return c.ep_overlap; }))
    add("ep No: expert all-to-alls overlapped with another micro-batch's compute (combined 1F1B, ep_overlap)");
  return legend.empty() ? "" : "(" + legend + ")\n";
}

// What a winner's line adds to its mesh: where folded experts live, combined 1F1B.
std::string layout_extra(const RunConfig& best) {
  std::string extra;
  if (folds_experts(best)) extra += ", experts whole over " + expert_group_span(training_shape(best).parallelism) + " = " + std::to_string(best.ep) + " GPUs";
  if (best.ep_overlap) extra += ", combined 1F1B";
  return extra;
}

void print_scale_plan(const RunConfig& base, const ScalePlanOptions& o, const ScalePlan& r, double seconds) {
  const double tokens_per_step = static_cast<double>(r.global_batch) * static_cast<double>(r.seq);
  std::string budget = r.tokens > 0 ? "; budget " + format_number(r.tokens / 1e12) + " T tokens" : "";
  if (r.days > 0) budget += " within " + format_number(r.days) + " days";
  const std::string held = o.search.held.empty() ? "" : "; held: " + held_text(held_fields(o.search));
  std::printf("scale: %s on %s GPUs, seq %lld, global batch %lld sequences (%.1f M tokens per step)%s%s (%.1f s)\n\n", base.model.c_str(),
              base.system.c_str(), static_cast<long long>(r.seq), static_cast<long long>(r.global_batch), tokens_per_step / 1e6, budget.c_str(),
              held.c_str(), seconds);
  std::vector<std::string> head = {"GPUs", "tp", "cp", "pp", "vp", "ep", "fsdp", "dp", "mbs", "GA", "policy", "step s", "tok/s/GPU", "tok/s", "scaling"};
  if (r.tokens > 0) head.insert(head.end(), {"days", "k GPU-hours"});
  head.insert(head.end(), {"HBM GiB", "limited by"});
  Table t{head, {}};
  t.text_last = true;
  std::vector<const RunConfig*> listed;
  std::vector<std::string> none;
  for (const ScaleRow& row : r.rows) {
    if (!row.fits()) {
      none.push_back(str(row.gpus) + " GPUs: " + row.search.none_fit);
      std::vector<std::string> cells(head.size(), "-");
      cells.front() = str(row.gpus);
      cells.back() = "nothing fits";
      t.rows.push_back(cells);
      continue;
    }
    const auto& [c, rep, limit] = row.search.top.front();
    listed.push_back(&c);
    std::vector<std::string> cells = {str(row.gpus)};
    for (auto& d : degree_cells(c)) cells.push_back(d);
    for (auto cell : {std::to_string(c.micro_batch), std::to_string(rep.grad_accum), layout_policy_label(c), fixed(rep.step_time_s, 2),
                      fixed(rep.tokens_per_s_per_device, 0), fixed(row.tokens_per_s(), 0), fixed(row.scaling, 2)})
      cells.push_back(cell);
    if (r.tokens > 0) cells.insert(cells.end(), {fixed(row.days, 1), fixed(row.gpu_hours / 1e3, 0)});
    cells.insert(cells.end(), {gib(rep.hbm_peak_bytes), limit});
    t.rows.push_back(cells);
  }
  std::cout << t.render();
  std::printf("%s", marks_legend(listed).c_str());
  for (const auto& why : none) std::printf("%s\n", why.c_str());
  if (r.days <= 0) return;
  if (r.fewest_within_days < 0) {
    std::printf("\nno count compared meets %s days\n", format_number(r.days).c_str());
    return;
  }
  for (const ScaleRow& row : r.rows)
    if (row.gpus == r.fewest_within_days) {
      std::printf("\nfewest GPUs within %s days: %lld (%.1f days, %s)\n", format_number(r.days).c_str(), static_cast<long long>(row.gpus), row.days,
                  row.search.top.front().report.mesh.c_str());
      print_settings(row.search.top.front().config);
    }
}

// `--system a,b,c`: the systems plan scale compares, in the order given (a name empty or given twice is refused).
std::vector<std::string> listed_systems(const std::string& text) {
  const std::vector<std::string> systems = comma_items(text);
  if (std::find(systems.begin(), systems.end(), "") != systems.end())
    throw InputError("--system = \"" + text + "\" (an empty name in the list)");
  if (auto twice = first_repeat(systems); twice != systems.end()) throw InputError("--system = \"" + text + "\" (" + *twice + " given twice)");
  return systems;
}

// Several systems' plans side by side: each one's answer (scale_answer), what it takes and how it is laid out.
void print_systems_compared(const std::vector<ScalePlan>& plans) {
  const ScalePlan& first = plans.front();
  std::string what = "the count with the most tokens/s";
  if (first.days > 0) what = "the fewest GPUs within " + format_number(first.days) + " days";
  std::printf("\nsystems compared (each at %s):\n", what.c_str());
  std::vector<std::string> head = {"system", "GPUs", "tok/s/GPU", "tok/s"};
  if (first.tokens > 0) head.insert(head.end(), {"days", "k GPU-hours"});
  head.push_back("layout");
  Table t{head, {}};
  t.text_last = true;
  for (const ScalePlan& plan : plans) {
    const ScaleRow* row = scale_answer(plan);
    std::vector<std::string> cells(head.size(), "-");
    cells.front() = plan.system;
    if (!row) {
      cells.back() = first.days > 0 ? "no count compared meets the deadline" : "nothing fits";
    } else {
      const StepReport& rep = row->search.top.front().report;
      cells[1] = str(row->gpus);
      cells[2] = fixed(rep.tokens_per_s_per_device, 0);
      cells[3] = fixed(row->tokens_per_s(), 0);
      if (first.tokens > 0) cells[4] = fixed(row->days, 1), cells[5] = fixed(row->gpu_hours / 1e3, 0);
      cells.back() = rep.mesh + ", policy " + layout_policy_label(row->search.top.front().config);
    }
    t.rows.push_back(cells);
  }
  std::cout << t.render();
}

}  // namespace

void register_layout_commands(CLI::App* plan) {
  {
    auto* cmd = plan->add_subcommand("layout", "Fastest parallel layout, micro-batch and policy for a model on N GPUs at a fixed global batch");
    auto flags = make_run_flags(cmd);
    auto search = add_search_flags(cmd);
    auto top = std::make_shared<std::int64_t>(10);
    cmd->add_option("--top", *top, "How many layouts to list");
    cmd->footer(
        "The global batch is --global-batch (default: one sequence per GPU); the search sets tp, cp, pp, vp, ep, fsdp, dp,\n"
        "the sharded optimizer, the micro-batch and the policy, and keeps every other field given. A degree given as a\n"
        "flag is held to that value or comma-separated list (--tp 8, --pp 4,8, --sharded-optimizer on), tried even\n"
        "where the search would not try it;\n"
        "--policy and --micro-batch are one-item --policies and --micro-batches (a config file's degrees are searched,\n"
        "as a saved run names them all). For an MoE model under\n"
        "--framework megatron it also tries expert tensor parallelism 1 wherever tp > 1 (experts whole over an expert\n"
        "group spanning tp, listed as ep Nf) and combined 1F1B where Megatron allows it (ep No); --expert-tp 1 folds\n"
        "every such layout, --ep-overlap on overlaps every one it can. A policy may name Megatron recompute modules\n"
        "after no_recompute or selective, joined by +: no_recompute+moe_act+layernorm (tried by default where the\n"
        "model has them under --framework megatron).\n"
        "Examples:\n"
        "  hbmsim plan layout --model llama3.1-405b --gpus 1024 --system gb200-nvl72 --seq 8192\n"
        "  hbmsim plan layout --model llama3.1-70b --gpus 64 --global-batch 256 --seq 8192 --weights fp8 --top 5");
    cmd->callback([=] {
      // (not a structured binding: clang cannot capture those in a lambda)
      auto resolved = resolve_search_flags(*flags, *search, {});
      const RunConfig base = std::move(resolved.first);
      LayoutSearchOptions o = std::move(resolved.second);
      o.top = *top;
      with_flag_names(o, [&] {
        check_layout_options(o);
        check_held_layout(base, o);
      });
      const auto start = std::chrono::steady_clock::now();
      const bool show = progress_wanted(search->progress);
      if (show) o.progress = search_progress(std::make_shared<const std::string>("plan layout"), start);
      const std::string held_note = o.held.empty() ? "" : "; held: " + held_text(held_fields(o));
      if (!search->json)
        std::printf("search: %s on %lld x %s GPUs, seq %lld, global batch %lld sequences%s\n", base.model.c_str(),
                    static_cast<long long>(base.gpus), base.system.c_str(), static_cast<long long>(base.seq),
                    static_cast<long long>(base.global_batch > 0 ? base.global_batch : base.gpus), held_note.c_str());
      auto r = search_layouts(base, o);
      if (show) std::fprintf(stderr, "\n");
      if (search->json) {
        std::cout << dump_json(layout_search_json(r), 2) << "\n";
        return;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%zu candidates (%zu of them state-offload retries of layouts that cannot fit): %zu refused, %zu pruned by the "
                  "memory bound, %zu by the step-time bound; %zu simulated, %zu fit (%.1f s)\n\n",
                  r.candidates, r.offloaded, r.refused, r.pruned, r.skipped, r.simulated, r.fitting, s);
      if (r.top.empty()) {
        std::printf("%s\n", r.none_fit.c_str());
        return;
      }
      Table t{{"#", "tp", "cp", "pp", "vp", "ep", "fsdp", "dp", "mbs", "GA", "policy", "in host", "tok/s/GPU", "TFLOP/s", "HBM GiB", "host GiB", "limited by"}, {}};
      t.text_last = true;
      for (std::size_t i = 0; i < r.top.size(); ++i) {
        const auto& [c, rep, limit] = r.top[i];
        auto row = degree_cells(c);
        row.insert(row.begin(), std::to_string(i + 1));
        for (auto cell : {std::to_string(c.micro_batch), std::to_string(rep.grad_accum), layout_policy_label(c), in_host(c), fixed(rep.tokens_per_s_per_device, 0),
                          fixed(rep.tflops_per_device, 1), gib(rep.hbm_peak_bytes), gib(rep.host_peak_bytes), limit})
          row.push_back(cell);
        t.rows.push_back(row);
      }
      std::cout << t.render();
      std::vector<const RunConfig*> listed;
      for (const auto& x : r.top) listed.push_back(&x.config);
      const RunConfig& best = r.top[0].config;
      std::printf("%s\nfastest: %s%s, policy %s, micro-batch %lld\n", marks_legend(listed).c_str(), r.top[0].report.mesh.c_str(),
                  layout_extra(best).c_str(), layout_policy_label(best).c_str(), static_cast<long long>(best.micro_batch));
      print_settings(r.top[0].config);
    });
  }
  {
    auto* cmd = plan->add_subcommand("scale", "Fastest layout at each of several GPU counts at one global batch, and the days and GPU-hours a token budget takes");
    auto flags = make_run_flags(cmd);
    auto search = add_search_flags(cmd);
    auto tokens = std::make_shared<double>(0);
    auto days = std::make_shared<double>(0);
    cmd->add_option("--tokens", *tokens, "Training budget in tokens (e.g. 15e12): days and GPU-hours at each count (0: none)");
    cmd->add_option("--days", *days, "Deadline in days (needs --tokens): the fewest GPUs that meet it (0: none)");
    cmd->footer(
        "--gpus takes the counts to compare, comma-separated. Each count is a plan layout search (its fastest layout,\n"
        "the same flags: held degrees, --policies, --micro-batches), all at one global batch: --global-batch, default\n"
        "one sequence per GPU at the largest count. Days are the budget over the simulated tokens/s (no restarts,\n"
        "checkpoints or evaluation); scaling is tokens/s per GPU over the smallest count's that fits. --system takes\n"
        "several systems, comma-separated: a plan for each, then each one's answer side by side (the fewest GPUs within\n"
        "--days, else the count with the most tokens/s).\n"
        "Examples:\n"
        "  hbmsim plan scale --model llama3.1-405b --system gb200-nvl72 --seq 8192 --gpus 512,1024,2048 --global-batch 2048 --tokens 15e12\n"
        "  hbmsim plan scale --model llama3.1-70b --system h100-hgx --seq 8192 --gpus 64,128,256 --tokens 2e12 --days 30 --framework megatron\n"
        "  hbmsim plan scale --model llama3.1-405b --system gb200-nvl72,gb300-nvl72,vr-nvl144 --seq 8192 --gpus 1024,2048,4096 --tokens 15e12 --days 100");
    cmd->callback([=] {
      RunFlags rest = *flags;
      ScalePlanOptions o;
      if (auto it = rest.values.find("gpus"); it != rest.values.end()) {
        o.gpu_counts = held_flag_values("gpus", it->second);
        rest.values.erase(it);
      }
      // Every system resolved and checked before any is searched, so that a bad one is named as typed at once.
      std::vector<RunConfig> bases;
      const auto given = rest.values.find("system");
      for (const std::string& system : given == rest.values.end() ? std::vector<std::string>{""} : listed_systems(given->second)) {
        if (!system.empty()) rest.values["system"] = system;
        auto resolved = resolve_search_flags(rest, *search, {"gpus"});
        bases.push_back(std::move(resolved.first));
        o.search = std::move(resolved.second);
      }
      o.tokens = *tokens;
      o.days = *days;
      if (o.gpu_counts.empty()) o.gpu_counts = {bases.front().gpus};
      for (const RunConfig& base : bases) with_flag_names(o.search, [&] { check_scale_options(base, o); }, {"gpus", "tokens", "days"});
      const auto start = std::chrono::steady_clock::now();
      auto current = std::make_shared<std::string>();
      std::string system_label;  // "gb200-nvl72, " in the progress line when several systems are compared
      if (progress_wanted(search->progress)) {
        o.on_count = [current, &system_label](std::int64_t gpus, std::size_t i, std::size_t n) {
          *current = "plan scale: " + system_label + str(gpus) + " GPUs (" + str(static_cast<std::int64_t>(i + 1)) + " of " + str(static_cast<std::int64_t>(n)) + ")";
          std::fprintf(stderr, "%s%s", i ? "\n" : "", current->c_str());
        };
        o.search.progress = search_progress(current, start);
        o.on_row = [current](const ScaleRow& row) {  // what this count found, before the next one starts
          std::fprintf(stderr, "\r%s: %s   ", current->c_str(),
                       row.fits() ? (fixed(row.search.top[0].report.tokens_per_s_per_device, 0) + " tokens/s per GPU, " + row.search.top[0].report.mesh).c_str()
                                  : "nothing fits");
        };
      }
      std::vector<ScalePlan> plans;
      for (const RunConfig& base : bases) {
        if (bases.size() > 1) system_label = base.system + ", ";
        const auto began = std::chrono::steady_clock::now();
        plans.push_back(plan_scale(base, o));
        if (o.on_count) std::fprintf(stderr, "\n");
        if (search->json) continue;
        if (plans.size() > 1) std::printf("\n");
        print_scale_plan(base, o, plans.back(), std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
        std::fflush(stdout);  // each system's answer as it comes
      }
      if (search->json) {
        nlohmann::json all = nlohmann::json::array();
        for (const ScalePlan& plan : plans) all.push_back(scale_plan_json(plan));
        std::cout << dump_json(plans.size() > 1 ? nlohmann::json{{"systems", all}} : all.front(), 2) << "\n";
      } else if (plans.size() > 1) {
        print_systems_compared(plans);
      }
    });
  }
}

}  // namespace hbmsim::cli
