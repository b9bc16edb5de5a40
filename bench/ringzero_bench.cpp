// ringzero-bench: collective throughput in the manner of nccl-tests.
//
//   ringzero-bench all_reduce -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 -d float -o sum --ranks 2 --algo auto
//
// For each size from -b to -e (multiplied by -f, or stepped by -i) and each dtype / op / root,
// it runs the collective out of place and in place, checks the result bitwise against exact
// expected values (-c 1), then times -n iterations after -w warm-up iterations and prints
// nccl-tests' columns: size (B), count (elements), type, redop, root, then per placement time
// (us, the median of the per-iteration times, each the slowest rank's), algbw and busbw (GB/s),
// %peak (the fraction of the memory-bandwidth bound reached) and #wrong. Bus-bandwidth factors
// follow nccl-tests (all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n of the
// total bytes; broadcast and reduce 1). Before the table it measures the machine's memory
// bandwidth with a STREAM-style copy on the same rank threads; docs/performance.md explains how the
// bound's bytes are counted. The exit status is non-zero when any #wrong is non-zero.
//
// Sizes: like nccl-tests, `size` is the larger of a rank's send and receive buffers; for
// reduce_scatter, all_gather and all_to_all the per-rank count is size / (elements * world size),
// rounded down to a multiple of 4 elements.
//
// MPI (when built with MPI): `mpirun -np N ringzero-bench ... --backend mpi` runs one rank per
// process with the MPI backend; rank 0 prints. `--algo native` measures MPI's own collectives.
//
// GPU (when built with the CUDA runtime): `--memory cuda` puts every rank's buffers in CUDA
// device memory; `--backend local` (default) runs the ranks as threads with the local backend on
// device memory (all ranks on one GPU unless --devices says otherwise), `--backend nccl` runs one
// rank per GPU (devices 0..ranks-1, or --devices) with the NCCL backend in this process. Inputs are written and
// results checked through host copies; each row's time is then the mean of -n back-to-back
// iterations up to the stream's completion (as nccl-tests times them), the slowest rank's. The
// bound uses the device's copy bandwidth (cudaMemcpyAsync device to device, measured by each rank
// alone) and assumes all ranks share one device's memory.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "exact_values.hpp"
#include "command_line.hpp"
#include "memory_bandwidth.hpp"
#include "ringzero/ringzero.hpp"
#if RINGZERO_HAS_CUDA
#include <cuda_runtime_api.h>

#include "ringzero/backend/local/cuda.hpp"
#endif
#if RINGZERO_HAS_NCCL
#include "ringzero/backend/nccl.hpp"
#endif
#if RINGZERO_HAS_MPI
#include "ringzero/backend/mpi.hpp"
#endif

#include "size_arg.hpp"

namespace rz = ringzero;
using ringzero::bench::parse_size;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  rz::collective_kind kind = rz::collective_kind::all_reduce;
  std::uint64_t min_bytes = 32 << 20, max_bytes = 32 << 20, step_bytes = 1 << 20;
  std::uint64_t step_factor = 1;
  int iters = 20, warmup = 5, check = 1, ranks = 0;
  std::vector<rz::dtype> dtypes{rz::dtype::float32};
  std::vector<rz::reduce_kind> ops{rz::reduce_kind::sum};
  std::vector<int> roots{0};
  rz::algorithm algo = rz::algorithm::automatic;
  bool pin = false;
  bool reproducible = false;       // --reproducible: floating sum/avg/premulsum reductions in reproducible mode
  std::string json_path;
  std::uint64_t bandwidth_bytes = 0;
  bool device_memory = false;      // --memory cuda
  std::string backend = "local";   // --backend local | nccl | mpi
  std::vector<int> devices;        // --devices (local backend on device memory)

  /// Bytes of each rank's send and receive buffers (sized for -e, reused by every row).
  std::uint64_t buffer_bytes() const { return std::max<std::uint64_t>(max_bytes, 64); }
  /// Bytes per rank of the bandwidth copy: --bandwidth-bytes, else max(buffer, 64 MiB).
  std::uint64_t copy_bytes() const { return bandwidth_bytes ? bandwidth_bytes : std::max<std::uint64_t>(buffer_bytes(), 64ull << 20); }
};

// nccl-tests' bus-bandwidth factor.
double bus_factor(rz::collective_kind k, int n) {
  const double nn = n;
  switch (k) {
    case rz::collective_kind::all_reduce: return 2.0 * (nn - 1) / nn;
    case rz::collective_kind::reduce_scatter:
    case rz::collective_kind::all_gather:
    case rz::collective_kind::all_to_all: return (nn - 1) / nn;
    default: return 1.0;
  }
}

// The least memory traffic (bytes read + written, summed over all ranks) of any shared-memory
// algorithm for the collective: every input byte read once and every output byte written once.
// `S` is the per-rank count in bytes of the collective's "whole" buffer (see docs/performance.md).
double collective_min_bytes(rz::collective_kind k, int n, double S) {
  const double nn = n;
  switch (k) {
    case rz::collective_kind::all_reduce: return nn * 2 * S;              // read S, write S per rank
    case rz::collective_kind::reduce_scatter: return nn * (S + S / nn);   // read S (n blocks), write S/n
    case rz::collective_kind::all_gather: return nn * (S / nn + S);       // read S/n own... and write S
    case rz::collective_kind::broadcast: return S + nn * S;               // root read S, every rank writes S
    case rz::collective_kind::reduce: return nn * S + S;                  // every input read, root writes S
    case rz::collective_kind::all_to_all: return nn * 2 * S;              // read S, write S per rank
    default: return 0;
  }
}

struct row_result {
  double time_us = 0, mean_us = 0, algbw = 0, busbw = 0, peak_fraction = 0;
  std::int64_t wrong = -1;  // -1: not applicable (N/A)
};

struct shared_state {
  std::mutex mutex;
  nlohmann::json rows = nlohmann::json::array();
  double busbw_sum = 0;
  int busbw_rows = 0;
  std::int64_t wrong_total = 0;
  double copy_bandwidth = 0;
};

// Elements per rank (the collective's count argument) for a size in bytes.
std::uint64_t count_for(rz::collective_kind k, std::uint64_t bytes, std::size_t es, int n) {
  const std::uint64_t elems = bytes / es;
  switch (k) {
    case rz::collective_kind::reduce_scatter:
    case rz::collective_kind::all_gather:
    case rz::collective_kind::all_to_all: return elems / (4u * static_cast<std::uint64_t>(n)) * 4u;
    default: return elems;
  }
}

/// Frees a benchmark buffer: std::free for host memory, cudaFree for device memory.
struct buffer_deleter {
  bool device = false;
  void operator()(void* p) const noexcept {
#if RINGZERO_HAS_CUDA
    if (device) {
      (void)cudaFree(p);
      return;
    }
#endif
    std::free(p);
  }
};

class rank_bench {
 public:
  /// `comm` runs the measured collectives; `host` (the same communicator on host memory, or a
  /// host communicator of a parallel local world when `comm` works on device memory) carries the
  /// benchmark's own bookkeeping (times, #wrong, barriers around the copy measurement).
  rank_bench(rz::communicator& comm, rz::communicator& host, const options& o, shared_state& shared)
      : comm_(comm), host_(host), o_(o), shared_(shared), device_(comm.space() == rz::memory_space::cuda) {
    n_ = comm.world_size();
    r_ = comm.rank();
    // Buffers allocated and touched once, reused by every row.
    buffer_bytes_ = o.buffer_bytes();
    send_ = allocate(buffer_bytes_);
    recv_ = allocate(buffer_bytes_);
    if (device_) {  // host mirrors: inputs are written and outputs checked there
      send_host_ = allocate_host(buffer_bytes_);
      recv_host_ = allocate_host(buffer_bytes_);
    }
    times_.resize(static_cast<std::size_t>(std::max(o.iters, 1)));
    slowest_.resize(times_.size());
  }

  void run() {
    measure_copy_bandwidth();
    if (r_ == 0) print_header();
    if (o_.kind == rz::collective_kind::barrier) {  // moves no data: one row of size 0, whatever -b/-e say
      run_row(0, o_.dtypes.front(), rz::reduce_kind::sum, -1);
      return;
    }
    for (std::uint64_t bytes = o_.min_bytes; bytes <= o_.max_bytes;) {
      for (rz::dtype t : o_.dtypes)
        for (rz::reduce_kind op : reduction() ? o_.ops : std::vector<rz::reduce_kind>{rz::reduce_kind::sum})
          for (int root : rooted() ? o_.roots : std::vector<int>{-1}) run_row(bytes, t, op, root);
      const std::uint64_t next = o_.step_factor > 1 ? bytes * o_.step_factor : bytes + o_.step_bytes;
      if (next <= bytes) break;
      bytes = next;
    }
  }

 private:
  using buffer = std::unique_ptr<unsigned char, buffer_deleter>;

  static buffer allocate_host(std::uint64_t bytes) {
    const std::uint64_t rounded = (bytes + 4095) / 4096 * 4096;
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(4096, rounded));
    if (!p)
      throw std::runtime_error(fmt::format("cannot allocate a {}-byte host buffer (its size comes from -e, or from "
                                           "--bandwidth-bytes for the bandwidth copy): choose smaller sizes",
                                           rounded));
    std::memset(p, 0, rounded);
    return buffer(p);
  }

  /// A buffer in the measured communicator's memory space.
  buffer allocate(std::uint64_t bytes) const {
#if RINGZERO_HAS_CUDA
    if (device_) {
      void* p = nullptr;
      rz::cudart::check(cudaMalloc(&p, bytes), "cudaMalloc (benchmark buffer)");
      rz::cudart::check(cudaMemset(p, 0, bytes), "cudaMemset");
      return buffer(static_cast<unsigned char*>(p), buffer_deleter{true});
    }
#endif
    return allocate_host(bytes);
  }

  /// Where fill() writes and verify() reads: the buffers themselves, or their host mirrors.
  unsigned char* send_view() const { return device_ ? send_host_.get() : send_.get(); }
  unsigned char* recv_view() const { return device_ ? recv_host_.get() : recv_.get(); }

  /// Device memory: copies the host mirrors' first bytes to the device buffers (before a check).
  void upload(std::uint64_t send_bytes, std::uint64_t recv_bytes) const {
#if RINGZERO_HAS_CUDA
    if (!device_) return;
    rz::cudart::check(cudaMemcpy(send_.get(), send_host_.get(), send_bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    rz::cudart::check(cudaMemcpy(recv_.get(), recv_host_.get(), recv_bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    // From pageable memory cudaMemcpy may return before its DMA lands, and the collective's
    // stream (non-blocking, or NCCL's) is not ordered after it: wait for the uploads.
    rz::cudart::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after the uploads)");
#else
    (void)send_bytes;
    (void)recv_bytes;
#endif
  }

  /// Device memory: waits for the collective and copies the receive buffer to its mirror.
  void download(std::uint64_t recv_bytes) const {
#if RINGZERO_HAS_CUDA
    if (!device_) return;
    comm_.synchronize();
    rz::cudart::check(cudaMemcpy(recv_host_.get(), recv_.get(), recv_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
#else
    (void)recv_bytes;
#endif
  }

  bool reduction() const { return rz::is_reduction(o_.kind); }
  bool rooted() const { return rz::has_root(o_.kind); }

  void measure_copy_bandwidth() {
    const std::uint64_t bytes = o_.copy_bytes();
    if (device_) return measure_device_copy_bandwidth(bytes);
    buffer a = allocate(bytes), b = allocate(bytes);
    const rz::bench::copy_bandwidth bw = rz::bench::measure_copy_bandwidth(comm_, a.get(), b.get(), bytes, 5);
    if (r_ == 0) {
      std::lock_guard<std::mutex> lock(shared_.mutex);
      shared_.copy_bandwidth = bw.best();
      fmt::print("# Memory bandwidth: STREAM-style copy of {} MiB per rank on {} rank(s) at once: loop {:.2f} GB/s, "
                 "memcpy {:.2f} GB/s (read + write bytes, median of 5)\n",
                 bytes >> 20, n_, bw.loop_gbps, bw.memcpy_gbps, bw.best());
      fmt::print("# %peak = (least bytes any shared-memory algorithm must move) / {:.2f} GB/s / time\n", bw.best());
      copy_gbps_ = bw.best();
    }
    copy_gbps_ = bw.best();
  }

  /// The device's copy bandwidth: each rank in turn copies `bytes` device to device on its
  /// stream (the others wait), median of 5; the slowest rank's result (GB/s, read + write).
  void measure_device_copy_bandwidth(std::uint64_t bytes) {
#if RINGZERO_HAS_CUDA
    buffer a = allocate(bytes), b = allocate(bytes);
    auto stream = static_cast<cudaStream_t>(comm_.cuda_stream());
    double mine = 0;
    for (int turn = 0; turn < n_; ++turn) {
      rz::barrier(host_);
      if (turn != r_) continue;
      std::vector<double> rates;
      for (int rep = 0; rep < 6; ++rep) {
        const auto t0 = clock_type::now();
        rz::cudart::check(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
        rz::cudart::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (rep > 0) rates.push_back(2.0 * static_cast<double>(bytes) / seconds / 1e9);
      }
      std::sort(rates.begin(), rates.end());
      mine = rates[rates.size() / 2];
    }
    rz::barrier(host_);
    double slowest = 0;
    mine = -mine;
    rz::all_reduce(host_, &mine, &slowest, 1, rz::dtype::float64, rz::reduce_kind::max);
    copy_gbps_ = -slowest;
    if (r_ == 0) {
      std::lock_guard<std::mutex> lock(shared_.mutex);
      shared_.copy_bandwidth = copy_gbps_;
      fmt::print("# Device copy bandwidth: cudaMemcpyAsync device to device of {} MiB, each rank alone: {:.2f} GB/s "
                 "(read + write bytes, median of 5, slowest rank)\n",
                 bytes >> 20, copy_gbps_);
      fmt::print("# %peak = (least bytes any shared-memory algorithm must move) / {:.2f} GB/s / time (ranks share one "
                 "device's memory)\n",
                 copy_gbps_);
    }
#else
    (void)bytes;
#endif
  }

  std::string backend_text() const {
    if (!device_) return std::string("the ") + std::string(rz::backend_name(comm_.backend())) + " backend";
    return std::string("the ") + std::string(rz::backend_name(comm_.backend())) + " backend on CUDA device memory";
  }

  void print_header() const {
    // auto with RINGZERO_ALGO set: the forced algorithm where it is available (the rows say).
    std::string algo(rz::algorithm_name(o_.algo));
    if (o_.algo == rz::algorithm::automatic && comm_.forced_algorithm() != rz::algorithm::automatic)
      algo += std::string(" (RINGZERO_ALGO=") + std::string(rz::algorithm_name(comm_.forced_algorithm())) + " where available)";
    fmt::print("# ringzero-bench {} : {} rank(s) on {}, algorithm {}{}\n", rz::collective_name(o_.kind), n_, backend_text(), algo,
               o_.reproducible ? ", reproducible mode (floating sum/avg/premulsum rows)" : "");
    fmt::print("# {:>10}  {:>12}  {:>8}  {:>9}  {:>4}  {:>16}  {:>40}  {:>40}\n", "", "", "", "", "", "",
               "out-of-place", "in-place");
    fmt::print("# {:>10}  {:>12}  {:>8}  {:>9}  {:>4}  {:>16}  {:>9} {:>7} {:>7} {:>6} {:>6}  {:>9} {:>7} {:>7} {:>6} {:>6}\n",
               "size", "count", "type", "redop", "root", "algo", "time", "algbw", "busbw", "%peak", "#wrong", "time",
               "algbw", "busbw", "%peak", "#wrong");
    fmt::print("# {:>10}  {:>12}  {:>8}  {:>9}  {:>4}  {:>16}  {:>9} {:>7} {:>7} {:>6} {:>6}  {:>9} {:>7} {:>7} {:>6} {:>6}\n",
               "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "");
    std::fflush(stdout);
  }

  // Buffers and counts of one row.
  struct row_setup {
    std::uint64_t count = 0;        // the collective's count argument
    std::uint64_t send_elems = 0, recv_elems = 0;
    std::uint64_t size_bytes = 0;   // max(send, recv) bytes of one rank
    double whole_bytes = 0;         // S of collective_min_bytes
  };

  row_setup setup(std::uint64_t bytes, rz::dtype t) const {
    row_setup s;
    const std::size_t es = rz::dtype_size(t);
    const std::uint64_t n = static_cast<std::uint64_t>(n_);
    s.count = count_for(o_.kind, bytes, es, n_);
    switch (o_.kind) {
      case rz::collective_kind::reduce_scatter: s.send_elems = s.count * n; s.recv_elems = s.count; break;
      case rz::collective_kind::all_gather: s.send_elems = s.count; s.recv_elems = s.count * n; break;
      case rz::collective_kind::all_to_all: s.send_elems = s.recv_elems = s.count * n; break;
      default: s.send_elems = s.recv_elems = s.count; break;
    }
    s.size_bytes = std::max(s.send_elems, s.recv_elems) * es;
    s.whole_bytes = static_cast<double>(s.size_bytes);
    return s;
  }

  // True when --reproducible applies to a row: a floating sum, avg or premulsum of all_reduce,
  // reduce_scatter or reduce (other rows run as usual: integers and min/max are exact already).
  bool reproducible_applies(rz::dtype t, rz::reduce_kind op) const {
    const bool kind = o_.kind == rz::collective_kind::all_reduce || o_.kind == rz::collective_kind::reduce_scatter ||
                      o_.kind == rz::collective_kind::reduce;
    return kind && rz::is_floating_point(t) &&
           (op == rz::reduce_kind::sum || op == rz::reduce_kind::avg || op == rz::reduce_kind::premul_sum);
  }

  // Runs the collective once with the row's arguments.
  void call(const row_setup& s, rz::dtype t, rz::reduce_kind opk, int root, bool in_place) {
    rz::collective_options opts;
    opts.algo = o_.algo;
    opts.reproducible = o_.reproducible && reproducible_applies(t, opk);
    const rz::reduce_op op = opk == rz::reduce_kind::premul_sum ? rz::reduce_op::premul_sum(rz::bench::premul_scalar) : rz::reduce_op(opk);
    const std::size_t es = rz::dtype_size(t);
    unsigned char* send = send_.get();
    unsigned char* recv = recv_.get();
    const std::uint64_t block = s.count * es, offset = static_cast<std::uint64_t>(r_) * block;
    switch (o_.kind) {
      case rz::collective_kind::all_reduce: rz::all_reduce(comm_, in_place ? recv : send, recv, s.count, t, op, opts); break;
      case rz::collective_kind::reduce_scatter:
        rz::reduce_scatter(comm_, in_place ? recv : send, in_place ? recv + offset : recv, s.count, t, op, opts);
        break;
      case rz::collective_kind::all_gather:
        rz::all_gather(comm_, in_place ? recv + offset : send, recv, s.count, t, opts);
        break;
      case rz::collective_kind::broadcast: rz::broadcast(comm_, in_place ? recv : send, recv, s.count, t, root, opts); break;
      case rz::collective_kind::reduce: rz::reduce(comm_, in_place ? recv : send, recv, s.count, t, op, root, opts); break;
      case rz::collective_kind::all_to_all: rz::all_to_all(comm_, send, recv, s.count, t, opts); break;
      default: rz::barrier(comm_, opts); break;
    }
  }

  // Writes this rank's input for the row (in place: into the receive buffer at its input's place).
  void fill(const row_setup& s, rz::dtype t, rz::reduce_kind op, bool in_place) {
    const std::size_t es = rz::dtype_size(t);
    unsigned char* recv = recv_view();
    const std::uint64_t offset = static_cast<std::uint64_t>(r_) * s.count * es;
    switch (o_.kind) {
      case rz::collective_kind::all_gather:
        rz::bench::fill_input(in_place ? recv + offset : send_view(), s.count, t, op, r_, 0);
        if (!in_place) std::memset(recv, 0xA5, s.recv_elems * es);
        break;
      default:
        rz::bench::fill_input(in_place ? recv : send_view(), s.send_elems, t, op, r_, 0);
        if (!in_place) std::memset(recv, 0xA5, s.recv_elems * es);
        break;
    }
    upload(s.send_elems * es, std::max(s.send_elems, s.recv_elems) * es);
  }

  // Counts elements of this rank's output that differ bitwise from the expected values.
  std::int64_t verify(const row_setup& s, rz::dtype t, rz::reduce_kind op, int root, bool in_place) const {
    const std::size_t es = rz::dtype_size(t);
    const unsigned char* out = recv_view();
    if (in_place && o_.kind == rz::collective_kind::reduce_scatter) out += static_cast<std::uint64_t>(r_) * s.count * es;
    std::int64_t wrong = 0;
    unsigned char expected[rz::bench::pattern_period][8];
    auto compare_reduced = [&](std::uint64_t first_global, std::uint64_t elems) {
      for (int k = 0; k < rz::bench::pattern_period; ++k) rz::bench::expected_reduction(t, op, n_, k, expected[k]);
      for (std::uint64_t i = 0; i < elems; ++i)
        if (std::memcmp(out + i * es, expected[(first_global + i) % rz::bench::pattern_period], es) != 0) ++wrong;
    };
    auto compare_copied = [&](std::uint64_t at, int source_rank, std::uint64_t source_first, std::uint64_t elems) {
      for (int k = 0; k < rz::bench::pattern_period; ++k) rz::bench::expected_copy(t, op, source_rank, static_cast<std::uint64_t>(k), expected[k]);
      for (std::uint64_t i = 0; i < elems; ++i)
        if (std::memcmp(out + (at + i) * es, expected[(source_first + i) % rz::bench::pattern_period], es) != 0) ++wrong;
    };
    switch (o_.kind) {
      case rz::collective_kind::all_reduce: compare_reduced(0, s.count); break;
      case rz::collective_kind::reduce:
        if (r_ == root) compare_reduced(0, s.count);
        break;
      case rz::collective_kind::reduce_scatter: compare_reduced(static_cast<std::uint64_t>(r_) * s.count, s.count); break;
      case rz::collective_kind::all_gather:
        for (int q = 0; q < n_; ++q) compare_copied(static_cast<std::uint64_t>(q) * s.count, q, 0, s.count);
        break;
      case rz::collective_kind::broadcast: compare_copied(0, root, 0, s.count); break;
      case rz::collective_kind::all_to_all:
        for (int q = 0; q < n_; ++q)
          compare_copied(static_cast<std::uint64_t>(q) * s.count, q, static_cast<std::uint64_t>(r_) * s.count, s.count);
        break;
      default: break;
    }
    return wrong;
  }

  double all_max(double v) {
    double out = 0;
    rz::all_reduce(host_, &v, &out, 1, rz::dtype::float64, rz::reduce_kind::max);
    return out;
  }

  std::int64_t all_sum(std::int64_t v) {
    std::int64_t out = 0;
    rz::all_reduce(host_, &v, &out, 1, rz::dtype::int64, rz::reduce_kind::sum);
    return out;
  }

  row_result measure(const row_setup& s, rz::dtype t, rz::reduce_kind op, int root, bool in_place) {
    row_result res;
    if (in_place && o_.kind == rz::collective_kind::all_to_all) return res;  // N/A, like nccl-tests' sendrecv
    if (o_.check) {
      fill(s, t, op, in_place);
      call(s, t, op, root, in_place);
      download(std::max(s.send_elems, s.recv_elems) * rz::dtype_size(t));
      res.wrong = all_sum(verify(s, t, op, root, in_place));
    } else {
      res.wrong = 0;
    }
    for (int i = 0; i < o_.warmup; ++i) call(s, t, op, root, in_place);
    if (device_) {
      // Device work is asynchronous: time the batch up to the stream's completion.
      comm_.synchronize();
      rz::barrier(host_);
      const auto t0 = clock_type::now();
      for (std::size_t i = 0; i < times_.size(); ++i) call(s, t, op, root, in_place);
      comm_.synchronize();
      const double each = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / static_cast<double>(times_.size());
      std::fill(times_.begin(), times_.end(), each);
    } else {
      rz::barrier(comm_);
      auto last = clock_type::now();
      for (std::size_t i = 0; i < times_.size(); ++i) {
        call(s, t, op, root, in_place);
        const auto now = clock_type::now();
        times_[i] = std::chrono::duration<double, std::micro>(now - last).count();
        last = now;
      }
    }
    // The slowest rank's time of each iteration, then the median and mean over iterations.
    rz::all_reduce(host_, times_.data(), slowest_.data(), slowest_.size(), rz::dtype::float64, rz::reduce_kind::max);
    std::vector<double> sorted = slowest_;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t m = sorted.size();
    res.time_us = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
    double total = 0;
    for (double x : slowest_) total += x;
    res.mean_us = total / static_cast<double>(m);
    // A barrier moves no data: no bandwidth, whatever -b/-e say.
    const bool moves_data = o_.kind != rz::collective_kind::barrier;
    res.algbw = moves_data && res.time_us > 0 ? static_cast<double>(s.size_bytes) / res.time_us / 1e3 : 0;
    res.busbw = res.algbw * bus_factor(o_.kind, n_);
    // A world of one in place has nothing to move: no bound, %peak is printed as "-".
    const double least = n_ == 1 && in_place ? 0.0 : collective_min_bytes(o_.kind, n_, s.whole_bytes);
    const double bound_us = least / (copy_gbps_ * 1e3);
    res.peak_fraction = res.time_us > 0 && least > 0 ? bound_us / res.time_us : -1;
    return res;
  }

  void run_row(std::uint64_t bytes, rz::dtype t, rz::reduce_kind op, int root) {
    const row_setup s = setup(bytes, t);
    if (s.count == 0 && bytes != 0 && o_.kind != rz::collective_kind::barrier) return;  // too small for this world
    std::string problem;
    const rz::algorithm resolved = rz::resolve_algorithm(comm_, o_.kind, s.whole_bytes, o_.algo, comm_.forced_algorithm(), problem);
    const row_result out = measure(s, t, op, root, false);
    const row_result in = measure(s, t, op, root, true);
    if (r_ != 0) return;
    auto cell = [](const row_result& x) {
      if (x.wrong < 0) return fmt::format("{:>9} {:>7} {:>7} {:>6} {:>6}", "N/A", "N/A", "N/A", "N/A", "N/A");
      if (x.peak_fraction < 0) return fmt::format("{:>9.2f} {:>7.2f} {:>7.2f} {:>6} {:>6}", x.time_us, x.algbw, x.busbw, "-", x.wrong);
      return fmt::format("{:>9.2f} {:>7.2f} {:>7.2f} {:>5.1f}% {:>6}", x.time_us, x.algbw, x.busbw, 100 * x.peak_fraction, x.wrong);
    };
    const std::string opname = reduction() ? std::string(rz::reduce_kind_name(op)) : "none";
    fmt::print("  {:>10}  {:>12}  {:>8}  {:>9}  {:>4}  {:>16}  {}  {}\n", s.size_bytes, s.size_bytes / rz::dtype_size(t),
               rz::dtype_short_name(t), opname, root, rz::algorithm_name(resolved), cell(out), cell(in));
    std::fflush(stdout);
    std::lock_guard<std::mutex> lock(shared_.mutex);
    auto json_of = [](const row_result& x) {
      if (x.wrong < 0) return nlohmann::json(nullptr);
      return nlohmann::json{{"time_us", x.time_us}, {"mean_time_us", x.mean_us}, {"algbw_gbps", x.algbw},
                            {"busbw_gbps", x.busbw}, {"peak_fraction", x.peak_fraction < 0 ? nlohmann::json(nullptr) : nlohmann::json(x.peak_fraction)},
                            {"wrong", x.wrong}};
    };
    shared_.rows.push_back({{"collective", rz::collective_name(o_.kind)}, {"size_bytes", s.size_bytes},
                            {"count", s.count}, {"type", rz::dtype_name(t)}, {"redop", opname}, {"root", root},
                            {"algorithm", rz::algorithm_name(resolved)}, {"ranks", n_},
                            {"out_of_place", json_of(out)}, {"in_place", json_of(in)}});
    for (const row_result* x : {&out, &in}) {
      if (x->wrong < 0) continue;
      shared_.busbw_sum += x->busbw;
      ++shared_.busbw_rows;
      shared_.wrong_total += x->wrong;
    }
  }

  rz::communicator& comm_;
  rz::communicator& host_;
  const options& o_;
  shared_state& shared_;
  bool device_ = false;
  int n_ = 1, r_ = 0;
  std::uint64_t buffer_bytes_ = 0;
  buffer send_, recv_;
  buffer send_host_, recv_host_;
  std::vector<double> times_, slowest_;
  double copy_gbps_ = 1;
};

template <class T, class Parse>
std::vector<T> parse_list(const std::string& text, const std::vector<T>& all, Parse&& parse, const char* what) {
  if (text == "all") return all;
  std::vector<T> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto v = parse(item);
    if (!v) throw CLI::ValidationError(what, "unknown value '" + item + "'");
    out.push_back(*v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringzero-bench: collective throughput in the manner of nccl-tests"};
  options o;
  std::string collective = "all_reduce", min_b = "32M", max_b = "32M", step_b = "1M", dtypes = "float", ops = "sum",
              roots = "0", algo = "auto", bw_size, devices;
  app.add_option("collective", collective,
                 "all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all or barrier")->required();
  app.add_option("-b,--minbytes", min_b, "smallest size (B; suffixes K, M, G)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_b, "largest size (B; suffixes K, M, G)")->capture_default_str();
  app.add_option("-i,--stepbytes", step_b, "size increment when -f is 1")->capture_default_str();
  // Integer options take decimal digits only: CLI11 alone would read "-1" into an unsigned
  // option as 2^64 - 1, "010" as octal and "0x2" as hexadecimal.
  const CLI::Validator digits(
      [](std::string& text) -> std::string {
        return rz::bench::parse_digits<int>(text) ? std::string() : "'" + text + "' is not a whole number (decimal digits only)";
      },
      "DIGITS");
  app.add_option("-f,--stepfactor", o.step_factor, "size multiplication factor")->capture_default_str()->check(digits);
  app.add_option("-n,--iters", o.iters, "timed iterations per row")->capture_default_str()->check(digits)->check(CLI::Range(1, 10000000));
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations per row")
      ->capture_default_str()
      ->check(digits)
      ->check(CLI::Range(0, 10000000));
  app.add_option("-c,--check", o.check, "check results bitwise (0 or 1)")->capture_default_str()->check(digits)->check(CLI::Range(0, 1));
  app.add_option("-d,--datatype", dtypes, "dtype(s): float, double, half, bfloat16, int8, ... comma-separated, or all")->capture_default_str();
  app.add_option("-o,--op", ops, "reduce op(s): sum, prod, min, max, avg, premulsum, comma-separated, or all")->capture_default_str();
  app.add_option("-r,--root", roots, "root rank(s) for broadcast/reduce: comma-separated, or all")->capture_default_str();
  app.add_option("--ranks", o.ranks, "number of ranks (threads of the local backend; default: number of CPUs)")
      ->check(digits)
      ->check(CLI::Range(1, 4096));
  app.add_option("--algo", algo, "auto, ring, direct, halving_doubling, native (RINGZERO_ALGO also works)")->capture_default_str();
  app.add_flag("--pin", o.pin, "pin rank threads to cores");
  app.add_flag("--reproducible", o.reproducible,
               "reproducible mode (docs/numerics.md) for floating sum, avg and premulsum rows of all_reduce, "
               "reduce_scatter and reduce; host memory only");
  app.add_option("--json", o.json_path, "write every row to this JSON file");
  app.add_option("--bandwidth-bytes", bw_size, "per-rank size of the memory-bandwidth copy (default max(maxbytes, 64M))");
  std::string memory = "host";
  app.add_option("--memory", memory, "where buffers live: host, or cuda (device memory; needs a build with CUDA)")->capture_default_str();
  app.add_option("--backend", o.backend,
                 "local (threads), nccl (one rank per GPU; with --memory cuda), or mpi (one rank per process: run under "
                 "mpirun; --ranks must then be the number of processes or left out)")->capture_default_str();
  auto* devices_opt = app.add_option("--devices", devices,
                 "CUDA devices of the ranks, comma-separated (rank r: devices[r % size]; default: local backend all on "
                 "GPU 0, nccl rank r on GPU r); with --memory cuda only");
  CLI11_PARSE(app, argc, argv);
#if RINGZERO_HAS_MPI
  std::optional<rz::mpi::environment> mpi_env;  // --backend mpi: MPI_Init_thread ... MPI_Finalize
#endif
  int mpi_rank = 0;  // rank 0 prints the summary

  try {
    const auto kind = rz::parse_collective(collective);
    if (!kind || *kind == rz::collective_kind::send || *kind == rz::collective_kind::recv)
      throw CLI::ValidationError("collective", "unknown collective '" + collective + "'");
    o.kind = *kind;
    o.min_bytes = parse_size(min_b, "minbytes");
    o.max_bytes = parse_size(max_b, "maxbytes");
    o.step_bytes = parse_size(step_b, "stepbytes");
    if (!bw_size.empty()) {
      o.bandwidth_bytes = parse_size(bw_size, "bandwidth-bytes");
      if (o.bandwidth_bytes < (64u << 10))
        throw CLI::ValidationError("bandwidth-bytes", "at least 64K (a smaller copy stays in the caches and is no bound)");
    }
    if (o.max_bytes < o.min_bytes) throw CLI::ValidationError("maxbytes", "-e is smaller than -b");
    if (o.step_factor < 1) throw CLI::ValidationError("stepfactor", "must be at least 1");
    if (o.step_factor == 1 && o.step_bytes == 0) throw CLI::ValidationError("stepbytes", "must be positive when -f is 1");
    o.dtypes = parse_list<rz::dtype>(dtypes, std::vector<rz::dtype>(std::begin(rz::all_dtypes), std::end(rz::all_dtypes)),
                                     [](const std::string& s) { return rz::parse_dtype(s); }, "datatype");
    std::vector<rz::reduce_kind> all_ops;
    for (int i = 0; i < rz::reduce_kind_count; ++i) all_ops.push_back(static_cast<rz::reduce_kind>(i));
    o.ops = parse_list<rz::reduce_kind>(ops, all_ops, [](const std::string& s) { return rz::parse_reduce_kind(s); }, "op");
    const auto a = rz::parse_algorithm(algo);
    if (!a) throw CLI::ValidationError("algo", "unknown algorithm '" + algo + "'");
    o.algo = *a;
    if (memory != "host" && memory != "cuda") throw CLI::ValidationError("memory", "host or cuda, not '" + memory + "'");
    o.device_memory = memory == "cuda";
    if (o.backend != "local" && o.backend != "nccl" && o.backend != "mpi")
      throw CLI::ValidationError("backend", "local, nccl or mpi, not '" + o.backend + "'");
    if (o.backend == "nccl" && !o.device_memory) throw CLI::ValidationError("backend", "nccl needs --memory cuda");
    if (o.backend == "mpi" && o.device_memory) throw CLI::ValidationError("backend", "mpi runs on host memory only");
    if (o.reproducible && o.device_memory)
      throw CLI::ValidationError("reproducible", "--reproducible runs on host memory only, not with --memory cuda");
#if !RINGZERO_HAS_CUDA
    if (o.device_memory) throw CLI::ValidationError("memory", "this ringzero-bench was built without the CUDA runtime");
#endif
#if !RINGZERO_HAS_NCCL
    if (o.backend == "nccl") throw CLI::ValidationError("backend", "this ringzero-bench was built without NCCL");
#endif
#if RINGZERO_HAS_MPI
    if (o.backend == "mpi") {  // one rank per MPI process: the job's size is the world size
      mpi_env.emplace(argc, argv);
      int size = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
      if (o.ranks != 0 && o.ranks != size)
        throw CLI::ValidationError("ranks", "--ranks " + std::to_string(o.ranks) + " but mpirun started " + std::to_string(size) + " processes");
      o.ranks = size;
    }
#else
    if (o.backend == "mpi") throw CLI::ValidationError("backend", "this ringzero-bench was built without MPI");
#endif
    if (o.ranks == 0) o.ranks = o.device_memory ? (o.backend == "nccl" ? 1 : 2) : std::max(1, rz::local::detail::available_cpus());
    std::vector<int> all_roots;
    for (int r = 0; r < o.ranks; ++r) all_roots.push_back(r);
    o.roots = parse_list<int>(roots, all_roots,
                              [&](const std::string& s) -> std::optional<int> {
                                const std::optional<int> v = rz::bench::parse_digits<int>(s);
                                if (v && *v >= o.ranks)
                                  throw CLI::ValidationError("root", "root " + s + " is outside the " + std::to_string(o.ranks) +
                                                                         " ranks [0, " + std::to_string(o.ranks) + ")");
                                return v;
                              },
                              "root");
    if (devices_opt->count() > 0) {
      if (!o.device_memory)
        throw CLI::ValidationError("--devices", "'" + devices + "' selects CUDA devices, which only --memory cuda uses (not --memory " +
                                                    memory + ")");
      if (devices == "all") throw CLI::ValidationError("--devices", "'all' is not a list of CUDA devices (e.g. 0,1)");
      o.devices = parse_list<int>(devices, {},
                                  [&](const std::string& s) {
                                    const std::optional<int> v = rz::bench::parse_digits<int>(s);
                                    if (!v)
                                      throw CLI::ValidationError(
                                          "--devices", "'" + s + (s == devices ? "'" : "' in '" + devices + "'") +
                                                           " is not a CUDA device index (0, 1, ...)");
                                    return v;
                                  },
                                  "--devices");
    }
    // Host memory of this process's ranks at their peak, against the machine's physical memory
    // (rz::bench::exceeds_host_memory). On host memory each rank holds its send and receive
    // buffers plus the two buffers of the bandwidth copy; on device memory (local or nccl) each
    // rank holds host mirrors of its send and receive buffers. An MPI rank is a process of its own.
    if (o.backend != "mpi") {
      const double buffers = 2.0 * static_cast<double>(o.buffer_bytes());
      const double per_rank = o.device_memory ? buffers : buffers + 2.0 * static_cast<double>(o.copy_bytes());
      const double need = per_rank * o.ranks;
      if (rz::bench::exceeds_host_memory(need))
        throw CLI::ValidationError(
            "ranks", o.device_memory
                         ? fmt::format("{} rank(s) need {:.1f} GiB of host memory (host copies of the -e {} B send and "
                                       "receive buffers, per rank, with --memory cuda) but this machine has {:.1f} GiB: "
                                       "lower --ranks or -e",
                                       o.ranks, need / (1u << 30), o.max_bytes, rz::bench::physical_memory_bytes() / (1u << 30))
                         : fmt::format("{} rank(s) need {:.1f} GiB of host memory (-e {} B and the bandwidth copy's "
                                       "buffers, per rank) but this machine has {:.1f} GiB: lower --ranks, -e or "
                                       "--bandwidth-bytes",
                                       o.ranks, need / (1u << 30), o.max_bytes, rz::bench::physical_memory_bytes() / (1u << 30)));
    }
    if (!o.json_path.empty() && mpi_rank == 0) {  // fail before measuring, not after
      const std::string problem = rz::bench::output_path_problem(o.json_path);
      if (!problem.empty()) throw CLI::ValidationError("--json", "cannot write '" + o.json_path + "': " + problem);
    }
  } catch (const CLI::Error& e) {
    return mpi_rank == 0 ? app.exit(e) : 1;
  }

  shared_state shared;
  try {
    rz::local::launch_options lo;
    lo.pin_threads = o.pin;
    if (o.backend == "mpi") {
#if RINGZERO_HAS_MPI
      rz::mpi::communicator comm;
      rank_bench(comm, comm, o, shared).run();
#endif
    } else if (!o.device_memory) {
      rz::local::launch(o.ranks, [&](rz::communicator& comm) { rank_bench(comm, comm, o, shared).run(); }, lo);
    } else {
#if RINGZERO_HAS_CUDA
      // The bookkeeping travels on a parallel host world; a failing rank aborts it too.
      rz::local::world host_world(o.ranks);
      auto body = [&](rz::communicator& comm) {
        rz::local::communicator host(host_world, comm.rank());
        try {
          rank_bench(comm, host, o, shared).run();
        } catch (const std::exception& e) {
          host_world.abort(std::string("rank ") + std::to_string(comm.rank()) + " failed: " + e.what());
          throw;
        }
      };
      if (o.backend == "nccl") {
#if RINGZERO_HAS_NCCL
        std::vector<int> gpus;  // rank r on GPU r, or on devices[r % size] (NCCL refuses a GPU twice)
        for (int r = 0; r < o.ranks; ++r)
          gpus.push_back(o.devices.empty() ? r : o.devices[static_cast<std::size_t>(r) % o.devices.size()]);
        rz::nccl::launch(gpus, [&](rz::nccl::communicator& comm) { body(comm); });
#endif
      } else {
        rz::local::cuda_launch_options co;
        co.pin_threads = o.pin;
        co.devices = o.devices.empty() ? std::vector<int>{0} : o.devices;
        rz::local::launch_cuda(o.ranks, [&](rz::local::cuda_communicator& comm) { body(comm); }, co);
      }
#endif
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringzero-bench: %s\n", rz::error_text(e).c_str());
    return 2;
  }
  if (mpi_rank != 0) return 0;  // rank 0 holds the totals (and exits non-zero when any is wrong)
  if (shared.rows.empty()) {
    std::fprintf(stderr,
                 "ringzero-bench: no size from -b to -e holds a whole element of the chosen dtype(s) for every rank: "
                 "nothing was measured (raise -e)\n");
    return 2;
  }
  fmt::print("# Errors: {} wrong element(s) {}\n", shared.wrong_total, shared.wrong_total == 0 ? "OK" : "FAILED");
  fmt::print("# Avg bus bandwidth    : {:.4f}\n", shared.busbw_rows ? shared.busbw_sum / shared.busbw_rows : 0.0);
  if (!o.json_path.empty()) {
    nlohmann::json doc{{"program", "ringzero-bench"}, {"collective", rz::collective_name(o.kind)}, {"ranks", o.ranks},
                       {"backend", o.backend}, {"memory", o.device_memory ? "cuda" : "host"},
                       {"reproducible", o.reproducible},
                       {"copy_bandwidth_gbps", shared.copy_bandwidth}, {"rows", shared.rows},
                       {"avg_busbw_gbps", shared.busbw_rows ? shared.busbw_sum / shared.busbw_rows : 0.0},
                       {"wrong", shared.wrong_total}};
    std::ofstream f(o.json_path);
    if (!f) {
      std::fprintf(stderr, "ringzero-bench: cannot write %s\n", o.json_path.c_str());
      return 2;
    }
    f << doc.dump(2) << "\n";
  }
  return shared.wrong_total == 0 ? 0 : 1;
}
