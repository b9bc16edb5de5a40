// A trainer-to-be that uses ringzero as an installed package: an all_reduce on 3 ranks.
#include <ringzero/ringzero.hpp>

#include <cstdio>
#include <vector>

int main() {
  int bad = 0;
  ringzero::local::launch(3, [&](ringzero::communicator& comm) {
    std::vector<float> grad(1000, static_cast<float>(comm.rank() + 1));
    ringzero::all_reduce(comm, std::span<float>(grad), ringzero::reduce_kind::sum);
    for (float g : grad)
      if (g != 6.0f) bad = 1;
  });
  std::puts(bad ? "wrong" : "ok");
  return bad;
}
