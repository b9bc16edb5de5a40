#pragma once
// An exact-value sweep of every collective, written against `ringzero::communicator` so that
// the same body, with the same expectations, runs on every backend (local threads, MPI).
//
// Cases: every collective x every dtype x every reduce op (reductions) x every algorithm the
// backend offers (ring, halving_doubling, and direct or native) x out-of-place / in-place
// (NCCL's conventions) x counts 0, 1, world+1 and 100003. Inputs are small integers whose
// reductions are exact in every dtype and in any order (nccl-tests' trick), so results are
// compared bit for bit; integer sums include elements near the type's maximum, so they wrap. Outputs start filled with
// a sentinel and are framed by guard elements: a result element never written, a guard overwritten, or a non-root
// reduce output touched (case C9) fails the case.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ringzero/ringzero.hpp"

namespace ringzero_test {

using namespace ringzero;

/// One call of the sweep.
struct sweep_case {
  collective_kind kind = collective_kind::all_reduce;
  dtype type = dtype::float32;
  reduce_kind op = reduce_kind::sum;
  algorithm algo = algorithm::ring;
  bool in_place = false;
  std::uint64_t count = 0;
  int root = 0;

  std::string name() const {
    std::ostringstream s;
    s << collective_name(kind) << ' ' << dtype_name(type);
    if (is_reduction(kind)) s << ' ' << reduce_kind_name(op);
    s << ' ' << algorithm_name(algo) << (in_place ? " in-place" : " out-of-place") << " count " << count;
    if (has_root(kind)) s << " root " << root;
    return s.str();
  }
};

/// The counts of the sweep on `n` ranks.
inline std::vector<std::uint64_t> sweep_counts(int n) { return {0, 1, static_cast<std::uint64_t>(n) + 1, 100003}; }

/// Every case of the sweep that communicator `c` can run, in a fixed order (identical on every
/// rank). `large_for_all_dtypes` false keeps count 100003 for float32, bfloat16 and int64 only.
inline std::vector<sweep_case> sweep_cases(const communicator& c, bool large_for_all_dtypes = true) {
  const int n = c.world_size();
  std::vector<sweep_case> out;
  const collective_kind kinds[] = {collective_kind::all_reduce, collective_kind::reduce_scatter,
                                   collective_kind::all_gather, collective_kind::broadcast,
                                   collective_kind::reduce,     collective_kind::all_to_all,
                                   collective_kind::barrier};
  const algorithm algos[] = {algorithm::ring, algorithm::halving_doubling, algorithm::direct, algorithm::native};
  int index = 0;
  for (collective_kind k : kinds) {
    for (algorithm a : algos) {
      if (!algorithm_available(c, a, k)) continue;
      if (k == collective_kind::barrier) {
        sweep_case s;
        s.kind = k;
        s.algo = a;
        out.push_back(s);
        continue;
      }
      for (dtype t : all_dtypes) {
        std::vector<reduce_kind> ops = {reduce_kind::sum};
        if (is_reduction(k))
          ops = {reduce_kind::sum, reduce_kind::prod, reduce_kind::min,
                 reduce_kind::max, reduce_kind::avg,  reduce_kind::premul_sum};
        for (reduce_kind op : ops) {
          for (bool in_place : {false, true}) {
            if (in_place && k == collective_kind::all_to_all) continue;
            for (std::uint64_t count : sweep_counts(n)) {
              if (count > 1000 && !large_for_all_dtypes && t != dtype::float32 && t != dtype::bfloat16 &&
                  t != dtype::int64)
                continue;
              sweep_case s;
              s.kind = k;
              s.type = t;
              s.op = op;
              s.algo = a;
              s.in_place = in_place;
              s.count = count;
              s.root = index++ % n;
              out.push_back(s);
            }
          }
        }
      }
    }
  }
  return out;
}

namespace detail {

template <class T>
inline constexpr bool is_half = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;
template <class T>
inline constexpr bool is_unsigned_int = std::is_integral_v<T>&& std::is_unsigned_v<T>;

/// `v` as a T (integers wrap; small integers are exact in every floating type).
template <class T>
T make(std::int64_t v) {
  if constexpr (is_half<T>)
    return T(static_cast<float>(v));
  else if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(v);
  else
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(static_cast<std::uint64_t>(v)));
}

/// Rank r's input element i for a reduction with `op` (exact under every op and dtype).
template <class T>
T input(reduce_kind op, int r, std::uint64_t i, int n) {
  const auto ri = static_cast<std::uint64_t>(r);
  switch (op) {
    case reduce_kind::prod: {
      const std::uint64_t m = (i + ri) % 3;
      if constexpr (is_unsigned_int<T>)
        return make<T>(static_cast<std::int64_t>(m) + 1);
      else
        return make<T>(m == 0 ? -1 : static_cast<std::int64_t>(m));
    }
    case reduce_kind::min:
    case reduce_kind::max: {
      if constexpr (is_unsigned_int<T>) {
        if (i % 17 == 0 && ri == i % static_cast<std::uint64_t>(n)) return static_cast<T>(~T(0));  // C2's extreme
        return make<T>(static_cast<std::int64_t>((i * 13 + ri * 5) % 11));
      } else {
        return make<T>(static_cast<std::int64_t>((i * 13 + ri * 5) % 11) - 5);
      }
    }
    default: {
      // Integer sums wrap: every 61st element is near the type's maximum on every rank (case C1).
      if constexpr (std::is_integral_v<T>)
        if (i % 61 == 5) return static_cast<T>(std::numeric_limits<T>::max() - static_cast<T>(ri));
      const auto v = static_cast<std::int64_t>((i * 7 + ri * 3) % 5);
      if constexpr (is_unsigned_int<T>)
        return make<T>(v + 1);
      else
        return make<T>(v - 2);
    }
  }
}

/// premul_sum's scalar on rank r.
inline double premul_scalar(int r) { return static_cast<double>(r + 1); }

/// The exact reduction of element i over n ranks.
template <class T>
T expected(reduce_kind op, std::uint64_t i, int n) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    std::uint64_t acc = op == reduce_kind::prod ? 1 : 0;
    T best = input<T>(op, 0, i, n);
    for (int r = 0; r < n; ++r) {
      const T x = input<T>(op, r, i, n);
      const auto wide = static_cast<std::uint64_t>(static_cast<std::int64_t>(x));  // sign-extends signed types
      const std::uint64_t xu = std::is_signed_v<T> ? wide : static_cast<std::uint64_t>(x);
      switch (op) {
        case reduce_kind::prod: acc *= xu; break;
        case reduce_kind::min: best = std::min(best, x); break;
        case reduce_kind::max: best = std::max(best, x); break;
        case reduce_kind::premul_sum: acc += static_cast<std::uint64_t>(r + 1) * xu; break;
        default: acc += xu; break;
      }
    }
    if (op == reduce_kind::min || op == reduce_kind::max) return best;
    const T wrapped = static_cast<T>(static_cast<U>(acc));
    if (op != reduce_kind::avg) return wrapped;
    if constexpr (std::is_signed_v<T>)
      return static_cast<T>(static_cast<std::int64_t>(wrapped) / n);
    else
      return static_cast<T>(static_cast<std::uint64_t>(wrapped) / static_cast<std::uint64_t>(n));
  } else {
    using C = std::conditional_t<is_half<T>, float, T>;
    double acc = op == reduce_kind::prod ? 1.0 : 0.0;
    double best = static_cast<double>(static_cast<C>(input<T>(op, 0, i, n)));
    for (int r = 0; r < n; ++r) {
      const double x = static_cast<double>(static_cast<C>(input<T>(op, r, i, n)));
      switch (op) {
        case reduce_kind::prod: acc *= x; break;
        case reduce_kind::min: best = std::min(best, x); break;
        case reduce_kind::max: best = std::max(best, x); break;
        case reduce_kind::premul_sum: acc += premul_scalar(r) * x; break;
        default: acc += x; break;
      }
    }
    C value = static_cast<C>(op == reduce_kind::min || op == reduce_kind::max ? best : acc);
    if (op == reduce_kind::avg) value = value / static_cast<C>(n);  // one division in the compute type
    return T(value);
  }
}

/// Rank r's element i for the collectives that move data.
template <class T>
T pattern(int r, std::uint64_t i) {
  return make<T>(static_cast<std::int64_t>((i * 31 + static_cast<std::uint64_t>(r) * 17) % 97));
}

template <class T>
std::string show(const T& x) {
  std::ostringstream s;
  if constexpr (is_half<T>)
    s << static_cast<float>(x);
  else if constexpr (sizeof(T) == 1)
    s << static_cast<int>(x);
  else
    s << x;
  return s.str();
}

/// Elements of guard on each side of every buffer.
inline constexpr std::uint64_t guard = 8;
inline constexpr unsigned char sentinel = 0x5A;

/// A buffer of `count` elements of T framed by guards, everything filled with the sentinel.
template <class T>
struct framed {
  std::vector<unsigned char>& storage;
  std::uint64_t count;
  framed(std::vector<unsigned char>& s, std::uint64_t n) : storage(s), count(n) {
    storage.assign(static_cast<std::size_t>((n + 2 * guard) * sizeof(T)), sentinel);
  }
  T* data() { return reinterpret_cast<T*>(storage.data()) + guard; }
  T get(std::uint64_t i) const {
    T x;
    std::memcpy(&x, storage.data() + (guard + i) * sizeof(T), sizeof(T));
    return x;
  }
  void set(std::uint64_t i, T x) { std::memcpy(storage.data() + (guard + i) * sizeof(T), &x, sizeof(T)); }
  bool guards_intact() const {
    const std::size_t g = static_cast<std::size_t>(guard * sizeof(T));
    for (std::size_t b = 0; b < g; ++b)
      if (storage[b] != sentinel || storage[storage.size() - 1 - b] != sentinel) return false;
    return true;
  }
};

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Runs case `k` with element type T; returns "" or what went wrong.
template <class T>
std::string run_typed(communicator& c, const sweep_case& k, std::vector<unsigned char>& send_storage,
                      std::vector<unsigned char>& recv_storage) {
  const int n = c.world_size(), r = c.rank();
  const std::uint64_t count = k.count, un = static_cast<std::uint64_t>(n), ur = static_cast<std::uint64_t>(r);
  collective_options options;
  options.algo = k.algo;
  const reduce_op op = k.op == reduce_kind::premul_sum ? reduce_op::premul_sum(premul_scalar(r)) : reduce_op(k.op);
  const dtype t = dtype_of<T>;
  std::string failure;
  auto expect = [&](const char* what, std::uint64_t i, const T& got, const T& want) {
    if (!failure.empty() || same_bits(got, want)) return;
    failure = std::string(what) + " element " + std::to_string(i) + ": got " + show(got) + ", expected " + show(want);
  };

  switch (k.kind) {
    case collective_kind::all_reduce: {
      framed<T> in(send_storage, count), out(recv_storage, count);
      for (std::uint64_t i = 0; i < count; ++i) (k.in_place ? out : in).set(i, input<T>(k.op, r, i, n));
      all_reduce(c, k.in_place ? out.data() : in.data(), out.data(), count, t, op, options);
      for (std::uint64_t i = 0; i < count; ++i) expect("result", i, out.get(i), expected<T>(k.op, i, n));
      if (!out.guards_intact()) failure += " [output guard overwritten]";
      break;
    }
    case collective_kind::reduce_scatter: {
      // Rank r's send buffer holds n blocks; block q, element i is input element q*count + i.
      framed<T> in(send_storage, count * un), out(recv_storage, count);
      for (std::uint64_t j = 0; j < count * un; ++j) in.set(j, input<T>(k.op, r, j, n));
      T* recv = k.in_place ? in.data() + ur * count : out.data();
      reduce_scatter(c, in.data(), recv, count, t, op, options);
      for (std::uint64_t i = 0; i < count; ++i) {
        T got;
        std::memcpy(&got, recv + i, sizeof(T));
        expect("result", i, got, expected<T>(k.op, ur * count + i, n));
      }
      if (!in.guards_intact() || !out.guards_intact()) failure += " [guard overwritten]";
      break;
    }
    case collective_kind::all_gather: {
      framed<T> in(send_storage, count), out(recv_storage, count * un);
      for (std::uint64_t i = 0; i < count; ++i) {
        if (k.in_place)
          out.set(ur * count + i, pattern<T>(r, i));
        else
          in.set(i, pattern<T>(r, i));
      }
      all_gather(c, k.in_place ? out.data() + ur * count : in.data(), out.data(), count, t, options);
      for (std::uint64_t q = 0; q < un; ++q)
        for (std::uint64_t i = 0; i < count; ++i)
          expect("result", q * count + i, out.get(q * count + i), pattern<T>(static_cast<int>(q), i));
      if (!out.guards_intact()) failure += " [output guard overwritten]";
      break;
    }
    case collective_kind::broadcast: {
      framed<T> in(send_storage, count), out(recv_storage, count);
      if (r == k.root)
        for (std::uint64_t i = 0; i < count; ++i) (k.in_place ? out : in).set(i, pattern<T>(k.root, i));
      broadcast(c, k.in_place ? out.data() : in.data(), out.data(), count, t, k.root, options);
      for (std::uint64_t i = 0; i < count; ++i) expect("result", i, out.get(i), pattern<T>(k.root, i));
      if (!out.guards_intact()) failure += " [output guard overwritten]";
      break;
    }
    case collective_kind::reduce: {
      framed<T> in(send_storage, count), out(recv_storage, count);
      for (std::uint64_t i = 0; i < count; ++i) (k.in_place ? out : in).set(i, input<T>(k.op, r, i, n));
      const std::vector<unsigned char> before = recv_storage;
      reduce(c, k.in_place ? out.data() : in.data(), out.data(), count, t, op, k.root, options);
      if (r == k.root) {
        for (std::uint64_t i = 0; i < count; ++i) expect("result", i, out.get(i), expected<T>(k.op, i, n));
        if (!out.guards_intact()) failure += " [output guard overwritten]";
      } else if (recv_storage != before) {
        failure = "a non-root receive buffer was modified (case C9)";
      }
      break;
    }
    case collective_kind::all_to_all: {
      // Rank r sends block q (elements q*count ...) to rank q; element j of r's send is pattern(r, j).
      framed<T> in(send_storage, count * un), out(recv_storage, count * un);
      for (std::uint64_t j = 0; j < count * un; ++j) in.set(j, pattern<T>(r, j));
      all_to_all(c, in.data(), out.data(), count, t, options);
      for (std::uint64_t q = 0; q < un; ++q)
        for (std::uint64_t i = 0; i < count; ++i)
          expect("result", q * count + i, out.get(q * count + i), pattern<T>(static_cast<int>(q), ur * count + i));
      if (!out.guards_intact()) failure += " [output guard overwritten]";
      break;
    }
    case collective_kind::barrier: barrier(c, options); break;
    default: failure = "not a collective"; break;
  }
  return failure;
}

}  // namespace detail

/// Reusable buffers of the sweep (allocated once, so the sweep measures nothing but correctness
/// and does not spend its time on fresh pages).
struct sweep_buffers {
  std::vector<unsigned char> send;
  std::vector<unsigned char> recv;
};

/// Runs case `k` on `c` (every rank must run the same case). Returns "" on success, else what
/// went wrong on this rank (a wrong element, an overwritten guard, or the error thrown).
inline std::string run_case(communicator& c, const sweep_case& k, sweep_buffers& buffers) {
  try {
    return visit_dtype(k.type, [&]<class T>() { return detail::run_typed<T>(c, k, buffers.send, buffers.recv); });
  } catch (const std::exception& e) { return std::string("threw: ") + e.what(); }
}

/// Runs every case of `sweep_cases(c, large_for_all_dtypes)` (all of them on every rank, so
/// that ranks stay in step); returns this rank's first `max_failures` failures ("case: what")
/// and, when there were more, a line with their number.
inline std::vector<std::string> run_sweep(communicator& c, bool large_for_all_dtypes = true,
                                          std::size_t max_failures = 10) {
  std::vector<std::string> failures;
  std::size_t total = 0;
  sweep_buffers buffers;
  for (const sweep_case& k : sweep_cases(c, large_for_all_dtypes)) {
    std::string why = run_case(c, k, buffers);
    if (why.empty()) continue;
    if (++total <= max_failures)
      failures.push_back("rank " + std::to_string(c.rank()) + "/" + std::to_string(c.world_size()) + " " + k.name() +
                         ": " + why);
  }
  if (total > max_failures) failures.push_back("... and " + std::to_string(total - max_failures) + " more failures");
  return failures;
}

}  // namespace ringzero_test
