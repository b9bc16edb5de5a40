#pragma once
/// @file
/// How a rank waits for another: spin briefly, then yield, then sleep with a growing interval,
/// checking a failure condition and a deadline all along. Used by every backend that polls.
///
/// Spinning keeps small collectives in the microsecond range when every rank has a core; when
/// there are more ranks than cores (`oversubscribed`), spinning only steals time from the rank
/// being waited for, so the waiter yields at once.

#include <atomic>
#include <chrono>
#include <thread>

#include "ringzero/core/config.hpp"
#include "ringzero/core/status.hpp"

#if RINGZERO_X86_64
#include <immintrin.h>
#endif

namespace ringzero::detail {

/// One pause of a spin loop (x86 `pause`; a compiler barrier elsewhere).
inline void cpu_relax() noexcept {
#if RINGZERO_X86_64
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

/// Tuning of `wait_until`.
struct wait_policy {
  unsigned spin_iterations = 2000;   ///< pauses before the first yield (0 when oversubscribed)
  unsigned yield_iterations = 20000; ///< yields before the first sleep
  std::chrono::microseconds first_sleep{20};  ///< first sleep; doubles up to max_sleep
  std::chrono::microseconds max_sleep{1000};
};

/// Polls `ready()` until it returns true (then `status::ok`), `failed()` returns a status other
/// than ok (then that status), or `deadline` passes (then `status::timeout`). `ready` is checked
/// before `failed`, so an event that happened before a failure is still seen.
/// `Ready` is `bool()`, `Failed` is `status()`; both must be cheap and thread-safe.
template <class Ready, class Failed>
[[nodiscard]] status wait_until(Ready&& ready, Failed&& failed, std::chrono::steady_clock::time_point deadline,
                                bool oversubscribed, const wait_policy& policy = {}) {
  if (ready()) return status::ok;
  const unsigned spins = oversubscribed ? 0u : policy.spin_iterations;
  for (unsigned i = 0; i < spins; ++i) {
    cpu_relax();
    if (ready()) return status::ok;
  }
  auto sleep = policy.first_sleep;
  for (unsigned i = 0;; ++i) {
    if (ready()) return status::ok;
    if ((i & 15u) == 0) {
      if (status s = failed(); s != status::ok) return ready() ? status::ok : s;
      if (std::chrono::steady_clock::now() >= deadline) return ready() ? status::ok : status::timeout;
    }
    if (i < policy.yield_iterations) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      if (sleep < policy.max_sleep) sleep *= 2;
    }
  }
}

}  // namespace ringzero::detail
