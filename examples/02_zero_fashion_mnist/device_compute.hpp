#pragma once
/// @file
/// Example 02's compute on CUDA (--device cuda), the device twin of host_compute.hpp: the MLP of
/// examples/common/cuda_mlp.hpp (cuBLAS) on the runtime's device views, the datasets in device
/// memory, and the losses summed on the device. Everything runs on the trainer's compute stream,
/// which the runtime's device path is given (zero::device_context over a
/// zero::cuda_execution_stream; docs/zero.md, "The device path"): the runtime orders its
/// collectives on the communicator's stream against it by events. The host waits at epoch
/// boundaries only (the losses), and in step(). Needs RINGZERO_EXAMPLES_HAVE_CUDA.
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda_buffer.hpp"
#include "cuda_dataset.hpp"
#include "cuda_mlp.hpp"
#include "evaluation.hpp"
#include "float_copies.hpp"
#include "idx_dataset.hpp"
#include "mlp.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/cuda_execution_stream.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::examples::zero_example {

/// See the file comment.
class device_compute {
 public:
  /// An MLP of `widths` on `comm`'s CUDA device, the datasets uploaded, for batches of up to
  /// `max_rows` rows (`eval_rows` in evaluation), with the float32 copies its layers compute on
  /// for a bfloat16 runtime, in device memory, converted by kernels on the compute stream
  /// (float_copies.hpp).
  device_compute(communicator& comm, const std::vector<int>& widths, const fashion_mnist& data, int max_rows,
                 int eval_rows, copies_of copies)
      : data_(data),
        stream_(comm.cuda_device()),
        execution_(stream_),
        context_{&execution_, {}},
        shape_(widths, external_storage),
        net_(shape_, external_storage, stream_.get()),
        train_(data.train, stream_.get()),
        test_(data.test, stream_.get()),
        eval_rows_(eval_rows),
        x_(static_cast<std::size_t>(max_rows) * data.train.features),
        y_(static_cast<std::size_t>(max_rows)),
        sums_(4),
        shard_indices_(data.train.count),
        test_indices_(data.test.count) {
    net_.reserve(max_rows);
    std::vector<std::uint32_t> iota(data.test.count);
    std::iota(iota.begin(), iota.end(), std::uint32_t{0});
    test_indices_.upload(iota, stream_.get());
    if (copies != copies_of::nothing) copy_memory_ = device_array<float>(copy_elements(shape_, copies));
    copies_ = copies_in(copy_memory_.get(), shape_, copies, &execution_);
  }

  cuda_mlp& net() noexcept { return net_; }
  const mlp& shape() const noexcept { return shape_; }
  /// The compute stream the runtime keeps its state and orders its work against.
  zero::device_context* device_context() noexcept { return &context_; }
  /// No stream to wait for before a layer: the kernels are enqueued behind the runtime's event waits.
  zero::execution_stream* layer_stream() noexcept { return nullptr; }
  static constexpr bool heap_holds_state = false;
  /// The float32 copies of a bfloat16 runtime (null with float32).
  const float_copies* copies() const noexcept { return copies_.base != nullptr ? &copies_ : nullptr; }
  /// Calls `use` with a copy of `block` (`bytes` of host memory) in device memory aligned to
  /// `alignment` bytes, uploaded on the compute stream; the copy is freed when `use` returns
  /// (which waits for what reads it).
  template <class F>
  void with_parameter_block(const unsigned char* block, std::size_t bytes, std::size_t alignment, F&& use) {
    device_array<unsigned char> on_device(bytes + alignment);  // cudaMalloc aligns to 256 bytes only
    const auto at = reinterpret_cast<std::uintptr_t>(on_device.get());
    unsigned char* aligned = on_device.get() + (alignment - at % alignment) % alignment;
    primitive::cudart::check(cudaMemcpyAsync(aligned, block, bytes, cudaMemcpyHostToDevice, stream_.get()),
                             "cudaMemcpyAsync (the parameter block)");
    use(static_cast<void*>(aligned));
  }

  void begin_epoch(std::span<const std::uint32_t> shard) {
    shard_host_.assign(shard.begin(), shard.end());
    shard_indices_.upload(shard_host_, stream_.get());
    primitive::cudart::check(cudaMemsetAsync(sums_.get(), 0, 4 * sizeof(double), stream_.get()),
                             "cudaMemsetAsync (sums)");
    rows_ = 0;
  }
  void load(std::size_t first, int rows) {
    train_.gather(shard_indices_.get() + first, rows, x_.get(), y_.get(), stream_.get());
  }
  template <class Hooks>
  void forward(int rows, Hooks& hooks) {
    net_.forward(x_.get(), y_.get(), rows, sums_.get(), hooks);
    rows_ += static_cast<std::uint64_t>(rows);
  }
  template <class Hooks>
  void backward(int rows, float grad_scale, Hooks& hooks) {
    net_.backward(
        x_.get(), y_.get(), rows, grad_scale, true, [](std::size_t) {}, hooks);
  }
  std::string progress_text() const { return "enqueued"; }
  double epoch_loss(communicator& comm) {
    return reduced(comm, 0)[0] / (static_cast<double>(rows_) * comm.world_size());
  }
  template <class Hooks>
  evaluation_result evaluate(communicator& comm, Hooks& hooks) {
    // Each rank a contiguous slice, the same number of passes on every rank (evaluation.hpp).
    const std::size_t n = data_.test.count, ranks = static_cast<std::size_t>(comm.world_size());
    const std::size_t begin = n * static_cast<std::size_t>(comm.rank()) / ranks;
    const std::size_t end = n * static_cast<std::size_t>(comm.rank() + 1) / ranks;
    const std::size_t step = static_cast<std::size_t>(eval_rows_);
    const std::size_t passes = ((n + ranks - 1) / ranks + step - 1) / step;
    for (std::size_t pass = 0; pass < passes; ++pass) {
      const std::size_t at = begin + pass * step;
      const int rows = at < end ? static_cast<int>(std::min(step, end - at)) : 0;
      if (rows == 0) {
        for (int l = 0; l < net_.layer_count(); ++l) {
          hooks.before_forward(l);
          hooks.after_forward(l);
        }
        continue;
      }
      test_.gather(test_indices_.get() + at, rows, x_.get(), y_.get(), stream_.get());
      net_.forward(x_.get(), y_.get(), rows, sums_.get() + 2, hooks);
    }
    const std::vector<double> s = reduced(comm, 2);
    evaluation_result e;
    e.count = n;
    e.loss = n ? s[0] / static_cast<double>(n) : 0.0;
    e.accuracy = n ? s[1] / static_cast<double>(n) : 0.0;
    return e;
  }

 private:
  /// sums_[at], sums_[at + 1] added over the ranks, on the host (waits for the compute stream,
  /// then reduces on the communicator's stream), and zeroed for the next use.
  std::vector<double> reduced(communicator& comm, std::size_t at) {
    stream_.synchronize();
    all_reduce(comm, sums_.get() + at, sums_.get() + at, 2, dtype::float64, reduce_kind::sum);
    comm.synchronize();
    std::vector<double> host(2);
    primitive::cudart::check(cudaMemcpy(host.data(), sums_.get() + at, 2 * sizeof(double), cudaMemcpyDeviceToHost),
                             "cudaMemcpy (sums)");
    primitive::cudart::check(cudaMemsetAsync(sums_.get() + at, 0, 2 * sizeof(double), stream_.get()),
                             "cudaMemsetAsync (sums)");
    return host;
  }

  const fashion_mnist& data_;
  primitive::cuda_stream stream_;
  zero::cuda_execution_stream execution_;
  zero::device_context context_;
  mlp shape_;
  cuda_mlp net_;
  cuda_dataset train_;
  cuda_dataset test_;
  int eval_rows_;
  device_array<float> x_;
  device_array<std::uint8_t> y_;
  device_array<double> sums_;  // {train loss, train correct, test loss, test correct}
  device_array<std::uint32_t> shard_indices_;
  device_array<std::uint32_t> test_indices_;
  std::vector<std::uint32_t> shard_host_;
  std::uint64_t rows_ = 0;  // training rows this epoch (this rank)
  device_array<float> copy_memory_;
  float_copies copies_;
};

}  // namespace ringzero::examples::zero_example
