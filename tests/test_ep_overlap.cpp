// Megatron's expert-parallel all-to-all overlap (ep_overlap, combined 1F1B): the schedule's extra warm-up and
// merged pairs, the issue order of a merged layer pair, and what it changes in a simulated step.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <tuple>

#include "helpers.hpp"
#include "planner/run_config.hpp"
#include "sim/layer_plan.hpp"
#include "sim/pipeline_schedule.hpp"
#include "sim/program_builder.hpp"

using namespace hbmsim;

namespace {

// DeepSeek-V3 without pipelining on 8 GB200s, ep 8, two micro-batches per step: the backward of the first and
// the forward of the second run merged. no_recompute: a backward layer has no recomputed all-to-alls.
RunConfig two_microbatches() {
  RunConfig c;
  c.model = "deepseek-v3-671b";
  c.system = "gb200-nvl72";
  c.framework = "megatron";
  c.gpus = 8;
  c.ep = 8;
  c.fsdp = 1;
  c.seq = 4096;
  c.micro_batch = 1;
  c.global_batch = 16;  // 8 replicas (ep ranks are data-parallel replicas of the other weights) x 2 micro-batches
  c.policy = "no_recompute";
  c.ep_shards_weights = false;
  return c;
}

}  // namespace

TEST_CASE("combined 1F1B warms up one forward more and merges each steady forward with the backward after it",
          "[pipeline][ep_overlap]") {
  // Interleaved 1F1B at p 4, v 2, 8 micro-batches (16 virtual ones): stage s warms up with (p - s - 1) x 2 +
  // (v - 1) x p forwards, 10, 8, 6, 4; combined, one more (Megatron's schedules.py), and every steady
  // forward is merged with the backward that follows it: 16 - 11, 16 - 9, 16 - 7, 16 - 5 pairs.
  const auto plain = pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 2, 8);
  const auto combined = pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 2, 8, true);
  const int warmup[] = {11, 9, 7, 5};
  for (int s = 0; s < 4; ++s) {
    INFO("stage " << s);
    const auto& t = combined[static_cast<std::size_t>(s)];
    std::map<std::tuple<int, int, char>, int> seen;
    for (const auto& task : t) ++seen[{task.microbatch, task.chunk, static_cast<char>(task.pass)}];
    CHECK(seen.size() == 32);  // every (micro-batch, chunk, direction) once
    int leading = 0;
    while (t[static_cast<std::size_t>(leading)].pass == Pass::forward) ++leading;
    CHECK(leading == warmup[s] + 1);  // the warm-up, then the first merged forward
    int merged = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (!t[i].merged_with_next) continue;
      ++merged;
      REQUIRE(i + 1 < t.size());
      CHECK(t[i].pass == Pass::forward);
      CHECK(t[i + 1].pass == Pass::backward);
      CHECK(t[i].microbatch != t[i + 1].microbatch);
      CHECK(!t[i + 1].merged_with_next);
    }
    CHECK(merged == 16 - warmup[s]);
    for (const auto& task : plain[static_cast<std::size_t>(s)]) CHECK(!task.merged_with_next);
  }
  // Why the extra forward: without it the last stage's first steady pair is micro-batch 0's last chunk,
  // forward then backward, which could not run merged.
  const auto& last = plain[3];
  CHECK(last[4] == PipelineTask{0, 1, Pass::forward});
  CHECK(last[5] == PipelineTask{0, 1, Pass::backward});
  // Without pipelining (Megatron's combined_1f1b_schedule_for_no_pipelining): F0, then B0 with F1, B1 with F2,
  // B2 with F3, then B3 alone.
  const auto one = pipeline_schedule(PipelineSchedule::one_f_one_b, 1, 1, 4, true)[0];
  REQUIRE(one.size() == 8);
  for (std::size_t i = 0; i < one.size(); ++i) {
    INFO("task " << i);
    CHECK(one[i].merged_with_next == (one[i].pass == Pass::backward && one[i].microbatch < 3));
  }
}

TEST_CASE("a merged layer pair issues its parts backward first, alternating at each all-to-all", "[ep_overlap]") {
  // Megatron-Core's schedule_layer_1f1b issues, for a forward layer and a backward layer of another
  // micro-batch: the backward's part before its first all-to-all (combine's backward), the forward's attention
  // and routing (before dispatch), the backward's expert part, the forward's experts, the backward's attention
  // part, the forward's tail. Pass 0's backward and pass 1's forward are paired layer for layer from opposite
  // ends: step 30 pairs the forward of layer 30 with the backward of layer 60 - 30 = 30.
  RunConfig c = two_microbatches();
  c.ep_overlap = true;
  const PreparedRun run = prepare_run(c);
  std::vector<std::string> names;
  const sim::Program p = build_program(run.graph, run.system, run.policy, run.options, &names);
  REQUIRE(p.issue_order.size() == p.ops.size());
  CHECK(p.iterations.empty());  // no fast-forward marks in a reordered program
  // The pair's ops in program order: from the first backward op (micro-batch 0's) to the first backward op
  // after micro-batch 1's forward.
  auto find = [&](std::size_t from, auto pred) {
    while (from < p.ops.size() && !pred(p.ops[from])) ++from;
    return from;
  };
  auto backward = [](const sim::ProgramOp& op) { return op.phase == 'b'; };
  const std::size_t first = find(0, backward);
  const std::size_t last = find(find(first, [](const sim::ProgramOp& op) { return op.phase == 'f'; }), backward);
  REQUIRE(last < p.ops.size());
  std::string compute, ep;  // the passes of layer 30's ops, in issue order, one letter per run
  for (int i : p.issue_order) {
    const auto& op = p.ops[static_cast<std::size_t>(i)];
    if (static_cast<std::size_t>(i) < first || static_cast<std::size_t>(i) >= last || op.layer != 30 || op.phase == 'c') continue;
    const char pass = op.phase == 'f' ? 'F' : 'B';
    std::string& runs = op.queue == sim::kComputeQueue ? compute : p.queues[op.queue].name == "ep" ? ep : names[0];
    if (&runs != &names[0] && (runs.empty() || runs.back() != pass)) runs += pass;
  }
  CHECK(compute == "BFBFBF");
  CHECK(ep == "BFBF");
}

TEST_CASE("ep_overlap hides all-to-all time without changing the work", "[ep_overlap]") {
  // The same two micro-batches with and without the merged order: the same model and executed FLOPs, at least
  // as much memory (the second micro-batch's forward runs beside the first one's backward), less exposed
  // all-to-all time and a shorter step.
  RunConfig c = two_microbatches();
  const StepReport off = run_simulation(c);
  c.ep_overlap = true;
  const StepReport on = run_simulation(c);
  CHECK(on.model_flops_per_device == off.model_flops_per_device);
  CHECK(on.executed_flops_per_device == Approx(off.executed_flops_per_device).epsilon(1e-12));
  CHECK(on.hbm_peak_bytes >= off.hbm_peak_bytes);
  CHECK(on.exposed_s.at("ep") < off.exposed_s.at("ep"));
  CHECK(on.step_time_s < off.step_time_s);
}

TEST_CASE("ep_overlap over random MoE layouts keeps the work and never deadlocks", "[ep_overlap][invariants]") {
  // Pipelines (interleaved, with DeepSeek-V3's layouts), tp with experts split or folded, both dispatchers,
  // selective policies. Merging reorders the collectives of two passes on shared links, which can cost a
  // little where little all-to-all was exposed: in 500 draws the step never grew by more than 0.9%. In
  // Megatron's program order a forward tp collective's first chunk holds the merged stream too, so with tp 2
  // the merge gains less: 24 of these 50 draws are faster by more than 0.1% (before program order, 27).
  std::mt19937 rng(31);
  auto pick = [&](auto xs) { return xs[std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng)]; };
  int ran = 0, faster = 0, pipelined = 0;
  for (int i = 0; i < 120 && ran < 50; ++i) {
    RunConfig c;
    c.model = "deepseek-v3-671b";
    c.system = pick(std::vector<std::string>{"gb200-nvl72", "h100-hgx", "b200-hgx"});
    c.framework = "megatron";
    c.gpus = pick(std::vector<std::int64_t>{64, 128, 256});
    c.tp = pick(std::vector<std::int64_t>{1, 1, 2});
    c.pp = pick(std::vector<std::int64_t>{1, 2, 4});
    c.vp = c.pp > 1 ? 2 : 1;
    c.ep = pick(std::vector<std::int64_t>{8, 16, 32});
    c.expert_tp = c.tp > 1 ? pick(std::vector<std::int64_t>{0, 1}) : 0;
    if (c.expert_tp == 1) c.ep *= c.tp;
    c.micro_batch = 1;
    c.global_batch = c.gpus * pick(std::vector<std::int64_t>{1, 2});
    c.seq = 4096;
    c.policy = pick(std::vector<std::string>{"minimal", "minimal_with_context", "no_recompute", "save_qkv_proj"});
    c.moe_dispatcher = pick(std::vector<std::string>{"alltoall", "flex"});
    c.ep_shards_weights = false;
    c.sharded_optimizer = true;
    c.tp_comm_overlap = c.tp > 1;
    if (c.pp == 2) c.pipeline_layout = "Et*15|t*15|t*15|t*16L";
    if (c.pp == 4) c.pipeline_layout = "Et*7|t*8|t*8|t*8|t*7|t*8|t*7|t*8L";
    StepReport off, on;
    try {
      off = run_simulation(c);
    } catch (const InputError&) {
      continue;
    }
    c.ep_overlap = true;
    INFO(c.to_json().dump());
    REQUIRE_NOTHROW(on = run_simulation(c));
    ++ran;
    pipelined += c.pp > 1;
    faster += on.step_time_s < off.step_time_s * (1 - 1e-3);
    CHECK(on.model_flops_per_device == off.model_flops_per_device);
    CHECK(on.executed_flops_per_device == Approx(off.executed_flops_per_device).epsilon(1e-9));
    CHECK(on.mfu <= 1.0);
    CHECK(on.hbm_peak_bytes >= off.hbm_peak_bytes * (1 - 1e-12));
    CHECK(on.step_time_s <= off.step_time_s * 1.02);
  }
  CHECK(ran == 50);
  CHECK(pipelined > 15);
  CHECK(faster > 20);
}

TEST_CASE("delay_wgrad runs each module's weight gradients after its input-gradient chain", "[ep_overlap]") {
  // Megatron-Core's combined 1F1B layer (model_chunk_schedule_plan.py, run()): mlp.backward (input gradients),
  // mlp.backward_dw, then the dispatch all-to-all's backward; at the end pre_dispatch_computation.backward_dw.
  // So in a MoE layer's backward: every expert GEMM's weight gradient after every expert input gradient and
  // before the dispatch all-to-all; every attention GEMM's weight gradient after all of the attention's other
  // backward steps; each step once.
  RunConfig c = two_microbatches();
  c.ep_overlap = c.delay_wgrad = true;
  const PreparedRun run = prepare_run(c);
  const LayerTemplate& t = run.graph.templates.back();
  REQUIRE(t.kind == "moe");
  const Network net(run.system, run.graph.mesh);
  TemplatePlan plan;
  plan_template(t, run.policy, Costs{run.system, net}, run.graph, run.options, plan);
  using Kind = TemplatePlan::Kind;
  std::map<std::pair<Kind, std::size_t>, int> at;  // each backward step's position
  for (std::size_t s = 0; s < plan.steps.size(); ++s)
    if (plan.steps[s].kind != Kind::replay) CHECK(at.emplace(std::pair{plan.steps[s].kind, plan.steps[s].op}, static_cast<int>(s)).second);
  int dispatch = -1, combine = -1, mlp_norm = -1;
  for (std::size_t o = 0; o < t.ops.size(); ++o) {
    const OpDef& op = t.ops[o];
    if (op.name == "dispatch_a2a") dispatch = static_cast<int>(o);
    if (op.name == "combine_a2a") combine = static_cast<int>(o);
    if (op.name == "mlp_norm") mlp_norm = static_cast<int>(o);
    const bool gemm = op.kind == OpKind::gemm;
    CHECK(at.count({gemm ? Kind::bwd_x : Kind::bwd, o}) == 1);
    CHECK(at.count({Kind::bwd_w, o}) == (gemm ? 1u : 0u));
  }
  REQUIRE((dispatch >= 0 && combine > dispatch && mlp_norm >= 0 && mlp_norm < dispatch));
  int experts_x = -1, experts_w = static_cast<int>(plan.steps.size()), attention_other = -1, attention_w = experts_w;
  for (std::size_t o = 0; o < t.ops.size(); ++o) {
    const bool gemm = t.ops[o].kind == OpKind::gemm;
    const int x = at.at({gemm ? Kind::bwd_x : Kind::bwd, o});
    if (static_cast<int>(o) > dispatch && static_cast<int>(o) < combine && gemm) {
      experts_x = std::max(experts_x, x);
      experts_w = std::min(experts_w, at.at({Kind::bwd_w, o}));
      CHECK(at.at({Kind::bwd_w, o}) < at.at({Kind::bwd, static_cast<std::size_t>(dispatch)}));
    }
    if (static_cast<int>(o) < mlp_norm) {
      attention_other = std::max(attention_other, x);
      if (gemm) attention_w = std::min(attention_w, at.at({Kind::bwd_w, o}));
    }
  }
  CHECK(experts_x >= 0);
  CHECK(experts_x < experts_w);
  CHECK(attention_other < attention_w);
  // Simulated: the same work, and the all-to-alls no longer wait for the experts' weight gradients.
  const StepReport on = run_simulation(c);
  c.delay_wgrad = false;
  const StepReport off = run_simulation(c);
  CHECK(on.executed_flops_per_device == Approx(off.executed_flops_per_device).epsilon(1e-12));
  CHECK(on.exposed_s.at("ep") < off.exposed_s.at("ep"));
  // Megatron-Core refuses it without the overlap (transformer_config.py); hbmsim models it only in program order.
  c.delay_wgrad = true;
  c.ep_overlap = false;
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("delay_wgrad = on (Megatron's delay_wgrad_compute: needs ep_overlap"));
}

TEST_CASE("ep_overlap refuses the MoE layer recomputed as a module, as Megatron-Core does", "[ep_overlap]") {
  // transformer_config.py asserts "moe" is not among the recompute modules under overlap_moe_expert_parallel_comm;
  // moe_act alone (the expert activation, which Megatron-Bridge's overlapped recipes recompute) is allowed.
  RunConfig c = two_microbatches();
  c.ep_overlap = true;
  const ModelSpec model = resolve_model(c.model);
  for (const auto& key : find_recompute_module("moe_act")->tensors_in(model)) c.tensors[key] = "remat";
  CHECK_NOTHROW(run_simulation(c));
  for (const auto& key : find_recompute_module("moe")->tensors_in(model)) c.tensors[key] = "remat";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("ep_overlap = on (the MoE layer recomputed (recompute module moe)"));
  c.ep_overlap = false;  // without the overlap Megatron recomputes the module
  CHECK_NOTHROW(run_simulation(c));
}
