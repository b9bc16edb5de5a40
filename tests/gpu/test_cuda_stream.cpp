// The CUDA implementation of the memory-and-stream layer (primitive/cuda_stream.hpp,
// primitive/memory_space.hpp) against the host stream: the same operations on device memory give
// bitwise the host stream's results for every dtype; a consumer stream ordered by an event reads
// the producer's data; pinned and device allocations; events never recorded count as complete.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/primitive/memory_ops.hpp"
#include "ringzero/primitive/memory_space.hpp"

using namespace ringzero;
using primitive::memory_buffer;
using buffer_space = primitive::memory_space;

namespace {
constexpr std::uint64_t count = 4099;
}

TEST_CASE("cuda_stream: fill, scale, cast, reduce, copy equal the host stream bitwise") {
  primitive::cuda_stream ds(0);
  primitive::host_stream hs;
  for (dtype t : all_dtypes) {
    CAPTURE(dtype_name(t));
    const std::size_t bytes = count * dtype_size(t);
    const auto a = gpu_test::random_bytes(bytes, 3 + static_cast<std::uint64_t>(t));
    const auto b = gpu_test::random_bytes(bytes, 33 + static_cast<std::uint64_t>(t));
    memory_buffer pa = memory_buffer::allocate(buffer_space::pinned_host, bytes);
    memory_buffer pb = memory_buffer::allocate(buffer_space::pinned_host, bytes);
    memory_buffer da = memory_buffer::allocate(buffer_space::device, bytes, 0);
    memory_buffer db = memory_buffer::allocate(buffer_space::device, bytes, 0);
    memory_buffer dout = memory_buffer::allocate(buffer_space::device, bytes, 0);
    memory_buffer pout = memory_buffer::allocate(buffer_space::pinned_host, bytes);
    std::memcpy(pa.data(), a.data(), bytes);
    std::memcpy(pb.data(), b.data(), bytes);
    primitive::enqueue_copy(ds, da.data(), pa.data(), bytes);
    primitive::enqueue_copy(ds, db.data(), pb.data(), bytes);
    std::vector<unsigned char> expected(bytes);
    // Bit for bit; two NaNs count as equal (a NaN made by arithmetic has a hardware payload).
    auto compare = [&] {
      primitive::enqueue_copy(ds, pout.data(), dout.data(), bytes);
      ds.synchronize();
      hs.synchronize();
      std::string what;
      const long long at = gpu_test::first_difference(t, static_cast<const unsigned char*>(pout.data()),
                                                      expected.data(), count, true, &what);
      INFO(what);
      return at < 0;
    };
    primitive::enqueue_fill(ds, dout.data(), count, t, -2.75);
    primitive::enqueue_fill(hs, expected.data(), count, t, -2.75);
    CHECK(compare());
    primitive::enqueue_scale(ds, dout.data(), da.data(), count, t, 0.5);
    primitive::enqueue_scale(hs, expected.data(), a.data(), count, t, 0.5);
    CHECK(compare());
    primitive::reduce_spec spec;
    spec.type = t;
    spec.kind = reduce_kind::sum;
    primitive::enqueue_reduce(ds, dout.data(), da.data(), db.data(), count, spec);
    primitive::enqueue_reduce(hs, expected.data(), a.data(), b.data(), count, spec);
    CHECK(compare());
    const dtype to = dtype::int64;
    memory_buffer dcast = memory_buffer::allocate(buffer_space::device, count * 8, 0);
    memory_buffer pcast = memory_buffer::allocate(buffer_space::pinned_host, count * 8);
    std::vector<unsigned char> expected_cast(count * 8);
    primitive::enqueue_cast(ds, dcast.data(), to, da.data(), t, count);
    primitive::enqueue_copy(ds, pcast.data(), dcast.data(), count * 8);
    primitive::enqueue_cast(hs, expected_cast.data(), to, a.data(), t, count);
    ds.synchronize();
    hs.synchronize();
    CHECK(std::memcmp(pcast.data(), expected_cast.data(), count * 8) == 0);
  }
}

TEST_CASE("cuda_stream: a consumer ordered by an event reads the producer's data") {
  primitive::cuda_stream producer(0), consumer(0);
  primitive::cuda_event never(0), written(0);
  CHECK(never.query());
  const std::size_t bytes = (std::size_t{1} << 24) * 4;
  memory_buffer d = memory_buffer::allocate(buffer_space::device, bytes, 0);
  memory_buffer out = memory_buffer::allocate(buffer_space::pinned_host, bytes);
  CHECK(d.space() == buffer_space::device);
  CHECK(d.device() == 0);
  primitive::enqueue_fill(producer, d.data(), bytes / 4, dtype::float32, 42.0);
  producer.record(written);
  consumer.wait_event(written);
  primitive::enqueue_copy(consumer, out.data(), d.data(), bytes);
  consumer.synchronize();
  CHECK(written.query());
  CHECK(consumer.query());
  const float* f = static_cast<const float*>(out.data());
  for (std::size_t i = 0; i < bytes / 4; i += 4093) REQUIRE(f[i] == 42.0f);
  REQUIRE(f[bytes / 4 - 1] == 42.0f);
}
