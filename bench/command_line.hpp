#pragma once
// What the benchmarks' command lines share: whole numbers in decimal digits and the check of
// an output file (--json) before they measure. (The text of an error for the program's one
// line on stderr is ringzero::error_text, core/error.hpp.)

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace ringzero::bench {

/// `text` as a whole number of type T written in decimal digits only (no sign, space or base
/// prefix; leading zeros read as decimal), or nullopt, also when it does not fit in T.
template <class T>
std::optional<T> parse_digits(const std::string& text) {
  T v{};
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, v);
  if (text.empty() || text[0] < '0' || text[0] > '9' || ec != std::errc() || end != last) return std::nullopt;
  return v;
}

/// Why `path` cannot be written, or an empty string when it can; checked before measuring
/// without creating or changing the file: an existing file is opened for appending and closed
/// (nothing written), a new one is created and removed again. A failed run leaves no file
/// behind and never touches one the user already had.
inline std::string output_path_problem(const std::string& path) {
  const int created = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (created >= 0) {
    ::close(created);
    ::unlink(path.c_str());
    return {};
  }
  if (errno != EEXIST) return std::strerror(errno);
  // O_NONBLOCK: a FIFO without a reader answers at once instead of blocking.
  const int existing = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (existing < 0) return std::strerror(errno);
  ::close(existing);
  return {};
}

}  // namespace ringzero::bench
