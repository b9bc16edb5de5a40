// Bad input is refused on every rank with an error naming the file, tensor and rank, and a
// failed load leaves the model exactly as it was: truncated files, flipped bytes, a missing rank
// file, a checkpoint of another model, a newer format version, fragments that do not tile a
// tensor (C17), another optimizer, a load or save in the middle of a step, ranks disagreeing on
// the progress, and a disk that fills up during a save (never a checkpoint marked complete).
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "checkpoint_test_util.hpp"

using namespace ckpt_test;
namespace ck = ringzero::checkpoint;

namespace {

/// A checkpoint of the test model (stage 3, AdamW, 2 steps, 2 ranks) in `root`/good.
void save_good(const fs::path& root) {
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    train(m, comm.rank(), 0, 2);
    ck::checkpointer(root).save(m, {}, "good");
  });
}

/// Copies `root`/good to a fresh `root`/<name> and returns it.
fs::path copy_of(const fs::path& root, const std::string& name) {
  fs::remove_all(root / name);
  fs::copy(root / "good", root / name, fs::copy_options::recursive);
  return root / name;
}

/// Loads `dir` on `world` ranks into a model that trained one step of its own; checks that the
/// load threw on every rank, that the model is unchanged, and returns rank 0's message.
std::string refused_load(const fs::path& dir, int world,
                         std::vector<parameter_spec> params = zero_test::test_parameters(),
                         optimizer_options o = adamw(), ck::load_options options = {}) {
  std::vector<int> unchanged(static_cast<std::size_t>(world), 0);
  const auto errors = errors_on_every_rank(world, [&](communicator& comm) {
    sharded_model m(comm, request(params, 3, 16, o.state_count()), model_options(o));
    initialise(m);
    train(m, comm.rank(), 5, 6);
    const auto before = parameters_of(m);
    const std::uint64_t steps = m.optimizer().steps();
    try {
      ck::load(m, dir, options);
    } catch (...) {
      unchanged[static_cast<std::size_t>(comm.rank())] =
          same_bits(before, parameters_of(m)) && m.optimizer().steps() == steps;
      throw;
    }
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(!errors[static_cast<std::size_t>(r)].empty());
    CHECK(unchanged[static_cast<std::size_t>(r)] == 1);
  }
  return errors[0];
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void edit_index(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_text(dir / "index.json"));
  edit(j);
  write_text(dir / "index.json", j.dump());
}

}  // namespace

TEST_CASE("refusals of damaged checkpoints and of checkpoints of another model; the model is unchanged") {
  scratch_dir root("refuse");
  save_good(root.path);
  const auto index = ck::read_index(root.path / "good");
  const std::string file0 = ck::shard_file_name(0, 2), file1 = ck::shard_file_name(1, 2);

  SUBCASE("a truncated shard file") {
    const fs::path dir = copy_of(root.path, "truncated");
    fs::resize_file(dir / file1, fs::file_size(dir / file1) - 10);
    const std::string e = refused_load(dir, 2);
    CHECK(contains(e, file1));
    CHECK(contains(e, "truncated"));
    CHECK(contains(e, "rank 1"));
  }
  SUBCASE("a flipped byte: checksum mismatch naming file, tensor and fragment") {
    const fs::path dir = copy_of(root.path, "flipped");
    const auto* t = index.find("l1.w", ck::tensor_role::optimizer_state, 1);
    REQUIRE(t != nullptr);
    const auto& f = t->fragments.back();
    std::string bytes = read_text(dir / index.files[f.file].name);
    bytes[static_cast<std::size_t>(f.offset + 3)] ^= 0x10;
    write_text(dir / index.files[f.file].name, bytes);
    const std::string e = refused_load(dir, 3);
    CHECK(contains(e, "checksum mismatch"));
    CHECK(contains(e, index.files[f.file].name));
    CHECK(contains(e, "'l1.w' (optimizer_state 1, exp_avg_sq)"));
    // The reader alone (what a verify tool runs) finds it too.
    const auto damaged = ck::read_index(dir);
    ck::fragment_reader reader(dir, damaged);
    CHECK_THROWS_WITH_AS(reader.verify_all(), doctest::Contains("checksum mismatch"), ringzero::error);
  }
  SUBCASE("a missing rank file") {
    const fs::path dir = copy_of(root.path, "missing");
    fs::remove(dir / file1);
    const std::string e = refused_load(dir, 2);
    CHECK(contains(e, "shard file of rank 1 is missing"));
    CHECK(contains(e, file1));
  }
  SUBCASE("a newer format version") {
    const fs::path dir = copy_of(root.path, "newer");
    edit_index(dir, [](nlohmann::json& j) { j["format_version"] = ck::format_version + 1; });
    const std::string e = refused_load(dir, 2);
    CHECK(contains(e, "format version 2 was written by a newer ringzero"));
    CHECK(contains(e, "index.json"));
  }
  SUBCASE("C17: fragment ranges that do not tile a tensor") {
    const fs::path dir = copy_of(root.path, "tiling");
    edit_index(dir, [](nlohmann::json& j) {
      for (auto& t : j["tensors"])
        if (t["name"] == "l1.w" && t["role"] == "parameter") t["fragments"].erase(t["fragments"].begin());
    });
    const std::string e = refused_load(dir, 2);
    CHECK(contains(e, "the fragments of tensor 'l1.w' (parameter) do not tile it"));
    CHECK(contains(e, "are held by no fragment"));
  }
  SUBCASE("overlapping fragments") {
    const fs::path dir = copy_of(root.path, "overlap");
    edit_index(dir, [](nlohmann::json& j) {
      for (auto& t : j["tensors"])
        if (t["name"] == "l1.w" && t["role"] == "parameter")
          t["fragments"][1]["range"][0] = t["fragments"][0]["range"][1].get<int>() - 1;
    });
    CHECK(contains(refused_load(dir, 2), "are held twice"));
  }
  SUBCASE("another model: a different shape") {
    auto params = zero_test::test_parameters();
    params[1].shape = {9, 5};
    const std::string e = refused_load(root.path / "good", 2, params);
    CHECK(contains(e, "'l1.w' (parameter) has shape [5, 9] in the checkpoint, the model expects [9, 5]"));
  }
  SUBCASE("another model: a parameter the checkpoint lacks, and one the model lacks") {
    auto params = zero_test::test_parameters();
    params.push_back(zero_test::make_spec("extra", {3}, "u3"));
    CHECK(contains(refused_load(root.path / "good", 2, params), "needs tensor 'extra' (parameter)"));
    auto fewer = zero_test::test_parameters();
    fewer.pop_back();
    CHECK(contains(refused_load(root.path / "good", 2, fewer),
                   "holds parameter 'l3.w' [13], which the model does not have"));
  }
  SUBCASE("another optimizer: refused with states, accepted for the parameters only") {
    const std::string e = refused_load(root.path / "good", 2, zero_test::test_parameters(), sgd_momentum());
    CHECK(contains(e, "'momentum_buffer' for the model's optimizer but 'exp_avg'"));
    local::launch(2, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), 1, 16, 1), model_options(sgd_momentum()));
      ck::load_options params_only;
      params_only.optimizer_state = false;
      ck::load(m, root.path / "good", params_only);
      CHECK(m.optimizer().steps() == 0);
    });
  }
  SUBCASE("no checkpoint at all") {
    fs::create_directories(root.path / "empty");
    CHECK(contains(refused_load(root.path / "empty", 2), "holds no complete checkpoint"));
  }
}

TEST_CASE("a load or save in the middle of a step is refused on every rank") {
  scratch_dir root("midstep");
  save_good(root.path);
  const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
    (void)m.gradient<float>(1);  // a micro-batch has begun
    ck::load(m, root.path / "good");
  });
  CHECK(contains(errors[0], "between steps"));
  CHECK(contains(errors[1], "between steps"));
  const auto save_errors = errors_on_every_rank(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
    (void)m.gradient<float>(1);
    ck::checkpointer(root.path).save(m, {}, "midstep");
  });
  CHECK(contains(save_errors[0], "between steps"));
  CHECK(contains(save_errors[1], "between steps"));
  CHECK(!fs::exists(root.path / "midstep"));
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("good"));
}

TEST_CASE("ranks passing different training progress or names are refused; nothing is committed") {
  scratch_dir root("disagree");
  const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 1), model_options(adamw()));
    ck::training_progress p;
    p.epoch = static_cast<std::uint64_t>(comm.rank());
    ck::checkpointer(root.path).save(m, p, "x");
  });
  CHECK(contains(errors[0], "rank 1 passed another training_progress"));
  CHECK(contains(errors[1], "rank 1 passed another training_progress"));
  const auto names = errors_on_every_rank(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 1), model_options(adamw()));
    ck::checkpointer(root.path).save(m, {}, comm.rank() == 0 ? "a" : "b");
  });
  CHECK(contains(names[1], "named the checkpoint differently"));
  CHECK(!ck::read_latest(root.path));
  CHECK(ck::complete_checkpoints(root.path).empty());
}

TEST_CASE("a disk that fills up during a save: an error naming the file on every rank, no checkpoint marked complete") {
  // A file size limit (RLIMIT_FSIZE) in a child process stands for a full disk: writes past it
  // fail with EFBIG as they would with ENOSPC.
  scratch_dir root("full");
  save_good(root.path);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int code = 0;
    try {
      std::vector<std::string> errors(2);
      local::launch(2, [&](communicator& comm) {
        try {
          auto params = zero_test::test_parameters();
          params.push_back(zero_test::make_spec("big", {4000}, "u3"));  // every rank's file outgrows the limit
          sharded_model m(comm, request(params, 0), model_options(adamw()));
          initialise(m);
          ck::checkpointer(root.path).save(m, {}, "full");
        } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
      });
      for (const auto& e : errors)
        if (!contains(e, "was not saved") || !contains(e, ".safetensors") || !contains(e, "File too large")) {
          std::fprintf(stderr, "unexpected error text: %s\n", e.c_str());
          code = 1;
        }
    } catch (...) { code = 2; }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(!fs::exists(root.path / "full"));
  CHECK(!fs::exists(root.path / ".tmp.full"));
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("good"));
}

TEST_CASE("a failure of rank 0's commit is raised on every rank with the same text, naming the file and rank 0") {
  // A directory where rank 0 must create a file makes that create fail (EISDIR, also as root):
  // index.json in the temporary directory, then the new `latest` before its rename.
  scratch_dir root("commit");
  save_good(root.path);
  for (const std::string blocked : {"index", "latest"}) {
    CAPTURE(blocked);
    const std::string name = "commit-" + blocked;
    const fs::path in_the_way = blocked == "index" ? ck::temporary_directory(root.path, name) / "index.json"
                                                   : ck::latest_temporary_file(root.path, name);
    fs::create_directories(in_the_way);
    for (int world : {2, 3}) {
      CAPTURE(world);
      const auto errors = errors_on_every_rank(world, [&](communicator& comm) {
        sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
        initialise(m);
        train(m, comm.rank(), 0, 1);
        ck::checkpointer(root.path).save(m, {}, name);
      });
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(errors[static_cast<std::size_t>(r)] == errors[0]);
      }
      CHECK(contains(errors[0], "commit"));
      CHECK(contains(errors[0], "rank 0: "));
      CHECK(contains(errors[0], in_the_way.string()));
      CHECK(contains(errors[0], "Is a directory"));
      CHECK(ck::read_latest(root.path) == std::optional<std::string>("good"));
      CHECK(!fs::exists(root.path / name));  // nothing of the new checkpoint is complete or left
      CHECK(!fs::exists(ck::temporary_directory(root.path, name)));
      CHECK(!fs::exists(ck::latest_temporary_file(root.path, name)));
      fs::create_directories(in_the_way);  // the cleanup removed it
    }
    fs::remove_all(in_the_way);
  }
  // The same roots save normally once nothing is in the way.
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    ck::checkpointer(root.path).save(m, {}, "after");
  });
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("after"));
}
