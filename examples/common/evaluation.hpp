#pragma once
/// @file
/// Data-parallel evaluation for the examples: every rank evaluates a contiguous slice of the
/// test set with its (identical) model, and one all_reduce adds up the counts, so evaluation
/// time also shrinks with the number of ranks. Layer hooks let a sharded model (ZeRO stage 3)
/// gather each layer's parameters around its use.

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
/// it). `x` and `y` are scratch for `chunk` rows (chunk <= model.max_batch()). `hooks` run around
/// every layer of every forward pass (see `no_layer_hooks`); every rank runs the same number of
/// passes, ceil(ceil(count / world_size) / chunk), and calls the hooks of a pass even when its
/// slice has no rows left for it, so hooks may be collectives (a ZeRO stage-3 gather).
template <class Hooks = no_layer_hooks>
evaluation_result evaluate(communicator& comm, mlp& model, const image_dataset& data, float* x, std::uint8_t* y,
                           int chunk, Hooks&& hooks = Hooks{}) {
  const std::size_t n = data.count, ranks = static_cast<std::size_t>(comm.world_size());
  const std::size_t r = static_cast<std::size_t>(comm.rank());
  const std::size_t begin = n * r / ranks, end = n * (r + 1) / ranks;
  const std::size_t step = static_cast<std::size_t>(chunk);
  const std::size_t passes = ((n + ranks - 1) / ranks + step - 1) / step;  // the largest slice's
  double sums[2] = {0.0, 0.0};                                             // correct, loss * rows
  std::vector<std::uint32_t> idx(step);
  for (std::size_t pass = 0; pass < passes; ++pass) {
    const std::size_t at = begin + pass * step;
    const int rows = at < end ? static_cast<int>(std::min(step, end - at)) : 0;
    if (rows == 0) {  // nothing left here; the hooks still run in step with the other ranks
      for (int l = 0; l < model.layer_count(); ++l) {
        hooks.before_forward(l);
        hooks.after_forward(l);
      }
      continue;
    }
    for (int k = 0; k < rows; ++k)
      idx[static_cast<std::size_t>(k)] = static_cast<std::uint32_t>(at + static_cast<std::size_t>(k));
    data.gather(std::span<const std::uint32_t>(idx.data(), static_cast<std::size_t>(rows)), x, y);
    const float loss = model.forward(x, y, rows, hooks);
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
