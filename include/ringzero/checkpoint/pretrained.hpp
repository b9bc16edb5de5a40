#pragma once
/// @file
/// `checkpoint::load_pretrained`: initialises a `zero::sharded_model` at any world size and
/// stage from one full-model safetensors file holding the parameters by name (what
/// `ringzero-ckpt consolidate` writes, or a Hugging Face model file). Each rank reads only the
/// byte ranges of its held parameters (and of its optimizer range, for the master weights).
/// A tensor of another floating dtype is converted (float64, float32, bfloat16, float16; the
/// master weights get the file's values converted once to float32, as `set_parameter` does);
/// a tied parameter missing from the file is taken from another member of its tie group.
/// Optimizer states and the step count are left as they are. Like `load`, all or nothing: a
/// collective agreement, then the commit; errors name the file, the tensor and what was
/// expected, on every rank (a missing tensor, another shape, a non-floating dtype, with
/// `strict` a tensor the model does not have, a damaged file, unless `allow_nonfinite` a NaN or
/// infinity among the values, or a finite value the model's type cannot hold (it would round to
/// infinity): a run initialised from one trains to `loss nan`). The file is
/// opened without blocking and must be a regular file (a FIFO or directory is refused by name).
/// The file's header is parsed once per process, however many local ranks load it at once.
/// Needs nlohmann/json and libxxhash (`ringzero-checkpoint`). Thread semantics: a collective.

#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ringzero/checkpoint/load.hpp"
#include "ringzero/checkpoint/safetensors.hpp"
#include "ringzero/checkpoint/staging_buffer.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::checkpoint {

namespace detail {

/// The index of the first NaN or infinity among the `n` floating-point elements of `type` at
/// `data`, or std::nullopt when all are finite (or `type` is not floating). IEEE 754 formats:
/// a value is non-finite when its exponent bits are all ones.
inline std::optional<std::uint64_t> first_nonfinite(dtype type, const unsigned char* data, std::uint64_t n) {
  auto scan = [&](auto word, auto exponent) -> std::optional<std::uint64_t> {
    using word_t = decltype(word);
    for (std::uint64_t i = 0; i < n; ++i) {
      word_t w;
      std::memcpy(&w, data + i * sizeof(word_t), sizeof(word_t));
      if ((w & exponent) == exponent) return i;
    }
    return std::nullopt;
  };
  switch (type) {
    case dtype::float16: return scan(std::uint16_t{}, std::uint16_t{0x7C00});
    case dtype::bfloat16: return scan(std::uint16_t{}, std::uint16_t{0x7F80});
    case dtype::float32: return scan(std::uint32_t{}, std::uint32_t{0x7F800000u});
    case dtype::float64: return scan(std::uint64_t{}, std::uint64_t{0x7FF0000000000000ull});
    default: return std::nullopt;
  }
}

/// The header of the open safetensors file `f`, parsed once per process for all the ranks
/// (threads) that load the same file at once: keyed by device, inode, size and modification
/// time, held while a caller holds it (a 1M-tensor header costs ~850 MB parsed; eight local ranks
/// parsing it each would cost eight times that). Thread-safe (one mutex over lookups and parses);
/// a parse error is thrown to every caller (nothing is kept, so each parses and fails).
inline std::shared_ptr<const safetensors_header> shared_safetensors_header(const file& f) {
  struct stat st {};
  if (::fstat(f.descriptor(), &st) != 0) io_fail("cannot stat", f.path(), errno);
  using key_t = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::int64_t, std::int64_t>;
  const key_t key{st.st_dev, st.st_ino, static_cast<std::uint64_t>(st.st_size), st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  // One mutex guards the table and every parse: the ranks that load one file at once wait for
  // the first to parse it, then share its result.
  static std::mutex mutex;
  static std::map<key_t, std::weak_ptr<const safetensors_header>> table;
  const std::lock_guard<std::mutex> lock(mutex);
  std::erase_if(table, [](const auto& entry) { return entry.second.expired(); });  // headers nobody holds
  if (auto held = table[key].lock()) return held;
  auto parsed = std::make_shared<const safetensors_header>(read_safetensors_header(f));
  table[key] = parsed;
  return parsed;
}

/// `n` elements of `from` at `src` as `to` at `dst` (a copy when equal; both floating otherwise).
inline void convert_elements(dtype from, const unsigned char* src, dtype to, unsigned char* dst, std::uint64_t n) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<std::size_t>(n * dtype_size(from)));
    return;
  }
  visit_dtype(from, [&]<class F>() {
    visit_dtype(to, [&]<class T>() {
      const F* s = reinterpret_cast<const F*>(src);
      T* d = reinterpret_cast<T*>(dst);
      for (std::uint64_t k = 0; k < n; ++k) d[k] = static_cast<T>(static_cast<float>(static_cast<double>(s[k])));
    });
  });
}

}  // namespace detail

/// See the file comment. `strict`: refuse a file holding tensors the model does not have.
inline void load_pretrained(zero::sharded_model& model, const std::filesystem::path& file, bool strict = true,
                            bool allow_nonfinite = false) {
  const zero::shard_plan& plan = model.plan();
  const auto& ps = plan.parameters();
  const auto& pl = plan.placements();
  struct staged {
    detail::staging_buffer params, master;
  };
  std::vector<staged> staging(plan.buffers().size());
  detail::load_phase(model.comm(), model.replica_comm(), file, [&] {
    if (!model.between_steps())
      throw error(errc::invalid_argument, "pretrained weights can only be loaded between steps");
    const detail::file f = detail::file::open_read(file);
    const std::shared_ptr<const safetensors_header> shared = detail::shared_safetensors_header(f);
    const safetensors_header& header = *shared;
    auto fail = [&](const std::string& why) -> error {
      return error(errc::invalid_argument, "safetensors file '" + file.string() + "': " + why);
    };
    // The file tensor of each storage owner: its own name, else another member of its tie group.
    std::vector<const safetensors_tensor*> source(ps.size(), nullptr);
    std::set<std::string> names;
    for (std::size_t p = 0; p < ps.size(); ++p) {
      names.insert(ps[p].name);
      source[p] = header.find(ps[p].name);
      if (source[p] == nullptr && !ps[p].tie_group.empty())
        for (std::size_t q = 0; q < ps.size() && source[p] == nullptr; ++q)
          if (ps[q].tie_group == ps[p].tie_group) source[p] = header.find(ps[q].name);
      const safetensors_tensor* t = source[p];
      if (t == nullptr)
        throw fail("the model's parameter '" + ps[p].name + "' " + zero::shape_text(ps[p].shape) +
                   " is not in the file");
      if (t->shape != ps[p].shape)
        throw fail("tensor '" + t->name + "' has shape " + zero::shape_text(t->shape) + ", the model's parameter '" +
                   ps[p].name + "' has " + zero::shape_text(ps[p].shape));
      if (!t->type || (*t->type != pl[p].type && !(is_floating_point(*t->type) && is_floating_point(pl[p].type))))
        throw fail("tensor '" + t->name + "' is " + t->dtype_name + ", which cannot become the model's " +
                   std::string(dtype_name(pl[p].type)) + " parameter '" + ps[p].name + "'");
    }
    if (strict)
      for (const auto& t : header.tensors)
        if (!names.contains(t.name))
          throw fail("the file holds tensor '" + t.name +
                     "', which the model does not have (pass strict = false to ignore it)");
    std::vector<unsigned char> raw;
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      const zero::flat_buffer& fb = plan.buffers()[b];
      const algorithms::range held = zero::checkpoint_access(model).held_range(b),
                              own = zero::checkpoint_access(model).optimizer_range(b);
      staged& s = staging[b];
      s.params = detail::staging_buffer(held.size() * dtype_size(fb.type), false);
      if (fb.trainable && fb.has_master) s.master = detail::staging_buffer(own.size() * 4, false);
      for (std::size_t p : fb.parameters) {
        const safetensors_tensor& t = *source[p];
        const std::uint64_t es = dtype_size(*t.type);
        auto read = [&](algorithms::range r, dtype to, unsigned char* base) {
          const std::uint64_t lo = std::max(r.begin, pl[p].offset), hi = std::min(r.end, pl[p].offset + pl[p].numel);
          if (lo >= hi) return;
          raw.resize(static_cast<std::size_t>((hi - lo) * es));
          f.read_at(raw.data(), raw.size(), t.begin + (lo - pl[p].offset) * es);
          if (!allow_nonfinite)
            if (const auto bad = detail::first_nonfinite(*t.type, raw.data(), hi - lo))
              throw fail("tensor '" + t.name + "' holds a non-finite value (NaN or infinity) at element " +
                         std::to_string(lo - pl[p].offset + *bad) +
                         "; pass allow_nonfinite = true (--allow-nonfinite) to load it anyway");
          unsigned char* converted = base + (lo - r.begin) * dtype_size(to);
          detail::convert_elements(*t.type, raw.data(), to, converted, hi - lo);
          // A finite value beyond the model's type (float32's 3.4e38 into bfloat16, 70000 into
          // float16) rounds to infinity: refused as the file's own infinities are.
          if (!allow_nonfinite && to != *t.type)
            if (const auto bad = detail::first_nonfinite(to, converted, hi - lo))
              throw fail(
                  "tensor '" + t.name + "' holds a value at element " + std::to_string(lo - pl[p].offset + *bad) +
                  " that is finite as " + t.dtype_name + " but beyond the range of the model's " +
                  std::string(dtype_name(to)) + " '" + ps[p].name +
                  "' (it rounds to infinity); pass allow_nonfinite = true (--allow-nonfinite) to load it anyway");
        };
        read(held, fb.type, s.params.data());
        if (!s.master.empty()) read(own, dtype::float32, s.master.data());
      }
    }
  });
  zero::checkpoint_access access(model);
  detail::commit_phase(model, file, [&] {
    access.begin_restore();
    const auto put = [&](void* dst, const detail::staging_buffer& from) {
      if (!from.empty()) detail::copy_in(access, dst, from.data(), from.bytes());
    };
    for (std::size_t b = 0; b < staging.size(); ++b) {
      put(access.held_parameters(b), staging[b].params);
      if (float* m = access.optimizer().master(b)) put(m, staging[b].master);
    }
    detail::finish_copies_in(access);  // the staging is freed after this
  });
}

}  // namespace ringzero::checkpoint
