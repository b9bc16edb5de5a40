#pragma once
/// @file
/// Reading IDX files (the format of MNIST and Fashion-MNIST: a magic number naming the element
/// type and rank, big-endian dimension sizes, then the data) through zlib, and loading
/// Fashion-MNIST as normalised float images and byte labels.
///
/// Format reference: Y. LeCun et al., "THE MNIST DATABASE of handwritten digits" (the IDX
/// description on its web page). Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) uses the same
/// files: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-*. Debian's
/// `dataset-fashion-mnist` package installs them in /usr/share/datasets/fashion-mnist/.
/// Errors: `ringzero::error` with errc::io_error naming the file and what was wrong.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ringzero/core/error.hpp"

namespace ringzero::examples {

/// An IDX array of unsigned bytes (type code 0x08), the only type the MNIST files use.
struct idx_array {
  std::vector<std::uint32_t> dims;  ///< sizes, outermost first
  std::vector<std::uint8_t> data;   ///< row-major elements
};

/// Reads a gzip-compressed (or plain) IDX file of unsigned bytes. Reads at most `max_items`
/// entries along the first dimension (all when 0). Throws errc::io_error when the file cannot be
/// opened or read, has a bad magic number or another element type, or is shorter than its header says.
inline idx_array read_idx(const std::string& path, std::size_t max_items = 0) {
  // Opened without blocking and checked to be a regular file: a FIFO or device given as --data
  // is refused at once instead of blocking the run.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw error(errc::io_error, "cannot open IDX file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || ::fcntl(fd, F_SETFL, O_RDONLY) != 0) {
    ::close(fd);
    throw error(errc::io_error, "IDX file " + path + " is not a regular file");
  }
  gzFile f = gzdopen(fd, "rb");  // owns fd from here
  if (f == nullptr) {
    ::close(fd);
    throw error(errc::io_error, "cannot open IDX file " + path);
  }
  struct closer {
    gzFile f;
    ~closer() { gzclose(f); }
  } close_on_exit{f};
  auto read_exact = [&](void* dst, std::size_t bytes, const char* what) {
    auto* p = static_cast<unsigned char*>(dst);
    while (bytes > 0) {
      const unsigned chunk = bytes > (1u << 30) ? (1u << 30) : static_cast<unsigned>(bytes);
      const int got = gzread(f, p, chunk);
      if (got <= 0) {
        int code = 0;
        const char* msg = gzerror(f, &code);
        throw error(errc::io_error,
                    path + ": file ends (or fails: " + std::string(msg ? msg : "?") + ") while reading " + what);
      }
      p += got;
      bytes -= static_cast<std::size_t>(got);
    }
  };
  unsigned char magic[4];
  read_exact(magic, 4, "the magic number");
  if (magic[0] != 0 || magic[1] != 0)
    throw error(errc::io_error, path + ": not an IDX file (the magic number must start with two zero bytes)");
  if (magic[2] != 0x08)
    throw error(errc::io_error,
                path + ": IDX element type code " + std::to_string(magic[2]) + " is not unsigned byte (code 8)");
  const int rank = magic[3];
  if (rank < 1 || rank > 4)
    throw error(errc::io_error, path + ": IDX rank " + std::to_string(rank) + " is not in 1..4");
  idx_array a;
  std::size_t total = 1, per_item = 1;
  for (int d = 0; d < rank; ++d) {
    unsigned char b[4];
    read_exact(b, 4, "the dimensions");
    const std::uint32_t size =
        (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
    a.dims.push_back(size);
    if (d > 0) per_item *= size;
  }
  if (max_items != 0 && max_items < a.dims[0]) a.dims[0] = static_cast<std::uint32_t>(max_items);
  total = per_item * a.dims[0];
  a.data.resize(total);
  read_exact(a.data.data(), total, "the data");
  return a;
}

/// A labelled image set held as floats: `count` rows of `features` values, row-major.
struct image_dataset {
  std::size_t count = 0;             ///< number of images
  std::size_t features = 0;          ///< values per image (28 * 28 = 784)
  std::vector<float> images;         ///< count * features normalised values
  std::vector<std::uint8_t> labels;  ///< count labels in [0, classes)
  int classes = 10;                  ///< number of classes

  /// Pointer to image `i`'s first value.
  const float* image(std::size_t i) const noexcept { return images.data() + i * features; }

  /// Copies the images and labels of `indices` into `x` (indices.size() rows of `features`
  /// values, row-major) and `y`: assembling one batch, with no allocation.
  void gather(std::span<const std::uint32_t> indices, float* x, std::uint8_t* y) const noexcept {
    for (std::size_t r = 0; r < indices.size(); ++r) {
      std::memcpy(x + r * features, image(indices[r]), features * sizeof(float));
      y[r] = labels[indices[r]];
    }
  }
};

/// Normalisation applied to pixel values: (x / 255 - mean) / stddev.
struct pixel_normalization {
  float mean = 0.0f;
  float stddev = 1.0f;
};

/// Mean and standard deviation of the pixels (scaled to [0, 1]) of an IDX image array.
inline pixel_normalization pixel_statistics(const idx_array& images) {
  double sum = 0.0, sum_sq = 0.0;
  for (std::uint8_t v : images.data) {
    const double x = v / 255.0;
    sum += x;
    sum_sq += x * x;
  }
  const double n = static_cast<double>(images.data.size());
  pixel_normalization p;
  if (n == 0) return p;
  p.mean = static_cast<float>(sum / n);
  const double var = sum_sq / n - (sum / n) * (sum / n);
  p.stddev = static_cast<float>(var > 0 ? std::sqrt(var) : 1.0);
  return p;
}

/// Builds an `image_dataset` from IDX images and labels with normalisation `norm`.
/// Throws errc::io_error when the counts differ or a label is outside [0, 10).
inline image_dataset make_dataset(const idx_array& images, const idx_array& labels, pixel_normalization norm,
                                  const std::string& what) {
  if (images.dims.size() < 2 || labels.dims.size() != 1)
    throw error(errc::io_error, what + ": expected images of rank >= 2 and labels of rank 1");
  if (images.dims[0] != labels.dims[0])
    throw error(errc::io_error, what + ": " + std::to_string(images.dims[0]) + " images but " +
                                    std::to_string(labels.dims[0]) + " labels");
  image_dataset d;
  d.count = images.dims[0];
  d.features = d.count ? images.data.size() / d.count : 0;
  d.images.resize(images.data.size());
  const float scale = 1.0f / (255.0f * norm.stddev), shift = norm.mean / norm.stddev;
  for (std::size_t i = 0; i < images.data.size(); ++i) d.images[i] = images.data[i] * scale - shift;
  d.labels = labels.data;
  for (std::size_t i = 0; i < d.labels.size(); ++i)
    if (d.labels[i] >= d.classes)
      throw error(errc::io_error, what + ": label " + std::to_string(d.labels[i]) + " of item " + std::to_string(i) +
                                      " is not in [0, 10)");
  return d;
}

/// Fashion-MNIST's training and test sets.
struct fashion_mnist {
  image_dataset train;
  image_dataset test;
  pixel_normalization normalization;  ///< computed on the (possibly truncated) training images
};

/// Default location of the Debian package `dataset-fashion-mnist`.
inline const char* default_fashion_mnist_dir() noexcept { return "/usr/share/datasets/fashion-mnist"; }

/// Loads Fashion-MNIST from `dir` (the four .gz files). `train_limit` / `test_limit` keep only
/// the first images (0: all). Both sets are normalised with the training set's pixel mean and
/// standard deviation. Throws errc::io_error (see `read_idx`).
inline fashion_mnist load_fashion_mnist(const std::string& dir, std::size_t train_limit = 0,
                                        std::size_t test_limit = 0) {
  fashion_mnist f;
  const idx_array train_images = read_idx(dir + "/train-images-idx3-ubyte.gz", train_limit);
  const idx_array train_labels = read_idx(dir + "/train-labels-idx1-ubyte.gz", train_limit);
  const idx_array test_images = read_idx(dir + "/t10k-images-idx3-ubyte.gz", test_limit);
  const idx_array test_labels = read_idx(dir + "/t10k-labels-idx1-ubyte.gz", test_limit);
  f.normalization = pixel_statistics(train_images);
  f.train = make_dataset(train_images, train_labels, f.normalization, dir + " (training set)");
  f.test = make_dataset(test_images, test_labels, f.normalization, dir + " (test set)");
  return f;
}

/// The widths of an MLP for `data`: its features, the `hidden` widths, its classes.
inline std::vector<int> layer_widths(const std::vector<int>& hidden, const fashion_mnist& data) {
  std::vector<int> widths = {static_cast<int>(data.train.features)};
  widths.insert(widths.end(), hidden.begin(), hidden.end());
  widths.push_back(data.train.classes);
  return widths;
}

}  // namespace ringzero::examples
