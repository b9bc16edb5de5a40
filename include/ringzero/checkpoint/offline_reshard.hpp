#pragma once
/// @file
/// `checkpoint::reshard_offline`: rewrites a checkpoint for another world size (and, for a
/// `zero::sharded_model` checkpoint, another stage or replica group size) without a job: the
/// new checkpoint has one shard file per new rank holding what that rank would have written,
/// so it is the checkpoint a save at that world size would have made (byte for byte when the
/// index records the plan request, extra["plan"]; otherwise the plan uses automatic gather
/// units, and loading reads it all the same). Training progress, optimizer description and
/// user metadata are kept. Data streams through one buffer of whole 4 MiB checksum chunks,
/// every source chunk verified, every new chunk checksummed. The output is committed as
/// checkpoints are (checkpoint/checkpoint_directory.hpp): ROOT/.tmp.NAME, index, rename,
/// ROOT/latest; NAME is the source checkpoint's directory name. The output root's lock
/// (checkpoint/root_lock.hpp) is held while writing, and an existing ROOT/NAME is never replaced.
/// Errors: errc::invalid_argument for a bad world size, stage or replica group size (naming
/// it) or one whose files would not fit the output's file system, errc::io_error naming the file for damaged input or a
/// failed write. Needs nlohmann/json and libxxhash (`ringzero-checkpoint`). Manual: docs/checkpoint.md.

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/checkpoint/checkpoint_directory.hpp"
#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/fragment_reader.hpp"
#include "ringzero/checkpoint/root_lock.hpp"
#include "ringzero/checkpoint/state_layout.hpp"
#include "ringzero/checkpoint/zero_state.hpp"
#include "ringzero/zero/shard_plan.hpp"

namespace ringzero::checkpoint {

/// The most rank files `reshard_offline` writes (a world size above it is refused before any
/// planning): 2^20, beyond any data-parallel job run today, and a bound on one directory's entries.
inline constexpr int max_reshard_files = 1 << 20;

/// Options of `reshard_offline`.
struct reshard_options {
  int world_size = 1;                     ///< ranks of the new checkpoint (>= 1)
  std::optional<int> stage;               ///< zero checkpoints: the new stage (0-3); unset: the saved one
  std::optional<int> replica_group_size;  ///< zero: ranks per replica group (0: all); unset: all
  std::uint64_t buffer_bytes = std::uint64_t{16} << 20;  ///< streaming buffer (whole 4 MiB chunks)
};

/// What `reshard_offline` wrote.
struct reshard_result {
  std::filesystem::path directory;  ///< the new checkpoint directory (ROOT/NAME)
  checkpoint_index index;           ///< its index
  bool exact_plan = false;          ///< the plan came from the recorded request (not automatic units)
};

namespace detail {

inline std::optional<dtype> json_dtype(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return std::nullopt;
  const auto t = j.is_string() ? parse_dtype(j.get<std::string>()) : std::nullopt;
  if (!t) throw error(errc::io_error, where + ": the recorded plan has an unknown dtype " + j.dump());
  return t;
}

/// The optimizer options an index records (detail::optimizer_json).
inline zero::optimizer_options optimizer_of(const checkpoint_index& x, const std::string& where) {
  zero::optimizer_options o;
  try {
    const auto kind = zero::parse_optimizer(x.optimizer.at("kind").get<std::string>());
    if (!kind) throw error(errc::io_error, where + ": unknown optimizer " + x.optimizer.at("kind").dump());
    o.kind = *kind;
    o.lr = x.optimizer.at("lr").get<double>();
    o.weight_decay = x.optimizer.at("weight_decay").get<double>();
    o.momentum = x.optimizer.at("momentum").get<double>();
    o.dampening = x.optimizer.at("dampening").get<double>();
    o.nesterov = x.optimizer.at("nesterov").get<bool>();
    o.beta1 = x.optimizer.at("beta1").get<double>();
    o.beta2 = x.optimizer.at("beta2").get<double>();
    o.eps = x.optimizer.at("eps").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::io_error, where + ": the optimizer description is malformed (" + e.what() + ")");
  }
  return o;
}

/// The plan request of a zero checkpoint at `world_size` ranks and `stage`: the recorded one
/// (extra["plan"]) when there is one, else one rebuilt from the tensors (automatic units).
inline zero::plan_request zero_request_of(const checkpoint_index& x, int world_size, int stage, int replica_group_size,
                                          const std::string& where, bool& exact) {
  zero::plan_request q;
  q.world_size = world_size;
  q.stage = stage;
  q.replica_group_size = replica_group_size;
  q.alignment_bytes = x.alignment_bytes;
  exact = x.extra.is_object() && x.extra.contains("plan");
  int states = 0;
  bool master = false;
  for (const tensor_record& t : x.tensors) {
    if (t.role == tensor_role::optimizer_state) states = std::max(states, t.state + 1);
    if (t.role == tensor_role::master) master = true;
  }
  if (exact) {
    try {
      const nlohmann::json& p = x.extra.at("plan");
      q.unit_bytes = p.at("unit_bytes").get<std::uint64_t>();
      q.accumulation_steps = p.at("accumulation_steps").get<int>();
      q.prefetch = p.at("prefetch").get<bool>();
      if (p.contains("reshard_after_forward")) {  // absent before it existed: all
        const std::string policy = p.at("reshard_after_forward").get<std::string>();
        const auto parsed = zero::parse_reshard_policy(policy);
        if (!parsed)
          throw error(errc::io_error, where + ": the recorded plan has reshard_after_forward '" + policy +
                                          "' (expected all, except_last or none)");
        q.reshard_after_forward = *parsed;
      }
      q.max_inflight_reductions = p.at("max_inflight_reductions").get<int>();
      if (p.contains("keep_frozen_bytes"))  // absent before it existed: 0
        q.keep_frozen_bytes = p.at("keep_frozen_bytes").get<std::uint64_t>();
      const nlohmann::json& pr = p.at("precision");
      q.precision.parameter = json_dtype(pr.at("parameter"), where).value_or(dtype::float32);
      q.precision.gradient = json_dtype(pr.at("gradient"), where);
      q.precision.master = json_dtype(pr.at("master"), where);
      q.precision.optimizer_state = json_dtype(pr.at("optimizer_state"), where).value_or(dtype::float32);
      q.precision.optimizer_states = pr.at("optimizer_states").get<int>();
      for (const nlohmann::json& e : p.at("parameters")) {
        zero::parameter_spec s;
        s.name = e.at("name").get<std::string>();
        s.unit = e.at("unit").get<std::string>();
        s.tie_group = e.at("tie_group").get<std::string>();
        s.type = json_dtype(e.at("type"), where);
        s.trainable = e.at("trainable").get<bool>();
        const tensor_record* r = x.find(s.name, tensor_role::parameter);
        if (r == nullptr)
          throw error(errc::io_error,
                      where + ": the recorded plan names parameter '" + s.name + "', which the index lacks");
        s.shape = r->shape;
        q.parameters.push_back(std::move(s));
      }
    } catch (const nlohmann::json::exception& e) {
      throw error(errc::io_error, where + ": the recorded plan (extra.plan) is malformed (" + e.what() + ")");
    }
    return q;
  }
  q.precision.optimizer_states = states;
  if (master) q.precision.master = dtype::float32;
  for (const tensor_record& t : x.tensors) {
    if (t.role != tensor_role::parameter) continue;
    zero::parameter_spec s;
    s.name = t.name;
    s.shape = t.shape;
    s.type = t.type;
    s.trainable = t.trainable;
    const bool owner =
        std::any_of(x.tensors.begin(), x.tensors.end(), [&](const tensor_record& o) { return o.tied_to == t.name; });
    if (!t.tied_to.empty())
      s.tie_group = t.tied_to;
    else if (owner)
      s.tie_group = t.name;
    q.parameters.push_back(std::move(s));
  }
  return q;
}

/// The layout of the new checkpoint (every rank's pieces).
inline state_layout reshard_layout(const checkpoint_index& x, const reshard_options& o, const std::string& where,
                                   bool& exact) {
  if (o.world_size < 1 || o.world_size > (1 << 24))
    throw error(errc::invalid_argument,
                "reshard: the world size must be from 1 to 16777216, got " + std::to_string(o.world_size));
  if (x.kind == "replicated") {
    if ((o.stage && *o.stage != 0) || o.replica_group_size)
      throw error(
          errc::invalid_argument,
          where + " is a data-parallel (replicated) checkpoint: it has no ZeRO stage or replica groups to change");
    state_layout L;
    L.kind = x.kind;
    L.world_size = o.world_size;
    L.optimizer = x.optimizer;
    L.extra = x.extra;
    const auto w = static_cast<std::uint64_t>(o.world_size);
    L.pieces.resize(w);
    for (const tensor_record& t : x.tensors) {
      L.tensors.push_back({t.name, t.role, t.state, t.state_name, t.type, t.shape, t.trainable, t.tied_to});
      const std::uint64_t n = t.numel();
      for (std::uint64_t r = 0; r < w && t.tied_to.empty(); ++r) {
        const std::uint64_t b = n / w * r + std::min(r, n % w), e = n / w * (r + 1) + std::min(r + 1, n % w);
        if (b < e) L.pieces[static_cast<std::size_t>(r)].push_back({L.tensors.size() - 1, b, e});
      }
    }
    exact = true;
    return L;
  }
  const int stage = o.stage.value_or(x.stage);
  if (stage < 0 || stage > 3)
    throw error(errc::invalid_argument, "reshard: the stage must be 0-3, got " + std::to_string(stage));
  const zero::optimizer_options opt = optimizer_of(x, where);
  const zero::shard_plan plan(zero_request_of(x, o.world_size, stage, o.replica_group_size.value_or(0), where, exact));
  const zero_tensors z(plan, opt);
  state_layout L = zero_layout(plan, opt, z, nullptr);
  if (L.model_fingerprint() != x.model_fingerprint)
    throw error(errc::io_error,
                where + ": the model rebuilt from the index (" + std::to_string(z.tensors.size()) +
                    " tensors) does not match the checkpoint's model fingerprint: the index is inconsistent");
  return L;
}

/// Refuses (errc::invalid_argument, saying what it would write) a reshard whose files would not
/// fit the file system of `output_root` (its nearest existing ancestor): fewer free bytes than
/// the data plus one alignment block per file and per fragment (each starts at a multiple of
/// `shard_data_alignment`), or fewer free inodes than files. A world size of 16,777,216 on a
/// small model is refused here instead of writing millions of files.
inline void check_room_for(const state_layout& L, const std::filesystem::path& output_root) {
  std::uint64_t bytes = 0, fragments = 0;
  for (const auto& mine : L.pieces)
    for (const piece& p : mine) {
      bytes += L.bytes(p);
      ++fragments;
    }
  const auto files = static_cast<std::uint64_t>(L.world_size);
  bytes += (files + fragments) * shard_data_alignment;
  std::filesystem::path at = output_root.empty() ? std::filesystem::path(".") : output_root;
  std::error_code ec;
  while (!std::filesystem::exists(at, ec) && at.has_parent_path() && at.parent_path() != at) at = at.parent_path();
  struct statvfs v {};
  if (::statvfs(at.c_str(), &v) != 0) return;  // unknown: the writes report a full disk themselves
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  const std::uint64_t free_files = static_cast<std::uint64_t>(v.f_favail);
  const bool inodes_counted = v.f_files > 0;  // some file systems report no inode counts at all
  if (bytes > free_bytes || (inodes_counted && files + 2 > free_files))
    throw error(errc::invalid_argument, "reshard: " + std::to_string(files) + " rank file(s) of about " +
                                            std::to_string(bytes) + " bytes in all would not fit the file system of '" +
                                            at.string() + "' (" + std::to_string(free_bytes) + " bytes and " +
                                            (inodes_counted ? std::to_string(free_files) : std::string("uncounted")) +
                                            " inodes free); choose a smaller --world-size or another output");
}

}  // namespace detail

/// Reshards the checkpoint at `path` (a checkpoint directory, or a root whose `latest` names
/// one) into the root `output_root` (see the file comment). `output_root` must not be the
/// source's root.
inline reshard_result reshard_offline(const std::filesystem::path& path, const std::filesystem::path& output_root,
                                      const reshard_options& o) {
  const std::filesystem::path dir = resolve_checkpoint(path);
  const checkpoint_index x = read_index(dir);
  const std::string where = "checkpoint '" + dir.string() + "'";
  std::error_code ec;
  if (std::filesystem::exists(output_root, ec) && std::filesystem::equivalent(output_root, dir.parent_path(), ec))
    throw error(errc::invalid_argument, "reshard: the output root '" + output_root.string() +
                                            "' is the source's own root; choose another directory");
  if (o.world_size > max_reshard_files)
    throw error(errc::invalid_argument,
                "reshard: a world size of " + std::to_string(o.world_size) + " would write " +
                    std::to_string(o.world_size) + " rank file(s) into one directory; at most " +
                    std::to_string(max_reshard_files) + " are written (choose a smaller world size)");
  reshard_result result;
  state_layout L = detail::reshard_layout(x, o, where, result.exact_plan);
  fragment_reader reader(dir, x);
  reader.check_files();
  detail::check_room_for(L, output_root);

  std::string name = dir.filename().string();
  if (name.empty() || name.front() == '.') name = default_checkpoint_name(x.progress.optimizer_steps);
  // The output root's lock for the whole write (a job saving there is refused, and refuses this
  // while it holds the root), and no complete checkpoint of that name is ever replaced.
  const root_lock lock = root_lock::acquire(output_root);
  if (std::filesystem::exists(std::filesystem::symlink_status(output_root / name, ec)))
    throw error(errc::invalid_argument, "reshard: '" + (output_root / name).string() +
                                            "' exists and is never replaced: choose another output root");
  const std::filesystem::path tmp = temporary_directory(output_root, name);
  detail::make_directories(tmp);
  const std::uint64_t chunks = std::max<std::uint64_t>(1, o.buffer_bytes / checksum_chunk_bytes);
  std::vector<unsigned char> buffer(static_cast<std::size_t>(chunks * checksum_chunk_bytes));
  std::vector<std::vector<std::uint64_t>> sums(static_cast<std::size_t>(L.world_size));
  try {
    for (int r = 0; r < L.world_size; ++r) {
      const shard_file_layout fl = make_shard_file_layout(L, r);
      detail::file f = detail::file::create(tmp / shard_file_name(r, L.world_size));
      f.write_at(fl.header.data(), fl.header.size(), 0);
      const auto& mine = L.pieces[static_cast<std::size_t>(r)];
      for (std::size_t k = 0; k < mine.size(); ++k) {
        const tensor_spec& t = L.tensors[mine[k].tensor];
        const tensor_record* src = x.find(t.name, t.role, t.state);
        if (src == nullptr) throw error(errc::io_error, where + ": tensor '" + t.name + "' is missing from the index");
        const std::uint64_t es = dtype_size(t.type), step = buffer.size() / es;
        for (std::uint64_t b = mine[k].begin; b < mine[k].end; b += step) {
          const std::uint64_t e = std::min(mine[k].end, b + step);
          reader.read(*src, b, e, buffer.data());
          const std::vector<std::uint64_t> s = chunk_checksums(buffer.data(), (e - b) * es);
          sums[static_cast<std::size_t>(r)].insert(sums[static_cast<std::size_t>(r)].end(), s.begin(), s.end());
          f.write_at(buffer.data(), (e - b) * es, fl.offsets[k] + (b - mine[k].begin) * es);
        }
      }
      f.sync();
      f.close();
    }
    result.index = make_index(L, x.progress, sums);
    commit_checkpoint(output_root, name, result.index, 0);
  } catch (...) {
    std::filesystem::remove_all(tmp, ec);
    std::filesystem::remove(latest_temporary_file(output_root, name), ec);
    throw;
  }
  result.directory = output_root / name;
  return result;
}

}  // namespace ringzero::checkpoint
