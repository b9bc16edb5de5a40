#pragma once
/// @file
/// `device_primitives`: the CUDA primitives (primitive/kernels/*.hpp) behind a table of plain function
/// pointers, so that code compiled without nvcc (the collectives, the backends, the gradient
/// reducer, a trainer's .cpp files) can run them on device memory, and allocate, free and wait
/// for it.
/// The manual: docs/algorithms.md, "Header notes", `ringzero/primitive/device_primitives.hpp`.

#include <atomic>
#include <cstdint>
#include <optional>
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
  /// Where `ptr` lies as CUDA sees it (cudaPointerGetAttributes): `*kind` a `pointer_kind`
  /// value, `*device` the CUDA device of device memory (else -1). Host only, no stream.
  int (*pointer_kind)(const void* ptr, int* kind, int* device) noexcept = nullptr;
};

/// What memory a pointer is, as the registered CUDA table says (`locate_pointer`); the values
/// of cudaMemoryType.
enum class pointer_kind : int { host = 0, pinned_host = 1, device = 2, managed = 3 };

/// Where a pointer lies: its kind and, for device memory, its CUDA device (else -1).
struct pointer_location {
  pointer_kind kind = pointer_kind::host;
  int device = -1;
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

/// Where `ptr` lies, from the registered table's `pointer_kind` (cudaPointerGetAttributes);
/// std::nullopt when no table is registered (a program without CUDA, where every pointer is
/// host memory), the table cannot tell, or the query fails. Any thread.
inline std::optional<pointer_location> locate_pointer(const void* ptr) noexcept {
  const device_primitives* p = registered_device_primitives();
  if (p == nullptr || p->pointer_kind == nullptr || ptr == nullptr) return std::nullopt;
  int kind = 0, device = -1;
  if (p->pointer_kind(ptr, &kind, &device) != 0 || kind < 0 || kind > 3) return std::nullopt;
  return pointer_location{static_cast<pointer_kind>(kind), kind == 2 ? device : -1};
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
