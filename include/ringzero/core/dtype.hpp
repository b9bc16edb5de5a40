#pragma once
/// @file
/// Element types that ringzero moves and reduces, with their sizes, names and the mapping
/// between a C++ type and its `dtype` value.
///
/// Names follow PyTorch (`float32`, `bfloat16`, ...); `parse_dtype` also accepts the short
/// names nccl-tests prints (`float`, `double`, `half`). Everything here is constexpr and pure.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "ringzero/core/enum_names.hpp"
#include "ringzero/core/half.hpp"

namespace ringzero {

/// The element type of a buffer. The numbering is stable (it is written into checkpoints and
/// exchanged between processes); a value outside the enumerators is rejected by every call that
/// takes a `dtype` with `errc::invalid_argument`.
enum class dtype : std::uint8_t {
  float32 = 0,
  float64 = 1,
  float16 = 2,
  bfloat16 = 3,
  int8 = 4,
  uint8 = 5,
  int32 = 6,
  uint32 = 7,
  int64 = 8,
  uint64 = 9,
};

/// Number of `dtype` enumerators; valid values are `0 .. dtype_count - 1`.
inline constexpr int dtype_count = 10;

/// Every `dtype`, in enumerator order (for sweeps in tests and benchmarks).
inline constexpr dtype all_dtypes[dtype_count] = {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                                                  dtype::int8,    dtype::uint8,   dtype::int32,   dtype::uint32,
                                                  dtype::int64,   dtype::uint64};

/// True when `t` is one of the enumerators.
constexpr bool is_valid(dtype t) noexcept { return static_cast<unsigned>(t) < static_cast<unsigned>(dtype_count); }

/// Size of one element in bytes; 0 for an invalid `dtype`.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return 4;
    case dtype::float64: return 8;
    case dtype::float16: return 2;
    case dtype::bfloat16: return 2;
    case dtype::int8: return 1;
    case dtype::uint8: return 1;
    case dtype::int32: return 4;
    case dtype::uint32: return 4;
    case dtype::int64: return 8;
    case dtype::uint64: return 8;
  }
  return 0;
}

/// True for float32, float64, float16 and bfloat16.
constexpr bool is_floating_point(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::float16 || t == dtype::bfloat16;
}

/// True for the signed integer types int8, int32 and int64.
constexpr bool is_signed_integer(dtype t) noexcept {
  return t == dtype::int8 || t == dtype::int32 || t == dtype::int64;
}

/// The canonical name ("float32", "bfloat16", "int8", ...); "invalid" for an invalid value.
inline constexpr enum_names<dtype, dtype_count> dtype_names{"float32", "float64", "float16", "bfloat16", "int8",
                                                            "uint8",   "int32",   "uint32",  "int64",    "uint64"};
/// The canonical name of `t` (`dtype_names`).
constexpr std::string_view dtype_name(dtype t) noexcept { return dtype_names(t); }

/// The short name nccl-tests prints in its `type` column ("float", "double", "half", "bfloat16",
/// "int8", "uint8", "int32", "uint32", "int64", "uint64").
constexpr std::string_view dtype_short_name(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float";
    case dtype::float64: return "double";
    case dtype::float16: return "half";
    default: return dtype_name(t);
  }
}

/// Parses a canonical name or an nccl-tests short name ("float", "double", "half", "bf16",
/// "fp16", "fp32", "fp64", "int", "uint" also accepted); std::nullopt when unknown.
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (dtype t : all_dtypes)
    if (s == dtype_name(t) || s == dtype_short_name(t)) return t;
  if (s == "fp32") return dtype::float32;
  if (s == "fp64") return dtype::float64;
  if (s == "fp16") return dtype::float16;
  if (s == "bf16") return dtype::bfloat16;
  if (s == "int") return dtype::int32;
  if (s == "uint") return dtype::uint32;
  if (s == "char") return dtype::int8;
  return std::nullopt;
}

}  // namespace ringzero

// CUDA's own 16-bit types (cuda_fp16.h, cuda_bf16.h), declared here so that spans of them are
// accepted wherever a float16 / bfloat16 span is, whether or not the CUDA headers come first.
// Same layout as ringzero's float16 / bfloat16 (IEEE binary16, bfloat16 bits; 2 bytes).
struct __half;
struct __nv_bfloat16;

namespace ringzero {

namespace detail {
/// The element type of each `dtype`, in enumerator order.
using dtype_types = std::tuple<float, double, float16, bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t,
                               std::int64_t, std::uint64_t>;
static_assert(std::tuple_size_v<dtype_types> == dtype_count);

/// The position of `T` in `std::tuple<Ts...>`; -1 when it is not there.
template <class T, class Tuple>
inline constexpr int type_index = -1;
template <class T, class... Ts>
inline constexpr int type_index<T, std::tuple<Ts...>> = [] {
  int i = 0;
  for (bool same : {std::is_same_v<T, Ts>...}) {
    if (same) return i;
    ++i;
  }
  return -1;
}();

template <class T>
struct dtype_of_impl {};
template <class T>
requires(type_index<T, dtype_types> >= 0) struct dtype_of_impl<T> {
  static constexpr dtype value = static_cast<dtype>(type_index<T, dtype_types>);
};
template <>
struct dtype_of_impl<::__half> {  // CUDA's half: the same bits as float16
  static constexpr dtype value = dtype::float16;
};
template <>
struct dtype_of_impl<::__nv_bfloat16> {  // CUDA's bfloat16: the same bits as bfloat16
  static constexpr dtype value = dtype::bfloat16;
};

template <dtype D>
struct dtype_type_impl {
  using type = std::tuple_element_t<static_cast<std::size_t>(D), dtype_types>;
};
}  // namespace detail

/// True when `T` (cv-qualifiers ignored) is one of the ten element types, or CUDA's `__half` /
/// `__nv_bfloat16` (taken as float16 / bfloat16).
template <class T>
concept element_type = requires {
  detail::dtype_of_impl<std::remove_cv_t<T>>::value;
};

/// The `dtype` of an element type: `dtype_of<float> == dtype::float32`.
template <element_type T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>::value;

/// The element type of a `dtype`: `dtype_type<dtype::int8>` is `std::int8_t`.
template <dtype D>
using dtype_type = typename detail::dtype_type_impl<D>::type;

/// Calls `f.template operator()<T>()` with the element type `T` of `t` and returns its result.
/// Precondition: `is_valid(t)` (an invalid value calls nothing and returns a value-initialised result).
template <class F>
constexpr decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f.template operator()<float>();
    case dtype::float64: return f.template operator()<double>();
    case dtype::float16: return f.template operator()<float16>();
    case dtype::bfloat16: return f.template operator()<bfloat16>();
    case dtype::int8: return f.template operator()<std::int8_t>();
    case dtype::uint8: return f.template operator()<std::uint8_t>();
    case dtype::int32: return f.template operator()<std::int32_t>();
    case dtype::uint32: return f.template operator()<std::uint32_t>();
    case dtype::int64: return f.template operator()<std::int64_t>();
    case dtype::uint64: return f.template operator()<std::uint64_t>();
  }
  using result = decltype(f.template operator()<float>());
  if constexpr (std::is_void_v<result>)
    return;
  else
    return result{};
}

}  // namespace ringzero
