#pragma once
/// @file
/// The --compress option the DDP trainers (examples 01 and 03) share: none, fp16, bf16 or
/// powersgd:R, its check, and the gradient reducer's communication hook it names
/// (ringzero/ddp/compression_hook.hpp, ringzero/ddp/powersgd_hook.hpp).

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "command_line.hpp"

#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/powersgd_hook.hpp"

namespace ringzero::examples {

/// The R of "powersgd:R" (R from 1 to 1024, decimal digits only), or 0 for any other text.
inline int powersgd_rank(const std::string& compress) {
  const std::string prefix = "powersgd:";
  if (compress.rfind(prefix, 0) != 0) return 0;
  const std::string r = compress.substr(prefix.size());
  if (r.empty() || r.size() > 4 || r.find_first_not_of("0123456789") != std::string::npos) return 0;
  const int v = std::stoi(r);
  return v >= 1 && v <= 1024 ? v : 0;
}

/// --compress: none, fp16, bf16 or powersgd:R (a refused value names itself and the choices).
inline CLI::Validator compress_check() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v == "none" || v == "fp16" || v == "bf16" || powersgd_rank(v) > 0) return {};
        return "'" + v + "' is not none, fp16, bf16 or powersgd:R with R a rank from 1 to 1024";
      },
      "none|fp16|bf16|powersgd:R");
}

/// Adds --compress (`compress_help` describes it) and --powersgd-start to `app`; after parsing,
/// --powersgd-start without --compress powersgd:R is refused (CLI11's validation error, exit
/// status 105) rather than silently ignored. Uses `app`'s final callback.
inline void add_compress_options(CLI::App& app, std::string& compress, std::uint64_t& powersgd_start,
                                 const std::string& compress_help) {
  app.add_option("--compress", compress, compress_help)->check(compress_check());
  CLI::Option* start =
      app.add_option("--powersgd-start", powersgd_start,
                     "--compress powersgd:R: optimizer steps all-reduced plainly before compression starts (default "
                     "100, about a tenth of example 01's default run on 2 ranks)")
          ->check(whole_number());
  app.callback([&compress, start] {
    if (start->count() > 0 && powersgd_rank(compress) == 0)
      throw CLI::ValidationError("--powersgd-start", "needs --compress powersgd:R (--compress is " + compress + ")");
  });
}

/// The hook --compress names (null: the reducer's default average); powersgd:R compresses after
/// `powersgd_start` plain steps, with error feedback and warm start (PyTorch's defaults).
inline std::shared_ptr<ddp::comm_hook> make_ddp_hook(const std::string& compress, std::uint64_t powersgd_start) {
  if (compress == "fp16") return ddp::fp16_compress_hook();
  if (compress == "bf16") return ddp::bf16_compress_hook();
  if (const int r = powersgd_rank(compress); r > 0) {
    ddp::powersgd_options p;
    p.matrix_approximation_rank = r;
    p.start_iteration = powersgd_start;
    return ddp::make_powersgd_hook(p);
  }
  return nullptr;
}

}  // namespace ringzero::examples
