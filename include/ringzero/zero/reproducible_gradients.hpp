#pragma once
/// @file
/// `zero::detail::reproducible_gradients`: the gradient state of a `zero::sharded_model` in
/// reproducible mode (`sharded_model_options::reproducible`): one `reproducible_accumulator`
/// over each trainable flat buffer's full gradient, into which every micro-batch's gradient of
/// the buffer is deposited as one contribution, and one reduction per buffer at the end of the
/// accumulation window: all_reduce at stage 0, reduce_scatter of the rank's shard at stages 1-3.
///
/// The result is the reproducible average over every micro-batch of every rank (the binned sum
/// of collective/reproducible_accumulator.hpp, after Demmel & Nguyen, "Parallel Reproducible
/// Summation", IEEE TC 2015): a function of the multiset of micro-batch gradients only, so a
/// fixed global batch of fixed-size micro-batches gives the same bits at every stage and world
/// size. Cost: the accumulators hold the full gradient at every stage (at stages 2-3 that is
/// beyond the plan's memory; docs/zero.md). Host memory. Driven by the model's thread only.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/options.hpp"
#include "ringzero/collective/reproducible_accumulator.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/reduce_op.hpp"
#include "ringzero/zero/shard_plan.hpp"

namespace ringzero::zero::detail {

/// Why reproducible mode cannot run with these settings, or "" when it can: gradients of a
/// floating dtype only; no gradient clipping (the global norm is summed per shard, an order
/// that depends on the world size, so clipping would not be reproducible); no averaging across
/// replica groups of hybrid sharding (an average of averages depends on the group size).
inline std::string reproducible_gradients_problem(const shard_plan& plan, double max_grad_norm,
                                                  int replica_world_size) {
  if (max_grad_norm != 0)
    return "reproducible mode cannot clip gradients (max_grad_norm " + std::to_string(max_grad_norm) +
           "): the global gradient norm is summed shard by shard, which is not reproducible across world sizes";
  if (replica_world_size > 1)
    return "reproducible mode does not support hybrid sharding (a replica communicator of " +
           std::to_string(replica_world_size) + " ranks): averaging across replica groups is not reproducible";
  if (const quantized_bits q = plan.request().quantization.gradients; q != quantized_bits::none)
    return "reproducible mode reduces gradients in full precision: quantized gradients (" +
           std::string(quantized_bits_name(q)) + ") are refused with it";
  if (const quantized_bits q = plan.request().quantization.weights; q != quantized_bits::none)
    return "reproducible mode promises the same bits at every world size: quantized weights (" +
           std::string(quantized_bits_name(q)) + "), whose blocks start at each shard, are refused with it";
  for (const flat_buffer& f : plan.buffers()) {
    if (!f.trainable) continue;
    const dtype t = f.gradient_type;
    if (t != dtype::float16 && t != dtype::bfloat16 && t != dtype::float32 && t != dtype::float64)
      return "reproducible mode averages float16, bfloat16, float32 and float64 gradients only, not " +
             std::string(dtype_name(t));
  }
  return {};
}

/// See the file comment.
class reproducible_gradients {
 public:
  /// Empty accumulators, one per trainable, non-empty buffer of `plan` (f.numel elements of its
  /// gradient dtype, padding included).
  explicit reproducible_gradients(const shard_plan& plan) {
    accumulators_.resize(plan.buffers().size());
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      const flat_buffer& f = plan.buffers()[b];
      if (f.trainable && f.numel > 0) accumulators_[b].emplace(f.numel, f.gradient_type);
    }
  }

  /// Deposits buffer b's full gradient of this micro-batch (`numel` elements, host memory).
  void deposit(std::size_t b, const void* full_gradient) { accumulators_[b]->add(full_gradient); }

  /// Contributions deposited into buffer b since its last reduction.
  std::uint64_t contributions(std::size_t b) const { return accumulators_[b]->contributions(); }

  /// Collective: `out` = the reproducible average of buffer b's contributions over every rank:
  /// the whole buffer when `shard` is false (stage 0), else this rank's shard
  /// (numel / world_size elements, `comm`'s rank order). Forgets the contributions.
  void reduce(communicator& comm, std::size_t b, bool shard, void* out, const collective_options& options) {
    if (shard)
      reduce_scatter(comm, *accumulators_[b], out, reduce_kind::avg, options);
    else
      all_reduce(comm, *accumulators_[b], out, reduce_kind::avg, options);
    accumulators_[b]->clear();
  }

 private:
  std::vector<std::optional<reproducible_accumulator>> accumulators_;
};

}  // namespace ringzero::zero::detail
