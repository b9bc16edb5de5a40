#pragma once
/// @file
/// `checkpoint::chunk_checksums`: how a checkpoint checks its data. Every fragment's bytes are
/// cut into chunks of `checksum_chunk_bytes` (the last one shorter) and each chunk gets its
/// XXH3-64 hash (xxHash by Yann Collet, from the system's libxxhash; seed 0). A reader that needs
/// only part of a fragment reads and verifies just the chunks that cover it.
/// Needs libxxhash (Debian's libxxhash-dev; the Meson dependency `ringzero-checkpoint`).
/// Pure functions; thread-safe.

#include <xxhash.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ringzero::checkpoint {

/// Bytes per checksum chunk (4 MiB): the most a partial read reads beyond what it needs, at each end.
inline constexpr std::uint64_t checksum_chunk_bytes = std::uint64_t{4} << 20;

/// XXH3-64 (seed 0) of `bytes` bytes at `data`.
inline std::uint64_t checksum(const void* data, std::size_t bytes) noexcept { return XXH3_64bits(data, bytes); }

/// Chunks of a fragment of `bytes` bytes (0 for an empty one).
constexpr std::uint64_t chunk_count(std::uint64_t bytes) noexcept {
  return (bytes + checksum_chunk_bytes - 1) / checksum_chunk_bytes;
}

/// The checksum of every chunk of `bytes` bytes at `data`.
inline std::vector<std::uint64_t> chunk_checksums(const void* data, std::uint64_t bytes) {
  std::vector<std::uint64_t> out;
  out.reserve(static_cast<std::size_t>(chunk_count(bytes)));
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::uint64_t at = 0; at < bytes; at += checksum_chunk_bytes) {
    const std::uint64_t n = bytes - at < checksum_chunk_bytes ? bytes - at : checksum_chunk_bytes;
    out.push_back(checksum(p + at, static_cast<std::size_t>(n)));
  }
  return out;
}

/// `value` as 16 lower-case hex digits (how the index writes checksums and fingerprints).
inline std::string hex64(std::uint64_t value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) s[static_cast<std::size_t>(i)] = digits[value & 15];
  return s;
}

/// Parses `hex64` output (exactly 16 hex digits); std::nullopt otherwise.
inline std::optional<std::uint64_t> parse_hex64(std::string_view s) noexcept {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace ringzero::checkpoint
