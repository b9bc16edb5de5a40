#pragma once
/// @file
/// How ringzero's element types and reduce ops map onto MPI for the `native` algorithm: MPI's
/// predefined datatypes and ops where they match ringzero's arithmetic, user-defined ops
/// (MPI_Op_create) for float16, bfloat16 and 8-bit sums, and derived datatypes for counts above
/// INT_MAX. The table and the documented differences: docs/mpi.md ("The `native` algorithm").

#include "ringzero/backend/mpi/environment.hpp"

#include <climits>
#include <cstdint>
#include <mutex>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/reduce_op.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::mpi {

/// The MPI datatype that moves elements of `t` (float16 and bfloat16 as MPI_UINT16_T bits).
/// Precondition: `is_valid(t)`.
inline MPI_Datatype datatype_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return MPI_FLOAT;
    case dtype::float64: return MPI_DOUBLE;
    case dtype::float16: return MPI_UINT16_T;
    case dtype::bfloat16: return MPI_UINT16_T;
    case dtype::int8: return MPI_INT8_T;
    case dtype::uint8: return MPI_UINT8_T;
    case dtype::int32: return MPI_INT32_T;
    case dtype::uint32: return MPI_UINT32_T;
    case dtype::int64: return MPI_INT64_T;
    case dtype::uint64: return MPI_UINT64_T;
  }
  return MPI_DATATYPE_NULL;
}

namespace detail {

/// The user-defined MPI operation body for `D` and `K`: inout[i] = in[i] (K) inout[i] with
/// ringzero's arithmetic (primitive::reduce_into).
template <dtype D, reduce_kind K>
void user_op_body(void* in, void* inout, int* length, MPI_Datatype*) {
  primitive::reduce_spec spec;
  spec.type = D;
  spec.kind = K;
  primitive::reduce_into(inout, in, inout, static_cast<std::uint64_t>(*length), spec);
}

/// The four combining kinds MPI needs (avg and premul_sum reduce with sum).
inline constexpr int combining_kinds = 4;

/// Index of `k` among sum, prod, min, max (avg and premul_sum are sums).
constexpr int combining_index(reduce_kind k) noexcept {
  switch (k) {
    case reduce_kind::prod: return 1;
    case reduce_kind::min: return 2;
    case reduce_kind::max: return 3;
    default: return 0;
  }
}

/// ringzero's user-defined MPI operations, created once per process on first use (thread-safe)
/// and kept until MPI_Finalize: every combining kind for float16 and bfloat16 (MPI has no
/// such types), and sum for int8 and uint8 (see `operation_of`).
struct user_ops {
  MPI_Op half[2][combining_kinds] = {};
  MPI_Op int8_sum = MPI_OP_NULL;
  MPI_Op uint8_sum = MPI_OP_NULL;

  static user_ops& instance() {
    static user_ops ops;
    static std::once_flag once;
    std::call_once(once, [] {
      MPI_Op_create(&user_op_body<dtype::float16, reduce_kind::sum>, 1, &ops.half[0][0]);
      MPI_Op_create(&user_op_body<dtype::float16, reduce_kind::prod>, 1, &ops.half[0][1]);
      MPI_Op_create(&user_op_body<dtype::float16, reduce_kind::min>, 1, &ops.half[0][2]);
      MPI_Op_create(&user_op_body<dtype::float16, reduce_kind::max>, 1, &ops.half[0][3]);
      MPI_Op_create(&user_op_body<dtype::bfloat16, reduce_kind::sum>, 1, &ops.half[1][0]);
      MPI_Op_create(&user_op_body<dtype::bfloat16, reduce_kind::prod>, 1, &ops.half[1][1]);
      MPI_Op_create(&user_op_body<dtype::bfloat16, reduce_kind::min>, 1, &ops.half[1][2]);
      MPI_Op_create(&user_op_body<dtype::bfloat16, reduce_kind::max>, 1, &ops.half[1][3]);
      MPI_Op_create(&user_op_body<dtype::int8, reduce_kind::sum>, 1, &ops.int8_sum);
      MPI_Op_create(&user_op_body<dtype::uint8, reduce_kind::sum>, 1, &ops.uint8_sum);
    });
    return ops;
  }
};

}  // namespace detail

/// The MPI operation that combines elements of `t` for `k` (sum for avg and premul_sum, whose
/// extra steps the caller applies). Predefined ops for the standard types, ringzero's
/// user-defined ops for float16 and bfloat16, and for 8-bit integer sums: Open MPI 4.1's
/// vectorised (AVX) MPI_SUM on MPI_INT8_T and MPI_UINT8_T saturates instead of wrapping
/// (120 + 100 gives 127, not -36) in the part of a buffer it vectorises. (Checked on
/// Open MPI 4.1.4: the 32- and 64-bit sums and every prod, min and max wrap or compare as
/// ringzero's do.)
/// Preconditions: valid `t` and `k`; MPI active.
inline MPI_Op operation_of(dtype t, reduce_kind k) {
  const int i = detail::combining_index(k);
  if (t == dtype::float16 || t == dtype::bfloat16)
    return detail::user_ops::instance().half[t == dtype::float16 ? 0 : 1][i];
  if (t == dtype::int8 && i == 0) return detail::user_ops::instance().int8_sum;
  if (t == dtype::uint8 && i == 0) return detail::user_ops::instance().uint8_sum;
  constexpr MPI_Op predefined[detail::combining_kinds] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
  return predefined[i];
}

namespace detail {

/// A committed MPI datatype that owns its handle (freed on destruction while MPI is active).
class owned_datatype {
 public:
  owned_datatype() = default;
  explicit owned_datatype(MPI_Datatype t) noexcept : type_(t) {}
  owned_datatype(const owned_datatype&) = delete;
  owned_datatype& operator=(const owned_datatype&) = delete;
  ~owned_datatype() {
    if (type_ != MPI_DATATYPE_NULL && is_active()) MPI_Type_free(&type_);
  }
  MPI_Datatype get() const noexcept { return type_; }
  /// Frees the current type (if any) and owns `t`.
  void reset(MPI_Datatype t) noexcept {
    if (type_ != MPI_DATATYPE_NULL && is_active()) MPI_Type_free(&type_);
    type_ = t;
  }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

/// A datatype describing `bytes` contiguous bytes as ONE element (extent `bytes`), for moving
/// blocks larger than INT_MAX bytes: `q` pieces of 1 GiB followed by the remainder.
/// Returns MPI_SUCCESS and the committed type in `*out`, or MPI's error code.
inline int make_block_type(std::uint64_t bytes, MPI_Datatype* out) {
  constexpr std::uint64_t piece = std::uint64_t{1} << 30;
  const std::uint64_t pieces = bytes / piece;
  const std::uint64_t rest = bytes % piece;
  MPI_Datatype gib = MPI_DATATYPE_NULL, body = MPI_DATATYPE_NULL;
  int rc = MPI_Type_contiguous(static_cast<int>(piece), MPI_BYTE, &gib);
  if (rc != MPI_SUCCESS) return rc;
  // pieces < 2^31 for any block below 2^61 bytes.
  rc = MPI_Type_contiguous(static_cast<int>(pieces), gib, &body);
  MPI_Type_free(&gib);
  if (rc != MPI_SUCCESS) return rc;
  int lengths[2] = {1, static_cast<int>(rest)};
  MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>(pieces * piece)};
  MPI_Datatype types[2] = {body, MPI_BYTE};
  MPI_Datatype whole = MPI_DATATYPE_NULL;
  rc = MPI_Type_create_struct(rest != 0 ? 2 : 1, lengths, displacements, types, &whole);
  MPI_Type_free(&body);
  if (rc != MPI_SUCCESS) return rc;
  rc = MPI_Type_commit(&whole);
  if (rc != MPI_SUCCESS) {
    MPI_Type_free(&whole);
    return rc;
  }
  *out = whole;
  return MPI_SUCCESS;
}

}  // namespace detail

}  // namespace ringzero::mpi
