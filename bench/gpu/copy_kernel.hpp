#pragma once
// The copy kernel of ringzero-gpu-bench (copy_kernel.cu): copies `bytes` (a multiple of 4)
// from `src` to `dst` on `stream` (a cudaStream_t). Returns the launch's cudaError_t.
#include <cstdint>

int ringzero_bench_copy_kernel(void* dst, const void* src, std::uint64_t bytes, void* stream);
