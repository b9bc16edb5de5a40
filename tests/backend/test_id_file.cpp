// backend/nccl/id_file.hpp: the unique-id exchange through a shared file, run with threads as
// ranks (the id is plain bytes, so no GPU or NCCL is needed): every rank gets rank 0's id, files
// of another job or world size are ignored, files whose writer has exited are ignored, and a
// missing file ends in a timeout that says why.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ringzero/backend/nccl/id_file.hpp"

using namespace ringzero;
using namespace std::chrono_literals;

namespace {

std::string temp_path(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/ringzero-test-" + name + "-" + std::to_string(std::random_device{}());
}

nccl::id_bytes random_id(std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  nccl::id_bytes id{};
  for (auto& b : id) b = static_cast<unsigned char>(gen());
  return id;
}

}  // namespace

TEST_CASE("every rank receives rank 0's id, whoever starts first") {
  for (int world : {1, 2, 5}) {
    const std::string path = temp_path("exchange");
    const nccl::id_bytes expected = random_id(static_cast<std::uint64_t>(world));
    std::vector<nccl::id_bytes> got(static_cast<std::size_t>(world));
    std::vector<std::thread> ranks;
    for (int r = world - 1; r >= 0; --r)  // readers start before the writer
      ranks.emplace_back([&, r] {
        if (r == 0) std::this_thread::sleep_for(20ms);
        got[static_cast<std::size_t>(r)] = nccl::exchange_id_through_file(
            path, r, world, [&] { return expected; }, 10s, "job-42");
      });
    for (auto& t : ranks) t.join();
    for (const auto& id : got) CHECK(id == expected);
    nccl::remove_id_file(path);
    CHECK(!std::ifstream(path));
  }
}

TEST_CASE("files of another job or world size are ignored; a timeout says what it found") {
  const std::string path = temp_path("stale");
  nccl::publish_id_file(path, random_id(1), 4, "old-job");
  try {
    (void)nccl::read_id_file(path, 4, 0.2s, "new-job");
    FAIL("a stale id was accepted");
  } catch (const error& e) {
    CHECK(e.kind() == errc::timeout);
    const std::string what = e.what();
    CHECK(what.find("stale") != std::string::npos);
    CHECK(what.find("old-job") != std::string::npos);
  }
  nccl::publish_id_file(path, random_id(2), 3, "new-job");
  CHECK_THROWS_AS((void)nccl::read_id_file(path, 4, 0.1s, "new-job"), error);
  // The right file replaces the stale one while a reader waits.
  const nccl::id_bytes fresh = random_id(3);
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    nccl::publish_id_file(path, fresh, 4, "new-job");
  });
  CHECK(nccl::read_id_file(path, 4, 10s, "new-job") == fresh);
  writer.join();
  nccl::remove_id_file(path);
}

#if defined(__linux__)
namespace {

/// Writes an id file line naming `writer` directly (as another process would have).
void write_line(const std::string& path, const nccl::id_bytes& id, int world, const std::string& job,
                const std::string& writer) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << nccl::detail::id_file_line(id, world, job, writer);
}

/// A child process that has exited: its pid and start time (clock ticks after boot); reaped
/// (its pid is free) unless `reap` is false (then a zombie until `reap_child`).
std::pair<long, unsigned long long> exited_child(bool reap) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  unsigned long long start = 0;
  bool zombie = false;
  for (int i = 0; i < 2000 && !(nccl::detail::process_start(child, start, zombie) && zombie); ++i)
    std::this_thread::sleep_for(1ms);
  REQUIRE(zombie);
  if (reap) REQUIRE(::waitpid(child, nullptr, 0) == child);
  return {static_cast<long>(child), start};
}

}  // namespace

TEST_CASE("a file whose writer has exited is stale, even of the same job; a running or unknown writer is taken") {
  const std::string path = temp_path("writer");
  const std::string where = nccl::detail::this_machine_and_namespace();
  REQUIRE(!where.empty());
  const nccl::id_bytes id = random_id(11);

  SUBCASE("this process's own file names it and is taken") {
    nccl::publish_id_file(path, id, 2, "job");
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto c = nccl::detail::parse_id_file(text);
    REQUIRE(c.ok);
    CHECK(c.writer == nccl::detail::this_process_writer());
    CHECK(c.writer.rfind(where + "/" + std::to_string(::getpid()) + "/", 0) == 0);
    CHECK(nccl::detail::judge_writer(c.writer) == nccl::detail::writer_state::running);
    CHECK(nccl::read_id_file(path, 2, 1s, "job") == id);
  }
  SUBCASE("an exited writer's file is skipped until this job's rank 0 replaces it") {
    const auto [pid, start] = exited_child(true);
    write_line(path, random_id(12), 2, "job", where + "/" + std::to_string(pid) + "/" + std::to_string(start));
    try {
      (void)nccl::read_id_file(path, 2, 0.2s, "job");
      FAIL("the id of an exited writer was taken");
    } catch (const error& e) {
      CHECK(e.kind() == errc::timeout);
      const std::string what = e.what();
      CHECK(what.find("written by process " + std::to_string(pid) + " on this machine, which has exited") !=
            std::string::npos);
    }
    std::thread rank0([&] {
      std::this_thread::sleep_for(50ms);
      nccl::publish_id_file(path, id, 2, "job");
    });
    CHECK(nccl::read_id_file(path, 2, 10s, "job") == id);
    rank0.join();
  }
  SUBCASE("a zombie writer has exited") {
    const auto [pid, start] = exited_child(false);
    write_line(path, random_id(13), 2, "-", where + "/" + std::to_string(pid) + "/" + std::to_string(start));
    CHECK_THROWS_AS((void)nccl::read_id_file(path, 2, 0.05s, ""), error);
    CHECK(::waitpid(static_cast<pid_t>(pid), nullptr, 0) == pid);
  }
  SUBCASE("a pid now used by a process started at another time is a different writer") {
    unsigned long long start = 0;
    bool zombie = true;
    REQUIRE(nccl::detail::process_start(::getpid(), start, zombie));
    CHECK(!zombie);
    write_line(path, random_id(14), 2, "-", where + "/" + std::to_string(::getpid()) + "/" + std::to_string(start + 1));
    CHECK_THROWS_AS((void)nccl::read_id_file(path, 2, 0.05s, ""), error);
    write_line(path, id, 2, "-", where + "/" + std::to_string(::getpid()) + "/" + std::to_string(start));
    CHECK(nccl::read_id_file(path, 2, 1s, "") == id);
  }
  SUBCASE("writers on another machine, boot or PID namespace, malformed fields and files without one are taken") {
    const auto [pid, start] = exited_child(true);
    const std::string dead = "/" + std::to_string(pid) + "/" + std::to_string(start);
    const std::size_t slash = where.find('/');
    for (const std::string& writer :
         {std::string("00000000-0000-0000-0000-000000000000") + where.substr(slash) + dead,  // another boot or machine
          where.substr(0, slash) + "/1" + dead,                                              // another PID namespace
          where + "/" + std::to_string(pid) + "/x", where + "/-5/1", where + dead + "/", std::string("garbage"),
          std::string()}) {
      CAPTURE(writer);
      write_line(path, id, 2, "-", writer);
      CHECK(nccl::read_id_file(path, 2, 1s, "") == id);
    }
  }
  nccl::remove_id_file(path);
}
#endif

TEST_CASE("a missing file and a malformed file time out with a clear message") {
  const std::string path = temp_path("missing");
  try {
    (void)nccl::read_id_file(path, 2, 0.05s, "");
    FAIL("no timeout");
  } catch (const error& e) {
    CHECK(e.kind() == errc::timeout);
    CHECK(std::string(e.what()).find("never appeared") != std::string::npos);
  }
  { std::ofstream(path) << "ringzero-nccl-id 1 world_size=2 job=- id=00zz\n"; }
  CHECK_THROWS_AS((void)nccl::read_id_file(path, 2, 0.05s, ""), error);
  nccl::remove_id_file(path);
  CHECK_THROWS_AS(nccl::publish_id_file("/nonexistent-dir/ringzero/id", random_id(4), 2, ""), error);
}

TEST_CASE("a reading rank says when the file's directory is missing, and fails at once on an unreadable file") {
  try {
    (void)nccl::read_id_file("/nonexistent-dir/ringzero/id", 2, 0.05s, "");
    FAIL("no timeout");
  } catch (const error& e) {
    CHECK(e.kind() == errc::timeout);
    CHECK(std::string(e.what()).find(
              "never appeared; its directory /nonexistent-dir/ringzero: No such file or directory") !=
          std::string::npos);
  }
  if (::geteuid() == 0) {
    MESSAGE("running as root: every file is readable, the unreadable-file case is not checked");
    return;
  }
  const std::string path = temp_path("unreadable");
  nccl::publish_id_file(path, random_id(5), 2, "");
  REQUIRE(::chmod(path.c_str(), 0) == 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)nccl::read_id_file(path, 2, 30s, "");
    FAIL("an unreadable file was read");
  } catch (const error& e) {
    CHECK(e.kind() == errc::io_error);
    CHECK(std::string(e.what()).find("Permission denied") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // not the 30 s timeout
  nccl::remove_id_file(path);
}

TEST_CASE("a file that is not an id file is named as such; paths that are not regular files fail at once") {
  const std::string path = temp_path("garbage");
  for (const std::string& text :
       {std::string("hello world\n"), std::string("ringzero-nccl-id 1 world_size=99999999999 job=- id=00\n"),
        std::string(300, '\x01'), std::string()}) {
    { std::ofstream(path, std::ios::binary) << text; }
    try {
      (void)nccl::read_id_file(path, 2, 0.05s, "");
      FAIL("no timeout");
    } catch (const error& e) {
      CHECK(e.kind() == errc::timeout);
      const std::string what = e.what();
      CHECK(what.find(text.empty() ? "is empty" : "is not an id file") != std::string::npos);
      CHECK(what.find("never appeared") == std::string::npos);
    }
  }
  nccl::remove_id_file(path);
  // A directory, /dev/zero and a FIFO: none can hold an id, and reading /dev/zero or opening a
  // FIFO would never end.
  const std::string fifo = temp_path("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& p : {std::string("/tmp"), std::string("/dev/zero"), fifo}) {
    CAPTURE(p);
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)nccl::read_id_file(p, 2, 30s, "");
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.kind() == errc::io_error);
      CHECK(std::string(e.what()).find("not a regular file") != std::string::npos);
    }
    CHECK(std::chrono::steady_clock::now() - start < 10s);
  }
  std::remove(fifo.c_str());
}

TEST_CASE("timeouts: NaN is rejected, infinity and huge values wait, zero and negative poll once") {
  const std::string path = temp_path("timeouts");
  CHECK_THROWS_WITH_AS((void)nccl::read_id_file(path, 2, std::chrono::duration<double>(std::nan("")), ""),
                       doctest::Contains("NaN"), error);
  for (double seconds : {0.0, -1.0, -HUGE_VAL}) {
    CAPTURE(seconds);
    CHECK_THROWS_WITH_AS((void)nccl::read_id_file(path, 2, std::chrono::duration<double>(seconds), ""),
                         doctest::Contains("never appeared"), error);
  }
  for (double seconds : {1e300, HUGE_VAL}) {  // waits until the file appears
    CAPTURE(seconds);
    const nccl::id_bytes id = random_id(7);
    std::thread writer([&] {
      std::this_thread::sleep_for(100ms);
      nccl::publish_id_file(path, id, 2, "");
    });
    CHECK(nccl::read_id_file(path, 2, std::chrono::duration<double>(seconds), "") == id);
    writer.join();
    nccl::remove_id_file(path);
  }
}

TEST_CASE("threads of one process may publish to one path at the same time") {
  const std::string path = temp_path("writers");
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t)
    writers.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) try {
          nccl::publish_id_file(path, random_id(static_cast<std::uint64_t>(t)), 2, "");
        } catch (const error&) { ++failures; }
    });
  for (auto& w : writers) w.join();
  CHECK(failures.load() == 0);
  bool one_of_ours = false;
  const nccl::id_bytes got = nccl::read_id_file(path, 2, 1s, "");
  for (std::uint64_t t = 0; t < 8; ++t) one_of_ours = one_of_ours || got == random_id(t);
  CHECK(one_of_ours);
  nccl::remove_id_file(path);
}

TEST_CASE("the job token: torchrun's default \"none\" is no job; a token with spaces or \"-\" is rejected by name") {
  ::unsetenv("RINGZERO_JOB_ID");
  ::unsetenv("SLURM_JOB_ID");
  ::unsetenv("OMPI_MCA_ess_base_jobid");
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);
  CHECK(nccl::job_token_from_env().empty());
  ::setenv("TORCHELASTIC_RUN_ID", "run-7", 1);
  CHECK(nccl::job_token_from_env() == "run-7");
  ::unsetenv("TORCHELASTIC_RUN_ID");
  const std::string long_token(nccl::max_job_token_bytes + 1, 'j');
  for (const char* bad : {"my job", "-", "a\tb", long_token.c_str()}) {
    ::setenv("RINGZERO_JOB_ID", bad, 1);
    CHECK_THROWS_WITH_AS((void)nccl::job_token_from_env(), doctest::Contains("RINGZERO_JOB_ID"), error);
  }
  // the longest token still makes a file its readers accept
  const std::string path = temp_path("long-job");
  const std::string longest(nccl::max_job_token_bytes, 'j');
  nccl::publish_id_file(path, random_id(9), 3, longest);
  CHECK(nccl::read_id_file(path, 3, 1s, longest) == random_id(9));
  nccl::remove_id_file(path);
  ::unsetenv("RINGZERO_JOB_ID");
}
