#pragma once
/// @file
/// `zero::offload`: what of a rank's ZeRO state lives in host memory instead of the device's
/// (ZeRO-Offload, Ren et al. 2021, section 4; PyTorch FSDP2's CPUOffloadPolicy). A `plan_request`
/// field: the plan counts device and host bytes apart (`shard_plan::device_memory()`,
/// `host_memory()`), and `zero::sharded_model` on the device path keeps the offloaded state in
/// pinned host memory and updates it on the CPU. Pure values. The manual: docs/zero.md, "CPU offload".

#include <optional>
#include <string_view>

#include "ringzero/core/enum_names.hpp"

namespace ringzero::zero {

/// What a plan keeps in host memory.
enum class offload : unsigned char {
  none,       ///< everything in the compute stream's memory (the default)
  optimizer,  ///< master weights, optimizer states and the step's transfer buffers in host memory;
              ///< the optimizer update runs on the CPU
  parameters  ///< stage 3 only: as `optimizer`, and the rank's parameter and gradient shards in host
              ///< memory too, updated there in place (FSDP2's CPUOffloadPolicy): a unit's shard is
              ///< copied into its gather buffer before an in-place all_gather, each reduced gradient
              ///< shard is added into host memory; the device holds the gather buffers, buckets,
              ///< quantization's staging and frozen buffers kept whole
};

/// "none", "optimizer" or "parameters".
inline constexpr enum_names<offload, 3> offload_names{"none", "optimizer", "parameters"};
/// The name of `o` (`offload_names`).
constexpr std::string_view offload_name(offload o) noexcept { return offload_names(o); }

/// The offload named `name` ("none", "optimizer", "parameters"), or std::nullopt.
constexpr std::optional<offload> parse_offload(std::string_view name) noexcept { return offload_names.parse(name); }

}  // namespace ringzero::zero
