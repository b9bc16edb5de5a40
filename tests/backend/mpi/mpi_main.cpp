// The doctest runner of the MPI tests: initialises MPI (MPI_THREAD_MULTIPLE), runs the test
// cases on every rank in the same order, and keeps the output of ranks other than 0 to their
// failures. mpirun's exit status is non-zero when any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "ringzero/backend/mpi.hpp"

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
  return context.run();
}
