// hbmsim validate: the published measured runs (data/reference/published_runs.csv) mapped to runs by rules on
// their columns, and the checked-in report. docs/validation.md (datasheet) and docs/validation-gb200-fitted.md
// are read back and compared with a fresh validation: a change that moves a predicted tokens/s by more than
// 0.5%, or changes which rows are expressed or why, fails here until the documents are regenerated in the same
// commit (`hbmsim validate --markdown > docs/validation.md`, and with --calibration gb200-fitted).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <tuple>

#include "helpers.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/validation_report.hpp"

using namespace hbmsim;

namespace {

const std::string kHeader =
    "src,container,system,gpus,model,prec,seq,mbs,gbs,tp,pp,vp,cp,ep,dp_fsdp,remat_offload,tok_s_gpu,tflops_gpu,step_s,mfu,mem,notes\n";

PublishedRun one_row(const std::string& line) {
  auto runs = parse_published_runs(kHeader + line + "\n", "test.csv");
  REQUIRE(runs.size() == 1);
  return runs[0];
}

RunConfig mapped(const std::string& line) {
  auto m = map_published_run(one_row(line));
  INFO(m.reason);
  REQUIRE(m.config);
  return *m.config;
}

std::string not_expressed(const std::string& line) {
  auto m = map_published_run(one_row(line));
  REQUIRE_FALSE(m.config);
  REQUIRE_FALSE(m.reason.empty());
  return m.reason;
}

// Cells of a Markdown table line, '\|' unescaped.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (std::size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cur += '|';
      ++i;
    } else if (line[i] == '|') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  return out;
}

struct PrintedRun {
  std::string predicted, note;
};

// The "## Runs" table of a validation report: row number -> its predicted tokens/s and note.
std::map<int, PrintedRun> printed_runs(const std::string& doc) {
  auto at = doc.find("\n## Runs\n");
  REQUIRE(at != std::string::npos);
  std::istringstream in(doc.substr(at));
  std::map<int, PrintedRun> rows;
  bool header = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| # |", 0) == 0) {
      header = true;
      continue;
    }
    if (!header || line.rfind("|---", 0) == 0) continue;
    if (line.rfind("| ", 0) != 0) break;
    auto c = cells(line);
    REQUIRE(c.size() == 15);
    rows[std::stoi(c[0])] = {c[9], c[14]};
  }
  return rows;
}

void check_document(const std::string& file, const std::string& calibration) {
  const std::string doc = test::slurp(std::string(HBMSIM_SOURCE_DIR) + "/docs/" + file);
  REQUIRE_FALSE(doc.empty());
  INFO("docs/" << file << ": regenerate it with `hbmsim validate --markdown" << (calibration.empty() ? "" : " --calibration " + calibration)
                << "` in the commit that moves these numbers");
  CHECK(doc.find("# Validation against published measured runs: " + calibration_label(calibration) + "\n") == 0);
  auto printed = printed_runs(doc);
  auto rows = validate_runs(load_published_runs(), calibration, 2);
  REQUIRE(printed.size() == rows.size());
  int expressed = 0;
  for (const auto& r : rows) {
    INFO("row " << r.run.row);
    REQUIRE(printed.count(r.run.row));
    const auto& p = printed.at(r.run.row);
    CHECK(p.note == validation_note(r));
    if (!r.expressed()) {
      CHECK(p.predicted == "-");
      continue;
    }
    ++expressed;
    REQUIRE(p.predicted != "-");
    const double doc_value = std::stod(p.predicted);
    const double fresh = r.predicted->tokens_per_s_per_device;
    // 0.5% plus half the last printed digit (tokens/s print as whole numbers).
    CHECK(std::fabs(fresh - doc_value) <= 0.005 * doc_value + 0.5);
  }
  CHECK(expressed > 0);
}

}  // namespace

TEST_CASE("Validation: docs/validation.md is what hbmsim validate gives now (datasheet)", "[validation]") {
  check_document("validation.md", "");
}

TEST_CASE("Validation: docs/validation-gb200-fitted.md is what hbmsim validate gives now (gb200-fitted)", "[validation]") {
  check_document("validation-gb200-fitted.md", "gb200-fitted");
}

TEST_CASE("Validation: docs/validation-corpus-fitted.md is what hbmsim validate gives now (corpus-fitted)", "[validation]") {
  check_document("validation-corpus-fitted.md", "corpus-fitted");
}

TEST_CASE("Validation: the built-in corpus is the 53 published runs, every one accounted for", "[validation]") {
  auto runs = load_published_runs();
  REQUIRE(runs.size() == 53);
  CHECK(runs.front().row == 1);
  CHECK(runs.back().row == 53);
  for (const auto& r : runs) {
    auto m = map_published_run(r);
    INFO("row " << r.row);
    CHECK(m.config.has_value() != !m.reason.empty());  // either a run or a reason, never both or neither
  }
}

TEST_CASE("Validation mapping: Llama 3.1 405B on 256 GB200s, tp 4 x pp 16 x vp 4, FP8, DDP (derived by hand)", "[validation]") {
  auto c = mapped("MBA,26.04.01,DGX-GB200,256,Llama3.1-405B,FP8,8192,1,1536,4,16,4,1,-,DDP,,864,2144,,,,");
  CHECK(c.system == "gb200-nvl72");
  CHECK(c.model == "llama3.1-405b");
  CHECK(c.gpus == 256);
  CHECK(c.seq == 8192);
  CHECK(c.micro_batch == 1);
  CHECK(c.global_batch == 1536);
  CHECK(c.tp == 4);
  CHECK(c.pp == 16);
  CHECK(c.vp == 4);
  CHECK(c.cp == 1);
  CHECK(c.ep == 1);
  CHECK(c.dp == 4);  // 256 / (4 x 16)
  CHECK(c.fsdp == 1);
  CHECK(c.sharded_optimizer);
  CHECK(c.weights == "fp8");
  CHECK(c.attention_dtype == "fp8");
  CHECK(c.policy == "no_recompute");  // nothing stated: Megatron keeps what every backward reads
  CHECK(c.tensors.empty());
  const LayoutReading reading = layout_reading(c);  // Megatron-Core's, by the framework
  CHECK(reading.mesh_order == "megatron");
  CHECK(c.pp_schedule == "1f1b");
  CHECK(reading.cp_exchange == "ring");
  CHECK_FALSE(reading.cp_shards_weights);
  CHECK(c.tp_comm_overlap);  // Megatron-Bridge's recipes overlap tp communication (userbuffers) where tp > 1
  CHECK(c.grad_reduce_dtype == "bf16");  // its performance configs set grad_reduce_in_fp32 off
  // 126 layers on 16 x 4 chunks: only with the embedding and the loss as a layer each (128 / 64 = 2).
  CHECK(c.embedding_as_layer);
  CHECK(c.loss_as_layer);
  // 1536 / (1 x 4 replicas) = 384 micro-batches.
  auto report = run_simulation(c);
  CHECK(report.tokens_per_device_per_step == Approx(1536.0 * 8192 / 256));
}

TEST_CASE("Validation mapping: DeepSeek-V3 on 256 DGX B300s, pp 8 x ep 8, MXFP8, DDP (derived by hand)", "[validation]") {
  auto c = mapped("MBA,26.04.01,DGX-B300,256,DeepSeek-V3,MXFP8,4096,2,4096,1,8,-,1,8,DDP,,3456,898,,,,");
  CHECK(c.system == "b300-hgx");  // an air-cooled 8-GPU HGX node, not the NVL72 rack of the same GPU
  CHECK_FALSE(layout_reading(c).ep_shards_weights);  // Megatron-Core: ep partitions the experts only
  CHECK(c.model == "deepseek-v3-671b");
  CHECK(c.pp == 8);
  CHECK(c.vp == 1);  // "-": no interleaving
  CHECK(c.ep == 8);  // one node's NVLink domain
  CHECK(c.tp == 1);
  CHECK(c.dp == 4);  // 256 / (1 x 8 x 1): ep is carved out of data parallelism, as for Mixtral below
  CHECK(c.micro_batch == 2);
  CHECK(c.weights == "mxfp8");  // block-scaled: a rate of its own, not per-tensor FP8's
  CHECK(c.attention_dtype == "mxfp8");
  CHECK(c.fp8_saved_activations);
  CHECK(mapped("MBA,26.04.01,DGX-GB300,64,Llama3-70B,FP8,8192,1,256,1,1,-,1,-,FSDP,,5248,,,,,").weights == "fp8");
  CHECK(mapped("MBA,26.04,DGX-GB200,256,Llama3-70B,FP8-CS,8192,1,256,1,1,-,1,-,FSDP,,5248,,,,,").weights == "fp8");
  CHECK(mapped("MBA,26.04,DGX-B200,256,DeepSeek-V3,MXFP8,4096,1,4096,1,16,-,1,8,DDP,,2815,732,,,,").system == "b200-hgx");
  // Megatron-Bridge's DeepSeek-V3 configs dispatch tokens with HybridEP or DeepEP (the flex dispatcher).
  CHECK(c.moe_dispatcher == "flex");
  // HybridEP with the 32 SMs overrides.py gives it; the B200 ep 32 config's DeepEP keeps Megatron-Core's 20 (0).
  CHECK(c.moe_dispatcher_sms == 32);
  CHECK(mapped("MBA,26.04.01,DGX-B200,256,DeepSeek-V3,MXFP8,4096,1,4096,1,8,2,1,32,DDP,,3328,864,,,,").moe_dispatcher_sms == 0);
  CHECK(mapped("DGXC-05,NeMo 25.04.01,H100,1024,DeepSeek-V3,BF16,4096,1,8192,1,16,1,1,64,DP64,,,163.7,52.04,16.55%,,").moe_dispatcher_sms == 0);
  // NeMo 25.04's DeepSeek-V3 script (7a8f1cc) keeps the alltoall dispatcher on H100 and Blackwell alike.
  CHECK(mapped("DGXC-05,NeMo 25.04.01,H100,1024,DeepSeek-V3,BF16,4096,1,8192,1,16,1,1,64,DP64,,,163.7,52.04,16.55%,,").moe_dispatcher == "alltoall");
  CHECK(mapped("DGXC-05,NeMo 25.04.01,GB200,128,DeepSeek-V3,BF16,4096,1,1024,1,4,1,1,32,DP32,,,249.3,34.168,10.18%,,").moe_dispatcher == "alltoall");
  // Megatron-Bridge's DeepSeek-V3 recipe: the precision-aware optimizer with bf16 moments; NeMo's keeps fp32.
  CHECK(c.optimizer_moments_dtype == "bf16");
  CHECK(mapped("DGXC-05,NeMo 25.04.01,H100,1024,DeepSeek-V3,BF16,4096,1,8192,1,16,1,1,64,DP64,,,163.7,52.04,16.55%,,").optimizer_moments_dtype == "fp32");
  CHECK(mapped("MBA,26.04.01,DGX-GB300,64,Llama3-70B,MXFP8,8192,1,256,1,4,5,1,-,DDP,,4864,2186,,,,").optimizer_moments_dtype == "fp32");
}

TEST_CASE("Validation mapping: Mixtral 8x7B, ep 8 carved out of the 64 data-parallel ranks (derived by hand)", "[validation]") {
  auto c = mapped("NDOC2504,NeMo 25.04,DGX-GB200,64,Mixtral-8x7B,FP8 CS,4096,2,256,1,1,1,1,8,DDP,,19275,1598,,,,GA2");
  CHECK(c.model == "hf/mixtral-8x7b.config.json");
  CHECK(c.ep == 8);
  CHECK_FALSE(layout_reading(c).ep_shards_weights);
  CHECK(c.moe_dispatcher == "alltoall");
  CHECK(c.grad_reduce_dtype == "bf16");  // NeMo's performance scripts: FP8 recipes reduce gradients in bf16
  // ... and so do its Llama recipes in performance mode at BF16 (pretrain_performance_optimizations); its
  // DeepSeek-V3 script, built without that mode, keeps bf16_mixed's fp32.
  CHECK(mapped("DGXC-05,NeMo 25.04.01,GB200,128,Llama3.1-405B,BF16,8192,1,64,4,8,8,2,-,DP2,,,,9.347,47.4%,,total 56092; GA32").grad_reduce_dtype == "bf16");
  CHECK(mapped("DGXC-05,NeMo 25.04.01,H100,1024,DeepSeek-V3,BF16,4096,1,8192,2,16,1,1,64 (ETP1),DP32,,,163.7,52.04,16.55%,,").grad_reduce_dtype == "fp32");
  CHECK(c.dp == 8);  // 64 / (1 x 1 x 1 x 8): Megatron's data-parallel size 64 holds ep 8
  CHECK(c.fsdp == 1);
  CHECK(c.micro_batch == 2);
  CHECK(c.global_batch == 256);  // accumulation 256 / (2 x 64) = 2, the GA2 of the notes
  CHECK(c.weights == "fp8");
  CHECK_FALSE(c.embedding_as_layer);
  CHECK(map_published_run(one_row("NDOC2504,NeMo 25.04,DGX-GB200,64,Mixtral-8x7B,FP8 CS,4096,2,256,1,1,1,1,8,DDP,,19275,1598,,,,GA2"))
            .remarks.empty());
}

TEST_CASE("Validation mapping: selective recompute of MLA's up-projections rematerializes the per-head q, k, v", "[validation]") {
  // Megatron's mla_up_proj recompute drops what wq_b and wkv_b produce (hbmsim's query_proj, key_proj,
  // value_proj) after the core attention read them; the latents they are made from stay.
  auto c = mapped("MBA,25.11,DGX-GB200,256,DeepSeek-V3 (no MTP),BF16,4096,1,4096,1,4,4,1,64,DDP,"
                  "recipe@5776a6d sel. recompute mla_up_proj,3139,782,,,,GA64");
  CHECK(c.policy == "no_recompute");
  CHECK(c.tensors == std::map<std::string, std::string>{{"key_proj", "remat"}, {"query_proj", "remat"}, {"value_proj", "remat"}});
  // Against keeping them: one layer's q, k, v for 4096 tokens over 128 heads, (192 + 192 + 128) x 2 bytes
  // each, come off the saved activations of every layer in flight, so the peak falls by at least one layer's.
  RunConfig kept = c;
  kept.tensors.clear();
  const double one_layer = 4096.0 * 128 * (192 + 192 + 128) * 2;
  CHECK(run_simulation(kept).hbm_peak_bytes - run_simulation(c).hbm_peak_bytes > one_layer);
  // A model without MLA has no up-projections to recompute: the item changes nothing.
  auto d = mapped("MBA,25.11,DGX-GB200,64,Llama3-70B,BF16,8192,1,128,1,1,1,1,1,FSDP,sel. recompute mla_up_proj,1,1,,,,");
  CHECK(d.tensors.empty());
}

TEST_CASE("Validation mapping: a Megatron-Bridge DeepSeek-V3 row stating no recompute takes its config's", "[validation]") {
  // Megatron-Bridge's DeepSeek-V3 performance configs (26.04 era) recompute selectively: mla_up_proj on GB300,
  // B300 and B200, mlp (the 3 dense layers' MLP, named for dense layers only) on GB200. Rows 15 and 16 of the corpus.
  const std::map<std::string, std::string> mla = {{"key_proj", "remat"}, {"query_proj", "remat"}, {"value_proj", "remat"}};
  auto gb300 = map_published_run(one_row("MBA,26.04.01,DGX-GB300,256,DeepSeek-V3,MXFP8,4096,2,4096,1,2,8,1,32,DDP,,4992,1298,,,,"));
  REQUIRE(gb300.config);
  CHECK(gb300.config->tensors == mla);
  CHECK_FALSE(gb300.recompute_unstated);  // read from the recipe: no fewest-layers search
  CHECK_THAT(gb300.recompute, Catch::Contains("recipe@") && Catch::Contains("mla_up_proj"));
  CHECK_FALSE(gb300.config->ep_overlap);
  auto gb200 = map_published_run(one_row("MBA,26.04.01,DGX-GB200,256,DeepSeek-V3,MXFP8,4096,1,4096,1,4,4,1,64,DDP,,4256,1106,,,,"));
  REQUIRE(gb200.config);
  CHECK(gb200.config->policy == "no_recompute");
  CHECK(gb200.config->tensors == std::map<std::string, std::string>{{"mlp_norm@dense", "remat"}, {"mlpwi_0@dense", "remat"},
                                                                     {"mlpwi_1@dense", "remat"}, {"mlp_act@dense", "remat"},
                                                                     {"mlpwo@dense", "remat"}});
  CHECK_THAT(gb200.recompute, Catch::Contains("dense MLP"));
  // B200 at ep 32 (row 18: the config since 2026-04-18) recomputes mla_up_proj and mlp, the union of the two
  // sets above, and overlaps its all-to-alls (moe_a2a_overlap).
  auto b200 = map_published_run(one_row("MBA,26.04.01,DGX-B200,256,DeepSeek-V3,MXFP8,4096,1,4096,1,8,2,1,32,DDP,,3328,864,,,,"));
  REQUIRE(b200.config);
  auto both = mla;
  both.insert(gb200.config->tensors.begin(), gb200.config->tensors.end());
  CHECK(b200.config->tensors == both);
  CHECK(b200.config->ep_overlap);
  // ... and its pp 16 x ep 8 config before it (row 35) does neither: mla_up_proj alone.
  auto b200_old = map_published_run(one_row("MBA,26.04,DGX-B200,256,DeepSeek-V3,MXFP8,4096,1,4096,1,16,-,1,8,DDP,,2815,732,,,,"));
  REQUIRE(b200_old.config);
  CHECK(b200_old.config->tensors == mla);
  CHECK_FALSE(b200_old.config->ep_overlap);
  // A stated setting wins (moe_act: the experts' activation output, Megatron's MoE layers' GroupedMLP
  // activation_func), and other sources' rows keep "none stated".
  auto stated = map_published_run(one_row("MBA,25.11,DGX-GB300,256,DeepSeek-V3 (no MTP),BF16,4096,1,4096,1,2,4,1,32,DDP,"
                                          "recipe@5776a6d sel. recompute moe_act,3848,1000,,,,"));
  REQUIRE(stated.config);
  CHECK(stated.config->policy == "no_recompute");
  CHECK(stated.config->tensors == std::map<std::string, std::string>{{"moe_mlp_act", "remat"}});
  auto flag = map_published_run(one_row("FLAG,megatron-core 0.6.0,H100 SXM,8,Llama3-8B,BF16,8192,1,32,2,1,-,1,-,DP4,,8103,,,,,"));
  REQUIRE(flag.config);
  CHECK(flag.recompute_unstated);
}

TEST_CASE("Validation mapping: Megatron-Bridge's Llama FSDP rows stating nothing take their configs' CPU offload", "[validation]") {
  // The FP8-CS Megatron-FSDP configs set cpu_offloading_num_layers (read in Megatron-Bridge's
  // scripts/performance configs): 25.09 on GB200 40 layers (Llama 3 70B) and 95 (Llama 3.1 405B, tp 2);
  // 26.04 Llama 3 70B 20 on GB300 and 40 on GB200. Rows 23, 24, 41, 42 of the corpus.
  struct Case {
    const char* line;
    std::int64_t layers;
  };
  for (const Case& k : {Case{"MBA,26.04,DGX-GB300,64,Llama3-70B,FP8,8192,2,256,1,1,-,1,-,FSDP64,,5243,2355,,,,", 20},
                        Case{"MBA,26.04,DGX-GB200,64,Llama3-70B,FP8,8192,2,256,1,1,-,1,-,FSDP64,,4143,1861,,,,", 40},
                        Case{"MBA,25.09,DGX-GB200,64,Llama3-70B,FP8,8192,2,128,1,1,1,1,-,FSDP64,,3986,1791,,,,GA1", 40},
                        Case{"MBA,25.09,DGX-GB200,128,Llama3.1-405B,FP8,8192,1,64,2,1,1,1,-,FSDP64,,729,1840,,,,", 95}}) {
    INFO(k.line);
    const auto m = map_published_run(one_row(k.line));
    REQUIRE(m.config);
    CHECK(m.config->offload_layers == k.layers);
    CHECK(m.config->recompute_layers == 0);
    CHECK(m.config->policy == "no_recompute");
    CHECK_FALSE(m.recompute_unstated);
    CHECK_THAT(m.recompute, Catch::Contains("none stated, its recipe's (recipe@") && Catch::Contains("offload_layers " + std::to_string(k.layers)));
  }
  // The same rows' DDP configs (pipeline parallel), and FSDP in another precision, set neither.
  const auto ddp = map_published_run(one_row("MBA,26.04,DGX-GB200,64,Llama3-70B,MXFP8,8192,1,256,2,4,5,1,-,DDP,,3828,1721,,,,"));
  REQUIRE(ddp.config);
  CHECK(ddp.config->offload_layers == 0);
  CHECK(ddp.recompute_unstated);
  const auto bf16 = map_published_run(one_row("MBA,26.04,DGX-GB200,64,Llama3-70B,BF16,8192,2,256,1,1,-,1,-,FSDP64,,4143,1861,,,,"));
  REQUIRE(bf16.config);
  CHECK(bf16.config->offload_layers == 0);
}

TEST_CASE("Validation mapping: several selective recompute modules in one item", "[validation]") {
  // Megatron's --recompute-modules takes a list; the remat_offload column may name several after "sel.
  // recompute", separated by spaces or commas. DeepSeek-V3 (MLA, MoE, 3 dense layers): layernorm is its input
  // norm and its MoE layers' pre-MLP norm, moe_act the experts' activation output, mla_up_proj the per-head q,
  // k, v; mlp its dense layers' MLP, shared_experts its MoE layers' shared experts (the same MaxText names, so
  // qualified by layer kind); moe the whole MoE layer, shared experts included.
  const std::string head = "MBA,25.11,DGX-GB300,256,DeepSeek-V3 (no MTP),BF16,4096,1,4096,1,2,4,1,32,DDP,";
  const std::string tail = ",3848,961,,,,";
  auto both = map_published_run(one_row(head + "sel. recompute layernorm moe_act" + tail));
  REQUIRE(both.config);
  CHECK(both.config->policy == "no_recompute");
  CHECK(both.config->tensors ==
        std::map<std::string, std::string>{{"attn_norm", "remat"}, {"mlp_norm@moe", "remat"}, {"moe_mlp_act", "remat"}});
  auto with_mlp = map_published_run(one_row(head + "\"sel. recompute mla_up_proj, mlp\"" + tail));
  REQUIRE(with_mlp.config);
  CHECK(with_mlp.config->tensors ==
        std::map<std::string, std::string>{{"key_proj", "remat"}, {"query_proj", "remat"}, {"value_proj", "remat"},
                                           {"mlp_norm@dense", "remat"}, {"mlpwi_0@dense", "remat"}, {"mlpwi_1@dense", "remat"},
                                           {"mlp_act@dense", "remat"}, {"mlpwo@dense", "remat"}});
  const std::map<std::string, std::string> shared = {
      {"mlpwi_0@moe", "remat"}, {"mlpwi_1@moe", "remat"}, {"mlp_act@moe", "remat"}, {"mlpwo@moe", "remat"}};
  auto experts = map_published_run(one_row(head + "sel. recompute shared_experts" + tail));
  REQUIRE(experts.config);
  CHECK(experts.config->tensors == shared);
  auto moe = map_published_run(one_row(head + "sel. recompute moe" + tail));
  REQUIRE(moe.config);
  auto routed = shared;
  for (const char* t : {"router_logits", "moe_dispatched", "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlp_act", "moe_returned"}) routed[t] = "remat";
  CHECK(moe.config->tensors == routed);
  // A module hbmsim does not know leaves the row unexpressed, naming it.
  auto unknown = map_published_run(one_row(head + "sel. recompute core_attn mamba" + tail));
  CHECK_FALSE(unknown.config);
  CHECK_THAT(unknown.reason, Catch::Contains("no hbmsim preset recomputes only mamba"));
}

TEST_CASE("validate --rows: the rows named, with the file's numbers, a malformed list is bad input", "[validation]") {
  const auto all = load_published_runs();
  const auto picked = select_rows(all, "46,48-50");
  REQUIRE(picked.size() == 4);
  CHECK(picked[0].row == 46);
  CHECK(picked[1].row == 48);
  CHECK(picked[3].row == 50);
  CHECK(picked[0].model == all[45].model);
  CHECK(select_rows(all, "").size() == all.size());
  CHECK(select_rows(all, "3,3,2-3").size() == 2);  // a row named twice is run once
  for (const std::string bad : {"x", "0", "54", "5-3", "1,,2", "3,", "-4", "1-2-3"})
    CHECK_THROWS_AS(select_rows(all, bad), InputError);
}

TEST_CASE("Validation mapping: dgxc-benchmarking 25.05's DeepSeek-V3 rows take NeMo 25.04's script", "[validation]") {
  // deepseek_v3/pretraining/launch.sh at v25.05 runs NeMo's pretrain_deepseek_v3.py (commit 7a8f1cc) with
  // --recompute_modules mla_up_proj on H100 and core_attn on GB200; the script splits the 61 layers 64 / pp - 1
  // on the first stage, 64 / pp - 2 on the last (pp 16: 3, 14 x 4, 2 = 61), sets tp_comm_overlap off and keeps
  // the alltoall dispatcher. Rows 50 and 49 of the corpus.
  auto h100 = map_published_run(one_row("DGXC-05,NeMo 25.04.01,H100,1024,DeepSeek-V3,BF16,4096,1,8192,2,16,1,1,64 (ETP1),DP32,,,163.7,52.04,16.55%,,"));
  REQUIRE(h100.config);
  CHECK_FALSE(h100.recompute_unstated);
  CHECK_THAT(h100.recompute, Catch::Contains("recipe@7a8f1cc") && Catch::Contains("mla_up_proj"));
  CHECK(h100.config->tensors == std::map<std::string, std::string>{{"key_proj", "remat"}, {"query_proj", "remat"}, {"value_proj", "remat"}});
  CHECK(h100.config->pipeline_layout == "Et*3|(t*4|)*14t*2mL");  // 3 + 56 + 2 = 61, the MTP module last
  CHECK_FALSE(h100.config->tp_comm_overlap);
  CHECK(h100.config->moe_dispatcher == "alltoall");
  auto gb200 = map_published_run(one_row("DGXC-05,NeMo 25.04.01,GB200,128,DeepSeek-V3,BF16,4096,1,1024,2,4,1,1,32 (ETP1),DP16,,,249.3,34.168,10.18%,,"));
  REQUIRE(gb200.config);
  CHECK(gb200.config->tensors == std::map<std::string, std::string>{{"context", "remat"}});
  CHECK(gb200.config->pipeline_layout == "Et*15|(t*16|)*2t*14mL");  // 15 + 32 + 14 = 61
  // The layout is the one hbmsim simulates: it resolves and runs.
  CHECK(run_simulation(*gb200.config).fits);
  // Other NeMo rows at tp > 1 keep the tensor-parallel overlap their recipes set.
  CHECK(mapped("DGXC-05,NeMo 25.04.01,GB200,128,Llama3.1-405B,BF16,8192,1,64,4,8,8,2,-,DP2,,,,9.347,47.4%,,total 56092; GA32").tp_comm_overlap);
}

TEST_CASE("Validation mapping: FSDP over every rank, and FSDPn (derived by hand)", "[validation]") {
  auto c = mapped("NDOC2504,NeMo 25.04,DGX-GB200,64,Llama3-70B,FP8 CS,8192,1,128,1,1,1,1,1,FSDP,,4035,1943,,,,GA2");
  CHECK(c.model == "llama3.1-70b");
  CHECK(c.fsdp == 64);
  CHECK(c.dp == 1);
  CHECK_FALSE(c.sharded_optimizer);
  auto d = mapped("MBA,25.09,DGX-GB200,128,Llama3.1-405B,FP8,8192,1,64,2,1,1,1,-,FSDP64,,729,1840,,,,");
  CHECK(d.tp == 2);
  CHECK(d.fsdp == 64);  // 128 / 2
  CHECK(d.dp == 1);
}

TEST_CASE("Validation mapping: FlagPerf Llama 3 70B on H100, DP2, selective recompute (derived by hand)", "[validation]") {
  auto c = mapped("FLAG,megatron-core 0.6.0,H100 SXM (IB 400Gb/s),64,Llama3-70B,BF16,8192,1,512,8,4,-,1,-,DP2,"
                  "recompute-activations (selective); flash-attn2; TE,851,,,36.1%,55/80 GiB,");
  CHECK(c.system == "h100-hgx");
  CHECK(c.tp == 8);
  CHECK(c.pp == 4);
  CHECK(c.vp == 1);
  CHECK(c.dp == 2);  // 64 / (8 x 4)
  CHECK(c.sharded_optimizer);
  CHECK(c.weights == "bf16");
  CHECK(c.attention_dtype == "bf16");
  CHECK(c.policy == "no_recompute");  // selective recompute: the core attention recomputed, its output not kept
  CHECK(c.tensors == std::map<std::string, std::string>{{"context", "remat"}});
  CHECK_FALSE(c.tp_comm_overlap);  // bare Megatron-Core scripts: Megatron's default, no tp overlap
  CHECK(c.grad_reduce_dtype == "fp32");  // Megatron-LM's --bf16 accumulates and reduces gradients in fp32
  CHECK_FALSE(c.embedding_as_layer);  // 80 layers split evenly over 4 stages
  CHECK(mapped("FLAG,megatron-core 0.6.0,H100 SXM,8,Llama3-8B,BF16,8192,1,512,2,1,-,1,-,DP4,recompute-activations,8103,,,39.3%,71/80 GiB,")
            .tensors.at("context") == "remat");
}

TEST_CASE("Validation mapping: ETP1 under tp 2 folds the experts over tp (derived by hand)", "[validation]") {
  // dgxc-benchmarking's DeepSeek-V3 on 128 GB200s: tp 2, pp 4, ep 32 with ETP1. Megatron's data-parallel size is
  // 128 / (2 x 4) = 16; the expert group of 32 spans tp 2, so 32 / 2 = 16 of it is carved out of those 16
  // replicas, leaving dp 1.
  auto c = mapped("DGXC-05,NeMo 25.04.01,GB200,128,DeepSeek-V3,BF16,4096,1,1024,2,4,1,1,32 (ETP1),DP16,,,249.3,34.168,10.18%,,");
  CHECK(c.expert_tp == 1);
  CHECK(c.ep == 32);
  CHECK(c.tp == 2);
  CHECK(c.dp == 1);
  CHECK(prepare_run(c).graph.mesh.size(Axis::ep) == 16);
  // An expert group inside tp x cp: tp 2, pp 4, cp 4 and ep 4 (ETP1) leave 128 / (2 x 4 x 4) = 4 replicas, none
  // of them carved (the group is tp 2 x 2 of the 4 cp ranks), so dp 4; the mesh's ep axis is those 2 cp ranks.
  auto in = mapped("X,1,GB200,128,DeepSeek-V3,BF16,4096,1,1024,2,4,1,4,4 (ETP1),DP4,,,,10,,,");
  CHECK(in.expert_tp == 1);
  CHECK(in.dp == 4);
  const Mesh mesh = prepare_run(in).graph.mesh;
  CHECK(mesh.size(Axis::ep) == 2);
  CHECK(mesh.size(Axis::cp) == 2);
  CHECK_THAT(not_expressed("X,1,GB200,128,DeepSeek-V3,BF16,4096,1,1024,2,4,1,4,6 (ETP1),DP4,,,,10,,,"),
             Catch::Contains("nor tp times a divisor of cp"));
  // ETP equal to tp is today's split: nothing folded.
  CHECK(mapped("X,1,GB200,128,DeepSeek-V3,BF16,4096,1,1024,2,4,1,1,16 (ETP2),DP16,,,,10,,,").expert_tp == 0);
}

TEST_CASE("Validation mapping: what cannot be expressed says why", "[validation]") {
  CHECK_THAT(not_expressed("MBA,26.04.01,DGX-GB300,64,Llama3-70B,FP8,8192,2,256,1,1,-,1,-,FSDP64,recipe@HEAD CPU act-offload,5248,2348,,,,"),
             Catch::Contains("number of offloaded layers is not stated"));
  CHECK_THAT(not_expressed("MBA,26.04.01,DGX-A100,64,Llama3-70B,BF16,8192,1,128,1,1,-,1,-,DDP,,1000,,,,,"),
             Catch::Contains("system \"DGX-A100\": no built-in system maps to it"));
  // Expert tensor parallelism other than 1 or tp (folding with ETP > 1) is not modelled.
  CHECK_THAT(not_expressed("X,1,GB200,128,DeepSeek-V3,BF16,4096,1,1024,4,4,1,1,32 (ETP2),DP8,,,,,,,"),
             Catch::Contains("ETP2") && Catch::Contains("tp = 4"));
  CHECK_THAT(not_expressed("X,1,DGX-H100,8,Llama3-8B LoRA,BF16,8192,1,128,1,1,-,1,-,DDP,,1000,,,,,SFT"), Catch::Contains("fine-tuning"));
  CHECK_THAT(not_expressed("X,1,DGX-H100,8,Llama3-8B,FP16,8192,1,128,1,1,-,1,-,DDP,,1000,,,,,"), Catch::Contains("precision \"FP16\""));
  CHECK_THAT(not_expressed("X,1,DGX-H100,8,Llama3-8B,BF16,8192,1,128,1,1,-,1,-,DP3,,1000,,,,,"), Catch::Contains("DP3 disagrees"));
  // Megatron's per-layer settings map onto layer counts: CPU offload of the first N layers, and full recompute
  // of N layers per chunk (block method) with the rest kept (no recompute).
  auto offload = mapped("MBA,26.04.01,DGX-GB200,64,Llama3-70B,FP8,8192,2,256,1,1,-,1,-,FSDP64,recipe@HEAD CPU act-offload 40 of 80 layers,4224,1892,,,,");
  CHECK(offload.offload_layers == 40);
  CHECK(offload.policy == "no_recompute");
  auto block = mapped("MBA,25.11,DGX-H100,8,Llama3-8B,FP8-CS,8192,1,128,1,1,-,1,-,FSDP8,recipe@HEAD full recompute block 5 layers,14451,744,,,,GA16");
  CHECK(block.recompute_layers == 5);
  CHECK(block.policy == "no_recompute");
  // Full recompute of every layer is expressible.
  CHECK(mapped("X,1,DGX-H100,8,Llama3-8B,BF16,8192,1,128,1,1,-,1,-,FSDP8,full recompute block 32 layers,1000,,,,,").policy == "full");
  // A GAn note the batch and layout disagree with is a remark, not a refusal.
  auto m = map_published_run(one_row("DGXC-05,NeMo 25.04.01,H100,512,Llama3.1-405B,BF16,8192,1,256,8,8,8,2,-,DP4,,,,19.810,55.34%,,total 105863; GA32"));
  REQUIRE(m.config);
  REQUIRE(m.remarks.size() == 1);
  CHECK_THAT(m.remarks[0], Catch::Contains("GA32") && Catch::Contains("64"));
}

TEST_CASE("Validation: a row without tokens/s takes it from its step time (derived by hand)", "[validation]") {
  // dgxc-benchmarking's Llama 3.1 405B BF16 row: gbs 64 x seq 8192 tokens per 9.347 s step on 128 GPUs
  // = 438.2 tokens/s per GPU, which its README prints as 56,092 tokens/s in total (56092 / 128 = 438.2).
  auto r = one_row("DGXC-05,NeMo 25.04.01,GB200,128,Llama3.1-405B,BF16,8192,1,64,4,8,8,2,-,DP2,,,,9.347,47.4%,,total 56092");
  REQUIRE(measured_tok_s_gpu(r));
  CHECK(*measured_tok_s_gpu(r) == Approx(64.0 * 8192 / (9.347 * 128)).epsilon(1e-12));
  CHECK(*measured_tok_s_gpu(r) == Approx(56092.0 / 128).epsilon(1e-4));
  CHECK(tok_s_from_step_time(r));
  // A printed tok_s_gpu wins over the step time; neither: no measurement.
  r = one_row("MBA,26.04.01,DGX-GB300,64,Llama3-70B,MXFP8,8192,1,256,1,4,5,1,-,DDP,,4864,2186,1.5,,,");
  CHECK(*measured_tok_s_gpu(r) == 4864);
  CHECK_FALSE(tok_s_from_step_time(r));
  CHECK_FALSE(measured_tok_s_gpu(one_row("MBA,26.04.01,DGX-GB300,64,Llama3-70B,MXFP8,8192,1,256,1,4,5,1,-,DDP,,,,,,,")));
}

TEST_CASE("Validation: a bad runs file names the file, row, column and value", "[validation]") {
  CHECK_THROWS_WITH(parse_published_runs("src,system\nMBA,DGX-H100\n", "runs.csv"),
                    Catch::Contains("runs.csv") && Catch::Contains("missing column \"container\""));
  std::string line = "MBA,1,DGX-H100,eight,Llama3-8B,BF16,8192,1,128,1,1,-,1,-,DDP,,1000,,,,,";
  CHECK_THROWS_WITH(parse_published_runs(kHeader + line + "\n", "runs.csv"),
                    Catch::Contains("runs.csv: row 1, column gpus = \"eight\""));
  line = "MBA,1,DGX-H100,8,Llama3-8B,BF16,8192,1,128,1,1,-,1,-,DDP,,fast,,,,,";
  CHECK_THROWS_WITH(parse_published_runs(kHeader + line + "\n", "runs.csv"),
                    Catch::Contains("row 1, column tok_s_gpu = \"fast\" (expected a number)"));
  line = "MBA,1,DGX-H100,8,Llama3-8B,BF16,8192,1,128,1,1,-,1,x (ETP1),DDP,,1000,,,,,";
  CHECK_THROWS_WITH(parse_published_runs(kHeader + line + "\n", "runs.csv"), Catch::Contains("column ep = \"x (ETP1)\""));

  auto dir = test::temp_dir();
  test::write(dir / "bad_runs.csv", kHeader + "MBA,1,DGX-H100,8,Llama3-8B,BF16,8192,1,128,two,1,-,1,-,DDP,,1000,,,,,\n");
  auto r = test::cli("validate --runs " + (dir / "bad_runs.csv").string());
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("bad_runs.csv: row 1, column tp = \"two\""));
  r = test::cli("validate --runs " + (dir / "no_such_runs.csv").string());
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("no_such_runs.csv"));
}

TEST_CASE("Validation CLI: output order does not depend on --jobs, and every output names the calibration", "[validation]") {
  auto dir = test::temp_dir();
  test::write(dir / "three_runs.csv",
              kHeader + "FLAG,megatron-core 0.6.0,H100 SXM,16,Llama3-8B,BF16,8192,1,512,2,1,-,1,-,DP8,recompute-activations,7914,,,38.4%,62/80 GiB,\n"
                        "MBA,26.04,DGX-A100,64,Llama3-70B,BF16,8192,1,128,1,1,-,1,-,DDP,,1000,,,,,\n"
                        "FLAG,megatron-core 0.6.0,H100 SXM,8,Llama3-8B,BF16,8192,1,512,2,1,-,1,-,DP4,recompute-activations,8103,,,39.3%,71/80 GiB,\n");
  const std::string runs = " --runs " + (dir / "three_runs.csv").string();
  auto one = test::cli("validate --csv --jobs 1" + runs), three = test::cli("validate --csv --jobs 3" + runs);
  REQUIRE(one.status == 0);
  CHECK(one.out == three.out);
  auto human = test::cli("validate" + runs);
  REQUIRE(human.status == 0);
  CHECK_THAT(human.out, Catch::Contains("datasheet figures (no calibration)"));
  CHECK_THAT(human.out, Catch::Contains("no built-in system maps to it"));
  auto fitted = test::cli("validate --markdown --calibration gb200-fitted" + runs);
  REQUIRE(fitted.status == 0);
  CHECK_THAT(fitted.out, Catch::Contains("calibration gb200-fitted"));
  auto json = nlohmann::json::parse(test::cli("validate --json" + runs).out);
  CHECK(json["calibration_label"] == "datasheet figures (no calibration)");
  REQUIRE(json["rows"].size() == 3);
  CHECK(json["rows"][1]["expressed"] == false);
  CHECK(json["summary"]["overall"]["measured"] == 2);
  CHECK(test::cli("validate --json --csv" + runs).status == 2);
  // Progress goes to stderr only, one count per simulated row (two of the three are expressed), and ends its line.
  auto shown = test::cli("validate --csv --jobs 1 --progress on" + runs);
  REQUIRE(shown.status == 0);
  CHECK(shown.out == one.out);
  CHECK_THAT(shown.err, Catch::Contains("validate: 1/2 simulated") && Catch::Contains("validate: 2/2 simulated"));
  CHECK(shown.err.back() == '\n');
  CHECK(one.err.empty());  // auto: stderr is a file here, not a terminal
}

TEST_CASE("Validation: a row that states no recompute and cannot fit without it gets the fewest recompute layers that fit", "[validation]") {
  // Llama 3 70B on 64 GB200s, FSDP 64, micro-batch 2 x 8192, BF16 (row 24 in BF16, a config whose recipe
  // hbmsim has not read), nothing stated. Without recompute a layer keeps its inputs, q/k/v, the attention
  // output and the SwiGLU tensors for 16384 tokens: well over the 173 GiB a GPU has, so the recipe that ran
  // must have recomputed some layers.
  std::vector<PublishedRun> one = {one_row("MBA,26.04,DGX-GB200,64,Llama3-70B,BF16,8192,2,256,1,1,-,1,-,FSDP64,,4143,1861,,,,")};
  one.back().row = 24;
  for (const auto& r : load_published_runs())
    if (r.row == 51) one.push_back(r);
  REQUIRE(one.size() == 2);
  // Progress: both rows simulated (in either order), then the one recompute search, each call's count one on.
  std::vector<std::tuple<std::string, std::size_t, std::size_t>> calls;
  const auto rows = validate_runs(one, "", 2, [&](const std::string& phase, std::size_t done, std::size_t total) {
    calls.emplace_back(phase, done, total);
  });
  using Call = std::tuple<std::string, std::size_t, std::size_t>;
  CHECK(calls == std::vector<Call>{{"simulated", 1, 2}, {"simulated", 2, 2}, {"recompute searches", 1, 1}});
  const ValidationRow& unstated = rows[0].run.row == 24 ? rows[0] : rows[1];
  const ValidationRow& stated = rows[0].run.row == 24 ? rows[1] : rows[0];
  REQUIRE(unstated.predicted);
  CHECK(unstated.predicted->fits);
  const std::int64_t n = unstated.mapping.config->recompute_layers;
  CHECK(n > 0);
  CHECK_THAT(unstated.mapping.recompute, Catch::Contains("the fewest that fit"));
  // The fewest: one layer fewer does not fit, and the prediction is the simulation of the stated count.
  RunConfig fewer = *unstated.mapping.config;
  fewer.recompute_layers = n - 1;
  CHECK_FALSE(run_simulation(fewer).fits);
  CHECK(run_simulation(*unstated.mapping.config).tokens_per_s_per_device == unstated.predicted->tokens_per_s_per_device);
  // Row 51 states selective recompute: read as stated, whatever it needs.
  CHECK(stated.mapping.config->recompute_layers == 0);
  CHECK_THAT(stated.mapping.recompute, !Catch::Contains("fewest"));
}

TEST_CASE("MaxText Llama 3 70B on 128 H100s (FSDP 128, batch 2 x 8192, save_qkv_proj), a run that ran, fits", "[validation][memory]") {
  // NVIDIA's DGXC MaxText Llama 3 70B recipe: 128 H100 80 GB, dcn_fsdp 16 x ici_fsdp 8, per_device_batch_size 2,
  // seq 8192, bf16. The part reports 81,559 MiB (nvidia-smi). By hand, what is live together at the loss's
  // backward: the training state, 70.55e9 parameters x 16 bytes (fp32 weight, fp32 gradient, two fp32 Adam
  // moments) / 128 = 8.82e9; every layer's saved input, 2 x 8192 x 8192 x 2 bytes x 80 = 21.47e9, and q, k, v,
  // 2 x 8192 x (8192 + 1024 + 1024) x 2 bytes x 80 = 26.84e9; the bf16 logits, the loss's fp32 exp and the
  // bf16 gradient, 2 x 8192 x 128,256 x 8 bytes = 16.81e9. Sum 73.9e9 bytes (68.9 GiB): the peak is at least
  // that, and fits.
  RunConfig c;
  c.system = "h100-hgx";
  c.model = "llama3.1-70b";
  c.gpus = 128;
  c.batch = 2;
  c.seq = 8192;
  c.policy = "save_qkv_proj";
  const StepReport r = run_simulation(c);
  CHECK(r.hbm_capacity_bytes == 81559 * 1048576.0);
  CHECK(r.hbm_peak_bytes >= 73.9e9);
  CHECK(r.fits);
}

TEST_CASE("the out-of-corpus configs in notes/ still read and simulate, and run.sh lists each", "[validation]") {
  // notes/out_of_corpus/*.json are hbmsim configs beside measured runs no fit has seen; a field renamed or a
  // check tightened must not leave them unreadable. Each one simulates and fits, as the real run did.
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(HBMSIM_SOURCE_DIR) / "notes" / "out_of_corpus";
  std::ifstream script(dir / "run.sh");
  const std::string listed((std::istreambuf_iterator<char>(script)), std::istreambuf_iterator<char>());
  int configs = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path().string());
    ++configs;
    CHECK(listed.find("\n" + entry.path().stem().string() + " ") != std::string::npos);
    std::ifstream in(entry.path());
    const RunConfig c = RunConfig::from_json(nlohmann::json::parse(in), entry.path().string());
    const StepReport r = run_simulation(c);
    CHECK(r.fits);
    CHECK(r.tflops_per_device > 0);
  }
  CHECK(configs >= 14);
}
