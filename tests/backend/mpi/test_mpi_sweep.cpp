// The backend-agnostic collective sweep (tests/backend/collective_sweep.hpp) under mpirun: the
// same cases and exact expectations as on the local backend, with ring, halving_doubling and
// native (MPI's own collectives).
#include <string>

#include "../collective_sweep.hpp"
#include "mpi_test.hpp"

TEST_CASE("collective sweep on the MPI backend (the body shared with the local backend)") {
  ringzero::mpi::communicator comm;
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  const bool large_for_all_dtypes = false;
#else
  const bool large_for_all_dtypes = true;
#endif
  const auto failures = ringzero_test::run_sweep(comm, large_for_all_dtypes);
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}
