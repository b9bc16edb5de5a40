#pragma once
/// @file
/// `checkpoint::load`: restores a checkpoint (a checkpoint directory, or a root whose `latest`
/// names one) into a `zero::sharded_model` or a DDP trainer at any world size, stage, replica
/// group size and alignment (resharding), each rank reading only the byte ranges its plan needs.
/// All or nothing: every rank reads and verifies into memory of its own (with the optimizer
/// states: a copy laid out as the model's state, then exchanged with it), one small collective
/// tells every rank whether all succeeded, and only then is the state replaced; a failed load
/// leaves the state exactly as it was and raises the same error on every rank, naming the rank,
/// file, tensor and what was expected (missing or truncated files, checksum mismatches, another
/// model or optimizer, a newer format version (errc::unsupported), fragments that do not tile a
/// tensor, a call mid-step, a DDP trainer's device memory (errc::unsupported); a sharded model
/// on the device path is read into host staging and copied in on its stream). Returns the saved progress; with
/// `load_options::optimizer_state` the states and step count are restored too.
/// Thread semantics: a collective on every rank's training thread. Needs nlohmann/json and
/// libxxhash (`ringzero-checkpoint`). Manual: docs/checkpoint.md.

#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/checkpoint/agreement.hpp"
#include "ringzero/checkpoint/checkpoint_directory.hpp"
#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/fragment_reader.hpp"
#include "ringzero/checkpoint/replicated_state.hpp"
#include "ringzero/checkpoint/staging_buffer.hpp"
#include "ringzero/checkpoint/state_loader.hpp"
#include "ringzero/checkpoint/zero_state.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::checkpoint {

namespace detail {

/// What `body` threw, as this rank's problem for the agreement ("" when it returned).
template <class Body>
std::pair<std::string, errc> problem_of(Body&& body) {
  try {
    body();
  } catch (const error& e) { return {e.message(), e.kind()}; } catch (const std::exception& e) {
    return {e.what(), errc::internal};
  }
  return {std::string(), errc::io_error};
}

/// Runs `body` (a reading phase), agrees with every rank, and throws the shared verdict, which
/// says `state` (what became of the model's state).
template <class Body>
void load_phase(communicator& comm, communicator* replica, const std::filesystem::path& path, Body&& body,
                const char* state = "the state is unchanged") {
  const auto [problem, code] = problem_of(body);
  const verdict v = agree(comm, replica, problem, code);
  if (!v.text.empty())
    throw error(v.code,
                error_context{std::string(backend_name(comm.backend())), comm.rank(), comm.world_size(), {}, -1},
                "loading checkpoint '" + path.string() + "' failed, " + state + ": " + v.text);
}

/// What a failed in-place load says of the state (`load_options::in_place`).
inline constexpr const char* overwritten_in_place =
    "the state may be partly overwritten (load_options::in_place): load a checkpoint again before training on";

/// Runs `body`, a load's commit into `model`. On the host path it cannot fail and runs alone; on
/// the device path (copies on the runtime's stream, which may fail) every rank then learns
/// whether every rank's copies succeeded, and a failure is raised on every rank: the failing
/// ranks' state is then undefined (partly copied), so the caller loads again.
template <class Body>
void commit_phase(zero::sharded_model& model, const std::filesystem::path& path, Body&& body) {
  zero::checkpoint_access access(model);
  if (!access.through_stream()) {
    body();
    return;
  }
  const auto [problem, code] = problem_of(body);
  if (!problem.empty()) access.synchronize_quietly();  // no copy still reads the staging
  communicator& comm = model.comm();
  const verdict v = agree(comm, model.replica_comm(), problem, code);
  if (!v.text.empty())
    throw error(v.code,
                error_context{std::string(backend_name(comm.backend())), comm.rank(), comm.world_size(), {}, -1},
                "loading checkpoint '" + path.string() +
                    "' failed while copying it into the model's memory (the failing ranks' state is partly "
                    "copied: load again): " +
                    v.text);
}

}  // namespace detail

namespace detail {

/// What a DDP trainer's refusal mid-step adds when the reducer is inside a no_sync accumulation
/// window (empty otherwise): the gradients accumulated there belong to the parameters a load
/// would replace, and a save would record a step count they are not part of.
inline std::string accumulation_window(const ddp::gradient_reducer& reducer) {
  if (!reducer.accumulating()) return {};
  return ": gradients were accumulated under no_sync since the last synchronised finish(); end the accumulation "
         "window with a synchronised micro-batch and the optimizer step first";
}

/// `load` of a sharded model. With the optimizer states: reading into `spare` (reused when it
/// has the model's layout; else a fresh copy), exchanged with the model's state at the end.
/// Without: reading into `arena` when it is large enough (else fresh staging), then copied.
/// `load_options::in_place` on the host path: every check first, agreed by every rank; then
/// the reads go straight into the model's memory (a second agreement says whether they all
/// succeeded).
inline training_progress load_zero(zero::sharded_model& model, const std::filesystem::path& path,
                                   const load_options& options, staging_buffer* arena, zero_spare* spare) {
  checkpoint_index index;
  std::filesystem::path dir;
  const zero_tensors z(model.plan(), model.optimizer().options());
  std::optional<zero_staging> staging;
  std::vector<const tensor_record*> records;
  std::optional<fragment_reader> reader;
  const auto check = [&] {
    if (!model.between_steps())
      throw error(errc::invalid_argument,
                  "a checkpoint can only be loaded between steps (after step(), before the next micro-batch)");
    dir = resolve_checkpoint(path);
    index = read_index(dir);
    if (index.progress.loss_scale)
      if (std::string why = zero::loss_scaler::restore_problem(*index.progress.loss_scale); !why.empty())
        throw error(errc::io_error, "checkpoint '" + dir.string() + "': " + why);
    records = match_tensors(index, z.tensors, options, dir.string());
    reader.emplace(dir, index);
    reader->check_files();
  };
  // The device path's state is written through its stream: always staged.
  if (options.in_place && !zero::checkpoint_access(model).through_stream()) {
    load_phase(model.comm(), model.replica_comm(), path, check);
    load_phase(
        model.comm(), model.replica_comm(), path,
        [&] {
          zero::checkpoint_access(model).begin_restore();  // the trainer's reads of the old state come first
          staging.emplace(model, z, options.optimizer_state, nullptr, nullptr, true);
          read_targets(*reader, z.tensors, records, staging->targets());
        },
        overwritten_in_place);
    staging->commit(index.progress.optimizer_steps);
  } else {
    load_phase(model.comm(), model.replica_comm(), path, [&] {
      check();
      staging.emplace(model, z, options.optimizer_state, arena, spare);
      read_targets(*reader, z.tensors, records, staging->targets());
    });
    commit_phase(model, path, [&] { staging->commit(index.progress.optimizer_steps); });
  }
  // With the optimizer states, the loss scaler continues too (when the model scales and the
  // checkpoint has a scale; an index without the good-step count restores 0).
  if (options.optimizer_state && model.scaler().enabled() && index.progress.loss_scale)
    zero::checkpoint_access(model).scaler().restore(*index.progress.loss_scale, index.progress.loss_scale_good_steps);
  return index.progress;
}

}  // namespace detail

/// Loads the checkpoint at `path` into `model` (see the file comment). Collective.
/// `checkpointer::load` does the same in staging memory kept from load to load.
inline training_progress load(zero::sharded_model& model, const std::filesystem::path& path,
                              const load_options& options = {}) {
  return detail::load_zero(model, path, options, nullptr, nullptr);
}

/// Loads the checkpoint at `path` into a DDP trainer: every tensor of `state` whole on every
/// rank, and the reducer's bucket layout when the checkpoint records one for the same number
/// of parameters. Collective over the reducer's communicator.
inline training_progress load(ddp::gradient_reducer& reducer, replicated_state& state,
                              const std::filesystem::path& path, const load_options& options = {}) {
  checkpoint_index index;
  const std::vector<tensor_spec> specs = state.specs();
  std::vector<detail::staging_buffer> staging(specs.size());
  std::vector<std::size_t> order;
  std::vector<const tensor_record*> records;
  std::optional<fragment_reader> reader;
  bool restore_layout = false, rebuilt = false;
  const auto check = [&] {
    if (!reducer.between_steps())  // before the reads: restore_layout would refuse it only after them
      throw error(errc::invalid_argument, std::string("a checkpoint can only be loaded between steps (after the "
                                                      "synchronised finish(), before the next mark_ready)") +
                                              detail::accumulation_window(reducer));
    if (reducer.comm().space() != memory_space::host)
      throw error(errc::unsupported, "checkpoints of a DDP trainer's state in device memory are not supported yet");
    const std::filesystem::path dir = resolve_checkpoint(path);
    index = read_index(dir);
    records = detail::match_tensors(index, specs, options, dir.string());
    reader.emplace(dir, index);
    reader->check_files();
    if (index.extra.contains("reducer")) {
      const auto& r = index.extra["reducer"];
      if (r.value("parameters", std::uint64_t{0}) == reducer.parameter_count()) {
        order = r.at("bucket_order").get<std::vector<std::size_t>>();
        rebuilt = r.at("rebuilt").get<bool>();
        ringzero::ddp::detail::check_bucket_order(reducer.parameter_count(), order);
        restore_layout = order.size() == reducer.parameter_count();
      }
    }
  };
  // Each tensor read into staging of its own, or (in place) into the trainer's memory.
  const auto read = [&](bool in_place) {
    std::vector<detail::load_target> targets;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (records[i] == nullptr) continue;  // an optimizer state not asked for
      unsigned char* dst = state.entries()[i].data;
      if (!in_place) {
        staging[i] = detail::staging_buffer(specs[i].numel() * dtype_size(specs[i].type), false);
        dst = staging[i].data();
      }
      targets.push_back({i, 0, specs[i].numel(), dst});
    }
    detail::read_targets(*reader, specs, records, targets);
  };
  if (options.in_place) {
    detail::load_phase(reducer.comm(), nullptr, path, check);
    detail::load_phase(
        reducer.comm(), nullptr, path, [&] { read(true); }, detail::overwritten_in_place);
  } else {
    detail::load_phase(reducer.comm(), nullptr, path, [&] {
      check();
      read(false);
    });
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (!staging[i].empty())
        std::memcpy(state.entries()[i].data, staging[i].data(), static_cast<std::size_t>(staging[i].bytes()));
  }
  if (restore_layout) reducer.restore_layout(order, rebuilt);
  return index.progress;
}

}  // namespace ringzero::checkpoint
