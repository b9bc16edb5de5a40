#pragma once
/// @file
/// The NCCL backend (opt-in: needs NCCL and the CUDA runtime, not nvcc): `nccl::communicator`
/// over an ncclComm_t and a CUDA stream, and the ways to create one (`init_all`, `launch`,
/// `init_with_file`, `init_with_mpi`, `init_from_env`, `communicator::split`).
/// Include it next to <ringzero/ringzero.hpp>; ringzero's own algorithms on device memory also
/// need one .cu file of the program to include <ringzero/cuda.cuh> (NCCL's native collectives
/// do not).
///
/// @code
///   #include <ringzero/ringzero.hpp>
///   #include <ringzero/backend/nccl.hpp>
///   auto comm = ringzero::nccl::init_from_env();   // torchrun: RANK, WORLD_SIZE, LOCAL_RANK
///   ringzero::all_reduce(*comm, grad, grad, n, ringzero::dtype::bfloat16, ringzero::reduce_kind::avg);
///   comm->synchronize();
/// @endcode

#include "ringzero/backend/nccl/communicator.hpp"
#include "ringzero/backend/nccl/id_file.hpp"
#include "ringzero/backend/nccl/init.hpp"
#include "ringzero/backend/nccl/types.hpp"
