// ringzero-gpu-bench: the GPU's copy bandwidth and the bandwidth of every CUDA primitive.
//
//   ringzero-gpu-bench [--size-mib 256] [--iters 20] [--warmup 3] [--device 0] [--json FILE]
//                      [--ranks 2,4] [--no-collectives]
//
// First the card's copy bandwidth, two ways: cudaMemcpyAsync device to device, and a copy
// kernel built like the primitives (16-byte vectors; copy_kernel.cu); then, for reference, a
// copy and a float32 sum through CUB's cub::DeviceTransform (CCCL's tuned transform). Then reduce_into, cast,
// scale and fill on buffers of --size-mib MiB (the largest operand of each call). Each row is
// the median of --iters timed launches (CUDA events) after --warmup launches. Bandwidth counts
// the bytes each call must read plus the bytes it must write (a copy of S bytes moves 2S; a
// reduce_into of S-byte operands 3S; a cast from 4-byte to 2-byte elements 1.5S), so every row
// is comparable with the copy bandwidth; "of copy" is the fraction of the better copy.
// #wrong: elements of the first and last 64 Ki outputs that differ from the host primitive's
// result on the same inputs (bitwise; a NaN produced by arithmetic matches any NaN).
// Then all_reduce (float32 sum, out of place, --size-mib per rank) on the local backend with
// device memory, every rank of --ranks on this one GPU, ring and halving_doubling, through the
// benchmarks' harness (bench/harness: shape, call, exact check, bus factor, table): the table has
// nccl-tests' columns (time: the mean of --iters back-to-back calls up to the streams' completion,
// the slowest rank's; algbw = S / time; busbw = algbw * 2(n-1)/n; in place N/A), then the
// algorithm, the median (the same batch) and %peak (the least traffic of any shared-memory
// algorithm, 2nS, over the copy bandwidth and the time; the ranks share one device's memory).
// One call's result is first checked exactly against the harness's inputs (every element).
// "x bound" is the time over the copy-bandwidth bound of the ring: the bytes its n ranks must move
// through the one device's memory, 5(n-1)S (each of the n-1 reduce-scatter steps reads two blocks
// of S/n and writes one; each of the n-1 all-gather steps copies S/n), over the copy bandwidth.
// The last lines check this project's targets on a Hopper GPU: reduce_into and cast reach at
// least 85% of the copy bandwidth, and ring all_reduce stays within 2x of its bound. Exit status: 0 when every row is
// right, 1 when a result is wrong, 2 on an error (no device, bad option, too little host memory for --size-mib).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../command_line.hpp"
#include "../harness/collective.hpp"
#include "../harness/table.hpp"
#include "../harness/timing.hpp"
#include "../memory_bandwidth.hpp"
#include "copy_kernel.hpp"
#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/barrier.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace rz = ringzero;

namespace {

struct options {
  std::uint64_t size_mib = 256;
  int iters = 20;
  int warmup = 3;
  int device = 0;
  std::string json_path;
  std::vector<int> ranks{2, 4};
  bool collectives = true;
};

void check(cudaError_t e, const char* what) { rz::primitive::cudart::check(e, what); }

/// A cudaMalloc'd buffer.
struct device_buffer {
  unsigned char* p = nullptr;
  std::size_t bytes = 0;
  explicit device_buffer(std::size_t n) : bytes(n) { check(cudaMalloc(reinterpret_cast<void**>(&p), n), "cudaMalloc"); }
  ~device_buffer() { (void)cudaFree(p); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

/// Fast reproducible random bytes (xorshift64*), every bit pattern possible.
std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<unsigned char> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const std::uint64_t r = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(v.data() + i, &r, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<unsigned char>(i * 131 + seed);
  return v;
}

struct row {
  std::string name;
  double bytes_moved = 0;  // read + written per call
  double time_us = 0;
  double gbps = 0;
  long long wrong = 0;
  bool target = false;  // counts toward the 85% target (reduce_into and cast)
};

/// Median time in microseconds of `iters` launches of `launch` on `stream`.
double time_launches(const std::function<int()>& launch, cudaStream_t stream, int warmup, int iters) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i)
    if (launch() != 0) throw rz::error(rz::errc::backend_failure, "launch failed during warm-up");
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    if (launch() != 0) throw rz::error(rz::errc::backend_failure, "launch failed");
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(1e3 * ms);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<unsigned char> download(const unsigned char* p, std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the copy is not ordered with other streams
  check(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return v;
}

/// Elements in [0, w) and [n - w, n) of device output `out` (type `t`) that differ from what
/// `host_op(dst, first, count)` computes for the same element range.
long long count_wrong(
    rz::dtype t, const unsigned char* out, std::uint64_t n, bool nan_equal,
    const std::function<void(unsigned char* dst, std::uint64_t first, std::uint64_t count)>& host_op) {
  const std::size_t es = rz::dtype_size(t);
  const std::uint64_t w = std::min<std::uint64_t>(n, 65536);
  long long wrong = 0;
  for (std::uint64_t first : {std::uint64_t{0}, n - w}) {
    const std::vector<unsigned char> got = download(out + first * es, static_cast<std::size_t>(w * es));
    std::vector<unsigned char> want(got.size());
    host_op(want.data(), first, w);
    for (std::uint64_t i = 0; i < w; ++i) {
      if (std::memcmp(got.data() + i * es, want.data() + i * es, es) == 0) continue;
      if (nan_equal && rz::is_floating_point(t)) {
        bool both_nan = false;
        rz::visit_dtype(t, [&]<class T>() {
          T g, x;
          std::memcpy(static_cast<void*>(&g), got.data() + i * es, es);
          std::memcpy(static_cast<void*>(&x), want.data() + i * es, es);
          const double dg = static_cast<double>(g), dx = static_cast<double>(x);
          both_nan = dg != dg && dx != dx;
        });
        if (both_nan) continue;
      }
      ++wrong;
    }
    if (w == n) break;
  }
  return wrong;
}

/// One all_reduce row of the harness's table and the ring's copy-bandwidth bound ratio.
struct collective_row {
  rz::bench::result_row row;
  double bound_ratio = 0;  // time over the ring's bound 5(n-1)S / copy bandwidth (see the file comment)
};

/// all_reduce float32 sum of `bytes` per rank on `n` ranks sharing `device`, out of place (see
/// the file comment); the shape, call, exact check, bus factor and %peak are bench/harness's.
collective_row bench_all_reduce(int n, rz::algorithm algo, std::size_t bytes, int device, int iters, int warmup,
                                double copy_gbps) {
  const rz::bench::collective_descriptor& d = rz::bench::all_reduce_bench;
  const rz::bench::row_shape shape = d.shape(bytes, 4, n);
  std::vector<double> each_us(static_cast<std::size_t>(n), 0.0);
  std::vector<long long> wrong(static_cast<std::size_t>(n), 0);
  rz::local::cuda_launch_options lo;
  lo.devices = {device};
  rz::local::launch_cuda(
      n,
      [&](rz::local::cuda_communicator& c) {
        const std::size_t r = static_cast<std::size_t>(c.rank());
        device_buffer send(bytes), recv(bytes);
        rz::bench::call_args a;
        a.send = send.p;
        a.recv = recv.p;
        a.shape = shape;
        a.options.algo = algo;
        auto call = [&] { d.call(c, a, c.rank(), n); };
        {  // exact check of one call: the harness's inputs written on the host, uploaded, the output downloaded
          std::vector<unsigned char> send_host(bytes), recv_host(bytes);
          rz::bench::fill_row(d, send_host.data(), recv_host.data(), shape, rz::dtype::float32, rz::reduce_kind::sum,
                              c.rank(), false);
          check(cudaMemcpy(send.p, send_host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
          check(cudaMemcpy(recv.p, recv_host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
          check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after the uploads)");
          call();
          c.synchronize();
          check(cudaMemcpy(recv_host.data(), recv.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
          wrong[r] =
              d.verify(recv_host.data(), shape, rz::dtype::float32, rz::reduce_kind::sum, -1, c.rank(), n, false);
        }
        for (int i = 0; i < warmup; ++i) call();
        c.synchronize();
        rz::barrier(c);
        c.synchronize();
        each_us[r] = rz::bench::time_batch(iters, call, [&] { c.synchronize(); });
      },
      lo);
  // Every iteration of the batch at the slowest rank's time per call (mean = median).
  rz::bench::time_summary t;
  t.mean_us = t.median_us = *std::max_element(each_us.begin(), each_us.end());
  long long wrong_total = 0;
  for (long long x : wrong) wrong_total += x;
  collective_row out;
  rz::bench::result_row& row = out.row;
  row.kind = rz::collective_kind::all_reduce;
  row.size_bytes = shape.size_bytes;
  row.count = shape.count;
  row.type = rz::dtype::float32;
  row.redop = "sum";
  row.ranks = n;
  row.algorithm = std::string(rz::algorithm_name(algo));
  row.out_of_place = rz::bench::make_placement(d, shape, n, false, t, wrong_total, copy_gbps);
  const double bound_us = 5.0 * (n - 1) * static_cast<double>(bytes) / (copy_gbps * 1e3);
  out.bound_ratio = t.mean_us / bound_us;
  return out;
}

/// `text` as a whole decimal integer in [lo, hi] (0 <= lo), written with digits only: no sign,
/// space or base prefix; otherwise an invalid_argument error naming `option`, the text and the range.
long long parse_integer(const std::string& option, const std::string& text, long long lo, long long hi) {
  const std::optional<long long> v = rz::bench::parse_digits<long long>(text);
  if (!v || *v < lo || *v > hi)
    throw rz::error(rz::errc::invalid_argument, option + " '" + text + "': expected a whole number from " +
                                                    std::to_string(lo) + " to " + std::to_string(hi) +
                                                    " (digits only)");
  return *v;
}

int parse_options(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw rz::error(rz::errc::invalid_argument, a + " needs a value");
      return argv[++i];
    };
    // 1 MiB to 1 TiB per operand (three operands are allocated; cudaMalloc names a size the
    // device cannot hold)
    if (a == "--size-mib")
      o.size_mib = static_cast<std::uint64_t>(parse_integer(a, value(), 1, 1 << 20));
    else if (a == "--iters")
      o.iters = static_cast<int>(parse_integer(a, value(), 1, 1000000));
    else if (a == "--warmup")
      o.warmup = static_cast<int>(parse_integer(a, value(), 0, 1000000));
    else if (a == "--device")
      o.device = static_cast<int>(parse_integer(a, value(), 0, 1023));
    else if (a == "--json")
      o.json_path = value();
    else if (a == "--no-collectives")
      o.collectives = false;
    else if (a == "--ranks") {
      o.ranks.clear();
      const std::string list = value();
      for (std::size_t start = 0; start <= list.size();) {
        const std::size_t comma = list.find(',', start);
        const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        // 2 ranks at least (a ring of one rank is a copy); at most 64 threads on the one GPU
        const std::string option =
            comma == std::string::npos && start == 0 ? "--ranks" : "--ranks '" + list + "': item";
        o.ranks.push_back(static_cast<int>(parse_integer(option, item, 2, 64)));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: ringzero-gpu-bench [--size-mib 256] [--iters 20] [--warmup 3] [--device 0] [--json FILE]\n"
          "                          [--ranks 2,4] [--no-collectives]\n");
      return 1;
    } else {
      throw rz::error(rz::errc::invalid_argument, "unknown option " + a);
    }
  }
  if (!o.json_path.empty()) {  // before minutes of measuring, not after
    const std::string problem = rz::bench::output_path_problem(o.json_path);
    if (!problem.empty())
      throw rz::error(rz::errc::io_error, "--json " + o.json_path + ": cannot open for writing: " + problem);
  }
  // The inputs are made on the host, two --size-mib buffers at once (random_bytes), and each
  // all_reduce rank checks its result through two host copies of its buffers: check the larger
  // against the machine's memory before any allocation, as ringzero-bench does.
  int most_ranks = 1;
  for (int n : o.ranks) most_ranks = std::max(most_ranks, o.collectives ? n : 1);
  const double host_bytes = 2.0 * most_ranks * static_cast<double>(o.size_mib) * (1 << 20);
  if (rz::bench::exceeds_host_memory(host_bytes)) {
    char text[256];
    std::snprintf(
        text, sizeof text,
        "--size-mib %llu needs %.1f GiB of host memory (two buffers of that size on the host, per all_reduce rank) "
        "but this machine has %.1f GiB: lower --size-mib",
        static_cast<unsigned long long>(o.size_mib), host_bytes / (1 << 30),
        rz::bench::physical_memory_bytes() / (1 << 30));
    throw rz::error(rz::errc::invalid_argument, text);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    if (parse_options(argc, argv, o) != 0) return 0;
    rz::primitive::cudart::require_device_index(o.device, "--device " + std::to_string(o.device));
    check(cudaSetDevice(o.device), "cudaSetDevice");
    const rz::primitive::device_primitives& k = rz::primitive::require_device_primitives();
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

    const std::size_t S = static_cast<std::size_t>(o.size_mib) << 20;
    std::printf("# ringzero-gpu-bench on %s (%d SMs, %.1f GiB, L2 %.0f MiB), %zu MiB per operand, median of %d\n",
                prop.name, prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
                static_cast<double>(prop.l2CacheSize) / (1 << 20), S >> 20, o.iters);
    std::fflush(stdout);
    device_buffer a(S), b(S), d(S);
    {
      const auto ra = random_bytes(S, 1), rb = random_bytes(S, 2);
      check(cudaMemcpy(a.p, ra.data(), S, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
      check(cudaMemcpy(b.p, rb.data(), S, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
      check(cudaMemset(d.p, 0, S), "cudaMemset");
      // pageable uploads may return before their DMA lands: wait before any stream uses them
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    std::vector<row> rows;
    auto add = [&](const std::string& name, double moved, const std::function<int()>& launch, bool target) {
      row r;
      r.name = name;
      r.bytes_moved = moved;
      r.time_us = time_launches(launch, stream, o.warmup, o.iters);
      r.gbps = moved / r.time_us / 1e3;
      r.target = target;
      rows.push_back(r);
      return &rows.back();
    };
    auto* s = static_cast<void*>(stream);

    // Copy bandwidth: the ceiling.
    add(
        "copy (cudaMemcpyAsync D2D)", 2.0 * S,
        [&] { return static_cast<int>(cudaMemcpyAsync(d.p, a.p, S, cudaMemcpyDeviceToDevice, stream)); }, false);
    add(
        "copy kernel (16-byte vectors)", 2.0 * S, [&] { return ringzero_bench_copy_kernel(d.p, a.p, S, s); }, false);
    rows.back().wrong = std::memcmp(download(d.p, 4096).data(), download(a.p, 4096).data(), 4096) == 0 ? 0 : 1;
    const double copy_gbps = std::max(rows[0].gbps, rows[1].gbps);
    // CUB's transform as a reference for the primitives' own kernels (not part of the ceiling).
    add(
        "copy (cub::DeviceTransform)", 2.0 * S, [&] { return ringzero_bench_cub_copy(d.p, a.p, S, s); }, false);
    rows.back().wrong = std::memcmp(download(d.p, 4096).data(), download(a.p, 4096).data(), 4096) == 0 ? 0 : 1;
    add(
        "sum float32 (cub::DeviceTransform)", 3.0 * S,
        [&] { return ringzero_bench_cub_sum_float(d.p, a.p, b.p, S / 4, s); }, false);

    // reduce_into.
    struct reduce_case {
      rz::dtype t;
      rz::reduce_kind kind;
      bool pre;
      std::int64_t divisor;
    };
    for (const reduce_case& c : {reduce_case{rz::dtype::float32, rz::reduce_kind::sum, false, 0},
                                 reduce_case{rz::dtype::bfloat16, rz::reduce_kind::sum, false, 0},
                                 reduce_case{rz::dtype::float16, rz::reduce_kind::sum, false, 0},
                                 reduce_case{rz::dtype::float64, rz::reduce_kind::sum, false, 0},
                                 reduce_case{rz::dtype::int32, rz::reduce_kind::sum, false, 0},
                                 reduce_case{rz::dtype::int8, rz::reduce_kind::sum, false, 0},
                                 reduce_case{rz::dtype::float32, rz::reduce_kind::max, false, 0},
                                 reduce_case{rz::dtype::float16, rz::reduce_kind::prod, false, 0},
                                 reduce_case{rz::dtype::float16, rz::reduce_kind::max, false, 0},
                                 reduce_case{rz::dtype::bfloat16, rz::reduce_kind::max, false, 0},
                                 reduce_case{rz::dtype::float16, rz::reduce_kind::premul_sum, true, 0},
                                 reduce_case{rz::dtype::bfloat16, rz::reduce_kind::premul_sum, true, 0},
                                 reduce_case{rz::dtype::float16, rz::reduce_kind::avg, false, 4},
                                 reduce_case{rz::dtype::bfloat16, rz::reduce_kind::avg, false, 4},
                                 reduce_case{rz::dtype::float32, rz::reduce_kind::premul_sum, true, 0},
                                 reduce_case{rz::dtype::int64, rz::reduce_kind::avg, false, 3},
                                 reduce_case{rz::dtype::int32, rz::reduce_kind::avg, false, 3},
                                 reduce_case{rz::dtype::int8, rz::reduce_kind::avg, false, 3}}) {
      rz::primitive::reduce_spec spec;
      spec.type = c.t;
      spec.kind = c.kind;
      spec.pre_a = spec.pre_b = c.pre;
      spec.scalar_a = 0.5;
      spec.scalar_b = 0.25;
      spec.divisor = c.divisor;
      const std::uint64_t n = S / rz::dtype_size(c.t);
      const std::string name =
          "reduce_into " + std::string(rz::reduce_kind_name(c.kind)) + " " + std::string(rz::dtype_name(c.t));
      row* r = add(
          name, 3.0 * S, [&] { return k.reduce_into(d.p, a.p, b.p, n, spec, s); }, true);
      const std::size_t es = rz::dtype_size(c.t);
      const bool arithmetic = c.kind != rz::reduce_kind::min && c.kind != rz::reduce_kind::max;  // NaN payload free
      r->wrong =
          count_wrong(c.t, d.p, n, arithmetic, [&](unsigned char* dst, std::uint64_t first, std::uint64_t count) {
            const auto ha = download(a.p + first * es, count * es), hb = download(b.p + first * es, count * es);
            rz::primitive::reduce_into(dst, ha.data(), hb.data(), count, spec);
          });
    }
    // cast.
    for (const auto& [to, from] :
         std::vector<std::pair<rz::dtype, rz::dtype>>{{rz::dtype::bfloat16, rz::dtype::float32},
                                                      {rz::dtype::float32, rz::dtype::bfloat16},
                                                      {rz::dtype::float16, rz::dtype::float32},
                                                      {rz::dtype::float32, rz::dtype::float16},
                                                      {rz::dtype::float32, rz::dtype::int32},
                                                      {rz::dtype::int8, rz::dtype::float32}}) {
      const std::size_t wide = std::max(rz::dtype_size(to), rz::dtype_size(from));
      const std::uint64_t n = S / wide;
      const double moved = static_cast<double>(n) * static_cast<double>(rz::dtype_size(to) + rz::dtype_size(from));
      const std::string name = "cast " + std::string(rz::dtype_name(from)) + " -> " + std::string(rz::dtype_name(to));
      row* r = add(
          name, moved, [&] { return k.cast(d.p, to, a.p, from, n, s); }, true);
      const std::size_t fs = rz::dtype_size(from);
      r->wrong = count_wrong(to, d.p, n, rz::is_floating_point(from),
                             [&](unsigned char* dst, std::uint64_t first, std::uint64_t count) {
                               const auto ha = download(a.p + first * fs, count * fs);
                               rz::primitive::cast_into(dst, to, ha.data(), from, count);
                             });
    }
    // scale and fill.
    for (rz::dtype t : {rz::dtype::float32, rz::dtype::bfloat16, rz::dtype::float16}) {
      const std::uint64_t n = S / rz::dtype_size(t);
      row* r = add(
          "scale " + std::string(rz::dtype_name(t)), 2.0 * S, [&] { return k.scale(d.p, a.p, n, t, 0.125, s); }, false);
      const std::size_t es = rz::dtype_size(t);
      r->wrong = count_wrong(t, d.p, n, true, [&](unsigned char* dst, std::uint64_t first, std::uint64_t count) {
        const auto ha = download(a.p + first * es, count * es);
        rz::primitive::scale_into(dst, ha.data(), count, t, 0.125);
      });
    }
    {
      const std::uint64_t n = S / 4;
      row* r = add(
          "fill float32", 1.0 * S, [&] { return k.fill(d.p, n, rz::dtype::float32, 1.5, s); }, false);
      r->wrong =
          count_wrong(rz::dtype::float32, d.p, n, false, [&](unsigned char* dst, std::uint64_t, std::uint64_t count) {
            rz::primitive::fill(dst, count, rz::dtype::float32, 1.5);
          });
    }

    // The table.
    std::printf("# %-34s %12s %11s %9s %8s %7s\n", "operation", "moved (MiB)", "time (us)", "GB/s", "of copy",
                "#wrong");
    long long wrong_total = 0;
    double worst_target = 1e9;
    std::string worst_name;
    for (const row& r : rows) {
      std::printf("  %-34s %12.0f %11.1f %9.1f %7.1f%% %7lld\n", r.name.c_str(), r.bytes_moved / (1 << 20), r.time_us,
                  r.gbps, 100.0 * r.gbps / copy_gbps, r.wrong);
      wrong_total += r.wrong;
      if (r.target && r.gbps / copy_gbps < worst_target) {
        worst_target = r.gbps / copy_gbps;
        worst_name = r.name;
      }
    }
    std::vector<collective_row> collectives;
    if (o.collectives) {
      std::fflush(stdout);
      for (int n : o.ranks)
        for (rz::algorithm a : {rz::algorithm::ring, rz::algorithm::halving_doubling})
          collectives.push_back(bench_all_reduce(n, a, S, o.device, o.iters, o.warmup, copy_gbps));
      std::printf(
          "# all_reduce float32 sum, %zu MiB per rank, local backend, all ranks on GPU %d (out of place; in place "
          "not run)\n",
          S >> 20, o.device);
      for (int n : o.ranks) {
        std::printf("# %d ranks\n%s", n, rz::bench::table_header().c_str());
        for (const auto& c : collectives) {
          if (c.row.ranks != n) continue;
          std::fputs(rz::bench::table_row(c.row).c_str(), stdout);
          wrong_total += c.row.out_of_place.wrong;
        }
      }
      std::printf("# x bound (time over the ring's copy-bandwidth bound 5(n-1)S):");
      for (const auto& c : collectives)
        std::printf(" %d ranks %s %.2f;", c.row.ranks, c.row.algorithm.c_str(), c.bound_ratio);
      std::printf("\n");
    }
    std::printf("# copy bandwidth (better of the two copies): %.1f GB/s (bytes read + written)\n", copy_gbps);
    std::printf("# target reduce_into and cast >= 85%% of copy: worst %s at %.1f%%: %s\n", worst_name.c_str(),
                100.0 * worst_target, worst_target >= 0.85 ? "PASS" : "MISS");
    double worst_ring = 0;
    for (const auto& c : collectives)
      if (c.row.algorithm == "ring") worst_ring = std::max(worst_ring, c.bound_ratio);
    if (!collectives.empty())
      std::printf("# target ring all_reduce within 2x of its copy-bandwidth bound: worst %.2fx: %s\n", worst_ring,
                  worst_ring <= 2.0 ? "PASS" : "MISS");
    std::printf("# errors: %lld wrong element(s) %s\n", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
    if (!o.json_path.empty()) {
      std::ofstream f(o.json_path);
      f << "{\n  \"program\": \"ringzero-gpu-bench\",\n  \"device\": \"" << prop.name
        << "\",\n  \"size_mib\": " << o.size_mib << ",\n  \"copy_gbps\": " << copy_gbps << ",\n  \"rows\": [\n";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const row& r = rows[i];
        f << "    {\"operation\": \"" << r.name << "\", \"bytes_moved\": " << r.bytes_moved
          << ", \"time_us\": " << r.time_us << ", \"gbps\": " << r.gbps
          << ", \"fraction_of_copy\": " << r.gbps / copy_gbps << ", \"wrong\": " << r.wrong << "}"
          << (i + 1 < rows.size() ? ",\n" : "\n");
      }
      std::vector<rz::bench::result_row> all_reduce_rows;
      std::string ratios;
      for (const auto& c : collectives) {
        all_reduce_rows.push_back(c.row);
        ratios += (ratios.empty() ? "" : ", ") + rz::bench::json_number(c.bound_ratio);
      }
      f << "  ],\n  \"all_reduce\": " << rz::bench::json_rows(all_reduce_rows) << ",\n  \"all_reduce_bound_ratio\": ["
        << ratios << "]";
      f << ",\n  \"worst_target_fraction\": " << worst_target << ",\n  \"worst_ring_bound_ratio\": " << worst_ring
        << ",\n  \"wrong\": " << wrong_total << "\n}\n";
      f.close();
      if (!f) throw rz::error(rz::errc::io_error, "--json " + o.json_path + ": writing failed");
    }
    (void)cudaStreamDestroy(stream);
    return wrong_total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringzero-gpu-bench: %s\n", rz::error_text(e).c_str());
    return 2;
  }
}
