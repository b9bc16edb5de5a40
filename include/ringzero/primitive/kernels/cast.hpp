#pragma once
/// @file
/// The CUDA `cast` kernel: converts `count` elements between any two dtypes by a launcher
/// (primitive/kernels/grid.hpp: a CUDA stream, or the host in CI), with exactly the
/// rules of the host's `cast_into` (primitive/cast.hpp, whose `detail::convert` it calls):
/// round to nearest even into floating types (16-bit floats through float32, as PyTorch),
/// truncate and saturate into integers (NaN -> 0), wrap between integers. The same dtype is a
/// launcher's copy. 16-byte vectorised on the narrower side (primitive/kernels/elementwise.hpp).
/// Returns the launcher's result.

#include <cstdint>
#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/kernels/elementwise.hpp"

namespace ringzero::primitive::kernels {

/// One element of the host's `cast_typed`.
template <class To, class From>
struct cast_element {
  RINGZERO_HOST_DEVICE To operator()(From x) const { return primitive::detail::convert<To>(x); }
};

/// Converts `count` elements of `src_type` at `src` into `dst_type` at `dst`, by `launcher`.
/// `dst` and `src` must not overlap unless equal with the same element size.
/// Returns `launch_invalid_value` for an invalid dtype.
template <class Launcher>
int cast(const Launcher& launcher, void* dst, dtype dst_type, const void* src, dtype src_type,
         std::uint64_t count) noexcept {
  if (!is_valid(dst_type) || !is_valid(src_type)) return launch_invalid_value;
  if (count == 0) return launch_success;
  return visit_dtype(dst_type, [&]<class To>() -> int {
    return visit_dtype(src_type, [&]<class From>() -> int {
      if constexpr (std::is_same_v<To, From>) {
        return launcher.copy(dst, src, count * sizeof(To));
      } else {
        return launch_unary(launcher, static_cast<To*>(dst), static_cast<const From*>(src), count,
                            cast_element<To, From>{});
      }
    });
  });
}

}  // namespace ringzero::primitive::kernels
