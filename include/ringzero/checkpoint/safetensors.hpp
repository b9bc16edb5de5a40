#pragma once
/// @file
/// `checkpoint::safetensors_header`: reading and writing the header of a safetensors file
/// (Hugging Face's format, as its specification in the safetensors repository defines it):
/// - 8 bytes: N, an unsigned little-endian 64-bit integer, the size of the header;
/// - N bytes: a UTF-8 JSON object starting with '{' (it may be padded at the end with spaces):
///   for every tensor name, {"dtype": "F32", "shape": [7, 5], "data_offsets": [begin, end]},
///   plus an optional "__metadata__" object of string values;
/// - the data section: the tensors' raw little-endian row-major bytes, at `data_offsets`
///   relative to the start of the data section; the tensors tile it contiguously, without
///   overlap and without gaps, and end at the end of the file.
/// Readers here enforce every one of those rules (and the 100 MB header limit of the reference
/// implementation), so a damaged or truncated file is refused naming the file and the rule.
/// Writers pad the header with spaces so that the data section starts at a multiple of 8 bytes
/// (or of a larger alignment asked for).
/// Needs nlohmann/json (the Meson dependency `ringzero-checkpoint`). Pure functions except
/// `read_safetensors_header`, which reads a file.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringzero/checkpoint/file_io.hpp"
#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/enum_names.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::checkpoint {

/// The safetensors name of `t` ("F32", "BF16", "I64", ...).
inline constexpr enum_names<dtype, dtype_count> safetensors_dtype_names{"F32", "F64", "F16", "BF16", "I8",
                                                                        "U8",  "I32", "U32", "I64",  "U64"};
/// The safetensors name of `t` (`safetensors_dtype_names`).
constexpr std::string_view safetensors_dtype(dtype t) noexcept { return safetensors_dtype_names(t); }

/// The ringzero dtype of a safetensors dtype name, or std::nullopt for one ringzero has no
/// type for (BOOL, I16, U16, F8_E4M3, ...).
constexpr std::optional<dtype> parse_safetensors_dtype(std::string_view s) noexcept {
  return safetensors_dtype_names.parse(s);
}

/// Bytes per element of every dtype the safetensors specification lists; 0 for unknown names.
constexpr std::uint64_t safetensors_dtype_size(std::string_view s) noexcept {
  if (auto t = parse_safetensors_dtype(s)) return dtype_size(*t);
  if (s == "BOOL" || s == "F8_E4M3" || s == "F8_E5M2") return 1;
  if (s == "I16" || s == "U16") return 2;
  return 0;
}

/// One tensor of a safetensors file.
struct safetensors_tensor {
  std::string name;
  std::string dtype_name;     ///< as written ("F32")
  std::optional<dtype> type;  ///< std::nullopt when ringzero has no such type
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  ///< absolute byte offset of the data in the file
  std::uint64_t end = 0;    ///< one past the last byte
  std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;
    return n;
  }
};

/// A parsed header: the tensors in data order, the metadata, and where the data section starts.
struct safetensors_header {
  std::uint64_t data_start = 0;  ///< 8 + N
  std::vector<safetensors_tensor> tensors;
  std::map<std::string, std::string> metadata;

  /// The tensor named `name`, or nullptr.
  const safetensors_tensor* find(std::string_view name) const noexcept {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

/// What a writer puts in a file: a tensor's name, dtype, shape and size in bytes (which must be
/// numel * element size).
struct safetensors_entry {
  std::string name;
  dtype type = dtype::float32;
  std::vector<std::uint64_t> shape;
  std::uint64_t bytes = 0;
};

/// The first 8 + N bytes of a safetensors file holding `entries` in this order (data offsets
/// assigned contiguously from 0) with `metadata`; N is padded with spaces to make 8 + N a
/// multiple of `data_alignment` (a multiple of 8: 8, or 4096 for shard files read with
/// O_DIRECT). Throws errc::invalid_argument for a duplicate or reserved name or a bad alignment.
inline std::string encode_safetensors_header(const std::vector<safetensors_entry>& entries,
                                             const std::map<std::string, std::string>& metadata,
                                             std::uint64_t data_alignment = 8) {
  if (data_alignment == 0 || data_alignment % 8 != 0)
    throw error(errc::invalid_argument,
                "safetensors: data alignment " + std::to_string(data_alignment) + " is not a positive multiple of 8");
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::uint64_t at = 0;
  for (const safetensors_entry& e : entries) {
    if (e.name == "__metadata__" || h.contains(e.name))
      throw error(errc::invalid_argument, "safetensors: tensor name '" + e.name + "' is reserved or appears twice");
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = std::string(safetensors_dtype(e.type));
    t["shape"] = e.shape;
    t["data_offsets"] = {at, at + e.bytes};
    h[e.name] = std::move(t);
    at += e.bytes;
  }
  std::string json = h.dump();
  json.append(static_cast<std::size_t>((data_alignment - (8 + json.size()) % data_alignment) % data_alignment), ' ');
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

/// The largest header the reference implementation accepts (100 MB).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

namespace detail {
[[noreturn]] inline void safetensors_fail(const std::filesystem::path& path, const std::string& why) {
  throw error(errc::io_error, "safetensors file '" + path.string() + "': " + why);
}
}  // namespace detail

/// Reads and checks the header of the open file `f` (see the file comment for the rules); the
/// error names the file and the rule broken (errc::io_error).
inline safetensors_header read_safetensors_header(const detail::file& f) {
  const std::filesystem::path& path = f.path();
  const std::uint64_t size = f.size();
  if (size < 8)
    detail::safetensors_fail(path, "is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  unsigned char len[8];
  f.read_at(len, 8, 0);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > safetensors_max_header)
    detail::safetensors_fail(path, "header length " + std::to_string(n) + " exceeds 100 MB");
  if (n > size - 8)
    detail::safetensors_fail(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                                       std::to_string(size) + " bytes): truncated");
  std::string text(static_cast<std::size_t>(n), '\0');
  f.read_at(text.data(), n, 8);
  if (text.empty() || text[0] != '{') detail::safetensors_fail(path, "the header does not start with '{'");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    detail::safetensors_fail(path, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) detail::safetensors_fail(path, "the header is not a JSON object");
  safetensors_header out;
  out.data_start = 8 + n;
  const std::uint64_t data_bytes = size - out.data_start;
  for (const auto& [key, value] : h.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) detail::safetensors_fail(path, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) detail::safetensors_fail(path, "__metadata__ value of '" + mk + "' is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + key + "'";
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets"))
      detail::safetensors_fail(path, where + " lacks dtype, shape or data_offsets");
    const auto& dt = value["dtype"];
    const auto& shape = value["shape"];
    const auto& offsets = value["data_offsets"];
    if (!dt.is_string() || !shape.is_array() || !offsets.is_array() || offsets.size() != 2 ||
        !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      detail::safetensors_fail(path, where + " has a malformed dtype, shape or data_offsets");
    safetensors_tensor t;
    t.name = key;
    t.dtype_name = dt.get<std::string>();
    t.type = parse_safetensors_dtype(t.dtype_name);
    const std::uint64_t es = safetensors_dtype_size(t.dtype_name);
    if (es == 0) detail::safetensors_fail(path, where + " has unknown dtype '" + t.dtype_name + "'");
    std::uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned())
        detail::safetensors_fail(path, where + " has a shape entry that is not a non-negative integer");
      const std::uint64_t v = d.get<std::uint64_t>();
      t.shape.push_back(v);
      const std::optional<std::uint64_t> product = ringzero::detail::checked_mul(numel, v);
      if (!product || *product > (std::uint64_t{1} << 62))
        detail::safetensors_fail(path, where + " has a shape that overflows");
      numel = *product;
    }
    const std::uint64_t b = offsets[0].get<std::uint64_t>(), e = offsets[1].get<std::uint64_t>();
    if (b > e || e > data_bytes)
      detail::safetensors_fail(path, where + " has data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                                         "] outside the data section of " + std::to_string(data_bytes) + " bytes" +
                                         (e > data_bytes ? " (truncated file?)" : ""));
    if (e - b != numel * es)
      detail::safetensors_fail(path, where + " holds " + std::to_string(e - b) +
                                         " bytes but its shape and dtype need " + std::to_string(numel * es));
    t.begin = out.data_start + b;
    t.end = out.data_start + e;
    out.tensors.push_back(std::move(t));
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const auto& a, const auto& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t at = out.data_start;
  for (const auto& t : out.tensors) {
    if (t.begin != at)
      detail::safetensors_fail(path, "tensor '" + t.name + "' starts at data offset " +
                                         std::to_string(t.begin - out.data_start) + " but the previous data ends at " +
                                         std::to_string(at - out.data_start) +
                                         " (the tensors must tile the data section)");
    at = t.end;
  }
  if (at != size)
    detail::safetensors_fail(path, "the tensors end at data offset " + std::to_string(at - out.data_start) +
                                       " but the data section has " + std::to_string(data_bytes) + " bytes");
  return out;
}

/// Opens `path` and reads its header.
inline safetensors_header read_safetensors_header(const std::filesystem::path& path) {
  return read_safetensors_header(detail::file::open_read(path));
}

}  // namespace ringzero::checkpoint
