// The smallest GPU program of docs/gpu.md ("Building your own program for a GPU"): one float32
// all_reduce on 2 ranks of the local backend sharing the GPU, on device memory. Without a usable
// GPU, local::launch_cuda fails with errc::no_device before any thread starts: printed, exit 0.
#include <ringzero/backend/local/cuda.hpp>
#include <ringzero/backend/nccl.hpp>
#include <ringzero/ringzero.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

int main() {
  try {
    ringzero::local::launch_cuda(2, [](ringzero::local::cuda_communicator& comm) {
      void* grad = nullptr;
      ringzero::primitive::cudart::check(cudaMallocAsync(&grad, 1024 * sizeof(float), comm.stream()),
                                         "cudaMallocAsync");
      ringzero::primitive::cudart::check(cudaMemsetAsync(grad, 0, 1024 * sizeof(float), comm.stream()),
                                         "cudaMemsetAsync");
      ringzero::all_reduce(comm, grad, grad, 1024, ringzero::dtype::float32, ringzero::reduce_kind::avg);
      ringzero::primitive::cudart::check(cudaFreeAsync(grad, comm.stream()), "cudaFreeAsync");
      comm.synchronize();
    });
  } catch (const ringzero::error& e) {
    std::printf("%s\n", e.what());
    return e.code() == ringzero::errc::no_device ? 0 : 1;
  }
  std::printf("one all_reduce on 2 ranks sharing the GPU\n");
  return 0;
}
