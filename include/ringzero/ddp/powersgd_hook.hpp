#pragma once
/// @file
/// `powersgd_hook`: low-rank gradient compression for the DDP reducer (PowerSGD: Vogels, Karimireddy
/// and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
/// NeurIPS 2019), with the semantics of PyTorch's `powerSGD_hook`
/// (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook): each matrix-shaped gradient M
/// (n x m, a gradient of two or more dimensions seen as shape[0] rows) is sent as two thin
/// matrices P = M Q (n x r) and Q = M^T P (m x r) instead of n x m values; everything else
/// (biases, vectors, matrices too small to gain) is all-reduced as it is.
///
/// One step of a bucket (after `powersgd_options::start_iteration` plain steps):
///   1. error feedback: M += E (this rank's residual of the last step); E keeps the corrected M;
///   2. Q: drawn once per parameter (`random_seed`, the same on every rank) and reused from the
///      last step (warm start), orthogonalized; P = M Q;
///   3. one all_reduce (sum) of every P of the bucket together with its uncompressed gradients;
///   4. in `complete`: P orthogonalized (Gram-Schmidt), Q = M^T P, one all_reduce (sum) of every
///      Q of the bucket, Q /= divisor, M = P Q^T; E -= M (the residual); uncompressed gradients
///      divided by the divisor.
/// Every rank ends with the same bits: P and Q are sums every rank receives identically, and
/// what is computed from them is the same arithmetic on the same values (ranks running builds
/// that contract multiply-adds differently, -ffp-contract or -march, may round differently).
/// A rank that has joined (`gradient_bucket::local_contributes` false) sends zeros and keeps its
/// residual as it was.
///
/// Differences from PyTorch's hook, each deliberate: Q is orthogonalized every step, not only when
/// drawn (the same in exact arithmetic); state (residual, Q) is kept per parameter, not per bucket,
/// so the reducer's bucket rebuild after step 1 loses nothing and `start_iteration` may be 0 or 1;
/// Gram-Schmidt runs its projections twice (see `detail::orthogonalize`), so that a gradient of
/// rank below r is still recovered; the residual covers the compressed matrices only (PyTorch's
/// also holds the uncompressed gradients' local-minus-average difference, which averages to zero
/// across ranks); a column of norm zero stays zero instead of becoming NaN when
/// `orthogonalization_epsilon` is 0; the random Q is an approximately normal draw (a centred sum of
/// four uniforms) made with exact IEEE operations, so that ranks on machines with different math
/// libraries draw the same bits; products accumulate in float64.
/// The manual: docs/ddp.md, "Compressing with PowerSGD".

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/ddp/allreduce_hook.hpp"
#include "ringzero/ddp/comm_hook.hpp"

namespace ringzero::ddp {

/// Settings of a `powersgd_hook` (PyTorch's `PowerSGDState` arguments of the same names).
/// Every rank must pass the same values: they are part of the hook's `name()`, which the reducer
/// compares across ranks at construction.
struct powersgd_options {
  /// r: columns of P and Q. At least 1. A matrix whose smaller side is below r is never
  /// compressed (it could not gain); a model where no matrix can be is refused at the first step.
  int matrix_approximation_rank = 1;
  /// Synchronised steps all-reduced plainly before compression starts (PyTorch's
  /// `start_powerSGD_iter`, same default; PyTorch's documentation suggests about 10% of the run).
  std::uint64_t start_iteration = 1000;
  /// A matrix n x m is compressed only when (n + m) * r * min_compression_rate < n * m
  /// (PyTorch's test). At least 1.
  double min_compression_rate = 2.0;
  /// Add last step's residual to the gradient before compressing (error feedback).
  bool use_error_feedback = true;
  /// Start each step's Q from the last step's (else a fresh draw every step).
  bool warm_start = true;
  /// Added to a column's norm before dividing by it in Gram-Schmidt. At least 0.
  double orthogonalization_epsilon = 0.0;
  /// Seed of the random Q (the same on every rank).
  std::uint64_t random_seed = 0;
};

/// Elements one parameter's gradient puts on the wire per compressed step.
struct powersgd_traffic {
  std::uint64_t uncompressed = 0;  ///< elements of the gradient (what plain all_reduce sends)
  std::uint64_t sent = 0;          ///< (n + m) * r when compressed, else the gradient's elements
  bool compressed = false;         ///< sent as P and Q
  std::uint64_t rows = 0;          ///< n (0 for a vector)
  std::uint64_t columns = 0;       ///< m (0 for a vector)
};

namespace detail {

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014).
inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// An approximately standard normal value: (u1 + u2 + u3 + u4 - 2) * sqrt(3), u uniform in
/// [0, 1) with 53 bits (variance 4/12 * 3 = 1). Exact IEEE operations only (no libm), so the
/// same state gives the same bits on every machine.
inline double centred_uniform_sum(std::uint64_t& state) noexcept {
  double s = 0.0;
  for (int k = 0; k < 4; ++k) s += static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
  return (s - 2.0) * 1.7320508075688772;
}

/// Gram-Schmidt on the columns of `a` (rows x cols, row-major), in place: each column has its
/// projections on the earlier columns removed twice ("twice is enough": Giraud, Langou, Rozloznik
/// and van den Eshof, Numerische Mathematik 101, 2005), then is divided by (its norm + epsilon).
/// One pass (PyTorch's `_orthogonalize_gram_schmidt`) leaves a column that was dependent on the
/// earlier ones, as in a matrix of rank below r, as rounding noise along them, which breaks the
/// projection P P^T M; the second pass removes it. A column of norm zero stays zero. Sums in
/// float64.
template <class S>
void orthogonalize(S* a, std::uint64_t rows, std::uint64_t cols, double epsilon) noexcept {
  const auto dot = [&](std::uint64_t x, std::uint64_t y) {
    double d = 0.0;
    for (std::uint64_t k = 0; k < rows; ++k) d += static_cast<double>(a[k * cols + x]) * a[k * cols + y];
    return d;
  };
  for (std::uint64_t i = 0; i < cols; ++i) {
    for (int pass = 0; pass < 2; ++pass)
      for (std::uint64_t j = 0; j < i; ++j) {
        const double d = dot(j, i);
        for (std::uint64_t k = 0; k < rows; ++k)
          a[k * cols + i] = static_cast<S>(a[k * cols + i] - d * a[k * cols + j]);
      }
    const double norm = std::sqrt(dot(i, i)) + epsilon;
    if (norm > 0.0)
      for (std::uint64_t k = 0; k < rows; ++k) a[k * cols + i] = static_cast<S>(a[k * cols + i] / norm);
  }
}

/// out (n x r) = m (n x c) * q (c x r), all row-major; sums in float64.
template <class S>
void multiply(S* out, const S* m, const S* q, std::uint64_t n, std::uint64_t c, std::uint64_t r) noexcept {
  std::vector<double> acc(r);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const S* row = m + i * c;
    for (std::uint64_t j = 0; j < c; ++j)
      for (std::uint64_t k = 0; k < r; ++k) acc[k] += static_cast<double>(row[j]) * q[j * r + k];
    for (std::uint64_t k = 0; k < r; ++k) out[i * r + k] = static_cast<S>(acc[k]);
  }
}

/// out (n x c) = p (n x r) * q^T (r x c), q being c x r row-major; sums in float64.
template <class S>
void multiply_by_transpose(S* out, const S* p, const S* q, std::uint64_t n, std::uint64_t r, std::uint64_t c) noexcept {
  for (std::uint64_t i = 0; i < n; ++i)
    for (std::uint64_t j = 0; j < c; ++j) {
      double acc = 0.0;
      for (std::uint64_t k = 0; k < r; ++k) acc += static_cast<double>(p[i * r + k]) * q[j * r + k];
      out[i * c + j] = static_cast<S>(acc);
    }
}

/// out (c x r) = m^T (c x n) * p (n x r), m being n x c row-major; sums in float64.
template <class S>
void multiply_transposed(S* out, const S* m, const S* p, std::uint64_t n, std::uint64_t c, std::uint64_t r) {
  std::vector<double> acc(c * r, 0.0);
  for (std::uint64_t i = 0; i < n; ++i) {
    const S* row = m + i * c;
    for (std::uint64_t j = 0; j < c; ++j)
      for (std::uint64_t k = 0; k < r; ++k) acc[j * r + k] += static_cast<double>(row[j]) * p[i * r + k];
  }
  for (std::uint64_t x = 0; x < c * r; ++x) out[x] = static_cast<S>(acc[x]);
}

}  // namespace detail

/// PowerSGD compression (see the file comment). Host memory only (`supports`): on a
/// communicator of CUDA device memory the reducer refuses it at construction, on every rank.
/// Float32 and float64 buckets are compressed; buckets of other dtypes are all-reduced plainly.
/// Memory: per compressed parameter its residual (n * m) and Q (m * r); per bucket a wire buffer
/// (the P's and the uncompressed gradients) and the Q's.
/// Communication: two all_reduce per bucket and step (one for a bucket without a compressed
/// matrix), the second issued by `complete` (in the
/// reducer's `finish()`, so it is not overlapped with backward; PyTorch chains it the same way,
/// on its future's callback).
/// Errors (errc::invalid_argument): bad settings, at construction; at the first synchronised
/// step (on every rank alike, since every rank sees the same shapes): a model where no float32
/// or float64 gradient has a matrix shape that the rank and the minimum compression rate allow
/// to compress, naming the best candidate.
/// Thread semantics: one hook object per reducer (it keeps per-parameter state), called on the
/// training thread.
class powersgd_hook final : public comm_hook {
 public:
  /// Throws errc::invalid_argument for a rank below 1, a minimum compression rate below 1 (it
  /// would send more than plain all_reduce) or not finite, a negative or non-finite epsilon.
  explicit powersgd_hook(powersgd_options options = {}) : options_(options) {
    const auto bad = [](const std::string& what) { throw error(errc::invalid_argument, "powersgd_hook: " + what); };
    if (options_.matrix_approximation_rank < 1)
      bad("matrix_approximation_rank must be at least 1, got " + std::to_string(options_.matrix_approximation_rank));
    if (!(options_.min_compression_rate >= 1.0) || !std::isfinite(options_.min_compression_rate))
      bad("min_compression_rate must be a finite value of at least 1, got " + number(options_.min_compression_rate));
    if (!(options_.orthogonalization_epsilon >= 0.0) || !std::isfinite(options_.orthogonalization_epsilon))
      bad("orthogonalization_epsilon must be finite and at least 0, got " + number(options_.orthogonalization_epsilon));
  }

  /// "powersgd(rank=R,start=S,min_rate=X,error_feedback=0|1,warm_start=0|1,epsilon=E,seed=N)":
  /// every setting, so that ranks with different settings are told so at construction.
  std::string name() const override {
    return "powersgd(rank=" + std::to_string(options_.matrix_approximation_rank) +
           ",start=" + std::to_string(options_.start_iteration) + ",min_rate=" + number(options_.min_compression_rate) +
           ",error_feedback=" + (options_.use_error_feedback ? "1" : "0") +
           ",warm_start=" + (options_.warm_start ? "1" : "0") +
           ",epsilon=" + number(options_.orthogonalization_epsilon) + ",seed=" + std::to_string(options_.random_seed) +
           ")";
  }

  /// The settings.
  const powersgd_options& options() const noexcept { return options_; }

  /// Synchronised steps completed (plain ones included).
  std::uint64_t iterations() const noexcept { return iterations_; }

  /// Synchronised steps compressed so far (those after `start_iteration`).
  std::uint64_t compressed_steps() const noexcept {
    return iterations_ - std::min(iterations_, options_.start_iteration);
  }

  /// True once steps are compressed (`iterations() >= start_iteration`).
  bool compressing() const noexcept { return iterations_ >= options_.start_iteration; }

  /// What parameter `p` (registered index) sends per compressed step; known after the first
  /// synchronised step (before: all zero).
  powersgd_traffic traffic(std::size_t p) const {
    const auto it = traffic_.find(p);
    return it == traffic_.end() ? powersgd_traffic{} : it->second;
  }

  /// Elements sent per compressed step over every bucket the hook has seen, and what plain
  /// all_reduce would send: {sent, uncompressed}.
  std::pair<std::uint64_t, std::uint64_t> step_traffic() const noexcept {
    std::uint64_t sent = 0, full = 0;
    for (const auto& [p, t] : traffic_) {
      sent += t.sent;
      full += t.uncompressed;
    }
    return {sent, full};
  }

  /// Starts the bucket's first all_reduce: plain during the first `start_iteration` steps and
  /// for buckets of other dtypes, else the P's and the uncompressed gradients.
  work launch(communicator& comm, const gradient_bucket& bucket) override {
    comm_ = &comm;
    classify(bucket);
    if (bucket.is_last() && !checked_) check_something_compresses();
    per_bucket& b = bucket_state(bucket.index);
    b.compressed = compressible_type(bucket.type) && compressing();
    if (!b.compressed) return fallback_.launch(comm, bucket);
    if (bucket.type == dtype::float32) return launch_typed<float>(comm, bucket, b, states32_);
    return launch_typed<double>(comm, bucket, b, states64_);
  }

  /// Finishes the bucket (see the file comment); the second all_reduce is synchronous.
  void complete(const gradient_bucket& bucket) override {
    per_bucket& b = bucket_state(bucket.index);
    if (!b.compressed)
      fallback_.complete(bucket);
    else if (bucket.type == dtype::float32)
      complete_typed<float>(bucket, b, states32_);
    else
      complete_typed<double>(bucket, b, states64_);
    if (bucket.is_last()) ++iterations_;
  }

 private:
  template <class S>
  struct parameter_state {
    std::vector<S> residual;  // error feedback: M's residual (n * m)
    std::vector<S> q;         // m * r, kept for warm start
    bool q_drawn = false;
  };
  template <class S>
  using states = std::unordered_map<std::size_t, parameter_state<S>>;

  struct per_bucket {
    bool compressed = false;
    std::uint64_t plain = 0;      // uncompressed elements at the front of `wire`
    std::vector<std::byte> wire;  // uncompressed gradients, then every P (bucket dtype)
    std::vector<std::byte> qs;    // every Q (bucket dtype)
  };

  static bool compressible_type(dtype t) noexcept { return t == dtype::float32 || t == dtype::float64; }

  /// The shortest text that reads back as `v` (std::to_chars: no locale, no rounding), so that
  /// settings that differ in any bit have different names.
  static std::string number(double v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  }

  per_bucket& bucket_state(std::size_t index) {
    if (buckets_.size() <= index) buckets_.resize(index + 1);
    return buckets_[index];
  }

  std::uint64_t rank_for(std::uint64_t n, std::uint64_t m) const noexcept {
    return std::min<std::uint64_t>({static_cast<std::uint64_t>(options_.matrix_approximation_rank), n, m});
  }

  /// Records what each gradient of the bucket sends (once per parameter; shapes never change).
  void classify(const gradient_bucket& bucket) {
    for (const bucket_gradient& g : bucket.gradients) {
      if (traffic_.count(g.parameter)) continue;
      powersgd_traffic t;
      t.uncompressed = g.count;
      t.sent = g.count;
      const std::uint64_t n = g.matrix_rows();
      if (n > 0 && g.count > 0 && compressible_type(bucket.type)) {
        const std::uint64_t m = g.count / n;
        t.rows = n;
        t.columns = m;
        const std::uint64_t r = rank_for(n, m);
        const double compressed = static_cast<double>(n + m) * static_cast<double>(r);
        if (compressed * options_.min_compression_rate < static_cast<double>(n) * static_cast<double>(m)) {
          t.compressed = true;
          t.sent = (n + m) * r;
        }
        // The best candidate so far, for the error when nothing compresses: the largest gain.
        const double gain = static_cast<double>(n) * static_cast<double>(m) / compressed;
        if (gain > best_gain_) {
          best_gain_ = gain;
          best_at_rank1_ = static_cast<double>(n + m) * options_.min_compression_rate <
                           static_cast<double>(n) * static_cast<double>(m);
          best_ = std::string(g.name.empty() ? "parameter " + std::to_string(g.parameter)
                                             : "'" + std::string(g.name) + "'") +
                  " [" + std::to_string(n) + " x " + std::to_string(m) + "] would send (" + std::to_string(n) + " + " +
                  std::to_string(m) + ") * " + std::to_string(r) + " = " + std::to_string((n + m) * r) +
                  " elements instead of " + std::to_string(n * m);
        }
      }
      any_compressed_ = any_compressed_ || t.compressed;
      traffic_[g.parameter] = t;
    }
  }

  void check_something_compresses() {
    checked_ = true;
    if (any_compressed_) return;
    std::string why =
        best_.empty()
            ? "no float32 or float64 gradient has a shape of two or more dimensions (register shapes: "
              "reducer_parameter::shape; gradients of other dtypes are all-reduced as they are)"
            : "no matrix gains enough: the best, " + best_ + " (min_compression_rate " +
                  number(options_.min_compression_rate) + "); " +
                  (best_at_rank1_ ? std::string("lower matrix_approximation_rank")
                                  : std::string("it would not gain even at rank 1 (a matrix with a side this short is "
                                                "cheaper sent as it is)"));
    throw error(errc::invalid_argument, "powersgd_hook: nothing to compress at matrix_approximation_rank " +
                                            std::to_string(options_.matrix_approximation_rank) + ": " + why);
  }

  /// Bucket-local layout of the compressed gradients: P's after the uncompressed elements.
  template <class S>
  static S* as(std::vector<std::byte>& bytes, std::uint64_t elements) {
    if (bytes.size() < elements * sizeof(S)) bytes.resize(elements * sizeof(S));
    return reinterpret_cast<S*>(bytes.data());
  }

  template <class S>
  work launch_typed(communicator& comm, const gradient_bucket& bucket, per_bucket& b, states<S>& st) {
    S* data = static_cast<S*>(bucket.data);
    std::uint64_t plain = 0, p_total = 0, q_total = 0;
    for (const bucket_gradient& g : bucket.gradients) {
      const powersgd_traffic& t = traffic_.at(g.parameter);
      if (!t.compressed) {
        plain += g.count;
        continue;
      }
      const std::uint64_t r = rank_for(t.rows, t.columns);
      p_total += t.rows * r;
      q_total += t.columns * r;
    }
    b.plain = plain;
    S* wire = as<S>(b.wire, plain + p_total);
    (void)as<S>(b.qs, q_total);
    std::uint64_t at_plain = 0, at_p = plain;
    for (const bucket_gradient& g : bucket.gradients) {
      const powersgd_traffic& t = traffic_.at(g.parameter);
      S* m = data + g.offset;
      if (!t.compressed) {
        std::copy(m, m + g.count, wire + at_plain);
        at_plain += g.count;
        continue;
      }
      const std::uint64_t r = rank_for(t.rows, t.columns);
      parameter_state<S>& s = st[g.parameter];
      if (options_.use_error_feedback && bucket.local_contributes) {  // a joined rank's zeros stay zeros
        if (s.residual.size() != g.count) s.residual.assign(g.count, S(0));
        for (std::uint64_t k = 0; k < g.count; ++k) {
          m[k] += s.residual[k];
          s.residual[k] = m[k];  // the corrected input; complete() subtracts the approximation
        }
      }
      if (!s.q_drawn || !options_.warm_start) {
        s.q.resize(t.columns * r);
        std::uint64_t state = options_.random_seed ^ (0x51ed2705ull * (g.parameter + 1)) ^
                              (options_.warm_start ? 0 : (iterations_ + 1) * 0x2545f4914f6cdd1dull);
        for (S& v : s.q) v = static_cast<S>(detail::centred_uniform_sum(state));
        s.q_drawn = true;
      }
      detail::orthogonalize(s.q.data(), t.columns, r, options_.orthogonalization_epsilon);
      detail::multiply(wire + at_p, m, s.q.data(), t.rows, t.columns, r);
      at_p += t.rows * r;
    }
    return all_reduce_async(comm, wire, wire, plain + p_total, bucket.type, reduce_kind::sum, bucket.options);
  }

  template <class S>
  void complete_typed(const gradient_bucket& bucket, per_bucket& b, states<S>& st) {
    S* data = static_cast<S*>(bucket.data);
    S* wire = reinterpret_cast<S*>(b.wire.data());
    S* qs = reinterpret_cast<S*>(b.qs.data());
    const std::uint64_t plain = b.plain;
    // Q = M^T P for every compressed gradient, then one all_reduce of them all.
    std::uint64_t at_p = plain, at_q = 0;
    for (const bucket_gradient& g : bucket.gradients) {
      const powersgd_traffic& t = traffic_.at(g.parameter);
      if (!t.compressed) continue;
      const std::uint64_t r = rank_for(t.rows, t.columns);
      detail::orthogonalize(wire + at_p, t.rows, r, options_.orthogonalization_epsilon);
      detail::multiply_transposed(qs + at_q, data + g.offset, wire + at_p, t.rows, t.columns, r);
      at_p += t.rows * r;
      at_q += t.columns * r;
    }
    if (at_q > 0) all_reduce(*comm_, qs, qs, at_q, bucket.type, reduce_kind::sum, bucket.options);
    const S divisor = static_cast<S>(bucket.divisor);
    if (bucket.divisor > 1)
      for (std::uint64_t k = 0; k < at_q; ++k) qs[k] /= divisor;
    at_p = plain;
    at_q = 0;
    std::uint64_t at_plain = 0;
    for (const bucket_gradient& g : bucket.gradients) {
      const powersgd_traffic& t = traffic_.at(g.parameter);
      S* m = data + g.offset;
      if (!t.compressed) {
        for (std::uint64_t k = 0; k < g.count; ++k)
          m[k] = bucket.divisor > 1 ? wire[at_plain + k] / divisor : wire[at_plain + k];
        at_plain += g.count;
        continue;
      }
      const std::uint64_t r = rank_for(t.rows, t.columns);
      parameter_state<S>& s = st[g.parameter];
      detail::multiply_by_transpose(m, wire + at_p, qs + at_q, t.rows, r, t.columns);  // M = P Q^T
      if (options_.warm_start) std::copy(qs + at_q, qs + at_q + t.columns * r, s.q.begin());
      if (options_.use_error_feedback && bucket.local_contributes)
        for (std::uint64_t k = 0; k < g.count; ++k) s.residual[k] -= m[k];
      at_p += t.rows * r;
      at_q += t.columns * r;
    }
  }

  powersgd_options options_;
  allreduce_hook fallback_;
  communicator* comm_ = nullptr;
  std::uint64_t iterations_ = 0;
  std::vector<per_bucket> buckets_;
  states<float> states32_;
  states<double> states64_;
  std::unordered_map<std::size_t, powersgd_traffic> traffic_;
  bool any_compressed_ = false;
  bool checked_ = false;
  double best_gain_ = 0.0;
  bool best_at_rank1_ = false;  // the best candidate would compress at rank 1
  std::string best_;
};

/// PyTorch's `powerSGD_hook` with `PowerSGDState(matrix_approximation_rank, start_powerSGD_iter)`.
/// The shared pointer converts to `reducer_options::hook` and keeps `traffic()` and
/// `iterations()` within reach.
inline std::shared_ptr<powersgd_hook> make_powersgd_hook(powersgd_options options = {}) {
  return std::make_shared<powersgd_hook>(options);
}

}  // namespace ringzero::ddp
