// The checkpoints tests/tools/check_ringzero_ckpt.py runs ringzero-ckpt on (not a test itself):
//   checkpoint_fixture save ROOT WORLD STAGE EXPECTED.safetensors
//     trains the C18 model (an embedding [11, 4] tied to the output layer, a frozen [6, 3] layer,
//     two trainable tensors) for 2 AdamW steps on WORLD ranks at STAGE, saves it as ROOT/c18, and
//     writes the model's full parameters (read_parameter) to EXPECTED.safetensors;
//   checkpoint_fixture load DIR WORLD STAGE STATE.safetensors
//     loads DIR into the same model on WORLD ranks at STAGE and writes every tensor of its state
//     (parameters, Adam moments; "name#role") read back through a fresh save, to STATE.safetensors.
//   checkpoint_fixture python DIR
//     for tests/checkpoint/check_safetensors.py: the ZeRO test model (float32, AdamW, stage 3 on 3
//     ranks, 2 steps; tied, frozen, empty and scalar parameters) saved into DIR, and
//     DIR/expected.json holding every parameter's values as read back from the model
//     (read_parameter, independent of the checkpoint code) as 32-bit patterns.
// One program for both scripts: each program including the checkpoint layer costs about a minute
// of compiler time. Exit status 0, or 1 with the error on stderr.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fstream>

#include <nlohmann/json.hpp>

#include "../checkpoint/checkpoint_test_util.hpp"
#include "../zero/zero_test_model.hpp"
#include "ringzero/checkpoint.hpp"

namespace {

namespace ck = ringzero::checkpoint;
namespace fs = std::filesystem;
using namespace ringzero;

zero::plan_request tied_model(int stage) {
  using zero_test::make_spec;
  zero::plan_request q;
  q.parameters = {make_spec("embed", {11, 4}, "u0", true, "tok"), make_spec("l1.w", {4, 6}, "u1"),
                  make_spec("frozen.w", {6, 3}, "u1", false), make_spec("l1.b", {6}, "u1"),
                  make_spec("out", {11, 4}, "u2", true, "tok")};
  q.stage = stage;
  return q;
}

zero::sharded_model_options adamw() {
  zero::sharded_model_options o;
  o.optimizer = zero_test::test_optimizers()[2];
  return o;
}

/// Writes `tensors` (name -> float32 values or raw bytes with their dtype) as one safetensors file.
void write_safetensors(const fs::path& path,
                       const std::map<std::string, std::pair<dtype, std::vector<unsigned char>>>& tensors) {
  std::vector<ck::safetensors_entry> entries;
  std::string data;
  for (const auto& [name, t] : tensors) {
    entries.push_back({name, t.first, {t.second.size() / dtype_size(t.first)}, t.second.size()});
    data.append(reinterpret_cast<const char*>(t.second.data()), t.second.size());
  }
  const std::string file = ck::encode_safetensors_header(entries, {}) + data;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(file.data(), 1, file.size(), f) != file.size() || std::fclose(f) != 0)
    throw error(errc::io_error, "cannot write " + path.string());
}

void save(const fs::path& root, int world, int stage, const fs::path& expected) {
  std::map<std::string, std::pair<dtype, std::vector<unsigned char>>> values;
  local::launch(world, [&](communicator& comm) {
    zero::sharded_model m(comm, tied_model(stage), adamw());
    const auto& plan = m.plan();
    for (std::size_t p = 0; p < plan.parameters().size(); ++p) {
      std::vector<float> v(plan.placements()[p].numel);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = zero_test::initial_value(plan.placements()[p].storage, j);
      m.set_parameter(p, v);
    }
    for (int step = 0; step < 2; ++step) {
      for (std::size_t u = 0; u < m.unit_count(); ++u) {
        m.pre_forward(u);
        m.post_forward(u);
      }
      for (std::size_t u = m.unit_count(); u-- > 0;) {
        m.pre_backward(u);
        for (std::size_t p : plan.units()[u].members) {
          if (!plan.parameters()[p].trainable) continue;
          auto g = m.gradient<float>(p);
          auto w = m.parameter<float>(p);
          for (std::size_t j = 0; j < g.size(); ++j)
            g[j] += zero_test::gradient_term(comm.rank(), 0, step, plan.placements()[p].storage, j, 0, w[j], 0, false);
        }
        m.post_backward(u);
      }
      m.end_backward();
      m.step();
    }
    for (std::size_t p = 0; p < plan.parameters().size(); ++p) {
      std::vector<float> v(plan.placements()[p].numel);
      m.read_parameter(p, v);
      if (comm.rank() == 0) {
        std::vector<unsigned char> b(v.size() * 4);
        std::memcpy(b.data(), v.data(), b.size());
        values[plan.parameters()[p].name] = {dtype::float32, std::move(b)};
      }
    }
    ck::training_progress progress;
    progress.epoch = 1;
    progress.rng_seeds = {7};
    ck::checkpointer(root).save(m, progress, "c18");
  });
  write_safetensors(expected, values);
}

void load(const fs::path& dir, int world, int stage, const fs::path& out) {
  const fs::path again = out.string() + ".resaved";
  fs::remove_all(again);
  local::launch(world, [&](communicator& comm) {
    zero::sharded_model m(comm, tied_model(stage), adamw());
    ck::load(m, dir);
    ck::checkpointer(again).save(m, {}, "state");
  });
  const fs::path d = ck::resolve_checkpoint(again);
  const ck::checkpoint_index index = ck::read_index(d);
  ck::fragment_reader reader(d, index);
  std::map<std::string, std::pair<dtype, std::vector<unsigned char>>> tensors;
  for (const auto& t : index.tensors) {
    const ck::tensor_record* data = t.tied_to.empty() ? &t : index.find(t.tied_to, t.role, t.state);
    std::vector<unsigned char> bytes(static_cast<std::size_t>(t.numel() * dtype_size(t.type)));
    reader.read(*data, 0, t.numel(), bytes.data());
    tensors[t.name + "#" + ck::role_token(t.role, t.state)] = {t.type, std::move(bytes)};
  }
  fs::remove_all(again);
  write_safetensors(out, tensors);
}

void python(const fs::path& root) {
  nlohmann::json expected = nlohmann::json::object();
  local::launch(3, [&](communicator& comm) {
    zero::sharded_model m(comm, ckpt_test::request(zero_test::test_parameters(), 3),
                          ckpt_test::model_options(ckpt_test::adamw()));
    ckpt_test::initialise(m);
    ckpt_test::train(m, comm.rank(), 0, 2);
    const auto params = ckpt_test::parameters_of(m);
    if (comm.rank() == 0)
      for (std::size_t p = 0; p < params.size(); ++p) {
        std::vector<std::uint32_t> bits(params[p].size());
        if (!bits.empty()) std::memcpy(bits.data(), params[p].data(), bits.size() * 4);
        expected[m.plan().parameters()[p].name] = bits;
      }
    ck::checkpointer(root).save(m, {}, "python");
  });
  std::ofstream(root / "expected.json") << expected.dump();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "python") {
    try {
      python(argv[2]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "checkpoint_fixture: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (argc != 6 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "load")) {
    std::fprintf(
        stderr, "usage: checkpoint_fixture save ROOT WORLD STAGE EXPECTED | load DIR WORLD STAGE STATE | python DIR\n");
    return 2;
  }
  try {
    const int world = std::atoi(argv[3]), stage = std::atoi(argv[4]);
    if (std::string(argv[1]) == "save")
      save(argv[2], world, stage, argv[5]);
    else
      load(argv[2], world, stage, argv[5]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}
