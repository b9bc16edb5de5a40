// backend/protocol/wire_record.hpp and contract_exchange.hpp: the check mode's record and the
// verdict that MPI and NCCL share, run here without either (ranks simulated in one thread, the
// byte exchange a copy): records survive encode/decode field for field, long reasons are cut,
// and every rank reaches the same verdict for layouts, ranks out of step, sequence numbers and
// the contract's fields.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/backend/protocol/contract_exchange.hpp"

using namespace ringzero;
using ringzero::detail::contract_verdict;
using ringzero::detail::wire_record;

namespace {

collective_descriptor sample(std::uint64_t sequence = 7) {
  collective_descriptor d;
  d.kind = collective_kind::reduce;
  d.sequence = sequence;
  d.count = 0x123456789ull;
  d.tag = 0xfeedface00000001ull;
  d.type = dtype::bfloat16;
  d.op.kind = reduce_kind::max;
  d.root = 3;
  d.algo = algorithm::halving_doubling;
  d.reproducible = reproducible_mode::accumulator;
  return d;
}

/// Every rank's verdict for the descriptors `ds` (one per rank), exchanged by copying records.
std::vector<std::optional<contract_verdict>> verdicts(const std::vector<collective_descriptor>& ds,
                                                      std::uint32_t layout_of_rank_1 = detail::wire_layout) {
  const int n = static_cast<int>(ds.size());
  std::vector<wire_record> sent;
  for (int r = 0; r < n; ++r) {
    sent.push_back(detail::encode(ds[static_cast<std::size_t>(r)], 42));
    if (r == 1) sent.back().layout = layout_of_rank_1;
  }
  std::vector<std::optional<contract_verdict>> out;
  for (int me = 0; me < n; ++me) {
    std::vector<wire_record> records;
    std::vector<collective_descriptor> decoded;
    out.push_back(detail::exchange_contract(
        n, me, ds[static_cast<std::size_t>(me)], 42, records, decoded, [&](std::vector<wire_record>& all) {
          REQUIRE(all.size() == sent.size());
          const wire_record own = detail::encode(ds[static_cast<std::size_t>(me)], 42);
          CHECK(std::memcmp(&all[static_cast<std::size_t>(me)], &own, sizeof(wire_record)) == 0);
          for (int p = 0; p < n; ++p)
            if (p != me) all[static_cast<std::size_t>(p)] = sent[static_cast<std::size_t>(p)];
        }));
  }
  return out;
}

/// Checks that every rank got the same verdict and returns it.
std::optional<contract_verdict> common_verdict(const std::vector<std::optional<contract_verdict>>& v) {
  for (const auto& x : v) {
    REQUIRE(x.has_value() == v.front().has_value());
    if (x) {
      CHECK(x->code == v.front()->code);
      CHECK(x->abort == v.front()->abort);
    }
  }
  return v.front();
}

}  // namespace

TEST_CASE("wire_record: encode then decode keeps every field the contract compares") {
  collective_descriptor d = sample();
  d.invalid = "send buffer is null";
  d.invalid_code = errc::unsupported;
  const wire_record w = detail::encode(d, 0xabcdef);
  CHECK(w.layout == 0x525A0006u);
  CHECK(w.instance == 0xabcdefu);
  CHECK(w.wire_bytes() == offsetof(wire_record, reason) + d.invalid.size());
  const collective_descriptor e = detail::decode(w);
  CHECK(e.kind == d.kind);
  CHECK(e.sequence == d.sequence);
  CHECK(e.count == d.count);
  CHECK(e.tag == d.tag);
  CHECK(e.type == d.type);
  CHECK(e.op.kind == d.op.kind);
  CHECK(e.root == d.root);
  CHECK(e.algo == d.algo);
  CHECK(e.reproducible == d.reproducible);
  CHECK(e.invalid == d.invalid);
  CHECK(e.invalid_code == errc::unsupported);
  CHECK(e.send == nullptr);
  CHECK(e.recv_bytes == 0);
}

TEST_CASE("wire_record: a reason longer than the record is cut and marked") {
  collective_descriptor d = sample();
  d.invalid = std::string(wire_record::max_reason, 'a') + "tail";
  const wire_record w = detail::encode(d, 1);
  CHECK(w.reason_length == wire_record::max_reason);
  CHECK(w.wire_bytes() == sizeof(wire_record));
  const std::string got = detail::decode(w).invalid;
  CHECK(got == std::string(wire_record::max_reason - 3, 'a') + "...");
  d.invalid = std::string(wire_record::max_reason, 'b');  // exactly fits: kept whole
  CHECK(detail::decode(detail::encode(d, 1)).invalid == d.invalid);
}

TEST_CASE("contract exchange: ranks that agree run, on every world size") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    std::vector<collective_descriptor> ds(static_cast<std::size_t>(n), sample());
    CHECK_FALSE(common_verdict(verdicts(ds)).has_value());
  }
}

TEST_CASE("contract exchange: every rank names the same difference") {
  SUBCASE("count") {
    std::vector<collective_descriptor> ds(4, sample());
    for (std::size_t r = 1; r < 4; ++r) ds[r].count = 5120;
    ds[0].count = 2560;
    const auto v = common_verdict(verdicts(ds));
    REQUIRE(v);
    CHECK(v->code == errc::contract_mismatch);
    CHECK_FALSE(v->abort);
    CHECK(v->message == "count mismatch: rank 0: 2560; ranks 1-3: 5120");
  }
  SUBCASE("sequence number, before any other field") {
    std::vector<collective_descriptor> ds(3, sample(7));
    ds[2] = sample(8);
    ds[2].count = 1;
    const auto v = common_verdict(verdicts(ds));
    REQUIRE(v);
    CHECK(v->code == errc::contract_mismatch);
    CHECK(v->message ==
          "sequence number mismatch (a rank issued collectives that others did not): ranks 0-1: #7; "
          "rank 2: #8");
  }
  SUBCASE("an invalid argument on one rank") {
    std::vector<collective_descriptor> ds(3, sample());
    ds[1].invalid = "root 9 is outside [0, 3)";
    const auto v = common_verdict(verdicts(ds));
    REQUIRE(v);
    CHECK(v->code == errc::invalid_argument);
    CHECK(v->message == "invalid arguments (rank 1: root 9 is outside [0, 3)); no rank ran it");
  }
  SUBCASE("the reproducible mode") {
    std::vector<collective_descriptor> ds(2, sample());
    ds[0].reproducible = reproducible_mode::off;
    const auto v = common_verdict(verdicts(ds));
    REQUIRE(v);
    CHECK(v->message ==
          "reproducible mode mismatch (check RINGZERO_REPRODUCIBLE and per-call options): rank 0: off; "
          "rank 1: accumulator");
  }
}

TEST_CASE("contract exchange: a record of another build is refused by name") {
  std::vector<collective_descriptor> ds(3, sample());
  const auto all = verdicts(ds, 0x525A0003u);
  for (int me : {0, 2}) {
    const auto& v = all[static_cast<std::size_t>(me)];
    REQUIRE(v);
    CHECK(v->code == errc::contract_mismatch);
    CHECK(v->message ==
          "rank 1 writes contract records of layout 0x525A0003 (this rank: 0x525A0006): the ranks run "
          "different ringzero builds; rebuild every rank from one version");
  }
}

TEST_CASE("contract exchange: a peer in a point-to-point transfer puts the ranks out of step (abort)") {
  std::vector<collective_descriptor> ds(3, sample(4));
  ds[1].kind = collective_kind::send;
  const auto all = verdicts(ds);
  const auto& v = all[0];
  REQUIRE(v);
  CHECK(v->code == errc::contract_mismatch);
  CHECK(v->abort);
  CHECK(v->message ==
        "rank 1 runs a point-to-point send/recv with rank 0 while rank 0 runs reduce #4: the ranks do "
        "not run the same operations in the same order");
}
