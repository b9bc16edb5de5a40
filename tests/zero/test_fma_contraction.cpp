// Compiled with -mfma (tests/zero/meson.build), where g++ contracts a product and a following
// sum into one fused multiply-add by default: the ZeRO kernels' host arithmetic
// (zero::detail::f_mul / f_add, zero/shard_update.hpp) must still round twice, as the GPU's
// __fmul_rn / __fadd_rn do, so that the host-run kernels (the step's update, the quantization
// kernels under host_launcher) keep the device's bits and the host stream's quantization loops'.
// Exit status 77 (skipped) on a processor without FMA.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ringzero/zero/quantize_kernels.hpp"
#include "ringzero/zero/shard_update.hpp"

using namespace ringzero;
using namespace ringzero::zero;

namespace {

int failures = 0;

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

void expect_same(float got, float want, const char* what) {
  if (bits(got) == bits(want)) return;
  ++failures;
  std::printf("FAIL: %s: %08x (%.9g), expected %08x (%.9g)\n", what, bits(got), static_cast<double>(got), bits(want),
              static_cast<double>(want));
}

/// `c + a * b` rounded twice: each operation through a volatile, which no optimiser contracts.
float rounded_twice(float a, float b, float c) {
  volatile float product = a * b;
  volatile float sum = c + product;
  return sum;
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("fma")) {
    std::printf("SKIP: this processor has no FMA\n");
    return 77;
  }
  // 0.1f * 10 rounds to exactly 1, so the twice-rounded sum is 0; a fused one keeps 0.1f's error.
  volatile float a = 0.1f, b = 10.0f, c = -1.0f;
  expect_same(zero::detail::f_add(c, zero::detail::f_mul(a, b)), rounded_twice(a, b, c), "f_add(-1, f_mul(0.1, 10))");

  // The quantization kernel's average (f_add of f_mul products) under host_launcher against the
  // host stream's loops, over random contributions, 3 ranks, own value in every position.
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::uint64_t count : {1u, 7u, 37u, 300u})
    for (std::uint32_t own = 0; own < 3; ++own) {
      const quantized_layout l{quantized_bits::int8, 8, count, 3};
      std::vector<float> contributions(3 * 3 * count);
      for (float& v : contributions) v = normal(gen);
      std::vector<unsigned char> recv(l.bytes()), wire(l.bytes());
      for (std::uint32_t r = 0; r < 3; ++r) {
        kernels::host_quantize_segments(l, &contributions[r * 3 * count], dtype::float32, wire.data());
        std::memcpy(&recv[r * l.segment_bytes()], &wire[own * l.segment_bytes()], l.segment_bytes());
      }
      std::vector<float> kernel(contributions.begin() + (own * 3 + own) * count,
                                contributions.begin() + (own * 3 + own + 1) * count);
      std::vector<float> loops = kernel;
      if (kernels::dequantize_segments(primitive::kernels::host_launcher{}, l, recv.data(), kernel.data(),
                                       dtype::float32, true, own, kernel.data()) != 0 ||
          kernels::host_dequantize_segments(l, recv.data(), loops.data(), dtype::float32, true, own, loops.data()) !=
              0) {
        ++failures;
        std::printf("FAIL: a dequantization was refused\n");
        continue;
      }
      for (std::uint64_t e = 0; e < count; ++e) expect_same(kernel[e], loops[e], "average: kernel against loops");
    }
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
