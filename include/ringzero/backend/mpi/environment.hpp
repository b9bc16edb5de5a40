#pragma once
/// @file
/// `mpi::environment`: initialises and finalises MPI for a program that uses the MPI backend,
/// asking for the thread level ringzero needs, and the helpers that turn MPI's return codes
/// into `ringzero::error`.
///
/// Thread levels. ringzero runs asynchronous collectives on a communicator's progress thread,
/// so MPI is called from a thread other than the one that initialised it. With
/// `MPI_THREAD_MULTIPLE` ringzero calls MPI freely; with `MPI_THREAD_SERIALIZED` it serialises
/// every MPI call it makes through one process-wide mutex (the program must then not call MPI
/// itself while ringzero work is pending); below that the MPI backend refuses to start, with an
/// error saying how to initialise MPI. `environment` asks for `MPI_THREAD_MULTIPLE`.
///
/// Requires an MPI implementation (`mpi.h`); any MPI-3 library works (Open MPI, MPICH).

#if !__has_include(<mpi.h>)
#error \
    "ringzero/backend/mpi needs an MPI library (mpi.h): compile with mpicxx (or MPI's compile and link flags, e.g. pkg-config mpi) and -DRINGZERO_HAS_MPI=1, or in Meson use the ringzero-mpi dependency"
#endif

// The deprecated MPI C++ bindings are not used; skip them (faster builds, no warnings).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <mutex>
#include <optional>
#include <string>

#include "ringzero/core/error.hpp"

namespace ringzero::mpi {

namespace detail {

/// MPI's text for error code `code` ("MPI_ERR_TRUNCATE: message truncated").
inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

/// The error class of `code` (MPI_ERR_TRUNCATE, ...).
inline int error_class(int code) noexcept {
  int c = code;
  if (MPI_Error_class(code, &c) != MPI_SUCCESS) return code;
  return c;
}

/// "MPI_THREAD_MULTIPLE", ... for a thread level.
inline const char* thread_level_name(int level) noexcept {
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  return "an unknown thread level";
}

/// True when the MPI library yields the processor by itself inside a poll that finds nothing
/// to do: Open MPI's control variable `mpi_yield_when_idle`, read through the MPI tool
/// interface (MPI-3 MPI_T). Open MPI turns it on when its launcher knows the node is
/// oversubscribed (`mpirun --oversubscribe`), but not when a hostfile claims more slots than
/// the node has cores. False when the variable does not exist (MPICH, ...) or cannot be read.
/// Call after MPI_Init.
inline bool mpi_yields_when_idle() noexcept {
  // MPI_T_init_thread asks for the level MPI already runs at: Open MPI 4.1 lets a lower
  // request lower what MPI_Query_thread reports for the whole process afterwards.
  int level = MPI_THREAD_SINGLE, provided = 0;
  if (MPI_Query_thread(&level) != MPI_SUCCESS) return false;
  if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return false;
  bool yields = false;
  int index = -1;
  if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      if (count == 1) {
        // The variable is a bool or an int; zeroed room for either, any set byte means true.
        unsigned char value[16] = {};
        if (MPI_T_cvar_read(handle, value) == MPI_SUCCESS)
          for (unsigned char b : value) yields = yields || b != 0;
      }
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return yields;
}

/// The process-wide mutex that serialises ringzero's MPI calls below MPI_THREAD_MULTIPLE.
inline std::mutex& serial_mutex() noexcept {
  static std::mutex m;
  return m;
}

/// Holds `serial_mutex()` while alive when `serialize` is true; does nothing otherwise.
class call_lock {
 public:
  explicit call_lock(bool serialize) {
    if (serialize) lock_.emplace(serial_mutex());
  }

 private:
  std::optional<std::lock_guard<std::mutex>> lock_;
};

}  // namespace detail

/// True between MPI_Init(_thread) and MPI_Finalize.
inline bool is_active() noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

/// The thread level MPI was initialised with (MPI_Query_thread). Precondition: `is_active()`.
inline int thread_level() noexcept {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level;
}

/// RAII initialisation of MPI: the constructor calls `MPI_Init_thread` asking for
/// `MPI_THREAD_MULTIPLE` (unless MPI is already initialised, in which case it does nothing and
/// the destructor leaves MPI alone); the destructor calls `MPI_Finalize`.
/// Destroy every `mpi::communicator` before the environment. One per process, made on the main
/// thread (MPI's rule for MPI_Init_thread).
/// Errors: errc::backend_failure when MPI_Init_thread fails; errc::unsupported when MPI was
/// already finalised (MPI cannot be initialised twice).
class environment {
 public:
  /// Initialises MPI with the program's arguments (MPI may read and remove its own).
  environment(int& argc, char**& argv) { init(&argc, &argv); }
  /// Initialises MPI without arguments.
  environment() { init(nullptr, nullptr); }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  /// Calls MPI_Finalize if this object initialised MPI and it is still active.
  ~environment() {
    if (owns_ && is_active()) MPI_Finalize();
  }

  /// The thread level MPI provides.
  int provided() const noexcept { return provided_; }
  /// True when this object initialised MPI (and will finalise it).
  bool owns() const noexcept { return owns_; }

 private:
  void init(int* argc, char*** argv) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
      throw error(errc::unsupported, "mpi::environment: MPI was already finalised and cannot be initialised again");
    if (initialized) {
      provided_ = thread_level();
      return;
    }
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_);
    if (rc != MPI_SUCCESS) throw error(errc::backend_failure, "MPI_Init_thread failed: " + detail::error_string(rc));
    owns_ = true;
  }

  int provided_ = MPI_THREAD_SINGLE;
  bool owns_ = false;
};

}  // namespace ringzero::mpi
