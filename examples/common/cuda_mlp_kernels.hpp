#pragma once
/// @file
/// The small CUDA kernels of the examples' GPU MLP (cuda_mlp.hpp, cuda_optimizer.hpp): what is
/// not a matrix product (those go to cuBLAS). Declared here for code compiled by the host
/// compiler, defined in cuda_mlp_kernels.cu (compiled by nvcc once).
///
/// Every function enqueues one kernel on `stream` and returns the launch's cudaError_t; none
/// blocks the host. Matrices are row-major float (a batch is a block of rows), as in mlp.hpp.
/// Determinism: every kernel computes each output with a fixed order of operations (no atomics),
/// so a run repeats bit for bit on the same GPU.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringzero::examples::cuda_kernels {

/// `x[r, :] = images[indices[r], :]` and `y[r] = labels[indices[r]]` for r < rows (`features`
/// floats per row): assembles one batch from a dataset kept in device memory.
cudaError_t gather_rows(float* x, std::uint8_t* y, const float* images, const std::uint8_t* labels,
                        const std::uint32_t* indices, int rows, int features, cudaStream_t stream);

/// `z[r, c] += bias[c]`, then `max(z, 0)` when `relu`, for a rows x cols matrix.
cudaError_t add_bias(float* z, const float* bias, int rows, int cols, bool relu, cudaStream_t stream);

/// Softmax cross-entropy on a rows x classes matrix of logits, in place: each row becomes its
/// probabilities (max subtracted first); `row_loss[r] = log(sum exp(z - max)) - (z[y] - max)`
/// and `row_correct[r] = 1` when the most probable class (first on ties) is `y[r]`, else 0.
cudaError_t softmax_cross_entropy(float* z, const std::uint8_t* y, float* row_loss, int* row_correct, int rows,
                                  int classes, cudaStream_t stream);

/// The gradient of `scale * sum of the rows' losses` with respect to the logits:
/// `dz = scale * (p - onehot(y))`.
cudaError_t softmax_cross_entropy_backward(float* dz, const float* p, const std::uint8_t* y, int rows, int classes,
                                           float scale, cudaStream_t stream);

/// `d[i] = a[i] > 0 ? d[i] : 0` for i < count (the ReLU's backward, given its output `a`).
cudaError_t relu_backward(float* d, const float* a, std::int64_t count, cudaStream_t stream);

/// `sums[0] += sum of row_loss`, `sums[1] += sum of row_correct` over `rows` rows (one block,
/// a fixed summation tree: deterministic).
cudaError_t accumulate_metrics(double* sums, const float* row_loss, const int* row_correct, int rows,
                               cudaStream_t stream);

/// `p[i] = value` for i < count.
cudaError_t fill(float* p, float value, std::int64_t count, cudaStream_t stream);

/// SGD with momentum, torch.optim.SGD's rule (dampening 0): g += wd * p; buf = momentum * buf + g;
/// p -= lr * (nesterov ? g + momentum * buf : buf).
cudaError_t sgd_update(float* p, const float* g, float* buf, std::int64_t count, float lr, float momentum,
                       float weight_decay, bool nesterov, cudaStream_t stream);

/// AdamW, torch.optim.AdamW's rule: p *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr / bias1 * m / (sqrt(v) / bias2_sqrt + eps), with bias1 = 1 - b1^t, bias2_sqrt = sqrt(1 - b2^t).
cudaError_t adamw_update(float* p, const float* g, float* m, float* v, std::int64_t count, float lr, float weight_decay,
                         float beta1, float beta2, float eps, float bias1, float bias2_sqrt, cudaStream_t stream);

}  // namespace ringzero::examples::cuda_kernels
