#pragma once
/// @file
/// The kernels of the examples' GPU MLP (cuda_mlp_kernels.hpp has their contracts) written once
/// as ringzero kernel bodies (ringzero/primitive/kernels/grid.hpp), so that the same source runs
/// on a GPU (cuda_mlp_kernels.cu launches them with `cuda_launcher`) and on the host in CI
/// (tests/cuda_on_host, with `host_launcher`). Each launch function returns the launcher's
/// result: 0, or a cudaError_t value.
///
/// Floating point: on a GPU nvcc may contract a * b + c into one FMA here (these kernels train
/// an example, they do not promise bits), so the host and the device agree to rounding only.

#include <cmath>
#include <cstdint>

#include "ringzero/core/config.hpp"
#include "ringzero/primitive/kernels/grid.hpp"

namespace ringzero::examples::mlp_kernels {

namespace pk = primitive::kernels;

/// Threads per block of every MLP kernel.
inline constexpr unsigned threads = 256;

/// Blocks for `count` elements, one per thread, at least 1 and at most 65535 (the kernels
/// stride over the rest).
inline std::uint64_t blocks_for(std::int64_t count) noexcept {
  const std::int64_t b = (count + threads - 1) / threads;
  return static_cast<std::uint64_t>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

/// Calls `f(i)` for every i < total this thread owns: its grid-wide index and every grid-wide
/// stride after it.
template <class Block, class F>
RINGZERO_HOST_DEVICE inline void grid_stride(Block& b, std::int64_t total, F&& f) {
  const auto per_block = static_cast<std::int64_t>(b.block_threads());
  const std::int64_t stride = static_cast<std::int64_t>(b.grid_blocks()) * per_block;
  b.for_each_thread([&](std::uint64_t t) {
    for (std::int64_t i = static_cast<std::int64_t>(b.block_index()) * per_block + static_cast<std::int64_t>(t);
         i < total; i += stride)
      f(i);
  });
}

struct gather_rows_kernel {
  static constexpr const char* kernel_name = "gather_rows_kernel";
  float* x;
  std::uint8_t* y;
  const float* images;
  const std::uint8_t* labels;
  const std::uint32_t* indices;
  int rows, features;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, static_cast<std::int64_t>(rows) * features, [&](std::int64_t i) {
      const std::int64_t r = i / features, c = i % features;
      const std::uint32_t src = indices[r];
      x[i] = images[static_cast<std::int64_t>(src) * features + c];
      if (c == 0) y[r] = labels[src];
    });
  }
};

struct add_bias_kernel {
  static constexpr const char* kernel_name = "add_bias_kernel";
  float* z;
  const float* bias;
  int rows, cols;
  bool relu;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, static_cast<std::int64_t>(rows) * cols, [&](std::int64_t i) {
      const float v = z[i] + bias[i % cols];
      z[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
    });
  }
};

struct softmax_cross_entropy_kernel {
  static constexpr const char* kernel_name = "softmax_cross_entropy_kernel";
  float* z;
  const std::uint8_t* y;
  float* row_loss;
  int* row_correct;
  int rows, classes;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, rows, [&](std::int64_t r) {
      float* row = z + r * classes;
      float m = row[0];
      int best = 0;
      for (int c = 1; c < classes; ++c)
        if (row[c] > m) {
          m = row[c];
          best = c;
        }
      const int label = y[r];
      const float shifted_label = row[label] - m;
      float s = 0.0f;
      for (int c = 0; c < classes; ++c) s += (row[c] = expf(row[c] - m));
      row_loss[r] = logf(s) - shifted_label;
      row_correct[r] = best == label ? 1 : 0;
      const float inv = 1.0f / s;
      for (int c = 0; c < classes; ++c) row[c] *= inv;
    });
  }
};

struct softmax_backward_kernel {
  static constexpr const char* kernel_name = "softmax_backward_kernel";
  float* dz;
  const float* p;
  const std::uint8_t* y;
  int rows, classes;
  float scale;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, static_cast<std::int64_t>(rows) * classes, [&](std::int64_t i) {
      const std::int64_t r = i / classes, c = i % classes;
      dz[i] = scale * p[i] - (c == y[r] ? scale : 0.0f);
    });
  }
};

struct relu_backward_kernel {
  static constexpr const char* kernel_name = "relu_backward_kernel";
  float* d;
  const float* a;
  std::int64_t count;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, count, [&](std::int64_t i) {
      if (!(a[i] > 0.0f)) d[i] = 0.0f;
    });
  }
};

/// One block of `threads`: a fixed summation tree (deterministic).
struct accumulate_metrics_kernel {
  static constexpr const char* kernel_name = "accumulate_metrics_kernel";
  double* sums;
  const float* row_loss;
  const int* row_correct;
  int rows;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    double* loss = b.template shared<double, 2 * threads>();
    double* correct = loss + threads;
    b.for_each_thread([&](std::uint64_t t) {
      double l = 0.0, c = 0.0;
      for (std::int64_t r = static_cast<std::int64_t>(t); r < rows; r += threads) {
        l += row_loss[r];
        c += row_correct[r];
      }
      loss[t] = l;
      correct[t] = c;
    });
    b.sync();
    for (unsigned half = threads / 2; half > 0; half /= 2) {
      b.for_each_thread([&](std::uint64_t t) {
        if (t < half) {
          loss[t] += loss[t + half];
          correct[t] += correct[t + half];
        }
      });
      b.sync();
    }
    b.for_each_thread([&](std::uint64_t t) {
      if (t == 0) {
        sums[0] += loss[0];
        sums[1] += correct[0];
      }
    });
  }
};

struct fill_kernel {
  static constexpr const char* kernel_name = "mlp_fill_kernel";
  float* p;
  float value;
  std::int64_t count;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, count, [&](std::int64_t i) { p[i] = value; });
  }
};

struct sgd_kernel {
  static constexpr const char* kernel_name = "sgd_kernel";
  float* p;
  const float* g;
  float* buf;
  std::int64_t count;
  float lr, momentum, wd;
  bool nesterov;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, count, [&](std::int64_t i) {
      const float grad = g[i] + wd * p[i];
      const float m = momentum * buf[i] + grad;
      buf[i] = m;
      p[i] -= lr * (nesterov ? grad + momentum * m : m);
    });
  }
};

struct adamw_kernel {
  static constexpr const char* kernel_name = "adamw_kernel";
  float* p;
  const float* g;
  float* m;
  float* v;
  std::int64_t count;
  float step, decay, beta1, beta2, eps, bias2_sqrt;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    grid_stride(b, count, [&](std::int64_t i) {
      const float grad = g[i];
      const float mi = beta1 * m[i] + (1.0f - beta1) * grad;
      const float vi = beta2 * v[i] + (1.0f - beta2) * grad * grad;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step * mi / (sqrtf(vi) / bias2_sqrt + eps);
    });
  }
};

// The launches, with the contracts of cuda_mlp_kernels.hpp.

template <class L>
int gather_rows(const L& l, float* x, std::uint8_t* y, const float* images, const std::uint8_t* labels,
                const std::uint32_t* indices, int rows, int features) {
  if (rows <= 0) return pk::launch_success;
  return l.launch(gather_rows_kernel{x, y, images, labels, indices, rows, features},
                  blocks_for(static_cast<std::int64_t>(rows) * features), threads);
}

template <class L>
int add_bias(const L& l, float* z, const float* bias, int rows, int cols, bool relu) {
  if (rows <= 0) return pk::launch_success;
  return l.launch(add_bias_kernel{z, bias, rows, cols, relu}, blocks_for(static_cast<std::int64_t>(rows) * cols),
                  threads);
}

template <class L>
int softmax_cross_entropy(const L& l, float* z, const std::uint8_t* y, float* row_loss, int* row_correct, int rows,
                          int classes) {
  if (rows <= 0) return pk::launch_success;
  return l.launch(softmax_cross_entropy_kernel{z, y, row_loss, row_correct, rows, classes}, blocks_for(rows), threads);
}

template <class L>
int softmax_cross_entropy_backward(const L& l, float* dz, const float* p, const std::uint8_t* y, int rows, int classes,
                                   float scale) {
  if (rows <= 0) return pk::launch_success;
  return l.launch(softmax_backward_kernel{dz, p, y, rows, classes, scale},
                  blocks_for(static_cast<std::int64_t>(rows) * classes), threads);
}

template <class L>
int relu_backward(const L& l, float* d, const float* a, std::int64_t count) {
  if (count <= 0) return pk::launch_success;
  return l.launch(relu_backward_kernel{d, a, count}, blocks_for(count), threads);
}

template <class L>
int accumulate_metrics(const L& l, double* sums, const float* row_loss, const int* row_correct, int rows) {
  if (rows <= 0) return pk::launch_success;
  return l.launch(accumulate_metrics_kernel{sums, row_loss, row_correct, rows}, 1, threads);
}

template <class L>
int fill(const L& l, float* p, float value, std::int64_t count) {
  if (count <= 0) return pk::launch_success;
  return l.launch(fill_kernel{p, value, count}, blocks_for(count), threads);
}

template <class L>
int sgd_update(const L& l, float* p, const float* g, float* buf, std::int64_t count, float lr, float momentum,
               float weight_decay, bool nesterov) {
  if (count <= 0) return pk::launch_success;
  return l.launch(sgd_kernel{p, g, buf, count, lr, momentum, weight_decay, nesterov}, blocks_for(count), threads);
}

template <class L>
int adamw_update(const L& l, float* p, const float* g, float* m, float* v, std::int64_t count, float lr,
                 float weight_decay, float beta1, float beta2, float eps, float bias1, float bias2_sqrt) {
  if (count <= 0) return pk::launch_success;
  return l.launch(adamw_kernel{p, g, m, v, count, lr / bias1, 1.0f - lr * weight_decay, beta1, beta2, eps, bias2_sqrt},
                  blocks_for(count), threads);
}

}  // namespace ringzero::examples::mlp_kernels
