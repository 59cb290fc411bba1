#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "helpers.hpp"
#include "planner/reproduce.hpp"
#include "hwmodels/profile.hpp"
#include "planner/run_config.hpp"

using namespace hbmsim;

namespace {
constexpr double GiB = 1073741824.0;

RunConfig small(const std::string& policy, bool lhs = true) { return test::llama8b_h200(policy, lhs); }

int find_op(const std::vector<std::string>& names, const std::string& name) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  FAIL("no op named " << name);
  return -1;
}

// One simulated step: its program and every op's start and end, looked up by the op's name.
struct Timeline {
  std::vector<std::string> names;
  sim::Program program;
  sim::EngineResult result;

  std::size_t id(const std::string& op) const { return static_cast<std::size_t>(find_op(names, op)); }
  std::pair<double, double> at(const std::string& op) const {
    auto i = id(op);
    return {result.start_s[i], result.end_s[i]};
  }
};

Timeline timeline(const RunConfig& c) {
  Timeline t;
  auto run = prepare_run(c);
  t.program = build_program(run.graph, run.system, run.policy, run.options, &t.names);
  t.result = sim::run_program(t.program, true);
  return t;
}

// DeepSeek-V3 on 128 GB200 GPUs with EP 64; the routed experts' up-projection outputs are offloaded, the
// rest recomputed.
RunConfig dsv3_experts_offloaded(std::int64_t batch, std::int64_t seq) {
  RunConfig c;
  c.system = "gb200-nvl72";
  c.model = "deepseek-v3-671b";
  c.gpus = 128;
  c.ep = 64;
  c.batch = batch;
  c.seq = seq;
  c.policy = "custom";
  c.tensors = {{"moe_mlpwi_0", "offload"}, {"moe_mlpwi_1", "offload"}};
  return c;
}
}  // namespace

TEST_CASE("an offloaded tensor leaves HBM when its D2H and its last forward reader are done, and returns when its H2D starts", "[sim]") {
  auto run = prepare_run(small("qkv_proj_offloaded"));
  std::vector<std::string> names;
  auto program = build_program(run.graph, run.system, run.policy, run.options, &names);
  auto r = sim::run_program(program, true);
  auto start = [&](int op) { return r.start_s[static_cast<std::size_t>(op)]; };
  auto end = [&](int op) { return r.end_s[static_cast<std::size_t>(op)]; };
  // The forward pass ends with layer 31's last forward op; nothing of the backward may be fetched before.
  double forward_end = 0;
  for (std::size_t i = 0; i < program.ops.size(); ++i)
    if (program.ops[i].phase == 'f' && program.ops[i].layer == 31) forward_end = std::max(forward_end, r.end_s[i]);
  for (int layer : {0, 17, 31}) {
    auto l = " L" + std::to_string(layer);
    int d2h = find_op(names, "d2h query_proj" + l);
    int h2d = find_op(names, "h2d query_proj" + l);
    int attn = find_op(names, "attention" + l);  // the attention forward: reads query, key and value
    const auto& copy_out = program.ops[static_cast<std::size_t>(d2h)];
    const auto& copy_in = program.ops[static_cast<std::size_t>(h2d)];
    REQUIRE(copy_out.releases.size() == 1);
    REQUIRE(copy_in.allocs.size() == 1);
    auto device_copy = static_cast<std::size_t>(copy_out.releases[0]);
    auto fetched = static_cast<std::size_t>(copy_in.allocs[0]);
    CHECK(program.buffers[device_copy].bytes == run.graph.tensor_bytes("query_proj"));
    // The device copy has two readers, the D2H and the attention forward: both drop it, and it goes when
    // the later of the two is done, whichever that is, at that op's end (times read off the two ops).
    const auto& reader = program.ops[static_cast<std::size_t>(attn)];
    CHECK(std::count(reader.releases.begin(), reader.releases.end(), copy_out.releases[0]) == 1);
    CHECK(r.buffer_free_s[device_copy] == Approx(std::max(end(d2h), end(attn))).epsilon(1e-12));
    // Here the copy is the later one: 64 MiB at the H200's 55 GB/s PCIe share (three copies of the layer
    // in flight at once) takes over 1.2 ms, while the attention forward, 4 x 8192 x 4096 x 32 x 128 / 2 =
    // 2.7e11 FLOPs at under 989 TFLOP/s, takes well under 1 ms; the copy started before it, at wq's end.
    CHECK(end(d2h) > end(attn));
    CHECK(end(d2h) - start(d2h) > 1.2e-3 * 0.9);
    // The fetched copy is a new buffer: not resident, not alive from the step's start (t = 0), nor during
    // the forward pass (the backward needs it), but from the moment its H2D starts, which is after the D2H
    // it depends on and after the forward pass's last op.
    CHECK(std::find(program.resident.begin(), program.resident.end(), copy_in.allocs[0]) == program.resident.end());
    CHECK(r.buffer_alloc_s[fetched] > 0);
    CHECK(r.buffer_alloc_s[fetched] >= end(d2h));
    CHECK(r.buffer_alloc_s[fetched] >= forward_end);
    CHECK(r.buffer_alloc_s[fetched] == Approx(start(h2d)).epsilon(1e-12));
    CHECK(r.buffer_free_s[fetched] > end(h2d));
    // The host copy lives from the D2H start to the H2D end.
    auto host = static_cast<std::size_t>(copy_out.allocs[0]);
    CHECK(program.buffers[host].host);
    CHECK(r.buffer_alloc_s[host] == start(d2h));
    CHECK(r.buffer_free_s[host] == end(h2d));
  }
}

TEST_CASE("remat raises executed FLOPs by exactly the replayed ops and lowers the HBM peak by the saved bytes", "[sim]") {
  // save_qkv_proj keeps query/key/value; full recomputes them from the saved layer input, so full executes
  // the three projection GEMMs once more per layer: 2*T*d*(H + 2*Hkv)*D FLOPs with T = 8192 tokens,
  // d = 4096, H = 32, Hkv = 8, D = 128 -> 2*8192*4096*6144 = 4.123e11 per layer, 32 layers.
  auto saved = run_simulation(small("save_qkv_proj"));
  auto full = run_simulation(small("full"));
  const double per_layer_flops = 2.0 * 8192 * 4096 * (32 + 2 * 8) * 128;
  CHECK(full.executed_flops_per_device - saved.executed_flops_per_device == Approx(32 * per_layer_flops).epsilon(1e-9));
  CHECK(full.model_flops_per_device == saved.model_flops_per_device);  // model FLOPs never count remat
  // Saved bytes: (8192*32*128 + 2*8192*8*128) * 2 bytes = 96 MiB per layer, over 32 layers. The peak sits at
  // the end of the forward pass, where every layer's QKV is live in one policy and none in the other.
  const double qkv_bytes = (8192.0 * 32 * 128 + 2 * 8192.0 * 8 * 128) * 2;
  CHECK(saved.hbm_peak_bytes - full.hbm_peak_bytes == Approx(32 * qkv_bytes).epsilon(0.0001));
  CHECK(saved.hbm_breakdown_bytes.at("saved_activations") - full.hbm_breakdown_bytes.at("saved_activations") ==
        Approx(32 * qkv_bytes));
}

TEST_CASE("without LHS offload copies are exposed, with LHS they hide behind compute", "[sim]") {
  auto on = run_simulation(small("qkv_proj_offloaded", true));
  auto off = run_simulation(small("qkv_proj_offloaded", false));
  // Without LHS each D2H starts at its layer's end and the next layer waits for all of it: the compute stream
  // waits for 96 MiB per layer at the H200's 55 GB/s PCIe rate (times the copy efficiency at that size).
  auto sys = prepare_run(small("full")).system;
  const double layer_bytes = (8192.0 * 32 * 128 + 2 * 8192.0 * 8 * 128) * 2;
  const double q_bytes = 8192.0 * 32 * 128 * 2, kv_bytes = 8192.0 * 8 * 128 * 2;
  auto copy_s = [&](double bytes) { return bytes / (sys.host_d2h_bytes_per_s() * sys.efficiency.copy.at(bytes)); };
  // The three copies of a layer run together; each gets a third of the direction until the small ones end.
  double d2h_layer = 3 * copy_s(kv_bytes) + (copy_s(q_bytes) - copy_s(kv_bytes));
  CHECK(off.exposed_s.at("d2h") == Approx(32 * d2h_layer).epsilon(0.01));
  CHECK(on.exposed_s.at("d2h") < 0.01 * off.exposed_s.at("d2h"));
  CHECK(off.step_time_s > on.step_time_s);
  CHECK(on.host_peak_bytes == 32 * layer_bytes);
}

TEST_CASE("the same input gives byte-identical JSON and trace output over 10 runs", "[sim][determinism]") {
  RunConfig c = small("qkv_proj_offloaded");
  c.pipelined_transfers = true;
  auto first = run_simulation(c, true);
  auto json0 = first.to_json().dump(), trace0 = first.trace;
  for (int i = 0; i < 9; ++i) {
    auto r = run_simulation(c, true);
    REQUIRE(r.to_json().dump() == json0);
    REQUIRE(r.trace == trace0);
  }
}

TEST_CASE("the trace is valid Chrome trace JSON with a track per resource and memory counters", "[sim][trace]") {
  auto file = test::temp_dir() / "trace.json";
  auto r = test::cli("simulate --system h200-hgx --model llama3.1-8b --gpus 8 --policy qkv_proj_offloaded --trace " + file.string());
  REQUIRE(r.status == 0);
  auto doc = nlohmann::json::parse(test::slurp(file));  // throws on invalid JSON
  REQUIRE(doc.contains("traceEvents"));
  std::set<std::string> tracks;
  std::map<std::pair<int, long long>, std::vector<std::pair<double, double>>> slices;  // per (pid, tid): [ts, ts + dur)
  int complete = 0, counters = 0;
  for (auto& e : doc["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    auto ph = e["ph"].get<std::string>();
    if (ph == "M" && e["name"] == "thread_name") {
      const auto name = e["args"]["name"].get<std::string>();
      tracks.insert(name);
      CHECK(e["args"]["queue"] == name.substr(0, name.find(" #")));  // the queue a lane's track draws
    }
    if (ph == "X") {
      ++complete;
      CHECK(e["dur"].get<double>() >= 0);
      CHECK(e["ts"].get<double>() >= 0);
      CHECK(e.contains("tid"));
      CHECK(e.contains("pid"));
      const double ts = e["ts"].get<double>();
      slices[{e["pid"].get<int>(), e["tid"].get<long long>()}].emplace_back(ts, ts + e["dur"].get<double>());
    }
    if (ph == "C") ++counters;
  }
  // A track per queue the program created: compute, the FSDP collectives, the two copy engines. A layer's three
  // QKV copies share the link at once, so the copy engines take more lanes ("d2h #2"), each a track of its own.
  std::set<std::string> queues;
  for (const auto& t : tracks) queues.insert(t.substr(0, t.find(" #")));
  CHECK(queues == std::set<std::string>{"compute", "fsdp", "d2h", "h2d"});
  CHECK(tracks.count("d2h #2") == 1);
  // No two slices of one track overlap: Perfetto would nest one under the other as if it called it. (ts + dur
  // in microseconds may pass the next ts by a rounding where one op ends as the next starts.)
  for (auto& [track, spans] : slices) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t k = 1; k < spans.size(); ++k) {
      INFO("track " << track.first << "/" << track.second << ": " << spans[k - 1].second << " > " << spans[k].first);
      CHECK(spans[k - 1].second <= spans[k].first * (1 + 1e-12));
    }
  }
  CHECK(complete > 32 * 13);
  CHECK(counters > 0);
}

TEST_CASE("every reference run simulates end to end with datasheet figures, with the measured verdicts", "[sim][reference]") {
  auto rows = reproduce(load_reference_runs(), "");
  REQUIRE(rows.size() == 9);
  std::map<std::string, StepReport> by_id;
  for (auto& r : rows) by_id[r.run.id] = r.predicted;
  CHECK(by_id["dsv3-device-mbs2"].fits);
  CHECK_FALSE(by_id["dsv3-none-mbs8"].fits);
  CHECK(by_id["dsv3-remat-mbs8"].fits);
  CHECK(by_id["dsv3-offload-mbs8"].fits);
  CHECK(by_id["dsv3-offload-lhs-pipe-mbs8"].fits);
  // Offload with LHS (and pipelining) is faster than offload without.
  CHECK(by_id["dsv3-offload-lhs-pipe-mbs8"].tflops_per_device > by_id["dsv3-offload-mbs8"].tflops_per_device);
  CHECK(by_id["llama405b-qkv-offload-lhs"].tflops_per_device > by_id["llama405b-qkv-offload-nolhs"].tflops_per_device);
  // QKV offload for Llama 405B pins 126 layers * 576 MiB = 70.875 GiB of host memory.
  CHECK(by_id["llama405b-qkv-offload-lhs"].host_peak_bytes == 70.875 * GiB);
  for (auto& r : rows) {
    INFO(r.run.id);
    if (r.fits_right) CHECK(*r.fits_right);
  }
}

TEST_CASE("halving the measured H2D bandwidth in a profile lengthens an exposed offload by its copy time", "[sim][profile]") {
  // Without LHS every H2D starts right before the op that reads it, so the compute stream waits for the whole
  // copy. All copy rates scale with the H2D bandwidth: at half the bandwidth each copy takes exactly twice as
  // long, so the exposed H2D time doubles and the step grows by exactly the exposed time at full bandwidth.
  auto dir = test::temp_dir();
  auto write_profile = [&](const std::string& name, double h2d) {
    Profile p;
    p.name = name;
    p.h2d_bytes_per_s = h2d;
    auto path = (dir / (name + ".json")).string();
    test::write(path, dump_json(p.to_json(), 2));
    return path;
  };
  RunConfig c = small("qkv_proj_offloaded", false);
  c.calibration = write_profile("full-h2d", 40e9);
  auto full = run_simulation(c);
  c.calibration = write_profile("half-h2d", 20e9);
  auto half = run_simulation(c);
  REQUIRE(full.exposed_s.at("h2d") > 0);
  // Each of the 96 copies (3 per layer, all read by the recomputed attention) also pays the link's fixed
  // latency L, which does not scale with bandwidth: exposed = 32 x (bytes / bw) + 96 L.
  const double latency = 96 * prepare_run(c).system.host_link.latency_s;
  CHECK(half.exposed_s.at("h2d") - latency == Approx(2 * (full.exposed_s.at("h2d") - latency)).epsilon(1e-9));
  CHECK(half.step_time_s - full.step_time_s == Approx(full.exposed_s.at("h2d") - latency).epsilon(1e-6));
  // The D2H side is untouched by an H2D-only profile.
  CHECK(half.exposed_s.at("d2h") == Approx(full.exposed_s.at("d2h")));
  // Per layer the three copies move query (64 MiB) and key and value (16 MiB each) and run together; with
  // LHS off none of it overlaps compute, so the exposed time is at least the bytes over the bandwidth.
  const double layer_bytes = (8192.0 * 32 * 128 + 2 * 8192.0 * 8 * 128) * 2;
  CHECK(full.exposed_s.at("h2d") >= 32 * layer_bytes / 40e9);
}

TEST_CASE("a malformed calibration profile exits with status 2 naming the file and JSON path", "[sim][profile][cli]") {
  auto file = test::temp_dir() / "bad-profile.json";
  test::write(file, R"({"format":"hbmsim-profile/1","host_link":{"h2d_bytes_per_s":0}})");
  auto r = test::cli("simulate --system h200-hgx --model llama3.1-8b --gpus 8 --calibration " + file.string());
  CHECK(r.status == 2);
  CHECK(r.err.find(file.string() + ": host_link.h2d_bytes_per_s = 0 (must be > 0)") != std::string::npos);
}

TEST_CASE("a streamed optimizer update's chunks take the host link in chunk order, each copy its own bytes' time", "[sim]") {
  // Llama 3.1 8B on 8 H200s with the optimizer state in host memory, updated on the GPU: the state streams
  // through HBM in layer chunks, two in flight. The first two chunks' copies in start together; the link serves
  // the chunk needed first whole, so each copy takes exactly its solo time (its op's seconds: bytes over the
  // link's share plus latency), the second's ending one solo time after the first's.
  RunConfig c = small("full");
  c.optimizer_offload = "device";
  const Timeline t = timeline(c);
  const auto a = t.at("optimizer state in chunk 0"), b = t.at("optimizer state in chunk 1");
  const double solo = t.program.ops[t.id("optimizer state in chunk 0")].seconds;
  REQUIRE(b.first < a.second);  // the second chunk's copy starts while the first's runs
  CHECK(a.second - a.first == Approx(solo).epsilon(1e-9));
  CHECK(b.second == Approx(a.second + solo).epsilon(1e-9));
}

TEST_CASE("with LHS independent work runs under the expert all-to-all, without LHS it waits", "[sim][lhs]") {
  // DeepSeek-V3 at a small batch (it fits, so no prefetch is held back by the memory limit).
  RunConfig c = dsv3_experts_offloaded(1, 1024);
  c.lhs = true;
  const auto on = timeline(c);
  c.lhs = false;
  const auto off = timeline(c);
  const std::string l = " L10";
  // Forward: the shared expert reads the normed input, not the dispatched tokens. LHS issues it under the
  // dispatch; in program order it comes after the combine.
  CHECK(on.at("wi_0" + l).first == Approx(on.at("dispatch_a2a" + l).first));
  CHECK(off.at("wi_0" + l).first >= off.at("combine_a2a" + l).second);
  // Backward with LHS: the dispatch's backward starts as soon as its input, the last input-gradient dot,
  // is done, and a weight-gradient dot (needed by nothing but the reduce-scatter) runs beside it.
  auto a2a = on.at("bwd dispatch_a2a" + l);
  CHECK(a2a.first == Approx(on.at("bwd_x moe_wi_0" + l).second));
  bool filled = false;
  for (const char* w : {"bwd_w moe_wo", "bwd_w moe_wi_1", "bwd_w moe_wi_0"})
    filled = filled || on.at(w + l).first == Approx(a2a.first);
  CHECK(filled);
  // The replayed dispatch is read only by the up-projections' weight gradients (their outputs come back
  // from the host), so compute of the layer runs under it. (Which op: since LHS's order counts the reloads'
  // copy time from the iteration's start, the attention's recompute goes first and the experts' backward
  // waits for the combine's backward behind the dispatch on the expert-parallel queue.)
  auto under_replayed_dispatch = [&](const Timeline& t) {  // the layer's compute ops that start while it runs
    const auto replayed = t.at("recompute dispatch_a2a" + l);
    int under = 0;
    for (std::size_t i = 0; i < t.names.size(); ++i) {
      const auto& n = t.names[i];
      const bool compute = t.program.queues[static_cast<std::size_t>(t.program.ops[i].queue)].compute;
      under += compute && n.size() > l.size() && n.compare(n.size() - l.size(), l.size(), l) == 0 &&
               t.result.start_s[i] >= replayed.first && t.result.start_s[i] < replayed.second;
    }
    return under;
  };
  CHECK(under_replayed_dispatch(on) >= 2);
  CHECK(under_replayed_dispatch(off) == 0);
  // Without LHS each GEMM's backward (both dots, one op) runs in program order and the all-to-all after it.
  CHECK(off.at("bwd dispatch_a2a" + l).first >= off.at("bwd moe_wi_0" + l).second);
  CHECK(off.at("recompute dispatch_a2a" + l).second <= off.at("bwd moe_wo" + l).first);
  CHECK(off.at("bwd moe_wo" + l).second - off.at("bwd moe_wo" + l).first ==
        Approx((on.at("bwd_w moe_wo" + l).second - on.at("bwd_w moe_wo" + l).first) +
               (on.at("bwd_x moe_wo" + l).second - on.at("bwd_x moe_wo" + l).first))
            .epsilon(1e-9));
  // The step itself is bound by the FSDP all-gathers at this batch (the same 1.333 s either way, to the
  // last digits): LHS must not make it slower.
  CHECK(on.result.end_time_s <= off.result.end_time_s * (1 + 1e-12));
  // Splitting the backward GEMM into two dots keeps its FLOPs: the executed total is the same either way.
  CHECK(on.result.executed_flops == Approx(off.result.executed_flops).epsilon(1e-12));
}

TEST_CASE("with a batch split LHS overlaps one micro-batch's all-to-all with the other's compute", "[sim][lhs][split]") {
  // DeepSeek-V3 at batch 8 x seq 4096 (the measured runs' shape; at small batches the all-to-alls are too
  // short for the split to pay for its smaller GEMMs). Split 2: under LHS, micro-batch 1's attention runs
  // while micro-batch 0's dispatch is in flight; without LHS each all-to-all blocks the compute stream, so
  // the split cannot help.
  RunConfig c = dsv3_experts_offloaded(8, 4096);
  auto run_with = [&](bool lhs, std::int64_t split) {
    c.lhs = lhs;
    c.moe_batch_split = split;
    return timeline(c);
  };
  const auto on = run_with(true, 2), off = run_with(false, 2);
  const auto on1 = run_with(true, 1).result, off1 = run_with(false, 1).result;
  const std::string l = " L10";
  auto d0 = on.at("mb0/dispatch_a2a" + l);
  auto attn1 = on.at("mb1/attention" + l);
  CHECK(attn1.first < d0.second);
  CHECK(attn1.second > d0.first);
  // Without LHS the other micro-batch's attention waits for the dispatch (and the whole first micro-batch).
  CHECK(off.at("mb1/attention" + l).first >= off.at("mb0/combine_a2a" + l).second);
  // The split hides all-to-all time only under LHS, and it never changes the executed FLOPs.
  CHECK(on.result.end_time_s < on1.end_time_s);
  CHECK(off.result.end_time_s >= off1.end_time_s);
  CHECK(on.result.executed_flops == Approx(on1.executed_flops).epsilon(1e-9));
  CHECK(off.result.executed_flops == Approx(off1.executed_flops).epsilon(1e-9));
}

TEST_CASE("each embedding table is gathered where it is used and freed after its last reader", "[sim][memory]") {
  // DeepSeek-V3 has separate input and output tables of 129280 x 7168 bf16 (1.85 GB each, gathered over
  // all 128 GPUs). The input table is read only by the lookup; the unembedding is gathered one layer ahead
  // of the head and freed after the head's backward, so the two are never held together.
  const auto t = timeline(reference_config("dsv3-offload-mbs8"));
  const auto& program = t.program;
  auto id = [&](const std::string& n) { return t.id(n); };
  // Each table's buffer comes alive where its gather is issued (OpWriter::issue).
  const auto& embed = program.ops[id("issue all_gather embedding")];
  const auto& head = program.ops[id("issue all_gather unembedding")];
  REQUIRE(embed.allocs.size() == 1);
  REQUIRE(head.allocs.size() == 1);
  const double table = 129280.0 * 7168 * 2;
  CHECK(program.buffers[static_cast<std::size_t>(embed.allocs[0])].bytes == table);
  CHECK(program.buffers[static_cast<std::size_t>(head.allocs[0])].bytes == table);
  const auto& lookup = program.ops[id("embedding_lookup")];
  CHECK(std::count(lookup.releases.begin(), lookup.releases.end(), embed.allocs[0]) == 1);
  const auto& unembed_bwd = program.ops[id("unembed_bwd")];
  CHECK(std::count(unembed_bwd.releases.begin(), unembed_bwd.releases.end(), head.allocs[0]) == 1);
  // Timing: the head's table arrives after the lookup is long done (during the last layers' forward) and
  // before the unembedding reads it.
  CHECK(t.at("all_gather unembedding").first >= t.at("mb0/attn_norm L59").second - 1e-12);
  CHECK(t.at("all_gather unembedding").second <= t.at("unembed").first + 1e-12);
}

TEST_CASE("with LHS a layer's prefetches come back one after another, in the order the backward first reads them", "[sim][lhs]") {
  // Llama 3.1 8B on H200s, every matmul output offloaded, HBM raised so that no prefetch is held back: a
  // layer's reloads start together at its backward iteration's start. The link serves them by first reader
  // (one priority class each; tensors first read by the same step share a class), so each class's last
  // reload ends its solo time (the op's bytes at the full link) after the class before it, and the one the
  // backward reads first is not slowed by the others. Shared evenly, all would end together.
  RunConfig c = small("minimal_offloaded");
  c.hbm_bytes = 1e12;
  const Timeline t = timeline(c);
  for (int layer : {3, 17, 30}) {
    INFO("layer " << layer);
    const std::string suffix = " L" + std::to_string(layer);
    std::map<int, std::pair<double, double>> by_class;  // priority: the class's solo seconds, its last end
    double first_start = -1;
    int last_priority = -1;
    for (std::size_t i = 0; i < t.names.size(); ++i) {
      const std::string& n = t.names[i];
      if (n.rfind("h2d ", 0) != 0 || n.size() < suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
      const auto& op = t.program.ops[i];
      CHECK(op.priority >= last_priority);  // issued in first-read order
      last_priority = op.priority;
      auto& [solo, end] = by_class[op.priority];
      solo += op.seconds;
      end = std::max(end, t.result.end_s[i]);
      if (first_start < 0) first_start = t.result.start_s[i];
      CHECK(t.result.start_s[i] == Approx(first_start).epsilon(1e-12));
    }
    REQUIRE(by_class.size() >= 3);
    double previous = -1;
    for (const auto& [priority, cls] : by_class) {
      if (previous >= 0) CHECK(cls.second - previous == Approx(cls.first).epsilon(1e-9));
      else CHECK(cls.second - first_start >= cls.first * (1 - 1e-9));
      previous = cls.second;
    }
  }
}

TEST_CASE("with double buffering LHS starts a layer's prefetch at the start of its two-layer loop body", "[sim][lhs]") {
  // Llama 3.1 405B, QKV offloaded, LHS without pipelined transfers. The backward loop runs layers 125,
  // 124, ...; double buffered, 125 and 124 share a body, so layer 124's query prefetch starts with 125's,
  // while otherwise it waits for layer 124's own iteration. The other half of the layers still wait, so the
  // exposed H2D time about halves. Without LHS nothing moves a copy, and the option changes nothing. HBM is
  // raised so that the memory limit never holds a prefetch back: what is tested is where the body starts.
  RunConfig c = reference_config("llama405b-qkv-offload-lhs");
  c.hbm_bytes = 1e12;
  auto run_with = [&](bool lhs, bool db) {
    c.lhs = lhs;
    c.double_buffering = db;
    return timeline(c);
  };
  const auto db = run_with(true, true), sb = run_with(true, false);
  auto start = [](const Timeline& t, const std::string& op) { return t.at(op).first; };
  CHECK(start(db, "h2d query_proj L124") == Approx(start(db, "h2d query_proj L125")));
  CHECK(start(sb, "h2d query_proj L124") > start(sb, "h2d query_proj L125") + 1e-3);
  // Layers 123 and 122 form the next body: 122 starts with 123, not with 124.
  CHECK(start(db, "h2d query_proj L122") == Approx(start(db, "h2d query_proj L123")));
  CHECK(start(db, "h2d query_proj L123") > start(db, "h2d query_proj L124") + 1e-3);
  auto h2d_exposed = [](const Timeline& t) {
    for (std::size_t q = 0; q < t.program.queues.size(); ++q)
      if (t.program.queues[q].name == "h2d") return t.result.exposed_s[q];
    FAIL("no h2d queue");
    return 0.0;
  };
  const double exposed_db = h2d_exposed(db), exposed_sb = h2d_exposed(sb);
  CHECK(exposed_sb > 0);
  CHECK(exposed_db < 0.6 * exposed_sb);
  CHECK(exposed_db > 0.4 * exposed_sb);
  CHECK(db.result.end_time_s < sb.result.end_time_s);
  CHECK(run_with(false, true).result.end_time_s == run_with(false, false).result.end_time_s);
}

TEST_CASE("a double-buffered loop body never spans two scans", "[sim][lhs]") {
  // DeepSeek-V3: layers 0-2 are one scan (dense), 3-60 another (MoE). Double buffered, the dense bodies
  // are (0, 1) and (2): layer 0's D2H must be done before layer 2 starts, layer 1's too, and layer 2's
  // before layer 3, the first of the next scan, not one layer later.
  RunConfig c = dsv3_experts_offloaded(2, 1024);
  c.tensors = {{"mla_q", "offload"}};
  c.lhs = true;
  c.double_buffering = true;
  const auto t = timeline(c);
  auto waits_for = [&](const std::string& op, const std::string& dep) {
    const auto& deps = t.program.ops[t.id(op)].deps;
    return std::count(deps.begin(), deps.end(), static_cast<int>(t.id(dep))) == 1;
  };
  CHECK(waits_for("attn_norm L2", "d2h mla_q L0"));
  CHECK(waits_for("attn_norm L2", "d2h mla_q L1"));
  CHECK_FALSE(waits_for("attn_norm L1", "d2h mla_q L0"));
  CHECK(waits_for("attn_norm L3", "d2h mla_q L2"));
  CHECK(waits_for("attn_norm L5", "d2h mla_q L3"));
  CHECK(waits_for("attn_norm L5", "d2h mla_q L4"));
}

TEST_CASE("a step over the simulated-op budget (max_ops) is refused before it is built, naming the budget", "[sim][errors]") {
  // The estimate is the layers' ops times the micro-steps, so twice the accumulation estimates exactly twice the
  // ops; a budget below it refuses the step, one above it runs it.
  RunConfig c;
  c.model = "llama3.1-8b";
  c.system = "h100-hgx";
  c.gpus = 8;
  c.max_ops = 1000;
  auto estimate = [&](std::int64_t accumulation) {
    c.grad_accum = accumulation;
    try {
      run_simulation(c);
    } catch (const InputError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("simulated ops; the budget, max_ops, is 1000)") != std::string::npos);
      const auto at = what.find("about ");
      REQUIRE(at != std::string::npos);
      return std::stod(what.substr(at + 6));
    }
    FAIL("not refused");
    return 0.0;
  };
  const double one = estimate(1), two = estimate(2);
  CHECK(one > 1000);
  CHECK(two == 2 * one);
  c.max_ops = static_cast<std::int64_t>(two);
  CHECK(run_simulation(c).step_time_s > 0);
  c.max_ops = 0;
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("max_ops = 0 (must be > 0)"));
  CHECK_THROWS_WITH(RunConfig::from_json(nlohmann::json::parse(R"({"max_ops": 0})"), "run.json"),
                    Catch::Contains("max_ops") && Catch::Contains("must be > 0"));
}

TEST_CASE("a query-key norm runs over each head after the projections and keeps its inputs for the backward", "[simulator][qk_norm]") {
  // Llama 3.1 8B's shape with Qwen3's per-head RMSNorm of the queries and keys: on one H200 at batch 2 x 4096,
  // T = 8192 tokens, 32 query and 8 KV heads of 128, bf16 (2 bytes).
  RunConfig c = test::llama8b_h200("no_recompute");
  c.gpus = 1;
  const auto plain_graph = prepare_run(c).graph;
  const auto plain = run_simulation(c);
  const auto path = test::temp_dir() / "llama8b_qk_norm.json";
  std::string model = test::slurp(std::string(HBMSIM_SOURCE_DIR) + "/data/models/llama3.1-8b.json");
  model.replace(model.rfind('}'), 1, ",\n  \"qk_norm\": true\n}");
  test::write(path, model);
  c.model = path.string();
  const auto graph = prepare_run(c).graph;
  const double T = 8192, q_bytes = T * 32 * 128 * 2, k_bytes = T * 8 * 128 * 2;
  CHECK(graph.tensor_bytes("query_norm") == q_bytes);
  CHECK(graph.tensor_bytes("key_norm") == k_bytes);
  CHECK(plain_graph.tensor_bytes("query_norm") == 0);
  // One memory-bound op reads both projections and writes both normed tensors.
  const auto& ops = graph.layer(0).ops;
  auto norm = std::find_if(ops.begin(), ops.end(), [](const OpDef& op) { return op.name == "qk_norm"; });
  REQUIRE(norm != ops.end());
  CHECK(norm->bytes == 2 * (q_bytes + k_bytes));
  CHECK(norm->kind == OpKind::memory);
  // Without recompute every layer keeps the normed heads (the attention's backward reads them) beside the
  // projections (the norm's backward reads those): 32 layers more of them at the end of the forward (the peak's
  // transient part moves by a few hundred KB of 2.7 GB).
  const auto normed = run_simulation(c);
  CHECK(normed.hbm_peak_bytes - plain.hbm_peak_bytes >= 32 * (q_bytes + k_bytes));
  CHECK(normed.hbm_peak_bytes - plain.hbm_peak_bytes == Approx(32 * (q_bytes + k_bytes)).epsilon(1e-4));
  CHECK(normed.step_time_s > plain.step_time_s);
  CHECK(normed.model_flops_per_device == plain.model_flops_per_device);
}

TEST_CASE("the buffers listed at a stage's peak add up to its peak and its breakdown and are all alive then", "[sim][trace]") {
  // Each stage's list is the live set at the instant its HBM first reaches its peak, so it must sum to the peak
  // the engine recorded and to its breakdown at that instant, and each buffer must be allocated by then and
  // not yet freed. An offloading FSDP step, and a tp x pp 4 pipeline (a list per stage).
  RunConfig offload = small("qkv_proj_offloaded");
  offload.pipelined_transfers = true;
  RunConfig pipeline = test::llama8b_h200("minimal", true);
  pipeline.tp = 2;
  pipeline.pp = 4;
  pipeline.microbatches = 8;
  for (const RunConfig& c : {offload, pipeline}) {
    const StepReport r = run_simulation(c, true);
    REQUIRE(r.stages.size() == static_cast<std::size_t>(c.pp));
    for (const StageReport& st : r.stages) {
      INFO("pp " << c.pp << " stage " << st.stage);
      REQUIRE(!st.peak_buffers.empty());
      double sum = 0;
      std::map<std::string, double> by_category;
      for (const PeakBuffer& b : st.peak_buffers) {
        sum += b.bytes;
        by_category[b.category] += b.bytes;
        CHECK(b.alloc_s <= st.hbm_peak_time_s);
        CHECK((b.free_s < 0 || b.free_s >= st.hbm_peak_time_s));
        CHECK(!b.made_by.empty());
      }
      CHECK(sum == Approx(st.hbm_peak_bytes).epsilon(1e-9));
      for (const auto& [category, bytes] : st.hbm_breakdown_bytes) CHECK(by_category[category] == Approx(bytes).epsilon(1e-9).margin(1));
      CHECK(std::is_sorted(st.peak_buffers.begin(), st.peak_buffers.end(),
                           [](const PeakBuffer& a, const PeakBuffer& b) { return a.bytes > b.bytes; }));
    }
    CHECK(run_simulation(c, false).to_json().dump().find("peak_buffers") == std::string::npos);  // only when recorded
  }
}

TEST_CASE("simulate --peak-buffers lists the largest buffers at the peak and what the rest add up to", "[sim][trace][cli]") {
  auto r = test::cli("simulate --system h200-hgx --model llama3.1-8b --gpus 8 --policy qkv_proj_offloaded --peak-buffers 3");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("HBM at the peak (") != std::string::npos);
  CHECK(r.out.find("the 3 largest of") != std::string::npos);
  CHECK(r.out.find(" resident") != std::string::npos);  // the optimizer state is the largest here
  CHECK(r.out.find("the other ") != std::string::npos);
  auto j = test::cli("simulate --system h200-hgx --model llama3.1-8b --gpus 8 --peak-buffers 3 --json");
  REQUIRE(j.status == 0);
  const auto doc = nlohmann::json::parse(j.out);
  REQUIRE(doc["peak_buffers"].size() == 1);
  double sum = 0;
  for (const auto& b : doc["peak_buffers"][0]["buffers"]) sum += b["bytes"].get<double>();
  CHECK(sum == Approx(doc["hbm_peak_bytes"].get<double>()).epsilon(1e-9));
}
