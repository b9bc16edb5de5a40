#pragma once
/// @file
/// The CUDA umbrella header, for .cu files compiled by nvcc: every CUDA primitive
/// (`ringzero::primitive::device::reduce_into`, `cast`, `scale`, `divide`, `fill`, on a
/// `cudaStream_t`; their kernels are primitive/kernels/*.hpp, which CI runs on the host)
/// and their registration for the rest of the program (see primitive/device_primitives.hpp), and
/// the ZeRO step's kernels (zero/optimizer_kernels.cuh).
///
/// A program that runs ringzero's own algorithms (ring, halving_doubling) on CUDA device memory
/// — the local backend with `local::launch_cuda`, or the NCCL backend with an algorithm other
/// than `native` — compiles exactly one .cu file that includes this header; everything else
/// (collectives, backends, the trainer) may stay plain C++ compiled by the host compiler.
///
/// @code
///   // kernels.cu, compiled by nvcc: instantiates and registers the kernels
///   #include <ringzero/cuda.cuh>
/// @endcode

#if !defined(__CUDACC__)
#error "ringzero/cuda.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include "ringzero/primitive/device_primitives.cuh"
#include "ringzero/zero/optimizer_kernels.cuh"
