// The CUDA launches of the examples' GPU MLP kernels (declared, with their contracts, in
// cuda_mlp_kernels.hpp): the bodies of mlp_kernel_bodies.hpp, which CI also runs on the host,
// launched on a stream by ringzero's cuda_launcher. Kept plain and short: the matrix products
// are cuBLAS's, and these kernels touch a few hundred thousand floats per step.
#include "cuda_mlp_kernels.hpp"

#include <cuda_runtime.h>

#include "mlp_kernel_bodies.hpp"
#include "ringzero/primitive/cuda_launch.cuh"

namespace ringzero::examples::cuda_kernels {

namespace {

primitive::kernels::cuda_launcher on(cudaStream_t stream) { return primitive::kernels::cuda_launcher{stream}; }

cudaError_t result(int code) { return static_cast<cudaError_t>(code); }

}  // namespace

cudaError_t gather_rows(float* x, std::uint8_t* y, const float* images, const std::uint8_t* labels,
                        const std::uint32_t* indices, int rows, int features, cudaStream_t stream) {
  return result(mlp_kernels::gather_rows(on(stream), x, y, images, labels, indices, rows, features));
}

cudaError_t add_bias(float* z, const float* bias, int rows, int cols, bool relu, cudaStream_t stream) {
  return result(mlp_kernels::add_bias(on(stream), z, bias, rows, cols, relu));
}

cudaError_t softmax_cross_entropy(float* z, const std::uint8_t* y, float* row_loss, int* row_correct, int rows,
                                  int classes, cudaStream_t stream) {
  return result(mlp_kernels::softmax_cross_entropy(on(stream), z, y, row_loss, row_correct, rows, classes));
}

cudaError_t softmax_cross_entropy_backward(float* dz, const float* p, const std::uint8_t* y, int rows, int classes,
                                           float scale, cudaStream_t stream) {
  return result(mlp_kernels::softmax_cross_entropy_backward(on(stream), dz, p, y, rows, classes, scale));
}

cudaError_t relu_backward(float* d, const float* a, std::int64_t count, cudaStream_t stream) {
  return result(mlp_kernels::relu_backward(on(stream), d, a, count));
}

cudaError_t accumulate_metrics(double* sums, const float* row_loss, const int* row_correct, int rows,
                               cudaStream_t stream) {
  return result(mlp_kernels::accumulate_metrics(on(stream), sums, row_loss, row_correct, rows));
}

cudaError_t fill(float* p, float value, std::int64_t count, cudaStream_t stream) {
  return result(mlp_kernels::fill(on(stream), p, value, count));
}

cudaError_t sgd_update(float* p, const float* g, float* buf, std::int64_t count, float lr, float momentum,
                       float weight_decay, bool nesterov, cudaStream_t stream) {
  return result(mlp_kernels::sgd_update(on(stream), p, g, buf, count, lr, momentum, weight_decay, nesterov));
}

cudaError_t adamw_update(float* p, const float* g, float* m, float* v, std::int64_t count, float lr, float weight_decay,
                         float beta1, float beta2, float eps, float bias1, float bias2_sqrt, cudaStream_t stream) {
  return result(
      mlp_kernels::adamw_update(on(stream), p, g, m, v, count, lr, weight_decay, beta1, beta2, eps, bias1, bias2_sqrt));
}

}  // namespace ringzero::examples::cuda_kernels
