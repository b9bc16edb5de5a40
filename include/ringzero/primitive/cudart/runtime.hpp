#pragma once
/// @file
/// The CUDA runtime as ringzero's backends use it (host code only; no nvcc needed): turning a
/// `cudaError_t` into a `ringzero::error`, counting devices, refusing to run without one
/// (`errc::no_device`, "no CUDA device"), and a guard that makes a device current.
///
/// Requires the CUDA runtime headers and library: build with `RINGZERO_HAS_CUDA=1` (the Meson
/// and CMake dependencies do this when cudart is found) or compile with nvcc.
/// Thread safety: every function may be called from any thread; `device_guard` changes the
/// calling thread's current device for its lifetime, as `cudaSetDevice` does.

#include "ringzero/core/config.hpp"

#if !RINGZERO_HAS_CUDA && !defined(__CUDACC__)
#error \
    "ringzero/primitive/cudart/*.hpp needs the CUDA runtime: define RINGZERO_HAS_CUDA=1 and link cudart (or compile with nvcc)"
#endif

#include <cuda_runtime_api.h>

#include <string>

#include "ringzero/core/error.hpp"

namespace ringzero::primitive::cudart {

/// "cudaErrorMemoryAllocation: out of memory" for `e`.
inline std::string error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

/// Whether `e` means that this process has no usable CUDA device at all (no device, no or a
/// too old driver, only the toolkit's link-time copy of the driver library loaded), as opposed
/// to a failure of one call.
inline bool means_no_device(cudaError_t e) noexcept {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary ||
         e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice;
}

/// The errc of a failed CUDA call `e` (not cudaSuccess): errc::no_device where
/// `means_no_device(e)`, errc::backend_failure otherwise.
inline errc errc_of(cudaError_t e) noexcept { return means_no_device(e) ? errc::no_device : errc::backend_failure; }

/// Throws `ringzero::error` "<what> failed: <error>" unless `e` is cudaSuccess: errc::no_device
/// (the message then says "no CUDA device") where `means_no_device(e)`, errc::backend_failure
/// otherwise. The runtime's sticky last-error state is cleared first, so a failed call does
/// not poison the next check.
inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  if (means_no_device(e))
    throw error(errc::no_device, std::string(what) + " failed: no CUDA device (" + error_text(e) + ")");
  throw error(errc::backend_failure, std::string(what) + " failed: " + error_text(e));
}

/// Number of CUDA devices this process can use; 0 when there is none or no usable driver
/// (then `why`, when given, says what the runtime answered). Never throws.
inline int device_count(std::string* why = nullptr) noexcept {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    try {
      if (why) *why = error_text(e);
    } catch (...) {}
    return 0;
  }
  if (n <= 0) {
    try {
      if (why) *why = "cudaGetDeviceCount reports no device";
    } catch (...) {}
    return 0;
  }
  return n;
}

/// The device count, or `errc::no_device` "`who`: no CUDA device (<runtime's answer>)" when
/// there is none. `who` names the caller ("local::launch_cuda", "nccl::communicator", ...).
inline int require_device(const std::string& who) {
  std::string why;
  const int n = device_count(&why);
  if (n < 1) throw error(errc::no_device, who + ": no CUDA device (" + why + ")");
  return n;
}

/// Throws `errc::invalid_argument` unless `device` is in [0, device_count()), after
/// `require_device(who)`.
inline void require_device_index(int device, const std::string& who) {
  const int n = require_device(who);
  if (device < 0 || device >= n)
    throw error(errc::invalid_argument,
                who + ": CUDA device " + std::to_string(device) + " is outside [0, " + std::to_string(n) + ")");
}

/// Makes `device` current on the calling thread (cudaSetDevice) unless it already is; it stays
/// current afterwards. Throws errc::backend_failure when the runtime refuses.
inline void use_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  check(cudaSetDevice(device), "cudaSetDevice");
}

/// Makes `device` current on the calling thread for the guard's lifetime and restores the
/// previous current device afterwards. Throws errc::backend_failure when cudaSetDevice fails.
class device_guard {
 public:
  explicit device_guard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) {
      check(cudaSetDevice(device), "cudaSetDevice");
      changed_ = true;
    }
  }
  ~device_guard() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace ringzero::primitive::cudart
