// hbmsim-calibrate-cuda: measures the local GPU and writes an `hbmsim-profile/1` calibration profile.
// Exit status: 0 success, 4 profile written but a stage failed or was skipped (raw.json says which and why),
// 1 no profile (set-up failed, nothing measured, or a write failed), 2 bad command line, 3 no CUDA device.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <cuda_runtime_api.h>

#include "measure.h"
#include "profile.h"

namespace calib = hbmsim::calib;

namespace {

constexpr const char* kTool = "hbmsim-calibrate-cuda";

void print_usage(std::FILE* to) {
    std::fprintf(to,
                 "usage: %s -o PROFILE.json [--raw RAW.json] [--quick] [--name NAME]\n"
                 "       [--peak-bf16-flops F] [--peak-fp8-flops F] [--shapes SHAPES.json] [--device N]\n"
                 "       [--budget-s S] [--fp8-no-fast-accum]\n"
                 "Measures host-link, HBM, D2D, GEMM (cuBLASLt bf16/fp8), interference and launch cost on one\n"
                 "GPU and writes an hbmsim-profile/1 JSON. SHAPES.json: [[M,N,K], ...] or\n"
                 "[{\"m\":M,\"n\":N,\"k\":K,\"label\":\"...\"}, ...]. Each stage is independent: a failed one is\n"
                 "recorded in RAW.json (stages.NAME.error) and the profile keeps the others' fields. --budget-s skips\n"
                 "the stages not started within S seconds. fp8 GEMMs use fast accumulation unless\n"
                 "--fp8-no-fast-accum.\n"
                 "Exit: 0 every stage ok, 4 profile written but a stage failed or was skipped, 1 no profile (nothing\n"
                 "measured, or a write failed), 2 bad command line, 3 no CUDA device.\n",
                 kTool);
}

bool usage_error(const std::string& msg) {
    std::fprintf(stderr, "%s: %s (see --help)\n", kTool, msg.c_str());
    return false;
}

bool parse_positive(const std::string& flag, const std::string& text, double& out) {
    char* end = nullptr;
    out = std::strtod(text.c_str(), &end);
    if (text.empty() || end == nullptr || *end != '\0' || !(out > 0.0) || out > 1e18) {
        return usage_error(flag + " = " + text + " (must be a positive number of FLOP/s)");
    }
    return true;
}

bool load_shapes(const std::string& path, std::vector<calib::GemmShape>& shapes) {
    std::ifstream in(path);
    if (!in) return usage_error("--shapes " + path + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    const calib::Json j = calib::Json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_array() || j.empty()) {
        return usage_error(path + ": must be a non-empty JSON array of shapes");
    }
    const auto dim = [&](const calib::Json& v, const std::string& where, std::int64_t& out) {
        if (!v.is_number_integer() || v.get<std::int64_t>() <= 0 || v.get<std::int64_t>() > (1 << 20)) {
            return usage_error(path + ": " + where + " = " + v.dump() + " (must be an integer in [1, 1048576])");
        }
        out = v.get<std::int64_t>();
        return true;
    };
    for (std::size_t i = 0; i < j.size(); ++i) {
        const calib::Json& e = j[i];
        const std::string at = "[" + std::to_string(i) + "]";
        calib::GemmShape s;
        if (e.is_array() && e.size() == 3) {
            if (!dim(e[0], at + "[0]", s.m) || !dim(e[1], at + "[1]", s.n) || !dim(e[2], at + "[2]", s.k)) return false;
        } else if (e.is_object()) {
            for (const auto& [key, value] : e.items()) {
                if (key == "m" || key == "n" || key == "k") {
                    if (!dim(value, at + "." + key, key == "m" ? s.m : key == "n" ? s.n : s.k)) return false;
                } else if (key == "label" && value.is_string()) {
                    s.label = value.get<std::string>();
                } else {
                    return usage_error(path + ": " + at + "." + key + " is not a known key (m, n, k, label)");
                }
            }
            if (s.m == 0 || s.n == 0 || s.k == 0) return usage_error(path + ": " + at + " needs m, n and k");
        } else {
            return usage_error(path + ": " + at + " = " + e.dump() + " (must be [M,N,K] or {m,n,k})");
        }
        if (s.label.empty()) s.label = "from " + path;
        shapes.push_back(s);
    }
    return true;
}

// Returns false after printing a usage error; sets `help` for -h/--help.
bool parse_args(int argc, char** argv, calib::Options& opt, bool& help) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        const auto value = [&](std::string& out) {
            if (i + 1 >= args.size()) return usage_error(a + " needs a value");
            out = args[++i];
            return true;
        };
        std::string v;
        if (a == "-h" || a == "--help") {
            help = true;
            return true;
        } else if (a == "-o" || a == "--output") {
            if (!value(opt.output_path)) return false;
        } else if (a == "--raw") {
            if (!value(opt.raw_path)) return false;
        } else if (a == "--name") {
            if (!value(opt.name)) return false;
        } else if (a == "--quick") {
            opt.quick = true;
        } else if (a == "--peak-bf16-flops") {
            if (!value(v) || !parse_positive(a, v, opt.peak_bf16_flops)) return false;
        } else if (a == "--peak-fp8-flops") {
            if (!value(v) || !parse_positive(a, v, opt.peak_fp8_flops)) return false;
        } else if (a == "--fp8-no-fast-accum") {
            opt.fp8_fast_accum = false;
        } else if (a == "--budget-s") {
            if (!value(v)) return false;
            char* end = nullptr;
            opt.budget_s = std::strtod(v.c_str(), &end);
            if (v.empty() || *end != '\0' || !(opt.budget_s > 0.0) || opt.budget_s > 86400.0) {
                return usage_error("--budget-s = " + v + " (must be a positive number of seconds)");
            }
        } else if (a == "--shapes") {
            if (!value(opt.shapes_path)) return false;
        } else if (a == "--device") {
            if (!value(v)) return false;
            char* end = nullptr;
            const long d = std::strtol(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || d < 0 || d > 1024) return usage_error("--device = " + v + " (must be a device index)");
            opt.device = static_cast<int>(d);
        } else {
            return usage_error("unknown argument " + a);
        }
    }
    if (opt.output_path.empty()) return usage_error("-o PROFILE.json is required");
    std::string unwritable;  // found now, not after the measurements
    if (!calib::can_write(opt.output_path, unwritable)) return usage_error(unwritable);
    if (!opt.raw_path.empty() && !calib::can_write(opt.raw_path, unwritable)) return usage_error(unwritable);
    if (!opt.shapes_path.empty()) {
        if (!load_shapes(opt.shapes_path, opt.shapes)) return false;
    } else {
        opt.shapes = calib::default_gemm_shapes();
    }
    return true;
}

std::string join_command_line(int argc, char** argv) {
    std::string out;
    for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        if (a.find_first_of(" \t'\"") != std::string::npos) a = "'" + a + "'";
        out += (i == 0 ? "" : " ") + a;
    }
    return out;
}

std::string utc_now(const char* fmt) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[64] = {};
    std::strftime(buf, sizeof buf, fmt, &tm);
    return buf;
}

std::string hostname() {
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
    return buf;
}

// The kernel module reports the NVIDIA driver version ("570.86.15"); the CUDA API only has its own.
std::string driver_version() {
    std::ifstream in("/proc/driver/nvidia/version");
    std::string line;
    if (in && std::getline(in, line)) {
        std::istringstream words(line);
        std::string w;
        while (words >> w) {
            if (!w.empty() && std::isdigit(static_cast<unsigned char>(w[0])) && w.find('.') != std::string::npos) return w;
        }
    }
    int v = 0;
    if (cudaDriverGetVersion(&v) == cudaSuccess) {
        return "CUDA driver API " + std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
    }
    return "unknown";
}

std::string slug(const std::string& s) {
    std::string out;
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (std::isalnum(u)) {
            out += static_cast<char>(std::tolower(u));
        } else if (!out.empty() && out.back() != '-') {
            out += '-';
        }
    }
    while (!out.empty() && out.back() == '-') out.pop_back();
    return out.empty() ? "gpu" : out;
}

int run(int argc, char** argv) {
    calib::Options opt;
    bool help = false;
    if (!parse_args(argc, argv, opt, help)) return 2;
    if (help) {
        print_usage(stdout);
        return 0;
    }

    // Checked by hand rather than with CALIB_CUDA: this failure is expected on machines without a GPU and
    // must be exactly one line and status 3.
    int device_count = 0;
    const cudaError_t count_err = cudaGetDeviceCount(&device_count);
    if (count_err != cudaSuccess || device_count == 0) {
        std::fprintf(stderr, "%s: no CUDA device available (cudaGetDeviceCount: %s)\n", kTool,
                     count_err != cudaSuccess ? cudaGetErrorString(count_err) : "0 devices");
        return 3;
    }
    if (opt.device >= device_count) {
        usage_error("--device = " + std::to_string(opt.device) + " (only " + std::to_string(device_count) + " visible)");
        return 2;
    }

    opt.command_line = join_command_line(argc, argv);
    int runtime_version = 0;
    if (cudaRuntimeGetVersion(&runtime_version) != cudaSuccess) runtime_version = 0;
    calib::Measurements m;
    m.date = utc_now("%Y-%m-%dT%H:%M:%SZ");
    m.driver = driver_version();
    m.cuda = std::to_string(runtime_version / 1000) + "." + std::to_string((runtime_version % 1000) / 10);
    const std::string host = hostname();

    calib::Json raw;
    raw["format"] = "hbmsim-calibrate-cuda-raw/1";
    raw["command_line"] = opt.command_line;
    raw["date"] = m.date;
    raw["device"] = {{"index", opt.device}, {"device_count", device_count}, {"hostname", host},
                     {"driver", m.driver}, {"cuda_runtime", m.cuda}};

    const auto write_raw = [&](std::string& err) {
        return opt.raw_path.empty() || calib::write_file_atomically(opt.raw_path, raw.dump(2) + "\n", err);
    };
    std::string error;
    if (!calib::run_measurements(opt, m, raw)) {
        std::fprintf(stderr, "%s: set-up failed; nothing measured, no profile written%s%s\n", kTool,
                     opt.raw_path.empty() ? "" : " (stages in ", opt.raw_path.empty() ? "" : (opt.raw_path + ")").c_str());
        if (!write_raw(error)) std::fprintf(stderr, "%s: %s\n", kTool, error.c_str());
        return 1;
    }
    const std::string cc = raw["device"]["compute_capability"].get<std::string>();
    m.name = opt.name.empty() ? slug(m.gpu) + "-measured-" + m.date.substr(0, 10) : opt.name;
    m.compute_capability = cc;
    m.hostname = host;
    m.source = opt.command_line + " (" + kTool + ", " + m.date + ", host " + host + ", " + m.gpu + " sm_" +
               cc.substr(0, cc.find('.')) + cc.substr(cc.find('.') + 1) + ")";

    calib::Json derivation;
    const auto profile = calib::build_profile(m, derivation, error);
    raw["derivation"] = derivation;
    if (!profile) {
        raw["profile_error"] = error;
        std::fprintf(stderr, "%s: cannot build the profile: %s\n", kTool, error.c_str());
        std::string werr;
        if (!write_raw(werr)) std::fprintf(stderr, "%s: %s\n", kTool, werr.c_str());
        return 1;
    }
    raw["profile"] = *profile;
    if (!write_raw(error)) {
        std::fprintf(stderr, "%s: %s\n", kTool, error.c_str());
        return 1;
    }
    if (!calib::write_file_atomically(opt.output_path, profile->dump(2) + "\n", error)) {
        std::fprintf(stderr, "%s: %s\n", kTool, error.c_str());
        return 1;
    }
    const calib::Json& pr = *profile;
    const auto num = [&](const calib::Json& j, const char* key) {
        return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
    };
    const calib::Json none = calib::Json::object();
    const calib::Json& hl = pr.contains("host_link") ? pr["host_link"] : none;
    const calib::Json& itf = pr.contains("interference") ? pr["interference"] : none;
    std::printf("%s: wrote %s%s%s\n", kTool, opt.output_path.c_str(), opt.raw_path.empty() ? "" : " and ",
                opt.raw_path.c_str());
    std::printf("  gpu %s (sm %s), driver %s, CUDA %s\n", m.gpu.c_str(), cc.c_str(), m.driver.c_str(), m.cuda.c_str());
    std::printf("  h2d %.1f GB/s, d2h %.1f GB/s, bidirectional %.1f GB/s, copy latency %.2f us\n",
                num(hl, "h2d_bytes_per_s") / 1e9, num(hl, "d2h_bytes_per_s") / 1e9,
                num(hl, "bidirectional_total_bytes_per_s") / 1e9, num(hl, "latency_s") * 1e6);
    std::printf("  hbm %.0f GB/s, d2d %.0f GB/s, launch %.2f us, slowdown during copy %.3f (0 = not measured)\n",
                num(pr, "hbm_bandwidth_bytes_per_s") / 1e9, num(pr, "d2d_bandwidth_bytes_per_s") / 1e9,
                num(pr, "launch_overhead_s") * 1e6, num(itf, "compute_slowdown_during_copy"));
    for (const auto& [dtype, pts] : {std::pair{"bf16", &m.gemm_bf16}, std::pair{"fp8", &m.gemm_fp8}}) {
        double best = 0.0;
        for (const auto& p : *pts) best = std::max(best, p.x / p.median_s);
        if (best > 0.0) std::printf("  best %s GEMM %.0f TFLOP/s\n", dtype, best / 1e12);
    }
    int not_ok = 0;
    std::string stages;
    for (const auto& [name, st] : raw["stages"].items()) {
        const std::string status = st.value("status", "?");
        stages += (stages.empty() ? "" : ", ") + name + " " + status;
        // A stage the GPU cannot run (fp8 before sm_89) is not a failure of the run.
        if (status != "ok" && st.value("reason", "").find("compute capability") == std::string::npos) ++not_ok;
    }
    std::printf("  stages: %s\n", stages.c_str());
    std::printf("  measurement took %.1f s\n", raw["measurement_wall_s"].get<double>());
    return not_ok == 0 ? 0 : 4;
}

}  // namespace

int main(int argc, char** argv) {
    // No exception may escape (JSON or allocation failures): report it and exit 1.
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: internal error: %s\n", kTool, e.what());
    } catch (...) {
        std::fprintf(stderr, "%s: internal error: unknown exception\n", kTool);
    }
    return 1;
}
