// ringzero-mpi-compare: ringzero's collectives over MPI point-to-point against MPI's own
// (algorithm `native`), side by side in one run, under mpirun.
//
//   mpirun -np 4 ringzero-mpi-compare -b 64K -e 256M -f 2 -n 20 -w 5
//
// For every size it runs, on the same buffers, the collective (all_reduce unless --collective
// says otherwise) with ring, halving_doubling and native, plus the algorithm the cost model
// picks (auto), taking turns in blocks of 10 iterations so that the machine's slow and fast
// phases fall on all four alike. It prints the benchmarks' table (bench/harness: nccl-tests'
// columns, one row per algorithm, the placement not measured N/A; time is the mean of the
// per-iteration times, each the slowest rank's, the median beside it), then per size the ratio
// native / best of the medians (best: the faster of ring and halving_doubling; >= 1: ringzero at
// least matches MPI). Every algorithm's result is first checked bitwise against exact values
// (#wrong); the exit status is non-zero when any is wrong. Buffers are allocated and touched
// once, before the first row. --json FILE and --csv FILE keep the rows. The MPI library runs
// with its default settings (whatever the environment gives it).
//
//   mpirun -np 2 ringzero-mpi-compare -b 4K -e 256M -f 4 -n 50 --write-tuning tuning.txt
//
// also writes (rank 0) a tuning table (core/tuning_table.hpp): per measured size, the fastest of
// ring, halving_doubling and native by median where it beats the choice in force (auto's) by
// more than --tuning-margin (default 10%, this machine's run-to-run noise), else auto's choice,
// from that size up to the next, consecutive sizes with the same algorithm merged;
// RINGZERO_MPI_TUNING=tuning.txt then makes auto follow it on this collective and world size.
//
//   mpirun -np 2 ringzero-mpi-compare --link
//
// measures instead the cost parameters of the algorithm choice on this machine and network
// (alpha: one exchange step of 8-byte messages between ring neighbours; beta: the extra time
// per byte of an exchange step, from 64 KiB and 1 MiB steps; gamma: the float32 combine per
// byte of 256 KiB; all sizes where the model's choices fall, in cache), prints them as an
// mpi::communicator_options::link value, and measures what the check mode (RINGZERO_CHECK=1) adds to a barrier and to
// an 8-byte all_reduce.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ringzero/backend/mpi.hpp"
#include "ringzero/ringzero.hpp"

#include "harness/collective.hpp"
#include "harness/table.hpp"
#include "harness/timing.hpp"
#include "size_arg.hpp"

namespace rz = ringzero;
using ringzero::bench::parse_size;
using clock_type = std::chrono::steady_clock;

namespace {

struct free_deleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

/// One algorithm's measurement of one size: the harness's row (one placement measured, the
/// other N/A) and what auto resolved to.
struct measurement {
  rz::bench::result_row row;
  const rz::bench::placement_result& measured(bool in_place) const {
    return in_place ? row.in_place : row.out_of_place;
  }
};

class compare {
 public:
  compare(rz::mpi::communicator& comm, rz::collective_kind kind, int iters, int warmup, bool in_place,
          std::uint64_t max_bytes)
      : comm_(comm), desc_(rz::bench::describe_bench(kind)), iters_(iters), warmup_(warmup), in_place_(in_place) {
    n_ = comm.world_size();
    r_ = comm.rank();
    const std::uint64_t bytes = (std::max<std::uint64_t>(max_bytes, 64) + 4095) / 4096 * 4096;
    send_.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, bytes)));
    recv_.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, bytes)));
    if (!send_ || !recv_)
      throw std::runtime_error("cannot allocate two buffers of " + std::to_string(bytes) +
                               " bytes (the largest size, -e)");
    std::memset(send_.get(), 0, bytes);
    std::memset(recv_.get(), 0, bytes);
    times_.resize(static_cast<std::size_t>(std::min(iters, block_iters)));
  }

  /// The row's shape (float32) for a size in bytes (the harness's, as ringzero-bench's).
  rz::bench::row_shape shape(std::uint64_t bytes) const { return desc_.shape(bytes, sizeof(float), n_); }

  /// Timed iterations of one algorithm before the next takes its turn.
  static constexpr int block_iters = 10;

  /// Measures `algos` at shape `s`, interleaved: each algorithm's result is first checked
  /// exactly (bench/harness), then its warm-up runs; the timed iterations run in blocks of
  /// `block_iters` per algorithm, the algorithms taking turns block after block, so that a slow
  /// phase of the machine (another process, a frequency change) falls on every algorithm alike
  /// instead of on whichever ran then. Within a block the calls run back to back, each timed from
  /// the end of the previous one (as nccl-tests does); each iteration's time is the slowest rank's.
  std::vector<measurement> run(const rz::bench::row_shape& s, const std::vector<rz::algorithm>& algos) {
    std::vector<measurement> m(algos.size());
    std::vector<std::vector<double>> samples(algos.size());
    std::vector<std::int64_t> wrong(algos.size(), 0);
    for (std::size_t a = 0; a < algos.size(); ++a) {
      rz::bench::fill_row(desc_, send_.get(), recv_.get(), s, rz::dtype::float32, rz::reduce_kind::sum, r_, in_place_);
      call(s, algos[a]);
      wrong[a] = all_sum(desc_.verify(recv_.get(), s, rz::dtype::float32, rz::reduce_kind::sum, -1, r_, n_, in_place_));
      for (int i = 0; i < warmup_; ++i) call(s, algos[a]);
      samples[a].reserve(static_cast<std::size_t>(iters_));
    }
    std::vector<double> slowest;
    for (int done = 0; done < iters_; done += block_iters) {
      times_.resize(static_cast<std::size_t>(std::min(block_iters, iters_ - done)));
      for (std::size_t a = 0; a < algos.size(); ++a) {
        call(s, algos[a]);  // the switch from the previous algorithm is not timed
        rz::barrier(comm_);
        rz::bench::time_each(times_, [&] { call(s, algos[a]); });
        rz::bench::slowest_over_ranks(comm_, times_, slowest);
        samples[a].insert(samples[a].end(), slowest.begin(), slowest.end());
      }
    }
    for (std::size_t a = 0; a < algos.size(); ++a) {
      rz::bench::result_row& row = m[a].row;
      row.kind = desc_.kind;
      row.size_bytes = s.size_bytes;
      row.count = s.count;
      row.type = rz::dtype::float32;
      row.redop = rz::is_reduction(desc_.kind) ? "sum" : "none";
      row.ranks = n_;
      std::string problem;
      row.algorithm = std::string(rz::algorithm_name(rz::resolve_algorithm(
          comm_, desc_.kind, static_cast<double>(s.size_bytes), algos[a], comm_.forced_algorithm(), problem)));
      row.requested = std::string(rz::algorithm_name(algos[a]));
      (in_place_ ? row.in_place : row.out_of_place) =
          rz::bench::make_placement(desc_, s, n_, in_place_, rz::bench::summarize(samples[a]), wrong[a], 0.0);
    }
    return m;
  }

 private:
  void call(const rz::bench::row_shape& s, rz::algorithm a) {
    rz::bench::call_args args;
    args.send = send_.get();
    args.recv = recv_.get();
    args.shape = s;
    args.type = rz::dtype::float32;
    args.op = rz::reduce_kind::sum;
    args.in_place = in_place_;
    args.options.algo = a;
    desc_.call(comm_, args, r_, n_);
  }

  std::int64_t all_sum(std::int64_t v) {
    std::int64_t out = 0;
    rz::all_reduce(comm_, &v, &out, 1, rz::dtype::int64, rz::reduce_kind::sum);
    return out;
  }

  rz::mpi::communicator& comm_;
  const rz::bench::collective_descriptor& desc_;
  int iters_, warmup_;
  bool in_place_;
  int n_ = 1, r_ = 0;
  std::unique_ptr<unsigned char, free_deleter> send_, recv_;
  std::vector<double> times_;
};

/// The slowest rank's seconds per repetition of `body`.
template <class Body>
double seconds_per(rz::mpi::communicator& comm, int reps, Body&& body) {
  for (int i = 0; i < std::max(1, reps / 10); ++i) body();
  rz::barrier(comm);
  const auto start = clock_type::now();
  for (int i = 0; i < reps; ++i) body();
  double mine = std::chrono::duration<double>(clock_type::now() - start).count() / reps, slowest = 0;
  rz::all_reduce(comm, &mine, &slowest, 1, rz::dtype::float64, rz::reduce_kind::max);
  return slowest;
}

/// --link: the link model's parameters and the check mode's cost, measured.
void measure_link(rz::mpi::communicator& comm, int reps) {
  const int n = comm.world_size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // The decisions the model makes (recursive doubling or Rabenseifner, ring or halving_doubling)
  // fall at sizes that stay in cache, so beta and gamma are measured there.
  const std::uint64_t small = 8, mid = 64 << 10, large = 1 << 20;
  std::vector<unsigned char> a(large, 1), b(large, 2);
  rz::collective_descriptor op;  // one point-to-point transfer on the transport, as rz::sendrecv issues it
  op.kind = rz::collective_kind::send;
  op.type = rz::dtype::uint8;
  auto step = [&](std::uint64_t bytes) { comm.sendrecv(op, a.data(), bytes, next, b.data(), bytes, prev); };
  const double alpha = seconds_per(comm, reps, [&] { step(small); }) * 1e6;
  const double t_mid = seconds_per(comm, std::max(3, reps / 4), [&] { step(mid); }) * 1e6;
  const double t_large = seconds_per(comm, std::max(3, reps / 20), [&] { step(large); }) * 1e6;
  const double beta = std::max(1e-9, (t_large - t_mid) / static_cast<double>(large - mid));
  rz::primitive::reduce_spec spec;
  spec.type = rz::dtype::float32;
  const std::uint64_t combined = 256 << 10;
  const double combine =
      seconds_per(comm, std::max(3, reps / 4),
                  [&] { rz::primitive::reduce_into(b.data(), a.data(), b.data(), combined / 4, spec); }) *
      1e6;
  const double gamma = combine / static_cast<double>(combined);
  // The check mode's cost: the same calls on a second communicator that checks.
  rz::mpi::communicator_options checked;
  checked.check = true;
  rz::mpi::communicator check_comm(MPI_COMM_WORLD, checked);
  rz::mpi::communicator_options unchecked;
  unchecked.check = false;
  rz::mpi::communicator plain_comm(MPI_COMM_WORLD, unchecked);
  double x = 1, y = 0;
  auto barrier_us = [&](rz::mpi::communicator& c) { return seconds_per(c, reps, [&] { rz::barrier(c); }) * 1e6; };
  auto reduce_us = [&](rz::mpi::communicator& c) {
    return seconds_per(c, reps, [&] { rz::all_reduce(c, &x, &y, 1, rz::dtype::float64, rz::reduce_kind::sum); }) * 1e6;
  };
  const double barrier_plain = barrier_us(plain_comm), barrier_checked = barrier_us(check_comm);
  const double reduce_plain = reduce_us(plain_comm), reduce_checked = reduce_us(check_comm);
  if (r != 0) return;
  fmt::print("# ringzero-mpi-compare --link : {} MPI processes{}\n", n,
             comm.oversubscribed() ? " (oversubscribed)" : "");
  fmt::print("  exchange step, {:>8} B : {:>10.2f} us   -> alpha = {:.2f} us\n", small, alpha, alpha);
  fmt::print("  exchange step, {:>8} B : {:>10.2f} us\n", mid, t_mid);
  fmt::print("  exchange step, {:>8} B : {:>10.2f} us   -> beta  = {:.3e} us/B ({:.2f} GB/s)\n", large, t_large, beta,
             1e-3 / beta);
  fmt::print("  float32 combine, {:>6} B : {:>10.2f} us   -> gamma = {:.3e} us/B ({:.2f} GB/s)\n", combined, combine,
             gamma, 1e-3 / gamma);
  fmt::print(
      "  link_model: alpha_us = {:.3g}, beta_us_per_byte = {:.4g}, gamma_us_per_byte = {:.4g}, eager_bytes = your "
      "MPI's "
      "eager limit on this network (not measured here; {:.0f} B in the default, Open MPI's shared memory)\n",
      alpha, beta, gamma, rz::mpi::communicator::default_link(false).eager_bytes);
  fmt::print("  check mode: barrier {:.2f} -> {:.2f} us ({:+.2f}); 8-byte all_reduce {:.2f} -> {:.2f} us ({:+.2f})\n",
             barrier_plain, barrier_checked, barrier_checked - barrier_plain, reduce_plain, reduce_checked,
             reduce_checked - reduce_plain);
}

}  // namespace

int main(int argc, char** argv) {
  rz::mpi::environment env(argc, argv);
  CLI::App app{"ringzero-mpi-compare: ringzero over MPI point-to-point against MPI's own collectives"};
  std::string collective = "all_reduce", min_b = "64K", max_b = "256M", json_path, csv_path, tune_path;
  std::uint64_t factor = 2;
  int iters = 20, warmup = 5;
  bool in_place = false, link = false;
  double alpha = 0, beta = 0, gamma = 0;
  app.add_option("--alpha", alpha, "link model: alpha in us (with --beta and --gamma; default: the backend's)");
  app.add_option("--beta", beta, "link model: beta in us per byte");
  app.add_option("--gamma", gamma, "link model: gamma in us per byte");
  app.add_flag("--link", link, "measure the link model's parameters and the check mode's cost instead");
  app.add_option("--collective", collective, "all_reduce, reduce_scatter or all_gather")->capture_default_str();
  app.add_option("-b,--minbytes", min_b, "smallest size (B; suffixes K, M, G)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_b, "largest size (B; suffixes K, M, G)")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "size multiplication factor (>= 2)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  app.add_option("-n,--iters", iters, "timed iterations per algorithm and size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("-w,--warmup_iters", warmup, "warm-up iterations per algorithm and size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--inplace", in_place, "run in place instead of out of place");
  app.add_option("--json", json_path, "write the rows to this JSON file (rank 0)");
  app.add_option("--csv", csv_path, "write the rows to this CSV file (rank 0; the table's columns)");
  // Not --tune: Open MPI's mpirun takes --tune FILE for itself, wherever it appears.
  app.add_option("--write-tuning", tune_path,
                 "write a tuning table (rank 0): per size the fastest of ring, halving_doubling and native where it "
                 "beats auto's choice by more than --tuning-margin, else auto's, for RINGZERO_MPI_TUNING");
  double tune_margin = 0.10;
  app.add_option(
         "--tuning-margin", tune_margin,
         "with --write-tuning: how much faster (a fraction of the median) the fastest must be to replace auto's choice")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) { return rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1); }
  const auto kind = rz::parse_collective(collective);
  if (!kind || (*kind != rz::collective_kind::all_reduce && *kind != rz::collective_kind::reduce_scatter &&
                *kind != rz::collective_kind::all_gather)) {
    if (rank == 0)
      std::fprintf(stderr, "ringzero-mpi-compare: --collective must be all_reduce, reduce_scatter or all_gather\n");
    return 2;
  }
  // --write-tuning: refused at once on every rank (not after the sweep) when rank 0 cannot
  // open the file for writing, the name is empty or the margin is not a number in [0, 10].
  std::string tuning_problem;
  if (app.count("--write-tuning") > 0) {
    if (tune_path.empty())
      tuning_problem = "--write-tuning needs a file name";
    else if (!(tune_margin >= 0.0 && tune_margin <= 10.0))
      tuning_problem = "--tuning-margin must be a number from 0 to 10";
    else if (rank == 0) {
      std::FILE* f = std::fopen(tune_path.c_str(), "a");
      if (f == nullptr)
        tuning_problem = "cannot open the tuning table " + tune_path + " for writing: " + std::strerror(errno);
      else
        std::fclose(f);
    }
  }
  int refused = tuning_problem.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &refused, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (refused != 0) {
    if (!tuning_problem.empty()) std::fprintf(stderr, "ringzero-mpi-compare: %s\n", tuning_problem.c_str());
    return 2;
  }
  std::int64_t wrong_total = 0;
  int rows_not_matching = 0;
  nlohmann::json comparisons = nlohmann::json::array();
  try {
    const std::uint64_t min_bytes = parse_size(min_b, "minbytes", 1), max_bytes = parse_size(max_b, "maxbytes", 1);
    if (min_bytes > max_bytes)
      throw std::invalid_argument("-b/--minbytes (" + min_b + ") is larger than -e/--maxbytes (" + max_b +
                                  "): no size to measure");
    rz::mpi::communicator_options options;
    if (app.count("--alpha") + app.count("--beta") + app.count("--gamma") > 0) {
      if (!(alpha > 0 && beta > 0 && gamma > 0))
        throw std::invalid_argument("--alpha, --beta and --gamma go together (all > 0)");
      rz::link_model m = rz::mpi::communicator::default_link(false);
      m.alpha_us = alpha;
      m.beta_us_per_byte = beta;
      m.gamma_us_per_byte = gamma;
      options.link = m;
    }
    rz::mpi::communicator comm(MPI_COMM_WORLD, options);
    if (link) {
      measure_link(comm, std::max(iters, 2000));
      return 0;
    }
    compare c(comm, *kind, iters, warmup, in_place, max_bytes);
    const int n = comm.world_size();
    if (rank == 0) {
      fmt::print("# ringzero-mpi-compare {} : {} MPI processes, float32 sum, {}, {} iterations after {} warm-up\n",
                 rz::collective_name(*kind), n, in_place ? "in place" : "out of place", iters, warmup);
      const rz::link_model m = comm.link();
      fmt::print("# link model: alpha {:.3g} us, beta {:.3g} us/B, gamma {:.3g} us/B{}\n", m.alpha_us,
                 m.beta_us_per_byte, m.gamma_us_per_byte, comm.oversubscribed() ? " (oversubscribed)" : "");
      fmt::print(
          "# one row per algorithm (requested->resolved); time: mean over iterations of the slowest rank (us), "
          "median beside it; busbw: GB/s (nccl-tests)\n");
      fmt::print(
          "# after each size: native/best = MPI's own median time over ringzero's best (ring or halving_doubling) "
          "median; >= 1 means ringzero at least matches MPI\n");
      std::fputs(rz::bench::table_header().c_str(), stdout);
    }
    const std::vector<rz::algorithm> algos = {rz::algorithm::ring, rz::algorithm::halving_doubling,
                                              rz::algorithm::native, rz::algorithm::automatic};
    std::vector<rz::bench::result_row> result_rows;
    rz::tuning_table tuned;
    std::optional<rz::algorithm> last_winner;
    for (std::uint64_t bytes : rz::bench::sweep_sizes(min_bytes, max_bytes, factor, 0)) {
      const rz::bench::row_shape shape = c.shape(bytes);
      if (shape.count == 0) continue;
      const std::vector<measurement> m = c.run(shape, algos);
      auto median = [&](std::size_t a) { return m[a].measured(in_place).median_us; };
      const bool ring_best = median(0) <= median(1);
      const double best = ring_best ? median(0) : median(1);
      const double ratio = best > 0 ? median(2) / best : 0;
      std::int64_t wrong = 0;
      for (const auto& x : m) wrong += x.measured(in_place).wrong;
      wrong_total += wrong;
      if (ratio < 1.0) ++rows_not_matching;
      // The fastest of the three by median (ties to the earlier: ring, halving_doubling, native)
      // where it beats auto's choice by more than the margin, else auto's choice; a new rule
      // where the algorithm changes.
      std::size_t winner = 0;
      for (std::size_t a = 1; a < 3; ++a)
        if (median(a) < median(winner)) winner = a;
      rz::algorithm chosen = algos[winner];
      const std::optional<rz::algorithm> in_force = rz::parse_algorithm(m[3].row.algorithm);
      for (std::size_t a = 0; a < 3; ++a)
        if (in_force && algos[a] == *in_force && median(a) <= (1.0 + tune_margin) * median(winner)) chosen = *in_force;
      if (!last_winner || *last_winner != chosen) tuned.add({*kind, n, shape.size_bytes, chosen});
      last_winner = chosen;
      if (rank == 0) {
        for (const auto& x : m) std::fputs(rz::bench::table_row(x.row).c_str(), stdout);
        fmt::print("# {:>12}  native/best {:.2f} (best {}, auto chose {})\n", shape.size_bytes, ratio,
                   ring_best ? "ring" : "halving_doubling", m[3].row.algorithm);
        std::fflush(stdout);
        comparisons.push_back({{"size_bytes", shape.size_bytes},
                               {"count", shape.count},
                               {"ranks", n},
                               {"auto_chose", m[3].row.algorithm},
                               {"best", ring_best ? "ring" : "halving_doubling"},
                               {"native_over_best", ratio},
                               {"wrong", wrong}});
        for (const auto& x : m) result_rows.push_back(x.row);
      }
    }
    if (rank == 0) {
      fmt::print("# Errors: {} wrong element(s) {}\n", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
      fmt::print("# Sizes where native beat ringzero's best: {}\n", rows_not_matching);
      if (!json_path.empty()) {
        using rz::bench::json_number;
        using rz::bench::json_string;
        rz::bench::write_json(json_path,
                              {{"program", json_string("ringzero-mpi-compare")},
                               {"collective", json_string(std::string(rz::collective_name(*kind)))},
                               {"ranks", json_number(n)},
                               {"in_place", in_place ? "true" : "false"},
                               {"comparisons", comparisons.dump()},
                               {"wrong", json_number(static_cast<double>(wrong_total))}},
                              result_rows);
      }
      if (!csv_path.empty()) rz::bench::write_csv(csv_path, result_rows);
      if (!tune_path.empty()) {
        const std::string text = tuned.text();
        std::FILE* f = std::fopen(tune_path.c_str(), "w");
        if (f == nullptr) throw std::runtime_error("cannot open the tuning table " + tune_path + " for writing");
        const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
        if (std::fclose(f) != 0 || !written) throw std::runtime_error("cannot write the tuning table " + tune_path);
        fmt::print("# tuning table ({} rule(s)) written to {}:\n{}", tuned.rules().size(), tune_path, text);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringzero-mpi-compare: %s\n", e.what());
    return 2;
  }
  return wrong_total == 0 ? 0 : 1;
}
