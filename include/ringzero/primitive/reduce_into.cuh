#pragma once
/// @file
/// CUDA `reduce_into`: `dst[i] = post(pre_a(a[i]) (op) pre_b(b[i]))` on a stream, for every
/// dtype and reduce kind, with exactly the semantics of the host primitive (primitive/reduce.hpp),
/// whose element functions it calls: integer sums and products wrap, avg divides once (`post`),
/// premul_sum scales each raw input once (`pre`), min/max propagate NaN and compare unsigned
/// types as unsigned, float16/bfloat16 combine in float32 and round once per combine (a plain
/// float16 sum or product runs in binary16 arithmetic, which gives the same bits:
/// `half_pair_element`). Floating
/// arithmetic is explicitly rounded (no contraction into FMA), so results are bit-identical to
/// the host's, with one exception: the payload of a NaN that arithmetic produces (a sum or
/// product with a NaN operand) is the hardware's, so both sides give a NaN but x86 keeps an
/// operand's payload where NVIDIA GPUs return the canonical NaN. min and max pass a NaN
/// operand through unchanged on both.
///
/// Memory access: 16-byte vectors with a scalar head and tail (primitive/elementwise.cuh).
/// `dst` may equal `a` or `b`; otherwise no overlap. Asynchronous on `stream`; returns the
/// launch's cudaError_t (cudaErrorInvalidValue for an invalid dtype or kind). Requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/primitive/reduce_into.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/primitive/elementwise.cuh"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive::device {

namespace detail {

/// One combine of the host's `reduce_typed` for kind B: the sum family (sum, avg, premul_sum)
/// applies, when `Pre`, the optional pre-scaling `pre_a` / `pre_b` says, and, when `Post`, the
/// final division; prod, min and max apply neither. A plain sum (neither) is a kernel of its
/// own, so that the scaling's and the division's code never weigh on it (on sm_90 the bfloat16
/// sum kernel with both kept 1688 instructions, without them 584).
template <class T, primitive::detail::binary B, bool Post = false, bool Pre = true>
struct reduce_element {
  using compute = primitive::detail::compute_t<T>;
  compute scalar_a;
  compute scalar_b;
  primitive::detail::prepared_divisor<compute> divisor;
  bool pre_a;
  bool pre_b;

  __device__ T operator()(T a, T b) const {
    namespace h = primitive::detail;
    compute x = h::load(a);
    compute y = h::load(b);
    if constexpr (B == h::binary::sum) {
      if constexpr (Pre) {
        if (pre_a) x = h::mul(x, scalar_a);
        if (pre_b) y = h::mul(y, scalar_b);
      }
      compute r = h::add(x, y);
      if constexpr (Post) r = h::divide(r, divisor);
      return h::store<T>(r);
    } else {
      return h::store<T>(h::apply<B>(x, y));
    }
  }
};

/// float16 sum or prod (`B`) without pre-scaling or division, in binary16 arithmetic: two
/// elements per `add.rn.f16x2` / `mul.rn.f16x2` on whole vectors and `add.rn.f16` /
/// `mul.rn.f16` on the scalar head and tail (binary16 arithmetic exists from sm_53; CUDA 13
/// targets sm_75 and later). The same bits as `reduce_element` (the host's float32 combine
/// rounded once to binary16), NaN payloads aside: the sum of two binary16 values rounded to
/// float32 and then to binary16 equals their sum rounded once to binary16, because float32's
/// 24-bit significand is at least 2 x 11 + 2 bits wide (Figueroa, "When is double rounding
/// innocuous?", SIGNUM Newsletter 30(3), 1995), and their product is exact in float32 (22
/// significand bits, magnitudes 2^-48 to 2^32). PTX's f16 add and mul round to nearest even
/// and keep subnormals (no `.ftz`), as IEEE 754 binary16 arithmetic does. Checked on the host
/// for every pair of binary16 values (tests/primitive/test_half_arithmetic.cpp). One
/// instruction per pair of elements replaces 4 conversions in, 2 float32 operations and 2
/// conversions out, the work that held the float16 sum below the other dtypes on an H200
/// (84.7% of the copy bandwidth).
template <primitive::detail::binary B>
struct half_pair_element {
  static_assert(B == primitive::detail::binary::sum || B == primitive::detail::binary::prod);

  __device__ float16 operator()(float16 a, float16 b) const {
    unsigned short r;
    if constexpr (B == primitive::detail::binary::sum)
      asm("add.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a.bits), "h"(b.bits));
    else
      asm("mul.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a.bits), "h"(b.bits));
    return float16::from_bits(r);
  }

  template <int V>
  __device__ pack<float16, V> vector(const pack<float16, V>& x, const pack<float16, V>& y) const {
    static_assert(V % 2 == 0, "whole pairs of float16");
    unsigned xw[V / 2], yw[V / 2], rw[V / 2];
    std::memcpy(xw, x.v, sizeof xw);
    std::memcpy(yw, y.v, sizeof yw);
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      if constexpr (B == primitive::detail::binary::sum)
        asm("add.rn.f16x2 %0, %1, %2;" : "=r"(rw[k]) : "r"(xw[k]), "r"(yw[k]));
      else
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(rw[k]) : "r"(xw[k]), "r"(yw[k]));
    }
    pack<float16, V> r;
    std::memcpy(r.v, rw, sizeof rw);
    return r;
  }
};

template <class T, primitive::detail::binary B, bool Post = false>
cudaError_t reduce_launch(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec,
                          cudaStream_t stream) noexcept {
  using compute = primitive::detail::compute_t<T>;
  auto launch = [&](auto f) {
    return launch_binary(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, f, stream);
  };
  if constexpr (B == primitive::detail::binary::sum && !Post) {
    if (!spec.pre_a && !spec.pre_b) {  // a plain sum
      if constexpr (std::is_same_v<T, float16>) return launch(half_pair_element<B>{});
      else return launch(reduce_element<T, B, false, false>{});
    }
  }
  if constexpr (B == primitive::detail::binary::prod && std::is_same_v<T, float16>) {  // prod ignores pre-scaling
    return launch(half_pair_element<B>{});
  } else {
    reduce_element<T, B, Post> f{};
    if constexpr (B == primitive::detail::binary::sum) {
      f.scalar_a = primitive::detail::scalar_as<compute>(spec.scalar_a);
      f.scalar_b = primitive::detail::scalar_as<compute>(spec.scalar_b);
      f.pre_a = spec.pre_a;  // honoured by every sum-like kind, as on the host
      f.pre_b = spec.pre_b;
      f.divisor = primitive::detail::prepare_divisor<compute>(spec.divisor);
    }
    return launch(f);
  }
}

}  // namespace detail

/// `dst[i] = post(pre_a(a[i]) op pre_b(b[i]))` for `i < count` elements of `spec.type`, enqueued
/// on `stream` (see the file comment). Preconditions: pointers to device memory the current
/// device can access (non-null when count > 0); `dst` equal to or disjoint from each input.
inline cudaError_t reduce_into(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec,
                               cudaStream_t stream) noexcept {
  if (!is_valid(spec.type) || !is_valid(spec.kind)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  using primitive::detail::binary;
  return visit_dtype(spec.type, [&]<class T>() -> cudaError_t {
    switch (spec.kind) {
      case reduce_kind::prod: return detail::reduce_launch<T, binary::prod>(dst, a, b, count, spec, stream);
      case reduce_kind::min: return detail::reduce_launch<T, binary::min>(dst, a, b, count, spec, stream);
      case reduce_kind::max: return detail::reduce_launch<T, binary::max>(dst, a, b, count, spec, stream);
      default:
        if (spec.divisor != 0) return detail::reduce_launch<T, binary::sum, true>(dst, a, b, count, spec, stream);
        return detail::reduce_launch<T, binary::sum>(dst, a, b, count, spec, stream);
    }
  });
}

}  // namespace ringzero::primitive::device
