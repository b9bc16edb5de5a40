// primitive::sum_broadcast_streaming (the direct all_reduce's fused loop) against the chained
// reduce_into it replaces, bit for bit: random finite floats (so the order of the partial sums
// matters), 2-5 inputs, 1-5 outputs, every head alignment, counts around the 64-byte step, in
// place and out of place; and the cases where it must decline (other dtypes, outputs that
// cannot be aligned together).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ringzero/primitive/copy.hpp"
#include "ringzero/primitive/reduce.hpp"
#include "ringzero/primitive/sum_broadcast.hpp"

using namespace ringzero;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> d(-1e6, 1e6);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(d(gen)) / static_cast<T>(1 + gen() % 1000);
  return v;
}

template <class T>
void check_type(dtype t) {
  for (int n_in = 2; n_in <= 5; ++n_in)
    for (int n_out = 1; n_out <= 5; n_out += 2)
      for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{3}, std::uint64_t{17},
                                  std::uint64_t{1000}, std::uint64_t{100003}})
        for (std::size_t shift = 0; shift < 16 / sizeof(T); ++shift)
          for (bool in_place : {false, true}) {
            CAPTURE(n_in);
            CAPTURE(n_out);
            CAPTURE(count);
            CAPTURE(shift);
            CAPTURE(in_place);
            const std::size_t len = static_cast<std::size_t>(count) + 16;
            std::vector<std::vector<T>> in(static_cast<std::size_t>(n_in)), out(static_cast<std::size_t>(n_out));
            for (int q = 0; q < n_in; ++q)
              in[static_cast<std::size_t>(q)] = random_values<T>(len, 100 * count + static_cast<std::uint64_t>(q));
            for (auto& o : out) o.assign(len, T(-7));
            // The reference: ((in0 + in1) + in2) + ... through reduce_into.
            std::vector<T> want(static_cast<std::size_t>(count));
            primitive::reduce_spec s;
            s.type = t;
            if (count > 0) {
              primitive::reduce_into(want.data(), in[0].data() + shift, in[1].data() + shift, count, s);
              for (int q = 2; q < n_in; ++q)
                primitive::reduce_into(want.data(), want.data(), in[static_cast<std::size_t>(q)].data() + shift, count,
                                       s);
            }
            std::vector<void*> outs;
            std::vector<const void*> ins;
            for (int q = 0; q < n_in; ++q) ins.push_back(in[static_cast<std::size_t>(q)].data() + shift);
            for (int k = 0; k < n_out; ++k) {
              // in place: output k is input k (where one exists); otherwise its own buffer
              T* o = in_place && k < n_in ? in[static_cast<std::size_t>(k)].data() + shift
                                          : out[static_cast<std::size_t>(k)].data() + shift;
              outs.push_back(o);
            }
            REQUIRE(primitive::sum_broadcast_streaming(outs.data(), n_out, ins.data(), n_in, count, t));
            primitive::store_fence();
            for (int k = 0; k < n_out; ++k) {
              const T* o = static_cast<const T*>(outs[static_cast<std::size_t>(k)]);
              if (count > 0) REQUIRE(std::memcmp(o, want.data(), static_cast<std::size_t>(count) * sizeof(T)) == 0);
              if (!(in_place && k < n_in)) {
                // nothing written outside [0, count)
                const auto& buf = out[static_cast<std::size_t>(k)];
                for (std::size_t i = 0; i < shift; ++i) REQUIRE(buf[i] == T(-7));
                for (std::size_t i = shift + static_cast<std::size_t>(count); i < len; ++i) REQUIRE(buf[i] == T(-7));
              }
            }
          }
}

}  // namespace

TEST_CASE("sum_broadcast_streaming gives the chained reduce_into's bits for float32 and float64") {
#if RINGZERO_X86_64
  check_type<float>(dtype::float32);
  check_type<double>(dtype::float64);
#else
  MESSAGE("not x86-64: no fused form, checked below that it declines");
#endif
}

TEST_CASE("sum_broadcast_streaming declines what it has no fused form for, writing nothing") {
  std::vector<float> a(64, 1.0f), b(64, 2.0f), o1(64, 0.0f), o2(64, 0.0f);
  const void* ins[2] = {a.data(), b.data()};
  void* outs_int[1] = {o1.data()};
  CHECK_FALSE(primitive::sum_broadcast_streaming(outs_int, 1, ins, 2, 64, dtype::int32));
  CHECK_FALSE(primitive::sum_broadcast_streaming(outs_int, 1, ins, 2, 64, dtype::bfloat16));
  CHECK_FALSE(primitive::sum_broadcast_streaming(outs_int, 1, ins, 1, 64, dtype::float32));  // one input
  CHECK_FALSE(primitive::sum_broadcast_streaming(outs_int, 0, ins, 2, 64, dtype::float32));  // no output
  // two outputs whose addresses differ by 4 bytes modulo 16: no common aligned body
  void* outs_skewed[2] = {o1.data(), o2.data() + 1};
  if (reinterpret_cast<std::uintptr_t>(o1.data()) % 16 == reinterpret_cast<std::uintptr_t>(o2.data()) % 16)
    CHECK_FALSE(primitive::sum_broadcast_streaming(outs_skewed, 2, ins, 2, 64, dtype::float32));
  for (float x : o1) CHECK(x == 0.0f);
  for (float x : o2) CHECK(x == 0.0f);
}
