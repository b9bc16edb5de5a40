// ringzero-bench: collective throughput in the manner of nccl-tests.
//
//   ringzero-bench all_reduce -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 -d float -o sum --ranks 2 --algo auto
//
// For each size from -b to -e (multiplied by -f, or stepped by -i) and each dtype / op / root,
// it runs the collective out of place and in place, checks the result bitwise against exact
// expected values (-c 1), then times -n iterations after -w warm-up iterations and prints
// nccl-tests' columns in nccl-tests' order: size (B), count (elements), type, redop, root, then
// per placement time (us, the mean of the per-iteration times, each the slowest rank's), algbw
// and busbw (GB/s, from the mean) and #wrong; then ringzero's own: the algorithm that ran and,
// per placement, the median time and %peak (the fraction of the memory-bandwidth bound reached).
// The sweep, timing, bus factors (nccl-tests' PERFORMANCE.md), exact check and table live in
// bench/harness/. Before the table it measures the machine's memory bandwidth with a STREAM-style
// copy on the same rank threads; docs/performance.md explains how the bound's bytes are counted.
// --json FILE and --csv FILE keep every row. The exit status is non-zero when any #wrong is non-zero.
// The footer's average busbw leaves out, and names, placements whose busbw measures no bandwidth
// (docs/performance.md); --ranks is at most 64 rank threads per CPU (max_ranks_per_cpu).
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
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "background_load.hpp"
#include "command_line.hpp"
#include "harness/collective.hpp"
#include "harness/table.hpp"
#include "harness/timing.hpp"
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
  int background_load = 0;    // --background-load: niced busy threads while measuring
  bool reproducible = false;  // --reproducible: floating sum/avg/premulsum reductions in reproducible mode
  std::string json_path;
  std::string csv_path;
  std::uint64_t bandwidth_bytes = 0;
  bool device_memory = false;     // --memory cuda
  std::string backend = "local";  // --backend local | nccl | mpi
  std::vector<int> devices;       // --devices (local backend on device memory)

  /// Bytes of each rank's send and receive buffers (sized for -e, reused by every row).
  std::uint64_t buffer_bytes() const { return std::max<std::uint64_t>(max_bytes, 64); }
  /// Bytes per rank of the bandwidth copy: --bandwidth-bytes, else max(buffer, 64 MiB).
  std::uint64_t copy_bytes() const {
    return bandwidth_bytes ? bandwidth_bytes : std::max<std::uint64_t>(buffer_bytes(), 64ull << 20);
  }
};

/// The most rank threads per CPU this process may use (`--ranks`, local and NCCL backends). Far
/// beyond one thread per CPU each step of a collective waits for threads the scheduler runs in
/// turn, and a local world holds N^2 mailboxes: on 2 CPUs one row of a 1 KiB all_reduce took 0.4 s
/// on 128 ranks, 6 s on 512, 48 s on 1024 and over 300 s, silent, on 4096 (time ~N^3). 64 per
/// CPU keeps such a run to seconds while leaving room to oversubscribe a machine on purpose.
constexpr int max_ranks_per_cpu = 64;

/// A placement that ran more than this many times faster than the memory-bandwidth bound (%peak
/// above 10000%) stays out of the footer's average: no memory copy moves bytes that fast. Caches
/// let small rows beat the copy bandwidth measured in DRAM (up to ~9x seen), never by this much.
constexpr double max_plausible_peak_fraction = 100;

/// The smallest time step of steady_clock this process sees (us): the least non-zero difference
/// between consecutive readings. A mean below it is no measurement.
double clock_resolution_us() {
  double least = 1e9;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = clock_type::now();
    auto t1 = clock_type::now();
    while (t1 == t0) t1 = clock_type::now();
    least = std::min(least, std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return least;
}

/// Why a placement's busbw stays out of the footer's average (none: it counts).
enum class busbw_doubt { none, below_clock, moves_nothing, beyond_memory };

struct shared_state {
  std::mutex mutex;
  std::vector<rz::bench::result_row> rows;
  double busbw_sum = 0;
  int busbw_rows = 0;
  /// Placements left out of the average, by busbw_doubt (below_clock, moves_nothing, beyond_memory).
  int below_clock = 0, moves_nothing = 0, beyond_memory = 0;
  double clock_resolution_us = 0;
  std::int64_t wrong_total = 0;
  double copy_bandwidth = 0;
};

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
      : comm_(comm),
        host_(host),
        o_(o),
        desc_(rz::bench::describe_bench(o.kind)),
        shared_(shared),
        device_(comm.space() == rz::memory_space::cuda) {
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
    for (std::uint64_t bytes : rz::bench::sweep_sizes(o_.min_bytes, o_.max_bytes, o_.step_factor, o_.step_bytes))
      for (rz::dtype t : o_.dtypes)
        for (rz::reduce_kind op : reduction() ? o_.ops : std::vector<rz::reduce_kind>{rz::reduce_kind::sum})
          for (int root : rooted() ? o_.roots : std::vector<int>{-1}) run_row(bytes, t, op, root);
  }

 private:
  using buffer = std::unique_ptr<unsigned char, buffer_deleter>;

  static buffer allocate_host(std::uint64_t bytes) {
    const std::uint64_t rounded = (bytes + 4095) / 4096 * 4096;
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(4096, rounded));
    if (!p)
      throw std::runtime_error(
          fmt::format("cannot allocate a {}-byte host buffer (its size comes from -e, or from "
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
      rz::primitive::cudart::check(cudaMalloc(&p, bytes), "cudaMalloc (benchmark buffer)");
      rz::primitive::cudart::check(cudaMemset(p, 0, bytes), "cudaMemset");
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
    rz::primitive::cudart::check(cudaMemcpy(send_.get(), send_host_.get(), send_bytes, cudaMemcpyHostToDevice),
                                 "cudaMemcpy H2D");
    rz::primitive::cudart::check(cudaMemcpy(recv_.get(), recv_host_.get(), recv_bytes, cudaMemcpyHostToDevice),
                                 "cudaMemcpy H2D");
    // From pageable memory cudaMemcpy may return before its DMA lands, and the collective's
    // stream (non-blocking, or NCCL's) is not ordered after it: wait for the uploads.
    rz::primitive::cudart::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after the uploads)");
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
    rz::primitive::cudart::check(cudaMemcpy(recv_host_.get(), recv_.get(), recv_bytes, cudaMemcpyDeviceToHost),
                                 "cudaMemcpy D2H");
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
      fmt::print(
          "# Memory bandwidth: STREAM-style copy of {} MiB per rank on {} rank(s) at once: loop {:.2f} GB/s, "
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
        rz::primitive::cudart::check(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream),
                                     "cudaMemcpyAsync");
        rz::primitive::cudart::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
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
      fmt::print(
          "# Device copy bandwidth: cudaMemcpyAsync device to device of {} MiB, each rank alone: {:.2f} GB/s "
          "(read + write bytes, median of 5, slowest rank)\n",
          bytes >> 20, copy_gbps_);
      fmt::print(
          "# %peak = (least bytes any shared-memory algorithm must move) / {:.2f} GB/s / time (ranks share one "
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
      algo += std::string(" (RINGZERO_ALGO=") + std::string(rz::algorithm_name(comm_.forced_algorithm())) +
              " where available)";
    fmt::print("# ringzero-bench {} : {} rank(s) on {}, algorithm {}{}{}\n", rz::collective_name(o_.kind), n_,
               backend_text(), algo, o_.reproducible ? ", reproducible mode (floating sum/avg/premulsum rows)" : "",
               o_.background_load > 0 ? fmt::format(", background load {} busy thread(s) at nice {}",
                                                    o_.background_load, rz::bench::background_load::nice_value)
                                      : std::string());
    std::fputs(rz::bench::table_header().c_str(), stdout);
    std::fflush(stdout);
  }

  // True when --reproducible applies to a row: a floating sum, avg or premulsum of all_reduce,
  // reduce_scatter or reduce (other rows run as usual: integers and min/max are exact already).
  bool reproducible_applies(rz::dtype t, rz::reduce_kind op) const {
    const bool kind = o_.kind == rz::collective_kind::all_reduce || o_.kind == rz::collective_kind::reduce_scatter ||
                      o_.kind == rz::collective_kind::reduce;
    return kind && rz::is_floating_point(t) &&
           (op == rz::reduce_kind::sum || op == rz::reduce_kind::avg || op == rz::reduce_kind::premul_sum);
  }

  // The arguments of the row's calls on this rank.
  rz::bench::call_args args(const rz::bench::row_shape& s, rz::dtype t, rz::reduce_kind op, int root,
                            bool in_place) const {
    rz::bench::call_args a;
    a.send = send_.get();
    a.recv = recv_.get();
    a.shape = s;
    a.type = t;
    a.op = op;
    a.root = root;
    a.in_place = in_place;
    a.options.algo = o_.algo;
    a.options.reproducible = o_.reproducible && reproducible_applies(t, op);
    return a;
  }

  std::int64_t all_sum(std::int64_t v) {
    std::int64_t out = 0;
    rz::all_reduce(host_, &v, &out, 1, rz::dtype::int64, rz::reduce_kind::sum);
    return out;
  }

  // One placement of a row: the exact check (-c 1), the warm-up, the timed iterations.
  rz::bench::placement_result measure(const rz::bench::row_shape& s, rz::dtype t, rz::reduce_kind op, int root,
                                      bool in_place) {
    if (in_place && !desc_.has_in_place) return {};  // N/A, like nccl-tests' sendrecv
    const rz::bench::call_args a = args(s, t, op, root, in_place);
    auto call = [&] { desc_.call(comm_, a, r_, n_); };
    std::int64_t wrong = 0;
    if (o_.check) {
      const std::size_t es = rz::dtype_size(t);
      rz::bench::fill_row(desc_, send_view(), recv_view(), s, t, op, r_, in_place);
      upload(s.send_elems * es, std::max(s.send_elems, s.recv_elems) * es);
      call();
      download(std::max(s.send_elems, s.recv_elems) * es);
      wrong = all_sum(desc_.verify(recv_view(), s, t, op, root, r_, n_, in_place));
    }
    for (int i = 0; i < o_.warmup; ++i) call();
    if (device_) {
      // Device work is asynchronous: time the batch up to the stream's completion.
      comm_.synchronize();
      rz::barrier(host_);
      const double each = rz::bench::time_batch(static_cast<int>(times_.size()), call, [&] { comm_.synchronize(); });
      std::fill(times_.begin(), times_.end(), each);
    } else {
      rz::barrier(comm_);
      rz::bench::time_each(times_, call);
    }
    // The slowest rank's time of each iteration, then the mean and the median over iterations.
    rz::bench::slowest_over_ranks(host_, times_, slowest_);
    return rz::bench::make_placement(desc_, s, n_, in_place, rz::bench::summarize(slowest_), wrong, copy_gbps_);
  }

  void run_row(std::uint64_t bytes, rz::dtype t, rz::reduce_kind op, int root) {
    const rz::bench::row_shape s = desc_.shape(bytes, rz::dtype_size(t), n_);
    if (s.count == 0 && bytes != 0 && desc_.moves_data) return;  // too small for this world
    std::string problem;
    const rz::algorithm resolved = rz::resolve_algorithm(comm_, o_.kind, static_cast<double>(s.size_bytes), o_.algo,
                                                         comm_.forced_algorithm(), problem);
    rz::bench::result_row row;
    row.kind = o_.kind;
    row.size_bytes = s.size_bytes;
    row.count = s.count;
    row.type = t;
    row.redop = reduction() ? std::string(rz::reduce_kind_name(op)) : "none";
    row.root = root;
    row.ranks = n_;
    row.algorithm = std::string(rz::algorithm_name(resolved));
    row.out_of_place = measure(s, t, op, root, false);
    row.in_place = measure(s, t, op, root, true);
    if (r_ != 0) return;
    std::fputs(rz::bench::table_row(row).c_str(), stdout);
    std::fflush(stdout);
    std::lock_guard<std::mutex> lock(shared_.mutex);
    for (const bool in_place : {false, true}) {
      const rz::bench::placement_result& x = in_place ? row.in_place : row.out_of_place;
      if (!x.applicable) continue;
      shared_.wrong_total += x.wrong;
      switch (doubt(s, in_place, x)) {
        case busbw_doubt::none:
          shared_.busbw_sum += x.busbw;
          ++shared_.busbw_rows;
          break;
        case busbw_doubt::below_clock: ++shared_.below_clock; break;
        case busbw_doubt::moves_nothing: ++shared_.moves_nothing; break;
        case busbw_doubt::beyond_memory: ++shared_.beyond_memory; break;
      }
    }
    shared_.rows.push_back(std::move(row));
  }

  /// Whether a placement's busbw means anything: its mean time is one the clock resolves, it
  /// moves bytes when its bus factor says so (a world of one in place moves none: broadcast and
  /// reduce still have a factor of 1), and it is within max_plausible_peak_fraction of the
  /// memory-bandwidth bound.
  busbw_doubt doubt(const rz::bench::row_shape& s, bool in_place, const rz::bench::placement_result& x) const {
    if (desc_.moves_data && x.time_us < shared_.clock_resolution_us) return busbw_doubt::below_clock;
    const double least = n_ == 1 && in_place ? 0.0 : desc_.least_bytes(n_, static_cast<double>(s.size_bytes));
    if (x.busbw > 0 && least <= 0) return busbw_doubt::moves_nothing;
    if (x.peak_fraction > max_plausible_peak_fraction) return busbw_doubt::beyond_memory;
    return busbw_doubt::none;
  }

  rz::communicator& comm_;
  rz::communicator& host_;
  const options& o_;
  const rz::bench::collective_descriptor& desc_;
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
                 "all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all or barrier")
      ->required();
  app.add_option("-b,--minbytes", min_b, "smallest size (B; suffixes K, M, G)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_b, "largest size (B; suffixes K, M, G)")->capture_default_str();
  app.add_option("-i,--stepbytes", step_b, "size increment when -f is 1")->capture_default_str();
  // Integer options take decimal digits only: CLI11 alone would read "-1" into an unsigned
  // option as 2^64 - 1, "010" as octal and "0x2" as hexadecimal.
  const CLI::Validator digits(
      [](std::string& text) -> std::string {
        return rz::bench::parse_digits<int>(text) ? std::string()
                                                  : "'" + text + "' is not a whole number (decimal digits only)";
      },
      "DIGITS");
  app.add_option("-f,--stepfactor", o.step_factor, "size multiplication factor")->capture_default_str()->check(digits);
  app.add_option("-n,--iters", o.iters, "timed iterations per row")
      ->capture_default_str()
      ->check(digits)
      ->check(CLI::Range(1, 10000000));
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations per row")
      ->capture_default_str()
      ->check(digits)
      ->check(CLI::Range(0, 10000000));
  app.add_option("-c,--check", o.check, "check results bitwise (0 or 1)")
      ->capture_default_str()
      ->check(digits)
      ->check(CLI::Range(0, 1));
  app.add_option("-d,--datatype", dtypes, "dtype(s): float, double, half, bfloat16, int8, ... comma-separated, or all")
      ->capture_default_str();
  app.add_option("-o,--op", ops, "reduce op(s): sum, prod, min, max, avg, premulsum, comma-separated, or all")
      ->capture_default_str();
  app.add_option("-r,--root", roots, "root rank(s) for broadcast/reduce: comma-separated, or all")
      ->capture_default_str();
  app.add_option("--ranks", o.ranks,
                 "number of ranks (threads of the local backend; default: number of CPUs; at most 64 per CPU)")
      ->check(digits)
      ->check(CLI::Range(1, 4096));
  app.add_option("--algo", algo, "auto, ring, direct, halving_doubling, native (RINGZERO_ALGO also works)")
      ->capture_default_str();
  app.add_flag("--pin", o.pin, "pin rank threads to cores");
  app.add_option("--background-load", o.background_load,
                 "N busy threads at nice 10 while measuring (a controlled stand-in for a data loader or a "
                 "neighbour's job on the same cores; 0 to 256)")
      ->check(digits)
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_flag("--reproducible", o.reproducible,
               "reproducible mode (docs/numerics.md) for floating sum, avg and premulsum rows of all_reduce, "
               "reduce_scatter and reduce; host memory only");
  app.add_option("--json", o.json_path, "write every row to this JSON file");
  app.add_option("--csv", o.csv_path,
                 "write every row to this CSV file (the table's columns, bench/harness/table.hpp)");
  app.add_option("--bandwidth-bytes", bw_size,
                 "per-rank size of the memory-bandwidth copy (default max(maxbytes, 64M))");
  std::string memory = "host";
  app.add_option("--memory", memory, "where buffers live: host, or cuda (device memory; needs a build with CUDA)")
      ->capture_default_str();
  app.add_option(
         "--backend", o.backend,
         "local (threads), nccl (one rank per GPU; with --memory cuda), or mpi (one rank per process: run under "
         "mpirun; --ranks must then be the number of processes or left out)")
      ->capture_default_str();
  auto* devices_opt = app.add_option(
      "--devices", devices,
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
        throw CLI::ValidationError("bandwidth-bytes",
                                   "at least 64K (a smaller copy stays in the caches and is no bound)");
    }
    if (o.max_bytes < o.min_bytes) throw CLI::ValidationError("maxbytes", "-e is smaller than -b");
    if (o.step_factor < 1) throw CLI::ValidationError("stepfactor", "must be at least 1");
    if (o.step_factor == 1 && o.step_bytes == 0)
      throw CLI::ValidationError("stepbytes", "must be positive when -f is 1");
    o.dtypes = parse_list<rz::dtype>(
        dtypes, std::vector<rz::dtype>(std::begin(rz::all_dtypes), std::end(rz::all_dtypes)),
        [](const std::string& s) { return rz::parse_dtype(s); }, "datatype");
    std::vector<rz::reduce_kind> all_ops;
    for (int i = 0; i < rz::reduce_kind_count; ++i) all_ops.push_back(static_cast<rz::reduce_kind>(i));
    o.ops = parse_list<rz::reduce_kind>(
        ops, all_ops, [](const std::string& s) { return rz::parse_reduce_kind(s); }, "op");
    const auto a = rz::parse_algorithm(algo);
    if (!a) throw CLI::ValidationError("algo", "unknown algorithm '" + algo + "'");
    o.algo = *a;
    if (memory != "host" && memory != "cuda")
      throw CLI::ValidationError("memory", "host or cuda, not '" + memory + "'");
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
        throw CLI::ValidationError("ranks", "--ranks " + std::to_string(o.ranks) + " but mpirun started " +
                                                std::to_string(size) + " processes");
      o.ranks = size;
    }
#else
    if (o.backend == "mpi") throw CLI::ValidationError("backend", "this ringzero-bench was built without MPI");
#endif
    if (o.ranks == 0)
      o.ranks = o.device_memory ? (o.backend == "nccl" ? 1 : 2) : std::max(1, rz::local::detail::available_cpus());
    if (o.backend != "mpi") {  // every rank a thread of this process (an MPI rank is a process)
      const int cpus = std::max(1, rz::local::detail::available_cpus());
      const int limit = std::min(4096, max_ranks_per_cpu * cpus);
      if (o.ranks > limit)
        throw CLI::ValidationError(
            "--ranks", fmt::format("{} rank threads are more than the {} this process allows: at most {} per CPU on "
                                   "the {} CPU(s) it may run on (and 4096 in all); each collective step would wait "
                                   "for threads scheduled in turn",
                                   o.ranks, limit, max_ranks_per_cpu, cpus));
    }
    std::vector<int> all_roots;
    for (int r = 0; r < o.ranks; ++r) all_roots.push_back(r);
    o.roots = parse_list<int>(
        roots, all_roots,
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
        throw CLI::ValidationError(
            "--devices",
            "'" + devices + "' selects CUDA devices, which only --memory cuda uses (not --memory " + memory + ")");
      if (devices == "all") throw CLI::ValidationError("--devices", "'all' is not a list of CUDA devices (e.g. 0,1)");
      o.devices = parse_list<int>(
          devices, {},
          [&](const std::string& s) {
            const std::optional<int> v = rz::bench::parse_digits<int>(s);
            if (!v)
              throw CLI::ValidationError("--devices", "'" + s + (s == devices ? "'" : "' in '" + devices + "'") +
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
            "ranks",
            o.device_memory
                ? fmt::format("{} rank(s) need {:.1f} GiB of host memory (host copies of the -e {} B send and "
                              "receive buffers, per rank, with --memory cuda) but this machine has {:.1f} GiB: "
                              "lower --ranks or -e",
                              o.ranks, need / (1u << 30), o.max_bytes, rz::bench::physical_memory_bytes() / (1u << 30))
                : fmt::format("{} rank(s) need {:.1f} GiB of host memory (-e {} B and the bandwidth copy's "
                              "buffers, per rank) but this machine has {:.1f} GiB: lower --ranks, -e or "
                              "--bandwidth-bytes",
                              o.ranks, need / (1u << 30), o.max_bytes,
                              rz::bench::physical_memory_bytes() / (1u << 30)));
    }
    for (const auto& [option, path] :
         {std::pair<const char*, const std::string&>{"--json", o.json_path}, {"--csv", o.csv_path}}) {
      if (path.empty() || mpi_rank != 0) continue;  // fail before measuring, not after
      const std::string problem = rz::bench::output_path_problem(path);
      if (!problem.empty()) throw CLI::ValidationError(option, "cannot write '" + path + "': " + problem);
    }
  } catch (const CLI::Error& e) { return mpi_rank == 0 ? app.exit(e) : 1; }

  shared_state shared;
  shared.clock_resolution_us = clock_resolution_us();
  try {
    // Started after the options are checked and before any rank: every row runs under it.
    const rz::bench::background_load load(o.background_load);
    rz::local::launch_options lo;
    lo.pin_threads = o.pin;
    if (o.backend == "mpi") {
#if RINGZERO_HAS_MPI
      rz::mpi::communicator comm;
      rank_bench(comm, comm, o, shared).run();
#endif
    } else if (!o.device_memory) {
      rz::local::launch(
          o.ranks, [&](rz::communicator& comm) { rank_bench(comm, comm, o, shared).run(); }, lo);
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
        rz::local::launch_cuda(
            o.ranks, [&](rz::local::cuda_communicator& comm) { body(comm); }, co);
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
  // nccl-tests' footer, averaged over the placements whose busbw means something; a note names
  // those left out, and with none left the average reads N/A (null in the JSON).
  const int left_out = shared.below_clock + shared.moves_nothing + shared.beyond_memory;
  const double avg_busbw = shared.busbw_rows ? shared.busbw_sum / shared.busbw_rows
                           : left_out > 0    ? std::numeric_limits<double>::quiet_NaN()
                                             : 0.0;
  if (std::isnan(avg_busbw))
    fmt::print("# Avg bus bandwidth    : N/A\n");
  else
    fmt::print("# Avg bus bandwidth    : {:.4f}\n", avg_busbw);
  if (left_out > 0) {
    std::string why;
    auto add = [&](int count, const std::string& text) {
      if (count > 0) why += fmt::format("{}{} {}", why.empty() ? "" : "; ", count, text);
    };
    add(shared.below_clock,
        fmt::format("took less time than the clock resolves ({:.3f} us)", shared.clock_resolution_us));
    add(shared.moves_nothing, "moved no bytes (in place on one rank)");
    add(shared.beyond_memory, fmt::format("ran over {:.0f}x faster than memory copies allow ({:.2f} GB/s measured)",
                                          max_plausible_peak_fraction, shared.copy_bandwidth));
    fmt::print("#   (averaged over {} of {} placement(s); left out, as their busbw measures no bandwidth: {})\n",
               shared.busbw_rows, left_out + shared.busbw_rows, why);
  }
  try {
    if (!o.json_path.empty()) {
      using rz::bench::json_number;
      using rz::bench::json_string;
      rz::bench::write_json(o.json_path,
                            {{"program", json_string("ringzero-bench")},
                             {"collective", json_string(std::string(rz::collective_name(o.kind)))},
                             {"ranks", json_number(o.ranks)},
                             {"backend", json_string(o.backend)},
                             {"memory", json_string(o.device_memory ? "cuda" : "host")},
                             {"reproducible", o.reproducible ? "true" : "false"},
                             {"background_load_threads", json_number(o.background_load)},
                             {"copy_bandwidth_gbps", json_number(shared.copy_bandwidth)},
                             {"avg_busbw_gbps", json_number(avg_busbw)},
                             {"avg_busbw_left_out", json_number(left_out)},
                             {"wrong", json_number(static_cast<double>(shared.wrong_total))}},
                            shared.rows);
    }
    if (!o.csv_path.empty()) rz::bench::write_csv(o.csv_path, shared.rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringzero-bench: %s\n", rz::error_text(e).c_str());
    return 2;
  }
  return shared.wrong_total == 0 ? 0 : 1;
}
