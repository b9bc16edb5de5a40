#pragma once
// The reference kernels of ringzero-gpu-bench (copy_kernel.cu). Streams are cudaStream_t values;
// each function returns its launch's cudaError_t.
#include <cstdint>

/// Copies `bytes` (a multiple of 4) from `src` to `dst` with the primitives' element-wise kernel.
int ringzero_bench_copy_kernel(void* dst, const void* src, std::uint64_t bytes, void* stream);
/// The same copy through cub::DeviceTransform.
int ringzero_bench_cub_copy(void* dst, const void* src, std::uint64_t bytes, void* stream);
/// dst = a + b over `count` floats through cub::DeviceTransform.
int ringzero_bench_cub_sum_float(void* dst, const void* a, const void* b, std::uint64_t count, void* stream);
