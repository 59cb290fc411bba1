// Device kernels used by the calibration tool. Implemented in kernels.cu (nvcc); callers are plain C++.
// Every launcher returns the launch status (cudaGetLastError) so the caller can check it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace hbmsim::calib {

// Fill with deterministic pseudo-random values in [-1, 1) (never all zeros) from a per-element hash,
// so no cuRAND dependency is needed. `seed` varies the stream between buffers.
cudaError_t fill_f32(float* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream);
cudaError_t fill_bf16(void* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream);
cudaError_t fill_fp8_e4m3(void* dst, std::size_t count, std::uint32_t seed, cudaStream_t stream);

// y = a * x + y over `count` floats: the memory-bound streaming kernel (12 bytes moved per element).
cudaError_t launch_axpy(float a, const float* x, float* y, std::size_t count, int sm_count,
                        cudaStream_t stream);

// Does nothing: measures the cost of a kernel launch.
cudaError_t launch_empty(cudaStream_t stream);

}  // namespace hbmsim::calib
