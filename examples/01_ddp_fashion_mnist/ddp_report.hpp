#pragma once
/// @file
/// What example 01 measures and prints: an epoch's metrics, a run's result and its JSON, the
/// bucket layout of the header, the closing line of a run and, in --compare-ranks mode, the runs
/// side by side (epoch times, speedups, accuracies, how much reduction was hidden, whether the
/// final parameters are the same bits).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include "ddp_options.hpp"
#include "evaluation.hpp"
#include "idx_dataset.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

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
  double sent_bytes_per_step = 0;  // what rank 0's collectives sent per optimizer step (communicator::traffic)
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
  json compression;                              // --compress powersgd:R: elements per step, sent and in full
  std::string replica_checks;                    // --check-replicas: what the checks found and cost
};

/// --compress powersgd:R: what each parameter and the whole model send per compressed step
/// against plain all_reduce (null for the other hooks).
template <class Reducer, class Model>
json compression_traffic(const Reducer& reducer, const Model& model) {
  const auto hook = std::dynamic_pointer_cast<rz::ddp::powersgd_hook>(reducer.options().hook);
  if (!hook) return nullptr;
  json j;
  const auto [sent, full] = hook->step_traffic();
  j["sent_elements_per_step"] = sent;
  j["uncompressed_elements_per_step"] = full;
  j["compressed_steps"] = hook->compressed_steps();
  for (std::size_t i = 0; i < reducer.parameter_count(); ++i) {
    const rz::ddp::powersgd_traffic t = hook->traffic(i);
    j["parameters"][model.tensor(i).name] = {{"sent", t.sent}, {"uncompressed", t.uncompressed}};
  }
  return j;
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
                           {"hidden_fraction", m.hidden_fraction},
                           {"sent_bytes_per_step", m.sent_bytes_per_step}});
  j["first_epoch"] = r.first_epoch;
  j["final_test_accuracy"] = r.evaluation.accuracy;
  j["final_test_loss"] = r.evaluation.loss;
  if (r.parameter_crc32) j["parameter_crc32"] = fmt::format("{:08x}", *r.parameter_crc32);
  if (!r.compression.is_null()) j["powersgd"] = r.compression;
  if (!r.replica_checks.empty()) j["replica_checks"] = r.replica_checks;
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

/// --check-replicas and --compress powersgd:R: what the checks found, what each weight sent.
inline void print_checks_and_compression(const run_result& r) {
  if (!r.replica_checks.empty()) fmt::print("  {}\n", r.replica_checks);
  if (r.compression.is_null()) return;
  const auto steps = r.compression["compressed_steps"].get<std::uint64_t>();
  if (steps == 0) {
    fmt::print("  powersgd: no step was compressed (compression starts after --powersgd-start steps)\n");
    return;
  }
  std::string per;
  for (const auto& [name, t] : r.compression["parameters"].items()) {
    const auto sent = t["sent"].get<std::uint64_t>(), full = t["uncompressed"].get<std::uint64_t>();
    if (sent < full) per += fmt::format("; {} {} -> {} ({:.1f}x)", name, full, sent, static_cast<double>(full) / sent);
  }
  const auto sent = r.compression["sent_elements_per_step"].get<std::uint64_t>();
  const auto full = r.compression["uncompressed_elements_per_step"].get<std::uint64_t>();
  fmt::print("  powersgd: {} compressed step(s); elements per step {} -> {} ({:.1f}x){}\n", steps, full, sent,
             static_cast<double>(full) / static_cast<double>(std::max<std::uint64_t>(sent, 1)), per);
}

/// The closing line of one run (`t0`: when it began).
inline void print_run(const run_result& r, clock_type::time_point t0) {
  fmt::print(
      "{} rank(s), global batch {} ({} per rank x {} micro-steps), {} bucket(s): final test accuracy {:.4f}, "
      "{:.1f} s of training ({:.1f} s in all){}\n",
      r.ranks, r.global_batch, r.per_rank_batch, r.accumulate, r.buckets, r.evaluation.accuracy, total_train_seconds(r),
      std::chrono::duration<double>(clock_type::now() - t0).count(),
      r.parameter_crc32 ? fmt::format("; final parameters crc32 {:08x}", *r.parameter_crc32) : std::string());
  print_checks_and_compression(r);
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

/// One epoch's record: `train_seconds` of training over `samples` examples with mean loss
/// `train_loss`, the evaluation `ev` that took `eval_seconds`, and the reducer's statistics (on
/// device memory they measure enqueueing, not the GPU's work).
inline epoch_metrics epoch_record(int epoch, double train_seconds, std::uint64_t samples, double train_loss,
                                  const ex::evaluation_result& ev, double eval_seconds,
                                  const rz::ddp::reducer_stats& st, std::uint64_t steps, std::uint64_t sent_bytes) {
  epoch_metrics m;
  m.epoch = epoch;
  m.train_seconds = train_seconds;
  m.samples = samples;
  m.samples_per_second = static_cast<double>(samples) / train_seconds;
  m.train_loss = train_loss;
  m.test_accuracy = ev.accuracy;
  m.test_loss = ev.loss;
  m.eval_seconds = eval_seconds;
  m.reduction_seconds = st.reduction_seconds;
  m.exposed_seconds = st.exposed_seconds;
  m.hidden_fraction = st.hidden_fraction();
  m.sent_bytes_per_step = static_cast<double>(sent_bytes) / static_cast<double>(steps);
  return m;
}

/// The line of one epoch (`gpu`: the reducer's time is enqueueing time, the hidden share is not shown).
inline void print_epoch(const epoch_metrics& m, int epochs, bool gpu) {
  fmt::print("  epoch {:>2}/{}  {:6.2f} s  {:8.0f} samples/s  train loss {:.4f}  test acc {:.4f}  ", m.epoch, epochs,
             m.train_seconds, m.samples_per_second, m.train_loss, m.test_accuracy);
  if (gpu)
    fmt::print("(GPU; reducer enqueue time {:5.3f} s), sent {:.1f} KiB/step\n", m.reduction_seconds,
               m.sent_bytes_per_step / 1024.0);
  else
    fmt::print("reduce {:5.3f} s, {:3.0f}% hidden, sent {:.1f} KiB/step\n", m.reduction_seconds,
               100.0 * m.hidden_fraction, m.sent_bytes_per_step / 1024.0);
  std::fflush(stdout);
}

/// The run's header: the batch split, the optimizer, compression and the bucket layout.
inline void print_header(const options& o, const run_result& r, const std::string& layout) {
  const bool split = o.micro_batch > 0;
  fmt::print(
      "  {} rank(s) x {} per rank x {} micro-step(s) = global batch {}{}; {} steps/epoch; {} lr {:g}{}; "
      "compress {}; gradients {}{}\n  buckets in reduction order: {}\n",
      r.ranks, r.per_rank_batch, r.accumulate, r.global_batch,
      split ? " (micro-batch j on rank j mod " + std::to_string(r.ranks) + ")" : std::string(), r.steps_per_epoch,
      o.optimizer, r.lr, o.scale_lr ? " (scaled by the rank count)" : "", o.compress,
      o.bucket_view ? "written into bucket memory" : "copied through the buckets",
      o.reproducible ? "; reproducible reduction" : "", layout);
  std::fflush(stdout);
}

/// zlib's CRC-32 of `model`'s parameters, in tensor order (non-const: `mlp::parameter` hands out spans it may write).
template <class Model>
std::uint32_t parameters_crc32(Model& model) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (std::size_t i = 0; i < model.tensor_count(); ++i) {
    const auto p = model.parameter(i);
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(p.data()), p.size_bytes());
  }
  return static_cast<std::uint32_t>(crc);
}

/// Writes `out` to --json (if given) and returns 3 when a run ended below --min-accuracy (0 otherwise).
inline int finish(const options& o, const json& out) {
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
  return 0;
}

}  // namespace ringzero::examples::ddp_example
