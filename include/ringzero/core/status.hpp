#pragma once
/// @file
/// `status`: the result of an internal operation on a hot path (waiting, matching a transfer).
/// Public calls turn a non-ok status into a `ringzero::error` at the edge (core/error.hpp).

#include <cstdint>
#include <string_view>

#include "ringzero/core/enum_names.hpp"

namespace ringzero {

/// Outcome of an internal step. `ok` is zero so `if (s != status::ok)` reads naturally.
enum class status : std::uint8_t {
  ok = 0,
  timeout,        ///< the deadline passed before the awaited event
  aborted,        ///< the communicator was aborted (by a timeout or failure on some rank)
  peer_exited,    ///< a rank that was awaited has left the communicator
  size_mismatch,  ///< a transfer's sender and receiver disagree on its size
};

/// A short lower-case description of `s`.
inline constexpr enum_names<status, 5> status_names{"ok", "timeout", "aborted", "peer exited", "size mismatch"};
/// The name of `s` (`status_names`).
constexpr std::string_view status_name(status s) noexcept { return status_names(s); }

}  // namespace ringzero
