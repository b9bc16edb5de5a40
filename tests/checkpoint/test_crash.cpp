// Case C21: a save killed (SIGKILL) at any point while writing. A child process saves a large
// checkpoint (2 ranks, stage 3, AdamW: 48 MiB of state) and is killed after a random delay
// within the save's duration, many times. After every kill, `latest` names a complete
// checkpoint that loads and verifies (the previous one, or the new one when the save finished),
// the previous checkpoint is still whole, and no partial checkpoint is ever taken as complete.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <chrono>
#include <random>
#include <thread>

#include <doctest/doctest.h>

#include "checkpoint_test_util.hpp"

using namespace ckpt_test;
namespace ck = ringzero::checkpoint;

namespace {

// Kills per run and floats per parameter: fewer and smaller in the quick sweep of the sanitizer
// builds (each child there is slow; a save of 4 x 256 Ki floats still takes many writes).
#ifdef RINGZERO_TEST_SWEEP_QUICK
constexpr int kills = 6;
constexpr std::uint64_t big = std::uint64_t{1} << 18;
#else
constexpr int kills = 12;
constexpr std::uint64_t big = std::uint64_t{1} << 20;
#endif

std::vector<parameter_spec> big_parameters() {
  using zero_test::make_spec;
  return {make_spec("p0", {big}, "a"), make_spec("p1", {big}, "a"), make_spec("p2", {big / 1024, 1024}, "b"),
          make_spec("p3", {big}, "b")};
}

float value(int iteration, std::size_t p, std::uint64_t j) {
  return static_cast<float>(iteration) + static_cast<float>(p) * 0.25f + static_cast<float>(j % 1024) / 2048.0f;
}

/// The child: builds the model for `iteration`, tells the parent through `fd` that the save
/// starts, saves "ckpt-<iteration>" (keep_last 2), exits.
[[noreturn]] void child(const fs::path& root, int iteration, int fd) {
  int code = 0;
  try {
    local::launch(2, [&](communicator& comm) {
      sharded_model m(comm, request(big_parameters(), 3), model_options(adamw()));
      for (std::size_t p = 0; p < m.parameter_count(); ++p) {
        std::vector<float> v(big);
        for (std::uint64_t j = 0; j < big; ++j) v[j] = value(iteration, p, j);
        m.set_parameter(p, v);
      }
      ck::training_progress progress;
      progress.epoch = static_cast<std::uint64_t>(iteration);
      ck::checkpointer ckpt(root, {2});
      char go = 'R';
      if (comm.rank() == 0 && ::write(fd, &go, 1) != 1) code = 3;
      ckpt.save(m, progress, "ckpt-" + std::to_string(1000 + iteration));
    });
  } catch (...) { code = 2; }
  ::_exit(code);
}

/// Forks a child saving `iteration`; kills it `delay` after it starts saving (never, when
/// negative). Returns how long it ran after the start signal (until exit or kill).
double run_child(const fs::path& root, int iteration, double delay) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    child(root, iteration, fds[1]);
  }
  ::close(fds[1]);
  char go = 0;
  const bool started = ::read(fds[0], &go, 1) == 1;
  ::close(fds[0]);
  const auto t0 = std::chrono::steady_clock::now();
  if (started && delay >= 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (delay < 0) {
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The iteration whose values the checkpoint `dir` holds (checked on every element of p2, all
/// chunks verified).
int check_complete(const fs::path& dir) {
  const auto index = ck::read_index(dir);
  const int iteration = static_cast<int>(index.progress.epoch);
  const auto tensors = full_tensors(dir);
  const auto& p2 = tensors.at("p2#parameter");
  REQUIRE(p2.size() == big * 4);
  const float* v = reinterpret_cast<const float*>(p2.data());
  bool all = true;
  for (std::uint64_t j = 0; j < big; ++j) all = all && v[j] == value(iteration, 2, j);
  CHECK(all);
  return iteration;
}

}  // namespace

TEST_CASE(
    "C21: a save killed at random points never damages the previous checkpoint, and latest always names a complete "
    "one") {
  scratch_dir root("crash");
  const double duration = run_child(root.path, 0, -1);  // the first checkpoint, complete
  CHECK(check_complete(ck::resolve_checkpoint(root.path)) == 0);
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> when(0.0, 2.5 * duration);
  int previous = 0, interrupted = 0;
  for (int iteration = 1; iteration <= kills; ++iteration) {
    CAPTURE(iteration);
    run_child(root.path, iteration, iteration == 1 ? 0.0 : when(rng));  // the first kill at once: surely mid-save
    // latest names a complete checkpoint: the previous one, or this one if the save finished.
    const fs::path latest = ck::resolve_checkpoint(root.path);
    const int named = check_complete(latest);
    CHECK((named == previous || named == iteration));
    // An interrupted save leaves the previous checkpoint whole. A save that completed may have
    // retired it (keep_last 2 keeps the two newest complete checkpoints, and a save killed
    // between its directory's rename and latest's leaves a complete, newer one that counts; a
    // save killed during that clean-up leaves more): then the new one is among the complete
    // ones, which all verify below.
    if (named == previous) {
      CHECK(check_complete(root.path / ("ckpt-" + std::to_string(1000 + previous))) == previous);
    } else {
      const std::vector<std::string> kept = ck::complete_checkpoints(root.path);
      CHECK(std::find(kept.begin(), kept.end(), "ckpt-" + std::to_string(1000 + iteration)) != kept.end());
    }
    // Every directory taken as complete verifies; partial ones only ever live in .tmp.* names.
    for (const std::string& name : ck::complete_checkpoints(root.path)) {
      const auto index = ck::read_index(root.path / name);
      ck::fragment_reader reader(root.path / name, index);
      CHECK_NOTHROW(reader.verify_all());
    }
    if (named == previous) ++interrupted;
    previous = named;
  }
  MESSAGE("saves interrupted before completion: " << interrupted << " of " << kills << " (first save took " << duration
                                                  << " s)");
  CHECK(interrupted >= 1);
  // A model loads the newest complete checkpoint after all of that.
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(big_parameters(), 2), model_options(adamw()));
    const auto progress = ck::load(m, root.path);
    CHECK(static_cast<int>(progress.epoch) == previous);
  });
}

TEST_CASE("a job killed during its first save: --resume finds the complete checkpoint or says there is none") {
  // No previous checkpoint and no `latest` yet: a kill between the new directory's rename and the
  // first `latest` leaves a complete checkpoint without a pointer, which find_checkpoint takes;
  // a kill before the rename leaves only a .tmp.* directory, never taken.
  std::mt19937_64 rng(777);
  scratch_dir timing("first-save-timing");
  const double duration = run_child(timing.path, 0, -1);
  std::uniform_real_distribution<double> when(0.0, 1.2 * duration);
  for (int trial = 0; trial < kills / 2; ++trial) {
    CAPTURE(trial);
    scratch_dir root("first-save");
    run_child(root.path, 1, trial == 0 ? 0.0 : when(rng));
    std::string refusal;
    try {
      const ck::found_checkpoint found = ck::find_checkpoint(root.path);
      CHECK(check_complete(found.directory) == 1);
      CHECK((found.note.empty() == fs::exists(root.path / "latest")));
    } catch (const error& e) { refusal = e.what(); }
    if (!refusal.empty()) {
      CHECK(refusal.find("holds no complete checkpoint") != std::string::npos);
      CHECK(ck::complete_checkpoints(root.path).empty());
    }
    // The next job takes the root over: the dead job's lock is free, its leftovers removed.
    run_child(root.path, 2, -1);
    CHECK(check_complete(ck::resolve_checkpoint(root.path)) == 2);
    for (const auto& e : fs::directory_iterator(root.path)) CHECK(!e.path().filename().string().starts_with(".tmp."));
  }
}
