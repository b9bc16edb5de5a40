#pragma once
// Helpers of the GPU tests: device buffers, reproducible random bytes, and an exact comparison
// of two buffers of a dtype (bit for bit; two NaNs count as equal only where `nan_equal` says
// so, because a NaN produced by arithmetic carries the hardware's payload).

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"

namespace gpu_test {

/// cudaMalloc'd bytes, freed on destruction.
class device_buffer {
 public:
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) {
    ringzero::primitive::cudart::check(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), "cudaMalloc (test buffer)");
  }
  ~device_buffer() { (void)cudaFree(data_); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  unsigned char* get() const noexcept { return static_cast<unsigned char*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

  void upload(const std::vector<unsigned char>& host, std::size_t offset = 0) const {
    ringzero::primitive::cudart::check(cudaMemcpy(get() + offset, host.data(), host.size(), cudaMemcpyHostToDevice),
                                       "cudaMemcpy H2D");
    // From pageable memory cudaMemcpy may return before the DMA has landed, and it is not ordered
    // with non-blocking streams (CUDA runtime API, "API synchronization behavior"): wait for it.
    ringzero::primitive::cudart::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after an upload)");
  }
  std::vector<unsigned char> download(std::size_t offset, std::size_t bytes) const {
    std::vector<unsigned char> host(bytes);
    // Work on non-blocking streams is not ordered before a cudaMemcpy: wait for all of it.
    ringzero::primitive::cudart::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before a download)");
    ringzero::primitive::cudart::check(cudaMemcpy(host.data(), get() + offset, bytes, cudaMemcpyDeviceToHost),
                                       "cudaMemcpy D2H");
    return host;
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

/// `bytes` random bytes from `seed` (every bit pattern: NaNs, infinities, subnormals included).
inline std::vector<unsigned char> random_bytes(std::size_t bytes, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<unsigned char> v(bytes);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t x = gen();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < bytes; ++i) v[i] = static_cast<unsigned char>(gen());
  return v;
}

/// Element `i` of `data` (dtype `t`) as double, and whether it is a NaN.
inline bool is_nan_at(ringzero::dtype t, const unsigned char* data, std::size_t i) {
  bool nan = false;
  ringzero::visit_dtype(t, [&]<class T>() {
    T x;
    std::memcpy(&x, data + i * sizeof(T), sizeof(T));
    if constexpr (ringzero::element_type<T>) {
      const double d = static_cast<double>(x);
      nan = d != d;
    }
  });
  return nan;
}

/// Index of the first of `n` elements (dtype `t`) where `got` and `want` differ (bitwise; NaN ==
/// NaN when `nan_equal`), or -1. `what` receives both bit patterns.
inline long long first_difference(ringzero::dtype t, const unsigned char* got, const unsigned char* want, std::size_t n,
                                  bool nan_equal, std::string* what = nullptr) {
  const std::size_t es = ringzero::dtype_size(t);
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(got + i * es, want + i * es, es) == 0) continue;
    if (nan_equal && ringzero::is_floating_point(t) && is_nan_at(t, got, i) && is_nan_at(t, want, i)) continue;
    if (what) {
      char buf[128];
      std::uint64_t g = 0, w = 0;
      std::memcpy(&g, got + i * es, es);
      std::memcpy(&w, want + i * es, es);
      std::snprintf(buf, sizeof buf, "element %zu: got 0x%llx, want 0x%llx", i, static_cast<unsigned long long>(g),
                    static_cast<unsigned long long>(w));
      *what = buf;
    }
    return static_cast<long long>(i);
  }
  return -1;
}

/// The same over two whole buffers; buffers of different sizes differ at element 0.
inline long long first_difference(ringzero::dtype t, const std::vector<unsigned char>& got,
                                  const std::vector<unsigned char>& want, bool nan_equal, std::string* what = nullptr) {
  if (got.size() != want.size()) return 0;
  return first_difference(t, got.data(), want.data(), got.size() / ringzero::dtype_size(t), nan_equal, what);
}

}  // namespace gpu_test
