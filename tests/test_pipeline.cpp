// Pipeline parallelism: the schedule tables, their bubbles and in-flight memory on hand-made stage programs,
// and the simulated stages of real models against the same formulas.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "better_hardware.hpp"
#include "helpers.hpp"
#include "named_run.hpp"
#include "planner/framework_settings.hpp"
#include "planner/plan.hpp"
#include "planner/plan_json.hpp"
#include "planner/run_config.hpp"
#include "sim/engine.hpp"
#include "sim/pipeline_schedule.hpp"
#include "sim/program_builder.hpp"
#include "sim/simulator.hpp"
#include "sim/stage_builder.hpp"

using namespace hbmsim;

namespace {

using Table = std::vector<std::vector<PipelineTask>>;

// Runs a schedule table as a program: one device per stage, one compute op per pass lasting `f`, `b` or `w`
// over v (a chunk is 1/v of a stage's layers), a forward waiting for the previous chunk's, a backward for the
// next chunk's (the last chunk's for its own forward), a weight pass for its backward. Every forward
// allocates one unit of activations that its backward (its weight pass, when split) frees. No communication.
struct ToyRun {
  double step = 0;
  std::vector<double> busy, peak;  // per stage
};
ToyRun run_table(const Table& table, int p, int v, double f, double b, double w) {
  sim::Program prog;
  for (int s = 1; s < p; ++s) prog.add_device();
  const int chunks = p * v;
  std::map<std::tuple<int, int, char>, int> op_of;  // (micro-batch, model chunk, pass) -> op
  std::map<std::pair<int, int>, int> act;           // (micro-batch, model chunk) -> buffer
  const bool split = std::any_of(table[0].begin(), table[0].end(), [](auto& t) { return t.pass == Pass::weight_grad; });
  for (int s = 0; s < p; ++s)
    for (const auto& t : table[static_cast<std::size_t>(s)]) {
      const int k = t.chunk * p + s;
      const double secs = (t.pass == Pass::forward ? f : t.pass == Pass::backward ? b : w) / v;
      sim::ProgramOp op(prog.compute_queue(s), secs);
      if (t.pass == Pass::forward) {
        act[{t.microbatch, k}] = prog.add_buffer(1, sim::MemCategory::saved_activations, false, s);
        op.allocs.push_back(act[{t.microbatch, k}]);
      }
      const bool frees = t.pass == (split ? Pass::weight_grad : Pass::backward);
      if (frees) op.releases.push_back(act.at({t.microbatch, k}));
      op_of[{t.microbatch, k, static_cast<char>(t.pass)}] = prog.add(op);
    }
  for (auto& [key, id] : op_of) {
    auto [mb, k, pass] = key;
    auto& deps = prog.ops[static_cast<std::size_t>(id)].deps;
    if (pass == 'F' && k > 0) deps.push_back(op_of.at({mb, k - 1, 'F'}));
    if (pass == 'B') deps.push_back(k + 1 < chunks ? op_of.at({mb, k + 1, 'B'}) : op_of.at({mb, k, 'F'}));
    if (pass == 'W') deps.push_back(op_of.at({mb, k, 'B'}));
  }
  auto r = sim::run_program(prog, false);
  ToyRun out{r.end_time_s, {}, {}};
  for (int s = 0; s < p; ++s) {
    out.busy.push_back(r.busy_s[static_cast<std::size_t>(prog.compute_queue(s))]);
    out.peak.push_back(r.memory[static_cast<std::size_t>(s)].hbm_peak_bytes);
  }
  return out;
}

// Each (micro-batch, chunk) runs each pass exactly once on its stage.
void check_complete(const Table& t, int p, int v, int m, bool split) {
  REQUIRE(t.size() == static_cast<std::size_t>(p));
  for (const auto& stage : t) {
    std::map<std::tuple<int, int, char>, int> seen;
    for (const auto& task : stage) ++seen[{task.microbatch, task.chunk, static_cast<char>(task.pass)}];
    CHECK(seen.size() == static_cast<std::size_t>(m * v * (split ? 3 : 2)));
    for (auto& [k, n] : seen) CHECK(n == 1);
  }
}

// Llama 3.1 8B's layers with a 256-token vocabulary, so that the embedding and the head are a rounding
// error and every stage does the same work.
std::string equal_stage_model() {
  auto path = test::temp_dir() / "llama8b-small-vocab.json";
  test::write(path, R"({"id": "llama8b-small-vocab", "name": "Llama 3.1 8B layers, tiny vocabulary", "architecture": "llama",
    "source": "test", "num_layers": 32, "d_model": 4096, "num_query_heads": 32, "num_kv_heads": 8, "head_dim": 128,
    "mlp_dim": 14336, "vocab_size": 256})");
  return path.string();
}

RunConfig llama8b_pipeline(std::int64_t pp, const char* schedule, std::int64_t microbatches) {
  RunConfig c;
  c.system = "gb200-nvl72";
  c.model = equal_stage_model();
  c.gpus = pp;  // no other axis: only the pipeline's sends leave a device
  c.pp = pp;
  c.pp_schedule = schedule;
  c.microbatches = microbatches;
  c.seq = 8192;
  c.batch = static_cast<double>(4 * microbatches) / static_cast<double>(pp);  // 4 sequences per micro-batch
  return c;
}


// No stage of `faster` (the same run on better hardware) peaks above the same stage of `base`.
void check_no_stage_peaks_higher(const StepReport& base, const StepReport& faster) {
  REQUIRE(faster.step_time_s < base.step_time_s);
  REQUIRE(faster.stages.size() == base.stages.size());
  for (std::size_t s = 0; s < base.stages.size(); ++s) {
    INFO("stage " << s);
    CHECK(faster.stages[s].hbm_peak_bytes <= base.stages[s].hbm_peak_bytes * (1 + 1e-12));
  }
}

}  // namespace

TEST_CASE("pipeline tables run every pass once, 1F1B warms up p-s-1 forwards", "[pipeline]") {
  check_complete(pipeline_schedule(PipelineSchedule::gpipe, 4, 1, 8), 4, 1, 8, false);
  check_complete(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 1, 8), 4, 1, 8, false);
  check_complete(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 2, 8), 4, 2, 8, false);
  check_complete(pipeline_schedule(PipelineSchedule::zero_bubble_h1, 4, 1, 8), 4, 1, 8, true);
  const auto t = pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 1, 8);
  for (int s = 0; s < 4; ++s) {
    int warmup = 0;
    while (t[static_cast<std::size_t>(s)][static_cast<std::size_t>(warmup)].pass == Pass::forward) ++warmup;
    CHECK(warmup == (4 - s - 1) + 1);  // the warm-up forwards, then the steady state's first forward
  }
  // ZB-H1: a weight pass only after its backward, and never more than p micro-batches in flight.
  for (const auto& stage : pipeline_schedule(PipelineSchedule::zero_bubble_h1, 4, 1, 8)) {
    int fwd = 0, wgt = 0, in_flight = 0, bwd_done = 0;
    for (const auto& task : stage) {
      if (task.pass == Pass::forward) ++fwd;
      if (task.pass == Pass::backward) ++bwd_done;
      if (task.pass == Pass::weight_grad) {
        CHECK(task.microbatch < bwd_done);
        ++wgt;
      }
      in_flight = std::max(in_flight, fwd - wgt);
    }
    CHECK(in_flight <= 4);
  }
}

TEST_CASE("bubbles on equal stages without communication match the schedule formulas", "[pipeline]") {
  // p = 4 stages, m = 8 micro-batches, forward 1, backward 2. GPipe and 1F1B: the bubble is (p-1)/(m+p-1)
  // of the step (each stage idles (p-1)(F+B)); interleaved with v = 2 chunks per stage: (p-1)/(v m+p-1).
  const int p = 4, m = 8;
  for (auto s : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    INFO(to_string(s));
    auto r = run_table(pipeline_schedule(s, p, 1, m), p, 1, 1, 2, 0);
    for (int st = 0; st < p; ++st) CHECK((r.step - r.busy[st]) / r.step == Approx(3.0 / 11.0).epsilon(1e-12));
  }
  auto r = run_table(pipeline_schedule(PipelineSchedule::one_f_one_b, p, 2, m), p, 2, 1, 2, 0);
  for (int st = 0; st < p; ++st) CHECK((r.step - r.busy[st]) / r.step == Approx(3.0 / 19.0).epsilon(1e-12));
  // ZB-H1 with F = B = W = 1: the bubble is (p-1)(F+B-W) = p-1 out of 3m + p - 1; 1F1B's is 3(p-1).
  r = run_table(pipeline_schedule(PipelineSchedule::zero_bubble_h1, p, 1, m), p, 1, 1, 1, 1);
  CHECK(r.step == Approx(3 * m + p - 1));
  r = run_table(pipeline_schedule(PipelineSchedule::zero_bubble_h1, p, 1, m), p, 1, 1, 1.3, 0.7);
  CHECK(r.step - 3 * m == Approx((p - 1) * (1 + 1.3 - 0.7)));
}

TEST_CASE("1F1B's first stage holds p micro-batches of activations, GPipe's holds m", "[pipeline]") {
  const int p = 4, m = 8;
  auto one = run_table(pipeline_schedule(PipelineSchedule::one_f_one_b, p, 1, m), p, 1, 1, 2, 0);
  auto all = run_table(pipeline_schedule(PipelineSchedule::gpipe, p, 1, m), p, 1, 1, 2, 0);
  for (int s = 0; s < p; ++s) {
    CHECK(one.peak[s] == p - s);  // stage s: its warm-up forwards and one more
    CHECK(all.peak[s] == m);
  }
  // Zero-bubble H1 holds p on every stage (the weight passes keep theirs until they run).
  auto zb = run_table(pipeline_schedule(PipelineSchedule::zero_bubble_h1, p, 1, m), p, 1, 1, 1, 1);
  for (int s = 0; s < p; ++s) CHECK(zb.peak[s] == p);
}

TEST_CASE("more micro-batches never raise a schedule's bubble fraction", "[pipeline][invariants]") {
  const int p = 4;
  for (auto [s, v] : {std::pair{PipelineSchedule::gpipe, 1}, {PipelineSchedule::one_f_one_b, 1},
                      {PipelineSchedule::one_f_one_b, 2}, {PipelineSchedule::zero_bubble_h1, 1}}) {
    double prev = 1;
    for (int m = p; m <= 6 * p; m += p) {
      auto r = run_table(pipeline_schedule(s, p, v, m), p, v, 1, 1.7, s == PipelineSchedule::zero_bubble_h1 ? 0.6 : 0);
      const double bubble = (r.step - r.busy[0]) / r.step;
      CHECK(bubble <= prev + 1e-12);
      prev = bubble;
    }
  }
}

TEST_CASE("simulated stages of Llama 8B show the 1F1B and GPipe bubble and send the activation bytes", "[pipeline]") {
  // 4 GB200s, one stage each (8 layers), 8 micro-batches of 4 x 8192 tokens: a stage's pass is ~0.1 s of
  // compute, a send 4 x 8192 x 4096 x 2 B = 256 MiB over NVLink (~0.3 ms), so communication is ~0.3% and,
  // with the tiny vocabulary, the stages are equal: the bubble is the formula's (p-1)/(m+p-1) = 3/11 of the
  // step (within what the optimizer update at the end moves, ~1%).
  const double act = 4.0 * 8192 * 4096 * 2;
  for (const char* schedule : {"1f1b", "gpipe"}) {
    INFO(schedule);
    auto r = run_simulation(llama8b_pipeline(4, schedule, 8));
    REQUIRE(r.stages.size() == 4);
    for (const auto& st : r.stages) {
      CHECK(st.bubble_s / r.step_time_s == Approx(3.0 / 11.0).epsilon(0.04));
      CHECK(r.step_time_s >= st.compute_busy_s);
    }
    // Forward sends leave stages 0-2, gradient sends stages 1-3: 8 micro-batches each way.
    CHECK(r.stages[0].comm_bytes.at("pp") == Approx(8 * act));
    CHECK(r.stages[1].comm_bytes.at("pp") == Approx(16 * act));
    CHECK(r.stages[3].comm_bytes.at("pp") == Approx(8 * act));
    CHECK(r.mfu <= 1);
    CHECK(r.executed_flops_per_device >= r.model_flops_per_device);
  }
  // The first stage keeps up to p micro-batches' layer inputs with 1F1B and all m with GPipe (full remat
  // saves each layer's input: 8 layers x 256 MiB per micro-batch).
  auto one = run_simulation(llama8b_pipeline(4, "1f1b", 8)), all = run_simulation(llama8b_pipeline(4, "gpipe", 8));
  CHECK(one.stages[0].hbm_breakdown_bytes.at("saved_activations") <= 4 * 8 * act * 1.0001);
  CHECK(all.stages[0].hbm_breakdown_bytes.at("saved_activations") >= 7 * 8 * act);
}

TEST_CASE("a pipeline send waits for the receiver to post its receive, one pass ahead", "[pipeline]") {
  // 1F1B over 4 equal stages, 8 micro-batches. Stage 0 warms up with F0-F2 and runs F3 straight after, so its
  // F3 is done after about 4 forwards. Stage 1's table is F0 F1 | F2 B0 F3 B1 ...: it posts F3's receive when
  // it starts B0, which waits for micro-batch 0's gradient to come back from stages 3 and 2 (about 4 forwards
  // and 2 backwards in). NCCL moves nothing before the receive is posted, so the send starts then, not when
  // stage 0 is done; stage 0's pipeline queue is idle by then, so exactly then.
  const test::NamedRun run = test::named_run(llama8b_pipeline(4, "1f1b", 8));
  const auto& [p, names, r] = run;
  const auto send = run.op("send activations mb3", 0), posted = run.op("recv gradients mb0", 1);
  const auto f3_done = static_cast<std::size_t>(p.ops[send].deps[0]);  // F3's last layer on stage 0
  REQUIRE(p.queues[static_cast<std::size_t>(p.ops[f3_done].queue)].device == 0);
  CHECK(r.start_s[send] == Approx(r.start_s[posted]).epsilon(1e-9));
  CHECK(r.start_s[posted] > r.end_s[f3_done] * 1.5);  // the receiver was well behind: the old rule would have sent at F3's end
  // Every send starts only once its receiver has posted, and the receive waits for the send.
  for (std::size_t i = 0; i < p.ops.size(); ++i)
    if (names[i].rfind("recv ", 0) == 0 || names[i].rfind("send ", 0) == 0)
      for (int d : p.ops[i].deps) CHECK(r.end_s[static_cast<std::size_t>(d)] <= r.start_s[i] + 1e-12);
}

TEST_CASE("with overlapped sends a stage waits for its last send before its next pass the same way", "[pipeline]") {
  // GPipe over 2 equal stages, 2 micro-batches, each stage an 8-GPU H100 node (tp 8, sequence parallel), the
  // nodes joined by a 0.1 GB/s NIC (a 32 MiB send takes ~0.3 s, longer than a pass): stage 1 posts its first
  // receive at the step's start, so act0's send starts when F0 ends, at f, and ends at f + s. Megatron waits
  // for a step's p2p handles before its next forward step and XLA for the collective-permute before the next
  // loop iteration, so stage 0's F1 starts at f + s, not at f. Under XLA the sent buffer lives until that wait
  // (its live range ends at the permute's done); under PyTorch until the send ends (the NCCL stream holds it).
  RunConfig c = llama8b_pipeline(2, "gpipe", 2);
  c.system = "h100-hgx";
  c.gpus = 16;
  c.tp = 8;
  c.batch = 0.5;  // 4 sequences per micro-batch, as before
  c.scale_out_bytes_per_s = 0.1e9;
  const test::NamedRun run = test::named_run(c);
  const auto send0 = run.op("send activations mb0", 0), wait0 = run.op("wait send activations mb0", 0);
  const auto& deps = run.p.ops[wait0].deps;
  REQUIRE(std::find(deps.begin(), deps.end(), static_cast<int>(send0)) != deps.end());
  const double f = run.r.start_s[send0], s = run.r.end_s[send0] - run.r.start_s[send0];
  REQUIRE(s > f);  // the send outlasts a pass: the wait shows
  CHECK(run.r.start_s[wait0] == Approx(f + s).epsilon(1e-12));
  // F1's first op (the next on the compute stream after the wait) starts there too.
  double f1_start = -1;
  for (std::size_t i = wait0 + 1; i < run.p.ops.size() && f1_start < 0; ++i)
    if (run.p.ops[i].queue == run.p.ops[wait0].queue && run.p.ops[i].seconds > 0) f1_start = run.r.start_s[i];
  CHECK(f1_start == Approx(f + s).epsilon(1e-12));
  REQUIRE(run.p.ops[wait0].releases.size() == 1);  // XLA: the wait frees what was sent
  CHECK(run.p.ops[send0].releases.empty());
  CHECK(run.r.buffer_free_s[static_cast<std::size_t>(run.p.ops[wait0].releases[0])] == Approx(f + s).epsilon(1e-12));
  // Megatron's interleaved schedule overlaps its sends too; the send frees the buffer.
  c = llama8b_pipeline(2, "1f1b", 4);
  c.framework = "megatron";
  c.vp = 2;
  const test::NamedRun mega = test::named_run(c);
  int waits = 0;
  for (std::size_t i = 0; i < mega.p.ops.size(); ++i) {
    if (mega.names[i].rfind("send ", 0) == 0) CHECK(mega.p.ops[i].releases.size() == 1);
    if (mega.names[i].rfind("wait send", 0) == 0) {
      ++waits;
      CHECK(mega.p.ops[i].releases.empty());
      for (int d : mega.p.ops[i].deps) CHECK(mega.r.start_s[i] >= mega.r.end_s[static_cast<std::size_t>(d)] - 1e-12);
    }
  }
  CHECK(waits > 0);
}

TEST_CASE("with overlapped sends a faster GPU holds the same sent buffers at a stage's peak", "[pipeline]") {
  // A stress draw (seed 94, --squeeze --pipelines): Llama 3.1 8B on 32 B300s, tp 8 x pp 4, 1F1B, 8 micro-batches
  // of 8 x 2048 tokens, `minimal`. Stage 0's peak is in a backward that follows the forward of micro-batch 4;
  // its output (8 x 2048 x 4096 x 2 B = 128 MiB) was freed when its send ended, which on a GPU twice as fast
  // had not happened yet (25.46 GiB against 25.34 without LHS: twice the GPU no longer fit). Freed where the
  // stage waits for the send (before its next forward), the peak holds it on both. (The draw ran under LHS;
  // there, since collectives' outputs come alive where they are issued, the faster GPU's list schedule of a
  // backward layer holds 16 MiB more at the peak: the LHS-order class of notes/monotonicity.md, not this one.)
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-8b", "system": "b300-hgx", "gpus": 32, "tp": 8, "pp": 4,
      "microbatches": 8, "batch": 2, "seq": 2048, "policy": "minimal", "weights": "fp8", "mesh_order": "megatron",
      "sequence_parallel": false, "tp_comm_overlap": true, "sharded_optimizer": true, "dp_overlap": false,
      "double_buffering": true, "lhs": false, "calibration": "gb200-fitted"})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const auto base = run_simulation(c);
  REQUIRE(base.stages.size() == 4);
  check_no_stage_peaks_higher(base, run_simulation(test::on_faster_gpu(c, prepare_run(c).system)));
}

TEST_CASE("a forward pass that sends on closes on the compute stream after its copies as the head's does", "[pipeline]") {
  // A stress draw (seed 97, --squeeze --pipelines): Llama 3.1 70B on 128 VR NVL144s, tp 4 x cp 2 x pp 2 x vp 2,
  // `minimal_offloaded` without LHS (each D2H runs up to the loop body's end). The copies of a chunk that sends
  // on were waited for only by its send, so stage 0's next pass started while they ran: at its peak (the next
  // backward starting) two of layer 59's four D2H copies were still in flight on the base network and all four
  // on twice the network (26.14 against 26.36 GiB: twice the network no longer fit). A scan's async copies end
  // inside the loop: the pass now closes with a compute op that waits for them, as the head's final norm does,
  // and the peak holds the same buffers on both.
  const auto doc = test::on_vr_as_drawn(R"({"model": "llama3.1-70b", "gpus": 128, "tp": 4, "cp": 2,
      "pp": 2, "vp": 2, "microbatches": 4, "batch": 2, "seq": 2048, "policy": "minimal_offloaded", "recompute_layers": 1,
      "weights": "fp8", "optimizer_moments_dtype": "bf16", "sequence_parallel": false, "tp_comm_overlap": true,
      "cp_shards_weights": true, "lhs": false, "pipelined_transfers": false, "calibration": "gb200-fitted"})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const auto base = run_simulation(c);
  REQUIRE(base.stages.size() == 2);
  check_no_stage_peaks_higher(base, run_simulation(test::on_faster_network(c, prepare_run(c).system)));
  // Every D2H of a chunk that sends on is waited for by a compute op before the send.
  const test::NamedRun run = test::named_run(c);
  int closes = 0;
  for (std::size_t i = 0; i < run.p.ops.size(); ++i) {
    if (run.names[i].rfind("forward done", 0) != 0) continue;
    ++closes;
    CHECK(run.p.queues[static_cast<std::size_t>(run.p.ops[i].queue)].compute);
    for (int d : run.p.ops[i].deps) CHECK(run.r.start_s[i] >= run.r.end_s[static_cast<std::size_t>(d)] - 1e-12);
  }
  CHECK(closes > 0);
  for (std::size_t i = 0; i < run.p.ops.size(); ++i) {
    if (run.names[i].rfind("d2h ", 0) != 0) continue;
    bool waited = false;
    for (std::size_t j = 0; j < run.p.ops.size() && !waited; ++j) {
      const auto& deps = run.p.ops[j].deps;
      waited = run.p.queues[static_cast<std::size_t>(run.p.ops[j].queue)].compute &&
               std::find(deps.begin(), deps.end(), static_cast<int>(i)) != deps.end();
    }
    INFO(run.names[i]);
    CHECK(waited);
  }
}

TEST_CASE("blocking pipeline sends cost one more send per 1F1B pair of stages, by hand", "[pipeline]") {
  // pp 2, 1F1B, 2 micro-batches: stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1. Stage 0's passes take f0 and
  // b0, stage 1's f1 and b1 (with the head), a send s (either way: the same bytes). Overlapped, stage 0's B1
  // starts when grad1 lands: stage 1 runs F1 once grad0 is sent and act1 has landed, which with b1 >= s is
  // at f0 + s + f1 + b1, so B1 ends at f0 + 2s + 2f1 + 2b1 + b0. Blocking, stage 0 waits for act0's send
  // before F1 (f0 + s), act1's send waits for stage 1's B0 to finish (f0 + s + f1 + b1) and lands s later,
  // so grad1 lands at f0 + 3s + 2f1 + 2b1: one s later. Stage 0 ends the step either way (its B1 and
  // optimizer after stage 1's last send), so the step is longer by exactly one send.
  RunConfig c = llama8b_pipeline(2, "1f1b", 2);
  auto step = [&](const char* p2p, double* send_s) {
    c.pp_p2p = p2p;
    const test::NamedRun run = test::named_run(c);
    const auto& [p, names, r] = run;
    for (std::size_t i = 0; i < p.ops.size(); ++i) {
      if (names[i] == "send gradients mb1") *send_s = r.end_s[i] - r.start_s[i];
      // Blocking: a stage's compute goes on only once its send is done.
      if (names[i].rfind("wait send", 0) == 0) CHECK(r.start_s[i] >= r.end_s[static_cast<std::size_t>(p.ops[i].deps[0])] - 1e-12);
    }
    return r.end_time_s;
  };
  double s = 0, s_blocking = 0;
  const double overlapped = step("overlapped", &s);
  const double blocking = step("blocking", &s_blocking);
  REQUIRE(s > 0);
  CHECK(s_blocking == Approx(s).epsilon(1e-12));
  CHECK(blocking - overlapped == Approx(s).epsilon(1e-6));
  // pp 4: stage 1 warms up with F0 and F1, and receives F1's input in a call of its own after F0's send
  // (send_forward, then recv_forward), so stage 0's send of micro-batch 1 starts when stage 1's send of
  // micro-batch 0 ends. Stage 0 is ready one send earlier (its F1 ends at 2 f0 + s, where stage 1's send
  // of micro-batch 0 ends at f0 + s + f1 + s, with f1 >= f0).
  c = llama8b_pipeline(4, "1f1b", 4);
  c.pp_p2p = "blocking";
  {
    const test::NamedRun run = test::named_run(c);
    const auto send1 = run.op("send activations mb1", 0), stage1_send0 = run.op("send activations mb0", 1);
    const auto f1_done = static_cast<std::size_t>(run.p.ops[send1].deps[0]);
    CHECK(run.r.start_s[send1] == Approx(run.r.end_s[stage1_send0]).epsilon(1e-12));
    CHECK(run.r.end_s[f1_done] < run.r.end_s[stage1_send0] - s / 2);
  }
  // Megatron's plain 1F1B has no overlapped sends, and its interleaved one does by default.
  c.framework = "megatron";
  c.pp_p2p = "auto";
  CHECK(prepare_run(c).options.blocking_p2p);
  c.pp_p2p = "overlapped";
  CHECK_THROWS_WITH(prepare_run(c), Catch::Contains("pp_p2p = \"overlapped\" (Megatron overlaps pipeline sends only in its interleaved"));
  c.pp_p2p = "auto";
  c.vp = 2;
  c.microbatches = 4;
  CHECK_FALSE(prepare_run(c).options.blocking_p2p);
}

TEST_CASE("sequence parallelism divides the pipeline's sends by tp, model FLOPs do not depend on pp", "[pipeline]") {
  RunConfig c = llama8b_pipeline(2, "1f1b", 4);
  const double model_flops = run_simulation(c).model_flops_per_device;
  c.gpus = 8;
  c.tp = 4;
  c.batch = c.batch.value() / 4;  // the same sequences per micro-batch
  auto r = run_simulation(c);
  CHECK(r.stages[0].comm_bytes.at("pp") == Approx(4 * 4.0 * 8192 * 4096 * 2 / 4));
  CHECK(r.model_flops_per_device == Approx(model_flops / 4));  // 4x the devices for the same tokens
  // pp = 1 with the same per-device batch: the same model FLOPs per device as the 2-stage pipeline.
  RunConfig single = llama8b_pipeline(2, "1f1b", 4);
  single.pp = 1;
  single.microbatches = 0;
  single.gpus = 2;
  CHECK(run_simulation(single).model_flops_per_device == Approx(model_flops));
}

TEST_CASE("a stage's HBM peak holds its weights, optimizer state and one micro-batch's saved inputs", "[pipeline][invariants]") {
  for (const char* schedule : {"1f1b", "gpipe", "zb-h1"}) {
    INFO(schedule);
    RunConfig c = llama8b_pipeline(4, schedule, 4);
    auto prepared = prepare_run(c);
    auto r = run_simulation(c);
    for (std::size_t s = 0; s < r.stages.size(); ++s) {
      const auto& info = prepared.graph.stages[s];
      const double one_microbatch = 8 * 4.0 * 8192 * 4096 * 2;  // 8 layer inputs
      CHECK(r.stages[s].hbm_peak_bytes >= info.parameter_bytes + info.optimizer_bytes + one_microbatch);
    }
  }
}

TEST_CASE("the layer split follows the uneven options and names the field it cannot meet", "[pipeline][errors]") {
  ModelSpec m;
  m.num_layers = 126;
  Parallelism p;
  p.pp = 8;
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("pp = 8 (num_layers = 126 is not divisible by pp x vp = 8"));
  // The error names the switches that would even it out: 126 + 2 = 128 = 16 x 8; 127 would not, so not one alone.
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("embedding_as_layer and loss_as_layer on would make it 128"));
  m.num_layers = 127;  // 127 + 1 = 128
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("embedding_as_layer or loss_as_layer on would make it 128"));
  m.num_layers = 125;  // neither 126 nor 127 divides by 8: the general hint
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("give first_stage_layers/last_stage_layers or count the embedding"));
  m.num_layers = 126;
  p.split.embedding_as_layer = p.split.loss_as_layer = true;  // 128 units: 15 + 16 x 6 + 15
  auto chunks = pipeline_chunks(m, p);
  CHECK(chunks.front().layers() == 15);
  CHECK(chunks[1].layers() == 16);
  CHECK(chunks.back().layers() == 15);
  CHECK(chunks.back().end_layer == 126);
  p.vp = 4;  // 128 / 32 = 4 per chunk; chunk k on stage k % 8
  chunks = pipeline_chunks(m, p);
  CHECK(chunks.size() == 32);
  CHECK(chunks[9].stage == 1);
  CHECK(chunks.front().layers() == 3);
  p = Parallelism{};
  p.pp = 4;
  m.num_layers = 61;  // DeepSeek-V3: 16 on the first stage, 15 on each of the others
  p.split.first_stage_layers = 16;
  chunks = pipeline_chunks(m, p);
  CHECK(chunks[0].layers() == 16);
  CHECK(chunks[3].layers() == 15);
  p.split.first_stage_layers = 17;
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("first_stage_layers = 17 (the other 3 stages cannot split the remaining 44"));
}

TEST_CASE("a policy per stage applies to its stage only, and best-policy searches one per stage", "[pipeline][plan]") {
  // Llama 3.1 8B layers over 4 stages: only stage 0 offloads its QKV projections, so only its device holds
  // pinned host memory: 8 layers x (q 4 x 8192 x 4096 + k, v 4 x 8192 x 1024 each) x 2 B per micro-batch in
  // flight (1F1B: 4 on stage 0; with LHS the copies of the first are back on device before the last is).
  RunConfig c = llama8b_pipeline(4, "1f1b", 8);
  c.stage_policies = "qkv_proj_offloaded,full,full,full";
  auto r = run_simulation(c);
  CHECK(r.policy == "qkv_proj_offloaded/full/full/full");
  CHECK(r.stages[0].host_peak_bytes > 0);
  const double per_microbatch = 8 * (4.0 * 8192 * 4096 + 2 * 4.0 * 8192 * 1024) * 2;
  CHECK(r.stages[0].host_peak_bytes <= 4 * per_microbatch * 1.0001);
  CHECK(r.stages[0].host_peak_bytes >= per_microbatch);
  for (int s = 1; s < 4; ++s) CHECK(r.stages[static_cast<std::size_t>(s)].host_peak_bytes == 0);
  c.stage_policies = "qkv_proj_offloaded, full, full , full";  // spaces, as written by hand: the same run
  const auto spaced = run_simulation(c);
  CHECK(spaced.policy == r.policy);
  CHECK(spaced.step_time_s == r.step_time_s);
  c.stage_policies = "full,full";
  CHECK_THROWS_WITH(run_simulation(c), Catch::Contains("stage_policies = \"full,full\" (2 policies for pp = 4 stages)"));
  // The search returns the best of the uniform placements and the per-stage presets: never worse than any
  // of the three uniform placements of query_proj, simulated here directly (remat, device, offload).
  c.stage_policies.clear();
  c.seq = 4096;
  auto search = best_policy(c, {"query_proj"}, 2);
  REQUIRE(search.found);
  CHECK(search.method.find("per pipeline stage") != std::string::npos);
  int uniform_fitting = 0;
  for (const char* place : {"remat", "device", "offload"}) {
    RunConfig u = c;
    u.policy = "custom";
    u.tensors.clear();
    if (std::string(place) != "remat") u.tensors["query_proj"] = place;
    auto r = run_simulation(u);
    INFO(place);
    if (!r.fits) continue;
    ++uniform_fitting;
    CHECK(search.best.report.tflops_per_device >= r.tflops_per_device * (1 - 1e-12));
  }
  CHECK(uniform_fitting > 0);
  // And its answer is what its config simulates to.
  auto best_again = run_simulation(search.best.config);
  CHECK(best_again.fits);
  CHECK(best_again.tflops_per_device == Approx(search.best.report.tflops_per_device).epsilon(1e-12));
}

TEST_CASE("under Megatron the per-stage search tries Megatron's recompute choices, one on every stage said plainly",
          "[pipeline][plan]") {
  RunConfig c = llama8b_pipeline(4, "1f1b", 8);
  c.framework = "megatron";
  c.seq = 4096;
  auto search = best_policy(c, {"query_proj"}, 2);
  REQUIRE(search.found);
  const std::vector<std::string> megatron = {"no_recompute", "selective", "full"};
  int uniform_presets = 0;
  for (const auto& e : search.evaluated) {
    if (e.config.policy == "custom") continue;  // the per-tensor part of the search
    INFO(e.config.policy << " / " << e.config.stage_policies);
    CHECK(std::find(megatron.begin(), megatron.end(), e.config.policy) != megatron.end());
    if (e.config.stage_policies.empty()) {
      ++uniform_presets;
      CHECK(placement_label(e.config) == e.config.policy);  // no_recompute had read "all remat"
      continue;
    }
    // A stage list names at least two different presets, all Megatron's.
    std::vector<std::string> stages;
    std::string rest = e.config.stage_policies;
    for (auto at = rest.find(','); ; at = rest.find(',')) {
      stages.push_back(rest.substr(0, at));
      if (at == std::string::npos) break;
      rest = rest.substr(at + 1);
    }
    CHECK(stages.size() == 4);
    for (auto& st : stages) CHECK(std::find(megatron.begin(), megatron.end(), st) != megatron.end());
    CHECK(std::adjacent_find(stages.begin(), stages.end(), std::not_equal_to<>()) != stages.end());
    CHECK_THAT(megatron_settings(e.config), Catch::Contains("Megatron recomputes alike on every stage"));
  }
  CHECK(uniform_presets >= 1);  // the descent's start: the base preset on every stage
}

TEST_CASE("keeping FSDP-gathered weights for the step trades memory for gather traffic", "[pipeline]") {
  // Llama 8B over 2 stages x FSDP 4, 4 micro-batches: resharding gathers each layer's weights for every
  // micro-batch's forward and backward (8 gathers per layer); keeping them gathers once (1 per layer).
  RunConfig c = llama8b_pipeline(2, "1f1b", 4);
  c.gpus = 8;
  c.batch = c.batch.value() / 4;
  auto reshard = run_simulation(c);
  c.reshard_weights = false;
  auto keep = run_simulation(c);
  CHECK(keep.comm_bytes.at("fsdp") < reshard.comm_bytes.at("fsdp"));
  // All of a stage's 16 layers gathered at once: 16 x 218.1 M weights x 2 B (bf16) each. Resharding holds a
  // few: the two gathers a forward pass issues ahead and the two a backward pass does (their buffers live from
  // where they are issued).
  const double layer_bytes = 218.112e6 * 2;
  CHECK(keep.stages[0].hbm_breakdown_bytes.at("gathered_weights") >= 15 * layer_bytes);
  CHECK(reshard.stages[0].hbm_breakdown_bytes.at("gathered_weights") < 5 * layer_bytes);
}

TEST_CASE("a weight pass's gradients wait for their reduce-scatter at a program point, not for the network", "[pipeline]") {
  // A stress draw (seed 53): Llama 3.1 8B on 64 B200 HGX, pp 2 x fsdp 32 (the scatters cross InfiniBand), ZB-H1,
  // weights kept gathered. Each weight pass makes a layer's unsharded fp32 gradients (218.112 M x 4 B) and
  // reduce-scatters them; the weight op two layers on (in the pass, or the stage's next one) waits for that
  // scatter and frees its input, so while a weight op runs its own layer's gradients and two before it are
  // live, beside the stage's table bucket (128,256 x 4,096 x 4 B: the embedding's on stage 0, the head's on 1).
  // Freed where each transfer ended, the cool-down's weight passes ran ahead of the scatters: 24.7 GiB of
  // gradients piled up with 2 micro-batches and 24.4 GiB with 4, so twice the work peaked lower.
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-8b", "system": "b200-hgx", "gpus": 64, "pp": 2,
      "pp_schedule": "zb-h1", "microbatches": 2, "batch": 1, "seq": 1024, "reshard_weights": false,
      "framework": "megatron", "mesh_order": "megatron", "policy": "selective", "weights": "mxfp8",
      "dp_overlap": false, "tp_comm_overlap": true, "lhs": true})");
  RunConfig c = RunConfig::from_json(doc, "test");
  const double bound = 3 * 218.112e6 * 4 + 128256.0 * 4096 * 4;
  const auto base = run_simulation(c);
  c.microbatches = 4;
  c.batch = 2;
  const auto twice = run_simulation(c);
  for (const auto* r : {&base, &twice})
    for (const auto& st : r->stages) {
      INFO("stage " << st.stage << ", " << r->stages.size() << " stages");
      CHECK(st.hbm_breakdown_bytes.at("collective_buffers") <= bound * (1 + 1e-9));
    }
  CHECK(twice.hbm_peak_bytes >= base.hbm_peak_bytes);
}

TEST_CASE("a stage without the embedding frees its last layers' gradients at its next pass, not when the network is done", "[pipeline]") {
  // A stress draw (seed 67): Llama 3.1 405B on 128 VR NVL144, pp 4 x cp 2 x fsdp 16, GPipe, weights kept gathered.
  // A backward pass's layers each wait for the reduce-scatter of the layer two on and free its unsharded fp32
  // gradients; the pass's last two were freed only when their scatters ended, so on a GPU twice as fast the next
  // backward passes ran ahead of them and the last stage's peak rose from 276.0 to 287.7 GiB of 277.5. Carried
  // to the stage's next pass, they leave at most three layers' gradients (3,187,703,808 parameters a layer: q and
  // o 16384^2, k and v 16384 x 1024, the MLP 3 x 16384 x 53248, two norms of 16384; 4 bytes each) beside the
  // head's bucket (its 128,256 x 16,384 table and the final norm's 16,384, 4 bytes each) live, however fast the GPU.
  const auto doc = test::on_vr_as_drawn(R"({"model": "llama3.1-405b", "gpus": 128, "pp": 4, "cp": 2,
      "cp_exchange": "all_gather", "cp_shards_weights": true, "pp_schedule": "gpipe", "microbatches": 8, "batch": 2, "seq": 2048,
      "reshard_weights": false, "framework": "megatron", "mesh_order": "maxtext", "policy": "save_qkv_proj",
      "weights": "mxfp8", "lhs": false, "dp_overlap": false, "tp_comm_overlap": true, "double_buffering": true,
      "pipelined_transfers": true, "embedding_as_layer": true, "loss_as_layer": true, "calibration": "gb200-fitted"})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const double bound = 3 * 3187703808.0 * 4 + (128256.0 * 16384 + 16384) * 4;
  const auto base = run_simulation(c);
  const auto fast = test::run_on_faster_gpu(c);
  CHECK(fast.step_time_s < base.step_time_s);
  for (const auto* r : {&base, &fast})
    for (const auto& st : r->stages) {
      INFO("stage " << st.stage);
      CHECK(st.hbm_breakdown_bytes.at("collective_buffers") <= bound * (1 + 1e-9));
    }
  CHECK(base.fits);
  CHECK(fast.fits);
}

TEST_CASE("the head's gradient bucket is freed where the stage's next pass waits for its scatter, not when the network is done", "[pipeline]") {
  // A stress draw (seed 86, --squeeze): Llama 3.1 8B on 64 B200 HGX, pp 2 ZB-H1 x fsdp 32, 4 micro-batches,
  // weights kept gathered. The last stage's backward takes the head's unsharded table gradient (128,256 x 4,096
  // in fp32) and reduce-scatters it after the layers' scatters; the bucket was freed when that transfer ended,
  // so whether it was still live in the next backward pass depended on the GPU's speed against the network's:
  // the stage peaked at 43.7 GiB, and at 44.4 on a GPU twice as fast. Carried to the stage's next pass like the
  // layers' last scatters, it is live there whatever the speeds, and the peak is the program's.
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-8b", "system": "b200-hgx", "gpus": 64, "pp": 2,
      "pp_schedule": "zb-h1", "microbatches": 4, "batch": 4, "seq": 4096, "framework": "megatron", "mesh_order": "megatron",
      "policy": "minimal_with_context", "weights": "fp8", "optimizer_moments_dtype": "bf16", "optimizer_offload": "host",
      "reshard_weights": false, "dp_overlap": false, "sequence_parallel": true, "tp_comm_overlap": true,
      "pipelined_transfers": true, "calibration": "gb200-fitted"})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const auto base = run_simulation(c);
  const auto fast = test::run_on_faster_gpu(c);
  CHECK(fast.step_time_s < base.step_time_s);
  REQUIRE(base.stages.size() == 2);
  CHECK(fast.stages[1].hbm_peak_bytes == Approx(base.stages[1].hbm_peak_bytes).epsilon(1e-9));
}

TEST_CASE("the embedding's gradient bucket is freed where the backward's end waits for its scatter, not when the network is done", "[pipeline]") {
  // A stress draw (seed 287, --squeeze, GLM-4.5-Air): 256 VR NVL144, pp 8 (11 layers first) x cp 2 x ep 8, 16
  // micro-batches, weights kept gathered. The first stage's backward ends with the embedding's unsharded table
  // gradient (151,552 x 4,096 in fp32, 2.3 GiB) and its reduce-scatter; the bucket was freed when that transfer
  // ended, so whether the next backward's first layers had their gradients live beside it depended on the GPU's
  // speed against the network's: stage 0 peaked at 32.26 GiB, and at 33.48 on a GPU twice as fast. Freed where the
  // backward's end waits for the scatter (Megatron-FSDP's root post-backward hook waits for every reduce-scatter),
  // it is gone before the next pass whatever the speeds.
  auto doc = nlohmann::json::parse(R"({"model": "hf/glm-4.5-air.config.json", "gpus": 256, "pp": 8, "cp": 2,
      "cp_exchange": "all_gather", "ep": 8, "ep_shards_weights": true, "first_stage_layers": 11, "microbatches": 16,
      "batch": 2, "seq": 1024, "policy": "selective", "tensors": {"attn_norm": "remat", "moe_dispatched": "remat",
      "moe_mlp_act": "remat", "moe_returned": "remat"}, "reshard_weights": false, "pp_p2p": "blocking", "dp_overlap": false,
      "weights": "mxfp8", "optimizer_moments_dtype": "bf16", "tp_comm_overlap": true, "moe_dispatcher": "flex",
      "pipelined_transfers": true, "calibration": "gb200-fitted"})");
  doc["system"] = std::string(HBMSIM_SOURCE_DIR) + "/tests/systems/vr-nvl144-seed287.json";  // Vera Rubin as drawn
  const RunConfig c = RunConfig::from_json(doc, "test");
  const auto base = run_simulation(c);
  const auto fast = test::run_on_faster_gpu(c);
  CHECK(fast.step_time_s < base.step_time_s);
  REQUIRE(base.stages.size() == 8);
  CHECK(fast.stages[0].hbm_peak_bytes <= base.stages[0].hbm_peak_bytes * (1 + 1e-12));
}

TEST_CASE("ZB-H1's weight passes free what they read, whatever the list order of the layer's backward", "[pipeline]") {
  // A stress draw (seed 313, --rare --pipelines --squeeze, draw 268): DeepSeek-V3 on 256 B300s, pp 2 x ep 32,
  // ZB-H1 under LHS, the split given as a Megatron layout. A weight pass runs after its layer's whole backward, but
  // which step last read a tensor was taken from the LHS list order of the layer's backward, which follows the solo
  // durations: where out_proj's weight-gradient step came before the attention's backward, the attention's
  // backward freed the recomputed attention output the weight pass reads later. On this GPU layers 30-60 did so
  // (stage 1 peaked at 150.0 GiB); on one twice as fast the list put it after, and the same buffers lived to
  // their weight passes (153.9 GiB: "a faster GPU no longer fits"). Without LHS the list puts each weight step
  // right after its input-gradient step, so it was always so (Llama 3.1 70B, tp 2 x pp 4: 146.1 GiB, now 151.1).
  // Now every value a weight pass reads that was made again for it (a recompute op's one output) is alive until
  // that pass starts: on both GPUs, and without LHS (on the suite's equal-stage Llama 8B pipeline).
  const auto doc = nlohmann::json::parse(R"({"model": "deepseek-v3-671b", "system": "b300-hgx", "gpus": 256, "pp": 2,
      "ep": 32, "dp": 2, "micro_batch": 2, "global_batch": 1024, "seq": 1024, "mtp_layers": 1, "mesh_order": "megatron",
      "pipeline_layout": "Etttttttttttttttttttttttttttttt|tttttttttttttttttttttttttttttttmL", "pp_schedule": "zb-h1",
      "pp_p2p": "overlapped", "policy": "minimal_offloaded", "stage_policies": "minimal_offloaded,minimal",
      "lhs": true, "pipelined_transfers": true, "pipelined_collectives": false, "double_buffering": true,
      "dp_overlap": false, "tp_comm_overlap": true, "weights": "fp8", "memory_limit_slop": 0.8, "sequence_parallel": true,
      "sharded_optimizer": true, "calibration": "gb200-fitted"})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const auto sys = prepare_run(c).system;
  RunConfig no_lhs = llama8b_pipeline(4, "zb-h1", 8);
  no_lhs.lhs = false;
  for (const RunConfig& run : {c, test::on_faster_gpu(c, sys), no_lhs}) {
    const test::NamedRun n = test::named_run(run);
    int passes = 0, early = 0;
    for (std::size_t w = 0; w < n.p.ops.size(); ++w) {
      if (n.names[w].rfind("weight_grads", 0) != 0) continue;
      ++passes;
      for (int d : n.p.ops[w].deps) {
        const auto& dep = n.p.ops[static_cast<std::size_t>(d)];
        if (dep.phase != 'r' || dep.allocs.size() != 1) continue;  // a value it reads, made again for it
        for (int b : dep.allocs) {
          const double freed = n.r.buffer_free_s[static_cast<std::size_t>(b)];
          if (freed >= 0 && freed < n.r.start_s[w]) {
            ++early;
            UNSCOPED_INFO(n.names[static_cast<std::size_t>(d)] << "'s buffer freed at " << freed << " s, before " << n.names[w] << " at " << n.r.start_s[w] << " s");
          }
        }
      }
    }
    CHECK(passes > 0);
    CHECK(early == 0);
  }
  CHECK(test::run_on_faster_gpu(c).stages[1].hbm_peak_bytes <= run_simulation(c).stages[1].hbm_peak_bytes * (1 + 1e-12));
}

TEST_CASE("a pipeline's first stage gathers each micro-batch's embedding table where its pass begins, not all at the step's start", "[pipeline]") {
  // A stress draw (seed 275, --squeeze): Llama 3.1 8B on 32 B300 HGX, pp 8 x cp 4 with its parameters in host
  // memory and kept gathered, 16 micro-batches. Every micro-batch's embedding gather (and its shard's copy-in) was
  // issued after the table's parameter sync alone, so all 15 later ones were live at the step's start beside the
  // first: stage 0 peaked at 26.8 GiB, and on a GPU twice as fast at 26.83 GiB of 26.83. Issued once the stage's
  // previous pass is done, as a first layer's gather is, the first stage holds at its peak one table (128,256 x
  // 4,096 in bf16) beside its 4 layers' weights, kept gathered (attention's 4,096 x 4,096 x 2 + 4,096 x 1,024 x 2
  // and its layer's two norms of 4,096, counted with it, in fp8; the MLP's 3 x 4,096 x 14,336 in bf16), however
  // fast the GPU (and, its weights kept gathered, it is the same table all step: gathered by the first pass).
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-8b", "system": "b300-hgx", "gpus": 32, "pp": 8, "cp": 4,
      "cp_exchange": "all_gather", "microbatches": 16, "batch": 2, "seq": 8192, "mesh_order": "megatron",
      "policy": "qkv_proj_offloaded", "attention_dtype": "fp8", "optimizer_moments_dtype": "bf16", "parameter_offload": true,
      "reshard_weights": false, "double_buffering": true, "pipelined_transfers": true, "grad_reduce_dtype": "bf16",
      "hbm_bytes": 28.8e9})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const double table = 128256.0 * 4096 * 2, layer = (4096.0 * 4096 * 2 + 4096.0 * 1024 * 2 + 2 * 4096) + 3 * 4096.0 * 14336 * 2;
  const auto base = run_simulation(c);
  const auto fast = test::run_on_faster_gpu(c);
  CHECK(fast.step_time_s < base.step_time_s);
  for (const auto* r : {&base, &fast}) {
    CHECK(r->fits);
    REQUIRE(r->stages.size() == 8);
    CHECK(r->stages[0].hbm_breakdown_bytes.at("gathered_weights") == Approx(table + 4 * layer).epsilon(1e-9));
  }
  // Kept gathered (reshard_weights off), the table is gathered once per step, as each layer is; resharded, once
  // per micro-batch.
  for (const bool reshard : {false, true}) {
    RunConfig r = c;
    r.reshard_weights = reshard;
    const PreparedRun run = prepare_run(r);
    std::vector<std::string> names;
    (void)build_program(run.graph, run.system, run.policy, run.options, &names);
    CHECK(std::count(names.begin(), names.end(), "all_gather embedding") == (reshard ? 16 : 1));
  }
}

TEST_CASE("the micro-batch count comes from microbatches (MaxText) or the global batch (Megatron)", "[pipeline]") {
  RunConfig c;
  c.model = "llama3.1-8b";
  c.gpus = 16;
  c.pp = 4;
  c.batch = 2;  // 2 x 4 stages = 8 sequences per replica per step, split into 4 micro-batches of 2
  c.microbatches = 4;
  auto r = run_simulation(c);
  CHECK(r.grad_accum == 4);
  CHECK(r.global_batch == 2 * 16);
  RunConfig m;
  m.model = "llama3.1-8b";
  m.gpus = 16;
  m.pp = 4;
  m.micro_batch = 1;
  m.global_batch = 32;  // 4 replicas (16 / 4 stages) x 1 sequence x 8 micro-batches
  r = run_simulation(m);
  CHECK(r.grad_accum == 8);
  CHECK(r.tokens_per_device_per_step == Approx(32.0 * 4096 / 16));
}

TEST_CASE("largest-batch steps through batches whose sequences divide into the micro-batches", "[pipeline][plan]") {
  // 4 stages, 8 micro-batches: a replica's batch x 4 sequences must divide by 8, so the batch is even.
  RunConfig c;
  c.model = "llama3.1-70b";
  c.gpus = 16;
  c.pp = 4;
  c.microbatches = 8;
  c.seq = 8192;
  auto lb = largest_batch(c, 64);
  REQUIRE(lb.batch > 0);
  CHECK(std::fmod(lb.batch, 2.0) == 0);
  for (const auto& t : lb.tried) CHECK(std::fmod(*t.config.batch, 2.0) == 0);
  c.batch = lb.batch;
  CHECK(run_simulation(c).fits);
  c.batch = lb.batch + 2;
  CHECK_FALSE(run_simulation(c).fits);
}

TEST_CASE("a stage prefetches weights at most one pass ahead, however many micro-batches", "[pipeline]") {
  // Llama 8B over 4 stages x 4 chunks of 2 layers each, without FSDP: each layer's bf16 weights
  // (218 M x 2 B) are still put in a buffer per use, and a 2-layer pass issues both gathers before any of
  // its own ops. With 16 micro-batches, the gathered weights at any time are a few layers' worth, not one
  // per pass.
  RunConfig c = llama8b_pipeline(4, "1f1b", 16);
  c.vp = 4;
  auto r = run_simulation(c);
  for (const auto& st : r.stages) CHECK(st.hbm_breakdown_bytes.at("gathered_weights") <= 6 * 218e6 * 2);
}

TEST_CASE("a Megatron pipeline layout gives each chunk's layers, bad layouts name the layout", "[pipeline][errors]") {
  // Megatron-Bridge's DeepSeek-V3 layout for pp 2 x vp 8: 15 chunks of 4 layers and a last one of 1 with the
  // MTP module and the loss: 15 x 4 + 1 = 61.
  std::int64_t mtp = -1;
  auto counts = parse_pipeline_layout("Et*4|(t*4|)*14tmL", mtp);
  REQUIRE(counts.size() == 16);
  CHECK(counts.front() == 4);
  CHECK(counts[14] == 4);
  CHECK(counts.back() == 1);
  CHECK(mtp == 1);
  counts = parse_pipeline_layout("E|t,t|t t|L", mtp);  // commas and spaces are ignored; end chunks may be empty
  CHECK(counts == std::vector<std::int64_t>{0, 2, 2, 0});
  CHECK(mtp == 0);
  for (auto [layout, why] : std::vector<std::pair<std::string, std::string>>{
           {"Et*4|t*4", "must end with L"}, {"t*4|EtL", "E, the embedding, must open the first chunk"},
           {"Et*0L", "'*' needs a count of at least 1"}, {"E(t|L", "unclosed '('"}, {"Et)L", "unmatched ')'"},
           {"EtxL", "unexpected 'x'"}, {"Et*99999999L", "more than 100000 symbols"}, {"ELt", "L, the loss, must close"},
           {"Etm|tL", "m, an MTP layer, belongs in the last chunk"}}) {
    INFO(layout);
    CHECK_THROWS_WITH(parse_pipeline_layout(layout, mtp), Catch::Contains("layout = \"" + layout + "\"") && Catch::Contains(why));
  }
  ModelSpec m;
  m.num_layers = 61;
  Parallelism p;
  p.pp = 2;
  p.vp = 8;
  p.split.layout = "Et*4|(t*4|)*14tmL";
  // The layout's one "m" must be a module the run trains.
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("(1 MTP layers, m; the run trains mtp_layers = 0)"));
  m.mtp_layers = 1;
  auto chunks = pipeline_chunks(m, p);
  CHECK(chunks.size() == 16);
  CHECK(chunks[15].first_layer == 60);
  CHECK(chunks[15].end_layer == 62);  // layer 60 and the MTP module, layer 61
  CHECK(chunks[15].stage == 1);
  CHECK(chunks[14].end_layer == 60);
  // Without a layout the module joins the last chunk of the even split: 64 layers over pp 2 x vp 8, plus one.
  m.num_layers = 64;
  p.split.layout.clear();
  chunks = pipeline_chunks(m, p);
  CHECK(chunks[15].first_layer == 60);
  CHECK(chunks[15].end_layer == 65);
  m.num_layers = 61;
  p.split.layout = "Et*4|(t*4|)*14tmL";
  p.vp = 4;
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("(16 chunks; pp x vp = 8)"));
  p.vp = 8;
  m.num_layers = 62;
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("(61 decoder layers; the model has num_layers = 62)"));
  m.num_layers = 61;
  p.split.embedding_as_layer = true;
  CHECK_THROWS_WITH(pipeline_chunks(m, p), Catch::Contains("drop first/last_stage_layers and embedding/loss_as_layer"));
}

TEST_CASE("chunks holding only the embedding or only the loss run, and one split written two ways is one run", "[pipeline]") {
  // Llama 3.1 8B's 32 layers plus the embedding and the loss as a unit each over pp 2 x vp 17: the first chunk
  // is the embedding alone, the last the loss alone (as Llama 3.1 405B's 126 + 2 over pp 16 x vp 8).
  RunConfig c = test::llama8b_h200("minimal");
  c.pp = 2;
  c.vp = 17;
  c.microbatches = 4;
  c.embedding_as_layer = c.loss_as_layer = true;
  const auto units = run_simulation(c);
  REQUIRE(units.stages.size() == 2);
  CHECK(units.stages[0].layers.rfind("E,1,3,", 0) == 0);  // chunk k (layer k - 1) on stage k % 2
  CHECK(units.stages[1].layers.substr(units.stages[1].layers.size() - 5) == ",30,L");
  CHECK(units.executed_flops_per_device >= units.model_flops_per_device);
  // The same split as a layout: the same program, the same numbers.
  RunConfig layout = c;
  layout.embedding_as_layer = layout.loss_as_layer = false;
  layout.pipeline_layout = "E|(t|)*32L";
  const auto written = run_simulation(layout);
  CHECK(written.step_time_s == units.step_time_s);
  CHECK(written.hbm_peak_bytes == units.hbm_peak_bytes);
  // An even split written as a layout is the even split.
  RunConfig even = test::llama8b_h200("minimal");
  even.pp = 2;
  even.microbatches = 4;
  RunConfig even_layout = even;
  even_layout.pipeline_layout = "Et*16|t*16L";
  CHECK(run_simulation(even_layout).step_time_s == run_simulation(even).step_time_s);
}

TEST_CASE("with one stage every pipeline schedule is plain gradient accumulation", "[pipeline]") {
  // pp 1 with zb-h1 built weight-gradient passes the builder had no record for (a crash the layout search's
  // bound test found); GPipe would have held every micro-batch. One stage runs each micro-batch forward then
  // backward, whatever the schedule's name.
  RunConfig c = test::llama8b_h200("minimal");
  c.grad_accum = 3;
  const double step = run_simulation(c).step_time_s;
  for (const char* s : {"gpipe", "zb-h1"}) {
    c.pp_schedule = s;
    INFO(s);
    CHECK(run_simulation(c).step_time_s == step);
  }
}

TEST_CASE("an earlier pass's host copies go first, so a faster network never slows an offloading pipeline", "[pipeline][offload]") {
  // The classes by hand (chunks of 32 layers, 1024 classes per layer block, 33 blocks per pass): the second
  // forward's first D2H (33 x 1024 = 33,792) ranks after the first forward's last (31 x 1024 = 31,744), and
  // the second backward's reload needed first (the last layer's, block 1) after the first backward's last
  // (block 32: 32,768 + 1023 classes).
  CHECK(build::d2h_priority({0, 32}, 31) == 31 * 1024);
  CHECK(build::d2h_priority({1, 32}, 0) == 33 * 1024);
  CHECK(build::h2d_priority({0, 32}, 0, 1023) == 32 * 1024 + 1023);
  CHECK(build::h2d_priority({1, 32}, 31, 0) == 34 * 1024);
  // A stress draw (seed 1921): Llama 3.1 8B on 64 GB300s, tp 4 x cp 2 x pp 8, ZB-H1, 8 micro-batches of 1,024
  // tokens, QKV and MLP activations offloaded with LHS. Stage 0 sends a micro-batch on once its last layer's
  // D2H copies are done. Ranked by layer alone, the next micro-batches' first layers took the link from them;
  // with twice the NVLink and InfiniBand bandwidth the forwards came faster, more copies overtook, and the
  // step went from 0.396 to 0.612 s. More bandwidth is never slower (DESIGN.md).
  const auto doc = nlohmann::json::parse(R"({"model": "llama3.1-8b", "system": "gb300-nvl72", "gpus": 64, "tp": 4, "cp": 2,
      "cp_exchange": "ring", "cp_shards_weights": false, "pp": 8, "pp_schedule": "zb-h1", "microbatches": 8, "batch": 2,
      "seq": 1024, "policy": "minimal_offloaded", "lhs": true, "double_buffering": true, "calibration": "gb200-fitted",
      "optimizer_moments_dtype": "bf16", "sequence_parallel": false, "sharded_optimizer": true, "tp_comm_overlap": true})");
  const RunConfig c = RunConfig::from_json(doc, "test");
  const double base = run_simulation(c).step_time_s;
  const auto better = test::better_hardware(c, prepare_run(c).system);
  REQUIRE(better.back().first == "twice the network");
  CHECK(run_simulation(better.back().second).step_time_s <= base * (1 + 1e-9));
}
