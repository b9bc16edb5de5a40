#pragma once
/// @file
/// Small CUDA helpers of the examples' GPU path: `device_array<T>` (cudaMalloc'ed elements, freed
/// on destruction), `cublas_handle` (a cuBLAS handle bound to a stream) and the checks that turn
/// CUDA and cuBLAS errors into `ringzero::error(errc::backend_failure)` naming the call.
///
/// Host code only (cudart and cuBLAS; no nvcc). Threads: each object belongs to one rank's thread.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"

namespace ringzero::examples {

/// Throws errc::backend_failure "<what> failed: <cuBLAS status>" unless `s` is success.
inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw error(errc::backend_failure,
              std::string(what) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

/// `count` elements of T in device memory of the current device (contents unspecified).
template <class T>
class device_array {
 public:
  device_array() = default;
  /// Allocates `count` elements (at least one byte). Throws errc::backend_failure.
  explicit device_array(std::size_t count) : count_(count) {
    void* p = nullptr;
    primitive::cudart::check(cudaMalloc(&p, count == 0 ? 1 : count * sizeof(T)),
                             ("cudaMalloc of " + std::to_string(count * sizeof(T)) + " bytes").c_str());
    data_ = static_cast<T*>(p);
  }
  device_array(device_array&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { reset(); }

  T* get() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }

  /// Copies `host` (at most size() elements) into the array, in the order of `stream`; the
  /// host vector may be reused when this returns (pageable memory is staged by the runtime).
  void upload(const std::vector<T>& host, cudaStream_t stream) const {
    if (host.empty()) return;
    primitive::cudart::check(
        cudaMemcpyAsync(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (upload)");
  }

 private:
  void reset() noexcept {
    if (data_) (void)cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// A cuBLAS handle whose work is enqueued on `stream` (cublasSetStream). Default math mode:
/// full float32 products (no TF32), so the GPU run trains the same model as the CPU one.
class cublas_handle {
 public:
  /// Creates the handle on the current device. Throws errc::backend_failure.
  explicit cublas_handle(cudaStream_t stream) {
    check_cublas(cublasCreate(&handle_), "cublasCreate");
    check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() {
    if (handle_) (void)cublasDestroy(handle_);
  }
  cublasHandle_t get() const noexcept { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// Throws errc::backend_failure "<what> failed: <CUDA error>" unless `e` is cudaSuccess (a
/// kernel launch's result).
inline void check_launch(cudaError_t e, const char* what) { primitive::cudart::check(e, what); }

}  // namespace ringzero::examples
