// Bad input is refused on every rank with an error naming the file, tensor and rank, and a
// failed load leaves the model exactly as it was: truncated files, flipped bytes, a missing rank
// file, a checkpoint of another model, a newer format version, fragments that do not tile a
// tensor (C17), another optimizer, a load or save in the middle of a step, ranks disagreeing on
// the progress, and a disk that fills up during a save (never a checkpoint marked complete).
// And what no one may break (issue 33): one saver per root, special files at every input and
// output role, resume without `latest`, an index bound to its contents.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

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

/// A copy of `root`/good named `name` with one bit flipped in the last fragment of 'l1.w''s
/// exp_avg_sq; returns its directory and that fragment's file name.
std::pair<fs::path, std::string> flipped_copy(const fs::path& root, const std::string& name,
                                              const ck::checkpoint_index& index) {
  const fs::path dir = copy_of(root, name);
  const auto* t = index.find("l1.w", ck::tensor_role::optimizer_state, 1);
  REQUIRE(t != nullptr);
  const auto& f = t->fragments.back();
  std::string bytes = read_text(dir / index.files[f.file].name);
  bytes[static_cast<std::size_t>(f.offset + 3)] ^= 0x10;
  write_text(dir / index.files[f.file].name, bytes);
  return {dir, index.files[f.file].name};
}

void edit_index(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_text(dir / "index.json"));
  edit(j);
  ck::seal_index(j);  // an edit made on purpose: the refusals below are the load's, not the seal's
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
    const auto [dir, file] = flipped_copy(root.path, "flipped", index);
    const std::string e = refused_load(dir, 3);
    CHECK(contains(e, "checksum mismatch"));
    CHECK(contains(e, file));
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

TEST_CASE(
    "load_options::in_place: refused unchanged before any read; a damaged chunk says so on every rank; load again") {
  scratch_dir root("in-place-refuse");
  save_good(root.path);
  const auto index = ck::read_index(root.path / "good");
  const std::string file1 = ck::shard_file_name(1, 2);
  ck::load_options in_place;
  in_place.in_place = true;
  // Found before reading (the index, the files' sizes, the model's tensors): the state is unchanged.
  {
    const fs::path dir = copy_of(root.path, "truncated");
    fs::resize_file(dir / file1, fs::file_size(dir / file1) - 10);
    const std::string e = refused_load(dir, 3, zero_test::test_parameters(), adamw(), in_place);
    CHECK(contains(e, "the state is unchanged"));
    CHECK(contains(e, "truncated"));
    fs::remove(dir / file1);
    CHECK(contains(refused_load(dir, 2, zero_test::test_parameters(), adamw(), in_place),
                   "shard file of rank 1 is missing"));
    auto params = zero_test::test_parameters();
    params[1].shape = {9, 5};
    CHECK(contains(refused_load(root.path / "good", 2, params, adamw(), in_place), "the state is unchanged"));
  }
  // Found while reading (a checksum): every rank is told that the state may be overwritten, and a
  // load of a good checkpoint afterwards gives the state a fresh model gets.
  const fs::path dir = flipped_copy(root.path, "flipped", index).first;
  std::vector<int> recovered(3, 0);
  const auto errors = errors_on_every_rank(3, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    sharded_model fresh(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    train(m, comm.rank(), 5, 6);
    std::string message;
    try {
      ck::load(m, dir, in_place);
    } catch (const ringzero::error& e) { message = e.what(); }
    ck::load(m, root.path / "good", in_place);
    ck::load(fresh, root.path / "good");
    recovered[static_cast<std::size_t>(comm.rank())] = same_bits(parameters_of(m), parameters_of(fresh)) &&
                                                       optimizer_bytes(m) == optimizer_bytes(fresh) &&
                                                       m.optimizer().steps() == 2;
    if (!message.empty()) throw ringzero::error(ringzero::errc::io_error, message);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const std::string& e = errors[static_cast<std::size_t>(r)];
    CHECK(contains(e, "the state may be partly overwritten (load_options::in_place)"));
    CHECK(contains(e, "checksum mismatch"));
    CHECK(recovered[static_cast<std::size_t>(r)] == 1);
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
  // A directory where rank 0 must create a file makes that create fail (refused by name, also as
  // root): index.json in the temporary directory, then the new `latest` before its rename. Rank 0
  // puts it there after `open` (which removes what interrupted saves left in the root).
  scratch_dir root("commit");
  save_good(root.path);
  for (const std::string blocked : {"index", "latest"}) {
    CAPTURE(blocked);
    const std::string name = "commit-" + blocked;
    const fs::path in_the_way = blocked == "index" ? ck::temporary_directory(root.path, name) / "index.json"
                                                   : ck::latest_temporary_file(root.path, name);
    for (int world : {2, 3}) {
      CAPTURE(world);
      const auto errors = errors_on_every_rank(world, [&](communicator& comm) {
        sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
        initialise(m);
        train(m, comm.rank(), 0, 1);
        ck::checkpointer saver(root.path);
        saver.open(m);
        if (comm.rank() == 0) fs::create_directories(in_the_way);
        saver.save(m, {}, name);
      });
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(errors[static_cast<std::size_t>(r)] == errors[0]);
      }
      CHECK(contains(errors[0], "commit"));
      CHECK(contains(errors[0], "rank 0: "));
      CHECK(contains(errors[0], in_the_way.string()));
      CHECK(contains(errors[0], "it is a directory"));
      CHECK(ck::read_latest(root.path) == std::optional<std::string>("good"));
      CHECK(!fs::exists(root.path / name));  // nothing of the new checkpoint is complete or left
      CHECK(!fs::exists(ck::temporary_directory(root.path, name)));
      CHECK(!fs::exists(ck::latest_temporary_file(root.path, name)));
    }
  }
  // The same roots save normally once nothing is in the way.
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    initialise(m);
    ck::checkpointer(root.path).save(m, {}, "after");
  });
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("after"));
}

// ---------------------------------------------------------------- issue 33: nobody can break them

TEST_CASE("one saver per root: a second job is refused at once naming the holder; the first's checkpoints stay whole") {
  scratch_dir root("two-savers");
  const std::string pid = "pid " + std::to_string(::getpid());
  for (int trial = 0; trial < 20; ++trial) {
    CAPTURE(trial);
    const std::string mine = "a-" + std::to_string(trial), theirs = "b-" + std::to_string(trial);
    std::atomic<int> opened{0};
    std::atomic<bool> refused{false};
    std::vector<std::vector<float>> saved;
    std::thread first([&] {
      local::launch(2, [&](communicator& comm) {
        sharded_model m(comm, request(zero_test::test_parameters(), 1 + trial % 3), model_options(adamw()));
        initialise(m);
        train(m, comm.rank(), 0, 1 + trial % 2);
        ck::checkpointer ckpt(root.path);
        ckpt.open(m);
        ++opened;
        while (!refused.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ckpt.save(m, {}, mine);
        auto values = parameters_of(m);  // a collective at stage 3
        if (comm.rank() == 0) saved = std::move(values);
      });
    });
    while (opened.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::set<std::string> before;
    for (const auto& e : fs::directory_iterator(root.path)) before.insert(e.path().filename().string());
    const auto t0 = std::chrono::steady_clock::now();
    const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
      initialise(m);
      ck::checkpointer(root.path).save(m, {}, theirs);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::set<std::string> after;
    for (const auto& e : fs::directory_iterator(root.path)) after.insert(e.path().filename().string());
    refused = true;
    first.join();
    CHECK(seconds < 5.0);
    for (const std::string& e : errors) {
      CAPTURE(e);
      CHECK(contains(e, "'" + root.path.string() + "' is in use by another saver"));
      CHECK(contains(e, pid));
      CHECK(contains(e, "rank 0: "));
    }
    CHECK(before == after);  // the refused job wrote nothing, removed nothing
    CHECK(ck::read_latest(root.path) == std::optional<std::string>(mine));
    CHECK(!fs::exists(root.path / theirs));
    CHECK_NOTHROW((void)full_tensors(root.path));  // every chunk verified
    // The saved values load back bit for bit.
    local::launch(2, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
      (void)ck::load(m, root.path);
      const auto loaded = parameters_of(m);
      if (comm.rank() == 0) CHECK(same_bits(saved, loaded));
    });
  }
}

TEST_CASE("a lock dies with its holder: a killed saver's lock is taken over, and the record names the new holder") {
  scratch_dir root("lock-killed");
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    int code = 0;
    try {
      ck::root_lock held = ck::root_lock::acquire(root.path);
      char go = 'L';
      if (::write(fds[1], &go, 1) != 1) code = 3;
      ::pause();  // killed here, holding the lock
    } catch (...) { code = 2; }
    ::_exit(code);
  }
  ::close(fds[1]);
  char go = 0;
  REQUIRE(::read(fds[0], &go, 1) == 1);
  ::close(fds[0]);
  std::string refusal;
  try {
    (void)ck::root_lock::acquire(root.path);
  } catch (const error& e) { refusal = e.what(); }
  CHECK(contains(refusal, "in use by another saver (host "));
  CHECK(contains(refusal, "pid " + std::to_string(child) + " since "));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  ck::root_lock taken = ck::root_lock::acquire(root.path);
  CHECK(taken.held());
  CHECK(contains(read_text(root.path / ".lock"), "pid " + std::to_string(::getpid()) + " since "));
  // Two locks in one process exclude each other too; released, the lock is free again.
  CHECK_THROWS_AS((void)ck::root_lock::acquire(root.path), error);
  taken.release();
  CHECK(ck::root_lock::acquire(root.path).held());
  // The lock file is never taken as a checkpoint, and a root that is not a directory is refused by name.
  CHECK(ck::complete_checkpoints(root.path).empty());
  write_text(root.path / "file", "x");
  const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
    ck::checkpointer(root.path / "file").open(m);  // before any training step
  });
  for (const std::string& e : errors) {
    CHECK(contains(e, "cannot save into '" + (root.path / "file").string() + "'"));
    CHECK(contains(e, "rank 0: "));
  }
}

TEST_CASE("a FIFO or directory at every input role is refused within a second, naming it; never a blocking open") {
  scratch_dir root("fifo");
  save_good(root.path);
  auto fast = [](const std::function<void()>& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      fn();
    } catch (const error& e) { message = e.what(); }
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
    return message;
  };
  // `latest`.
  const fs::path r1 = root.path / "r1";
  fs::create_directories(r1);
  fs::copy(root.path / "good", r1 / "good", fs::copy_options::recursive);
  REQUIRE(::mkfifo((r1 / "latest").c_str(), 0644) == 0);
  CHECK(contains(fast([&] { (void)ck::find_checkpoint(r1); }), "'" + (r1 / "latest").string() + "': it is a FIFO"));
  // index.json.
  const fs::path r2 = copy_of(root.path, "r2");
  fs::remove(r2 / "index.json");
  REQUIRE(::mkfifo((r2 / "index.json").c_str(), 0644) == 0);
  CHECK(contains(fast([&] { (void)ck::read_index(r2); }), "it is a FIFO"));
  // A rank's shard file, at a load.
  const fs::path r3 = copy_of(root.path, "r3");
  const std::string shard = ck::shard_file_name(1, 2);
  fs::remove(r3 / shard);
  REQUIRE(::mkfifo((r3 / shard).c_str(), 0644) == 0);
  CHECK(contains(refused_load(r3, 2), "'" + (r3 / shard).string() + "': it is a FIFO"));
  fs::remove(r3 / shard);
  fs::create_directories(r3 / shard);
  CHECK(contains(refused_load(r3, 2), "it is a directory"));
  // --init-from (a safetensors file of parameters).
  const fs::path fifo = root.path / "init.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const auto errors = errors_on_every_rank(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    (void)fast([&] { ck::load_pretrained(m, fifo); });
    ck::load_pretrained(m, fifo);
  });
  for (const std::string& e : errors) CHECK(contains(e, "it is a FIFO"));
}

TEST_CASE("consolidate refuses outputs that are not regular files and leaves nothing behind") {
  scratch_dir root("outputs");
  save_good(root.path);
  const fs::path out = root.path / "out";
  fs::create_directories(out / "dir");
  REQUIRE(::mkfifo((out / "fifo").c_str(), 0644) == 0);
  fs::create_symlink(out / "target.safetensors", out / "link");
  // A character device of our own (the numbers of /dev/null), where the system lets us make one.
  const bool device = ::mknod((out / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  auto listing = [&] {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(out)) names.insert(e.path().filename().string());
    return names;
  };
  const std::set<std::string> before = listing();
  auto refused = [&](const fs::path& output, ck::consolidate_options o = {}) {
    try {
      (void)ck::consolidate(root.path, output, o);
    } catch (const error& e) { return std::string(e.what()); }
    return std::string();
  };
  CHECK(contains(refused(out / "fifo"), "it is a FIFO"));
  CHECK(contains(refused(out / "dir"), "it is a directory"));
  CHECK(contains(refused(out / "link"), "is a symbolic link: refused"));
  CHECK(contains(refused(""), "the output path is empty"));
  ck::consolidate_options split;
  split.max_shard_bytes = 100;
  fs::create_directories(out / "model.safetensors.index.json");  // checked before any file is written
  CHECK(contains(refused(out / "model.safetensors", split), "it is a directory"));
  fs::remove(out / "model.safetensors.index.json");
  if (device) {
    CHECK(contains(refused(out / "null"), "it is a character device"));
    struct stat st {};
    REQUIRE(::lstat((out / "null").c_str(), &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
  }
  CHECK(listing() == before);  // nothing replaced, nothing left behind (no "*.tmp")
  CHECK(fs::is_fifo(fs::symlink_status(out / "fifo")));
  CHECK(!fs::exists(fs::current_path() / ".tmp"));
  // --force: a symbolic link's target is written, the link stays.
  ck::consolidate_options force;
  force.follow_symlink = true;
  CHECK(refused(out / "link", force) == "");
  CHECK(fs::is_symlink(fs::symlink_status(out / "link")));
  CHECK(fs::is_regular_file(fs::symlink_status(out / "target.safetensors")));
}

TEST_CASE("resume without `latest` takes the newest complete checkpoint; open removes leftovers") {
  // The state a job killed between its first checkpoint's rename and its first `latest` leaves.
  scratch_dir root("no-latest");
  save_good(root.path);
  const fs::path newer = copy_of(root.path, "newer-but-damaged");
  edit_index(newer, [](nlohmann::json& j) { j["progress"]["optimizer_steps"] = 99; });
  fs::remove(newer / ck::shard_file_name(1, 2));
  fs::remove(root.path / "latest");
  fs::create_directories(root.path / ".tmp.step-00000099");
  write_text(root.path / ".tmp.step-00000099" / "index.json", "{}");
  write_text(root.path / ".trash.old", "x");
  const ck::found_checkpoint found = ck::find_checkpoint(root.path);
  CHECK(found.directory == root.path / "good");
  CHECK(contains(found.note, "has no 'latest' pointer"));
  CHECK(contains(found.note, "took the newest complete checkpoint 'good'"));
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 3), model_options(adamw()));
    CHECK(ck::load(m, root.path).optimizer_steps == 2);
    ck::checkpointer saver(root.path);
    saver.open(m);
    if (comm.rank() == 0) {
      CHECK(!fs::exists(root.path / ".tmp.step-00000099"));
      CHECK(!fs::exists(root.path / ".trash.old"));
      CHECK(fs::exists(root.path / "newer-but-damaged"));  // damaged checkpoints are never removed automatically
    }
    saver.save(m, {}, "resumed");
  });
  CHECK(ck::read_latest(root.path) == std::optional<std::string>("resumed"));
  fs::remove_all(root.path / "good");
  fs::remove_all(root.path / "resumed");
  fs::remove(root.path / "latest");
  CHECK_THROWS_WITH_AS((void)ck::find_checkpoint(root.path), doctest::Contains("holds no complete checkpoint"), error);
}

TEST_CASE("the index is bound: an edit after the save is refused by read_index, verify and consolidate") {
  scratch_dir root("bound");
  save_good(root.path);
  const fs::path dir = root.path / "good";
  const std::string original = read_text(dir / "index.json");
  // A consistent edit (a tensor removed, the file otherwise valid) without the index's own checksum.
  auto j = nlohmann::json::parse(original);
  j["tensors"].erase(j["tensors"].size() - 1);
  write_text(dir / "index.json", j.dump());
  CHECK_THROWS_WITH_AS((void)ck::read_index(dir), doctest::Contains("its own checksum (index_xxh3) does not match"),
                       error);
  CHECK_THROWS_AS((void)ck::consolidate(root.path, root.path / "m.safetensors"), error);
  CHECK(!fs::exists(root.path / "m.safetensors"));
  // An editor who also resealed it: the tensors no longer give the model fingerprint.
  ck::seal_index(j);
  write_text(dir / "index.json", j.dump());
  CHECK_NOTHROW((void)ck::read_index(dir));
  CHECK_THROWS_WITH_AS((void)ck::consolidate(root.path, root.path / "m.safetensors"),
                       doctest::Contains("do not give its model fingerprint"), error);
  CHECK(!fs::exists(root.path / "m.safetensors"));
  write_text(dir / "index.json", original);
  CHECK(ck::read_index(dir).computed_model_fingerprint() == ck::read_index(dir).model_fingerprint);
}

TEST_CASE("what a second look found: nothing replaced that another writer or the user owns") {
  scratch_dir root("second-look");
  save_good(root.path);
  // consolidate: a user's file at the temporary path is never replaced; a split whose later
  // temporary is in the way replaces none of the earlier outputs.
  const fs::path out = root.path / "out";
  fs::create_directories(out);
  write_text(out / "m.safetensors.tmp", "the user's");
  CHECK_THROWS_WITH_AS((void)ck::consolidate(root.path, out / "m.safetensors"),
                       doctest::Contains("m.safetensors.tmp' exists"), error);
  CHECK(read_text(out / "m.safetensors.tmp") == "the user's");
  CHECK(!fs::exists(out / "m.safetensors"));
  ck::consolidate_options split;
  split.max_shard_bytes = 100;
  const ck::consolidate_result first = ck::consolidate(root.path, out / "s.safetensors", split);
  REQUIRE(first.files.size() >= 2);
  std::vector<std::string> before;
  for (const fs::path& f : first.files) before.push_back(read_text(f));
  const std::string index_before = read_text(*first.index_file);
  fs::path in_the_way = first.files.back();
  in_the_way += ".tmp";
  fs::create_directories(in_the_way);
  CHECK_THROWS_AS((void)ck::consolidate(root.path, out / "s.safetensors", split), error);
  for (std::size_t k = 0; k < first.files.size(); ++k) CHECK(read_text(first.files[k]) == before[k]);
  CHECK(read_text(*first.index_file) == index_before);
  fs::remove(in_the_way);
  for (const auto& e : fs::directory_iterator(out))  // no temporary left but the user's
    CHECK((!e.path().string().ends_with(".tmp") || e.path().filename() == "m.safetensors.tmp"));
  // reshard: never into a root another saver holds, never over an existing checkpoint.
  ck::reshard_options three;
  three.world_size = 3;
  const fs::path held = root.path / "held";
  {
    const ck::root_lock lock = ck::root_lock::acquire(held);
    CHECK_THROWS_WITH_AS((void)ck::reshard_offline(root.path, held, three),
                         doctest::Contains("in use by another saver"), error);
  }
  CHECK(!fs::exists(held / "good"));
  (void)ck::reshard_offline(root.path, held, three);
  const std::string index_three = read_text(held / "good" / "index.json");
  three.world_size = 5;
  CHECK_THROWS_WITH_AS((void)ck::reshard_offline(root.path, held, three),
                       doctest::Contains("exists and is never replaced"), error);
  CHECK(read_text(held / "good" / "index.json") == index_three);
  // open: a checkpoint directory given as the root, a special `latest`, a hard-linked lock file
  // and an oversized `latest` are refused by name.
  auto open_error = [&](const fs::path& where) {
    return errors_on_every_rank(2, [&](communicator& comm) {
      sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
      ck::checkpointer(where).open(m);
    })[1];
  };
  CHECK(contains(open_error(root.path / "good"), "is a checkpoint directory (it holds index.json)"));
  const fs::path fifo_root = root.path / "fifo-latest";
  fs::create_directories(fifo_root);
  REQUIRE(::mkfifo((fifo_root / "latest").c_str(), 0644) == 0);
  CHECK(contains(open_error(fifo_root), "it is a FIFO"));
  const fs::path linked = root.path / "linked";
  fs::create_directories(linked);
  write_text(root.path / "user.txt", "keep me");
  fs::create_hard_link(root.path / "user.txt", linked / ".lock");
  CHECK(contains(open_error(linked), "has 2 links"));
  CHECK(read_text(root.path / "user.txt") == "keep me");
  write_text(held / "latest", std::string(5000, 'a'));
  CHECK_THROWS_WITH_AS((void)ck::find_checkpoint(held), doctest::Contains("more than the 256 it may have"), error);
}
