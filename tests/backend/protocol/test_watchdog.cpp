// backend/protocol/watchdog.hpp: the watchdog thread that MPI and NCCL share, without either:
// it calls its tick until stopped and never after, start and stop are idempotent (no restart
// after stop), and an armed deadline is reported as expired, with its context, only once it
// has passed and until it is disarmed.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "ringzero/backend/protocol/watchdog.hpp"

using namespace std::chrono_literals;
using ringzero::detail::watchdog;

namespace {

/// Waits (up to 60 s, a bound for loaded machines, not a measurement) until `done()`.
template <class F>
bool eventually(F&& done) {
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("watchdog: ticks until stopped, never after, and does not restart") {
  std::atomic<int> ticks{0};
  watchdog w;
  w.start(1ms, [&] { ticks.fetch_add(1); });
  w.start(1ms, [&] { ticks.fetch_add(1000); });  // already running: ignored
  REQUIRE(eventually([&] { return ticks.load() >= 3; }));
  w.stop();
  const int after_stop = ticks.load();
  CHECK(after_stop < 1000);
  w.start(1ms, [&] { ticks.fetch_add(1); });  // stopped: ignored
  std::this_thread::sleep_for(20ms);
  CHECK(ticks.load() == after_stop);
  w.stop();  // idempotent
}

TEST_CASE("watchdog: an armed deadline expires only once passed, with its context, until disarmed") {
  watchdog w;
  const void* context = nullptr;
  CHECK_FALSE(w.expired(context));
  const int a = 1, b = 2;
  w.arm(std::chrono::steady_clock::now() + 1h, &a);
  CHECK_FALSE(w.expired(context));
  CHECK(context == nullptr);
  w.arm(std::chrono::steady_clock::now() - 1ms, &b);
  REQUIRE(w.expired(context));
  CHECK(context == &b);
  w.disarm();
  context = nullptr;
  CHECK_FALSE(w.expired(context));
  CHECK(context == nullptr);
}

TEST_CASE("watchdog: the tick sees a deadline that passes while the thread runs") {
  std::atomic<const void*> seen{nullptr};
  watchdog w;
  w.start(1ms, [&] {
    const void* c = nullptr;
    if (w.expired(c)) seen.store(c);
  });
  const int call = 7;
  w.arm(std::chrono::steady_clock::now() + 5ms, &call);
  REQUIRE(eventually([&] { return seen.load() != nullptr; }));
  CHECK(seen.load() == &call);
  w.disarm();
  w.stop();
}
