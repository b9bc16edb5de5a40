#pragma once
// Helpers of the MPI tests: communicators with test settings and capturing errors.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "ringzero/backend/mpi.hpp"
#include "ringzero/ringzero.hpp"

namespace ringzero_test {

/// Options for tests that expect errors: throw instead of aborting the job.
inline ringzero::mpi::communicator_options throwing(std::optional<bool> check, double timeout_s = 120.0) {
  ringzero::mpi::communicator_options o;
  o.check = check;
  o.on_timeout = ringzero::mpi::failure_policy::throw_error;
  o.timeout = std::chrono::duration<double>(timeout_s);
  return o;
}

/// Runs `f`; returns the ringzero::error it threw, if any (other exceptions propagate).
inline std::optional<ringzero::error> error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ringzero::error& e) { return e; }
  return std::nullopt;
}

/// True when `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// "rank 3" or "ranks 1-3" for ranks [first, last].
inline std::string ranks_text(int first, int last) {
  return first == last ? "rank " + std::to_string(first)
                       : "ranks " + std::to_string(first) + "-" + std::to_string(last);
}

/// Seconds since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace ringzero_test
