// The aligned shard-file layout and the reads that bypass the page cache: every fragment of a
// new save starts at a 4096-aligned offset (padding tensors fill the gaps, Python-readable as
// plain safetensors), checkpoints of the older unaligned layout still load bit for bit, and a
// load reads with O_DIRECT where it can and buffered where O_DIRECT is refused (at open, as
// file systems without it do, or at the read), with the same bytes and the same checksum checks;
// a save writes page-aligned pieces with O_DIRECT and the same file bytes when it is refused.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "checkpoint_test_util.hpp"

using namespace ckpt_test;
namespace ck = ringzero::checkpoint;

namespace {

/// Drops every file under `dir` from the page cache (written back first), as a cold load finds them.
void evict_tree(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

/// Rewrites the checkpoint in `dir` as saves before the aligned layout wrote it: each shard file's
/// fragments contiguous after a header padded to 8 bytes, no padding tensors; the index's offsets
/// and file sizes follow. Returns how many fragments no longer start at a multiple of 4096.
int unalign(const fs::path& dir) {
  ck::checkpoint_index index = ck::read_index(dir);
  std::map<std::string, std::uint64_t> moved;  // "<file>/<key>" -> new offset
  for (std::size_t i = 0; i < index.files.size(); ++i) {
    const fs::path path = dir / index.files[i].name;
    const ck::safetensors_header h = ck::read_safetensors_header(path);
    const std::string old = read_text(path);
    std::vector<ck::safetensors_entry> entries;
    std::string data;
    std::vector<std::uint64_t> relative;
    for (const ck::safetensors_tensor& t : h.tensors) {
      if (t.name.rfind("__padding__.", 0) == 0) continue;
      REQUIRE(t.type.has_value());
      entries.push_back({t.name, *t.type, t.shape, t.end - t.begin});
      relative.push_back(data.size());
      data.append(old, static_cast<std::size_t>(t.begin), static_cast<std::size_t>(t.end - t.begin));
    }
    const std::string header = ck::encode_safetensors_header(entries, h.metadata);
    CHECK(header.size() % 8 == 0);
    for (std::size_t k = 0; k < entries.size(); ++k)
      moved[std::to_string(i) + "/" + entries[k].name] = header.size() + relative[k];
    write_text(path, header + data);
    index.files[i].bytes = header.size() + data.size();
  }
  int unaligned = 0;
  for (ck::tensor_record& t : index.tensors)
    for (ck::fragment_record& f : t.fragments) {
      const auto it =
          moved.find(std::to_string(f.file) + "/" + ck::fragment_key(t.name, t.role, t.state, f.begin, f.end));
      REQUIRE(it != moved.end());
      f.offset = it->second;
      unaligned += f.offset % 4096 != 0 ? 1 : 0;
    }
  write_text(dir / std::string(ck::index_file_name), index.to_json().dump(1));
  return unaligned;
}

/// Parameters large enough for reads of at least 64 KiB per fragment, and small ones next to them.
std::vector<parameter_spec> large_parameters() {
  auto spec = [](std::string name, std::vector<std::uint64_t> shape, std::string unit) {
    parameter_spec p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.unit = std::move(unit);
    return p;
  };
  return {spec("big.w", {300, 257}, "u0"), spec("big.b", {1001}, "u0"), spec("mid.w", {129, 251}, "u1"),
          spec("tiny", {3}, "u1")};
}

/// RAII for the O_DIRECT refusal test hook.
struct refusal_scope {
  explicit refusal_scope(ck::detail::direct_refusal r) { ck::detail::test_direct_refusal.store(r); }
  ~refusal_scope() { ck::detail::test_direct_refusal.store(ck::detail::direct_refusal::none); }
  refusal_scope(const refusal_scope&) = delete;
  refusal_scope& operator=(const refusal_scope&) = delete;
};

/// Makes `file::cached` answer `v` for the scope: the reader's choice between direct and buffered
/// reads then depends on alignment and refusals alone, not on which pages the kernel kept.
struct page_cache_scope {
  explicit page_cache_scope(ck::detail::page_cache_view v) { ck::detail::test_page_cache.store(v); }
  ~page_cache_scope() { ck::detail::test_page_cache.store(ck::detail::page_cache_view::probe); }
  page_cache_scope(const page_cache_scope&) = delete;
  page_cache_scope& operator=(const page_cache_scope&) = delete;
};

/// Bytes of `index`'s fragments that lie in whole 4096-byte blocks from each fragment's start:
/// what an aligned read of every fragment sends with O_DIRECT (the partial last blocks go buffered).
std::uint64_t whole_block_bytes(const ck::checkpoint_index& index) {
  std::uint64_t sum = 0;
  for (const auto& t : index.tensors)
    for (const auto& f : t.fragments) sum += (f.end - f.begin) * ringzero::dtype_size(t.type) / 4096 * 4096;
  return sum;
}

/// One float32 tensor of `n` elements whose element j holds `value(j)`, saved as 2 ranks' pieces
/// [0, split) and [split, n) into a checkpoint under `root` (written with the aligned layout).
float value(std::uint64_t j) { return static_cast<float>(j % 10007) * 0.25f - static_cast<float>(j % 13); }
fs::path write_one_tensor(const fs::path& root, std::uint64_t n, std::uint64_t split) {
  ck::state_layout L;
  L.kind = "replicated";
  L.world_size = 2;
  ck::tensor_spec t;
  t.name = "w";
  t.shape = {n};
  L.tensors = {t};
  L.pieces = {{{0, 0, split}}, {{0, split, n}}};
  std::vector<float> all(static_cast<std::size_t>(n));
  for (std::uint64_t j = 0; j < n; ++j) all[static_cast<std::size_t>(j)] = value(j);
  const std::string name = "one";
  const fs::path tmp = ck::temporary_directory(root, name);
  fs::create_directories(tmp);
  std::vector<std::vector<std::uint64_t>> sums;
  for (int r = 0; r < 2; ++r) {
    const ck::piece& p = L.pieces[static_cast<std::size_t>(r)][0];
    const auto* src = reinterpret_cast<const unsigned char*>(all.data() + p.begin);
    sums.push_back(
        ck::write_shard_file(tmp / ck::shard_file_name(r, 2), L, r, ck::make_shard_file_layout(L, r), {src}));
  }
  ck::commit_checkpoint(root, name, ck::make_index(L, {}, sums), 0);
  return root / name;
}

/// Flips the bits `mask` of the byte at `at` of `file` (damage a checksum must find).
void flip_bits(const fs::path& file, std::uint64_t at, unsigned char mask) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  unsigned char b = 0;
  REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(at)) == 1);
  b ^= mask;
  REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(at)) == 1);
  ::close(fd);
}

/// Elements [begin, end) of "w" read into `dst`, checked against `value`.
bool reads_right(ck::fragment_reader& reader, std::uint64_t begin, std::uint64_t end, float* dst) {
  const ck::tensor_record* t = reader.index().find("w", ck::tensor_role::parameter);
  REQUIRE(t != nullptr);
  std::memset(dst, 0xff, static_cast<std::size_t>(end - begin) * sizeof(float));
  reader.read(*t, begin, end, dst);
  for (std::uint64_t j = begin; j < end; ++j) {
    const float want = value(j);
    if (std::memcmp(&dst[j - begin], &want, sizeof want) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("aligned layout: every fragment of a new save starts at a multiple of 4096; padding tensors fill the gaps") {
  scratch_dir root("aligned");
  local::launch(3, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    train(m, comm.rank(), 0, 2);
    ck::checkpointer(root.path).save(m);
  });
  const fs::path dir = latest_dir(root.path);
  const ck::checkpoint_index index = ck::read_index(dir);
  std::size_t fragments = 0, paddings = 0;
  for (const auto& t : index.tensors)
    for (const auto& f : t.fragments) {
      CHECK(f.offset % ck::shard_data_alignment == 0);
      ++fragments;
    }
  CHECK(fragments > 20);
  for (const auto& file : index.files) {
    // The header parses (the tensors tile the data section) and the padding is zeros of type U8.
    const auto h = ck::read_safetensors_header(dir / file.name);
    CHECK(h.data_start % 4096 == 0);
    const std::string bytes = read_text(dir / file.name);
    for (const auto& t : h.tensors) {
      if (t.name.find('#') != std::string::npos) continue;
      CHECK(t.name.rfind("__padding__.", 0) == 0);
      CHECK(t.dtype_name == "U8");
      CHECK(t.end - t.begin < 4096);
      CHECK(t.end % 4096 == 0);
      CHECK(bytes.find_first_not_of('\0', static_cast<std::size_t>(t.begin)) >= t.end);
      ++paddings;
    }
  }
  CHECK(paddings > 0);
  ck::state_layout empty;
  empty.pieces.resize(1);
  CHECK(ck::make_shard_file_layout(empty, 0).header.size() == 4096);
  CHECK_THROWS_AS((void)ck::encode_safetensors_header({}, {}, 12), ringzero::error);
}

TEST_CASE("a checkpoint of the older unaligned layout loads bit for bit, at the same and at another world size") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    scratch_dir root("unaligned");
    std::vector<std::vector<std::vector<float>>> saved(2);
    std::vector<std::vector<unsigned char>> saved_optimizer(2);
    local::launch(2, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), stage), model_options(adamw()));
      initialise(m);
      train(m, comm.rank(), 0, 3);
      ck::checkpointer(root.path).save(m);
      saved[static_cast<std::size_t>(comm.rank())] = parameters_of(m);
      saved_optimizer[static_cast<std::size_t>(comm.rank())] = optimizer_bytes(m);
    });
    const auto aligned = full_tensors(root.path);
    CHECK(unalign(latest_dir(root.path)) > 0);
    CHECK(full_tensors(root.path) == aligned);
    local::launch(2, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), stage), model_options(adamw()));
      ck::checkpointer(root.path).load(m, root.path);
      CHECK(same_bits(parameters_of(m), saved[0]));
      CHECK(optimizer_bytes(m) == saved_optimizer[static_cast<std::size_t>(comm.rank())]);
      CHECK(m.optimizer().steps() == 3);
    });
    std::vector<std::vector<std::vector<float>>> resharded(3);
    local::launch(3, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
      ck::load(m, root.path);
      resharded[static_cast<std::size_t>(comm.rank())] = parameters_of(m);
    });
    for (const auto& r : resharded) CHECK(same_bits(r, saved[0]));
  }
}

TEST_CASE("O_DIRECT reads: straight into page-aligned memory where aligned, buffered elsewhere, same bytes") {
  scratch_dir root("direct");
  constexpr std::uint64_t n = 3 * (std::uint64_t{1} << 20) + 12345;  // 12 MiB and an odd tail: 3 chunks + part
  const fs::path dir = write_one_tensor(root.path, n, 1536 * 1024);  // both pieces page-congruent
  const ck::checkpoint_index index = ck::read_index(dir);
  for (const auto& t : index.tensors)
    for (const auto& f : t.fragments) CHECK(f.offset % 4096 == 0);
  const bool direct_possible = ck::detail::file::open_direct(dir / index.files[0].name).has_value();
  if (!direct_possible) MESSAGE("this file system refuses O_DIRECT: only the buffered reads are checked");
  ck::detail::staging_buffer memory(n * sizeof(float) + 8192, false);  // page-aligned
  auto* base = reinterpret_cast<float*>(memory.data());
  // Which pages the kernel keeps is its choice (eviction is advice), so the direct/buffered
  // choice is checked with `cached` answering "not cached" (or "cached") for the reader; the
  // kernel's own answer is checked apart, below.
  using ck::detail::page_cache_view;
  SUBCASE("the whole tensor into page-aligned memory, not cached: every whole block direct") {
    page_cache_scope cold(page_cache_view::cold);
    evict_tree(dir);
    ck::fragment_reader reader(dir, index);
    CHECK(reads_right(reader, 0, n, base));
    CHECK(reader.bytes_read() == n * sizeof(float));
    const std::uint64_t whole = whole_block_bytes(index);
    CHECK(whole == n * sizeof(float) / 4096 * 4096);  // both fragments start aligned; one partial block
    CHECK(reader.bytes_read_direct() == (direct_possible ? whole : 0));
  }
  SUBCASE("congruent but not aligned: head and tail buffered, the middle direct") {
    page_cache_scope cold(page_cache_view::cold);
    ck::fragment_reader reader(dir, index);
    // Elements from 1: file offset 4 past an aligned one, memory 4 past a page.
    CHECK(reads_right(reader, 1, n - 1, base + 1));
    // (The partial first chunk goes through the reader's own buffer, direct or not as the
    // allocator aligned it; the chunks after it go straight into `base`.)
    if (direct_possible) CHECK(reader.bytes_read_direct() > 0);
  }
  SUBCASE("not congruent (memory one element off): buffered") {
    page_cache_scope cold(page_cache_view::cold);
    ck::fragment_reader reader(dir, index);
    CHECK(reads_right(reader, 0, n, base + 1));
    CHECK(reader.bytes_read_direct() == 0);
  }
  SUBCASE("data in the page cache: buffered") {
    page_cache_scope warm(page_cache_view::warm);
    ck::fragment_reader reader(dir, index);
    CHECK(reads_right(reader, 0, n, base));
    CHECK(reader.bytes_read_direct() == 0);
  }
  SUBCASE("the kernel's answer: a page just read is cached; cold or not, the bytes are the same") {
    const ck::fragment_record& f = index.tensors[0].fragments[1];
    const ck::detail::file file = ck::detail::file::open_read(dir / index.files[f.file].name);
    const std::uint64_t at = f.offset + 4096 * 7 + 5;
    bool seen = false;  // a page can be evicted between the read and the probe: three tries
    for (int attempt = 0; attempt < 3 && !seen; ++attempt) {
      unsigned char byte = 0;
      file.read_at(&byte, 1, at);
      seen = file.cached(at);
    }
    CHECK(seen);
    evict_tree(dir);
    ck::fragment_reader reader(dir, index);
    CHECK(reads_right(reader, 0, n, base));
  }
  SUBCASE("O_DIRECT refused at open (as on file systems without it): buffered, same bytes") {
    page_cache_scope cold(page_cache_view::cold);
    refusal_scope refuse(ck::detail::direct_refusal::at_open);
    evict_tree(dir);
    ck::fragment_reader reader(dir, index);
    CHECK(reads_right(reader, 0, n, base));
    CHECK(reader.bytes_read_direct() == 0);
  }
  SUBCASE("O_DIRECT refused at the read (EINVAL): buffered from there on, same bytes") {
    page_cache_scope cold(page_cache_view::cold);
    refusal_scope refuse(ck::detail::direct_refusal::at_read);
    evict_tree(dir);
    ck::fragment_reader reader(dir, index);
    CHECK(reads_right(reader, 0, n, base));
    CHECK(reads_right(reader, 5, n - 3, base + 5));
    CHECK(reader.bytes_read_direct() == 0);
  }
  SUBCASE("a flipped byte in a directly read chunk is a checksum mismatch") {
    const fs::path file = dir / index.files[1].name;
    const ck::tensor_record* t = index.find("w", ck::tensor_role::parameter);
    REQUIRE(t != nullptr);
    flip_bits(file, t->fragments[1].offset + 5 * 1000 * 1000 + 3, 0x10);
    page_cache_scope cold(page_cache_view::cold);
    ck::fragment_reader reader(dir, index);
    CHECK_THROWS_WITH_AS(reader.read(*t, 0, n, base), doctest::Contains("checksum mismatch"), ringzero::error);
    if (direct_possible) CHECK(reader.bytes_read_direct() > 0);
  }
}

TEST_CASE("deferred verification: the same bytes, and a flipped byte raised by finish_verification, never lost") {
  scratch_dir root("deferred");
  constexpr std::uint64_t n = 5 * (std::uint64_t{1} << 20) + 333;  // 20 MiB and a tail: 6 chunks, two fragments
  const fs::path dir = write_one_tensor(root.path, n, 3 * (std::uint64_t{1} << 20));
  const ck::checkpoint_index index = ck::read_index(dir);
  ck::detail::staging_buffer memory(n * sizeof(float) + 8192, false);
  auto* base = reinterpret_cast<float*>(memory.data());
  SUBCASE("intact: every range reads right, direct or buffered, and finish_verification is quiet") {
    for (auto view : {ck::detail::page_cache_view::cold, ck::detail::page_cache_view::warm}) {
      page_cache_scope scope(view);
      ck::fragment_reader reader(dir, index);
      reader.defer_verification();
      CHECK(reads_right(reader, 0, n, base));
      CHECK_NOTHROW(reader.finish_verification());     // before `base` is written again
      CHECK(reads_right(reader, 7, n - 5, base + 7));  // partial chunks at both ends: through scratch
      CHECK_NOTHROW(reader.finish_verification());
      CHECK(reads_right(reader, 1 << 20, 3 << 20, base));  // usable after finishing
      CHECK_NOTHROW(reader.finish_verification());
    }
  }
  SUBCASE("a flipped byte in the first fragment: the later reads go on, then the mismatch is raised once") {
    const ck::tensor_record* t = index.find("w", ck::tensor_role::parameter);
    REQUIRE(t != nullptr);
    const fs::path file = dir / index.files[t->fragments[0].file].name;
    flip_bits(file, t->fragments[0].offset + 4 * 1000 * 1000 + 1, 0x01);  // inside chunk 0
    for (auto view : {ck::detail::page_cache_view::cold, ck::detail::page_cache_view::warm}) {
      page_cache_scope scope(view);
      ck::fragment_reader reader(dir, index);
      reader.defer_verification();
      reader.read(*t, 0, n, base);  // the damaged chunk is read into the caller's memory: deferred
      const std::string fragment = "fragment [0, " + std::to_string(t->fragments[0].end) + ")";
      CHECK_THROWS_WITH_AS(reader.finish_verification(), doctest::Contains(fragment.c_str()), ringzero::error);
      CHECK_NOTHROW(reader.finish_verification());  // raised once
      // Without deferral the same read throws at once.
      ck::fragment_reader at_once(dir, index);
      CHECK_THROWS_WITH_AS(at_once.read(*t, 0, n, base), doctest::Contains("checksum mismatch"), ringzero::error);
    }
    // A reader destroyed with verification pending stops its helper (no hang, no late write).
    ck::fragment_reader dropped(dir, index);
    dropped.defer_verification();
    dropped.read(*t, 0, n, base);
  }
}

TEST_CASE("a load's fresh memory: 2 MiB-aligned, zero, unmapped whole, and populated without a byte overwritten") {
  namespace zd = ringzero::zero::detail;
  // Can this kernel populate (MADV_POPULATE_WRITE, Linux 5.14)? Else only the bytes are checked.
  bool kernel_populates = false;
#if defined(MADV_POPULATE_WRITE)
  {
    void* probe = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(probe != MAP_FAILED);
    kernel_populates = ::madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
    ::munmap(probe, 4096);
  }
#endif
  auto resident_pages = [](const unsigned char* p, std::uint64_t bytes) {
    std::vector<unsigned char> v(static_cast<std::size_t>((bytes + 4095) / 4096));
    if (::mincore(const_cast<unsigned char*>(p), static_cast<std::size_t>(bytes), v.data()) != 0) return -1L;
    return static_cast<long>(std::count_if(v.begin(), v.end(), [](unsigned char c) { return (c & 1) != 0; }));
  };
  for (std::uint64_t bytes : {std::uint64_t{4096}, std::uint64_t{2} << 20, (std::uint64_t{9} << 20) + 4096 + 100}) {
    CAPTURE(bytes);
    const bool mapped = bytes >= zd::host_buffer::huge_bytes;
    ringzero::primitive::memory_counter counter;
    const unsigned char* at = nullptr;
    {
      zd::host_buffer b = zd::host_buffer::untouched(bytes, &counter);
      REQUIRE(b.bytes() == bytes);
      at = b.data();
      CHECK(counter.usage(ringzero::primitive::memory_space::host).current == bytes);
      CHECK(reinterpret_cast<std::uintptr_t>(at) % (mapped ? zd::host_buffer::huge_bytes : 4096) == 0);
      if (mapped) CHECK(resident_pages(at, bytes) == 0);  // untouched
      CHECK(std::all_of(b.data(), b.data() + bytes, [](unsigned char c) { return c == 0; }));
    }
    CHECK(counter.usage(ringzero::primitive::memory_space::host).current == 0);
    // Unmapped whole: every 2 MiB of it (mincore fails with ENOMEM on an unmapped range).
    if (mapped)
      CHECK(resident_pages(at, (bytes + zd::host_buffer::huge_bytes - 1) / zd::host_buffer::huge_bytes *
                                   zd::host_buffer::huge_bytes) == -1);
    // What was written before stays; the rest is mapped by the helper; bytes written meanwhile stay.
    zd::host_buffer fresh = zd::host_buffer::untouched(bytes);
    const std::uint64_t half = bytes / 2;
    for (std::uint64_t j = 0; j < half; ++j) fresh.data()[j] = static_cast<unsigned char>(j * 7 + 1);
    {
      ck::detail::page_populator helper({{fresh.data(), bytes}});
      for (std::uint64_t j = half; j < bytes; ++j) fresh.data()[j] = static_cast<unsigned char>(j * 7 + 1);
      helper.finish();
    }
    bool kept = true;
    for (std::uint64_t j = 0; j < bytes; ++j) kept = kept && fresh.data()[j] == static_cast<unsigned char>(j * 7 + 1);
    CHECK(kept);
    // The helper alone maps every page of an untouched block.
    if (mapped && kernel_populates) {
      zd::host_buffer alone = zd::host_buffer::untouched(bytes);
      ck::detail::page_populator({{alone.data(), bytes}}).finish();
      CHECK(resident_pages(alone.data(), bytes) == static_cast<long>((bytes + 4095) / 4096));
    }
  }
}

TEST_CASE("O_DIRECT on tmpfs (/dev/shm): whatever the file system allows, the same bytes") {
  if (!fs::is_directory("/dev/shm")) return;
  const fs::path root = fs::path("/dev/shm") / ("ringzero-ckpt-direct-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  constexpr std::uint64_t n = (std::uint64_t{1} << 20) + 77;
  const fs::path dir = write_one_tensor(root, n, 4099);
  const ck::checkpoint_index index = ck::read_index(dir);
  ck::detail::staging_buffer memory(n * sizeof(float), false);
  evict_tree(dir);
  ck::fragment_reader reader(dir, index);
  CHECK(reads_right(reader, 0, n, reinterpret_cast<float*>(memory.data())));
  fs::remove_all(root);
}

TEST_CASE("a cold load into a model with large parameters (direct reads) and with O_DIRECT refused is exact") {
  using ck::detail::direct_refusal;
  for (direct_refusal refusal : {direct_refusal::none, direct_refusal::at_open, direct_refusal::at_read})
    for (int stage : {0, 3}) {
      CAPTURE(stage);
      CAPTURE(static_cast<int>(refusal));
      scratch_dir root("direct-model");
      std::vector<std::vector<std::vector<float>>> saved(2);
      std::vector<std::vector<unsigned char>> saved_optimizer(2);
      local::launch(2, [&](communicator& comm) {
        sharded_model m(comm, request(large_parameters(), stage, 4096), model_options(adamw()));
        initialise(m);
        train(m, comm.rank(), 0, 2);
        ck::checkpointer(root.path).save(m);
        saved[static_cast<std::size_t>(comm.rank())] = parameters_of(m);
        saved_optimizer[static_cast<std::size_t>(comm.rank())] = optimizer_bytes(m);
      });
      evict_tree(root.path);
      refusal_scope refuse(refusal);
      page_cache_scope cold(ck::detail::page_cache_view::cold);  // direct reads whatever the kernel kept
      local::launch(2, [&](communicator& comm) {
        sharded_model m(comm, request(large_parameters(), stage, 4096), model_options(adamw()));
        ck::checkpointer c(root.path);
        c.load(m, root.path);  // into fresh memory
        CHECK(same_bits(parameters_of(m), saved[0]));
        CHECK(optimizer_bytes(m) == saved_optimizer[static_cast<std::size_t>(comm.rank())]);
        train(m, comm.rank(), 2, 3);
        barrier(comm);
        if (comm.rank() == 0) evict_tree(root.path);
        barrier(comm);
        c.load(m, root.path);  // into the kept memory
        CHECK(same_bits(parameters_of(m), saved[0]));
        CHECK(optimizer_bytes(m) == saved_optimizer[static_cast<std::size_t>(comm.rank())]);
      });
    }
}

TEST_CASE(
    "O_DIRECT writes: page-aligned pieces go straight to the disk; refused at open or at the write, the same file") {
  // One tensor of 2 ranks' pieces; rank 1's piece is 3 chunks and an odd tail (a partial last block).
  ck::state_layout L;
  L.kind = "replicated";
  L.world_size = 2;
  constexpr std::uint64_t n = 3 * (std::uint64_t{1} << 20) + 12345, split = 1536 * 1024;
  ck::tensor_spec t;
  t.name = "w";
  t.shape = {n};
  L.tensors = {t};
  L.pieces = {{{0, 0, split}}, {{0, split, n}}};
  ck::detail::staging_buffer aligned((n - split) * sizeof(float), false);  // page-aligned
  std::vector<float> unaligned(static_cast<std::size_t>(n - split) + 1);   // one element off a page, at least
  auto* a = reinterpret_cast<float*>(aligned.data());
  float* u = reinterpret_cast<std::uintptr_t>(unaligned.data()) % 4096 == 0 ? unaligned.data() + 1 : unaligned.data();
  for (std::uint64_t j = split; j < n; ++j) a[j - split] = u[j - split] = value(j);
  scratch_dir root("direct-write");
  const ck::shard_file_layout f = ck::make_shard_file_layout(L, 1);
  const auto* src_u = reinterpret_cast<const unsigned char*>(u);
  std::uint64_t direct = 1;
  const auto want_sums = ck::write_shard_file(root.path / "buffered", L, 1, f, {src_u}, &direct);
  CHECK(direct == 0);  // memory off a page: buffered
  CHECK(want_sums == ck::chunk_checksums(src_u, (n - split) * sizeof(float)));
  const std::string want = read_text(root.path / "buffered");
  CHECK(want.size() == f.offsets[0] + (n - split) * sizeof(float));
  const fs::path path = root.path / "direct";
  const bool direct_possible = [&] {
    ck::detail::write_whole_file(path, "", 0);
    return ck::detail::file::open_direct_write(path).has_value();
  }();
  if (!direct_possible) MESSAGE("this file system refuses O_DIRECT: only the buffered writes are checked");
  using ck::detail::direct_refusal;
  for (direct_refusal refusal : {direct_refusal::none, direct_refusal::at_open, direct_refusal::at_write}) {
    CAPTURE(static_cast<int>(refusal));
    refusal_scope refuse(refusal);
    // What the system accepted with O_DIRECT: the piece's whole blocks, or nothing when refused.
    // (Whether those pages then sit in the page cache is the file system's choice: ext4 may serve
    // a direct write through it.)
    direct = 1;
    CHECK(ck::write_shard_file(path, L, 1, f, {aligned.data()}, &direct) == want_sums);
    const std::uint64_t whole = (n - split) * sizeof(float) / 4096 * 4096;
    CHECK(direct == (direct_possible && refusal == direct_refusal::none ? whole : 0));
    CHECK(read_text(path) == want);
  }
}

TEST_CASE("saves and asynchronous saves written with O_DIRECT or refused it load bit for bit") {
  using ck::detail::direct_refusal;
  for (direct_refusal refusal : {direct_refusal::none, direct_refusal::at_open, direct_refusal::at_write})
    for (bool async : {false, true}) {
      CAPTURE(static_cast<int>(refusal));
      CAPTURE(async);
      scratch_dir root("direct-save");
      std::vector<std::vector<std::vector<float>>> saved(2);
      std::vector<std::vector<unsigned char>> saved_optimizer(2);
      {
        refusal_scope refuse(refusal);
        local::launch(2, [&](communicator& comm) {
          sharded_model m(comm, request(large_parameters(), 3, 4096), model_options(adamw()));
          initialise(m);
          train(m, comm.rank(), 0, 2);
          ck::checkpointer c(root.path);
          if (async) {
            c.async_save(m);
            c.wait();
          } else {
            c.save(m);
          }
          saved[static_cast<std::size_t>(comm.rank())] = parameters_of(m);
          saved_optimizer[static_cast<std::size_t>(comm.rank())] = optimizer_bytes(m);
        });
      }
      evict_tree(root.path);
      page_cache_scope cold(ck::detail::page_cache_view::cold);  // direct reads whatever the kernel kept
      local::launch(2, [&](communicator& comm) {
        sharded_model m(comm, request(large_parameters(), 3, 4096), model_options(adamw()));
        ck::load(m, root.path);
        CHECK(same_bits(parameters_of(m), saved[0]));
        CHECK(optimizer_bytes(m) == saved_optimizer[static_cast<std::size_t>(comm.rank())]);
        CHECK(m.optimizer().steps() == 2);
      });
    }
}
