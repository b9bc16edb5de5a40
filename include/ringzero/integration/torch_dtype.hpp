#pragma once
/// @file
/// `integration::dtype_of_torch`: the ringzero `dtype` of a libtorch scalar type, shared by the
/// libtorch bridges. Needs libtorch; never included by <ringzero/ringzero.hpp>.

#include <c10/core/ScalarType.h>

#include <optional>

#include "ringzero/core/dtype.hpp"

namespace ringzero::integration {

/// The ringzero dtype of `t`, or std::nullopt for types ringzero has none of (complex, bool,
/// quantized, ...). Pure; any thread.
inline std::optional<dtype> dtype_of_torch(c10::ScalarType t) noexcept {
  switch (t) {
    case c10::ScalarType::Float: return dtype::float32;
    case c10::ScalarType::Double: return dtype::float64;
    case c10::ScalarType::Half: return dtype::float16;
    case c10::ScalarType::BFloat16: return dtype::bfloat16;
    case c10::ScalarType::Char: return dtype::int8;
    case c10::ScalarType::Byte: return dtype::uint8;
    case c10::ScalarType::Int: return dtype::int32;
    case c10::ScalarType::Long: return dtype::int64;
    default: return std::nullopt;  // c10::ScalarType has some 30 more enumerators: none has a ringzero dtype
  }
}

}  // namespace ringzero::integration
