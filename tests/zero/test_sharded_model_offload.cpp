// CPU offload (offload::optimizer) of the ZeRO runtime's device path on the simulated device:
// master weights and optimizer states in host memory updated by CPU work on the offload stream,
// gradient shards copied in and parameter shards copied out on the communication stream; and
// offload::parameters (stage 3): the parameter and gradient shards in host memory too, copied
// into the gather buffers before in-place all_gathers and updated in place by the CPU. Every
// result is bitwise the host runtime's without offload (stages 0-3, float32 and bfloat16 with
// float32 master weights, world sizes 1-4, accumulation, a skipped step); allocations equal the
// plan's device and host memory; offload without pinned memory or without a device context is
// refused on every rank. Suite device-sim (also run with RINGZERO_HOST_STREAM_DELAY_US set).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zero_test_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;
using namespace zero_test;

namespace {

plan_request offload_request(int stage, int accumulation, bool bf16, const optimizer_options& o, offload off) {
  plan_request q;
  q.parameters = test_parameters();
  q.stage = stage;
  q.accumulation_steps = accumulation;
  q.alignment_bytes = 16;
  if (bf16) q.precision = precision::bfloat16_adam();
  q.precision.optimizer_states = o.state_count();
  q.offload = off;
  return q;
}

/// The test loop for parameters and gradients of type T (float or bfloat16) with `accumulation`
/// micro-batches per step: `run` executes the backward arithmetic at once (host path) or
/// enqueues it on the compute stream (device path). Step `poisoned` (if >= 0) gets an infinite
/// gradient on rank 0, so that step is skipped. Returns every parameter's final values.
template <class T, class Run>
std::vector<std::vector<float>> train(sharded_model& model, int rank, int steps, Run run,
                                      std::vector<step_result>& results, int poisoned = -1,
                                      const std::function<step_result()>& do_step = {}) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  const int accumulation = plan.request().accumulation_steps;
  set_initial_parameters(model);
  for (int step = 0; step < steps; ++step) {
    for (int micro = 0; micro < accumulation; ++micro) {
      one_pass(model, [&](std::size_t p) {
        const std::span<T> w = model.parameter<T>(p);
        const std::span<T> g = model.gradient<T>(p);
        const std::size_t s = plan.placements()[p].storage;
        const int use = use_of(params[p].name);
        const bool poison = step == poisoned && rank == 0 && micro == 0 && params[p].name == "l1.b";
        run([=] {
          for (std::size_t j = 0; j < g.size(); ++j)
            g[j] = static_cast<T>(static_cast<float>(g[j]) +
                                  gradient_term(rank, micro, step, s, j, use, static_cast<float>(w[j]), 0, false));
          if (poison) g[0] = static_cast<T>(std::numeric_limits<float>::infinity());
        });
      });
      model.end_backward();
    }
    results.push_back(do_step ? do_step() : model.step());
  }
  std::vector<std::vector<float>> out(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

/// What one rank's run on the device path reports.
struct device_run {
  std::vector<std::vector<float>> values;
  std::vector<step_result> steps;
  memory_breakdown host_space, device_space, pinned_space, offloaded;
  primitive::memory_usage measured;  // memory_allocated(host)
  memory_breakdown asked;            // memory_allocated(host, category).current, by category
  std::uint64_t scratch = 0;         // memory_allocated(host, scratch).current
};

template <class T>
device_run run_on_stream(communicator& comm, const plan_request& q, const sharded_model_options& options, int steps,
                         int poisoned) {
  primitive::host_stream compute;
  host_execution_stream stream(compute);
  sharded_model model(comm, q, device_context{&stream}, options);
  device_run r;
  r.values = train<T>(
      model, comm.rank(), steps, [&](const auto& work) { compute.enqueue(work); }, r.steps, poisoned);
  compute.synchronize();
  r.host_space = model.memory_in_use(primitive::memory_space::host);
  r.device_space = model.memory_in_use(primitive::memory_space::device);
  r.pinned_space = model.memory_in_use(primitive::memory_space::pinned_host);
  r.offloaded = model.offloaded_memory_in_use();
  r.measured = model.memory_allocated(primitive::memory_space::host);
  const auto asked = [&](memory_category what) {
    return model.memory_allocated(primitive::memory_space::host, what).current;
  };
  r.asked = {asked(memory_category::parameters), asked(memory_category::gradients),
             asked(memory_category::master_weights), asked(memory_category::optimizer_states),
             asked(memory_category::communication_buffers)};
  r.scratch = asked(memory_category::scratch);
  return r;
}

/// The host runtime's 3 steps of `q` (the reference), in bfloat16 or float32 as `bf16` says:
/// every parameter's final values; the step results into `steps`.
std::vector<std::vector<float>> host_reference(communicator& comm, const plan_request& q,
                                               const sharded_model_options& options, bool bf16, int poisoned,
                                               std::vector<step_result>& steps) {
  sharded_model model(comm, q, options);
  const auto now = [](const auto& w) { w(); };
  return bf16 ? train<bfloat16>(model, comm.rank(), 3, now, steps, poisoned)
              : train<float>(model, comm.rank(), 3, now, steps, poisoned);
}

/// `run_on_stream` for 3 steps in bfloat16 or float32 as `bf16` says.
device_run run_on_stream_as(bool bf16, communicator& comm, const plan_request& q, const sharded_model_options& options,
                            int poisoned) {
  return bf16 ? run_on_stream<bfloat16>(comm, q, options, 3, poisoned)
              : run_on_stream<float>(comm, q, options, 3, poisoned);
}

/// A host stream whose offload memory would be pinned host memory (as beside a CUDA stream);
/// otherwise the host stream. In a program without the CUDA table, offload must be refused.
class pinned_offload_stream final : public execution_stream {
 public:
  explicit pinned_offload_stream(primitive::host_stream& s) : inner_(s) {}
  const char* kind() const noexcept override { return inner_.kind(); }
  primitive::memory_space space() const noexcept override { return inner_.space(); }
  primitive::memory_space offload_space() const noexcept override { return primitive::memory_space::pinned_host; }
  int device() const noexcept override { return inner_.device(); }
  ringzero::memory_space communicator_space() const noexcept override { return inner_.communicator_space(); }
  std::unique_ptr<event> make_event() const override { return inner_.make_event(); }
  std::unique_ptr<execution_stream> make_communication_stream(communicator& c,
                                                              primitive::host_stream_options o) const override {
    return inner_.make_communication_stream(c, o);
  }
  void record(event& e) override { inner_.record(e); }
  void wait(const event& e) override { inner_.wait(e); }
  void wait_host_stream(const event& e) override { inner_.wait_host_stream(e); }
  void wait_host(const event& e) override { inner_.wait_host(e); }
  bool query(const event& e) const override { return inner_.query(e); }
  bool query() override { return inner_.query(); }
  void synchronize() override { inner_.synchronize(); }
  bool runs_host_work() const noexcept override { return true; }
  void copy(void* d, const void* s, std::uint64_t n) override { inner_.copy(d, s, n); }
  void fill(void* d, std::uint64_t n, dtype t, double v) override { inner_.fill(d, n, t, v); }
  void cast(void* d, dtype dt, const void* s, dtype st, std::uint64_t n) override { inner_.cast(d, dt, s, st, n); }
  void scale(void* d, const void* s, std::uint64_t n, dtype t, double x) override { inner_.scale(d, s, n, t, x); }
  void reduce(void* d, const void* a, const void* b, std::uint64_t n, const primitive::reduce_spec& r) override {
    inner_.reduce(d, a, b, n, r);
  }
  void add_sum_of_squares(double* sum, const void* v, std::uint64_t n, dtype t) override {
    inner_.add_sum_of_squares(sum, v, n, t);
  }
  void decide_step(step_scalars* s, double max_grad_norm, bool skip) override {
    inner_.decide_step(s, max_grad_norm, skip);
  }
  void update_shard(const shard_update& u, const step_scalars* s) override { inner_.update_shard(u, s); }
  void quantize_segments(const quantized_layout& l, const void* v, dtype t, void* out) override {
    inner_.quantize_segments(l, v, t, out);
  }
  void dequantize_segments(const quantized_layout& l, const void* in, void* v, dtype t, bool average, std::uint32_t own,
                           const void* own_values) override {
    inner_.dequantize_segments(l, in, v, t, average, own, own_values);
  }
  void host_work(std::function<void()> w, const std::string& what) override { inner_.host_work(std::move(w), what); }
  void collective(std::function<void()> i) override { inner_.collective(std::move(i)); }

 private:
  host_execution_stream inner_;
};

}  // namespace

TEST_CASE("offload on the host stream: stages 0-3 x {float32, bfloat16} x world sizes 1-4, bitwise the host runtime") {
  // Per configuration: the host runtime without offload, the device path without and with
  // offload, accumulation of 1 or 3 micro-batches, the optimizers in rotation, clipping at odd
  // stages, and (bfloat16, world 2) a skipped step. Allocations: everything in host memory on
  // the host stream, equal to the plan's memory(); the offloaded part equal to host_memory().
  const auto optimizers = test_optimizers();
  int runs = 0;
  for (int world = 1; world <= 4; ++world)
    for (int stage = 0; stage <= 3; ++stage)
      for (bool bf16 : {false, true}) {
        const int accumulation = (world + stage) % 2 == 0 ? 3 : 1;
        const int poisoned = bf16 && world == 2 ? 1 : -1;
        sharded_model_options options;
        options.optimizer = optimizers[static_cast<std::size_t>(world + stage + (bf16 ? 1 : 0)) % optimizers.size()];
        options.max_grad_norm = stage % 2 == 1 ? 0.5 : 0.0;
        CAPTURE(world);
        CAPTURE(stage);
        CAPTURE(bf16);
        CAPTURE(accumulation);
        CAPTURE(optimizer_name(options.optimizer.kind));
        const auto n = static_cast<std::size_t>(world);
        std::vector<std::vector<std::vector<float>>> host(n);
        std::vector<std::vector<step_result>> host_steps(n);
        std::vector<device_run> plain(n), offloaded(n);
        std::vector<shard_plan> plans;
        local::launch(world, [&](communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          const plan_request q = offload_request(stage, accumulation, bf16, options.optimizer, offload::none);
          plan_request qo = q;
          qo.offload = offload::optimizer;
          host[r] = host_reference(comm, q, options, bf16, poisoned, host_steps[r]);
          plain[r] = run_on_stream_as(bf16, comm, q, options, poisoned);
          offloaded[r] = run_on_stream_as(bf16, comm, qo, options, poisoned);
        });
        plan_request q = offload_request(stage, accumulation, bf16, options.optimizer, offload::optimizer);
        q.world_size = world;
        const shard_plan plan(q);
        for (std::size_t r = 0; r < n; ++r) {
          CAPTURE(r);
          CHECK(bitwise_equal(plain[r].values, host[r]));
          CHECK(bitwise_equal(offloaded[r].values, host[r]));
          CHECK(bitwise_equal(offloaded[r].values, offloaded[0].values));
          REQUIRE(offloaded[r].steps.size() == host_steps[r].size());
          for (std::size_t t = 0; t < host_steps[r].size(); ++t) {
            CHECK(same_result(offloaded[r].steps[t], host_steps[r][t]));
            CHECK(offloaded[r].steps[t].skipped == (static_cast<int>(t) == poisoned));
          }
          CHECK(offloaded[r].host_space == plan.memory());
          CHECK(offloaded[r].offloaded == plan.host_memory());
          // Measured where allocated: the plan, the step's scalars and offload's copy of them,
          // never more at any moment.
          const std::uint64_t scalars = 2 * sizeof(step_scalars);
          CHECK(offloaded[r].measured.current == plan.memory().total() + scalars);
          CHECK(offloaded[r].measured.peak == plan.memory().total() + scalars);
          CHECK(plain[r].measured.peak == plain[r].host_space.total() + sizeof(step_scalars));
          // By what asked for it: the plan's categories (transfer buffers as communication
          // buffers), the two copies of the scalars as scratch.
          CHECK(offloaded[r].asked == plan.memory());
          CHECK(offloaded[r].scratch == scalars);
          CHECK(offloaded[r].device_space.total() == 0);
          CHECK(offloaded[r].pinned_space.total() == 0);
          CHECK(plain[r].offloaded.total() == 0);
        }
        // What moved to host memory: master weights (bfloat16) and states, and the transfer buffers.
        CHECK(plan.host_memory().optimizer_states == plan.memory().optimizer_states);
        CHECK(plan.host_memory().master_weights == (bf16 ? plan.memory().master_weights : 0));
        CHECK((plan.host_memory().communication_buffers > 0) == (plan.trainable_elements() > 0));
        ++runs;
      }
  CHECK(runs == 4 * 4 * 2);
}

TEST_CASE("offload::parameters at stage 3: world sizes 1-4 x {float32, bfloat16}, bitwise the host runtime") {
  // The parameter and gradient shards in host memory, copied into the gather buffer before an
  // in-place all_gather, updated by the CPU in place. Per configuration: accumulation of 1 or 3
  // micro-batches, the optimizers in rotation, clipping, a skipped step (bfloat16, world 2),
  // the frozen matrix kept whole (on the device) or gathered, quantized gathers and reductions
  // (int8, world 3). read_parameter's all_gather (the end of `train`) runs on the same path.
  const auto optimizers = test_optimizers();
  int runs = 0;
  for (int world = 1; world <= 4; ++world)
    for (bool bf16 : {false, true}) {
      const int accumulation = world % 2 == 0 ? 3 : 1;
      const int poisoned = bf16 && world == 2 ? 1 : -1;
      const bool keep_frozen = (world + (bf16 ? 1 : 0)) % 2 == 0, quantized = world == 3;
      sharded_model_options options;
      options.optimizer = optimizers[static_cast<std::size_t>(world + (bf16 ? 1 : 0)) % optimizers.size()];
      options.max_grad_norm = bf16 ? 0.5 : 0.0;
      CAPTURE(world);
      CAPTURE(bf16);
      CAPTURE(keep_frozen);
      CAPTURE(quantized);
      plan_request q = offload_request(3, accumulation, bf16, options.optimizer, offload::none);
      if (keep_frozen) q.keep_frozen_bytes = keep_all_frozen;
      if (quantized) q.quantization = {quantized_bits::int8, quantized_bits::int8, 8};
      const auto n = static_cast<std::size_t>(world);
      std::vector<std::vector<std::vector<float>>> host(n);
      std::vector<std::vector<step_result>> host_steps(n);
      std::vector<device_run> offloaded(n);
      local::launch(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        plan_request qo = q;
        qo.offload = offload::parameters;
        host[r] = host_reference(comm, q, options, bf16, poisoned, host_steps[r]);
        offloaded[r] = run_on_stream_as(bf16, comm, qo, options, poisoned);
      });
      q.offload = offload::parameters;
      q.world_size = world;
      const shard_plan plan(q);
      for (std::size_t r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(bitwise_equal(offloaded[r].values, host[r]));
        CHECK(bitwise_equal(offloaded[r].values, offloaded[0].values));
        REQUIRE(offloaded[r].steps.size() == host_steps[r].size());
        for (std::size_t t = 0; t < host_steps[r].size(); ++t) {
          CHECK(same_result(offloaded[r].steps[t], host_steps[r][t]));
          CHECK(offloaded[r].steps[t].skipped == (static_cast<int>(t) == poisoned));
        }
        CHECK(offloaded[r].host_space == plan.memory());
        CHECK(offloaded[r].offloaded == plan.host_memory());
        CHECK(offloaded[r].asked == plan.memory());
        const std::uint64_t scalars = 2 * sizeof(step_scalars);
        CHECK(offloaded[r].measured.current == plan.memory().total() + scalars);
        CHECK(offloaded[r].measured.peak == plan.memory().total() + scalars);
      }
      // In host memory: every shard and the optimizer, no transfer buffers; on the device: the
      // gather buffers, the buckets, quantization's staging and a kept frozen matrix.
      const memory_breakdown& h = plan.host_memory();
      const memory_breakdown& d = plan.device_memory();
      CHECK(h.gradients == plan.memory().gradients);
      CHECK(h.optimizer_states == plan.memory().optimizer_states);
      CHECK(h.master_weights == plan.memory().master_weights);
      CHECK(h.communication_buffers == 0);
      CHECK(d.parameters == plan.kept_frozen_bytes());
      CHECK((d.parameters > 0) == keep_frozen);
      CHECK(h.parameters + d.parameters == plan.memory().parameters);
      CHECK(d.gradients + d.master_weights + d.optimizer_states == 0);
      CHECK(d.communication_buffers == plan.memory().communication_buffers);
      CHECK(d.communication_buffers > 0);
      ++runs;
    }
  CHECK(runs == 8);
}

TEST_CASE(
    "offload::parameters: every hooked collective runs on the communication buffers, never on the offloaded shards") {
  // A hook that allocates the gather buffers and buckets itself (as a GPU's would be device
  // memory) and checks that each all_gather's shard and gathered copy and each reduction's
  // gradients lie inside them: with the shards in host memory, NCCL could not reach them.
  struct bounds_hook final : collective_hook {
    std::vector<std::pair<const unsigned char*, std::uint64_t>> blocks;
    int outside = 0, calls = 0;
    std::string name() const override { return "bounds"; }
    bool supports(primitive::memory_space) const override { return true; }
    void* allocate(std::uint64_t bytes, primitive::memory_space) override {
      void* p = ::operator new (static_cast<std::size_t>(bytes), std::align_val_t{64});
      blocks.emplace_back(static_cast<unsigned char*>(p), bytes);
      return p;
    }
    void deallocate(void* p, std::uint64_t, primitive::memory_space) noexcept override {
      ::operator delete (p, std::align_val_t{64});
    }
    bool inside(const void* p, std::uint64_t bytes) const {
      const auto* c = static_cast<const unsigned char*>(p);
      for (const auto& [b, n] : blocks)
        if (c >= b && c + bytes <= b + n) return true;
      return false;
    }
    void all_gather(communicator& comm, const gather_call& call) override {
      const std::uint64_t shard = call.shard_numel * dtype_size(call.type);
      ++calls;
      if (!inside(call.shard, shard) || !inside(call.gathered, shard * static_cast<std::uint64_t>(comm.world_size())))
        ++outside;
      collective_hook::all_gather(comm, call);
    }
    void reduce(communicator& comm, const reduction_call& call) override {
      ++calls;
      if (!inside(call.gradients, call.numel * dtype_size(call.type))) ++outside;
      collective_hook::reduce(comm, call);
    }
  };
  constexpr int world = 3;
  std::vector<std::vector<std::vector<float>>> host(world), offloaded(world);
  std::vector<int> outside(world, -1), calls(world, 0);
  local::launch(world, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    sharded_model_options options;
    options.optimizer = test_optimizers()[1];
    plan_request q = offload_request(3, 2, true, options.optimizer, offload::none);
    std::vector<step_result> steps;
    {
      sharded_model model(comm, q, options);
      host[r] = train<bfloat16>(
          model, comm.rank(), 2, [](const auto& w) { w(); }, steps);
    }
    q.offload = offload::parameters;
    auto hook = std::make_shared<bounds_hook>();
    options.hook = hook;
    primitive::host_stream compute;
    host_execution_stream stream(compute);
    {
      sharded_model model(comm, q, device_context{&stream}, options);
      offloaded[r] = train<bfloat16>(
          model, comm.rank(), 2, [&](const auto& w) { compute.enqueue(w); }, steps);
      compute.synchronize();
    }
    outside[r] = hook->outside;
    calls[r] = hook->calls;
  });
  for (std::size_t r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(bitwise_equal(offloaded[r], host[r]));
    CHECK(calls[r] > 0);
    CHECK(outside[r] == 0);
  }
}

TEST_CASE("offload::parameters is refused outside stage 3, with hybrid sharding and with accumulate_unsharded") {
  const optimizer_options adam;
  const auto refusal = [](const plan_request& q) {
    try {
      const shard_plan p(q);
    } catch (const error& e) { return std::string(e.what()); }
    return std::string("(accepted)");
  };
  for (int stage = 0; stage <= 2; ++stage) {
    CAPTURE(stage);
    plan_request q = offload_request(stage, 1, true, adam, offload::parameters);
    q.world_size = 2;
    const std::string m = refusal(q);
    CAPTURE(m);
    CHECK(m.find("offload::parameters keeps each rank's parameter and gradient shards in host memory") !=
          std::string::npos);
    CHECK(m.find("got stage " + std::to_string(stage) + ": expected stage 3") != std::string::npos);
  }
  plan_request q = offload_request(3, 1, true, adam, offload::parameters);
  q.world_size = 4;
  q.replica_group_size = 2;
  CHECK_THROWS_WITH_AS(shard_plan{q},
                       doctest::Contains("offload::parameters with hybrid sharding (replica group size 2 of world "
                                         "size 4) is not supported"),
                       error);
  q.replica_group_size = 0;
  q.accumulate_unsharded = true;
  CHECK_THROWS_WITH_AS(shard_plan{q}, doctest::Contains("offload::parameters with accumulate_unsharded"), error);
  // Every rank of a runtime refuses the request the same way, before anything is allocated.
  std::vector<std::exception_ptr> errors(2);
  local::launch(2, [&](communicator& comm) {
    primitive::host_stream compute;
    host_execution_stream stream(compute);
    try {
      sharded_model model(comm, offload_request(2, 1, false, adam, offload::parameters), device_context{&stream},
                          sharded_model_options{});
    } catch (...) { errors[static_cast<std::size_t>(comm.rank())] = std::current_exception(); }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(message_of(errors[static_cast<std::size_t>(r)]).find("expected stage 3") != std::string::npos);
  }
}

TEST_CASE("offload settings that differ between ranks are refused on every rank, naming offload and each value") {
  std::vector<std::string> errors(3);
  local::launch(3, [&](communicator& comm) {
    const optimizer_options adam;
    const offload off = comm.rank() == 1 ? offload::none : offload::parameters;
    primitive::host_stream compute;
    host_execution_stream stream(compute);
    try {
      sharded_model model(comm, offload_request(3, 1, true, adam, off), device_context{&stream},
                          sharded_model_options{});
    } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CAPTURE(errors[r]);
    CHECK(errors[r].find("the ranks differ in offload: ") != std::string::npos);
    CHECK(errors[r].find("parameters") != std::string::npos);
    CHECK(errors[r].find("rank 1: none") != std::string::npos);
  }
}

TEST_CASE("offload is refused on every rank without a device context") {
  std::vector<std::exception_ptr> errors(2);
  local::launch(2, [&](communicator& comm) {
    sharded_model_options options;
    try {
      sharded_model model(comm, offload_request(2, 1, false, options.optimizer, offload::optimizer), options);
    } catch (...) { errors[static_cast<std::size_t>(comm.rank())] = std::current_exception(); }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(kind_of(errors[static_cast<std::size_t>(r)]) == errc::invalid_argument);
    const std::string m = message_of(errors[static_cast<std::size_t>(r)]);
    CHECK(m.find("rank " + std::to_string(r)) != std::string::npos);
    CHECK(m.find("runs on the device path only: expected a device_context") != std::string::npos);
  }
}

TEST_CASE("offload: the copy back waits for the CPU update (the offload stream paused during each step)") {
  // The offload stream is paused when step() begins and resumed 20 ms later by another thread:
  // the communication stream's copies of the updated parameter shards must wait for the CPU's
  // updates (an event per buffer). Without that wait they copy the transfer buffers as they
  // were (zeros, or the previous step's values) and the results differ from the host runtime's.
  // With offload::parameters nothing is copied back: the communication stream's zeroing of the
  // gradient shards, and the next step's gathers, must wait for the CPU's update in place.
  for (const auto& [stage, off] :
       {std::pair{1, offload::optimizer}, std::pair{3, offload::optimizer}, std::pair{3, offload::parameters}}) {
    CAPTURE(stage);
    CAPTURE(offload_name(off));
    std::vector<std::vector<std::vector<float>>> host(2), device(2);
    std::vector<int> paused_seen(2, 0);
    local::launch(2, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      sharded_model_options options;
      options.optimizer = test_optimizers()[1];
      plan_request q = offload_request(stage, 2, true, options.optimizer, offload::none);
      std::vector<step_result> steps;
      {
        sharded_model model(comm, q, options);
        host[r] = train<bfloat16>(
            model, comm.rank(), 3, [](const auto& w) { w(); }, steps);
      }
      q.offload = off;
      primitive::host_stream compute;
      host_execution_stream stream(compute);
      sharded_model model(comm, q, device_context{&stream}, options);
      auto& cpu = dynamic_cast<host_execution_stream&>(*model.offload_stream()).native();
      const auto paused_step = [&] {
        cpu.pause();
        std::thread resume([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          paused_seen[r] += cpu.query() ? 0 : 1;  // still paused: nothing ran ahead of it
          cpu.resume();
        });
        step_result s{};
        try {
          s = model.step();
        } catch (...) {
          resume.join();
          throw;
        }
        resume.join();
        return s;
      };
      steps.clear();
      device[r] = train<bfloat16>(
          model, comm.rank(), 3, [&](const auto& w) { compute.enqueue(w); }, steps, -1, paused_step);
      compute.synchronize();
    });
    for (std::size_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(paused_seen[r] == 3);
      CHECK(bitwise_equal(device[r], host[r]));
    }
  }
}

TEST_CASE("offload is refused on every rank where pinned host memory is not available") {
  // Rank 1's compute stream puts offloaded state in pinned host memory, which this program (no
  // CUDA table) cannot allocate: rank 1 names what was expected, rank 0 names rank 1.
  REQUIRE(primitive::registered_device_primitives() == nullptr);
  for (const offload off : {offload::optimizer, offload::parameters}) {
    CAPTURE(offload_name(off));
    std::vector<std::exception_ptr> errors(2);
    local::launch(2, [&](communicator& comm) {
      sharded_model_options options;
      primitive::host_stream compute;
      host_execution_stream host(compute);
      pinned_offload_stream pinned(compute);
      execution_stream* s = comm.rank() == 1 ? static_cast<execution_stream*>(&pinned) : &host;
      try {
        sharded_model model(comm, offload_request(3, 1, true, options.optimizer, off), device_context{s}, options);
      } catch (...) { errors[static_cast<std::size_t>(comm.rank())] = std::current_exception(); }
    });
    REQUIRE(errors[0]);
    REQUIRE(errors[1]);
    CHECK(kind_of(errors[0]) == errc::invalid_argument);
    CHECK(kind_of(errors[1]) == errc::invalid_argument);
    const std::string m1 = message_of(errors[1]), m0 = message_of(errors[0]);
    CHECK(m1.find("rank 1") != std::string::npos);
    const std::string what = off == offload::optimizer
                                 ? "the optimizer (offload::optimizer)"
                                 : "the parameters, gradients and optimizer (offload::parameters)";
    CHECK(m1.find("offloads " + what +
                  " beside a host_stream, which needs pinned host memory, but this program has no CUDA table with "
                  "pinned allocation registered: expected a program that includes ringzero/cuda.cuh, or "
                  "offload::none") != std::string::npos);
    CHECK(m0.find("rank 1 refused the plan") != std::string::npos);
  }
}

TEST_CASE("offload: a refused step leaves the state as it was; the next step runs") {
  // Ranks that set different learning rates: the check on the communication stream refuses the
  // step before the offload stream's work, every rank throws, nothing changes; the error does
  // not stay on the offload stream: the next step, with equal rates, is applied.
  std::vector<std::string> messages(2);
  std::vector<int> unchanged(2, 0), recovered(2, 0), changed(2, 0);
  local::launch(2, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    primitive::host_stream compute;
    host_execution_stream host(compute);
    sharded_model_options options;
    options.optimizer = test_optimizers()[0];
    sharded_model model(comm, offload_request(2, 1, true, options.optimizer, offload::optimizer), device_context{&host},
                        options);
    std::vector<step_result> steps;
    (void)train<bfloat16>(
        model, comm.rank(), 1, [&](const auto& w) { compute.enqueue(w); }, steps);
    const std::size_t p = model.index("l1.w");
    std::vector<float> before(model.plan().placements()[p].numel), after(before.size()), last(before.size());
    model.read_parameter(p, before);
    model.set_learning_rate(comm.rank() == 0 ? 0.05 : 0.025);
    model.pre_backward(model.unit_of(p));
    auto g = model.gradient<bfloat16>(p);
    compute.enqueue([g] {
      for (bfloat16& x : g) x = static_cast<bfloat16>(static_cast<float>(x) + 1.0f);
    });
    model.post_backward(model.unit_of(p));
    try {
      (void)model.step();
    } catch (const error& e) { messages[r] = e.what(); }
    model.read_parameter(p, after);
    unchanged[r] = before == after ? 1 : 0;
    model.set_learning_rate(0.05);
    const step_result s = model.step();  // the kept gradients, now with equal rates
    recovered[r] = s.steps == 2 && !s.skipped ? 1 : 0;
    model.read_parameter(p, last);
    changed[r] = last != before ? 1 : 0;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(messages[r].find("hold different learning rates at step 2") != std::string::npos);
    CHECK(unchanged[r] == 1);
    CHECK(recovered[r] == 1);
    CHECK(changed[r] == 1);
  }
}

TEST_CASE("offload with hybrid sharding (2 replica groups of 2 ranks), bitwise the host runtime") {
  // Rank r: shard group r / 2, replica group r % 2; the replica average runs before the copies.
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    local::world shard0(2), shard1(2), replica0(2), replica1(2);
    std::vector<std::vector<std::vector<float>>> host(4), device(4);
    std::vector<std::exception_ptr> failures(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        try {
          local::communicator shard_comm(r / 2 == 0 ? shard0 : shard1, r % 2);
          local::communicator replica_comm(r % 2 == 0 ? replica0 : replica1, r / 2);
          sharded_model_options options;
          options.optimizer = test_optimizers()[2];
          options.max_grad_norm = 0.5;
          plan_request q = offload_request(stage, 2, true, options.optimizer, offload::none);
          std::vector<step_result> steps;
          {
            sharded_model model(shard_comm, q, options, &replica_comm);
            host[static_cast<std::size_t>(r)] = train<bfloat16>(
                model, r, 3, [](const auto& w) { w(); }, steps);
          }
          q.offload = offload::optimizer;
          primitive::host_stream compute;
          host_execution_stream stream(compute);
          sharded_model model(shard_comm, q, device_context{&stream}, options, &replica_comm);
          device[static_cast<std::size_t>(r)] = train<bfloat16>(
              model, r, 3, [&](const auto& w) { compute.enqueue(w); }, steps);
          compute.synchronize();
        } catch (...) {
          failures[static_cast<std::size_t>(r)] = std::current_exception();
          for (auto* w : {&shard0, &shard1, &replica0, &replica1}) w->abort("rank failed");
        }
      });
    for (auto& t : threads) t.join();
    for (auto& f : failures)
      if (f) FAIL(message_of(f));
    for (std::size_t r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(bitwise_equal(device[r], host[r]));
      CHECK(bitwise_equal(device[r], device[0]));
    }
  }
}
