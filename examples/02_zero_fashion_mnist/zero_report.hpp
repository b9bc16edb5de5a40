#pragma once
/// @file
/// What example 02 measures and prints: the metrics of an epoch, each rank's memory next to the
/// plan, the growth of the process heap (malloc's statistics) while the runtime was built and
/// while the first step ran, the run's header and summary lines, and the JSON file of --json.
/// Rank 0 prints; the other ranks only measure.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "evaluation.hpp"
#include "gather_timing_json.hpp"
#include "heap_usage.hpp"
#include "mlp.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/sharded_model.hpp"
#include "zero_options.hpp"

namespace ringzero::examples::zero_example {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

/// One epoch's metrics (identical on every rank; recorded by rank 0).
struct epoch_metrics {
  int epoch = 0;
  double train_seconds = 0;
  std::uint64_t steps = 0;
  std::uint64_t samples = 0;
  double samples_per_second = 0;
  double mean_step_seconds = 0;
  double median_step_seconds = 0;
  double train_loss = 0;
  double test_accuracy = 0;
  double test_loss = 0;
  double eval_seconds = 0;
  double gradient_norm = 0;         // of the epoch's last step, before clipping
  std::uint64_t clipped_steps = 0;  // steps whose gradients were scaled down
  // Time rank 0 spent inside the runtime's calls (seconds, whole epoch):
  double gather_seconds = 0;    // pre_forward / pre_backward / post_forward (stage 3: gathers and waits)
  double reduce_seconds = 0;    // gradient views, post_backward, end_backward (reductions and waits)
  double update_seconds = 0;    // step(): norm, clipping, optimizer, parameter all_gather (stages 1-2)
  zero::gather_timing gathers;  // stage 3: the gathers and the compute stream's waits, timed on the streams
};

/// What one rank measured of its memory.
struct rank_memory {
  zero::memory_breakdown after_construction;      // memory_in_use() right after the constructor
  zero::memory_breakdown measured;                // memory_in_use() after training (pools at their peak)
  std::uint64_t scratch_growth_construction = 0;  // the communicator's scratch grown meanwhile
  std::uint64_t scratch_growth_first_step = 0;
  std::uint64_t allocated_peak = 0;  // memory_allocated(): the sum over memory spaces of the peaks
  std::uint64_t allocated_now = 0;   // memory_allocated(): what the runtime holds after training
};

/// `model`'s measured allocations (zero::sharded_model::memory_allocated) into `m`: the peaks of
/// the three memory spaces added (at least the peak of their sum) and what is held now.
inline void measure_allocations(const zero::sharded_model& model, rank_memory& m) {
  m.allocated_peak = m.allocated_now = 0;
  for (auto space :
       {primitive::memory_space::host, primitive::memory_space::pinned_host, primitive::memory_space::device}) {
    const primitive::memory_usage u = model.memory_allocated(space);
    m.allocated_peak += u.peak;
    m.allocated_now += u.current;
  }
}

/// Heap growth over all ranks (malloc statistics), when the C library reports it.
struct heap_growth {
  bool available = false;
  std::int64_t construction = 0;  // bytes, all ranks, communicator scratch excluded
  std::int64_t first_step = 0;
};

/// What a run leaves for the report (rank 0's view; `memory` of every rank it could see).
struct run_result {
  int per_rank_batch = 0;
  int global_batch = 0;
  double lr = 0;
  double weight_decay = 0;
  std::uint64_t steps_per_epoch = 0;
  std::vector<int> widths;
  std::vector<epoch_metrics> epochs;
  std::vector<double> step_seconds;  // every step of rank 0, in order
  std::vector<rank_memory> memory;   // by rank
  heap_growth heap;
  json plan;                          // the plan's summary (units, memory, traffic)
  int first_epoch = 0;                // epochs done before this run (--resume)
  evaluation_result evaluation;       // of the final model (also when no epoch was trained)
  std::uint32_t parameter_crc32 = 0;  // zlib's CRC-32 of the final parameters (float32, registration order)
  std::string replica_checks;         // --check-replicas: what the checks found and cost
};

/// A run's result before training: its batch, optimizer settings, layer widths and a memory
/// record per rank of this process.
inline run_result run_result_of(const options& o, const fashion_mnist& data) {
  run_result r;
  r.per_rank_batch = o.batch_size;
  r.global_batch = o.batch_size * o.where.ranks * o.accumulate;
  const zero::optimizer_options optimizer = optimizer_options_of(o);
  r.lr = optimizer.lr;
  r.weight_decay = optimizer.weight_decay;
  r.widths = layer_widths(o.hidden, data);
  r.memory.resize(static_cast<std::size_t>(o.where.ranks));
  return r;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// The heap and scratch readings of a run, taken between barriers: each reading process (rank 0
/// on the local backend, whose ranks share the process; every rank when each has a process)
/// reads while the other ranks wait. `total` adds the readings of all ranks.
class memory_probe {
 public:
  /// `enabled`: read at all (not on the device path, whose state is not on the heap). A collective:
  /// a warm-up all_reduce first, so that nothing the communicator allocates once lands in a window.
  memory_probe(communicator& comm, bool one_rank_per_process, bool enabled)
      : comm_(comm), reads_heap_(enabled && (one_rank_per_process || comm.rank() == 0)), enabled_(enabled) {
    if (!enabled_) return;
    double warm = 0;
    all_reduce(comm, &warm, &warm, 1, dtype::float64, reduce_kind::sum);
  }

  /// Mark k (0: before construction, 1: after it, 2: before the first step, 3: after it).
  void mark(int k) {
    if (!enabled_) return;
    barrier(comm_);
    if (reads_heap_) heap_[k] = static_cast<std::int64_t>(heap_bytes_in_use().value_or(0));
    scratch_[k] = static_cast<std::int64_t>(comm_.scratch_bytes());
    barrier(comm_);
  }
  /// The scratch growth of this rank between marks `from` and `to`.
  std::uint64_t scratch_growth(int from, int to) const {
    return static_cast<std::uint64_t>(scratch_[to] - scratch_[from]);
  }

  /// The heap growth of all ranks, their scratch growth excluded (a collective).
  heap_growth total() {
    heap_growth h;
    if (!enabled_ || !heap_bytes_in_use().has_value()) return h;
    std::int64_t sums[2] = {(reads_heap_ ? heap_[1] - heap_[0] : 0) - (scratch_[1] - scratch_[0]),
                            (reads_heap_ ? heap_[3] - heap_[2] : 0) - (scratch_[3] - scratch_[2])};
    all_reduce(comm_, sums, sums, 2, dtype::int64, reduce_kind::sum);
    h.available = true;
    h.construction = sums[0];
    h.first_step = sums[1];
    return h;
  }

 private:
  communicator& comm_;
  bool reads_heap_;
  bool enabled_;
  std::int64_t heap_[4] = {0, 0, 0, 0};
  std::int64_t scratch_[4] = {0, 0, 0, 0};
};

/// Every rank's `mine`, in rank order, on every rank (one all_gather over host memory).
inline std::vector<rank_memory> gather_memory(communicator& comm, const rank_memory& mine) {
  auto fields = [](const zero::memory_breakdown& m) {
    return std::vector<std::uint64_t>{m.parameters, m.gradients, m.master_weights, m.optimizer_states,
                                      m.communication_buffers};
  };
  std::vector<std::uint64_t> send = fields(mine.after_construction);
  for (std::uint64_t v : fields(mine.measured)) send.push_back(v);
  send.push_back(mine.scratch_growth_construction);
  send.push_back(mine.scratch_growth_first_step);
  send.push_back(mine.allocated_peak);
  send.push_back(mine.allocated_now);
  std::vector<std::uint64_t> all(send.size() * static_cast<std::size_t>(comm.world_size()));
  all_gather(comm, send.data(), all.data(), send.size(), dtype::uint64);
  std::vector<rank_memory> out(static_cast<std::size_t>(comm.world_size()));
  for (std::size_t r = 0; r < out.size(); ++r) {
    const std::uint64_t* v = all.data() + r * send.size();
    out[r].after_construction = {v[0], v[1], v[2], v[3], v[4]};
    out[r].measured = {v[5], v[6], v[7], v[8], v[9]};
    out[r].scratch_growth_construction = v[10];
    out[r].scratch_growth_first_step = v[11];
    out[r].allocated_peak = v[12];
    out[r].allocated_now = v[13];
  }
  return out;
}

inline json to_json(const zero::memory_breakdown& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"master_weights", m.master_weights},
          {"optimizer_states", m.optimizer_states},
          {"model_states", m.model_states()},
          {"communication_buffers", m.communication_buffers},
          {"total", m.total()}};
}

inline json plan_summary(const zero::shard_plan& plan) {
  json units = json::array();
  for (const auto& u : plan.units())
    units.push_back({{"name", u.name}, {"gather_bytes", u.gather_bytes}, {"gradient_bytes", u.gradient_bytes}});
  json traffic = json::array();
  for (const auto& t : plan.traffic())
    traffic.push_back({{"collective", std::string(collective_name(t.collective))},
                       {"purpose", t.purpose},
                       {"calls", t.calls},
                       {"elements", t.elements},
                       {"bytes", t.bytes}});
  const auto& c = plan.communication();
  return {{"stage", plan.stage()},
          {"world_size", plan.world_size()},
          {"parameter_elements", plan.parameter_elements()},
          {"padding_elements", plan.padding_elements()},
          {"units", units},
          {"memory", to_json(plan.memory())},
          {"host_memory", to_json(plan.host_memory())},  // the offloaded part of "memory"
          {"gather_buffers", c.gather_buffers},
          {"gather_buffer_bytes", c.gather_buffer_bytes},
          {"gradient_buckets", c.gradient_buckets},
          {"gradient_bucket_bytes", c.gradient_bucket_bytes},
          {"traffic", traffic}};
}

/// The largest gathered unit in bytes (what stage 3 adds to a rank's shard while a layer runs).
inline std::uint64_t largest_unit_bytes(const zero::shard_plan& plan) {
  std::uint64_t m = 0;
  for (const auto& u : plan.units()) m = std::max(m, u.gather_bytes);
  return m;
}

inline std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  double v = b;
  while (std::fabs(v) >= 1024.0 && k < 4) {
    v /= 1024.0;
    ++k;
  }
  return k == 0 ? fmt::format("{:.0f} B", v) : fmt::format("{:.2f} {}", v, units[k]);
}

inline std::string relative_text(double measured, double planned) {
  if (planned == 0) return measured == 0 ? "equal" : "(planned 0)";
  if (measured == planned) return "equal";
  return fmt::format("{:+.2f}%", 100.0 * (measured - planned) / planned);
}

/// The run's header: batch, steps, optimizer, model and its gather units (rank 0).
inline void print_header(const options& o, const run_result& r, const zero::sharded_model& model) {
  std::string units;
  for (const auto& u : model.plan().units())
    units +=
        fmt::format("{}{} {:.1f} KiB", units.empty() ? "" : ", ", u.name, static_cast<double>(u.gather_bytes) / 1024.0);
  fmt::print(
      "  stage {}, {} rank(s) x {} per rank x {} micro-step(s) = global batch {}; {} steps/epoch; {} lr {:g} "
      "weight decay {:g}{}\n  model {}: {} parameters in {} gather units ({})\n",
      o.stage, o.where.ranks, o.batch_size, o.accumulate, r.global_batch, r.steps_per_epoch, o.optimizer, r.lr,
      r.weight_decay, o.clip_norm > 0 ? fmt::format("; gradient norm clipped to {:g}", o.clip_norm) : "",
      fmt::format("{}", fmt::join(r.widths, "-")), model.plan().parameter_elements(), model.unit_count(), units);
  if (o.where.device != "cpu")
    fmt::print("  device {}: the runtime's device path; offload {}\n", o.where.device, o.offload);
  if (o.where.device != "cpu" && o.offload != "none")
    fmt::print("  planned memory per rank: {:.1f} KiB in the device's memory, {:.1f} KiB in host memory ({})\n",
               static_cast<double>(model.plan().device_memory().total()) / 1024.0,
               static_cast<double>(model.plan().host_memory().total()) / 1024.0,
               o.where.device == "cuda" ? "pinned" : "the simulated device's offload space");
  if (o.precision == "bfloat16")
    fmt::print(
        "  precision bfloat16: parameters bfloat16, gradients {} (reduced in it), master weights and "
        "optimizer states float32; layers compute in float32\n",
        o.reduce_dtype.empty() ? "bfloat16" : o.reduce_dtype);
  std::fflush(stdout);
}

/// Runs `f` and adds its duration to `field` of `*timing` (no record: just runs it).
template <class F>
decltype(auto) timed(epoch_metrics* timing, double epoch_metrics::*field, F&& f) {
  if (timing == nullptr) return f();
  struct add_on_exit {
    double* target;
    clock_type::time_point start = clock_type::now();
    ~add_on_exit() { *target += seconds_since(start); }
  } guard{&(timing->*field)};
  return f();
}

/// Completes `m` for epoch `epoch` (1-based): `train_seconds` of `steps` optimizer steps (their
/// durations `step_times`) of `global_batch` examples, and the evaluation `ev`.
inline void finish_epoch(epoch_metrics& m, int epoch, double train_seconds, std::uint64_t steps, int global_batch,
                         const std::vector<double>& step_times, const evaluation_result& ev) {
  m.epoch = epoch;
  m.train_seconds = train_seconds;
  m.steps = steps;
  m.samples = steps * static_cast<std::uint64_t>(global_batch);
  m.samples_per_second = static_cast<double>(m.samples) / train_seconds;
  m.mean_step_seconds = train_seconds / static_cast<double>(steps);
  m.median_step_seconds = median(step_times);
  m.test_accuracy = ev.accuracy;
  m.test_loss = ev.loss;
}

/// Puts this rank's `memory` where rank 0 reports it: gathered over the communicator when the
/// process heap holds the state (host memory; with the heap growth `probe` saw), written into
/// the shared result on the local backend, rank 0's own with one process per rank.
inline void collect_memory(communicator& comm, const options& o, memory_probe& probe, bool heap_holds_state,
                           const rank_memory& memory, run_result& result) {
  const bool lead = comm.rank() == 0;
  if (heap_holds_state) {  // every rank's memory to rank 0, over host memory
    const std::vector<rank_memory> all = gather_memory(comm, memory);
    const heap_growth heap = probe.total();
    if (lead) {
      result.memory = all;
      result.heap = heap;
    }
  } else if (o.where.backend == "local") {
    result.memory[static_cast<std::size_t>(comm.rank())] = memory;  // the ranks share this process
  } else if (lead) {
    result.memory = {memory};  // one process per rank: rank 0 reports its own
  }
}

/// The line of a run with no epoch to train (--epochs 0, or --resume at --epochs).
inline void print_evaluation_only(int first_epoch, int epochs, const evaluation_result& ev) {
  fmt::print("  no epoch to train ({} of {} done): test loss {:.4f}  test acc {:.4f}\n", first_epoch, epochs, ev.loss,
             ev.accuracy);
}

/// One epoch's line (rank 0).
inline void print_epoch(const options& o, const epoch_metrics& m) {
  fmt::print(
      "  epoch {:>2}/{}  {:6.2f} s  {:8.0f} samples/s  {:6.2f} ms/step  train loss {:.4f}  test acc {:.4f}  "
      "in the runtime: gather {:.3f} s, reduce {:.3f} s, step {:.3f} s",
      m.epoch, o.epochs, m.train_seconds, m.samples_per_second, 1e3 * m.mean_step_seconds, m.train_loss,
      m.test_accuracy, m.gather_seconds, m.reduce_seconds, m.update_seconds);
  if (m.gathers.gathers > 0)
    fmt::print("; gathers {:.3f} s on the communication stream, {:.3f} s waited for: {:.0f}% hidden",
               m.gathers.gather_seconds, m.gathers.exposed_seconds, 100 * m.gathers.hidden_fraction());
  fmt::print("\n");
  std::fflush(stdout);
}

/// Prints each rank's memory next to the plan, and the heap growth.
inline void print_memory(const options& o, const run_result& r, const zero::shard_plan& plan,
                         const zero::shard_plan& stage0) {
  const int ranks = o.where.ranks;
  const zero::memory_breakdown& p = plan.memory();
  fmt::print(
      "\nModel-state memory per rank: measured = the runtime's buffers by category (sharded_model::memory_in_use(), "
      "after\ntraining, pools at their peak), planned = shard_plan::memory(); allocated = every allocation of the "
      "runtime,\ncounted where it is made (sharded_model::memory_allocated())\n");
  fmt::print("  {:<10} {:>12} {:>12} {:>14} {:>16} {:>13} {:>15}\n", "rank", "parameters", "gradients",
             "master weights", "optimizer states", "model states", "comm. buffers");
  auto row = [](const std::string& label, const zero::memory_breakdown& m) {
    fmt::print("  {:<10} {:>12} {:>12} {:>14} {:>16} {:>13} {:>15}\n", label,
               bytes_text(static_cast<double>(m.parameters)), bytes_text(static_cast<double>(m.gradients)),
               bytes_text(static_cast<double>(m.master_weights)), bytes_text(static_cast<double>(m.optimizer_states)),
               bytes_text(static_cast<double>(m.model_states())),
               bytes_text(static_cast<double>(m.communication_buffers)));
  };
  for (std::size_t k = 0; k < r.memory.size(); ++k) {
    const zero::memory_breakdown& m = r.memory[k].measured;
    row(fmt::format("{} measured", k), m);
    row(fmt::format("{} planned", k), p);
    fmt::print(
        "  {:<10} model states {}, communication buffers {}\n", "",
        relative_text(static_cast<double>(m.model_states()), static_cast<double>(p.model_states())),
        relative_text(static_cast<double>(m.communication_buffers), static_cast<double>(p.communication_buffers)));
    fmt::print("  {:<10} allocated (counted where allocated): {} at the peak, {} now; the plan {}\n", "",
               bytes_text(static_cast<double>(r.memory[k].allocated_peak)),
               bytes_text(static_cast<double>(r.memory[k].allocated_now)), bytes_text(static_cast<double>(p.total())));
  }
  const auto& c = plan.communication();
  if (c.bytes() > 0)
    fmt::print("  communication buffers planned: {} gather buffer(s) of {} and {} gradient bucket(s) of {}\n",
               c.gather_buffers, bytes_text(static_cast<double>(c.gather_buffer_bytes)), c.gradient_buckets,
               bytes_text(static_cast<double>(c.gradient_bucket_bytes)));
  if (r.heap.available) {
    const double n = static_cast<double>(ranks);
    const double construction = static_cast<double>(r.heap.construction) / n,
                 first = static_cast<double>(r.heap.first_step) / n;
    const double built = static_cast<double>(p.model_states() + p.communication_buffers);
    fmt::print(
        "  heap growth per rank (malloc statistics of the {} / {} ranks, communicator scratch excluded):\n"
        "    while the runtime was built: {} (planned model states {} + communication buffers {}: {})\n"
        "    during the first step:       {} (nothing large is allocated there)\n",
        o.where.backend == "local" ? "process" : "processes", ranks, bytes_text(construction),
        bytes_text(static_cast<double>(p.model_states())), bytes_text(static_cast<double>(p.communication_buffers)),
        relative_text(construction, built), bytes_text(first));
  }
  if (o.stage > 0 && !r.memory.empty()) {
    const double s0 = static_cast<double>(stage0.memory().model_states());
    const double bound = s0 / ranks + static_cast<double>(largest_unit_bytes(plan));
    const double mine = static_cast<double>(r.memory[0].measured.model_states());
    fmt::print(
        "  against stage 0 (planned {} of model states per rank): this stage holds {:.1f}% of it; 1/{} of it plus the "
        "largest gather unit is {}\n",
        bytes_text(s0), 100.0 * mine / s0, ranks, bytes_text(bound));
  }
}

/// The closing line: final accuracy and loss, step times, total time (rank 0).
inline void print_summary(const options& o, const run_result& r, clock_type::time_point t0) {
  double seconds = 0;
  std::uint64_t steps = 0;
  for (const auto& m : r.epochs) {
    seconds += m.train_seconds;
    steps += m.steps;
  }
  if (r.epochs.empty())
    fmt::print("\nstage {}, {} rank(s): no epoch trained; test accuracy {:.4f}, test loss {:.6f}\n", o.stage,
               o.where.ranks, r.evaluation.accuracy, r.evaluation.loss);
  else
    fmt::print(
        "\nstage {}, {} rank(s), global batch {}: final test accuracy {:.4f}, train loss {:.6f}; {:.2f} ms per step "
        "(median {:.2f} ms); {:.1f} s of training ({:.1f} s in all)\n",
        o.stage, o.where.ranks, r.global_batch, r.epochs.back().test_accuracy, r.epochs.back().train_loss,
        1e3 * seconds / static_cast<double>(steps), 1e3 * median(r.step_seconds), seconds, seconds_since(t0));
  fmt::print("final parameters crc32 {:08x}\n", r.parameter_crc32);
  if (!r.replica_checks.empty()) fmt::print("{}\n", r.replica_checks);
}

inline json to_json(const options& o, const run_result& r, const zero::shard_plan& stage0) {
  json j;
  j["example"] = "02_zero_fashion_mnist";
  j["config"] = {{"stage", o.stage},
                 {"ranks", o.where.ranks},
                 {"backend", o.where.backend},
                 {"device", o.where.device},
                 {"offload", o.offload},
                 {"precision", o.precision},
                 {"reduce_dtype", o.reduce_dtype.empty() ? o.precision : o.reduce_dtype},
                 {"epochs", o.epochs},
                 {"per_rank_batch", r.per_rank_batch},
                 {"accumulate", o.accumulate},
                 {"global_batch", r.global_batch},
                 {"optimizer", o.optimizer},
                 {"learning_rate", r.lr},
                 {"weight_decay", r.weight_decay},
                 {"momentum", o.optimizer == "sgd" ? o.momentum : 0.0},
                 {"clip_norm", o.clip_norm},
                 {"seed", o.seed},
                 {"widths", r.widths},
                 {"prefetch", o.prefetch},
                 {"max_inflight_reductions", o.max_inflight},
                 {"accumulate_unsharded", o.accumulate_unsharded},
                 {"alignment_bytes", o.alignment},
                 {"pinned", o.where.pin},
                 {"steps_per_epoch", r.steps_per_epoch}};
  j["plan"] = r.plan;
  j["stage0_plan_memory"] = to_json(stage0.memory());
  j["largest_unit_bytes"] = r.plan.is_null() ? 0 : [&] {
    std::uint64_t m = 0;
    for (const auto& u : r.plan["units"]) m = std::max(m, u["gather_bytes"].get<std::uint64_t>());
    return m;
  }();
  json ranks = json::array();
  for (std::size_t k = 0; k < r.memory.size(); ++k)
    ranks.push_back({{"rank", k},
                     {"measured", to_json(r.memory[k].measured)},
                     {"after_construction", to_json(r.memory[k].after_construction)},
                     {"scratch_growth_construction", r.memory[k].scratch_growth_construction},
                     {"scratch_growth_first_step", r.memory[k].scratch_growth_first_step},
                     {"allocated_peak", r.memory[k].allocated_peak},
                     {"allocated_now", r.memory[k].allocated_now}});
  j["memory"] = ranks;
  if (r.heap.available)
    j["heap_growth_per_rank"] = {{"construction", static_cast<double>(r.heap.construction) / o.where.ranks},
                                 {"first_step", static_cast<double>(r.heap.first_step) / o.where.ranks}};
  j["epochs"] = json::array();
  double seconds = 0;
  std::uint64_t steps = 0;
  for (const auto& m : r.epochs) {
    seconds += m.train_seconds;
    steps += m.steps;
    j["epochs"].push_back({{"epoch", m.epoch},
                           {"train_seconds", m.train_seconds},
                           {"steps", m.steps},
                           {"samples", m.samples},
                           {"samples_per_second", m.samples_per_second},
                           {"mean_step_seconds", m.mean_step_seconds},
                           {"median_step_seconds", m.median_step_seconds},
                           {"train_loss", m.train_loss},
                           {"test_accuracy", m.test_accuracy},
                           {"test_loss", m.test_loss},
                           {"eval_seconds", m.eval_seconds},
                           {"gradient_norm", m.gradient_norm},
                           {"clipped_steps", m.clipped_steps},
                           {"runtime_gather_seconds", m.gather_seconds},
                           {"runtime_reduce_seconds", m.reduce_seconds},
                           {"runtime_step_seconds", m.update_seconds},
                           {"gather_timing", gather_timing_json(m.gathers)}});
  }
  j["first_epoch"] = r.first_epoch;
  j["parameter_crc32"] = fmt::format("{:08x}", r.parameter_crc32);
  if (!r.replica_checks.empty()) j["replica_checks"] = r.replica_checks;
  j["final_evaluation"] = {{"test_accuracy", r.evaluation.accuracy}, {"test_loss", r.evaluation.loss}};
  if (!r.epochs.empty()) {
    j["final_test_accuracy"] = r.epochs.back().test_accuracy;
    j["final_train_loss"] = r.epochs.back().train_loss;
    j["train_seconds"] = seconds;
    j["mean_step_seconds"] = seconds / static_cast<double>(steps);
    j["median_step_seconds"] = median(r.step_seconds);
  }
  return j;
}

/// The report after training (rank 0): memory against this stage's and stage 0's plans (pure
/// functions of the options), the summary line (`t0`: when training began) and, with --json, the
/// file. Returns the exit status: 3 when the test accuracy is below --min-accuracy, else 0.
inline int report(const options& o, const run_result& r, clock_type::time_point t0) {
  mlp shape(r.widths, external_storage);
  zero::plan_request q = plan_request_of(o, shape, o.stage);
  q.world_size = o.where.ranks;
  const zero::shard_plan plan(q);
  q.stage = 0;
  q.offload = zero::offload::none;  // the reference's model states (offload::parameters is stage 3's)
  const zero::shard_plan stage0(q);
  print_memory(o, r, plan, stage0);
  print_summary(o, r, t0);
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << to_json(o, r, stage0).dump(2) << "\n";
    if (!f) throw error(errc::io_error, "cannot write " + o.json_path);
  }
  if (r.evaluation.accuracy >= o.min_accuracy) return 0;
  std::fprintf(stderr, "zero_fashion_mnist: test accuracy %.4f is below --min-accuracy %.4f\n", r.evaluation.accuracy,
               o.min_accuracy);
  return 3;
}

}  // namespace ringzero::examples::zero_example
