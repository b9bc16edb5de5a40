#pragma once
/// @file
/// `primitive::memory_space`, the enumeration alone (host, pinned host, CUDA device), for headers
/// that name a space without allocating in it (the planner's request); `memory_buffer` and
/// allocation are in primitive/memory_space.hpp.

#include <cstdint>

#include "ringzero/core/enum_names.hpp"

namespace ringzero::primitive {

/// Where memory lives.
enum class memory_space : std::uint8_t {
  host,         ///< pageable host memory
  pinned_host,  ///< page-locked host memory (cudaMallocHost): DMA-able, for overlapped copies
  device,       ///< CUDA device memory of one device
};

/// "host", "pinned_host" or "device".
inline constexpr enum_names<memory_space, 3> memory_space_names{"host", "pinned_host", "device"};
/// The name of `s` (`memory_space_names`).
constexpr const char* to_string(memory_space s) noexcept { return memory_space_names(s); }

}  // namespace ringzero::primitive
