// The gradient reducer's device-memory path, checked on the CPU: a local communicator that says
// its buffers are CUDA memory (memory_space::cuda, one fake stream per rank) and a table of
// "device primitives" that run the host primitives and count what they are asked to do. The
// reducer must then move every byte through the table on the rank's stream (buckets allocated
// once, copies, zeroing, divisions and casts enqueued, no stream synchronisation in a plain
// step) and give exactly the host reducer's results, step by step, with and without bucket
// views, with both compression hooks, with accumulation, unused parameters, the one rebuild and
// uneven inputs (join). Without kernels, with a host-only hook, or when a "kernel" fails, every
// rank gets a clear error. The same comparison on a real GPU is tests/gpu/test_ddp_cuda.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "reducer_test_util.hpp"
#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using namespace ringzero::test;

namespace {

constexpr int max_ranks = 8;
int stream_tokens[max_ranks] = {};  // rank r's fake stream is &stream_tokens[r]

/// What the stand-in table was asked to do.
struct table_calls {
  std::atomic<int> allocate{0}, deallocate{0}, copy{0}, fill{0}, divide{0}, cast{0}, synchronize{0}, reduce{0};
  std::atomic<int> bad_stream{0}, bad_device{0};
  std::atomic<int> fail_copy_on_rank{-1};  ///< copies on this rank's stream fail
  void reset() {
    for (auto* c :
         {&allocate, &deallocate, &copy, &fill, &divide, &cast, &synchronize, &reduce, &bad_stream, &bad_device})
      *c = 0;
    fail_copy_on_rank = -1;
  }
};
table_calls calls;

bool known_stream(void* s) {
  for (int& t : stream_tokens)
    if (s == &t) return true;
  return false;
}
void note_stream(void* s) {
  if (!known_stream(s)) ++calls.bad_stream;
}

int fake_reduce(void* dst, const void* a, const void* b, std::uint64_t n, const primitive::reduce_spec& s,
                void* stream) noexcept {
  note_stream(stream);
  ++calls.reduce;
  primitive::reduce_into(dst, a, b, n, s);
  return 0;
}
int fake_cast(void* dst, dtype dt, const void* src, dtype st, std::uint64_t n, void* stream) noexcept {
  note_stream(stream);
  ++calls.cast;
  primitive::cast_into(dst, dt, src, st, n);
  return 0;
}
int fake_scale(void* dst, const void* src, std::uint64_t n, dtype t, double s, void* stream) noexcept {
  note_stream(stream);
  primitive::scale_into(dst, src, n, t, s);
  return 0;
}
int fake_fill(void* dst, std::uint64_t n, dtype t, double v, void* stream) noexcept {
  note_stream(stream);
  ++calls.fill;
  primitive::fill(dst, n, t, v);
  return 0;
}
int fake_copy(void* dst, const void* src, std::uint64_t bytes, void* stream) noexcept {
  note_stream(stream);
  ++calls.copy;
  const int failing = calls.fail_copy_on_rank.load();
  if (failing >= 0 && stream == &stream_tokens[failing]) return 700;
  if (dst != src && bytes) std::memcpy(dst, src, bytes);
  return 0;
}
int fake_set_device(int device) noexcept {
  if (device != 0) ++calls.bad_device;
  return 0;
}
const char* fake_error_name(int) noexcept { return "cudaErrorIllegalAddress"; }
const char* fake_error_string(int) noexcept { return "the fake device failed"; }
int fake_divide(void* dst, const void* src, std::uint64_t n, dtype t, std::int64_t d, void* stream) noexcept {
  note_stream(stream);
  ++calls.divide;
  primitive::divide_into(dst, src, n, t, d);
  return 0;
}
int fake_allocate(void** p, std::uint64_t bytes) noexcept {
  ++calls.allocate;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (*p) std::memset(*p, 0xA5, (bytes + 255) / 256 * 256);  // "device memory" starts as garbage
  return *p ? 0 : 2;
}
int fake_deallocate(void* p) noexcept {
  if (p) ++calls.deallocate;
  std::free(p);
  return 0;
}
int fake_synchronize(void* stream) noexcept {
  note_stream(stream);
  ++calls.synchronize;
  return 0;
}

const primitive::device_primitives fake_table{&fake_reduce, &fake_cast,       &fake_scale,      &fake_fill,
                                              &fake_copy,   &fake_set_device, &fake_error_name, &fake_error_string,
                                              &fake_divide, &fake_allocate,   &fake_deallocate, &fake_synchronize};

/// Registers `table` for one test and restores "none" afterwards.
struct registered {
  explicit registered(const primitive::device_primitives* table) {
    calls.reset();
    primitive::register_device_primitives(table);
  }
  ~registered() { primitive::register_device_primitives(nullptr); }
};

/// A local rank that presents its (host) buffers as CUDA memory on device 0 with its own stream.
class pretend_cuda_communicator final : public local::communicator {
 public:
  using local::communicator::communicator;
  memory_space space() const noexcept override { return memory_space::cuda; }
  void* cuda_stream() const noexcept override { return &stream_tokens[rank()]; }
  int cuda_device() const noexcept override { return 0; }
  bool supports(algorithm a, collective_kind) const noexcept override {
    return a == algorithm::ring || a == algorithm::halving_doubling;
  }
};

/// Runs `body` on n ranks of the host local backend or of the pretend-device one; returns every
/// rank's error text ("" when it succeeded).
std::vector<std::string> run_on(bool device, int n, const std::function<void(communicator&)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  auto guarded = [&](communicator& c) {
    c.set_forced_algorithm(algorithm::ring);  // the same schedule on both sides, so the same bits
    try {
      body(c);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(c.rank())] = e.what();
      throw;
    }
  };
  local::launch_options opt;
  opt.timeout = std::chrono::duration<double>(20.0);
  try {
    if (device)
      local::detail::run_world<pretend_cuda_communicator>(
          n, opt, [](std::optional<pretend_cuda_communicator>& c, local::world& w, int r) { c.emplace(w, r); },
          [&](pretend_cuda_communicator& c) { guarded(c); }, "test");
    else
      local::launch(
          n, [&](local::communicator& c) { guarded(c); }, opt);
  } catch (...) {}
  return errors;
}

// Parameters of mixed sizes and dtypes; with 256-byte limits they form several buckets.
const std::vector<std::uint64_t> kDeviceCounts = {40, 7, 0, 33, 64, 5, 19, 100};
const std::vector<dtype> kDeviceTypes = {dtype::float32, dtype::float32, dtype::float32, dtype::float64,
                                         dtype::float32, dtype::float64, dtype::float32, dtype::float32};

/// Gradient values that round (so that the order and kind of every operation shows in the bits).
double rough_value(int rank, std::size_t i, std::size_t k, int step, int micro) {
  return 0.1 * (rank + 1) + 0.013 * static_cast<double>(i) - 0.0007 * static_cast<double>(k) + 0.37 * step +
         0.011 * micro + (k % 3 == 0 ? 1e3 : 0.0);
}

struct device_config {
  int ranks = 2;
  bool view = false;
  std::string hook = "none";  // none, fp16, bf16
  int accumulate = 1;
  bool find_unused = false;
  bool join = false;
  bool shuffled = false;  // mark in a rank-dependent order (drives the rebuild)
};

/// Every rank's gradient bytes after every finish(), then its parameter bytes at the end.
using trace = std::vector<std::vector<unsigned char>>;

std::vector<trace> train(bool device, const device_config& cfg) {
  std::vector<trace> traces(static_cast<std::size_t>(cfg.ranks));
  auto errors = run_on(device, cfg.ranks, [&](communicator& comm) {
    const int r = comm.rank();
    toy_model m(kDeviceCounts, kDeviceTypes);
    for (std::size_t i = 0; i < m.size(); ++i)
      for (std::size_t k = 0; k < m.count(i); ++k) {
        if (m.types[i] == dtype::float64)
          m.values64[m.slot[i]][k] = 100.0 * r + static_cast<double>(i * 1000 + k);
        else
          m.values32[m.slot[i]][k] = static_cast<float>(100 * r + static_cast<int>(i * 1000 + k));
      }
    reducer_options opt;
    opt.bucket_byte_limits = {256};
    opt.gradient_as_bucket_view = cfg.view;
    opt.find_unused_parameters = cfg.find_unused;
    opt.join = cfg.join;
    if (cfg.hook == "fp16") opt.hook = fp16_compress_hook();
    if (cfg.hook == "bf16") opt.hook = bf16_compress_hook();
    gradient_reducer red(comm, m.parameters(), opt);
    trace& out = traces[static_cast<std::size_t>(r)];
    const int steps = cfg.join ? 3 + r % 3 : 4;  // uneven inputs in join mode
    for (int s = 0; s < steps; ++s) {
      for (int micro = 0; micro < cfg.accumulate; ++micro) {
        red.set_require_gradient_sync(micro + 1 == cfg.accumulate);
        std::vector<std::size_t> order(m.size());
        for (std::size_t j = 0; j < m.size(); ++j) order[j] = m.size() - 1 - j;
        if (cfg.shuffled && s == 0) std::rotate(order.begin(), order.begin() + (r + 1) % 4, order.end());
        for (std::size_t i : order) {
          if (cfg.find_unused && i == 4 && s % 2 == 1) continue;  // parameter 4 unused in odd steps
          void* g = red.gradient(i);
          for (std::size_t k = 0; k < m.count(i); ++k) {
            const double v = rough_value(r, i, k, s, micro);
            const double before = micro > 0 ? toy_model::read(g, m.types[i], k) : 0.0;
            toy_model::write(g, m.types[i], k, before + v);
          }
          red.mark_ready(i);
        }
        red.finish();
      }
      std::vector<unsigned char> grads;
      for (std::size_t i = 0; i < m.size(); ++i) {
        const auto* g = static_cast<const unsigned char*>(red.gradient(i));
        grads.insert(grads.end(), g, g + m.count(i) * dtype_size(m.types[i]));
      }
      out.push_back(std::move(grads));
    }
    if (cfg.join) red.join();
    comm.synchronize();
    std::vector<unsigned char> values;
    for (auto& v : m.values32)
      values.insert(values.end(), reinterpret_cast<unsigned char*>(v.data()),
                    reinterpret_cast<unsigned char*>(v.data() + v.size()));
    for (auto& v : m.values64)
      values.insert(values.end(), reinterpret_cast<unsigned char*>(v.data()),
                    reinterpret_cast<unsigned char*>(v.data() + v.size()));
    out.push_back(std::move(values));
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  return traces;
}

}  // namespace

TEST_CASE("the device path gives the host reducer's bits: views, hooks, accumulation, unused, rebuild, join") {
  registered table(&fake_table);
  std::vector<device_config> configs;
  for (int n : {1, 2, 3, 4})
    for (bool view : {false, true})
      for (const char* hook : {"none", "fp16", "bf16"}) {
        device_config c;
        c.ranks = n;
        c.view = view;
        c.hook = hook;
        configs.push_back(c);
      }
  {
    device_config c;
    c.ranks = 3;
    c.accumulate = 3;
    configs.push_back(c);
    c.view = true;
    c.hook = "bf16";
    configs.push_back(c);
  }
  {
    device_config c;
    c.ranks = 3;
    c.find_unused = true;
    configs.push_back(c);
  }
  {
    device_config c;
    c.ranks = 4;
    c.shuffled = true;
    configs.push_back(c);
    c.view = true;
    configs.push_back(c);
  }
  for (const char* hook : {"none", "fp16"})
    for (bool view : {false, true}) {
      device_config c;
      c.ranks = 3;
      c.join = true;
      c.hook = hook;
      c.view = view;
      configs.push_back(c);
    }
  for (const device_config& c : configs) {
    CAPTURE(c.ranks);
    CAPTURE(c.view);
    CAPTURE(c.hook);
    CAPTURE(c.accumulate);
    CAPTURE(c.find_unused);
    CAPTURE(c.join);
    CAPTURE(c.shuffled);
    const std::vector<trace> host = train(false, c);
    calls.reset();
    const std::vector<trace> dev = train(true, c);
    CHECK(calls.bad_stream == 0);
    CHECK(calls.bad_device == 0);
    CHECK(calls.allocate > 0);
    CHECK(calls.copy > 0);
    if (c.hook != "none" && c.ranks > 1) {
      CHECK(calls.cast > 0);
      CHECK(calls.divide > 0);
    }
    CHECK(calls.allocate == calls.deallocate);  // every device allocation freed at the end
    REQUIRE(host.size() == dev.size());
    for (std::size_t r = 0; r < host.size(); ++r) {
      REQUIRE(host[r].size() == dev[r].size());
      for (std::size_t s = 0; s < host[r].size(); ++s) {
        CAPTURE(r);
        CAPTURE(s);
        REQUIRE(host[r][s] == dev[r][s]);
      }
    }
  }
}

TEST_CASE("device memory: buckets allocated once, steps allocate nothing and never wait for the stream") {
  registered table(&fake_table);
  std::atomic<int> after_construction{-1}, syncs_after_construction{-1}, after_rebuild{-1}, syncs_after_rebuild{-1};
  std::atomic<int> allocs_at_end{-1}, syncs_at_end{-1};
  std::atomic<int> zero_mismatch{0};
  auto errors = run_on(true, 2, [&](communicator& comm) {
    toy_model m(kDeviceCounts, kDeviceTypes);
    reducer_options opt;
    opt.bucket_byte_limits = {256};
    gradient_reducer red(comm, m.parameters(), opt);
    barrier(comm);
    if (comm.rank() == 0) {
      after_construction = calls.allocate.load();
      syncs_after_construction = calls.synchronize.load();
    }
    barrier(comm);
    for (int s = 0; s < 5; ++s) {
      for (std::size_t i = m.size(); i-- > 0;) red.mark_ready(i);
      red.finish();
      barrier(comm);
      if (s == 0 && comm.rank() == 0) {  // the rebuild after the first step may reallocate, once
        after_rebuild = calls.allocate.load();
        syncs_after_rebuild = calls.synchronize.load();
      }
      barrier(comm);
    }
    if (red.stats().rebuilds != 0) ++zero_mismatch;  // reverse marking keeps the layout
    if (comm.rank() == 0) {
      allocs_at_end = calls.allocate.load();
      syncs_at_end = calls.synchronize.load();
    }
    barrier(comm);
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  CHECK(after_construction > 0);
  CHECK(zero_mismatch == 0);
  CHECK(allocs_at_end == after_rebuild);       // no allocation in steps 2-5
  CHECK(syncs_at_end == syncs_after_rebuild);  // and no stream synchronisation
  CHECK(after_rebuild == after_construction);  // same layout: the rebuild kept the buckets
  CHECK(syncs_after_construction > 0);         // the agreement at construction read back its values
  CHECK(calls.allocate == calls.deallocate);
}

TEST_CASE("device memory without registered kernels: errc::unsupported on every rank, naming <ringzero/cuda.cuh>") {
  registered none(nullptr);
  auto errors = run_on(true, 3, [&](communicator& comm) {
    toy_model m({10, 20}, {});
    try {
      gradient_reducer red(comm, m.parameters());
      FAIL("constructed without kernels");
    } catch (const error& e) {
      CHECK(e.kind() == errc::unsupported);
      throw;
    }
  });
  for (auto& e : errors) {
    CHECK(contains(e, "CUDA device memory"));
    CHECK(contains(e, "<ringzero/cuda.cuh>"));
  }
}

namespace {
/// A hook written for host memory (does not override `supports`).
class host_only_hook final : public comm_hook {
 public:
  std::string name() const override { return "host_only"; }
  work launch(communicator& comm, const gradient_bucket& b) override {
    return all_reduce_async(comm, b.data, b.data, b.count, b.type, reduce_kind::sum);
  }
};
}  // namespace

TEST_CASE("a hook that does not support device memory is refused on every rank") {
  registered table(&fake_table);
  auto errors = run_on(true, 2, [&](communicator& comm) {
    toy_model m({10, 20}, {});
    reducer_options opt;
    opt.hook = std::make_shared<host_only_hook>();
    try {
      gradient_reducer red(comm, m.parameters(), opt);
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      throw;
    }
  });
  for (auto& e : errors) CHECK(contains(e, "does not support CUDA device memory"));
  // The same hook is fine on host memory.
  auto host_errors = run_on(false, 2, [&](communicator& comm) {
    toy_model m({10, 20}, {});
    reducer_options opt;
    opt.hook = std::make_shared<host_only_hook>();
    gradient_reducer red(comm, m.parameters(), opt);
    red.mark_ready(1);
    red.mark_ready(0);
    red.finish();
  });
  for (auto& e : host_errors) CHECK_MESSAGE(e.empty(), e);
}

TEST_CASE("a failing device copy in mark_ready fails that rank with errc::backend_failure and every peer promptly") {
  registered table(&fake_table);
  std::atomic<int> backend_failures{0};
  auto errors = run_on(true, 3, [&](communicator& comm) {
    toy_model m({10, 20, 30}, {});
    reducer_options opt;
    opt.bucket_byte_limits = {64};
    gradient_reducer red(comm, m.parameters(), opt);
    barrier(comm);
    if (comm.rank() == 0) calls.fail_copy_on_rank = 1;
    barrier(comm);
    try {
      for (std::size_t i = 3; i-- > 0;) red.mark_ready(i);
      red.finish();
    } catch (const error& e) {
      if (e.kind() == errc::backend_failure) ++backend_failures;
      throw;
    }
  });
  CHECK(backend_failures >= 1);
  CHECK(contains(errors[1], "cudaErrorIllegalAddress"));
  CHECK(contains(errors[1], "mark_ready"));
  for (auto& e : errors) CHECK_FALSE(e.empty());  // nobody hangs, nobody pretends to succeed
}
