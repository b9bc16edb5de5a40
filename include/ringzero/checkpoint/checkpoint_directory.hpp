#pragma once
/// @file
/// `checkpoint::commit_checkpoint` and `resolve_checkpoint`: the directory protocol that makes a
/// save atomic. Under a root directory, checkpoint NAME is written as follows:
/// 1. every rank writes and fsyncs its shard file in ROOT/.tmp.NAME/;
/// 2. once every rank has (the save's agreement collective), rank 0 writes index.json there and
///    ROOT/.tmp.NAME.latest (the new `latest`), fsyncs both and ROOT/.tmp.NAME at once;
/// 3. renames ROOT/.tmp.NAME to ROOT/NAME (exchanging it atomically with an older ROOT/NAME,
///    then removed), fsyncs ROOT, then renames ROOT/.tmp.NAME.latest to ROOT/latest and fsyncs
///    ROOT again (so `latest` never names a directory whose rename a power loss could undo);
/// 4. with keep_last N, older complete checkpoints beyond the newest N are renamed to
///    ROOT/.trash.* and removed — only now, after the new one is complete.
/// A process killed at any moment leaves the previous checkpoint whole and `latest` naming it:
/// a checkpoint directory whose name does not start with '.' is complete by construction, and
/// `latest` only ever names one. Directories starting with '.' are never taken as checkpoints.
/// Errors: errc::io_error naming the file; errc::invalid_argument for a bad name. Rank 0, one
/// thread; two jobs must not save into one root at once: a `checkpointer` holds the root's lock
/// (checkpoint/root_lock.hpp) from its first save on. Needs `ringzero-checkpoint`.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/file_io.hpp"

namespace ringzero::checkpoint {

/// The name of the pointer file in a root directory.
inline constexpr std::string_view latest_file_name = "latest";

/// "step-00000010": the default name of a checkpoint taken after `steps` optimizer steps.
inline std::string default_checkpoint_name(std::uint64_t steps) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08llu", static_cast<unsigned long long>(steps));
  return buf;
}

/// Throws errc::invalid_argument unless `name` can name a checkpoint directory: non-empty, at
/// most 200 characters, no '/', not starting with '.', not "latest".
inline void check_checkpoint_name(const std::string& name) {
  if (name.empty() || name.size() > 200 || name.find('/') != std::string::npos || name.front() == '.' ||
      name == latest_file_name || name.find('\0') != std::string::npos)
    throw error(errc::invalid_argument,
                "checkpoint name '" + (name.size() > 80 ? name.substr(0, 80) + "..." : name) +
                    "' is not usable: it must be a plain directory name (no '/', not starting with '.', not 'latest')");
}

/// Where the ranks write checkpoint `name` before it is complete.
inline std::filesystem::path temporary_directory(const std::filesystem::path& root, const std::string& name) {
  return root / (".tmp." + name);
}

/// The checkpoint `latest` names in `root`, or std::nullopt when there is no pointer yet.
inline std::optional<std::string> read_latest(const std::filesystem::path& root) {
  const std::filesystem::path p = root / latest_file_name;
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return std::nullopt;
  std::string s = detail::read_whole_file(p, 256);  // a name of at most 200 characters and a newline
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  check_checkpoint_name(s);
  return s;
}

/// The complete checkpoints in `root`, oldest first (by optimizer steps, epoch, step in epoch, name).
inline std::vector<std::string> complete_checkpoints(const std::filesystem::path& root);

/// Where `find_checkpoint` found a checkpoint.
struct found_checkpoint {
  std::filesystem::path directory;  ///< the checkpoint directory (it holds index.json)
  /// Empty when `path` was the checkpoint or its root's `latest` named it; otherwise why another
  /// was taken ("'R' has no 'latest' pointer (a run stopped before its first one): took the
  /// newest complete checkpoint 'step-00000010'"), for the caller to print.
  std::string note;
};

/// The checkpoint directory `path` stands for: `path` itself when it holds an index.json, else
/// the checkpoint its `latest` file names, else (no `latest`: a run killed between its first
/// checkpoint's rename and its first `latest`) the newest complete checkpoint in `path` whose
/// index reads and whose files are all present at their indexed sizes, with a note saying so.
/// Throws errc::io_error when there is none, or when `latest` names a checkpoint without an
/// index, or is not a regular file (a FIFO is refused at once, never opened for a blocking read).
inline found_checkpoint find_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(path / index_file_name, ec)) return {path, {}};
  const std::optional<std::string> latest = read_latest(path);
  if (!latest) {
    std::vector<std::string> all;
    if (std::filesystem::is_directory(path, ec)) all = complete_checkpoints(path);
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const std::filesystem::path dir = path / *it;
      try {
        const checkpoint_index x = read_index(dir);
        for (const file_record& f : x.files) {
          std::error_code fe;
          const std::filesystem::path file = dir / f.name;
          if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(file, fe)) ||
              std::filesystem::file_size(file, fe) != f.bytes || fe)
            throw error(errc::io_error, "file '" + f.name + "' is missing or of another size");
        }
      } catch (const error&) {
        continue;  // incomplete or damaged: an older one may still be whole
      }
      return {dir, "'" + path.string() + "' has no '" + std::string(latest_file_name) +
                       "' pointer (a run stopped before writing its first one): took the newest complete "
                       "checkpoint '" +
                       *it + "'"};
    }
    throw error(errc::io_error, "'" + path.string() + "' holds no complete checkpoint: neither " +
                                    std::string(index_file_name) + " nor a '" + std::string(latest_file_name) +
                                    "' pointer, nor a checkpoint directory with a readable index and all its files");
  }
  const std::filesystem::path dir = path / *latest;
  if (!std::filesystem::exists(dir / index_file_name, ec))
    throw error(errc::io_error, "'" + (path / latest_file_name).string() + "' names checkpoint '" + *latest +
                                    "', which has no " + std::string(index_file_name));
  return {dir, {}};
}

/// `find_checkpoint(path).directory`.
inline std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  return find_checkpoint(path).directory;
}

/// Removes what interrupted saves left in `root`: ".tmp.*" (unfinished checkpoints and
/// `latest` pointers) and ".trash.*" (old checkpoints being removed). Only for the holder of the
/// root's lock (checkpoint/root_lock.hpp), before its first save: no other saver can be writing
/// them. Returns the names removed. Errors: errc::io_error naming the entry.
inline std::vector<std::string> remove_leftovers(const std::filesystem::path& root) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(".tmp.") && !name.starts_with(".trash.")) continue;
    detail::remove_tree(entry.path());
    removed.push_back(name);
  }
  if (ec) detail::io_fail("cannot list", root, ec.value());
  return removed;
}

inline std::vector<std::string> complete_checkpoints(const std::filesystem::path& root) {
  std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.front() == '.' || !entry.is_directory(ec)) continue;
    if (!std::filesystem::exists(entry.path() / index_file_name, ec)) continue;
    try {
      const checkpoint_index x = read_index(entry.path());
      found.emplace_back(x.progress.optimizer_steps, x.progress.epoch, x.progress.step_in_epoch, name);
    } catch (const error&) {
      continue;  // not one of ours, or damaged: never removed automatically
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::get<3>(f));
  return out;
}

/// Where rank 0 writes the new `latest` of checkpoint `name` before renaming it into place.
inline std::filesystem::path latest_temporary_file(const std::filesystem::path& root, const std::string& name) {
  return root / (".tmp." + name + ".latest");
}

/// Step 2-4 of the protocol (see the file comment), on rank 0 after every rank's file is
/// written: writes `index` into ROOT/.tmp.NAME, makes it ROOT/NAME, points `latest` at it and
/// keeps the newest `keep_last` complete checkpoints (0: all).
inline void commit_checkpoint(const std::filesystem::path& root, const std::string& name, const checkpoint_index& index,
                              int keep_last) {
  const std::filesystem::path tmp = temporary_directory(root, name);
  const std::filesystem::path latest_tmp = latest_temporary_file(root, name);
  const std::string text = index.to_json().dump(1);
  const std::string pointer = name + "\n";
  detail::file index_file = detail::file::create(tmp / index_file_name);
  index_file.write_at(text.data(), text.size(), 0);
  detail::file latest_file = detail::file::create(latest_tmp);
  latest_file.write_at(pointer.data(), pointer.size(), 0);
  // Files a crashed earlier attempt at the same name may have left (another world size).
  std::set<std::string> wanted{std::string(index_file_name)};
  for (const auto& f : index.files) wanted.insert(f.name);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, ec))
    if (!wanted.contains(entry.path().filename().string())) detail::remove_tree(entry.path());
  if (ec) detail::io_fail("cannot list", tmp, ec.value());
  // One round of fsyncs, side by side: a journaling file system commits them together.
  detail::file tmp_dir = detail::file::open_directory(tmp);
  detail::sync_all({&index_file, &latest_file, &tmp_dir});
  index_file.close();
  latest_file.close();
  tmp_dir.close();
  const std::filesystem::path final_dir = root / name;
  const bool exchanged = detail::rename_or_exchange(tmp, final_dir);  // then tmp holds the older NAME
  // The new NAME is durable before `latest` can name it, on any file system (no reliance on a
  // journal that orders metadata): one fsync of ROOT after each rename.
  detail::sync_directory(root);
  const std::filesystem::path latest = root / latest_file_name;
  if (::rename(latest_tmp.c_str(), latest.c_str()) != 0)
    detail::io_fail("cannot rename '" + latest_tmp.string() + "' to", latest, errno);
  detail::sync_directory(root);
  if (exchanged) detail::remove_tree(tmp);
  for (const auto& entry : std::filesystem::directory_iterator(root, ec))
    if (entry.path().filename().string().starts_with(".trash.")) detail::remove_tree(entry.path());
  if (keep_last <= 0) return;
  std::vector<std::string> all = complete_checkpoints(root);
  all.erase(std::remove(all.begin(), all.end(), name), all.end());
  const std::size_t keep_others = static_cast<std::size_t>(keep_last - 1);
  if (all.size() <= keep_others) return;
  for (std::size_t i = 0; i + keep_others < all.size(); ++i) {
    const std::filesystem::path trash = root / (".trash." + all[i]);
    detail::remove_tree(trash);
    if (std::rename((root / all[i]).c_str(), trash.c_str()) != 0)
      detail::io_fail("cannot move old checkpoint", root / all[i], errno);
    detail::remove_tree(trash);
  }
  // No fsync here: a removal lost in a crash only brings an older complete checkpoint back.
}

}  // namespace ringzero::checkpoint
