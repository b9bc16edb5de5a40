// A program that ends its MPI job on purpose, for expect_abort.sh: it checks that a timeout under
// the default failure_policy::abort_job (and a native collective past its deadline, and a process
// that dies) ends the whole job with a clear message instead of hanging.
//
// Usage: mpirun -np N test_mpi_abort MODE
//   timeout        ring all_reduce, check off; the last rank never arrives: abort_job, exit 124
//   check-timeout  the same with the check mode on: the message names the missing rank
//   native         MPI_Allreduce (algorithm native); the watchdog aborts the job, exit 124
//   exit           the last rank dies (_Exit(3)) before the collective; the MPI launcher ends the job
// The sleeping rank sleeps 60 s, far longer than the 2 s timeout: the job must end long before.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/backend/mpi.hpp"
#include "ringzero/ringzero.hpp"

int main(int argc, char** argv) {
  ringzero::mpi::environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  ringzero::mpi::communicator_options o;
  o.check = mode == "check-timeout";
  o.timeout = std::chrono::duration<double>(2.0);
  ringzero::mpi::communicator comm(MPI_COMM_WORLD, o);
  const int last = comm.world_size() - 1;
  ringzero::collective_options algo;
  algo.algo = mode == "native" ? ringzero::algorithm::native : ringzero::algorithm::ring;
  if (comm.rank() == last) {
    if (mode == "exit") std::_Exit(3);
    std::this_thread::sleep_for(std::chrono::seconds(60));
  }
  std::vector<float> v(1000, 1.0f);
  ringzero::all_reduce(comm, v.data(), v.data(), v.size(), ringzero::dtype::float32, ringzero::reduce_kind::sum, algo);
  std::printf("rank %d: the all_reduce returned, which it must not\n", comm.rank());
  return 0;
}
