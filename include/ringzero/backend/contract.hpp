#pragma once
/// @file
/// The cross-rank contract check: given every rank's descriptor of the same collective, decide
/// whether they agree (NCCL's contract: same collective, count, dtype, op and root, in the same
/// order; and the same caller's tag and reproducible mode) and whether any rank passed invalid arguments, and describe
/// each difference with every rank's value ("count mismatch: rank 0: 2560; ranks 1-3: 5120").
///
/// Every rank runs the same pure function on the same descriptors, so all ranks reach the same
/// verdict and raise the same error: no rank runs a collective that another rank refused.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/backend/descriptor.hpp"
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero {

/// A failed contract: the error code to raise and its message.
struct contract_violation {
  errc code = errc::contract_mismatch;
  std::string message;
};

namespace detail {

inline bool ranges_overlap(const void* a, std::uint64_t an, const void* b, std::uint64_t bn) noexcept {
  if (an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

/// A tag as the errors print it: `namer`'s name for it, or hexadecimal ("0x7") without a namer
/// (or when the namer returns nothing).
inline std::string tag_text(const tag_namer& namer, std::uint64_t tag) {
  std::string named = namer ? namer.name(namer.context, tag) : std::string();
  if (!named.empty()) return named;
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(tag));
  return text;
}

/// The checks of `check_contract` (below) before it names the calls.
template <class Get>
std::optional<contract_violation> check_descriptors(int n, Get&& get, bool cross_rank_buffers, const tag_namer& namer) {
  auto values = [&](auto&& f) {
    std::vector<std::string> v(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) v[static_cast<std::size_t>(r)] = f(get(r));
    return v;
  };
  auto all_equal = [&](auto&& f) {
    for (int r = 1; r < n; ++r)
      if (!(f(get(r)) == f(get(0)))) return false;
    return true;
  };

  // 1. Local argument errors, reported on every rank (ranks with the same problem grouped).
  {
    bool any = false;
    std::vector<std::string> problems(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      const auto& d = get(r);
      problems[static_cast<std::size_t>(r)] = d.invalid.empty() ? std::string("valid") : d.invalid;
      any = any || !d.invalid.empty();
    }
    if (any) {
      std::string s;
      for (int r = 0; r < n; ++r) {
        const auto& d = get(r);
        if (d.invalid.empty()) continue;
        if (!s.empty()) s += "; ";
        s += "rank " + std::to_string(r) + ": " + d.invalid;
      }
      // Grouped form when several ranks share a problem: "ranks 0-3: send buffer is null ...".
      const std::string grouped = detail::describe_values(problems);
      // errc::unsupported only when every invalid rank reports a missing capability.
      errc code = errc::unsupported;
      for (int r = 0; r < n; ++r)
        if (!get(r).invalid.empty() && get(r).invalid_code != errc::unsupported) code = errc::invalid_argument;
      return contract_violation{
          code, "invalid arguments (" + (grouped.size() < s.size() ? grouped : s) + "); no rank ran it"};
    }
  }
  // 2. The same collective.
  if (!all_equal([](const collective_descriptor& d) { return d.kind; }))
    return contract_violation{
        errc::contract_mismatch,
        "collective mismatch: " + detail::describe_values(values([](const collective_descriptor& d) {
          return std::string(collective_name(d.kind));
        }))};
  const collective_kind kind = get(0).kind;
  // 3. Reproducible mode, count, dtype, op, root, algorithm.
  if (!all_equal([](const collective_descriptor& d) { return d.reproducible; }))
    return contract_violation{errc::contract_mismatch,
                              "reproducible mode mismatch (check RINGZERO_REPRODUCIBLE and per-call options): " +
                                  detail::describe_values(values([](const collective_descriptor& d) {
                                    return std::string(reproducible_mode_name(d.reproducible));
                                  }))};
  if (kind != collective_kind::barrier) {
    if (!all_equal([](const collective_descriptor& d) { return d.count; }))
      return contract_violation{errc::contract_mismatch,
                                "count mismatch: " + detail::describe_values(values([](const collective_descriptor& d) {
                                  return std::to_string(d.count);
                                }))};
    if (!all_equal([](const collective_descriptor& d) { return d.type; }))
      return contract_violation{errc::contract_mismatch,
                                "dtype mismatch: " + detail::describe_values(values([](const collective_descriptor& d) {
                                  return std::string(dtype_name(d.type));
                                }))};
  }
  if (is_reduction(kind) && !all_equal([](const collective_descriptor& d) { return d.op.kind; }))
    return contract_violation{
        errc::contract_mismatch,
        "reduce op mismatch: " + detail::describe_values(values([](const collective_descriptor& d) {
          return std::string(reduce_kind_name(d.op.kind));
        }))};
  if (has_root(kind) && !all_equal([](const collective_descriptor& d) { return d.root; }))
    return contract_violation{errc::contract_mismatch,
                              "root mismatch: " + detail::describe_values(values([](const collective_descriptor& d) {
                                return std::to_string(d.root);
                              }))};
  if (!all_equal([](const collective_descriptor& d) { return d.algo; }))
    return contract_violation{errc::contract_mismatch,
                              "algorithm mismatch (check RINGZERO_ALGO and per-call options): " +
                                  detail::describe_values(values([](const collective_descriptor& d) {
                                    return std::string(algorithm_name(d.algo));
                                  }))};
  // 4. The caller's tag (collective_options::tag): calls alike in everything else but not the
  //    same call.
  if (!all_equal([](const collective_descriptor& d) { return d.tag; }))
    return contract_violation{
        errc::contract_mismatch,
        "tag mismatch (the ranks issued different calls of the same shape): " +
            detail::describe_values(values([&](const collective_descriptor& d) { return tag_text(namer, d.tag); }))};
  // 5. No rank writes what another rank reads or writes.
  if (cross_rank_buffers) {
    for (int w = 0; w < n; ++w) {
      const auto& dw = get(w);
      if (dw.recv_bytes == 0) continue;
      for (int o = 0; o < n; ++o) {
        if (o == w) continue;
        const auto& d_o = get(o);
        const bool hits_recv = detail::ranges_overlap(dw.recv, dw.recv_bytes, d_o.recv, d_o.recv_bytes);
        const bool hits_send = detail::ranges_overlap(dw.recv, dw.recv_bytes, d_o.send, d_o.send_bytes);
        if (hits_recv || hits_send)
          return contract_violation{
              errc::invalid_argument,
              "buffer overlap between ranks: rank " + std::to_string(w) + "'s receive buffer " +
                  detail::describe_range(dw.recv, dw.recv_bytes) + " overlaps rank " + std::to_string(o) + "'s " +
                  (hits_recv ? "receive buffer " + detail::describe_range(d_o.recv, d_o.recv_bytes)
                             : "send buffer " + detail::describe_range(d_o.send, d_o.send_bytes)) +
                  "; every rank needs its own output"};
      }
    }
  }
  return std::nullopt;
}

}  // namespace detail

/// Checks the descriptors of one collective from all `n` ranks (`get(r)` returns rank r's).
/// With `cross_rank_buffers` (ranks share an address space) it also refuses a rank writing
/// memory that another rank reads or writes in the same collective. `namer` (the calling rank's
/// collective_options::tag_name) names every rank's tag in a tag mismatch, and a mismatch of
/// another field gains the calls' names: " (in all_gather of unit 'h.0' ...)" when every rank
/// names the same call, else " (the calls: rank 0: ...; rank 1: ...)".
/// Returns std::nullopt when the call may run. Pure and deterministic.
template <class Get>
std::optional<contract_violation> check_contract(int n, Get&& get, bool cross_rank_buffers,
                                                 const tag_namer& namer = {}) {
  std::optional<contract_violation> violation = detail::check_descriptors(n, get, cross_rank_buffers, namer);
  if (!violation || !namer || violation->code != errc::contract_mismatch ||
      violation->message.starts_with("tag mismatch"))
    return violation;
  std::vector<std::string> names(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) names[static_cast<std::size_t>(r)] = detail::tag_text(namer, get(r).tag);
  if (std::all_of(names.begin(), names.end(), [&](const std::string& x) { return x == names[0]; }))
    violation->message += " (in " + names[0] + ")";
  else
    violation->message += " (the calls: " + detail::describe_values(names) + ")";
  return violation;
}

}  // namespace ringzero
