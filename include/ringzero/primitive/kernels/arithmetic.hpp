#pragma once
/// @file
/// The device side of the host primitives' `load` and `store` (primitive/reduce.hpp) for values
/// that go into floating arithmetic: float16 and bfloat16 into float32 and back with the
/// hardware conversions alone. For every value but a NaN they give the host's bits (a 16-bit
/// float converts exactly to float32; `cvt.rn.f16.f32` and `cvt.rn.bf16.f32` round to nearest
/// even and keep subnormals, as the host's software rounding does: CUDA's own
/// `__float2bfloat16_rn` uses the instruction on sm_80 and later and the same software rounding
/// before). A NaN may lose its payload, which is harmless exactly where these are used: the
/// sum family, prod, scale and divide, whose NaN results carry the hardware's payload anyway
/// (an NVIDIA GPU's float32 arithmetic returns the canonical NaN). min, max and cast, which
/// pass a NaN through unchanged, keep the payload-preserving conversions of core/half.hpp.
/// Before sm_80 (no bfloat16 conversion instruction) bfloat16 is stored by the host's software
/// rounding. Compiled for the host (primitive/kernels/grid.hpp), they are the host's `load`
/// and `store`: the instructions are device-only lines (docs/gpu.md).
///
/// What the select that keeps a NaN's payload had cost on sm_90 (nvcc 13.0, instructions and
/// registers per thread): float16 premul_sum 2200 and 80 with it, 928 and 59 without; bfloat16
/// scale 496 and 38, 256 and 39.

#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive::kernels {

/// `x` in its compute type (primitive::detail::compute_t) for arithmetic: exact, except that a
/// float16 NaN's payload may change (`cvt.f32.f16`).
template <class T>
RINGZERO_HOST_DEVICE inline primitive::detail::compute_t<T> arithmetic_value(T x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float16>) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
  } else {
    return primitive::detail::load(x);  // bfloat16: a shift; other types: themselves
  }
#else
  return primitive::detail::load(x);
#endif
}

/// An arithmetic result `r` stored as T: float16 by `cvt.rn.f16.f32`, bfloat16 by
/// `cvt.rn.bf16.f32` from sm_80 (round to nearest even; the host's bits for every value but a
/// NaN, which is the hardware's); other types as the host stores them.
template <class T>
RINGZERO_HOST_DEVICE inline T arithmetic_result(primitive::detail::compute_t<T> r) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float16>) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(r));
    return float16::from_bits(h);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(r));
    return bfloat16::from_bits(h);
#else
    return primitive::detail::store<T>(r);  // no bfloat16 conversion instruction before sm_80
#endif
  } else {
    return primitive::detail::store<T>(r);
  }
#else
  return primitive::detail::store<T>(r);
#endif
}

}  // namespace ringzero::primitive::kernels
