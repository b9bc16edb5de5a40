#pragma once
/// @file
/// `zero::sharded_model`: ZeRO stages 0-3 at run time, over any `ringzero::communicator`.
///
/// The model owns parameters, gradients, master weights, optimizer states and communication
/// buffers as a `shard_plan` lays them out; the trainer computes with views (`parameter<T>(i)`,
/// `gradient<T>(i)`) and calls the hooks `pre_forward`/`post_forward`/`pre_backward`/
/// `post_backward`/`end_backward`/`step`, the same loop at every stage (no-ops where a stage
/// needs none). Errors: the constructor agrees across ranks and throws on every rank before any
/// step when plans, parameters or options differ. Thread semantics: one thread per rank; the
/// collective calls in the same order on every rank. One path for host and device memory: the
/// state lives in a compute stream's memory space and every operation on it is stream work (a
/// communication stream for collectives and the step, ordered against the compute stream by
/// events; zero/execution_stream.hpp). On the host path the compute stream is the calling
/// thread and the communication stream runs on the communicator's progress thread; a
/// `device_context` brings the trainer's own stream (the simulated device of CI, or CUDA, where
/// the step runs as CUDA kernels: zero/optimizer_kernels.cuh).
/// The manual (what each stage does, the loop, views, clipping, hybrid sharding, reproducible
/// mode, memory): docs/zero.md, "The runtime in detail".

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/collective/agreement.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/reduce_scatter.hpp"
#include "ringzero/no_sync.hpp"
#include "ringzero/primitive/memory_counter.hpp"
#include "ringzero/zero/execution_stream.hpp"
#include "ringzero/zero/gather_schedule.hpp"
#include "ringzero/zero/gather_timing.hpp"
#include "ringzero/zero/gradient_schedule.hpp"
#include "ringzero/zero/host_buffer.hpp"
#include "ringzero/zero/loss_scaler.hpp"
#include "ringzero/zero/model_agreement.hpp"
#include "ringzero/zero/optimizer.hpp"
#include "ringzero/zero/optimizer_offload.hpp"
#include "ringzero/zero/reproducible_gradients.hpp"
#include "ringzero/zero/shard_plan.hpp"
#include "ringzero/zero/sharded_model_options.hpp"
#include "ringzero/zero/sharded_optimizer.hpp"

namespace ringzero::zero {

class checkpoint_access;

/// See the file comment.
class sharded_model {
 public:
  /// A model running `plan` on `comm` (and `replica_comm` for hybrid sharding) for a trainer
  /// that registers `registered` (which must equal the plan's parameters). A collective over
  /// both communicators. Throws errc::invalid_argument on every rank when a rank's registered
  /// parameters, world size, replica group size, optimizer or memory space (`shard_plan::space()`,
  /// host here) do not match its plan, or when the ranks' plans differ (the message says which).
  sharded_model(communicator& comm, shard_plan plan, std::span<const parameter_spec> registered,
                const sharded_model_options& options = {}, communicator* replica_comm = nullptr)
      : sharded_model(construct_tag{}, comm, std::move(plan), registered, nullptr, options, replica_comm) {}

  /// The device path of the constructor above: the model state lives in the memory space of
  /// `device.compute` (allocated and zeroed by stream work); the trainer enqueues its forward
  /// and backward on that stream; the runtime's collectives run on a communication stream
  /// ordered against it by events (docs/zero.md, "The device path"). Throws as the constructor
  /// above (the plan's space must be the compute stream's), and errc::invalid_argument on every rank
  /// when the stream is missing, on another device than the communicator's rank, or its memory is
  /// not the communicator's.
  sharded_model(communicator& comm, shard_plan plan, std::span<const parameter_spec> registered,
                const device_context& device, const sharded_model_options& options = {},
                communicator* replica_comm = nullptr)
      : sharded_model(construct_tag{}, comm, std::move(plan), registered, &device, options, replica_comm) {}

  /// Plans `request` for these communicators (its world size and replica group size are set
  /// from them) and runs it for a trainer registering `request.parameters`. Throws as the
  /// other constructor does; a request the planner refuses on some rank is refused on every
  /// rank (the planner's message on that rank, the refusing ranks named on the others).
  sharded_model(communicator& comm, plan_request request, const sharded_model_options& options = {},
                communicator* replica_comm = nullptr)
      : sharded_model(comm, plan_for(comm, std::move(request), replica_comm, nullptr), nullptr, options, replica_comm) {
  }

  /// The device path of the constructor above (see the device constructor for `device`).
  sharded_model(communicator& comm, plan_request request, const device_context& device,
                const sharded_model_options& options = {}, communicator* replica_comm = nullptr)
      : sharded_model(comm, plan_for(comm, std::move(request), replica_comm, &device), &device, options, replica_comm) {
  }

  sharded_model(const sharded_model&) = delete;
  sharded_model& operator=(const sharded_model&) = delete;

  /// Waits for every collective still in flight (their errors are dropped), then frees. The
  /// device path first waits for the compute stream's work enqueued so far and drains the
  /// communication stream.
  ~sharded_model() {
    if (comm_stream_ == nullptr) return;  // refused before the streams existed
    try {
      compute_->record(*compute_mark_);
      compute_->wait_host(*compute_mark_);
    } catch (...) {}
    comm_stream_->synchronize_quietly();
  }

  /// The communication stream: the runtime's collectives, optimizer step and copies run there
  /// (on the host path a host stream driven by the shard communicator's progress thread; on
  /// the device path the compute stream's kind). For tests, which pause it.
  execution_stream* communication_stream() noexcept { return comm_stream_.get(); }
  /// The compute stream: the device_context's, or on the host path one run by the calling
  /// thread (the trainer's own code is its work).
  execution_stream* compute_stream() noexcept { return compute_; }
  /// The offload stream (offload::optimizer or parameters on the device path; else nullptr): the CPU update runs there.
  /// For tests.
  execution_stream* offload_stream() noexcept { return offload_ ? offload_->stream.get() : nullptr; }
  /// Blocks until the runtime's work enqueued so far (communication stream) has run; rethrows
  /// its error.
  void synchronize() { comm_stream_->synchronize(); }

  /// The plan.
  const shard_plan& plan() const noexcept { return plan_; }
  /// Number of parameters.
  std::size_t parameter_count() const noexcept { return plan_.parameters().size(); }
  /// Number of gather units.
  std::size_t unit_count() const noexcept { return plan_.units().size(); }
  /// Index of the parameter named `name`; throws errc::invalid_argument when there is none.
  std::size_t index(std::string_view name) const {
    if (auto i = plan_.find(name)) return *i;
    raise("no parameter is named '" + std::string(name) + "'");
  }
  /// The unit that uses parameter p (the unit whose pre_forward/pre_backward gathers it).
  std::size_t unit_of(std::size_t p) const { return placement(p).unit; }
  /// Parameter p's element count (its shape's product; `plan().placements()[p].numel`).
  std::uint64_t numel(std::size_t p) const { return placement(p).numel; }

  /// Parameter p's values (its tie group's storage for an alias): `numel` elements of its dtype,
  /// laid out as the trainer's shape, row-major or not as the trainer decides (at stage 3 with
  /// quantized weights, the dequantized values every rank computes with). Throws
  /// errc::invalid_argument when T is not the parameter's dtype or, at stage 3, when no unit using
  /// it is gathered (unless kept whole: `shard_plan::holds_whole`). The file comment: how long views last.
  template <element_type T>
  std::span<T> parameter(std::size_t p) {
    const parameter_placement& pl = placement(p);
    check_type(dtype_of<T>, pl.type, p, "parameter");
    if (pl.numel == 0) return {};
    return {reinterpret_cast<T*>(parameter_storage(p)), static_cast<std::size_t>(pl.numel)};
  }

  /// Parameter p's gradient, to ADD this micro-batch's gradient into (its tie group's one
  /// gradient for an alias). Throws errc::invalid_argument for a frozen parameter, when T is not
  /// the gradient dtype, or when the owning unit's reduction has already started in this
  /// micro-batch. Sharded gradients (shard_plan::sharded_gradients) take a bucket on a unit's first request.
  /// Reproducible mode: the view holds zeros at the start of every micro-batch (at every stage).
  template <element_type T>
  std::span<T> gradient(std::size_t p);

  /// Sets parameter p (and its master weights) from `values` (`numel` float values, rounded to
  /// the parameter's dtype). Every rank must pass the same values; at stage 3 each rank keeps
  /// only what it owns (unless kept whole), and a gathered copy of p's unit shows the new values
  /// too, except under quantized weight gathers, where every kept and prefetched unit is
  /// released instead (`parameter<T>` then refuses until the next pre_* hook; a unit in use
  /// keeps the raw values). Local. Throws errc::invalid_argument on a size mismatch.
  void set_parameter(std::size_t p, std::span<const float> values);
  /// Sets parameter p from `values`: `numel(p)` elements of the parameter's dtype T in the
  /// compute stream's memory (a trainer's own device buffer on the device path), copied on the
  /// streams with no host round trip (master weights: the values widened to float32). Ordered
  /// after the compute stream's work enqueued so far, and before what it enqueues after this
  /// call; `values` must stay unchanged until then (cudaMemcpyAsync's contract). Every rank
  /// passes the same values; gathered copies as for `set_parameter`. Local; errors of the
  /// copies surface at the next wait (`step()`).
  /// Throws errc::invalid_argument when T is not the parameter's dtype.
  /// Also throws errc::invalid_argument (nothing copied) for a null `values` of a parameter with
  /// elements, and where the program's CUDA table can tell (zero/sharded_model.hpp,
  /// `check_trainer_memory`) for device memory beside a host compute stream, host memory CUDA
  /// does not know beside a CUDA stream, and device memory of another device.
  template <element_type T>
  void set_parameter_async(std::size_t p, const T* values) {
    check_type(dtype_of<T>, plan_.buffers()[placement(p).buffer].type, p, "parameter");
    check_trainer_memory(values, numel(p), "set_parameter_async('" + name(p) + "')'s values");
    write_parameter(p, reinterpret_cast<const unsigned char*>(values), nullptr);
    compute_waits_for_comm();
  }

  /// Copies parameter p's current values into `out` (`numel` floats). At stage 3 this is a
  /// collective (every rank calls it for the same p, in the same order) unless a unit holding
  /// p is gathered or p is kept whole. Throws errc::invalid_argument on a size mismatch.
  void read_parameter(std::size_t p, std::span<float> out);
  /// Copies parameter p's current values into `out`: `numel(p)` elements of its dtype T in the
  /// compute stream's memory, on the streams with no host round trip; the compute stream's work
  /// enqueued after this call sees them. A collective as `read_parameter`. Throws
  /// errc::invalid_argument when T is not the parameter's dtype, and for `out` as
  /// `set_parameter_async` for its values.
  template <element_type T>
  void read_parameter_async(std::size_t p, T* out) {
    check_type(dtype_of<T>, plan_.buffers()[placement(p).buffer].type, p, "parameter");
    check_trainer_memory(out, numel(p), "read_parameter_async('" + name(p) + "')'s output");
    copy_parameter_out(p, reinterpret_cast<unsigned char*>(out));
    compute_waits_for_comm();
  }

  /// Before the forward of unit u: at stage 3, gathers u (and the units whose tied storage it
  /// uses), starts gathering u+1, and waits for u. No-op at stages 0-2.
  void pre_forward(std::size_t u) { pre(u, true); }
  /// After the forward of unit u: at stage 3, releases what `pre_forward(u)` gathered, or keeps
  /// it gathered for u's backward when the plan's `reshard_after_forward` policy keeps u
  /// (`shard_plan::reshards_after_forward`). What is kept is released by `end_backward()`,
  /// `step()`, a checkpoint restore, or the next forward pass (a `pre_forward` at or before the
  /// unit the last one reached: the backward did not come, as after an evaluation pass).
  void post_forward(std::size_t u) { post(u, "post_forward", "pre_forward", !plan_.reshards_after_forward(u)); }
  /// Before the backward of unit u: at stage 3, gathers u again (unless its forward kept it),
  /// starts gathering u-1, waits for u.
  void pre_backward(std::size_t u) {
    micro_begun_ = true;
    pre(u, false);
  }
  /// After the backward of unit u: releases its gather (stage 3; kept instead while
  /// `reshard_after_backward()` is false) and, once every unit using a
  /// storage has finished, marks that storage's gradient final, which may start reductions.
  void post_backward(std::size_t u) {
    post(u, "post_backward", "pre_backward", !reshard_after_backward_);
    micro_begun_ = true;
    if (syncing()) {
      gradient_hooks h{*this};
      gradients_.unit_done(u, h);
    }
  }

  /// Parameter p's gradient is final for this micro-batch (PyTorch's gradient hook): its unit's
  /// reduction may start once every storage of the unit is final. Throws errc::invalid_argument
  /// for a frozen parameter or when p's storage was already marked in this micro-batch.
  void mark_ready(std::size_t p) {
    const parameter_placement& pl = placement(p);
    if (!plan_.parameters()[p].trainable) raise("mark_ready('" + name(p) + "'): the parameter is frozen");
    if (pl.numel == 0) return;
    const std::size_t s = plan_.storage_id(p);
    if (marked_[s])
      raise("mark_ready('" + name(p) + "'): the gradient of its storage ('" + name(pl.storage) +
            "') was already marked ready in this micro-batch");
    marked_[s] = true;
    micro_begun_ = true;
    if (syncing()) {
      gradient_hooks h{*this};
      (void)gradients_.storage_ready(s, h);
    }
  }

  /// Ends the backward of one micro-batch: starts every reduction not yet started (sharded
  /// gradients every micro-batch, full ones in the step's last), waits for them, releases every
  /// gather buffer. Under no_sync nothing is reduced (see `set_require_gradient_sync`). Throws
  /// errc::invalid_argument after the step's last micro-batch (the plan's accumulation_steps-th,
  /// or the first ended with sync on after a no_sync one) until `step()`.
  void end_backward();

  /// Turns gradient synchronisation off (`false`: micro-batches accumulate their gradients
  /// locally and reduce nothing) or back on (PyTorch FSDP2's `set_requires_gradient_sync`; the
  /// DDP reducer's method of the same name). Once a micro-batch of a step has ended with sync
  /// off, the trainer decides how many micro-batches the step has: the next one that ends with
  /// sync on reduces everything accumulated (one reduction per buffer, the plan's traffic for one
  /// micro-batch) and is the step's last; `step()` follows (it ends that micro-batch itself if
  /// `end_backward()` was not called). Without it the plan's accumulation_steps decides, as
  /// before. Sync off needs gradients to accumulate into: stages 0-1, stages 2-3 planned with
  /// `plan_request::accumulate_unsharded` (the full gradients' memory), or reproducible mode.
  /// Every rank must turn it off for the same micro-batches: `step()` compares the ranks'
  /// micro-batch counts (and refuses, on every rank, a step taken with sync off). Local. Throws
  /// errc::invalid_argument when sync off is asked of sharded gradients, or when the mode would
  /// change in the middle of a micro-batch (after its first `gradient`, `mark_ready`,
  /// `pre_backward` or `post_backward`; change it between `end_backward()` and the next backward).
  void set_require_gradient_sync(bool on);
  /// True when micro-batches reduce their gradients (the default): the mode last set, which a
  /// guard closed in the middle of a micro-batch sets for the micro-batches after it.
  bool require_gradient_sync() const noexcept { return pending_sync_; }
  /// Gradient sync off until the guard is destroyed (ringzero/no_sync.hpp: the same guard type as
  /// `ddp::gradient_reducer::no_sync()`). Throws as `set_require_gradient_sync(false)`.
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(*this); }

  /// Stage 3: whether `post_backward` releases a unit's gathered parameters (true, the default)
  /// or keeps them for the next micro-batch (FSDP2's `set_reshard_after_backward`): with
  /// accumulation the next forward then gathers nothing (and its backward nothing either where
  /// the plan's reshard_after_forward keeps the unit). Costs a gathered copy of every unit the
  /// backward reached beyond the plan's gather buffers (the pool grows and keeps that size;
  /// `memory_allocated` counts it). What is kept is released by `step()` (the update changes the shards), a
  /// checkpoint restore, a new forward pass that no backward followed, or the end of a
  /// micro-batch once the mode is true again. Every rank must set the same mode (a gather on one
  /// rank meeting another collective is a contract error on every rank). Local; any time;
  /// no effect at stages 0-2.
  void set_reshard_after_backward(bool on) noexcept { reshard_after_backward_ = on; }
  /// See `set_reshard_after_backward`.
  bool reshard_after_backward() const noexcept { return reshard_after_backward_; }

  /// The optimizer step: ends the last micro-batch if `end_backward()` was not called for it,
  /// averages gradient shards across replica groups, computes the global gradient norm, clips,
  /// updates the rank's shard, all_gathers the parameters (stages 1-2), zeroes the gradients.
  /// At stage 3 it first releases every gather still held (a unit prefetched or gathered after
  /// `end_backward()`, e.g. by an evaluation pass), so no view shows parameters from before the
  /// update. Throws errc::invalid_argument when the number of micro-batches is not the plan's
  /// accumulation_steps (unless no_sync made the count the trainer's), or at stage 3 while a unit
  /// is gathered by a `pre_forward` / `pre_backward` not yet matched by its `post_forward` /
  /// `post_backward`; on every rank, updating nothing, when a rank has gradient sync off or the
  /// ranks ended different numbers of micro-batches.
  step_result step();

  /// Sets the learning rate of the next steps; every rank must set the same value (each `step()`
  /// compares the ranks' rates, one small all_gather, and throws errc::invalid_argument on every
  /// rank, before updating anything, when they differ). Throws errc::invalid_argument (naming
  /// this rank) when the optimizer refuses the value.
  void set_learning_rate(double lr) {
    try {
      optimizer_->set_learning_rate(lr);
    } catch (const error& e) {
      std::string why = e.message();
      constexpr std::string_view inner = "zero::sharded_optimizer: ";
      if (why.starts_with(inner)) why.erase(0, inner.size());
      ringzero::detail::raise(comm_, e.kind(), "zero::sharded_model: set_learning_rate: " + why);
    }
  }
  /// The sharded optimizer (master weights, states, options).
  const sharded_optimizer& optimizer() const noexcept { return *optimizer_; }
  /// The factor the trainer multiplies its loss by before backward (1 without loss scaling).
  double loss_scale() const noexcept { return scaler_.scale(); }
  /// The loss scaler (scale, good-step count, options); checkpoints restore it through
  /// `checkpoint_access` (zero/checkpoint_access.hpp).
  const loss_scaler& scaler() const noexcept { return scaler_; }

  // ---- the job (checkpoint/ and reports) ------------------------------------------------------

  /// The shard communicator.
  communicator& comm() noexcept { return comm_; }
  /// The replica communicator of hybrid sharding, or nullptr.
  communicator* replica_comm() noexcept { return replica_; }
  /// This rank's number in the whole job: replica rank * shard group size + shard rank (the
  /// rank whose `plan().shard_index()` this rank holds).
  int global_rank() const noexcept {
    return (replica_ != nullptr ? replica_->rank() * comm_.world_size() : 0) + comm_.rank();
  }
  /// True between steps: no micro-batch begun (no end_backward since the last step, no gradient
  /// bucket taken) and no unit gathered by a pre_forward / pre_backward without its post_* (a
  /// unit kept by `reshard_after_forward` after an evaluation pass does not count).
  bool between_steps() const noexcept {
    if (micro_ != 0 || micro_begun_) return false;
    for (std::size_t u = 0; u < plan_.units().size(); ++u)
      if ((gathers_.in_use(u) && !gathers_.kept(u)) || gradients_.state(u) != detail::gradient_schedule::phase::idle)
        return false;
    return true;
  }

  /// Bytes this rank holds now, by category (pools at their current size).
  memory_breakdown memory_in_use() const;
  /// What this rank's runtime has allocated in `space`, measured where it allocates
  /// (primitive/memory_counter.hpp): bytes held now, the most held at once since construction or
  /// `reset_memory_peak()`, allocations. Every buffer: the model states and communication buffers
  /// `memory_in_use()` sums, the pools as they grow, the step's scalars, offload's transfer buffers,
  /// temporaries; not the trainer's memory (activations, its tensors), a communicator's, nor
  /// reproducible mode's accumulators (heap memory, docs/zero.md). Local; any thread. With `what`:
  /// the part that category asked for (its own peak; the categories' peaks may sum past the total's).
  primitive::memory_usage memory_allocated(primitive::memory_space space) const noexcept {
    return memory_counter_.total().usage(space);
  }
  primitive::memory_usage memory_allocated(primitive::memory_space space, memory_category what) const noexcept {
    return memory_counter_.of(static_cast<std::size_t>(what)).usage(space);
  }
  /// Starts `memory_allocated`'s peaks (total and by category) again from what is held now.
  void reset_memory_peak() noexcept { memory_counter_.reset_peak(); }
  /// With `sharded_model_options::time_gathers`: stage 3's unit gathers and the compute stream's
  /// waits for them, timed since construction or `reset_gather_times()` (zero/gather_timing.hpp);
  /// zeros otherwise. Waits for the streams' work enqueued so far. Local.
  gather_timing gather_times();
  /// Starts `gather_times()`'s sums again.
  void reset_gather_times() noexcept { timer_.reset(); }

  /// The part of `memory_in_use()` that offload keeps in host memory (offload::optimizer: master
  /// weights, optimizer states, transfer buffers; offload::parameters: the parameter and gradient
  /// shards too, no transfer buffers); zero without offload. Equals `plan().host_memory()`.
  memory_breakdown offloaded_memory_in_use() const {
    if (!offload_) return {};
    memory_breakdown m{0, 0, optimizer_->master_bytes(), optimizer_->state_bytes(), offload_->bytes()};
    if (parameters_offloaded())
      for (std::size_t b = 0; b < params_.size(); ++b) {
        if (!plan_.holds_whole(b)) m.parameters += params_[b].bytes();  // a replicated buffer stays on the device
        m.gradients += grads_[b].bytes();
      }
    return m;
  }
  /// The part of `memory_in_use()` in `space` (host path: host; device path: the compute stream's).
  memory_breakdown memory_in_use(primitive::memory_space space) const;

 private:
  friend class checkpoint_access;  // zero/checkpoint_access.hpp: what checkpoint/ needs
  friend class adoption_access;    // zero/parameter_adoption.hpp: the trainer's memory as storage
  struct construct_tag {};
  // Both public constructors: `device` null on the host path.
  sharded_model(construct_tag, communicator& comm, shard_plan plan, std::span<const parameter_spec> registered,
                const device_context* device, const sharded_model_options& options, communicator* replica_comm)
      : comm_(comm),
        replica_(replica_comm),
        plan_(std::move(plan)),
        options_(options),
        shard_index_(plan_.stage() == 0 ? 0 : comm.rank()),
        gathers_(plan_.make_gather_schedule()),
        gradients_(plan_.make_gradient_schedule()) {
    start(device, agreement().problem(registered));
  }

  struct gather_hooks {
    sharded_model& m;
    void start(std::size_t u) { m.start_gather(u); }
    void wait(std::size_t u) { m.wait_gather(u); }
    void free(std::size_t u) { m.free_gather(u); }
  };
  struct gradient_hooks {
    sharded_model& m;
    void fill(std::size_t u) { m.fill_bucket(u); }
    void launch(std::size_t u) { m.launch_reduction(u); }
    void complete(std::size_t u) { m.complete_reduction(u); }
  };

  /// A plan, or why the planner refused this rank's request (then `plan` is an empty model's,
  /// held only until every rank has learnt of the refusal).
  struct planned {
    shard_plan plan;
    std::string problem;
  };

  sharded_model(communicator& comm, planned p, const device_context* device, const sharded_model_options& options,
                communicator* replica_comm)
      : comm_(comm),
        replica_(replica_comm),
        plan_(std::move(p.plan)),
        options_(options),
        shard_index_(plan_.stage() == 0 ? 0 : comm.rank()),
        gathers_(plan_.make_gather_schedule()),
        gradients_(plan_.make_gradient_schedule()) {
    start(device, p.problem.empty() ? agreement().problem(plan_.parameters()) : p.problem);
  }

  /// Plans `request` for the communicators (and, where the request names no memory space, for
  /// the space of `device`'s compute stream). A refusal is kept (not thrown) so that the other
  /// ranks learn of it in `agree` instead of waiting there for this rank until the timeout.
  static planned plan_for(const communicator& comm, plan_request request, const communicator* replica,
                          const device_context* device);

  /// `allocate()` on every rank, then one exchange so that a rank that could not allocate its
  /// share makes every rank throw (naming it) instead of leaving the others to time out in the
  /// first collective.
  void allocate_everywhere();

  [[noreturn]] void raise(const std::string& message) const {
    ringzero::detail::raise(comm_, errc::invalid_argument,
                            "zero::sharded_model: " + detail::hybrid_position(comm_, replica_) + message);
  }

  /// Refuses (errc::invalid_argument naming `what` and this rank) trainer memory `p` for
  /// `elements` elements that the compute stream cannot reach: null with elements; where the
  /// program registered the CUDA table (primitive::locate_pointer, cudaPointerGetAttributes),
  /// device memory beside a host compute stream, host memory CUDA does not know (neither pinned
  /// nor managed) beside a CUDA stream, and device memory of another device than the stream's.
  /// Without the table every pointer is host memory and only null is refused. Local; O(1).
  void check_trainer_memory(const void* p, std::uint64_t elements, const std::string& what) const {
    if (elements == 0) return;
    if (p == nullptr) raise(what + " is a null pointer for " + std::to_string(elements) + " element(s)");
    const std::optional<primitive::pointer_location> at = primitive::locate_pointer(p);
    if (!at) return;
    const bool device_stream = compute_->space() == primitive::memory_space::device;
    if (!device_stream && at->kind == primitive::pointer_kind::device)
      raise(what + " is device memory (CUDA device " + std::to_string(at->device) + "), but the compute stream is a " +
            compute_->kind() + ", whose memory is host memory: expected host memory");
    if (device_stream && at->kind == primitive::pointer_kind::host)
      raise(what +
            " is host memory that CUDA does not know (neither cudaMalloc'ed, pinned nor managed), but the "
            "compute stream is a " +
            std::string(compute_->kind()) + " on CUDA device " + std::to_string(compute_->device()) +
            ": expected device memory of that device");
    if (device_stream && at->kind == primitive::pointer_kind::device && at->device != compute_->device())
      raise(what + " is device memory of CUDA device " + std::to_string(at->device) +
            ", but the compute stream is on CUDA device " + std::to_string(compute_->device()) +
            ": expected memory of device " + std::to_string(compute_->device()));
  }

  /// The cross-rank checks of this model (zero/model_agreement.hpp).
  detail::model_agreement agreement() { return {comm_, replica_, plan_, options_, counter(memory_category::scratch)}; }
  /// The tags of the runtime's collectives, named in the contract check's errors
  /// (zero/model_agreement.hpp).
  using call_purpose = detail::call_purpose;
  collective_options tagged(call_purpose purpose, std::size_t buffer) const noexcept {
    return detail::tagged(purpose, buffer, &plan_);
  }

  const std::string& name(std::size_t p) const { return plan_.parameters()[p].name; }

  /// The host path's buffers are host memory; a communicator of device memory (NCCL) needs the
  /// device path. Every rank of a job has the same backend, so every rank refuses alike.
  void require_host_memory() const {
    if (comm_.space() != memory_space::host || (replica_ != nullptr && replica_->space() != memory_space::host))
      ringzero::detail::raise(comm_, errc::unsupported,
                              "zero::sharded_model without a device_context keeps its buffers in host memory; "
                              "the " +
                                  std::string(backend_name(comm_.backend())) +
                                  " communicator needs device memory: construct the model with a "
                                  "zero::device_context whose compute stream is a CUDA stream (the device path, "
                                  "docs/zero.md)");
  }

  const parameter_placement& placement(std::size_t p) const {
    if (p >= plan_.placements().size())
      raise("parameter index " + std::to_string(p) + " is outside [0, " + std::to_string(plan_.placements().size()) +
            ")");
    return plan_.placements()[p];
  }

  std::size_t storage_unit(std::size_t p) const { return plan_.placements()[plan_.placements()[p].storage].unit; }

  void check_type(dtype asked, dtype actual, std::size_t p, const char* what) const {
    if (asked != actual)
      raise(std::string(what) + " of '" + name(p) + "' is " + std::string(dtype_name(actual)) + ", requested as " +
            std::string(dtype_name(asked)));
  }

  void check_unit(std::size_t u) const {
    if (u >= plan_.units().size())
      raise("unit " + std::to_string(u) + " is outside [0, " + std::to_string(plan_.units().size()) + ")");
  }

  /// Sharded gradients (stages 2-3) reduce every micro-batch; full ones only in the step's last;
  /// nothing with sync off. Reproducible mode deposits every micro-batch (and reduces once, in end_backward).
  bool syncing() const noexcept {
    return options_.reproducible || (require_sync_ && plan_.sharded_gradients()) || ends_step();
  }
  /// The micro-batch in progress is the step's last: the plan's count, or the first synced after no_sync.
  bool ends_step() const noexcept {
    return require_sync_ && (trainer_window_ || micro_ == plan_.request().accumulation_steps - 1);
  }
  friend class ringzero::no_sync_guard;
  /// The guard's restore (never throws): at once between micro-batches, else when this one ends.
  void restore_gradient_sync(bool on) noexcept;
  void allocate();

  /// offload::parameters: the parameter shards (of buffers not held whole) and the gradient
  /// shards are host memory, the offload stream's `space`.
  bool parameters_offloaded() const noexcept { return plan_.request().offload == offload::parameters; }

  /// The input of buffer b's all_gather into `gathered` (its gathered copy, device memory): the
  /// rank's shard, or with offload::parameters the shard copied from host memory into its place
  /// in `gathered` on the communication stream, for an in-place all_gather (NCCL's convention).
  unsigned char* gather_input(std::size_t b, unsigned char* gathered) {
    unsigned char* shard = params_[b].data();
    if (!parameters_offloaded()) return shard;
    const flat_buffer& f = plan_.buffers()[b];
    const std::uint64_t bytes = f.shard_numel * dtype_size(f.type);
    unsigned char* in_place = gathered + static_cast<std::uint64_t>(shard_index_) * bytes;
    comm_stream_->copy(in_place, shard, bytes);
    return in_place;
  }

  algorithms::range owned_range(std::size_t b) const {
    const flat_buffer& f = plan_.buffers()[b];
    return plan_.stage() == 0 ? algorithms::range{0, f.numel} : f.shard(shard_index_);
  }

  /// The rank's own parameters of buffer b (the range the optimizer updates).
  unsigned char* owned_parameters(std::size_t b) {
    const flat_buffer& f = plan_.buffers()[b];
    if (!plan_.holds_whole(b)) return params_[b].data();
    return params_[b].data() + owned_range(b).begin * dtype_size(f.type);
  }

  /// The rank's own reduced gradient of buffer b.
  unsigned char* owned_gradient(std::size_t b) {
    const flat_buffer& f = plan_.buffers()[b];
    if (plan_.sharded_gradients()) return grads_[b].data();
    return grads_[b].data() + owned_range(b).begin * dtype_size(f.gradient_type);
  }

  /// On the communication stream, after everything before it there.
  void zero_gradients() {
    for (auto& g : grads_)
      if (g.bytes() != 0) comm_stream_->fill(g.data(), g.bytes(), dtype::uint8, 0);
  }

  unsigned char* parameter_storage(std::size_t p) {
    const parameter_placement& pl = plan_.placements()[p];
    const flat_buffer& f = plan_.buffers()[pl.buffer];
    const std::uint64_t es = dtype_size(f.type);
    if (plan_.holds_whole(pl.buffer)) return params_[pl.buffer].data() + pl.offset * es;
    const std::size_t w = storage_unit(p);
    if (!gathers_.held(w))
      raise("parameter '" + name(p) + "' is not gathered: its storage belongs to unit '" + plan_.units()[w].name +
            "', which no pre_forward / pre_backward holds now");
    compute_->wait(*gathered_[w]);  // the pre_* hook waited already (timed there, not here)
    return gathered_copy(w, f) + pl.offset * es;
  }
  /// Stage 3: flat buffer f's place in the gather slot of unit u (which must hold one).
  unsigned char* gathered_copy(std::size_t u, const flat_buffer& f) {
    return gathers_buffers_[unit_gather_[u]].data() + f.gather_offset;
  }

  /// pre_forward / pre_backward: gathers u (stage 3), prefetches, waits.
  void pre(std::size_t u, bool forward);
  void post(std::size_t u, const char* what, const char* needs, bool keep = false) {
    check_unit(u);
    if (plan_.stage() != 3) return;
    gather_hooks h{*this};
    if (!gathers_.done(u, h, keep))
      raise(std::string(what) + "(" + std::to_string(u) + ") without a matching " + needs + "(" + std::to_string(u) +
            ")");
  }

  /// One more pool buffer of `bytes` (beyond the plan's count), or an error naming this rank.
  detail::host_buffer& grow(std::vector<detail::host_buffer>& pool, std::uint64_t bytes, const char* what);
  /// A free gather slot (the pool grows beyond the plan's count for units visited out of order).
  std::size_t take_gather_slot();
  /// Unit u's all_gathers into a free slot, on the communication stream after the slot's last
  /// readers; `gathered_[u]` marks their end.
  void start_gather(std::size_t u);
  /// Unit u's all_gathers (or quantized gathers) into gather slot `slot`, enqueued.
  void enqueue_gather(std::size_t u, std::size_t slot);

  /// The compute stream's later work (the trainer's) runs after unit u's gather (on the host
  /// path: the caller waits for it, and a failed gather throws here).
  void wait_gather(std::size_t u);

  /// The next gather into u's slot waits for the compute work enqueued before now.
  void free_gather(std::size_t u) {
    compute_->record(*gather_slot_free_[unit_gather_[u]]);
    gather_free_.push_back(unit_gather_[u]);
    unit_gather_[u] = npos;
  }

  /// Stages 2-3: a zeroed bucket for unit u's gradients, on the compute stream after the
  /// reduction that used it last.
  void fill_bucket(std::size_t u);

  void launch_reduction(std::size_t u);

  void complete_reduction(std::size_t u);

  // ---- the streams (zero/sharded_model_streams.hpp) ----
  /// Checks `device` against the communicators (this rank's problem, "" when none) and, when
  /// it fits, creates the communication stream and the events.
  std::string attach(const device_context& device);
  /// The constructors' common end: attach `device`, or on the host path (null) a compute stream
  /// run by the calling thread; agree across ranks; allocate.
  void start(const device_context* device, std::string problem);
  /// A buffer of `bytes` in the compute stream's memory space, zeroed on the communication stream,
  /// counted as `what`; a `from_hook` buffer (gather buffer, bucket) from the collective hook if it allocates.
  /// Host memory of `host_buffer::huge_bytes` and more is `host_buffer::untouched`'s mapping
  /// (transparent huge pages where the kernel has them), whose pages the zeroing maps.
  detail::host_buffer make_buffer(std::uint64_t bytes, memory_category what, bool from_hook = false);
  /// The counter of what `what` asked for (its additions also go to the total).
  primitive::memory_counter* counter(memory_category c) noexcept { return &memory_counter_.of(std::size_t(c)); }
  /// Runs the collective hook's `call` (the `what` of unit `unit`, flat buffer `buffer`); a failure aborts
  /// the communicator (sharded_model_buffers.hpp) and is rethrown naming the hook, the call and this rank.
  template <class F>
  void run_hook(const char* what, std::size_t unit, std::size_t buffer, F&& call);
  /// The communication stream's later work runs after the compute stream's work enqueued so far.
  void comm_waits_for_compute() {
    compute_->record(*compute_mark_);
    comm_stream_->wait(*compute_mark_);
  }
  /// The compute stream's later work runs after the communication stream's work enqueued so far.
  void compute_waits_for_comm() {
    comm_stream_->record(*comm_mark_);
    compute_->wait(*comm_mark_);
  }
  /// Parameter p's `values` (in its dtype) copied in on the communication stream after the
  /// compute stream's work so far; the master weights from `master` (float32) or else widened
  /// from `values`; a gathered copy of p's unit gets them too (under quantized weight gathers
  /// kept and prefetched units are released first). Waits for nothing: `values` and `master`
  /// must outlive the copies.
  void write_parameter(std::size_t p, const unsigned char* values, const float* master);
  /// Parameter p copied into `out` (its dtype) on the communication stream (gathered there first
  /// when p's buffer is a shard and no unit holds p). Waits only when it needed a temporary.
  void copy_parameter_out(std::size_t p, unsigned char* out);
  /// Elements [offset, offset + count) of flat buffer b copied into `out`, as `copy_parameter_out`.
  void copy_buffer_out(std::size_t b, std::uint64_t offset, std::uint64_t count, unsigned char* out);
  /// `step` after its checks, as work on the communication stream, with one wait at the end;
  /// `micro_batches` ended in the step and `sync_off` go to the ranks' check.
  step_result run_step(std::uint64_t micro_batches, bool sync_off);
  /// Whether a non-finite step is skipped: as asked, and always with loss scaling.
  bool skips_nonfinite() const noexcept { return options_.skip_nonfinite_steps || scaler_.enabled(); }
  /// offload::optimizer and parameters (zero/sharded_model_offload.hpp): the update decided in
  /// `scalars` (host memory) as copies on the communication stream (none for offload::parameters)
  /// and CPU work on the offload stream, pipelined buffer by buffer; begins the optimizer's step
  /// unless skipped.
  void enqueue_offloaded_update(const step_scalars* scalars);

  /// Reproducible mode, end of the accumulation window: every trainable buffer's average over
  /// all micro-batches of all ranks into its gradient (the whole buffer at stage 0, the rank's
  /// shard at stages 1-3), in buffer order on every rank.
  /// On the communication stream (host memory only: attach refuses reproducible mode elsewhere).
  void reduce_reproducibly() {
    comm_stream_->collective([this] {
      for (std::size_t b = 0; b < plan_.buffers().size(); ++b) {
        const flat_buffer& f = plan_.buffers()[b];
        if (!f.trainable || f.numel == 0) continue;
        reproducible_->reduce(comm_, b, plan_.stage() >= 1, owned_gradient(b), tagged(call_purpose::reduce, b));
      }
    });
  }

  communicator& comm_;
  communicator* replica_;
  shard_plan plan_;
  sharded_model_options options_;
  int shard_index_;
  /// Every allocation of the runtime, by what asked for it (memory_category); declared before them all.
  primitive::memory_counters<memory_categories> memory_counter_;
  std::vector<detail::host_buffer> params_;  ///< per buffer: whole (shard_plan::holds_whole) or the shard
  std::vector<detail::host_buffer> grads_;   ///< per trainable buffer: the shard if sharded_gradients(), else full
  std::optional<sharded_optimizer> optimizer_;
  loss_scaler scaler_;                                ///< the same on every rank: updated from the global decision
  std::vector<detail::host_buffer> gathers_buffers_;  ///< gather buffer pool (stage 3)
  std::vector<std::size_t> gather_free_, unit_gather_;
  std::vector<detail::host_buffer> buckets_;  ///< gradient bucket pool (sharded gradients)
  std::vector<std::size_t> bucket_free_, unit_bucket_;
  detail::host_buffer quantization_staging_;  ///< quantized communication's segments (plan_request::quantization)
  detail::gather_schedule gathers_;
  detail::gather_timer timer_;  ///< `gather_times()` (with options_.time_gathers)
  detail::gradient_schedule gradients_;
  std::vector<bool> marked_;
  int micro_ = 0;
  bool require_sync_ = true;            ///< gradient sync (set_require_gradient_sync, no_sync)
  bool pending_sync_ = true;            ///< the mode from the end of this micro-batch on
  bool trainer_window_ = false;         ///< a micro-batch of this step ended under no_sync: the trainer sets the count
  bool window_closed_ = false;          ///< the step's last micro-batch has ended: step() next
  bool micro_begun_ = false;            ///< this micro-batch's backward has begun (no mode change until it ends)
  bool reshard_after_backward_ = true;  ///< stage 3: post_backward releases its unit
  std::size_t forward_at_ = npos;       ///< stage 3: the last unit of the forward pass in progress (npos: none)
  bool in_backward_ = false;            ///< stage 3: a pre_backward ran in this micro-batch
  std::optional<detail::reproducible_gradients> reproducible_;  ///< reproducible mode only
  // The streams and their events. Declared last: the communication stream is drained in the
  // destructor and destroyed before the buffers its work used.
  std::unique_ptr<execution_stream> own_compute_;  ///< the host path's compute stream (caller's thread)
  execution_stream* compute_ = nullptr;            ///< the trainer's
  std::vector<std::unique_ptr<execution_stream::event>> gathered_;           ///< per unit, on comm
  std::vector<std::unique_ptr<execution_stream::event>> gather_slot_free_;   ///< per slot, on compute
  std::vector<std::unique_ptr<execution_stream::event>> bucket_free_event_;  ///< per bucket, on comm
  std::unique_ptr<execution_stream::event> compute_mark_;                    ///< scratch, on compute
  std::unique_ptr<execution_stream::event> comm_mark_;                       ///< scratch, on comm
  detail::host_buffer step_scalars_;  ///< a step_scalars in the stream's memory (written by stream work)
  step_scalars decided_;              ///< the step's scalars read back to the host
  std::unique_ptr<detail::optimizer_offload> offload_;  ///< offload::optimizer or parameters only
  std::unique_ptr<execution_stream> comm_stream_;
};

}  // namespace ringzero::zero

// The members defined out of the class, by what they do: the buffers (allocation, pools,
// reductions) and the streams (attaching, parameters in and out, the step).
#include "ringzero/zero/sharded_model_buffers.hpp"
#include "ringzero/zero/sharded_model_offload.hpp"
#include "ringzero/zero/sharded_model_steps.hpp"
#include "ringzero/zero/sharded_model_streams.hpp"
// What checkpoint/ uses of the model; the trainer's memory as its parameters.
#include "ringzero/zero/checkpoint_access.hpp"
#include "ringzero/zero/parameter_adoption.hpp"
