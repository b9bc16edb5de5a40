// Saving and loading a zero::sharded_model: exact resume at stages 0-3 (SGD with momentum and
// AdamW), the asynchronous save's snapshot, keep_last, resharding to other world sizes, stages,
// replica groups and alignments (cases C16-C20).
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include <doctest/doctest.h>

#include "checkpoint_test_util.hpp"
#include "ringzero/checkpoint/background_writer.hpp"

using namespace ckpt_test;
namespace ck = ringzero::checkpoint;

namespace {

constexpr int batch_samples = 12;  // divisible by every world size 1-4

/// A training step of a global batch of 12 samples split evenly over the ranks, and its loss:
/// L = (1/12) sum over samples s and trainable elements j (each use of a tied storage apart) of
/// 0.5 * a_sj * (w_j - t_sj)^2, a_sj in [0.5, 1.5) and t_sj in [-1, 1] drawn from (s, step,
/// storage, j, use) as the test model draws them. Each rank adds the mean gradient of its samples
/// (float32); the model's average over ranks makes it the mean over the batch. The loss is
/// summed in float32 over this rank's terms, then over the ranks (all_reduce), as a trainer
/// reports it. Returns {the loss at the parameters before the update, its number of terms}.
std::pair<float, std::uint64_t> batch_step(sharded_model& model, int step) {
  communicator& comm = model.comm();
  const int per_rank = batch_samples / comm.world_size();
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  const std::size_t units = model.unit_count();
  float loss = 0;
  std::uint64_t terms = 0;
  for (std::size_t u = 0; u < units; ++u) {
    model.pre_forward(u);
    model.post_forward(u);
  }
  for (std::size_t u = units; u-- > 0;) {
    model.pre_backward(u);
    for (std::size_t p : plan.units()[u].members) {
      if (!params[p].trainable || plan.placements()[p].numel == 0) continue;
      const std::size_t storage = plan.placements()[p].storage;
      const int use = zero_test::use_of(params[p].name);
      auto w = model.parameter<float>(p);
      auto g = model.gradient<float>(p);
      for (std::size_t j = 0; j < g.size(); ++j) {
        float sum = 0;
        for (int i = 0; i < per_rank; ++i) {
          const int sample = comm.rank() * per_rank + i;
          const std::uint64_t h = zero_test::key(sample, 0, step, storage, j, use);
          const float a = 0.5f + static_cast<float>(h % 64) / 64.0f;
          const float t = static_cast<float>(static_cast<int>((h >> 8) % 33) - 16) / 16.0f;
          sum += a * (w[j] - t);
          loss += 0.5f * a * (w[j] - t) * (w[j] - t);
        }
        g[j] += sum / static_cast<float>(per_rank);
        terms += static_cast<std::uint64_t>(per_rank);
      }
    }
    model.post_backward(u);
  }
  model.end_backward();
  model.step();
  std::uint64_t all_terms = terms;
  all_reduce(comm, &loss, &loss, 1, dtype::float32, reduce_kind::sum);
  all_reduce(comm, &all_terms, &all_terms, 1, dtype::uint64, reduce_kind::sum);
  return {loss / static_cast<float>(batch_samples), all_terms};
}

}  // namespace

TEST_CASE("resume is exact at stages 0-3 with SGD (momentum) and AdamW: 6 steps == 3 + save + fresh model + load + 3") {
  for (const auto& o : {sgd_momentum(), adamw()})
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(stage);
      CAPTURE(std::string(optimizer_name(o.kind)));
      scratch_dir root("resume");
      std::vector<std::vector<std::vector<float>>> straight(2), resumed(2);
      std::vector<std::uint64_t> steps(2);
      local::launch(2, [&](communicator& comm) {
        const int r = comm.rank();
        {
          sharded_model a(comm, request(zero_test::test_parameters(), stage, 16, o.state_count()), model_options(o));
          initialise(a);
          train(a, r, 0, 6);
          straight[static_cast<std::size_t>(r)] = parameters_of(a);
        }
        {
          sharded_model b(comm, request(zero_test::test_parameters(), stage, 16, o.state_count()), model_options(o));
          initialise(b);
          train(b, r, 0, 3);
          ck::training_progress progress;
          progress.epoch = 1;
          progress.step_in_epoch = 3;
          progress.rng_seeds = {42, 7};
          ck::checkpointer(root.path).save(b, progress);
        }
        sharded_model c(comm, request(zero_test::test_parameters(), stage, 16, o.state_count()), model_options(o));
        const ck::training_progress p = ck::load(c, root.path);
        CHECK(p.optimizer_steps == 3);
        CHECK(p.epoch == 1);
        CHECK(p.step_in_epoch == 3);
        CHECK(p.rng_seeds == std::vector<std::uint64_t>{42, 7});
        CHECK(c.optimizer().steps() == 3);
        train(c, r, 3, 6);
        steps[static_cast<std::size_t>(r)] = c.optimizer().steps();
        resumed[static_cast<std::size_t>(r)] = parameters_of(c);
      });
      CHECK(steps[0] == 6);
      CHECK(same_bits(straight[0], resumed[0]));
      CHECK(same_bits(straight[1], resumed[1]));
      CHECK(same_bits(straight[0], straight[1]));
    }
}

TEST_CASE("load_options::in_place: into the model's own memory, nothing kept, bitwise the staged load, resharded") {
  // Saved on 2 ranks at stage 2 after 3 AdamW steps; loaded on 3 ranks at stages 0-3, staged into
  // one model and in place into another through a checkpointer; both then train 2 more steps.
  scratch_dir root("in-place");
  const optimizer_options o = adamw();
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 2, 16, o.state_count()), model_options(o));
    initialise(m);
    train(m, comm.rank(), 0, 3);
    ck::checkpointer(root.path).save(m, {}, "s");
  });
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    local::launch(3, [&](communicator& comm) {
      const plan_request q = request(zero_test::test_parameters(), stage, 16, o.state_count());
      sharded_model staged(comm, q, model_options(o)), in_place(comm, q, model_options(o));
      ck::load(staged, root.path / "s");
      zero::checkpoint_access access(in_place);
      std::vector<const void*> memory;  // where the rank's state lives before the load
      for (std::size_t b = 0; b < in_place.plan().buffers().size(); ++b) {
        memory.push_back(access.held_parameters(b));
        memory.push_back(in_place.optimizer().master(b));
        for (int k = 0; k < o.state_count(); ++k) memory.push_back(in_place.optimizer().state(b, k));
      }
      ck::checkpointer loader(root.path);
      ck::load_options lo;
      lo.in_place = true;
      loader.load(in_place, root.path / "s", lo);
      CHECK(loader.load_memory_bytes() == 0);  // no second copy kept
      CHECK(loader.staging_bytes() == 0);
      std::vector<const void*> after;
      for (std::size_t b = 0; b < in_place.plan().buffers().size(); ++b) {
        after.push_back(access.held_parameters(b));
        after.push_back(in_place.optimizer().master(b));
        for (int k = 0; k < o.state_count(); ++k) after.push_back(in_place.optimizer().state(b, k));
      }
      CHECK(after == memory);  // read into, not exchanged
      CHECK(in_place.optimizer().steps() == 3);
      CHECK(same_bits(parameters_of(staged), parameters_of(in_place)));
      CHECK(optimizer_bytes(staged) == optimizer_bytes(in_place));
      train(staged, comm.rank(), 3, 5);
      train(in_place, comm.rank(), 3, 5);
      CHECK(same_bits(parameters_of(staged), parameters_of(in_place)));
      CHECK(optimizer_bytes(staged) == optimizer_bytes(in_place));
      // Parameters only: the optimizer's states and step count stay as they are.
      const auto states_of = [&](sharded_model& m) {
        std::vector<float> out;
        for (std::size_t b = 0; b < m.plan().buffers().size(); ++b)
          for (int k = 0; k < o.state_count(); ++k)
            if (const float* s = m.optimizer().state(b, k); s != nullptr)
              out.insert(out.end(), s, s + zero::checkpoint_access(m).optimizer_range(b).size());
        return out;
      };
      sharded_model weights(comm, q, model_options(o));
      initialise(weights);
      train(weights, comm.rank(), 0, 1);
      const std::vector<float> states_before = states_of(weights);
      ck::load_options parameters_only = lo;
      parameters_only.optimizer_state = false;
      ck::load(weights, root.path / "s", parameters_only);
      CHECK(weights.optimizer().steps() == 1);
      ck::load(staged, root.path / "s", ck::load_options{.optimizer_state = false, .strict = true, .in_place = false});
      CHECK(same_bits(parameters_of(staged), parameters_of(weights)));
      CHECK(same_bits({states_of(weights)}, {states_before}));  // the states stayed
    });
  }
}

TEST_CASE("parameters in the trainer's memory (adopt_parameters): loads write into it, resumed == straight") {
  // A checkpointer's load of the optimizer states would otherwise exchange the model's memory for
  // its second copy; adopted parameters stay where the trainer has them, at stages 0-2, twice.
  for (int stage = 0; stage <= 2; ++stage) {
    CAPTURE(stage);
    scratch_dir root("adopted");
    std::vector<std::vector<std::vector<float>>> straight(2), resumed(2), in_memory(2);
    local::launch(2, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      const plan_request q = request(zero_test::test_parameters(), stage, 16, adamw().state_count());
      {
        sharded_model a(comm, q, model_options(adamw()));
        initialise(a);
        train(a, comm.rank(), 0, 6);
        straight[r] = parameters_of(a);
      }
      std::optional<zero_test::trainer_memory> trainer;  // outlives the model
      sharded_model b(comm, q, model_options(adamw()));
      initialise(b);
      const zero::adoption_layout l = zero::layout_for_adoption(b.plan());
      const zero_test::trainer_memory& mem = trainer.emplace(l, 0);
      zero::adopt_parameters(b, mem.base, l.bytes, zero::adopted_values::from_model);
      train(b, comm.rank(), 0, 3);
      ck::checkpointer saver(root.path);
      saver.save(b, ck::training_progress{});
      for (int round = 0; round < 2; ++round) {  // both through the checkpointer's staging buffer
        train(b, comm.rank(), 3, 5);
        saver.load(b, root.path);
        CHECK(saver.load_memory_bytes() == 0);  // no second copy of the state
        CHECK(saver.staging_bytes() > 0);
        for (std::size_t p = 0; p < b.parameter_count(); ++p)
          if (b.numel(p) > 0)
            CHECK(reinterpret_cast<unsigned char*>(b.parameter<float>(p).data()) == mem.base + l.parameter_offset[p]);
      }
      train(b, comm.rank(), 3, 6);
      resumed[r] = parameters_of(b);
      for (std::size_t p = 0; p < b.parameter_count(); ++p) in_memory[r].push_back(mem.values<float>(l, p, b.numel(p)));
    });
    CHECK(same_bits(straight[0], resumed[0]));
    CHECK(same_bits(straight[1], resumed[1]));
    CHECK(same_bits(in_memory[0], resumed[0]));
  }
}

TEST_CASE("the index and shard files: names, shapes, roles, one file per rank, latest") {
  scratch_dir root("layout");
  local::launch(3, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    train(m, comm.rank(), 0, 2);
    ck::training_progress progress;
    progress.metadata["note"] = "three ranks";
    ck::checkpointer(root.path).save(m, progress);
  });
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("step-00000002"));
  const fs::path dir = root.path / "step-00000002";
  const auto index = ck::read_index(dir);
  CHECK(index.world_size == 3);
  CHECK(index.stage == 3);
  CHECK(index.kind == "zero");
  CHECK(index.progress.optimizer_steps == 2);
  CHECK(index.progress.metadata.at("note") == "three ranks");
  REQUIRE(index.files.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CHECK(index.files[static_cast<std::size_t>(r)].name == ck::shard_file_name(r, 3));
    CHECK(fs::file_size(dir / index.files[static_cast<std::size_t>(r)].name) ==
          index.files[static_cast<std::size_t>(r)].bytes);
    // Every fragment of that file is a tensor of its safetensors header at the recorded offset.
    const auto header = ck::read_safetensors_header(dir / index.files[static_cast<std::size_t>(r)].name);
    CHECK(header.metadata.at("rank") == std::to_string(r));
    for (const auto& t : index.tensors)
      for (const auto& f : t.fragments)
        if (f.file == static_cast<std::size_t>(r)) {
          const auto* s = header.find(ck::fragment_key(t.name, t.role, t.state, f.begin, f.end));
          REQUIRE(s != nullptr);
          CHECK(s->begin == f.offset);
          CHECK(s->shape == std::vector<std::uint64_t>{f.end - f.begin});
        }
  }
  const auto* embed = index.find("embed", ck::tensor_role::parameter);
  REQUIRE(embed != nullptr);
  CHECK(embed->shape == std::vector<std::uint64_t>{7, 5});
  const auto* head = index.find("head", ck::tensor_role::parameter);
  REQUIRE(head != nullptr);
  CHECK(head->tied_to == "embed");
  CHECK(head->fragments.empty());
  const auto* m = index.find("l1.w", ck::tensor_role::optimizer_state, 1);
  REQUIRE(m != nullptr);
  CHECK(m->state_name == "exp_avg_sq");
  CHECK(index.find("frozen.w", ck::tensor_role::optimizer_state, 0) == nullptr);
  const auto* empty = index.find("empty", ck::tensor_role::parameter);
  REQUIRE(empty != nullptr);
  CHECK(empty->shape == std::vector<std::uint64_t>{0, 3});
  CHECK(!fs::exists(root.path / ".tmp.step-00000002"));
}

TEST_CASE("async_save: the state at the call is saved while training goes on; errors and commit at the next call") {
  scratch_dir root("async");
  std::vector<std::vector<std::vector<float>>> at_save(2), loaded(2);
  local::launch(2, [&](communicator& comm) {
    const int r = comm.rank();
    ck::checkpointer ckpt(root.path);
    {
      sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
      initialise(m);
      train(m, r, 0, 2);
      at_save[static_cast<std::size_t>(r)] = parameters_of(m);
      ckpt.async_save(m);
      CHECK(ckpt.pending());
      CHECK(ckpt.staging_bytes() > 0);
      const std::uint64_t staging = ckpt.staging_bytes();
      train(m, r, 2, 4);                       // overwrites the model while the file is written
      ckpt.async_save(m);                      // finishes the first save, starts the second
      CHECK(ckpt.staging_bytes() == staging);  // allocated once
      ckpt.wait();
      CHECK(!ckpt.pending());
    }
    sharded_model c(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
    ck::load(c, root.path / "step-00000002");
    loaded[static_cast<std::size_t>(r)] = parameters_of(c);
    CHECK(c.optimizer().steps() == 2);
  });
  CHECK(same_bits(at_save[0], loaded[0]));
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("step-00000004"));
}

TEST_CASE(
    "a checkpointer destroyed with an asynchronous save pending finishes it; failures go to stderr, never thrown") {
  scratch_dir root("async-destroy");
  std::vector<std::vector<std::vector<float>>> at_save(2), loaded(2);
  local::launch(2, [&](communicator& comm) {
    const int r = comm.rank();
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    train(m, r, 0, 2);
    at_save[static_cast<std::size_t>(r)] = parameters_of(m);
    {
      ck::checkpointer ckpt(root.path);
      ckpt.async_save(m);
      train(m, r, 2, 3);  // training goes on; nobody calls wait()
    }
    sharded_model c(comm, request(zero_test::test_parameters(), 1), model_options(adamw()));
    ck::load(c, root.path);
    loaded[static_cast<std::size_t>(r)] = parameters_of(c);
    CHECK(c.optimizer().steps() == 2);
  });
  CHECK(same_bits(at_save[0], loaded[0]));
  CHECK(same_bits(at_save[1], loaded[1]));
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("step-00000002"));

  // Rank 0's commit fails at destruction (a directory where index.json goes), and a checkpointer
  // destroyed by an exception's unwinding runs no collective: both only print, to stderr.
  // (Made after `open`, which removes what interrupted saves left in the root.)
  const fs::path blocked = ck::temporary_directory(root.path, "blocked") / "index.json";
  const fs::path log = root.path / "stderr.txt";
  std::fflush(stderr);
  const int saved_stderr = ::dup(2);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  ::dup2(fd, 2);
  ::close(fd);
  bool threw = false;
  std::vector<std::string> unwound(2);
  try {
    local::launch(2, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
      initialise(m);
      {
        ck::checkpointer ckpt(root.path);
        ckpt.open(m);
        if (comm.rank() == 0) fs::create_directories(blocked);
        ckpt.async_save(m, {}, "blocked");
      }
      try {
        ck::checkpointer ckpt(root.path);
        ckpt.async_save(m, {}, "unwound");
        throw std::runtime_error("the training step failed");
      } catch (const std::runtime_error& e) { unwound[static_cast<std::size_t>(comm.rank())] = e.what(); }
    });
  } catch (...) { threw = true; }
  std::fflush(stderr);
  ::dup2(saved_stderr, 2);
  ::close(saved_stderr);
  const std::string text = read_text(log);
  CAPTURE(text);
  CHECK(!threw);
  CHECK(unwound[0] == "the training step failed");
  for (int r = 0; r < 2; ++r) {
    const std::string who = "(rank " + std::to_string(r) + ")";
    CHECK(text.find(who + ", finishing checkpoint '" + (root.path / "blocked").string() + "' at destruction") !=
          std::string::npos);
    CHECK(text.find(who + ": checkpoint '" + (root.path / "unwound").string() +
                    "' was not completed: destroyed while an exception unwinds") != std::string::npos);
  }
  CHECK(text.find(blocked.string() + "': it is a directory") != std::string::npos);
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("step-00000002"));
  CHECK(!fs::exists(root.path / "blocked"));
  CHECK(!fs::exists(root.path / "unwound"));
}

TEST_CASE(
    "checkpointer::load: the model's previous state kept from load to load and exchanged, the learning rate "
    "kept; the same state as checkpoint::load; parameters-only loads through async_save's staging") {
  scratch_dir root("kept");
  std::vector<std::vector<std::vector<float>>> at2(2), at4(2);
  local::launch(2, [&](communicator& comm) {
    const int r = comm.rank();
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    ck::checkpointer ckpt(root.path);
    train(m, r, 0, 2);
    at2[static_cast<std::size_t>(r)] = parameters_of(m);
    ckpt.save(m, {}, "two");
    train(m, r, 2, 4);
    at4[static_cast<std::size_t>(r)] = parameters_of(m);
    ckpt.save(m, {}, "four");
  });
  for (int world : {2, 3}) {
    CAPTURE(world);
    std::vector<int> ok(static_cast<std::size_t>(world), 0);
    local::launch(world, [&](communicator& comm) {
      const int r = comm.rank();
      ck::checkpointer ckpt(root.path);
      sharded_model m(comm, request(zero_test::test_parameters(), world == 2 ? 3 : 1), model_options(adamw()));
      initialise(m);
      train(m, r, 7, 8);  // state of its own, overwritten by the loads
      m.set_learning_rate(0.0625);
      ckpt.load(m, root.path / "two");
      const std::uint64_t kept = ckpt.load_memory_bytes();
      const std::uint64_t expected =
          m.memory_in_use().parameters + m.memory_in_use().master_weights + m.memory_in_use().optimizer_states;
      const bool first = kept == expected && ckpt.staging_bytes() == 0 && same_bits(parameters_of(m), at2[0]) &&
                         m.optimizer().steps() == 2 && m.optimizer().options().lr == 0.0625;
      ckpt.load(m, root.path);  // latest: "four", into the state kept from the first load
      const bool second = same_bits(parameters_of(m), at4[0]) && m.optimizer().steps() == 4 &&
                          ckpt.load_memory_bytes() == kept && m.optimizer().options().lr == 0.0625;
      m.set_learning_rate(adamw().lr);
      sharded_model reference(comm, request(zero_test::test_parameters(), world == 2 ? 3 : 1), model_options(adamw()));
      ck::load(reference, root.path);
      train(m, r, 4, 5);
      train(reference, r, 4, 5);
      const bool same_next_step =
          same_bits(parameters_of(m), parameters_of(reference)) && optimizer_bytes(m) == optimizer_bytes(reference);
      ckpt.async_save(m, {}, "five");
      const std::uint64_t staging = ckpt.staging_bytes();
      ckpt.wait();
      ckpt.load(m, root.path / "two", {.optimizer_state = false});  // parameters only: async_save's staging, grown
      const bool shared = staging > 0 && ckpt.staging_bytes() >= staging && same_bits(parameters_of(m), at2[0]) &&
                          m.optimizer().steps() == 5;
      ckpt.release_load_memory();
      const bool released = ckpt.load_memory_bytes() == 0;
      ok[static_cast<std::size_t>(r)] = first && second && same_next_step && shared && released;
    });
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(ok[static_cast<std::size_t>(r)] == 1);
    }
    fs::remove_all(root.path / "five");
    ck::detail::replace_file_atomically(root.path / "latest", "four\n");
  }
  // A refused load through kept staging leaves the model as it was, on every rank.
  fs::copy(root.path / "four", root.path / "cut", fs::copy_options::recursive);
  fs::resize_file(root.path / "cut" / ck::shard_file_name(0, 2), 100);
  std::vector<int> unchanged(2, 0);
  const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
    ck::checkpointer ckpt(root.path);
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    ckpt.load(m, root.path / "two");
    const auto before = parameters_of(m);
    const auto states_before = optimizer_bytes(m);
    try {
      ckpt.load(m, root.path / "cut");
    } catch (...) {
      unchanged[static_cast<std::size_t>(comm.rank())] =
          same_bits(before, parameters_of(m)) && optimizer_bytes(m) == states_before && m.optimizer().steps() == 2;
      throw;
    }
  });
  CHECK(errors[0].find("truncated") != std::string::npos);
  CHECK(errors[1].find("truncated") != std::string::npos);
  CHECK(unchanged == std::vector<int>{1, 1});
}

TEST_CASE("keep_last removes older checkpoints only once the new one is complete") {
  scratch_dir root("keep");
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 1, 16, 1), model_options(sgd_momentum()));
    initialise(m);
    ck::checkpointer ckpt(root.path, {.keep_last = 2});
    for (int k = 0; k < 4; ++k) {
      train(m, comm.rank(), k, k + 1);
      ckpt.save(m);
    }
  });
  CHECK(!fs::exists(root.path / "step-00000001"));
  CHECK(!fs::exists(root.path / "step-00000002"));
  CHECK(fs::exists(root.path / "step-00000003" / "index.json"));
  CHECK(fs::exists(root.path / "step-00000004" / "index.json"));
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("step-00000004"));
  CHECK(ck::complete_checkpoints(root.path) == std::vector<std::string>{"step-00000003", "step-00000004"});
}

TEST_CASE(
    "reshard: saved on 4 ranks at stage 3, loaded on 3, 2 and 1 ranks at stages 0-3: every tensor bitwise equal, the "
    "next steps' losses equal within float32 reduction-order rounding") {
  scratch_dir root("reshard");
  std::vector<std::vector<float>> saved_params;
  std::array<float, 2> reference{};  // the unresharded run's losses of steps 3 and 4
  std::uint64_t terms = 0;
  local::launch(4, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    train(m, comm.rank(), 0, 3);
    auto p = parameters_of(m);
    if (comm.rank() == 0) saved_params = p;
    ck::checkpointer(root.path).save(m, {}, "saved");
    const auto [l3, n] = batch_step(m, 3);  // the run goes on, unresharded
    const auto [l4, n4] = batch_step(m, 4);
    if (comm.rank() == 0) reference = {l3, l4}, terms = n;
  });
  // Tolerance. Step 3's loss is of bitwise identical parameters: only the order of its float32
  // sums differs (this rank's terms, then the ranks), and its n terms are non-negative, so any
  // order is within gamma_{n-1} = (n-1)u/(1-(n-1)u) of the exact sum (Higham, Accuracy and
  // Stability of Numerical Algorithms, 2nd ed., section 4.2; u = 2^-24), and two runs differ by
  // at most 2 gamma_{n-1} relative (2.5e-4 for n = 2136). Step 4's loss is of parameters updated
  // once more from gradients averaged in another order too: AdamW turns that into differences of
  // a few ulps per parameter, each term of the loss moving by a few u of itself, well inside the
  // same bound (measured: 1.1e-6).
  REQUIRE(terms > 1000);
  const double u = std::ldexp(1.0, -24),
               gamma = static_cast<double>(terms - 1) * u / (1 - static_cast<double>(terms - 1) * u);
  const double tolerance = 2 * gamma;
  double worst = 0;
  const auto saved = full_tensors(root.path / "saved");
  for (int world : {3, 2, 1})
    for (int stage = 0; stage <= 3; ++stage)
      for (std::uint64_t alignment : {std::uint64_t{16}, std::uint64_t{4}}) {
        CAPTURE(world);
        CAPTURE(stage);
        CAPTURE(alignment);
        scratch_dir again("reshard-again");
        std::vector<std::vector<float>> params;
        std::array<float, 2> losses{};
        std::uint64_t n = 0;
        local::launch(world, [&](communicator& comm) {
          sharded_model m(comm, request(zero_test::test_parameters(), stage, alignment), model_options(adamw()));
          ck::load(m, root.path / "saved");
          CHECK(m.optimizer().steps() == 3);
          auto p = parameters_of(m);
          if (comm.rank() == 0) params = p;
          ck::checkpointer(again.path).save(m, {}, "resaved");
          const auto [l3, n3] = batch_step(m, 3);  // the next steps run
          const auto [l4, n4] = batch_step(m, 4);
          if (comm.rank() == 0) losses = {l3, l4}, n = n3;
        });
        CHECK(same_bits(params, saved_params));
        CHECK(n == terms);
        for (int k = 0; k < 2; ++k) {
          CAPTURE(k);
          const double rel = std::abs(static_cast<double>(losses[k]) - reference[k]) / reference[k];
          worst = std::max(worst, rel);
          CHECK(rel <= tolerance);
        }
        const auto resaved = full_tensors(again.path / "resaved");
        CHECK(resaved.size() == saved.size());
        for (const auto& [key, bytes] : saved) {
          CAPTURE(key);
          REQUIRE(resaved.contains(key));
          CHECK(resaved.at(key) == bytes);
        }
      }
  MESSAGE("reshard: the largest relative loss difference " << worst << ", tolerance " << tolerance << " (" << terms
                                                           << " terms)");
}

TEST_CASE("reshard across replica groups: hybrid sharding (2 groups of 2) saved, loaded on 3 ranks at stage 2") {
  scratch_dir root("hybrid");
  std::vector<std::vector<float>> before, after;
  local::world shard0(2), shard1(2), replica0(2), replica1(2);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> failures(4);
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      try {
        local::communicator shard_comm(r / 2 == 0 ? shard0 : shard1, r % 2);
        local::communicator replica_comm(r % 2 == 0 ? replica0 : replica1, r / 2);
        sharded_model m(shard_comm, request(zero_test::test_parameters(), 3), model_options(adamw()), &replica_comm);
        initialise(m);
        train(m, r / 2, 0, 2);  // the gradients of a shard group's ranks: its replica group's number
        auto p = parameters_of(m);
        if (r == 0) before = p;
        ck::checkpointer(root.path).save(m, {}, "hybrid");
      } catch (...) {
        failures[static_cast<std::size_t>(r)] = std::current_exception();
        for (auto* w : {&shard0, &shard1, &replica0, &replica1}) w->abort("rank failed");
      }
    });
  for (auto& t : threads) t.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
  const auto index = ck::read_index(root.path / "hybrid");
  CHECK(index.replica_group_size == 2);
  CHECK(index.world_size == 4);
  local::launch(3, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
    ck::load(m, root.path / "hybrid");
    auto p = parameters_of(m);
    if (comm.rank() == 0) after = p;
  });
  CHECK(same_bits(before, after));
}

namespace {
std::vector<parameter_spec> c16_parameters() {
  using zero_test::make_spec;
  return {make_spec("a", {3}, ""), make_spec("b", {1}, ""), make_spec("c", {7}, ""), make_spec("d", {0}, ""),
          make_spec("e", {2}, "")};
}
void train_c16(sharded_model& m, int rank, int first, int last) {
  for (int step = first; step < last; ++step) {
    for (std::size_t p = 0; p < m.parameter_count(); ++p) {
      auto w = m.parameter<float>(p);
      auto g = m.gradient<float>(p);
      for (std::size_t j = 0; j < g.size(); ++j)
        g[j] += zero_test::gradient_term(rank, 0, step, p, j, 0, w[j], 0, false);
    }
    m.end_backward();
    m.step();
  }
}
}  // namespace

TEST_CASE("C16: stage 3, parameters of 3, 1, 7, 0, 2 elements, AdamW after 2 steps, saved on 2 ranks, loaded on 8") {
  scratch_dir root("c16");
  local::launch(2, [&](communicator& comm) {
    plan_request q = request(c16_parameters(), 3);
    q.unit_bytes = 1 << 20;  // one unit: every parameter gathered together
    sharded_model m(comm, q, model_options(adamw()));
    for (std::size_t p = 0; p < m.parameter_count(); ++p) {
      std::vector<float> v(m.plan().placements()[p].numel);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = zero_test::initial_value(p, j);
      m.set_parameter(p, v);
    }
    m.pre_forward(0);
    m.post_forward(0);
    m.pre_backward(0);
    train_c16(m, comm.rank(), 0, 1);
    m.pre_forward(0);
    m.post_forward(0);
    m.pre_backward(0);
    train_c16(m, comm.rank(), 1, 2);
    ck::checkpointer(root.path).save(m, {}, "c16");
  });
  const auto saved = full_tensors(root.path / "c16");
  CHECK(saved.size() == 5 * 3);  // 5 parameters and 2 Adam moments of each (empty ones of "d")
  scratch_dir again("c16-again");
  std::vector<int> empty_ranks(8, 0);
  local::launch(8, [&](communicator& comm) {
    plan_request q = request(c16_parameters(), 3);
    q.unit_bytes = 1 << 20;
    sharded_model m(comm, q, model_options(adamw()));
    ck::load(m, root.path / "c16");
    CHECK(m.optimizer().steps() == 2);
    std::uint64_t owned = 0;
    for (const auto& f : m.plan().fragments(comm.rank())) owned += f.count;
    empty_ranks[static_cast<std::size_t>(comm.rank())] = owned == 0 ? 1 : 0;
    ck::checkpointer(again.path).save(m, {}, "c16");
    m.pre_forward(0);
    m.post_forward(0);
    m.pre_backward(0);
    train_c16(m, comm.rank() % 2, 2, 3);  // the next step runs on all 8 ranks
    CHECK(m.optimizer().steps() == 3);
  });
  CHECK(std::count(empty_ranks.begin(), empty_ranks.end(), 1) > 0);  // some ranks own nothing
  const auto resaved = full_tensors(again.path / "c16");
  CHECK(resaved == saved);
  CHECK(ck::read_index(again.path / "c16").progress.optimizer_steps == 2);
}

TEST_CASE(
    "C17: a [7, 5] parameter saved at stage 3 on 3 ranks records its shape and ranges; 2 ranks restore the 35 values") {
  scratch_dir root("c17");
  std::vector<float> values(35);
  for (std::size_t j = 0; j < 35; ++j) values[j] = static_cast<float>(j) * 0.25f - 3.0f;
  local::launch(3, [&](communicator& comm) {
    sharded_model m(comm, request({zero_test::make_spec("w", {7, 5}, "")}, 3), model_options(adamw()));
    m.set_parameter(0, values);
    ck::checkpointer(root.path).save(m, {}, "c17");
  });
  const auto index = ck::read_index(root.path / "c17");
  const auto* w = index.find("w", ck::tensor_role::parameter);
  REQUIRE(w != nullptr);
  CHECK(w->shape == std::vector<std::uint64_t>{7, 5});
  REQUIRE(w->fragments.size() == 3);
  std::uint64_t at = 0;
  for (const auto& f : w->fragments) {
    CHECK(f.begin == at);
    at = f.end;
  }
  CHECK(at == 35);
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request({zero_test::make_spec("w", {7, 5}, "")}, 3), model_options(adamw()));
    ck::load(m, root.path / "c17");
    std::vector<float> out(35);
    m.read_parameter(0, out);
    CHECK(out == values);
  });
}

TEST_CASE(
    "C18: an embedding [11, 4] tied to the output layer, saved at stage 2 on 3 ranks: both names load with identical "
    "values") {
  using zero_test::make_spec;
  scratch_dir root("c18");
  std::vector<float> embedding;
  local::launch(3, [&](communicator& comm) {
    sharded_model m(comm,
                    request({make_spec("embed", {11, 4}, "in", true, "tok"), make_spec("mid", {4, 4}, "mid"),
                             make_spec("out", {11, 4}, "out", true, "tok")},
                            2),
                    model_options(adamw()));
    initialise(m);
    for (int s = 0; s < 2; ++s) {
      for (std::size_t u = 3; u-- > 0;) {
        for (std::size_t p : m.plan().units()[u].members) {
          auto g = m.gradient<float>(p);
          auto w = m.parameter<float>(p);
          for (std::size_t j = 0; j < g.size(); ++j)
            g[j] += zero_test::gradient_term(comm.rank(), 0, s, p, j, 0, w[j], 0, false);
        }
        m.post_backward(u);
      }
      m.step();
    }
    std::vector<float> e(44);
    m.read_parameter(0, e);
    if (comm.rank() == 0) embedding = e;
    ck::checkpointer(root.path).save(m, {}, "c18");
  });
  // Loaded into the same model on 2 ranks, and into a model where the two are separate parameters.
  for (bool tied : {true, false})
    local::launch(2, [&](communicator& comm) {
      sharded_model m(
          comm,
          request({make_spec("embed", {11, 4}, "in", true, tied ? "tok" : ""), make_spec("mid", {4, 4}, "mid"),
                   make_spec("out", {11, 4}, "out", true, tied ? "tok" : "")},
                  3),
          model_options(adamw()));
      ck::load(m, root.path / "c18");
      std::vector<float> a(44), b(44);
      m.read_parameter(0, a);
      m.read_parameter(2, b);
      CHECK(a == embedding);
      CHECK(b == embedding);
    });
}

TEST_CASE("C19: a frozen [6, 3] layer next to trainable ones, saved at stages 1, 2 and 3, restored whole") {
  // Stage 3 also with the frozen layer kept gathered (held whole: keep_frozen_bytes), saved
  // from and loaded into either layout.
  using zero_test::make_spec;
  for (int variant = 1; variant <= 4; ++variant) {
    const int stage = std::min(variant, 3);
    const bool kept = variant == 4;
    auto request_of = [&](std::vector<parameter_spec> p, bool keep) {
      plan_request q = request(std::move(p), stage, 16, 1);
      q.keep_frozen_bytes = keep ? zero::keep_all_frozen : 0;
      return q;
    };
    CAPTURE(stage);
    CAPTURE(kept);
    scratch_dir root("c19");
    std::vector<float> frozen(18);
    for (std::size_t j = 0; j < 18; ++j) frozen[j] = 1.5f - static_cast<float>(j) / 8.0f;
    auto params = [] {
      return std::vector<parameter_spec>{make_spec("w1", {4, 6}, "a"), make_spec("frozen", {6, 3}, "a", false),
                                         make_spec("w2", {3}, "b")};
    };
    local::launch(3, [&](communicator& comm) {
      sharded_model m(comm, request_of(params(), kept), model_options(sgd_momentum()));
      initialise(m);
      m.set_parameter(1, frozen);
      ck::checkpointer(root.path).save(m, {}, "c19");
    });
    const auto index = ck::read_index(root.path / "c19");
    const auto* f = index.find("frozen", ck::tensor_role::parameter);
    REQUIRE(f != nullptr);
    CHECK(f->shape == std::vector<std::uint64_t>{6, 3});
    CHECK(!f->trainable);
    CHECK(!f->fragments.empty());
    CHECK(index.find("frozen", ck::tensor_role::optimizer_state, 0) == nullptr);
    for (int world : {1, 2})
      local::launch(world, [&](communicator& comm) {
        sharded_model m(comm, request_of(params(), stage == 3 && world == 2 && !kept), model_options(sgd_momentum()));
        ck::load(m, root.path / "c19");
        std::vector<float> out(18);
        m.read_parameter(1, out);
        CHECK(out == frozen);
      });
  }
}

TEST_CASE(
    "C20: AdamW saved after step 10, resumed: step 11's loss equals the uninterrupted run's bit for bit, bias "
    "correction at 11") {
  auto loss = [](const std::vector<std::vector<float>>& params) {
    double s = 0;  // a loss of the parameters, summed in a fixed order
    for (const auto& p : params)
      for (float x : p) s += 0.5 * static_cast<double>(x) * x;
    return s;
  };
  scratch_dir root("c20");
  double straight = 0, resumed = 0, restarted_at_one = 0;
  std::uint64_t steps_after_load = 0, steps_after = 0;
  local::launch(2, [&](communicator& comm) {
    const int r = comm.rank();
    {
      sharded_model a(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
      initialise(a);
      train(a, r, 0, 11);
      const double l = loss(parameters_of(a));
      if (r == 0) straight = l;
    }
    {
      sharded_model b(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
      initialise(b);
      train(b, r, 0, 10);
      ck::checkpointer(root.path).save(b);
    }
    for (bool reset : {false, true}) {
      sharded_model c(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
      ck::load(c, root.path);
      if (r == 0 && !reset) steps_after_load = c.optimizer().steps();
      if (reset)
        zero::checkpoint_access(c).optimizer().set_steps(0);  // what a resume that lost the step count would do
      train(c, r, 10, 11);
      const double l = loss(parameters_of(c));
      if (r == 0) (reset ? restarted_at_one : resumed) = l;
      if (r == 0 && !reset) steps_after = c.optimizer().steps();
    }
  });
  CHECK(steps_after_load == 10);
  CHECK(steps_after == 11);
  CHECK(std::memcmp(&straight, &resumed, sizeof(double)) == 0);
  CHECK(restarted_at_one != straight);  // bias correction of step 1 gives another update
}

TEST_CASE("load_pretrained: a full-model safetensors file initialises a sharded model at any world size and stage") {
  using zero_test::make_spec;
  scratch_dir root("pretrained");
  // A file as another tool writes it: float32 "a" [5, 3], bfloat16 "b" [4] (converted), "tied" once.
  std::vector<float> a(15), t(6);
  for (std::size_t j = 0; j < a.size(); ++j) a[j] = static_cast<float>(j) / 3.0f;
  for (std::size_t j = 0; j < t.size(); ++j) t[j] = -static_cast<float>(j);
  std::vector<bfloat16> b = {bfloat16(1.5f), bfloat16(-2.0f), bfloat16(0.25f), bfloat16(3.0f)};
  const std::string header = ck::encode_safetensors_header(
      {{"a", dtype::float32, {5, 3}, 60}, {"b", dtype::bfloat16, {4}, 8}, {"emb", dtype::float32, {2, 3}, 24}},
      {{"format", "pt"}});
  std::string file = header;
  file.append(reinterpret_cast<const char*>(a.data()), 60);
  file.append(reinterpret_cast<const char*>(b.data()), 8);
  file.append(reinterpret_cast<const char*>(t.data()), 24);
  write_text(root.path / "model.safetensors", file);
  for (int world : {1, 3})
    for (int stage : {0, 3})
      local::launch(world, [&](communicator& comm) {
        sharded_model m(
            comm,
            request({make_spec("a", {5, 3}, "u"), make_spec("b", {4}, "u"), make_spec("emb", {2, 3}, "u", true, "tie"),
                     make_spec("head", {2, 3}, "v", true, "tie")},
                    stage),
            model_options(adamw()));
        ck::load_pretrained(m, root.path / "model.safetensors");
        std::vector<float> ra(15), rb(4), rh(6);
        m.read_parameter(0, ra);
        m.read_parameter(1, rb);
        m.read_parameter(3, rh);
        CHECK(ra == a);
        CHECK(rb == std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f});
        CHECK(rh == t);
      });
}

namespace {
/// The C16-style loop for bfloat16 parameters and gradients (float32 master weights): one unit,
/// gathered around each step's forward and backward.
void train_bf16(sharded_model& m, int rank, int first, int last) {
  for (int step = first; step < last; ++step) {
    m.pre_forward(0);
    m.post_forward(0);
    m.pre_backward(0);
    for (std::size_t p = 0; p < m.parameter_count(); ++p) {
      auto w = m.parameter<bfloat16>(p);
      auto g = m.gradient<bfloat16>(p);
      for (std::size_t j = 0; j < g.size(); ++j)
        g[j] = bfloat16(static_cast<float>(g[j]) +
                        zero_test::gradient_term(rank, 0, step, p, j, 0, static_cast<float>(w[j]), 0, false));
    }
    m.post_backward(0);
    m.step();
  }
}
plan_request bf16_request(int stage) {
  using zero_test::make_spec;
  plan_request q = request({make_spec("a", {9, 7}, "u"), make_spec("b", {5}, "u"), make_spec("c", {33}, "u")}, stage);
  q.precision = precision::bfloat16_adam();
  return q;
}
}  // namespace

TEST_CASE(
    "bfloat16 parameters with float32 master weights: master weights saved, resume exact at stages 0-3, reshard 2 -> "
    "3") {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    scratch_dir root("bf16");
    std::vector<std::vector<float>> straight, resumed, resharded;
    local::launch(2, [&](communicator& comm) {
      const int r = comm.rank();
      {
        sharded_model a(comm, bf16_request(stage), model_options(adamw()));
        initialise(a);
        train_bf16(a, r, 0, 4);
        auto p = parameters_of(a);
        if (r == 0) straight = p;
      }
      {
        sharded_model b(comm, bf16_request(stage), model_options(adamw()));
        initialise(b);
        train_bf16(b, r, 0, 2);
        ck::checkpointer(root.path).save(b);
      }
      sharded_model c(comm, bf16_request(stage), model_options(adamw()));
      ck::load(c, root.path);
      train_bf16(c, r, 2, 4);
      auto p = parameters_of(c);
      if (r == 0) resumed = p;
    });
    CHECK(same_bits(straight, resumed));
    const auto index = ck::read_index(ck::resolve_checkpoint(root.path));
    const auto* master = index.find("a", ck::tensor_role::master);
    REQUIRE(master != nullptr);
    CHECK(master->type == dtype::float32);
    CHECK(index.find("a", ck::tensor_role::parameter)->type == dtype::bfloat16);
    // The master weights carry more than the bfloat16 parameters: a reshard keeps them bitwise.
    scratch_dir again("bf16-again");
    local::launch(3, [&](communicator& comm) {
      sharded_model m(comm, bf16_request(3), model_options(adamw()));
      ck::load(m, root.path);
      ck::checkpointer(again.path).save(m, {}, "again");
    });
    CHECK(full_tensors(again.path / "again") == full_tensors(root.path));
  }
}

TEST_CASE("background_writer: one kept thread runs each task; wait returns after it; destruction runs a queued one") {
  std::thread::id first, second;
  int value = 0;
  {
    ck::detail::background_writer w;
    w.wait();  // nothing handed yet: returns at once
    w.start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      first = std::this_thread::get_id();
      value = 1;
    });
    w.wait();
    CHECK(value == 1);
    w.start([&] {
      second = std::this_thread::get_id();
      value = 2;
    });
    w.wait();
    CHECK(value == 2);
    CHECK(first == second);  // the same thread, kept
    CHECK(first != std::this_thread::get_id());
    w.start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      value = 3;
    });
  }  // no wait(): the destructor lets the task finish before the thread ends
  CHECK(value == 3);
}

namespace {
/// The loop above for float16 parameters and gradients with dynamic loss scaling: the gradients
/// arrive multiplied by the model's loss scale; in step `overflow` rank 1 adds 70000 x scale to
/// one element (beyond float16's range). Returns the scale after each step.
std::vector<double> train_f16(sharded_model& m, int rank, int first, int last, int overflow) {
  std::vector<double> scales;
  for (int step = first; step < last; ++step) {
    const float scale = static_cast<float>(m.loss_scale());
    m.pre_forward(0);
    m.post_forward(0);
    m.pre_backward(0);
    for (std::size_t p = 0; p < m.parameter_count(); ++p) {
      auto w = m.parameter<float16>(p);
      auto g = m.gradient<float16>(p);
      for (std::size_t j = 0; j < g.size(); ++j)
        g[j] = float16(static_cast<float>(g[j]) +
                       zero_test::gradient_term(rank, 0, step, p, j, 0, static_cast<float>(w[j]), 0, false) * scale);
      if (step == overflow && rank == 1 && p == 0) g[0] = float16(static_cast<float>(g[0]) + 70000.0f * scale);
    }
    m.post_backward(0);
    m.step();
    scales.push_back(m.loss_scale());
  }
  return scales;
}
plan_request f16_request(int stage) {
  plan_request q = bf16_request(stage);
  q.precision = precision::mixed_adam();
  return q;
}
sharded_model_options scaled_options() {
  sharded_model_options o = model_options(adamw());
  o.loss_scaling.enabled = true;
  o.loss_scaling.initial_scale = 1024;
  o.loss_scaling.growth_interval = 3;
  return o;
}
}  // namespace

TEST_CASE(
    "dynamic loss scaling: the scale and the good-step count are saved and restored, resume exact at stages 0-3") {
  // Interval 3, overflow in step 1: after 4 steps the scale is 512 with 2 good steps; the next
  // (first resumed) step grows it to 1024. An index without the count (older) restores 0.
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    scratch_dir root("loss-scale");
    std::vector<std::vector<float>> straight, resumed;
    std::vector<double> straight_scales, resumed_scales;
    double loaded_scale = 0;
    std::uint64_t loaded_good = 99;
    local::launch(2, [&](communicator& comm) {
      const int r = comm.rank();
      {
        sharded_model a(comm, f16_request(stage), scaled_options());
        initialise(a);
        auto s = train_f16(a, r, 0, 6, 1);
        auto p = parameters_of(a);
        if (r == 0) straight = p, straight_scales = s;
      }
      {
        sharded_model b(comm, f16_request(stage), scaled_options());
        initialise(b);
        train_f16(b, r, 0, 4, 1);
        ck::checkpointer(root.path).save(b);
      }
      sharded_model c(comm, f16_request(stage), scaled_options());
      const ck::training_progress progress = ck::load(c, root.path);
      if (r == 0) loaded_scale = c.loss_scale(), loaded_good = c.scaler().good_steps();
      CHECK(progress.loss_scale == 512.0);
      CHECK(progress.loss_scale_good_steps == 2);
      auto s = train_f16(c, r, 4, 6, 1);
      auto p = parameters_of(c);
      if (r == 0) resumed = p, resumed_scales = s;
    });
    CHECK(straight_scales == std::vector<double>{1024, 512, 512, 512, 1024, 1024});
    CHECK(loaded_scale == 512);
    CHECK(loaded_good == 2);
    CHECK(resumed_scales == std::vector<double>{1024, 1024});
    CHECK(same_bits(straight, resumed));
    // An index written before the count existed: the scale restored, the count 0.
    const fs::path index_path = latest_dir(root.path) / "index.json";
    auto j = nlohmann::json::parse(read_text(index_path));
    CHECK(j["progress"]["loss_scale_good_steps"] == 2);
    j["progress"].erase("loss_scale_good_steps");
    ck::seal_index(j);
    write_text(index_path, j.dump());
    CHECK(ck::training_progress::from_json(j["progress"], "x").loss_scale_good_steps == 0);
    local::launch(3, [&](communicator& comm) {  // resharded to 3 ranks, stage 3
      sharded_model m(comm, f16_request(3), scaled_options());
      (void)ck::load(m, root.path);
      CHECK(m.loss_scale() == 512);
      CHECK(m.scaler().good_steps() == 0);
    });
  }
}

TEST_CASE("stage 3 reshard_after_forward: saved after an evaluation pass, loaded over kept units, no stale view") {
  for (reshard_policy policy : {reshard_policy::except_last, reshard_policy::none}) {
    CAPTURE(reshard_policy_name(policy));
    scratch_dir root("kept");
    local::launch(2, [&](communicator& comm) {
      plan_request q = request(zero_test::test_parameters(), 3, 16, adamw().state_count());
      q.reshard_after_forward = policy;
      sharded_model m(comm, q, model_options(adamw()));
      initialise(m);
      train(m, comm.rank(), 0, 2);
      auto evaluate = [&] {  // forwards only: the policy keeps units gathered afterwards
        for (std::size_t u = 0; u < m.unit_count(); ++u) {
          m.pre_forward(u);
          m.post_forward(u);
        }
      };
      evaluate();
      REQUIRE(m.between_steps());
      const auto saved = parameters_of(m);
      ck::checkpointer(root.path).save(m, {});
      train(m, comm.rank(), 2, 3);
      evaluate();  // kept units now hold the parameters of step 3
      CHECK_FALSE(same_bits(parameters_of(m), saved));
      (void)ck::load(m, root.path);
      CHECK(same_bits(parameters_of(m), saved));
      const std::size_t last = m.unit_count() - 1;  // kept under either policy, if not released
      m.pre_forward(last);
      const std::size_t l3 = m.index("l3.w");
      const auto view = m.parameter<float>(l3);
      CHECK(std::vector<float>(view.begin(), view.end()) == saved[l3]);
      m.post_forward(last);
    });
  }
}

TEST_CASE("the device path (simulated device) saves and loads through its stream, exactly, to and from the host path") {
  // A host-path model trained 3 steps and saved. Device-path models (a host execution stream over
  // the asynchronous host stream, each operation delayed) at another stage load it with the
  // optimizer's states: copied in, never exchanged (the model keeps its buffers); they save it
  // again, with save and async_save. Host-path models load those and 3 more steps give the bits
  // of 6 straight steps.
  struct delayed {  // every host stream operation 50 us late, for this test only
    delayed() { ::setenv("RINGZERO_HOST_STREAM_DELAY_US", "50", 1); }
    ~delayed() { ::unsetenv("RINGZERO_HOST_STREAM_DELAY_US"); }
  } delay;
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    scratch_dir root("device_path");
    const optimizer_options o = adamw();
    std::vector<std::vector<std::vector<float>>> straight(2), at_three(2), loaded(2);
    std::vector<std::vector<std::vector<std::vector<float>>>> resumed(2);
    local::launch(2, [&](communicator& comm) {
      const int r = comm.rank();
      const auto ri = static_cast<std::size_t>(r);
      auto host_model = [&](int s) {
        return std::make_unique<sharded_model>(comm, request(zero_test::test_parameters(), s, 16, o.state_count()),
                                               model_options(o));
      };
      {
        auto a = host_model(stage);
        initialise(*a);
        train(*a, r, 0, 6);
        straight[ri] = parameters_of(*a);
      }
      {
        auto b = host_model(stage);
        initialise(*b);
        train(*b, r, 0, 3);
        at_three[ri] = parameters_of(*b);
        ck::checkpointer(root.path).save(*b, {}, "host");
      }
      {
        primitive::host_stream compute;
        host_execution_stream stream(compute);
        sharded_model d(comm, request(zero_test::test_parameters(), stage == 1 ? 3 : 2, 16, o.state_count()),
                        device_context{&stream}, model_options(o));
        CHECK(zero::checkpoint_access(d).through_stream());
        const unsigned char* before = zero::checkpoint_access(d).held_parameters(0);
        (void)ck::load(d, root.path / "host");
        CHECK(zero::checkpoint_access(d).held_parameters(0) == before);  // copied in, not exchanged
        CHECK(d.optimizer().steps() == 3);
        loaded[ri] = parameters_of(d);
        ck::checkpointer(root.path).save(d, {}, "device");
        ck::checkpointer saver(root.path);
        saver.async_save(d, {}, "device-async");
        saver.wait();
      }
      for (const char* name : {"device", "device-async"}) {
        auto c = host_model(stage);
        (void)ck::load(*c, root.path / name);
        CHECK(c->optimizer().steps() == 3);
        train(*c, r, 3, 6);
        resumed[ri].push_back(parameters_of(*c));
      }
    });
    for (std::size_t r = 0; r < 2; ++r) {
      CHECK(same_bits(loaded[r], at_three[r]));
      for (const auto& run : resumed[r]) CHECK(same_bits(run, straight[r]));
    }
  }
}
