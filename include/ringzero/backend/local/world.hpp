#pragma once
/// @file
/// `local::world`: the state that the ranks of one local (thread) world share: per-rank
/// collective slots, one mailbox per ordered pair of ranks, the abort flag and each rank's exit.
///
/// Protocol. Collective n of a rank publishes its descriptor in its slot, then stores
/// `arrived = n + 1` (release); peers wait for it (acquire), read each other's descriptors and
/// buffers, and finally store `departed = n + 1`; nobody leaves collective n before every rank
/// departed, so slots and buffers are never reused while a peer still reads them.
/// A transfer from rank a to rank b goes through mailbox (a, b): the sender publishes pointer and
/// size and bumps `posted`; the receiver reads the sender's memory in place (zero copy) and bumps
/// `consumed`; the sender returns once `consumed` reached its message.
/// Thread safety: every member may be used concurrently by the world's rank threads.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/backend/descriptor.hpp"
#include "ringzero/core/config.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/wait.hpp"

#if defined(__linux__)
#include <sched.h>
#endif

namespace ringzero::local {

namespace detail {

/// One rank's collective state, on its own cache lines (only that rank writes it).
struct alignas(RINGZERO_CACHE_LINE) rank_slot {
  std::atomic<std::uint64_t> arrived{0};   ///< 1 + sequence of the last collective entered
  std::atomic<std::uint64_t> departed{0};  ///< 1 + sequence of the last collective left
  collective_descriptor desc;              ///< written before `arrived`, read by peers after it
};

/// The single-message channel from one rank to another.
/// The two signals are opaque to the host protocol: ranks whose buffers live in device memory
/// publish there the CUDA event that marks their data ready (sender) or read (receiver).
struct alignas(RINGZERO_CACHE_LINE) mailbox {
  std::atomic<std::uint64_t> posted{0};  ///< number of messages the sender has published
  const void* data = nullptr;            ///< the sender's buffer (valid until consumed)
  std::uint64_t bytes = 0;               ///< its size
  std::uint64_t tag = 0;                 ///< 1 + sequence of the collective it belongs to; 0: send/recv
  void* ready_signal = nullptr;          ///< sender's signal for the last posted message (device ranks)
  alignas(RINGZERO_CACHE_LINE) std::atomic<std::uint64_t> consumed{0};  ///< messages the receiver finished
  std::uint64_t expected = 0;       ///< bytes the receiver expected for the last consumed message
  bool tag_mismatch = false;        ///< the receiver expected another operation's message
  void* consumed_signal = nullptr;  ///< receiver's signal for the last consumed message (device ranks)
};

/// Number of processors this process may run on (at least 1).
inline int available_cpus() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace detail

/// Shared state of `size()` ranks that run as threads of this process.
/// Construct one, then one `local::communicator` per rank (or use `local::launch`).
class world {
 public:
  /// A world of `world_size` ranks. Throws errc::invalid_argument when world_size < 1.
  explicit world(int world_size) : n_(world_size) {
    if (world_size < 1)
      throw error(errc::invalid_argument, "local world size must be at least 1, got " + std::to_string(world_size));
    slots_ = std::make_unique<detail::rank_slot[]>(static_cast<std::size_t>(n_));
    boxes_ = std::make_unique<detail::mailbox[]>(static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_));
    bells_ = std::make_unique<ringzero::detail::doorbell[]>(static_cast<std::size_t>(n_));
    exit_state_ = std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(n_));
    for (int r = 0; r < n_; ++r) exit_state_[static_cast<std::size_t>(r)].store(0, std::memory_order_relaxed);
    exit_what_.resize(static_cast<std::size_t>(n_));
    oversubscribed_ = n_ > detail::available_cpus();
  }
  world(const world&) = delete;
  world& operator=(const world&) = delete;

  /// Number of ranks.
  int size() const noexcept { return n_; }

  /// True when there are more ranks than processors (waiters then yield instead of spinning).
  bool oversubscribed() const noexcept { return oversubscribed_; }

  /// True once any rank aborted the world (a timeout, a failed rank, or `abort`).
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  /// Why the world was aborted (the first reason given); empty when it was not.
  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return abort_reason_;
  }

  /// Aborts the world: every wait on every rank fails promptly with `code` (errc::aborted by
  /// default; a timeout passes errc::timeout so that every waiting rank reports a timeout) and
  /// `reason`. The first abort wins. Thread-safe, idempotent.
  void abort(const std::string& reason, errc code = errc::aborted) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!aborted_.load(std::memory_order_relaxed)) {
        abort_reason_ = reason;
        abort_code_ = code;
      }
    }
    aborted_.store(true, std::memory_order_release);
    for (int r = 0; r < n_; ++r) bell(r).ring();  // wake every blocked waiter
  }

  /// The code of the first abort (errc::aborted when the world was not aborted).
  errc abort_code() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return abort_code_;
  }

  /// Records that rank `r` left: its function returned (`failed` false) or threw (`what` says what).
  void mark_exited(int r, bool failed, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      exit_what_[static_cast<std::size_t>(r)] = what;
    }
    exit_state_[static_cast<std::size_t>(r)].store(failed ? 2 : 1, std::memory_order_release);
    bell(r).ring();
  }

  /// True once rank `r` left.
  bool exited(int r) const noexcept {
    return exit_state_[static_cast<std::size_t>(r)].load(std::memory_order_acquire) != 0;
  }

  /// "returned" or "threw: <what>" for a rank that left; empty otherwise.
  std::string exit_description(int r) const {
    const int s = exit_state_[static_cast<std::size_t>(r)].load(std::memory_order_acquire);
    if (s == 0) return {};
    std::lock_guard<std::mutex> lock(mutex_);
    if (s == 1) return "its function returned";
    return "it threw: " + exit_what_[static_cast<std::size_t>(r)];
  }

  /// Rank `r`'s doorbell: rung after each of its stores that peers wait for (internal).
  ringzero::detail::doorbell& bell(int r) noexcept { return bells_[static_cast<std::size_t>(r)]; }
  /// Rank `r`'s collective slot (internal).
  detail::rank_slot& slot(int r) noexcept { return slots_[static_cast<std::size_t>(r)]; }
  /// The mailbox from rank `from` to rank `to` (internal).
  detail::mailbox& box(int from, int to) noexcept {
    return boxes_[static_cast<std::size_t>(from) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(to)];
  }

 private:
  int n_;
  bool oversubscribed_ = false;
  std::unique_ptr<detail::rank_slot[]> slots_;
  std::unique_ptr<detail::mailbox[]> boxes_;
  std::unique_ptr<ringzero::detail::doorbell[]> bells_;
  std::unique_ptr<std::atomic<int>[]> exit_state_;
  std::vector<std::string> exit_what_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;
  std::string abort_reason_;
  errc abort_code_ = errc::aborted;
};

}  // namespace ringzero::local
