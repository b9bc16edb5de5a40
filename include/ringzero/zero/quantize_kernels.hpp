#pragma once
/// @file
/// The CUDA kernels of quantized communication (zero/quantization.hpp), as bodies for a launcher
/// (primitive/kernels/grid.hpp: a CUDA stream through zero/optimizer_kernels.cuh's table, or the
/// host in CI): quantizing segments of float32, bfloat16 or float16 values into the wire layout
/// (`quantized_layout`), dequantizing them back, and dequantizing a reduce_scatter's segments
/// into their float32 average. One block of `quantize_threads` threads per quantization block;
/// the largest magnitude by a fixed tree (max is exact in any order), every value by the same
/// float32 operations on both launchers (division, round to nearest even, multiplication, sums in
/// rank order, never fused), so the host's bits are the GPU's. Each function returns the
/// launcher's result (0, or a cudaError_t value; `launch_invalid_value` for another dtype).
/// The host stream runs `host_quantize_segments` / `host_dequantize_segments` instead: plain
/// loops, the same bytes for every finite result (tests/zero/test_quantization.cpp compares
/// them with the kernels run by the host launcher), without walking a block's threads one by one.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ringzero/core/config.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/kernels/arithmetic.hpp"
#include "ringzero/primitive/kernels/grid.hpp"
#include "ringzero/zero/quantization.hpp"
#include "ringzero/zero/shard_update.hpp"
#include "ringzero/zero/step_kernels.hpp"

namespace ringzero::zero::kernels {

/// Threads per block of the quantization kernels.
inline constexpr unsigned quantize_threads = 256;

/// `x` rounded to the nearest integer, ties to even (the host's default rounding mode).
RINGZERO_HOST_DEVICE inline float round_to_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

/// The larger magnitude of `a` and `|x|`, NaN when either is NaN.
RINGZERO_HOST_DEVICE inline float magnitude_max(float a, float x) {
  const float m = x < 0 ? -x : x;
  if (a != a || m != m) return a != a ? a : m;
  return m > a ? m : a;
}

/// A block's scale: its largest magnitude `amax` / `most`; one quiet NaN (0x7fc00000) for a block
/// holding a NaN, whichever NaN the block's reduction met first.
RINGZERO_HOST_DEVICE inline float block_scale(float amax, float most) {
  if (amax != amax) {
#if defined(__CUDA_ARCH__)
    return __int_as_float(0x7fc00000);
#else
    return std::bit_cast<float>(std::uint32_t{0x7fc00000});
#endif
  }
  return zero::detail::f_div(amax, most);
}

/// Largest integer of a width: 127 (int8) or 7 (int4).
RINGZERO_HOST_DEVICE inline float quantized_max(quantized_bits bits) {
  return bits == quantized_bits::int4 ? 7.0f : 127.0f;
}

/// Where segment `s`'s scales and integers start in `base`.
RINGZERO_HOST_DEVICE inline float* segment_scales(unsigned char* base, const quantized_layout& l, std::uint64_t s) {
  return reinterpret_cast<float*>(base + s * l.segment_bytes());
}
RINGZERO_HOST_DEVICE inline const float* segment_scales(const unsigned char* base, const quantized_layout& l,
                                                        std::uint64_t s) {
  return reinterpret_cast<const float*>(base + s * l.segment_bytes());
}

/// Where segment `s`'s integers start in `base` (after its scales).
RINGZERO_HOST_DEVICE inline unsigned char* segment_values(unsigned char* base, const quantized_layout& l,
                                                          std::uint64_t s) {
  return base + s * l.segment_bytes() + l.blocks() * 4;
}
RINGZERO_HOST_DEVICE inline const unsigned char* segment_values(const unsigned char* base, const quantized_layout& l,
                                                                std::uint64_t s) {
  return base + s * l.segment_bytes() + l.blocks() * 4;
}

/// Integer `i` (element index in its segment) of a segment whose integers start at `v`.
RINGZERO_HOST_DEVICE inline int quantized_value(const unsigned char* v, quantized_bits bits, std::uint64_t i) {
  if (bits == quantized_bits::int8) return static_cast<signed char>(v[i]);
  const int nibble = (v[i / 2] >> ((i % 2) * 4)) & 0xF;
  return nibble >= 8 ? nibble - 16 : nibble;
}

/// Integer of `x` with `scale`: 0 when the scale is 0 or not finite.
RINGZERO_HOST_DEVICE inline int quantize_value(float x, float scale, float most) {
  if (!(scale > 0) || scale - scale != 0) return 0;
  float q = round_to_even(zero::detail::f_div(x, scale));
  q = q > most ? most : (q < -most ? -most : q);
  return static_cast<int>(q);
}

/// Block `j` of segment `s` of `x` (segments of `l.count` values of T) into `out`: one CUDA block
/// per (segment, quantization block), `blocks()` blocks per segment.
template <class T>
struct quantize_kernel {
  static constexpr const char* kernel_name = "quantize_kernel";
  const T* x;
  quantized_layout l;
  unsigned char* out;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    float* part = b.template shared<float, quantize_threads>();
    const std::uint64_t s = b.block_index() / l.blocks(), j = b.block_index() % l.blocks();
    const std::uint64_t first = j * l.block_size;
    const std::uint64_t len = l.block_length(j);
    const T* in = x + s * l.count + first;
    b.for_each_thread([&](std::uint64_t t) {
      float m = 0;
      for (std::uint64_t i = t; i < len; i += quantize_threads) m = magnitude_max(m, as_float(in[i]));
      part[t] = m;
    });
    b.sync();
    for (unsigned w = quantize_threads / 2; w > 0; w >>= 1) {
      b.for_each_thread([&](std::uint64_t t) {
        if (t < w) part[t] = magnitude_max(part[t], part[t + w]);
      });
      b.sync();
    }
    const float most = quantized_max(l.bits);
    float* scales = segment_scales(out, l, s);
    unsigned char* values = segment_values(out, l, s);
    b.for_each_thread([&](std::uint64_t t) {
      const float scale = block_scale(part[0], most);
      if (t == 0) scales[j] = scale;
      if (l.bits == quantized_bits::int8) {
        for (std::uint64_t i = t; i < len; i += quantize_threads)
          values[first + i] =
              static_cast<unsigned char>(static_cast<signed char>(quantize_value(as_float(in[i]), scale, most)));
      } else {  // a thread per byte: elements 2p and 2p+1 (block sizes are even)
        for (std::uint64_t p = t; 2 * p < len; p += quantize_threads) {
          const int lo = quantize_value(as_float(in[2 * p]), scale, most);
          const int hi = 2 * p + 1 < len ? quantize_value(as_float(in[2 * p + 1]), scale, most) : 0;
          values[(first + 2 * p) / 2] = static_cast<unsigned char>((lo & 0xF) | ((hi & 0xF) << 4));
        }
      }
    });
    b.for_each_thread([&](std::uint64_t t) {  // the segment's padding: defined bytes on the wire
      if (t == 0 && j + 1 == l.blocks())
        for (std::uint64_t i = l.blocks() * 4 + l.value_bytes(); i < l.segment_bytes(); ++i)
          out[s * l.segment_bytes() + i] = 0;
    });
  }
};

/// Segments of `in` dequantized into `y` (segments of `l.count` values of T), or, when `average`,
/// into their average: `y[e]` = (sum over segments s in order of segment s's value e, with
/// `own_values[e]` in place of segment `own`'s) / segments, in float32. One CUDA block per
/// (segment, quantization block), or per quantization block when averaging. `own_values` may be `y`.
template <class T>
struct dequantize_kernel {
  static constexpr const char* kernel_name = "dequantize_kernel";
  const unsigned char* in;
  quantized_layout l;
  T* y;
  bool average;
  std::uint32_t own;
  const T* own_values;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    const std::uint64_t s = average ? 0 : b.block_index() / l.blocks();
    const std::uint64_t j = average ? b.block_index() : b.block_index() % l.blocks();
    const std::uint64_t first = j * l.block_size;
    const std::uint64_t len = l.block_length(j);
    b.for_each_thread([&](std::uint64_t t) {
      for (std::uint64_t i = t; i < len; i += quantize_threads) {
        const std::uint64_t e = first + i;
        if (!average) {
          const float scale = segment_scales(in, l, s)[j];
          const unsigned char* v = segment_values(in, l, s);
          y[s * l.count + e] =
              pk::arithmetic_result<T>(zero::detail::f_mul(static_cast<float>(quantized_value(v, l.bits, e)), scale));
          continue;
        }
        float acc = 0;
        for (std::uint32_t r = 0; r < l.segments; ++r) {
          if (r == own) {
            acc = zero::detail::f_add(acc, as_float(own_values[e]));
            continue;
          }
          const float scale = segment_scales(in, l, r)[j];
          const unsigned char* v = segment_values(in, l, r);
          acc = zero::detail::f_add(acc, zero::detail::f_mul(static_cast<float>(quantized_value(v, l.bits, e)), scale));
        }
        y[e] = pk::arithmetic_result<T>(zero::detail::f_div(acc, static_cast<float>(l.segments)));
      }
    });
  }
};

/// `quantize_kernel`'s result by plain loops on the host (what the host stream runs): the same
/// bytes, with the scale's checks hoisted out of the element loop and round-to-nearest-even by
/// adding and subtracting 1.5 * 2^23 (exact for |v| < 2^22 under the default rounding mode; the
/// value is clamped to 128 first).
template <class T>
void host_quantize(const T* x, const quantized_layout& l, unsigned char* out) {
  const float most = quantized_max(l.bits);
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23
  std::vector<signed char> q(l.block_size);
  for (std::uint64_t s = 0; s < l.segments; ++s) {
    float* scales = segment_scales(out, l, s);
    unsigned char* values = segment_values(out, l, s);
    const T* in = x + s * l.count;
    for (std::uint64_t j = 0; j < l.blocks(); ++j) {
      const std::uint64_t first = j * l.block_size;
      const std::uint64_t len = l.block_length(j);
      float amax = 0;
      bool nan = false;
      for (std::uint64_t i = 0; i < len; ++i) {
        const float v = as_float(in[first + i]);
        const float m = v < 0 ? -v : v;
        nan |= v != v;
        amax = m > amax ? m : amax;
      }
      const float scale = block_scale(nan ? std::numeric_limits<float>::quiet_NaN() : amax, most);
      scales[j] = scale;
      if (!(scale > 0) || scale - scale != 0) {
        std::fill(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(len), static_cast<signed char>(0));
      } else {
        for (std::uint64_t i = 0; i < len; ++i) {
          float v = as_float(in[first + i]) / scale;
          v = v > 128.0f ? 128.0f : (v < -128.0f ? -128.0f : v);
          v = (v + magic) - magic;
          q[i] = static_cast<signed char>(v > most ? most : (v < -most ? -most : v));
        }
      }
      if (l.bits == quantized_bits::int8) {
        std::memcpy(values + first, q.data(), static_cast<std::size_t>(len));
      } else {
        for (std::uint64_t i = 0; i < len; i += 2) {
          const int hi = i + 1 < len ? q[i + 1] : 0;
          values[(first + i) / 2] = static_cast<unsigned char>((q[i] & 0xF) | ((hi & 0xF) << 4));
        }
      }
    }
    for (std::uint64_t i = l.blocks() * 4 + l.value_bytes(); i < l.segment_bytes(); ++i)
      out[s * l.segment_bytes() + i] = 0;
  }
}

/// Adds (`add`) or stores block `j` of a segment dequantized, `len` values from `first`, into `acc`.
inline void host_dequantize_block(const unsigned char* segment, const quantized_layout& l, std::uint64_t j,
                                  std::uint64_t first, std::uint64_t len, float* acc, bool add) {
  const float scale = reinterpret_cast<const float*>(segment)[j];
  const unsigned char* v = segment_values(segment, l, 0);
  if (l.bits == quantized_bits::int8) {
    const auto* q = reinterpret_cast<const signed char*>(v + first);
    for (std::uint64_t i = 0; i < len; ++i) {
      const float d = static_cast<float>(q[i]) * scale;
      acc[i] = add ? acc[i] + d : d;
    }
  } else {
    for (std::uint64_t i = 0; i < len; ++i) {
      const float d = static_cast<float>(quantized_value(v, l.bits, first + i)) * scale;
      acc[i] = add ? acc[i] + d : d;
    }
  }
}

/// `dequantize_kernel`'s result by plain loops on the host (as `host_quantize`: the same bytes).
template <class T>
void host_dequantize(const unsigned char* in, const quantized_layout& l, T* y, bool average, std::uint32_t own,
                     const T* own_values) {
  std::vector<float> acc(l.block_size);
  for (std::uint64_t s = 0; s < (average ? 1 : l.segments); ++s)
    for (std::uint64_t j = 0; j < l.blocks(); ++j) {
      const std::uint64_t first = j * l.block_size;
      const std::uint64_t len = l.block_length(j);
      if (!average) {
        host_dequantize_block(in + s * l.segment_bytes(), l, j, first, len, acc.data(), false);
        for (std::uint64_t i = 0; i < len; ++i) y[s * l.count + first + i] = pk::arithmetic_result<T>(acc[i]);
        continue;
      }
      std::fill(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(len), 0.0f);
      for (std::uint32_t r = 0; r < l.segments; ++r) {
        if (r != own) {
          host_dequantize_block(in + r * l.segment_bytes(), l, j, first, len, acc.data(), true);
          continue;
        }
        for (std::uint64_t i = 0; i < len; ++i) acc[i] += as_float(own_values[first + i]);
      }
      const float n = static_cast<float>(l.segments);
      for (std::uint64_t i = 0; i < len; ++i) y[first + i] = pk::arithmetic_result<T>(acc[i] / n);
    }
}

/// Quantizes `l.segments` segments of `l.count` values of `type` (float32, bfloat16, float16) from
/// `values` into `out` (`l.bytes()` bytes), by `launcher`.
template <class Launcher>
int quantize_segments(const Launcher& launcher, const quantized_layout& l, const void* values, dtype type,
                      void* out) noexcept {
  if (l.count == 0 || l.segments == 0) return pk::launch_success;
  if (l.bits == quantized_bits::none) return pk::launch_invalid_value;
  int rc = pk::launch_invalid_value;
  visit_float_type(type, [&]<class T>() {
    rc = launcher.launch(quantize_kernel<T>{static_cast<const T*>(values), l, static_cast<unsigned char*>(out)},
                         l.blocks() * l.segments, quantize_threads);
  });
  return rc;
}

/// `quantize_segments` and `dequantize_segments` by `host_quantize` and `host_dequantize`: the
/// host stream's way (the kernels' bytes, at a plain loop's speed); `launch_invalid_value` as they.
inline int host_quantize_segments(const quantized_layout& l, const void* values, dtype type, void* out) noexcept {
  if (l.count == 0 || l.segments == 0) return pk::launch_success;
  if (l.bits == quantized_bits::none) return pk::launch_invalid_value;
  const bool known = visit_float_type(
      type, [&]<class T>() { host_quantize(static_cast<const T*>(values), l, static_cast<unsigned char*>(out)); });
  return known ? pk::launch_success : pk::launch_invalid_value;
}
inline int host_dequantize_segments(const quantized_layout& l, const void* in, void* values, dtype type, bool average,
                                    std::uint32_t own, const void* own_values) noexcept {
  if (l.count == 0 || l.segments == 0) return pk::launch_success;
  if (l.bits == quantized_bits::none || (average && (own >= l.segments || own_values == nullptr)))
    return pk::launch_invalid_value;
  const bool known = visit_float_type(type, [&]<class T>() {
    host_dequantize(static_cast<const unsigned char*>(in), l, static_cast<T*>(values), average, own,
                    static_cast<const T*>(own_values));
  });
  return known ? pk::launch_success : pk::launch_invalid_value;
}

/// Dequantizes `in` (`l.bytes()` bytes) into `values` (`l.segments * l.count` values of `type`),
/// or, when `average`, into the float32 average of the segments (`l.count` values), `own_values`
/// (`l.count` values of `type`, may be `values`) standing for segment `own`; by `launcher`.
template <class Launcher>
int dequantize_segments(const Launcher& launcher, const quantized_layout& l, const void* in, void* values, dtype type,
                        bool average = false, std::uint32_t own = 0, const void* own_values = nullptr) noexcept {
  if (l.count == 0 || l.segments == 0) return pk::launch_success;
  if (l.bits == quantized_bits::none || (average && (own >= l.segments || own_values == nullptr)))
    return pk::launch_invalid_value;
  int rc = pk::launch_invalid_value;
  visit_float_type(type, [&]<class T>() {
    rc = launcher.launch(dequantize_kernel<T>{static_cast<const unsigned char*>(in), l, static_cast<T*>(values),
                                              average, own, static_cast<const T*>(own_values)},
                         average ? l.blocks() : l.blocks() * l.segments, quantize_threads);
  });
  return rc;
}

}  // namespace ringzero::zero::kernels
