#pragma once
/// @file
/// `detail::fnv1a`: the 64-bit FNV-1a hash (Fowler, Noll and Vo; offset basis and prime from the
/// FNV reference, draft-eastlake-fnv). Every cross-rank fingerprint of ringzero uses it: the
/// ZeRO plan fingerprint (stored in checkpoints, so its value must never change) and the
/// option and parameter hashes that the DDP reducer and the sharded model compare across ranks.
/// Stable across machines, runs and compilers; not a checksum of data (checkpoints use XXH3).

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ringzero::detail {

/// FNV-1a over bytes; integers are fed as 8 little-endian bytes, text as its length then bytes.
class fnv1a {
 public:
  void bytes(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;
  }
  void u64(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) {
      const unsigned char b = static_cast<unsigned char>(v >> (8 * i));
      bytes(&b, 1);
    }
  }
  void text(std::string_view s) noexcept {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  std::uint64_t value() const noexcept { return h_; }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace ringzero::detail
