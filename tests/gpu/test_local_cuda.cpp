// The local backend on CUDA device memory (backend/local/cuda_communicator.hpp): 2, 3 and 4
// ranks on ONE GPU, each with its own stream. A sweep of collectives x dtypes x ops x counts x
// algorithms must give, bit for bit, what the host local backend gives with the same inputs
// and algorithm (the schedules are shared; only the data operations differ), and the cases that
// broke other libraries (C1-C4, C9, C10, C5, C6, C12) hold on device memory too.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_test_support.hpp"
#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;

namespace {

/// One collective call of the sweep.
struct case_spec {
  collective_kind kind = collective_kind::all_reduce;
  dtype type = dtype::float32;
  reduce_op op{};
  int root = 0;
  algorithm algo = algorithm::ring;
  std::uint64_t count = 0;
  bool in_place = false;
  int misalign = 0;  ///< elements by which both buffers are shifted from 256-byte alignment
};

/// Elements of rank r's send and receive buffers for `k` on n ranks.
std::pair<std::uint64_t, std::uint64_t> extents(const case_spec& k, int n) {
  const std::uint64_t whole = k.count * static_cast<std::uint64_t>(n);
  switch (k.kind) {
    case collective_kind::reduce_scatter: return {whole, k.count};
    case collective_kind::all_gather: return {k.count, whole};
    case collective_kind::all_to_all: return {whole, whole};
    default: return {k.count, k.count};
  }
}

/// Rank r's input for case number `index`: finite values (arithmetic NaN payloads are the
/// hardware's, so NaN is kept out of the bitwise comparison), small for prod, and sums exact
/// in any order (the 16-bit floats in a narrower range).
std::vector<unsigned char> input_of(const case_spec& k, std::size_t index, int r, std::uint64_t elements) {
  std::mt19937_64 gen(index * 1315423911ULL + static_cast<std::uint64_t>(r));
  std::vector<unsigned char> v(static_cast<std::size_t>(elements) * dtype_size(k.type));
  visit_dtype(k.type, [&]<class T>() {
    T* p = reinterpret_cast<T*>(v.data());
    for (std::uint64_t i = 0; i < elements; ++i) {
      if (k.op.kind == reduce_kind::prod) {
        static const double small[] = {-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0};
        p[i] = primitive::detail::convert<T>(small[gen() % 8]);
      } else if constexpr (std::is_integral_v<T>) {
        p[i] = static_cast<T>(gen());  // any integer: sums wrap
      } else if constexpr (sizeof(T) == 2) {
        // float16 / bfloat16: quarters in [-4, 4], so that every partial sum of up to 4 ranks
        // (premul_sum's scalars included) is exact in 8 significant bits: the schedules may
        // combine in different orders (halving_doubling picks recursive doubling from the
        // link model, which differs between host and device), the bits may not.
        p[i] = primitive::detail::convert<T>((static_cast<double>(gen() % 33) - 16.0) / 4.0);
      } else {
        p[i] = primitive::detail::convert<T>((static_cast<double>(gen() % 20001) - 10000.0) / 8.0);
      }
    }
  });
  return v;
}

/// Where a rank's buffers live: host vectors, or device memory filled and read on its stream.
struct host_memory {
  std::vector<unsigned char> arena;
  explicit host_memory(std::size_t bytes) : arena(bytes) {}
  unsigned char* base() { return arena.data(); }
  void put(unsigned char* dst, const std::vector<unsigned char>& src) { std::memcpy(dst, src.data(), src.size()); }
  std::vector<unsigned char> get(const unsigned char* src, std::size_t bytes) { return {src, src + bytes}; }
};

struct device_memory {
  local::cuda_communicator& comm;
  gpu_test::device_buffer arena;
  device_memory(local::cuda_communicator& c, std::size_t bytes) : comm(c), arena(bytes) {}
  unsigned char* base() { return arena.get(); }
  void put(unsigned char* dst, const std::vector<unsigned char>& src) {
    primitive::cudart::check(cudaMemcpyAsync(dst, src.data(), src.size(), cudaMemcpyHostToDevice, comm.stream()),
                             "cudaMemcpyAsync H2D");
    comm.synchronize();  // the source vector dies with the caller's scope
  }
  std::vector<unsigned char> get(const unsigned char* src, std::size_t bytes) {
    std::vector<unsigned char> v(bytes);
    comm.synchronize();
    primitive::cudart::check(cudaMemcpyAsync(v.data(), src, bytes, cudaMemcpyDeviceToHost, comm.stream()),
                             "cudaMemcpyAsync D2H");
    comm.synchronize();
    return v;
  }
};

/// Bytes a rank's arena needs for every case.
std::size_t arena_bytes(const std::vector<case_spec>& cases, int n) {
  std::size_t most = 0;
  for (const auto& k : cases) {
    const auto [s, r] = extents(k, n);
    most = std::max<std::size_t>(most, static_cast<std::size_t>((s + r + 64) * dtype_size(k.type)) + 1024);
  }
  return most;
}

/// Runs every case on rank `c` and returns, per case, the bytes of its output buffer (the
/// whole buffer for in-place calls; the receive buffer otherwise, sentinel-filled beforehand,
/// so writes where none are due show too).
template <class Memory>
std::vector<std::vector<unsigned char>> run_cases(communicator& c, const std::vector<case_spec>& cases, Memory& m) {
  const int n = c.world_size(), r = c.rank();
  std::vector<std::vector<unsigned char>> out;
  for (std::size_t index = 0; index < cases.size(); ++index) {
    const case_spec& k = cases[index];
    const std::size_t es = dtype_size(k.type);
    const auto [send_elems, recv_elems] = extents(k, n);
    unsigned char* send = m.base() + k.misalign * es;
    unsigned char* recv = m.base() + ((send_elems * es + 511) / 256 * 256) + k.misalign * es;
    const std::vector<unsigned char> input = input_of(k, index, r, send_elems);
    std::vector<unsigned char> sentinel(static_cast<std::size_t>(recv_elems) * es,
                                        static_cast<unsigned char>(0xA5 + index));
    unsigned char* checked = recv;
    std::size_t checked_bytes = sentinel.size();
    if (k.in_place) {
      switch (k.kind) {
        case collective_kind::reduce_scatter:  // recv = send + r*count
          recv = send + static_cast<std::uint64_t>(r) * k.count * es;
          m.put(send, input);
          checked = send;
          checked_bytes = input.size();
          break;
        case collective_kind::all_gather: {  // send = recv + r*count
          m.put(recv, sentinel);
          send = recv + static_cast<std::uint64_t>(r) * k.count * es;
          m.put(send, input);
          break;
        }
        default:  // send == recv
          m.put(recv, input);
          send = recv;
          break;
      }
    } else {
      m.put(send, input);
      m.put(recv, sentinel);
    }
    collective_options o;
    o.algo = k.algo;
    reduce_op op = k.op;
    if (op.kind == reduce_kind::premul_sum)
      op = reduce_op::premul_sum(is_floating_point(k.type) ? 0.75 - 0.5 * r : 3.0 - 2.0 * r);
    switch (k.kind) {
      case collective_kind::all_reduce: all_reduce(c, send, recv, k.count, k.type, op, o); break;
      case collective_kind::reduce_scatter: reduce_scatter(c, send, recv, k.count, k.type, op, o); break;
      case collective_kind::all_gather: all_gather(c, send, recv, k.count, k.type, o); break;
      case collective_kind::broadcast: broadcast(c, send, recv, k.count, k.type, k.root, o); break;
      case collective_kind::reduce: reduce(c, send, recv, k.count, k.type, op, k.root, o); break;
      case collective_kind::all_to_all: all_to_all(c, send, recv, k.count, k.type, o); break;
      default: break;
    }
    out.push_back(m.get(checked, checked_bytes));
  }
  return out;
}

/// Every rank's outputs of every case, on the host backend and on device memory.
struct sweep_result {
  std::vector<std::vector<std::vector<unsigned char>>> host, device;  // [rank][case]
};

sweep_result run_sweep(int n, const std::vector<case_spec>& cases) {
  sweep_result s;
  s.host.resize(static_cast<std::size_t>(n));
  s.device.resize(static_cast<std::size_t>(n));
  const std::size_t bytes = arena_bytes(cases, n);
  local::launch(n, [&](local::communicator& c) {
    host_memory m(bytes);
    s.host[static_cast<std::size_t>(c.rank())] = run_cases(c, cases, m);
  });
  local::cuda_launch_options options;
  options.devices = {0};  // every rank on one GPU
  local::launch_cuda(
      n,
      [&](local::cuda_communicator& c) {
        device_memory m(c, bytes);
        s.device[static_cast<std::size_t>(c.rank())] = run_cases(c, cases, m);
      },
      options);
  return s;
}

std::string describe(const case_spec& k) {
  return std::string(collective_name(k.kind)) + " " + std::string(dtype_name(k.type)) + " " +
         std::string(reduce_kind_name(k.op.kind)) + " " + std::string(algorithm_name(k.algo)) + " count " +
         std::to_string(k.count) + (k.in_place ? " in place" : "") + " root " + std::to_string(k.root) + " misalign " +
         std::to_string(k.misalign);
}

std::vector<case_spec> sweep_cases(int n) {
  std::vector<case_spec> cases;
  const std::uint64_t counts[] = {1, 3, 7, 1000, 65537};
  const reduce_op all_ops[] = {reduce_kind::sum, reduce_kind::prod, reduce_kind::min,
                               reduce_kind::max, reduce_kind::avg,  reduce_op::premul_sum(1.0)};
  const reduce_op some_ops[] = {reduce_kind::sum, reduce_kind::avg, reduce_op::premul_sum(1.0)};
  const dtype some_types[] = {dtype::float32, dtype::bfloat16, dtype::int64, dtype::uint8};
  for (algorithm a : {algorithm::ring, algorithm::halving_doubling}) {
    for (dtype t : all_dtypes)
      for (const reduce_op& op : all_ops)
        for (std::uint64_t count : counts)
          for (bool in_place : {false, true})
            cases.push_back({collective_kind::all_reduce, t, op, 0, a, count, in_place, count == 1000 ? 1 : 0});
    for (dtype t : some_types)
      for (std::uint64_t count : counts) {
        for (const reduce_op& op : some_ops)
          for (bool in_place : {false, true}) {
            cases.push_back({collective_kind::reduce_scatter, t, op, 0, a, count, in_place, 0});
            cases.push_back(
                {collective_kind::reduce, t, op, in_place ? 0 : n - 1, a, count, in_place, count == 7 ? 3 : 0});
          }
        for (bool in_place : {false, true})
          cases.push_back({collective_kind::all_gather, t, {}, 0, a, count, in_place, 0});
        cases.push_back({collective_kind::broadcast, t, {}, n - 1, a, count, false, 0});
        if (a == algorithm::ring) cases.push_back({collective_kind::all_to_all, t, {}, 0, a, count, false, 0});
      }
  }
  cases.push_back(
      {collective_kind::all_reduce, dtype::float32, reduce_kind::sum, 0, algorithm::ring, 1000003, false, 0});
  cases.push_back({collective_kind::all_reduce, dtype::bfloat16, reduce_kind::avg, 0, algorithm::halving_doubling,
                   1000003, true, 0});
  return cases;
}

template <class F>
void on_one_gpu(int n, F&& fn) {
  local::cuda_launch_options options;
  options.devices = {0};
  local::launch_cuda(n, std::forward<F>(fn), options);
}

/// Uploads `values` into new device memory owned by `keep`, on `c`'s stream.
template <class T>
T* to_device(local::cuda_communicator& c, const std::vector<T>& values,
             std::vector<std::unique_ptr<gpu_test::device_buffer>>& keep) {
  keep.push_back(std::make_unique<gpu_test::device_buffer>(values.size() * sizeof(T) + 16));
  primitive::cudart::check(
      cudaMemcpyAsync(keep.back()->get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice, c.stream()),
      "cudaMemcpyAsync H2D");
  c.synchronize();
  return reinterpret_cast<T*>(keep.back()->get());
}

template <class T>
std::vector<T> to_host(local::cuda_communicator& c, const T* device, std::size_t count) {
  std::vector<T> v(count);
  c.synchronize();
  primitive::cudart::check(cudaMemcpyAsync(v.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, c.stream()),
                           "cudaMemcpyAsync D2H");
  c.synchronize();
  return v;
}

}  // namespace

TEST_CASE("2, 3 and 4 ranks on one GPU give the host backend's bits for every collective, dtype, op and algorithm") {
  for (int n : {2, 3, 4}) {
    const std::vector<case_spec> cases = sweep_cases(n);
    const sweep_result s = run_sweep(n, cases);
    for (std::size_t i = 0; i < cases.size(); ++i)
      for (int r = 0; r < n; ++r) {
        const auto& got = s.device[static_cast<std::size_t>(r)][i];
        const auto& want = s.host[static_cast<std::size_t>(r)][i];
        std::string what;
        const long long at = gpu_test::first_difference(cases[i].type, got, want, false, &what);
        INFO("world " << n << ", rank " << r << ": " << describe(cases[i]) << ": " << what);
        REQUIRE(at == -1);
      }
  }
}

TEST_CASE("cases C1, C2, C3, C9 and C10 on device memory") {
  // C1: int8 sum wraps: 120 + 100 = -36. C3: int32 avg of 1, 2, 2 is 1; of -1, -2, -2 is -1.
  on_one_gpu(2, [](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    std::int8_t* x = to_device(c, std::vector<std::int8_t>(64, c.rank() == 0 ? 120 : 100), keep);
    all_reduce(c, x, x, 64, dtype::int8, reduce_kind::sum);
    for (std::int8_t v : to_host(c, x, 64)) CHECK(v == -36);
  });
  on_one_gpu(3, [](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    const std::int32_t v = c.rank() == 0 ? 1 : 2;
    std::int32_t* x = to_device(c, std::vector<std::int32_t>{v, -v}, keep);
    for (algorithm a : {algorithm::ring, algorithm::halving_doubling}) {
      std::int32_t* y = to_device(c, std::vector<std::int32_t>{0, 0}, keep);
      collective_options o;
      o.algo = a;
      all_reduce(c, x, y, 2, dtype::int32, reduce_kind::avg, o);
      const auto got = to_host(c, y, 2);
      CHECK(got[0] == 1);
      CHECK(got[1] == -1);
    }
  });
  // C2: uint64 min/max compare unsigned.
  on_one_gpu(4, [](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    const std::uint64_t top = ~std::uint64_t{0};
    std::uint64_t* x =
        to_device(c, std::vector<std::uint64_t>{c.rank() == 2 ? 0 : top, c.rank() == 2 ? top >> 1 : top}, keep);
    std::uint64_t* lo = to_device(c, std::vector<std::uint64_t>(2, 7), keep);
    std::uint64_t* hi = to_device(c, std::vector<std::uint64_t>(2, 7), keep);
    all_reduce(c, x, lo, 2, dtype::uint64, reduce_kind::min);
    all_reduce(c, x, hi, 2, dtype::uint64, reduce_kind::max);
    CHECK(to_host(c, lo, 2)[0] == 0);
    CHECK(to_host(c, hi, 2)[1] == top);
  });
  // C9: reduce leaves the non-root receive buffer exactly as it was.
  on_one_gpu(2, [](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    const std::int64_t base = c.rank() == 0 ? 1 : 4;
    std::int64_t* x = to_device(c, std::vector<std::int64_t>{base, base + 1, base + 2, base + 3}, keep);
    std::int64_t* y = to_device(c, std::vector<std::int64_t>{-9, -9, -9, -9}, keep);
    reduce(c, x, y, 4, dtype::int64, reduce_kind::sum, 0);
    const auto got = to_host(c, y, 4);
    if (c.rank() == 0)
      CHECK(got == std::vector<std::int64_t>{5, 7, 9, 11});
    else
      CHECK(got == std::vector<std::int64_t>{-9, -9, -9, -9});
  });
  // C10: counts that do not divide: trailing ranks own empty blocks.
  for (const auto& [n, count] : {std::pair<int, std::uint64_t>{4, 1}, {4, 3}, {4, 7}, {3, 1000003}})
    on_one_gpu(n, [n = n, count = count](local::cuda_communicator& c) {
      std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
      std::vector<std::int32_t> mine(count * static_cast<std::uint64_t>(n));
      for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<std::int32_t>(i % 1000) + c.rank();
      std::int32_t* x = to_device(c, mine, keep);
      std::int32_t* all = to_device(c, std::vector<std::int32_t>(mine.size(), -1), keep);
      std::int32_t* part = to_device(c, std::vector<std::int32_t>(count, -1), keep);
      std::int32_t* gathered = to_device(c, std::vector<std::int32_t>(mine.size(), -1), keep);
      const std::int32_t rank_sum = n * (n - 1) / 2;
      for (algorithm a : {algorithm::ring, algorithm::halving_doubling}) {
        collective_options o;
        o.algo = a;
        all_reduce(c, x, all, count, dtype::int32, reduce_kind::sum, o);
        reduce_scatter(c, x, part, count, dtype::int32, reduce_kind::sum, o);
        all_gather(c, x, gathered, count, dtype::int32, o);
        const auto got_all = to_host(c, all, count);
        for (std::uint64_t i = 0; i < count; ++i)
          REQUIRE(got_all[i] == n * static_cast<std::int32_t>(i % 1000) + rank_sum);
        const auto got_part = to_host(c, part, count);
        for (std::uint64_t i = 0; i < count; ++i) {
          const std::uint64_t g = static_cast<std::uint64_t>(c.rank()) * count + i;
          REQUIRE(got_part[i] == n * static_cast<std::int32_t>(g % 1000) + rank_sum);
        }
        const auto got_gathered = to_host(c, gathered, mine.size());
        for (int q = 0; q < n; ++q)
          for (std::uint64_t i = 0; i < count; ++i)
            REQUIRE(got_gathered[static_cast<std::size_t>(q) * count + i] == static_cast<std::int32_t>(i % 1000) + q);
      }
    });
}

TEST_CASE("C22 on device memory: 16-bit averages accumulate in float32 and round once (ring, halving_doubling)") {
  // (a) 8 ranks, bfloat16: rank 0 holds 1.0, the others 2^-8: 0.12890625 (0x3e04);
  // (b) 4 ranks, float16: every rank holds 30000 (0x7353): 30000, not inf. The widening and
  // narrowing are the device cast kernels; the sums travel as float32.
  for (algorithm a : {algorithm::ring, algorithm::halving_doubling}) {
    CAPTURE(algorithm_name(a));
    collective_options o;
    o.algo = a;
    on_one_gpu(8, [&](local::cuda_communicator& c) {
      std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
      std::uint16_t* x = to_device(c, std::vector<std::uint16_t>(5, c.rank() == 0 ? 0x3f80 : 0x3b80), keep);
      std::uint16_t* y = to_device(c, std::vector<std::uint16_t>(5, 0xa5a5), keep);
      all_reduce(c, x, y, 4, dtype::bfloat16, reduce_kind::avg, o);
      CHECK(to_host(c, y, 5) == std::vector<std::uint16_t>{0x3e04, 0x3e04, 0x3e04, 0x3e04, 0xa5a5});
    });
    on_one_gpu(4, [&](local::cuda_communicator& c) {
      std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
      std::uint16_t* x = to_device(c, std::vector<std::uint16_t>(5, 0x7353), keep);
      all_reduce(c, x, x, 4, dtype::float16, reduce_kind::avg, o);
      CHECK(to_host(c, x, 5) == std::vector<std::uint16_t>(5, 0x7353));
    });
  }
}

TEST_CASE("a world of one returns its input bit for bit (C4); zero counts touch nothing (C5)") {
  on_one_gpu(1, [](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    std::vector<bfloat16> in(1000);
    for (std::size_t i = 0; i < in.size(); ++i)
      in[i] = bfloat16::from_bits(static_cast<std::uint16_t>(0x3f80 + i * 37));
    bfloat16* x = to_device(c, in, keep);
    bfloat16* y = to_device(c, std::vector<bfloat16>(1000), keep);
    all_reduce(c, x, y, 1000, dtype::bfloat16, reduce_kind::avg);
    const auto got = to_host(c, y, 1000);
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i].bits == in[i].bits);
  });
  on_one_gpu(3, [](local::cuda_communicator& c) {
    all_reduce(c, nullptr, nullptr, 0, dtype::float32, reduce_kind::sum);
    reduce_scatter(c, nullptr, nullptr, 0, dtype::int8, reduce_kind::max);
    all_gather(c, nullptr, nullptr, 0, dtype::float64);
    broadcast(c, nullptr, nullptr, 0, dtype::uint8, 1);
    barrier(c);
    c.synchronize();
  });
}

TEST_CASE("a count mismatch fails on every rank (C6); a send/recv size mismatch fails (C12)") {
  std::atomic<int> mismatches{0};
  on_one_gpu(4, [&](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    float* x = to_device(c, std::vector<float>(5120, 1.0f), keep);
    try {
      all_reduce(c, x, x, c.rank() == 0 ? 2560 : 5120, dtype::float32, reduce_kind::sum);
    } catch (const error& e) {
      if (e.kind() == errc::contract_mismatch && std::string(e.what()).find("count mismatch") != std::string::npos)
        ++mismatches;
    }
  });
  CHECK(mismatches == 4);
  std::atomic<int> size_errors{0};
  on_one_gpu(2, [&](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    float* x = to_device(c, std::vector<float>(3, 1.0f), keep);
    try {
      if (c.rank() == 0)
        send(c, x, 1, dtype::float32, 1);
      else
        recv(c, x, 3, dtype::float32, 0);
    } catch (const error& e) {
      if (e.kind() == errc::size_mismatch) ++size_errors;
    }
  });
  CHECK(size_errors == 2);
}

TEST_CASE("send/recv around a ring, barrier, and asynchronous collectives on device memory") {
  on_one_gpu(4, [](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    const int n = c.world_size(), r = c.rank();
    std::vector<double> mine(4097);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = r * 10000.0 + static_cast<double>(i);
    double* x = to_device(c, mine, keep);
    double* y = to_device(c, std::vector<double>(mine.size(), 0.0), keep);
    sendrecv(c, x, mine.size(), (r + 1) % n, y, mine.size(), (r + n - 1) % n, dtype::float64);
    const auto got = to_host(c, y, mine.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      REQUIRE(got[i] == ((r + n - 1) % n) * 10000.0 + static_cast<double>(i));
    barrier(c);
    // Three asynchronous all-reduces in flight, then wait: results in issue order.
    std::vector<float*> bufs;
    std::vector<work> pending;
    for (int k = 0; k < 3; ++k) {
      bufs.push_back(to_device(c, std::vector<float>(100000, static_cast<float>(r + k)), keep));
      pending.push_back(all_reduce_async(c, bufs.back(), bufs.back(), 100000, dtype::float32, reduce_kind::sum));
    }
    for (auto& w : pending) w.wait();
    for (int k = 0; k < 3; ++k) {
      const auto sum = to_host(c, bufs[static_cast<std::size_t>(k)], 100000);
      for (float v : sum) REQUIRE(v == static_cast<float>(n * (n - 1) / 2 + n * k));
    }
  });
}

TEST_CASE("local::launch_cuda refuses bad arguments clearly") {
  CHECK_THROWS_AS(local::launch_cuda(0, [](local::cuda_communicator&) {}), error);
  local::cuda_launch_options bad;
  bad.devices = {1000};
  try {
    local::launch_cuda(
        2, [](local::cuda_communicator&) {}, bad);
    FAIL("device 1000 accepted");
  } catch (const error& e) { CHECK(e.kind() == errc::invalid_argument); }
  // direct is not offered on device memory: an explicit request is refused on every rank.
  std::atomic<int> refused{0};
  on_one_gpu(2, [&](local::cuda_communicator& c) {
    std::vector<std::unique_ptr<gpu_test::device_buffer>> keep;
    float* x = to_device(c, std::vector<float>(8, 1.0f), keep);
    collective_options o;
    o.algo = algorithm::direct;
    try {
      all_reduce(c, x, x, 8, dtype::float32, reduce_kind::sum, o);
    } catch (const error& e) {
      if (e.kind() == errc::invalid_argument) ++refused;
    }
  });
  CHECK(refused == 2);
}
