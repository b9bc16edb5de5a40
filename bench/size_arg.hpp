#pragma once
// Byte sizes on the benchmarks' command lines: "4096", "4K", "64M", "1G" (also "KiB", "MiB",
// "GiB", lower-case k/m/g and a trailing "B"); K, M and G are powers of 1024, as in nccl-tests.

#include <cmath>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace ringzero::bench {

/// Parses `text` into bytes. Throws CLI::ValidationError naming `option` when the text is not a
/// number with a known suffix, or the size is not finite, below `min_bytes` or above 1e15 bytes.
inline std::uint64_t parse_size(const std::string& text, const std::string& option, std::uint64_t min_bytes = 0) {
  if (text.empty()) throw CLI::ValidationError(option, "empty size");
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) { throw CLI::ValidationError(option, "'" + text + "' is not a size"); }
  const std::string suffix = text.substr(used);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B")
    throw CLI::ValidationError(option, "unknown suffix in '" + text + "'");
  const double bytes = v * scale;
  if (!std::isfinite(bytes) || bytes < static_cast<double>(min_bytes) || bytes > 1e15)
    throw CLI::ValidationError(option,
                               "'" + text + "' is not a size from " + std::to_string(min_bytes) + " B to 1e15 B");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace ringzero::bench
