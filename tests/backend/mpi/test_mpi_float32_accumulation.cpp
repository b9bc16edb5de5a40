// float16 / bfloat16 sum, avg and premul_sum accumulate in float32 under mpirun (case C22 scaled
// to the world size, and inputs with exact float32 sums on ring, halving_doubling and native:
// MPI's own collectives run on the widened float32 copy). The same checks as on the local
// backend (tests/backend/float32_accumulation_checks.hpp), bit for bit.
#include <string>

#include "../float32_accumulation_checks.hpp"
#include "mpi_test.hpp"

TEST_CASE("C22: 16-bit reductions accumulate in float32 on the MPI backend (ring, halving_doubling, native)") {
  ringzero::mpi::communicator comm(MPI_COMM_WORLD);
  const ringzero_test::accumulation_report report = ringzero_test::run_float32_accumulation_checks(comm);
  for (const std::string& f : report.failures) FAIL_CHECK(f);
  CHECK(report.failures.empty());
  CHECK(report.checked > 0);
  // The inputs separate the two arithmetics from 3 ranks on (on 2, a sum of two 16-bit values
  // rounded once is all that per-hop rounding does either, and these scalars are 0.5 and 2).
  if (comm.world_size() >= 3) CHECK(report.rounding_differs > report.checked / 20);
}
