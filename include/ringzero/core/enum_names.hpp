#pragma once
/// @file
/// `enum_names`: the names of an enumeration whose values are numbered 0 .. N-1, as one table
/// that both names a value and parses a name (each enumeration's `*_name` / `parse_*` pair is one
/// of these). Everything here is constexpr and pure.

#include <cstddef>
#include <optional>
#include <string_view>

namespace ringzero {

/// The names of the values `E(0)` .. `E(N-1)`: `names[i]` names `E(i)`. Build it as
/// `enum_names<E, N>{"first", "second", ...}` with exactly N names (another count does not
/// compile), in enumerator order. Preconditions: E's enumerators are numbered 0 .. N-1 with no
/// gaps; names are distinct.
template <class E, std::size_t N>
struct enum_names {
  const char* names[N];  ///< the name of each value, by its number

  /// The table of `n`, exactly N names (string literals), evaluated at compile time.
  template <class... Names>
  requires(sizeof...(Names) == N) consteval enum_names(const Names&... n) noexcept : names{n...} {}

  /// The name of `e`; "invalid" for a value outside 0 .. N-1 (an enum cast from bad input).
  constexpr const char* operator()(E e) const noexcept {
    const auto i = static_cast<std::size_t>(e);
    return i < N ? names[i] : "invalid";
  }

  /// The value named `s` (an exact, case-sensitive match), or std::nullopt.
  constexpr std::optional<E> parse(std::string_view s) const noexcept {
    for (std::size_t i = 0; i < N; ++i)
      if (s == names[i]) return static_cast<E>(i);
    return std::nullopt;
  }
};

}  // namespace ringzero
