#pragma once
/// @file
/// Example 01 on CUDA devices (--device cuda; docs/gpu.md): `train_cuda`, the device twin of the
/// host trainer (see its comment). Needs RINGZERO_EXAMPLES_HAVE_CUDA: nvcc, the CUDA runtime and
/// cuBLAS at configuration.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include "cuda_buffer.hpp"
#include "cuda_dataset.hpp"
#include "cuda_mlp.hpp"
#include "cuda_optimizer.hpp"
#include "ddp_options.hpp"
#include "ddp_report.hpp"
#include "distributed_sampler.hpp"
#include "progress_bar.hpp"
#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/verify_replicas.hpp"

namespace ringzero::examples::ddp_example {

namespace rz = ringzero;
namespace ex = ringzero::examples;

/// `train` on CUDA devices (--device cuda): the ranks are threads of the local backend on device
/// memory (`local::launch_cuda`: rank r on device r modulo the number of GPUs, so several ranks
/// may share one GPU), each with its own CUDA stream. The model (cuda_mlp: cuBLAS products), the
/// datasets, the optimizer state and the reducer's buckets live in device memory; every step is
/// enqueued on the rank's stream without host synchronisation (the sampler's indices are
/// uploaded once per epoch, and the losses are summed on the device and read once per epoch).
/// Same initialisation, sampler, buckets, hooks and update rules as the CPU path; the numbers
/// differ from it in the last bits (cuBLAS summation order, fused multiply-adds).
inline run_result train_cuda(const options& o, const ex::fashion_mnist& data, int ranks, int per_rank, bool print) {
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
        const std::vector<int> widths = ex::layer_widths(o.hidden, data);
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
        rz::ddp::gradient_reducer reducer(comm, std::move(params), reducer_options_of(o));
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
        ex::replica_checks checks{o.check_replicas};
        std::uint64_t steps_done = 0;
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
          const rz::traffic_counts traffic0 = comm.traffic();
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
            // The update is on `stream`, the communicator's: the check's copies come after it.
            checks.after_step(++steps_done, [&] { return rz::ddp::verify_replicas(reducer); });
            if (bar.enabled()) bar.update(fmt::format("epoch {:>2}/{}", epoch + 1, o.epochs), s + 1, steps, "enqueued");
          }
          comm.synchronize();
          const std::uint64_t sent = (comm.traffic() - traffic0).total().total_sent();
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
          const std::uint64_t samples = steps * static_cast<std::uint64_t>(result.global_batch);
          const ex::evaluation_result ev{n ? host_sums[3] / static_cast<double>(n) : 0.0,
                                         n ? host_sums[2] / static_cast<double>(n) : 0.0, n};
          const epoch_metrics m = epoch_record(epoch + 1, std::chrono::duration<double>(t1 - t0).count(), samples,
                                               host_sums[0] / static_cast<double>(samples), ev,
                                               std::chrono::duration<double>(e1 - t1).count(), st, steps, sent);
          if (print) print_epoch(m, o.epochs, true);
          std::lock_guard<std::mutex> lock(result_mutex);
          result.epochs.push_back(m);
          result.replica_checks = checks.summary();
        }
      },
      launch_opt);
  return result;
}

}  // namespace ringzero::examples::ddp_example
