#pragma once
/// @file
/// Kernels written once for a CUDA device and for the host. Every kernel of ringzero is a
/// *body*: a struct holding the kernel's arguments with a member
/// `template <class Block> RINGZERO_HOST_DEVICE void operator()(Block& b) const` that does one
/// block's work and a `static constexpr const char* kernel_name`. A *launcher* runs a body
/// over a grid of blocks: on a GPU `cuda_launcher` (primitive/cuda_launch.cuh) launches one
/// CUDA kernel whose blocks call the body with a block of CUDA threads; on the host
/// `host_launcher` below walks the blocks, and each block's threads, one after another. The
/// code that chooses a kernel, splits the work, sizes the grid and computes every element is
/// the same on both, so the host run (the `cuda-on-host` tests, in CI) executes the source
/// that a GPU executes; only the launch itself and the few device instructions behind
/// `#if defined(__CUDA_ARCH__)` differ (listed in docs/gpu.md).
///
/// What a body may do with its block `b` (the same meaning on both launchers):
/// - `b.block_index()`, `b.grid_blocks()`, `b.block_threads()`: CUDA's blockIdx.x, gridDim.x
///   and blockDim.x (64-bit).
/// - `b.for_each_thread(f)`: `f(t)` for every thread `t` of the block. On a GPU each thread
///   calls it once with its own threadIdx.x; on the host the calls run in turn. All of a
///   thread's work goes inside: code outside runs once per thread on a GPU and once per block
///   on the host, so it may only compute values that are the same for every thread. A thread
///   keeps nothing from one call to the next (its locals end with the call): what must
///   survive goes into shared memory.
/// - `b.sync()`: every thread's calls so far are finished and their writes to shared memory
///   seen (`__syncthreads()`; nothing to do on the host, where the calls already ran). Every
///   thread reaches it, so never inside `for_each_thread`.
/// - `b.template shared<T, N>()`: the block's one array of N values of a trivial type T in
///   shared memory (one such array per body; N * sizeof(T) at most `max_shared_bytes`).
///
/// Preconditions of every launch: 1 <= threads <= `max_block_threads`, blocks >= 1, and the
/// pointers inside the body valid for the memory the launcher runs on (device memory for
/// `cuda_launcher`, host memory for `host_launcher`).
/// Thread semantics: a `host_launcher` runs the kernel on the calling thread and returns when
/// it is done; it is not shared between threads while it runs.

#include <cstdint>
#include <cstring>

#include "ringzero/core/config.hpp"

#if defined(__CUDA_ARCH__)
/// Asks nvcc to unroll the loop that follows in device code (nothing for the host).
#define RINGZERO_UNROLL _Pragma("unroll")
#else
#define RINGZERO_UNROLL
#endif

namespace ringzero::primitive::kernels {

/// The most threads per block of any ringzero kernel (the `__launch_bounds__` of
/// `cuda_launcher`'s kernel).
inline constexpr unsigned max_block_threads = 256;

/// The most bytes of one body's shared array.
inline constexpr unsigned max_shared_bytes = 8192;

/// What a launch returns: 0 when it ran (host) or was enqueued (CUDA), else a cudaError_t
/// value: `launch_invalid_value` is cudaErrorInvalidValue (an invalid dtype, kind, divisor or
/// grid), `launch_misaligned_address` cudaErrorMisalignedAddress (a pointer not aligned to its
/// element type, refused before launching); primitive/cuda_launch.cuh checks the values.
inline constexpr int launch_success = 0;
inline constexpr int launch_invalid_value = 1;
inline constexpr int launch_misaligned_address = 716;

/// One block of a `host_launcher` grid (the interface described in the file comment). Its
/// members are `__host__ __device__` only so that nvcc accepts bodies instantiated with it in a
/// .cu file; it runs on the host.
class host_block {
 public:
  /// Block `block` of `blocks`, with `threads` threads and `shared` (`max_shared_bytes`,
  /// 16-byte aligned) as its shared memory.
  RINGZERO_HOST_DEVICE host_block(std::uint64_t block, std::uint64_t blocks, unsigned threads, bool reverse,
                                  unsigned char* shared) noexcept
      : block_(block), blocks_(blocks), threads_(threads), reverse_(reverse), shared_(shared) {}

  RINGZERO_HOST_DEVICE std::uint64_t block_index() const noexcept { return block_; }
  RINGZERO_HOST_DEVICE std::uint64_t grid_blocks() const noexcept { return blocks_; }
  RINGZERO_HOST_DEVICE std::uint64_t block_threads() const noexcept { return threads_; }

  /// `f(t)` for every thread `t` in turn (last to first when the launcher says `reverse`).
  template <class F>
  RINGZERO_HOST_DEVICE void for_each_thread(F&& f) const {
    for (unsigned i = 0; i < threads_; ++i) f(reverse_ ? threads_ - 1 - i : i);
  }

  /// Nothing: `for_each_thread` has already run every thread.
  RINGZERO_HOST_DEVICE void sync() const noexcept {}

  /// The block's shared array, filled with 0xff bytes when the block asks for it (a GPU leaves
  /// it uninitialised: a body that reads before it writes then reads NaNs and all-ones
  /// integers on the host, which the host tests see).
  template <class T, unsigned N>
  RINGZERO_HOST_DEVICE T* shared() noexcept {
    static_assert(N * sizeof(T) <= max_shared_bytes, "a body's shared array is at most max_shared_bytes");
    static_assert(alignof(T) <= 16);
    std::memset(shared_, 0xff, N * sizeof(T));
    return reinterpret_cast<T*>(shared_);
  }

 private:
  std::uint64_t block_;
  std::uint64_t blocks_;
  unsigned threads_;
  bool reverse_;
  unsigned char* shared_;
};

/// Runs bodies on the host, block after block and thread after thread, on host memory: the
/// CI's way of executing ringzero's CUDA kernels (tests/cuda_on_host). `resident` is what it
/// reports as the blocks a device keeps resident, which caps the grids of the element-wise
/// kernels: a small value makes their grid-stride loops go round. `reverse` runs blocks and
/// threads last to first, which a kernel whose result depends on the order of its blocks or
/// threads does not survive. `sequential` asks the purely element-wise kernels that honour it
/// (`runs_sequentially`: the optimizer update) for one block of one thread, whose grid-stride
/// loop then walks every element in order: the fastest way for one CPU thread, used by the host
/// stream's training path; the result is the same for any grid.
struct host_launcher {
  std::uint64_t resident = 4;
  bool reverse = false;
  bool sequential = false;

  /// Runs `body` over `blocks` blocks of `threads` threads; `launch_invalid_value` (and nothing
  /// run) for a grid outside the preconditions.
  template <class Body>
  int launch(const Body& body, std::uint64_t blocks, unsigned threads) const {
    if (blocks == 0 || threads == 0 || threads > max_block_threads) return launch_invalid_value;
    alignas(16) unsigned char shared[max_shared_bytes];
    for (std::uint64_t i = 0; i < blocks; ++i) {
      host_block b(reverse ? blocks - 1 - i : i, blocks, threads, reverse, shared);
      body(b);
    }
    return launch_success;
  }

  /// The blocks of `Body` one device keeps resident: `resident`.
  template <class Body>
  std::uint64_t resident_blocks() const noexcept {
    return resident < 1 ? 1 : resident;
  }

  /// Copies `bytes` from `src` to `dst` (the same dtype's cast).
  int copy(void* dst, const void* src, std::uint64_t bytes) const noexcept {
    if (bytes != 0 && dst != src) std::memmove(dst, src, static_cast<std::size_t>(bytes));
    return launch_success;
  }
};

/// True when `launcher` asks element-wise kernels for one block of one thread
/// (`host_launcher::sequential`); false for a launcher without that setting (`cuda_launcher`).
/// Only kernels whose threads share nothing may honour it: a block that reduces through shared
/// memory needs its threads.
template <class Launcher>
constexpr bool runs_sequentially(const Launcher& launcher) noexcept {
  if constexpr (requires { launcher.sequential; })
    return launcher.sequential;
  else
    return false;
}

}  // namespace ringzero::primitive::kernels
