#pragma once
/// @file
/// `zero::shard_plan`: how ZeRO stage 0-3 (Rajbhandari et al. 2020) lays a model's parameters
/// out in flat buffers and shards them across ranks, computed by a pure function of a
/// `plan_request` (the constructor): no backend, no memory beyond the plan itself, usable to plan
/// a job of thousands of ranks on one CPU thread.
/// The manual: docs/zero.md, "Header notes", `ringzero/zero/shard_plan.hpp`.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ringzero/algorithms/partition.hpp"
#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/fnv1a.hpp"
#include "ringzero/zero/gather_schedule.hpp"
#include "ringzero/zero/gradient_schedule.hpp"
#include "ringzero/zero/memory_model.hpp"
#include "ringzero/zero/offload.hpp"
#include "ringzero/zero/parameter_spec.hpp"
#include "ringzero/zero/plan_request.hpp"
#include "ringzero/zero/precision.hpp"
#include "ringzero/zero/traffic_model.hpp"

namespace ringzero::zero {

/// A ZeRO shard plan. See the file comment.
class shard_plan {
 public:
  /// Computes the plan of `request` (a pure function). Throws `ringzero::error` with
  /// errc::invalid_argument naming the problem when the request cannot be met: world size < 1;
  /// a replica group size that is negative or does not divide the world size; a stage outside
  /// 0-3; an alignment that is not a power of two; an unknown dtype value (of a parameter or of
  /// the precision setup); a negative number of optimizer states; a non-floating gradient,
  /// master or optimizer-state type; an empty or duplicate parameter name; a trainable parameter
  /// of an integer type; a parameter whose size in bytes overflows 64 bits; tie-group members that
  /// differ in shape, dtype or trainable flag; a parameter whose unit name collides with an
  /// automatic unit name ("auto:<k>"); accumulation_steps < 1 or max_inflight_reductions < 1;
  /// a prefetch list of an unknown unit, a second list of one unit, or one naming an unknown
  /// unit or its own;
  /// a plan with a figure that does not fit in 64 bits: a unit's layout, padded size, gather
  /// buffer or gradient bucket, the parameter or padding element count, a memory category per
  /// rank, the model states or the total per rank, a traffic entry's calls, elements, bytes or
  /// volume, or the step's volume in elements (the message names the figure and says "overflows
  /// 64 bits"). So every number the plan reports, and every sum of `memory_breakdown` and
  /// `traffic_entry`, is exact.
  explicit shard_plan(plan_request request) : request_(std::move(request)) {
    validate_request();
    place_parameters();
    resolve_prefetch();
    build_buffers();
    index_storages();
    simulate_schedule();
    size_quantization();
    compute_memory();
    compute_traffic();
    compute_fingerprint();
  }

  /// The request this plan was made from.
  const plan_request& request() const noexcept { return request_; }
  /// ZeRO stage (0-3).
  int stage() const noexcept { return request_.stage; }
  /// Total ranks.
  int world_size() const noexcept { return request_.world_size; }
  /// Whether each rank keeps only its shard of the gradients, reduced every micro-batch (stages
  /// 2-3 without `plan_request::accumulate_unsharded`); else the full gradients, reduced once per step.
  bool sharded_gradients() const noexcept { return request_.stage >= 2 && !request_.accumulate_unsharded; }
  /// Shards per buffer: the replica group size at stages 1-3, 1 at stage 0.
  int shards() const noexcept { return shards_; }
  /// Number of replica groups (world_size / replica group size; world_size at stage 0).
  int replica_groups() const noexcept { return request_.world_size / shards_; }
  /// The shard rank `rank` holds: rank mod shards(). Precondition: 0 <= rank < world_size().
  int shard_index(int rank) const noexcept { return rank % shards_; }
  /// The replica group of `rank`: rank / shards().
  int replica_group(int rank) const noexcept { return rank / shards_; }

  /// The parameters (as requested).
  const std::vector<parameter_spec>& parameters() const noexcept { return request_.parameters; }
  /// Where each parameter lives (same order as `parameters()`).
  const std::vector<parameter_placement>& placements() const noexcept { return placements_; }
  /// Index of the parameter named `name`, or std::nullopt.
  std::optional<std::size_t> find(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }
  /// The flat buffers, unit by unit.
  const std::vector<flat_buffer>& buffers() const noexcept { return buffers_; }
  /// The gather units in order (forward order).
  const std::vector<gather_unit>& units() const noexcept { return units_; }

  /// Elements of rank `rank`'s shard of `buffer`, as a range of the buffer.
  algorithms::range shard_range(std::size_t buffer, int rank) const {
    check_rank(rank);
    return buffers_.at(buffer).shard(shard_index(rank));
  }

  /// The parameter fragments rank `rank` owns, by buffer then offset. Together, the fragments of
  /// the ranks of one replica group tile every parameter's storage exactly once; aliases and
  /// zero-size parameters have none. Computed on demand (O(parameters of the overlapping buffers)).
  std::vector<fragment> fragments(int rank) const {
    check_rank(rank);
    std::vector<fragment> out;
    const int index = shard_index(rank);
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      const flat_buffer& buf = buffers_[b];
      const algorithms::range own = buf.shard(index);
      for (std::size_t p : buf.parameters) {
        const parameter_placement& pl = placements_[p];
        const std::uint64_t lo = std::max(own.begin, pl.offset), hi = std::min(own.end, pl.offset + pl.numel);
        if (lo >= hi) continue;
        out.push_back(fragment{p, b, lo - pl.offset, lo - own.begin, hi - lo});
      }
    }
    return out;
  }

  /// The shard index (within a replica group) owning element `element` of parameter `parameter`'s
  /// storage. Throws errc::invalid_argument when out of range.
  int owner(std::size_t parameter, std::uint64_t element) const {
    const parameter_placement& pl = placements_.at(parameter);
    if (element >= pl.numel)
      detail::plan_error("element " + std::to_string(element) + " is outside parameter '" +
                         request_.parameters[parameter].name + "' of " + std::to_string(pl.numel) + " elements");
    const flat_buffer& buf = buffers_[pl.buffer];
    return static_cast<int>((pl.offset + element) / buf.shard_numel);
  }

  /// Memory of every rank by category, in bytes (identical on every rank; padding included):
  /// `device_memory()` plus `host_memory()`, category by category.
  const memory_breakdown& memory() const noexcept { return memory_; }
  /// The part of `memory()` in the compute stream's memory (`space()`: a GPU's on the device
  /// path): all of it without offload; with offload::optimizer parameters, gradients, gather
  /// buffers, gradient buckets and quantization's staging; with offload::parameters the gather
  /// buffers, gradient buckets, quantization's staging and frozen buffers kept whole
  /// (`flat_buffer::replicated`).
  const memory_breakdown& device_memory() const noexcept { return device_memory_; }
  /// The memory space `device_memory()` is in: `plan_request::space`, host when unset.
  primitive::memory_space space() const noexcept { return request_.space.value_or(primitive::memory_space::host); }
  /// The part of `memory()` in host memory (pinned on a GPU): nothing without offload; with
  /// offload::optimizer the master weights, the optimizer states and, as communication buffers,
  /// the transfer buffers (per trainable buffer, the rank's gradient shard and parameter shard);
  /// with offload::parameters the parameter shards, gradient shards, master weights and optimizer
  /// states, and no transfer buffers (the CPU updates the shards where they are).
  const memory_breakdown& host_memory() const noexcept { return host_memory_; }
  /// The communication buffers of the canonical schedule.
  const communication_buffers& communication() const noexcept { return communication_; }
  /// Collectives per optimizer step (each rank takes part in each entry).
  const std::vector<traffic_entry>& traffic() const noexcept { return traffic_; }

  /// Unique parameter elements (tied storage counted once).
  std::uint64_t parameter_elements() const noexcept { return parameter_elements_; }
  /// Unique trainable parameter elements.
  std::uint64_t trainable_elements() const noexcept { return trainable_elements_; }
  /// Padding elements over all buffers.
  std::uint64_t padding_elements() const noexcept { return padding_elements_; }

  /// The trainable storages (non-alias trainable parameters with at least one element), numbered
  /// 0..S-1 in registration order.
  const std::vector<std::size_t>& trainable_storages() const noexcept { return trainable_storages_; }
  /// The number of parameter p's trainable storage (that of its tie group's owner), or `npos` for
  /// a frozen or zero-size parameter (which has no gradient data).
  std::size_t storage_id(std::size_t p) const { return storage_id_.at(placements_.at(p).storage); }
  /// The units whose gradient buckets the backward of unit u writes into (u itself when it owns
  /// trainable storage, and the owners of its aliases' storage).
  const std::vector<std::size_t>& gradient_units(std::size_t u) const { return gradient_units_.at(u); }

  /// True when unit u is released after its forward (at stage 3; the request's
  /// `reshard_after_forward` policy); false at stages 0-2 and for a unit kept gathered until its
  /// backward. Precondition: u < units().size().
  bool reshards_after_forward(std::size_t u) const noexcept {
    if (request_.stage != 3) return false;
    switch (request_.reshard_after_forward) {
      case reshard_policy::all: return true;
      case reshard_policy::except_last: return u + 1 != units_.size();
      case reshard_policy::none: return false;
    }
    return true;
  }

  /// True when every rank holds buffer b whole (at stages 0-2, and a `flat_buffer::replicated`
  /// frozen buffer at stage 3), false when it holds its shard. Precondition: b < buffers().size().
  bool holds_whole(std::size_t b) const noexcept { return request_.stage <= 2 || buffers_[b].replicated; }
  /// Bytes per rank of the frozen buffers kept gathered (`flat_buffer::replicated`), held whole.
  std::uint64_t kept_frozen_bytes() const noexcept {
    std::uint64_t sum = 0;  // at most the parameter memory per rank, which fits
    for (const flat_buffer& f : buffers_)
      if (f.replicated) sum += f.numel * dtype_size(f.type);
    return sum;
  }

  /// The units gathered ahead when unit u's forward (`forward`) or backward starts: its
  /// `prefetch_list` where the request gives one, else u+1 (u-1) with `prefetch`, else none.
  /// Empty at stages 0-2. Precondition: u < units().size().
  const std::vector<std::size_t>& prefetch_after(std::size_t u, bool forward) const noexcept {
    return (forward ? forward_prefetch_ : backward_prefetch_)[u];
  }

  /// The bookkeeping of stage-3 gathers for this plan (zero/gather_schedule.hpp).
  detail::gather_schedule make_gather_schedule() const {
    std::vector<std::vector<std::size_t>> borrowed(units_.size());
    std::vector<bool> empty(units_.size());
    for (std::size_t u = 0; u < units_.size(); ++u) {
      borrowed[u] = units_[u].borrowed;
      empty[u] = units_[u].gather_bytes == 0;
    }
    return detail::gather_schedule(std::move(borrowed), std::move(empty),
                                   request_.stage == 3 ? static_cast<std::size_t>(request_.max_inflight_gathers) : 0);
  }
  /// The bookkeeping of gradient reduction for this plan (zero/gradient_schedule.hpp).
  detail::gradient_schedule make_gradient_schedule() const {
    std::vector<std::size_t> storage_unit(trainable_storages_.size());
    for (std::size_t s = 0; s < trainable_storages_.size(); ++s)
      storage_unit[s] = placements_[trainable_storages_[s]].unit;
    return detail::gradient_schedule(units_.size(), std::move(storage_unit), storage_uses_,
                                     request_.max_inflight_reductions);
  }

  /// A 64-bit fingerprint of the request (FNV-1a): equal requests give equal fingerprints.
  std::uint64_t fingerprint() const noexcept { return fingerprint_; }

 private:
  void check_rank(int rank) const {
    if (rank < 0 || rank >= request_.world_size)
      detail::plan_error("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(request_.world_size) +
                         ")");
  }

  std::uint64_t align_elements(dtype t) const noexcept {
    const std::uint64_t s = dtype_size(t);
    return request_.alignment_bytes <= s ? 1 : request_.alignment_bytes / s;
  }

  void validate_request() {
    const plan_request& q = request_;
    if (q.world_size < 1) detail::plan_error("world size must be at least 1, got " + std::to_string(q.world_size));
    if (q.replica_group_size < 0)
      detail::plan_error("replica group size must be positive (or 0 for the whole world), got " +
                         std::to_string(q.replica_group_size));
    const int group = q.replica_group_size == 0 ? q.world_size : q.replica_group_size;
    if (q.world_size % group != 0)
      detail::plan_error("replica group size " + std::to_string(group) + " does not divide world size " +
                         std::to_string(q.world_size));
    if (q.stage < 0 || q.stage > 3) detail::plan_error("stage must be 0, 1, 2 or 3, got " + std::to_string(q.stage));
    if (q.offload != offload::none && q.offload != offload::optimizer && q.offload != offload::parameters)
      detail::plan_error("offload must be none, optimizer or parameters, got value " +
                         std::to_string(static_cast<unsigned>(q.offload)));
    if (q.offload == offload::parameters) {
      // The shards live in host memory: only stage 3 gathers parameters from a shard per unit,
      // and every collective must still run on device memory (the gather buffers and buckets).
      if (q.stage != 3)
        detail::plan_error(
            "offload::parameters keeps each rank's parameter and gradient shards in host memory and "
            "copies a unit's shard to the device before its all_gather, which is stage 3's; got "
            "stage " +
            std::to_string(q.stage) + ": expected stage 3, or offload::optimizer at stages 0-2");
      if (group != q.world_size)
        detail::plan_error("offload::parameters with hybrid sharding (replica group size " + std::to_string(group) +
                           " of world size " + std::to_string(q.world_size) +
                           ") is not supported: the replicas' all_reduce of the gradient shards would run on host "
                           "memory; expected the whole world as one replica group, or offload::optimizer");
      if (q.accumulate_unsharded)
        detail::plan_error(
            "offload::parameters with accumulate_unsharded: the full gradients the trainer writes "
            "would be host memory; expected accumulate_unsharded = false, or offload::optimizer");
    }
    if (q.reshard_after_forward != reshard_policy::all && q.reshard_after_forward != reshard_policy::except_last &&
        q.reshard_after_forward != reshard_policy::none)
      detail::plan_error("reshard_after_forward must be all, except_last or none, got value " +
                         std::to_string(static_cast<unsigned>(q.reshard_after_forward)));
    if (q.alignment_bytes == 0 || !std::has_single_bit(q.alignment_bytes))
      detail::plan_error("alignment must be a power of two (in bytes), got " + std::to_string(q.alignment_bytes));
    if (q.accumulation_steps < 1)
      detail::plan_error("accumulation steps must be at least 1, got " + std::to_string(q.accumulation_steps));
    detail::validate_gathers_and_space(q);
    if (q.max_inflight_reductions < 1)
      detail::plan_error("max_inflight_reductions must be at least 1, got " +
                         std::to_string(q.max_inflight_reductions));
    shards_ = q.stage == 0 ? 1 : group;
    detail::validate_quantization(q);
    if (shards_ == 1) request_.quantization = {};  // nothing is sent, so nothing is quantized

    const zero::precision& pr = q.precision;
    auto check_type = [](dtype t, const char* what, bool floating) {
      if (!is_valid(t))
        detail::plan_error(std::string("unknown dtype value ") + std::to_string(static_cast<unsigned>(t)) +
                           " for the " + what);
      if (floating && !is_floating_point(t))
        detail::plan_error(std::string("the ") + what + " must have a floating-point dtype, got " +
                           std::string(dtype_name(t)));
    };
    check_type(pr.parameter, "default parameter type", false);
    if (pr.gradient) check_type(*pr.gradient, "gradient type", true);
    if (pr.master) check_type(*pr.master, "master weight type", true);
    check_type(pr.optimizer_state, "optimizer state type", true);
    if (pr.optimizer_states < 0)
      detail::plan_error("the number of optimizer states per element must be >= 0, got " +
                         std::to_string(pr.optimizer_states));
  }

  void place_parameters() {
    const plan_request& q = request_;
    const std::size_t n = q.parameters.size();
    placements_.resize(n);
    std::map<std::string, std::size_t> tie_owner;
    std::map<std::string, std::size_t> unit_index;
    std::size_t auto_count = 0;
    std::size_t current_auto = npos;
    std::uint64_t current_auto_bytes = 0;

    auto unit_for = [&](const std::string& name) {
      auto [it, inserted] = unit_index.emplace(name, units_.size());
      if (inserted) {
        gather_unit u;
        u.name = name;
        units_.push_back(std::move(u));
      }
      return it->second;
    };

    for (std::size_t i = 0; i < n; ++i) {
      const parameter_spec& s = q.parameters[i];
      parameter_placement& pl = placements_[i];
      const std::string who = "parameter " + std::to_string(i) + " ('" + s.name + "')";
      if (s.name.empty()) detail::plan_error("parameter " + std::to_string(i) + " has an empty name");
      if (!by_name_.emplace(s.name, i).second)
        detail::plan_error("parameter name '" + s.name + "' is used twice (indices " +
                           std::to_string(by_name_[s.name]) + " and " + std::to_string(i) + ")");
      pl.type = q.precision.parameter_type(s.type);
      if (!is_valid(pl.type))
        detail::plan_error(who + " has unknown dtype value " + std::to_string(static_cast<unsigned>(pl.type)));
      if (s.trainable && !is_floating_point(pl.type))
        detail::plan_error(who + " is trainable but has the integer dtype " + std::string(dtype_name(pl.type)) +
                           " (mark it frozen)");
      const auto numel = s.numel();
      if (!numel || !detail::checked_mul(*numel, dtype_size(pl.type)) ||
          !detail::checked_mul(*numel, 16))  // room for every per-element category
        detail::plan_error(who + " with shape " + shape_text(s.shape) +
                           " is too large: its size in bytes overflows 64 bits");
      pl.numel = *numel;
      pl.storage = i;

      if (!s.tie_group.empty()) {
        auto [it, first] = tie_owner.emplace(s.tie_group, i);
        if (!first) {
          const std::size_t o = it->second;
          const parameter_spec& os = q.parameters[o];
          const parameter_placement& op = placements_[o];
          auto differ = [&](const std::string& what, const std::string& a, const std::string& b) {
            detail::plan_error("tie group '" + s.tie_group + "': '" + os.name + "' and '" + s.name +
                               "' have different " + what + " (" + a + " vs " + b + ")");
          };
          if (os.shape != s.shape) differ("shapes", shape_text(os.shape), shape_text(s.shape));
          if (op.type != pl.type) differ("dtypes", std::string(dtype_name(op.type)), std::string(dtype_name(pl.type)));
          if (os.trainable != s.trainable)
            differ("trainable flags", os.trainable ? "trainable" : "frozen", s.trainable ? "trainable" : "frozen");
          pl.storage = o;
          pl.alias = true;
        }
      }

      // The unit.
      if (!s.unit.empty()) {
        if (s.unit.rfind("auto:", 0) == 0)
          detail::plan_error(who + " names unit '" + s.unit +
                             "'; names starting with 'auto:' are reserved for automatic units");
        pl.unit = unit_for(s.unit);
        current_auto = npos;
      } else if (pl.alias) {
        pl.unit = placements_[pl.storage].unit;
      } else {
        const std::uint64_t bytes = pl.numel * dtype_size(pl.type);
        if (current_auto == npos ||
            (current_auto_bytes > 0 && bytes > q.unit_bytes - std::min(q.unit_bytes, current_auto_bytes))) {
          current_auto = unit_for("auto:" + std::to_string(auto_count++));
          current_auto_bytes = 0;
        }
        current_auto_bytes += bytes;
        pl.unit = current_auto;
      }
      units_[pl.unit].members.push_back(i);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const parameter_placement& pl = placements_[i];
      if (!pl.alias) continue;
      const std::size_t owner_unit = placements_[pl.storage].unit;
      auto& borrowed = units_[pl.unit].borrowed;
      if (owner_unit != pl.unit && std::find(borrowed.begin(), borrowed.end(), owner_unit) == borrowed.end())
        borrowed.push_back(owner_unit);
    }
  }

  /// The units each unit's forward and backward gather ahead (`prefetch_after`).
  void resolve_prefetch() { detail::resolve_prefetch(request_, units_, forward_prefetch_, backward_prefetch_); }

  void build_buffers() {
    const plan_request& q = request_;
    const auto shards = static_cast<std::uint64_t>(shards_);
    const std::uint64_t region_alignment = std::max<std::uint64_t>(q.alignment_bytes, 16);
    std::uint64_t keep_left = q.stage == 3 ? q.keep_frozen_bytes : 0;  // frozen buffers kept gathered, in unit order
    for (std::size_t u = 0; u < units_.size(); ++u) {
      gather_unit& unit = units_[u];
      const std::string layout = "the layout of unit '" + unit.name + "'";
      // One buffer per (dtype, trainable), in order of first appearance among the unit's storages.
      for (std::size_t p : unit.members) {
        const parameter_placement& pl = placements_[p];
        if (pl.alias) continue;
        const bool trainable = q.parameters[p].trainable;
        std::size_t b = npos;
        for (std::size_t k : unit.buffers)
          if (buffers_[k].type == pl.type && buffers_[k].trainable == trainable) b = k;
        if (b == npos) {
          flat_buffer f;
          f.unit = u;
          f.type = pl.type;
          f.trainable = trainable;
          f.gradient_type = q.precision.gradient_type(pl.type);
          f.has_master = trainable && q.precision.has_master(pl.type);
          b = buffers_.size();
          buffers_.push_back(std::move(f));
          unit.buffers.push_back(b);
        }
        buffers_[b].parameters.push_back(p);
      }
      std::uint64_t gather_at = 0, gradient_at = 0;
      for (std::size_t b : unit.buffers) {
        flat_buffer& f = buffers_[b];
        const std::uint64_t align = align_elements(f.type);
        std::uint64_t at = 0;
        for (std::size_t p : f.parameters) {
          parameter_placement& pl = placements_[p];
          if (pl.numel > 0) at = detail::round_up_or_refuse(at, align, layout);
          pl.buffer = b;
          pl.offset = at;
          at = detail::add_or_refuse(at, pl.numel, layout);
          f.payload += pl.numel;  // at most `at`
        }
        const std::string padded_size = "the padded size of unit '" + unit.name + "'";
        f.numel = detail::round_up_or_refuse(at, detail::multiply_or_refuse(shards, align, padded_size), padded_size);
        detail::multiply_or_refuse(f.numel, 16, padded_size);  // room for every per-element category
        f.shard_numel = f.numel / shards;
        // Sums over buffers: each is checked, so every total the plan reports fits in 64 bits.
        parameter_elements_ =
            detail::add_or_refuse(parameter_elements_, f.payload, "the model's parameter element count");
        if (f.trainable) trainable_elements_ += f.payload;  // at most parameter_elements_
        padding_elements_ = detail::add_or_refuse(padding_elements_, f.padding(), "the model's padding element count");
        const std::uint64_t whole_bytes = f.numel * dtype_size(f.type);  // fits: checked above
        if (!f.trainable && f.numel > 0 && whole_bytes <= keep_left) {
          f.replicated = true;  // held whole by every rank: no region in the gather buffer
          keep_left -= whole_bytes;
          continue;
        }
        // Regions in the unit's gather buffer and gradient bucket.
        const std::string gather_size = "the gather buffer size of unit '" + unit.name + "'";
        gather_at = detail::round_up_or_refuse(gather_at, region_alignment, gather_size);
        f.gather_offset = gather_at;
        gather_at = detail::add_or_refuse(gather_at, f.numel * dtype_size(f.type), gather_size);
        if (f.trainable) {
          const std::string bucket_size = "the gradient bucket size of unit '" + unit.name + "'";
          gradient_at = detail::round_up_or_refuse(gradient_at, region_alignment, bucket_size);
          f.gradient_offset = gradient_at;
          gradient_at = detail::add_or_refuse(gradient_at, f.numel * dtype_size(f.gradient_type), bucket_size);
        }
      }
      unit.gather_bytes = gather_at;
      unit.gradient_bytes = gradient_at;
    }
    for (std::size_t i = 0; i < placements_.size(); ++i)
      if (placements_[i].alias) {
        placements_[i].buffer = placements_[placements_[i].storage].buffer;
        placements_[i].offset = placements_[placements_[i].storage].offset;
      }
  }

  /// Runs the canonical schedule of one micro-batch through the runtime's bookkeeping and records
  /// how many gather buffers and gradient buckets it holds at once, and how often each unit is
  /// gathered.
  void simulate_schedule() {
    const std::size_t n = units_.size();
    gathers_forward_.assign(n, 0);
    gathers_backward_.assign(n, 0);
    if (request_.stage < 2 || n == 0) return;
    struct counting_hooks {
      std::vector<std::uint64_t>* starts;
      void start(std::size_t u) { (*starts)[u] += 1; }
      void wait(std::size_t) noexcept {}
      void free(std::size_t) noexcept {}
    };
    detail::null_gradient_hooks gh;
    detail::gradient_schedule grads = make_gradient_schedule();
    const bool stage3 = request_.stage == 3;
    detail::gather_schedule gathers = make_gather_schedule();
    counting_hooks forward{&gathers_forward_}, backward{&gathers_backward_};
    if (stage3) {
      for (std::size_t u = 0; u < n; ++u) {
        gathers.use(u, forward);
        for (std::size_t v : forward_prefetch_[u]) gathers.prefetch(v, forward);
        gathers.wait_for(u, forward);
        gathers.done(u, forward, !reshards_after_forward(u));
      }
    }
    for (std::size_t u = n; u-- > 0;) {
      if (stage3) {
        gathers.use(u, backward);
        for (std::size_t v : backward_prefetch_[u]) gathers.prefetch(v, backward);
        gathers.wait_for(u, backward);
      }
      for (std::size_t w : gradient_units_[u]) grads.acquire(w, gh);
      if (stage3) gathers.done(u, backward);
      grads.unit_done(u, gh);
    }
    grads.finish(gh);
    if (stage3) gathers.release_all(backward);

    for (const gather_unit& u : units_) {
      communication_.gather_buffer_bytes = std::max(communication_.gather_buffer_bytes, u.gather_bytes);
      communication_.gradient_bucket_bytes = std::max(communication_.gradient_bucket_bytes, u.gradient_bytes);
    }
    communication_.gradient_buckets = grads.buckets();
    if (stage3)
      communication_.gather_buffers = gathers.peak();
    else
      communication_.gather_buffer_bytes = 0;
    if (!sharded_gradients()) communication_.gradient_buckets = 0;  // the full gradients hold them
    if (communication_.gradient_buckets == 0) communication_.gradient_bucket_bytes = 0;
  }

  /// Numbers the trainable storages and lists, per unit, the storages it uses and the units
  /// whose gradient buckets its backward writes into.
  void index_storages() {
    storage_id_.assign(placements_.size(), npos);
    for (gather_unit& u : units_) u.has_gradients = false;
    for (std::size_t p = 0; p < placements_.size(); ++p)
      if (!placements_[p].alias && request_.parameters[p].trainable && placements_[p].numel > 0) {
        units_[placements_[p].unit].has_gradients = true;
        storage_id_[p] = trainable_storages_.size();
        trainable_storages_.push_back(p);
      }
    storage_uses_.assign(units_.size(), {});
    gradient_units_.assign(units_.size(), {});
    // The unit that last listed each storage and each target unit: every list keeps its first
    // occurrences in member order, in time linear in the members (a search of the list made
    // 300,000 parameters of one unit take 12 s).
    std::vector<std::size_t> storage_listed_by(trainable_storages_.size(), npos), unit_listed_by(units_.size(), npos);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      for (std::size_t p : units_[u].members) {
        const std::size_t s = storage_id_[placements_[p].storage];
        if (s == npos) continue;
        if (storage_listed_by[s] != u) {
          storage_listed_by[s] = u;
          storage_uses_[u].push_back(s);
        }
        const std::size_t w = placements_[placements_[p].storage].unit;
        if (unit_listed_by[w] != u) {
          unit_listed_by[w] = u;
          gradient_units_[u].push_back(w);
        }
      }
    }
  }

  /// The staging buffer of quantized communication (refuses a buffer that cannot be quantized).
  void size_quantization() {
    communication_.quantization_bytes = detail::quantization_staging_bytes(request_, buffers_, shards_);
  }

  /// Memory per rank by category. Every product and sum is checked, so each category, the model
  /// states and the total (memory_breakdown's sums) fit in 64 bits, or the request is refused.
  void compute_memory() {
    const int stage = request_.stage;
    const zero::precision& pr = request_.precision;
    const bool offloaded = request_.offload != offload::none;
    const bool shards_offloaded = request_.offload == offload::parameters;  // stage 3 (validated)
    memory_breakdown& optimizer_side = offloaded ? host_memory_ : device_memory_;
    memory_breakdown& shard_side = shards_offloaded ? host_memory_ : device_memory_;
    // category += elements * bytes per element
    auto add = [](std::uint64_t& category, std::uint64_t elements, std::uint64_t element_bytes, std::string_view what) {
      category = detail::add_or_refuse(category, detail::multiply_or_refuse(elements, element_bytes, what), what);
    };
    for (const flat_buffer& f : buffers_) {
      const std::uint64_t full = f.numel, shard = f.shard_numel;
      const bool sharded = stage >= 3 && !f.replicated;  // a replicated (frozen) buffer stays whole on the device
      add((sharded ? shard_side : device_memory_).parameters, sharded ? shard : full, dtype_size(f.type),
          "the parameter memory per rank");
      if (!f.trainable) continue;
      add(shard_side.gradients, sharded_gradients() ? shard : full, dtype_size(f.gradient_type),
          "the gradient memory per rank");
      const std::uint64_t own = stage >= 1 ? shard : full;
      if (f.has_master)
        add(optimizer_side.master_weights, own, dtype_size(*pr.master), "the master weight memory per rank");
      add(optimizer_side.optimizer_states, own, pr.state_bytes_per_element(), "the optimizer state memory per rank");
      if (offloaded && !shards_offloaded)  // the gradient shard in, the updated parameter shard out
        add(host_memory_.communication_buffers, own, dtype_size(f.gradient_type) + dtype_size(f.type),
            "the host transfer buffer memory per rank");
    }
    const communication_buffers& c = communication_;
    constexpr std::string_view buffers = "the communication buffer memory per rank";
    device_memory_.communication_buffers = detail::add_or_refuse(
        detail::add_or_refuse(detail::multiply_or_refuse(c.gather_buffer_bytes, c.gather_buffers, buffers),
                              detail::multiply_or_refuse(c.gradient_bucket_bytes, c.gradient_buckets, buffers),
                              buffers),
        c.quantization_bytes, buffers);
    constexpr std::string_view states =
        "the model-state memory per rank (parameters, gradients, master weights, optimizer states)";
    // Device plus host, category by category: each sum, the model states and the total fit.
    memory_.parameters = detail::add_or_refuse(device_memory_.parameters, host_memory_.parameters, states);
    memory_.gradients = detail::add_or_refuse(device_memory_.gradients, host_memory_.gradients, states);
    memory_.master_weights = device_memory_.master_weights + host_memory_.master_weights;  // one of them is 0
    memory_.optimizer_states = device_memory_.optimizer_states + host_memory_.optimizer_states;
    memory_.communication_buffers =
        detail::add_or_refuse(device_memory_.communication_buffers, host_memory_.communication_buffers, buffers);
    std::uint64_t sum = detail::add_or_refuse(memory_.parameters, memory_.gradients, states);
    sum = detail::add_or_refuse(sum, memory_.master_weights, states);
    sum = detail::add_or_refuse(sum, memory_.optimizer_states, states);
    detail::add_or_refuse(sum, memory_.communication_buffers, "the total memory per rank");
  }

  /// The collectives per step. Every count, element and byte sum is checked, and so are the
  /// volumes (`traffic_entry::volume_elements`, `volume_bytes`) and the step's whole volume in
  /// elements (what `compare_with_paper` adds up): each fits in 64 bits, or the request is refused.
  void compute_traffic() {
    const plan_request& q = request_;
    const int stage = q.stage;
    const auto accumulation = static_cast<std::uint64_t>(q.accumulation_steps);
    const int groups = replica_groups();
    std::uint64_t step_volume = 0;
    const communication_quantization& qz = q.quantization;
    auto add = [&](collective_kind k, rank_group g, int ranks, std::string purpose, std::uint64_t repeat,
                   bool trainable_only, bool gradient, bool shard_only, const std::vector<std::uint64_t>* per_unit,
                   quantized_bits quantized = quantized_bits::none) {
      traffic_entry e;
      e.collective =
          quantized != quantized_bits::none && k == collective_kind::reduce_scatter ? collective_kind::all_to_all : k;
      e.quantized = quantized;
      e.group = g;
      e.ranks = ranks;
      e.purpose = std::move(purpose);
      const std::string what = "the " + std::string(collective_name(k)) + " traffic per step (" + e.purpose + ")";
      const std::string calls = what + " in calls", elements = what + " in elements", bytes = what + " in bytes";
      for (const flat_buffer& f : buffers_) {
        if (trainable_only && !f.trainable) continue;
        if (per_unit != nullptr && f.replicated) continue;  // stage 3's gathers: never gathered
        const std::uint64_t count = shard_only ? f.shard_numel : f.numel;
        if (count == 0) continue;
        const std::uint64_t times = detail::multiply_or_refuse(repeat, per_unit ? (*per_unit)[f.unit] : 1, calls);
        e.calls = detail::add_or_refuse(e.calls, times, calls);
        const std::uint64_t n = detail::multiply_or_refuse(times, count, elements);
        e.elements = detail::add_or_refuse(e.elements, n, elements);
        const std::uint64_t size = dtype_size(gradient ? f.gradient_type : f.type);
        const std::uint64_t full = detail::multiply_or_refuse(n, size, bytes);
        e.unquantized_bytes = detail::add_or_refuse(e.unquantized_bytes, full, bytes);
        const std::uint64_t sent =
            quantized == quantized_bits::none
                ? full
                : detail::multiply_or_refuse(
                      times, quantized_layout{quantized, qz.block_size, f.shard_numel, 1}.bytes() * shards_, bytes);
        e.bytes = detail::add_or_refuse(e.bytes, sent, bytes);
      }
      if (e.calls == 0) return;
      const std::uint64_t volume = e.collective == collective_kind::all_reduce ? 2 : 1;
      detail::multiply_or_refuse(e.bytes, volume, what + " in volume bytes");
      step_volume = detail::add_or_refuse(step_volume,
                                          detail::multiply_or_refuse(e.elements, volume, what + " in volume elements"),
                                          "the communication volume per step in elements");
      traffic_.push_back(std::move(e));
    };
    if (stage == 0) {
      add(collective_kind::all_reduce, rank_group::world, q.world_size, "gradients", 1, true, true, false, nullptr);
      return;
    }
    if (stage == 3) {
      add(collective_kind::all_gather, rank_group::shard, shards_, "parameters before forward", accumulation, false,
          false, false, &gathers_forward_, qz.weights);
      add(collective_kind::all_gather, rank_group::shard, shards_, "parameters before backward", accumulation, false,
          false, false, &gathers_backward_, qz.weights);
    }
    add(collective_kind::reduce_scatter, rank_group::shard, shards_, "gradients",
        sharded_gradients() ? accumulation : 1, true, true, false, nullptr, qz.gradients);
    if (groups > 1)
      add(collective_kind::all_reduce, rank_group::replica, groups, "gradient shards across replica groups", 1, true,
          true, true, nullptr);
    if (stage <= 2)
      add(collective_kind::all_gather, rank_group::shard, shards_, "parameters after the optimizer step", 1, true,
          false, false, nullptr);
  }

  void compute_fingerprint() { fingerprint_ = detail::request_fingerprint(request_); }

  plan_request request_;
  int shards_ = 1;
  std::vector<parameter_placement> placements_;
  std::map<std::string, std::size_t> by_name_;
  std::vector<flat_buffer> buffers_;
  std::vector<gather_unit> units_;
  std::vector<std::size_t> storage_id_;
  std::vector<std::size_t> trainable_storages_;
  std::vector<std::vector<std::size_t>> storage_uses_;
  std::vector<std::vector<std::size_t>> gradient_units_;
  std::vector<std::vector<std::size_t>> forward_prefetch_, backward_prefetch_;  ///< per unit (stage 3)
  std::vector<std::uint64_t> gathers_forward_;
  std::vector<std::uint64_t> gathers_backward_;
  communication_buffers communication_;
  memory_breakdown memory_;
  memory_breakdown device_memory_;
  memory_breakdown host_memory_;
  std::vector<traffic_entry> traffic_;
  std::uint64_t parameter_elements_ = 0;
  std::uint64_t trainable_elements_ = 0;
  std::uint64_t padding_elements_ = 0;
  std::uint64_t fingerprint_ = 0;
};

}  // namespace ringzero::zero
