// Host cast and fill (primitive/cast.hpp, primitive/fill.hpp): every conversion rule at its
// edges (NaN, infinities, saturation, wrap-around, ties, double rounding to 16-bit floats), and
// all 100 dtype pairs on values every type holds exactly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/fill.hpp"

using namespace ringzero;
using primitive::detail::convert;

TEST_CASE("floating to integer truncates toward zero, saturates, and maps NaN to 0") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(convert<std::int32_t>(3.7f) == 3);
  CHECK(convert<std::int32_t>(-3.7f) == -3);
  CHECK(convert<std::int32_t>(nan) == 0);
  CHECK(convert<std::int32_t>(inf) == std::numeric_limits<std::int32_t>::max());
  CHECK(convert<std::int32_t>(-inf) == std::numeric_limits<std::int32_t>::min());
  CHECK(convert<std::int32_t>(2147483648.0f) == std::numeric_limits<std::int32_t>::max());
  CHECK(convert<std::int32_t>(-2147483648.0f) == std::numeric_limits<std::int32_t>::min());
  CHECK(convert<std::int32_t>(2147483647.0) == 2147483647);
  CHECK(convert<std::int32_t>(-2147483648.9) == std::numeric_limits<std::int32_t>::min());
  CHECK(convert<std::int8_t>(127.9f) == 127);
  CHECK(convert<std::int8_t>(128.0f) == 127);
  CHECK(convert<std::int8_t>(-128.5f) == -128);
  CHECK(convert<std::int8_t>(-129.0f) == -128);
  CHECK(convert<std::uint8_t>(255.9f) == 255);
  CHECK(convert<std::uint8_t>(256.0f) == 255);
  CHECK(convert<std::uint8_t>(-0.9f) == 0);
  CHECK(convert<std::uint8_t>(-1.0f) == 0);
  CHECK(convert<std::uint8_t>(-inf) == 0);
  CHECK(convert<std::uint32_t>(4294967295.0) == 4294967295u);
  CHECK(convert<std::uint32_t>(4294967296.0) == 4294967295u);
  CHECK(convert<std::int64_t>(9223372036854775808.0) == std::numeric_limits<std::int64_t>::max());
  CHECK(convert<std::int64_t>(-9223372036854775808.0) == std::numeric_limits<std::int64_t>::min());
  CHECK(convert<std::int64_t>(9223372036854774784.0) == 9223372036854774784LL);  // largest double below 2^63
  CHECK(convert<std::uint64_t>(18446744073709551616.0) == std::numeric_limits<std::uint64_t>::max());
  CHECK(convert<std::uint64_t>(18446744073709549568.0) == 18446744073709549568ULL);  // largest double below 2^64
  CHECK(convert<std::uint64_t>(std::numeric_limits<double>::quiet_NaN()) == 0);
  CHECK(convert<std::int32_t>(float16(-2.5f)) == -2);
  CHECK(convert<std::uint8_t>(bfloat16(300.0f)) == 255);
}

TEST_CASE("integer to integer wraps modulo 2^bits") {
  CHECK(convert<std::int8_t>(std::int32_t{300}) == 44);
  CHECK(convert<std::int8_t>(std::uint8_t{200}) == -56);
  CHECK(convert<std::uint8_t>(std::int8_t{-1}) == 255);
  CHECK(convert<std::uint64_t>(std::int32_t{-1}) == std::numeric_limits<std::uint64_t>::max());
  CHECK(convert<std::int64_t>(std::numeric_limits<std::uint64_t>::max()) == -1);
  CHECK(convert<std::uint32_t>(std::int64_t{0x1'0000'0005}) == 5u);
}

TEST_CASE("into floating types: round to nearest even; 16-bit floats through float32 (as PyTorch)") {
  CHECK(convert<double>(std::int64_t{(1LL << 53) + 1}) == 9007199254740992.0);  // tie to even
  CHECK(convert<double>(std::int64_t{(1LL << 53) + 3}) == 9007199254740996.0);
  CHECK(convert<float>(std::numeric_limits<std::uint64_t>::max()) == 18446744073709551616.0f);
  CHECK(convert<float>(std::int32_t{16777217}) == 16777216.0f);
  CHECK(convert<float>(1.0000000596046448) == 1.0f);                 // exactly half an ulp above 1: even
  CHECK(convert<float>(1.0000001788139343) == 1.0000002384185791f);  // 1.5 ulps: even is up
  CHECK(std::isinf(convert<float>(1e300)));
  CHECK(convert<float16>(65504.0f).bits == 0x7bff);
  CHECK(convert<float16>(65519.99f).bits == 0x7bff);
  CHECK(convert<float16>(65520.0f).bits == 0x7c00);  // the tie rounds to infinity
  CHECK(convert<float16>(std::int32_t{70000}).bits == 0x7c00);
  CHECK(convert<float16>(std::int32_t{-3}).bits == 0xc200);
  // float64 -> float16 rounds twice: 1 + 2^-11 + 2^-40 is just above the float16 tie, but in
  // float32 it becomes the tie 1 + 2^-11, which rounds to even (1.0) — PyTorch's result too.
  CHECK(convert<float16>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)).bits == 0x3c00);
  // int32 -> bfloat16 likewise: 2^24 + 2^16 + 1 -> float32 2^24 + 2^16 (tie) -> bfloat16 2^24.
  CHECK(static_cast<float>(convert<bfloat16>(std::int32_t{(1 << 24) + (1 << 16) + 1})) == 16777216.0f);
  CHECK(convert<bfloat16>(std::numeric_limits<double>::infinity()).bits == 0x7f80);
  CHECK(std::isnan(static_cast<float>(convert<bfloat16>(std::numeric_limits<double>::quiet_NaN()))));
  CHECK(static_cast<float>(convert<float16>(bfloat16(3.0f))) == 3.0f);
  CHECK(convert<float>(float16::from_bits(0x0001)) == std::ldexp(1.0f, -24));  // subnormal, exact
}

TEST_CASE("every pair of dtypes agrees on values all of them hold exactly") {
  for (dtype to : all_dtypes)
    for (dtype from : all_dtypes) {
      CAPTURE(dtype_name(to));
      CAPTURE(dtype_name(from));
      std::vector<unsigned char> src(101 * dtype_size(from)), dst(101 * dtype_size(to), 0xAB);
      visit_dtype(from, [&]<class F>() {
        for (int v = 0; v <= 100; ++v) reinterpret_cast<F*>(src.data())[v] = convert<F>(v);
      });
      primitive::cast_into(dst.data(), to, src.data(), from, 101);
      visit_dtype(to, [&]<class T>() {
        for (int v = 0; v <= 100; ++v) REQUIRE(static_cast<double>(reinterpret_cast<const T*>(dst.data())[v]) == v);
      });
    }
}

TEST_CASE("cast_into: the same dtype copies bytes (NaN payloads too); zero count touches nothing") {
  std::vector<std::uint32_t> src = {0x7fc01234u, 0x3f800000u, 0xff800001u};
  std::vector<std::uint32_t> dst(3, 0);
  primitive::cast_into(dst.data(), dtype::float32, src.data(), dtype::float32, 3);
  CHECK(dst == src);
  primitive::cast_into(nullptr, dtype::int8, nullptr, dtype::float64, 0);
}

TEST_CASE("fill writes the cast of the value, and element_pattern gives its bits") {
  CHECK(primitive::element_pattern(dtype::float16, 2.5) == 0x4100u);
  CHECK(primitive::element_pattern(dtype::bfloat16, -1.0) == 0xbf80u);
  CHECK(primitive::element_pattern(dtype::int8, -1.0) == 0xffu);
  CHECK(primitive::element_pattern(dtype::uint8, -1.0) == 0u);  // saturated
  CHECK(primitive::element_pattern(dtype::int64, -2.0) == 0xfffffffffffffffeull);
  CHECK(primitive::element_pattern(dtype::float64, 0.1) == 0x3fb999999999999aull);
  for (dtype t : all_dtypes) {
    std::vector<unsigned char> buf(9 * dtype_size(t), 0xEE);
    primitive::fill(buf.data() + dtype_size(t), 7, t, 2.5);
    visit_dtype(t, [&]<class T>() {
      const T* p = reinterpret_cast<const T*>(buf.data());
      for (int i = 1; i <= 7; ++i) CHECK(static_cast<double>(p[i]) == (is_floating_point(t) ? 2.5 : 2.0));
    });
    for (std::size_t i = 0; i < dtype_size(t); ++i) {
      CHECK(buf[i] == 0xEE);  // neighbours untouched
      CHECK(buf[buf.size() - 1 - i] == 0xEE);
    }
  }
  primitive::fill(nullptr, 0, dtype::float32, 1.0);
}
