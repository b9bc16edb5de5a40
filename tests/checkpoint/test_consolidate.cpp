// checkpoint::consolidate and checkpoint::reshard_offline (what ringzero-ckpt runs): the full
// parameters by name, tied ones under each name (C18), frozen ones included, converted to
// bfloat16, split as Hugging Face does; an offline reshard equal byte for byte to a save at the
// new world size and stage, loading bitwise equal and training on identically.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstring>

#include "checkpoint_test_util.hpp"
#include "ringzero/core/half.hpp"

using namespace ckpt_test;
namespace ck = ringzero::checkpoint;
using zero_test::make_spec;

namespace {

/// C18's model plus a frozen [6, 3] layer: an embedding [11, 4] tied to the output layer.
std::vector<parameter_spec> tied_model() {
  return {make_spec("embed", {11, 4}, "u0", true, "tok"), make_spec("l1.w", {4, 6}, "u1"),
          make_spec("frozen.w", {6, 3}, "u1", false), make_spec("l1.b", {6}, "u1"),
          make_spec("out", {11, 4}, "u2", true, "tok")};
}

ck::training_progress progress_at_epoch_1() {
  ck::training_progress p;
  p.epoch = 1;
  p.rng_seeds = {7};
  return p;
}

ck::reshard_options to(int world, std::optional<int> stage = std::nullopt) {
  ck::reshard_options o;
  o.world_size = world;
  o.stage = stage;
  return o;
}

/// Saves the model after 2 AdamW steps at `stage` on `world` ranks under root/NAME; returns its parameters.
std::vector<std::vector<float>> save_tied(const fs::path& root, int world, int stage, const std::string& name) {
  std::vector<std::vector<float>> values;
  local::launch(world, [&](communicator& comm) {
    sharded_model m(comm, request(tied_model(), stage), model_options(adamw()));
    initialise(m);
    train(m, comm.rank(), 0, 2);
    auto v = parameters_of(m);
    if (comm.rank() == 0) values = v;
    ck::checkpointer(root).save(m, progress_at_epoch_1(), name);
  });
  return values;
}

/// The tensors of a safetensors file: name -> (dtype name, shape, bytes).
struct file_tensor {
  std::string dtype_name;
  std::vector<std::uint64_t> shape;
  std::vector<unsigned char> bytes;
};
std::map<std::string, file_tensor> read_safetensors(const fs::path& path) {
  const ck::safetensors_header h = ck::read_safetensors_header(path);
  const std::string text = read_text(path);
  std::map<std::string, file_tensor> out;
  for (const auto& t : h.tensors)
    out[t.name] = {t.dtype_name, t.shape,
                   std::vector<unsigned char>(text.begin() + static_cast<std::ptrdiff_t>(t.begin),
                                              text.begin() + static_cast<std::ptrdiff_t>(t.end))};
  return out;
}

std::vector<unsigned char> bytes_of(const std::vector<float>& v) {
  std::vector<unsigned char> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("consolidate: a stage-2 3-rank checkpoint with a tied [11, 4] embedding (C18) and a frozen layer, by name") {
  scratch_dir root("consolidate");
  const auto values = save_tied(root.path, 3, 2, "c18");
  const auto names = std::vector<std::string>{"embed", "l1.w", "frozen.w", "l1.b", "out"};
  const auto r = ck::consolidate(root.path, root.path / "model.safetensors");
  CHECK(r.files == std::vector<fs::path>{root.path / "model.safetensors"});
  CHECK(!r.index_file);
  CHECK(r.tensors == 5);
  CHECK(r.total_bytes == (44 + 24 + 18 + 6 + 44) * 4);
  const auto file = read_safetensors(root.path / "model.safetensors");
  REQUIRE(file.size() == 5);
  for (std::size_t p = 0; p < names.size(); ++p) {
    INFO(names[p]);
    const file_tensor& t = file.at(names[p]);
    CHECK(t.dtype_name == "F32");
    CHECK(t.bytes == bytes_of(values[p]));
  }
  CHECK(file.at("embed").shape == std::vector<std::uint64_t>{11, 4});
  CHECK(file.at("out").bytes == file.at("embed").bytes);  // tied: both names, identical values
  CHECK(file.at("frozen.w").shape == std::vector<std::uint64_t>{6, 3});
  CHECK(ck::read_safetensors_header(root.path / "model.safetensors").metadata.at("format") == "pt");
  CHECK(!fs::exists(root.path / "model.safetensors.tmp"));

  // Loading it back initialises both tied names (and the frozen layer) on 2 ranks at stage 3.
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(tied_model(), 3), model_options(adamw()));
    ck::load_pretrained(m, root.path / "model.safetensors");
    CHECK(same_bits(parameters_of(m), values));
  });
}

TEST_CASE(
    "consolidate --dtype bfloat16: each value rounded to nearest even; a streaming buffer of one chunk changes "
    "nothing") {
  scratch_dir root("consolidate-bf16");
  const auto values = save_tied(root.path, 3, 2, "c18");
  ck::consolidate_options o;
  o.type = dtype::bfloat16;
  o.buffer_bytes = 1;  // rounded up to one 4 MiB chunk
  ck::consolidate(root.path / "c18", root.path / "bf16.safetensors", o);
  const auto file = read_safetensors(root.path / "bf16.safetensors");
  const auto names = std::vector<std::string>{"embed", "l1.w", "frozen.w", "l1.b", "out"};
  for (std::size_t p = 0; p < names.size(); ++p) {
    const file_tensor& t = file.at(names[p]);
    CHECK(t.dtype_name == "BF16");
    REQUIRE(t.bytes.size() == values[p].size() * 2);
    for (std::size_t j = 0; j < values[p].size(); ++j) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, t.bytes.data() + 2 * j, 2);
      CHECK(bits == ringzero::detail::float_to_bfloat16_bits(values[p][j]));
    }
  }
  o.type = dtype::int32;
  CHECK_THROWS_WITH_AS(ck::consolidate(root.path, root.path / "x.safetensors", o), doctest::Contains("floating-point"),
                       ringzero::error);
}

TEST_CASE(
    "consolidate --max-shard-size: Hugging Face's model-0000i-of-0000N files and index; the same tensors as one file") {
  scratch_dir root("consolidate-split");
  save_tied(root.path, 3, 2, "c18");
  const auto whole = read_safetensors(ck::consolidate(root.path, root.path / "one.safetensors").files.front());
  ck::consolidate_options o;
  o.max_shard_bytes = 100;  // embed (176 B) alone; l1.w (96 B) alone; frozen.w (72) + l1.b (24); out alone
  const auto r = ck::consolidate(root.path, root.path / "model.safetensors", o);
  REQUIRE(r.files.size() == 4);
  CHECK(r.files[0].filename() == "model-00001-of-00004.safetensors");
  CHECK(r.files[3].filename() == "model-00004-of-00004.safetensors");
  REQUIRE(r.index_file);
  CHECK(r.index_file->filename() == "model.safetensors.index.json");
  CHECK(!fs::exists(root.path / "model.safetensors"));
  const auto j = nlohmann::json::parse(read_text(*r.index_file));
  CHECK(j["metadata"]["total_size"].get<std::uint64_t>() == (44 + 24 + 18 + 6 + 44) * 4);
  CHECK(j["weight_map"].size() == 5);
  CHECK(j["weight_map"]["frozen.w"] == "model-00003-of-00004.safetensors");
  CHECK(j["weight_map"]["l1.b"] == "model-00003-of-00004.safetensors");
  std::map<std::string, file_tensor> joined;
  for (const auto& [name, file] : j["weight_map"].items()) {
    const auto part = read_safetensors(root.path / file.get<std::string>());
    CHECK(part.contains(name));
    joined[name] = part.at(name);
  }
  CHECK(joined.size() == whole.size());
  for (const auto& [name, t] : whole) CHECK(joined.at(name).bytes == t.bytes);
}

TEST_CASE("consolidate refuses a damaged checkpoint naming the file, and leaves no output behind") {
  scratch_dir root("consolidate-damaged");
  save_tied(root.path, 3, 2, "c18");
  const fs::path shard = root.path / "c18" / ck::shard_file_name(1, 3);
  std::string bytes = read_text(shard);
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x10);
  write_text(shard, bytes);
  CHECK_THROWS_WITH_AS(ck::consolidate(root.path, root.path / "model.safetensors"),
                       doctest::Contains(ck::shard_file_name(1, 3).c_str()), ringzero::error);
  CHECK(!fs::exists(root.path / "model.safetensors"));
  CHECK(!fs::exists(root.path / "model.safetensors.tmp"));
}

TEST_CASE(
    "reshard_offline: 3 ranks at stage 2 to 2 ranks at stage 3 is byte for byte a save there; it loads and trains on "
    "identically") {
  scratch_dir root("reshard");
  save_tied(root.path / "src", 3, 2, "c18");
  const auto before = full_tensors(root.path / "src");
  const auto r = ck::reshard_offline(root.path / "src", root.path / "dst", to(2, 3));
  CHECK(r.exact_plan);
  CHECK(r.directory == root.path / "dst" / "c18");
  CHECK(ck::read_latest(root.path / "dst") == "c18");
  CHECK(r.index.world_size == 2);
  CHECK(r.index.stage == 3);
  CHECK(r.index.progress.epoch == 1);
  CHECK(r.index.progress.optimizer_steps == 2);
  CHECK(full_tensors(root.path / "dst") == before);

  // A save by 2 ranks at stage 3 of the state loaded from the original writes the same files.
  std::vector<std::vector<float>> after_step[2];
  for (int from = 0; from < 2; ++from)
    local::launch(2, [&](communicator& comm) {
      sharded_model m(comm, request(tied_model(), 3), model_options(adamw()));
      ck::load(m, from == 0 ? root.path / "src" : root.path / "dst");
      if (from == 0) ck::checkpointer(root.path / "direct").save(m, progress_at_epoch_1(), "c18");
      train(m, comm.rank(), 2, 3);
      auto v = parameters_of(m);
      if (comm.rank() == 0) after_step[from] = v;
    });
  CHECK(same_bits(after_step[0], after_step[1]));
  for (int rank = 0; rank < 2; ++rank)
    CHECK(read_text(root.path / "dst" / "c18" / ck::shard_file_name(rank, 2)) ==
          read_text(root.path / "direct" / "c18" / ck::shard_file_name(rank, 2)));
  CHECK(ck::read_index(root.path / "dst" / "c18").to_json() == ck::read_index(root.path / "direct" / "c18").to_json());
}

TEST_CASE(
    "reshard_offline to 5 ranks at stages 0-3 (some ranks own nothing of a tensor): every tensor bitwise equal, loads "
    "on 5") {
  scratch_dir root("reshard-5");
  const auto values = save_tied(root.path / "src", 3, 2, "c18");
  const auto before = full_tensors(root.path / "src");
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    std::string name = "s";  // appended, not "s" + ...: no GCC 12 -Wrestrict false positive
    name += std::to_string(stage);
    const fs::path out = root.path / name;
    ck::reshard_offline(root.path / "src" / "c18", out, to(5, stage));
    CHECK(full_tensors(out) == before);
    local::launch(5, [&](communicator& comm) {
      sharded_model m(comm, request(tied_model(), stage), model_options(adamw()));
      const ck::training_progress p = ck::load(m, out);
      CHECK(p.optimizer_steps == 2);
      CHECK(same_bits(parameters_of(m), values));
    });
  }
  // Bad requests name the value; the output root may not be the source's.
  CHECK_THROWS_WITH_AS(ck::reshard_offline(root.path / "src", root.path / "bad", to(0)),
                       doctest::Contains("world size"), ringzero::error);
  CHECK_THROWS_WITH_AS(ck::reshard_offline(root.path / "src", root.path / "bad", to(2, 4)),
                       doctest::Contains("stage must be 0-3, got 4"), ringzero::error);
  CHECK_THROWS_WITH_AS(ck::reshard_offline(root.path / "src", root.path / "src", to(2)), doctest::Contains("own root"),
                       ringzero::error);
}

TEST_CASE("reshard_offline without a recorded plan request: automatic units, the same tensors, loadable") {
  scratch_dir root("reshard-auto");
  const auto values = save_tied(root.path / "src", 3, 1, "c18");
  // An index written before the plan was recorded.
  const fs::path index_path = root.path / "src" / "c18" / "index.json";
  auto j = nlohmann::json::parse(read_text(index_path));
  j["extra"] = nlohmann::json::object();
  ck::seal_index(j);
  write_text(index_path, j.dump(1));
  const auto r = ck::reshard_offline(root.path / "src", root.path / "dst", to(4));
  CHECK(!r.exact_plan);
  CHECK(full_tensors(root.path / "dst") == full_tensors(root.path / "src"));
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(tied_model(), 2), model_options(adamw()));
    ck::load(m, root.path / "dst");
    CHECK(same_bits(parameters_of(m), values));
  });
}
