// The ZeRO runtime over NCCL: `zero::sharded_model` on NCCL communicators (nccl::launch, one
// rank per GPU: a world of one on a machine with one GPU, two ranks where there are two or more),
// its device path on CUDA streams, stages 0-3, SGD with Nesterov momentum, Adam and AdamW,
// float32, bfloat16 with float32 master weights and float16 with dynamic loss scaling, with and
// without CPU offload (offload::optimizer; at stage 3 also offload::parameters), against the host runtime on the same
// inputs and the same number of ranks (local backend), with test_zero_cuda.cpp's tolerances: at most two ranks, so that
// NCCL's order of a reduction cannot move a bit (a sum of two terms is the same in either order). The runtime's
// allocations: what it holds (memory_in_use) in device and pinned host memory equals the plan's device_memory() and
// host_memory(), and what it has allocated (memory_allocated, counted where it allocates) is that plus the step's
// scalars (on the device, and offload's copy of them in pinned host memory), after construction and after training.
// Skipped without a device (suite 'gpu').
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "ringzero/backend/local/launch.hpp"
#include "ringzero/backend/nccl.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/cuda_execution_stream.hpp"
#include "ringzero/zero/sharded_model.hpp"
#include "zero_test_support.hpp"

namespace zero_nccl_test {

using namespace ringzero;
using namespace ringzero::zero;

/// One run of the sweep.
struct run_config {
  int stage = 0;
  dtype type = dtype::float32;
  optimizer_options optimizer;
  bool clip = false;
  offload off = offload::none;
};

/// Stages 0-3 x the optimizers x float32, bfloat16, float16, without and with offload of the
/// optimizer, and stage 3 with offload of the parameters; clipping alternates as in test_zero_cuda.cpp.
inline std::vector<run_config> sweep() {
  std::vector<run_config> all;
  const auto optimizers = gpu_test::zero_optimizers();
  for (offload off : {offload::none, offload::optimizer, offload::parameters})
    for (int stage = off == offload::parameters ? 3 : 0; stage <= 3; ++stage)
      for (std::size_t k = 0; k < optimizers.size(); ++k) {
        const bool clip = (stage + static_cast<int>(k)) % 2 == (off == offload::none ? 1 : 0);
        all.push_back({stage, dtype::float32, optimizers[k], clip, off});
        all.push_back({stage, dtype::bfloat16, optimizers[k], !clip, off});
        all.push_back({stage, dtype::float16, optimizers[k], clip, off});
      }
  return all;
}

/// `f.template operator()<T>()` with T the element type of `t` (float32, bfloat16 or float16).
template <class F>
void with_type(dtype t, F&& f) {
  if (t == dtype::bfloat16)
    f.template operator()<bfloat16>();
  else if (t == dtype::float16)
    f.template operator()<float16>();
  else
    f.template operator()<float>();
}

/// The plan request of `c` on `world` ranks: offloaded only for the device run.
inline plan_request request_of(const run_config& c, int world, bool device) {
  return gpu_test::zero_request(c.stage, c.type, c.optimizer, device ? c.off : offload::none, world);
}

/// Whether what `model` has allocated in device and pinned host memory is its plan's device and
/// host memory plus the step's scalars (on the device; with offload, its copy in host memory too).
inline bool allocated_as_planned(const sharded_model& model, offload off) {
  const shard_plan& plan = model.plan();
  const std::uint64_t scalars = sizeof(step_scalars);
  return model.memory_allocated(primitive::memory_space::device).current == plan.device_memory().total() + scalars &&
         model.memory_allocated(primitive::memory_space::pinned_host).current ==
             plan.host_memory().total() + (off == offload::none ? 0 : scalars);
}

}  // namespace zero_nccl_test

TEST_CASE("ZeRO over NCCL: stages 0-3, float32, bfloat16 and float16, with and without offload, against the host") {
  using namespace zero_nccl_test;
  const int world = primitive::cudart::device_count() >= 2 ? 2 : 1;
  MESSAGE("NCCL ranks (one per GPU): " << world);
  std::vector<int> devices;
  for (int d = 0; d < world; ++d) devices.push_back(d);
  const std::vector<run_config> configs = sweep();
  const auto ranks = static_cast<std::size_t>(world);
  std::vector<std::vector<gpu_test::zero_run>> host(configs.size(), std::vector<gpu_test::zero_run>(ranks));
  std::vector<std::vector<gpu_test::zero_run>> device = host;
  // Per run and rank: memory_in_use as planned, memory_allocated as planned after construction
  // and after training; the communicator's memory space.
  std::vector<std::vector<int>> in_use(configs.size(), std::vector<int>(ranks, 0));
  std::vector<std::vector<int>> allocated = in_use, allocated_after = in_use;
  std::vector<int> on_device(ranks, 0);

  local::launch(world, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const run_config& c = configs[i];
      with_type(c.type, [&]<class T>() {
        sharded_model model(comm, request_of(c, world, false), gpu_test::zero_model_options<T>(c.optimizer, c.clip));
        host[i][r] =
            gpu_test::zero_train<T>(model, comm.rank(), world - 1, [](std::span<T> to, const std::vector<T>& from) {
              for (std::size_t j = 0; j < to.size(); ++j) to[j] = from[j];
            });
      });
    }
  });
  nccl::launch(devices, [&](nccl::communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    on_device[r] = comm.space() == memory_space::cuda ? 1 : 0;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const run_config& c = configs[i];
      with_type(c.type, [&]<class T>() {
        primitive::cuda_stream compute(comm.cuda_device());
        cuda_execution_stream stream(compute);
        sharded_model model(comm, request_of(c, world, true), device_context{&stream},
                            gpu_test::zero_model_options<T>(c.optimizer, c.clip));
        in_use[i][r] = gpu_test::zero_memory_in_use_as_planned(model, c.off) ? 1 : 0;
        allocated[i][r] = allocated_as_planned(model, c.off) ? 1 : 0;
        device[i][r] =
            gpu_test::zero_train<T>(model, comm.rank(), world - 1,
                                    [&](std::span<T> to, const std::vector<T>& from) {  // `from` outlives the step
                                      primitive::enqueue_copy(compute, to.data(), from.data(), to.size_bytes());
                                    });
        compute.synchronize();
        allocated_after[i][r] = allocated_as_planned(model, c.off) ? 1 : 0;
      });
    }
  });

  for (std::size_t r = 0; r < ranks; ++r) CHECK(on_device[r] == 1);
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const run_config& c = configs[i];
    CAPTURE(c.stage);
    CAPTURE(optimizer_name(c.optimizer.kind));
    CAPTURE(dtype_name(c.type));
    CAPTURE(c.clip);
    CAPTURE(offload_name(c.off));
    for (std::size_t r = 0; r < ranks; ++r) {
      CAPTURE(r);
      CHECK(in_use[i][r] == 1);
      CHECK(allocated[i][r] == 1);
      CHECK(allocated_after[i][r] == 1);
      with_type(c.type, [&]<class T>() {
        gpu_test::check_zero_run(device[i][r], host[i][r], c.clip, gpu_test::zero_tolerance<T>(c.clip),
                                 std::is_same_v<T, float16>);
      });
    }
  }
}
