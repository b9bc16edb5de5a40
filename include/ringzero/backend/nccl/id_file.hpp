#pragma once
/// @file
/// Exchanging NCCL's 128-byte unique id through a file every rank can read: rank 0 writes it
/// atomically, the other ranks poll until an id of their job and world size appears, and rank 0
/// removes it once the communicator exists. Stale files (another job, a writer that has exited)
/// are skipped. Independent of NCCL (the id is plain bytes).
/// Errors: errc::io_error, errc::timeout, errc::invalid_argument. Thread safety: the functions may
/// be called from several threads, also on one path. Manual: docs/gpu.md ("The id file").

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/core/env.hpp"
#include "ringzero/core/error.hpp"

#if defined(__unix__)
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#endif

namespace ringzero::nccl {

/// Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
inline constexpr std::size_t id_size = 128;

/// An NCCL unique id as plain bytes.
using id_bytes = std::array<unsigned char, id_size>;

/// The most of an id file a reader reads: its one line is under 700 bytes (a job identity of
/// at most 256); only these first bytes are parsed.
inline constexpr std::size_t id_file_max_bytes = 4096;

namespace detail {

/// The first bytes of `text` for a message: at most 40, other than printable ASCII as '?'.
inline std::string printable_start(const std::string& text) {
  std::string out = text.substr(0, 40);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < ' ' || static_cast<unsigned char>(c) > '~') c = '?';
  return text.size() > 40 ? out + "..." : out;
}

}  // namespace detail

/// The longest job identity an id file holds (bytes).
inline constexpr std::size_t max_job_token_bytes = 256;

/// The job identity recorded in id files (see the file comment); empty when none is set.
/// TORCHELASTIC_RUN_ID "none" (torchrun's value without `--rdzv-id`, the same for every job)
/// counts as unset. Throws errc::invalid_argument naming the variable when its value has
/// whitespace or control characters, is "-" (an id file holds it as one word) or is longer
/// than `max_job_token_bytes`.
inline std::string job_token_from_env() {
  for (const char* name : {"RINGZERO_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"}) {
    auto v = ringzero::detail::env_string(name);
    if (!v || (std::string_view(name) == "TORCHELASTIC_RUN_ID" && *v == "none")) continue;
    const bool one_word =
        std::none_of(v->begin(), v->end(), [](char c) { return static_cast<unsigned char>(c) <= ' ' || c == 0x7f; });
    if (!one_word || *v == "-" || v->size() > max_job_token_bytes)
      throw error(errc::invalid_argument, std::string(name) + "=\"" + detail::printable_start(*v) +
                                              "\" cannot name the job in an NCCL id file: use one word of at most " +
                                              std::to_string(max_job_token_bytes) +
                                              " bytes without spaces, other than \"-\"");
    return *v;
  }
  return {};
}

namespace detail {

inline constexpr const char* id_file_magic = "ringzero-nccl-id";

inline std::string hex_of(const id_bytes& id) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * id.size());
  for (unsigned char c : id) {
    s.push_back(digits[c >> 4]);
    s.push_back(digits[c & 15]);
  }
  return s;
}

inline bool id_of_hex(const std::string& s, id_bytes& id) {
  if (s.size() != 2 * id.size()) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < id.size(); ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

/// The first line of `path` (at most 4 KiB), empty when it cannot be read.
inline std::string first_line_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (in) std::getline(in, line);
  return line.substr(0, 4096);
}

/// Start time of process `pid` in clock ticks after boot (field 22 of /proc/<pid>/stat, proc(5))
/// and whether it is a zombie (state Z or X); false when the file cannot be read (no /proc, or
/// hidden by `hidepid`).
inline bool process_start(long pid, unsigned long long& start, bool& zombie) {
  const std::string stat = first_line_of("/proc/" + std::to_string(pid) + "/stat");
  const std::size_t paren = stat.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos) return false;
  std::istringstream fields(stat.substr(paren + 1));
  std::string state, field;
  if (!(fields >> state)) return false;
  for (int i = 4; i < 22; ++i)  // fields 4..21
    if (!(fields >> field)) return false;
  if (!(fields >> start)) return false;
  zombie = state == "Z" || state == "X";
  return true;
}

/// The machine's boot and this process's PID namespace, "boot/namespace", as the writer field
/// of an id file records them (Linux: /proc/sys/kernel/random/boot_id and the inode of
/// /proc/self/ns/pid); empty when either is unknown.
inline std::string this_machine_and_namespace() {
#if defined(__linux__)
  std::string boot = first_line_of("/proc/sys/kernel/random/boot_id");
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);  // "pid:[4026531836]"
  std::string space = n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : std::string();
  const std::size_t open = space.find('['), close = space.find(']');
  space = open != std::string::npos && close != std::string::npos && close > open + 1
              ? space.substr(open + 1, close - open - 1)
              : std::string();
  const auto word = [](const std::string& w) {
    return !w.empty() && std::all_of(w.begin(), w.end(),
                                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; });
  };
  if (word(boot) && word(space)) return boot + "/" + space;
#endif
  return {};
}

/// The writer field of an id file for this process: "boot/namespace/pid/start"; empty when
/// unknown (then readers cannot tell whether the writer still runs).
inline std::string this_process_writer() {
#if defined(__linux__)
  const std::string where = this_machine_and_namespace();
  unsigned long long start = 0;
  bool zombie = false;
  if (!where.empty() && process_start(static_cast<long>(::getpid()), start, zombie))
    return where + "/" + std::to_string(::getpid()) + "/" + std::to_string(start);
#endif
  return {};
}

/// What the reader can tell about an id file's writer.
enum class writer_state { unknown, running, exited };

/// Whether the process named by writer field `writer` still runs: `exited` only when it ran on
/// this boot of this machine, in this PID namespace, and its pid is free, a zombie, or now
/// belongs to a process started at another time; `unknown` for another machine, boot or
/// namespace, an empty or malformed field, or a process this one may not inspect.
inline writer_state judge_writer(const std::string& writer, long* pid_out = nullptr) {
#if defined(__unix__)
  const std::size_t last = writer.rfind('/');
  const std::size_t before = last == std::string::npos || last == 0 ? std::string::npos : writer.rfind('/', last - 1);
  if (before == std::string::npos) return writer_state::unknown;
  const std::string here = this_machine_and_namespace();
  if (here.empty() || writer.compare(0, before, here) != 0) return writer_state::unknown;
  long pid = 0;
  unsigned long long start = 0;
  try {
    std::size_t used = 0;
    const std::string pid_text = writer.substr(before + 1, last - before - 1), start_text = writer.substr(last + 1);
    pid = std::stol(pid_text, &used);
    if (used != pid_text.size() || pid <= 0) return writer_state::unknown;
    start = std::stoull(start_text, &used);
    if (used != start_text.size()) return writer_state::unknown;
  } catch (...) { return writer_state::unknown; }
  if (pid_out) *pid_out = pid;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return writer_state::exited;
  unsigned long long now_start = 0;
  bool zombie = false;
  if (!process_start(pid, now_start, zombie)) return writer_state::unknown;
  return zombie || now_start != start ? writer_state::exited : writer_state::running;
#else
  (void)writer;
  (void)pid_out;
  return writer_state::unknown;
#endif
}

/// The one line of an id file; `writer` as `this_process_writer()` returns it (left out when
/// empty: readers then cannot judge the writer, as for files of earlier ringzero versions).
inline std::string id_file_line(const id_bytes& id, int world_size, const std::string& job,
                                const std::string& writer = this_process_writer()) {
  return std::string(id_file_magic) + " 1 world_size=" + std::to_string(world_size) +
         " job=" + (job.empty() ? "-" : job) + " id=" + hex_of(id) +
         (writer.empty() ? std::string() : " writer=" + writer) + "\n";
}

/// What an id file holds, parsed; `ok` false when it is not (yet) a complete id file. `writer`
/// is empty when the file names none.
struct id_file_content {
  bool ok = false;
  int world_size = 0;
  std::string job;
  id_bytes id{};
  std::string writer;
};

inline id_file_content parse_id_file(const std::string& text) {
  id_file_content c;
  std::istringstream in(text);
  std::string magic, version, size, job, id, writer;
  if (!(in >> magic >> version >> size >> job >> id)) return c;
  if (magic != id_file_magic || version != "1") return c;
  if (size.rfind("world_size=", 0) != 0 || job.rfind("job=", 0) != 0 || id.rfind("id=", 0) != 0) return c;
  try {
    c.world_size = std::stoi(size.substr(11));
  } catch (...) { return c; }
  c.job = job.substr(4);
  if (c.job == "-") c.job.clear();
  if (in >> writer && writer.rfind("writer=", 0) == 0) c.writer = writer.substr(7);  // optional (added later)
  c.ok = id_of_hex(id.substr(3), c.id);
  return c;
}

/// "; its directory D does not exist" (or is not searchable) when that is why `path` cannot
/// appear; empty otherwise.
inline std::string directory_note(const std::string& path) {
#if defined(__unix__)
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int why = errno;
    return "; its directory " + dir + ": " + std::strerror(why);
  }
  if (!S_ISDIR(st.st_mode)) return "; " + dir + " is not a directory";
  if (::access(dir.c_str(), X_OK) != 0) return "; its directory " + dir + " is not searchable by this process";
#else
  (void)path;
#endif
  return {};
}

}  // namespace detail

/// Writes `id` for a job of `world_size` ranks at `path`, atomically (rank 0's side): the line
/// goes to a temporary file created exclusively next to `path` (mkstemp: a fresh name even for
/// several writers of one path, in one process or on several hosts), which is then renamed
/// over `path`. Throws errc::io_error when the file cannot be written; no temporary file is
/// left behind then.
inline void publish_id_file(const std::string& path, const id_bytes& id, int world_size,
                            const std::string& job = job_token_from_env()) {
  const std::string line = detail::id_file_line(id, world_size, job);
#if defined(__unix__)
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    const int why = errno;
    throw error(errc::io_error, "cannot create a temporary file next to " + path +
                                    " to publish the NCCL unique id: " + std::strerror(why));
  }
  int why = ::fchmod(fd, 0644) == 0 ? 0 : errno;  // mkstemp makes it 0600: readers may run as other users
  for (std::size_t done = 0; why == 0 && done < line.size();) {
    const ssize_t wrote = ::write(fd, line.data() + done, line.size() - done);
    if (wrote >= 0)
      done += static_cast<std::size_t>(wrote);
    else if (errno != EINTR)
      why = errno;
  }
  if (::close(fd) != 0 && why == 0) why = errno;
  if (why != 0) {
    std::remove(tmp.c_str());
    throw error(errc::io_error, "cannot write " + tmp + " to publish the NCCL unique id: " + std::strerror(why));
  }
#else
  static std::atomic<unsigned long> calls{0};  // threads of one process publishing to one path
  const std::string tmp = path + ".tmp." + std::to_string(calls.fetch_add(1, std::memory_order_relaxed));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw error(errc::io_error, "cannot create " + tmp + " to publish the NCCL unique id");
    out << line;
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      throw error(errc::io_error, "cannot write " + tmp + " to publish the NCCL unique id");
    }
  }
#endif
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw error(errc::io_error, "cannot rename " + tmp + " to " + path + " to publish the NCCL unique id");
  }
}

/// Waits until `path` holds the id of this job (`job`) for `world_size` ranks and returns it
/// (every other rank's side), skipping a file whose writer has exited (see the file comment).
/// Polls every few milliseconds, reading at most the first `id_file_max_bytes` of the file.
/// `timeout`: 0 or negative polls once; above
/// `max_timeout_seconds` (infinity included) waits for ever. Throws errc::invalid_argument for
/// a NaN timeout; errc::io_error when `path` exists but is not a regular file or cannot be read
/// by this process (waiting cannot help); errc::timeout after `timeout`, saying what the file
/// held if it held something else or something that is not an id file.
inline id_bytes read_id_file(const std::string& path, int world_size, std::chrono::duration<double> timeout,
                             const std::string& job = job_token_from_env()) {
  if (std::isnan(timeout.count()))
    throw error(errc::invalid_argument, "read_id_file: the timeout for " + path + " is NaN");
  const auto wait = timeout.count() > 0.0 ? bounded_timeout(timeout) : std::chrono::duration<double>(0);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(wait);
  auto pause = std::chrono::milliseconds(1);
  std::string seen;
  for (;;) {
#if defined(__unix__)
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw error(errc::io_error, path + " is not a regular file: it cannot hold the NCCL unique id");
#endif
    std::ifstream in(path, std::ios::binary);
#if defined(__unix__)
    if (!in && ::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), R_OK) != 0) {
      // there but unreadable to this process (permissions): waiting cannot help
      const int why = errno;
      throw error(errc::io_error, "cannot read " + path + " for the NCCL unique id: " + std::strerror(why));
    }
#endif
    seen.clear();  // what the file holds now, if anything
    if (in) {
      std::string text(id_file_max_bytes, '\0');
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<std::size_t>(in.gcount()));
      const detail::id_file_content c = detail::parse_id_file(text);
      long writer_pid = 0;
      if (c.ok && c.world_size == world_size && c.job == job) {
        if (detail::judge_writer(c.writer, &writer_pid) != detail::writer_state::exited) return c.id;
        seen = "; it holds an id for this job written by process " + std::to_string(writer_pid) +
               " on this machine, which has exited: a stale file of an earlier run (this job's rank 0 has not "
               "published yet; if rank 0 runs elsewhere, its file never reached this path)";
      } else if (c.ok)
        seen = "; it holds an id for world size " + std::to_string(c.world_size) + " and job \"" + c.job +
               "\" (this job: world size " + std::to_string(world_size) + ", job \"" + job +
               "\"): a stale file? remove it or set RINGZERO_JOB_ID";
      else if (!text.empty())  // rank 0 renames a whole file into place: this is not one of ours
        seen = "; it exists but is not an id file of this version (it starts \"" + detail::printable_start(text) +
               "\"): remove it";
      else
        seen = "; it exists but is empty (not written by ringzero, which renames a whole file into place): remove it";
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw error(errc::timeout,
                  "waited " + ringzero::detail::seconds_text(timeout) +
                      " s for rank 0 to publish the NCCL unique id at " + path +
                      (seen.empty() ? " (the file never appeared" + detail::directory_note(path) + ")" : seen));
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(50)) pause *= 2;
  }
}

/// Removes `path` (rank 0, once the communicator exists). Never throws.
inline void remove_id_file(const std::string& path) noexcept { (void)std::remove(path.c_str()); }

/// Rank 0 publishes `make_id()` at `path`; every other rank reads it (see above). Returns the
/// id on every rank. Throws as `publish_id_file` and `read_id_file`.
template <class MakeId>
id_bytes exchange_id_through_file(const std::string& path, int rank, int world_size, MakeId&& make_id,
                                  std::chrono::duration<double> timeout,
                                  const std::string& job = job_token_from_env()) {
  if (rank == 0) {
    const id_bytes id = make_id();
    publish_id_file(path, id, world_size, job);
    return id;
  }
  return read_id_file(path, world_size, timeout, job);
}

}  // namespace ringzero::nccl
