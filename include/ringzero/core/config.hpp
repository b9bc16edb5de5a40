#pragma once
/// @file
/// Compile-time configuration of ringzero: version, compiler and CUDA detection, the
/// optional backends, and the few macros the other headers share.
///
/// Backends that need an external library are opt-in: define `RINGZERO_HAS_MPI=1` or
/// `RINGZERO_HAS_NCCL=1` and include the backend's header. The Meson dependencies
/// `ringzero_mpi_dep` / `ringzero_nccl_dep` define them; the installed pkg-config file and CMake
/// package describe the headers only, so a trainer using them adds the define and the library
/// itself (the README shows how).
/// Every macro is `RINGZERO_`-prefixed.

// ringzero is C++20 (concepts, std::span, <bit>). g++ 12 and nvcc 12-13 default to C++17, where
// the first error would otherwise be an unknown `concept` somewhere in core/dtype.hpp.
#if !defined(__cplusplus) || __cplusplus < 202002L
#error \
    "ringzero needs C++20: compile with -std=c++20 (g++, clang++ and nvcc alike; CMake: CMAKE_CXX_STANDARD 20 and CMAKE_CUDA_STANDARD 20, and for nvcc 13 under CMake 3.25 also -std=c++20 in the CUDA compile options, see docs/gpu.md; Meson: cpp_std=c++20 and cuda_std=c++20)"
#endif

#define RINGZERO_VERSION_MAJOR 0
#define RINGZERO_VERSION_MINOR 1
#define RINGZERO_VERSION_PATCH 0
/// The version as one integer, major * 10000 + minor * 100 + patch.
#define RINGZERO_VERSION (RINGZERO_VERSION_MAJOR * 10000 + RINGZERO_VERSION_MINOR * 100 + RINGZERO_VERSION_PATCH)

#if defined(__CUDACC__)
/// Marks a function usable from host and CUDA device code when compiled by nvcc.
#define RINGZERO_HOST_DEVICE __host__ __device__
#else
#define RINGZERO_HOST_DEVICE
#endif

#ifndef RINGZERO_HAS_MPI
/// 1 when the MPI backend may be used (set by the build when MPI was found).
#define RINGZERO_HAS_MPI 0
#endif

#ifndef RINGZERO_HAS_NCCL
/// 1 when the NCCL backend may be used (set by the build when NCCL and cudart were found).
#define RINGZERO_HAS_NCCL 0
#endif

#ifndef RINGZERO_HAS_CUDA
/// 1 when the CUDA runtime is available to host code (set by the build when cudart was found).
#define RINGZERO_HAS_CUDA 0
#endif

#if defined(__x86_64__) || defined(_M_X64)
/// 1 on x86-64, where the host primitives may use SSE2 non-temporal stores.
#define RINGZERO_X86_64 1
#else
#define RINGZERO_X86_64 0
#endif

/// Size in bytes of a cache line; shared atomics are padded to it to avoid false sharing.
#define RINGZERO_CACHE_LINE 64

// Separate compilation (docs/compile_time.md). By default ringzero is header-only and every
// function is `inline`. A program that defines RINGZERO_SEPARATE_COMPILATION (for every
// translation unit) and compiles <ringzero/impl/src.hpp> once in its own .cpp gets the
// type-erased core (collective execution with every algorithm and dtype x op reduction kernel,
// and the local backend's thread launch) compiled once there instead of in every user file.
#if defined(RINGZERO_SEPARATE_COMPILATION)
/// Declares a function of the compiled core: `inline` when header-only, external otherwise.
#define RINGZERO_DECL
#if defined(RINGZERO_SEPARATE_COMPILATION_SOURCE)
/// 1 where the compiled core's definitions are compiled: every file when header-only, only the
/// source of <ringzero/impl/src.hpp> under RINGZERO_SEPARATE_COMPILATION.
#define RINGZERO_DEFINE_COMPILED_CORE 1
#else
#define RINGZERO_DEFINE_COMPILED_CORE 0
#endif
#else
#define RINGZERO_DECL inline
#define RINGZERO_DEFINE_COMPILED_CORE 1
#endif
