#pragma once
/// @file
/// `checkpoint::root_lock`: one saver per checkpoint root. An advisory lock (flock(2), exclusive,
/// never waiting) on the file ROOT/.lock, taken by the job's rank 0 before its first save and
/// held while the lock object lives (a `checkpointer` keeps it for the run). The file records the
/// holder ("host NAME pid N since UTC-TIME", one line) so that a second job is refused at once
/// with the holder named. A lock dies with its process: the kernel releases it when the holder
/// exits or is killed (SIGKILL included), so a stale lock is never seen as held and the next job
/// takes it over, rewriting the record. Across machines the root must be on a file system whose
/// flock reaches every client (Linux NFS maps flock to whole-file POSIX locks, Linux 2.6.12+;
/// Lustre needs its `flock` mount option): the lock is no stronger than the file system's locks.
/// Within one process two locks on one root also exclude each other (a lock belongs to an open
/// file description, not to a process).
/// Errors: errc::io_error naming the root and the holder, or the system's reason.
/// Thread semantics: one thread at a time per object. Needs `ringzero-checkpoint`.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <string>
#include <utility>

#include "ringzero/checkpoint/file_io.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::checkpoint {

/// The name of the lock file in a checkpoint root (starts with '.': never taken as a checkpoint).
inline constexpr std::string_view lock_file_name = ".lock";

/// See the file comment. Move-only; the destructor releases the lock (the record stays, naming
/// the last holder; it means nothing without the lock).
class root_lock {
 public:
  root_lock() = default;
  root_lock(root_lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)), root_(std::move(o.root_)) {}
  root_lock& operator=(root_lock&& o) noexcept {
    if (this != &o) {
      release();
      fd_ = std::exchange(o.fd_, -1);
      root_ = std::move(o.root_);
    }
    return *this;
  }
  root_lock(const root_lock&) = delete;
  root_lock& operator=(const root_lock&) = delete;
  ~root_lock() { release(); }

  /// Takes the lock of `root` (created when missing) without waiting. Throws errc::io_error
  /// naming the root and the holder's record when another saver holds it, or naming the file
  /// and the reason when the root cannot be created or the lock file opened (a read-only or
  /// non-directory root is reported here, before any training step).
  static root_lock acquire(const std::filesystem::path& root) {
    detail::make_directories(root);
    struct stat st {};
    if (::stat(root.c_str(), &st) != 0) detail::io_fail("cannot use checkpoint root", root, errno);
    if (!S_ISDIR(st.st_mode)) throw error(errc::io_error, "checkpoint root '" + root.string() + "' is not a directory");
    if (::access(root.c_str(), W_OK | X_OK) != 0)
      detail::io_fail("cannot save into checkpoint root (not writable)", root, errno);
    const std::filesystem::path path = root / lock_file_name;
    detail::require_replaceable(path, "lock with");
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) detail::io_fail("cannot open the lock file", path, errno);
    root_lock lock;
    lock.fd_ = fd;
    lock.root_ = root;
    struct stat lst {};
    if (::fstat(fd, &lst) != 0) detail::io_fail("cannot stat the lock file", path, errno);
    if (lst.st_nlink != 1)  // a hard link to some other file: writing the record would change it
      throw error(errc::io_error, "lock file '" + path.string() + "' has " + std::to_string(lst.st_nlink) +
                                      " links (another name of some file): refused, never written");
    if (std::filesystem::exists(root / "index.json"))
      throw error(errc::io_error, "'" + root.string() +
                                      "' is a checkpoint directory (it holds index.json), not a checkpoint root: "
                                      "give the directory that holds it");
    detail::require_replaceable(root / "latest", "use as the 'latest' pointer");
    int rc;
    do { rc = ::flock(fd, LOCK_EX | LOCK_NB); } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) detail::io_fail("cannot lock", path, err);
      std::string holder = read_record(fd);
      throw error(errc::io_error, "checkpoint root '" + root.string() + "' is in use by another saver (" +
                                      (holder.empty() ? std::string("its holder wrote no record yet") : holder) +
                                      "): two jobs must not save into one root; give this run another "
                                      "directory, or stop the other job");
    }
    const std::string record = holder_record();
    if (::ftruncate(fd, 0) != 0) detail::io_fail("cannot write the lock file", path, errno);
    if (::pwrite(fd, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size()))
      detail::io_fail("cannot write the lock file", path, errno);
    return lock;
  }

  /// True while this object holds a lock.
  bool held() const noexcept { return fd_ >= 0; }
  /// The root whose lock this is.
  const std::filesystem::path& root() const noexcept { return root_; }
  /// Releases the lock (nothing when none is held).
  void release() noexcept {
    if (fd_ >= 0) ::close(fd_);  // closing the last descriptor of the description releases the flock
    fd_ = -1;
  }

  /// "host NAME pid N since 2026-12-03T12:00:00Z": this process's record.
  static std::string holder_record() {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm utc{};
    ::gmtime_r(&now, &utc);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return std::string("host ") + host + " pid " + std::to_string(::getpid()) + " since " + when + "\n";
  }

 private:
  /// The first line of the lock file (at most 200 bytes), for the refusal.
  static std::string read_record(int fd) {
    char buf[201] = {};
    const ssize_t n = ::pread(fd, buf, 200, 0);
    std::string s(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
    return s;
  }

  int fd_ = -1;
  std::filesystem::path root_;
};

}  // namespace ringzero::checkpoint
