// The examples' GPU MLP kernels (examples/common/mlp_kernel_bodies.hpp) run on the host by
// host_launcher, each against a plain loop over its contract (cuda_mlp_kernels.hpp), exactly:
// the same float operations in the same order on the same machine. Sizes that leave a partial
// last block, several blocks, and one block striding over many rows.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mlp_kernel_bodies.hpp"
#include "recording_launcher.hpp"

namespace mk = ringzero::examples::mlp_kernels;
using ringzero_test::launchers;

namespace {

std::vector<float> normals(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the MLP's element and row kernels on the host follow their contracts exactly") {
  for (const auto& l : launchers()) {
    for (const int rows : {1, 3, 257, 1000}) {
      const int features = 13, classes = 10;
      INFO("rows " << rows << (l.reverse ? ", reversed" : ""));
      // gather_rows
      const int dataset = 50;
      const auto images = normals(static_cast<std::size_t>(dataset) * features, 1);
      std::vector<std::uint8_t> labels(dataset);
      for (int i = 0; i < dataset; ++i) labels[i] = static_cast<std::uint8_t>((i * 7) % classes);
      std::vector<std::uint32_t> indices(rows);
      for (int r = 0; r < rows; ++r) indices[r] = static_cast<std::uint32_t>((r * 31 + 5) % dataset);
      std::vector<float> x(static_cast<std::size_t>(rows) * features, -1.0f);
      std::vector<std::uint8_t> y(rows, 255);
      REQUIRE(mk::gather_rows(l, x.data(), y.data(), images.data(), labels.data(), indices.data(), rows, features) ==
              0);
      for (int r = 0; r < rows; ++r) {
        CHECK(y[r] == labels[indices[r]]);
        CHECK(std::memcmp(&x[static_cast<std::size_t>(r) * features], &images[indices[r] * features],
                          features * sizeof(float)) == 0);
      }
      // add_bias, with and without the ReLU
      const auto bias = normals(classes, 2);
      for (const bool relu : {false, true}) {
        auto z = normals(static_cast<std::size_t>(rows) * classes, 3), want = z;
        for (std::size_t i = 0; i < want.size(); ++i) {
          const float v = want[i] + bias[i % classes];
          want[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
        }
        REQUIRE(mk::add_bias(l, z.data(), bias.data(), rows, classes, relu) == 0);
        CHECK(same(z, want));
      }
      // softmax_cross_entropy and its backward
      std::vector<std::uint8_t> target(rows);
      for (int r = 0; r < rows; ++r) target[r] = static_cast<std::uint8_t>((r * 3) % classes);
      auto z = normals(static_cast<std::size_t>(rows) * classes, 4), p = z;
      std::vector<float> loss(rows), want_loss(rows);
      std::vector<int> correct(rows, -1), want_correct(rows);
      for (int r = 0; r < rows; ++r) {
        float* row = &p[static_cast<std::size_t>(r) * classes];
        float m = row[0];
        int best = 0;
        for (int c = 1; c < classes; ++c)
          if (row[c] > m) {
            m = row[c];
            best = c;
          }
        const float shifted = row[target[r]] - m;
        float s = 0.0f;
        for (int c = 0; c < classes; ++c) s += (row[c] = expf(row[c] - m));
        want_loss[r] = logf(s) - shifted;
        want_correct[r] = best == target[r] ? 1 : 0;
        for (int c = 0; c < classes; ++c) row[c] *= 1.0f / s;
      }
      REQUIRE(mk::softmax_cross_entropy(l, z.data(), target.data(), loss.data(), correct.data(), rows, classes) == 0);
      CHECK(same(z, p));
      CHECK(same(loss, want_loss));
      CHECK(correct == want_correct);
      std::vector<float> dz(z.size(), 9.0f), want_dz(z.size());
      const float scale = 1.0f / static_cast<float>(rows);
      for (std::size_t i = 0; i < z.size(); ++i)
        want_dz[i] = scale * p[i] - (static_cast<int>(i % classes) == target[i / classes] ? scale : 0.0f);
      REQUIRE(mk::softmax_cross_entropy_backward(l, dz.data(), p.data(), target.data(), rows, classes, scale) == 0);
      CHECK(same(dz, want_dz));
      // relu_backward
      auto d = normals(z.size(), 5), a = normals(z.size(), 6), want_d = d;
      for (std::size_t i = 0; i < d.size(); ++i)
        if (!(a[i] > 0.0f)) want_d[i] = 0.0f;
      REQUIRE(mk::relu_backward(l, d.data(), a.data(), static_cast<std::int64_t>(d.size())) == 0);
      CHECK(same(d, want_d));
      // accumulate_metrics: small integers in the losses, so any order of the sum is exact
      for (int r = 0; r < rows; ++r) loss[r] = static_cast<float>(r % 17);
      double sums[2] = {1.5, 2.0}, want_sums[2] = {1.5, 2.0};
      for (int r = 0; r < rows; ++r) {
        want_sums[0] += loss[r];
        want_sums[1] += correct[r];
      }
      REQUIRE(mk::accumulate_metrics(l, sums, loss.data(), correct.data(), rows) == 0);
      CHECK(sums[0] == want_sums[0]);
      CHECK(sums[1] == want_sums[1]);
      // fill
      std::vector<float> f(static_cast<std::size_t>(rows) * 3 + 1, 0.0f);
      REQUIRE(mk::fill(l, f.data(), 2.5f, static_cast<std::int64_t>(f.size()) - 1) == 0);
      for (std::size_t i = 0; i + 1 < f.size(); ++i) CHECK(f[i] == 2.5f);
      CHECK(f.back() == 0.0f);
    }
  }
}

TEST_CASE("the MLP's optimizer kernels on the host follow torch.optim's SGD and AdamW exactly") {
  for (const auto& l : launchers()) {
    for (const std::int64_t count : {std::int64_t{1}, std::int64_t{300}, std::int64_t{70000}}) {
      const auto n = static_cast<std::size_t>(count);
      const auto g = normals(n, 7);
      for (const bool nesterov : {false, true}) {
        auto p = normals(n, 8), buf = normals(n, 9), wp = p, wbuf = buf;
        const float lr = 0.05f, momentum = 0.9f, wd = 1e-4f;
        for (std::size_t i = 0; i < n; ++i) {
          const float grad = g[i] + wd * wp[i];
          const float m = momentum * wbuf[i] + grad;
          wbuf[i] = m;
          wp[i] -= lr * (nesterov ? grad + momentum * m : m);
        }
        REQUIRE(mk::sgd_update(l, p.data(), g.data(), buf.data(), count, lr, momentum, wd, nesterov) == 0);
        CHECK(same(p, wp));
        CHECK(same(buf, wbuf));
      }
      auto p = normals(n, 10), m = normals(n, 11), v = normals(n, 12);
      for (auto& x : v) x = x * x;
      auto wp = p, wm = m, wv = v;
      const float lr = 1e-3f, wd = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, bias1 = 0.19f, bias2_sqrt = 0.0447f;
      const float step = lr / bias1, decay = 1.0f - lr * wd;
      for (std::size_t i = 0; i < n; ++i) {
        const float mi = b1 * wm[i] + (1.0f - b1) * g[i];
        const float vi = b2 * wv[i] + (1.0f - b2) * g[i] * g[i];
        wm[i] = mi;
        wv[i] = vi;
        wp[i] = wp[i] * decay - step * mi / (sqrtf(vi) / bias2_sqrt + eps);
      }
      REQUIRE(mk::adamw_update(l, p.data(), g.data(), m.data(), v.data(), count, lr, wd, b1, b2, eps, bias1,
                               bias2_sqrt) == 0);
      CHECK(same(p, wp));
      CHECK(same(m, wm));
      CHECK(same(v, wv));
    }
  }
}
