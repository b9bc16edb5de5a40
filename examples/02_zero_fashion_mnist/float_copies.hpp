#pragma once
/// @file
/// Example 02's --precision bfloat16: the runtime keeps parameters and gradients in bfloat16
/// (zero::precision::bfloat16_adam: float32 master weights and optimizer states), while the MLP
/// computes in float32. A layer runs on float32 copies: its parameters widened before it runs,
/// its gradient so far widened before backward and rounded (to nearest even) back into the
/// runtime's bfloat16 gradient after it. The copies live in the compute's memory (host or
/// device) and are made on its stream, so the CUDA path converts with kernels on the trainer's
/// stream and the host paths with the same conversion on the host. Threads: one object per rank.
#include <algorithm>
#include <cstddef>
#include <span>

#include "mlp.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/stream.hpp"

namespace ringzero::examples::zero_example {

/// What a layer needs float32 copies of: nothing (--precision float32), its bfloat16 parameters
/// (--reduce-dtype float32: float32 gradients), or its bfloat16 parameters and gradients.
enum class copies_of { nothing, parameters, parameters_and_gradients };

/// Four float32 buffers of `stride` elements each, from `base` (the compute's memory): a layer's
/// weight and bias (slots 0 and 1) and their gradients (slots 2 and 3), and who converts.
struct float_copies {
  float* base = nullptr;
  std::size_t stride = 0;
  /// The compute stream that converts, in order with the layer's work (null: the calling thread).
  primitive::stream* stream = nullptr;
  /// Whether the runtime's gradients are bfloat16 too (else float32, --reduce-dtype float32:
  /// the layer adds into them directly and the gradient slots stay unused).
  bool bfloat16_gradients = true;

  /// The copy of tensor `i`'s parameters (the MLP's tensors alternate weight, bias).
  float* parameter(std::size_t i) const noexcept { return base + (i % 2) * stride; }
  /// The copy of tensor `i`'s gradient.
  float* gradient(std::size_t i) const noexcept { return base + (2 + i % 2) * stride; }
  /// `values` widened into `copy` (exact), on `stream`; returns `copy`.
  float* widen(float* copy, std::span<const bfloat16> values) const {
    cast(copy, dtype::float32, values.data(), dtype::bfloat16, values.size());
    return copy;
  }
  /// `copy` rounded into `values` (to nearest even, primitive::cast_into's rounding), on `stream`.
  void narrow(std::span<bfloat16> values, const float* copy) const {
    cast(values.data(), dtype::bfloat16, copy, dtype::float32, values.size());
  }

 private:
  void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t count) const {
    if (stream != nullptr)
      stream->cast(dst, dst_type, src, src_type, count);
    else
      primitive::cast_into(dst, dst_type, src, src_type, count);
  }
};

/// Elements of `net`'s largest tensor: each copy's size.
inline std::size_t largest_tensor(const mlp& net) {
  std::size_t most = 0;
  for (std::size_t i = 0; i < net.tensor_count(); ++i) most = std::max(most, net.tensor(i).count);
  return most;
}

/// Float elements of the copies of `what` for `net` (two slots for parameters, four with gradients).
inline std::size_t copy_elements(const mlp& net, copies_of what) {
  const std::size_t slots = what == copies_of::nothing ? 0 : what == copies_of::parameters ? 2 : 4;
  return slots * largest_tensor(net);
}

/// The copies of `what` for `net` laid out in `memory` (`copy_elements(net, what)` floats of the
/// compute's memory), converted on `stream`; none (a null `base`) for `copies_of::nothing`.
inline float_copies copies_in(float* memory, const mlp& net, copies_of what, primitive::stream* stream) {
  if (what == copies_of::nothing) return {};
  return float_copies{memory, largest_tensor(net), stream, what == copies_of::parameters_and_gradients};
}

}  // namespace ringzero::examples::zero_example
