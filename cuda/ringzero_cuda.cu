// The CUDA kernels of ringzero for this project's own programs (tests, benchmarks, examples):
// including <ringzero/cuda.cuh> instantiates every device primitive and registers them for the
// code compiled by the host compiler (see include/ringzero/primitive/device_primitives.hpp).
#include <ringzero/cuda.cuh>
