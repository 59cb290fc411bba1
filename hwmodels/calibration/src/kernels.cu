// Kernels for hbmsim-calibrate-cuda. Kept minimal: the measurement logic lives in host C++.
#include "kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace hbmsim::calib {
namespace {

constexpr int kThreads = 256;

// Small integer hash (lowbias32); good enough to make inputs look random to the hardware.
__device__ __forceinline__ std::uint32_t hash32(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Maps (index, seed) to a float in [-1, 1); never exactly zero because of the +0.5 offset.
__device__ __forceinline__ float rand_unit(std::size_t i, std::uint32_t seed) {
    const std::uint32_t h = hash32(static_cast<std::uint32_t>(i) ^ hash32(seed + static_cast<std::uint32_t>(i >> 32)));
    return (static_cast<float>(h >> 8) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void fill_f32_kernel(float* dst, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        dst[i] = rand_unit(i, seed);
    }
}

__global__ void fill_bf16_kernel(__nv_bfloat16* dst, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        dst[i] = __float2bfloat16(rand_unit(i, seed));
    }
}

__global__ void fill_fp8_kernel(__nv_fp8_e4m3* dst, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        dst[i] = __nv_fp8_e4m3(rand_unit(i, seed));
    }
}

// Vectorised with float4 when aligned so the kernel is limited by HBM, not by instruction issue.
__global__ void axpy_vec4_kernel(float a, const float4* x, float4* y, std::size_t n4) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n4;
         i += std::size_t{gridDim.x} * blockDim.x) {
        const float4 xv = x[i];
        float4 yv = y[i];
        yv.x = a * xv.x + yv.x;
        yv.y = a * xv.y + yv.y;
        yv.z = a * xv.z + yv.z;
        yv.w = a * xv.w + yv.w;
        y[i] = yv;
    }
}

__global__ void axpy_kernel(float a, const float* x, float* y, std::size_t n) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        y[i] = a * x[i] + y[i];
    }
}

__global__ void empty_kernel() {}

unsigned grid_for(std::size_t work_items, unsigned max_blocks) {
    const std::size_t blocks = (work_items + kThreads - 1) / kThreads;
    if (blocks == 0) return 1;
    return blocks < max_blocks ? static_cast<unsigned>(blocks) : max_blocks;
}

constexpr unsigned kFillMaxBlocks = 65535;

}  // namespace

cudaError_t fill_f32(float* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream) {
    fill_f32_kernel<<<grid_for(count, kFillMaxBlocks), kThreads, 0, stream>>>(dst, count, seed);
    return cudaGetLastError();
}

cudaError_t fill_bf16(void* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream) {
    fill_bf16_kernel<<<grid_for(count, kFillMaxBlocks), kThreads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(dst), count, seed);
    return cudaGetLastError();
}

cudaError_t fill_fp8_e4m3(void* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream) {
    fill_fp8_kernel<<<grid_for(count, kFillMaxBlocks), kThreads, 0, stream>>>(
        static_cast<__nv_fp8_e4m3*>(dst), count, seed);
    return cudaGetLastError();
}

cudaError_t launch_axpy(float a, const float* x, float* y, std::size_t count, int sm_count,
                        cudaStream_t stream) {
    // Enough resident blocks to keep many loads in flight on every SM; more only adds scheduling cost.
    const unsigned max_blocks = static_cast<unsigned>(sm_count > 0 ? sm_count : 1) * 16U;
    const bool aligned = count % 4 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0 &&
                         reinterpret_cast<std::uintptr_t>(y) % 16 == 0;
    if (aligned) {
        const std::size_t n4 = count / 4;
        axpy_vec4_kernel<<<grid_for(n4, max_blocks), kThreads, 0, stream>>>(
            a, reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n4);
    } else {
        axpy_kernel<<<grid_for(count, max_blocks), kThreads, 0, stream>>>(a, x, y, count);
    }
    return cudaGetLastError();
}

cudaError_t launch_empty(cudaStream_t stream) {
    empty_kernel<<<1, 1, 0, stream>>>();
    return cudaGetLastError();
}

}  // namespace hbmsim::calib
