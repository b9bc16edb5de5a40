// The backend-agnostic collective sweep (tests/backend/collective_sweep.hpp) under mpirun: the
// same cases and exact expectations as on the local backend, with ring, halving_doubling and
// native (MPI's own collectives). RINGZERO_TEST_SLICE_BYTES (a test setting) makes transfers
// travel in slices of that many bytes, so that every collective runs its pipelined path.
#include <cstdlib>
#include <string>

#include "../collective_sweep.hpp"
#include "mpi_test.hpp"

TEST_CASE("collective sweep on the MPI backend (the body shared with the local backend)") {
  ringzero::mpi::communicator_options options;
  if (const char* slice = std::getenv("RINGZERO_TEST_SLICE_BYTES"))
    options.slice_bytes = std::strtoull(slice, nullptr, 10);
  ringzero::mpi::communicator comm(MPI_COMM_WORLD, options);
  INFO("slice bytes: " << comm.slice_bytes() << ", pipeline depth: " << comm.pipeline_depth());
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  const bool large_for_all_dtypes = false;
#else
  const bool large_for_all_dtypes = true;
#endif
  const auto failures = ringzero_test::run_sweep(comm, large_for_all_dtypes);
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}
