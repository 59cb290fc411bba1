#include "profile.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include <sys/stat.h>

namespace hbmsim::calib {

double median(std::vector<double> values) {
    if (values.empty()) return 0.0;
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

LinearFit fit_latency(const std::vector<Point>& points) {
    LinearFit fit;
    const double n = static_cast<double>(points.size());
    if (points.size() < 2) return fit;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const Point& p : points) {
        sx += p.x;
        sy += p.median_s;
        sxx += p.x * p.x;
        sxy += p.x * p.median_s;
    }
    const double denom = n * sxx - sx * sx;
    if (!(std::abs(denom) > 0.0)) return fit;
    const double slope = (n * sxy - sx * sy) / denom;  // seconds per byte
    const double intercept = (sy - slope * sx) / n;
    if (!(slope > 0.0) || !(intercept > 0.0) || !std::isfinite(slope) || !std::isfinite(intercept)) {
        return fit;
    }
    fit.latency_s = intercept;
    fit.bytes_per_s = 1.0 / slope;
    fit.ok = true;
    return fit;
}

Json efficiency_table(std::vector<std::pair<double, double>> x_and_fraction, Json& derivation) {
    // Average duplicates so x is strictly increasing, as the loader requires.
    std::map<double, std::pair<double, int>> merged;
    for (const auto& [x, f] : x_and_fraction) {
        if (!(x > 0.0) || !std::isfinite(x) || !std::isfinite(f)) {
            derivation.push_back({{"x", std::isfinite(x) ? Json(x) : Json("non-finite")},
                                  {"dropped", "x <= 0 or non-finite value"}});
            continue;
        }
        auto& slot = merged[x];
        slot.first += f;
        slot.second += 1;
    }
    constexpr double kMinFraction = 1e-6;  // the loader wants fractions > 0
    Json table = Json::array();
    for (const auto& [x, acc] : merged) {
        const double raw = acc.first / acc.second;
        double f = raw;
        if (f > 1.0) f = 1.0;
        if (f < kMinFraction) f = kMinFraction;
        Json entry = {{"x", x}, {"raw_fraction", raw}, {"fraction", f}, {"clamped", f != raw}};
        if (acc.second > 1) entry["averaged_duplicates"] = acc.second;
        derivation.push_back(entry);
        table.push_back(Json::array({x, f}));
    }
    return table;
}

PeakFlops peak_from_device_name(const std::string& device_name) {
    const auto has = [&](const char* s) { return device_name.find(s) != std::string::npos; };
    // Dense figures from the NVIDIA datasheets. PCIe/NVL variants run at lower clocks and power and are
    // left out on purpose: for them the best measured rate is used instead.
    if (has("B200")) return {2.5e15, 5.0e15};  // also matches GB200
    if (has("H200") && !has("NVL")) return {989e12, 1979e12};
    if (has("H100") && (has("SXM") || has("HBM3")) && !has("PCIe") && !has("NVL")) return {989e12, 1979e12};
    return {};
}

namespace {

bool positive_finite(double v) { return v > 0.0 && std::isfinite(v); }

const Point* largest(const std::vector<Point>& pts) {
    const Point* best = nullptr;
    for (const Point& p : pts) {
        if (best == nullptr || p.x > best->x) best = &p;
    }
    return best;
}

double rate(const Point& p) { return p.x / p.median_s; }

// The time of one op without the fixed cost the simulator adds on its own (launch or copy latency).
double net_time(const Point& p, double fixed_s, bool& floored) {
    const double net = p.median_s - fixed_s;
    floored = !(net >= kMinKernelShare * p.median_s);
    return floored ? kMinKernelShare * p.median_s : net;
}

bool all_positive(const std::vector<Point>& pts) {
    for (const Point& p : pts) {
        if (!positive_finite(p.x) || !positive_finite(p.median_s)) return false;
    }
    return true;
}

// GEMM table against a peak; an unknown peak (0) falls back to the best measured rate.
std::optional<Json> gemm_table(const std::vector<Point>& pts, double peak, double launch_s, const char* dtype,
                               Json& derivation, std::string& error) {
    double best = 0.0;
    if (!all_positive(pts)) {
        error = std::string("gemm ") + dtype + ": non-positive FLOPs or time";
        return std::nullopt;
    }
    for (const Point& p : pts) best = std::max(best, rate(p));
    Json d;
    d["measured_best_flops_per_s"] = best;
    if (positive_finite(peak)) {
        d["peak_flops_per_s"] = peak;
        d["peak_source"] = "argument or device table";
    } else {
        peak = best;
        d["peak_flops_per_s"] = peak;
        d["peak_source"] = "best measured rate (device not in the peak table and no --peak argument)";
    }
    d["launch_overhead_subtracted_s"] = launch_s;
    std::vector<std::pair<double, double>> xf;
    Json floored_at = Json::array();
    for (const Point& p : pts) {
        bool floored = false;
        xf.emplace_back(p.x, p.x / net_time(p, launch_s, floored) / peak);
        if (floored) floored_at.push_back(p.x);
    }
    d["net_time_floored_at_x"] = floored_at;
    d["points"] = Json::array();
    Json table = efficiency_table(xf, d["points"]);
    derivation["gemm_" + std::string(dtype)] = d;
    return table;
}

}  // namespace

std::optional<Json> build_profile(const Measurements& m, Json& derivation, std::string& error) {
    derivation = Json::object();
    for (const auto* v : {&m.h2d_pinned, &m.d2h_pinned, &m.bidirectional, &m.streaming, &m.d2d}) {
        if (!all_positive(*v)) {
            error = "a copy or streaming measurement has a non-positive size or time";
            return std::nullopt;
        }
    }
    if (m.launch_overhead_s != 0.0 && !positive_finite(m.launch_overhead_s)) {
        error = "launch overhead is not a positive finite time";
        return std::nullopt;
    }
    const Point* h2d = largest(m.h2d_pinned);
    const Point* d2h = largest(m.d2h_pinned);
    const Point* bidir = largest(m.bidirectional);
    const Point* stream = largest(m.streaming);
    const Point* d2d = largest(m.d2d);
    const bool have_launch = positive_finite(m.launch_overhead_s);
    const double launch_s = have_launch ? m.launch_overhead_s : 0.0;
    Json missing = Json::array();

    Json p;
    p["format"] = "hbmsim-profile/1";
    p["name"] = m.name;
    p["source"] = m.source;
    // metadata is a free map of strings for the loader; the first four keys are the documented ones.
    p["metadata"] = {{"gpu", m.gpu}, {"driver", m.driver}, {"cuda", m.cuda}, {"date", m.date}};
    if (!m.compute_capability.empty()) p["metadata"]["compute_capability"] = m.compute_capability;
    if (!m.hostname.empty()) p["metadata"]["hostname"] = m.hostname;

    // Fixed cost per copy: intercept of time = latency + bytes / bw over the small sizes; the
    // smallest-size time is the fallback when the fit is degenerate (noise can make it negative).
    double latency_s = 0.0;
    const bool have_copies = h2d != nullptr && d2h != nullptr;
    if (have_copies) {
        Json lat;
        double latency_sum = 0.0;
        int latency_n = 0;
        for (const auto& [dir, pts] : {std::pair{"h2d", &m.h2d_pinned}, std::pair{"d2h", &m.d2h_pinned}}) {
            std::vector<Point> small;
            for (const Point& pt : *pts) {
                if (pt.x <= static_cast<double>(m.latency_fit_max_bytes)) small.push_back(pt);
            }
            const LinearFit fit = fit_latency(small);
            Json d = {{"points_used", small.size()}, {"fit_ok", fit.ok}};
            double value = 0.0;
            if (fit.ok) {
                value = fit.latency_s;
                d["latency_s"] = fit.latency_s;
                d["small_size_bytes_per_s"] = fit.bytes_per_s;
                d["method"] = "least-squares intercept of time = latency + bytes/bw";
            } else {
                const Point* smallest = nullptr;
                for (const Point& pt : *pts) {
                    if (smallest == nullptr || pt.x < smallest->x) smallest = &pt;
                }
                value = smallest->median_s;
                d["latency_s"] = value;
                d["method"] = "time of the smallest transfer (fit degenerate)";
            }
            latency_sum += value;
            ++latency_n;
            lat[dir] = d;
        }
        latency_s = latency_sum / latency_n;
        lat["latency_s"] = latency_s;
        lat["combined_as"] = "mean of h2d and d2h";
        derivation["host_link_latency"] = lat;
        p["host_link"] = {{"h2d_bytes_per_s", rate(*h2d)}, {"d2h_bytes_per_s", rate(*d2h)}};
        if (bidir != nullptr) p["host_link"]["bidirectional_total_bytes_per_s"] = 2.0 * rate(*bidir);
        p["host_link"]["latency_s"] = latency_s;
        derivation["host_link_sizes_bytes"] = {{"h2d", h2d->x}, {"d2h", d2h->x}};
        if (bidir != nullptr) derivation["host_link_sizes_bytes"]["bidirectional_per_direction"] = bidir->x;
    } else {
        missing.push_back("host_link and efficiency.copy (pinned copies not measured)");
    }
    if (have_copies && bidir == nullptr) missing.push_back("host_link.bidirectional_total_bytes_per_s");
    const double hbm = stream != nullptr ? rate(*stream) : 0.0;
    if (stream != nullptr) {
        p["hbm_bandwidth_bytes_per_s"] = hbm;
    } else {
        missing.push_back("hbm_bandwidth_bytes_per_s and efficiency.memory_bound (streaming kernel not measured)");
    }
    if (d2d != nullptr) {
        p["d2d_bandwidth_bytes_per_s"] = rate(*d2d);
    } else {
        missing.push_back("d2d_bandwidth_bytes_per_s");
    }
    if (have_launch) {
        p["launch_overhead_s"] = m.launch_overhead_s;
    } else {
        missing.push_back("launch_overhead_s (tables keep the launch gap: nothing was subtracted)");
    }

    if (m.interference_measured) {
        // Offloading copies both ways, so the worse direction is the conservative figure.
        const double raw_slowdown = std::max(m.slowdown_during_h2d, m.slowdown_during_d2h);
        double slowdown = std::isfinite(raw_slowdown) ? raw_slowdown : 0.0;
        slowdown = std::clamp(slowdown, 0.0, 0.99);
        derivation["interference"] = {{"slowdown_during_h2d", m.slowdown_during_h2d},
                                      {"slowdown_during_d2h", m.slowdown_during_d2h},
                                      {"combined_as", "max of the two directions"},
                                      {"raw", std::isfinite(raw_slowdown) ? Json(raw_slowdown) : Json("non-finite")},
                                      {"value", slowdown},
                                      {"clamped", slowdown != raw_slowdown}};
        p["interference"] = {{"compute_slowdown_during_copy", slowdown}};
    } else {
        missing.push_back("interference");
    }

    Json eff = Json::object();
    Json gemm = Json::object();
    if (!m.gemm_bf16.empty()) {
        auto t = gemm_table(m.gemm_bf16, m.peak_bf16_flops_per_s, launch_s, "bf16", derivation, error);
        if (!t) return std::nullopt;
        gemm["bf16"] = *t;
    } else {
        missing.push_back("efficiency.gemm.bf16");
    }
    if (!m.gemm_fp8.empty()) {
        auto t = gemm_table(m.gemm_fp8, m.peak_fp8_flops_per_s, launch_s, "fp8", derivation, error);
        if (!t) return std::nullopt;
        gemm["fp8"] = *t;
    } else {
        missing.push_back("efficiency.gemm.fp8");
    }
    if (!gemm.empty()) eff["gemm"] = gemm;

    // Memory-bound fractions are relative to hbm_bandwidth_bytes_per_s written above, so the simulator's
    // bandwidth * fraction (+ launch_overhead_s) reproduces the measured per-op time at each size.
    if (stream != nullptr) {
        std::vector<std::pair<double, double>> xf;
        Json floored_at = Json::array();
        for (const Point& s : m.streaming) {
            bool floored = false;
            xf.emplace_back(s.x, s.x / net_time(s, launch_s, floored) / hbm);
            if (floored) floored_at.push_back(s.x);
        }
        Json d = Json::array();
        eff["memory_bound"] = efficiency_table(xf, d);
        derivation["memory_bound"] = {{"relative_to_bytes_per_s", hbm},
                                      {"launch_overhead_subtracted_s", launch_s},
                                      {"net_time_floored_at_x", floored_at},
                                      {"points", d}};
    }
    // Copy fractions: each direction against its own largest-size rate, averaged over H2D and D2H, after
    // taking out the host_link.latency_s the simulator adds to every copy.
    if (have_copies) {
        std::map<double, std::pair<double, int>> by_size;
        Json floored_at = Json::array();
        for (const auto& [pts, top] : {std::pair{&m.h2d_pinned, h2d}, std::pair{&m.d2h_pinned, d2h}}) {
            for (const Point& c : *pts) {
                bool floored = false;
                auto& slot = by_size[c.x];
                slot.first += c.x / net_time(c, latency_s, floored) / rate(*top);
                slot.second += 1;
                if (floored) floored_at.push_back(c.x);
            }
        }
        std::vector<std::pair<double, double>> xf;
        for (const auto& [x, acc] : by_size) xf.emplace_back(x, acc.first / acc.second);
        Json d = Json::array();
        eff["copy"] = efficiency_table(xf, d);
        derivation["copy"] = {{"relative_to", "largest-size pinned rate of the same direction, mean of h2d and d2h"},
                              {"latency_subtracted_s", latency_s},
                              {"net_time_floored_at_x", floored_at},
                              {"points", d}};
    }
    if (!eff.empty()) p["efficiency"] = eff;
    derivation["not_in_profile"] = missing;
    const bool anything = have_copies || stream != nullptr || d2d != nullptr || have_launch ||
                          m.interference_measured || !gemm.empty();
    if (!anything) {
        error = "no measurement succeeded: nothing to put in a profile";
        return std::nullopt;
    }
    return p;
}

bool can_write(const std::string& path, std::string& error) {
    struct stat st{};
    if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        error = path + ": is a directory (expected a file path)";
        return false;
    }
    const std::string tmp = path + ".tmp";
    const bool existed = stat(tmp.c_str(), &st) == 0;
    {
        std::ofstream probe(tmp, std::ios::binary | std::ios::app);
        if (!probe) {
            error = path + ": cannot be written (" + std::strerror(errno) + ")";
            return false;
        }
    }
    if (!existed) std::remove(tmp.c_str());
    return true;
}

bool write_file_atomically(const std::string& path, const std::string& text, std::string& error) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) {
            error = "cannot open " + tmp + " for writing: " + std::strerror(errno);
            return false;
        }
        out << text;
        out.flush();
        if (!out) {
            error = "cannot write " + tmp;
            out.close();
            std::remove(tmp.c_str());
            return false;
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
        std::remove(tmp.c_str());
        return false;
    }
    return true;
}

}  // namespace hbmsim::calib
