#pragma once
/// @file
/// The MPI backend (opt-in: needs an MPI library; the `ringzero-mpi` Meson dependency, or
/// RINGZERO_HAS_MPI=1 with MPI's compile and link flags): `mpi::environment`, `mpi::communicator`
/// and its options. Include it together with <ringzero/ringzero.hpp>. Quick start and manual:
/// docs/mpi.md.

#include "ringzero/backend/mpi/communicator.hpp"
#include "ringzero/backend/mpi/datatype.hpp"
#include "ringzero/backend/mpi/environment.hpp"
#include "ringzero/backend/mpi/options.hpp"
