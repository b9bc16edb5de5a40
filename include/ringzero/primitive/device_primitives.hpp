#pragma once
/// @file
/// `device_primitives`: the CUDA primitives (primitive/kernels/*.hpp) behind a table of plain function
/// pointers, so that code compiled without nvcc (the collectives, the backends, the gradient
/// reducer, a trainer's .cpp files) can run them on device memory, and allocate, free and wait
/// for it.
/// The manual: docs/algorithms.md, "Header notes", `ringzero/primitive/device_primitives.hpp`.

#include <atomic>
#include <cstdint>
#include <string>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive {

/// The CUDA primitives as function pointers. Every function enqueues its work on `stream` (a
/// cudaStream_t) on the calling thread's current device and returns the launch's cudaError_t
/// (0 on success); none blocks the host. Counts are in elements, sizes in bytes; arguments
/// follow the host primitive of the same name.
struct device_primitives {
  /// `dst = a (op) b` with the semantics of primitive/reduce.hpp's `reduce_into`.
  int (*reduce_into)(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec,
                     void* stream) noexcept = nullptr;
  /// Converts `count` elements with primitive/cast.hpp's rules.
  int (*cast)(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count,
              void* stream) noexcept = nullptr;
  /// `dst = scalar * src` with premul_sum's arithmetic (primitive/reduce.hpp's `scale_into`).
  int (*scale)(void* dst, const void* src, std::uint64_t count, dtype type, double scalar,
               void* stream) noexcept = nullptr;
  /// Sets `count` elements to `value` converted to `type` (primitive/fill.hpp's `fill`).
  int (*fill)(void* dst, std::uint64_t count, dtype type, double value, void* stream) noexcept = nullptr;
  /// Copies `bytes` bytes between any two device (or host) addresses (cudaMemcpyAsync).
  int (*copy)(void* dst, const void* src, std::uint64_t bytes, void* stream) noexcept = nullptr;
  /// Makes `device` current on the calling thread (cudaSetDevice), if it is not already.
  int (*set_device)(int device) noexcept = nullptr;
  /// "cudaErrorInvalidValue: invalid argument" for an error code returned above.
  const char* (*error_name)(int code) noexcept = nullptr;
  const char* (*error_string)(int code) noexcept = nullptr;
  /// `dst[i] = src[i] / divisor` with avg's arithmetic (primitive/reduce.hpp's `divide_into`);
  /// `divisor` >= 1.
  int (*divide)(void* dst, const void* src, std::uint64_t count, dtype type, std::int64_t divisor,
                void* stream) noexcept = nullptr;
  /// Allocates `bytes` bytes (at least 1) of device memory on the current device into `*ptr`
  /// (cudaMalloc: 256-byte aligned, contents unspecified). Blocks the host, not a stream.
  int (*allocate)(void** ptr, std::uint64_t bytes) noexcept = nullptr;
  /// Frees memory from `allocate` (cudaFree, which waits for the device; null is a no-op).
  int (*deallocate)(void* ptr) noexcept = nullptr;
  /// Blocks the calling thread until the work enqueued on `stream` so far has completed
  /// (cudaStreamSynchronize); returns the first error of that work.
  int (*synchronize)(void* stream) noexcept = nullptr;
  /// Allocates `bytes` bytes (at least 1) of page-locked host memory into `*ptr` (cudaMallocHost).
  int (*allocate_pinned)(void** ptr, std::uint64_t bytes) noexcept = nullptr;
  /// Frees memory from `allocate_pinned` (cudaFreeHost; null is a no-op).
  int (*deallocate_pinned)(void* ptr) noexcept = nullptr;
};

namespace detail {
inline std::atomic<const device_primitives*>& device_primitives_slot() noexcept {
  static std::atomic<const device_primitives*> slot{nullptr};
  return slot;
}
}  // namespace detail

/// Registers `table` for the whole program (the last registration wins; `table` must outlive
/// every use, which a static table does). Called by `<ringzero/cuda.cuh>`.
inline void register_device_primitives(const device_primitives* table) noexcept {
  detail::device_primitives_slot().store(table, std::memory_order_release);
}

/// The registered table, or nullptr when no file of the program included `<ringzero/cuda.cuh>`.
inline const device_primitives* registered_device_primitives() noexcept {
  return detail::device_primitives_slot().load(std::memory_order_acquire);
}

/// Why device primitives are unavailable (for error messages).
inline std::string device_primitives_missing_message() {
  return "no CUDA kernels are registered in this program: compile one .cu file (with nvcc) that includes "
         "<ringzero/cuda.cuh>, or use algorithm native on a backend that has it (NCCL)";
}

/// The registered table; throws errc::unsupported (with `device_primitives_missing_message`)
/// when there is none.
inline const device_primitives& require_device_primitives() {
  const device_primitives* p = registered_device_primitives();
  if (p == nullptr) throw error(errc::unsupported, device_primitives_missing_message());
  return *p;
}

}  // namespace ringzero::primitive
