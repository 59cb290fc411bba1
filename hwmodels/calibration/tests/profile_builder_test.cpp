// CPU-only test of the profile builder: synthetic measurements in, a valid hbmsim-profile/1 out.
// Usage: hbmsim-calibrate-profile-test SCRATCH_DIR
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "profile.h"

namespace calib = hbmsim::calib;
using calib::Json;

namespace {

int failures = 0;

#define EXPECT(cond)                                                            \
    do {                                                                        \
        if (!(cond)) {                                                          \
            std::fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                         \
        }                                                                       \
    } while (0)

bool near(double a, double b, double rel) { return std::abs(a - b) <= rel * std::abs(b); }

// Keys allowed by docs/calibration-profile.md; anything else would be rejected by the loader.
void expect_only_known_keys(const Json& p) {
    const std::set<std::string> top = {"format", "name", "source", "metadata", "host_link",
                                       "hbm_bandwidth_bytes_per_s", "d2d_bandwidth_bytes_per_s",
                                       "launch_overhead_s", "interference", "efficiency", "parameters"};
    // metadata is a map of strings (hwmodels/profile.cpp); these are the keys the tool writes.
    const std::set<std::string> metadata = {"gpu", "driver", "cuda", "date", "compute_capability", "hostname"};
    const std::set<std::string> host_link = {"h2d_bytes_per_s", "d2h_bytes_per_s",
                                             "bidirectional_total_bytes_per_s", "latency_s"};
    const std::set<std::string> eff = {"gemm", "attention", "memory_bound", "copy", "collective"};
    const std::set<std::string> gemm = {"bf16", "fp8", "nvfp4"};
    // A partial profile (a failed stage) leaves whole sections out.
    const Json none = Json::object();
    const auto section = [&](const Json& j, const char* key) -> const Json& { return j.contains(key) ? j[key] : none; };
    for (const auto& [k, v] : p.items()) EXPECT(top.count(k) == 1);
    for (const auto& [k, v] : section(p, "metadata").items()) EXPECT(metadata.count(k) == 1 && v.is_string());
    for (const auto& [k, v] : section(p, "host_link").items()) EXPECT(host_link.count(k) == 1);
    for (const auto& [k, v] : section(p, "interference").items()) EXPECT(k == "compute_slowdown_during_copy");
    for (const auto& [k, v] : section(p, "efficiency").items()) EXPECT(eff.count(k) == 1);
    for (const auto& [k, v] : section(section(p, "efficiency"), "gemm").items()) EXPECT(gemm.count(k) == 1);
}

void expect_valid_table(const Json& t) {
    EXPECT(t.is_array() && !t.empty());
    double prev = 0.0;
    for (const Json& e : t) {
        EXPECT(e.is_array() && e.size() == 2);
        const double x = e[0].get<double>(), f = e[1].get<double>();
        EXPECT(x > prev);
        EXPECT(f > 0.0 && f <= 1.0);
        prev = x;
    }
}

calib::Measurements synthetic() {
    calib::Measurements m;
    m.name = "test-gpu-measured";
    m.source = "profile_builder_test";
    m.gpu = "NVIDIA H200";
    m.driver = "570.86.15";
    m.cuda = "13.0";
    m.date = "2026-11-30T00:00:00Z";
    m.compute_capability = "9.0";
    m.hostname = "test-host";
    // Copies follow time = 10 us + bytes / 50 GB/s exactly, so the fit must recover both.
    for (double s = 4096; s <= 1073741824.0; s *= 4) {
        m.h2d_pinned.push_back({s, 10e-6 + s / 50e9});
        m.d2h_pinned.push_back({s, 12e-6 + s / 48e9});
        m.bidirectional.push_back({s, 15e-6 + s / 45e9});
    }
    for (double b = 49152; b <= 3.3e9; b *= 4) m.streaming.push_back({b, 3e-6 + b / 4.2e12});
    m.d2d = {{16777216.0, 1e-5}, {1073741824.0, 1073741824.0 / 3.9e12}};
    m.launch_overhead_s = 3e-6;
    m.interference_measured = true;
    m.slowdown_during_h2d = -0.01;  // noise: must clamp to 0
    m.slowdown_during_d2h = 0.02;
    // bf16: the largest GEMM beats the stated peak (1000 TFLOP/s vs 989): must clamp to 1 and say so.
    m.gemm_bf16 = {{1.07e9, 1.07e9 / 200e12}, {6.9e10, 6.9e10 / 600e12}, {1.3e13, 1.3e13 / 1000e12}};
    m.peak_bf16_flops_per_s = 989e12;
    // fp8 with an unknown peak and a duplicate x: best rate becomes the peak, duplicates are averaged.
    m.gemm_fp8 = {{1e12, 1e12 / 1200e12}, {1e10, 1e10 / 300e12}, {1e10, 1e10 / 500e12}};
    m.peak_fp8_flops_per_s = 0.0;
    return m;
}

void test_profile(const std::filesystem::path& dir) {
    Json derivation;
    std::string error;
    const auto p = calib::build_profile(synthetic(), derivation, error);
    EXPECT(p.has_value());
    if (!p) {
        std::fprintf(stderr, "build_profile: %s\n", error.c_str());
        return;
    }
    EXPECT((*p)["format"] == "hbmsim-profile/1");
    expect_only_known_keys(*p);
    const Json& hl = (*p)["host_link"];
    EXPECT(near(hl["h2d_bytes_per_s"].get<double>(), 1073741824.0 / (10e-6 + 1073741824.0 / 50e9), 1e-12));
    EXPECT(near(hl["latency_s"].get<double>(), 11e-6, 1e-6));  // mean of the two fitted intercepts
    EXPECT(hl["bidirectional_total_bytes_per_s"].get<double>() > hl["h2d_bytes_per_s"].get<double>());
    EXPECT((*p)["interference"]["compute_slowdown_during_copy"].get<double>() == 0.02);
    EXPECT((*p)["launch_overhead_s"].get<double>() == 3e-6);
    const Json& eff = (*p)["efficiency"];
    for (const char* t : {"memory_bound", "copy"}) expect_valid_table(eff[t]);
    expect_valid_table(eff["gemm"]["bf16"]);
    expect_valid_table(eff["gemm"]["fp8"]);
    EXPECT(eff["gemm"]["bf16"].back()[1].get<double>() == 1.0);
    EXPECT(derivation["gemm_bf16"]["points"].back()["clamped"] == true);
    EXPECT(eff["gemm"]["fp8"].size() == 2);
    // The launch overhead (3 us) comes out of each time before the fraction: the simulator adds it back.
    const double fp8_a = 1e10 / (1e10 / 300e12 - 3e-6) / 1200e12, fp8_b = 1e10 / (1e10 / 500e12 - 3e-6) / 1200e12;
    EXPECT(near(eff["gemm"]["fp8"][0][1].get<double>(), 0.5 * (fp8_a + fp8_b), 1e-12));
    EXPECT(derivation["gemm_fp8"]["launch_overhead_subtracted_s"].get<double>() == 3e-6);
    EXPECT(eff["gemm"]["fp8"][1][1].get<double>() == 1.0);
    EXPECT(eff["memory_bound"].back()[1].get<double>() == 1.0);
    EXPECT(eff["copy"].back()[1].get<double>() == 1.0);
    // 4 KiB H2D takes less than the combined latency: its net time is floored, not negative.
    EXPECT(eff["copy"][0][1].get<double>() > 0.0 && eff["copy"][0][1].get<double>() < 0.5);
    EXPECT(!derivation["copy"]["net_time_floored_at_x"].empty() && derivation["copy"]["net_time_floored_at_x"][0] == 4096.0);
    EXPECT(near(derivation["copy"]["latency_subtracted_s"].get<double>(), 11e-6, 1e-6));
    // No double counting: what the simulator computes for a streaming op (bytes / (hbm * fraction) plus the
    // launch overhead it adds to every op) is the measured time, not the measured time plus another launch.
    {
        const calib::Measurements sm = synthetic();
        const double hbm = (*p)["hbm_bandwidth_bytes_per_s"].get<double>();
        const Json& t = eff["memory_bound"];
        EXPECT(t.size() == sm.streaming.size());
        for (std::size_t i = 0; i < sm.streaming.size() && i < t.size(); ++i) {
            const double predicted = sm.streaming[i].x / (hbm * t[i][1].get<double>()) + sm.launch_overhead_s;
            // Within 1%, or at most kMinKernelShare above where the net time was floored (the tiny sizes).
            if (!near(predicted, sm.streaming[i].median_s, 1e-2) &&
                !(predicted >= sm.streaming[i].median_s && predicted <= (1.0 + calib::kMinKernelShare) * sm.streaming[i].median_s)) {
                std::fprintf(stderr, "streaming %g bytes: predicted %g s, measured %g s\n", sm.streaming[i].x, predicted,
                             sm.streaming[i].median_s);
                ++failures;
            }
        }
    }

    // Atomic write: the file appears, the .tmp does not stay, a bad directory is an error, not a crash.
    const std::string path = (dir / "profile.json").string();
    EXPECT(calib::write_file_atomically(path, p->dump(2), error));
    EXPECT(std::filesystem::exists(path));
    EXPECT(!std::filesystem::exists(path + ".tmp"));
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT(Json::parse(ss.str()) == *p);
    EXPECT(!calib::write_file_atomically((dir / "missing" / "x.json").string(), "{}", error));
    EXPECT(!error.empty());
}

void test_helpers() {
    EXPECT(calib::median({3.0, 1.0, 2.0}) == 2.0);
    EXPECT(calib::median({4.0, 1.0, 2.0, 3.0}) == 2.5);
    const calib::LinearFit fit = calib::fit_latency({{4096, 1e-5 + 4096 / 2e10}, {65536, 1e-5 + 65536 / 2e10}});
    EXPECT(fit.ok && near(fit.latency_s, 1e-5, 1e-9) && near(fit.bytes_per_s, 2e10, 1e-9));
    EXPECT(!calib::fit_latency({{4096, 2e-5}, {65536, 1e-5}}).ok);  // negative slope: fall back
    EXPECT(calib::peak_from_device_name("NVIDIA H200").bf16_flops_per_s == 989e12);
    EXPECT(calib::peak_from_device_name("NVIDIA H100 80GB HBM3").fp8_flops_per_s == 1979e12);
    EXPECT(calib::peak_from_device_name("NVIDIA GB200").bf16_flops_per_s == 2.5e15);
    EXPECT(calib::peak_from_device_name("NVIDIA B200").fp8_flops_per_s == 5e15);
    EXPECT(calib::peak_from_device_name("NVIDIA H100 PCIe").bf16_flops_per_s == 0.0);
    EXPECT(calib::peak_from_device_name("NVIDIA A100-SXM4-80GB").bf16_flops_per_s == 0.0);

    // A failed stage leaves its part out; the rest still makes a profile, and the derivation names the gap.
    calib::Measurements m = synthetic();
    m.streaming.clear();
    m.gemm_fp8.clear();
    m.interference_measured = false;
    Json d;
    std::string error;
    const auto partial = calib::build_profile(m, d, error);
    EXPECT(partial.has_value());
    if (partial) {
        expect_only_known_keys(*partial);
        EXPECT(!partial->contains("hbm_bandwidth_bytes_per_s") && !partial->contains("interference"));
        EXPECT(!(*partial)["efficiency"].contains("memory_bound"));
        EXPECT(!(*partial)["efficiency"]["gemm"].contains("fp8") && (*partial)["efficiency"]["gemm"].contains("bf16"));
        EXPECT(partial->contains("host_link") && partial->contains("launch_overhead_s"));
        EXPECT(d["not_in_profile"].size() == 3);
    }
    // Without a launch overhead nothing is subtracted, and the profile has no launch_overhead_s.
    m = synthetic();
    m.launch_overhead_s = 0.0;
    const auto no_launch = calib::build_profile(m, d, error);
    EXPECT(no_launch.has_value() && !no_launch->contains("launch_overhead_s"));
    if (no_launch) EXPECT(d["gemm_bf16"]["launch_overhead_subtracted_s"].get<double>() == 0.0);
    // Nothing measured at all: an error, not an empty profile.
    calib::Measurements none;
    none.name = "x";
    error.clear();
    EXPECT(!calib::build_profile(none, d, error).has_value() && !error.empty());
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    try {
        const std::filesystem::path dir = argv[1];
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
        test_helpers();
        test_profile(dir);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "exception: %s\n", e.what());
        return 1;
    }
    if (failures != 0) {
        std::fprintf(stderr, "%d expectation(s) failed\n", failures);
        return 1;
    }
    std::printf("profile builder test: all expectations passed\n");
    return 0;
}
