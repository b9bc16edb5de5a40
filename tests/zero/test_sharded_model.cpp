// The ZeRO runtime: stages 1, 2 and 3 (and 0) train to the same parameters as plain data
// parallelism, across world sizes, optimizers, accumulation and clipping; hybrid sharding;
// memory equal to the plan; traffic equal to the plan; mixed precision; and the refusals.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ringzero/collective/broadcast.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "zero_test_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;
using namespace zero_test;

namespace {

plan_request test_request(int stage, int accumulation) {
  plan_request q;
  q.parameters = test_parameters();
  q.stage = stage;
  q.accumulation_steps = accumulation;
  q.alignment_bytes = 16;
  return q;
}

/// bfloat16 parameters with float32 master weights and float32 gradients (which
/// constant_gradient_step writes), one micro-batch per step.
plan_request bfloat16_request(int stage) {
  plan_request q = test_request(stage, 1);
  q.precision = precision::bfloat16_adam();
  q.precision.gradient = dtype::float32;
  return q;
}

/// AdamW (test_optimizers' third).
sharded_model_options adamw_options() {
  sharded_model_options options;
  options.optimizer = test_optimizers()[2];
  return options;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Runs `f`, which must throw a ringzero::error whose text contains `text`.
template <class F>
void expect(F&& f, const std::string& text) {
  try {
    f();
    FAIL("expected an error mentioning: " << text);
  } catch (const error& e) {
    INFO(e.what());
    CHECK(has(e.what(), text));
  }
}

/// Runs the sharded trainer and the reference on `world` local ranks; returns the worst relative
/// difference over ranks and parameters, and checks every rank holds the same parameters.
double compare_with_reference(int world, int stage, const run_config& cfg, bool accumulate_unsharded = false) {
  std::vector<double> errors(static_cast<std::size_t>(world), 0.0);
  std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(world));
  local::launch(world, [&](communicator& comm) {
    plan_request q = test_request(stage, cfg.accumulation);
    q.accumulate_unsharded = accumulate_unsharded;
    q.precision.optimizer_states = cfg.optimizer.state_count();
    sharded_model_options options;
    options.optimizer = cfg.optimizer;
    options.max_grad_norm = cfg.max_grad_norm;
    sharded_model model(comm, q, options);
    auto mine = train_sharded(model, comm.rank(), cfg);
    const auto reference = train_reference(comm, test_parameters(), cfg);
    errors[static_cast<std::size_t>(comm.rank())] = max_relative_error(mine, reference);
    results[static_cast<std::size_t>(comm.rank())] = std::move(mine);
  });
  for (int r = 1; r < world; ++r) CHECK(results[static_cast<std::size_t>(r)] == results[0]);  // bitwise on every rank
  double worst = 0;
  for (double e : errors) worst = std::max(worst, e);
  return worst;
}

/// One micro-batch through every unit in order (forward) and in reverse (backward), adding 0.25
/// to every trainable float gradient, then end_backward (unless `end` is false).
void constant_gradient_backward(sharded_model& model, bool end = true) {
  one_pass(model, [&](std::size_t p) {
    for (float& g : model.gradient<float>(p)) g += 0.25f;
  });
  if (end) model.end_backward();
}

/// One optimizer step of `accumulation` constant micro-batches.
void constant_gradient_step(sharded_model& model, int accumulation) {
  for (int micro = 0; micro < accumulation; ++micro) constant_gradient_backward(model);
  model.step();
}

}  // namespace

TEST_CASE("stages 0-3 match plain data parallelism after 5 steps (float32, 1e-5 relative)") {
  // The full sweep: world sizes 1-4 x stages 0-3 x three optimizers x accumulation 1 and 3 x
  // clipping off and on. The quick sweep (sanitizer builds) takes one combination per world
  // size and stage, rotating through the others.
  int runs = 0;
  const auto optimizers = test_optimizers();
  for (int world = 1; world <= 4; ++world) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (std::size_t o = 0; o < optimizers.size(); ++o) {
        for (int accumulation : {1, 3}) {
          for (double clip : {0.0, 0.5}) {
#if defined(RINGZERO_TEST_SWEEP_QUICK)
            const int pick = world + stage;
            if (o != static_cast<std::size_t>(pick % 3) || accumulation != (pick % 2 ? 3 : 1) ||
                (clip > 0) != (stage % 2 == 1))
              continue;
#endif
            run_config cfg;
            cfg.optimizer = optimizers[o];
            cfg.accumulation = accumulation;
            cfg.max_grad_norm = clip;
            cfg.mark_ready = (world + stage) % 2 == 0;
            cfg.implicit_last_end = accumulation == 3 && stage % 2 == 1;
            CAPTURE(world);
            CAPTURE(stage);
            CAPTURE(optimizer_name(cfg.optimizer.kind));
            CAPTURE(accumulation);
            CAPTURE(clip);
            CHECK(compare_with_reference(world, stage, cfg) <= 1e-5);
            ++runs;
          }
        }
      }
    }
  }
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  CHECK(runs == 4 * 4);
#else
  CHECK(runs == 4 * 4 * 3 * 2 * 2);
#endif
}

TEST_CASE("clipping is active in the clipped runs and the norm is global") {
  // The unclipped global norm of the first step is well above 0.5, so the clipped runs above
  // really clip; every rank reports the same norm at every stage.
  for (int stage = 0; stage <= 3; ++stage) {
    std::vector<double> norms(3);
    local::launch(3, [&](communicator& comm) {
      plan_request q = test_request(stage, 1);
      sharded_model_options options;
      options.optimizer.kind = optimizer_kind::adam;
      options.max_grad_norm = 0.5;
      sharded_model model(comm, q, options);
      for (std::size_t p = 0; p < model.parameter_count(); ++p) {
        std::vector<float> v(model.plan().placements()[p].numel, 1.0f);
        model.set_parameter(p, v);
      }
      for (std::size_t u = model.unit_count(); u-- > 0;) {
        model.pre_backward(u);
        for (std::size_t p : model.plan().units()[u].members)
          if (model.plan().parameters()[p].trainable)
            for (float& g : model.gradient<float>(p)) g += 1.0f + static_cast<float>(comm.rank());  // average 2
        model.post_backward(u);
      }
      const step_result r = model.step();
      norms[static_cast<std::size_t>(comm.rank())] = r.gradient_norm;
      CHECK(r.clip_coefficient < 1.0);
      CHECK_FALSE(r.skipped);
    });
    // trainable unique elements: embed 35 (two uses: gradient 4), l1 45 + 9, l2 36 + 4, scale 1, l3 13
    const double expected = std::sqrt(35.0 * 16 + 4.0 * (45 + 9 + 36 + 4 + 1 + 13));
    CAPTURE(stage);
    for (double n : norms) CHECK(n == doctest::Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("stages 2-3 accumulating unsharded (one reduce_scatter per step) match plain data parallelism") {
  // World sizes 1-4, 3 micro-batches per step, the optimizers in rotation, clipping at stage 3.
  const auto optimizers = test_optimizers();
  for (int world = 1; world <= 4; ++world)
    for (int stage : {2, 3}) {
      run_config cfg;
      cfg.optimizer = optimizers[static_cast<std::size_t>(world + stage) % optimizers.size()];
      cfg.accumulation = 3;
      cfg.max_grad_norm = stage == 3 ? 0.5 : 0.0;
      cfg.mark_ready = world % 2 == 0;
      CAPTURE(world);
      CAPTURE(stage);
      CHECK(compare_with_reference(world, stage, cfg, true) <= 1e-5);
    }
}

TEST_CASE(
    "stage 3 keeping frozen parameters gathered: plain data parallelism's results, bitwise those gathering them") {
  // The test model's frozen matrix (unit u1) held whole on every rank: the trainable results
  // equal the run that gathers it with u1, bit for bit, on every rank; read_parameter of it is
  // local (rank 0 alone reads it), and its values are the initial ones.
  const auto optimizers = test_optimizers();
  for (int world = 1; world <= 4; ++world) {
    run_config cfg;
    cfg.optimizer = optimizers[static_cast<std::size_t>(world) % optimizers.size()];
    cfg.accumulation = world % 2 + 1;
    cfg.max_grad_norm = world == 3 ? 0.5 : 0.0;
    cfg.mark_ready = world % 2 == 0;
    CAPTURE(world);
    std::vector<std::vector<std::vector<float>>> kept(static_cast<std::size_t>(world)),
        gathered(static_cast<std::size_t>(world));
    std::vector<double> errors(static_cast<std::size_t>(world), 0.0);
    std::vector<float> frozen_read;
    local::launch(world, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      sharded_model_options options;
      options.optimizer = cfg.optimizer;
      options.max_grad_norm = cfg.max_grad_norm;
      for (bool keep : {false, true}) {
        plan_request q = test_request(3, cfg.accumulation);
        q.precision.optimizer_states = cfg.optimizer.state_count();
        q.keep_frozen_bytes = keep ? keep_all_frozen : 0;
        sharded_model model(comm, q, options);
        const std::size_t f = model.index("frozen.w");
        CHECK(model.plan().buffers()[model.plan().placements()[f].buffer].replicated == keep);
        (keep ? kept : gathered)[r] = train_sharded(model, comm.rank(), cfg);
        if (keep && r == 0) {  // local: the other ranks are not in it
          frozen_read.resize(9);
          model.read_parameter(f, frozen_read);
        }
      }
      errors[r] = max_relative_error(kept[r], train_reference(comm, test_parameters(), cfg));
    });
    for (std::size_t r = 0; r < kept.size(); ++r) {
      CHECK(bitwise_equal(kept[r], gathered[r]));
      CHECK(bitwise_equal(kept[r], kept[0]));
      CHECK(errors[r] <= 1e-5);
    }
    const std::size_t fp = shard_plan(test_request(3, 1)).find("frozen.w").value();
    for (std::uint64_t j = 0; j < 9; ++j) CHECK(frozen_read[j] == initial_value(fp, j));
  }
}

TEST_CASE(
    "stage 3 prefetch lists and max_inflight_gathers: the default's bits, the plan's memory and bytes; a bad list "
    "refused everywhere") {
  // u0's forward gathers u1 and u2 ahead, u3's backward gathers u1 and u2 ahead, u1's backward
  // nothing: every rank's parameters bit for bit those of the default prefetch, the pools as
  // planned (no growth), the bytes sent as planned (ring). The same lists under
  // max_inflight_gathers = 2: the prefetches beyond it skipped, two gather buffers, the same bits.
  const std::vector<prefetch_list> lists = {{"u0", std::vector<std::string>{"u1", "u2"}, std::nullopt},
                                            {"u3", std::nullopt, std::vector<std::string>{"u1", "u2"}},
                                            {"u1", std::nullopt, std::vector<std::string>{}}};
  for (int world : {2, 3}) {
    CAPTURE(world);
    run_config cfg;
    cfg.accumulation = 2;
    cfg.optimizer = test_optimizers()[static_cast<std::size_t>(world) % 3];
    std::vector<std::vector<std::vector<float>>> listed(static_cast<std::size_t>(world)),
        plain(static_cast<std::size_t>(world)), bounded(static_cast<std::size_t>(world));
    local::launch(world, [&](communicator& comm) {
      comm.set_forced_algorithm(algorithm::ring);
      const auto r = static_cast<std::size_t>(comm.rank());
      sharded_model_options options;
      options.optimizer = cfg.optimizer;
      for (int mode : {0, 1, 2}) {  // the default; the lists; the lists under max_inflight_gathers = 2
        plan_request q = test_request(3, cfg.accumulation);
        q.precision.optimizer_states = cfg.optimizer.state_count();
        if (mode > 0) q.prefetch_lists = lists;
        if (mode == 2) q.max_inflight_gathers = 2;
        sharded_model model(comm, q, options);
        (mode == 0 ? plain : mode == 1 ? listed : bounded)[r] = train_sharded(model, comm.rank(), cfg);
        if (mode == 0) continue;
        // u3's backward holds u3, u0 (whose storage its tied parameter uses) and u1, u2 ahead;
        // bounded, u3 and u0 only (what a unit's own use needs is never held back).
        CHECK(model.plan().communication().gather_buffers == (mode == 1 ? 4 : 2));
        const traffic_counts before = comm.traffic();
        constant_gradient_step(model, cfg.accumulation);  // one more step, measured
        const traffic_counts used = comm.traffic() - before;
        CHECK(model.memory_in_use().communication_buffers == model.plan().memory().communication_buffers);
        // Measured where allocated: at no moment more than the plan (the pool never grew).
        CHECK(model.memory_allocated(primitive::memory_space::host).peak ==
              model.plan().memory().total() + sizeof(step_scalars));
        std::uint64_t planned = 0;
        for (const traffic_entry& e : model.plan().traffic())
          if (e.collective == collective_kind::all_gather) planned += e.ring_bytes_sent();
        // plus the step's agreement record, an all_gather of three uint64
        CHECK(used.of(collective_kind::all_gather).sent == planned + (world - 1) * 3 * sizeof(std::uint64_t));
      }
    });
    for (std::size_t r = 0; r < listed.size(); ++r) {
      CHECK(bitwise_equal(listed[r], plain[r]));
      CHECK(bitwise_equal(bounded[r], plain[r]));
    }
  }
  // A list that names an unknown unit on one rank: refused on every rank, naming it.
  std::vector<std::string> errors(2);
  local::launch(2, [&](communicator& comm) {
    plan_request q = test_request(3, 1);
    if (comm.rank() == 1) q.prefetch_lists = {{"u0", std::vector<std::string>{"u9"}, std::nullopt}};
    try {
      sharded_model model(comm, q, sharded_model_options{});
    } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  CHECK(has(errors[1], "the forward prefetch list of unit 'u0' names unit 'u9', which no parameter names"));
  CHECK(has(errors[0], "rank 1"));
}

TEST_CASE("set_parameter_async / read_parameter_async: the parameter's dtype in and out, as the synchronous calls") {
  // bfloat16 parameters with float32 master weights on 2 ranks, stages 0-3: values handed in as
  // bfloat16 read back bit for bit (asynchronously and as floats), and a step after them equals
  // the step after set_parameter of the same values widened to float.
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    local::launch(2, [&](communicator& comm) {
      const plan_request q = bfloat16_request(stage);
      sharded_model async_model(comm, q, adamw_options()), sync_model(comm, q, adamw_options());
      const std::size_t n = async_model.parameter_count();
      std::vector<std::vector<bfloat16>> in(n), back(n);
      for (std::size_t p = 0; p < n; ++p) {
        in[p].resize(async_model.numel(p));
        back[p].resize(in[p].size());
        std::vector<float> widened(in[p].size());
        for (std::size_t j = 0; j < in[p].size(); ++j) {
          in[p][j] = static_cast<bfloat16>(1.5f * initial_value(p, j) + 0.001f * static_cast<float>(j));
          widened[j] = static_cast<float>(in[p][j]);
        }
        async_model.set_parameter_async(p, in[p].data());
        sync_model.set_parameter(p, widened);
        async_model.read_parameter_async(p, back[p].data());
        // (bit for bit; an empty parameter's vectors have no data to compare)
        CHECK((in[p].empty() || std::memcmp(back[p].data(), in[p].data(), in[p].size() * sizeof(bfloat16)) == 0));
        std::vector<float> read(in[p].size());
        async_model.read_parameter(p, read);
        CHECK(read == widened);
      }
      constant_gradient_step(async_model, 1);
      constant_gradient_step(sync_model, 1);
      for (std::size_t p = 0; p < n; ++p) {
        std::vector<float> a(in[p].size()), b(in[p].size());
        async_model.read_parameter(p, a);
        sync_model.read_parameter(p, b);
        CHECK(a == b);
      }
      // The dtype is the parameter's: a float pointer for a bfloat16 parameter is refused.
      std::vector<float> wrong(async_model.numel(0));
      CHECK_THROWS_WITH_AS(async_model.set_parameter_async(0, wrong.data()),
                           doctest::Contains("parameter of 'embed' is bfloat16, requested as float32"), error);
      CHECK_THROWS_WITH_AS(async_model.read_parameter_async(0, wrong.data()), doctest::Contains("requested as float32"),
                           error);
    });
  }
}

/// Every parameter of the bfloat16 `model` equals `reference`'s, and so do its values in `mem`
/// (laid out by `l`). At stage 3 a collective.
void check_parameters(sharded_model& model, sharded_model& reference, const trainer_memory& mem,
                      const adoption_layout& l) {
  for (std::size_t p = 0; p < model.parameter_count(); ++p) {
    std::vector<float> a(model.numel(p)), b(model.numel(p));
    model.read_parameter(p, a);
    reference.read_parameter(p, b);
    CHECK(a == b);
    const std::vector<bfloat16> in_memory = mem.values<bfloat16>(l, p, b.size());
    std::vector<float> widened(in_memory.size());
    for (std::size_t j = 0; j < widened.size(); ++j) widened[j] = static_cast<float>(in_memory[j]);
    CHECK(widened == b);
  }
}

TEST_CASE("adopt_parameters: the trainer's memory is the parameter storage at stages 0-2, as set_parameter") {
  // bfloat16 parameters with float32 master weights, 2 and 3 ranks: a model whose parameters
  // live in the trainer's memory (values in it, or the model's copied there) trains as one given
  // the same values by set_parameter; the views point into the memory, the padding (filled with
  // 0xff, a NaN) is zeroed, and the memory holds the trained values.
  for (int world : {2, 3})
    for (int stage = 0; stage <= 2; ++stage)
      for (adopted_values how : {adopted_values::from_memory, adopted_values::from_model}) {
        CAPTURE(world);
        CAPTURE(stage);
        CAPTURE(static_cast<int>(how));
        local::launch(world, [&](communicator& comm) {
          const plan_request q = bfloat16_request(stage);
          std::optional<trainer_memory> trainer;  // outlives the model
          sharded_model adopted(comm, q, adamw_options()), reference(comm, q, adamw_options());
          const adoption_layout l = layout_for_adoption(adopted.plan());
          CHECK(l.alignment == 64);
          const trainer_memory& mem = trainer.emplace(l, 0xff);
          const std::size_t n = adopted.parameter_count();
          for (std::size_t p = 0; p < n; ++p) {
            std::vector<bfloat16> v(adopted.numel(p));
            std::vector<float> widened(v.size());
            for (std::size_t j = 0; j < v.size(); ++j) {
              v[j] = static_cast<bfloat16>(1.5f * initial_value(adopted.plan().placements()[p].storage, j));
              widened[j] = static_cast<float>(v[j]);
            }
            reference.set_parameter(p, widened);
            if (how == adopted_values::from_model) adopted.set_parameter(p, widened);
            if (how == adopted_values::from_memory && !v.empty())
              std::memcpy(mem.base + l.parameter_offset[p], v.data(), v.size() * sizeof(bfloat16));
          }
          adopt_parameters(adopted, mem.base, l.bytes, how);
          std::vector<bool> covered(l.bytes, false);
          for (std::size_t p = 0; p < n; ++p) {
            const auto view = adopted.parameter<bfloat16>(p);
            CHECK(reinterpret_cast<unsigned char*>(view.data()) ==
                  (view.empty() ? nullptr : mem.base + l.parameter_offset[p]));
            for (std::size_t k = 0; k < view.size_bytes(); ++k) covered[l.parameter_offset[p] + k] = true;
          }
          std::size_t nonzero_padding = 0;  // inside the buffers (between them the memory is not the model's)
          for (std::size_t b = 0; b < adopted.plan().buffers().size(); ++b) {
            const flat_buffer& f = adopted.plan().buffers()[b];
            for (std::uint64_t k = l.buffer_offset[b]; k < l.buffer_offset[b] + f.numel * dtype_size(f.type); ++k)
              nonzero_padding += !covered[k] && mem.base[k] != 0;
          }
          CHECK(nonzero_padding == 0);
          for (int step = 0; step < 2; ++step) {
            constant_gradient_step(adopted, 1);
            constant_gradient_step(reference, 1);
          }
          check_parameters(adopted, reference, mem, l);
        });
      }
}

TEST_CASE("set_parameters_async / read_parameters_async: the whole model from and into the trainer's memory") {
  // bfloat16 parameters with float32 masters, stages 0-3 (stage 3 also keeping the frozen buffer
  // whole) on 1-3 ranks: one call sets every parameter from the trainer's memory (its padding
  // 0xff, which must not be read) as set_parameter per parameter does, training then agrees
  // bit for bit, the memory is not kept (changed after the call, nothing changes), and the read
  // gives back every parameter and zeros in each buffer's padding.
  for (int world : {1, 2, 3})
    for (int config = 0; config <= 4; ++config) {
      const int stage = config == 4 ? 3 : config;
      CAPTURE(world);
      CAPTURE(config);
      local::launch(world, [&](communicator& comm) {
        plan_request q = bfloat16_request(stage);
        if (config == 4) q.keep_frozen_bytes = 1 << 20;
        sharded_model model(comm, q, adamw_options()), reference(comm, q, adamw_options());
        const adoption_layout l = layout_for_adoption(model.plan());
        trainer_memory in(l, 0xff), out(l, 0xff);
        const std::size_t n = model.parameter_count();
        for (std::size_t p = 0; p < n; ++p) {
          std::vector<bfloat16> v(model.numel(p));
          std::vector<float> widened(v.size());
          for (std::size_t j = 0; j < v.size(); ++j) {
            v[j] = static_cast<bfloat16>(1.5f * initial_value(model.plan().placements()[p].storage, j) +
                                         0.001f * static_cast<float>(j));
            widened[j] = static_cast<float>(v[j]);
          }
          reference.set_parameter(p, widened);
          if (!v.empty()) std::memcpy(in.base + l.parameter_offset[p], v.data(), v.size() * sizeof(bfloat16));
        }
        set_parameters_async(model, in.base, l.bytes);
        model.synchronize();                                                        // the copies are done
        std::fill(in.raw.begin(), in.raw.end(), static_cast<unsigned char>(0x7f));  // not kept
        for (int step = 0; step < 2; ++step) {
          constant_gradient_step(model, 1);
          constant_gradient_step(reference, 1);
        }
        read_parameters_async(model, out.base, l.bytes);
        model.synchronize();
        check_parameters(model, reference, out, l);
        std::vector<bool> covered(l.bytes, false);
        for (std::size_t p = 0; p < n; ++p)
          for (std::size_t k = 0; k < model.numel(p) * sizeof(bfloat16); ++k) covered[l.parameter_offset[p] + k] = true;
        std::size_t nonzero_padding = 0;
        for (std::size_t b = 0; b < model.plan().buffers().size(); ++b) {
          const flat_buffer& f = model.plan().buffers()[b];
          for (std::uint64_t k = l.buffer_offset[b]; k < l.buffer_offset[b] + f.numel * dtype_size(f.type); ++k)
            nonzero_padding += !covered[k] && out.base[k] != 0;
        }
        CHECK(nonzero_padding == 0);
      });
    }
}

TEST_CASE("setting parameters releases kept units (int8 gathers); a read refused on one rank is refused on all") {
  // Stage 3, int8 weight gathers, every unit kept after its forward: an evaluation pass before
  // set_parameters_async (or set_parameter_async per parameter) leaves nothing gathered (a kept
  // copy would hold values no gather computes), so a step after it is bitwise a step without
  // the pass.
  local::launch(2, [&](communicator& comm) {
    plan_request q = test_request(3, 1);
    q.reshard_after_forward = reshard_policy::none;
    q.quantization = {quantized_bits::int8, quantized_bits::none, 8};
    sharded_model evaluated(comm, q, adamw_options()), straight(comm, q, adamw_options()),
        per_parameter(comm, q, adamw_options());
    const adoption_layout l = layout_for_adoption(evaluated.plan());
    trainer_memory in(l, 0);
    const auto& pl = evaluated.plan().placements();
    for (std::size_t p = 0; p < pl.size(); ++p)
      for (std::uint64_t j = 0; j < pl[p].numel; ++j) {
        const float v = 0.37f * initial_value(pl[p].storage, j) + 0.011f * static_cast<float>(j % 7);
        std::memcpy(in.base + l.parameter_offset[p] + j * sizeof(float), &v, sizeof v);
      }
    // The same through set_parameter_async, one parameter at a time.
    for (sharded_model* m : {&evaluated, &per_parameter}) {
      set_initial_parameters(*m);
      for (std::size_t u = 0; u < m->unit_count(); ++u) {
        m->pre_forward(u);
        m->post_forward(u);
      }
      CHECK(m->parameter<float>(m->index("l2.w")).size() == 36);  // kept
    }
    set_parameters_async(evaluated, in.base, l.bytes);
    set_parameters_async(straight, in.base, l.bytes);
    for (std::size_t p = 0; p < pl.size(); ++p)
      per_parameter.set_parameter_async(p, reinterpret_cast<const float*>(in.base + l.parameter_offset[p]));
    for (sharded_model* m : {&evaluated, &per_parameter})
      expect([&] { (void)m->parameter<float>(m->index("l2.w")); }, "is not gathered");
    for (sharded_model* m : {&evaluated, &straight, &per_parameter}) constant_gradient_step(*m, 1);
    for (std::size_t p = 0; p < pl.size(); ++p) {
      std::vector<float> a(pl[p].numel), b(pl[p].numel), c(pl[p].numel);
      evaluated.read_parameter(p, a);
      straight.read_parameter(p, b);
      per_parameter.read_parameter(p, c);
      CHECK(a == b);
      CHECK(c == b);
    }
  });
  // Three ranks, rank 1's memory too small: it throws its own error, the others name it, and
  // nobody waits in the all_gather; a read with good memory on every rank works afterwards.
  local::launch(3, [&](communicator& comm) {
    sharded_model model(comm, test_request(3, 1), sharded_model_options{});
    set_initial_parameters(model);
    const adoption_layout l = layout_for_adoption(model.plan());
    trainer_memory out(l, 0xff);
    const std::uint64_t bytes = comm.rank() == 1 ? l.bytes - 1 : l.bytes;
    expect([&] { read_parameters_async(model, out.base, bytes); },
           comm.rank() == 1 ? "the memory has " + std::to_string(l.bytes - 1) + " bytes"
                            : "read_parameters_async: refused on rank 1");
    read_parameters_async(model, out.base, l.bytes);
    model.synchronize();
    for (std::size_t p = 0; p < model.parameter_count(); ++p) {
      std::vector<float> want(model.numel(p));
      model.read_parameter(p, want);
      CHECK(out.values<float>(l, p, want.size()) == want);
    }
  });
}

TEST_CASE("adopt_parameters refuses stage 3, a step in progress, and memory that is null, too small or misaligned") {
  local::launch(2, [&](communicator& comm) {
    sharded_model stage3(comm, test_request(3, 1), sharded_model_options{});
    const adoption_layout l3 = layout_for_adoption(stage3.plan());
    trainer_memory m3(l3, 0);
    expect([&] { adopt_parameters(stage3, m3.base, l3.bytes); }, "adopt_parameters at stage 3");
    expect([&] { adopt_parameters(stage3, m3.base, l3.bytes); }, "set_parameters_async(model, memory, bytes)");
    expect([&] { adopt_parameters(stage3, m3.base, l3.bytes); }, "rank " + std::to_string(comm.rank()));
    // The whole-model copies check the memory as adopt_parameters does, and change nothing.
    expect([&] { set_parameters_async(stage3, nullptr, l3.bytes); }, "set_parameters_async: a null pointer");
    expect([&] { read_parameters_async(stage3, m3.base, l3.bytes - 1); },
           "read_parameters_async: the memory has " + std::to_string(l3.bytes - 1) + " bytes");
    expect([&] { set_parameters_async(stage3, m3.base + 16, l3.bytes); }, "is not aligned to 64 bytes");
    (void)stage3.gradient<float>(stage3.index("l1.w"));
    expect([&] { read_parameters_async(stage3, m3.base, l3.bytes); }, "read_parameters_async in the middle of a step");
    stage3.end_backward();
    stage3.step();

    std::optional<trainer_memory> trainer;  // outlives the model
    sharded_model model(comm, test_request(1, 1), sharded_model_options{});
    set_initial_parameters(model);
    const adoption_layout l = layout_for_adoption(model.plan());
    const trainer_memory& mem = trainer.emplace(l, 0);
    expect([&] { adopt_parameters(model, nullptr, l.bytes); },
           "a null pointer for " + std::to_string(l.bytes) + " bytes");
    expect(
        [&] { adopt_parameters(model, mem.base, l.bytes - 1); },
        "the memory has " + std::to_string(l.bytes - 1) + " bytes, the plan's layout needs " + std::to_string(l.bytes));
    expect([&] { adopt_parameters(model, mem.base + 16, l.bytes); }, "is not aligned to 64 bytes");
    (void)model.gradient<float>(model.index("l1.w"));  // a micro-batch has begun
    expect([&] { adopt_parameters(model, mem.base, l.bytes); }, "adopt_parameters in the middle of a step");
    model.end_backward();
    model.step();
    // Nothing was adopted: the views are still the model's own memory.
    CHECK(reinterpret_cast<unsigned char*>(model.parameter<float>(model.index("l1.w")).data()) !=
          mem.base + l.parameter_offset[model.index("l1.w")]);
    adopt_parameters(model, mem.base, l.bytes, adopted_values::from_model);
    CHECK(reinterpret_cast<unsigned char*>(model.parameter<float>(model.index("l1.w")).data()) ==
          mem.base + l.parameter_offset[model.index("l1.w")]);
    // Adopting the same memory again (or the model's own) would copy it onto itself.
    expect([&] { adopt_parameters(model, mem.base, l.bytes, adopted_values::from_model); },
           "overlaps the model's parameter storage");
  });
}

TEST_CASE("memory in use equals the plan's prediction at every stage") {
  for (int stage = 0; stage <= 6; ++stage) {  // 4, 5: stages 2, 3 accumulating unsharded; 6: 3 keeping frozen
    for (int world : {1, 2, 3}) {
      local::launch(world, [&](communicator& comm) {
        run_config cfg;
        cfg.steps = 2;
        cfg.accumulation = 2;
        cfg.optimizer = test_optimizers()[1];
        plan_request q = test_request(stage > 3 ? std::min(stage - 2, 3) : stage, cfg.accumulation);
        q.accumulate_unsharded = stage == 4 || stage == 5;
        q.keep_frozen_bytes = stage == 6 ? keep_all_frozen : 0;
        q.precision = precision::bfloat16_adam();
        q.precision.gradient = dtype::float32;
        sharded_model_options options;
        options.optimizer = cfg.optimizer;
        // float32 gradients of bfloat16 parameters: the test trainer writes float gradients
        sharded_model model(comm, q, options);
        const auto& plan = model.plan();
        // Everything, the pools included, is allocated by the constructor.
        const memory_breakdown before = model.memory_in_use();
        CHECK(before.communication_buffers == plan.memory().communication_buffers);
        CHECK(before.total() == plan.memory().total());
        for (int step = 0; step < cfg.steps; ++step) constant_gradient_step(model, cfg.accumulation);
        CAPTURE(stage);
        CAPTURE(world);
        const memory_breakdown used = model.memory_in_use();
        const memory_breakdown& planned = plan.memory();
        CHECK(used.parameters == planned.parameters);
        CHECK(used.gradients == planned.gradients);
        CHECK(used.master_weights == planned.master_weights);
        CHECK(used.optimizer_states == planned.optimizer_states);
        CHECK(used.communication_buffers == planned.communication_buffers);
        // Measured where it is allocated: the host path holds exactly the plan plus the step's
        // scalars (written by stream work), and never more at any moment of construction and
        // training; nothing outside host memory.
        const primitive::memory_usage measured = model.memory_allocated(primitive::memory_space::host);
        CHECK(measured.current == planned.total() + sizeof(step_scalars));
        CHECK(measured.peak == planned.total() + sizeof(step_scalars));
        CHECK(measured.allocations > 0);
        // By what asked for it: each category of the plan, and the scalars as scratch.
        const auto asked = [&](memory_category what) {
          return model.memory_allocated(primitive::memory_space::host, what);
        };
        CHECK(asked(memory_category::parameters).current == planned.parameters);
        CHECK(asked(memory_category::gradients).current == planned.gradients);
        CHECK(asked(memory_category::master_weights).current == planned.master_weights);
        CHECK(asked(memory_category::optimizer_states).current == planned.optimizer_states);
        CHECK(asked(memory_category::communication_buffers).current == planned.communication_buffers);
        CHECK(asked(memory_category::communication_buffers).peak == planned.communication_buffers);
        CHECK(asked(memory_category::scratch).current == sizeof(step_scalars));
        CHECK(model.memory_allocated(primitive::memory_space::device).peak == 0);
        CHECK(model.memory_allocated(primitive::memory_space::pinned_host).peak == 0);
      });
    }
  }
}

TEST_CASE("bfloat16 and float16 training with float32 master weights: stages 1-3 follow stage 0") {
  for (dtype t : {dtype::bfloat16, dtype::float16}) {
    std::vector<std::vector<std::vector<float>>> by_stage(4);
    for (int stage = 0; stage <= 3; ++stage) {
      std::vector<std::vector<float>> result;
      std::mutex lock;
      local::launch(2, [&](communicator& comm) {
        plan_request q = test_request(stage, 2);
        q.precision = t == dtype::bfloat16 ? precision::bfloat16_adam() : precision::mixed_adam();
        q.precision.gradient = dtype::float32;
        sharded_model_options options;
        options.optimizer = test_optimizers()[2];
        sharded_model model(comm, q, options);
        const auto& plan = model.plan();
        for (std::size_t p = 0; p < plan.parameters().size(); ++p) {
          std::vector<float> v(plan.placements()[p].numel);
          for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial_value(plan.placements()[p].storage, j);
          model.set_parameter(p, v);
        }
        for (int step = 0; step < 5; ++step) {
          for (int micro = 0; micro < 2; ++micro) {
            for (std::size_t u = model.unit_count(); u-- > 0;) {
              model.pre_backward(u);
              for (std::size_t p : plan.units()[u].members) {
                if (!plan.parameters()[p].trainable || plan.placements()[p].numel == 0) continue;
                auto g = model.gradient<float>(p);
                if (t == dtype::bfloat16) {
                  auto w = model.parameter<bfloat16>(p);
                  for (std::size_t j = 0; j < g.size(); ++j)
                    g[j] += gradient_term(comm.rank(), micro, step, plan.placements()[p].storage, j, 0, w[j], 0, false);
                } else {
                  auto w = model.parameter<float16>(p);
                  for (std::size_t j = 0; j < g.size(); ++j)
                    g[j] += gradient_term(comm.rank(), micro, step, plan.placements()[p].storage, j, 0, w[j], 0, false);
                }
              }
              model.post_backward(u);
            }
            model.end_backward();
          }
          model.step();
        }
        std::vector<std::vector<float>> out(plan.parameters().size());
        for (std::size_t p = 0; p < out.size(); ++p) {
          out[p].resize(plan.placements()[p].numel);
          model.read_parameter(p, out[p]);
        }
        // the training parameters are the rounded master weights
        if (stage >= 1) {
          const std::size_t l1 = model.index("l1.w");
          const flat_buffer& f = plan.buffers()[plan.placements()[l1].buffer];
          CHECK(f.has_master);
        }
        std::lock_guard<std::mutex> g(lock);
        if (comm.rank() == 0) result = std::move(out);
      });
      by_stage[static_cast<std::size_t>(stage)] = std::move(result);
    }
    for (int stage = 1; stage <= 3; ++stage) {
      CAPTURE(stage);
      CAPTURE(dtype_name(t));
      // 16-bit rounding of parameters differs only where the gradient averages rounded differently
      CHECK(max_relative_error(by_stage[static_cast<std::size_t>(stage)], by_stage[0]) <= 2e-2);
    }
  }
}

TEST_CASE("hybrid sharding: 2 replica groups of 2 ranks match plain data parallelism over 4") {
  // Rank r: shard group r / 2 (ranks {0,1} and {2,3}), replica group r % 2 (ranks {0,2}, {1,3}).
  for (int stage = 0; stage <= 3; ++stage) {
    local::world all(4), shard0(2), shard1(2), replica0(2), replica1(2);
    std::vector<double> errors(4, 1.0);
    std::vector<std::exception_ptr> failures(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        try {
          local::communicator world_comm(all, r);
          local::communicator shard_comm(r / 2 == 0 ? shard0 : shard1, r % 2);
          local::communicator replica_comm(r % 2 == 0 ? replica0 : replica1, r / 2);
          for (communicator* c : {static_cast<communicator*>(&world_comm), static_cast<communicator*>(&shard_comm),
                                  static_cast<communicator*>(&replica_comm)})
            c->set_timeout(std::chrono::seconds(60));
          run_config cfg;
          cfg.optimizer = test_optimizers()[1];
          cfg.accumulation = 2;
          cfg.max_grad_norm = 0.5;
          plan_request q = test_request(stage, cfg.accumulation);
          sharded_model_options options;
          options.optimizer = cfg.optimizer;
          options.max_grad_norm = cfg.max_grad_norm;
          sharded_model model(shard_comm, q, options, &replica_comm);
          CHECK(model.plan().world_size() == 4);
          if (stage > 0) CHECK(model.plan().shards() == 2);
          const auto mine = train_sharded(model, r, cfg);
          const auto reference = train_reference(world_comm, test_parameters(), cfg);
          errors[static_cast<std::size_t>(r)] = max_relative_error(mine, reference);
        } catch (...) {
          failures[static_cast<std::size_t>(r)] = std::current_exception();
          for (auto* w : {&all, &shard0, &shard1, &replica0, &replica1}) w->abort("rank failed");
        }
      });
    }
    for (auto& t : threads) t.join();
    CAPTURE(stage);
    for (auto& f : failures)
      if (f) FAIL(message_of(f));
    for (double e : errors) CHECK(e <= 1e-5);
  }
}

TEST_CASE("a trainer whose registered parameters do not match the plan is refused on every rank") {
  auto refused = [](int world, auto&& body) {
    std::vector<std::string> messages(static_cast<std::size_t>(world));
    local::launch(world, [&](communicator& comm) {
      try {
        body(comm);
        messages[static_cast<std::size_t>(comm.rank())] = "no error";
      } catch (const error& e) {
        CHECK(e.kind() == errc::invalid_argument);
        messages[static_cast<std::size_t>(comm.rank())] = e.what();
      }
    });
    return messages;
  };
  const shard_plan plan = [] {
    plan_request q = test_request(3, 1);
    q.world_size = 2;
    return shard_plan(q);
  }();

  SUBCASE("a different shape on one rank") {
    const auto m = refused(2, [&](communicator& comm) {
      auto registered = test_parameters();
      if (comm.rank() == 1) registered[4].shape = {4, 9};
      sharded_model model(comm, plan, registered);
    });
    CHECK(m[1].find("parameter 4: the plan has 'l2.w' with shape [9, 4] but the trainer registered shape [4, 9]") !=
          std::string::npos);
    CHECK(m[1].find("rank 1") != std::string::npos);
    CHECK(m[0].find("rank 1 refused the plan (see that rank's error); no rank starts") != std::string::npos);
  }
  SUBCASE("a missing parameter, a renamed one, a frozen flag, a dtype") {
    auto registered = test_parameters();
    registered.pop_back();
    auto m = refused(2, [&](communicator& comm) { sharded_model model(comm, plan, registered); });
    CHECK(m[0].find("the plan has 10 parameters but the trainer registered 9") != std::string::npos);
    registered = test_parameters();
    registered[2].name = "l1.bias";
    m = refused(2, [&](communicator& comm) { sharded_model model(comm, plan, registered); });
    CHECK(m[1].find("parameter 2: the plan has 'l1.b' but the trainer registered 'l1.bias'") != std::string::npos);
    registered = test_parameters();
    registered[3].trainable = true;
    m = refused(2, [&](communicator& comm) { sharded_model model(comm, plan, registered); });
    CHECK(m[0].find("'frozen.w' frozen but the trainer registered it trainable") != std::string::npos);
    registered = test_parameters();
    registered[1].type = dtype::bfloat16;
    m = refused(2, [&](communicator& comm) { sharded_model model(comm, plan, registered); });
    CHECK(m[0].find("'l1.w' as float32 but the trainer registered bfloat16") != std::string::npos);
  }
  SUBCASE("a plan for another world size") {
    const auto m = refused(3, [&](communicator& comm) { sharded_model model(comm, plan, test_parameters()); });
    for (const auto& s : m) CHECK(s.find("the plan is for 2 ranks but the communicators have 3") != std::string::npos);
  }
  SUBCASE("ranks holding different plans") {
    const auto m = refused(2, [&](communicator& comm) {
      plan_request q = test_request(3, 1);
      q.world_size = 2;
      q.alignment_bytes = comm.rank() == 0 ? 16 : 64;
      const shard_plan mine(q);
      sharded_model model(comm, mine, test_parameters());
    });
    for (const auto& s : m)
      CHECK(s.find("the ranks differ in alignment_bytes: rank 0: 16; rank 1: 64") != std::string::npos);
  }
  SUBCASE("an optimizer the plan did not count") {
    const auto m = refused(2, [&](communicator& comm) {
      sharded_model_options options;
      options.optimizer.kind = optimizer_kind::sgd;
      options.optimizer.momentum = 0.9;
      sharded_model model(comm, plan, test_parameters(), options);
    });
    CHECK(m[0].find("the plan counts 2 optimizer state(s) per element but sgd with momentum keeps 1") !=
          std::string::npos);
  }
  SUBCASE("16-bit parameters without master weights") {
    const auto m = refused(2, [&](communicator& comm) {
      plan_request q = test_request(1, 1);
      q.precision.parameter = dtype::bfloat16;
      sharded_model model(comm, q);
    });
    CHECK(m[0].find("bfloat16 parameters need float32 master weights") != std::string::npos);
  }
}

TEST_CASE("misuse of the runtime gets clear errors") {
  local::launch(2, [](communicator& comm) {
    plan_request q = test_request(3, 2);
    sharded_model model(comm, q);
    const std::size_t l1 = model.index("l1.w"), frozen = model.index("frozen.w");
    expect([&] { (void)model.index("nope"); }, "no parameter is named 'nope'");
    expect([&] { (void)model.parameter<float>(l1); }, "parameter 'l1.w' is not gathered");
    expect([&] { (void)model.parameter<double>(l1); }, "parameter of 'l1.w' is float32, requested as float64");
    expect([&] { (void)model.gradient<float>(frozen); }, "parameter 'frozen.w' is frozen: it has no gradient");
    expect([&] { model.post_forward(1); }, "post_forward(1) without a matching pre_forward(1)");
    expect([&] { model.pre_forward(9); }, "unit 9 is outside [0, 4)");
    expect([&] { model.step(); }, "step() after 0 micro-batch(es), but the plan accumulates 2");
    model.mark_ready(l1);
    expect([&] { model.mark_ready(l1); }, "was already marked ready in this micro-batch");
    const std::size_t embed = model.index("embed"), head = model.index("head");
    model.mark_ready(head);
    expect([&] { model.mark_ready(embed); }, "the gradient of its storage ('embed') was already marked ready");
    std::vector<float> wrong(3);
    expect([&] { model.set_parameter(l1, wrong); }, "set_parameter('l1.w'): got 3 values for 45 elements");
    model.end_backward();
    model.end_backward();
    expect([&] { model.end_backward(); }, "end_backward() called 3 times before step()");
    model.step();
  });
}

TEST_CASE("a non-finite gradient skips the step on every rank and leaves the parameters alone") {
  local::launch(2, [](communicator& comm) {
    plan_request q = test_request(2, 1);
    sharded_model model(comm, q);
    std::vector<float> ones(45, 1.0f);
    const std::size_t l1 = model.index("l1.w");
    model.set_parameter(l1, ones);
    if (comm.rank() == 1) model.gradient<float>(l1)[3] = std::numeric_limits<float>::infinity();
    const step_result r = model.step();
    CHECK(r.skipped);
    CHECK(r.steps == 0);
    std::vector<float> now(45);
    model.read_parameter(l1, now);
    CHECK(now == ones);
  });
}

TEST_CASE("stage 3: no view shows parameters from before step(), whatever was gathered after end_backward") {
  local::launch(2, [](communicator& comm) {
    plan_request q = test_request(3, 1);
    sharded_model_options options;
    options.optimizer.kind = optimizer_kind::sgd;
    options.optimizer.lr = 0.5;
    q.precision.optimizer_states = 0;
    sharded_model model(comm, q, options);
    const std::size_t l2 = model.index("l2.w");  // unit u2
    std::vector<float> ones(36, 1.0f);
    model.set_parameter(l2, ones);
    for (std::size_t u = 0; u < model.unit_count(); ++u) {
      model.pre_forward(u);
      model.post_forward(u);
    }
    for (std::size_t u = model.unit_count(); u-- > 0;) {
      model.pre_backward(u);
      if (u == model.unit_of(l2))
        for (float& g : model.gradient<float>(l2)) g += 1.0f;  // every rank: the average is 1
      model.post_backward(u);
    }
    model.end_backward();
    // An evaluation pass between end_backward() and step(): pre_forward(1) prefetches unit 2.
    model.pre_forward(1);
    model.post_forward(1);
    model.step();  // l2.w = 1 - 0.5 * 1 = 0.5
    model.pre_forward(model.unit_of(l2));
    const auto view = model.parameter<float>(l2);
    CHECK(std::vector<float>(view.begin(), view.end()) == std::vector<float>(36, 0.5f));
    model.post_forward(model.unit_of(l2));
    std::vector<float> read(36);
    model.read_parameter(l2, read);
    CHECK(read == std::vector<float>(36, 0.5f));
  });
  // step() while a unit is in use (a pre_* hook without its post_*) is refused on the rank,
  // after end_backward() or when step() would end the micro-batch itself.
  for (bool ended : {true, false}) {
    const auto out = outcomes(2, [&](communicator& comm) {
      plan_request q = test_request(3, 1);
      sharded_model model(comm, q);
      if (ended) {
        model.end_backward();
        model.pre_forward(2);
      } else {
        model.pre_backward(2);
      }
      model.step();
    });
    for (const auto& [kind, what] : out) {
      INFO(what);
      CHECK(kind == errc::invalid_argument);
      CHECK(
          has(what, "step() while unit 'u2' (2) is gathered by a pre_forward / pre_backward without its post_forward"));
    }
  }
}

TEST_CASE("stage 3: units kept after their forward serve their backward; other passes stay within the plan") {
  for (reshard_policy policy : {reshard_policy::except_last, reshard_policy::none}) {
    CAPTURE(reshard_policy_name(policy));
    local::launch(2, [&](communicator& comm) {
      plan_request q = test_request(3, 1);
      q.reshard_after_forward = policy;
      sharded_model_options options;
      options.optimizer.kind = optimizer_kind::sgd;
      options.optimizer.lr = 0.5;
      q.precision.optimizer_states = 0;
      sharded_model model(comm, q, options);
      const std::size_t l3 = model.index("l3.w"), l2 = model.index("l2.w");  // units u3 (the last), u2
      const std::size_t units = model.unit_count();
      auto forward = [&] {
        for (std::size_t u = 0; u < units; ++u) {
          model.pre_forward(u);
          model.post_forward(u);
        }
      };
      // Two evaluation passes (forwards only): each keeps the last unit (and, under none, every
      // unit); the second releases what the first kept before gathering again.
      forward();
      forward();
      CHECK(model.between_steps());  // kept units do not hold a step open: checkpoints may run
      CHECK(model.parameter<float>(l3).size() == 13);
      if (policy == reshard_policy::none)
        CHECK(model.parameter<float>(l2).size() == 36);
      else
        expect([&] { (void)model.parameter<float>(l2); }, "parameter 'l2.w' is not gathered");
      // set_parameter reaches the kept copy too: no view serves the old values.
      model.set_parameter(l3, std::vector<float>(13, 2.0f));
      const auto kept = model.parameter<float>(l3);
      CHECK(std::vector<float>(kept.begin(), kept.end()) == std::vector<float>(13, 2.0f));
      // A kept unit has no open pre_* hook: its post_* hooks are misuse, named as such.
      expect([&] { model.post_forward(3); }, "post_forward(3) without a matching pre_forward(3)");
      expect([&] { model.post_backward(3); }, "post_backward(3) without a matching pre_backward(3)");
      // Training: a nested use (two pre_forward of u1) keeps only at its last post_forward.
      auto backward = [&](std::size_t recompute) {
        for (std::size_t u = units; u-- > 0;) {
          model.pre_backward(u);
          if (u == recompute) {  // a recomputed forward inside u's backward releases nothing early
            model.pre_forward(u);
            model.post_forward(u);
          }
          if (u == model.unit_of(l3))
            for (float& g : model.gradient<float>(l3)) g += 1.0f;  // every rank: the average is 1
          model.post_backward(u);
        }
        model.end_backward();
      };
      for (std::size_t u = 0; u < units; ++u) {
        model.pre_forward(u);
        if (u == 1) {
          model.pre_forward(1);
          model.post_forward(1);
        }
        model.post_forward(u);
      }
      backward(units);
      forward();     // an evaluation after end_backward: kept units hold values from before the update
      model.step();  // l3.w = 2 - 0.5 * 1 = 1.5; step() released them
      model.pre_forward(3);
      const auto view = model.parameter<float>(l3);
      CHECK(std::vector<float>(view.begin(), view.end()) == std::vector<float>(13, 1.5f));
      model.post_forward(3);
      // A pass stopped early (its prefetch of u2 never used), then training with a forward
      // recomputed inside u2's backward (it prefetches nothing).
      for (std::size_t u = 0; u < 2; ++u) {
        model.pre_forward(u);
        model.post_forward(u);
      }
      forward();
      backward(2);
      model.step();
      // Evaluations whole and stopped early, nested uses, recomputation and training in any
      // order: the runtime never held more than the plan.
      const primitive::memory_usage measured = model.memory_allocated(primitive::memory_space::host);
      CHECK(measured.peak == model.plan().memory().total() + sizeof(step_scalars));
      // A use left open is still refused by step(), kept or not.
      model.pre_forward(1);
      model.pre_forward(1);
      model.post_forward(1);
      expect([&] { model.step(); }, "step() while unit 'u1' (1) is gathered by a pre_forward / pre_backward");
    });
  }
}

TEST_CASE("stage 3: a forward pass stopped early leaves nothing the next pass pays for (every policy)") {
  for (reshard_policy policy : {reshard_policy::all, reshard_policy::except_last, reshard_policy::none}) {
    CAPTURE(reshard_policy_name(policy));
    local::launch(2, [&](communicator& comm) {
      plan_request q;  // six untied units of 8 floats: the plan holds 2 gather buffers (6 under none)
      for (int u = 0; u < 6; ++u)
        q.parameters.push_back(make_spec("w" + std::to_string(u), {8}, "u" + std::to_string(u)));
      q.stage = 3;
      q.reshard_after_forward = policy;
      sharded_model model(comm, q);
      for (std::size_t stop : {3u, 1u, 5u, 2u, 6u, 4u, 1u}) {  // passes over units [0, stop): prefetches left unused
        for (std::size_t u = 0; u < stop; ++u) {
          model.pre_forward(u);
          model.post_forward(u);
        }
      }
      const primitive::memory_usage measured = model.memory_allocated(primitive::memory_space::host);
      CHECK(measured.peak == model.plan().memory().total() + sizeof(step_scalars));
    });
  }
}

namespace {

/// A stage-3 plan of `ps` without prefetching: each pre_forward gathers its own unit at once.
plan_request stage3_without_prefetch(const std::vector<parameter_spec>& ps) {
  plan_request q;
  q.parameters = ps;
  q.stage = 3;
  q.prefetch = false;
  return q;
}

}  // namespace

TEST_CASE("stage 3: ranks gathering same-sized units in different orders fail on every rank instead of mixing them") {
  // Two units of equal shape: the all_gathers look alike but for their tags.
  std::vector<parameter_spec> ps = {make_spec("a", {6}, "ua"), make_spec("b", {6}, "ub")};
  const auto out = outcomes(2, [&](communicator& comm) {
    sharded_model model(comm, stage3_without_prefetch(ps));
    const std::size_t first = comm.rank() == 0 ? 0 : 1;
    model.pre_forward(first);
    model.post_forward(first);
    model.pre_forward(1 - first);
    model.post_forward(1 - first);
  });
  for (const auto& [kind, what] : out) {
    INFO(what);
    CHECK(kind == errc::contract_mismatch);
    CHECK(has(what,
              "tag mismatch (the ranks issued different calls of the same shape): rank 0: all_gather of unit "
              "'ua' (buffer 0: a); rank 1: all_gather of unit 'ub' (buffer 1: b)"));
  }
}

TEST_CASE("stage 3: a rank that runs a unit's forward twice (H23) gets an error naming the units, on every rank") {
  // Units of different sizes: the calls differ in count, and the error names each rank's unit.
  std::vector<parameter_spec> ps = {make_spec("h.0.w", {6}, "h.0"),  make_spec("h.0.b", {2}, "h.0"),
                                    make_spec("h.1.w", {10}, "h.1"), make_spec("h.1.b", {2}, "h.1"),
                                    make_spec("h.1.g", {2}, "h.1"),  make_spec("h.1.s", {2}, "h.1")};
  const auto out = outcomes(2, [&](communicator& comm) {
    sharded_model model(comm, stage3_without_prefetch(ps));
    model.pre_forward(0);
    model.post_forward(0);
    if (comm.rank() == 1) {  // the forward of h.0 again
      model.pre_forward(0);
      model.post_forward(0);
    }
    model.pre_forward(1);
    model.post_forward(1);
  });
  for (const auto& [kind, what] : out) {
    INFO(what);
    CHECK(kind == errc::contract_mismatch);
    CHECK(has(what, "count mismatch"));
    CHECK(has(what,
              "(the calls: rank 0: all_gather of unit 'h.1' (buffer 1: h.1.w, h.1.b, h.1.g, ... (4 "
              "parameters)); rank 1: all_gather of unit 'h.0' (buffer 0: h.0.w, h.0.b))"));
  }
}

TEST_CASE("ranks whose options differ are refused on every rank, naming the option and each rank's value") {
  auto with = [](auto&& change) {
    return outcomes(2, [&](communicator& comm) {
      plan_request q = test_request(1, 1);
      sharded_model_options options;
      change(comm.rank(), q, options);
      sharded_model model(comm, q, options);
    });
  };
  auto every_rank_says = [](const auto& out, const std::string& text) {
    for (const auto& [kind, what] : out) {
      INFO(what);
      CHECK(kind == errc::invalid_argument);
      CHECK(has(what, text));
    }
  };
  every_rank_says(with([](int r, plan_request&, sharded_model_options& o) { o.optimizer.lr = r == 0 ? 0.5 : 0.25; }),
                  "the ranks differ in learning rate: rank 0: 0.5; rank 1: 0.25");
  every_rank_says(with([](int r, plan_request&, sharded_model_options& o) {
                    o.optimizer.kind = r == 0 ? optimizer_kind::adam : optimizer_kind::adamw;
                  }),
                  "the ranks differ in optimizer: rank 0: adam; rank 1: adamw");
  every_rank_says(with([](int r, plan_request&, sharded_model_options& o) { o.max_grad_norm = r == 0 ? 1.0 : 0.0; }),
                  "the ranks differ in max_grad_norm: rank 0: 1; rank 1: 0");
  every_rank_says(with([](int r, plan_request&, sharded_model_options& o) { o.skip_nonfinite_steps = r == 0; }),
                  "the ranks differ in skip_nonfinite_steps: rank 0: true; rank 1: false");
  every_rank_says(with([](int r, plan_request& q, sharded_model_options&) { q.stage = r == 0 ? 1 : 2; }),
                  "the ranks differ in stage: rank 0: 1; rank 1: 2");
  every_rank_says(with([](int r, plan_request& q, sharded_model_options&) {
                    q.reshard_after_forward = r == 0 ? reshard_policy::except_last : reshard_policy::none;
                  }),
                  "the ranks differ in reshard_after_forward: rank 0: except_last; rank 1: none");
  every_rank_says(with([](int r, plan_request& q, sharded_model_options&) {
                    q.stage = 2;
                    q.accumulate_unsharded = r == 1;
                  }),
                  "the ranks differ in accumulate_unsharded: rank 0: false; rank 1: true");
  every_rank_says(with([](int r, plan_request& q, sharded_model_options&) {
                    q.stage = 3;
                    q.keep_frozen_bytes = r == 1 ? 64 : 0;
                  }),
                  "the ranks differ in keep_frozen_bytes: rank 0: 0; rank 1: 64");
  every_rank_says(with([](int r, plan_request& q, sharded_model_options&) {
                    q.stage = 3;
                    if (r == 0) q.prefetch_lists = {{"u1", std::vector<std::string>{"u3"}, std::nullopt}};
                  }),
                  "the ranks differ in prefetch_lists (hash)");
  every_rank_says(with([](int r, plan_request& q, sharded_model_options&) {
                    q.stage = 3;
                    q.max_inflight_gathers = r == 0 ? 2 : 3;
                  }),
                  "the ranks differ in max_inflight_gathers: rank 0: 2; rank 1: 3");
  // A parameter list of the same length that differs in one parameter: the first one named.
  every_rank_says(with([](int r, plan_request& q, sharded_model_options&) {
                    if (r == 1) q.parameters[2].shape = {3, 3};
                  }),
                  "first at parameter 2, here 'l1.b'");
  // Options a kind does not use may differ (Adam ignores SGD's momentum; accumulate_unsharded
  // has no effect at stage 1), and -0 is 0.
  const auto fine = with([](int r, plan_request& q, sharded_model_options& o) {
    q.accumulate_unsharded = r == 1;
    o.optimizer.momentum = r;
    o.optimizer.weight_decay = r == 0 ? 0.0 : -0.0;
  });
  for (const auto& [kind, what] : fine) CHECK(what == "no error");
}

TEST_CASE("a request the planner refuses on one rank is refused on every rank at once") {
  const auto start = std::chrono::steady_clock::now();
  const auto out = outcomes(3, [](communicator& comm) {
    comm.set_timeout(std::chrono::seconds(60));
    plan_request q = test_request(2, 1);
    if (comm.rank() == 1) q.alignment_bytes = 3;
    sharded_model model(comm, q);
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));  // not the timeout
  INFO(out[1].second);
  CHECK(has(out[1].second, "the planner refused the request"));
  CHECK(has(out[1].second, "[local rank 1/3]"));
  for (int r : {0, 2}) {
    INFO(out[static_cast<std::size_t>(r)].second);
    CHECK(out[static_cast<std::size_t>(r)].first == errc::invalid_argument);
    CHECK(has(out[static_cast<std::size_t>(r)].second,
              "rank 1 refused the plan (see that rank's error); no rank starts"));
  }
}

TEST_CASE("set_learning_rate's refusal names the rank") {
  const auto out = outcomes(2, [](communicator& comm) {
    sharded_model model(comm, test_request(1, 1));
    model.set_learning_rate(-1.0);
  });
  for (int r = 0; r < 2; ++r) {
    INFO(out[static_cast<std::size_t>(r)].second);
    CHECK(out[static_cast<std::size_t>(r)].first == errc::invalid_argument);
    CHECK(has(out[static_cast<std::size_t>(r)].second, "[local rank " + std::to_string(r) + "/2]"));
    CHECK(has(out[static_cast<std::size_t>(r)].second,
              "zero::sharded_model: set_learning_rate: learning rate must be finite"));
  }
}

TEST_CASE("hybrid sharding: a difference inside one shard group is refused on every rank of every group") {
  // Shard groups {0,1} and {2,3}, replica groups {0,2} and {1,3}; rank 3's learning rate differs.
  // No rank aborts the worlds on failure here: a rank left waiting would time out (20 s).
  local::world shard0(2), shard1(2), replica0(2), replica1(2);
  std::vector<std::pair<std::optional<errc>, std::string>> out(4, {std::nullopt, "no error"});
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      try {
        local::communicator shard_comm(r / 2 == 0 ? shard0 : shard1, r % 2);
        local::communicator replica_comm(r % 2 == 0 ? replica0 : replica1, r / 2);
        shard_comm.set_timeout(std::chrono::seconds(20));
        replica_comm.set_timeout(std::chrono::seconds(20));
        sharded_model_options options;
        options.optimizer.lr = r == 3 ? 0.25 : 0.5;
        sharded_model model(shard_comm, test_request(2, 1), options, &replica_comm);
      } catch (const error& e) { out[static_cast<std::size_t>(r)] = {e.kind(), e.what()}; }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  for (int r = 0; r < 4; ++r) {
    const auto& [kind, what] = out[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << what);
    CHECK(kind == errc::invalid_argument);
    // The shard communicator names only the shard rank; the message names the job's.
    CHECK(has(what, "global rank " + std::to_string(r) + " (rank " + std::to_string(r % 2) + " of replica group " +
                        std::to_string(r / 2) + "): "));
    if (r >= 2)
      CHECK(has(what, "the ranks differ in learning rate: rank 0: 0.5; rank 1: 0.25"));
    else
      CHECK(has(what, "across replica groups: the shard group of replica-communicator rank 1 cannot start"));
  }
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // their allocators abort on such sizes
TEST_CASE("a model state no rank can allocate fails on every rank at construction, naming the bytes") {
  const auto out = outcomes(2, [](communicator& comm) {
    plan_request q;
    q.parameters = {make_spec("huge", {std::uint64_t{1} << 40}, "u0")};  // 4 TiB of float32 on every rank
    q.stage = 0;
    sharded_model model(comm, q);
  });
  for (const auto& [kind, what] : out) {
    INFO(what);
    CHECK(kind == errc::internal);
    CHECK(has(what, "zero::sharded_model: zero: cannot allocate 4398046511104 bytes"));
  }
}
#endif

TEST_CASE("learning rates set differently on different ranks are refused at the next step, before any update") {
  for (int stage : {0, 3}) {
    CAPTURE(stage);
    std::vector<std::vector<float>> after(2);
    const auto out = outcomes(2, [&](communicator& comm) {
      sharded_model_options options;
      options.optimizer.kind = optimizer_kind::sgd;
      options.optimizer.lr = 0.5;
      plan_request q = test_request(stage, 1);
      q.precision.optimizer_states = 0;
      sharded_model model(comm, q, options);
      const std::size_t l2 = model.index("l2.w");
      model.set_parameter(l2, std::vector<float>(36, 1.0f));
      model.step();  // same rates: fine
      model.set_learning_rate(comm.rank() == 0 ? 0.25 : 0.125);
      if (stage == 0)
        for (float& g : model.gradient<float>(l2)) g += 1.0f;  // an update would move l2.w
      try {
        model.step();
      } catch (const error&) {
        after[static_cast<std::size_t>(comm.rank())].resize(36);
        model.read_parameter(l2, after[static_cast<std::size_t>(comm.rank())]);
        throw;
      }
    });
    for (std::size_t r = 0; r < 2; ++r) {
      INFO(out[r].second);
      CHECK(out[r].first == errc::invalid_argument);
      CHECK(has(out[r].second, "the ranks hold different learning rates at step 2: rank 0: 0.25; rank 1: 0.125"));
      CHECK(after[r] == std::vector<float>(36, 1.0f));  // nothing updated
    }
  }
}

TEST_CASE("the trainer's own collectives on the shard communicator run in issue order with the runtime's") {
  // The runtime's collectives run on the communicator's progress thread (its communication
  // stream); a trainer that all_reduces on the same communicator between hooks, while gathers
  // (stage 3, prefetch) or reductions (stages 0-2, mark_ready) are still queued there, is queued
  // behind them: every call sees the same sequence number on every rank, and the training
  // result is the plain run's, bit for bit.
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    run_config cfg;
    cfg.steps = 2;
    cfg.accumulation = 2;
    cfg.optimizer = test_optimizers()[0];
    cfg.mark_ready = true;
    std::vector<std::vector<std::vector<float>>> plain(3), interleaved(3);
    std::vector<int> wrong(3, 0);
    local::launch(3, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      plan_request q = test_request(stage, cfg.accumulation);
      q.precision.optimizer_states = cfg.optimizer.state_count();
      q.prefetch = true;
      sharded_model_options options;
      options.optimizer = cfg.optimizer;
      {
        sharded_model model(comm, q, options);
        plain[r] = train_sharded(model, comm.rank(), cfg);
      }
      sharded_model model(comm, q, options);
      int calls = 0;
      run_config mine = cfg;
      mine.between_hooks = [&] {  // after the hooks of train_sharded
        std::int64_t x = comm.rank() + 1 + calls++;
        all_reduce(comm, &x, &x, 1, dtype::int64, reduce_kind::sum);
        if (x != 6 + 3 * (calls - 1)) ++wrong[r];
      };
      interleaved[r] = train_sharded(model, comm.rank(), mine);
      CHECK(calls > 20);
    });
    for (std::size_t r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(wrong[r] == 0);
      CHECK(bitwise_equal(interleaved[r], plain[r]));
    }
  }
}

TEST_CASE("gradient buckets grown beyond the plan keep what the trainer wrote (stages 2-3)") {
  // A trainer that holds the gradient views of every unit at once needs more buckets than the
  // plan's pool; a new bucket is zeroed on the communication stream, and the trainer's writes
  // must come after that zeroing. Every stream task is delayed 2 ms so that a missing wait loses
  // the gradients every time.
  ::setenv("RINGZERO_HOST_STREAM_DELAY_US", "2000", 1);
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    std::vector<double> norms(2, 0.0);
    std::vector<std::uint64_t> buckets(2, 0), planned(2, 0);
    local::launch(2, [&](communicator& comm) {
      plan_request q;
      for (const char* u : {"u0", "u1", "u2"}) q.parameters.push_back(make_spec(std::string("w.") + u, {64}, u));
      q.stage = stage;
      q.alignment_bytes = 16;
      sharded_model_options o;
      o.optimizer.kind = optimizer_kind::sgd;
      o.optimizer.lr = 0.01;
      q.precision.optimizer_states = o.optimizer.state_count();
      sharded_model model(comm, q, o);
      const auto r = static_cast<std::size_t>(comm.rank());
      std::vector<std::span<float>> views;
      for (std::size_t p = 0; p < 3; ++p) views.push_back(model.gradient<float>(p));  // all at once: the pool grows
      planned[r] = model.plan().communication().gradient_buckets;
      buckets[r] = (model.memory_in_use().communication_buffers -
                    model.plan().communication().gather_buffers * model.plan().communication().gather_buffer_bytes) /
                   model.plan().communication().gradient_bucket_bytes;
      for (auto v : views)
        for (float& x : v) x = comm.rank() == 0 ? 1.0f : 3.0f;  // averaged: 2 everywhere
      for (std::size_t u = 3; u-- > 0;) {
        model.pre_backward(u);
        model.post_backward(u);
      }
      model.end_backward();
      norms[r] = model.step().gradient_norm;
    });
    for (std::size_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(buckets[r] > planned[r]);             // the pool did grow
      CHECK(norms[r] == std::sqrt(192.0 * 4.0));  // 192 elements of 2: nothing lost
    }
  }
  ::unsetenv("RINGZERO_HOST_STREAM_DELAY_US");
}

TEST_CASE("the bytes a step sends equal the plan's traffic (ring), plus the step's two scalar collectives") {
  // Measured with communicator::traffic() around one step (after a first one), summed over the
  // ranks: every all_reduce, reduce_scatter and all_gather the plan lists (ring: volume (n-1)/n
  // per rank), plus per rank the step's agreement record (an all_gather of three uint64) and, at
  // stages 1-3, the global norm's all_reduce of one float64.
  // accumulate_unsharded (stages 2-3): one reduce_scatter per step, as with one micro-batch.
  // Stage 3 with 2 micro-batches keeps the frozen parameters gathered on 2 and 4 ranks: nothing
  // of them is sent, and the plan's gathers are smaller by exactly their bytes.
  for (int stage = 0; stage <= 3; ++stage)
    for (int world : {2, 3, 4})
      for (int accumulation : {1, 2, 4}) {
        const bool unsharded = accumulation == 4;
        if (unsharded && (stage < 2 || world == 3)) continue;
        const bool keep = stage == 3 && accumulation == 2 && world != 3;
        CAPTURE(keep);
        CAPTURE(stage);
        CAPTURE(world);
        CAPTURE(accumulation);
        std::vector<traffic_counts> seen(static_cast<std::size_t>(world));
        std::vector<traffic_entry> planned;
        plan_request q = test_request(stage, accumulation);
        q.accumulate_unsharded = unsharded;
        q.keep_frozen_bytes = keep ? keep_all_frozen : 0;
        if (keep) {  // every gather without the frozen matrix
          plan_request plain_request = test_request(3, accumulation), kept_request = q;
          plain_request.world_size = kept_request.world_size = world;
          const shard_plan plain(plain_request), kept(kept_request);
          std::uint64_t frozen_bytes = 0;
          for (const flat_buffer& f : kept.buffers())
            if (f.replicated) frozen_bytes += f.numel * 4;
          CHECK(frozen_bytes == 64);  // 9 floats padded to 16
          for (std::size_t i = 0; i < plain.traffic().size(); ++i) {
            const traffic_entry &a = plain.traffic()[i], &b = kept.traffic()[i];
            if (a.collective != collective_kind::all_gather) {
              CHECK(a.bytes == b.bytes);
              continue;
            }
            // u1 is gathered once before forward and once before backward per micro-batch
            CHECK(a.bytes - b.bytes == frozen_bytes * accumulation);
          }
        }
        if (unsharded) {  // the gradient reduction's traffic: one micro-batch's
          const shard_plan once(test_request(stage, 1)), accumulated(q);
          for (std::size_t i = 0; i < once.traffic().size(); ++i)
            if (once.traffic()[i].purpose == "gradients")
              CHECK(accumulated.traffic()[i].bytes == once.traffic()[i].bytes);
          CHECK(accumulated.memory().gradients == shard_plan(test_request(1, 4)).memory().gradients);
          CHECK(accumulated.communication().gradient_buckets == 0);
        }
        local::launch(world, [&](communicator& comm) {
          comm.set_forced_algorithm(algorithm::ring);
          sharded_model model(comm, q, sharded_model_options{});
          if (comm.rank() == 0) planned = model.plan().traffic();
          constant_gradient_step(model, accumulation);  // the first step (buffers, first gathers)
          const traffic_counts before = comm.traffic();
          constant_gradient_step(model, accumulation);
          seen[static_cast<std::size_t>(comm.rank())] = comm.traffic() - before;
        });
        const auto n = static_cast<std::uint64_t>(world);
        for (collective_kind k :
             {collective_kind::all_reduce, collective_kind::reduce_scatter, collective_kind::all_gather}) {
          CAPTURE(collective_name(k));
          std::uint64_t sent = 0, received = 0, calls = 0;
          for (const traffic_counts& t : seen) {
            sent += t.of(k).sent;
            received += t.of(k).received;
            calls += t.of(k).calls;
          }
          std::uint64_t plan_sent = 0, plan_calls = 0;
          for (const traffic_entry& e : planned)
            if (e.collective == k) {
              plan_sent += e.volume_bytes() * (n - 1);  // ring_bytes_sent() on every rank
              plan_calls += e.calls * n;
            }
          if (k == collective_kind::all_gather) {
            plan_sent += n * (n - 1) * 3 * sizeof(std::uint64_t);
            plan_calls += n;
          }
          if (k == collective_kind::all_reduce && stage >= 1) {
            plan_sent += 2 * (n - 1) * sizeof(double);
            plan_calls += n;
          }
          CHECK(sent == plan_sent);
          CHECK(received == sent);
          CHECK(calls == plan_calls);
        }
      }
}

TEST_CASE("no_sync: the trainer's micro-batches, one reduction per step, equal to the plan's accumulation") {
  static_assert(std::is_same_v<decltype(std::declval<sharded_model&>().no_sync()),
                               decltype(std::declval<ddp::gradient_reducer&>().no_sync())>);
  const auto optimizers = test_optimizers();
  // Plan of 1 micro-batch, 3 run with no_sync on the first 2: bitwise the plan of 3 (the same
  // operations), within 1e-5 of plain data parallelism. Stages 2-3 plan accumulate_unsharded;
  // reproducible mode needs no plan setting at any stage (and averages over the micro-batches).
  for (int stage = 0; stage <= 3; ++stage)
    for (int world : {2, 3})
      for (bool reproducible : {false, true}) {
        if (reproducible && world == 3) continue;
        CAPTURE(stage);
        CAPTURE(world);
        CAPTURE(reproducible);
        run_config cfg;
        cfg.optimizer = optimizers[static_cast<std::size_t>(stage + world) % optimizers.size()];
        cfg.accumulation = 3;
        cfg.steps = 3;
        cfg.max_grad_norm = stage % 2 == 1 && !reproducible ? 0.5 : 0.0;
        cfg.implicit_last_end = stage == 1;
        std::vector<std::vector<std::vector<float>>> by_plan(static_cast<std::size_t>(world)),
            by_guard(static_cast<std::size_t>(world));
        std::vector<double> errors(static_cast<std::size_t>(world));
        local::launch(world, [&](communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          sharded_model_options options;
          options.optimizer = cfg.optimizer;
          options.max_grad_norm = cfg.max_grad_norm;
          options.reproducible = reproducible;
          for (bool guarded : {false, true}) {
            plan_request q = test_request(stage, guarded ? 1 : 3);
            q.accumulate_unsharded = !reproducible && stage >= 2;
            q.precision.optimizer_states = cfg.optimizer.state_count();
            sharded_model model(comm, q, options);
            run_config c = cfg;
            c.no_sync = guarded;
            (guarded ? by_guard : by_plan)[r] = train_sharded(model, comm.rank(), c);
            CHECK(model.require_gradient_sync());
          }
          if (!reproducible) errors[r] = max_relative_error(by_guard[r], train_reference(comm, test_parameters(), cfg));
        });
        for (std::size_t r = 0; r < by_plan.size(); ++r) {
          CHECK(bitwise_equal(by_guard[r], by_plan[r]));
          CHECK(bitwise_equal(by_guard[r], by_guard[0]));
          if (!reproducible) CHECK(errors[r] <= 1e-5);  // reproducible mode averages the micro-batches too
        }
      }
}

TEST_CASE("no_sync: a step of 4 micro-batches sends one micro-batch's gradient traffic") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    local::launch(3, [&](communicator& comm) {
      comm.set_forced_algorithm(algorithm::ring);
      plan_request q = test_request(stage, 1);
      q.accumulate_unsharded = stage >= 2;
      sharded_model model(comm, q, sharded_model_options{});
      constant_gradient_step(model, 1);  // the first step (buffers, first gathers)
      traffic_counts before = comm.traffic();
      constant_gradient_step(model, 1);
      const traffic_counts one = comm.traffic() - before;
      before = comm.traffic();
      for (int micro = 0; micro < 3; ++micro) {
        auto guard = model.no_sync();
        CHECK_FALSE(model.require_gradient_sync());
        constant_gradient_backward(model);
      }
      CHECK(model.require_gradient_sync());
      constant_gradient_step(model, 1);  // the 4th micro-batch reduces all 4
      const traffic_counts four = comm.traffic() - before;
      const collective_kind reduction = collective_kind::reduce_scatter;  // stage 1's too
      CHECK(four.of(reduction).sent == one.of(reduction).sent);
      CHECK(four.of(reduction).calls == one.of(reduction).calls);
      CHECK(four.of(collective_kind::all_reduce).sent == one.of(collective_kind::all_reduce).sent);
      // Stage 3 gathers the parameters for every micro-batch (as FSDP2 does).
      CHECK(four.of(collective_kind::all_gather).sent ==
            (stage == 3 ? 4 * (one.of(collective_kind::all_gather).sent - 2 * 3 * 8) + 2 * 3 * 8
                        : one.of(collective_kind::all_gather).sent));
    });
  }
}

TEST_CASE("no_sync: refusals name what was wrong, on every rank") {
  // Sharded gradients have nothing to accumulate into.
  local::launch(2, [&](communicator& comm) {
    sharded_model model(comm, test_request(2, 1), sharded_model_options{});
    expect([&] { (void)model.no_sync(); }, "plan_request::accumulate_unsharded");
    CHECK(model.require_gradient_sync());
    constant_gradient_step(model, 1);  // still usable
  });
  // A step taken inside no_sync (every rank), and on one rank only: refused on every rank.
  for (int only : {-1, 1}) {
    CAPTURE(only);
    std::vector<std::string> errors(2);
    local::launch(2, [&](communicator& comm) {
      sharded_model model(comm, test_request(0, 1), sharded_model_options{});
      try {
        if (only < 0 || comm.rank() == only) {
          auto guard = model.no_sync();
          constant_gradient_step(model, 1);
        } else {
          constant_gradient_step(model, 1);
        }
      } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
    });
    for (const std::string& e : errors) {
      INFO(e);
      // One rank off: the others' reductions meet its step's check (the contract check names both).
      CHECK(has(e, only < 0 ? "step() with gradient sync off" : "the step's check (learning rate"));
    }
  }
  // Ranks whose no_sync covered different micro-batches: the step names each rank's count.
  std::vector<std::string> errors(2);
  local::launch(2, [&](communicator& comm) {
    sharded_model model(comm, test_request(1, 1), sharded_model_options{});
    try {
      if (comm.rank() == 0) {
        auto guard = model.no_sync();
        constant_gradient_backward(model);
      }
      constant_gradient_step(model, 1);
    } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  for (const std::string& e : errors) {
    INFO(e);
    CHECK(has(e, "ended different numbers of micro-batches at step 1: rank 0: 2; rank 1: 1"));
  }
  // A change in the middle of a micro-batch; end_backward after the step's last micro-batch;
  // a guard closed in the middle of a micro-batch takes effect when it ends.
  local::launch(1, [&](communicator& comm) {
    plan_request q = test_request(3, 1);
    q.accumulate_unsharded = true;
    sharded_model model(comm, q, sharded_model_options{});
    model.pre_forward(0);
    model.post_forward(0);
    model.pre_backward(0);
    expect([&] { model.set_require_gradient_sync(false); }, "in the middle of a micro-batch");
    model.post_backward(0);
    model.end_backward();
    expect([&] { model.end_backward(); }, "but the plan accumulates 1 micro-batch(es)");
    model.step();
    {
      auto guard = model.no_sync();
      model.pre_backward(1);
      CHECK_FALSE(model.between_steps());  // nothing reduced, but a micro-batch is open
      {
        auto second = model.no_sync();  // a second guard inside the same micro-batch
      }
    }
    CHECK(model.require_gradient_sync());  // the mode from the next micro-batch on
    model.post_backward(1);
    model.end_backward();  // ends as it began: nothing reduced
    CHECK(model.require_gradient_sync());
    model.end_backward();  // sync on after a no_sync micro-batch: the step's last
    expect([&] { model.end_backward(); }, "after the micro-batch that reduced this step's gradients");
    model.set_require_gradient_sync(false);  // for the next step: this one was reduced
    model.step();
    model.set_require_gradient_sync(true);
  });
  // A guard closed in the middle of the step's only micro-batch, then step(): the micro-batch
  // ends as it began and the step reduces it, bitwise the step taken without no_sync.
  for (int stage : {0, 1, 3}) {
    CAPTURE(stage);
    std::vector<std::vector<std::vector<float>>> guarded(2), plain(2);
    local::launch(2, [&](communicator& comm) {
      for (bool with_guard : {false, true}) {
        plan_request q = test_request(stage, 1);
        q.accumulate_unsharded = stage >= 2;
        sharded_model model(comm, q, sharded_model_options{});
        set_initial_parameters(model);
        if (with_guard) {
          {
            auto guard = model.no_sync();
            constant_gradient_backward(model, false);
          }
          model.step();
        } else {
          constant_gradient_step(model, 1);
        }
        CHECK(model.require_gradient_sync());
        constant_gradient_step(model, 1);  // and training goes on
        auto& out = (with_guard ? guarded : plain)[static_cast<std::size_t>(comm.rank())];
        out.resize(model.parameter_count());
        for (std::size_t p = 0; p < model.parameter_count(); ++p) {
          out[p].resize(model.plan().placements()[p].numel);
          model.read_parameter(p, out[p]);
        }
      }
    });
    for (std::size_t r = 0; r < 2; ++r) CHECK(bitwise_equal(guarded[r], plain[r]));
  }
}

TEST_CASE("set_reshard_after_backward(false) with no_sync: the micro-batches after the first gather nothing") {
  // Stage 3 with reshard_after_forward none and accumulate_unsharded: a step of 4 micro-batches
  // sends one micro-batch's all_gathers and reduce_scatters, and ends with the parameters of the
  // same step taken with every gather (bitwise).
  for (int world : {2, 3}) {
    CAPTURE(world);
    std::vector<std::vector<std::vector<float>>> kept(static_cast<std::size_t>(world)),
        plain(static_cast<std::size_t>(world));
    local::launch(world, [&](communicator& comm) {
      comm.set_forced_algorithm(algorithm::ring);
      const auto r = static_cast<std::size_t>(comm.rank());
      for (bool keep : {false, true}) {
        plan_request q = test_request(3, 1);
        q.accumulate_unsharded = true;
        q.reshard_after_forward = reshard_policy::none;
        sharded_model model(comm, q, sharded_model_options{});
        set_initial_parameters(model);
        constant_gradient_step(model, 1);  // buffers and first gathers
        const traffic_counts before = comm.traffic();
        model.set_reshard_after_backward(!keep);
        CHECK(model.reshard_after_backward() == !keep);
        for (int micro = 0; micro < 3; ++micro) {
          auto guard = model.no_sync();
          constant_gradient_backward(model);
        }
        model.set_reshard_after_backward(true);
        constant_gradient_step(model, 1);
        const traffic_counts step = comm.traffic() - before;
        const std::uint64_t agreement = (static_cast<std::uint64_t>(world) - 1) * 3 * 8;
        std::uint64_t gathers = 0, reductions = 0;
        for (const traffic_entry& e : model.plan().traffic())
          (e.collective == collective_kind::all_gather ? gathers : reductions) += e.ring_bytes_sent();
        CHECK(step.of(collective_kind::reduce_scatter).sent == reductions);
        CHECK(step.of(collective_kind::all_gather).sent == (keep ? 1 : 4) * gathers + agreement);
        if (keep) CHECK(model.memory_allocated(primitive::memory_space::host).peak > model.plan().memory().total());
        (keep ? kept : plain)[r].resize(model.parameter_count());
        for (std::size_t p = 0; p < model.parameter_count(); ++p) {
          (keep ? kept : plain)[r][p].resize(model.plan().placements()[p].numel);
          model.read_parameter(p, (keep ? kept : plain)[r][p]);
        }
      }
    });
    for (std::size_t r = 0; r < kept.size(); ++r) CHECK(bitwise_equal(kept[r], plain[r]));
  }
}

namespace {

/// Counts the hooked calls and the bytes it allocated, and does what the runtime does.
class counting_hook : public collective_hook {
 public:
  std::string name() const override { return "counting"; }
  void all_gather(communicator& comm, const gather_call& call) override {
    ++gathers;
    collective_hook::all_gather(comm, call);
  }
  void reduce(communicator& comm, const reduction_call& call) override {
    ++reductions;
    if (fail_at_reduction == reductions.load()) throw std::runtime_error("injected failure");
    collective_hook::reduce(comm, call);
  }
  void* allocate(std::uint64_t bytes, primitive::memory_space space) override {
    CHECK(space == primitive::memory_space::host);
    if (refuse_allocations) throw std::runtime_error("arena full");
    live += bytes;
    ++allocations;
    return ::operator new (static_cast<std::size_t>(bytes), std::align_val_t{4096});
  }
  void deallocate(void* data, std::uint64_t bytes, primitive::memory_space) noexcept override {
    live -= bytes;
    ::operator delete (data, std::align_val_t{4096});
  }
  std::atomic<int> gathers{0}, reductions{0}, allocations{0};
  std::atomic<std::uint64_t> live{0};
  int fail_at_reduction = 0;        ///< throw in this reduction (1-based; 0: never)
  bool refuse_allocations = false;  ///< allocate throws
};

/// Another implementation of the same collectives: all_gather as one broadcast per rank, the
/// reduction as an all_reduce of the whole buffer.
class broadcast_hook : public collective_hook {
 public:
  std::string name() const override { return "broadcast"; }
  void all_gather(communicator& comm, const gather_call& call) override {
    const std::uint64_t bytes = call.shard_numel * dtype_size(call.type);
    auto* out = static_cast<unsigned char*>(call.gathered);
    for (int r = 0; r < comm.world_size(); ++r) {
      unsigned char* slot = out + static_cast<std::uint64_t>(r) * bytes;
      if (r == comm.rank() && slot != call.shard) std::memcpy(slot, call.shard, static_cast<std::size_t>(bytes));
      ringzero::broadcast(comm, slot, slot, call.shard_numel, call.type, r);
    }
  }
  void reduce(communicator& comm, const reduction_call& call) override {
    ringzero::all_reduce(comm, call.gradients, call.gradients, call.numel, call.type, reduce_kind::avg);
  }
};

}  // namespace

TEST_CASE("collective hooks: gathers and reductions through the hook, buffers in its memory") {
  const auto optimizers = test_optimizers();
  for (int stage = 0; stage <= 3; ++stage)
    for (int world : {2, 3}) {
      CAPTURE(stage);
      CAPTURE(world);
      run_config cfg;
      cfg.optimizer = optimizers[static_cast<std::size_t>(stage + world) % optimizers.size()];
      cfg.accumulation = stage == 2 ? 2 : 1;
      cfg.steps = 3;
      std::vector<std::vector<std::vector<float>>> plain(static_cast<std::size_t>(world)),
          counted(static_cast<std::size_t>(world));
      std::vector<double> errors(static_cast<std::size_t>(world));
      local::launch(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        plan_request q = test_request(stage, cfg.accumulation);
        q.precision.optimizer_states = cfg.optimizer.state_count();
        sharded_model_options options;
        options.optimizer = cfg.optimizer;
        {
          sharded_model model(comm, q, options);
          plain[r] = train_sharded(model, comm.rank(), cfg);
        }
        auto hook = std::make_shared<counting_hook>();
        options.hook = hook;
        {
          sharded_model model(comm, q, options);
          const communication_buffers& cb = model.plan().communication();
          CHECK(hook->live ==
                cb.gather_buffers * cb.gather_buffer_bytes + cb.gradient_buckets * cb.gradient_bucket_bytes);
          CHECK((hook->allocations > 0) == (stage >= 2));  // buckets at 2-3, gather buffers at 3
          counted[r] = train_sharded(model, comm.rank(), cfg);
          // One more step, measured: every gather and reduction the runtime issued went through the
          // hook (beside them only the step's agreement record and, at stages 1-3, the norm).
          const int gathers = hook->gathers, reductions = hook->reductions;
          const traffic_counts before = comm.traffic();
          constant_gradient_step(model, cfg.accumulation);
          const traffic_counts used = comm.traffic() - before;
          CHECK(hook->gathers - gathers == static_cast<int>(used.of(collective_kind::all_gather).calls) - 1);
          CHECK(hook->reductions - reductions == static_cast<int>(used.of(collective_kind::reduce_scatter).calls +
                                                                  used.of(collective_kind::all_reduce).calls) -
                                                     (stage >= 1 ? 1 : 0));
          CHECK(hook->reductions - reductions > 0);
          CHECK((hook->gathers - gathers > 0) == (stage >= 1));
        }
        CHECK(hook->live == 0);  // every buffer given back
        options.hook = std::make_shared<broadcast_hook>();
        sharded_model model(comm, q, options);
        errors[r] =
            max_relative_error(train_sharded(model, comm.rank(), cfg), train_reference(comm, test_parameters(), cfg));
      });
      for (std::size_t r = 0; r < plain.size(); ++r) {
        CHECK(bitwise_equal(counted[r], plain[r]));  // the default hook is the runtime's collectives
        CHECK(errors[r] <= 1e-5);
      }
    }
}

TEST_CASE("collective hooks: refusals and a failing hook, on every rank") {
  const auto run = [](const std::function<void(communicator&, std::vector<std::string>&)>& f) {
    std::vector<std::string> errors(2);
    local::launch(2, [&](communicator& comm) {
      try {
        f(comm, errors);
      } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
    });
    return errors;
  };
  // Ranks with different hooks.
  for (const std::string& e : run([](communicator&comm, std::vector<std::string>&) {
         sharded_model_options o;
         if (comm.rank() == 1) o.hook = std::make_shared<broadcast_hook>();
         sharded_model model(comm, test_request(3, 1), o);
       })) {
    INFO(e);
    CHECK(has(e, "the ranks differ in collective hook (hash of its name)"));
  }
  // A hook with quantized communication.
  for (const std::string& e : run([](communicator&comm, std::vector<std::string>&) {
         sharded_model_options o;
         o.hook = std::make_shared<counting_hook>();
         plan_request q = test_request(3, 1);
         q.quantization.weights = quantized_bits::int8;
         sharded_model model(comm, q, o);
       })) {
    INFO(e);
    CHECK(has(e, "both replace the runtime's gathers and reductions"));
  }
  // Units kept across micro-batches grow the gather pool beyond the plan; the hook's memory is
  // exhausted: the gather fails with the hook's reason on every rank, nothing is left half
  // started, and training goes on once units are released again.
  for (const std::string& e : run([](communicator&comm, std::vector<std::string>&seen) {
         auto hook = std::make_shared<counting_hook>();
         sharded_model_options o;
         o.hook = hook;
         plan_request q = test_request(3, 1);
         q.accumulate_unsharded = true;
         sharded_model model(comm, q, o);
         hook->refuse_allocations = true;
         model.set_reshard_after_backward(false);
         try {
           auto guard = model.no_sync();
           constant_gradient_backward(model);
         } catch (const error& e) { seen[static_cast<std::size_t>(comm.rank())] = e.what(); }
         model.set_reshard_after_backward(true);
         model.end_backward();
         model.step();
         constant_gradient_step(model, 1);
         constant_gradient_step(model, 1);
       })) {
    INFO(e);
    CHECK(has(e, "another gather buffer (beyond the plan's count"));
    CHECK(has(e, "the collective hook's allocate("));
    CHECK(has(e, "arena full"));
  }
  // A hook that throws in its first reduction on rank 1: rank 1 names the hook and the call,
  // rank 0 fails instead of waiting for it.
  const auto errors = run([](communicator& comm, std::vector<std::string>&) {
    auto hook = std::make_shared<counting_hook>();
    if (comm.rank() == 1) hook->fail_at_reduction = 1;
    sharded_model_options o;
    o.hook = hook;
    sharded_model model(comm, test_request(2, 1), o);
    constant_gradient_step(model, 1);
  });
  INFO(errors[0]);
  INFO(errors[1]);
  CHECK(has(errors[1], "the collective hook 'counting' failed in the reduction of unit"));
  CHECK(has(errors[1], "injected failure"));
  // "first failure: rank 1: ..." or, when rank 0 reaches the collective after the abort,
  // "communicator was aborted earlier: rank 1: ...": either names rank 1's failure.
  CHECK(has(errors[0], "rank 1: zero::sharded_model: the collective hook 'counting' failed"));
}
