#pragma once
/// @file
/// The compiled core of ringzero's separate-compilation mode (docs/compile_time.md), as
/// Boost.Asio's and fmt's are: a program that defines RINGZERO_SEPARATE_COMPILATION in every
/// translation unit includes this header in exactly one .cpp file of its own, which then holds
/// the collective execution (every algorithm, every dtype x op reduction kernel, the reproducible
/// mode) and the local backend's thread launch; the other files only declare them and compile
/// in a fraction of the time. Without RINGZERO_SEPARATE_COMPILATION this header is an ordinary
/// header-only include of the same code.

#if defined(RINGZERO_SEPARATE_COMPILATION) && !defined(RINGZERO_SEPARATE_COMPILATION_SOURCE)
#if defined(RINGZERO_DECL)
#error "<ringzero/impl/src.hpp> must be the first ringzero header of its .cpp file"
#endif
#define RINGZERO_SEPARATE_COMPILATION_SOURCE 1
#endif

#include "ringzero/backend/local/launch.hpp"
#include "ringzero/collective/dispatch.hpp"
