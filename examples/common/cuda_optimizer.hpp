#pragma once
/// @file
/// `cuda_optimizer`: optimizer.hpp's SGD with momentum and AdamW on a CUDA GPU, with the same
/// update rules (torch.optim.SGD with dampening 0, torch.optim.AdamW) and defaults (momentum
/// 0.9; weight decay 0.01, betas 0.9 / 0.999, eps 1e-8), one kernel per update.
///
/// Memory: the state (momentum, or the two moments) for `n` values in device memory, zeroed at
/// construction. Stream semantics: every update is enqueued on the stream given at
/// construction. The GPU contracts a * b + c into fused multiply-adds, so values differ from
/// the CPU optimizer's in the last bits; the rule is the same.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_buffer.hpp"
#include "cuda_mlp_kernels.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::examples {

/// SGD (momentum 0.9) or AdamW (weight decay 0.01) over `n` device floats.
class cuda_optimizer {
 public:
  /// `name` is "sgd" or "adamw" (errc::invalid_argument otherwise); learning rate `lr`.
  cuda_optimizer(const std::string& name, std::size_t n, float lr, cudaStream_t stream)
      : name_(name), n_(n), lr_(lr), stream_(stream) {
    if (name != "sgd" && name != "adamw")
      throw error(errc::invalid_argument, "unknown optimizer '" + name + "' (sgd or adamw)");
    first_ = device_array<float>(n);
    primitive::cudart::check(cudaMemsetAsync(first_.get(), 0, n * sizeof(float), stream_),
                             "cudaMemsetAsync (optimizer state)");
    if (name == "adamw") {
      second_ = device_array<float>(n);
      primitive::cudart::check(cudaMemsetAsync(second_.get(), 0, n * sizeof(float), stream_),
                               "cudaMemsetAsync (optimizer state)");
    }
  }

  /// "sgd" or "adamw".
  const std::string& name() const noexcept { return name_; }
  /// Starts a step (AdamW's bias correction counts steps). Once per step, before its updates.
  void begin_step() { ++t_; }

  /// Updates `count` parameters at `p` from gradients `g` (device memory) using state elements
  /// [offset, offset + count). Throws errc::invalid_argument when the range exceeds the state.
  void update(float* p, const float* g, std::size_t count, std::size_t offset) {
    if (offset > n_ || count > n_ - offset)
      throw error(errc::invalid_argument, name_ + ": state range [" + std::to_string(offset) + ", +" +
                                              std::to_string(count) + ") exceeds " + std::to_string(n_) + " elements");
    const auto c = static_cast<std::int64_t>(count);
    if (name_ == "sgd") {
      check_launch(cuda_kernels::sgd_update(p, g, first_.get() + offset, c, lr_, 0.9f, 0.0f, false, stream_),
                   "sgd kernel");
      return;
    }
    if (t_ == 0) throw error(errc::invalid_argument, "adamw: update before begin_step");
    const double t = static_cast<double>(t_);
    const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(0.9f), t));  // as optimizer.hpp
    const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(0.999f), t)));
    check_launch(cuda_kernels::adamw_update(p, g, first_.get() + offset, second_.get() + offset, c, lr_, 0.01f, 0.9f,
                                            0.999f, 1e-8f, bias1, bias2_sqrt, stream_),
                 "adamw kernel");
  }

 private:
  std::string name_;
  std::size_t n_;
  float lr_;
  cudaStream_t stream_;
  std::uint64_t t_ = 0;
  device_array<float> first_;   // momentum, or AdamW's first moment
  device_array<float> second_;  // AdamW's second moment
};

}  // namespace ringzero::examples
