// What a user reads: the resolved run in every report, warnings on stderr, --version, help per command.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <sstream>

#include "helpers.hpp"

namespace {

nlohmann::json json_of(const test::CliResult& r) {
  INFO(r.err);
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(r.out);
}

bool has_line(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

}  // namespace

TEST_CASE("simulate prints the run as resolved: GPUs, layout, batch, global batch, seq, schedule, calibration", "[cli][output]") {
  auto r = test::cli("simulate --system gb200-nvl72 --model llama3.1-70b --gpus 64 --tp 4 --batch 2 --seq 2048 --lhs off");
  INFO(r.err);
  REQUIRE(r.status == 0);
  // By hand: 64 GPUs over tp 4 leave fsdp 16; MaxText batch 2 per device, a tp group of 4 devices runs
  // 2 x 4 = 8 sequences, the step 2 x 64 = 128.
  CHECK(has_line(r.out, "run          llama3.1-70b on 64 x gb200-nvl72 GPUs"));
  CHECK(has_line(r.out, "layout       fsdp 16 x tp 4 (maxtext order)"));
  CHECK(has_line(r.out, "batch        2 per device, 8 per model replica, global 128 sequences (grad accum 1), seq 2048"));
  CHECK(has_line(r.out, "policy       full; weights bf16, attention bf16"));
  CHECK(has_line(r.out, "schedule     LHS off, pipelined collectives on, pipelined transfers off, double buffering off"));
  CHECK(has_line(r.out, "calibration  datasheet (uncalibrated)"));
  CHECK(r.err.empty());
}

TEST_CASE("simulate --json carries the resolved run and the fsdp degree the GPUs left", "[cli][output]") {
  auto j = json_of(test::cli("simulate --model llama3.1-8b --gpus 32 --tp 2 --cp 2 --json"));
  // 32 / (tp 2 x cp 2) = 8: the "0: the rest" of the input is resolved in both objects.
  CHECK(j["config"]["fsdp"] == 8);
  CHECK(j["run"]["degrees"]["fsdp"] == 8);
  CHECK(j["run"]["degrees"]["tp"] == 2);
  CHECK(j["run"]["gpus"] == 32);
  CHECK(j["run"]["global_batch"] == 32);  // batch 1 per device x 32 GPUs
  CHECK(j["run"]["calibration_text"] == "datasheet (uncalibrated)");
  CHECK(j["warnings"].empty());
  // Fed back, the resolved config is the same run.
  auto path = test::temp_dir() / "resolved.json";
  test::write(path, j["config"].dump());
  auto again = json_of(test::cli("simulate --config " + path.string() + " --json"));
  CHECK(again["step_time_s"] == j["step_time_s"]);
}

TEST_CASE("a calibration profile is named with the system it was fitted on, and warned about elsewhere", "[cli][output]") {
  auto own = test::cli("simulate --system gb200-nvl72 --calibration gb200-fitted --model llama3.1-8b");
  REQUIRE(own.status == 0);
  CHECK(has_line(own.out, "calibration  gb200-fitted (fitted on gb200-nvl72)"));
  CHECK(own.err.empty());
  auto other = test::cli("simulate --system vr-nvl144 --calibration gb200-fitted --model llama3.1-8b");
  REQUIRE(other.status == 0);  // a warning never changes the exit status
  CHECK(has_line(other.out, "calibration  gb200-fitted (fitted on gb200-nvl72)"));
  CHECK(has_line(other.err, "hbmsim: warning: calibration gb200-fitted was fitted on gb200-nvl72 and is applied to "
                            "vr-nvl144 as a what-if"));
}

TEST_CASE("an MoE model on several GPUs with ep 1 gets a one-line warning, with ep it gets none", "[cli][output]") {
  const std::string run = "simulate --model deepseek-v3-671b --gpus 256 --seq 1024 --json";
  auto without = test::cli(run);
  REQUIRE(without.status == 0);
  // One line; the largest ep that divides both 256 experts and 256 GPUs is 256.
  CHECK(std::count(without.err.begin(), without.err.end(), '\n') == 1);
  CHECK(without.err.rfind("hbmsim: warning: deepseek-v3-671b is a mixture of experts run with ep 1 on 256 GPUs", 0) == 0);
  CHECK(without.err.find("up to 256") != std::string::npos);
  CHECK(nlohmann::json::parse(without.out)["warnings"].size() == 1);
  auto with = test::cli(run + " --ep 64");
  REQUIRE(with.status == 0);
  CHECK(with.err.empty());
}

TEST_CASE("a what-if an order of magnitude off the hardware is warned about in its units", "[cli][output]") {
  // 298 bytes where 298 GB was meant: 298 / 284,208 MiB (2.98e11 bytes) = 1e-9 of the VR figure.
  auto r = test::cli("simulate --system vr-nvl144 --model llama3.1-8b --hbm-bytes 298");
  REQUIRE(r.status == 0);
  CHECK(has_line(r.err, "hbmsim: warning: hbm_bytes = 298 bytes is 1e-09 x the vr-nvl144 figure (2.98e+11 bytes); "
                        "the field is in bytes"));
  CHECK(r.out.find("fits                        NO") != std::string::npos);
  CHECK(r.out.find("GiB of 298 bytes at t=") != std::string::npos);  // not "of 0.0 GiB"
  // 1.5e11 bytes on a 199 GB GB200 is a plausible what-if: no warning.
  auto fine = test::cli("simulate --system gb200-nvl72 --model llama3.1-8b --hbm-bytes 1.5e11");
  REQUIRE(fine.status == 0);
  CHECK(fine.err.empty());
  // 1600 where ConnectX-9's 1.6 Tb/s was meant: 1600 / 2e11 bytes/s = 8e-9 of the VR NIC figure per GPU.
  auto nic = test::cli("simulate --system vr-nvl144 --model llama3.1-8b --scale-out-bw 1600");
  REQUIRE(nic.status == 0);
  CHECK(has_line(nic.err, "hbmsim: warning: scale_out_bytes_per_s = 1600 bytes/s is 8e-09 x the vr-nvl144 figure "
                          "(2e+11 bytes/s); the field is in bytes/s"));
}

TEST_CASE("lhs off under framework megatron is warned about: it changes nothing there", "[cli][output]") {
  auto off = test::cli("simulate --model llama3.1-8b --gpus 8 --tp 8 --framework megatron --lhs off --json");
  auto on = test::cli("simulate --model llama3.1-8b --gpus 8 --tp 8 --framework megatron --json");
  REQUIRE(off.status == 0);
  REQUIRE(on.status == 0);
  CHECK(has_line(off.err, "hbmsim: warning: lhs = off does not apply to framework megatron: Megatron runs a layer in "
                          "program order, with no latency-hiding scheduler to turn off"));
  CHECK(on.err.empty());
  CHECK(nlohmann::json::parse(off.out)["step_time_s"] == nlohmann::json::parse(on.out)["step_time_s"]);
}

TEST_CASE("hbmsim --version prints the project version, bare hbmsim and bare plan print their help", "[cli][output]") {
  // The version as the top-level CMakeLists.txt declares it.
  std::ifstream cm(std::string(HBMSIM_SOURCE_DIR) + "/CMakeLists.txt");
  std::string text((std::istreambuf_iterator<char>(cm)), std::istreambuf_iterator<char>());
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex(R"(project\(hbmsim VERSION ([0-9.]+))")));
  auto v = test::cli("--version");
  CHECK(v.status == 0);
  CHECK(v.out == "hbmsim " + m[1].str() + "\n");

  auto bare = test::cli("");
  CHECK(bare.status == 0);
  CHECK(bare.out.find("Subcommands:") != std::string::npos);
  CHECK(bare.out.find("simulate") != std::string::npos);
  auto plan = test::cli("plan");
  CHECK(plan.status == 0);
  CHECK(plan.out.find("largest-batch") != std::string::npos);
}

TEST_CASE("each command's help shows its own examples and the options' defaults", "[cli][output]") {
  auto sim = test::cli("simulate --help");
  REQUIRE(sim.status == 0);
  CHECK(sim.out.find("hbmsim simulate --model llama3.1-70b") != std::string::npos);
  CHECK(sim.out.find("hbmsim sweep") == std::string::npos);
  CHECK(sim.out.find("--gpus INT") != std::string::npos);
  CHECK(sim.out.find("(default 8)") != std::string::npos);
  auto sweep = test::cli("sweep --help");
  CHECK(sweep.out.find("--resume") != std::string::npos);
  CHECK(sweep.out.find("hbmsim sweep --model deepseek-v3-671b") != std::string::npos);
  CHECK(sweep.out.find("hbmsim simulate") == std::string::npos);
}

TEST_CASE("plan commands print the base run they searched from", "[cli][output]") {
  auto r = test::cli("plan hbm-needed --model llama3.1-8b --gpus 8 --batch 2");
  REQUIRE(r.status == 0);
  CHECK(has_line(r.out, "run          llama3.1-8b on 8 x gb200-nvl72 GPUs"));
  CHECK(has_line(r.out, "calibration  datasheet (uncalibrated)"));
}

TEST_CASE("best-policy that fits nothing at the default batch names the smaller batches the layout runs", "[cli][output]") {
  // Llama 3.1 70B at tp 8 on 16 H100s: batch 1 per device is 8 sequences per replica and fits no placement;
  // one sequence per replica is 1/8 per device.
  auto r = test::cli("plan best-policy --model llama3.1-70b --system h100-hgx --gpus 16 --tp 8 --seq 8192 --names query_proj");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(has_line(r.out, "no placement fits"));
  CHECK(has_line(r.out, "smaller batches run: from 0.125 per device (one sequence per model replica's micro-batch); try --batches "
                        "0.125,0.25 or plan largest-batch"));
}

TEST_CASE("a pipelined MaxText batch is printed as given: per device per step, then the micro-batch", "[cli][output]") {
  auto r = test::cli("simulate --model llama3.1-8b --gpus 16 --tp 2 --pp 2 --batch 1");
  INFO(r.err);
  REQUIRE(r.status == 0);
  // By hand: a replica spans tp 2 x pp 2 = 4 devices, so batch 1 gives it 4 sequences per step, split into pp = 2
  // micro-batches of 2; 16 / 4 = 4 replicas, global 1 x 16 = 16. (It had printed "0.5 per device": per micro-step.)
  CHECK(has_line(r.out, "batch        1 per device per step, micro-batch 2 per model replica, global 16 sequences (2 micro-batches), seq 4096"));
}

TEST_CASE("a Megatron batch is printed in Megatron's terms: micro-batch per replica, global batch, accumulation", "[cli][output]") {
  auto r = test::cli("simulate --model llama3.1-8b --gpus 16 --tp 2 --micro-batch 2 --global-batch 64");
  INFO(r.err);
  REQUIRE(r.status == 0);
  // 16 GPUs / tp 2 = 8 replicas; accumulation = 64 / (2 x 8) = 4.
  CHECK(has_line(r.out, "batch        micro-batch 2 per model replica, global 64 sequences (grad accum 4), seq 4096"));
}

TEST_CASE("a table's prose column starts under its header on every row and no line is padded out", "[cli][output]") {
  auto r = test::cli("fields");
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::istringstream in(r.out);
  std::string header, rule, line;
  std::getline(in, header);
  std::getline(in, rule);
  const auto column = header.find("meaning");
  REQUIRE(column != std::string::npos);
  // The rule ends where the header does: the last column is as wide as its header, not its longest meaning.
  CHECK(rule.size() == header.size());
  int rows = 0;
  while (std::getline(in, line)) {
    INFO(line);
    ++rows;
    // Each row's meaning is left-aligned at the header's column (a space before it, text from it) and the
    // line ends with it: no trailing blanks.
    REQUIRE(line.size() > column);
    CHECK(line[column - 1] == ' ');
    CHECK(line[column] != ' ');
    CHECK(line.back() != ' ');
  }
  CHECK(rows == static_cast<int>(hbmsim::RunConfig::fields().size()));
}

TEST_CASE("a run that fits prints no blanks after its verdict", "[cli][output]") {
  auto r = test::cli("simulate --model llama3.1-8b --gpus 8");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(has_line(r.out, "fits                       yes"));
}

TEST_CASE("best-policy says what its winner trades: recompute time against the wait on host copies", "[cli][output]") {
  auto r = test::cli("plan best-policy --model llama3.1-8b --system h100-hgx --gpus 8 --batch 2 --seq 4096 --names query_proj,mlpwo --pareto");
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("\n  step ([0-9.]+) s: recompute ([0-9.]+) s, waiting on host copies ([0-9.]+) s\n")));
  const double step = std::stod(m[1]), recompute = std::stod(m[2]), copies = std::stod(m[3]);
  // The same placement simulated on its own, from the settings the plan printed.
  std::smatch c;
  REQUIRE(std::regex_search(r.out, c, std::regex("simulate --config JSON: (\\{[^\n]*\\})")));
  auto dir = test::temp_dir();
  test::write(dir / "winner.json", c[1]);
  auto s = test::cli("simulate --config " + (dir / "winner.json").string() + " --json");
  REQUIRE(s.status == 0);
  const auto j = nlohmann::json::parse(s.out);
  CHECK(step == Approx(j["step_time_s"].get<double>()).margin(0.0005));
  CHECK(recompute == Approx(j["compute_s"]["recompute"].get<double>()).margin(0.0005));
  CHECK(copies == Approx(j["exposed_s"]["d2h"].get<double>() + j["exposed_s"]["h2d"].get<double>()).margin(0.0005));
  CHECK(r.out.find("recompute s  copies exposed s") != std::string::npos);  // the Pareto table's columns
}

TEST_CASE("largest-batch says what each variant trades at its largest batch: recompute against copy waits", "[cli][output]") {
  const std::string args = "plan largest-batch --model llama3.1-8b --system h100-hgx --gpus 8 --seq 4096 --max-batch 8";
  auto text = test::cli(args), json = test::cli(args + " --json");
  INFO(text.err << json.err);
  REQUIRE(text.status == 0);
  REQUIRE(json.status == 0);
  const auto doc = nlohmann::json::parse(json.out);
  REQUIRE(doc.size() >= 3);
  for (const auto& v : doc) {
    const std::string label = v["variant"];
    INFO(label);
    REQUIRE(v.contains("report"));
    // The variant's row: its label, then the batch columns, TFLOP/s, HBM, recompute s, copies exposed s.
    std::smatch m;
    REQUIRE(std::regex_search(text.out, m, std::regex("\n" + label + " +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +([0-9.]+) +([0-9.]+) ")));
    const auto& r = v["report"];
    CHECK(std::stod(m[1]) == Approx(r["compute_s"]["recompute"].get<double>()).margin(0.0005));
    CHECK(std::stod(m[2]) == Approx(r["exposed_s"]["d2h"].get<double>() + r["exposed_s"]["h2d"].get<double>()).margin(0.0005));
  }
}
