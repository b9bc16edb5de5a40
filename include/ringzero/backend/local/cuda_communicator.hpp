#pragma once
/// @file
/// `local::cuda_communicator`: one rank of a local (threads) world whose buffers live in CUDA
/// device memory, with its own CUDA stream, on any device of the process; several ranks may share
/// one GPU. Transfers keep the local backend's zero-copy protocol, ordered on the devices by CUDA
/// events instead of on the host threads.
/// Stream semantics are NCCL's: a collective returns once enqueued on `stream()`; `synchronize()`
/// before reading results. Buffers must stay valid until the stream has run the collective.
/// Algorithms: ring and halving_doubling. Requires the CUDA runtime and, to move data, the kernels
/// of <ringzero/cuda.cuh>. Manual: docs/gpu.md.

#include <cstdint>
#include <string>
#include <vector>

#include "ringzero/backend/local/communicator.hpp"
#include "ringzero/primitive/cudart/device_workspace.hpp"
#include "ringzero/primitive/cudart/event.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"
#include "ringzero/primitive/cudart/stream.hpp"

namespace ringzero::local {

/// One rank of a local world on CUDA device memory. See the file comment.
class cuda_communicator final : public communicator {
 public:
  /// Rank `rank` of `w` on CUDA device `device`, ordering its work on `stream` (nullptr: a
  /// non-blocking stream created, and destroyed, by the communicator). Throws errc::no_device
  /// when the process has no CUDA device, errc::invalid_argument for a bad rank or device, and
  /// errc::backend_failure when the runtime cannot create the stream or events.
  cuda_communicator(world& w, int rank, int device, cudaStream_t stream = nullptr)
      : communicator(w, rank),
        device_(checked_device(device)),
        stream_(stream ? primitive::cudart::stream::borrow(stream) : primitive::cudart::stream::create(device)),
        workspace_(device, stream_.get()),
        peer_mode_(static_cast<std::size_t>(w.size()), peer_unknown) {
    primitive::cudart::use_device(device_);
    ready_.reserve(static_cast<std::size_t>(w.size()));
    consumed_.reserve(static_cast<std::size_t>(w.size()));
    for (int r = 0; r < w.size(); ++r) {
      ready_.emplace_back(device_);
      consumed_.emplace_back(device_);
    }
  }

  ~cuda_communicator() override {
    stop_progress();
    try {
      primitive::cudart::use_device(device_);
      (void)cudaStreamSynchronize(stream_.get());
    } catch (...) {}
  }

  memory_space space() const noexcept override { return memory_space::cuda; }
  void* cuda_stream() const noexcept override { return static_cast<void*>(stream_.get()); }
  int cuda_device() const noexcept override { return device_; }

  /// The stream this rank's collectives are enqueued on.
  cudaStream_t stream() const noexcept { return stream_.get(); }
  /// This rank's CUDA device.
  int device() const noexcept { return device_; }

  /// ring and halving_doubling.
  bool supports(algorithm a, collective_kind) const noexcept override {
    return a == algorithm::ring || a == algorithm::halving_doubling;
  }

  /// Device costs for the algorithm choice: each step costs an event record, a stream wait and
  /// a kernel or copy launch (~8 us); bytes move at the device's copy bandwidth shared by the
  /// ranks of one GPU (about 1.5 TB/s per rank assumed).
  link_model link() const noexcept override {
    link_model m;
    m.alpha_us = 8.0;
    m.beta_us_per_byte = 1.0 / 1.5e6;
    m.gamma_us_per_byte = 1.0 / 1.5e6;
    m.sync_us = 8.0;
    m.memory_us_per_byte = 1.0 / 1.5e6;
    return m;
  }

  /// Waits for queued asynchronous work, then for the stream. Throws errc::backend_failure when
  /// device work failed.
  void synchronize() override {
    communicator::synchronize();
    primitive::cudart::use_device(device_);
    primitive::cudart::check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
  }

  void* scratch(int slot, std::size_t bytes) override { return workspace_.get(slot, bytes); }
  std::size_t scratch_bytes() const noexcept override { return workspace_.capacity_bytes(); }

  void begin(const collective_descriptor& d) override {
    primitive::cudart::use_device(device_);
    communicator::begin(d);
  }

 protected:
  void backend_sendrecv(const collective_descriptor& op, const void* send, std::uint64_t send_bytes, int to, void* recv,
                        std::uint64_t recv_bytes, int from) override {
    primitive::cudart::use_device(device_);
    communicator::backend_sendrecv(op, send, send_bytes, to, recv, recv_bytes, from);
  }

  void backend_sendrecv_reduce(const collective_descriptor& op, const void* send, std::uint64_t send_bytes, int to,
                               const void* own, void* acc, std::uint64_t bytes, int from,
                               const combine_fn& combine) override {
    primitive::cudart::use_device(device_);
    communicator::backend_sendrecv_reduce(op, send, send_bytes, to, own, acc, bytes, from, combine);
  }

  void* signal_ready(int to) override {
    const primitive::cudart::event& e = ready_[static_cast<std::size_t>(to)];
    e.record(stream_.get());
    return static_cast<void*>(e.get());
  }

  void on_arrival(int from, void* signal) override {
    (void)from;
    if (signal) primitive::cudart::stream_wait(stream_.get(), static_cast<cudaEvent_t>(signal));
  }

  void copy_received(void* dst, const void* src, std::uint64_t bytes, int from) override {
    (void)from;
    primitive::cudart::check(
        cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault, stream_.get()),
        "cudaMemcpyAsync (receive)");
  }

  const void* readable_received(const void* data, std::uint64_t bytes, int from) override {
    if (mode_for(data, from) != peer_staged) return data;
    void* staging = workspace_.get(primitive::cudart::device_workspace::staging_slot, static_cast<std::size_t>(bytes));
    primitive::cudart::check(
        cudaMemcpyAsync(staging, data, static_cast<std::size_t>(bytes), cudaMemcpyDefault, stream_.get()),
        "cudaMemcpyAsync (staging a peer's buffer)");
    return staging;
  }

  void* signal_consumed(int from) override {
    const primitive::cudart::event& e = consumed_[static_cast<std::size_t>(from)];
    e.record(stream_.get());
    return static_cast<void*>(e.get());
  }

  void on_consumed(int to, void* signal) override {
    (void)to;
    if (signal) primitive::cudart::stream_wait(stream_.get(), static_cast<cudaEvent_t>(signal));
  }

 private:
  enum peer_mode : int { peer_unknown = 0, peer_direct = 1, peer_staged = 2 };

  static int checked_device(int device) {
    primitive::cudart::require_device_index(device, "local::cuda_communicator");
    return device;
  }

  /// How this rank's kernels read rank `from`'s buffers: directly (same device, or peer access
  /// enabled) or through a staging copy. Decided on first contact from the sender's pointer.
  int mode_for(const void* data, int from) {
    int& mode = peer_mode_[static_cast<std::size_t>(from)];
    if (mode != peer_unknown) return mode;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
      (void)cudaGetLastError();
      mode = peer_direct;  // not a pointer the runtime knows: leave it to the kernel, as for host-visible memory
      return mode;
    }
    if (attributes.type != cudaMemoryTypeDevice || attributes.device == device_) {
      mode = peer_direct;
      return mode;
    }
    int can_access = 0;
    if (cudaDeviceCanAccessPeer(&can_access, device_, attributes.device) == cudaSuccess && can_access) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(attributes.device, 0);
      if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        mode = peer_direct;
        return mode;
      }
    }
    (void)cudaGetLastError();
    mode = peer_staged;
    return mode;
  }

  int device_;
  primitive::cudart::stream stream_;
  primitive::cudart::device_workspace workspace_;
  std::vector<primitive::cudart::event> ready_;     ///< per destination rank: "my data for it is ready"
  std::vector<primitive::cudart::event> consumed_;  ///< per source rank: "I have finished reading its data"
  std::vector<int> peer_mode_;
};

}  // namespace ringzero::local
