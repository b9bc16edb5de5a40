#pragma once
/// @file
/// Example 01's command line: the options, their checks (examples/common/command_line.hpp: a
/// refused value exits with CLI11's status 105 and names itself), the checks of options that
/// clash (before any device or data is touched), and what the trainer derives from them: the
/// bucket limits and the compression hook of the gradient reducer.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "command_line.hpp"
#include "ddp_compression.hpp"
#include "idx_dataset.hpp"
#include "replica_checks.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/ringzero.hpp"

namespace ringzero::examples::ddp_example {

namespace rz = ringzero;
namespace ex = ringzero::examples;

struct options {
  std::string backend = "local";  // local (threads) or mpi (one rank per process)
  int ranks = 2;
  double link_gbps = 0;       // --backend mpi: pace each rank's sends as a link of this many Gb/s (0: none)
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
  std::uint64_t powersgd_start = 100;  // --compress powersgd:R: plain steps first
  std::uint64_t check_replicas = 0;    // --check-replicas N: verify_replicas every N optimizer steps
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
  int keep_checkpoints = 0;    // --keep-checkpoints: keep only the newest N (0: all)
  std::string resume_dir;      // --resume: continue from the newest complete checkpoint there
  std::string init_from;       // --init-from: initial parameters from a safetensors file
  bool allow_nonfinite = false;  // --allow-nonfinite: --init-from accepts NaN and infinity
};

/// The global batch of --micro-batch runs when --global-batch is not given (the same for every
/// rank count, so that separate runs on different rank counts train on the same batches).
inline constexpr int default_micro_batch_global = 512;

/// The largest --bucket-mb and --first-bucket-mb: 2^40 MiB (2^60 bytes, a byte count uint64
/// holds), far beyond any model; larger values are refused, not wrapped.
inline constexpr double max_bucket_mb = 1099511627776.0;
/// The largest global batch (examples per optimizer step), as --global-batch's range.
inline constexpr std::int64_t max_global_batch = 1 << 24;

/// A bucket limit in MiB: finite, from 0 (one bucket per tensor) to max_bucket_mb.
inline const CLI::Validator bucket_mb_range = ex::number_check(
    {.low = 0, .high = max_bucket_mb}, "a size in MiB from 0 (one bucket per tensor) to 1099511627776 (2^40)", "MiB");

/// An accuracy: finite, from 0 to 1.
inline const CLI::Validator accuracy_range =
    ex::number_check({.low = 0, .high = 1}, "an accuracy from 0 to 1", "ACCURACY");

inline float default_lr(const std::string& optimizer) { return optimizer == "adamw" ? 1e-3f : 0.1f; }

/// The reducer's byte limits of --first-bucket-mb and --bucket-mb (both checked by
/// bucket_mb_range: the products fit in uint64).
inline std::vector<std::uint64_t> bucket_limits(const options& o) {
  auto bytes = [](double mb) { return static_cast<std::uint64_t>(mb * 1024.0 * 1024.0); };
  if (o.first_bucket_mb >= 0) return {bytes(o.first_bucket_mb), bytes(o.bucket_mb)};
  return {bytes(o.bucket_mb)};
}

/// Throws errc::invalid_argument unless --batch-size x `ranks` x --accumulate examples per
/// optimizer step stay within max_global_batch (in 64 bits: the int products would overflow).
inline void check_global_batch(std::int64_t ranks, const options& o) {
  const std::int64_t global = std::int64_t{o.batch_size} * ranks * o.accumulate;
  if (global > max_global_batch)
    throw rz::error(
        rz::errc::invalid_argument,
        fmt::format("--batch-size {} x {} rank(s) x --accumulate {} = {} examples per optimizer step: more than "
                    "{}, the most --global-batch allows",
                    o.batch_size, ranks, o.accumulate, global, max_global_batch));
}

using ex::powersgd_rank;

/// --compare-ranks as rank counts (two or more, each from 1 to 256).
inline std::vector<int> parse_rank_list(const std::string& text) {
  const ex::whole_number_list counts = ex::parse_whole_number_list(text, 1, 256);  // as --ranks
  if (counts.refused)
    throw rz::error(rz::errc::invalid_argument,
                    "--compare-ranks '" + text + "': '" + *counts.refused + "' is not a rank count from 1 to 256");
  if (counts.values.size() < 2)
    throw rz::error(rz::errc::invalid_argument, "--compare-ranks needs two or more counts, e.g. 1,2");
  return std::vector<int>(counts.values.begin(), counts.values.end());
}

/// The options whose presence on the command line matters (not only their value).
struct option_handles {
  CLI::Option* ranks = nullptr;
  CLI::Option* batch = nullptr;
  CLI::Option* accumulate = nullptr;
};

/// Registers every option of example 01 on `app`, writing into `o`.
inline option_handles add_options(CLI::App& app, options& o) {
  app.add_option("--backend", o.backend,
                 "local (ranks are threads of this process) or mpi (one rank per process: run under mpirun -np N; "
                 "--ranks is then the number of processes or left out)")
      ->check(CLI::IsMember({"local", "mpi"}));
  app.add_option("--link-gbps", o.link_gbps,
                 "with --backend mpi: hold each rank's sends back to a link of this many gigabits per second, to see "
                 "on one machine what a slower network does to a step (RINGZERO_LINK_GBPS; docs/mpi.md)")
      ->check(ex::number_check({.low = 0.001, .high = 1e6}, "a link speed in Gb/s from 0.001 to 1000000", "GBPS"));
  CLI::Option* ranks_opt = app.add_option("--ranks", o.ranks, "number of ranks (threads of the local backend)")
                               ->check(ex::whole_number())
                               ->check(CLI::Range(1, 256));
  app.add_option(
      "--compare-ranks", o.compare_ranks,
      "train once per rank count (e.g. 1,2) with the same global batch and compare epoch times and accuracy");
  app.add_option("--epochs", o.epochs, "epochs to train in all (with --resume: including those done; 0: evaluate only)")
      ->check(ex::whole_number())
      ->check(CLI::Range(0, 100000));
  CLI::Option* batch_opt = app.add_option("--batch-size", o.batch_size, "examples per rank per micro-step")
                               ->check(ex::whole_number())
                               ->check(CLI::Range(1, 1 << 20));
  app.add_option("--global-batch", o.global_batch,
                 "examples per optimizer step over all ranks (sets the per-rank batch; compare mode default: "
                 "batch-size x largest rank count x accumulate)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 1 << 24));
  CLI::Option* accumulate_opt = app.add_option("--accumulate", o.accumulate,
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
  ex::add_compress_options(app, o.compress, o.powersgd_start,
                           "gradient compression hook: none, fp16, bf16, or powersgd:R (low-rank PowerSGD of rank R, "
                           "1 to 1024, with error feedback; weights compressed, biases all-reduced as they are)");
  ex::add_check_replicas_option(app, o.check_replicas);
  app.add_flag("--bucket-view,!--no-bucket-view", o.bucket_view,
               "backward writes gradients straight into bucket memory (default) instead of copying");
  app.add_flag("--pin,!--no-pin", o.pin, "pin rank r's thread to core r (default on)");
  app.add_option("--train-subset", o.train_subset, "use only the first N training images (0: all 60000)")
      ->check(ex::whole_number());
  app.add_option("--test-subset", o.test_subset, "use only the first N test images (0: all 10000)")
      ->check(ex::whole_number());
  app.add_option("--data", o.data_dir, "directory with the Fashion-MNIST .gz files");
  app.add_option("--json", o.json_path, "write the metrics to this JSON file")->check(output_file());
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
  auto* checkpoint = app.add_option(
      "--checkpoint", o.checkpoint_dir,
      "save a checkpoint into this directory at the end of every epoch (DIR/step-N/, DIR/latest; CPU only)");
  ex::add_keep_checkpoints(app, o.keep_checkpoints, checkpoint);
  auto* resume =
      app.add_option("--resume", o.resume_dir,
                     "continue from the newest complete checkpoint in this directory; --epochs counts the epochs done");
  app.add_option("--init-from", o.init_from,
                 "initial parameters from a safetensors file (e.g. from ringzero-ckpt consolidate)")
      ->excludes(resume);
  app.add_flag("--allow-nonfinite", o.allow_nonfinite,
               "--init-from: load NaN and infinite values (refused by default: such a run trains to loss nan)");
  return {ranks_opt, batch_opt, accumulate_opt};
}

/// Checks the options together, before the device and the data (errc::invalid_argument or
/// errc::unsupported naming the options); returns the rank counts of --compare-ranks (empty
/// without it). `o.ranks` is the process count under --backend mpi.
inline std::vector<int> check_options(options& o, const option_handles& given) {
  if (o.link_gbps > 0 && o.backend != "mpi")
    throw rz::error(rz::errc::invalid_argument,
                    "--link-gbps needs --backend mpi (the local backend's ranks share memory: nothing to pace)");
  if (o.backend == "mpi" && !o.compare_ranks.empty())
    throw rz::error(rz::errc::invalid_argument,
                    "--compare-ranks needs the local backend (an MPI job has one fixed number of processes)");
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
    if (given.batch->count() > 0 || given.accumulate->count() > 0)
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
    throw rz::error(rz::errc::invalid_argument,
                    fmt::format("--reproducible cannot be combined with --compress {}: {}, which is not reproducible "
                                "across rank counts",
                                o.compress,
                                powersgd_rank(o.compress) > 0 ? "PowerSGD's low-rank approximation depends on how the "
                                                                "batch is split"
                                                              : "16-bit compression rounds the partial sums"));
  if (powersgd_rank(o.compress) > 0 && o.device == "cuda")
    throw rz::error(rz::errc::unsupported,
                    "--compress " + o.compress + " needs --device cpu (the PowerSGD hook works on host memory)");
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
  if (o.device == "cuda" && o.backend != "local")
    throw rz::error(rz::errc::invalid_argument,
                    fmt::format("--device cuda runs its ranks on the local backend (not --backend {})", o.backend));
  return compare_counts;
}

/// The MLP's tensors as the reducer's parameters: the weights with their shapes (in x out
/// matrices, which --compress powersgd:R compresses), the biases as vectors.
template <class Model>
std::vector<rz::ddp::reducer_parameter> reducer_parameters(Model& model) {
  std::vector<rz::ddp::reducer_parameter> params;
  for (std::size_t i = 0; i < model.tensor_count(); ++i) {
    const auto& t = model.tensor(i);
    std::vector<std::uint64_t> shape;
    if (t.rows > 1) shape = {static_cast<std::uint64_t>(t.rows), static_cast<std::uint64_t>(t.cols)};
    params.push_back(rz::ddp::reducer_parameter::of(model.parameter(i), model.gradient(i), t.name, shape));
  }
  return params;
}

/// The reducer's options from the command line: bucket limits, gradients as bucket views, the
/// compression hook, reproducible averaging (refused on CUDA by check_options).
inline rz::ddp::reducer_options reducer_options_of(const options& o) {
  rz::ddp::reducer_options r;
  r.bucket_byte_limits = bucket_limits(o);
  r.gradient_as_bucket_view = o.bucket_view;
  r.hook = ex::make_ddp_hook(o.compress, o.powersgd_start);
  r.reproducible = o.reproducible;
  return r;
}

/// How one run splits its global batch: examples per rank per micro-step, and micro-steps per
/// optimizer step.
struct batch_split {
  int per_rank = 0;
  int accumulate = 1;
};

/// The split for `ranks` ranks and a global batch of `global` examples (0: --batch-size per rank
/// and --accumulate micro-steps). --micro-batch fixes the examples per rank and the micro-steps
/// follow (check_options made them divide); otherwise the global batch is split over ranks x
/// --accumulate, or refused (errc::invalid_argument) when it does not divide.
inline batch_split split_batch(const options& o, int ranks, int global) {
  if (o.micro_batch > 0) return {o.micro_batch, global / (o.micro_batch * ranks)};
  if (global == 0) return {o.batch_size, o.accumulate};
  if (global % (ranks * o.accumulate) != 0)
    throw rz::error(
        rz::errc::invalid_argument,
        fmt::format("global batch {} is not divisible by {} ranks x {} micro-steps", global, ranks, o.accumulate));
  return {global / (ranks * o.accumulate), o.accumulate};
}

}  // namespace ringzero::examples::ddp_example
