// The ZeRO paper's memory and communication model, reproduced exactly, and how real plans differ;
// and the host memory blocks the runtime allocates.
#include <sys/mman.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ringzero/zero/host_buffer.hpp"
#include "ringzero/zero/paper_comparison.hpp"

using namespace ringzero;
using namespace ringzero::zero;

TEST_CASE("the paper's formulas: 16 Psi, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N, 16 Psi/N") {
  for (double psi : {1.0, 1e6, 7.5e9, 1e12}) {
    for (double n : {1.0, 4.0, 64.0, 1024.0}) {
      CHECK(paper_model_state_memory(psi, n, 0).total() == 16 * psi);
      CHECK(paper_model_state_memory(psi, n, 1).total() == 4 * psi + 12 * psi / n);
      CHECK(paper_model_state_memory(psi, n, 2).total() == 2 * psi + 14 * psi / n);
      CHECK(paper_model_state_memory(psi, n, 3).total() == 16 * psi / n);
      CHECK(paper_communication_volume(psi, 0) == 2 * psi);
      CHECK(paper_communication_volume(psi, 1) == 2 * psi);
      CHECK(paper_communication_volume(psi, 2) == 2 * psi);
      CHECK(paper_communication_volume(psi, 3) == 3 * psi);
    }
  }
  // Figure 1 of the paper: Psi = 7.5B, N = 64, K = 12.
  CHECK(paper_model_state_memory(7.5e9, 64, 0).total() == 120e9);
  CHECK(paper_model_state_memory(7.5e9, 64, 1).total() == 31.40625e9);   // "31.4GB"
  CHECK(paper_model_state_memory(7.5e9, 64, 2).total() == 16.640625e9);  // "16.6GB"
  CHECK(paper_model_state_memory(7.5e9, 64, 3).total() == 1.875e9);      // "1.9GB"
  // Categories: K Psi of optimizer state sharded from stage 1, gradients from 2, parameters at 3.
  const model_memory s2 = paper_model_state_memory(1024, 8, 2);
  CHECK(s2.parameters == 2048);
  CHECK(s2.gradients == 256);
  CHECK(s2.optimizer_states == 1536);
  // K is a parameter: Adam without a master copy has K = 8.
  CHECK(paper_model_state_memory(100, 4, 1, 8).total() == 400 + 200);
}

TEST_CASE("a plan under the paper's assumptions matches the paper exactly when sizes divide") {
  // Mixed-precision Adam, every size divisible by N times the alignment: no padding.
  std::vector<parameter_spec> params;
  for (int i = 0; i < 6; ++i) {
    parameter_spec s;
    s.name = "layer" + std::to_string(i) + ".weight";
    s.shape = {256, 128};
    s.unit = "layer" + std::to_string(i);
    params.push_back(s);
  }
  const double psi = 6.0 * 256 * 128;
  for (int n : {1, 2, 4, 8, 16, 64}) {
    for (int stage = 0; stage <= 3; ++stage) {
      plan_request q;
      q.parameters = params;
      q.world_size = n;
      q.stage = stage;
      q.alignment_bytes = 16;
      q.precision = precision::mixed_adam();
      const shard_plan plan(q);
      const paper_comparison c = compare_with_paper(plan);
      CAPTURE(n);
      CAPTURE(stage);
      CHECK(c.psi == psi);
      CHECK(c.padding_bytes == 0);
      CHECK(c.planned.parameters == c.paper.parameters);
      CHECK(c.planned.gradients == c.paper.gradients);
      CHECK(c.planned.optimizer_states == c.paper.optimizer_states);
      CHECK(static_cast<double>(plan.memory().model_states()) ==
            paper_model_state_memory(psi, stage == 0 ? 1 : n, stage).total());
      CHECK(static_cast<double>(c.planned_volume) == c.paper_volume);
      CHECK(c.replica_volume == 0);
      CHECK(c.buffer_bytes == plan.memory().communication_buffers);
    }
  }
}

TEST_CASE("the comparison reports padding, buffers, frozen parameters and hybrid traffic") {
  std::vector<parameter_spec> params(3);
  params[0].name = "odd";
  params[0].shape = {1001};
  params[0].unit = "a";
  params[1].name = "frozen";
  params[1].shape = {512};
  params[1].trainable = false;
  params[1].unit = "a";
  params[2].name = "other";
  params[2].shape = {77};
  params[2].unit = "b";
  plan_request q;
  q.parameters = params;
  q.world_size = 8;
  q.replica_group_size = 4;
  q.stage = 3;
  q.alignment_bytes = 16;
  q.precision = precision::mixed_adam();
  const shard_plan plan(q);
  const paper_comparison c = compare_with_paper(plan);
  CHECK(c.psi == 1001 + 512 + 77);
  CHECK(c.devices == 4);
  // unpadded: parameters 2 bytes each over 4 shards; gradients and K = 12 only for trainable ones
  CHECK(c.unpadded.parameters == 2.0 * (1001 + 512 + 77) / 4);
  CHECK(c.unpadded.gradients == 2.0 * (1001 + 77) / 4);
  CHECK(c.unpadded.optimizer_states == 12.0 * (1001 + 77) / 4);
  // float16 alignment unit 8 elements, 4 shards: multiples of 32; odd 1001 -> 1024, frozen 512, other 77 -> 96
  CHECK(plan.buffers()[0].numel == 1024);
  CHECK(plan.buffers()[1].numel == 512);
  CHECK(plan.buffers()[2].numel == 96);
  const double padded_trainable = 1024 + 96, unpadded_trainable = 1001 + 77;
  CHECK(c.padding_bytes == doctest::Approx((2.0 * (padded_trainable + 512) + 14.0 * padded_trainable -
                                            2.0 * (unpadded_trainable + 512) - 14.0 * unpadded_trainable) /
                                           4));
  CHECK(c.buffer_bytes > 0);
  CHECK(c.replica_volume == 2 * (1024 + 96) / 4);  // all_reduce of the gradient shards, counted twice
  // stage 3 volume within the group: two gathers of everything and one reduce_scatter of the trainable
  CHECK(c.planned_volume == 2 * (1024 + 512 + 96) + (1024 + 96));
}

TEST_CASE("the memory and volume sums are exact up to 2^64 - 1; a plan whose sum would wrap is refused") {
  auto refusal = [](const plan_request& q) {
    try {
      const shard_plan plan(q);
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // 16 frozen int8 tensors of 2^60 - 16 elements at stage 1: 2^64 - 256 bytes of parameters.
  plan_request q;
  q.stage = 1;
  for (int i = 0; i < 16; ++i) {
    parameter_spec s;
    s.name = "p";
    s.name += std::to_string(i);
    s.unit = s.name;
    s.shape = {(1ull << 60) - 16};
    s.type = dtype::int8;
    s.trainable = false;
    q.parameters.push_back(s);
  }
  const shard_plan full(q);
  CHECK(full.memory().model_states() == 0 - 256ull);
  CHECK(full.memory().total() == 0 - 256ull);
  q.parameters.front().type = dtype::float16;  // 2^60 - 16 more bytes
  CHECK(refusal(q) == "ringzero: zero::shard_plan: the parameter memory per rank overflows 64 bits");

  // 8 float32 tensors of 2^59 elements on 4 ranks at stage 3: the model states (7 * 2^61 bytes:
  // float16 gradients, two float32 Adam states) fit, the communication buffers on top do not.
  q.parameters.resize(8);
  for (parameter_spec& s : q.parameters) {
    s.shape = {1ull << 59};
    s.type = dtype::float32;
    s.trainable = true;
  }
  q.world_size = 4;
  q.stage = 3;
  q.precision = precision::mixed_adam();
  CHECK(refusal(q) == "ringzero: zero::shard_plan: the total memory per rank overflows 64 bits");

  // One frozen int8 unit of 2^59 elements at stage 3, gathered twice in each micro-batch: the
  // comparison adds 2 * 15 * 2^59 elements exactly; a 16th micro-batch would make it 2^64.
  q.parameters.resize(1);
  q.parameters[0].type = dtype::int8;
  q.parameters[0].trainable = false;
  q.accumulation_steps = 15;
  const paper_comparison c = compare_with_paper(shard_plan(q));
  CHECK(c.planned_volume == 30ull << 59);
  CHECK(c.paper_volume == 3.0 * 0x1p59);
  q.accumulation_steps = 16;
  CHECK(refusal(q) == "ringzero: zero::shard_plan: the communication volume per step in elements overflows 64 bits");
}

TEST_CASE("offload::optimizer: the plan counts device and host memory apart, byte for byte") {
  // bfloat16 parameters and gradients, float32 master weights and Adam's two float32 states; a
  // trainable parameter of 10 elements and a frozen one of 6, world size 2, alignment 16 bytes
  // (8 bfloat16 elements): each buffer is padded to 16 elements, shards of 8 (at stage 0, to a
  // multiple of 8: 16 and 8 elements).
  plan_request q;
  q.parameters.resize(2);
  q.parameters[0].name = "a";
  q.parameters[0].shape = {10};
  q.parameters[0].unit = "u0";
  q.parameters[1].name = "f";
  q.parameters[1].shape = {6};
  q.parameters[1].unit = "u0";
  q.parameters[1].trainable = false;
  q.world_size = 2;
  q.alignment_bytes = 16;
  q.precision = precision::bfloat16_adam();
  struct expected {
    int stage;
    std::uint64_t parameters, gradients, own;  // device bytes; elements the optimizer updates
  };
  for (const expected e :
       {expected{0, 48, 32, 16}, expected{1, 64, 32, 8}, expected{2, 64, 16, 8}, expected{3, 32, 16, 8}}) {
    CAPTURE(e.stage);
    q.stage = e.stage;
    q.offload = offload::none;
    const shard_plan plain(q);
    q.offload = offload::optimizer;
    const shard_plan off(q);
    const std::uint64_t buffers = plain.memory().communication_buffers;  // gather buffers, buckets
    // Without offload everything is device memory.
    CHECK(plain.device_memory() == plain.memory());
    CHECK(plain.host_memory() == memory_breakdown{});
    CHECK(plain.memory() == memory_breakdown{e.parameters, e.gradients, e.own * 4, e.own * 8, buffers});
    // With it: master weights (4 B), states (2 x 4 B) and the transfer buffers (the gradient and
    // the parameter shard, 2 + 2 B) of the updated range in host memory.
    CHECK(off.device_memory() == memory_breakdown{e.parameters, e.gradients, 0, 0, buffers});
    CHECK(off.host_memory() == memory_breakdown{0, 0, e.own * 4, e.own * 8, e.own * 4});
    CHECK(off.memory() == memory_breakdown{e.parameters, e.gradients, e.own * 4, e.own * 8, buffers + e.own * 4});
    CHECK(off.fingerprint() != plain.fingerprint());
    CHECK(off.traffic().size() == plain.traffic().size());
  }
  // offload::parameters (stage 3): the parameter shards (8 + 8 elements of 2 B), the gradient
  // shard (8 x 2 B), the master weights and states in host memory, no transfer buffers; the
  // device keeps the gather buffers and buckets.
  q.stage = 3;
  q.offload = offload::none;
  const shard_plan plain(q);
  q.offload = offload::parameters;
  const shard_plan shards_off(q);
  const std::uint64_t buffers = plain.memory().communication_buffers;
  CHECK(buffers > 0);
  CHECK(shards_off.host_memory() == memory_breakdown{32, 16, 32, 64, 0});
  CHECK(shards_off.device_memory() == memory_breakdown{0, 0, 0, 0, buffers});
  CHECK(shards_off.memory() == plain.memory());
  CHECK(shards_off.fingerprint() != plain.fingerprint());
  // A frozen buffer kept whole (replicated) stays on the device: f's 6 elements padded to 16.
  q.keep_frozen_bytes = keep_all_frozen;
  const shard_plan kept(q);
  CHECK(kept.host_memory() == memory_breakdown{16, 16, 32, 64, 0});
  CHECK(kept.device_memory() == memory_breakdown{32, 0, 0, 0, kept.memory().communication_buffers});
  q.keep_frozen_bytes = 0;
  q.offload = static_cast<offload>(7);
  CHECK_THROWS_WITH_AS(shard_plan{q}, doctest::Contains("offload must be none, optimizer or parameters, got value 7"),
                       error);
}

TEST_CASE("host_buffer: blocks from 2 MiB up are 2 MiB-aligned, zeroed, and mapped to their last page only") {
  // Nothing is mapped after a block's last page, so no huge page can hold its tail (a block never
  // holds a huge page it does not use); the free unmaps exactly the block.
  constexpr std::uint64_t mib = std::uint64_t{1} << 20;
  const auto mapped = [](std::uintptr_t at) {  // is the page at `at` mapped? (a fixed probe there fails)
    void* probe =
        ::mmap(reinterpret_cast<void*>(at), 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (probe == MAP_FAILED) return true;
    ::munmap(probe, 4096);
    return probe != reinterpret_cast<void*>(at);  // a kernel before 4.17 may place it elsewhere
  };
  for (const std::uint64_t bytes : {2 * mib, 2 * mib + 1, 3 * mib + 5, 8 * mib, 1 * mib}) {
    CAPTURE(bytes);
    for (const bool touched : {false, true}) {
      CAPTURE(touched);
      std::uintptr_t at = 0;
      {
        zero::detail::host_buffer b =
            touched ? zero::detail::host_buffer(bytes) : zero::detail::host_buffer::untouched(bytes);
        REQUIRE(b.bytes() == bytes);
        at = reinterpret_cast<std::uintptr_t>(b.data());
        const unsigned char* d = b.data();
        CHECK(std::all_of(d, d + bytes, [](unsigned char c) { return c == 0; }));
        if (bytes < zero::detail::host_buffer::huge_bytes || touched) {
          CHECK(at % zero::detail::host_buffer::page_bytes == 0);
          continue;
        }
        CHECK(at % zero::detail::host_buffer::huge_bytes == 0);
        const std::uintptr_t end = at + zero::detail::host_buffer::whole_pages(bytes);
        CHECK(mapped(end - 4096));
        CHECK(!mapped(end));
      }
      if (bytes >= zero::detail::host_buffer::huge_bytes && !touched) CHECK(!mapped(at));  // given back
    }
  }
}
