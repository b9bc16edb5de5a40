#pragma once
/// @file
/// The element-wise CUDA kernels every device primitive is built on: `launch_unary`
/// (`dst[i] = f(src[i])`), `launch_binary` (`dst[i] = f(a[i], b[i])`, or `f.vector` on whole
/// vectors where `f` has one: `has_vector_op`) and `launch_generate`
/// (`dst[i] = value`), on a given stream.
///
/// Memory access: each thread moves whole vectors of V elements, V = 16 / (size of the wider
/// type), so the wider side moves 16 bytes per access (`LDG.128` / `STG.128`) and the narrower
/// side 8 or 4 (a widening cast that loaded 16 bytes and stored 32 per thread half-covered
/// each store instruction and reached only ~60% of the copy bandwidth on an H200), with U
/// independent vectors per operand in flight before the first use (U: about 64 bytes loaded
/// per input operand, at most 32 elements). The
/// elements before the first position where every pointer is aligned to its vector, and after the
/// last whole vector, are done one by one (the scalar head and tail, fewer than V elements
/// each); pointers that can never be aligned together fall back to the scalar loop throughout.
/// The grid is capped at the number of blocks the device keeps resident (queried once per
/// kernel and device) and strides over the vectors, so one launch serves any 64-bit count.
///
/// `dst` may equal an input (in place: each element is read before it is written, by the same
/// thread) but must not otherwise overlap one. Launches are asynchronous; the result is the
/// launch's cudaError_t. Requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/primitive/elementwise.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/core/half.hpp"

namespace ringzero::primitive::device {

namespace detail {

/// Threads per block of every element-wise kernel.
inline constexpr int block_threads = 256;

/// Elements per vector: 16 bytes of the wider of `A` and `B`.
template <class A, class B>
inline constexpr int vector_elements = static_cast<int>(16 / (sizeof(A) > sizeof(B) ? sizeof(A) : sizeof(B)));

/// Independent vectors per operand and thread, for input type `In` (loaded) and output type
/// `Out`: about 64 bytes of loads in flight per input operand (what keeps HBM busy), but at
/// most 32 elements per thread (each takes registers of its own once unpacked; 64 int8
/// elements per operand halved the int8 sum's bandwidth on an H200).
template <int V, class In, class Out>
inline constexpr int vector_unroll = [] {
  const int loaded = static_cast<int>(V * sizeof(In));
  const int by_bytes = loaded >= 64 ? 1 : 64 / loaded;
  const int by_elements = V >= 32 ? 1 : 32 / V;
  (void)sizeof(Out);
  return by_bytes < by_elements ? by_bytes : by_elements;
}();

/// V elements of T, aligned to their size (at most 16 bytes), so that a copy is one access of
/// 4, 8 or 16 bytes (or several of 16).
template <class T, int V>
struct alignas(sizeof(T) * V >= 16 ? 16 : sizeof(T) * V) pack {
  T v[V];
};

/// The unsigned integer of T's size.
template <class T>
using raw_bits =
    std::conditional_t<sizeof(T) == 1, std::uint8_t,
                       std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                          std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

/// What a kernel loads its input vectors of T as (`Whole`: the element function combines whole
/// vectors, `has_vector_op`): the raw bits, because a `pack` of a type with a default member
/// initialiser (float16, bfloat16) starts zeroed, and a load under a bounds check then merges
/// into those zeros half-word by half-word (`PRMT`); the raw bits took every bfloat16
/// reduce_into kernel from 77-91 registers per thread to 55-64 on sm_90 (nvcc 13.0), and the
/// float16 binary16 sum from 304 instructions to 208. Element-wise float16 keeps its own type:
/// its conversions (`cvt` plus a select for NaN) came out at 79-96 registers with raw bits,
/// 79-95 without, and fewer registers mean more resident blocks.
template <class T, bool Whole = false>
using load_t = std::conditional_t<std::is_same_v<T, float16> && !Whole, T, raw_bits<T>>;

/// The values whose bits `raw` holds.
template <class T, int V, class L>
__device__ inline pack<T, V> values_of(const pack<L, V>& raw) {
  static_assert(sizeof(pack<T, V>) == sizeof(pack<L, V>));
  pack<T, V> r;
  std::memcpy(&r, &raw, sizeof r);
  return r;
}

/// Whether the element function `F` of `launch_binary` also combines whole vectors,
/// `pack<T, V> F::vector(const pack<T, V>&, const pack<T, V>&) const` (the same result as its
/// element operator applied to each pair, in fewer instructions: float16 sums two elements per
/// `add.rn.f16x2`); the vectors use it, the scalar head and tail the element operator.
template <class F, class T, int V>
inline constexpr bool has_vector_op = requires(const F& f, const pack<T, V>& x) {
  { f.vector(x, x) } -> std::same_as<pack<T, V>>;
};

/// How a count is split: [0, head) scalar, then `vectors` vectors of V, then the scalar tail.
struct split {
  std::uint64_t head = 0;
  std::uint64_t vectors = 0;
  std::uint64_t count = 0;
};

/// The split for pointers `p[0..n)` of element sizes `size[0..n)` and V elements per vector:
/// the smallest head (< V) after which every pointer is aligned to its vector's size (V
/// elements, at most 16 bytes), or all-scalar.
inline split split_for(std::uint64_t count, int v, const void* const* p, const std::size_t* size, int n) noexcept {
  split s;
  s.count = count;
  for (int head = 0; head < v && static_cast<std::uint64_t>(head) < count; ++head) {
    bool aligned = true;
    for (int k = 0; k < n && aligned; ++k)
      aligned = (reinterpret_cast<std::uintptr_t>(p[k]) + static_cast<std::uintptr_t>(head) * size[k]) %
                    std::min<std::uintptr_t>(16, static_cast<std::uintptr_t>(v) * size[k]) ==
                0;
    if (aligned) {
      s.head = static_cast<std::uint64_t>(head);
      s.vectors = (count - s.head) / static_cast<std::uint64_t>(v);
      return s;
    }
  }
  s.head = count;  // never aligned together (or fewer than V elements): all scalar
  return s;
}

template <int V, int U, class F, class Out, class In>
__global__ void __launch_bounds__(block_threads) unary_kernel(Out* dst, const In* src, split s, F f) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t tail = s.head + s.vectors * V;
  for (std::uint64_t i = tid; i < s.head; i += stride) dst[i] = f(src[i]);
  for (std::uint64_t i = tail + tid; i < s.count; i += stride) dst[i] = f(src[i]);
  using L = load_t<In>;
  const auto* in = reinterpret_cast<const pack<L, V>*>(src + s.head);
  auto* out = reinterpret_cast<pack<Out, V>*>(dst + s.head);
  const std::uint64_t per_block = static_cast<std::uint64_t>(blockDim.x) * U;
  for (std::uint64_t base = static_cast<std::uint64_t>(blockIdx.x) * per_block + threadIdx.x; base < s.vectors;
       base += static_cast<std::uint64_t>(gridDim.x) * per_block) {
    pack<L, V> x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::uint64_t i = base + static_cast<std::uint64_t>(u) * blockDim.x;
      if (i < s.vectors) x[u] = in[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::uint64_t i = base + static_cast<std::uint64_t>(u) * blockDim.x;
      if (i < s.vectors) {
        const pack<In, V> xv = values_of<In, V>(x[u]);
        pack<Out, V> y;
#pragma unroll
        for (int k = 0; k < V; ++k) y.v[k] = f(xv.v[k]);
        out[i] = y;
      }
    }
  }
}

template <int V, int U, class F, class T>
__global__ void __launch_bounds__(block_threads) binary_kernel(T* dst, const T* a, const T* b, split s, F f) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t tail = s.head + s.vectors * V;
  for (std::uint64_t i = tid; i < s.head; i += stride) dst[i] = f(a[i], b[i]);
  for (std::uint64_t i = tail + tid; i < s.count; i += stride) dst[i] = f(a[i], b[i]);
  using L = load_t<T, has_vector_op<F, T, V>>;
  const auto* va = reinterpret_cast<const pack<L, V>*>(a + s.head);
  const auto* vb = reinterpret_cast<const pack<L, V>*>(b + s.head);
  auto* out = reinterpret_cast<pack<T, V>*>(dst + s.head);
  const std::uint64_t per_block = static_cast<std::uint64_t>(blockDim.x) * U;
  for (std::uint64_t base = static_cast<std::uint64_t>(blockIdx.x) * per_block + threadIdx.x; base < s.vectors;
       base += static_cast<std::uint64_t>(gridDim.x) * per_block) {
    pack<L, V> x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::uint64_t i = base + static_cast<std::uint64_t>(u) * blockDim.x;
      if (i < s.vectors) {
        x[u] = va[i];
        y[u] = vb[i];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::uint64_t i = base + static_cast<std::uint64_t>(u) * blockDim.x;
      if (i < s.vectors) {
        const pack<T, V> xv = values_of<T, V>(x[u]);
        const pack<T, V> yv = values_of<T, V>(y[u]);
        pack<T, V> r;
        if constexpr (has_vector_op<F, T, V>) {
          r = f.vector(xv, yv);
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) r.v[k] = f(xv.v[k], yv.v[k]);
        }
        out[i] = r;
      }
    }
  }
}

template <int V, int U, class T>
__global__ void __launch_bounds__(block_threads) generate_kernel(T* dst, split s, T value) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t tail = s.head + s.vectors * V;
  for (std::uint64_t i = tid; i < s.head; i += stride) dst[i] = value;
  for (std::uint64_t i = tail + tid; i < s.count; i += stride) dst[i] = value;
  pack<T, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) y.v[k] = value;
  auto* out = reinterpret_cast<pack<T, V>*>(dst + s.head);
  for (std::uint64_t i = tid; i < s.vectors; i += stride) out[i] = y;
}

/// Blocks of `kernel` that one device keeps resident at once (SMs x blocks per SM), queried
/// once per kernel and device and cached; 1024 when the query fails.
template <class Kernel>
inline std::uint64_t resident_blocks(Kernel kernel) noexcept {
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
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads, 0) != cudaSuccess || sms <= 0 ||
        per_sm <= 0) {
      (void)cudaGetLastError();
      return 1024;
    }
    blocks = sms * per_sm;
    cache[device].store(blocks, std::memory_order_relaxed);
  }
  return static_cast<std::uint64_t>(blocks);
}

/// Grid size for `s` (V elements per vector, U vectors per thread): enough blocks for the
/// vectors and for the scalar head and tail, capped at the resident blocks of `kernel`.
template <class Kernel>
inline unsigned grid_for(Kernel kernel, const split& s, int v, int u) noexcept {
  const std::uint64_t per_block = static_cast<std::uint64_t>(block_threads) * static_cast<std::uint64_t>(u);
  const std::uint64_t tail = s.count - s.head - s.vectors * static_cast<std::uint64_t>(v);
  const std::uint64_t scalar = std::max(s.head, tail);
  const std::uint64_t wanted = std::max<std::uint64_t>(
      {1, (s.vectors + per_block - 1) / per_block, (scalar + block_threads - 1) / block_threads});
  return static_cast<unsigned>(std::min<std::uint64_t>(wanted, resident_blocks(kernel)));
}

/// `dst[i] = f(src[i])` for i < count on `stream`.
template <class Out, class In, class F>
cudaError_t launch_unary(Out* dst, const In* src, std::uint64_t count, F f, cudaStream_t stream) noexcept {
  if (count == 0) return cudaSuccess;
  constexpr int V = vector_elements<In, Out>;
  constexpr int U = vector_unroll<V, In, Out>;
  const void* p[2] = {dst, src};
  const std::size_t size[2] = {sizeof(Out), sizeof(In)};
  const split s = split_for(count, V, p, size, 2);
  auto* kernel = &unary_kernel<V, U, F, Out, In>;
  kernel<<<grid_for(kernel, s, V, U), block_threads, 0, stream>>>(dst, src, s, f);
  return cudaGetLastError();
}

/// `dst[i] = f(a[i], b[i])` for i < count on `stream`.
template <class T, class F>
cudaError_t launch_binary(T* dst, const T* a, const T* b, std::uint64_t count, F f, cudaStream_t stream) noexcept {
  if (count == 0) return cudaSuccess;
  constexpr int V = vector_elements<T, T>;
  constexpr int U = vector_unroll<V, T, T>;
  const void* p[3] = {dst, a, b};
  const std::size_t size[3] = {sizeof(T), sizeof(T), sizeof(T)};
  const split s = split_for(count, V, p, size, 3);
  auto* kernel = &binary_kernel<V, U, F, T>;
  kernel<<<grid_for(kernel, s, V, U), block_threads, 0, stream>>>(dst, a, b, s, f);
  return cudaGetLastError();
}

/// `dst[i] = value` for i < count on `stream`.
template <class T>
cudaError_t launch_generate(T* dst, std::uint64_t count, T value, cudaStream_t stream) noexcept {
  if (count == 0) return cudaSuccess;
  constexpr int V = vector_elements<T, T>;
  const void* p[1] = {dst};
  const std::size_t size[1] = {sizeof(T)};
  const split s = split_for(count, V, p, size, 1);
  auto* kernel = &generate_kernel<V, 1, T>;
  kernel<<<grid_for(kernel, s, V, 1), block_threads, 0, stream>>>(dst, s, value);
  return cudaGetLastError();
}

}  // namespace detail

}  // namespace ringzero::primitive::device
