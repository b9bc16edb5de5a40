#pragma once
/// @file
/// The local backend on CUDA device memory (opt-in: needs the CUDA runtime, RINGZERO_HAS_CUDA):
/// `local::cuda_communicator` and `local::launch_cuda`. Collectives that move data also need one
/// .cu file of the program to include <ringzero/cuda.cuh>.

#include "ringzero/backend/local/cuda_communicator.hpp"
#include "ringzero/backend/local/cuda_launch.hpp"
