#pragma once
// What the cuda-on-host tests share: a host launcher that records the kernels it runs, and the
// launchers every case runs with.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ringzero/primitive/kernels/grid.hpp"

namespace ringzero_test {

/// The names of the kernels run so far in this process.
inline std::set<std::string>& kernels_run() {
  static std::set<std::string> names;
  return names;
}

/// A host launcher that records the kernels it runs.
struct recording_launcher : ringzero::primitive::kernels::host_launcher {
  template <class Body>
  int launch(const Body& body, std::uint64_t blocks, unsigned threads) const {
    kernels_run().insert(Body::kernel_name);
    return host_launcher::launch(body, blocks, threads);
  }
};

/// The grid capped at 1 resident block (one block strides over everything), at 3 with blocks
/// and threads run last to first, uncapped, and sequential (the element-wise kernels that honour
/// it in one block of one thread, as the host stream runs the optimizer update).
inline std::vector<recording_launcher> launchers() {
  recording_launcher one, three, wide, sequential;
  one.resident = 1;
  three.resident = 3;
  three.reverse = true;
  wide.resident = 1u << 20;
  sequential.sequential = true;
  return {one, three, wide, sequential};
}

}  // namespace ringzero_test
