#pragma once
/// @file
/// Where an example's ranks run, so that a trainer only writes `rank_main(communicator&)`:
/// `--backend local` (threads of this process; with `--device cuda` on CUDA device memory via
/// local::launch_cuda, several ranks per GPU), `--backend mpi` (one rank per process, started by
/// mpirun) or `--backend nccl` (one rank per process and GPU: under mpirun the NCCL id is
/// broadcast over MPI, under torchrun or srun rank 0 serves it over TCP at MASTER_ADDR:MASTER_PORT
/// or it goes through RINGZERO_NCCL_ID_FILE; docs/gpu.md).
/// `process_world` checks the choice, starts MPI where it is needed and refuses a launcher that
/// started several processes of a `--backend local` run (launcher.hpp). Errors: ringzero::error
/// (invalid_argument for a choice that cannot run, unsupported for a backend not built in,
/// no_device without a GPU). Threads: one `process_world` per process, made by main.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include <fmt/core.h>

#include "launcher.hpp"
#include "ringzero/backend/launch_env.hpp"
#include "ringzero/ringzero.hpp"
#if RINGZERO_HAS_CUDA
#include "ringzero/backend/local/cuda.hpp"
#endif
#if RINGZERO_HAS_MPI
#include "ringzero/backend/mpi.hpp"
#endif
#if RINGZERO_HAS_NCCL
#include "ringzero/backend/nccl.hpp"
#endif

namespace ringzero::examples {

/// The backend, device and rank count of a run, as the command line gives them.
struct rank_setup {
  std::string backend = "local";  ///< local (threads), mpi or nccl (one rank per process)
  std::string device = "cpu";     ///< cpu (host memory), sim (host streams, example 02) or cuda (device memory)
  int ranks = 2;                  ///< local: threads; mpi, nccl: the process count (process_world sets it)
  bool pin = true;                ///< local backend: pin rank r's thread to core r
  double link_gbps = 0;           ///< mpi: mpi::communicator_options::link_gbps when > 0 (else RINGZERO_LINK_GBPS)
};

/// Prints why `program` failed on stderr, after what stdout holds: "<program>: <message>", or
/// "<program> (process R): <message>" when each process is one rank (`where.backend` mpi or
/// nccl). Returns 1, the examples' exit status for a failed run.
inline int report_failure(const char* program, const rank_setup& where, int process_rank, const std::exception& e) {
  std::fflush(stdout);
  if (where.backend != "local")
    std::fprintf(stderr, "%s (process %d): %s\n", program, process_rank, ringzero::error_text(e).c_str());
  else
    std::fprintf(stderr, "%s: %s\n", program, ringzero::error_text(e).c_str());
  return 1;
}

/// This process's place in the run (see the file comment).
class process_world {
 public:
  /// Checks `setup` for `program` and starts MPI for `--backend mpi` (and nccl under mpirun);
  /// with one rank per process `setup.ranks` becomes the process count (an explicit, different
  /// `--ranks`, `ranks_given`, is an error) and threads are not pinned (the launcher binds).
  process_world(int& argc, char**& argv, rank_setup& setup, bool ranks_given, const std::string& program) {
    const bool per_process = setup.backend != "local";
    if (setup.backend == "mpi" && setup.device == "cuda")
      throw error(errc::invalid_argument,
                  "--device cuda does not run on --backend mpi (its transfers are host memory)");
    if (setup.backend != "local" && setup.device == "sim")
      throw error(errc::invalid_argument,
                  "--device sim (the simulated device: host threads of one process) runs on --backend local only");
    if (setup.backend == "nccl" && setup.device != "cuda")
      throw error(errc::invalid_argument, "--backend nccl needs --device cuda");
    if (!per_process) return;
    const bool under_mpirun = detect_launcher().has_value() && std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
    if (setup.backend == "mpi" || under_mpirun) {
#if RINGZERO_HAS_MPI
      (void)program;
      mpi_.emplace(argc, argv);  // MPI_Init_thread ... MPI_Finalize
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
#else
      (void)argc;
      (void)argv;
      if (setup.backend == "mpi")
        throw error(errc::unsupported, "this " + program + " was built without MPI (--backend mpi)");
#endif
    }
    if (!mpi_started()) {  // nccl under torchrun or srun
      const launch_env env = read_launch_env();
      rank_ = env.rank;
      size_ = env.world_size;
    }
    if (ranks_given && setup.ranks != size_)
      throw error(errc::invalid_argument,
                  fmt::format("--ranks {} but the launcher started {} processes", setup.ranks, size_));
    setup.ranks = size_;
    setup.pin = false;  // the launcher binds processes; threads are not pinned on top of that
  }

  /// This process's rank (0 for the local backend, whose process runs every rank).
  int rank() const noexcept { return rank_; }
  /// Whether this process prints and writes the results (rank 0's).
  bool lead() const noexcept { return rank_ == 0; }

 private:
  bool mpi_started() const noexcept {
#if RINGZERO_HAS_MPI
    return mpi_.has_value();
#else
    return false;
#endif
  }

#if RINGZERO_HAS_MPI
  std::optional<mpi::environment> mpi_;
#endif
  int rank_ = 0;
  int size_ = 1;
};

/// The refusal of launcher.hpp for a `--backend local` run started as one of several processes
/// (printed to stderr; `has_nccl`: the example takes --backend nccl, and the refusal says so);
/// false when there is nothing to refuse.
inline bool refuse_launcher(const rank_setup& setup, const std::string& program, bool has_nccl = false) {
  if (setup.backend != "local") return false;
  const std::string refusal =
      launcher_refusal(detect_launcher(), program, "--backend mpi", has_nccl ? "--backend nccl --device cuda" : "");
  if (refusal.empty()) return false;
  std::fprintf(stderr, "%s\n", refusal.c_str());
  return true;
}

/// True when the example was built with its CUDA trainer (nvcc, the CUDA runtime and cuBLAS
/// were found when it was configured: examples/meson.build defines RINGZERO_EXAMPLES_HAVE_CUDA).
#if RINGZERO_EXAMPLES_HAVE_CUDA
inline constexpr bool built_with_cuda = true;
#else
inline constexpr bool built_with_cuda = false;
#endif

/// Fails at once, before any data is read, when `--device cuda` cannot run: no CUDA device
/// (errc::no_device, "no CUDA device"), or `program` built without CUDA (`built_with_cuda`).
inline void require_device(const rank_setup& setup, const std::string& program) {
  if (setup.device != "cuda") return;
#if RINGZERO_HAS_CUDA
  if (built_with_cuda) {
    (void)primitive::cudart::require_device("--device cuda");
    return;
  }
#endif
  throw error(errc::unsupported, "--device cuda: this build of " + program +
                                     " has no CUDA support (it needs nvcc, the CUDA runtime and cuBLAS when it is "
                                     "configured)");
}

/// Runs `rank_main(communicator&)` on every rank of `setup` that lives in this process: all of
/// them on the local backend (threads; returns when all are done), this process's one otherwise.
template <class F>
void run_ranks(const rank_setup& setup, F&& rank_main) {
  if (setup.backend == "mpi") {
#if RINGZERO_HAS_MPI
    mpi::communicator_options options;
    if (setup.link_gbps > 0) options.link_gbps = setup.link_gbps;
    mpi::communicator comm(MPI_COMM_WORLD, options);
    rank_main(comm);
    return;
#endif
  } else if (setup.backend == "nccl") {
#if RINGZERO_HAS_NCCL
#if RINGZERO_HAS_MPI
    const bool mpi = mpi::is_active();
    const auto comm = mpi ? nccl::init_with_mpi(MPI_COMM_WORLD) : nccl::init_from_env();
#else
    const auto comm = nccl::init_from_env();
#endif
    rank_main(*comm);
    return;
#endif
  } else if (setup.device == "cuda") {
#if RINGZERO_HAS_CUDA
    local::cuda_launch_options options;
    options.pin_threads = setup.pin;
    local::launch_cuda(
        setup.ranks, [&](local::cuda_communicator& comm) { rank_main(comm); }, options);
    return;
#endif
  } else {
    local::launch_options options;
    options.pin_threads = setup.pin;
    local::launch(
        setup.ranks, [&](communicator& comm) { rank_main(comm); }, options);
    return;
  }
  throw error(errc::unsupported, "--backend " + setup.backend + " --device " + setup.device + ": not in this build");
}

}  // namespace ringzero::examples
