#pragma once
/// @file
/// `zero::detail::gather_schedule`: the bookkeeping of stage-3 parameter gathers — which gather
/// units currently hold a gathered (full) copy of their parameters, with reference counts,
/// prefetch and release — separated from the memory and the collectives.
/// The manual: docs/zero.md, "Header notes", `ringzero/zero/gather_schedule.hpp`.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace ringzero::zero::detail {

/// See the file comment. Hooks: `start(u)`, `wait(u)`, `free(u)`.
class gather_schedule {
 public:
  /// `borrowed[u]`: the units whose storage unit u uses (never u itself). `empty[u]`: unit u has
  /// nothing to gather (it is never held, but what it borrows is). `limit`: the most units held
  /// at once that `prefetch` may bring about (0: no bound; `plan_request::max_inflight_gathers`).
  gather_schedule(std::vector<std::vector<std::size_t>> borrowed, std::vector<bool> empty, std::size_t limit = 0)
      : borrowed_(std::move(borrowed)), empty_(std::move(empty)), state_(borrowed_.size()), limit_(limit) {}

  /// Number of units.
  std::size_t units() const noexcept { return state_.size(); }
  /// True when unit u holds a gathered copy (possibly still arriving).
  bool held(std::size_t u) const noexcept { return state_[u].held; }
  /// References on unit u.
  int references(std::size_t u) const noexcept { return state_[u].refs; }
  /// True when a `use(u)` has not yet been matched by `done(u)` (a kept unit is in use).
  bool in_use(std::size_t u) const noexcept { return state_[u].uses > 0; }
  /// True when `done(u, hooks, true)` kept u's references for the next `use(u)`.
  bool kept(std::size_t u) const noexcept { return state_[u].kept; }
  /// Units holding a gathered copy now.
  std::size_t held_count() const noexcept { return held_; }
  /// Largest `held_count()` seen so far.
  std::size_t peak() const noexcept { return peak_; }
  /// Prefetches skipped because they would have held more units than the limit.
  std::size_t skipped_prefetches() const noexcept { return skipped_; }

  /// Starts the gathers of u and its borrowed units that are not held and takes one reference
  /// on each. Call `wait_for(u)` before reading them.
  /// A unit kept by `done(u, hooks, true)` takes back the references it kept (nothing starts).
  /// When `hooks.start` throws, no reference is taken: what started before stays as a prefetch.
  template <class Hooks>
  void use(std::size_t u, Hooks& hooks) {
    if (state_[u].kept) {
      state_[u].kept = false;
      return;
    }
    for_each_needed(u, [&](std::size_t w) {
      if (state_[w].held) return;
      start_if_needed(w, hooks);
      state_[w].prefetched = true;
    });
    state_[u].uses += 1;
    for_each_needed(u, [&](std::size_t w) {
      state_[w].refs += 1;
      state_[w].prefetched = false;
    });
  }

  /// Waits until u and its borrowed units have arrived.
  template <class Hooks>
  void wait_for(std::size_t u, Hooks& hooks) {
    for_each_needed(u, [&](std::size_t w) { hooks.wait(w); });
  }

  /// Starts the gathers of v and its borrowed units that are not held, without references;
  /// nothing when that would hold more units than the limit (all or none of them start).
  template <class Hooks>
  void prefetch(std::size_t v, Hooks& hooks) {
    if (limit_ != 0) {
      std::size_t starting = 0;
      for_each_needed(v, [&](std::size_t w) { starting += state_[w].held ? 0 : 1; });
      if (starting != 0 && held_ + starting > limit_) {
        ++skipped_;
        return;
      }
    }
    for_each_needed(v, [&](std::size_t w) {
      if (state_[w].held) return;
      start_if_needed(w, hooks);
      state_[w].prefetched = true;
    });
  }

  /// Drops the references `use(u)` took; frees units left without references or prefetch.
  /// `keep`: when this is u's only open use, keeps its references instead, for the next
  /// `use(u)` (a unit not resharded after its forward; `release_stale` and `release_all` drop
  /// them); a nested use (a recomputation inside u's backward) is dropped as without `keep`.
  /// Returns false (and changes nothing) when u holds no reference or holds only kept ones.
  template <class Hooks>
  bool done(std::size_t u, Hooks& hooks, bool keep = false) {
    if (!in_use(u) || state_[u].kept) return false;
    if (keep && state_[u].uses == 1) {
      state_[u].kept = true;
      return true;
    }
    drop(u, hooks);
    return true;
  }

  /// What a pass that no backward followed left (an evaluation, a pass stopped early): drops
  /// the references of every kept unit and the prefetches no use took, freeing units left
  /// without references. Units in use keep what they hold.
  template <class Hooks>
  void release_stale(Hooks& hooks) {
    for (std::size_t u = 0; u < state_.size(); ++u)
      if (state_[u].kept) {
        state_[u].kept = false;
        drop(u, hooks);
      }
    for (std::size_t w = 0; w < state_.size(); ++w)
      if (state_[w].prefetched && state_[w].refs == 0) {
        state_[w].prefetched = false;
        free(w, hooks);
      }
  }

  /// Frees every held unit and clears every reference (end of a micro-batch).
  template <class Hooks>
  void release_all(Hooks& hooks) {
    for (std::size_t w = 0; w < state_.size(); ++w) {
      state_[w].refs = 0;
      state_[w].uses = 0;
      state_[w].prefetched = false;
      state_[w].kept = false;
      if (state_[w].held) free(w, hooks);
    }
  }

 private:
  struct unit_state {
    bool held = false;
    bool prefetched = false;
    bool kept = false;  ///< done(u, hooks, true) left this unit's use for the next use(u)
    int refs = 0;       ///< uses of this unit's own gather (its own use and borrowers' uses)
    int uses = 0;       ///< use(u) calls not yet matched by done(u)
  };

  template <class Hooks>
  void drop(std::size_t u, Hooks& hooks) {
    state_[u].uses -= 1;
    for_each_needed(u, [&](std::size_t w) {
      state_[w].refs -= 1;
      if (state_[w].refs == 0 && !state_[w].prefetched) free(w, hooks);
    });
  }

  template <class F>
  void for_each_needed(std::size_t u, F&& f) {
    if (!empty_[u]) f(u);
    for (std::size_t w : borrowed_[u])
      if (!empty_[w]) f(w);
  }

  template <class Hooks>
  void start_if_needed(std::size_t w, Hooks& hooks) {
    if (state_[w].held) return;
    hooks.start(w);  // first: a start that throws (no memory for a slot) leaves w as it was
    state_[w].held = true;
    ++held_;
    peak_ = std::max(peak_, held_);
  }

  template <class Hooks>
  void free(std::size_t w, Hooks& hooks) {
    state_[w].held = false;
    --held_;
    hooks.free(w);
  }

  std::vector<std::vector<std::size_t>> borrowed_;
  std::vector<bool> empty_;
  std::vector<unit_state> state_;
  std::size_t held_ = 0;
  std::size_t peak_ = 0;
  std::size_t limit_ = 0;    ///< most units held that a prefetch may bring about (0: no bound)
  std::size_t skipped_ = 0;  ///< prefetches the limit skipped
};

/// Hooks that do nothing (the planner's simulation).
struct null_gather_hooks {
  void start(std::size_t) noexcept {}
  void wait(std::size_t) noexcept {}
  void free(std::size_t) noexcept {}
};

}  // namespace ringzero::zero::detail
