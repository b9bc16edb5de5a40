#pragma once
/// @file
/// Running one collective: sequence number, blocking or asynchronous issue, the contract check
/// (`begin`), the world-of-one and zero-count cases, the algorithm (or reproducible mode,
/// collective/reproducible.hpp), and `end`.
///
/// Issue order is execution order: a blocking call made while asynchronous work is pending waits
/// behind it on the progress thread. A failure inside an algorithm aborts the communicator so
/// that peers fail promptly instead of waiting for a rank that has given up.

#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "ringzero/algorithms/algorithm_table.hpp"
#include "ringzero/algorithms/device_data_ops.hpp"
#include "ringzero/algorithms/float32_accumulation.hpp"
#include "ringzero/collective/describe.hpp"
#include "ringzero/collective/reproducible.hpp"
#include "ringzero/collective/request.hpp"

namespace ringzero::detail {

/// Holds the transport's one-thread-at-a-time claim (transport::enter_exclusive) for collective
/// `op`; the constructor throws errc::invalid_argument when another thread holds it.
class exclusive_use {
 public:
  exclusive_use(transport& t, const collective_descriptor& op) : t_(t) { t_.enter_exclusive(op); }
  ~exclusive_use() { t_.leave_exclusive(); }
  exclusive_use(const exclusive_use&) = delete;
  exclusive_use& operator=(const exclusive_use&) = delete;

 private:
  transport& t_;
};

/// A world of one: the output is the input (bit for bit), or the input times the
/// scalar for premul_sum.
inline void run_world_of_one(const algorithms::call& c) {
  const collective_descriptor& d = c.d;
  if (d.kind == collective_kind::reduce || d.kind == collective_kind::all_reduce ||
      d.kind == collective_kind::reduce_scatter) {
    if (d.op.kind == reduce_kind::premul_sum) {
      c.ops.scale(d.recv, d.send, d.count, d.type, d.op.scalar);
      return;
    }
  }
  c.ops.copy(d.recv, d.send, c.bytes(d.count));
}

/// Runs `c.d`'s algorithm (n >= 2, count > 0): the entry of `table` for its algorithm and
/// collective. Raises errc::internal naming both when `table` has none (describe refuses such
/// calls before they get here, so reaching it is a bug).
inline void run_algorithm(const algorithms::call& c,
                          std::span<const algorithms::algorithm_descriptor> table = algorithms::algorithm_table) {
  const collective_descriptor& d = c.d;
  const algorithms::collective_entry* e = algorithms::find_collective(d.algo, d.kind, table);
  if (e == nullptr || e->run == nullptr)
    c.t.raise(&c.op, errc::internal,
              "no algorithm descriptor runs " + std::string(collective_name(d.kind)) + " with " +
                  std::string(algorithm_name(d.algo)) +
                  (d.algo == algorithm::automatic ? " (the algorithm was never resolved)" : ""));
  e->run(c);
}

/// Runs `d` with the data operations `ops`: the world-of-one copy, the backend's native
/// collective, or ringzero's schedule; a 16-bit sum that accumulates in float32 runs the
/// schedule or native collective on a float32 copy (direct widens its own tiles; the ring
/// all_reduce gathers 16-bit results).
inline void run_with(transport& c, const collective_descriptor& d, const algorithms::data_ops& ops) {
  const algorithms::call call{c, d, d, ops};
  if (c.world_size() == 1 && (!algorithms::backend_moves_data(d.algo) || c.space() == memory_space::host)) {
    run_world_of_one(call);
  } else if (!algorithms::widens_16bit_sums(d.algo) && algorithms::accumulates_in_float32(d, c.world_size())) {
    if (d.kind == collective_kind::all_reduce && d.algo == algorithm::ring)
      algorithms::ring_all_reduce_in_float32(call);
    else
      algorithms::run_in_float32(call, [](const algorithms::call& inner) { run_algorithm(inner); });
  } else {
    run_algorithm(call);
  }
}

/// Executes descriptor `d` on `c` on the calling thread; every transport call receives `d`;
/// counts it in the transport's traffic once it ends.
/// The data operations follow the transport's memory space: host memory runs the host primitives; CUDA device memory
/// enqueues the CUDA primitives on the communicator's stream (algorithms/device_data_ops.hpp),
/// which needs the kernels registered by <ringzero/cuda.cuh> unless the backend's native
/// collective runs (or the call is a barrier, which moves no data). A 16-bit sum that
/// accumulates in float32 needs them even for the native collective (to widen and narrow).
inline void execute(transport& c, const collective_descriptor& d) {
  exclusive_use exclusive(c, d);
  c.begin(d);
  std::string refusal;
  if (d.kind == collective_kind::barrier ? c.world_size() > 1 : d.count != 0) {
    try {
      const bool widened = algorithms::accumulates_in_float32(d, c.world_size());
      if (d.reproducible != reproducible_mode::off) {
        refusal =
            run_reproducible(c, d, algorithms::host_ops(), [](const algorithms::call& inner) { run_algorithm(inner); });
      } else if (c.space() == memory_space::host || d.kind == collective_kind::barrier ||
                 (algorithms::backend_moves_data(d.algo) && !widened)) {
        run_with(c, d, algorithms::host_ops());
      } else {
        const primitive::device_primitives* kernels = primitive::registered_device_primitives();
        if (kernels == nullptr && widened && algorithms::backend_moves_data(d.algo))
          c.raise(&d, errc::unsupported,
                  std::string(dtype_name(d.type)) + " " + std::string(reduce_kind_name(d.op.kind)) +
                      " on 2 or more ranks accumulates in float32 (docs/numerics.md), even with "
                      "the native collective: widening the input needs ringzero's CUDA kernels, and "
                      "none are registered; compile one .cu file (with nvcc) that includes "
                      "<ringzero/cuda.cuh>");
        if (kernels == nullptr) c.raise(&d, errc::unsupported, primitive::device_primitives_missing_message());
        const algorithms::device_data_ops ops(*kernels, c, d);
        run_with(c, d, ops);
      }
    } catch (const std::exception& e) {
      c.abort(std::string(collective_name(d.kind)) + " #" + std::to_string(d.sequence) + " failed: " + e.what());
      c.abandon(d);
      throw;
    }
  }
  c.end(d);
  c.count_run(d);
  if (!refusal.empty()) c.raise(&d, errc::invalid_argument, refusal + "; no rank wrote its output");
}

/// Issues `d` on `c`: counts it (`issued()`), then runs it inline (blocking, nothing pending; or
/// any call made by a task on the progress thread itself, such as a communication stream's
/// collective), or behind pending work on the progress thread; its sequence number is taken when
/// it starts. Returns a handle (empty when a blocking call already ran). Blocking calls rethrow
/// the collective's error.
inline work issue(transport& c, collective_descriptor d, bool async) {
  c.count_issue();
  if (async && c.progress().running_here()) {
    d.sequence = c.next_sequence();  // a handle that has finished, its error inside
    auto state = std::make_shared<work_state>();
    std::exception_ptr failure;
    try {
      execute(c, d);
    } catch (...) { failure = std::current_exception(); }
    state->finish(std::move(failure));
    return work(std::move(state));
  }
  if (c.progress().running_here() || (!async && c.progress().idle())) {
    d.sequence = c.next_sequence();
    execute(c, d);
    return {};
  }
  // The sequence number is taken when the task runs: a communication stream's turns on this
  // thread (zero/execution_stream.hpp) take theirs there too, and queue order is issue order.
  transport* t = &c;
  work w(c.progress().submit([t, d = std::move(d)]() mutable {
    d.sequence = t->next_sequence();
    execute(*t, d);
  }));
  if (!async) w.wait();
  return w;
}

#if RINGZERO_DEFINE_COMPILED_CORE
// The two entry points declared in collective/request.hpp (inline when header-only, compiled
// once in <ringzero/impl/src.hpp> under RINGZERO_SEPARATE_COMPILATION).
RINGZERO_DECL work issue(communicator& c, const collective_request& q, bool async) {
  return issue(transport_of(c), describe(c, q), async);
}

RINGZERO_DECL void run_blocking(communicator& c, const collective_request& q) { issue(c, q, false).wait(); }
#endif

}  // namespace ringzero::detail
