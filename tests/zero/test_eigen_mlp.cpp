// How a trainer that owns an MLP with Eigen matrices adopts the ZeRO runtime: its weights and
// gradients become Eigen::Map views of the runtime's storage, and one loop serves every stage.
// Stages 1-3 must train to the parameters stage 0 (plain data parallelism) reaches.
#include <doctest/doctest.h>

#include <Eigen/Dense>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ringzero/ringzero.hpp"
#include "ringzero/zero/sharded_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;

namespace {

using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using matrix_map = Eigen::Map<matrix>;
using vector_map = Eigen::Map<Eigen::VectorXf>;

/// A tanh MLP whose layer i is one gather unit ("layer<i>") with "layer<i>.weight" [out, in]
/// (row-major) and "layer<i>.bias" [out].
struct mlp {
  std::vector<int> widths;

  std::vector<parameter_spec> parameters() const {
    std::vector<parameter_spec> p;
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      const std::string unit = std::string("layer").append(std::to_string(i));
      parameter_spec w, b;
      w.name = unit + ".weight";
      w.shape = {static_cast<std::uint64_t>(widths[i + 1]), static_cast<std::uint64_t>(widths[i])};
      w.unit = unit;
      b.name = unit + ".bias";
      b.shape = {static_cast<std::uint64_t>(widths[i + 1])};
      b.unit = unit;
      p.push_back(w);
      p.push_back(b);
    }
    return p;
  }

  /// One micro-batch: forward, mean squared error, backward into the runtime's gradients.
  float train_micro_batch(sharded_model& model, const matrix& x, const matrix& target) const {
    const std::size_t layers = widths.size() - 1;
    std::vector<matrix> activations{x};  // activations[i]: input of layer i, [width, batch]
    for (std::size_t u = 0; u < layers; ++u) {
      model.pre_forward(u);
      auto w = model.parameter<float>(2 * u), b = model.parameter<float>(2 * u + 1);
      const matrix_map W(w.data(), widths[u + 1], widths[u]);
      const vector_map B(b.data(), widths[u + 1]);
      matrix z = (W * activations.back()).colwise() + B;
      if (u + 1 < layers) z = z.array().tanh().matrix();
      activations.push_back(std::move(z));
      model.post_forward(u);
    }
    const float batch = static_cast<float>(x.cols());
    matrix delta = (activations.back() - target) / batch;
    const float loss = 0.5f * (activations.back() - target).squaredNorm() / batch;
    for (std::size_t u = layers; u-- > 0;) {
      model.pre_backward(u);
      if (u + 1 < layers) delta = (delta.array() * (1.0f - activations[u + 1].array().square())).matrix();
      auto gw = model.gradient<float>(2 * u), gb = model.gradient<float>(2 * u + 1);
      matrix_map(gw.data(), widths[u + 1], widths[u]) += delta * activations[u].transpose();
      vector_map(gb.data(), widths[u + 1]) += delta.rowwise().sum();
      if (u > 0) {
        auto w = model.parameter<float>(2 * u);
        delta = matrix_map(w.data(), widths[u + 1], widths[u]).transpose() * delta;
      }
      model.post_backward(u);
    }
    model.end_backward();
    return loss;
  }
};

matrix data(int rows, int cols, int seed) {
  matrix m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      m(i, j) = std::sin(0.37f * static_cast<float>(i * cols + j) + 1.3f * static_cast<float>(seed));
  return m;
}

std::vector<std::vector<float>> train(int world, int stage, std::vector<float>& losses) {
  const mlp net{{12, 33, 33, 33, 5}};  // 4 units of uneven sizes
  std::vector<std::vector<float>> result;
  losses.assign(5, 0.0f);
  local::launch(world, [&](communicator& comm) {
    plan_request q;
    q.parameters = net.parameters();
    q.stage = stage;
    q.accumulation_steps = 2;
    sharded_model_options options;
    options.optimizer.kind = optimizer_kind::adamw;
    options.optimizer.lr = 0.01;
    options.optimizer.weight_decay = 0.01;
    options.max_grad_norm = 1.0;
    sharded_model model(comm, q, options);
    for (std::size_t p = 0; p < model.parameter_count(); ++p) {  // the same initialisation on every rank
      std::vector<float> v(model.plan().placements()[p].numel);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = 0.3f * std::cos(static_cast<float>(7 * p + 3 * j));
      model.set_parameter(p, v);
    }
    for (int step = 0; step < 5; ++step) {
      float loss = 0;
      for (int micro = 0; micro < 2; ++micro) {
        const int seed = (step * 2 + micro) * 16 + comm.rank();
        loss += net.train_micro_batch(model, data(12, 8, seed), data(5, 8, seed + 1000));
      }
      model.step();
      if (comm.rank() == 0) losses[static_cast<std::size_t>(step)] = loss;
    }
    std::vector<std::vector<float>> out(model.parameter_count());
    for (std::size_t p = 0; p < out.size(); ++p) {
      out[p].resize(model.plan().placements()[p].numel);
      model.read_parameter(p, out[p]);
    }
    if (comm.rank() == 0) result = std::move(out);
  });
  return result;
}

}  // namespace

TEST_CASE("an Eigen MLP trains to the same parameters at stages 1-3 as at stage 0") {
  for (int world : {2, 3}) {
    std::vector<float> reference_losses;
    const auto reference = train(world, 0, reference_losses);
    CHECK(reference_losses.back() < reference_losses.front());  // it learns
    for (int stage = 1; stage <= 3; ++stage) {
      std::vector<float> losses;
      const auto got = train(world, stage, losses);
      double worst = 0;
      for (std::size_t p = 0; p < got.size(); ++p)
        for (std::size_t j = 0; j < got[p].size(); ++j)
          worst = std::max(worst, std::fabs(static_cast<double>(got[p][j]) - reference[p][j]) /
                                      std::max(1.0, std::fabs(static_cast<double>(reference[p][j]))));
      CAPTURE(world);
      CAPTURE(stage);
      CHECK(worst <= 1e-5);
    }
  }
}
