// 03_libtorch_ddp: data-parallel training of a libtorch CNN on Fashion-MNIST through ringzero.
//
// What it demonstrates:
// - a plain libtorch model (torch::nn::Conv2d, ringzero::integration::sync_batch_norm, torch::nn::Linear,
//   torch::optim) made data-parallel with one call: `ringzero::integration::torch_ddp ddp(comm, model)`
//   (include/ringzero/integration/torch_ddp.hpp, docs/libtorch.md): every parameter's .grad() is
//   a view of the gradient reducer's bucket memory, so backward accumulates straight into the
//   buckets, and autograd hooks hand each bucket to an all_reduce as soon as its gradients are
//   accumulated, while backward goes on with the earlier layers; `ddp.finish()` after backward
//   leaves the averaged gradients for the optimizer;
// - SyncBatchNorm: the batch-norm statistics of the global batch (one all_reduce of sum, sum of
//   squares and count per layer), so N ranks compute what 1 rank computes on the whole batch;
// - gradient accumulation with `ddp.no_sync()` (--accumulate K);
// - compression hooks (--compress fp16, bf16, powersgd:R): the bridge registers each tensor's
//   shape, so PowerSGD compresses the convolution and linear weights as matrices;
// - N ranks as N threads of ringzero's local backend, each with one libtorch compute thread
//   (torch::set_num_threads(1)), and the sampler of examples 01 and 02 (examples/common/).
// What it does not use: MPI, GPUs, checkpoints (examples 01 and 02 show those).
//
// How to run (from the build directory; Fashion-MNIST from Debian's dataset-fashion-mnist):
//   examples/libtorch_ddp --ranks 2 --epochs 3
//   examples/libtorch_ddp --compare-ranks 1,2 --epochs 3       (same accuracy, speedup, overlap)
//   examples/libtorch_ddp --ranks 2 --accumulate 2 --train-subset 6000 --epochs 1
// `--help` lists every option; bench/libtorch_ddp.sh measures the 2-rank speedup.

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.hpp"
#include "ddp_compression.hpp"
#include "distributed_sampler.hpp"
#include "idx_dataset.hpp"
#include "launcher.hpp"
#include "replica_checks.hpp"
#include "ringzero/backend/local/launch.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/barrier.hpp"
#include "ringzero/integration/torch_ddp.hpp"
#include "ringzero/verify_replicas.hpp"

namespace rz = ringzero;
namespace ex = ringzero::examples;
namespace F = torch::nn::functional;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  int ranks = 2;
  std::string compare_ranks;
  int epochs = 3;
  int global_batch = 64;
  int accumulate = 1;
  std::string optimizer = "adam";
  double lr = 0;  // initial; 0: 1e-3 for adam, 0.05 for sgd
  std::uint64_t seed = 1;
  double bucket_mb = 0.05;
  std::string compress = "none";       // --compress: none, fp16, bf16, powersgd:R
  std::uint64_t powersgd_start = 100;  // powersgd:R: plain steps first
  std::uint64_t check_replicas = 0;    // --check-replicas N: verify_replicas every N optimizer steps
  std::size_t train_subset = 0;
  std::size_t test_subset = 0;
  std::string data_dir = ex::default_fashion_mnist_dir();
  std::string json_path;
  double min_accuracy = 0;
  bool pin = true;
};

// The CNN: conv 5x5 (8) - SyncBatchNorm - ReLU - max-pool 2, conv 5x5 (16) - SyncBatchNorm - ReLU -
// max-pool 2, linear 784 -> 128 - ReLU, linear 128 -> 10. `comm` makes the batch norms synchronised.
struct cnn : torch::nn::Module {
  explicit cnn(rz::communicator* comm) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5).padding(2)));
    bn1 = register_module("bn1", rz::integration::sync_batch_norm(comm, 8));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 5).padding(2)));
    bn2 = register_module("bn2", rz::integration::sync_batch_norm(comm, 16));
    fc1 = register_module("fc1", torch::nn::Linear(16 * 7 * 7, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = F::max_pool2d(torch::relu(bn1->forward(conv1->forward(x))), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(bn2->forward(conv2->forward(x))), F::MaxPool2dFuncOptions(2));
    return fc2->forward(torch::relu(fc1->forward(x.flatten(1))));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  rz::integration::sync_batch_norm bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct epoch_metrics {
  double train_seconds = 0;
  double train_loss = 0;
  double test_accuracy = 0;
  double reduction_seconds = 0;
  double exposed_seconds = 0;
};

struct run_result {
  int ranks = 0;
  int per_rank_batch = 0;
  std::size_t buckets = 0;
  std::vector<epoch_metrics> epochs;
  double final_accuracy() const { return epochs.empty() ? 0.0 : epochs.back().test_accuracy; }
  double train_seconds() const {
    double s = 0;
    for (const auto& e : epochs) s += e.train_seconds;
    return s;
  }
};

// Batch `indices` of `data` as a [b, 1, 28, 28] tensor and labels, in the caller's buffers.
void make_batch(const ex::image_dataset& data, std::span<const std::uint32_t> indices, std::vector<float>& x,
                std::vector<std::uint8_t>& y, torch::Tensor& images, torch::Tensor& labels) {
  x.resize(indices.size() * data.features);
  y.resize(indices.size());
  data.gather(indices, x.data(), y.data());
  images = torch::from_blob(x.data(), {static_cast<std::int64_t>(indices.size()), 1, 28, 28});
  labels = torch::from_blob(y.data(), {static_cast<std::int64_t>(indices.size())}, torch::kUInt8).to(torch::kInt64);
}

// Correct predictions of this rank's share of the test set (examples r, r + n, ...), summed over ranks.
double evaluate(rz::communicator& comm, cnn& model, const ex::image_dataset& test) {
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<std::uint32_t> mine;
  for (std::size_t i = static_cast<std::size_t>(comm.rank()); i < test.count;
       i += static_cast<std::size_t>(comm.world_size()))
    mine.push_back(static_cast<std::uint32_t>(i));
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  torch::Tensor images, labels;
  std::int64_t correct = 0;
  for (std::size_t at = 0; at < mine.size(); at += 500) {
    const std::size_t n = std::min<std::size_t>(500, mine.size() - at);
    make_batch(test, std::span<const std::uint32_t>(mine).subspan(at, n), x, y, images, labels);
    correct += model.forward(images).argmax(1).eq(labels).sum().item<std::int64_t>();
  }
  rz::all_reduce(comm, std::span<std::int64_t>(&correct, 1));
  model.train();
  return static_cast<double>(correct) / static_cast<double>(test.count);
}

run_result train(const options& o, const ex::fashion_mnist& data, int ranks, bool print) {
  const int per_rank = o.global_batch / (ranks * o.accumulate);
  run_result result;
  result.ranks = ranks;
  result.per_rank_batch = per_rank;
  std::mutex seed_mutex;  // libtorch's generator is global: every rank draws the same initial model
  rz::local::launch_options lo;
  lo.pin_threads = o.pin;
  rz::local::launch(
      ranks,
      [&](rz::communicator& comm) {
        torch::set_num_threads(1);  // one compute thread per rank
        std::shared_ptr<cnn> model;
        {
          std::lock_guard<std::mutex> lock(seed_mutex);
          torch::manual_seed(o.seed);
          model = std::make_shared<cnn>(&comm);
        }
        rz::integration::torch_ddp_options ddp_options;
        const auto limit = static_cast<std::uint64_t>(o.bucket_mb * 1024 * 1024);
        ddp_options.reducer.bucket_byte_limits = {std::max<std::uint64_t>(limit, 1)};
        ddp_options.reducer.hook = ex::make_ddp_hook(o.compress, o.powersgd_start);  // null: the plain average
        rz::integration::torch_ddp ddp(comm, *model, ddp_options);
        const double base_lr = o.lr > 0 ? o.lr : (o.optimizer == "adam" ? 1e-3 : 0.05);
        std::unique_ptr<torch::optim::Optimizer> optimizer;
        if (o.optimizer == "adam")
          optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(base_lr));
        else
          optimizer =
              std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(base_lr).momentum(0.9));
        ex::distributed_sampler sampler(data.train.count, ranks, comm.rank(), o.seed);
        const std::size_t steps = sampler.shard_size() / static_cast<std::size_t>(per_rank * o.accumulate);
        const double total_steps = static_cast<double>(steps) * o.epochs;
        double done_steps = 0;
        std::vector<float> x;
        std::vector<std::uint8_t> y;
        torch::Tensor images, labels;
        ex::replica_checks checks{o.check_replicas};
        for (int epoch = 0; epoch < o.epochs; ++epoch) {
          sampler.set_epoch(static_cast<std::uint64_t>(epoch));
          rz::barrier(comm);
          ddp.reducer().reset_stats();
          const auto t0 = clock_type::now();
          double loss_sum = 0;
          for (std::size_t s = 0; s < steps; ++s) {
            ddp.zero_grad();
            for (int m = 0; m < o.accumulate; ++m) {
              const std::size_t first = (s * static_cast<std::size_t>(o.accumulate) + static_cast<std::size_t>(m)) *
                                        static_cast<std::size_t>(per_rank);
              make_batch(data.train, sampler.indices().subspan(first, static_cast<std::size_t>(per_rank)), x, y, images,
                         labels);
              // Each micro-batch's loss is its share of the global batch's mean loss.
              const torch::Tensor loss = F::cross_entropy(model->forward(images), labels) / o.accumulate;
              loss_sum += loss.item<double>();
              if (m + 1 < o.accumulate) {
                auto no_sync = ddp.no_sync();  // accumulate locally, communicate at the last micro-batch
                loss.backward();
                ddp.finish();
              } else {
                loss.backward();
                ddp.finish();  // averaged gradients in .grad()
              }
            }
            // The learning rate decays linearly to 0 over the run.
            for (auto& group : optimizer->param_groups())
              group.options().set_lr(base_lr * (1.0 - done_steps / total_steps));
            done_steps += 1;
            optimizer->step();
            checks.after_step(static_cast<std::uint64_t>(done_steps),
                              [&] { return rz::ddp::verify_replicas(ddp.reducer()); });
          }
          rz::barrier(comm);
          epoch_metrics m;
          m.train_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
          double loss_total = loss_sum;
          rz::all_reduce(comm, std::span<double>(&loss_total, 1));
          m.train_loss = loss_total / (static_cast<double>(steps) * ranks);
          m.reduction_seconds = ddp.reducer().stats().reduction_seconds;
          m.exposed_seconds = ddp.reducer().stats().exposed_seconds;
          m.test_accuracy = evaluate(comm, *model, data.test);
          if (comm.rank() == 0) {
            result.epochs.push_back(m);
            result.buckets = ddp.reducer().bucket_count();
            if (print)
              fmt::print(
                  "epoch {:>3}: {:6.2f} s, {:7.0f} samples/s, train loss {:.4f}, test accuracy {:.4f}, "
                  "reduction {:.3f} s, {:3.0f}% hidden behind backward\n",
                  epoch + 1, m.train_seconds, static_cast<double>(steps) * o.global_batch / m.train_seconds,
                  m.train_loss, m.test_accuracy, m.reduction_seconds, 100.0 * ddp.reducer().stats().hidden_fraction());
            std::fflush(stdout);
          }
        }
        if (comm.rank() == 0 && print && checks.every > 0) fmt::print("{}\n", checks.summary());
        const auto powersgd = std::dynamic_pointer_cast<rz::ddp::powersgd_hook>(ddp.reducer().options().hook);
        if (powersgd && comm.rank() == 0 && print) {
          const auto [sent, full] = powersgd->step_traffic();
          fmt::print("powersgd: elements per compressed step {} -> {} ({:.1f}x fewer), {} of {} steps compressed\n",
                     full, sent, static_cast<double>(full) / static_cast<double>(std::max<std::uint64_t>(sent, 1)),
                     powersgd->compressed_steps(), powersgd->iterations());
        }
      },
      lo);
  return result;
}

double hidden_share(const run_result& r) {
  double reduction = 0, exposed = 0;
  for (const auto& e : r.epochs) {
    reduction += e.reduction_seconds;
    exposed += e.exposed_seconds;
  }
  return reduction > 0 ? std::clamp(1.0 - exposed / reduction, 0.0, 1.0) : 0.0;
}

json to_json(const run_result& r) {
  json epochs = json::array();
  for (const auto& e : r.epochs)
    epochs.push_back({{"train_seconds", e.train_seconds},
                      {"train_loss", e.train_loss},
                      {"test_accuracy", e.test_accuracy},
                      {"reduction_seconds", e.reduction_seconds},
                      {"exposed_reduction_seconds", e.exposed_seconds}});
  return {{"ranks", r.ranks},
          {"per_rank_batch", r.per_rank_batch},
          {"buckets", r.buckets},
          {"final_test_accuracy", r.final_accuracy()},
          {"train_seconds", r.train_seconds()},
          {"hidden_fraction", hidden_share(r)},
          {"epochs", epochs}};
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Data-parallel training of a libtorch CNN on Fashion-MNIST through ringzero's gradient reducer"};
  app.add_option("--ranks", o.ranks, "number of ranks (threads of the local backend)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 64));
  app.add_option("--compare-ranks", o.compare_ranks,
                 "train once per rank count (e.g. 1,2) with the same global batch; compare time and accuracy");
  app.add_option("--epochs", o.epochs, "epochs to train")->check(ex::whole_number())->check(CLI::Range(1, 10000));
  app.add_option("--global-batch", o.global_batch, "examples per optimizer step over all ranks")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--accumulate", o.accumulate, "micro-steps per optimizer step (no_sync accumulation)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 1024));
  app.add_option("--optimizer", o.optimizer, "adam or sgd (momentum 0.9)")->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--lr", o.lr,
                 "initial learning rate, decaying linearly to 0 over the run (default 1e-3 for adam, 0.05 for sgd)")
      ->check(ex::learning_rate_check());
  app.add_option("--seed", o.seed, "seed of the initial model and the per-epoch permutations")
      ->check(ex::whole_number());
  app.add_option("--bucket-mb", o.bucket_mb,
                 "bucket size limit in MiB (default 0.05: the linear layers in one bucket, the rest in another)")
      ->check(ex::number_check({.low = 0, .high = 1 << 20}, "a size from 0 to 2^20 MiB", "MIB"));
  ex::add_compress_options(app, o.compress, o.powersgd_start,
                           "gradient compression hook: none, fp16, bf16, or powersgd:R (low-rank PowerSGD of rank R, "
                           "1 to 1024, with error feedback: convolution and linear weights compressed, the rest "
                           "all-reduced)");
  ex::add_check_replicas_option(app, o.check_replicas);
  app.add_option("--train-subset", o.train_subset, "use only the first N training images (0: all 60000)")
      ->check(ex::whole_number());
  app.add_option("--test-subset", o.test_subset, "use only the first N test images (0: all 10000)")
      ->check(ex::whole_number());
  app.add_option("--data", o.data_dir, "directory with the Fashion-MNIST .gz files");
  app.add_option("--json", o.json_path, "write the metrics to this JSON file");
  app.add_option("--min-accuracy", o.min_accuracy, "fail (exit status 3) if a run's final test accuracy is lower")
      ->check(ex::number_check({.low = 0, .high = 1}, "an accuracy from 0 to 1", "ACCURACY"));
  app.add_flag("--pin,!--no-pin", o.pin, "pin rank r's thread to core r (default on)");
  CLI11_PARSE(app, argc, argv);
  // Started by mpirun/srun/torchrun as one of several processes: refuse rather than run one
  // complete job per process (this example has no MPI backend).
  const std::string refusal = ex::launcher_refusal(ex::detect_launcher(), "libtorch_ddp", "");
  if (!refusal.empty()) {
    std::fprintf(stderr, "%s\n", refusal.c_str());
    return 2;
  }
  try {
    torch::set_num_threads(1);
    std::vector<int> counts{o.ranks};
    if (!o.compare_ranks.empty()) {
      const ex::whole_number_list list = ex::parse_whole_number_list(o.compare_ranks, 1, 64);
      if (list.refused)
        throw rz::error(rz::errc::invalid_argument, "--compare-ranks '" + o.compare_ranks + "': '" + *list.refused +
                                                        "' is not a rank count from 1 to 64");
      if (list.values.size() < 2)
        throw rz::error(rz::errc::invalid_argument, "--compare-ranks needs two or more counts, e.g. 1,2");
      counts.assign(list.values.begin(), list.values.end());
    }
    for (int n : counts)
      if (o.global_batch % (n * o.accumulate) != 0)
        throw rz::error(rz::errc::invalid_argument,
                        fmt::format("--global-batch {} is not divisible by {} rank(s) x {} micro-step(s)",
                                    o.global_batch, n, o.accumulate));
    const ex::fashion_mnist data = ex::load_fashion_mnist(o.data_dir, o.train_subset, o.test_subset);
    if (data.train.count < static_cast<std::size_t>(o.global_batch))
      throw rz::error(rz::errc::invalid_argument,
                      fmt::format("{} training images make no global batch of {}", data.train.count, o.global_batch));
    fmt::print("Fashion-MNIST: {} training, {} test images; global batch {} ({} micro-step(s)), {}\n", data.train.count,
               data.test.count, o.global_batch, o.accumulate, o.optimizer);
    json out = {{"example", "libtorch_ddp"}, {"global_batch", o.global_batch}, {"runs", json::array()}};
    std::vector<run_result> runs;
    for (int n : counts) {
      fmt::print("== {} rank(s), {} per rank\n", n, o.global_batch / (n * o.accumulate));
      std::fflush(stdout);
      runs.push_back(train(o, data, n, true));
      out["runs"].push_back(to_json(runs.back()));
    }
    for (std::size_t k = 1; k < runs.size(); ++k) {
      const run_result& base = runs.front();
      const run_result& r = runs[k];
      const double speedup = base.train_seconds() / r.train_seconds();
      const double diff = 100.0 * (r.final_accuracy() - base.final_accuracy());
      fmt::print(
          "{} rank(s) vs {}: training-time speedup {:.2f}x ({:.2f} s vs {:.2f} s); final test accuracy {:.4f} vs "
          "{:.4f} ({:+.2f} points); {:.0f}% of the gradient reduction hidden behind backward\n",
          r.ranks, base.ranks, speedup, r.train_seconds(), base.train_seconds(), r.final_accuracy(),
          base.final_accuracy(), diff, 100.0 * hidden_share(r));
      out["comparison"].push_back({{"ranks", r.ranks},
                                   {"baseline_ranks", base.ranks},
                                   {"speedup", speedup},
                                   {"accuracy_difference_points", diff},
                                   {"hidden_fraction", hidden_share(r)}});
    }
    if (!o.json_path.empty()) {
      std::ofstream f(o.json_path);
      f << out.dump(2) << "\n";
      if (!f) throw rz::error(rz::errc::io_error, "cannot write " + o.json_path);
    }
    for (const auto& r : runs)
      if (r.final_accuracy() < o.min_accuracy) {
        std::fprintf(stderr, "libtorch_ddp: %d rank(s) ended at test accuracy %.4f, below --min-accuracy %.4f\n",
                     r.ranks, r.final_accuracy(), o.min_accuracy);
        return 3;
      }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "libtorch_ddp: %s\n", rz::error_text(e).c_str());
    return 1;
  }
  return 0;
}
