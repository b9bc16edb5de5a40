#pragma once
/// @file
/// How a buffer of `count` elements is split into per-rank blocks, in 64-bit arithmetic (counts beyond
/// 2^32 tile exactly).
///
/// `partition(count, parts, granule)` gives `parts` contiguous blocks that tile [0, count):
/// every block but possibly the last non-empty one is a multiple of `granule` elements (a cache
/// line's worth, so blocks start on cache lines when the buffer does); counts that do not divide
/// give the remainder granules to the first blocks, and trailing blocks may be empty.
/// Pure, constexpr and allocation-free.

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ringzero::algorithms {

/// A half-open range of element indices [begin, end).
struct range {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  constexpr std::uint64_t size() const noexcept { return end - begin; }
  constexpr bool empty() const noexcept { return end == begin; }
  friend constexpr bool operator==(const range&, const range&) = default;
};

/// The block split of `count` elements into `parts` blocks of whole `granule`s (see file comment).
/// Preconditions: parts >= 1, granule >= 1.
struct partition {
  std::uint64_t count = 0;
  std::uint64_t parts = 1;
  std::uint64_t granule = 1;

  constexpr partition(std::uint64_t count_, int parts_, std::uint64_t granule_ = 1) noexcept
      : count(count_),
        parts(static_cast<std::uint64_t>(parts_ < 1 ? 1 : parts_)),
        granule(granule_ < 1 ? 1 : granule_) {}

  /// First element of block i (0 <= i <= parts; block `parts` starts at `count`).
  constexpr std::uint64_t start(std::uint64_t i) const noexcept {
    const std::uint64_t units = count / granule + (count % granule != 0 ? 1 : 0);
    const std::uint64_t q = units / parts;
    const std::uint64_t r = units % parts;
    const std::uint64_t first_unit = i * q + std::min(i, r);  // <= units, no overflow
    // first_unit * granule may exceed 2^64 only when it is past count; clamp before multiplying.
    if (first_unit >= count / granule + 1) return count;
    return std::min(count, first_unit * granule);
  }

  /// Block i (0 <= i < parts).
  constexpr range block(std::uint64_t i) const noexcept { return {start(i), start(i + 1)}; }

  /// Elements [block(first).begin, block(last - 1).end): blocks first..last-1 together.
  constexpr range blocks(std::uint64_t first, std::uint64_t last) const noexcept { return {start(first), start(last)}; }
};

/// Elements per cache line for an element of `element_size` bytes (at least 1): the granule of
/// every partition ringzero's algorithms use.
constexpr std::uint64_t cache_line_granule(std::size_t element_size) noexcept {
  return element_size >= 64 ? 1 : 64 / (element_size == 0 ? 1 : element_size);
}

/// `x` modulo `n` for possibly negative `x` (ring arithmetic on ranks).
constexpr int ring_mod(std::int64_t x, int n) noexcept {
  const std::int64_t m = x % n;
  return static_cast<int>(m < 0 ? m + n : m);
}

/// The ring reduce-scatter schedule (Patarasuk & Yuan 2009): at step k (0 <= k < n-1) rank r
/// sends block `ring_rs_send_block(r, k, n)` to rank r+1 and combines the block
/// `ring_rs_recv_block(r, k, n)` received from rank r-1 into its own. After the last step rank r
/// holds the fully reduced block r. The block sent at step 0 is the rank's raw input.
constexpr int ring_rs_send_block(int r, int k, int n) noexcept { return ring_mod(std::int64_t{r} - 1 - k, n); }
/// See `ring_rs_send_block`.
constexpr int ring_rs_recv_block(int r, int k, int n) noexcept { return ring_mod(std::int64_t{r} - 2 - k, n); }

/// The ring all-gather schedule: at step k rank r sends block r-k to r+1 and receives block
/// r-k-1 from r-1; starting from its own block r it holds every block after n-1 steps.
constexpr int ring_ag_send_block(int r, int k, int n) noexcept { return ring_mod(std::int64_t{r} - k, n); }
/// See `ring_ag_send_block`.
constexpr int ring_ag_recv_block(int r, int k, int n) noexcept { return ring_mod(std::int64_t{r} - k - 1, n); }

/// Recursive halving / doubling on world sizes that are not powers of two (Thakur, Rabenseifner
/// & Gropp 2005): with p = the largest power of two <= n and rem = n - p, each even rank below
/// 2*rem folds into its odd neighbour; the remaining p ranks are numbered 0..p-1 ("virtual ranks")
/// and each owns a group of one or two consecutive original blocks.
struct hd_layout {
  int n = 1;
  int p = 1;    ///< largest power of two <= n
  int rem = 0;  ///< n - p

  constexpr explicit hd_layout(int world_size) noexcept : n(world_size) {
    while (p * 2 <= n) p *= 2;
    rem = n - p;
  }
  /// Virtual rank of rank r, or -1 for an even rank below 2*rem (folded away).
  constexpr int virtual_rank(int r) const noexcept {
    if (r < 2 * rem) return (r % 2 == 1) ? r / 2 : -1;
    return r - rem;
  }
  /// The rank that plays virtual rank v.
  constexpr int real_rank(int v) const noexcept { return v < rem ? 2 * v + 1 : v + rem; }
  /// First original block of virtual rank v's group (groups tile the blocks in order; v may be p).
  constexpr int first_block(int v) const noexcept { return v < rem ? 2 * v : v + rem; }
  /// log2(p): number of halving (and of doubling) steps.
  constexpr int steps() const noexcept {
    int s = 0;
    while ((1 << s) < p) ++s;
    return s;
  }
};

}  // namespace ringzero::algorithms
