#include "measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "check.h"
#include "kernels.h"

namespace hbmsim::calib {

std::vector<GemmShape> default_gemm_shapes() {
    constexpr std::int64_t T = 8192;  // tokens of one step: batch 4 x seq 2048
    return {
        {2048, 2048, 128, "attention scores of one head (seq x seq x head_dim 128)"},
        {T, 512, 2048, "K or V projection, d=2048, 4 kv heads x 128"},
        {T, 2048, 2048, "(T,d,d) attention out projection, d=2048"},
        {T, 8192, 2048, "(T,4d,d) MLP up, d=2048"},
        {T, 12288, 4096, "(T,3d,d) fused QKV projection, d=4096"},
        {T, 4096, 14336, "(T,d,3.5d) MLP down of Llama-3-8B, d=4096"},
        {T, 8192, 8192, "(T,d,d) attention out projection, d=8192"},
        {T, 32768, 8192, "(T,4d,d) MLP up, d=8192"},
        {T, 49152, 16384, "(T,3d,d) fused QKV projection, d=16384"},
    };
}

namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * kKiB;
constexpr std::size_t kGiB = kMiB * kKiB;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void progress(const char* what) { std::fprintf(stderr, "hbmsim-calibrate-cuda: %s\n", what); }

// The release calls in the destructors below ignore their status: by then the run has either succeeded
// or already reported its first error, and a failing release must not hide that.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    ~DeviceBuffer() {
        if (ptr_ != nullptr) (void)cudaFree(ptr_);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    bool allocate(std::size_t bytes) {
        CALIB_CUDA(cudaMalloc(&ptr_, bytes));
        bytes_ = bytes;
        return true;
    }
    void* get() const { return ptr_; }
    template <class T>
    T* as() const { return static_cast<T*>(ptr_); }
    std::size_t bytes() const { return bytes_; }

private:
    void* ptr_ = nullptr;
    std::size_t bytes_ = 0;
};

class PinnedBuffer {
public:
    PinnedBuffer() = default;
    ~PinnedBuffer() {
        if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
    }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    bool allocate(std::size_t bytes) {
        CALIB_CUDA(cudaMallocHost(&ptr_, bytes));
        return true;
    }
    void* get() const { return ptr_; }

private:
    void* ptr_ = nullptr;
};

class Stream {
public:
    Stream() = default;
    ~Stream() {
        if (s_ != nullptr) (void)cudaStreamDestroy(s_);
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    bool create() {
        // Non-blocking: the legacy default stream must not serialise the copy and compute streams.
        CALIB_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
        return true;
    }
    cudaStream_t get() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

class Event {
public:
    Event() = default;
    ~Event() {
        if (e_ != nullptr) (void)cudaEventDestroy(e_);
    }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    bool create() {
        CALIB_CUDA(cudaEventCreate(&e_));
        return true;
    }
    cudaEvent_t get() const { return e_; }

private:
    cudaEvent_t e_ = nullptr;
};

// Per-op times of each repeat (each repeat is one batch of `inner` ops) and their median.
struct Series {
    std::vector<double> per_op_s;
    double median_s = 0.0;
    int inner = 1;
};

Json series_json(const char* x_key, double x, const Series& s, const char* rate_key, double rate) {
    Json j;
    j[x_key] = x;
    j["inner_iterations"] = s.inner;
    j["repeats_per_op_s"] = s.per_op_s;
    j["median_per_op_s"] = s.median_s;
    j[rate_key] = rate;
    return j;
}

int clamp_int(double v, int lo, int hi) {
    if (!(v >= lo)) return lo;
    if (v > hi) return hi;
    return static_cast<int>(v);
}

enum class Dtype { bf16, fp8_e4m3 };

class Calibrator {
public:
    explicit Calibrator(const Options& opt) : opt_(opt) {}
    ~Calibrator() {
        if (lt_ != nullptr) (void)cublasLtDestroy(lt_);
    }
    Calibrator(const Calibrator&) = delete;
    Calibrator& operator=(const Calibrator&) = delete;

    bool run(Measurements& m, Json& raw);

private:
    bool setup(Measurements& m, Json& raw);
    bool measure_launch_overhead(Measurements& m, Json& raw);
    bool measure_pinned_copies(Measurements& m, Json& raw);
    bool measure_pageable_copies(const Measurements& m, Json& raw);
    bool measure_d2d(Measurements& m, Json& raw);
    bool measure_streaming(Measurements& m, Json& raw);
    void gemm_header(Measurements& m, Json& raw);
    bool measure_gemms_bf16(Measurements& m, Json& raw);
    bool measure_gemms_fp8(Measurements& m, Json& raw);
    bool measure_gemm_dtype(Dtype dt, std::vector<Point>& pts, Json& out);
    // Runs one stage: records {status, wall_s, error} in raw["stages"][name]; a failure restores `m` to
    // what it was before the stage, so a half-measured series never reaches the profile.
    template <class Fn>
    bool run_stage(const char* name, Measurements& m, Json& raw, Fn&& fn, const char* skip_reason = nullptr);
    bool measure_interference(Measurements& m, Json& raw);

    template <class Enqueue>
    bool time_batch(int inner, Enqueue&& enqueue, double& per_op_s);
    template <class Enqueue>
    bool time_series(int inner, int repeats, Enqueue&& enqueue, Series& out);

    bool enqueue_axpy(std::size_t n);
    bool copy_with(cudaMemcpyKind kind, std::size_t bytes, cudaStream_t s);

    // Matmul set-up that lives for one shape.
    struct Gemm {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        cublasLtMatmulPreference_t pref = nullptr;
        ~Gemm() {
            if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
            if (d != nullptr) (void)cublasLtMatrixLayoutDestroy(d);
            if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
            if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
            if (op != nullptr) (void)cublasLtMatmulDescDestroy(op);
        }
    };
    bool gemm_setup(Dtype dt, const GemmShape& s, Gemm& g);
    bool gemm_enqueue(const Gemm& g, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, void* d);

    const Options& opt_;
    int repeats_ = 9;
    int sm_count_ = 1;
    int cc_major_ = 0, cc_minor_ = 0;
    std::size_t max_copy_bytes_ = kGiB;
    std::vector<std::size_t> copy_sizes_bytes_;
    std::vector<std::size_t> stream_counts_;  // floats per array of the streaming kernel
    std::vector<std::size_t> pageable_sizes_bytes_;
    std::vector<std::size_t> d2d_sizes_bytes_;
    std::uint64_t stream_counter_ = 0;         // rotates offsets so consecutive launches miss in L2
    Clock::time_point start_ = Clock::now();
    double h2d_large_bytes_per_s_ = 0.0, d2h_large_bytes_per_s_ = 0.0;

    Stream main_, aux_;
    Event ev_start_, ev_stop_, ev_aux_, ev_copy_start_, ev_copy_stop_;
    DeviceBuffer d_a_, d_b_, d_c_, workspace_;
    PinnedBuffer h_a_, h_b_;
    std::unique_ptr<unsigned char[]> pageable_;
    cublasLtHandle_t lt_ = nullptr;
    static constexpr std::size_t kWorkspaceBytes = 32 * kMiB;  // what cuBLAS recommends for Hopper
};

template <class Enqueue>
bool Calibrator::time_batch(int inner, Enqueue&& enqueue, double& per_op_s) {
    CALIB_CUDA(cudaEventRecord(ev_start_.get(), main_.get()));
    for (int i = 0; i < inner; ++i) {
        if (!enqueue(i)) return false;
    }
    CALIB_CUDA(cudaEventRecord(ev_stop_.get(), main_.get()));
    CALIB_CUDA(cudaEventSynchronize(ev_stop_.get()));
    float ms = 0.0f;
    CALIB_CUDA(cudaEventElapsedTime(&ms, ev_start_.get(), ev_stop_.get()));
    per_op_s = static_cast<double>(ms) * 1e-3 / inner;
    CALIB_REQUIRE(per_op_s > 0.0 && std::isfinite(per_op_s), "event timing gave a non-positive time");
    return true;
}

template <class Enqueue>
bool Calibrator::time_series(int inner, int repeats, Enqueue&& enqueue, Series& out) {
    out = Series{};
    out.inner = inner;
    double t = 0.0;
    if (!time_batch(inner, enqueue, t)) return false;  // warm-up, discarded
    for (int r = 0; r < repeats; ++r) {
        if (!time_batch(inner, enqueue, t)) return false;
        out.per_op_s.push_back(t);
    }
    out.median_s = median(out.per_op_s);
    return true;
}

bool Calibrator::enqueue_axpy(std::size_t n) {
    const std::size_t total = max_copy_bytes_ / sizeof(float);
    const std::size_t slots = std::max<std::size_t>(1, total / n);
    const std::size_t offset = static_cast<std::size_t>(stream_counter_++ % slots) * n;
    CALIB_CUDA(launch_axpy(1e-3f, d_a_.as<float>() + offset, d_b_.as<float>() + offset, n, sm_count_, main_.get()));
    return true;
}

bool Calibrator::copy_with(cudaMemcpyKind kind, std::size_t bytes, cudaStream_t s) {
    // H2D lands in d_c_ and D2H reads d_a_ (only ever read by kernels), so a copy never races with what a
    // concurrent kernel or the opposite-direction copy writes.
    if (kind == cudaMemcpyHostToDevice) {
        CALIB_CUDA(cudaMemcpyAsync(d_c_.get(), h_a_.get(), bytes, kind, s));
    } else {
        CALIB_CUDA(cudaMemcpyAsync(h_b_.get(), d_a_.get(), bytes, kind, s));
    }
    return true;
}

bool Calibrator::setup(Measurements& m, Json& raw) {
    repeats_ = opt_.quick ? 5 : 9;
    max_copy_bytes_ = opt_.quick ? 256 * kMiB : kGiB;
    for (std::size_t s = 4 * kKiB; s <= max_copy_bytes_; s *= (opt_.quick ? 16 : 4)) copy_sizes_bytes_.push_back(s);
    if (copy_sizes_bytes_.back() != max_copy_bytes_) copy_sizes_bytes_.push_back(max_copy_bytes_);
    for (std::size_t n = 4 * kKiB; n <= max_copy_bytes_ / sizeof(float); n *= (opt_.quick ? 16 : 4)) stream_counts_.push_back(n);
    if (stream_counts_.back() != max_copy_bytes_ / sizeof(float)) stream_counts_.push_back(max_copy_bytes_ / sizeof(float));
    // Sizes that are also in the pinned series, so raw.json compares pageable with pinned directly.
    pageable_sizes_bytes_ = opt_.quick ? std::vector<std::size_t>{kMiB, 16 * kMiB}
                                       : std::vector<std::size_t>{kMiB, 16 * kMiB, 256 * kMiB};
    d2d_sizes_bytes_ = opt_.quick ? std::vector<std::size_t>{16 * kMiB, 256 * kMiB}
                                  : std::vector<std::size_t>{16 * kMiB, 256 * kMiB, kGiB};

    CALIB_CUDA(cudaSetDevice(opt_.device));
    CALIB_CUDA(cudaFree(nullptr));  // creates the context now so its cost stays out of every timing
    cudaDeviceProp prop{};
    CALIB_CUDA(cudaGetDeviceProperties(&prop, opt_.device));
    sm_count_ = prop.multiProcessorCount;
    cc_major_ = prop.major;
    cc_minor_ = prop.minor;
    int sm_clock_khz = 0, mem_clock_khz = 0, bus_width_bits = 0;
    CALIB_CUDA(cudaDeviceGetAttribute(&sm_clock_khz, cudaDevAttrClockRate, opt_.device));
    CALIB_CUDA(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, opt_.device));
    CALIB_CUDA(cudaDeviceGetAttribute(&bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, opt_.device));
    Json dev;
    dev["name"] = prop.name;
    dev["compute_capability"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    dev["sm_count"] = prop.multiProcessorCount;
    dev["total_memory_bytes"] = prop.totalGlobalMem;
    dev["l2_cache_bytes"] = prop.l2CacheSize;
    dev["sm_clock_khz"] = sm_clock_khz;
    dev["memory_clock_khz"] = mem_clock_khz;
    dev["memory_bus_width_bits"] = bus_width_bits;
    char bus_id[32] = {};
    std::snprintf(bus_id, sizeof bus_id, "%04x:%02x:%02x.0", static_cast<unsigned>(prop.pciDomainID),
                  static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
    dev["pci_bus_id"] = bus_id;
    raw["device"].update(dev);
    m.gpu = prop.name;

    const std::size_t need = 3 * max_copy_bytes_ + kWorkspaceBytes;
    CALIB_REQUIRE(prop.totalGlobalMem > need + 4 * kGiB, "the device has too little memory for the buffers");

    CALIB_REQUIRE(main_.create() && aux_.create(), "stream creation");
    CALIB_REQUIRE(ev_start_.create() && ev_stop_.create() && ev_aux_.create() && ev_copy_start_.create() &&
                      ev_copy_stop_.create(),
                  "event creation");
    if (!d_a_.allocate(max_copy_bytes_) || !d_b_.allocate(max_copy_bytes_) || !d_c_.allocate(max_copy_bytes_) ||
        !workspace_.allocate(kWorkspaceBytes) || !h_a_.allocate(max_copy_bytes_) || !h_b_.allocate(max_copy_bytes_)) {
        return false;
    }
    // Random non-zero data everywhere, then copied to the pinned buffers (which also warms the DMA path).
    CALIB_CUDA(fill_f32(d_a_.as<float>(), max_copy_bytes_ / sizeof(float), 1, main_.get()));
    CALIB_CUDA(fill_f32(d_b_.as<float>(), max_copy_bytes_ / sizeof(float), 2, main_.get()));
    CALIB_CUDA(fill_f32(d_c_.as<float>(), max_copy_bytes_ / sizeof(float), 3, main_.get()));
    CALIB_CUDA(cudaMemcpyAsync(h_a_.get(), d_a_.get(), max_copy_bytes_, cudaMemcpyDeviceToHost, main_.get()));
    CALIB_CUDA(cudaMemcpyAsync(h_b_.get(), d_b_.get(), max_copy_bytes_, cudaMemcpyDeviceToHost, main_.get()));
    CALIB_CUDA(cudaStreamSynchronize(main_.get()));
    const std::size_t pageable_bytes = pageable_sizes_bytes_.back();
    pageable_.reset(new unsigned char[pageable_bytes]);
    std::memcpy(pageable_.get(), h_a_.get(), pageable_bytes);  // touches every page before timing
    CALIB_BLAS(cublasLtCreate(&lt_));

    raw["method"] = {
        {"timer", "cudaEvent pairs around a batch of inner_iterations ops on one stream (pageable copies and "
                  "launch overhead: steady_clock around the batch and a synchronize)"},
        {"warm_up", "one discarded batch before the repeats of every configuration"},
        {"repeats", repeats_},
        {"statistic", "median of the per-op times of the repeats"},
        {"inputs", "pseudo-random values in [-1, 1) from a device-side hash kernel (no zeros, no cuRAND)"},
        {"quick", opt_.quick},
    };
    return true;
}

bool Calibrator::measure_launch_overhead(Measurements& m, Json& raw) {
    progress("launch overhead");
    const int launches = opt_.quick ? 5000 : 20000;
    for (int i = 0; i < 1000; ++i) CALIB_CUDA(launch_empty(main_.get()));
    CALIB_CUDA(cudaStreamSynchronize(main_.get()));
    std::vector<double> wall, gpu;
    for (int r = 0; r < repeats_; ++r) {
        const auto t0 = Clock::now();
        CALIB_CUDA(cudaEventRecord(ev_start_.get(), main_.get()));
        for (int i = 0; i < launches; ++i) CALIB_CUDA(launch_empty(main_.get()));
        CALIB_CUDA(cudaEventRecord(ev_stop_.get(), main_.get()));
        CALIB_CUDA(cudaEventSynchronize(ev_stop_.get()));
        const double wall_s = seconds_since(t0);
        float ms = 0.0f;
        CALIB_CUDA(cudaEventElapsedTime(&ms, ev_start_.get(), ev_stop_.get()));
        wall.push_back(wall_s / launches);
        gpu.push_back(static_cast<double>(ms) * 1e-3 / launches);
    }
    // Host wall time per launch: includes the issue cost the GPU timeline cannot see.
    m.launch_overhead_s = median(wall);
    raw["launch_overhead"] = {
        {"launches_per_repeat", launches},
        {"wall_per_launch_s", wall},
        {"gpu_timeline_per_launch_s", gpu},
        {"median_wall_per_launch_s", m.launch_overhead_s},
        {"median_gpu_timeline_per_launch_s", median(gpu)},
        {"profile_uses", "median_wall_per_launch_s"},
    };
    return true;
}

bool Calibrator::measure_pinned_copies(Measurements& m, Json& raw) {
    progress("pinned host<->device copies");
    Json h2d = Json::array(), d2h = Json::array(), bidir = Json::array();
    const double budget_bytes = static_cast<double>(opt_.quick ? 64 * kMiB : 256 * kMiB);
    const int max_inner = opt_.quick ? 30 : 100;
    for (const std::size_t size : copy_sizes_bytes_) {
        const int inner = clamp_int(budget_bytes / static_cast<double>(size), 1, max_inner);
        const double x = static_cast<double>(size);
        Series s;
        if (!time_series(inner, repeats_, [&](int) { return copy_with(cudaMemcpyHostToDevice, size, main_.get()); }, s)) return false;
        m.h2d_pinned.push_back({x, s.median_s});
        h2d.push_back(series_json("size_bytes", x, s, "bytes_per_s", x / s.median_s));

        if (!time_series(inner, repeats_, [&](int) { return copy_with(cudaMemcpyDeviceToHost, size, main_.get()); }, s)) return false;
        m.d2h_pinned.push_back({x, s.median_s});
        d2h.push_back(series_json("size_bytes", x, s, "bytes_per_s", x / s.median_s));

        // Both directions at once: H2D on the main stream, D2H on the aux stream forked from and joined to it.
        const auto both = [&](int i) -> bool {
            if (i == 0) CALIB_CUDA(cudaStreamWaitEvent(aux_.get(), ev_start_.get(), 0));
            if (!copy_with(cudaMemcpyHostToDevice, size, main_.get())) return false;
            if (!copy_with(cudaMemcpyDeviceToHost, size, aux_.get())) return false;
            if (i == inner - 1) {
                CALIB_CUDA(cudaEventRecord(ev_aux_.get(), aux_.get()));
                CALIB_CUDA(cudaStreamWaitEvent(main_.get(), ev_aux_.get(), 0));
            }
            return true;
        };
        if (!time_series(inner, repeats_, both, s)) return false;
        m.bidirectional.push_back({x, s.median_s});
        Json b = series_json("size_bytes_per_direction", x, s, "total_bytes_per_s", 2.0 * x / s.median_s);
        bidir.push_back(b);
    }
    h2d_large_bytes_per_s_ = m.h2d_pinned.back().x / m.h2d_pinned.back().median_s;
    d2h_large_bytes_per_s_ = m.d2h_pinned.back().x / m.d2h_pinned.back().median_s;
    raw["copies"]["h2d_pinned"] = h2d;
    raw["copies"]["d2h_pinned"] = d2h;
    raw["copies"]["bidirectional_pinned"] = bidir;
    return true;
}

bool Calibrator::measure_pageable_copies(const Measurements& m, Json& raw) {
    progress("pageable host<->device copies");
    Json out = Json::object();
    for (const auto kind : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
        Json list = Json::array();
        for (const std::size_t size : pageable_sizes_bytes_) {
            const int inner = clamp_int(static_cast<double>(64 * kMiB) / static_cast<double>(size), 1, 20);
            // Pageable copies are staged by the driver on the host thread, so host wall time is the honest timer.
            const auto batch = [&](double& per_op_s) -> bool {
                const auto t0 = Clock::now();
                for (int i = 0; i < inner; ++i) {
                    if (kind == cudaMemcpyHostToDevice) {
                        CALIB_CUDA(cudaMemcpyAsync(d_c_.get(), pageable_.get(), size, kind, main_.get()));
                    } else {
                        CALIB_CUDA(cudaMemcpyAsync(pageable_.get(), d_a_.get(), size, kind, main_.get()));
                    }
                }
                CALIB_CUDA(cudaStreamSynchronize(main_.get()));
                per_op_s = seconds_since(t0) / inner;
                return true;
            };
            Series s;
            s.inner = inner;
            double t = 0.0;
            if (!batch(t)) return false;  // warm-up
            for (int r = 0; r < repeats_; ++r) {
                if (!batch(t)) return false;
                s.per_op_s.push_back(t);
            }
            s.median_s = median(s.per_op_s);
            const double x = static_cast<double>(size);
            Json rec = series_json("size_bytes", x, s, "bytes_per_s", x / s.median_s);
            for (const Point& p : kind == cudaMemcpyHostToDevice ? m.h2d_pinned : m.d2h_pinned) {
                if (p.x == x) rec["pinned_bytes_per_s_same_size"] = p.x / p.median_s;
            }
            list.push_back(rec);
        }
        out[kind == cudaMemcpyHostToDevice ? "h2d_pageable" : "d2h_pageable"] = list;
    }
    raw["copies"]["h2d_pageable"] = out["h2d_pageable"];
    raw["copies"]["d2h_pageable"] = out["d2h_pageable"];
    return true;
}

bool Calibrator::measure_d2d(Measurements& m, Json& raw) {
    progress("device-to-device copies");
    Json list = Json::array();
    for (const std::size_t size : d2d_sizes_bytes_) {
        const int inner = clamp_int(static_cast<double>(4 * kGiB) / static_cast<double>(size), 1, 50);
        Series s;
        const auto op = [&](int) -> bool {
            CALIB_CUDA(cudaMemcpyAsync(d_c_.get(), d_a_.get(), size, cudaMemcpyDeviceToDevice, main_.get()));
            return true;
        };
        if (!time_series(inner, repeats_, op, s)) return false;
        const double x = static_cast<double>(size);
        m.d2d.push_back({x, s.median_s});
        list.push_back(series_json("size_bytes", x, s, "bytes_copied_per_s", x / s.median_s));
    }
    raw["copies"]["d2d"] = list;
    return true;
}

bool Calibrator::measure_streaming(Measurements& m, Json& raw) {
    progress("streaming kernel (y = a*x + y)");
    Json list = Json::array();
    for (const std::size_t n : stream_counts_) {
        const double bytes = 3.0 * sizeof(float) * static_cast<double>(n);  // read x, read y, write y
        const int inner = clamp_int(static_cast<double>(2 * kGiB) / bytes, 1, 200);
        Series s;
        if (!time_series(inner, repeats_, [&](int) { return enqueue_axpy(n); }, s)) return false;
        m.streaming.push_back({bytes, s.median_s});
        Json j = series_json("bytes_moved", bytes, s, "bytes_per_s", bytes / s.median_s);
        j["elements"] = n;
        list.push_back(j);
    }
    raw["streaming_kernel"] = {
        {"kernel", "y = a*x + y, fp32, float4 loads, grid-stride; bytes = 12 per element (read x, read y, write y)"},
        {"note", "consecutive launches use different slices of a 1 GiB array so small sizes do not hit in L2; "
                 "per-op time of back-to-back launches includes the gap between kernels"},
        {"points", list},
    };
    return true;
}

bool Calibrator::gemm_setup(Dtype dt, const GemmShape& s, Gemm& g) {
    const cudaDataType_t in_type = dt == Dtype::bf16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
    CALIB_BLAS(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // "TN" layout (A transposed) is the one FP8 requires; bf16 uses it too so both dtypes compare alike.
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CALIB_BLAS(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CALIB_BLAS(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (dt == Dtype::fp8_e4m3) {
        // Fast accumulation (partial sums kept in the tensor core's reduced precision, promoted less often) is
        // what fp8 training uses for its forward GEMMs; --fp8-no-fast-accum measures the precise path instead.
        const std::int8_t fast = opt_.fp8_fast_accum ? 1 : 0;
        CALIB_BLAS(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    }
    // Column-major: A stored K x M, B stored K x N, D = op(A) * B stored M x N (bf16 output for both dtypes).
    CALIB_BLAS(cublasLtMatrixLayoutCreate(&g.a, in_type, static_cast<std::uint64_t>(s.k), static_cast<std::uint64_t>(s.m), s.k));
    CALIB_BLAS(cublasLtMatrixLayoutCreate(&g.b, in_type, static_cast<std::uint64_t>(s.k), static_cast<std::uint64_t>(s.n), s.k));
    CALIB_BLAS(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_16BF, static_cast<std::uint64_t>(s.m), static_cast<std::uint64_t>(s.n), s.m));
    CALIB_BLAS(cublasLtMatmulPreferenceCreate(&g.pref));
    const std::uint64_t ws = kWorkspaceBytes;
    CALIB_BLAS(cublasLtMatmulPreferenceSetAttribute(g.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    return true;
}

bool Calibrator::gemm_enqueue(const Gemm& g, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, void* d) {
    const float alpha = 1.0f, beta = 0.0f;
    CALIB_BLAS(cublasLtMatmul(lt_, g.op, &alpha, a, g.a, b, g.b, &beta, d, g.d, d, g.d, &algo, workspace_.get(),
                              kWorkspaceBytes, main_.get()));
    return true;
}

bool Calibrator::measure_gemm_dtype(Dtype dt, std::vector<Point>& pts, Json& out) {
    const std::size_t elem_bytes = dt == Dtype::bf16 ? 2 : 1;
    out = Json::array();
    for (const GemmShape& s : opt_.shapes) {
        if (opt_.quick && s.flops() > 2e12) continue;  // quick mode keeps the run short
        Json rec = {{"m", s.m}, {"n", s.n}, {"k", s.k}, {"label", s.label}, {"flops", s.flops()}};
        const auto mk = static_cast<std::size_t>(s.m * s.k), kn = static_cast<std::size_t>(s.k * s.n),
                   mn = static_cast<std::size_t>(s.m * s.n);
        DeviceBuffer a, b, d;
        if (!a.allocate(mk * elem_bytes) || !b.allocate(kn * elem_bytes) || !d.allocate(mn * 2)) return false;
        if (dt == Dtype::bf16) {
            CALIB_CUDA(fill_bf16(a.get(), mk, 11, main_.get()));
            CALIB_CUDA(fill_bf16(b.get(), kn, 12, main_.get()));
        } else {
            CALIB_CUDA(fill_fp8_e4m3(a.get(), mk, 13, main_.get()));
            CALIB_CUDA(fill_fp8_e4m3(b.get(), kn, 14, main_.get()));
        }
        CALIB_CUDA(fill_bf16(d.get(), mn, 15, main_.get()));
        Gemm g;
        if (!gemm_setup(dt, s, g)) return false;
        constexpr int kMaxAlgos = 4;
        cublasLtMatmulHeuristicResult_t heur[kMaxAlgos] = {};
        int found = 0;
        const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, g.op, g.a, g.b, g.d, g.d, g.pref,
                                                                 opt_.quick ? 1 : kMaxAlgos, heur, &found);
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0)) {
            // An unsupported shape/dtype pair is a result, not a failure of the run.
            rec["skipped"] = std::string("no cuBLASLt algorithm: ") + cublasLtGetStatusString(hs);
            out.push_back(rec);
            continue;
        }
        CALIB_BLAS(hs);
        const int inner = clamp_int(std::ceil(5e11 / s.flops()), 1, 50);
        // Autotune like XLA does: time each heuristic candidate briefly and keep the fastest.
        int best = 0;
        double best_s = 0.0;
        Json tried = Json::array();
        for (int i = 0; i < found; ++i) {
            Series t;
            if (!time_series(inner, 3, [&](int) { return gemm_enqueue(g, heur[i].algo, a.get(), b.get(), d.get()); }, t)) {
                return false;
            }
            tried.push_back(t.median_s);
            if (i == 0 || t.median_s < best_s) {
                best = i;
                best_s = t.median_s;
            }
        }
        Series t;
        if (!time_series(inner, repeats_, [&](int) { return gemm_enqueue(g, heur[best].algo, a.get(), b.get(), d.get()); }, t)) {
            return false;
        }
        pts.push_back({s.flops(), t.median_s});
        rec["algorithms_tried_median_s"] = tried;
        rec["algorithm_chosen"] = best;
        rec.update(series_json("flops", s.flops(), t, "flops_per_s", s.flops() / t.median_s));
        out.push_back(rec);
    }
    return true;
}

void Calibrator::gemm_header(Measurements& m, Json& raw) {
    const PeakFlops table = peak_from_device_name(m.gpu);
    m.peak_bf16_flops_per_s = opt_.peak_bf16_flops > 0 ? opt_.peak_bf16_flops : table.bf16_flops_per_s;
    m.peak_fp8_flops_per_s = opt_.peak_fp8_flops > 0 ? opt_.peak_fp8_flops : table.fp8_flops_per_s;
    const auto source = [](double arg, double tab) {
        return arg > 0 ? "--peak argument" : tab > 0 ? "compiled-in table by device name"
                                                     : "unknown: best measured rate used as the peak";
    };
    Json& g = raw["gemm"];
    g["layout"] = "cuBLASLt TN (A^T * B), fp32 accumulate, bf16 output, 32 MiB workspace, best of up to 4 heuristic algorithms";
    g["fp8_fast_accumulation"] = opt_.fp8_fast_accum;
    g["fp8_accumulation"] = opt_.fp8_fast_accum
                                ? "CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1 (as fp8 training's forward GEMMs)"
                                : "CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0 (precise: --fp8-no-fast-accum)";
    g["peak_bf16_flops_per_s"] = m.peak_bf16_flops_per_s;
    g["peak_bf16_source"] = source(opt_.peak_bf16_flops, table.bf16_flops_per_s);
    g["peak_fp8_flops_per_s"] = m.peak_fp8_flops_per_s;
    g["peak_fp8_source"] = source(opt_.peak_fp8_flops, table.fp8_flops_per_s);
    g["nvfp4"] = "skipped: not measured (block-scaled NVFP4 GEMMs need sm_100+ and per-block scale tensors this tool does not set up)";
}

bool Calibrator::measure_gemms_bf16(Measurements& m, Json& raw) {
    progress("bf16 GEMMs (cuBLASLt)");
    gemm_header(m, raw);
    Json list;
    const bool ok = measure_gemm_dtype(Dtype::bf16, m.gemm_bf16, list);
    raw["gemm"]["bf16"] = list;  // the shapes done so far, also when one failed
    return ok;
}

bool Calibrator::measure_gemms_fp8(Measurements& m, Json& raw) {
    progress("fp8 e4m3 GEMMs (cuBLASLt)");
    gemm_header(m, raw);
    Json list;
    const bool ok = measure_gemm_dtype(Dtype::fp8_e4m3, m.gemm_fp8, list);
    raw["gemm"]["fp8_e4m3"] = list;
    return ok;
}

bool Calibrator::measure_interference(Measurements& m, Json& raw) {
    progress("copy/compute interference");
    const std::size_t copy_bytes = max_copy_bytes_;
    const double copy_s = static_cast<double>(copy_bytes) / std::max(h2d_large_bytes_per_s_, d2h_large_bytes_per_s_);
    // The compute batch must fit well inside the copy so every op runs while the copy is in flight.
    const double target_s = 0.4 * copy_s;

    const std::size_t stream_n = std::min<std::size_t>(16 * kMiB, max_copy_bytes_ / sizeof(float));
    const GemmShape gs{opt_.quick ? 4096 : 8192, opt_.quick ? 4096 : 8192, opt_.quick ? 4096 : 8192, "interference GEMM"};
    DeviceBuffer ga, gb, gd;
    const auto mk = static_cast<std::size_t>(gs.m * gs.k);
    if (!ga.allocate(mk * 2) || !gb.allocate(mk * 2) || !gd.allocate(mk * 2)) return false;
    CALIB_CUDA(fill_bf16(ga.get(), mk, 21, main_.get()));
    CALIB_CUDA(fill_bf16(gb.get(), mk, 22, main_.get()));
    CALIB_CUDA(fill_bf16(gd.get(), mk, 23, main_.get()));
    Gemm g;
    if (!gemm_setup(Dtype::bf16, gs, g)) return false;
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    CALIB_BLAS(cublasLtMatmulAlgoGetHeuristic(lt_, g.op, g.a, g.b, g.d, g.d, g.pref, 1, &heur, &found));
    CALIB_REQUIRE(found > 0, "no cuBLASLt algorithm for the interference GEMM");

    struct Workload {
        const char* name;
        double work;  // bytes or FLOPs of one op
        std::function<bool(int)> op;
    };
    const Workload workloads[] = {
        {"streaming_kernel", 12.0 * static_cast<double>(stream_n), [&](int) { return enqueue_axpy(stream_n); }},
        {"gemm_bf16", gs.flops(), [&](int) { return gemm_enqueue(g, heur.algo, ga.get(), gb.get(), gd.get()); }},
    };
    Json out = Json::object();
    out["copy_bytes"] = copy_bytes;
    for (const Workload& w : workloads) {
        Series one;
        if (!time_series(1, 3, w.op, one)) return false;
        const int iters = clamp_int(target_s / one.median_s, 1, 100000);
        std::vector<double> alone, with_h2d, with_d2h;
        int not_fully_overlapped = 0;
        for (int r = 0; r < repeats_; ++r) {
            double t = 0.0;
            if (!time_batch(iters, w.op, t)) return false;
            alone.push_back(t);
            for (const auto kind : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
                CALIB_CUDA(cudaEventRecord(ev_copy_start_.get(), aux_.get()));
                if (!copy_with(kind, copy_bytes, aux_.get())) return false;
                CALIB_CUDA(cudaEventRecord(ev_copy_stop_.get(), aux_.get()));
                CALIB_CUDA(cudaStreamWaitEvent(main_.get(), ev_copy_start_.get(), 0));
                if (!time_batch(iters, w.op, t)) return false;
                CALIB_CUDA(cudaEventSynchronize(ev_copy_stop_.get()));
                float copy_ms = 0.0f, compute_end_ms = 0.0f;
                CALIB_CUDA(cudaEventElapsedTime(&copy_ms, ev_copy_start_.get(), ev_copy_stop_.get()));
                CALIB_CUDA(cudaEventElapsedTime(&compute_end_ms, ev_copy_start_.get(), ev_stop_.get()));
                if (compute_end_ms > copy_ms) ++not_fully_overlapped;
                (kind == cudaMemcpyHostToDevice ? with_h2d : with_d2h).push_back(t);
            }
        }
        const double alone_s = median(alone), h2d_s = median(with_h2d), d2h_s = median(with_d2h);
        // rate_with / rate_alone = time_alone / time_with for the same work.
        const double slow_h2d = 1.0 - alone_s / h2d_s, slow_d2h = 1.0 - alone_s / d2h_s;
        out[w.name] = {
            {"work_per_op", w.work},
            {"work_unit", std::string(w.name) == "gemm_bf16" ? "flops" : "bytes"},
            {"ops_per_batch", iters},
            {"alone_per_op_s", alone},
            {"with_h2d_per_op_s", with_h2d},
            {"with_d2h_per_op_s", with_d2h},
            {"slowdown_during_h2d", slow_h2d},
            {"slowdown_during_d2h", slow_d2h},
            {"batches_not_fully_inside_copy", not_fully_overlapped},
        };
        if (std::string(w.name) == "streaming_kernel") {
            m.slowdown_during_h2d = slow_h2d;
            m.slowdown_during_d2h = slow_d2h;
            m.interference_measured = true;
        }
    }
    out["profile_uses"] = "streaming_kernel slowdowns (memory-bound), max over directions, clamped to [0, 0.99]";
    raw["interference"] = out;
    return true;
}

template <class Fn>
bool Calibrator::run_stage(const char* name, Measurements& m, Json& raw, Fn&& fn, const char* skip_reason) {
    Json rec;
    const double at_s = seconds_since(start_);
    rec["started_at_s"] = at_s;
    if (skip_reason == nullptr && opt_.budget_s > 0 && at_s > opt_.budget_s) {
        skip_reason = "time budget (--budget-s) spent before this stage";
    }
    if (skip_reason != nullptr) {
        rec["status"] = "skipped";
        rec["reason"] = skip_reason;
        raw["stages"][name] = rec;
        std::fprintf(stderr, "hbmsim-calibrate-cuda: stage %s skipped: %s\n", name, skip_reason);
        return false;
    }
    const Measurements before = m;
    (void)take_failure();
    bool ok = false;
    std::string error;
    try {
        ok = fn();
    } catch (const std::exception& e) {
        error = std::string("exception: ") + e.what();
    } catch (...) {
        error = "unknown exception";
    }
    if (!ok && error.empty()) error = take_failure();
    if (!ok && error.empty()) error = "failed (no message)";
    rec["wall_s"] = seconds_since(start_) - at_s;
    if (ok) {
        rec["status"] = "ok";
    } else {
        m = before;
        rec["status"] = "failed";
        rec["error"] = error;
        // Let the next stage start clean: drain both streams and clear a non-sticky error. A sticky error
        // (the context is lost) makes every later stage fail too, each recorded with its own message.
        (void)cudaStreamSynchronize(main_.get());
        (void)cudaStreamSynchronize(aux_.get());
        const cudaError_t after = cudaGetLastError();
        const cudaError_t sync = cudaDeviceSynchronize();
        if (after != cudaSuccess || sync != cudaSuccess) {
            rec["device_state_after"] = std::string(cudaGetErrorString(sync != cudaSuccess ? sync : after));
        }
        std::fprintf(stderr, "hbmsim-calibrate-cuda: stage %s failed: %s (the other stages still run)\n", name,
                     error.c_str());
    }
    raw["stages"][name] = rec;
    return ok;
}

bool Calibrator::run(Measurements& m, Json& raw) {
    start_ = Clock::now();
    raw["stages"] = Json::object();
    if (!run_stage("setup", m, raw, [&] { return setup(m, raw); })) {
        raw["measurement_wall_s"] = seconds_since(start_);
        return false;  // no buffers, streams or cuBLASLt handle: nothing else can run
    }
    run_stage("launch_overhead", m, raw, [&] { return measure_launch_overhead(m, raw); });
    const bool pinned = run_stage("pinned_copies", m, raw, [&] { return measure_pinned_copies(m, raw); });
    run_stage("pageable_copies", m, raw, [&] { return measure_pageable_copies(m, raw); });
    run_stage("d2d_copies", m, raw, [&] { return measure_d2d(m, raw); });
    run_stage("streaming_kernel", m, raw, [&] { return measure_streaming(m, raw); });
    run_stage("gemm_bf16", m, raw, [&] { return measure_gemms_bf16(m, raw); });
    run_stage("gemm_fp8", m, raw, [&] { return measure_gemms_fp8(m, raw); },
              cc_major_ * 10 + cc_minor_ >= 89 ? nullptr : "FP8 tensor cores need compute capability 8.9 or newer");
    run_stage("interference", m, raw, [&] { return measure_interference(m, raw); },
              pinned ? nullptr : "needs the pinned-copy rates (the pinned_copies stage did not succeed)");
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    raw["collectives"] = {
        {"status", "skipped"},
        {"reason", devices > 1 ? "NCCL is deliberately not a build dependency of this tool"
                               : "only one GPU visible (NCCL all-gather/reduce-scatter need more than one)"},
        {"device_count", devices},
    };
    raw["attention"] = "not measured: efficiency.attention keeps the system's defaults";
    m.latency_fit_max_bytes = kMiB;
    raw["measurement_wall_s"] = seconds_since(start_);
    return true;
}

}  // namespace

bool run_measurements(const Options& opt, Measurements& m, Json& raw) {
    Calibrator c(opt);
    return c.run(m, raw);
}

}  // namespace hbmsim::calib
