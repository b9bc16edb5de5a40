#pragma once
/// @file
/// The command-line checks the trainers share: whole numbers in decimal digits only, numbers that
/// are finite and within a range (optionally one float32 holds as meant), and comma-separated
/// lists of whole numbers. CLI11's own conversions are too lenient for a trainer: an unsigned
/// option reads "-1" as 2^64 - 1 and "010" as 8, a leading space is skipped, and its range checks
/// let NaN through (NaN compares false with every bound), so a value the trainer cannot use would
/// be wrapped, rounded or ignored instead of refused. A value refused by a check ends the program
/// with CLI11's validation error (exit status 105) and a message naming the option and the value.

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "ringzero/zero/optimizer.hpp"

namespace ringzero::examples {

/// A check for an output file option (--json, --save-parameters): the path must be absent or a
/// regular file (not followed when it is a symbolic link), so that a FIFO, device, directory or
/// link given by mistake is refused before training instead of blocking or being replaced after it.
inline CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        struct stat st {};
        if (path.empty()) return "the output path is empty";
        if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? std::string() : std::string(std::strerror(errno));
        if (S_ISREG(st.st_mode)) return {};
        return "'" + path + "' exists and is not a regular file (a " +
               (S_ISDIR(st.st_mode)    ? "directory"
                : S_ISFIFO(st.st_mode) ? "FIFO"
                : S_ISLNK(st.st_mode)  ? "symbolic link"
                                       : "device or socket") +
               "): only a regular file is replaced";
      },
      "FILE");
}

/// `text` as a whole number written in decimal digits (no sign, space, base prefix or leading
/// zero), or nullopt, also when it does not fit in 64 bits.
inline std::optional<std::uint64_t> parse_whole_number(const std::string& text) {
  std::uint64_t v = 0;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, v);
  if (text.empty() || text[0] < '0' || text[0] > '9' || (text[0] == '0' && text.size() > 1) || ec != std::errc() ||
      end != last)
    return std::nullopt;
  return v;
}

/// A CLI11 check for the integer options: the text is a whole number (parse_whole_number). Their
/// ranges are checked after it (CLI::Range), on a number CLI11 then reads exactly.
inline CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (parse_whole_number(text)) return {};
        return "'" + text + "' is not a whole number (decimal digits, no sign or leading zero)";
      },
      "WHOLE NUMBER");
}

/// `text` as a number (all of it, without leading or trailing space), or nullopt. Overflow reads
/// as +-inf and "nan" as NaN, which the checks refuse.
inline std::optional<double> parse_number(const std::string& text) {
  if (text.empty() || text[0] == ' ' || text[0] == '\t' || text[0] == '\n') return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

/// Which numbers `number_check` accepts.
struct number_limits {
  double low = 0;             ///< the smallest value accepted
  double high = 0;            ///< the largest value accepted
  bool low_excluded = false;  ///< accept only values above `low`
  /// Accept only values a float32 holds as meant (the value is applied as a float32): 0, or a
  /// value that rounds to a magnitude from 2^-126 (the smallest normal float32) to FLT_MAX
  /// (ringzero::zero::detail::fits_float).
  bool float32 = false;
};

/// Whether `v` is finite and within `limits`.
inline bool within(double v, const number_limits& limits) {
  if (!std::isfinite(v) || v < limits.low || v > limits.high || (limits.low_excluded && v == limits.low)) return false;
  return !limits.float32 || ringzero::zero::detail::fits_float(v);
}

/// A CLI11 check for a real-valued option: the text is a number (parse_number) within `limits`;
/// otherwise "'<text>' is not <what>". `name` is the type shown by --help (e.g. "RATE").
inline CLI::Validator number_check(number_limits limits, std::string what, std::string name) {
  return CLI::Validator(
      [limits, what = std::move(what)](std::string& text) -> std::string {
        const std::optional<double> v = parse_number(text);
        if (v && within(*v, limits)) return {};
        return "'" + text + "' is not " + what;
      },
      std::move(name));
}

/// The check of a --lr option: a finite number above 0 that a float32 holds (the optimizers apply
/// it as a float32), from 2^-126 to FLT_MAX.
inline CLI::Validator learning_rate_check() {
  // high: the largest double that rounds to FLT_MAX (the decimal 3.4028235e38 included).
  return number_check({.low = 0, .high = std::nextafter(0x1.ffffffp127, 0.0), .low_excluded = true, .float32 = true},
                      "a learning rate: a finite number above 0 that a float32 holds (1.1754944e-38 to 3.4028235e+38)",
                      "RATE");
}

/// A comma-separated list of whole numbers, each from `low` to `high`, or the first item refused.
struct whole_number_list {
  std::vector<std::uint64_t> values;   ///< the numbers, in order (complete only when `refused` is empty)
  std::optional<std::string> refused;  ///< the first item that is not such a number (possibly "")
};

/// `text` split at every comma into whole numbers (parse_whole_number) from `low` to `high`. An
/// empty item ("5,,5", a leading or trailing comma) is refused, not skipped.
inline whole_number_list parse_whole_number_list(const std::string& text, std::uint64_t low, std::uint64_t high) {
  whole_number_list out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const std::optional<std::uint64_t> v = parse_whole_number(item);
    if (!v || *v < low || *v > high) {
      out.refused = item;
      return out;
    }
    out.values.push_back(*v);
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

/// The widest hidden layer the examples' --hidden accepts.
inline constexpr std::uint64_t max_hidden_width = 1 << 16;

/// The CLI11 check of one --hidden value: widths from 1 to `max_hidden_width` separated by
/// commas, without empty items ("5,,5" and "64," are refused, naming the value and the item).
inline CLI::Validator hidden_widths_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const whole_number_list widths = parse_whole_number_list(text, 1, max_hidden_width);
        if (!widths.refused) return {};
        return "'" + text + "' is not a list of layer widths from 1 to 65536 separated by commas ('" + *widths.refused +
               "' is not such a width)";
      },
      "WIDTHS");
}

/// The hidden layer widths of --hidden values that passed `hidden_widths_check`, in order: the
/// examples take widths as separate values (`--hidden 64 32`), as comma-separated lists
/// (`--hidden 64,32`), or both.
inline std::vector<int> hidden_widths(const std::vector<std::string>& values) {
  std::vector<int> widths;
  for (const std::string& list : values)
    for (std::uint64_t w : parse_whole_number_list(list, 1, max_hidden_width).values)
      widths.push_back(static_cast<int>(w));
  return widths;
}

/// Adds --keep-checkpoints N to `app`, into `keep` (checkpoint::checkpointer_options::keep_last:
/// only the newest N complete checkpoints stay in the root, older ones are removed once a new
/// one is complete; 0 keeps all). It needs `checkpoint`, the trainer's --checkpoint option: alone
/// it is refused by CLI11 (a nonzero exit status, naming both).
inline void add_keep_checkpoints(CLI::App& app, int& keep, CLI::Option* checkpoint) {
  app.add_option("--keep-checkpoints", keep,
                 "keep only the newest N checkpoints in --checkpoint's directory (older ones are removed once a new "
                 "one is complete; 0: keep all)")
      ->check(CLI::Range(0, 1000000))
      ->needs(checkpoint);
}

}  // namespace ringzero::examples
