#pragma once
/// @file
/// Creating NCCL communicators: every rank needs the same unique id, made by rank 0
/// (ncclGetUniqueId) and handed to the others: `init_all(devices)` / `launch` (one process, several
/// GPUs), `init_with_file` (a shared file, backend/nccl/id_file.hpp), `init_with_mpi` (broadcast
/// over MPI), `init_with_tcp` (rank 0 serves it over TCP, backend/tcp_rendezvous.hpp) and
/// `init_from_env` (torchrun's, Open MPI's or Slurm's variables; backend/launch_env.hpp). Rank r uses GPU `local_rank %
/// (visible devices)`. Errors: invalid_argument, no_device, timeout, io_error, backend_failure. Manual: docs/gpu.md.

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ringzero/backend/launch_env.hpp"
#include "ringzero/backend/nccl/communicator.hpp"
#include "ringzero/backend/nccl/id_file.hpp"
#include "ringzero/backend/tcp_rendezvous.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"

#if RINGZERO_HAS_MPI
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API is enough; the deprecated C++ bindings only add warnings
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif

namespace ringzero::nccl {

/// One communicator per device in `devices` (rank i on devices[i]), created by this process in
/// one NCCL group. Devices must be distinct (NCCL refuses two ranks on one GPU); each rank gets
/// its own stream (`opts.stream` must be unset). Returns once every rank exists.
inline std::vector<std::unique_ptr<communicator>> init_all(const std::vector<int>& devices, const options& opts = {}) {
  const int count = primitive::cudart::require_device("nccl::init_all");
  if (devices.empty()) throw error(errc::invalid_argument, "nccl::init_all: no devices given");
  if (opts.stream != nullptr)
    throw error(errc::invalid_argument, "nccl::init_all: options::stream cannot serve several ranks; leave it unset");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= count)
      throw error(errc::invalid_argument, "nccl::init_all: CUDA device " + std::to_string(devices[i]) +
                                              " is outside [0, " + std::to_string(count) + ")");
    for (std::size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i])
        throw error(errc::invalid_argument, "nccl::init_all: device " + std::to_string(devices[i]) +
                                                " is given twice; NCCL does not support two ranks on one GPU "
                                                "(use local::launch_cuda for that)");
  }
  const int n = static_cast<int>(devices.size());
  const id_bytes id = generate_id();
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), id_size);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = opts.blocking ? 1 : 0;
  if (!opts.name.empty()) config.commName = opts.name.c_str();
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  ncclResult_t first = ncclGroupStart();
  for (int i = 0; i < n && first == ncclSuccess; ++i) {
    primitive::cudart::use_device(devices[static_cast<std::size_t>(i)]);
    first = ncclCommInitRankConfig(&comms[static_cast<std::size_t>(i)], n, uid, i, &config);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (first == ncclSuccess) first = end;
  auto abort_all = [&] {
    for (ncclComm_t c : comms)
      if (c != nullptr) (void)ncclCommAbort(c);
  };
  if (first != ncclSuccess && first != ncclInProgress) {
    abort_all();
    throw error(errc_of(first), "nccl::init_all: ncclCommInitRankConfig failed: " + result_text(first));
  }
  // Non-blocking: every communicator reports ncclInProgress until its initialisation is done.
  const auto wait = bounded_timeout(opts.timeout ? *opts.timeout : env_timeout());
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(wait);
  for (ncclComm_t c : comms) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(c, &state);
      if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        abort_all();
        throw error(errc_of(r != ncclSuccess ? r : state),
                    "nccl::init_all: initialisation failed: " + result_text(r != ncclSuccess ? r : state));
      }
      if (state == ncclSuccess) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        abort_all();
        throw error(errc::timeout, "nccl::init_all: initialisation did not complete within the timeout");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::vector<std::unique_ptr<communicator>> result;
  result.reserve(comms.size());
  try {
    for (std::size_t i = 0; i < comms.size(); ++i) {
      result.push_back(communicator::adopt(comms[i], true, opts));
      comms[i] = nullptr;  // owned by the communicator now
    }
  } catch (...) {
    abort_all();
    throw;
  }
  return result;
}

/// Runs `fn(nccl::communicator&)` on one thread per device of `devices` (rank i on devices[i],
/// communicators from `init_all`) and waits for all; each rank's stream is synchronised after
/// its `fn` returns. When a rank throws, every communicator is aborted so that no rank hangs,
/// and the exception of the lowest failing rank is rethrown.
template <class F>
void launch(const std::vector<int>& devices, F&& fn, const options& opts = {}) {
  std::vector<std::unique_ptr<communicator>> comms = init_all(devices, opts);
  std::vector<std::exception_ptr> failures(comms.size());
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (std::size_t i = 0; i < comms.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        primitive::cudart::use_device(comms[i]->device());
        fn(*comms[i]);
        comms[i]->synchronize();
      } catch (...) {
        failures[i] = std::current_exception();
        for (auto& c : comms) c->abort("rank " + std::to_string(i) + " failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  comms.clear();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
}

/// The device of a rank with local rank `local_rank`: local_rank % device count.
inline int device_for_local_rank(int local_rank, const std::string& who) {
  const int count = primitive::cudart::require_device(who);
  return local_rank % count;
}

namespace detail {

/// The context of an NCCL init error on `rank` of `world_size` (no collective).
inline error_context init_context(int rank, int world_size) {
  error_context context;
  context.backend = "nccl";
  context.rank = rank;
  context.world_size = world_size;
  return context;
}

/// Runs `f()`; an error it throws without a rank gets this one's (`rank` of `world_size`, backend
/// "nccl"), so that the lines of several processes say which one failed.
template <class F>
auto naming_rank(int rank, int world_size, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const error& e) {
    if (e.context().rank >= 0) throw;
    throw error(e.kind(), init_context(rank, world_size), e.message());
  }
}

/// The timeout of a launched rank's start-up (`opts.timeout`, else RINGZERO_TIMEOUT), after
/// checking `env`: errc::invalid_argument, message starting with `who`, for a world size below
/// 1, a rank outside [0, world size), a negative local rank or a timeout that is not positive.
inline std::chrono::duration<double> checked_launch(const launch_env& env, const options& opts, const char* who) {
  const std::string w = who;
  if (env.world_size < 1)
    throw error(errc::invalid_argument, w + "world size " + std::to_string(env.world_size) + " is below 1");
  if (env.rank < 0 || env.rank >= env.world_size)
    throw error(errc::invalid_argument,
                w + "rank " + std::to_string(env.rank) + " is outside [0, " + std::to_string(env.world_size) + ")");
  if (env.local_rank < 0)
    throw error(errc::invalid_argument, w + "local rank " + std::to_string(env.local_rank) + " is negative");
  const auto wait = opts.timeout ? *opts.timeout : env_timeout();
  if (!(wait.count() > 0.0))
    throw error(errc::invalid_argument, w + "timeout must be positive, got " + std::to_string(wait.count()) + " s");
  return wait;
}

}  // namespace detail

/// Rank `env.rank` of `env.world_size`, with the id exchanged through the file `path` on a
/// filesystem every rank can read (nccl/id_file.hpp), on device `env.local_rank % devices`.
/// Rank 0 removes the file once the communicator exists, and also when making it fails after
/// the file was published (so that no later job finds a stale id). Errors name the rank
/// (`ringzero [nccl rank 1/4]: ...`); errc::invalid_argument, before any file is touched, for a
/// world size below 1, a rank outside [0, world size), a negative local rank or a timeout that
/// is not positive.
inline std::unique_ptr<communicator> init_with_file(const std::string& path, const launch_env& env,
                                                    const options& opts = {}) {
  return detail::naming_rank(env.rank, env.world_size, [&] {
    const auto wait = detail::checked_launch(env, opts, "nccl::init_with_file: ");
    const int device = device_for_local_rank(env.local_rank, "nccl::init_with_file");
    const id_bytes id = exchange_id_through_file(
        path, env.rank, env.world_size, [] { return generate_id(); }, bounded_timeout(wait));
    struct published_file {  // rank 0 removes the file it published, whether or not the communicator comes up
      const std::string& path;
      bool owner;
      ~published_file() {
        if (owner) remove_id_file(path);
      }
    } published{path, env.rank == 0};
    return std::make_unique<communicator>(id, env.rank, env.world_size, device, opts);
  });
}

#if RINGZERO_HAS_MPI
/// One rank per process of the MPI communicator `mpi` (rank = MPI rank), the id broadcast from
/// MPI rank 0, on device `local rank % devices` where the local rank is the rank among the
/// processes sharing this node (MPI_COMM_TYPE_SHARED). Every rank first learns whether all have
/// a CUDA device, so a missing GPU anywhere fails everywhere with errc::no_device.
/// Collective over `mpi`; MPI must be initialised.
inline std::unique_ptr<communicator> init_with_mpi(MPI_Comm mpi, const options& opts = {}) {
  int rank = 0, size = 1;
  MPI_Comm_rank(mpi, &rank);
  MPI_Comm_size(mpi, &size);
  MPI_Comm node;
  MPI_Comm_split_type(mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  std::string why;
  const int count = primitive::cudart::device_count(&why);
  // the lowest rank without a device (size when every rank has one)
  int missing = count > 0 ? size : rank, first_missing = size;
  MPI_Allreduce(&missing, &first_missing, 1, MPI_INT, MPI_MIN, mpi);
  const error_context where = detail::init_context(rank, size);
  if (first_missing < size)
    throw error(
        errc::no_device, where,
        "nccl::init_with_mpi: no CUDA device on " +
            (count > 0 ? "rank " + std::to_string(first_missing) + " (this rank has " + std::to_string(count) + ")"
                       : "this rank (" + why + ")"));
  id_bytes id{};
  int ok = 1;
  std::string failure;
  if (rank == 0) {
    try {
      id = generate_id();
    } catch (const std::exception& e) {
      ok = 0;
      failure = e.what();
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, mpi);
  if (!ok)
    throw error(errc::backend_failure, where,
                "nccl::init_with_mpi: rank 0 could not create the NCCL unique id" +
                    (failure.empty() ? std::string() : ": " + failure));
  MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, mpi);
  return detail::naming_rank(rank, size,
                             [&] { return std::make_unique<communicator>(id, rank, size, local_rank % count, opts); });
}
#endif

/// Rank `env.rank` of `env.world_size` on device `env.local_rank % devices`, with the id made by
/// rank 0 and handed to the others over TCP: rank 0 listens on `where.port`, the others connect
/// to `where.host` (backend/tcp_rendezvous.hpp, torchrun's MASTER_ADDR / MASTER_PORT). `job`
/// (empty: none) must be the same on every rank; connections of another job are turned away.
/// Errors name the rank; errc::invalid_argument for a bad rank, world size or timeout, a port in
/// use or ranks that disagree on the world size; errc::timeout when rank 0 or some rank never
/// comes (the message names the address or the missing ranks).
inline std::unique_ptr<communicator> init_with_tcp(const rendezvous_address& where, const launch_env& env,
                                                   const options& opts = {}, const std::string& job = {}) {
  return detail::naming_rank(env.rank, env.world_size, [&] {
    const std::string who = "nccl::init_with_tcp: ";
    const auto wait = detail::checked_launch(env, opts, who.c_str());
    const int device = device_for_local_rank(env.local_rank, "nccl::init_with_tcp");
    const std::string bytes = tcp_rendezvous(
        where, env.rank, env.world_size, job,
        [] {
          const id_bytes made = generate_id();
          return std::string(reinterpret_cast<const char*>(made.data()), made.size());
        },
        wait);
    if (bytes.size() != id_size)
      throw error(errc::backend_failure, who + "rank 0 sent " + std::to_string(bytes.size()) +
                                             " bytes where NCCL's unique id has " + std::to_string(id_size));
    id_bytes id{};
    std::memcpy(id.data(), bytes.data(), id_size);
    return std::make_unique<communicator>(id, env.rank, env.world_size, device, opts);
  });
}

/// A communicator for this process from its environment (see the file comment): a world of one
/// without launcher variables; otherwise the id exchanged through RINGZERO_NCCL_ID_FILE when it
/// is set, else over TCP at MASTER_ADDR:MASTER_PORT (torchrun's `env://`; set them yourself
/// under srun or mpirun), with the job identity of `job_token_from_env()`.
/// Throws errc::invalid_argument when several ranks are launched and neither is set (with MPI,
/// call `init_with_mpi` instead).
inline std::unique_ptr<communicator> init_from_env(const options& opts = {}) {
  const launch_env env = read_launch_env();
  if (env.world_size == 1) {
    const int device = device_for_local_rank(env.local_rank, "nccl::init_from_env");
    return std::make_unique<communicator>(generate_id(), 0, 1, device, opts);
  }
  if (auto path = ringzero::detail::env_string("RINGZERO_NCCL_ID_FILE")) return init_with_file(*path, env, opts);
  if (auto where = rendezvous_address_from_env()) return init_with_tcp(*where, env, opts, job_token_from_env());
  throw error(errc::invalid_argument,
              "nccl::init_from_env: " + std::to_string(env.world_size) + " ranks (from " + env.source +
                  " variables) need a way to share NCCL's unique id: set MASTER_ADDR and MASTER_PORT (rank 0's "
                  "host and a free port; torchrun sets them), or RINGZERO_NCCL_ID_FILE to a path every rank can "
                  "read, or use nccl::init_with_mpi");
}

}  // namespace ringzero::nccl
