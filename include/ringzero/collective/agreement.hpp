#pragma once
/// @file
/// `detail::agreed_value` and `detail::agreement_table`: how the DDP reducer, the sharded model
/// and the checkpoint layer tell every rank which value the ranks disagree on. Each rank builds
/// one row of 64-bit values (options, counts, FNV-1a hashes of parameter lists); the caller
/// all_gathers the rows (on its own communicator and memory); the table names the first value
/// that differs with each rank's version ("learning rate: rank 0: 0.5; rank 1: 0.25") and the
/// ranks that refused, so that every rank raises the same error. Pure functions, no collective.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/backend/protocol/failure_text.hpp"

namespace ringzero::detail {

/// One value every rank must hold alike: its name in messages, its bits and how to print them.
struct agreed_value {
  enum class shown : std::uint8_t { integer, real, flag, hash, named };
  std::string what;
  std::uint64_t bits = 0;
  shown as = shown::integer;
  /// For `shown::named`: the name of a value (e.g. an enumerator's); must not be null then.
  const char* (*name_of)(std::uint64_t) = nullptr;
};

/// The bits of a real-valued setting the ranks compare (-0 as +0: the same setting).
inline std::uint64_t setting_bits(double x) noexcept {
  if (x == 0) x = 0;
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/// `bits` as text, read as `v.as` says.
inline std::string show(const agreed_value& v, std::uint64_t bits) {
  switch (v.as) {
    case agreed_value::shown::real: {
      double x;
      std::memcpy(&x, &bits, sizeof x);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", x);
      return buf;
    }
    case agreed_value::shown::flag: return bits != 0 ? "true" : "false";
    case agreed_value::shown::hash: {
      char buf[24];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
      return buf;
    }
    case agreed_value::shown::named: return v.name_of != nullptr ? std::string(v.name_of(bits)) : std::to_string(bits);
    case agreed_value::shown::integer: break;
  }
  return std::to_string(bits);
}

/// The bits of `values`, the row a rank contributes.
inline std::vector<std::uint64_t> agreement_row(std::span<const agreed_value> values) {
  std::vector<std::uint64_t> row(values.size());
  for (std::size_t f = 0; f < values.size(); ++f) row[f] = values[f].bits;
  return row;
}

/// Every rank's row (`ranks` rows of `fields` values, by rank) as all_gathered by the caller.
class agreement_table {
 public:
  agreement_table(std::vector<std::uint64_t> table, std::size_t fields)
      : table_(std::move(table)), fields_(fields), ranks_(fields == 0 ? 0 : table_.size() / fields) {}

  std::size_t ranks() const noexcept { return ranks_; }
  std::uint64_t at(std::size_t rank, std::size_t field) const { return table_[rank * fields_ + field]; }
  /// Rank `rank`'s whole row (`fields` values).
  std::span<const std::uint64_t> row(std::size_t rank) const { return {table_.data() + rank * fields_, fields_}; }

  /// True when every rank holds the same value of `field`.
  bool same(std::size_t field) const {
    for (std::size_t r = 1; r < ranks_; ++r)
      if (at(r, field) != at(0, field)) return false;
    return true;
  }

  /// The ranks whose `field` is not `expected` (e.g. the ranks that refused).
  std::vector<int> ranks_where_not(std::size_t field, std::uint64_t expected) const {
    std::vector<int> out;
    for (std::size_t r = 0; r < ranks_; ++r)
      if (at(r, field) != expected) out.push_back(static_cast<int>(r));
    return out;
  }

  /// Each rank's `field`, grouped: "rank 0: 0.5; ranks 1-3: 0.25", printed as `v` says.
  std::string by_rank(std::size_t field, const agreed_value& v) const {
    std::vector<std::string> text(ranks_);
    for (std::size_t r = 0; r < ranks_; ++r) text[r] = show(v, at(r, field));
    return describe_values(text);
  }

  /// The first field from `first` on whose value the ranks differ, or `fields` when none.
  std::size_t first_difference(std::size_t first = 0) const {
    for (std::size_t f = first; f < fields_; ++f)
      if (!same(f)) return f;
    return fields_;
  }

 private:
  std::vector<std::uint64_t> table_;
  std::size_t fields_ = 0;
  std::size_t ranks_ = 0;
};

}  // namespace ringzero::detail
