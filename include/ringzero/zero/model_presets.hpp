#pragma once
/// @file
/// Parameter lists of well-known models, with their real shapes, for planning without the model:
/// GPT-2 small / medium / large / xl (Radford et al. 2019, as published on the Hugging Face hub:
/// Conv1D weights stored [in, out], the output projection tied to the token embedding) and a
/// 7B LLaMA-style decoder (Touvron et al. 2023: d_model 4096, 32 layers, SwiGLU width 11008,
/// vocabulary 32000, RMSNorm weights only, untied output projection).
///
/// Units follow how FSDP is usually wrapped: the embeddings, one unit per transformer block,
/// and the final norm with the output projection. Element types are left unset (the plan's
/// `precision::parameter` decides). Pure.
///
/// Parameter counts (unique storage): gpt2 124,439,808; gpt2-medium 354,823,168;
/// gpt2-large 774,030,080; gpt2-xl 1,557,611,200; llama-7b 6,738,415,616.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringzero/zero/parameter_spec.hpp"

namespace ringzero::zero {

/// GPT-2 with `layers` blocks of width `d_model`, vocabulary `vocab` and context `context`,
/// named as in Hugging Face's GPT2LMHeadModel ("transformer.wte.weight", "transformer.h.0.ln_1.weight",
/// ..., "lm_head.weight" tied to "transformer.wte.weight").
inline std::vector<parameter_spec> gpt2_parameters(int layers, std::uint64_t d_model, std::uint64_t vocab = 50257,
                                                   std::uint64_t context = 1024) {
  std::vector<parameter_spec> p;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape, std::string unit, std::string tie = {}) {
    parameter_spec s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.unit = std::move(unit);
    s.tie_group = std::move(tie);
    p.push_back(std::move(s));
  };
  const std::uint64_t d = d_model;
  add("transformer.wte.weight", {vocab, d}, "embeddings", "wte");
  add("transformer.wpe.weight", {context, d}, "embeddings");
  for (int i = 0; i < layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    const std::string unit = "transformer.h." + std::to_string(i);
    add(h + "ln_1.weight", {d}, unit);
    add(h + "ln_1.bias", {d}, unit);
    add(h + "attn.c_attn.weight", {d, 3 * d}, unit);
    add(h + "attn.c_attn.bias", {3 * d}, unit);
    add(h + "attn.c_proj.weight", {d, d}, unit);
    add(h + "attn.c_proj.bias", {d}, unit);
    add(h + "ln_2.weight", {d}, unit);
    add(h + "ln_2.bias", {d}, unit);
    add(h + "mlp.c_fc.weight", {d, 4 * d}, unit);
    add(h + "mlp.c_fc.bias", {4 * d}, unit);
    add(h + "mlp.c_proj.weight", {4 * d, d}, unit);
    add(h + "mlp.c_proj.bias", {d}, unit);
  }
  add("transformer.ln_f.weight", {d}, "head");
  add("transformer.ln_f.bias", {d}, "head");
  add("lm_head.weight", {vocab, d}, "head", "wte");
  return p;
}

/// A LLaMA-style decoder named as in Hugging Face's LlamaForCausalLM: `layers` blocks of width
/// `d_model` with SwiGLU width `ffn`, vocabulary `vocab`, untied output projection; key and value
/// projections of width `kv_width` (grouped-query attention; 0: `d_model`, full multi-head).
inline std::vector<parameter_spec> llama_parameters(int layers, std::uint64_t d_model, std::uint64_t ffn,
                                                    std::uint64_t vocab, std::uint64_t kv_width = 0) {
  std::vector<parameter_spec> p;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape, std::string unit) {
    parameter_spec s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.unit = std::move(unit);
    p.push_back(std::move(s));
  };
  const std::uint64_t d = d_model, kv = kv_width == 0 ? d_model : kv_width;
  add("model.embed_tokens.weight", {vocab, d}, "embeddings");
  for (int i = 0; i < layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    const std::string unit = "model.layers." + std::to_string(i);
    add(l + "self_attn.q_proj.weight", {d, d}, unit);
    add(l + "self_attn.k_proj.weight", {kv, d}, unit);
    add(l + "self_attn.v_proj.weight", {kv, d}, unit);
    add(l + "self_attn.o_proj.weight", {d, d}, unit);
    add(l + "mlp.gate_proj.weight", {ffn, d}, unit);
    add(l + "mlp.up_proj.weight", {ffn, d}, unit);
    add(l + "mlp.down_proj.weight", {d, ffn}, unit);
    add(l + "input_layernorm.weight", {d}, unit);
    add(l + "post_attention_layernorm.weight", {d}, unit);
  }
  add("model.norm.weight", {d}, "head");
  add("lm_head.weight", {vocab, d}, "head");
  return p;
}

/// Names accepted by `preset_parameters`.
inline constexpr std::array<std::string_view, 6> preset_names = {"gpt2",    "gpt2-medium", "gpt2-large",
                                                                 "gpt2-xl", "llama-7b",    "llama-70b"};

/// The parameters of preset `name` ("gpt2" is GPT-2 small; see `preset_names`), or std::nullopt
/// for an unknown name.
inline std::optional<std::vector<parameter_spec>> preset_parameters(std::string_view name) {
  if (name == "gpt2" || name == "gpt2-small") return gpt2_parameters(12, 768);
  if (name == "gpt2-medium") return gpt2_parameters(24, 1024);
  if (name == "gpt2-large") return gpt2_parameters(36, 1280);
  if (name == "gpt2-xl") return gpt2_parameters(48, 1600);
  if (name == "llama-7b") return llama_parameters(32, 4096, 11008, 32000);
  // Llama 2 70B: 8 key-value heads of 128 (grouped-query attention), 68,976,648,192 parameters.
  if (name == "llama-70b") return llama_parameters(80, 8192, 28672, 32000, 1024);
  return std::nullopt;
}

}  // namespace ringzero::zero
