// The ZeRO shard planner: exact ownership, minimal padding, determinism, hybrid groups,
// frozen / tied / zero-size / mixed-dtype parameters, the schedule's buffers, and bad requests.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ringzero/zero/model_presets.hpp"
#include "ringzero/zero/paper_comparison.hpp"
#include "ringzero/zero/shard_plan.hpp"

using namespace ringzero;
using namespace ringzero::zero;

namespace {

parameter_spec spec(std::string name, std::vector<std::uint64_t> shape, std::optional<dtype> t = std::nullopt,
                    bool trainable = true, std::string tie = {}, std::string unit = {}) {
  parameter_spec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.type = t;
  s.trainable = trainable;
  s.tie_group = std::move(tie);
  s.unit = std::move(unit);
  return s;
}

/// A random model: odd sizes, scalars, zero-size parameters, frozen ones, ties, mixed dtypes.
std::vector<parameter_spec> random_model(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<parameter_spec> p;
  const int count = 3 + static_cast<int>(rng() % 12);
  const dtype types[] = {dtype::float32, dtype::bfloat16, dtype::float16, dtype::float64};
  for (int i = 0; i < count; ++i) {
    std::vector<std::uint64_t> shape;
    const int rank = static_cast<int>(rng() % 3);
    for (int d = 0; d < rank; ++d) shape.push_back(rng() % 9 == 0 ? 0 : 1 + rng() % 37);
    const bool frozen = rng() % 5 == 0;
    dtype t = types[rng() % 4];
    if (frozen && rng() % 3 == 0) t = dtype::int8;
    std::string unit;
    if (rng() % 3 != 0) unit = std::string("u").append(std::to_string(rng() % 4));
    std::string name = "p";
    name += std::to_string(i);
    p.push_back(spec(name, shape, t, !frozen, {}, unit));
    if (rng() % 6 == 0) {  // a tied alias of this parameter, used in another unit
      auto alias = p.back();
      alias.name += ".alias";
      alias.tie_group = "tie";
      alias.tie_group += std::to_string(i);
      alias.unit = "u";
      alias.unit += std::to_string(rng() % 4);
      p.back().tie_group = alias.tie_group;
      p.push_back(alias);
    }
  }
  return p;
}

/// Asserts the plan's structural promises for one request.
void check_plan(const shard_plan& plan) {
  const int shards = plan.shards();
  const auto& pl = plan.placements();
  // Buffers: aligned starts, minimal gaps and tail, equal shards.
  std::uint64_t padding = 0;
  for (const flat_buffer& f : plan.buffers()) {
    const std::uint64_t es = dtype_size(f.type);
    const std::uint64_t align = plan.request().alignment_bytes <= es ? 1 : plan.request().alignment_bytes / es;
    REQUIRE(f.numel % (static_cast<std::uint64_t>(shards) * align) == 0);
    REQUIRE(f.shard_numel * static_cast<std::uint64_t>(shards) == f.numel);
    std::uint64_t at = 0, payload = 0;
    for (std::size_t p : f.parameters) {
      REQUIRE_FALSE(pl[p].alias);
      REQUIRE(pl[p].type == f.type);
      if (pl[p].numel > 0) {
        REQUIRE(pl[p].offset % align == 0);
        REQUIRE(pl[p].offset >= at);
        REQUIRE(pl[p].offset - at < align);  // the smallest aligned start
      } else {
        REQUIRE(pl[p].offset == at);
      }
      at = pl[p].offset + pl[p].numel;
      payload += pl[p].numel;
    }
    REQUIRE(f.payload == payload);
    REQUIRE(f.numel >= at);
    REQUIRE(f.numel - at < static_cast<std::uint64_t>(shards) * align);  // the smallest padded size
    padding += f.padding();
  }
  CHECK(plan.padding_elements() == padding);

  // Ownership: in every replica group, every storage element is owned by exactly one rank.
  for (int group = 0; group < plan.replica_groups(); ++group) {
    std::vector<std::vector<int>> owned(pl.size());
    for (std::size_t p = 0; p < pl.size(); ++p) owned[p].assign(pl[p].alias ? 0 : pl[p].numel, 0);
    for (int i = 0; i < shards; ++i) {
      const int rank = group * shards + i;
      REQUIRE(plan.shard_index(rank) == i);
      REQUIRE(plan.replica_group(rank) == group);
      std::vector<std::vector<int>> shard_cover(plan.buffers().size());
      for (std::size_t b = 0; b < plan.buffers().size(); ++b) shard_cover[b].assign(plan.buffers()[b].shard_numel, 0);
      for (const fragment& f : plan.fragments(rank)) {
        REQUIRE(f.count > 0);
        REQUIRE_FALSE(pl[f.parameter].alias);
        REQUIRE(pl[f.parameter].buffer == f.buffer);
        REQUIRE(f.parameter_offset + f.count <= pl[f.parameter].numel);
        REQUIRE(f.shard_offset + f.count <= plan.buffers()[f.buffer].shard_numel);
        // the fragment is where the layout says it is
        const algorithms::range own = plan.shard_range(f.buffer, rank);
        REQUIRE(own.begin + f.shard_offset == pl[f.parameter].offset + f.parameter_offset);
        std::uint64_t wrong_owner = 0;
        for (std::uint64_t k = 0; k < f.count; ++k) {
          owned[f.parameter][f.parameter_offset + k] += 1;
          shard_cover[f.buffer][f.shard_offset + k] += 1;
          if (plan.owner(f.parameter, f.parameter_offset + k) != i) ++wrong_owner;
        }
        REQUIRE(wrong_owner == 0);
      }
      std::uint64_t overlaps = 0;
      for (const auto& cover : shard_cover)
        for (int c : cover) overlaps += c > 1 ? 1 : 0;
      REQUIRE(overlaps == 0);  // fragments never overlap inside a shard
    }
    std::uint64_t not_once = 0;
    for (std::size_t p = 0; p < pl.size(); ++p)
      for (int c : owned[p]) not_once += c != 1 ? 1 : 0;
    REQUIRE(not_once == 0);  // every storage element owned exactly once in the group
  }
  // Aliases share their owner's storage.
  for (std::size_t p = 0; p < pl.size(); ++p) {
    const std::size_t s = pl[p].storage;
    REQUIRE(pl[s].storage == s);
    REQUIRE(pl[p].buffer == pl[s].buffer);
    REQUIRE(pl[p].offset == pl[s].offset);
  }
}

template <class F>
void check_invalid(F&& make, const std::string& expected_text) {
  try {
    make();
    FAIL("expected ringzero::error mentioning '" << expected_text << "'");
  } catch (const error& e) {
    CHECK(e.kind() == errc::invalid_argument);
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(expected_text) != std::string::npos);
    CHECK(what.find("zero::shard_plan") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("exact ownership and minimal padding over random models, world sizes, groups, stages and alignments") {
  int plans = 0;
  for (std::uint32_t seed = 1; seed <= 24; ++seed) {
    const auto params = random_model(seed);
    for (int world : {1, 2, 3, 4, 5, 6, 8}) {
      for (int group : {0, 1, 2, 3}) {
        if (group > 0 && world % group != 0) continue;
        for (int stage = 0; stage <= 3; ++stage) {
          for (std::uint64_t alignment : {1ull, 4ull, 16ull, 256ull}) {
            plan_request q;
            q.parameters = params;
            q.world_size = world;
            q.replica_group_size = group;
            q.stage = stage;
            q.alignment_bytes = alignment;
            q.unit_bytes = 64 + seed * 8;
            q.precision = seed % 2 ? precision::mixed_adam() : precision::float32_adam();
            const shard_plan plan(q);
            CAPTURE(seed);
            CAPTURE(world);
            CAPTURE(group);
            CAPTURE(stage);
            CAPTURE(alignment);
            CHECK(plan.shards() == (stage == 0 ? 1 : (group == 0 ? world : group)));
            check_plan(plan);
            ++plans;
          }
        }
      }
    }
  }
  CHECK(plans > 1000);
}

TEST_CASE("a hand-computed plan: layout, fragments, memory and traffic") {
  // Unit "a": w (7x7 float32) and b (7 float32); frozen f (3x3 float32) in its own buffer.
  // Unit "b": v (5 float32). Alignment 16 bytes = 4 float32 elements, 4 ranks, stage 3.
  plan_request q;
  q.parameters = {spec("w", {7, 7}, {}, true, {}, "a"), spec("b", {7}, {}, true, {}, "a"),
                  spec("f", {3, 3}, {}, false, {}, "a"), spec("v", {5}, {}, true, {}, "b")};
  q.world_size = 4;
  q.stage = 3;
  q.alignment_bytes = 16;
  q.precision = precision::float32_adam();
  const shard_plan plan(q);
  REQUIRE(plan.units().size() == 2);
  REQUIRE(plan.buffers().size() == 3);
  const auto& w = plan.placements()[0];
  const auto& b = plan.placements()[1];
  CHECK(w.offset == 0);
  CHECK(b.offset == 52);  // 49 rounded up to a multiple of 4
  const flat_buffer& a_trainable = plan.buffers()[0];
  CHECK(a_trainable.payload == 56);
  CHECK(a_trainable.numel == 64);  // 59 rounded up to 4 ranks * 4 elements
  CHECK(a_trainable.shard_numel == 16);
  CHECK(plan.buffers()[1].numel == 16);  // frozen f: 9 -> 16
  CHECK_FALSE(plan.buffers()[1].trainable);
  CHECK(plan.buffers()[2].numel == 16);  // v: 5 -> 16
  CHECK(plan.padding_elements() == (64 - 56) + (16 - 9) + (16 - 5));
  // Rank 3 owns elements [48, 64) of unit a's trainable buffer: w[48] and b[0..7).
  const auto frags = plan.fragments(3);
  REQUIRE(frags.size() == 2);
  CHECK(frags[0] == fragment{0, 0, 48, 0, 1});
  CHECK(frags[1] == fragment{1, 0, 0, 4, 7});
  // Memory per rank (stage 3, float32 Adam, no master): every category is a shard.
  const memory_breakdown& m = plan.memory();
  CHECK(m.parameters == (16 + 4 + 4) * 4);
  CHECK(m.gradients == (16 + 4) * 4);
  CHECK(m.master_weights == 0);
  CHECK(m.optimizer_states == (16 + 4) * 4 * 2);
  // Canonical schedule: forward gathers a then prefetches b (2 buffers of unit a's 320 bytes),
  // backward reduces b while a's gradients are produced (2 buckets of 256 bytes).
  CHECK(plan.units()[0].gather_bytes == 64 * 4 + 16 * 4);
  CHECK(plan.units()[0].gradient_bytes == 64 * 4);
  CHECK(plan.communication().gather_buffers == 2);
  CHECK(plan.communication().gather_buffer_bytes == 320);
  CHECK(plan.communication().gradient_buckets == 2);
  CHECK(plan.communication().gradient_bucket_bytes == 256);
  CHECK(m.communication_buffers == 2 * 320 + 2 * 256);
  // Traffic: each unit gathered once before forward and once before backward, gradients once.
  REQUIRE(plan.traffic().size() == 3);
  CHECK(plan.traffic()[0].collective == collective_kind::all_gather);
  CHECK(plan.traffic()[0].calls == 3);
  CHECK(plan.traffic()[0].elements == 64 + 16 + 16);
  CHECK(plan.traffic()[1].elements == 64 + 16 + 16);
  CHECK(plan.traffic()[2].collective == collective_kind::reduce_scatter);
  CHECK(plan.traffic()[2].elements == 64 + 16);
  CHECK(plan.traffic()[2].bytes == (64 + 16) * 4);
}

TEST_CASE("stages shard what the ZeRO paper says they shard") {
  plan_request q;
  q.parameters = {spec("a", {64, 8}, {}, true, {}, "u0"), spec("b", {128}, {}, true, {}, "u1")};
  q.world_size = 8;
  q.alignment_bytes = 4;
  q.precision = precision::mixed_adam();
  const std::uint64_t psi = 64 * 8 + 128;
  for (int stage = 0; stage <= 3; ++stage) {
    q.stage = stage;
    const shard_plan plan(q);
    CAPTURE(stage);
    const std::uint64_t n = stage == 0 ? 1 : 8;
    CHECK(plan.padding_elements() == 0);
    CHECK(plan.memory().parameters == 2 * psi / (stage >= 3 ? n : 1));
    CHECK(plan.memory().gradients == 2 * psi / (stage >= 2 ? n : 1));
    CHECK(plan.memory().master_weights == 4 * psi / n);
    CHECK(plan.memory().optimizer_states == 8 * psi / n);
    CHECK((plan.memory().communication_buffers > 0) == (stage >= 2));
  }
}

TEST_CASE("frozen parameters: stored (and sharded at stage 3) but no gradients, master weights or state") {
  plan_request q;
  q.parameters = {spec("frozen", {100}, dtype::bfloat16, false), spec("trained", {100}, dtype::bfloat16, true)};
  q.world_size = 4;
  q.alignment_bytes = 2;
  q.precision = precision::bfloat16_adam();
  for (int stage = 0; stage <= 3; ++stage) {
    q.stage = stage;
    const shard_plan plan(q);
    REQUIRE(plan.buffers().size() == 2);
    CHECK_FALSE(plan.buffers()[0].trainable);
    CHECK(plan.trainable_elements() == 100);
    CHECK(plan.parameter_elements() == 200);
    const std::uint64_t n = stage == 0 ? 1 : 4;
    CHECK(plan.memory().parameters == 2 * 200 / (stage >= 3 ? n : 1));
    CHECK(plan.memory().gradients == 2 * 100 / (stage >= 2 ? n : 1));
    CHECK(plan.memory().master_weights == 4 * 100 / n);
    CHECK(plan.memory().optimizer_states == 8 * 100 / n);
    CHECK(plan.storage_id(0) == npos);
    CHECK(plan.storage_id(1) == 0);
    for (const traffic_entry& e : plan.traffic())
      if (e.purpose == "gradients") CHECK(e.elements == 100);
  }
}

TEST_CASE("stage 3 keeps frozen buffers gathered in unit order while they fit keep_frozen_bytes") {
  // Units a, b, c: a frozen float32 buffer of 100 elements (400 B), a trainable one of 12; b a
  // frozen bfloat16 buffer of 60 elements (120 B, padded to 64: 128 B); c a frozen one of 8
  // float32 (32 B). 4 ranks, alignment 4 bytes.
  plan_request q;
  q.parameters = {spec("a.f", {100}, dtype::float32, false, {}, "a"), spec("a.w", {12}, dtype::float32, true, {}, "a"),
                  spec("b.f", {60}, dtype::bfloat16, false, {}, "b"), spec("c.f", {8}, dtype::float32, false, {}, "c")};
  q.world_size = 4;
  q.alignment_bytes = 4;
  q.stage = 3;
  const shard_plan none(q);
  auto kept = [&](std::uint64_t budget) {
    plan_request k = q;
    k.keep_frozen_bytes = budget;
    const shard_plan plan(k);
    std::string which;
    for (const flat_buffer& f : plan.buffers())
      if (f.replicated) which += plan.units()[f.unit].name;
    return std::pair{which, plan};
  };
  CHECK(kept(0).first.empty());
  CHECK(kept(399).first == "bc");   // a's 400 B do not fit; b and c do, in unit order
  CHECK(kept(400).first == "a");    // a takes the budget, b no longer fits
  CHECK(kept(528).first == "ab");   // 400 + 128
  CHECK(kept(560).first == "abc");  // 400 + 128 + 32
  CHECK(kept(keep_all_frozen).first == "abc");
  const shard_plan all = kept(keep_all_frozen).second;
  // Held whole: parameters grow by 3/4 of each kept buffer; unit b and c gather nothing; a only
  // its trainable buffer (12 floats, 48 B), and only that is in the gathers' traffic.
  CHECK(all.memory().parameters == none.memory().parameters + (400 + 128 + 32) * 3 / 4);
  CHECK(all.units()[0].gather_bytes == 48);
  CHECK(all.units()[1].gather_bytes == 0);
  CHECK(all.units()[2].gather_bytes == 0);
  CHECK(all.communication().gather_buffer_bytes == 48);
  CHECK(all.communication().gather_buffers == 1);  // b and c gather nothing: only a holds a buffer
  CHECK(all.kept_frozen_bytes() == 400 + 128 + 32);
  CHECK(none.kept_frozen_bytes() == 0);
  // The paper comparison's padding: b's 4 padding elements (8 B), a quarter per rank when
  // sharded, whole when kept (not the kept buffers' whole size counted as padding).
  CHECK(compare_with_paper(none).padding_bytes == 2);
  CHECK(compare_with_paper(all).padding_bytes == 8);
  // Quantized weights apply to what is gathered: a kept int8 frozen buffer is no refusal.
  plan_request quantized = q;
  quantized.parameters[2].type = dtype::int8;
  quantized.quantization.weights = quantized_bits::int8;
  CHECK_THROWS_WITH_AS(shard_plan{quantized}, doctest::Contains("parameter 'b.f' is int8"), error);
  quantized.keep_frozen_bytes = keep_all_frozen;
  CHECK(shard_plan(quantized).buffers()[2].replicated);
  for (std::size_t b = 0; b < all.buffers().size(); ++b) CHECK(all.holds_whole(b) == all.buffers()[b].replicated);
  for (const traffic_entry& e : all.traffic())
    if (e.collective == collective_kind::all_gather) CHECK(e.bytes == 48);
  CHECK(all.fingerprint() != none.fingerprint());
  CHECK(kept(400).second.fingerprint() != all.fingerprint());
  // Stages 0-2 hold every buffer whole already: the budget changes nothing, fingerprint included.
  for (int stage = 0; stage <= 2; ++stage) {
    plan_request k = q;
    k.stage = stage;
    const shard_plan plain(k);
    k.keep_frozen_bytes = keep_all_frozen;
    const shard_plan with(k);
    CHECK(with.fingerprint() == plain.fingerprint());
    for (std::size_t b = 0; b < with.buffers().size(); ++b) {
      CHECK_FALSE(with.buffers()[b].replicated);
      CHECK(with.holds_whole(b));
    }
  }
}

TEST_CASE("tied parameters share one storage; the borrowing unit gathers the owner's unit") {
  plan_request q;
  q.parameters = {spec("embed", {10, 4}, {}, true, "wte", "embeddings"), spec("mid", {4, 4}, {}, true, {}, "block"),
                  spec("head", {10, 4}, {}, true, "wte", "head")};
  q.world_size = 2;
  q.stage = 3;
  q.alignment_bytes = 4;
  const shard_plan plan(q);
  CHECK(plan.parameter_elements() == 40 + 16);
  CHECK(plan.placements()[2].alias);
  CHECK(plan.placements()[2].storage == 0);
  CHECK(plan.placements()[2].unit == 2);
  CHECK(plan.storage_id(2) == plan.storage_id(0));
  CHECK(plan.units()[2].borrowed == std::vector<std::size_t>{0});
  CHECK(plan.units()[2].gather_bytes == 0);  // the head unit owns no storage of its own
  CHECK(plan.gradient_units(2) == std::vector<std::size_t>{0});
  CHECK(plan.fragments(0).size() == 2);  // half of embed, half of mid
  CHECK(plan.fragments(1).size() == 2);
  // Forward: embeddings, block, head (which gathers embeddings again); backward likewise.
  const auto& t = plan.traffic();
  REQUIRE(t.size() == 3);
  CHECK(t[0].calls == 3);  // embeddings, block, embeddings again (for the head)
  CHECK(t[1].calls == 3);
  CHECK(t[2].calls == 2);  // one gradient reduction per storage-owning unit
}

TEST_CASE("zero-size parameters are placed but own nothing") {
  plan_request q;
  q.parameters = {spec("empty", {0, 5}), spec("x", {3}), spec("empty2", {7, 0}, {}, false)};
  q.world_size = 3;
  q.stage = 3;
  const shard_plan plan(q);
  CHECK(plan.placements()[0].numel == 0);
  CHECK(plan.placements()[2].numel == 0);
  CHECK(plan.parameter_elements() == 3);
  CHECK(plan.storage_id(0) == npos);
  for (int r = 0; r < 3; ++r)
    for (const fragment& f : plan.fragments(r)) CHECK(f.parameter == 1);
  check_plan(plan);
  // A model of only zero-size parameters plans to nothing at all.
  q.parameters = {spec("nothing", {0})};
  const shard_plan none(q);
  CHECK(none.memory().total() == 0);
  CHECK(none.traffic().empty());
}

TEST_CASE("mixed dtypes get one buffer each and exact byte counts") {
  plan_request q;
  q.parameters = {spec("a", {33}, dtype::float32), spec("b", {33}, dtype::bfloat16), spec("c", {33}, dtype::float64),
                  spec("d", {33}, dtype::int8, false)};
  q.world_size = 2;
  q.stage = 2;
  q.alignment_bytes = 8;
  q.unit_bytes = 1 << 20;  // one automatic unit
  q.precision.master = dtype::float32;
  const shard_plan plan(q);
  REQUIRE(plan.units().size() == 1);
  REQUIRE(plan.buffers().size() == 4);
  // float32: 33 -> 36 (2 ranks * 2 elements); bfloat16: 33 -> 40 (2 * 4); float64: 33 -> 34; int8: 33 -> 48.
  CHECK(plan.buffers()[0].numel == 36);
  CHECK(plan.buffers()[1].numel == 40);
  CHECK(plan.buffers()[2].numel == 34);
  CHECK(plan.buffers()[3].numel == 48);
  const memory_breakdown& m = plan.memory();
  CHECK(m.parameters == 36 * 4 + 40 * 2 + 34 * 8 + 48 * 1);
  CHECK(m.gradients == 18 * 4 + 20 * 2 + 17 * 8);
  // master float32 only for the types that differ from it: bfloat16 and float64
  CHECK(m.master_weights == (20 + 17) * 4);
  CHECK(m.optimizer_states == (18 + 20 + 17) * 2 * 4);
  check_plan(plan);
}

TEST_CASE("hybrid sharding: shard within a replica group, replicate across groups") {
  plan_request q;
  q.parameters = random_model(7);
  q.stage = 3;
  q.world_size = 8;
  q.replica_group_size = 4;
  const shard_plan hybrid(q);
  q.world_size = 4;
  q.replica_group_size = 0;
  const shard_plan flat(q);
  CHECK(hybrid.shards() == 4);
  CHECK(hybrid.replica_groups() == 2);
  CHECK(hybrid.memory() == flat.memory());
  for (int r = 0; r < 4; ++r) CHECK(hybrid.fragments(r) == hybrid.fragments(r + 4));
  bool replica_all_reduce = false;
  for (const traffic_entry& e : hybrid.traffic())
    if (e.group == rank_group::replica) {
      replica_all_reduce = true;
      CHECK(e.collective == collective_kind::all_reduce);
      CHECK(e.ranks == 2);
    }
  CHECK(replica_all_reduce);
  check_plan(hybrid);
}

TEST_CASE("plans are deterministic and fingerprints follow the request") {
  plan_request q;
  q.parameters = random_model(3);
  q.world_size = 6;
  q.stage = 2;
  const shard_plan a(q), b(q);
  CHECK(a.fingerprint() == b.fingerprint());
  CHECK(a.memory() == b.memory());
  REQUIRE(a.buffers().size() == b.buffers().size());
  for (std::size_t i = 0; i < a.buffers().size(); ++i) {
    CHECK(a.buffers()[i].numel == b.buffers()[i].numel);
    CHECK(a.buffers()[i].parameters == b.buffers()[i].parameters);
  }
  for (int r = 0; r < 6; ++r) CHECK(a.fragments(r) == b.fragments(r));
  auto changed = q;
  changed.stage = 3;
  CHECK(shard_plan(changed).fingerprint() != a.fingerprint());
  changed = q;
  changed.world_size = 3;
  CHECK(shard_plan(changed).fingerprint() != a.fingerprint());
  changed = q;
  changed.parameters[0].shape.push_back(2);
  CHECK(shard_plan(changed).fingerprint() != a.fingerprint());
  changed = q;
  changed.parameters[1].name += "x";
  CHECK(shard_plan(changed).fingerprint() != a.fingerprint());
}

TEST_CASE("automatic units group parameters up to unit_bytes") {
  plan_request q;
  q.parameters = {
      spec("a", {10}), spec("b", {10}), spec("c", {10}), spec("d", {30}), spec("e", {1}, {}, true, {}, "named"),
      spec("f", {10})};
  q.unit_bytes = 80;  // two float32 parameters of 10
  const shard_plan plan(q);
  REQUIRE(plan.units().size() == 5);
  CHECK(plan.units()[0].members == std::vector<std::size_t>{0, 1});
  CHECK(plan.units()[1].members == std::vector<std::size_t>{2});
  CHECK(plan.units()[2].members == std::vector<std::size_t>{3});  // larger than unit_bytes: alone
  CHECK(plan.units()[3].name == "named");
  CHECK(plan.units()[4].members == std::vector<std::size_t>{5});
  CHECK(plan.units()[0].name == "auto:0");
}

TEST_CASE("the canonical schedule's buffers follow prefetch and max_inflight_reductions") {
  plan_request q;
  for (int i = 0; i < 6; ++i) {
    const std::string index = std::to_string(i);
    q.parameters.push_back(
        spec(std::string("l").append(index), {16, 16}, {}, true, {}, std::string("layer").append(index)));
  }
  q.world_size = 4;
  q.stage = 3;
  const shard_plan prefetching(q);
  CHECK(prefetching.communication().gather_buffers == 2);
  CHECK(prefetching.communication().gradient_buckets == 2);
  q.prefetch = false;
  q.max_inflight_reductions = 1;
  const shard_plan lean(q);
  CHECK(lean.communication().gather_buffers == 1);
  CHECK(lean.communication().gradient_buckets == 1);
  q.stage = 2;
  const shard_plan stage2(q);
  CHECK(stage2.communication().gather_buffers == 0);
  CHECK(stage2.communication().gradient_buckets == 1);
  q.stage = 1;
  CHECK(shard_plan(q).memory().communication_buffers == 0);
  // reshard_after_forward: except_last keeps the last layer (the first of the backward) at no
  // extra buffer; none holds all six at the end of the forward and gathers nothing for backward.
  q.stage = 3;
  q.prefetch = true;
  q.reshard_after_forward = reshard_policy::except_last;
  const shard_plan keep_last(q);
  CHECK(keep_last.communication().gather_buffers == 2);
  CHECK(keep_last.traffic()[0].calls == 6);  // before forward
  CHECK(keep_last.traffic()[1].calls == 5);  // before backward: not the last layer
  CHECK(keep_last.fingerprint() != prefetching.fingerprint());
  q.reshard_after_forward = reshard_policy::none;
  const shard_plan keep_all(q);
  CHECK(keep_all.communication().gather_buffers == 6);
  CHECK(keep_all.traffic()[0].calls == 6);
  CHECK(keep_all.traffic()[1].purpose == "gradients");  // no gathers before backward
  q.stage = 2;                                          // no effect at stages 0-2: the same plan, the same fingerprint
  q.prefetch = false;
  CHECK(shard_plan(q).fingerprint() == stage2.fingerprint());
}

TEST_CASE("explicit prefetch lists replace the default per unit and size the gather buffers") {
  // Units a, b, c, d of one 16x16 float32 parameter each (1 KiB), 2 ranks, stage 3.
  plan_request q;
  for (const char* u : {"a", "b", "c", "d"})
    q.parameters.push_back(spec(std::string(u) + ".w", {16, 16}, {}, true, {}, u));
  q.world_size = 2;
  q.stage = 3;
  const shard_plan plain(q);
  CHECK(plain.prefetch_after(0, true) == std::vector<std::size_t>{1});
  CHECK(plain.prefetch_after(3, false) == std::vector<std::size_t>{2});
  CHECK(plain.communication().gather_buffers == 2);
  auto with = [&](std::vector<prefetch_list> lists, bool prefetch = true) {
    plan_request k = q;
    k.prefetch_lists = std::move(lists);
    k.prefetch = prefetch;
    return shard_plan(k);
  };
  // a's forward gathers b and c ahead: a, b and c held at once; d's backward prefetches nothing
  // (so the backward holds one unit at a time until c's default prefetch of b).
  const shard_plan deep =
      with({{"a", std::vector<std::string>{"b", "c"}, std::nullopt}, {"d", std::nullopt, std::vector<std::string>{}}});
  CHECK(deep.prefetch_after(0, true) == std::vector<std::size_t>{1, 2});
  CHECK(deep.prefetch_after(0, false).empty());
  CHECK(deep.prefetch_after(1, true) == std::vector<std::size_t>{2});
  CHECK(deep.prefetch_after(3, false).empty());
  CHECK(deep.prefetch_after(2, false) == std::vector<std::size_t>{1});
  CHECK(deep.communication().gather_buffers == 3);
  CHECK(deep.memory().communication_buffers == plain.memory().communication_buffers + 1024);
  CHECK(deep.fingerprint() != plain.fingerprint());
  for (std::size_t i = 0; i < plain.traffic().size(); ++i) CHECK(deep.traffic()[i].bytes == plain.traffic()[i].bytes);
  // Without the default, only the lists prefetch: one gather buffer, two where a list says so.
  const shard_plan none = with({}, false);
  CHECK(none.prefetch_after(0, true).empty());
  CHECK(none.communication().gather_buffers == 1);
  CHECK(with({{"b", std::vector<std::string>{"c"}, std::nullopt}}, false).communication().gather_buffers == 2);
  // Stages 0-2 gather nothing: the lists are checked, and change nothing else.
  plan_request two = q;
  two.stage = 2;
  const shard_plan stage2(two);
  two.prefetch_lists = {{"a", std::vector<std::string>{"b"}, std::nullopt}};
  CHECK(shard_plan(two).prefetch_after(0, true).empty());
  CHECK(shard_plan(two).fingerprint() == stage2.fingerprint());
  auto refused = [&](std::vector<prefetch_list> lists, const std::string& text) {
    try {
      (void)with(std::move(lists));
      FAIL("expected: " << text);
    } catch (const error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  refused({{"e", std::vector<std::string>{"a"}, std::nullopt}},
          "a prefetch list is given for unit 'e', which no parameter names");
  refused({{"a", std::vector<std::string>{"b", "x"}, std::nullopt}},
          "the forward prefetch list of unit 'a' names unit 'x', which no parameter names");
  refused({{"c", std::nullopt, std::vector<std::string>{"c"}}},
          "the backward prefetch list of unit 'c' names the unit itself");
  refused({{"a", std::nullopt, std::nullopt}, {"a", std::nullopt, std::nullopt}}, "unit 'a' has two prefetch lists");
}

TEST_CASE("max_inflight_gathers bounds the units a prefetch may hold; the plan sizes the gather buffers by it") {
  // Units a..f of one 16x16 float32 parameter each (1 KiB), 2 ranks, stage 3.
  plan_request q;
  for (const char* u : {"a", "b", "c", "d", "e", "f"})
    q.parameters.push_back(spec(std::string(u) + ".w", {16, 16}, {}, true, {}, u));
  q.world_size = 2;
  q.stage = 3;
  // a's forward prefetches b, c and d; c's backward prefetches b and a.
  q.prefetch_lists = {{"a", std::vector<std::string>{"b", "c", "d"}, std::nullopt},
                      {"c", std::nullopt, std::vector<std::string>{"b", "a"}}};
  const shard_plan unbounded(q);
  CHECK(unbounded.communication().gather_buffers == 4);
  const std::vector<traffic_entry> full = unbounded.traffic();
  for (const auto& [limit, buffers] :
       std::vector<std::pair<int, std::uint64_t>>{{1, 1}, {2, 2}, {3, 3}, {4, 4}, {9, 4}}) {
    CAPTURE(limit);
    q.max_inflight_gathers = limit;
    const shard_plan bounded(q);
    CHECK(bounded.communication().gather_buffers == buffers);
    CHECK(bounded.memory().communication_buffers == unbounded.memory().communication_buffers - 1024 * (4 - buffers));
    CHECK(bounded.fingerprint() != unbounded.fingerprint());
    // A skipped prefetch becomes a gather when the unit runs: the same gathers, the same bytes.
    REQUIRE(bounded.traffic().size() == full.size());
    for (std::size_t i = 0; i < full.size(); ++i) {
      CHECK(bounded.traffic()[i].calls == full[i].calls);
      CHECK(bounded.traffic()[i].bytes == full[i].bytes);
    }
  }
  // The schedule itself: with a bound of 2, a's forward prefetches b only (c and d would make 4).
  q.max_inflight_gathers = 2;
  const shard_plan two(q);
  zero::detail::gather_schedule g = two.make_gather_schedule();
  zero::detail::null_gather_hooks h;
  g.use(0, h);
  for (std::size_t v : two.prefetch_after(0, true)) g.prefetch(v, h);
  CHECK(g.held(1));
  CHECK_FALSE(g.held(2));
  CHECK_FALSE(g.held(3));
  CHECK(g.skipped_prefetches() == 2);
  CHECK(g.held_count() == 2);
  // Units kept gathered count toward the bound but are never dropped for it: with
  // reshard_after_forward none all six are held at the end of the forward, whatever the bound.
  q.reshard_after_forward = reshard_policy::none;
  q.max_inflight_gathers = 1;
  CHECK(shard_plan(q).communication().gather_buffers == 6);
  // Stages 0-2 gather nothing: the bound changes nothing there, not even the fingerprint.
  q.reshard_after_forward = reshard_policy::all;
  q.stage = 2;
  const shard_plan stage2(q);
  q.max_inflight_gathers = 0;
  CHECK(shard_plan(q).fingerprint() == stage2.fingerprint());
  q.max_inflight_gathers = -1;
  check_invalid([&] { shard_plan p(q); }, "max_inflight_gathers must be 0 (no bound) or positive, got -1");
}

TEST_CASE("the plan records the memory space of the model state") {
  plan_request q;
  q.parameters = {spec("a", {64}), spec("b", {32})};
  q.world_size = 2;
  q.stage = 3;
  const shard_plan unset(q);
  CHECK(unset.space() == primitive::memory_space::host);
  q.space = primitive::memory_space::host;
  const shard_plan host(q);
  CHECK(host.space() == primitive::memory_space::host);
  CHECK(host.fingerprint() == unset.fingerprint());  // the default, named or not
  q.space = primitive::memory_space::device;
  const shard_plan device(q);
  CHECK(device.space() == primitive::memory_space::device);
  CHECK(device.fingerprint() != host.fingerprint());
  CHECK(device.device_memory().total() == host.device_memory().total());  // the same bytes, elsewhere
  q.space = primitive::memory_space::pinned_host;
  check_invalid([&] { shard_plan p(q); }, "the model state's memory space must be host or device, got pinned_host");
}

TEST_CASE("accumulation scales the per-micro-batch collectives only") {
  plan_request q;
  q.parameters = {spec("a", {64}, {}, true, {}, "u")};
  q.world_size = 4;
  q.accumulation_steps = 3;
  for (int stage = 0; stage <= 3; ++stage) {
    q.stage = stage;
    const shard_plan plan(q);
    for (const traffic_entry& e : plan.traffic()) {
      CAPTURE(stage);
      CAPTURE(e.purpose);
      const bool per_micro_batch = (stage == 2 && e.collective == collective_kind::reduce_scatter) || stage == 3;
      CHECK(e.calls == (per_micro_batch ? 3u : 1u));
    }
  }
}

TEST_CASE("64-bit sizes: a parameter of 3*2^31+5 elements on 5 ranks tiles exactly (case C11)") {
  plan_request q;
  q.parameters = {spec("huge", {3ull * (1ull << 31) + 5}, dtype::float64), spec("tail", {7})};
  q.world_size = 5;
  q.stage = 3;
  q.alignment_bytes = 64;
  const shard_plan plan(q);
  const flat_buffer& f = plan.buffers()[0];
  CHECK(f.numel % (5 * 8) == 0);
  CHECK(f.numel - f.payload < 5 * 8);
  std::uint64_t covered = 0, expected_offset = 0;
  for (int r = 0; r < 5; ++r) {
    const auto frags = plan.fragments(r);
    REQUIRE_FALSE(frags.empty());
    CHECK(frags[0].parameter == 0);
    CHECK(frags[0].parameter_offset == expected_offset);
    covered += frags[0].count;
    expected_offset += frags[0].count;
  }
  CHECK(covered == 3ull * (1ull << 31) + 5);
  CHECK(plan.memory().parameters == (f.numel / 5) * 8 + (plan.buffers()[1].numel / 5) * 4);
  CHECK(plan.owner(0, 3ull * (1ull << 31) + 4) == 4);
}

TEST_CASE("sums over buffers, units and calls that overflow 64 bits are refused, naming the figure") {
  // Every parameter here fits on its own (elements * 16 < 2^64); only the sums do not.
  constexpr std::uint64_t e60 = (1ull << 60) - 16;  // the largest multiple of 16 below 2^60
  auto units_of = [](int count, std::uint64_t numel, std::optional<dtype> type, bool trainable) {
    std::vector<parameter_spec> p;
    for (int i = 0; i < count; ++i) {
      std::string name = "p", unit = "u";  // appended, not "p" + ...: no GCC 12 -Wrestrict false positive
      name += std::to_string(i);
      unit += std::to_string(i);
      p.push_back(spec(name, {numel}, type, trainable, {}, unit));
    }
    return p;
  };
  auto refused = [](const plan_request& q, const std::string& figure) {
    check_invalid([&] { shard_plan p(q); }, "zero::shard_plan: " + figure + " overflows 64 bits");
  };

  SUBCASE("the parameter element count: 16 frozen int8 tensors of 2^60 - 16 fit exactly, 17 do not") {
    plan_request q;
    q.parameters = units_of(16, e60, dtype::int8, false);
    q.world_size = 1;
    q.stage = 1;
    const shard_plan plan(q);
    CHECK(plan.parameter_elements() == 0 - 256ull);  // 2^64 - 256
    CHECK(plan.padding_elements() == 0);
    CHECK(plan.memory().parameters == 0 - 256ull);
    CHECK(plan.memory().total() == 0 - 256ull);
    q.parameters = units_of(17, e60, dtype::int8, false);
    refused(q, "the model's parameter element count");
  }
  SUBCASE("the padding element count: 33 one-byte tensors, each padded to 2^59 elements") {
    plan_request q;
    q.parameters = units_of(31, 1, dtype::int8, false);
    q.world_size = 1 << 23;
    q.stage = 1;
    q.alignment_bytes = 1ull << 36;  // 2^23 shards * 2^36 elements: every buffer is 2^59 elements
    const shard_plan plan(q);
    CHECK(plan.padding_elements() == 31 * ((1ull << 59) - 1));
    CHECK(plan.memory().parameters == 31ull << 59);  // stage 1 keeps full parameters
    q.parameters = units_of(32, 1, dtype::int8, false);
    refused(q, "the parameter memory per rank");  // 2^64 bytes; the padding, 32 * (2^59 - 1), fits
    q.parameters = units_of(33, 1, dtype::int8, false);
    refused(q, "the model's padding element count");
  }
  SUBCASE("a unit's gather buffer: frozen float64 + int64 + float32 tensors of 2^60 - 16 elements") {
    plan_request q;
    q.parameters = {spec("a", {e60}, dtype::float64, false, {}, "u"), spec("b", {e60}, dtype::int64, false, {}, "u")};
    q.stage = 1;
    const shard_plan plan(q);  // two buffers of 2^63 - 128 bytes
    CHECK(plan.units()[0].gather_bytes == 0 - 256ull);
    CHECK(plan.memory().total() == 0 - 256ull);
    q.parameters.push_back(spec("c", {e60}, dtype::float32, false, {}, "u"));
    refused(q, "the gather buffer size of unit 'u'");
  }
  SUBCASE("a unit's gradient bucket: float16, bfloat16 and float32 tensors with float64 gradients") {
    plan_request q;  // gather buffer 8 * (2^60 - 16) bytes, gradient bucket 3 * 8 * (2^60 - 16)
    q.parameters = {spec("a", {e60}, dtype::float16, true, {}, "u"), spec("b", {e60}, dtype::bfloat16, true, {}, "u"),
                    spec("c", {e60}, dtype::float32, true, {}, "u")};
    q.precision.gradient = dtype::float64;
    refused(q, "the gradient bucket size of unit 'u'");
  }
  SUBCASE("each memory category per rank, its model states and its total") {
    plan_request q;
    q.world_size = 4;
    // 8 float32 tensors of 2^59 elements (ringzero-plan's hostile models/sumovf.json)
    q.parameters = units_of(8, 1ull << 59, dtype::float32, true);
    q.precision = precision::mixed_adam();
    const char* expected[] = {"the optimizer state memory per rank", "the parameter memory per rank",
                              "the parameter memory per rank", "the total memory per rank"};
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(stage);
      q.stage = stage;
      refused(q, expected[stage]);
    }
    q.stage = 0;
    q.world_size = 1;
    q.precision = precision{};
    q.parameters = units_of(4, 1ull << 59, dtype::float32, true);  // Adam states: 2 * 4 * 2^61 bytes
    refused(q, "the optimizer state memory per rank");
    q.parameters = units_of(3, e60, dtype::float16, true);
    q.precision.gradient = dtype::float64;  // 3 * 8 * (2^60 - 16) bytes of gradients
    refused(q, "the gradient memory per rank");
    q.precision.gradient.reset();
    q.precision.master = dtype::float64;
    refused(q, "the master weight memory per rank");
    q.precision = precision{};
    q.precision.optimizer_states = 0;  // plain SGD: parameters and gradients, 3 * 2^62 - 192 bytes each
    q.parameters = units_of(3, e60, dtype::float32, true);
    refused(q, "the model-state memory per rank (parameters, gradients, master weights, optimizer states)");
  }
  SUBCASE("the communication buffers: two gather buffers and a bucket of 2^63 - 2^24 bytes") {
    plan_request q;
    q.world_size = 1 << 20;
    q.stage = 3;
    q.precision.optimizer_states = 0;
    q.parameters = units_of(2, (1ull << 60) - (1ull << 21), dtype::float64, true);
    refused(q, "the communication buffer memory per rank");
  }
  SUBCASE("traffic: elements and bytes per collective, and the step's volume") {
    plan_request q;
    q.parameters = {spec("w", {1ull << 40}, dtype::float32, true, {}, "u")};  // models/big40.json
    q.world_size = 4;
    q.stage = 3;
    q.accumulation_steps = 2147483647;
    refused(q, "the all_gather traffic per step (parameters before forward) in elements");
    q.stage = 2;
    refused(q, "the reduce_scatter traffic per step (gradients) in elements");
    q.accumulation_steps = 1 << 22;  // 2^62 elements, 2^64 bytes
    refused(q, "the reduce_scatter traffic per step (gradients) in bytes");
    q.accumulation_steps = (1 << 22) - 1;
    const shard_plan plan(q);
    REQUIRE(plan.traffic().size() == 2);
    CHECK(plan.traffic()[0].elements == ((1ull << 22) - 1) << 40);
    CHECK(plan.traffic()[0].bytes == 0 - (1ull << 42));  // 2^64 - 2^42: the largest that fits
    CHECK(plan.traffic()[1].elements == 1ull << 40);
    // One frozen int8 unit of 2^59 elements at stage 3, gathered before forward and before
    // backward in each of 16 micro-batches: 2^63 elements (and bytes) each, 2^64 in all.
    q.parameters = {spec("frozen", {1ull << 59}, dtype::int8, false, {}, "u")};
    q.stage = 3;
    q.accumulation_steps = 15;
    const shard_plan fits(q);
    REQUIRE(fits.traffic().size() == 2);
    CHECK(fits.traffic()[0].elements == 15ull << 59);
    CHECK(fits.traffic()[1].bytes == 15ull << 59);
    q.accumulation_steps = 16;
    refused(q, "the communication volume per step in elements");
  }
}

TEST_CASE("preset models have their published parameter counts") {
  const std::pair<const char*, std::uint64_t> expected[] = {
      {"gpt2", 124439808ull},     {"gpt2-medium", 354823168ull}, {"gpt2-large", 774030080ull},
      {"gpt2-xl", 1557611200ull}, {"llama-7b", 6738415616ull},   {"llama-70b", 68976648192ull}};
  for (const auto& [name, count] : expected) {
    plan_request q;
    q.parameters = *preset_parameters(name);
    q.world_size = 1024;
    q.stage = 3;
    q.precision = precision::mixed_adam();
    const shard_plan plan(q);
    CAPTURE(name);
    CHECK(plan.parameter_elements() == count);
    CHECK(plan.trainable_elements() == count);
  }
  CHECK_FALSE(preset_parameters("gpt5").has_value());
}

TEST_CASE("bad requests are refused with a message naming the problem") {
  auto base = [] {
    plan_request q;
    q.parameters = {spec("a", {4}), spec("b", {4})};
    q.world_size = 4;
    q.stage = 1;
    return q;
  };
  check_invalid(
      [&] {
        auto q = base();
        q.world_size = 0;
        shard_plan p(q);
      },
      "world size must be at least 1, got 0");
  check_invalid(
      [&] {
        auto q = base();
        q.alignment_bytes = 24;
        shard_plan p(q);
      },
      "alignment must be a power of two");
  check_invalid(
      [&] {
        auto q = base();
        q.alignment_bytes = 0;
        shard_plan p(q);
      },
      "alignment must be a power of two");
  check_invalid(
      [&] {
        auto q = base();
        q.stage = 4;
        shard_plan p(q);
      },
      "stage must be 0, 1, 2 or 3, got 4");
  check_invalid(
      [&] {
        auto q = base();
        q.reshard_after_forward = static_cast<reshard_policy>(7);
        shard_plan p(q);
      },
      "reshard_after_forward must be all, except_last or none, got value 7");
  check_invalid(
      [&] {
        auto q = base();
        q.replica_group_size = 3;
        shard_plan p(q);
      },
      "replica group size 3 does not divide world size 4");
  check_invalid(
      [&] {
        auto q = base();
        q.replica_group_size = -1;
        shard_plan p(q);
      },
      "replica group size must be positive");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters[1].type = static_cast<dtype>(42);
        shard_plan p(q);
      },
      "parameter 1 ('b') has unknown dtype value 42");
  check_invalid(
      [&] {
        auto q = base();
        q.precision.parameter = static_cast<dtype>(99);
        shard_plan p(q);
      },
      "unknown dtype value 99");
  check_invalid(
      [&] {
        auto q = base();
        q.precision.master = dtype::int32;
        shard_plan p(q);
      },
      "master weight type must have a floating-point dtype");
  check_invalid(
      [&] {
        auto q = base();
        q.precision.optimizer_states = -1;
        shard_plan p(q);
      },
      "optimizer states");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters[1].name = "a";
        shard_plan p(q);
      },
      "parameter name 'a' is used twice");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters[0].name.clear();
        shard_plan p(q);
      },
      "parameter 0 has an empty name");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters[0].type = dtype::int32;
        shard_plan p(q);
      },
      "is trainable but has the integer dtype int32");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters[0].shape = {1ull << 40, 1ull << 40};
        shard_plan p(q);
      },
      "overflows 64 bits");
  check_invalid(
      [&] {
        auto q = base();
        q.accumulation_steps = 0;
        shard_plan p(q);
      },
      "accumulation steps must be at least 1");
  check_invalid(
      [&] {
        auto q = base();
        q.max_inflight_reductions = 0;
        shard_plan p(q);
      },
      "max_inflight_reductions");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters[0].unit = "auto:3";
        shard_plan p(q);
      },
      "reserved for automatic units");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters = {spec("x", {4, 2}, {}, true, "t"), spec("y", {2, 4}, {}, true, "t")};
        shard_plan p(q);
      },
      "tie group 't': 'x' and 'y' have different shapes ([4, 2] vs [2, 4])");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters = {spec("x", {4}, dtype::float32, true, "t"), spec("y", {4}, dtype::bfloat16, true, "t")};
        shard_plan p(q);
      },
      "different dtypes (float32 vs bfloat16)");
  check_invalid(
      [&] {
        auto q = base();
        q.parameters = {spec("x", {4}, {}, true, "t"), spec("y", {4}, {}, false, "t")};
        shard_plan p(q);
      },
      "different trainable flags");
  check_invalid(
      [&] {
        const shard_plan p(base());
        (void)p.fragments(4);
      },
      "rank 4 is outside [0, 4)");
  check_invalid(
      [&] {
        const shard_plan p(base());
        (void)p.owner(0, 4);
      },
      "element 4 is outside parameter 'a'");
}
