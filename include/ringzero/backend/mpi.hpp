#pragma once
/// @file
/// The MPI backend (opt-in: needs an MPI library; the `ringzero-mpi` Meson dependency, or
/// RINGZERO_HAS_MPI=1 with MPI's compile and link flags): `mpi::environment` (MPI_Init_thread /
/// MPI_Finalize), `mpi::communicator` (a ringzero communicator over an MPI communicator, with
/// `split`) and its options. Include it together with <ringzero/ringzero.hpp>.
///
/// Quick start (run with `mpirun -np 4 ./program`):
/// @code
///   #include <ringzero/ringzero.hpp>
///   #include <ringzero/backend/mpi.hpp>
///   int main(int argc, char** argv) {
///     ringzero::mpi::environment env(argc, argv);
///     ringzero::mpi::communicator comm;  // over MPI_COMM_WORLD
///     std::vector<float> grad(1000, float(comm.rank()));
///     ringzero::all_reduce(comm, std::span<float>(grad), ringzero::reduce_kind::avg);
///   }
/// @endcode

#include "ringzero/backend/mpi/communicator.hpp"
#include "ringzero/backend/mpi/datatype.hpp"
#include "ringzero/backend/mpi/environment.hpp"
#include "ringzero/backend/mpi/options.hpp"
