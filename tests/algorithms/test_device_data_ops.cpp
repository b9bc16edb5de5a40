// The device data path of the collectives, checked on the CPU: a local communicator that says
// its buffers are CUDA memory (memory_space::cuda), and a table of "device primitives" that run
// the host primitives. The collectives must then route every copy, combine, scale and cast through
// the table on the communicator's stream (algorithms/device_data_ops.hpp) and give exactly the
// host backend's results; without a table they must refuse on every rank, and a failing
// "kernel" must raise errc::backend_failure naming it.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ringzero/algorithms/device_data_ops.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;

namespace {

int stream_token = 0;  // the fake stream's identity
std::atomic<int> calls_copy{0}, calls_reduce{0}, calls_scale{0}, calls_cast{0}, wrong_stream{0};
std::atomic<bool> fail_scale{false};

int host_reduce(void* dst, const void* a, const void* b, std::uint64_t n, const primitive::reduce_spec& s,
                void* stream) noexcept {
  if (stream != &stream_token) ++wrong_stream;
  ++calls_reduce;
  primitive::reduce_into(dst, a, b, n, s);
  return 0;
}
int host_cast(void* dst, dtype dt, const void* src, dtype st, std::uint64_t n, void* stream) noexcept {
  if (stream != &stream_token) ++wrong_stream;
  ++calls_cast;
  primitive::cast_into(dst, dt, src, st, n);
  return 0;
}
int host_scale(void* dst, const void* src, std::uint64_t n, dtype t, double s, void* stream) noexcept {
  if (stream != &stream_token) ++wrong_stream;
  ++calls_scale;
  if (fail_scale) return 2;
  primitive::scale_into(dst, src, n, t, s);
  return 0;
}
int host_fill(void* dst, std::uint64_t n, dtype t, double v, void*) noexcept {
  primitive::fill(dst, n, t, v);
  return 0;
}
int host_copy(void* dst, const void* src, std::uint64_t bytes, void* stream) noexcept {
  if (stream != &stream_token) ++wrong_stream;
  ++calls_copy;
  if (dst != src) std::memcpy(dst, src, bytes);
  return 0;
}
int host_set_device(int) noexcept { return 0; }
const char* host_error_name(int) noexcept { return "fakeError"; }
const char* host_error_string(int) noexcept { return "the fake kernel failed"; }
int host_divide(void* dst, const void* src, std::uint64_t n, dtype t, std::int64_t d, void*) noexcept {
  primitive::divide_into(dst, src, n, t, d);
  return 0;
}
int host_allocate(void** p, std::uint64_t bytes) noexcept {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  return *p ? 0 : 2;
}
int host_deallocate(void* p) noexcept {
  std::free(p);
  return 0;
}
int host_synchronize(void*) noexcept { return 0; }

const primitive::device_primitives host_table{&host_reduce, &host_cast,       &host_scale,      &host_fill,
                                              &host_copy,   &host_set_device, &host_error_name, &host_error_string,
                                              &host_divide, &host_allocate,   &host_deallocate, &host_synchronize};

/// Registers `table` for one test and restores "none" afterwards.
struct registered {
  explicit registered(const primitive::device_primitives* table) { primitive::register_device_primitives(table); }
  ~registered() { primitive::register_device_primitives(nullptr); }
};

/// A local rank that presents its (host) buffers as CUDA memory.
class pretend_cuda_communicator final : public local::communicator {
 public:
  using local::communicator::communicator;
  memory_space space() const noexcept override { return memory_space::cuda; }
  void* cuda_stream() const noexcept override { return &stream_token; }
  int cuda_device() const noexcept override { return 0; }
  bool supports(algorithm a, collective_kind) const noexcept override {
    return a == algorithm::ring || a == algorithm::halving_doubling;
  }
};

template <class F>
void launch_pretend(int n, F&& fn) {
  local::detail::run_world<pretend_cuda_communicator>(
      n, {}, [](std::optional<pretend_cuda_communicator>& c, local::world& w, int r) { c.emplace(w, r); },
      std::forward<F>(fn), "test");
}

/// Rank r's input: random values (exact comparisons need the same inputs on both paths).
std::vector<unsigned char> input_of(dtype t, std::uint64_t count, int r) {
  std::mt19937_64 gen(static_cast<std::uint64_t>(r) * 7919 + count);
  std::vector<unsigned char> v(count * dtype_size(t));
  visit_dtype(t, [&]<class T>() {
    std::uniform_int_distribution<int> d(-50, 50);
    for (std::uint64_t i = 0; i < count; ++i)
      reinterpret_cast<T*>(v.data())[i] = primitive::detail::convert<T>(d(gen) * 0.25);
  });
  return v;
}

struct outcome {
  std::vector<std::vector<unsigned char>> recv;
};

/// Runs one collective on n ranks, host or pretend-device, and returns every rank's output.
template <bool Device>
outcome run(collective_kind k, int n, dtype t, reduce_op op, algorithm a, std::uint64_t count) {
  outcome out;
  out.recv.resize(static_cast<std::size_t>(n));
  const std::size_t es = dtype_size(t);
  auto body = [&](communicator& c) {
    const int r = c.rank();
    const std::uint64_t whole = count * static_cast<std::uint64_t>(n);
    const bool scatter = k == collective_kind::reduce_scatter;
    const bool gather = k == collective_kind::all_gather;
    std::vector<unsigned char> send = input_of(t, scatter ? whole : count, r);
    std::vector<unsigned char> recv((gather ? whole : count) * es, 0x5A);
    collective_options o;
    o.algo = a;
    reduce_op my_op = op;
    if (op.kind == reduce_kind::premul_sum) my_op = reduce_op::premul_sum(op.scalar + r);  // ranks may differ
    switch (k) {
      case collective_kind::all_reduce: all_reduce(c, send.data(), recv.data(), count, t, my_op, o); break;
      case collective_kind::reduce_scatter: reduce_scatter(c, send.data(), recv.data(), count, t, my_op, o); break;
      case collective_kind::all_gather: all_gather(c, send.data(), recv.data(), count, t, o); break;
      case collective_kind::broadcast: broadcast(c, send.data(), recv.data(), count, t, n - 1, o); break;
      case collective_kind::reduce: reduce(c, send.data(), recv.data(), count, t, my_op, 0, o); break;
      default: break;
    }
    out.recv[static_cast<std::size_t>(r)] = recv;
  };
  if constexpr (Device)
    launch_pretend(n, [&](pretend_cuda_communicator& c) { body(c); });
  else
    local::launch(n, [&](local::communicator& c) { body(c); });
  return out;
}

}  // namespace

TEST_CASE("without registered kernels, device memory is refused on every rank; a barrier still runs") {
  registered none(nullptr);
  std::atomic<int> refused{0};
  launch_pretend(3, [&](pretend_cuda_communicator& c) {
    std::vector<float> x(16, 1.0f);
    try {
      all_reduce(c, x.data(), x.data(), x.size(), dtype::float32, reduce_kind::sum);
    } catch (const error& e) {
      if (std::string(e.what()).find("<ringzero/cuda.cuh>") != std::string::npos) ++refused;
    }
    barrier(c);
  });
  CHECK(refused == 3);
}

TEST_CASE("collectives on device memory run through the kernel table and match the host backend") {
  registered host_kernels(&host_table);
  for (int n : {2, 3, 4})
    for (algorithm a : {algorithm::ring, algorithm::halving_doubling})
      for (dtype t : {dtype::float32, dtype::bfloat16, dtype::int32, dtype::float64})
        for (reduce_op op : {reduce_op(reduce_kind::sum), reduce_op(reduce_kind::avg), reduce_op(reduce_kind::max),
                             reduce_op::premul_sum(2.0)})
          for (collective_kind k : {collective_kind::all_reduce, collective_kind::reduce_scatter,
                                    collective_kind::all_gather, collective_kind::broadcast, collective_kind::reduce}) {
            CAPTURE(n);
            CAPTURE(algorithm_name(a));
            CAPTURE(dtype_name(t));
            CAPTURE(reduce_kind_name(op.kind));
            CAPTURE(collective_name(k));
            calls_copy = calls_reduce = calls_scale = calls_cast = wrong_stream = 0;
            const outcome host = run<false>(k, n, t, op, a, 1003);
            const outcome dev = run<true>(k, n, t, op, a, 1003);
            CHECK(wrong_stream == 0);
            if (k == collective_kind::all_reduce || k == collective_kind::reduce_scatter) CHECK(calls_reduce > 0);
            if (k == collective_kind::all_gather) CHECK(calls_copy > 0);
            if (op.kind == reduce_kind::premul_sum && k != collective_kind::all_gather &&
                k != collective_kind::broadcast)
              CHECK(calls_scale > 0);
            // bfloat16 sum, avg and premul_sum widen to float32 and narrow through the cast kernel
            const bool widened = t == dtype::bfloat16 && op.kind != reduce_kind::max && is_reduction(k);
            CHECK((calls_cast > 0) == widened);
            for (int r = 0; r < n; ++r)
              REQUIRE(dev.recv[static_cast<std::size_t>(r)] == host.recv[static_cast<std::size_t>(r)]);
          }
}

TEST_CASE("a failing kernel raises errc::backend_failure naming the operation and the CUDA error") {
  registered host_kernels(&host_table);
  fail_scale = true;
  try {
    launch_pretend(1, [&](pretend_cuda_communicator& c) {
      std::vector<float> x(8, 1.0f), y(8, 0.0f);
      all_reduce(c, x.data(), y.data(), x.size(), dtype::float32, reduce_op::premul_sum(3.0));
    });
    FAIL("the failed kernel went unnoticed");
  } catch (const error& e) {
    CHECK(e.kind() == errc::backend_failure);
    const std::string what = e.what();
    CHECK(what.find("device scale") != std::string::npos);
    CHECK(what.find("fakeError") != std::string::npos);
  }
  fail_scale = false;
}
