#pragma once
/// @file
/// `gradient_reducer`: data-parallel gradient averaging with buckets that are reduced while
/// backward is still running (the reducer of PyTorch's DistributedDataParallel, over any
/// `ringzero::communicator`).
///
/// Life of a reducer:
/// 1. Construction (collective: every rank constructs its reducer at the same point): the
///    parameters are registered (values, gradient buffer, element count, dtype); every rank
///    checks that all ranks registered the same parameter set and options; parameters are
///    broadcast from rank 0; gradients are assigned to buckets in reverse registration order
///    (ddp/bucket_assignment.hpp: one dtype per bucket, 1 MiB first bucket, then 25 MiB).
/// 2. Every step: backward calls `mark_ready(i)` as soon as gradient i is final. A bucket whose
///    gradients are all ready is handed to the communication hook (default: all_reduce avg), as
///    an asynchronous collective on the communicator's progress thread, while backward goes on.
///    Buckets are launched strictly in order (bucket k+1 waits for bucket k), so every rank
///    issues the same collectives in the same order whatever order it marks gradients in.
///    `finish()` waits for the buckets and leaves averaged gradients in place.
/// 3. After the first synchronised step the buckets are rebuilt once from the order in which
///    gradients actually became ready (rank 0's order, agreed by every rank).
///
/// Gradient memory: by default the user owns the gradient buffers; `mark_ready(i)` copies
/// gradient i into its bucket and `finish()` copies the average back. With
/// `reducer_options::gradient_as_bucket_view` the reducer owns the gradients: `gradient(i)` is
/// a view into bucket memory where backward writes directly, and nothing is copied
/// (PyTorch's `gradient_as_bucket_view=True`). Views move only when the one rebuild changes the
/// layout; `layout_generation()` then increases and the current values are carried over.
///
/// Accumulation: inside `no_sync()` (or with `set_require_gradient_sync(false)`) steps do not
/// communicate; the trainer accumulates into the gradients, and the next synchronised step
/// reduces the accumulated sum (PyTorch's `no_sync`).
///
/// Reproducible mode (`reducer_options::reproducible`): every micro-batch is one contribution.
/// The trainer WRITES each micro-batch's gradient (it does not add it to the previous one) and
/// marks every gradient ready (or unused: zeros) in every micro-step, under no_sync too; the
/// reducer deposits each completed bucket into a reproducible accumulator
/// (ddp/reproducible_accumulation.hpp), and the synchronised micro-step leaves the average over
/// all micro-batches of all ranks, bitwise the same for any world size (docs/ddp.md). A small
/// agreement per step lets ranks that all hold one micro-batch skip the accumulators and reduce
/// the buckets asynchronously with the per-call reproducible all_reduce (the same bits).
///
/// Uneven inputs (case C13): with `reducer_options::join`, each synchronised step starts with a
/// small agreement collective; a rank that runs out of data calls `join()`, which shadows the
/// other ranks' steps with zero gradients, so their all_reduces are matched, and the average is
/// taken over the ranks that contributed. When every rank has joined, the final parameters are
/// broadcast from a rank that trained last (PyTorch's `Join` with DDP's join hook). Without the
/// option, ranks must run the same number of synchronised steps; `join()` is then an error.
///
/// Errors: everything a rank does that would leave its peers waiting (a different parameter
/// set, a gradient never marked ready so that a bucket can never complete, marking twice, an
/// index out of range, join() without the option) raises `ringzero::error` on that rank and
/// aborts the communicator, so the peers' pending reductions fail promptly with an error naming
/// the first failure instead of hanging. After an error the reducer (and the communicator) must
/// not be used again.
///
/// Thread semantics: the reducer is driven by one thread, the thread that owns the communicator
/// (the training thread): constructor, `mark_ready`, `mark_unused`, `finish`, `join` and the
/// sync switches are called from it, never concurrently. Reductions run on the communicator's
/// progress thread; between `mark_ready(i)` and the return of `finish()` the trainer must not
/// write gradient i (in view mode: the bucket memory of gradient i).
///
/// Determinism: averaged gradients are bitwise identical on every rank, and identical run to
/// run for a given world size, algorithm, hook and bucket layout. The rebuilt layout depends on
/// rank 0's ready order only, so it is the same on every rank.
///
/// CUDA device memory: when the communicator's `space()` is `memory_space::cuda` (the local
/// backend's `cuda_communicator`, the NCCL backend), parameters and gradients are device
/// pointers on the communicator's device, the buckets are device memory (cudaMalloc'ed once,
/// like the host buckets), and every copy into and out of a bucket, every zeroing, division
/// and cast is enqueued on the communicator's stream (`comm.cuda_stream()`), as are the
/// collectives (ddp/bucket_memory.hpp). Calls return once their work is enqueued, so:
/// - before `mark_ready(i)`, the work that writes gradient i must be ordered before the
///   communicator's stream: enqueue backward on that stream (the simplest), or make the stream
///   wait for an event recorded after it;
/// - after `finish()` the averaged gradients are in place in the order of that stream: kernels
///   enqueued on it afterwards (the optimizer step) read them; work on another stream must wait
///   for an event recorded on it; the host must call `comm.synchronize()` before reading them;
/// - the same holds for the parameters broadcast by the constructor and by `join()`.
/// The results are those of the host reducer with the same inputs, bucket layout and algorithm,
/// bit for bit (the device primitives share the host's arithmetic). The few values the reducer
/// itself needs on the host (the agreement at construction, the one rebuild, the join flags)
/// are staged through device memory and read after a stream synchronisation; in join mode that
/// is one synchronisation per step. On device memory "communicated" (`bucket_communicated`,
/// `reducer_stats`) means enqueued: the timings measure how long launching took, not the device.
/// Needs the CUDA kernels of one .cu file including <ringzero/cuda.cuh> (errc::unsupported
/// otherwise) and a hook that supports device memory (the built-in ones do).

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
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/broadcast.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/ddp/allreduce_hook.hpp"
#include "ringzero/ddp/bucket_assignment.hpp"
#include "ringzero/ddp/bucket_memory.hpp"
#include "ringzero/ddp/comm_hook.hpp"
#include "ringzero/ddp/gradient_bucket.hpp"
#include "ringzero/ddp/reproducible_accumulation.hpp"

namespace ringzero {

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

/// One registered parameter: its values, its gradient, its size and dtype. On a communicator
/// whose buffers are CUDA device memory, `data` and `grad` are device pointers.
struct reducer_parameter {
  /// The parameter's values (`count` elements): overwritten by rank 0's values at construction
  /// (and at the end of `join()`). May be null when `reducer_options::broadcast_parameters` is
  /// false and `join` is off.
  void* data = nullptr;
  /// The gradient buffer (`count` elements). Ignored (may be null) with
  /// `gradient_as_bucket_view`, where the reducer provides it (`gradient_reducer::gradient`).
  void* grad = nullptr;
  std::uint64_t count = 0;      ///< number of elements
  dtype type = dtype::float32;  ///< element type of values and gradient
  std::string name;             ///< optional, used in error messages

  /// A parameter from typed spans (`grad` may be empty in view mode; else sizes must match).
  template <element_type T>
  static reducer_parameter of(std::span<T> data, std::span<T> grad, std::string name = {}) {
    reducer_parameter p;
    p.data = data.data();
    p.grad = grad.data();
    p.count = data.size();
    p.type = dtype_of<T>;
    p.name = std::move(name);
    if (!grad.empty() && grad.size() != data.size())
      throw error(errc::invalid_argument, "reducer_parameter '" + p.name + "': gradient has " +
                                              std::to_string(grad.size()) + " elements, parameter " +
                                              std::to_string(data.size()));
    return p;
  }
};

/// Options of a `gradient_reducer`. Every rank must pass the same options (checked), except
/// `gradient_as_bucket_view` and `collect_timings`, which are local.
struct reducer_options {
  /// Byte limits of the buckets, consumed per dtype, the last one repeating (PyTorch's
  /// `bucket_cap_mb` with its 1 MiB first bucket). Must not be empty.
  std::vector<std::uint64_t> bucket_byte_limits{default_first_bucket_bytes, default_bucket_bytes};
  /// The reducer owns the gradients and hands out views into bucket memory (no copies).
  bool gradient_as_bucket_view = false;
  /// Parameters not marked ready by `finish()` are treated as `mark_unused` (zero gradient for
  /// the step, reduced with the others) instead of being an error. Like PyTorch, this also
  /// disables the rebuild of buckets.
  bool find_unused_parameters = false;
  /// Rebuild the buckets once, after the first synchronised step, from rank 0's ready order.
  bool rebuild_buckets = true;
  /// Broadcast every parameter from rank 0 at construction.
  bool broadcast_parameters = true;
  /// Uneven inputs: enables `join()`. Costs one small collective per synchronised step.
  bool join = false;
  /// In steps where some ranks joined: divide by the world size instead of the number of
  /// contributing ranks (PyTorch's `divide_by_initial_world_size`; off by default here, as
  /// case C13 asks for the average over the ranks that contributed).
  bool divide_by_initial_world_size = false;
  /// The communication hook; null means `allreduce_hook` (average).
  std::shared_ptr<comm_hook> hook;
  /// Alignment in bytes of every gradient inside its bucket (a power of two; padding is zero).
  std::size_t alignment_bytes = 64;
  /// Record per-step timings of the reductions (`gradient_reducer::stats`).
  bool collect_timings = true;
  /// Reproducible gradient accumulation (see the file comment and docs/ddp.md): each
  /// micro-batch's gradient is one contribution, written (not added) by the trainer; the result
  /// is the reproducible average over every contribution of every rank, identical bit for bit
  /// for any world size, rank order and algorithm. Host memory, floating gradients and the
  /// default hook only; not with divide_by_initial_world_size (refused on every rank).
  bool reproducible = false;
};

/// Counters and timings of a reducer, accumulated over steps (see `gradient_reducer::stats`).
/// Times are in seconds, measured with the steady clock on the training thread, plus each
/// reduction's completion time as recorded by the progress thread.
struct reducer_stats {
  std::uint64_t synchronized_steps = 0;  ///< steps that communicated (shadow steps of join() included)
  std::uint64_t local_steps = 0;         ///< steps finished under no_sync
  std::uint64_t buckets_reduced = 0;     ///< bucket reductions completed
  std::uint64_t rebuilds = 0;            ///< layout changes made by the rebuild (0 or 1)
  /// Wall time during which at least one bucket of the step was being reduced (from the launch
  /// of a bucket to its completion, overlapping intervals counted once), summed over steps.
  double reduction_seconds = 0.0;
  /// Time `finish()` (and a join-mode launch waiting for the step's agreement) blocked on
  /// communication: the part of the reduction not hidden behind backward.
  double exposed_seconds = 0.0;

  /// Fraction of the reduction time hidden behind computation: 1 - exposed / reduction
  /// (clamped to [0, 1]; 0 when nothing was reduced).
  double hidden_fraction() const noexcept {
    if (reduction_seconds <= 0.0) return 0.0;
    const double f = 1.0 - exposed_seconds / reduction_seconds;
    return f < 0.0 ? 0.0 : (f > 1.0 ? 1.0 : f);
  }
};

/// Description of one bucket of the current layout (for tools, tests and logging).
struct reducer_bucket_info {
  std::vector<std::size_t> parameters;  ///< registered indices, in bucket order
  std::vector<std::uint64_t> offsets;   ///< element offset of each gradient in the bucket
  dtype type = dtype::float32;          ///< element type
  std::uint64_t count = 0;              ///< elements, padding included
  std::uint64_t bytes = 0;              ///< gradient bytes without padding
  std::uint64_t limit_bytes = 0;        ///< byte limit the bucket was formed under
};

/// The bucketed gradient reducer. See the file comment for the whole contract.
class gradient_reducer {
 public:
  /// Restores the previous synchronisation mode when it goes out of scope (see `no_sync`).
  class no_sync_guard {
   public:
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    ~no_sync_guard() {
      if (reducer_ != nullptr) reducer_->require_sync_ = previous_;
    }

   private:
    friend class gradient_reducer;
    no_sync_guard(gradient_reducer& r, bool previous) noexcept : reducer_(&r), previous_(previous) {}
    gradient_reducer* reducer_;
    bool previous_;
  };

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
    for (auto& b : buckets_) memory_.zero(b.storage.get(), b.bytes_allocated);
    if (options_.join || options_.reproducible) {
      flags_storage_ = memory_.allocate(sizeof(std::int32_t) * (static_cast<std::size_t>(comm_.world_size()) + 1));
      flags_ = static_cast<std::int32_t*>(flags_storage_.get());
      flags_send_ = flags_ + comm_.world_size();
      if (memory_.is_device()) flags_host_.assign(static_cast<std::size_t>(comm_.world_size()), 0);
    }
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
    if (unwinding) comm_.abort("gradient_reducer destroyed during exception unwinding with reductions in flight");
    try {
      agreement_.wait();
    } catch (...) {
    }
    for (auto& b : buckets_) {
      try {
        b.pending_work.wait();
      } catch (...) {
      }
    }
    if (unwinding || !failure_.empty()) {
      // Peers of an aborted collective may still read this rank's buffers (zero-copy backends).
      for (auto& b : buckets_) detail::retire_after_abort(std::move(b.storage));
      detail::retire_after_abort(std::move(flags_storage_));
      detail::retire_after_abort(std::move(control_storage_));
    } else if (memory_.is_device()) {
      try {
        memory_.synchronize();  // device work still reading the buckets finishes before they are freed
      } catch (...) {
      }
    }
  }

  // ---- layout ---------------------------------------------------------------------------

  /// Number of registered parameters.
  std::size_t parameter_count() const noexcept { return params_.size(); }
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
    } catch (const error& e) {
      fail(errc::invalid_argument, "restore_layout: " + e.message());
    }
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
  /// Increases each time the layout changes (the rebuild); gradient views from `gradient` of an
  /// older generation are invalid.
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
    return static_cast<std::byte*>(b.storage.get()) + offset_of_[i] * dtype_size(b.info.type);
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
  [[nodiscard]] no_sync_guard no_sync() {
    const bool previous = require_sync_;
    set_require_gradient_sync(false);
    return no_sync_guard(*this, previous);
  }

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
  void finish() {
    check_usable();
    if (!require_sync_) {
      if (options_.reproducible) end_reproducible_micro_step();
      ++stats_.local_steps;
      unsynced_marks_ = 0;
      return;
    }
    if (!step_open_) open_step();
    // Parameters never marked ready.
    std::vector<std::size_t> missing;
    for (std::size_t k = params_.size(); k-- > 0;)
      if (!ready_[k]) missing.push_back(k);
    if (!missing.empty()) {
      if (!options_.find_unused_parameters) {
        if (missing.size() == params_.size() && unsynced_marks_ > 0)
          fail(errc::invalid_argument,
               "finish() in step " + std::to_string(step_) + ": no gradient was marked ready since gradient sync was "
               "turned back on, but " + std::to_string(unsynced_marks_) + " were marked under no_sync: call finish() "
               "inside the no_sync scope (or not at all) for accumulation micro-steps");
        std::string names;
        for (std::size_t k = 0; k < missing.size() && k < 8; ++k) names += (k ? ", " : "") + describe(missing[k]);
        if (missing.size() > 8) names += ", ... (" + std::to_string(missing.size()) + " in all)";
        fail(errc::invalid_argument,
             "finish() in step " + std::to_string(step_) + ": parameter(s) " + names +
                 " were never marked ready, so bucket " + std::to_string(bucket_of_[missing.front()]) +
                 " can never be reduced; mark every gradient ready, or set find_unused_parameters");
      }
      for (std::size_t k : missing) mark(k, /*zero=*/true);
    }
    if (next_launch_ != buckets_.size())
      fail(errc::internal, "finish(): " + std::to_string(buckets_.size() - next_launch_) + " bucket(s) not launched");
    resolve_agreement();
    wait_and_complete(/*shadow=*/false);
    if (rebuild_pending()) rebuild(/*have_order=*/true);
    close_step();
    unsynced_marks_ = 0;
  }

  /// Uneven inputs: this rank has no more data. Shadows the other ranks' synchronised steps
  /// (matching each bucket's reduction with zeros, and the rebuild if it is still due) until
  /// every rank has called `join()`; then broadcasts the parameters from the lowest rank that
  /// trained in the last step (so every rank ends with the same model) and returns. The reducer
  /// can be used for more steps afterwards (a new epoch). Optimizer state is not synchronised
  /// (as in PyTorch): a rank that joined early keeps its older optimizer state.
  /// Errors (communicator aborted first): `reducer_options::join` is off; called in the middle
  /// of a step; any error of the collectives.
  void join() {
    check_usable();
    if (!options_.join)
      fail(errc::invalid_argument,
           "join() needs reducer_options::join = true on every rank (ranks ran out of data at different steps)");
    if (step_open_ || (options_.reproducible && unsynced_marks_ > 0))
      fail(errc::invalid_argument, "join() called in the middle of a step (call finish() first)");
    // Reproducible mode: micro-batches of an unfinished accumulation window are dropped (a
    // joined rank contributes nothing), as plain mode never reduces such a window either.
    if (options_.reproducible) {
      reproducible_.clear();
      reproducible_micro_steps_ = 0;
    }
    for (;;) {
      const int active = agree(/*active=*/false);
      if (active == 0) break;
      // Shadow one synchronised step with zero gradients.
      ++step_;
      zero_buckets();
      step_contributors_ = active;
      next_launch_ = 0;
      while (next_launch_ < buckets_.size()) launch(next_launch_++);
      wait_and_complete(/*shadow=*/true);
      if (rebuild_pending()) rebuild(/*have_order=*/false);
      zero_buckets();
      ++stats_.synchronized_steps;
    }
    // Every rank has joined. Make the models equal again: broadcast from a rank that took part
    // in the last synchronised step (every rank saw the same agreements, so all pick the same).
    if (last_trained_rank_ >= 0 && params_have_data()) broadcast_parameters(last_trained_rank_);
    if (options_.gradient_as_bucket_view) zero_buckets();
    last_trained_rank_ = -1;
  }

  /// True when bucket `k` (reduction order) was launched in the current step and its
  /// communication has completed; `finish()` still has to complete it (hooks, copies). Never
  /// blocks; false for an index out of range and outside a step. Lets a trainer observe the
  /// overlap, and orders the memory of that bucket's reduction before the caller's later reads.
  bool bucket_communicated(std::size_t k) const noexcept {
    return k < buckets_.size() && buckets_[k].pending_work.valid() && buckets_[k].pending_work.test();
  }

  // ---- measurements -----------------------------------------------------------------------

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
  using clock = std::chrono::steady_clock;

  struct bucket {
    reducer_bucket_info info;
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
  std::string validate_locally() const {
    if (options_.bucket_byte_limits.empty()) return "reducer_options::bucket_byte_limits is empty";
    if (!options_.hook->supports(comm_.space()))
      return "the communication hook '" + options_.hook->name() + "' does not support " +
             (comm_.space() == memory_space::cuda ? "CUDA device memory" : "host memory") +
             " (the communicator's buffers); override comm_hook::supports in a hook that does";
    const std::size_t a = options_.alignment_bytes;
    if (a == 0 || (a & (a - 1)) != 0)
      return "reducer_options::alignment_bytes = " + std::to_string(a) + " is not a power of two";
    if (options_.reproducible) {
      std::vector<dtype> types;
      std::vector<std::string> names;
      for (const auto& p : params_) {
        types.push_back(p.type);
        names.push_back(p.name);
      }
      std::string why = detail::reproducible_reducer_problem(comm_.space(), options_.hook->name(),
                                                             options_.divide_by_initial_world_size, types, names);
      if (!why.empty()) return why;
    }
    const bool need_data = options_.broadcast_parameters || options_.join;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const reducer_parameter& p = params_[i];
      if (!is_valid(p.type))
        return "parameter " + describe(i) + " has unknown dtype value " + std::to_string(static_cast<unsigned>(p.type));
      if (p.count > (std::uint64_t{1} << 60) / dtype_size(p.type))
        return "parameter " + describe(i) + " has " + std::to_string(p.count) + " elements: its size overflows";
      if (p.count == 0) continue;
      if (!options_.gradient_as_bucket_view && p.grad == nullptr)
        return "parameter " + describe(i) + " has a null gradient pointer (and gradient_as_bucket_view is off)";
      if (need_data && p.data == nullptr)
        return "parameter " + describe(i) +
               " has a null data pointer (needed to broadcast parameters; set broadcast_parameters = false and join = false to omit it)";
    }
    return {};
  }

  /// A 64-bit FNV-1a hash step.
  static std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
    for (int k = 0; k < 8; ++k) {
      h ^= (v >> (8 * k)) & 0xffu;
      h *= 0x100000001b3ull;
    }
    return h;
  }

  /// Collective: every rank learns whether every rank's arguments are valid and whether all
  /// registered the same parameters with the same options; raises the same verdict everywhere.
  void check_agreement(const std::string& problem) {
    constexpr std::size_t fields = 6;
    std::uint64_t mine[fields] = {};
    mine[0] = problem.empty() ? 1 : 0;
    mine[1] = params_.size();
    std::uint64_t total = 0, shapes = 0xcbf29ce484222325ull, opts = 0xcbf29ce484222325ull;
    for (const auto& p : params_) {
      total += p.count;
      shapes = mix(mix(shapes, p.count), static_cast<std::uint64_t>(p.type));
    }
    mine[2] = total;
    mine[3] = shapes;
    for (std::uint64_t l : options_.bucket_byte_limits) opts = mix(opts, l);
    opts = mix(opts, options_.alignment_bytes);
    mine[4] = opts;
    const std::string hook = options_.hook->name();
    std::uint64_t flags = 0xcbf29ce484222325ull;
    for (char c : hook) flags = mix(flags, static_cast<unsigned char>(c));
    flags = mix(flags, (options_.find_unused_parameters ? 1u : 0u) | (options_.rebuild_buckets ? 2u : 0u) |
                           (options_.broadcast_parameters ? 4u : 0u) | (options_.join ? 8u : 0u) |
                           (options_.divide_by_initial_world_size ? 16u : 0u) | (options_.reproducible ? 32u : 0u));
    mine[5] = flags;
    const int n = comm_.world_size();
    std::vector<std::uint64_t> all(fields * static_cast<std::size_t>(n));
    gather_to_host(mine, all.data(), fields, dtype::uint64);
    auto field = [&](int r, std::size_t f) { return all[static_cast<std::size_t>(r) * fields + f]; };

    std::vector<int> bad;
    for (int r = 0; r < n; ++r)
      if (field(r, 0) == 0) bad.push_back(r);
    if (!bad.empty()) {
      std::string msg = "gradient_reducer: invalid arguments on " + detail::describe_ranks(bad);
      if (!problem.empty()) msg += ": " + problem;
      else msg += " (see the error raised there)";
      raise(errc::invalid_argument, msg);
    }
    auto differs = [&](std::size_t f) {
      for (int r = 1; r < n; ++r)
        if (field(r, f) != field(0, f)) return true;
      return false;
    };
    auto values = [&](std::size_t f, auto&& text) {
      std::vector<std::string> v(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) v[static_cast<std::size_t>(r)] = text(field(r, f));
      return detail::describe_values(v);
    };
    auto number = [](std::uint64_t v) { return std::to_string(v); };
    if (differs(1))
      raise(errc::contract_mismatch,
            "gradient_reducer: ranks registered different parameter sets: parameter count " + values(1, number) +
                "; total elements " + values(2, number));
    if (differs(2) || differs(3)) {
      // Same count: find the first parameter that differs (a second, equally sized collective).
      std::vector<std::uint64_t> shape(2 * params_.size());
      for (std::size_t i = 0; i < params_.size(); ++i) {
        shape[2 * i] = params_[i].count;
        shape[2 * i + 1] = static_cast<std::uint64_t>(params_[i].type);
      }
      std::vector<std::uint64_t> every(shape.size() * static_cast<std::size_t>(n));
      gather_to_host(shape.data(), every.data(), shape.size(), dtype::uint64);
      for (std::size_t i = 0; i < params_.size(); ++i) {
        std::vector<std::string> v(static_cast<std::size_t>(n));
        bool same = true;
        for (int r = 0; r < n; ++r) {
          const std::uint64_t c = every[static_cast<std::size_t>(r) * shape.size() + 2 * i];
          const auto t = static_cast<dtype>(every[static_cast<std::size_t>(r) * shape.size() + 2 * i + 1]);
          v[static_cast<std::size_t>(r)] = std::to_string(c) + " x " + std::string(dtype_name(t));
          if (r > 0 && v[static_cast<std::size_t>(r)] != v[0]) same = false;
        }
        if (!same)
          raise(errc::contract_mismatch, "gradient_reducer: ranks registered different parameter sets: parameter " +
                                             describe(i) + ": " + detail::describe_values(v));
      }
    }
    if (differs(4))
      raise(errc::contract_mismatch,
            "gradient_reducer: ranks passed different bucket_byte_limits or alignment_bytes (hashes differ: " +
                values(4, number) + ")");
    if (differs(5))
      raise(errc::contract_mismatch,
            "gradient_reducer: ranks passed different options (hook name, find_unused_parameters, rebuild_buckets, "
            "broadcast_parameters, join, divide_by_initial_world_size or reproducible); this rank uses hook '" + hook + "'");
  }

  std::vector<bucket_plan> plan(const std::vector<std::size_t>& order) const {
    std::vector<bucket_tensor> tensors(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) tensors[i] = {params_[i].count, params_[i].type};
    return assign_buckets(tensors, options_.bucket_byte_limits, order);
  }

  /// Allocates buckets for `plans`; with `carry_gradients` copies the current gradients of the
  /// old layout into the new one (view mode rebuild).
  void install_layout(const std::vector<bucket_plan>& plans, bool carry_gradients) {
    std::vector<bucket> fresh(plans.size());
    std::vector<std::size_t> bucket_of(params_.size());
    std::vector<std::uint64_t> offset_of(params_.size());
    for (std::size_t k = 0; k < plans.size(); ++k) {
      const bucket_plan& p = plans[k];
      bucket& b = fresh[k];
      const std::uint64_t es = dtype_size(p.type);
      const std::uint64_t align = std::max<std::uint64_t>(1, options_.alignment_bytes / es);
      std::uint64_t at = 0;
      for (std::size_t i : p.tensors) {
        at = (at + align - 1) / align * align;
        b.info.parameters.push_back(i);
        b.info.offsets.push_back(at);
        bucket_of[i] = k;
        offset_of[i] = at;
        at += params_[i].count;
      }
      b.info.type = p.type;
      b.info.count = at;
      b.info.bytes = p.bytes;
      b.info.limit_bytes = p.limit_bytes;
      b.bytes_allocated = static_cast<std::size_t>((at * es + 63) / 64 * 64);
      try {
        b.storage = memory_.allocate(b.bytes_allocated);  // zeroed: every page touched once, here
      } catch (const error& e) {
        raise(e.kind(), "gradient_reducer: cannot allocate " + std::to_string(b.bytes_allocated) + " bytes for bucket " +
                            std::to_string(k) + ": " + e.what());
      }
      b.pending = p.tensors.size();
    }
    if (carry_gradients) {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const std::size_t es = dtype_size(params_[i].type);
        const bucket& ob = buckets_[bucket_of_[i]];
        const auto* src = static_cast<const std::byte*>(ob.storage.get()) + offset_of_[i] * es;
        auto* dst = static_cast<std::byte*>(fresh[bucket_of[i]].storage.get()) + offset_of[i] * es;
        memory_.copy(dst, src, static_cast<std::size_t>(params_[i].count) * es);
      }
    }
    if (!buckets_.empty()) memory_.synchronize();  // device: nothing in flight reads the old buckets any more
    buckets_ = std::move(fresh);
    bucket_of_ = std::move(bucket_of);
    offset_of_ = std::move(offset_of);
    if (options_.reproducible) {
      std::vector<std::uint64_t> counts;
      std::vector<dtype> types;
      for (const auto& b : buckets_) {
        counts.push_back(b.info.count);
        types.push_back(b.info.type);
      }
      reproducible_.reset_layout(counts, types);
    }
  }

  bool params_have_data() const noexcept {
    for (const auto& p : params_)
      if (p.count != 0 && p.data == nullptr) return false;
    return true;
  }

  /// Collective: copies every parameter from `root` to all ranks, staged through the buckets.
  void broadcast_parameters(int root) {
    for (auto& b : buckets_) {
      const std::size_t es = dtype_size(b.info.type);
      auto* base = static_cast<std::byte*>(b.storage.get());
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

  /// Backend, rank and world size for errors. Deliberately not `communicator::context()`: that
  /// one names the collective running now, which may be on the progress thread (reading its
  /// descriptor from here would race with the progress thread finishing it).
  error_context context() const {
    error_context c;
    c.backend = std::string(backend_name(comm_.backend()));
    c.rank = comm_.rank();
    c.world_size = comm_.world_size();
    return c;
  }

  [[noreturn]] void raise(errc code, const std::string& message) const { throw error(code, context(), message); }

  /// Records the failure, aborts the communicator (so peers waiting on this rank fail
  /// promptly) and throws.
  [[noreturn]] void fail(errc code, const std::string& message) {
    const std::string full = "gradient_reducer: " + message;
    failure_ = full;
    comm_.abort(full);
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
        set_flag(options_.reproducible ? 1 + static_cast<int>(std::min<std::uint64_t>(reproducible_micro_steps_, 1u << 30)) : 1);
      } catch (const std::exception& e) {
        fail_from(e, "step " + std::to_string(step_) + ": preparing the join agreement failed");
      }
      if (options_.collect_timings) agreement_launched_at_ = clock::now();
      agreement_ = all_gather_async(comm_, flags_send_, flags_, 1, dtype::int32);
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
      fetch_flags();
    } catch (const std::exception& e) {
      fail_from(e, "the agreement of step " + std::to_string(step_) + agreement_mode() + " could not be read");
    }
    step_contributors_ = count_flags();
    if (options_.reproducible) {
      one_contribution_each_ = true;
      for (int r = 0; r < comm_.world_size(); ++r) one_contribution_each_ = one_contribution_each_ && flags_[r] == 1;
    }
  }

  /// This rank's join flag (in the reducer's memory: the all_gather reads it there).
  void set_flag(int value) {
    if (memory_.is_device()) memory_.fill(flags_send_, 1, dtype::int32, value);
    else *flags_send_ = value;
  }

  /// Device memory: copies the gathered flags to the host (waits for the stream).
  void fetch_flags() {
    if (memory_.is_device())
      memory_.to_host(flags_host_.data(), flags_, sizeof(std::int32_t) * static_cast<std::size_t>(comm_.world_size()));
  }

  int count_flags() {
    const std::int32_t* flags = memory_.is_device() ? flags_host_.data() : flags_;
    int active = 0;
    int first = -1;
    for (int r = 0; r < comm_.world_size(); ++r)
      if (flags[r] != 0) {
        ++active;
        if (first < 0) first = r;
      }
    if (active > 0) last_trained_rank_ = first;
    return active;
  }

  /// Join mode, blocking: contributes `active` to an agreement and returns how many ranks are active.
  int agree(bool active) {
    try {
      set_flag(active ? 1 : 0);
      all_gather(comm_, flags_send_, flags_, 1, dtype::int32);
      fetch_flags();
    } catch (const std::exception& e) {
      fail_from(e, "join(): the agreement with the other ranks failed");
    }
    return count_flags();
  }

  void mark(std::size_t i, bool zero) {
    check_usable();
    check_index(i, zero ? "mark_unused" : "mark_ready");
    const bool sync = require_sync_;
    if (!sync) {  // accumulation micro-step: nothing to communicate
      ++unsynced_marks_;
      if (!options_.reproducible) return;  // reproducible: the micro-batch is deposited below
    }
    if (sync && !step_open_) open_step();
    if (ready_[i])
      fail(errc::invalid_argument, std::string(zero ? "mark_unused" : "mark_ready") + "(" + describe(i) + ") called twice in " +
                                       (sync ? "step " + std::to_string(step_) : std::string("an accumulation micro-step")));
    ready_[i] = 1;
    if (sync && rebuild_pending()) ready_order_.push_back(i);
    bucket& b = buckets_[bucket_of_[i]];
    try {
      if (zero) zero_slot(i);
      else if (!options_.gradient_as_bucket_view && params_[i].count != 0) {
        const std::size_t es = dtype_size(params_[i].type);
        memory_.copy(static_cast<std::byte*>(b.storage.get()) + offset_of_[i] * es, params_[i].grad,
                     static_cast<std::size_t>(params_[i].count) * es);
      }
    } catch (const std::exception& e) {
      fail_from(e, std::string(zero ? "mark_unused" : "mark_ready") + "(" + describe(i) + "): moving the gradient into bucket " +
                       std::to_string(bucket_of_[i]) + " failed");
    }
    --b.pending;
    if (options_.reproducible && b.pending == 0) {
      if (sync) resolve_agreement();  // one micro-batch on every rank: the bucket goes out as it is
      try {
        if (!sync || !one_contribution_each_) reproducible_.deposit(bucket_of_[i], b.storage.get());
      } catch (const std::exception& e) {
        fail_from(e, "depositing bucket " + std::to_string(bucket_of_[i]) + " into its reproducible accumulator failed");
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
    memory_.zero(static_cast<std::byte*>(b.storage.get()) + offset_of_[i] * es, static_cast<std::size_t>(params_[i].count) * es);
  }

  /// Zeroes every bucket (join's shadow steps).
  void zero_buckets() {
    try {
      for (auto& b : buckets_) memory_.zero(b.storage.get(), b.bytes_allocated);
    } catch (const std::exception& e) {
      fail_from(e, "join(): zeroing the buckets failed");
    }
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
      const std::size_t rebuild_bytes = (params_.size() + 1) * sizeof(std::int64_t) * (static_cast<std::size_t>(comm_.world_size()) + 1);
      const std::size_t size = std::max(whole + bytes, rebuild_bytes);
      if (control_storage_) memory_.synchronize();
      control_storage_.reset();
      control_storage_ = memory_.allocate(size);
      control_bytes_ = size;
    }
    auto* gathered = static_cast<std::byte*>(control_storage_.get());
    memory_.from_host(gathered + whole, mine, bytes);
    all_gather(comm_, gathered + whole, gathered, count, type);
    memory_.to_host(all, gathered, whole);
  }

  gradient_bucket view_of(std::size_t k) {
    bucket& b = buckets_[k];
    gradient_bucket g;
    g.index = k;
    g.bucket_count = buckets_.size();
    g.data = b.storage.get();
    g.count = b.info.count;
    g.type = b.info.type;
    g.parameters = b.info.parameters;
    g.offsets = b.info.offsets;
    g.world_size = comm_.world_size();
    g.contributors = step_contributors_;
    g.divisor = options_.divide_by_initial_world_size ? comm_.world_size() : std::max(1, step_contributors_);
    g.space = memory_.space();
    g.cuda_stream = memory_.stream();
    g.cuda_device = memory_.device();
    return g;
  }

  void launch(std::size_t k) {
    resolve_agreement();
    bucket& b = buckets_[k];
    if (options_.reproducible && one_contribution_each_) {
      // Every rank holds one micro-batch: the reproducible all_reduce of the bucket itself, the
      // same function of the same contributions as the accumulator's, asynchronous.
      if (options_.collect_timings) b.launched_at = clock::now();
      collective_options reproducible;
      reproducible.reproducible = true;
      try {
        b.pending_work = all_reduce_async(comm_, b.storage.get(), b.storage.get(), b.info.count, b.info.type,
                                          reduce_op(reduce_kind::avg), reproducible);
      } catch (const std::exception& e) {
        fail_from(e, "step " + std::to_string(step_) + ": the reproducible all_reduce of bucket " + std::to_string(k) +
                         " failed to launch");
      }
      return;
    }
    if (options_.reproducible) {  // blocking: the reproducible average of the bucket's contributions
      const auto t0 = clock::now();
      try {
        reproducible_.reduce(comm_, k, b.storage.get());
      } catch (const std::exception& e) {
        fail_from(e, "step " + std::to_string(step_) + ": the reproducible average of bucket " + std::to_string(k) +
                         " (parameters " + describe_bucket(k) + ") failed");
      }
      b.launched_at = clock::now();
      if (options_.collect_timings) {
        stats_.exposed_seconds += std::chrono::duration<double>(b.launched_at - t0).count();
        add_interval(t0, b.launched_at);
      }
      b.pending_work = work{};
      return;
    }
    if (options_.collect_timings) b.launched_at = clock::now();
    try {
      b.pending_work = options_.hook->launch(comm_, view_of(k));
    } catch (const std::exception& e) {
      fail_from(e, "step " + std::to_string(step_) + ": the '" + options_.hook->name() + "' hook failed to launch bucket " +
                       std::to_string(k));
    }
  }

  /// Waits for every bucket in order, completes it, copies back (not in shadow steps), and
  /// accounts the timings.
  void wait_and_complete(bool shadow) {
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      bucket& b = buckets_[k];
      const auto t0 = clock::now();
      try {
        detail::await_work(b.pending_work);
      } catch (const std::exception& e) {
        // Uneven inputs show as a collective mismatch (a peer already in another collective), a
        // peer that never arrives (timeout) or one that left; other failures (an abort caused by
        // a failing rank, bad arguments, a library error) carry their own cause, and the join
        // hint would mislead.
        const auto* re = dynamic_cast<const error*>(&e);
        const bool maybe_uneven = re == nullptr || re->kind() == errc::contract_mismatch || re->kind() == errc::timeout ||
                                  re->kind() == errc::peer_exited || re->kind() == errc::size_mismatch;
        fail_from(e, "step " + std::to_string(step_) + ": reducing bucket " + std::to_string(k) + " (parameters " +
                         describe_bucket(k) + ") failed" +
                         (maybe_uneven ? std::string(". If ranks run different numbers of synchronised steps (uneven "
                                                     "inputs), enable reducer_options::join and call join() when a "
                                                     "rank runs out of data")
                                       : std::string()));
      }
      if (options_.collect_timings) {
        const auto t1 = clock::now();
        stats_.exposed_seconds += std::chrono::duration<double>(t1 - t0).count();
        const auto done = b.pending_work.valid() ? b.pending_work.completion_time() : b.launched_at;
        add_interval(b.launched_at, done);
      }
      b.pending_work = work{};
      if (!options_.reproducible) {  // reproducible mode averaged the bucket itself in launch()
        try {
          options_.hook->complete(view_of(k));
        } catch (const std::exception& e) {
          fail_from(e, "step " + std::to_string(step_) + ": the '" + options_.hook->name() + "' hook failed to complete bucket " +
                           std::to_string(k));
        }
      }
      ++stats_.buckets_reduced;
      if (!shadow && !options_.gradient_as_bucket_view) {
        const std::size_t es = dtype_size(b.info.type);
        const auto* base = static_cast<const std::byte*>(b.storage.get());
        try {
          for (std::size_t j = 0; j < b.info.parameters.size(); ++j) {
            const reducer_parameter& p = params_[b.info.parameters[j]];
            if (p.count) memory_.copy(p.grad, base + b.info.offsets[j] * es, static_cast<std::size_t>(p.count) * es);
          }
        } catch (const std::exception& e) {
          fail_from(e, "step " + std::to_string(step_) + ": copying the averaged gradients out of bucket " +
                           std::to_string(k) + " failed");
        }
      }
    }
    flush_intervals();
  }

  /// Adds [a, b] to the step's set of in-flight intervals (launch order; FIFO completion makes
  /// them sorted by start, so merging consecutive ones computes the union).
  void add_interval(clock::time_point a, clock::time_point b) {
    if (b < a) b = a;
    if (step_end_ == clock::time_point::min()) {
      step_start_ = a;
      step_end_ = b;
      return;
    }
    if (a > step_end_) {
      stats_.reduction_seconds += std::chrono::duration<double>(step_end_ - step_start_).count();
      step_start_ = a;
    }
    if (b > step_end_) step_end_ = b;
  }

  void flush_intervals() {
    if (step_end_ != clock::time_point::min())
      stats_.reduction_seconds += std::chrono::duration<double>(step_end_ - step_start_).count();
    step_start_ = clock::time_point::max();
    step_end_ = clock::time_point::min();
  }

  std::string describe_bucket(std::size_t k) const {
    std::string s;
    const auto& ps = buckets_[k].info.parameters;
    for (std::size_t j = 0; j < ps.size() && j < 6; ++j) s += (j ? ", " : "") + describe(ps[j]);
    if (ps.size() > 6) s += ", ...";
    return s;
  }

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
  void rebuild(bool have_order) {
    rebuilt_ = true;
    const std::size_t n = params_.size();
    const std::size_t width = n + 1;
    std::vector<std::int64_t> mine(width, -1);
    if (have_order && ready_order_.size() == n) {
      mine[0] = 1;
      for (std::size_t k = 0; k < n; ++k) mine[k + 1] = static_cast<std::int64_t>(ready_order_[k]);
    } else {
      mine[0] = 0;
    }
    std::vector<std::int64_t> all(width * static_cast<std::size_t>(comm_.world_size()));
    try {
      gather_to_host(mine.data(), all.data(), width, dtype::int64);
    } catch (const std::exception& e) {
      fail_from(e, "rebuilding the buckets after step " + std::to_string(step_) + " failed");
    }
    ready_order_.clear();
    ready_order_.shrink_to_fit();
    for (int r = 0; r < comm_.world_size(); ++r) {
      const std::int64_t* row = all.data() + static_cast<std::size_t>(r) * width;
      if (row[0] != 1) continue;
      std::vector<std::size_t> order(n);
      for (std::size_t k = 0; k < n; ++k) order[k] = static_cast<std::size_t>(row[k + 1]);
      std::vector<bucket_plan> plans;
      try {
        plans = plan(order);
      } catch (const std::exception& e) {
        fail_from(e, "rank " + std::to_string(r) + " recorded an invalid ready order");
      }
      bool same = plans.size() == buckets_.size();
      for (std::size_t k = 0; same && k < plans.size(); ++k) same = plans[k].tensors == buckets_[k].info.parameters;
      if (!same) {
        install_layout(plans, /*carry_gradients=*/options_.gradient_as_bucket_view);
        ++generation_;
        ++stats_.rebuilds;
      }
      return;
    }
  }

  communicator& comm_;
  bucket_memory memory_;  // host memory, or the communicator's device and stream
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
  int step_contributors_ = 1;
  detail::reproducible_bucket_accumulators reproducible_;  // reproducible mode: one per bucket
  std::uint64_t reproducible_micro_steps_ = 0;  // micro-batches deposited under no_sync since the last sync step
  bool one_contribution_each_ = false;          // this step: every rank holds exactly one micro-batch

  // join mode
  detail::bucket_storage flags_storage_;  // world_size received flags, then the one sent
  std::int32_t* flags_ = nullptr;
  std::int32_t* flags_send_ = nullptr;
  std::vector<std::int32_t> flags_host_;  // device memory: the received flags, read back

  // device memory: staging of the host values exchanged at construction and at the rebuild
  detail::bucket_storage control_storage_;
  std::size_t control_bytes_ = 0;
  work agreement_;
  bool agreement_pending_ = false;
  clock::time_point agreement_launched_at_{};
  int last_trained_rank_ = -1;

  reducer_stats stats_;
  clock::time_point step_start_ = clock::time_point::max();
  clock::time_point step_end_ = clock::time_point::min();
  std::string failure_;
};

}  // namespace ringzero
