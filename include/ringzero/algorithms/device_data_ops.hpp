#pragma once
/// @file
/// `device_data_ops`: the `data_ops` of a transport whose buffers live in CUDA device memory.
/// Every operation is enqueued on the transport's stream (copies with cudaMemcpyAsync,
/// combines, scaling and casts with the CUDA primitives) and returns at once, so a schedule (ring,
/// halving_doubling) issues a whole collective without waiting for the device; the backend
/// orders the transfers between ranks with CUDA events (backend/local/cuda_communicator.hpp) or
/// on the stream itself (NCCL).
///
/// The work is primitive/device_stream_ref.hpp's: the program-wide kernel table of
/// primitive/device_primitives.hpp (registered by one .cu file that includes <ringzero/cuda.cuh>),
/// so this header, and every collective, compiles without nvcc and without CUDA headers.
/// Thread semantics: one object per collective call, used by the thread that runs it.
/// Determinism: the same element-wise arithmetic as the host, bit for bit.

#include <cstdint>
#include <deque>
#include <string>

#include "ringzero/algorithms/data_ops.hpp"
#include "ringzero/backend/transport.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/device_stream_ref.hpp"

namespace ringzero::algorithms {

/// `data_ops` on CUDA device memory, enqueued on `t.cuda_stream()` on `t.cuda_device()` through
/// primitive::device_stream_ref. Errors: a failed launch raises `ringzero::error(errc::backend_failure)`
/// within `op`, naming the operation and the CUDA error.
class device_data_ops final : public data_ops {
 public:
  /// Operations for collective `op` on `t` (whose space() is memory_space::cuda) with the kernels
  /// of `kernels`. Makes the transport's device current on the calling thread.
  device_data_ops(const primitive::device_primitives& kernels, transport& t, const collective_descriptor& op)
      : t_(t), op_(op), stream_(kernels, t.cuda_stream(), t.cuda_device()) {
    check(stream_.make_current(), "cudaSetDevice");
  }

  void copy(void* dst, const void* src, std::uint64_t bytes, bool streaming = false) const override {
    (void)streaming;
    check(stream_.copy(dst, src, bytes), "device copy (cudaMemcpyAsync)");
  }
  void reduce(void* dst, const void* a, const void* b, std::uint64_t count,
              const primitive::reduce_spec& spec) const override {
    check(stream_.reduce(dst, a, b, count, spec), "device reduce_into");
  }
  void scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar) const override {
    check(stream_.scale(dst, src, count, type, scalar), "device scale");
  }
  void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) const override {
    check(stream_.cast(dst, dst_type, src, src_type, count), "device cast");
  }
  combine_fn combine(const primitive::reduce_spec* spec) const override {
    bound_.push_back(bound_combine{this, spec});
    combine_fn f;
    f.fn = [](const void* context, void* dst, const void* a, const void* b, std::uint64_t count) {
      const auto* c = static_cast<const bound_combine*>(context);
      c->ops->reduce(dst, a, b, count, *c->spec);
    };
    f.context = &bound_.back();
    f.element_size = dtype_size(spec->type);
    return f;
  }
  /// Nothing to do: the stream orders every later operation after these.
  void fence() const override {}

 private:
  struct bound_combine {
    const device_data_ops* ops;
    const primitive::reduce_spec* spec;
  };

  void check(int code, const char* what) const {
    if (code != 0) t_.raise(&op_, errc::backend_failure, stream_.describe(code, what));
  }

  transport& t_;
  const collective_descriptor& op_;
  primitive::device_stream_ref stream_;
  mutable std::deque<bound_combine> bound_;  ///< stable addresses for the combines handed out
};

}  // namespace ringzero::algorithms
