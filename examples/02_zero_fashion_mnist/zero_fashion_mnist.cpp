// 02_zero_fashion_mnist: the Fashion-MNIST MLP of example 01 trained with ZeRO stages 0-3
// (`ringzero::zero::sharded_model`).
//
// What it demonstrates:
// - a trainer whose layers compute with Eigen on memory it does not own: the MLP
//   (examples/common/mlp.hpp, built with `external_storage`) reads its weights from the runtime's
//   parameter views and adds its gradients into the runtime's gradient views, rebinding them
//   around every layer through layer hooks;
// - one training loop for every stage, only the hooks' effect changes (Rajbhandari et al. 2020;
//   PyTorch FSDP's hooks):
//     stage 0  plain data parallelism: gradients all_reduced per layer, every rank updates all;
//     stage 1  optimizer states sharded: gradients reduce_scattered, each rank updates its shard,
//              then all_gathers the parameters;
//     stage 2  gradients sharded too: each layer's gradients live in a pooled bucket only until
//              its reduce_scatter, which starts as soon as the layer's backward is done;
//     stage 3  parameters sharded too: every layer is one gather unit, all_gathered before its
//              forward and again before its backward (the next unit prefetched), released after;
// - memory you can check: each rank prints its model-state memory by category as the runtime
//   allocated it (`memory_in_use()`), next to the planner's prediction (`plan().memory()`), and
//   the growth of the process heap (malloc's own statistics) while the runtime was built (model
//   states and the pooled communication buffers: the runtime allocates everything there) and
//   while the first step ran (nothing large);
// - `--hidden 512,512,256,256,128` (or `--deep`) makes a six-layer MLP: six gather units;
// - the measurements of example 01 (epoch time, samples/s, train loss, test accuracy) plus the
//   time per optimizer step and how much of it was spent inside the runtime's calls.
//
// Stages 1-3 compute exactly what stage 0 computes: on 2 ranks without accumulation or clipping
// every stage ends with bit-identical parameters (tests/examples/check_zero_fashion_mnist.py).
//
// How to run (from the build directory; Fashion-MNIST comes from Debian's
// dataset-fashion-mnist package in /usr/share/datasets/fashion-mnist):
//   examples/zero_fashion_mnist --stage 3 --ranks 2 --epochs 10
//   examples/zero_fashion_mnist --stage 3 --ranks 4 --deep --optimizer adamw --lr 1e-3
//   examples/zero_fashion_mnist --stage 2 --accumulate 4 --batch-size 64 --clip-norm 1 --json metrics.json
//   examples/zero_fashion_mnist --stage 1 --train-subset 2000 --epochs 1 --save-parameters final.f32
//   examples/zero_fashion_mnist --epochs 2 --checkpoint ckpt        (a checkpoint after every epoch)
//   examples/zero_fashion_mnist --epochs 4 --resume ckpt --ranks 4 --stage 1   (epochs 3 and 4)
// Checkpoints (include/ringzero/checkpoint/, docs/checkpoint.md): --resume restores parameters,
// optimizer states and step count, and the sampler continues at the next epoch (its order is a
// function of --seed and the epoch), so 2 + 2 epochs equal 4 bit for bit at the same --ranks and
// --stage; any other --ranks and --stage reshard on load. --init-from takes a safetensors file
// (ringzero-ckpt consolidate); --epochs 0 evaluates the initial (or restored) model.
// `--help` lists every option. bench/zero_fashion_mnist.sh compares the stages with DDP.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.hpp"
#include "distributed_sampler.hpp"
#include "evaluation.hpp"
#include "heap_usage.hpp"
#include "idx_dataset.hpp"
#include "launcher.hpp"
#include "mlp.hpp"
#include "progress_bar.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace rz = ringzero;
namespace ex = ringzero::examples;
namespace zero = ringzero::zero;
namespace ck = ringzero::checkpoint;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  int stage = 3;
  int ranks = 2;
  int epochs = 10;
  int batch_size = 256;  // per rank, per micro-step
  int accumulate = 1;
  double lr = -1.0;  // <0 (not given): the optimizer's default
  std::string optimizer = "sgd";
  double momentum = 0.9;
  double weight_decay = -1.0;  // <0 (not given): the optimizer's default
  double clip_norm = 0.0;
  std::uint64_t seed = 1;
  std::vector<int> hidden = {256, 128};
  std::vector<std::string>
      hidden_lists;  // --hidden as given: widths, or comma-separated lists of them (ex::hidden_widths_check)
  bool deep = false;
  bool prefetch = true;
  int max_inflight = 2;
  std::uint64_t alignment = 16;
  bool pin = true;
  std::size_t train_subset = 0;
  std::size_t test_subset = 0;
  std::string data_dir = ex::default_fashion_mnist_dir();
  std::string json_path;
  std::string save_path;
  bool progress = true;
  double min_accuracy = 0.0;   // exit with status 3 when the run ends below it (for tests)
  std::string checkpoint_dir;  // --checkpoint: save there at the end of every epoch
  std::string resume_dir;      // --resume: continue from the newest complete checkpoint there
  std::string init_from;       // --init-from: initial parameters from a safetensors file
};

/// The six-layer MLP of `--deep`.
const std::vector<int> deep_hidden = {512, 512, 256, 256, 128};

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
  double gather_seconds = 0;  // pre_forward / pre_backward / post_forward (stage 3: gathers and waits)
  double reduce_seconds = 0;  // gradient views, post_backward, end_backward (reductions and waits)
  double update_seconds = 0;  // step(): norm, clipping, optimizer, parameter all_gather (stages 1-2)
};

/// What one rank measured of its memory.
struct rank_memory {
  zero::memory_breakdown after_construction;      // memory_in_use() right after the constructor
  zero::memory_breakdown measured;                // memory_in_use() after training (pools at their peak)
  std::uint64_t scratch_growth_construction = 0;  // the communicator's scratch grown meanwhile
  std::uint64_t scratch_growth_first_step = 0;
};

/// Heap growth over all ranks (malloc statistics), when the C library reports it.
struct heap_growth {
  bool available = false;
  std::int64_t construction = 0;  // bytes, all ranks, communicator scratch excluded
  std::int64_t first_step = 0;
};

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
  json plan;  // the plan's summary (units, memory, traffic)
  double final_gradient_norm = 0;
  int first_epoch = 0;               // epochs done before this run (--resume)
  ex::evaluation_result evaluation;  // of the final model (also when no epoch was trained)
};

double default_lr(const std::string& optimizer) { return optimizer == "sgd" ? 0.1 : 1e-3; }
double default_weight_decay(const std::string& optimizer) { return optimizer == "adamw" ? 0.01 : 0.0; }

/// The optimizer of --optimizer, --lr, --weight-decay and --momentum. Only a negative (unset) --lr
/// or --weight-decay means the default: any other value, NaN included, is used and checked.
zero::optimizer_options optimizer_options_of(const options& o) {
  zero::optimizer_options opt;
  opt.kind = *zero::parse_optimizer(o.optimizer);
  opt.lr = o.lr < 0 ? default_lr(o.optimizer) : o.lr;
  opt.weight_decay = o.weight_decay < 0 ? default_weight_decay(o.optimizer) : o.weight_decay;
  if (opt.kind == zero::optimizer_kind::sgd) opt.momentum = o.momentum;
  return opt;
}

/// Throws errc::invalid_argument, naming the options and values, when the optimizer they make
/// cannot run (zero::optimizer_options::problem: values each option's check accepts may still
/// clash, e.g. AdamW's lr x weight decay above 1, or Adam's lr / (1 - beta1) beyond float32).
void check_optimizer_options(const options& o) {
  const zero::optimizer_options opt = optimizer_options_of(o);
  const std::string problem = opt.problem();
  if (problem.empty()) return;
  const std::string momentum = opt.kind == zero::optimizer_kind::sgd ? fmt::format(" --momentum {}", opt.momentum) : "";
  throw rz::error(rz::errc::invalid_argument, fmt::format("--optimizer {} --lr {} --weight-decay {}{}: {}", o.optimizer,
                                                          opt.lr, opt.weight_decay, momentum, problem));
}

/// Weights and biases of an MLP with layer widths `widths`.
std::uint64_t parameter_count(const std::vector<int>& widths) {
  std::uint64_t n = 0;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l)
    n += (static_cast<std::uint64_t>(widths[l]) + 1) * static_cast<std::uint64_t>(widths[l + 1]);
  return n;
}

/// Runs `f`; turns std::bad_alloc (a bare "std::bad_alloc" says nothing of why) into an error
/// naming the MLP of layer widths `widths`, its size, and the `rows` examples its activations hold.
template <class F>
void naming_out_of_memory(const std::vector<int>& widths, int rows, F&& f) {
  try {
    f();
  } catch (const std::bad_alloc&) {
    const std::uint64_t n = parameter_count(widths);
    throw rz::error(
        rz::errc::invalid_argument,
        fmt::format("out of memory for the MLP {} ({} parameters, {:.2f} GiB per float32 copy, and the activations "
                    "of {} examples per layer): choose smaller --hidden widths",
                    fmt::join(widths, "-"), n, static_cast<double>(n) * 4.0 / (1u << 30), rows));
  }
}

/// The MLP's tensors as the planner sees them: one gather unit per layer ("fc1", "fc2", ...).
/// A weight is [in, out], the row-major layout the MLP computes with (nn.Linear's weight
/// transposed); a bias is [out].
std::vector<zero::parameter_spec> parameter_specs(const ex::mlp& net) {
  std::vector<zero::parameter_spec> specs;
  for (std::size_t i = 0; i < net.tensor_count(); ++i) {
    const ex::tensor_info& t = net.tensor(i);
    zero::parameter_spec p;
    p.name = t.name;
    if (t.rows == 1)
      p.shape = {static_cast<std::uint64_t>(t.cols)};
    else
      p.shape = {static_cast<std::uint64_t>(t.rows), static_cast<std::uint64_t>(t.cols)};
    p.unit = "fc" + std::to_string(i / 2 + 1);
    specs.push_back(std::move(p));
  }
  return specs;
}

zero::plan_request plan_request_of(const options& o, const ex::mlp& net, int stage) {
  zero::plan_request q;
  q.parameters = parameter_specs(net);
  q.stage = stage;
  q.alignment_bytes = o.alignment;
  q.accumulation_steps = o.accumulate;
  q.prefetch = o.prefetch;
  q.max_inflight_reductions = o.max_inflight;
  q.precision = zero::precision::float32_adam();
  q.precision.optimizer_states = optimizer_options_of(o).state_count();
  return q;
}

json to_json(const zero::memory_breakdown& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"master_weights", m.master_weights},
          {"optimizer_states", m.optimizer_states},
          {"model_states", m.model_states()},
          {"communication_buffers", m.communication_buffers},
          {"total", m.total()}};
}

json plan_summary(const zero::shard_plan& plan) {
  json units = json::array();
  for (const auto& u : plan.units())
    units.push_back({{"name", u.name}, {"gather_bytes", u.gather_bytes}, {"gradient_bytes", u.gradient_bytes}});
  json traffic = json::array();
  for (const auto& t : plan.traffic())
    traffic.push_back({{"collective", std::string(rz::collective_name(t.collective))},
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
          {"gather_buffers", c.gather_buffers},
          {"gather_buffer_bytes", c.gather_buffer_bytes},
          {"gradient_buckets", c.gradient_buckets},
          {"gradient_bucket_bytes", c.gradient_bucket_bytes},
          {"traffic", traffic}};
}

/// The largest gathered unit in bytes (what stage 3 adds to a rank's shard while a layer runs).
std::uint64_t largest_unit_bytes(const zero::shard_plan& plan) {
  std::uint64_t m = 0;
  for (const auto& u : plan.units()) m = std::max(m, u.gather_bytes);
  return m;
}

/// The layer hooks of the MLP: they call the runtime's hooks around each layer and bind the
/// layer's tensors to the runtime's views (at stage 3 a parameter view is valid only while its
/// unit is gathered; at stages 2-3 a gradient view lives in a bucket taken for this micro-batch).
/// Rank 0 also times the runtime's calls.
class zero_layer_hooks {
 public:
  zero_layer_hooks(zero::sharded_model& model, ex::mlp& net, epoch_metrics* timing)
      : model_(model), net_(net), timing_(timing) {}

  /// Runs `f` and adds its duration to `field` of the timing record (rank 0 only).
  template <class F>
  decltype(auto) timed(double epoch_metrics::*field, F&& f) {
    if (timing_ == nullptr) return f();
    struct add_on_exit {
      double* target;
      clock_type::time_point start = clock_type::now();
      ~add_on_exit() { *target += std::chrono::duration<double>(clock_type::now() - start).count(); }
    } guard{&(timing_->*field)};
    return f();
  }

  void before_forward(int l) {
    timed(&epoch_metrics::gather_seconds, [&] { model_.pre_forward(unit(l)); });
    bind_parameters(l);
  }
  void after_forward(int l) {
    timed(&epoch_metrics::gather_seconds, [&] { model_.post_forward(unit(l)); });
  }
  void before_backward(int l) {
    timed(&epoch_metrics::gather_seconds, [&] { model_.pre_backward(unit(l)); });
    bind_parameters(l);
    timed(&epoch_metrics::reduce_seconds, [&] {
      for (std::size_t i : {weight(l), weight(l) + 1}) net_.bind_gradient(i, model_.gradient<float>(i).data());
    });
  }
  void after_backward(int l) {
    timed(&epoch_metrics::reduce_seconds, [&] { model_.post_backward(unit(l)); });
  }

 private:
  static std::size_t unit(int l) { return static_cast<std::size_t>(l); }
  static std::size_t weight(int l) { return static_cast<std::size_t>(2 * l); }
  void bind_parameters(int l) {
    for (std::size_t i : {weight(l), weight(l) + 1}) net_.bind_parameter(i, model_.parameter<float>(i).data());
  }

  zero::sharded_model& model_;
  ex::mlp& net_;
  epoch_metrics* timing_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}

/// The training progress a checkpoint of this example records after `epochs` epochs: the sampler's
/// position (whole epochs) and the seed its order derives from, the run's settings as metadata.
ck::training_progress progress_after(const options& o, int epochs, int global_batch) {
  ck::training_progress p;
  p.epoch = static_cast<std::uint64_t>(epochs);
  p.rng_seeds = {o.seed};
  p.metadata = {
      {"example", "02_zero_fashion_mnist"}, {"global_batch", std::to_string(global_batch)}, {"optimizer", o.optimizer}};
  return p;
}

/// --resume (parameters, optimizer states, step count; resharded to this --ranks and --stage) or
/// --init-from (parameters only) into `model`, a collective; returns the epochs already done.
int restore(const options& o, zero::sharded_model& model, int global_batch, bool lead) {
  if (!o.init_from.empty()) {
    ck::load_pretrained(model, o.init_from);
    if (lead) fmt::print("  initialised from {}\n", o.init_from);
    return 0;
  }
  if (o.resume_dir.empty()) return 0;
  const ck::training_progress p = ck::load(model, o.resume_dir);
  if (p.step_in_epoch != 0)
    throw rz::error(rz::errc::invalid_argument,
                    fmt::format("--resume {}: the checkpoint was saved in the middle of epoch {} (this "
                                "example resumes at epoch boundaries)",
                                o.resume_dir, p.epoch + 1));
  if (lead) {
    fmt::print("  resumed from {} after epoch {} ({} optimizer steps)\n", ck::resolve_checkpoint(o.resume_dir).string(),
               p.epoch, p.optimizer_steps);
    if (p.rng_seeds != std::vector<std::uint64_t>{o.seed})
      fmt::print("  note: the checkpoint was trained with --seed {}; the data order continues with --seed {}\n",
                 p.rng_seeds.empty() ? std::string("?") : std::to_string(p.rng_seeds.front()), o.seed);
    const auto gb = p.metadata.find("global_batch");
    if (gb != p.metadata.end() && gb->second != std::to_string(global_batch))
      fmt::print("  note: the checkpoint was trained with a global batch of {}, this run uses {}\n", gb->second,
                 global_batch);
  }
  return static_cast<int>(std::min<std::uint64_t>(p.epoch, static_cast<std::uint64_t>(o.epochs)));
}

/// Trains on `o.ranks` ranks; returns rank 0's metrics and every rank's memory.
run_result train(const options& o, const ex::fashion_mnist& data) {
  run_result result;
  result.per_rank_batch = o.batch_size;
  result.global_batch = o.batch_size * o.ranks * o.accumulate;
  const zero::optimizer_options optimizer = optimizer_options_of(o);
  result.lr = optimizer.lr;
  result.weight_decay = optimizer.weight_decay;
  result.widths = {static_cast<int>(data.train.features)};
  result.widths.insert(result.widths.end(), o.hidden.begin(), o.hidden.end());
  result.widths.push_back(data.train.classes);
  result.memory.resize(static_cast<std::size_t>(o.ranks));
  std::vector<std::uint64_t> heap_marks(4, 0);

  rz::local::launch_options launch_opt;
  launch_opt.pin_threads = o.pin;
  const int eval_chunk = 1000;  // test examples per forward pass
  auto rank_main = [&](rz::communicator& comm) {
    Eigen::setNbThreads(1);  // one compute thread per rank
    const bool lead = comm.rank() == 0;
    rank_memory& memory = result.memory[static_cast<std::size_t>(comm.rank())];
    ex::mlp net(result.widths, ex::external_storage);  // no storage: it computes on the runtime's views
    net.reserve(std::max(o.batch_size, eval_chunk));
    std::vector<float> x(static_cast<std::size_t>(std::max(o.batch_size, eval_chunk)) * data.train.features);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(std::max(o.batch_size, eval_chunk)));
    ex::distributed_sampler sampler(data.train.count, comm.world_size(), comm.rank(), o.seed);
    const std::size_t step_rows = static_cast<std::size_t>(o.batch_size) * static_cast<std::size_t>(o.accumulate);
    const std::uint64_t steps = sampler.shard_size() / step_rows;
    if (steps == 0)
      throw rz::error(
          rz::errc::invalid_argument,
          fmt::format("{} training examples per rank are fewer than one step of {}", sampler.shard_size(), step_rows));

    // Heap readings between barriers: rank 0 reads while every other rank waits. A warm-up
    // collective first, so that nothing the communicator allocates once lands in a window.
    double warm = 0;
    rz::all_reduce(comm, &warm, &warm, 1, rz::dtype::float64, rz::reduce_kind::sum);
    auto heap_mark = [&](std::size_t k) {
      rz::barrier(comm);
      if (lead) heap_marks[k] = ex::heap_bytes_in_use().value_or(0);
      rz::barrier(comm);
    };

    heap_mark(0);
    std::size_t scratch0 = comm.scratch_bytes();
    zero::sharded_model_options model_options;
    model_options.optimizer = optimizer;
    model_options.max_grad_norm = o.clip_norm;
    zero::sharded_model model(comm, plan_request_of(o, net, o.stage), model_options);  // a collective
    memory.scratch_growth_construction = comm.scratch_bytes() - scratch0;
    heap_mark(1);
    memory.after_construction = model.memory_in_use();

    {  // the same initial values on every rank: example 01's rank-0 initialisation
      const std::vector<float> initial = net.initial_parameters(o.seed);
      for (std::size_t i = 0; i < net.tensor_count(); ++i) {
        const ex::tensor_info& t = net.tensor(i);
        model.set_parameter(i, std::span<const float>(initial.data() + t.offset, t.count));
      }
    }
    const int first_epoch = restore(o, model, result.global_batch, lead);
    std::optional<ck::checkpointer> saver;
    if (!o.checkpoint_dir.empty()) saver.emplace(o.checkpoint_dir);

    if (lead) {
      result.steps_per_epoch = steps;
      result.plan = plan_summary(model.plan());
      std::string units;
      for (const auto& u : model.plan().units())
        units += fmt::format("{}{} {:.1f} KiB", units.empty() ? "" : ", ", u.name,
                             static_cast<double>(u.gather_bytes) / 1024.0);
      fmt::print(
          "  stage {}, {} rank(s) x {} per rank x {} micro-step(s) = global batch {}; {} steps/epoch; {} lr {:g} "
          "weight decay {:g}{}\n  model {}: {} parameters in {} gather units ({})\n",
          o.stage, o.ranks, o.batch_size, o.accumulate, result.global_batch, steps, o.optimizer, result.lr,
          result.weight_decay, o.clip_norm > 0 ? fmt::format("; gradient norm clipped to {:g}", o.clip_norm) : "",
          fmt::format("{}", fmt::join(result.widths, "-")), model.plan().parameter_elements(), model.unit_count(),
          units);
      std::fflush(stdout);
    }

    ex::progress_bar bar(lead && o.progress);
    const float grad_scale = 1.0f / static_cast<float>(o.batch_size * o.accumulate);
    bool first_step = true;
    if (lead) result.first_epoch = first_epoch;
    if (first_epoch == o.epochs) {  // nothing to train (--epochs 0, or --resume at --epochs): evaluate only
      zero_layer_hooks eval_hooks(model, net, nullptr);
      const ex::evaluation_result ev = ex::evaluate(comm, net, data.test, x.data(), y.data(), eval_chunk, eval_hooks);
      if (lead) {
        result.evaluation = ev;
        fmt::print("  no epoch to train ({} of {} done): test loss {:.4f}  test acc {:.4f}\n", first_epoch, o.epochs,
                   ev.loss, ev.accuracy);
      }
    }
    for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
      epoch_metrics m;
      zero_layer_hooks hooks(model, net, lead ? &m : nullptr);
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      const auto shard = sampler.indices();
      double loss_sum = 0;
      std::vector<double> step_times;
      step_times.reserve(steps);
      rz::barrier(comm);
      const auto t0 = clock_type::now();
      for (std::uint64_t s = 0; s < steps; ++s) {
        std::size_t scratch1 = 0;
        if (first_step) {
          heap_mark(2);
          scratch1 = comm.scratch_bytes();
        }
        const auto s0 = clock_type::now();
        for (int micro = 0; micro < o.accumulate; ++micro) {
          const std::size_t first = static_cast<std::size_t>(s) * step_rows +
                                    static_cast<std::size_t>(micro) * static_cast<std::size_t>(o.batch_size);
          data.train.gather(shard.subspan(first, static_cast<std::size_t>(o.batch_size)), x.data(), y.data());
          loss_sum += net.forward(x.data(), y.data(), o.batch_size, hooks);
          // The runtime's gradients are summed into: always accumulate.
          net.backward(
              x.data(), y.data(), o.batch_size, grad_scale, true, [](std::size_t) {}, hooks);
          hooks.timed(&epoch_metrics::reduce_seconds, [&] { model.end_backward(); });
        }
        const zero::step_result r = hooks.timed(&epoch_metrics::update_seconds, [&] { return model.step(); });
        step_times.push_back(std::chrono::duration<double>(clock_type::now() - s0).count());
        if (r.clip_coefficient < 1) ++m.clipped_steps;
        m.gradient_norm = r.gradient_norm;
        if (first_step) {
          memory.scratch_growth_first_step = comm.scratch_bytes() - scratch1;
          heap_mark(3);
          first_step = false;
        }
        if (bar.enabled())
          bar.update(fmt::format("epoch {:>2}/{}", epoch + 1, o.epochs), s + 1, steps,
                     fmt::format("loss {:.4f}",
                                 loss_sum / static_cast<double>((s + 1) * static_cast<std::uint64_t>(o.accumulate))));
      }
      rz::barrier(comm);
      const auto t1 = clock_type::now();
      bar.clear();
      double sums[2] = {loss_sum, static_cast<double>(steps * static_cast<std::uint64_t>(o.accumulate))};
      rz::all_reduce(comm, sums, sums, 2, rz::dtype::float64, rz::reduce_kind::sum);
      const auto e0 = clock_type::now();
      zero_layer_hooks eval_hooks(model, net, nullptr);
      const ex::evaluation_result ev = ex::evaluate(comm, net, data.test, x.data(), y.data(), eval_chunk, eval_hooks);
      const auto e1 = clock_type::now();
      if (saver) saver->save(model, progress_after(o, epoch + 1, result.global_batch));  // a collective, between steps
      if (!lead) continue;
      result.evaluation = ev;
      m.epoch = epoch + 1;
      m.train_seconds = std::chrono::duration<double>(t1 - t0).count();
      m.steps = steps;
      m.samples = steps * static_cast<std::uint64_t>(result.global_batch);
      m.samples_per_second = static_cast<double>(m.samples) / m.train_seconds;
      m.mean_step_seconds = m.train_seconds / static_cast<double>(steps);
      m.median_step_seconds = median(step_times);
      m.train_loss = sums[0] / sums[1];
      m.test_accuracy = ev.accuracy;
      m.test_loss = ev.loss;
      m.eval_seconds = std::chrono::duration<double>(e1 - e0).count();
      fmt::print(
          "  epoch {:>2}/{}  {:6.2f} s  {:8.0f} samples/s  {:6.2f} ms/step  train loss {:.4f}  test acc {:.4f}  "
          "in the runtime: gather {:.3f} s, reduce {:.3f} s, step {:.3f} s\n",
          m.epoch, o.epochs, m.train_seconds, m.samples_per_second, 1e3 * m.mean_step_seconds, m.train_loss,
          m.test_accuracy, m.gather_seconds, m.reduce_seconds, m.update_seconds);
      std::fflush(stdout);
      result.epochs.push_back(m);
      result.step_seconds.insert(result.step_seconds.end(), step_times.begin(), step_times.end());
    }
    memory.measured = model.memory_in_use();

    // The final parameters, for comparisons between stages (at stage 3 reading is a collective).
    if (!o.save_path.empty()) {
      std::vector<float> all(net.parameter_elements());
      for (std::size_t i = 0; i < net.tensor_count(); ++i) {
        const ex::tensor_info& t = net.tensor(i);
        model.read_parameter(i, std::span<float>(all.data() + t.offset, t.count));
      }
      if (lead) {
        std::ofstream f(o.save_path, std::ios::binary);
        f.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
        if (!f) throw rz::error(rz::errc::io_error, "cannot write " + o.save_path);
      }
    }
  };
  const int activation_rows = std::max(o.batch_size, eval_chunk);
  rz::local::launch(
      o.ranks,
      [&](rz::communicator& comm) { naming_out_of_memory(result.widths, activation_rows, [&] { rank_main(comm); }); },
      launch_opt);

  if (ex::heap_bytes_in_use().has_value()) {
    std::int64_t scratch_construction = 0, scratch_first = 0;
    for (const auto& m : result.memory) {
      scratch_construction += static_cast<std::int64_t>(m.scratch_growth_construction);
      scratch_first += static_cast<std::int64_t>(m.scratch_growth_first_step);
    }
    result.heap.available = true;
    result.heap.construction =
        static_cast<std::int64_t>(heap_marks[1]) - static_cast<std::int64_t>(heap_marks[0]) - scratch_construction;
    result.heap.first_step =
        static_cast<std::int64_t>(heap_marks[3]) - static_cast<std::int64_t>(heap_marks[2]) - scratch_first;
  }
  return result;
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  double v = b;
  while (std::fabs(v) >= 1024.0 && k < 4) {
    v /= 1024.0;
    ++k;
  }
  return k == 0 ? fmt::format("{:.0f} B", v) : fmt::format("{:.2f} {}", v, units[k]);
}

std::string relative_text(double measured, double planned) {
  if (planned == 0) return measured == 0 ? "equal" : "(planned 0)";
  if (measured == planned) return "equal";
  return fmt::format("{:+.2f}%", 100.0 * (measured - planned) / planned);
}

/// Prints each rank's memory next to the plan, and the heap growth.
void print_memory(const options& o, const run_result& r, const zero::shard_plan& plan, const zero::shard_plan& stage0) {
  const zero::memory_breakdown& p = plan.memory();
  fmt::print(
      "\nModel-state memory per rank: measured = what the runtime allocated (sharded_model::memory_in_use(), after "
      "training,\npools at their peak), planned = shard_plan::memory()\n");
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
  }
  const auto& c = plan.communication();
  if (c.bytes() > 0)
    fmt::print("  communication buffers planned: {} gather buffer(s) of {} and {} gradient bucket(s) of {}\n",
               c.gather_buffers, bytes_text(static_cast<double>(c.gather_buffer_bytes)), c.gradient_buckets,
               bytes_text(static_cast<double>(c.gradient_bucket_bytes)));
  if (r.heap.available) {
    const double n = static_cast<double>(o.ranks);
    const double construction = static_cast<double>(r.heap.construction) / n,
                 first = static_cast<double>(r.heap.first_step) / n;
    const double built = static_cast<double>(p.model_states() + p.communication_buffers);
    fmt::print(
        "  heap growth per rank (malloc statistics of the process / {} ranks, communicator scratch excluded):\n"
        "    while the runtime was built: {} (planned model states {} + communication buffers {}: {})\n"
        "    during the first step:       {} (nothing large is allocated there)\n",
        o.ranks, bytes_text(construction), bytes_text(static_cast<double>(p.model_states())),
        bytes_text(static_cast<double>(p.communication_buffers)), relative_text(construction, built),
        bytes_text(first));
  }
  if (o.stage > 0) {
    const double s0 = static_cast<double>(stage0.memory().model_states());
    const double bound = s0 / o.ranks + static_cast<double>(largest_unit_bytes(plan));
    const double mine = static_cast<double>(r.memory[0].measured.model_states());
    fmt::print(
        "  against stage 0 (planned {} of model states per rank): this stage holds {:.1f}% of it; 1/{} of it plus the "
        "largest gather unit is {}\n",
        bytes_text(s0), 100.0 * mine / s0, o.ranks, bytes_text(bound));
  }
}

json to_json(const options& o, const run_result& r, const zero::shard_plan& stage0) {
  json j;
  j["example"] = "02_zero_fashion_mnist";
  j["config"] = {{"stage", o.stage},
                 {"ranks", o.ranks},
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
                 {"alignment_bytes", o.alignment},
                 {"pinned", o.pin},
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
                     {"scratch_growth_first_step", r.memory[k].scratch_growth_first_step}});
  j["memory"] = ranks;
  if (r.heap.available)
    j["heap_growth_per_rank"] = {{"construction", static_cast<double>(r.heap.construction) / o.ranks},
                                 {"first_step", static_cast<double>(r.heap.first_step) / o.ranks}};
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
                           {"runtime_step_seconds", m.update_seconds}});
  }
  j["first_epoch"] = r.first_epoch;
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

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"ZeRO stage 0-3 training of an MLP on Fashion-MNIST with ringzero's sharded runtime"};
  // Integers in decimal digits only and reals that are finite and in range (examples/common/
  // command_line.hpp), as example 01: a refused value exits with status 105 and names itself.
  app.add_option("--stage", o.stage,
                 "ZeRO stage: 0 (data parallel), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters)")
      ->check(ex::whole_number())
      ->check(CLI::Range(0, 3));
  app.add_option("--ranks", o.ranks, "number of ranks (threads of the local backend)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 256));
  app.add_option("--epochs", o.epochs, "epochs to train in all (with --resume: including those done; 0: evaluate only)")
      ->check(ex::whole_number())
      ->check(CLI::Range(0, 100000));
  app.add_option("--batch-size", o.batch_size, "examples per rank per micro-step")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--accumulate", o.accumulate, "micro-steps per optimizer step (gradient accumulation)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--optimizer", o.optimizer, "sgd (momentum 0.9), adam, or adamw (weight decay 0.01)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", o.lr, "learning rate (default: 0.1 for sgd, 1e-3 for adam and adamw)")
      ->check(ex::learning_rate_check());
  app.add_option("--momentum", o.momentum, "SGD momentum from 0 to 1 (default 0.9; 0: plain SGD, no optimizer state)")
      ->check(ex::number_check({.low = 0, .high = 1, .float32 = true}, "a momentum from 0 to 1 that a float32 holds",
                               "MOMENTUM"));
  app.add_option("--weight-decay", o.weight_decay,
                 "weight decay (default: 0, or 0.01 for adamw; adamw needs lr x weight decay <= 1)")
      ->check(ex::number_check(
          {.low = 0, .high = std::numeric_limits<float>::max(), .float32 = true},
          "a weight decay: a finite number >= 0 that a float32 holds (0 or 1.1754944e-38 to 3.4028235e+38)", "DECAY"));
  app.add_option("--clip-norm", o.clip_norm, "clip the global gradient norm to this value (0: no clipping)")
      ->check(ex::number_check({.low = 0, .high = std::numeric_limits<double>::max()},
                               "a gradient norm: a finite number >= 0", "NORM"));
  app.add_option("--seed", o.seed, "seed of the initialisation and of the per-epoch permutations (0 to 2^64 - 1)")
      ->check(ex::whole_number());
  app.add_option(
         "--hidden", o.hidden_lists,
         "hidden layer widths, each from 1 to 65536, separated by commas, e.g. 512,512,256,256,128 (default 256,128); "
         "one gather unit per layer")
      ->check(ex::hidden_widths_check());
  app.add_flag("--deep", o.deep, "the six-layer MLP 784-512-512-256-256-128-10 (same as --hidden 512,512,256,256,128)");
  app.add_flag("--prefetch,!--no-prefetch", o.prefetch,
               "stage 3: gather the next unit while this one computes (default on)");
  app.add_option("--max-inflight-reductions", o.max_inflight,
                 "stages 2-3: gradient reductions in flight at once (default 2)")
      ->check(ex::whole_number())
      ->check(CLI::Range(1, 64));
  app.add_option("--alignment", o.alignment,
                 "alignment of every parameter and shard boundary in bytes (a power of two)")
      ->check(ex::whole_number());
  app.add_flag("--pin,!--no-pin", o.pin, "pin rank r's thread to core r (default on)");
  app.add_option("--train-subset", o.train_subset, "use only the first N training images (0: all 60000)")
      ->check(ex::whole_number());
  app.add_option("--test-subset", o.test_subset, "use only the first N test images (0: all 10000)")
      ->check(ex::whole_number());
  app.add_option("--data", o.data_dir, "directory with the Fashion-MNIST .gz files");
  app.add_option("--json", o.json_path, "write the metrics, the plan and the measured memory to this JSON file");
  app.add_option("--save-parameters", o.save_path,
                 "write the final parameters to this file: float32, native byte order, in registration order "
                 "(fc1.weight [784, h1] row-major, fc1.bias, fc2.weight, ...)");
  app.add_flag("--progress,!--no-progress", o.progress, "progress bar when stdout is a terminal (default on)");
  app.add_option("--min-accuracy", o.min_accuracy, "fail (exit status 3) if the final test accuracy (0 to 1) is lower")
      ->check(ex::number_check({.low = 0, .high = 1}, "an accuracy from 0 to 1", "ACCURACY"));
  app.add_option(
      "--checkpoint", o.checkpoint_dir,
      "save a checkpoint into this directory at the end of every epoch (DIR/step-N/, DIR/latest; docs/checkpoint.md)");
  auto* resume =
      app.add_option("--resume", o.resume_dir,
                     "continue from the newest complete checkpoint in this directory (any --ranks and --stage); "
                     "--epochs counts the epochs done");
  app.add_option("--init-from", o.init_from,
                 "initial parameters from a safetensors file (e.g. from ringzero-ckpt consolidate)")
      ->excludes(resume);
  CLI11_PARSE(app, argc, argv);
  // Started by mpirun/srun/torchrun as one of several processes: this example runs its ranks as
  // threads of one process, so refuse rather than run one complete job per process.
  if (const std::string refusal = ex::launcher_refusal(ex::detect_launcher(), "zero_fashion_mnist", "");
      !refusal.empty()) {
    std::fprintf(stderr, "%s\n", refusal.c_str());
    return 2;
  }
  if (!o.hidden_lists.empty()) o.hidden = ex::hidden_widths(o.hidden_lists);
  if (o.deep) o.hidden = deep_hidden;

  try {
    check_optimizer_options(o);  // before the data: options that clash fail at once
    const ex::fashion_mnist data = ex::load_fashion_mnist(o.data_dir, o.train_subset, o.test_subset);
    const auto t0 = clock_type::now();
    const run_result r = train(o, data);

    // The plans of this stage and of stage 0 for the same model (pure functions; for the report).
    ex::mlp shape(r.widths, ex::external_storage);
    zero::plan_request q = plan_request_of(o, shape, o.stage);
    q.world_size = o.ranks;
    const zero::shard_plan plan(q);
    q.stage = 0;
    const zero::shard_plan stage0(q);
    print_memory(o, r, plan, stage0);

    double seconds = 0;
    std::uint64_t steps = 0;
    for (const auto& m : r.epochs) {
      seconds += m.train_seconds;
      steps += m.steps;
    }
    if (r.epochs.empty())
      fmt::print("\nstage {}, {} rank(s): no epoch trained; test accuracy {:.4f}, test loss {:.6f}\n", o.stage, o.ranks,
                 r.evaluation.accuracy, r.evaluation.loss);
    else
      fmt::print(
          "\nstage {}, {} rank(s), global batch {}: final test accuracy {:.4f}, train loss {:.6f}; {:.2f} ms per step "
          "(median {:.2f} ms); {:.1f} s of training ({:.1f} s in all)\n",
          o.stage, o.ranks, r.global_batch, r.epochs.back().test_accuracy, r.epochs.back().train_loss,
          1e3 * seconds / static_cast<double>(steps), 1e3 * median(r.step_seconds), seconds,
          std::chrono::duration<double>(clock_type::now() - t0).count());
    if (!o.json_path.empty()) {
      std::ofstream f(o.json_path);
      f << to_json(o, r, stage0).dump(2) << "\n";
      if (!f) throw rz::error(rz::errc::io_error, "cannot write " + o.json_path);
    }
    if (r.evaluation.accuracy < o.min_accuracy) {
      std::fprintf(stderr, "zero_fashion_mnist: test accuracy %.4f is below --min-accuracy %.4f\n",
                   r.evaluation.accuracy, o.min_accuracy);
      return 3;
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "zero_fashion_mnist: %s\n", rz::error_text(e).c_str());
    return 1;
  }
  return 0;
}
