#pragma once
/// @file
/// `allreduce_hook`: the default communication hook of the gradient reducer: every bucket is
/// all-reduced and divided by the number of contributing ranks, leaving the average.
///
/// Arithmetic: when every rank contributes (the usual case) the bucket is all-reduced with
/// `reduce_kind::avg`: summed, then divided once (core/reduce_op.hpp), so that a world of one
/// returns its gradients bit for bit and sums that are exact stay exact. When some ranks have
/// joined (uneven inputs) it sums, and `complete` divides by `bucket.divisor`.
/// PyTorch's default hook (`allreduce_hook`) divides before summing instead; sum-then-divide
/// rounds once and gives the same values up to rounding.
/// Host and CUDA device memory alike: on the device the division is the CUDA `divide`
/// primitive on the bucket's stream (ddp/bucket_memory.hpp), bit for bit the host's.

#include <string>

#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/ddp/bucket_memory.hpp"
#include "ringzero/ddp/comm_hook.hpp"

namespace ringzero::ddp {

/// The default average (see the file comment). Stateless: one object may serve any number of
/// reducers and threads.
class allreduce_hook final : public comm_hook {
 public:
  /// "allreduce".
  std::string name() const override { return "allreduce"; }

  /// Issues the asynchronous all_reduce of the whole bucket (avg, or sum when ranks joined).
  work launch(communicator& comm, const gradient_bucket& bucket) override {
    const bool plain_average = bucket.divisor == comm.world_size();
    return all_reduce_async(comm, bucket.data, bucket.data, bucket.count, bucket.type,
                            plain_average ? reduce_op(reduce_kind::avg) : reduce_op(reduce_kind::sum), bucket.options);
  }

  /// Divides by `bucket.divisor` when `launch` summed.
  void complete(const gradient_bucket& bucket) override {
    if (bucket.divisor != bucket.world_size && bucket.divisor > 1)
      bucket_memory::of(bucket).divide(bucket.data, bucket.data, bucket.count, bucket.type, bucket.divisor);
  }

  /// Host and CUDA device memory.
  bool supports(memory_space) const override { return true; }
};

}  // namespace ringzero::ddp
