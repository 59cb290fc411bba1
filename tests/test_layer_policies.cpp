// Per-layer policies (issue #19): layer ranges with a policy of their own, and the Megatron shorthands that map
// onto them (cpu_offloading_num_layers, recompute_num_layers with the block method).
#include <cmath>
#include <map>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "better_hardware.hpp"
#include "helpers.hpp"
#include "planner/layer_counts.hpp"
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/plan_json.hpp"
#include "planner/run_config.hpp"
#include "sim/layer_plan.hpp"
#include "sim/policy.hpp"

using namespace hbmsim;

namespace {

// Bytes one layer of the run keeps under `preset` (its checkpoint tensors placed on device, and its input): what
// Megatron's CPU offload of that layer sends to host (every tensor the layer saves, its input included).
double kept_bytes_per_layer(const StepGraph& g, const std::string& preset) {
  const Policy p = make_policy(preset);
  double bytes = g.tensor_bytes("decoder_layer_input");
  for (const auto& name : checkpoint_names())
    if (name != "decoder_layer_input" && p.placement(name) == Placement::device) bytes += g.tensor_bytes(name);
  return bytes;
}

// Llama 3.1 405B on 128 GB200s, batch 2 x 8192, QKV projections offloaded (the README's run, bf16 weights).
RunConfig llama405b_gb200() {
  RunConfig c;
  c.system = "gb200-nvl72";
  c.model = "llama3.1-405b";
  c.gpus = 128;
  c.batch = 2;
  c.seq = 8192;
  c.policy = "qkv_proj_offloaded";
  return c;
}

// The ops layer 3's backward replays under a config's policy, by name, with their kinds.
std::map<std::string, OpKind> replayed_ops(const RunConfig& c) {
  const auto run = prepare_run(c);
  const LayerTemplate& t = run.graph.layer(3);
  const Network net(run.system, run.graph.mesh);
  const Costs costs{run.system, net};
  TemplatePlan plan;
  plan_template(t, run.policy, costs, run.graph, run.options, plan);
  std::map<std::string, OpKind> ops;
  for (std::size_t o = 0; o < t.ops.size(); ++o)
    if (plan.replay[o]) ops[t.ops[o].name] = t.ops[o].kind;
  return ops;
}

// The tensors a run's policy keeps on device in template `t`.
std::set<std::string> kept_in(const PreparedRun& run, const LayerTemplate& t) {
  std::vector<Placement> placement;
  std::vector<bool> needed;
  std::vector<int> producer;
  place_tensors(t, run.policy, placement, needed, producer);
  std::set<std::string> kept;
  for (std::size_t k = 0; k < t.tensors.size(); ++k)
    if (placement[k] == Placement::device) kept.insert(t.tensors[k].name);
  return kept;
}

// ... in layer 3 (dense in the Llama models used here, MoE in Mixtral and DeepSeek-V3).
std::set<std::string> kept_on_device(const RunConfig& c) {
  const auto run = prepare_run(c);
  return kept_in(run, run.graph.layer(3));
}

// ... in the layers of `kind` ("dense", "moe").
std::set<std::string> kept_in_kind(const RunConfig& c, const std::string& kind) {
  const auto run = prepare_run(c);
  for (const LayerTemplate& t : run.graph.templates)
    if (t.kind == kind) return kept_in(run, t);
  FAIL("no " << kind << " template");
  return {};
}

}  // namespace

TEST_CASE("a layer rule over every layer is the same run as that policy", "[policy][layers]") {
  RunConfig base = test::llama8b_h200("full");
  RunConfig ruled = base;
  ruled.layer_policies = "0-31:minimal";
  RunConfig whole = base;
  whole.policy = "minimal";
  const auto a = run_simulation(ruled), b = run_simulation(whole);
  CHECK(a.step_time_s == b.step_time_s);
  CHECK(a.hbm_peak_bytes == b.hbm_peak_bytes);
  // Split in two ranges with the same preset: still the same program.
  ruled.layer_policies = "0-9:minimal,10-31:minimal";
  CHECK(run_simulation(ruled).step_time_s == b.step_time_s);
  // Written by hand with spaces around the parts: the same rules.
  ruled.layer_policies = " 0 - 9 : minimal , 10-31: minimal ";
  CHECK(run_simulation(ruled).step_time_s == b.step_time_s);
  ruled.layer_policies = "0-9: minimal, 10-31: full";
  CHECK(run_simulation(ruled).step_time_s != b.step_time_s);
}

TEST_CASE("offloading the first N layers sends N layers' kept activations to host", "[policy][layers]") {
  RunConfig c = test::llama8b_h200("minimal_with_context");
  const auto prepared = prepare_run(c);
  const double per_layer = kept_bytes_per_layer(prepared.graph, "minimal_with_context");
  REQUIRE(per_layer > 0);
  double last_hbm = run_simulation(c).hbm_peak_bytes;
  for (std::int64_t n : {8, 16, 32}) {
    c.offload_layers = n;
    const auto r = run_simulation(c);
    // Every offloaded activation of the forward pass is on host when the backward starts.
    CHECK(r.host_peak_bytes == Approx(static_cast<double>(n) * per_layer).epsilon(1e-9));
    // Each further layer offloaded takes its activations off the device.
    CHECK(r.hbm_peak_bytes < last_hbm);
    last_hbm = r.hbm_peak_bytes;
  }
}

TEST_CASE("recompute_layers fully recomputes the first N layers of every pipeline chunk", "[policy][layers]") {
  RunConfig c = test::llama8b_h200("minimal");
  c.pp = 2;
  c.vp = 2;  // four chunks of 8 layers: 0-7, 8-15, 16-23, 24-31
  c.microbatches = 4;
  c.recompute_layers = 3;
  const auto run = prepare_run(c);
  REQUIRE(run.policy.layer_rules.size() == 4);
  CHECK(layer_rules_text(run.policy) == "0-2 full, 8-10 full, 16-18 full, 24-26 full");
  CHECK(run.policy.for_layer(9, 1).preset == "full");
  CHECK(run.policy.for_layer(11, 1).preset == "minimal");
  // Recomputing more layers saves less and replays more: the peak falls and the step grows.
  RunConfig none = c;
  none.recompute_layers = 0;
  const auto with = run_simulation(c), without = run_simulation(none);
  CHECK(with.hbm_peak_bytes < without.hbm_peak_bytes);
  CHECK(with.step_time_s > without.step_time_s);
}

TEST_CASE("recompute_layers above a small chunk's layers recomputes all of that chunk", "[policy][layers]") {
  // Megatron's block method checkpoints layers [0, n) of each chunk's block: a chunk of fewer than n layers is
  // recomputed whole. pp 2, 32 layers, the first stage given 8: chunks 0-7 and 8-31.
  RunConfig c = test::llama8b_h200("minimal");
  c.pp = 2;
  c.microbatches = 2;
  c.first_stage_layers = 8;
  c.recompute_layers = 10;
  CHECK(layer_rules_text(prepare_run(c).policy) == "0-7 full, 8-17 full");
  c.recompute_layers = 25;  // above the largest chunk's 24 layers
  CHECK_THROWS_WITH(prepare_run(c), Catch::Contains("recompute_layers = 25 (must be between 0 and the layers of the largest pipeline chunk, 24)"));
}

TEST_CASE("bad layer rules name the field and the value", "[policy][layers][errors]") {
  RunConfig c = test::llama8b_h200("minimal");
  auto fails = [&](const std::string& text) {
    RunConfig bad = c;
    bad.layer_policies = text;
    return Catch::Contains("layer_policies = \"" + text + "\"");
  };
  for (const std::string text : {"0-40:full", "5-3:full", "0-9:full,9-12:minimal", "0-9", "x-3:full", "0-3:bogus", "-1-3:full"}) {
    RunConfig bad = c;
    bad.layer_policies = text;
    CHECK_THROWS_WITH(run_simulation(bad), fails(text));
  }
  // A reversed range says so rather than calling layers 3 and 5 of 32 out of range.
  RunConfig reversed = c;
  reversed.layer_policies = "5-3:full";
  CHECK_THROWS_WITH(run_simulation(reversed), Catch::Contains("(layers 5-3: the first layer is after the last)"));
  c.offload_layers = 33;
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("offload_layers = 33 (must be between 0 and num_layers = 32)"));
  c = test::llama8b_h200("full");
  c.offload_layers = 4;
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("offload_layers = 4 (policy full keeps nothing on device to offload)"));
  c = test::llama8b_h200("minimal");
  c.offload_layers = 4;
  c.layer_policies = "2-5:full";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("offload_layers = 4 (layers 0-3 overlap layers 2-5"));
  c.layer_policies.clear();
  c.offload_layers = 0;
  c.recompute_layers = 40;
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("recompute_layers = 40 (must be between 0 and the layers of the largest pipeline chunk, 32)"));
  // The CLI exits 2 with the same words.
  auto r = test::cli("simulate --model llama3.1-8b --gpus 8 --layer-policies 0-99:minimal");
  CHECK(r.status == 2);
  CHECK(r.err.find("layer_policies = \"0-99:minimal\" (layers 0-99 are outside the model's layers 0-31)") != std::string::npos);
}

TEST_CASE("over random runs, layer counts move host memory and recompute work the way they must", "[policy][layers][invariants]") {
  // More layers offloaded never lowers the pinned host peak; more layers recomputed never lower the executed
  // FLOPs. And the usual physics: MFU <= 1, executed >= model FLOPs.
  std::mt19937 rng(19);
  auto pick = [&](auto xs) { return xs[std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng)]; };
  int ran = 0;
  for (int i = 0; i < 200 && ran < 40; ++i) {
    RunConfig c;
    c.model = pick(std::vector<std::string>{"llama3.1-8b", "llama3.1-70b"});
    c.system = pick(std::vector<std::string>{"gb200-nvl72", "gb300-nvl72", "h200-hgx", "vr-nvl144"});
    c.gpus = pick(std::vector<std::int64_t>{8, 16, 64});
    c.tp = pick(std::vector<std::int64_t>{1, 1, 2});
    c.pp = pick(std::vector<std::int64_t>{1, 1, 2});
    c.batch = pick(std::vector<double>{1, 2});
    c.seq = pick(std::vector<std::int64_t>{2048, 4096});
    c.policy = pick(std::vector<std::string>{"minimal", "minimal_with_context", "save_qkv_proj"});
    c.lhs = pick(std::vector<bool>{true, false});
    const std::int64_t layers = c.model == "llama3.1-8b" ? 32 : 80;
    const std::int64_t chunk = layers / c.pp;
    const auto a = std::uniform_int_distribution<std::int64_t>(0, layers - 1)(rng);
    const auto b = std::uniform_int_distribution<std::int64_t>(a + 1, layers)(rng);
    RunConfig fewer = c, more = c;
    fewer.offload_layers = a;
    more.offload_layers = b;
    StepReport rf, rm;
    try {
      rf = run_simulation(fewer);
      rm = run_simulation(more);
    } catch (const InputError&) {
      continue;  // a layout that does not divide
    }
    ++ran;
    INFO(more.to_json().dump());
    CHECK(rm.host_peak_bytes >= rf.host_peak_bytes);
    for (const auto* r : {&rf, &rm}) {
      CHECK(r->mfu <= 1.0);
      CHECK(r->executed_flops_per_device >= r->model_flops_per_device * (1 - 1e-12));
    }
    RunConfig r1 = c, r2 = c;
    r1.recompute_layers = std::min(a, chunk);
    r2.recompute_layers = std::min(b, chunk);
    CHECK(run_simulation(r2).executed_flops_per_device >= run_simulation(r1).executed_flops_per_device * (1 - 1e-12));
  }
  CHECK(ran == 40);
}

TEST_CASE("no_recompute keeps what each backward op reads, a gathered input sharded", "[policy]") {
  // Llama 3.1 8B at tp 2 with sequence parallelism: what Megatron-Core keeps without recompute is each
  // layer's input, each norm's input and output (the sharded one: the column-parallel GEMM gathers it again
  // in its backward), q, k, v and the attention output (flash attention), the residual sum, the SwiGLU inputs
  // and its output (the down projection's input). Not the row-parallel GEMM outputs before their
  // reduce-scatter, nor the gathered norm outputs.
  RunConfig c = test::llama8b_h200("no_recompute");
  c.tp = 2;
  const std::set<std::string> expected = {"decoder_layer_input", "attn_norm", "query_proj", "key_proj", "value_proj", "context",
                                          "attention_out", "mlp_norm", "mlpwi_0", "mlpwi_1", "mlp_act"};
  CHECK(kept_on_device(c) == expected);
  // An explicit placement wins (Megatron's selective recompute: the core attention's output recomputed).
  c.tensors = {{"context", "remat"}};
  CHECK(kept_on_device(c).count("context") == 0);
  // The backward replays only the gathers (communication), no compute; so no more FLOPs than keeping every
  // checkpoint name with the internal tensors recomputed.
  c.tensors.clear();
  const auto replayed = replayed_ops(c);
  for (const auto& [name, kind] : replayed) {
    INFO(name);
    CHECK(kind == OpKind::comm);
  }
  CHECK(replayed.size() == 2);  // the two norm outputs' all-gathers
  RunConfig mwc = c;
  mwc.policy = "minimal_with_context";
  CHECK(run_simulation(c).executed_flops_per_device <= run_simulation(mwc).executed_flops_per_device);
}

TEST_CASE("selective is no_recompute with the core attention recomputed, as Megatron's selective recompute", "[policy]") {
  // Llama 3.1 8B at tp 2 (the case above): Megatron's --recompute-granularity selective (recompute_modules
  // core_attn) keeps what autograd keeps but the attention's output, which the backward recomputes from the
  // kept q, k and v.
  RunConfig c = test::llama8b_h200("selective");
  c.tp = 2;
  CHECK(kept_on_device(c) == std::set<std::string>{"decoder_layer_input", "attn_norm", "query_proj", "key_proj", "value_proj",
                                                   "attention_out", "mlp_norm", "mlpwi_0", "mlpwi_1", "mlp_act"});
  // The same step as spelling it out, and more executed work than keeping the attention output.
  const auto selective = run_simulation(c);
  RunConfig spelled = c;
  spelled.policy = "no_recompute";
  spelled.tensors = {{"context", "remat"}};
  const auto same = run_simulation(spelled);
  CHECK(selective.step_time_s == same.step_time_s);
  CHECK(selective.hbm_peak_bytes == same.hbm_peak_bytes);
  CHECK(selective.executed_flops_per_device == same.executed_flops_per_device);
  spelled.tensors.clear();
  const auto keep_all = run_simulation(spelled);
  CHECK(selective.executed_flops_per_device > keep_all.executed_flops_per_device);
  CHECK(selective.model_flops_per_device == keep_all.model_flops_per_device);
  // The settings: Megatron's flag; for MaxText the nearest named policy.
  CHECK_THAT(megatron_settings(c), Catch::Contains("--recompute-granularity selective") && !Catch::Contains("no Megatron equivalent"));
  CHECK_THAT(maxtext_settings(c), Catch::Contains("selective keeps what autograd saves but the core attention") &&
                                      Catch::Contains("nearest remat_policy=minimal)"));
}

TEST_CASE("Megatron's moe_act and layernorm recompute drop the experts' activation output and the pre-MLP norm", "[policy]") {
  // Mixtral 8x7B on 8 H100s, tp 2 with sequence parallelism, ep 4 with the experts whole (expert tp 1), batch 1
  // per device x seq 4096: a model replica (2 GPUs) runs T = 8192 tokens, each GPU a sequence shard of
  // Ts = 4096. Megatron's recompute_modules moe_act discards the grouped MLP's activation output (the down
  // projection's input) and layernorm the pre-MLP norm's output (a module of its own in MoE layers, since the
  // router reads it; the input norm is fused into the QKV GEMM). By hand, per layer:
  //   mlp_norm    Ts x d x 2 bytes           = 4096 x 4096 x 2           = 32 MiB
  //   moe_mlp_act Ts x k x F x 2 (F whole)   = 4096 x 2 x 14336 x 2      = 224 MiB
  RunConfig c = test::mixtral_h100_folded();
  const auto keep_all = kept_on_device(c);
  REQUIRE(keep_all.count("mlp_norm") == 1);
  REQUIRE(keep_all.count("moe_mlp_act") == 1);
  RunConfig modules = c;
  modules.tensors = {{"mlp_norm", "remat"}, {"moe_mlp_act", "remat"}};
  auto expected = keep_all;
  expected.erase("mlp_norm");
  expected.erase("moe_mlp_act");
  CHECK(kept_on_device(modules) == expected);

  // The backward runs the norm and the activation function again, and only those, on top of what it replays
  // without them (the gathers of sharded inputs).
  auto more = replayed_ops(modules);
  for (const auto& [name, kind] : replayed_ops(c)) CHECK(more.erase(name) == 1);
  CHECK(more == std::map<std::string, OpKind>{{"mlp_norm", OpKind::memory}, {"moe_swiglu", OpKind::memory}});

  // The HBM peak falls in the backward of one of the last layers (the second-to-last here: the last has
  // been freed, the one run back holds its recomputed tensors in both runs): each layer before it holds
  // 256 MiB less, so the saved activations at the peak drop by a whole number of layers' 256 MiB, 30 to 32
  // of them (the peak's working buffers may differ by a few MiB between the two runs).
  const auto a = run_simulation(c), b = run_simulation(modules);
  const double per_layer = (32.0 + 224.0) * (1 << 20);
  CHECK(b.hbm_peak_bytes < a.hbm_peak_bytes);
  const double layers =
      (a.hbm_breakdown_bytes.at("saved_activations") - b.hbm_breakdown_bytes.at("saved_activations")) / per_layer;
  CHECK(layers == Approx(std::round(layers)).epsilon(1e-9));
  CHECK(layers >= 30 - 1e-9);
  CHECK(layers <= 32 + 1e-9);
  CHECK(b.step_time_s >= a.step_time_s);  // the same work and two memory-bound ops more per layer
  CHECK(b.model_flops_per_device == a.model_flops_per_device);

  // Megatron's arguments say it back; a dense model has no such module (its pre-MLP norm is fused).
  CHECK_THAT(megatron_settings(modules), Catch::Contains("--recompute-granularity selective --recompute-modules moe_act layernorm"));
  RunConfig dense = test::llama8b_h200("no_recompute");
  dense.tensors = {{"mlp_norm", "remat"}};
  CHECK_THAT(megatron_settings(dense), Catch::Contains("no Megatron equivalent"));
  // The module tensors are named only by a policy that keeps them: elsewhere anything but remat is bad input.
  dense.policy = "full";
  dense.tensors = {{"moe_mlp_act", "remat"}};
  CHECK_NOTHROW(prepare_run(dense));
  dense.tensors = {{"moe_mlp_act", "device"}};
  CHECK_THROWS_WITH(prepare_run(dense), Catch::Contains("tensors.moe_mlp_act = \"device\" (policy full keeps only MaxText checkpoint names"));
}

TEST_CASE("Megatron's moe recompute runs the whole MoE layer again from the pre-MLP norm's output", "[policy]") {
  // The Mixtral 8x7B run of the test above (Ts = 4096 tokens per GPU, k = 2 of X = 8 experts, d = 4096, experts
  // whole with F = 14336). Megatron's recompute_modules moe checkpoints MoELayer's forward: it keeps only its
  // input and runs the router, the dispatch all-to-all, the experts and the combine all-to-all again in the
  // backward. What no_recompute keeps of it, by hand, per layer:
  //   router_logits             Ts x X x 4 bytes (fp32)    = 4096 x 8 x 4              = 0.125 MiB
  //   moe_dispatched            Ts x k x d x 2             = 4096 x 2 x 4096 x 2       = 64 MiB
  //   moe_mlpwi_0, moe_mlpwi_1  (Ts x k) x F x 2 each      = 8192 x 14336 x 2          = 224 MiB each
  //   moe_mlp_act               the same                                               = 224 MiB
  // The combine's output (moe_returned) is not kept: Megatron's experts weigh their activation by the router's
  // probabilities, so the combine is a plain sum whose backward reads nothing back. The module still names it:
  // the checkpoint runs the combine again.
  RunConfig c = test::mixtral_h100_folded();
  const std::vector<std::string> dropped = {"router_logits", "moe_dispatched", "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlp_act"};
  RunConfig moe = c;
  for (const auto& n : dropped) moe.tensors[n] = "remat";
  moe.tensors["moe_returned"] = "remat";
  auto expected = kept_on_device(c);
  CHECK(expected.count("moe_returned") == 0);
  for (const auto& n : dropped) CHECK(expected.erase(n) == 1);
  CHECK(kept_on_device(moe) == expected);
  CHECK(expected.count("mlp_norm") == 1);  // the layer's input stays

  // The backward replays every op of the MoE layer's forward, both all-to-alls included, and nothing else.
  auto more = replayed_ops(moe);
  for (const auto& [name, kind] : replayed_ops(c)) CHECK(more.erase(name) == 1);
  CHECK(more == std::map<std::string, OpKind>{{"router", OpKind::gemm},         {"route_permute", OpKind::memory},
                                              {"dispatch_a2a", OpKind::comm},   {"moe_wi_0", OpKind::gemm},
                                              {"moe_wi_1", OpKind::gemm},       {"moe_swiglu", OpKind::memory},
                                              {"moe_wo", OpKind::gemm},         {"combine_a2a", OpKind::comm}});

  // As for moe_act, the saved activations at the peak drop by a whole number of layers' worth, 736.125 MiB
  // each, 30 to 32 of them.
  const auto a = run_simulation(c), b = run_simulation(moe);
  const double per_layer = (0.125 + 64 + 3 * 224.0) * (1 << 20);
  CHECK(b.hbm_peak_bytes < a.hbm_peak_bytes);
  const double layers =
      (a.hbm_breakdown_bytes.at("saved_activations") - b.hbm_breakdown_bytes.at("saved_activations")) / per_layer;
  CHECK(layers == Approx(std::round(layers)).epsilon(1e-9));
  CHECK(layers >= 30 - 1e-9);
  CHECK(layers <= 32 + 1e-9);
  CHECK(b.step_time_s > a.step_time_s);  // the experts' forward GEMMs and two all-to-alls more per layer
  CHECK(b.executed_flops_per_device > a.executed_flops_per_device);
  CHECK(b.model_flops_per_device == a.model_flops_per_device);

  // Megatron's arguments say it back as moe, the module that includes moe_act's tensor, with layernorm beside it.
  moe.tensors["mlp_norm"] = "remat";
  CHECK_THAT(megatron_settings(moe), Catch::Contains("--recompute-granularity selective --recompute-modules moe layernorm"));
  // DeepSeek-V3's moe also recomputes its shared experts (mlpwi_0@moe, ...): without them, no Megatron module.
  RunConfig dsv3 = moe;
  dsv3.model = "deepseek-v3-671b";
  CHECK_THAT(megatron_settings(dsv3), Catch::Contains("no Megatron equivalent"));
}

TEST_CASE("NAME@dense and NAME@moe place a tensor in one kind of layer: DeepSeek-V3's dense MLP apart from its shared experts",
          "[policy]") {
  // DeepSeek-V3's first 3 layers are dense, the others MoE with one shared expert; both MLPs carry MaxText's
  // names mlpwi_0, mlpwi_1 (and the activation mlp_act). Megatron recomputes them as different modules: mlp
  // (the dense layers') and shared_experts (or moe, the whole MoE layer).
  RunConfig c;
  c.model = "deepseek-v3-671b";
  c.system = "gb200-nvl72";
  c.gpus = 64;
  c.ep = 64;
  c.seq = 1024;
  c.framework = "megatron";
  c.policy = "no_recompute";
  const auto dense = kept_in_kind(c, "dense"), moe = kept_in_kind(c, "moe");
  for (const char* t : {"mlpwi_0", "mlpwi_1", "mlp_act"}) {
    REQUIRE(dense.count(t) == 1);
    REQUIRE(moe.count(t) == 1);
  }
  RunConfig mlp = c;  // Megatron's mlp: the dense layers' MLP, norm included (fused into its first GEMM)
  for (const char* t : {"mlp_norm@dense", "mlpwi_0@dense", "mlpwi_1@dense", "mlp_act@dense", "mlpwo@dense"}) mlp.tensors[t] = "remat";
  auto expected = dense;
  for (const char* t : {"mlp_norm", "mlpwi_0", "mlpwi_1", "mlp_act"}) CHECK(expected.erase(t) == 1);
  CHECK(kept_in_kind(mlp, "dense") == expected);
  CHECK(kept_in_kind(mlp, "moe") == moe);  // the shared experts and the MoE layers' norm untouched
  CHECK_THAT(megatron_settings(mlp), Catch::Contains("--recompute-modules mlp"));
  RunConfig shared = c;  // shared_experts: the MoE layers' shared expert only
  for (const char* t : {"mlpwi_0@moe", "mlpwi_1@moe", "mlp_act@moe", "mlpwo@moe"}) shared.tensors[t] = "remat";
  expected = moe;
  for (const char* t : {"mlpwi_0", "mlpwi_1", "mlp_act"}) CHECK(expected.erase(t) == 1);
  CHECK(kept_in_kind(shared, "moe") == expected);
  CHECK(kept_in_kind(shared, "dense") == dense);
  CHECK_THAT(megatron_settings(shared), Catch::Contains("--recompute-modules shared_experts"));
  // A kind's own placement wins over the name's: offloaded everywhere but kept in MoE layers.
  RunConfig both = c;
  both.policy = "custom";
  both.tensors = {{"mlpwi_0", "offload"}, {"mlpwi_0@moe", "device"}};
  const auto run = prepare_run(both);
  CHECK(run.policy.placement("mlpwi_0", "dense") == Placement::offload);
  CHECK(run.policy.placement("mlpwi_0", "moe") == Placement::device);
  CHECK(run.policy.placement("mlpwi_0", "mtp") == Placement::offload);
  // The dense layers' recompute costs work and saves memory; the model's FLOPs stay.
  const auto a = run_simulation(c), b = run_simulation(mlp);
  CHECK(b.executed_flops_per_device > a.executed_flops_per_device);
  CHECK(b.model_flops_per_device == a.model_flops_per_device);
  // Bad input names the key and why.
  RunConfig bad = c;
  bad.tensors = {{"mlpwi_0@attention", "remat"}};
  CHECK_THROWS_WITH(prepare_run(bad), Catch::Contains("tensors.mlpwi_0@attention = \"remat\" (unknown layer kind \"attention\" after @"));
  bad.tensors = {{"warp@moe", "remat"}};
  CHECK_THROWS_WITH(prepare_run(bad), Catch::Contains("tensors.warp@moe = \"remat\" (unknown checkpoint name"));
  bad.policy = "full";
  bad.tensors = {{"mlp_act@dense", "device"}};
  CHECK_THROWS_WITH(prepare_run(bad), Catch::Contains("tensors.mlp_act@dense = \"device\" (policy full keeps only MaxText"));
}

TEST_CASE("optimizer state offload moves the state to pinned host memory and the update after the backward", "[policy][optimizer]") {
  // Llama 3.1 405B on 128 GB200s (the README's run): the HBM peak is in the forward pass, before the optimizer,
  // so offloading the state lowers it by exactly the state, and pinned host memory holds it for the whole step.
  RunConfig c = llama405b_gb200();
  const auto off = run_simulation(c);
  const double state = off.hbm_breakdown_bytes.at("optimizer_state");
  REQUIRE(state > 0);
  for (const char* mode : {"device", "host"}) {
    INFO(mode);
    c.optimizer_offload = mode;
    const auto r = run_simulation(c);
    // At the same moment, less the prefetched activations LHS's memory gate lets in earlier once the state
    // has gone (offload buffers).
    CHECK(r.hbm_peak_bytes - r.hbm_breakdown_bytes.at("offload_buffers") ==
          Approx(off.hbm_peak_bytes - off.hbm_breakdown_bytes.at("offload_buffers") - state).epsilon(1e-12));
    CHECK(r.hbm_peak_bytes < off.hbm_peak_bytes - 0.95 * state);
    CHECK(r.hbm_breakdown_bytes.at("optimizer_state") == 0);
    CHECK(r.host_peak_bytes >= off.host_peak_bytes + state);
    // The state's way in and out (or the CPU's update) comes after the backward: the step grows.
    CHECK(r.step_time_s > off.step_time_s);
    // A slower host link never makes it faster.
    RunConfig slow = c;
    slow.host_link_bytes_per_s = 20e9;
    CHECK(run_simulation(slow).step_time_s > r.step_time_s);
  }
  // Device mode streams the state through HBM at most two layer chunks at a time: 2/126 of it on top of the
  // backward's own need, well under the forward peak here.
  c.optimizer_offload = "device";
  CHECK(run_simulation(c).hbm_peak_bytes < off.hbm_peak_bytes);
}

TEST_CASE("the CPU optimizer's gradient partition is pinned for the whole step, whatever the host link", "[policy][optimizer]") {
  // With optimizer_offload host, the host holds the state and the fp32 gradient partition the CPU update reads
  // (ZeRO-Offload and Megatron's hybrid optimizer pin it once). The README's Llama 3.1 405B run on 128 GB200s
  // peaks on the host in the forward, with its QKV activations there, so the host peak is the run's without
  // optimizer offload plus the state plus the gradients, at any host-link speed. (Staged copy by copy, a twice
  // faster link held more at once: a stress draw on GB300 went from fitting to 9.3 GiB over.)
  RunConfig c = llama405b_gb200();
  const auto off = run_simulation(c);
  const double state = off.hbm_breakdown_bytes.at("optimizer_state"), grads = off.hbm_breakdown_bytes.at("gradients");
  REQUIRE(off.host_peak_bytes > 0);
  c.optimizer_offload = "host";
  const double expected = off.host_peak_bytes + state + grads;
  CHECK(run_simulation(c).host_peak_bytes == Approx(expected).epsilon(1e-12));
  for (double link : {20e9, 2e12}) {
    INFO(link);
    RunConfig other = c;
    other.host_link_bytes_per_s = link;
    CHECK(run_simulation(other).host_peak_bytes == Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("optimizer offload refuses unknown modes and state the host cannot hold", "[policy][optimizer][errors]") {
  RunConfig c = test::llama8b_h200("full");
  c.optimizer_offload = "cpu";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("optimizer_offload = \"cpu\" (expected off, device or host)"));
  // Llama 3.1 405B on 8 H100s: 8 bytes of Adam state per parameter over 8 GPUs is about 377 GiB per GPU.
  c.model = "llama3.1-405b";
  c.system = "h100-hgx";
  c.optimizer_offload = "device";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("optimizer_offload = device (the optimizer state") &&
                                           Catch::Contains("exceeds the pinned host memory per GPU"));
  auto r = test::cli("simulate --model llama3.1-8b --optimizer-offload sideways");
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("optimizer_offload = \"sideways\""));
}

TEST_CASE("with parameter offload a gather's buffers are taken where it is issued, so twice the work never peaks lower", "[policy][optimizer]") {
  // A stress draw (seed 89, --squeeze): DeepSeek-V3 on 128 VR NVL144 under Megatron, tp 8 x ep 8 x dp 2 (FSDP
  // over the rest), `minimal_offloaded`, parameters in host memory. The gathered weights were taken when the
  // shard's copy in ended, so their life followed the host link's queue: at batch 0.5 two layers' gathered
  // weights were live at the peak, at batch 1 one, and twice the work peaked lower (154.57 -> 153.39 GiB). Taken
  // where the gather is issued (when the layer it follows is done), with the shard, the peak is the program's.
  const auto doc = test::on_vr_as_drawn(R"({"model": "deepseek-v3-671b", "gpus": 128, "tp": 8, "ep": 8,
      "dp": 2, "expert_tp": 1, "batch": 0.5, "seq": 1024, "framework": "megatron", "policy": "minimal_offloaded",
      "weights": "fp8", "grad_reduce_dtype": "bf16", "sequence_parallel": true, "parameter_offload": true, "lhs": true,
      "pipelined_transfers": false, "double_buffering": true, "dp_overlap": false})");
  RunConfig c = RunConfig::from_json(doc, "test");
  const auto base = run_simulation(c);
  c.batch = 1;
  const auto twice = run_simulation(c);
  CHECK(twice.hbm_peak_bytes >= base.hbm_peak_bytes);
  CHECK(twice.hbm_breakdown_bytes.at("gathered_weights") == Approx(base.hbm_breakdown_bytes.at("gathered_weights")).epsilon(1e-12));
}

TEST_CASE("with parameter offload a gather's shard is freed where the gather is waited for and a faster GPU never peaks higher", "[policy][optimizer]") {
  // A stress draw (seed 93, --squeeze): Llama 3.1 8B on 16 H200s, pp 2 x vp 2, FSDP 8, `minimal` under LHS with
  // pipelined collectives, parameters in host memory. The shard copied in for a gather was freed when the gather
  // ended, so whether it was live at the last stage's peak (the head's backward starting, with the gathers of
  // the next layers' backward issued) followed the network against the compute: on a GPU twice as fast the
  // gather of layer 30 was still in flight there (23.21 GiB), on the base one it had ended (23.16). Freed by
  // the op that waits for the gather (XLA's all-gather-done, FSDP's wait for the unshard), the peak holds the
  // same shards on both (two layers' with pipelined collectives), whatever the speeds.
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-8b", "system": "h200-hgx", "gpus": 16, "pp": 2, "vp": 2,
      "microbatches": 2, "batch": 2, "seq": 1024, "attention_dtype": "fp8", "mesh_order": "megatron", "policy": "minimal",
      "lhs": true, "pipelined_collectives": true, "pipelined_transfers": true, "parameter_offload": true,
      "sharded_optimizer": true, "dp_overlap": true, "double_buffering": false})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const auto base = run_simulation(c);
  const auto faster = run_simulation(test::on_faster_gpu(c, prepare_run(c).system));
  REQUIRE(faster.step_time_s < base.step_time_s);
  REQUIRE(base.stages.size() == 2);
  const auto& b = base.stages[1].hbm_breakdown_bytes;
  const auto& f = faster.stages[1].hbm_breakdown_bytes;
  REQUIRE(b.count("parameters"));
  CHECK(f.at("parameters") == Approx(b.at("parameters")).epsilon(1e-12));
  CHECK(faster.stages[1].hbm_peak_bytes <= base.stages[1].hbm_peak_bytes * (1 + 1e-12));
}

TEST_CASE("parameter offload keeps the parameters in pinned host memory and copies each gather's shard in", "[policy][optimizer]") {
  // The same 405B run: the peak loses the resident parameters, less the shard copied in for a gather (taken
  // where the gather is issued, freed once it has sent it) and what LHS's prefetch gate lets the QKV reloads
  // take of the room they leave (0.6 GiB here); pinned host memory gains them.
  RunConfig c = llama405b_gb200();
  const auto off = run_simulation(c);
  const double params = off.hbm_breakdown_bytes.at("parameters");
  REQUIRE(params > 0);
  c.parameter_offload = true;
  const auto on = run_simulation(c);
  auto at_peak = [](const StepReport& r, const char* what) {
    return r.hbm_breakdown_bytes.count(what) ? r.hbm_breakdown_bytes.at(what) : 0.0;
  };
  auto in_flight = [&](const StepReport& r) { return at_peak(r, "offload_buffers") + at_peak(r, "parameters"); };
  CHECK(on.hbm_peak_bytes <= off.hbm_peak_bytes - params + in_flight(on) + 1);
  CHECK(on.hbm_peak_bytes > off.hbm_peak_bytes - params - 2.0 * (1 << 30));
  CHECK(on.hbm_breakdown_bytes.at("parameters") < 0.1 * params);  // at most a shard in flight
  CHECK(on.host_peak_bytes == Approx(off.host_peak_bytes + params).epsilon(1e-12));
  // Every layer's shard crosses the host link twice (the forward's gather and the backward's), and the
  // parameters once more each way for the update: the H2D engine is busy at least that long at the
  // per-GPU H2D rate, and the step never gets shorter.
  const auto run = prepare_run(c);
  const double h2d = run.system.host_h2d_bytes_per_s();
  CHECK(on.busy_s.at("h2d") >= off.busy_s.at("h2d") + 2 * params / h2d * (1 - 1e-9));
  CHECK(on.step_time_s >= off.step_time_s);
  // With the optimizer state offloaded as well, both leave HBM; with the CPU update the parameters are never
  // copied back in for it.
  c.optimizer_offload = "device";
  const double state = off.hbm_breakdown_bytes.at("optimizer_state");
  const auto both = run_simulation(c);
  CHECK(both.hbm_peak_bytes <= off.hbm_peak_bytes - params - state + in_flight(both) + 1);
  c.optimizer_offload = "host";
  RunConfig host_only = c;
  host_only.parameter_offload = false;
  CHECK(run_simulation(c).busy_s.at("h2d") < run_simulation(host_only).busy_s.at("h2d") + 2 * params / h2d);
  // Too large for the host: Llama 405B on 8 H100s, its parameters and Adam state are hundreds of GiB per GPU.
  RunConfig big = test::llama8b_h200("full");
  big.model = "llama3.1-405b";
  big.system = "h100-hgx";
  big.parameter_offload = true;
  big.optimizer_offload = "host";
  CHECK_THROWS_WITH(run_simulation(big), Catch::Contains("parameter_offload = true (the optimizer state, gradients and parameters") &&
                                             Catch::Contains("exceed the pinned host memory per GPU"));
}

TEST_CASE("fp8_saved_activations keeps an fp8 GEMM's input in fp8 for the backward", "[policy][fp8]") {
  // Llama 3.1 8B, every GEMM in fp8, no recompute, one GPU: the inputs of the four GEMMs of a layer (the two
  // norm outputs, the attention output, the SwiGLU output) are kept at 1 byte per element (per-tensor scaling:
  // one scale per tensor) instead of 2 bytes; the layer input and the attention's and SwiGLU's own inputs stay
  // bf16. At the end of the forward every layer's kept tensors are live, so the HBM peak falls by 32 layers of
  // the difference.
  RunConfig c = test::llama8b_h200("no_recompute");
  c.gpus = 1;
  c.batch = 1;
  c.weights = c.attention_dtype = "fp8";
  const auto bf16 = run_simulation(c);
  c.fp8_saved_activations = true;
  const auto fp8 = run_simulation(c);
  const StepGraph g = prepare_run(c).graph;
  double gemm_inputs = 0;
  for (const char* name : {"attn_norm", "context", "mlp_norm", "mlp_act"}) gemm_inputs += g.tensor_bytes(name);
  REQUIRE(gemm_inputs > 0);
  const double saved_per_layer = gemm_inputs * (1 - 1.0 / 2);
  CHECK(bf16.hbm_peak_bytes - fp8.hbm_peak_bytes == Approx(32 * saved_per_layer).epsilon(1e-9));
  // MXFP8 (Blackwell) adds an E8M0 scale byte per 32 elements: 1 + 1/32 bytes instead of 2.
  c.system = "b200-hgx";
  c.weights = c.attention_dtype = "mxfp8";
  c.fp8_saved_activations = false;
  const auto mx_bf16 = run_simulation(c);
  c.fp8_saved_activations = true;
  const auto mx = run_simulation(c);
  CHECK(mx_bf16.hbm_peak_bytes - mx.hbm_peak_bytes == Approx(32 * gemm_inputs * (1 - (1 + 1.0 / 32) / 2)).epsilon(1e-9));
  c.system = "h200-hgx";
  // bf16 GEMMs keep bf16 inputs whatever the switch.
  c.weights = c.attention_dtype = "bf16";
  const auto plain = run_simulation(c);
  c.fp8_saved_activations = false;
  CHECK(run_simulation(c).hbm_peak_bytes == plain.hbm_peak_bytes);
}

TEST_CASE("fp8_saved_activations keeps an nvfp4 GEMM's input in nvfp4, and an input of both kinds in the larger", "[policy][fp8]") {
  // As above with the MLP's GEMMs in nvfp4 and the projections in fp8: the MLP's inputs (mlp_norm, mlp_act)
  // are kept at half a byte per element plus an FP8 scale byte per 16 (TE's NVFP4 recipe saves its quantized
  // input), the projections' inputs (attn_norm, context) at 1 byte.
  RunConfig c = test::llama8b_h200("no_recompute");
  c.system = "b200-hgx";  // NVFP4 tensor cores
  c.gpus = 1;
  c.batch = 1;
  c.weights = "nvfp4";
  c.attention_dtype = "fp8";
  const auto bf16 = run_simulation(c);
  c.fp8_saved_activations = true;
  const auto quantized = run_simulation(c);
  const StepGraph g = prepare_run(c).graph;
  const double fp8_inputs = g.tensor_bytes("attn_norm") + g.tensor_bytes("context");
  const double nvfp4_inputs = g.tensor_bytes("mlp_norm") + g.tensor_bytes("mlp_act");
  REQUIRE(fp8_inputs > 0);
  REQUIRE(nvfp4_inputs > 0);
  const double saved_per_layer = fp8_inputs * (1 - 1.0 / 2) + nvfp4_inputs * (1 - (0.5 + 1.0 / 16) / 2);
  CHECK(bf16.hbm_peak_bytes - quantized.hbm_peak_bytes == Approx(32 * saved_per_layer).epsilon(1e-9));
}

TEST_CASE("plan offload-layers finds the fewest layers that fit, checked one either side", "[policy][layers][plan]") {
  // Llama 3.1 70B on 64 GB200s, batch 2 x 8192, fp8 (the README's curve): keeping everything needs about
  // 289 GiB, each layer offloaded takes about 3 GiB off, so the answer is near 38; whatever it is, that many
  // fit and one fewer does not.
  RunConfig c = test::llama70b_gb200("minimal_with_context");
  const LayerCountSearch r = fewest_layers(c, LayerCount::offload);
  REQUIRE(r.layers > 0);
  CHECK(r.layers > 30);
  CHECK(r.layers < 45);
  c.offload_layers = r.layers;
  CHECK(run_simulation(c).fits);
  c.offload_layers = r.layers - 1;
  CHECK_FALSE(run_simulation(c).fits);
  CHECK(r.tried.size() <= 9);  // bisection over 0..80
  // A run that fits as it is needs none; one the host cannot take says so.
  c.batch = 1;
  c.seq = 2048;
  CHECK(fewest_layers(c, LayerCount::offload).layers == 0);
  c.system = "h100-hgx";
  c.seq = 8192;
  c.batch = 4;
  c.gpus = 8;
  const LayerCountSearch none = fewest_layers(c, LayerCount::offload);
  CHECK(none.layers == -1);
  CHECK_FALSE(none.why.empty());
}

TEST_CASE("plan recompute-layers finds the fewest layers per chunk recomputed for the run to fit", "[policy][layers][plan]") {
  // Llama 3.1 70B on 64 GB200s as above, no recompute: recomputing a layer in full keeps only its input, so
  // some count between 1 and 80 fits; that count fits and one fewer does not. Host memory is untouched.
  RunConfig c = test::llama70b_gb200("no_recompute");
  const LayerCountSearch r = fewest_layers(c, LayerCount::recompute);
  REQUIRE(r.layers > 0);
  c.recompute_layers = r.layers;
  const auto at = run_simulation(c);
  CHECK(at.fits);
  CHECK(at.host_peak_bytes == 0);
  c.recompute_layers = r.layers - 1;
  CHECK_FALSE(run_simulation(c).fits);
  // Each count's recompute time is that many of one layer's (the layers are alike; MaxText's XLA recomputes what
  // the backward reads of each), none without any; its JSON rows say so beside the memory.
  const nlohmann::json doc = layer_count_json(r);
  double per_layer = -1;
  for (const auto& row : doc["tried"]) {
    const auto n = row["recompute_layers"].get<std::int64_t>();
    const double s = row["recompute_s"].get<double>();
    if (n == 0) {
      CHECK(s == 0);
      continue;
    }
    if (per_layer < 0) per_layer = s / static_cast<double>(n);
    CHECK(s == Approx(per_layer * static_cast<double>(n)).epsilon(1e-9));
    CHECK(row["host_copies_exposed_s"].get<double>() == 0);  // nothing goes to the host
  }
  CHECK(per_layer > 0);
  // With pp 2 the count is per chunk: at most 40.
  c.pp = 2;
  c.microbatches = 2;
  c.recompute_layers = 0;
  const LayerCountSearch piped = fewest_layers(c, LayerCount::recompute);
  for (const auto& t : piped.tried) CHECK(t.config.recompute_layers <= 40);
}

namespace {
// Llama 3.1 8B on one H200 under Megatron (d 4096, F 14336, 32 layers), one sequence of T = 4096 tokens.
RunConfig llama8b_megatron(const std::string& policy) {
  RunConfig c = test::llama8b_h200(policy, false);
  c.framework = "megatron";
  c.seq = 4096;
  c.batch = 1;
  return c;
}
}  // namespace

TEST_CASE("Megatron's full recompute runs the whole layer's forward again and XLA's only what the backward reads", "[policy]") {
  // PyTorch's checkpoint (Megatron recompute_granularity full) reruns the checkpointed function entirely, so its
  // backward redoes the MLP's down projection and the residual adds, whose outputs no backward op reads; XLA's
  // rematerialization recomputes only what the backward needs. The down projection is 2 x T x F x d = 481.04 GFLOP
  // per layer.
  const RunConfig megatron = llama8b_megatron("full");
  RunConfig xla = megatron;
  xla.framework = "maxtext";
  const auto whole = replayed_ops(megatron), needed = replayed_ops(xla);
  for (const char* op : {"wo", "residual_attn", "residual_mlp", "wq", "attention"}) CHECK(whole.count(op) == 1);
  CHECK(needed.count("wo") == 0);
  CHECK(needed.count("residual_mlp") == 0);
  CHECK(needed.count("wq") == 1);
  // Executed work: the whole forward again against the forward less the down projection and the last residual
  // add (a memory op, counted at its bytes: two bf16 inputs and an output of T x d, 6 x T x d).
  const auto a = run_simulation(megatron), b = run_simulation(xla);
  const double down_proj = 2.0 * 4096 * 14336 * 4096, residual = 6.0 * 4096 * 4096;
  const double layers = 32;
  CHECK(a.executed_flops_per_device - b.executed_flops_per_device == Approx(layers * (down_proj + residual)).epsilon(1e-9));
  CHECK(a.model_flops_per_device == b.model_flops_per_device);
}

TEST_CASE("Megatron's mlp recompute runs the whole MLP again, its down projection included", "[policy]") {
  // recompute_modules mlp checkpoints the MLP's forward (the norm fused into fc1, fc1, the activation, fc2), so
  // the backward runs fc2 again though it reads nothing fc2 makes: the module's names replay exactly those five
  // ops, and the executed work grows by the MLP's forward: three GEMMs of 2 x T x d x F and two memory-bound ops
  // counted at their bytes (the norm: an input and an output of T x d; the activation: two inputs and an output of
  // T x F; bf16).
  const RunConfig base = llama8b_megatron("no_recompute");
  RunConfig mlp = base;
  for (const char* t : {"mlp_norm", "mlpwi_0", "mlpwi_1", "mlp_act", "mlpwo"}) mlp.tensors[t] = "remat";
  CHECK(replayed_ops(mlp) == std::map<std::string, OpKind>{{"mlp_norm", OpKind::memory}, {"wi_0", OpKind::gemm},
                                                           {"wi_1", OpKind::gemm},       {"swiglu", OpKind::memory},
                                                           {"wo", OpKind::gemm}});
  CHECK_THAT(megatron_settings(mlp), Catch::Contains("--recompute-modules mlp"));
  const double T = 4096, d = 4096, F = 14336;
  const double per_layer = 3 * 2 * T * d * F + 2 * T * d * 2 + 3 * T * F * 2;
  const auto a = run_simulation(mlp), b = run_simulation(base);
  CHECK(a.executed_flops_per_device - b.executed_flops_per_device == Approx(32 * per_layer).epsilon(1e-9));
}

TEST_CASE("Under tensor parallelism Megatron's mlp recompute runs fc2's reduction over tp again", "[policy][tp]") {
  // fc2 is a row-parallel linear: Transformer Engine reduces its output over tp inside its forward (a
  // reduce-scatter with sequence parallelism, an all-reduce without), so the checkpointed MLP runs that
  // collective again in the backward though nothing reads its output. At tp 2 the tp group runs T = 2 x 4096
  // tokens; the reduce-scatter moves the group's T x d bf16 output, of which a rank sends (tp - 1) / tp, and the
  // all-reduce twice that. 32 layers, one such collective more in each.
  const RunConfig base = llama8b_megatron("no_recompute");
  struct Case {
    bool sp;
    const char* collective;
    double sends;  // times (tp - 1) / tp x T x d x 2 bytes
  };
  for (const Case& k : {Case{true, "mlp_out_reduce_scatter", 1}, Case{false, "mlp_out_all_reduce", 2}}) {
    INFO("sequence parallel " << k.sp);
    RunConfig plain = base;
    plain.tp = 2;
    plain.sequence_parallel = k.sp;
    RunConfig mlp = plain;
    for (const char* t : {"mlp_norm", "mlpwi_0", "mlpwi_1", "mlp_act", "mlpwo"}) mlp.tensors[t] = "remat";
    const auto replayed = replayed_ops(mlp);
    REQUIRE(replayed.count(k.collective) == 1);
    CHECK(replayed.at(k.collective) == OpKind::comm);
    CHECK(replayed.count("wo") == 1);
    CHECK(replayed_ops(plain).count(k.collective) == 0);
    // The bytes the module's replays add over tp: the reduction above only. With sequence parallelism fc1's
    // replay needs the norm's output gathered, but the backward gathers it again for fc1's weight gradient
    // without the module too (Transformer Engine keeps the sequence shard), and the one gather serves both.
    const double T = 2 * 4096, d = 4096, f = 0.5, act = T * d * 2;
    const double per_layer = k.sends * f * act;
    const auto a = run_simulation(mlp), b = run_simulation(plain);
    CHECK(a.comm_bytes.at("tp") - b.comm_bytes.at("tp") == Approx(32 * per_layer).epsilon(1e-9));
  }
}
