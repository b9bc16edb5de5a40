#pragma once
/// @file
/// `collective_descriptor`: what one rank asked of one collective (kind, sequence number,
/// count, tag, dtype, op, root, algorithm, reproducible mode, buffers, and whether its
/// arguments were valid).
/// Backends exchange descriptors to check NCCL's contract (same collectives, in the same order,
/// with the same count, dtype, op and root on every rank) and, on the local backend, to find
/// their peers' buffers.

#include <cstdint>
#include <string>

#include "ringzero/collective/options.hpp"
#include "ringzero/core/algorithm.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/enum_names.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/reduce_op.hpp"

namespace ringzero {

namespace primitive {
struct binned_view;
}

/// Whether a reduction runs in reproducible mode (docs/numerics.md), and with which inputs.
/// The numbering is stable (exchanged between processes).
enum class reproducible_mode : std::uint8_t {
  off = 0,          ///< the algorithm's own floating-point combine order
  on = 1,           ///< the reproducible sum of the ranks' inputs, one contribution per rank
  accumulator = 2,  ///< the reproducible sum of each rank's reproducible_accumulator
};

/// "off", "on" or "accumulator".
inline constexpr enum_names<reproducible_mode, 3> reproducible_mode_names{"off", "on", "accumulator"};
/// The name of `m` (`reproducible_mode_names`).
constexpr const char* reproducible_mode_name(reproducible_mode m) noexcept { return reproducible_mode_names(m); }

/// One rank's view of one collective call. Counts are in elements, extents in bytes.
struct collective_descriptor {
  collective_kind kind = collective_kind::barrier;
  std::uint64_t sequence = 0;  ///< n-th collective issued on this communicator (from 0)
  std::uint64_t count = 0;     ///< the count argument as passed (per rank, NCCL's meaning)
  std::uint64_t tag = 0;       ///< the caller's label (collective_options::tag); must match
  tag_namer tag_name;          ///< this rank's namer of tags in errors (local, never on the wire)
  dtype type = dtype::float32;
  reduce_op op{};                         ///< reductions only; scalar may differ between ranks
  int root = -1;                          ///< broadcast and reduce only
  algorithm algo = algorithm::automatic;  ///< the resolved algorithm (never automatic once issued)
  const void* send = nullptr;             ///< send buffer as passed
  void* recv = nullptr;                   ///< receive buffer as passed
  std::uint64_t send_bytes = 0;           ///< bytes this rank reads from `send` (0 when it reads none)
  std::uint64_t recv_bytes = 0;           ///< bytes this rank writes to `recv` (0 when it writes none)
  bool in_place = false;                  ///< the buffers follow NCCL's in-place convention
  reproducible_mode reproducible = reproducible_mode::off;  ///< must match on every rank
  const primitive::binned_view* binned = nullptr;           ///< mode accumulator: this rank's accumulator
  std::string invalid;                                      ///< non-empty: why this rank's arguments are invalid
  errc invalid_code = errc::invalid_argument;  ///< the error `invalid` raises (unsupported or invalid_argument)
};

}  // namespace ringzero
