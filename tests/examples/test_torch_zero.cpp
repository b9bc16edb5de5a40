// integration/torch_zero.hpp with example 04's GPT (examples/04_libtorch_gpt/gpt_model.hpp) on
// the local backend: units per wrap policy, tied weights, memory equal to the plan, stage 3 with
// regathered saved tensors equal to stage 0 bit for bit, and the refusals of bad modules on
// every rank. Suite 'torch'.
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "gpt_model.hpp"
#include "ringzero/backend/local/launch.hpp"
#include "ringzero/checkpoint.hpp"
#include "ringzero/integration/torch_zero.hpp"

// libtorch's logging (glog's macros) defines CHECK and friends; doctest's are meant here.
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#undef CHECK_NOTNULL
#include <doctest/doctest.h>

namespace rz = ringzero;
using rz::integration::torch_zero;
using rz::integration::torch_zero_options;
using rz::integration::wrap_policy;

namespace {

gpt::config small() {
  gpt::config c;
  c.vocab = 11;
  c.context = 8;
  c.layers = 2;
  c.embd = 8;
  c.heads = 2;
  return c;
}

std::mutex construct;

std::shared_ptr<gpt::model> make_model(std::uint64_t seed = 7, std::int64_t lora = 0) {
  std::lock_guard lock(construct);  // torch's default generator is shared by the rank threads
  torch::manual_seed(seed);
  gpt::config c = small();
  c.lora = lora;
  return std::make_shared<gpt::model>(c);
}

torch_zero_options options(int stage, wrap_policy wrap) {
  torch_zero_options o;
  o.stage = stage;
  o.wrap = wrap;
  o.model.optimizer.kind = rz::zero::optimizer_kind::adamw;
  o.model.optimizer.lr = 1e-2;
  return o;
}

/// `steps` steps on a fixed batch of 2 sequences per rank (rank r's own data); the final
/// parameters of rank 0 in registration order.
/// `lora` > 0: the backbone frozen, adapters of that rank trained; `keep_frozen`: the frozen
/// parameters kept gathered at stage 3.
std::vector<float> train(int ranks, int stage, wrap_policy wrap, int steps,
                         rz::zero::reshard_policy reshard = rz::zero::reshard_policy::all, int accumulate = 1,
                         bool evaluate = false, std::int64_t lora = 0, bool keep_frozen = false) {
  std::vector<float> out;
  rz::local::launch(ranks, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    auto net = make_model(7, lora);
    auto o = options(stage, wrap);
    o.reshard_after_forward = reshard;
    o.accumulation_steps = accumulate;
    o.keep_frozen_bytes = keep_frozen ? rz::zero::keep_all_frozen : 0;
    torch_zero z(comm, *net, o);
    auto x = (torch::arange(16, torch::kLong).view({2, 8}) * (comm.rank() + 3)) % 11;
    auto y = (x + 1) % 11;
    for (int s = 0; s < steps; ++s) {
      for (int micro = 0; micro < accumulate; ++micro) {
        auto logits = net->forward((x + micro) % 11, z);
        z.backward(torch::nn::functional::cross_entropy(logits.view({-1, 11}), ((y + micro) % 11).view({-1})));
      }
      z.step();
      if (evaluate) {  // a forward without backward (kept units are released by the next pass)
        torch::NoGradGuard no_grad;
        (void)net->forward(x, z);
        (void)net->forward(x, z);
      }
    }
    std::vector<float> mine;
    for (std::size_t p = 0; p < z.model().parameter_count(); ++p) {
      std::vector<float> v(z.parameters()[p].numel().value());
      z.model().read_parameter(p, v);
      mine.insert(mine.end(), v.begin(), v.end());
    }
    if (comm.rank() == 0) out = mine;
  });
  return out;
}

/// Each rank's error message ("" when it did not throw) from `fn(comm, rank)`.
template <class F>
std::vector<std::string> errors(int ranks, F fn) {
  std::vector<std::string> messages(static_cast<std::size_t>(ranks));
  rz::local::launch(ranks, [&](rz::communicator& comm) {
    try {
      fn(comm);
    } catch (const rz::error& e) { messages[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  return messages;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("torch_zero: gather units per wrap policy, tied output layer") {
  rz::local::launch(1, [&](rz::communicator& comm) {
    auto net = make_model();
    torch_zero block(comm, *net, options(3, wrap_policy::block));
    std::vector<std::string> names;
    for (const auto& u : block.model().plan().units()) names.push_back(u.name);
    CHECK(names == std::vector<std::string>{"embeddings", "blocks.0", "blocks.1", "head"});
    const auto& ps = block.parameters();
    CHECK(ps.front().name == "wte.weight");
    CHECK(ps.back().name == "lm_head.weight");
    CHECK(ps.front().tie_group == "wte.weight");
    CHECK(ps.back().tie_group == "wte.weight");
    CHECK(ps.back().unit == "head");
    // The plan is the planner's for the registered parameters.
    rz::zero::plan_request q = block.model().plan().request();
    q.parameters = ps;
    CHECK(rz::zero::shard_plan(q).fingerprint() == block.model().plan().fingerprint());
  });
  rz::local::launch(1, [&](rz::communicator& comm) {
    auto net = make_model();
    torch_zero layer(comm, *net, options(3, wrap_policy::layer));
    std::vector<std::string> names;
    for (const auto& u : layer.model().plan().units()) names.push_back(u.name);
    std::vector<std::string> expected{"wte", "wpe"};
    for (const char* b : {"blocks.0", "blocks.1"})
      for (const char* l : {".ln1", ".attn_qkv", ".attn_proj", ".ln2", ".mlp_fc", ".mlp_proj"})
        expected.push_back(std::string(b) + l);
    expected.push_back("ln_f");
    expected.push_back("lm_head");
    CHECK(names == expected);
  });
  rz::local::launch(1, [&](rz::communicator& comm) {
    auto net = make_model();
    torch_zero model(comm, *net, options(3, wrap_policy::model));
    REQUIRE(model.model().plan().units().size() == 1);
    CHECK(model.model().plan().units()[0].name == "model");
  });
}

TEST_CASE("torch_zero: every stage and wrap ends with stage 0's parameters bit for bit on 2 ranks") {
  // On 2 ranks every stage averages the same two gradients ((a + b) / 2) and AdamW is
  // element-wise, so the parameters must be identical; at stage 3 that holds only if the
  // tensors autograd saved in forward see the regathered parameters in backward.
  const std::vector<float> reference = train(2, 0, wrap_policy::block, 3);
  REQUIRE(!reference.empty());
  for (wrap_policy w : {wrap_policy::block, wrap_policy::layer, wrap_policy::model})
    for (int stage = 1; stage <= 3; ++stage) {
      CAPTURE(stage);
      CAPTURE(std::string(rz::integration::wrap_name(w)));
      CHECK(train(2, stage, w, 3) == reference);
    }
  CHECK(train(2, 3, wrap_policy::layer, 3, rz::zero::reshard_policy::none) == reference);
  CHECK(train(2, 3, wrap_policy::block, 3, rz::zero::reshard_policy::except_last) == reference);
  CHECK(train(2, 3, wrap_policy::layer, 3, rz::zero::reshard_policy::except_last, 1, /*evaluate=*/true) == reference);
  // and the parameters moved
  rz::local::launch(1, [&](rz::communicator& comm) {
    auto net = make_model();
    torch_zero z(comm, *net, options(0, wrap_policy::block));
    std::vector<float> initial;
    for (std::size_t p = 0; p < z.model().parameter_count(); ++p) {
      std::vector<float> v(z.parameters()[p].numel().value());
      z.model().read_parameter(p, v);
      initial.insert(initial.end(), v.begin(), v.end());
    }
    CHECK(initial != reference);
  });
}

TEST_CASE("torch_zero: gradient accumulation over 2 micro-batches at stages 1-3 matches stage 0") {
  // Stages 0-1 add the micro-batches' gradients and then average over the ranks; stages 2-3
  // average every micro-batch and add the averages: the same sum, reassociated, so float32
  // rounding (a few ulps per step) separates them, never more than 1e-5 of a weight's size
  // after 3 AdamW steps of lr 1e-2 (an unbound gradient view would lose a whole micro-batch).
  const std::vector<float> reference = train(2, 0, wrap_policy::block, 3, rz::zero::reshard_policy::all, 2);
  REQUIRE(!reference.empty());
  CHECK(train(2, 1, wrap_policy::block, 3, rz::zero::reshard_policy::all, 2) == reference);  // the same sums as stage 0
  for (int stage = 2; stage <= 3; ++stage) {
    CAPTURE(stage);
    const std::vector<float> got = train(2, stage, wrap_policy::layer, 3, rz::zero::reshard_policy::all, 2);
    REQUIRE(got.size() == reference.size());
    float worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - reference[i]));
    CHECK(worst <= 1e-5f);
  }
  CHECK(train(2, 3, wrap_policy::block, 3, rz::zero::reshard_policy::all, 1) !=
        reference);  // accumulation changes the result
}

TEST_CASE("torch_zero: memory per rank at stage 3 equals the plan after training") {
  for (wrap_policy w : {wrap_policy::block, wrap_policy::layer, wrap_policy::model}) {
    CAPTURE(std::string(rz::integration::wrap_name(w)));
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::set_num_threads(1);
      auto net = make_model();
      torch_zero z(comm, *net, options(3, w));
      auto x = torch::arange(16, torch::kLong).view({2, 8}) % 11;
      for (int s = 0; s < 2; ++s) {
        z.backward(net->forward(x, z).sum());
        z.step();
      }
      const auto m = z.model().memory_in_use();
      const auto p = z.model().plan().memory();
      CHECK(m.parameters == p.parameters);
      CHECK(m.communication_buffers == p.communication_buffers);
      CHECK(m.gradients == p.gradients);
      CHECK(m.optimizer_states == p.optimizer_states);
    });
  }
}

TEST_CASE("torch_zero: a frozen backbone with low-rank adapters trains at every stage and wrap, stage 0's bits") {
  // The backbone is frozen (requires_grad false): it stays as initialised, the adapters move,
  // and every stage, wrap and policy ends with stage 0's parameters; at stage 3 keeping the
  // frozen parameters gathered changes no bit.
  const std::vector<float> reference = train(2, 0, wrap_policy::block, 3, rz::zero::reshard_policy::all, 1, false, 2);
  std::vector<float> initial;
  std::vector<bool> frozen;
  rz::local::launch(1, [&](rz::communicator& comm) {
    auto net = make_model(7, 2);
    torch_zero z(comm, *net, options(0, wrap_policy::block));
    for (std::size_t p = 0; p < z.model().parameter_count(); ++p) {
      std::vector<float> v(z.parameters()[p].numel().value());
      z.model().read_parameter(p, v);
      initial.insert(initial.end(), v.begin(), v.end());
      frozen.insert(frozen.end(), v.size(), !z.parameters()[p].trainable);
    }
  });
  REQUIRE(reference.size() == initial.size());
  std::size_t moved = 0, frozen_count = 0, frozen_moved = 0;
  for (std::size_t i = 0; i < initial.size(); ++i) {
    frozen_count += frozen[i] ? 1 : 0;
    (frozen[i] ? frozen_moved : moved) += reference[i] != initial[i] ? 1 : 0;
  }
  CHECK(frozen_count > initial.size() / 2);
  CHECK(frozen_moved == 0);
  CHECK(moved > 0);
  for (wrap_policy w : {wrap_policy::block, wrap_policy::layer, wrap_policy::model})
    for (int stage = 1; stage <= 3; ++stage) {
      CAPTURE(stage);
      CAPTURE(std::string(rz::integration::wrap_name(w)));
      CHECK(train(2, stage, w, 3, rz::zero::reshard_policy::all, 1, false, 2) == reference);
    }
  CHECK(train(2, 3, wrap_policy::block, 3, rz::zero::reshard_policy::all, 1, false, 2, true) == reference);
  // Two micro-batches per step, units kept after their forward, an evaluation pass after each
  // step: keeping the frozen parameters gathered changes no bit.
  CHECK(train(2, 3, wrap_policy::layer, 3, rz::zero::reshard_policy::except_last, 2, true, 2, true) ==
        train(2, 3, wrap_policy::layer, 3, rz::zero::reshard_policy::except_last, 2, true, 2, false));
}

TEST_CASE(
    "torch_zero: frozen parameters kept gathered at stage 3 are views of the runtime outside run, after a load too") {
  const auto dir = std::filesystem::temp_directory_path() / ("ringzero_torch_zero_keep_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  rz::local::launch(2, [&](rz::communicator& comm) {
    torch::set_num_threads(1);
    auto net = make_model(7, 2);
    auto o = options(3, wrap_policy::block);
    o.keep_frozen_bytes = rz::zero::keep_all_frozen;
    torch_zero z(comm, *net, o);
    auto& m = z.model();
    const std::size_t wte = m.index("wte.weight");
    auto same_memory = [&] {
      const float* runtime = m.parameter<float>(wte).data();
      return net->wte->weight.data_ptr<float>() == runtime;
    };
    CHECK(same_memory());  // before any run
    std::vector<float> initial(static_cast<std::size_t>(net->wte->weight.numel()));
    m.read_parameter(wte, initial);  // local: kept whole
    CHECK(std::equal(initial.begin(), initial.end(), net->wte->weight.data_ptr<float>()));
    auto x = torch::arange(16, torch::kLong).view({2, 8}) % 11;
    z.backward(torch::nn::functional::cross_entropy(net->forward(x, z).view({-1, 11}), ((x + 1) % 11).view({-1})));
    z.step();
    rz::checkpoint::checkpointer(dir).save(m);
    (void)rz::checkpoint::load(m, dir);  // with the optimizer's states: the loaded copy goes live
    z.refresh();
    CHECK(same_memory());
    CHECK(std::equal(initial.begin(), initial.end(), net->wte->weight.data_ptr<float>()));  // frozen: unchanged
  });
  std::filesystem::remove_all(dir);
}

TEST_CASE("torch_zero: ranks that freeze different parameters are refused on every rank, naming the parameter") {
  const auto e = errors(2, [](rz::communicator& comm) {
    auto net = make_model();
    if (comm.rank() == 1) net->ln_f->bias.set_requires_grad(false);
    torch_zero z(comm, *net, options(3, wrap_policy::block));
  });
  for (const std::string& m : e) {
    INFO(m);
    CHECK(contains(m, "the ranks differ in parameters"));
    CHECK(contains(m, "here 'ln_f.bias'"));
  }
}

TEST_CASE("torch_zero: a parameter that is not contiguous is refused, named") {
  struct odd : torch::nn::Module {
    odd() { w = register_parameter("w", torch::ones({4, 3}).t()); }
    torch::Tensor w;
  };
  const auto e = errors(2, [](rz::communicator& comm) {
    odd m;
    torch_zero z(comm, m, options(2, wrap_policy::model));
  });
  CHECK(contains(e[0], "parameter 'w' is not contiguous"));
  CHECK(contains(e[1], "parameter 'w' is not contiguous"));
}

TEST_CASE("torch_zero: parameters changed after registration are refused at step() on every rank, named") {
  SUBCASE("new data") {
    const auto e = errors(2, [](rz::communicator& comm) {
      auto net = make_model();
      torch_zero z(comm, *net, options(3, wrap_policy::block));
      if (comm.rank() == 0) net->wpe->weight.set_data(torch::zeros({8, 8}));
      z.step();
    });
    CHECK(contains(e[0], "parameter 'wpe.weight' has new data"));
    CHECK(contains(e[1], "rank(s) 0 refused"));
  }
  SUBCASE("another tensor") {
    struct swappable : torch::nn::Module {
      swappable() { register_parameter("w", torch::ones({3})); }
      void swap() { parameters_["w"] = torch::zeros({3}).requires_grad_(); }
    };
    const auto e = errors(2, [](rz::communicator& comm) {
      swappable m;
      torch_zero z(comm, m, options(1, wrap_policy::layer));
      m.swap();
      z.step();
    });
    CHECK(contains(e[0], "parameter 'w' was replaced by another tensor"));
    CHECK(contains(e[1], "parameter 'w' was replaced by another tensor"));
  }
  SUBCASE("no longer requiring grad") {
    const auto e = errors(2, [](rz::communicator& comm) {
      auto net = make_model();
      torch_zero z(comm, *net, options(0, wrap_policy::model));
      if (comm.rank() == 1) net->blocks->at<gpt::block_impl>(1).mlp_fc->weight.set_requires_grad(false);
      z.step();
    });
    CHECK(contains(e[1], "parameter 'blocks.1.mlp_fc.weight' no longer requires grad"));
    CHECK(contains(e[0], "rank(s) 1 refused"));
  }
  SUBCASE("a frozen parameter made trainable") {
    const auto e = errors(2, [](rz::communicator& comm) {
      auto net = make_model(7, 2);
      torch_zero z(comm, *net, options(3, wrap_policy::block));
      if (comm.rank() == 0) net->wte->weight.set_requires_grad(true);
      z.step();
    });
    CHECK(contains(e[0], "parameter 'wte.weight' requires grad now (it was registered frozen"));
    CHECK(contains(e[1], "rank(s) 0 refused"));
  }
}

TEST_CASE("torch_zero: a parameter used outside its unit's run() is refused at backward() on every rank, named") {
  const auto e = errors(2, [](rz::communicator& comm) {
    auto net = make_model();
    torch_zero z(comm, *net, options(2, wrap_policy::layer));
    // ln_f's weight used without run("ln_f", ...): its gradient arrives while its unit is closed.
    auto out = (net->ln_f->weight * 2).sum();
    z.backward(out);
  });
  CHECK(contains(e[0], "the gradient of parameter 'ln_f.weight' arrived outside the backward of its unit 'ln_f'"));
  CHECK(contains(e[1], "the gradient of parameter 'ln_f.weight' arrived outside the backward of its unit 'ln_f'"));
}

TEST_CASE("torch_zero: a unit whose input needs no gradient ends its backward when its gradients arrive") {
  // With layer wrap the token and position embeddings are units whose input (token ids) needs no
  // gradient: no input boundary ends their backward. Their gradients' arrival does (FSDP's
  // post-accumulate hook), so the backward runs in the plan's canonical order: without prefetch
  // (or with max_inflight_gathers 1) the gather pool stays at the plan's size, measured where it
  // is allocated, and the parameters stay those of stage 0.
  const std::vector<float> reference = train(2, 0, wrap_policy::layer, 2);
  for (int bound : {0, 1}) {
    CAPTURE(bound);
    std::vector<float> out;
    rz::local::launch(2, [&](rz::communicator& comm) {
      torch::set_num_threads(1);
      auto net = make_model();
      auto o = options(3, wrap_policy::layer);
      o.prefetch = bound != 0;  // bound 0: no prefetch at all; bound 1: prefetch, bounded to nothing
      o.max_inflight_gathers = bound;
      torch_zero z(comm, *net, o);
      auto x = (torch::arange(16, torch::kLong).view({2, 8}) * (comm.rank() + 3)) % 11;
      auto y = (x + 1) % 11;
      for (int s = 0; s < 2; ++s) {
        z.backward(torch::nn::functional::cross_entropy(net->forward(x, z).view({-1, 11}), y.view({-1})));
        z.step();
      }
      const auto& plan = z.model().plan();
      CHECK(plan.communication().gather_buffers == 1);  // one unit at a time
      CHECK(z.model().memory_allocated(rz::primitive::memory_space::host).peak ==
            plan.memory().total() + sizeof(rz::zero::step_scalars));
      std::vector<float> mine;
      for (std::size_t p = 0; p < z.model().parameter_count(); ++p) {
        std::vector<float> v(z.model().numel(p));
        z.model().read_parameter(p, v);
        mine.insert(mine.end(), v.begin(), v.end());
      }
      if (comm.rank() == 0) out = mine;
    });
    CHECK(out == reference);
  }
}
