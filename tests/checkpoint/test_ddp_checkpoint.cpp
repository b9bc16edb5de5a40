// A DDP trainer (gradient_reducer + the trainer's parameters and Adam moments registered in a
// checkpoint::replicated_state): save, load into a fresh trainer and continue bit for bit, with
// the reducer's rebuilt bucket layout restored; load at another world size.
#include <doctest/doctest.h>

#include "checkpoint_test_util.hpp"

using namespace ckpt_test;
namespace ck = ringzero::checkpoint;

namespace {

/// A small trainer: three float32 parameters, their gradients and Adam moments.
struct trainer {
  std::vector<std::vector<float>> w, g, m, v;
  std::vector<std::vector<std::uint64_t>> shapes{{8, 4}, {4}, {5}};
  std::vector<std::string> names{"w1", "b1", "w2"};
  std::uint64_t steps = 0;

  explicit trainer(float fill) {
    for (const auto& s : shapes) {
      std::uint64_t n = 1;
      for (auto d : s) n *= d;
      w.emplace_back(n, fill);
      g.emplace_back(n, 0.0f);
      m.emplace_back(n, fill);
      v.emplace_back(n, fill);
    }
    if (fill == 0)
      for (std::size_t p = 0; p < w.size(); ++p)
        for (std::size_t j = 0; j < w[p].size(); ++j) w[p][j] = zero_test::initial_value(p, j);
  }
  std::vector<ddp::reducer_parameter> parameters() {
    std::vector<ddp::reducer_parameter> out;
    for (std::size_t p = 0; p < w.size(); ++p)
      out.push_back(ddp::reducer_parameter::of(std::span<float>(w[p]), std::span<float>(g[p]), names[p]));
    return out;
  }
  ck::replicated_state state() {
    ck::replicated_state s;
    for (std::size_t p = 0; p < w.size(); ++p) {
      s.add_parameter(names[p], std::span<float>(w[p]), shapes[p]);
      s.add_optimizer_state(names[p], 0, "exp_avg", std::span<float>(m[p]), shapes[p]);
      s.add_optimizer_state(names[p], 1, "exp_avg_sq", std::span<float>(v[p]), shapes[p]);
    }
    s.set_optimizer(ck::detail::optimizer_json(adamw()));
    return s;
  }
  /// Steps [first, last): gradients marked ready in the order 1, 0, 2 (so the rebuild changes
  /// the initial reverse-order layout), averaged by the reducer, AdamW applied.
  void train(ddp::gradient_reducer& reducer, int rank, int first, int last) {
    for (int step = first; step < last; ++step) {
      for (std::size_t p : {std::size_t{1}, std::size_t{0}, std::size_t{2}}) {
        for (std::size_t j = 0; j < g[p].size(); ++j)
          g[p][j] = zero_test::gradient_term(rank, 0, step, p, j, 0, w[p][j], 0, false);
        reducer.mark_ready(p);
      }
      reducer.finish();
      ++steps;
      for (std::size_t p = 0; p < w.size(); ++p)
        zero::detail::apply_update(adamw(), steps, w[p].data(), g[p].data(), 1.0f, m[p].data(), v[p].data(),
                                   w[p].size());
    }
  }
};

ddp::reducer_options small_buckets() {
  ddp::reducer_options o;
  o.bucket_byte_limits = {40, 40};
  return o;
}

}  // namespace

TEST_CASE(
    "DDP trainer: 6 steps == 3 + save + fresh trainer + load + 3, bitwise, with the rebuilt bucket layout restored") {
  scratch_dir root("ddp");
  std::vector<std::vector<std::vector<float>>> straight(2), resumed(2);
  std::vector<std::size_t> saved_order;
  bool layout_matches = false;
  local::launch(2, [&](communicator& comm) {
    const int r = comm.rank();
    {
      trainer t(0);
      ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
      t.train(reducer, r, 0, 6);
      straight[static_cast<std::size_t>(r)] = t.w;
    }
    {
      trainer t(0);
      ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
      t.train(reducer, r, 0, 3);
      CHECK(reducer.layout_rebuilt());
      if (r == 0) saved_order = reducer.layout_order();
      ck::training_progress p;
      p.optimizer_steps = t.steps;
      p.epoch = 2;
      ck::checkpointer(root.path).save(reducer, t.state(), p);
    }
    trainer t(7.0f);  // garbage, overwritten by the load
    ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
    CHECK(!reducer.layout_rebuilt());
    ck::replicated_state state = t.state();
    const ck::training_progress p = ck::load(reducer, state, root.path);
    CHECK(p.epoch == 2);
    t.steps = p.optimizer_steps;
    CHECK(t.steps == 3);
    CHECK(reducer.layout_rebuilt());
    if (r == 0) layout_matches = reducer.layout_order() == saved_order;
    t.train(reducer, r, 3, 6);
    resumed[static_cast<std::size_t>(r)] = t.w;
  });
  CHECK(saved_order != std::vector<std::size_t>{2, 1, 0});  // the rebuild changed the layout
  CHECK(layout_matches);
  CHECK(same_bits(straight[0], resumed[0]));
  CHECK(same_bits(straight[1], resumed[1]));
  const auto index = ck::read_index(ck::resolve_checkpoint(root.path));
  CHECK(index.kind == "replicated");
  CHECK(index.find("w1", ck::tensor_role::parameter)->shape == std::vector<std::uint64_t>{8, 4});
  CHECK(index.find("w1", ck::tensor_role::parameter)->fragments.size() == 2);  // both ranks wrote half
}

TEST_CASE("DDP trainer: saved on 2 ranks, loaded on 3 (every tensor whole on every rank), staged and in place") {
  scratch_dir root("ddp-reshard");
  std::vector<std::vector<float>> saved_w, saved_v;
  local::launch(2, [&](communicator& comm) {
    trainer t(0);
    ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
    t.train(reducer, comm.rank(), 0, 2);
    if (comm.rank() == 0) {
      saved_w = t.w;
      saved_v = t.v;
    }
    ck::training_progress p;
    p.optimizer_steps = t.steps;
    ck::checkpointer(root.path).save(reducer, t.state(), p, "two");
  });
  for (const bool in_place : {false, true}) {
    CAPTURE(in_place);
    local::launch(3, [&](communicator& comm) {
      trainer t(-1.0f);
      ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
      ck::replicated_state state = t.state();
      ck::load_options o;
      o.in_place = in_place;
      ck::load(reducer, state, root.path / "two", o);
      CHECK(same_bits(t.w, saved_w));
      CHECK(same_bits(t.v, saved_v));
    });
  }
}

TEST_CASE("replicated_state refuses a shape that does not match its values and a tensor registered twice") {
  std::vector<float> x(6);
  ck::replicated_state s;
  CHECK_THROWS_WITH_AS(s.add_parameter("x", std::span<float>(x), {4, 2}),
                       doctest::Contains("has shape [4, 2] (8 elements) but 6 values"), ringzero::error);
  s.add_parameter("x", std::span<float>(x), {2, 3});
  CHECK_THROWS_WITH_AS(s.add_parameter("x", std::span<float>(x)), doctest::Contains("registered twice"),
                       ringzero::error);
}

TEST_CASE("DDP trainer: a load in the middle of a step is refused on every rank before any read, staged or in place") {
  scratch_dir root("ddp-midstep");
  local::launch(2, [&](communicator& comm) {
    trainer t(0);
    ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
    t.train(reducer, comm.rank(), 0, 1);
    ck::checkpointer(root.path).save(reducer, t.state(), ck::training_progress{}, "one");
  });
  for (const bool in_place : {false, true}) {
    CAPTURE(in_place);
    std::vector<int> unchanged(2, 0);
    const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
      trainer t(-1.0f);
      ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
      ck::replicated_state state = t.state();
      reducer.mark_ready(1);  // a step has begun
      CHECK(!reducer.between_steps());
      ck::load_options o;
      o.in_place = in_place;
      try {
        ck::load(reducer, state, root.path / "one", o);
      } catch (const ringzero::error&) {
        const trainer fresh(-1.0f);
        unchanged[static_cast<std::size_t>(comm.rank())] = same_bits(t.w, fresh.w) && same_bits(t.v, fresh.v);
        reducer.mark_ready(0);  // the communicator is usable: the step completes
        reducer.mark_ready(2);
        reducer.finish();
        throw;
      }
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(errors[static_cast<std::size_t>(r)].find("the state is unchanged") != std::string::npos);
      CHECK(errors[static_cast<std::size_t>(r)].find("between steps") != std::string::npos);
      CHECK(unchanged[static_cast<std::size_t>(r)] == 1);
    }
  }
}

TEST_CASE("DDP trainer: inside a no_sync accumulation window a save and a load are refused on every rank") {
  // The window's gradients were computed with the parameters a load would replace, and a save
  // would record a step count they are not part of (a sharded model refuses the same).
  scratch_dir root("ddp-window");
  local::launch(2, [&](communicator& comm) {
    trainer t(0);
    ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
    t.train(reducer, comm.rank(), 0, 1);
    ck::checkpointer(root.path).save(reducer, t.state(), ck::training_progress{}, "one");
  });
  const trainer fresh(-1.0f);
  for (const bool in_place : {false, true}) {
    CAPTURE(in_place);
    std::vector<int> unchanged(2, 0), resumed(2, 0);
    const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
      trainer t(-1.0f);
      ddp::gradient_reducer reducer(comm, t.parameters(), small_buckets());
      ck::replicated_state state = t.state();
      {
        auto guard = reducer.no_sync();
        for (std::size_t p = 0; p < 3; ++p) reducer.mark_ready(p);
        reducer.finish();  // a finished micro-batch: its gradients stay in g for the next one
      }
      CHECK(reducer.accumulating());
      CHECK(!reducer.between_steps());
      ck::load_options o;
      o.in_place = in_place;
      std::string save_error;
      try {
        ck::checkpointer(root.path).save(reducer, state, ck::training_progress{}, "window");
      } catch (const ringzero::error& e) { save_error = e.what(); }
      CHECK(save_error.find("can only be saved between steps") != std::string::npos);
      CHECK(save_error.find("no_sync") != std::string::npos);
      CHECK(!std::filesystem::exists(root.path / "window"));
      try {
        ck::load(reducer, state, root.path / "one", o);
      } catch (const ringzero::error&) {
        unchanged[static_cast<std::size_t>(comm.rank())] = same_bits(t.w, fresh.w) && same_bits(t.v, fresh.v);
        for (std::size_t p = 0; p < 3; ++p) reducer.mark_ready(p);  // the synchronised micro-batch ends it
        reducer.finish();
        CHECK(!reducer.accumulating());
        CHECK(reducer.between_steps());
        ck::load(reducer, state, root.path / "one", o);  // now between steps: accepted
        resumed[static_cast<std::size_t>(comm.rank())] = !same_bits(t.w, fresh.w);
        throw;
      }
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(errors[static_cast<std::size_t>(r)].find("the state is unchanged") != std::string::npos);
      CHECK(errors[static_cast<std::size_t>(r)].find("accumulated under no_sync") != std::string::npos);
      CHECK(unchanged[static_cast<std::size_t>(r)] == 1);
      CHECK(resumed[static_cast<std::size_t>(r)] == 1);
    }
  }
}
