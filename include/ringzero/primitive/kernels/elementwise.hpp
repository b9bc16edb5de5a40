#pragma once
/// @file
/// The element-wise kernels every CUDA primitive is built on, as bodies for a launcher
/// (primitive/kernels/grid.hpp: a CUDA stream, or the host in CI): `launch_unary`
/// (`dst[i] = f(src[i])`), `launch_binary` (`dst[i] = f(a[i], b[i])`, or `f.vector` on whole
/// vectors where `f` has one: `has_vector_op`) and `launch_generate` (`dst[i] = value`).
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
/// The grid is capped at the number of blocks the device keeps resident (the launcher's
/// `resident_blocks`: on CUDA queried once per kernel and device) and strides over the vectors,
/// so one launch serves any 64-bit count.
///
/// `dst` may equal an input (in place: each element is read before it is written, by the same
/// thread) but must not otherwise overlap one. The result is the launcher's (0, or a
/// cudaError_t value); a CUDA launch is asynchronous on the launcher's stream.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/primitive/kernels/grid.hpp"

namespace ringzero::primitive::kernels {

/// Threads per block of every element-wise kernel.
inline constexpr unsigned block_threads = 256;

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

#if defined(__GNUC__) && !defined(__CUDA_ARCH__)
// Compiled for the host (by g++, or by nvcc's host pass), a vector reads memory written as
// elements of another type: the compiler is told that a pack may alias anything.
#define RINGZERO_PACK_MAY_ALIAS [[gnu::may_alias]]
#else
#define RINGZERO_PACK_MAY_ALIAS
#endif

/// V elements of T, aligned to their size (at most 16 bytes), so that a copy is one access of
/// 4, 8 or 16 bytes (or several of 16).
template <class T, int V>
struct RINGZERO_PACK_MAY_ALIAS alignas(sizeof(T) * V >= 16 ? 16 : sizeof(T) * V) pack {
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
RINGZERO_HOST_DEVICE inline pack<T, V> values_of(const pack<L, V>& raw) {
  static_assert(sizeof(pack<T, V>) == sizeof(pack<L, V>));
  pack<T, V> r;
  std::memcpy(static_cast<void*>(&r), &raw, sizeof r);
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

// A vector is loaded and used under the same bounds check, which g++ cannot always see.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// `dst[i] = f(src[i])` for the split `s`: each thread takes the scalar head and tail elements
/// at its grid-wide index and every grid-wide stride after it, and U vectors per round (the
/// block's threads side by side, U rows of them per block and round).
template <int V, int U, class F, class Out, class In>
struct unary_kernel {
  static constexpr const char* kernel_name = "unary_kernel";
  Out* dst;
  const In* src;
  split s;
  F f;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    const std::uint64_t threads = b.block_threads();
    const std::uint64_t stride = b.grid_blocks() * threads;
    const std::uint64_t per_block = threads * U;
    const std::uint64_t tail = s.head + s.vectors * V;
    b.for_each_thread([&](std::uint64_t t) {
      const std::uint64_t tid = b.block_index() * threads + t;
      for (std::uint64_t i = tid; i < s.head; i += stride) dst[i] = f(src[i]);
      for (std::uint64_t i = tail + tid; i < s.count; i += stride) dst[i] = f(src[i]);
      using L = load_t<In>;
      const auto* in = reinterpret_cast<const pack<L, V>*>(src + s.head);
      auto* out = reinterpret_cast<pack<Out, V>*>(dst + s.head);
      for (std::uint64_t base = b.block_index() * per_block + t; base < s.vectors;
           base += b.grid_blocks() * per_block) {
        pack<L, V> x[U];
        RINGZERO_UNROLL
        for (int u = 0; u < U; ++u) {
          const std::uint64_t i = base + static_cast<std::uint64_t>(u) * threads;
          if (i < s.vectors) x[u] = in[i];
        }
        RINGZERO_UNROLL
        for (int u = 0; u < U; ++u) {
          const std::uint64_t i = base + static_cast<std::uint64_t>(u) * threads;
          if (i < s.vectors) {
            const pack<In, V> xv = values_of<In, V>(x[u]);
            pack<Out, V> y;
            RINGZERO_UNROLL
            for (int k = 0; k < V; ++k) y.v[k] = f(xv.v[k]);
            out[i] = y;
          }
        }
      }
    });
  }
};

/// `dst[i] = f(a[i], b[i])` for the split `s` (whole vectors through `f.vector` where
/// `has_vector_op`), with `unary_kernel`'s division of the work.
template <int V, int U, class F, class T>
struct binary_kernel {
  static constexpr const char* kernel_name = "binary_kernel";
  T* dst;
  const T* a;
  const T* b;
  split s;
  F f;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& blk) const {
    const std::uint64_t threads = blk.block_threads();
    const std::uint64_t stride = blk.grid_blocks() * threads;
    const std::uint64_t per_block = threads * U;
    const std::uint64_t tail = s.head + s.vectors * V;
    blk.for_each_thread([&](std::uint64_t t) {
      const std::uint64_t tid = blk.block_index() * threads + t;
      for (std::uint64_t i = tid; i < s.head; i += stride) dst[i] = f(a[i], b[i]);
      for (std::uint64_t i = tail + tid; i < s.count; i += stride) dst[i] = f(a[i], b[i]);
      using L = load_t<T, has_vector_op<F, T, V>>;
      const auto* va = reinterpret_cast<const pack<L, V>*>(a + s.head);
      const auto* vb = reinterpret_cast<const pack<L, V>*>(b + s.head);
      auto* out = reinterpret_cast<pack<T, V>*>(dst + s.head);
      for (std::uint64_t base = blk.block_index() * per_block + t; base < s.vectors;
           base += blk.grid_blocks() * per_block) {
        pack<L, V> x[U], y[U];
        RINGZERO_UNROLL
        for (int u = 0; u < U; ++u) {
          const std::uint64_t i = base + static_cast<std::uint64_t>(u) * threads;
          if (i < s.vectors) {
            x[u] = va[i];
            y[u] = vb[i];
          }
        }
        RINGZERO_UNROLL
        for (int u = 0; u < U; ++u) {
          const std::uint64_t i = base + static_cast<std::uint64_t>(u) * threads;
          if (i < s.vectors) {
            const pack<T, V> xv = values_of<T, V>(x[u]);
            const pack<T, V> yv = values_of<T, V>(y[u]);
            pack<T, V> r;
            if constexpr (has_vector_op<F, T, V>) {
              r = f.vector(xv, yv);
            } else {
              RINGZERO_UNROLL
              for (int k = 0; k < V; ++k) r.v[k] = f(xv.v[k], yv.v[k]);
            }
            out[i] = r;
          }
        }
      }
    });
  }
};

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__)
#pragma GCC diagnostic pop
#endif

/// `dst[i] = value` for the split `s`: whole vectors at each thread's grid-wide index and
/// stride, the scalar head and tail as in `unary_kernel`.
template <int V, class T>
struct generate_kernel {
  static constexpr const char* kernel_name = "generate_kernel";
  T* dst;
  split s;
  T value;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    const std::uint64_t threads = b.block_threads();
    const std::uint64_t stride = b.grid_blocks() * threads;
    const std::uint64_t tail = s.head + s.vectors * V;
    b.for_each_thread([&](std::uint64_t t) {
      const std::uint64_t tid = b.block_index() * threads + t;
      for (std::uint64_t i = tid; i < s.head; i += stride) dst[i] = value;
      for (std::uint64_t i = tail + tid; i < s.count; i += stride) dst[i] = value;
      pack<T, V> y;
      RINGZERO_UNROLL
      for (int k = 0; k < V; ++k) y.v[k] = value;
      auto* out = reinterpret_cast<pack<T, V>*>(dst + s.head);
      for (std::uint64_t i = tid; i < s.vectors; i += stride) out[i] = y;
    });
  }
};

/// Grid size for `s` (V elements per vector, U vectors per thread): enough blocks for the
/// vectors and for the scalar head and tail, capped at the blocks the launcher's device keeps
/// resident for `Body`.
template <class Body, class Launcher>
inline std::uint64_t grid_for(const Launcher& launcher, const split& s, int v, int u) noexcept {
  const std::uint64_t per_block = static_cast<std::uint64_t>(block_threads) * static_cast<std::uint64_t>(u);
  const std::uint64_t tail = s.count - s.head - s.vectors * static_cast<std::uint64_t>(v);
  const std::uint64_t scalar = std::max(s.head, tail);
  const std::uint64_t wanted = std::max<std::uint64_t>(
      {1, (s.vectors + per_block - 1) / per_block, (scalar + block_threads - 1) / block_threads});
  return std::min<std::uint64_t>(wanted, launcher.template resident_blocks<Body>());
}

/// Whether each pointer `p[k]` is aligned to its element size `size[k]` (what a scalar access
/// needs: a misaligned one stops a CUDA context with cudaErrorMisalignedAddress).
inline bool elements_aligned(const void* const* p, const std::size_t* size, int n) noexcept {
  for (int k = 0; k < n; ++k)
    if (reinterpret_cast<std::uintptr_t>(p[k]) % size[k] != 0) return false;
  return true;
}

/// `dst[i] = f(src[i])` for i < count, by `launcher`; `launch_misaligned_address` (nothing
/// launched) when a pointer is not aligned to its element type.
template <class Launcher, class Out, class In, class F>
int launch_unary(const Launcher& launcher, Out* dst, const In* src, std::uint64_t count, F f) noexcept {
  if (count == 0) return launch_success;
  constexpr int V = vector_elements<In, Out>;
  constexpr int U = vector_unroll<V, In, Out>;
  const void* p[2] = {dst, src};
  const std::size_t size[2] = {sizeof(Out), sizeof(In)};
  if (!elements_aligned(p, size, 2)) return launch_misaligned_address;
  const split s = split_for(count, V, p, size, 2);
  using body = unary_kernel<V, U, F, Out, In>;
  return launcher.launch(body{dst, src, s, f}, grid_for<body>(launcher, s, V, U), block_threads);
}

/// `dst[i] = f(a[i], b[i])` for i < count, by `launcher` (`launch_misaligned_address` as
/// `launch_unary`).
template <class Launcher, class T, class F>
int launch_binary(const Launcher& launcher, T* dst, const T* a, const T* b, std::uint64_t count, F f) noexcept {
  if (count == 0) return launch_success;
  constexpr int V = vector_elements<T, T>;
  constexpr int U = vector_unroll<V, T, T>;
  const void* p[3] = {dst, a, b};
  const std::size_t size[3] = {sizeof(T), sizeof(T), sizeof(T)};
  if (!elements_aligned(p, size, 3)) return launch_misaligned_address;
  const split s = split_for(count, V, p, size, 3);
  using body = binary_kernel<V, U, F, T>;
  return launcher.launch(body{dst, a, b, s, f}, grid_for<body>(launcher, s, V, U), block_threads);
}

/// `dst[i] = value` for i < count, by `launcher` (`launch_misaligned_address` as
/// `launch_unary`).
template <class Launcher, class T>
int launch_generate(const Launcher& launcher, T* dst, std::uint64_t count, T value) noexcept {
  if (count == 0) return launch_success;
  constexpr int V = vector_elements<T, T>;
  const void* p[1] = {dst};
  const std::size_t size[1] = {sizeof(T)};
  if (!elements_aligned(p, size, 1)) return launch_misaligned_address;
  const split s = split_for(count, V, p, size, 1);
  using body = generate_kernel<V, T>;
  return launcher.launch(body{dst, s, value}, grid_for<body>(launcher, s, V, 1), block_threads);
}

}  // namespace ringzero::primitive::kernels
