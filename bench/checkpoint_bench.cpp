// ringzero-checkpoint-bench: save and load throughput of the checkpoint layer next to the same
// machine's sequential write and read bandwidth measured in the same run, and the time a step
// is blocked by an asynchronous save next to the copy to staging.
//
//   ringzero-checkpoint-bench --ranks 2 --state 1G --dir /var/tmp/ckpt-bench --repeat 5
//
// The model: float32 parameters of 16 Mi elements each with AdamW (12 bytes of state per
// element: parameter, exp_avg, exp_avg_sq), at stage 3, enough of them for --state bytes.
// Per repetition (medians reported; the three writes' order rotates from one to the next):
// - baseline writes: every rank writes its share of the bytes to its own file with pwrite in
//   64 MiB blocks and fsyncs it, in parallel: buffered (what dd bs=64M conv=fsync does) and with
//   O_DIRECT from page-aligned memory (dd oflag=direct conv=fsync; the save writes this way);
// - save: checkpointer::save (headers, XXH3 checksums, fsync, index, rename, latest; old
//   checkpoints are removed outside the timed region);
// - baseline reads: each rank reads its baseline file back after evicting it from the page
//   cache (posix_fadvise DONTNEED), buffered and with O_DIRECT, into memory touched before;
// - fresh memory: each rank maps its share of new memory (anonymous, huge pages advised,
//   MADV_POPULATE_WRITE), what a load into fresh memory must do besides reading: on virtual
//   machines that give freed memory back to the host (free page reporting) this is the
//   hypervisor's first touch;
// - load: checkpoint::load into a fresh model after evicting the checkpoint's files (fresh
//   memory for the copy it reads into), then checkpointer::load after evicting them again (the
//   memory it keeps: the model's previous state, exchanged at each load; allocated by the first);
//   then checkpoint::load with load_options::in_place into another new model (made before the
//   clock starts, as a trainer makes its model before resuming) after evicting them again;
// - async: the time async_save blocks the training thread (staging allocated by a first call),
//   next to the same copy done by hand right after a step: memcpy of the model's own pieces into
//   a staging buffer allocated once as the checkpointer's (pre-touched, pieces page-aligned), both
//   ranks at once; and the time of an optimizer step alone and while the background write runs.
// Throughput = total state bytes / wall time of the slowest rank. Prints a table (and --json);
// each percentage names the baseline it divides by.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ringzero/checkpoint.hpp"
#include "ringzero/checkpoint/staging_buffer.hpp"
#include "ringzero/ringzero.hpp"

#include "size_arg.hpp"

namespace rz = ringzero;
namespace ck = ringzero::checkpoint;
namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// Evicts `path` from the page cache (its pages are clean after fsync).
void evict(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
void evict_tree(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) evict(e.path());
}

constexpr std::uint64_t block = std::uint64_t{64} << 20;

/// dd-like: `bytes` from `src` to a new file in 64 MiB pwrites, then fsync.
void baseline_write(const fs::path& path, const unsigned char* src, std::uint64_t bytes) {
  ck::detail::file f = ck::detail::file::create(path);
  for (std::uint64_t at = 0; at < bytes; at += block) f.write_at(src + at, std::min(block, bytes - at), at);
  f.sync();
  f.close();
}
void baseline_read(const fs::path& path, unsigned char* dst, std::uint64_t bytes) {
  const ck::detail::file f = ck::detail::file::open_read(path);
  for (std::uint64_t at = 0; at < bytes; at += block) f.read_at(dst + at, std::min(block, bytes - at), at);
}
/// dd oflag=direct conv=fsync: `bytes` (a multiple of 4096) from page-aligned `src` with O_DIRECT.
/// False (the row is left out) where the file system refuses O_DIRECT (tmpfs).
bool baseline_write_direct(const fs::path& path, const unsigned char* src, std::uint64_t bytes) {
  ck::detail::file::create(path).close();
  std::optional<ck::detail::file> f = ck::detail::file::open_direct_write(path);
  if (!f) return false;
  for (std::uint64_t at = 0; at < bytes; at += block)
    if (f->write_direct_at(src + at, std::min(block, bytes - at), at) != std::min(block, bytes - at)) return false;
  f->sync();
  f->close();
  return true;
}
/// dd iflag=direct: `bytes` (a multiple of 4096) into page-aligned `dst` with O_DIRECT; false where refused.
bool baseline_read_direct(const fs::path& path, unsigned char* dst, std::uint64_t bytes) {
  std::optional<ck::detail::file> f = ck::detail::file::open_direct(path);
  if (!f) return false;
  for (std::uint64_t at = 0; at < bytes; at += block)
    if (f->read_direct_at(dst + at, std::min(block, bytes - at), at) != std::min(block, bytes - at)) return false;
  return true;
}
/// Maps `bytes` of new memory as a load's second copy of the state is mapped (huge pages advised,
/// populated writable), then gives it back; returns the seconds the mapping took.
double map_fresh_memory(std::uint64_t bytes) {
  const auto t0 = clock_type::now();
  rz::zero::detail::host_buffer b = rz::zero::detail::host_buffer::untouched(bytes);
  ck::detail::page_populator({{b.data(), b.bytes()}}).finish();  // as the load's helper maps it
  return seconds_since(t0);
}

/// This rank's pieces of `model`'s state as a save copies them: (memory, bytes) in file order.
std::vector<std::pair<const unsigned char*, std::uint64_t>> model_pieces(rz::zero::sharded_model& model) {
  const ck::detail::zero_tensors z(model.plan(), model.optimizer().options());
  std::vector<std::vector<ck::detail::zero_piece_source>> where;
  const ck::state_layout layout = ck::detail::zero_layout(model.plan(), model.optimizer().options(), z, &where);
  const auto rank = static_cast<std::size_t>(model.global_rank());
  std::vector<std::pair<const unsigned char*, std::uint64_t>> out;
  for (std::size_t k = 0; k < where[rank].size(); ++k)
    out.emplace_back(ck::detail::zero_source(model, where[rank][k]), layout.bytes(layout.pieces[rank][k]));
  return out;
}

struct timings {
  std::vector<double> write, write_direct, save, read, read_direct, fresh_memory, load, load_kept, load_in_place,
      blocked, memcpy_staging, step_alone, step_during;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringzero-checkpoint-bench: checkpoint save/load throughput against the disk's sequential bandwidth"};
  int ranks = 2, repeat = 3;
  std::string state_text = "1G", dir_text, json_path;
  app.add_option("--ranks", ranks, "ranks (threads of the local backend)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--state", state_text, "model state in bytes (parameters + 2 AdamW moments), e.g. 1G")
      ->capture_default_str();
  app.add_option("--dir", dir_text, "directory on the disk to measure (default: a new directory under /var/tmp)");
  app.add_option("--repeat", repeat, "repetitions (medians reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    const std::uint64_t state_bytes = rz::bench::parse_size(state_text, "--state", 1);
    const std::uint64_t per_parameter = std::uint64_t{16} << 20;  // elements
    const std::uint64_t parameters =
        std::max<std::uint64_t>(1, (state_bytes + per_parameter * 12 - 1) / (per_parameter * 12));
    const fs::path dir = dir_text.empty()
                             ? fs::path("/var/tmp") / ("ringzero-checkpoint-bench-" + std::to_string(::getpid()))
                             : fs::path(dir_text);
    fs::create_directories(dir);
    rz::zero::plan_request q;
    for (std::uint64_t p = 0; p < parameters; ++p) {
      rz::zero::parameter_spec s;
      s.name = "layer" + std::to_string(p) + ".weight";
      s.shape = {per_parameter / 4096, 4096};
      s.unit = "u" + std::to_string(p);
      q.parameters.push_back(s);
    }
    q.stage = 3;
    rz::zero::sharded_model_options options;
    options.optimizer.kind = rz::zero::optimizer_kind::adamw;
    options.optimizer.lr = 1e-3;
    const std::uint64_t total = parameters * per_parameter * 12;
    fmt::print(
        "# ringzero-checkpoint-bench: {} ranks, {} parameters of {} float32 elements, AdamW: {:.3f} GiB of state, in "
        "{}\n",
        ranks, parameters, per_parameter, static_cast<double>(total) / (1u << 30), dir.string());
    timings t;
    std::mutex mutex;
    std::uint64_t staging_bytes = 0;
    rz::local::launch(ranks, [&](rz::communicator& comm) {
      const int r = comm.rank();
      rz::zero::sharded_model model(comm, q, options);
      for (std::size_t p = 0; p < model.parameter_count(); ++p) {
        std::vector<float> v(per_parameter);
        for (std::uint64_t j = 0; j < per_parameter; ++j)
          v[j] = static_cast<float>((j * 2654435761u + p) % 1000) / 1000.0f;
        model.set_parameter(p, v);
      }
      model.step();  // moments become non-zero-sized work; the state is now "trained"
      const std::uint64_t share = total / static_cast<std::uint64_t>(ranks) / 4096 * 4096;  // O_DIRECT-sized
      ck::detail::staging_buffer source(share), sink(share);                                // page-aligned, touched
      std::memset(source.data(), 1, static_cast<std::size_t>(share));
      ck::detail::staging_buffer baseline_staging;  // the memcpy baseline's, allocated once
      ck::checkpointer ckpt(dir / "checkpoints");   // keep_last 0: removals are not timed (done below)
      auto slowest = [&](double mine) {             // the slowest rank's time, on every rank
        double all = mine;
        rz::all_reduce(comm, &all, &all, 1, rz::dtype::float64, rz::reduce_kind::max);
        return all;
      };
      auto record = [&](std::vector<double>& v, double x) {
        if (r != 0) return;
        std::lock_guard<std::mutex> lock(mutex);
        v.push_back(x);
      };
      for (int k = 0; k < repeat; ++k) {
        const fs::path base = dir / ("baseline-" + std::to_string(r));
        // The three writes in turn, their order rotating from repetition to repetition: a disk
        // (or a virtual disk's host) slowed by the writes just before falls on each alike.
        auto t0 = clock_type::now();
        for (int w = 0; w < 3; ++w) {
          rz::barrier(comm);
          t0 = clock_type::now();
          switch ((w + k) % 3) {
            case 0:
              baseline_write(base, source.data(), share);
              record(t.write, slowest(seconds_since(t0)));
              break;
            case 1: {
              const bool done = baseline_write_direct(base, source.data(), share);
              const double seconds = slowest(done ? seconds_since(t0) : -1.0);  // refused on any rank: left out
              if (seconds >= 0) record(t.write_direct, seconds);
              break;
            }
            default: ckpt.save(model, {}, "bench-" + std::to_string(k)); record(t.save, slowest(seconds_since(t0)));
          }
        }
        evict(base);
        rz::barrier(comm);
        t0 = clock_type::now();
        baseline_read(base, sink.data(), share);
        record(t.read, slowest(seconds_since(t0)));
        evict(base);
        rz::barrier(comm);
        t0 = clock_type::now();
        {
          const bool done = baseline_read_direct(base, sink.data(), share);
          const double seconds = slowest(done ? seconds_since(t0) : -1.0);
          if (seconds >= 0) record(t.read_direct, seconds);
        }

        fs::remove(base);
        if (r == 0) evict_tree(dir / "checkpoints" / ("bench-" + std::to_string(k)));
        rz::barrier(comm);
        {
          rz::zero::sharded_model fresh(comm, q, options);
          rz::barrier(comm);
          t0 = clock_type::now();
          ck::load(fresh, dir / "checkpoints");
          record(t.load, slowest(seconds_since(t0)));
          if (r == 0) evict_tree(dir / "checkpoints" / ("bench-" + std::to_string(k)));
          rz::barrier(comm);
          t0 = clock_type::now();
          ckpt.load(fresh, dir / "checkpoints");  // memory kept by the checkpointer (the first one allocates it)
          record(t.load_kept, slowest(seconds_since(t0)));
        }
        {
          rz::zero::sharded_model resumed(comm, q, options);  // made (its memory mapped) before the clock starts
          if (r == 0) evict_tree(dir / "checkpoints" / ("bench-" + std::to_string(k)));
          ck::load_options in_place;
          in_place.in_place = true;
          rz::barrier(comm);
          t0 = clock_type::now();
          ck::load(resumed, dir / "checkpoints", in_place);
          record(t.load_in_place, slowest(seconds_since(t0)));
        }
        // Asynchronous: the first call allocates the staging buffer; the measured one reuses it.
        if (k == 0) {
          ckpt.async_save(model, {}, "async-warm");
          ckpt.wait();
        }
        rz::barrier(comm);
        t0 = clock_type::now();
        model.step();
        record(t.step_alone, slowest(seconds_since(t0)));
        rz::barrier(comm);
        t0 = clock_type::now();
        ckpt.async_save(model, {}, "async-" + std::to_string(k));
        record(t.blocked, slowest(seconds_since(t0)));
        t0 = clock_type::now();
        model.step();  // runs while the background thread writes
        record(t.step_during, slowest(seconds_since(t0)));
        ckpt.wait();
        if (r == 0) {
          staging_bytes = ckpt.staging_bytes();
          for (const std::string& old : {"bench-" + std::to_string(k), "async-" + std::to_string(k)})
            fs::remove_all(dir / "checkpoints" / old);
        }
        // Like with like: the save's own copy done by hand, right after a step as the save's is: the
        // model's own pieces (the sources the save copies) into a staging buffer allocated once as
        // the checkpointer's (pre-touched, each piece at a page-aligned place), both ranks at once.
        const std::vector<std::pair<const unsigned char*, std::uint64_t>> pieces = model_pieces(model);
        if (baseline_staging.empty()) baseline_staging = ck::detail::staging_buffer(ckpt.staging_bytes());
        model.step();
        rz::barrier(comm);
        t0 = clock_type::now();
        unsigned char* to = baseline_staging.data();
        for (const auto& [from, bytes] : pieces) {
          std::memcpy(to, from, static_cast<std::size_t>(bytes));
          to += (bytes + 4095) / 4096 * 4096;
        }
        record(t.memcpy_staging, slowest(seconds_since(t0)));
        // Last, so that the memory it maps and gives back does not serve the next load (a virtual
        // machine with free page reporting hands it to the host a few seconds later).
        rz::barrier(comm);
        record(t.fresh_memory, slowest(map_fresh_memory(share)));
      }
    });
    const double gib = static_cast<double>(total) / (1u << 30);
    auto gibs = [&](const std::vector<double>& v) { return gib / median(v); };
    fmt::print("{:<48} {:>10} {:>12}\n", "measurement (median of " + std::to_string(repeat) + ")", "seconds", "GiB/s");
    auto row = [&](const char* what, const std::vector<double>& v) {
      if (v.empty())
        fmt::print("{:<48} {:>10} {:>12}   (the file system refuses O_DIRECT)\n", what, "-", "-");
      else
        fmt::print("{:<48} {:>10.3f} {:>12.3f}\n", what, median(v), gibs(v));
    };
    // `v` against two baselines: percent of their throughput (their time over v's).
    auto percent = [&](const std::vector<double>& base, const std::vector<double>& v, const char* name) {
      return base.empty() ? fmt::format("no {}", name)
                          : fmt::format("{:.0f}% of the {}", 100.0 * median(base) / median(v), name);
    };
    auto against = [&](const char* what, const std::vector<double>& v, const char* name1,
                       const std::vector<double>& base1, const char* name2, const std::vector<double>& base2) {
      fmt::print("{:<48} {:>10.3f} {:>12.3f}   {}, {}\n", what, median(v), gibs(v), percent(base1, v, name1),
                 percent(base2, v, name2));
    };
    row("sequential write + fsync, buffered (dd-like)", t.write);
    row("sequential write + fsync, O_DIRECT", t.write_direct);
    against("checkpoint save", t.save, "O_DIRECT write", t.write_direct, "buffered write", t.write);
    row("sequential read, cold cache, buffered", t.read);
    row("sequential read, cold cache, O_DIRECT", t.read_direct);
    row("mapping fresh memory of the same bytes", t.fresh_memory);
    against("checkpoint load (reshard-capable), cold", t.load, "buffered read", t.read, "O_DIRECT read", t.read_direct);
    against("checkpointer::load (memory kept), cold", t.load_kept, "buffered read", t.read, "O_DIRECT read",
            t.read_direct);
    against("checkpoint load in place (fresh model), cold", t.load_in_place, "buffered read", t.read, "O_DIRECT read",
            t.read_direct);
    fmt::print("{:<48} {:>10.3f}\n", "async_save: training thread blocked", median(t.blocked));
    fmt::print("{:<48} {:>10.3f}   ({:.3f} GiB per rank)\n", "memcpy of the same bytes to staging",
               median(t.memcpy_staging), static_cast<double>(staging_bytes) / (1u << 30));
    fmt::print("{:<48} {:>10.3f}\n", "optimizer step alone", median(t.step_alone));
    fmt::print("{:<48} {:>10.3f}\n", "optimizer step during the background write", median(t.step_during));
    if (!json_path.empty()) {
      nlohmann::json j = {{"ranks", ranks},
                          {"state_bytes", total},
                          {"write_s", t.write},
                          {"write_direct_s", t.write_direct},
                          {"save_s", t.save},
                          {"read_s", t.read},
                          {"read_direct_s", t.read_direct},
                          {"fresh_memory_s", t.fresh_memory},
                          {"load_s", t.load},
                          {"load_kept_s", t.load_kept},
                          {"load_in_place_s", t.load_in_place},
                          {"async_blocked_s", t.blocked},
                          {"memcpy_staging_s", t.memcpy_staging},
                          {"step_alone_s", t.step_alone},
                          {"step_during_write_s", t.step_during}};
      std::ofstream(json_path) << j.dump(1) << "\n";
    }
    if (dir_text.empty()) fs::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ringzero-checkpoint-bench: {}\n", rz::error_text(e));
    return 1;
  }
}
