// backend/progress.hpp: the progress thread runs on the process's CPUs, not on the core its
// owning rank thread is pinned to (local::launch pins rank r to core r by default in the examples).
#include <doctest/doctest.h>

#include <thread>

#include "ringzero/backend/local/launch.hpp"
#include "ringzero/backend/progress.hpp"

#if defined(__linux__)
#include <sched.h>
#include <unistd.h>

TEST_CASE("progress thread: created by a pinned thread, it gets the process's affinity mask") {
  cpu_set_t process;
  CPU_ZERO(&process);
  REQUIRE(sched_getaffinity(getpid(), sizeof process, &process) == 0);
  const int process_cpus = CPU_COUNT(&process);
  if (process_cpus < 2) {
    MESSAGE("the process may run on " << process_cpus << " CPU only: nothing to check");
    return;
  }
  for (int core = 0; core < 2; ++core) {
    CAPTURE(core);
    cpu_set_t owner{}, progress{};
    bool owner_pinned = false, task_failed = true;
    std::thread owner_thread([&] {
      owner_pinned = ringzero::local::detail::pin_current_thread(core);
      CPU_ZERO(&owner);
      (void)sched_getaffinity(0, sizeof owner, &owner);
      ringzero::detail::progress_engine engine;
      auto state = engine.submit([&] {
        CPU_ZERO(&progress);
        (void)sched_getaffinity(0, sizeof progress, &progress);
      });
      state->wait();
      task_failed = state->failure != nullptr;
    });
    owner_thread.join();
    REQUIRE(owner_pinned);
    REQUIRE_FALSE(task_failed);
    CHECK(CPU_COUNT(&owner) == 1);
    CHECK(CPU_EQUAL(&progress, &process));
    CHECK(CPU_COUNT(&progress) == process_cpus);
  }
}
#endif
