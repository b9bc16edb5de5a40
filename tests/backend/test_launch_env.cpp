// backend/launch_env.hpp: torchrun's RANK / WORLD_SIZE / LOCAL_RANK first, then Open MPI's and
// Slurm's variables, a world of one without any, and clear errors for malformed values.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "ringzero/backend/launch_env.hpp"

using namespace ringzero;

namespace {

const char* const launcher_variables[] = {"RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "SLURM_PROCID",
                                          "SLURM_NTASKS",
                                          "SLURM_LOCALID"};
constexpr int launcher_variable_count = sizeof launcher_variables / sizeof launcher_variables[0];

/// Clears every launcher variable for the test's duration and restores them afterwards.
struct clean_environment {
  std::string saved[launcher_variable_count];
  bool had[launcher_variable_count] = {};
  clean_environment() {
    for (int i = 0; i < launcher_variable_count; ++i) {
      if (const char* v = std::getenv(launcher_variables[i])) {
        had[i] = true;
        saved[i] = v;
      }
      unsetenv(launcher_variables[i]);
    }
  }
  ~clean_environment() {
    for (int i = 0; i < launcher_variable_count; ++i) {
      if (had[i])
        setenv(launcher_variables[i], saved[i].c_str(), 1);
      else
        unsetenv(launcher_variables[i]);
    }
  }
};

errc error_of(auto&& f) {
  try {
    f();
  } catch (const error& e) { return e.kind(); }
  return errc::internal;
}

}  // namespace

TEST_CASE("no launcher variables: a world of one") {
  clean_environment env;
  const launch_env e = read_launch_env();
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.source == "none");
}

TEST_CASE("torchrun's variables win over Open MPI's and Slurm's") {
  clean_environment env;
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  launch_env e = read_launch_env();
  CHECK(e.source == "slurm");
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  e = read_launch_env();
  CHECK(e.source == "mpi");
  CHECK(e.rank == 2);
  CHECK(e.local_rank == 2);  // no local rank given: the global one (one node)
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "16", 1);
  setenv("LOCAL_RANK", "7", 1);
  e = read_launch_env();
  CHECK(e.source == "torchrun");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 16);
  CHECK(e.local_rank == 7);
}

TEST_CASE("malformed or inconsistent values are refused with the variable's name") {
  clean_environment env;
  setenv("RANK", "1", 1);
  CHECK(error_of([] { (void)read_launch_env(); }) == errc::invalid_argument);  // no WORLD_SIZE
  setenv("WORLD_SIZE", "2", 1);
  CHECK(read_launch_env().rank == 1);
  setenv("RANK", "2", 1);
  try {
    (void)read_launch_env();
    FAIL("rank outside the world accepted");
  } catch (const error& e) {
    CHECK(e.kind() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("RANK=2") != std::string::npos);
  }
  setenv("RANK", "one", 1);
  CHECK(error_of([] { (void)read_launch_env(); }) == errc::invalid_argument);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "0", 1);
  CHECK(error_of([] { (void)read_launch_env(); }) == errc::invalid_argument);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "-1", 1);
  CHECK(error_of([] { (void)read_launch_env(); }) == errc::invalid_argument);
}

TEST_CASE("numbers are plain decimal digits; the local rank must fit the world and the node") {
  clean_environment env;
  setenv("WORLD_SIZE", "4", 1);
  for (const char* text : {" 1", "+1", "1 ", "0x1", ""}) {
    CAPTURE(text);
    setenv("RANK", text, 1);
    if (*text == '\0')
      CHECK(error_of([] { (void)read_launch_env(); }) == errc::invalid_argument);  // empty: unset
    else
      CHECK_THROWS_WITH_AS((void)read_launch_env(), doctest::Contains("RANK="), error);
  }
  setenv("RANK", "1", 1);
  setenv("LOCAL_RANK", "4", 1);
  CHECK_THROWS_WITH_AS((void)read_launch_env(), doctest::Contains("LOCAL_RANK=4 is outside [0, WORLD_SIZE=4)"), error);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  CHECK(read_launch_env().local_rank == 1);
  setenv("LOCAL_RANK", "2", 1);
  CHECK_THROWS_WITH_AS((void)read_launch_env(), doctest::Contains("LOCAL_RANK=2 is outside [0, LOCAL_WORLD_SIZE=2)"),
                       error);
  setenv("LOCAL_WORLD_SIZE", "5", 1);
  CHECK_THROWS_WITH_AS((void)read_launch_env(), doctest::Contains("LOCAL_WORLD_SIZE=\"5\""), error);
  unsetenv("LOCAL_RANK");  // a node of 2 out of 4 processes, and no local rank: cannot be guessed
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  CHECK_THROWS_WITH_AS((void)read_launch_env(), doctest::Contains("LOCAL_RANK is not set"), error);
  setenv("LOCAL_WORLD_SIZE", "4", 1);  // one node: the global rank
  CHECK(read_launch_env().local_rank == 1);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  CHECK_THROWS_WITH_AS((void)read_launch_env(), doctest::Contains("OMPI_COMM_WORLD_LOCAL_RANK=1"), error);
}

TEST_CASE("a world size without a rank is refused (torchrun, Open MPI), tolerated for Slurm") {
  clean_environment env;
  for (const auto& [rank_var, size_var] :
       {std::pair{"RANK", "WORLD_SIZE"}, std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}}) {
    CAPTURE(size_var);
    setenv(size_var, "2", 1);
    for (const char* rank : {"", static_cast<const char*>(nullptr)}) {
      if (rank)
        setenv(rank_var, rank, 1);  // empty counts as unset
      else
        unsetenv(rank_var);
      try {
        (void)read_launch_env();
        FAIL("a world size of 2 without a rank was read as a world of one");
      } catch (const error& e) {
        CHECK(e.kind() == errc::invalid_argument);
        CHECK(std::string(e.what()).find(std::string(size_var) + "=\"2\" is set but " + rank_var + " is not") !=
              std::string::npos);
      }
    }
    unsetenv(size_var);
    unsetenv(rank_var);
  }
  setenv("SLURM_NTASKS", "4", 1);  // an salloc shell running one command
  const launch_env e = read_launch_env();
  CHECK(e.world_size == 1);
  CHECK(e.source == "none");
}
