// The examples' GPU MLP (examples/common/cuda_mlp.hpp, cuda_optimizer.hpp, cuda_dataset.hpp)
// against the CPU MLP and optimizers it mirrors (mlp.hpp, optimizer.hpp): the same loss,
// accuracy count and gradients for the same parameters and batch, overwritten and accumulated,
// reported in the same order; the same parameters after SGD and AdamW steps; the batch gather
// exact. cuBLAS and Eigen sum in different orders and the GPU fuses multiply-adds, so values are
// compared with a tolerance relative to each tensor's largest magnitude (1e-4); counts, orders
// and gathered bytes exactly.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_buffer.hpp"
#include "cuda_dataset.hpp"
#include "cuda_mlp.hpp"
#include "cuda_optimizer.hpp"
#include "mlp.hpp"
#include "optimizer.hpp"

using namespace ringzero;
using namespace ringzero::examples;

namespace {

/// Reads `count` floats at device pointer `p` (synchronous).
std::vector<float> download(const float* p, std::size_t count) {
  std::vector<float> v(count);
  primitive::cudart::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  primitive::cudart::check(cudaMemcpy(v.data(), p, count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return v;
}

/// |got - want| <= tol * max(1, max |want|) element-wise; reports the first violation.
void check_close(const std::vector<float>& got, std::span<const float> want, double tol, const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.size() == want.size());
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double d = std::fabs(static_cast<double>(got[k]) - static_cast<double>(want[k]));
    if (!(d <= tol * scale)) {
      FAIL_CHECK(what << "[" << k << "]: got " << got[k] << ", want " << want[k] << " (scale " << scale << ")");
      return;
    }
  }
}

struct batch_data {
  std::vector<float> x;
  std::vector<std::uint8_t> y;
};

batch_data make_batch(int rows, int features, int classes, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> value(0.0f, 1.0f);
  batch_data b;
  b.x.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(features));
  for (float& v : b.x) v = value(gen);
  b.y.resize(static_cast<std::size_t>(rows));
  for (auto& l : b.y) l = static_cast<std::uint8_t>(gen() % static_cast<std::uint64_t>(classes));
  return b;
}

}  // namespace

TEST_CASE("cuda_mlp: loss, accuracy count and gradients as the CPU mlp, in the same order") {
  primitive::cudart::use_device(0);
  cudaStream_t stream = nullptr;
  primitive::cudart::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  for (const std::vector<int>& widths : {std::vector<int>{20, 16, 12, 10}, std::vector<int>{784, 256, 128, 10}})
    for (int batch : {1, 37, 256}) {
      CAPTURE(widths.front());
      CAPTURE(batch);
      mlp host(widths, 11);
      host.reserve(batch);
      cuda_mlp dev(host, stream);
      dev.reserve(batch);
      REQUIRE(dev.tensor_count() == host.tensor_count());
      const batch_data b = make_batch(batch, widths.front(), widths.back(), 5 + static_cast<std::uint64_t>(batch));
      device_array<float> x(b.x.size());
      device_array<std::uint8_t> y(b.y.size());
      device_array<double> sums(2);
      x.upload(b.x, stream);
      y.upload(b.y, stream);
      primitive::cudart::check(cudaMemsetAsync(sums.get(), 0, 2 * sizeof(double), stream), "cudaMemsetAsync");
      const float scale = 1.0f / static_cast<float>(batch);
      for (bool accumulate : {false, true}) {
        CAPTURE(accumulate);
        const float host_loss = host.forward(b.x.data(), b.y.data(), batch);
        const int host_correct = host.correct(b.y.data(), batch);
        std::vector<std::size_t> host_order, dev_order;
        host.backward(b.x.data(), b.y.data(), batch, scale, accumulate,
                      [&](std::size_t i) { host_order.push_back(i); });
        primitive::cudart::check(cudaMemsetAsync(sums.get(), 0, 2 * sizeof(double), stream), "cudaMemsetAsync");
        dev.forward(x.get(), y.get(), batch, sums.get());
        dev.backward(x.get(), y.get(), batch, scale, accumulate, [&](std::size_t i) { dev_order.push_back(i); });
        CHECK(dev_order == host_order);
        std::vector<double> s(2);
        primitive::cudart::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        primitive::cudart::check(cudaMemcpy(s.data(), sums.get(), 2 * sizeof(double), cudaMemcpyDeviceToHost),
                                 "cudaMemcpy");
        CHECK(s[0] / batch == doctest::Approx(host_loss).epsilon(1e-4));
        CHECK(s[1] == host_correct);
        for (std::size_t i = 0; i < host.tensor_count(); ++i)
          check_close(download(dev.gradient(i), dev.tensor(i).count), host.gradient(i), 1e-4, host.tensor(i).name);
      }
      // Bound gradients: backward writes where it is told.
      device_array<float> elsewhere(dev.tensor(0).count);
      dev.bind_gradient(0, elsewhere.get());
      CHECK(dev.gradient(0) == elsewhere.get());
      dev.forward(x.get(), y.get(), batch, sums.get());
      dev.backward(x.get(), y.get(), batch, scale, false, [](std::size_t) {});
      (void)host.forward(b.x.data(), b.y.data(), batch);
      host.backward(b.x.data(), b.y.data(), batch, scale, false, [](std::size_t) {});
      check_close(download(elsewhere.get(), elsewhere.size()), host.gradient(0), 1e-4, "bound fc1.weight");
      CHECK_THROWS_AS(dev.forward(x.get(), y.get(), batch + 1, sums.get()), error);
    }
  primitive::cudart::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST_CASE("cuda_optimizer: SGD and AdamW steps as the CPU optimizers") {
  primitive::cudart::use_device(0);
  cudaStream_t stream = nullptr;
  primitive::cudart::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  const std::size_t n = 1000;
  for (const char* name : {"sgd", "adamw"}) {
    CAPTURE(name);
    const float lr = std::string(name) == "sgd" ? 0.1f : 1e-3f;
    std::mt19937_64 gen(3);
    std::normal_distribution<float> value(0.0f, 1.0f);
    std::vector<float> p(n);
    for (float& v : p) v = value(gen);
    auto host = make_optimizer(name, n, lr);
    cuda_optimizer dev(name, n, lr, stream);
    device_array<float> dp(n), dg(n);
    dp.upload(p, stream);
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g(n);
      for (float& v : g) v = value(gen);
      dg.upload(g, stream);
      host->begin_step();
      dev.begin_step();
      // Two ranges, as the trainer updates tensor by tensor with state offsets.
      host->update(std::span<float>(p.data(), 300), std::span<const float>(g.data(), 300), 0);
      host->update(std::span<float>(p.data() + 300, n - 300), std::span<const float>(g.data() + 300, n - 300), 300);
      dev.update(dp.get(), dg.get(), 300, 0);
      dev.update(dp.get() + 300, dg.get() + 300, n - 300, 300);
      check_close(download(dp.get(), n), p, 1e-5, std::string(name) + " step " + std::to_string(step));
    }
    CHECK_THROWS_AS(dev.update(dp.get(), dg.get(), n, 1), error);
  }
  CHECK_THROWS_AS(cuda_optimizer("lamb", 4, 0.1f, stream), error);
  primitive::cudart::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST_CASE("cuda_dataset: a gathered batch holds exactly the listed rows") {
  primitive::cudart::use_device(0);
  cudaStream_t stream = nullptr;
  primitive::cudart::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  image_dataset data;
  data.count = 50;
  data.features = 7;
  data.images.resize(data.count * data.features);
  for (std::size_t k = 0; k < data.images.size(); ++k) data.images[k] = static_cast<float>(k) * 0.5f;
  data.labels.resize(data.count);
  for (std::size_t k = 0; k < data.count; ++k) data.labels[k] = static_cast<std::uint8_t>(k % 10);
  const cuda_dataset dev(data, stream);
  const std::vector<std::uint32_t> rows = {49, 0, 7, 7, 23};
  device_array<std::uint32_t> idx(rows.size());
  idx.upload(rows, stream);
  device_array<float> x(rows.size() * data.features);
  device_array<std::uint8_t> y(rows.size());
  dev.gather(idx.get(), static_cast<int>(rows.size()), x.get(), y.get(), stream);
  const std::vector<float> got = download(x.get(), x.size());
  std::vector<std::uint8_t> labels(rows.size());
  primitive::cudart::check(cudaMemcpy(labels.data(), y.get(), labels.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    CHECK(labels[r] == data.labels[rows[r]]);
    for (std::size_t c = 0; c < data.features; ++c)
      CHECK(got[r * data.features + c] == data.images[rows[r] * data.features + c]);
  }
  primitive::cudart::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}
