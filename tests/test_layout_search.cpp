// plan layout (issue #19): the bounds it prunes with, the search, and what it prints.
#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "planner/layout_search.hpp"
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/sweep.hpp"
#include "sim/bounds.hpp"
#include "sim/simulator.hpp"

using namespace hbmsim;

namespace {

struct PrunedAndExhaustive {
  LayoutSearch pruned, exhaustive;
};
// The search with and without its bounds: the same top list (configs and step times), every candidate
// accounted for once, fewer simulated when pruned.
PrunedAndExhaustive search_both_ways(const RunConfig& base, LayoutSearchOptions o) {
  o.prune = true;
  PrunedAndExhaustive r{search_layouts(base, o), {}};
  o.prune = false;
  r.exhaustive = search_layouts(base, o);
  REQUIRE(r.exhaustive.top.size() == static_cast<std::size_t>(o.top));
  REQUIRE(r.pruned.top.size() == static_cast<std::size_t>(o.top));
  for (std::size_t i = 0; i < r.pruned.top.size(); ++i) {
    INFO("rank " << i + 1);
    CHECK(config_id(r.pruned.top[i].config) == config_id(r.exhaustive.top[i].config));
    CHECK(r.pruned.top[i].report.step_time_s == r.exhaustive.top[i].report.step_time_s);
  }
  CHECK(r.pruned.simulated < r.exhaustive.simulated);
  CHECK(r.exhaustive.pruned + r.exhaustive.skipped == 0);
  CHECK(r.pruned.candidates == r.pruned.refused + r.pruned.pruned + r.pruned.skipped + r.pruned.simulated);
  return r;
}

// DeepSeek-V3's HuggingFace config cut to `layers` layers (its first 3 dense), as a file: searches over it keep
// the model's shapes, experts and memory per layer at a fraction of the whole model's simulation time.
std::string deepseek_v3_cut(int layers) {
  auto hf = nlohmann::json::parse(test::slurp(std::string(HBMSIM_SOURCE_DIR) + "/data/hf/deepseek-v3.config.json"));
  hf["num_hidden_layers"] = layers;
  const auto path = test::temp_dir() / ("deepseek-v3-" + std::to_string(layers) + "-layers.json");
  std::ofstream(path) << hf.dump();
  return path.string();
}

// Llama 3.1 8B on 8 H100s, 16 sequences of 8192: a search small enough to run exhaustively under the sanitizers.
RunConfig llama8b_on_8_h100s() {
  RunConfig base;
  base.system = "h100-hgx";
  base.model = "llama3.1-8b";
  base.gpus = 8;
  base.seq = 8192;
  base.global_batch = 16;
  return base;
}

}  // namespace

TEST_CASE("a search stops the runs that go over HBM early and says the same, also when nothing fits", "[layout]") {
  // Llama 3.1 8B on 8 H100s held to one layout (fsdp 8, no recompute, micro-batch 1): its HBM bound is below its
  // simulated peak. With HBM set between the two, the bound lets it through and the simulation finds it over: the
  // run stops early, and the "nothing fits" answer names its whole run's peak, as a search that runs it whole does.
  RunConfig base = llama8b_on_8_h100s();
  LayoutSearchOptions o;
  o.top = 1;
  o.policies = {"no_recompute"};
  o.micro_batches = {1};
  o.held = {{"tp", {1}}, {"cp", {1}}, {"pp", {1}}, {"vp", {1}}, {"ep", {1}}, {"fsdp", {8}}, {"dp", {1}}, {"sharded_optimizer", {0}}};
  o.state_offload = false;
  const auto all = layout_candidates(base, o);
  REQUIRE(all.size() == 1);
  const double bound = hbm_lower_bound_bytes(prepare_run(all[0]));
  const double peak = run_simulation(all[0]).hbm_peak_bytes;
  REQUIRE(bound < 0.9 * peak);
  base.hbm_bytes = (bound + peak) / 2;
  const LayoutSearch early = search_layouts(base, o);
  o.stop_early = false;
  const LayoutSearch whole = search_layouts(base, o);
  CHECK(early.top.empty());
  CHECK(early.simulated == 1);
  CHECK(early.none_fit == whole.none_fit);
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f of", peak / 1073741824.0);
  CHECK_THAT(early.none_fit, Catch::Contains(gib));
  // The run itself, stopped: over capacity, and shorter than the step.
  RunConfig squeezed = all[0];
  squeezed.hbm_bytes = base.hbm_bytes;
  PreparedRun run = prepare_run(squeezed);
  run.options.stop_above_hbm_bytes = *base.hbm_bytes;
  const StepReport stopped = simulate(run.graph, run.system, run.policy, run.options);
  CHECK(stopped.stopped);
  CHECK_FALSE(stopped.fits);
  CHECK(stopped.hbm_peak_bytes > *base.hbm_bytes);
  CHECK(stopped.step_time_s < run_simulation(all[0]).step_time_s);
}

TEST_CASE("the HBM bound holds every chunk forward an interleaved first stage runs before its first backward", "[layout]") {
  // Llama 3.1 8B (32 identical layers) at pp 4 with 8 micro-batches. Plain 1F1B: stage 0 runs 4 forwards of its
  // 8 layers before its first backward, 32 layer-forwards of activations alive. Interleaved with v = 2 (Megatron's
  // warm-up (p - 1) x 2 + (v - 1) x p = 10 chunk forwards, then one more before the first backward): 11 chunks of
  // 4 layers, 44 layer-forwards. Stage 0 stores the same 8 layers (and the embedding) either way, so what the
  // bound adds to its state is in the ratio 44 : 32.
  RunConfig c;
  c.system = "gb200-nvl72";
  c.model = "llama3.1-8b";
  c.gpus = 4;
  c.pp = 4;
  c.seq = 8192;
  c.micro_batch = 1;
  c.global_batch = 8;
  c.framework = "megatron";
  c.policy = "no_recompute";
  auto activations = [](const RunConfig& config) {
    const PreparedRun run = prepare_run(config);
    const auto& st = run.graph.stages.at(0);
    const double state = st.parameter_bytes + st.gradient_bytes + st.optimizer_bytes + run.system.runtime.reserve_bytes;
    const double bound = hbm_lower_bound_bytes(run);
    CHECK(bound <= run_simulation(config).hbm_peak_bytes);
    return bound - state;
  };
  const double plain = activations(c);
  c.vp = 2;
  const double interleaved = activations(c);
  REQUIRE(plain > 0);
  CHECK(interleaved / plain == Approx(44.0 / 32.0).epsilon(1e-9));
}

TEST_CASE("the step-time and HBM lower bounds never exceed what the simulation gives", "[layout][invariants]") {
  // Over random layouts (experts folded over tp or not), pipelines (GPipe, 1F1B, interleaved, ZB-H1), policies
  // and schedule switches: the step bound (compute, and the waits for collectives that hold the compute stream)
  // is at most the simulated step and each stage's compute bound at most its busy compute; the memory bound at
  // most the simulated HBM peak.
  std::mt19937 rng(23);
  auto pick = [&](auto xs) { return xs[std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng)]; };
  int ran = 0, pipelined = 0, folded = 0, overlapped = 0, uneven = 0, waiting = 0;
  for (int i = 0; i < 600 && ran < 120; ++i) {
    RunConfig c;
    c.model = pick(std::vector<std::string>{"llama3.1-8b", "llama3.1-70b", "deepseek-v3-671b"});
    c.system = pick(std::vector<std::string>{"gb200-nvl72", "h100-hgx", "vr-nvl144"});
    c.gpus = pick(std::vector<std::int64_t>{16, 32, 64});
    c.tp = pick(std::vector<std::int64_t>{1, 2, 4});
    c.cp = pick(std::vector<std::int64_t>{1, 1, 2});
    c.pp = pick(std::vector<std::int64_t>{1, 2, 4});
    c.vp = c.pp > 1 ? pick(std::vector<std::int64_t>{1, 2}) : 1;
    if (c.model == "deepseek-v3-671b") c.ep = 8;
    if (c.model == "deepseek-v3-671b" && c.tp > 1 && c.cp == 1) c.expert_tp = pick(std::vector<std::int64_t>{0, 1});
    if (c.expert_tp == 1) c.ep = 8 * c.tp;
    c.pp_schedule = pick(std::vector<std::string>{"1f1b", "1f1b", "gpipe", "zb-h1"});
    // The search's split: under Megatron DeepSeek-V3's 61 layers take Megatron-Bridge's uneven layout.
    c.framework = pick(std::vector<std::string>{"maxtext", "megatron"});
    if (c.pp > 1) (void)set_pipeline_split(c, resolve_model(c.model).num_layers);
    c.micro_batch = pick(std::vector<std::int64_t>{1, 2});
    c.global_batch = c.gpus * pick(std::vector<std::int64_t>{1, 2});
    c.seq = pick(std::vector<std::int64_t>{2048, 4096});
    c.policy = pick(std::vector<std::string>{"full", "minimal", "minimal_with_context", "qkv_proj_offloaded"});
    c.lhs = pick(std::vector<bool>{true, false});
    c.sharded_optimizer = pick(std::vector<bool>{true, false});
    c.weights = pick(std::vector<std::string>{"bf16", "fp8"});
    // Combined 1F1B where Megatron allows it (its extra warm-up forward holds more than the bound counts).
    if (c.model == "deepseek-v3-671b" && c.pp_schedule == "1f1b" && (c.pp == 1 || c.vp > 1) && c.policy != "full" &&
        c.policy != "qkv_proj_offloaded")
      c.ep_overlap = pick(std::vector<bool>{false, true});
    PreparedRun run;
    StepReport r;
    try {
      run = prepare_run(c);
      r = simulate(run.graph, run.system, run.policy, run.options);
    } catch (const InputError&) {
      continue;
    }
    ++ran;
    pipelined += c.pp > 1;
    uneven += !c.pipeline_layout.empty();
    folded += folds_experts(c);
    overlapped += c.ep_overlap;
    INFO(c.to_json().dump());
    const StepBound b = step_lower_bound(run.graph, run.system, run.policy, run.options);
    CHECK(b.step_s > 0);
    CHECK(b.step_s <= r.step_time_s * (1 + 1e-9));
    for (std::size_t s = 0; s < r.stages.size(); ++s) CHECK(b.stage_compute_s[s] <= r.stages[s].compute_busy_s * (1 + 1e-9));
    waiting += b.stage_wait_s[0] > 0;
    CHECK(hbm_lower_bound_bytes(run) <= r.hbm_peak_bytes * (1 + 1e-9));
  }
  CHECK(ran == 120);
  CHECK(pipelined > 40);
  CHECK(uneven > 0);
  CHECK(folded > 0);
  CHECK(overlapped > 0);
  CHECK(waiting > 20);  // runs whose compute stream waits for collectives (no LHS, or Megatron's program order)
}

TEST_CASE("the step bound counts the waits for collectives that hold the compute stream", "[layout][invariants]") {
  // Llama 3.1 8B on 8 GB200s at tp 8, one micro-batch per replica. In Megatron's program order every tp
  // all-gather and reduce-scatter holds the compute stream: the bound adds their solo times and comes within 10% of
  // the simulated step (compute alone is about half of it). Under MaxText's LHS they overlap compute and add
  // nothing; with LHS off they hold the stream again. TE's userbuffers (tp_comm_overlap) hide the backward ones and
  // all but one of tp chunks of the forward ones: the wait falls by more than 8x.
  RunConfig c;
  c.model = "llama3.1-8b";
  c.system = "gb200-nvl72";
  c.gpus = 8;
  c.tp = 8;
  c.seq = 4096;
  c.global_batch = 8;
  auto bound = [](const RunConfig& config) {
    const PreparedRun run = prepare_run(config);
    const StepReport r = simulate(run.graph, run.system, run.policy, run.options);
    const StepBound b = step_lower_bound(run.graph, run.system, run.policy, run.options);
    CHECK(b.step_s <= r.step_time_s);
    return std::pair{b, r.step_time_s};
  };
  c.framework = "megatron";
  c.policy = "no_recompute";
  const auto [megatron, megatron_step_s] = bound(c);
  CHECK(megatron.stage_wait_s[0] > 0.5 * megatron.stage_compute_s[0]);
  CHECK(megatron.step_s > 0.9 * megatron_step_s);
  c.tp_comm_overlap = true;
  CHECK(bound(c).first.stage_wait_s[0] < megatron.stage_wait_s[0] / 8);
  c.tp_comm_overlap = false;
  c.framework = "maxtext";
  c.policy = "minimal";
  CHECK(bound(c).first.stage_wait_s[0] == 0);
  c.lhs = false;
  CHECK(bound(c).first.stage_wait_s[0] > 0);
}

TEST_CASE("the pruned layout search lists the same layouts as the exhaustive one", "[layout]") {
  // Llama 3.1 8B on 8 H100s, 16 sequences of 8192: the memory bound drops candidates (replicated fp32 state
  // or unsharded activations do not fit 80 GB), the step bound skips slow ones (374 candidates: 34 and 276 of
  // them when this was written), and the exhaustive search stays cheap enough for the sanitizer build.
  const RunConfig base = llama8b_on_8_h100s();
  LayoutSearchOptions o;
  o.top = 5;
  o.jobs = 2;
  o.policies = {"full", "minimal", "minimal_with_context"};
  const auto [pruned, exhaustive] = search_both_ways(base, o);
  CHECK(pruned.pruned > 0);
  CHECK(pruned.skipped > 0);
  // The winner is the fastest fitting candidate of all those the exhaustive search simulated, and fits.
  CHECK(exhaustive.top[0].report.fits);
  for (std::size_t i = 1; i < exhaustive.top.size(); ++i)
    CHECK(exhaustive.top[i].report.tokens_per_s_per_device <= exhaustive.top[0].report.tokens_per_s_per_device);
}

TEST_CASE("held degrees are the only ones tried for their axes, even where the search would not try them", "[layout]") {
  // Llama 3.1 8B on 8 H100s, 16 sequences of 8192 (the case above). Holding tp at 2, or at 2 or 8, gives the
  // layouts the whole search finds with those tp, in the same order: its exhaustive list filtered by hand.
  const RunConfig base = llama8b_on_8_h100s();
  LayoutSearchOptions o;
  o.top = 1000;
  o.jobs = 2;
  o.prune = false;
  o.policies = {"full", "minimal"};
  const LayoutSearch all = search_layouts(base, o);
  for (const std::vector<std::int64_t>& tps : {std::vector<std::int64_t>{2}, std::vector<std::int64_t>{2, 8}}) {
    std::vector<std::string> want;
    for (const LayoutResult& l : all.top)
      if (std::count(tps.begin(), tps.end(), l.config.tp) && want.size() < 4) want.push_back(config_id(l.config));
    REQUIRE(want.size() == 4);
    LayoutSearchOptions h = o;
    h.held = {{"tp", tps}};
    h.top = 4;
    h.prune = true;
    const LayoutSearch got = search_layouts(base, h);
    INFO("tp " << tps.size() << " values");
    REQUIRE(got.top.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(config_id(got.top[i].config) == want[i]);
  }
  o.top = 3;
  o.prune = true;
  // cp 8 leaves 1,024 tokens per rank, under the 2,048 below which the search does not try a context axis; held,
  // it is tried. fsdp 2 x dp 4 is no split the search's data axes make (FSDP over all 8, dp with a sharded
  // optimizer, or FSDP inside the 8-GPU domain); held, every layout has it.
  o.held = {{"cp", {8}}};
  const LayoutSearch c = search_layouts(base, o);
  REQUIRE(!c.top.empty());
  for (const LayoutResult& l : c.top) CHECK(l.config.cp == 8);
  o.held = {{"fsdp", {2}}, {"dp", {4}}};
  const LayoutSearch h = search_layouts(base, o);
  REQUIRE(!h.top.empty());
  for (const LayoutResult& l : h.top) {
    CHECK(l.config.fsdp == 2);
    CHECK(l.config.dp == 4);
    CHECK(l.config.tp * l.config.cp * l.config.pp == 1);
  }
  CHECK(h.held == nlohmann::json{{"fsdp", 2}, {"dp", 4}});
  // Held degrees no layout of 8 GPUs has: refused, naming the field and value; a held pipeline MaxText cannot
  // split (32 layers into 2 x 3 chunks) is a result that says so.
  o.held = {{"tp", {2}}, {"pp", {3}}};
  CHECK_THROWS_WITH(search_layouts(base, o), "pp = 3 (it does not divide the 8 GPUs)");
  o.held = {{"tp", {2}}, {"pp", {8}}};
  CHECK_THROWS_WITH(search_layouts(base, o), "pp = 8 (the held degrees tp 2 x pp 8 = 16 do not divide the 8 GPUs)");
  o.held = {{"pp", {2}}, {"vp", {3}}};
  const LayoutSearch none = search_layouts(base, o);
  CHECK(none.top.empty());
  CHECK(none.none_fit == "no candidate layout: none of the search's layouts of 8 GPUs has pp 2, vp 3 (MaxText's pipeline splits its 32 "
                         "layers evenly over pp x vp chunks; --framework megatron also unevenly)");
  o.held = {{"fsdp", {0}}};
  CHECK_THROWS_WITH(search_layouts(base, o), "fsdp = 0 (a degree the search holds must be at least 1)");
  o.held = {{"tp", {4, 2, 4}}};
  CHECK_THROWS_WITH(search_layouts(base, o), "tp = 4 (given twice)");
  o.held = {{"batch", {1}}};
  CHECK_THROWS_WITH(search_layouts(base, o), Catch::StartsWith("held = \"batch\""));
}

TEST_CASE("plan layout holds the degrees given as flags and reads --policy and --micro-batch as one-item lists", "[layout][cli]") {
  const std::string run = "plan layout --model llama3.1-8b --gpus 8 --system h100-hgx --seq 2048 --top 3 --json ";
  auto j = test::cli(run + "--tp 2 --sharded-optimizer on --policy full --micro-batch 1");
  REQUIRE(j.status == 0);
  CHECK(j.err.find("is not used") == std::string::npos);
  auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["held"] == nlohmann::json{{"tp", 2}, {"sharded_optimizer", true}});
  REQUIRE(doc["top"].size() == 3);
  for (const auto& row : doc["top"]) {
    CHECK(row["degrees"]["tp"] == 2);
    CHECK(row["sharded_optimizer"] == true);
    CHECK(row["policy"] == "full");
    CHECK(row["micro_batch"] == 1);
  }
  // The same search with the lists given.
  auto lists = test::cli(run + "--tp 2 --sharded-optimizer on --policies full --micro-batches 1");
  REQUIRE(lists.status == 0);
  CHECK(nlohmann::json::parse(lists.out)["top"] == doc["top"]);
  for (const std::string bad : {"--tp 3", "--fsdp 0", "--policy full --policies full,minimal", "--micro-batch 2 --micro-batches 1"}) {
    auto b = test::cli(run + bad);
    INFO(bad << ": " << b.err);
    CHECK(b.status == 2);
    CHECK(b.out.empty());
    CHECK_THAT(b.err, Catch::Contains(bad.substr(0, bad.find(' '))));
  }
  CHECK_THAT(test::cli(run + "--tp 3").err, Catch::Contains("--tp = 3 (it does not divide the 8 GPUs)"));
  // The search's own options keep their names ("----top" once, when every message was renamed as a held flag's).
  CHECK(test::cli("plan layout --model llama3.1-8b --gpus 8 --top 0").err == "hbmsim: --top = 0 (must be at least 1)\n");
  // A comma-separated list holds the axis to those values.
  auto list = test::cli(run + "--tp 2,4 --policies full --micro-batches 1");
  REQUIRE(list.status == 0);
  const auto listed = nlohmann::json::parse(list.out);
  CHECK(listed["held"] == nlohmann::json{{"tp", {2, 4}}});
  REQUIRE(listed["top"].size() == 3);
  for (const auto& row : listed["top"]) CHECK((row["degrees"]["tp"] == 2 || row["degrees"]["tp"] == 4));
  CHECK_THAT(test::cli(run + "--tp 4,2,4").err, Catch::Contains("--tp = 4 (given twice)"));
  CHECK_THAT(test::cli(run + "--tp 4,x").err, Catch::Contains("--tp"));
  CHECK(test::cli(run + "--tp 4,x").status == 2);
  // The text output's header names what is held.
  CHECK_THAT(test::cli("plan layout --model llama3.1-8b --gpus 8 --top 1 --tp 1,2 --sharded-optimizer on").out,
             Catch::StartsWith("search: llama3.1-8b on 8 x gb200-nvl72 GPUs, seq 4096, global batch 8 sequences; held: tp 1 or 2, "
                               "sharded_optimizer on\n"));
  CHECK_THAT(test::cli("plan layout --model llama3.1-8b --gpus 8 --top 1 --pp 2 --vp 2").out,
             Catch::StartsWith("search: llama3.1-8b on 8 x gb200-nvl72 GPUs, seq 4096, global batch 8 sequences; held: pp 2, vp 2\n"));
  // What the search sets and no flag holds is still named as unused.
  CHECK_THAT(test::cli(run + "--grad-accum 2").err, Catch::Contains("--grad-accum 2 is not used"));
}

TEST_CASE("a layout that cannot fit is tried again with its optimizer state, then its parameters, in host memory", "[layout]") {
  // Llama 3.1 70B on 8 H100s: 70B parameters with fp32 weights, gradients and Adam state are about 16 bytes
  // each, 140 GB per GPU over 8 of them: no layout fits 80 GB. Moving the state to host memory makes some fit.
  RunConfig base;
  base.system = "h100-hgx";
  base.model = "llama3.1-70b";
  base.gpus = 8;
  base.seq = 4096;
  LayoutSearchOptions o;
  o.top = 3;
  o.policies = {"full"};
  o.micro_batches = {1};
  o.state_offload = false;
  const LayoutSearch plain = search_layouts(base, o);
  CHECK(plain.top.empty());
  CHECK(plain.offloaded == 0);
  CHECK_THAT(plain.none_fit, Catch::Contains("nothing fits"));
  o.state_offload = true;
  const LayoutSearch levered = search_layouts(base, o);
  REQUIRE(!levered.top.empty());
  CHECK(levered.offloaded == plain.pruned);  // every layout the bound rejected was retried
  CHECK(levered.candidates == levered.refused + levered.pruned + levered.skipped + levered.simulated);
  for (const auto& t : levered.top) {
    INFO(config_id(t.config));
    CHECK(t.config.optimizer_offload != "off");
    CHECK(t.report.fits);
    // The row is what simulating its config gives.
    CHECK(run_simulation(t.config).tokens_per_s_per_device == t.report.tokens_per_s_per_device);
  }
  // A base that already offloads is searched as given.
  base.optimizer_offload = "device";
  CHECK(search_layouts(base, o).offloaded == 0);
}

TEST_CASE("a Muon search tries data parallelism only and never offloads the state", "[layout][muon]") {
  // Megatron refuses Muon with Megatron-FSDP and offloads Adam's state only: every candidate keeps its weights whole
  // over the data axis (fsdp 1, the distributed optimizer over dp) and none is retried with its state in host memory.
  // Llama 3.1 70B on 32 H100s: bf16 weights and fp32 gradients whole over dp (6 bytes per parameter) do not fit
  // 80 GB below 8-way model parallelism, so the memory bound prunes; tp 8 x pp 2 x dp 2 holds about 4.4 B x 11.
  RunConfig base;
  base.system = "h100-hgx";
  base.model = "llama3.1-70b";
  base.gpus = 32;
  base.seq = 4096;
  base.framework = "megatron";
  base.optimizer = "muon";
  LayoutSearchOptions o;
  o.top = 20;
  o.policies = {"full"};
  o.micro_batches = {1};
  for (const RunConfig& c : layout_candidates(base, o)) {
    INFO(config_id(c));
    CHECK(c.fsdp == 1);
    CHECK(c.optimizer == "muon");
    CHECK(c.sharded_optimizer == (c.dp > 1));
    CHECK_NOTHROW(prepare_run(c));
  }
  const LayoutSearch s = search_layouts(base, o);
  CHECK(s.offloaded == 0);
  CHECK(s.pruned > 0);
  REQUIRE(!s.top.empty());
  CHECK_THAT(megatron_settings(s.top[0].config), Catch::Contains("--optimizer muon"));
}

TEST_CASE("candidates keep the global batch and every field the search does not set", "[layout]") {
  RunConfig base;
  base.model = "llama3.1-8b";
  base.gpus = 16;
  base.weights = "fp8";
  base.lhs = false;
  LayoutSearchOptions o;
  o.policies = {"minimal"};
  const auto all = layout_candidates(base, o);
  REQUIRE(!all.empty());
  for (const RunConfig& c : all) {
    CHECK(c.global_batch == 16);  // one sequence per GPU when not given
    CHECK(c.weights == "fp8");
    CHECK(!c.lhs);
    CHECK(c.tp * c.cp * c.pp * c.ep * c.fsdp * c.dp == 16);
  }
}

TEST_CASE("the search tries every interleaving depth up to 8 that splits the layers, and Megatron's uneven layouts",
          "[layout][pipeline]") {
  // Megatron-Bridge's DeepSeek-V3 rule, by hand: 61 layers over 4 chunks take ceil(61 / 4) = 16 each and 13 in the
  // last (with the MTP module and the loss); over 16 chunks 4 each and 1 in the last; over 32 the last would be
  // 61 - 31 x 2 < 1 (none).
  CHECK(ceil_pipeline_layout(61, 4, 1) == "Et*16|(t*16|)*2t*13mL");
  CHECK(ceil_pipeline_layout(61, 2, 0) == "Et*31|t*30L");
  CHECK(ceil_pipeline_layout(61, 16, 1) == "Et*4|(t*4|)*14t*1mL");
  CHECK(ceil_pipeline_layout(61, 32, 0).empty());
  std::int64_t mtp = 0;
  const auto counts = parse_pipeline_layout(ceil_pipeline_layout(61, 4, 1), mtp);
  CHECK(counts == std::vector<std::int64_t>{16, 16, 16, 13});
  CHECK(mtp == 1);

  auto depths = [](const RunConfig& base, std::int64_t pp) {
    LayoutSearchOptions o;
    o.policies = {"full"};
    o.micro_batches = {1};
    std::set<std::int64_t> vps;
    for (const RunConfig& c : layout_candidates(base, o))
      if (c.pp == pp) vps.insert(c.vp);
    return vps;
  };
  // Llama 3.1 70B's 80 layers over pp 4: 80 / (4 x vp) whole for vp 1, 2, 4, 5 (the published recipes' depth);
  // 82 (the embedding and loss as layers) adds none. Over pp 8 (10 layers each): vp 1, 2, 5.
  RunConfig base;
  base.model = "llama3.1-70b";
  base.system = "h100-hgx";
  base.gpus = 64;
  base.seq = 8192;
  CHECK(depths(base, 4) == std::set<std::int64_t>{1, 2, 4, 5});
  CHECK(depths(base, 8) == std::set<std::int64_t>{1, 2, 5});
  // Llama 3.1 405B's 126 layers over pp 8: only with the embedding and loss, 128 / (8 x vp) for vp 1, 2, 4, 8 (the
  // published runs' pp 8 x vp 8), which Megatron counts and MaxText does not: its pipeline takes 126 only over
  // pp 2 (63 per stage: vp 1, 3, 7).
  base.model = "llama3.1-405b";
  base.gpus = 512;
  CHECK(depths(base, 8).empty());
  CHECK(depths(base, 2) == std::set<std::int64_t>{1, 3, 7});
  base.framework = "megatron";
  CHECK(depths(base, 8) == std::set<std::int64_t>{1, 2, 4, 8});
  base.framework = "maxtext";
  // DeepSeek-V3's 61 layers split evenly over no pp > 1 (nor 63): MaxText's search pipelines nothing, Megatron's
  // takes Megatron-Bridge's layout for every depth whose last chunk keeps a layer: over pp 4, 4 chunks (16 x 3 + 13),
  // 8 (8 x 7 + 5) and 16 (4 x 15 + 1); 12 chunks of 6 would leave 61 - 66 for the last, 20 of 4 61 - 76.
  base.model = "deepseek-v3-671b";
  base.system = "gb200-nvl72";
  base.gpus = 256;
  base.seq = 4096;
  CHECK(depths(base, 4).empty());
  base.framework = "megatron";
  CHECK(depths(base, 4) == std::set<std::int64_t>{1, 2, 4});
  LayoutSearchOptions o;
  o.policies = {"full"};
  o.micro_batches = {1};
  for (const RunConfig& c : layout_candidates(base, o)) {
    if (c.pp == 4 && c.vp == 1) CHECK(c.pipeline_layout == "Et*16|(t*16|)*2t*13L");
    // Megatron reads the interleaving from the layout's 8 chunks and refuses a second way of giving it.
    if (c.pp == 4 && c.vp == 2)
      CHECK_THAT(megatron_settings(c), Catch::Contains("--pipeline-model-parallel-layout \"Et*8|(t*8|)*6t*5L\"") &&
                                           !Catch::Contains("--num-virtual-stages-per-pipeline-rank"));
  }
}

TEST_CASE("the search's policies follow the framework: MaxText's presets, or Megatron's recompute choices", "[layout]") {
  RunConfig base;
  base.model = "llama3.1-8b";
  base.gpus = 16;
  auto tried = [&] {
    std::set<std::string> policies;
    for (const RunConfig& c : layout_candidates(base, LayoutSearchOptions{})) policies.insert(c.policy);
    return policies;
  };
  CHECK(tried() == std::set<std::string>{"full", "minimal", "save_qkv_proj", "minimal_with_context", "qkv_proj_offloaded", "minimal_offloaded"});
  base.framework = "megatron";
  CHECK(tried() == std::set<std::string>{"no_recompute", "selective", "full"});  // a dense model: no MoE or MLA modules
  // Given policies are kept whatever the framework.
  LayoutSearchOptions o;
  o.policies = {"minimal"};
  for (const RunConfig& c : layout_candidates(base, o)) CHECK(c.policy == "minimal");
}

TEST_CASE("under Megatron's state the search also tries the recompute modules recipes use, where the model has them",
          "[layout][policy]") {
  // "no_recompute+moe_act+layernorm" is Megatron's --recompute-modules moe_act layernorm (the MoE zoo's "norm,
  // act"): no_recompute with those modules' tensors rematerialized, said back under the same name.
  RunConfig base;
  base.framework = "megatron";
  base.model = "hf/mixtral-8x7b.config.json";
  const ModelSpec mixtral = resolve_model(base.model);
  const RunConfig act = with_layout_policy(base, "no_recompute+moe_act+layernorm", mixtral);
  CHECK(act.policy == "no_recompute");
  CHECK(act.tensors == std::map<std::string, std::string>{{"mlp_norm", "remat"}, {"moe_mlp_act", "remat"}});
  CHECK(layout_policy_label(act) == "no_recompute+moe_act+layernorm");
  const RunConfig sel = with_layout_policy(base, "selective+moe", mixtral);
  CHECK(sel.tensors.size() == 6);  // router_logits, moe_dispatched, moe_mlpwi_0/1, moe_mlp_act, moe_returned
  CHECK(layout_policy_label(sel) == "selective+moe");
  CHECK(layout_policy_label(with_layout_policy(base, "selective", mixtral)) == "selective");
  RunConfig custom = base;
  custom.policy = "no_recompute";
  custom.tensors = {{"moe_mlpwi_0", "offload"}};
  CHECK(layout_policy_label(custom) == "no_recompute*");
  // The defaults: the presets, then the module sets the model has (Mixtral no MLA; DeepSeek-V3 all three;
  // Llama none); MaxText's presets unchanged.
  CHECK(default_layout_policies(base) == std::vector<std::string>{"no_recompute", "selective", "full", "no_recompute+moe_act+layernorm",
                                                                   "no_recompute+moe+layernorm"});
  base.model = "deepseek-v3-671b";
  CHECK(default_layout_policies(base).size() == 6);
  base.model = "llama3.1-8b";
  CHECK(default_layout_policies(base) == std::vector<std::string>{"no_recompute", "selective", "full"});
  // Bad search policies name the field and the value.
  CHECK_THROWS_WITH(with_layout_policy(base, "full+moe_act", mixtral), Catch::Contains("policies = \"full+moe_act\" (recompute modules follow"));
  CHECK_THROWS_WITH(with_layout_policy(base, "no_recompute+attention", mixtral),
                    Catch::Contains("(unknown recompute module \"attention\"; expected core_attn"));
  CHECK_THROWS_WITH(with_layout_policy(base, "no_recompute+moe_act", resolve_model("llama3.1-8b")),
                    Catch::Contains("has nothing module moe_act recomputes"));
  CHECK_THROWS_WITH(with_layout_policy(base, "fastest", mixtral), Catch::Contains("policy = \"fastest\" (unknown"));
  // A search over them: every candidate carries its policy's tensors, and the listed label is the policy tried.
  base.model = "hf/mixtral-8x7b.config.json";
  base.system = "h100-hgx";
  base.gpus = 8;
  base.seq = 4096;
  LayoutSearchOptions o;
  o.policies = {"no_recompute+moe_act+layernorm", "full"};
  o.micro_batches = {1};
  o.top = 50;
  std::set<std::string> labels;
  for (const LayoutResult& r : search_layouts(base, o).top) {
    labels.insert(layout_policy_label(r.config));
    if (r.config.policy == "no_recompute") CHECK(r.config.tensors == act.tensors);
  }
  CHECK(labels.count("no_recompute+moe_act+layernorm") == 1);
}

TEST_CASE("under Megatron's state a layout that cannot fit is retried with Megatron's CPU optimizer only", "[layout]") {
  // DeepSeek-V3 on GB200s, full recompute, read Megatron's way: under the distributed optimizer every
  // expert-parallel rank holds the other weights whole, so some layouts fit only with their state off the GPU. Megatron's one way is
  // --optimizer-cpu-offload (the update on the host); MaxText's GPU update of streamed state and its parameter
  // offload are not tried.
  RunConfig base;
  base.model = "deepseek-v3-671b";
  base.system = "gb200-nvl72";
  base.seq = 4096;
  base.framework = "megatron";
  LayoutSearchOptions o;
  o.policies = {"full"};
  o.micro_batches = {1};
  // Where a layout fits only with its state off the GPU, the search's answer has it on the host (the CPU
  // optimizer) and never streamed through HBM or with the parameters there: DeepSeek-V3 cut to 13 layers on 16
  // GPUs, where both kinds of layout fit.
  {
    RunConfig cut = base;
    cut.model = deepseek_v3_cut(13);
    cut.gpus = 16;
    o.top = 40;
    const LayoutSearch r = search_layouts(cut, o);
    CHECK(std::any_of(r.top.begin(), r.top.end(), [](const LayoutResult& l) { return l.config.optimizer_offload == "host"; }));
    CHECK(std::any_of(r.top.begin(), r.top.end(), [](const LayoutResult& l) { return l.config.optimizer_offload == "off"; }));
    for (const LayoutResult& l : r.top) {
      CHECK(l.config.optimizer_offload != "device");
      CHECK(!l.config.parameter_offload);
    }
  }
  // The whole model on 64: nothing fits with its state on the GPU. Megatron-FSDP over the expert ranks (fsdp 2 x
  // ep 32) has an HBM bound under the 185 GiB (its parameters, gradients and state sharded 64 ways, 1 micro-batch's
  // recomputed activations) but simulated it does not fit (the gathered weights and collective buffers the bound
  // leaves out); with the CPU optimizer it does, in 75 GiB. The search retries what the simulation finds over HBM
  // too, so that layout leads with its state on the host (before, only what the bound ruled out was retried, and
  // the search's best was a pipeline at 1,476 tokens/s per GPU against this one's 1,615).
  base.gpus = 64;
  RunConfig fsdp = base;
  fsdp.ep = 32;
  fsdp.fsdp = 2;
  const PreparedRun run = prepare_run(fsdp);
  CHECK(hbm_lower_bound_bytes(run) <= run.system.gpu.hbm_bytes);
  CHECK_FALSE(simulate(run.graph, run.system, run.policy, run.options).fits);
  fsdp.optimizer_offload = "host";
  CHECK(run_simulation(fsdp).fits);
  o.top = 3;
  o.jobs = 2;
  const LayoutSearch r = search_layouts(base, o);
  REQUIRE(!r.top.empty());
  CHECK(r.top[0].config.optimizer_offload == "host");
  CHECK(r.top[0].config.pp == 1);
  CHECK(r.top[0].config.ep == 32);
  CHECK(r.top[0].config.fsdp == 2);
  for (const LayoutResult& l : r.top) CHECK(l.config.optimizer_offload == "host");
  o.top = 40;
  // On 32 nothing fits at all (671 B parameters' state over 32 GPUs): a result that says so.
  base.gpus = 32;
  const LayoutSearch none = search_layouts(base, o);
  CHECK(none.top.empty());
  CHECK_THAT(none.none_fit, Catch::StartsWith("nothing fits"));
  // MaxText's state and reading: the GPU update is tried first, and some fit with it.
  base.framework = "maxtext";
  const LayoutSearch x = search_layouts(base, o);
  CHECK(std::any_of(x.top.begin(), x.top.end(), [](const LayoutResult& l) { return l.config.optimizer_offload == "device"; }));
}

TEST_CASE("under Megatron's state the layout search also folds an MoE model's experts over tp", "[layout][parallel]") {
  // DeepSeek-V3 (256 routed experts) on 64 GB200s. Folding (expert_tp 1) is a second reading of a mesh with
  // tp > 1: the same tp x cp x pp x ep-axis x data axes, the experts whole over an expert group of
  // ep-axis x tp x cp GPUs, which must divide the 256 experts. So the folded candidates are exactly the unfolded
  // ones with tp > 1 and 256 % (ep x tp x cp) == 0, each with ep multiplied by tp x cp; MaxText's state has
  // none, and asked for under MaxText's reading (cp shards the weights) only those with cp 1. Those with no ep
  // axis and cp > 1 also fold inside tp x cp: an expert group of tp x k for each k dividing cp below it.
  RunConfig base;
  base.model = "deepseek-v3-671b";
  base.system = "gb200-nvl72";
  base.gpus = 64;
  base.seq = 4096;
  LayoutSearchOptions o;
  o.policies = {"full"};
  o.micro_batches = {1};
  auto key = [](RunConfig c) {
    if (folds_experts(c)) c.ep /= c.tp * c.cp;  // the folded layout's mesh
    c.expert_tp = 0;
    c.framework = "maxtext";  // the layout, whichever training state it keeps
    return config_id(c);
  };
  const auto maxtext = layout_candidates(base, o);
  REQUIRE(!maxtext.empty());
  std::size_t folds_cp1 = 0;
  for (const RunConfig& c : maxtext) {
    CHECK(c.expert_tp == 0);
    folds_cp1 += c.tp > 1 && 256 % (c.ep * c.tp * c.cp) == 0 && c.cp == 1;
  }
  base.framework = "megatron";
  const auto megatron = layout_candidates(base, o);
  // The meshes Megatron's reading tries unfolded: MaxText's, and those only Megatron's pipeline layout splits
  // (DeepSeek-V3's 61 layers over pp x vp chunks, ceil_pipeline_layout).
  std::set<std::string> plain, expected_folds, expected_inside;
  for (const RunConfig& c : megatron) {
    if (folds_experts(c)) continue;
    CHECK(c.expert_tp == 0);
    plain.insert(key(c));
    if (c.tp > 1 && 256 % (c.ep * c.tp * c.cp) == 0) expected_folds.insert(key(c));
    if (c.tp > 1 && c.ep == 1)
      for (std::int64_t k = 1; k < c.cp; ++k)
        if (c.cp % k == 0) expected_inside.insert(key(c) + " tp x " + std::to_string(k));
  }
  REQUIRE(expected_inside.size() > 4);
  REQUIRE(folds_cp1 < expected_folds.size());
  REQUIRE(expected_folds.size() > 10);
  std::size_t uneven = 0;
  for (const RunConfig& c : maxtext) CHECK(plain.count(key(c)) == 1);  // every unfolded layout is still tried
  for (const RunConfig& c : megatron) uneven += !folds_experts(c) && !c.pipeline_layout.empty();
  CHECK(uneven > 0);
  CHECK(plain.size() == maxtext.size() + uneven);
  std::set<std::string> folds, inside;
  for (const RunConfig& c : megatron) {
    INFO(config_id(c));
    if (!folds_experts(c)) continue;
    if (experts_inside_cp(c)) {
      RunConfig mesh = c;
      mesh.ep = 1;
      mesh.expert_tp = 0;
      CHECK(inside.insert(key(mesh) + " tp x " + std::to_string(c.ep / c.tp)).second);
      continue;
    }
    CHECK(c.ep % (c.tp * c.cp) == 0);
    CHECK(256 % c.ep == 0);
    CHECK(c.tp * c.cp * c.pp * (c.ep / (c.tp * c.cp)) * c.fsdp * c.dp == 64);
    CHECK(folds.insert(key(c)).second);  // one fold per mesh
  }
  CHECK(folds == expected_folds);
  CHECK(inside == expected_inside);
  CHECK(plain.size() + folds.size() + inside.size() == megatron.size());
  // expert_tp 1 asked for under MaxText's reading: every layout with tp > 1 folds (those that cannot, cp > 1,
  // are not tried).
  base.framework = "maxtext";
  base.expert_tp = 1;
  const auto asked = layout_candidates(base, o);
  std::size_t tp1 = 0;
  for (const RunConfig& c : asked) {
    INFO(config_id(c));
    CHECK((c.tp == 1 ? c.expert_tp == 0 : folds_experts(c)));
    tp1 += c.tp == 1;
  }
  CHECK(asked.size() == tp1 + folds_cp1);
  // A dense model has no experts to fold.
  base.model = "llama3.1-8b";
  base.framework = "megatron";
  base.expert_tp = 0;
  for (const RunConfig& c : layout_candidates(base, o)) CHECK(c.expert_tp == 0);
}

TEST_CASE("an MoE search under Megatron's state prunes to the exhaustive answer, overlapped layouts among them", "[layout]") {
  // DeepSeek-V3 cut to 13 layers (3 dense, 10 MoE) on 64 GB200s, 256 sequences (4 micro-batches per replica at
  // ep 64), read Megatron's way: the search also tries folded experts, combined 1F1B and, since no pp x vp
  // divides 13 layers but one chunk per layer, Megatron-Bridge's uneven pipeline layouts, whose extra in-flight
  // micro-batch, reordered collectives and unequal chunks the bounds must still bound. The pruned and exhaustive
  // searches list the same top 20, uneven pipelines among them, and the all-to-all overlap, which hides most of
  // ep's exposed time here, is in the winner. (The whole model's exhaustive search simulates 1,600 layouts, a
  // minute; 13 layers keep it to seconds.)
  RunConfig base;
  base.model = deepseek_v3_cut(13);
  base.system = "gb200-nvl72";
  base.framework = "megatron";
  base.gpus = 64;
  base.seq = 4096;
  base.global_batch = 256;
  LayoutSearchOptions o;
  o.top = 20;
  o.jobs = 2;
  o.policies = {"minimal", "full"};
  o.micro_batches = {1};
  const LayoutSearch exhaustive = search_both_ways(base, o).exhaustive;
  CHECK(std::any_of(exhaustive.top.begin(), exhaustive.top.end(), [](const LayoutResult& l) { return !l.config.pipeline_layout.empty(); }));
  CHECK(exhaustive.top[0].config.ep_overlap);
  // As Megatron-Bridge's recipes run the overlap: with the weight gradients delayed.
  for (const LayoutResult& l : exhaustive.top) CHECK(l.config.delay_wgrad == l.config.ep_overlap);
  // Its twin without the overlap is slower.
  RunConfig twin = exhaustive.top[0].config;
  twin.ep_overlap = twin.delay_wgrad = false;
  CHECK(run_simulation(twin).tokens_per_s_per_device < exhaustive.top[0].report.tokens_per_s_per_device);
}

TEST_CASE("plan layout marks a folded layout and prints the settings that fold it", "[layout][cli]") {
  // DeepSeek-V3 (cut to 13 layers) on 128 GB200s with full recompute at micro-batch 1. At tp 2 a GPU holds as
  // many expert bytes either way (half slices of 8 experts, or 4 whole ones over ep 64), but folded the
  // dispatched tokens skip tp's gather and scatter, so folded layouts reach the top list (behind tp 1). The table
  // marks them "ep Nf", and a row's Megatron line sets expert tensor parallelism 1 exactly when it folds.
  const std::string model = deepseek_v3_cut(13);
  auto r = test::cli("plan layout --model " + model + " --gpus 128 --system gb200-nvl72 --framework megatron --seq 4096 "
                     "--policies full --micro-batches 1 --top 10 --json");
  REQUIRE(r.status == 0);
  auto doc = nlohmann::json::parse(r.out);
  REQUIRE(!doc["top"].empty());
  bool any_folded = false;
  for (std::size_t i = 0; i < doc["top"].size(); ++i) {
    const auto& t = doc["top"][i];
    const bool folded = t["degrees"]["expert_tp"] == 1 && t["degrees"]["tp"].get<int>() > 1;
    const std::string megatron = t["settings"]["megatron"].get<std::string>();
    CHECK((megatron.find("--expert-tensor-parallel-size 1") != std::string::npos) == folded);
    // The printed config runs the row (the first row and the first folded one, each simulated again).
    if (i == 0 || (folded && !any_folded)) {
      RunConfig c = RunConfig::from_json(t["settings"]["simulate_config"], "plan layout --json");
      CHECK(run_simulation(c).tokens_per_s_per_device == t["report"]["tokens_per_s_per_device"].get<double>());
    }
    any_folded |= folded;
  }
  CHECK(any_folded);
  auto text = test::cli("plan layout --model " + model + " --gpus 128 --system gb200-nvl72 --framework megatron --seq 4096 "
                        "--policies full --micro-batches 1 --top 10 --progress off");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Catch::Contains("f  ") && Catch::Contains("ep Nf: expert tensor parallelism 1"));
}

TEST_CASE("what limits a run is said in words", "[layout]") {
  StepReport r;
  r.fits = false;
  r.fits_reason = "HBM peak exceeds capacity";
  CHECK(limiting_resource(r) == "HBM peak exceeds capacity");
  r.fits = true;
  r.step_time_s = 10;
  r.mfu = 0.5;
  r.hbm_capacity_bytes = 100;
  r.hbm_peak_bytes = 50;
  r.exposed_s = {{"tp", 1.0}, {"fsdp", 0.2}};
  CHECK(limiting_resource(r) == "tp collectives 1.00 s exposed (10% of the step)");
  r.exposed_s = {{"pp", 2.0}, {"h2d", 0.5}};
  r.hbm_peak_bytes = 97;
  CHECK(limiting_resource(r) == "pipeline bubble 2.00 s exposed (20% of the step); HBM 97% full");
  r.exposed_s = {{"h2d", 0.4}};
  r.hbm_peak_bytes = 50;
  CHECK(limiting_resource(r) == "compute (MFU 50.0%)");  // 4% of the step: under the 5% line
  r.compute_s = {{"forward", 2.0}, {"backward", 4.0}, {"recompute", 1.5}, {"optimizer", 0.1}};
  CHECK(limiting_resource(r) == "compute (MFU 50.0%, recompute 15% of the step)");  // 1.5 s of 10
  r.compute_s["recompute"] = 0.04;
  CHECK(limiting_resource(r) == "compute (MFU 50.0%)");  // under half a percent: not worth a word
}

TEST_CASE("plan layout prints the top list and the settings, says when nothing fits, refuses bad options", "[layout][cli]") {
  auto r = test::cli("plan layout --model llama3.1-8b --gpus 8 --system h100-hgx --seq 2048 --top 3 --policies minimal,full --progress off");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("global batch 8 sequences") && Catch::Contains("limited by") && Catch::Contains("Megatron: --tensor-model-parallel-size") &&
                        Catch::Contains("MaxText: per_device_batch_size"));
  auto j = test::cli("plan layout --model llama3.1-8b --gpus 8 --system h100-hgx --seq 2048 --top 3 --policies minimal --json");
  REQUIRE(j.status == 0);
  auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["top"].size() == 3);
  CHECK(doc["global_batch"] == 8);
  // The first row simulated alone gives the same numbers.
  RunConfig first = RunConfig::from_json(doc["top"][0]["settings"]["simulate_config"], "plan layout --json");
  CHECK(run_simulation(first).tokens_per_s_per_device == doc["top"][0]["report"]["tokens_per_s_per_device"].get<double>());
  // Llama 3.1 405B on 8 H100s fits no layout: a result, with the reason.
  auto none = test::cli("plan layout --model llama3.1-405b --gpus 8 --system h100-hgx --seq 4096 --policies full --progress off");
  CHECK(none.status == 0);
  CHECK_THAT(none.out, Catch::Contains("nothing fits"));
  // It names the candidate with the least HBM bound (its state's 16 bytes per parameter over 8 GPUs dominate):
  // tp 4 x cp 2 (the context axis shards the weights too), whose bound is computed here directly.
  RunConfig least;
  least.model = "llama3.1-405b";
  least.system = "h100-hgx";
  least.gpus = 8;
  least.seq = 4096;
  least.tp = 4;
  least.cp = 2;
  least.micro_batch = 1;
  least.global_batch = 8;
  least.policy = "full";
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f", hbm_lower_bound_bytes(prepare_run(least)) / 1073741824.0);
  CHECK_THAT(none.out, Catch::Contains(std::string("(the least: ") + gib + " GiB, tp 4 x cp 2, micro-batch 1, policy full)"));
  // Refused before the search's header is printed; a policy or micro-batch twice would list its layouts twice.
  for (const std::string bad : {"--top 0", "--micro-batches 0", "--policies bogus", "--jobs 0", "--progress maybe",
                                "--policies full,full", "--micro-batches 2,1,2"}) {
    auto b = test::cli("plan layout --model llama3.1-8b --gpus 8 " + bad);
    INFO(bad << ": " << b.err);
    CHECK(b.status == 2);
    CHECK(b.out.empty());
  }
}

// MaxText's hybrid mesh splits each axis into its part inside a slice (ici_*) and across slices (dcn_*); on GPUs a
// slice is an NVLink domain (8 GPUs on an H100 HGX host, up to 72 on an NVL72 rack), and the products must be the
// GPUs of a slice and the slices. Worked by hand in MaxText's axis order (data, stage, fsdp, context, tensor,
// expert; the last innermost).
TEST_CASE("the MaxText settings split each mesh axis into its NVLink-domain (ici) and cross-domain (dcn) parts", "[layout][plan]") {
  struct Case {
    const char* system;
    std::int64_t gpus, dp, fsdp, cp, tp, pp;
    const char* want;  // the mesh keys, dcn first
  };
  for (const Case& k : {
           // 8 hosts of 8: fsdp 64 has 8 members per host and spans 8 hosts.
           Case{"h100-hgx", 64, 1, 64, 1, 1, 1, " dcn_fsdp_parallelism=8 ici_fsdp_parallelism=8 "},
           // tp 8 fills a host; dp 8 runs across the hosts.
           Case{"h100-hgx", 64, 8, 1, 1, 8, 1, " dcn_data_parallelism=8 ici_tensor_parallelism=8 "},
           // tp 2 (stride 1) and fsdp 4 (stride 2) fill a host of 8; fsdp's other 4 and pp 2 run across hosts.
           Case{"h100-hgx", 64, 1, 16, 1, 2, 2, " dcn_pipeline_parallelism=2 dcn_fsdp_parallelism=4 ici_fsdp_parallelism=4 ici_tensor_parallelism=2 "},
           // 64 GPUs of one NVL72 rack are one slice: nothing across slices.
           Case{"gb300-nvl72", 64, 32, 1, 2, 1, 1, " ici_data_parallelism=32 ici_context_parallelism=2 "},
           // 128 GPUs on NVL72 racks: 64 per rack (Topology), so dp 2 x fsdp 64 is dp across racks.
           Case{"gb200-nvl72", 128, 2, 64, 1, 1, 1, " dcn_data_parallelism=2 ici_fsdp_parallelism=64 "}}) {
    RunConfig c;
    c.system = k.system;
    c.model = "llama3.1-8b";
    c.gpus = k.gpus, c.dp = k.dp, c.fsdp = k.fsdp, c.cp = k.cp, c.tp = k.tp, c.pp = k.pp;
    INFO(k.system << " " << k.want);
    const std::string x = maxtext_settings(c);
    CHECK_THAT(x, Catch::Contains(std::string("max_target_length=4096") + k.want));
    CHECK_THAT(x, !Catch::Contains("whole NVLink domains"));
  }
  // tp 3 on hosts of 8 straddles two hosts: no hybrid mesh places it, and the settings say so.
  RunConfig c;
  c.system = "h100-hgx";
  c.gpus = 24, c.tp = 3, c.fsdp = 8;
  CHECK_THAT(maxtext_settings(c), Catch::Contains("ici_fsdp_parallelism=8 ici_tensor_parallelism=3 (this layout's axes do not split into whole NVLink domains"));
  // Degrees that do not fill the GPUs (bad input where the run is simulated) are printed as given, with no note.
  c.gpus = 64;
  CHECK_THAT(maxtext_settings(c), Catch::Contains("ici_fsdp_parallelism=8 ici_tensor_parallelism=3 ") && !Catch::Contains("NVLink"));
}

// Megatron-Core's activation CPU offloading (transformer_config.py) raises for pipeline parallelism, for any
// activation recompute and for cpu_offloading_num_layers >= num_layers: settings that ask for one say so.
TEST_CASE("the Megatron arguments say where Megatron-Core's CPU offloading refuses the run", "[layout][plan]") {
  RunConfig c;
  c.model = "llama3.1-8b";  // 32 layers
  c.framework = "megatron";
  c.policy = "no_recompute";
  c.offload_layers = 8;
  const std::string note = "Megatron-Core's CPU offloading refuses";
  CHECK_THAT(megatron_settings(c), Catch::Contains(" --cpu-offloading-num-layers 8") && !Catch::Contains("--cpu-offloading ") && !Catch::Contains(note));
  c.pp = 2;
  CHECK_THAT(megatron_settings(c), Catch::Contains(note + " pipeline parallelism,"));
  c.pp = 1;
  c.policy = "selective";  // --recompute-granularity selective
  CHECK_THAT(megatron_settings(c), Catch::Contains(note + " activation recompute,"));
  c.policy = "no_recompute";
  c.offload_layers = 32;
  CHECK_THAT(megatron_settings(c), Catch::Contains(note + " offloading every layer,"));
  c.pp = 2;
  c.policy = "selective";
  CHECK_THAT(megatron_settings(c), Catch::Contains(note + " pipeline parallelism, activation recompute and offloading every layer,"));
  // Megatron takes one recompute granularity: a block of layers recomputed whole beside a selective policy is none.
  RunConfig r;
  r.model = "llama3.1-8b";
  r.policy = "selective";
  r.recompute_layers = 4;
  CHECK_THAT(megatron_settings(r), Catch::Contains("--recompute-num-layers 4 (Megatron takes one recompute granularity"));
  r.policy = "no_recompute";
  CHECK_THAT(megatron_settings(r), Catch::EndsWith("--recompute-num-layers 4") || !Catch::Contains("one recompute granularity"));
  // --tp-comm-overlap only with tp > 1: Megatron turns sequence parallelism off at tp 1 and then refuses the overlap.
  r.tp_comm_overlap = true;
  CHECK_THAT(megatron_settings(r), !Catch::Contains("--tp-comm-overlap"));
  r.tp = 2;
  CHECK_THAT(megatron_settings(r), Catch::Contains("--sequence-parallel --tp-comm-overlap"));
}

// MaxText shards the optimizer state over its data axis only with shard_optimizer_over_data (ZeRO-1, configs/types.py);
// a layout the search ran with the state sharded over dp must say so, or MaxText would keep a full copy per replica.
TEST_CASE("the MaxText settings shard the optimizer over data exactly when the run does over dp", "[layout][plan]") {
  RunConfig c;
  c.gpus = 64;
  c.dp = 8;
  c.fsdp = 8;
  for (bool sharded : {false, true}) {
    c.sharded_optimizer = sharded;
    INFO("sharded_optimizer " << sharded);
    CHECK((maxtext_settings(c).find(" shard_optimizer_over_data=true") != std::string::npos) == sharded);
  }
  c.dp = 1;  // fsdp shards the state already: nothing more to set
  c.fsdp = 64;
  CHECK_THAT(maxtext_settings(c), !Catch::Contains("shard_optimizer_over_data"));
}

// Megatron-LM's arguments (--fp8-format/--fp8-recipe, --fp4-format/--fp4-recipe) and MaxText's quantization
// values (configs/types.py: fp8, te_mxfp8, te_nvfp4) name one recipe for every linear layer.
TEST_CASE("the settings name the low-precision recipe, once, and say when two dtypes were asked for", "[layout][plan]") {
  RunConfig c;
  struct Want {
    const char *mlp, *projections, *megatron, *maxtext;
  };
  auto formats = [](const std::string& m) {  // low-precision format flags (not --ckpt-format)
    int n = 0;
    for (const char* flag : {"--fp8-format", "--fp4-format"})
      for (auto at = m.find(flag); at != std::string::npos; at = m.find(flag, at + 1)) ++n;
    return n;
  };
  for (const Want& w : {Want{"fp8", "fp8", "--fp8-format hybrid", "quantization=fp8"},
                        Want{"mxfp8", "mxfp8", "--fp8-format e4m3 --fp8-recipe mxfp8", "quantization=te_mxfp8"},
                        Want{"nvfp4", "nvfp4", "--fp4-format e2m1 --fp4-recipe nvfp4", "quantization=te_nvfp4"},
                        Want{"fp4", "fp4", "--fp4-format e2m1 --fp4-recipe nvfp4", "quantization=te_nvfp4"},
                        Want{"bf16", "mxfp8", "--fp8-format e4m3 --fp8-recipe mxfp8", "quantization=te_mxfp8"}}) {
    c.weights = w.mlp;
    c.attention_dtype = w.projections;
    INFO(w.mlp << " / " << w.projections);
    const std::string m = megatron_settings(c), x = maxtext_settings(c);
    CHECK_THAT(m, Catch::Contains(w.megatron));
    CHECK_THAT(x, Catch::Contains(w.maxtext));
    // One recipe: no second format flag, no second quantization key.
    CHECK(formats(m) == 1);
    CHECK(x.find("quantization=") == x.rfind("quantization="));
    const bool mixed = std::string(w.mlp) == "bf16";
    CHECK((m.find("one recipe covers every linear layer") != std::string::npos) == mixed);
    CHECK((x.find("one recipe covers every linear layer") != std::string::npos) == mixed);
  }
  // FP8 MLPs with MXFP8 projections: the MLP's recipe, and a note that the projections run it too.
  c.weights = "fp8";
  c.attention_dtype = "mxfp8";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--fp8-format hybrid") && !Catch::Contains("mxfp8 --") &&
                                       Catch::Contains("MLP GEMMs fp8, projections mxfp8") && Catch::Contains("run both as fp8"));
  // bf16 throughout: no recipe at all.
  c.weights = c.attention_dtype = "bf16";
  CHECK(formats(megatron_settings(c)) == 0);
  CHECK_THAT(megatron_settings(c), !Catch::Contains("recipe"));
  CHECK_THAT(maxtext_settings(c), !Catch::Contains("quantization="));
}

TEST_CASE("the Megatron arguments say what a config sets", "[layout][plan]") {
  RunConfig c;
  c.tp = 4;
  c.pp = 8;
  c.vp = 4;
  c.cp = 2;
  c.dp = 2;
  c.fsdp = 1;
  c.sharded_optimizer = true;
  c.micro_batch = 1;
  c.global_batch = 512;
  c.embedding_as_layer = c.loss_as_layer = true;
  c.policy = "minimal";
  c.weights = "fp8";
  const std::string m = megatron_settings(c);
  for (const char* want : {"--tensor-model-parallel-size 4", "--pipeline-model-parallel-size 8", "--num-virtual-stages-per-pipeline-rank 4",
                           "--context-parallel-size 2", "--micro-batch-size 1", "--global-batch-size 512", "--sequence-parallel",
                           "--use-distributed-optimizer", "--account-for-embedding-in-pipeline-split", "--fp8-format hybrid",
                           "--recompute-granularity selective"}) {
    INFO(want);
    CHECK_THAT(m, Catch::Contains(want));
  }
  // DDP's overlaps: dp x cp = 4 syncs gradients, bucketed in the backward (dp_overlap, the default), and the
  // distributed optimizer's parameter gathers overlap the forward, which Megatron allows only with both flags.
  CHECK_THAT(m, Catch::Contains("--overlap-grad-reduce --overlap-param-gather") && !Catch::Contains("grad-reduce-in-bf16") &&
                    !Catch::Contains("tp-comm-overlap") && !Catch::Contains("decoder-first") && !Catch::Contains("Megatron runs 1F1B"));
  c.dp_overlap = false;
  CHECK_THAT(megatron_settings(c), !Catch::Contains("--overlap-grad-reduce") && Catch::Contains("dp_overlap off: Megatron overlaps parameter gathers only"));
  c.dp_overlap = true;
  c.sharded_optimizer = false;  // plain DDP: nothing to gather
  CHECK_THAT(megatron_settings(c), Catch::Contains("--overlap-grad-reduce") && !Catch::Contains("param-gather"));
  c.sharded_optimizer = true;
  c.grad_reduce_dtype = "bf16";
  c.tp_comm_overlap = true;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--grad-reduce-in-bf16") && Catch::Contains("--tp-comm-overlap"));
  // One chunk per stage with uneven first and last stages; a schedule Megatron does not have is named.
  c.vp = 1;
  c.first_stage_layers = 7;
  c.last_stage_layers = 9;
  c.pp_schedule = "zb-h1";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 9") &&
                                       Catch::Contains("(pp_schedule zb-h1: no Megatron equivalent; Megatron runs 1F1B)"));
  c.vp = 4;
  c.first_stage_layers = c.last_stage_layers = 0;
  c.pp_schedule = "1f1b";
  c.grad_reduce_dtype = "fp32";
  c.tp_comm_overlap = false;
  // Without data or context parallelism there is no gradient sync to overlap.
  c.dp = c.cp = 1;
  CHECK_THAT(megatron_settings(c), !Catch::Contains("overlap-grad-reduce"));
  // Expert ranks come out of data parallelism, so with ep 8 the other weights' gradients are summed over 8
  // ranks (corpus row 16: pp 4 x ep 64, dp 1): the sync is there to overlap. Folded over tp 4, ep 4 is one
  // expert group within the tensor-parallel ranks: no sync again.
  c.ep = 8;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--overlap-grad-reduce --overlap-param-gather"));
  c.ep = 4;
  c.expert_tp = 1;
  CHECK_THAT(megatron_settings(c), !Catch::Contains("overlap-grad-reduce"));
  c.ep = 1;
  c.expert_tp = 0;
  c.dp = c.cp = 2;
  // Block-scaled MXFP8: Megatron's mxfp8 recipe, E4M3 throughout.
  c.weights = "mxfp8";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--fp8-format e4m3 --fp8-recipe mxfp8") && !Catch::Contains("hybrid"));
  c.weights = "fp8";
  c.policy = "no_recompute";  // Megatron's default
  c.offload_layers = 20;
  CHECK_THAT(megatron_settings(c), Catch::Contains(" --cpu-offloading-num-layers 20") && !Catch::Contains("recompute"));
  // A plan simulated on XLA's offload schedule says so; one on Transformer Engine's (framework megatron) does not.
  CHECK_THAT(megatron_settings(c), Catch::Contains("XLA's offload schedule"));
  c.framework = "megatron";
  CHECK_THAT(megatron_settings(c), !Catch::Contains("XLA's offload schedule"));
  c.framework = "maxtext";
  c.offload_layers = 0;
  c.tensors = {{"context", "remat"}};  // the core attention recomputed: Megatron's selective recompute
  CHECK_THAT(megatron_settings(c), Catch::Contains("--recompute-granularity selective") && !Catch::Contains("no Megatron equivalent"));
  // The token dispatcher, with expert parallelism only.
  CHECK_THAT(megatron_settings(c), !Catch::Contains("dispatcher"));
  c.ep = 8;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--moe-token-dispatcher-type alltoall"));
  c.moe_dispatcher = "flex";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep"));
  CHECK_THAT(megatron_settings(c), !Catch::Contains("num-sms"));  // Megatron-Core's default
  c.moe_dispatcher_sms = 32;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--moe-flex-dispatcher-num-sms 32"));
  CHECK_THAT(maxtext_settings(c), Catch::Contains("which MaxText's ragged all-to-all does not do"));
  CHECK_THAT(megatron_settings(c), !Catch::Contains("mtp"));
  c.mtp_layers = 1;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--mtp-num-layers 1"));
  CHECK_THAT(maxtext_settings(c), Catch::Contains("mtp_num_layers=1"));
  // bf16 Adam moments: Megatron's precision-aware optimizer; MaxText's mu_dtype covers the first moment only.
  CHECK_THAT(megatron_settings(c), !Catch::Contains("precision-aware"));
  c.optimizer_moments_dtype = "bf16";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16"));
  // Megatron's CPU optimizer asserts --use-precision-aware-optimizer (arguments.py): named once, with fp32 moments too.
  c.optimizer_offload = "host";
  const std::string offloaded = megatron_settings(c);
  CHECK_THAT(offloaded, Catch::Contains("--optimizer-cpu-offload --optimizer-offload-fraction 1.0"));
  CHECK(offloaded.find("--use-precision-aware-optimizer") == offloaded.rfind("--use-precision-aware-optimizer"));
  c.optimizer_moments_dtype = "fp32";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--use-precision-aware-optimizer") && !Catch::Contains("--exp-avg-dtype"));
  c.optimizer_offload = "off";
  CHECK_THAT(megatron_settings(c), !Catch::Contains("precision-aware"));
  c.optimizer_moments_dtype = "bf16";
  CHECK_THAT(maxtext_settings(c), Catch::Contains("mu_dtype=bfloat16") && Catch::Contains("only the first moment"));
  // The expert all-to-all overlap: a Megatron switch, which MaxText has no equivalent of.
  CHECK_THAT(megatron_settings(c), !Catch::Contains("overlap-moe"));
  c.ep_overlap = true;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--overlap-moe-expert-parallel-comm"));
  CHECK_THAT(megatron_settings(c), !Catch::Contains("--delay-wgrad-compute"));
  c.delay_wgrad = true;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--overlap-moe-expert-parallel-comm --delay-wgrad-compute"));
  CHECK_THAT(maxtext_settings(c), Catch::Contains("combined 1F1B, which MaxText does not have"));
  // A config simulated otherwise than Megatron runs it ends in the flags that would simulate it Megatron's way.
  // Its layout fields are auto, so the framework alone reads them Megatron's way.
  CHECK_THAT(megatron_settings(c), Catch::EndsWith(" (simulated otherwise than Megatron runs it; as Megatron: --framework megatron)"));
  c.framework = "megatron";
  CHECK_THAT(megatron_settings(c), !Catch::Contains("otherwise than Megatron"));
  // MaxText's readings given outright stay so under either framework, and are named.
  c.mesh_order = "maxtext";
  c.cp_exchange = "all_gather";
  c.cp_shards_weights = c.ep_shards_weights = true;
  CHECK_THAT(megatron_settings(c), Catch::EndsWith(" (simulated otherwise than Megatron runs it; as Megatron: --mesh-order megatron "
                                                   "--cp-exchange ring --cp-shards-weights off --ep-shards-weights off)"));
  // On one axis the mesh order changes nothing.
  RunConfig one;
  one.framework = "megatron";
  one.fsdp = 8;
  one.mesh_order = "maxtext";
  CHECK_THAT(megatron_settings(one), !Catch::Contains("otherwise than Megatron"));
}

TEST_CASE("the Megatron arguments spell out the FSDP degree and batch that hbmsim resolved", "[layout][plan]") {
  // Llama 3.1 70B on 64 GPUs, tp 2 x pp 4, MaxText's batch 1 per device and fsdp left to fill the rest. By hand:
  // fsdp = 64 / (2 x 4) = 8; a replica spans tp x pp = 8 devices, so 8 sequences per step in pp = 4 micro-batches
  // of 2; global 1 x 64 = 64. Megatron fills left-over GPUs with plain data parallelism, so FSDP must be named.
  RunConfig c;
  c.model = "llama3.1-70b";
  c.gpus = 64;
  c.tp = 2;
  c.pp = 4;
  c.batch = 1.0;
  // Megatron-FSDP asserts the fsdp_dtensor checkpoint format (arguments.py); its default strategy, optim_grads_params,
  // is the ZeRO-3 sharding simulated.
  CHECK_THAT(megatron_settings(c), Catch::Contains("--micro-batch-size 2 --global-batch-size 64 --use-megatron-fsdp --ckpt-format fsdp_dtensor --overlap-grad-reduce"));
  // Replicas beside the shards: hybrid FSDP, one optimizer instance per replica (Megatron's HSDP switch), the state
  // sharded over the replicas too when the run shards it over dp.
  RunConfig h = c;
  h.fsdp = 4;
  h.dp = 2;
  CHECK_THAT(megatron_settings(h), Catch::Contains("--use-megatron-fsdp --ckpt-format fsdp_dtensor --num-distributed-optimizer-instances 2 --overlap"));
  h.sharded_optimizer = true;
  CHECK_THAT(megatron_settings(h), Catch::Contains("--num-distributed-optimizer-instances 2 --outer-dp-sharding-strategy optim --overlap"));
  // Given outright, the batch and degrees are printed as given: dp 8 with the distributed optimizer.
  c.batch.reset();
  c.fsdp = 1;
  c.dp = 8;
  c.sharded_optimizer = true;
  c.micro_batch = 1;
  c.global_batch = 128;
  CHECK_THAT(megatron_settings(c), Catch::Contains("--micro-batch-size 1 --global-batch-size 128 --use-distributed-optimizer") &&
                                       !Catch::Contains("fsdp"));
  // A config that does not resolve (pp 3 does not divide 80 layers) is printed as given, not an error here.
  c.pp = 3;
  CHECK_NOTHROW(megatron_settings(c));
}

TEST_CASE("a selective recompute hbmsim can express is printed as Megatron's recompute modules", "[layout][plan]") {
  // The inverse of validation.cpp's reading of the corpus: core_attn is context=remat, mla_up_proj (MLA models
  // only) is query_proj, key_proj and value_proj=remat; core_attn alone is Megatron's default module.
  RunConfig c;
  c.model = "deepseek-v3-671b";
  c.policy = "no_recompute";
  for (const char* t : {"query_proj", "key_proj", "value_proj"}) c.tensors[t] = "remat";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--recompute-granularity selective --recompute-modules mla_up_proj") &&
                                       !Catch::Contains("no Megatron equivalent"));
  c.tensors["context"] = "remat";
  CHECK_THAT(megatron_settings(c), Catch::Contains("--recompute-modules core_attn mla_up_proj"));
  c.tensors.erase("context");
  c.policy = "selective";  // selective is no_recompute with context=remat
  CHECK_THAT(megatron_settings(c), Catch::Contains("--recompute-modules core_attn mla_up_proj"));
  c.tensors.clear();
  CHECK_THAT(megatron_settings(c), Catch::Contains("--recompute-granularity selective") && !Catch::Contains("--recompute-modules"));
  // Two of the three up-projections, an offload, or a model without MLA: no Megatron module does that.
  c.policy = "no_recompute";
  c.tensors = {{"query_proj", "remat"}, {"key_proj", "remat"}};
  CHECK_THAT(megatron_settings(c), Catch::Contains("no Megatron equivalent") && !Catch::Contains("--recompute-granularity"));
  c.tensors = {{"context", "offload"}};
  CHECK_THAT(megatron_settings(c), Catch::Contains("no Megatron equivalent"));
  c.model = "llama3.1-8b";
  for (const char* t : {"query_proj", "key_proj", "value_proj"}) c.tensors[t] = "remat";
  c.tensors.erase("context");
  CHECK_THAT(megatron_settings(c), Catch::Contains("no Megatron equivalent") && !Catch::Contains("mla_up_proj"));
  // layernorm is the norms that are modules of their own: in DeepSeek-V3 (MLA, MoE and 3 dense layers) the
  // input norm and the MoE layers' pre-MLP norm (the dense layers' is fused into their first GEMM), so the
  // pre-MLP norm alone, or of every layer, is no module there; moe_act the experts' activation.
  c.model = "deepseek-v3-671b";
  c.tensors = {{"attn_norm", "remat"}, {"mlp_norm@moe", "remat"}, {"moe_mlp_act", "remat"}};
  CHECK_THAT(megatron_settings(c), Catch::Contains("--recompute-modules moe_act layernorm"));
  c.tensors = {{"attn_norm", "remat"}, {"mlp_norm", "remat"}, {"moe_mlp_act", "remat"}};
  CHECK_THAT(megatron_settings(c), Catch::Contains("no Megatron equivalent"));
  c.tensors = {{"mlp_norm@moe", "remat"}};
  CHECK_THAT(megatron_settings(c), Catch::Contains("no Megatron equivalent"));
}

TEST_CASE("the MaxText keys carry a Megatron batch in MaxText's terms, accumulation included", "[layout][plan]") {
  // Llama 3.1 405B on 128 GPUs, tp 4 x pp 8 x dp 4, Megatron micro-batch 1, global 256. By hand: MaxText's
  // per-device batch is per step under pipelining, 256 / 128 = 2, and the step's 2 x 32 = 64 sequences per replica
  // go through as 64 micro-batches of 1. (It printed 1 / tp = 0.25 and pp = 8 micro-batches.)
  RunConfig c;
  c.model = "llama3.1-405b";
  c.gpus = 128;
  c.tp = 4;
  c.pp = 8;
  c.vp = 4;
  c.dp = 4;
  c.fsdp = 1;
  c.micro_batch = 1;
  c.global_batch = 256;
  c.embedding_as_layer = c.loss_as_layer = true;
  CHECK_THAT(maxtext_settings(c), Catch::Contains("per_device_batch_size=2 ") && Catch::Contains("num_pipeline_microbatches=64 "));
  // Without a pipeline, gradient accumulation is its own key and the per-device batch is per micro-step:
  // Llama 3.1 8B on 8 GPUs, batch 2, grad_accum 4.
  RunConfig a;
  a.model = "llama3.1-8b";
  a.gpus = 8;
  a.batch = 2.0;
  a.grad_accum = 4;
  CHECK_THAT(maxtext_settings(a), Catch::Contains("per_device_batch_size=2 ") && Catch::Contains("gradient_accumulation_steps=4 "));
  a.grad_accum = 1;
  CHECK_THAT(maxtext_settings(a), !Catch::Contains("gradient_accumulation_steps"));
}

TEST_CASE("the MaxText pipeline keys give the layers per stage and the repeats MaxText's assertion needs", "[layout][plan]") {
  // MaxText asserts stages x num_pipeline_repeats x num_layers_per_pipeline_stage = layers, and by default takes one
  // layer per stage with the repeats derived (a circular pipeline). Llama 3.1 70B's 80 layers: pp 4 x vp 5 is 4
  // layers per stage and repeat; pp 4 alone, 20 layers per stage and one repeat.
  RunConfig c;
  c.model = "llama3.1-70b";
  c.gpus = 64;
  c.tp = 4;
  c.pp = 4;
  c.vp = 5;
  c.dp = 4;
  c.fsdp = 1;
  c.batch = 1.0;
  CHECK_THAT(maxtext_settings(c), Catch::Contains(" num_layers_per_pipeline_stage=4 num_pipeline_repeats=5") && !Catch::Contains("no equivalent"));
  c.vp = 1;
  CHECK_THAT(maxtext_settings(c), Catch::Contains(" num_layers_per_pipeline_stage=20 num_pipeline_repeats=1") &&
                                     !Catch::Contains("divisible by the stages"));
  c.microbatches = 6;  // MaxText asserts the micro-batches divide over the stages: 6 over 4 do not
  CHECK_THAT(maxtext_settings(c), Catch::Contains("num_pipeline_microbatches=6 ") && Catch::Contains("6 over pp 4 is no MaxText run"));
  c.microbatches = 0;
  c.first_stage_layers = 19;  // uneven (19, 20, 20, 21): no MaxText split gives it
  CHECK_THAT(maxtext_settings(c), Catch::Contains("MaxText has no equivalent") && !Catch::Contains("num_layers_per_pipeline_stage="));
  // Llama 3.1 405B's 126 layers over 8 x 4 chunks only with the embedding and loss counted as layers: uneven too.
  c.model = "llama3.1-405b";
  c.first_stage_layers = 0;
  c.pp = 8;
  c.vp = 4;
  c.gpus = 128;
  c.embedding_as_layer = c.loss_as_layer = true;
  CHECK_THAT(maxtext_settings(c), Catch::Contains("MaxText has no equivalent"));
  // DeepSeek-V3: MaxText pipelines its 58 MoE layers only, the 3 dense ones outside.
  c.model = "deepseek-v3-671b";
  c.embedding_as_layer = c.loss_as_layer = false;
  c.pp = 2;
  c.vp = 1;
  c.tp = 1;
  c.pipeline_layout = "Et*31|t*30L";
  CHECK_THAT(maxtext_settings(c), Catch::Contains("pipelines only a DeepSeek-style model's MoE layers"));
  // No pipeline, no pipeline keys.
  c.pp = 1;
  c.pipeline_layout.clear();
  CHECK_THAT(maxtext_settings(c), !Catch::Contains("num_pipeline"));
}

TEST_CASE("best-policy over a batch list answers each batch as the single-batch search does", "[plan][cli]") {
  auto r = test::cli("plan best-policy --model llama3.1-8b --gpus 8 --system h100-hgx --names query_proj,mlpwo --batches 1,2 --json");
  REQUIRE(r.status == 0);
  auto doc = nlohmann::json::parse(r.out);
  REQUIRE(doc.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    RunConfig c;
    c.model = "llama3.1-8b";
    c.gpus = 8;
    c.system = "h100-hgx";
    c.batch = static_cast<double>(i + 1);
    const PolicySearch direct = best_policy(c, {"query_proj", "mlpwo"});
    CHECK(doc[i]["batch"] == static_cast<double>(i + 1));
    CHECK(doc[i]["best"]["tflops_per_device"].get<double>() == direct.best.report.tflops_per_device);
    // The fastest placement closes the Pareto front, with the recompute and copy waits of its report.
    const auto& last = doc[i]["pareto"].back();
    CHECK(last["placement"] == doc[i]["placement"]);
    CHECK(last["recompute_s"].get<double>() == doc[i]["best"]["compute_s"]["recompute"].get<double>());
    CHECK(last["host_copies_exposed_s"].get<double>() ==
          doc[i]["best"]["exposed_s"]["d2h"].get<double>() + doc[i]["best"]["exposed_s"]["h2d"].get<double>());
  }
  auto text = test::cli("plan best-policy --model llama3.1-8b --gpus 8 --system h100-hgx --names query_proj,mlpwo --batches 1,2");
  CHECK_THAT(text.out, Catch::Contains("fastest: batch"));
  CHECK(test::cli("plan best-policy --model llama3.1-8b --batches 0").status == 2);
}

TEST_CASE("a search whose every candidate is refused says the most common reason", "[layout]") {
  // Megatron's sync-free expert buffers need the flex dispatcher; the base keeps alltoall, so every layout with
  // experts over ep > 1 is refused for it, and those with ep 1 for needing ep > 1.
  RunConfig base;
  base.system = "gb300-nvl72";
  base.model = "deepseek-v3-671b";
  base.framework = "megatron";
  base.gpus = 64;
  base.seq = 4096;
  base.moe_capacity_factor = 1.5;
  LayoutSearchOptions o;
  o.top = 3;
  o.policies = {"no_recompute"};
  o.micro_batches = {1};
  const LayoutSearch r = search_layouts(base, o);
  CHECK(r.top.empty());
  CHECK(r.simulated == 0);
  REQUIRE(r.refused == r.candidates);
  CHECK_THAT(r.none_fit, Catch::StartsWith("no candidate layout: every combination was refused (GPUs 64); the most common reason ("));
  CHECK_THAT(r.none_fit, Catch::EndsWith("): moe_capacity_factor = 1.5 (Megatron sizes HybridEP's buffers with it: needs moe_dispatcher "
                                         "flex, not alltoall)"));
}
