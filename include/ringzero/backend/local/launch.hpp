#pragma once
/// @file
/// `local::launch(world_size, fn)`: runs `fn(communicator&)` on `world_size` threads, one rank
/// each, and returns when all have finished. The embedded default of ringzero: tests, examples
/// and benchmarks need no external service.
///
/// Failure handling: when a rank's `fn` throws, the world is aborted at once (every rank still
/// waiting in a collective fails with errc::aborted naming the first failure, instead of hanging),
/// and after all threads are joined `launch` rethrows the exception of the lowest failing rank.
/// A rank whose `fn` returns while peers still wait for it makes them fail with errc::peer_exited.

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ringzero/backend/local/communicator.hpp"
#include "ringzero/backend/local/world.hpp"
#include "ringzero/core/config.hpp"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace ringzero::local {

/// Options of `launch`.
struct launch_options {
  /// Pin rank r's thread to the r-th allowed processor (modulo their number). Unset: RINGZERO_PIN.
  std::optional<bool> pin_threads;
  /// Timeout of every rank's communicator. Unset: RINGZERO_TIMEOUT, else 300 s.
  std::optional<std::chrono::duration<double>> timeout;
};

namespace detail {

/// Pins the calling thread to the `index`-th processor of the process's affinity mask (modulo
/// their count). Returns false when pinning is not possible here.
inline bool pin_current_thread(int index) noexcept {
#if defined(__linux__)
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  const int count = CPU_COUNT(&allowed);
  if (count <= 0) return false;
  int want = index % count;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (want-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
    }
  }
  return false;
#else
  (void)index;
  return false;
#endif
}

inline std::string exception_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) { return x.what(); } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace detail

namespace detail {

/// The body of `launch` for any rank type `Comm` of a local world: `make(comm, world, rank)`
/// emplaces rank `rank`'s communicator into the `std::optional<Comm>` `comm`; then `fn(*comm)`
/// runs on the rank's thread. Failure handling as described in the file comment.
template <class Comm, class Make, class F>
void run_world(int world_size, const launch_options& options, Make&& make, F&& fn, const char* who) {
  if (world_size < 1)
    throw error(errc::invalid_argument,
                std::string(who) + ": world size must be at least 1, got " + std::to_string(world_size));
  const bool pin = options.pin_threads ? *options.pin_threads : env_pin_threads();
  const auto timeout = options.timeout ? *options.timeout : env_timeout();
  world w(world_size);
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(world_size));
  auto body = [&](int r) {
    if (pin) (void)pin_current_thread(r);
    std::exception_ptr failure;
    {
      std::optional<Comm> comm;
      try {
        make(comm, w, r);
        comm->set_timeout(timeout);
        fn(*comm);
      } catch (...) {
        failure = std::current_exception();
        w.abort("rank " + std::to_string(r) + " failed: " + exception_text(failure));
      }
      // The communicator's destructor finishes its queued asynchronous work before the rank
      // is marked as gone; after an abort that work fails fast instead of waiting.
    }
    w.mark_exited(r, failure != nullptr, failure ? exception_text(failure) : std::string());
    failures[static_cast<std::size_t>(r)] = failure;
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  try {
    for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  } catch (const std::system_error& e) {
    // Could not start every rank: abort the ones already running, join them, report.
    w.abort(std::string(who) + " could not start all ranks: " + e.what());
    for (int r = static_cast<int>(threads.size()); r < world_size; ++r) w.mark_exited(r, true, "never started");
    for (auto& t : threads) t.join();
    throw error(errc::backend_failure, std::string(who) + " started only " + std::to_string(threads.size()) + " of " +
                                           std::to_string(world_size) + " rank threads: " + e.what());
  }
  for (auto& t : threads) t.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
}

}  // namespace detail

namespace detail {

/// A non-owning reference to a rank's function `void(local::communicator&)`: what `launch`
/// hands to the compiled core, so the thread launch is compiled once, not once per callable.
/// The referenced callable must outlive the reference.
class rank_function {
 public:
  template <class F>
  explicit rank_function(F& fn) noexcept
      : target_(static_cast<void*>(std::addressof(fn))),
        call_([](void* target, communicator& comm) { (*static_cast<F*>(target))(comm); }) {}

  /// Calls the referenced function with `comm`; rethrows what it throws.
  void operator()(communicator& comm) const { call_(target_, comm); }

 private:
  void* target_;
  void (*call_)(void*, communicator&);
};

/// The body of `launch` (inline when header-only, compiled once in <ringzero/impl/src.hpp>
/// under RINGZERO_SEPARATE_COMPILATION).
RINGZERO_DECL void launch_threads(int world_size, rank_function fn, const launch_options& options);

#if RINGZERO_DEFINE_COMPILED_CORE
RINGZERO_DECL void launch_threads(int world_size, rank_function fn, const launch_options& options) {
  run_world<communicator>(
      world_size, options, [](std::optional<communicator>& comm, world& w, int r) { comm.emplace(w, r); }, fn,
      "local::launch");
}
#endif

}  // namespace detail

/// Runs `fn(ringzero::local::communicator&)` on `world_size` new threads (ranks 0..world_size-1)
/// and waits for all of them. `fn` must be callable concurrently from all threads.
/// Throws errc::invalid_argument when world_size < 1 or an environment variable is malformed;
/// rethrows the exception of the lowest rank whose `fn` threw.
template <class F>
void launch(int world_size, F&& fn, const launch_options& options = {}) {
  auto call = [&fn](communicator& comm) { fn(comm); };
  detail::launch_threads(world_size, detail::rank_function(call), options);
}

}  // namespace ringzero::local
