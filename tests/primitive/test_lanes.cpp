// The packed-lane combines of primitive/lanes.hpp, which the CUDA reduce_into runs on whole
// vectors, against the host primitive (primitive/reduce.hpp) element by element, bits compared
// exactly (NaN payloads included: min and max keep them). Every lane position and neighbouring
// lanes that differ are covered, so a carry or a mask leaking across lanes fails too.
//   add_bytes, min_max_bytes: every pair of byte values in every lane, for int8 and uint8.
//   min_max_lanes: every float16 and every bfloat16 first operand against 279 second operands
//   (every 257th pattern and 23 edges), low and high lane at once with different pairs
//   (RINGZERO_TEST_EXHAUSTIVE=1: all 65536 second operands, every pair in both lanes; about a
//   minute per op and type on a 2-core VM).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ringzero/core/half.hpp"
#include "ringzero/primitive/lanes.hpp"
#include "ringzero/primitive/reduce.hpp"

using namespace ringzero;
namespace lanes = ringzero::primitive::lanes;

namespace {

bool exhaustive() {
  const char* flag = std::getenv("RINGZERO_TEST_EXHAUSTIVE");
  return flag && std::string(flag) == "1";
}

/// The host primitive's `kind` over `a` and `b` (element type `t`, raw bytes).
std::vector<unsigned char> host_reduce(dtype t, reduce_kind kind, const std::vector<unsigned char>& a,
                                       const std::vector<unsigned char>& b) {
  std::vector<unsigned char> out(a.size());
  primitive::reduce_spec spec;
  spec.type = t;
  spec.kind = kind;
  primitive::reduce_into(out.data(), a.data(), b.data(), a.size() / dtype_size(t), spec);
  return out;
}

/// `words` 32-bit words of a and b combined by `op`, against the host primitive on the same
/// bytes as elements of `t`; the first difference is reported.
template <class Op>
void check_words(dtype t, reduce_kind kind, const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b,
                 Op op) {
  const std::size_t bytes = a.size() * 4;
  std::vector<unsigned char> ab(bytes), bb(bytes), got(bytes);
  std::memcpy(ab.data(), a.data(), bytes);
  std::memcpy(bb.data(), b.data(), bytes);
  for (std::size_t w = 0; w < a.size(); ++w) {
    const std::uint32_t r = op(a[w], b[w]);
    std::memcpy(got.data() + 4 * w, &r, 4);
  }
  const std::vector<unsigned char> want = host_reduce(t, kind, ab, bb);
  for (std::size_t w = 0; w < a.size(); ++w) {
    if (std::memcmp(got.data() + 4 * w, want.data() + 4 * w, 4) != 0) {
      std::uint32_t g, h;
      std::memcpy(&g, got.data() + 4 * w, 4);
      std::memcpy(&h, want.data() + 4 * w, 4);
      char what[160];
      std::snprintf(what, sizeof what, "%s %s of words 0x%08x and 0x%08x gave 0x%08x, the host 0x%08x",
                    std::string(dtype_name(t)).c_str(), std::string(reduce_kind_name(kind)).c_str(),
                    static_cast<unsigned>(a[w]), static_cast<unsigned>(b[w]), static_cast<unsigned>(g),
                    static_cast<unsigned>(h));
      FAIL_CHECK(what);
      return;
    }
  }
}

/// Second operands: every 257th pattern and 23 edges of float16 and bfloat16 (zeros, the
/// smallest subnormals and normals, one, the largest finite values, infinities, signalling and
/// quiet NaNs); all 65536 when exhaustive.
std::vector<std::uint16_t> half_seconds() {
  std::vector<std::uint16_t> v;
  if (exhaustive()) {
    for (std::uint32_t b = 0; b < 65536; ++b) v.push_back(static_cast<std::uint16_t>(b));
    return v;
  }
  for (std::uint32_t b = 0; b < 65536; b += 257) v.push_back(static_cast<std::uint16_t>(b));
  for (std::uint16_t b :
       {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x7c00, 0xfc00,
        0x7c01, 0x7e00, 0xfdff, 0x0080, 0x3f80, 0xbf80, 0x7f7f, 0x7f80, 0xff80, 0x7f81, 0xffc0})
    v.push_back(b);
  return v;
}

template <class T, bool Max>
void check_min_max() {
  const dtype t = dtype_of<T>;
  const reduce_kind kind = Max ? reduce_kind::max : reduce_kind::min;
  const std::vector<std::uint16_t> seconds = half_seconds();
  std::vector<std::uint32_t> a(65536), b(65536);
  std::uint64_t pairs = 0;
  // Every second operand in the release build; every third in the sanitizer builds' quick sweep
  // (the first operands stay exhaustive).
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  const std::size_t stride = 3;
#else
  const std::size_t stride = 1;
#endif
  for (std::size_t s = 0; s < seconds.size(); s += stride) {
    // low lane: every first operand with seconds[s]; high lane: a permutation of the first
    // operands (odd multiplier) with another second operand
    const std::uint32_t high_second = seconds[(s * 7 + 3) % seconds.size()];
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const std::uint32_t j = (i * 40503u + 12345u) & 0xffffu;
      a[i] = i | (j << 16);
      b[i] = seconds[s] | (high_second << 16);
    }
    check_words(t, kind, a, b, lanes::min_max_lanes<T, Max>);
    pairs += 2 * 65536;
  }
  MESSAGE(dtype_name(t) << " " << reduce_kind_name(kind) << ": " << pairs << " pairs in lanes");
}

/// Every pair of byte values (x, y) in every one of the four lanes, with neighbouring lanes that
/// differ from the pair and from each other.
void byte_pairs(std::vector<std::uint32_t>& a, std::vector<std::uint32_t>& b) {
  for (std::uint32_t x = 0; x < 256; ++x)
    for (std::uint32_t y = 0; y < 256; ++y) {
      // the pair (x, y) in lane 0 and rotated into lanes 1-3, with different neighbours
      const std::uint32_t nx = (x * 37 + 11) & 0xff, ny = (y * 91 + 200) & 0xff;
      for (int lane = 0; lane < 4; ++lane) {
        std::uint32_t wa = 0, wb = 0;
        for (int k = 0; k < 4; ++k) {
          const int shift = 8 * k;
          wa |= (k == lane ? x : (nx + static_cast<std::uint32_t>(k)) & 0xff) << shift;
          wb |= (k == lane ? y : (ny ^ static_cast<std::uint32_t>(k * 0x55)) & 0xff) << shift;
        }
        a.push_back(wa);
        b.push_back(wb);
      }
    }
}

}  // namespace

TEST_CASE("add_bytes: every pair of byte values in every lane, as the host's int8 and uint8 sums") {
  std::vector<std::uint32_t> a, b;
  byte_pairs(a, b);
  check_words(dtype::int8, reduce_kind::sum, a, b, lanes::add_bytes);
  check_words(dtype::uint8, reduce_kind::sum, a, b, lanes::add_bytes);
  CHECK(lanes::add_bytes(0x80ff7f01u, 0x80017f01u) == 0x0000fe02u);
}

TEST_CASE("min_max_bytes: every pair of byte values in every lane, as the host's int8 and uint8 min and max") {
  std::vector<std::uint32_t> a, b;
  byte_pairs(a, b);
  check_words(dtype::int8, reduce_kind::min, a, b, lanes::min_max_bytes<true, false>);
  check_words(dtype::int8, reduce_kind::max, a, b, lanes::min_max_bytes<true, true>);
  check_words(dtype::uint8, reduce_kind::min, a, b, lanes::min_max_bytes<false, false>);
  check_words(dtype::uint8, reduce_kind::max, a, b, lanes::min_max_bytes<false, true>);
  CHECK(lanes::min_max_bytes<true, false>(0x7f80ff01u, 0x01017f02u) == 0x0180ff01u);
  CHECK(lanes::min_max_bytes<false, false>(0x7f80ff01u, 0x01017f02u) == 0x01017f01u);
}

TEST_CASE("nan_lanes: exactly the NaN patterns of float16 and bfloat16, lane by lane") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const bool half_nan = (h & 0x7fffu) > 0x7c00u;
    const bool bf16_nan = (h & 0x7fffu) > 0x7f80u;
    const std::uint32_t other = h ^ 0x7c00u;  // a neighbour whose NaN-ness differs often
    const std::uint32_t word = h | (other << 16);
    const std::uint32_t half_want = (half_nan ? 0xffffu : 0u) | (((other & 0x7fffu) > 0x7c00u) ? 0xffff0000u : 0u);
    const std::uint32_t bf16_want = (bf16_nan ? 0xffffu : 0u) | (((other & 0x7fffu) > 0x7f80u) ? 0xffff0000u : 0u);
    if (lanes::nan_lanes<0x7c00u>(word) != half_want || lanes::nan_lanes<0x7f80u>(word) != bf16_want) {
      FAIL_CHECK("nan_lanes wrong for word " << word);
      return;
    }
  }
}

TEST_CASE("less_unordered_lanes: -0 equals +0, NaN is unordered, subnormals by value") {
  CHECK(lanes::less_unordered_lanes<float16>(0x8000u, 0x0000u) == 0);                // -0 < +0 is false
  CHECK(lanes::less_unordered_lanes<float16>(0x00000001u, 0x00000002u) == 0xffffu);  // subnormals
  CHECK(lanes::less_unordered_lanes<float16>(0x7e000000u, 0x00000000u) == 0xffff0000u);
  CHECK(lanes::less_unordered_lanes<float16>(0x3c00bc00u, 0xbc003c00u) == 0xffffu);
  CHECK(lanes::less_unordered_lanes<bfloat16>(0x80000000u, 0x00008000u) == 0);
  CHECK(lanes::less_unordered_lanes<bfloat16>(0x00010001u, 0x00020001u) == 0xffff0000u);
  CHECK(lanes::less_unordered_lanes<bfloat16>(0x7fc10000u, 0x3f803f80u) == 0xffffffffu);  // NaN, and 0 < 1
}

TEST_CASE("min_max_lanes: float16 min as the host, every first operand, both lanes") {
  check_min_max<float16, false>();
}
TEST_CASE("min_max_lanes: float16 max as the host, every first operand, both lanes") { check_min_max<float16, true>(); }
TEST_CASE("min_max_lanes: bfloat16 min as the host, every first operand, both lanes") {
  check_min_max<bfloat16, false>();
}
TEST_CASE("min_max_lanes: bfloat16 max as the host, every first operand, both lanes") {
  check_min_max<bfloat16, true>();
}
