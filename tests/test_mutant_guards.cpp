// Tests added for mutants of scripts/mutants.json that the rest of the suite let through (docs/mutants.md):
// each asserts the behaviour the mutated line is responsible for, against a value computed by hand.
#include <catch2/catch.hpp>

#include "hwmodels/catalog.hpp"
#include "planner/run_config.hpp"
#include "sim/program_builder.hpp"

using namespace hbmsim;

namespace {

// Llama 3.1 8B on 8 GB200 GPUs (FSDP 8, batch 2, seq 4096) with query/key/value offloaded.
RunConfig gb200_qkv_offloaded() {
  RunConfig c;
  c.system = "gb200-nvl72";
  c.model = "llama3.1-8b";
  c.gpus = 8;
  c.batch = 2;
  c.seq = 4096;
  c.policy = "qkv_proj_offloaded";
  return c;
}

// One step's program with its op names.
struct Built {
  PreparedRun run;
  std::vector<std::string> names;
  sim::Program program;
  const sim::ProgramOp& op(const std::string& name) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return program.ops[i];
    FAIL("no op named " << name);
    return program.ops.front();
  }
};
Built build(const RunConfig& c) {
  Built b{prepare_run(c), {}, {}};
  b.program = build_program(b.run.graph, b.run.system, b.run.policy, b.run.options, &b.names);
  return b;
}

}  // namespace

TEST_CASE("a host link shared by the GPUs of one Grace gives each GPU its share per direction", "[guard][hwmodels]") {
  // GB200: NVLink-C2C carries 450 GB/s each way per Grace, shared by its 2 GPUs: 225 GB/s per GPU. D2H has
  // no measurement, so it is that share; H2D is the measured 176 GB/s (below the share).
  auto gb200 = builtin_system("gb200-nvl72");
  CHECK(gb200.host_d2h_bytes_per_s() == Approx(450e9 / 2));
  CHECK(gb200.host_h2d_bytes_per_s() == Approx(176e9));
  // Vera Rubin NVL144: C2C 900 GB/s each way per Vera, 2 GPUs, no measurements: 450 GB/s both ways.
  auto vr = builtin_system("vr-nvl144");
  CHECK(vr.host_h2d_bytes_per_s() == Approx(900e9 / 2));
  CHECK(vr.host_d2h_bytes_per_s() == Approx(900e9 / 2));
  // H200: a dedicated PCIe link per GPU, measured 55 GB/s each way.
  auto h200 = builtin_system("h200-hgx");
  CHECK(h200.host_d2h_bytes_per_s() == Approx(55e9));
}

TEST_CASE("an offloaded tensor's D2H copy runs at the D2H share and its H2D copy at the H2D rate", "[guard][sim]") {
  // query_proj of one layer: T x H x head_dim x 2 bytes with T = 2 x 4096 tokens, 32 heads of 128:
  // 8192 x 32 x 128 x 2 = 64 MiB. On GB200 the D2H copy takes bytes / (225 GB/s x copy efficiency) plus the
  // 2 us link latency; the H2D copy the same at the measured 176 GB/s.
  auto b = build(gb200_qkv_offloaded());
  const double bytes = 8192.0 * 32 * 128 * 2;
  REQUIRE(b.run.graph.tensor_bytes("query_proj") == bytes);
  const double eff = b.run.system.efficiency.copy.at(bytes);
  for (int layer : {0, 31}) {
    const std::string l = " L" + std::to_string(layer);
    CHECK(b.op("d2h query_proj" + l).seconds == Approx(bytes / (225e9 * eff) + 2e-6));
    CHECK(b.op("h2d query_proj" + l).seconds == Approx(bytes / (176e9 * eff) + 2e-6));
  }
}

TEST_CASE("the LHS memory limit is memory_limit_slop times HBM, less the backward working set", "[guard][sim]") {
  // XLA's xla_gpu_memory_limit_slop_factor: the scheduler plans for slop x HBM. The working set held back
  // does not depend on the slop, so two slops' limits differ by their difference times HBM (189,471 MiB).
  auto c = gb200_qkv_offloaded();
  c.memory_limit_slop = 0.95;
  const double at_95 = build(c).program.hbm_limit_bytes.at(0);
  c.memory_limit_slop = 0.5;
  const double at_50 = build(c).program.hbm_limit_bytes.at(0);
  const double hbm = 189471 * 1048576.0;
  CHECK(at_95 - at_50 == Approx(0.45 * hbm));
  CHECK(at_95 < 0.95 * hbm);
  CHECK(at_95 > 0.9 * hbm);  // an 8B layer's backward working set is a few GB at most
}

TEST_CASE("after a step only the resident buffers are live: every activation, copy and workspace is freed", "[guard][memory]") {
  // The step ends with the fp32 parameters (MaxText's weight_dtype default, 4 bytes), the Adam moments
  // (8 bytes) and the fp32 gradient accumulator (4 bytes) of each device's 1/fsdp share of the model, and the runtime reserve; nothing on the
  // host. Llama 3.1 8B has 8.03e9 parameters (embedding and head untied). Policies: minimal saves tensors the
  // backward never reads (the attention and MLP outputs); the offloading ones go through the host.
  for (const char* policy : {"full", "minimal", "minimal_with_context", "qkv_proj_offloaded", "minimal_offloaded"})
    for (bool pipelined : {false, true}) {
      auto c = gb200_qkv_offloaded();
      c.policy = policy;
      c.pipelined_transfers = pipelined;
      INFO(policy << (pipelined ? ", pipelined transfers" : ""));
      auto b = build(c);
      auto r = sim::run_program(b.program, true);
      REQUIRE(!r.timeline.empty());
      const auto& end = r.timeline.back();
      const double params = b.run.graph.model.total_params();
      CHECK(params == Approx(8.03e9).epsilon(0.001));
      const double resident = params / 8 * (4 + 8 + 4) + b.run.system.runtime.reserve_bytes;
      CHECK(end.time_s == r.end_time_s);
      CHECK(end.hbm_bytes == Approx(resident).epsilon(1e-9));
      CHECK(end.host_bytes == Approx(0).margin(1));
    }
}

TEST_CASE("tensor parallelism divides each layer's GEMM and attention FLOPs per device by tp", "[guard][parallel][tp]") {
  // Llama 3.1 8B (d 4096, 32 query heads and 8 KV heads of 128, MLP 14336), tp 4, batch 1 per device:
  // the tp group runs 4 sequences of 4096, T = 16384 tokens, each device 8 query heads, 2 KV heads and
  // 3584 of the MLP width. GEMMs: 2 T d (1024 + 256 + 256) for QKV, 2 T 1024 d for the output projection,
  // 3 x 2 T d 3584 for the MLP: 2 T d 13312 in all, a quarter of the whole layer's 2 T d 53248.
  // Causal attention: 4 T S (8 x 128) / 2.
  RunConfig c;
  c.system = "h200-hgx";
  c.model = "llama3.1-8b";
  c.gpus = 8;
  c.tp = 4;
  c.batch = 1;
  c.seq = 4096;
  auto run = prepare_run(c);
  const auto& layer = run.graph.templates.at(0);
  const double T = 16384, d = 4096, S = 4096;
  double gemm = 0, attention = 0;
  for (const auto& op : layer.ops) {
    if (op.kind == OpKind::gemm) gemm += op.flops;
    if (op.kind == OpKind::attention) attention += op.flops;
  }
  CHECK(gemm == Approx(2 * T * d * 13312));
  CHECK(gemm == Approx(2 * T * d * 53248 / 4));
  CHECK(attention == Approx(4 * T * S * 8 * 128 / 2));
}

TEST_CASE("the loss holds its fp32 exp and a bf16 gradient beside the logits under MaxText and only the bf16 logits under Megatron", "[guard][memory]") {
  // Llama 3.1 8B, batch 2 x 4096 tokens per device, vocab 128,256, tp 1: 8192 x 128256 logits. Under MaxText
  // the bf16 logits, the fp32 exp its cross-entropy's custom VJP saves, and a bf16 gradient: 2 + 4 + 2 bytes
  // each. Transformer Engine's fused cross-entropy (Megatron) writes the gradient into the bf16 logits: 2.
  const double logits = 2.0 * 4096 * 128256;
  RunConfig c = gb200_qkv_offloaded();
  for (const auto& [framework, bytes_per_logit] : {std::pair<const char*, double>{"maxtext", 8}, {"megatron", 2}}) {
    c.framework = framework;
    const Built b = build(c);
    const sim::ProgramOp& unembed = b.op("unembed");
    REQUIRE(unembed.allocs.size() == 1);
    CHECK(b.program.buffers[static_cast<std::size_t>(unembed.allocs[0])].bytes == Approx(logits * bytes_per_logit));
  }
}
