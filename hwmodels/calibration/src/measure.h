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
    bool fp8_fast_accum = true;  // CUBLASLT_MATMUL_DESC_FAST_ACCUM for the fp8 GEMMs
    double budget_s = 0.0;       // > 0: stages not started within this many seconds are skipped
    std::vector<GemmShape> shapes;
    std::string command_line;
};

// Runs every measurement stage on `opt.device`. Fills `m` (medians for the profile) and `raw` (every
// repeat, and raw["stages"][name] = {status ok|failed|skipped, wall_s, error}). Each stage is independent:
// a failed one is recorded and the others still run. Returns false only when the set-up (buffers, streams,
// cuBLASLt) failed, so nothing could be measured.
bool run_measurements(const Options& opt, Measurements& m, Json& raw);

}  // namespace hbmsim::calib
