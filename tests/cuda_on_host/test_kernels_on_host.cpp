// Suite 'cuda-on-host': every CUDA kernel of ringzero (the bodies of primitive/kernels/*.hpp and
// zero/step_kernels.hpp, which a GPU runs through primitive/cuda_launch.cuh) executed on the host
// by `host_launcher`, block by block and thread by thread, and compared bit for bit with the host
// primitives: reduce_into over every dtype, kind, pre-scaling and division; cast over all 100
// dtype pairs; scale, divide and fill; the ZeRO step's sum of squares, decision and update over
// every gradient and parameter type and optimizer. Counts around the vector widths, misaligned
// and in-place pointers (vector path with a scalar head and tail, and the all-scalar path),
// grids capped at 1 and 3 resident blocks (the grid-stride loops go round) and blocks and
// threads run last to first. The words after each output stay untouched.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "recording_launcher.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/kernels/cast.hpp"
#include "ringzero/primitive/kernels/fill.hpp"
#include "ringzero/primitive/kernels/reduce_into.hpp"
#include "ringzero/primitive/kernels/scale.hpp"
#include "ringzero/primitive/reduce.hpp"
#include "ringzero/zero/optimizer.hpp"
#include "ringzero/zero/shard_update.hpp"
#include "ringzero/zero/step_kernels.hpp"

using namespace ringzero;
namespace pk = primitive::kernels;
using ringzero_test::launchers;
using ringzero_test::recording_launcher;

namespace {

const std::uint64_t counts[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 255, 1000, 4099};
constexpr std::size_t guard_bytes = 64;  // checked after each output
constexpr std::size_t slack = 16;        // room for misaligning offsets, in elements

std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(g());
  return v;
}

/// Whether the `size`-byte element at `p` is a NaN of floating dtype `t`.
bool is_nan_element(dtype t, const unsigned char* p) {
  switch (t) {
    case dtype::float16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return (b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0;
    }
    case dtype::bfloat16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0;
    }
    case dtype::float32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case dtype::float64: {
      double d;
      std::memcpy(&d, p, 8);
      return std::isnan(d);
    }
    default: return false;
  }
}

/// `got` and `want` (count elements of `t`) equal bit for bit, except that where `nan_free`
/// both may be NaNs with different payloads (arithmetic on two NaNs: which operand's payload
/// comes out is the compiler's choice of operand order); the guard words after both equal.
void expect_same(dtype t, const unsigned char* got, const unsigned char* want, std::uint64_t count, bool nan_free,
                 const std::string& what) {
  const std::size_t size = dtype_size(t);
  for (std::uint64_t i = 0; i < count; ++i) {
    const unsigned char* g = got + i * size;
    const unsigned char* w = want + i * size;
    if (std::memcmp(g, w, size) == 0) continue;
    if (nan_free && is_nan_element(t, g) && is_nan_element(t, w)) continue;
    FAIL(what << ": element " << i << " of " << count << " differs");
    return;
  }
  if (std::memcmp(got + count * size, want + count * size, guard_bytes) != 0)
    FAIL(what << ": the bytes after the output were written");
}

primitive::reduce_spec spec_of(dtype t, reduce_kind k, double scalar_a = 1, double scalar_b = 1, bool pre_a = false,
                               bool pre_b = false, std::int64_t divisor = 0) {
  primitive::reduce_spec s;
  s.type = t;
  s.kind = k;
  s.scalar_a = scalar_a;
  s.scalar_b = scalar_b;
  s.pre_a = pre_a;
  s.pre_b = pre_b;
  s.divisor = divisor;
  return s;
}

/// Every reduce kernel variant: the four plain kinds, avg's division, premul_sum's pre-scaling
/// on both or one side with and without the division, a sum with a division, and max with a
/// pre-scaling it ignores.
std::vector<primitive::reduce_spec> reduce_variants(dtype t) {
  const bool fp = is_floating_point(t);
  return {spec_of(t, reduce_kind::sum),
          spec_of(t, reduce_kind::prod),
          spec_of(t, reduce_kind::min),
          spec_of(t, reduce_kind::max),
          spec_of(t, reduce_kind::avg, 1, 1, false, false, 3),
          spec_of(t, reduce_kind::premul_sum, fp ? 0.3 : 3, fp ? -2.5 : -7, true, true),
          spec_of(t, reduce_kind::premul_sum, 1, fp ? 1e-3 : 5, false, true, 4),
          spec_of(t, reduce_kind::sum, 1, 1, false, false, 7),
          spec_of(t, reduce_kind::max, fp ? 7.5 : 9, 1, true, false)};
}

/// Element offsets of a binary kernel's (dst, a, b); `in_place` 1: dst is a, 2: dst is b.
struct layout {
  std::size_t dst, a, b;
  int in_place;
};
const layout layouts[] = {{0, 0, 0, 0}, {1, 1, 1, 0}, {3, 3, 3, 0}, {0, 1, 2, 0}, {1, 1, 1, 1}, {0, 0, 0, 2}};

/// A body that counts the threads it ran.
struct counting_body {
  static constexpr const char* kernel_name = "counting_body";
  int* runs;
  template <class Block>
  void operator()(Block& b) const {
    b.for_each_thread([&](std::uint64_t) { ++*runs; });
  }
};

}  // namespace

TEST_CASE("reduce_into's kernels on the host give the host primitive's bits") {
  const auto ls = launchers();
  for (int ti = 0; ti < dtype_count; ++ti) {
    const dtype t = static_cast<dtype>(ti);
    const std::size_t size = dtype_size(t);
    const std::size_t bytes = (counts[std::size(counts) - 1] + slack) * size + guard_bytes;
    const auto a0 = random_bytes(bytes, 11 + ti), b0 = random_bytes(bytes, 97 + ti);
    for (const auto& spec : reduce_variants(t)) {
      const bool nan_free = spec.kind != reduce_kind::min && spec.kind != reduce_kind::max;
      std::size_t round = 0;
      for (const std::uint64_t count : counts) {
        for (const layout& l : layouts) {
          const recording_launcher& launcher = ls[round++ % ls.size()];
          std::vector<unsigned char> a = a0, b = b0, dst = random_bytes(bytes, count);
          std::vector<unsigned char> ha = a0, hb = b0, hdst = dst;
          unsigned char* d = l.in_place == 1 ? a.data() : l.in_place == 2 ? b.data() : dst.data();
          unsigned char* hd = l.in_place == 1 ? ha.data() : l.in_place == 2 ? hb.data() : hdst.data();
          const std::size_t doff = l.in_place == 1 ? l.a : l.in_place == 2 ? l.b : l.dst;
          const int rc =
              pk::reduce_into(launcher, d + doff * size, a.data() + l.a * size, b.data() + l.b * size, count, spec);
          REQUIRE(rc == pk::launch_success);
          primitive::reduce_into(hd + doff * size, ha.data() + l.a * size, hb.data() + l.b * size, count, spec);
          expect_same(t, d + doff * size, hd + doff * size, count, nan_free,
                      std::string(dtype_name(t)) + " " + std::string(reduce_kind_name(spec.kind)) + " count " +
                          std::to_string(count) + " offsets " + std::to_string(l.dst) + "," + std::to_string(l.a) +
                          "," + std::to_string(l.b) + " in place " + std::to_string(l.in_place));
        }
      }
    }
  }
}

TEST_CASE("cast's kernels on the host give the host cast's bits for all 100 dtype pairs") {
  const auto ls = launchers();
  const std::pair<std::size_t, std::size_t> offsets[] = {{0, 0}, {1, 1}, {0, 3}, {5, 2}};
  for (int to = 0; to < dtype_count; ++to) {
    for (int from = 0; from < dtype_count; ++from) {
      const dtype dt = static_cast<dtype>(to), st = static_cast<dtype>(from);
      const std::size_t bytes = (counts[std::size(counts) - 1] + slack) * 8 + guard_bytes;
      const auto src0 = random_bytes(bytes, 1000 + 10 * to + from);
      std::size_t round = 0;
      if (dtype_size(dt) == dtype_size(st) && dt != st) {  // in place: the contract allows equal sizes
        for (const std::uint64_t count : {std::uint64_t{17}, std::uint64_t{4099}}) {
          std::vector<unsigned char> buf = src0, hbuf = src0;
          REQUIRE(pk::cast(ls[count % ls.size()], buf.data() + dtype_size(st), dt, buf.data() + dtype_size(st), st,
                           count) == pk::launch_success);
          primitive::cast_into(hbuf.data() + dtype_size(st), dt, hbuf.data() + dtype_size(st), st, count);
          expect_same(dt, buf.data() + dtype_size(st), hbuf.data() + dtype_size(st), count, false,
                      std::string(dtype_name(st)) + " -> " + std::string(dtype_name(dt)) + " in place");
        }
      }
      for (const std::uint64_t count : counts) {
        for (const auto& [doff, soff] : offsets) {
          const recording_launcher& launcher = ls[round++ % ls.size()];
          std::vector<unsigned char> dst = random_bytes(bytes, count + 7), hdst = dst;
          REQUIRE(pk::cast(launcher, dst.data() + doff * dtype_size(dt), dt, src0.data() + soff * dtype_size(st), st,
                           count) == pk::launch_success);
          primitive::cast_into(hdst.data() + doff * dtype_size(dt), dt, src0.data() + soff * dtype_size(st), st, count);
          expect_same(
              dt, dst.data() + doff * dtype_size(dt), hdst.data() + doff * dtype_size(dt), count, false,
              std::string(dtype_name(st)) + " -> " + std::string(dtype_name(dt)) + " count " + std::to_string(count));
        }
      }
    }
  }
}

TEST_CASE("scale, divide and fill kernels on the host give the host primitives' bits, in place too") {
  const auto ls = launchers();
  for (int ti = 0; ti < dtype_count; ++ti) {
    const dtype t = static_cast<dtype>(ti);
    const std::size_t size = dtype_size(t);
    const bool fp = is_floating_point(t);
    const std::size_t bytes = (counts[std::size(counts) - 1] + slack) * size + guard_bytes;
    const auto src0 = random_bytes(bytes, 500 + ti);
    std::size_t round = 0;
    for (const std::uint64_t count : counts) {
      for (const auto& [doff, soff, in_place] :
           {std::tuple{0, 0, false}, std::tuple{1, 1, true}, std::tuple{2, 1, false}, std::tuple{3, 3, true}}) {
        const recording_launcher& launcher = ls[round++ % ls.size()];
        const std::string where =
            std::string(dtype_name(t)) + " count " + std::to_string(count) + " offset " + std::to_string(doff);
        for (const double scalar : {fp ? 0.3 : 3.0, fp ? -2.5 : -7.0, fp ? 1e-3 : 1.0}) {
          std::vector<unsigned char> src = src0, hsrc = src0, dst = random_bytes(bytes, count), hdst = dst;
          unsigned char* d = in_place ? src.data() + soff * size : dst.data() + doff * size;
          unsigned char* hd = in_place ? hsrc.data() + soff * size : hdst.data() + doff * size;
          REQUIRE(pk::scale(launcher, d, src.data() + soff * size, count, t, scalar) == pk::launch_success);
          primitive::scale_into(hd, hsrc.data() + soff * size, count, t, scalar);
          expect_same(t, d, hd, count, true, "scale by " + std::to_string(scalar) + " " + where);
        }
        for (const std::int64_t divisor : {std::int64_t{1}, std::int64_t{3}, std::int64_t{7}, std::int64_t{1000}}) {
          std::vector<unsigned char> src = src0, hsrc = src0, dst = random_bytes(bytes, count), hdst = dst;
          unsigned char* d = in_place ? src.data() + soff * size : dst.data() + doff * size;
          unsigned char* hd = in_place ? hsrc.data() + soff * size : hdst.data() + doff * size;
          REQUIRE(pk::divide(launcher, d, src.data() + soff * size, count, t, divisor) == pk::launch_success);
          primitive::divide_into(hd, hsrc.data() + soff * size, count, t, divisor);
          expect_same(t, d, hd, count, true, "divide by " + std::to_string(divisor) + " " + where);
        }
        for (const double value : {0.0, 1.5, -3.0, 1e30, std::numeric_limits<double>::quiet_NaN()}) {
          std::vector<unsigned char> dst = random_bytes(bytes, count), hdst = dst;
          REQUIRE(pk::fill(launcher, dst.data() + doff * size, count, t, value) == pk::launch_success);
          primitive::fill(hdst.data() + doff * size, count, t, value);
          expect_same(t, dst.data() + doff * size, hdst.data() + doff * size, count, false,
                      "fill " + std::to_string(value) + " " + where);
        }
      }
    }
  }
}

TEST_CASE("the element-wise kernels' vector loops go round the grid: counts beyond one resident block's round") {
  // One block of 256 threads covers 256 x U vectors per round (8192 elements for 1- and 2-byte
  // types, 4096 for 4-byte); with 1 or 2 resident blocks these counts take several rounds.
  recording_launcher one, two;
  one.resident = 1;
  two.resident = 2;
  two.reverse = true;
  const std::uint64_t count = 3 * 8192 + 13;
  for (int ti = 0; ti < dtype_count; ++ti) {
    const dtype t = static_cast<dtype>(ti);
    const std::size_t size = dtype_size(t);
    const std::size_t bytes = (count + slack) * 8 + guard_bytes;
    const auto a0 = random_bytes(bytes, 3000 + ti), b0 = random_bytes(bytes, 4000 + ti);
    std::size_t round = 0;
    for (const auto& spec : reduce_variants(t)) {
      const recording_launcher& launcher = round++ % 2 == 0 ? one : two;
      const std::size_t off = round % 3 == 0 ? 1 : 0;
      std::vector<unsigned char> dst(bytes, 0x5a), hdst(bytes, 0x5a);
      REQUIRE(pk::reduce_into(launcher, dst.data() + off * size, a0.data() + off * size, b0.data() + off * size, count,
                              spec) == pk::launch_success);
      primitive::reduce_into(hdst.data() + off * size, a0.data() + off * size, b0.data() + off * size, count, spec);
      expect_same(t, dst.data() + off * size, hdst.data() + off * size, count,
                  spec.kind != reduce_kind::min && spec.kind != reduce_kind::max,
                  std::string(dtype_name(t)) + " " + std::string(reduce_kind_name(spec.kind)) + " over rounds");
    }
    for (int from = 0; from < dtype_count; ++from) {
      const dtype st = static_cast<dtype>(from);
      std::vector<unsigned char> dst(bytes, 0x5a), hdst(bytes, 0x5a);
      REQUIRE(pk::cast(from % 2 == 0 ? one : two, dst.data(), t, a0.data(), st, count) == pk::launch_success);
      primitive::cast_into(hdst.data(), t, a0.data(), st, count);
      expect_same(t, dst.data(), hdst.data(), count, false,
                  std::string(dtype_name(st)) + " -> " + std::string(dtype_name(t)) + " over rounds");
    }
    std::vector<unsigned char> dst(bytes, 0x5a), hdst(bytes, 0x5a);
    REQUIRE(pk::scale(one, dst.data(), a0.data(), count, t, is_floating_point(t) ? 0.3 : 3.0) == pk::launch_success);
    primitive::scale_into(hdst.data(), a0.data(), count, t, is_floating_point(t) ? 0.3 : 3.0);
    expect_same(t, dst.data(), hdst.data(), count, true, std::string(dtype_name(t)) + " scale over rounds");
    REQUIRE(pk::divide(two, dst.data(), a0.data(), count, t, 7) == pk::launch_success);
    primitive::divide_into(hdst.data(), a0.data(), count, t, 7);
    expect_same(t, dst.data(), hdst.data(), count, true, std::string(dtype_name(t)) + " divide over rounds");
    REQUIRE(pk::fill(one, dst.data() + size, count, t, -3.0) == pk::launch_success);
    primitive::fill(hdst.data() + size, count, t, -3.0);
    expect_same(t, dst.data() + size, hdst.data() + size, count, false,
                std::string(dtype_name(t)) + " fill over rounds");
  }
}

TEST_CASE("the kernels refuse invalid dtypes, kinds, divisors and grids and write nothing") {
  const recording_launcher launcher;
  float x[4] = {1, 2, 3, 4};
  const float before[4] = {1, 2, 3, 4};
  const auto bad_type = static_cast<dtype>(dtype_count + 3);
  CHECK(pk::reduce_into(launcher, x, x, x, 4, spec_of(bad_type, reduce_kind::sum)) == pk::launch_invalid_value);
  CHECK(pk::reduce_into(launcher, x, x, x, 4, spec_of(dtype::float32, static_cast<reduce_kind>(99))) ==
        pk::launch_invalid_value);
  CHECK(pk::reduce_into(launcher, x, x, x, 4, spec_of(dtype::float32, reduce_kind::avg, 1, 1, false, false, -1)) ==
        pk::launch_invalid_value);
  CHECK(pk::cast(launcher, x, bad_type, x, dtype::float32, 4) == pk::launch_invalid_value);
  CHECK(pk::scale(launcher, x, x, 4, bad_type, 2.0) == pk::launch_invalid_value);
  CHECK(pk::divide(launcher, x, x, 4, dtype::float32, 0) == pk::launch_invalid_value);
  CHECK(pk::fill(launcher, x, 4, bad_type, 0.0) == pk::launch_invalid_value);
  CHECK(std::memcmp(x, before, sizeof x) == 0);
  // a pointer off its element type's alignment: refused before anything runs, on each side
  alignas(16) unsigned char raw[64] = {};
  unsigned char* odd = raw + 1;
  CHECK(pk::reduce_into(launcher, odd, raw, raw, 4, spec_of(dtype::float32, reduce_kind::sum)) ==
        pk::launch_misaligned_address);
  CHECK(pk::reduce_into(launcher, raw, raw, raw + 2, 4, spec_of(dtype::int32, reduce_kind::max)) ==
        pk::launch_misaligned_address);
  CHECK(pk::cast(launcher, raw, dtype::float32, odd, dtype::float16, 4) == pk::launch_misaligned_address);
  CHECK(pk::cast(launcher, raw + 2, dtype::float16, raw + 4, dtype::float64, 4) == pk::launch_misaligned_address);
  CHECK(pk::scale(launcher, raw, raw + 4, 4, dtype::float64, 2.0) == pk::launch_misaligned_address);
  CHECK(pk::divide(launcher, odd, odd, 4, dtype::bfloat16, 3) == pk::launch_misaligned_address);
  CHECK(pk::fill(launcher, raw + 6, 4, dtype::int64, 1.0) == pk::launch_misaligned_address);
  for (unsigned char c : raw) CHECK(c == 0);
  CHECK(pk::fill(launcher, odd, 4, dtype::int8, 1.0) == pk::launch_success);  // bytes are always aligned
  int runs = 0;
  const pk::host_launcher plain;
  CHECK(plain.launch(counting_body{&runs}, 0, 32) == pk::launch_invalid_value);
  CHECK(plain.launch(counting_body{&runs}, 1, 0) == pk::launch_invalid_value);
  CHECK(plain.launch(counting_body{&runs}, 1, pk::max_block_threads + 1) == pk::launch_invalid_value);
  CHECK(runs == 0);
  CHECK(plain.launch(counting_body{&runs}, 5, 32) == pk::launch_success);
  CHECK(runs == 5 * 32);
}

namespace {

/// `n` values of float type T: random normals times `spread`, or small integers (whose squares
/// add exactly in any order) when `exact`.
template <class T>
std::vector<T> float_values(std::uint64_t n, std::uint64_t seed, bool exact) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-40, 40);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(exact ? static_cast<float>(small(g)) : normal(g));
  return v;
}

}  // namespace

TEST_CASE("the step's sum of squares on the host: exact where the order cannot matter, the same bits both ways round") {
  std::vector<double> partials(zero::sum_of_squares_partials);
  for (const std::uint64_t count : {std::uint64_t{1}, std::uint64_t{255}, std::uint64_t{257}, std::uint64_t{65536},
                                    std::uint64_t{65537 + 4099}, std::uint64_t{200003}}) {
    auto check_type = [&]<class T>(dtype t) {
      INFO(dtype_name(t) << " count " << count);
      const auto exact = float_values<T>(count, count, true);
      for (const auto& launcher : launchers()) {
        double sum = 2.0;  // the kernel adds to what is there
        REQUIRE(zero::kernels::add_sum_of_squares(launcher, &sum, exact.data(), count, t, partials.data()) ==
                pk::launch_success);
        CHECK(sum == 2.0 + zero::detail::sum_of_squares(exact.data(), count, t));
      }
      const auto normal = float_values<T>(count, count + 1, false);
      double forward = 0, backward = 0;
      pk::host_launcher reversed;
      reversed.reverse = true;
      REQUIRE(zero::kernels::add_sum_of_squares(recording_launcher{}, &forward, normal.data(), count, t,
                                                partials.data()) == pk::launch_success);
      REQUIRE(zero::kernels::add_sum_of_squares(reversed, &backward, normal.data(), count, t, partials.data()) ==
              pk::launch_success);
      CHECK(std::memcmp(&forward, &backward, sizeof forward) == 0);  // a fixed tree: no order dependence
      const double host = zero::detail::sum_of_squares(normal.data(), count, t);
      CHECK(std::fabs(forward - host) <= 1e-12 * host);
    };
    check_type.template operator()<float>(dtype::float32);
    check_type.template operator()<bfloat16>(dtype::bfloat16);
    check_type.template operator()<float16>(dtype::float16);
  }
  double untouched = 5;
  CHECK(zero::kernels::add_sum_of_squares(recording_launcher{}, &untouched, partials.data(), 4, dtype::int32,
                                          partials.data()) == pk::launch_invalid_value);
  CHECK(untouched == 5);
}

TEST_CASE("the step's decision on the host is the host's") {
  const double inf = std::numeric_limits<double>::infinity();
  for (const double squares : {0.0, 4.0, 1e6, inf, std::numeric_limits<double>::quiet_NaN()}) {
    for (const double inverse_scale : {1.0, 1.0 / 65536}) {
      for (const double max_norm : {0.0, 1.0, 1e9}) {
        for (const bool skip : {false, true}) {
          zero::step_scalars k, h;
          k.squares = h.squares = squares;
          k.inverse_scale = h.inverse_scale = inverse_scale;
          REQUIRE(zero::kernels::decide_step(recording_launcher{}, &k, max_norm, skip) == pk::launch_success);
          zero::detail::decide_step(h, max_norm, skip);
          CHECK(std::memcmp(&k, &h, sizeof k) == 0);
        }
      }
    }
  }
}

TEST_CASE("the step's update kernel on the host gives the host update's bits: every type, optimizer, skip") {
  std::vector<zero::optimizer_options> optimizers(5);
  optimizers[0].kind = zero::optimizer_kind::sgd;
  optimizers[0].lr = 0.1;
  optimizers[1].kind = zero::optimizer_kind::sgd;
  optimizers[1].lr = 0.05;
  optimizers[1].momentum = 0.9;
  optimizers[1].nesterov = true;
  optimizers[1].weight_decay = 1e-4;
  optimizers[2].kind = zero::optimizer_kind::adam;
  optimizers[2].weight_decay = 1e-2;
  optimizers[3].kind = zero::optimizer_kind::adamw;
  optimizers[3].weight_decay = 1e-2;
  optimizers[4].kind = zero::optimizer_kind::sgd;
  optimizers[4].momentum = 0.5;
  optimizers[4].dampening = 0.1;
  const dtype floats[] = {dtype::float32, dtype::bfloat16, dtype::float16};
  for (const std::uint64_t count : {std::uint64_t{1}, std::uint64_t{300}, std::uint64_t{4099}}) {
    for (const dtype gt : floats) {
      for (const dtype pt : floats) {
        for (std::size_t oi = 0; oi < optimizers.size(); ++oi) {
          for (const std::uint64_t step : {std::uint64_t{1}, std::uint64_t{7}}) {
            for (const bool skipped : {false, true}) {
              INFO(dtype_name(gt) << " gradients, " << dtype_name(pt) << " parameters, optimizer " << oi << ", step "
                                  << step << ", count " << count << (skipped ? ", skipped" : ""));
              const bool master = pt != dtype::float32 || oi % 2 == 1;
              auto gradient_values = float_values<float>(count, step + count, false);
              std::vector<unsigned char> g(count * dtype_size(gt));
              primitive::cast_into(g.data(), gt, gradient_values.data(), dtype::float32, count);
              const auto w0 = float_values<float>(count, 3 * count + oi, false);
              std::vector<float> kw = w0, hw = w0;
              std::vector<unsigned char> kp(count * dtype_size(pt)), hp;
              primitive::cast_into(kp.data(), pt, w0.data(), dtype::float32, count);
              hp = kp;
              std::vector<float> ks0 = float_values<float>(count, oi, false), ks1(count, 0.25f);
              std::vector<float> hs0 = ks0, hs1 = ks1;
              zero::shard_update ku;
              ku.rule = zero::detail::make_update_rule(optimizers[oi], step);
              ku.grads = g.data();
              ku.gradient_type = gt;
              ku.param_type = pt;
              ku.count = count;
              ku.s0 = ks0.data();
              ku.s1 = ks1.data();
              zero::shard_update hu = ku;
              hu.s0 = hs0.data();
              hu.s1 = hs1.data();
              if (master) {
                ku.master = kw.data();
                ku.params = kp.data();
                hu.master = hw.data();
                hu.params = hp.data();
              } else {
                ku.params = kw.data();
                hu.params = hw.data();
              }
              zero::step_scalars s;
              s.gradient_multiplier = 0.75;
              s.skipped = skipped ? 1 : 0;
              const recording_launcher launcher = launchers()[(count + oi + step) % 4];
              REQUIRE(zero::kernels::update_shard(launcher, ku, &s) == pk::launch_success);
              if (!skipped) zero::detail::update_shard(hu, static_cast<float>(s.gradient_multiplier));
              CHECK(std::memcmp(kw.data(), hw.data(), count * 4) == 0);
              CHECK(std::memcmp(kp.data(), hp.data(), kp.size()) == 0);
              CHECK(std::memcmp(ks0.data(), hs0.data(), count * 4) == 0);
              CHECK(std::memcmp(ks1.data(), hs1.data(), count * 4) == 0);
              if (skipped) CHECK(std::memcmp(kw.data(), w0.data(), count * 4) == 0);
            }
          }
        }
      }
    }
  }
  {
    // Above 8192 blocks x 256 threads the update's grid strides.
    const std::uint64_t count = 8192ull * 256 + 1001;
    const auto g = float_values<float>(count, 77, false);
    const auto w0 = float_values<float>(count, 78, false);
    std::vector<float> kw = w0, hw = w0, km(count, 0.0f), hm(count, 0.0f), kv(count, 0.0f), hv(count, 0.0f);
    zero::shard_update ku;
    ku.rule = zero::detail::make_update_rule(optimizers[3], 1);
    ku.grads = g.data();
    ku.count = count;
    ku.params = kw.data();
    ku.s0 = km.data();
    ku.s1 = kv.data();
    zero::shard_update hu = ku;
    hu.params = hw.data();
    hu.s0 = hm.data();
    hu.s1 = hv.data();
    zero::step_scalars s;
    REQUIRE(zero::kernels::update_shard(recording_launcher{}, ku, &s) == pk::launch_success);
    zero::detail::update_shard(hu, 1.0f);
    CHECK(std::memcmp(kw.data(), hw.data(), count * 4) == 0);
    CHECK(std::memcmp(km.data(), hm.data(), count * 4) == 0);
    CHECK(std::memcmp(kv.data(), hv.data(), count * 4) == 0);
  }
  zero::shard_update bad;
  bad.count = 4;
  bad.param_type = dtype::bfloat16;  // 16-bit parameters need master weights
  zero::step_scalars s;
  CHECK(zero::kernels::update_shard(recording_launcher{}, bad, &s) == pk::launch_invalid_value);
  bad.param_type = dtype::float32;
  bad.gradient_type = dtype::int8;
  CHECK(zero::kernels::update_shard(recording_launcher{}, bad, &s) == pk::launch_invalid_value);
}
