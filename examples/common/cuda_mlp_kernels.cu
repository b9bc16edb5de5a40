// The small CUDA kernels of the examples' GPU MLP (declared, with their contracts, in
// cuda_mlp_kernels.hpp). Kept plain and short: the matrix products are cuBLAS's, and these
// kernels touch a few hundred thousand floats per step.
#include "cuda_mlp_kernels.hpp"

#include <cuda_runtime.h>

namespace ringzero::examples::cuda_kernels {

namespace {

constexpr int threads = 256;

/// Blocks for `count` elements, one per thread, capped (the kernels stride over the rest).
unsigned blocks_for(std::int64_t count) {
  const std::int64_t b = (count + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

cudaError_t launched() { return cudaGetLastError(); }

__global__ void gather_rows_kernel(float* x, std::uint8_t* y, const float* images, const std::uint8_t* labels,
                                   const std::uint32_t* indices, int rows, int features) {
  const std::int64_t total = static_cast<std::int64_t>(rows) * features;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / features, c = i % features;
    const std::uint32_t src = indices[r];
    x[i] = images[static_cast<std::int64_t>(src) * features + c];
    if (c == 0) y[r] = labels[src];
  }
}

__global__ void add_bias_kernel(float* z, const float* bias, int rows, int cols, bool relu) {
  const std::int64_t total = static_cast<std::int64_t>(rows) * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = z[i] + bias[i % cols];
    z[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void softmax_cross_entropy_kernel(float* z, const std::uint8_t* y, float* row_loss, int* row_correct,
                                             int rows, int classes) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    float* row = z + static_cast<std::int64_t>(r) * classes;
    float m = row[0];
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (row[c] > m) {
        m = row[c];
        best = c;
      }
    const int label = y[r];
    const float shifted_label = row[label] - m;
    float s = 0.0f;
    for (int c = 0; c < classes; ++c) s += (row[c] = expf(row[c] - m));
    row_loss[r] = logf(s) - shifted_label;
    row_correct[r] = best == label ? 1 : 0;
    const float inv = 1.0f / s;
    for (int c = 0; c < classes; ++c) row[c] *= inv;
  }
}

__global__ void softmax_backward_kernel(float* dz, const float* p, const std::uint8_t* y, int rows, int classes,
                                        float scale) {
  const std::int64_t total = static_cast<std::int64_t>(rows) * classes;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / classes, c = i % classes;
    dz[i] = scale * p[i] - (c == y[r] ? scale : 0.0f);
  }
}

__global__ void relu_backward_kernel(float* d, const float* a, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    if (!(a[i] > 0.0f)) d[i] = 0.0f;
}

__global__ void accumulate_metrics_kernel(double* sums, const float* row_loss, const int* row_correct, int rows) {
  __shared__ double loss[threads];
  __shared__ double correct[threads];
  double l = 0.0, c = 0.0;
  for (int r = threadIdx.x; r < rows; r += threads) {
    l += row_loss[r];
    c += row_correct[r];
  }
  loss[threadIdx.x] = l;
  correct[threadIdx.x] = c;
  __syncthreads();
  for (int half = threads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      loss[threadIdx.x] += loss[threadIdx.x + half];
      correct[threadIdx.x] += correct[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    sums[0] += loss[0];
    sums[1] += correct[0];
  }
}

__global__ void fill_kernel(float* p, float value, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, std::int64_t count, float lr, float momentum, float wd,
                           bool nesterov) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float grad = g[i] + wd * p[i];
    const float b = momentum * buf[i] + grad;
    buf[i] = b;
    p[i] -= lr * (nesterov ? grad + momentum * b : b);
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t count, float step, float decay,
                             float beta1, float beta2, float eps, float bias2_sqrt) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float grad = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * grad;
    const float vi = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * mi / (sqrtf(vi) / bias2_sqrt + eps);
  }
}

}  // namespace

cudaError_t gather_rows(float* x, std::uint8_t* y, const float* images, const std::uint8_t* labels,
                        const std::uint32_t* indices, int rows, int features, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  gather_rows_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * features), threads, 0, stream>>>(
      x, y, images, labels, indices, rows, features);
  return launched();
}

cudaError_t add_bias(float* z, const float* bias, int rows, int cols, bool relu, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  add_bias_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * cols), threads, 0, stream>>>(z, bias, rows, cols,
                                                                                              relu);
  return launched();
}

cudaError_t softmax_cross_entropy(float* z, const std::uint8_t* y, float* row_loss, int* row_correct, int rows,
                                  int classes, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  softmax_cross_entropy_kernel<<<blocks_for(rows), threads, 0, stream>>>(z, y, row_loss, row_correct, rows, classes);
  return launched();
}

cudaError_t softmax_cross_entropy_backward(float* dz, const float* p, const std::uint8_t* y, int rows, int classes,
                                           float scale, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  softmax_backward_kernel<<<blocks_for(static_cast<std::int64_t>(rows) * classes), threads, 0, stream>>>(
      dz, p, y, rows, classes, scale);
  return launched();
}

cudaError_t relu_backward(float* d, const float* a, std::int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  relu_backward_kernel<<<blocks_for(count), threads, 0, stream>>>(d, a, count);
  return launched();
}

cudaError_t accumulate_metrics(double* sums, const float* row_loss, const int* row_correct, int rows,
                               cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  accumulate_metrics_kernel<<<1, threads, 0, stream>>>(sums, row_loss, row_correct, rows);
  return launched();
}

cudaError_t fill(float* p, float value, std::int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  fill_kernel<<<blocks_for(count), threads, 0, stream>>>(p, value, count);
  return launched();
}

cudaError_t sgd_update(float* p, const float* g, float* buf, std::int64_t count, float lr, float momentum,
                       float weight_decay, bool nesterov, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  sgd_kernel<<<blocks_for(count), threads, 0, stream>>>(p, g, buf, count, lr, momentum, weight_decay, nesterov);
  return launched();
}

cudaError_t adamw_update(float* p, const float* g, float* m, float* v, std::int64_t count, float lr, float weight_decay,
                         float beta1, float beta2, float eps, float bias1, float bias2_sqrt, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  adamw_kernel<<<blocks_for(count), threads, 0, stream>>>(p, g, m, v, count, lr / bias1, 1.0f - lr * weight_decay,
                                                          beta1, beta2, eps, bias2_sqrt);
  return launched();
}

}  // namespace ringzero::examples::cuda_kernels
