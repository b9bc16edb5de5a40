#pragma once
/// @file
/// `reproducible_accumulator`: several contributions per rank (one per micro-batch) summed so
/// that the result depends on the multiset of contributions alone, and its all_reduce and
/// reduce_scatter over ranks. Each element keeps a local top bin and one integer limb per kept
/// bin (no carries between bins); the collectives take the global top bin (max over ranks),
/// then sum every rank's words at that bin exactly and round once (docs/numerics.md; the
/// format is primitive/reproducible_sum.hpp, after Demmel & Nguyen's binned summation).
/// float16/bfloat16/float32 elements keep their 3 limbs packed in one int64 for up to 256
/// contributions, then move them to int64 limbs (binned_view): 9 bytes per element per deposit.
/// An accumulator made with a stage keeps its first contributions as plain copies instead
/// (no deposit); its collectives read those directly (docs/numerics.md, "Staged contributions").

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringzero/collective/request.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif
#include "ringzero/primitive/copy.hpp"
#include "ringzero/primitive/reproducible_arrays.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"

namespace ringzero {

class reproducible_accumulator;
work all_reduce_async(communicator& comm, reproducible_accumulator& acc, void* recv, reduce_kind op,
                      const collective_options& options);

/// Binned sums of `count` elements of a floating dtype in host memory.
/// Thread semantics: like a container; add() from one thread at a time, and not while a
/// collective reads the accumulator (asynchronous use is the caller's to order: no add, clear,
/// move or destruction before an all_reduce_async's work on it has completed).
class reproducible_accumulator {
 public:
  /// An empty accumulator for `count` elements of floating `type` (host memory). `stage`: how
  /// many contributions after each clear() are kept as copies (stage * count elements of
  /// `type`, reserved on the first add(), written as used) instead of being deposited; later
  /// ones are deposited. A memory-for-time trade with the same results: a copy costs far less
  /// than a deposit, and the collectives read the copies once. Throws errc::invalid_argument for
  /// an integer or invalid dtype or a count (or stage * count) whose storage overflows.
  reproducible_accumulator(std::uint64_t count, dtype type, std::uint64_t stage = 0)
      : count_(count), type_(type), stage_(stage) {
    if (!is_valid(type) || !primitive::reproducible_supports(type))
      throw error(errc::invalid_argument,
                  "reproducible_accumulator supports float16, bfloat16, float32 and float64, not " +
                      std::string(dtype_name(type)));
    kept_ = primitive::reproducible_kept_bins(type);
    if (count > std::uint64_t{1} << 56 || (count > 0 && stage > (std::uint64_t{1} << 56) / count))
      throw error(errc::invalid_argument, "reproducible_accumulator of " + std::to_string(count) + " elements" +
                                              (stage > 0 ? " with a stage of " + std::to_string(stage) : "") +
                                              " is too large");
    tops_.assign(static_cast<std::size_t>(count), 0);
    if (kept_ == 3)
      packed_.assign(static_cast<std::size_t>(count), 0);  // flushed limbs: on the first flush
    else
      limbs_.assign(static_cast<std::size_t>(count) * static_cast<std::size_t>(kept_), 0);
  }

  /// Deposits one contribution: `values` holds count() elements of type(). Exact: the order of
  /// add() calls never changes any later result. Host memory only. Throws errc::invalid_argument
  /// for a null pointer with count() > 0 or beyond 2^26 contributions (the format's headroom).
  void add(const void* values) {
    if (values == nullptr && count_ > 0)
      throw error(errc::invalid_argument, "reproducible_accumulator::add: values is null");
    if (contributions_ >= primitive::reproducible_max_contributions)
      throw error(errc::invalid_argument, "reproducible_accumulator::add: more than 2^26 contributions");
    if (staged_ < stage_) {
      const std::size_t bytes = static_cast<std::size_t>(count_) * dtype_size(type_);
      const std::size_t need = static_cast<std::size_t>(staged_ + 1) * bytes;
      if (staging_.size() < need) {  // a slot's first use: reserved once, pages touched as slots are used
        if (staging_.capacity() == 0) staging_.reserve(static_cast<std::size_t>(stage_) * bytes);
        staging_.resize(need);
      }
      // A stage larger than the per-core caches is read back from memory by the collective
      // anyway: streaming stores skip the read-for-ownership and leave the caches to the trainer.
      unsigned char* slot = staging_.data() + static_cast<std::size_t>(staged_) * bytes;
      if (static_cast<std::size_t>(stage_) * bytes >= primitive::streaming_threshold_bytes) {
        primitive::copy_bytes_streaming(slot, values, bytes);
        primitive::store_fence();  // before the copy is handed to another thread
      } else {
        primitive::copy_bytes(slot, values, bytes);
      }
      ++staged_;
      ++contributions_;
      return;
    }
    const std::uint64_t deposited = contributions_ - staged_;
    if (kept_ != 3) {
      primitive::accumulate_array(tops_.data(), limbs_.data(), values, count_, type_);
      ++contributions_;
      return;
    }
    // Into an empty accumulator almost every value rises over its top, in the second contribution
    // still about one in ten (measured on example 01's gradients): both skip the within-top pass.
    // The first deposit after construction or clear() overwrites tops and packed limbs
    // (clear() leaves them as they were; no flushed limbs exist then).
    primitive::accumulate_packed_array(tops_.data(), packed_.data(), limbs_.empty() ? nullptr : limbs_.data(), values,
                                       count_, type_, deposited >= 2, deposited == 0);
    if (++packed_contributions_ == primitive::reproducible_packed_contributions) {
      if (limbs_.empty()) limbs_.assign(static_cast<std::size_t>(count_) * 3, 0);
      primitive::flush_packed(tops_.data(), packed_.data(), limbs_.data(), count_);
      packed_contributions_ = 0;
    }
    ++contributions_;
  }

  /// Typed add(): `values.size()` must equal count() and T must be type()'s element type
  /// (errc::invalid_argument otherwise).
  template <element_type T>
  void add(std::span<const T> values) {
    if (dtype_of<T> != type_)
      throw error(errc::invalid_argument,
                  "reproducible_accumulator::add: element type differs from " + std::string(dtype_name(type_)));
    if (values.size() != count_)
      throw error(errc::invalid_argument, "reproducible_accumulator::add: " + std::to_string(values.size()) +
                                              " values for " + std::to_string(count_) + " elements");
    add(static_cast<const void*>(values.data()));
  }

  /// Forgets every contribution (keeps the memory). float16/bfloat16/float32: O(1), the storage
  /// is not cleared (with no contribution nothing reads it, and the next add() overwrites it).
  void clear() noexcept {
    if (kept_ == 3) {
      limbs_.clear();  // the flushed limbs: size 0 until the next flush, capacity kept
    } else {
      std::fill(tops_.begin(), tops_.end(), std::uint8_t{0});
      std::fill(limbs_.begin(), limbs_.end(), std::int64_t{0});
    }
    contributions_ = 0;
    packed_contributions_ = 0;
    staged_ = 0;  // the copies' memory is kept
  }

  /// add() calls since construction / clear().
  std::uint64_t contributions() const noexcept { return contributions_; }
  /// Contributions kept as copies (at most the stage given to the constructor).
  std::uint64_t staged() const noexcept { return staged_; }
  /// Elements per contribution.
  std::uint64_t count() const noexcept { return count_; }
  /// The element type.
  dtype type() const noexcept { return type_; }

  /// The storage as the collectives read it (valid until the next add/clear or destruction).
  primitive::binned_view view() const noexcept {
    return primitive::binned_view{tops_.data(),
                                  limbs_.empty() ? nullptr : limbs_.data(),
                                  count_,
                                  type_,
                                  contributions_,
                                  packed_.empty() ? nullptr : packed_.data(),
                                  staging_.empty() ? nullptr : staging_.data(),
                                  staged_};
  }

 private:
  std::uint64_t count_ = 0;
  dtype type_ = dtype::float32;
  int kept_ = 3;
  std::uint64_t contributions_ = 0;
  std::uint64_t packed_contributions_ = 0;  // K = 3: contributions in packed_ since the last flush
  std::uint64_t stage_ = 0;                 // contributions after a clear() kept as copies
  std::uint64_t staged_ = 0;                // of which held now (the first staged_ of contributions_)
  std::vector<unsigned char> staging_;      // the copies of count_ elements, one after another (grown as used)
  std::vector<std::uint8_t> tops_;
  std::vector<std::int64_t> limbs_;   // float64: 6 limbs per element; K = 3: the flushed limbs (3 per element) or empty
  std::vector<std::int64_t> packed_;  // K = 3 dtypes: per element the packed limbs of the latest contributions
  primitive::binned_view lent_{};     // what an asynchronous collective reads until its work completes

  friend work all_reduce_async(communicator& comm, reproducible_accumulator& acc, void* recv, reduce_kind op,
                               const collective_options& options);
};

namespace detail {

/// Issues an accumulator collective of `kind` (all_reduce or reduce_scatter) that reads `view`
/// (the storage of `acc`): runs it and waits (async false; returns an empty work), or queues it
/// on the progress thread (async true; `view` must then outlive the returned work).
inline work issue_accumulator(communicator& comm, collective_kind kind, const reproducible_accumulator& acc,
                              const primitive::binned_view& view, void* recv, reduce_kind op,
                              const collective_options& options, bool async) {
  const std::uint64_t n = static_cast<std::uint64_t>(comm.world_size());
  std::uint64_t count = acc.count();
  std::string invalid;
  if (kind == collective_kind::reduce_scatter) {
    count = acc.count() / n;
    if (acc.count() % n != 0)
      invalid =
          "accumulator count " + std::to_string(acc.count()) + " is not a multiple of world size " + std::to_string(n);
  }
  if (op != reduce_kind::sum && op != reduce_kind::avg && invalid.empty())
    invalid = "an accumulator reduces with sum or avg, not " + std::string(reduce_kind_name(op));
  auto q = make_request(kind, nullptr, recv, count, acc.type(), reduce_op(op), -1, options);
  q.invalid = invalid;
  q.binned = &view;
  if (!async) {
    run_blocking(comm, q);
    return {};
  }
  return issue(comm, q, true);
}

/// Issues a blocking accumulator collective of `kind` on `acc` and waits for it.
inline void run_accumulator(communicator& comm, collective_kind kind, const reproducible_accumulator& acc, void* recv,
                            reduce_kind op, const collective_options& options) {
  const primitive::binned_view view = acc.view();
  (void)issue_accumulator(comm, kind, acc, view, recv, op, options, false);  // blocking: the work is empty
}

}  // namespace detail

/// recv (count() elements of type(), on every rank) = the reproducible sum (op sum) or average
/// (op avg: divided by the total number of contributions over all ranks; NaN when there are
/// none) of every contribution deposited on every rank. A function of the multiset of
/// contributions only: not of world size, rank order, algorithm or backend. Collective: every
/// rank calls it (ranks with zero contributions are allowed). Blocking. Errors as all_reduce's,
/// on every rank; ops other than sum and avg, and more than 2^26 contributions in total, are
/// errc::invalid_argument.
inline void all_reduce(communicator& comm, const reproducible_accumulator& acc, void* recv, reduce_kind op,
                       const collective_options& options = {}) {
  detail::run_accumulator(comm, collective_kind::all_reduce, acc, recv, op, options);
}

/// Asynchronous accumulator `all_reduce`: returns at once; the operation runs on `comm`'s
/// progress thread in issue order and `work::wait()` rethrows its error (on every rank alike, as
/// all_reduce's). Until the work completes `acc` must not be added to, cleared, moved or
/// destroyed, and `recv` must not be touched. Same bits as the blocking all_reduce.
inline work all_reduce_async(communicator& comm, reproducible_accumulator& acc, void* recv, reduce_kind op,
                             const collective_options& options = {}) {
  acc.lent_ = acc.view();
  return detail::issue_accumulator(comm, collective_kind::all_reduce, acc, acc.lent_, recv, op, options, true);
}

/// Like all_reduce, but rank r receives only elements [r*c, (r+1)*c) with c = acc.count() /
/// world_size (acc.count() must be a multiple of world_size, else invalid_argument on every rank).
inline void reduce_scatter(communicator& comm, const reproducible_accumulator& acc, void* recv, reduce_kind op,
                           const collective_options& options = {}) {
  detail::run_accumulator(comm, collective_kind::reduce_scatter, acc, recv, op, options);
}

}  // namespace ringzero
