// The ZeRO runtime's device path on the simulated device: the state in memory touched only by
// stream work, the trainer's forward and backward enqueued on a compute host_stream, the
// runtime's collectives and step on its communication stream, ordered by events only. Every
// result is bitwise the host runtime's; allocations equal the plan; a read the runtime does not
// order reads stale data; a device context that does not fit is refused on every rank.
// Suite device-sim (also run with RINGZERO_HOST_STREAM_DELAY_US set).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "zero_test_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;
using namespace zero_test;

namespace {

/// A collective hook that does what the runtime does (collective_hook's defaults).
class plain_hook : public collective_hook {
 public:
  std::string name() const override { return "plain"; }
};

plan_request device_request(int stage, int accumulation, const optimizer_options& o, bool unsharded = false,
                            bool keep_frozen = false) {
  plan_request q;
  q.accumulate_unsharded = unsharded;
  q.keep_frozen_bytes = keep_frozen ? keep_all_frozen : 0;
  q.parameters = test_parameters();
  q.stage = stage;
  q.accumulation_steps = accumulation;
  q.alignment_bytes = 16;
  q.precision.optimizer_states = o.state_count();
  return q;
}

/// One unit's backward as compute-stream work: the views are taken on the rank's thread (the
/// hooks order them), the arithmetic of `train_sharded` runs later on the compute stream.
struct backward_task {
  struct item {
    std::span<const float> w;
    std::span<float> g;
    std::size_t storage;
    int use;
  };
  std::vector<item> items;
  std::span<const float> frozen;
  bool in_u1 = false;
  int rank = 0, micro = 0, step = 0;

  void operator()() const {
    float frozen_sum = 0;
    if (in_u1)
      for (float x : frozen) frozen_sum += x;
    for (const item& it : items)
      for (std::size_t j = 0; j < it.g.size(); ++j)
        it.g[j] += gradient_term(rank, micro, step, it.storage, j, it.use, it.w[j], frozen_sum, in_u1);
  }
};

/// `train_sharded` of zero_test_model.hpp with the forward and backward enqueued on `compute`.
std::vector<std::vector<float>> train_on_stream(sharded_model& model, primitive::host_stream& compute, int rank,
                                                const run_config& cfg, std::vector<step_result>* results = nullptr) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  const std::size_t frozen = model.index("frozen.w");
  std::vector<std::vector<float>> initial(params.size());  // read on the streams: kept to the end
  if (cfg.async_parameters) {
    for (std::size_t p = 0; p < params.size(); ++p) {
      initial[p].resize(model.numel(p));
      for (std::size_t j = 0; j < initial[p].size(); ++j)
        initial[p][j] = initial_value(plan.placements()[p].storage, j);
      model.set_parameter_async(p, initial[p].data());
    }
  } else if (!cfg.keep_parameters) {
    set_initial_parameters(model);
  }
  const std::size_t units = model.unit_count();
  for (int step = 0; step < cfg.steps; ++step) {
    for (int micro = 0; micro < cfg.accumulation; ++micro) {
      std::optional<no_sync_guard> no_sync;
      if (cfg.no_sync && micro + 1 < cfg.accumulation) no_sync.emplace(model);
      for (std::size_t u = 0; u < units; ++u) {
        model.pre_forward(u);
        std::vector<std::span<float>> weights;
        for (std::size_t p : plan.units()[u].members) weights.push_back(model.parameter<float>(p));
        compute.enqueue([weights] {  // a forward reads its weights
          volatile float sink = 0;
          for (auto w : weights)
            for (float x : w) sink = sink + x;
        });
        model.post_forward(u);
      }
      for (std::size_t u = units; u-- > 0;) {
        model.pre_backward(u);
        backward_task t;
        t.in_u1 = plan.units()[u].name == "u1";
        t.rank = rank;
        t.micro = micro;
        t.step = step;
        if (t.in_u1) t.frozen = model.parameter<float>(frozen);
        for (std::size_t p : plan.units()[u].members) {
          if (!params[p].trainable || plan.placements()[p].numel == 0) continue;
          auto w = model.parameter<float>(p);
          auto g = model.gradient<float>(p);
          t.items.push_back({w, g, plan.placements()[p].storage, use_of(params[p].name)});
        }
        compute.enqueue(t);
        if (cfg.mark_ready)
          for (std::size_t p : plan.units()[u].members)
            if (params[p].trainable && params[p].tie_group.empty()) model.mark_ready(p);
        model.post_backward(u);
      }
      if (!(cfg.implicit_last_end && micro == cfg.accumulation - 1)) model.end_backward();
    }
    const step_result r = model.step();
    if (results) results->push_back(r);
  }
  std::vector<std::vector<float>> out(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    if (cfg.async_parameters)
      model.read_parameter_async(p, out[p].data());
    else
      model.read_parameter(p, out[p]);
  }
  compute.synchronize();  // the asynchronous reads land in `out` on the streams
  return out;
}

/// A one-rank communicator that claims CUDA device memory on `device` (no device needed: the
/// device context is refused before any data moves).
class claims_device_memory final : public ringzero::detail::backend_communicator {
 public:
  explicit claims_device_memory(int device) : backend_communicator(0, 1), device_(device) {}
  ~claims_device_memory() override { stop_progress(); }
  backend_kind backend() const noexcept override { return backend_kind::nccl; }
  memory_space space() const noexcept override { return memory_space::cuda; }
  int cuda_device() const noexcept override { return device_; }
  void begin(const collective_descriptor&) override {}
  void end(const collective_descriptor&) override {}
  void backend_sendrecv(const collective_descriptor& d, const void*, std::uint64_t, int, void*, std::uint64_t,
                        int) override {
    raise(&d, errc::internal, "no transfers in this test");
  }
  void backend_sendrecv_reduce(const collective_descriptor& d, const void*, std::uint64_t, int, const void*, void*,
                               std::uint64_t, int, const combine_fn&) override {
    raise(&d, errc::internal, "no transfers in this test");
  }
  link_model link() const noexcept override { return {}; }

 private:
  int device_;
};

/// A compute stream that claims to be a CUDA stream on `device`; the runtime must refuse it
/// before enqueueing anything (every enqueueing member fails the test).
class claims_cuda_stream final : public execution_stream {
 public:
  explicit claims_cuda_stream(int device) : device_(device) {}
  const char* kind() const noexcept override { return "cuda_stream"; }
  primitive::memory_space space() const noexcept override { return primitive::memory_space::device; }
  int device() const noexcept override { return device_; }
  ringzero::memory_space communicator_space() const noexcept override { return ringzero::memory_space::cuda; }
  std::unique_ptr<event> make_event() const override { return fail<std::unique_ptr<event>>(); }
  std::unique_ptr<execution_stream> make_communication_stream(communicator&,
                                                              primitive::host_stream_options) const override {
    return fail<std::unique_ptr<execution_stream>>();
  }
  void record(event&) override { fail<void>(); }
  void wait(const event&) override { fail<void>(); }
  void wait_host_stream(const event&) override { fail<void>(); }
  void wait_host(const event&) override { fail<void>(); }
  bool query(const event&) const override { return fail<bool>(); }
  bool query() override { return fail<bool>(); }
  void synchronize() override { fail<void>(); }
  bool runs_host_work() const noexcept override { return false; }
  void add_sum_of_squares(double*, const void*, std::uint64_t, dtype) override { fail<void>(); }
  void decide_step(step_scalars*, double, bool) override { fail<void>(); }
  void update_shard(const shard_update&, const step_scalars*) override { fail<void>(); }
  void quantize_segments(const quantized_layout&, const void*, dtype, void*) override { fail<void>(); }
  void dequantize_segments(const quantized_layout&, const void*, void*, dtype, bool, std::uint32_t,
                           const void*) override {
    fail<void>();
  }
  void copy(void*, const void*, std::uint64_t) override { fail<void>(); }
  void fill(void*, std::uint64_t, dtype, double) override { fail<void>(); }
  void cast(void*, dtype, const void*, dtype, std::uint64_t) override { fail<void>(); }
  void scale(void*, const void*, std::uint64_t, dtype, double) override { fail<void>(); }
  void reduce(void*, const void*, const void*, std::uint64_t, const primitive::reduce_spec&) override { fail<void>(); }
  void host_work(std::function<void()>, const std::string&) override { fail<void>(); }
  void collective(std::function<void()>) override { fail<void>(); }

 private:
  template <class R>
  static R fail() {
    throw error(errc::internal, "the runtime used a compute stream it should have refused");
  }
  int device_;
};

}  // namespace

TEST_CASE("device path on the host stream: stages 0-3 x world sizes 1-4, bitwise the host runtime") {
  // Uneven, frozen, tied and zero-size parameters (the test model); per world size and stage,
  // accumulation 1 and 3, the optimizers in rotation, clipping on at odd stages; stage 3 on 2
  // and 4 ranks with one micro-batch keeps the frozen matrix gathered (keep_frozen_bytes); 2 ranks
  // through a collective hook, 3 ranks' accumulation under no_sync.
  const auto optimizers = test_optimizers();
  int runs = 0;
  for (int world = 1; world <= 4; ++world)
    for (int stage = 0; stage <= 3; ++stage)
      for (int accumulation : {1, 3}) {
        run_config cfg;
        cfg.steps = 3;
        cfg.optimizer = optimizers[static_cast<std::size_t>(world + stage + accumulation) % optimizers.size()];
        cfg.accumulation = accumulation;
        cfg.max_grad_norm = stage % 2 == 1 ? 0.5 : 0.0;
        cfg.mark_ready = (world + stage) % 2 == 0;
        cfg.implicit_last_end = accumulation == 3 && stage >= 2;
        const bool unsharded = accumulation == 3 && stage >= 2 && world % 2 == 1;  // one reduction per step
        const bool keep = stage == 3 && accumulation == 1 && world % 2 == 0;       // the frozen matrix held whole
        cfg.no_sync = world == 3 && accumulation == 3;           // micro-batches 1-2 under no_sync (full gradients)
        cfg.async_parameters = (world + accumulation) % 2 == 0;  // the trainer's memory in and out on the streams
        const bool hooked = world == 2;                          // through a collective hook
        CAPTURE(unsharded);
        CAPTURE(keep);
        CAPTURE(world);
        CAPTURE(stage);
        CAPTURE(accumulation);
        CAPTURE(optimizer_name(cfg.optimizer.kind));
        std::vector<std::vector<std::vector<float>>> host(static_cast<std::size_t>(world)),
            device(static_cast<std::size_t>(world));
        std::vector<std::vector<step_result>> host_steps(static_cast<std::size_t>(world)),
            device_steps(static_cast<std::size_t>(world));
        std::vector<memory_breakdown> used(static_cast<std::size_t>(world));
        std::vector<memory_breakdown> planned(static_cast<std::size_t>(world));
        std::vector<primitive::memory_usage> measured(static_cast<std::size_t>(world));
        local::launch(world, [&](communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          sharded_model_options options;
          options.optimizer = cfg.optimizer;
          options.max_grad_norm = cfg.max_grad_norm;
          if (hooked) options.hook = std::make_shared<plain_hook>();
          {
            sharded_model model(comm, device_request(stage, accumulation, cfg.optimizer, unsharded, keep), options);
            host[r] = train_sharded(model, comm.rank(), cfg, &host_steps[r]);
          }
          primitive::host_stream compute;
          host_execution_stream stream(compute);
          sharded_model model(comm, device_request(stage, accumulation, cfg.optimizer, unsharded, keep),
                              device_context{&stream}, options);
          device[r] = train_on_stream(model, compute, comm.rank(), cfg, &device_steps[r]);
          compute.synchronize();
          used[r] = model.memory_in_use(primitive::memory_space::host);
          measured[r] = model.memory_allocated(primitive::memory_space::host);
          const memory_breakdown elsewhere = model.memory_in_use(primitive::memory_space::device);
          CHECK(elsewhere.total() == 0);
          CHECK(model.memory_in_use(primitive::memory_space::pinned_host).total() == 0);
          planned[r] = model.plan().memory();
        });
        for (std::size_t r = 0; r < host.size(); ++r) {
          CAPTURE(r);
          CHECK(bitwise_equal(device[r], host[r]));
          CHECK(bitwise_equal(device[r], device[0]));
          REQUIRE(device_steps[r].size() == host_steps[r].size());
          for (std::size_t t = 0; t < host_steps[r].size(); ++t)
            CHECK(same_result(device_steps[r][t], host_steps[r][t]));
          CHECK(used[r].parameters == planned[r].parameters);
          CHECK(used[r].gradients == planned[r].gradients);
          CHECK(used[r].master_weights == planned[r].master_weights);
          CHECK(used[r].optimizer_states == planned[r].optimizer_states);
          CHECK(used[r].communication_buffers == planned[r].communication_buffers);
          // Measured where allocated: the plan plus the step's scalars, at every moment.
          CHECK(measured[r].current == planned[r].total() + sizeof(step_scalars));
          CHECK(measured[r].peak == planned[r].total() + sizeof(step_scalars));
        }
        ++runs;
      }
  CHECK(runs == 4 * 4 * 2);
}

TEST_CASE(
    "time_gathers: the gathers and the compute stream's waits timed on the streams; a stalled gather is exposed") {
  // Stage 3, two ranks, the device path on host streams. One step with every gather and wait
  // timed; then a forward whose gather is held back 50 ms (the communication stream paused): the
  // compute stream's wait for it shows at least that long, the gather itself not (it starts when
  // the stream resumes), so the share hidden is 0. Without the option nothing is timed.
  std::vector<gather_timing> stepped(2), stalled(2), untimed(2);
  local::launch(2, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    run_config cfg;
    cfg.steps = 1;
    cfg.optimizer = test_optimizers()[1];
    for (bool timed : {true, false}) {
      primitive::host_stream compute;
      host_execution_stream stream(compute);
      sharded_model_options options;
      options.optimizer = cfg.optimizer;
      options.time_gathers = timed;
      sharded_model model(comm, device_request(3, 1, cfg.optimizer), device_context{&stream}, options);
      (void)train_on_stream(model, compute, comm.rank(), cfg);
      if (!timed) {
        untimed[r] = model.gather_times();
        continue;
      }
      stepped[r] = model.gather_times();
      model.reset_gather_times();
      auto& comm_stream = dynamic_cast<host_execution_stream&>(*model.communication_stream()).native();
      comm_stream.pause();
      model.pre_forward(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comm_stream.resume();
      model.post_forward(0);
      stalled[r] = model.gather_times();
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    // Every unit is gathered before its forward and again before its backward (reshard after
    // forward), the tied head's backward also the embedding's unit: at least 2 per unit.
    CHECK(stepped[r].gathers >= 8);
    CHECK(stepped[r].waits >= stepped[r].gathers);
    CHECK(stepped[r].gather_seconds > 0);
    CHECK(stepped[r].exposed_seconds >= 0);
    CHECK(stepped[r].hidden_fraction() >= 0);
    CHECK(stepped[r].hidden_fraction() <= 1);
    CHECK(stalled[r].gathers >= 1);  // unit 0, and the prefetch of unit 1
    CHECK(stalled[r].waits == 1);
    CHECK(stalled[r].exposed_seconds >= 0.045);
    CHECK(stalled[r].gather_seconds < stalled[r].exposed_seconds);
    CHECK(stalled[r].hidden_fraction() == 0);
    CHECK(untimed[r].gathers == 0);
    CHECK(untimed[r].waits == 0);
    CHECK(untimed[r].gather_seconds == 0);
  }
}

namespace {

/// Every rank's parameters as the device path trained them (`device`) and as they lie in the
/// trainer's memory (`in_memory`) are the host runtime's (`host`) bit for bit; each indexed by
/// rank, then parameter.
void check_device_and_memory(const std::vector<std::vector<std::vector<float>>>& device,
                             const std::vector<std::vector<std::vector<float>>>& in_memory,
                             const std::vector<std::vector<std::vector<float>>>& host) {
  for (std::size_t r = 0; r < host.size(); ++r) {
    CAPTURE(r);
    CHECK(bitwise_equal(device[r], host[r]));
    CHECK(bitwise_equal(in_memory[r], host[r]));
  }
}

}  // namespace

TEST_CASE("device path: parameters in the trainer's memory (adopt_parameters), stages 0-2, bitwise the host runtime") {
  // The compute stream's memory is the trainer's: the initial values written there (or the
  // model's copied there on the streams), the step updating them in place, on 2 and 3 ranks.
  for (int world : {2, 3})
    for (int stage = 0; stage <= 2; ++stage) {
      run_config cfg;
      cfg.steps = 3;
      cfg.optimizer = test_optimizers()[static_cast<std::size_t>(stage)];
      cfg.max_grad_norm = stage == 1 ? 0.5 : 0.0;
      const adopted_values how = (world + stage) % 2 == 0 ? adopted_values::from_memory : adopted_values::from_model;
      CAPTURE(world);
      CAPTURE(stage);
      CAPTURE(static_cast<int>(how));
      std::vector<std::vector<std::vector<float>>> host(static_cast<std::size_t>(world)),
          device(static_cast<std::size_t>(world)), in_memory(static_cast<std::size_t>(world));
      local::launch(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        sharded_model_options options;
        options.optimizer = cfg.optimizer;
        options.max_grad_norm = cfg.max_grad_norm;
        {
          sharded_model model(comm, device_request(stage, 1, cfg.optimizer), options);
          host[r] = train_sharded(model, comm.rank(), cfg);
        }
        std::optional<trainer_memory> trainer;  // outlives the model
        primitive::host_stream compute;
        host_execution_stream stream(compute);
        sharded_model model(comm, device_request(stage, 1, cfg.optimizer), device_context{&stream}, options);
        const adoption_layout l = layout_for_adoption(model.plan());
        const trainer_memory& mem = trainer.emplace(l, 0xff);
        const auto& pl = model.plan().placements();
        if (how == adopted_values::from_model) {
          set_initial_parameters(model);
        } else {
          for (std::size_t p = 0; p < pl.size(); ++p)
            for (std::uint64_t j = 0; j < pl[p].numel; ++j) {
              const float v = initial_value(pl[p].storage, j);
              std::memcpy(mem.base + l.parameter_offset[p] + j * sizeof(float), &v, sizeof(float));
            }
        }
        adopt_parameters(model, mem.base, l.bytes, how);
        run_config adopted = cfg;
        adopted.keep_parameters = true;
        device[r] = train_on_stream(model, compute, comm.rank(), adopted);
        compute.synchronize();
        in_memory[r] = mem.every_parameter<float>(l, model.plan());
      });
      check_device_and_memory(device, in_memory, host);
    }
}

TEST_CASE("device path: set_parameters_async / read_parameters_async at stages 1 and 3, bitwise the host runtime") {
  // The whole model from the trainer's memory in one call and back in another, on the streams:
  // stage 1; stage 3 (each rank keeps its shard; the read gathers each buffer once); stage 3
  // with the parameter shards offloaded and the frozen matrix kept whole; stage 3 with int8
  // gathers (the read gathers in full precision). 2 and 3 ranks, 3 steps.
  for (int world : {2, 3})
    for (int config = 0; config < 4; ++config) {
      run_config cfg;
      cfg.steps = 3;
      cfg.optimizer = test_optimizers()[static_cast<std::size_t>(config % 3)];
      CAPTURE(world);
      CAPTURE(config);
      plan_request q = device_request(config == 0 ? 1 : 3, 1, cfg.optimizer, false, config == 2);
      if (config == 2) q.offload = offload::parameters;
      if (config == 3) q.quantization = {quantized_bits::int8, quantized_bits::none, 8};
      std::vector<std::vector<std::vector<float>>> host(static_cast<std::size_t>(world)),
          device(static_cast<std::size_t>(world)), in_memory(static_cast<std::size_t>(world));
      local::launch(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        sharded_model_options options;
        options.optimizer = cfg.optimizer;
        {
          plan_request qh = q;
          qh.offload = offload::none;
          sharded_model model(comm, qh, options);
          host[r] = train_sharded(model, comm.rank(), cfg);
        }
        primitive::host_stream compute;
        host_execution_stream stream(compute);
        sharded_model model(comm, q, device_context{&stream}, options);
        const adoption_layout l = layout_for_adoption(model.plan());
        trainer_memory in(l, 0xff), out(l, 0xff);
        const auto& pl = model.plan().placements();
        for (std::size_t p = 0; p < pl.size(); ++p)
          for (std::uint64_t j = 0; j < pl[p].numel; ++j) {
            const float v = initial_value(pl[p].storage, j);
            std::memcpy(in.base + l.parameter_offset[p] + j * sizeof(float), &v, sizeof(float));
          }
        set_parameters_async(model, in.base, l.bytes);
        run_config taken = cfg;
        taken.keep_parameters = true;
        device[r] = train_on_stream(model, compute, comm.rank(), taken);
        read_parameters_async(model, out.base, l.bytes);
        compute.synchronize();
        model.synchronize();
        in_memory[r] = out.every_parameter<float>(l, model.plan());
      });
      check_device_and_memory(device, in_memory, host);
    }
}

TEST_CASE("device path: a read the runtime does not order reads stale parameters; the compute stream's read waits") {
  // Stage 3, two ranks, after one step: the communication stream is paused, pre_forward(0)
  // enqueues the gather there. A trainer that reads the view on a stream of its own (no event
  // wait) reads the gather slot as it was: stale. The same read on the compute stream waits for
  // the gather and sees the updated parameters.
  for (bool prefetch : {false, true}) {
    CAPTURE(prefetch);
    std::vector<std::vector<float>> stale(2), fresh(2), updated(2);
    std::vector<int> compute_done_while_paused(2, -1);
    local::launch(2, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      run_config cfg;
      cfg.steps = 1;
      cfg.optimizer = test_optimizers()[0];
      plan_request q = device_request(3, 1, cfg.optimizer);
      q.prefetch = prefetch;
      primitive::host_stream compute;
      host_execution_stream stream(compute);
      sharded_model_options options;
      options.optimizer = cfg.optimizer;
      sharded_model model(comm, q, device_context{&stream}, options);
      (void)train_on_stream(model, compute, comm.rank(), cfg);  // initial values, one step
      compute.synchronize();
      const std::size_t embed = model.index("embed");
      auto& comm_stream = dynamic_cast<host_execution_stream&>(*model.communication_stream()).native();
      comm_stream.pause();
      model.pre_forward(model.unit_of(embed));
      const std::span<float> w = model.parameter<float>(embed);
      stale[r].assign(w.size(), -1.0f);
      fresh[r].assign(w.size(), -1.0f);
      primitive::host_stream side;  // the trainer's mistake: not the stream the runtime orders
      primitive::enqueue_copy(side, stale[r].data(), w.data(), w.size_bytes());
      side.synchronize();  // completes although the gather has not run
      primitive::enqueue_copy(compute, fresh[r].data(), w.data(), w.size_bytes());
      compute_done_while_paused[r] = compute.query() ? 1 : 0;  // waits on the gather: not done
      comm_stream.resume();
      compute.synchronize();
      model.post_forward(model.unit_of(embed));
      updated[r].resize(w.size());
      model.read_parameter(embed, updated[r]);
    });
    for (std::size_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(compute_done_while_paused[r] == 0);
      CHECK(fresh[r] == updated[r]);  // the ordered read sees the gathered, updated parameters
      CHECK(stale[r] != updated[r]);  // the unordered one read the slot before the gather
    }
  }
}

TEST_CASE("device path: a device context that does not fit is refused with invalid_argument on every rank") {
  sharded_model_options options;
  SUBCASE("no compute stream") {
    std::vector<std::exception_ptr> errors(2);
    local::launch(2, [&](communicator& comm) {
      try {
        sharded_model model(comm, device_request(1, 1, options.optimizer), device_context{}, options);
      } catch (...) { errors[static_cast<std::size_t>(comm.rank())] = std::current_exception(); }
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE(errors[static_cast<std::size_t>(r)]);
      CHECK(kind_of(errors[static_cast<std::size_t>(r)]) == errc::invalid_argument);
      const std::string m = message_of(errors[static_cast<std::size_t>(r)]);
      CHECK(m.find("rank " + std::to_string(r)) != std::string::npos);
      CHECK(m.find("needs the trainer's compute stream") != std::string::npos);
    }
  }
  SUBCASE("a device-memory compute stream with a host-memory communicator, on one rank only") {
    // Rank 1's stream claims CUDA device memory; rank 0's is a host stream. Neither hangs: rank 1
    // names what was expected, rank 0 names rank 1.
    std::vector<std::exception_ptr> errors(2);
    local::launch(2, [&](communicator& comm) {
      primitive::host_stream compute;
      host_execution_stream host(compute);
      claims_cuda_stream device(0);
      execution_stream* s = comm.rank() == 1 ? static_cast<execution_stream*>(&device) : &host;
      try {
        sharded_model model(comm, device_request(2, 1, options.optimizer), device_context{s}, options);
      } catch (...) { errors[static_cast<std::size_t>(comm.rank())] = std::current_exception(); }
    });
    REQUIRE(errors[0]);
    REQUIRE(errors[1]);
    CHECK(kind_of(errors[0]) == errc::invalid_argument);
    CHECK(kind_of(errors[1]) == errc::invalid_argument);
    const std::string m1 = message_of(errors[1]), m0 = message_of(errors[0]);
    CHECK(m1.find("rank 1") != std::string::npos);
    CHECK(m1.find("the compute stream is a cuda_stream, whose model state is CUDA device memory, but the shard "
                  "communicator (local) moves host memory: expected a CUDA device-memory communicator") !=
          std::string::npos);
    CHECK(m0.find("rank 1 refused the plan") != std::string::npos);
  }
  SUBCASE("a host compute stream with a device-memory communicator") {
    claims_device_memory comm(0);
    primitive::host_stream compute;
    host_execution_stream host(compute);
    try {
      sharded_model model(comm, device_request(0, 1, options.optimizer), device_context{&host}, options);
      FAIL("accepted");
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("rank 0") != std::string::npos);
      CHECK(std::string(e.what()).find("the compute stream is a host_stream, whose model state is host memory, but "
                                       "the shard communicator (nccl) moves CUDA device memory: expected a "
                                       "host-memory communicator") != std::string::npos);
    }
  }
  SUBCASE("a compute stream on another device") {
    claims_device_memory comm(1);
    claims_cuda_stream stream(0);
    try {
      sharded_model model(comm, device_request(3, 1, options.optimizer), device_context{&stream}, options);
      FAIL("accepted");
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("the compute stream is on CUDA device 0 but the shard communicator's rank "
                                       "uses CUDA device 1: expected a compute stream on device 1") !=
            std::string::npos);
    }
  }
  SUBCASE("reproducible mode on a stream whose memory host code cannot touch") {
    claims_device_memory comm(0);
    claims_cuda_stream stream(0);
    sharded_model_options o = options;
    o.reproducible = true;
    CHECK_THROWS_WITH_AS(sharded_model(comm, device_request(1, 1, o.optimizer), device_context{&stream}, o),
                         doctest::Contains("reproducible mode deposits and sums on the host, and the compute stream "
                                           "is a cuda_stream, whose memory host code cannot touch"),
                         error);
  }
  SUBCASE("a plan for another memory space than the compute stream's") {
    // A request naming device memory on a host compute stream (rank 1 only), and a plan built for
    // device memory on the host path: refused on every rank, naming both spaces.
    for (bool built_plan : {false, true}) {
      CAPTURE(built_plan);
      const auto out = outcomes(2, [&](communicator& comm) {
        plan_request q = device_request(3, 1, options.optimizer);
        if (built_plan || comm.rank() == 1) q.space = primitive::memory_space::device;
        primitive::host_stream compute;
        host_execution_stream host(compute);
        if (built_plan) {
          q.world_size = comm.world_size();
          const shard_plan plan(q);
          sharded_model model(comm, plan, plan.parameters(), options);
        } else {
          sharded_model model(comm, q, device_context{&host}, options);
        }
      });
      for (int r = 0; r < 2; ++r) {
        const auto& [kind, what] = out[static_cast<std::size_t>(r)];
        INFO(what);
        CHECK(kind == errc::invalid_argument);
        CHECK(what.find("rank " + std::to_string(built_plan ? r : 1)) != std::string::npos);
        if (built_plan || r == 1)
          CHECK(what.find("the plan is for device memory (plan_request::space), but this model's state lives in host "
                          "memory, its compute stream's: expected a plan for host memory") != std::string::npos);
      }
    }
  }
}

TEST_CASE("device path: reproducible mode at stages 0-3, bitwise the host runtime") {
  // Reproducible mode's deposits and sums run on the communication stream; the result must not
  // depend on the compute stream (the trainer's thread, or a host stream of its own).
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    for (int world : {2, 3}) {
      run_config cfg;
      cfg.steps = 2;
      cfg.accumulation = 6 / world;
      cfg.optimizer = test_optimizers()[static_cast<std::size_t>(stage) % test_optimizers().size()];
      std::vector<std::vector<std::vector<float>>> host(static_cast<std::size_t>(world)),
          device(static_cast<std::size_t>(world));
      local::launch(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        sharded_model_options o;
        o.optimizer = cfg.optimizer;
        o.reproducible = true;
        {
          sharded_model model(comm, device_request(stage, cfg.accumulation, cfg.optimizer), o);
          host[r] = train_sharded(model, comm.rank(), cfg);
        }
        primitive::host_stream compute;
        host_execution_stream stream(compute);
        sharded_model model(comm, device_request(stage, cfg.accumulation, cfg.optimizer), device_context{&stream}, o);
        device[r] = train_on_stream(model, compute, comm.rank(), cfg);
        compute.synchronize();
      });
      for (std::size_t r = 0; r < host.size(); ++r) {
        CAPTURE(world);
        CAPTURE(r);
        CHECK(bitwise_equal(device[r], host[r]));
        CHECK(bitwise_equal(host[r], host[0]));
      }
    }
  }
}

TEST_CASE("device path: a refused step leaves the state as it was; the next step runs") {
  // Ranks that set different learning rates: the check runs first on the communication stream,
  // the rest of the step is skipped there, and every rank throws; parameters are unchanged.
  std::vector<std::string> messages(2);
  std::vector<int> unchanged(2, 0), recovered(2, 0);
  local::launch(2, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    primitive::host_stream compute;
    host_execution_stream host(compute);
    sharded_model_options options;
    options.optimizer = test_optimizers()[0];
    sharded_model model(comm, device_request(2, 1, options.optimizer), device_context{&host}, options);
    run_config cfg;
    cfg.steps = 1;
    cfg.optimizer = options.optimizer;
    (void)train_on_stream(model, compute, comm.rank(), cfg);
    const std::size_t p = model.index("l1.w");
    std::vector<float> before(model.plan().placements()[p].numel), after(before.size());
    model.read_parameter(p, before);
    model.set_learning_rate(comm.rank() == 0 ? 0.05 : 0.025);
    model.pre_backward(model.unit_of(p));
    auto g = model.gradient<float>(p);
    compute.enqueue([g] {
      for (float& x : g) x += 1.0f;
    });
    model.post_backward(model.unit_of(p));
    try {
      (void)model.step();
    } catch (const error& e) { messages[r] = e.what(); }
    model.read_parameter(p, after);
    unchanged[r] = before == after ? 1 : 0;
    model.set_learning_rate(0.05);
    const step_result s = model.step();  // the kept gradients, now with equal rates
    recovered[r] = s.steps == 2 ? 1 : 0;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(messages[r].find("hold different learning rates at step 2") != std::string::npos);
    CHECK(unchanged[r] == 1);
    CHECK(recovered[r] == 1);
  }
}

namespace {

/// The bfloat16 loop (bfloat16 parameters and gradients, float32 master weights and states) for
/// both paths: `run` executes the backward arithmetic at once (host path) or enqueues it on the
/// compute stream (device path).
template <class Run>
std::vector<std::vector<float>> train_bfloat16(sharded_model& model, int rank, int steps, Run run) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(plan.placements()[p].numel);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial_value(plan.placements()[p].storage, j);
    model.set_parameter(p, v);
  }
  for (int step = 0; step < steps; ++step) {
    one_pass(model, [&](std::size_t p) {
      const std::span<bfloat16> w = model.parameter<bfloat16>(p);
      const std::span<bfloat16> g = model.gradient<bfloat16>(p);
      const std::size_t s = plan.placements()[p].storage;
      const int use = use_of(params[p].name);
      run([=] {
        for (std::size_t j = 0; j < g.size(); ++j)
          g[j] = static_cast<bfloat16>(static_cast<float>(g[j]) +
                                       gradient_term(rank, 0, step, s, j, use, static_cast<float>(w[j]), 0, false));
      });
    });
    model.end_backward();
    (void)model.step();
  }
  std::vector<std::vector<float>> out(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

/// A float32 training loop in which the last rank's first trainable gradient element is +inf at
/// step `overflow` (the global norm is not finite on every rank); `run` as for train_bfloat16.
template <class Run>
std::vector<std::vector<float>> train_overflowing(sharded_model& model, int rank, int world, int steps, int overflow,
                                                  Run run, std::vector<step_result>& results) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  set_initial_parameters(model);
  for (int step = 0; step < steps; ++step) {
    for (std::size_t u = 0; u < model.unit_count(); ++u) {
      model.pre_forward(u);
      model.post_forward(u);
    }
    bool poisoned = false;
    for (std::size_t u = model.unit_count(); u-- > 0;) {
      model.pre_backward(u);
      for (std::size_t p : plan.units()[u].members) {
        if (!params[p].trainable || plan.placements()[p].numel == 0) continue;
        const std::span<float> w = model.parameter<float>(p);
        const std::span<float> g = model.gradient<float>(p);
        const std::size_t s = plan.placements()[p].storage;
        const int use = use_of(params[p].name);
        const bool poison = step == overflow && rank == world - 1 && !poisoned;
        poisoned = poisoned || poison;
        run([=] {
          for (std::size_t j = 0; j < g.size(); ++j) g[j] += gradient_term(rank, 0, step, s, j, use, w[j], 0, false);
          if (poison) g[0] = std::numeric_limits<float>::infinity();
        });
      }
      model.post_backward(u);
    }
    model.end_backward();
    results.push_back(model.step());
  }
  std::vector<std::vector<float>> out(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

}  // namespace

TEST_CASE("device path: a non-finite gradient norm skips the step (or not), clipping on, bitwise the host runtime") {
  // The decision is made on the communication stream from the all_reduced sum of squares; a
  // skipped step updates nothing, does not count, and (stages 1-2) regathers unchanged shards.
  const auto optimizers = test_optimizers();
  for (int world : {1, 2, 3})
    for (int stage = 0; stage <= 3; ++stage)
      for (bool skip : {true, false}) {
        CAPTURE(world);
        CAPTURE(stage);
        CAPTURE(skip);
        const std::size_t n = static_cast<std::size_t>(world);
        std::vector<std::vector<std::vector<float>>> host(n), device(n);
        std::vector<std::vector<step_result>> host_steps(n), device_steps(n);
        local::launch(world, [&](communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          sharded_model_options options;
          options.optimizer = optimizers[static_cast<std::size_t>(world + stage) % optimizers.size()];
          options.max_grad_norm = 1.0;
          options.skip_nonfinite_steps = skip;
          const plan_request q = device_request(stage, 1, options.optimizer);
          {
            sharded_model model(comm, q, options);
            host[r] = train_overflowing(
                model, comm.rank(), world, 4, 1, [](const auto& work) { work(); }, host_steps[r]);
          }
          primitive::host_stream compute;
          host_execution_stream stream(compute);
          sharded_model model(comm, q, device_context{&stream}, options);
          device[r] = train_overflowing(
              model, comm.rank(), world, 4, 1, [&](const auto& work) { compute.enqueue(work); }, device_steps[r]);
          compute.synchronize();
        });
        for (std::size_t r = 0; r < n; ++r) {
          CAPTURE(r);
          CHECK(bitwise_equal(device[r], host[r]));
          REQUIRE(device_steps[r].size() == 4);
          REQUIRE(host_steps[r].size() == 4);
          for (std::size_t t = 0; t < 4; ++t) CHECK(same_result(device_steps[r][t], host_steps[r][t]));
          CHECK(std::isinf(device_steps[r][1].gradient_norm));
          CHECK(device_steps[r][1].skipped == skip);
          CHECK(device_steps[r][3].steps == (skip ? 3u : 4u));
          CHECK(device_steps[r][0].clip_coefficient < 1);  // the test model's norm is above 1
          if (skip) {
            for (std::size_t t : {2u, 3u}) CHECK(std::isfinite(device_steps[r][t].gradient_norm));
            for (const auto& values : device[r])
              for (float x : values) CHECK(std::isfinite(x));
          }
        }
      }
}

TEST_CASE("device path: bfloat16 parameters and gradients with float32 master weights, bitwise the host runtime") {
  for (int world : {1, 2, 3})
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(world);
      CAPTURE(stage);
      std::vector<std::vector<std::vector<float>>> host(static_cast<std::size_t>(world)),
          device(static_cast<std::size_t>(world));
      local::launch(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        sharded_model_options options;
        options.optimizer = test_optimizers()[2];  // AdamW
        plan_request q = device_request(stage, 1, options.optimizer);
        q.precision = precision::bfloat16_adam();
        {
          sharded_model model(comm, q, options);
          host[r] = train_bfloat16(model, comm.rank(), 3, [](const auto& work) { work(); });
        }
        primitive::host_stream compute;
        host_execution_stream stream(compute);
        sharded_model model(comm, q, device_context{&stream}, options);
        device[r] = train_bfloat16(model, comm.rank(), 3, [&](const auto& work) { compute.enqueue(work); });
        compute.synchronize();
      });
      for (std::size_t r = 0; r < host.size(); ++r) {
        CAPTURE(r);
        CHECK(bitwise_equal(device[r], host[r]));
      }
    }
}

TEST_CASE("device path: hybrid sharding (2 replica groups of 2 ranks), bitwise the host runtime") {
  // Rank r: shard group r / 2, replica group r % 2. The replica average and the agreement over
  // the replica communicator run on the communication stream too.
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
          run_config cfg;
          cfg.steps = 3;
          cfg.optimizer = test_optimizers()[1];
          cfg.accumulation = 2;
          cfg.max_grad_norm = 0.5;
          sharded_model_options options;
          options.optimizer = cfg.optimizer;
          options.max_grad_norm = cfg.max_grad_norm;
          const plan_request q = device_request(stage, cfg.accumulation, cfg.optimizer);
          {
            sharded_model model(shard_comm, q, options, &replica_comm);
            host[static_cast<std::size_t>(r)] = train_sharded(model, r, cfg);
          }
          primitive::host_stream compute;
          host_execution_stream stream(compute);
          sharded_model model(shard_comm, q, device_context{&stream}, options, &replica_comm);
          device[static_cast<std::size_t>(r)] = train_on_stream(model, compute, r, cfg);
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

namespace {

/// All_gathers per optimizer step in `plan`'s traffic (stage 3's parameter gathers).
std::uint64_t planned_gathers(const shard_plan& plan) {
  std::uint64_t calls = 0;
  for (const traffic_entry& e : plan.traffic())
    if (e.collective == collective_kind::all_gather && e.purpose.starts_with("parameters before")) calls += e.calls;
  return calls;
}

}  // namespace

TEST_CASE("stage 3 reshard_after_forward: every policy, host and device path, the same bits; gathers as planned") {
  // The policy changes when units are gathered, never what is computed: every policy and path
  // gives the bits of `all` on the host path. The collectives each rank issues differ from
  // `all`'s by exactly the plan's difference in gathers, and the memory held at the peak is the
  // plan's (whose gather buffer count comes from the same bookkeeping).
  const std::vector<reshard_policy> policies = {reshard_policy::all, reshard_policy::except_last, reshard_policy::none};
  int runs = 0;
  for (int world : {1, 3})
    for (bool prefetch : {true, false}) {
      run_config cfg;
      cfg.steps = 2;
      cfg.accumulation = 2;
      cfg.optimizer = test_optimizers()[static_cast<std::size_t>(world) % test_optimizers().size()];
      cfg.mark_ready = prefetch;
      const auto ranks = static_cast<std::size_t>(world);
      std::vector<std::vector<std::vector<float>>> reference(ranks);
      std::vector<std::uint64_t> reference_issued(ranks);
      std::uint64_t reference_gathers = 0;
      for (reshard_policy policy : policies) {
        CAPTURE(world);
        CAPTURE(prefetch);
        CAPTURE(reshard_policy_name(policy));
        std::vector<std::vector<std::vector<float>>> host(ranks), device(ranks);
        std::vector<std::uint64_t> issued(ranks), gathers(ranks);
        std::vector<std::uint64_t> gather_buffers(ranks);
        std::vector<int> memory_as_planned(ranks, 0);
        local::launch(world, [&](communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          plan_request q = device_request(3, cfg.accumulation, cfg.optimizer);
          q.prefetch = prefetch;
          q.reshard_after_forward = policy;
          sharded_model_options options;
          options.optimizer = cfg.optimizer;
          {
            sharded_model model(comm, q, options);
            const std::uint64_t before = comm.issued();
            host[r] = train_sharded(model, comm.rank(), cfg);
            issued[r] = comm.issued() - before;
            gathers[r] = planned_gathers(model.plan());
            gather_buffers[r] = model.plan().communication().gather_buffers;
            const auto measured = model.memory_allocated(primitive::memory_space::host);
            memory_as_planned[r] += measured.peak == model.plan().memory().total() + sizeof(step_scalars);
          }
          primitive::host_stream compute;
          host_execution_stream stream(compute);
          sharded_model model(comm, q, device_context{&stream}, options);
          device[r] = train_on_stream(model, compute, comm.rank(), cfg);
          compute.synchronize();
          const auto measured = model.memory_allocated(primitive::memory_space::host);
          memory_as_planned[r] += measured.peak == model.plan().memory().total() + sizeof(step_scalars);
        });
        if (policy == reshard_policy::all) {
          reference = host;
          reference_issued = issued;
          reference_gathers = gathers[0];
        }
        for (std::size_t r = 0; r < ranks; ++r) {
          CAPTURE(r);
          CHECK(bitwise_equal(host[r], reference[r]));
          CHECK(bitwise_equal(device[r], reference[r]));
          const auto steps = static_cast<std::uint64_t>(cfg.steps);
          CHECK(issued[r] + steps * reference_gathers == reference_issued[r] + steps * gathers[r]);
          CHECK(memory_as_planned[r] == 2);
        }
        // The test model: u0 holds the embeddings the last unit (u3) ties to, u1-u3 one buffer each.
        if (policy == reshard_policy::except_last) CHECK(reference_gathers - gathers[0] == 2u * 2u);
        if (policy == reshard_policy::none) CHECK(gather_buffers[0] == 4u);
        ++runs;
      }
    }
  CHECK(runs == 2 * 2 * 3);
}

namespace {

/// A pretend device block for the fake table below: pointers inside it are "device memory of
/// CUDA device 1", every other pointer unregistered host memory.
std::vector<float>& pretend_device_block() {
  static std::vector<float> block(1 << 16);
  return block;
}

int pretend_pointer_kind(const void* p, int* kind, int* device) noexcept {
  const auto* f = static_cast<const float*>(p);
  const std::vector<float>& b = pretend_device_block();
  const bool inside = f >= b.data() && f < b.data() + b.size();
  *kind = inside ? 2 : 0;
  *device = inside ? 1 : -1;
  return 0;
}

}  // namespace

TEST_CASE("device path: trainer memory a host compute stream cannot reach is refused, naming what and where") {
  // A table that answers only where pointers lie (as cudaPointerGetAttributes would) is
  // registered for this test: device memory handed to set_parameter_async, read_parameter_async
  // or adopt_parameters beside a host compute stream is refused on that rank with
  // invalid_argument, nothing copied; host memory passes; a null pointer is refused everywhere.
  primitive::device_primitives table;
  table.pointer_kind = &pretend_pointer_kind;
  primitive::register_device_primitives(&table);
  struct unregister {
    ~unregister() { primitive::register_device_primitives(nullptr); }
  } restore;
  std::vector<std::string> refusals;
  std::vector<float> host_values;
  local::launch(1, [&](communicator& comm) {
    primitive::host_stream compute;
    host_execution_stream stream(compute);
    const optimizer_options sgd;
    sharded_model model(comm, device_request(1, 1, sgd), device_context{&stream}, sharded_model_options{});
    const std::size_t p = 0;
    const auto n = static_cast<std::size_t>(model.numel(p));
    REQUIRE(n <= pretend_device_block().size());
    float* on_device = pretend_device_block().data();
    host_values.assign(n, 0.5f);
    const auto refusal = [&](const auto& call) {
      try {
        call();
      } catch (const error& e) {
        CHECK(e.kind() == errc::invalid_argument);
        return std::string(e.what());
      }
      return std::string("(accepted)");
    };
    refusals.push_back(refusal([&] { model.set_parameter_async(p, static_cast<const float*>(on_device)); }));
    refusals.push_back(refusal([&] { model.read_parameter_async(p, on_device); }));
    refusals.push_back(refusal([&] { model.set_parameter_async(p, static_cast<const float*>(nullptr)); }));
    refusals.push_back(refusal([&] {  // host memory: accepted, and the values go round
      model.set_parameter_async(p, host_values.data());
      std::vector<float> out(n);
      model.read_parameter_async(p, out.data());
      model.synchronize();
      compute.synchronize();
      CHECK(out == host_values);
    }));
    const adoption_layout l = layout_for_adoption(model.plan());
    refusals.push_back(refusal([&] {
      // pretend device memory, aligned as the layout wants; refused before anything is copied
      std::vector<float>& b = pretend_device_block();
      void* aligned = b.data();
      std::size_t space = b.size() * sizeof(float);
      if (std::align(l.alignment, l.bytes, aligned, space) == nullptr) throw error(errc::internal, "block too small");
      adopt_parameters(model, aligned, l.bytes);
    }));
  });
  REQUIRE(refusals.size() == 5);
  const auto has = [](const std::string& text, const std::string& part) {
    CAPTURE(text);
    return text.find(part) != std::string::npos;
  };
  const std::string name = "'" + device_request(1, 1, optimizer_options{}).parameters[0].name + "'";
  CHECK(has(refusals[0], "set_parameter_async(" + name +
                             ")'s values is device memory (CUDA device 1), but the "
                             "compute stream is a host_stream, whose memory is host memory: expected host memory"));
  CHECK(has(refusals[0], "rank 0"));
  CHECK(has(refusals[1], "read_parameter_async(" + name + ")'s output is device memory (CUDA device 1)"));
  CHECK(has(refusals[2], "set_parameter_async(" + name + ")'s values is a null pointer for "));
  CHECK(refusals[3] == "(accepted)");
  CHECK(has(refusals[4], "the memory given to adopt_parameters is device memory (CUDA device 1)"));
}
