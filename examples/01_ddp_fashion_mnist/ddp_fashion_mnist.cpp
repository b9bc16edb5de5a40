// 01_ddp_fashion_mnist: data-parallel training (DDP) of a small MLP on Fashion-MNIST.
//
// N ranks (threads of ringzero's local backend, or MPI processes) each hold a replica of an MLP
// 784-256-128-10 and train it with SGD + momentum or AdamW. `ringzero::ddp::gradient_reducer`
// broadcasts rank 0's parameters at the start; backward calls `mark_ready` as each layer's
// gradients exist, so buckets are all-reduced on the communicator's progress thread while the
// earlier layers are still being differentiated; `finish()` leaves the averaged gradients in
// place (in bucket memory: no copies). Also: accumulation with no_sync, fp16 / bf16 / PowerSGD
// compression hooks, reproducible sums over any rank count, checkpoints, and the measurements that matter
// (epoch time, samples/s, test accuracy, how much of the reduction was hidden behind backward).
//
//   examples/ddp_fashion_mnist --ranks 2 --epochs 10
//   examples/ddp_fashion_mnist --compare-ranks 1,2 --epochs 3
//   mpirun -np 2 examples/ddp_fashion_mnist --backend mpi --epochs 10
// Every option (--device cuda, --reproducible, --checkpoint, --link-gbps, ...): docs/ddp.md, "Example 01".
//
// Read from the top: `train_step` is one optimizer step (the reducer's calls), `train` one run
// (`rank_main`: one rank), `main` the command line's runs. Beside it: the options
// (ddp_options.hpp), what is printed and recorded (ddp_report.hpp), checkpoints
// (ddp_checkpoint.hpp), the CUDA trainer (ddp_cuda.hpp); the backends start in
// examples/common/run_ranks.hpp.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ddp_checkpoint.hpp"
#include "ddp_options.hpp"
#include "ddp_report.hpp"
#include "distributed_sampler.hpp"
#include "evaluation.hpp"
#include "idx_dataset.hpp"
#include "mlp.hpp"
#include "optimizer.hpp"
#include "progress_bar.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/verify_replicas.hpp"
#include "run_ranks.hpp"
#if RINGZERO_EXAMPLES_HAVE_CUDA
#include "ddp_cuda.hpp"
#endif

namespace rz = ringzero;
namespace ex = ringzero::examples;
using namespace ringzero::examples::ddp_example;

namespace {

/// One optimizer step of DDP: `micro_steps` micro-batches of `rows` examples (`load(micro)` puts
/// micro-batch `micro` into `x`, `y`), each a forward and a backward that marks every gradient
/// ready as it is final, so the reducer all_reduces bucket by bucket during backward (no_sync on
/// all but the last micro-batch, whose finish() leaves the averaged gradients in place); then
/// the optimizer on the replica. `accumulate`: micro-batches after the first add their
/// gradients (else each writes its own, as the reproducible reducer wants). Adds the losses to
/// `loss_sum`.
template <class LoadBatch, class BindViews>
void train_step(rz::ddp::gradient_reducer& reducer, ex::mlp& model, ex::optimizer& opt, const float* x,
                const std::uint8_t* y, int rows, int micro_steps, float grad_scale, bool accumulate, LoadBatch&& load,
                BindViews&& bind_views, double& loss_sum) {
  for (int micro = 0; micro < micro_steps; ++micro) {
    load(micro);
    loss_sum += model.forward(x, y, rows);
    reducer.set_require_gradient_sync(micro + 1 == micro_steps);  // no_sync on the others
    model.backward(x, y, rows, grad_scale, micro > 0 && accumulate, [&](std::size_t i) { reducer.mark_ready(i); });
    reducer.finish();
  }
  bind_views();  // the one bucket rebuild may have moved the views
  opt.begin_step();
  for (std::size_t i = 0; i < model.tensor_count(); ++i)
    opt.update(model.parameter(i), model.gradient(i), model.tensor(i).offset);
}

/// Trains on `ranks` ranks with `per_rank` examples per micro-step; returns rank 0's metrics.
run_result train(const options& o, const ex::fashion_mnist& data, int ranks, int per_rank, bool print) {
  run_result result;
  result.ranks = ranks;
  result.per_rank_batch = per_rank;
  result.accumulate = o.accumulate;
  result.global_batch = per_rank * ranks * o.accumulate;
  const float base_lr = o.lr > 0 ? o.lr : default_lr(o.optimizer);
  result.lr = o.scale_lr ? base_lr * static_cast<float>(ranks) : base_lr;
  std::mutex result_mutex;

  auto rank_main = [&](rz::communicator& comm) {
    Eigen::setNbThreads(1);  // one compute thread per rank (Eigen is built without OpenMP here anyway)
    const bool lead = comm.rank() == 0;
    const std::vector<int> widths = ex::layer_widths(o.hidden, data);
    // Every rank initialises differently on purpose: the reducer broadcasts rank 0's values.
    ex::mlp model(widths, o.seed + static_cast<std::uint64_t>(comm.rank()) * 7919u);
    const int eval_chunk = 1000;
    model.reserve(std::max(per_rank, eval_chunk));

    rz::ddp::gradient_reducer reducer(comm, reducer_parameters(model), reducer_options_of(o));
    std::uint64_t bound_generation = ~std::uint64_t{0};
    auto bind_views = [&] {
      if (!o.bucket_view || bound_generation == reducer.layout_generation()) return;
      for (std::size_t i = 0; i < model.tensor_count(); ++i)
        model.bind_gradient(i, reducer.gradient_span<float>(i).data());
      bound_generation = reducer.layout_generation();
    };
    bind_views();

    auto opt = ex::make_optimizer(o.optimizer, model.parameter_elements(), result.lr);
    ck::replicated_state state = checkpoint_state(model, *opt);
    const int first_epoch = restore(o, reducer, state, model, *opt, lead);
    bind_views();  // a restored bucket layout moves the views
    std::optional<ck::checkpointer> saver;
    if (!o.checkpoint_dir.empty()) {
      saver.emplace(o.checkpoint_dir, ck::checkpointer_options{o.keep_checkpoints});
      saver->open(reducer, state);  // the root's lock, leftovers removed, room checked: before any training
    }
    // --micro-batch: every rank reads the one permutation of a world of one (the same for
    // every rank count); global batch s is its rows [s*G, (s+1)*G), and micro-batch j of it
    // (rows s*G + j*N ...) goes to rank j mod n. Otherwise each rank reads its own shard.
    const bool split = o.micro_batch > 0;
    const int world = comm.world_size();
    ex::distributed_sampler sampler(data.train.count, split ? 1 : world, split ? 0 : comm.rank(), o.seed);
    const std::size_t step_rows = static_cast<std::size_t>(per_rank) * static_cast<std::size_t>(o.accumulate);
    const std::size_t stride =
        split ? step_rows * static_cast<std::size_t>(world) : step_rows;  // sampler rows per step
    const std::uint64_t steps = sampler.shard_size() / stride;
    if (steps == 0)
      throw rz::error(rz::errc::invalid_argument,
                      fmt::format("{} training examples {} are fewer than one step of {}", sampler.shard_size(),
                                  split ? "in all" : "per rank", stride));
    auto first_row = [&](std::uint64_t s, int micro) {
      const std::size_t block =
          split ? static_cast<std::size_t>(micro * world + comm.rank()) : static_cast<std::size_t>(micro);
      return static_cast<std::size_t>(s) * stride + block * static_cast<std::size_t>(per_rank);
    };
    std::uint64_t optimizer_steps = static_cast<std::uint64_t>(first_epoch) * steps;
    std::vector<float> x(static_cast<std::size_t>(std::max(per_rank, eval_chunk)) * data.train.features);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(std::max(per_rank, eval_chunk)));
    ex::progress_bar bar(lead && print && o.progress);
    // Reproducible: each micro-batch's gradient is its mean, written (not added); the reducer
    // averages the micro-batches. Otherwise the micro-steps add gradient / accumulate.
    const float grad_scale = 1.0f / static_cast<float>(o.reproducible ? per_rank : per_rank * o.accumulate);
    ex::replica_checks checks{o.check_replicas};

    if (lead) {
      std::lock_guard<std::mutex> lock(result_mutex);
      result.buckets = reducer.bucket_count();
      result.steps_per_epoch = steps;
      result.first_epoch = first_epoch;
      if (print) print_header(o, result, bucket_layout(reducer, model));
    }
    if (first_epoch == o.epochs) {  // nothing to train (--epochs 0, or --resume at --epochs): evaluate only
      const ex::evaluation_result ev = ex::evaluate(comm, model, data.test, x.data(), y.data(), eval_chunk);
      if (lead) {
        result.evaluation = ev;
        if (print)
          fmt::print("  no epoch to train ({} of {} done): test loss {:.4f}  test acc {:.4f}\n", first_epoch, o.epochs,
                     ev.loss, ev.accuracy);
      }
    }
    for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      const auto shard = sampler.indices();
      reducer.reset_stats();
      double loss_sum = 0;
      rz::barrier(comm);
      const auto t0 = clock_type::now();
      const rz::traffic_counts traffic0 = comm.traffic();  // the bytes this rank sends per step
      for (std::uint64_t s = 0; s < steps; ++s) {
        auto load = [&](int micro) {
          data.train.gather(shard.subspan(first_row(s, micro), static_cast<std::size_t>(per_rank)), x.data(), y.data());
        };
        train_step(reducer, model, *opt, x.data(), y.data(), per_rank, o.accumulate, grad_scale, !o.reproducible, load,
                   bind_views, loss_sum);
        ++optimizer_steps;
        checks.after_step(optimizer_steps, [&] { return rz::ddp::verify_replicas(reducer); });
        if (bar.enabled())
          bar.update(fmt::format("epoch {:>2}/{}", epoch + 1, o.epochs), s + 1, steps,
                     fmt::format("loss {:.4f}",
                                 loss_sum / static_cast<double>((s + 1) * static_cast<std::uint64_t>(o.accumulate))));
      }
      const std::uint64_t sent = (comm.traffic() - traffic0).total().total_sent();
      rz::barrier(comm);
      const auto t1 = clock_type::now();
      bar.clear();
      const rz::ddp::reducer_stats st = reducer.stats();
      double sums[2] = {loss_sum, static_cast<double>(steps * static_cast<std::uint64_t>(o.accumulate))};
      rz::all_reduce(comm, sums, sums, 2, rz::dtype::float64, rz::reduce_kind::sum);
      const auto e0 = clock_type::now();
      const ex::evaluation_result ev = ex::evaluate(comm, model, data.test, x.data(), y.data(), eval_chunk);
      const auto e1 = clock_type::now();
      if (saver)  // a collective over the reducer's communicator, between steps
        saver->save(reducer, state, progress_after(o, epoch + 1, optimizer_steps, result.global_batch));
      if (!lead) continue;
      result.evaluation = ev;
      const epoch_metrics m = epoch_record(epoch + 1, std::chrono::duration<double>(t1 - t0).count(),
                                           steps * static_cast<std::uint64_t>(result.global_batch), sums[0] / sums[1],
                                           ev, std::chrono::duration<double>(e1 - e0).count(), st, steps, sent);
      if (print) print_epoch(m, o.epochs, false);
      std::lock_guard<std::mutex> lock(result_mutex);
      result.epochs.push_back(m);
    }
    if (lead) {
      std::lock_guard<std::mutex> lock(result_mutex);
      result.parameter_crc32 = parameters_crc32(model);
      result.compression = compression_traffic(reducer, model);
      result.replica_checks = checks.summary();
    }
  };
  // Threads of the local backend, or this process's rank under --backend mpi (run_ranks.hpp).
  ex::run_ranks(ex::rank_setup{o.backend, "cpu", ranks, o.pin, o.link_gbps}, rank_main);
  return result;
}

/// `train` on the device chosen by --device.
run_result train_on_device(const options& o, const ex::fashion_mnist& data, int ranks, int per_rank, bool print) {
  if (o.device == "cpu") return train(o, data, ranks, per_rank, print);
#if RINGZERO_EXAMPLES_HAVE_CUDA
  if (o.epochs == 0) throw rz::error(rz::errc::unsupported, "--epochs 0 (evaluate only) needs --device cpu");
  run_result r = train_cuda(o, data, ranks, per_rank, print);
  r.evaluation.accuracy = r.epochs.back().test_accuracy;
  r.evaluation.loss = r.epochs.back().test_loss;
  return r;
#else
  throw rz::error(rz::errc::unsupported,
                  "--device cuda: this build of ddp_fashion_mnist has no CUDA support (it needs nvcc, "
                  "the CUDA runtime and cuBLAS when it is configured)");
#endif
}
}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Data-parallel training of an MLP on Fashion-MNIST with ringzero's gradient reducer"};
  const option_handles given = add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (!o.hidden_lists.empty()) o.hidden = ex::hidden_widths(o.hidden_lists);
  // Under mpirun/srun/torchrun without --backend mpi: refuse rather than run one job per process.
  ex::rank_setup where{o.backend, o.device, o.ranks, o.pin};
  if (ex::refuse_launcher(where, "ddp_fashion_mnist")) return 2;

  int process_rank = 0;  // under --backend mpi only rank 0 prints and writes the JSON file
  try {
    // --backend mpi: MPI_Init_thread ... MPI_Finalize; --ranks becomes the process count.
    ex::process_world world(argc, argv, where, given.ranks->count() > 0, "ddp_fashion_mnist");
    process_rank = world.rank();
    o.ranks = where.ranks;
    o.pin = where.pin;
    if (!world.lead()) o.progress = false;
    const std::vector<int> compare_counts = check_options(o, given);  // before the device and the data
    ex::require_device(where, "ddp_fashion_mnist");                   // without a GPU: fails at once
    const ex::fashion_mnist data = ex::load_fashion_mnist(o.data_dir, o.train_subset, o.test_subset);
    json out;
    out["example"] = "01_ddp_fashion_mnist";
    out["config"] = config_json(o, data);
    out["runs"] = json::array();

    if (o.compare_ranks.empty()) {
      options run_options = o;
      const batch_split b = split_batch(o, o.ranks, o.global_batch);
      run_options.accumulate = b.accumulate;
      const auto t0 = clock_type::now();
      run_result r = train_on_device(run_options, data, o.ranks, b.per_rank, process_rank == 0);
      if (process_rank != 0) return 0;  // rank 0 holds the metrics (identical on every rank)
      print_run(r, t0);
      out["runs"].push_back(to_json(r));
    } else {  // the same global batch on every rank count, without --scale-lr
      const int largest = *std::max_element(compare_counts.begin(), compare_counts.end());
      const int global = o.global_batch > 0 ? o.global_batch : o.batch_size * largest * o.accumulate;
      if (o.scale_lr)
        fmt::print("note: --scale-lr is ignored in compare mode (the global batch is the same for every run)\n");
      options same = o;
      same.scale_lr = false;
      std::vector<run_result> runs;
      for (int n : compare_counts) {
        const batch_split b = split_batch(o, n, global);
        same.accumulate = b.accumulate;
        fmt::print("== {} rank(s)\n", n);
        std::fflush(stdout);
        runs.push_back(train_on_device(same, data, n, b.per_rank, true));
        print_checks_and_compression(runs.back());
        out["runs"].push_back(to_json(runs.back()));
      }
      print_comparison(o, runs, out);
    }
    return finish(o, out);
  } catch (const std::exception& e) { return ex::report_failure("ddp_fashion_mnist", where, process_rank, e); }
  return 0;
}