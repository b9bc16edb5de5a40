// The libtorch bridge (integration/torch_ddp.hpp, integration/torch_sync_batch_norm.hpp): bucket
// views and hooks give the 1-rank average bitwise, accumulation, buckets launched during
// backward, SyncBatchNorm (case C23 exactly, forward and backward against libtorch's batch_norm
// on the whole batch), the bad inputs of issue 20 (errors naming the parameter, no hang), and
// frozen parameters (broadcast, never reduced; ranks that freeze differently are named).
// libtorch's headers bring glog's CHECK macro, so doctest's is spelled DOCTEST_CHECK here.
#include <doctest/doctest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/backend/local/launch.hpp"
#include "ringzero/ddp/allreduce_hook.hpp"
#include "ringzero/ddp/powersgd_hook.hpp"
#include "ringzero/integration/torch_ddp.hpp"

namespace rz = ringzero;

namespace {

// Two linear layers without activation; weights are small integers set from `seed`, so every
// gradient of a sum loss over integer inputs is an integer (exact in float32 in any order).
struct two_layers : torch::nn::Module {
  explicit two_layers(int seed) {
    first = register_module("first", torch::nn::Linear(6, 4));
    second = register_module("second", torch::nn::Linear(4, 3));
    torch::NoGradGuard no_grad;
    int k = seed;
    for (auto& p : parameters())
      for (std::int64_t i = 0; i < p.numel(); ++i) p.view(-1)[i] = static_cast<float>((k++ * 7) % 5 - 2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return second->forward(first->forward(x)); }
  torch::nn::Linear first{nullptr}, second{nullptr};
};

// Integer inputs of rank `rank`'s micro-batch `step` (3 rows), and the integer loss weights.
torch::Tensor batch(int rank, int step) {
  return (torch::arange(18, torch::kFloat32).view({3, 6}) * (rank + 2) + step * 3).remainder(7) - 3;
}
torch::Tensor loss_of(const torch::Tensor& out) { return (out * torch::tensor({1.0f, -2.0f, 3.0f})).sum(); }

// The gradients of a fresh rank-0 model for `rank`'s batches `steps` (summed), one tensor per parameter.
std::vector<torch::Tensor> local_gradients(int rank, std::vector<int> steps) {
  two_layers m(0);
  for (int s : steps) loss_of(m.forward(batch(rank, s))).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}

// Counts bucket launches (the reducer calls `launch` when a bucket's gradients are all ready).
struct counting_hook : rz::ddp::comm_hook {
  rz::ddp::allreduce_hook average;
  std::atomic<int> launches{0};
  std::string name() const override { return "counting"; }
  rz::work launch(rz::communicator& comm, const rz::ddp::gradient_bucket& b) override {
    ++launches;
    return average.launch(comm, b);
  }
  void complete(const rz::ddp::gradient_bucket& b) override { average.complete(b); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) { return e.what(); }
  return "";
}

// The kind of the ringzero::error `f` raised (none when it raised none, or something else).
std::optional<rz::errc> kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rz::error& e) { return e.kind(); } catch (...) {
  }
  return std::nullopt;
}

// two_layers with a frozen layer between them: first (6 -> 4), middle (4 -> 4, frozen), last
// (4 -> 3). Backward goes through the frozen weights to `first`. Small integer weights from `seed`.
struct frozen_middle : torch::nn::Module {
  explicit frozen_middle(int seed) {
    first = register_module("first", torch::nn::Linear(6, 4));
    middle = register_module("middle", torch::nn::Linear(4, 4));
    last = register_module("last", torch::nn::Linear(4, 3));
    torch::NoGradGuard no_grad;
    int k = seed;
    for (auto& p : parameters())
      for (std::int64_t i = 0; i < p.numel(); ++i) p.view(-1)[i] = static_cast<float>((k++ * 7) % 5 - 2);
    for (auto& p : middle->parameters()) p.requires_grad_(false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return last->forward(middle->forward(first->forward(x))); }
  torch::nn::Linear first{nullptr}, middle{nullptr}, last{nullptr};
};

}  // namespace

TEST_CASE(
    "torch_ddp: 2 ranks give the 1-rank average of the gradients bitwise, in bucket views, launched during "
    "backward") {
  torch::set_num_threads(1);
  std::vector<std::vector<std::vector<torch::Tensor>>> got(2);  // [rank][step][parameter]
  std::vector<int> launched_before_last(2, -1), copies(2, -1), buckets(2, 0), views_ok(2, 0);
  rz::local::launch(2, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    const int r = comm.rank();
    two_layers model(r);  // rank 1 starts from other weights: the broadcast makes them rank 0's
    rz::integration::torch_ddp_options opt;
    opt.reducer.bucket_byte_limits = {1};  // one parameter per bucket: 4 buckets
    auto hook = std::make_shared<counting_hook>();
    opt.reducer.hook = hook;
    rz::integration::torch_ddp ddp(comm, model, opt);
    buckets[r] = static_cast<int>(ddp.reducer().bucket_count());
    // first.weight is the last gradient backward produces: by then the other buckets are out.
    model.first->weight.register_hook([&, r](torch::Tensor g) {
      if (launched_before_last[r] < 0) launched_before_last[r] = hook->launches.load();
      return g;
    });
    for (int step = 0; step < 3; ++step) {  // step 0 rebuilds the buckets, so views move once
      ddp.zero_grad();
      loss_of(model.forward(batch(r, step))).backward();
      ddp.finish();
      std::vector<torch::Tensor> g;
      for (auto& p : model.parameters()) g.push_back(p.grad().clone());
      got[r].push_back(g);
    }
    {  // accumulation: steps 3 and 4 summed, then averaged
      ddp.zero_grad();
      {
        auto guard = ddp.no_sync();
        loss_of(model.forward(batch(r, 3))).backward();
        ddp.finish();
      }
      loss_of(model.forward(batch(r, 4))).backward();
      ddp.finish();
      std::vector<torch::Tensor> g;
      for (auto& p : model.parameters()) g.push_back(p.grad().clone());
      got[r].push_back(g);
    }
    int ok = 1;
    for (std::size_t i = 0; i < ddp.parameter_count(); ++i)
      ok &= model.parameters()[i].grad().data_ptr() == ddp.reducer().gradient(i) ? 1 : 0;
    views_ok[r] = ok;
    copies[r] = static_cast<int>(ddp.gradient_copies());
  });
  const std::vector<std::vector<int>> steps = {{0}, {1}, {2}, {3, 4}};
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const auto g0 = local_gradients(0, steps[s]), g1 = local_gradients(1, steps[s]);
    for (int r = 0; r < 2; ++r)
      for (std::size_t i = 0; i < g0.size(); ++i) {
        CAPTURE(s);
        CAPTURE(i);
        DOCTEST_CHECK(torch::equal(got[r][s][i], (g0[i] + g1[i]) / 2));
      }
  }
  for (int r = 0; r < 2; ++r) {
    DOCTEST_CHECK(buckets[r] == 4);
    DOCTEST_CHECK(launched_before_last[r] >= 1);
    DOCTEST_CHECK(copies[r] == 0);
    DOCTEST_CHECK(views_ok[r] == 1);
  }
}

TEST_CASE("torch_ddp: hooks see every tensor's sizes, so PowerSGD compresses the weights as matrices") {
  // first.weight [4, 6]: (4 + 6) * 1 * 2 < 24, compressed; second.weight [3, 4]: (3 + 4) * 2 > 12, not.
  torch::set_num_threads(1);
  std::vector<rz::ddp::powersgd_traffic> traffic(4);
  std::vector<std::vector<torch::Tensor>> grads(2);
  rz::local::launch(2, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    const int r = comm.rank();
    two_layers model(r);
    rz::integration::torch_ddp_options opt;
    rz::ddp::powersgd_options p;
    p.start_iteration = 0;
    auto hook = std::make_shared<rz::ddp::powersgd_hook>(p);
    opt.reducer.hook = hook;
    rz::integration::torch_ddp ddp(comm, model, opt);
    for (int step = 0; step < 2; ++step) {
      ddp.zero_grad();
      loss_of(model.forward(batch(r, step))).backward();
      ddp.finish();
    }
    for (auto& t : model.parameters()) grads[static_cast<std::size_t>(r)].push_back(t.grad().clone());
    if (r == 0)
      for (std::size_t i = 0; i < 4; ++i) traffic[i] = hook->traffic(i);
  });
  DOCTEST_CHECK(traffic[0].compressed);
  DOCTEST_CHECK(traffic[0].rows == 4);
  DOCTEST_CHECK(traffic[0].columns == 6);
  DOCTEST_CHECK(traffic[0].sent == 10);
  DOCTEST_CHECK(!traffic[1].compressed);  // a bias: no shape beyond one dimension
  DOCTEST_CHECK(traffic[1].rows == 0);
  DOCTEST_CHECK(!traffic[2].compressed);
  DOCTEST_CHECK(traffic[2].rows == 3);
  DOCTEST_CHECK(traffic[2].sent == 12);
  for (std::size_t i = 0; i < 4; ++i) DOCTEST_CHECK(torch::equal(grads[0][i], grads[1][i]));  // same bits
}

TEST_CASE("torch_ddp: parameters and buffers are broadcast from rank 0; a .grad() reset to none is copied in") {
  std::vector<float> weight(2), mean(2);
  std::vector<int> copies(2);
  std::vector<int> view_ok(2);
  rz::local::launch(2, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    const int r = comm.rank();
    torch::nn::Sequential model(torch::nn::Linear(2, 2), rz::integration::sync_batch_norm(&comm, 2));
    {
      torch::NoGradGuard no_grad;
      model->parameters()[0].fill_(static_cast<float>(r + 1));
      model->named_buffers()["1.running_mean"].fill_(static_cast<float>(10 * (r + 1)));
    }
    rz::integration::torch_ddp ddp(comm, *model);
    weight[r] = model->parameters()[0][0][0].item<float>();
    mean[r] = model->named_buffers()["1.running_mean"][0].item<float>();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();  // as zero_grad(set_to_none)
    const torch::Tensor x = torch::tensor({{1.0f, 2.0f}, {3.0f, 5.0f}}) * (r + 1);
    model->forward(x).pow(2).sum().backward();
    ddp.finish();
    copies[r] = static_cast<int>(ddp.gradient_copies());
    view_ok[r] = model->parameters()[0].grad().data_ptr() == ddp.reducer().gradient(0) ? 1 : 0;
  });
  for (int r = 0; r < 2; ++r) {
    DOCTEST_CHECK(weight[r] == 1.0f);
    DOCTEST_CHECK(mean[r] == 10.0f);
    DOCTEST_CHECK(copies[r] == 4);  // linear weight, bias, batch-norm weight, bias
    DOCTEST_CHECK(view_ok[r] == 1);
  }
}

TEST_CASE("torch_ddp: a libtorch optimizer's zero_grad keeps the bucket views (no copies)") {
  std::vector<int> copies(2, -1), views_ok(2, 0);
  std::vector<torch::Tensor> weights(2);
  rz::local::launch(2, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    two_layers model(comm.rank());
    rz::integration::torch_ddp ddp(comm, model);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.5));
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      loss_of(model.forward(batch(comm.rank(), step))).backward();
      ddp.finish();
      optimizer.step();
    }
    int ok = 1;
    for (std::size_t i = 0; i < ddp.parameter_count(); ++i)
      ok &= model.parameters()[i].grad().data_ptr() == ddp.reducer().gradient(i) ? 1 : 0;
    views_ok[comm.rank()] = ok;
    copies[comm.rank()] = static_cast<int>(ddp.gradient_copies());
    weights[comm.rank()] = model.first->weight.detach().clone();
  });
  for (int r = 0; r < 2; ++r) {
    DOCTEST_CHECK(copies[r] == 0);
    DOCTEST_CHECK(views_ok[r] == 1);
  }
  DOCTEST_CHECK(torch::equal(weights[0], weights[1]));  // the same averaged step on both ranks
}

TEST_CASE(
    "sync_batch_norm: case C23 (rank 0 holds 1, 3; rank 1 holds 2, 4, 6, 8): mean 4, biased var 34/6, running "
    "var 34/5") {
  std::vector<float> mean(2), var(2), running_mean(2), running_var(2);
  std::vector<std::int64_t> count(2);
  std::vector<torch::Tensor> y(2), dx(2), dw(2), db(2);
  const std::vector<torch::Tensor> inputs = {torch::tensor({1.0f, 3.0f}).view({2, 1}),
                                             torch::tensor({2.0f, 4.0f, 6.0f, 8.0f}).view({4, 1})};
  const std::vector<torch::Tensor> coeff = {torch::tensor({1.0f, -2.0f}).view({2, 1}),
                                            torch::tensor({0.5f, 3.0f, -1.0f, 2.0f}).view({4, 1})};
  rz::local::launch(2, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    const int r = comm.rank();
    const rz::integration::sync_batch_stats s = rz::integration::sync_batch_statistics(&comm, inputs[r]);
    mean[r] = s.mean.to(torch::kFloat32).item<float>();
    var[r] = s.variance.to(torch::kFloat32).item<float>();
    count[r] = s.count;
    rz::integration::sync_batch_norm bn(&comm, 1,
                                        rz::integration::sync_batch_norm_options{.eps = 1e-5, .momentum = 1.0});
    const torch::Tensor x = inputs[r].clone().requires_grad_(true);
    const torch::Tensor out = bn->forward(x);
    (out * coeff[r]).sum().backward();
    running_mean[r] = bn->running_mean.item<float>();
    running_var[r] = bn->running_var.item<float>();
    y[r] = out.detach();
    dx[r] = x.grad();
    dw[r] = bn->weight.grad();
    db[r] = bn->bias.grad();
  });
  for (int r = 0; r < 2; ++r) {
    DOCTEST_CHECK(mean[r] == 4.0f);
    DOCTEST_CHECK(var[r] == static_cast<float>(34.0 / 6.0));
    DOCTEST_CHECK(count[r] == 6);
    DOCTEST_CHECK(running_mean[r] == 4.0f);
    DOCTEST_CHECK(running_var[r] == static_cast<float>(34.0 / 5.0));
  }
  // libtorch's own batch_norm on the whole batch of 6, loss = sum of both ranks' losses.
  const torch::Tensor x = torch::cat(inputs).requires_grad_(true);
  const torch::Tensor w = torch::ones({1}).requires_grad_(true), b = torch::zeros({1}).requires_grad_(true);
  const torch::Tensor ref = torch::batch_norm(x, w, b, {}, {}, true, 0.1, 1e-5, false);
  (ref * torch::cat(coeff)).sum().backward();
  DOCTEST_CHECK(torch::allclose(torch::cat(y), ref.detach(), 1e-6, 1e-6));
  DOCTEST_CHECK(torch::allclose(torch::cat(dx), x.grad(), 1e-5, 1e-6));
  DOCTEST_CHECK(torch::allclose(dw[0] + dw[1], w.grad(), 1e-5, 1e-6));
  DOCTEST_CHECK(torch::allclose(db[0] + db[1], b.grad(), 1e-5, 1e-6));
}

TEST_CASE("sync_batch_norm: [N, C, H, W] over 2 ranks matches batch_norm over the concatenated batch") {
  torch::manual_seed(3);
  const std::vector<torch::Tensor> inputs = {torch::randn({3, 4, 5, 5}) * 2 + 1, torch::randn({2, 4, 5, 5}) - 0.5};
  const std::vector<torch::Tensor> coeff = {torch::randn({3, 4, 5, 5}), torch::randn({2, 4, 5, 5})};
  std::vector<torch::Tensor> y(2), dx(2), dw(2), running_var(2);
  rz::local::launch(2, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    const int r = comm.rank();
    rz::integration::sync_batch_norm bn(&comm, 4);
    const torch::Tensor x = inputs[r].clone().requires_grad_(true);
    const torch::Tensor out = bn->forward(x);
    (out * coeff[r]).sum().backward();
    y[r] = out.detach();
    dx[r] = x.grad();
    dw[r] = bn->weight.grad();
    running_var[r] = bn->running_var.clone();
  });
  const torch::Tensor x = torch::cat(inputs).requires_grad_(true);
  const torch::Tensor w = torch::ones({4}).requires_grad_(true), b = torch::zeros({4}).requires_grad_(true);
  const torch::Tensor rm = torch::zeros({4}), rv = torch::ones({4});
  const torch::Tensor ref = torch::batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, false);
  (ref * torch::cat(coeff)).sum().backward();
  DOCTEST_CHECK(torch::allclose(torch::cat(y), ref.detach(), 1e-5, 1e-5));
  DOCTEST_CHECK(torch::allclose(torch::cat(dx), x.grad(), 1e-4, 1e-5));
  DOCTEST_CHECK(torch::allclose(dw[0] + dw[1], w.grad(), 1e-4, 1e-4));
  DOCTEST_CHECK(torch::equal(running_var[0], running_var[1]));
  DOCTEST_CHECK(torch::allclose(running_var[0], rv, 1e-6, 1e-6));
}

TEST_CASE("torch_ddp: bad modules are refused on every rank, naming the parameter") {
  std::vector<std::string> errors(2);
  SUBCASE("a frozen parameter that is not contiguous (rank 1 only)") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::nn::Module m;
      m.register_parameter("trained", torch::zeros({3}));
      m.register_parameter("transposed", comm.rank() == 1 ? torch::zeros({4, 3}).t() : torch::zeros({3, 4}),
                           /*requires_grad=*/false);
      errors[comm.rank()] = error_of([&] { rz::integration::torch_ddp ddp(comm, m); });
    });
    DOCTEST_CHECK(errors[1].find("parameter 'transposed' is not contiguous (a frozen parameter is broadcast") !=
                  std::string::npos);
    DOCTEST_CHECK(errors[0].find("rank(s) 1 refused") != std::string::npos);
  }
  SUBCASE("a parameter that is not contiguous") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::nn::Module m;
      m.register_parameter("transposed", torch::zeros({4, 3}).t());
      errors[comm.rank()] = error_of([&] { rz::integration::torch_ddp ddp(comm, m); });
    });
    for (const auto& e : errors) DOCTEST_CHECK(e.find("parameter 'transposed' is not contiguous") != std::string::npos);
  }
  SUBCASE("a parameter on another device than the communicator's memory") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::nn::Module m;
      m.register_parameter("elsewhere", torch::empty({3}, torch::device(torch::kMeta)));
      errors[comm.rank()] = error_of([&] { rz::integration::torch_ddp ddp(comm, m); });
    });
    for (const auto& e : errors) DOCTEST_CHECK(e.find("parameter 'elsewhere' is on device meta") != std::string::npos);
  }
}

TEST_CASE("torch_ddp: a parameter replaced after registration, or never reached by backward, is an error (no hang)") {
  std::vector<std::string> errors(2);
  SUBCASE("changed on rank 0 only: rank 0 names it, rank 1 fails promptly") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      two_layers m(0);
      errors[comm.rank()] = error_of([&] {
        rz::integration::torch_ddp ddp(comm, m);
        if (comm.rank() == 0) m.first->weight.set_data(torch::zeros({4, 6}));
        for (int step = 0; step < 2; ++step) {  // rank 1's second step needs rank 0, which has failed
          ddp.zero_grad();
          loss_of(m.forward(batch(comm.rank(), step))).backward();
          ddp.finish();
        }
      });
    });
    DOCTEST_CHECK(errors[0].find("parameter 'first.weight' changed its storage") != std::string::npos);
    DOCTEST_CHECK(!errors[1].empty());
  }
  SUBCASE("never reached") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      two_layers m(0);
      errors[comm.rank()] = error_of([&] {
        rz::integration::torch_ddp ddp(comm, m);
        m.first->forward(batch(comm.rank(), 0)).sum().backward();  // `second` takes no part
        ddp.finish();
      });
    });
    for (const auto& e : errors) {
      DOCTEST_CHECK(e.find("'second.bias'") != std::string::npos);
      DOCTEST_CHECK(e.find("never marked ready") != std::string::npos);
    }
  }
  SUBCASE("never reached, with find_unused_parameters: zero gradients") {
    std::vector<float> unused_sum(2, -1), used_sum(2, 0);
    rz::local::launch(2, [&](rz::communicator& comm) {
      two_layers m(0);
      rz::integration::torch_ddp_options opt;
      opt.reducer.find_unused_parameters = true;
      rz::integration::torch_ddp ddp(comm, m, opt);
      m.second->weight.grad().fill_(5.0f);
      m.first->forward(batch(comm.rank(), 0)).sum().backward();
      ddp.finish();
      unused_sum[comm.rank()] = m.second->weight.grad().abs().sum().item<float>();
      used_sum[comm.rank()] = m.first->weight.grad().abs().sum().item<float>();
    });
    for (int r = 0; r < 2; ++r) {
      DOCTEST_CHECK(unused_sum[r] == 0.0f);
      DOCTEST_CHECK(used_sum[r] > 0.0f);
    }
  }
}

TEST_CASE(
    "torch_ddp: frozen parameters are broadcast from rank 0 but not reduced; the trainable ones train as one "
    "process on the whole batch") {
  torch::set_num_threads(1);
  constexpr int steps = 3;
  constexpr double learning_rate = 0.01;
  for (int world : {2, 3}) {
    CAPTURE(world);
    std::vector<std::vector<torch::Tensor>> trained(static_cast<std::size_t>(world)), frozen(trained.size());
    std::vector<int> frozen_grad_defined(trained.size(), -1), counts(trained.size(), -1),
        frozen_counts(trained.size(), -1);
    rz::local::launch(world, [&](rz::communicator& comm) {
      torch::set_num_threads(1);
      const int r = comm.rank();
      const auto me = static_cast<std::size_t>(r);
      frozen_middle model(r);  // every rank starts elsewhere, frozen layer included: the broadcast makes them rank 0's
      rz::integration::torch_ddp ddp(comm, model);
      counts[me] = static_cast<int>(ddp.parameter_count());
      frozen_counts[me] = static_cast<int>(ddp.frozen_parameter_count());
      torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(learning_rate));  // frozen ones too
      for (int step = 0; step < steps; ++step) {
        optimizer.zero_grad();
        loss_of(model.forward(batch(r, step))).backward();
        ddp.finish();
        optimizer.step();
      }
      for (auto& p : {model.first->weight, model.first->bias, model.last->weight, model.last->bias})
        trained[me].push_back(p.detach().clone());
      int defined = 0;
      for (auto& p : model.middle->parameters()) {
        frozen[me].push_back(p.detach().clone());
        defined += p.grad().defined() ? 1 : 0;
      }
      frozen_grad_defined[me] = defined;
    });
    // One process on every rank's batch: the loss is the average of the ranks' losses (DDP
    // averages the gradients), from rank 0's initial values.
    frozen_middle reference(0);
    const frozen_middle initial(0);
    torch::optim::SGD optimizer(reference.parameters(), torch::optim::SGDOptions(learning_rate));
    for (int step = 0; step < steps; ++step) {
      std::vector<torch::Tensor> batches;
      for (int r = 0; r < world; ++r) batches.push_back(batch(r, step));
      optimizer.zero_grad();
      (loss_of(reference.forward(torch::cat(batches))) / world).backward();
      optimizer.step();
    }
    const std::vector<torch::Tensor> expected = {reference.first->weight, reference.first->bias, reference.last->weight,
                                                 reference.last->bias};
    for (std::size_t r = 0; r < trained.size(); ++r) {
      CAPTURE(r);
      DOCTEST_CHECK(counts[r] == 4);
      DOCTEST_CHECK(frozen_counts[r] == 2);
      DOCTEST_CHECK(frozen_grad_defined[r] == 0);
      for (std::size_t i = 0; i < expected.size(); ++i) {
        CAPTURE(i);
        DOCTEST_CHECK(torch::allclose(trained[r][i], expected[i].detach(), 1e-5, 1e-5));
        DOCTEST_CHECK(!torch::equal(trained[r][i], initial.parameters()[i < 2 ? i : i + 2]));  // it trained
        DOCTEST_CHECK(torch::equal(trained[r][i], trained[0][i]));  // the replicas alike, bit for bit
      }
      DOCTEST_CHECK(torch::equal(frozen[r][0], initial.middle->weight));  // rank 0's, bitwise
      DOCTEST_CHECK(torch::equal(frozen[r][1], initial.middle->bias));
    }
  }
}

TEST_CASE("torch_ddp: ranks that freeze different parameters are refused on every rank, naming the parameter") {
  SUBCASE("2 ranks: rank 1 froze second.bias") {
    std::vector<std::string> errors(2);
    std::vector<std::optional<rz::errc>> kinds(2);
    rz::local::launch(2, [&](rz::communicator& comm) {
      two_layers m(0);
      if (comm.rank() == 1) m.second->bias.requires_grad_(false);
      const auto construct = [&] { rz::integration::torch_ddp ddp(comm, m); };
      errors[comm.rank()] = error_of(construct);
      kinds[comm.rank()] = kind_of(construct);  // the same on a second try: nothing is left half agreed
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(errors[r]);
      DOCTEST_CHECK(kinds[r] == rz::errc::contract_mismatch);
      DOCTEST_CHECK(errors[r].find("rank(s) 1 differ from rank 0 in which parameters are frozen") != std::string::npos);
      DOCTEST_CHECK(errors[r].find("parameter 'second.bias' (rank 0: trainable; rank 1: frozen)") != std::string::npos);
    }
  }
  SUBCASE("3 ranks: rank 1 froze second.bias, rank 2 first.bias and second.bias: first.bias is named") {
    std::vector<std::string> errors(3);
    rz::local::launch(3, [&](rz::communicator& comm) {
      two_layers m(0);
      if (comm.rank() >= 1) m.second->bias.requires_grad_(false);
      if (comm.rank() == 2) m.first->bias.requires_grad_(false);
      errors[comm.rank()] = error_of([&] { rz::integration::torch_ddp ddp(comm, m); });
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(errors[r]);
      DOCTEST_CHECK(errors[r].find("rank(s) 1, 2 differ from rank 0") != std::string::npos);
      DOCTEST_CHECK(errors[r].find("parameter 'first.bias' (ranks 0-1: trainable; rank 2: frozen)") !=
                    std::string::npos);
    }
  }
  SUBCASE("a frozen parameter of another shape on rank 1") {
    std::vector<std::string> errors(2);
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::nn::Module m;
      m.register_parameter("trained", torch::zeros({3}));
      m.register_parameter("table", torch::zeros({comm.rank() == 0 ? 4 : 5, 2}), /*requires_grad=*/false);
      errors[comm.rank()] = error_of([&] { rz::integration::torch_ddp ddp(comm, m); });
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(errors[r]);
      DOCTEST_CHECK(errors[r].find("the first is parameter 'table' (rank 0: float32, 8 element(s); rank 1: float32, "
                                   "10 element(s)") != std::string::npos);
    }
  }
  SUBCASE("a frozen parameter of the same size but another shape on rank 1") {
    std::vector<std::string> errors(2);
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::nn::Module m;
      m.register_parameter("trained", torch::zeros({3}));
      m.register_parameter("table", comm.rank() == 0 ? torch::zeros({2, 3}) : torch::zeros({3, 2}), false);
      errors[comm.rank()] = error_of([&] { rz::integration::torch_ddp ddp(comm, m); });
    });
    DOCTEST_CHECK(errors[0].find("parameter 'table' (float32, 6 element(s) on every rank, but other shapes; shape on "
                                 "this rank [2, 3])") != std::string::npos);
    DOCTEST_CHECK(errors[1].find("shape on this rank [3, 2]") != std::string::npos);
  }
}

TEST_CASE("torch_ddp: a module whose every parameter is frozen (or that has none) is refused on every rank") {
  std::vector<std::string> errors(2);
  std::vector<std::optional<rz::errc>> kinds(2);
  rz::local::launch(2, [&](rz::communicator& comm) {
    two_layers m(0);
    for (auto& p : m.parameters()) p.requires_grad_(false);
    const auto construct = [&] { rz::integration::torch_ddp ddp(comm, m); };
    errors[comm.rank()] = error_of(construct);
    kinds[comm.rank()] = kind_of(construct);
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(errors[r]);
    DOCTEST_CHECK(kinds[r] == rz::errc::invalid_argument);
    DOCTEST_CHECK(errors[r].find("none of the module's 4 parameter(s) requires grad (all are frozen)") !=
                  std::string::npos);
  }
  rz::local::launch(2, [&](rz::communicator& comm) {  // no parameters at all: the same refusal
    torch::nn::Module empty;
    errors[comm.rank()] = error_of([&] { rz::integration::torch_ddp ddp(comm, empty); });
  });
  for (const auto& e : errors) DOCTEST_CHECK(e.find("the module has no parameters") != std::string::npos);
}

TEST_CASE("torch_ddp: a parameter frozen, unfrozen or replaced after registration is an error naming it (no hang)") {
  std::vector<std::string> errors(2);
  SUBCASE("a frozen parameter made trainable on every rank") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::set_num_threads(1);
      frozen_middle m(0);
      errors[comm.rank()] = error_of([&] {
        rz::integration::torch_ddp ddp(comm, m);
        m.middle->weight.requires_grad_(true);
        ddp.zero_grad();
        loss_of(m.forward(batch(comm.rank(), 0))).backward();
        ddp.finish();
      });
    });
    for (const auto& e : errors) {
      CAPTURE(e);
      DOCTEST_CHECK(e.find("parameter 'middle.weight' was made trainable (requires_grad set to true) after "
                           "registration") != std::string::npos);
      DOCTEST_CHECK(e.find("register the module again") != std::string::npos);
    }
  }
  SUBCASE("a trainable parameter frozen on rank 0 only: rank 0 names it, rank 1 fails promptly") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::set_num_threads(1);
      frozen_middle m(0);
      errors[comm.rank()] = error_of([&] {
        rz::integration::torch_ddp ddp(comm, m);
        if (comm.rank() == 0) m.last->bias.requires_grad_(false);
        for (int step = 0; step < 2; ++step) {  // rank 1's second step needs rank 0, which has failed
          ddp.zero_grad();
          loss_of(m.forward(batch(comm.rank(), step))).backward();
          ddp.finish();
        }
      });
    });
    CAPTURE(errors[0]);
    DOCTEST_CHECK(errors[0].find("parameter 'last.bias' was frozen (requires_grad set to false) after registration") !=
                  std::string::npos);
    DOCTEST_CHECK(errors[0].find("register the module again") != std::string::npos);
    DOCTEST_CHECK(!errors[1].empty());
  }
  SUBCASE("a frozen parameter given new data on every rank") {
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::set_num_threads(1);
      frozen_middle m(0);
      errors[comm.rank()] = error_of([&] {
        rz::integration::torch_ddp ddp(comm, m);
        m.middle->bias.set_data(torch::zeros({4}));
        ddp.zero_grad();
        loss_of(m.forward(batch(comm.rank(), 0))).backward();
        ddp.finish();
      });
    });
    for (const auto& e : errors)
      DOCTEST_CHECK(e.find("parameter 'middle.bias' changed its storage or shape") != std::string::npos);
  }
}
