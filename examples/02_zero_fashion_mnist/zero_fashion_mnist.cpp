// 02_zero_fashion_mnist: the Fashion-MNIST MLP of example 01 trained with ZeRO stages 0-3
// (`ringzero::zero::sharded_model`; Rajbhandari et al. 2020, PyTorch FSDP's hooks).
//
// Read from the top: `zero_layer_hooks` are the runtime's calls around every layer,
// `train_step` is one optimizer step, `train_rank` is one rank's run, `main` starts the ranks.
// The MLP computes on memory it does not own: its layers read the runtime's parameter views and
// add their gradients into the runtime's gradient views, rebound around every layer. One loop
// serves every stage; only what the hooks do changes: stage 0 all_reduces the gradients, stage 1
// reduce_scatters them and all_gathers the parameters after each rank's update of its shard,
// stage 2 keeps each layer's gradients in a pooled bucket only until its reduce_scatter, stage 3
// all_gathers every layer before its forward and again before its backward. Every stage ends
// with the bits of stage 0 (tests/examples/check_zero_fashion_mnist.py).
//
//   examples/zero_fashion_mnist --stage 3 --ranks 2 --epochs 10
//   examples/zero_fashion_mnist --device sim --stage 3 --offload optimizer   (the device path on host streams)
//   mpirun -np 2 examples/zero_fashion_mnist --backend mpi --stage 3   (the numbers of --ranks 2)
// docs/zero.md ("The example and its benchmark") explains every option; `--help` lists them.
// Beside it: the options (zero_options.hpp), what is printed and measured (zero_report.hpp),
// checkpoints (zero_checkpoint.hpp), the host, simulated-device and CUDA compute
// (host_compute.hpp, sim_compute.hpp, device_compute.hpp).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "distributed_sampler.hpp"
#include "host_compute.hpp"
#include "idx_dataset.hpp"
#include "progress_bar.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/verify_replicas.hpp"
#include "run_ranks.hpp"
#include "sim_compute.hpp"
#include "zero_checkpoint.hpp"
#include "zero_options.hpp"
#include "zero_report.hpp"
#if RINGZERO_EXAMPLES_HAVE_CUDA
#include "device_compute.hpp"
#endif

namespace rz = ringzero;
namespace ex = ringzero::examples;
namespace zx = ringzero::examples::zero_example;
namespace zero = ringzero::zero;

namespace {

/// The layer hooks of the MLP (`Net`: the host or the CUDA MLP): the runtime's hooks around each
/// layer, and the layer's tensors bound to the runtime's views (at stage 3 a parameter view is
/// valid only while its unit is gathered; at stages 2-3 a gradient view lives in a bucket taken
/// for this micro-batch). With a `layer_stream` (--device sim) the layer computes once that
/// stream has run what the runtime enqueued on it, and in evaluation (`evaluating`) the
/// runtime's communication stream is idle after the last layer's forward (the trainer's own
/// all_reduce comes next on the same communicator). Rank 0 also times the runtime's calls.
/// With `copies` (--precision bfloat16) the layer computes on float32 copies: its bfloat16
/// parameters widened into them before it runs, its gradient so far widened before backward and
/// rounded back into the runtime's bfloat16 gradient after it (zx::float_copies); with
/// --reduce-dtype float32 the gradients are float32 and the layer adds into them directly.
template <class Net>
class zero_layer_hooks {
 public:
  zero_layer_hooks(zero::sharded_model& model, Net& net, zx::epoch_metrics* timing,
                   zero::execution_stream* layer_stream = nullptr, bool evaluating = false,
                   const zx::float_copies* copies = nullptr)
      : model_(model),
        net_(net),
        timing_(timing),
        layer_stream_(layer_stream),
        evaluating_(evaluating),
        copies_(copies) {}

  void before_forward(int l) {
    timed(&zx::epoch_metrics::gather_seconds, [&] { model_.pre_forward(unit(l)); });
    bind_parameters(l);
    timed(&zx::epoch_metrics::gather_seconds, [&] { synchronize_layer_stream(); });
  }
  void after_forward(int l) {
    timed(&zx::epoch_metrics::gather_seconds, [&] {
      model_.post_forward(unit(l));
      if (layer_stream_ != nullptr && evaluating_ && unit(l) + 1 == model_.unit_count()) model_.synchronize();
    });
  }
  void before_backward(int l) {
    timed(&zx::epoch_metrics::gather_seconds, [&] { model_.pre_backward(unit(l)); });
    bind_parameters(l);
    timed(&zx::epoch_metrics::reduce_seconds, [&] {
      for (std::size_t i : {weight(l), weight(l) + 1})
        net_.bind_gradient(i, bfloat16_gradients()
                                  ? copies_->widen(copies_->gradient(i), model_.gradient<rz::bfloat16>(i))
                                  : model_.gradient<float>(i).data());
      synchronize_layer_stream();
    });
  }
  void after_backward(int l) {
    timed(&zx::epoch_metrics::reduce_seconds, [&] {
      if (bfloat16_gradients())
        for (std::size_t i : {weight(l), weight(l) + 1})
          copies_->narrow(model_.gradient<rz::bfloat16>(i), copies_->gradient(i));
      model_.post_backward(unit(l));
    });
  }

  /// Runs `f`, timed into `field` of the record (rank 0 only).
  template <class F>
  decltype(auto) timed(double zx::epoch_metrics::*field, F&& f) {
    return zx::timed(timing_, field, std::forward<F>(f));
  }

 private:
  static std::size_t unit(int l) { return static_cast<std::size_t>(l); }
  static std::size_t weight(int l) { return static_cast<std::size_t>(2 * l); }
  void bind_parameters(int l) {
    for (std::size_t i : {weight(l), weight(l) + 1})
      net_.bind_parameter(i, copies_ != nullptr
                                 ? copies_->widen(copies_->parameter(i), model_.parameter<rz::bfloat16>(i))
                                 : model_.parameter<float>(i).data());
  }
  /// Whether the runtime's gradients are bfloat16 (the layer computes on their float32 copies).
  bool bfloat16_gradients() const noexcept { return copies_ != nullptr && copies_->bfloat16_gradients; }
  /// --device sim: the layer computes on the trainer's thread once the compute stream has run
  /// what was enqueued on it (the runtime's waits for gathers, buckets zeroed, the copies).
  void synchronize_layer_stream() {
    if (layer_stream_ != nullptr) layer_stream_->synchronize();
  }

  zero::sharded_model& model_;
  Net& net_;
  zx::epoch_metrics* timing_;
  zero::execution_stream* layer_stream_;
  bool evaluating_;
  const zx::float_copies* copies_;
};

/// One optimizer step: `micro_steps` micro-batches of `rows` examples from shard row `first_row`
/// on, each a forward and a backward through the hooks and closed by end_backward(); then the
/// step (gradient norm, clipping, the optimizer on this rank's shard, stages 1-2's all_gather).
template <class Compute, class Hooks>
zero::step_result train_step(zero::sharded_model& model, Compute& compute, Hooks& hooks, std::size_t first_row,
                             int micro_steps, int rows, float grad_scale) {
  for (int micro = 0; micro < micro_steps; ++micro) {
    // Full gradients (stages 0-1, --accumulate-unsharded): the micro-steps before the last run
    // under no_sync, accumulating locally; the last reduces them all.
    std::optional<rz::no_sync_guard> no_sync;
    if (micro + 1 < micro_steps && !model.plan().sharded_gradients()) no_sync.emplace(model);
    compute.load(first_row + static_cast<std::size_t>(micro) * static_cast<std::size_t>(rows), rows);
    compute.forward(rows, hooks);               // pre_forward / post_forward around each layer
    compute.backward(rows, grad_scale, hooks);  // pre_backward / post_backward: gradients added
    hooks.timed(&zx::epoch_metrics::reduce_seconds, [&] { model.end_backward(); });
  }
  return hooks.timed(&zx::epoch_metrics::update_seconds, [&] { return model.step(); });
}

/// One rank's run: builds the runtime, sets the initial parameters (or restores a checkpoint),
/// trains `o.epochs` epochs and evaluates after each; rank 0 records the metrics in `result`.
template <class Compute>
void train_rank(rz::communicator& comm, const zx::options& o, std::size_t train_count, Compute& compute,
                zx::run_result& result) {
  using net_type = std::remove_reference_t<decltype(compute.net())>;
  const bool lead = comm.rank() == 0;
  ex::distributed_sampler sampler(train_count, comm.world_size(), comm.rank(), o.seed);
  const std::size_t step_rows = static_cast<std::size_t>(o.batch_size) * static_cast<std::size_t>(o.accumulate);
  const std::uint64_t steps = zx::steps_per_epoch(sampler.shard_size(), step_rows);

  // The heap readings around the constructor and the first step (zero_report.hpp).
  zx::memory_probe probe(comm, o.where.backend != "local", Compute::heap_holds_state);
  zx::rank_memory memory;
  probe.mark(0);
  // The runtime, a collective: its state in host memory, or on the device path in the memory of
  // the compute stream.
  std::optional<zero::sharded_model> runtime;
  if (zero::device_context* device = compute.device_context())
    runtime.emplace(comm, zx::plan_request_of(o, compute.shape(), o.stage), *device, zx::model_options_of(o));
  else
    runtime.emplace(comm, zx::plan_request_of(o, compute.shape(), o.stage), zx::model_options_of(o));
  zero::sharded_model& model = *runtime;
  probe.mark(1);
  memory.after_construction = model.memory_in_use();
  memory.scratch_growth_construction = probe.scratch_growth(0, 1);

  // The same initial values on every rank (example 01's rank-0 initialisation), handed over as a
  // trainer that keeps its parameters in one block of its own does: laid out by
  // layout_for_adoption in each parameter's dtype, in the compute stream's memory (the GPU's with
  // --device cuda), in one call (at stage 3 each rank keeps its shard); or a checkpoint's.
  {
    const std::vector<float> initial = compute.shape().initial_parameters(o.seed);
    const zero::adoption_layout layout = zero::layout_for_adoption(model.plan());
    std::vector<unsigned char> raw(layout.bytes + layout.alignment);
    const std::size_t skip =
        (layout.alignment - reinterpret_cast<std::uintptr_t>(raw.data()) % layout.alignment) % layout.alignment;
    unsigned char* block = raw.data() + skip;
    for (std::size_t i = 0; i < compute.shape().tensor_count(); ++i) {
      const ex::tensor_info& t = compute.shape().tensor(i);
      const rz::dtype type = model.plan().buffers()[model.plan().placements()[i].buffer].type;
      rz::primitive::cast_into(block + layout.parameter_offset[i], type, initial.data() + t.offset, rz::dtype::float32,
                               t.count);
    }
    compute.with_parameter_block(block, layout.bytes, layout.alignment, [&](void* memory) {
      zero::set_parameters_async(model, memory, layout.bytes);
      model.synchronize();  // the runtime's copies are done: the block may go
    });
  }
  const int first_epoch = zx::restore(o, model, result.global_batch, lead);
  std::optional<zx::ck::checkpointer> saver;
  if (!o.checkpoint_dir.empty()) {
    saver.emplace(o.checkpoint_dir, zx::ck::checkpointer_options{o.keep_checkpoints});
    saver->open(model);  // the root's lock, leftovers removed, room checked: before any training
  }
  if (lead) {
    result.steps_per_epoch = steps;
    result.plan = zx::plan_summary(model.plan());
    result.first_epoch = first_epoch;
    zx::print_header(o, result, model);
  }

  ex::progress_bar bar(lead && o.progress);
  const float grad_scale = 1.0f / static_cast<float>(o.batch_size * o.accumulate);
  if (first_epoch == o.epochs) {  // nothing to train (--epochs 0, or --resume at --epochs): evaluate only
    zero_layer_hooks<net_type> eval_hooks(model, compute.net(), nullptr, compute.layer_stream(), true,
                                          compute.copies());
    const ex::evaluation_result ev = compute.evaluate(comm, eval_hooks);
    if (lead) result.evaluation = ev;
    if (lead) zx::print_evaluation_only(first_epoch, o.epochs, ev);
  }
  ex::replica_checks checks{o.check_replicas};
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    zx::epoch_metrics m;
    zero_layer_hooks<net_type> hooks(model, compute.net(), lead ? &m : nullptr, compute.layer_stream(), false,
                                     compute.copies());
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    compute.begin_epoch(sampler.indices());
    std::vector<double> step_times;
    step_times.reserve(steps);
    model.synchronize();
    model.reset_gather_times();  // stage 3: the epoch's training gathers, timed on the streams
    rz::barrier(comm);
    const auto t0 = zx::clock_type::now();
    for (std::uint64_t s = 0; s < steps; ++s) {
      const bool first_step = epoch == first_epoch && s == 0;
      if (first_step) probe.mark(2);
      const auto s0 = zx::clock_type::now();
      const zero::step_result r =
          train_step(model, compute, hooks, s * step_rows, o.accumulate, o.batch_size, grad_scale);
      step_times.push_back(zx::seconds_since(s0));
      checks.after_step(steps * static_cast<std::uint64_t>(epoch) + s + 1,
                        [&] { return zero::verify_replicas(model); });
      if (r.clip_coefficient < 1) ++m.clipped_steps;
      m.gradient_norm = r.gradient_norm;
      if (first_step) {
        probe.mark(3);
        memory.scratch_growth_first_step = probe.scratch_growth(2, 3);
      }
      if (bar.enabled())
        bar.update(fmt::format("epoch {:>2}/{}", epoch + 1, o.epochs), s + 1, steps, compute.progress_text());
    }
    model.synchronize();  // the device path: its work done before the trainer's own collectives
    rz::barrier(comm);
    const auto t1 = zx::clock_type::now();
    m.gathers = model.gather_times();
    bar.clear();
    m.train_loss = compute.epoch_loss(comm);
    const auto e0 = zx::clock_type::now();
    zero_layer_hooks<net_type> eval_hooks(model, compute.net(), nullptr, compute.layer_stream(), true,
                                          compute.copies());
    const ex::evaluation_result ev = compute.evaluate(comm, eval_hooks);
    m.eval_seconds = zx::seconds_since(e0);
    if (saver) saver->save(model, zx::progress_after(o, epoch + 1, result.global_batch));  // a collective
    if (!lead) continue;
    result.evaluation = ev;
    zx::finish_epoch(m, epoch + 1, std::chrono::duration<double>(t1 - t0).count(), steps, result.global_batch,
                     step_times, ev);
    zx::print_epoch(o, m);
    result.epochs.push_back(m);
    result.step_seconds.insert(result.step_seconds.end(), step_times.begin(), step_times.end());
  }
  memory.measured = model.memory_in_use();
  zx::measure_allocations(model, memory);
  // The final parameters' CRC-32, and --save-parameters (at stage 3 a collective).
  const std::uint32_t crc = zx::final_parameters(o, model, compute.shape(), lead);
  if (lead) result.parameter_crc32 = crc;
  if (lead) result.replica_checks = checks.summary();
  zx::collect_memory(comm, o, probe, Compute::heap_holds_state, memory, result);
}

/// Runs every rank of this process on the host, on the simulated device (--device sim) or, with
/// --device cuda, on its GPU.
zx::run_result train(const zx::options& o, const ex::fashion_mnist& data) {
  zx::run_result result = zx::run_result_of(o, data);
  const int eval_rows = 1000;  // test examples per forward pass
  const int max_rows = std::max(o.batch_size, eval_rows);
  const zx::copies_of copies = o.precision != "bfloat16"     ? zx::copies_of::nothing
                               : o.reduce_dtype == "float32" ? zx::copies_of::parameters
                                                             : zx::copies_of::parameters_and_gradients;
  ex::run_ranks(o.where, [&](rz::communicator& comm) {
    zx::naming_out_of_memory(result.widths, max_rows, [&] {
      if (o.where.device == "cuda") {
#if RINGZERO_EXAMPLES_HAVE_CUDA
        zx::device_compute compute(comm, result.widths, data, max_rows, eval_rows, copies);
        train_rank(comm, o, data.train.count, compute, result);
#endif
      } else if (o.where.device == "sim") {
        Eigen::setNbThreads(1);
        zx::sim_compute compute(result.widths, data, max_rows, eval_rows, copies);
        train_rank(comm, o, data.train.count, compute, result);
      } else {
        Eigen::setNbThreads(1);  // one compute thread per rank
        zx::host_compute compute(result.widths, data, max_rows, eval_rows, copies);
        train_rank(comm, o, data.train.count, compute, result);
      }
    });
  });
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  zx::options o;
  CLI::App app{"ZeRO stage 0-3 training of an MLP on Fashion-MNIST with ringzero's sharded runtime"};
  zx::add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  zx::apply_widths(o);
  // Started by mpirun/srun/torchrun as one of several processes without --backend mpi or nccl:
  // refuse rather than run one complete job per process.
  if (ex::refuse_launcher(o.where, "zero_fashion_mnist", true)) return 2;

  int process_rank = 0;
  try {
    ex::process_world world(argc, argv, o.where, o.ranks_given, "zero_fashion_mnist");
    process_rank = world.rank();
    if (!world.lead()) o.progress = false;
    zx::check_options(o);  // before the device and the data: options that clash fail at once
    ex::require_device(o.where, "zero_fashion_mnist");
    const ex::fashion_mnist data = ex::load_fashion_mnist(o.data_dir, o.train_subset, o.test_subset);
    const auto t0 = zx::clock_type::now();
    const zx::run_result r = train(o, data);
    if (!world.lead()) return 0;  // rank 0 holds the metrics (identical on every rank)
    return zx::report(o, r, t0);  // 3 below --min-accuracy
  } catch (const std::exception& e) { return ex::report_failure("zero_fashion_mnist", o.where, process_rank, e); }
}
