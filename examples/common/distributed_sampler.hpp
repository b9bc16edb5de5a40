#pragma once
/// @file
/// `distributed_sampler`: which training examples each rank reads in an epoch, the way
/// PyTorch's `DistributedSampler` does it (with drop_last=True): every epoch all ranks draw the
/// same permutation, seeded by (seed, epoch), and rank r takes the elements r, r + n, r + 2n, ...
/// of it, where n is the world size; the tail that does not divide by n is dropped so that every
/// rank has the same number of examples.
///
/// A consequence used by the examples and tests: if every rank walks its shard in consecutive
/// micro-batches of b examples, the union of the ranks' s-th micro-batches is exactly the
/// elements [s*n*b, (s+1)*n*b) of the permutation, i.e. the s-th batch of n*b examples a
/// single rank would draw with the same seed. Data-parallel training on n ranks therefore sees
/// the same global batches as training on one rank.
///
/// The permutation is a Fisher-Yates shuffle driven by splitmix64 (Steele, Lea & Flood 2014)
/// with unbiased bounded integers (rejection of the 2^64 mod n lowest values), so it is identical on every platform and
/// compiler (std::shuffle's algorithm is implementation-defined).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/core/error.hpp"

namespace ringzero::examples {

/// splitmix64: a small, fast, well-distributed 64-bit generator.
class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  /// The next 64 random bits.
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// A uniform integer in [0, bound) (bound > 0), without modulo bias: values below
  /// 2^64 mod bound are rejected (the method of OpenBSD's arc4random_uniform).
  std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }
  /// A uniform float in [0, 1).
  float uniform() noexcept { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

 private:
  std::uint64_t state_;
};

/// Per-epoch shards of [0, dataset_size) for one rank (see the file comment).
/// Memory: two index arrays of the dataset's size, allocated once; `set_epoch` reuses them.
class distributed_sampler {
 public:
  /// Throws errc::invalid_argument unless 0 <= rank < world_size and dataset_size >= world_size.
  distributed_sampler(std::size_t dataset_size, int world_size, int rank, std::uint64_t seed, bool shuffle = true)
      : size_(dataset_size), world_size_(world_size), rank_(rank), seed_(seed), shuffle_(shuffle) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
      throw error(errc::invalid_argument, "distributed_sampler: rank " + std::to_string(rank) + " outside world of " +
                                              std::to_string(world_size));
    if (dataset_size < static_cast<std::size_t>(world_size))
      throw error(errc::invalid_argument, "distributed_sampler: " + std::to_string(dataset_size) +
                                              " examples cannot be shared by " + std::to_string(world_size) + " ranks");
    permutation_.resize(size_);
    shard_.resize(size_ / static_cast<std::size_t>(world_size_));
    set_epoch(0);
  }

  /// Draws epoch `epoch`'s permutation (identical on every rank) and this rank's shard.
  void set_epoch(std::uint64_t epoch) {
    for (std::size_t i = 0; i < size_; ++i) permutation_[i] = static_cast<std::uint32_t>(i);
    if (shuffle_) {
      splitmix64 rng(seed_ * 0x9e3779b97f4a7c15ull + epoch);
      for (std::size_t i = size_; i > 1; --i) {
        const std::size_t j = static_cast<std::size_t>(rng.below(i));
        std::swap(permutation_[i - 1], permutation_[j]);
      }
    }
    for (std::size_t k = 0; k < shard_.size(); ++k)
      shard_[k] = permutation_[static_cast<std::size_t>(rank_) + k * static_cast<std::size_t>(world_size_)];
  }

  /// This rank's examples for the current epoch (`dataset_size / world_size` indices).
  std::span<const std::uint32_t> indices() const noexcept { return shard_; }
  /// The whole permutation of the current epoch (the same on every rank).
  std::span<const std::uint32_t> permutation() const noexcept { return permutation_; }
  /// Examples per rank per epoch.
  std::size_t shard_size() const noexcept { return shard_.size(); }

 private:
  std::size_t size_;
  int world_size_;
  int rank_;
  std::uint64_t seed_;
  bool shuffle_;
  std::vector<std::uint32_t> permutation_;
  std::vector<std::uint32_t> shard_;
};

}  // namespace ringzero::examples
