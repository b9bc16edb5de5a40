#pragma once
/// @file
/// Moved to ringzero/primitive/cudart/stream.hpp (the CUDA runtime wrappers sit below backend/, in the
/// memory-and-stream layer); this header stays for code that includes the old path.

#include "ringzero/primitive/cudart/stream.hpp"
