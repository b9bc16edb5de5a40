#pragma once
/// @file
/// Bucket assignment for data-parallel gradient reduction: which gradients are reduced together.
/// The manual: docs/ddp.md, "Header notes", `ringzero/ddp/bucket_assignment.hpp`.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::ddp {

/// PyTorch's default byte limit of the first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB).
inline constexpr std::uint64_t default_first_bucket_bytes = std::uint64_t{1} << 20;
/// PyTorch's default byte limit of every later bucket (`bucket_cap_mb = 25`, 25 MiB).
inline constexpr std::uint64_t default_bucket_bytes = std::uint64_t{25} << 20;
/// PyTorch's default limit list: {1 MiB, 25 MiB}.
inline constexpr std::array<std::uint64_t, 2> default_bucket_byte_limits = {default_first_bucket_bytes,
                                                                            default_bucket_bytes};

/// One tensor as bucket assignment sees it: its element count and dtype.
struct bucket_tensor {
  std::uint64_t count = 0;      ///< number of elements
  dtype type = dtype::float32;  ///< element type (buckets never mix dtypes)
};

/// One bucket of an assignment.
struct bucket_plan {
  std::vector<std::size_t> tensors;  ///< tensor indices, in the order they were visited
  dtype type = dtype::float32;       ///< the dtype of every tensor in the bucket
  std::uint64_t bytes = 0;           ///< sum of the tensors' sizes in bytes (no padding)
  std::uint64_t limit_bytes = 0;     ///< the byte limit that applied to this bucket
};

namespace detail {

/// Throws errc::invalid_argument unless `order` is a permutation of [0, n) (or empty).
inline void check_bucket_order(std::size_t n, std::span<const std::size_t> order) {
  if (order.empty()) return;
  if (order.size() != n)
    throw error(errc::invalid_argument, "bucket assignment: order has " + std::to_string(order.size()) +
                                            " entries for " + std::to_string(n) + " tensors");
  std::vector<bool> seen(n, false);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    if (i >= n)
      throw error(errc::invalid_argument, "bucket assignment: order[" + std::to_string(k) + "] = " + std::to_string(i) +
                                              " is not a tensor index (there are " + std::to_string(n) + ")");
    if (seen[i])
      throw error(errc::invalid_argument,
                  "bucket assignment: tensor " + std::to_string(i) + " appears twice in the order");
    seen[i] = true;
  }
}

}  // namespace detail

/// Assigns `tensors` to buckets by byte limits (see the file comment for the rules).
/// - `byte_limits`: the limits in bytes, consumed per dtype; the last one repeats. Must not be
///   empty. A limit of 0 puts every tensor in its own bucket.
/// - `order`: the order to visit tensors in, a permutation of [0, tensors.size()); empty means
///   0, 1, 2, ... (the identity).
/// Returns the buckets in order of their first tensor's position in `order`; every tensor
/// appears in exactly one bucket (zero-element tensors too).
/// Errors (errc::invalid_argument): empty `byte_limits`, an invalid dtype, a size in bytes that
/// overflows 64 bits, or an `order` that is not a permutation.
/// Example: limits {400}, float32 tensors of 100, 200, 100, 50 elements give
/// {{0}, {1}, {2}, {3}}; limits {400}, float32 50, float64 25, float32 50, float64 25,
/// float32 50, float64 25 give {{0, 2}, {1, 3}, {4}, {5}}.
inline std::vector<bucket_plan> assign_buckets(std::span<const bucket_tensor> tensors,
                                               std::span<const std::uint64_t> byte_limits,
                                               std::span<const std::size_t> order = {}) {
  if (byte_limits.empty()) throw error(errc::invalid_argument, "bucket assignment: the list of byte limits is empty");
  const std::size_t n = tensors.size();
  detail::check_bucket_order(n, order);

  struct open_bucket {
    bucket_plan plan;
    std::size_t first_position = 0;  // position in `order` of the bucket's first tensor
    std::size_t limit_index = 0;     // which limit this dtype uses next
  };
  std::vector<open_bucket> open(static_cast<std::size_t>(dtype_count));
  std::vector<std::pair<std::size_t, bucket_plan>> done;  // (first position, bucket)

  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = order.empty() ? k : order[k];
    const bucket_tensor& t = tensors[i];
    if (!is_valid(t.type))
      throw error(errc::invalid_argument, "bucket assignment: tensor " + std::to_string(i) +
                                              " has unknown dtype value " +
                                              std::to_string(static_cast<unsigned>(t.type)));
    const std::uint64_t es = dtype_size(t.type);
    const std::optional<std::uint64_t> tensor_bytes = ringzero::detail::checked_mul(t.count, es);
    if (!tensor_bytes)
      throw error(errc::invalid_argument, "bucket assignment: tensor " + std::to_string(i) + " of " +
                                              std::to_string(t.count) + " elements overflows 64-bit bytes");
    open_bucket& b = open[static_cast<std::size_t>(t.type)];
    if (b.plan.tensors.empty()) {
      b.first_position = k;
      b.plan.type = t.type;
      b.plan.limit_bytes = byte_limits[b.limit_index];
    }
    b.plan.tensors.push_back(i);
    b.plan.bytes =
        ringzero::detail::checked_add(b.plan.bytes, *tensor_bytes).value_or(std::numeric_limits<std::uint64_t>::max());
    if (b.plan.bytes >= b.plan.limit_bytes) {
      done.emplace_back(b.first_position, std::move(b.plan));
      b.plan = bucket_plan{};
      if (b.limit_index + 1 < byte_limits.size()) ++b.limit_index;
    }
  }
  for (open_bucket& b : open)
    if (!b.plan.tensors.empty()) done.emplace_back(b.first_position, std::move(b.plan));

  // Stable order by first position; positions are distinct, so this is a total order.
  std::vector<std::size_t> idx(done.size());
  for (std::size_t j = 0; j < idx.size(); ++j) idx[j] = j;
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return done[a].first < done[b].first; });
  std::vector<bucket_plan> result;
  result.reserve(done.size());
  for (std::size_t j : idx) result.push_back(std::move(done[j].second));
  return result;
}

/// The tensor indices of each bucket (the shape PyTorch's function returns), for tests and tools.
inline std::vector<std::vector<std::size_t>> bucket_indices(const std::vector<bucket_plan>& buckets) {
  std::vector<std::vector<std::size_t>> out;
  out.reserve(buckets.size());
  for (const bucket_plan& b : buckets) out.push_back(b.tensors);
  return out;
}

}  // namespace ringzero::ddp
