#pragma once
/// @file
/// `integration::torch_zero`: a torch::nn::Module trained through `zero::sharded_model` (ZeRO
/// stages 0-3) after one call. Its parameters become views over the runtime's memory, one torch
/// storage per flat buffer; at stage 3 a unit's storage points at its gather buffer only while
/// the unit is gathered, and an identity autograd function at each unit's output gathers it
/// again before its backward and repoints the same storage, so the tensors autograd saved see
/// valid data (FSDP's approach). Gradients are accumulated by autograd straight into the
/// runtime's gradient memory. The module calls `run(name, x, f)` around every part that may be
/// a unit. Errors: ringzero::error on every rank, naming the parameter. Thread semantics: one
/// thread per rank, as the runtime. Needs libtorch; never included by <ringzero/ringzero.hpp>.
/// The manual: docs/libtorch_gpt.md.

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/broadcast.hpp"
#include "ringzero/core/enum_names.hpp"
#include "ringzero/integration/torch_dtype.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::integration {

/// How parameters are grouped into gather units (FSDP's wrapping policy).
enum class wrap_policy {
  block,  ///< one unit per child of the blocks container, one "embeddings" before, one "head" after
  layer,  ///< one unit per submodule that owns parameters (named by its path)
  model,  ///< the whole module is one unit, "model"
};

/// The policy's name ("block", "layer", "model").
inline constexpr enum_names<wrap_policy, 3> wrap_names{"block", "layer", "model"};
/// The policy's name (`wrap_names`).
constexpr std::string_view wrap_name(wrap_policy w) noexcept { return wrap_names(w); }

/// Options of a `torch_zero`.
struct torch_zero_options {
  int stage = 3;                          ///< ZeRO stage 0-3
  wrap_policy wrap = wrap_policy::block;  ///< gather units
  std::string blocks = "blocks";          ///< block wrap: the module path of the blocks container
  /// Master weights, optimizer states (the parameter element type is the module's own).
  zero::precision precision{};
  int accumulation_steps = 1;  ///< micro-batches per step (one `backward` each)
  bool prefetch = true;        ///< stage 3: gather the next unit while this one computes
  /// Stage 3: explicit prefetch lists by unit name (`zero::prefetch_list`, FSDP2's
  /// `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`) over `prefetch`.
  std::vector<zero::prefetch_list> prefetch_lists;
  int max_inflight_reductions = 2;
  /// Stage 3: the most units gathered at once that a prefetch may bring about (0: no bound;
  /// `zero::plan_request::max_inflight_gathers`).
  int max_inflight_gathers = 0;
  /// Stage 3: which units are released after their forward and gathered again for their
  /// backward (`zero::reshard_policy`: all, except_last as FSDP2 does by default, none); the
  /// plan counts the gather buffers the policy keeps.
  zero::reshard_policy reshard_after_forward = zero::reshard_policy::all;
  /// Start every rank from rank 0's values (a broadcast, as DDP does); false: each rank's own,
  /// which must then be equal.
  bool broadcast_from_rank0 = true;
  /// Quantized communication (zero/quantization.hpp, ZeRO++'s qwZ and qgZ): stage 3's
  /// parameter all_gathers (the module then computes with the dequantized values) and the
  /// gradient reduction at stages 1-3; none by default.
  zero::communication_quantization quantization{};
  /// Stages 2-3: accumulate the micro-batches' gradients unsharded and reduce them once per step
  /// (`zero::plan_request::accumulate_unsharded`; FSDP2's `set_requires_gradient_sync(False)` is `no_sync()`).
  bool accumulate_unsharded = false;
  /// Stage 3: bytes per rank of frozen parameters (requires_grad false) kept gathered for the
  /// whole run instead of gathered with their unit (`zero::plan_request::keep_frozen_bytes`;
  /// `zero::keep_all_frozen` keeps them all): a frozen backbone then costs no traffic per step.
  std::uint64_t keep_frozen_bytes = 0;
  zero::sharded_model_options model{};  ///< optimizer, clipping
};

namespace detail {

/// The gather unit of parameter `name` (module path + "." + parameter) under `wrap`.
/// `after_blocks`: a block of `blocks` came before this parameter.
inline std::string unit_name(const std::string& name, wrap_policy wrap, const std::string& blocks, bool after_blocks) {
  switch (wrap) {
    case wrap_policy::model: return "model";
    case wrap_policy::layer: {
      const auto dot = name.rfind('.');
      return dot == std::string::npos ? name : name.substr(0, dot);
    }
    case wrap_policy::block: {
      const std::string prefix = blocks + ".";
      if (name.starts_with(prefix)) {
        const auto dot = name.find('.', prefix.size());
        return dot == std::string::npos ? name : name.substr(0, dot);
      }
      return after_blocks ? "head" : "embeddings";
    }
  }
  return name;
}

}  // namespace detail

class torch_zero;

namespace detail {
/// The identity at a unit's input (kind 0) or output (kind 1); its backward tells the bridge
/// that the unit's backward ends (input) or begins (output).
struct torch_zero_boundary : torch::autograd::Function<torch_zero_boundary> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch_zero* bridge, std::int64_t unit,
                               std::int64_t kind, const torch::Tensor& x) {
    ctx->saved_data["bridge"] = reinterpret_cast<std::int64_t>(bridge);
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["kind"] = kind;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

/// The bridge as the gradient hooks see it: cleared by the bridge's destructor.
struct torch_zero_link {
  explicit torch_zero_link(torch_zero* o) : owner(o) {}
  torch_zero* owner;
};

/// Runs after autograd accumulated a trainable tensor's gradient (AccumulateGrad's post hook).
struct torch_zero_hook : torch::autograd::FunctionPostHook {
  torch_zero_hook(std::shared_ptr<torch_zero_link> link, std::size_t tensor)
      : link_(std::move(link)), tensor_(tensor) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override;
  std::shared_ptr<torch_zero_link> link_;
  std::size_t tensor_;
};
}  // namespace detail

/// A torch module's parameters registered with a `zero::sharded_model` (see the file comment).
/// Construction is a collective over `comm` (plans, agrees, broadcasts). Not copyable.
class torch_zero {
 public:
  /// Registers every parameter of `module` (named_parameters order, which must be the order the
  /// forward uses the units) with a `zero::sharded_model` on `comm`. Tied parameters (one tensor
  /// under two names) share one storage. A parameter that does not require grad is frozen: held
  /// without gradient or optimizer state, never updated (kept gathered at stage 3 within
  /// `keep_frozen_bytes`). Throws errc::invalid_argument on every rank when a rank's module has
  /// a parameter that is not contiguous, not on the CPU or of an unsupported dtype (naming it),
  /// or when the plans differ (ranks whose modules freeze different parameters: the agreement
  /// names the first parameter that differs).
  torch_zero(communicator& comm, torch::nn::Module& module, const torch_zero_options& options = {})
      : comm_(comm), module_(module), options_(options), model_(comm, request(), options.model) {
    const auto& plan = model_.plan();
    for (std::size_t u = 0; u < plan.units().size(); ++u) unit_index_[plan.units()[u].name] = u;
    representative_.assign(plan.buffers().size(), npos);
    for (std::size_t p = 0; p < plan.placements().size(); ++p) {
      const auto& pl = plan.placements()[p];
      if (!pl.alias && pl.numel > 0 && representative_[pl.buffer] == npos) representative_[pl.buffer] = p;
    }
    initialise();
    open_.assign(plan.units().size(), false);
    input_boundary_.assign(plan.units().size(), false);
    expected_.assign(plan.units().size(), 0);
    arrived_.assign(plan.units().size(), 0);
    install_gradient_hooks();
  }

  torch_zero(const torch_zero&) = delete;
  torch_zero& operator=(const torch_zero&) = delete;
  /// Removes the gradient hooks (a graph that outlives this object calls nothing).
  ~torch_zero() {
    link_->owner = nullptr;
    for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
  }

  /// The runtime (plan, memory, optimizer).
  zero::sharded_model& model() noexcept { return model_; }
  const zero::sharded_model& model() const noexcept { return model_; }
  /// The parameters as registered (name, shape, dtype, tie group, unit).
  const std::vector<zero::parameter_spec>& parameters() const noexcept { return specs_; }
  /// The unit named `name` under this wrap policy, if there is one.
  std::optional<std::size_t> unit(std::string_view name) const {
    auto it = unit_index_.find(std::string(name));
    if (it == unit_index_.end()) return std::nullopt;
    return it->second;
  }

  /// `f(x)`, run as unit `name` when the wrap policy makes one of that name (else just `f(x)`):
  /// gathers it (stage 3), marks its input and output for backward, releases it after (stage 3
  /// with reshard_after_forward). A collective at stage 3 (every rank, same order).
  torch::Tensor run(std::string_view name, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& f) {
    const auto u = unit(name);
    if (!u) return f(x);
    model_.pre_forward(*u);
    bind(*u);
    const bool graph = torch::GradMode::is_enabled();
    torch::Tensor y;
    try {
      torch::Tensor in = x;
      input_boundary_[*u] = graph && x.defined() && x.requires_grad();
      if (input_boundary_[*u]) in = detail::torch_zero_boundary::apply(this, static_cast<std::int64_t>(*u), 0, x);
      y = f(in);
      if (graph && y.requires_grad()) y = detail::torch_zero_boundary::apply(this, static_cast<std::int64_t>(*u), 1, y);
    } catch (...) {
      model_.post_forward(*u);
      throw;
    }
    model_.post_forward(*u);  // releases u, or keeps it for its backward (reshard_after_forward)
    return y;
  }

  /// The backward of one micro-batch: `loss.backward()`, gradients accumulated straight into
  /// the runtime's memory unit by unit (reductions start as units finish; with
  /// accumulate_unsharded, in the last micro-batch only), then
  /// `end_backward()`. A collective.
  void backward(const torch::Tensor& loss) {
    loss.backward();
    const auto& plan = model_.plan();
    // A gradient that autograd accumulated while its unit's backward was not open (the unit
    // closed, its reduction started, or never opened) would be lost: refuse it, on every rank.
    std::string late;
    for (std::size_t i = 0; i < names_.size() && late.empty(); ++i) {
      const std::size_t w = plan.placements()[plan.placements()[i].storage].unit;
      if (!open_[w] && tensors_[alias_of_[i]].grad().defined())
        late = "the gradient of parameter '" + names_[i] + "' arrived outside the backward of its unit '" +
               plan.units()[w].name + "' (is it used outside run(\"" + plan.units()[w].name + "\", ...)?)";
    }
    agree(late);
    for (std::size_t u = plan.units().size(); u-- > 0;) {
      if (open_[u]) close(u);
    }
    for (auto& t : tensors_) t.mutable_grad() = torch::Tensor();
    model_.end_backward();
  }

  /// Gradient sync off until the guard is destroyed: the micro-batches' `backward` calls
  /// accumulate locally and the first one after the scope reduces them all
  /// (`zero::sharded_model::no_sync`; stages 2-3 need `accumulate_unsharded`). The same guard type
  /// as `torch_ddp::no_sync()`. Throws as `sharded_model::set_require_gradient_sync(false)`.
  [[nodiscard]] no_sync_guard no_sync() { return model_.no_sync(); }

  /// Checks that the module still has the registered parameters (on every rank: one all_gather
  /// of a flag), then the runtime's step (clip, update, gather). Throws errc::invalid_argument on
  /// every rank when a parameter was replaced, resized, or frozen or unfrozen, naming it.
  zero::step_result step() {
    agree(changed());
    return model_.step();
  }

  /// Points the module's parameters at the runtime's parameter memory again: every parameter at
  /// stages 0-2, the frozen ones kept gathered at stage 3 (the others exist only inside `run`,
  /// which binds the gathered copies). Needed after anything that replaces that memory: a
  /// checkpoint load (`checkpoint::load(z.model(), dir)`) may make a second copy of the state
  /// live without copying, and the module's parameters then point at freed memory until this
  /// call, `run` or `backward` rebinds them. Local; O(buffers).
  void refresh() {
    const auto& plan = model_.plan();
    for (std::size_t b = 0; b < plan.buffers().size(); ++b)
      if (plan.holds_whole(b)) point(b);
  }

  /// The first registered parameter that changed ("" when none): replaced, a new storage,
  /// another shape, requires_grad flipped, or the module's parameter list differs. Local.
  std::string changed() const {
    const auto now = module_.named_parameters(true);
    if (now.size() != names_.size())
      return "the module has " + std::to_string(now.size()) + " parameters, " + std::to_string(names_.size()) +
             " were registered (parameters changed after registration)";
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const auto& item = now[i];
      const std::string& n = names_[i];
      if (item.key() != n)
        return "parameter " + std::to_string(i) + " is now '" + item.key() + "', registered as '" + n + "'";
      const torch::Tensor& t = item.value();
      const torch::Tensor& reg = tensors_[alias_of_[i]];
      if (t.unsafeGetTensorImpl() != reg.unsafeGetTensorImpl())
        return "parameter '" + n + "' was replaced by another tensor after registration";
      if (!t.has_storage() || t.storage().unsafeGetStorageImpl() != storage_of(i))
        return "parameter '" + n + "' has new data (set_data or an in-place resize) after registration";
      if (t.requires_grad() != specs_[i].trainable)
        return "parameter '" + n + "' " + (specs_[i].trainable ? "no longer requires grad" : "requires grad now") +
               " (it was registered " + (specs_[i].trainable ? "trainable" : "frozen") +
               "; register the module again to change which parameters train)";
      if (t.sizes().vec() != sizes_[i]) return "parameter '" + n + "' changed its shape after registration";
    }
    return {};
  }

 private:
  friend struct detail::torch_zero_boundary;
  friend struct detail::torch_zero_hook;
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  /// The plan request for the module's parameters (checked here; refusals agreed across ranks).
  zero::plan_request request() {
    std::string problem;
    const auto named = module_.named_parameters(true);
    bool after_blocks = false;
    std::string first_head;  // block wrap: the first parameter after a block that is not in one
    std::vector<std::size_t> name_of_tensor;
    for (const auto& item : named) {
      const std::string& n = item.key();
      const torch::Tensor& t = item.value();
      std::size_t owner = npos;
      for (std::size_t j = 0; j < tensors_.size(); ++j)
        if (tensors_[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) owner = j;
      zero::parameter_spec s;
      s.name = n;
      for (auto d : t.sizes()) s.shape.push_back(static_cast<std::uint64_t>(d));
      // only floating parameters are trained; a plain value and flag (an optional here drew
      // g++ 12's -Wmaybe-uninitialized at -O3)
      const auto found = dtype_of_torch(t.scalar_type());
      const bool trainable_type = found.has_value() && is_floating_point(*found);
      const dtype type = trainable_type ? *found : dtype::float32;
      s.trainable = t.requires_grad();  // frozen otherwise: no gradient, no optimizer state
      if (problem.empty()) {
        if (!t.is_contiguous())
          problem = "parameter '" + n + "' is not contiguous";
        else if (!t.device().is_cpu())
          problem = "parameter '" + n + "' is on " + t.device().str() + ", the runtime's memory is the CPU's";
        else if (!trainable_type)
          problem = "parameter '" + n + "' has dtype " + std::string(c10::toString(t.scalar_type())) +
                    ", which the bridge cannot hold (float32, float64, bfloat16, float16)";
      }
      s.type = type;
      const bool in_block = n.starts_with(options_.blocks + ".");
      if (options_.wrap == wrap_policy::block) {
        if (in_block && !first_head.empty() && problem.empty())
          problem = "parameter '" + first_head + "' lies between the blocks of '" + options_.blocks +
                    "' (block wrap needs them consecutive)";
        if (in_block) after_blocks = true;
        if (!in_block && after_blocks && first_head.empty()) first_head = n;
      }
      s.unit = detail::unit_name(n, options_.wrap, options_.blocks, after_blocks);
      if (owner != npos) {
        specs_[name_of_tensor[owner]].tie_group = names_[name_of_tensor[owner]];
        s.tie_group = names_[name_of_tensor[owner]];
        alias_of_.push_back(owner);
      } else {
        alias_of_.push_back(tensors_.size());
        name_of_tensor.push_back(names_.size());
        tensors_.push_back(t);
      }
      names_.push_back(n);
      sizes_.push_back(t.sizes().vec());
      specs_.push_back(std::move(s));
    }
    // Every rank learns whether any refused, before the runtime's own agreement.
    agree(problem);
    zero::plan_request q;
    q.parameters = specs_;
    q.stage = options_.stage;
    q.precision = options_.precision;
    if (!specs_.empty() && specs_[0].type) q.precision.parameter = *specs_[0].type;
    q.accumulation_steps = options_.accumulation_steps;
    q.prefetch = options_.prefetch;
    q.prefetch_lists = options_.prefetch_lists;
    q.reshard_after_forward = options_.reshard_after_forward;
    q.max_inflight_reductions = options_.max_inflight_reductions;
    q.max_inflight_gathers = options_.max_inflight_gathers;
    q.quantization = options_.quantization;
    q.accumulate_unsharded = options_.accumulate_unsharded;
    q.keep_frozen_bytes = options_.keep_frozen_bytes;
    return q;
  }

  /// Throws on every rank when any rank has a problem: its own message there, the refusing
  /// ranks named on the others.
  void agree(const std::string& problem) {
    const int n = comm_.world_size();
    std::vector<std::uint8_t> flags(static_cast<std::size_t>(n));
    const std::uint8_t mine = problem.empty() ? 0 : 1;
    all_gather(comm_, &mine, flags.data(), 1, dtype::uint8);
    if (!problem.empty()) ringzero::detail::raise(comm_, errc::invalid_argument, "integration::torch_zero: " + problem);
    std::string ranks;
    for (int r = 0; r < n; ++r)
      if (flags[static_cast<std::size_t>(r)] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (!ranks.empty())
      ringzero::detail::raise(
          comm_, errc::invalid_argument,
          "integration::torch_zero: rank(s) " + ranks + " refused the module (see that rank's error)");
  }

  /// Initial values into the runtime (rank 0's, broadcast), then every parameter becomes a view
  /// over its buffer's storage.
  void initialise() {
    const auto& plan = model_.plan();
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const auto& pl = plan.placements()[i];
      if (pl.alias) continue;
      torch::Tensor v = tensors_[alias_of_[i]].detach().to(torch::kFloat32).contiguous().clone();
      std::span<float> values(v.data_ptr<float>(), static_cast<std::size_t>(v.numel()));
      if (options_.broadcast_from_rank0 && comm_.world_size() > 1 && !values.empty())
        broadcast(comm_, values.data(), values.data(), values.size(), dtype::float32, 0);
      model_.set_parameter(i, values);
    }
    storages_.resize(plan.buffers().size());
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      const auto& f = plan.buffers()[b];
      const std::size_t bytes = static_cast<std::size_t>(f.numel * dtype_size(f.type));
      unsigned char* data = plan.holds_whole(b) && representative_[b] != npos ? buffer_start(b) : nullptr;
      storages_[b] = c10::Storage(c10::Storage::use_byte_size_t(), bytes, c10::DataPtr(data, c10::Device(c10::kCPU)),
                                  nullptr, false);
    }
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const auto& pl = plan.placements()[i];
      if (pl.alias) continue;
      torch::Tensor& t = tensors_[alias_of_[i]];
      torch::Tensor view = torch::empty({0}, t.options().requires_grad(false));
      view.set_(storages_[pl.buffer], static_cast<std::int64_t>(pl.offset), t.sizes(), t.strides());
      t.set_data(view);
    }
  }

  const c10::StorageImpl* storage_of(std::size_t i) const {
    return storages_[model_.plan().placements()[model_.plan().placements()[i].storage].buffer].unsafeGetStorageImpl();
  }

  /// The first byte of buffer b in the runtime's memory now (its gather buffer at stage 3).
  unsigned char* buffer_start(std::size_t b) {
    const std::size_t p = representative_[b];
    const auto& pl = model_.plan().placements()[p];
    unsigned char* first = nullptr;
    visit_dtype(pl.type, [&]<class T>() {
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
        first = reinterpret_cast<unsigned char*>(model_.parameter<T>(p).data());
    });
    return first - pl.offset * dtype_size(pl.type);
  }

  /// Points the storages of unit u (and of the units it borrows) at the runtime's memory now:
  /// the gather buffers at stage 3, the parameter buffers at stages 0-2 (which a checkpoint load
  /// may have replaced).
  void bind(std::size_t u) {
    const auto& plan = model_.plan();
    for (std::size_t b : plan.units()[u].buffers) point(b);
    for (std::size_t w : plan.units()[u].borrowed)
      for (std::size_t b : plan.units()[w].buffers) point(b);
  }

  /// Points buffer b's storage at the runtime's memory now (nothing for a buffer without a
  /// parameter owning storage in it).
  void point(std::size_t b) {
    if (representative_[b] != npos)
      storages_[b].unsafeGetStorageImpl()->set_data_ptr_noswap(c10::DataPtr(buffer_start(b), c10::Device(c10::kCPU)));
  }

  /// Before the backward of unit u (its output's boundary): gathers it again into the same
  /// storages, and points its trainable parameters' .grad at the runtime's gradient memory.
  void open(std::size_t u) {
    model_.pre_backward(u);
    bind(u);
    const auto& plan = model_.plan();
    for (std::size_t p : plan.units()[u].members) {
      const auto& pl = plan.placements()[p];
      if (pl.numel == 0 || !plan.parameters()[p].trainable) continue;  // frozen: no gradient
      torch::Tensor& t = tensors_[alias_of_[p]];
      const auto& f = plan.buffers()[pl.buffer];
      void* g = nullptr;
      visit_dtype(f.gradient_type, [&]<class T>() {
        if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
          g = model_.gradient<T>(p).data();
      });
      if (!t.grad().defined() || t.grad().data_ptr() != g)
        t.mutable_grad() = torch::from_blob(g, t.sizes(), t.options().requires_grad(false));
    }
    open_[u] = true;
    arrived_[u] = 0;
  }

  /// Registers, on every distinct trainable tensor, a hook that runs after autograd accumulated
  /// its gradient (`gradient_accumulated`).
  void install_gradient_hooks() {
    const auto& plan = model_.plan();
    unit_of_tensor_.assign(tensors_.size(), npos);
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const std::size_t j = alias_of_[i];
      if (!tensors_[j].requires_grad() || unit_of_tensor_[j] != npos) continue;
      const std::size_t w = plan.placements()[plan.placements()[i].storage].unit;
      unit_of_tensor_[j] = w;
      expected_[w] += 1;
      auto accumulator = torch::autograd::impl::grad_accumulator(tensors_[j]);
      if (!accumulator) continue;  // not a leaf: its unit ends at its input boundary or backward()'s end
      hooks_.emplace_back(accumulator, accumulator->add_post_hook(std::make_unique<detail::torch_zero_hook>(link_, j)));
    }
  }

  /// After autograd added tensor j's gradient: the last gradient of an open unit that has no
  /// input boundary in this pass (its input needs no gradient, as token ids) ends its backward,
  /// as FSDP's post-accumulate hooks do; a unit with an input boundary ends there.
  void gradient_accumulated(std::size_t j) {
    const std::size_t w = unit_of_tensor_[j];
    if (!open_[w] || input_boundary_[w]) return;
    if (++arrived_[w] == expected_[w]) close(w);
  }

  /// After the backward of unit u (its input's boundary, or the end of backward): its gradients
  /// are final; their views are dropped (the memory goes to the reduction).
  void close(std::size_t u) {
    open_[u] = false;
    model_.post_backward(u);
    const auto& plan = model_.plan();
    for (std::size_t p : plan.units()[u].members) {
      const auto& pl = plan.placements()[p];
      if (plan.placements()[pl.storage].unit == u) tensors_[alias_of_[p]].mutable_grad() = torch::Tensor();
    }
  }

  communicator& comm_;
  torch::nn::Module& module_;
  torch_zero_options options_;
  std::vector<std::string> names_;                ///< registered names, in order
  std::vector<std::vector<std::int64_t>> sizes_;  ///< their shapes
  std::vector<std::size_t> alias_of_;             ///< per name: index into tensors_
  std::vector<torch::Tensor> tensors_;            ///< distinct parameter tensors
  std::vector<zero::parameter_spec> specs_;
  zero::sharded_model model_;
  std::map<std::string, std::size_t, std::less<>> unit_index_;
  std::vector<std::size_t> representative_;  ///< per buffer: a parameter owning storage in it
  std::vector<c10::Storage> storages_;       ///< per buffer: the storage the parameters view
  std::vector<bool> open_;                   ///< unit's backward begun, not ended
  std::vector<bool> input_boundary_;         ///< unit's last run() marked its input for backward
  std::vector<std::size_t> expected_;        ///< per unit: distinct trainable tensors it owns
  std::vector<std::size_t> arrived_;         ///< per unit: their gradients accumulated in this backward
  std::vector<std::size_t> unit_of_tensor_;  ///< per distinct tensor: the unit owning it (npos: frozen)
  std::shared_ptr<detail::torch_zero_link> link_ = std::make_shared<detail::torch_zero_link>(this);
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
};

inline torch::autograd::variable_list detail::torch_zero_boundary::backward(torch::autograd::AutogradContext* ctx,
                                                                            torch::autograd::variable_list grads) {
  auto* bridge = reinterpret_cast<torch_zero*>(ctx->saved_data["bridge"].toInt());
  const auto u = static_cast<std::size_t>(ctx->saved_data["unit"].toInt());
  if (ctx->saved_data["kind"].toInt() == 1) {
    if (!bridge->open_[u]) bridge->open(u);
  } else if (bridge->open_[u]) {
    bridge->close(u);
  }
  return {torch::Tensor(), torch::Tensor(), torch::Tensor(), grads[0]};
}

inline torch::autograd::variable_list detail::torch_zero_hook::operator()(
    const torch::autograd::variable_list& outputs, const torch::autograd::variable_list& /*inputs*/) {
  if (link_->owner != nullptr) link_->owner->gradient_accumulated(tensor_);
  return outputs;
}

}  // namespace ringzero::integration
