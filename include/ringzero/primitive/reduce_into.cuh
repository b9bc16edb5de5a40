#pragma once
/// @file
/// CUDA `reduce_into`: `dst[i] = post(pre_a(a[i]) (op) pre_b(b[i]))` on a stream, for every
/// dtype and reduce kind, with exactly the semantics of the host primitive (primitive/reduce.hpp),
/// whose element functions it calls: integer sums and products wrap, avg divides once (`post`),
/// premul_sum scales each raw input once (`pre`), min/max propagate NaN and compare unsigned
/// types as unsigned, float16/bfloat16 combine in float32 and round once per combine. Floating
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

#include "ringzero/primitive/elementwise.cuh"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive::device {

namespace detail {

/// One combine of the host's `reduce_typed` for kind B: the sum family (sum, avg, premul_sum)
/// applies the optional pre-scaling and, when `Post` (a kernel of its own, so that the
/// division's code never weighs on the plain sums), the final division; prod, min and max
/// apply neither.
template <class T, primitive::detail::binary B, bool Post = false>
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
      if (pre_a) x = h::mul(x, scalar_a);
      if (pre_b) y = h::mul(y, scalar_b);
      compute r = h::add(x, y);
      if constexpr (Post) r = h::divide(r, divisor);
      return h::store<T>(r);
    } else {
      return h::store<T>(h::apply<B>(x, y));
    }
  }
};

template <class T, primitive::detail::binary B, bool Post = false>
cudaError_t reduce_launch(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec,
                          cudaStream_t stream) noexcept {
  using compute = primitive::detail::compute_t<T>;
  reduce_element<T, B, Post> f{};
  if constexpr (B == primitive::detail::binary::sum) {
    f.scalar_a = primitive::detail::scalar_as<compute>(spec.scalar_a);
    f.scalar_b = primitive::detail::scalar_as<compute>(spec.scalar_b);
    f.pre_a = spec.pre_a;  // honoured by every sum-like kind, as on the host
    f.pre_b = spec.pre_b;
    f.divisor = primitive::detail::prepare_divisor<compute>(spec.divisor);
  }
  return launch_binary(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, f, stream);
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
