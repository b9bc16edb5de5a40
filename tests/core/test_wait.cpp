// core/wait.hpp on a shared core: a doorbell records where it was rung; a thread moves off a
// processor it may leave (its affinity restored afterwards) and stays where it is when pinned;
// a waiter that shares the processor of the rank it waits for moves away instead of spinning
// there. Needs at least two allowed processors (else those checks are skipped, saying so).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <pthread.h>
#include <sched.h>

#include "ringzero/core/wait.hpp"

using namespace ringzero;
using namespace std::chrono_literals;

namespace {

cpu_set_t wait_test_affinity() {
  cpu_set_t s;
  CPU_ZERO(&s);
  REQUIRE(sched_getaffinity(0, sizeof s, &s) == 0);
  return s;
}

bool wait_test_pin(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0;
}

/// Two allowed processors, or -1s when the process may use only one.
std::pair<int, int> wait_test_two_cpus() {
  const cpu_set_t allowed = wait_test_affinity();
  int first = -1, second = -1;
  for (int c = 0; c < CPU_SETSIZE && second < 0; ++c)
    if (CPU_ISSET(c, &allowed)) (first < 0 ? first : second) = c;
  return {first, second};
}

}  // namespace

TEST_CASE("a doorbell records the processor of its last ring") {
  detail::doorbell bell;
  CHECK(bell.cpu.load() == -1);
  const auto before = bell.epoch.load();
  bell.ring();
  CHECK(bell.epoch.load() == before + 1);
  CHECK(bell.cpu.load() >= 0);
  const auto [a, b] = wait_test_two_cpus();
  if (b < 0) return;
  std::thread([&, a = a] {
    REQUIRE(wait_test_pin(a));
    bell.ring();
  }).join();
  CHECK(bell.cpu.load() == a);
}

TEST_CASE("move_off_cpu leaves the processor and restores the affinity; a pinned thread stays") {
  const auto [a, b] = wait_test_two_cpus();
  if (b < 0) {
    MESSAGE("one allowed processor: nothing to move to");
    return;
  }
  std::thread([a = a, b = b] {
    const cpu_set_t original = wait_test_affinity();
    // put the thread on `a`, with every processor allowed again
    REQUIRE(wait_test_pin(a));
    REQUIRE(sched_setaffinity(0, sizeof original, &original) == 0);
    const int here = detail::current_cpu();
    REQUIRE(here >= 0);
    CHECK(detail::move_off_cpu(here));
    CHECK(detail::current_cpu() != here);  // the kernel migrates before sched_setaffinity returns
    const cpu_set_t after = wait_test_affinity();
    CHECK(CPU_EQUAL(&after, &original));

    REQUIRE(wait_test_pin(b));
    CHECK(!detail::move_off_cpu(b));
    CHECK(detail::current_cpu() == b);
    const cpu_set_t pinned = wait_test_affinity();
    CHECK(CPU_COUNT(&pinned) == 1);
    CHECK(!detail::move_off_cpu(-1));
  }).join();
}

TEST_CASE("a waiter on the processor of the rank it waits for moves away and sees the event") {
  const auto [a, b] = wait_test_two_cpus();
  if (b < 0) {
    MESSAGE("one allowed processor: nothing to move to");
    return;
  }
  detail::doorbell bell;
  std::atomic<bool> go{false}, ready{false};
  std::thread peer([&, a = a] {  // pinned to `a`: it can run only where the waiter starts
    REQUIRE(wait_test_pin(a));
    bell.ring();  // records `a`
    while (!go.load()) std::this_thread::yield();
    std::this_thread::sleep_for(2ms);
    ready.store(true);
    bell.ring();
  });
  int moved_to = -1;
  std::thread waiter([&, a = a] {
    const cpu_set_t original = wait_test_affinity();
    REQUIRE(wait_test_pin(a));
    REQUIRE(sched_setaffinity(0, sizeof original, &original) == 0);
    detail::last_core_move() = {};
    while (bell.cpu.load() != a) std::this_thread::yield();
    go.store(true);
    const int start = detail::current_cpu();
    const status s = detail::wait_until([&] { return ready.load(); }, [] { return status::ok; },
                                        std::chrono::steady_clock::now() + 10s, false, &bell);
    CHECK(s == status::ok);
    moved_to = detail::current_cpu();
    if (start == a) CHECK(detail::last_core_move() != std::chrono::steady_clock::time_point{});  // it moved
  });
  waiter.join();
  peer.join();
  CHECK(ready.load());
  CHECK(moved_to >= 0);
}
