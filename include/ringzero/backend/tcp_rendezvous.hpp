#pragma once
/// @file
/// The start-up exchange of a multi-process job over TCP, as torchrun's `env://` convention
/// sets it up: every process knows MASTER_ADDR and MASTER_PORT; rank 0 listens on that port,
/// the other ranks connect, say who they are, and receive the bytes rank 0 serves (NCCL's
/// unique id in `nccl::init_from_env`). No shared file system and no MPI are needed.
///
/// The exchange checks the job before anyone goes on: every rank must give the same world size,
/// each rank in [1, world_size) must join exactly once, and ranks that name a job identity
/// (`nccl::job_token_from_env`: RINGZERO_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...) must
/// name rank 0's. A world size that differs or a rank that joins twice (two jobs on one port
/// without job identities) ends the exchange with the same error on every rank that joined, and
/// on those that say hello within min(timeout, 1 s) after it (rank 0 keeps answering that
/// long); a connection of another job is answered with an error and the exchange goes on. Rank 0 waits
/// for the missing ranks until the timeout and then tells everyone which ranks never came.
///
/// Wire format (all integers big-endian): a joining rank sends "RZTB", version (u32, 1), rank,
/// world size, job identity length (u32 each) and the identity; rank 0 answers "RZTR", a status
/// (u8: 0 ok, else the errc of the failure), a length (u32) and the payload or the error text.
/// Errors: errc::invalid_argument (bad variables, a port in use, a world size or rank that
/// disagrees), errc::timeout (nobody listening, ranks missing), errc::backend_failure (socket
/// calls failing, rank 0 failing to make the payload). Every error names this rank.
/// Thread safety: calls are independent (several may run at once, e.g. one per thread in tests).
/// POSIX sockets only. Manual: docs/gpu.md ("Starting the ranks").

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ringzero/backend/launch_env.hpp"
#include "ringzero/core/env.hpp"
#include "ringzero/core/error.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ringzero {

/// Where rank 0 of a job listens: MASTER_ADDR (a host name or numeric address) and MASTER_PORT.
struct rendezvous_address {
  std::string host;  ///< resolved with getaddrinfo on the joining ranks
  int port = 0;      ///< 1-65535
};

/// MASTER_ADDR and MASTER_PORT from the environment; std::nullopt when neither is set. Throws
/// errc::invalid_argument when only one is set or the port is not an integer in [1, 65535].
inline std::optional<rendezvous_address> rendezvous_address_from_env() {
  const auto host = detail::env_string("MASTER_ADDR");
  const auto port = detail::env_string("MASTER_PORT");
  if (!host && !port) return std::nullopt;
  if (!host)
    throw error(errc::invalid_argument, "MASTER_PORT=\"" + *port + "\" is set but MASTER_ADDR is not: set both");
  if (!port)
    throw error(errc::invalid_argument, "MASTER_ADDR=\"" + *host + "\" is set but MASTER_PORT is not: set both");
  const int p = detail::parse_nonnegative_int(*port, "MASTER_PORT");
  if (p < 1 || p > 65535) throw error(errc::invalid_argument, "MASTER_PORT=" + *port + " is outside [1, 65535]");
  return rendezvous_address{*host, p};
}

/// The most bytes rank 0 serves (the payload) and a job identity may hold.
inline constexpr std::size_t rendezvous_max_payload = 1 << 20;
inline constexpr std::size_t rendezvous_max_job = 256;

namespace detail::tcp {

using clock = std::chrono::steady_clock;

/// Closes a socket when it goes out of scope.
struct socket_fd {
  int fd = -1;
  socket_fd() = default;
  explicit socket_fd(int f) : fd(f) {}
  socket_fd(socket_fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  socket_fd& operator=(socket_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  ~socket_fd() { reset(); }
  void reset() noexcept {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

inline std::string errno_text(int e) { return std::strerror(e); }

inline void put_u32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

inline std::uint32_t get_u32(const std::string& in, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(in[at + i]);
  return v;
}

inline constexpr std::string_view hello_magic = "RZTB";
inline constexpr std::string_view reply_magic = "RZTR";
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t hello_fixed = 4 + 4 * 4;  // magic, version, rank, world size, job length
inline constexpr std::size_t reply_fixed = 4 + 1 + 4;  // magic, status, length

inline std::string hello(int rank, int world_size, const std::string& job) {
  std::string h(hello_magic);
  put_u32(h, version);
  put_u32(h, static_cast<std::uint32_t>(rank));
  put_u32(h, static_cast<std::uint32_t>(world_size));
  put_u32(h, static_cast<std::uint32_t>(job.size()));
  return h + job;
}

inline std::string reply(int status, const std::string& body) {
  std::string r(reply_magic);
  r.push_back(static_cast<char>(status));
  put_u32(r, static_cast<std::uint32_t>(body.size()));
  return r + body;
}

/// Milliseconds from now to `deadline` for poll(), at least 0 and at most `cap`.
inline int ms_until(clock::time_point deadline, int cap = 1000) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap));
}

inline void set_nonblocking(int fd) { (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

/// Writes all of `bytes` to a non-blocking socket before `deadline`; false when the peer left
/// or the deadline passed.
inline bool send_all(int fd, std::string_view bytes, clock::time_point deadline) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (clock::now() >= deadline) return false;
      pollfd p{fd, POLLOUT, 0};
      (void)::poll(&p, 1, ms_until(deadline, 100));
      continue;
    }
    return false;
  }
  return true;
}

/// The text of a peer's address ("127.0.0.1:40312"), for messages.
inline std::string peer_text(const sockaddr_storage& a) {
  char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
  (void)::getnameinfo(reinterpret_cast<const sockaddr*>(&a), sizeof a, host, sizeof host, serv, sizeof serv,
                      NI_NUMERICHOST | NI_NUMERICSERV);
  std::string h = host;
  if (h.rfind("::ffff:", 0) == 0) h = h.substr(7);  // an IPv4 peer on a dual-stack socket
  return h + ":" + serv;
}

/// A listening socket on every address of this host at `port` (IPv6 dual stack, or IPv4 where
/// IPv6 is off). A port in use is errc::invalid_argument naming it.
inline socket_fd listen_on(int port, int backlog) {
  int family = AF_INET6;
  socket_fd s(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd < 0) {
    family = AF_INET;
    s = socket_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  }
  if (s.fd < 0) throw error(errc::backend_failure, "socket() failed: " + errno_text(errno));
  const int one = 1, zero = 0;
  // SO_REUSEADDR lets a new job take a port whose last connections linger in TIME_WAIT; on
  // Linux it does not let two sockets listen on one port.
  (void)::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = 0;
  if (family == AF_INET6) {
    (void)::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    rc = ::bind(s.fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    rc = ::bind(s.fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  }
  if (rc != 0) {
    const int e = errno;
    if (e == EADDRINUSE)
      throw error(errc::invalid_argument, "MASTER_PORT=" + std::to_string(port) +
                                              " is in use on this host (another job's rank 0, or another program): "
                                              "choose a free port");
    throw error(errc::backend_failure, "cannot listen on MASTER_PORT=" + std::to_string(port) + ": " + errno_text(e));
  }
  if (::listen(s.fd, backlog) != 0)
    throw error(errc::backend_failure, "listen() on port " + std::to_string(port) + " failed: " + errno_text(errno));
  set_nonblocking(s.fd);
  return s;
}

/// The addresses `where` resolves to; errc::invalid_argument naming MASTER_ADDR when none.
inline std::vector<sockaddr_storage> resolve(const rendezvous_address& where, std::vector<socklen_t>& lengths) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(where.port);
  const int rc = ::getaddrinfo(where.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr)
    throw error(errc::invalid_argument, "MASTER_ADDR=\"" + where.host + "\" does not resolve to an address (" +
                                            (rc != 0 ? std::string(::gai_strerror(rc)) : "no address") + ")");
  std::vector<sockaddr_storage> out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    out.push_back(s);
    lengths.push_back(a->ai_addrlen);
  }
  ::freeaddrinfo(found);
  return out;
}

/// One connection to `address` before `deadline`: a connected non-blocking socket, or an empty
/// one when it was refused or did not complete in time.
inline socket_fd try_connect(const sockaddr_storage& address, socklen_t length, clock::time_point deadline) {
  socket_fd s(::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd < 0) return {};
  set_nonblocking(s.fd);
  if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) return s;
  if (errno != EINPROGRESS) return {};
  pollfd p{s.fd, POLLOUT, 0};
  if (::poll(&p, 1, ms_until(deadline)) <= 0) return {};
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return {};
  return s;
}

/// A joining rank's connection on rank 0's side.
struct member {
  socket_fd fd;
  std::string peer;      // "address:port"
  std::string received;  // hello bytes so far
  int rank = -1;         // set once the hello is complete and accepted
  bool answer = false;   // gets the exchange's answer (joined, or the cause of its failure)
  clock::time_point accepted_at = clock::now();
};

/// How long rank 0 keeps a connection that has not completed its hello (a rank sends it at
/// once): idle connections must not fill the accept queue that real ranks need.
inline constexpr std::chrono::seconds hello_limit{2};

/// The margin past the timeout a side allows for the other's last message: rank 0 tells
/// everyone at its deadline, which a joining rank that started earlier has already reached.
inline clock::duration margin(std::chrono::duration<double> timeout) {
  return std::chrono::duration_cast<clock::duration>(std::min(timeout, std::chrono::duration<double>(1.0)));
}

/// Why rank 0 ends the exchange with an error for everyone.
struct failure {
  errc kind;
  std::string text;
};

/// Rank 0's side: accepts world_size - 1 ranks, then answers each with `payload` (or with
/// `payload_failure` when making it failed). Returns `payload`; throws what everyone was told.
inline std::string serve(const rendezvous_address& where, int world_size, const std::string& job,
                         const std::string& payload, const std::optional<failure>& payload_failure,
                         clock::time_point deadline, std::chrono::duration<double> timeout, const error_context& ctx) {
  const std::string at = "port " + std::to_string(where.port);
  std::optional<failure> fatal;  // ends the exchange early; a payload failure waits for everyone to tell them
  std::vector<member> members;
  socket_fd listener;
  if (world_size > 1) listener = listen_on(where.port, std::min(world_size, 4096 - 16) + 16);
  auto joined = [&] {
    return static_cast<int>(std::count_if(members.begin(), members.end(), [](const member& m) { return m.rank > 0; }));
  };
  auto reject = [&](member& m, errc kind, const std::string& why) {
    (void)send_all(m.fd.fd, reply(static_cast<int>(kind), why), clock::now() + std::chrono::seconds(1));
    m.fd.reset();
  };
  // Judges a complete hello of this protocol; a fault of the whole job becomes `fatal`, and
  // the rank that showed it is answered with the others.
  auto judge = [&](member& m) {
    const std::string& h = m.received;
    const auto rank = get_u32(h, 8), world = get_u32(h, 12);
    const std::string their_job = h.substr(hello_fixed);
    if (their_job != job) {
      reject(m, errc::invalid_argument,
             "rank " + std::to_string(rank) + " of job \"" + their_job + "\" reached rank 0 of job \"" + job +
                 "\" at " + at + ": two jobs share MASTER_ADDR:MASTER_PORT; give each its own port");
      return;
    }
    m.answer = true;
    if (fatal) return;  // said hello after the job failed: answered with that failure
    if (world != static_cast<std::uint32_t>(world_size)) {
      fatal = failure{errc::invalid_argument, "ranks disagree on WORLD_SIZE: rank 0: " + std::to_string(world_size) +
                                                  "; rank " + std::to_string(rank) + " (from " + m.peer +
                                                  "): " + std::to_string(world)};
      return;
    }
    if (rank == 0 || rank >= static_cast<std::uint32_t>(world_size)) {
      fatal = failure{errc::invalid_argument, "a process from " + m.peer + " joined as rank " + std::to_string(rank) +
                                                  ", outside [1, " + std::to_string(world_size) + ")"};
      return;
    }
    for (const member& other : members)
      if (other.rank == static_cast<int>(rank)) {
        fatal = failure{errc::invalid_argument,
                        "rank " + std::to_string(rank) + " joined twice (from " + other.peer + " and " + m.peer +
                            "): two jobs on one MASTER_ADDR:MASTER_PORT? Give each its own port, or a job id "
                            "(RINGZERO_JOB_ID) so that rank 0 can tell them apart"};
        return;
      }
    m.rank = static_cast<int>(rank);
  };
  // A fault of the job (a WORLD_SIZE, rank or identity that does not fit) ends the exchange, but
  // the ranks connecting at that moment, or within a second after it, are still read and told
  // why, rather than finding the port closed.
  clock::time_point told_until{};
  std::string fatal_answer;  // what each rank that says hello now is told (once the job failed)
  while (fatal ? clock::now() < told_until : joined() < world_size - 1) {
    if (fatal && fatal_answer.empty()) fatal_answer = reply(static_cast<int>(fatal->kind), fatal->text);
    if (fatal)
      for (member& m : members)
        if (m.answer && m.fd.fd >= 0) {
          (void)send_all(m.fd.fd, fatal_answer, clock::now() + std::chrono::milliseconds(200));
          m.fd.reset();
          m.answer = false;
        }
    if (!fatal && clock::now() >= deadline) {
      // the first 16 missing ranks, in time linear in the members (world_size may be huge)
      std::vector<int> present;
      for (const member& m : members)
        if (m.rank > 0) present.push_back(m.rank);
      std::sort(present.begin(), present.end());
      const long long count = static_cast<long long>(world_size) - 1 - static_cast<long long>(present.size());
      std::string missing;
      int listed = 0;
      std::size_t next = 0;
      for (int r = 1; r < world_size && listed < 16; ++r) {
        if (next < present.size() && present[next] == r) {
          ++next;
          continue;
        }
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        ++listed;
      }
      if (count > listed) missing += ", ... (" + std::to_string(count) + " in all)";
      fatal = failure{errc::timeout, "only " + std::to_string(joined() + 1) + " of " + std::to_string(world_size) +
                                         " ranks reached rank 0 at " + at + " within " +
                                         std::to_string(timeout.count()) + " s; missing rank(s): " + missing +
                                         " (not started, crashed, or given another MASTER_ADDR/MASTER_PORT?)"};
      break;
    }
    for (member& m : members)
      if (m.rank < 0 && !m.answer && clock::now() - m.accepted_at > hello_limit) m.fd.reset();
    members.erase(std::remove_if(members.begin(), members.end(), [](const member& m) { return m.fd.fd < 0; }),
                  members.end());
    std::vector<pollfd> polls{{listener.fd, POLLIN, 0}};
    for (const member& m : members) polls.push_back({m.fd.fd, POLLIN, 0});
    const int ready = ::poll(polls.data(), polls.size(), ms_until(fatal ? told_until : deadline, 200));
    if (ready < 0 && errno != EINTR) throw error(errc::backend_failure, ctx, "poll() failed: " + errno_text(errno));
    if (ready <= 0) continue;
    for (std::size_t i = 1; i < polls.size(); ++i) {
      if (polls[i].revents == 0) continue;
      member& m = members[i - 1];
      char buffer[512];
      const ssize_t n = ::recv(m.fd.fd, buffer, sizeof buffer, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {  // the peer left: before its hello (a probe) or after (it counts as missing again)
        m.fd.reset();
        m.rank = -1;
        m.answer = false;
        continue;
      }
      if (m.rank > 0) continue;  // nothing more is expected from a joined rank
      m.received.append(buffer, static_cast<std::size_t>(n));
      if (m.received.size() >= 4 && m.received.compare(0, 4, hello_magic) != 0) {
        reject(m, errc::invalid_argument,
               "rank 0 at " + at + " is a ringzero rendezvous; this connection from " + m.peer + " is not");
        continue;
      }
      if (m.received.size() < hello_fixed) continue;
      const std::size_t job_length = get_u32(m.received, 16);
      if (get_u32(m.received, 4) != version || job_length > rendezvous_max_job) {
        reject(m, errc::invalid_argument,
               "rank 0 at " + at + " speaks rendezvous protocol version " + std::to_string(version) +
                   " with job identities of at most " + std::to_string(rendezvous_max_job) + " bytes; the process at " +
                   m.peer + " sent version " + std::to_string(get_u32(m.received, 4)) + " and " +
                   std::to_string(job_length) + " bytes: mixed ringzero versions?");
        continue;
      }
      if (m.received.size() >= hello_fixed + job_length) {
        m.received.resize(hello_fixed + job_length);
        const bool failed_before = fatal.has_value();
        judge(m);
        if (fatal && !failed_before) told_until = clock::now() + margin(timeout);
      }
    }
    members.erase(std::remove_if(members.begin(), members.end(), [](const member& m) { return m.fd.fd < 0; }),
                  members.end());
    if (polls[0].revents & POLLIN) {
      for (;;) {
        sockaddr_storage peer{};
        socklen_t length = sizeof peer;
        const int fd = ::accept4(listener.fd, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          break;
        }
        member m;
        m.fd = socket_fd(fd);
        set_nonblocking(fd);
        m.peer = peer_text(peer);
        members.push_back(std::move(m));
      }
    }
  }
  listener.reset();  // later connections are refused
  if (!fatal) fatal = payload_failure;
  const auto send_deadline = clock::now() + margin(timeout);
  const std::string answer = fatal ? reply(static_cast<int>(fatal->kind), fatal->text) : reply(0, payload);
  for (member& m : members)
    if (m.answer) (void)send_all(m.fd.fd, answer, send_deadline);
  if (fatal) throw error(fatal->kind, ctx, fatal->text);
  return payload;
}

/// A joining rank's side: connects to rank 0 (retrying until the deadline while nobody
/// listens), says who it is and returns what rank 0 answers.
inline std::string join(const rendezvous_address& where, int rank, int world_size, const std::string& job,
                        clock::time_point deadline, std::chrono::duration<double> timeout, const error_context& ctx) {
  std::vector<socklen_t> lengths;
  const std::vector<sockaddr_storage> addresses = resolve(where, lengths);
  const std::string at = where.host + ":" + std::to_string(where.port);
  socket_fd s;
  auto pause = std::chrono::milliseconds(10);
  while (s.fd < 0) {
    for (std::size_t i = 0; i < addresses.size() && s.fd < 0; ++i) s = try_connect(addresses[i], lengths[i], deadline);
    if (s.fd >= 0) break;
    if (clock::now() >= deadline)
      throw error(errc::timeout, ctx,
                  "nobody accepted a connection at MASTER_ADDR:MASTER_PORT = " + at + " within " +
                      std::to_string(timeout.count()) +
                      " s: is rank 0 running, are MASTER_ADDR and MASTER_PORT the same on every rank, or did "
                      "rank 0 already end the exchange with an error (see its output)?");
    std::this_thread::sleep_for(
        std::min<std::chrono::milliseconds>(pause, std::chrono::milliseconds(ms_until(deadline))));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  const int one = 1;
  (void)::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Rank 0 answers by its own deadline, which may be a little later than this rank's.
  const auto started = deadline - std::chrono::duration_cast<clock::duration>(timeout);
  const auto answer_deadline = deadline + margin(timeout);
  if (!send_all(s.fd, hello(rank, world_size, job), answer_deadline))
    throw error(errc::backend_failure, ctx, "rank 0 at " + at + " closed the connection before this rank said hello");
  std::string in;
  std::size_t expected = reply_fixed;
  while (in.size() < expected) {
    if (clock::now() >= answer_deadline)
      throw error(errc::timeout, ctx,
                  "connected to " + at + " but got no answer within " +
                      std::to_string(std::chrono::duration<double>(clock::now() - started).count()) +
                      " s: is the program listening there rank 0 of this job (a ringzero program)?");
    pollfd p{s.fd, POLLIN, 0};
    if (::poll(&p, 1, ms_until(answer_deadline, 200)) <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::recv(s.fd, buffer, sizeof buffer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0)
      throw error(errc::backend_failure, ctx,
                  "rank 0 at " + at + " closed the connection without an answer (did it exit?)");
    in.append(buffer, static_cast<std::size_t>(n));
    if (in.size() >= reply_fixed) {
      if (in.compare(0, 4, reply_magic) != 0)
        throw error(errc::backend_failure, ctx,
                    "the program at " + at + " is not a ringzero rank 0 (it answered something else)");
      const std::size_t length = get_u32(in, 5);
      if (length > rendezvous_max_payload)
        throw error(errc::backend_failure, ctx,
                    "rank 0 at " + at + " announced " + std::to_string(length) + " bytes, more than the limit");
      expected = reply_fixed + length;
    }
  }
  const int status = static_cast<unsigned char>(in[4]);
  std::string body = in.substr(reply_fixed, expected - reply_fixed);
  if (status != 0) {
    const bool known = status >= static_cast<int>(errc::invalid_argument) && status <= static_cast<int>(errc::internal);
    throw error(known ? static_cast<errc>(status) : errc::backend_failure, ctx, "rank 0 at " + at + ": " + body);
  }
  return body;
}

}  // namespace detail::tcp

/// The bytes that rank 0 makes with `make_payload()` (called on rank 0 only; returns a
/// std::string of at most `rendezvous_max_payload` bytes), handed to every rank of the job over
/// TCP at `where` (see the file comment). Collective over the job: every rank in [0,
/// world_size) calls it with the same `where`, `world_size` and `job` (empty: none); returns
/// once every rank has joined (rank 0) or received the bytes (the others). `timeout` (seconds,
/// positive; at most `max_timeout_seconds`) bounds the wait for the others: every call returns
/// or throws within `timeout` plus min(`timeout`, 1 s) (the margin for rank 0's last answer). A failure of
/// `make_payload` reaches every rank as errc::backend_failure with its text. Errors name this
/// rank (`ringzero [rank 2/4]: ...`); see the file comment for the kinds.
template <class MakePayload>
std::string tcp_rendezvous(const rendezvous_address& where, int rank, int world_size, const std::string& job,
                           MakePayload&& make_payload, std::chrono::duration<double> timeout) {
  error_context ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw error(errc::invalid_argument, ctx,
                "tcp_rendezvous: rank " + std::to_string(rank) +
                    " is outside [0, world_size=" + std::to_string(world_size) + ")");
  if (where.port < 1 || where.port > 65535)
    throw error(errc::invalid_argument, ctx,
                "tcp_rendezvous: port " + std::to_string(where.port) + " is outside [1, 65535]");
  if (where.host.empty()) throw error(errc::invalid_argument, ctx, "tcp_rendezvous: MASTER_ADDR is empty");
  if (job.size() > rendezvous_max_job)
    throw error(errc::invalid_argument, ctx,
                "tcp_rendezvous: a job identity of " + std::to_string(job.size()) + " bytes is over the limit of " +
                    std::to_string(rendezvous_max_job));
  if (!(timeout.count() > 0.0))
    throw error(errc::invalid_argument, ctx,
                "tcp_rendezvous: timeout must be positive, got " + std::to_string(timeout.count()) + " s");
  const auto wait = bounded_timeout(timeout);
  const auto deadline = detail::tcp::clock::now() + std::chrono::duration_cast<detail::tcp::clock::duration>(wait);
  try {
    if (rank != 0) return detail::tcp::join(where, rank, world_size, job, deadline, wait, ctx);
    std::string payload;
    std::optional<detail::tcp::failure> made;
    try {
      payload = make_payload();
      if (payload.size() > rendezvous_max_payload)
        made = detail::tcp::failure{errc::invalid_argument, "rank 0's payload of " + std::to_string(payload.size()) +
                                                                " bytes is over the limit"};
    } catch (const std::exception& e) {
      made = detail::tcp::failure{errc::backend_failure, std::string("rank 0 could not make its payload: ") + e.what()};
    }
    return detail::tcp::serve(where, world_size, job, payload, made, deadline, wait, ctx);
  } catch (const error& e) {
    if (e.context().rank >= 0) throw;
    throw error(e.kind(), ctx, e.message());
  }
}

}  // namespace ringzero
