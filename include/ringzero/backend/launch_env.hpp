#pragma once
/// @file
/// `launch_env`: a process's place in a multi-process job, read from the variables launchers
/// set: torchrun's RANK, WORLD_SIZE and LOCAL_RANK (PyTorch's `env://` convention) first, then
/// Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, then Slurm's SLURM_PROCID /
/// SLURM_NTASKS / SLURM_LOCALID. With none of them set the process is a world of one.
///
/// Every value is checked: a malformed or inconsistent one (anything but decimal digits, a rank
/// outside [0, world_size), a local rank outside [0, world_size) or, where the launcher says
/// how many processes share the node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE), outside
/// [0, that), RANK without WORLD_SIZE or WORLD_SIZE without RANK, the same for Open MPI's pair)
/// raises errc::invalid_argument naming the variable and its text. Without a local-rank
/// variable the local rank is the global rank (one node; an error when the launcher says the
/// node holds fewer processes than the world). Pure apart from reading the environment;
/// thread-safe as getenv.

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

#include "ringzero/core/env.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero {

/// Where this process sits in its job.
struct launch_env {
  int rank = 0;        ///< global rank, 0 <= rank < world_size
  int world_size = 1;  ///< number of processes
  int local_rank = 0;  ///< rank among the processes of this node (selects the GPU)
  std::string source;  ///< "torchrun", "mpi", "slurm" or "none" (world of one)
};

namespace detail {

/// Parses a non-negative decimal int; throws errc::invalid_argument naming `name` otherwise.
inline int parse_nonnegative_int(const std::string& text, const char* name) {
  char* end = nullptr;
  errno = 0;
  const bool digits_first = !text.empty() && text[0] >= '0' && text[0] <= '9';  // no space or sign before
  const long v = digits_first ? std::strtol(text.c_str(), &end, 10) : -1;
  if (!digits_first || end == text.c_str() || *end != '\0' || errno == ERANGE || v < 0 || v > 0x7fffffffL)
    throw error(errc::invalid_argument, std::string(name) + "=\"" + text + "\" is not a non-negative integer");
  return static_cast<int>(v);
}

/// Reads one launcher's triple of variables; std::nullopt when its rank variable is unset (or
/// empty). `size_needs_rank`: the world-size variable without the rank variable is an error
/// (torchrun and mpirun set both; N processes that each took themselves for a world of one
/// would train apart without a word). Not for Slurm, whose allocation shells set SLURM_NTASKS
/// without SLURM_PROCID for every command they run.
inline std::optional<launch_env> read_launch_env(const char* rank_var, const char* size_var, const char* local_var,
                                                 const char* local_size_var, const char* source,
                                                 bool size_needs_rank = true) {
  const auto rank = env_string(rank_var);
  const auto size = env_string(size_var);
  if (!rank) {
    if (size && size_needs_rank)
      throw error(errc::invalid_argument, std::string(size_var) + "=\"" + *size + "\" is set but " + rank_var +
                                              " is not: set both (or neither, for a world of one)");
    return std::nullopt;
  }
  if (!size) throw error(errc::invalid_argument, std::string(rank_var) + " is set but " + size_var + " is not");
  launch_env e;
  e.source = source;
  e.rank = parse_nonnegative_int(*rank, rank_var);
  e.world_size = parse_nonnegative_int(*size, size_var);
  if (e.world_size < 1)
    throw error(errc::invalid_argument, std::string(size_var) + "=\"" + *size + "\" must be at least 1");
  if (e.rank >= e.world_size)
    throw error(errc::invalid_argument, std::string(rank_var) + "=" + std::to_string(e.rank) + " is outside [0, " +
                                            size_var + "=" + std::to_string(e.world_size) + ")");
  const auto local = env_string(local_var);
  const auto local_size = local_size_var ? env_string(local_size_var) : std::nullopt;
  int node_size = e.world_size;
  if (local_size) {
    node_size = parse_nonnegative_int(*local_size, local_size_var);
    if (node_size < 1 || node_size > e.world_size)
      throw error(errc::invalid_argument, std::string(local_size_var) + "=\"" + *local_size + "\" is outside [1, " +
                                              size_var + "=" + std::to_string(e.world_size) + "]");
  }
  if (local) {
    e.local_rank = parse_nonnegative_int(*local, local_var);
    if (e.local_rank >= node_size)
      throw error(errc::invalid_argument, std::string(local_var) + "=" + std::to_string(e.local_rank) +
                                              " is outside [0, " + (local_size ? local_size_var : size_var) + "=" +
                                              std::to_string(node_size) + ")");
  } else if (node_size < e.world_size) {
    throw error(errc::invalid_argument, std::string(local_size_var) + "=" + std::to_string(node_size) + " is below " +
                                            size_var + "=" + std::to_string(e.world_size) + " (several nodes) but " +
                                            local_var + " is not set: set it");
  } else {
    e.local_rank = e.rank;  // one node: the global rank is the local one
  }
  return e;
}

}  // namespace detail

/// This process's rank, world size and local rank (see the file comment for the variables).
/// Throws errc::invalid_argument for malformed values.
inline launch_env read_launch_env() {
  if (auto e = detail::read_launch_env("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun")) return *e;
  if (auto e = detail::read_launch_env("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE", "mpi"))
    return *e;
  // SLURM_NTASKS_PER_NODE can be a list such as "2(x3)": the local rank is checked against the world size only
  if (auto e = detail::read_launch_env("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "slurm", false))
    return *e;
  launch_env e;
  e.source = "none";
  return e;
}

}  // namespace ringzero
