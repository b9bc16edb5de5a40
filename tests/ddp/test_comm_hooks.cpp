// Communication hooks: fp16 / bf16 compression (PyTorch's fp16_compress_hook semantics: divide
// by the world size, reduce in 16 bits, cast back), the user-hook interface, and hook errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "reducer_test_util.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using namespace ringzero::test;

namespace {

/// Runs one step on `n` ranks where rank r's gradient k of every parameter is `value(r, k)`,
/// returns rank 0's reduced gradients.
template <class Value>
std::vector<std::vector<double>> one_step(int n, std::shared_ptr<comm_hook> (*make_hook)(),
                                          const std::vector<std::uint64_t>& counts, const std::vector<dtype>& types,
                                          Value&& value, bool view = false) {
  std::vector<std::vector<double>> result;
  std::mutex mutex;
  auto out = run_ranks(n, [&](communicator& comm) {
    toy_model m(counts, types);
    reducer_options opt;
    opt.hook = make_hook ? make_hook() : nullptr;
    opt.gradient_as_bucket_view = view;
    opt.bucket_byte_limits = {96};
    gradient_reducer red(comm, m.parameters(), opt);
    for (std::size_t i = m.size(); i-- > 0;) {
      void* g = red.gradient(i);
      for (std::size_t k = 0; k < m.count(i); ++k) toy_model::write(g, m.types[i], k, value(comm.rank(), k));
      red.mark_ready(i);
    }
    red.finish();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      for (std::size_t i = 0; i < m.size(); ++i) {
        std::vector<double> v;
        for (std::size_t k = 0; k < m.count(i); ++k) v.push_back(toy_model::read(red.gradient(i), m.types[i], k));
        result.push_back(v);
      }
    }
  });
  for (auto& o : out) REQUIRE_MESSAGE(!o.failed, o.what);
  return result;
}

const std::vector<std::uint64_t> kHookCounts = {24, 5, 40};
const std::vector<dtype> kHookTypes = {dtype::float32, dtype::float64, dtype::float32};

}  // namespace

TEST_CASE("fp16 and bf16 compression give the exact average when it is representable") {
  for (auto make : {&fp16_compress_hook, &bf16_compress_hook})
    for (int n : {1, 2, 4})
      for (bool view : {false, true}) {
        CAPTURE(n);
        auto r = one_step(
            n, make, kHookCounts, kHookTypes,
            [](int rank, std::size_t k) { return (rank + 1) * 0.25 * static_cast<double>(k % 5); }, view);
        for (const auto& v : r)
          for (std::size_t k = 0; k < v.size(); ++k) CHECK(v[k] == 0.25 * static_cast<double>(k % 5) * (n + 1) / 2.0);
      }
}

TEST_CASE("the values really travel in 16 bits: fp16 keeps 2^-11 steps at 0.5, bf16 only 2^-8") {
  // Both ranks hold 1 + 2^-9: each sends (1 + 2^-9) / 2 = 0.5 + 2^-10, exact in fp16, rounded to
  // 0.5 in bf16. And 1 + 2^-13 is lost by both.
  const auto fp16 = one_step(2, &fp16_compress_hook, {8}, {}, [](int, std::size_t k) {
    return k < 4 ? 1.0 + std::ldexp(1.0, -9) : 1.0 + std::ldexp(1.0, -13);
  });
  const auto bf16 = one_step(2, &bf16_compress_hook, {8}, {}, [](int, std::size_t k) {
    return k < 4 ? 1.0 + std::ldexp(1.0, -9) : 1.0 + std::ldexp(1.0, -13);
  });
  const auto plain = one_step(2, nullptr, {8}, {}, [](int, std::size_t k) {
    return k < 4 ? 1.0 + std::ldexp(1.0, -9) : 1.0 + std::ldexp(1.0, -13);
  });
  CHECK(fp16[0][0] == 1.0 + std::ldexp(1.0, -9));
  CHECK(bf16[0][0] == 1.0);
  CHECK(fp16[0][5] == 1.0);
  CHECK(bf16[0][5] == 1.0);
  CHECK(plain[0][5] == 1.0 + std::ldexp(1.0, -13));
}

TEST_CASE("dividing before the reduction keeps float16 from overflowing") {
  // 4 ranks of 60000: the sum 240000 exceeds float16's 65504, the pre-divided sum does not.
  const auto r = one_step(4, &fp16_compress_hook, {16}, {}, [](int, std::size_t) { return 60000.0; });
  CHECK(r[0][3] == 60000.0);
}

TEST_CASE("compression on a world of three stays within 16-bit rounding of the average") {
  const auto r = one_step(3, &fp16_compress_hook, kHookCounts, kHookTypes,
                          [](int rank, std::size_t k) { return 0.1 * (rank + 1) + 0.013 * static_cast<double>(k); });
  for (const auto& v : r)
    for (std::size_t k = 0; k < v.size(); ++k) {
      const double exact = 0.2 + 0.013 * static_cast<double>(k);
      CHECK(std::fabs(v[k] - exact) <= exact * std::ldexp(1.0, -9));
    }
}

TEST_CASE("compression_hook rejects other wire types") {
  CHECK_THROWS_AS(compression_hook(dtype::float32), error);
  CHECK(compression_hook(dtype::bfloat16).name() == "bf16_compress");
  CHECK(compression_hook(dtype::float16).wire_type() == dtype::float16);
}

namespace {

/// A user hook: all-reduces with max and records what it saw.
class max_hook final : public comm_hook {
 public:
  std::string name() const override { return "max"; }
  work launch(communicator& comm, const gradient_bucket& b) override {
    launched.push_back(b.index);
    last_flags.push_back(b.is_last());
    counts.push_back(b.count);
    params.push_back(std::vector<std::size_t>(b.parameters.begin(), b.parameters.end()));
    offsets.push_back(std::vector<std::uint64_t>(b.offsets.begin(), b.offsets.end()));
    divisors.push_back(b.divisor);
    return all_reduce_async(comm, b.data, b.data, b.count, b.type, reduce_kind::max);
  }
  void complete(const gradient_bucket& b) override { completed.push_back(b.index); }

  std::vector<std::size_t> launched, completed;
  std::vector<bool> last_flags;
  std::vector<std::uint64_t> counts;
  std::vector<std::vector<std::size_t>> params;
  std::vector<std::vector<std::uint64_t>> offsets;
  std::vector<int> divisors;
};

}  // namespace

TEST_CASE("a user hook is called per bucket, in order, with the bucket's layout") {
  auto out = run_ranks(3, [&](communicator& comm) {
    toy_model m({10, 20, 30, 3}, {});
    auto hook = std::make_shared<max_hook>();
    reducer_options opt;
    opt.hook = hook;
    opt.bucket_byte_limits = {80};
    opt.alignment_bytes = 32;
    gradient_reducer red(comm, m.parameters(), opt);
    const auto layout = red.buckets();     // the layout of this step (the rebuild follows it)
    for (std::size_t i = 0; i < 4; ++i) {  // forward marking: the last bucket completes first
      std::fill(m.grads32[i].begin(), m.grads32[i].end(), static_cast<float>(comm.rank() * 10 + static_cast<int>(i)));
      red.mark_ready(i);
    }
    red.finish();
    for (std::size_t i = 0; i < 4; ++i) CHECK(m.grads32[i][0] == static_cast<float>(20 + i));  // max over ranks
    REQUIRE(hook->launched.size() == layout.size());
    for (std::size_t k = 0; k < layout.size(); ++k) {
      CHECK(hook->launched[k] == k);
      CHECK(hook->completed[k] == k);
      CHECK(hook->last_flags[k] == (k + 1 == layout.size()));
      CHECK(hook->counts[k] == layout[k].count);
      CHECK(hook->params[k] == layout[k].parameters);
      CHECK(hook->offsets[k] == layout[k].offsets);
      CHECK(hook->divisors[k] == 3);
      for (std::uint64_t off : layout[k].offsets) CHECK(off % 8 == 0);  // 32-byte alignment of float32
    }
    CHECK(layout.size() == 3);  // {3, 30}: 132 B >= 80; {20}: 80 B; {10}
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

TEST_CASE("ranks with different hooks are refused; a hook that throws fails every rank") {
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({8}, {});
    reducer_options opt;
    if (comm.rank() == 1) opt.hook = fp16_compress_hook();
    gradient_reducer red(comm, m.parameters(), opt);
  });
  for (std::size_t r = 0; r < out.size(); ++r) {
    CHECK(out[r].kind == errc::contract_mismatch);
    CHECK_MESSAGE(contains(out[r].what, "different communication hooks"), out[r].what);
    CHECK_MESSAGE(contains(out[r].what, r == 1 ? "this rank uses 'fp16_compress'" : "this rank uses 'allreduce'"),
                  out[r].what);
  }
  class throwing_hook final : public comm_hook {
   public:
    explicit throwing_hook(bool t) : throw_(t) {}
    std::string name() const override { return "sometimes_throws"; }
    work launch(communicator& comm, const gradient_bucket& b) override {
      if (throw_ && b.index == 1) throw error(errc::invalid_argument, "this hook refuses bucket 1");
      return all_reduce_async(comm, b.data, b.data, b.count, b.type, reduce_kind::avg);
    }

   private:
    bool throw_;
  };
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({16, 16, 16}, {});
    reducer_options opt;
    opt.hook = std::make_shared<throwing_hook>(comm.rank() == 0);
    opt.bucket_byte_limits = {64};
    gradient_reducer red(comm, m.parameters(), opt);
    for (std::size_t i = 3; i-- > 0;) red.mark_ready(i);
    red.finish();
  });
  CHECK(out[0].kind == errc::invalid_argument);
  CHECK_MESSAGE(contains(out[0].what, "the 'sometimes_throws' hook failed to launch bucket 1"), out[0].what);
  CHECK(out[1].failed);
  CHECK_MESSAGE(contains(out[1].what, "this hook refuses bucket 1"), out[1].what);
}

TEST_CASE("a hook whose calls differ between ranks gets an error naming the bucket and its parameters") {
  // The bucket's options (gradient_bucket::options) carry a tag the contract check names.
  class short_hook final : public comm_hook {
   public:
    explicit short_hook(bool shorten) : shorten_(shorten) {}
    std::string name() const override { return "short"; }
    work launch(communicator& comm, const gradient_bucket& b) override {
      const std::uint64_t count = shorten_ && b.index == 1 ? b.count - 1 : b.count;
      return all_reduce_async(comm, b.data, b.data, count, b.type, reduce_kind::avg, b.options);
    }

   private:
    bool shorten_;
  };
  const auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({16, 16, 16}, {});
    reducer_options opt;
    opt.hook = std::make_shared<short_hook>(comm.rank() == 1);
    opt.bucket_byte_limits = {64};
    gradient_reducer red(comm, m.parameters(), opt);
    for (std::size_t i = 3; i-- > 0;) red.mark_ready(i);
    red.finish();
  });
  for (const auto& o : out) {
    CHECK(o.kind == errc::contract_mismatch);
    CHECK_MESSAGE(
        contains(o.what, "count mismatch: rank 0: 16; rank 1: 15 (in all_reduce of bucket 1 (parameters 1 'p1'))"),
        o.what);
  }
}

TEST_CASE("compression scratch follows the rebuild of the buckets") {
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({16, 16, 16, 16}, {});
    reducer_options opt;
    opt.hook = bf16_compress_hook();
    opt.bucket_byte_limits = {64, 128};
    gradient_reducer red(comm, m.parameters(), opt);
    const std::vector<std::size_t> order = {0, 1, 2, 3};  // differs from reverse registration
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i : order) {
        std::fill(m.grads32[i].begin(), m.grads32[i].end(), static_cast<float>((comm.rank() + 1) * (step + 1)));
        red.mark_ready(i);
      }
      red.finish();
      for (std::size_t i = 0; i < 4; ++i) CHECK(m.grads32[i][7] == 1.5f * static_cast<float>(step + 1));
    }
    CHECK(red.layout_generation() == 1);
    CHECK(bucket_indices_of(red) == std::vector<std::vector<std::size_t>>{{0}, {1, 2}, {3}});
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}
