#pragma once
/// @file
/// `sync_batch_norm`: a libtorch batch-normalisation module whose training statistics are those
/// of the global batch over every rank of a `ringzero::communicator` (PyTorch's SyncBatchNorm):
/// one all_reduce of (sum, sum of squares, count) per channel in forward gives the count-weighted
/// global mean and biased variance (case C23: uneven per-rank batches), and one all_reduce of
/// (sum dy, sum dy*(x-mean)) in backward gives the gradient of the sum of every rank's loss.
/// Needs libtorch (only compiled where it is found; never included by <ringzero/ringzero.hpp>).
/// Thread semantics: forward and backward run on the thread that drives the communicator; every
/// rank calls them in the same order (they are collectives). The manual: docs/libtorch.md.

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::integration {

/// Settings of a `sync_batch_norm` (PyTorch's BatchNorm defaults). Always affine, always
/// tracking running statistics.
struct sync_batch_norm_options {
  double eps = 1e-5;      ///< added to the variance before the square root
  double momentum = 0.1;  ///< running = (1 - momentum) * running + momentum * batch statistic
};

/// Global batch statistics of one training forward (see `sync_batch_statistics`).
struct sync_batch_stats {
  torch::Tensor mean;      ///< per channel, float64
  torch::Tensor variance;  ///< biased (divides by count), per channel, float64
  std::int64_t count = 0;  ///< values per channel over every rank
};

namespace detail {

/// The dimensions reduced per channel: every one but dimension 1.
inline std::vector<std::int64_t> batch_norm_dims(const torch::Tensor& x) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

/// Shape that broadcasts a per-channel vector over `x`: [1, C, 1, ...].
inline std::vector<std::int64_t> channel_shape(const torch::Tensor& x) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return shape;
}

/// Element-wise forward with given statistics; backward all_reduces (sum dy, sum dy*(x-mean))
/// (PyTorch's batch_norm_backward_reduce / batch_norm_backward_elemt, over ringzero).
struct sync_batch_norm_function : torch::autograd::Function<sync_batch_norm_function> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& mean,
                               const torch::Tensor& invstd, communicator* comm, std::int64_t count) {
    ctx->save_for_backward({x, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["comm"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(comm));
    const auto shape = channel_shape(x);
    return (x - mean.view(shape)) * (invstd * weight).view(shape) + bias.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[2];
    const torch::Tensor& invstd = saved[3];
    const auto count = static_cast<double>(ctx->saved_data["count"].toInt());
    auto* comm = reinterpret_cast<communicator*>(static_cast<std::intptr_t>(ctx->saved_data["comm"].toInt()));
    const torch::Tensor dy = grad_outputs[0].contiguous();
    const auto dims = batch_norm_dims(x);
    const auto shape = channel_shape(x);
    const torch::Tensor xmu = x - mean.view(shape);
    const torch::Tensor sum_dy = dy.sum(dims);
    const torch::Tensor sum_dy_xmu = (dy * xmu).sum(dims);
    torch::Tensor global = torch::cat({sum_dy, sum_dy_xmu}).contiguous();
    if (comm != nullptr && comm->world_size() > 1)
      all_reduce(*comm, global.data_ptr(), global.data_ptr(), static_cast<std::uint64_t>(global.numel()),
                 dtype::float32, reduce_kind::sum);
    const std::int64_t c = x.size(1);
    const torch::Tensor mean_dy = global.slice(0, 0, c) / count;
    const torch::Tensor mean_dy_xmu = global.slice(0, c, 2 * c) / count;
    const torch::Tensor dx =
        (dy - mean_dy.view(shape) - xmu * (invstd * invstd * mean_dy_xmu).view(shape)) * (invstd * weight).view(shape);
    return {dx, sum_dy_xmu * invstd, sum_dy, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

/// The global per-channel mean and biased variance of `x` ([N, C, ...], float32, any N on each
/// rank) over every rank of `comm` (null: this rank alone): one all_reduce of C sums, C sums of
/// squares and the count, accumulated in float64 (case C23). Collective. Throws
/// errc::invalid_argument (on this rank) for fewer than 2 dimensions or a non-float32 input,
/// and when the global count per channel is below 2 (on every rank alike).
inline sync_batch_stats sync_batch_statistics(communicator* comm, const torch::Tensor& x) {
  if (x.dim() < 2 || x.scalar_type() != torch::kFloat32)
    throw error(errc::invalid_argument, "sync_batch_norm: expected a float32 input of shape [N, C, ...], got " +
                                            std::to_string(x.dim()) + " dimension(s) of " +
                                            std::string(c10::toString(x.scalar_type())));
  torch::NoGradGuard no_grad;
  const std::int64_t c = x.size(1);
  const torch::Tensor xd = x.to(torch::kFloat64);
  const auto dims = detail::batch_norm_dims(x);
  torch::Tensor packed = torch::empty({2 * c + 1}, torch::kFloat64);
  packed.slice(0, 0, c).copy_(xd.sum(dims));
  packed.slice(0, c, 2 * c).copy_((xd * xd).sum(dims));
  packed[2 * c] = static_cast<double>(x.numel() / (c == 0 ? 1 : c));
  if (comm != nullptr && comm->world_size() > 1)
    all_reduce(*comm, packed.data_ptr(), packed.data_ptr(), static_cast<std::uint64_t>(packed.numel()), dtype::float64,
               reduce_kind::sum);
  sync_batch_stats s;
  s.count = static_cast<std::int64_t>(packed[2 * c].item<double>());
  if (s.count < 2)
    throw error(errc::invalid_argument, "sync_batch_norm: " + std::to_string(s.count) +
                                            " value(s) per channel over all ranks; training needs at least 2");
  const double n = static_cast<double>(s.count);
  s.mean = packed.slice(0, 0, c) / n;
  s.variance = (packed.slice(0, c, 2 * c) / n - s.mean * s.mean).clamp_min(0.0);
  return s;
}

/// Batch normalisation over the global batch of every rank (see the file comment). Parameters
/// `weight` (ones) and `bias` (zeros); buffers `running_mean`, `running_var` (unbiased global
/// variance) and `num_batches_tracked`. In eval mode it normalises with the running statistics
/// and communicates nothing.
class sync_batch_norm_impl : public torch::nn::Module {
 public:
  /// `channels` features (dimension 1 of the input), statistics over `comm`'s ranks (null: this
  /// rank only, a plain BatchNorm). `comm` must outlive the module's training use. Throws
  /// errc::invalid_argument for channels < 1 or a momentum outside [0, 1].
  sync_batch_norm_impl(communicator* comm, std::int64_t channels, sync_batch_norm_options options = {})
      : comm_(comm), channels_(channels), options_(options) {
    if (channels < 1 || !(options.momentum >= 0.0 && options.momentum <= 1.0) || !(options.eps >= 0.0))
      throw error(errc::invalid_argument, "sync_batch_norm: channels must be >= 1, momentum in [0, 1], eps >= 0");
    weight = register_parameter("weight", torch::ones({channels}));
    bias = register_parameter("bias", torch::zeros({channels}));
    running_mean = register_buffer("running_mean", torch::zeros({channels}));
    running_var = register_buffer("running_var", torch::ones({channels}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kInt64));
  }

  /// Normalises `x` ([N, C, ...], float32). Training: collective (see the file comment), updates
  /// the running statistics. Throws errc::invalid_argument when dimension 1 is not `channels`.
  torch::Tensor forward(const torch::Tensor& x) {
    if (x.dim() < 2 || x.size(1) != channels_)
      throw error(errc::invalid_argument,
                  "sync_batch_norm: expected " + std::to_string(channels_) + " channels in dimension 1 of the input");
    if (!is_training())
      return torch::batch_norm(x, weight, bias, running_mean, running_var, false, options_.momentum, options_.eps,
                               false);
    const sync_batch_stats s = sync_batch_statistics(comm_, x);
    {
      torch::NoGradGuard no_grad;
      const double m = options_.momentum, n = static_cast<double>(s.count);
      const torch::Tensor unbiased = s.variance * (n / (n - 1.0));
      running_mean.copy_(running_mean.to(torch::kFloat64) * (1.0 - m) + s.mean * m);
      running_var.copy_(running_var.to(torch::kFloat64) * (1.0 - m) + unbiased * m);
      num_batches_tracked.add_(1);
    }
    const torch::Tensor mean = s.mean.to(torch::kFloat32);
    const torch::Tensor invstd = (s.variance + options_.eps).rsqrt().to(torch::kFloat32);
    return detail::sync_batch_norm_function::apply(x, weight, bias, mean, invstd, comm_, s.count);
  }

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  communicator* comm_;
  std::int64_t channels_;
  sync_batch_norm_options options_;
};

/// The module holder of `sync_batch_norm_impl` (libtorch's TORCH_MODULE pattern).
TORCH_MODULE_IMPL(sync_batch_norm, sync_batch_norm_impl);

}  // namespace ringzero::integration
