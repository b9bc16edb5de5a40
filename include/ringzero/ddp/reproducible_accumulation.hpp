#pragma once
/// @file
/// `detail::reproducible_bucket_accumulators`: the state of a gradient reducer in reproducible
/// mode (`reducer_options::reproducible`): one `reproducible_accumulator` per bucket, into which
/// every micro-batch's gradients go as one contribution (the first ones of a step staged as
/// copies, within `reproducible_stage_bytes`; the rest deposited), and the reduction of each
/// bucket as the reproducible average over every contribution of every rank.
///
/// The average is a function of the multiset of micro-batch gradients only (the binned sum of
/// collective/reproducible_accumulator.hpp, after Demmel & Nguyen, "Parallel Reproducible
/// Summation", IEEE TC 2015), so a fixed global batch split into fixed-size micro-batches gives
/// the same bits on any number of ranks, whichever rank computed which micro-batch.
/// What the mode accepts and refuses, and the trainer's contract, are in docs/ddp.md
/// ("Reproducible gradient accumulation"). Host memory only.
/// Thread semantics: driven by the reducer's training thread; a bucket's reduction runs on the
/// communicator's progress thread between reduce_async and finish.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/reproducible_accumulator.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/reduce_op.hpp"

namespace ringzero::ddp::detail {

/// Why reproducible mode cannot run with these settings, or "" when it can. `hook_name` is the
/// reducer's hook ("allreduce" is the default average; every other hook is refused because the
/// reducer does not call it in reproducible mode, and compression hooks round each rank's
/// partial sums to 16 bits, which no reproducible sum can undo); `parameter_types` the
/// registered gradients' dtypes (floating types only).
inline std::string reproducible_reducer_problem(memory_space space, const std::string& hook_name,
                                                bool divide_by_initial_world_size,
                                                const std::vector<dtype>& parameter_types,
                                                const std::vector<std::string>& parameter_names) {
  if (space != memory_space::host)
    return "reducer_options::reproducible needs a communicator on host memory (the reproducible accumulators are "
           "host memory; this communicator's buffers are CUDA device memory)";
  if (hook_name != "allreduce")
    return "reducer_options::reproducible cannot be combined with the communication hook '" + hook_name +
           "': in reproducible mode the reducer averages every bucket itself with the reproducible all_reduce (only "
           "the default 'allreduce' hook is accepted; compression hooks round partial sums to 16 bits, which is not "
           "reproducible across world sizes)";
  if (divide_by_initial_world_size)
    return "reducer_options::reproducible cannot be combined with divide_by_initial_world_size: reproducible mode "
           "averages over the micro-batch gradients that were deposited, whatever the world size";
  for (std::size_t i = 0; i < parameter_types.size(); ++i) {
    const dtype t = parameter_types[i];
    if (t != dtype::float16 && t != dtype::bfloat16 && t != dtype::float32 && t != dtype::float64)
      return "parameter " + std::to_string(i) + (parameter_names[i].empty() ? "" : " '" + parameter_names[i] + "'") +
             " has dtype " + std::string(dtype_name(t)) +
             ": reducer_options::reproducible averages float16, bfloat16, float32 and float64 gradients only";
  }
  return {};
}

/// One reproducible accumulator per bucket (see the file comment).
class reproducible_bucket_accumulators {
 public:
  /// Most micro-batches per step a bucket keeps as copies (reducer_options::reproducible_stage_bytes).
  static constexpr std::uint64_t max_stage = 16;

  /// Replaces the accumulators by empty ones, one per bucket: `counts[k]` elements of `types[k]`
  /// (padding included: padding is zero in every contribution), each keeping up to
  /// min(max_stage, stage_bytes / bytes of all buckets) contributions per step as copies.
  /// Called when the layout is made or rebuilt, between steps (no contribution is pending then).
  void reset_layout(const std::vector<std::uint64_t>& counts, const std::vector<dtype>& types,
                    std::uint64_t stage_bytes) {
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) bytes += counts[k] * dtype_size(types[k]);
    const std::uint64_t stage = bytes == 0 ? 0 : std::min(max_stage, stage_bytes / bytes);
    accumulators_.clear();
    accumulators_.reserve(counts.size());
    for (std::size_t k = 0; k < counts.size(); ++k) accumulators_.emplace_back(counts[k], types[k], stage);
  }

  /// Adds bucket k's current contents (count() elements of its dtype, host memory) as one
  /// contribution: a copy while the stage has room, else a deposit. Exact; the order never matters.
  void deposit(std::size_t k, const void* bucket) { accumulators_[k].add(bucket); }

  /// Contributions deposited into bucket k since the last reduction.
  std::uint64_t contributions(std::size_t k) const noexcept { return accumulators_[k].contributions(); }

  /// Collective (every rank, every bucket in the same order), asynchronous: issues `out`
  /// (bucket k's elements) = the reproducible average of every contribution deposited into
  /// bucket k on every rank, on the communicator's progress thread. A rank with no contribution
  /// (one that joined) takes part and adds nothing. Until the returned work completes, bucket k's
  /// accumulator and `out` must not be touched; then call finish(k). Errors: those of the
  /// reproducible all_reduce, on every rank, from the work's wait().
  work reduce_async(communicator& comm, std::size_t k, void* out) {
    return all_reduce_async(comm, accumulators_[k], out, reduce_kind::avg);
  }

  /// After bucket k's reduction has completed: forgets this rank's contributions to bucket k.
  void finish(std::size_t k) noexcept {
    if (accumulators_[k].contributions() != 0) accumulators_[k].clear();
  }

  /// Forgets every contribution of every bucket (keeps the memory).
  void clear() noexcept {
    for (auto& a : accumulators_) a.clear();
  }

  /// Number of buckets.
  std::size_t size() const noexcept { return accumulators_.size(); }

 private:
  std::vector<reproducible_accumulator> accumulators_;
};

}  // namespace ringzero::ddp::detail
