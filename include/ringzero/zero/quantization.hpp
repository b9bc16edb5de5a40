#pragma once
/// @file
/// Quantized communication of the ZeRO runtime (DeepSpeed ZeRO++'s qwZ and qgZ, Wang et al.
/// 2023): `quantized_bits`, `communication_quantization` (part of a `plan_request`) and
/// `quantized_layout`, the byte layout of a quantized shard on the wire. Plain values.
///
/// A shard of m elements is cut into blocks of `block_size` elements (the last one shorter); each
/// block is sent as one float32 scale, its largest magnitude divided by 127 (int8) or 7 (int4),
/// and one signed integer per element, the element divided by the scale and rounded to nearest
/// even. A segment holds the block scales first, then the integers (int4: two per byte, the
/// even element in the low nibble), padded to a multiple of 4 bytes. A block holding a NaN or
/// an infinity is sent with a non-finite scale and comes back as NaN throughout, so that a
/// step's non-finite check still sees it.
/// Weights (stage 3's all_gathers): each rank quantizes its shard once, the segments are
/// all_gathered, and every rank dequantizes all of them, its own included, so that every rank
/// computes with the same gathered values; the shard itself (and the optimizer's master copy)
/// stays in full precision. Gradients (the shard group's reduce_scatter, stages 1-3): each rank
/// quantizes every other rank's segment of its gradients once, an all_to_all delivers them, and
/// the owner adds them in float32 in rank order, its own contribution unquantized, then divides
/// by the group size: one rounding per contribution, however many ranks (a ring that requantizes
/// its partial sums at every hop rounds n-1 times). The manual: docs/zero.md, "Quantized communication".

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

#include "ringzero/core/config.hpp"

namespace ringzero::zero {

/// The integer width of quantized communication.
enum class quantized_bits : std::uint8_t {
  none = 0,  ///< full precision (the element type)
  int8 = 8,  ///< one signed byte per element, values -127..127
  int4 = 4,  ///< half a byte per element, values -7..7
};

/// "none", "int8" or "int4".
constexpr std::string_view quantized_bits_name(quantized_bits b) noexcept {
  return b == quantized_bits::none   ? "none"
         : b == quantized_bits::int8 ? "int8"
         : b == quantized_bits::int4 ? "int4"
                                     : "invalid";
}

/// The width named `name` ("none", "int8", "int4"), or std::nullopt.
constexpr std::optional<quantized_bits> parse_quantized_bits(std::string_view name) noexcept {
  for (quantized_bits b : {quantized_bits::none, quantized_bits::int8, quantized_bits::int4})
    if (name == quantized_bits_name(b)) return b;
  return std::nullopt;
}

/// Smallest and largest `communication_quantization::block_size`.
inline constexpr std::uint32_t min_quantization_block = 8;
inline constexpr std::uint32_t max_quantization_block = 65536;

/// What a plan's collectives send quantized (see the file comment). A `shard_plan` refuses
/// (errc::invalid_argument) weights other than none below stage 3, gradients other than none at
/// stage 0, a width that is not a `quantized_bits` value, a block size that is not a power of
/// two in [min_quantization_block, max_quantization_block] when anything is quantized, and a
/// parameter (weights) or gradient (gradients) that is not float32, bfloat16 or float16; with a
/// shard group of one rank it quantizes nothing (nothing is sent). The runtime refuses
/// quantization with reproducible accumulation.
struct communication_quantization {
  /// Stage 3's all_gathers of parameters (before forward and before backward). The all_gather
  /// of `read_parameter` and the checkpoint's reads stay in full precision.
  quantized_bits weights = quantized_bits::none;
  /// The reduction of gradients over the shard group (stages 1-3; hybrid sharding's all_reduce
  /// across replica groups stays in full precision).
  quantized_bits gradients = quantized_bits::none;
  /// Elements per scale: a power of two in [min_quantization_block, max_quantization_block].
  std::uint32_t block_size = 256;

  /// Whether anything is quantized.
  constexpr bool any() const noexcept { return weights != quantized_bits::none || gradients != quantized_bits::none; }
};

/// `segments` quantized segments of `count` elements each, as they lie in memory one after
/// another (`segment_bytes()` apart). Its members run on the host and in CUDA kernels.
struct quantized_layout {
  quantized_bits bits = quantized_bits::int8;
  std::uint32_t block_size = 256;
  std::uint64_t count = 0;     ///< elements per segment
  std::uint32_t segments = 1;  ///< segments (ranks)

  /// Blocks, hence scales, per segment.
  RINGZERO_HOST_DEVICE constexpr std::uint64_t blocks() const noexcept { return (count + block_size - 1) / block_size; }
  /// Elements of block `j` of a segment (`block_size`, the last one shorter).
  RINGZERO_HOST_DEVICE constexpr std::uint64_t block_length(std::uint64_t j) const noexcept {
    return count - j * block_size < block_size ? count - j * block_size : block_size;
  }
  /// Bytes of the integers of one segment.
  RINGZERO_HOST_DEVICE constexpr std::uint64_t value_bytes() const noexcept {
    return bits == quantized_bits::int4 ? (count + 1) / 2 : count;
  }
  /// Bytes of one segment: scales, integers, padding to a multiple of 4.
  RINGZERO_HOST_DEVICE constexpr std::uint64_t segment_bytes() const noexcept {
    return (blocks() * 4 + value_bytes() + 3) / 4 * 4;
  }
  /// Bytes of all segments.
  RINGZERO_HOST_DEVICE constexpr std::uint64_t bytes() const noexcept { return segment_bytes() * segments; }
};

/// Whether `b` is a `quantized_bits` value.
constexpr bool is_valid(quantized_bits b) noexcept {
  return b == quantized_bits::none || b == quantized_bits::int8 || b == quantized_bits::int4;
}

/// Whether `block` is a valid `communication_quantization::block_size`.
constexpr bool valid_quantization_block(std::uint32_t block) noexcept {
  return std::has_single_bit(block) && block >= min_quantization_block && block <= max_quantization_block;
}

}  // namespace ringzero::zero
