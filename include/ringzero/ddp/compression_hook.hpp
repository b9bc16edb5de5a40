#pragma once
/// @file
/// `compression_hook`: reduces float32 / float64 buckets in float16 or bfloat16: half (or a
/// quarter) of the bytes on `direct`, 3/4 (3/8) on the ring, all (half) on halving-doubling and
/// the backends' own collectives, since 16-bit sums accumulate in float32 (docs/ddp.md, header
/// notes: what crosses the wire per algorithm). Follows PyTorch's `fp16_compress_hook` and
/// `bf16_compress_hook` (torch.distributed.algorithms.ddp_comm_hooks.default_hooks): the
/// bucket is cast to the 16-bit type with each value already divided by the number of
/// contributing ranks (dividing first keeps the sum from overflowing float16), the 16-bit
/// buffer is all-reduced with sum, and the result is cast back into the bucket.
/// The manual: docs/ddp.md, "Header notes", `ringzero/ddp/compression_hook.hpp`.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/ddp/allreduce_hook.hpp"
#include "ringzero/ddp/bucket_memory.hpp"
#include "ringzero/ddp/comm_hook.hpp"

namespace ringzero::ddp {

namespace detail {

/// `dst[i] = Wire(src[i] / divisor)`, computed in `Source`'s precision and rounded once.
template <class Wire, class Source>
void compress_divided(Wire* dst, const Source* src, std::uint64_t n, int divisor) noexcept {
  const Source d = static_cast<Source>(divisor);
  for (std::uint64_t i = 0; i < n; ++i) dst[i] = Wire(static_cast<float>(src[i] / d));
}

/// `dst[i] = Source(src[i])` (exact: every 16-bit float is representable in float and double).
template <class Wire, class Source>
void decompress(Source* dst, const Wire* src, std::uint64_t n) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) dst[i] = static_cast<Source>(static_cast<float>(src[i]));
}

}  // namespace detail

/// Compression to float16 or bfloat16 (see the file comment).
/// Memory: one 16-bit scratch buffer per bucket index, in the bucket's memory (host or device),
/// allocated on the first step (and grown once more if the reducer rebuilds its buckets), then
/// reused. Growing device scratch first waits for the stream, so no work in flight uses the
/// old buffer.
/// Thread semantics: one hook object per reducer (it keeps per-bucket scratch).
class compression_hook final : public comm_hook {
 public:
  /// A hook that communicates in `wire` (dtype::float16 or dtype::bfloat16).
  /// Throws errc::invalid_argument for any other dtype.
  explicit compression_hook(dtype wire) : wire_(wire) {
    if (wire != dtype::float16 && wire != dtype::bfloat16)
      throw error(errc::invalid_argument,
                  "compression_hook: wire dtype must be float16 or bfloat16, got " + std::string(dtype_name(wire)));
  }

  /// "fp16_compress" or "bf16_compress".
  std::string name() const override { return wire_ == dtype::float16 ? "fp16_compress" : "bf16_compress"; }

  /// The 16-bit dtype on the wire.
  dtype wire_type() const noexcept { return wire_; }

  /// Casts the bucket (divided by `bucket.divisor`) into this bucket's scratch and issues an
  /// asynchronous sum all_reduce of it.
  work launch(communicator& comm, const gradient_bucket& bucket) override {
    if (!compressible(bucket.type)) return fallback_.launch(comm, bucket);
    const bucket_memory memory = bucket_memory::of(bucket);
    std::uint16_t* wire = scratch(bucket.index, bucket.count, memory);
    if (memory.is_device()) {
      if (bucket.divisor > 1) memory.divide(bucket.data, bucket.data, bucket.count, bucket.type, bucket.divisor);
      memory.cast(wire, wire_, bucket.data, bucket.type, bucket.count);
      return all_reduce_async(comm, wire, wire, bucket.count, wire_, reduce_kind::sum, bucket.options);
    }
    visit_source(bucket.type, [&]<class S>() {
      if (wire_ == dtype::float16)
        detail::compress_divided(reinterpret_cast<float16*>(wire), static_cast<const S*>(bucket.data), bucket.count,
                                 bucket.divisor);
      else
        detail::compress_divided(reinterpret_cast<bfloat16*>(wire), static_cast<const S*>(bucket.data), bucket.count,
                                 bucket.divisor);
    });
    return all_reduce_async(comm, wire, wire, bucket.count, wire_, reduce_kind::sum, bucket.options);
  }

  /// Host and CUDA device memory.
  bool supports(memory_space) const override { return true; }

  /// Casts the reduced 16-bit values back into the bucket.
  void complete(const gradient_bucket& bucket) override {
    if (!compressible(bucket.type)) return fallback_.complete(bucket);
    const auto* wire = static_cast<const std::uint16_t*>(buffers_[bucket.index].data.data());
    const bucket_memory memory = bucket_memory::of(bucket);
    if (memory.is_device()) {
      memory.cast(bucket.data, bucket.type, wire, wire_, bucket.count);
      return;
    }
    visit_source(bucket.type, [&]<class S>() {
      if (wire_ == dtype::float16)
        detail::decompress(static_cast<S*>(bucket.data), reinterpret_cast<const float16*>(wire), bucket.count);
      else
        detail::decompress(static_cast<S*>(bucket.data), reinterpret_cast<const bfloat16*>(wire), bucket.count);
    });
  }

 private:
  struct buffer {
    detail::bucket_storage data;
    std::uint64_t count = 0;
    memory_space space = memory_space::host;
    int device = -1;
  };

  static bool compressible(dtype t) noexcept { return t == dtype::float32 || t == dtype::float64; }

  template <class F>
  static void visit_source(dtype t, F&& f) {
    if (t == dtype::float32)
      f.template operator()<float>();
    else
      f.template operator()<double>();
  }

  /// Bucket `index`'s scratch of at least `count` 16-bit elements in `memory` (allocated and
  /// touched once; replaced when it is too small or in another memory).
  std::uint16_t* scratch(std::size_t index, std::uint64_t count, const bucket_memory& memory) {
    if (buffers_.size() <= index) buffers_.resize(index + 1);
    buffer& b = buffers_[index];
    if (b.count < count || !b.data || b.space != memory.space() || b.device != memory.device()) {
      if (b.data && b.space == memory_space::cuda && memory.is_device() && b.device == memory.device())
        memory.synchronize();  // the old buffer may still be read by work in flight
      b.data.reset();
      b.data = memory.allocate(static_cast<std::size_t>(count) * 2);
      b.count = count;
      b.space = memory.space();
      b.device = memory.device();
    }
    return static_cast<std::uint16_t*>(b.data.data());
  }

  dtype wire_;
  allreduce_hook fallback_;
  std::vector<buffer> buffers_;
};

/// PyTorch's `fp16_compress_hook`: a `compression_hook` communicating in float16.
inline std::shared_ptr<comm_hook> fp16_compress_hook() { return std::make_shared<compression_hook>(dtype::float16); }

/// PyTorch's `bf16_compress_hook`: a `compression_hook` communicating in bfloat16.
inline std::shared_ptr<comm_hook> bf16_compress_hook() { return std::make_shared<compression_hook>(dtype::bfloat16); }

}  // namespace ringzero::ddp
