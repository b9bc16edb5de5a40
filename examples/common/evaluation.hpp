#pragma once
/// @file
/// Data-parallel evaluation for the examples: every rank evaluates a contiguous slice of the
/// test set with its (identical) model, and one all_reduce adds up the counts, so evaluation
/// time also shrinks with the number of ranks.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "idx_dataset.hpp"
#include "mlp.hpp"
#include "ringzero/collective/all_reduce.hpp"

namespace ringzero::examples {

/// Test metrics, identical on every rank.
struct evaluation_result {
  double accuracy = 0.0;  ///< fraction of correctly classified examples
  double loss = 0.0;      ///< mean cross-entropy
  std::size_t count = 0;  ///< examples evaluated (all ranks)
};

/// Evaluates `model` on `data` split across the ranks of `comm` (collective: every rank calls
/// it). `x` and `y` are scratch for `chunk` rows (chunk <= model.max_batch()).
inline evaluation_result evaluate(communicator& comm, mlp& model, const image_dataset& data, float* x, std::uint8_t* y,
                                  int chunk) {
  const std::size_t n = data.count, ranks = static_cast<std::size_t>(comm.world_size());
  const std::size_t r = static_cast<std::size_t>(comm.rank());
  const std::size_t begin = n * r / ranks, end = n * (r + 1) / ranks;
  double sums[2] = {0.0, 0.0};  // correct, loss * rows
  std::vector<std::uint32_t> idx(static_cast<std::size_t>(chunk));
  for (std::size_t at = begin; at < end; at += static_cast<std::size_t>(chunk)) {
    const int rows = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(chunk), end - at));
    for (int k = 0; k < rows; ++k) idx[static_cast<std::size_t>(k)] = static_cast<std::uint32_t>(at + static_cast<std::size_t>(k));
    data.gather(std::span<const std::uint32_t>(idx.data(), static_cast<std::size_t>(rows)), x, y);
    const float loss = model.forward(x, y, rows);
    sums[0] += model.correct(y, rows);
    sums[1] += static_cast<double>(loss) * rows;
  }
  all_reduce(comm, sums, sums, 2, dtype::float64, reduce_kind::sum);
  evaluation_result e;
  e.count = n;
  e.accuracy = n ? sums[0] / static_cast<double>(n) : 0.0;
  e.loss = n ? sums[1] / static_cast<double>(n) : 0.0;
  return e;
}

}  // namespace ringzero::examples
