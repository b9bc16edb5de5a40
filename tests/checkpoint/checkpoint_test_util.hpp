// Helpers of the checkpoint tests: a scratch directory, a training loop over the ZeRO test
// model (tests/zero/zero_test_model.hpp) that can start at any step, the full state of a model
// read back through a checkpoint, and file surgery for the bad-input tests.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../zero/zero_test_model.hpp"
#include "ringzero/checkpoint.hpp"

namespace ckpt_test {

namespace fs = std::filesystem;
using namespace ringzero;
using namespace ringzero::zero;

/// A fresh directory under the system's temporary directory, removed at scope exit.
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& what) {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("ringzero-ckpt-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

inline optimizer_options sgd_momentum() { return zero_test::test_optimizers()[0]; }
inline optimizer_options adamw() { return zero_test::test_optimizers()[2]; }

inline plan_request request(std::vector<parameter_spec> params, int stage, std::uint64_t alignment = 16,
                            int optimizer_states = 2) {
  plan_request q;
  q.precision.optimizer_states = optimizer_states;
  q.parameters = std::move(params);
  q.stage = stage;
  q.alignment_bytes = alignment;
  return q;
}

inline sharded_model_options model_options(const optimizer_options& o) {
  sharded_model_options m;
  m.optimizer = o;
  return m;
}

/// Sets every parameter to its initial value (identical on every rank).
inline void initialise(sharded_model& model) {
  const auto& plan = model.plan();
  for (std::size_t p = 0; p < plan.parameters().size(); ++p) {
    std::vector<float> v(plan.placements()[p].numel);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = zero_test::initial_value(plan.placements()[p].storage, j);
    model.set_parameter(p, v);
  }
}

/// Steps [first, last) of the test loop (the gradients depend on rank, step and parameters).
inline void train(sharded_model& model, int rank, int first, int last) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  const std::size_t units = model.unit_count();
  const auto frozen = plan.find("frozen.w");
  for (int step = first; step < last; ++step) {
    for (std::size_t u = 0; u < units; ++u) {
      model.pre_forward(u);
      model.post_forward(u);
    }
    for (std::size_t u = units; u-- > 0;) {
      model.pre_backward(u);
      const bool in_u1 = plan.units()[u].name == "u1";
      float frozen_sum = 0;
      if (in_u1 && frozen)
        for (float x : model.parameter<float>(*frozen)) frozen_sum += x;
      for (std::size_t p : plan.units()[u].members) {
        if (!params[p].trainable || plan.placements()[p].numel == 0) continue;
        const std::size_t s = plan.placements()[p].storage;
        auto w = model.parameter<float>(p);
        auto g = model.gradient<float>(p);
        for (std::size_t j = 0; j < g.size(); ++j)
          g[j] +=
              zero_test::gradient_term(rank, 0, step, s, j, zero_test::use_of(params[p].name), w[j], frozen_sum, in_u1);
      }
      model.post_backward(u);
    }
    model.end_backward();
    model.step();
  }
}

/// Every parameter's values (a collective at stage 3), as their bits.
inline std::vector<std::vector<float>> parameters_of(sharded_model& model) {
  const auto& plan = model.plan();
  std::vector<std::vector<float>> out(plan.parameters().size());
  for (std::size_t p = 0; p < out.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

/// This rank's master weights and optimizer states, padding included, as bytes (local).
inline std::vector<unsigned char> optimizer_bytes(sharded_model& model) {
  std::vector<unsigned char> out;
  const zero::sharded_optimizer& o = model.optimizer();
  for (std::size_t b = 0; b < model.plan().buffers().size(); ++b) {
    const std::size_t n =
        static_cast<std::size_t>(zero::checkpoint_access(model).optimizer_range(b).size()) * sizeof(float);
    auto add = [&](const float* x) {
      if (x != nullptr)
        out.insert(out.end(), reinterpret_cast<const unsigned char*>(x), reinterpret_cast<const unsigned char*>(x) + n);
    };
    add(o.master(b));
    for (int k = 0; k < o.options().state_count(); ++k) add(o.state(b, k));
  }
  return out;
}

/// True when a and b hold the same bits.
inline bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        (!a[i].empty() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0))
      return false;
  return true;
}

/// Every tensor of a checkpoint read whole through a fragment_reader: (name#role) -> bytes.
inline std::map<std::string, std::vector<unsigned char>> full_tensors(const fs::path& path) {
  const fs::path dir = checkpoint::resolve_checkpoint(path);
  const checkpoint::checkpoint_index index = checkpoint::read_index(dir);
  checkpoint::fragment_reader reader(dir, index);
  std::map<std::string, std::vector<unsigned char>> out;
  for (const auto& t : index.tensors) {
    const checkpoint::tensor_record* data = t.tied_to.empty() ? &t : index.find(t.tied_to, t.role, t.state);
    std::vector<unsigned char> bytes(static_cast<std::size_t>(t.numel() * dtype_size(t.type)));
    reader.read(*data, 0, t.numel(), bytes.data());
    out[t.name + "#" + checkpoint::role_token(t.role, t.state)] = std::move(bytes);
  }
  return out;
}

/// The checkpoint directory `latest` names.
inline fs::path latest_dir(const fs::path& root) { return checkpoint::resolve_checkpoint(root); }

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

/// Runs `fn(comm)` on `world` ranks and returns each rank's error message ("" when it did not throw).
template <class F>
std::vector<std::string> errors_on_every_rank(int world, F&& fn) {
  std::vector<std::string> out(static_cast<std::size_t>(world));
  local::launch(world, [&](communicator& comm) {
    try {
      fn(comm);
    } catch (const error& e) { out[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  return out;
}

}  // namespace ckpt_test
