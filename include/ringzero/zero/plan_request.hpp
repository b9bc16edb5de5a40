#pragma once
/// @file
/// What a `zero::shard_plan` is computed from and made of: `plan_request` (with
/// `reshard_policy`), `parameter_placement`, `flat_buffer`, `gather_unit`, `fragment`,
/// `communication_buffers`, and the checked arithmetic and fingerprint helpers the planner uses.
/// Plain values. The manual: docs/zero.md, "Header notes", `ringzero/zero/shard_plan.hpp`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringzero/algorithms/partition.hpp"
#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/enum_names.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/fnv1a.hpp"
#include "ringzero/primitive/memory_space_kind.hpp"
#include "ringzero/zero/offload.hpp"
#include "ringzero/zero/parameter_spec.hpp"
#include "ringzero/zero/precision.hpp"
#include "ringzero/zero/quantization.hpp"

namespace ringzero::zero {

/// "No index".
inline constexpr std::size_t npos = static_cast<std::size_t>(-1);

/// Stage 3: which gather units release their gathered parameters after their forward (FSDP2's
/// `reshard_after_forward`, Zhao et al. 2023 and the torch.distributed.fsdp.fully_shard
/// documentation: a unit kept gathered is not gathered again for its backward). The last unit
/// in forward order is the first in backward order.
enum class reshard_policy : std::uint8_t {
  /// Every unit is released after its forward and gathered again for its backward: the least
  /// memory, two gathers per unit and micro-batch.
  all = 0,
  /// Every unit but the last (FSDP2's default, where the root module keeps its parameters): the
  /// last unit's backward, which follows its forward at once, needs no second gather; the peak
  /// number of gathered units is that of `all`.
  except_last = 1,
  /// No unit: each unit is gathered once per micro-batch and stays gathered until its
  /// backward, so at the end of the forward every unit is gathered (stage 2's traffic with the
  /// whole model gathered at the peak).
  none = 2,
};

/// "all", "except_last" or "none".
inline constexpr enum_names<reshard_policy, 3> reshard_policy_names{"all", "except_last", "none"};
/// The name of `p` (`reshard_policy_names`).
constexpr std::string_view reshard_policy_name(reshard_policy p) noexcept { return reshard_policy_names(p); }

/// The policy named `name` ("all", "except_last" or "none"), or std::nullopt.
constexpr std::optional<reshard_policy> parse_reshard_policy(std::string_view name) noexcept {
  return reshard_policy_names.parse(name);
}

/// Stage 3: the units gathered ahead when one unit's forward or backward starts, instead of the
/// next (forward) or previous (backward) unit: FSDP2's `set_modules_to_forward_prefetch` and
/// `set_modules_to_backward_prefetch`. An absent list keeps the default for that direction.
struct prefetch_list {
  std::string unit;                                  ///< the unit whose pre_forward / pre_backward prefetches
  std::optional<std::vector<std::string>> forward;   ///< gathered ahead, in order, when its forward starts
  std::optional<std::vector<std::string>> backward;  ///< gathered ahead, in order, when its backward starts
};

/// Everything a shard plan depends on.
struct plan_request {
  /// The model's parameters in registration order (names unique).
  std::vector<parameter_spec> parameters;
  /// Total number of ranks (>= 1).
  int world_size = 1;
  /// Ranks per replica group: the ranks that together hold one copy of the model state (shard
  /// within a group, replicate across groups). 0: the whole world (plain ZeRO). Must divide
  /// `world_size` (checked at every stage); stage 0 shards nothing, so it has no other effect there.
  int replica_group_size = 0;
  /// ZeRO stage: 0 (plain data parallelism), 1 (optimizer states), 2 (+ gradients),
  /// 3 (+ parameters).
  int stage = 0;
  /// Alignment of every parameter's start and of every shard boundary, in BYTES (a power of
  /// two; for an element type of s bytes the unit is max(1, alignment_bytes / s) elements).
  std::uint64_t alignment_bytes = 16;
  /// Element types of the model state.
  zero::precision precision{};
  /// Largest automatic gather unit in bytes (parameters without a `unit` are grouped, in order,
  /// into units of at most this size; a larger parameter gets a unit of its own).
  std::uint64_t unit_bytes = std::uint64_t{25} << 20;
  /// Micro-batches per optimizer step (gradient accumulation), >= 1; scales the traffic of the
  /// collectives that run per micro-batch (stage 2's reduce_scatter, stage 3's all of them).
  int accumulation_steps = 1;
  /// Stage 3: gather the next unit while the current one computes (one more gather buffer); the
  /// default that `prefetch_lists` replaces unit by unit.
  bool prefetch = true;
  /// Stage 3: explicit prefetch lists (`prefetch_list`), at most one per unit; the plan sizes the
  /// gather buffers for them (`communication().gather_buffers`). Refused: a list of an unknown
  /// unit, naming an unknown unit or its own unit, or a second list of one unit. No effect at
  /// stages 0-2.
  std::vector<prefetch_list> prefetch_lists;
  /// Stage 3: which units are released after their forward (`reshard_policy`); no effect at
  /// stages 0-2, whose parameters are never released.
  reshard_policy reshard_after_forward = reshard_policy::all;
  /// Stage 3: the most units holding a gathered copy at once (arriving or in use) that a
  /// prefetch may bring about: a prefetch that would exceed it is skipped and the unit is
  /// gathered when it runs. A unit's own gathers (and those of the units it borrows from) are
  /// never held back, and units kept gathered (`reshard_after_forward`) count toward the bound,
  /// so the plan's `communication().gather_buffers` is the peak that results. 0: no bound; 1: no
  /// prefetch while a unit is gathered; 2: one unit ahead. The rate limiter of FSDP1's `limit_all_gathers` and
  /// DeepSpeed's `stage3_max_live_parameters`, counted in units (each gather buffer holds the largest unit).
  /// >= 0; no effect at stages 0-2.
  int max_inflight_gathers = 0;
  /// Stages 2-3: reductions allowed in flight before a new gradient bucket waits for the oldest
  /// (>= 1; 2 lets one reduction overlap the backward of the next unit).
  int max_inflight_reductions = 2;
  /// What the rank keeps in host memory (zero/offload.hpp): offload::optimizer moves master
  /// weights and optimizer states there, with one transfer buffer per trainable buffer for the
  /// gradient shard and one for the updated parameter shard; offload::parameters (stage 3, one
  /// replica group, sharded gradients) moves the parameter and gradient shards there too.
  zero::offload offload = zero::offload::none;
  /// The memory space of the model state (`shard_plan::device_memory()` counts it there): host,
  /// or device for a `zero::sharded_model` whose compute stream is a device's (the device path).
  /// Unset: the plan is for host memory, and `sharded_model`'s constructors that take a request
  /// set it from the compute stream. A `sharded_model` refuses a plan for another space than its
  /// compute stream's. host or device (pinned_host holds only offloaded state).
  std::optional<primitive::memory_space> space;
  /// What the collectives send quantized (zero/quantization.hpp): stage 3's all_gathers of
  /// parameters, the reduction of gradients over the shard group. Changes the plan's traffic
  /// (`traffic_entry::bytes`; `unquantized_bytes` keeps the full-precision figure) and adds one
  /// staging buffer to the communication buffers.
  communication_quantization quantization{};
  /// Stages 2-3: accumulate each micro-batch's gradients locally in a full, unsharded gradient
  /// buffer and reduce_scatter them once per step, in the last micro-batch (FSDP2's
  /// `set_requires_gradient_sync(False)` for all but the last micro-batch; what stages 0-1 always
  /// do): one reduction per step instead of one per micro-batch, for the full gradients' memory
  /// (stage 1's) instead of a shard and the gradient buckets. No effect at stages 0-1.
  bool accumulate_unsharded = false;
  /// Stage 3: a budget per rank, in bytes, for frozen parameters kept gathered (replicated, as
  /// stage 0 keeps every parameter): frozen flat buffers, taken in unit order while their whole
  /// sizes fit, are held whole by every rank for the whole run, never gathered, released or sent
  /// (`flat_buffer::replicated`), for their whole size in memory instead of a shard; the other
  /// frozen buffers are gathered on demand with their unit, as trainable ones. 0 (the default):
  /// none; `keep_all_frozen`: all. No effect at stages 0-2 (every rank holds every parameter).
  std::uint64_t keep_frozen_bytes = 0;
};

/// `plan_request::keep_frozen_bytes` that keeps every frozen buffer gathered.
inline constexpr std::uint64_t keep_all_frozen = ~std::uint64_t{0};

/// Where one parameter lives in the plan.
struct parameter_placement {
  dtype type = dtype::float32;  ///< resolved element type
  std::uint64_t numel = 0;      ///< elements
  std::size_t storage = 0;      ///< index of the parameter owning the storage (itself unless an alias)
  bool alias = false;           ///< true for a tied parameter that is not its group's first member
  std::size_t unit = 0;         ///< the gather unit that uses this parameter
  std::size_t buffer = 0;       ///< the flat buffer holding the storage
  std::uint64_t offset = 0;     ///< element offset of the storage in that buffer
};

/// One flat buffer: the storage-owning parameters of one unit with one element type and one
/// trainable flag, aligned and padded, split into equal shards.
struct flat_buffer {
  std::size_t unit = 0;                  ///< owning gather unit
  dtype type = dtype::float32;           ///< element type of the parameters
  dtype gradient_type = dtype::float32;  ///< element type of the gradients (trainable only)
  bool trainable = true;                 ///< false: frozen, no gradient or optimizer state
  bool has_master = false;               ///< the optimizer keeps a master copy (trainable only)
  std::vector<std::size_t> parameters;   ///< storage-owning parameters, in layout order
  std::uint64_t payload = 0;             ///< elements of those parameters
  std::uint64_t numel = 0;               ///< elements including padding (shards * shard_numel)
  std::uint64_t shard_numel = 0;         ///< elements of one shard
  std::uint64_t gather_offset = 0;       ///< byte offset in its unit's gather buffer (stage 3)
  std::uint64_t gradient_offset = 0;     ///< byte offset in its unit's gradient bucket (sharded gradients)
  /// Stage 3, frozen: every rank holds the buffer whole for the whole run (kept gathered within
  /// `plan_request::keep_frozen_bytes`); it has no region in its unit's gather buffer.
  bool replicated = false;

  /// Elements of shard `index` (0 <= index < shards): [index*shard_numel, (index+1)*shard_numel).
  constexpr algorithms::range shard(int index) const noexcept {
    const auto i = static_cast<std::uint64_t>(index);
    return {i * shard_numel, (i + 1) * shard_numel};
  }
  /// Padding elements (alignment gaps and tail).
  constexpr std::uint64_t padding() const noexcept { return numel - payload; }
};

/// A gather unit: the parameters that are gathered, used and released together at stage 3 (and
/// whose gradients are reduced together at every stage). FSDP's wrapping unit.
struct gather_unit {
  std::string name;                   ///< the `parameter_spec::unit` (or "auto:<k>")
  std::vector<std::size_t> buffers;   ///< its flat buffers
  std::vector<std::size_t> members;   ///< every parameter used in it, aliases included, in order
  std::vector<std::size_t> borrowed;  ///< other units whose storage its aliases use
  std::uint64_t gather_bytes = 0;     ///< bytes of its gathered parameters (gather buffer layout)
  std::uint64_t gradient_bytes = 0;   ///< bytes of its full gradients (gradient bucket layout)
  bool has_gradients = false;         ///< it owns trainable storage of at least one element
};

/// A piece of one parameter owned by one rank: `count` elements from `parameter_offset` (in the
/// parameter, flattened) that sit at `shard_offset` in the rank's shard of `buffer`.
struct fragment {
  std::size_t parameter = 0;
  std::size_t buffer = 0;
  std::uint64_t parameter_offset = 0;
  std::uint64_t shard_offset = 0;
  std::uint64_t count = 0;
  friend constexpr bool operator==(const fragment&, const fragment&) = default;
};

/// The communication buffers of the canonical schedule (all ranks alike).
struct communication_buffers {
  std::uint64_t gather_buffer_bytes = 0;    ///< one gather buffer: the largest unit's gather_bytes
  std::uint64_t gather_buffers = 0;         ///< gather buffers live at once (stage 3)
  std::uint64_t gradient_bucket_bytes = 0;  ///< one bucket: the largest unit's gradient_bytes
  std::uint64_t gradient_buckets = 0;       ///< buckets live at once (stages 2-3; 0 with accumulate_unsharded)
  /// Quantized communication's staging buffer (one; the collectives run one after another on the
  /// communication stream): the largest of a quantized all_gather's segments and a quantized
  /// gradient reduction's send and receive segments. 0 without quantization.
  std::uint64_t quantization_bytes = 0;
  /// Bytes of all of them (unchecked; a `shard_plan` refuses a request for which this overflows).
  constexpr std::uint64_t bytes() const noexcept {
    return gather_buffer_bytes * gather_buffers + gradient_bucket_bytes * gradient_buckets + quantization_bytes;
  }
};

namespace detail {

using ringzero::detail::fnv1a;  // the plan fingerprint's hash (core/fnv1a.hpp)

/// Adds parameter `s` as the plan fingerprint sees it (name, shape, dtype, trainable flag, tie
/// group, unit) to `h`.
inline void hash_parameter(fnv1a& h, const parameter_spec& s) noexcept {
  h.text(s.name);
  h.u64(s.shape.size());
  for (std::uint64_t d : s.shape) h.u64(d);
  h.u64(s.type ? 1 + static_cast<std::uint64_t>(*s.type) : 0);
  h.u64(s.trainable ? 1 : 0);
  h.text(s.tie_group);
  h.text(s.unit);
}

/// Adds a precision setup (every dtype and the optimizer state count) to `h`.
inline void hash_precision(fnv1a& h, const zero::precision& pr) noexcept {
  h.u64(static_cast<std::uint64_t>(pr.parameter));
  h.u64(pr.gradient ? 1 + static_cast<std::uint64_t>(*pr.gradient) : 0);
  h.u64(pr.master ? 1 + static_cast<std::uint64_t>(*pr.master) : 0);
  h.u64(static_cast<std::uint64_t>(pr.optimizer_state));
  h.u64(static_cast<std::uint64_t>(pr.optimizer_states));
}

/// A hash of prefetch lists (units, directions given, names in order); 0 for none.
inline std::uint64_t hash_prefetch_lists(const std::vector<prefetch_list>& lists) noexcept {
  if (lists.empty()) return 0;
  fnv1a h;
  for (const prefetch_list& l : lists) {
    h.text(l.unit);
    for (const auto* names : {&l.forward, &l.backward}) {
      h.u64(names->has_value() ? 1 + (*names)->size() : 0);
      if (names->has_value())
        for (const std::string& n : **names) h.text(n);
    }
  }
  return h.value();
}

/// The plan fingerprint of `q` (FNV-1a over every setting that changes the plan): equal
/// requests give equal fingerprints; a setting left at its default adds nothing, so plans made
/// before it existed keep their fingerprints.
inline std::uint64_t request_fingerprint(const plan_request& q) noexcept {
  fnv1a h;
  h.text("ringzero.zero.shard_plan.v1");
  h.u64(static_cast<std::uint64_t>(q.world_size));
  h.u64(static_cast<std::uint64_t>(q.replica_group_size == 0 ? q.world_size : q.replica_group_size));
  h.u64(static_cast<std::uint64_t>(q.stage));
  h.u64(q.alignment_bytes);
  h.u64(q.unit_bytes);
  h.u64(static_cast<std::uint64_t>(q.accumulation_steps));
  h.u64(q.prefetch ? 1 : 0);
  h.u64(static_cast<std::uint64_t>(q.max_inflight_reductions));
  hash_precision(h, q.precision);
  if (q.stage == 3 && q.reshard_after_forward != reshard_policy::all) {  // as offload below
    h.text("reshard_after_forward");
    h.u64(static_cast<std::uint64_t>(q.reshard_after_forward));
  }
  if (q.stage == 3 && q.max_inflight_gathers != 0) {  // as offload
    h.text("max_inflight_gathers");
    h.u64(static_cast<std::uint64_t>(q.max_inflight_gathers));
  }
  if (q.space && *q.space != primitive::memory_space::host) {  // as offload
    h.text("space");
    h.u64(static_cast<std::uint64_t>(*q.space));
  }
  if (q.offload != offload::none) {  // plans without offload keep their fingerprints
    h.text("offload");
    h.u64(static_cast<std::uint64_t>(q.offload));
  }
  if (q.stage >= 2 && q.accumulate_unsharded) h.text("accumulate_unsharded");  // as offload
  if (q.quantization.any()) {                                                  // as offload
    h.text("quantization");
    h.u64(static_cast<std::uint64_t>(q.quantization.weights));
    h.u64(static_cast<std::uint64_t>(q.quantization.gradients));
    h.u64(q.quantization.block_size);
  }
  if (q.stage == 3 && q.keep_frozen_bytes != 0) {  // as offload
    h.text("keep_frozen_bytes");
    h.u64(q.keep_frozen_bytes);
  }
  if (q.stage == 3 && !q.prefetch_lists.empty()) {  // as offload
    h.text("prefetch_lists");
    h.u64(hash_prefetch_lists(q.prefetch_lists));
  }
  h.u64(q.parameters.size());
  for (const parameter_spec& s : q.parameters) hash_parameter(h, s);
  return h.value();
}

using ringzero::detail::checked_add;  // the checked arithmetic of core/checked_arithmetic.hpp
using ringzero::detail::checked_mul;
using ringzero::detail::checked_round_up;

[[noreturn]] inline void plan_error(const std::string& message) {
  throw error(errc::invalid_argument, "zero::shard_plan: " + message);
}

/// `a + b`; a sum that does not fit in 64 bits refuses the request with errc::invalid_argument
/// "<what> overflows 64 bits".
inline std::uint64_t add_or_refuse(std::uint64_t a, std::uint64_t b, std::string_view what) {
  const auto sum = checked_add(a, b);
  if (!sum) plan_error(std::string(what) + " overflows 64 bits");
  return *sum;
}

/// `a * b`; a product that does not fit in 64 bits refuses the request with errc::invalid_argument
/// "<what> overflows 64 bits".
inline std::uint64_t multiply_or_refuse(std::uint64_t a, std::uint64_t b, std::string_view what) {
  const auto product = checked_mul(a, b);
  if (!product) plan_error(std::string(what) + " overflows 64 bits");
  return *product;
}

/// `x` rounded up to a multiple of `m` (m >= 1); a result that does not fit in 64 bits refuses
/// the request with errc::invalid_argument "<what> overflows 64 bits".
inline std::uint64_t round_up_or_refuse(std::uint64_t x, std::uint64_t m, std::string_view what) {
  const auto rounded = checked_round_up(x, m);
  if (!rounded) plan_error(std::string(what) + " overflows 64 bits");
  return *rounded;
}

/// The units each of `units`' forward and backward gather ahead at stage 3 (the request's
/// `prefetch_lists` resolved to unit numbers over the default of `prefetch`), into `forward` and
/// `backward` (one list per unit; all empty at stages 0-2). Refuses (errc::invalid_argument) a
/// list of an unknown unit, a second list of one unit, and a list naming an unknown unit or its own.
inline void resolve_prefetch(const plan_request& q, const std::vector<gather_unit>& units,
                             std::vector<std::vector<std::size_t>>& forward,
                             std::vector<std::vector<std::size_t>>& backward) {
  const std::size_t n = units.size();
  const bool stage3 = q.stage == 3;
  forward.assign(n, {});
  backward.assign(n, {});
  for (std::size_t u = 0; stage3 && q.prefetch && u < n; ++u) {
    if (u + 1 < n) forward[u] = {u + 1};
    if (u > 0) backward[u] = {u - 1};
  }
  std::map<std::string, std::size_t, std::less<>> index;
  for (std::size_t u = 0; u < n; ++u) index.emplace(units[u].name, u);
  std::vector<bool> listed(n, false);
  for (const prefetch_list& l : q.prefetch_lists) {
    const auto it = index.find(l.unit);
    if (it == index.end()) plan_error("a prefetch list is given for unit '" + l.unit + "', which no parameter names");
    if (listed[it->second]) plan_error("unit '" + l.unit + "' has two prefetch lists");
    listed[it->second] = true;
    for (bool ahead : {true, false}) {
      const auto& names = ahead ? l.forward : l.backward;
      if (!names || !stage3) continue;
      std::vector<std::size_t>& out = (ahead ? forward : backward)[it->second];
      out.clear();
      const std::string where =
          std::string("the ") + (ahead ? "forward" : "backward") + " prefetch list of unit '" + l.unit + "'";
      for (const std::string& name : *names) {
        const auto v = index.find(name);
        if (v == index.end()) plan_error(where + " names unit '" + name + "', which no parameter names");
        if (v->second == it->second) plan_error(where + " names the unit itself");
        out.push_back(v->second);
      }
    }
  }
}

/// Refuses (errc::invalid_argument) a negative `max_inflight_gathers` and a memory space other
/// than host or device.
inline void validate_gathers_and_space(const plan_request& q) {
  if (q.max_inflight_gathers < 0)
    plan_error("max_inflight_gathers must be 0 (no bound) or positive, got " + std::to_string(q.max_inflight_gathers));
  if (q.space && *q.space != primitive::memory_space::host && *q.space != primitive::memory_space::device)
    plan_error(std::string("the model state's memory space must be host or device, got ") +
               primitive::to_string(*q.space));
}

/// Refuses (errc::invalid_argument) a request's quantization settings that no plan can meet
/// (zero/quantization.hpp's `communication_quantization`).
inline void validate_quantization(const plan_request& q) {
  const communication_quantization& qz = q.quantization;
  if (!is_valid(qz.weights) || !is_valid(qz.gradients))
    plan_error("quantization widths must be none, int8 or int4, got values " +
               std::to_string(static_cast<unsigned>(qz.weights)) + " (weights) and " +
               std::to_string(static_cast<unsigned>(qz.gradients)) + " (gradients)");
  if (qz.any() && !valid_quantization_block(qz.block_size))
    plan_error("the quantization block size must be a power of two from " + std::to_string(min_quantization_block) +
               " to " + std::to_string(max_quantization_block) + ", got " + std::to_string(qz.block_size));
  if (qz.weights != quantized_bits::none && q.stage != 3)
    plan_error("quantized weights (" + std::string(quantized_bits_name(qz.weights)) +
               ") need stage 3, whose all_gathers they apply to; the stage is " + std::to_string(q.stage));
  if (qz.gradients != quantized_bits::none && q.stage == 0)
    plan_error("quantized gradients (" + std::string(quantized_bits_name(qz.gradients)) +
               ") need stage 1, 2 or 3, whose reduce_scatter they apply to; stage 0 all_reduces");
}

/// The staging buffer quantized communication needs (`communication_buffers::quantization_bytes`)
/// for `buffers` split into `shards`: the largest quantized all_gather (weights) and twice the
/// largest quantized gradient reduction (send and receive). Refuses (errc::invalid_argument) a
/// buffer to quantize whose type is not float32, bfloat16 or float16, naming its first parameter.
inline std::uint64_t quantization_staging_bytes(const plan_request& q, const std::vector<flat_buffer>& buffers,
                                                int shards) {
  const communication_quantization& qz = q.quantization;
  auto quantizable = [](dtype t) { return t == dtype::float32 || t == dtype::bfloat16 || t == dtype::float16; };
  std::uint64_t most = 0;
  auto need = [&](quantized_bits bits, std::uint64_t shard_numel, std::uint64_t copies) {
    const quantized_layout l{bits, qz.block_size, shard_numel, static_cast<std::uint32_t>(shards)};
    if (l.blocks() * l.segments > std::uint64_t{0x7fffffff})  // the CUDA grid of a dequantization
      plan_error("a flat buffer of " + std::to_string(shard_numel * l.segments) + " elements has more than 2^31 - 1 " +
                 "quantization blocks of " + std::to_string(qz.block_size) + " elements: raise the block size");
    const std::uint64_t segment = quantized_layout{bits, qz.block_size, shard_numel, 1}.bytes();
    most = std::max(most, multiply_or_refuse(multiply_or_refuse(segment, static_cast<std::uint64_t>(shards),
                                                                "the quantization staging buffer"),
                                             copies, "the quantization staging buffer"));
  };
  for (const flat_buffer& f : buffers) {
    if (f.numel == 0) continue;
    const std::string& first = q.parameters[f.parameters.front()].name;
    if (qz.weights != quantized_bits::none && !f.replicated) {  // a replicated buffer is never gathered
      if (!quantizable(f.type))
        plan_error("quantized weights need float32, bfloat16 or float16 parameters; parameter '" + first + "' is " +
                   std::string(dtype_name(f.type)) +
                   (f.trainable ? "" : " (a frozen buffer kept gathered is not quantized: keep_frozen_bytes)"));
      need(qz.weights, f.shard_numel, 1);
    }
    if (qz.gradients != quantized_bits::none && f.trainable) {
      if (!quantizable(f.gradient_type))
        plan_error("quantized gradients need float32, bfloat16 or float16 gradients; those of parameter '" + first +
                   "' are " + std::string(dtype_name(f.gradient_type)));
      need(qz.gradients, f.shard_numel, 2);
    }
  }
  return most;
}

}  // namespace detail

}  // namespace ringzero::zero
