// The reference kernels of ringzero-gpu-bench:
// - a copy kernel over 32-bit words with the same element-wise machinery as the CUDA
//   primitives (16-byte vectors, scalar head and tail, resident-block grid;
//   primitive/kernels/elementwise.hpp), so its bandwidth is the ceiling the primitives are held to;
// - the same copy and a float32 sum through CUB's cub::DeviceTransform (CCCL's tuned
//   element-wise transform, which on Hopper may stage through the bulk-copy engine), to show
//   whether the primitives' own kernels leave bandwidth on the table.
#include <cuda_runtime.h>
#include <cub/device/device_transform.cuh>
#include <cuda/std/tuple>

#include <cstdint>

#include "copy_kernel.hpp"
#include "ringzero/primitive/cuda_launch.cuh"
#include "ringzero/primitive/kernels/elementwise.hpp"

namespace {

struct identity {
  __host__ __device__ std::uint32_t operator()(std::uint32_t x) const { return x; }
};

struct add_float {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};

}  // namespace

int ringzero_bench_copy_kernel(void* dst, const void* src, std::uint64_t bytes, void* stream) {
  namespace k = ringzero::primitive::kernels;
  return k::launch_unary(k::cuda_launcher{static_cast<cudaStream_t>(stream)}, static_cast<std::uint32_t*>(dst),
                         static_cast<const std::uint32_t*>(src), bytes / 4, identity{});
}

int ringzero_bench_cub_copy(void* dst, const void* src, std::uint64_t bytes, void* stream) {
  return static_cast<int>(cub::DeviceTransform::Transform(
      static_cast<const std::uint32_t*>(src), static_cast<std::uint32_t*>(dst), static_cast<std::int64_t>(bytes / 4),
      identity{}, static_cast<cudaStream_t>(stream)));
}

int ringzero_bench_cub_sum_float(void* dst, const void* a, const void* b, std::uint64_t count, void* stream) {
  return static_cast<int>(cub::DeviceTransform::Transform(
      cuda::std::make_tuple(static_cast<const float*>(a), static_cast<const float*>(b)), static_cast<float*>(dst),
      static_cast<std::int64_t>(count), add_float{}, static_cast<cudaStream_t>(stream)));
}
