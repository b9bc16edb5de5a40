#pragma once
/// @file
/// Memory-space operations enqueued on a host stream: `enqueue_copy`, `enqueue_fill`,
/// `enqueue_cast`, `enqueue_scale`, `enqueue_reduce`. Each runs later on the stream's thread
/// with the synchronous host primitive of the same name (copy.hpp, fill.hpp, cast.hpp,
/// reduce.hpp), so results are bitwise those of the primitives. The overloads for a
/// `cuda_stream` (primitive/cuda_stream.hpp) take the same arguments and run the CUDA kernels.
/// Counts are in elements, `bytes` in bytes. Preconditions are the primitives'; the buffers must
/// stay alive until the work has run (as with CUDA). Errors: none at enqueue time.
/// Thread safety: as `host_stream::enqueue`.

#include <cstdint>

#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/copy.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive {

/// Copies `bytes` bytes from `src` to `dst` (no overlap unless equal).
inline void enqueue_copy(host_stream& s, void* dst, const void* src, std::uint64_t bytes) {
  s.enqueue([=] { copy_bytes(dst, src, static_cast<std::size_t>(bytes)); });
}

/// Sets `count` elements of `type` at `dst` to `value` converted to `type`.
inline void enqueue_fill(host_stream& s, void* dst, std::uint64_t count, dtype type, double value) {
  s.enqueue([=] { fill(dst, count, type, value); });
}

/// Converts `count` elements of `src_type` at `src` into `dst_type` at `dst`.
inline void enqueue_cast(host_stream& s, void* dst, dtype dst_type, const void* src, dtype src_type,
                         std::uint64_t count) {
  s.enqueue([=] { cast_into(dst, dst_type, src, src_type, count); });
}

/// `dst = scalar * src` for `count` elements of `type` (premul_sum's arithmetic).
inline void enqueue_scale(host_stream& s, void* dst, const void* src, std::uint64_t count, dtype type, double scalar) {
  s.enqueue([=] { scale_into(dst, src, count, type, scalar); });
}

/// `dst = a (op) b` for `count` elements as `spec` says (reduce_into's semantics).
inline void enqueue_reduce(host_stream& s, void* dst, const void* a, const void* b, std::uint64_t count,
                           const reduce_spec& spec) {
  s.enqueue([=] { reduce_into(dst, a, b, count, spec); });
}

}  // namespace ringzero::primitive
