#pragma once
/// @file
/// `memory_counter`: what one owner (a `zero::sharded_model`, a DDP reducer) has allocated, per
/// memory space: the bytes held now, the most held at once since the counter started (or since
/// `reset_peak`), and the number of allocations. Every `memory_buffer` allocated with a counter
/// adds its size there and takes it off when freed, so the numbers are what was allocated, not
/// what the owner believes it holds. Bytes are the sizes asked for (an allocator's rounding and
/// alignment padding are not counted). A counter made with a parent also adds to and removes
/// from the parent, so an owner can count by what asked for the memory (one counter per purpose)
/// and in total (the parent, whose peak is the peak of the sum).
/// Thread safety: all members may be called from any thread at once (relaxed atomics; the peak
/// is exact: the maximum of `current` over every allocation's addition). A counter must
/// outlive the buffers allocated with it.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "ringzero/primitive/memory_space_kind.hpp"

namespace ringzero::primitive {

/// One memory space's numbers (bytes, bytes, count).
struct memory_usage {
  std::uint64_t current = 0;      ///< bytes held now
  std::uint64_t peak = 0;         ///< the most bytes held at once
  std::uint64_t allocations = 0;  ///< allocations made (freed ones included)
};

/// See the file comment.
class memory_counter {
 public:
  memory_counter() = default;
  /// A counter whose additions and removals also go to `parent` (which must outlive it).
  explicit memory_counter(memory_counter* parent) noexcept : parent_(parent) {}
  memory_counter(const memory_counter&) = delete;
  memory_counter& operator=(const memory_counter&) = delete;

  /// `bytes` more held in `space`.
  void add(memory_space space, std::uint64_t bytes) noexcept {
    slot& s = slots_[index(space)];
    const std::uint64_t now = s.current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    s.allocations.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t peak = s.peak.load(std::memory_order_relaxed);
    while (now > peak && !s.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {}
    if (parent_ != nullptr) parent_->add(space, bytes);
  }
  /// `bytes` fewer held in `space` (a buffer added with `add` was freed).
  void remove(memory_space space, std::uint64_t bytes) noexcept {
    slots_[index(space)].current.fetch_sub(bytes, std::memory_order_relaxed);
    if (parent_ != nullptr) parent_->remove(space, bytes);
  }
  /// The numbers of `space`.
  memory_usage usage(memory_space space) const noexcept {
    const slot& s = slots_[index(space)];
    return {s.current.load(std::memory_order_relaxed), s.peak.load(std::memory_order_relaxed),
            s.allocations.load(std::memory_order_relaxed)};
  }
  /// Starts the peaks again from what is held now.
  void reset_peak() noexcept {
    for (slot& s : slots_) s.peak.store(s.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }

 private:
  struct slot {
    std::atomic<std::uint64_t> current{0};
    std::atomic<std::uint64_t> peak{0};
    std::atomic<std::uint64_t> allocations{0};
  };
  static constexpr int spaces = 3;  // host, pinned_host, device
  static int index(memory_space space) noexcept {
    const int i = static_cast<int>(space);
    return i < spaces ? i : spaces - 1;
  }
  slot slots_[spaces];
  memory_counter* parent_ = nullptr;
};

/// A total `memory_counter` and `N` counters by purpose (purpose i: `of(i)`) whose additions
/// and removals also go to the total. Thread safety as `memory_counter`'s.
template <std::size_t N>
class memory_counters {
 public:
  memory_counters() {
    for (auto& c : parts_) c.emplace(&total_);
  }
  /// Every purpose's allocations together (the peak is the peak of the sum).
  memory_counter& total() noexcept { return total_; }
  /// Every purpose's allocations together (the peak is the peak of the sum).
  const memory_counter& total() const noexcept { return total_; }
  /// Purpose `i`'s counter. Precondition: i < N.
  memory_counter& of(std::size_t i) noexcept { return *parts_[i]; }
  /// Purpose `i`'s counter. Precondition: i < N.
  const memory_counter& of(std::size_t i) const noexcept { return *parts_[i]; }
  /// Starts every peak (the total's and each purpose's) again from what is held now.
  void reset_peak() noexcept {
    total_.reset_peak();
    for (auto& c : parts_) c->reset_peak();
  }

 private:
  memory_counter total_;
  std::optional<memory_counter> parts_[N];
};

}  // namespace ringzero::primitive
