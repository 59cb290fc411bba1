// The physics of DESIGN.md as properties over seeded random configurations: every layout, policy and
// schedule flag drawn from a fixed seed, each result checked against laws that hold for any of them.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hwmodels/builtin.hpp"
#include "hwmodels/catalog.hpp"
#include "planner/run_config.hpp"
#include "planner/sweep.hpp"
#include "sim/policy.hpp"
#include "workloads/model.hpp"
#include "better_hardware.hpp"
#include "helpers.hpp"
#include "random_configs.hpp"

using namespace hbmsim;
using test::pick;
using test::random_config;
using test::random_pipeline;

namespace {

struct Drawn {
  RunConfig config;
  StepReport report;
};

// The first `n` valid configurations of the seed (bad draws are skipped).
std::vector<Drawn> draw(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<Drawn> out;
  std::size_t tries = 0;
  while (out.size() < n && tries++ < 50 * n) {
    RunConfig c = random_config(rng);
    try {
      out.push_back({c, run_simulation(c)});
    } catch (const InputError&) {
    }
  }
  return out;
}

std::string describe(const RunConfig& c) { return c.to_json().dump(); }

// The step's report, or nothing where the draw is bad input.
std::optional<StepReport> simulated(const RunConfig& c) {
  try {
    return run_simulation(c);
  } catch (const InputError&) {
    return std::nullopt;
  }
}

}  // namespace

TEST_CASE("physics holds over 500 random configurations", "[invariants]") {
  const auto runs = draw(500, 20261130);
  REQUIRE(runs.size() == 500);
  int fits = 0, tp_runs = 0, cp_runs = 0, dp_runs = 0;
  for (const auto& [c, r] : runs) {
    INFO(describe(c));
    const System sys = prepare_run(c).system;
    ModelSpec model = resolve_model(c.model);
    model.mtp_layers = c.mtp_layers;  // the MTP modules' work and weights are the model's
    fits += r.fits;
    tp_runs += c.tp > 1;
    cp_runs += c.cp > 1;
    dp_runs += c.dp > 1;
    // Nothing runs faster than the hardware: MFU <= 1 and the executed FLOP rate below the fastest peak.
    CHECK(r.mfu <= 1.0);
    double fastest = 0;
    for (auto& [d, f] : sys.gpu.dense_peak_flops) fastest = std::max(fastest, f);
    CHECK(r.executed_flops_per_device / r.step_time_s <= fastest);
    // Recompute only adds work: executed >= model FLOPs.
    CHECK(r.executed_flops_per_device >= r.model_flops_per_device * (1 - 1e-12));
    // The devices together do the step's model FLOPs: per device x GPUs = sequences x per-sequence FLOPs,
    // whatever the layout.
    const double per_sequence = model.model_flops(1, c.seq, 1).total();
    CHECK(r.model_flops_per_device * static_cast<double>(c.gpus) ==
          Approx(static_cast<double>(r.global_batch) * per_sequence).epsilon(1e-9));
    // Bytes per shard: parameters and gradients (fp32) and Adam's two moments (fp32 or bf16). The routed experts are
    // split over fsdp x ep x tp (x cp when it shards weights), the other weights over fsdp x tp (x cp), and x ep
    // when it shards them too; with a sharded optimizer the moments also over the gradient-sync axes: dp, cp
    // when it does not shard weights, and for the non-expert weights ep when it does not shard them.
    const auto mesh = prepare_run(c).graph.mesh;
    auto size = [&](Axis a) { return static_cast<double>(mesh.size(a)); };
    const LayoutReading reading = layout_reading(c);  // auto fields as the framework reads them
    const double cp_w = reading.cp_shards_weights ? size(Axis::cp) : 1, cp_s = reading.cp_shards_weights ? 1 : size(Axis::cp);
    const double ep_w = reading.ep_shards_weights ? size(Axis::ep) : 1, ep_s = reading.ep_shards_weights ? 1 : size(Axis::ep);
    const double expert_shards = size(Axis::fsdp) * size(Axis::ep) * size(Axis::tp) * cp_w;
    const double dense_shards = size(Axis::fsdp) * size(Axis::tp) * cp_w * ep_w;
    const double P = model.total_params();
    const double moe_layers = static_cast<double>(model.moe_layers() + (model.is_moe_layer(model.num_layers) ? model.mtp_layers : 0));
    const double P_expert = moe_layers * model.expert_params_per_layer(), P_dense = P - P_expert;
    const double local = P_dense / dense_shards + P_expert / expert_shards;
    CHECK(r.hbm_breakdown_bytes.at("parameters") == Approx(4 * local).epsilon(1e-12));
    CHECK(r.hbm_breakdown_bytes.at("gradients") == Approx(4 * local).epsilon(1e-12));
    const double dense_sync = c.sharded_optimizer ? static_cast<double>(c.dp) * cp_s * ep_s : 1.0;
    const double expert_sync = c.sharded_optimizer ? static_cast<double>(c.dp) * cp_s : 1.0;
    const double moments = c.optimizer_moments_dtype == "bf16" ? 2 * 2 : 2 * 4;  // Adam's two moments
    CHECK(r.hbm_breakdown_bytes.at("optimizer_state") ==
          Approx(moments * (P_dense / dense_shards / dense_sync + P_expert / expert_shards / expert_sync)).epsilon(1e-12));
    // No queue sends faster than the fastest link it could use.
    const double link = std::max(sys.scale_up.per_gpu_bytes_per_s_per_direction, sys.scale_out.per_gpu_bytes_per_s_per_direction);
    for (const auto& [q, bytes] : r.comm_bytes) {
      INFO("queue " << q);
      CHECK(r.busy_s.at(q) * link >= bytes * (1 - 1e-9));
    }
    CHECK(r.tokens_per_device_per_step * static_cast<double>(c.gpus) ==
          Approx(static_cast<double>(r.global_batch * c.seq)).epsilon(1e-12));
  }
  // The draw covers what it is meant to.
  CHECK(fits > 100);
  CHECK(tp_runs > 100);
  CHECK(cp_runs > 100);
  CHECK(dp_runs > 100);
}

TEST_CASE("more HBM, host-link or network bandwidth is never slower and never turns a fit into OOM", "[invariants]") {
  int fitting = 0, not_fitting = 0;  // the fit implications below must not hold vacuously
  for (const auto& [c, r] : draw(150, 7)) {
    INFO(describe(c));
    const PreparedRun prepared = prepare_run(c);
    for (const auto& [what, b] : test::on_better_hardware(c, prepared)) {
      INFO(what);
      CHECK(b.step_time_s <= r.step_time_s * (1 + test::allowed_slowdown_on(what, c, prepared, r)));
      if (r.fits) CHECK(b.fits);
    }
    ++(r.fits ? fitting : not_fitting);
  }
  INFO(fitting << " of the 150 draws fit");
  CHECK(fitting >= 15);
  CHECK(not_fitting >= 15);
}

TEST_CASE("LHS is never slower than the schedule without it by more than 1% on the same placement", "[invariants]") {
  // The latency-hiding scheduler reorders to overlap; held back by the memory limit, a prefetch may lose its
  // overlap but still starts no later than the default schedule would issue it (right before its first
  // reader), so turning LHS on cannot cost more than the rounding of the two orders. Drawn near capacity:
  // offload policies with HBM squeezed to 0.6-1.0x the system's, where the limit binds.
  std::mt19937 rng(1130);
  int compared = 0, offloading = 0;
  for (int k = 0; k < 400 && compared < 120; ++k) {
    RunConfig c = random_config(rng);
    c.policy = pick<std::string>(rng, {"qkv_proj_offloaded", "minimal_offloaded", "qkv_proj_offloaded"});
    c.lhs = true;
    RunConfig off = c;
    off.lhs = false;
    try {
      const System sys = prepare_run(c).system;
      const double squeeze = pick<double>(rng, {0.6, 0.7, 0.8, 0.9, 1.0});
      c.hbm_bytes = off.hbm_bytes = squeeze * sys.gpu.hbm_bytes;
      const auto on = run_simulation(c), without = run_simulation(off);
      INFO(describe(c));
      CHECK(on.step_time_s <= without.step_time_s * 1.01);
      ++compared;
      offloading += on.host_peak_bytes > 0;
    } catch (const InputError&) {
    }
  }
  CHECK(compared == 120);
  CHECK(offloading > 60);
}

TEST_CASE("a larger batch never lowers the HBM peak", "[invariants]") {
  // Memory is freed at program points (an async collective's buffer at its done, an activation after its
  // last reader), so the peak does not depend on how fast anything runs. The one exception is chosen by the
  // scheduler: with LHS, pipelined prefetches start as early as its memory limit allows, filling HBM up to
  // that limit (memory_limit_slop of HBM less one backward iteration's needs, which grow with the batch); a
  // larger batch then reaches its own limit.
  for (const auto& [c, r] : draw(150, 11)) {
    INFO(describe(c));
    RunConfig twice = c;
    twice.batch = 2 * *c.batch;
    auto t = run_simulation(twice);
    const bool fills_to_limit = c.lhs && c.pipelined_transfers;
    CHECK(t.hbm_peak_bytes >= (fills_to_limit ? std::min(r.hbm_peak_bytes, t.prefetch_limit_bytes) : r.hbm_peak_bytes) * (1 - 1e-12));
  }
}

TEST_CASE("a more imbalanced expert load is never faster", "[invariants]") {
  // moe_load_imbalance adds work to the busiest expert rank (its all-to-all bytes and expert GEMM rows) and
  // nothing else: monotone in work, as more FLOPs or bytes must be. (The memory at the peak may differ: the
  // peak's instant moves with the timing.)
  int checked = 0;
  for (const auto& [c, r] : draw(400, 23)) {
    RunConfig skewed = c;
    skewed.moe_load_imbalance = 1.3;
    auto s = simulated(skewed);
    if (!s) continue;  // no experts, or an expert group of one GPU
    INFO(describe(c));
    ++checked;
    CHECK(s->step_time_s >= r.step_time_s * (1 - 1e-9));
    CHECK(s->executed_flops_per_device > r.executed_flops_per_device);
    CHECK(s->model_flops_per_device == r.model_flops_per_device);
  }
  CHECK(checked >= 40);
}

TEST_CASE("results are byte-identical across runs and thread counts", "[invariants]") {
  std::mt19937 rng(3);
  std::vector<SweepPoint> points;
  while (points.size() < 40) {
    RunConfig c = random_config(rng);
    try {
      prepare_run(c);
    } catch (const InputError&) {
      continue;
    }
    points.push_back({points.size(), {}, c});
  }
  auto run = [&](int jobs) {
    std::vector<std::string> rows(points.size());
    run_sweep(points, jobs, [&](const SweepRow& row) { rows[row.index] = row.report->to_json().dump(); });
    return rows;
  };
  const auto one = run(1);
  CHECK(run(2) == one);
  CHECK(run(1) == one);
}

TEST_CASE("pipelined steps keep the physics stage by stage", "[invariants][pipeline]") {
  std::mt19937 rng(17);
  int runs = 0, tries = 0;
  while (runs < 80 && tries++ < 4000) {
    RunConfig c = random_pipeline(rng);
    const auto run = simulated(c);
    if (!run) continue;
    const StepReport& r = *run;
    ++runs;
    INFO(describe(c));
    CHECK(r.mfu <= 1.0);
    CHECK(r.executed_flops_per_device >= r.model_flops_per_device * (1 - 1e-12));
    ModelSpec model = resolve_model(c.model);
    model.mtp_layers = c.mtp_layers;  // the modules' work is the model's
    CHECK(r.model_flops_per_device * static_cast<double>(c.gpus) ==
          Approx(static_cast<double>(r.global_batch) * model.model_flops(1, c.seq, 1).total()).epsilon(1e-9));
    const auto prepared = prepare_run(c);
    const auto& g = prepared.graph;
    double busiest = 0;
    for (std::size_t s = 0; s < r.stages.size(); ++s) {
      const auto& st = r.stages[s];
      busiest = std::max(busiest, st.compute_busy_s);
      // A stage holds its weights and optimizer state and, while any micro-batch is in flight, that
      // micro-batch's layer inputs (always saved: the remat boundary) for every layer of its chunks.
      std::int64_t layers = 0;
      for (int k : g.stages[s].chunks) layers += g.chunks[static_cast<std::size_t>(k)].layers();
      const double inputs = static_cast<double>(layers) * g.sharded_tokens * static_cast<double>(model.d_model) * 2;
      CHECK(st.hbm_peak_bytes >= (g.stages[s].parameter_bytes + g.stages[s].optimizer_bytes + inputs) * (1 - 1e-12));
    }
    // The step is never shorter than the busiest stage's compute.
    CHECK(r.step_time_s >= busiest * (1 - 1e-12));
    // Twice the micro-batches (each the same size) never more than double the first stage's bubble: the fill
    // and drain are paid once, and a stage faster than the slowest waits the same for each micro-batch. Its
    // fraction of the step is no law with unequal stages: a Llama 8B 1F1B over 8 stages with its gradient
    // sync after the backward (0.6 s, dp_overlap off) goes from 14.7% to 17.5% at 16 micro-batches, the
    // waits for the head's stage growing beside a fixed tail (test_pipeline.cpp checks the fraction on equal
    // stages). Except GPipe with offloaded activations: every micro-batch's copies are in flight before the
    // first backward, so a neighbour's host link, and the waits on it, grow with their number (1F1B holds at
    // most p).
    const bool offloads = c.policy == "qkv_proj_offloaded" || c.policy == "minimal_offloaded";
    if (c.pp_schedule == "gpipe" && offloads) continue;
    RunConfig more = c;
    more.microbatches = 2 * c.microbatches;
    more.batch = 2 * *c.batch;
    auto m = run_simulation(more);
    CHECK(m.stages[0].bubble_s <= 2 * r.stages[0].bubble_s + 1e-9 * m.step_time_s);
  }
  CHECK(runs == 80);
}

TEST_CASE("physics holds with Megatron's settings and the memory levers drawn too", "[invariants]") {
  // The laws that hold for any layout (those with a layout's own byte counts are above), over draws that also
  // set the fields random_config leaves at their defaults (test::add_levers), a quarter of them pipelined.
  std::mt19937 rng(20261203);
  int runs = 0, offloading = 0, megatron = 0, levers = 0, hf = 0, muon = 0;
  for (int tries = 0; runs < 300 && tries < 3000; ++tries) {
    RunConfig c = tries % 4 == 3 ? random_pipeline(rng) : random_config(rng);
    test::add_levers(rng, c);
    const auto run = simulated(c);
    if (!run) continue;
    const StepReport& r = *run;
    ++runs;
    INFO(describe(c));
    megatron += c.framework == "megatron";
    muon += c.optimizer == "muon";
    hf += c.model.rfind("hf/", 0) == 0;
    levers += c.offload_layers > 0 || c.recompute_layers > 0 || c.optimizer_offload != "off" || c.parameter_offload ||
              c.fp8_saved_activations || !c.layer_policies.empty() || c.moe_batch_split > 1;
    CHECK(std::isfinite(r.step_time_s));
    CHECK(r.step_time_s > 0);
    CHECK(r.mfu <= 1.0);
    CHECK(r.executed_flops_per_device >= r.model_flops_per_device * (1 - 1e-12));
    ModelSpec model = resolve_model(c.model);
    model.mtp_layers = c.mtp_layers;
    CHECK(r.model_flops_per_device * static_cast<double>(c.gpus) ==
          Approx(static_cast<double>(r.global_batch) * model.model_flops(1, c.seq, 1).total()).epsilon(1e-9));
    // More HBM, a faster host link or twice the network: never slower, never a fit turned into OOM (slack as above).
    const bool offloads = r.host_peak_bytes > 0;
    offloading += offloads;
    const double slack = !offloads ? 1e-9 : r.fits ? 1e-2 : 5e-2;
    for (const auto& [what, b] : test::on_better_hardware(c, prepare_run(c))) {
      INFO(what);
      CHECK(b.step_time_s <= r.step_time_s * (1 + slack));
      if (r.fits) CHECK(b.fits);
    }
    // Twice the batch on one stage: more work, never a shorter step, never a lower peak (but where LHS fills
    // HBM up to its limit: the test above).
    if (c.pp == 1) {
      const auto t = run_simulation(test::twice_the_work(c));
      CHECK(t.step_time_s >= r.step_time_s * (1 - slack));
      CHECK(t.hbm_peak_bytes >= test::least_peak_with_twice_the_work(c, r, t));
    }
  }
  CHECK(runs == 300);
  CHECK(megatron > 100);
  CHECK(levers > 100);
  CHECK(offloading > 30);
  CHECK(hf > 10);
  CHECK(muon > 10);
}

TEST_CASE("reloads LHS counts on arrive in time, so a faster network does not expose them", "[invariants]") {
  // A stress draw (seed 58): Llama 3.1 405B on 32 GB300s, cp 4 x fsdp 8 with all-gathered keys and values, QKV
  // offload under LHS without pipelined transfers, 2 accumulation steps. Ordered over solo durations without
  // the reloads, twice the network made the attention's recompute follow the shorter key-value gather at once,
  // ahead of the MLP's input-gradient GEMM, and compute waited on the query reload: 46.62 -> 47.48 s (h2d
  // exposed 0.1 -> 1.1 s), more than the 1% a fitting run with copies may lose.
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-405b", "system": "gb300-nvl72", "gpus": 32, "cp": 4,
      "cp_exchange": "auto", "batch": 4, "seq": 4096, "grad_accum": 2, "policy": "qkv_proj_offloaded", "lhs": true,
      "pipelined_transfers": false, "weights": "mxfp8", "optimizer_moments_dtype": "bf16", "dp_overlap": false,
      "calibration": "gb200-fitted", "sharded_optimizer": true})");
  // Another (seed 48): Llama 3.1 70B on 32 VR NVL144, cp 4 x fsdp 8, QKV offload under LHS with pipelined
  // transfers and the parameters in host memory. The next layer's shard copy, which waits for the layer after
  // this one, stood ahead of this layer's prefetches on the host link's in-order queue, so they started with the
  // layer as if not pipelined, and the blind order let compute wait on them: 2.873 -> 2.929 s.
  const auto pipelined = test::on_vr_as_drawn(R"({"model": "llama3.1-70b", "gpus": 32, "cp": 4,
      "batch": 4, "seq": 4096, "policy": "qkv_proj_offloaded", "lhs": true, "pipelined_transfers": true,
      "parameter_offload": true, "attention_dtype": "fp8", "grad_reduce_dtype": "bf16", "optimizer_moments_dtype": "bf16",
      "dp_overlap": false})");
  for (const RunConfig& c : {RunConfig::from_json(doc, "test"), RunConfig::from_json(pipelined, "test")}) {
    INFO(c.model);
    const auto base = run_simulation(c);
    REQUIRE(base.fits);
    const auto better = test::better_hardware(c, prepare_run(c).system);
    REQUIRE(better.back().first == "twice the network");
    CHECK(run_simulation(better.back().second).step_time_s <= base.step_time_s * (1 + 1e-2));
  }
}

TEST_CASE("LHS leaves room for the gradients waiting on reduce-scatters when it hoists prefetches", "[invariants]") {
  // A stress draw (seed 76): Llama 3.1 405B on 128 GB200s, FSDP 128, minimal_offloaded under LHS with
  // pipelined transfers. At the backward's start LHS hoists prefetches until HBM reaches its limit (95%) less
  // one backward iteration's working set, which holds that iteration's unsharded gradients; the two layers'
  // before it, whose reduce-scatters its first op waits for (pipelined collectives), were counted only once
  // taken. On a GPU twice as fast the burst of prefetches came before the backward's first gradients were
  // taken, and the peak went from 178.3 to 189.2 GiB of 185. Counted as taken from the start, the prefetches
  // stop where the static schedule would stop them, whatever the GPU's speed: the peak stays under 95% of HBM.
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-405b", "system": "gb200-nvl72", "gpus": 128,
      "batch": 1, "seq": 4096, "policy": "minimal_offloaded", "lhs": true, "pipelined_transfers": true,
      "double_buffering": true, "optimizer_moments_dtype": "bf16", "calibration": "gb200-fitted"})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const System sys = prepare_run(c).system;
  const auto base = run_simulation(c);
  const auto faster = test::run_on_faster_gpu(c);
  for (const auto* r : {&base, &faster}) {
    CHECK(r->fits);
    CHECK(r->hbm_peak_bytes <= 0.95 * sys.gpu.hbm_bytes);
  }
  CHECK(faster.step_time_s <= base.step_time_s);
}

TEST_CASE("the host link serves a streamed update's chunks in order, so a faster GPU does not slow it", "[invariants]") {
  // A stress draw (seed 77): Llama 3.1 70B on 8 VR NVL144, pp 2 GPipe x fsdp 2 x tp 2, parameters in host
  // memory (the update streams them through HBM in layer chunks, chunk k + 2 copied in once chunk k is out).
  // The link shared two chunks' copies evenly, so each pair ended together and the update waited for both; on
  // a GPU twice as fast the second copy started sooner, shared longer and held the first back: 0.277 -> 0.281 s.
  // Served in chunk order, as the link serves prefetches, the first chunk's copy ends after its own bytes.
  const auto doc = test::on_vr_as_drawn(R"({"model": "llama3.1-70b", "gpus": 8, "pp": 2,
      "pp_schedule": "gpipe", "microbatches": 2, "tp": 2, "sequence_parallel": true, "tp_comm_overlap": true,
      "batch": 0.5, "seq": 1024, "policy": "minimal_offloaded", "lhs": true, "pipelined_transfers": false,
      "double_buffering": true, "parameter_offload": true, "reshard_weights": false, "dp_overlap": false,
      "sharded_optimizer": true, "weights": "nvfp4", "attention_dtype": "fp8"})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const auto base = run_simulation(c);
  REQUIRE(base.fits);
  CHECK(test::run_on_faster_gpu(c).step_time_s <= base.step_time_s);
}

TEST_CASE("issue 18's counterexamples: LHS on Llama 405B near capacity, HBM of Llama 70B by batch and precision", "[invariants]") {
  // Llama 405B on 64 GB200s, QKV offload: LHS was 15.37 s against 13.73 s without it.
  RunConfig c;
  c.system = "gb200-nvl72";
  c.model = "llama3.1-405b";
  c.gpus = 64;
  c.batch = 2;
  c.seq = 4096;
  c.policy = "qkv_proj_offloaded";
  RunConfig off = c;
  off.lhs = false;
  CHECK(run_simulation(c).step_time_s <= run_simulation(off).step_time_s * 1.01);
  // Llama 70B on 8 GB200s, seq 1024, minimal_offloaded, no LHS: the peak fell from batch 1 to 2 and rose
  // from bf16 to fp8 weights (a queue of gradients whose length depended on relative speeds). More sequences
  // never need less memory, and narrower MLP GEMM inputs never need more.
  RunConfig m;
  m.system = "gb200-nvl72";
  m.model = "llama3.1-70b";
  m.gpus = 8;
  m.seq = 1024;
  m.policy = "minimal_offloaded";
  m.lhs = false;
  std::map<std::string, std::map<int, double>> peak;
  for (std::string w : {"bf16", "fp8", "nvfp4"})
    for (int b : {1, 2}) {
      m.weights = w;
      m.batch = b;
      peak[w][b] = run_simulation(m).hbm_peak_bytes;
    }
  for (const auto& [w, by_batch] : peak) {
    INFO(w);
    CHECK(by_batch.at(2) >= by_batch.at(1));
  }
  for (int b : {1, 2}) {
    INFO("batch " << b);
    CHECK(peak["fp8"][b] <= peak["bf16"][b] * (1 + 1e-12));
    CHECK(peak["nvfp4"][b] <= peak["fp8"][b] * (1 + 1e-12));
  }
}
