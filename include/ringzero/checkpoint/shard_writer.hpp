#pragma once
/// @file
/// `checkpoint::write_shard_file`: writes one rank's shard file — its safetensors header, then
/// each of its pieces from memory — and fsyncs it. A piece whose memory and file offset are
/// 4096-aligned (the model's page-aligned buffers, the staging buffer, the 4 KiB-aligned
/// fragments of a shard file) goes with O_DIRECT straight from that memory to the disk, in
/// requests of up to 64 MiB (no copy into the page cache); the rest (a piece's last partial
/// block, unaligned memory, file systems that refuse O_DIRECT) is written buffered and handed to
/// the disk every 64 MiB (sync_file_range(SYNC_FILE_RANGE_WRITE)). The XXH3 checksum of every
/// 4 MiB chunk is computed on a helper thread while the disk writes (inline if no thread can
/// be started). Errors: errc::io_error naming the file and the system's reason (ENOSPC on a
/// full disk, at the write or at the fsync). Thread semantics: may run on any thread (the
/// asynchronous save's writer); starts one helper thread (which inherits its nice value) and
/// touches nothing but the file and the memory it reads. Needs nlohmann/json and libxxhash.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "ringzero/checkpoint/checksum.hpp"
#include "ringzero/checkpoint/file_io.hpp"
#include "ringzero/checkpoint/state_layout.hpp"

namespace ringzero::checkpoint {

/// Writes rank `rank`'s file of `layout` (`file_layout` = make_shard_file_layout(layout, rank))
/// to `path`, piece k read from `sources[k]`; returns the chunk checksums of its pieces in file
/// order, concatenated. When `bytes_direct` is given, it receives how many bytes the system
/// accepted with O_DIRECT (the rest went buffered). Throws errc::io_error naming `path`.
inline std::vector<std::uint64_t> write_shard_file(const std::filesystem::path& path, const state_layout& layout,
                                                   int rank, const shard_file_layout& file_layout,
                                                   const std::vector<const unsigned char*>& sources,
                                                   std::uint64_t* bytes_direct = nullptr) {
  const auto& mine = layout.pieces[static_cast<std::size_t>(rank)];
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(layout.checksum_count(rank)));
  auto hash_all = [&] {  // every piece's chunks, in file order
    std::size_t i = 0;
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const std::uint64_t bytes = layout.bytes(mine[k]);
      for (std::uint64_t at = 0; at < bytes; at += checksum_chunk_bytes)
        sums[i++] = checksum(sources[k] + at, static_cast<std::size_t>(std::min(checksum_chunk_bytes, bytes - at)));
    }
  };
  detail::file f = detail::file::create(path);
  std::optional<detail::file> direct = detail::file::open_direct_write(path);
  std::jthread hasher;  // joined before `sums` and the sources go away, also when a write throws
  try {
    hasher = std::jthread(hash_all);
  } catch (const std::system_error&) {  // no thread: hashed below, after the writes
  }
  f.write_at(file_layout.header.data(), file_layout.header.size(), 0);
  constexpr std::uint64_t block = detail::direct_block_bytes, request = std::uint64_t{64} << 20;
  // Buffered writes: [unsubmitted, end) holds `pending` bytes written and not yet handed to the disk.
  std::uint64_t unsubmitted = 0, end = file_layout.header.size(), pending = end, direct_total = 0;
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const unsigned char* src = sources[k];
    const std::uint64_t bytes = layout.bytes(mine[k]);
    const std::uint64_t offset = file_layout.offsets[k];
    std::uint64_t done = 0;
    if (direct && reinterpret_cast<std::uintptr_t>(src) % block == 0 && offset % block == 0) {
      const std::uint64_t body = bytes / block * block;
      while (done < body) {
        const std::uint64_t n = std::min(request, body - done);
        const std::uint64_t w = direct->write_direct_at(src + done, n, offset + done);
        done += w;
        direct_total += w;
        if (w < n) {  // refused (EINVAL): this and every later piece go buffered
          direct.reset();
          break;
        }
      }
    }
    while (done < bytes) {
      const std::uint64_t n = std::min(request, bytes - done);
      f.write_at(src + done, n, offset + done);
      done += n;
      pending += n;
      end = std::max(end, offset + done);
      if (pending >= request) {
        f.start_writeback(unsubmitted, end - unsubmitted);
        unsubmitted = end;
        pending = 0;
      }
    }
  }
  f.sync();  // the inode's data (direct and buffered) and metadata
  if (bytes_direct != nullptr) *bytes_direct = direct_total;
  if (direct) direct->close();
  f.close();
  if (hasher.joinable())
    hasher.join();
  else
    hash_all();
  return sums;
}

}  // namespace ringzero::checkpoint
