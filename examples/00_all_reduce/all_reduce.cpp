// The smallest complete ringzero program: 4 ranks as threads of this process (the local backend)
// each hold a vector filled with their rank; one all_reduce of sum leaves 0+1+2+3 = 6 everywhere.
// Build: g++ -std=c++20 -O2 -I include examples/00_all_reduce/all_reduce.cpp -pthread
#include <cstdio>
#include <span>
#include <vector>

#include <ringzero/ringzero.hpp>

int main() {
  constexpr int world_size = 4;
  constexpr std::size_t count = 1 << 20;  // elements per rank
  int wrong = 0;                          // written by rank 0 only
  ringzero::local::launch(world_size, [&](ringzero::communicator& comm) {
    std::vector<float> data(count, float(comm.rank()));
    ringzero::all_reduce(comm, std::span<float>(data), ringzero::reduce_kind::sum);
    if (comm.rank() == 0) {
      const float expected = world_size * (world_size - 1) / 2.0f;  // 0 + 1 + ... + (world_size - 1)
      for (float x : data) wrong += x != expected;
      std::printf("rank 0 of %d: data[0] = %g after all_reduce(sum), %d wrong of %zu\n", comm.world_size(),
                  double(data[0]), wrong, count);
    }
  });
  return wrong == 0 ? 0 : 1;
}
