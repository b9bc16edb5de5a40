// Compile-time benchmark (bench/compile_time.sh): the smallest all_reduce program through the
// umbrella header. Its twin all_reduce_std.cpp does the same work with the standard headers only.
#include <ringzero/ringzero.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
  float total = 0.0F;
  ringzero::local::launch(4, [&](ringzero::communicator& comm) {
    std::vector<float> grad(1000, static_cast<float>(comm.rank()));
    ringzero::all_reduce(comm, std::span<float>(grad), ringzero::reduce_kind::sum);
    if (comm.rank() == 0) total = grad[0];
  });
  std::printf("%g\n", static_cast<double>(total));
  return total == 6.0F ? 0 : 1;
}
