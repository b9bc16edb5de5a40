#pragma once
/// @file
/// `checkpoint::fragment_reader`: reads any global element range of any tensor of a checkpoint
/// directory, touching only the bytes it needs (pread of the 4 MiB checksum chunks that cover
/// the range) and verifying every chunk it reads against the index's XXH3 checksums. It needs
/// no communicator: a rank reads what its new plan needs, and a tool (inspect, verify,
/// consolidate, reshard) streams tensors with bounded memory.
/// Files are opened on first use, advised as read sequentially; a file whose size differs from
/// the index's is refused (truncated or replaced), as is a missing one. Reads go by 16 MiB
/// (64 MiB when direct). A read whose file offset and destination address are congruent
/// modulo 4096 (an aligned shard file read into page-aligned memory) and whose data is not in
/// the page cache goes with O_DIRECT straight into the destination (no copy out of the page
/// cache), its unaligned head and tail buffered; elsewhere (file systems that refuse O_DIRECT,
/// unaligned files of older saves, cached data) reads are buffered, the kernel reading the next
/// 64 MiB (posix_fadvise WILLNEED) while a run's checksums are computed. Every byte is verified:
/// as it is read, or, after `defer_verification()`, on a helper thread while the next reads run
/// (a load: the disk is then never idle while checksums are computed), its errors raised by
/// `finish_verification`.
/// Errors: errc::io_error naming the file, the rank that wrote it, the tensor, the fragment and
/// what was expected. Thread semantics: one thread at a time per reader (and its own helper).
/// Needs nlohmann/json and libxxhash (`ringzero-checkpoint`).

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/checksum.hpp"
#include "ringzero/checkpoint/file_io.hpp"

namespace ringzero::checkpoint {

/// See the file comment.
class fragment_reader {
 public:
  /// A reader of the checkpoint in `dir` described by `index` (both must outlive it).
  fragment_reader(std::filesystem::path dir, const checkpoint_index& index)
      : dir_(std::move(dir)), index_(&index), files_(index.files.size()), direct_(index.files.size()) {}
  /// Refused: the reader keeps a pointer to the index, which a temporary would leave dangling.
  fragment_reader(std::filesystem::path dir, checkpoint_index&& index) = delete;
  fragment_reader(const fragment_reader&) = delete;
  fragment_reader& operator=(const fragment_reader&) = delete;
  /// Stops the verification helper, if any, without waiting for what it has left.
  ~fragment_reader() { stop_helper(); }

  /// From now on, chunks read straight into a caller's memory are verified on a helper thread
  /// while the reads go on (the memory must stay as read until `finish_verification`); chunks
  /// read through scratch memory are still verified at once. Runs inline where no thread can
  /// be started.
  void defer_verification() {
    if (helper_.joinable()) return;
    try {
      helper_ = std::thread([this] { verify_loop(); });
    } catch (const std::system_error&) {}  // verified as read
  }
  /// Waits until every deferred chunk is verified; throws the first mismatch the helper found
  /// (the error `read` would have thrown; an error `read` raised itself meanwhile, such as a
  /// mismatch in a chunk read through scratch or a truncated file, came first). The reader stays
  /// usable, still deferring.
  void finish_verification() {
    wait_verified();
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  /// The index.
  const checkpoint_index& index() const noexcept { return *index_; }
  /// The directory.
  const std::filesystem::path& directory() const noexcept { return dir_; }

  /// Opens every shard file and checks its size against the index (a missing or truncated
  /// file is refused naming it).
  void check_files() {
    for (std::size_t i = 0; i < files_.size(); ++i) (void)open(i);
  }

  /// Copies elements [begin, end) of tensor `t` (a record of the index; not an alias) into
  /// `dst` (end - begin elements of t.type), verifying every chunk read.
  void read(const tensor_record& t, std::uint64_t begin, std::uint64_t end, void* dst) {
    if (!t.tied_to.empty()) fail_tensor(t, "is an alias of '" + t.tied_to + "' and holds no data; read that tensor");
    if (begin > end || end > t.numel())
      fail_tensor(t, "range [" + std::to_string(begin) + ", " + std::to_string(end) + ") is outside its " +
                         std::to_string(t.numel()) + " elements");
    const std::uint64_t es = dtype_size(t.type);
    auto* out = static_cast<unsigned char*>(dst);
    try {
      for (const fragment_record& f : t.fragments) {
        const std::uint64_t lo = std::max(begin, f.begin), hi = std::min(end, f.end);
        if (lo >= hi) continue;
        read_fragment(t, f, (lo - f.begin) * es, (hi - f.begin) * es, out + (lo - begin) * es);
      }
    } catch (...) {
      wait_verified();  // the caller may free `dst` as the error unwinds: the helper leaves it first
      throw;
    }
  }

  /// Asks the kernel to start reading (posix_fadvise WILLNEED) the first `max_bytes` of the
  /// chunks that hold elements [begin, end) of tensor `t`, so a `read` that follows the current
  /// one does not wait for the disk at its start; nothing for the parts a `read` into `dst`
  /// (when given) would read with O_DIRECT. Advice only; opens the files it needs.
  void prefetch(const tensor_record& t, std::uint64_t begin, std::uint64_t end, std::uint64_t max_bytes,
                const void* dst = nullptr) {
    if (!t.tied_to.empty() || begin >= end || end > t.numel()) return;
    const std::uint64_t es = dtype_size(t.type);
    for (const fragment_record& f : t.fragments) {
      const std::uint64_t lo = std::max(begin, f.begin), hi = std::min(end, f.end);
      if (lo >= hi || max_bytes == 0) continue;
      const std::uint64_t b = (lo - f.begin) * es / checksum_chunk_bytes * checksum_chunk_bytes,
                          e = (hi - f.begin) * es;
      const std::uint64_t n = std::min(max_bytes, e - b);
      if (dst == nullptr ||
          !may_go_direct(f.file, f.offset + b,
                         reinterpret_cast<std::uintptr_t>(dst) + (lo - begin) * es - ((lo - f.begin) * es - b)))
        open(f.file).will_need(f.offset + b, n);
      max_bytes -= n;
    }
  }

  /// Reads every fragment of every tensor and verifies every checksum (what `verify` does).
  /// Memory: one chunk at a time.
  void verify_all() {
    std::vector<unsigned char> chunk;
    for (const tensor_record& t : index_->tensors)
      for (const fragment_record& f : t.fragments) {
        const std::uint64_t bytes = (f.end - f.begin) * dtype_size(t.type);
        for (std::uint64_t c = 0; c < f.checksums.size(); ++c) {
          const std::uint64_t cb = c * checksum_chunk_bytes, ce = std::min(bytes, cb + checksum_chunk_bytes);
          chunk.resize(static_cast<std::size_t>(ce - cb));
          read_chunks(t, f, c, c + 1, bytes, chunk.data());
        }
      }
  }

  /// Bytes read from files so far.
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }
  /// Of those, bytes read with O_DIRECT (straight into the destination).
  std::uint64_t bytes_read_direct() const noexcept { return bytes_direct_; }

  /// Reads at least this many bytes with O_DIRECT when the conditions allow (smaller ones buffered).
  static constexpr std::uint64_t direct_min_bytes = std::uint64_t{64} << 10;
  /// The alignment O_DIRECT reads keep (offset, length and memory): 4096, a multiple of the
  /// logical block size of common disks (512 or 4096).
  static constexpr std::uint64_t direct_alignment = 4096;

 private:
  /// True when a read at file offset `offset` of file `i` into address `dst` is congruent modulo
  /// `direct_alignment` and the file can be opened with O_DIRECT (tried once per file).
  bool may_go_direct(std::size_t i, std::uint64_t offset, std::uintptr_t dst) {
    if ((dst - offset) % direct_alignment != 0) return false;
    direct_file& d = direct_[i];
    if (!d.tried) {
      d.tried = true;
      (void)open(i);
      d.fd = detail::file::open_direct(dir_ / index_->files[i].name);
    }
    return d.fd.has_value();
  }

  /// Reads `bytes` bytes at `offset` of file `i` into `dst`: the aligned middle with O_DIRECT
  /// when `may_go_direct` and the data is not cached, the rest (or all) buffered.
  void read_range(std::size_t i, unsigned char* dst, std::uint64_t bytes, std::uint64_t offset) {
    const detail::file& buffered = open(i);
    // Cached: its first and its last byte in the page cache (data read before). A few pages that
    // an eviction left behind (posix_fadvise(DONTNEED) skips pages still in another CPU's LRU
    // batch) or that readahead brought do not make the range cached.
    if (bytes >= direct_min_bytes && may_go_direct(i, offset, reinterpret_cast<std::uintptr_t>(dst)) &&
        !(buffered.cached(offset) && buffered.cached(offset + bytes - 1))) {
      const std::uint64_t head = (direct_alignment - offset % direct_alignment) % direct_alignment;
      const std::uint64_t body = (bytes - head) / direct_alignment * direct_alignment;
      if (head != 0) buffered.read_at(dst, head, offset);
      const std::uint64_t done = direct_[i].fd->read_direct_at(dst + head, body, offset + head);
      if (done < body) direct_[i].fd.reset();  // refused (EINVAL): buffered from here on
      bytes_direct_ += done;
      const std::uint64_t at = head + done;
      if (at < bytes) buffered.read_at(dst + at, bytes - at, offset + at);
      return;
    }
    buffered.read_at(dst, bytes, offset);
  }

  const detail::file& open(std::size_t i) {
    std::optional<detail::file>& slot = files_[i];
    if (slot) return *slot;
    const file_record& r = index_->files[i];
    const std::filesystem::path path = dir_ / r.name;
    try {
      slot.emplace(detail::file::open_read(path));
    } catch (const error& e) {
      throw error(errc::io_error, "checkpoint '" + dir_.string() + "': the shard file of rank " +
                                      std::to_string(r.rank) + " is missing or unreadable: " + e.message());
    }
    slot->sequential();
    const std::uint64_t size = slot->size();
    if (size != r.bytes) {
      slot.reset();
      throw error(errc::io_error, "checkpoint '" + dir_.string() + "': shard file '" + path.string() + "' of rank " +
                                      std::to_string(r.rank) + " has " + std::to_string(size) +
                                      " bytes, the index expects " + std::to_string(r.bytes) +
                                      (size < r.bytes ? " (truncated)" : ""));
    }
    return *slot;
  }

  [[noreturn]] void fail_tensor(const tensor_record& t, const std::string& why) const {
    throw error(errc::invalid_argument, "checkpoint '" + dir_.string() + "': tensor " + t.label() + " " + why);
  }

  /// Reads chunks [c0, c1) of fragment f (of `bytes` bytes) into `dst` and verifies them.
  /// `may_defer`: dst is the caller's memory (not scratch), which may be verified later.
  void read_chunks(const tensor_record& t, const fragment_record& f, std::uint64_t c0, std::uint64_t c1,
                   std::uint64_t bytes, unsigned char* dst, bool may_defer = false) {
    const std::uint64_t b = c0 * checksum_chunk_bytes, e = std::min(bytes, c1 * checksum_chunk_bytes);
    read_range(f.file, dst, e - b, f.offset + b);
    bytes_read_ += e - b;
    if (may_defer && helper_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back({&t, &f, c0, c1, bytes, dst});
      }
      wake_.notify_one();
      return;
    }
    verify_chunks(t, f, c0, c1, bytes, dst);
  }
  /// Verifies chunks [c0, c1) of fragment f (of `bytes` bytes), read into `dst` (chunk c0 first).
  void verify_chunks(const tensor_record& t, const fragment_record& f, std::uint64_t c0, std::uint64_t c1,
                     std::uint64_t bytes, const unsigned char* dst) const {
    const std::uint64_t b = c0 * checksum_chunk_bytes;
    for (std::uint64_t c = c0; c < c1; ++c) {
      const std::uint64_t cb = c * checksum_chunk_bytes, ce = std::min(bytes, cb + checksum_chunk_bytes);
      const std::uint64_t sum = checksum(dst + (cb - b), static_cast<std::size_t>(ce - cb));
      if (sum != f.checksums[static_cast<std::size_t>(c)]) {
        const file_record& r = index_->files[f.file];
        throw error(errc::io_error, "checkpoint '" + dir_.string() + "': checksum mismatch in shard file '" +
                                        (dir_ / r.name).string() + "' of rank " + std::to_string(r.rank) + ", tensor " +
                                        t.label() + ", fragment [" + std::to_string(f.begin) + ", " +
                                        std::to_string(f.end) + "), bytes [" + std::to_string(f.offset + cb) + ", " +
                                        std::to_string(f.offset + ce) + ") of the file: XXH3 " + hex64(sum) +
                                        ", the index records " + hex64(f.checksums[static_cast<std::size_t>(c)]) +
                                        " (the data is damaged)");
      }
    }
  }

  /// Copies bytes [b, e) of fragment f into dst, reading whole chunks: runs of chunks the range
  /// covers entirely straight into dst, the partial chunks at either end through a scratch chunk.
  void read_fragment(const tensor_record& t, const fragment_record& f, std::uint64_t b, std::uint64_t e,
                     unsigned char* dst) {
    const std::uint64_t bytes = (f.end - f.begin) * dtype_size(t.type);
    // 16 MiB per buffered pread (the kernel reads ahead meanwhile), 64 MiB per direct one (no
    // read-ahead: a larger request keeps the disk's queue full), then its checksums.
    const std::uint64_t max_run_chunks =
        may_go_direct(f.file, f.offset, reinterpret_cast<std::uintptr_t>(dst) - b) ? 16 : 4;
    constexpr std::uint64_t ahead_bytes = std::uint64_t{64} << 20;  // read by the kernel meanwhile
    std::uint64_t c = b / checksum_chunk_bytes;
    while (c * checksum_chunk_bytes < e) {
      const std::uint64_t cb = c * checksum_chunk_bytes, ce = std::min(bytes, cb + checksum_chunk_bytes);
      if (cb >= b && ce <= e) {
        std::uint64_t c1 = c + 1;
        while (c1 - c < max_run_chunks && std::min(bytes, (c1 + 1) * checksum_chunk_bytes) <= e &&
               c1 * checksum_chunk_bytes < e)
          ++c1;
        const std::uint64_t run_end = std::min(e, c1 * checksum_chunk_bytes);
        if (run_end < e &&
            !may_go_direct(f.file, f.offset + run_end, reinterpret_cast<std::uintptr_t>(dst + (run_end - b))))
          open(f.file).will_need(f.offset + run_end, std::min(ahead_bytes, e - run_end));
        read_chunks(t, f, c, c1, bytes, dst + (cb - b), true);
        c = c1;
        continue;
      }
      scratch_.resize(static_cast<std::size_t>(ce - cb));
      read_chunks(t, f, c, c + 1, bytes, scratch_.data());
      const std::uint64_t lo = std::max(b, cb), hi = std::min(e, ce);
      std::memcpy(dst + (lo - b), scratch_.data() + (lo - cb), static_cast<std::size_t>(hi - lo));
      ++c;
    }
  }

  /// Chunks read, to verify on the helper thread.
  struct verify_job {
    const tensor_record* t;
    const fragment_record* f;
    std::uint64_t c0, c1, bytes;
    const unsigned char* data;
  };
  void verify_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const verify_job j = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr e;
      try {
        verify_chunks(*j.t, *j.f, j.c0, j.c1, j.bytes, j.data);
      } catch (...) { e = std::current_exception(); }
      lock.lock();
      busy_ = false;
      if (e && !failure_) failure_ = e;
      if (queue_.empty()) drained_.notify_all();
    }
  }
  /// Waits until the helper has verified every queued chunk (errors stay recorded).
  void wait_verified() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    drained_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  void stop_helper() noexcept {
    if (!helper_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    helper_.join();
  }

  std::filesystem::path dir_;
  const checkpoint_index* index_;
  struct direct_file {
    bool tried = false;
    std::optional<detail::file> fd;  ///< opened with O_DIRECT; empty when refused
  };
  std::vector<std::optional<detail::file>> files_;
  std::vector<direct_file> direct_;
  std::vector<unsigned char> scratch_;
  std::uint64_t bytes_read_ = 0;
  std::uint64_t bytes_direct_ = 0;
  std::mutex mutex_;  ///< guards the members below, shared with the helper
  std::condition_variable wake_, drained_;
  std::deque<verify_job> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr failure_;
  std::thread helper_;  ///< last: started after, and stopped before, everything it uses
};

}  // namespace ringzero::checkpoint
