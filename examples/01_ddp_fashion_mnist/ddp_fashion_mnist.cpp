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

#include <algorithm>
#include <chrono>
#include <cmath>
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

#include "command_line.hpp"
#include "distributed_sampler.hpp"
#include "evaluation.hpp"
#include "idx_dataset.hpp"
#include "launcher.hpp"
#include "mlp.hpp"
#include "optimizer.hpp"
#include "progress_bar.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/ringzero.hpp"
#if RINGZERO_EXAMPLES_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_buffer.hpp"
#include "cuda_dataset.hpp"
#include "cuda_mlp.hpp"
#include "cuda_optimizer.hpp"
#include "ringzero/backend/local/cuda.hpp"
#endif
#if RINGZERO_HAS_MPI
#include "ringzero/backend/mpi.hpp"
#endif

namespace rz = ringzero;
namespace ex = ringzero::examples;
using json = nlohmann::json;
namespace ck = ringzero::checkpoint;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string backend = "local";  // local (threads) or mpi (one rank per process)
  int ranks = 2;
  std::string compare_ranks;  // "1,2": compare mode
  int epochs = 10;
  int batch_size = 256;  // per rank, per micro-step
  int global_batch = 0;  // 0: ranks * accumulate * batch_size
  int accumulate = 1;
  float lr = -1.0f;  // <0: optimizer's default
  bool scale_lr = false;
  std::string optimizer = "sgd";
  std::uint64_t seed = 1;
  // Bucket limit. PyTorch's defaults (1 MiB first bucket, then 25 MiB: --bucket-mb 25
  // --first-bucket-mb 1) would put this 0.9 MiB model in one bucket, reduced only after the whole
  // backward pass; 0.1 MiB closes the first bucket after fc2 (134 KiB: fc3 and fc2), which is then
  // reduced while fc1's gradients are computed.
  double bucket_mb = 0.1;
  double first_bucket_mb = -1.0;
  std::string compress = "none";
  bool bucket_view = true;
  bool pin = true;
  std::size_t train_subset = 0;
  std::size_t test_subset = 0;
  std::string data_dir = ex::default_fashion_mnist_dir();
  std::string json_path;
  bool progress = true;
  std::vector<int> hidden = {256, 128};
  std::vector<std::string>
      hidden_lists;            // --hidden as given: widths, or comma-separated lists of them (ex::hidden_widths_check)
  double min_accuracy = 0.0;   // exit with status 3 when a run ends below it (for tests)
  std::string device = "cpu";  // cpu or cuda
  int micro_batch = 0;         // >0: examples per micro-batch, micro-batch j of a global batch on rank j mod n
  bool reproducible = false;   // reducer_options::reproducible: each micro-batch's gradient is one contribution
  std::string checkpoint_dir;  // --checkpoint: save there at the end of every epoch
  std::string resume_dir;      // --resume: continue from the newest complete checkpoint there
  std::string init_from;       // --init-from: initial parameters from a safetensors file
};

/// The global batch of --micro-batch runs when --global-batch is not given (the same for every
/// rank count, so that separate runs on different rank counts train on the same batches).
constexpr int default_micro_batch_global = 512;

/// One epoch's metrics (identical on every rank; recorded by rank 0).
struct epoch_metrics {
  int epoch = 0;
  double train_seconds = 0;
  double samples_per_second = 0;
  double train_loss = 0;
  double test_accuracy = 0;
  double test_loss = 0;
  double eval_seconds = 0;
  double reduction_seconds = 0;
  double exposed_seconds = 0;
  double hidden_fraction = 0;
  std::uint64_t samples = 0;
};

struct run_result {
  int ranks = 0;
  int per_rank_batch = 0;
  int global_batch = 0;
  int accumulate = 1;
  float lr = 0;
  std::size_t buckets = 0;
  std::uint64_t steps_per_epoch = 0;
  std::vector<epoch_metrics> epochs;
  std::optional<std::uint32_t> parameter_crc32;  // zlib's CRC-32 of the final parameters (CPU runs)
  int first_epoch = 0;                           // epochs done before this run (--resume)
  ex::evaluation_result evaluation;              // of the final model (also when no epoch was trained)
};

/// The largest --bucket-mb and --first-bucket-mb: 2^40 MiB (2^60 bytes, a byte count uint64
/// holds), far beyond any model; larger values are refused, not wrapped.
constexpr double max_bucket_mb = 1099511627776.0;
/// The largest global batch (examples per optimizer step), as --global-batch's range.
constexpr std::int64_t max_global_batch = 1 << 24;

/// A bucket limit in MiB: finite, from 0 (one bucket per tensor) to max_bucket_mb.
const CLI::Validator bucket_mb_range = ex::number_check(
    {.low = 0, .high = max_bucket_mb}, "a size in MiB from 0 (one bucket per tensor) to 1099511627776 (2^40)", "MiB");

/// An accuracy: finite, from 0 to 1.
const CLI::Validator accuracy_range = ex::number_check({.low = 0, .high = 1}, "an accuracy from 0 to 1", "ACCURACY");

float default_lr(const std::string& optimizer) { return optimizer == "adamw" ? 1e-3f : 0.1f; }

/// The reducer's byte limits of --first-bucket-mb and --bucket-mb (both checked by
/// bucket_mb_range: the products fit in uint64).
std::vector<std::uint64_t> bucket_limits(const options& o) {
  auto bytes = [](double mb) { return static_cast<std::uint64_t>(mb * 1024.0 * 1024.0); };
  if (o.first_bucket_mb >= 0) return {bytes(o.first_bucket_mb), bytes(o.bucket_mb)};
  return {bytes(o.bucket_mb)};
}

/// Throws errc::invalid_argument unless --batch-size x `ranks` x --accumulate examples per
/// optimizer step stay within max_global_batch (in 64 bits: the int products would overflow).
void check_global_batch(std::int64_t ranks, const options& o) {
  const std::int64_t global = std::int64_t{o.batch_size} * ranks * o.accumulate;
  if (global > max_global_batch)
    throw rz::error(
        rz::errc::invalid_argument,
        fmt::format("--batch-size {} x {} rank(s) x --accumulate {} = {} examples per optimizer step: more than "
                    "{}, the most --global-batch allows",
                    o.batch_size, ranks, o.accumulate, global, max_global_batch));
}

std::shared_ptr<rz::ddp::comm_hook> make_hook(const std::string& compress) {
  if (compress == "fp16") return rz::ddp::fp16_compress_hook();
  if (compress == "bf16") return rz::ddp::bf16_compress_hook();
  return nullptr;  // the default average
}

/// The reducer's buckets in reduction order, each with its parameters' names and size, as the
/// run's header prints them (the host and the CUDA model both name their tensors).
template <class Reducer, class Model>
std::string bucket_layout(const Reducer& reducer, const Model& model) {
  std::string layout;
  for (const auto& b : reducer.buckets()) {
    std::string names;
    for (std::size_t i : b.parameters) names += (names.empty() ? "" : " ") + model.tensor(i).name;
    layout += fmt::format("{}[{}: {:.1f} KiB]", layout.empty() ? "" : " ", names, b.bytes / 1024.0);
  }
  return layout;
}

/// The trainer's state as a checkpoint holds it: each tensor of the MLP under example 02's names
/// and shapes ("fc1.weight" [784, 256], "fc1.bias" [256], ...: a consolidated file initialises
/// either example) and its slices of the optimizer's state tensors (views, nothing is copied).
ck::replicated_state checkpoint_state(ex::mlp& model, ex::optimizer& opt) {
  ck::replicated_state state;
  const std::vector<ex::optimizer::state_tensor> states = opt.state_tensors();
  for (std::size_t i = 0; i < model.tensor_count(); ++i) {
    const ex::tensor_info& t = model.tensor(i);
    std::vector<std::uint64_t> shape = {static_cast<std::uint64_t>(t.cols)};
    if (t.rows > 1) shape.insert(shape.begin(), static_cast<std::uint64_t>(t.rows));
    state.add_parameter(t.name, model.parameter(i), shape);
    for (std::size_t k = 0; k < states.size(); ++k)
      state.add_optimizer_state(t.name, static_cast<int>(k), states[k].name,
                                states[k].values.subspan(t.offset, t.count), shape);
  }
  state.set_optimizer({{"kind", opt.name()}, {"lr", opt.learning_rate()}});
  return state;
}

/// Copies the parameters of the safetensors file `path` (every tensor of the model, by name, of
/// its shape, any floating dtype) into `model`; refuses a missing, misshapen or extra tensor.
void initialise_from(ex::mlp& model, const std::string& path) {
  const ringzero::checkpoint::detail::file f = ringzero::checkpoint::detail::file::open_read(path);
  const ck::safetensors_header h = ck::read_safetensors_header(f);
  std::vector<unsigned char> raw;
  for (std::size_t i = 0; i < model.tensor_count(); ++i) {
    const ex::tensor_info& t = model.tensor(i);
    const ck::safetensors_tensor* s = h.find(t.name);
    const std::uint64_t n = t.count;
    if (s == nullptr)
      throw rz::error(rz::errc::invalid_argument,
                      fmt::format("--init-from {}: the model's '{}' is not in the file", path, t.name));
    if (s->numel() != n || s->shape.back() != static_cast<std::uint64_t>(t.cols) || !s->type ||
        !rz::is_floating_point(*s->type))
      throw rz::error(
          rz::errc::invalid_argument,
          fmt::format("--init-from {}: '{}' is {} [{}], the model's is float32 [{}{}]", path, t.name, s->dtype_name,
                      fmt::join(s->shape, ", "), t.rows > 1 ? fmt::format("{}, ", t.rows) : "", t.cols));
    raw.resize(static_cast<std::size_t>(s->end - s->begin));
    f.read_at(raw.data(), raw.size(), s->begin);
    ck::detail::convert_elements(*s->type, raw.data(), rz::dtype::float32,
                                 reinterpret_cast<unsigned char*>(model.parameter(i).data()), n);
  }
  if (h.tensors.size() != model.tensor_count())
    throw rz::error(rz::errc::invalid_argument, fmt::format("--init-from {}: the file holds {} tensors, the model {}",
                                                            path, h.tensors.size(), model.tensor_count()));
}

/// --resume (parameters, optimizer state and step count, bucket layout) or --init-from into every
/// rank's replica, a collective; returns the epochs already done.
int restore(const options& o, rz::ddp::gradient_reducer& reducer, ck::replicated_state& state, ex::mlp& model,
            ex::optimizer& opt, bool lead) {
  if (!o.init_from.empty()) {
    initialise_from(model, o.init_from);
    if (lead) fmt::print("  initialised from {}\n", o.init_from);
    return 0;
  }
  if (o.resume_dir.empty()) return 0;
  const ck::training_progress p = ck::load(reducer, state, o.resume_dir);
  if (p.step_in_epoch != 0)
    throw rz::error(rz::errc::invalid_argument,
                    fmt::format("--resume {}: the checkpoint was saved in the middle of epoch {} (this "
                                "example resumes at epoch boundaries)",
                                o.resume_dir, p.epoch + 1));
  opt.set_steps(p.optimizer_steps);
  if (lead) {
    fmt::print("  resumed from {} after epoch {} ({} optimizer steps)\n", ck::resolve_checkpoint(o.resume_dir).string(),
               p.epoch, p.optimizer_steps);
    if (p.rng_seeds != std::vector<std::uint64_t>{o.seed})
      fmt::print("  note: the checkpoint was trained with --seed {}; the data order continues with --seed {}\n",
                 p.rng_seeds.empty() ? std::string("?") : std::to_string(p.rng_seeds.front()), o.seed);
  }
  return static_cast<int>(std::min<std::uint64_t>(p.epoch, static_cast<std::uint64_t>(o.epochs)));
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
    if (!o.checkpoint_dir.empty()) saver.emplace(o.checkpoint_dir);
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
        for (int micro = 0; micro < o.accumulate; ++micro) {
          data.train.gather(shard.subspan(first_row(s, micro), static_cast<std::size_t>(per_rank)), x.data(), y.data());
          loss_sum += model.forward(x.data(), y.data(), per_rank);
          reducer.set_require_gradient_sync(micro + 1 == o.accumulate);  // no_sync on the others
          model.backward(x.data(), y.data(), per_rank, grad_scale, micro > 0 && !o.reproducible,
                         [&](std::size_t i) { reducer.mark_ready(i); });
          reducer.finish();
        }
        bind_views();  // the one bucket rebuild may have moved the views
        opt->begin_step();
        for (std::size_t i = 0; i < model.tensor_count(); ++i)
          opt->update(model.parameter(i), model.gradient(i), model.tensor(i).offset);
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
      if (saver) {  // a collective over the reducer's communicator, between steps
        ck::training_progress progress;
        progress.optimizer_steps = optimizer_steps;
        progress.epoch = static_cast<std::uint64_t>(epoch + 1);
        progress.rng_seeds = {o.seed};
        progress.metadata = {{"example", "01_ddp_fashion_mnist"},
                             {"global_batch", std::to_string(result.global_batch)}};
        saver->save(reducer, state, progress);
      }
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
  if (o.backend == "mpi") {
#if RINGZERO_HAS_MPI
    rz::mpi::communicator comm;  // over MPI_COMM_WORLD: this process is one rank
    rank_main(comm);
#endif
  } else {
    rz::local::launch_options launch_opt;
    launch_opt.pin_threads = o.pin;
    rz::local::launch(ranks, rank_main, launch_opt);
  }
  return result;
}

#if RINGZERO_EXAMPLES_HAVE_CUDA
/// `train` on CUDA devices (--device cuda): the ranks are threads of the local backend on device
/// memory (`local::launch_cuda`: rank r on device r modulo the number of GPUs, so several ranks
/// may share one GPU), each with its own CUDA stream. The model (cuda_mlp: cuBLAS products), the
/// datasets, the optimizer state and the reducer's buckets live in device memory; every step is
/// enqueued on the rank's stream without host synchronisation (the sampler's indices are
/// uploaded once per epoch, and the losses are summed on the device and read once per epoch).
/// Same initialisation, sampler, buckets, hooks and update rules as the CPU path; the numbers
/// differ from it in the last bits (cuBLAS summation order, fused multiply-adds).
run_result train_cuda(const options& o, const ex::fashion_mnist& data, int ranks, int per_rank, bool print) {
  run_result result;
  result.ranks = ranks;
  result.per_rank_batch = per_rank;
  result.accumulate = o.accumulate;
  result.global_batch = per_rank * ranks * o.accumulate;
  const float base_lr = o.lr > 0 ? o.lr : default_lr(o.optimizer);
  result.lr = o.scale_lr ? base_lr * static_cast<float>(ranks) : base_lr;
  std::mutex result_mutex;

  rz::local::cuda_launch_options launch_opt;
  launch_opt.pin_threads = o.pin;
  rz::local::launch_cuda(
      ranks,
      [&](rz::local::cuda_communicator& comm) {
        const bool lead = comm.rank() == 0;
        const auto stream = static_cast<cudaStream_t>(comm.cuda_stream());
        std::vector<int> widths = {static_cast<int>(data.train.features)};
        widths.insert(widths.end(), o.hidden.begin(), o.hidden.end());
        widths.push_back(data.train.classes);
        // Initialised on the host exactly as the CPU path (differently per rank: the reducer
        // broadcasts rank 0's values), then uploaded.
        ex::mlp host_model(widths, o.seed + static_cast<std::uint64_t>(comm.rank()) * 7919u);
        ex::cuda_mlp model(host_model, stream);
        const int eval_chunk = 1000;
        const int max_rows = std::max(per_rank, eval_chunk);
        model.reserve(max_rows);

        std::vector<rz::ddp::reducer_parameter> params;
        for (std::size_t i = 0; i < model.tensor_count(); ++i) {
          rz::ddp::reducer_parameter p;
          p.data = model.parameter(i);
          p.grad = model.gradient(i);
          p.count = model.tensor(i).count;
          p.type = rz::dtype::float32;
          p.name = model.tensor(i).name;
          params.push_back(p);
        }
        rz::ddp::reducer_options ropt;
        ropt.bucket_byte_limits = bucket_limits(o);
        ropt.gradient_as_bucket_view = o.bucket_view;
        ropt.hook = make_hook(o.compress);
        rz::ddp::gradient_reducer reducer(comm, std::move(params), ropt);
        std::uint64_t bound_generation = ~std::uint64_t{0};
        auto bind_views = [&] {
          if (!o.bucket_view || bound_generation == reducer.layout_generation()) return;
          for (std::size_t i = 0; i < model.tensor_count(); ++i)
            model.bind_gradient(i, reducer.gradient_span<float>(i).data());
          bound_generation = reducer.layout_generation();
        };
        bind_views();

        ex::cuda_optimizer opt(o.optimizer, model.parameter_elements(), result.lr, stream);
        const ex::cuda_dataset train_set(data.train, stream);
        const ex::cuda_dataset test_set(data.test, stream);
        ex::distributed_sampler sampler(data.train.count, comm.world_size(), comm.rank(), o.seed);
        const std::size_t step_rows = static_cast<std::size_t>(per_rank) * static_cast<std::size_t>(o.accumulate);
        const std::uint64_t steps = sampler.shard_size() / step_rows;
        if (steps == 0)
          throw rz::error(rz::errc::invalid_argument,
                          fmt::format("{} training examples per rank are fewer than one step of {}",
                                      sampler.shard_size(), step_rows));
        // Device scratch, allocated once: the epoch's shard indices, the test indices 0..n-1, one
        // batch, and the sums {train loss, train correct, test loss, test correct}.
        ex::device_array<std::uint32_t> shard_indices(sampler.shard_size());
        ex::device_array<std::uint32_t> test_indices(data.test.count);
        {
          std::vector<std::uint32_t> iota(data.test.count);
          for (std::size_t k = 0; k < iota.size(); ++k) iota[k] = static_cast<std::uint32_t>(k);
          test_indices.upload(iota, stream);
        }
        ex::device_array<float> x(static_cast<std::size_t>(max_rows) * data.train.features);
        ex::device_array<std::uint8_t> y(static_cast<std::size_t>(max_rows));
        ex::device_array<double> sums(4);
        std::vector<std::uint32_t> shard_host(sampler.shard_size());
        ex::progress_bar bar(lead && print && o.progress);
        const float grad_scale = 1.0f / static_cast<float>(per_rank * o.accumulate);

        if (lead) {
          std::lock_guard<std::mutex> lock(result_mutex);
          result.buckets = reducer.bucket_count();
          result.steps_per_epoch = steps;
          if (print) {
            const std::string layout = bucket_layout(reducer, model);
            fmt::print(
                "  {} rank(s) on {} CUDA device(s) x {} per rank x {} micro-step(s) = global batch {}; {} steps/epoch; "
                "{} lr {:g}{}; compress {}; gradients {}\n  buckets in reduction order: {}\n",
                ranks, std::min(ranks, rz::primitive::cudart::device_count()), per_rank, o.accumulate,
                result.global_batch, steps, o.optimizer, result.lr, o.scale_lr ? " (scaled by the rank count)" : "",
                o.compress, o.bucket_view ? "written into bucket memory" : "copied through the buckets", layout);
            std::fflush(stdout);
          }
        }
        for (int epoch = 0; epoch < o.epochs; ++epoch) {
          sampler.set_epoch(static_cast<std::uint64_t>(epoch));
          const auto shard = sampler.indices();
          std::copy(shard.begin(), shard.end(), shard_host.begin());
          shard_indices.upload(shard_host, stream);
          rz::primitive::cudart::check(cudaMemsetAsync(sums.get(), 0, 4 * sizeof(double), stream),
                                       "cudaMemsetAsync (sums)");
          reducer.reset_stats();
          comm.synchronize();
          rz::barrier(comm);
          const auto t0 = clock_type::now();
          for (std::uint64_t s = 0; s < steps; ++s) {
            for (int micro = 0; micro < o.accumulate; ++micro) {
              const std::size_t first = static_cast<std::size_t>(s) * step_rows +
                                        static_cast<std::size_t>(micro) * static_cast<std::size_t>(per_rank);
              train_set.gather(shard_indices.get() + first, per_rank, x.get(), y.get(), stream);
              model.forward(x.get(), y.get(), per_rank, sums.get());
              reducer.set_require_gradient_sync(micro + 1 == o.accumulate);  // no_sync on the others
              model.backward(x.get(), y.get(), per_rank, grad_scale, micro > 0,
                             [&](std::size_t i) { reducer.mark_ready(i); });
              reducer.finish();
            }
            bind_views();  // the one bucket rebuild may have moved the views
            opt.begin_step();
            for (std::size_t i = 0; i < model.tensor_count(); ++i)
              opt.update(model.parameter(i), model.gradient(i), model.tensor(i).count, model.tensor(i).offset);
            if (bar.enabled()) bar.update(fmt::format("epoch {:>2}/{}", epoch + 1, o.epochs), s + 1, steps, "enqueued");
          }
          comm.synchronize();
          rz::barrier(comm);
          const auto t1 = clock_type::now();
          bar.clear();
          const rz::ddp::reducer_stats st = reducer.stats();
          // Evaluation: each rank a contiguous slice of the test set, as evaluation.hpp.
          const std::size_t n = data.test.count, world = static_cast<std::size_t>(comm.world_size());
          const std::size_t rank = static_cast<std::size_t>(comm.rank());
          const std::size_t begin = n * rank / world, end = n * (rank + 1) / world;
          for (std::size_t at = begin; at < end; at += static_cast<std::size_t>(eval_chunk)) {
            const int rows = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(eval_chunk), end - at));
            test_set.gather(test_indices.get() + at, rows, x.get(), y.get(), stream);
            model.forward(x.get(), y.get(), rows, sums.get() + 2);
          }
          rz::all_reduce(comm, sums.get(), sums.get(), 4, rz::dtype::float64, rz::reduce_kind::sum);
          double host_sums[4] = {0, 0, 0, 0};
          rz::primitive::cudart::check(
              cudaMemcpyAsync(host_sums, sums.get(), sizeof host_sums, cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync (sums)");
          comm.synchronize();
          const auto e1 = clock_type::now();
          if (!lead) continue;
          epoch_metrics m;
          m.epoch = epoch + 1;
          m.train_seconds = std::chrono::duration<double>(t1 - t0).count();
          m.samples = steps * static_cast<std::uint64_t>(result.global_batch);
          m.samples_per_second = static_cast<double>(m.samples) / m.train_seconds;
          m.train_loss = host_sums[0] / static_cast<double>(m.samples);
          m.test_accuracy = n ? host_sums[3] / static_cast<double>(n) : 0.0;
          m.test_loss = n ? host_sums[2] / static_cast<double>(n) : 0.0;
          m.eval_seconds = std::chrono::duration<double>(e1 - t1).count();
          // On device memory the reducer's timings measure enqueueing, not the GPU's work.
          m.reduction_seconds = st.reduction_seconds;
          m.exposed_seconds = st.exposed_seconds;
          m.hidden_fraction = st.hidden_fraction();
          if (print)
            fmt::print(
                "  epoch {:>2}/{}  {:6.2f} s  {:8.0f} samples/s  train loss {:.4f}  test acc {:.4f}  "
                "(GPU; reducer enqueue time {:5.3f} s)\n",
                m.epoch, o.epochs, m.train_seconds, m.samples_per_second, m.train_loss, m.test_accuracy,
                m.reduction_seconds);
          std::fflush(stdout);
          std::lock_guard<std::mutex> lock(result_mutex);
          result.epochs.push_back(m);
        }
      },
      launch_opt);
  return result;
}
#endif

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

json to_json(const run_result& r) {
  json j;
  j["ranks"] = r.ranks;
  j["per_rank_batch"] = r.per_rank_batch;
  j["global_batch"] = r.global_batch;
  j["accumulate"] = r.accumulate;
  j["learning_rate"] = r.lr;
  j["buckets"] = r.buckets;
  j["steps_per_epoch"] = r.steps_per_epoch;
  j["epochs"] = json::array();
  for (const auto& m : r.epochs)
    j["epochs"].push_back({{"epoch", m.epoch},
                           {"train_seconds", m.train_seconds},
                           {"samples", m.samples},
                           {"samples_per_second", m.samples_per_second},
                           {"train_loss", m.train_loss},
                           {"test_accuracy", m.test_accuracy},
                           {"test_loss", m.test_loss},
                           {"eval_seconds", m.eval_seconds},
                           {"reduction_seconds", m.reduction_seconds},
                           {"exposed_reduction_seconds", m.exposed_seconds},
                           {"hidden_fraction", m.hidden_fraction}});
  j["first_epoch"] = r.first_epoch;
  j["final_test_accuracy"] = r.evaluation.accuracy;
  j["final_test_loss"] = r.evaluation.loss;
  if (r.parameter_crc32) j["parameter_crc32"] = fmt::format("{:08x}", *r.parameter_crc32);
  return j;
}

double total_train_seconds(const run_result& r) {
  double t = 0;
  for (const auto& m : r.epochs) t += m.train_seconds;
  return t;
}

std::vector<int> parse_rank_list(const std::string& text) {
  const ex::whole_number_list counts = ex::parse_whole_number_list(text, 1, 256);  // as --ranks
  if (counts.refused)
    throw rz::error(rz::errc::invalid_argument,
                    "--compare-ranks '" + text + "': '" + *counts.refused + "' is not a rank count from 1 to 256");
  if (counts.values.size() < 2)
    throw rz::error(rz::errc::invalid_argument, "--compare-ranks needs two or more counts, e.g. 1,2");
  return std::vector<int>(counts.values.begin(), counts.values.end());
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Data-parallel training of an MLP on Fashion-MNIST with ringzero's gradient reducer"};
  app.add_option("--backend", o.backend,
                 "local (ranks are threads of this process) or mpi (one rank per process: run under mpirun -np N; "
                 "--ranks is then the number of processes or left out)")
      ->check(CLI::IsMember({"local", "mpi"}));
  auto* ranks_opt = app.add_option("--ranks", o.ranks, "number of ranks (threads of the local backend)")
                        ->check(ex::whole_number())
                        ->check(CLI::Range(1, 256));
  app.add_option(
      "--compare-ranks", o.compare_ranks,
      "train once per rank count (e.g. 1,2) with the same global batch and compare epoch times and accuracy");
  app.add_option("--epochs", o.epochs, "epochs to train in all (with --resume: including those done; 0: evaluate only)")
      ->check(ex::whole_number())
      ->check(CLI::Range(0, 100000));
  auto* batch_opt = app.add_option("--batch-size", o.batch_size, "examples per rank per micro-step")
                        ->check(ex::whole_number())
                        ->check(CLI::Range(1, 1 << 20));
  app.add_option("--global-batch", o.global_batch,
                 "examples per optimizer step over all ranks (sets the per-rank batch; compare mode default: "
                 "batch-size x largest rank count x accumulate)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 1 << 24));
  auto* accumulate_opt = app.add_option("--accumulate", o.accumulate,
                                        "micro-steps per optimizer step (gradient accumulation with no_sync)")
                             ->check(ex::whole_number())
                             ->check(CLI::Range(1, 1 << 16));
  app.add_option(
         "--micro-batch", o.micro_batch,
         "examples per micro-batch: every global batch (--global-batch, default 512 for every rank count) is split "
         "into micro-batches of this size, micro-batch j to rank j mod n, from one shuffle for every rank count (sets "
         "the per-rank batch and the micro-steps: not with --batch-size or --accumulate)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--reproducible", o.reproducible,
               "reproducible gradient averaging (reducer_options::reproducible): each micro-batch's gradient is one "
               "contribution, and with --micro-batch the final parameters are the same bits on any number of ranks");
  app.add_option("--lr", o.lr, "learning rate (default: 0.1 for sgd, 1e-3 for adamw)")
      ->check(ex::learning_rate_check());
  app.add_flag("--scale-lr", o.scale_lr, "multiply the learning rate by the number of ranks (linear scaling rule)");
  app.add_option("--optimizer", o.optimizer, "sgd (momentum 0.9) or adamw (weight decay 0.01)")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--seed", o.seed, "seed of the initialisation and of the per-epoch permutations")
      ->check(ex::whole_number());
  app.add_option(
         "--bucket-mb", o.bucket_mb,
         "bucket size limit in MiB, up to 2^40 (default 0.1: two buckets for this model; 0: one bucket per tensor; "
         "PyTorch's default is 25 with a 1 MiB first bucket)")
      ->check(bucket_mb_range);
  app.add_option("--first-bucket-mb", o.first_bucket_mb,
                 "limit of the first bucket in MiB, as --bucket-mb (default: as the others)")
      ->check(bucket_mb_range);
  app.add_option("--compress", o.compress, "gradient compression hook: none, fp16, bf16")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_flag("--bucket-view,!--no-bucket-view", o.bucket_view,
               "backward writes gradients straight into bucket memory (default) instead of copying");
  app.add_flag("--pin,!--no-pin", o.pin, "pin rank r's thread to core r (default on)");
  app.add_option("--train-subset", o.train_subset, "use only the first N training images (0: all 60000)")
      ->check(ex::whole_number());
  app.add_option("--test-subset", o.test_subset, "use only the first N test images (0: all 10000)")
      ->check(ex::whole_number());
  app.add_option("--data", o.data_dir, "directory with the Fashion-MNIST .gz files");
  app.add_option("--json", o.json_path, "write the metrics to this JSON file");
  app.add_flag("--progress,!--no-progress", o.progress, "progress bar when stdout is a terminal (default on)");
  app.add_option(
         "--hidden", o.hidden_lists,
         "hidden layer widths, each from 1 to 65536, separated by spaces or commas (default 256 128, or 256,128)")
      ->check(ex::hidden_widths_check());
  app.add_option("--min-accuracy", o.min_accuracy,
                 "fail (exit status 3) if a run's final test accuracy (0 to 1) is lower")
      ->check(accuracy_range);
  app.add_option(
         "--device", o.device,
         "cpu (default: Eigen, host memory) or cuda: train on CUDA GPUs (cuBLAS products, the gradient reducer on "
         "device memory, ranks as threads of the local backend, each with its own stream; rank r on GPU r modulo "
         "the number of GPUs, so several ranks may share one). Without a CUDA device, or in a build without CUDA, "
         "cuda fails at once with exit status 1 and says why")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--checkpoint", o.checkpoint_dir,
                 "save a checkpoint into this directory at the end of every epoch (DIR/step-N/, DIR/latest; CPU only)");
  auto* resume =
      app.add_option("--resume", o.resume_dir,
                     "continue from the newest complete checkpoint in this directory; --epochs counts the epochs done");
  app.add_option("--init-from", o.init_from,
                 "initial parameters from a safetensors file (e.g. from ringzero-ckpt consolidate)")
      ->excludes(resume);
  CLI11_PARSE(app, argc, argv);
  if (!o.hidden_lists.empty()) o.hidden = ex::hidden_widths(o.hidden_lists);
  // Started by mpirun/srun/torchrun as one of several processes without --backend mpi: refuse
  // rather than run one complete job per process.
  if (o.backend == "local") {
    const std::string refusal = ex::launcher_refusal(ex::detect_launcher(), "ddp_fashion_mnist", "--backend mpi");
    if (!refusal.empty()) {
      std::fprintf(stderr, "%s\n", refusal.c_str());
      return 2;
    }
  }

  int process_rank = 0;  // under --backend mpi only rank 0 prints and writes the JSON file
  try {
#if RINGZERO_HAS_MPI
    std::optional<rz::mpi::environment> mpi_env;  // MPI_Init_thread ... MPI_Finalize
    if (o.backend == "mpi") {
      mpi_env.emplace(argc, argv);
      int size = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      MPI_Comm_rank(MPI_COMM_WORLD, &process_rank);
      if (ranks_opt->count() > 0 && o.ranks != size)
        throw rz::error(rz::errc::invalid_argument,
                        fmt::format("--ranks {} but mpirun started {} processes", o.ranks, size));
      if (!o.compare_ranks.empty())
        throw rz::error(rz::errc::invalid_argument,
                        "--compare-ranks needs the local backend (an MPI job has one fixed number of processes)");
      o.ranks = size;
      o.pin = false;  // mpirun binds processes; threads are not pinned on top of that
      if (process_rank != 0) o.progress = false;
    }
#else
    (void)ranks_opt;
    if (o.backend == "mpi")
      throw rz::error(rz::errc::unsupported, "this ddp_fashion_mnist was built without MPI (--backend mpi)");
#endif
    // Options checked together, before the device and the data.
    std::vector<int> compare_counts;
    if (!o.compare_ranks.empty()) {
      compare_counts = parse_rank_list(o.compare_ranks);
      if (o.global_batch == 0 && o.micro_batch == 0)
        check_global_batch(*std::max_element(compare_counts.begin(), compare_counts.end()), o);
    } else if (o.global_batch == 0 && o.micro_batch == 0) {
      check_global_batch(o.ranks, o);
    }
    if (o.micro_batch > 0) {
      if (batch_opt->count() > 0 || accumulate_opt->count() > 0)
        throw rz::error(rz::errc::invalid_argument,
                        "--micro-batch sets the examples per rank and micro-step and the number of "
                        "micro-steps: give --global-batch and --micro-batch, not --batch-size or --accumulate");
      if (o.global_batch == 0) o.global_batch = default_micro_batch_global;
      if (o.global_batch % o.micro_batch != 0)
        throw rz::error(rz::errc::invalid_argument, fmt::format("--micro-batch {} does not divide the global batch {}",
                                                                o.micro_batch, o.global_batch));
      const int micro_batches = o.global_batch / o.micro_batch;
      for (int n : compare_counts.empty() ? std::vector<int>{o.ranks} : compare_counts)
        if (micro_batches % n != 0)
          throw rz::error(
              rz::errc::invalid_argument,
              fmt::format("--micro-batch {}: the global batch {} is {} micro-batches, which {} rank(s) cannot share "
                          "evenly (the micro-batch must divide the global batch per rank, {} / {})",
                          o.micro_batch, o.global_batch, micro_batches, n, o.global_batch, n));
    }
    if (o.reproducible && o.compress != "none")
      throw rz::error(
          rz::errc::invalid_argument,
          fmt::format("--reproducible cannot be combined with --compress {}: 16-bit compression rounds the partial "
                      "sums, which is not reproducible across rank counts",
                      o.compress));
    if ((o.reproducible || o.micro_batch > 0) && o.device == "cuda")
      throw rz::error(rz::errc::invalid_argument,
                      fmt::format("{} needs --device cpu (the reproducible accumulators and the "
                                  "micro-batch split are host-only here)",
                                  o.reproducible ? "--reproducible" : "--micro-batch"));
    const bool checkpointing = !o.checkpoint_dir.empty() || !o.resume_dir.empty() || !o.init_from.empty();
    if (checkpointing && o.device == "cuda")
      throw rz::error(rz::errc::unsupported,
                      "--checkpoint, --resume and --init-from work with --device cpu only (the checkpoint "
                      "layer saves host memory)");
    if (checkpointing && !o.compare_ranks.empty())
      throw rz::error(rz::errc::invalid_argument,
                      "--checkpoint, --resume and --init-from train one run: not with --compare-ranks");
    if (o.device == "cuda") {  // before loading anything: a machine without a GPU fails at once
      if (o.backend != "local")
        throw rz::error(rz::errc::invalid_argument,
                        fmt::format("--device cuda runs its ranks on the local backend (not --backend {})", o.backend));
#if RINGZERO_EXAMPLES_HAVE_CUDA
      (void)rz::primitive::cudart::require_device("--device cuda");
#else
      throw rz::error(rz::errc::unsupported,
                      "--device cuda: this build of ddp_fashion_mnist has no CUDA support (it needs "
                      "nvcc, the CUDA runtime and cuBLAS when it is configured)");
#endif
    }
    const ex::fashion_mnist data = ex::load_fashion_mnist(o.data_dir, o.train_subset, o.test_subset);
    json out;
    out["example"] = "01_ddp_fashion_mnist";
    out["config"] = {{"backend", o.backend},
                     {"reproducible", o.reproducible},
                     {"micro_batch", o.micro_batch},
                     {"epochs", o.epochs},
                     {"optimizer", o.optimizer},
                     {"seed", o.seed},
                     {"device", o.device},
                     {"compress", o.compress},
                     {"bucket_view", o.bucket_view},
                     {"bucket_byte_limits", bucket_limits(o)},
                     {"train_images", data.train.count},
                     {"test_images", data.test.count},
                     {"hidden", o.hidden},
                     {"pinned", o.pin}};
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
      fmt::print(
          "{} rank(s), global batch {} ({} per rank x {} micro-steps), {} bucket(s): final test accuracy {:.4f}, "
          "{:.1f} s of training ({:.1f} s in all){}\n",
          r.ranks, r.global_batch, r.per_rank_batch, r.accumulate, r.buckets, r.evaluation.accuracy,
          total_train_seconds(r), std::chrono::duration<double>(clock_type::now() - t0).count(),
          r.parameter_crc32 ? fmt::format("; final parameters crc32 {:08x}", *r.parameter_crc32) : std::string());
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
      // Side by side: each run against the first one.
      const run_result& base = runs.front();
      std::string head = fmt::format("{:>5}", "epoch");
      for (const auto& r : runs) head += fmt::format(" | {:>2} rank(s): {:>7} {:>8}", r.ranks, "time", "test acc");
      for (std::size_t k = 1; k < runs.size(); ++k) head += fmt::format(" | speedup {}/{}", runs[k].ranks, base.ranks);
      fmt::print("\n{}\n", head);
      json cmp = json::array();
      for (std::size_t e = 0; e < base.epochs.size(); ++e) {
        std::string line = fmt::format("{:>5}", e + 1);
        for (const auto& r : runs)
          line +=
              fmt::format(" | {:>12} {:>6.2f} s {:>8.4f}", "", r.epochs[e].train_seconds, r.epochs[e].test_accuracy);
        for (std::size_t k = 1; k < runs.size(); ++k)
          line += fmt::format(" | {:>10.2f}x", base.epochs[e].train_seconds / runs[k].epochs[e].train_seconds);
        fmt::print("{}\n", line);
      }
      for (std::size_t k = 1; k < runs.size(); ++k) {
        const run_result& r = runs[k];
        const double speedup = total_train_seconds(base) / total_train_seconds(r);
        double reduction = 0, exposed = 0;
        for (const auto& m : r.epochs) {
          reduction += m.reduction_seconds;
          exposed += m.exposed_seconds;
        }
        const double hidden = reduction > 0 ? std::clamp(1.0 - exposed / reduction, 0.0, 1.0) : 0.0;
        const double acc_diff = 100.0 * (r.evaluation.accuracy - base.evaluation.accuracy);
        // On the GPU the reducer's timings measure enqueueing only: no overlap figure.
        const std::string overlap =
            o.device == "cuda" ? std::string()
                               : fmt::format("; {:.0f}% of the {:.3f} s of gradient reduction hidden behind backward",
                                             100.0 * hidden, reduction);
        const std::string crc =
            r.parameter_crc32 && base.parameter_crc32
                ? fmt::format("; final parameters crc32 {:08x} vs {:08x}", *r.parameter_crc32, *base.parameter_crc32)
                : std::string();
        fmt::print(
            "{} rank(s) vs {}: epoch-time speedup {:.2f}x (total training time {:.2f} s vs {:.2f} s); final test "
            "accuracy {:.4f} vs {:.4f} ({:+.2f} points){}{}\n",
            r.ranks, base.ranks, speedup, total_train_seconds(r), total_train_seconds(base), r.evaluation.accuracy,
            base.evaluation.accuracy, acc_diff, overlap, crc);
        cmp.push_back({{"ranks", r.ranks},
                       {"baseline_ranks", base.ranks},
                       {"speedup", speedup},
                       {"epoch_speedups",
                        [&] {
                          json s = json::array();
                          for (std::size_t e = 0; e < base.epochs.size(); ++e)
                            s.push_back(base.epochs[e].train_seconds / r.epochs[e].train_seconds);
                          return s;
                        }()},
                       {"test_accuracy", r.evaluation.accuracy},
                       {"baseline_test_accuracy", base.evaluation.accuracy},
                       {"accuracy_difference_points", acc_diff},
                       {"reduction_seconds", reduction},
                       {"exposed_reduction_seconds", exposed},
                       {"hidden_fraction", hidden}});
      }
      out["comparison"] = cmp;
      if (base.parameter_crc32) {  // CPU runs: are the final parameters the same bits on every rank count?
        bool identical = true;
        std::string list, crcs;
        for (const auto& r : runs) {
          identical = identical && r.parameter_crc32 == base.parameter_crc32;
          list += fmt::format("{}{}", list.empty() ? "" : ", ", r.ranks);
          crcs += fmt::format("{}{}: {:08x}", crcs.empty() ? "" : ", ", r.ranks, *r.parameter_crc32);
        }
        if (identical)
          fmt::print("parameters bitwise identical across {} ranks: yes (crc32 {:08x}){}\n", list,
                     *base.parameter_crc32, o.reproducible ? "" : " (without --reproducible this is not guaranteed)");
        else
          fmt::print("parameters bitwise identical across {} ranks: no (crc32 per rank count: {}){}\n", list, crcs,
                     o.reproducible ? "" : "; --reproducible --micro-batch N makes them identical");
        out["parameters_bitwise_identical"] = identical;
      }
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
