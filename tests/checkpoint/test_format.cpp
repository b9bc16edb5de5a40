// The file formats: safetensors headers as the specification defines them (written and read
// back; every rule of a damaged header refused naming the file), the checksums, and the
// checkpoint index's own checks.
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "checkpoint_test_util.hpp"

using namespace ckpt_test;
namespace ck = ringzero::checkpoint;

namespace {
std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}
std::string refusal(const fs::path& p, const std::string& contents) {
  write_text(p, contents);
  try {
    (void)ck::read_safetensors_header(p);
  } catch (const ringzero::error& e) {
    CHECK(std::string(e.what()).find(p.string()) != std::string::npos);
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("safetensors header: written padded to 8 bytes, read back with dtypes, shapes, offsets and metadata") {
  scratch_dir dir("format");
  const std::string header = ck::encode_safetensors_header({{"a", dtype::float32, {2, 3}, 24},
                                                            {"b", dtype::bfloat16, {5}, 10},
                                                            {"c", dtype::int64, {0, 4}, 0},
                                                            {"d", dtype::float64, {}, 8}},
                                                           {{"k", "v"}});
  CHECK(header.size() % 8 == 0);
  CHECK(header[8] == '{');
  write_text(dir.path / "x.safetensors", header + std::string(42, '\x01'));
  const auto h = ck::read_safetensors_header(dir.path / "x.safetensors");
  CHECK(h.data_start == header.size());
  CHECK(h.metadata.at("k") == "v");
  REQUIRE(h.tensors.size() == 4);
  const auto* b = h.find("b");
  REQUIRE(b != nullptr);
  CHECK(b->dtype_name == "BF16");
  CHECK(b->type == dtype::bfloat16);
  CHECK(b->shape == std::vector<std::uint64_t>{5});
  CHECK(b->begin == header.size() + 24);
  CHECK(b->end == header.size() + 34);
  CHECK(h.find("d")->shape.empty());
  CHECK(h.find("c")->begin == h.find("c")->end);
  for (dtype t : all_dtypes) CHECK(ck::parse_safetensors_dtype(ck::safetensors_dtype(t)) == t);
}

TEST_CASE("safetensors header: every broken rule is refused naming the file") {
  scratch_dir dir("format-bad");
  const fs::path p = dir.path / "bad.safetensors";
  auto tensor = [](const std::string& dt, const std::string& shape, int b, int e) {
    return "{\"dtype\":\"" + dt + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) + "," +
           std::to_string(e) + "]}";
  };
  CHECK(refusal(p, "abc").find("shorter than the 8-byte header length") != std::string::npos);
  CHECK(refusal(p, with_header("{}", "").substr(0, 9)).find("runs past the end") != std::string::npos);
  CHECK(refusal(p, with_header("[1]", "")).find("does not start with '{'") != std::string::npos);
  CHECK(refusal(p, with_header("{\"a\":", "")).find("not valid JSON") != std::string::npos);
  CHECK(
      refusal(p, with_header("{\"a\":" + tensor("F32", "[2]", 0, 8) + "}", "1234")).find("outside the data section") !=
      std::string::npos);
  CHECK(refusal(p, with_header("{\"a\":" + tensor("F32", "[2]", 0, 4) + "}", "1234")).find("need 8") !=
        std::string::npos);
  CHECK(refusal(p, with_header("{\"a\":" + tensor("F32", "[1]", 4, 8) + "}", "12345678")).find("must tile") !=
        std::string::npos);
  CHECK(refusal(p, with_header("{\"a\":" + tensor("F32", "[1]", 0, 4) + "}", "12345678")).find("data section has 8") !=
        std::string::npos);
  CHECK(refusal(p, with_header("{\"a\":" + tensor("Q4", "[1]", 0, 4) + "}", "1234")).find("unknown dtype") !=
        std::string::npos);
  CHECK(refusal(p, with_header("{\"__metadata__\":{\"x\":1}}", "")).find("not a string") != std::string::npos);
  CHECK(refusal(p, with_header("{\"a\":" + tensor("F32", "[1]", 0, 4) + ",\"b\":" + tensor("F32", "[1]", 0, 4) + "}",
                               "1234"))
            .find("must tile") != std::string::npos);
  CHECK_THROWS_WITH_AS(
      ck::encode_safetensors_header({{"a", dtype::float32, {1}, 4}, {"a", dtype::float32, {1}, 4}}, {}),
      doctest::Contains("appears twice"), ringzero::error);
  CHECK_THROWS_WITH_AS(ck::encode_safetensors_header({{"__metadata__", dtype::float32, {1}, 4}}, {}),
                       doctest::Contains("reserved"), ringzero::error);
}

TEST_CASE("chunk checksums: XXH3-64 per 4 MiB chunk, hex round trip") {
  std::vector<unsigned char> data(ck::checksum_chunk_bytes + 5, 7);
  const auto sums = ck::chunk_checksums(data.data(), data.size());
  REQUIRE(sums.size() == 2);
  CHECK(sums[0] == XXH3_64bits(data.data(), ck::checksum_chunk_bytes));
  CHECK(sums[1] == XXH3_64bits(data.data() + ck::checksum_chunk_bytes, 5));
  CHECK(ck::chunk_count(0) == 0);
  CHECK(ck::parse_hex64(ck::hex64(0x0123456789abcdefull)) == 0x0123456789abcdefull);
  CHECK(!ck::parse_hex64("0123"));
  CHECK(!ck::parse_hex64("0123456789abcdeg"));
}

TEST_CASE("index: the round trip keeps everything, and malformed indexes are refused naming the field") {
  scratch_dir root("index");
  local::launch(2, [&](communicator& comm) {
    sharded_model m(comm, request(zero_test::test_parameters(), 2), model_options(adamw()));
    initialise(m);
    ck::checkpointer(root.path).save(m, {}, "x");
  });
  const auto text = read_text(root.path / "x" / "index.json");
  const auto j = nlohmann::json::parse(text);
  const auto index = ck::checkpoint_index::from_json(j, "x");
  CHECK(index.to_json() == j);
  CHECK(index.model_fingerprint != 0);
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json k = j;
    edit(k);
    try {
      (void)ck::checkpoint_index::from_json(k, "x/index.json");
    } catch (const ringzero::error& e) { return std::string(e.what()); }
    return std::string();
  };
  CHECK(refused([](auto& k) { k["format"] = "other"; }).find("the format is not 'ringzero.checkpoint'") !=
        std::string::npos);
  CHECK(refused([](auto& k) { k.erase("files"); }).find("the field 'files' is missing") != std::string::npos);
  CHECK(refused([](auto& k) { k["files"].erase(1); }).find("one file per rank") != std::string::npos);
  CHECK(refused([](auto& k) { k["tensors"][0]["dtype"] = "Q4"; }).find("unknown dtype 'Q4'") != std::string::npos);
  CHECK(refused([](auto& k) {
          k["tensors"][0]["fragments"][0]["xxh3"] = nlohmann::json::array();
        }).find("chunk checksums") != std::string::npos);
  CHECK(refused([](auto& k) { k["tensors"][0]["fragments"][0]["offset"] = 1u << 30; }).find("lies outside file") !=
        std::string::npos);
  CHECK(refused([](auto& k) { k["tensors"].push_back(k["tensors"][0]); }).find("listed twice") != std::string::npos);
  const auto newer = [&] {
    nlohmann::json k = j;
    k["format_version"] = 7;
    try {
      (void)ck::checkpoint_index::from_json(k, "x");
    } catch (const ringzero::error& e) { return e.kind(); }
    return errc::internal;
  }();
  CHECK(newer == errc::unsupported);
}
