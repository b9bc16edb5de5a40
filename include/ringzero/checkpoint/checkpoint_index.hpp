#pragma once
/// @file
/// `checkpoint::checkpoint_index`: the index of a checkpoint directory (`index.json`, written
/// by rank 0 last). It records the format version, the world size, stage, replica group size
/// and alignment the checkpoint was saved with, the plan and model fingerprints, the training
/// progress, the shard files (one per rank, safetensors) and every tensor: its name, role
/// (parameter, master weights, optimizer state k), global shape, dtype, and the fragments that
/// hold it — for each, the file, the global flat element range [begin, end), the absolute byte
/// offset in the file and the XXH3 checksums of its 4 MiB chunks (checkpoint/checksum.hpp).
/// A fragment is stored in its shard file under the name "<tensor>#<role>[<begin>:<end>]"
/// (`fragment_key`), a 1-D tensor of end - begin elements, so the global offsets are
/// recoverable from the shard file alone. The format is described in docs/checkpoint.md.
/// `from_json` refuses an index that is not one (naming the file and what is wrong): a newer
/// format version, unknown dtypes or roles, fragments outside their file or tensor, and
/// fragments that do not tile their tensor exactly once. The index carries its own checksum
/// ("index_xxh3", `seal_index`), which `read_index` checks: an index edited after the save, even
/// consistently (tensors removed, a dtype changed, chunk checksums recomputed), is refused.
/// Needs nlohmann/json and libxxhash (the Meson dependency `ringzero-checkpoint`). Pure values.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringzero/checkpoint/checksum.hpp"
#include "ringzero/checkpoint/file_io.hpp"
#include "ringzero/checkpoint/safetensors.hpp"
#include "ringzero/checkpoint/training_progress.hpp"
#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/enum_names.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::checkpoint {

/// The value of the index's "format" field.
inline constexpr std::string_view format_name = "ringzero.checkpoint";
/// The format version this code writes and the newest it reads.
inline constexpr int format_version = 1;
/// The index's file name inside a checkpoint directory.
inline constexpr std::string_view index_file_name = "index.json";

/// What a tensor of the checkpoint is.
enum class tensor_role : std::uint8_t {
  parameter = 0,        ///< the training parameter (its own dtype)
  master = 1,           ///< the float32 master weights of a 16-bit parameter
  optimizer_state = 2,  ///< optimizer state number `state` (SGD momentum; Adam exp_avg, exp_avg_sq)
};

/// "parameter", "master" or "optimizer_state".
inline constexpr enum_names<tensor_role, 3> role_names{"parameter", "master", "optimizer_state"};
/// The name of `r` (`role_names`).
constexpr std::string_view role_name(tensor_role r) noexcept { return role_names(r); }

/// Parses `role_name` output.
constexpr std::optional<tensor_role> parse_role(std::string_view s) noexcept { return role_names.parse(s); }

/// One shard file.
struct file_record {
  std::string name;         ///< file name inside the checkpoint directory
  int rank = 0;             ///< the rank that wrote it
  std::uint64_t bytes = 0;  ///< its size
};

/// One piece of a tensor in one file.
struct fragment_record {
  std::size_t file = 0;                  ///< index into `checkpoint_index::files`
  std::uint64_t begin = 0;               ///< first global flat element
  std::uint64_t end = 0;                 ///< one past the last
  std::uint64_t offset = 0;              ///< absolute byte offset of element `begin` in the file
  std::vector<std::uint64_t> checksums;  ///< XXH3-64 of each 4 MiB chunk of its bytes
};

/// One tensor (a name and a role) of the checkpoint.
struct tensor_record {
  std::string name;
  tensor_role role = tensor_role::parameter;
  int state = 0;           ///< the optimizer state number (role optimizer_state)
  std::string state_name;  ///< "exp_avg", "exp_avg_sq", "momentum_buffer" (role optimizer_state)
  dtype type = dtype::float32;
  std::vector<std::uint64_t> shape;
  bool trainable = true;
  std::string tied_to;  ///< non-empty: an alias whose values are those of this parameter (no fragments)
  std::vector<fragment_record> fragments;  ///< by `begin`

  /// Elements (the product of the shape).
  std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;
    return n;
  }
  /// "'fc.weight' (optimizer state 1, exp_avg_sq)", for messages.
  std::string label() const {
    std::string s = "'" + name + "' (" + std::string(role_name(role));
    if (role == tensor_role::optimizer_state)
      s += " " + std::to_string(state) + (state_name.empty() ? "" : ", " + state_name);
    return s + ")";
  }
};

/// The role token of a fragment key: "parameter", "master", "state<k>".
inline std::string role_token(tensor_role role, int state) {
  return role == tensor_role::optimizer_state ? "state" + std::to_string(state) : std::string(role_name(role));
}

/// The name a fragment is stored under in its shard file: "<tensor>#<role>[<begin>:<end>]".
inline std::string fragment_key(const std::string& name, tensor_role role, int state, std::uint64_t begin,
                                std::uint64_t end) {
  return name + "#" + role_token(role, state) + "[" + std::to_string(begin) + ":" + std::to_string(end) + "]";
}

/// XXH3 of every tensor's name, role, state, dtype, tie and shape, in order: the model
/// fingerprint of an index (`tensors`: tensor_record or state_layout's tensor_spec). Equal for
/// the same model and optimizer whatever the world size, stage or alignment.
template <class Tensors>
std::uint64_t model_fingerprint_of(const Tensors& tensors) {
  std::string s;
  for (const auto& t : tensors) {
    s += t.name + '\n' + role_token(t.role, t.state) + '\n' + std::string(safetensors_dtype(t.type)) + '\n' +
         t.tied_to + '\n';
    for (std::uint64_t d : t.shape) s += std::to_string(d) + ',';
    s += '\n';
  }
  return checksum(s.data(), s.size());
}

/// The field of index.json that holds the index's own checksum.
inline constexpr const char* index_checksum_field = "index_xxh3";

/// XXH3 of `j` without `index_checksum_field`, in nlohmann::json's compact dump (keys sorted):
/// the checksum an index carries of itself.
inline std::uint64_t index_checksum(nlohmann::json j) {
  j.erase(index_checksum_field);
  const std::string text = j.dump();
  return checksum(text.data(), text.size());
}

/// Sets the checksum field of the index document `j` (after an edit a test or tool made on purpose).
inline void seal_index(nlohmann::json& j) { j[index_checksum_field] = hex64(index_checksum(j)); }

/// The whole index. See the file comment.
struct checkpoint_index {
  int version = format_version;
  std::string kind = "zero";  ///< "zero" (a zero::sharded_model) or "replicated" (a DDP trainer)
  int world_size = 1;
  int stage = 0;
  int replica_group_size = 1;
  std::uint64_t alignment_bytes = 0;
  std::uint64_t plan_fingerprint = 0;                   ///< zero::shard_plan::fingerprint() (0 for "replicated")
  std::uint64_t model_fingerprint = 0;                  ///< hash of the tensors' names, roles, shapes and dtypes
  nlohmann::json optimizer = nlohmann::json::object();  ///< the optimizer's kind and options
  nlohmann::json extra = nlohmann::json::object();      ///< kind-specific state (the DDP bucket layout)
  training_progress progress;
  std::vector<file_record> files;
  std::vector<tensor_record> tensors;

  /// The tensor `name` with `role` (and `state`), or nullptr.
  const tensor_record* find(std::string_view name, tensor_role role, int state = 0) const noexcept {
    for (const auto& t : tensors)
      if (t.name == name && t.role == role && (role != tensor_role::optimizer_state || t.state == state)) return &t;
    return nullptr;
  }
  /// The parameter record whose data `name` uses: `name`'s, or its tie group owner's.
  const tensor_record* find_parameter_data(std::string_view name) const noexcept {
    const tensor_record* t = find(name, tensor_role::parameter);
    if (t != nullptr && !t->tied_to.empty()) t = find(t->tied_to, tensor_role::parameter);
    return t;
  }

  /// The JSON document.
  nlohmann::json to_json() const {
    nlohmann::json j = nlohmann::json::object();
    j["format"] = std::string(format_name);
    j["format_version"] = version;
    j["kind"] = kind;
    j["world_size"] = world_size;
    j["stage"] = stage;
    j["replica_group_size"] = replica_group_size;
    j["alignment_bytes"] = alignment_bytes;
    j["plan_fingerprint"] = hex64(plan_fingerprint);
    j["model_fingerprint"] = hex64(model_fingerprint);
    j["checksum"] = {{"algorithm", "xxh3_64"}, {"chunk_bytes", checksum_chunk_bytes}};
    j["optimizer"] = optimizer;
    j["extra"] = extra;
    j["progress"] = progress.to_json();
    nlohmann::json fs = nlohmann::json::array();
    for (const auto& f : files) fs.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}});
    j["files"] = std::move(fs);
    nlohmann::json ts = nlohmann::json::array();
    for (const auto& t : tensors) {
      nlohmann::json e = {{"name", t.name},
                          {"role", std::string(role_name(t.role))},
                          {"dtype", std::string(safetensors_dtype(t.type))},
                          {"shape", t.shape},
                          {"trainable", t.trainable}};
      if (t.role == tensor_role::optimizer_state) {
        e["state"] = t.state;
        e["state_name"] = t.state_name;
      }
      if (!t.tied_to.empty()) e["tied_to"] = t.tied_to;
      nlohmann::json frs = nlohmann::json::array();
      for (const auto& f : t.fragments) {
        nlohmann::json sums = nlohmann::json::array();
        for (std::uint64_t c : f.checksums) sums.push_back(hex64(c));
        frs.push_back({{"file", f.file}, {"range", {f.begin, f.end}}, {"offset", f.offset}, {"xxh3", std::move(sums)}});
      }
      e["fragments"] = std::move(frs);
      ts.push_back(std::move(e));
    }
    j["tensors"] = std::move(ts);
    seal_index(j);
    return j;
  }
  /// The model fingerprint recomputed from `tensors` (`model_fingerprint_of`): equal to
  /// `model_fingerprint` unless the index was edited.
  std::uint64_t computed_model_fingerprint() const { return model_fingerprint_of(tensors); }

  /// Parses and checks an index (see the file comment); `where` names the file in errors.
  /// Throws errc::unsupported for a newer format version, errc::io_error for anything else.
  static checkpoint_index from_json(const nlohmann::json& j, const std::string& where) {
    auto fail = [&](const std::string& why) -> error {
      return error(errc::io_error, "checkpoint index '" + where + "': " + why);
    };
    auto field = [&](const nlohmann::json& o, const char* name) -> const nlohmann::json& {
      if (!o.is_object() || !o.contains(name)) throw fail("the field '" + std::string(name) + "' is missing");
      return o[name];
    };
    auto unsigned_field = [&](const nlohmann::json& o, const char* name) {
      const auto& v = field(o, name);
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
        throw fail("the field '" + std::string(name) + "' is not a non-negative integer");
      return v.get<std::uint64_t>();
    };
    auto string_field = [&](const nlohmann::json& o, const char* name) {
      const auto& v = field(o, name);
      if (!v.is_string()) throw fail("the field '" + std::string(name) + "' is not a string");
      return v.get<std::string>();
    };
    if (string_field(j, "format") != format_name) throw fail("the format is not '" + std::string(format_name) + "'");
    checkpoint_index x;
    const std::uint64_t version = unsigned_field(j, "format_version");
    if (version > static_cast<std::uint64_t>(format_version))
      throw error(errc::unsupported, "checkpoint index '" + where + "': format version " + std::to_string(version) +
                                         " was written by a newer ringzero; this one reads format versions up to " +
                                         std::to_string(format_version));
    if (version == 0) throw fail("format version 0 does not exist");
    x.version = static_cast<int>(version);
    x.kind = string_field(j, "kind");
    if (x.kind != "zero" && x.kind != "replicated") throw fail("unknown kind '" + x.kind + "'");
    const std::uint64_t world = unsigned_field(j, "world_size");
    if (world < 1 || world > (1u << 24)) throw fail("world_size " + std::to_string(world) + " is out of range");
    x.world_size = static_cast<int>(world);
    x.stage = static_cast<int>(std::min<std::uint64_t>(unsigned_field(j, "stage"), 4));
    if (x.stage > 3) throw fail("stage is not 0-3");
    x.replica_group_size =
        static_cast<int>(std::min<std::uint64_t>(unsigned_field(j, "replica_group_size"), world + 1));
    x.alignment_bytes = unsigned_field(j, "alignment_bytes");
    for (auto [name, out] :
         {std::pair{"plan_fingerprint", &x.plan_fingerprint}, std::pair{"model_fingerprint", &x.model_fingerprint}}) {
      const auto v = parse_hex64(string_field(j, name));
      if (!v) throw fail(std::string("the field '") + name + "' is not 16 hex digits");
      *out = *v;
    }
    const auto& sum = field(j, "checksum");
    if (string_field(sum, "algorithm") != "xxh3_64" || unsigned_field(sum, "chunk_bytes") != checksum_chunk_bytes)
      throw fail("the checksum is not xxh3_64 over chunks of " + std::to_string(checksum_chunk_bytes) + " bytes");
    x.optimizer = field(j, "optimizer");
    x.extra = field(j, "extra");
    x.progress = training_progress::from_json(field(j, "progress"), "checkpoint index '" + where + "'");
    const auto& fs = field(j, "files");
    if (!fs.is_array() || fs.size() != world)
      throw fail("'files' must list one file per rank (" + std::to_string(world) + ")");
    for (const auto& f : fs) {
      file_record r;
      r.name = string_field(f, "name");
      if (r.name.empty() || r.name.find('/') != std::string::npos || r.name.starts_with("."))
        throw fail("file name '" + r.name + "' is not a plain file name");
      r.rank = static_cast<int>(std::min<std::uint64_t>(unsigned_field(f, "rank"), world));
      if (r.rank != static_cast<int>(x.files.size())) throw fail("file '" + r.name + "' is listed out of rank order");
      r.bytes = unsigned_field(f, "bytes");
      x.files.push_back(std::move(r));
    }
    const auto& ts = field(j, "tensors");
    if (!ts.is_array()) throw fail("'tensors' is not an array");
    for (const auto& e : ts) {
      tensor_record t;
      t.name = string_field(e, "name");
      const auto role = parse_role(string_field(e, "role"));
      if (!role) throw fail("tensor '" + t.name + "' has an unknown role");
      t.role = *role;
      const std::string dt = string_field(e, "dtype");
      const auto type = parse_safetensors_dtype(dt);
      if (!type) throw fail("tensor '" + t.name + "' has unknown dtype '" + dt + "'");
      t.type = *type;
      const auto& shape = field(e, "shape");
      if (!shape.is_array()) throw fail("tensor '" + t.name + "' has no shape array");
      std::uint64_t numel = 1;
      for (const auto& d : shape) {
        if (!d.is_number_unsigned()) throw fail("tensor '" + t.name + "' has a malformed shape");
        const std::uint64_t v = d.get<std::uint64_t>();
        const std::optional<std::uint64_t> product = ringzero::detail::checked_mul(numel, v);
        if (!product || *product > (std::uint64_t{1} << 60))
          throw fail("tensor '" + t.name + "' has a shape that overflows");
        numel = *product;
        t.shape.push_back(v);
      }
      if (!field(e, "trainable").is_boolean()) throw fail("tensor '" + t.name + "' has a malformed 'trainable'");
      t.trainable = e["trainable"].get<bool>();
      if (t.role == tensor_role::optimizer_state) {
        t.state = static_cast<int>(std::min<std::uint64_t>(unsigned_field(e, "state"), 1024));
        t.state_name = string_field(e, "state_name");
      }
      if (e.contains("tied_to")) t.tied_to = string_field(e, "tied_to");
      const auto& frs = field(e, "fragments");
      if (!frs.is_array()) throw fail("tensor " + t.label() + " has no fragment array");
      const std::uint64_t es = dtype_size(t.type);
      for (const auto& fj : frs) {
        fragment_record f;
        f.file = static_cast<std::size_t>(std::min<std::uint64_t>(unsigned_field(fj, "file"), world));
        if (f.file >= x.files.size())
          throw fail("a fragment of tensor " + t.label() + " names file " + std::to_string(f.file) +
                     ", which does not exist");
        const auto& range = field(fj, "range");
        if (!range.is_array() || range.size() != 2 || !range[0].is_number_unsigned() || !range[1].is_number_unsigned())
          throw fail("a fragment of tensor " + t.label() + " has a malformed range");
        f.begin = range[0].get<std::uint64_t>();
        f.end = range[1].get<std::uint64_t>();
        f.offset = unsigned_field(fj, "offset");
        const std::string in =
            "the fragment [" + std::to_string(f.begin) + ", " + std::to_string(f.end) + ") of tensor " + t.label();
        if (f.begin >= f.end || f.end > numel)
          throw fail(in + " is empty or outside the tensor's " + std::to_string(numel) + " elements");
        const std::uint64_t bytes = (f.end - f.begin) * es;
        if (f.offset > x.files[f.file].bytes || bytes > x.files[f.file].bytes - f.offset)
          throw fail(in + " lies outside file '" + x.files[f.file].name + "' (" +
                     std::to_string(x.files[f.file].bytes) + " bytes)");
        const auto& sums = field(fj, "xxh3");
        if (!sums.is_array() || sums.size() != chunk_count(bytes))
          throw fail(in + " must have " + std::to_string(chunk_count(bytes)) + " chunk checksums");
        for (const auto& s : sums) {
          const auto v = s.is_string() ? parse_hex64(s.get<std::string>()) : std::nullopt;
          if (!v) throw fail(in + " has a malformed checksum");
          f.checksums.push_back(*v);
        }
        t.fragments.push_back(std::move(f));
      }
      std::sort(t.fragments.begin(), t.fragments.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
      if (!t.tied_to.empty() && !t.fragments.empty())
        throw fail("tensor " + t.label() + " is tied to '" + t.tied_to + "' but has fragments");
      if (t.tied_to.empty()) {
        std::uint64_t at = 0;
        for (const auto& f : t.fragments) {
          if (f.begin != at)
            throw fail("the fragments of tensor " + t.label() + " do not tile it: " +
                       (f.begin < at ? "elements from " + std::to_string(f.begin) + " are held twice"
                                     : "elements [" + std::to_string(at) + ", " + std::to_string(f.begin) +
                                           ") are held by no fragment"));
          at = f.end;
        }
        if (at != numel)
          throw fail("the fragments of tensor " + t.label() + " do not tile it: elements [" + std::to_string(at) +
                     ", " + std::to_string(numel) + ") are held by no fragment");
      }
      if (x.find(t.name, t.role, t.state) != nullptr) throw fail("tensor " + t.label() + " is listed twice");
      x.tensors.push_back(std::move(t));
    }
    for (const auto& t : x.tensors)
      if (!t.tied_to.empty()) {
        const tensor_record* owner = x.find(t.tied_to, t.role, t.state);
        if (owner == nullptr || !owner->tied_to.empty() || owner->shape != t.shape || owner->type != t.type)
          throw fail("tensor " + t.label() + " is tied to '" + t.tied_to +
                     "', which is missing, itself tied, or of another shape or dtype");
      }
    return x;
  }
};

/// How the optimizer description `now` differs from `saved` (an index's "optimizer"), key by key
/// in `saved`'s order then `now`'s new keys: "kind adamw -> adam, weight_decay 0.01 -> 0"; ""
/// when they are equal. For a resume's note: a state that still fits (Adam and AdamW keep the
/// same moments) loads, and the user should know the run continues under other settings.
inline std::string optimizer_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.is_object() || !now.is_object()) return saved == now ? "" : saved.dump() + " -> " + now.dump();
  std::string out;
  auto text = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  auto add = [&](const std::string& key, const std::string& a, const std::string& b) {
    out += (out.empty() ? "" : ", ") + key + " " + a + " -> " + b;
  };
  for (const auto& [key, value] : saved.items()) {
    if (!now.contains(key))
      add(key, text(value), "(none)");
    else if (now[key] != value)
      add(key, text(value), text(now[key]));
  }
  for (const auto& [key, value] : now.items())
    if (!saved.contains(key)) add(key, "(none)", text(value));
  return out;
}

/// Reads and checks `<dir>/index.json` (errc::io_error naming it when it is missing, broken, or
/// its own checksum does not match: edited after the save).
inline checkpoint_index read_index(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / index_file_name;
  std::string text;
  try {
    text = detail::read_whole_file(path);
  } catch (const error& e) {
    throw error(errc::io_error, "no complete checkpoint in '" + dir.string() + "': " + e.message());
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::io_error, "checkpoint index '" + path.string() + "' is not valid JSON: " + e.what());
  }
  checkpoint_index x = checkpoint_index::from_json(j, path.string());
  // The index's own checksum (written since it existed; an older index has none and is read as before).
  if (j.is_object() && j.contains(index_checksum_field)) {
    const auto& v = j[index_checksum_field];
    const auto sealed = v.is_string() ? parse_hex64(v.get<std::string>()) : std::nullopt;
    if (!sealed || *sealed != index_checksum(j))
      throw error(errc::io_error, "checkpoint index '" + path.string() + "': its own checksum (" +
                                      index_checksum_field +
                                      ") does not match its contents: the index was edited or damaged after the save");
  }
  return x;
}

}  // namespace ringzero::checkpoint
