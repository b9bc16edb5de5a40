// The NCCL backend with one rank (what one GPU allows; NCCL refuses two ranks on one device):
// every native collective, dtype and op against the host backend's world of one, ringzero's
// own algorithms through the CUDA kernels, the ways of creating a communicator (init_all and
// launch, the environment, an id file, split), the contract check, and the watchdog: a
// collective that cannot complete is aborted after the timeout with errc::timeout, and the
// communicator then refuses further work with errc::aborted.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpu_test_support.hpp"
#include "ringzero/backend/nccl.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using namespace std::chrono_literals;

namespace {

std::vector<unsigned char> finite_input(dtype t, std::uint64_t count, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<unsigned char> v(static_cast<std::size_t>(count) * dtype_size(t));
  visit_dtype(t, [&]<class T>() {
    T* p = reinterpret_cast<T*>(v.data());
    for (std::uint64_t i = 0; i < count; ++i) {
      if constexpr (std::is_integral_v<T>) {
        p[i] = static_cast<T>(gen());  // any integer: sums wrap
      } else {
        p[i] = primitive::detail::convert<T>((static_cast<double>(gen() % 4001) - 2000.0) / 4.0);
      }
    }
  });
  return v;
}

/// What a world of one must return for `op` on `input` (the host primitives' answer).
std::vector<unsigned char> world_of_one(dtype t, reduce_op op, const std::vector<unsigned char>& input) {
  std::vector<unsigned char> out = input;
  if (op.kind == reduce_kind::premul_sum)
    primitive::scale_into(out.data(), input.data(), input.size() / dtype_size(t), t, op.scalar);
  return out;
}

template <class F>
void on_one_rank(F&& fn, const nccl::options& o = {}) {
  nccl::launch({0}, std::forward<F>(fn), o);
}

std::vector<unsigned char> download(nccl::communicator& c, const void* p, std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  c.synchronize();
  primitive::cudart::check(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return v;
}

errc error_of(auto&& f) {
  try {
    f();
  } catch (const error& e) { return e.kind(); }
  return errc::internal;
}

}  // namespace

TEST_CASE("native collectives with one rank: every kind, dtype and op returns the world-of-one result") {
  on_one_rank([](nccl::communicator& c) {
    CHECK(c.world_size() == 1);
    CHECK(c.space() == memory_space::cuda);
    CHECK(c.prefers_native(collective_kind::all_reduce));
    constexpr std::uint64_t count = 4099;
    gpu_test::device_buffer send(count * 8 + 64), recv(count * 8 + 64);
    for (dtype t : all_dtypes) {
      const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t);
      const auto input = finite_input(t, count, 11 + static_cast<std::uint64_t>(t));
      send.upload(input);
      const double scalar = is_floating_point(t) ? 0.5 : 3.0;  // exact in every 16-bit float too
      for (reduce_op op : {reduce_op(reduce_kind::sum), reduce_op(reduce_kind::prod), reduce_op(reduce_kind::min),
                           reduce_op(reduce_kind::max), reduce_op(reduce_kind::avg), reduce_op::premul_sum(scalar)})
        for (collective_kind k :
             {collective_kind::all_reduce, collective_kind::reduce_scatter, collective_kind::reduce}) {
          CAPTURE(dtype_name(t));
          CAPTURE(reduce_kind_name(op.kind));
          CAPTURE(collective_name(k));
          recv.upload(std::vector<unsigned char>(bytes, 0xEE));
          if (k == collective_kind::all_reduce)
            all_reduce(c, send.get(), recv.get(), count, t, op);
          else if (k == collective_kind::reduce_scatter)
            reduce_scatter(c, send.get(), recv.get(), count, t, op);
          else
            reduce(c, send.get(), recv.get(), count, t, op, 0);
          std::string what;
          INFO(what);
          REQUIRE(gpu_test::first_difference(t, download(c, recv.get(), bytes), world_of_one(t, op, input), false,
                                             &what) == -1);
        }
      for (collective_kind k : {collective_kind::all_gather, collective_kind::broadcast, collective_kind::all_to_all}) {
        CAPTURE(collective_name(k));
        recv.upload(std::vector<unsigned char>(bytes, 0xEE));
        if (k == collective_kind::all_gather)
          all_gather(c, send.get(), recv.get(), count, t);
        else if (k == collective_kind::broadcast)
          broadcast(c, send.get(), recv.get(), count, t, 0);
        else
          all_to_all(c, send.get(), recv.get(), count, t);
        REQUIRE(download(c, recv.get(), bytes) == input);
      }
    }
    barrier(c);
  });
}

TEST_CASE("ringzero's algorithms on the NCCL backend use the CUDA kernels (world of one: copy and premul scale)") {
  on_one_rank([](nccl::communicator& c) {
    constexpr std::uint64_t count = 1000;
    gpu_test::device_buffer send(count * 8), recv(count * 8);
    for (algorithm a : {algorithm::ring, algorithm::halving_doubling})
      for (dtype t : {dtype::float32, dtype::bfloat16, dtype::int64}) {
        const auto input = finite_input(t, count, 5);
        send.upload(input);
        collective_options o;
        o.algo = a;
        const reduce_op op = reduce_op::premul_sum(is_floating_point(t) ? -2.0 : 7.0);
        all_reduce(c, send.get(), recv.get(), count, t, op, o);
        CHECK(download(c, recv.get(), input.size()) == world_of_one(t, op, input));
      }
  });
}

TEST_CASE("communicators from the environment, from an id file, and by split") {
  const char* vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
  std::string saved[3];
  bool had[3] = {};
  for (int i = 0; i < 3; ++i)
    if (const char* v = std::getenv(vars[i])) {
      had[i] = true;
      saved[i] = v;
    }
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  {
    auto c = nccl::init_from_env();
    CHECK(c->rank() == 0);
    CHECK(c->world_size() == 1);
    gpu_test::device_buffer x(64 * sizeof(float));
    const auto input = finite_input(dtype::float32, 64, 3);
    x.upload(input);
    all_reduce(*c, x.get(), x.get(), 64, dtype::float32, reduce_kind::sum);
    CHECK(download(*c, x.get(), input.size()) == input);

    auto child = c->split(0, 0);
    REQUIRE(child != nullptr);
    CHECK(child->world_size() == 1);
    all_reduce(*child, x.get(), x.get(), 64, dtype::float32, reduce_kind::max);
    CHECK(download(*child, x.get(), input.size()) == input);
    CHECK(c->split(NCCL_SPLIT_NOCOLOR, 0) == nullptr);
  }
  {
    const std::string path = "/tmp/ringzero-test-nccl-id-" + std::to_string(std::random_device{}());
    launch_env env;
    auto c = nccl::init_with_file(path, env);
    CHECK(c->world_size() == 1);
    CHECK(!std::ifstream(path));  // rank 0 removed it once the communicator existed
  }
  for (int i = 0; i < 3; ++i) {
    if (had[i])
      setenv(vars[i], saved[i].c_str(), 1);
    else
      unsetenv(vars[i]);
  }
}

TEST_CASE("the contract check runs through NCCL; invalid arguments are refused") {
  nccl::options o;
  o.check_contract = true;
  on_one_rank(
      [](nccl::communicator& c) {
        gpu_test::device_buffer x(256);
        all_reduce(c, x.get(), x.get(), 16, dtype::float32, reduce_kind::sum);
        CHECK(error_of([&] { all_reduce(c, nullptr, x.get(), 16, dtype::float32, reduce_kind::sum); }) ==
              errc::invalid_argument);
        CHECK(error_of([&] { broadcast(c, x.get(), x.get(), 16, dtype::float32, 3); }) == errc::invalid_argument);
        all_reduce(c, x.get(), x.get(), 16, dtype::float32, reduce_kind::sum);  // still usable
        c.synchronize();
      },
      o);
  on_one_rank([](nccl::communicator& c) {
    gpu_test::device_buffer x(256);
    CHECK(error_of([&] { all_reduce(c, nullptr, x.get(), 16, dtype::float32, reduce_kind::sum); }) ==
          errc::invalid_argument);
    c.synchronize();
  });
}

TEST_CASE("nccl::init_all refuses two ranks on one GPU and bad devices") {
  CHECK(error_of([] { (void)nccl::init_all({0, 0}); }) == errc::invalid_argument);
  CHECK(error_of([] { (void)nccl::init_all({1000}); }) == errc::invalid_argument);
  CHECK(error_of([] { (void)nccl::init_all({}); }) == errc::invalid_argument);
}

// Last in the file: it aborts a communicator with work still enqueued behind a blocked stream.
namespace {

/// A stream blocker: a host function enqueued on the stream that returns only once released,
/// so the NCCL work enqueued after it cannot complete (as if a peer never arrived).
struct stream_blocker {
  std::atomic<bool> released{false};
  static void CUDART_CB wait(void* self) {
    auto* b = static_cast<stream_blocker*>(self);
    while (!b->released.load()) std::this_thread::sleep_for(1ms);
  }
};

}  // namespace

TEST_CASE("a collective that cannot complete is aborted after the timeout (watchdog and synchronize)") {
  for (bool watchdog : {true, false}) {
    CAPTURE(watchdog);
    nccl::options o;
    o.timeout = 1.0s;
    o.watchdog = watchdog;
    o.watchdog_interval = 20ms;
    auto comms = nccl::init_all({0}, o);
    nccl::communicator& c = *comms[0];
    stream_blocker blocker;
    // Releases the stream well after the timeout, whatever happens, so the test cannot hang.
    std::thread releaser([&] {
      std::this_thread::sleep_for(4s);
      blocker.released = true;
    });
    gpu_test::device_buffer x(1024);
    primitive::cudart::check(cudaLaunchHostFunc(c.stream(), &stream_blocker::wait, &blocker), "cudaLaunchHostFunc");
    all_reduce(c, x.get(), x.get(), 256, dtype::float32, reduce_kind::sum);
    const auto start = std::chrono::steady_clock::now();
    try {
      c.synchronize();
      FAIL_CHECK("a blocked collective completed");
    } catch (const error& e) {
      CHECK(e.kind() == errc::timeout);
      CHECK(std::string(e.what()).find("within 1 s") != std::string::npos);
    }
    // ncclCommAbort may itself wait for the stream (it frees device memory), so the error can
    // come only once the blocker is released; what matters is that it is a timeout, not success.
    MESSAGE("timeout reported after " << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                                      << " s");
    CHECK(c.aborted());
    CHECK(error_of([&] { all_reduce(c, x.get(), x.get(), 256, dtype::float32, reduce_kind::sum); }) == errc::aborted);
    blocker.released = true;
    releaser.join();
    primitive::cudart::check(cudaStreamSynchronize(c.stream()), "cudaStreamSynchronize");
    comms.clear();
  }
}
