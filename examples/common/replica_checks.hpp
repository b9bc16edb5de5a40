#pragma once
/// @file
/// --check-replicas N, shared by the trainers: every N optimizer steps the replicas compare their
/// state with ringzero's `verify_replicas` (one hash pass and one small all_gather; a mismatch
/// throws errc::replica_mismatch on every rank, naming the ranks and the first tensor that
/// differs), and the trainer reports how many checks ran and what they cost.

#include <chrono>
#include <cstdint>
#include <string>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "command_line.hpp"

namespace ringzero::examples {

/// Counts and times the checks of one run (rank-local; every rank checks at the same steps).
struct replica_checks {
  std::uint64_t every = 0;  ///< --check-replicas: 0 = off
  std::uint64_t checks = 0;
  std::uint64_t tensors = 0;  ///< tensors compared by the last check
  double seconds = 0;         ///< wall time of all checks on this rank

  /// After optimizer step `step` (counted from 1): runs `verify()` (which returns a
  /// `ringzero::replica_check`) when `step` is a multiple of `every`.
  template <class Verify>
  void after_step(std::uint64_t step, Verify&& verify) {
    if (every == 0 || step % every != 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    tensors = verify().tensors;
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++checks;
  }

  /// "replicas checked 12 time(s) every 1 step(s) (6 tensors each): equal; 0.21 ms per check",
  /// what was not checked, or "" when off.
  std::string summary() const {
    if (every == 0) return {};
    if (checks == 0) return fmt::format("replicas never checked: the run had fewer than {} step(s)", every);
    if (tensors == 0)
      return fmt::format(
          "replicas checked {} time(s) every {} step(s): nothing to compare (no state is replicated "
          "between steps here, as at ZeRO stage 3 without replica groups)",
          checks, every);
    return fmt::format("replicas checked {} time(s) every {} step(s) ({} tensors each): equal; {:.3f} ms per check",
                       checks, every, tensors, checks ? 1e3 * seconds / static_cast<double>(checks) : 0.0);
  }
};

/// Adds --check-replicas to `app`, into `every`.
inline CLI::Option* add_check_replicas_option(CLI::App& app, std::uint64_t& every) {
  return app
      .add_option("--check-replicas", every,
                  "every N optimizer steps, check that every replica holds the same bits (verify_replicas: one "
                  "hash pass, one small all_gather; a mismatch stops the run naming the rank and tensor); 0: off")
      ->check(whole_number());
}

}  // namespace ringzero::examples
