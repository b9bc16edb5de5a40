// ringzero-ckpt: inspects, verifies, consolidates and reshards ringzero checkpoints
// (include/ringzero/checkpoint/, docs/checkpoint.md) without a job or a GPU.
//
//   ringzero-ckpt inspect run/ckpt                 tensors, shapes, dtypes, roles, ranks, sizes
//   ringzero-ckpt inspect run/ckpt --json          the same as JSON
//   ringzero-ckpt verify run/ckpt                  the index's own checksum and model fingerprint, every
//                                                  fragment's checksums; exit 1 naming each damaged one
//   ringzero-ckpt consolidate run/ckpt -o model.safetensors [--dtype bfloat16] [--max-shard-size 5GB] [--force]
//   ringzero-ckpt reshard run/ckpt --world-size 8 [--stage 3] -o run/ckpt-8
//
// DIR is a checkpoint directory (it holds index.json) or a root whose `latest` names one (without
// `latest`, the newest complete checkpoint in it, which the tool names on stderr). Inputs are
// opened without blocking and must be regular files; consolidate's output must be absent or a
// regular file (a symbolic link only with --force), and a failure leaves no file behind.
// Exit status: 0 on success; 1 for a damaged or unreadable checkpoint, a failed write or a bad
// option value; CLI11's status (106, 109, ...) for an unknown or missing option.

#include <fmt/core.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ringzero/checkpoint/checkpoint_directory.hpp"
#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/consolidate.hpp"
#include "ringzero/checkpoint/fragment_reader.hpp"
#include "ringzero/checkpoint/offline_reshard.hpp"
#include "ringzero/checkpoint/safetensors.hpp"

namespace {

namespace ck = ringzero::checkpoint;
namespace fs = std::filesystem;
using ringzero::dtype;

/// A bad option value: printed as "ringzero-ckpt: error: ...", exit status 1.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// "1.50 GiB", "512 B".
std::string human(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, units[u]);
}

/// A size as Hugging Face's max_shard_size writes it: "5GB" (10^9), "500MiB" (2^20), "4096"
/// (bytes); KB/MB/GB/TB are decimal, KiB/MiB/GiB/TiB binary; case-insensitive; a fraction allowed.
std::uint64_t parse_size(const std::string& text, const std::string& option) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  std::string unit;
  for (std::size_t k = i; k < text.size(); ++k)
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[k])));
  char* end = nullptr;
  const double v = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(v))
    throw usage_error(option + " '" + text + "' is not a size (examples: 5GB, 500MiB, 1048576)");
  const std::pair<const char*, double> table[] = {{"", 1},         {"b", 1},       {"kb", 1e3},     {"mb", 1e6},
                                                  {"gb", 1e9},     {"tb", 1e12},   {"kib", 0x1p10}, {"mib", 0x1p20},
                                                  {"gib", 0x1p30}, {"tib", 0x1p40}};
  for (const auto& [name, scale] : table)
    if (unit == name) {
      const double bytes = std::floor(v * scale);
      if (bytes < 1 || bytes >= 0x1p63) throw usage_error(option + " '" + text + "' must be from 1 byte to 2^63 bytes");
      return static_cast<std::uint64_t>(bytes);
    }
  throw usage_error("unknown size unit '" + unit + "' in " + option + " '" + text +
                    "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

std::string shape_text(const std::vector<std::uint64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string role_text(const ck::tensor_record& t) {
  if (t.role != ck::tensor_role::optimizer_state) return std::string(ck::role_name(t.role));
  return fmt::format("state {} ({})", t.state, t.state_name);
}

// ---------------------------------------------------------------- inspect

nlohmann::ordered_json inspect_json(const fs::path& dir, const ck::checkpoint_index& x) {
  nlohmann::ordered_json j;
  j["directory"] = dir.string();
  j["format_version"] = x.version;
  j["kind"] = x.kind;
  j["world_size"] = x.world_size;
  j["stage"] = x.stage;
  j["replica_group_size"] = x.replica_group_size;
  j["alignment_bytes"] = x.alignment_bytes;
  j["plan_fingerprint"] = ck::hex64(x.plan_fingerprint);
  j["model_fingerprint"] = ck::hex64(x.model_fingerprint);
  j["progress"] = x.progress.to_json();
  j["optimizer"] = x.optimizer;
  std::uint64_t total = 0;
  for (const auto& f : x.files) total += f.bytes;
  j["total_file_bytes"] = total;
  j["files"] = nlohmann::ordered_json::array();
  for (const auto& f : x.files) j["files"].push_back({{"rank", f.rank}, {"name", f.name}, {"bytes", f.bytes}});
  j["tensors"] = nlohmann::ordered_json::array();
  for (const auto& t : x.tensors) {
    nlohmann::ordered_json e;
    e["name"] = t.name;
    e["role"] = std::string(ck::role_name(t.role));
    if (t.role == ck::tensor_role::optimizer_state) {
      e["state"] = t.state;
      e["state_name"] = t.state_name;
    }
    e["dtype"] = std::string(ringzero::dtype_name(t.type));
    e["shape"] = t.shape;
    e["elements"] = t.numel();
    e["bytes"] = t.numel() * ringzero::dtype_size(t.type);
    e["trainable"] = t.trainable;
    if (!t.tied_to.empty()) e["tied_to"] = t.tied_to;
    e["fragments"] = nlohmann::ordered_json::array();
    for (const auto& f : t.fragments)
      e["fragments"].push_back({{"rank", x.files[f.file].rank},
                                {"file", x.files[f.file].name},
                                {"begin", f.begin},
                                {"end", f.end},
                                {"offset", f.offset},
                                {"bytes", (f.end - f.begin) * ringzero::dtype_size(t.type)}});
    j["tensors"].push_back(std::move(e));
  }
  return j;
}

void print_inspect(const fs::path& dir, const ck::checkpoint_index& x) {
  std::uint64_t total = 0;
  for (const auto& f : x.files) total += f.bytes;
  fmt::print("checkpoint {}\n", dir.string());
  fmt::print("  format version {}, kind {}, saved by {} rank(s)", x.version, x.kind, x.world_size);
  if (x.kind == "zero")
    fmt::print(" at stage {} (replica group size {}, alignment {} B)", x.stage, x.replica_group_size,
               x.alignment_bytes);
  fmt::print("\n  plan fingerprint {}, model fingerprint {}\n", ck::hex64(x.plan_fingerprint),
             ck::hex64(x.model_fingerprint));
  const ck::training_progress& p = x.progress;
  fmt::print("  progress: {} optimizer step(s), epoch {}, step {} of the epoch, loss scale {}, RNG seeds [{}]\n",
             p.optimizer_steps, p.epoch, p.step_in_epoch,
             p.loss_scale ? fmt::format("{}", *p.loss_scale) : std::string("none"), fmt::join(p.rng_seeds, ", "));
  for (const auto& [k, v] : p.metadata) fmt::print("  metadata {} = {}\n", k, v);
  fmt::print("  optimizer: {}\n", x.optimizer.dump());
  fmt::print("  {} file(s), {} ({} bytes):\n", x.files.size(), human(total), total);
  for (const auto& f : x.files)
    fmt::print("    rank {:>4}  {}  {} ({} bytes)\n", f.rank, f.name, human(f.bytes), f.bytes);
  std::size_t w_name = 4, w_role = 4, w_shape = 5;
  for (const auto& t : x.tensors) {
    w_name = std::max(w_name, t.name.size());
    w_role = std::max(w_role, role_text(t).size());
    w_shape = std::max(w_shape, shape_text(t.shape).size());
  }
  fmt::print("  {} tensor(s):\n", x.tensors.size());
  fmt::print("    {:<{}}  {:<{}}  {:<8}  {:<{}}  {:>12}  {:>12}  {}\n", "name", w_name, "role", w_role, "dtype",
             "shape", w_shape, "elements", "bytes", "fragments (rank: [begin, end))");
  for (const auto& t : x.tensors) {
    std::string where;
    if (!t.tied_to.empty()) where = "tied to '" + t.tied_to + "' (no data of its own)";
    for (const auto& f : t.fragments)
      where += fmt::format("{}{}: [{}, {})", where.empty() ? "" : ", ", x.files[f.file].rank, f.begin, f.end);
    if (t.fragments.empty() && t.tied_to.empty()) where = "(no elements)";
    if (!t.trainable && t.role == ck::tensor_role::parameter) where += "  [frozen]";
    fmt::print("    {:<{}}  {:<{}}  {:<8}  {:<{}}  {:>12}  {:>12}  {}\n", t.name, w_name, role_text(t), w_role,
               ringzero::dtype_name(t.type), shape_text(t.shape), w_shape, t.numel(),
               t.numel() * ringzero::dtype_size(t.type), where);
  }
}

// ---------------------------------------------------------------- verify

/// Checks every file (present, of the indexed size, its safetensors header listing each
/// fragment at the indexed offset) and every fragment's checksums; prints each problem. Returns
/// the number of problems.
std::size_t verify(const fs::path& dir, const ck::checkpoint_index& x, std::uint64_t& bytes_checked) {
  std::size_t problems = 0;
  // The index itself: its own checksum was checked by read_index; its tensors must give its model fingerprint.
  if (x.computed_model_fingerprint() != x.model_fingerprint) {
    ++problems;
    fmt::print("DAMAGED index '{}': its tensors give the model fingerprint {}, it records {} (edited after the save)\n",
               (dir / ck::index_file_name).string(), ck::hex64(x.computed_model_fingerprint()),
               ck::hex64(x.model_fingerprint));
  }
  std::vector<bool> file_ok(x.files.size(), true);
  for (std::size_t i = 0; i < x.files.size(); ++i) {
    const ck::file_record& r = x.files[i];
    const fs::path path = dir / r.name;
    try {
      const ck::safetensors_header h = ck::read_safetensors_header(path);
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != r.bytes)
        throw ringzero::error(ringzero::errc::io_error,
                              fmt::format("it has {} bytes, the index expects {}", st.st_size, r.bytes));
      for (const auto& t : x.tensors)
        for (const auto& f : t.fragments) {
          if (f.file != i) continue;
          const std::string key = ck::fragment_key(t.name, t.role, t.state, f.begin, f.end);
          const ck::safetensors_tensor* s = h.find(key);
          const std::uint64_t bytes = (f.end - f.begin) * ringzero::dtype_size(t.type);
          if (s == nullptr || s->begin != f.offset || s->end - s->begin != bytes || s->type != t.type)
            throw ringzero::error(ringzero::errc::io_error,
                                  fmt::format("its safetensors header does not hold fragment '{}' ({} bytes of {} at "
                                              "offset {}) as the index says",
                                              key, bytes, ck::safetensors_dtype(t.type), f.offset));
        }
    } catch (const ringzero::error& e) {
      file_ok[i] = false;
      ++problems;
      fmt::print("DAMAGED file '{}' of rank {}: {}\n", path.string(), r.rank, e.message());
    }
  }
  ck::fragment_reader reader(dir, x);
  std::vector<unsigned char> buffer(static_cast<std::size_t>(4 * ck::checksum_chunk_bytes));
  std::size_t fragments = 0;
  for (const auto& t : x.tensors)
    for (const auto& f : t.fragments) {
      ++fragments;
      const ck::file_record& r = x.files[f.file];
      if (!file_ok[f.file]) continue;
      const std::uint64_t es = ringzero::dtype_size(t.type), step = buffer.size() / es;
      try {
        for (std::uint64_t b = f.begin; b < f.end; b += step)
          reader.read(t, b, std::min(f.end, b + step), buffer.data());
      } catch (const ringzero::error& e) {
        ++problems;
        fmt::print("DAMAGED fragment '{}' of tensor {} in file '{}' of rank {}: {}\n",
                   ck::fragment_key(t.name, t.role, t.state, f.begin, f.end), t.label(), (dir / r.name).string(),
                   r.rank, e.message());
      }
    }
  bytes_checked = reader.bytes_read();
  fmt::print("{}: {} file(s), {} fragment(s) of {} tensor(s), {} verified: {}\n", dir.string(), x.files.size(),
             fragments, x.tensors.size(), human(bytes_checked),
             problems == 0 ? "every checksum matches" : fmt::format("{} problem(s)", problems));
  return problems;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringzero-ckpt: inspect, verify, consolidate and reshard ringzero checkpoints"};
  app.require_subcommand(1);
  std::string dir;
  bool json = false;
  auto* inspect =
      app.add_subcommand("inspect", "list the tensors (shapes, dtypes, roles), the ranks' files and their sizes");
  inspect->add_option("DIR", dir, "checkpoint directory, or a root whose 'latest' names one")->required();
  inspect->add_flag("--json", json, "print JSON instead of tables");
  auto* verify_cmd =
      app.add_subcommand("verify", "read every fragment and check every checksum (exit 1 naming each damaged one)");
  verify_cmd->add_option("DIR", dir, "checkpoint directory, or a root whose 'latest' names one")->required();
  std::string output, dtype_text, max_shard;
  auto* consolidate = app.add_subcommand("consolidate", "write the full parameters by name into safetensors file(s)");
  consolidate->add_option("DIR", dir, "checkpoint directory, or a root whose 'latest' names one")->required();
  consolidate->add_option("-o,--output", output, "the safetensors file to write, e.g. model.safetensors")->required();
  consolidate->add_option("--dtype", dtype_text, "convert floating-point parameters to bfloat16, float16 or float32")
      ->check(CLI::IsMember({"bfloat16", "float16", "float32"}));
  consolidate->add_option(
      "--max-shard-size", max_shard,
      "split into files of at most this much tensor data (e.g. 5GB, 500MiB) with a Hugging Face index");
  bool force = false;
  consolidate->add_flag("--force", force,
                        "an output that is a symbolic link: write the file it points to (refused otherwise)");
  int world_size = 0, stage = -1, replica_group = -1;
  auto* reshard =
      app.add_subcommand("reshard", "rewrite the checkpoint as saved by another number of ranks (and stage)");
  reshard->add_option("DIR", dir, "checkpoint directory, or a root whose 'latest' names one")->required();
  reshard->add_option("-o,--output", output, "the new checkpoint root (gets NAME/ and 'latest')")->required();
  reshard->add_option("--world-size", world_size, "ranks of the new checkpoint")
      ->required()
      ->check(CLI::Range(1, 1 << 24));
  reshard->add_option("--stage", stage, "ZeRO stage of the new checkpoint (default: the saved one)")
      ->check(CLI::Range(0, 3));
  reshard
      ->add_option("--replica-group-size", replica_group,
                   "ranks per replica group (hybrid sharding; default: all ranks)")
      ->check(CLI::Range(0, 1 << 24));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return dynamic_cast<const CLI::ValidationError*>(&e) || dynamic_cast<const CLI::ConversionError*>(&e) ? 1 : status;
  }

  try {
    // Without `latest`, the newest complete checkpoint in DIR: say which, on stderr.
    const ck::found_checkpoint found = ck::find_checkpoint(dir);
    if (!found.note.empty()) fmt::print(stderr, "ringzero-ckpt: note: {}\n", found.note);
    if (inspect->parsed()) {
      const fs::path& d = found.directory;
      const ck::checkpoint_index x = ck::read_index(d);
      if (json)
        fmt::print("{}\n", inspect_json(d, x).dump(2));
      else
        print_inspect(d, x);
      return 0;
    }
    if (verify_cmd->parsed()) {
      const fs::path& d = found.directory;
      const ck::checkpoint_index x = ck::read_index(d);
      std::uint64_t bytes = 0;
      return verify(d, x, bytes) == 0 ? 0 : 1;
    }
    if (consolidate->parsed()) {
      ck::consolidate_options o;
      if (!dtype_text.empty()) o.type = ringzero::parse_dtype(dtype_text);
      if (!max_shard.empty()) o.max_shard_bytes = parse_size(max_shard, "--max-shard-size");
      o.follow_symlink = force;
      const ck::consolidate_result r = ck::consolidate(found.directory, output, o);
      for (const auto& f : r.files) fmt::print("wrote {}\n", f.string());
      if (r.index_file) fmt::print("wrote {}\n", r.index_file->string());
      fmt::print("{} parameter(s), {} of tensor data in {} file(s){}; {} of the checkpoint read and verified\n",
                 r.tensors, human(r.total_bytes), r.files.size(), dtype_text.empty() ? "" : " as " + dtype_text,
                 human(r.bytes_read));
      return 0;
    }
    if (reshard->parsed()) {
      ck::reshard_options o;
      o.world_size = world_size;
      if (stage >= 0) o.stage = stage;
      if (replica_group >= 0) o.replica_group_size = replica_group;
      const ck::reshard_result r = ck::reshard_offline(found.directory, output, o);
      fmt::print("wrote {}: {} rank file(s){}{}\n", r.directory.string(), r.index.world_size,
                 r.index.kind == "zero" ? fmt::format(", stage {}", r.index.stage) : "",
                 r.exact_plan ? "" : " (the index records no plan request: automatic gather units)");
      return 0;
    }
  } catch (const usage_error& e) {
    fmt::print(stderr, "ringzero-ckpt: error: {}\n", e.what());
    return 1;
  } catch (const ringzero::error& e) {
    fmt::print(stderr, "ringzero-ckpt: error: {}\n", e.message());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ringzero-ckpt: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
