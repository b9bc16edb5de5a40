#pragma once
/// @file
/// `nccl::options`: how an NCCL communicator waits (blocking or polled calls, timeout), watches
/// its collectives, checks contracts, and which stream it orders work on (docs/gpu.md).

#include "ringzero/backend/nccl/types.hpp"

#include <chrono>
#include <optional>
#include <string>

#include <cuda_runtime_api.h>

namespace ringzero::nccl {

/// Settings of an NCCL communicator.
struct options {
  /// false (default): a non-blocking communicator (ncclConfig_t blocking = 0) whose calls
  /// ringzero polls with the timeout; true: NCCL's blocking calls (a host call that blocks
  /// inside NCCL, such as a first connection to a peer that never comes, cannot be aborted).
  bool blocking = false;
  /// Timeout of every collective and wait. Unset: RINGZERO_TIMEOUT, else 300 s.
  std::optional<std::chrono::duration<double>> timeout;
  /// Run the watchdog thread (abort on timeout or asynchronous error). Without it, timeouts are
  /// enforced only where the host waits (`synchronize`, blocking NCCL calls being polled).
  bool watchdog = true;
  /// How often the watchdog looks.
  std::chrono::milliseconds watchdog_interval{100};
  /// Cross-rank contract check before every collective (docs/gpu.md). Unset:
  /// RINGZERO_CHECK, default off.
  std::optional<bool> check_contract;
  /// ncclConfig_t commName (shown in NCCL's logs); empty: none.
  std::string name;
  /// The stream to order work on; nullptr: the communicator creates a non-blocking stream.
  cudaStream_t stream = nullptr;
};

}  // namespace ringzero::nccl
