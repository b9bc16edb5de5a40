#pragma once
/// @file
/// `detail::backend_communicator`: the base of every backend, which is both the user-facing
/// `communicator` and its `transport` (one object, two interfaces). It takes rank and world size
/// once, answers the questions both interfaces ask (rank, world size, memory space, stream) from
/// one place, and hands the collective layer the transport. See docs/backends.md.

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/transport.hpp"

namespace ringzero::detail {

/// A backend: a communicator that is its own transport. See the file comment.
class backend_communicator : public communicator, public transport {
 public:
  using communicator::issued;
  using communicator::rank;
  using communicator::scratch_bytes;
  using communicator::traffic;
  using communicator::world_size;

  /// Which backend this is (each backend answers for both interfaces).
  backend_kind backend() const noexcept override = 0;
  /// Host memory unless the backend says otherwise.
  memory_space space() const noexcept override { return communicator::space(); }
  /// nullptr unless the backend orders its work on a CUDA stream.
  void* cuda_stream() const noexcept override { return communicator::cuda_stream(); }
  /// -1 unless the backend's buffers are on a CUDA device.
  int cuda_device() const noexcept override { return communicator::cuda_device(); }

 protected:
  /// Rank `rank` of `world_size`; throws errc::invalid_argument as communicator's constructor.
  backend_communicator(int rank, int world_size, bool defer_environment_errors = false)
      : communicator(rank, world_size, defer_environment_errors), transport(rank, world_size) {}

 private:
  transport& its_transport() const noexcept override { return const_cast<backend_communicator&>(*this); }
};

}  // namespace ringzero::detail
