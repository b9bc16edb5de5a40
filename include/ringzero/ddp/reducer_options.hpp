#pragma once
/// @file
/// What a `gradient_reducer` is given and reports: `reducer_parameter` (one registered
/// parameter), `reducer_options` (buckets, views, hooks, join, reproducible mode),
/// `reducer_stats` (timings of the reductions) and `reducer_bucket_info` (the bucket layout).
/// The manual: docs/ddp.md.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/hidden_fraction.hpp"
#include "ringzero/ddp/bucket_assignment.hpp"
#include "ringzero/ddp/comm_hook.hpp"

namespace ringzero::ddp {

/// One registered parameter: its values, its gradient, its size and dtype. On a communicator
/// whose buffers are CUDA device memory, `data` and `grad` are device pointers.
struct reducer_parameter {
  /// The parameter's values (`count` elements): overwritten by rank 0's values at construction
  /// (and at the end of `join()`). May be null when `reducer_options::broadcast_parameters` is
  /// false and `join` is off.
  void* data = nullptr;
  /// The gradient buffer (`count` elements). Ignored (may be null) with
  /// `gradient_as_bucket_view`, where the reducer provides it (`gradient_reducer::gradient`).
  void* grad = nullptr;
  std::uint64_t count = 0;      ///< number of elements
  dtype type = dtype::float32;  ///< element type of values and gradient
  std::string name;             ///< optional, used in error messages
  /// Optional shape, outermost dimension first (a `torch::Linear` weight: {out, in}); its
  /// product must equal `count`. Empty: one dimension of `count`. The reducer only checks it
  /// and hands it to the communication hook (`bucket_gradient::shape`): `powersgd_hook`
  /// compresses gradients with two or more dimensions as matrices of shape[0] rows.
  std::vector<std::uint64_t> shape;

  /// A parameter from typed spans (`grad` may be empty in view mode; else sizes must match),
  /// with an optional name and shape.
  template <element_type T>
  static reducer_parameter of(std::span<T> data, std::span<T> grad, std::string name = {},
                              std::vector<std::uint64_t> shape = {}) {
    reducer_parameter p;
    p.shape = std::move(shape);
    p.data = data.data();
    p.grad = grad.data();
    p.count = data.size();
    p.type = dtype_of<T>;
    p.name = std::move(name);
    if (!grad.empty() && grad.size() != data.size())
      throw error(errc::invalid_argument, "reducer_parameter '" + p.name + "': gradient has " +
                                              std::to_string(grad.size()) + " elements, parameter " +
                                              std::to_string(data.size()));
    return p;
  }
};

/// Options of a `gradient_reducer`. Every rank must pass the same options (checked), except
/// `gradient_as_bucket_view`, `collect_timings` and `reproducible_stage_bytes`, which are local.
struct reducer_options {
  /// Byte limits of the buckets, consumed per dtype, the last one repeating (PyTorch's
  /// `bucket_cap_mb` with its 1 MiB first bucket). Must not be empty.
  std::vector<std::uint64_t> bucket_byte_limits{default_first_bucket_bytes, default_bucket_bytes};
  /// The reducer owns the gradients and hands out views into bucket memory (no copies).
  bool gradient_as_bucket_view = false;
  /// Parameters not marked ready by `finish()` are treated as `mark_unused` (zero gradient for
  /// the step, reduced with the others) instead of being an error. Like PyTorch, this also
  /// disables the rebuild of buckets.
  bool find_unused_parameters = false;
  /// Rebuild the buckets once, after the first synchronised step, from rank 0's ready order.
  bool rebuild_buckets = true;
  /// Broadcast every parameter from rank 0 at construction.
  bool broadcast_parameters = true;
  /// Uneven inputs: enables `join()`. Costs one small collective per synchronised step.
  bool join = false;
  /// In steps where some ranks joined: divide by the world size instead of the number of
  /// contributing ranks (PyTorch's `divide_by_initial_world_size`; off by default here: the
  /// average is over the ranks that contributed).
  bool divide_by_initial_world_size = false;
  /// The communication hook; null means `allreduce_hook` (average).
  std::shared_ptr<comm_hook> hook;
  /// Alignment in bytes of every gradient inside its bucket (a power of two; padding is zero).
  std::size_t alignment_bytes = 64;
  /// Record per-step timings of the reductions (`gradient_reducer::stats`).
  bool collect_timings = true;
  /// Reproducible gradient accumulation (see the file comment and docs/ddp.md): each
  /// micro-batch's gradient is one contribution, written (not added) by the trainer; the result
  /// is the reproducible average over every contribution of every rank, identical bit for bit
  /// for any world size, rank order and algorithm. Host memory, floating gradients and the
  /// default hook only; not with divide_by_initial_world_size (refused on every rank).
  bool reproducible = false;
  /// Reproducible mode with several micro-batches per rank: host memory (bytes) the reducer may
  /// spend keeping micro-batch gradients as plain copies instead of depositing each into the
  /// binned accumulators (reproducible_accumulator's stage; the reduction reads the copies
  /// once). Each step keeps the first min(16, this / bytes of all buckets) micro-batches so;
  /// later ones are deposited. 0: every micro-batch is deposited. Same bits whatever the value.
  std::uint64_t reproducible_stage_bytes = std::uint64_t{64} << 20;
};

/// Counters and timings of a reducer, accumulated over steps (see `gradient_reducer::stats`).
/// Times are in seconds, measured with the steady clock on the training thread, plus each
/// reduction's completion time as recorded by the progress thread.
struct reducer_stats {
  std::uint64_t synchronized_steps = 0;  ///< steps that communicated (shadow steps of join() included)
  std::uint64_t local_steps = 0;         ///< steps finished under no_sync
  std::uint64_t buckets_reduced = 0;     ///< bucket reductions completed
  std::uint64_t rebuilds = 0;            ///< layout changes made by the rebuild (0 or 1)
  /// Wall time during which at least one bucket of the step was being reduced (from the launch
  /// of a bucket to its completion, overlapping intervals counted once), summed over steps.
  double reduction_seconds = 0.0;
  /// Time `finish()` (and a join-mode launch waiting for the step's agreement) blocked on
  /// communication, plus the hook's `complete` after it (decompression; PowerSGD's second
  /// round): the part of the reduction not hidden behind backward.
  double exposed_seconds = 0.0;

  /// Fraction of the reduction time hidden behind computation: 1 - exposed / reduction
  /// (clamped to [0, 1]; 0 when nothing was reduced).
  double hidden_fraction() const noexcept { return ringzero::hidden_fraction(exposed_seconds, reduction_seconds); }
};

/// Description of one bucket of the current layout (for tools, tests and logging).
struct reducer_bucket_info {
  std::vector<std::size_t> parameters;  ///< registered indices, in bucket order
  std::vector<std::uint64_t> offsets;   ///< element offset of each gradient in the bucket
  dtype type = dtype::float32;          ///< element type
  std::uint64_t count = 0;              ///< elements, padding included
  std::uint64_t bytes = 0;              ///< gradient bytes without padding
  std::uint64_t limit_bytes = 0;        ///< byte limit the bucket was formed under
};

}  // namespace ringzero::ddp
