#pragma once
/// @file
/// `torch_ddp`: data parallelism for a libtorch `torch::nn::Module` through
/// `ringzero::ddp::gradient_reducer`, in one call. Every parameter's `.grad()` is a tensor view over
/// the reducer's bucket memory (backward accumulates straight into the bucket); a post hook on
/// each parameter's AccumulateGrad node (the hook PyTorch's own DDP reducer uses) marks the
/// gradient ready once accumulated, so buckets are all-reduced while backward goes on;
/// `finish()` after backward leaves the averaged gradients in `.grad()`. `no_sync()` accumulates.
/// Frozen parameters (`requires_grad() == false`) are broadcast from rank 0 but not reduced, as in
/// PyTorch's DDP: no bucket slot, no hook, their `.grad()` untouched.
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
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/collective/agreement.hpp"
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
  /// Walks the parameters of `module` (recursively, in `named_parameters()` order, a tensor
  /// shared under two names once) and registers those that require grad with a gradient reducer
  /// on `comm`: collective. Frozen parameters (`requires_grad() == false`) are not registered
  /// with the reducer (no bucket slot, no hook, `.grad()` untouched) but are broadcast from rank 0
  /// like the others (when `reducer.broadcast_parameters`, the default), so every replica starts
  /// equal. Broadcasts the parameters (and buffers) from rank 0, replaces each trainable
  /// parameter's `.grad()` by its bucket view (carrying a defined gradient's values) and installs
  /// the hooks. Errors, raised on every rank (no hang):
  /// - errc::invalid_argument, naming the rank and the parameter: a parameter (trainable or
  ///   frozen) that is not contiguous or strided, lives on a device other than the communicator's
  ///   (host) memory, or has a dtype ringzero lacks; buffers likewise when broadcast. The other
  ///   ranks say which rank refused;
  /// - errc::invalid_argument: a module with no parameter that requires grad (every parameter
  ///   frozen, or none at all): there is nothing to reduce (PyTorch's DDP refuses it too);
  /// - errc::contract_mismatch: ranks whose modules differ in the number of parameters, in a
  ///   parameter's dtype or shape, or in which parameters are frozen (naming the ranks that differ
  ///   from rank 0, the first such parameter and each rank's value), or in their buffers;
  /// - errc::unsupported for a communicator on CUDA device memory;
  /// - every error of `gradient_reducer`'s constructor.
  torch_ddp(communicator& comm, torch::nn::Module& module, torch_ddp_options options = {})
      : comm_(comm), module_(module), link_(std::make_shared<detail::torch_ddp_link>()) {
    options.reducer.gradient_as_bucket_view = true;
    std::string problem = collect(options);
    agree(problem);
    std::vector<ddp::reducer_parameter> params;
    params.reserve(trained_.size());
    for (std::size_t i : trained_) {
      const registered& p = params_[i];
      ddp::reducer_parameter r;
      r.data = p.tensor.data_ptr();
      r.count = static_cast<std::uint64_t>(p.tensor.numel());
      r.type = p.type;
      r.name = p.name;
      for (std::int64_t d : p.tensor.sizes()) r.shape.push_back(static_cast<std::uint64_t>(d));
      params.push_back(std::move(r));
    }
    reducer_ = std::make_unique<ddp::gradient_reducer>(comm_, std::move(params), options.reducer);
    if (options.reducer.broadcast_parameters)  // the reducer broadcast the trainable ones
      for (auto& p : params_)
        if (!p.trainable && p.count != 0)
          broadcast(comm_, p.tensor.data_ptr(), p.tensor.data_ptr(), p.count, p.type, 0);
    if (options.broadcast_buffers)
      for (auto& b : buffers_) broadcast(comm_, b.tensor.data_ptr(), b.tensor.data_ptr(), b.count, b.type, 0);
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < trained_.size(); ++i) {
      const torch::Tensor old = trained(i).tensor.grad();
      point_gradient(i);
      if (old.defined()) trained(i).tensor.grad().copy_(old);
    }
    link_->owner = this;
    thread_ = std::this_thread::get_id();
    for (std::size_t i = 0; i < trained_.size(); ++i) {
      registered& p = trained(i);
      auto accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
      if (!accumulator) fail("parameter '" + p.name + "' has no gradient accumulator (not a leaf tensor)");
      p.hook_key = accumulator->add_post_hook(std::make_unique<post_hook>(link_, i));
      p.accumulator = std::move(accumulator);
    }
  }

  torch_ddp(const torch_ddp&) = delete;
  torch_ddp& operator=(const torch_ddp&) = delete;

  /// Removes the hooks; the parameters keep their `.grad()` views only while the reducer lives,
  /// so they are detached (copied into tensors of their own) first. Frozen parameters are left alone.
  ~torch_ddp() {
    link_->owner = nullptr;
    for (std::size_t i : trained_) {
      registered& p = params_[i];
      if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
      try {
        torch::NoGradGuard no_grad;
        if (p.tensor.grad().defined()) p.tensor.mutable_grad() = p.tensor.grad().clone();
      } catch (...) {}
    }
  }

  /// The reducer (layout, stats, join ...). Its gradients are the `.grad()` views.
  ddp::gradient_reducer& reducer() noexcept { return *reducer_; }
  /// Parameters registered with the reducer (the trainable ones, after deduplication), in
  /// registration order: index `i` here is the reducer's parameter `i`.
  std::size_t parameter_count() const noexcept { return trained_.size(); }
  /// The name of registered parameter `i` (as `named_parameters()` gives it).
  const std::string& parameter_name(std::size_t i) const { return params_.at(trained_.at(i)).name; }
  /// Frozen parameters (`requires_grad() == false` at registration, after deduplication): broadcast
  /// at construction, never reduced.
  std::size_t frozen_parameter_count() const noexcept { return params_.size() - trained_.size(); }
  /// Times a hook found a `.grad()` that was not its bucket view (reset to none, or replaced by a
  /// create_graph backward) and copied it into the bucket instead: 0 in a plain training loop.
  std::uint64_t gradient_copies() const noexcept { return copies_; }

  /// Ends the step after backward: checks that the module still has the registered parameters
  /// (frozen ones included), then `gradient_reducer::finish()` (averaged gradients in `.grad()`;
  /// under no_sync nothing), and re-points the views when the one bucket rebuild moved them.
  /// Errors: a module whose parameters changed after registration, or one whose `requires_grad`
  /// flag changed (frozen or unfrozen since; errc::invalid_argument naming the parameter; the
  /// communicator is aborted so that peers fail promptly), a parameter backward never reached
  /// (the reducer's error naming it, unless `find_unused_parameters`: zero gradient), and
  /// every error of the reducer.
  void finish() {
    check_module();
    const std::uint64_t generation = reducer_->layout_generation();
    reducer_->finish();
    if (reducer_->layout_generation() != generation) {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < trained_.size(); ++i) point_gradient(i);
    }
  }

  /// Zeroes every gradient (the bucket views) for the next step; between steps only. Frozen
  /// parameters' `.grad()` is left alone.
  void zero_grad() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < trained_.size(); ++i) {
      if (trained(i).tensor.grad().data_ptr() != reducer_->gradient(i)) point_gradient(i);
      trained(i).tensor.mutable_grad().zero_();
    }
  }

  /// Accumulation steps until the guard is destroyed (`gradient_reducer::no_sync`; the same
  /// guard type as `torch_zero::no_sync()`, ringzero/no_sync.hpp).
  [[nodiscard]] no_sync_guard no_sync() { return reducer_->no_sync(); }

 private:
  struct registered {
    std::string name;
    torch::Tensor tensor;
    const void* impl = nullptr;  // the TensorImpl, to recognise a replaced parameter
    const void* data = nullptr;  // its storage at registration
    std::vector<std::int64_t> sizes;
    dtype type = dtype::float32;
    std::uint64_t count = 0;
    bool trainable = true;  // requires_grad() at registration: registered with the reducer
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

  error_context context() const { return ringzero::detail::context_of(comm_); }

  /// Aborts the communicator (peers waiting on this rank fail promptly) and throws.
  [[noreturn]] void fail(const std::string& message) {
    const std::string full = "torch_ddp: " + message;
    ringzero::detail::transport_of(comm_).abort(full);
    throw error(errc::invalid_argument, context(), full);
  }

  /// Collects the parameters (trainable and frozen) and buffers; returns this rank's first
  /// problem, or "".
  std::string collect(const torch_ddp_options& options) {
    if (comm_.space() != memory_space::host)
      return "the communicator works on CUDA device memory; the libtorch bridge supports host memory only";
    std::vector<const void*> seen;
    const auto check = [](const std::string& what, const torch::Tensor& t, dtype& type,
                          const char* why_contiguous) -> std::string {
      if (!t.defined()) return what + " is undefined";
      if (t.layout() != c10::kStrided) return what + " is not a strided (dense) tensor";
      if (!t.device().is_cpu())
        return what + " is on device " + t.device().str() + ", but the communicator works on host (CPU) memory";
      if (!t.is_contiguous()) return what + " is not contiguous (" + why_contiguous + ")";
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
      r.trainable = t.defined() && t.requires_grad();
      const char* why = r.trainable ? "its .grad() must be a view of one bucket slice"
                                    : "a frozen parameter is broadcast from rank 0 as one block of memory";
      if (std::string p = check("parameter '" + r.name + "'", t, r.type, why); !p.empty()) return p;
      r.data = t.data_ptr();
      r.sizes = t.sizes().vec();
      r.count = static_cast<std::uint64_t>(t.numel());
      if (r.trainable) trained_.push_back(params_.size());
      params_.push_back(std::move(r));
    }
    if (options.broadcast_buffers)
      for (const auto& item : module_.named_buffers(/*recurse=*/true)) {
        registered r;
        r.name = item.key();
        r.tensor = item.value();
        if (std::string p =
                check("buffer '" + r.name + "'", r.tensor, r.type, "it is broadcast as one block of memory");
            !p.empty())
          return p;
        r.count = static_cast<std::uint64_t>(r.tensor.numel());
        buffers_.push_back(std::move(r));
      }
    return {};
  }

  /// "1, 3": the ranks whose `field` of `table` differs from rank 0's.
  static std::string ranks_unlike_rank_0(const ringzero::detail::agreement_table& table, std::size_t field) {
    std::string s;
    for (std::size_t r = 1; r < table.ranks(); ++r)
      if (table.at(r, field) != table.at(0, field)) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  }

  /// Collective: every rank learns whether any rank's module was refused, and every rank
  /// registered the same parameters (number, dtypes, shapes, which are frozen) and buffers. The
  /// reducer checks the trainable parameters again, but frozen ones only this bridge sees (and
  /// broadcasts), and a difference in frozen-ness is named here rather than as the reducer's
  /// differing parameter count. Every rank raises the same error, then none is left waiting.
  void agree(const std::string& problem) {
    if (comm_.space() != memory_space::host)  // the same on every rank: refused without a collective
      throw error(errc::unsupported, context(), "torch_ddp: " + problem);
    ringzero::detail::fnv1a buffer_hash, shape_hash, frozen_hash;
    for (const auto& b : buffers_) {
      buffer_hash.text(b.name);
      buffer_hash.u64(b.count);
      buffer_hash.u64(static_cast<std::uint64_t>(b.type));
    }
    for (const auto& p : params_) {
      shape_hash.u64(p.count);
      shape_hash.u64(static_cast<std::uint64_t>(p.type));
      shape_hash.u64(p.sizes.size());
      for (std::int64_t d : p.sizes) shape_hash.u64(static_cast<std::uint64_t>(d));
      frozen_hash.u64(p.trainable ? 0u : 1u);
    }
    constexpr std::size_t refused_field = 0, buffers_field = 1, count_field = 2, shapes_field = 3, frozen_field = 4,
                          fields = 5;
    const std::uint64_t mine[fields] = {problem.empty() ? 0u : 1u, buffer_hash.value(), params_.size(),
                                        shape_hash.value(), frozen_hash.value()};
    const std::size_t n = static_cast<std::size_t>(comm_.world_size());
    std::vector<std::uint64_t> all(fields * n);
    all_gather(comm_, mine, all.data(), fields, dtype::uint64);
    const ringzero::detail::agreement_table table(std::move(all), fields);
    if (!problem.empty()) throw error(errc::invalid_argument, context(), "torch_ddp: " + problem);
    if (const std::vector<int> refused = table.ranks_where_not(refused_field, 0); !refused.empty()) {
      std::string ranks;
      for (int r : refused) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      throw error(errc::invalid_argument, context(),
                  "torch_ddp: rank(s) " + ranks + " refused their module (their error names the parameter)");
    }
    if (!table.same(count_field)) {
      std::vector<std::string> counts(n);
      for (std::size_t r = 0; r < n; ++r) counts[r] = std::to_string(table.at(r, count_field));
      throw error(errc::contract_mismatch, context(),
                  "torch_ddp: rank(s) " + ranks_unlike_rank_0(table, count_field) +
                      " registered another number of parameters (frozen ones included) than rank 0: " +
                      ringzero::detail::describe_values(counts));
    }
    if (!table.same(shapes_field) || !table.same(frozen_field))
      name_first_difference(table, shapes_field, frozen_field);
    if (!table.same(buffers_field))
      throw error(errc::contract_mismatch, context(),
                  "torch_ddp: rank(s) " + ranks_unlike_rank_0(table, buffers_field) +
                      " registered other buffers (names or sizes) than rank 0");
    if (trained_.empty())  // the same on every rank: the flags agree
      throw error(errc::invalid_argument, context(),
                  params_.empty()
                      ? std::string("torch_ddp: the module has no parameters: there is nothing to reduce, so data "
                                    "parallelism is not needed")
                      : "torch_ddp: none of the module's " + std::to_string(params_.size()) +
                            " parameter(s) requires grad (all are frozen): there are no gradients to reduce, so data "
                            "parallelism is not needed (PyTorch's DistributedDataParallel refuses such a module "
                            "too); make a parameter trainable, or run the module without the bridge");
  }

  /// Collective, when the ranks agree on the number of parameters but not on their dtypes and
  /// shapes (`shapes_field`) or frozen flags (`frozen_field`): one all_gather of every
  /// parameter's values names the first parameter that differs, and each rank's value. Throws
  /// errc::contract_mismatch (the same message on every rank but for this rank's own shape).
  [[noreturn]] void name_first_difference(const ringzero::detail::agreement_table& table, std::size_t shapes_field,
                                          std::size_t frozen_field) {
    constexpr std::size_t per = 4;  // count, dtype, shape hash, frozen
    std::vector<std::uint64_t> mine(per * params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      ringzero::detail::fnv1a shape;
      shape.u64(params_[i].sizes.size());
      for (std::int64_t d : params_[i].sizes) shape.u64(static_cast<std::uint64_t>(d));
      mine[per * i] = params_[i].count;
      mine[per * i + 1] = static_cast<std::uint64_t>(params_[i].type);
      mine[per * i + 2] = shape.value();
      mine[per * i + 3] = params_[i].trainable ? 0u : 1u;
    }
    const std::size_t n = static_cast<std::size_t>(comm_.world_size());
    std::vector<std::uint64_t> every(mine.size() * n);
    all_gather(comm_, mine.data(), every.data(), mine.size(), dtype::uint64);
    const ringzero::detail::agreement_table values(std::move(every), mine.size());
    const bool shapes = !table.same(shapes_field);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::size_t first = per * i + (shapes ? 0 : 3), last = per * i + (shapes ? 3 : 4);
      if (values.first_difference(first) >= last) continue;
      const registered& p = params_[i];
      std::vector<std::string> by_rank(n);
      for (std::size_t r = 0; r < n; ++r)
        by_rank[r] = shapes ? std::string(dtype_name(static_cast<dtype>(values.at(r, per * i + 1)))) + ", " +
                                  std::to_string(values.at(r, per * i)) + " element(s)"
                            : (values.at(r, per * i + 3) != 0 ? "frozen" : "trainable");
      if (shapes) {
        std::string dims;
        for (std::int64_t d : p.sizes) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
        throw error(errc::contract_mismatch, context(),
                    "torch_ddp: rank(s) " + ranks_unlike_rank_0(table, shapes_field) +
                        " registered parameters of other dtypes or shapes than rank 0; the first is parameter '" +
                        p.name + "' (" +
                        (values.first_difference(per * i) >= per * i + 2  // same dtype and count: the shapes differ
                             ? by_rank[0] + " on every rank, but other shapes"
                             : ringzero::detail::describe_values(by_rank)) +
                        "; shape on this rank [" + dims + "])");
      }
      throw error(errc::contract_mismatch, context(),
                  "torch_ddp: rank(s) " + ranks_unlike_rank_0(table, frozen_field) +
                      " differ from rank 0 in which parameters are frozen (requires_grad false); the first is "
                      "parameter '" +
                      p.name + "' (" + ringzero::detail::describe_values(by_rank) +
                      "): every rank must freeze the same parameters");
    }
    throw error(errc::contract_mismatch, context(),  // hashes differ but no value does: cannot happen
                "torch_ddp: the ranks registered different parameters (dtypes, shapes or frozen flags)");
  }

  /// Trainable parameter `i` (the reducer's parameter `i`).
  registered& trained(std::size_t i) { return params_[trained_[i]]; }

  /// Makes trainable parameter `i`'s `.grad()` the view of its bucket slice.
  void point_gradient(std::size_t i) {
    registered& p = trained(i);
    p.tensor.mutable_grad() = torch::from_blob(reducer_->gradient(i), p.sizes, p.tensor.options().requires_grad(false));
  }

  /// Raises when the module's parameters are no longer the registered tensors (frozen ones
  /// included), or one was frozen or unfrozen since registration.
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
      if (t.requires_grad() != p.trainable)
        fail("parameter '" + p.name + "' " +
             (p.trainable ? "was frozen (requires_grad set to false) after registration, but its gradient is reduced"
                          : "was made trainable (requires_grad set to true) after registration, but it was "
                            "registered frozen and its gradient is not reduced") +
             "; register the module again");
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
    registered& p = trained(i);
    if (std::this_thread::get_id() != thread_)
      fail("the gradient of parameter '" + p.name +
           "' was accumulated on another thread than the one that registered the module (run backward on the training "
           "thread)");
    void* view = reducer_->gradient(i);
    const torch::Tensor grad = p.tensor.grad();
    if (!grad.defined() || grad.data_ptr() != view) {
      torch::NoGradGuard no_grad;
      const torch::Tensor value = grad;
      point_gradient(i);
      if (value.defined())
        p.tensor.mutable_grad().copy_(value);
      else
        p.tensor.mutable_grad().zero_();
      ++copies_;
    }
    reducer_->mark_ready(i);
  }

  communicator& comm_;
  torch::nn::Module& module_;
  std::vector<registered> params_;    // every parameter, trainable and frozen, in named_parameters() order
  std::vector<std::size_t> trained_;  // the trainable ones (indices into params_), the reducer's order
  std::vector<registered> buffers_;
  std::unique_ptr<ddp::gradient_reducer> reducer_;
  std::shared_ptr<detail::torch_ddp_link> link_;
  std::thread::id thread_;
  std::uint64_t copies_ = 0;
};

}  // namespace ringzero::integration
