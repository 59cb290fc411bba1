// Megatron's sync-free experts: buffers sized for a capacity (moe_capacity_factor) and the paged stash of their
// saved tensors (moe_paged_stash). They change what the expert tensors hold, not what kernels move.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>

#include "helpers.hpp"
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/run_config.hpp"
#include "planner/run_summary.hpp"

using namespace hbmsim;

namespace {

// Qwen3-30B-A3B (48 MoE layers, 128 experts, top 8) on 8 GB200s, experts over ep 8 with HybridEP.
RunConfig qwen3_ep8(std::int64_t tp = 1) {
  RunConfig c;
  c.model = "hf/qwen3-30b-a3b.config.json";
  c.system = "gb200-nvl72";
  c.framework = "megatron";
  c.gpus = 8 * tp;
  c.tp = tp;
  c.ep = 8;
  c.fsdp = 1;
  c.seq = 4096;
  c.micro_batch = 1;
  c.policy = "no_recompute";
  c.moe_dispatcher = "flex";
  return c;
}

const LayerTemplate& moe_template(const StepGraph& g) {
  for (const auto& t : g.templates)
    if (t.kind == "moe") return t;
  FAIL("no MoE template");
  return g.templates.front();
}

}  // namespace

TEST_CASE("expert buffers take the capacity, and with the paged stash the saved ones take the pool's factor", "[moe]") {
  for (std::int64_t tp : {1, 2}) {
    INFO("tp " << tp);
    RunConfig base = qwen3_ep8(tp), capacity = base, stash = base;
    capacity.moe_capacity_factor = 1.5;
    stash.moe_capacity_factor = 1.5;
    stash.moe_paged_stash = 1.2;
    const StepGraph g0 = prepare_run(base).graph, gc = prepare_run(capacity).graph, gs = prepare_run(stash).graph;
    // fc1's input (the dispatched tokens, or with the experts split over tp their all-gather), fc1's two outputs
    // and the activation are what the backward reads; the rest of the expert side is working space.
    const std::string fc1_input = tp == 1 ? "moe_dispatched" : "moe_dispatched_gathered";
    for (const std::string& name : {fc1_input, std::string("moe_mlpwi_0"), std::string("moe_mlpwi_1"), std::string("moe_mlp_act")}) {
      INFO(name);
      REQUIRE(g0.tensor_bytes(name, "moe") > 0);
      CHECK(gc.tensor_bytes(name, "moe") == Approx(1.5 * g0.tensor_bytes(name, "moe")).epsilon(1e-12));
      CHECK(gs.tensor_bytes(name, "moe") == Approx(1.2 * g0.tensor_bytes(name, "moe")).epsilon(1e-12));
    }
    std::vector<std::string> working = {"moe_mlpwo", "moe_returned"};
    if (tp > 1) {
      working.push_back("moe_dispatched");
      working.push_back("moe_returned_scattered");
    }
    for (const std::string& name : working) {
      INFO(name);
      CHECK(gs.tensor_bytes(name, "moe") == Approx(1.5 * g0.tensor_bytes(name, "moe")).epsilon(1e-12));
    }
    // The tokens before the dispatch and every attention tensor are not the experts'.
    for (const char* name : {"moe_permuted", "router_logits", "query_proj", "context"}) {
      INFO(name);
      CHECK(gs.tensor_bytes(name, "moe") == g0.tensor_bytes(name, "moe"));
    }
    // Kernels move the tokens routed: every op's bytes and FLOPs are the same.
    const auto &t0 = moe_template(g0), &ts = moe_template(gs);
    REQUIRE(t0.ops.size() == ts.ops.size());
    for (std::size_t i = 0; i < t0.ops.size(); ++i) {
      INFO(t0.ops[i].name);
      CHECK(ts.ops[i].bytes == Approx(t0.ops[i].bytes).epsilon(1e-12));
      CHECK(ts.ops[i].flops == t0.ops[i].flops);
    }
  }
}

TEST_CASE("padded expert buffers raise the HBM peak and leave the step's time as it was", "[moe]") {
  RunConfig base = qwen3_ep8();
  base.global_batch = 16;  // 8 replicas x 2 micro-batches
  RunConfig capacity = base, stash = base;
  capacity.moe_capacity_factor = 1.5;
  stash.moe_capacity_factor = 1.5;
  stash.moe_paged_stash = 1.2;
  const auto r0 = run_simulation(base), rc = run_simulation(capacity), rs = run_simulation(stash);
  CHECK(rc.step_time_s == Approx(r0.step_time_s).epsilon(1e-12));
  CHECK(rs.step_time_s == Approx(r0.step_time_s).epsilon(1e-12));
  CHECK(rc.hbm_peak_bytes > rs.hbm_peak_bytes);
  CHECK(rs.hbm_peak_bytes > r0.hbm_peak_bytes);
}

TEST_CASE("the Megatron arguments printed for a run carry its expert buffer sizes", "[moe]") {
  RunConfig c = qwen3_ep8();
  c.moe_capacity_factor = 1.5;
  c.moe_paged_stash = 1.2;
  const std::string args = megatron_settings(c);
  CHECK(args.find(" --moe-expert-rank-capacity-factor 1.5") != std::string::npos);
  CHECK(args.find(" --moe-paged-stash --moe-paged-stash-buffer-size-factor-cuda 1.2") != std::string::npos);
  c.moe_paged_stash = 0;
  CHECK(megatron_settings(c).find("--moe-paged-stash") == std::string::npos);
}

TEST_CASE("Megatron's combine keeps no expert output and MaxText's keeps them for the probabilities' gradient", "[moe]") {
  // Megatron-Core's experts multiply their activation by the router's probabilities (the weighted SwiGLU), so
  // the combine sums the returned tokens and its backward reads only the routing; MaxText's unpermute weighs the
  // expert outputs, and the weights' gradient reads them: Ts x k x d x 2 bytes = 4096 x 8 x 2048 x 2 = 128 MiB
  // per MoE layer of Qwen3-30B-A3B at one sequence of 4096 tokens.
  RunConfig megatron = qwen3_ep8(), maxtext = qwen3_ep8();
  maxtext.framework = "maxtext";
  maxtext.moe_dispatcher = "alltoall";
  for (const RunConfig* c : {&megatron, &maxtext}) {
    INFO(c->framework);
    const StepGraph g = prepare_run(*c).graph;
    const LayerTemplate& t = moe_template(g);
    const auto op = std::find_if(t.ops.begin(), t.ops.end(), [](const OpDef& o) { return o.name == "unpermute_combine"; });
    REQUIRE(op != t.ops.end());
    std::set<std::string> saved;
    for (int k : op->saved) saved.insert(t.tensors[static_cast<std::size_t>(k)].name);
    const std::set<std::string> expected = c->framework == "megatron" ? std::set<std::string>{"router_logits"}
                                                                      : std::set<std::string>{"moe_returned", "router_logits"};
    CHECK(saved == expected);
    CHECK(g.tensor_bytes("moe_returned", "moe") == Approx(4096.0 * 8 * 2048 * 2));
  }
}

TEST_CASE("the flex dispatcher's kernels hold SMs that the compute kernels beside them lack", "[moe][ep_overlap]") {
  // Qwen3-30B-A3B on 8 GB200s (148 SMs), four micro-batches of one sequence per replica, with Megatron's all-to-all overlap
  // (combined 1F1B: a micro-batch's expert GEMMs beside another's all-to-all). Unset, the flex dispatcher holds
  // Megatron-Core's 20 SMs; alltoall holds none that hbmsim models, so naming a count there is bad input.
  RunConfig c = qwen3_ep8();
  c.global_batch = 32;  // 8 data-parallel replicas x 4 micro-batches of one sequence
  c.ep_overlap = true;
  const PreparedRun run = prepare_run(c);
  CHECK(run.graph.training.parallelism.moe_dispatcher_sms == 20);
  CHECK_THAT(resolved_run_lines(resolved_run(c, run))[1], Catch::Contains("MoE dispatcher flex (holding 20 of 148 SMs)"));
  RunConfig rubin = c;  // its file states no SM count: nothing held, nothing said
  rubin.system = "vr-nvl144";
  CHECK_THAT(resolved_run_lines(resolved_run(rubin, prepare_run(rubin)))[1], !Catch::Contains("SMs"));
  RunConfig a2a = c;
  a2a.moe_dispatcher = "alltoall";
  a2a.moe_dispatcher_sms = 8;
  CHECK_THROWS_WITH(prepare_run(a2a), Catch::Contains("moe_dispatcher_sms = 8") && Catch::Contains("needs moe_dispatcher flex"));
  RunConfig all = c;
  all.moe_dispatcher_sms = 148;
  CHECK_THROWS_WITH(prepare_run(all), Catch::Contains("moe_dispatcher_sms = 148") && Catch::Contains("has 148 SMs"));
  // A kernel that runs tau seconds beside an all-to-all holding a share s of the SMs does tau (1 - s) of its
  // work there, so the compute stream's busy time (its kernels' work at full speed, W, plus that loss) is
  // W + s x (the time it ran beside one): above W, by at most s x the all-to-alls' busy time. Without the
  // share (1 SM is nearly none) it is W.
  c.moe_dispatcher_sms = 1;
  const StepReport base = run_simulation(c);
  const double work_s = base.busy_s.at("compute") - (1.0 / 148) * base.busy_s.at("ep");
  double last_step_s = base.step_time_s;
  for (std::int64_t sms : {20, 32, 64}) {
    INFO(sms << " SMs");
    c.moe_dispatcher_sms = sms;
    const StepReport r = run_simulation(c);
    const double s = sms / 148.0, loss_s = r.busy_s.at("compute") - work_s;
    CHECK(loss_s > 0);
    CHECK(loss_s <= s * r.busy_s.at("ep") * (1 + 1e-9));
    CHECK(r.step_time_s > last_step_s);  // more SMs held, a longer step
    CHECK(r.model_flops_per_device == base.model_flops_per_device);
    last_step_s = r.step_time_s;
  }
}
