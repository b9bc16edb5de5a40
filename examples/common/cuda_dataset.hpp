#pragma once
/// @file
/// `cuda_dataset`: an image dataset (idx_dataset.hpp) kept in CUDA device memory, so that a
/// GPU trainer assembles each batch with one gather kernel instead of host copies per step.
///
/// Memory: the images as float (count x features) and the labels, uploaded once. Stream
/// semantics: the upload and every gather are enqueued on the stream given; the host vectors
/// may be reused once the constructor returns (pageable memory is staged by the runtime).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda_buffer.hpp"
#include "cuda_mlp_kernels.hpp"
#include "idx_dataset.hpp"

namespace ringzero::examples {

/// A dataset kept in device memory, with a batch assembled by a gather kernel (no host copies
/// per step).
struct cuda_dataset {
  device_array<float> images;         ///< count x features
  device_array<std::uint8_t> labels;  ///< count
  std::size_t count = 0;
  std::size_t features = 0;

  /// Uploads `data` in the order of `stream`.
  cuda_dataset(const image_dataset& data, cudaStream_t stream)
      : images(data.images.size()), labels(data.labels.size()), count(data.count), features(data.features) {
    images.upload(data.images, stream);
    labels.upload(data.labels, stream);
  }

  /// `x` and `y` (device) receive the rows listed by the `rows` device indices at `indices`.
  void gather(const std::uint32_t* indices, int rows, float* x, std::uint8_t* y, cudaStream_t stream) const {
    check_launch(
        cuda_kernels::gather_rows(x, y, images.get(), labels.get(), indices, rows, static_cast<int>(features), stream),
        "gather_rows kernel");
  }
};

}  // namespace ringzero::examples
