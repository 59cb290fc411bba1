#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "helpers.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/fit.hpp"
#include "planner/run_config.hpp"
#include "planner/sweep.hpp"
#include "random_configs.hpp"

TEST_CASE("systems --json lists the seven systems with HBM, peak FLOP/s and host-link bandwidth", "[cli]") {
  auto r = test::cli("systems --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.size() == 7);
  std::map<std::string, nlohmann::json> by;
  for (auto& s : j) by[s["id"]] = s;
  CHECK(by["gb200-nvl72"]["hbm_bytes"] == 189471 * 1048576.0);  // nvidia-smi: 189,471 MiB
  CHECK(by["gb200-nvl72"]["dense_peak_flops"]["bf16"] == 2.5e15);
  CHECK(by["gb200-nvl72"]["dense_peak_flops"]["nvfp4"] == 10e15);
  CHECK(by["gb200-nvl72"]["host_link_per_direction_bytes_per_s"] == 450e9);
  CHECK(by["gb200-nvl72"]["host_h2d_bytes_per_s_per_gpu"] == 176e9);
  CHECK(by["gb300-nvl72"]["host_d2h_bytes_per_s_per_gpu"] == 193.5e9);
  CHECK(by["vr-nvl144"]["host_link_per_direction_bytes_per_s"] == 900e9);
  CHECK(by["h100-hgx"]["hbm_bytes"] == 81559 * 1048576.0);
  CHECK(by["h200-hgx"]["dense_peak_flops"]["bf16"] == 989e12);
  CHECK_FALSE(by["h200-hgx"]["dense_peak_flops"].contains("nvfp4"));
  CHECK(by["b200-hgx"]["host_h2d_bytes_per_s_per_gpu"] == 55e9);  // PCIe Gen5 x16, as on the HGX H100/H200
  CHECK(by["b300-hgx"]["hbm_bytes"] == 275040 * 1048576.0);       // nvidia-smi: 275,040 MiB
}

TEST_CASE("simulate --json prints the documented fields and a config file is overridden by flags", "[cli]") {
  auto dir = test::temp_dir();
  test::write(dir / "run.json", R"({"system":"h200-hgx","model":"llama3.1-8b","gpus":8,"batch":2,"seq":4096,"policy":"full"})");
  auto a = test::cli("simulate --config " + (dir / "run.json").string() + " --json");
  REQUIRE(a.status == 0);
  auto j = nlohmann::json::parse(a.out);
  // DESIGN.md's list of what `simulate --json` prints.
  for (auto key : {"step_time_s", "tflops_per_device", "model_flops_per_device", "mfu", "fits", "hbm_peak_bytes",
                   "hbm_capacity_bytes", "hbm_breakdown_bytes", "host_peak_bytes", "host_capacity_bytes", "exposed_s",
                   "busy_s", "tokens_per_device_per_step", "tokens_per_s_per_device", "global_batch"})
    CHECK(j.contains(key));
  CHECK(j["config"]["batch"] == 2);
  auto b = test::cli("simulate --config " + (dir / "run.json").string() + " --batch 4 --json");
  REQUIRE(b.status == 0);
  auto k = nlohmann::json::parse(b.out);
  CHECK(k["config"]["batch"] == 4);
  CHECK(k["config"]["policy"] == "full");
  CHECK(k["model_flops_per_device"].get<double>() == Approx(2 * j["model_flops_per_device"].get<double>()));
}

TEST_CASE("the run-field docs are the CLI's own table, and every field has a flag in simulate --help", "[cli]") {
  auto md = test::cli("fields --markdown");
  REQUIRE(md.status == 0);
  std::ifstream in(std::string(HBMSIM_SOURCE_DIR) + "/docs/run-fields.md");
  std::stringstream doc;
  doc << in.rdbuf();
  CHECK(doc.str() == md.out);  // regenerate with: hbmsim fields --markdown > docs/run-fields.md
  auto help = test::cli("simulate --help");
  auto table = nlohmann::json::parse(test::cli("fields --json").out);
  REQUIRE(table.size() == hbmsim::RunConfig::fields().size());
  for (const auto& f : table) {
    INFO(f["name"]);
    CHECK(help.out.find(f["flag"].get<std::string>() + " ") != std::string::npos);
  }
}

TEST_CASE("a command's own --help text is kept beside the exit status, the others get the examples table's", "[cli]") {
  // plan layout and plan scale write what their flags mean (held degrees, the GPU counts); until the fifty-second
  // session the examples table's pass replaced it with the exit status alone.
  for (const std::string cmd : {"plan layout", "plan scale", "plan offload-layers"}) {
    const auto help = test::cli(cmd + " --help").out;
    INFO(cmd);
    CHECK_THAT(help, Catch::Contains("  hbmsim " + cmd + " --model") && Catch::EndsWith("2 for bad input, 1 for an internal error.\n"));
  }
  CHECK_THAT(test::cli("plan layout --help").out, Catch::Contains("is held to that value or comma-separated list"));
  CHECK_THAT(test::cli("plan scale --help").out, Catch::Contains("--gpus takes the counts to compare"));
  CHECK_THAT(test::cli("plan hbm-needed --help").out, Catch::Contains("Examples:\n  hbmsim plan hbm-needed --model"));
}

TEST_CASE("a plan that does not fit is a result with exit status 0", "[cli]") {
  auto r = test::cli("simulate --system h100-hgx --model llama3.1-70b --gpus 8 --batch 16 --seq 8192 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["fits"] == false);
  CHECK(j["hbm_peak_bytes"].get<double>() > j["hbm_capacity_bytes"].get<double>());
}

TEST_CASE("a pipeline given a per-device batch takes tensor overrides from flags and config files", "[cli][pipeline]") {
  // The CLI checks a config's tensor names against the layers before it runs. That check validated the training
  // shape twice, and the second time refused the pipeline's micro-batch count it had moved into grad_accum
  // ("grad_accum = 2"), so no pipeline with --batch could name a tensor. The run is the library's.
  hbmsim::RunConfig c;
  c.model = "llama3.1-8b";
  c.gpus = 8;
  c.pp = 2;
  c.batch = 1;
  c.policy = "custom";
  c.tensors = {{"query_proj", "offload"}};
  const double step_s = hbmsim::run_simulation(c).step_time_s;
  const std::string flags = "simulate --model llama3.1-8b --gpus 8 --pp 2 --batch 1 --policy custom";
  auto r = test::cli(flags + " --tensor query_proj=offload --json");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.out)["step_time_s"].get<double>() == step_s);
  auto dir = test::temp_dir();
  test::write(dir / "pp.json", R"({"model":"llama3.1-8b","gpus":8,"pp":2,"batch":1,"policy":"custom","tensors":{"query_proj":"offload"}})");
  auto f = test::cli("simulate --config " + (dir / "pp.json").string() + " --json");
  INFO(f.err);
  REQUIRE(f.status == 0);
  CHECK(nlohmann::json::parse(f.out)["step_time_s"].get<double>() == step_s);
  // A name the layers do not make is still refused, naming the flag.
  auto bad = test::cli(flags + " --tensor qkv_proj=offload");
  CHECK(bad.status == 2);
  CHECK(bad.err.find("--tensor qkv_proj = \"offload\" (Llama 3.1 8B's layers have no tensor qkv_proj") != std::string::npos);
}

TEST_CASE("the CLI runs what the library runs, from the library's own config JSON, with the same step", "[cli][pipeline]") {
  // The CLI checks a config's fields before it runs (to name the flag or file of a bad one); that path must not
  // refuse, or change, a run the library takes. Random pipelines of the small models with the levers drawn (a
  // third of them with Megatron's module tensors named), each written as its to_json and run from the file:
  // the library's bad input exits 2, the rest print the library's step time and HBM peak to the last bit.
  std::mt19937 rng(5404);
  auto dir = test::temp_dir();
  int runs = 0, named = 0;
  for (int tries = 0; runs < 6 && tries < 200; ++tries) {
    hbmsim::RunConfig c = test::random_pipeline(rng);
    test::add_levers(rng, c);
    if (c.model != "llama3.1-8b" && c.model != "llama3.1-70b") continue;  // the sanitizer build runs these too
    if (tries % 3 == 0) {
      c.policy = "selective";
      c.tensors = {{"attn_norm", "remat"}, {"query_proj", "device"}};
    }
    std::optional<hbmsim::StepReport> lib;
    try {
      lib = hbmsim::run_simulation(c);
    } catch (const hbmsim::InputError&) {
    }
    const auto file = dir / ("random" + std::to_string(tries) + ".json");
    const std::string config = c.to_json().dump();
    test::write(file, config);
    const auto r = test::cli("simulate --config " + file.string() + " --json");
    INFO(config << "\n" << r.err);
    if (!lib) {
      CHECK(r.status == 2);
      continue;
    }
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["step_time_s"].get<double>() == lib->step_time_s);
    CHECK(j["hbm_peak_bytes"].get<double>() == lib->hbm_peak_bytes);
    ++runs;
    named += !c.tensors.empty();
  }
  CHECK(runs == 6);
  CHECK(named >= 2);
}

TEST_CASE("bad flags and bad run configs exit with status 2 and one line naming them", "[cli]") {
  auto dir = test::temp_dir();
  test::write(dir / "unknown.json", R"({"model":"llama3.1-8b","colour":1})");
  test::write(dir / "nan.json", R"({"model":"llama3.1-8b","memory_limit_slop":NaN})");
  test::write(dir / "neg.json", R"({"model":"llama3.1-8b","batch":-2})");
  struct Case { std::string args, expect; };
  std::vector<Case> cases = {
      {"simulate --policy bogus", "policy = \"bogus\""},
      {"simulate --tensor mla_q=disk", "--tensor mla_q = \"disk\""},
      {"simulate --tensor warp=device", "--tensor warp = \"device\" (unknown checkpoint name"},
      {"simulate --lhs maybe", "--lhs = \"maybe\""},
      {"simulate --batch two", "--batch = \"two\""},
      {"simulate --config " + (dir / "unknown.json").string(), "unknown.json: colour"},
      {"simulate --config " + (dir / "nan.json").string(), "nan.json: malformed JSON"},
      {"simulate --config " + (dir / "neg.json").string(), "neg.json: batch = -2 (must be > 0)"},
      {"simulate --config " + (dir / "missing.json").string(), "missing.json: file does not exist"},
      {"simulate --config " + dir.string(), "is a directory"},
      {"simulate --weights fp64", "--weights = \"fp64\" (unknown dtype"},
      {"simulate --frobnicate 3", "frobnicate"},
      {"simulate --model deepseek-v3-671b --gpus 128 --ep 64 --batch 3 --moe-batch-split 2",
       "--moe-batch-split = 2 (sequences per model replica, batch x tp x cp = 3, is not divisible by it)"},
      {"simulate --moe-batch-split 2", "--moe-batch-split = 2 (the model has no MoE layers to split)"},
      {"simulate --moe-batch-split 0", "--moe-batch-split = 0 (must be > 0)"},
      {"sweep --axis batch=", "--axis batch= (expected FIELD=v1,v2,...)"},
  };
  for (auto& c : cases) {
    INFO(c.args);
    auto r = test::cli(c.args);
    CHECK(r.status == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE("calibrate measure without a GPU exits non-zero with one clear line and writes nothing", "[cli][calibration]") {
  if (std::system("nvidia-smi -L >/dev/null 2>&1") == 0) SUCCEED("a GPU is visible; the no-GPU path is not testable here");
  else {
    auto out = test::temp_dir() / "never.json";
    auto r = test::cli("calibrate measure -o " + out.string());
    CHECK(r.status == 3);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK((r.err.find("no CUDA device") != std::string::npos || r.err.find("cannot run") != std::string::npos));
    CHECK_FALSE(std::filesystem::exists(out));
  }
  // The status is the one its help states (the other commands' help lists 0, 1 and 2 only).
  CHECK(test::cli("calibrate measure --help").out.find("3 when there is no CUDA device") != std::string::npos);
  CHECK(test::cli("simulate --help").out.find("no CUDA device") == std::string::npos);
}

namespace {

// A copy of a built-in model under a file name that is not UTF-8 (Linux paths are bytes).
std::filesystem::path non_utf8_model(const std::string& stem) {
  auto dir = test::temp_dir() / "non-utf8";
  std::filesystem::create_directories(dir);
  auto path = dir / (stem + "\xff\xfe.json");
  test::write(path, test::slurp(std::filesystem::path(HBMSIM_SOURCE_DIR) / "data" / "models" / "llama3.1-8b.json"));
  return path;
}

}  // namespace

TEST_CASE("a model path that is not UTF-8 gives valid JSON output (the bytes become U+FFFD), never a crash", "[cli]") {
  auto path = non_utf8_model("simulate");
  auto r = test::cli("simulate --model '" + path.string() + "' --gpus 8 --json");
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["config"]["model"].get<std::string>().find("\xef\xbf\xbd") != std::string::npos);  // U+FFFD
  CHECK(j["tflops_per_device"].get<double>() > 0);
}

TEST_CASE("a threaded JSON-lines sweep over a model path that is not UTF-8 writes every row and exits 0", "[cli]") {
  auto path = non_utf8_model("sweep");
  auto r = test::cli("sweep --gpus 8 --axis 'model=" + path.string() + ",llama3.1-8b' --axis batch=1,2 --jobs 4 --format jsonl");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  std::size_t rows = 0;
  std::stringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line);
    CHECK(j.contains("result"));
    ++rows;
  }
  CHECK(rows == 4);
}

TEST_CASE("plan best-policy over a model path that is not UTF-8 runs (its search keys are JSON text)", "[cli]") {
  auto path = non_utf8_model("best");
  auto r = test::cli("plan best-policy --model '" + path.string() + "' --gpus 8 --names query_proj --json");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.out)["evaluated"] == 3);
}

TEST_CASE("a config file above 64 MiB is refused before it is read", "[cli]") {
  auto path = test::temp_dir() / "huge-config.json";
  test::write(path, "{}");
  std::filesystem::resize_file(path, (std::uintmax_t{64} << 20) + 1);  // sparse: nothing is written
  auto r = test::cli("simulate --config " + path.string());
  std::filesystem::remove(path);
  CHECK(r.status == 2);
  CHECK(r.err == "hbmsim: " + path.string() + ": is 67108865 bytes, above the 64 MiB limit for a JSON file\n");
}

TEST_CASE("a sweep whose row callback throws on a worker thread ends with that exception, not std::terminate",
          "[planner]") {
  hbmsim::RunConfig base;
  base.gpus = 8;
  auto points = hbmsim::expand_sweep(base, {{"batch", {"1", "2", "3", "4", "5", "6", "7", "8"}}});
  std::size_t calls = 0;
  auto on_row = [&](const hbmsim::SweepRow&) {
    ++calls;
    throw std::runtime_error("cannot write this row");
  };
  CHECK_THROWS_WITH(hbmsim::run_sweep(points, 4, on_row), "cannot write this row");
  CHECK(calls == 1);  // the sweep stops at the first failure
  CHECK_THROWS_WITH(hbmsim::run_sweep(points, 1025, [](const hbmsim::SweepRow&) {}),
                    "--jobs = 1025 (at most 1024 threads)");
}

TEST_CASE("calibrate fit refuses fewer than one thread in the library too", "[planner]") {
  hbmsim::FitOptions o;
  o.jobs = 0;
  CHECK_THROWS_WITH(hbmsim::fit_parameters({}, hbmsim::load_fit_parameters(), o), "--jobs = 0 (must be >= 1)");
}

TEST_CASE("messages stay one line and print numbers in full", "[hwmodels]") {
  CHECK(std::string(hbmsim::InputError(std::string("a\0b\nc", 5)).what()) == "a\\u0000b\\nc");
  CHECK(hbmsim::quote(std::string("x\"\ty", 4)) == "\"x\\\"\\ty\"");
  CHECK(hbmsim::format_number(1e-300) == "1e-300");
  CHECK(hbmsim::format_number(0.95) == "0.95");
  CHECK(hbmsim::format_number(std::nan("")) == "nan");
  CHECK(hbmsim::dump_json(nlohmann::json(std::string("a\xff"))) == "\"a\xef\xbf\xbd\"");
}

TEST_CASE("plan largest-batch --powers-of-two answers on the grid the measurements used", "[cli][plan]") {
  // Measured on GB200 NVL72 (seed documents): with the selected MLA and MoE activations on device batch 2
  // ran and batch 8 ran out of memory; offloaded, batch 8 ran. Batch 4 was not run. So on the 2^k grid the
  // on-device answer is 2 or 4 and the offloaded one at least 8; every step of the integer search stays below 8.
  const std::string base = "plan largest-batch --model deepseek-v3-671b --gpus 128 --ep 64 --seq 4096 --policy custom "
                           "--tensor mla_q=device --tensor mla_kv=device --tensor moe_mlpwi_0=device "
                           "--tensor moe_mlpwi_1=device --lhs off --max-batch 64 --json";
  auto batch_of = [](const std::string& out, const std::string& prefix) {
    for (auto& v : nlohmann::json::parse(out))
      if (v["variant"].get<std::string>().rfind(prefix, 0) == 0) return v["largest_batch"].get<long>();
    FAIL("no variant " << prefix);
    return -1L;
  };
  auto grid = test::cli(base + " --powers-of-two");
  REQUIRE(grid.status == 0);
  const long on_device = batch_of(grid.out, "device");
  CHECK((on_device == 2 || on_device == 4));
  CHECK(batch_of(grid.out, "offload") >= 8);
  auto exact = test::cli(base);
  REQUIRE(exact.status == 0);
  CHECK(batch_of(exact.out, "device") >= on_device);
  CHECK(batch_of(exact.out, "device") < 8);
}

TEST_CASE("simulate --no-fast-forward simulates every event and reports the same step", "[cli][fast_forward]") {
  const std::string run = "simulate --system h200-hgx --model llama3.1-8b --gpus 8 --batch 2 --seq 4096 --policy full --json";
  auto a = test::cli(run);
  auto b = test::cli(run + " --no-fast-forward");
  REQUIRE(a.status == 0);
  REQUIRE(b.status == 0);
  auto ff = nlohmann::json::parse(a.out), plain = nlohmann::json::parse(b.out);
  CHECK(ff["replayed_iterations"].get<int>() > 0);  // 32 layers: most iterations replayed
  CHECK(plain["replayed_iterations"] == 0);
  CHECK(ff["events"] == plain["events"]);
  CHECK(ff["step_time_s"].get<double>() == Approx(plain["step_time_s"].get<double>()).epsilon(1e-9));
  CHECK(ff["hbm_peak_bytes"].get<double>() == Approx(plain["hbm_peak_bytes"].get<double>()).epsilon(1e-9));
}

TEST_CASE("calibrate fit --corpus-runs fits published rows and predicts each source from the others", "[cli][fit]") {
  auto dir = test::temp_dir();
  // Two Llama 3 8B rows on 8 H100s from two sources (FlagPerf's row 52 and a copy credited elsewhere).
  const std::string header = "src,container,system,gpus,model,prec,seq,mbs,gbs,tp,pp,vp,cp,ep,dp_fsdp,remat_offload,tok_s_gpu,tflops_gpu,step_s,mfu,mem,notes\n";
  test::write(dir / "runs.csv", header +
                                    "FLAG,,H100 SXM,8,Llama3-8B,BF16,8192,1,32,2,1,-,1,-,DP4,,8103,,,,,\n"
                                    "OTHER,,H100 SXM,8,Llama3-8B,BF16,8192,2,32,2,1,-,1,-,DP4,,8000,,,,,\n");
  test::write(dir / "one.json", R"({"parameters": [{"name": "gemm_scale", "lo": 0.6, "hi": 1.3, "initial": 1.0, "meaning": "m"}]})");
  auto r = test::cli("calibrate fit --corpus-runs " + (dir / "runs.csv").string() + " --no-seed-runs --leave-one-source-out --max-evaluations 12 --parameters " +
                     (dir / "one.json").string() + " -o " + (dir / "fitted.json").string());
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("corpus row 1 (FLAG)") != std::string::npos);
  CHECK(r.out.find("MAPE source left out") != std::string::npos);
  CHECK(r.err.find("calibrate fit (without FLAG): evaluation 10") != std::string::npos);
  CHECK(test::slurp((dir / "fitted.json").string()).find("--corpus --no-seed-runs --leave-one-source-out over 2 measured runs") != std::string::npos);
  // Bad input is refused before the corpus is simulated.
  auto bad = test::cli("calibrate fit --corpus --max-evaluations 0");
  CHECK(bad.status == 2);
  CHECK(bad.err.find("--max-evaluations = 0 (must be >= 1)") != std::string::npos);
  test::write(dir / "one_source.csv", header + "FLAG,,H100 SXM,8,Llama3-8B,BF16,8192,1,32,2,1,-,1,-,DP4,,8103,,,,,\n");
  auto one_source = test::cli("calibrate fit --corpus-runs " + (dir / "one_source.csv").string() + " --no-seed-runs --leave-one-source-out");
  CHECK(one_source.status == 2);
  CHECK(one_source.err.find("at least two sources (all 1 come from \"FLAG\")") != std::string::npos);
}
