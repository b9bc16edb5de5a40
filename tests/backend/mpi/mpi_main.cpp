// The doctest runner of the MPI tests: initialises MPI (MPI_THREAD_MULTIPLE), runs the test
// cases on every rank in the same order, and keeps the output of ranks other than 0 to their
// failures. mpirun's exit status is non-zero when any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "../../doctest_runner.hpp"
#include "ringzero/backend/mpi.hpp"

DOCTEST_REGISTER_LISTENER("ringzero_test_case_counter", 1, ringzero_test::test_case_counter);

int main(int argc, char** argv) {
  ringzero::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) {
    context.setOption("minimal", true);
    context.setOption("no-intro", true);
    context.setOption("no-version", true);
  }
  return ringzero_test::run_doctest(context);
}
