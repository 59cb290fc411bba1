#include <catch2/catch.hpp>

#include "helpers.hpp"

TEST_CASE("systems --json lists the five systems with HBM, peak FLOP/s and host-link bandwidth", "[cli]") {
  auto r = test::cli("systems --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.size() == 5);
  std::map<std::string, nlohmann::json> by;
  for (auto& s : j) by[s["id"]] = s;
  CHECK(by["gb200-nvl72"]["hbm_bytes"] == 186e9);
  CHECK(by["gb200-nvl72"]["dense_peak_flops"]["bf16"] == 2.5e15);
  CHECK(by["gb200-nvl72"]["dense_peak_flops"]["nvfp4"] == 10e15);
  CHECK(by["gb200-nvl72"]["host_link_per_direction_bytes_per_s"] == 450e9);
  CHECK(by["gb200-nvl72"]["host_h2d_bytes_per_s_per_gpu"] == 176e9);
  CHECK(by["gb300-nvl72"]["host_d2h_bytes_per_s_per_gpu"] == 193.5e9);
  CHECK(by["vr-nvl144"]["host_link_per_direction_bytes_per_s"] == 900e9);
  CHECK(by["h100-hgx"]["hbm_bytes"] == 80e9);
  CHECK(by["h200-hgx"]["dense_peak_flops"]["bf16"] == 989e12);
  CHECK_FALSE(by["h200-hgx"]["dense_peak_flops"].contains("nvfp4"));
}

TEST_CASE("simulate --json prints the documented fields and a config file is overridden by flags", "[cli]") {
  auto dir = test::temp_dir();
  test::write(dir / "run.json", R"({"system":"h200-hgx","model":"llama3.1-8b","gpus":8,"batch":2,"seq":4096,"policy":"full"})");
  auto a = test::cli("simulate --config " + (dir / "run.json").string() + " --json");
  REQUIRE(a.status == 0);
  auto j = nlohmann::json::parse(a.out);
  for (auto key : {"step_time_s", "tflops_per_device", "model_flops_per_device", "mfu", "fits", "hbm_peak_bytes",
                   "hbm_capacity_bytes", "hbm_breakdown_bytes", "host_peak_bytes", "host_capacity_bytes", "exposed_s"})
    CHECK(j.contains(key));
  CHECK(j["config"]["batch"] == 2);
  auto b = test::cli("simulate --config " + (dir / "run.json").string() + " --batch 4 --json");
  REQUIRE(b.status == 0);
  auto k = nlohmann::json::parse(b.out);
  CHECK(k["config"]["batch"] == 4);
  CHECK(k["config"]["policy"] == "full");
  CHECK(k["model_flops_per_device"].get<double>() == Approx(2 * j["model_flops_per_device"].get<double>()));
}

TEST_CASE("a plan that does not fit is a result with exit status 0", "[cli]") {
  auto r = test::cli("simulate --system h100-hgx --model llama3.1-70b --gpus 8 --batch 16 --seq 8192 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["fits"] == false);
  CHECK(j["hbm_peak_bytes"].get<double>() > j["hbm_capacity_bytes"].get<double>());
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
      {"simulate --tensor warp=device", "--tensor warp (unknown checkpoint name"},
      {"simulate --lhs maybe", "--lhs = \"maybe\""},
      {"simulate --batch two", "--batch = \"two\""},
      {"simulate --config " + (dir / "unknown.json").string(), "unknown.json: colour"},
      {"simulate --config " + (dir / "nan.json").string(), "nan.json: malformed JSON"},
      {"simulate --config " + (dir / "neg.json").string(), "neg.json: batch = -2 (must be > 0)"},
      {"simulate --config " + (dir / "missing.json").string(), "missing.json: file does not exist"},
      {"simulate --config " + dir.string(), "is a directory"},
      {"simulate --weights fp64", "unknown dtype 'fp64'"},
      {"simulate --frobnicate 3", "frobnicate"},
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
}
