// ringzero-verify-bench: what `verify_replicas` costs against the all_reduce of the same
// parameters (a DDP step's gradient traffic), side by side in one run.
//
//   ringzero-verify-bench --ranks 2 --params 1G --tensor 64M --iterations 5
//
// Every rank (a thread of the local backend) holds `--params` float32 parameters in tensors of
// `--tensor` elements, identical on every rank. Each iteration times, on every rank and then the
// slowest, one all_reduce (avg) of every tensor (in place: identical inputs keep identical values)
// and one `ringzero::verify_replicas` of them all; prints the medians and the check's share of the
// all_reduce. Then flips one bit in one rank's last tensor and checks that the next check names
// that rank and tensor (exit status 1 when it does not).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "ringzero/ringzero.hpp"
#include "ringzero/verify_replicas.hpp"

#include "size_arg.hpp"

namespace rz = ringzero;
using ringzero::bench::parse_size;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"verify_replicas against the all_reduce of the same parameters"};
  int ranks = 2, iterations = 5;
  std::string params_text = "1G", tensor_text = "64M";
  app.add_option("--ranks", ranks, "ranks (threads of the local backend)")->check(CLI::Range(1, 64));
  app.add_option("--params", params_text, "float32 parameters per rank (suffixes K, M, G: powers of 1024)");
  app.add_option("--tensor", tensor_text, "elements per tensor (the last one takes the rest)");
  app.add_option("--iterations", iterations, "timed iterations (the median is printed)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  std::uint64_t params = 0, tensor = 0;
  try {
    params = parse_size(params_text, "--params", 1);
    tensor = parse_size(tensor_text, "--tensor", 1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "ringzero-verify-bench: {}\n", e.what());
    return 1;
  }
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t left = params; left > 0; left -= std::min(left, tensor)) sizes.push_back(std::min(left, tensor));

  std::mutex mutex;
  std::vector<std::vector<double>> reduce_s(static_cast<std::size_t>(ranks)), verify_s(reduce_s);
  std::string flip_message;
  bool flip_found = false;
  try {
    rz::local::launch(ranks, [&](rz::communicator& comm) {
      std::vector<std::unique_ptr<float[]>> data;
      std::vector<rz::replica_tensor> tensors;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        data.emplace_back(new float[sizes[k]]);
        for (std::uint64_t i = 0; i < sizes[k]; ++i)
          data.back()[i] = static_cast<float>((i * 2654435761u + k) % 1000) * 1e-3f;
        tensors.push_back({"w" + std::to_string(k), data.back().get(), sizes[k] * sizeof(float)});
      }
      const auto r = static_cast<std::size_t>(comm.rank());
      for (int it = 0; it <= iterations; ++it) {  // iteration 0 warms up (pages, scratch)
        rz::barrier(comm);
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t k = 0; k < sizes.size(); ++k)
          rz::all_reduce(comm, data[k].get(), data[k].get(), sizes[k], rz::dtype::float32, rz::reduce_kind::avg);
        const auto t1 = std::chrono::steady_clock::now();
        rz::barrier(comm);
        const auto t2 = std::chrono::steady_clock::now();
        (void)rz::verify_replicas(comm, tensors, "parameters");
        const auto t3 = std::chrono::steady_clock::now();
        if (it == 0) continue;
        std::lock_guard<std::mutex> lock(mutex);
        reduce_s[r].push_back(std::chrono::duration<double>(t1 - t0).count());
        verify_s[r].push_back(std::chrono::duration<double>(t3 - t2).count());
      }
      // One flipped bit on the last rank, in the last tensor's last element.
      if (comm.rank() == comm.world_size() - 1 && comm.world_size() > 1) {
        std::uint32_t bits;
        std::memcpy(&bits, &data.back()[sizes.back() - 1], 4);
        bits ^= 1u;
        std::memcpy(&data.back()[sizes.back() - 1], &bits, 4);
      }
      try {
        (void)rz::verify_replicas(comm, tensors, "parameters");
      } catch (const rz::error& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (comm.rank() == 0) {
          flip_message = e.what();
          flip_found = e.kind() == rz::errc::replica_mismatch;
        }
      }
    });
  } catch (const std::exception& e) {
    fmt::print(stderr, "ringzero-verify-bench: {}\n", e.what());
    return 1;
  }
  // Per iteration the slowest rank, then the median over iterations.
  const auto slowest = [](const std::vector<std::vector<double>>& per_rank) {
    std::vector<double> out(per_rank.front().size(), 0.0);
    for (const auto& times : per_rank)
      for (std::size_t it = 0; it < out.size(); ++it) out[it] = std::max(out[it], times[it]);
    return out;
  };
  const double a = median(slowest(reduce_s)), v = median(slowest(verify_s));
  fmt::print(
      "| ranks | parameters per rank | tensors | all_reduce (ms) | verify_replicas (ms) | check / all_reduce |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  fmt::print("| {} | {} ({:.2f} GiB) | {} | {:.1f} | {:.1f} | {:.1f}% |\n", ranks, params,
             static_cast<double>(params) * 4 / (1u << 30), sizes.size(), 1e3 * a, 1e3 * v, 100 * v / a);
  fmt::print("medians of {} iterations, slowest rank per iteration\n", iterations);
  if (ranks > 1) {
    fmt::print("one flipped bit on rank {} (tensor w{}): {}\n", ranks - 1, sizes.size() - 1,
               flip_found ? "reported: " + flip_message : "NOT REPORTED");
    if (!flip_found) return 1;
  }
  return 0;
}
