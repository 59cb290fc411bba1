// Paths no other suite exercised, each checked against a value derived by hand in the test's comment:
// gradient accumulation, un-pipelined collectives, the pipelined-transfer deadline, the host-memory verdict,
// dtype-weighted MFU, the engine's forced gate and deadlock, hbm-needed, fit leave-one-out, MLA without a
// query LoRA, and host-link sharing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <map>

#include "helpers.hpp"
#include "hwmodels/catalog.hpp"
#include "planner/fit.hpp"
#include "planner/plan.hpp"
#include "planner/run_config.hpp"
#include "sim/engine.hpp"
#include "workloads/model.hpp"

using namespace hbmsim;

namespace {
constexpr double GiB = 1073741824.0;

// Llama 3.1 8B: E = 4096, H = 32 query heads, Hkv = 8, D = 128, F = 14336, V = 128256, 32 layers.
constexpr double E = 4096, H = 32, Hkv = 8, D = 128, F = 14336, V = 128256, L = 32;

// Llama 3.1 8B on 8 H200s (FSDP 8), batch 2 x seq 4096: T = 8192 tokens per device per micro-step.
RunConfig llama8b(const std::string& policy) { return test::llama8b_h200(policy); }

// One step's program and every op's times, by op name (the first op of that name unless `nth`).
struct Timeline {
  std::vector<std::string> names;
  sim::Program program;
  sim::EngineResult result;

  std::size_t id(const std::string& op, int nth = 0) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == op && nth-- == 0) return i;
    FAIL("no op named " << op);
    return 0;
  }
  int count(const std::string& op) const { return static_cast<int>(std::count(names.begin(), names.end(), op)); }
  double start(const std::string& op, int nth = 0) const { return result.start_s[id(op, nth)]; }
  double end(const std::string& op, int nth = 0) const { return result.end_s[id(op, nth)]; }
  double duration(const std::string& op, int nth = 0) const { return end(op, nth) - start(op, nth); }
  bool waits_for(const std::string& op, const std::string& dep) const {
    const auto& deps = program.ops[id(op)].deps;
    return std::count(deps.begin(), deps.end(), static_cast<int>(id(dep))) == 1;
  }
};

Timeline timeline_of(PreparedRun run) {
  Timeline t;
  t.program = build_program(run.graph, run.system, run.policy, run.options, &t.names);
  t.result = sim::run_program(t.program, true);
  return t;
}
Timeline timeline(const RunConfig& c) { return timeline_of(prepare_run(c)); }

// Forward FLOPs of one Llama 8B layer over T tokens, by op group (the model FLOPs formula's terms).
struct LayerFlops {
  double mlp, projections, attention;
};
LayerFlops llama8b_layer(double T, double S) {
  return {3 * 2 * T * E * F,                                   // wi_0, wi_1, wo
          2 * T * E * (H + 2 * Hkv) * D + 2 * T * H * D * E,   // wq, wk, wv, wo_attn
          4 * T * S * H * D / 2};                              // causal attention: half the scores
}
}  // namespace

TEST_CASE("gradient accumulation 2 runs two micro-steps and one optimizer update", "[paths][grad_accum]") {
  // Per micro-step (T = 8192 tokens, S = 4096): model FLOPs = 3 x (L x (mlp + projections + attention) +
  // 2 T E V), three for forward plus backward; grad_accum 2 doubles them and the tokens (2 x 4096 x 2 =
  // 16384 per device, 2 x 8 x 2 = 32 sequences per step) but runs the optimizer once.
  RunConfig c = llama8b("full");
  const auto one = timeline(c);
  const auto r1 = run_simulation(c);
  c.grad_accum = 2;
  const auto two = timeline(c);
  const auto r2 = run_simulation(c);
  const auto f = llama8b_layer(8192, 4096);
  const double per_micro_step = 3 * (L * (f.mlp + f.projections + f.attention) + 2 * 8192 * E * V);
  CHECK(r1.model_flops_per_device == Approx(per_micro_step).epsilon(1e-12));
  CHECK(r2.model_flops_per_device == Approx(2 * per_micro_step).epsilon(1e-12));
  CHECK(r1.tokens_per_device_per_step == 8192);
  CHECK(r2.tokens_per_device_per_step == 16384);
  CHECK(r2.global_batch == 32);
  CHECK(r2.grad_accum == 2);
  // Two micro-steps execute every layer op twice (remat included); the optimizer does no GEMM FLOPs.
  CHECK(r2.executed_flops_per_device == Approx(2 * r1.executed_flops_per_device).epsilon(1e-12));
  CHECK(one.count("wq L5") == 1);
  CHECK(two.count("wq L5") == 2);
  CHECK(one.count("optimizer_update") == 1);
  CHECK(two.count("optimizer_update") == 1);
  // The compute stream is busy with two micro-steps' ops and one update: 2 x busy(1) - update.
  const double update = one.duration("optimizer_update");
  REQUIRE(update > 0);
  CHECK(two.duration("optimizer_update") == Approx(update).epsilon(1e-12));
  CHECK(r2.busy_s.at("compute") == Approx(2 * r1.busy_s.at("compute") - update).epsilon(1e-9));
  // So the step is under two single steps (one update saved) and at least the compute it holds.
  CHECK(r2.step_time_s < 2 * r1.step_time_s - 0.5 * update);
  CHECK(r2.step_time_s >= 2 * r1.busy_s.at("compute") - update);
  // The update comes after the second micro-step's last backward op, once.
  CHECK(two.start("optimizer_update") >= two.end("bwd attn_norm L0", 1));
}

TEST_CASE("without pipelined collectives each FSDP all-gather waits for the layer before and the layer waits for it",
          "[paths][fsdp]") {
  // XLA's collective pipeliner issues layer l's all-gather while layer l-1 computes. Without it the gather
  // sits at the top of its own iteration: it starts when layer l-1's last op ends and layer l's first op
  // starts when it ends, so the compute stream idles for every forward gather in full. The exposed FSDP
  // time is therefore at least the sum of the forward gathers' durations (layers 1-31), read off the ops.
  RunConfig c = llama8b("full");
  const auto on = timeline(c);
  c.pipelined_collectives = false;
  const auto off = timeline(c);
  double forward_gathers = 0;
  for (int l = 1; l < 32; ++l) {
    const std::string me = " L" + std::to_string(l), before = " L" + std::to_string(l - 1);
    INFO("layer " << l);
    CHECK(off.start("all_gather" + me) >= off.end("residual_mlp" + before) - 1e-12);
    CHECK(off.start("attn_norm" + me) >= off.end("all_gather" + me) - 1e-12);
    CHECK(on.start("all_gather" + me) < on.end("residual_mlp" + before));  // issued a layer ahead
    forward_gathers += off.duration("all_gather" + me);
  }
  auto exposed = [](const Timeline& t, const std::string& queue) {
    for (std::size_t q = 0; q < t.program.queues.size(); ++q)
      if (t.program.queues[q].name == queue) return t.result.exposed_s[q];
    return 0.0;
  };
  REQUIRE(forward_gathers > 0);
  CHECK(exposed(off, "fsdp") >= forward_gathers * (1 - 1e-9));
  CHECK(exposed(on, "fsdp") < 0.5 * exposed(off, "fsdp"));
  CHECK(on.result.end_time_s < off.result.end_time_s);
}

TEST_CASE("pipelined transfers: a layer's D2H copies are due by the end of the next iteration, not of their own",
          "[paths][pipelined_transfers]") {
  // QKV offloaded with LHS, the host link cut to 2 GB/s so that the copies, 96 MiB per layer (50 ms), bound
  // the forward pass (a layer computes in a few ms). Without pipelining, layer l+1's first op waits for layer
  // l's copies; with it, layer l+1 runs while they are in flight and layer l+2's first op waits for them.
  RunConfig c = llama8b("qkv_proj_offloaded");
  c.lhs = true;
  c.host_link_bytes_per_s = 2e9;
  const auto plain = timeline(c);
  c.pipelined_transfers = true;
  const auto piped = timeline(c);
  auto copies_done = [](const Timeline& t, int l) {
    double done = 0;
    for (const char* n : {"query_proj", "key_proj", "value_proj"})
      done = std::max(done, t.end(std::string("d2h ") + n + " L" + std::to_string(l)));
    return done;
  };
  for (int l : {3, 10, 20}) {
    const std::string me = " L" + std::to_string(l), next = " L" + std::to_string(l + 1),
                      after = " L" + std::to_string(l + 2);
    INFO("layer " << l);
    CHECK(plain.waits_for("attn_norm" + next, "d2h query_proj" + me));
    CHECK(plain.start("attn_norm" + next) >= copies_done(plain, l) - 1e-12);
    CHECK(piped.waits_for("attn_norm" + after, "d2h query_proj" + me));
    CHECK_FALSE(piped.waits_for("attn_norm" + next, "d2h query_proj" + me));
    CHECK(piped.start("attn_norm" + after) >= copies_done(piped, l) - 1e-12);
    CHECK(piped.start("attn_norm" + next) < copies_done(piped, l));
  }
}

TEST_CASE("a run whose pinned host peak exceeds the host's capacity does not fit, for the host reason",
          "[paths][host_memory]") {
  // QKV offload of Llama 8B pins every layer's query, key and value until the backward fetches them:
  // 32 x (8192 x 32 x 128 + 2 x 8192 x 8 x 128) x 2 B = 32 x 96 MiB = 3 GiB. The H200 system file, with its
  // host memory cut: capacity per GPU = memory_bytes x host_pinned_fraction (0.8) / gpus_per_cpu (4).
  auto doc = nlohmann::json::parse(test::slurp(std::string(HBMSIM_SOURCE_DIR) + "/data/systems/h200-hgx.json"));
  REQUIRE(doc["runtime"]["host_pinned_fraction"]["value"].get<double>() == 0.8);
  REQUIRE(doc["host_cpu"]["gpus_per_cpu"].get<int>() == 4);
  auto with_host_memory = [&](double bytes, const std::string& name) {
    doc["host_cpu"]["memory_bytes"]["value"] = bytes;
    auto path = (test::temp_dir() / name).string();
    test::write(path, doc.dump());
    RunConfig c = llama8b("qkv_proj_offloaded");
    c.system = path;
    return run_simulation(c);
  };
  const double pinned = 32 * (8192.0 * 32 * 128 + 2 * 8192.0 * 8 * 128) * 2;
  REQUIRE(pinned == 3 * GiB);
  auto small = with_host_memory(10 * GiB, "h200-10g-host.json");  // 10 GiB x 0.8 / 4 = 2 GiB < 3 GiB
  CHECK(small.host_capacity_bytes == Approx(2 * GiB).epsilon(1e-12));
  CHECK(small.host_peak_bytes == pinned);
  CHECK(small.hbm_peak_bytes < small.hbm_capacity_bytes);  // HBM is not the reason
  CHECK_FALSE(small.fits);
  CHECK(small.fits_reason == "pinned host memory exceeds capacity");
  auto enough = with_host_memory(20 * GiB, "h200-20g-host.json");  // 4 GiB >= 3 GiB
  CHECK(enough.host_capacity_bytes == Approx(4 * GiB).epsilon(1e-12));
  CHECK(enough.host_peak_bytes == pinned);
  CHECK(enough.fits);
  CHECK(enough.fits_reason.empty());
}

TEST_CASE("MFU is measured against the peak of the dtypes the compute runs in, weighted by their FLOPs", "[paths][mfu]") {
  // With --weights fp8 the MLP GEMMs (wi_0, wi_1, wo: 3 x 2 T E F per layer) run at the fp8 peak; the
  // projections, attention and unembedding (2 T E V) stay bf16. The peak they run against is the FLOP-
  // weighted harmonic mean: total / (mlp / P8 + rest / P16). With bf16 weights it is P16 itself.
  RunConfig c = llama8b("full");
  const auto sys = prepare_run(c).system;
  const double P16 = sys.gpu.peak_flops(Dtype::bf16), P8 = sys.gpu.peak_flops(Dtype::fp8);
  REQUIRE(P16 == 989e12);  // H200 datasheet: 989 TFLOP/s bf16, 1979 fp8 (dense)
  REQUIRE(P8 == 1979e12);
  const auto bf16 = run_simulation(c);
  CHECK(bf16.mfu == Approx(bf16.model_flops_per_device / bf16.step_time_s / P16).epsilon(1e-12));
  c.weights = "fp8";
  const auto fp8 = run_simulation(c);
  const auto f = llama8b_layer(8192, 4096);
  const double mlp = L * f.mlp, rest = L * (f.projections + f.attention) + 2 * 8192 * E * V;
  const double peak = (mlp + rest) / (mlp / P8 + rest / P16);  // about 1.6e15 (71% of the FLOPs are MLP)
  CHECK(peak > P16);
  CHECK(peak < P8);
  CHECK(fp8.mfu == Approx(fp8.model_flops_per_device / fp8.step_time_s / peak).epsilon(1e-9));
  CHECK(fp8.model_flops_per_device == bf16.model_flops_per_device);  // model FLOPs do not depend on dtype
  CHECK(fp8.step_time_s < bf16.step_time_s);
}

TEST_CASE("a gated copy is forced only when nothing runs, one at a time, and may exceed the limit", "[paths][engine]") {
  // Limit 10 bytes; two 50-byte prefetches on one copy queue (each 1 GB at 10 GB/s = 0.1 s) can never fit.
  // A 1 s kernel runs first, so nothing is forced until t = 1; then the first copy starts (the queue's head),
  // the second waits behind it while it runs, and is forced at t = 1.1 when nothing runs again: 1.1 - 1.2.
  using namespace sim;
  Program p;
  p.hbm_limit_bytes[0] = 10;
  const int q = p.queue("h2d", QueueKind::concurrent, true);
  const int link = p.resource("h2d link", 10e9);
  p.add(ProgramOp(kComputeQueue, 1.0));
  std::vector<int> copies;
  for (int k = 0; k < 2; ++k) {
    ProgramOp o(q, 0.1);
    o.gate_bytes = 50;
    o.allocs = {p.add_buffer(50, MemCategory::offload_buffers)};
    const int id = p.add(o);
    p.use(id, link, 10e9);
    copies.push_back(id);
  }
  auto r = run_program(p, true);
  CHECK(r.start_s[static_cast<std::size_t>(copies[0])] == Approx(1.0));
  CHECK(r.end_s[static_cast<std::size_t>(copies[0])] == Approx(1.1));
  CHECK(r.start_s[static_cast<std::size_t>(copies[1])] == Approx(1.1));
  CHECK(r.end_time_s == Approx(1.2));
  // Neither buffer is ever released: both are live at the end, 100 bytes, ten times the limit.
  CHECK(r.memory[0].hbm_peak_bytes == 100);
}

TEST_CASE("a program that can never finish is a deadlock naming each waiting queue head and what it waits for", "[paths][engine]") {
  // The compute stream runs its ops in order: op 0 (1 s) runs, then op 1 waits for op 2, which sits behind
  // op 1 on the same queue. No copy queue holds anything to force, so at t = 1 the engine reports op 1.
  using namespace sim;
  Program p;
  p.add(ProgramOp(kComputeQueue, 1.0));
  ProgramOp blocked(kComputeQueue, 1.0);
  blocked.deps = {2};
  p.add(blocked);
  p.add(ProgramOp(kComputeQueue, 1.0));
  CHECK_THROWS_WITH(run_program(p, false),
                    "simulation deadlock at t = 1.000000 s, 1 of 3 ops done: op 1 (compute, phase f) waits for op 2 (compute, phase f)");
  // A gated copy that waits for an op that never starts is not forced either: still a deadlock, at op 1, with
  // the copy engine's head waiting for it.
  Program g;
  g.hbm_limit_bytes[0] = 10;
  const int q = g.queue("h2d", QueueKind::concurrent, true);
  g.add(ProgramOp(kComputeQueue, 1.0));
  g.add(blocked);
  g.add(ProgramOp(kComputeQueue, 1.0));
  ProgramOp copy(q, 0.1);
  copy.gate_bytes = 50;
  copy.deps = {1};
  g.add(copy);
  CHECK_THROWS_WITH(run_program(g, false), Catch::EndsWith("op 1 (compute, phase f) waits for op 2 (compute, phase f); op 3 (h2d, phase f) waits for op 1 (compute, phase f)"));
}

TEST_CASE("plan hbm-needed is the step's HBM peak, with the resident bytes of a by-hand parameter count", "[paths][plan]") {
  // Llama 8B parameters: 2 V E (embedding, unembedding) + E (final norm) + L x (2 E (norms) + E D (H + 2 Hkv)
  // + H D E + 3 E F) = 8,030,261,248. Per device over FSDP 8: fp32 weights (4 B), Adam moments (8 B) and
  // fp32 gradients (4 B), always resident, plus the 4 GiB runtime reserve, are a floor under the peak.
  const double P = 2 * V * E + E + L * (2 * E + E * D * (H + 2 * Hkv) + H * D * E + 3 * E * F);
  REQUIRE(P == 8030261248.0);
  RunConfig c = llama8b("full");
  auto need = hbm_needed(c);
  const auto& at_peak = need.report.hbm_breakdown_bytes;
  CHECK(at_peak.at("parameters") == Approx(4 * P / 8).epsilon(1e-12));
  CHECK(at_peak.at("optimizer_state") == Approx(8 * P / 8).epsilon(1e-12));
  CHECK(at_peak.at("gradients") == Approx(4 * P / 8).epsilon(1e-12));
  CHECK(need.hbm_bytes >= 16 * P / 8 + 4 * GiB);
  CHECK(need.capacity_bytes == 143771 * 1048576.0);  // H200: nvidia-smi 143,771 MiB
  CHECK(need.host_bytes == 0);          // nothing offloaded
  // Without offload nothing is gated by the capacity: simulate reports the same peak, and the step fits and keeps
  // its time from that peak on.
  const auto sim = run_simulation(c);
  CHECK(need.hbm_bytes == sim.hbm_peak_bytes);
  CHECK(need.fits_from_bytes == need.hbm_bytes);
  CHECK(need.full_speed_from_bytes == need.hbm_bytes);
  CHECK(need.step_time_at_fit_s == need.step_time_s);
  CHECK(need.step_time_s == sim.step_time_s);
  // With HBM cut below the need the answer is unchanged, the capacity is the what-if's, and the run OOMs.
  c.hbm_bytes = 0.5 * need.hbm_bytes;
  auto cut = hbm_needed(c);
  CHECK(cut.hbm_bytes == need.hbm_bytes);
  CHECK(cut.capacity_bytes == 0.5 * need.hbm_bytes);
  CHECK_FALSE(run_simulation(c).fits);
  // QKV offload pins 32 x 96 MiB = 3 GiB of host memory (the test above derives it).
  auto offload = hbm_needed(llama8b("qkv_proj_offloaded"));
  CHECK(offload.host_bytes == 3 * GiB);
  // The CLI prints the same figure.
  auto cli = test::cli("plan hbm-needed --system h200-hgx --model llama3.1-8b --gpus 8 --batch 2 --seq 4096 --policy full --json");
  REQUIRE(cli.status == 0);
  CHECK(nlohmann::json::parse(cli.out)["hbm_needed_bytes"].get<double>() == need.hbm_bytes);
}

TEST_CASE("plan hbm-needed under LHS: the least HBM that fits and the least that keeps the step, each checked by runs on either side",
          "[paths][plan]") {
  // DeepSeek-V3 on 128 Vera Rubin GPUs, ep 8, every large tensor offloaded under LHS. With HBM no object its peak
  // holds prefetches that LHS holds back at a capacity that size (its limit is 95% of HBM less a backward
  // iteration's needs), so the step fits below its own peak, slower, and needs more than the peak to keep its
  // time. Until the fifty-fifth session the plan gave only the peak: a run at 99.5% of it fit.
  RunConfig c;
  c.model = "deepseek-v3-671b";
  c.system = "vr-nvl144";
  c.gpus = 128;
  c.ep = 8;
  c.seq = 8192;
  c.batch = 1;
  c.lhs = true;
  c.sequence_parallel = true;
  c.policy = "minimal_offloaded";
  const HbmNeeded need = hbm_needed(c);
  REQUIRE(need.fits_from_bytes < need.hbm_bytes);
  REQUIRE(need.full_speed_from_bytes > need.hbm_bytes);
  auto at = [&](double bytes) {
    RunConfig x = c;
    x.hbm_bytes = bytes;
    return run_simulation(x);
  };
  auto hbm_fits = [](const StepReport& r) { return r.hbm_peak_bytes <= r.hbm_capacity_bytes; };
  const StepReport fit = at(need.fits_from_bytes), below = at(need.fits_from_bytes / 1.002);
  CHECK(hbm_fits(fit));
  CHECK_FALSE(hbm_fits(below));
  CHECK(fit.step_time_s == need.step_time_at_fit_s);
  CHECK(need.step_time_at_fit_s > need.step_time_s);
  const StepReport full = at(need.full_speed_from_bytes), less = at(need.full_speed_from_bytes / 1.002);
  CHECK(full.step_time_s == Approx(need.step_time_s).epsilon(1e-9));
  CHECK(less.step_time_s > need.step_time_s * (1 + 1e-9));
  // At the system's own HBM (277.5 GiB, above both) the step is the one with HBM no object.
  CHECK(need.capacity_bytes > need.full_speed_from_bytes);
  CHECK(run_simulation(c).step_time_s == need.step_time_s);
  // The CLI says so in words.
  auto cli = test::cli("plan hbm-needed --model deepseek-v3-671b --system vr-nvl144 --gpus 128 --ep 8 --seq 8192 --batch 1 --lhs on "
                       "--sequence-parallel on --policy minimal_offloaded");
  REQUIRE(cli.status == 0);
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", need.fits_from_bytes / GiB);
  CHECK_THAT(cli.out, Catch::Contains(std::string("the step fits from ") + text + " GiB"));
}

TEST_CASE("leave-one-out fits predict each run from the others: a corrupted run is predicted as the truth", "[paths][fit]") {
  // Synthetic measurements: hbmsim's own predictions with gemm_scale = 0.8. Four runs carry TFLOP/s, a fifth
  // only an HBM figure (it is in no TFLOP/s fit, and has no leave-one-out row). Fitted on the others, each
  // clean run's prediction reproduces its measurement (within 1%). Then run 0's measurement is multiplied
  // by 1.3: the fit without it still finds 0.8, so its leave-one-out prediction is the truth, 1/1.3 of what
  // it claims (error 1/1.3 - 1 = -23%); a fit that kept it would be pulled towards it.
  std::vector<MeasuredRun> runs;
  for (auto policy : {"full", "save_qkv_proj"})
    for (std::int64_t batch : {1, 2}) {
      RunConfig c = llama8b(policy);
      c.batch = batch;
      c.seq = 2048;
      runs.push_back({std::string(policy) + "-" + std::to_string(batch), "", c, 1.0, std::nullopt});
    }
  const auto truth = predict_with(runs, {{"gemm_scale", 0.8}}, 2);
  for (std::size_t i = 0; i < runs.size(); ++i) runs[i].tflops_per_device = truth[i].tflops_per_device;
  RunConfig hbm_only = llama8b("full");
  hbm_only.seq = 2048;
  runs.push_back({"hbm-only", "", hbm_only, std::nullopt, 30e9});
  const std::vector<FitParameter> ps = {{"gemm_scale", 0.5, 1.3, 1.0, ""}};
  FitOptions o;
  o.leave_one_out = true;
  o.max_evaluations = 60;
  auto clean = fit_parameters(runs, ps, o);
  REQUIRE(clean.leave_one_out.size() == 4);  // the runs with TFLOP/s
  for (std::size_t i = 0; i < 4; ++i) {
    INFO(runs[i].id);
    CHECK(clean.leave_one_out[i].id == runs[i].id);
    CHECK(clean.leave_one_out[i].measured == *runs[i].tflops_per_device);
    CHECK(clean.leave_one_out[i].predicted == Approx(truth[i].tflops_per_device).epsilon(0.01));
  }
  runs[0].tflops_per_device = 1.3 * truth[0].tflops_per_device;
  auto dirty = fit_parameters(runs, ps, o);
  REQUIRE(dirty.leave_one_out.size() == 4);
  CHECK(dirty.leave_one_out[0].predicted == Approx(truth[0].tflops_per_device).epsilon(0.01));
  CHECK(dirty.leave_one_out[0].error() == Approx(1 / 1.3 - 1).margin(0.01));
  // Every other run's fit includes the corrupted one and overshoots its own measurement.
  for (std::size_t i = 1; i < 4; ++i) CHECK(dirty.leave_one_out[i].predicted > runs[i].tflops_per_device.value() * 1.01);
}

TEST_CASE("MLA without a query LoRA projects the query directly: parameters, FLOPs and GEMMs by hand", "[paths][mla]") {
  // DeepSeek-V3's shape (d = 7168, H = 128, nope 128 + rope 64 = qk 192, kv LoRA 512, v 128) with
  // q_lora_rank 0, or absent. Attention parameters per layer: 2 d (norms) + d H qk (wq) + d (512 + 64)
  // (wkv_a) + 512 (kv norm) + 512 H (128 + 128) (wkv_b) + H 128 d (wo) = 314,522,112; with the q LoRA
  // (1536) wq becomes d 1536 + 1536 + 1536 H qk, 48,760,320 instead of 176,160,768.
  const std::string src = std::string(HBMSIM_SOURCE_DIR) + "/data/models/deepseek-v3-671b.json";
  auto doc = nlohmann::json::parse(test::slurp(src));
  doc["q_lora_rank"] = 0;
  const auto zero_path = test::temp_dir() / "mla-no-q-lora.json";
  test::write(zero_path, doc.dump());
  doc.erase("q_lora_rank");
  const auto absent_path = test::temp_dir() / "mla-no-q-lora-key.json";
  test::write(absent_path, doc.dump());
  const ModelSpec lora = builtin_model("deepseek-v3-671b");
  const ModelSpec none = resolve_model(zero_path.string());
  CHECK(none.q_lora_rank == 0);
  CHECK(resolve_model(absent_path.string()).to_json() == none.to_json());
  const double d = 7168, h = 128, qk = 192;
  CHECK(none.attention_params_per_layer() == 314522112.0);
  CHECK(lora.attention_params_per_layer() - none.attention_params_per_layer() == (d * 1536 + 1536 + 1536 * h * qk) - d * h * qk);
  CHECK(none.total_params() - lora.total_params() == 61 * (176160768.0 - 48760320.0));
  // The HuggingFace loader's "q_lora_rank": null gives the same spec.
  auto hf = nlohmann::json::parse(test::slurp(std::string(HBMSIM_SOURCE_DIR) + "/data/hf/deepseek-v3.config.json"));
  hf["q_lora_rank"] = nullptr;
  CHECK(load_hf_config(hf, "hf.json").attention_params_per_layer() == none.attention_params_per_layer());
  // Model FLOPs per token and layer: the query term is 2 d H qk instead of 2 (d 1536 + 1536 H qk), x3.
  const double B = 1, S = 1024;
  CHECK(none.model_flops(B, S).weights_flops - lora.model_flops(B, S).weights_flops ==
        Approx(3 * 61 * 2 * B * S * (d * h * qk - (d * 1536 + 1536 * h * qk))).epsilon(1e-12));
  // The layer has one query GEMM, wq (2 T d H qk FLOPs), and no latent: no wq_a, wq_b or mla_q.
  RunConfig c;
  c.system = "gb200-nvl72";
  c.model = zero_path.string();
  c.gpus = 128;
  c.ep = 64;
  c.batch = 1;
  c.seq = 1024;
  auto run = prepare_run(c);
  const auto& layer = run.graph.layer(10);
  int wq = 0;
  for (const auto& op : layer.ops) {
    CHECK(op.name != "wq_a");
    CHECK(op.name != "wq_b");
    if (op.name == "wq") {
      ++wq;
      CHECK(op.flops == 2 * 1024 * d * h * qk);
    }
  }
  CHECK(wq == 1);
  for (const auto& t : layer.tensors) CHECK(t.name != "mla_q");
  CHECK(run.graph.tensor_bytes("query_proj", "moe") == 1024 * h * qk * 2);
  // And it simulates end to end.
  auto r = run_simulation(c);
  CHECK(r.step_time_s > 0);
  CHECK(r.model_flops_per_device == Approx(none.model_flops(B, S).total()).epsilon(1e-12));
}

TEST_CASE("GPUs sharing a host link get its per-direction bandwidth split, and copies take bytes over that share",
          "[paths][host_link]") {
  // GB200: one Grace's NVLink-C2C, 450 GB/s per direction, shared by its 2 GPUs: 225 GB/s each (the
  // datasheet D2H figure; H2D is the measured 176 GB/s). Without the measurement, gpus_sharing 1 gives a
  // GPU the whole 450 GB/s, exactly twice the share of 2. A copy alone then takes
  // bytes / (share x copy efficiency) + latency: here efficiency fixed at 0.8, latency 2 us, and query_proj
  // of Llama 8B at batch 2 x 4096 is 8192 x 32 x 128 x 2 B = 64 MiB.
  const System stock = builtin_system("gb200-nvl72");
  CHECK(stock.host_d2h_bytes_per_s() == 450e9 / 2);
  CHECK(stock.host_h2d_bytes_per_s() == 176e9);
  RunConfig c = llama8b("qkv_proj_offloaded");
  c.system = "gb200-nvl72";
  const double bytes = 8192.0 * 32 * 128 * 2;
  std::map<int, double> h2d_rate;
  for (int sharing : {1, 2}) {
    auto run = prepare_run(c);
    run.system.host_link.measured_h2d_bytes_per_s.reset();
    run.system.host_link.gpus_sharing = sharing;
    run.system.efficiency.copy = PiecewiseTable::constant(0.8);
    h2d_rate[sharing] = run.system.host_h2d_bytes_per_s();
    const double share = 450e9 / sharing;
    CHECK(h2d_rate[sharing] == share);
    const auto t = timeline_of(run);
    INFO("gpus_sharing " << sharing);
    for (const char* dir : {"h2d", "d2h"}) {
      const auto& op = t.program.ops[t.id(std::string(dir) + " query_proj L5")];
      CHECK(op.seconds == Approx(bytes / (share * 0.8) + 2e-6).epsilon(1e-12));
    }
    for (const auto& res : t.program.resources)
      if (res.name == "host link H2D" || res.name == "host link D2H") CHECK(res.capacity_bytes_per_s == share);
  }
  CHECK(h2d_rate[1] == 2 * h2d_rate[2]);
}

namespace {
// Llama 8B on 16 H200s as dp 2 x fsdp 8, Megatron state with the distributed optimizer.
RunConfig megatron_8b_dp2_fsdp8() {
  RunConfig c = test::llama8b_h200("full");
  c.gpus = 16;
  c.dp = 2;
  c.sharded_optimizer = true;
  c.framework = "megatron";
  return c;
}
}  // namespace

TEST_CASE("framework megatron keeps bf16 weights, fp32 gradients and 12 optimizer bytes per parameter", "[paths]") {
  // Megatron-Core mixed precision with the distributed optimizer: 2 + 4 + 12/d bytes per parameter
  // (its distributed-optimizer docs). Llama 8B on 16 GPUs as dp 2 x fsdp 8: each device holds P/8 of the
  // weights; the optimizer state is further split over dp 2.
  RunConfig c = megatron_8b_dp2_fsdp8();
  const double P = resolve_model(c.model).total_params();
  const auto r = run_simulation(c);
  CHECK(r.hbm_breakdown_bytes.at("parameters") == Approx(2 * P / 8).epsilon(1e-12));
  CHECK(r.hbm_breakdown_bytes.at("gradients") == Approx(4 * P / 8).epsilon(1e-12));
  CHECK(r.hbm_breakdown_bytes.at("optimizer_state") == Approx(12 * P / 8 / 2).epsilon(1e-12));
  c.framework = "maxtext";  // fp32 weights and gradients, two fp32 moments
  const auto m = run_simulation(c);
  CHECK(m.hbm_breakdown_bytes.at("parameters") == Approx(4 * P / 8).epsilon(1e-12));
  CHECK(m.hbm_breakdown_bytes.at("optimizer_state") == Approx(8 * P / 8 / 2).epsilon(1e-12));
  c.framework = "nemo";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("framework = \"nemo\" (expected maxtext or megatron)"));
}

TEST_CASE("optimizer_moments_dtype bf16 stores Adam's two moments in 2 bytes each", "[paths]") {
  // Megatron's precision-aware optimizer with bf16 exp_avg and exp_avg_sq: the optimizer state per parameter is
  // the fp32 master weight plus two bf16 moments, 4 + 2 + 2 = 8 bytes instead of 12; MaxText's (no master copy)
  // 2 + 2 = 4 instead of 8. Llama 8B on 16 GPUs as dp 2 x fsdp 8: P / 8 per device, the state split over dp 2.
  RunConfig c = megatron_8b_dp2_fsdp8();
  const double P = resolve_model(c.model).total_params();
  const auto fp32 = run_simulation(c);
  c.optimizer_moments_dtype = "bf16";
  const auto bf16 = run_simulation(c);
  CHECK(bf16.hbm_breakdown_bytes.at("optimizer_state") == Approx(8 * P / 8 / 2).epsilon(1e-12));
  CHECK(bf16.hbm_breakdown_bytes.at("parameters") == fp32.hbm_breakdown_bytes.at("parameters"));
  CHECK(bf16.hbm_breakdown_bytes.at("gradients") == fp32.hbm_breakdown_bytes.at("gradients"));
  CHECK(bf16.step_time_s <= fp32.step_time_s);  // Adam reads and writes fewer bytes
  c.framework = "maxtext";
  CHECK(run_simulation(c).hbm_breakdown_bytes.at("optimizer_state") == Approx(4 * P / 8 / 2).epsilon(1e-12));
  c.optimizer_moments_dtype = "fp8";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("optimizer_moments_dtype = \"fp8\" (expected fp32 or bf16)"));
}

TEST_CASE("grad_reduce_dtype bf16 halves the gradient buffer and every gradient collective", "[paths]") {
  // Megatron's grad_reduce_in_fp32 off (Megatron-Bridge's performance configs): main_grad is bf16, 2 bytes per
  // parameter instead of 4, and the data-parallel reduce-scatters send half the bytes; the parameter
  // all-gathers after them send the bf16 weights either way (2 bytes). Llama 8B on 16 GPUs as dp 2 x fsdp 8
  // with the distributed optimizer, as above: dp bytes in the ratio (2 + 2) / (4 + 2).
  RunConfig c = megatron_8b_dp2_fsdp8();
  const double P = resolve_model(c.model).total_params();
  const auto fp32 = run_simulation(c);
  c.grad_reduce_dtype = "bf16";
  const auto bf16 = run_simulation(c);
  CHECK(bf16.hbm_breakdown_bytes.at("gradients") == Approx(2 * P / 8).epsilon(1e-12));
  CHECK(fp32.hbm_breakdown_bytes.at("gradients") == Approx(4 * P / 8).epsilon(1e-12));
  CHECK(bf16.hbm_breakdown_bytes.at("parameters") == fp32.hbm_breakdown_bytes.at("parameters"));
  CHECK(bf16.comm_bytes.at("dp") == Approx(fp32.comm_bytes.at("dp") * 4 / 6).epsilon(1e-12));
  c.grad_reduce_dtype = "fp16";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("grad_reduce_dtype = \"fp16\" (expected fp32 or bf16)"));
}
