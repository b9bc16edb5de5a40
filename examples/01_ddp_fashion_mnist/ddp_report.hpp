#pragma once
/// @file
/// What example 01 measures and prints: an epoch's metrics, a run's result and its JSON, the
/// bucket layout of the header, the closing line of a run and, in --compare-ranks mode, the runs
/// side by side (epoch times, speedups, accuracies, how much reduction was hidden, whether the
/// final parameters are the same bits).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ddp_options.hpp"
#include "evaluation.hpp"
#include "idx_dataset.hpp"

namespace ringzero::examples::ddp_example {

namespace rz = ringzero;
namespace ex = ringzero::examples;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

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

inline json to_json(const run_result& r) {
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

inline double total_train_seconds(const run_result& r) {
  double t = 0;
  for (const auto& m : r.epochs) t += m.train_seconds;
  return t;
}

/// The run's settings as the JSON file records them.
inline json config_json(const options& o, const ex::fashion_mnist& data) {
  return {{"backend", o.backend},
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
}

/// The closing line of one run (`t0`: when it began).
inline void print_run(const run_result& r, clock_type::time_point t0) {
  fmt::print(
      "{} rank(s), global batch {} ({} per rank x {} micro-steps), {} bucket(s): final test accuracy {:.4f}, "
      "{:.1f} s of training ({:.1f} s in all){}\n",
      r.ranks, r.global_batch, r.per_rank_batch, r.accumulate, r.buckets, r.evaluation.accuracy, total_train_seconds(r),
      std::chrono::duration<double>(clock_type::now() - t0).count(),
      r.parameter_crc32 ? fmt::format("; final parameters crc32 {:08x}", *r.parameter_crc32) : std::string());
}

/// --compare-ranks: the runs side by side against the first one; adds "comparison" and
/// "parameters_bitwise_identical" to `out`.
inline void print_comparison(const options& o, const std::vector<run_result>& runs, json& out) {
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
      line += fmt::format(" | {:>12} {:>6.2f} s {:>8.4f}", "", r.epochs[e].train_seconds, r.epochs[e].test_accuracy);
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
      fmt::print("parameters bitwise identical across {} ranks: yes (crc32 {:08x}){}\n", list, *base.parameter_crc32,
                 o.reproducible ? "" : " (without --reproducible this is not guaranteed)");
    else
      fmt::print("parameters bitwise identical across {} ranks: no (crc32 per rank count: {}){}\n", list, crcs,
                 o.reproducible ? "" : "; --reproducible --micro-batch N makes them identical");
    out["parameters_bitwise_identical"] = identical;
  }
}

}  // namespace ringzero::examples::ddp_example
