#pragma once
// The benchmarks' check of an output file (--json) before they measure: whether it can be
// written, without creating or changing it.

#include <cerrno>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace ringzero::bench {

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
