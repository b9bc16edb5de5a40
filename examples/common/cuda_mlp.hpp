#pragma once
/// @file
/// `cuda_mlp`: the multilayer perceptron of mlp.hpp on a CUDA GPU: the same layers, parameter
/// layout, initialisation (copied from an `mlp`), loss and gradient order, with the matrix
/// products in cuBLAS and the rest in the kernels of cuda_mlp_kernels.cu (a row-major Z = A W is
/// computed as the column-major Z^T = W^T A^T, without copies). Backward reports each gradient
/// as soon as it is enqueued, so a gradient reducer can reduce it while earlier layers run.
/// Built with `external_storage` it owns no parameters or gradients: the caller binds them per
/// tensor around each layer through layer hooks, as mlp.hpp (example 02 on zero::sharded_model's
/// device views). Everything is enqueued on the stream given at construction (cuBLAS is bound to
/// it); only `download_parameters` blocks. Activations for up to `max_batch` rows are allocated
/// once (`reserve`). Threads: one object per rank's thread, on the device it was made on.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_buffer.hpp"
#include "cuda_mlp_kernels.hpp"
#include "mlp.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::examples {

/// The GPU multilayer perceptron (see the file comment).
class cuda_mlp {
 public:
  /// The layers and current parameters of `host`, on the current device, working on `stream`.
  /// Throws errc::backend_failure when CUDA or cuBLAS fail.
  cuda_mlp(mlp& host, cudaStream_t stream) : widths_(host.widths()), stream_(stream), blas_(stream) {
    for (std::size_t i = 0; i < host.tensor_count(); ++i) tensors_.push_back(host.tensor(i));
    const std::vector<float> values(host.parameters().begin(), host.parameters().end());
    elements_ = values.size();
    params_ = device_array<float>(values.size());
    grads_ = device_array<float>(values.size());
    params_.upload(values, stream_);
    primitive::cudart::check(cudaMemsetAsync(grads_.get(), 0, values.size() * sizeof(float), stream_),
                             "cudaMemsetAsync (gradients)");
    param_ptr_.resize(tensors_.size());
    grad_ptr_.resize(tensors_.size());
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      param_ptr_[i] = params_.get() + tensors_[i].offset;
      grad_ptr_[i] = grads_.get() + tensors_[i].offset;
    }
  }
  /// The layers of `shape` (any mlp of the same widths) without storage: every tensor must be
  /// bound (`bind_parameter`, `bind_gradient`) before a layer uses it.
  cuda_mlp(const mlp& shape, external_storage_t, cudaStream_t stream)
      : widths_(shape.widths()), stream_(stream), blas_(stream) {
    for (std::size_t i = 0; i < shape.tensor_count(); ++i) tensors_.push_back(shape.tensor(i));
    elements_ = shape.parameter_elements();
    param_ptr_.assign(tensors_.size(), nullptr);
    grad_ptr_.assign(tensors_.size(), nullptr);
  }

  /// Number of layers.
  int layer_count() const noexcept { return static_cast<int>(widths_.size()) - 1; }
  /// Number of parameter tensors (two per layer).
  std::size_t tensor_count() const noexcept { return tensors_.size(); }
  /// Tensor `i` (registration order W1, b1, W2, b2, ...).
  const tensor_info& tensor(std::size_t i) const { return tensors_.at(i); }
  /// Total number of parameters.
  std::size_t parameter_elements() const noexcept { return elements_; }
  /// Tensor `i`'s parameters (device memory), wherever they are bound.
  float* parameter(std::size_t i) { return param_ptr_.at(i); }
  /// Makes the layers read tensor `i`'s parameters from device memory `p` (`tensor(i).count`
  /// floats), e.g. a parameter view of zero::sharded_model on a CUDA stream.
  void bind_parameter(std::size_t i, float* p) { param_ptr_.at(i) = p; }
  /// Tensor `i`'s gradient (device memory), wherever it is bound.
  float* gradient(std::size_t i) { return grad_ptr_.at(i); }
  /// Makes backward write tensor `i`'s gradient to device memory `p` (`tensor(i).count` floats),
  /// e.g. a bucket view of a gradient reducer on device memory.
  void bind_gradient(std::size_t i, float* p) { grad_ptr_.at(i) = p; }

  /// Allocates activations for batches of up to `max_batch` rows (once; a larger value regrows
  /// after waiting for the stream).
  void reserve(int max_batch) {
    if (max_batch <= max_batch_) return;
    primitive::cudart::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (before regrowing activations)");
    max_batch_ = max_batch;
    acts_.clear();
    deltas_.clear();
    acts_.resize(widths_.size());
    deltas_.resize(widths_.size());
    for (std::size_t l = 1; l < widths_.size(); ++l) {
      acts_[l] = device_array<float>(static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(widths_[l]));
      deltas_[l] = device_array<float>(static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(widths_[l]));
    }
    row_loss_ = device_array<float>(static_cast<std::size_t>(max_batch));
    row_correct_ = device_array<int>(static_cast<std::size_t>(max_batch));
    ones_ = device_array<float>(static_cast<std::size_t>(max_batch));
    check_launch(cuda_kernels::fill(ones_.get(), 1.0f, max_batch, stream_), "fill kernel");
  }

  /// Forward pass on `batch` rows of `x` (device, batch x widths[0]) with labels `y` (device):
  /// keeps the activations and probabilities for `backward`, and adds the batch's summed loss
  /// and number of correctly classified rows to `sums[0]` and `sums[1]` (device doubles).
  /// Calls `hooks.before_forward(l)` and `hooks.after_forward(l)` around layer l (mlp.hpp's
  /// `no_layer_hooks`). Precondition: 1 <= batch <= max_batch; labels < classes.
  template <class Hooks = no_layer_hooks>
  void forward(const float* x, const std::uint8_t* y, int batch, double* sums, Hooks&& hooks = Hooks{}) {
    check_batch(batch);
    const int layers = layer_count();
    const float one = 1.0f, zero = 0.0f;
    for (int l = 1; l <= layers; ++l) {
      hooks.before_forward(l - 1);
      const tensor_info& w = tensors_[static_cast<std::size_t>(2 * (l - 1))];
      const tensor_info& b = tensors_[static_cast<std::size_t>(2 * (l - 1) + 1)];
      const float* input = l == 1 ? x : acts_[static_cast<std::size_t>(l - 1)].get();
      float* z = acts_[static_cast<std::size_t>(l)].get();
      // Z^T (out x batch) = W^T (out x in) * A^T (in x batch), all column-major views.
      check_cublas(
          cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, w.cols, batch, w.rows, &one,
                      param_ptr_[static_cast<std::size_t>(2 * (l - 1))], w.cols, input, w.rows, &zero, z, w.cols),
          "cublasSgemm (forward)");
      check_launch(cuda_kernels::add_bias(z, param_ptr_[static_cast<std::size_t>(2 * (l - 1) + 1)], batch, b.cols,
                                          l < layers, stream_),
                   "add_bias kernel");
      hooks.after_forward(l - 1);
    }
    float* p = acts_[static_cast<std::size_t>(layers)].get();
    check_launch(
        cuda_kernels::softmax_cross_entropy(p, y, row_loss_.get(), row_correct_.get(), batch, widths_.back(), stream_),
        "softmax_cross_entropy kernel");
    check_launch(cuda_kernels::accumulate_metrics(sums, row_loss_.get(), row_correct_.get(), batch, stream_),
                 "accumulate_metrics kernel");
  }

  /// Backward pass for the last `forward` (same `x`, `y`, `batch`): gradients of
  /// `scale * sum of the rows' losses`, added to the bound gradients with `accumulate`, else
  /// overwriting them. Calls `on_ready(i)` once tensor i's gradient is enqueued, in the order
  /// b_L, W_L, ..., b_1, W_1 (reverse registration order), and `hooks.before_backward(l)` /
  /// `hooks.after_backward(l)` around layer l's part.
  template <class OnReady, class Hooks = no_layer_hooks>
  void backward(const float* x, const std::uint8_t* y, int batch, float scale, bool accumulate, OnReady&& on_ready,
                Hooks&& hooks = Hooks{}) {
    check_batch(batch);
    const int layers = layer_count();
    const float one = 1.0f, zero = 0.0f, beta = accumulate ? 1.0f : 0.0f;
    check_launch(cuda_kernels::softmax_cross_entropy_backward(deltas_[static_cast<std::size_t>(layers)].get(),
                                                              acts_[static_cast<std::size_t>(layers)].get(), y, batch,
                                                              widths_.back(), scale, stream_),
                 "softmax_cross_entropy_backward kernel");
    for (int l = layers; l >= 1; --l) {
      hooks.before_backward(l - 1);
      const std::size_t wi = static_cast<std::size_t>(2 * (l - 1)), bi = wi + 1;
      const tensor_info& w = tensors_[wi];
      const float* d = deltas_[static_cast<std::size_t>(l)].get();
      const float* input = l == 1 ? x : acts_[static_cast<std::size_t>(l - 1)].get();
      // db (out) = D^T 1: D row-major batch x out is column-major out x batch.
      check_cublas(cublasSgemv(blas_.get(), CUBLAS_OP_N, w.cols, batch, &one, d, w.cols, ones_.get(), 1, &beta,
                               grad_ptr_[bi], 1),
                   "cublasSgemv (bias gradient)");
      on_ready(bi);
      // dW (in x out, row-major) = A^T D, i.e. dW^T (out x in) = D^T (out x batch) * A (batch x in).
      check_cublas(cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, w.cols, w.rows, batch, &one, d, w.cols, input,
                               w.rows, &beta, grad_ptr_[wi], w.cols),
                   "cublasSgemm (weight gradient)");
      on_ready(wi);
      if (l > 1) {
        // dA (batch x in) = D W^T, i.e. dA^T (in x batch) = W (in x out) * D^T (out x batch).
        float* prev = deltas_[static_cast<std::size_t>(l - 1)].get();
        check_cublas(cublasSgemm(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, w.rows, batch, w.cols, &one, param_ptr_[wi],
                                 w.cols, d, w.cols, &zero, prev, w.rows),
                     "cublasSgemm (input gradient)");
        check_launch(cuda_kernels::relu_backward(prev, acts_[static_cast<std::size_t>(l - 1)].get(),
                                                 static_cast<std::int64_t>(batch) * w.rows, stream_),
                     "relu_backward kernel");
      }
      hooks.after_backward(l - 1);
    }
  }

  /// All parameters, copied to the host (waits for the stream).
  std::vector<float> download_parameters() const {
    std::vector<float> v(params_.size());
    primitive::cudart::check(
        cudaMemcpyAsync(v.data(), params_.get(), v.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (parameters)");
    primitive::cudart::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return v;
  }

  /// The stream everything is enqueued on.
  cudaStream_t stream() const noexcept { return stream_; }

 private:
  void check_batch(int batch) const {
    if (batch < 1 || batch > max_batch_)
      throw error(errc::invalid_argument, "cuda_mlp: batch of " + std::to_string(batch) + " rows outside [1, " +
                                              std::to_string(max_batch_) + "] (call reserve)");
  }

  std::vector<int> widths_;
  std::vector<tensor_info> tensors_;
  cudaStream_t stream_;
  cublas_handle blas_;
  device_array<float> params_;
  device_array<float> grads_;
  std::size_t elements_ = 0;
  std::vector<float*> param_ptr_;
  std::vector<float*> grad_ptr_;
  int max_batch_ = 0;
  std::vector<device_array<float>> acts_;    // acts_[l]: output of layer l (probabilities for the last)
  std::vector<device_array<float>> deltas_;  // deltas_[l]: gradient w.r.t. layer l's pre-activation
  device_array<float> row_loss_;
  device_array<int> row_correct_;
  device_array<float> ones_;
};

}  // namespace ringzero::examples
