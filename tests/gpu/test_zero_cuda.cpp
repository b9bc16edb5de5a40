// The ZeRO runtime's device path on CUDA streams: 2 ranks of the local backend sharing one GPU,
// stages 0-3, the state in device memory (allocations equal the plan), the optimizer step
// (SGD with Nesterov momentum, Adam, AdamW; float32, and bfloat16 with float32 master weights),
// clipping and the non-finite check as CUDA kernels, against the host runtime on the same
// inputs. Tolerance: the update kernel runs the host's float32 operations unfused
// (zero/shard_update.hpp), so with the same clip coefficient the parameters are bitwise the
// host's; the float64 sum of squares adds in another order (a block reduction), so the norm
// agrees to float64 rounding (relative 1e-12 here) and a clipped step may see a float32 clip
// coefficient one ulp apart, which moves a parameter by a few float32 ulps per step: with
// clipping on, parameters agree to a relative 1e-5 (1e-2 for bfloat16, a few bfloat16 ulps).
// With CPU offload (offload::optimizer): master weights and optimizer states in pinned host
// memory, the update on the CPU ordered against the communication stream by events and host
// functions (zero/sharded_model_offload.hpp); the same tolerances, the device and pinned
// allocations equal to the plan's device_memory() and host_memory(). With parameter offload
// (offload::parameters, stage 3): the parameter and gradient shards in pinned host memory too.
// float16 with dynamic loss scaling (zero/loss_scaler.hpp): the scale, read on the host at the
// step's wait, follows the host runtime's (halved at the overflow), the update the same way.
// Skipped without a device (suite 'gpu').
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/cuda_execution_stream.hpp"
#include "ringzero/zero/sharded_model.hpp"
#include "zero_test_support.hpp"

using namespace ringzero;
using namespace ringzero::zero;

namespace {

constexpr int world = 2;

template <class T>
void compare_with_host(int stage, bool clip, const optimizer_options& o, offload off = offload::none) {
  const sharded_model_options options = gpu_test::zero_model_options<T>(o, clip);
  plan_request q = gpu_test::zero_request(stage, dtype_of<T>, o, off, world);
  q.offload = offload::none;  // the host runtime keeps everything in host memory already
  plan_request qd = q;
  qd.offload = off;
  std::vector<gpu_test::zero_run> host(world), device(world);
  std::vector<int> memory_matches(world, 0);
  local::launch(world, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    sharded_model model(comm, q, options);
    host[r] = gpu_test::zero_train<T>(model, comm.rank(), world - 1, [](std::span<T> to, const std::vector<T>& from) {
      for (std::size_t j = 0; j < to.size(); ++j) to[j] = from[j];
    });
  });
  local::cuda_launch_options launch;
  launch.devices = {0};
  local::launch_cuda(
      world,
      [&](local::cuda_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        primitive::cuda_stream compute(comm.cuda_device());
        cuda_execution_stream stream(compute);
        sharded_model model(comm, qd, device_context{&stream}, options);
        memory_matches[r] = gpu_test::zero_memory_in_use_as_planned(model, off) ? 1 : 0;
        device[r] =
            gpu_test::zero_train<T>(model, comm.rank(), world - 1,
                                    [&](std::span<T> to, const std::vector<T>& from) {  // `from` outlives the step
                                      primitive::enqueue_copy(compute, to.data(), from.data(), to.size_bytes());
                                    });
        compute.synchronize();
      },
      launch);
  for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r) {
    CAPTURE(r);
    CHECK(memory_matches[r] == 1);
    gpu_test::check_zero_run(device[r], host[r], clip, gpu_test::zero_tolerance<T>(clip), options.loss_scaling.enabled);
  }
}

}  // namespace

TEST_CASE("device path on CUDA: stages 0-3, the optimizer step as kernels, against the host runtime") {
  const auto all = gpu_test::zero_optimizers();
  for (int stage = 0; stage <= 3; ++stage)
    for (std::size_t k = 0; k < all.size(); ++k) {
      CAPTURE(stage);
      CAPTURE(optimizer_name(all[k].kind));
      const bool clip = (stage + static_cast<int>(k)) % 2 == 1;
      CAPTURE(clip);
      compare_with_host<float>(stage, clip, all[k]);
      compare_with_host<bfloat16>(stage, !clip, all[k]);
      compare_with_host<float16>(stage, clip, all[k]);
    }
}

TEST_CASE("device path on CUDA with CPU offload: stages 0-3, the update on the CPU, against the host runtime") {
  const auto all = gpu_test::zero_optimizers();
  for (int stage = 0; stage <= 3; ++stage)
    for (std::size_t k = 0; k < all.size(); ++k) {
      CAPTURE(stage);
      CAPTURE(optimizer_name(all[k].kind));
      const bool clip = (stage + static_cast<int>(k)) % 2 == 0;
      CAPTURE(clip);
      compare_with_host<float>(stage, clip, all[k], offload::optimizer);
      compare_with_host<bfloat16>(stage, !clip, all[k], offload::optimizer);
      compare_with_host<float16>(stage, clip, all[k], offload::optimizer);
    }
}

TEST_CASE(
    "device path on CUDA with parameter offload: stage 3, the shards in pinned host memory, against the host runtime") {
  // The shard copied into the gather buffer before each in-place all_gather, the reduced
  // gradients added into pinned host memory by the accumulation kernel, the update on the CPU.
  const auto all = gpu_test::zero_optimizers();
  for (std::size_t k = 0; k < all.size(); ++k) {
    CAPTURE(optimizer_name(all[k].kind));
    const bool clip = k % 2 == 0;
    CAPTURE(clip);
    compare_with_host<float>(3, clip, all[k], offload::parameters);
    compare_with_host<bfloat16>(3, !clip, all[k], offload::parameters);
    compare_with_host<float16>(3, clip, all[k], offload::parameters);
  }
}

TEST_CASE("device path on CUDA: host memory CUDA does not know, handed to set_parameter_async, is refused") {
  // cudaPointerGetAttributes says the vector's memory is unregistered host memory: refused
  // before anything is copied, naming the parameter, the memory and the stream's device.
  const optimizer_options sgd;
  plan_request q = gpu_test::zero_request(1, dtype::float32, sgd, offload::none, 1);
  std::string message;
  local::cuda_launch_options launch;
  launch.devices = {0};
  local::launch_cuda(
      1,
      [&](local::cuda_communicator& comm) {
        primitive::cuda_stream compute(comm.cuda_device());
        cuda_execution_stream stream(compute);
        sharded_model model(comm, q, device_context{&stream}, sharded_model_options{});
        std::vector<float> host(static_cast<std::size_t>(model.numel(0)), 1.0f);
        try {
          model.set_parameter_async(0, static_cast<const float*>(host.data()));
        } catch (const error& e) { message = e.what(); }
      },
      launch);
  CHECK(message.find("is host memory that CUDA does not know") != std::string::npos);
  CHECK(message.find("expected device memory of that device") != std::string::npos);
}

TEST_CASE("device path on CUDA: the whole model from and into a cudaMalloc block at stage 3, bit for bit") {
  // An llm.c-style block: bfloat16 values at layout_for_adoption's offsets, handed over with
  // set_parameters_async (each rank keeps its shard), the block cleared, and
  // read_parameters_async gathering the model back into it: the same bits, zeros in the padding.
  const optimizer_options adam = gpu_test::zero_optimizers()[1];
  const plan_request q = gpu_test::zero_request(3, dtype::bfloat16, adam, offload::none, world);
  std::vector<int> same(world, 0);
  local::cuda_launch_options launch;
  launch.devices = {0};
  local::launch_cuda(
      world,
      [&](local::cuda_communicator& comm) {
        primitive::cuda_stream compute(comm.cuda_device());
        cuda_execution_stream stream(compute);
        sharded_model model(comm, q, device_context{&stream}, gpu_test::zero_model_options<bfloat16>(adam, false));
        const adoption_layout l = layout_for_adoption(model.plan());
        std::vector<unsigned char> want(l.bytes, 0);
        const auto& pl = model.plan().placements();
        for (std::size_t p = 0; p < pl.size(); ++p)
          for (std::uint64_t j = 0; j < pl[p].numel; ++j) {
            const auto v = static_cast<bfloat16>(0.01f * static_cast<float>((pl[p].storage * 131 + j) % 97) - 0.4f);
            std::memcpy(want.data() + l.parameter_offset[p] + j * sizeof v, &v, sizeof v);
          }
        void* block = nullptr;
        primitive::cudart::check(cudaMalloc(&block, l.bytes), "cudaMalloc");
        // On the compute stream (the runtime's streams do not wait for the legacy default stream).
        primitive::cudart::check(cudaMemcpyAsync(block, want.data(), l.bytes, cudaMemcpyHostToDevice, compute.get()),
                                 "cudaMemcpyAsync");
        set_parameters_async(model, block, l.bytes);
        compute.synchronize();
        model.synchronize();
        primitive::cudart::check(cudaMemsetAsync(block, 0xff, l.bytes, compute.get()), "cudaMemsetAsync");
        read_parameters_async(model, block, l.bytes);
        compute.synchronize();
        model.synchronize();
        std::vector<unsigned char> got(l.bytes);
        primitive::cudart::check(cudaMemcpy(got.data(), block, l.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
        (void)cudaFree(block);
        // Between the flat buffers the memory is not the model's: compare the buffers only.
        bool equal = true;
        for (std::size_t b = 0; b < model.plan().buffers().size(); ++b) {
          const flat_buffer& f = model.plan().buffers()[b];
          equal = equal && std::memcmp(got.data() + l.buffer_offset[b], want.data() + l.buffer_offset[b],
                                       f.numel * dtype_size(f.type)) == 0;
        }
        same[static_cast<std::size_t>(comm.rank())] = equal ? 1 : 0;
      },
      launch);
  for (int r = 0; r < world; ++r) CHECK(same[static_cast<std::size_t>(r)] == 1);
}
