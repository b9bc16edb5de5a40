#pragma once
// The benchmarks' result rows and their three forms: the table on stdout, CSV (--csv) and JSON
// (--json). Columns in nccl-tests' order: size count type redop root, then time algbw busbw
// #wrong out of place, then the same four in place (time: the mean in us; algbw, busbw: GB/s);
// ringzero's own columns after them: algorithm, then median (us) and %peak out of place and in
// place. docs/performance.md describes the columns and the bound behind %peak.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "collective.hpp"
#include "ringzero/core/error.hpp"
#include "timing.hpp"

namespace ringzero::bench {

/// One placement's (out of place or in place) measurement of a row.
struct placement_result {
  bool applicable = false;      ///< false: N/A (all_to_all in place)
  double time_us = 0;           ///< mean over iterations of the slowest rank's time
  double median_us = 0;         ///< median of the same
  double algbw = 0, busbw = 0;  ///< GB/s, from the mean
  double peak_fraction = -1;    ///< bound time / mean time; < 0: no bound (printed "-")
  std::int64_t wrong = 0;       ///< elements that differ from the exact values, summed over ranks
};

/// One row: a size, dtype, op and root, both placements.
struct result_row {
  collective_kind kind = collective_kind::all_reduce;
  std::uint64_t size_bytes = 0;  ///< nccl-tests' size
  std::uint64_t count = 0;       ///< the call's count argument
  dtype type = dtype::float32;
  std::string redop = "none";  ///< the reduce op's name, or "none"
  int root = -1;               ///< -1 for collectives without a root
  int ranks = 1;
  std::string algorithm;  ///< the algorithm that ran
  std::string requested;  ///< the algorithm asked for, when it is not the header's
  placement_result out_of_place, in_place;

  /// nccl-tests' count column: size over the element size.
  std::uint64_t elements() const { return size_bytes / dtype_size(type); }
};

/// A placement's result from its per-iteration slowest-rank times. `copy_gbps` is the memory
/// bound (read + write GB/s; 0: none); a world of one in place has nothing to move (no bound).
inline placement_result make_placement(const collective_descriptor& d, const row_shape& s, int n, bool in_place,
                                       const time_summary& t, std::int64_t wrong, double copy_gbps) {
  placement_result p;
  p.applicable = true;
  p.time_us = t.mean_us;
  p.median_us = t.median_us;
  p.wrong = wrong;
  p.algbw = d.moves_data ? algbw_gbps(static_cast<double>(s.size_bytes), t.mean_us) : 0.0;
  p.busbw = p.algbw * d.bus_factor(n);
  const double least = n == 1 && in_place ? 0.0 : d.least_bytes(n, static_cast<double>(s.size_bytes));
  if (copy_gbps > 0 && least > 0 && t.mean_us > 0) p.peak_fraction = least / (copy_gbps * 1e3) / t.mean_us;
  return p;
}

namespace detail {

template <class... Args>
std::string format_text(const char* format, Args... args) {
  char buffer[512];
  const int n = std::snprintf(buffer, sizeof buffer, format, args...);
  return std::string(buffer, n < 0                                         ? 0
                             : static_cast<std::size_t>(n) < sizeof buffer ? static_cast<std::size_t>(n)
                                                                           : sizeof buffer - 1);
}

inline std::string peak_text(double fraction) {
  return fraction < 0 ? std::string("-") : format_text("%.1f%%", 100 * fraction);
}

inline std::string algorithm_text(const result_row& r) {
  return r.requested.empty() || r.requested == r.algorithm ? r.algorithm : r.requested + "->" + r.algorithm;
}

}  // namespace detail

/// The table's three header lines, each starting with '#', ending with a newline.
inline std::string table_header() {
  using detail::format_text;
  std::string h = format_text("# %12s  %12s  %8s  %9s  %4s  %-33s  %-33s  %-22s  %-16s  %s\n", "", "", "", "", "",
                              "out-of-place", "in-place", "", "out-of-place", "in-place");
  h += format_text("# %12s  %12s  %8s  %9s  %4s  %9s %7s %7s %7s  %9s %7s %7s %7s  %22s  %9s %6s  %9s %6s\n", "size",
                   "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                   "#wrong", "algorithm", "median", "%peak", "median", "%peak");
  h += format_text("# %12s  %12s  %8s  %9s  %4s  %9s %7s %7s %7s  %9s %7s %7s %7s  %22s  %9s %6s  %9s %6s\n", "(B)",
                   "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)",
                   "", "(us)", "");
  // no trailing blanks
  for (std::size_t at = h.find(" \n"); at != std::string::npos; at = h.find(" \n")) {
    std::size_t first = at;
    while (first > 0 && h[first - 1] == ' ') --first;
    h.erase(first, at + 1 - first);
  }
  return h;
}

/// One table line (with its newline). Every cell is one word, so column k of the line split at
/// blanks is always the same field (N/A cells read "N/A").
inline std::string table_row(const result_row& r) {
  using detail::format_text;
  auto cell = [](const placement_result& p) {
    if (!p.applicable) return format_text("%9s %7s %7s %7s", "N/A", "N/A", "N/A", "N/A");
    return format_text("%9.2f %7.2f %7.2f %7lld", p.time_us, p.algbw, p.busbw, static_cast<long long>(p.wrong));
  };
  auto extra = [](const placement_result& p) {
    if (!p.applicable) return format_text("%9s %6s", "N/A", "N/A");
    return format_text("%9.2f %6s", p.median_us, detail::peak_text(p.peak_fraction).c_str());
  };
  return format_text("  %12llu  %12llu  %8s  %9s  %4d  %s  %s  %22s  %s  %s\n",
                     static_cast<unsigned long long>(r.size_bytes), static_cast<unsigned long long>(r.elements()),
                     std::string(dtype_short_name(r.type)).c_str(), r.redop.c_str(), r.root,
                     cell(r.out_of_place).c_str(), cell(r.in_place).c_str(), detail::algorithm_text(r).c_str(),
                     extra(r.out_of_place).c_str(), extra(r.in_place).c_str());
}

/// The CSV header line (with its newline): the table's columns in the table's order, with
/// placement prefixes (oop_, ip_) and units, then the collective, the world size and the
/// requested algorithm.
inline std::string csv_header() {
  return "size,count,type,redop,root,oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_wrong,ip_time_us,ip_algbw_gbps,"
         "ip_busbw_gbps,ip_wrong,algorithm,oop_median_us,oop_peak_percent,ip_median_us,ip_peak_percent,collective,"
         "ranks,"
         "requested\n";
}

/// One CSV line (with its newline); N/A cells and absent %peak are empty.
inline std::string csv_row(const result_row& r) {
  using detail::format_text;
  auto cells = [](const placement_result& p) {
    if (!p.applicable) return std::string(",,,");
    return format_text("%.6g,%.6g,%.6g,%lld", p.time_us, p.algbw, p.busbw, static_cast<long long>(p.wrong));
  };
  auto extra = [](const placement_result& p) {
    if (!p.applicable) return std::string(",");
    return format_text("%.6g,", p.median_us) +
           (p.peak_fraction < 0 ? std::string() : format_text("%.6g", 100 * p.peak_fraction));
  };
  return format_text("%llu,%llu,", static_cast<unsigned long long>(r.size_bytes),
                     static_cast<unsigned long long>(r.elements())) +
         std::string(dtype_short_name(r.type)) + "," + r.redop + "," + std::to_string(r.root) + "," +
         cells(r.out_of_place) + "," + cells(r.in_place) + "," + r.algorithm + "," + extra(r.out_of_place) + "," +
         extra(r.in_place) + "," + std::string(collective_name(r.kind)) + "," + std::to_string(r.ranks) + "," +
         r.requested + "\n";
}

/// `s` as a JSON string literal.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += detail::format_text("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// `x` as a JSON number (null when it is not finite).
inline std::string json_number(double x) {
  return std::isfinite(x) ? detail::format_text("%.10g", x) : std::string("null");
}

/// One row as a JSON object: collective, size_bytes, count (the call's), type, redop, root,
/// algorithm, requested (when set), ranks, and out_of_place / in_place (null when N/A) with
/// time_us (the mean), median_us, algbw_gbps, busbw_gbps, peak_fraction (null: no bound), wrong.
inline std::string json_row(const result_row& r) {
  auto placement = [](const placement_result& p) {
    if (!p.applicable) return std::string("null");
    return "{\"time_us\": " + json_number(p.time_us) + ", \"median_us\": " + json_number(p.median_us) +
           ", \"algbw_gbps\": " + json_number(p.algbw) + ", \"busbw_gbps\": " + json_number(p.busbw) +
           ", \"peak_fraction\": " + (p.peak_fraction < 0 ? std::string("null") : json_number(p.peak_fraction)) +
           ", \"wrong\": " + std::to_string(p.wrong) + "}";
  };
  return "{\"collective\": " + json_string(std::string(collective_name(r.kind))) +
         ", \"size_bytes\": " + std::to_string(r.size_bytes) + ", \"count\": " + std::to_string(r.count) +
         ", \"type\": " + json_string(std::string(dtype_name(r.type))) + ", \"redop\": " + json_string(r.redop) +
         ", \"root\": " + std::to_string(r.root) + ", \"algorithm\": " + json_string(r.algorithm) +
         (r.requested.empty() ? "" : ", \"requested\": " + json_string(r.requested)) +
         ", \"ranks\": " + std::to_string(r.ranks) + ",\n     \"out_of_place\": " + placement(r.out_of_place) +
         ",\n     \"in_place\": " + placement(r.in_place) + "}";
}

/// The rows as a JSON array, one row per line.
inline std::string json_rows(const std::vector<result_row>& rows) {
  std::string out = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) out += (i ? ",\n    " : "\n    ") + json_row(rows[i]);
  return out + (rows.empty() ? "]" : "\n  ]");
}

namespace detail {
inline void write_file(const std::string& path, const std::string& text, const char* option) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  const bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f && std::fclose(f) != 0) throw error(errc::io_error, std::string(option) + " " + path + ": writing failed");
  if (!ok) throw error(errc::io_error, std::string(option) + " " + path + ": cannot write");
}
}  // namespace detail

/// Writes `rows` as CSV (csv_header, then csv_row per row) to `path`; throws ringzero::error
/// (io_error) naming --csv and the path when it cannot.
inline void write_csv(const std::string& path, const std::vector<result_row>& rows) {
  std::string text = csv_header();
  for (const result_row& r : rows) text += csv_row(r);
  detail::write_file(path, text, "--csv");
}

/// Writes a JSON object to `path`: `fields` (name, JSON text made with json_string/json_number)
/// in order, then "rows" (json_rows). Throws ringzero::error (io_error) naming --json and the path.
inline void write_json(const std::string& path, const std::vector<std::pair<std::string, std::string>>& fields,
                       const std::vector<result_row>& rows) {
  std::string text = "{\n";
  for (const auto& [name, value] : fields) text += "  " + json_string(name) + ": " + value + ",\n";
  text += "  \"rows\": " + json_rows(rows) + "\n}\n";
  detail::write_file(path, text, "--json");
}

}  // namespace ringzero::bench
