#pragma once
/// @file
/// Example 02's command line: the options, their checks (examples/common/command_line.hpp: a
/// refused value exits with CLI11's status 105 and names itself), and what the trainer derives
/// from them: the optimizer and the plan request of the MLP. One more option is one line in
/// `add_options` and one field in `options`.
#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "command_line.hpp"
#include "idx_dataset.hpp"
#include "mlp.hpp"
#include "replica_checks.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/sharded_model.hpp"
#include "run_ranks.hpp"

namespace ringzero::examples::zero_example {

/// Everything the command line sets.
struct options {
  rank_setup where;  // --backend, --device, --ranks, --pin
  int stage = 3;
  int epochs = 10;
  int batch_size = 256;  // per rank, per micro-step
  int accumulate = 1;
  bool accumulate_unsharded = false;  // --accumulate-unsharded: stages 2-3 reduce once per step
  double lr = -1.0;                   // <0 (not given): the optimizer's default
  std::string optimizer = "sgd";
  std::string offload = "none";       // --offload: none, optimizer or parameters (--device sim or cuda)
  std::string precision = "float32";  // --precision: float32 or bfloat16 (parameters and gradients)
  std::string reduce_dtype;           // --reduce-dtype: float32 or bfloat16 (empty: the parameters')
  double momentum = 0.9;
  double weight_decay = -1.0;  // <0 (not given): the optimizer's default
  double clip_norm = 0.0;
  std::uint64_t seed = 1;
  std::vector<int> hidden = {256, 128};
  std::vector<std::string> hidden_lists;  // --hidden as given: widths, or comma-separated lists of them
  bool deep = false;
  bool prefetch = true;
  int max_inflight = 2;
  std::uint64_t alignment = 16;
  std::size_t train_subset = 0;
  std::size_t test_subset = 0;
  std::string data_dir = default_fashion_mnist_dir();
  std::string json_path;
  std::string save_path;
  bool progress = true;
  double min_accuracy = 0.0;         // exit with status 3 when the run ends below it (for tests)
  std::string checkpoint_dir;        // --checkpoint: save there at the end of every epoch
  int keep_checkpoints = 0;          // --keep-checkpoints: keep only the newest N (0: all)
  std::string resume_dir;            // --resume: continue from the newest complete checkpoint there
  std::string init_from;             // --init-from: initial parameters from a safetensors file
  bool allow_nonfinite = false;      // --allow-nonfinite: --init-from accepts NaN and infinity
  bool ranks_given = false;          // --ranks was on the command line
  std::uint64_t check_replicas = 0;  // --check-replicas N: verify_replicas every N optimizer steps
};

/// The six-layer MLP of `--deep`.
inline const std::vector<int> deep_hidden = {512, 512, 256, 256, 128};

/// Registers every option of example 02 on `app`, writing into `o`.
inline void add_options(CLI::App& app, options& o) {
  app.add_option("--stage", o.stage,
                 "ZeRO stage: 0 (data parallel), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters)")
      ->check(whole_number())
      ->check(CLI::Range(0, 3));
  app.add_option(
         "--backend", o.where.backend,
         "local (ranks are threads of this process), mpi (one rank per process: run under mpirun -np N) or "
         "nccl (one rank per process and GPU, with --device cuda: under mpirun, or torchrun/srun with "
         "MASTER_ADDR/MASTER_PORT or RINGZERO_NCCL_ID_FILE); --ranks is then the number of processes or left out")
      ->check(CLI::IsMember({"local", "mpi", "nccl"}));
  app.add_option("--device", o.where.device,
                 "cpu (default: host memory), sim (the runtime's device path on the simulated device of CI: "
                 "compute, communication and offload streams as host threads, the MLP on the host), or cuda: the "
                 "runtime's device path on CUDA memory and streams (the MLP in cuBLAS; --ranks N share the GPUs on "
                 "the local backend, or --backend nccl). Without a CUDA device, or in a build without CUDA, cuda "
                 "fails at once with exit status 1 and says why")
      ->check(CLI::IsMember({"cpu", "sim", "cuda"}));
  app.add_option("--offload", o.offload,
                 "none (default); optimizer: master weights and optimizer states in (pinned) host memory, updated "
                 "on the CPU (ZeRO-Offload); parameters (--stage 3): the parameter and gradient shards there too, "
                 "each layer's shard copied to the device for its all_gather (FSDP2's CPUOffloadPolicy). Needs "
                 "--device sim or cuda (the device path: with --device cpu the state is in host memory already, "
                 "and the option is refused)")
      ->check(CLI::IsMember({"none", "optimizer", "parameters"}));
  app.add_option("--precision", o.precision,
                 "float32 (default) or bfloat16: the runtime keeps parameters and gradients in bfloat16 (half the "
                 "bytes gathered and reduced) and float32 master weights and optimizer states "
                 "(zero::precision::bfloat16_adam); each layer computes in float32 on a float32 copy of its "
                 "bfloat16 parameters, and its float32 gradients are rounded into the runtime's bfloat16 ones")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_option("--reduce-dtype", o.reduce_dtype,
                 "the element type gradients are kept, reduced and sharded in: float32 or bfloat16 (default: the "
                 "parameters' type, as FSDP2's reduce_dtype=None). --precision bfloat16 --reduce-dtype float32 is "
                 "FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): the layers' float32 "
                 "gradients go into float32 gradient memory unrounded, at twice the reduction's bytes")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_option("--ranks", o.where.ranks, "number of ranks (threads of the local backend)")
      ->check(whole_number())
      ->check(CLI::Range(1, 256))
      ->each([&o](const std::string&) { o.ranks_given = true; });
  app.add_option("--epochs", o.epochs, "epochs to train in all (with --resume: including those done; 0: evaluate only)")
      ->check(whole_number())
      ->check(CLI::Range(0, 100000));
  app.add_option("--batch-size", o.batch_size, "examples per rank per micro-step")
      ->check(whole_number())
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--accumulate", o.accumulate, "micro-steps per optimizer step (gradient accumulation)")
      ->check(whole_number())
      ->check(CLI::Range(1, 1 << 16));
  app.add_flag("--accumulate-unsharded", o.accumulate_unsharded,
               "stages 2-3: accumulate the micro-steps' gradients unsharded and reduce_scatter them once per step "
               "(full gradients in memory, as FSDP2's set_requires_gradient_sync(False))");
  app.add_option("--optimizer", o.optimizer, "sgd (momentum 0.9), adam, or adamw (weight decay 0.01)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", o.lr, "learning rate (default: 0.1 for sgd, 1e-3 for adam and adamw)")
      ->check(learning_rate_check());
  app.add_option("--momentum", o.momentum, "SGD momentum from 0 to 1 (default 0.9; 0: plain SGD, no optimizer state)")
      ->check(number_check({.low = 0, .high = 1, .float32 = true}, "a momentum from 0 to 1 that a float32 holds",
                           "MOMENTUM"));
  app.add_option("--weight-decay", o.weight_decay,
                 "weight decay (default: 0, or 0.01 for adamw; adamw needs lr x weight decay <= 1)")
      ->check(number_check(
          {.low = 0, .high = std::numeric_limits<float>::max(), .float32 = true},
          "a weight decay: a finite number >= 0 that a float32 holds (0 or 1.1754944e-38 to 3.4028235e+38)", "DECAY"));
  app.add_option("--clip-norm", o.clip_norm, "clip the global gradient norm to this value (0: no clipping)")
      ->check(number_check({.low = 0, .high = std::numeric_limits<double>::max()},
                           "a gradient norm: a finite number >= 0", "NORM"));
  add_check_replicas_option(app, o.check_replicas);
  app.add_option("--seed", o.seed, "seed of the initialisation and of the per-epoch permutations (0 to 2^64 - 1)")
      ->check(whole_number());
  app.add_option(
         "--hidden", o.hidden_lists,
         "hidden layer widths, each from 1 to 65536, separated by commas, e.g. 512,512,256,256,128 (default 256,128); "
         "one gather unit per layer")
      ->check(hidden_widths_check());
  app.add_flag("--deep", o.deep, "the six-layer MLP 784-512-512-256-256-128-10 (same as --hidden 512,512,256,256,128)");
  app.add_flag("--prefetch,!--no-prefetch", o.prefetch,
               "stage 3: gather the next unit while this one computes (default on)");
  app.add_option("--max-inflight-reductions", o.max_inflight,
                 "stages 2-3: gradient reductions in flight at once (default 2)")
      ->check(whole_number())
      ->check(CLI::Range(1, 64));
  app.add_option("--alignment", o.alignment,
                 "alignment of every parameter and shard boundary in bytes (a power of two)")
      ->check(whole_number());
  app.add_flag("--pin,!--no-pin", o.where.pin, "pin rank r's thread to core r (default on)");
  app.add_option("--train-subset", o.train_subset, "use only the first N training images (0: all 60000)")
      ->check(whole_number());
  app.add_option("--test-subset", o.test_subset, "use only the first N test images (0: all 10000)")
      ->check(whole_number());
  app.add_option("--data", o.data_dir, "directory with the Fashion-MNIST .gz files");
  app.add_option("--json", o.json_path, "write the metrics, the plan and the measured memory to this JSON file")
      ->check(output_file());
  app.add_option("--save-parameters", o.save_path,
                 "write the final parameters to this file: float32, native byte order, in registration order "
                 "(fc1.weight [784, h1] row-major, fc1.bias, fc2.weight, ...)")
      ->check(output_file());
  app.add_flag("--progress,!--no-progress", o.progress, "progress bar when stdout is a terminal (default on)");
  app.add_option("--min-accuracy", o.min_accuracy, "fail (exit status 3) if the final test accuracy (0 to 1) is lower")
      ->check(number_check({.low = 0, .high = 1}, "an accuracy from 0 to 1", "ACCURACY"));
  auto* checkpoint = app.add_option(
      "--checkpoint", o.checkpoint_dir,
      "save a checkpoint into this directory at the end of every epoch (DIR/step-N/, DIR/latest; docs/checkpoint.md)");
  add_keep_checkpoints(app, o.keep_checkpoints, checkpoint);
  auto* resume =
      app.add_option("--resume", o.resume_dir,
                     "continue from the newest complete checkpoint in this directory (any --ranks and --stage); "
                     "--epochs counts the epochs done");
  app.add_option("--init-from", o.init_from,
                 "initial parameters from a safetensors file (e.g. from ringzero-ckpt consolidate)")
      ->excludes(resume);
  app.add_flag("--allow-nonfinite", o.allow_nonfinite,
               "--init-from: load NaN and infinite values (refused by default: such a run trains to loss nan)");
}

/// The hidden widths of --hidden and --deep (after parsing).
inline void apply_widths(options& o) {
  if (!o.hidden_lists.empty()) o.hidden = hidden_widths(o.hidden_lists);
  if (o.deep) o.hidden = deep_hidden;
}

inline double default_lr(const std::string& optimizer) { return optimizer == "sgd" ? 0.1 : 1e-3; }
inline double default_weight_decay(const std::string& optimizer) { return optimizer == "adamw" ? 0.01 : 0.0; }

/// The optimizer of --optimizer, --lr, --weight-decay and --momentum. Only a negative (unset) --lr
/// or --weight-decay means the default: any other value, NaN included, is used and checked.
inline zero::optimizer_options optimizer_options_of(const options& o) {
  zero::optimizer_options opt;
  opt.kind = *zero::parse_optimizer(o.optimizer);
  opt.lr = o.lr < 0 ? default_lr(o.optimizer) : o.lr;
  opt.weight_decay = o.weight_decay < 0 ? default_weight_decay(o.optimizer) : o.weight_decay;
  if (opt.kind == zero::optimizer_kind::sgd) opt.momentum = o.momentum;
  return opt;
}

/// Throws errc::invalid_argument, naming the options and values, when they cannot run together:
/// an optimizer whose values clash (zero::optimizer_options::problem, e.g. AdamW's lr x weight
/// decay above 1, or Adam's lr / (1 - beta1) beyond float32), or
/// --offload optimizer or parameters on --device cpu (offload moves state from the device path's
/// memory to the host's: on the host runtime there is nothing to move), or --offload parameters
/// below --stage 3.
inline void check_options(const options& o) {
  const zero::optimizer_options opt = optimizer_options_of(o);
  if (const std::string problem = opt.problem(); !problem.empty()) {
    const std::string momentum =
        opt.kind == zero::optimizer_kind::sgd ? fmt::format(" --momentum {}", opt.momentum) : "";
    throw error(errc::invalid_argument, fmt::format("--optimizer {} --lr {} --weight-decay {}{}: {}", o.optimizer,
                                                    opt.lr, opt.weight_decay, momentum, problem));
  }
  if (o.reduce_dtype == "bfloat16" && o.precision != "bfloat16")
    throw error(errc::invalid_argument,
                "--reduce-dtype bfloat16 needs --precision bfloat16: float32 gradients of float32 parameters are "
                "reduced in float32");
  if (o.offload != "none" && o.where.device == "cpu")
    throw error(errc::invalid_argument,
                "--offload " + o.offload + " needs --device sim or --device cuda: it moves " +
                    (o.offload == "parameters" ? std::string("the parameters, gradients and optimizer state")
                                               : std::string("the optimizer's state")) +
                    " from the device path's memory to host memory, and with --device cpu that state is in host "
                    "memory already");
  if (o.offload == "parameters" && o.stage != 3)
    throw error(
        errc::invalid_argument,
        fmt::format("--offload parameters needs --stage 3 (got --stage {}): only stage 3 gathers each layer "
                    "from a shard, which can then live in host memory; --offload optimizer works at every stage",
                    o.stage));
}

/// Optimizer steps per epoch for a shard of `shard_rows` examples and `step_rows` per step;
/// throws errc::invalid_argument when not even one step fits.
inline std::uint64_t steps_per_epoch(std::size_t shard_rows, std::size_t step_rows) {
  if (shard_rows < step_rows)
    throw error(errc::invalid_argument,
                fmt::format("{} training examples per rank are fewer than one step of {}", shard_rows, step_rows));
  return shard_rows / step_rows;
}

/// The MLP's tensors as the planner sees them: one gather unit per layer ("fc1", "fc2", ...).
/// A weight is [in, out], the row-major layout the MLP computes with (nn.Linear's weight
/// transposed); a bias is [out].
inline std::vector<zero::parameter_spec> parameter_specs(const mlp& net) {
  std::vector<zero::parameter_spec> specs;
  for (std::size_t i = 0; i < net.tensor_count(); ++i) {
    const tensor_info& t = net.tensor(i);
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

/// The plan request of the MLP `net` at `stage` with the options' alignment, accumulation,
/// prefetch, reductions in flight, optimizer states and offload.
inline zero::plan_request plan_request_of(const options& o, const mlp& net, int stage) {
  zero::plan_request q;
  q.parameters = parameter_specs(net);
  q.stage = stage;
  q.alignment_bytes = o.alignment;
  q.accumulation_steps = o.accumulate;
  q.accumulate_unsharded = o.accumulate_unsharded;
  q.prefetch = o.prefetch;
  q.max_inflight_reductions = o.max_inflight;
  q.precision = o.precision == "bfloat16" ? zero::precision::bfloat16_adam() : zero::precision::float32_adam();
  if (o.reduce_dtype == "float32") q.precision.gradient = dtype::float32;  // FSDP2's reduce_dtype
  q.precision.optimizer_states = optimizer_options_of(o).state_count();
  q.offload = *zero::parse_offload(o.offload);
  return q;
}

/// The runtime's options: the optimizer and the gradient-norm clipping.
inline zero::sharded_model_options model_options_of(const options& o) {
  zero::sharded_model_options m;
  m.optimizer = optimizer_options_of(o);
  m.max_grad_norm = o.clip_norm;
  m.time_gathers = o.stage == 3;  // two event records per gather and wait: the epoch line's hidden share
  return m;
}

/// Runs `f`; turns std::bad_alloc (a bare "std::bad_alloc" says nothing of why) into an error
/// naming the MLP of layer widths `widths`, its size, and the `rows` examples its activations hold.
template <class F>
void naming_out_of_memory(const std::vector<int>& widths, int rows, F&& f) {
  try {
    f();
  } catch (const std::bad_alloc&) {
    std::uint64_t n = 0;
    for (std::size_t l = 0; l + 1 < widths.size(); ++l)
      n += (static_cast<std::uint64_t>(widths[l]) + 1) * static_cast<std::uint64_t>(widths[l + 1]);
    throw error(errc::invalid_argument,
                fmt::format("out of memory for the MLP {} ({} parameters, {:.2f} GiB per float32 copy, and the "
                            "activations of {} examples per layer): choose smaller --hidden widths",
                            fmt::join(widths, "-"), n, static_cast<double>(n) * 4.0 / (1u << 30), rows));
  }
}

}  // namespace ringzero::examples::zero_example
