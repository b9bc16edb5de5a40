#pragma once
/// @file
/// `zero::compare_with_paper`: how a real `shard_plan` differs from the ZeRO paper's model
/// (zero/memory_model.hpp, zero/traffic_model.hpp) and why: the plan's own element sizes,
/// frozen and tied parameters, alignment padding, communication buffers, accumulation and
/// hybrid sharding. Pure.

#include <cstdint>

#include "ringzero/zero/memory_model.hpp"
#include "ringzero/zero/shard_plan.hpp"
#include "ringzero/zero/traffic_model.hpp"

namespace ringzero::zero {

/// A plan set against the paper. Memory in bytes per rank, traffic in elements per rank per step.
struct paper_comparison {
  double psi = 0;   ///< the paper's Psi: unique parameter elements (tied storage once)
  int devices = 1;  ///< the paper's N: ranks sharing one copy of the state (shards)
  int stage = 0;    ///< ZeRO stage
  /// The paper's formula with K = 12: 16 Psi, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N, 16 Psi/N.
  model_memory paper;
  /// The same formula with the plan's element sizes, frozen parameters excluded from gradients
  /// and optimizer state, full gradients when the plan accumulates unsharded, and no padding:
  /// what the plan would hold if sizes divided evenly.
  /// `optimizer_states` includes the master weights, as the paper's K does.
  model_memory unpadded;
  /// The plan's model states, in the paper's three categories (master weights counted in
  /// `optimizer_states`).
  model_memory planned;
  /// planned - unpadded: bytes of alignment and divisibility padding per rank.
  double padding_bytes = 0;
  /// Communication buffers per rank (not in the paper's model-state count).
  std::uint64_t buffer_bytes = 0;
  /// The paper's per-step volume: 2 Psi (stages 0-2) or 3 Psi (stage 3) elements.
  double paper_volume = 0;
  /// The plan's per-step volume in elements within a replica group (stage 0: the world),
  /// padding, frozen parameters, accumulation and extra gathers of tied storage included.
  std::uint64_t planned_volume = 0;
  /// Extra per-step volume across replica groups (hybrid sharding), elements.
  std::uint64_t replica_volume = 0;
};

/// Compares `plan` with the paper's model (see `paper_comparison`).
inline paper_comparison compare_with_paper(const shard_plan& plan) {
  paper_comparison c;
  c.psi = static_cast<double>(plan.parameter_elements());
  c.devices = plan.shards();
  c.stage = plan.stage();
  const double n = c.devices;
  c.paper = paper_model_state_memory(c.psi, n, c.stage);

  const zero::precision& pr = plan.request().precision;
  for (const flat_buffer& f : plan.buffers()) {
    const double payload = static_cast<double>(f.payload);
    c.unpadded.parameters +=  // a frozen buffer kept gathered is whole at stage 3 too
        payload * static_cast<double>(dtype_size(f.type)) / (c.stage >= 3 && !f.replicated ? n : 1.0);
    if (!f.trainable) continue;
    c.unpadded.gradients +=
        payload * static_cast<double>(dtype_size(f.gradient_type)) / (plan.sharded_gradients() ? n : 1.0);
    const double k = static_cast<double>(pr.optimizer_bytes_per_element(f.type));
    c.unpadded.optimizer_states += payload * k / (c.stage >= 1 ? n : 1.0);
  }
  const memory_breakdown& m = plan.memory();
  c.planned.parameters = static_cast<double>(m.parameters);
  c.planned.gradients = static_cast<double>(m.gradients);
  c.planned.optimizer_states = static_cast<double>(m.master_weights + m.optimizer_states);
  c.padding_bytes = c.planned.total() - c.unpadded.total();
  c.buffer_bytes = m.communication_buffers;

  c.paper_volume = paper_communication_volume(c.psi, c.stage);
  for (const traffic_entry& e : plan.traffic()) {
    if (e.group == rank_group::replica)
      c.replica_volume += e.volume_elements();
    else
      c.planned_volume += e.volume_elements();
  }
  return c;
}

}  // namespace ringzero::zero
