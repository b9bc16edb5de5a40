// The sweep behind tests/collective/data/selection_table.txt: algorithm selection (collective
// kind, dtype, op, count, world size, backend capabilities and link model, per-call and forced
// algorithm) and the cost model's estimates, written as text lines. The table was captured from
// the selection code before algorithms became descriptors; test_selection_table.cpp recomputes
// every line with the current code and compares (selection must not change).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/ringzero.hpp"

namespace rzt {

/// A backend that only answers the selection questions (rank 0 of `world_size`): which
/// algorithms it supports, whether it prefers native, its link model. It moves no data.
class selection_probe final : public ringzero::detail::backend_communicator {
 public:
  selection_probe(int world_size, std::vector<ringzero::algorithm> algos, bool prefers_native,
                  const ringzero::link_model& link)
      : backend_communicator(0, world_size), algos_(std::move(algos)), prefers_native_(prefers_native), link_(link) {
    set_forced_algorithm(ringzero::algorithm::automatic);
    set_reproducible(false);
  }
  ringzero::backend_kind backend() const noexcept override { return ringzero::backend_kind::local; }
  bool supports(ringzero::algorithm a, ringzero::collective_kind) const noexcept override {
    for (ringzero::algorithm b : algos_)
      if (a == b) return true;
    return false;
  }
  bool prefers_native(ringzero::collective_kind) const noexcept override { return prefers_native_; }
  ringzero::link_model link() const noexcept override { return link_; }
  void begin(const ringzero::collective_descriptor& op) override { no_data(op); }
  void end(const ringzero::collective_descriptor& op) override { no_data(op); }
  void backend_sendrecv(const ringzero::collective_descriptor& op, const void*, std::uint64_t, int, void*,
                        std::uint64_t, int) override {
    no_data(op);
  }
  void backend_sendrecv_reduce(const ringzero::collective_descriptor& op, const void*, std::uint64_t, int, const void*,
                               void*, std::uint64_t, int, const ringzero::combine_fn&) override {
    no_data(op);
  }

 private:
  [[noreturn]] void no_data(const ringzero::collective_descriptor& op) const {
    raise(&op, ringzero::errc::internal, "selection_probe answers selection questions only; it moves no data");
  }
  std::vector<ringzero::algorithm> algos_;
  bool prefers_native_;
  ringzero::link_model link_;
};

/// A backend profile of the sweep: capabilities and link model.
struct selection_profile {
  const char* name;
  std::vector<ringzero::algorithm> algos;
  bool prefers_native;
  ringzero::link_model link;
};

/// The link models of the backends (as their link() returned them when the table was captured)
/// and two made-up ones that move the crossovers.
inline std::vector<selection_profile> selection_profiles() {
  using ringzero::algorithm;
  ringzero::link_model local;
  local.memory_us_per_byte = 1.0 / 10e3;
  local.alpha_us = 0.3;
  local.beta_us_per_byte = 2 * local.memory_us_per_byte;
  local.gamma_us_per_byte = local.memory_us_per_byte;
  local.sync_us = 0.3;
  local.cache_us_per_byte = local.memory_us_per_byte / 10;
  ringzero::link_model cuda;
  cuda.alpha_us = 8.0;
  cuda.beta_us_per_byte = 1.0 / 1.5e6;
  cuda.gamma_us_per_byte = 1.0 / 1.5e6;
  cuda.sync_us = 8.0;
  cuda.memory_us_per_byte = 1.0 / 1.5e6;
  auto mpi = [](bool over) {
    ringzero::link_model m;
    m.alpha_us = over ? 4.0 : 2.0;
    m.beta_us_per_byte = over ? 4e-4 : 1.5e-4;
    m.gamma_us_per_byte = 1e-4;
    m.sync_us = m.alpha_us;
    m.memory_us_per_byte = m.beta_us_per_byte;
    return m;
  };
  ringzero::link_model nccl;
  nccl.alpha_us = 10.0;
  nccl.beta_us_per_byte = 1.0 / 20e3;
  nccl.gamma_us_per_byte = 1.0 / 1.5e6;
  ringzero::link_model slow_start;  // high latency, fast links: halving_doubling wins longer
  slow_start.alpha_us = 50.0;
  slow_start.beta_us_per_byte = 1e-5;
  slow_start.gamma_us_per_byte = 1e-6;
  slow_start.sync_us = 3.0;
  slow_start.memory_us_per_byte = 1e-5;
  slow_start.cache_us_per_byte = 1e-6;
  const ringzero::link_model defaults{};
  const algorithm r = algorithm::ring, h = algorithm::halving_doubling, d = algorithm::direct, n = algorithm::native;
  return {
      {"local", {r, h, d}, false, local},
      {"local_cuda", {r, h}, false, cuda},
      {"mpi", {r, h, n}, false, mpi(false)},
      {"mpi_oversubscribed", {r, h, n}, false, mpi(true)},
      {"nccl", {r, h, n}, true, nccl},
      {"slow_start_all", {r, h, d, n}, false, slow_start},
      {"defaults_p2p", {r, h}, false, defaults},
      {"hd_native", {h, n}, false, slow_start},
      {"direct_only", {d}, false, local},
      {"ring_only_prefers_native", {r}, true, local},
      {"none", {}, false, defaults},
  };
}

/// One letter per algorithm: a(uto) r(ing) d(irect) h(alving_doubling) n(ative); upper case
/// when resolve_algorithm reported a problem (the requested algorithm is not available).
inline char selection_letter(ringzero::algorithm a, bool problem) {
  char c = '?';
  switch (a) {
    case ringzero::algorithm::automatic: c = 'a'; break;
    case ringzero::algorithm::ring: c = 'r'; break;
    case ringzero::algorithm::direct: c = 'd'; break;
    case ringzero::algorithm::halving_doubling: c = 'h'; break;
    case ringzero::algorithm::native: c = 'n'; break;
  }
  return problem ? static_cast<char>(c - 'a' + 'A') : c;
}

inline constexpr ringzero::algorithm selection_algorithms[] = {
    ringzero::algorithm::automatic, ringzero::algorithm::ring, ringzero::algorithm::direct,
    ringzero::algorithm::halving_doubling, ringzero::algorithm::native};

/// Every line of the table, in order. Three parts:
/// - "choose": the algorithm `describe` resolves for an automatic call, one letter per count;
/// - "resolve": resolve_algorithm with every (requested, forced) pair, one letter per
///   (world size, bytes);
/// - "estimate": estimate_us as hexadecimal floats (bit-exact) for every implemented pair.
inline std::vector<std::string> selection_sweep_lines() {
  using namespace ringzero;
  std::vector<std::string> lines;
  const std::uint64_t counts[] = {0,     1,     2,      3,       7,       64,      1000,      4096,
                                  30000, 65536, 250000, 1 << 20, 5000000, 1 << 24, 1ULL << 26};
  const int worlds[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 64};
  const dtype types[] = {dtype::int8, dtype::bfloat16, dtype::float64};
  static unsigned char bytes_area[64];  // stands for every buffer; never read or written
  for (const selection_profile& p : selection_profiles()) {
    const std::string name = p.name;  // the edge-case profiles are swept by "resolve" only
    if (name == "direct_only" || name == "ring_only_prefers_native" || name == "none") continue;
    for (int w : worlds) {
      selection_probe comm(w, p.algos, p.prefers_native, p.link);
      for (int ki = 0; ki <= static_cast<int>(collective_kind::barrier); ++ki) {
        const auto k = static_cast<collective_kind>(ki);
        for (dtype t : types) {
          const reduce_kind ops[] = {reduce_kind::sum, reduce_kind::max};
          for (reduce_kind op : ops) {
            if (op != reduce_kind::sum && !is_reduction(k)) continue;
            std::string line = "choose " + std::string(p.name) + " " + std::string(collective_name(k)) + " " +
                               std::string(dtype_name(t)) + " " + std::string(reduce_kind_name(op)) +
                               " n=" + std::to_string(w) + " :";
            for (std::uint64_t count : counts) {
              // Distinct, non-overlapping fake buffers: describe checks pointers, never reads them.
              const void* send = bytes_area;
              void* recv = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(bytes_area) + (1ULL << 40));
              const auto q = detail::make_request(k, send, recv, count, t, reduce_op{op}, 0, collective_options{});
              const collective_descriptor d = detail::describe(comm, q);
              line += ' ';
              line += selection_letter(d.algo, false);
            }
            lines.push_back(line);
          }
        }
      }
    }
  }
  const int resolve_worlds[] = {1, 2, 5, 8};
  const double resolve_bytes[] = {0.0, 1000.0, 40000.0, 1e7};
  for (const selection_profile& p : selection_profiles()) {
    for (int ki = 0; ki < collective_kind_count; ++ki) {
      const auto k = static_cast<collective_kind>(ki);
      for (algorithm requested : selection_algorithms) {
        for (algorithm forced : selection_algorithms) {
          std::string line = "resolve " + std::string(p.name) + " " + std::string(collective_name(k)) +
                             " requested=" + std::string(algorithm_name(requested)) +
                             " forced=" + std::string(algorithm_name(forced)) + " :";
          for (int w : resolve_worlds) {
            selection_probe comm(w, p.algos, p.prefers_native, p.link);
            for (double bytes : resolve_bytes) {
              std::string problem;
              const algorithm a = resolve_algorithm(comm, k, bytes, requested, forced, problem);
              line += ' ';
              line += selection_letter(a, !problem.empty());
            }
          }
          lines.push_back(line);
        }
      }
    }
  }
  const int estimate_worlds[] = {1, 2, 3, 5, 8, 64};
  const double estimate_bytes[] = {0.0, 1.0, 100.0, 30000.0, 1e6, 3e8};
  for (const selection_profile& p : selection_profiles()) {
    const std::string name = p.name;  // five link models
    if (name != "local" && name != "mpi" && name != "nccl" && name != "slow_start_all" && name != "defaults_p2p")
      continue;
    for (int ki = 0; ki < collective_kind_count; ++ki) {
      const auto k = static_cast<collective_kind>(ki);
      for (algorithm a : selection_algorithms) {
        if (a == algorithm::automatic || !algorithm_implements(a, k)) continue;
        for (int w : estimate_worlds) {
          std::string line = "estimate " + std::string(p.name) + " " + std::string(collective_name(k)) + " " +
                             std::string(algorithm_name(a)) + " n=" + std::to_string(w) + " :";
          for (double bytes : estimate_bytes) {
            char buf[64];
            std::snprintf(buf, sizeof buf, " %a", estimate_us(k, a, w, bytes, p.link));
            line += buf;
          }
          lines.push_back(line);
        }
      }
    }
  }
  return lines;
}

}  // namespace rzt
