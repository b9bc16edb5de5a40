// The cuda-on-host suite's census: every kernel body in the tree (a `kernel_name` under
// include/, examples/, bench/, cuda/, src/, tools/) has run on the host in this process, and the
// tree's only __global__ function is block_kernel (primitive/cuda_launch.cuh), which runs the
// bodies on a GPU: a kernel written any other way would be one CI cannot run. The case runs
// every entry point once itself, so it stands alone under a filter.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mlp_kernel_bodies.hpp"
#include "recording_launcher.hpp"
#include "ringzero/primitive/kernels/cast.hpp"
#include "ringzero/primitive/kernels/fill.hpp"
#include "ringzero/primitive/kernels/reduce_into.hpp"
#include "ringzero/primitive/kernels/scale.hpp"
#include "ringzero/zero/quantize_kernels.hpp"
#include "ringzero/zero/step_kernels.hpp"

#ifndef RINGZERO_SOURCE_ROOT
#error "the build passes RINGZERO_SOURCE_ROOT (the checkout, which is scanned for kernels)"
#endif

using namespace ringzero;
namespace pk = primitive::kernels;
namespace mk = examples::mlp_kernels;
using ringzero_test::kernels_run;
using ringzero_test::recording_launcher;

TEST_CASE("every kernel in the tree has run on the host, and every CUDA kernel is a body") {
  // Run each entry point once, so that this case stands on its own under a filter.
  const recording_launcher l;
  float f[8] = {};
  double partials[zero::sum_of_squares_partials] = {}, sum = 0;
  primitive::reduce_spec plain_sum;
  plain_sum.type = dtype::float32;
  plain_sum.kind = reduce_kind::sum;
  CHECK(pk::reduce_into(l, f, f, f, 8, plain_sum) == 0);
  CHECK(pk::cast(l, f, dtype::float16, f, dtype::float32, 8) == 0);
  CHECK(pk::fill(l, f, 8, dtype::float32, 1.0) == 0);
  CHECK(zero::kernels::add_sum_of_squares(l, &sum, f, 8, dtype::float32, partials) == 0);
  zero::step_scalars s;
  CHECK(zero::kernels::decide_step(l, &s, 0.0, true) == 0);
  zero::shard_update u;
  u.params = f;
  u.grads = f;
  u.count = 8;
  CHECK(zero::kernels::update_shard(l, u, &s) == 0);
  const zero::quantized_layout q{zero::quantized_bits::int8, 8, 8, 1};
  unsigned char wire[16] = {};
  CHECK(zero::kernels::quantize_segments(l, q, f, dtype::float32, wire) == 0);
  CHECK(zero::kernels::dequantize_segments(l, q, wire, f, dtype::float32) == 0);
  float x[8] = {}, w[8] = {}, m[8] = {}, v[8] = {}, loss[2] = {};
  std::uint8_t y[2] = {}, labels[2] = {};
  std::uint32_t indices[2] = {};
  int correct[2] = {};
  double sums[2] = {};
  CHECK(mk::gather_rows(l, x, y, f, labels, indices, 2, 4) == 0);
  CHECK(mk::add_bias(l, x, f, 2, 4, true) == 0);
  CHECK(mk::softmax_cross_entropy(l, x, y, loss, correct, 2, 4) == 0);
  CHECK(mk::softmax_cross_entropy_backward(l, w, x, y, 2, 4, 0.5f) == 0);
  CHECK(mk::relu_backward(l, w, x, 8) == 0);
  CHECK(mk::accumulate_metrics(l, sums, loss, correct, 2) == 0);
  CHECK(mk::fill(l, w, 1.0f, 8) == 0);
  CHECK(mk::sgd_update(l, w, f, m, 8, 0.1f, 0.9f, 0.0f, false) == 0);
  CHECK(mk::adamw_update(l, w, f, m, v, 8, 0.1f, 0.0f, 0.9f, 0.99f, 1e-8f, 0.1f, 0.1f) == 0);

  const std::string root = RINGZERO_SOURCE_ROOT;
  std::set<std::string> declared;
  int global_kernels = 0;
  const std::regex name_re(R"re(kernel_name\s*=\s*"(\w+)")re");
  const std::regex global_re(R"(__global__)");
  std::vector<std::string> files;
  for (const char* dir : {"include", "examples", "bench", "cuda", "src", "tools"}) {
    if (!std::filesystem::is_directory(root + "/" + dir)) continue;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root + "/" + dir)) {
      const auto ext = entry.path().extension().string();
      if (entry.is_regular_file() && (ext == ".hpp" || ext == ".cpp" || ext == ".cu" || ext == ".cuh" || ext == ".h"))
        files.push_back(entry.path().string());
    }
  }
  REQUIRE(files.size() > 100);
  for (const auto& path : files) {
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (std::sregex_iterator it(text.begin(), text.end(), name_re), end; it != end; ++it) declared.insert((*it)[1]);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      const auto code = line.substr(0, line.find("//"));
      if (std::regex_search(code, global_re)) {
        ++global_kernels;
        CHECK_MESSAGE(path.find("primitive/cuda_launch.cuh") != std::string::npos,
                      "a __global__ function outside primitive/cuda_launch.cuh (a kernel CI cannot run): "
                          << path << ": " << line);
      }
    }
  }
  CHECK(global_kernels == 1);    // block_kernel, which runs the bodies
  CHECK(declared.size() >= 16);  // 7 in include/, 9 in examples/common
  for (const auto& name : declared) CHECK_MESSAGE(kernels_run().count(name) == 1, "kernel with no host run: " << name);
}
