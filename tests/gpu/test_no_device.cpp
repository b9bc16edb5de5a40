// The CUDA entry points where there is no GPU (CI): each fails at once with errc::no_device and
// a message that says "no CUDA device" and what the CUDA runtime answered, and never starts a
// rank. On a machine with a GPU the same calls must work instead, so this test means something
// on both kinds of machine.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include <unistd.h>

#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/primitive/cudart/event.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"
#include "ringzero/primitive/cudart/stream.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/ringzero.hpp"
#if RINGZERO_HAS_NCCL
#include "ringzero/backend/nccl.hpp"
#endif

using namespace ringzero;

namespace {

/// Runs `f`, which must throw errc::no_device saying "no CUDA device".
template <class F>
void expect_no_device(F&& f, const char* what) {
  CAPTURE(what);
  try {
    f();
    FAIL("no error without a CUDA device");
  } catch (const error& e) {
    CHECK(e.kind() == errc::no_device);
    CHECK(std::string(e.what()).find("no CUDA device") != std::string::npos);
    CHECK(e.code() == make_error_code(errc::no_device));
  }
}

}  // namespace

TEST_CASE("GPU entry points: errc::no_device without a device, working ones with a device") {
  std::string why;
  const int devices = primitive::cudart::device_count(&why);
  if (devices == 0) {
    MESSAGE("no CUDA device here (" << why << "): checking the errors");
    std::atomic<int> ranks_started{0};
    expect_no_device([&] { local::launch_cuda(2, [&](local::cuda_communicator&) { ++ranks_started; }); },
                     "local::launch_cuda");
    CHECK(ranks_started == 0);
    expect_no_device([] { (void)primitive::cudart::require_device("a test"); }, "primitive::cudart::require_device");
    // the low-level helpers too: what the runtime answers means "no device", not a failed call
    expect_no_device([] { (void)primitive::cudart::stream::create(0); }, "primitive::cudart::stream::create");
    expect_no_device([] { primitive::cudart::event e(0); }, "primitive::cudart::event");
    expect_no_device([] { primitive::cudart::device_guard g(0); }, "primitive::cudart::device_guard");
    expect_no_device([] { primitive::cudart::use_device(0); }, "primitive::cudart::use_device");
    expect_no_device(
        [] {
          local::world w(1);
          local::cuda_communicator c(w, 0, 0);
        },
        "local::cuda_communicator");
#if RINGZERO_HAS_NCCL
    expect_no_device([] { (void)nccl::init_all({0}); }, "nccl::init_all");
    expect_no_device([] { (void)nccl::init_from_env(); }, "nccl::init_from_env");
    expect_no_device([] { nccl::communicator c(nccl::id_bytes{}, 0, 1, 0); }, "nccl::communicator");
#endif
    return;
  }
  MESSAGE(devices << " CUDA device(s): checking that the entry points work");
  CHECK(primitive::cudart::require_device("a test") == devices);
  std::atomic<int> ranks{0};
  local::launch_cuda(2, [&](local::cuda_communicator& c) {
    ++ranks;
    CHECK(c.space() == memory_space::cuda);
    barrier(c);
    c.synchronize();
  });
  CHECK(ranks == 2);
#if RINGZERO_HAS_NCCL
  auto comms = nccl::init_all({0});
  CHECK(comms.size() == 1);
#endif
}

#if RINGZERO_HAS_NCCL
TEST_CASE("nccl::init_with_file rejects a bad rank, world size, local rank or timeout before touching the file") {
  const std::string path = "/tmp/ringzero-test-init-with-file-" + std::to_string(::getpid());
  auto expect_invalid = [&](launch_env env, nccl::options opts, const char* says) {
    CAPTURE(says);
    try {
      (void)nccl::init_with_file(path, env, opts);
      FAIL("accepted");
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
    CHECK(::access(path.c_str(), F_OK) != 0);  // no id file was published
  };
  expect_invalid({7, 2, 0, "test"}, {}, "rank 7 is outside [0, 2)");
  expect_invalid({-1, 2, 0, "test"}, {}, "rank -1 is outside [0, 2)");
  expect_invalid({0, 0, 0, "test"}, {}, "world size 0 is below 1");
  expect_invalid({0, 2, -1, "test"}, {}, "local rank -1 is negative");
  nccl::options nan_timeout;
  nan_timeout.timeout = std::chrono::duration<double>(std::nan(""));
  expect_invalid({0, 2, 0, "test"}, nan_timeout, "timeout must be positive");
  nccl::options negative_timeout;
  negative_timeout.timeout = std::chrono::duration<double>(-1.0);
  expect_invalid({1, 2, 0, "test"}, negative_timeout, "timeout must be positive");
}
#endif

TEST_CASE("the program's CUDA kernels are registered when the kernel library is linked") {
#if RINGZERO_TEST_HAVE_KERNELS
  const primitive::device_primitives* k = primitive::registered_device_primitives();
  REQUIRE(k != nullptr);
  const bool complete = k->reduce_into && k->cast && k->scale && k->fill && k->copy && k->set_device && k->error_name &&
                        k->error_string && k->divide && k->allocate && k->deallocate && k->synchronize;
  CHECK(complete);
  CHECK(std::string(k->error_name(2)) == "cudaErrorMemoryAllocation");  // needs no device
#else
  CHECK(primitive::registered_device_primitives() == nullptr);
#endif
}
