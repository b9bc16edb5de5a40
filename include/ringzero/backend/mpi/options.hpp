#pragma once
/// @file
/// `mpi::communicator_options`: how an MPI communicator checks contracts, reacts to timeouts
/// and pipelines its transfers.

#include <chrono>
#include <cstdint>
#include <optional>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/core/tuning_table.hpp"

namespace ringzero::mpi {

/// What a rank does when a wait passes the communicator's timeout.
enum class failure_policy : std::uint8_t {
  /// Write the error (naming the collective and the ranks that did not arrive) to stderr and
  /// call MPI_Abort on the communicator: the whole job ends instead of hanging. The default,
  /// like PyTorch's NCCL watchdog: after a timeout MPI's state is undefined (requests that
  /// will never complete), so continuing is rarely safe.
  abort_job = 0,
  /// Throw `ringzero::error(errc::timeout)` instead. The communicator is aborted (every later
  /// call on it, on every rank, fails with the same error) and its pending transfers are
  /// cancelled. Destroying it afterwards waits at most `failed_departure_wait` (250 ms) for
  /// the peers' departures, plus up to 200 ms to cancel unfinished notices, not another
  /// timeout (mpi::communicator's destructor). Meant for tests and for programs that log and
  /// exit on their own.
  /// Native collectives are blocking MPI calls that cannot be interrupted: their timeout
  /// aborts the job under either policy.
  throw_error = 1,
};

/// "abort_job" or "throw_error".
constexpr const char* failure_policy_name(failure_policy p) noexcept {
  return p == failure_policy::throw_error ? "throw_error" : "abort_job";
}

/// Slice size of pipelined transfers when the whole communicator is on one node (shared
/// memory). There the receiving process copies the data itself (Open MPI's single-copy CMA), so
/// slicing cannot overlap the copy with the combine; each slice only adds a handshake. Large
/// slices measured best on the development machine (docs/mpi.md).
inline constexpr std::uint64_t node_slice_bytes = 4u << 20;
/// Pipeline depth on one node (staging memory: depth * slice bytes, allocated once).
inline constexpr int node_pipeline_depth = 2;
/// Slice size across nodes: the network moves slice s+1 while the CPU combines slice s.
inline constexpr std::uint64_t network_slice_bytes = 512u << 10;
/// Pipeline depth across nodes.
inline constexpr int network_pipeline_depth = 4;

/// Settings of an `mpi::communicator`. Every rank must pass the same values for `check`,
/// `slice_bytes` and `pipeline_depth` (checked when the communicator is made).
struct communicator_options {
  /// Cross-rank contract check before every collective. Unset: RINGZERO_CHECK, else on in
  /// builds without NDEBUG (debug builds) and off in release builds.
  std::optional<bool> check;
  /// What a timeout does (see failure_policy).
  failure_policy on_timeout = failure_policy::abort_job;
  /// Timeout of every wait. Unset: RINGZERO_TIMEOUT, else 300 s.
  std::optional<std::chrono::duration<double>> timeout;
  /// Transfers larger than this are sent as slices of this many bytes, so that a combining
  /// receiver reduces slice s while slice s+1 is in flight. A multiple of 64 up to 1 GiB, or 0:
  /// `node_slice_bytes` when every rank of the communicator is on one node, else
  /// `network_slice_bytes`.
  std::uint64_t slice_bytes = 0;
  /// Slices a combining receive keeps posted at once (1 to 64), or 0: `node_pipeline_depth`
  /// on one node, else `network_pipeline_depth`.
  int pipeline_depth = 0;
  /// When > 0, the communicator's size must equal this (errc::invalid_argument otherwise, on
  /// every rank): catches a job launched with the wrong number of processes.
  int expected_world_size = 0;
  /// Cost parameters for the algorithm choice (collective/selection.hpp). Unset: the values
  /// measured on shared memory (mpi::communicator::default_link). Across machines, measure
  /// yours with `ringzero-mpi-compare --link` and pass them here, with `eager_bytes` set to your
  /// MPI's eager limit on that network (e.g. Open MPI's btl_tcp_eager_limit, ompi_info --all;
  /// 0 if unknown); every rank must pass the
  /// same values, or ranks would pick different algorithms (checked when the communicator is
  /// made).
  std::optional<link_model> link;
  /// Paces this rank's sends as a link of this many gigabits (1e9 bits) per second would carry
  /// them (mpi::detail::link_pacer), to see on one machine what a slower network does to a
  /// training step (docs/mpi.md, "A slower link on one machine"). Unset: RINGZERO_LINK_GBPS, else
  /// no pacing. From 0.001 (1 Mb/s) to 1e6, and the same on every rank (checked when the
  /// communicator is made; a malformed RINGZERO_LINK_GBPS on any rank is refused on every rank).
  /// While pacing, MPI's own collectives are not offered (their transfers cannot be held back:
  /// an explicit collective_options::algo = native is refused, and RINGZERO_ALGO=native gives way
  /// to the cost model's choice, as a forced algorithm does where it is unavailable) and the link model's beta is at
  /// least the paced link's, 8 / (1e3 gbps) microseconds per byte.
  std::optional<double> link_gbps;
  /// Algorithm choices measured on this machine (core/tuning_table.hpp), which the cost model
  /// defers to where a rule covers the call and the algorithm is available (`ringzero-mpi-compare
  /// --write-tuning FILE` writes them; docs/mpi.md, "Tuning the algorithm choice"). Unset: the file named
  /// by RINGZERO_MPI_TUNING (read on every rank; unreadable or malformed, or without rules:
  /// refused on every rank), else none. A rule naming an algorithm MPI never runs (`direct`) is
  /// refused too. Every rank must have the same rules (checked when the communicator is made).
  std::optional<tuning_table> tuning;
};

}  // namespace ringzero::mpi
