// The stream interface of the memory-and-stream layer (primitive/stream.hpp) on its host
// implementation: the memory operations through the interface equal the synchronous primitives
// bitwise, events order two streams (a missing wait reads stale data, the wait fixes it),
// query and host work; `device_stream_ref` (primitive/device_stream_ref.hpp) routes every
// operation to the kernel table on its stream, skips empty work and names failures; and
// memory_buffer's host alignment.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/device_stream_ref.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/memory_space.hpp"
#include "ringzero/primitive/reduce.hpp"
#include "ringzero/primitive/stream.hpp"

using namespace ringzero;

namespace {

std::vector<float> iota_floats(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i) * 0.25f;
  return v;
}

primitive::host_stream_options paused_options() {
  primitive::host_stream_options o;
  o.paused = true;
  return o;
}

}  // namespace

TEST_CASE("primitive::stream on the host: copy, fill, cast, scale, reduce equal the primitives bitwise") {
  primitive::host_backed_stream s(primitive::host_stream_options{});
  primitive::stream& st = s;
  CHECK(std::string(st.kind()) == "host_stream");
  CHECK(st.space() == primitive::memory_space::host);
  CHECK(st.device() == -1);
  CHECK(st.runs_host_work());
  const std::size_t n = 1031;
  const std::vector<float> a = iota_floats(n, -100.0f), b = iota_floats(n, 3.0f);
  std::vector<float> copied(n), filled(n), scaled(n), reduced(n);
  std::vector<bfloat16> narrowed(n);
  st.copy(copied.data(), a.data(), n * sizeof(float));
  st.fill(filled.data(), n, dtype::float32, 1.0 / 3.0);
  st.cast(narrowed.data(), dtype::bfloat16, a.data(), dtype::float32, n);
  st.scale(scaled.data(), a.data(), n, dtype::float32, 0.1);
  const primitive::reduce_spec sum{dtype::float32, reduce_kind::sum};
  st.reduce(reduced.data(), a.data(), b.data(), n, sum);
  st.synchronize();
  CHECK(st.query());

  std::vector<float> filled_expected(n), scaled_expected(n), reduced_expected(n);
  std::vector<bfloat16> narrowed_expected(n);
  primitive::fill(filled_expected.data(), n, dtype::float32, 1.0 / 3.0);
  primitive::cast_into(narrowed_expected.data(), dtype::bfloat16, a.data(), dtype::float32, n);
  primitive::scale_into(scaled_expected.data(), a.data(), n, dtype::float32, 0.1);
  primitive::reduce_into(reduced_expected.data(), a.data(), b.data(), n, sum);
  CHECK(std::memcmp(copied.data(), a.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(filled.data(), filled_expected.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(narrowed.data(), narrowed_expected.data(), n * sizeof(bfloat16)) == 0);
  CHECK(std::memcmp(scaled.data(), scaled_expected.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(reduced.data(), reduced_expected.data(), n * sizeof(float)) == 0);
}

TEST_CASE("primitive::stream events order two host streams; a missing wait reads stale data") {
  for (bool with_wait : {false, true}) {
    CAPTURE(with_wait);
    primitive::host_backed_stream producer(paused_options());
    primitive::host_backed_stream consumer(primitive::host_stream_options{});
    primitive::stream& p = producer;
    primitive::stream& c = consumer;
    std::vector<float> source(64, 7.0f), middle(64, 0.0f), out(64, -1.0f);
    const std::unique_ptr<primitive::stream::event> ready = p.make_event();
    CHECK(p.query(*ready));  // never recorded: complete
    p.copy(middle.data(), source.data(), 64 * sizeof(float));
    p.record(*ready);
    CHECK_FALSE(p.query(*ready));  // the producer is paused
    CHECK_FALSE(p.query());
    if (with_wait) c.wait(*ready);
    c.copy(out.data(), middle.data(), 64 * sizeof(float));
    if (!with_wait) c.synchronize();  // runs before the producer: reads the old middle
    producer.native().resume();
    p.wait_host(*ready);
    CHECK(p.query(*ready));
    c.synchronize();
    CHECK(out[0] == (with_wait ? 7.0f : 0.0f));
    CHECK(out[63] == (with_wait ? 7.0f : 0.0f));
  }
}

TEST_CASE("primitive::stream timing events: seconds between reached points; refused before them") {
  primitive::host_backed_stream s(paused_options());
  primitive::stream& p = s;
  const std::unique_ptr<primitive::stream::event> a = p.make_timing_event(), b = p.make_timing_event();
  CHECK_THROWS_WITH_AS((void)p.elapsed_seconds(*a, *b), doctest::Contains("the start event was never recorded"), error);
  p.record(*a);
  p.host_work([] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }, "a wait");
  p.record(*b);
  CHECK_THROWS_WITH_AS((void)p.elapsed_seconds(*a, *b), doctest::Contains("its point is not reached yet"), error);
  s.native().resume();
  p.synchronize();
  const double seconds = p.elapsed_seconds(*a, *b);
  CHECK(seconds >= 0.029);
  CHECK(p.elapsed_seconds(*b, *a) == -seconds);
}

TEST_CASE("primitive::stream host work runs in order with the memory operations; errors surface at synchronize") {
  primitive::host_backed_stream s(primitive::host_stream_options{});
  primitive::stream& st = s;
  std::vector<int> order;
  std::int32_t value = 0;
  st.fill(&value, 1, dtype::int32, 5.0);
  st.host_work([&] { order.push_back(value); }, "reading the value");
  st.fill(&value, 1, dtype::int32, 9.0);
  st.host_work([&] { order.push_back(value); }, "reading the value again");
  st.host_work([] { throw error(errc::internal, "host work failed on purpose"); }, "failing");
  CHECK_THROWS_WITH_AS(st.synchronize(), doctest::Contains("host work failed on purpose"), error);
  st.synchronize_quietly();
  REQUIRE(order.size() == 2);
  CHECK(order[0] == 5);
  CHECK(order[1] == 9);
}

namespace {

int token = 0;  // the fake stream
std::atomic<int> launches{0}, on_wrong_stream{0};
int fake_copy(void* d, const void* s, std::uint64_t n, void* stream) noexcept {
  ++launches;
  if (stream != &token) ++on_wrong_stream;
  std::memcpy(d, s, n);
  return 0;
}
int fake_fill(void* d, std::uint64_t n, dtype t, double v, void* stream) noexcept {
  ++launches;
  if (stream != &token) ++on_wrong_stream;
  primitive::fill(d, n, t, v);
  return 0;
}
int fake_divide(void* d, const void* s, std::uint64_t n, dtype t, std::int64_t k, void* stream) noexcept {
  ++launches;
  if (stream != &token) ++on_wrong_stream;
  primitive::divide_into(d, s, n, t, k);
  return 0;
}
int failing_scale(void*, const void*, std::uint64_t, dtype, double, void*) noexcept {
  ++launches;
  return 700;
}
int fake_set_device(int) noexcept { return 0; }
int fake_synchronize(void*) noexcept { return 0; }
const char* fake_name(int code) noexcept { return code == 700 ? "cudaErrorIllegalAddress" : "cudaErrorUnknown"; }
const char* fake_string(int) noexcept { return "an illegal memory access was encountered"; }

}  // namespace

TEST_CASE("device_stream_ref: operations go to the table on its stream, empty work launches nothing, failures named") {
  primitive::device_primitives table;
  table.copy = fake_copy;
  table.fill = fake_fill;
  table.divide = fake_divide;
  table.scale = failing_scale;
  table.set_device = fake_set_device;
  table.synchronize = fake_synchronize;
  table.error_name = fake_name;
  table.error_string = fake_string;
  const primitive::device_stream_ref q(table, &token, 3);
  CHECK(q.device() == 3);
  CHECK(q.stream() == &token);
  launches = 0;
  on_wrong_stream = 0;

  std::vector<std::int64_t> a = {10, -7, 9, 100}, b(4, 0);
  CHECK(q.copy(b.data(), a.data(), 4 * sizeof(std::int64_t)) == 0);
  CHECK(b == a);
  CHECK(q.divide(b.data(), b.data(), 4, dtype::int64, 2) == 0);
  CHECK(b == std::vector<std::int64_t>{5, -3, 4, 50});  // avg's truncation toward zero
  CHECK(q.fill(b.data(), 2, dtype::int64, 42.0) == 0);
  CHECK(b == std::vector<std::int64_t>{42, 42, 4, 50});
  CHECK(launches == 3);
  CHECK(q.copy(b.data(), b.data(), 32) == 0);  // same pointer
  CHECK(q.copy(b.data(), a.data(), 0) == 0);
  CHECK(q.fill(b.data(), 0, dtype::int64, 1.0) == 0);
  CHECK(q.scale(b.data(), a.data(), 0, dtype::int64, 2.0) == 0);
  CHECK(launches == 3);
  CHECK(on_wrong_stream == 0);
  CHECK(q.make_current() == 0);
  CHECK(q.synchronize() == 0);

  const int code = q.scale(b.data(), a.data(), 4, dtype::int64, 2.0);
  CHECK(code == 700);
  CHECK(q.describe(code, "scaling") ==
        "scaling failed on CUDA device 3: cudaErrorIllegalAddress: an illegal memory access was encountered");
  CHECK_NOTHROW(q.check(0, "nothing"));
  try {
    q.check(code, "scaling");
    FAIL("check did not throw");
  } catch (const error& e) {
    CHECK(e.kind() == errc::backend_failure);
    CHECK(std::string(e.what()).find("scaling failed on CUDA device 3: cudaErrorIllegalAddress") != std::string::npos);
  }
}

TEST_CASE("memory_buffer: host alignment on request, refused when not a power of two") {
  for (std::size_t align : {std::size_t{64}, std::size_t{128}, std::size_t{4096}}) {
    CAPTURE(align);
    primitive::memory_buffer b = primitive::memory_buffer::allocate(primitive::memory_space::host, 5000, -1, align);
    REQUIRE(b);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % align == 0);
    CHECK(b.size_bytes() == 5000);
    primitive::memory_buffer moved = std::move(b);
    CHECK_FALSE(b);
    moved.reset();
    CHECK_FALSE(moved);
    CHECK(moved.size_bytes() == 0);
  }
  for (std::size_t bad : {std::size_t{32}, std::size_t{96}, std::size_t{0}}) {
    CAPTURE(bad);
    try {
      (void)primitive::memory_buffer::allocate(primitive::memory_space::host, 100, -1, bad);
      FAIL("a bad alignment was accepted");
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("host alignment " + std::to_string(bad)) != std::string::npos);
    }
  }
}
