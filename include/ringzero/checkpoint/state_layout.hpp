#pragma once
/// @file
/// `checkpoint::state_layout`: what a save writes, independent of where the state comes from (a
/// `zero::sharded_model` or a DDP trainer's replicated tensors): the tensors (name, role,
/// dtype, global shape) and, for every rank of the job, the pieces of them it writes (global
/// flat element ranges). Every rank computes the whole layout from values all ranks share, so
/// rank 0 can write the index of every rank's file without receiving anything but checksums,
/// and every rank knows how long every rank's agreement record is.
/// `shard_file_layout` turns one rank's pieces into its safetensors header and the byte offset
/// of each piece. Needs nlohmann/json and libxxhash (`ringzero-checkpoint`). Pure values.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/checksum.hpp"
#include "ringzero/checkpoint/safetensors.hpp"
#include "ringzero/core/dtype.hpp"

namespace ringzero::checkpoint {

/// A tensor as a save describes it (a `tensor_record` without fragments).
struct tensor_spec {
  std::string name;
  tensor_role role = tensor_role::parameter;
  int state = 0;
  std::string state_name;
  dtype type = dtype::float32;
  std::vector<std::uint64_t> shape;
  bool trainable = true;
  std::string tied_to;

  std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;
    return n;
  }
};

/// A piece of tensor `tensor` (an index into `state_layout::tensors`): global flat elements
/// [begin, end), non-empty.
struct piece {
  std::size_t tensor = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// See the file comment.
struct state_layout {
  std::string kind = "zero";
  int world_size = 1;
  int stage = 0;
  int replica_group_size = 1;
  std::uint64_t alignment_bytes = 0;
  std::uint64_t plan_fingerprint = 0;
  nlohmann::json optimizer = nlohmann::json::object();
  nlohmann::json extra = nlohmann::json::object();
  std::vector<tensor_spec> tensors;
  std::vector<std::vector<piece>> pieces;  ///< by rank: what that rank writes, in file order

  /// Bytes of piece `p`.
  std::uint64_t bytes(const piece& p) const noexcept { return (p.end - p.begin) * dtype_size(tensors[p.tensor].type); }
  /// Checksums rank `rank`'s file has (the sum of its pieces' chunk counts).
  std::uint64_t checksum_count(int rank) const noexcept {
    std::uint64_t n = 0;
    for (const piece& p : pieces[static_cast<std::size_t>(rank)]) n += chunk_count(bytes(p));
    return n;
  }
  /// XXH3 of every tensor's name, role, state, dtype, shape and tie: equal for the same model
  /// and optimizer whatever the world size, stage or alignment.
  std::uint64_t model_fingerprint() const { return model_fingerprint_of(tensors); }
};

/// The name of rank `rank`'s shard file: "rank-00003-of-00008.safetensors".
inline std::string shard_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

/// Rank `rank`'s file: its header bytes, the absolute offset of each piece, the total size.
struct shard_file_layout {
  std::string header;
  std::vector<std::uint64_t> offsets;
  std::uint64_t bytes = 0;
};

/// The alignment of every fragment's data in the shard files a save writes (bytes from the start
/// of the file): a multiple of common disks' logical block sizes, so a load can read fragments
/// with O_DIRECT. Readers take offsets from the index: files of 8-byte alignment (written
/// before 2026-12-02) load as well.
inline constexpr std::uint64_t shard_data_alignment = 4096;

/// The name of the safetensors tensor of zero bytes (U8) that fills the gap before a fragment
/// so that its data starts at a multiple of `shard_data_alignment` (safetensors has no gaps:
/// its tensors tile the data section). Loaders ignore these (a fragment key always has a '#').
inline std::string padding_key(std::size_t k) { return "__padding__." + std::to_string(k); }

/// The file layout of rank `rank` in `layout`: every piece's data at a multiple of
/// `data_alignment` bytes from the start of the file, after a padding tensor where needed.
inline shard_file_layout make_shard_file_layout(const state_layout& layout, int rank,
                                                std::uint64_t data_alignment = shard_data_alignment) {
  std::vector<safetensors_entry> entries;
  const auto& mine = layout.pieces[static_cast<std::size_t>(rank)];
  std::vector<std::uint64_t> relative;  // each piece's offset in the data section
  std::uint64_t at = 0;
  for (const piece& p : mine) {
    const tensor_spec& t = layout.tensors[p.tensor];
    if (const std::uint64_t gap = (data_alignment - at % data_alignment) % data_alignment; gap != 0) {
      entries.push_back({padding_key(entries.size()), dtype::uint8, {gap}, gap});
      at += gap;
    }
    relative.push_back(at);
    entries.push_back(
        {fragment_key(t.name, t.role, t.state, p.begin, p.end), t.type, {p.end - p.begin}, layout.bytes(p)});
    at += layout.bytes(p);
  }
  const std::map<std::string, std::string> metadata = {
      {"format", std::string(format_name)}, {"format_version", std::to_string(format_version)}, {"kind", layout.kind},
      {"rank", std::to_string(rank)},       {"world_size", std::to_string(layout.world_size)},
  };
  shard_file_layout f;
  f.header = encode_safetensors_header(entries, metadata, data_alignment);
  for (std::uint64_t r : relative) f.offsets.push_back(f.header.size() + r);
  f.bytes = f.header.size() + at;
  return f;
}

/// The index of a save of `layout` whose ranks computed `checksums` (by rank: the chunk
/// checksums of its pieces in file order, concatenated).
inline checkpoint_index make_index(const state_layout& layout, const training_progress& progress,
                                   const std::vector<std::vector<std::uint64_t>>& checksums) {
  checkpoint_index x;
  x.kind = layout.kind;
  x.world_size = layout.world_size;
  x.stage = layout.stage;
  x.replica_group_size = layout.replica_group_size;
  x.alignment_bytes = layout.alignment_bytes;
  x.plan_fingerprint = layout.plan_fingerprint;
  x.model_fingerprint = layout.model_fingerprint();
  x.optimizer = layout.optimizer;
  x.extra = layout.extra;
  x.progress = progress;
  for (const tensor_spec& t : layout.tensors) {
    tensor_record r;
    r.name = t.name;
    r.role = t.role;
    r.state = t.state;
    r.state_name = t.state_name;
    r.type = t.type;
    r.shape = t.shape;
    r.trainable = t.trainable;
    r.tied_to = t.tied_to;
    x.tensors.push_back(std::move(r));
  }
  for (int rank = 0; rank < layout.world_size; ++rank) {
    const shard_file_layout f = make_shard_file_layout(layout, rank);
    x.files.push_back({shard_file_name(rank, layout.world_size), rank, f.bytes});
    const auto& mine = layout.pieces[static_cast<std::size_t>(rank)];
    const auto& sums = checksums[static_cast<std::size_t>(rank)];
    std::size_t at = 0;
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const piece& p = mine[k];
      fragment_record fr;
      fr.file = static_cast<std::size_t>(rank);
      fr.begin = p.begin;
      fr.end = p.end;
      fr.offset = f.offsets[k];
      const std::size_t n = static_cast<std::size_t>(chunk_count(layout.bytes(p)));
      fr.checksums.assign(sums.begin() + static_cast<std::ptrdiff_t>(at),
                          sums.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
      x.tensors[p.tensor].fragments.push_back(std::move(fr));
    }
  }
  for (tensor_record& r : x.tensors)
    std::sort(r.fragments.begin(), r.fragments.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  return x;
}

}  // namespace ringzero::checkpoint
