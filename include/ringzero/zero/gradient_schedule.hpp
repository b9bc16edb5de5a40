#pragma once
/// @file
/// `zero::detail::gradient_schedule`: the bookkeeping of gradient reduction per gather unit —
/// when a gradient is final, when a unit's gradient bucket is filled, when its reduction is
/// launched, and when a bucket is reclaimed for reuse — separated from memory and collectives.
/// The manual: docs/zero.md, "Header notes", `ringzero/zero/gradient_schedule.hpp`.

#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

namespace ringzero::zero::detail {

/// See the file comment. Hooks: `fill(u)`, `launch(u)`, `complete(u)`.
class gradient_schedule {
 public:
  /// Where a unit stands in the current micro-batch.
  enum class phase : unsigned char { idle, filling, launched, completed };

  /// `storage_unit[s]`: the unit owning trainable storage s (storages numbered 0..S-1).
  /// `uses[u]`: the distinct trainable storages unit u uses (its own and those of its aliases).
  /// `max_inflight` >= 1.
  gradient_schedule(std::size_t units, std::vector<std::size_t> storage_unit,
                    std::vector<std::vector<std::size_t>> uses, int max_inflight)
      : storage_unit_(std::move(storage_unit)),
        uses_(std::move(uses)),
        has_gradients_(units, false),
        phase_(units, phase::idle),
        unit_ready_(units, false),
        pending_storages_(units, 0),
        owned_(units, 0),
        users_(storage_unit_.size(), 0),
        users_left_(storage_unit_.size(), 0),
        storage_final_(storage_unit_.size(), false),
        max_inflight_(max_inflight < 1 ? 1 : static_cast<std::size_t>(max_inflight)) {
    for (std::size_t s = 0; s < storage_unit_.size(); ++s) {
      has_gradients_[storage_unit_[s]] = true;
      owned_[storage_unit_[s]] += 1;
    }
    for (const auto& list : uses_)
      for (std::size_t s : list) users_[s] += 1;
    for (std::size_t u = units; u-- > 0;)
      if (has_gradients_[u]) order_.push_back(u);
    reset();
  }

  /// The phase of unit u.
  phase state(std::size_t u) const noexcept { return phase_[u]; }
  /// True when unit u owns trainable storage.
  bool has_gradients(std::size_t u) const noexcept { return has_gradients_[u]; }
  /// True when storage s's gradient is final in this micro-batch.
  bool storage_final(std::size_t s) const noexcept { return storage_final_[s]; }
  /// Buckets allocated so far (never shrinks).
  std::size_t buckets() const noexcept { return allocated_; }
  /// The launch order (unit indices).
  const std::vector<std::size_t>& order() const noexcept { return order_; }

  /// Gives unit u (with gradients, phase idle or filling) a bucket; no-op when it has one.
  template <class Hooks>
  void acquire(std::size_t u, Hooks& hooks) {
    if (phase_[u] == phase::filling) return;
    if (free_ == 0 && inflight_.size() >= max_inflight_) complete_oldest(hooks);
    hooks.fill(u);  // first: a fill that throws (no memory for a bucket) leaves u as it was
    if (free_ > 0)
      --free_;
    else
      ++allocated_;
    phase_[u] = phase::filling;
  }

  /// Storage s's gradient is final. Returns false (and changes nothing) when it already was.
  template <class Hooks>
  bool storage_ready(std::size_t s, Hooks& hooks) {
    if (storage_final_[s]) return false;
    storage_final_[s] = true;
    const std::size_t u = storage_unit_[s];
    if (--pending_storages_[u] == 0) unit_is_ready(u, hooks);
    return true;
  }

  /// Unit u finished backward: every storage whose users have all finished becomes final.
  template <class Hooks>
  void unit_done(std::size_t u, Hooks& hooks) {
    for (std::size_t s : uses_[u]) {
      if (users_left_[s] > 0) users_left_[s] -= 1;
      if (users_left_[s] == 0) (void)storage_ready(s, hooks);
    }
  }

  /// Launches the remaining units in order and completes every reduction; resets for the next
  /// micro-batch.
  template <class Hooks>
  void finish(Hooks& hooks) {
    while (next_ < order_.size()) launch(order_[next_++], hooks);
    while (!inflight_.empty()) complete_oldest(hooks);
    reset();
  }

 private:
  void reset() {
    for (std::size_t u = 0; u < phase_.size(); ++u) {
      phase_[u] = phase::idle;
      unit_ready_[u] = false;
      pending_storages_[u] = owned_[u];
    }
    for (std::size_t s = 0; s < storage_unit_.size(); ++s) {
      users_left_[s] = users_[s];
      storage_final_[s] = false;
    }
    next_ = 0;
  }

  template <class Hooks>
  void unit_is_ready(std::size_t u, Hooks& hooks) {
    unit_ready_[u] = true;
    while (next_ < order_.size() && unit_ready_[order_[next_]]) launch(order_[next_++], hooks);
  }

  template <class Hooks>
  void launch(std::size_t u, Hooks& hooks) {
    if (phase_[u] != phase::filling) acquire(u, hooks);
    phase_[u] = phase::launched;
    inflight_.push_back(u);
    hooks.launch(u);
  }

  template <class Hooks>
  void complete_oldest(Hooks& hooks) {
    const std::size_t u = inflight_.front();
    inflight_.pop_front();
    phase_[u] = phase::completed;
    ++free_;
    hooks.complete(u);
  }

  std::vector<std::size_t> storage_unit_;
  std::vector<std::vector<std::size_t>> uses_;
  std::vector<bool> has_gradients_;
  std::vector<phase> phase_;
  std::vector<bool> unit_ready_;
  std::vector<std::size_t> pending_storages_;
  std::vector<std::size_t> owned_;
  std::vector<std::size_t> users_;
  std::vector<std::size_t> users_left_;
  std::vector<bool> storage_final_;
  std::vector<std::size_t> order_;
  std::deque<std::size_t> inflight_;
  std::size_t next_ = 0;
  std::size_t free_ = 0;
  std::size_t allocated_ = 0;
  std::size_t max_inflight_;
};

/// Hooks that do nothing (the planner's simulation).
struct null_gradient_hooks {
  void fill(std::size_t) noexcept {}
  void launch(std::size_t) noexcept {}
  void complete(std::size_t) noexcept {}
};

}  // namespace ringzero::zero::detail
