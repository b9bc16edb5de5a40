#pragma once
/// Which launcher started this process, read from the variables each one sets, so that an
/// example started by `mpirun -np 2` without `--backend mpi` refuses instead of running two
/// complete, independent jobs. The variables are the launchers' documented ones: Open MPI's
/// OMPI_COMM_WORLD_SIZE, the PMI/PMIx size of MPICH's Hydra and others (PMI_SIZE), Slurm's
/// SLURM_STEP_NUM_TASKS (set by srun, not by a batch script) and torchrun's WORLD_SIZE together
/// with TORCHELASTIC_RUN_ID.
#include <cstdlib>
#include <optional>
#include <string>

namespace ringzero::examples {

/// A launcher that started this process as one of `processes` (> 1) processes.
struct launcher_info {
  std::string name;  // "mpirun (Open MPI)", "mpiexec (PMI)", "srun (Slurm)", "torchrun"
  long processes = 0;
};

/// The launcher that started more than one process, if any; none for a plain start or a
/// launcher that started this process alone. Reads the environment only; never throws.
inline std::optional<launcher_info> detect_launcher() {
  const auto size_of = [](const char* variable) -> long {
    const char* text = std::getenv(variable);
    if (text == nullptr || *text == '\0') return 0;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    return *end == '\0' ? value : 0;
  };
  if (const long n = size_of("OMPI_COMM_WORLD_SIZE"); n > 1) return launcher_info{"mpirun (Open MPI)", n};
  if (const long n = size_of("PMI_SIZE"); n > 1) return launcher_info{"mpiexec (PMI)", n};
  if (const long n = size_of("SLURM_STEP_NUM_TASKS"); n > 1) return launcher_info{"srun (Slurm)", n};
  if (std::getenv("TORCHELASTIC_RUN_ID") != nullptr)
    if (const long n = size_of("WORLD_SIZE"); n > 1) return launcher_info{"torchrun", n};
  return std::nullopt;
}

/// The refusal for a process that `launcher` started as one of several while the example runs
/// all its ranks itself (`--backend local`); empty when there is nothing to refuse.
/// `mpi_flag` is how this example asks for one rank per MPI process ("" when it has no MPI
/// backend), `nccl_flag` how it asks for one rank per process and GPU ("" when it has no NCCL
/// backend).
inline std::string launcher_refusal(const std::optional<launcher_info>& launcher, const std::string& program,
                                    const std::string& mpi_flag, const std::string& nccl_flag = "") {
  if (!launcher) return {};
  std::string text = program + ": started by " + launcher->name + " as one of " + std::to_string(launcher->processes) +
                     " processes, but it runs every rank itself (threads of one process, --ranks N), so each process "
                     "would run a complete, separate job. ";
  if (launcher->name == "torchrun" || mpi_flag.empty())
    text += "Start it once, without the launcher, with --ranks " + std::to_string(launcher->processes) + ".";
  else
    text += "Pass " + mpi_flag + " for one rank per process, or start it once with --ranks " +
            std::to_string(launcher->processes) + ".";
  if (!nccl_flag.empty()) text += " On GPUs, pass " + nccl_flag + " for one rank per process and GPU.";
  return text;
}

}  // namespace ringzero::examples
