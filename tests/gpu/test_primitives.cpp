// The CUDA primitives (primitive/kernels/*.hpp, through the registered table) against the host
// primitives, exactly: every dtype, every reduce kind with its pre-scaling and final division,
// every dtype pair of cast, scale and fill, over counts around the 16-byte vector width and its
// multiples, aligned and misaligned pointers (vector path with a scalar head and tail, and the
// all-scalar path), in place, and a count above 2^31. Memory around each output is checked to be
// untouched. Inputs are random bit patterns (NaNs, infinities, subnormals included); the only
// freedom allowed is the payload of a NaN produced by arithmetic (hardware-specific).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/reduce.hpp"

using namespace ringzero;
using gpu_test::device_buffer;

namespace {

constexpr std::uint64_t max_count = (std::uint64_t{1} << 20) + 3;
constexpr std::uint64_t guard = 16;  // elements checked after each output
const std::uint64_t counts[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 255, 1000, 4099, 65541, max_count};

struct stream_holder {
  cudaStream_t s = nullptr;
  stream_holder() {
    primitive::cudart::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~stream_holder() { (void)cudaStreamDestroy(s); }
};

void expect_launch(int code, const char* what) {
  INFO(what);
  REQUIRE(code == 0);
}

void sync(cudaStream_t s) { primitive::cudart::check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }

/// The host's and the device's copy of one operand, both from the same random bytes.
struct operand {
  std::vector<unsigned char> host;
  std::vector<unsigned char> pristine;
  device_buffer device;
  device_buffer device_pristine;
  operand(std::size_t bytes, std::uint64_t seed)
      : host(gpu_test::random_bytes(bytes, seed)), pristine(host), device(bytes), device_pristine(bytes) {
    device.upload(host);
    device_pristine.upload(host);
  }
  /// Restores bytes [0, bytes) on both sides.
  void restore(std::size_t bytes) {
    std::memcpy(host.data(), pristine.data(), bytes);
    primitive::cudart::check(cudaMemcpy(device.get(), device_pristine.get(), bytes, cudaMemcpyDeviceToDevice),
                             "cudaMemcpy D2D");
    primitive::cudart::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // a D2D cudaMemcpy is asynchronous
  }
};

primitive::reduce_spec spec_of(dtype t, reduce_kind k) {
  primitive::reduce_spec s;
  s.type = t;
  s.kind = k;
  return s;
}

/// The reduce variants: the four plain ops, avg's final division, premul_sum's pre-scaling on
/// either or both sides (with and without the division), and a sum with a division.
std::vector<primitive::reduce_spec> reduce_variants(dtype t) {
  const bool fp = is_floating_point(t);
  std::vector<primitive::reduce_spec> v;
  for (reduce_kind k : {reduce_kind::sum, reduce_kind::prod, reduce_kind::min, reduce_kind::max})
    v.push_back(spec_of(t, k));
  auto avg = spec_of(t, reduce_kind::avg);
  avg.divisor = 3;
  v.push_back(avg);
  auto pre_both = spec_of(t, reduce_kind::premul_sum);
  pre_both.pre_a = pre_both.pre_b = true;
  pre_both.scalar_a = fp ? 0.3 : 3.0;
  pre_both.scalar_b = fp ? -2.5 : -7.0;
  v.push_back(pre_both);
  auto pre_b = spec_of(t, reduce_kind::premul_sum);
  pre_b.pre_b = true;
  pre_b.scalar_b = fp ? 1e-3 : 5.0;
  pre_b.divisor = 4;
  v.push_back(pre_b);
  auto sum_div = spec_of(t, reduce_kind::sum);
  sum_div.divisor = 7;
  v.push_back(sum_div);
  auto avg_pre = spec_of(t, reduce_kind::avg);  // direct's first fold: pre-scaled inputs, then the division
  avg_pre.pre_a = avg_pre.pre_b = true;
  avg_pre.scalar_a = fp ? 0.5 : 2.0;
  avg_pre.scalar_b = fp ? 3.0 : -3.0;
  avg_pre.divisor = 2;
  v.push_back(avg_pre);
  auto max_pre = spec_of(t, reduce_kind::max);  // prod, min and max ignore the pre-scaling
  max_pre.pre_a = true;
  max_pre.scalar_a = fp ? 7.5 : 9.0;
  v.push_back(max_pre);
  return v;
}

/// Element offsets of (dst, a, b); `in_place`: 0 none, 1 dst is a, 2 dst is b.
struct layout {
  int dst, a, b, in_place;
};
const layout layouts[] = {{0, 0, 0, 0}, {1, 1, 1, 0}, {3, 3, 3, 0}, {0, 1, 2, 0}, {1, 1, 1, 1}, {0, 0, 0, 2}};

/// Element offsets of (dst, src) of a one-input primitive; `in_place`: dst is src.
struct unary_layout {
  int dst, src;
  bool in_place;
};
const unary_layout unary_layouts[] = {{0, 0, false}, {1, 1, false}, {0, 3, false}, {2, 2, true}};

}  // namespace

TEST_CASE("reduce_into: every dtype, kind, count and alignment, bit for bit as the host") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  for (dtype t : all_dtypes) {
    const std::size_t es = dtype_size(t);
    const std::size_t bytes = static_cast<std::size_t>(max_count + 2 * guard) * es;
    operand a(bytes, 1 + static_cast<std::uint64_t>(t)), b(bytes, 100 + static_cast<std::uint64_t>(t)),
        d(bytes, 200 + static_cast<std::uint64_t>(t));
    for (const primitive::reduce_spec& spec : reduce_variants(t)) {
      const bool arithmetic = spec.kind != reduce_kind::min && spec.kind != reduce_kind::max;
      for (std::uint64_t count : counts)
        for (const layout& l : layouts) {
          CAPTURE(dtype_name(t));
          CAPTURE(reduce_kind_name(spec.kind));
          CAPTURE(spec.pre_a);
          CAPTURE(spec.pre_b);
          CAPTURE(spec.divisor);
          CAPTURE(count);
          CAPTURE(l.dst);
          CAPTURE(l.a);
          CAPTURE(l.b);
          CAPTURE(l.in_place);
          operand& out = l.in_place == 1 ? a : l.in_place == 2 ? b : d;
          const std::size_t window = static_cast<std::size_t>(l.dst + count + guard) * es;
          expect_launch(k.reduce_into(out.device.get() + l.dst * es, a.device.get() + l.a * es,
                                      b.device.get() + l.b * es, count, spec, stream.s),
                        "reduce_into launch");
          primitive::reduce_into(out.host.data() + l.dst * es, a.host.data() + l.a * es, b.host.data() + l.b * es,
                                 count, spec);
          sync(stream.s);
          const std::vector<unsigned char> got = out.device.download(0, window);
          const std::vector<unsigned char> want(out.host.begin(),
                                                out.host.begin() + static_cast<std::ptrdiff_t>(window));
          std::string what;
          const long long at = gpu_test::first_difference(t, got, want, arithmetic, &what);
          INFO(what);
          REQUIRE(at == -1);
          out.restore(window);
        }
    }
  }
}

TEST_CASE("cast: all 100 dtype pairs, bit for bit as the host") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  const std::uint64_t cast_counts[] = {0, 1, 7, 17, 33, 1000, 65541};
  constexpr std::uint64_t n = 65541;
  for (dtype from : all_dtypes) {
    std::vector<unsigned char> src = gpu_test::random_bytes(static_cast<std::size_t>(n + guard) * dtype_size(from),
                                                            300 + static_cast<std::uint64_t>(from));
    // The edges of every rule at the front: zeros, infinities, NaN with payload, saturation points.
    const double specials[] = {0.0,
                               -0.0,
                               1.0,
                               -1.0,
                               0.5,
                               -0.5,
                               2.5,
                               -2.5,
                               127.5,
                               128.0,
                               -129.0,
                               255.5,
                               256.0,
                               65504.0,
                               65520.0,
                               70000.0,
                               2147483648.0,
                               -2147483649.0,
                               4294967296.0,
                               9223372036854775808.0,
                               18446744073709551616.0,
                               1e30,
                               -1e30,
                               std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(),
                               std::numeric_limits<double>::quiet_NaN(),
                               1e-40,
                               5.9604644775390625e-08};
    visit_dtype(from, [&]<class F>() {
      for (std::size_t i = 0; i < std::size(specials); ++i) {
        const F x = primitive::detail::convert<F>(specials[i]);
        std::memcpy(src.data() + (i + 4) * sizeof(F), &x, sizeof(F));
      }
    });
    device_buffer dsrc(src.size());
    dsrc.upload(src);
    for (dtype to : all_dtypes) {
      const std::size_t es = dtype_size(to);
      device_buffer ddst(static_cast<std::size_t>(n + 2 * guard) * es);
      const std::vector<unsigned char> initial = gpu_test::random_bytes(ddst.bytes(), 400);
      for (std::uint64_t count : cast_counts)
        for (const unary_layout& l : {unary_layout{0, 0, false}, unary_layout{1, 1, false}, unary_layout{0, 3, false},
                                      unary_layout{5, 0, false}}) {
          const int od = l.dst, os = l.src;
          CAPTURE(dtype_name(from));
          CAPTURE(dtype_name(to));
          CAPTURE(count);
          CAPTURE(od);
          CAPTURE(os);
          ddst.upload(initial);
          std::vector<unsigned char> want = initial;
          expect_launch(k.cast(ddst.get() + od * es, to, dsrc.get() + os * dtype_size(from), from, count, stream.s),
                        "cast launch");
          primitive::cast_into(want.data() + od * es, to, src.data() + os * dtype_size(from), from, count);
          sync(stream.s);
          const std::size_t window = static_cast<std::size_t>(od + count + guard) * es;
          want.resize(window);
          std::string what;
          const long long at = gpu_test::first_difference(to, ddst.download(0, window), want,
                                                          is_floating_point(to) && is_floating_point(from), &what);
          INFO(what);
          REQUIRE(at == -1);
        }
    }
  }
}

TEST_CASE("scale and fill: every dtype, bit for bit as the host") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  constexpr std::uint64_t n = 65541;
  for (dtype t : all_dtypes) {
    const std::size_t es = dtype_size(t);
    const std::size_t bytes = static_cast<std::size_t>(n + 2 * guard) * es;
    const std::vector<unsigned char> src = gpu_test::random_bytes(bytes, 500 + static_cast<std::uint64_t>(t));
    const std::vector<unsigned char> initial = gpu_test::random_bytes(bytes, 600 + static_cast<std::uint64_t>(t));
    device_buffer dsrc(bytes), ddst(bytes);
    dsrc.upload(src);
    const std::vector<double> scalars = is_floating_point(t) ? std::vector<double>{1.0, -2.5, 0.1, 3.0, 1e-30}
                                                             : std::vector<double>{1.0, 0.0, 3.0, -7.0, 1e15};
    for (double scalar : scalars)
      for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{9}, std::uint64_t{33}, n})
        for (const unary_layout& l : unary_layouts) {
          const int od = l.dst, os = l.src;
          const bool in_place = l.in_place;
          CAPTURE(dtype_name(t));
          CAPTURE(scalar);
          CAPTURE(count);
          CAPTURE(od);
          CAPTURE(os);
          CAPTURE(in_place);
          std::vector<unsigned char> want = in_place ? src : initial;
          if (in_place)
            ddst.upload(src);
          else
            ddst.upload(initial);
          const unsigned char* dev_src = in_place ? ddst.get() + os * es : dsrc.get() + os * es;
          expect_launch(k.scale(ddst.get() + od * es, dev_src, count, t, scalar, stream.s), "scale launch");
          const std::vector<unsigned char> host_src = want;
          primitive::scale_into(want.data() + od * es, (in_place ? host_src.data() : src.data()) + os * es, count, t,
                                scalar);
          sync(stream.s);
          const std::size_t window = static_cast<std::size_t>(od + count + guard) * es;
          want.resize(window);
          std::string what;
          const long long at = gpu_test::first_difference(t, ddst.download(0, window), want, true, &what);
          INFO(what);
          REQUIRE(at == -1);
        }
    for (double value : {0.0, 1.0, -1.0, 2.5, 1e10, -1e10, std::numeric_limits<double>::quiet_NaN(),
                         std::numeric_limits<double>::infinity()})
      for (std::uint64_t count :
           {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{15}, std::uint64_t{16}, std::uint64_t{17}, n})
        for (int od : {0, 1, 3}) {
          CAPTURE(dtype_name(t));
          CAPTURE(value);
          CAPTURE(count);
          CAPTURE(od);
          ddst.upload(initial);
          std::vector<unsigned char> want = initial;
          expect_launch(k.fill(ddst.get() + od * es, count, t, value, stream.s), "fill launch");
          primitive::fill(want.data() + od * es, count, t, value);
          sync(stream.s);
          const std::size_t window = static_cast<std::size_t>(od + count + guard) * es;
          want.resize(window);
          std::string what;
          const long long at = gpu_test::first_difference(t, ddst.download(0, window), want, false, &what);
          INFO(what);
          REQUIRE(at == -1);
        }
  }
}

TEST_CASE("divide: every dtype and several divisors, bit for bit as the host (a division, not a reciprocal)") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  constexpr std::uint64_t n = 65541;
  for (dtype t : all_dtypes) {
    const std::size_t es = dtype_size(t);
    const std::size_t bytes = static_cast<std::size_t>(n + 2 * guard) * es;
    const std::vector<unsigned char> src = gpu_test::random_bytes(bytes, 700 + static_cast<std::uint64_t>(t));
    const std::vector<unsigned char> initial = gpu_test::random_bytes(bytes, 800 + static_cast<std::uint64_t>(t));
    device_buffer dsrc(bytes), ddst(bytes);
    dsrc.upload(src);
    for (std::int64_t divisor :
         {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, std::int64_t{7}, std::int64_t{1} << 40})
      for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{9}, std::uint64_t{33}, n})
        for (const unary_layout& l : unary_layouts) {
          const int od = l.dst, os = l.src;
          CAPTURE(dtype_name(t));
          CAPTURE(divisor);
          CAPTURE(count);
          CAPTURE(od);
          CAPTURE(os);
          CAPTURE(l.in_place);
          std::vector<unsigned char> want = l.in_place ? src : initial;
          ddst.upload(want);
          const unsigned char* dev_src = l.in_place ? ddst.get() + os * es : dsrc.get() + os * es;
          expect_launch(k.divide(ddst.get() + od * es, dev_src, count, t, divisor, stream.s), "divide launch");
          const std::vector<unsigned char> host_src = want;
          primitive::divide_into(want.data() + od * es, (l.in_place ? host_src.data() : src.data()) + os * es, count, t,
                                 divisor);
          sync(stream.s);
          const std::size_t window = static_cast<std::size_t>(od + count + guard) * es;
          want.resize(window);
          std::string what;
          const long long at = gpu_test::first_difference(t, ddst.download(0, window), want, true, &what);
          INFO(what);
          REQUIRE(at == -1);
        }
  }
  CHECK(k.divide(nullptr, nullptr, 4, dtype::float32, 0, stream.s) != 0);
  CHECK(k.divide(nullptr, nullptr, 4, static_cast<dtype>(50), 2, stream.s) != 0);
}

// The integer quotients of avg and divide, which the device computes by a multiply-high
// (primitive/invariant_division.hpp), for divisors of every form (small, powers of two and
// their neighbours, around 2^31, 2^32 and the int64 limit) and the dividends where such a
// method fails first: at and around multiples of the divisor, the extremes, random values.
// Both paths: `divide`, and `reduce_into` avg with a zero second operand.
TEST_CASE("avg and divide of integers: every form of divisor, dividends around its multiples") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  constexpr std::int64_t divisors[] = {1,
                                       2,
                                       3,
                                       5,
                                       6,
                                       7,
                                       100,
                                       127,
                                       128,
                                       255,
                                       256,
                                       641,
                                       65535,
                                       65537,
                                       0x7fffffff,
                                       0x80000000,
                                       0xffffffff,
                                       0x100000000,
                                       0x100000001,
                                       (std::int64_t{1} << 62) + 3,
                                       std::numeric_limits<std::int64_t>::max()};
  for (dtype t : {dtype::int8, dtype::uint8, dtype::int32, dtype::uint32, dtype::int64, dtype::uint64})
    for (std::int64_t divisor : divisors) {
      CAPTURE(dtype_name(t));
      CAPTURE(divisor);
      const std::vector<unsigned char> src = visit_dtype(t, [&]<class T>() {
        const std::vector<unsigned char> noise =
            gpu_test::random_bytes(4096 * sizeof(T), 900 + static_cast<std::uint64_t>(divisor % 1000));
        std::vector<T> v = {std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), T(0), T(1),
                            static_cast<T>(-1)};
        const auto d = static_cast<std::uint64_t>(divisor);
        for (std::uint64_t q :
             {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3}, std::uint64_t{100}, std::uint64_t{12345}})
          for (std::uint64_t m : {q * d, q * d - 1, q * d + 1, q * d + d - 1}) {  // wrapping where T is narrower
            v.push_back(static_cast<T>(m));
            v.push_back(static_cast<T>(std::uint64_t{0} - m));
          }
        std::vector<unsigned char> bytes(v.size() * sizeof(T) + noise.size());
        std::memcpy(bytes.data(), v.data(), v.size() * sizeof(T));
        std::memcpy(bytes.data() + v.size() * sizeof(T), noise.data(), noise.size());
        return bytes;
      });
      const std::uint64_t n = src.size() / dtype_size(t);
      const std::vector<unsigned char> zeros(src.size(), 0);
      device_buffer dsrc(src.size()), dzero(src.size()), ddst(src.size());
      dsrc.upload(src);
      dzero.upload(zeros);
      std::vector<unsigned char> want(src.size());
      std::string what;

      expect_launch(k.divide(ddst.get(), dsrc.get(), n, t, divisor, stream.s), "divide launch");
      primitive::divide_into(want.data(), src.data(), n, t, divisor);
      sync(stream.s);
      CHECK_MESSAGE(gpu_test::first_difference(t, ddst.download(0, src.size()), want, false, &what) == -1,
                    "divide: " << what);

      primitive::reduce_spec avg = spec_of(t, reduce_kind::avg);
      avg.divisor = divisor;
      expect_launch(k.reduce_into(ddst.get(), dsrc.get(), dzero.get(), n, avg, stream.s), "reduce_into launch");
      primitive::reduce_into(want.data(), src.data(), zeros.data(), n, avg);
      sync(stream.s);
      CHECK_MESSAGE(gpu_test::first_difference(t, ddst.download(0, src.size()), want, false, &what) == -1,
                    "avg: " << what);
    }
  primitive::reduce_spec negative = spec_of(dtype::int32, reduce_kind::avg);
  negative.divisor = -2;
  CHECK(k.reduce_into(nullptr, nullptr, nullptr, 4, negative, stream.s) != 0);
}

TEST_CASE("allocate, deallocate and synchronize through the table") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  void* p = nullptr;
  expect_launch(k.allocate(&p, 1000), "allocate");
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  expect_launch(k.fill(p, 1000, dtype::uint8, 7.0, stream.s), "fill");
  CHECK(k.synchronize(stream.s) == 0);
  std::vector<unsigned char> host(1000);
  primitive::cudart::check(cudaMemcpy(host.data(), p, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  CHECK(host == std::vector<unsigned char>(1000, 7));
  CHECK(k.deallocate(p) == 0);
  CHECK(k.deallocate(nullptr) == 0);
}

TEST_CASE("invalid dtypes and kinds are refused without a launch") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  primitive::reduce_spec bad_type = spec_of(static_cast<dtype>(77), reduce_kind::sum);
  primitive::reduce_spec bad_kind = spec_of(dtype::float32, static_cast<reduce_kind>(9));
  CHECK(k.reduce_into(nullptr, nullptr, nullptr, 4, bad_type, stream.s) != 0);
  CHECK(k.reduce_into(nullptr, nullptr, nullptr, 4, bad_kind, stream.s) != 0);
  CHECK(k.cast(nullptr, static_cast<dtype>(50), nullptr, dtype::int8, 4, stream.s) != 0);
  CHECK(k.scale(nullptr, nullptr, 4, static_cast<dtype>(50), 1.0, stream.s) != 0);
  CHECK(k.fill(nullptr, 4, static_cast<dtype>(50), 1.0, stream.s) != 0);
  CHECK(k.reduce_into(nullptr, nullptr, nullptr, 0, spec_of(dtype::float32, reduce_kind::sum), stream.s) == 0);
  sync(stream.s);
}

TEST_CASE("a count above 2^31 elements is reduced completely (64-bit indexing)") {
  std::size_t free_bytes = 0, total_bytes = 0;
  primitive::cudart::check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const std::uint64_t count = (std::uint64_t{1} << 31) + 17;
  if (free_bytes < 4 * count) {
    MESSAGE("skipped: needs " << 4 * count / (1 << 20) << " MiB of free device memory");
    return;
  }
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  const auto a = gpu_test::random_bytes(static_cast<std::size_t>(count), 7);
  const auto b = gpu_test::random_bytes(static_cast<std::size_t>(count), 8);
  device_buffer da(a.size()), db(b.size());
  da.upload(a);
  db.upload(b);
  const primitive::reduce_spec spec = spec_of(dtype::uint8, reduce_kind::sum);
  expect_launch(k.reduce_into(da.get() + 1, da.get() + 1, db.get() + 1, count - 1, spec, stream.s),
                "reduce_into launch");
  sync(stream.s);
  std::vector<unsigned char> want = a;
  primitive::reduce_into(want.data() + 1, want.data() + 1, b.data() + 1, count - 1, spec);
  CHECK(da.download(0, a.size()) == want);
}

namespace {

/// `f(slice, begin, end)` over [0, n) cut into `threads` slices, one thread each.
template <class F>
void parallel_for(std::uint64_t n, unsigned threads, F f) {
  std::vector<std::thread> pool;
  const std::uint64_t slice = (n + threads - 1) / threads;
  for (unsigned w = 0; w < threads; ++w) {
    const std::uint64_t begin = std::min<std::uint64_t>(n, w * slice), end = std::min<std::uint64_t>(n, begin + slice);
    pool.emplace_back([=, &f] { f(w, begin, end); });
  }
  for (auto& th : pool) th.join();
}

/// `gpu_test::first_difference` over `n` elements on `threads` threads: the first differing
/// index, or -1.
long long first_difference_parallel(dtype t, const unsigned char* got, const unsigned char* want, std::uint64_t n,
                                    bool nan_equal, unsigned threads) {
  std::vector<long long> first(threads, -1);
  const std::size_t es = dtype_size(t);
  parallel_for(n, threads, [&](unsigned w, std::uint64_t begin, std::uint64_t end) {
    const long long at = gpu_test::first_difference(t, got + begin * es, want + begin * es, end - begin, nan_equal);
    if (at >= 0) first[w] = static_cast<long long>(begin) + at;
  });
  for (long long f : first)
    if (f >= 0) return f;
  return -1;
}

/// Pinned host memory (fast transfers, touched once), freed on destruction.
struct pinned_buffer {
  unsigned char* p = nullptr;
  explicit pinned_buffer(std::size_t bytes) {
    primitive::cudart::check(cudaMallocHost(reinterpret_cast<void**>(&p), bytes), "cudaMallocHost");
  }
  ~pinned_buffer() { (void)cudaFreeHost(p); }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
};

}  // namespace

// Every pair of 8- and 16-bit values through the kernels that are not the host's element
// functions, on the device itself, against the host primitive (NaN payloads free only for
// arithmetic): float16 sum and prod in binary16 instructions, float16 and bfloat16 min and max
// by 16-bit comparisons and masks (primitive/lanes.hpp), bfloat16 sum and prod through the
// hardware's float32 -> bfloat16 rounding (primitive/kernels/arithmetic.hpp), int8 and uint8 sums by
// byte additions and their min and max by SIMD intrinsics: 2^32 pairs per 16-bit type and
// kind, in chunks of 1024 second operands x all 65536 first operands (every other chunk one
// element in). The host tests check the lane functions with a model of the comparison
// instruction; this checks the instructions.
TEST_CASE(
    "reduce_into: every pair of float16 and bfloat16 values (sum, prod, min, max) and of int8 and uint8 values (sum, "
    "min, max)") {
  const auto& k = primitive::require_device_primitives();
  stream_holder stream;
  const unsigned threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  {
    constexpr std::uint64_t n = 65536;  // every (x, y) byte pair
    std::vector<unsigned char> a(n), b(n), want(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      a[i] = static_cast<unsigned char>(i);
      b[i] = static_cast<unsigned char>(i >> 8);
    }
    device_buffer da(n), db(n), dd(n);
    da.upload(a);
    db.upload(b);
    for (dtype t : {dtype::int8, dtype::uint8})
      for (reduce_kind kind : {reduce_kind::sum, reduce_kind::min, reduce_kind::max}) {
        CAPTURE(dtype_name(t));
        CAPTURE(reduce_kind_name(kind));
        expect_launch(k.reduce_into(dd.get(), da.get(), db.get(), n, spec_of(t, kind), stream.s), "reduce_into launch");
        primitive::reduce_into(want.data(), a.data(), b.data(), n, spec_of(t, kind));
        sync(stream.s);
        CHECK(gpu_test::first_difference(t, dd.download(0, n), want, false) == -1);
      }
  }
  constexpr std::uint64_t values = 65536, seconds_per_chunk = 1024, n = values * seconds_per_chunk;
  constexpr std::size_t bytes = static_cast<std::size_t>(n) * 2;
  pinned_buffer a(bytes), b(bytes), got(bytes);
  std::vector<unsigned char> want(bytes);
  for (std::uint64_t i = 0; i < n; ++i)
    reinterpret_cast<std::uint16_t*>(a.p)[i] = static_cast<std::uint16_t>(i % values);
  device_buffer da(bytes), db(bytes), dd(bytes);
  primitive::cudart::check(cudaMemcpy(da.get(), a.p, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  for (dtype t : {dtype::float16, dtype::bfloat16}) {
    for (reduce_kind kind : {reduce_kind::sum, reduce_kind::prod, reduce_kind::min, reduce_kind::max}) {
      CAPTURE(dtype_name(t));
      CAPTURE(reduce_kind_name(kind));
      const primitive::reduce_spec spec = spec_of(t, kind);
      const bool arithmetic = kind == reduce_kind::sum || kind == reduce_kind::prod;
      for (std::uint64_t first_second = 0; first_second < values; first_second += seconds_per_chunk) {
        CAPTURE(first_second);
        // every other chunk starts one element in: each value then sits in the other 16-bit lane
        // of its word, and the kernel's scalar head and tail run
        const std::uint64_t skip = (first_second / seconds_per_chunk) % 2;
        auto* second = reinterpret_cast<std::uint16_t*>(b.p);  // cudaMallocHost memory is aligned for any type
        parallel_for(n, threads, [&](unsigned, std::uint64_t begin, std::uint64_t end) {
          for (std::uint64_t i = begin; i < end; ++i) second[i] = static_cast<std::uint16_t>(first_second + i / values);
        });
        primitive::cudart::check(cudaMemcpy(db.get(), b.p, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
        expect_launch(
            k.reduce_into(dd.get() + 2 * skip, da.get() + 2 * skip, db.get() + 2 * skip, n - skip, spec, stream.s),
            "reduce_into launch");
        parallel_for(
            n, threads,
            [&](unsigned, std::uint64_t begin, std::uint64_t end) {  // the host's result while the device works
              primitive::reduce_into(want.data() + 2 * begin, a.p + 2 * begin, b.p + 2 * begin, end - begin, spec);
            });
        sync(stream.s);
        primitive::cudart::check(cudaMemcpy(got.p, dd.get(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
        long long at =
            first_difference_parallel(t, got.p + 2 * skip, want.data() + 2 * skip, n - skip, arithmetic, threads);
        if (at >= 0) {
          at += static_cast<long long>(skip);
          std::uint16_t x, y, g, h;
          std::memcpy(&x, a.p + 2 * at, 2);
          std::memcpy(&y, b.p + 2 * at, 2);
          std::memcpy(&g, got.p + 2 * at, 2);
          std::memcpy(&h, want.data() + 2 * at, 2);
          char what[128];
          std::snprintf(what, sizeof what, "%s %s of 0x%04x and 0x%04x: device 0x%04x, host 0x%04x",
                        std::string(dtype_name(t)).c_str(), std::string(reduce_kind_name(kind)).c_str(), x, y, g, h);
          FAIL(what);
        }
      }
    }
  }
}
