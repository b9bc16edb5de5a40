#pragma once
/// @file
/// `checkpoint::detail::zero_state`: how a `zero::sharded_model`'s state maps onto checkpoint
/// tensors. Every parameter is a tensor of role "parameter" (its dtype, its shape; an alias of
/// a tie group is recorded as tied to the group's owner and holds no data); every trainable
/// storage owner also has "master" (float32, when the plan keeps master weights) and one
/// "optimizer_state" per optimizer state (float32: SGD's momentum_buffer; Adam's exp_avg and
/// exp_avg_sq). Padding is never saved.
/// Who writes what: the ranks holding the same range of a flat buffer (every rank at stage 0;
/// the ranks of one shard index across replica groups at stages 1-3) split that range evenly,
/// so each element is written exactly once and every rank writes about 1/world_size of the
/// state. Loading intersects the global ranges with the ranges this rank's plan holds: the
/// parameters of its held range (the whole buffer at stages 0-2, its shard at stage 3) and the
/// master weights and states of its optimizer range, so any world size, stage, replica group
/// size and alignment can load any checkpoint of the same model (ranks with empty shards too).

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ringzero/algorithms/partition.hpp"
#include "ringzero/checkpoint/staging_buffer.hpp"
#include "ringzero/checkpoint/state_layout.hpp"
#include "ringzero/checkpoint/state_loader.hpp"
#include "ringzero/zero/optimizer.hpp"
#include "ringzero/zero/shard_plan.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::checkpoint::detail {

/// PyTorch's name of optimizer state `k` of `o`.
inline std::string optimizer_state_name(const zero::optimizer_options& o, int k) {
  if (o.kind == zero::optimizer_kind::sgd) return "momentum_buffer";
  return k == 0 ? "exp_avg" : "exp_avg_sq";
}

/// The optimizer as the index records it.
inline nlohmann::json optimizer_json(const zero::optimizer_options& o) {
  return {{"kind", std::string(zero::optimizer_name(o.kind))},
          {"states", o.state_count()},
          {"lr", o.lr},
          {"weight_decay", o.weight_decay},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"nesterov", o.nesterov},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps}};
}

/// What of a plan request fixes the flat layout beyond the tensors (gather units, tie groups,
/// declared dtypes, precision, automatic unit size), as the index's extra["plan"] records it, so
/// that an offline reshard (checkpoint/offline_reshard.hpp) rebuilds the plan for another world size.
inline nlohmann::json plan_request_json(const zero::plan_request& q) {
  auto type = [](std::optional<dtype> t) {
    return t ? nlohmann::json(std::string(dtype_name(*t))) : nlohmann::json(nullptr);
  };
  nlohmann::json ps = nlohmann::json::array();
  for (const zero::parameter_spec& p : q.parameters)
    ps.push_back({{"name", p.name},
                  {"unit", p.unit},
                  {"tie_group", p.tie_group},
                  {"type", type(p.type)},
                  {"trainable", p.trainable}});
  const zero::precision& pr = q.precision;
  return {{"parameters", std::move(ps)},
          {"replica_group_size", q.replica_group_size},
          {"unit_bytes", q.unit_bytes},
          {"accumulation_steps", q.accumulation_steps},
          {"prefetch", q.prefetch},
          {"reshard_after_forward", std::string(zero::reshard_policy_name(q.reshard_after_forward))},
          {"max_inflight_reductions", q.max_inflight_reductions},
          {"keep_frozen_bytes", q.keep_frozen_bytes},
          {"precision",
           {{"parameter", std::string(dtype_name(pr.parameter))},
            {"gradient", type(pr.gradient)},
            {"master", type(pr.master)},
            {"optimizer_state", std::string(dtype_name(pr.optimizer_state))},
            {"optimizer_states", pr.optimizer_states}}}};
}

/// The tensors of a model with `plan` and optimizer `o`, and where each parameter's are.
struct zero_tensors {
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<tensor_spec> tensors;
  std::vector<std::size_t> parameter;              ///< per parameter: its "parameter" tensor
  std::vector<std::size_t> master;                 ///< per parameter: its "master" tensor or none
  std::vector<std::array<std::size_t, 2>> states;  ///< per parameter: its state tensors or none

  zero_tensors(const zero::shard_plan& plan, const zero::optimizer_options& o) {
    const auto& ps = plan.parameters();
    const auto& pl = plan.placements();
    parameter.assign(ps.size(), none);
    master.assign(ps.size(), none);
    states.assign(ps.size(), {none, none});
    for (std::size_t p = 0; p < ps.size(); ++p) {
      tensor_spec t;
      t.name = ps[p].name;
      t.type = pl[p].type;
      t.shape = ps[p].shape;
      t.trainable = ps[p].trainable;
      if (pl[p].alias) t.tied_to = ps[pl[p].storage].name;
      parameter[p] = tensors.size();
      tensors.push_back(t);
      if (pl[p].alias || !ps[p].trainable) continue;
      const zero::flat_buffer& f = plan.buffers()[pl[p].buffer];
      t.tied_to.clear();
      if (f.has_master) {
        t.role = tensor_role::master;
        t.type = dtype::float32;
        master[p] = tensors.size();
        tensors.push_back(t);
      }
      for (int k = 0; k < o.state_count(); ++k) {
        t.role = tensor_role::optimizer_state;
        t.type = dtype::float32;
        t.state = k;
        t.state_name = optimizer_state_name(o, k);
        states[p][static_cast<std::size_t>(k)] = tensors.size();
        tensors.push_back(t);
      }
    }
  }
};

/// The range of buffer `b` that global rank `rank` holds in its optimizer (see the file comment).
inline algorithms::range optimizer_range_of(const zero::shard_plan& plan, std::size_t b, int rank) {
  const zero::flat_buffer& f = plan.buffers()[b];
  return plan.stage() == 0 ? algorithms::range{0, f.numel} : f.shard(plan.shard_index(rank));
}

/// The part of buffer `b` that global rank `rank` writes.
inline algorithms::range write_range(const zero::shard_plan& plan, std::size_t b, int rank) {
  const algorithms::range own = optimizer_range_of(plan, b, rank);
  const int copies = plan.stage() == 0 ? plan.world_size() : plan.replica_groups();
  const int which = plan.stage() == 0 ? rank : plan.replica_group(rank);
  const std::uint64_t n = own.size(), c = static_cast<std::uint64_t>(copies), w = static_cast<std::uint64_t>(which);
  return {own.begin + n / c * w + std::min(w, n % c), own.begin + n / c * (w + 1) + std::min(w + 1, n % c)};
}

/// What a piece is, for finding its bytes: the parameter, the role and the buffer element where it starts.
struct zero_piece_source {
  std::size_t parameter;
  tensor_role role;
  int state;
  std::size_t buffer;
  std::uint64_t element;
};

/// The layout of a save of `plan` (every rank's pieces) and, for each piece of each rank, where
/// its data is in that rank's model.
inline state_layout zero_layout(const zero::shard_plan& plan, const zero::optimizer_options& o, const zero_tensors& z,
                                std::vector<std::vector<zero_piece_source>>* sources) {
  state_layout L;
  L.kind = "zero";
  L.world_size = plan.world_size();
  L.stage = plan.stage();
  L.replica_group_size = plan.shards();
  L.alignment_bytes = plan.request().alignment_bytes;
  L.plan_fingerprint = plan.fingerprint();
  L.optimizer = optimizer_json(o);
  L.extra = {{"plan", plan_request_json(plan.request())}};
  L.tensors = z.tensors;
  L.pieces.resize(static_cast<std::size_t>(plan.world_size()));
  if (sources) sources->assign(L.pieces.size(), {});
  const auto& pl = plan.placements();
  for (int r = 0; r < plan.world_size(); ++r) {
    auto& out = L.pieces[static_cast<std::size_t>(r)];
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      const zero::flat_buffer& f = plan.buffers()[b];
      const algorithms::range w = write_range(plan, b, r);
      auto add_role = [&](tensor_role role, int state) {
        for (std::size_t p : f.parameters) {
          const std::uint64_t lo = std::max(w.begin, pl[p].offset), hi = std::min(w.end, pl[p].offset + pl[p].numel);
          if (lo >= hi) continue;
          const std::size_t t = role == tensor_role::parameter ? z.parameter[p]
                                : role == tensor_role::master  ? z.master[p]
                                                               : z.states[p][static_cast<std::size_t>(state)];
          out.push_back({t, lo - pl[p].offset, hi - pl[p].offset});
          if (sources) (*sources)[static_cast<std::size_t>(r)].push_back({p, role, state, b, lo});
        }
      };
      add_role(tensor_role::parameter, 0);
      if (!f.trainable) continue;
      if (f.has_master) add_role(tensor_role::master, 0);
      for (int k = 0; k < o.state_count(); ++k) add_role(tensor_role::optimizer_state, k);
    }
  }
  return L;
}

/// The address of `s` in `model` (this rank's state).
inline const unsigned char* zero_source(zero::sharded_model& model, const zero_piece_source& s) {
  const zero::shard_plan& plan = model.plan();
  if (s.role == tensor_role::parameter) {
    const std::uint64_t es = dtype_size(plan.buffers()[s.buffer].type);
    return zero::checkpoint_access(model).held_parameters(s.buffer) +
           (s.element - zero::checkpoint_access(model).held_range(s.buffer).begin) * es;
  }
  const zero::sharded_optimizer& opt = zero::checkpoint_access(model).optimizer();
  const float* base = s.role == tensor_role::master ? opt.master(s.buffer) : opt.state(s.buffer, s.state);
  return reinterpret_cast<const unsigned char*>(
      base + (s.element - zero::checkpoint_access(model).optimizer_range(s.buffer).begin));
}

/// Copies `bytes` bytes of host staging `src` into the model's memory at `dst`, after
/// `begin_restore`: directly on the host path, on the runtime's stream on the device path
/// (`through_stream`; `finish_copies_in` waits for them before the staging goes).
inline void copy_in(zero::checkpoint_access& access, void* dst, const void* src, std::uint64_t bytes) {
  if (access.through_stream())
    access.copy_from_host(dst, src, bytes);
  else
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

/// Waits for the stream copies of `copy_in` (the device path; nothing on the host path).
inline void finish_copies_in(zero::checkpoint_access& access) {
  if (access.through_stream()) access.synchronize();
}

/// A second copy of one rank's restorable state (held parameters, optimizer) of the layout of
/// one model: a load that restores the optimizer states reads into it and exchanges it with the
/// model's (`zero::checkpoint_access::exchange_state`), so nothing is copied after the reads;
/// the previous state is then here, ready for the next load into the same model.
class zero_spare {
 public:
  /// True when this copy has `model`'s layout and optimizer options but the learning rate (built
  /// for the model at that address with the same plan; a model built in the place of a
  /// destroyed one with the same plan and options fits too).
  bool fits(zero::sharded_model& model) const {
    if (owner_ != &model || !optimizer_ || fingerprint_ != model.plan().fingerprint() ||
        held_.size() != model.plan().buffers().size())
      return false;
    for (std::size_t b = 0; b < held_.size(); ++b) {
      const algorithms::range own = zero::checkpoint_access(model).optimizer_range(b),
                              mine = optimizer_->owned_range(b);
      if (held_[b].bytes() !=
              zero::checkpoint_access(model).held_range(b).size() * dtype_size(model.plan().buffers()[b].type) ||
          own.begin != mine.begin || own.end != mine.end)
        return false;
    }
    nlohmann::json kept = optimizer_json(optimizer_->options()), wanted = optimizer_json(model.optimizer().options());
    kept.erase("lr");  // the only option that changes during training; the exchange keeps the model's
    wanted.erase("lr");
    return kept == wanted;
  }
  /// Allocates a fresh copy with `model`'s layout. Its pages are left for the load's reads to map
  /// (`host_buffer::untouched`: huge pages where the kernel has them); the load writes every byte
  /// (its targets, then the model's padding at commit) before the copy becomes the model's.
  void build(zero::sharded_model& model) {
    held_.clear();
    optimizer_.reset();
    owner_ = nullptr;
    const zero::shard_plan& plan = model.plan();
    for (std::size_t b = 0; b < plan.buffers().size(); ++b)
      held_.push_back(zero::detail::host_buffer::untouched(zero::checkpoint_access(model).held_range(b).size() *
                                                           dtype_size(plan.buffers()[b].type)));
    optimizer_ = std::make_unique<zero::sharded_optimizer>(
        plan, plan.stage() == 0 ? 0 : model.comm().rank(), model.optimizer().options(),
        [](std::uint64_t bytes, zero::memory_category) { return zero::detail::host_buffer::untouched(bytes); });
    owner_ = &model;
    fingerprint_ = plan.fingerprint();
  }
  /// Part `which` of buffer `b` (-2 held parameters, -1 master weights, k >= 0 optimizer state k).
  unsigned char* part(std::size_t b, int which) {
    if (which == -2) return held_[b].data();
    if (which == -1) return reinterpret_cast<unsigned char*>(optimizer_->master(b));
    return reinterpret_cast<unsigned char*>(optimizer_->state(b, which));
  }
  /// Exchanges this copy with `model`'s state (after `begin_restore`).
  void exchange(zero::sharded_model& model) { zero::checkpoint_access(model).exchange_state(held_, *optimizer_); }
  /// Bytes held (0 before `build`).
  std::uint64_t bytes() const noexcept {
    std::uint64_t n = optimizer_ ? optimizer_->master_bytes() + optimizer_->state_bytes() : 0;
    for (const zero::detail::host_buffer& h : held_) n += h.bytes();
    return n;
  }
  /// Frees the memory.
  void clear() noexcept {
    held_.clear();
    optimizer_.reset();
    owner_ = nullptr;
  }

 private:
  std::vector<zero::detail::host_buffer> held_;
  std::unique_ptr<zero::sharded_optimizer> optimizer_;
  const zero::sharded_model* owner_ = nullptr;
  std::uint64_t fingerprint_ = 0;
};

/// A load's staging memory for one rank of a model, and how to commit it. With the optimizer
/// states (a resume) on the host path: a `zero_spare` (`spare` when given, reused if it fits the
/// model; else one allocated here), exchanged with the model's state at commit; on the device
/// path (`checkpoint_access::through_stream`) and for parameters in the trainer's memory
/// (`checkpoint_access::parameters_adopted`) the copied staging below, states included.
/// Parameters only: one block holding the rank's held parameters and master weights. The copied
/// staging is `arena` when given and large enough (memory reused from load to load), else
/// allocated here (fresh zero pages), copied at commit. `in_place` (host path only; the caller
/// has called `checkpoint_access::begin_restore`): no staging, the targets are the model's own
/// memory (`load_options::in_place`), and `commit` only sets the step count.
class zero_staging {
 public:
  /// The bytes of copied staging a load into `model` needs (each part rounded up to 64 bytes).
  static std::uint64_t bytes_needed(zero::sharded_model& model, bool with_states) {
    std::uint64_t total = 0;
    for_each_part(model, with_states, [&](std::size_t, int, std::uint64_t bytes) { total += round(bytes); });
    return total;
  }

  /// Staging for `model`, and the targets that fill it (`with_states`: the optimizer states too).
  zero_staging(zero::sharded_model& model, const zero_tensors& z, bool with_states, staging_buffer* arena = nullptr,
               zero_spare* spare = nullptr, bool in_place = false)
      : model_(model), with_states_(with_states), in_place_(in_place) {
    const zero::shard_plan& plan = model.plan();
    const auto& pl = plan.placements();
    // Part k of buffer b: which = -2 parameters, -1 master, k >= 0 optimizer state k.
    std::vector<std::array<unsigned char*, 4>> at(plan.buffers().size(), {nullptr, nullptr, nullptr, nullptr});
    bool fresh = false;  // memory allocated here, whose pages the reads would map one by one
    // The device path's state is written through its stream: staged and copied, never exchanged;
    // so are parameters in the trainer's memory (adopt_parameters), which must stay where they are.
    if (in_place) {
      if (zero::checkpoint_access(model).through_stream())
        throw error(errc::internal, "an in-place load on the device path");  // load_zero stages those
      for_each_part(model, with_states, [&](std::size_t b, int which, std::uint64_t) {
        at[b][static_cast<std::size_t>(which + 2)] = model_part(b, which);
      });
    } else if (with_states && !zero::checkpoint_access(model).through_stream() &&
               !zero::checkpoint_access(model).parameters_adopted()) {
      spare_ = spare != nullptr ? spare : &own_spare_;
      if (!spare_->fits(model)) {
        spare_->clear();  // the old copy's memory goes before the new one's comes
        spare_->build(model);
        fresh = true;
      }
      for_each_part(model, with_states, [&](std::size_t b, int which, std::uint64_t) {
        at[b][static_cast<std::size_t>(which + 2)] = spare_->part(b, which);
      });
    } else {
      const std::uint64_t total = bytes_needed(model, with_states);
      unsigned char* base = nullptr;
      if (arena != nullptr && arena->bytes() >= total) {
        base = arena->data();
      } else {
        own_ = staging_buffer(total, false);
        base = own_.data();
        fresh = true;
      }
      std::uint64_t offset = 0;
      for_each_part(model, with_states, [&](std::size_t b, int which, std::uint64_t bytes) {
        at[b][static_cast<std::size_t>(which + 2)] = base + offset;
        offset += round(bytes);
      });
    }
    const int states = zero::checkpoint_access(model).optimizer().options().state_count();
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      const zero::flat_buffer& f = plan.buffers()[b];
      const algorithms::range held = zero::checkpoint_access(model).held_range(b),
                              own = zero::checkpoint_access(model).optimizer_range(b);
      for (std::size_t p : f.parameters) {
        const std::uint64_t off = pl[p].offset, end = pl[p].offset + pl[p].numel;
        auto add = [&](std::size_t spec, algorithms::range r, int which, std::uint64_t es) {
          const std::uint64_t lo = std::max(r.begin, off), hi = std::min(r.end, end);
          if (lo >= hi) return;
          targets_.push_back(
              {spec, lo - off, hi - off, at[b][static_cast<std::size_t>(which + 2)] + (lo - r.begin) * es});
          places_.push_back({b, which, (lo - r.begin) * es, (hi - lo) * es});
        };
        add(z.parameter[p], held, -2, dtype_size(f.type));
        if (!f.trainable) continue;
        if (f.has_master) add(z.master[p], own, -1, 4);
        if (with_states)
          for (int k = 0; k < states; ++k) add(z.states[p][static_cast<std::size_t>(k)], own, k, 4);
      }
    }
    if (spare_ != nullptr) find_gaps();
    if (fresh) {  // mapped on a helper thread ahead of the reads, in their order
      std::vector<std::pair<unsigned char*, std::uint64_t>> ranges;
      for (std::size_t i = 0; i < targets_.size(); ++i)
        ranges.emplace_back(static_cast<unsigned char*>(targets_[i].dst), places_[i].bytes);
      populator_.emplace(std::move(ranges));
    }
  }

  const std::vector<load_target>& targets() const noexcept { return targets_; }

  /// Makes the staged state the model's (padding between parameters stays as it is) and sets
  /// the step count when loading states: copies every target's bytes into the model, or, with
  /// a spare, copies the model's padding into it and exchanges the two. Cannot fail once
  /// `begin_restore` succeeded.
  void commit(std::uint64_t steps) {
    populator_.reset();  // the reads are done: nothing is left for it to map
    if (in_place_) {     // read into the model's memory, after begin_restore
      if (with_states_) zero::checkpoint_access(model_).optimizer().set_steps(steps);
      return;
    }
    zero::checkpoint_access(model_).begin_restore();
    if (spare_ != nullptr) {
      for (const place& g : gaps_)
        std::memcpy(spare_->part(g.buffer, g.which) + g.offset, model_part(g.buffer, g.which) + g.offset,
                    static_cast<std::size_t>(g.bytes));
      spare_->exchange(model_);
      zero::checkpoint_access(model_).optimizer().set_steps(steps);
      return;
    }
    zero::checkpoint_access access(model_);
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      const place& p = places_[i];
      copy_in(access, model_part(p.buffer, p.which) + p.offset, targets_[i].dst, p.bytes);
    }
    finish_copies_in(access);  // the staging is freed after this
    if (with_states_) access.optimizer().set_steps(steps);
  }

 private:
  struct place {
    std::size_t buffer;
    int which;             ///< -2 parameters, -1 master, k >= 0 optimizer state k
    std::uint64_t offset;  ///< bytes from the start of what the rank holds of that part
    std::uint64_t bytes;
  };
  static std::uint64_t round(std::uint64_t bytes) { return (bytes + 63) / 64 * 64; }
  unsigned char* model_part(std::size_t b, int which) {
    zero::sharded_optimizer& opt = zero::checkpoint_access(model_).optimizer();
    return which == -2   ? zero::checkpoint_access(model_).held_parameters(b)
           : which == -1 ? reinterpret_cast<unsigned char*>(opt.master(b))
                         : reinterpret_cast<unsigned char*>(opt.state(b, which));
  }
  /// The byte ranges of every part no target covers (padding), which `commit` copies from the
  /// model into the spare.
  void find_gaps() {
    std::vector<place> sorted = places_;
    std::sort(sorted.begin(), sorted.end(), [](const place& x, const place& y) {
      return std::tie(x.buffer, x.which, x.offset) < std::tie(y.buffer, y.which, y.offset);
    });
    std::size_t i = 0;
    for_each_part(model_, with_states_, [&](std::size_t b, int which, std::uint64_t bytes) {
      std::uint64_t at = 0;
      for (; i < sorted.size() && sorted[i].buffer == b && sorted[i].which == which; ++i) {
        if (sorted[i].offset > at) gaps_.push_back({b, which, at, sorted[i].offset - at});
        at = std::max(at, sorted[i].offset + sorted[i].bytes);
      }
      if (bytes > at) gaps_.push_back({b, which, at, bytes - at});
    });
  }
  /// Calls f(buffer, which, bytes) for every part of staging, in the order they are laid out.
  template <class F>
  static void for_each_part(zero::sharded_model& model, bool with_states, F&& f) {
    const zero::shard_plan& plan = model.plan();
    const int states = zero::checkpoint_access(model).optimizer().options().state_count();
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      const zero::flat_buffer& fb = plan.buffers()[b];
      const algorithms::range held = zero::checkpoint_access(model).held_range(b),
                              own = zero::checkpoint_access(model).optimizer_range(b);
      f(b, -2, held.size() * dtype_size(fb.type));
      if (fb.trainable && fb.has_master) f(b, -1, own.size() * 4);
      if (fb.trainable && with_states)
        for (int k = 0; k < states; ++k) f(b, k, own.size() * 4);
    }
  }
  zero::sharded_model& model_;
  bool with_states_;
  bool in_place_;
  staging_buffer own_;
  zero_spare own_spare_;
  zero_spare* spare_ = nullptr;
  std::vector<load_target> targets_;
  std::vector<place> places_;
  std::vector<place> gaps_;                  ///< with a spare: the padding bytes to copy from the model
  std::optional<page_populator> populator_;  ///< last: stopped before the memory it maps goes
};

}  // namespace ringzero::checkpoint::detail
