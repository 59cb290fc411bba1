// GPU measurements for hbmsim-calibrate-cuda: host link, HBM, D2D, GEMMs, interference, launch cost.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profile.h"

namespace hbmsim::calib {

struct GemmShape {
    std::int64_t m = 0;
    std::int64_t n = 0;
    std::int64_t k = 0;
    std::string label;
    double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// Llama-style shapes for T = 8192 tokens (batch 4 x seq 2048), d_model 2048..16384, 1e9..1.3e13 FLOPs.
std::vector<GemmShape> default_gemm_shapes();

struct Options {
    std::string output_path;
    std::string raw_path;
    std::string name;
    std::string shapes_path;
    bool quick = false;
    int device = 0;
    double peak_bf16_flops = 0.0;  // 0: from the device table, else the best measured rate
    double peak_fp8_flops = 0.0;
    std::vector<GemmShape> shapes;
    std::string command_line;
};

// Runs every measurement on `opt.device`. Fills `m` (medians for the profile) and `raw` (every
// repeat). Returns false after printing the failing call to stderr.
bool run_measurements(const Options& opt, Measurements& m, Json& raw);

}  // namespace hbmsim::calib
