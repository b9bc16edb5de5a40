// ringzero-consolidate-bench: the time and peak memory of `ringzero-ckpt consolidate` on a
// synthetic checkpoint (issue 18's target: peak RSS below 2 x the largest tensor + 64 MiB,
// whatever the model size). It writes a checkpoint of --total-mib MiB of float32 parameters by
// --ranks ranks (each tensor split evenly over the ranks, as a stage-3 save splits it), with one
// tensor of --largest-mib MiB and the rest in tensors of half, a quarter, ... of it, then runs
// the tool as a child process (fork + exec) and reads the child's wall time and peak resident set
// size (wait4's ru_maxrss, which also covers the tool's start-up). Files written just before are in
// the page cache: the time is that of a warm read (verification, conversion, writing).
//
//   ringzero-consolidate-bench --dir /scratch/ckbench --tool tools/ringzero-ckpt
//   ringzero-consolidate-bench --dir /scratch/ckbench --tool tools/ringzero-ckpt --total-mib 2048 --largest-mib 1024
//   --dtype bfloat16
// Results: docs/performance.md, "Checkpoint consolidation".

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ringzero/checkpoint/checkpoint_directory.hpp"
#include "ringzero/checkpoint/state_layout.hpp"

namespace {

namespace ck = ringzero::checkpoint;
namespace fs = std::filesystem;

/// Writes the synthetic checkpoint ROOT/synthetic; returns its largest tensor's bytes.
std::uint64_t write_checkpoint(const fs::path& root, int ranks, std::uint64_t total, std::uint64_t largest) {
  ck::state_layout L;
  L.kind = "zero";
  L.world_size = ranks;
  L.stage = 3;
  L.replica_group_size = ranks;
  L.optimizer = {{"kind", "adamw"}};
  std::uint64_t left = total, size = largest;
  for (int k = 0; left > 0; ++k) {
    const std::uint64_t bytes = std::min(left, size);
    ck::tensor_spec t;
    t.name = fmt::format("layers.{}.weight", k);
    t.shape = {bytes / 4 / 1024, 1024};
    if (t.shape[0] == 0) break;
    L.tensors.push_back(t);
    left -= t.numel() * 4;
    if (size > (std::uint64_t{1} << 20)) size /= 2;
  }
  L.pieces.resize(static_cast<std::size_t>(ranks));
  const auto w = static_cast<std::uint64_t>(ranks);
  for (std::size_t t = 0; t < L.tensors.size(); ++t) {
    const std::uint64_t n = L.tensors[t].numel();
    for (std::uint64_t r = 0; r < w; ++r) {
      const std::uint64_t b = n / w * r + std::min(r, n % w), e = n / w * (r + 1) + std::min(r + 1, n % w);
      if (b < e) L.pieces[r].push_back({t, b, e});
    }
  }
  const fs::path tmp = ck::temporary_directory(root, "synthetic");
  ck::detail::make_directories(tmp);
  std::vector<std::vector<std::uint64_t>> sums(w);
  std::vector<float> values;
  for (int r = 0; r < ranks; ++r) {
    const ck::shard_file_layout fl = ck::make_shard_file_layout(L, r);
    ck::detail::file f = ck::detail::file::create(tmp / ck::shard_file_name(r, ranks));
    f.write_at(fl.header.data(), fl.header.size(), 0);
    const auto& mine = L.pieces[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < mine.size(); ++k) {
      values.resize(static_cast<std::size_t>(mine[k].end - mine[k].begin));
      for (std::size_t j = 0; j < values.size(); ++j)
        values[j] = static_cast<float>((mine[k].begin + j) * 2654435761u % 1000003u) * 1e-6f - 0.5f;
      const std::vector<std::uint64_t> s = ck::chunk_checksums(values.data(), values.size() * 4);
      sums[static_cast<std::size_t>(r)].insert(sums[static_cast<std::size_t>(r)].end(), s.begin(), s.end());
      f.write_at(values.data(), values.size() * 4, fl.offsets[k]);
    }
    f.sync();
    f.close();
  }
  ck::commit_checkpoint(root, "synthetic", ck::make_index(L, {}, sums), 0);
  std::uint64_t big = 0;
  for (const auto& t : L.tensors) big = std::max(big, t.numel() * 4);
  return big;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"time and peak memory of ringzero-ckpt consolidate on a synthetic checkpoint"};
  std::string dir, tool, dtype, max_shard;
  int ranks = 2;
  std::uint64_t total_mib = 1280, largest_mib = 512;
  bool keep = false;
  app.add_option("--dir", dir, "scratch directory (created; the checkpoint and the output go there)")->required();
  app.add_option("--tool", tool, "the ringzero-ckpt program")->required()->check(CLI::ExistingFile);
  app.add_option("--ranks", ranks, "ranks that 'saved' it")->check(CLI::Range(1, 1024));
  app.add_option("--total-mib", total_mib, "MiB of float32 parameters")->check(CLI::Range(1, 1 << 20));
  app.add_option("--largest-mib", largest_mib, "MiB of the largest tensor")->check(CLI::Range(1, 1 << 20));
  app.add_option("--dtype", dtype, "passed to consolidate --dtype");
  app.add_option("--max-shard-size", max_shard, "passed to consolidate --max-shard-size");
  app.add_flag("--keep", keep, "keep the files");
  CLI11_PARSE(app, argc, argv);

  try {
    const fs::path root = fs::path(dir) / "checkpoint";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const auto g0 = std::chrono::steady_clock::now();
    const std::uint64_t largest = write_checkpoint(root, ranks, total_mib << 20, largest_mib << 20);
    const double gen = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();

    const std::string out = (fs::path(dir) / "model.safetensors").string();
    std::vector<std::string> args = {tool, "consolidate", root.string(), "-o", out};
    if (!dtype.empty()) args.insert(args.end(), {"--dtype", dtype});
    if (!max_shard.empty()) args.insert(args.end(), {"--max-shard-size", max_shard});
    std::vector<char*> argv_child;
    for (auto& a : args) argv_child.push_back(a.data());
    argv_child.push_back(nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    // fork + exec, not posix_spawn: a vfork-like child shares this process's memory until exec,
    // and Linux then counts this process's peak (the generator's buffers) in the child's ru_maxrss.
    const pid_t pid = ::fork();
    if (pid < 0) throw ringzero::error(ringzero::errc::io_error, "cannot fork");
    if (pid == 0) {
      ::execv(tool.c_str(), argv_child.data());
      ::_exit(127);
    }
    int status = 0;
    struct rusage usage {};
    if (wait4(pid, &status, 0, &usage) != pid) throw ringzero::error(ringzero::errc::io_error, "wait4 failed");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw ringzero::error(ringzero::errc::io_error,
                            fmt::format("{} exited with status {}", tool, WEXITSTATUS(status)));
    const double peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
    const double target_mib = 2.0 * static_cast<double>(largest >> 20) + 64.0;
    fmt::print(
        "checkpoint: {} MiB of float32 parameters in {} rank files, largest tensor {} MiB (written in {:.1f} s)\n",
        total_mib, ranks, largest >> 20, gen);
    fmt::print(
        "consolidate{}{}: {:.2f} s, {:.0f} MiB/s of parameters; peak RSS {:.1f} MiB (target < 2 x {} MiB + 64 MiB = "
        "{:.0f} MiB: {})\n",
        dtype.empty() ? "" : " --dtype " + dtype, max_shard.empty() ? "" : " --max-shard-size " + max_shard, seconds,
        static_cast<double>(total_mib) / seconds, peak_mib, largest >> 20, target_mib,
        peak_mib < target_mib ? "met" : "MISSED");
    if (!keep) fs::remove_all(dir);
    return peak_mib < target_mib ? 0 : 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ringzero-consolidate-bench: {}\n", e.what());
    return 1;
  }
}
