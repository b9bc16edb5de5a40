#pragma once
// Example 04's strategies (see libtorch_gpt.cpp): the options, what a run reports, and the
// distribution strategies behind one interface: `zero_training` (ZeRO stages 1-3 through
// `integration::torch_zero`) and `ddp_training` (DDP through `integration::torch_ddp` and
// torch::optim::AdamW, as a PyTorch user writes it). The training loop, the report and `main`
// are in libtorch_gpt.cpp.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "gpt_model.hpp"
#include "heap_usage.hpp"
#include "launcher.hpp"
#include "replica_checks.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/integration/torch_ddp.hpp"
#include "ringzero/integration/torch_zero.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/verify_replicas.hpp"
#include "run_ranks.hpp"

namespace rz = ringzero;
namespace ex = ringzero::examples;
namespace ck = ringzero::checkpoint;
using clock_type = std::chrono::steady_clock;

namespace gpt_example {

struct options {
  int ranks = 2;
  std::string strategy = "zero3";
  std::string wrap = "block";
  int steps = 400;
  std::int64_t batch = 16;  // sequences per global batch
  gpt::config model{};
  double lr = 2e-3;
  double clip = 1.0;
  std::uint64_t seed = 1234;
  bool bf16 = false;
  int accumulation = 1;                // --accumulation-steps: micro-batches per step
  bool accumulate_unsharded = false;   // --accumulate-unsharded: zero2-3 reduce once per step
  std::string reshard = "all";         // --reshard-after-forward: all, except_last or none
  bool reshard_after_backward = true;  // --no-reshard-after-backward: zero3 keeps units across micro-batches
  int max_inflight_gathers = 0;        // --max-inflight-gathers: zero3's bound on units gathered at once (0: none)
  int generate = 240;
  int print_every = 10;
  std::string data = "/usr/share/games/fortunes";
  std::string json_path;
  std::string checkpoint_dir;  // --checkpoint: save here every --checkpoint-every steps and at the end
  int checkpoint_every = 0;
  int keep_checkpoints = 0;          // --keep-checkpoints: keep only the newest N (0: all)
  std::string resume_dir;            // --resume: continue from the newest checkpoint here
  std::uint64_t check_replicas = 0;  // --check-replicas N: verify_replicas every N steps
  std::string backend = "local";     // --backend local (threads) or mpi (one rank per process)
  bool pin = true;                   // local backend: pin rank r's thread to core r
  double link_gbps = 0;              // --link-gbps (mpi): pace the sends
  std::string quantize_weights = "none", quantize_gradients = "none";
  std::string keep_frozen = "all";  // --keep-frozen: stage 3's frozen parameters kept gathered (bytes or all)
};

int stage_of(const std::string& strategy) {
  static const std::map<std::string, int> stages{{"zero1", 1}, {"zero2", 2}, {"zero3", 3}};
  return stages.at(strategy);
}

rz::integration::wrap_policy wrap_of(const std::string& w) {
  if (w == "layer") return rz::integration::wrap_policy::layer;
  if (w == "model") return rz::integration::wrap_policy::model;
  return rz::integration::wrap_policy::block;
}

struct result {
  std::vector<double> losses;
  std::vector<double> step_seconds;
  bool ddp = false;                    // --strategy ddp: the reducer's memory below, no plan
  rz::zero::memory_breakdown planned;  // zero: the plan's; ddp: the state's tensors, gradients unpadded
  std::uint64_t allocated_peak = 0,
                allocated_now = 0;   // memory_allocated, all spaces (zero: the runtime; ddp: the reducer)
  rz::zero::memory_breakdown asked;  // the same now, by what asked for it (memory_category)
  std::uint64_t scratch = 0;         // ... and outside the model state (the step's scalars)
  std::size_t buckets = 0;           // ddp: the reducer's gradient buckets
  std::vector<rz::zero::parameter_spec> parameters;
  std::string sample;
  double tokens_per_second = 0;
  int first_step = 0;          // steps done before this run (--resume)
  std::string replica_checks;  // --check-replicas: what the checks found and cost
  double sent_per_step = 0;    // bytes rank 0 sent per step, measured (communicator::traffic)
  // zero: the plan's collectives (ring), with and without quantization; ddp: the all_reduce of
  // the gradient buckets (ring), twice
  double planned_per_step = 0, unquantized_per_step = 0;
  std::uint64_t trainable = 0, total = 0;          // parameter elements (unique storage)
  std::uint64_t frozen_kept_bytes = 0;             // stage 3: frozen buffers held whole (--keep-frozen)
  std::optional<rz::zero::gather_timing> gathers;  // zero3: the gathers' time on the streams and the waits for them
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One rank's distribution strategy as the training loop uses it: ZeRO stages 1-3 through
/// `integration::torch_zero` (`zero_training`), or DDP as a PyTorch user writes it, through
/// `integration::torch_ddp` with the module's own parameters and torch::optim::AdamW
/// (`ddp_training`). Construction, `micro_batch`, `step`, `forward` (stage 3 gathers) and the
/// checkpoint calls are collectives: every rank calls them in the same order.
class strategy_training {
 public:
  virtual ~strategy_training() = default;
  /// Logits [B, T, vocab] of token ids [B, T].
  virtual torch::Tensor forward(const torch::Tensor& ids) = 0;
  /// One micro-batch: the forward of `ids`, `loss_of(logits)`, its backward; returns the loss.
  /// `last`: the step's last micro-batch. Where the gradients are full (ddp, zero1,
  /// --accumulate-unsharded), the micro-batches before the last run under no_sync: nothing is
  /// reduced until the last.
  virtual double micro_batch(const torch::Tensor& ids,
                             const std::function<torch::Tensor(const torch::Tensor&)>& loss_of, bool last) = 0;
  /// Clips the gradients (--clip), updates the parameters, zeroes the gradients.
  virtual void step() = 0;
  /// verify_replicas of what the ranks hold alike (--check-replicas).
  virtual rz::replica_check verify_replicas() = 0;
  /// Loads the newest checkpoint in `dir`: parameters, optimizer states, step count.
  virtual ck::training_progress resume(const std::string& dir) = 0;
  /// `checkpointer::open` for this state (the lock, leftovers removed, room checked).
  virtual void open(ck::checkpointer& saver) = 0;
  /// Saves the state after `steps_done` optimizer steps.
  virtual void save(ck::checkpointer& saver, ck::training_progress progress, int steps_done) = 0;
  /// Rank 0's report: parameters, memory, the bytes a step should send.
  virtual void report(result& r) = 0;
};

/// ZeRO stage 1-3 (`--strategy zeroN`): the runtime holds the state; the module's parameters
/// view its memory, and the forward runs each part through `torch_zero::run`.
class zero_training final : public strategy_training {
 public:
  zero_training(rz::communicator& comm, gpt::model& net, const options& o) : net_(net), z_(comm, net, zero_options(o)) {
    z_.model().set_reshard_after_backward(o.reshard_after_backward);  // step() releases what is kept
  }

  torch::Tensor forward(const torch::Tensor& ids) override { return net_.forward(ids, z_); }

  double micro_batch(const torch::Tensor& ids, const std::function<torch::Tensor(const torch::Tensor&)>& loss_of,
                     bool last) override {
    std::optional<rz::no_sync_guard> no_sync;
    if (!last && !z_.model().plan().sharded_gradients()) no_sync.emplace(z_.model());
    const torch::Tensor loss = loss_of(net_.forward(ids, z_));
    z_.backward(loss);
    return loss.item<double>();
  }

  void step() override { z_.step(); }

  rz::replica_check verify_replicas() override { return rz::zero::verify_replicas(z_.model()); }

  ck::training_progress resume(const std::string& dir) override {
    // Resharded to this run's --ranks and --strategy, in place: the model was just made, and the
    // reads go straight into its memory (no second copy of the state).
    ck::load_options in_place;
    in_place.in_place = true;
    const ck::training_progress p = ck::load(z_.model(), dir, in_place);
    z_.refresh();  // the module's parameters onto the loaded memory
    z_.model().reset_memory_peak();
    return p;
  }

  void open(ck::checkpointer& saver) override { saver.open(z_.model()); }

  void save(ck::checkpointer& saver, ck::training_progress progress, int /*steps_done*/) override {
    saver.save(z_.model(), std::move(progress));  // the step count comes from the model
  }

  void report(result& r) override {
    const rz::zero::sharded_model& m = z_.model();
    r.planned = m.plan().memory();
    for (auto space : {rz::primitive::memory_space::host, rz::primitive::memory_space::pinned_host,
                       rz::primitive::memory_space::device}) {
      r.allocated_peak += m.memory_allocated(space).peak;
      r.allocated_now += m.memory_allocated(space).current;
      const auto now = [&](rz::zero::memory_category what) { return m.memory_allocated(space, what).current; };
      r.asked.parameters += now(rz::zero::memory_category::parameters);
      r.asked.gradients += now(rz::zero::memory_category::gradients);
      r.asked.master_weights += now(rz::zero::memory_category::master_weights);
      r.asked.optimizer_states += now(rz::zero::memory_category::optimizer_states);
      r.asked.communication_buffers += now(rz::zero::memory_category::communication_buffers);
      r.scratch += now(rz::zero::memory_category::scratch);
    }
    r.parameters = z_.parameters();
    r.trainable = m.plan().trainable_elements();
    r.total = m.plan().parameter_elements();
    r.frozen_kept_bytes = m.plan().kept_frozen_bytes();
    if (m.plan().request().stage == 3) r.gathers = z_.model().gather_times();  // waits for the streams
    for (rz::zero::traffic_entry e : m.plan().traffic()) {
      r.planned_per_step += e.ring_bytes_sent();
      e.bytes = e.unquantized_bytes;  // the same entry in full precision
      r.unquantized_per_step += e.ring_bytes_sent();
    }
  }

 private:
  static rz::integration::torch_zero_options zero_options(const options& o) {
    rz::integration::torch_zero_options zo;
    zo.stage = stage_of(o.strategy);
    zo.wrap = wrap_of(o.wrap);
    zo.reshard_after_forward = *rz::zero::parse_reshard_policy(o.reshard);  // checked by the option
    zo.max_inflight_gathers = o.max_inflight_gathers;
    if (o.bf16) zo.precision = rz::zero::precision::bfloat16_adam();
    zo.model.optimizer.kind = rz::zero::optimizer_kind::adamw;
    zo.model.optimizer.lr = o.lr;
    zo.model.optimizer.weight_decay = 0;
    zo.model.max_grad_norm = o.clip;
    zo.quantization.weights = *rz::zero::parse_quantized_bits(o.quantize_weights);  // checked by the option
    zo.quantization.gradients = *rz::zero::parse_quantized_bits(o.quantize_gradients);
    zo.keep_frozen_bytes = o.keep_frozen == "all" ? rz::zero::keep_all_frozen : std::stoull(o.keep_frozen);
    zo.accumulation_steps = o.accumulation;
    zo.accumulate_unsharded = o.accumulate_unsharded;
    zo.model.time_gathers = zo.stage == 3;  // two event records per gather and wait: the hidden share
    return zo;
  }

  gpt::model& net_;
  rz::integration::torch_zero z_;
};

/// DDP (`--strategy ddp`) as a PyTorch user writes it: the module keeps its own parameters,
/// `integration::torch_ddp` makes their `.grad()` views of the gradient reducer's buckets and
/// all_reduces the buckets during backward (frozen parameters skipped), and torch::optim::AdamW
/// updates every replica alike, after torch::nn::utils::clip_grad_norm_. With --bf16 the module
/// is bfloat16 and AdamW updates float32 master copies, copied back after each step (as the
/// runtime's bfloat16_adam precision does). Checkpoints are ringzero's DDP checkpoints
/// (`checkpoint::replicated_state`: the parameters under every name, the tied output layer
/// included, the master weights, AdamW's exp_avg and exp_avg_sq under PyTorch's names, the step
/// count), so a ZeRO checkpoint of the same model resumes here and the reverse.
class ddp_training final : public strategy_training {
 public:
  ddp_training(rz::communicator& comm, gpt::model& net, const options& o) : net_(net), ddp_(comm, net), clip_(o.clip) {
    // The distinct parameters, as PyTorch's parameters() gives them (a tensor under two names
    // once, under its first name): AdamW must see the tied embedding once.
    std::vector<const void*> seen;
    for (const auto& item : net.named_parameters(/*recurse=*/true)) {
      const void* impl = item.value().unsafeGetTensorImpl();
      if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
      seen.push_back(impl);
      if (item.value().requires_grad()) trained_.push_back({item.key(), item.value(), {}});
    }
    std::vector<torch::Tensor> optimized;
    for (auto& t : trained_) {
      if (t.parameter.scalar_type() != torch::kFloat32) {  // --bf16: float32 masters
        t.master = t.parameter.detach().to(torch::kFloat32).clone();
        t.master.mutable_grad() = torch::zeros_like(t.master);
      }
      optimized.push_back(t.optimized());
    }
    optimizer_ = std::make_unique<torch::optim::AdamW>(optimized, torch::optim::AdamWOptions(o.lr).weight_decay(0));
    // AdamW makes a parameter's state at its first step; made here, a checkpoint can view it
    // from the start. libtorch 1.13 keys the state by the TensorImpl's address as text (what
    // AdamW::step looks up); step() checks that no second state appeared.
    for (const torch::Tensor& t : optimized) {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->exp_avg(torch::zeros_like(t, torch::MemoryFormat::Preserve));
      state->exp_avg_sq(torch::zeros_like(t, torch::MemoryFormat::Preserve));
      optimizer_->state()[c10::guts::to_string(t.unsafeGetTensorImpl())] = std::move(state);
    }
    register_checkpoint_state(o);
    ddp_.zero_grad();
  }

  torch::Tensor forward(const torch::Tensor& ids) override {
    gpt::direct_runner direct;
    return net_.forward(ids, direct);
  }

  double micro_batch(const torch::Tensor& ids, const std::function<torch::Tensor(const torch::Tensor&)>& loss_of,
                     bool last) override {
    std::optional<rz::no_sync_guard> no_sync;
    if (!last) no_sync.emplace(ddp_.no_sync());
    const torch::Tensor loss = loss_of(forward(ids));
    loss.backward();
    ddp_.finish();  // synchronised: the averaged gradients in .grad(); under no_sync: accumulated
    return loss.item<double>();
  }

  void step() override {
    torch::NoGradGuard no_grad;
    for (auto& t : trained_)
      if (t.master.defined()) t.master.mutable_grad().copy_(t.parameter.grad());
    std::vector<torch::Tensor> optimized;
    for (auto& t : trained_) optimized.push_back(t.optimized());
    if (clip_ > 0) torch::nn::utils::clip_grad_norm_(optimized, clip_);
    optimizer_->step();
    for (auto& t : trained_)
      if (t.master.defined()) t.parameter.copy_(t.master);
    ddp_.zero_grad();
    if (optimizer_->state().size() != trained_.size())
      throw rz::error(rz::errc::internal,
                      "torch::optim::AdamW made states of its own: the example's states (made "
                      "for checkpoints) are not the ones it updates (another libtorch version?)");
  }

  rz::replica_check verify_replicas() override { return rz::ddp::verify_replicas(ddp_.reducer()); }

  ck::training_progress resume(const std::string& dir) override {
    const ck::training_progress p = ck::load(ddp_.reducer(), state_, dir);  // any world size, or a ZeRO checkpoint
    for (auto& [key, state] : optimizer_->state())
      static_cast<torch::optim::AdamWParamState&>(*state).step(static_cast<std::int64_t>(p.optimizer_steps));
    ddp_.zero_grad();  // the gradient views onto the bucket layout the load restored
    return p;
  }

  void open(ck::checkpointer& saver) override { saver.open(ddp_.reducer(), state_); }

  void save(ck::checkpointer& saver, ck::training_progress progress, int steps_done) override {
    progress.optimizer_steps = static_cast<std::uint64_t>(steps_done);
    saver.save(ddp_.reducer(), state_, std::move(progress));
  }

  void report(result& r) override {
    r.ddp = true;
    rz::ddp::gradient_reducer& reducer = ddp_.reducer();
    for (auto space : {rz::primitive::memory_space::host, rz::primitive::memory_space::pinned_host,
                       rz::primitive::memory_space::device}) {
      r.allocated_peak += reducer.memory_allocated(space).peak;
      r.allocated_now += reducer.memory_allocated(space).current;
    }
    r.asked.gradients = r.allocated_now;  // the buckets are the gradients (.grad() views them)
    r.buckets = reducer.bucket_count();
    const int n = reducer.comm().world_size();
    for (const rz::ddp::reducer_bucket_info& b : reducer.buckets()) {
      r.planned.gradients += b.bytes;
      // One ring all_reduce per bucket and step (its padding included): 2 (n - 1) / n of it.
      const auto bytes = static_cast<double>(b.count * rz::dtype_size(b.type));
      r.planned_per_step += n > 1 ? 2.0 * bytes * (n - 1) / n : 0.0;
    }
    r.unquantized_per_step = r.planned_per_step;
    std::vector<const void*> seen;
    std::vector<std::string> owner;
    for (const auto& item : net_.named_parameters(/*recurse=*/true)) {
      const torch::Tensor& t = item.value();
      const auto at = std::find(seen.begin(), seen.end(), t.unsafeGetTensorImpl());
      rz::zero::parameter_spec s;
      s.name = item.key();
      for (std::int64_t d : t.sizes()) s.shape.push_back(static_cast<std::uint64_t>(d));
      s.type = rz::integration::dtype_of_torch(t.scalar_type());
      s.trainable = t.requires_grad();
      if (at != seen.end()) {  // a tied name: its tie group is the first name's
        s.tie_group = owner[static_cast<std::size_t>(at - seen.begin())];
        for (auto& p : r.parameters)
          if (p.name == s.tie_group) p.tie_group = s.tie_group;
      } else {
        seen.push_back(t.unsafeGetTensorImpl());
        owner.push_back(item.key());
        const auto elements = static_cast<std::uint64_t>(t.numel());
        r.total += elements;
        if (s.trainable) r.trainable += elements;
        r.planned.parameters += elements * t.element_size();
      }
      r.parameters.push_back(std::move(s));
    }
    for (const auto& t : trained_) {
      if (t.master.defined()) r.planned.master_weights += static_cast<std::uint64_t>(t.master.numel()) * 4;
      r.planned.optimizer_states += 2 * static_cast<std::uint64_t>(t.optimized().numel()) * 4;  // exp_avg, exp_avg_sq
    }
    r.asked.parameters = r.planned.parameters;  // the module's own tensors, as they are
    r.asked.master_weights = r.planned.master_weights;
    r.asked.optimizer_states = r.planned.optimizer_states;
  }

 private:
  struct trained_parameter {
    std::string name;
    torch::Tensor parameter;  // the module's
    torch::Tensor master;     // --bf16: its float32 master copy, which AdamW updates
    const torch::Tensor& optimized() const { return master.defined() ? master : parameter; }
  };

  /// `values` of `t` (float32 or bfloat16: the module's dtypes here) as a span of ringzero's type.
  template <class Use>
  static void with_values(const torch::Tensor& t, Use&& use) {
    const auto n = static_cast<std::size_t>(t.numel());
    if (t.scalar_type() == torch::kFloat32)
      use(std::span<float>(t.data_ptr<float>(), n));
    else if (t.scalar_type() == torch::kBFloat16)
      use(std::span<rz::bfloat16>(static_cast<rz::bfloat16*>(t.data_ptr()), n));
    else
      throw rz::error(rz::errc::invalid_argument,
                      fmt::format("a parameter of dtype {}: the example's checkpoints hold float32 and bfloat16",
                                  c10::toString(t.scalar_type())));
  }

  static std::vector<std::uint64_t> shape_of(const torch::Tensor& t) {
    std::vector<std::uint64_t> shape;
    for (std::int64_t d : t.sizes()) shape.push_back(static_cast<std::uint64_t>(d));
    return shape;
  }

  /// The checkpoint's view of this rank's state (nothing copied): every parameter under every
  /// name (a tied one twice: a ZeRO checkpoint names both, and a ZeRO model loading this one
  /// needs both), then per trainable parameter its master weights (--bf16) and AdamW's states.
  void register_checkpoint_state(const options& o) {
    for (const auto& item : net_.named_parameters(/*recurse=*/true))
      with_values(item.value(), [&](auto values) { state_.add_parameter(item.key(), values, shape_of(item.value())); });
    for (const auto& t : trained_) {
      if (t.master.defined())
        state_.add_master(t.name,
                          std::span<float>(t.master.data_ptr<float>(), static_cast<std::size_t>(t.master.numel())),
                          shape_of(t.master));
      auto& s = static_cast<torch::optim::AdamWParamState&>(
          *optimizer_->state().at(c10::guts::to_string(t.optimized().unsafeGetTensorImpl())));
      int k = 0;
      for (auto [state_name, tensor] : {std::pair{"exp_avg", s.exp_avg()}, std::pair{"exp_avg_sq", s.exp_avg_sq()}})
        state_.add_optimizer_state(t.name, k++, state_name,
                                   std::span<float>(tensor.data_ptr<float>(), static_cast<std::size_t>(tensor.numel())),
                                   shape_of(tensor));
    }
    state_.set_optimizer({{"kind", "adamw"},
                          {"states", 2},
                          {"lr", o.lr},
                          {"weight_decay", 0.0},
                          {"beta1", 0.9},
                          {"beta2", 0.999},
                          {"eps", 1e-8},
                          {"implementation", "torch::optim::AdamW"}});
  }

  gpt::model& net_;
  rz::integration::torch_ddp ddp_;
  double clip_;
  std::vector<trained_parameter> trained_;  // the trainable parameters, distinct, in named_parameters() order
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  ck::replicated_state state_;
};

}  // namespace gpt_example
