// Writes a checkpoint for tests/checkpoint/check_safetensors.py: the ZeRO test model (float32,
// AdamW, stage 3 on 3 ranks, 2 steps; tied, frozen, empty and scalar parameters) saved into
// ARGV[1], and ARGV[1]/expected.json holding every parameter's values as read back from the
// model (read_parameter, independent of the checkpoint code) as 32-bit patterns.
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint_test_util.hpp"

int main(int argc, char** argv) {
  using namespace ckpt_test;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  nlohmann::json expected = nlohmann::json::object();
  local::launch(3, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    train(m, comm.rank(), 0, 2);
    const auto params = parameters_of(m);
    if (comm.rank() == 0)
      for (std::size_t p = 0; p < params.size(); ++p) {
        std::vector<std::uint32_t> bits(params[p].size());
        if (!bits.empty()) std::memcpy(bits.data(), params[p].data(), bits.size() * 4);
        expected[m.plan().parameters()[p].name] = bits;
      }
    ringzero::checkpoint::checkpointer(root).save(m, {}, "python");
  });
  std::ofstream(root / "expected.json") << expected.dump();
  return 0;
}
