// Error checking for CUDA runtime and cuBLASLt calls.
// Every measurement function returns bool; a failed call prints "file:line: call: error" to stderr and
// makes the enclosing function return false, so main can exit non-zero without exceptions or abort().
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace hbmsim::calib {

// The first failure since the last take_failure(): a failed stage records it in raw.json.
inline std::string& pending_failure() {
    static std::string s;
    return s;
}

inline std::string take_failure() {
    std::string s;
    s.swap(pending_failure());
    return s;
}

inline void report_failure(const char* file, int line, const char* call, const char* what) {
    std::fprintf(stderr, "hbmsim-calibrate-cuda: %s:%d: %s failed: %s\n", file, line, call, what);
    if (pending_failure().empty()) {
        const char* base = std::strrchr(file, '/');
        pending_failure() = std::string(base != nullptr ? base + 1 : file) + ":" + std::to_string(line) + ": " + call +
                            " failed: " + what;
    }
}

}  // namespace hbmsim::calib

#define CALIB_CUDA(call)                                                                              \
    do {                                                                                              \
        const cudaError_t calib_err_ = (call);                                                        \
        if (calib_err_ != cudaSuccess) {                                                              \
            ::hbmsim::calib::report_failure(__FILE__, __LINE__, #call, cudaGetErrorString(calib_err_)); \
            return false;                                                                             \
        }                                                                                             \
    } while (0)

#define CALIB_BLAS(call)                                                                                   \
    do {                                                                                                   \
        const cublasStatus_t calib_st_ = (call);                                                           \
        if (calib_st_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            ::hbmsim::calib::report_failure(__FILE__, __LINE__, #call, cublasLtGetStatusString(calib_st_)); \
            return false;                                                                                  \
        }                                                                                                  \
    } while (0)

// For conditions that are not API errors (bad sizes, non-finite timings).
#define CALIB_REQUIRE(cond, msg)                                                   \
    do {                                                                           \
        if (!(cond)) {                                                             \
            ::hbmsim::calib::report_failure(__FILE__, __LINE__, #cond, (msg));     \
            return false;                                                          \
        }                                                                          \
    } while (0)
