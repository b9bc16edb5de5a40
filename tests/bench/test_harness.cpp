// The benchmarks' harness (bench/harness/): nccl-tests' bus factors, the shapes of a size, the
// sweep, mean and median, and the exact check: every collective on 1-4 ranks of the local backend,
// out of place and in place, over several dtypes and ops, must count 0 wrong elements, and exactly
// one after one element of a rank's output is changed.

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/collective.hpp"
#include "harness/table.hpp"
#include "harness/timing.hpp"
#include "ringzero/backend/local/launch.hpp"

namespace rz = ringzero;
namespace rb = ringzero::bench;

TEST_CASE("bench harness: nccl-tests' bus factors") {
  // 2(n-1)/n, (n-1)/n and 1 at world sizes where they are exact in binary
  for (const auto& [n, ar, ag] :
       std::vector<std::tuple<int, double, double>>{{1, 0.0, 0.0}, {2, 1.0, 0.5}, {4, 1.5, 0.75}, {8, 1.75, 0.875}}) {
    CAPTURE(n);
    CHECK(rb::all_reduce_bench.bus_factor(n) == ar);
    CHECK(rb::reduce_scatter_bench.bus_factor(n) == ag);
    CHECK(rb::all_gather_bench.bus_factor(n) == ag);
    CHECK(rb::all_to_all_bench.bus_factor(n) == ag);
    CHECK(rb::broadcast_bench.bus_factor(n) == 1.0);
    CHECK(rb::reduce_bench.bus_factor(n) == 1.0);
    CHECK(rb::barrier_bench.bus_factor(n) == 0.0);
  }
  CHECK_THROWS_AS(rb::describe_bench(rz::collective_kind::send), rz::error);
  for (rz::collective_kind k :
       {rz::collective_kind::all_reduce, rz::collective_kind::reduce_scatter, rz::collective_kind::all_gather,
        rz::collective_kind::broadcast, rz::collective_kind::reduce, rz::collective_kind::all_to_all,
        rz::collective_kind::barrier})
    CHECK(rb::describe_bench(k).kind == k);
}

TEST_CASE("bench harness: a size's shape (nccl-tests' size and count)") {
  auto shape = [](const rb::collective_descriptor& d, std::uint64_t bytes, std::size_t es, int n) {
    const rb::row_shape s = d.shape(bytes, es, n);
    return std::vector<std::uint64_t>{s.count, s.send_elems, s.recv_elems, s.size_bytes};
  };
  CHECK(shape(rb::all_reduce_bench, 1024, 4, 3) == std::vector<std::uint64_t>{256, 256, 256, 1024});
  CHECK(shape(rb::broadcast_bench, 1026, 2, 3) == std::vector<std::uint64_t>{513, 513, 513, 1026});
  // one block per rank: 1024 B of float32 on 3 ranks is 3 blocks of 84 (a multiple of 4): 1008 B
  CHECK(shape(rb::reduce_scatter_bench, 1024, 4, 3) == std::vector<std::uint64_t>{84, 252, 84, 1008});
  CHECK(shape(rb::all_gather_bench, 1024, 4, 3) == std::vector<std::uint64_t>{84, 84, 252, 1008});
  CHECK(shape(rb::all_to_all_bench, 1024, 4, 3) == std::vector<std::uint64_t>{84, 252, 252, 1008});
  CHECK(shape(rb::all_gather_bench, 8, 4, 2) == std::vector<std::uint64_t>{0, 0, 0, 0});  // below 4 elements per rank
  CHECK(shape(rb::barrier_bench, 4096, 4, 2) == std::vector<std::uint64_t>{0, 0, 0, 0});
}

TEST_CASE("bench harness: sweep, mean and median, placement") {
  CHECK(rb::sweep_sizes(1024, 1 << 20, 4, 0) == std::vector<std::uint64_t>{1024, 4096, 16384, 65536, 262144, 1 << 20});
  CHECK(rb::sweep_sizes(10, 35, 1, 10) == std::vector<std::uint64_t>{10, 20, 30});
  CHECK(rb::sweep_sizes(5, 4, 2, 1).empty());
  CHECK(rb::sweep_sizes(1ull << 62, ~0ull, 4, 0) == std::vector<std::uint64_t>{1ull << 62});  // 2^64 overflows: stop
  const rb::time_summary even = rb::summarize({3, 1, 2, 10}), odd = rb::summarize({5, 1, 3});
  CHECK(even.mean_us == 4.0);
  CHECK(even.median_us == 2.5);
  CHECK(odd.mean_us == 3.0);
  CHECK(odd.median_us == 3.0);
  const rb::row_shape s = rb::all_reduce_bench.shape(1 << 20, 4, 4);
  const rb::placement_result p = rb::make_placement(rb::all_reduce_bench, s, 4, false, {2048.0, 1024.0}, 0, 8.0);
  CHECK(p.time_us == 2048.0);  // the mean, not the median
  CHECK(p.median_us == 1024.0);
  CHECK(p.algbw == 1048576.0 / 2048.0 / 1e3);
  CHECK(p.busbw == p.algbw * 1.5);
  CHECK(p.peak_fraction == 4 * 2 * 1048576.0 / (8.0 * 1e3) / 2048.0);  // n * 2S over 8 GB/s over the mean
  CHECK(rb::make_placement(rb::all_reduce_bench, s, 1, true, {2048.0, 1024.0}, 0, 8.0).peak_fraction <
        0);  // nothing to move
}

TEST_CASE("bench harness: table, CSV and JSON cells") {
  rb::result_row r;
  r.kind = rz::collective_kind::all_to_all;
  r.size_bytes = 4096;
  r.count = 341;
  r.ranks = 3;
  r.algorithm = "direct";
  r.out_of_place = {true, 12.5, 11.25, 0.33, 0.22, 0.5, 0};
  auto words = [](const std::string& line, char sep) {
    std::vector<std::string> out(1);
    for (char c : line) {
      if (c == '\n') continue;
      if (c == sep) {
        if (sep != ' ' || !out.back().empty()) out.emplace_back();
      } else {
        out.back() += c;
      }
    }
    if (sep == ' ' && out.back().empty()) out.pop_back();
    return out;
  };
  CHECK(words(rb::table_row(r), ' ') == std::vector<std::string>{"4096", "1024", "float", "none", "-1", "12.50", "0.33",
                                                                 "0.22", "0", "N/A", "N/A", "N/A", "N/A", "direct",
                                                                 "11.25", "50.0%", "N/A", "N/A"});
  const std::vector<std::string> header = words(rb::csv_header(), ','), row = words(rb::csv_row(r), ',');
  CHECK(header.size() == 21);
  CHECK(row == std::vector<std::string>{"4096",  "1024", "float", "none", "-1",         "12.5", "0.33",
                                        "0.22",  "0",    "",      "",     "",           "",     "direct",
                                        "11.25", "50",   "",      "",     "all_to_all", "3",    ""});
  r.requested = "auto";
  CHECK(words(rb::table_row(r), ' ')[13] == "auto->direct");
  CHECK(rb::json_string("a\"b\\c\n") == "\"a\\\"b\\\\c\\u000a\"");
  CHECK(rb::json_number(1.0 / 0.0) == "null");
}

namespace {

// Runs descriptor `d` on n local ranks for one size, dtype and op, both placements: every rank's
// check counts 0, and 1 after its first checked output element is changed.
void check_exact(const rb::collective_descriptor& d, int n, rz::dtype t, rz::reduce_kind op, int root) {
  const std::size_t es = rz::dtype_size(t);
  const rb::row_shape s = d.shape(1000 * es, es, n);
  for (bool in_place : {false, true}) {
    if (in_place && !d.has_in_place) continue;
    CAPTURE(in_place);
    std::vector<std::int64_t> clean(static_cast<std::size_t>(n), -1), spoiled(static_cast<std::size_t>(n), -1);
    rz::local::launch(n, [&](rz::communicator& c) {
      const int r = c.rank();
      std::vector<unsigned char> send(s.send_elems * es + 8),
          recv((s.send_elems > s.recv_elems ? s.send_elems : s.recv_elems) * es + 8);
      rb::fill_row(d, send.data(), recv.data(), s, t, op, r, in_place);
      rb::call_args a;
      a.send = send.data();
      a.recv = recv.data();
      a.shape = s;
      a.type = t;
      a.op = op;
      a.root = root;
      a.in_place = in_place;
      d.call(c, a, r, n);
      clean[static_cast<std::size_t>(r)] = d.verify(recv.data(), s, t, op, root, r, n, in_place);
      // the first element the check reads: this rank's own block of reduce_scatter in place
      unsigned char* first = recv.data() + (in_place ? d.output_offset(s.count, r) : 0) * es;
      first[0] ^= 0x5A;
      spoiled[static_cast<std::size_t>(r)] = d.verify(recv.data(), s, t, op, root, r, n, in_place);
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(clean[static_cast<std::size_t>(r)] == 0);
      const bool checks_output = d.kind != rz::collective_kind::reduce || r == root;
      CHECK(spoiled[static_cast<std::size_t>(r)] == (checks_output && d.moves_data ? 1 : 0));
    }
  }
}

}  // namespace

TEST_CASE("bench harness: the exact check on the local backend") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    for (const rb::collective_descriptor* d :
         {&rb::all_reduce_bench, &rb::reduce_scatter_bench, &rb::all_gather_bench, &rb::broadcast_bench,
          &rb::reduce_bench, &rb::all_to_all_bench, &rb::barrier_bench}) {
      CAPTURE(rz::collective_name(d->kind));
      const bool reduces = rz::is_reduction(d->kind);
      for (rz::dtype t : {rz::dtype::float32, rz::dtype::bfloat16, rz::dtype::int8, rz::dtype::float64}) {
        CAPTURE(rz::dtype_name(t));
        for (rz::reduce_kind op :
             reduces
                 ? std::vector<rz::reduce_kind>{rz::reduce_kind::sum, rz::reduce_kind::prod, rz::reduce_kind::min,
                                                rz::reduce_kind::max, rz::reduce_kind::avg, rz::reduce_kind::premul_sum}
                 : std::vector<rz::reduce_kind>{rz::reduce_kind::sum}) {
          CAPTURE(rz::reduce_kind_name(op));
          check_exact(*d, n, t, op, rz::has_root(d->kind) ? n - 1 : -1);
        }
      }
    }
  }
}
