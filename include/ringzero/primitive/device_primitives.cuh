#pragma once
/// @file
/// The CUDA primitives on a `cudaStream_t` (`primitive::device::reduce_into`, `cast`, `scale`,
/// `divide`, `fill`: the kernels of primitive/kernels/*.hpp launched by `cuda_launcher`), the
/// table of them (primitive/device_primitives.hpp), and its registration: the program-wide table is registered when the
/// program starts (by the initialiser of an inline variable) and again by every call of
/// `register_cuda_primitives()`, for linkers that drop an object file nothing refers to.
/// Include it (normally through <ringzero/cuda.cuh>) in one .cu file of a program; including it
/// in several is harmless. Requires nvcc.

#if !defined(__CUDACC__)
#error \
    "ringzero/primitive/device_primitives.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include "ringzero/primitive/cuda_launch.cuh"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/kernels/cast.hpp"
#include "ringzero/primitive/kernels/fill.hpp"
#include "ringzero/primitive/kernels/reduce_into.hpp"
#include "ringzero/primitive/kernels/scale.hpp"

namespace ringzero {

namespace primitive::device {

/// `dst[i] = post(pre_a(a[i]) op pre_b(b[i]))` for `i < count` elements of `spec.type`
/// (primitive/kernels/reduce_into.hpp), enqueued on `stream`; cudaErrorInvalidValue for an
/// invalid dtype or kind or a negative divisor.
inline cudaError_t reduce_into(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec,
                               cudaStream_t stream) noexcept {
  return static_cast<cudaError_t>(kernels::reduce_into(kernels::cuda_launcher{stream}, dst, a, b, count, spec));
}
/// `count` elements of `src_type` converted into `dst_type` (primitive/kernels/cast.hpp),
/// enqueued on `stream`.
inline cudaError_t cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count,
                        cudaStream_t stream) noexcept {
  return static_cast<cudaError_t>(kernels::cast(kernels::cuda_launcher{stream}, dst, dst_type, src, src_type, count));
}
/// `dst[i] = scalar * src[i]` (primitive/kernels/scale.hpp), enqueued on `stream`.
inline cudaError_t scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar,
                         cudaStream_t stream) noexcept {
  return static_cast<cudaError_t>(kernels::scale(kernels::cuda_launcher{stream}, dst, src, count, type, scalar));
}
/// `dst[i] = src[i] / divisor` (primitive/kernels/scale.hpp), enqueued on `stream`.
inline cudaError_t divide(void* dst, const void* src, std::uint64_t count, dtype type, std::int64_t divisor,
                          cudaStream_t stream) noexcept {
  return static_cast<cudaError_t>(kernels::divide(kernels::cuda_launcher{stream}, dst, src, count, type, divisor));
}
/// `count` elements of `type` set to `value` (primitive/kernels/fill.hpp), enqueued on `stream`.
inline cudaError_t fill(void* dst, std::uint64_t count, dtype type, double value, cudaStream_t stream) noexcept {
  return static_cast<cudaError_t>(kernels::fill(kernels::cuda_launcher{stream}, dst, count, type, value));
}

}  // namespace primitive::device

namespace primitive::device::detail {

inline int table_reduce_into(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec,
                             void* stream) noexcept {
  return static_cast<int>(device::reduce_into(dst, a, b, count, spec, static_cast<cudaStream_t>(stream)));
}
inline int table_cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count,
                      void* stream) noexcept {
  return static_cast<int>(device::cast(dst, dst_type, src, src_type, count, static_cast<cudaStream_t>(stream)));
}
inline int table_scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar,
                       void* stream) noexcept {
  return static_cast<int>(device::scale(dst, src, count, type, scalar, static_cast<cudaStream_t>(stream)));
}
inline int table_fill(void* dst, std::uint64_t count, dtype type, double value, void* stream) noexcept {
  return static_cast<int>(device::fill(dst, count, type, value, static_cast<cudaStream_t>(stream)));
}
inline int table_copy(void* dst, const void* src, std::uint64_t bytes, void* stream) noexcept {
  if (bytes == 0 || dst == src) return 0;
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}
inline int table_set_device(int device) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return 0;
  return static_cast<int>(cudaSetDevice(device));
}
inline int table_divide(void* dst, const void* src, std::uint64_t count, dtype type, std::int64_t divisor,
                        void* stream) noexcept {
  return static_cast<int>(device::divide(dst, src, count, type, divisor, static_cast<cudaStream_t>(stream)));
}
inline int table_allocate(void** ptr, std::uint64_t bytes) noexcept {
  *ptr = nullptr;
  return static_cast<int>(cudaMalloc(ptr, static_cast<std::size_t>(bytes == 0 ? 1 : bytes)));
}
inline int table_deallocate(void* ptr) noexcept { return ptr ? static_cast<int>(cudaFree(ptr)) : 0; }
inline int table_synchronize(void* stream) noexcept {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}
inline int table_allocate_pinned(void** ptr, std::uint64_t bytes) noexcept {
  *ptr = nullptr;
  return static_cast<int>(cudaMallocHost(ptr, static_cast<std::size_t>(bytes == 0 ? 1 : bytes)));
}
inline int table_deallocate_pinned(void* ptr) noexcept { return ptr ? static_cast<int>(cudaFreeHost(ptr)) : 0; }
inline int table_pointer_kind(const void* ptr, int* kind, int* device) noexcept {
  cudaPointerAttributes a{};
  const cudaError_t rc = cudaPointerGetAttributes(&a, ptr);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the next call
    return static_cast<int>(rc);
  }
  *kind = static_cast<int>(a.type);  // cudaMemoryTypeUnregistered 0, Host 1, Device 2, Managed 3
  *device = a.type == cudaMemoryTypeDevice ? a.device : -1;
  return 0;
}
inline const char* table_error_name(int code) noexcept { return cudaGetErrorName(static_cast<cudaError_t>(code)); }
inline const char* table_error_string(int code) noexcept { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

/// The program-wide table of the CUDA primitives.
inline constexpr device_primitives cuda_primitives_table{&table_reduce_into,
                                                         &table_cast,
                                                         &table_scale,
                                                         &table_fill,
                                                         &table_copy,
                                                         &table_set_device,
                                                         &table_error_name,
                                                         &table_error_string,
                                                         &table_divide,
                                                         &table_allocate,
                                                         &table_deallocate,
                                                         &table_synchronize,
                                                         &table_allocate_pinned,
                                                         &table_deallocate_pinned,
                                                         &table_pointer_kind};

/// Registers the table when the program starts.
inline const bool cuda_primitives_registered = (register_device_primitives(&cuda_primitives_table), true);

}  // namespace primitive::device::detail

/// Registers the CUDA primitives of this program for code compiled without nvcc (the device
/// data operations of the collectives, a trainer's .cpp files). Idempotent and thread-safe;
/// normally done automatically when the program starts.
inline void register_cuda_primitives() noexcept {
  primitive::register_device_primitives(&primitive::device::detail::cuda_primitives_table);
}

}  // namespace ringzero
