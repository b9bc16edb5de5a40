// Memory-space operations on the host stream (primitive/memory_ops.hpp) against the synchronous
// primitives, bitwise, for every dtype (every pair for cast, every reduce kind), on random bit
// patterns (NaNs, infinities, subnormals included), with the stream slowed down so that the
// work really runs later; and memory_buffer's host allocation and refusals.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/memory_ops.hpp"
#include "ringzero/primitive/memory_space.hpp"

using namespace ringzero;
using primitive::memory_buffer;
using primitive::memory_space;

namespace {

constexpr std::uint64_t count = 1031;  // not a multiple of any vector width

std::vector<unsigned char> random_bytes(std::size_t bytes, std::uint64_t seed) {
  std::vector<unsigned char> v(bytes);
  std::uint64_t x = seed;
  for (auto& b : v) {
    x += 0x9e3779b97f4a7c15ull;  // splitmix64
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    b = static_cast<unsigned char>(z ^ (z >> 31));
  }
  return v;
}

memory_buffer host_copy_of(const std::vector<unsigned char>& bytes) {
  memory_buffer b = memory_buffer::allocate(memory_space::host, bytes.size());
  std::memcpy(b.data(), bytes.data(), bytes.size());
  return b;
}

bool same_bytes(const memory_buffer& b, const std::vector<unsigned char>& expected) {
  return std::memcmp(b.data(), expected.data(), expected.size()) == 0;
}

primitive::host_stream_options slow() {
  primitive::host_stream_options o;
  o.delay = std::chrono::microseconds(200);
  return o;
}

}  // namespace

TEST_CASE("host stream copy, fill, scale, reduce equal the synchronous primitives bitwise") {
  primitive::host_stream s(slow());
  for (dtype t : all_dtypes) {
    CAPTURE(dtype_name(t));
    const std::size_t bytes = count * dtype_size(t);
    const auto a = random_bytes(bytes, 1 + static_cast<std::uint64_t>(t));
    const auto b = random_bytes(bytes, 101 + static_cast<std::uint64_t>(t));
    memory_buffer da = host_copy_of(a), db = host_copy_of(b), out = host_copy_of(b);

    primitive::enqueue_copy(s, out.data(), da.data(), bytes);
    s.synchronize();
    CHECK(same_bytes(out, a));

    for (double v : {0.0, -2.75, 3e9, 1e300}) {
      std::vector<unsigned char> expected(bytes);
      primitive::fill(expected.data(), count, t, v);
      primitive::enqueue_fill(s, out.data(), count, t, v);
      s.synchronize();
      CHECK(same_bytes(out, expected));
    }
    for (double scalar : {0.5, 3.0, -1.0 / 3.0}) {
      std::vector<unsigned char> expected(bytes);
      primitive::scale_into(expected.data(), a.data(), count, t, scalar);
      primitive::enqueue_scale(s, out.data(), da.data(), count, t, scalar);
      s.synchronize();
      CHECK(same_bytes(out, expected));
    }
    std::vector<primitive::reduce_spec> specs;
    for (reduce_kind k : {reduce_kind::sum, reduce_kind::prod, reduce_kind::min, reduce_kind::max}) {
      primitive::reduce_spec r;
      r.type = t;
      r.kind = k;
      specs.push_back(r);
    }
    primitive::reduce_spec avg;
    avg.type = t;
    avg.kind = reduce_kind::avg;
    avg.divisor = 3;
    specs.push_back(avg);
    if (is_floating_point(t)) {
      primitive::reduce_spec pre;
      pre.type = t;
      pre.kind = reduce_kind::premul_sum;
      pre.pre_a = pre.pre_b = true;
      pre.scalar_a = 0.25;
      pre.scalar_b = -3.0;
      specs.push_back(pre);
    }
    for (const primitive::reduce_spec& r : specs) {
      CAPTURE(static_cast<int>(r.kind));
      std::vector<unsigned char> expected(bytes);
      primitive::reduce_into(expected.data(), a.data(), b.data(), count, r);
      primitive::enqueue_reduce(s, out.data(), da.data(), db.data(), count, r);
      s.synchronize();
      CHECK(same_bytes(out, expected));
    }
  }
}

TEST_CASE("host stream cast equals cast_into bitwise for every dtype pair") {
  primitive::host_stream s;
  for (dtype from : all_dtypes) {
    const auto src = random_bytes(count * dtype_size(from), 7 + static_cast<std::uint64_t>(from));
    memory_buffer dsrc = host_copy_of(src);
    for (dtype to : all_dtypes) {
      CAPTURE(dtype_name(from));
      CAPTURE(dtype_name(to));
      const std::size_t out_bytes = count * dtype_size(to);
      std::vector<unsigned char> expected(out_bytes);
      primitive::cast_into(expected.data(), to, src.data(), from, count);
      memory_buffer out = memory_buffer::allocate(memory_space::host, out_bytes);
      primitive::enqueue_cast(s, out.data(), to, dsrc.data(), from, count);
      s.synchronize();
      CHECK(same_bytes(out, expected));
    }
  }
}

TEST_CASE("memory_buffer: host allocation, moves, zero bytes, refusals without CUDA kernels") {
  memory_buffer b = memory_buffer::allocate(memory_space::host, 1000);
  REQUIRE(b.data() != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % primitive::host_alignment == 0);
  CHECK(b.size_bytes() == 1000);
  CHECK(b.space() == memory_space::host);
  CHECK(b.device() == -1);
  void* p = b.data();
  memory_buffer moved = std::move(b);
  CHECK(moved.data() == p);
  CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified

  memory_buffer empty = memory_buffer::allocate(memory_space::host, 0);
  CHECK(empty.data() == nullptr);
  CHECK(empty.size_bytes() == 0);

  CHECK(std::string(primitive::to_string(memory_space::pinned_host)) == "pinned_host");
  if (primitive::registered_device_primitives() == nullptr) {  // this test program has no .cu file
    for (memory_space sp : {memory_space::device, memory_space::pinned_host}) {
      try {
        (void)memory_buffer::allocate(sp, 64, 0);
        FAIL("allocation without CUDA kernels did not throw");
      } catch (const error& e) {
        CHECK(e.code() == make_error_code(errc::unsupported));
        CHECK(std::string(e.what()).find("<ringzero/cuda.cuh>") != std::string::npos);
      }
    }
  }
}
