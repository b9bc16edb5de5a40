#pragma once
/// @file
/// `gradient_reducer`: data-parallel gradient averaging with buckets that are reduced while
/// backward is still running (the reducer of PyTorch's DistributedDataParallel, over any
/// `ringzero::communicator`).
///
/// Construction is collective (parameters registered, agreed across ranks, broadcast from
/// rank 0, assigned to buckets); each step, `mark_ready(i)` hands completed buckets to the
/// communication hook while backward goes on, and `finish()` leaves averaged gradients in
/// place. Options: gradient views into bucket memory, `no_sync` accumulation, uneven inputs
/// (`join`), reproducible mode, CUDA device memory. Errors abort the communicator so that peers
/// fail promptly instead of hanging. Thread semantics: driven by the training thread only;
/// reductions run on the communicator's progress thread (or its CUDA stream).
/// The manual (life of a reducer, memory, accumulation, join, errors, determinism, device
/// memory): docs/ddp.md, "The reducer in detail".

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/collective/agreement.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/broadcast.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/fnv1a.hpp"
#include "ringzero/ddp/allreduce_hook.hpp"
#include "ringzero/ddp/bucket_assignment.hpp"
#include "ringzero/ddp/bucket_memory.hpp"
#include "ringzero/ddp/comm_hook.hpp"
#include "ringzero/ddp/gradient_bucket.hpp"
#include "ringzero/ddp/interval_union.hpp"
#include "ringzero/ddp/rank_flags.hpp"
#include "ringzero/ddp/reducer_options.hpp"
#include "ringzero/ddp/reproducible_accumulation.hpp"
#include "ringzero/no_sync.hpp"

namespace ringzero::ddp {

namespace detail {

/// Keeps `memory` alive until the process exits. Used for buffers of a reducer that failed
/// while collectives were in flight: on zero-copy backends a peer may still be reading them
/// after this rank's wait was aborted, so they must never be freed (a deliberate, bounded leak
/// on an error path).
inline void retire_after_abort(bucket_storage memory) {
  if (!memory) return;
  static std::mutex mutex;
  static std::vector<bucket_storage>* graveyard = new std::vector<bucket_storage>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  graveyard->push_back(std::move(memory));
}

/// Waits for `w` and rethrows its error, yielding the core while it polls: the operation runs on
/// the communicator's progress thread, which may share this core (pinned rank threads), so a
/// busy spin would only delay it. After `yield_for` the wait blocks (work::wait).
inline void await_work(const work& w, std::chrono::microseconds yield_for = std::chrono::microseconds(2000)) {
  if (!w.test()) {
    const auto until = std::chrono::steady_clock::now() + yield_for;
    for (unsigned i = 1; !w.test(); ++i) {
      if ((i & 31u) == 0 && std::chrono::steady_clock::now() >= until) break;
      std::this_thread::yield();
    }
  }
  w.wait();
}

}  // namespace detail

/// The bucketed gradient reducer. The whole contract: docs/ddp.md, "The reducer in detail".
class gradient_reducer {
 public:
  /// What `no_sync()` returns: ringzero::no_sync_guard (ringzero/no_sync.hpp), the one guard type
  /// of the reducer and the sharded runtime.
  using no_sync_guard = ringzero::no_sync_guard;

  /// Registers `parameters` on `comm` (collective; see the file comment).
  /// Errors, raised on every rank (errc::invalid_argument for bad local arguments, naming the
  /// rank and parameter; errc::contract_mismatch when ranks registered different parameter sets
  /// or options, naming each rank's value): null buffers with a non-zero count, unknown dtypes,
  /// overflowing sizes, empty bucket limits, a bad alignment; plus any error of the collectives.
  gradient_reducer(communicator& comm, std::vector<reducer_parameter> parameters, reducer_options options = {})
      : comm_(comm), memory_(bucket_memory::of(comm)), params_(std::move(parameters)), options_(std::move(options)) {
    if (!options_.hook) options_.hook = std::make_shared<allreduce_hook>();
    uncaught_at_construction_ = std::uncaught_exceptions();
    const std::string problem = validate_locally();
    check_agreement(problem);
    const std::size_t n = params_.size();
    ready_.assign(n, 0);
    ready_order_.reserve(n);
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = n - 1 - i;  // reverse registration order
    install_layout(plan(order), /*carry_gradients=*/false);
    if (options_.broadcast_parameters) broadcast_parameters(0);
    for (auto& b : buckets_) memory_.zero(b.storage.data(), b.bytes_allocated);
    if (options_.join || options_.reproducible) flags_.allocate(memory_, comm_.world_size(), &memory_counter_);
  }

  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;

  /// Waits for reductions still in flight (their errors are swallowed). When destroyed during
  /// exception unwinding with reductions in flight, first aborts the communicator so that the
  /// wait cannot hang on peers that will never arrive.
  ~gradient_reducer() {
    bool in_flight = !agreement_.test();
    for (auto& b : buckets_) in_flight = in_flight || !b.pending_work.test();
    const bool unwinding = in_flight && std::uncaught_exceptions() > uncaught_at_construction_;
    if (unwinding)
      ringzero::detail::transport_of(comm_).abort(
          "gradient_reducer destroyed during exception unwinding with reductions in flight");
    try {
      agreement_.wait();
    } catch (...) {}
    for (auto& b : buckets_) {
      try {
        b.pending_work.wait();
      } catch (...) {}
    }
    if (unwinding || !failure_.empty()) {
      // Peers of an aborted collective may still read this rank's buffers (zero-copy backends).
      for (auto& b : buckets_) detail::retire_after_abort(std::move(b.storage));
      detail::retire_after_abort(flags_.release());
      detail::retire_after_abort(std::move(control_storage_));
    } else if (memory_.is_device()) {
      try {
        memory_.synchronize();  // device work still reading the buckets finishes before they are freed
      } catch (...) {}
    }
  }

  // ---- layout ---------------------------------------------------------------------------

  /// Number of registered parameters.
  std::size_t parameter_count() const noexcept { return params_.size(); }
  /// Parameter i's name (reducer_parameter::name, may be empty). Throws std::out_of_range.
  const std::string& parameter_name(std::size_t i) const { return params_.at(i).name; }
  /// A host copy of parameter i's values (device memory: copied on the communicator's stream,
  /// which the trainer's own stream must have reached). Between steps; errc::invalid_argument
  /// (aborting, as every failure here does) for i out of range or null `reducer_parameter::data`.
  std::vector<unsigned char> read_values(std::size_t i);
  /// Number of buckets in the current layout.
  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  /// The current layout, bucket by bucket in reduction order.
  std::vector<reducer_bucket_info> buckets() const {
    std::vector<reducer_bucket_info> out;
    out.reserve(buckets_.size());
    for (const auto& b : buckets_) out.push_back(b.info);
    return out;
  }
  /// The bucket layout as an order of the parameters (bucket by bucket in reduction order, each
  /// bucket's parameters in order): `assign_buckets` with this order gives the current layout
  /// again. With `layout_rebuilt()`, what a checkpoint records so that a resumed run reduces in
  /// the same buckets (the bucket boundaries decide the reduction's chunks, hence the bits).
  std::vector<std::size_t> layout_order() const {
    std::vector<std::size_t> order;
    order.reserve(params_.size());
    for (const auto& b : buckets_) order.insert(order.end(), b.info.parameters.begin(), b.info.parameters.end());
    return order;
  }
  /// True once the one rebuild of the buckets has happened (or `restore_layout` said so).
  bool layout_rebuilt() const noexcept { return rebuilt_; }
  /// False between the first gradient of a synchronised step (`mark_ready`) and `finish()`, and
  /// inside a no_sync accumulation window (`accumulating()`): the middle of a step, where a
  /// checkpoint cannot be saved or loaded (as `zero::sharded_model::between_steps`).
  bool between_steps() const noexcept { return !step_open_ && !accumulating_; }
  /// True from a micro-batch under no_sync (a `mark_ready` / `mark_unused` or a `finish()` there)
  /// until the synchronised `finish()` that reduces the accumulated gradients, or `join()`: the
  /// trainer's gradients then hold micro-batches computed with the current parameters.
  bool accumulating() const noexcept { return accumulating_; }
  /// Installs the layout that `order` (a `layout_order()` of a reducer with the same parameters
  /// and options) gives, and marks the rebuild done when `rebuilt` (a checkpoint restore).
  /// Between steps only. Local: every rank must pass the same values. Throws
  /// errc::invalid_argument (aborting the communicator, as every failure here does) for an
  /// order that is not a permutation of the parameters, or in the middle of a step.
  void restore_layout(std::span<const std::size_t> order, bool rebuilt) {
    check_usable();
    if (step_open_) fail(errc::invalid_argument, "restore_layout called in the middle of a step (call finish() first)");
    std::vector<bucket_plan> plans;
    try {
      plans = plan(std::vector<std::size_t>(order.begin(), order.end()));
    } catch (const error& e) { fail(errc::invalid_argument, "restore_layout: " + e.message()); }
    bool same = plans.size() == buckets_.size();
    for (std::size_t k = 0; same && k < plans.size(); ++k) same = plans[k].tensors == buckets_[k].info.parameters;
    if (!same) {
      install_layout(plans, /*carry_gradients=*/options_.gradient_as_bucket_view);
      ++generation_;
    }
    rebuilt_ = rebuilt;
    if (rebuilt_) {
      ready_order_.clear();
      ready_order_.shrink_to_fit();
    }
  }
  /// Increases each time the layout changes (the rebuild): older `gradient` views are invalid.
  std::uint64_t layout_generation() const noexcept { return generation_; }
  /// The communicator.
  communicator& comm() noexcept { return comm_; }
  /// The options in use (the hook filled in).
  const reducer_options& options() const noexcept { return options_; }

  /// Gradient `i`: in view mode the view into bucket memory (valid for this layout generation),
  /// else the registered buffer; a device pointer on device memory. Throws
  /// errc::invalid_argument for an index out of range.
  void* gradient(std::size_t i) {
    if (i >= params_.size())
      raise(errc::invalid_argument, "gradient(" + std::to_string(i) + "): index out of range (" +
                                        std::to_string(params_.size()) + " parameters registered)");
    if (!options_.gradient_as_bucket_view) return params_[i].grad;
    const bucket& b = buckets_[bucket_of_[i]];
    return static_cast<std::byte*>(b.storage.data()) + offset_of_[i] * dtype_size(b.info.type);
  }

  /// Typed `gradient(i)`; throws errc::invalid_argument when `T` is not the parameter's dtype.
  template <element_type T>
  std::span<T> gradient_span(std::size_t i) {
    void* p = gradient(i);
    if (dtype_of<T> != params_[i].type)
      raise(errc::invalid_argument, "gradient_span: parameter " + describe(i) + " is " +
                                        std::string(dtype_name(params_[i].type)) + ", not " +
                                        std::string(dtype_name(dtype_of<T>)));
    return {static_cast<T*>(p), static_cast<std::size_t>(params_[i].count)};
  }

  // ---- synchronisation mode -------------------------------------------------------------

  /// Turns gradient synchronisation off (accumulation micro-steps) or back on. Only between
  /// steps; throws errc::invalid_argument in the middle of a step.
  void set_require_gradient_sync(bool on) {
    if (step_open_ && on != require_sync_)
      fail(errc::invalid_argument, "set_require_gradient_sync called in the middle of a step (call finish() first)");
    if (options_.reproducible && unsynced_marks_ > 0 && on != require_sync_)
      fail(errc::invalid_argument,
           "set_require_gradient_sync called in the middle of an accumulation micro-step (reproducible mode: call "
           "finish() after each micro-batch first)");
    require_sync_ = on;
  }
  /// True when steps communicate (the default).
  bool require_gradient_sync() const noexcept { return require_sync_; }

  /// Scope of accumulation steps: until the guard is destroyed, steps do not communicate
  /// (PyTorch's `DistributedDataParallel.no_sync()`). Only between steps.
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(*this); }

  // ---- one step ---------------------------------------------------------------------------

  /// Gradient `i` is final for this step. In a synchronised step: copies it into its bucket
  /// (unless in view mode) and launches every bucket that is now complete and next in order.
  /// Errors (the communicator is aborted first): index out of range, gradient marked twice in
  /// one step, and any error of the hook. Under no_sync only the index is checked (reproducible
  /// mode: the gradient is moved into its bucket as in a synchronised step, and a complete
  /// bucket is deposited as this micro-batch's contribution).
  void mark_ready(std::size_t i) { mark(i, /*zero=*/false); }

  /// Parameter `i` has no gradient in this step: zeros are reduced for it (its buffer's contents
  /// are ignored), and it counts as ready, so a bucket with unused parameters is reduced early.
  /// With accumulation, "this step" is the whole accumulation window: a parameter that received
  /// gradient in an earlier no_sync micro-step must be marked ready instead. Under no_sync
  /// nothing happens beyond the index check. Reproducible mode: "this step" is the micro-batch,
  /// under no_sync too (its contribution for parameter `i` is zeros). Errors as `mark_ready`.
  void mark_unused(std::size_t i) { mark(i, /*zero=*/true); }

  /// Ends the step. Synchronised: launches what is left, waits for every bucket, and leaves the
  /// averaged gradients in place (copied back into the registered buffers unless in view mode);
  /// after the first synchronised step, rebuilds the buckets once. Under no_sync: nothing.
  /// Errors (the communicator is aborted first): a parameter never marked ready (unless
  /// `find_unused_parameters`), naming the parameters and the bucket that cannot complete;
  /// any error of the reductions, naming the step and bucket.
  /// Device memory: returns once everything is enqueued on the communicator's stream (see the
  /// file comment for what the trainer must synchronise).
  /// Reproducible mode: under no_sync, ends one micro-batch (every parameter must have been
  /// marked, or find_unused_parameters marks the rest unused); synchronised, leaves the average
  /// over every micro-batch of every rank since the last synchronised step.
  void finish();

  /// Uneven inputs: this rank has no more data. Shadows the other ranks' synchronised steps
  /// (matching each bucket's reduction with zeros, and the rebuild if it is still due) until
  /// every rank has called `join()`; then broadcasts the parameters from the lowest rank that
  /// trained in the last step (so every rank ends with the same model) and returns. The reducer
  /// can be used for more steps afterwards (a new epoch). Optimizer state is not synchronised
  /// (as in PyTorch): a rank that joined early keeps its older optimizer state.
  /// Errors (communicator aborted first): `reducer_options::join` is off; called in the middle
  /// of a step; any error of the collectives.
  void join();

  /// True when bucket `k` (reduction order) was launched in the current step and its
  /// communication has completed; `finish()` still has to complete it (hooks, copies). Never
  /// blocks; false for an index out of range and outside a step. Lets a trainer observe the
  /// overlap, and orders the memory of that bucket's reduction before the caller's later reads.
  bool bucket_communicated(std::size_t k) const noexcept {
    return k < buckets_.size() && buckets_[k].pending_work.valid() && buckets_[k].pending_work.test();
  }

  // ---- measurements -----------------------------------------------------------------------

  /// What this reducer has allocated in `space`, measured where it allocates
  /// (primitive/memory_counter.hpp): bytes held now (its buckets, rounded up to 64 bytes plus
  /// 64, and join mode's flags), the most held at once (a rebuild holds the old buckets while it
  /// makes the new ones), allocations. Not the trainer's parameters and gradients. Local.
  primitive::memory_usage memory_allocated(primitive::memory_space space) const noexcept {
    return memory_counter_.usage(space);
  }

  /// Counters and timings since construction or the last `reset_stats()`.
  const reducer_stats& stats() const noexcept { return stats_; }
  /// Clears the counters and timings.
  void reset_stats() noexcept {
    const std::uint64_t rebuilds = stats_.rebuilds;
    stats_ = reducer_stats{};
    stats_.rebuilds = rebuilds;
  }
  /// Ranks that contributed real gradients to the last synchronised step.
  int last_contributors() const noexcept { return step_contributors_; }

 private:
  friend class ringzero::no_sync_guard;
  /// The guard's restore: the mode it found, set without the checks (never throws).
  void restore_gradient_sync(bool on) noexcept { require_sync_ = on; }
  using clock = std::chrono::steady_clock;

  struct bucket {
    reducer_bucket_info info;
    std::vector<bucket_gradient> gradients;  // what hooks see of each gradient (shapes and names point into params_)
    detail::bucket_storage storage;
    std::size_t bytes_allocated = 0;
    std::size_t pending = 0;  // gradients not yet ready this step
    work pending_work;
    clock::time_point launched_at{};
  };

  // ---- construction -------------------------------------------------------------------------

  std::string describe(std::size_t i) const {
    std::string s = std::to_string(i);
    if (i < params_.size() && !params_[i].name.empty()) s += " '" + params_[i].name + "'";
    return s;
  }

  /// The first problem with this rank's arguments, or "".
  std::string validate_locally() const;

  /// Collective: every rank learns whether every rank's arguments are valid and whether all
  /// registered the same parameters with the same options; raises the same verdict everywhere.
  void check_agreement(const std::string& problem);

  std::vector<bucket_plan> plan(const std::vector<std::size_t>& order) const {
    std::vector<bucket_tensor> tensors(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) tensors[i] = {params_[i].count, params_[i].type};
    return assign_buckets(tensors, options_.bucket_byte_limits, order);
  }

  /// Allocates buckets for `plans`; with `carry_gradients` copies the current gradients of the
  /// old layout into the new one (view mode rebuild).
  void install_layout(const std::vector<bucket_plan>& plans, bool carry_gradients);

  bool params_have_data() const noexcept {
    for (const auto& p : params_)
      if (p.count != 0 && p.data == nullptr) return false;
    return true;
  }

  /// Collective: copies every parameter from `root` to all ranks, staged through the buckets.
  void broadcast_parameters(int root) {
    for (auto& b : buckets_) {
      const std::size_t es = dtype_size(b.info.type);
      auto* base = static_cast<std::byte*>(b.storage.data());
      if (comm_.rank() == root)
        for (std::size_t k = 0; k < b.info.parameters.size(); ++k) {
          const reducer_parameter& p = params_[b.info.parameters[k]];
          if (p.count) memory_.copy(base + b.info.offsets[k] * es, p.data, static_cast<std::size_t>(p.count) * es);
        }
      broadcast(comm_, base, base, b.info.count, b.info.type, root);
      if (comm_.rank() != root)
        for (std::size_t k = 0; k < b.info.parameters.size(); ++k) {
          const reducer_parameter& p = params_[b.info.parameters[k]];
          if (p.count) memory_.copy(p.data, base + b.info.offsets[k] * es, static_cast<std::size_t>(p.count) * es);
        }
    }
  }

  // ---- steps ----------------------------------------------------------------------------------

  void check_usable() const {
    if (!failure_.empty())
      throw error(errc::aborted, context(), "gradient_reducer is unusable after an earlier failure: " + failure_);
  }

  void check_index(std::size_t i, const char* what) {
    if (i >= params_.size())
      fail(errc::invalid_argument, std::string(what) + "(" + std::to_string(i) + "): index out of range (" +
                                       std::to_string(params_.size()) + " parameters registered)");
  }

  /// Backend, rank and world size for errors (no collective: the reducer's own checks run
  /// outside any collective, while its reductions may run on the progress thread).
  error_context context() const { return ringzero::detail::context_of(comm_); }

  [[noreturn]] void raise(errc code, const std::string& message) const { throw error(code, context(), message); }

  /// Records the failure, aborts the communicator (so peers waiting on this rank fail
  /// promptly) and throws.
  [[noreturn]] void fail(errc code, const std::string& message) {
    const std::string full = "gradient_reducer: " + message;
    failure_ = full;
    ringzero::detail::transport_of(comm_).abort(full);
    raise(code, full);
  }

  bool rebuild_pending() const noexcept {
    return options_.rebuild_buckets && !options_.find_unused_parameters && !rebuilt_;
  }

  /// Starts a synchronised step: in join mode, issues the agreement collective.
  void open_step() {
    step_open_ = true;
    ++step_;
    next_launch_ = 0;
    step_contributors_ = comm_.world_size();
    agreement_pending_ = false;
    if (options_.join || options_.reproducible) {
      try {
        // Reproducible mode: 1 + this rank's micro-batches deposited under no_sync, so that every
        // rank learns whether each rank contributes exactly one micro-batch (all flags 1).
        flags_.set(options_.reproducible
                       ? 1 + static_cast<int>(std::min<std::uint64_t>(reproducible_micro_steps_, 1u << 30))
                       : 1);
      } catch (const std::exception& e) {
        fail_from(e, "step " + std::to_string(step_) + ": preparing the join agreement failed");
      }
      if (options_.collect_timings) agreement_launched_at_ = clock::now();
      // (void) here and at every assignment of a work in ddp/: nvcc's front end (CUDA 13) takes
      // the assignment's result for an ignored [[nodiscard]] work (warning #3001-D).
      (void)(agreement_ = flags_.gather_async(comm_));
      agreement_pending_ = true;
    }
  }

  /// Why steps start with an agreement, for errors.
  const char* agreement_mode() const noexcept { return options_.join ? " (join mode)" : " (reproducible mode)"; }

  /// Join or reproducible mode: waits for this step's agreement and reads the number of
  /// contributing ranks (and, reproducible, whether each holds exactly one micro-batch).
  void resolve_agreement() {
    if (!agreement_pending_) return;
    const auto t0 = clock::now();
    try {
      detail::await_work(agreement_);
    } catch (const std::exception& e) {
      fail_from(e, "the agreement of step " + std::to_string(step_) + agreement_mode() + " failed");
    }
    if (options_.collect_timings) {
      const auto t1 = clock::now();
      stats_.exposed_seconds += std::chrono::duration<double>(t1 - t0).count();
      add_interval(agreement_launched_at_, agreement_.completion_time());
    }
    agreement_pending_ = false;
    try {
      flags_.read();
    } catch (const std::exception& e) {
      fail_from(e, "the agreement of step " + std::to_string(step_) + agreement_mode() + " could not be read");
    }
    step_contributors_ = count_flags();
    if (options_.reproducible) {
      one_contribution_each_ = true;
      for (int r = 0; r < comm_.world_size(); ++r) one_contribution_each_ = one_contribution_each_ && flags_[r] == 1;
    }
  }

  /// The number of ranks whose flag is set; remembers the lowest (join's broadcast root).
  int count_flags() {
    const auto [active, first] = flags_.count();
    if (active > 0) last_trained_rank_ = first;
    return active;
  }

  /// Join mode, blocking: contributes `active` to an agreement and returns how many ranks are active.
  int agree(bool active) {
    try {
      flags_.set(active ? 1 : 0);
      flags_.gather(comm_);
    } catch (const std::exception& e) { fail_from(e, "join(): the agreement with the other ranks failed"); }
    return count_flags();
  }

  void mark(std::size_t i, bool zero) {
    check_usable();
    check_index(i, zero ? "mark_unused" : "mark_ready");
    const bool sync = require_sync_;
    if (!sync) {  // accumulation micro-step: nothing to communicate
      ++unsynced_marks_;
      accumulating_ = true;
      if (!options_.reproducible) return;  // reproducible: the micro-batch is deposited below
    }
    if (sync && !step_open_) open_step();
    if (ready_[i])
      fail(errc::invalid_argument,
           std::string(zero ? "mark_unused" : "mark_ready") + "(" + describe(i) + ") called twice in " +
               (sync ? "step " + std::to_string(step_) : std::string("an accumulation micro-step")));
    ready_[i] = 1;
    if (sync && rebuild_pending()) ready_order_.push_back(i);
    bucket& b = buckets_[bucket_of_[i]];
    try {
      if (zero)
        zero_slot(i);
      else if (!options_.gradient_as_bucket_view && params_[i].count != 0) {
        const std::size_t es = dtype_size(params_[i].type);
        memory_.copy(static_cast<std::byte*>(b.storage.data()) + offset_of_[i] * es, params_[i].grad,
                     static_cast<std::size_t>(params_[i].count) * es);
      }
    } catch (const std::exception& e) {
      fail_from(e, std::string(zero ? "mark_unused" : "mark_ready") + "(" + describe(i) +
                       "): moving the gradient into bucket " + std::to_string(bucket_of_[i]) + " failed");
    }
    --b.pending;
    if (options_.reproducible && b.pending == 0) {
      if (sync) resolve_agreement();  // one micro-batch on every rank: the bucket goes out as it is
      try {
        if (!sync || !one_contribution_each_) reproducible_.deposit(bucket_of_[i], b.storage.data());
      } catch (const std::exception& e) {
        fail_from(e,
                  "depositing bucket " + std::to_string(bucket_of_[i]) + " into its reproducible accumulator failed");
      }
    }
    if (sync)
      while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
  }

  /// Reproducible mode, finish() under no_sync: completes the micro-step (unused parameters
  /// contribute zeros with find_unused_parameters; otherwise a parameter never marked is an
  /// error, as in a synchronised step) and resets the readiness for the next one.
  void end_reproducible_micro_step() {
    std::vector<std::size_t> missing;
    for (std::size_t k = params_.size(); k-- > 0;)
      if (!ready_[k]) missing.push_back(k);
    if (!missing.empty() && !options_.find_unused_parameters) {
      std::string names;
      for (std::size_t k = 0; k < missing.size() && k < 8; ++k) names += (k ? ", " : "") + describe(missing[k]);
      if (missing.size() > 8) names += ", ... (" + std::to_string(missing.size()) + " in all)";
      fail(errc::invalid_argument, "finish() of an accumulation micro-step (reproducible mode): parameter(s) " + names +
                                       " were never marked ready in this micro-batch; mark every gradient ready (or "
                                       "unused) in every micro-batch, or set find_unused_parameters");
    }
    for (std::size_t k : missing) mark(k, /*zero=*/true);
    std::fill(ready_.begin(), ready_.end(), 0);
    for (auto& b : buckets_) b.pending = b.info.parameters.size();
    ++reproducible_micro_steps_;
  }

  void zero_slot(std::size_t i) {
    const bucket& b = buckets_[bucket_of_[i]];
    const std::size_t es = dtype_size(params_[i].type);
    memory_.zero(static_cast<std::byte*>(b.storage.data()) + offset_of_[i] * es,
                 static_cast<std::size_t>(params_[i].count) * es);
  }

  /// Zeroes every bucket (join's shadow steps).
  void zero_buckets() {
    try {
      for (auto& b : buckets_) memory_.zero(b.storage.data(), b.bytes_allocated);
    } catch (const std::exception& e) { fail_from(e, "join(): zeroing the buckets failed"); }
  }

  /// Collective: all_gather of `count` elements of `type` from host memory `mine` into host
  /// memory `all` (world_size * count). On device memory the data is staged through a device
  /// buffer kept for these control exchanges, and read back after a stream synchronisation.
  void gather_to_host(const void* mine, void* all, std::uint64_t count, dtype type) {
    if (!memory_.is_device()) {
      all_gather(comm_, mine, all, count, type);
      return;
    }
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(type);
    const std::size_t whole = bytes * static_cast<std::size_t>(comm_.world_size());
    if (control_bytes_ < whole + bytes) {
      // Sized at once for the rebuild's exchange too (params + 1 int64 per rank), so that the
      // rebuild allocates nothing unless it changes the layout.
      const std::size_t rebuild_bytes =
          (params_.size() + 1) * sizeof(std::int64_t) * (static_cast<std::size_t>(comm_.world_size()) + 1);
      const std::size_t size = std::max(whole + bytes, rebuild_bytes);
      if (control_storage_) memory_.synchronize();
      control_storage_.reset();
      control_storage_ = memory_.allocate(size, &memory_counter_);
      control_bytes_ = size;
    }
    auto* gathered = static_cast<std::byte*>(control_storage_.data());
    memory_.from_host(gathered + whole, mine, bytes);
    all_gather(comm_, gathered + whole, gathered, count, type);
    memory_.to_host(all, gathered, whole);
  }

  /// Bucket k as the communication hook sees it.
  gradient_bucket view_of(std::size_t k);

  void launch(std::size_t k);

  /// Waits for every bucket in order, completes it, copies back (not in shadow steps), times it.
  void wait_and_complete(bool shadow);

  /// Adds [a, b] to the step's in-flight time (detail::interval_union).
  void add_interval(clock::time_point a, clock::time_point b) { stats_.reduction_seconds += busy_.add(a, b); }
  /// Ends the step's in-flight time.
  void flush_intervals() { stats_.reduction_seconds += busy_.take(); }

  /// Bucket k's collectives carry tag bucket_tag_base | k, named by name_bucket_tag ("all_reduce of
  /// bucket k (parameters ...)", "" for other tags) where a check fails, never during a rebuild.
  static constexpr std::uint64_t bucket_tag_base = std::uint64_t{0xDD} << 48;
  static std::string name_bucket_tag(const void* self, std::uint64_t tag) noexcept;
  collective_options bucket_options(std::size_t k) const noexcept;  ///< that tag and namer

  std::string describe_bucket(std::size_t k) const;

  /// Wraps an error from a collective or hook with the reducer's context, aborts, and throws.
  [[noreturn]] void fail_from(const std::exception& e, const std::string& what) {
    errc code = errc::internal;
    if (const auto* re = dynamic_cast<const error*>(&e)) code = re->kind();
    fail(code, what + ": " + e.what());
  }

  void close_step() {
    std::fill(ready_.begin(), ready_.end(), 0);
    for (auto& b : buckets_) b.pending = b.info.parameters.size();
    next_launch_ = 0;
    step_open_ = false;
    ++stats_.synchronized_steps;
    reproducible_micro_steps_ = 0;
    one_contribution_each_ = false;
  }

  /// Collective, once: agrees on a ready order (rank 0's, or the lowest rank that has one) and
  /// re-plans the buckets from it; reallocates only when the assignment changes.
  void rebuild(bool have_order);

  communicator& comm_;
  bucket_memory memory_;                      // host memory, or the communicator's device and stream
  primitive::memory_counter memory_counter_;  // every allocation of the reducer (declared before them)
  std::vector<reducer_parameter> params_;
  reducer_options options_;
  int uncaught_at_construction_ = 0;

  std::vector<bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::uint64_t> offset_of_;
  std::uint64_t generation_ = 0;

  std::vector<std::uint8_t> ready_;
  std::vector<std::size_t> ready_order_;
  std::size_t next_launch_ = 0;
  bool step_open_ = false;
  bool require_sync_ = true;
  bool rebuilt_ = false;
  std::uint64_t step_ = 0;
  std::uint64_t unsynced_marks_ = 0;  // marks under no_sync since the last finish()
  bool accumulating_ = false;         // accumulating(): a no_sync micro-batch since the last sync step
  int step_contributors_ = 1;
  detail::reproducible_bucket_accumulators reproducible_;  // reproducible mode: one per bucket
  std::uint64_t reproducible_micro_steps_ = 0;  // micro-batches deposited under no_sync since the last sync step
  bool one_contribution_each_ = false;          // this step: every rank holds exactly one micro-batch

  // join mode
  detail::rank_flags flags_;  // every rank's flag of the step, then this rank's own

  // device memory: staging of the host values exchanged at construction and at the rebuild
  detail::bucket_storage control_storage_;
  std::size_t control_bytes_ = 0;
  work agreement_;
  bool agreement_pending_ = false;
  clock::time_point agreement_launched_at_{};
  int last_trained_rank_ = -1;
  bool shadowing_ = false;  // in join()'s shadow steps: this rank's buckets hold zeros, not gradients

  reducer_stats stats_;
  detail::interval_union busy_;  // the step's reductions in flight, overlaps counted once
  std::string failure_;
};

}  // namespace ringzero::ddp

// The members defined out of the class (kept apart so that each header stays short).
#include "ringzero/ddp/gradient_reducer_members.hpp"
