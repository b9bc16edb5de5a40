#pragma once
/// @file
/// The algorithm `native` of `mpi::communicator`: MPI's own collectives (MPI_Allreduce,
/// MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast, MPI_Reduce, MPI_Alltoall, MPI_Barrier),
/// in chunks of at most 2^30 elements, watched by the watchdog (backend/mpi/datatype.hpp maps dtypes
/// and ops; docs/mpi.md).
///
/// Out-of-line members of `mpi::communicator`: backend/mpi/communicator.hpp includes this
/// header after the class; it includes that header back only so that it compiles on its own.

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ringzero/backend/mpi/communicator.hpp"

namespace ringzero::mpi {

/// The watchdog's report for a native collective that passed its deadline.
inline std::string communicator::describe_native_timeout(const void* context) const {
  const auto* d = static_cast<const collective_descriptor*>(context);
  error_context c;
  c.backend = "mpi";
  c.rank = rank();
  c.world_size = world_size();
  if (d) {
    c.collective = std::string(collective_name(d->kind));
    c.sequence = static_cast<std::int64_t>(d->sequence);
  }
  const error e(errc::timeout, c,
                "timed out after " + ringzero::detail::seconds_text(timeout()) +
                    " s in a native MPI collective; a blocking MPI call cannot be interrupted, so the job is aborted "
                    "(MPI_Abort). Which ranks did not arrive is unknown to a blocking call: " +
                    (check_ ? std::string("every rank passed the check-mode exchange, so a rank stopped inside MPI")
                            : std::string("run with RINGZERO_CHECK=1 to name them")));
  return e.what();
}

/// The watchdog's tick: when the armed blocking call passed its deadline, writes the report to
/// stderr and ends the job (MPI_Abort with `timeout_exit_code`): a blocking MPI call cannot be
/// interrupted or timed out from inside.
inline void communicator::end_job_if_late() noexcept {
  const void* context = nullptr;
  if (!watchdog_.expired(context)) return;
  std::string message;
  try {
    message = describe_native_timeout(context);
  } catch (...) { message = "ringzero: a blocking MPI call timed out"; }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(data_.get(), timeout_exit_code);
  std::_Exit(timeout_exit_code);  // MPI_Abort does not return; if it ever does, end the process anyway
}

/// Runs `call(sendbuf, recvbuf, count)` over chunks of at most 2^30 elements.
template <class Call>
void communicator::chunked(const void* send, void* recv, std::uint64_t count, std::size_t element_size, Call&& call) {
  constexpr std::uint64_t chunk = std::uint64_t{1} << 30;
  for (std::uint64_t first = 0; first < count; first += chunk) {
    const std::uint64_t len = std::min(chunk, count - first);
    const void* s =
        send == MPI_IN_PLACE || send == nullptr ? send : static_cast<const unsigned char*>(send) + first * element_size;
    void* r = recv == nullptr ? nullptr : static_cast<unsigned char*>(recv) + first * element_size;
    call(s, r, static_cast<int>(len));
  }
}

inline void communicator::describe_block(const collective_descriptor& d, std::uint64_t bytes, block& b) {
  if (bytes <= static_cast<std::uint64_t>(INT_MAX)) {
    b.count = static_cast<int>(bytes);
    b.type = MPI_BYTE;
    return;
  }
  MPI_Datatype t = MPI_DATATYPE_NULL;
  native_check(&d, detail::make_block_type(bytes, &t), "MPI_Type_create_struct");
  b.owned.reset(t);
  b.count = 1;
  b.type = t;
}

/// Runs collective `d` with the MPI library's own collective (the algorithm `native`).
inline void communicator::run_native(const collective_descriptor& d) {
  const int n = world_size(), r = rank();
  const std::uint64_t count = d.count;
  const std::size_t es = dtype_size(d.type);
  const MPI_Datatype type = datatype_of(d.type);
  const bool premul = is_reduction(d.kind) && d.op.kind == reduce_kind::premul_sum;
  const bool avg = is_reduction(d.kind) && d.op.kind == reduce_kind::avg;
  const MPI_Op op = is_reduction(d.kind) ? operation_of(d.type, d.op.kind) : MPI_OP_NULL;
  MPI_Comm comm = data_.get();
  // premul_sum: this rank's input times its scalar, in scratch, then a plain sum.
  auto input_of = [&](std::uint64_t elements) -> const void* {
    if (!premul) return d.send;
    void* scaled = staging().get(staging_native, static_cast<std::size_t>(elements * es));
    primitive::scale_into(scaled, d.send, elements, d.type, d.op.scalar);
    return scaled;
  };
  watchdog_scope watch(*this, d);
  auto lock = mpi_lock();
  switch (d.kind) {
    case collective_kind::all_reduce: {
      const void* in = input_of(count);
      const void* sendbuf = in == d.recv ? MPI_IN_PLACE : in;
      chunked(sendbuf, d.recv, count, es, [&](const void* s, void* v, int len) {
        native_check(&d, MPI_Allreduce(s, v, len, type, op, comm), "MPI_Allreduce");
      });
      if (avg) primitive::divide_into(d.recv, d.recv, count, d.type, n);
      return;
    }
    case collective_kind::reduce_scatter: {
      const void* in = input_of(count * static_cast<std::uint64_t>(n));
      // MPI_IN_PLACE would leave the result at the start of the buffer, not at rank*count
      // (NCCL's convention): an in-place call reduces into scratch and copies.
      const bool aliased = in == d.send && d.in_place;
      void* out = aliased ? staging().get(staging_native, static_cast<std::size_t>(count * es)) : d.recv;
      if (count <= static_cast<std::uint64_t>(INT_MAX)) {
        native_check(&d, MPI_Reduce_scatter_block(in, out, static_cast<int>(count), type, op, comm),
                     "MPI_Reduce_scatter_block");
      } else {
        for (int q = 0; q < n; ++q)
          chunked(static_cast<const unsigned char*>(in) + static_cast<std::uint64_t>(q) * count * es,
                  q == r ? out : nullptr, count, es, [&](const void* s, void* v, int len) {
                    native_check(&d, MPI_Reduce(s, v, len, type, op, q, comm), "MPI_Reduce");
                  });
      }
      if (aliased) primitive::copy_bytes(d.recv, out, static_cast<std::size_t>(count * es));
      if (avg) primitive::divide_into(d.recv, d.recv, count, d.type, n);
      return;
    }
    case collective_kind::all_gather: {
      block b;
      describe_block(d, count * es, b);
      native_check(&d,
                   MPI_Allgather(d.in_place ? MPI_IN_PLACE : d.send, b.count, b.type, d.recv, b.count, b.type, comm),
                   "MPI_Allgather");
      return;
    }
    case collective_kind::broadcast: {
      if (r == d.root && d.send != d.recv) primitive::copy_bytes(d.recv, d.send, static_cast<std::size_t>(count * es));
      chunked(nullptr, d.recv, count * es, 1, [&](const void*, void* v, int len) {
        native_check(&d, MPI_Bcast(v, len, MPI_BYTE, d.root, comm), "MPI_Bcast");
      });
      return;
    }
    case collective_kind::reduce: {
      const void* in = input_of(count);
      if (r == d.root) {
        const void* sendbuf = in == d.recv ? MPI_IN_PLACE : in;
        chunked(sendbuf, d.recv, count, es, [&](const void* s, void* v, int len) {
          native_check(&d, MPI_Reduce(s, v, len, type, op, d.root, comm), "MPI_Reduce");
        });
        if (avg) primitive::divide_into(d.recv, d.recv, count, d.type, n);
      } else {
        chunked(in, nullptr, count, es, [&](const void* s, void*, int len) {
          native_check(&d, MPI_Reduce(s, nullptr, len, type, op, d.root, comm), "MPI_Reduce");
        });
      }
      return;
    }
    case collective_kind::all_to_all: {
      block b;
      describe_block(d, count * es, b);
      native_check(&d, MPI_Alltoall(d.send, b.count, b.type, d.recv, b.count, b.type, comm), "MPI_Alltoall");
      return;
    }
    case collective_kind::barrier: native_check(&d, MPI_Barrier(comm), "MPI_Barrier"); return;
    default: break;
  }
  raise(&d, errc::unsupported, "no native MPI collective for " + std::string(collective_name(d.kind)));
}

}  // namespace ringzero::mpi
