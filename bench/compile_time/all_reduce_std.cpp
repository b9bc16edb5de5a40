// Compile-time benchmark (bench/compile_time.sh): the baseline for all_reduce_umbrella.cpp, the
// same 4-thread sum written with the standard headers it needs and nothing from ringzero.
#include <barrier>
#include <cstdio>
#include <functional>
#include <span>
#include <thread>
#include <vector>

int main() {
  constexpr int world_size = 4;
  std::vector<std::vector<float>> grads(world_size);
  std::barrier sync(world_size);
  float total = 0.0F;
  auto rank_main = [&](int rank) {
    grads[rank].assign(1000, static_cast<float>(rank));
    sync.arrive_and_wait();
    std::vector<float> sum(1000, 0.0F);
    for (const auto& g : grads)
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += std::span<const float>(g)[i];
    sync.arrive_and_wait();
    grads[rank] = sum;
    if (rank == 0) total = sum[0];
  };
  std::vector<std::jthread> threads;
  for (int r = 0; r < world_size; ++r) threads.emplace_back(std::function<void()>([&, r] { rank_main(r); }));
  threads.clear();
  std::printf("%g\n", static_cast<double>(total));
  return total == 6.0F ? 0 : 1;
}
