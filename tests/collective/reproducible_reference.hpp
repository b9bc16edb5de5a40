#pragma once
// Helpers of the reproducible-mode tests (local and MPI backends): adversarial inputs, element
// access by dtype, and the reference computed on one thread with the format's functions
// (primitive/reproducible_sum.hpp) from the same contributions.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ringzero/primitive/reduce.hpp"
#include "ringzero/primitive/reproducible_arrays.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"
#include "ringzero/ringzero.hpp"

namespace rzt {

using namespace ringzero;

using bytes = std::vector<unsigned char>;

inline constexpr dtype floating_types[] = {dtype::float32, dtype::float64, dtype::bfloat16, dtype::float16};
inline constexpr reduce_kind summing_ops[] = {reduce_kind::sum, reduce_kind::avg, reduce_kind::premul_sum};

/// Stores `v` as element i of a buffer of dtype t (rounded to t).
inline void put(bytes& b, std::uint64_t i, dtype t, double v) {
  switch (t) {
    case dtype::float32: {
      const float f = static_cast<float>(v);
      std::memcpy(b.data() + 4 * i, &f, 4);
      return;
    }
    case dtype::float64: std::memcpy(b.data() + 8 * i, &v, 8); return;
    case dtype::float16: {
      const float16 h(static_cast<float>(v));
      std::memcpy(b.data() + 2 * i, &h, 2);
      return;
    }
    case dtype::bfloat16: {
      const bfloat16 h(static_cast<float>(v));
      std::memcpy(b.data() + 2 * i, &h, 2);
      return;
    }
    default: return;
  }
}

/// Element i of a buffer of dtype t as a double.
inline double get(const bytes& b, std::uint64_t i, dtype t) {
  switch (t) {
    case dtype::float32: {
      float f;
      std::memcpy(&f, b.data() + 4 * i, 4);
      return f;
    }
    case dtype::float64: {
      double d;
      std::memcpy(&d, b.data() + 8 * i, 8);
      return d;
    }
    case dtype::float16: {
      float16 h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      return static_cast<float>(h);
    }
    case dtype::bfloat16: {
      bfloat16 h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      return static_cast<float>(h);
    }
    default: return 0;
  }
}

/// Adversarial inputs of `count` elements for `ranks` contributions: values spanning 2^-60..2^60
/// (float16: its own range) of both signs, exact cancellation (+2^60 and -2^60 on different
/// contributions) next to small values, zeros, and a few non-finite values when `nonfinite`.
inline std::vector<bytes> adversarial(dtype t, int ranks, std::uint64_t count, std::uint64_t seed,
                                      bool nonfinite = false) {
  std::mt19937_64 gen(seed);
  const int lo = t == dtype::float16 ? -24 : -60, hi = t == dtype::float16 ? 15 : 60;
  std::vector<bytes> in(static_cast<std::size_t>(ranks), bytes(count * dtype_size(t)));
  for (std::uint64_t i = 0; i < count; ++i)
    for (int r = 0; r < ranks; ++r) {
      double v = std::ldexp(1.0 + static_cast<double>(gen() % 4096) / 4096.0,
                            lo + static_cast<int>(gen() % static_cast<std::uint64_t>(hi - lo + 1)));
      if (gen() & 1) v = -v;
      if (i % 5 == 1 && r < 2) v = std::ldexp(r == 0 ? 1.0 : -1.0, hi);  // cancels exactly
      if (i % 11 == 4) v = 0.0;
      if (nonfinite && i % 13 == 6 && r == ranks - 1)
        v = (i / 13) % 3 == 0 ? INFINITY : (i / 13) % 3 == 1 ? -INFINITY : NAN;
      put(in[static_cast<std::size_t>(r)], i, t, v);
    }
  return in;
}

/// The scalar of premul_sum on rank r (different per rank, as NCCL allows).
inline double scalar_of(int r) { return 0.5 + 0.25 * r; }

inline reduce_op op_for(reduce_kind k, int r) {
  return k == reduce_kind::premul_sum ? reduce_op::premul_sum(scalar_of(r)) : reduce_op(k);
}

/// The reference on one thread: contributions (premul_sum: scaled by their rank's scalar first)
/// reduced with the format's functions, elements [first, first + count) of each.
inline bytes reference(const std::vector<bytes>& in, dtype t, reduce_kind op, std::uint64_t first, std::uint64_t count,
                       const std::vector<int>& rank_of = {}) {
  const std::uint64_t w = static_cast<std::uint64_t>(primitive::reproducible_words(t)), es = dtype_size(t);
  std::vector<std::uint8_t> tops(count, 0);
  std::vector<std::int64_t> words(count * w, 0);
  std::vector<bytes> contributions;
  for (std::size_t c = 0; c < in.size(); ++c) {
    bytes v(in[c].begin() + static_cast<std::ptrdiff_t>(first * es),
            in[c].begin() + static_cast<std::ptrdiff_t>((first + count) * es));
    if (op == reduce_kind::premul_sum) {
      const int r = rank_of.empty() ? static_cast<int>(c) : rank_of[c];
      primitive::scale_into(v.data(), v.data(), count, t, scalar_of(r));
    }
    contributions.push_back(std::move(v));
  }
  for (const auto& v : contributions) primitive::fold_top_bins(tops.data(), v.data(), count, t);
  for (const auto& v : contributions) primitive::add_truncated_words(words.data(), v.data(), tops.data(), count, t);
  bytes out(count * es);
  primitive::convert_to(out.data(), words.data(), tops.data(), count, t, op == reduce_kind::avg ? in.size() : 1);
  return out;
}

}  // namespace rzt
