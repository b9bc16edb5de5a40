#pragma once
/// @file
/// `torch_ddp`: data parallelism for a libtorch `torch::nn::Module` through
/// `ringzero::ddp::gradient_reducer`, in one call. Every parameter's `.grad()` is a tensor view over
/// the reducer's bucket memory (backward accumulates straight into the bucket); a post hook on
/// each parameter's AccumulateGrad node (the hook PyTorch's own DDP reducer uses) marks the
/// gradient ready once accumulated, so buckets are all-reduced while backward goes on;
/// `finish()` after backward leaves the averaged gradients in `.grad()`. `no_sync()` accumulates.
/// Needs libtorch (only compiled where it is found; never included by <ringzero/ringzero.hpp>).
/// Thread semantics: the thread that drives the communicator runs forward, backward (libtorch's
/// engine runs CPU backward on the calling thread) and every call here. Host memory only.
/// The manual (smallest program, what the bridge does, errors, limits): docs/libtorch.md.

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/broadcast.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/fnv1a.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/integration/torch_dtype.hpp"
#include "ringzero/integration/torch_sync_batch_norm.hpp"

namespace ringzero::integration {

class torch_ddp;

/// Options of a `torch_ddp`: the reducer's (`gradient_as_bucket_view` is always on) and whether
/// the module's buffers (e.g. batch-norm running statistics) are broadcast from rank 0 at
/// registration, as the parameters are.
struct torch_ddp_options {
  ddp::reducer_options reducer;   ///< buckets, find_unused_parameters, hooks, join ... (docs/ddp.md)
  bool broadcast_buffers = true;  ///< copy every buffer from rank 0 at construction
};

namespace detail {

/// What a post hook reaches: the bridge while it lives (null afterwards: a graph built before the
/// bridge was destroyed may still run its AccumulateGrad nodes).
struct torch_ddp_link {
  torch_ddp* owner = nullptr;
};

}  // namespace detail

/// The libtorch bridge to `gradient_reducer` (see the file comment and docs/libtorch.md).
class torch_ddp {
 public:
  /// Registers every parameter of `module` (recursively, in `named_parameters()` order, a tensor
  /// shared under two names once) with a gradient reducer on `comm`: collective. Broadcasts the
  /// parameters (and buffers) from rank 0, replaces each `.grad()` by its bucket view (carrying a
  /// defined gradient's values) and installs the hooks. Errors (errc::invalid_argument, raised
  /// on every rank, naming the rank and the parameter): a parameter that does not require grad,
  /// is not contiguous or strided, lives on a device other than the communicator's (host) memory,
  /// or has a dtype ringzero lacks; buffers likewise when broadcast. errc::unsupported for a
  /// communicator on CUDA device memory. Plus every error of `gradient_reducer`'s constructor.
  torch_ddp(communicator& comm, torch::nn::Module& module, torch_ddp_options options = {})
      : comm_(comm), module_(module), link_(std::make_shared<detail::torch_ddp_link>()) {
    options.reducer.gradient_as_bucket_view = true;
    std::string problem = collect(options);
    agree(problem);
    std::vector<ddp::reducer_parameter> params;
    params.reserve(params_.size());
    for (auto& p : params_) {
      ddp::reducer_parameter r;
      r.data = p.tensor.data_ptr();
      r.count = static_cast<std::uint64_t>(p.tensor.numel());
      r.type = p.type;
      r.name = p.name;
      for (std::int64_t d : p.tensor.sizes()) r.shape.push_back(static_cast<std::uint64_t>(d));
      params.push_back(std::move(r));
    }
    reducer_ = std::make_unique<ddp::gradient_reducer>(comm_, std::move(params), options.reducer);
    if (options.broadcast_buffers)
      for (auto& b : buffers_) broadcast(comm_, b.tensor.data_ptr(), b.tensor.data_ptr(), b.count, b.type, 0);
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const torch::Tensor old = params_[i].tensor.grad();
      point_gradient(i);
      if (old.defined()) params_[i].tensor.grad().copy_(old);
    }
    link_->owner = this;
    thread_ = std::this_thread::get_id();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto accumulator = torch::autograd::impl::grad_accumulator(params_[i].tensor);
      if (!accumulator) fail("parameter '" + params_[i].name + "' has no gradient accumulator (not a leaf tensor)");
      params_[i].hook_key = accumulator->add_post_hook(std::make_unique<post_hook>(link_, i));
      params_[i].accumulator = std::move(accumulator);
    }
  }

  torch_ddp(const torch_ddp&) = delete;
  torch_ddp& operator=(const torch_ddp&) = delete;

  /// Removes the hooks; the parameters keep their `.grad()` views only while the reducer lives,
  /// so they are detached (copied into tensors of their own) first.
  ~torch_ddp() {
    link_->owner = nullptr;
    for (auto& p : params_) {
      if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
      try {
        torch::NoGradGuard no_grad;
        if (p.tensor.grad().defined()) p.tensor.mutable_grad() = p.tensor.grad().clone();
      } catch (...) {}
    }
  }

  /// The reducer (layout, stats, join ...). Its gradients are the `.grad()` views.
  ddp::gradient_reducer& reducer() noexcept { return *reducer_; }
  /// Registered parameters (after deduplication), in registration order.
  std::size_t parameter_count() const noexcept { return params_.size(); }
  /// The name of registered parameter `i` (as `named_parameters()` gives it).
  const std::string& parameter_name(std::size_t i) const { return params_.at(i).name; }
  /// Times a hook found a `.grad()` that was not its bucket view (reset to none, or replaced by a
  /// create_graph backward) and copied it into the bucket instead: 0 in a plain training loop.
  std::uint64_t gradient_copies() const noexcept { return copies_; }

  /// Ends the step after backward: checks that the module still has the registered parameters,
  /// then `gradient_reducer::finish()` (averaged gradients in `.grad()`; under no_sync nothing),
  /// and re-points the views when the one bucket rebuild moved them. Errors: a module whose
  /// parameters changed after registration (errc::invalid_argument naming the parameter; the
  /// communicator is aborted so that peers fail promptly), a parameter backward never reached
  /// (the reducer's error naming it, unless `find_unused_parameters`: zero gradient), and
  /// every error of the reducer.
  void finish() {
    check_module();
    const std::uint64_t generation = reducer_->layout_generation();
    reducer_->finish();
    if (reducer_->layout_generation() != generation) {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params_.size(); ++i) point_gradient(i);
    }
  }

  /// Zeroes every gradient (the bucket views) for the next step; between steps only.
  void zero_grad() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].tensor.grad().data_ptr() != reducer_->gradient(i)) point_gradient(i);
      params_[i].tensor.mutable_grad().zero_();
    }
  }

  /// Accumulation steps until the guard is destroyed (`gradient_reducer::no_sync`).
  [[nodiscard]] ddp::gradient_reducer::no_sync_guard no_sync() { return reducer_->no_sync(); }

 private:
  struct registered {
    std::string name;
    torch::Tensor tensor;
    const void* impl = nullptr;  // the TensorImpl, to recognise a replaced parameter
    const void* data = nullptr;  // its storage at registration
    std::vector<std::int64_t> sizes;
    dtype type = dtype::float32;
    std::uint64_t count = 0;
    std::shared_ptr<torch::autograd::Node> accumulator;
    std::uintptr_t hook_key = 0;
  };

  /// Fires after AccumulateGrad added this backward's gradient into `.grad()`.
  struct post_hook : torch::autograd::FunctionPostHook {
    post_hook(std::shared_ptr<detail::torch_ddp_link> link, std::size_t index)
        : link_(std::move(link)), index_(index) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      if (link_->owner != nullptr) link_->owner->gradient_accumulated(index_);
      return outputs;
    }
    std::shared_ptr<detail::torch_ddp_link> link_;
    std::size_t index_;
  };

  error_context context() const {
    error_context c;
    c.backend = std::string(backend_name(comm_.backend()));
    c.rank = comm_.rank();
    c.world_size = comm_.world_size();
    return c;
  }

  /// Aborts the communicator (peers waiting on this rank fail promptly) and throws.
  [[noreturn]] void fail(const std::string& message) {
    const std::string full = "torch_ddp: " + message;
    ringzero::detail::transport_of(comm_).abort(full);
    throw error(errc::invalid_argument, context(), full);
  }

  /// Collects the parameters and buffers; returns this rank's first problem, or "".
  std::string collect(const torch_ddp_options& options) {
    if (comm_.space() != memory_space::host)
      return "the communicator works on CUDA device memory; the libtorch bridge supports host memory only";
    std::vector<const void*> seen;
    const auto check = [](const std::string& what, const torch::Tensor& t, dtype& type) -> std::string {
      if (!t.defined()) return what + " is undefined";
      if (t.layout() != c10::kStrided) return what + " is not a strided (dense) tensor";
      if (!t.device().is_cpu())
        return what + " is on device " + t.device().str() + ", but the communicator works on host (CPU) memory";
      if (!t.is_contiguous()) return what + " is not contiguous (its .grad() must be a view of one bucket slice)";
      if (const auto d = dtype_of_torch(t.scalar_type()); d)
        type = *d;
      else
        return what + " has dtype " + std::string(c10::toString(t.scalar_type())) + ", which ringzero cannot reduce";
      return {};
    };
    for (const auto& item : module_.named_parameters(/*recurse=*/true)) {
      const torch::Tensor& t = item.value();
      const void* impl = t.unsafeGetTensorImpl();
      bool shared = false;
      for (const void* s : seen) shared = shared || s == impl;
      if (shared) continue;  // one tensor under two names (tied weights): registered once
      seen.push_back(impl);
      registered r;
      r.name = item.key();
      r.tensor = t;
      r.impl = impl;
      if (std::string p = check("parameter '" + r.name + "'", t, r.type); !p.empty()) return p;
      if (!t.requires_grad())
        return "parameter '" + r.name +
               "' does not require grad; every registered parameter must (register a module of trainable "
               "parameters only)";
      r.data = t.data_ptr();
      r.sizes = t.sizes().vec();
      r.count = static_cast<std::uint64_t>(t.numel());
      params_.push_back(std::move(r));
    }
    if (options.broadcast_buffers)
      for (const auto& item : module_.named_buffers(/*recurse=*/true)) {
        registered r;
        r.name = item.key();
        r.tensor = item.value();
        if (std::string p = check("buffer '" + r.name + "'", r.tensor, r.type); !p.empty()) return p;
        r.count = static_cast<std::uint64_t>(r.tensor.numel());
        buffers_.push_back(std::move(r));
      }
    return {};
  }

  /// Collective: every rank learns whether any rank's module was refused, and every rank
  /// registered the same buffers (the reducer checks the parameters itself).
  void agree(const std::string& problem) {
    if (comm_.space() != memory_space::host)  // the same on every rank: refused without a collective
      throw error(errc::unsupported, context(), "torch_ddp: " + problem);
    ringzero::detail::fnv1a buffer_hash;
    for (const auto& b : buffers_) {
      buffer_hash.text(b.name);
      buffer_hash.u64(b.count);
      buffer_hash.u64(static_cast<std::uint64_t>(b.type));
    }
    const std::uint64_t mine[2] = {problem.empty() ? 0u : 1u, buffer_hash.value()};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(comm_.world_size()));
    all_gather(comm_, mine, all.data(), 2, dtype::uint64);
    std::string refused, differ;
    for (int r = 0; r < comm_.world_size(); ++r) {
      if (all[2 * static_cast<std::size_t>(r)] != 0) refused += (refused.empty() ? "" : ", ") + std::to_string(r);
      if (all[2 * static_cast<std::size_t>(r) + 1] != all[1])
        differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!problem.empty()) throw error(errc::invalid_argument, context(), "torch_ddp: " + problem);
    if (!refused.empty())
      throw error(errc::invalid_argument, context(),
                  "torch_ddp: rank(s) " + refused + " refused their module (their error names the parameter)");
    if (!differ.empty())
      throw error(errc::contract_mismatch, context(),
                  "torch_ddp: rank(s) " + differ + " registered other buffers (names or sizes) than rank 0");
  }

  /// Makes parameter `i`'s `.grad()` the view of its bucket slice.
  void point_gradient(std::size_t i) {
    registered& p = params_[i];
    p.tensor.mutable_grad() = torch::from_blob(reducer_->gradient(i), p.sizes, p.tensor.options().requires_grad(false));
  }

  /// Raises when the module's parameters are no longer the registered tensors.
  void check_module() {
    std::size_t k = 0;
    for (const auto& item : module_.named_parameters(/*recurse=*/true)) {
      const torch::Tensor& t = item.value();
      const void* impl = t.unsafeGetTensorImpl();
      bool registered_before = false;
      for (std::size_t j = 0; j < k && !registered_before; ++j) registered_before = params_[j].impl == impl;
      if (registered_before) continue;  // a tied name of an earlier parameter
      if (k >= params_.size())
        fail("parameter '" + item.key() + "' was added to the module after registration; register the module again");
      const registered& p = params_[k];
      if (impl != p.impl || item.key() != p.name)
        fail("parameter '" + p.name + "' was replaced (or renamed to '" + item.key() +
             "') after registration; register the module again");
      if (t.data_ptr() != p.data || t.sizes().vec() != p.sizes)
        fail("parameter '" + p.name + "' changed its storage or shape after registration; register the module again");
      ++k;
    }
    if (k != params_.size())
      fail("parameter '" + params_[k].name +
           "' was removed from the module after registration; register the module again");
  }

  /// The hook's work: moves a gradient that is not in its view into it, then marks it ready.
  void gradient_accumulated(std::size_t i) {
    if (std::this_thread::get_id() != thread_)
      fail("the gradient of parameter '" + params_[i].name +
           "' was accumulated on another thread than the one that registered the module (run backward on the training "
           "thread)");
    void* view = reducer_->gradient(i);
    const torch::Tensor grad = params_[i].tensor.grad();
    if (!grad.defined() || grad.data_ptr() != view) {
      torch::NoGradGuard no_grad;
      const torch::Tensor value = grad;
      point_gradient(i);
      if (value.defined())
        params_[i].tensor.mutable_grad().copy_(value);
      else
        params_[i].tensor.mutable_grad().zero_();
      ++copies_;
    }
    reducer_->mark_ready(i);
  }

  communicator& comm_;
  torch::nn::Module& module_;
  std::vector<registered> params_;
  std::vector<registered> buffers_;
  std::unique_ptr<ddp::gradient_reducer> reducer_;
  std::shared_ptr<detail::torch_ddp_link> link_;
  std::thread::id thread_;
  std::uint64_t copies_ = 0;
};

}  // namespace ringzero::integration
