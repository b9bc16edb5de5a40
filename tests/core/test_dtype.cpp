// dtype and reduce_op tables, and the host reduction primitive's arithmetic per dtype.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/reduce_op.hpp"
#include "ringzero/primitive/reduce.hpp"

using namespace ringzero;

TEST_CASE("dtype sizes, names and parsing") {
  for (dtype t : all_dtypes) {
    CHECK(is_valid(t));
    CHECK(dtype_size(t) > 0);
    CHECK(parse_dtype(dtype_name(t)) == t);
    CHECK(parse_dtype(dtype_short_name(t)) == t);
    visit_dtype(t, [&]<class T>() {
      CHECK(sizeof(T) == dtype_size(t));
      CHECK(dtype_of<T> == t);
    });
  }
  CHECK(!is_valid(static_cast<dtype>(10)));
  CHECK(dtype_size(static_cast<dtype>(200)) == 0);
  CHECK(!parse_dtype("float128"));
  CHECK(parse_dtype("float") == dtype::float32);
  CHECK(parse_dtype("half") == dtype::float16);
}

TEST_CASE("reduce kinds") {
  for (int i = 0; i < reduce_kind_count; ++i) {
    const auto k = static_cast<reduce_kind>(i);
    CHECK(parse_reduce_kind(reduce_kind_name(k)) == k);
  }
  CHECK(!is_valid(static_cast<reduce_kind>(6)));
  constexpr reduce_op op = reduce_op::premul_sum(0.5);
  CHECK(op.kind == reduce_kind::premul_sum);
  CHECK(op.scalar == 0.5);
}

TEST_CASE("error messages carry their context") {
  error_context c;
  c.backend = "local";
  c.rank = 2;
  c.world_size = 4;
  c.collective = "all_reduce";
  c.sequence = 7;
  const error e(errc::contract_mismatch, c, "count mismatch");
  CHECK(std::string(e.what()).find("ringzero [local rank 2/4] all_reduce #7: count mismatch") == 0);
  CHECK(e.code() == errc::contract_mismatch);
  CHECK(e.kind() == errc::contract_mismatch);
}

TEST_CASE("integer arithmetic wraps instead of overflowing") {
  primitive::reduce_spec s;
  s.type = dtype::int8;
  s.kind = reduce_kind::sum;
  std::int8_t a = 120, b = 100, out = 0;
  primitive::reduce_into(&out, &a, &b, 1, s);
  CHECK(out == -36);  // case C1's arithmetic
  s.type = dtype::int64;
  s.kind = reduce_kind::prod;
  std::int64_t x = std::numeric_limits<std::int64_t>::max(), y = 2, z = 0;
  primitive::reduce_into(&z, &x, &y, 1, s);
  CHECK(z == -2);
  s.type = dtype::uint64;
  s.kind = reduce_kind::min;
  std::uint64_t m1 = std::numeric_limits<std::uint64_t>::max(), m2 = 0, m3 = 1;
  primitive::reduce_into(&m3, &m1, &m2, 1, s);
  CHECK(m3 == 0);  // unsigned comparison (case C2)
  s.type = dtype::int32;
  s.kind = reduce_kind::sum;
  s.divisor = 3;
  std::int32_t p = 1, q = 4, r = 0;
  primitive::reduce_into(&r, &p, &q, 1, s);
  CHECK(r == 1);  // (1 + 4) / 3 truncates
  p = -1;
  q = -4;
  primitive::reduce_into(&r, &p, &q, 1, s);
  CHECK(r == -1);  // truncation toward zero (case C3)
}

TEST_CASE("premul_sum pre-scales and avg post-divides") {
  primitive::reduce_spec s;
  s.type = dtype::bfloat16;
  s.kind = reduce_kind::premul_sum;
  s.pre_a = s.pre_b = true;
  s.scalar_a = 0.5;
  s.scalar_b = 2.0;
  std::vector<bfloat16> a(37, bfloat16(6.0f)), b(37, bfloat16(3.0f)), out(37);
  primitive::reduce_into(out.data(), a.data(), b.data(), 37, s);
  for (auto v : out) CHECK(static_cast<float>(v) == 9.0f);
  float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f, res = 0.0f;
  s = {};
  s.type = dtype::float32;
  s.kind = reduce_kind::max;
  primitive::reduce_into(&res, &one, &nan, 1, s);
  CHECK(res != res);
  primitive::reduce_into(&res, &nan, &one, 1, s);
  CHECK(res != res);
}
