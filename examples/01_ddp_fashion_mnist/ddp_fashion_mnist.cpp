// 01_ddp_fashion_mnist: data-parallel training (DDP) of a small MLP on Fashion-MNIST.
//
// What it demonstrates:
// - N ranks as N threads (ringzero's local backend), each with one compute thread and a full
//   replica of an MLP 784-256-128-10 (ReLU, softmax cross-entropy), trained with SGD + momentum
//   or AdamW;
// - a distributed sampler: every epoch all ranks draw the same permutation (seeded by the epoch)
//   and each takes a disjoint shard, so N ranks see the same global batches as one rank would;
// - `ringzero::ddp::gradient_reducer`: parameters broadcast from rank 0 at the start; backward runs
//   layer by layer and calls `mark_ready` as each layer's gradients exist, so buckets of
//   gradients are all-reduced on the communicator's progress thread while the earlier layers
//   are still being differentiated; `finish()` leaves the averaged gradients in place (here
//   directly in bucket memory: no copies); gradient accumulation with `no_sync`; fp16 / bf16
//   compression hooks;
// - the measurements that matter: per-epoch wall time, samples/s, train loss, test accuracy,
//   and how much of the gradient reduction was hidden behind backward.
//
// How to run (from the build directory; Fashion-MNIST comes from Debian's
// dataset-fashion-mnist package in /usr/share/datasets/fashion-mnist):
//   examples/ddp_fashion_mnist --ranks 2 --epochs 10
//   examples/ddp_fashion_mnist --ranks 2 --optimizer adamw --lr 1e-3 --compress bf16
//   examples/ddp_fashion_mnist --ranks 2 --accumulate 4 --batch-size 64 --json metrics.json
//   examples/ddp_fashion_mnist --compare-ranks 1,2 --epochs 3
//   examples/ddp_fashion_mnist --compare-ranks 1,2,4 --reproducible --micro-batch 32 --epochs 2
//   examples/ddp_fashion_mnist --device cuda --compare-ranks 1,2 --epochs 2
//   mpirun -np 2 examples/ddp_fashion_mnist --backend mpi --epochs 10
//   examples/ddp_fashion_mnist --epochs 2 --checkpoint ckpt && examples/ddp_fashion_mnist --epochs 4 --resume ckpt
// Checkpoints (CPU only; include/ringzero/checkpoint/, docs/checkpoint.md): --checkpoint saves the
// parameters, the optimizer's state and step count and the reducer's bucket layout after every
// epoch; --resume continues after the newest one (the sampler's order is a function of --seed and
// the epoch), so 2 + 2 epochs equal 4 bit for bit; --init-from takes a safetensors file
// (ringzero-ckpt consolidate); --epochs 0 evaluates the initial (or restored) model.
// The --compare-ranks runs train on 1 rank and then on 2 ranks with the same global batch and
// print the per-epoch speedup and both test accuracies side by side. `--device cuda` trains on
// the GPU instead (docs/gpu.md): the MLP's products in cuBLAS, its other steps in the small
// kernels of examples/common/cuda_mlp_kernels.cu, the gradient reducer's buckets in device memory
// and reduced on each rank's CUDA stream by the local backend on device memory (several ranks may
// share one GPU); without a GPU it exits at once with status 1 and "no CUDA device".
// `--backend mpi` runs one rank per MPI process (built with MPI; several machines work the same
// way, see docs/mpi.md): with the same seed and global batch it computes the same numbers as
// `--ranks 2` on the local backend.
// `--micro-batch N` splits every global batch (--global-batch, default 512) into micro-batches of N
// examples, micro-batch j to rank j mod n, from one shuffle that is the same for every rank
// count; `--reproducible` makes the reducer average the micro-batch gradients reproducibly
// (reducer_options::reproducible), so the final parameters are the same bits on any number of
// ranks: compare mode then prints a CRC-32 of each run's final parameters and whether they agree.
// `--help` lists every option.

//
// Read from the top: `train_step` is one optimizer step (the reducer's calls), `train` one run on
// the host (`rank_main`: one rank), `main` the command line's runs. Beside it: the options
// (ddp_options.hpp), the report and --compare-ranks table (ddp_report.hpp), checkpoints
// (ddp_checkpoint.hpp), the CUDA trainer (ddp_cuda.hpp); the backends start in
// examples/common/run_ranks.hpp.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <zlib.h>
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
#include "run_ranks.hpp"
#if RINGZERO_EXAMPLES_HAVE_CUDA
#include "ddp_cuda.hpp"
#endif

namespace rz = ringzero;
namespace ex = ringzero::examples;
using namespace ringzero::examples::ddp_example;

namespace {

#if RINGZERO_EXAMPLES_HAVE_CUDA
constexpr bool built_with_cuda = true;
#else
constexpr bool built_with_cuda = false;
#endif

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
    std::vector<int> widths = {static_cast<int>(data.train.features)};
    widths.insert(widths.end(), o.hidden.begin(), o.hidden.end());
    widths.push_back(data.train.classes);
    // Every rank initialises differently on purpose: the reducer broadcasts rank 0's values.
    ex::mlp model(widths, o.seed + static_cast<std::uint64_t>(comm.rank()) * 7919u);
    const int eval_chunk = 1000;
    model.reserve(std::max(per_rank, eval_chunk));

    std::vector<rz::ddp::reducer_parameter> params;
    for (std::size_t i = 0; i < model.tensor_count(); ++i)
      params.push_back(rz::ddp::reducer_parameter::of(model.parameter(i), model.gradient(i), model.tensor(i).name));
    rz::ddp::reducer_options ropt;
    ropt.bucket_byte_limits = bucket_limits(o);
    ropt.gradient_as_bucket_view = o.bucket_view;
    ropt.hook = make_hook(o.compress);
    ropt.reproducible = o.reproducible;
    rz::ddp::gradient_reducer reducer(comm, std::move(params), ropt);
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
      saver.emplace(o.checkpoint_dir);
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

    if (lead) {
      std::lock_guard<std::mutex> lock(result_mutex);
      result.buckets = reducer.bucket_count();
      result.steps_per_epoch = steps;
      if (print) {
        const std::string layout = bucket_layout(reducer, model);
        fmt::print(
            "  {} rank(s) x {} per rank x {} micro-step(s) = global batch {}{}; {} steps/epoch; {} lr {:g}{}; "
            "compress {}; gradients {}{}\n  buckets in reduction order: {}\n",
            ranks, per_rank, o.accumulate, result.global_batch,
            split ? " (micro-batch j on rank j mod " + std::to_string(ranks) + ")" : std::string(), steps, o.optimizer,
            result.lr, o.scale_lr ? " (scaled by the rank count)" : "", o.compress,
            o.bucket_view ? "written into bucket memory" : "copied through the buckets",
            o.reproducible ? "; reproducible reduction" : "", layout);
        std::fflush(stdout);
      }
    }
    if (lead) result.first_epoch = first_epoch;
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
      for (std::uint64_t s = 0; s < steps; ++s) {
        auto load = [&](int micro) {
          data.train.gather(shard.subspan(first_row(s, micro), static_cast<std::size_t>(per_rank)), x.data(), y.data());
        };
        train_step(reducer, model, *opt, x.data(), y.data(), per_rank, o.accumulate, grad_scale, !o.reproducible, load,
                   bind_views, loss_sum);
        ++optimizer_steps;
        if (bar.enabled())
          bar.update(fmt::format("epoch {:>2}/{}", epoch + 1, o.epochs), s + 1, steps,
                     fmt::format("loss {:.4f}",
                                 loss_sum / static_cast<double>((s + 1) * static_cast<std::uint64_t>(o.accumulate))));
      }
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
      epoch_metrics m;
      m.epoch = epoch + 1;
      m.train_seconds = std::chrono::duration<double>(t1 - t0).count();
      m.samples = steps * static_cast<std::uint64_t>(result.global_batch);
      m.samples_per_second = static_cast<double>(m.samples) / m.train_seconds;
      m.train_loss = sums[0] / sums[1];
      m.test_accuracy = ev.accuracy;
      m.test_loss = ev.loss;
      m.eval_seconds = std::chrono::duration<double>(e1 - e0).count();
      m.reduction_seconds = st.reduction_seconds;
      m.exposed_seconds = st.exposed_seconds;
      m.hidden_fraction = st.hidden_fraction();
      if (print)
        fmt::print(
            "  epoch {:>2}/{}  {:6.2f} s  {:8.0f} samples/s  train loss {:.4f}  test acc {:.4f}  "
            "reduce {:5.3f} s, {:3.0f}% hidden\n",
            m.epoch, o.epochs, m.train_seconds, m.samples_per_second, m.train_loss, m.test_accuracy,
            m.reduction_seconds, 100.0 * m.hidden_fraction);
      std::fflush(stdout);
      std::lock_guard<std::mutex> lock(result_mutex);
      result.epochs.push_back(m);
    }
    if (lead) {  // the final parameters' CRC-32 (zlib), in tensor order
      uLong crc = crc32_z(0L, Z_NULL, 0);
      for (std::size_t i = 0; i < model.tensor_count(); ++i) {
        const auto p = model.parameter(i);
        crc = crc32_z(crc, reinterpret_cast<const Bytef*>(p.data()), p.size_bytes());
      }
      std::lock_guard<std::mutex> lock(result_mutex);
      result.parameter_crc32 = static_cast<std::uint32_t>(crc);
    }
  };
  // Threads of the local backend, or this process's rank under --backend mpi (run_ranks.hpp).
  ex::run_ranks(ex::rank_setup{o.backend, "cpu", ranks, o.pin}, rank_main);
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
  // Started by mpirun/srun/torchrun as one of several processes without --backend mpi: refuse
  // rather than run one complete job per process.
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
    ex::require_device(where, "ddp_fashion_mnist", built_with_cuda);  // without a GPU: fails at once
    const ex::fashion_mnist data = ex::load_fashion_mnist(o.data_dir, o.train_subset, o.test_subset);
    json out;
    out["example"] = "01_ddp_fashion_mnist";
    out["config"] = config_json(o, data);
    out["runs"] = json::array();

    if (o.compare_ranks.empty()) {
      int per_rank = o.batch_size;
      options run_options = o;
      if (o.micro_batch > 0) {
        per_rank = o.micro_batch;
        run_options.accumulate = o.global_batch / (o.micro_batch * o.ranks);
      } else if (o.global_batch > 0) {
        if (o.global_batch % (o.ranks * o.accumulate) != 0)
          throw rz::error(rz::errc::invalid_argument,
                          fmt::format("--global-batch {} is not divisible by {} ranks x {} micro-steps", o.global_batch,
                                      o.ranks, o.accumulate));
        per_rank = o.global_batch / (o.ranks * o.accumulate);
      }
      const auto t0 = clock_type::now();
      run_result r = train_on_device(run_options, data, o.ranks, per_rank, process_rank == 0);
      if (process_rank != 0) return 0;  // rank 0 holds the metrics (identical on every rank)
      print_run(r, t0);
      out["runs"].push_back(to_json(r));
    } else {
      const std::vector<int>& counts = compare_counts;
      const int largest = *std::max_element(counts.begin(), counts.end());
      const int global = o.global_batch > 0 ? o.global_batch : o.batch_size * largest * o.accumulate;
      if (o.scale_lr)
        fmt::print("note: --scale-lr is ignored in compare mode (the global batch is the same for every run)\n");
      options same = o;
      same.scale_lr = false;
      std::vector<run_result> runs;
      for (int n : counts) {
        int per_rank = 0;
        if (o.micro_batch > 0) {  // checked above: n divides the number of micro-batches
          per_rank = o.micro_batch;
          same.accumulate = global / (o.micro_batch * n);
        } else {
          if (global % (n * o.accumulate) != 0)
            throw rz::error(
                rz::errc::invalid_argument,
                fmt::format("global batch {} is not divisible by {} ranks x {} micro-steps", global, n, o.accumulate));
          per_rank = global / (n * o.accumulate);
        }
        fmt::print("== {} rank(s)\n", n);
        std::fflush(stdout);
        runs.push_back(train_on_device(same, data, n, per_rank, true));
        out["runs"].push_back(to_json(runs.back()));
      }
      print_comparison(o, runs, out);
    }
    if (!o.json_path.empty()) {
      std::ofstream f(o.json_path);
      f << out.dump(2) << "\n";
      if (!f) throw rz::error(rz::errc::io_error, "cannot write " + o.json_path);
    }
    for (const auto& run : out["runs"])
      if (run["final_test_accuracy"].get<double>() < o.min_accuracy) {
        std::fprintf(stderr, "ddp_fashion_mnist: %d rank(s) ended at test accuracy %.4f, below --min-accuracy %.4f\n",
                     run["ranks"].get<int>(), run["final_test_accuracy"].get<double>(), o.min_accuracy);
        return 3;
      }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (o.backend == "mpi")
      std::fprintf(stderr, "ddp_fashion_mnist (process %d): %s\n", process_rank, rz::error_text(e).c_str());
    else
      std::fprintf(stderr, "ddp_fashion_mnist: %s\n", rz::error_text(e).c_str());
    return 1;
  }
  return 0;
}