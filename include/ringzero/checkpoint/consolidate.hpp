#pragma once
/// @file
/// `checkpoint::consolidate`: the full parameters of a checkpoint (any world size, stage, kind)
/// written by name into one safetensors file, or split as Hugging Face's `save_pretrained`
/// does (model-00001-of-00003.safetensors ... plus model.safetensors.index.json holding
/// {"metadata": {"total_size": bytes}, "weight_map": {name: file}}), for any tool that reads
/// safetensors. Every parameter is written under its own name: a tied parameter with the values
/// of its tie group's owner, a frozen one with its values. Optionally converted to
/// another floating dtype (round to nearest even). Streaming: the data moves through one buffer
/// of `buffer_bytes` (plus the reader's 4 MiB scratch), read fragment by fragment and verified,
/// so memory does not grow with the model. Files appear atomically (written as "<name>.tmp",
/// fsynced, renamed). Errors: errc::io_error / invalid_argument naming the file or tensor.
/// Needs nlohmann/json and libxxhash (`ringzero-checkpoint`). Manual: docs/checkpoint.md.

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/checkpoint/checkpoint_directory.hpp"
#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/fragment_reader.hpp"
#include "ringzero/checkpoint/pretrained.hpp"
#include "ringzero/checkpoint/safetensors.hpp"

namespace ringzero::checkpoint {

/// Options of `consolidate`.
struct consolidate_options {
  /// Convert every floating-point parameter to this dtype (float32, float16, bfloat16, float64);
  /// unset: each keeps its own. Integer parameters are never converted.
  std::optional<dtype> type;
  /// Split into files of at most this many bytes of tensor data (a larger tensor gets a file of
  /// its own), as Hugging Face's max_shard_size; 0: one file.
  std::uint64_t max_shard_bytes = 0;
  /// Bytes of the streaming buffer (rounded to whole 4 MiB checksum chunks, at least one).
  std::uint64_t buffer_bytes = std::uint64_t{16} << 20;
  /// An output that is a symbolic link: false refuses it; true writes the file it points to
  /// (`ringzero-ckpt consolidate --force`). Directories, FIFOs, devices and sockets are refused either way.
  bool follow_symlink = false;
};

/// What `consolidate` wrote.
struct consolidate_result {
  std::vector<std::filesystem::path> files;         ///< the safetensors files, in order
  std::optional<std::filesystem::path> index_file;  ///< model.safetensors.index.json when split
  std::uint64_t total_bytes = 0;                    ///< tensor data bytes over all files
  std::size_t tensors = 0;                          ///< parameters written
  std::uint64_t bytes_read = 0;                     ///< checkpoint bytes read (and verified)
};

namespace detail {

/// "model-00002-of-00005.safetensors" for `output` "model.safetensors".
inline std::string hf_shard_name(const std::filesystem::path& output, std::size_t k, std::size_t n) {
  std::string stem = output.filename().string();
  if (stem.ends_with(".safetensors")) stem.resize(stem.size() - 12);
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", k + 1, n);
  return stem + buf;
}

/// Writes the parameters `records` (as `out_types`) into the new file `tmp` (created: it must not
/// exist) and fsyncs it, streaming through `buffer`. The caller renames it into place.
inline void write_consolidated_file(fragment_reader& reader, const std::vector<const tensor_record*>& records,
                                    const std::vector<dtype>& out_types, const std::filesystem::path& tmp,
                                    std::vector<unsigned char>& buffer, std::vector<unsigned char>& converted) {
  const checkpoint_index& index = reader.index();
  std::vector<safetensors_entry> entries;
  for (std::size_t i = 0; i < records.size(); ++i)
    entries.push_back(
        {records[i]->name, out_types[i], records[i]->shape, records[i]->numel() * dtype_size(out_types[i])});
  const std::string header = encode_safetensors_header(entries, {{"format", "pt"}});
  detail::file f = detail::file::create_new(tmp);
  {
    f.write_at(header.data(), header.size(), 0);
    std::uint64_t at = header.size();
    for (std::size_t i = 0; i < records.size(); ++i) {
      const tensor_record& name_record = *records[i];
      const tensor_record* data = index.find_parameter_data(name_record.name);
      if (data == nullptr)
        throw error(errc::io_error, "checkpoint '" + reader.directory().string() + "': parameter '" + name_record.name +
                                        "' is tied to '" + name_record.tied_to + "', which has no data");
      const std::uint64_t in_es = dtype_size(data->type), out_es = dtype_size(out_types[i]);
      // Fragment by fragment, in pieces of whole checksum chunks of that fragment: no chunk is read twice.
      for (const fragment_record& fr : data->fragments) {
        const std::uint64_t step = std::max<std::uint64_t>(1, buffer.size() / in_es);
        for (std::uint64_t b = fr.begin; b < fr.end; b += step) {
          const std::uint64_t e = std::min(fr.end, b + step);
          reader.read(*data, b, e, buffer.data());
          const unsigned char* out = buffer.data();
          if (out_types[i] != data->type) {
            convert_elements(data->type, buffer.data(), out_types[i], converted.data(), e - b);
            out = converted.data();
          }
          f.write_at(out, (e - b) * out_es, at + b * out_es);
        }
      }
      at += name_record.numel() * out_es;
    }
    f.sync();
    f.close();
  }
}

}  // namespace detail

/// Writes the parameters of the checkpoint at `path` (a checkpoint directory, or a root whose
/// `latest` names one) to `output` (see the file comment). With `max_shard_bytes` and more
/// than one resulting file, the files are named after `output` in its directory
/// ("model-00001-of-00002.safetensors") and "<output>.index.json" lists them.
inline consolidate_result consolidate(const std::filesystem::path& path, const std::filesystem::path& output_path,
                                      const consolidate_options& options = {}) {
  if (options.type && !is_floating_point(*options.type))
    throw error(errc::invalid_argument, "consolidate: the output dtype must be a floating-point type, not " +
                                            std::string(dtype_name(*options.type)));
  const std::filesystem::path output =
      detail::resolve_output(output_path, options.follow_symlink, "consolidate output");
  const std::filesystem::path dir = resolve_checkpoint(path);
  const checkpoint_index index = read_index(dir);
  if (index.computed_model_fingerprint() != index.model_fingerprint)
    throw error(errc::io_error, "checkpoint index '" + (dir / index_file_name).string() +
                                    "': its tensors do not give its model fingerprint: the index was edited");
  fragment_reader reader(dir, index);
  reader.check_files();

  // The buffer holds whole checksum chunks; the converted copy the same elements in the output type.
  const std::uint64_t chunks = std::max<std::uint64_t>(1, options.buffer_bytes / checksum_chunk_bytes);
  std::vector<unsigned char> buffer(static_cast<std::size_t>(chunks * checksum_chunk_bytes));
  std::vector<const tensor_record*> params;
  std::vector<dtype> types;
  std::uint64_t converted_bytes = 0;
  for (const tensor_record& t : index.tensors) {
    if (t.role != tensor_role::parameter) continue;
    params.push_back(&t);
    types.push_back(options.type && is_floating_point(t.type) ? *options.type : t.type);
    const tensor_record* data = index.find_parameter_data(t.name);
    if (types.back() != t.type && data != nullptr)
      converted_bytes = std::max(converted_bytes, buffer.size() / dtype_size(data->type) * dtype_size(types.back()));
  }
  std::vector<unsigned char> converted(static_cast<std::size_t>(converted_bytes));

  // Hugging Face's split: tensors in order, a new file when the next would exceed the limit.
  std::vector<std::vector<std::size_t>> groups(1);
  std::uint64_t in_group = 0;
  consolidate_result result;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::uint64_t bytes = params[i]->numel() * dtype_size(types[i]);
    if (options.max_shard_bytes > 0 && !groups.back().empty() && in_group + bytes > options.max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += bytes;
    result.total_bytes += bytes;
  }
  result.tensors = params.size();
  const std::filesystem::path out_dir =
      output.parent_path().empty() ? std::filesystem::path(".") : output.parent_path();
  std::map<std::string, std::string> weight_map;
  std::filesystem::path index_path = output;
  index_path += ".index.json";
  // Every file this call writes, and its temporary "<file>.tmp", is checked before the first is
  // written; all are written as temporaries and renamed into place only when every one is
  // complete (the index last). A refusal or failure leaves nothing new behind and replaces nothing.
  std::vector<std::filesystem::path> finals;
  for (std::size_t g = 0; g < groups.size(); ++g)
    finals.push_back(groups.size() == 1 ? output : out_dir / detail::hf_shard_name(output, g, groups.size()));
  if (groups.size() > 1) finals.push_back(index_path);
  auto temporary = [](std::filesystem::path p) { return p += ".tmp"; };
  for (const std::filesystem::path& f : finals) {
    detail::require_replaceable(f, "write");
    struct stat st {};
    if (::lstat(temporary(f).c_str(), &st) == 0)
      throw error(errc::io_error, "consolidate: '" + temporary(f).string() +
                                      "' exists (left by an interrupted consolidate? remove it); it is never replaced");
  }
  std::vector<std::filesystem::path> made;  // temporaries this call created
  try {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::vector<const tensor_record*> records;
      std::vector<dtype> out_types;
      for (std::size_t i : groups[g]) {
        records.push_back(params[i]);
        out_types.push_back(types[i]);
        weight_map[params[i]->name] = finals[g].filename().string();
      }
      made.push_back(temporary(finals[g]));
      detail::write_consolidated_file(reader, records, out_types, made.back(), buffer, converted);
      result.files.push_back(finals[g]);
    }
    if (groups.size() > 1) {
      nlohmann::ordered_json j;
      j["metadata"] = {{"total_size", result.total_bytes}};
      j["weight_map"] = nlohmann::ordered_json::object();
      for (const tensor_record* t : params) j["weight_map"][t->name] = weight_map[t->name];
      const std::string text = j.dump(2) + "\n";
      made.push_back(temporary(index_path));
      detail::file f = detail::file::create_new(made.back());
      f.write_at(text.data(), text.size(), 0);
      f.sync();
      f.close();
      result.index_file = index_path;
    }
    for (std::size_t k = 0; k < finals.size(); ++k)
      if (::rename(made[k].c_str(), finals[k].c_str()) != 0)
        detail::io_fail("cannot rename '" + made[k].string() + "' to", finals[k], errno);
  } catch (...) {
    for (const std::filesystem::path& t : made) {
      std::error_code ec;
      std::filesystem::remove(t, ec);  // regular files this call created (already renamed: gone)
    }
    throw;
  }
  detail::sync_directory(out_dir);
  result.bytes_read = reader.bytes_read();
  return result;
}

}  // namespace ringzero::checkpoint
