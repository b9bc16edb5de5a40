// The backend-agnostic collective sweep (collective_sweep.hpp) on the local backend, world
// sizes 1-4, with count 100003 for three dtypes (the full local sweep belongs to
// tests/collective). The same body runs under mpirun in tests/backend/mpi, so both backends
// meet the same expectations.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "collective_sweep.hpp"

TEST_CASE("collective sweep on the local backend (the body shared with the MPI backend)") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    std::mutex m;
    std::vector<std::string> failures;
    ringzero::local::launch(n, [&](ringzero::communicator& comm) {
      auto mine = ringzero_test::run_sweep(comm, false);
      std::lock_guard<std::mutex> lock(m);
      failures.insert(failures.end(), mine.begin(), mine.end());
    });
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}
