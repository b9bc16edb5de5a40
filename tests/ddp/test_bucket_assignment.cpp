// Bucket assignment by byte limits (PyTorch's compute_bucket_assignment_by_size): cases C14 and
// C15, the per-dtype walk through the limit list, the given order, and every error.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ringzero/ddp/bucket_assignment.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using indices = std::vector<std::vector<std::size_t>>;

namespace {
std::vector<bucket_plan> assign(const std::vector<bucket_tensor>& t, const std::vector<std::uint64_t>& limits,
                                const std::vector<std::size_t>& order = {}) {
  return assign_buckets(t, limits, order);
}
}  // namespace

TEST_CASE("C14: float32 tensors of 100, 200, 100, 50 elements under a 400-byte limit") {
  const std::vector<bucket_tensor> t = {
      {100, dtype::float32}, {200, dtype::float32}, {100, dtype::float32}, {50, dtype::float32}};
  const auto b = assign(t, {400});
  CHECK(bucket_indices(b) == indices{{0}, {1}, {2}, {3}});
  REQUIRE(b.size() == 4);
  CHECK(b[0].bytes == 400);
  CHECK(b[1].bytes == 800);
  CHECK(b[2].bytes == 400);
  CHECK(b[3].bytes == 200);  // the open bucket at the end is kept
  for (const auto& x : b) CHECK(x.limit_bytes == 400);
}

TEST_CASE("C15: mixed dtypes never share a bucket") {
  const std::vector<bucket_tensor> t = {{50, dtype::float32}, {25, dtype::float64}, {50, dtype::float32},
                                        {25, dtype::float64}, {50, dtype::float32}, {25, dtype::float64}};
  const auto b = assign(t, {400});
  CHECK(bucket_indices(b) == indices{{0, 2}, {1, 3}, {4}, {5}});
  REQUIRE(b.size() == 4);
  CHECK(b[0].type == dtype::float32);
  CHECK(b[1].type == dtype::float64);
  CHECK(b[2].type == dtype::float32);
  CHECK(b[3].type == dtype::float64);
}

TEST_CASE("each dtype walks the limit list on its own; the last limit repeats") {
  // float32: 100 B each. Limits {100, 300}: first float32 bucket closes at 100 B, then every 300 B.
  std::vector<bucket_tensor> t;
  for (int i = 0; i < 8; ++i) t.push_back({25, dtype::float32});
  auto b = assign(t, {100, 300});
  CHECK(bucket_indices(b) == indices{{0}, {1, 2, 3}, {4, 5, 6}, {7}});
  CHECK(b[0].limit_bytes == 100);
  CHECK(b[1].limit_bytes == 300);
  CHECK(b[3].limit_bytes == 300);
  // Interleave bfloat16 tensors: they get their own first (small) bucket.
  std::vector<bucket_tensor> m = {{25, dtype::float32},  {50, dtype::bfloat16}, {25, dtype::float32},
                                  {50, dtype::bfloat16}, {25, dtype::float32},  {100, dtype::bfloat16}};
  b = assign(m, {100, 300});
  CHECK(bucket_indices(b) == indices{{0}, {1}, {2, 4}, {3, 5}});
  CHECK(b[1].limit_bytes == 100);
  CHECK(b[3].limit_bytes == 300);
  CHECK(b[3].bytes == 300);
}

TEST_CASE("PyTorch's defaults: 1 MiB first bucket, then 25 MiB") {
  CHECK(default_bucket_byte_limits[0] == 1048576);
  CHECK(default_bucket_byte_limits[1] == 26214400);
  // The example MLP 784-256-128-10 in reverse registration order fits the first bucket (940584 B).
  const std::vector<bucket_tensor> t = {{784 * 256, dtype::float32}, {256, dtype::float32},
                                        {256 * 128, dtype::float32}, {128, dtype::float32},
                                        {128 * 10, dtype::float32},  {10, dtype::float32}};
  const std::vector<std::size_t> reverse = {5, 4, 3, 2, 1, 0};
  auto b = assign_buckets(t, default_bucket_byte_limits, reverse);
  CHECK(bucket_indices(b) == indices{{5, 4, 3, 2, 1, 0}});
  CHECK(b[0].bytes == 940584);
  // 4 MiB of float32 in 1 MiB tensors: the first bucket closes after one tensor, the rest share one.
  std::vector<bucket_tensor> big(4, {262144, dtype::float32});
  b = assign_buckets(big, default_bucket_byte_limits);
  CHECK(bucket_indices(b) == indices{{0}, {1, 2, 3}});
}

TEST_CASE("the given order is followed and buckets come in order of their first tensor") {
  const std::vector<bucket_tensor> t = {
      {100, dtype::float32}, {100, dtype::float32}, {100, dtype::float32}, {100, dtype::float32}};
  CHECK(bucket_indices(assign(t, {800}, {3, 1, 0, 2})) == indices{{3, 1}, {0, 2}});
  CHECK(bucket_indices(assign(t, {800}, {3, 2, 1, 0})) == indices{{3, 2}, {1, 0}});
  // Mixed dtypes with an order: buckets sorted by the position of their first tensor.
  const std::vector<bucket_tensor> m = {
      {10, dtype::float64}, {50, dtype::float32}, {10, dtype::float64}, {50, dtype::float32}};
  CHECK(bucket_indices(assign(m, {400}, {1, 0, 3, 2})) == indices{{1, 3}, {0, 2}});
  CHECK(bucket_indices(assign(m, {400}, {0, 1, 2, 3})) == indices{{0, 2}, {1, 3}});
}

TEST_CASE("a zero limit gives one bucket per tensor; zero-element tensors are kept") {
  const std::vector<bucket_tensor> t = {{0, dtype::float32}, {5, dtype::float32}, {0, dtype::int64}};
  CHECK(bucket_indices(assign(t, {0})) == indices{{0}, {1}, {2}});
  CHECK(bucket_indices(assign(t, {1000})) == indices{{0, 1}, {2}});
  CHECK(assign({}, {1000}).empty());
}

TEST_CASE("bad input is rejected with a clear error") {
  const std::vector<bucket_tensor> t = {{1, dtype::float32}, {2, dtype::float32}};
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const error& e) { return e.kind(); }
    return errc::internal;
  };
  CHECK(code_of([&] { assign(t, {}); }) == errc::invalid_argument);
  CHECK(code_of([&] { assign(t, {10}, {0}); }) == errc::invalid_argument);     // too short
  CHECK(code_of([&] { assign(t, {10}, {0, 0}); }) == errc::invalid_argument);  // repeated
  CHECK(code_of([&] { assign(t, {10}, {0, 2}); }) == errc::invalid_argument);  // out of range
  CHECK(code_of([&] { assign({{1, static_cast<dtype>(77)}}, {10}); }) == errc::invalid_argument);
  CHECK(code_of([&] { assign({{std::uint64_t{1} << 62, dtype::float64}}, {10}); }) == errc::invalid_argument);
  try {
    assign(t, {10}, {1, 1});
    FAIL("no error");
  } catch (const error& e) { CHECK(std::string(e.what()).find("tensor 1 appears twice") != std::string::npos); }
}
