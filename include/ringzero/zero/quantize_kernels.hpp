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
#include <type_traits>
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

/// The int4 in the low (`high` false) or high half of `byte`: its 4 bits as two's complement.
RINGZERO_HOST_DEVICE inline int int4_value(unsigned char byte, bool high) {
  return (((high ? byte >> 4 : byte) & 0xF) ^ 8) - 8;
}

/// The byte holding int4 values `low` and `high` (each in [-8, 7]): `int4_value`'s inverse.
RINGZERO_HOST_DEVICE inline unsigned char int4_pair(int low, int high) {
  return static_cast<unsigned char>((low & 0xF) | ((high & 0xF) << 4));
}

/// Integer `i` (element index in its segment) of a segment whose integers start at `v`.
RINGZERO_HOST_DEVICE inline int quantized_value(const unsigned char* v, quantized_bits bits, std::uint64_t i) {
  if (bits == quantized_bits::int8) return static_cast<signed char>(v[i]);
  return int4_value(v[i / 2], i % 2 != 0);
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
          values[(first + 2 * p) / 2] = int4_pair(lo, hi);
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

/// The host loops below are written for g++'s vectorizer at -O2, whose cost model takes only
/// loops that need no scalar remainder and, under the default -ftrapping-math, no float
/// comparison: each runs over a multiple of `host_lanes` values (`host_lanes_of`) and then a
/// remainder loop; maxima and clamps compare integers. Every result is the kernels' own
/// operation (IEEE division and multiplication, exact maxima, sums in rank order), so vector and
/// scalar code give the same bits.
inline constexpr std::uint64_t host_lanes = 16;
/// `len` rounded down to a multiple of `host_lanes`.
constexpr std::uint64_t host_lanes_of(std::uint64_t len) noexcept { return len & ~(host_lanes - 1); }

/// Values `in[0, len)` as float32 into `f`.
template <class T>
inline void host_to_float(const T* __restrict in, std::uint64_t len, float* __restrict f) {
  for (std::uint64_t i = 0; i < len; ++i) f[i] = as_float(in[i]);
}

/// The largest magnitude of `f[0, len)` (0 for none), NaN when one of them is NaN. Magnitudes
/// are compared as the integers of their bits, which order non-NaN magnitudes as the floats do
/// and put every NaN above infinity (0x7f800000).
inline float host_block_amax(const float* __restrict f, std::uint64_t len) {
  std::int32_t m[host_lanes] = {};
  const std::uint64_t n = host_lanes_of(len);
  for (std::uint64_t i = 0; i < n; i += host_lanes)
    for (std::uint64_t k = 0; k < host_lanes; ++k) {
      const std::int32_t a = std::bit_cast<std::int32_t>(f[i + k]) & 0x7fffffff;
      m[k] = a > m[k] ? a : m[k];
    }
  std::int32_t amax = 0;
  for (std::uint64_t i = n; i < len; ++i) {
    const std::int32_t a = std::bit_cast<std::int32_t>(f[i]) & 0x7fffffff;
    amax = a > amax ? a : amax;
  }
  for (std::uint64_t k = 0; k < host_lanes; ++k) amax = m[k] > amax ? m[k] : amax;
  return amax > 0x7f800000 ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(amax);
}

/// `x / scale` rounded to the nearest integer (ties to even) and clamped to [-most, most], for a
/// finite positive `scale` = `block_scale(amax, most)` of a block holding `x`. Rounding adds and
/// subtracts 1.5 * 2^23, exact for |x / scale| < 2^22 under the default rounding mode; here
/// |x / scale| <= amax / scale <= 1.5 * most (the division that made `scale` errs by at most half
/// its unit in the last place, at most half of `scale` itself).
inline std::int32_t host_quantize_one(float x, float scale, std::int32_t most) {
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23
  const auto q = static_cast<std::int32_t>((x / scale + magic) - magic);
  return q > most ? most : (q < -most ? -most : q);
}

/// `f[0, len)` quantized with `scale` into `q` (one integer per value; see `host_quantize_one`).
inline void host_quantize_block(const float* __restrict f, std::uint64_t len, float scale, std::int32_t most,
                                std::int32_t* __restrict q) {
  const std::uint64_t n = host_lanes_of(len);
  for (std::uint64_t i = 0; i < n; ++i) q[i] = host_quantize_one(f[i], scale, most);
  for (std::uint64_t i = n; i < len; ++i) q[i] = host_quantize_one(f[i], scale, most);
}

/// `quantize_kernel`'s result by host loops (what the host stream runs): the same bytes, with
/// the scale's checks hoisted out of the element loop.
template <class T>
void host_quantize(const T* x, const quantized_layout& l, unsigned char* out) {
  const float most = quantized_max(l.bits);
  const auto most_int = static_cast<std::int32_t>(most);
  std::vector<float> converted(std::is_same_v<T, float> ? 0 : l.block_size);
  std::vector<std::int32_t> q(l.block_size);
  for (std::uint64_t s = 0; s < l.segments; ++s) {
    float* scales = segment_scales(out, l, s);
    unsigned char* values = segment_values(out, l, s);
    const T* in = x + s * l.count;
    for (std::uint64_t j = 0; j < l.blocks(); ++j) {
      const std::uint64_t first = j * l.block_size;
      const std::uint64_t len = l.block_length(j);
      const float* f = nullptr;
      if constexpr (std::is_same_v<T, float>) {
        f = in + first;
      } else {
        host_to_float(in + first, len, converted.data());
        f = converted.data();
      }
      const float scale = block_scale(host_block_amax(f, len), most);
      scales[j] = scale;
      if (!(scale > 0) || scale - scale != 0)
        std::fill(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(len), 0);
      else
        host_quantize_block(f, len, scale, most_int, q.data());
      unsigned char* v = values + first / (l.bits == quantized_bits::int4 ? 2 : 1);  // block sizes are even
      if (l.bits == quantized_bits::int8) {
        const std::uint64_t n = host_lanes_of(len);
        for (std::uint64_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(q[i]);
        for (std::uint64_t i = n; i < len; ++i) v[i] = static_cast<unsigned char>(q[i]);
      } else {
        for (std::uint64_t i = 0; i < len; i += 2) {
          const std::int32_t hi = i + 1 < len ? q[i + 1] : 0;
          v[i / 2] = int4_pair(q[i], hi);
        }
      }
    }
    for (std::uint64_t i = l.blocks() * 4 + l.value_bytes(); i < l.segment_bytes(); ++i)
      out[s * l.segment_bytes() + i] = 0;
  }
}

/// Block `j` of a segment (`len` values from element `first`) as integers into `q`.
inline void host_unpack_block(const unsigned char* segment, const quantized_layout& l, std::uint64_t first,
                              std::uint64_t len, std::int32_t* __restrict q) {
  if (l.bits == quantized_bits::int8) {
    const auto* __restrict v = segment_values(segment, l, 0) + first;
    const std::uint64_t n = host_lanes_of(len);
    for (std::uint64_t i = 0; i < n; ++i) q[i] = static_cast<signed char>(v[i]);
    for (std::uint64_t i = n; i < len; ++i) q[i] = static_cast<signed char>(v[i]);
    return;
  }
  const auto* __restrict v = segment_values(segment, l, 0) + first / 2;  // block sizes are even
  for (std::uint64_t i = 0; i < len; i += 2) {
    q[i] = int4_value(v[i / 2], false);
    if (i + 1 < len) q[i + 1] = int4_value(v[i / 2], true);
  }
}

/// Adds (`add`) or stores block `j` of a segment dequantized, `len` values from `first`, into
/// `acc`; `q` and `d` hold at least `len` values of scratch. The products go through memory
/// (`d`) before they are added, in a loop of their own: a compiler that contracts a
/// multiplication and an addition into one fused multiply-add (g++'s default -ffp-contract=fast
/// on targets with FMA: aarch64, x86 with -mfma or -march=native) then finds none to contract,
/// and the sum stays the kernels' two roundings.
inline void host_dequantize_block(const unsigned char* segment, const quantized_layout& l, std::uint64_t j,
                                  std::uint64_t first, std::uint64_t len, float* __restrict acc, bool add,
                                  std::int32_t* __restrict q, float* __restrict d) {
  const float scale = segment_scales(segment, l, 0)[j];
  host_unpack_block(segment, l, first, len, q);
  const std::uint64_t n = host_lanes_of(len);
  if (!add) {
    for (std::uint64_t i = 0; i < n; ++i) acc[i] = static_cast<float>(q[i]) * scale;
    for (std::uint64_t i = n; i < len; ++i) acc[i] = static_cast<float>(q[i]) * scale;
    return;
  }
  for (std::uint64_t i = 0; i < n; ++i) d[i] = static_cast<float>(q[i]) * scale;
  for (std::uint64_t i = n; i < len; ++i) d[i] = static_cast<float>(q[i]) * scale;
  for (std::uint64_t i = 0; i < n; ++i) acc[i] += d[i];
  for (std::uint64_t i = n; i < len; ++i) acc[i] += d[i];
}

/// `acc[0, len)` stored into `y` as T, each divided by `divisor` first unless it is 1.
template <class T>
inline void host_store_block(const float* __restrict acc, std::uint64_t len, float divisor, T* __restrict y) {
  const std::uint64_t n = host_lanes_of(len);
  if (divisor == 1) {
    for (std::uint64_t i = 0; i < n; ++i) y[i] = pk::arithmetic_result<T>(acc[i]);
    for (std::uint64_t i = n; i < len; ++i) y[i] = pk::arithmetic_result<T>(acc[i]);
    return;
  }
  for (std::uint64_t i = 0; i < n; ++i) y[i] = pk::arithmetic_result<T>(acc[i] / divisor);
  for (std::uint64_t i = n; i < len; ++i) y[i] = pk::arithmetic_result<T>(acc[i] / divisor);
}

/// `dequantize_kernel`'s result by host loops (as `host_quantize`: the same bytes).
template <class T>
void host_dequantize(const unsigned char* in, const quantized_layout& l, T* y, bool average, std::uint32_t own,
                     const T* own_values) {
  std::vector<float> acc(l.block_size), own_f(average ? l.block_size : 0), d(average ? l.block_size : 0);
  std::vector<std::int32_t> q(l.block_size);
  for (std::uint64_t s = 0; s < (average ? 1 : l.segments); ++s)
    for (std::uint64_t j = 0; j < l.blocks(); ++j) {
      const std::uint64_t first = j * l.block_size;
      const std::uint64_t len = l.block_length(j);
      if (!average) {
        host_dequantize_block(in + s * l.segment_bytes(), l, j, first, len, acc.data(), false, q.data(), nullptr);
        host_store_block(acc.data(), len, 1.0f, y + s * l.count + first);
        continue;
      }
      std::fill(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(len), 0.0f);
      for (std::uint32_t r = 0; r < l.segments; ++r) {
        if (r != own) {
          host_dequantize_block(in + r * l.segment_bytes(), l, j, first, len, acc.data(), true, q.data(), d.data());
          continue;
        }
        host_to_float(own_values + first, len, own_f.data());
        const float* __restrict o = own_f.data();
        float* __restrict a = acc.data();
        const std::uint64_t n = host_lanes_of(len);
        for (std::uint64_t i = 0; i < n; ++i) a[i] += o[i];
        for (std::uint64_t i = n; i < len; ++i) a[i] += o[i];
      }
      host_store_block(acc.data(), len, static_cast<float>(l.segments), y + first);
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
