#include <ringzero/cuda.cuh>  // ringzero's kernels, registered at start-up
