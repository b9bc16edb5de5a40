#pragma once
/// @file
/// Building one rank's `collective_descriptor` from a public call, with every local argument
/// check: dtype and op values, premul_sum's scalar, root range, byte-size overflow, null buffers,
/// overlapping buffers that do not follow NCCL's in-place convention, and the algorithm.
///
/// A failed check does not throw here: it is recorded in `descriptor.invalid` and reported on
/// every rank by the backend's contract check, so a bad argument on one rank can never leave the
/// others waiting. Buffer roles follow NCCL: counts are per rank; all_reduce/broadcast/reduce
/// are in place when send == recv, reduce_scatter when recv == send + rank*count, all_gather
/// when send == recv + rank*count; broadcast ignores send on non-root ranks and reduce ignores
/// recv on non-root ranks.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/contract.hpp"
#include "ringzero/collective/options.hpp"
#include "ringzero/collective/request.hpp"
#include "ringzero/collective/selection.hpp"
#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/primitive/device_primitives.hpp"

namespace ringzero::detail {

/// Sets `d.reproducible` for request `q` and records its refusals with `fail` (see
/// collective_options::reproducible): a per-call request for anything but a floating sum, avg or
/// premul_sum of all_reduce, reduce_scatter or reduce; floating prod under RINGZERO_REPRODUCIBLE;
/// device memory (errc::unsupported); more than 2^26 contributions in one accumulator.
template <class Fail>
void describe_reproducible(const communicator& c, const collective_request& q, collective_descriptor& d, Fail&& fail) {
  const bool requested = q.options.reproducible || q.binned != nullptr;
  if (!is_reduction(q.kind) || !(requested || c.reproducible())) return;
  const bool supported_kind = q.kind == collective_kind::all_reduce || q.kind == collective_kind::reduce_scatter ||
                              q.kind == collective_kind::reduce;
  const bool floating = is_valid(q.type) && is_floating_point(q.type);
  const bool summing =
      q.op.kind == reduce_kind::sum || q.op.kind == reduce_kind::avg || q.op.kind == reduce_kind::premul_sum;
  const std::string what = std::string(dtype_name(q.type)) + " " + std::string(reduce_kind_name(q.op.kind)) +
                           (supported_kind ? "" : " (" + std::string(collective_name(q.kind)) + ")");
  if (!requested) {  // RINGZERO_REPRODUCIBLE: only where it applies; floating prod is refused
    if (!supported_kind || !floating) return;
    if (q.op.kind == reduce_kind::prod) {
      fail("RINGZERO_REPRODUCIBLE=1 cannot make a " + what +
           " reproducible (prod is not supported; unset it for this communicator)");
      return;
    }
    if (!summing) return;  // min and max are order-independent already
  } else if (!supported_kind || !floating || !summing) {
    fail(
        "reproducible mode supports float16, bfloat16, float32 and float64 with sum, avg or premul_sum in "
        "all_reduce, reduce_scatter and reduce, not " +
        what + (floating ? "" : " (integer reductions are exact already)"));
    return;
  }
  d.reproducible = q.binned != nullptr ? reproducible_mode::accumulator : reproducible_mode::on;
  d.binned = q.binned;
  if (c.space() == memory_space::cuda && d.invalid.empty()) {
    fail("reproducible mode is not available on backend " + std::string(backend_name(c.backend())) +
         " with CUDA device memory (it runs on host memory only)");
    d.invalid_code = errc::unsupported;
  }
}

/// The descriptor of `q` on communicator `c` (sequence number not yet assigned).
inline collective_descriptor describe(const communicator& c, const collective_request& q) {
  collective_descriptor d;
  d.kind = q.kind;
  d.count = q.count;
  d.tag = q.options.tag;
  d.tag_name = q.options.tag_name;
  d.type = q.type;
  d.op = q.op;
  d.root = has_root(q.kind) ? q.root : -1;
  d.send = q.send;
  d.recv = q.recv;
  d.invalid = q.invalid;
  const int n = c.world_size(), r = c.rank();
  const std::string name(collective_name(q.kind));
  auto fail = [&](std::string why) {
    if (d.invalid.empty()) d.invalid = std::move(why);
  };

  if (q.kind != collective_kind::barrier && !is_valid(q.type))
    fail("unknown dtype value " + std::to_string(static_cast<unsigned>(q.type)));
  if (is_reduction(q.kind)) {
    if (!is_valid(q.op.kind))
      fail("unknown reduce op value " + std::to_string(static_cast<unsigned>(q.op.kind)));
    else if (q.op.kind == reduce_kind::premul_sum) {
      const double s = q.op.scalar;
      if (!std::isfinite(s))
        fail("premul_sum scalar is not finite");
      else if (is_valid(q.type) && !is_floating_point(q.type) &&
               (s != std::trunc(s) || std::fabs(s) >= 9007199254740992.0))
        fail("premul_sum scalar " + std::to_string(s) + " is not an integer below 2^53 in magnitude, as " +
             std::string(dtype_name(q.type)) + " requires");
    }
  }
  if (has_root(q.kind) && (q.root < 0 || q.root >= n))
    fail("root " + std::to_string(q.root) + " is outside [0, " + std::to_string(n) + ")");

  // Element counts of the two buffers, by collective and role.
  const bool is_root = d.root == r;
  std::uint64_t send_elems = 0, recv_elems = 0;
  std::optional<std::uint64_t> whole = checked_mul(q.count, static_cast<std::uint64_t>(n));
  switch (q.kind) {
    case collective_kind::all_reduce: send_elems = recv_elems = q.count; break;
    case collective_kind::reduce_scatter:
      send_elems = whole.value_or(0);
      recv_elems = q.count;
      break;
    case collective_kind::all_gather:
      send_elems = q.count;
      recv_elems = whole.value_or(0);
      break;
    case collective_kind::broadcast:
      send_elems = is_root ? q.count : 0;
      recv_elems = q.count;
      break;
    case collective_kind::reduce:
      send_elems = q.count;
      recv_elems = is_root ? q.count : 0;
      break;
    case collective_kind::all_to_all: send_elems = recv_elems = whole.value_or(0); break;
    default: break;
  }
  if (q.binned != nullptr) send_elems = 0;  // an accumulator collective reads no send buffer
  const std::size_t es = is_valid(q.type) ? dtype_size(q.type) : 1;
  const auto send_bytes = checked_buffer_bytes(send_elems, es), recv_bytes = checked_buffer_bytes(recv_elems, es);
  const bool needs_whole = q.kind == collective_kind::reduce_scatter || q.kind == collective_kind::all_gather ||
                           q.kind == collective_kind::all_to_all;
  if ((needs_whole && !whole) || !send_bytes || !recv_bytes || !checked_buffer_bytes(q.count, es)) {
    fail("count " + std::to_string(q.count) + " of " + std::string(dtype_name(q.type)) +
         " overflows the buffer size in bytes" + (needs_whole ? " (times world size " + std::to_string(n) + ")" : ""));
  } else {
    d.send_bytes = *send_bytes;
    d.recv_bytes = *recv_bytes;
  }
  if (d.send_bytes > 0 && q.send == nullptr) fail("send buffer is null with count " + std::to_string(q.count));
  if (d.recv_bytes > 0 && q.recv == nullptr) fail("receive buffer is null with count " + std::to_string(q.count));

  // In-place conventions, and any other overlap of this rank's own buffers.
  if (d.send_bytes > 0 && d.recv_bytes > 0 && d.invalid.empty()) {
    const auto* s = static_cast<const unsigned char*>(q.send);
    const auto* v = static_cast<const unsigned char*>(q.recv);
    const std::uint64_t block = q.count * es, offset = static_cast<std::uint64_t>(r) * block;
    switch (q.kind) {
      case collective_kind::all_reduce:
      case collective_kind::broadcast:
      case collective_kind::reduce: d.in_place = s == v; break;
      case collective_kind::reduce_scatter: d.in_place = v == s + offset; break;
      case collective_kind::all_gather: d.in_place = s == v + offset; break;
      default: break;
    }
    if (!d.in_place && ranges_overlap(q.send, d.send_bytes, q.recv, d.recv_bytes)) {
      std::string rule;
      switch (q.kind) {
        case collective_kind::reduce_scatter: rule = "in place requires recv == send + rank*count"; break;
        case collective_kind::all_gather: rule = "in place requires send == recv + rank*count"; break;
        case collective_kind::all_to_all: rule = "all_to_all cannot run in place"; break;
        default: rule = "in place requires send == recv"; break;
      }
      fail("send buffer " + describe_range(q.send, d.send_bytes) + " and receive buffer " +
           describe_range(q.recv, d.recv_bytes) + " overlap (" + rule + ")");
    }
  }

  // The algorithm (identical on every rank for valid calls: a function of count, dtype and world).
  const double model_bytes =
      static_cast<double>(q.count) * static_cast<double>(es) * (needs_whole ? static_cast<double>(n) : 1.0);
  std::string problem;
  d.algo = resolve_algorithm(c, q.kind, model_bytes, q.options.algo, c.forced_algorithm(), problem);
  if (!problem.empty()) fail(problem);

  describe_reproducible(c, q, d, fail);

  // Device memory needs the CUDA kernels unless the backend's own collective moves the data.
  const bool moves_data = q.kind != collective_kind::barrier && q.count != 0;
  if (c.space() == memory_space::cuda && moves_data && !algorithms::backend_moves_data(d.algo) &&
      primitive::registered_device_primitives() == nullptr)
    fail(primitive::device_primitives_missing_message());
  return d;
}

}  // namespace ringzero::detail
