#pragma once
/// @file
/// The CUDA side of primitive/kernels/grid.hpp: `cuda_launcher` launches a kernel body on a
/// stream as one CUDA kernel, `block_kernel<Body>`, whose every block calls the body with a
/// `cuda_block` (CUDA's block and thread indices, `__syncthreads()`, `__shared__` memory).
/// With the device instructions behind `#if defined(__CUDA_ARCH__)` in the bodies, these are
/// the lines of the kernels that only a GPU runs (docs/gpu.md lists them). Requires nvcc.
/// Thread semantics: a launch is asynchronous on the launcher's stream, on the calling
/// thread's current device, and returns the launch's cudaError_t as an int.

#if !defined(__CUDACC__)
#error "ringzero/primitive/cuda_launch.cuh launches CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "ringzero/primitive/kernels/grid.hpp"

namespace ringzero::primitive::kernels {

static_assert(launch_invalid_value == static_cast<int>(cudaErrorInvalidValue));
static_assert(launch_success == static_cast<int>(cudaSuccess));
static_assert(launch_misaligned_address == static_cast<int>(cudaErrorMisalignedAddress));

/// One block of a CUDA grid, seen by one of its threads (the interface of grid.hpp).
struct cuda_block {
  __device__ std::uint64_t block_index() const { return blockIdx.x; }
  __device__ std::uint64_t grid_blocks() const { return gridDim.x; }
  __device__ std::uint64_t block_threads() const { return blockDim.x; }
  template <class F>
  __device__ void for_each_thread(F&& f) const {
    f(static_cast<std::uint64_t>(threadIdx.x));
  }
  __device__ void sync() const { __syncthreads(); }
  template <class T, unsigned N>
  __device__ T* shared() const {
    static_assert(N * sizeof(T) <= max_shared_bytes, "a body's shared array is at most max_shared_bytes");
    __shared__ T storage[N];
    return storage;
  }
};

/// The one CUDA kernel: every block runs `body`.
template <class Body>
__global__ void __launch_bounds__(max_block_threads) block_kernel(Body body) {
  cuda_block b;
  body(b);
}

/// Launches bodies on a CUDA stream (see the file comment).
struct cuda_launcher {
  cudaStream_t stream = nullptr;

  template <class Body>
  int launch(const Body& body, std::uint64_t blocks, unsigned threads) const noexcept {
    if (blocks == 0 || blocks > 0x7fffffffu || threads == 0 || threads > max_block_threads) return launch_invalid_value;
    block_kernel<Body><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(body);
    return static_cast<int>(cudaGetLastError());
  }

  /// Blocks of `block_kernel<Body>` the current device keeps resident at once (SMs x blocks
  /// per SM at `max_block_threads` threads), queried once per kernel and device; 1024 when the
  /// query fails.
  template <class Body>
  std::uint64_t resident_blocks() const noexcept {
    constexpr int max_devices = 64;
    static std::atomic<int> cache[max_devices] = {};
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= max_devices) {
      (void)cudaGetLastError();
      return 1024;
    }
    int blocks = cache[device].load(std::memory_order_relaxed);
    if (blocks == 0) {
      int sms = 0, per_sm = 0;
      if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, block_kernel<Body>, max_block_threads, 0) !=
              cudaSuccess ||
          sms <= 0 || per_sm <= 0) {
        (void)cudaGetLastError();
        return 1024;
      }
      blocks = sms * per_sm;
      cache[device].store(blocks, std::memory_order_relaxed);
    }
    return static_cast<std::uint64_t>(blocks);
  }

  int copy(void* dst, const void* src, std::uint64_t bytes) const noexcept {
    if (bytes == 0 || dst == src) return launch_success;
    return static_cast<int>(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault, stream));
  }
};

}  // namespace ringzero::primitive::kernels
