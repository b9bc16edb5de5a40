// 04_libtorch_gpt: a small character-level GPT in libtorch, trained on the text of Debian's
// `fortunes` package with DDP through `ringzero::integration::torch_ddp` or ZeRO stages 1-3
// through `ringzero::integration::torch_zero`.
//
// What it demonstrates:
// - one flag switches the whole distribution strategy (--strategy ddp|zero1|zero2|zero3, as
//   Lightning's Trainer(strategy=...)): ddp is DDP as a PyTorch user writes it (the module's own
//   parameters, torch_ddp all_reducing the gradient buckets during backward, torch::optim::AdamW,
//   torch::nn::utils::clip_grad_norm_, torch_ddp's no_sync() for the micro-batches before the
//   last); zeroN is ZeRO stage N of ringzero's runtime (its own AdamW and clipping). On 2 ranks
//   the zero stages give the same bits; ddp agrees with them to float32 rounding (the two AdamWs
//   round differently). ZeRO-only options (quantization, resharding, --keep-frozen, ...) are
//   refused with ddp;
// - --wrap block|layer|model chooses the gather units (FSDP's wrapping policy): one per
//   transformer block plus the embeddings and the head, one per torch submodule, or one;
// - at stage 3 parameters exist only while their unit is gathered: torch's parameters are views
//   over the runtime's gather buffers, and each unit is gathered again into the same torch storage
//   before its backward, so the tensors autograd saved see valid data (docs/libtorch_gpt.md);
// - it prints the loss per step (against the corpus' unigram entropy), tokens/s, parameter
//   memory per rank against the plan (ddp: the reducer's gradient buckets), the bytes each rank
//   sent per step against the plan's collectives (ddp: the all_reduce of the buckets), and a few
//   lines of generated text.
// - --checkpoint DIR saves the state (parameters, AdamW's states, the step; ddp: also the
//   reducer's bucket layout) every --checkpoint-every steps and at the end; --resume DIR continues
//   from the newest checkpoint with the batches a straight run would draw, so 10 + 10 steps give
//   the losses of 20. The checkpoints name the tensors alike, so a ZeRO checkpoint resumes as ddp
//   and the reverse.
// - --quantize-weights / --quantize-gradients int8|int4 send stage 3's parameter all_gathers and
//   the gradient reduction as blocks of integers with a scale each (ZeRO++'s qwZ and qgZ,
//   zero/quantization.hpp); the run prints the bytes each rank sent per step, measured by the
//   communicator, beside the plan's figure with and without quantization.
// - --backend mpi runs one rank per process under mpirun; --link-gbps paces the MPI sends as a
//   slower network would (docs/mpi.md).
// - --lora R fine-tunes low-rank adapters of rank R with the backbone frozen (requires_grad
//   false); at stage 3 the frozen parameters are kept gathered (--keep-frozen, all by default),
//   so a step sends only the adapters' parameters and gradients; ddp reduces only the adapters'
//   gradients (torch_ddp skips frozen parameters).
//
// How to run (from the build directory; `apt-get install fortunes`):
//   examples/libtorch_gpt                                  (2 ranks, zero3, block wrap, ~2 minutes)
//   examples/libtorch_gpt --strategy ddp --ranks 2 --steps 100        (torch_ddp, torch::optim::AdamW)
//   examples/libtorch_gpt --strategy zero3 --wrap layer --bf16 --steps 50
//   examples/libtorch_gpt --steps 100 --checkpoint ckpt && examples/libtorch_gpt --steps 200 --resume ckpt
//   mpirun -np 4 examples/libtorch_gpt --backend mpi --link-gbps 1 --quantize-weights int8 --quantize-gradients int8
//   examples/libtorch_gpt --lora 8 --steps 100
// `--help` lists every option. Beside it: gpt_model.hpp (the model, its units run through any
// runner), gpt_strategies.hpp (the options and the strategies: zero_training, ddp_training).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.hpp"
#include "gather_timing_json.hpp"
#include "gpt_model.hpp"
#include "gpt_strategies.hpp"
#include "heap_usage.hpp"
#include "launcher.hpp"
#include "replica_checks.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/integration/torch_ddp.hpp"
#include "ringzero/integration/torch_zero.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/verify_replicas.hpp"
#include "run_ranks.hpp"

// rz, ex, ck and clock_type: gpt_strategies.hpp
using namespace gpt_example;  // options, result, the strategies (gpt_strategies.hpp)

namespace {

/// The corpus: every plain fortune file (names without a dot: not the .dat indexes or the .u8
/// links) of the directory, in name order, concatenated.
std::string load_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir))
    throw rz::error(rz::errc::io_error, "no fortune files in " + dir + " (Debian: apt-get install fortunes)");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().find('.') == std::string::npos) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (text.size() < 1000) throw rz::error(rz::errc::io_error, "the fortune files in " + dir + " hold too little text");
  return text;
}

struct corpus {
  std::string text;
  std::vector<std::int64_t> ids;     // text as vocabulary indices
  std::vector<unsigned char> vocab;  // index -> byte
  double unigram_entropy = 0;        // nats per character
};

corpus make_corpus(const std::string& dir) {
  corpus c;
  c.text = load_corpus(dir);
  std::vector<std::uint64_t> counts(256);
  for (unsigned char ch : c.text) ++counts[ch];
  std::vector<std::int64_t> index(256, -1);
  for (int b = 0; b < 256; ++b)
    if (counts[static_cast<std::size_t>(b)] > 0) {
      index[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(c.vocab.size());
      c.vocab.push_back(static_cast<unsigned char>(b));
      const double p = static_cast<double>(counts[static_cast<std::size_t>(b)]) / static_cast<double>(c.text.size());
      c.unigram_entropy -= p * std::log(p);
    }
  c.ids.reserve(c.text.size());
  for (unsigned char ch : c.text) c.ids.push_back(index[ch]);
  return c;
}

result train(const options& o, const corpus& c) {
  result res;
  std::mutex construct;
  ex::run_ranks(ex::rank_setup{o.backend, "cpu", o.ranks, o.pin, o.link_gbps}, [&](rz::communicator& comm) {
    const int rank = comm.rank();
    std::shared_ptr<gpt::model> net;
    {
      // The same initial values on every rank and in every run: one module at a time from one seed.
      std::lock_guard lock(construct);
      torch::manual_seed(o.seed);
      gpt::config cfg = o.model;
      cfg.vocab = static_cast<std::int64_t>(c.vocab.size());
      net = std::make_shared<gpt::model>(cfg);
      if (o.bf16) net->to(torch::kBFloat16);
    }
    std::unique_ptr<strategy_training> training;
    if (o.strategy == "ddp")
      training = std::make_unique<ddp_training>(comm, *net, o);
    else
      training = std::make_unique<zero_training>(comm, *net, o);
    int first_step = 0;
    if (!o.resume_dir.empty()) {  // a collective
      const ck::training_progress p = training->resume(o.resume_dir);
      if (p.rng_seeds != std::vector<std::uint64_t>{o.seed})
        throw rz::error(rz::errc::invalid_argument,
                        fmt::format("--resume {}: the checkpoint was trained with another --seed", o.resume_dir));
      // What the tensors' shapes do not show: the heads split the same matrices, the batch
      // size moves the data stream. (Checkpoints saved before these were recorded pass.)
      for (const auto& [key, now] : {std::pair<std::string, std::string>{"heads", std::to_string(o.model.heads)},
                                     std::pair<std::string, std::string>{"batch", std::to_string(o.batch)}})
        if (const auto it = p.metadata.find(key); it != p.metadata.end() && it->second != now)
          throw rz::error(rz::errc::invalid_argument,
                          fmt::format("--resume {}: the checkpoint was trained with --{} {}, this run has --{} {}",
                                      o.resume_dir, key, it->second, key, now));
      if (p.optimizer_steps > static_cast<std::uint64_t>(o.steps))
        throw rz::error(rz::errc::invalid_argument, fmt::format("--resume {}: the checkpoint is after step {}, past "
                                                                "--steps {}",
                                                                o.resume_dir, p.optimizer_steps, o.steps));
      first_step = static_cast<int>(p.optimizer_steps);
      if (rank == 0) fmt::print("resumed from {} after step {}\n", o.resume_dir, first_step);
    }
    std::optional<ck::checkpointer> saver;
    if (!o.checkpoint_dir.empty()) {
      saver.emplace(o.checkpoint_dir, ck::checkpointer_options{o.keep_checkpoints});
      training->open(*saver);  // before any training
    }
    auto save = [&](int steps_done) {
      ck::training_progress p;
      p.rng_seeds = {o.seed};
      p.metadata = {{"example", "04_libtorch_gpt"},
                    {"strategy", o.strategy},
                    {"wrap", o.wrap},
                    {"heads", std::to_string(o.model.heads)},
                    {"batch", std::to_string(o.batch)}};
      training->save(*saver, std::move(p), steps_done);
      if (rank == 0) fmt::print("saved {} after step {}\n", o.checkpoint_dir, steps_done);
    };

    const std::int64_t T = o.model.context, local_batch = o.batch / o.ranks;
    const auto V = static_cast<std::int64_t>(c.vocab.size());
    std::mt19937_64 rng(o.seed + 1);  // the same global batch on every rank and at every --ranks
    std::uniform_int_distribution<std::size_t> start(0, c.ids.size() - static_cast<std::size_t>(T) - 2);
    for (std::int64_t k = 0; k < first_step * o.batch; ++k) (void)start(rng);  // the batches already trained
    auto x = torch::empty({local_batch, T}, torch::kLong), y = torch::empty({local_batch, T}, torch::kLong);
    std::vector<double> losses, seconds;
    ex::replica_checks checks{o.check_replicas};  // DDP and stages 1-2: the replicated parameters
    const auto t_all = clock_type::now();
    const rz::traffic_counts traffic_before = comm.traffic();
    for (int step = first_step; step < o.steps; ++step) {
      for (std::int64_t s = 0; s < o.batch; ++s) {
        const std::size_t at = start(rng);
        if (s / local_batch != rank) continue;
        auto* xs = x[s % local_batch].data_ptr<std::int64_t>();
        auto* ys = y[s % local_batch].data_ptr<std::int64_t>();
        for (std::int64_t t = 0; t < T; ++t) {
          xs[t] = c.ids[at + static_cast<std::size_t>(t)];
          ys[t] = c.ids[at + static_cast<std::size_t>(t) + 1];
        }
      }
      const auto t0 = clock_type::now();
      // The rank's batch in --accumulation-steps micro-batches; each loss divided by their number,
      // so the accumulated gradient is the whole batch's.
      const std::int64_t micro = local_batch / o.accumulation;
      double l = 0;
      for (int m = 0; m < o.accumulation; ++m) {
        const torch::Tensor targets = y.narrow(0, m * micro, micro).reshape({-1});
        l += training->micro_batch(
            x.narrow(0, m * micro, micro),
            [&](const torch::Tensor& logits) {
              return torch::nn::functional::cross_entropy(logits.view({-1, V}).to(torch::kFloat32), targets) /
                     o.accumulation;
            },
            m + 1 == o.accumulation);
      }
      training->step();
      checks.after_step(static_cast<std::uint64_t>(step) + 1, [&] { return training->verify_replicas(); });
      seconds.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
      rz::all_reduce(comm, &l, &l, 1, rz::dtype::float64, rz::reduce_kind::avg);
      losses.push_back(l);
      if (rank == 0 && (step % o.print_every == 0 || step + 1 == o.steps)) {
        const double tps = static_cast<double>(o.batch * T) / seconds.back();
        fmt::print("step {:5d}  loss {:.6f}  ({:.3f} bits/char)  {:8.0f} tokens/s\n", step, l, l / std::log(2.0), tps);
        std::fflush(stdout);
      }
      if (saver && (step + 1 == o.steps || (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0)))
        save(step + 1);
    }
    if (saver && first_step == o.steps) save(o.steps);
    const double total = std::chrono::duration<double>(clock_type::now() - t_all).count();
    const double trained = std::max(1, o.steps - first_step);
    // The loss's all_reduce (8 bytes a step) and any checkpoint's or check's traffic included.
    const double sent_per_step = static_cast<double>((comm.traffic() - traffic_before).total().total_sent()) / trained;

    // Generated text: every rank runs the same forwards (stage 3 gathers are collectives).
    std::string sample;
    {
      torch::NoGradGuard no_grad;
      std::mt19937_64 g(o.seed + 2);
      std::vector<std::int64_t> ctx{c.ids[0]};
      for (int i = 0; i < o.generate; ++i) {
        const std::size_t n = std::min<std::size_t>(ctx.size(), static_cast<std::size_t>(T));
        auto in =
            torch::from_blob(ctx.data() + (ctx.size() - n), {1, static_cast<std::int64_t>(n)}, torch::kLong).clone();
        auto logits = training->forward(in).select(1, static_cast<std::int64_t>(n) - 1).to(torch::kFloat64);
        auto p = torch::softmax(logits / 0.8, -1).contiguous();
        const double* pp = p.data_ptr<double>();
        std::discrete_distribution<std::int64_t> pick(pp, pp + V);
        ctx.push_back(pick(g));
      }
      if (o.generate > 0)  // the prompt character and what followed it
        for (std::int64_t id : ctx) sample.push_back(static_cast<char>(c.vocab[static_cast<std::size_t>(id)]));
    }
    if (rank == 0) {
      res.losses = losses;
      res.step_seconds = seconds;
      training->report(res);
      res.sample = sample;
      res.tokens_per_second = static_cast<double>(o.batch * T) * (o.steps - first_step) / total;
      res.first_step = first_step;
      res.replica_checks = checks.summary();
      res.sent_per_step = sent_per_step;
    }
  });
  return res;
}

nlohmann::json parameters_json(const std::vector<rz::zero::parameter_spec>& ps) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : ps) {
    nlohmann::json j{{"name", p.name}, {"shape", p.shape}, {"unit", p.unit}};
    if (p.type) j["dtype"] = std::string(rz::dtype_name(*p.type));
    if (!p.tie_group.empty()) j["tie"] = p.tie_group;
    if (!p.trainable) j["trainable"] = false;
    list.push_back(j);
  }
  return list;
}

nlohmann::json memory_json(const rz::zero::memory_breakdown& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"master_weights", m.master_weights},
          {"optimizer_states", m.optimizer_states},
          {"communication_buffers", m.communication_buffers}};
}

}  // namespace

/// The memory lines of a ZeRO run: the runtime's allocations, by category, against its plan.
void print_zero_memory(const result& r) {
  const auto& m = r.asked;  // counted where allocated, by what asked (not the runtime's own sum)
  const auto& p = r.planned;
  const std::uint64_t measured_peak = m.parameters + m.communication_buffers;
  const std::uint64_t planned_peak = p.parameters + p.communication_buffers;
  fmt::print("parameter memory per rank (parameters + gather buffers and gradient buckets, allocated):\n");
  fmt::print("  measured {:>12} B  (parameters {}, communication buffers {})\n", measured_peak, m.parameters,
             m.communication_buffers);
  fmt::print("  plan     {:>12} B  (parameters {}, communication buffers {})  {}\n", planned_peak, p.parameters,
             p.communication_buffers, measured_peak <= planned_peak ? "within the plan" : "ABOVE THE PLAN");
  // The plan counts the model's state; the runtime also holds the step's scalars (gradient
  // norm, clip and skip decisions: zero::step_scalars), which no plan entry covers.
  const std::uint64_t scalars = sizeof(rz::zero::step_scalars);
  fmt::print(
      "  runtime allocations, counted where they are made: peak {} B, now {} B; the plan {} B + {} B of the "
      "step's scalars  {}\n",
      r.allocated_peak, r.allocated_now, p.total(), scalars,
      r.allocated_peak <= p.total() + scalars ? "within the plan" : "ABOVE THE PLAN");
}

/// The memory lines of a DDP run: every rank holds the whole state; ringzero allocates only the
/// reducer's gradient buckets (gradient_reducer::memory_allocated), which the .grad() tensors view.
void print_ddp_memory(const result& r) {
  const auto& p = r.planned;
  fmt::print("model state per rank (DDP: every rank holds all of it):\n");
  fmt::print("  parameters {} B (the module's), AdamW's exp_avg and exp_avg_sq {} B (torch::optim's){}\n", p.parameters,
             p.optimizer_states,
             p.master_weights > 0 ? fmt::format(", float32 master weights {} B", p.master_weights) : std::string());
  fmt::print(
      "  gradient buckets (the reducer's allocations, counted where they are made): now {} B, peak {} B, for {} B "
      "of gradients in {} bucket(s)\n",
      r.allocated_now, r.allocated_peak, p.gradients, r.buckets);
}

/// An option given with a strategy that has no use for it: why it is refused ("" when none is).
/// Options are compared with their defaults, so a default given explicitly passes.
std::string strategy_refusal(const options& o) {
  // Stage 3's options (zero1 and zero2 keep every parameter whole, ddp the whole model).
  const std::string stage3 = o.reshard != "all"             ? "--reshard-after-forward " + o.reshard
                             : !o.reshard_after_backward    ? "--no-reshard-after-backward"
                             : o.max_inflight_gathers != 0  ? "--max-inflight-gathers"
                             : o.keep_frozen != "all"       ? "--keep-frozen"
                             : o.quantize_weights != "none" ? "--quantize-weights"
                                                            : "";
  if (!stage3.empty() && o.strategy != "zero3")
    return fmt::format("{} is an option of ZeRO stage 3 (--strategy zero3); --strategy {} {}", stage3, o.strategy,
                       o.strategy == "ddp" ? "holds the whole model on every rank and gathers nothing"
                                           : "keeps every parameter whole on every rank and gathers nothing");
  if (o.strategy != "ddp") return {};
  const auto refuse = [](const std::string& option, const std::string& why) {
    return fmt::format("{} is an option of the ZeRO runtime (--strategy zero1|zero2|zero3); --strategy ddp {}", option,
                       why);
  };
  if (o.quantize_gradients != "none")
    return refuse("--quantize-gradients",
                  "all_reduces full-precision gradients through integration::torch_ddp (ZeRO++'s quantized "
                  "collectives are the runtime's)");
  if (o.wrap != "block")
    return refuse("--wrap " + o.wrap, "has no gather units: torch_ddp reduces the gradients in the reducer's buckets");
  if (o.accumulate_unsharded)
    return refuse("--accumulate-unsharded",
                  "always accumulates the full gradients (the micro-batches before the last run under torch_ddp's "
                  "no_sync(), then one all_reduce)");
  return {};
}

int main(int argc, char** argv) {
  options o;
  CLI::App app{"A small character-level GPT (libtorch) trained on Debian's fortunes with DDP or ZeRO 1-3"};
  CLI::Option* ranks_given =
      app.add_option("--ranks", o.ranks, "ranks (threads of this process; --backend mpi: the process count)")
          ->check(CLI::Range(1, 64));
  app.add_option("--backend", o.backend, "local (threads of this process) or mpi (one rank per process, mpirun)")
      ->check(CLI::IsMember({"local", "mpi"}));
  app.add_option("--link-gbps", o.link_gbps,
                 "with --backend mpi: hold each rank's sends back to a link of this many gigabits per second "
                 "(RINGZERO_LINK_GBPS; docs/mpi.md)")
      ->check(ex::number_check({.low = 0.001, .high = 1e6}, "a link speed in Gb/s from 0.001 to 1000000", "GBPS"));
  app.add_option("--quantize-weights", o.quantize_weights,
                 "zero3: all_gather parameters as int8 or int4 blocks of 256 with a scale each (ZeRO++'s qwZ)")
      ->check(CLI::IsMember({"none", "int8", "int4"}));
  app.add_option("--quantize-gradients", o.quantize_gradients,
                 "zero1-3: reduce gradients as int8 or int4 blocks, added up in float32 (ZeRO++'s qgZ)")
      ->check(CLI::IsMember({"none", "int8", "int4"}));
  app.add_option("--lora", o.model.lora,
                 "fine-tune low-rank adapters of this rank on every projection, the backbone frozen (0: train all)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--keep-frozen", o.keep_frozen,
                 "zero3: bytes per rank of frozen parameters kept gathered, never re-gathered (a number, or all)")
      ->check([](const std::string& v) {
        return v == "all" || (!v.empty() && v.size() <= 19 && v.find_first_not_of("0123456789") == std::string::npos)
                   ? std::string()
                   : "must be a number of bytes or all";
      });
  app.add_option("--accumulation-steps", o.accumulation,
                 "micro-batches per step (each rank's share of --batch split evenly; one reduction each at zero2-3)")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--accumulate-unsharded", o.accumulate_unsharded,
               "zero2-3: accumulate the micro-batches' full gradients and reduce_scatter once per step");
  app.add_option("--strategy", o.strategy, "distribution strategy")
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3"}));
  app.add_option("--wrap", o.wrap, "gather units: per transformer block, per torch submodule, or one")
      ->check(CLI::IsMember({"block", "layer", "model"}));
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::Range(0, 10000000));
  app.add_option("--batch", o.batch, "sequences per global batch (a multiple of --ranks)")->check(CLI::Range(1, 65536));
  app.add_option("--context", o.model.context, "characters per sequence")->check(CLI::Range(2, 4096));
  app.add_option("--layers", o.model.layers, "transformer blocks")->check(CLI::Range(1, 256));
  app.add_option("--embd", o.model.embd, "embedding width")->check(CLI::Range(1, 65536));
  app.add_option("--heads", o.model.heads, "attention heads (divides --embd)")->check(CLI::Range(1, 1024));
  app.add_option("--lr", o.lr, "AdamW learning rate")->check(CLI::Range(0.0, 1.0));
  app.add_option("--clip", o.clip, "clip the global gradient norm to this (0: off)")->check(CLI::Range(0.0, 1e6));
  app.add_option("--seed", o.seed, "seed of the initial values, the batches and the sampling");
  ex::add_check_replicas_option(app, o.check_replicas);
  app.add_flag("--bf16", o.bf16, "bfloat16 parameters, compute and gradients; float32 master weights and states");
  app.add_option("--reshard-after-forward", o.reshard,
                 "stage 3: the units released after their forward (all, except_last as FSDP2, none)")
      ->check(CLI::IsMember({"all", "except_last", "none"}));
  app.add_flag_callback(
      "--no-reshard-after-forward", [&o] { o.reshard = "none"; },
      "stage 3: keep every unit gathered until its backward (--reshard-after-forward none)");
  app.add_flag_callback(
      "--no-reshard-after-backward", [&o] { o.reshard_after_backward = false; },
      "stage 3: keep every unit gathered after its backward for the step's next micro-batch (with "
      "--no-reshard-after-forward and --accumulate-unsharded a step gathers and reduces once)");
  app.add_option("--max-inflight-gathers", o.max_inflight_gathers,
                 "stage 3: the most units gathered at once that a prefetch may bring about (0: no bound, 1: no "
                 "prefetch); the plan's gather buffers follow")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--generate", o.generate, "characters to generate at the end")->check(CLI::Range(0, 100000));
  app.add_option("--print-every", o.print_every, "print the loss every N steps")->check(CLI::Range(1, 1000000));
  app.add_option("--data", o.data, "directory of the fortune files");
  app.add_option("--json", o.json_path, "write losses, memory, plan and parameters to this JSON file");
  auto* checkpoint = app.add_option("--checkpoint", o.checkpoint_dir,
                                    "save checkpoints into this directory (at the end, and see "
                                    "--checkpoint-every)");
  app.add_option("--checkpoint-every", o.checkpoint_every, "also save every N steps (0: only at the end)")
      ->check(CLI::Range(0, 10000000));
  ex::add_keep_checkpoints(app, o.keep_checkpoints, checkpoint);
  app.add_option("--resume", o.resume_dir,
                 "continue from the newest checkpoint in this directory (resharded to this --ranks and --strategy)");
  CLI11_PARSE(app, argc, argv);
  ex::rank_setup where{o.backend, "cpu", o.ranks, o.pin, o.link_gbps};
  if (ex::refuse_launcher(where, "libtorch_gpt")) return 2;
  if (o.link_gbps > 0 && o.backend != "mpi") {
    std::fprintf(stderr, "libtorch_gpt: --link-gbps needs --backend mpi (the local backend's ranks share memory)\n");
    return 1;
  }
  torch::set_num_threads(1);  // one compute thread per rank
  int process_rank = 0;       // under --backend mpi only rank 0 prints and writes the JSON file
  try {
    // --backend mpi: MPI_Init_thread ... MPI_Finalize; --ranks becomes the process count.
    ex::process_world world(argc, argv, where, ranks_given->count() > 0, "libtorch_gpt");
    process_rank = world.rank();
    o.ranks = where.ranks;
    o.pin = where.pin;
    if (o.batch % o.ranks != 0 || o.model.embd % o.model.heads != 0 || (o.batch / o.ranks) % o.accumulation != 0)
      throw rz::error(
          rz::errc::invalid_argument,
          "--batch must be a multiple of --ranks times --accumulation-steps and --heads must divide --embd");
    if (const std::string why = strategy_refusal(o); !why.empty()) throw rz::error(rz::errc::invalid_argument, why);
    const corpus c = make_corpus(o.data);
    if (!world.lead()) {  // the other processes train their rank and print nothing
      (void)train(o, c);
      return 0;
    }
    fmt::print("corpus: {} characters, vocabulary {}, unigram entropy {:.4f} nats ({:.4f} bits) per character\n",
               c.text.size(), c.vocab.size(), c.unigram_entropy, c.unigram_entropy / std::log(2.0));
    fmt::print("{} on {} rank(s), wrap {}, {} blocks of width {}, context {}, global batch {}{}{}\n", o.strategy,
               o.ranks, o.wrap, o.model.layers, o.model.embd, o.model.context, o.batch, o.bf16 ? ", bfloat16" : "",
               o.model.lora > 0 ? fmt::format(", LoRA rank {} (backbone frozen)", o.model.lora) : "");
    std::fflush(stdout);
    const auto resident_before = ex::resident_set();
    const result r = train(o, c);
    const auto resident_after = ex::resident_set();

    fmt::print("\ntrainable parameters: {} of {}", r.trainable, r.total);
    if (r.frozen_kept_bytes > 0) fmt::print("; frozen ones kept gathered: {} B per rank", r.frozen_kept_bytes);
    fmt::print("\n");
    if (r.ddp)
      print_ddp_memory(r);
    else
      print_zero_memory(r);
    const int here = o.backend == "mpi" ? 1 : o.ranks;  // ranks in this process
    if (resident_before && resident_after)
      fmt::print(
          "  process resident memory: peak {} B, {} B above the start; ringzero allocated {} B for {} rank(s) at the "
          "peak (the rest: libtorch's {}activations, gradients and workspace)\n",
          resident_after->peak, resident_after->peak - resident_before->now,
          r.allocated_peak * static_cast<std::uint64_t>(here), here, r.ddp ? "parameters, optimizer states, " : "");
    if (!r.losses.empty()) {
      double tail = 0;
      const std::size_t k = std::min<std::size_t>(20, r.losses.size());
      for (std::size_t i = r.losses.size() - k; i < r.losses.size(); ++i) tail += r.losses[i];
      tail /= static_cast<double>(k);
      fmt::print("training loss (mean of the last {} steps) {:.4f} nats vs unigram entropy {:.4f}: {}\n", k, tail,
                 c.unigram_entropy, tail < c.unigram_entropy ? "below" : "NOT below");
      fmt::print("{:.0f} tokens/s, median step {:.2f} ms\n", r.tokens_per_second, 1e3 * median(r.step_seconds));
      fmt::print("sent per step and rank: {:.1f} KiB measured; {} {:.1f} KiB", r.sent_per_step / 1024,
                 r.ddp ? fmt::format("DDP's all_reduce of the {} gradient bucket(s) (ring)", r.buckets)
                       : std::string("the plan's collectives"),
                 r.planned_per_step / 1024);
      if (r.unquantized_per_step != r.planned_per_step)
        fmt::print(" ({:.1f} KiB without quantization, {:.2f}x)", r.unquantized_per_step / 1024,
                   r.unquantized_per_step / r.planned_per_step);
      fmt::print("\n");
    }
    if (!r.replica_checks.empty()) fmt::print("{}\n", r.replica_checks);
    if (r.gathers)
      fmt::print(
          "gathers (rank 0, whole run): {} taking {:.3f} s on the communication stream, {:.3f} s waited for "
          "in {} waits: {:.0f}% hidden behind compute\n",
          r.gathers->gathers, r.gathers->gather_seconds, r.gathers->exposed_seconds, r.gathers->waits,
          100.0 * r.gathers->hidden_fraction());
    fmt::print("\ngenerated:\n{}\n", r.sample);
    if (!o.json_path.empty()) {
      nlohmann::json j{{"strategy", o.strategy},
                       {"ranks", o.ranks},
                       {"wrap", o.wrap},
                       {"reshard_after_forward", o.reshard},
                       {"max_inflight_gathers", o.max_inflight_gathers},
                       {"reshard_after_backward", o.reshard_after_backward},
                       {"first_step", r.first_step},
                       {"losses", r.losses},
                       {"step_seconds", r.step_seconds},
                       {"median_step_seconds", median(r.step_seconds)},
                       {"gather_timing", r.gathers ? ex::gather_timing_json(*r.gathers) : nlohmann::json()},
                       {"backend", o.backend},
                       {"link_gbps", o.link_gbps},
                       {"quantize_weights", o.quantize_weights},
                       {"quantize_gradients", o.quantize_gradients},
                       {"sent_bytes_per_step", r.sent_per_step},
                       {"planned_bytes_per_step", r.planned_per_step},
                       {"unquantized_bytes_per_step", r.unquantized_per_step},
                       {"lora", o.model.lora},
                       {"accumulation_steps", o.accumulation},
                       {"accumulate_unsharded", o.accumulate_unsharded},
                       {"trainable_parameters", r.trainable},
                       {"parameters_total", r.total},
                       {"frozen_kept_bytes", r.frozen_kept_bytes},
                       {"tokens_per_second", r.tokens_per_second},
                       {"unigram_entropy", c.unigram_entropy},
                       {"memory_measured", memory_json(r.asked)},
                       {"memory_planned", memory_json(r.planned)},
                       {"gradient_buckets", r.buckets},
                       {"memory_allocated",
                        {{"peak", r.allocated_peak},
                         {"now", r.allocated_now},
                         {"by_category", memory_json(r.asked)},
                         {"scratch", r.scratch}}},
                       {"resident_memory",
                        {{"start", resident_before ? resident_before->now : 0},
                         {"peak", resident_after ? resident_after->peak : 0}}},
                       {"parameters", parameters_json(r.parameters)},
                       {"replica_checks", r.replica_checks},
                       {"sample", r.sample}};
      std::ofstream f(o.json_path);
      // The vocabulary is bytes: a sample may cut a UTF-8 sequence, which JSON cannot hold as is.
      f << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      if (!f) throw rz::error(rz::errc::io_error, "cannot write " + o.json_path);
    }
  } catch (const std::exception& e) { return ex::report_failure("libtorch_gpt", where, process_rank, e); }
  return 0;
}
