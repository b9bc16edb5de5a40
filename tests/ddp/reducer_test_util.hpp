#pragma once
// Helpers shared by the gradient reducer tests: a small model of parameters with exact values,
// running a body on N local ranks while keeping every rank's error.

#include <doctest/doctest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/backend/local/launch.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

namespace ringzero::test {

/// One rank's error (kind and text), or nothing.
struct rank_outcome {
  bool failed = false;
  errc kind = errc::internal;
  std::string what;
};

/// Runs `body(comm)` on `n` local ranks with a short timeout; returns each rank's outcome
/// (a throwing rank does not stop the others from being recorded).
inline std::vector<rank_outcome> run_ranks(int n, const std::function<void(communicator&)>& body,
                                           double timeout_s = 20.0) {
  std::vector<rank_outcome> out(static_cast<std::size_t>(n));
  local::launch_options opt;
  opt.timeout = std::chrono::duration<double>(timeout_s);
  try {
    local::launch(
        n,
        [&](communicator& comm) {
          auto& o = out[static_cast<std::size_t>(comm.rank())];
          try {
            body(comm);
          } catch (const error& e) {
            o.failed = true;
            o.kind = e.kind();
            o.what = e.what();
            throw;
          } catch (const std::exception& e) {
            o.failed = true;
            o.what = e.what();
            throw;
          }
        },
        opt);
  } catch (...) {}
  return out;
}

/// True when `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A set of parameters of given sizes with owned values and gradients (float32 or float64).
struct toy_model {
  std::vector<std::vector<float>> values32, grads32;
  std::vector<std::vector<double>> values64, grads64;
  std::vector<dtype> types;
  std::vector<std::size_t> slot;  // index into the vectors of its dtype

  toy_model(const std::vector<std::uint64_t>& counts, const std::vector<dtype>& dtypes) {
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const dtype t = dtypes.empty() ? dtype::float32 : dtypes[i];
      types.push_back(t);
      if (t == dtype::float64) {
        slot.push_back(values64.size());
        values64.emplace_back(counts[i], 0.0);
        grads64.emplace_back(counts[i], 0.0);
      } else {
        slot.push_back(values32.size());
        values32.emplace_back(counts[i], 0.0f);
        grads32.emplace_back(counts[i], 0.0f);
      }
    }
  }

  std::size_t size() const { return types.size(); }
  std::size_t count(std::size_t i) const {
    return types[i] == dtype::float64 ? values64[slot[i]].size() : values32[slot[i]].size();
  }

  std::vector<ddp::reducer_parameter> parameters() {
    std::vector<ddp::reducer_parameter> p;
    for (std::size_t i = 0; i < types.size(); ++i) {
      std::string name = "p";
      name += std::to_string(i);
      if (types[i] == dtype::float64)
        p.push_back(ddp::reducer_parameter::of(std::span<double>(values64[slot[i]]),
                                               std::span<double>(grads64[slot[i]]), name));
      else
        p.push_back(
            ddp::reducer_parameter::of(std::span<float>(values32[slot[i]]), std::span<float>(grads32[slot[i]]), name));
    }
    return p;
  }

  /// Gradient element `k` of parameter `i` as double, read from `where` (the reducer's view or
  /// the owned buffer).
  static double read(const void* where, dtype t, std::size_t k) {
    return t == dtype::float64 ? static_cast<const double*>(where)[k] : static_cast<const float*>(where)[k];
  }
  static void write(void* where, dtype t, std::size_t k, double v) {
    if (t == dtype::float64)
      static_cast<double*>(where)[k] = v;
    else
      static_cast<float*>(where)[k] = static_cast<float>(v);
  }
};

/// The parameter indices of each bucket of `red`'s current layout.
inline std::vector<std::vector<std::size_t>> bucket_indices_of(const ddp::gradient_reducer& red) {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& b : red.buckets()) out.push_back(b.parameters);
  return out;
}

/// An exact gradient value: element k of parameter i on rank r in step s (small integers times
/// 1/8, so every sum over up to 16 ranks and its division by 2 or 4 are exact in float).
inline double grad_value(int rank, std::size_t i, std::size_t k, int step) {
  return static_cast<double>(((rank + 1) * 3 + static_cast<int>(i) * 5 + static_cast<int>(k % 7) + step * 2) % 29) /
         8.0;
}

}  // namespace ringzero::test
