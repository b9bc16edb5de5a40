#pragma once
/// @file
/// The `native` algorithm's descriptor: the backend's own collective (MPI_Allreduce,
/// ncclAllReduce, ...) through transport::run_native, for every collective but send and recv.
/// It has no cost formula: the model picks it only when the backend prefers it
/// (transport::prefers_native) or when no other algorithm is available.

#include "ringzero/algorithms/algorithm_descriptor.hpp"

namespace ringzero::algorithms {

namespace detail {
/// Hands the schedule's descriptor to the backend: `c.d`, which is the float32 copy of a 16-bit
/// sum (float32_accumulation.hpp); it carries `c.op`'s kind and sequence number. The backend's
/// transfers are not visible: the traffic counters get a ring's bytes as an estimate
/// (traffic_figures::estimated_sent).
inline void run_native_collective(const call& c) {
  c.t.run_native(c.d);
  c.t.count_estimated_traffic(c.op, ringzero::detail::ring_bytes_per_rank(c.d.kind, c.n(), c.bytes(c.d.count)));
}

/// native's collectives: all but send and recv; which ones a backend has is its `supports`.
inline constexpr collective_entry native_collectives[] = {
    {collective_kind::all_reduce, run_native_collective, nullptr},
    {collective_kind::reduce_scatter, run_native_collective, nullptr},
    {collective_kind::all_gather, run_native_collective, nullptr},
    {collective_kind::broadcast, run_native_collective, nullptr},
    {collective_kind::reduce, run_native_collective, nullptr},
    {collective_kind::all_to_all, run_native_collective, nullptr},
    {collective_kind::barrier, run_native_collective, nullptr},
};
}  // namespace detail

/// native: the backend moves the data itself.
inline constexpr algorithm_descriptor native_descriptor{algorithm::native, detail::native_collectives, false, true,
                                                        "its own collectives (mpi, nccl)"};

}  // namespace ringzero::algorithms
