#pragma once
/// @file
/// `checkpoint::write_shard_file`: writes one rank's shard file — its safetensors header, then
/// each of its pieces from memory — computing the XXH3 checksum of every 4 MiB chunk as it goes,
/// and fsyncs it. Pieces that lie back to back both in memory and in the file (a staging copy
/// is laid out like the file) are written with one pwrite of up to 256 MiB.
/// Errors: errc::io_error naming the file and the system's reason (ENOSPC on a full disk, at
/// the write or at the fsync). Thread semantics: may run on any thread (the asynchronous save's
/// writer); touches nothing but the file and the memory it reads.
/// Needs nlohmann/json and libxxhash (`ringzero-checkpoint`).

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "ringzero/checkpoint/checksum.hpp"
#include "ringzero/checkpoint/file_io.hpp"
#include "ringzero/checkpoint/state_layout.hpp"

namespace ringzero::checkpoint {

/// Writes rank `rank`'s file of `layout` (`file_layout` = make_shard_file_layout(layout, rank))
/// to `path`, piece k read from `sources[k]`; returns the chunk checksums of its pieces in file
/// order, concatenated. Throws errc::io_error naming `path`.
inline std::vector<std::uint64_t> write_shard_file(const std::filesystem::path& path, const state_layout& layout, int rank,
                                                   const shard_file_layout& file_layout,
                                                   const std::vector<const unsigned char*>& sources) {
  const auto& mine = layout.pieces[static_cast<std::size_t>(rank)];
  std::vector<std::uint64_t> sums;
  sums.reserve(static_cast<std::size_t>(layout.checksum_count(rank)));
  detail::file f = detail::file::create(path);
  f.write_at(file_layout.header.data(), file_layout.header.size(), 0);
  constexpr std::uint64_t max_run = std::uint64_t{256} << 20;
  const unsigned char* run = nullptr;
  std::uint64_t run_bytes = 0, run_offset = 0;
  auto flush = [&] {
    if (run_bytes > 0) f.write_at(run, run_bytes, run_offset);
    run = nullptr;
    run_bytes = 0;
  };
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const unsigned char* src = sources[k];
    const std::uint64_t bytes = layout.bytes(mine[k]);
    const std::uint64_t offset = file_layout.offsets[k];
    const std::vector<std::uint64_t> piece_sums = chunk_checksums(src, bytes);
    sums.insert(sums.end(), piece_sums.begin(), piece_sums.end());
    if (run != nullptr && run + run_bytes == src && run_offset + run_bytes == offset && run_bytes + bytes <= max_run) {
      run_bytes += bytes;
      continue;
    }
    flush();
    run = src;
    run_bytes = bytes;
    run_offset = offset;
    if (run_bytes >= max_run) flush();
  }
  flush();
  f.sync();
  f.close();
  return sums;
}

}  // namespace ringzero::checkpoint
