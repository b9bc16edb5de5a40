// The ZeRO runtime's device path on CUDA streams: 2 ranks of the local backend sharing one GPU,
// stages 0-3. The state lives in device memory, parameters round-trip through set_parameter /
// read_parameter (stage 3 through the all_gather on the communicator's stream), a micro-batch's
// reductions run, and the optimizer step (no CUDA kernels yet) is refused with errc::unsupported
// before anything changes. Skipped without a device (suite 'gpu').
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/cuda_execution_stream.hpp"
#include "ringzero/zero/sharded_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;

TEST_CASE("device path on CUDA: parameters round-trip, a micro-batch reduces, the step is refused") {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    std::vector<std::string> step_errors(2);
    std::vector<int> round_trips(2, 0);
    local::cuda_launch_options launch;
    launch.devices = {0};
    local::launch_cuda(
        2,
        [&](local::cuda_communicator& comm) {
          plan_request q;
          parameter_spec a, b;
          a.name = "a";
          a.shape = {37};
          b.name = "b";
          b.shape = {5, 3};
          b.unit = "second";
          q.parameters = {a, b};
          q.stage = stage;
          q.precision.optimizer_states = 0;
          sharded_model_options options;
          options.optimizer.kind = optimizer_kind::sgd;
          options.optimizer.momentum = 0;
          primitive::cuda_stream compute(comm.cuda_device());
          cuda_execution_stream stream(compute);
          sharded_model model(comm, q, device_context{&stream}, options);
          CHECK(model.memory_in_use(primitive::memory_space::device).total() == model.plan().memory().total());
          std::vector<std::vector<float>> values(2);
          for (std::size_t p = 0; p < 2; ++p) {
            values[p].resize(model.plan().placements()[p].numel);
            for (std::size_t j = 0; j < values[p].size(); ++j) values[p][j] = static_cast<float>(j) * 0.5f - 3.0f;
            model.set_parameter(p, values[p]);
          }
          for (std::size_t u = model.unit_count(); u-- > 0;) {
            model.pre_backward(u);
            for (std::size_t p : model.plan().units()[u].members) {
              auto g = model.gradient<float>(p);
              primitive::enqueue_fill(compute, g.data(), g.size(), dtype::float32, 1.0 + comm.rank());
            }
            model.post_backward(u);
          }
          model.end_backward();
          bool same = true;
          for (std::size_t p = 0; p < 2; ++p) {
            std::vector<float> out(values[p].size());
            model.read_parameter(p, out);
            same = same && out == values[p];
          }
          round_trips[static_cast<std::size_t>(comm.rank())] = same ? 1 : 0;
          try {
            (void)model.step();
          } catch (const error& e) {
            if (e.kind() == errc::unsupported) step_errors[static_cast<std::size_t>(comm.rank())] = e.what();
          }
          compute.synchronize();
        },
        launch);
    for (std::size_t r = 0; r < 2; ++r) {
      CHECK(round_trips[r] == 1);
      CHECK(step_errors[r].find("have no kernels for a cuda_stream yet") != std::string::npos);
    }
  }
}
