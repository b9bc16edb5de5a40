#pragma once
/// @file
/// `data_ops`: the work an algorithm does on its own rank's memory (copy, combine, scale, cast), kept
/// apart from the transfers so that one schedule serves host memory and CUDA device memory.
/// A thin view of the memory-and-stream layer (docs/streams.md): `host_data_ops` calls the
/// synchronous host primitives directly on the calling thread (the hot path: no queue, no extra
/// indirection per element); `device_data_ops` (algorithms/device_data_ops.hpp) enqueues on
/// the communicator's stream through a primitive::device_stream_ref.

#include <cstdint>

#include "ringzero/backend/transport.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/copy.hpp"
#include "ringzero/primitive/reduce.hpp"
#include "ringzero/primitive/sum_broadcast.hpp"

namespace ringzero::algorithms {

/// Work on one rank's own buffers. Counts in elements, sizes in bytes.
class data_ops {
 public:
  virtual ~data_ops() = default;
  /// Copies `bytes` bytes (no-op when dst == src). `streaming`: the result will not be read soon.
  virtual void copy(void* dst, const void* src, std::uint64_t bytes, bool streaming = false) const = 0;
  /// `dst = a (op) b` per `spec` (primitive::reduce_into semantics).
  virtual void reduce(void* dst, const void* a, const void* b, std::uint64_t count,
                      const primitive::reduce_spec& spec) const = 0;
  /// `dst = scalar * src` with premul_sum's arithmetic.
  virtual void scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar) const = 0;
  /// Converts `count` elements of `src_type` at `src` into `dst_type` at `dst` with
  /// primitive/cast.hpp's rules (the 16-bit types' float32 accumulation widens and narrows
  /// with it). `dst` and `src` must not overlap unless equal with equal element sizes.
  virtual void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) const = 0;
  /// A combine for `sendrecv_reduce` applying `*spec` (which must outlive every use).
  virtual combine_fn combine(const primitive::reduce_spec* spec) const = 0;
  /// Orders this rank's writes before a later release (streaming stores need a fence).
  virtual void fence() const {}
  /// The direct all_reduce's fused loop (primitive::sum_broadcast_streaming): every output gets
  /// the rank-order sum of the inputs, written with streaming stores. Returns false, having
  /// written nothing, when this memory space or this call has no fused form (default).
  /// Arguments: outs[n_out], ins[n_in], count elements of `type`.
  virtual bool sum_to_all_streaming(void* const* /*outs*/, int /*n_out*/, const void* const* /*ins*/, int /*n_in*/,
                                    std::uint64_t /*count*/, dtype /*type*/) const {
    return false;
  }
};

/// `data_ops` on host memory, executed synchronously on the calling thread.
class host_data_ops final : public data_ops {
 public:
  void copy(void* dst, const void* src, std::uint64_t bytes, bool streaming = false) const override {
    if (streaming)
      primitive::copy_bytes_streaming(dst, src, static_cast<std::size_t>(bytes));
    else
      primitive::copy_bytes(dst, src, static_cast<std::size_t>(bytes));
  }
  void reduce(void* dst, const void* a, const void* b, std::uint64_t count,
              const primitive::reduce_spec& spec) const override {
    primitive::reduce_into(dst, a, b, count, spec);
  }
  void scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar) const override {
    primitive::scale_into(dst, src, count, type, scalar);
  }
  void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) const override {
    primitive::cast_into(dst, dst_type, src, src_type, count);
  }
  combine_fn combine(const primitive::reduce_spec* spec) const override {
    combine_fn f;
    f.fn = [](const void* context, void* dst, const void* a, const void* b, std::uint64_t count) {
      primitive::reduce_into(dst, a, b, count, *static_cast<const primitive::reduce_spec*>(context));
    };
    f.context = spec;
    f.element_size = dtype_size(spec->type);
    return f;
  }
  void fence() const override { primitive::store_fence(); }
  bool sum_to_all_streaming(void* const* outs, int n_out, const void* const* ins, int n_in, std::uint64_t count,
                            dtype type) const override {
    return primitive::sum_broadcast_streaming(outs, n_out, ins, n_in, count, type);
  }
};

/// The `data_ops` for a communicator's memory space (host only until the CUDA backend adds its own).
inline const data_ops& host_ops() noexcept {
  static const host_data_ops ops;
  return ops;
}

}  // namespace ringzero::algorithms
