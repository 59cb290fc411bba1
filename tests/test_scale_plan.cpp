// plan scale: the fastest layout at each GPU count at one global batch, and the days a token budget takes.
#include <cmath>
#include <limits>
#include <sstream>

#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "planner/layout_search.hpp"
#include "planner/plan_json.hpp"
#include "planner/scale_plan.hpp"
#include "planner/sweep.hpp"

using namespace hbmsim;

namespace {

// Llama 3.1 8B on H100s at seq 2048, 32 sequences per step, full recompute and micro-batch 1: a search small enough
// to run at a few counts under the sanitizers.
RunConfig llama8b_h100() {
  RunConfig base;
  base.system = "h100-hgx";
  base.model = "llama3.1-8b";
  base.seq = 2048;
  base.global_batch = 32;
  return base;
}

ScalePlanOptions small_search(std::vector<std::int64_t> counts, double tokens, double days = 0) {
  ScalePlanOptions o;
  o.gpu_counts = std::move(counts);
  o.tokens = tokens;
  o.days = days;
  o.search.policies = {"full"};
  o.search.micro_batches = {1};
  return o;
}

// A plan's rows by hand: per row its GPUs and its winner's tokens/s per GPU (0: nothing fits there).
ScalePlan plan_by_hand(std::initializer_list<std::pair<std::int64_t, double>> rows) {
  ScalePlan plan;
  for (const auto& [gpus, per_gpu] : rows) {
    ScaleRow row;
    row.gpus = gpus;
    if (per_gpu > 0) {
      LayoutResult best;
      best.report.tokens_per_s_per_device = per_gpu;
      row.search.top.push_back(best);
    }
    plan.rows.push_back(row);
  }
  return plan;
}

}  // namespace

TEST_CASE("plan scale ranks at each count what plan layout ranks first, and prices the budget by hand", "[scale][layout]") {
  const RunConfig base = llama8b_h100();
  const double tokens = 1e11;
  const ScalePlan r = plan_scale(base, small_search({16, 8}, tokens));
  REQUIRE(r.rows.size() == 2);
  CHECK(r.global_batch == 32);
  CHECK(r.fewest_within_days == 0);  // no deadline asked
  const double first_per_gpu = r.rows.front().search.top.at(0).report.tokens_per_s_per_device;
  const std::int64_t expected_counts[] = {8, 16};  // ascending, whatever order they were given in
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const ScaleRow& row = r.rows[i];
    INFO(row.gpus << " GPUs");
    CHECK(row.gpus == expected_counts[i]);
    REQUIRE(row.fits());
    // The layout search at that count, run here on its own, ranks the same layout first.
    RunConfig at = base;
    at.gpus = row.gpus;
    LayoutSearchOptions o;
    o.top = 1;
    o.policies = {"full"};
    o.micro_batches = {1};
    const LayoutSearch alone = search_layouts(at, o);
    REQUIRE(alone.top.size() == 1);
    CHECK(config_id(alone.top[0].config) == config_id(row.search.top[0].config));
    const double per_gpu = row.search.top[0].report.tokens_per_s_per_device;
    CHECK(per_gpu == alone.top[0].report.tokens_per_s_per_device);
    // Every count runs the same 32 x 2048 tokens per step: tokens/s per GPU = 65,536 / (step x GPUs).
    CHECK(per_gpu == Approx(32.0 * 2048 / (row.search.top[0].report.step_time_s * static_cast<double>(row.gpus))).epsilon(1e-12));
    // days = tokens / (tokens/s per GPU x GPUs) / 86,400 s; GPU-hours = days x 24 x GPUs.
    const double days = tokens / (per_gpu * static_cast<double>(row.gpus)) / 86400;
    CHECK(row.days == Approx(days).epsilon(1e-12));
    CHECK(row.gpu_hours == Approx(days * 24 * static_cast<double>(row.gpus)).epsilon(1e-12));
    CHECK(row.scaling == Approx(per_gpu / first_per_gpu).epsilon(1e-12));
  }
  CHECK(r.rows[0].scaling == 1);
  // The JSON carries the same rows (Python's plan_scale reads it).
  const auto doc = scale_plan_json(r);
  REQUIRE(doc["rows"].size() == 2);
  CHECK(doc["rows"][1]["gpus"] == 16);
  CHECK(doc["rows"][1]["tokens_per_s"].get<double>() == Approx(r.rows[1].search.top[0].report.tokens_per_s_per_device * 16).epsilon(1e-12));
  CHECK(doc["rows"][1]["search"]["top"].size() == 1);
}

TEST_CASE("plan scale names the fewest GPUs that meet a deadline, or none", "[scale]") {
  // Rows by hand: 8 GPUs at 100 tokens/s each and 16 at 90 (a step of 32 x 2048 tokens): 10^9 tokens take
  // 10^9 / 800 / 86,400 = 14.47 days on 8 and 10^9 / 1,440 / 86,400 = 8.04 days on 16.
  ScalePlan plan = plan_by_hand({{8, 100}, {16, 90}, {32, 0}});
  price_scale_plan(plan, 1e9, 30);
  CHECK(plan.rows[0].days == Approx(1e9 / 800 / 86400));
  CHECK(plan.rows[1].days == Approx(1e9 / 1440 / 86400));
  CHECK(plan.rows[1].gpu_hours == Approx(1e9 / 1440 / 3600 * 16));
  CHECK(plan.rows[1].scaling == Approx(0.9));
  CHECK(plan.rows[2].days == 0);  // nothing fits there
  CHECK(plan.fewest_within_days == 8);
  price_scale_plan(plan, 1e9, 10);
  CHECK(plan.fewest_within_days == 16);
  price_scale_plan(plan, 1e9, 8);
  CHECK(plan.fewest_within_days == -1);
  price_scale_plan(plan, 0, 0);  // no budget: no days, no deadline
  CHECK(plan.rows[0].days == 0);
  CHECK(plan.rows[1].scaling == Approx(0.9));
  CHECK(plan.fewest_within_days == 0);
}

TEST_CASE("a plan compared with other systems' answers with its deadline's row, else its most tokens/s", "[scale]") {
  // Rows by hand: 8 GPUs at 100 tokens/s each (800 in all), 16 at 90 (1,440), 32 at 40 (1,280), 64 nothing fits.
  ScalePlan plan = plan_by_hand({{8, 100}, {16, 90}, {32, 40}, {64, 0}});
  CHECK(plan.rows[2].tokens_per_s() == 1280);
  CHECK(plan.rows[3].tokens_per_s() == 0);
  price_scale_plan(plan, 0, 0);  // no deadline: the most tokens/s in all is 16 GPUs' 1,440, not the largest count's
  REQUIRE(scale_answer(plan) != nullptr);
  CHECK(scale_answer(plan)->gpus == 16);
  // 10^9 tokens within 10 days: 8 GPUs take 14.5, 16 take 8.0 (above): 16 is the fewest; within 5 days none.
  price_scale_plan(plan, 1e9, 10);
  REQUIRE(scale_answer(plan) != nullptr);
  CHECK(scale_answer(plan)->gpus == 16);
  price_scale_plan(plan, 1e9, 5);
  CHECK(scale_answer(plan) == nullptr);
  ScalePlan none;
  none.rows.resize(1);
  CHECK(scale_answer(none) == nullptr);  // nothing fits anywhere
}

TEST_CASE("plan scale holds one global batch: the config's, else one sequence per GPU at the largest count", "[scale]") {
  RunConfig base = llama8b_h100();
  base.global_batch = 0;
  CHECK(scale_global_batch(base, {8, 32, 16}) == 32);
  base.global_batch = 48;
  CHECK(scale_global_batch(base, {8, 32, 16}) == 48);
  base.global_batch = 0;
  const ScalePlan r = plan_scale(base, small_search({8, 16}, 0));
  CHECK(r.global_batch == 16);
  for (const ScaleRow& row : r.rows) {
    REQUIRE(row.fits());
    CHECK(row.search.top[0].report.global_batch == 16);
    CHECK(row.days == 0);  // no budget
    CHECK(row.gpu_hours == 0);
  }
}

TEST_CASE("plan scale refuses options no plan can use, naming the field and value", "[scale][errors]") {
  const RunConfig base = llama8b_h100();
  auto message = [&](ScalePlanOptions o) {
    try {
      check_scale_options(base, o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message(small_search({}, 0)) == "gpus = [] (give the GPU counts to compare)");
  CHECK(message(small_search({8, 0}, 0)) == "gpus = 0 (a GPU count must be at least 1)");
  CHECK(message(small_search({8, 16, 8}, 0)) == "gpus = 8 (given twice)");
  CHECK(message(small_search({8}, std::nan(""))) == "tokens = nan (must be a finite number, at least 0)");
  CHECK(message(small_search({8}, 1e12, -1)) == "days = -1 (must be a finite number, at least 0)");
  CHECK(message(small_search({8}, 1e12, std::numeric_limits<double>::infinity())) == "days = inf (must be a finite number, at least 0)");
  CHECK(message(small_search({8}, 0, 30)) == "days = 30 (a deadline needs a token budget)");
  auto held = small_search({8, 12}, 0);
  held.search.held["tp"] = {8};
  CHECK(message(held) == "tp = 8 (it does not divide the 12 GPUs) at 12 GPUs");
  CHECK(message(small_search({8, 16}, 1e12, 30)) == "accepted");
}

TEST_CASE("hbmsim plan scale prints a row per count, answers as plan layout does, and exits 2 on bad flags", "[scale][cli]") {
  const std::string run = "plan scale --model llama3.1-8b --system h100-hgx --seq 2048 --global-batch 32 --policies full --micro-batches 1 ";
  auto j = test::cli(run + "--gpus 16,8 --tokens 1e11 --json");
  REQUIRE(j.status == 0);
  const auto doc = nlohmann::json::parse(j.out);
  REQUIRE(doc["rows"].size() == 2);
  for (const auto& row : doc["rows"]) {
    const auto n = row["gpus"].get<std::int64_t>();
    auto layout = test::cli("plan layout --model llama3.1-8b --system h100-hgx --seq 2048 --global-batch 32 --policies full "
                            "--micro-batches 1 --top 1 --json --gpus " + std::to_string(n));
    REQUIRE(layout.status == 0);
    CHECK(row["search"]["top"][0] == nlohmann::json::parse(layout.out)["top"][0]);
  }
  auto text = test::cli(run + "--gpus 8,16 --tokens 1e11 --days 1000 --progress off");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Catch::StartsWith("scale: llama3.1-8b on h100-hgx GPUs, seq 2048, global batch 32 sequences (0.1 M tokens per step); "
                                         "budget 0.1 T tokens within 1000 days"));
  CHECK_THAT(text.out, Catch::Contains("k GPU-hours") && Catch::Contains("fewest GPUs within 1000 days: 8 (") &&
                           Catch::Contains("Megatron: --tensor-model-parallel-size"));
  for (const std::string bad : {"--gpus 8,8", "--gpus 0", "--gpus 8,x", "--days 3", "--tokens -1", "--gpus 8,12 --tp 8", "--jobs 0"}) {
    auto b = test::cli(run + bad);
    INFO(bad << ": " << b.err);
    CHECK(b.status == 2);
    CHECK(b.out.empty());
    CHECK_THAT(b.err, Catch::Contains(bad.substr(bad.rfind("--"), bad.find(' ', bad.rfind("--")) - bad.rfind("--"))));
  }
  CHECK_THAT(test::cli(run + "--gpus 8,12 --tp 8").err, Catch::Contains("--tp = 8 (it does not divide the 12 GPUs) at 12 GPUs"));
}

TEST_CASE("hbmsim plan scale --system a,b plans each system as alone, then compares their answers", "[scale][cli]") {
  const std::string run = "plan scale --model llama3.1-8b --seq 2048 --global-batch 32 --policies full --micro-batches 1 --fsdp 8 --gpus 8 ";
  auto both = test::cli(run + "--system h100-hgx,h200-hgx --json");
  REQUIRE(both.status == 0);
  const auto doc = nlohmann::json::parse(both.out);
  REQUIRE(doc["systems"].size() == 2);
  const char* systems[] = {"h100-hgx", "h200-hgx"};
  std::vector<double> per_gpu;
  for (std::size_t i = 0; i < 2; ++i) {
    auto alone = test::cli(run + "--system " + systems[i] + " --json");
    REQUIRE(alone.status == 0);
    CHECK(doc["systems"][i] == nlohmann::json::parse(alone.out));  // in the order given, each as asked alone
    CHECK(doc["systems"][i]["system"] == systems[i]);
    per_gpu.push_back(doc["systems"][i]["rows"][0]["search"]["top"][0]["report"]["tokens_per_s_per_device"].get<double>());
  }
  auto text = test::cli(run + "--system h100-hgx,h200-hgx --progress off");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Catch::Contains("scale: llama3.1-8b on h100-hgx GPUs") && Catch::Contains("scale: llama3.1-8b on h200-hgx GPUs") &&
                           Catch::Contains("systems compared (each at the count with the most tokens/s):"));
  // The comparison's rows (the last two lines): the system, its one count, and the tokens/s per GPU its own plan found.
  std::vector<std::string> lines;
  std::istringstream in(text.out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() > 2);
  for (std::size_t i = 0; i < 2; ++i) {
    std::istringstream row(lines[lines.size() - 2 + i]);
    std::string system;
    std::int64_t gpus = 0;
    double tokens = 0;
    row >> system >> gpus >> tokens;
    CHECK(system == systems[i]);
    CHECK(gpus == 8);
    CHECK(tokens == Approx(per_gpu[i]).margin(0.5));
  }
  for (const std::string bad : {"h100-hgx,nosuch", "h100-hgx,h100-hgx", "h100-hgx,"}) {
    auto b = test::cli(run + "--system " + bad);
    INFO(bad << ": " << b.err);
    CHECK(b.status == 2);
    CHECK(b.out.empty());
    CHECK_THAT(b.err, Catch::StartsWith("hbmsim: --system = \""));
  }
}
