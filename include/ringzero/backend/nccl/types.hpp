#pragma once
/// @file
/// NCCL's side of ringzero's vocabulary: the `ncclDataType_t` of a dtype, the `ncclRedOp_t`
/// of a reduce kind, and turning an `ncclResult_t` into a `ringzero::error`.
/// Host code only (nccl.h and the CUDA runtime headers; no nvcc).

#include "ringzero/core/config.hpp"

#if !RINGZERO_HAS_NCCL
#error \
    "ringzero/backend/nccl/*.hpp needs NCCL: define RINGZERO_HAS_NCCL=1 (the ringzero-nccl dependency does) and link nccl and cudart"
#endif

#include <nccl.h>

#include <string>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/reduce_op.hpp"

namespace ringzero::nccl {

/// The NCCL datatype of `t` (every dtype has one).
constexpr ncclDataType_t nccl_type(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
    case dtype::int8: return ncclInt8;
    case dtype::uint8: return ncclUint8;
    case dtype::int32: return ncclInt32;
    case dtype::uint32: return ncclUint32;
    case dtype::int64: return ncclInt64;
    case dtype::uint64: return ncclUint64;
  }
  return ncclFloat32;
}

/// The NCCL operator of a built-in kind (premul_sum needs ncclRedOpCreatePreMulSum instead).
constexpr ncclRedOp_t nccl_op(reduce_kind k) noexcept {
  switch (k) {
    case reduce_kind::sum: return ncclSum;
    case reduce_kind::prod: return ncclProd;
    case reduce_kind::min: return ncclMin;
    case reduce_kind::max: return ncclMax;
    case reduce_kind::avg: return ncclAvg;
    case reduce_kind::premul_sum: break;
  }
  return ncclSum;
}

/// "ncclInvalidUsage: invalid usage (run with NCCL_DEBUG=WARN for details)" plus NCCL's last
/// error text for `comm` when it has one.
inline std::string result_text(ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += std::string(": ") + last;
  return s;
}

/// The errc of an NCCL failure: a remote error means a peer failed or left.
constexpr errc errc_of(ncclResult_t r) noexcept {
  return r == ncclRemoteError ? errc::peer_exited : errc::backend_failure;
}

}  // namespace ringzero::nccl
