#pragma once
// A small GPT in libtorch (Radford et al. 2019, "Language Models are Unsupervised Multitask
// Learners": pre-norm blocks, learned position embeddings, output layer tied to the token
// embedding) whose forward runs every part that may be a gather unit through a runner's
// `run(name, x, f)`: `integration::torch_zero` (ZeRO; one model serves every wrap policy:
//   block: "embeddings", "blocks.<i>", "head"; layer: "wte", "wpe", "blocks.<i>.ln1", ...,
//   "ln_f", "lm_head"; model: "model"), or `direct_runner`, which calls f(x) (DDP through
// `integration::torch_ddp`, or no distribution).
// With `config::lora` = r > 0 every projection of every block gains a low-rank adapter (Hu et
// al. 2021, "LoRA": W x + B A x, A of r x in, B of out x r, B starting at zero), registered as
// the projection's own parameters "lora_a" and "lora_b" (so in its unit under every wrap), and
// every other parameter is frozen (requires_grad false): fine-tuning with a frozen backbone.
// Shared by example 04 and its test (tests/examples/test_torch_zero.cpp).

#include <torch/torch.h>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace gpt {

/// Sizes of the model.
struct config {
  std::int64_t vocab = 96;    ///< characters
  std::int64_t context = 64;  ///< positions
  std::int64_t layers = 2;    ///< transformer blocks
  std::int64_t embd = 64;     ///< embedding width (heads * head width)
  std::int64_t heads = 4;     ///< attention heads
  std::int64_t lora = 0;      ///< rank of the low-rank adapters (0: none, every parameter trains)
};

/// What runs the model's parts: `run(name, x, f)` returns f(x), run as the part `name` where the
/// runner makes something of it (`integration::torch_zero`: a gather unit of its wrap policy).
template <class Runner>
concept unit_runner = requires(Runner& r, std::string_view name, const torch::Tensor& x,
                               const std::function<torch::Tensor(const torch::Tensor&)>& f) {
  { r.run(name, x, f) } -> std::convertible_to<torch::Tensor>;
};

/// The runner of a module that is used whole (DDP's replicas, or one process): f(x).
struct direct_runner {
  torch::Tensor run(std::string_view /*name*/, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& f) const {
    return f(x);
  }
};

/// One pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).
struct block_impl : torch::nn::Module {
  explicit block_impl(const config& c) : heads(c.heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})));
    attn_qkv = register_module("attn_qkv", torch::nn::Linear(c.embd, 3 * c.embd));
    attn_proj = register_module("attn_proj", torch::nn::Linear(c.embd, c.embd));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})));
    mlp_fc = register_module("mlp_fc", torch::nn::Linear(c.embd, 4 * c.embd));
    mlp_proj = register_module("mlp_proj", torch::nn::Linear(4 * c.embd, c.embd));
    // The adapters after each projection's weight and bias, as its own parameters: gathered
    // with it (the projection's unit), so no unit runs inside another.
    if (c.lora > 0)
      for (auto [name, linear] : {std::pair{"attn_qkv", attn_qkv}, std::pair{"attn_proj", attn_proj},
                                  std::pair{"mlp_fc", mlp_fc}, std::pair{"mlp_proj", mlp_proj}}) {
        lora_a[name] = linear->register_parameter("lora_a", torch::zeros({c.lora, linear->options.in_features()}));
        lora_b[name] = linear->register_parameter("lora_b", torch::zeros({linear->options.out_features(), c.lora}));
      }
  }

  template <unit_runner Runner>
  torch::Tensor forward(const std::string& path, const torch::Tensor& x, Runner& z) {
    const std::int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads;
    auto h = z.run(path + ".ln1", x, [&](const torch::Tensor& t) { return ln1->forward(t); });
    auto qkv = z.run(path + ".attn_qkv", h, [&](const torch::Tensor& t) { return adapted("attn_qkv", attn_qkv, t); });
    auto parts = qkv.chunk(3, -1);
    auto q = parts[0].view({B, T, heads, D}).transpose(1, 2);
    auto k = parts[1].view({B, T, heads, D}).transpose(1, 2);
    auto v = parts[2].view({B, T, heads, D}).transpose(1, 2);
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
    auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
    att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
    auto a = z.run(path + ".attn_proj", y, [&](const torch::Tensor& t) { return adapted("attn_proj", attn_proj, t); });
    auto x2 = x + a;
    auto h2 = z.run(path + ".ln2", x2, [&](const torch::Tensor& t) { return ln2->forward(t); });
    auto f =
        z.run(path + ".mlp_fc", h2, [&](const torch::Tensor& t) { return torch::gelu(adapted("mlp_fc", mlp_fc, t)); });
    auto m = z.run(path + ".mlp_proj", f, [&](const torch::Tensor& t) { return adapted("mlp_proj", mlp_proj, t); });
    return x2 + m;
  }

  /// `linear(t)`, plus its adapter's B A t when the block has adapters.
  torch::Tensor adapted(const std::string& name, torch::nn::Linear& linear, const torch::Tensor& t) {
    auto y = linear->forward(t);
    if (lora_a.empty()) return y;
    return y + torch::matmul(torch::matmul(t, lora_a.at(name).t()), lora_b.at(name).t());
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear attn_qkv{nullptr}, attn_proj{nullptr}, mlp_fc{nullptr}, mlp_proj{nullptr};
  std::map<std::string, torch::Tensor> lora_a, lora_b;  ///< per projection (config::lora > 0)
};

/// The output layer: the token embedding's weight registered again under its own name (tied).
struct head_impl : torch::nn::Module {
  explicit head_impl(const torch::Tensor& tied) { weight = register_parameter("weight", tied); }
  torch::Tensor weight;
};

/// The GPT: wte, wpe, blocks.<i>, ln_f, lm_head (tied to wte), in registration (and use) order.
struct model : torch::nn::Module {
  explicit model(const config& c) : cfg(c) {
    wte = register_module("wte", torch::nn::Embedding(c.vocab, c.embd));
    wpe = register_module("wpe", torch::nn::Embedding(c.context, c.embd));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < c.layers; ++i) blocks->push_back(std::make_shared<block_impl>(c));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})));
    lm_head = register_module("lm_head", std::make_shared<head_impl>(wte->weight));
    // GPT-2's initialisation: normal(0, 0.02) weights, zero biases, LayerNorm at (1, 0); the
    // backbone's values do not depend on the adapters, which are drawn after it: A normal with
    // standard deviation 1/sqrt(in), B zero (the adapted model starts as the backbone).
    torch::NoGradGuard no_grad;
    const auto adapter = [](const std::string& n) { return n.find(".lora_") != std::string::npos; };
    for (auto& p : named_parameters(true)) {
      const std::string& n = p.key();
      if (adapter(n))
        continue;
      else if (n.ends_with(".bias"))
        p.value().zero_();
      else if (n.find(".ln") != std::string::npos || n.starts_with("ln_f"))
        p.value().fill_(1);
      else if (n != "lm_head.weight")
        p.value().normal_(0, 0.02);
    }
    for (auto& p : named_parameters(true)) {
      if (c.lora == 0) break;
      if (!adapter(p.key()))
        p.value().set_requires_grad(false);  // frozen backbone
      else if (p.key().ends_with(".lora_a"))
        p.value().normal_(0, 1.0 / std::sqrt(static_cast<double>(p.value().size(1))));
    }
  }

  /// Logits [B, T, vocab] for token ids [B, T] (T <= context), each part run by `z`.
  template <unit_runner Runner>
  torch::Tensor forward(const torch::Tensor& idx, Runner& z) {
    return z.run("model", idx, [&](const torch::Tensor& ids) {
      const std::int64_t T = ids.size(1);
      auto x = z.run("embeddings", ids, [&](const torch::Tensor& i) {
        auto tok = z.run("wte", i, [&](const torch::Tensor& t) { return wte->forward(t); });
        auto positions = torch::arange(T, torch::TensorOptions().dtype(torch::kLong));
        auto pos = z.run("wpe", positions, [&](const torch::Tensor& t) { return wpe->forward(t); });
        return tok + pos;
      });
      for (std::size_t b = 0; b < blocks->size(); ++b) {
        const std::string path = "blocks." + std::to_string(b);
        x = z.run(path, x, [&](const torch::Tensor& t) { return blocks->at<block_impl>(b).forward(path, t, z); });
      }
      return z.run("head", x, [&](const torch::Tensor& t) {
        auto h = z.run("ln_f", t, [&](const torch::Tensor& s) { return ln_f->forward(s); });
        return z.run("lm_head", h, [&](const torch::Tensor& s) { return torch::matmul(s, lm_head->weight.t()); });
      });
    });
  }

  config cfg;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  std::shared_ptr<head_impl> lm_head;
};

}  // namespace gpt
