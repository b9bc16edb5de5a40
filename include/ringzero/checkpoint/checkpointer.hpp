#pragma once
/// @file
/// `checkpoint::checkpointer`: saves the whole training state of a `zero::sharded_model` (any
/// stage, hybrid sharding included) or of a DDP trainer (`gradient_reducer` + `replicated_state`)
/// into checkpoints under one root directory (protocol: checkpoint/checkpoint_directory.hpp).
/// `save`: every rank writes and fsyncs its shard file, one small collective (each rank's status
/// and chunk checksums), then rank 0 writes the index and commits. `async_save` (PyTorch DCP's
/// async_save): finishes the previous one, copies this rank's share into a staging buffer
/// allocated once (one memcpy per piece: all it blocks for), and a background thread (nice 19,
/// started once and kept) hashes and writes it; the collective and the commit run at the next
/// `save`, `async_save` or `wait()`, where its errors surface naming the file. `load` keeps its
/// memory from load to load (see there).
/// A sharded model on the device path is copied into staging on its runtime stream first.
/// Errors, on every rank (naming rank, file, reason): a DDP trainer's device memory
/// (errc::unsupported), a failed copy out of the device path's memory, a save
/// mid-step or ranks passing different progress or names (errc::invalid_argument), any write
/// failure such as a full disk, or of rank 0's commit (errc::io_error; a second small collective
/// shares it). A failed save never marks a checkpoint complete. The destructor finishes a pending
/// save (see there). Thread semantics: each rank's training thread. Needs nlohmann/json and
/// libxxhash (`ringzero-checkpoint`). Manual: docs/checkpoint.md.
/// One saver per root: global rank 0 holds the root's lock (checkpoint/root_lock.hpp) from
/// `open` or the first save until the checkpointer is destroyed; a second job is refused.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/checkpoint/agreement.hpp"
#include "ringzero/checkpoint/background_writer.hpp"
#include "ringzero/checkpoint/checkpoint_directory.hpp"
#include "ringzero/checkpoint/load.hpp"
#include "ringzero/checkpoint/replicated_state.hpp"
#include "ringzero/checkpoint/root_lock.hpp"
#include "ringzero/checkpoint/shard_writer.hpp"
#include "ringzero/checkpoint/staging_buffer.hpp"
#include "ringzero/checkpoint/state_layout.hpp"
#include "ringzero/checkpoint/training_progress.hpp"
#include "ringzero/checkpoint/zero_state.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::checkpoint {

/// Options of a `checkpointer`.
struct checkpointer_options {
  /// Keep only the newest N complete checkpoints in the root (older ones are removed after a
  /// new one is complete); 0 keeps all.
  int keep_last = 0;
};

/// See the file comment.
class checkpointer {
 public:
  /// Checkpoints under `root` (created when missing, by every rank).
  explicit checkpointer(std::filesystem::path root, checkpointer_options options = {})
      : root_(std::move(root)), options_(options) {
    if (options_.keep_last < 0) throw error(errc::invalid_argument, "checkpointer: keep_last must be >= 0");
  }
  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;
  /// Finishes a pending asynchronous save as `wait()` does (collective: every rank destroys its
  /// checkpointer at the same point, its communicators still alive), printing an error to
  /// stderr (naming the checkpoint and the failing rank) instead of throwing. Destroyed while an
  /// exception unwinds, it only waits for the writer: no collective runs, the save stays incomplete,
  /// `latest` keeps naming the previous checkpoint, and stderr says so.
  ~checkpointer() {
    writer_.wait();
    if (!pending_) return;
    const std::string dir = (root_ / job_.name).string();
    if (std::uncaught_exceptions() > 0) {
      pending_ =
          false;  // the temporary directory stays (never taken as a checkpoint; a later save of the name replaces it)
      std::fprintf(
          stderr,
          "ringzero checkpointer (rank %d): checkpoint '%s' was not completed: destroyed while an exception unwinds\n",
          job_.rank, dir.c_str());
      return;
    }
    try {
      finish();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ringzero checkpointer (rank %d), finishing checkpoint '%s' at destruction: %s\n", job_.rank,
                   dir.c_str(), e.what());
    }
  }

  /// Prepares the root for this job's saves (collective over `comm`, and `replica` for hybrid
  /// sharding: every rank calls it at the same point; the first save does it when it was not
  /// called): global rank 0 creates the root, takes its lock (checkpoint/root_lock.hpp: a second
  /// job saving into the same root is refused here, the holder named), removes what interrupted
  /// saves left (".tmp.*", ".trash.*"), and, with `bytes_per_checkpoint` > 0, checks that the
  /// file system has that much free space for one more checkpoint. Call it before the first
  /// training step, so that a bad --checkpoint directory is reported before any work is done.
  /// Idempotent once it succeeded. Errors, on every rank naming rank 0's reason: errc::io_error.
  void open(communicator& comm, communicator* replica = nullptr, std::uint64_t bytes_per_checkpoint = 0) {
    if (opened_) return;
    const bool lead = comm.rank() == 0 && (replica == nullptr || replica->rank() == 0);
    std::string problem;
    if (lead) {
      try {
        lock_ = root_lock::acquire(root_);
        (void)remove_leftovers(root_);
        if (bytes_per_checkpoint > 0) {
          std::error_code ec;
          const std::filesystem::space_info space = std::filesystem::space(root_, ec);
          if (ec) detail::io_fail("cannot read the free space of", root_, ec.value());
          if (space.available < bytes_per_checkpoint)
            throw error(errc::io_error, "checkpoint root '" + root_.string() + "' has " +
                                            std::to_string(space.available) + " bytes free, and one checkpoint needs " +
                                            std::to_string(bytes_per_checkpoint));
        }
      } catch (const error& e) {
        problem = e.message();
        lock_.release();
      } catch (const std::exception& e) {
        problem = e.what();
        lock_.release();
      }
    }
    const detail::verdict v = detail::agree(comm, replica, problem, errc::io_error);
    if (!v.text.empty()) throw error(v.code, "checkpointer: cannot save into '" + root_.string() + "': " + v.text);
    opened_ = true;
  }
  /// `open` for saves of `model`, checking room for one checkpoint of it (its files' bytes).
  void open(zero::sharded_model& model) {
    if (opened_) return;
    const zero::optimizer_options& o = model.optimizer().options();
    const detail::zero_tensors z(model.plan(), o);
    open(model.comm(), model.replica_comm(), checkpoint_bytes(detail::zero_layout(model.plan(), o, z, nullptr)));
  }
  /// `open` for saves of a DDP trainer's `state`, checking room for one checkpoint of it.
  void open(ddp::gradient_reducer& reducer, const replicated_state& state) {
    if (opened_) return;
    open(reducer.comm(), nullptr, checkpoint_bytes(detail::replicated_layout(state, reducer.comm().world_size())));
  }
  /// True once `open` (or a first save) succeeded; rank 0 then holds the root's lock.
  bool is_open() const noexcept { return opened_; }

  /// The root directory.
  const std::filesystem::path& root() const noexcept { return root_; }
  /// True while an asynchronous save waits to be finished by the next call.
  bool pending() const noexcept { return pending_; }
  /// Bytes of the staging buffer (0 before the first asynchronous save, parameters-only load, or
  /// save of a device-path model, which stages every save).
  std::uint64_t staging_bytes() const noexcept { return staging_.bytes(); }

  /// Saves `model` (collective) as checkpoint `name` (default "step-<optimizer steps>"); the
  /// step count in `progress` is taken from the model. Between steps only.
  void save(zero::sharded_model& model, training_progress progress = {}, std::string name = {}) {
    wait();
    prepare_zero(model, std::move(progress), std::move(name), false);
    write(job_);
    finish();
  }
  /// The asynchronous `save` (see the file comment).
  void async_save(zero::sharded_model& model, training_progress progress = {}, std::string name = {}) {
    wait();
    prepare_zero(model, std::move(progress), std::move(name), true);
    launch();
  }
  /// Saves a DDP trainer (collective over the reducer's communicator): the tensors of `state`,
  /// the reducer's bucket layout, and `progress` (whose optimizer_steps the trainer sets).
  void save(ddp::gradient_reducer& reducer, const replicated_state& state, training_progress progress,
            std::string name = {}) {
    wait();
    prepare_replicated(reducer, state, std::move(progress), std::move(name), false);
    write(job_);
    finish();
  }
  /// The asynchronous DDP `save`.
  void async_save(ddp::gradient_reducer& reducer, const replicated_state& state, training_progress progress,
                  std::string name = {}) {
    wait();
    prepare_replicated(reducer, state, std::move(progress), std::move(name), true);
    launch();
  }

  /// Loads the checkpoint at `path` into `model` as `checkpoint::load` does (collective; a
  /// pending save is finished first), keeping memory from load to load. With the optimizer
  /// states (a resume) it reads into a second copy of the rank's state, exchanged with the
  /// model's at the end: the checkpointer then keeps the model's previous state, and the next
  /// load into the same model reads into that memory (no fresh pages, no copy). Parameters only:
  /// it reads into the staging buffer shared with `async_save` (allocated once, pages touched,
  /// grown when needed), then copies. A device-path model is never exchanged: with the states
  /// it reads into fresh host staging and copies in on the model's stream (nothing kept). Nor
  /// is a model whose parameters are the trainer's memory (`zero::adopt_parameters`): it reads
  /// into the staging buffer, states included, and copies in. `release_load_memory()` frees the
  /// kept copy. With `load_options::in_place` (host path) it reads into the model's memory and
  /// keeps nothing (a copy kept by an earlier load is freed first).
  /// Errors as `checkpoint::load`'s.
  training_progress load(zero::sharded_model& model, const std::filesystem::path& path,
                         const load_options& options = {}) {
    wait();
    if (options.in_place && !zero::checkpoint_access(model).through_stream()) {
      spare_.clear();  // no second copy: a kept one from an earlier load goes too
      return detail::load_zero(model, path, options, nullptr, nullptr);
    }
    if (options.optimizer_state && !zero::checkpoint_access(model).parameters_adopted())
      return detail::load_zero(model, path, options, nullptr, &spare_);
    const std::uint64_t need = detail::zero_staging::bytes_needed(model, options.optimizer_state);
    if (staging_.bytes() < need) {
      staging_ = detail::staging_buffer();
      try {
        staging_ = detail::staging_buffer(need);
      } catch (const error&) {  // out of memory: the load allocates its own staging (and reports a failure)
      }
    }
    return detail::load_zero(model, path, options, &staging_, nullptr);
  }
  /// Bytes of the copy of a model's state that `load` keeps (0 before a load of optimizer states).
  std::uint64_t load_memory_bytes() const noexcept { return spare_.bytes(); }
  /// Frees the copy of a model's state that `load` keeps (the rank's parameters, master
  /// weights and optimizer states). Local.
  void release_load_memory() noexcept { spare_.clear(); }

  /// Finishes a pending asynchronous save (collective when one is pending: every rank calls it
  /// at the same point): waits for the background write, agrees, commits. Throws its errors.
  void wait() {
    if (!pending_) return;
    writer_.wait();
    finish();
  }

 private:
  struct job {
    communicator* comm = nullptr;
    communicator* replica = nullptr;
    int rank = 0;
    state_layout layout;
    training_progress progress;
    std::string name;
    std::vector<const unsigned char*> sources;
    std::vector<std::uint64_t> checksums;
    std::string problem;
    errc code = errc::io_error;
  };

  void start_job(communicator& comm, communicator* replica, int rank, state_layout layout, training_progress progress,
                 std::string name) {
    job_.comm = &comm;
    job_.replica = replica;
    job_.rank = rank;
    job_.layout = std::move(layout);
    job_.progress = std::move(progress);
    job_.name = std::move(name);
    job_.sources.clear();
    job_.checksums.clear();
    job_.problem.clear();
    job_.code = errc::io_error;
    pending_ = true;  // from here on, the agreement must run on every rank
  }

  /// The bytes of every rank's file of a checkpoint of `L` (headers of at most one alignment block).
  static std::uint64_t checkpoint_bytes(const state_layout& L) {
    std::uint64_t bytes = static_cast<std::uint64_t>(L.world_size) * shard_data_alignment;
    for (const auto& mine : L.pieces)
      for (const piece& p : mine)
        bytes += (L.bytes(p) + shard_data_alignment - 1) / shard_data_alignment * shard_data_alignment;
    return bytes;
  }

  void refuse(errc code, const std::string& why) {
    if (job_.problem.empty()) {
      job_.problem = why;
      job_.code = code;
    }
  }

  /// Checks shared by both kinds, recorded as this rank's problem (the agreement raises it everywhere).
  void check_common() {
    const std::string p = job_.progress.problem();
    if (!p.empty()) refuse(errc::invalid_argument, "training_progress: " + p);
    try {
      check_checkpoint_name(job_.name);
    } catch (const error& e) { refuse(e.kind(), e.message()); }
  }

  void prepare_zero(zero::sharded_model& model, training_progress progress, std::string name, bool staged) {
    const zero::shard_plan& plan = model.plan();
    const zero::optimizer_options& o = model.optimizer().options();
    progress.optimizer_steps = model.optimizer().steps();
    if (model.scaler().enabled()) {  // the scaler's state, so that a resumed run is exact
      progress.loss_scale = model.scaler().scale();
      progress.loss_scale_good_steps = model.scaler().good_steps();
    }
    if (name.empty()) name = default_checkpoint_name(progress.optimizer_steps);
    const detail::zero_tensors z(plan, o);
    std::vector<std::vector<detail::zero_piece_source>> where;
    const int rank = model.global_rank();
    open(model.comm(), model.replica_comm());
    state_layout layout = detail::zero_layout(plan, o, z, &where);
    start_job(model.comm(), model.replica_comm(), rank, std::move(layout), std::move(progress), std::move(name));
    check_common();
    if (!model.between_steps())
      refuse(errc::invalid_argument,
             "a checkpoint can only be saved between steps (after step(), before the next micro-batch)");
    if (!job_.problem.empty()) return;
    std::vector<const unsigned char*> sources;
    for (const auto& s : where[static_cast<std::size_t>(rank)]) sources.push_back(detail::zero_source(model, s));
    // The device path's state is read only through its stream, into staging.
    const bool through = zero::checkpoint_access(model).through_stream();
    set_sources(std::move(sources), staged || through, through ? &model : nullptr);
  }

  void prepare_replicated(ddp::gradient_reducer& reducer, const replicated_state& state, training_progress progress,
                          std::string name, bool staged) {
    communicator& comm = reducer.comm();
    open(comm);
    if (name.empty()) name = default_checkpoint_name(progress.optimizer_steps);
    state_layout layout = detail::replicated_layout(state, comm.world_size());
    const std::vector<std::size_t> order = reducer.layout_order();
    layout.extra = {
        {"reducer",
         {{"bucket_order", order}, {"rebuilt", reducer.layout_rebuilt()}, {"parameters", reducer.parameter_count()}}}};
    start_job(comm, nullptr, comm.rank(), std::move(layout), std::move(progress), std::move(name));
    if (!reducer.between_steps())
      refuse(errc::invalid_argument, std::string("a checkpoint can only be saved between steps (after the synchronised "
                                                 "finish() and the optimizer step, before the next mark_ready)") +
                                         detail::accumulation_window(reducer));
    if (comm.space() != memory_space::host)
      refuse(errc::unsupported, "checkpoints of a DDP trainer's state in device memory are not supported yet (the " +
                                    std::string(backend_name(comm.backend())) +
                                    " communicator's buffers are device memory)");
    check_common();
    if (!job_.problem.empty()) return;
    std::vector<const unsigned char*> sources;
    for (const piece& p : job_.layout.pieces[static_cast<std::size_t>(comm.rank())]) {
      const tensor_spec& t = job_.layout.tensors[p.tensor];
      sources.push_back(state.entries()[p.tensor].data + p.begin * dtype_size(t.type));
    }
    set_sources(std::move(sources), staged);
  }

  /// Points the job at the model's memory, or copies it into staging (laid out like the file,
  /// every piece page-aligned): with `through`, on that model's stream (the device path).
  void set_sources(std::vector<const unsigned char*> sources, bool staged, zero::sharded_model* through = nullptr) {
    if (!staged) {
      job_.sources = std::move(sources);
      return;
    }
    const auto& mine = job_.layout.pieces[static_cast<std::size_t>(job_.rank)];
    // Each piece at a 4096-aligned place, as its fragment in the file: written with O_DIRECT.
    auto aligned = [](std::uint64_t n) {
      return (n + detail::direct_block_bytes - 1) / detail::direct_block_bytes * detail::direct_block_bytes;
    };
    std::uint64_t total = 0;
    for (const piece& p : mine) total += aligned(job_.layout.bytes(p));
    try {
      if (staging_.bytes() < total) {
        staging_ = detail::staging_buffer();  // free the old one first
        staging_ = detail::staging_buffer(total);
      }
    } catch (const std::exception& e) {
      refuse(errc::internal, "cannot allocate the staging buffer of " + std::to_string(total) + " bytes: " + e.what());
      return;
    }
    unsigned char* at = staging_.data();
    job_.sources.clear();
    // A failed copy out of the device path's memory is this rank's problem (raised on every rank
    // by the save's agreement); no copy still writes into the staging afterwards.
    try {
      for (std::size_t k = 0; k < mine.size(); ++k) {
        const std::uint64_t n = job_.layout.bytes(mine[k]);
        if (through != nullptr)
          zero::checkpoint_access(*through).copy_to_host(at, sources[k], n);
        else
          std::memcpy(at, sources[k], static_cast<std::size_t>(n));
        job_.sources.push_back(at);
        at += aligned(n);
      }
      if (through != nullptr) zero::checkpoint_access(*through).synchronize();
    } catch (const std::exception& e) {
      if (through != nullptr) zero::checkpoint_access(*through).synchronize_quietly();
      job_.sources.clear();
      const auto* failure = dynamic_cast<const error*>(&e);
      refuse(failure != nullptr ? failure->kind() : errc::internal,
             std::string("copying the model's state out of its memory: ") +
                 (failure != nullptr ? failure->message() : std::string(e.what())));
    }
  }

  /// Writes this rank's file (on any thread); failures become the job's problem.
  void write(job& j) noexcept {
    if (!j.problem.empty()) return;
    try {
      const std::filesystem::path tmp = temporary_directory(root_, j.name);
      detail::make_directories(tmp);
      const shard_file_layout f = make_shard_file_layout(j.layout, j.rank);
      j.checksums =
          write_shard_file(tmp / shard_file_name(j.rank, j.layout.world_size), j.layout, j.rank, f, j.sources);
    } catch (const error& e) {
      j.problem = e.message();
      j.code = e.kind();
    } catch (const std::exception& e) {
      j.problem = std::string("writing the shard file failed: ") + e.what();
      j.code = errc::io_error;
    }
  }

  void launch() {
    if (!job_.problem.empty()) return;  // nothing to write; the next call reports it
    try {
      writer_.start([this] { write(job_); });
    } catch (const std::exception& e) {  // no thread: the agreement at the next call reports it
      refuse(errc::internal, std::string("cannot start the background writer thread: ") + e.what());
    }
  }

  /// The agreement collective and rank 0's commit.
  void finish() {
    pending_ = false;
    job& j = job_;
    const state_layout& L = j.layout;
    std::uint64_t max_sums = 0;
    for (int r = 0; r < L.world_size; ++r) max_sums = std::max(max_sums, L.checksum_count(r));
    const std::size_t words = 3 + static_cast<std::size_t>(max_sums) + detail::text_words;
    std::vector<std::uint64_t> mine(words, 0);
    const std::string progress_text = j.progress.to_json().dump();
    mine[0] = j.problem.empty() ? 0 : static_cast<std::uint64_t>(j.code);
    mine[1] = checksum(progress_text.data(), progress_text.size());
    mine[2] = checksum(j.name.data(), j.name.size());
    if (j.problem.empty())
      for (std::size_t k = 0; k < j.checksums.size() && k < max_sums; ++k) mine[3 + k] = j.checksums[k];
    detail::pack_text(j.problem, mine.data() + 3 + max_sums);
    const ringzero::detail::agreement_table records(detail::gather_records(*j.comm, j.replica, mine), words);
    auto record = [&](int r) { return records.row(static_cast<std::size_t>(r)).data(); };
    const std::string where =
        "checkpoint '" + (root_ / j.name).string() + "' was not saved (the previous checkpoint is untouched): ";
    const detail::verdict failed = detail::verdict_of(records, 3 + max_sums);
    if (!failed.text.empty()) {
      if (j.rank == 0) cleanup(j.name);
      throw error(failed.code, where + failed.text);
    }
    for (int r = 1; r < L.world_size; ++r) {
      if (record(r)[1] != record(0)[1]) {
        if (j.rank == 0) cleanup(j.name);
        throw error(errc::invalid_argument,
                    where + "rank " + std::to_string(r) +
                        " passed another training_progress than rank 0 (every rank must pass the same values)");
      }
      if (record(r)[2] != record(0)[2]) {
        if (j.rank == 0) cleanup(j.name);
        throw error(errc::invalid_argument,
                    where + "rank " + std::to_string(r) + " named the checkpoint differently from rank 0");
      }
    }
    // Rank 0 commits; a second small collective tells every rank whether it could.
    std::string problem;
    errc commit_code = errc::io_error;
    if (j.rank == 0) {
      try {
        std::vector<std::vector<std::uint64_t>> sums(static_cast<std::size_t>(L.world_size));
        for (int r = 0; r < L.world_size; ++r) {
          const auto n = static_cast<std::size_t>(L.checksum_count(r));
          sums[static_cast<std::size_t>(r)].assign(record(r) + 3, record(r) + 3 + n);
        }
        commit_checkpoint(root_, j.name, make_index(L, j.progress, sums), options_.keep_last);
      } catch (const error& e) {
        problem = e.message();
        commit_code = e.kind();
      } catch (const std::exception& e) {
        problem = e.what();
        commit_code = errc::internal;
      }
      std::error_code ec;
      if (!problem.empty() && !std::filesystem::exists(root_ / j.name / index_file_name, ec)) cleanup(j.name);
    }
    const detail::verdict v = detail::agree(*j.comm, j.replica, problem, commit_code);
    if (!v.text.empty())
      throw error(v.code, "checkpoint '" + (root_ / j.name).string() +
                              "': the commit (index, rename, latest) failed on " + v.text);
  }

  void cleanup(const std::string& name) noexcept {
    try {
      detail::remove_tree(latest_temporary_file(root_, name));
      detail::remove_tree(temporary_directory(root_, name));
    } catch (...) {}
  }

  std::filesystem::path root_;
  checkpointer_options options_;
  job job_;
  bool pending_ = false;
  detail::staging_buffer staging_;
  root_lock lock_;                    ///< held by global rank 0 from `open` on
  bool opened_ = false;               ///< `open` succeeded (on every rank)
  detail::zero_spare spare_;          ///< `load`'s second copy of a model's state
  detail::background_writer writer_;  ///< last: its thread ends before the members its task uses
};

}  // namespace ringzero::checkpoint
