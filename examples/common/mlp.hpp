#pragma once
/// @file
/// `mlp`: a multilayer perceptron (fully connected layers, ReLU between them, softmax
/// cross-entropy on the last) with a hand-written backward pass that reports each gradient as
/// soon as it is computed, so a data-parallel reducer can start communicating it while the
/// earlier layers are still being differentiated.
///
/// Layout: parameters live in one flat float buffer in registration order W1, b1, W2, b2, ...
/// (W_l is in_l x out_l row-major, so a layer computes Z = A W + b on a batch of rows).
/// Gradients live in a flat buffer of the same layout, or, tensor by tensor, in memory the
/// caller binds (e.g. a gradient reducer's bucket views). Backward produces gradients in the
/// order b_L, W_L, b_{L-1}, W_{L-1}, ..., b_1, W_1: reverse registration order.
///
/// Storage owned elsewhere: an `mlp` built with `external_storage` allocates no parameters or
/// gradients at all; the caller binds every tensor (`bind_parameter`, `bind_gradient`), e.g. to
/// the views of a ZeRO runtime, whose storage may move between layers. For that, `forward`
/// and `backward` take optional layer hooks (`no_layer_hooks` shows the four calls) that run
/// before and after each layer: a sharded runtime gathers layer l's parameters in
/// `before_forward(l)` / `before_backward(l)`, binds the views, and releases them in
/// `after_forward(l)` / `after_backward(l)`. Layers are numbered from 0 (the layer of W1, b1).
///
/// Numerics follow PyTorch's nn.Linear / nn.CrossEntropyLoss: weights and biases initialised
/// uniformly in +-1/sqrt(fan_in); the loss is the mean over the batch of -log softmax(z)_y,
/// computed with the max subtracted.
///
/// Threads: matrix products go through Eigen on the calling thread only (EIGEN_DONT_PARALLELIZE;
/// one thread per rank). Memory: activations for up to `max_batch` rows are allocated by
/// `reserve`, once; forward and backward allocate nothing of their own.

#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE
#endif
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "distributed_sampler.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::examples {

/// Row-major float matrix (a batch is a block of rows).
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A row-major matrix over memory owned elsewhere.
using matrix_map = Eigen::Map<row_matrix>;
/// A read-only row-major matrix over memory owned elsewhere.
using const_matrix_map = Eigen::Map<const row_matrix>;
/// A row vector over memory owned elsewhere.
using row_vector_map = Eigen::Map<Eigen::RowVectorXf>;

/// One parameter tensor of an `mlp`.
struct tensor_info {
  std::string name;        ///< "fc1.weight", "fc1.bias", ...
  std::size_t offset = 0;  ///< first element in the flat parameter buffer
  std::size_t count = 0;   ///< number of elements
  int rows = 0;            ///< in_features for a weight, 1 for a bias
  int cols = 0;            ///< out_features
};

/// Tag type of `external_storage`.
struct external_storage_t {
  explicit external_storage_t() = default;
};
/// Selects the `mlp` constructor that allocates no parameters or gradients (see the file comment).
inline constexpr external_storage_t external_storage{};

/// Layer hooks that do nothing: the interface `mlp::forward` and `mlp::backward` call, with
/// l = 0 .. layer_count()-1 (forward in increasing, backward in decreasing order). A hook may
/// rebind the layer's tensors (`bind_parameter`, `bind_gradient`) before the layer runs.
struct no_layer_hooks {
  void before_forward(int) noexcept {}
  void after_forward(int) noexcept {}
  void before_backward(int) noexcept {}
  void after_backward(int) noexcept {}
};

/// The multilayer perceptron (see the file comment).
class mlp {
 public:
  /// Layers of widths `widths` (e.g. {784, 256, 128, 10}: three layers), initialised from `seed`.
  /// Throws errc::invalid_argument for fewer than two widths or a width below 1.
  explicit mlp(std::vector<int> widths, std::uint64_t seed = 0) : widths_(std::move(widths)) {
    build_layout();
    params_ = initial_parameters(seed);
    grads_.assign(elements_, 0.0f);
    bind_owned_parameters();
    bind_owned_gradients();
  }

  /// The same layers without any storage of their own: every tensor's parameters and gradient
  /// must be bound (`bind_parameter`, `bind_gradient`) before a layer uses them.
  /// `initial_parameters` gives the values the other constructor would start from.
  mlp(std::vector<int> widths, external_storage_t) : widths_(std::move(widths)) { build_layout(); }

  /// Number of layers.
  int layer_count() const noexcept { return static_cast<int>(widths_.size()) - 1; }
  /// Layer widths, input first.
  const std::vector<int>& widths() const noexcept { return widths_; }
  /// Number of parameter tensors (two per layer).
  std::size_t tensor_count() const noexcept { return tensors_.size(); }
  /// Tensor `i` (registration order W1, b1, W2, b2, ...).
  const tensor_info& tensor(std::size_t i) const { return tensors_.at(i); }
  /// Total number of parameters.
  std::size_t parameter_elements() const noexcept { return elements_; }

  /// PyTorch's nn.Linear initialisation drawn from `seed`: `parameter_elements()` values in
  /// registration order (tensor i at `tensor(i).offset`). Deterministic on every platform.
  std::vector<float> initial_parameters(std::uint64_t seed) const {
    std::vector<float> values(elements_);
    splitmix64 rng(seed ^ 0x6a09e667f3bcc908ull);
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const tensor_info& t = tensors_[i];
      const int fan_in = widths_[i / 2];
      const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
      for (std::size_t k = 0; k < t.count; ++k) values[t.offset + k] = (2.0f * rng.uniform() - 1.0f) * bound;
    }
    return values;
  }

  /// The owned flat parameter buffer (empty with `external_storage`).
  std::span<float> parameters() noexcept { return params_; }
  /// Tensor `i`'s parameters, wherever they are bound.
  std::span<float> parameter(std::size_t i) { return {param_ptr_.at(i), tensors_[i].count}; }
  /// Tensor `i`'s gradient, wherever it is bound.
  std::span<float> gradient(std::size_t i) { return {grad_ptr_.at(i), tensors_[i].count}; }
  /// The owned flat gradient buffer (meaningful for the tensors bound to it).
  std::span<float> owned_gradients() noexcept { return grads_; }

  /// Makes backward write tensor `i`'s gradient to `p` (`tensor(i).count` floats), e.g. a
  /// bucket view of a gradient reducer.
  void bind_gradient(std::size_t i, float* p) { grad_ptr_.at(i) = p; }
  /// Binds every tensor's gradient to the owned flat buffer (the default). Precondition: the
  /// model owns its storage (not built with `external_storage`).
  void bind_owned_gradients() {
    for (std::size_t i = 0; i < tensors_.size(); ++i) grad_ptr_[i] = grads_.data() + tensors_[i].offset;
  }
  /// Makes the layers read tensor `i`'s parameters from `p` (`tensor(i).count` floats), e.g. a
  /// view of a sharded runtime's storage.
  void bind_parameter(std::size_t i, float* p) { param_ptr_.at(i) = p; }
  /// Binds every tensor's parameters to the owned flat buffer (the default). Precondition as
  /// for `bind_owned_gradients`.
  void bind_owned_parameters() {
    for (std::size_t i = 0; i < tensors_.size(); ++i) param_ptr_[i] = params_.data() + tensors_[i].offset;
  }
  /// Sets every bound gradient to zero.
  void zero_gradients() {
    for (std::size_t i = 0; i < tensors_.size(); ++i) std::fill_n(grad_ptr_[i], tensors_[i].count, 0.0f);
  }

  /// Allocates activations for batches of up to `max_batch` rows (once; a larger value regrows).
  void reserve(int max_batch) {
    if (max_batch <= max_batch_) return;
    max_batch_ = max_batch;
    acts_.resize(widths_.size());
    deltas_.resize(widths_.size());
    for (std::size_t l = 1; l < widths_.size(); ++l) {
      acts_[l].setZero(max_batch, widths_[l]);
      deltas_[l].setZero(max_batch, widths_[l]);
    }
  }

  /// Largest batch `reserve` allowed.
  int max_batch() const noexcept { return max_batch_; }

  /// Forward pass on `batch` rows of `x` (batch x widths[0], row-major) with labels `y`.
  /// Keeps the activations and softmax probabilities for `backward` and `correct`, and returns
  /// the mean cross-entropy loss. Calls `hooks.before_forward(l)` and `hooks.after_forward(l)`
  /// around layer l (see `no_layer_hooks`). Precondition: 1 <= batch <= max_batch();
  /// labels < classes.
  template <class Hooks = no_layer_hooks>
  float forward(const float* x, const std::uint8_t* y, int batch, Hooks&& hooks = Hooks{}) {
    check_batch(batch);
    const int layers = layer_count();
    const_matrix_map input(x, batch, widths_[0]);
    for (int l = 1; l <= layers; ++l) {
      hooks.before_forward(l - 1);
      const std::size_t wi = static_cast<std::size_t>(2 * (l - 1)), bi = wi + 1;
      const tensor_info& w = tensors_[wi];
      const tensor_info& b = tensors_[bi];
      const_matrix_map W(param_ptr_[wi], w.rows, w.cols);
      Eigen::Map<const Eigen::RowVectorXf> bias(param_ptr_[bi], b.cols);
      auto Z = acts_[static_cast<std::size_t>(l)].topRows(batch);
      if (l == 1)
        Z.noalias() = input * W;
      else
        Z.noalias() = acts_[static_cast<std::size_t>(l - 1)].topRows(batch) * W;
      Z.rowwise() += bias;
      if (l < layers) Z = Z.cwiseMax(0.0f);
      hooks.after_forward(l - 1);
    }
    // Softmax cross-entropy, in place: the last activation becomes the probabilities.
    auto P = acts_[static_cast<std::size_t>(layers)].topRows(batch);
    const int classes = widths_.back();
    double loss = 0.0;
    for (int r = 0; r < batch; ++r) {
      float* z = P.row(r).data();
      float m = z[0];
      for (int c = 1; c < classes; ++c) m = std::max(m, z[c]);
      float s = 0.0f;
      for (int c = 0; c < classes; ++c) s += (z[c] = std::exp(z[c] - m));
      const int label = y[r];
      loss += std::log(s) - std::log(z[label]);
      const float inv = 1.0f / s;
      for (int c = 0; c < classes; ++c) z[c] *= inv;
    }
    return static_cast<float>(loss / batch);
  }

  /// After `forward`: how many of the `batch` rows have their label as the most probable class.
  int correct(const std::uint8_t* y, int batch) const {
    const auto& P = acts_[static_cast<std::size_t>(layer_count())];
    int hits = 0;
    for (int r = 0; r < batch; ++r) {
      Eigen::Index best = 0;
      P.row(r).maxCoeff(&best);
      if (best == y[r]) ++hits;
    }
    return hits;
  }

  /// Backward pass for the last `forward` (same `x`, `y`, `batch`): gradients of
  /// `scale * sum over rows of the loss` (scale = 1 / batch gives the mean; divide by the number
  /// of accumulation steps too when accumulating). With `accumulate` the gradients are added
  /// to the bound buffers, else they overwrite them. Calls `on_ready(i)` as soon as tensor i's
  /// gradient is final, in the order b_L, W_L, ..., b_1, W_1, and `hooks.before_backward(l)` /
  /// `hooks.after_backward(l)` around layer l's part (see `no_layer_hooks`).
  template <class OnReady, class Hooks = no_layer_hooks>
  void backward(const float* x, const std::uint8_t* y, int batch, float scale, bool accumulate, OnReady&& on_ready,
                Hooks&& hooks = Hooks{}) {
    check_batch(batch);
    const int layers = layer_count();
    // dZ_L = scale * (P - onehot(y))
    auto dZ = deltas_[static_cast<std::size_t>(layers)].topRows(batch);
    dZ = acts_[static_cast<std::size_t>(layers)].topRows(batch) * scale;
    for (int r = 0; r < batch; ++r) dZ(r, y[r]) -= scale;
    const_matrix_map input(x, batch, widths_[0]);
    for (int l = layers; l >= 1; --l) {
      hooks.before_backward(l - 1);
      const std::size_t wi = static_cast<std::size_t>(2 * (l - 1)), bi = wi + 1;
      const tensor_info& w = tensors_[wi];
      auto D = deltas_[static_cast<std::size_t>(l)].topRows(batch);
      row_vector_map db(grad_ptr_[bi], w.cols);
      if (accumulate)
        db.noalias() += D.colwise().sum();
      else
        db.noalias() = D.colwise().sum();
      on_ready(bi);
      matrix_map dW(grad_ptr_[wi], w.rows, w.cols);
      if (l == 1) {
        if (accumulate)
          dW.noalias() += input.transpose() * D;
        else
          dW.noalias() = input.transpose() * D;
      } else {
        const auto A = acts_[static_cast<std::size_t>(l - 1)].topRows(batch);
        if (accumulate)
          dW.noalias() += A.transpose() * D;
        else
          dW.noalias() = A.transpose() * D;
      }
      on_ready(wi);
      if (l > 1) {
        const_matrix_map W(param_ptr_[wi], w.rows, w.cols);
        auto prev = deltas_[static_cast<std::size_t>(l - 1)].topRows(batch);
        const auto A = acts_[static_cast<std::size_t>(l - 1)].topRows(batch);
        prev.noalias() = D * W.transpose();
        prev.array() = (A.array() > 0.0f).select(prev.array(), 0.0f);
      }
      hooks.after_backward(l - 1);
    }
  }

 private:
  void check_batch(int batch) const {
    if (batch < 1 || batch > max_batch_)
      throw error(errc::invalid_argument, "mlp: batch of " + std::to_string(batch) + " rows outside [1, " +
                                              std::to_string(max_batch_) + "] (call reserve)");
  }

  void build_layout() {
    if (widths_.size() < 2) throw error(errc::invalid_argument, "mlp: needs at least an input and an output width");
    for (int w : widths_)
      if (w < 1) throw error(errc::invalid_argument, "mlp: layer width " + std::to_string(w) + " is not positive");
    std::size_t at = 0;
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      const int in = widths_[l], out = widths_[l + 1];
      const std::string prefix = "fc" + std::to_string(l + 1);
      tensors_.push_back({prefix + ".weight", at, static_cast<std::size_t>(in) * out, in, out});
      at += static_cast<std::size_t>(in) * out;
      tensors_.push_back({prefix + ".bias", at, static_cast<std::size_t>(out), 1, out});
      at += static_cast<std::size_t>(out);
    }
    elements_ = at;
    param_ptr_.assign(tensors_.size(), nullptr);
    grad_ptr_.assign(tensors_.size(), nullptr);
  }

  std::vector<int> widths_;
  std::vector<tensor_info> tensors_;
  std::size_t elements_ = 0;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<float*> param_ptr_;
  std::vector<float*> grad_ptr_;
  int max_batch_ = 0;
  std::vector<row_matrix> acts_;    // acts_[l]: output of layer l (probabilities for the last)
  std::vector<row_matrix> deltas_;  // deltas_[l]: gradient w.r.t. layer l's pre-activation
};

}  // namespace ringzero::examples
