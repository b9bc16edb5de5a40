#pragma once
/// @file
/// The CUDA `reduce_into` kernels: `dst[i] = post(pre_a(a[i]) (op) pre_b(b[i]))` by a launcher
/// (primitive/kernels/grid.hpp: a CUDA stream, or the host in CI), for every
/// dtype and reduce kind, with exactly the semantics of the host primitive (primitive/reduce.hpp),
/// whose element functions it calls: integer sums and products wrap, avg divides once (`post`),
/// premul_sum scales each raw input once (`pre`), min/max propagate NaN and compare unsigned
/// types as unsigned, float16/bfloat16 combine in float32 and round once per combine. Some
/// kernels reach the same bits by other means (`lane_element`): a plain float16 sum or any
/// float16 product in binary16 arithmetic, float16 and bfloat16 min and max by 16-bit
/// comparisons and masks, int8 and uint8 min and max by SIMD intrinsics and a plain int8 or
/// uint8 sum by wrapping byte additions, each on whole 32-bit words. Floating arithmetic is
/// explicitly rounded (no contraction into FMA), so results are bit-identical to the host's,
/// with one exception: the payload of a NaN that arithmetic produces (sum, avg, premul_sum and
/// prod with a NaN operand) is the hardware's, so both sides give a NaN but x86 keeps an
/// operand's payload where NVIDIA GPUs return the canonical NaN. min and max pass a NaN
/// operand through with the host's bits (quieted, payload kept).
///
/// Run on the host, the binary16 instructions and SIMD intrinsics are the host's versions of
/// the same lane functions (float32 arithmetic rounded once, primitive/lanes.hpp).
///
/// Memory access: 16-byte vectors with a scalar head and tail (primitive/kernels/elementwise.hpp).
/// `dst` may equal `a` or `b`; otherwise no overlap. Returns the launcher's result
/// (`launch_invalid_value` for an invalid dtype or kind, or a negative divisor).

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/primitive/kernels/arithmetic.hpp"
#include "ringzero/primitive/kernels/elementwise.hpp"
#include "ringzero/primitive/lanes.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive::kernels {

/// One combine of the host's `reduce_typed` for kind B: the sum family (sum, avg, premul_sum)
/// applies, when `Pre`, the optional pre-scaling `pre_a` / `pre_b` says, and, when `Post`, the
/// final division; prod, min and max apply neither. A plain sum (neither) is a kernel of its
/// own, so that the scaling's and the division's code never weigh on it (on sm_90 the bfloat16
/// sum kernel with both kept 1688 instructions, without them 584, and 352 once it converted
/// with the hardware alone: primitive/arithmetic.cuh).
template <class T, primitive::detail::binary B, bool Post = false, bool Pre = true>
struct reduce_element {
  using compute = primitive::detail::compute_t<T>;
  compute scalar_a;
  compute scalar_b;
  primitive::detail::prepared_divisor<compute> divisor;
  bool pre_a;
  bool pre_b;

  RINGZERO_HOST_DEVICE T operator()(T a, T b) const {
    namespace h = primitive::detail;
    if constexpr (B == h::binary::sum) {
      compute x = arithmetic_value(a);
      compute y = arithmetic_value(b);
      if constexpr (Pre) {
        if (pre_a) x = h::mul(x, scalar_a);
        if (pre_b) y = h::mul(y, scalar_b);
      }
      compute r = h::add(x, y);
      if constexpr (Post) r = h::divide(r, divisor);
      return arithmetic_result<T>(r);
    } else if constexpr (B == h::binary::prod) {
      return arithmetic_result<T>(h::mul(arithmetic_value(a), arithmetic_value(b)));
    } else {  // min and max pass a NaN through: the payload-keeping conversions
      return h::store<T>(h::apply<B>(h::load(a), h::load(b)));
    }
  }
};

/// An element function for 1- and 2-byte T that combines a 32-bit word of packed elements at a
/// time (primitive/lanes.hpp): `Op{}(x, y)` combines each lane of `x` with the same lane of `y`.
/// Whole vectors go through it word by word (`has_vector_op`), single elements of the scalar
/// head and tail as the low lane of a word whose other lanes are zero. One instruction or a
/// few per word replace an unpacking of every element into a register of its own: on sm_90
/// the float16 sum kernel went from 3000 instructions and 77 registers per thread to 208 and
/// 56, the int8 sum from 88 registers to 64.
template <class T, class Op>
struct lane_element {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2, "lanes of 8 or 16 bits");

  RINGZERO_HOST_DEVICE T operator()(T a, T b) const {
    std::uint32_t x = 0, y = 0;
    std::memcpy(&x, &a, sizeof a);
    std::memcpy(&y, &b, sizeof b);
    const std::uint32_t r = Op{}(x, y);
    T out;
    std::memcpy(static_cast<void*>(&out), &r, sizeof out);
    return out;
  }

  template <int V>
  RINGZERO_HOST_DEVICE pack<T, V> vector(const pack<T, V>& x, const pack<T, V>& y) const {
    static_assert(sizeof(T) * V % 4 == 0, "whole words");
    constexpr int W = static_cast<int>(sizeof(T) * V / 4);
    std::uint32_t xw[W], yw[W], rw[W];
    std::memcpy(xw, x.v, sizeof xw);
    std::memcpy(yw, y.v, sizeof yw);
    RINGZERO_UNROLL
    for (int k = 0; k < W; ++k) rw[k] = Op{}(xw[k], yw[k]);
    pack<T, V> r;
    std::memcpy(static_cast<void*>(r.v), rw, sizeof rw);
    return r;
  }
};

/// float16 sum and product in binary16 arithmetic, two lanes per `add.rn.f16x2` /
/// `mul.rn.f16x2` (binary16 arithmetic exists from sm_53; CUDA 13 targets sm_75 and later).
/// The same bits as `reduce_element` (the host's float32 combine rounded once to binary16),
/// NaN payloads aside: the sum of two binary16 values rounded to float32 and then to binary16
/// equals their sum rounded once to binary16, because float32's 24-bit significand is at least
/// 2 x 11 + 2 bits wide (Figueroa, "When is double rounding innocuous?", SIGNUM Newsletter
/// 30(3), 1995), and their product is exact in float32 (22 significand bits, magnitudes 2^-48
/// to 2^32). PTX's f16 add and mul round to nearest even and keep subnormals (no `.ftz`), as
/// IEEE 754 binary16 arithmetic does. Checked on the host for every pair of binary16 values
/// (tests/primitive/test_half_arithmetic.cpp). One instruction per pair of elements replaces
/// 4 conversions in, 2 float32 operations and 2 conversions out, the work that held the float16
/// sum below the other dtypes on an H200 (84.7% of the copy bandwidth).
/// The host's version of the binary16 lane instructions: each lane combined in float32 and
/// rounded once to binary16 (what the instructions compute, as argued above).
template <primitive::detail::binary B>
inline std::uint32_t half_lanes(std::uint32_t x, std::uint32_t y) noexcept {
  namespace h = primitive::detail;
  std::uint32_t r = 0;
  for (int lane = 0; lane < 2; ++lane) {
    const float16 a = float16::from_bits(static_cast<std::uint16_t>(x >> (16 * lane)));
    const float16 b = float16::from_bits(static_cast<std::uint16_t>(y >> (16 * lane)));
    const float16 c = h::store<float16>(h::apply<B>(h::load(a), h::load(b)));
    r |= static_cast<std::uint32_t>(c.bits) << (16 * lane);
  }
  return r;
}

struct half_add_lanes {
  RINGZERO_HOST_DEVICE std::uint32_t operator()(std::uint32_t x, std::uint32_t y) const {
#if defined(__CUDA_ARCH__)
    std::uint32_t r;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(y));
    return r;
#else
    return half_lanes<primitive::detail::binary::sum>(x, y);
#endif
  }
};
struct half_mul_lanes {
  RINGZERO_HOST_DEVICE std::uint32_t operator()(std::uint32_t x, std::uint32_t y) const {
#if defined(__CUDA_ARCH__)
    std::uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(y));
    return r;
#else
    return half_lanes<primitive::detail::binary::prod>(x, y);
#endif
  }
};

/// float16 or bfloat16 min (`Max` false) or max with the host's rule, NaN bits included
/// (`lanes::min_max_lanes`: one `set.ltu.u32.f16x2` / `.bf16x2` and a few logic operations
/// per two elements, instead of four conversions in, two out and the NaN selects: on sm_90
/// float16 max took 1448 instructions and 79 registers per thread before, 488 and 57 after).
template <class T, bool Max>
struct min_max_lanes_op {
  RINGZERO_HOST_DEVICE std::uint32_t operator()(std::uint32_t x, std::uint32_t y) const {
    return lanes::min_max_lanes<T, Max>(x, y);
  }
};

/// int8 (`Signed`) or uint8 min (`Max` false) or max, four bytes per SIMD intrinsic
/// (`lanes::min_max_bytes`; on sm_90 448 instructions and 80 registers per thread before, 496
/// and 64 after).
template <bool Signed, bool Max>
struct min_max_bytes_op {
  RINGZERO_HOST_DEVICE std::uint32_t operator()(std::uint32_t x, std::uint32_t y) const {
    return lanes::min_max_bytes<Signed, Max>(x, y);
  }
};

/// int8 and uint8 sum: four wrapping byte additions per word (`lanes::add_bytes`).
struct byte_add_lanes {
  RINGZERO_HOST_DEVICE std::uint32_t operator()(std::uint32_t x, std::uint32_t y) const {
    return lanes::add_bytes(x, y);
  }
};

/// The kernel for dtype T and combine B (see the file comment for which), launched.
template <class T, primitive::detail::binary B, bool Post = false, class Launcher>
int reduce_launch(const Launcher& launcher, void* dst, const void* a, const void* b, std::uint64_t count,
                  const reduce_spec& spec) noexcept {
  using compute = primitive::detail::compute_t<T>;
  auto launch = [&](auto f) {
    return launch_binary(launcher, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, f);
  };
  using primitive::detail::binary;
  constexpr bool half = std::is_same_v<T, float16>;
  if constexpr (B == binary::sum && !Post) {
    if (!spec.pre_a && !spec.pre_b) {  // a plain sum
      if constexpr (half)
        return launch(lane_element<T, half_add_lanes>{});
      else if constexpr (sizeof(T) == 1)
        return launch(lane_element<T, byte_add_lanes>{});
      else
        return launch(reduce_element<T, B, false, false>{});
    }
  }
  // prod, min and max ignore the pre-scaling
  if constexpr (half && B == binary::prod) {
    return launch(lane_element<T, half_mul_lanes>{});
  } else if constexpr (sizeof(T) == 2 && (B == binary::min || B == binary::max)) {  // float16, bfloat16
    return launch(lane_element<T, min_max_lanes_op<T, B == binary::max>>{});
  } else if constexpr (sizeof(T) == 1 && (B == binary::min || B == binary::max)) {  // int8, uint8
    return launch(lane_element<T, min_max_bytes_op<std::is_signed_v<T>, B == binary::max>>{});
  } else {
    reduce_element<T, B, Post> f{};
    if constexpr (B == binary::sum) {
      f.scalar_a = primitive::detail::scalar_as<compute>(spec.scalar_a);
      f.scalar_b = primitive::detail::scalar_as<compute>(spec.scalar_b);
      f.pre_a = spec.pre_a;  // honoured by every sum-like kind, as on the host
      f.pre_b = spec.pre_b;
      f.divisor = primitive::detail::prepare_divisor<compute>(spec.divisor);
    }
    return launch(f);
  }
}

/// `dst[i] = post(pre_a(a[i]) op pre_b(b[i]))` for `i < count` elements of `spec.type`, by
/// `launcher` (see the file comment). Preconditions: pointers to memory the launcher's side can
/// access (non-null when count > 0); `dst` equal to or disjoint from each input.
template <class Launcher>
int reduce_into(const Launcher& launcher, void* dst, const void* a, const void* b, std::uint64_t count,
                const reduce_spec& spec) noexcept {
  if (!is_valid(spec.type) || !is_valid(spec.kind) || spec.divisor < 0) return launch_invalid_value;
  if (count == 0) return launch_success;
  using primitive::detail::binary;
  return visit_dtype(spec.type, [&]<class T>() -> int {
    switch (spec.kind) {
      case reduce_kind::prod: return reduce_launch<T, binary::prod>(launcher, dst, a, b, count, spec);
      case reduce_kind::min: return reduce_launch<T, binary::min>(launcher, dst, a, b, count, spec);
      case reduce_kind::max: return reduce_launch<T, binary::max>(launcher, dst, a, b, count, spec);
      default:
        if (spec.divisor != 0) return reduce_launch<T, binary::sum, true>(launcher, dst, a, b, count, spec);
        return reduce_launch<T, binary::sum>(launcher, dst, a, b, count, spec);
    }
  });
}

}  // namespace ringzero::primitive::kernels
