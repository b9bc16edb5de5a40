#pragma once
/// @file
/// `tuning_table`: algorithm choices measured on a machine, which override the cost model's
/// (collective/selection.hpp) for the sizes they cover, as Open MPI's coll_tuned dynamic rules
/// file overrides its fixed decision functions. `ringzero-mpi-compare --write-tuning FILE` measures
/// every algorithm at each size and writes the fastest; `mpi::communicator_options::tuning` or
/// RINGZERO_MPI_TUNING=FILE hands the table to a communicator. Pure values; the manual:
/// docs/mpi.md, "Tuning the algorithm choice on your machine".
///
/// The text form, one rule per line (blank lines and `#` comments ignored):
///
///     all_reduce 2 0 ring
///     all_reduce 2 4194304 native
///     all_reduce 2 33554432 ring
///
/// `COLLECTIVE WORLD_SIZE MIN_BYTES ALGORITHM`: for that collective on that many ranks, from S =
/// MIN_BYTES bytes up to the next rule's MIN_BYTES, run ALGORITHM (S is the cost model's size:
/// the message of all_reduce, broadcast and reduce, every rank's part together for
/// reduce_scatter and all_gather; docs/algorithms.md). A call that no rule covers (another
/// world size or collective, or S below the first MIN_BYTES) is the cost model's.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "ringzero/core/algorithm.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/fnv1a.hpp"

namespace ringzero {

/// One rule of a `tuning_table` (see the file comment).
struct tuning_rule {
  collective_kind kind = collective_kind::all_reduce;  ///< the collective it covers
  int world_size = 1;                                  ///< the ranks it covers (>= 1)
  std::uint64_t min_bytes = 0;                         ///< S from which it applies, in bytes
  algorithm algo = algorithm::ring;                    ///< what runs (never `automatic`)
  bool operator==(const tuning_rule&) const = default;
};

/// Measured algorithm choices (see the file comment). Rules are kept sorted by collective,
/// world size and min_bytes, one per (collective, world size, min_bytes).
class tuning_table {
 public:
  tuning_table() = default;

  /// Adds `r`, replacing a rule with the same collective, world size and min_bytes. Throws
  /// errc::invalid_argument for `automatic`, a point-to-point kind or a world size below 1, and
  /// for an algorithm ringzero does not implement for that collective (`algorithm_implements`:
  /// halving_doubling's all_to_all).
  void add(const tuning_rule& r) {
    if (r.algo == algorithm::automatic)
      throw error(errc::invalid_argument, "a tuning rule must name an algorithm, not auto");
    if (r.kind == collective_kind::send || r.kind == collective_kind::recv || r.kind == collective_kind::barrier)
      throw error(errc::invalid_argument,
                  "a tuning rule covers a collective with a size, not " + std::string(collective_name(r.kind)));
    if (r.world_size < 1)
      throw error(errc::invalid_argument,
                  "a tuning rule's world size must be at least 1, got " + std::to_string(r.world_size));
    if (!algorithm_implements(r.algo, r.kind))
      throw error(errc::invalid_argument, "a tuning rule names " + std::string(algorithm_name(r.algo)) + " for " +
                                              std::string(collective_name(r.kind)) + ", which " +
                                              std::string(algorithm_name(r.algo)) + " does not implement");
    auto at = std::lower_bound(rules_.begin(), rules_.end(), r,
                               [](const tuning_rule& a, const tuning_rule& b) { return key(a) < key(b); });
    if (at != rules_.end() && key(*at) == key(r))
      *at = r;
    else
      rules_.insert(at, r);
  }

  /// The algorithm of the rule covering collective `k` on `n` ranks at S = `bytes`, or
  /// std::nullopt (the cost model's call). O(log rules).
  std::optional<algorithm> choice(collective_kind k, int n, double bytes) const noexcept {
    if (rules_.empty() || !(bytes >= 0)) return std::nullopt;
    const std::uint64_t s = bytes >= 18446744073709551615.0 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(bytes);
    // The last rule at or before (k, n, s) in the rules' order, if it is one of (k, n).
    auto after = std::upper_bound(rules_.begin(), rules_.end(), key({k, n, s, algorithm::ring}),
                                  [](const auto& x, const tuning_rule& r) { return x < key(r); });
    if (after == rules_.begin()) return std::nullopt;
    const tuning_rule& r = *std::prev(after);
    if (r.kind != k || r.world_size != n) return std::nullopt;
    return r.algo;
  }

  /// The rules, sorted.
  const std::vector<tuning_rule>& rules() const noexcept { return rules_; }
  /// True without rules.
  bool empty() const noexcept { return rules_.empty(); }

  /// Rule `r` as one line of the text form, without the newline ("all_reduce 2 4194304 native").
  /// Pure.
  static std::string rule_text(const tuning_rule& r) {
    return std::string(collective_name(r.kind)) + " " + std::to_string(r.world_size) + " " +
           std::to_string(r.min_bytes) + " " + std::string(algorithm_name(r.algo));
  }

  /// The text form (see the file comment), one line per rule after a header comment; `parse`
  /// reads it back equal.
  std::string text() const {
    std::string s = "# ringzero tuning table: COLLECTIVE WORLD_SIZE MIN_BYTES ALGORITHM (docs/mpi.md)\n";
    for (const tuning_rule& r : rules_) s += rule_text(r) + "\n";
    return s;
  }

  /// A 32-bit fingerprint of the rules (ringzero's 64-bit FNV-1a, core/fnv1a.hpp, over each
  /// rule's four fields, its halves xor-ed together), never 0 for a table with rules; 0 for an
  /// empty one. Ranks compare it to agree on the table (the MPI hello record has 32 bits for it).
  std::uint32_t fingerprint() const noexcept {
    if (rules_.empty()) return 0;
    detail::fnv1a h;
    for (const tuning_rule& r : rules_) {
      h.u64(static_cast<std::uint64_t>(r.kind));
      h.u64(static_cast<std::uint64_t>(r.world_size));
      h.u64(r.min_bytes);
      h.u64(static_cast<std::uint64_t>(r.algo));
    }
    const auto folded = static_cast<std::uint32_t>(h.value() ^ (h.value() >> 32));
    return folded == 0 ? 1 : folded;
  }

  /// Parses the text form (a UTF-8 byte order mark at the start is skipped). Throws
  /// errc::invalid_argument naming `source` (a file name, for messages), the line number and
  /// what was wrong: an unknown collective or algorithm, a world size or byte count that is not
  /// a whole number in range, a missing or extra field, a rule that repeats an earlier line's
  /// collective, world size and size (quoting at most 40 characters of a field).
  static tuning_table parse(std::string_view text, const std::string& source) {
    tuning_table t;
    if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
    std::istringstream in{std::string(text)};
    std::string line;
    const auto quoted = [](const std::string& s) { return "'" + (s.size() <= 40 ? s : s.substr(0, 40) + "...") + "'"; };
    for (int number = 1; std::getline(in, line); ++number) {
      if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
      std::istringstream fields(line);
      std::vector<std::string> f;
      for (std::string w; fields >> w;) f.push_back(w);
      if (f.empty()) continue;
      const auto bad = [&](const std::string& why) {
        throw error(errc::invalid_argument,
                    "tuning table " + source + ", line " + std::to_string(number) + ": " + why +
                        " (expected "
                        "COLLECTIVE WORLD_SIZE MIN_BYTES ALGORITHM, e.g. 'all_reduce 2 4194304 native')");
      };
      if (f.size() != 4) bad(std::to_string(f.size()) + " field(s)");
      const auto kind = parse_collective(f[0]);
      if (!kind) bad("unknown collective " + quoted(f[0]));
      const auto whole = [&](const std::string& s, std::uint64_t limit, const char* what) {
        std::uint64_t v = 0;
        if (s.find_first_not_of("0123456789") != std::string::npos)
          bad(std::string(what) + " " + quoted(s) + " is not a whole number");
        for (char c : s) {
          const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
          if (v > (limit - d) / 10) bad(std::string(what) + " " + quoted(s) + " is out of range");
          v = v * 10 + d;
        }
        return v;
      };
      const std::uint64_t n = whole(f[1], 16777216, "world size");
      const std::uint64_t bytes = whole(f[2], ~std::uint64_t{0}, "byte count");
      const auto algo = parse_algorithm(f[3]);
      if (!algo) bad("unknown algorithm " + quoted(f[3]));
      const std::size_t before = t.rules_.size();
      try {
        t.add({*kind, static_cast<int>(n), bytes, *algo});
      } catch (const error& e) { bad(e.message()); }
      if (t.rules_.size() == before) bad("it repeats the collective, world size and size of an earlier line");
    }
    return t;
  }

  /// The largest tuning table file `read` accepts, in bytes.
  static constexpr std::uint64_t max_file_bytes = 1u << 20;

  /// Reads and parses file `path`. Throws errc::invalid_argument, naming it, when it is not a
  /// regular file (a directory, a FIFO, a device: checked before opening, so nothing blocks),
  /// is larger than `max_file_bytes`, or cannot be read whole; or as `parse`.
  static tuning_table read(const std::string& path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec) throw error(errc::invalid_argument, "cannot read the tuning table " + path + ": " + ec.message());
    if (!std::filesystem::is_regular_file(status))
      throw error(errc::invalid_argument, "the tuning table " + path + " is not a regular file");
    const std::uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) throw error(errc::invalid_argument, "cannot read the tuning table " + path + ": " + ec.message());
    if (size > max_file_bytes)
      throw error(errc::invalid_argument, "the tuning table " + path + " has " + std::to_string(size) +
                                              " bytes, more than a tuning table's " + std::to_string(max_file_bytes));
    std::ifstream f(path, std::ios::binary);
    if (!f) throw error(errc::invalid_argument, "cannot read the tuning table " + path);
    std::string text(static_cast<std::size_t>(size), '\0');
    f.read(text.data(), static_cast<std::streamsize>(size));
    if (f.gcount() != static_cast<std::streamsize>(size) || f.bad())
      throw error(errc::invalid_argument, "cannot read the tuning table " + path + " whole (" +
                                              std::to_string(f.gcount()) + " of " + std::to_string(size) + " bytes)");
    return parse(text, path);
  }

 private:
  /// The rules' order: collective, world size, min_bytes.
  static std::tuple<int, int, std::uint64_t> key(const tuning_rule& r) noexcept {
    return {static_cast<int>(r.kind), r.world_size, r.min_bytes};
  }

  std::vector<tuning_rule> rules_;
};

}  // namespace ringzero
