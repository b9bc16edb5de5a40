// backend/tcp_rendezvous.hpp: torchrun's MASTER_ADDR / MASTER_PORT start-up exchange on
// loopback, without a GPU: every rank receives rank 0's bytes (threads as ranks, and 4
// processes reading their variables as torchrun sets them), and each fault ends in a clear
// error on every rank within the timeout: nobody listening, a rank that never comes, a port in
// use, two jobs on one port, ranks that disagree on the world size, a foreign program on either
// side, a payload rank 0 cannot make, and malformed variables.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ringzero/backend/launch_env.hpp"
#include "ringzero/backend/nccl/id_file.hpp"
#include "ringzero/backend/tcp_rendezvous.hpp"

using namespace ringzero;
using namespace std::chrono_literals;

namespace {

/// A port nobody listens on right now (the kernel's pick for port 0, released again).
int rdv_free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(s);
  return ntohs(a.sin_port);
}

/// A plain listening socket on loopback port `port` (a program other than ringzero).
int rdv_listen(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, 4) == 0);
  return s;
}

std::string rdv_payload(unsigned seed, std::size_t size = 128) {
  std::mt19937 gen(seed);
  std::string p(size, '\0');
  for (auto& c : p) c = static_cast<char>(gen());
  return p;
}

/// What one rank's call ended in: the bytes, or the error's code and text.
struct rdv_outcome {
  std::string bytes;
  bool failed = false;
  errc kind = errc::internal;
  std::string what;
};

rdv_outcome rdv_call(const rendezvous_address& where, int rank, int world, const std::string& job,
                     const std::string& payload, std::chrono::duration<double> timeout) {
  rdv_outcome o;
  try {
    o.bytes = tcp_rendezvous(
        where, rank, world, job, [&] { return payload; }, timeout);
  } catch (const error& e) {
    o.failed = true;
    o.kind = e.kind();
    o.what = e.what();
  }
  return o;
}

/// Ranks `ranks` of a world of `world` as threads, rank 0 started last.
std::vector<rdv_outcome> rdv_run(const rendezvous_address& where, const std::vector<int>& ranks, int world,
                                 const std::string& payload, std::chrono::duration<double> timeout) {
  std::vector<rdv_outcome> out(ranks.size());
  std::vector<std::thread> threads;
  for (std::size_t i = ranks.size(); i-- > 0;)
    threads.emplace_back([&, i] {
      if (ranks[i] == 0) std::this_thread::sleep_for(30ms);  // the others knock before anyone listens
      out[i] = rdv_call(where, ranks[i], world, "", payload, timeout);
    });
  for (auto& t : threads) t.join();
  return out;
}

bool rdv_contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("every rank receives rank 0's bytes, whoever starts first") {
  for (int world : {1, 2, 4, 9}) {
    CAPTURE(world);
    const rendezvous_address where{"127.0.0.1", rdv_free_port()};
    const std::string payload = rdv_payload(static_cast<unsigned>(world), world == 9 ? 100000 : 128);
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(r);
    for (const auto& o : rdv_run(where, ranks, world, payload, 20s)) {
      CHECK_MESSAGE(!o.failed, o.what);
      CHECK(o.bytes == payload);
    }
  }
}

TEST_CASE("four processes with torchrun's variables on loopback get rank 0's bytes") {
  for (const char* host : {"127.0.0.1", "localhost"}) {
    CAPTURE(host);
    const int port = rdv_free_port();
    const std::string payload = rdv_payload(7);
    constexpr int world = 4;
    std::vector<pid_t> children;
    std::vector<int> pipes;
    for (int r = world - 1; r >= 0; --r) {
      int fds[2];
      REQUIRE(::pipe(fds) == 0);
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {  // a launched process: only its environment says who it is
        ::close(fds[0]);
        ::setenv("RANK", std::to_string(r).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        ::setenv("MASTER_ADDR", host, 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        ::setenv("RINGZERO_JOB_ID", "job-rdv", 1);
        std::string answer;
        try {
          const launch_env env = read_launch_env();
          const auto where = rendezvous_address_from_env();
          answer = "ok " + std::to_string(env.rank) + " " +
                   tcp_rendezvous(
                       *where, env.rank, env.world_size, nccl::job_token_from_env(), [&] { return payload; }, 20s);
        } catch (const std::exception& e) { answer = std::string("error ") + e.what(); }
        const ssize_t written = ::write(fds[1], answer.data(), answer.size());
        ::_exit(written == static_cast<ssize_t>(answer.size()) ? 0 : 1);
      }
      ::close(fds[1]);
      children.push_back(child);
      pipes.push_back(fds[0]);
    }
    for (std::size_t i = 0; i < children.size(); ++i) {
      std::string got;
      char buffer[4096];
      for (ssize_t n; (n = ::read(pipes[i], buffer, sizeof buffer)) > 0;)
        got.append(buffer, static_cast<std::size_t>(n));
      ::close(pipes[i]);
      int status = 0;
      REQUIRE(::waitpid(children[i], &status, 0) == children[i]);
      CHECK(WIFEXITED(status));
      const int rank = world - 1 - static_cast<int>(i);
      CHECK(got == "ok " + std::to_string(rank) + " " + payload);
    }
  }
}

TEST_CASE("nobody listening: a timeout naming the address, on the rank that waited") {
  const int port = rdv_free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const auto o = rdv_call({"127.0.0.1", port}, 1, 2, "", "", 0.5s);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(o.failed);
  CHECK(o.kind == errc::timeout);
  CHECK(rdv_contains(o.what,
                     "ringzero [rank 1/2]: nobody accepted a connection at MASTER_ADDR:MASTER_PORT = "
                     "127.0.0.1:" +
                         std::to_string(port) + " within 0.5"));
  CHECK(waited >= 0.45);
  CHECK(waited < 10.0);
}

TEST_CASE("within the timeout and its margin: a listener that never answers, a world size far too large") {
  const int port = rdv_free_port();
  const int listener = rdv_listen(port);  // accepted by the kernel, answered by nobody
  auto t0 = std::chrono::steady_clock::now();
  const auto silent = rdv_call({"127.0.0.1", port}, 1, 2, "", "", 0.3s);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(listener);
  REQUIRE(silent.failed);
  CHECK(silent.kind == errc::timeout);
  CHECK(rdv_contains(silent.what, "connected to 127.0.0.1:" + std::to_string(port) + " but got no answer within "));
  CHECK(waited < 2.0);  // 0.3 s and its margin of 0.3 s (5.3 s before the margin was bounded)

  t0 = std::chrono::steady_clock::now();
  const auto huge = rdv_call({"127.0.0.1", rdv_free_port()}, 0, 2147483647, "", "x", 0.3s);
  waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(huge.failed);
  CHECK(huge.kind == errc::timeout);
  CHECK(rdv_contains(huge.what,
                     "missing rank(s): 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, ... "
                     "(2147483646 in all)"));
  CHECK(waited < 2.0);  // 4.5 s before the missing ranks were listed in linear time
}

TEST_CASE("a rank that never comes: every rank that came names it") {
  const rendezvous_address where{"127.0.0.1", rdv_free_port()};
  const auto out = rdv_run(where, {0, 1, 2}, 4, rdv_payload(3), 1s);  // rank 3 never starts
  for (std::size_t i = 0; i < out.size(); ++i) {
    CAPTURE(i);
    REQUIRE(out[i].failed);
    CHECK(out[i].kind == errc::timeout);
    CHECK(rdv_contains(out[i].what,
                       "only 3 of 4 ranks reached rank 0 at port " + std::to_string(where.port) + " within 1.0"));
    CHECK(rdv_contains(out[i].what, "missing rank(s): 3 ("));
  }
  CHECK(rdv_contains(out[0].what, "ringzero [rank 0/4]: only 3 of 4"));
  CHECK(rdv_contains(out[1].what, "ringzero [rank 1/4]: rank 0 at 127.0.0.1:" + std::to_string(where.port) + ": only"));
}

TEST_CASE("two jobs on one port: the second rank 0 is refused, ranks of another job are turned away") {
  const rendezvous_address where{"127.0.0.1", rdv_free_port()};
  const std::string payload = rdv_payload(5);
  rdv_outcome first_zero, first_one, other_zero, other_one;
  std::thread zero([&] { first_zero = rdv_call(where, 0, 2, "job-a", payload, 10s); });
  std::this_thread::sleep_for(200ms);  // job a's rank 0 listens
  other_zero = rdv_call(where, 0, 2, "job-b", rdv_payload(6), 2s);
  other_one = rdv_call(where, 1, 2, "job-b", "", 2s);
  first_one = rdv_call(where, 1, 2, "job-a", "", 10s);
  zero.join();
  REQUIRE(other_zero.failed);
  CHECK(other_zero.kind == errc::invalid_argument);
  CHECK(rdv_contains(other_zero.what,
                     "ringzero [rank 0/2]: MASTER_PORT=" + std::to_string(where.port) + " is in use on this host"));
  REQUIRE(other_one.failed);
  CHECK(other_one.kind == errc::invalid_argument);
  CHECK(rdv_contains(other_one.what, "rank 1 of job \"job-b\" reached rank 0 of job \"job-a\""));
  CHECK_MESSAGE(!first_zero.failed, first_zero.what);
  CHECK_MESSAGE(!first_one.failed, first_one.what);
  CHECK(first_one.bytes == payload);
}

TEST_CASE("a rank that joins twice (two jobs without ids) fails every rank that joined") {
  const rendezvous_address where{"127.0.0.1", rdv_free_port()};
  rdv_outcome zero, one, again;
  std::thread z([&] { zero = rdv_call(where, 0, 3, "", rdv_payload(8), 10s); });
  std::thread o([&] { one = rdv_call(where, 1, 3, "", "", 10s); });
  std::this_thread::sleep_for(300ms);
  again = rdv_call(where, 1, 3, "", "", 10s);
  z.join();
  o.join();
  for (const auto* r : {&zero, &one, &again}) {
    REQUIRE(r->failed);
    CHECK(r->kind == errc::invalid_argument);
    CHECK(rdv_contains(r->what, "rank 1 joined twice (from 127.0.0.1:"));
  }
}

TEST_CASE("ranks that disagree on the world size fail together, naming both sizes") {
  const rendezvous_address where{"127.0.0.1", rdv_free_port()};
  rdv_outcome zero, one;
  std::thread z([&] { zero = rdv_call(where, 0, 2, "", rdv_payload(9), 10s); });
  one = rdv_call(where, 1, 3, "", "", 10s);
  z.join();
  for (const auto* r : {&zero, &one}) {
    REQUIRE(r->failed);
    CHECK(r->kind == errc::invalid_argument);
    CHECK(rdv_contains(r->what, "ranks disagree on WORLD_SIZE: rank 0: 2; rank 1 (from 127.0.0.1:"));
    CHECK(rdv_contains(r->what, "): 3"));
  }
}

TEST_CASE("ranks that say hello just after the world sizes disagreed are told the same, not left at a closed port") {
  // Four ranks: rank 2 says WORLD_SIZE 3 first and has its answer (rank 0 has failed the job)
  // before ranks 1 and 3 start: every rank gets the same error, none a closed connection.
  const rendezvous_address where{"127.0.0.1", rdv_free_port()};
  rdv_outcome zero, one, two, three;
  std::thread z([&] { zero = rdv_call(where, 0, 4, "", rdv_payload(9), 10s); });
  two = rdv_call(where, 2, 3, "", "", 10s);
  std::thread o([&] { one = rdv_call(where, 1, 4, "", "", 10s); });
  three = rdv_call(where, 3, 4, "", "", 10s);
  for (std::thread* th : {&z, &o}) th->join();
  for (const auto* r : {&zero, &one, &two, &three}) {
    REQUIRE(r->failed);
    CHECK(r->kind == errc::invalid_argument);
    CHECK_MESSAGE(rdv_contains(r->what, "ranks disagree on WORLD_SIZE: rank 0: 4; rank 2 (from 127.0.0.1:"), r->what);
  }
}

TEST_CASE("rank 0 that cannot make its payload tells every rank why") {
  const rendezvous_address where{"127.0.0.1", rdv_free_port()};
  std::string what_one;
  std::thread o([&] {
    try {
      (void)tcp_rendezvous(
          where, 1, 2, "", [] { return std::string(); }, 10s);
    } catch (const error& e) {
      CHECK(e.kind() == errc::backend_failure);
      what_one = e.what();
    }
  });
  std::string what_zero;
  try {
    (void)tcp_rendezvous(
        where, 0, 2, "", []() -> std::string { throw std::runtime_error("no NCCL here"); }, 10s);
  } catch (const error& e) {
    CHECK(e.kind() == errc::backend_failure);
    what_zero = e.what();
  }
  o.join();
  CHECK(rdv_contains(what_zero, "ringzero [rank 0/2]: rank 0 could not make its payload: no NCCL here"));
  CHECK(rdv_contains(what_one, "ringzero [rank 1/2]: rank 0 at 127.0.0.1:"));
  CHECK(rdv_contains(what_one, "rank 0 could not make its payload: no NCCL here"));
}

TEST_CASE("a foreign program on either side: turned away by rank 0, named by a joining rank") {
  SUBCASE("a client that speaks something else does not disturb the exchange") {
    const rendezvous_address where{"127.0.0.1", rdv_free_port()};
    const std::string payload = rdv_payload(10);
    rdv_outcome zero;
    std::thread z([&] { zero = rdv_call(where, 0, 2, "", payload, 10s); });
    std::this_thread::sleep_for(200ms);
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(where.port));
    REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const std::string probe = "GET / HTTP/1.0\r\n\r\n";
    REQUIRE(::send(s, probe.data(), probe.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(probe.size()));
    std::string answer;
    char buffer[512];
    for (ssize_t n; (n = ::recv(s, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, static_cast<std::size_t>(n));
    ::close(s);
    CHECK(rdv_contains(answer, "is a ringzero rendezvous; this connection from 127.0.0.1:"));
    const auto one = rdv_call(where, 1, 2, "", "", 10s);
    z.join();
    CHECK_MESSAGE(!zero.failed, zero.what);
    CHECK(one.bytes == payload);
  }
  SUBCASE("a server that answers something else") {
    const int port = rdv_free_port();
    const int listener = rdv_listen(port);
    std::thread server([&] {
      const int c = ::accept(listener, nullptr, nullptr);
      if (c < 0) return;
      const std::string text = "SSH-2.0-OpenSSH_9.2\r\n";
      (void)::send(c, text.data(), text.size(), MSG_NOSIGNAL);
      std::this_thread::sleep_for(100ms);
      ::close(c);
    });
    const auto one = rdv_call({"127.0.0.1", port}, 1, 2, "", "", 5s);
    server.join();
    ::close(listener);
    REQUIRE(one.failed);
    CHECK(one.kind == errc::backend_failure);
    CHECK(rdv_contains(one.what, "the program at 127.0.0.1:" + std::to_string(port) + " is not a ringzero rank 0"));
  }
}

TEST_CASE("MASTER_ADDR / MASTER_PORT: read as torchrun sets them, malformed values named") {
  struct saved_variable {
    const char* name;
    std::string value;
    bool had;
    explicit saved_variable(const char* n) : name(n), had(std::getenv(n) != nullptr) {
      if (had) value = std::getenv(n);
    }
    ~saved_variable() {
      if (had)
        ::setenv(name, value.c_str(), 1);
      else
        ::unsetenv(name);
    }
  } addr("MASTER_ADDR"), port("MASTER_PORT");
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  CHECK(!rendezvous_address_from_env());
  ::setenv("MASTER_ADDR", "node-7", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  const auto where = rendezvous_address_from_env();
  REQUIRE(where);
  CHECK(where->host == "node-7");
  CHECK(where->port == 29500);
  auto refused = [](const std::string& expected) {
    try {
      (void)rendezvous_address_from_env();
      FAIL("accepted: " << expected);
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK_MESSAGE(rdv_contains(e.what(), expected), e.what());
    }
  };
  for (const char* bad : {"0", "65536", "-1", "29500x", " 29500"}) {
    ::setenv("MASTER_PORT", bad, 1);
    refused("MASTER_PORT");
  }
  ::unsetenv("MASTER_PORT");
  refused("MASTER_ADDR=\"node-7\" is set but MASTER_PORT is not: set both");
  ::unsetenv("MASTER_ADDR");
  ::setenv("MASTER_PORT", "29500", 1);
  refused("MASTER_PORT=\"29500\" is set but MASTER_ADDR is not: set both");

  const auto unresolved = rdv_call({"ringzero-no-such-host.invalid", 29500}, 2, 4, "", "", 5s);
  REQUIRE(unresolved.failed);
  CHECK(unresolved.kind == errc::invalid_argument);
  CHECK(rdv_contains(unresolved.what,
                     "ringzero [rank 2/4]: MASTER_ADDR=\"ringzero-no-such-host.invalid\" does not resolve"));
  for (int bad_rank : {-1, 4}) {
    const auto o = rdv_call({"127.0.0.1", 29500}, bad_rank, 4, "", "", 5s);
    REQUIRE(o.failed);
    CHECK(o.kind == errc::invalid_argument);
    CHECK(rdv_contains(o.what, "is outside [0, world_size=4)"));
  }
  const auto zero_timeout = rdv_call({"127.0.0.1", 29500}, 1, 4, "", "", 0s);
  CHECK(rdv_contains(zero_timeout.what, "timeout must be positive"));
}
