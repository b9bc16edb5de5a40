#pragma once
/// @file
/// `checkpoint::detail::match_tensors` and `read_targets`: the part of every load that does not
/// depend on where the state goes. Matching compares the tensors a model needs (its own
/// `tensor_spec`s) with the checkpoint's index by name and role: each must be there with the
/// same dtype and global shape (a tied parameter may be found through its tie group's owner);
/// master weights missing from the checkpoint are rebuilt from the parameters (converted to
/// float32); with `strict`, parameters of the checkpoint the model lacks are refused. Reading
/// then fills each target — a global element range of one tensor, going to one place in the
/// loader's staging memory — through a `fragment_reader`, which reads only the bytes needed.
/// Errors name the checkpoint, the tensor and what was expected (errc::invalid_argument for a
/// checkpoint of another model, errc::io_error for damaged files).

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/fragment_reader.hpp"
#include "ringzero/checkpoint/state_layout.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/zero/parameter_spec.hpp"

namespace ringzero::checkpoint {

/// What a load restores.
struct load_options {
  /// Restore the optimizer states and the step count too (a resume). false: parameters and
  /// master weights only (initialising a model for fine-tuning or evaluation); the optimizer's
  /// states and step count stay as they are.
  bool optimizer_state = true;
  /// Refuse a checkpoint holding parameters the model does not have (as PyTorch's
  /// load_state_dict(strict=True)). Missing tensors are always refused.
  bool strict = true;
  /// Read straight into the model's memory, as PyTorch's Distributed Checkpoint loads into the
  /// state dict's own tensors: no second copy of the state (none of its memory, none of its
  /// page mapping), so a cold load runs at the disk's speed; the all-or-nothing promise is
  /// given up for the reads. Every check that needs no data (the index, the tensors' names,
  /// shapes and dtypes, the files and their sizes, between steps) still runs first and is agreed
  /// by every rank, so a refused load leaves the state unchanged; a failure while reading (a
  /// checksum mismatch, an I/O error) is raised on every rank saying that the state may be
  /// partly overwritten: load a checkpoint again before training on. Meant for a resume into a
  /// freshly made model, where the state has nothing to lose. A sharded model on the device path
  /// is read through host staging as without it.
  bool in_place = false;
};

namespace detail {

/// One range to load: elements [begin, end) of the model's tensor `spec`, into `dst`.
struct load_target {
  std::size_t spec = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  unsigned char* dst = nullptr;
};

/// The record each of `specs` is read from (a master may come from its parameter: then the
/// record's dtype differs and the values are converted). Throws on any mismatch.
inline std::vector<const tensor_record*> match_tensors(const checkpoint_index& index,
                                                       const std::vector<tensor_spec>& specs,
                                                       const load_options& options, const std::string& where) {
  auto fail = [&](const std::string& why) -> error {
    return error(errc::invalid_argument, "checkpoint '" + where + "': " + why);
  };
  std::vector<const tensor_record*> out(specs.size(), nullptr);
  std::set<std::string> model_names;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const tensor_spec& s = specs[i];
    if (s.role == tensor_role::parameter) model_names.insert(s.name);
    if (s.role == tensor_role::optimizer_state && !options.optimizer_state) continue;
    std::string label = "'" + s.name + "' (" + std::string(role_name(s.role)) +
                        (s.role == tensor_role::optimizer_state ? " " + std::to_string(s.state) : std::string()) + ")";
    // The record: by name, else through the checkpoint's tie of that parameter.
    const tensor_record* r = index.find(s.name, s.role, s.state);
    if (r != nullptr && !r->tied_to.empty()) r = index.find(r->tied_to, s.role, s.state);
    if (r == nullptr && s.role != tensor_role::parameter) {
      const tensor_record* p = index.find(s.name, tensor_role::parameter);
      if (p != nullptr && !p->tied_to.empty()) r = index.find(p->tied_to, s.role, s.state);
    }
    if (r == nullptr && s.role == tensor_role::master) {
      r = index.find_parameter_data(s.name);  // rebuilt from the parameter, converted to float32
      if (r != nullptr && !is_floating_point(r->type)) r = nullptr;
    }
    if (r == nullptr) {
      const tensor_record* any = index.find(s.name, tensor_role::parameter);
      throw fail("the model needs tensor " + label + " " + std::string(safetensors_dtype(s.type)) + " " +
                 zero::shape_text(s.shape) + ", which the checkpoint does not hold" +
                 (any == nullptr ? " (no parameter of that name: a checkpoint of another model?)"
                  : s.role == tensor_role::optimizer_state ? " (saved with another optimizer or as frozen; load with "
                                                             "optimizer_state = false to take the parameters only)"
                                                           : ""));
    }
    if (r->shape != s.shape)
      throw fail("tensor " + label + " has shape " + zero::shape_text(r->shape) +
                 " in the checkpoint, the model expects " + zero::shape_text(s.shape));
    if (s.role == tensor_role::optimizer_state && r->state_name != s.state_name)
      throw fail("tensor " + label + " is '" + s.state_name + "' for the model's optimizer but '" + r->state_name +
                 "' in the checkpoint (saved with another optimizer: load with optimizer_state = false to take the "
                 "parameters only)");
    const bool converted_master = s.role == tensor_role::master && r->role == tensor_role::parameter;
    if (r->type != s.type && !converted_master)
      throw fail("tensor " + label + " is " + std::string(safetensors_dtype(r->type)) +
                 " in the checkpoint, the model expects " + std::string(safetensors_dtype(s.type)));
    out[i] = r;
  }
  // An optimizer state the checkpoint holds for a trainable parameter whose optimizer keeps no
  // such state (SGD saved with momentum 0.9, resumed with momentum 0): resuming would silently
  // drop it.
  if (options.optimizer_state) {
    std::set<std::pair<std::string, int>> kept;
    std::set<std::string> trainable;
    for (const tensor_spec& s : specs) {
      if (s.role == tensor_role::optimizer_state) kept.emplace(s.name, s.state);
      if (s.role == tensor_role::parameter && s.trainable && s.tied_to.empty()) trainable.insert(s.name);
    }
    for (const tensor_record& t : index.tensors)
      if (t.role == tensor_role::optimizer_state && t.tied_to.empty() && trainable.contains(t.name) &&
          !kept.contains({t.name, t.state}))
        throw fail("the checkpoint holds optimizer state " + t.label() +
                   ", which the model's optimizer does not keep (saved with another optimizer or other settings, "
                   "such as a momentum; load with optimizer_state = false to take the parameters only)");
  }
  if (options.strict)
    for (const tensor_record& t : index.tensors)
      if (t.role == tensor_role::parameter && !model_names.contains(t.name))
        throw fail(
            "the checkpoint holds parameter '" + t.name + "' " + zero::shape_text(t.shape) +
            ", which the model does not have (a checkpoint of another model? load with strict = false to ignore it)");
  return out;
}

/// `n` elements of `from` at `src` converted to float32 at `dst`.
inline void to_float32(dtype from, const unsigned char* src, float* dst, std::uint64_t n) {
  visit_dtype(from, [&]<class T>() {
    const T* s = reinterpret_cast<const T*>(src);
    for (std::uint64_t k = 0; k < n; ++k) dst[k] = static_cast<float>(s[k]);
  });
}

/// Reads every target (see the file comment), the checksums of one target computed on the
/// reader's helper thread while the next is read; returns once every byte is verified (a
/// mismatch anywhere throws, after the reads). `records[t.spec]` must be set for each target.
inline void read_targets(fragment_reader& reader, const std::vector<tensor_spec>& specs,
                         const std::vector<const tensor_record*>& records, const std::vector<load_target>& targets) {
  std::vector<unsigned char> convert;
  constexpr std::uint64_t ahead_bytes = std::uint64_t{16} << 20;
  reader.defer_verification();  // checksums on a helper thread while the next reads run
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const load_target& t = targets[i];
    if (t.begin >= t.end) continue;
    for (std::size_t k = i + 1; k < targets.size(); ++k)  // the disk starts on the next target meanwhile
      if (targets[k].begin < targets[k].end) {
        reader.prefetch(*records[targets[k].spec], targets[k].begin, targets[k].end, ahead_bytes,
                        records[targets[k].spec]->type == specs[targets[k].spec].type ? targets[k].dst : nullptr);
        break;
      }
    const tensor_record* r = records[t.spec];
    const tensor_spec& s = specs[t.spec];
    if (r->type == s.type) {
      reader.read(*r, t.begin, t.end, t.dst);
      continue;
    }
    convert.resize(static_cast<std::size_t>((t.end - t.begin) * dtype_size(r->type)));
    reader.read(*r, t.begin, t.end, convert.data());
    reader.finish_verification();  // `convert` is read again for the next target
    to_float32(r->type, convert.data(), reinterpret_cast<float*>(t.dst), t.end - t.begin);
  }
  reader.finish_verification();
}

}  // namespace detail
}  // namespace ringzero::checkpoint
