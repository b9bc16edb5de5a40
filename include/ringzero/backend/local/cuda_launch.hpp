#pragma once
/// @file
/// `local::launch_cuda(world_size, fn)`: like `local::launch`, but every rank's buffers live in
/// CUDA device memory: rank r runs `fn(local::cuda_communicator&)` on its own thread, with its
/// own CUDA stream, on device `devices[r % devices.size()]` (by default device r modulo the
/// number of devices, so any number of ranks can share one GPU).
/// The manual: docs/gpu.md, "Header notes", `ringzero/backend/local/cuda_launch.hpp`.

#include <string>
#include <utility>
#include <vector>

#include "ringzero/backend/local/cuda_communicator.hpp"
#include "ringzero/backend/local/launch.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"

namespace ringzero::local {

/// Options of `launch_cuda`: those of `launch`, plus the devices.
struct cuda_launch_options : launch_options {
  /// Rank r uses device devices[r % devices.size()]; empty: device r % (number of devices).
  std::vector<int> devices;
};

/// Runs `fn(ringzero::local::cuda_communicator&)` on `world_size` threads, one rank each, on
/// CUDA devices (see the file comment), and waits for all of them; every rank's stream has
/// completed when it returns. Throws errc::invalid_argument (world_size < 1, a device index out
/// of range), errc::no_device (no CUDA device), errc::backend_failure (the CUDA runtime failed),
/// or rethrows the exception of the lowest rank whose `fn` threw.
template <class F>
void launch_cuda(int world_size, F&& fn, const cuda_launch_options& options = {}) {
  if (world_size < 1)
    throw error(errc::invalid_argument,
                "local::launch_cuda: world size must be at least 1, got " + std::to_string(world_size));
  const int count = primitive::cudart::require_device("local::launch_cuda");
  for (int d : options.devices)
    if (d < 0 || d >= count)
      throw error(errc::invalid_argument, "local::launch_cuda: CUDA device " + std::to_string(d) + " is outside [0, " +
                                              std::to_string(count) + ")");
  auto device_of = [&](int r) {
    if (options.devices.empty()) return r % count;
    return options.devices[static_cast<std::size_t>(r) % options.devices.size()];
  };
  detail::run_world<cuda_communicator>(
      world_size, options,
      [&](std::optional<cuda_communicator>& comm, world& w, int r) {
        const int device = device_of(r);
        primitive::cudart::use_device(device);
        comm.emplace(w, r, device);
      },
      std::forward<F>(fn), "local::launch_cuda");
}

}  // namespace ringzero::local
