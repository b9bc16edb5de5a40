#pragma once
/// @file
/// `checkpoint::replicated_state`: the training state of a data-parallel (DDP) trainer, whose
/// every rank holds every tensor: the trainer registers its parameters and optimizer state
/// tensors by name (host memory it owns; a registration is a view, nothing is copied). A save
/// splits every tensor evenly over the ranks, each writing its part (so the ranks write in
/// parallel and the files are those of any other checkpoint); a load reads every tensor whole
/// on every rank, from a checkpoint of any world size — or the parameters of a
/// `zero::sharded_model` checkpoint with the same names.
/// Errors: errc::invalid_argument for a duplicate tensor, a shape that does not match the
/// span's size, or an unknown dtype. Thread semantics: used by one thread.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/state_layout.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/zero/parameter_spec.hpp"

namespace ringzero::checkpoint {

/// See the file comment.
class replicated_state {
 public:
  /// One registered tensor.
  struct entry {
    tensor_spec spec;
    unsigned char* data = nullptr;
  };

  /// Registers parameter `name`: `values` (host memory, the trainer's), of `shape` (default:
  /// 1-D of values.size(); the product must equal values.size()).
  template <element_type T>
  void add_parameter(std::string name, std::span<T> values, std::vector<std::uint64_t> shape = {}) {
    add(std::move(name), tensor_role::parameter, 0, {}, values, std::move(shape));
  }
  /// Registers optimizer state `state` ("exp_avg", PyTorch's name in `state_name`) of parameter `name`.
  template <element_type T>
  void add_optimizer_state(std::string name, int state, std::string state_name, std::span<T> values,
                           std::vector<std::uint64_t> shape = {}) {
    add(std::move(name), tensor_role::optimizer_state, state, std::move(state_name), values, std::move(shape));
  }
  /// Registers the float32 master weights of parameter `name`.
  void add_master(std::string name, std::span<float> values, std::vector<std::uint64_t> shape = {}) {
    add(std::move(name), tensor_role::master, 0, {}, values, std::move(shape));
  }
  /// The optimizer as recorded in the index (free-form JSON, e.g. {"kind": "adamw", "lr": 0.001}).
  void set_optimizer(nlohmann::json description) { optimizer_ = std::move(description); }

  const std::vector<entry>& entries() const noexcept { return entries_; }
  const nlohmann::json& optimizer() const noexcept { return optimizer_; }

  /// The tensor specs, in registration order.
  std::vector<tensor_spec> specs() const {
    std::vector<tensor_spec> out;
    for (const entry& e : entries_) out.push_back(e.spec);
    return out;
  }

 private:
  template <element_type T>
  void add(std::string name, tensor_role role, int state, std::string state_name, std::span<T> values,
           std::vector<std::uint64_t> shape) {
    if (name.empty()) throw error(errc::invalid_argument, "checkpoint::replicated_state: a tensor needs a name");
    if (shape.empty()) shape = {values.size()};
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;
    if (n != values.size())
      throw error(errc::invalid_argument, "checkpoint::replicated_state: '" + name + "' has shape " +
                                              zero::shape_text(shape) + " (" + std::to_string(n) + " elements) but " +
                                              std::to_string(values.size()) + " values");
    for (const entry& e : entries_)
      if (e.spec.name == name && e.spec.role == role && e.spec.state == state)
        throw error(errc::invalid_argument, "checkpoint::replicated_state: '" + name + "' (" +
                                                std::string(role_name(role)) + ") is registered twice");
    entry e;
    e.spec.name = std::move(name);
    e.spec.role = role;
    e.spec.state = state;
    e.spec.state_name = std::move(state_name);
    e.spec.type = dtype_of<std::remove_const_t<T>>;
    e.spec.shape = std::move(shape);
    e.data = reinterpret_cast<unsigned char*>(values.data());
    entries_.push_back(std::move(e));
  }

  std::vector<entry> entries_;
  nlohmann::json optimizer_ = nlohmann::json::object();
};

namespace detail {

/// The layout of a save of `state` by `world_size` ranks: every tensor split evenly.
inline state_layout replicated_layout(const replicated_state& state, int world_size) {
  state_layout L;
  L.kind = "replicated";
  L.world_size = world_size;
  L.replica_group_size = 1;
  L.optimizer = state.optimizer();
  L.tensors = state.specs();
  L.pieces.resize(static_cast<std::size_t>(world_size));
  const auto w = static_cast<std::uint64_t>(world_size);
  for (std::size_t t = 0; t < L.tensors.size(); ++t) {
    const std::uint64_t n = L.tensors[t].numel();
    for (std::uint64_t r = 0; r < w; ++r) {
      const std::uint64_t b = n / w * r + std::min(r, n % w), e = n / w * (r + 1) + std::min(r + 1, n % w);
      if (b < e) L.pieces[static_cast<std::size_t>(r)].push_back({t, b, e});
    }
  }
  return L;
}

}  // namespace detail
}  // namespace ringzero::checkpoint
