#pragma once
/// @file
/// How a rank waits for another: spin briefly, yield briefly, then block on the other rank's
/// `doorbell` (a futex on Linux) until it rings, checking a failure condition and a deadline all
/// along. Used by every backend that polls shared state.
///
/// Spinning keeps small collectives in the microsecond range when every rank has a core; when
/// there are more ranks than cores (`oversubscribed`) spinning only steals time from the rank
/// being waited for, so the waiter skips it. Blocking matters when a rank waits long (a peer
/// still computing its backward pass, 13 ranks on 2 cores): the waiter then costs no CPU, and the
/// peer's doorbell wakes it within microseconds of the event.
///
/// A shared core: when the waited-for rank last rang its doorbell on the processor the waiter
/// now runs on, it cannot run while the waiter spins (the scheduler put both ranks on one core,
/// as Linux's wake-affine placement does when another thread keeps the other core busy). The
/// waiter then moves itself to another allowed processor (its affinity narrowed and restored
/// at once; at most once per millisecond), or, where it cannot, yields at once instead of
/// spinning. Measured in docs/performance.md ("A busy core").

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#include "ringzero/core/config.hpp"
#include "ringzero/core/status.hpp"

#if RINGZERO_X86_64 && !defined(__GNUC__)
#include <immintrin.h>  // _mm_pause; GCC and Clang use their builtin (immintrin.h costs ~0.3 s per file)
#endif
#if defined(__linux__)
#include <sched.h>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace ringzero::detail {

/// One pause of a spin loop (x86 `pause`; a compiler barrier elsewhere).
inline void cpu_relax() noexcept {
#if RINGZERO_X86_64 && defined(__GNUC__)
  __builtin_ia32_pause();
#elif RINGZERO_X86_64
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

/// The processor the calling thread runs on, or -1 where unknown (glibc reads it from the
/// thread's rseq area: a few nanoseconds).
inline int current_cpu() noexcept {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

/// Moves the calling thread off processor `cpu`: narrows its affinity to the other processors
/// it may use (the kernel migrates it before the call returns), then restores the affinity it
/// had, so that nothing the user set is lost. False (nothing changed) when the thread may run
/// only on `cpu` or the calls fail (e.g. a thread pinned by RINGZERO_PIN or the user).
inline bool move_off_cpu(int cpu) noexcept {
#if defined(__linux__)
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  if (!CPU_ISSET(cpu, &allowed) || CPU_COUNT(&allowed) < 2) return false;
  cpu_set_t others = allowed;
  CPU_CLR(cpu, &others);
  if (sched_setaffinity(0, sizeof others, &others) != 0) return false;
  (void)sched_setaffinity(0, sizeof allowed, &allowed);
  return true;
#else
  (void)cpu;
  return false;
#endif
}

/// A rank's doorbell: the rank rings it after every store that a peer may wait for; a waiter
/// blocks on it instead of polling. Cheap when nobody waits (one atomic add and one load).
/// Thread safety: all members may be used concurrently.
struct alignas(RINGZERO_CACHE_LINE) doorbell {
  std::atomic<std::uint32_t> epoch{0};    ///< incremented by every ring
  std::atomic<std::uint32_t> waiters{0};  ///< threads currently blocked (or about to block) on it
  std::atomic<int> cpu{-1};               ///< processor of the last ring (-1: unknown)

  /// Wakes every thread blocked on this doorbell. Call after the store being announced.
  void ring() noexcept {
    if (const int c = current_cpu(); cpu.load(std::memory_order_relaxed) != c) cpu.store(c, std::memory_order_relaxed);
    epoch.fetch_add(1, std::memory_order_seq_cst);
    if (waiters.load(std::memory_order_seq_cst) != 0) {
#if defined(__linux__)
      syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&epoch), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#endif
    }
  }

  /// Blocks until the epoch differs from `seen` or `limit` elapsed (spurious returns allowed).
  void block(std::uint32_t seen, std::chrono::microseconds limit) const noexcept {
#if defined(__linux__)
    timespec ts;
    ts.tv_sec = static_cast<time_t>(limit.count() / 1000000);
    ts.tv_nsec = static_cast<long>((limit.count() % 1000000) * 1000);
    syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&epoch), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
#else
    (void)seen;
    std::this_thread::sleep_for(std::min(limit, std::chrono::microseconds(200)));
#endif
  }
};

/// Tuning of `wait_until`.
struct wait_policy {
  std::chrono::microseconds spin{30};             ///< spinning before the first yield (none when oversubscribed)
  std::chrono::microseconds yield{100};           ///< yielding before blocking
  std::chrono::microseconds max_block{10000};     ///< longest single block (failures are re-checked after it)
  std::chrono::microseconds move_interval{1000};  ///< least time between two moves off a shared core
};

/// When the calling thread last moved off a shared core (`wait_until`).
inline std::chrono::steady_clock::time_point& last_core_move() noexcept {
  thread_local std::chrono::steady_clock::time_point at{};
  return at;
}

/// Polls `ready()` until it returns true (then `status::ok`), `failed()` returns a status other
/// than ok (then that status), or `deadline` passes (then `status::timeout`). `ready` is checked
/// before `failed`, so an event that happened before a failure is still seen. With a doorbell
/// (the waited-for rank's), the waiter blocks on it after spinning and yielding; the rank must
/// ring it after each store that can make `ready()` true, and failure paths must ring it too.
/// `Ready` is `bool()`, `Failed` is `status()`; both must be cheap and thread-safe.
template <class Ready, class Failed>
[[nodiscard]] status wait_until(Ready&& ready, Failed&& failed, std::chrono::steady_clock::time_point deadline,
                                bool oversubscribed, doorbell* bell = nullptr, const wait_policy& policy = {}) {
  if (ready()) return status::ok;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  bool spin = !oversubscribed;
  if (spin && bell != nullptr) {
    const int here = current_cpu();
    if (here >= 0 && bell->cpu.load(std::memory_order_relaxed) == here) {
      // The peer last rang on this processor: it cannot run while this thread spins here.
      auto& moved = last_core_move();
      spin = start - moved >= policy.move_interval && move_off_cpu(here);
      if (spin) moved = start;
    }
  }
  if (spin) {
    const auto spin_until = start + policy.spin;
    for (unsigned i = 1;; ++i) {
      cpu_relax();
      if (ready()) return status::ok;
      if ((i & 63u) == 0 && clock::now() >= spin_until) break;
    }
  }
  const auto yield_until = start + policy.spin + policy.yield;
  for (unsigned i = 0;; ++i) {
    if (ready()) return status::ok;
    if ((i & 15u) == 0) {
      if (status s = failed(); s != status::ok) return ready() ? status::ok : s;
      const auto now = clock::now();
      if (now >= deadline) return ready() ? status::ok : status::timeout;
      if (now >= yield_until) break;
    }
    std::this_thread::yield();
  }
  for (;;) {
    std::uint32_t seen = 0;
    if (bell) {
      bell->waiters.fetch_add(1, std::memory_order_seq_cst);
      seen = bell->epoch.load(std::memory_order_seq_cst);
    }
    if (ready()) {
      if (bell) bell->waiters.fetch_sub(1, std::memory_order_seq_cst);
      return status::ok;
    }
    if (status s = failed(); s != status::ok) {
      if (bell) bell->waiters.fetch_sub(1, std::memory_order_seq_cst);
      return ready() ? status::ok : s;
    }
    const auto now = clock::now();
    if (now >= deadline) {
      if (bell) bell->waiters.fetch_sub(1, std::memory_order_seq_cst);
      return ready() ? status::ok : status::timeout;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - now) + std::chrono::microseconds(1);
    const auto limit = left < policy.max_block ? left : policy.max_block;
    if (bell) {
      bell->block(seen, limit);
      bell->waiters.fetch_sub(1, std::memory_order_seq_cst);
    } else {
      std::this_thread::sleep_for(std::min(limit, std::chrono::microseconds(200)));
    }
  }
}

}  // namespace ringzero::detail
