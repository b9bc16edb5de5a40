#pragma once
/// @file
/// `verify_replicas`: do the data-parallel replicas hold bitwise equal state? After a synchronous
/// step they must (DDP: every rank's parameters; ZeRO: the parameters at stages 0-2, and at
/// every stage each rank's shard with the ranks of the other replica groups that hold the same
/// shard). A flipped bit in one rank's memory (silent data corruption) or a rank that skipped an
/// update breaks that without any error; this check finds it for the cost of hashing the state
/// once and one small all_gather, instead of replaying a step.
///
/// Each rank hashes each tensor with XXH3-64 (xxHash by Yann Collet, from the system's
/// libxxhash) and the ordered list of those hashes into one value; one all_gather of 3 uint64
/// per rank compares them. Only when they differ does a second all_gather of the per-tensor
/// hashes find the first tensor that differs, and every rank raises errc::replica_mismatch
/// naming it and the ranks that hold each version (the majority first).
///
/// Collective: every rank of the communicator calls it at the same point, between steps. Needs
/// libxxhash (Debian's libxxhash-dev; link -lxxhash; the Meson dependency `ringzero-checkpoint`
/// brings it). Not in <ringzero/ringzero.hpp>. Manual: docs/ddp.md, "Checking the replicas".

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero {

/// One tensor that must be equal on every replica: `bytes` bytes of host memory at `data`
/// (null allowed when `bytes` is 0), named in errors.
struct replica_tensor {
  std::string name;
  const void* data = nullptr;
  std::uint64_t bytes = 0;
};

/// What a passing check compared.
struct replica_check {
  std::uint64_t tensors = 0;  ///< tensors hashed on this rank
  std::uint64_t bytes = 0;    ///< bytes hashed on this rank
  std::uint64_t hash = 0;     ///< the hash every replica agreed on (XXH3-64 of the tensors' hashes)
  int replicas = 1;           ///< ranks compared (the communicator's world size)
};

namespace detail {

/// The tag of verify_replicas' exchanges, and its name in contract errors.
inline constexpr std::uint64_t replica_tag = std::uint64_t{0x5E} << 48;
inline std::string name_replica_tag(const void*, std::uint64_t tag) noexcept {
  if (tag == replica_tag) return "verify_replicas' exchange of the state's hash";
  if (tag == replica_tag + 1) return "verify_replicas' exchange of the tensors' hashes";
  if (tag == replica_tag + 2) return "verify_replicas' exchange of the replica groups' verdicts";
  return {};
}
inline collective_options replica_options(std::uint64_t which) noexcept {
  collective_options o;
  o.tag = replica_tag + which;
  o.tag_name = tag_namer{&name_replica_tag, nullptr};
  return o;
}

/// "0x..." for a hash.
inline std::string hash_text(std::uint64_t h) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(h));
  return text;
}

/// Groups the ranks by `value_of_rank`, the largest group first (ties: lowest rank first):
/// "ranks 0-2 hold 0x..; rank 3 holds 0x..".
inline std::string majority_first(const std::vector<std::string>& value_of_rank) {
  std::vector<std::pair<std::string, std::vector<int>>> groups = group_ranks(value_of_rank);
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::string s;
  for (const auto& g : groups)
    s += (s.empty() ? "" : "; ") + describe_ranks(g.second) + (g.second.size() == 1 ? " holds " : " hold ") + g.first;
  return s;
}

/// verify_replicas' body. `failure`: this rank could not read its state (it still takes part in
/// the exchange, with a row that says so; then every rank raises: this one its own error, the
/// others errc::aborted naming it).
inline replica_check verify_replicas_or_fail(communicator& comm, std::span<const replica_tensor> tensors,
                                             const std::string& what, const std::exception_ptr& failure) {
  constexpr std::uint64_t failed = ~std::uint64_t{0};
  const int n = comm.world_size();
  std::vector<std::uint64_t> hashes(failure ? 0 : tensors.size());
  replica_check mine;
  mine.replicas = n;
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    hashes[i] = tensors[i].bytes == 0 ? XXH3_64bits(nullptr, 0)
                                      : XXH3_64bits(tensors[i].data, static_cast<std::size_t>(tensors[i].bytes));
    mine.bytes += tensors[i].bytes;
  }
  mine.tensors = hashes.size();
  mine.hash = XXH3_64bits(hashes.data(), hashes.size() * sizeof(std::uint64_t));
  const std::uint64_t row[3] = {failure ? failed : mine.tensors, mine.bytes, mine.hash};
  std::vector<std::uint64_t> rows(3 * static_cast<std::size_t>(n));
  try {
    zero::detail::gather_values(comm, row, rows.data(), 3, replica_options(0), nullptr, "verify_replicas");
  } catch (...) {
    if (failure) std::rethrow_exception(failure);
    throw;
  }
  if (failure) std::rethrow_exception(failure);
  const std::string me = "verify_replicas: rank " + std::to_string(comm.rank()) + ": ";
  std::vector<int> unread;
  for (int r = 0; r < n; ++r)
    if (rows[3 * static_cast<std::size_t>(r)] == failed) unread.push_back(r);
  if (!unread.empty())
    throw error(errc::aborted, me + describe_ranks(unread) + " could not read the " + what + " (their errors say why)");
  auto column = [&](std::size_t c) {
    std::vector<std::string> v(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      v[static_cast<std::size_t>(r)] = std::to_string(rows[3 * static_cast<std::size_t>(r) + c]);
    return v;
  };
  auto fail = [&](const std::string& message) {
    throw error(errc::replica_mismatch, me + "the replicas' " + what + " differ: " + message);
  };
  bool same = true, same_shape = true;
  for (int r = 0; r < n; ++r) {
    const std::uint64_t* other = rows.data() + 3 * static_cast<std::size_t>(r);
    same = same && other[2] == mine.hash && other[0] == mine.tensors && other[1] == mine.bytes;
    same_shape = same_shape && other[0] == mine.tensors && other[1] == mine.bytes;
  }
  if (same) return mine;
  if (!same_shape) {
    const std::vector<std::string> counts = column(0);
    if (std::any_of(counts.begin(), counts.end(), [&](const std::string& c) { return c != counts[0]; }))
      fail("the number of tensors: " + describe_values(counts));
    fail("the number of bytes: " + describe_values(column(1)));
  }
  // Same shape, different bytes: which tensors? (Every rank saw the same rows: all take this.)
  std::vector<std::uint64_t> all(hashes.size() * static_cast<std::size_t>(n));
  zero::detail::gather_values(comm, hashes.data(), all.data(), hashes.size(), replica_options(1), nullptr,
                              "verify_replicas");
  std::size_t first = hashes.size(), differing = 0;
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    bool alike = true;
    for (int r = 1; r < n; ++r) alike = alike && all[static_cast<std::size_t>(r) * hashes.size() + i] == all[i];
    if (alike) continue;
    if (first == hashes.size()) first = i;
    ++differing;
  }
  if (first == hashes.size()) fail("the state's hash, but no tensor's (a hash collision: report it)");
  std::vector<std::string> versions(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    versions[static_cast<std::size_t>(r)] = hash_text(all[static_cast<std::size_t>(r) * hashes.size() + first]);
  fail("tensor " + std::to_string(first) + " '" + tensors[first].name + "' (" + std::to_string(tensors[first].bytes) +
       " bytes) differs: " + majority_first(versions) + " (XXH3-64 of its bytes); " + std::to_string(differing) +
       " of " + std::to_string(hashes.size()) + " tensors differ");
  return mine;  // not reached
}

}  // namespace detail

/// Checks that every rank of `comm` holds the same `tensors` (same count, sizes and bytes, in
/// the same order); `what` names them in errors ("parameters"). Returns what was compared.
/// Throws errc::replica_mismatch on every rank when they differ: naming the number of tensors
/// or bytes per rank when those differ, else the first tensor whose bytes differ, the ranks
/// holding each version (the largest group first) and how many tensors differ in all.
/// Collective (two all_gathers when they differ, one otherwise; staged through device memory on
/// a device-memory communicator); the communicator's errors (a timeout naming the ranks that
/// never called) as any collective's. `tensors` are host memory. Cost: one XXH3 pass.
inline replica_check verify_replicas(communicator& comm, std::span<const replica_tensor> tensors,
                                     const std::string& what = "tensors") {
  return detail::verify_replicas_or_fail(comm, tensors, what, nullptr);
}

namespace ddp {

/// Checks that every rank of the reducer's communicator holds bitwise equal parameter values
/// (each parameter's `count` elements; device memory is copied to host memory on the
/// communicator's stream first). Between steps (not between `mark_ready` and `finish`), on
/// every rank. Returns and throws as ringzero::verify_replicas, naming the parameters; a
/// reducer whose parameters' values are null (`reducer_parameter::data`) is errc::invalid_argument.
inline replica_check verify_replicas(gradient_reducer& reducer) {
  std::vector<std::vector<unsigned char>> values(reducer.parameter_count());
  std::vector<replica_tensor> tensors(reducer.parameter_count());
  std::exception_ptr failure;
  try {
    for (std::size_t i = 0; i < reducer.parameter_count(); ++i) {
      values[i] = reducer.read_values(i);
      tensors[i] = {reducer.parameter_name(i), values[i].data(), values[i].size()};
    }
  } catch (...) { failure = std::current_exception(); }
  return ringzero::detail::verify_replicas_or_fail(reducer.comm(), tensors, "parameters", failure);
}

}  // namespace ddp

namespace zero {

/// Checks what the model's replicas must hold alike: with a replica communicator (hybrid
/// sharding), this rank's held parameters, master weights and optimizer states against the
/// ranks holding the same shard in the other replica groups; and at stages 0-2 the whole
/// parameters across the shard communicator (at stage 3 its replicated frozen buffers,
/// `flat_buffer::replicated`, and the gathered copies of the units held between steps, named
/// "NAME#gathered": a unit kept after an evaluation pass, a prefetch no use took).
/// Device memory is copied to host memory on the runtime's stream first. Between steps, on
/// every rank of both communicators. Returns the check over the shard communicator (or the
/// replica one at stage 3 with replicas). Throws as
/// ringzero::verify_replicas, naming the tensor ("h.0.w", "h.0.w#master", "h.0.w#state0", ...).
inline replica_check verify_replicas(sharded_model& model) {
  checkpoint_access access(model);
  const shard_plan& plan = model.plan();
  // This rank's held parameters (and optimizer state), parameter by parameter, copied to host
  // memory (the inner vectors' buffers stay put while the outer one grows). A failure on this
  // rank is handed to the exchange, which every rank then leaves with an error.
  // `whole_only`: the buffers every rank of the shard group holds whole (shard_plan::holds_whole).
  // `whole_only` at stage 3 adds the gathered copies of the units held now.
  auto copy_held = [&](bool with_optimizer, bool whole_only, std::vector<std::vector<unsigned char>>& bytes,
                       std::vector<replica_tensor>& tensors) -> std::exception_ptr {
    auto add = [&](std::string name, const void* base, algorithms::range have, std::uint64_t lo, std::uint64_t hi,
                   std::uint64_t es) {
      lo = std::max(lo, have.begin);
      hi = std::min(hi, have.end);
      const std::uint64_t n = hi > lo ? (hi - lo) * es : 0;
      bytes.emplace_back(static_cast<std::size_t>(n));
      tensors.push_back({std::move(name), nullptr, n});
      if (n != 0)
        access.copy_to_host(bytes.back().data(), static_cast<const unsigned char*>(base) + (lo - have.begin) * es, n);
    };
    try {
      for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
        const flat_buffer& f = plan.buffers()[b];
        if (whole_only && !plan.holds_whole(b)) {
          if (const unsigned char* g = plan.stage() == 3 ? access.gathered_parameters(b) : nullptr)
            for (std::size_t p : f.parameters) {
              const parameter_placement& pl = plan.placements()[p];
              add(plan.parameters()[p].name + "#gathered", g, {0, f.numel}, pl.offset, pl.offset + pl.numel,
                  dtype_size(f.type));
            }
          continue;
        }
        for (std::size_t p : f.parameters) {
          const parameter_placement& pl = plan.placements()[p];
          const std::string& name = plan.parameters()[p].name;
          const std::uint64_t end = pl.offset + pl.numel;
          add(name, access.held_parameters(b), access.held_range(b), pl.offset, end, dtype_size(f.type));
          if (!with_optimizer || !f.trainable) continue;
          const sharded_optimizer& opt = access.optimizer();
          if (f.has_master) add(name + "#master", opt.master(b), access.optimizer_range(b), pl.offset, end, 4);
          for (int k = 0; k < opt.options().state_count(); ++k)
            add(name + "#state" + std::to_string(k), opt.state(b, k), access.optimizer_range(b), pl.offset, end, 4);
        }
      }
      access.synchronize();
    } catch (...) {
      access.synchronize_quietly();  // no copy may still write into `bytes`
      return std::current_exception();
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].data = bytes[i].data();
    return nullptr;
  };
  replica_check result;
  if (model.replica_comm() != nullptr) {
    // Across replica groups; then every rank of the shard group learns how its ranks fared there
    // (0 equal, 1 a difference, 2 another error), so that every rank of the job raises.
    std::exception_ptr caught;
    std::uint64_t verdict = 0;
    try {
      std::vector<std::vector<unsigned char>> bytes;
      std::vector<replica_tensor> tensors;
      const std::exception_ptr failure = copy_held(true, false, bytes, tensors);
      result = ringzero::detail::verify_replicas_or_fail(*model.replica_comm(), tensors,
                                                         "shards (across replica groups)", failure);
    } catch (const error& e) {
      caught = std::current_exception();
      verdict = e.kind() == errc::replica_mismatch ? 1 : 2;
    } catch (...) {
      caught = std::current_exception();
      verdict = 2;
    }
    std::vector<std::uint64_t> verdicts(static_cast<std::size_t>(model.comm().world_size()));
    detail::gather_values(model.comm(), &verdict, verdicts.data(), 1, ringzero::detail::replica_options(2), nullptr,
                          "verify_replicas");
    if (caught) std::rethrow_exception(caught);
    std::vector<int> differing, failing;
    for (std::size_t r = 0; r < verdicts.size(); ++r) {
      if (verdicts[r] == 1) differing.push_back(static_cast<int>(r));
      if (verdicts[r] == 2) failing.push_back(static_cast<int>(r));
    }
    const std::string me = "verify_replicas: rank " + std::to_string(model.comm().rank()) + ": ";
    if (!differing.empty())
      throw error(errc::replica_mismatch,
                  me + "the replicas' shards differ across replica groups: found by shard-group " +
                      ringzero::detail::describe_ranks(differing) + " (their errors name the tensor)");
    if (!failing.empty())
      throw error(errc::aborted, me + "shard-group " + ringzero::detail::describe_ranks(failing) +
                                     " failed to check the replica groups (their errors say why)");
  }
  {  // stage 3: its replicated frozen buffers and gathered units, if any (possibly none)
    std::vector<std::vector<unsigned char>> bytes;
    std::vector<replica_tensor> tensors;
    const std::exception_ptr failure = copy_held(false, true, bytes, tensors);
    const replica_check whole_check =
        ringzero::detail::verify_replicas_or_fail(model.comm(), tensors, "parameters", failure);
    if (plan.stage() <= 2 || model.replica_comm() == nullptr) result = whole_check;  // else the replica check
  }
  return result;
}

}  // namespace zero

}  // namespace ringzero
