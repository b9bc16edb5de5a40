#pragma once
/// @file
/// `nccl::detail::work_events`: what the NCCL communicator's watchdog watches. After each
/// collective (and each point-to-point transfer issued outside one) the communicator records a
/// CUDA event on its stream; the watchdog's tick (`overdue`) retires the events that completed,
/// oldest first, and reports the first piece of work whose device work failed or that has run
/// longer than the timeout, which makes the communicator abort (NCCL has no timeout of its own;
/// PyTorch's ProcessGroupNCCL watchdog works the same way). Events are reused. Thread
/// semantics: `record` on the rank's thread, `overdue` on the watchdog thread, `release` at
/// teardown; one mutex orders them. Requires the CUDA runtime.

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"

namespace ringzero::nccl::detail {

/// See the file comment.
class work_events {
 public:
  /// Records an event on `stream` after collective #`sequence` of kind `kind` (0 for a transfer
  /// outside any collective). Throws ringzero::error when CUDA cannot create or record it.
  void record(collective_kind kind, std::uint64_t sequence, cudaStream_t stream) {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      }
    }
    if (e == nullptr)
      primitive::cudart::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t r = cudaEventRecord(e, stream);
    if (r != cudaSuccess) {
      (void)cudaEventDestroy(e);
      primitive::cudart::check(r, "cudaEventRecord");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(item{e, kind, sequence, std::chrono::steady_clock::now()});
  }

  /// Retires the completed work, oldest first; returns why the oldest unfinished work is a
  /// failure (its device work reported a CUDA error: that error's errc; it has run longer than
  /// `timeout`: errc::timeout), or std::nullopt when nothing is wrong.
  std::optional<std::pair<errc, std::string>> overdue(std::chrono::duration<double> timeout) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!pending_.empty()) {
      item& w = pending_.front();
      const cudaError_t e = cudaEventQuery(w.event);
      if (e == cudaSuccess) {
        free_.push_back(w.event);
        pending_.pop_front();
        continue;
      }
      (void)cudaGetLastError();
      if (e != cudaErrorNotReady)
        return std::pair{primitive::cudart::errc_of(e),
                         "device work of " + describe(w) + " failed: " + primitive::cudart::error_text(e)};
      if (std::chrono::steady_clock::now() - w.issued > timeout)
        return std::pair{errc::timeout, describe(w) + " did not complete within " +
                                            ringzero::detail::seconds_text(timeout) +
                                            " s (NCCL has no timeout of its own: a rank probably never called it, "
                                            "or died)"};
      return std::nullopt;
    }
    return std::nullopt;
  }

  /// Destroys every event (teardown, once no work will be recorded or watched).
  void release() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& w : pending_) (void)cudaEventDestroy(w.event);
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
    pending_.clear();
    free_.clear();
  }

 private:
  struct item {
    cudaEvent_t event;
    collective_kind kind;
    std::uint64_t sequence;
    std::chrono::steady_clock::time_point issued;
  };

  static std::string describe(const item& w) { return ringzero::detail::operation_name(w.kind, w.sequence); }

  std::mutex mutex_;
  std::deque<item> pending_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace ringzero::nccl::detail
