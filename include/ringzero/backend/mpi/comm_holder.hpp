#pragma once
/// @file
/// `detail::comm_holder`: an MPI communicator handle that `mpi::communicator` owns, freed on
/// destruction unless released (docs/mpi.md).

#include "ringzero/backend/mpi/environment.hpp"

namespace ringzero::mpi::detail {

/// A communicator handle freed (MPI_Comm_free) on destruction unless released.
class comm_holder {
 public:
  comm_holder() = default;
  explicit comm_holder(MPI_Comm c) noexcept : c_(c) {}
  comm_holder(const comm_holder&) = delete;
  comm_holder& operator=(const comm_holder&) = delete;
  ~comm_holder() { reset(); }
  MPI_Comm get() const noexcept { return c_; }
  MPI_Comm* out() noexcept { return &c_; }
  MPI_Comm release() noexcept {
    MPI_Comm c = c_;
    c_ = MPI_COMM_NULL;
    return c;
  }
  void reset() noexcept {
    if (c_ != MPI_COMM_NULL && is_active()) MPI_Comm_free(&c_);
    c_ = MPI_COMM_NULL;
  }

 private:
  MPI_Comm c_ = MPI_COMM_NULL;
};

}  // namespace ringzero::mpi::detail
