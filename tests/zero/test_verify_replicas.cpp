// verify_replicas (ringzero/verify_replicas.hpp): replicas that hold equal state pass, one
// flipped bit on one rank is reported on every rank naming the rank and the tensor; the tensor
// lists that differ in length or size; the DDP reducer; the sharded runtime at every stage on the
// host path and on the device path (host stream), and across the replica groups of hybrid
// sharding.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/verify_replicas.hpp"
#include "zero_test_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;
using namespace zero_test;

namespace {

bool vr_has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string vr_hex(std::uint64_t h) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(h));
  return text;
}

/// Each rank's vr_outcome: the error's kind and message, or nothing.
struct vr_outcome {
  std::optional<errc> kind;
  std::string what;
};

template <class Body>
std::vector<vr_outcome> vr_run(int world, Body&& body) {
  std::vector<vr_outcome> out(static_cast<std::size_t>(world));
  local::launch(world, [&](communicator& comm) {
    auto& o = out[static_cast<std::size_t>(comm.rank())];
    try {
      body(comm);
    } catch (const error& e) {
      o.kind = e.kind();
      o.what = e.what();
    }
  });
  return out;
}

/// Four tensors of 1, 12, 0 and 4099 bytes, alike on every rank.
std::vector<std::vector<unsigned char>> vr_tensors() {
  std::vector<std::vector<unsigned char>> v = {std::vector<unsigned char>(1, 7), std::vector<unsigned char>(12),
                                               std::vector<unsigned char>(), std::vector<unsigned char>(4099)};
  for (std::size_t i = 0; i < v[1].size(); ++i) v[1][i] = static_cast<unsigned char>(3 * i + 1);
  for (std::size_t i = 0; i < v[3].size(); ++i) v[3][i] = static_cast<unsigned char>(i * 31 % 251);
  return v;
}

std::vector<replica_tensor> vr_views(const std::vector<std::vector<unsigned char>>& v) {
  std::vector<replica_tensor> t;
  for (std::size_t i = 0; i < v.size(); ++i) t.push_back({"t" + std::to_string(i), v[i].data(), v[i].size()});
  return t;
}

}  // namespace

TEST_CASE("verify_replicas: equal tensors pass on worlds 1-4 with the same hash everywhere") {
  for (int n = 1; n <= 4; ++n) {
    std::vector<replica_check> checks(static_cast<std::size_t>(n));
    const auto out = vr_run(n, [&](communicator& comm) {
      const auto data = vr_tensors();
      checks[static_cast<std::size_t>(comm.rank())] = verify_replicas(comm, vr_views(data));
    });
    for (const auto& o : out) CHECK_MESSAGE(!o.kind, o.what);
    for (const auto& c : checks) {
      CHECK(c.tensors == 4);
      CHECK(c.bytes == 1 + 12 + 0 + 4099);
      CHECK(c.replicas == n);
      CHECK(c.hash == checks[0].hash);
    }
    // The hash is XXH3-64 of the tensors' XXH3-64s, in order.
    const auto data = vr_tensors();
    std::vector<std::uint64_t> h;
    for (const auto& t : data) h.push_back(XXH3_64bits(t.data(), t.size()));
    CHECK(checks[0].hash == XXH3_64bits(h.data(), h.size() * 8));
  }
}

TEST_CASE("verify_replicas: one flipped bit on one rank is reported on every rank, naming the rank and tensor") {
  for (int n : {2, 3, 4}) {
    for (int bad : {0, n - 1}) {
      CAPTURE(n);
      CAPTURE(bad);
      const auto good = vr_tensors();
      auto flipped = good;
      flipped[3][4000] ^= 0x10;
      flipped[1][0] ^= 0x01;
      const auto out = vr_run(n, [&](communicator& comm) {
        verify_replicas(comm, vr_views(comm.rank() == bad ? flipped : good), "parameters");
      });
      const std::string good_hash = vr_hex(XXH3_64bits(good[1].data(), good[1].size()));
      const std::string bad_hash = vr_hex(XXH3_64bits(flipped[1].data(), flipped[1].size()));
      std::vector<int> others;
      for (int r = 0; r < n; ++r)
        if (r != bad) others.push_back(r);
      // The majority first; on 2 ranks (1 against 1) the lower rank first.
      const std::string versions = n == 2 ? (bad == 0 ? "rank 0 holds " + bad_hash + "; rank 1 holds " + good_hash
                                                      : "rank 0 holds " + good_hash + "; rank 1 holds " + bad_hash)
                                          : ringzero::detail::describe_ranks(others) + " hold " + good_hash +
                                                "; rank " + std::to_string(bad) + " holds " + bad_hash;
      for (int r = 0; r < n; ++r) {
        const auto& o = out[static_cast<std::size_t>(r)];
        INFO(o.what);
        REQUIRE(o.kind);
        CHECK(*o.kind == errc::replica_mismatch);
        CHECK(vr_has(o.what, "verify_replicas: rank " + std::to_string(r) +
                                 ": the replicas' parameters differ: tensor 1 't1' (12 bytes) differs: " + versions +
                                 " (XXH3-64 of its bytes); 2 of 4 tensors differ"));
      }
    }
  }
}

TEST_CASE("verify_replicas: different numbers of tensors or bytes are named on every rank") {
  auto out = vr_run(3, [&](communicator& comm) {
    auto data = vr_tensors();
    if (comm.rank() == 1) data.emplace_back(5);
    verify_replicas(comm, vr_views(data));
  });
  for (const auto& o : out) {
    INFO(o.what);
    CHECK(o.kind == errc::replica_mismatch);
    CHECK(vr_has(o.what, "the replicas' tensors differ: the number of tensors: ranks 0, 2: 4; rank 1: 5"));
  }
  out = vr_run(2, [&](communicator& comm) {
    auto data = vr_tensors();
    if (comm.rank() == 0) data[2].push_back(1);
    verify_replicas(comm, vr_views(data));
  });
  for (const auto& o : out) {
    INFO(o.what);
    CHECK(o.kind == errc::replica_mismatch);
    CHECK(vr_has(o.what, "the number of bytes: rank 0: 4113; rank 1: 4112"));
  }
}

TEST_CASE("ddp::verify_replicas: the reducer's parameters, broadcast alike, then one rank's bit flipped") {
  const auto out = vr_run(3, [&](communicator& comm) {
    std::vector<float> w(100, static_cast<float>(comm.rank())), b(7, 1.5f), gw(100), gb(7);
    std::vector<ddp::reducer_parameter> ps = {
        ddp::reducer_parameter::of(std::span<float>(w), std::span<float>(gw), "w"),
        ddp::reducer_parameter::of(std::span<float>(b), std::span<float>(gb), "b")};
    ddp::gradient_reducer reducer(comm, ps);
    const replica_check c = ddp::verify_replicas(reducer);  // rank 0's values everywhere
    CHECK(c.tensors == 2);
    CHECK(c.bytes == 107 * 4);
    if (comm.rank() == 2) b[3] = std::nextafter(b[3], 2.0f);
    ddp::verify_replicas(reducer);
  });
  for (const auto& o : out) {
    INFO(o.what);
    CHECK(o.kind == errc::replica_mismatch);
    CHECK(vr_has(o.what, "the replicas' parameters differ: tensor 1 'b' (28 bytes) differs: ranks 0-1 hold "));
    CHECK(vr_has(o.what, "; rank 2 holds "));
  }
}

TEST_CASE("zero::verify_replicas: every stage, host path and device path; a flipped bit is named at stages 0-2") {
  // Variant 4: stage 3 with the frozen matrix kept gathered (held whole, so compared). Variant
  // 5: stage 3 after an evaluation pass that kept every unit gathered (reshard_after_forward
  // none): the gathered copies are compared ("NAME#gathered").
  for (int variant = 0; variant <= 5; ++variant)
    for (bool device : {false, true}) {
      const int stage = std::min(variant, 3);
      const bool kept = variant == 4, evaluated = variant == 5;
      std::atomic<std::uint64_t> gathered{0};
      CAPTURE(evaluated);
      CAPTURE(stage);
      CAPTURE(kept);
      CAPTURE(device);
      const auto out = vr_run(2, [&](communicator& comm) {
        plan_request q;
        q.parameters = test_parameters();
        q.stage = stage;
        q.alignment_bytes = 16;
        q.keep_frozen_bytes = kept ? keep_all_frozen : 0;
        if (evaluated) q.reshard_after_forward = reshard_policy::none;
        primitive::host_stream compute;
        host_execution_stream stream(compute);
        std::optional<sharded_model> model;
        if (device)
          model.emplace(comm, q, device_context{&stream});
        else
          model.emplace(comm, q);
        if (device) {
          set_initial_parameters(*model);  // through the runtime's stream into its memory
        } else {
          run_config cfg;
          cfg.steps = 2;
          train_sharded(*model, comm.rank(), cfg);
        }
        std::uint64_t held = 0;  // the parameters of the units the evaluation leaves gathered
        if (evaluated) {
          for (std::size_t u = 0; u < model->unit_count(); ++u) {
            model->pre_forward(u);
            model->post_forward(u);
          }
          for (std::size_t b = 0; b < model->plan().buffers().size(); ++b)
            if (model->plan().buffers()[b].shard_numel > 0) held += model->plan().buffers()[b].parameters.size();
          CHECK(held > 3);
          gathered = held;  // the same on every rank
        }
        const replica_check c = zero::verify_replicas(*model);
        // Stages 0-2 compare every parameter (frozen and empty ones too; ties once); stage 3 holds
        // nothing alike between steps without replica groups, but the frozen matrix kept whole
        // and the units an evaluation left gathered.
        CHECK(c.tensors == (stage <= 2 ? 9u : kept ? 1u : held));
        if (stage == 3 && !kept && !evaluated) return;
        // Flip a bit of "l2.b" on rank 1 (through the held parameters: the model's own memory).
        const std::size_t p = model->index(kept ? "frozen.w" : "l2.b");
        const parameter_placement& pl = model->plan().placements()[p];
        if (comm.rank() == 1) {
          model->synchronize();
          checkpoint_access access(*model);
          unsigned char* bytes = evaluated ? const_cast<unsigned char*>(access.gathered_parameters(pl.buffer))
                                           : access.held_parameters(pl.buffer);
          bytes[pl.offset * 4 + 2] ^= 0x04;
        }
        zero::verify_replicas(*model);
      });
      for (const auto& o : out) {
        INFO(o.what);
        if (stage == 3 && !kept && !evaluated) {
          CHECK(!o.kind);
          continue;
        }
        CHECK(o.kind == errc::replica_mismatch);
        CHECK(vr_has(o.what, "the replicas' parameters differ: tensor "));
        CHECK(vr_has(o.what, kept        ? " 'frozen.w' (36 bytes) differs: rank 0 holds "
                             : evaluated ? " 'l2.b#gathered' (16 bytes) differs: rank 0 holds "
                                         : " 'l2.b' (16 bytes) differs: rank 0 holds "));
        CHECK(vr_has(o.what, kept        ? "1 of 1 tensors differ"
                             : evaluated ? "1 of " + std::to_string(gathered.load()) + " tensors differ"
                                         : "1 of 9 tensors differ"));
      }
    }
}

TEST_CASE("zero::verify_replicas with hybrid sharding: a shard differing across replica groups fails every rank") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    // Rank r: shard group r / 2 ({0,1}, {2,3}), replica group r % 2 ({0,2}, {1,3}).
    local::world shard0(2), shard1(2), replica0(2), replica1(2);
    std::vector<vr_outcome> out(4);
    std::vector<replica_check> checks(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        auto& o = out[static_cast<std::size_t>(r)];
        try {
          local::communicator shard_comm(r / 2 == 0 ? shard0 : shard1, r % 2);
          local::communicator replica_comm(r % 2 == 0 ? replica0 : replica1, r / 2);
          shard_comm.set_timeout(std::chrono::seconds(30));
          replica_comm.set_timeout(std::chrono::seconds(30));
          plan_request q;
          q.parameters = test_parameters();
          q.stage = stage;
          q.alignment_bytes = 16;
          sharded_model model(shard_comm, q, {}, &replica_comm);
          run_config cfg;
          cfg.steps = 2;
          train_sharded(model, r, cfg);
          checks[static_cast<std::size_t>(r)] = zero::verify_replicas(model);
          if (r == 3) {  // shard group 1, replica group 1: its shard of "l1.w" against rank 1's
            const std::size_t p = model.index("l1.w");
            const parameter_placement& pl = model.plan().placements()[p];
            checkpoint_access a(model);
            const algorithms::range held = a.held_range(pl.buffer);
            const std::uint64_t at = std::max(pl.offset, held.begin);
            REQUIRE(at < held.end);
            a.held_parameters(pl.buffer)[(at - held.begin) * 4] ^= 0x80;
          }
          zero::verify_replicas(model);
        } catch (const error& e) {
          o.kind = e.kind();
          o.what = e.what();
          if (e.kind() != errc::replica_mismatch)
            for (auto* w : {&shard0, &shard1, &replica0, &replica1}) w->abort("rank failed");
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 4; ++r) {
      const auto& o = out[static_cast<std::size_t>(r)];
      INFO("rank " << r << ": " << o.what);
      REQUIRE(o.kind);
      CHECK(*o.kind == errc::replica_mismatch);
      if (r % 2 == 1)
        CHECK(vr_has(o.what, "the replicas' shards (across replica groups) differ: tensor "));
      else
        CHECK(vr_has(o.what, "the replicas' shards differ across replica groups: found by shard-group rank 1"));
    }
    // The first check compared parameters, master weights and optimizer states alike.
    CHECK(checks[0].replicas == 2);
  }
}

TEST_CASE("verify_replicas: a rank that cannot read its state fails with its own error, the others name it") {
  const auto out = vr_run(3, [&](communicator& comm) {
    const auto data = vr_tensors();
    std::exception_ptr failure;
    if (comm.rank() == 1) failure = std::make_exception_ptr(error(errc::backend_failure, "copy failed on rank 1"));
    ringzero::detail::verify_replicas_or_fail(comm, vr_views(data), "parameters", failure);
  });
  CHECK(out[1].kind == errc::backend_failure);
  CHECK(vr_has(out[1].what, "copy failed on rank 1"));
  for (int r : {0, 2}) {
    INFO(out[static_cast<std::size_t>(r)].what);
    CHECK(out[static_cast<std::size_t>(r)].kind == errc::aborted);
    CHECK(vr_has(out[static_cast<std::size_t>(r)].what,
                 "verify_replicas: rank " + std::to_string(r) +
                     ": rank 1 could not read the parameters (their errors say why)"));
  }
}
