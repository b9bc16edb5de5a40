#pragma once
/// @file
/// `checkpoint::detail::file`: the POSIX file operations the checkpoint layer needs — positioned
/// reads and writes of whole ranges (pread / pwrite, retried on short transfers and EINTR),
/// fsync of files and directories, atomic replacement of a small file (temporary file, fsync,
/// rename, fsync of the directory) and atomic exchange of two directories (renameat2 with
/// RENAME_EXCHANGE, Linux 3.15+), and reads and writes that bypass the page cache (O_DIRECT)
/// where the file system allows them. Every failure throws `ringzero::error(errc::io_error)` naming
/// the operation, the file and the system's reason ("No space left on device").
/// Thread semantics: a `file` is used by one thread at a time.

#include <fcntl.h>  // sync_file_range needs _GNU_SOURCE, which g++ defines
#include <stdio.h>  // renameat2 (glibc 2.28+)
#include <sys/stat.h>
#include <sys/uio.h>  // preadv2, RWF_NOWAIT
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ringzero/core/error.hpp"

namespace ringzero::checkpoint::detail {

/// Throws errc::io_error: "<what> '<path>': <strerror(err)>".
[[noreturn]] inline void io_fail(const std::string& what, const std::filesystem::path& path, int err) {
  throw error(errc::io_error, what + " '" + path.string() + "': " + std::strerror(err));
}

/// "a directory", "a FIFO", ... for the S_IFMT bits `kind`, for messages.
inline const char* file_kind_name(unsigned kind) noexcept {
  switch (kind) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a file";
  }
}

/// Throws errc::io_error unless `path` is absent or a regular file (not followed when it is a
/// symbolic link): what a writer may create or replace. `use` says what was to be done ("write").
/// Output paths given by users go through `resolve_output` first.
inline void require_replaceable(const std::filesystem::path& path, const char* use) {
  if (path.empty()) throw error(errc::io_error, std::string("cannot ") + use + " an empty path");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    io_fail(std::string("cannot ") + use, path, errno);
  }
  const auto k = static_cast<unsigned>(st.st_mode & S_IFMT);
  if (k != S_IFREG)
    throw error(errc::io_error, std::string("cannot ") + use + " '" + path.string() + "': it is " + file_kind_name(k) +
                                    ", and only a regular file is ever replaced");
}

/// The file an output given by a user names, checked before anything is written: an absent
/// path (whose parent is an existing directory) or a regular file is taken as it is; a
/// symbolic link is refused unless `follow_symlink`, then its target (which must be absent or
/// a regular file) is written instead; a directory, FIFO, device or socket is refused by name.
/// Errors: errc::io_error naming `option` and the path.
inline std::filesystem::path resolve_output(const std::filesystem::path& path, bool follow_symlink,
                                            const std::string& option) {
  if (path.empty()) throw error(errc::io_error, option + ": the output path is empty");
  std::filesystem::path target = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    if (!follow_symlink)
      throw error(errc::io_error, option + " '" + path.string() +
                                      "' is a symbolic link: refused (give --force to write the file it points to)");
    // Follow the chain of links (each target relative to its link's directory), as open(2) would.
    for (int hops = 0; ::lstat(target.c_str(), &st) == 0 && S_ISLNK(st.st_mode); ++hops) {
      std::error_code ec;
      const std::filesystem::path next = std::filesystem::read_symlink(target, ec);
      if (ec || hops == 40) io_fail(option + ": cannot resolve the symbolic link", path, ec ? ec.value() : ELOOP);
      target = next.is_absolute() ? next : target.parent_path() / next;
    }
  }
  try {
    require_replaceable(target, "write");
  } catch (const error& e) { throw error(errc::io_error, option + ": " + e.message()); }
  const std::filesystem::path parent = target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  struct stat pst {};
  if (::stat(parent.c_str(), &pst) != 0) io_fail(option + ": cannot use the output's directory", parent, errno);
  if (!S_ISDIR(pst.st_mode))
    throw error(errc::io_error, option + ": '" + parent.string() + "' (the output's directory) is not a directory");
  return target;
}

/// For tests: makes O_DIRECT look refused as by a file system without it (`at_open`: open fails
/// with EINVAL, for reads and writes; `at_read`: the first direct pread does; `at_write`: the
/// first direct pwrite does), so the buffered fallback runs anywhere.
enum class direct_refusal { none, at_open, at_read, at_write };
inline std::atomic<direct_refusal> test_direct_refusal{direct_refusal::none};

/// For tests: what `file::cached` answers. `probe` asks the kernel (the default); `cold` and
/// `warm` answer false and true, so that the choice between direct and buffered reads is
/// checked without depending on which pages the kernel keeps (posix_fadvise eviction is advice,
/// and a file system may serve an O_DIRECT write through the page cache).
enum class page_cache_view { probe, cold, warm };
inline std::atomic<page_cache_view> test_page_cache{page_cache_view::probe};

/// The alignment this layer gives O_DIRECT transfers (memory, file offsets and lengths): 4 KiB,
/// a multiple of every logical block size in use (512 or 4096 bytes).
inline constexpr std::uint64_t direct_block_bytes = 4096;

/// An open file descriptor, closed on destruction. Move-only.
class file {
 public:
  file() = default;
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  file(file&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  file& operator=(file&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  ~file() { reset(); }

  /// Creates (or truncates) the regular file `path` for writing, mode 0644. Anything else at
  /// `path` (a directory, FIFO, device, socket or symbolic link) is refused before it is
  /// opened (`require_replaceable`), so nothing but a regular file is ever truncated.
  static file create(const std::filesystem::path& path) {
    require_replaceable(path, "write");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) io_fail("cannot create", path, errno);
    file f(fd, path);
    f.require_regular("write");
    f.set_blocking();
    return f;
  }
  /// Creates the new file `path` for writing, mode 0644; an existing file, link or anything else
  /// there is an error (O_EXCL: nothing is ever truncated or followed).
  static file create_new(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) io_fail("cannot create", path, errno);
    return file(fd, path);
  }
  /// Opens the regular file `path` for reading. The open never blocks (O_NONBLOCK, cleared
  /// after it): a FIFO, device, socket or directory at `path` is refused at once, naming it.
  static file open_read(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) io_fail("cannot open", path, errno);
    file f(fd, path);
    f.require_regular("read");
    f.set_blocking();
    return f;
  }
  /// Opens `path` for reading with O_DIRECT (Linux: reads bypass the page cache; offsets,
  /// lengths and memory must be multiples of the logical block size), or std::nullopt when
  /// the file system refuses it or the file cannot be opened (the caller reads buffered).
  static std::optional<file> open_direct(const std::filesystem::path& path) noexcept {
#if defined(O_DIRECT)
    return open_direct_with(path, O_RDONLY);
#else
    (void)path;
    return std::nullopt;
#endif
  }
  /// Opens the existing file `path` for writing with O_DIRECT (offsets, lengths and memory
  /// multiples of the logical block size), or std::nullopt when the file system refuses it or
  /// the file cannot be opened (the caller writes buffered).
  static std::optional<file> open_direct_write(const std::filesystem::path& path) noexcept {
#if defined(O_DIRECT)
    return open_direct_with(path, O_WRONLY | O_NOFOLLOW);
#else
    (void)path;
    return std::nullopt;
#endif
  }
  /// Opens a directory (for fsync).
  static file open_directory(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) io_fail("cannot open directory", path, errno);
    return file(fd, path);
  }

  const std::filesystem::path& path() const noexcept { return path_; }
  bool is_open() const noexcept { return fd_ >= 0; }
  /// The file descriptor (owned by this object; -1 when closed).
  int descriptor() const noexcept { return fd_; }

  /// Writes `bytes` bytes at `offset`. A disk that fills up gives ENOSPC here (or at `sync`).
  void write_at(const void* data, std::uint64_t bytes, std::uint64_t offset) {
    transfer_loop(static_cast<const unsigned char*>(data), bytes, offset, false);
  }
  /// `write_at` on a file opened by `open_direct_write` (`data`, `bytes` and `offset` multiples
  /// of the logical block size): returns the bytes written before the system refused the
  /// request with EINVAL (all of them normally), for the caller to write the rest buffered;
  /// other errors (ENOSPC, EFBIG past a file size limit) throw as `write_at`'s do.
  std::uint64_t write_direct_at(const void* data, std::uint64_t bytes, std::uint64_t offset) {
    if (test_direct_refusal.load() == direct_refusal::at_write) return 0;
    return transfer_loop(static_cast<const unsigned char*>(data), bytes, offset, true);
  }
  /// Reads exactly `bytes` bytes at `offset`; a file that ends first is an error ("truncated").
  void read_at(void* data, std::uint64_t bytes, std::uint64_t offset) const {
    transfer_loop(static_cast<unsigned char*>(data), bytes, offset, false);
  }
  /// `read_at` on a file opened by `open_direct` (`data`, `bytes` and `offset` multiples of the
  /// logical block size): returns the bytes read before the system refused the request with
  /// EINVAL (all of them normally), for the caller to read the rest buffered; other errors and
  /// a file that ends first throw as `read_at`'s do.
  std::uint64_t read_direct_at(void* data, std::uint64_t bytes, std::uint64_t offset) const {
    if (test_direct_refusal.load() == direct_refusal::at_read) return 0;
    return transfer_loop(static_cast<unsigned char*>(data), bytes, offset, true);
  }
  /// True when the byte at `offset` is in the page cache (a 1-byte preadv2 with RWF_NOWAIT
  /// succeeds), so a read there is served from memory; false when not or unknown.
  bool cached(std::uint64_t offset) const noexcept {
    switch (test_page_cache.load()) {
      case page_cache_view::cold: return false;
      case page_cache_view::warm: return true;
      case page_cache_view::probe: break;
    }
#if defined(RWF_NOWAIT)
    unsigned char byte = 0;
    iovec v{&byte, 1};
    return ::preadv2(fd_, &v, 1, static_cast<off_t>(offset), RWF_NOWAIT) == 1;
#else
    (void)offset;
    return false;
#endif
  }
  /// The file's size in bytes.
  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) io_fail("cannot stat", path_, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }
  /// Starts writing bytes [offset, offset + bytes) to the disk without waiting (Linux
  /// sync_file_range(SYNC_FILE_RANGE_WRITE); elsewhere nothing). No durability: `sync` still
  /// decides that, and reports errors (this call's are ignored; `sync` sees them again).
  void start_writeback(std::uint64_t offset, std::uint64_t bytes) noexcept {
#if defined(SYNC_FILE_RANGE_WRITE)
    (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
#else
    (void)offset;
    (void)bytes;
#endif
  }
  /// Tells the kernel that bytes [offset, offset + bytes) will be read soon (posix_fadvise
  /// WILLNEED: it starts reading them in the background). Advice only; never fails.
  void will_need(std::uint64_t offset, std::uint64_t bytes) const noexcept {
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_WILLNEED);
  }
  /// Tells the kernel that the file is read sequentially (posix_fadvise SEQUENTIAL: a larger
  /// read-ahead). Advice only; never fails.
  void sequential() const noexcept { (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL); }
  /// fsync: the data and metadata are on stable storage (errors such as ENOSPC and EIO surface here).
  void sync() {
    if (::fsync(fd_) != 0) io_fail("cannot fsync", path_, errno);
  }
  /// Closes, reporting a failure of close (which can report a delayed write error).
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) io_fail("cannot close", path_, errno);
  }

 private:
  /// The pwrite loop of `write_at` (`Byte` const) or the pread loop of `read_at`: moves `bytes`
  /// at `offset` and returns how many it moved. `direct`: stops early at EINVAL or after a short
  /// transfer that leaves the rest unaligned (not whole 512-byte blocks), for the caller to move
  /// it buffered. Other errors, a write that makes no progress and a file that ends before the
  /// read does throw errc::io_error naming the file.
  template <class Byte>
  std::uint64_t transfer_loop(Byte* p, std::uint64_t bytes, std::uint64_t offset, bool direct) const {
    constexpr bool writing = std::is_const_v<Byte>;
    const std::uint64_t asked = bytes;
    while (bytes > 0) {
      const std::size_t n = bytes > (std::uint64_t{1} << 30) ? std::size_t{1} << 30 : static_cast<std::size_t>(bytes);
      ssize_t m = 0;
      if constexpr (writing)
        m = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      else
        m = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (m < 0) {
        if (errno == EINTR) continue;
        if (direct && errno == EINVAL) break;
        io_fail(std::string(writing ? "cannot write " : "cannot read ") + std::to_string(bytes) + " bytes at offset " +
                    std::to_string(offset) + " of",
                path_, errno);
      }
      if (m == 0 && writing)
        io_fail("cannot write (no progress) at offset " + std::to_string(offset) + " of", path_, ENOSPC);
      if (m == 0)
        throw error(errc::io_error, "file '" + path_.string() + "' ends at byte " + std::to_string(offset) +
                                        " (truncated): " + std::to_string(bytes) + " more bytes were expected");
      p += m;
      bytes -= static_cast<std::uint64_t>(m);
      offset += static_cast<std::uint64_t>(m);
      if (direct && m % 512 != 0) break;  // the rest is no longer block-aligned: the caller moves it buffered
    }
    return asked - bytes;
  }
  file(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
#if defined(O_DIRECT)
  /// `open_direct` with `flags` (the access mode and more): the regular file `path` opened with
  /// O_DIRECT and made blocking, or std::nullopt.
  static std::optional<file> open_direct_with(const std::filesystem::path& path, int flags) noexcept {
    if (test_direct_refusal.load() == direct_refusal::at_open) return std::nullopt;
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_DIRECT | O_NONBLOCK);
    if (fd < 0) return std::nullopt;
    file f(fd, path);
    if (f.kind() == S_IFREG && f.set_blocking_noexcept()) return f;
    return std::nullopt;
  }
#endif
  /// The S_IFMT bits of the open file's mode (0 when fstat fails).
  unsigned kind() const noexcept {
    struct stat st {};
    return ::fstat(fd_, &st) == 0 ? static_cast<unsigned>(st.st_mode & S_IFMT) : 0u;
  }
  /// Throws errc::io_error unless the open file is a regular file ("cannot <use> ... it is a FIFO").
  void require_regular(const char* use) const {
    const unsigned k = kind();
    if (k != S_IFREG)
      throw error(errc::io_error, std::string("cannot ") + use + " '" + path_.string() + "': it is " +
                                      file_kind_name(k) + ", not a regular file");
  }
  /// Clears O_NONBLOCK (set only so that the open could not block); false when fcntl fails.
  bool set_blocking_noexcept() noexcept {
    const int flags = ::fcntl(fd_, F_GETFL);
    return flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) == 0;
  }
  void set_blocking() {
    if (!set_blocking_noexcept()) io_fail("cannot clear O_NONBLOCK on", path_, errno);
  }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  std::filesystem::path path_;
};

/// fsync of directory `dir`: a rename or a file created in it is durable.
inline void sync_directory(const std::filesystem::path& dir) {
  file d = file::open_directory(dir);
  d.sync();
  d.close();
}

/// fsyncs every one of `files` (files or directories) at once, one thread each beyond the
/// first, so that the file system can commit them together; throws the first failure.
inline void sync_all(std::initializer_list<file*> files) {
  std::vector<std::exception_ptr> failures(files.size());
  std::vector<std::thread> threads;
  std::size_t i = 0;
  for (file* f : files) {
    auto one = [f, &failures, i] {
      try {
        f->sync();
      } catch (...) { failures[i] = std::current_exception(); }
    };
    if (i + 1 == files.size())
      one();
    else
      threads.emplace_back(one);
    ++i;
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : failures)
    if (e) std::rethrow_exception(e);
}

/// Creates directory `dir` (and its parents); an existing one is fine.
inline void make_directories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) io_fail("cannot create directory", dir, ec.value());
}

/// Writes `bytes` bytes to a new file `path` and fsyncs it (no directory sync).
inline void write_whole_file(const std::filesystem::path& path, const void* data, std::uint64_t bytes) {
  file f = file::create(path);
  f.write_at(data, bytes, 0);
  f.sync();
  f.close();
}

/// Replaces `path` atomically with `contents`: writes "<path>.tmp", fsyncs it, renames it over
/// `path` and fsyncs the directory. A crash at any point leaves the old or the new file whole.
inline void replace_file_atomically(const std::filesystem::path& path, const std::string& contents) {
  require_replaceable(path, "replace");
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  file f = file::create(tmp);  // refuses anything but a regular file there, removing nothing
  try {
    f.write_at(contents.data(), contents.size(), 0);
    f.sync();
    f.close();
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_fail("cannot rename '" + tmp.string() + "' to", path, errno);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);  // the regular file this call created
    throw;
  }
  sync_directory(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

/// The whole contents of a (small) file. A file larger than `max_bytes` is refused by name and
/// size before anything is read (errc::io_error).
inline std::string read_whole_file(const std::filesystem::path& path,
                                   std::uint64_t max_bytes = std::uint64_t{1} << 31) {
  file f = file::open_read(path);
  if (f.size() > max_bytes)
    throw error(errc::io_error, "file '" + path.string() + "' has " + std::to_string(f.size()) +
                                    " bytes, more than the " + std::to_string(max_bytes) + " it may have");
  std::string s(static_cast<std::size_t>(f.size()), '\0');
  f.read_at(s.data(), s.size(), 0);
  return s;
}

/// Renames directory `from` to `to`; when `to` exists, the two are exchanged atomically (so `to`
/// is never missing) and `from` then names the old directory. Returns true when they were exchanged.
inline bool rename_or_exchange(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return false;
  if (errno != EEXIST) io_fail("cannot rename '" + from.string() + "' to", to, errno);
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0)
    io_fail("cannot exchange '" + from.string() + "' with", to, errno);
  return true;
}

/// Removes `path` and everything below it; a missing path is fine.
inline void remove_tree(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) io_fail("cannot remove", path, ec.value());
}

}  // namespace ringzero::checkpoint::detail
