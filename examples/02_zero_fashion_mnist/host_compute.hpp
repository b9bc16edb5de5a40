#pragma once
/// @file
/// Example 02's compute on the host: the MLP of examples/common/mlp.hpp (Eigen) without storage
/// of its own, computing on the runtime's parameter and gradient views, and its batches,
/// losses and evaluation. The trainer's loop calls `load`, `forward`, `backward` (through the
/// runtime's layer hooks) and, per epoch, `epoch_loss` and `evaluate`; device_compute.hpp is
/// the same on CUDA. Threads: one object per rank.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "evaluation.hpp"
#include "float_copies.hpp"
#include "idx_dataset.hpp"
#include "mlp.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::examples::zero_example {

/// See the file comment.
class host_compute {
 public:
  /// An MLP of `widths` on `data`, for batches of up to `max_rows` rows (`eval_rows` in
  /// evaluation), with the float32 copies its layers compute on for a bfloat16 runtime
  /// (float_copies.hpp).
  host_compute(const std::vector<int>& widths, const fashion_mnist& data, int max_rows, int eval_rows, copies_of copies)
      : data_(data), net_(widths, external_storage), eval_rows_(eval_rows) {
    net_.reserve(max_rows);
    x_.resize(static_cast<std::size_t>(max_rows) * data.train.features);
    y_.resize(static_cast<std::size_t>(max_rows));
    copy_memory_.resize(copy_elements(net_, copies));
    copies_ = copies_in(copy_memory_.data(), net_, copies, nullptr);
  }

  /// The model (its layout names the tensors; its storage is the runtime's).
  mlp& net() noexcept { return net_; }
  /// The layout of the MLP (for the plan and the initial values).
  const mlp& shape() const noexcept { return net_; }
  /// None: the runtime keeps its state in host memory.
  zero::device_context* device_context() noexcept { return nullptr; }
  /// No stream to wait for before a layer: the runtime's host path has run its work already.
  zero::execution_stream* layer_stream() noexcept { return nullptr; }
  /// Whether the process heap measures the runtime's memory (it does on the host).
  static constexpr bool heap_holds_state = true;
  /// The float32 copies of a bfloat16 runtime (null with float32), converted on the calling thread.
  const float_copies* copies() const noexcept { return copies_.base != nullptr ? &copies_ : nullptr; }
  /// Calls `use` with `block` (`bytes` of host memory, aligned to `alignment`) where the compute
  /// stream's memory is: host memory, so the block itself.
  template <class F>
  void with_parameter_block(unsigned char* block, std::size_t bytes, std::size_t alignment, F&& use) {
    (void)bytes;
    (void)alignment;
    use(static_cast<void*>(block));
  }

  /// Starts an epoch over `shard` (this rank's sample indices).
  void begin_epoch(std::span<const std::uint32_t> shard) {
    shard_ = shard;
    loss_sum_ = 0;
    micro_batches_ = 0;
  }
  /// The `rows` examples of the shard from `first` on, as the next batch.
  void load(std::size_t first, int rows) {
    data_.train.gather(shard_.subspan(first, static_cast<std::size_t>(rows)), x_.data(), y_.data());
  }
  template <class Hooks>
  void forward(int rows, Hooks& hooks) {
    loss_sum_ += net_.forward(x_.data(), y_.data(), rows, hooks);
    ++micro_batches_;
  }
  /// Backward of the last forward; the gradients are summed into the runtime's (always accumulate).
  template <class Hooks>
  void backward(int rows, float grad_scale, Hooks& hooks) {
    net_.backward(
        x_.data(), y_.data(), rows, grad_scale, true, [](std::size_t) {}, hooks);
  }
  /// The progress bar's text: the epoch's mean loss so far.
  std::string progress_text() const {
    return fmt::format("loss {:.4f}", loss_sum_ / static_cast<double>(micro_batches_));
  }
  /// The epoch's mean training loss over all ranks (a collective).
  double epoch_loss(communicator& comm) {
    double sums[2] = {loss_sum_, static_cast<double>(micro_batches_)};
    all_reduce(comm, sums, sums, 2, dtype::float64, reduce_kind::sum);
    return sums[0] / sums[1];
  }
  /// Test loss and accuracy, each rank a slice of the test set (evaluation.hpp; a collective).
  template <class Hooks>
  evaluation_result evaluate(communicator& comm, Hooks& hooks) {
    return examples::evaluate(comm, net_, data_.test, x_.data(), y_.data(), eval_rows_, hooks);
  }

 protected:
  /// The copies are converted on `s` (--device sim: the compute stream) instead.
  void convert_on(primitive::stream* s) noexcept { copies_.stream = s; }

 private:
  const fashion_mnist& data_;
  mlp net_;
  std::vector<float> copy_memory_;
  float_copies copies_;
  int eval_rows_;
  std::vector<float> x_;
  std::vector<std::uint8_t> y_;
  std::span<const std::uint32_t> shard_;
  double loss_sum_ = 0;
  std::uint64_t micro_batches_ = 0;
};

}  // namespace ringzero::examples::zero_example
