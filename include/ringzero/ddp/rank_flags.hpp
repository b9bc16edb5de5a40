#pragma once
/// @file
/// `ddp::detail::rank_flags`: the one int32 flag per rank that the gradient reducer exchanges at
/// the start of each synchronised step in join mode (does this rank still have data?) and in
/// reproducible mode (how many micro-batches did it deposit?), and after which it counts the
/// ranks that contribute. The flags live in the reducer's memory (host memory, or the
/// communicator's device memory, read back to the host after the gather), so that the
/// all_gather runs on the communicator like every bucket's reduction. Thread semantics: the
/// reducer's training thread only. The manual: docs/ddp.md, "The reducer in detail" (join).

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/ddp/bucket_memory.hpp"

namespace ringzero::ddp::detail {

/// See the file comment.
class rank_flags {
 public:
  /// Allocates world_size + 1 flags in `memory` (every rank's, then this rank's own), counted by
  /// `counter`. Throws what `bucket_memory::allocate` throws.
  void allocate(const bucket_memory& memory, int world_size, primitive::memory_counter* counter) {
    memory_ = &memory;
    world_size_ = world_size;
    const auto n = static_cast<std::size_t>(world_size);
    storage_ = memory.allocate(sizeof(std::int32_t) * (n + 1), counter);
    all_ = static_cast<std::int32_t*>(storage_.data());
    mine_ = all_ + world_size;
    if (memory.is_device()) host_.assign(n, 0);
  }

  /// Sets this rank's flag (enqueued on the device's stream for device memory).
  void set(int value) {
    if (memory_->is_device())
      memory_->fill(mine_, 1, dtype::int32, value);
    else
      *mine_ = value;
  }

  /// Starts the all_gather of every rank's flag on `comm` (a collective); `read()` once it completed.
  [[nodiscard]] work gather_async(communicator& comm) { return all_gather_async(comm, mine_, all_, 1, dtype::int32); }

  /// Gathers every rank's flag and reads them (a blocking collective).
  void gather(communicator& comm) {
    all_gather(comm, mine_, all_, 1, dtype::int32);
    read();
  }

  /// After a gather completed: device memory copies the flags to the host (waits for the stream).
  void read() {
    if (memory_->is_device())
      memory_->to_host(host_.data(), all_, sizeof(std::int32_t) * static_cast<std::size_t>(world_size_));
  }

  /// Rank r's flag as last read. Precondition: 0 <= r < world size.
  std::int32_t operator[](int r) const noexcept {
    return (memory_->is_device() ? host_.data() : all_)[static_cast<std::size_t>(r)];
  }

  /// The number of ranks whose flag is non-zero, and the lowest of them (-1 when none).
  std::pair<int, int> count() const noexcept {
    int active = 0, first = -1;
    for (int r = 0; r < world_size_; ++r)
      if ((*this)[r] != 0) {
        ++active;
        if (first < 0) first = r;
      }
    return {active, first};
  }

  /// Hands the memory over (the reducer retires it after an abort, when peers may still read it).
  bucket_storage release() noexcept {
    all_ = mine_ = nullptr;
    return std::move(storage_);
  }

 private:
  const bucket_memory* memory_ = nullptr;
  int world_size_ = 0;
  bucket_storage storage_;
  std::int32_t* all_ = nullptr;
  std::int32_t* mine_ = nullptr;
  std::vector<std::int32_t> host_;  ///< device memory: the gathered flags, read back
};

}  // namespace ringzero::ddp::detail
