#pragma once
/// @file
/// Example 02's checkpoint plumbing (include/ringzero/checkpoint/, docs/checkpoint.md): what a
/// checkpoint records of the training progress, --resume and --init-from, and the final
/// parameters (their CRC-32, --save-parameters).
/// Every function here is a collective over the model's communicator.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <zlib.h>

#include "mlp.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/zero/sharded_model.hpp"
#include "zero_options.hpp"

namespace ringzero::examples::zero_example {

namespace ck = ringzero::checkpoint;

/// The training progress a checkpoint of this example records after `epochs` epochs: the sampler's
/// position (whole epochs) and the seed its order derives from, the run's settings as metadata.
inline ck::training_progress progress_after(const options& o, int epochs, int global_batch) {
  ck::training_progress p;
  p.epoch = static_cast<std::uint64_t>(epochs);
  p.rng_seeds = {o.seed};
  p.metadata = {
      {"example", "02_zero_fashion_mnist"}, {"global_batch", std::to_string(global_batch)}, {"optimizer", o.optimizer}};
  return p;
}

/// --resume (parameters, optimizer states, step count; resharded to this --ranks and --stage) or
/// --init-from (parameters only) into `model`; returns the epochs already done.
inline int restore(const options& o, zero::sharded_model& model, int global_batch, bool lead) {
  if (!o.init_from.empty()) {
    ck::load_pretrained(model, o.init_from, true, o.allow_nonfinite);
    if (lead) fmt::print("  initialised from {}\n", o.init_from);
    return 0;
  }
  if (o.resume_dir.empty()) return 0;
  // In place: the model was just made, its state has nothing to lose, and the reads go straight
  // into its memory (no second copy; docs/checkpoint.md, "Loading in place").
  ck::load_options in_place;
  in_place.in_place = true;
  const ck::training_progress p = ck::load(model, o.resume_dir, in_place);
  if (p.step_in_epoch != 0)
    throw error(errc::invalid_argument, fmt::format("--resume {}: the checkpoint was saved in the middle of epoch {} "
                                                    "(this example resumes at epoch boundaries)",
                                                    o.resume_dir, p.epoch + 1));
  if (lead) {
    const ck::found_checkpoint found = ck::find_checkpoint(o.resume_dir);
    if (!found.note.empty()) fmt::print("  note: {}\n", found.note);
    const std::string changed = ck::optimizer_difference(ck::read_index(found.directory).optimizer,
                                                         ck::detail::optimizer_json(model.optimizer().options()));
    if (!changed.empty()) fmt::print("  note: the checkpoint's optimizer differs from this run's: {}\n", changed);
    fmt::print("  resumed from {} after epoch {} ({} optimizer steps)\n", found.directory.string(), p.epoch,
               p.optimizer_steps);
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

/// The final parameters of `net`'s tensors (float32, in registration order): their CRC-32
/// (zlib's, returned on every rank) and, with --save-parameters, rank 0 writes them. At stage 3
/// reading them is a collective.
inline std::uint32_t final_parameters(const options& o, zero::sharded_model& model, const mlp& net, bool lead) {
  std::vector<float> all(net.parameter_elements());
  for (std::size_t i = 0; i < net.tensor_count(); ++i) {
    const tensor_info& t = net.tensor(i);
    model.read_parameter(i, std::span<float>(all.data() + t.offset, t.count));
  }
  const auto crc = static_cast<std::uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(all.data()), all.size() * sizeof(float)));
  if (!lead || o.save_path.empty()) return crc;
  std::ofstream f(o.save_path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
  if (!f) throw error(errc::io_error, "cannot write " + o.save_path);
  return crc;
}

}  // namespace ringzero::examples::zero_example
