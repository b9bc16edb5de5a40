#pragma once
/// @file
/// `checkpoint::write_shard_file`: writes one rank's shard file — its safetensors header, then
/// each of its pieces from memory — and fsyncs it. Each 4 MiB checksum chunk is hashed (XXH3)
/// and written right away, while it is still in the processor's cache, and every 64 MiB written
/// is handed to the disk at once (Linux sync_file_range(SYNC_FILE_RANGE_WRITE)), so the disk
/// writes while the next chunks are hashed and copied and the final fsync finds little left.
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
inline std::vector<std::uint64_t> write_shard_file(const std::filesystem::path& path, const state_layout& layout,
                                                   int rank, const shard_file_layout& file_layout,
                                                   const std::vector<const unsigned char*>& sources) {
  const auto& mine = layout.pieces[static_cast<std::size_t>(rank)];
  std::vector<std::uint64_t> sums;
  sums.reserve(static_cast<std::size_t>(layout.checksum_count(rank)));
  detail::file f = detail::file::create(path);
  f.write_at(file_layout.header.data(), file_layout.header.size(), 0);
  constexpr std::uint64_t writeback_bytes = std::uint64_t{64} << 20;
  std::uint64_t unsubmitted = 0,
                end = file_layout.header.size();  // [unsubmitted, end) is written, not yet handed to the disk
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const unsigned char* src = sources[k];
    const std::uint64_t bytes = layout.bytes(mine[k]);
    const std::uint64_t offset = file_layout.offsets[k];
    for (std::uint64_t at = 0; at < bytes; at += checksum_chunk_bytes) {
      const std::uint64_t n = std::min(checksum_chunk_bytes, bytes - at);
      sums.push_back(checksum(src + at, static_cast<std::size_t>(n)));
      f.write_at(src + at, n, offset + at);
      end = std::max(end, offset + at + n);
      if (end - unsubmitted >= writeback_bytes) {
        f.start_writeback(unsubmitted, end - unsubmitted);
        unsubmitted = end;
      }
    }
  }
  f.sync();
  f.close();
  return sums;
}

}  // namespace ringzero::checkpoint
