#pragma once
/// @file
/// Example 01's checkpoint plumbing (CPU only; include/ringzero/checkpoint/, docs/checkpoint.md):
/// the replicas' state as a checkpoint holds it, --init-from, --resume and what a checkpoint
/// records of the training progress. The loads and saves are collectives over the reducer's
/// communicator.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>

#include "ddp_options.hpp"
#include "mlp.hpp"
#include "optimizer.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

namespace ringzero::examples::ddp_example {

namespace rz = ringzero;
namespace ex = ringzero::examples;
namespace ck = ringzero::checkpoint;

/// The trainer's state as a checkpoint holds it: each tensor of the MLP under example 02's names
/// and shapes ("fc1.weight" [784, 256], "fc1.bias" [256], ...: a consolidated file initialises
/// either example) and its slices of the optimizer's state tensors (views, nothing is copied).
inline ck::replicated_state checkpoint_state(ex::mlp& model, ex::optimizer& opt) {
  ck::replicated_state state;
  const std::vector<ex::optimizer::state_tensor> states = opt.state_tensors();
  for (std::size_t i = 0; i < model.tensor_count(); ++i) {
    const ex::tensor_info& t = model.tensor(i);
    std::vector<std::uint64_t> shape = {static_cast<std::uint64_t>(t.cols)};
    if (t.rows > 1) shape.insert(shape.begin(), static_cast<std::uint64_t>(t.rows));
    state.add_parameter(t.name, model.parameter(i), shape);
    for (std::size_t k = 0; k < states.size(); ++k)
      state.add_optimizer_state(t.name, static_cast<int>(k), states[k].name,
                                states[k].values.subspan(t.offset, t.count), shape);
  }
  state.set_optimizer({{"kind", opt.name()}, {"lr", opt.learning_rate()}});
  return state;
}

/// Copies the parameters of the safetensors file `path` (every tensor of the model, by name, of
/// its shape, any floating dtype) into `model`; refuses a missing, misshapen or extra tensor.
inline void initialise_from(ex::mlp& model, const std::string& path, bool allow_nonfinite) {
  const ringzero::checkpoint::detail::file f = ringzero::checkpoint::detail::file::open_read(path);
  const ck::safetensors_header h = ck::read_safetensors_header(f);
  std::vector<unsigned char> raw;
  for (std::size_t i = 0; i < model.tensor_count(); ++i) {
    const ex::tensor_info& t = model.tensor(i);
    const ck::safetensors_tensor* s = h.find(t.name);
    const std::uint64_t n = t.count;
    if (s == nullptr)
      throw rz::error(rz::errc::invalid_argument,
                      fmt::format("--init-from {}: the model's '{}' is not in the file", path, t.name));
    if (s->numel() != n || s->shape.back() != static_cast<std::uint64_t>(t.cols) || !s->type ||
        !rz::is_floating_point(*s->type))
      throw rz::error(
          rz::errc::invalid_argument,
          fmt::format("--init-from {}: '{}' is {} [{}], the model's is float32 [{}{}]", path, t.name, s->dtype_name,
                      fmt::join(s->shape, ", "), t.rows > 1 ? fmt::format("{}, ", t.rows) : "", t.cols));
    raw.resize(static_cast<std::size_t>(s->end - s->begin));
    f.read_at(raw.data(), raw.size(), s->begin);
    if (!allow_nonfinite)
      if (const auto bad = ck::detail::first_nonfinite(*s->type, raw.data(), n))
        throw rz::error(rz::errc::invalid_argument,
                        fmt::format("--init-from {}: '{}' holds a non-finite value (NaN or infinity) at element {} "
                                    "(--allow-nonfinite loads it anyway)",
                                    path, t.name, *bad));
    ck::detail::convert_elements(*s->type, raw.data(), rz::dtype::float32,
                                 reinterpret_cast<unsigned char*>(model.parameter(i).data()), n);
  }
  if (h.tensors.size() != model.tensor_count())
    throw rz::error(rz::errc::invalid_argument, fmt::format("--init-from {}: the file holds {} tensors, the model {}",
                                                            path, h.tensors.size(), model.tensor_count()));
}

/// --resume (parameters, optimizer state and step count, bucket layout) or --init-from into every
/// rank's replica, a collective; returns the epochs already done.
inline int restore(const options& o, rz::ddp::gradient_reducer& reducer, ck::replicated_state& state, ex::mlp& model,
                   ex::optimizer& opt, bool lead) {
  if (!o.init_from.empty()) {
    initialise_from(model, o.init_from, o.allow_nonfinite);
    if (lead) fmt::print("  initialised from {}\n", o.init_from);
    return 0;
  }
  if (o.resume_dir.empty()) return 0;
  ck::load_options in_place;  // the replicas were just made: read straight into them
  in_place.in_place = true;
  const ck::training_progress p = ck::load(reducer, state, o.resume_dir, in_place);
  if (p.step_in_epoch != 0)
    throw rz::error(rz::errc::invalid_argument,
                    fmt::format("--resume {}: the checkpoint was saved in the middle of epoch {} (this "
                                "example resumes at epoch boundaries)",
                                o.resume_dir, p.epoch + 1));
  opt.set_steps(p.optimizer_steps);
  if (lead) {
    const ck::found_checkpoint found = ck::find_checkpoint(o.resume_dir);
    if (!found.note.empty()) fmt::print("  note: {}\n", found.note);
    const std::string changed = ck::optimizer_difference(ck::read_index(found.directory).optimizer, state.optimizer());
    if (!changed.empty()) fmt::print("  note: the checkpoint's optimizer differs from this run's: {}\n", changed);
    fmt::print("  resumed from {} after epoch {} ({} optimizer steps)\n", found.directory.string(), p.epoch,
               p.optimizer_steps);
    if (p.rng_seeds != std::vector<std::uint64_t>{o.seed})
      fmt::print("  note: the checkpoint was trained with --seed {}; the data order continues with --seed {}\n",
                 p.rng_seeds.empty() ? std::string("?") : std::to_string(p.rng_seeds.front()), o.seed);
  }
  return static_cast<int>(std::min<std::uint64_t>(p.epoch, static_cast<std::uint64_t>(o.epochs)));
}

/// What a checkpoint of this example records after `epochs` epochs and `optimizer_steps` steps.
inline ck::training_progress progress_after(const options& o, int epochs, std::uint64_t optimizer_steps,
                                            int global_batch) {
  ck::training_progress progress;
  progress.optimizer_steps = optimizer_steps;
  progress.epoch = static_cast<std::uint64_t>(epochs);
  progress.rng_seeds = {o.seed};
  progress.metadata = {{"example", "01_ddp_fashion_mnist"}, {"global_batch", std::to_string(global_batch)}};
  return progress;
}

}  // namespace ringzero::examples::ddp_example
