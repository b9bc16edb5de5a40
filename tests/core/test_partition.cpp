// Block partitions and ring schedules in 64-bit arithmetic (cases C10 and C11).
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "ringzero/algorithms/partition.hpp"

using namespace ringzero::algorithms;

TEST_CASE("partitions tile [0, count) exactly, with empty trailing blocks allowed (C10)") {
  for (std::uint64_t count : {0ull, 1ull, 3ull, 7ull, 16ull, 17ull, 1000003ull}) {
    for (int parts : {1, 2, 3, 4, 5, 8, 13}) {
      for (std::uint64_t granule : {1ull, 4ull, 16ull}) {
        const partition p(count, parts, granule);
        std::uint64_t at = 0;
        bool seen_empty = false;
        for (int i = 0; i < parts; ++i) {
          const range b = p.block(static_cast<std::uint64_t>(i));
          REQUIRE(b.begin == at);
          REQUIRE(b.end >= b.begin);
          if (b.empty())
            seen_empty = true;
          else
            REQUIRE_FALSE(seen_empty);  // only trailing blocks are empty
          if (b.end != count) REQUIRE(b.size() % granule == 0);
          at = b.end;
        }
        REQUIRE(at == count);
      }
    }
  }
}

TEST_CASE("C11: 3*2^31+5 elements of 8 bytes on world 5 tile exactly in 64 bits") {
  const std::uint64_t count = 3ull * (1ull << 31) + 5;
  const partition p(count, 5, cache_line_granule(8));
  std::uint64_t at = 0, total = 0;
  for (int i = 0; i < 5; ++i) {
    const range b = p.block(static_cast<std::uint64_t>(i));
    CHECK(b.begin == at);
    at = b.end;
    total += b.size();
    CHECK(b.size() > (1ull << 30));  // offsets beyond 2^32 bytes are representable
  }
  CHECK(at == count);
  CHECK(total == count);
  CHECK(p.start(5) * 8 > (1ull << 32));
  // and the ring schedule visits every block once per phase on every rank
  const int n = 5;
  for (int r = 0; r < n; ++r) {
    std::set<int> recv_blocks;
    for (int k = 0; k < n - 1; ++k) recv_blocks.insert(ring_rs_recv_block(r, k, n));
    CHECK(recv_blocks.size() == static_cast<std::size_t>(n - 1));
    CHECK(ring_rs_recv_block(r, n - 2, n) == r);  // rank r finishes with block r
    CHECK(recv_blocks.count(ring_rs_send_block(r, 0, n)) == 0);
  }
}

TEST_CASE("huge counts near 2^64 do not overflow") {
  const std::uint64_t count = ~0ull - 3;
  const partition p(count, 7, 64);
  std::uint64_t at = 0;
  for (int i = 0; i < 7; ++i) {
    const range b = p.block(static_cast<std::uint64_t>(i));
    CHECK(b.begin == at);
    at = b.end;
  }
  CHECK(at == count);
}

TEST_CASE("halving-doubling layout for non-powers of two") {
  for (int n = 1; n <= 33; ++n) {
    const hd_layout L(n);
    CHECK(L.p + L.rem == n);
    CHECK((L.p & (L.p - 1)) == 0);
    std::vector<int> seen(static_cast<std::size_t>(n), 0);
    for (int v = 0; v < L.p; ++v) {
      CHECK(L.virtual_rank(L.real_rank(v)) == v);
      for (int b = L.first_block(v); b < L.first_block(v + 1); ++b) ++seen[static_cast<std::size_t>(b)];
    }
    for (int c : seen) CHECK(c == 1);
  }
}
