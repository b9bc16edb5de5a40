#pragma once
/// @file
/// `primitive::memory_space`, the enumeration alone (host, pinned host, CUDA device), for headers
/// that name a space without allocating in it (the planner's request); `memory_buffer` and
/// allocation are in primitive/memory_space.hpp.

#include <cstdint>

namespace ringzero::primitive {

/// Where memory lives.
enum class memory_space : std::uint8_t {
  host,         ///< pageable host memory
  pinned_host,  ///< page-locked host memory (cudaMallocHost): DMA-able, for overlapped copies
  device,       ///< CUDA device memory of one device
};

/// "host", "pinned_host" or "device".
constexpr const char* to_string(memory_space s) noexcept {
  switch (s) {
    case memory_space::host: return "host";
    case memory_space::pinned_host: return "pinned_host";
    case memory_space::device: return "device";
  }
  return "invalid memory_space";
}

}  // namespace ringzero::primitive
