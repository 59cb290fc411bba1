// Turns medians measured on the GPU into an `hbmsim-profile/1` JSON (docs/calibration-profile.md).
// Pure C++ (no CUDA) so it is unit-tested on machines without a GPU.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace hbmsim::calib {

using Json = nlohmann::ordered_json;

// Median of a non-empty sample (mean of the two middle values for even sizes).
double median(std::vector<double> values);

// One timed configuration: x (bytes or FLOPs of ONE op) and the median time of one op.
struct Point {
    double x = 0.0;
    double median_s = 0.0;
};

// Least-squares fit of time = latency_s + bytes / bytes_per_s over the given points.
struct LinearFit {
    double latency_s = 0.0;
    double bytes_per_s = 0.0;
    bool ok = false;  // false when the fit is degenerate or has a non-positive intercept or slope
};
LinearFit fit_latency(const std::vector<Point>& points);

// Builds an efficiency table ([[x, fraction]...], x strictly increasing, fraction in (0, 1]).
// Raw fractions outside (0, 1] are clamped; duplicates in x are averaged. Every clamp is described in
// `derivation` (an array the caller puts in the raw file).
Json efficiency_table(std::vector<std::pair<double, double>> x_and_fraction, Json& derivation);

// Known dense (no sparsity) peak FLOP/s by device name; 0 when the device is not in the table.
struct PeakFlops {
    double bf16_flops_per_s = 0.0;
    double fp8_flops_per_s = 0.0;
};
PeakFlops peak_from_device_name(const std::string& device_name);

// Everything the profile needs, already reduced to medians.
struct Measurements {
    std::string name;          // profile name
    std::string source;        // command line, tool, date
    std::string gpu;           // device name
    std::string driver;        // NVIDIA driver version
    std::string cuda;          // CUDA runtime version, "13.0"
    std::string date;          // ISO 8601 UTC
    std::string compute_capability;  // "9.0"
    std::string hostname;

    std::vector<Point> h2d_pinned;     // x = bytes per copy
    std::vector<Point> d2h_pinned;
    std::vector<Point> bidirectional;  // x = bytes per direction; both directions run at once
    std::size_t latency_fit_max_bytes = 1u << 20;  // sizes <= this enter the latency fit

    std::vector<Point> streaming;      // x = bytes read + written by one kernel
    std::vector<Point> d2d;            // x = bytes copied

    double launch_overhead_s = 0.0;    // 0: not measured (the stage failed or was skipped)
    bool interference_measured = false;
    double slowdown_during_h2d = 0.0;  // 1 - rate_with_copy / rate_alone, memory-bound kernel
    double slowdown_during_d2h = 0.0;

    std::vector<Point> gemm_bf16;      // x = FLOPs of one GEMM
    std::vector<Point> gemm_fp8;
    double peak_bf16_flops_per_s = 0.0;  // 0: use the best measured rate as the peak
    double peak_fp8_flops_per_s = 0.0;
};

// Returns the profile, or nullopt with `error` set when a measurement cannot give a valid profile.
// `derivation` receives how each figure was derived (fits, clamps, peaks) for the raw file.
// Every part is optional (a failed stage leaves its vectors empty): the profile carries the fields whose
// measurements exist, and only a run with nothing usable at all is an error.
//
// The simulator adds launch_overhead_s to every kernel it times and host_link.latency_s to every copy, so
// the efficiency tables exclude them: a GEMM or streaming fraction is work / ((t_op - launch) * rate) and a
// copy fraction (bytes / (t - latency)) / large-copy rate, with t - launch floored at kMinKernelShare * t.
// bandwidth * fraction + the fixed cost then reproduces each measured back-to-back time once, not twice.
constexpr double kMinKernelShare = 0.05;
std::optional<Json> build_profile(const Measurements& m, Json& derivation, std::string& error);

// Writes `text` to PATH.tmp, then renames it onto PATH, so readers never see a half-written file.
bool write_file_atomically(const std::string& path, const std::string& text, std::string& error);
// Whether PATH can be written that way (not a directory; PATH.tmp can be created), checked before minutes of
// measurement whose result would have nowhere to go. (hbmsim's cli::check_writable does the same; this backend
// builds on its own, without hbmsim's libraries, on a bare GPU machine.)
bool can_write(const std::string& path, std::string& error);

}  // namespace hbmsim::calib
