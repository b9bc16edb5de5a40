#pragma once
/// @file
/// `gradient_bucket`: what a communication hook sees of one bucket of gradients (the analogue of
/// PyTorch's `dist.GradBucket`): the flat buffer to reduce in place, which parameters it holds,
/// how many ranks contribute to this reduction, and where the buffer lives (host memory, or
/// CUDA device memory ordered on a stream).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/options.hpp"
#include "ringzero/core/dtype.hpp"

namespace ringzero::ddp {

/// One gradient inside a `gradient_bucket` (PyTorch's `GradBucket.gradients()` gives the same:
/// each gradient with its shape).
struct bucket_gradient {
  std::size_t parameter = 0;             ///< registered index of the parameter
  std::uint64_t offset = 0;              ///< element offset of the gradient in the bucket's `data`
  std::uint64_t count = 0;               ///< elements of the gradient
  std::span<const std::uint64_t> shape;  ///< as registered (`reducer_parameter::shape`); empty: one dimension
  std::string_view name;                 ///< as registered; may be empty

  /// Rows of the gradient seen as a matrix (PyTorch's `view(shape[0], -1)`): shape[0] for two
  /// or more dimensions, else 0 (a vector).
  std::uint64_t matrix_rows() const noexcept { return shape.size() >= 2 ? shape[0] : 0; }
};

/// One bucket of gradients handed to a `comm_hook`.
/// The buffer holds `count` elements of `type`: the gradients of `parameters`, gradient k
/// starting at element `offsets[k]`, with zero padding between gradients (for alignment) that
/// every rank has at the same place. The hook reduces the whole buffer; on return from
/// `comm_hook::complete` it must hold the averaged gradients.
/// The spans stay valid until the reducer's `finish()` returns.
/// Device memory (`space == memory_space::cuda`): `data` is a device pointer on `cuda_device`;
/// the gradients in it are final in the order of `cuda_stream` (the communicator's stream), so
/// a hook enqueues its own work on that stream (ddp/bucket_memory.hpp does) and must not read
/// `data` on the host.
struct gradient_bucket {
  std::size_t index = 0;         ///< position in the step's reduction order (0 = reduced first)
  std::size_t bucket_count = 0;  ///< number of buckets reduced per step
  /// Options for the bucket's collectives (hooks pass them on): a tag naming the bucket, so that
  /// the contract check's errors name it and its parameters ("all_reduce of bucket 2
  /// (parameters fc1.weight [float32, 100352 elements], ...)") on every rank.
  collective_options options;
  void* data = nullptr;                        ///< the flat buffer, reduced in place
  std::uint64_t count = 0;                     ///< elements in `data`, padding included (same on every rank)
  dtype type = dtype::float32;                 ///< element type of `data`
  std::span<const std::size_t> parameters;     ///< registered indices of the parameters in the bucket
  std::span<const std::uint64_t> offsets;      ///< element offset of each parameter's gradient in `data`
  std::span<const bucket_gradient> gradients;  ///< each gradient: parameter, offset, count, shape, name
  int world_size = 1;                          ///< ranks in the communicator
  /// Ranks whose real gradients are in this reduction: `world_size`, unless some ranks have
  /// joined (ran out of inputs) and contribute zeros.
  int contributors = 1;
  /// What the hook divides the sum by to average: `contributors`, or `world_size` when the
  /// reducer was told to `divide_by_initial_world_size` (PyTorch's join option).
  int divisor = 1;
  /// False in the steps a rank that has joined (`gradient_reducer::join`) shadows: its buckets
  /// hold zeros for the others' reduction, not gradients of its own, so a hook must not add
  /// local state to them (PowerSGD's residual).
  bool local_contributes = true;
  /// Where `data` lives: host memory, or CUDA device memory.
  memory_space space = memory_space::host;
  /// For device memory: the cudaStream_t (as `void*`) the bucket's work is ordered on; else null.
  void* cuda_stream = nullptr;
  /// For device memory: the CUDA device of `data`; else -1.
  int cuda_device = -1;

  /// True for the last bucket of the step.
  bool is_last() const noexcept { return index + 1 == bucket_count; }
};

}  // namespace ringzero::ddp
