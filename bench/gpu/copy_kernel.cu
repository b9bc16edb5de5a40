// The copy kernel of ringzero-gpu-bench: dst[i] = src[i] over 32-bit words with the same
// element-wise machinery as the CUDA primitives (16-byte vectors, scalar head and tail,
// resident-block grid; primitive/elementwise.cuh), so its bandwidth is the ceiling the
// primitives are measured against.
#include <cuda_runtime.h>

#include <cstdint>

#include "copy_kernel.hpp"
#include "ringzero/primitive/elementwise.cuh"

namespace {

struct identity {
  __device__ std::uint32_t operator()(std::uint32_t x) const { return x; }
};

}  // namespace

int ringzero_bench_copy_kernel(void* dst, const void* src, std::uint64_t bytes, void* stream) {
  return static_cast<int>(ringzero::primitive::device::detail::launch_unary(
      static_cast<std::uint32_t*>(dst), static_cast<const std::uint32_t*>(src), bytes / 4, identity{},
      static_cast<cudaStream_t>(stream)));
}
