// The gradient reducer on CUDA device memory (ddp/gradient_reducer.hpp with a device
// communicator): 1-4 ranks on ONE GPU with the local backend, the same parameters, gradients,
// bucket limits and algorithm (ring) as the host reducer, must give the host reducer's bytes
// after every step: plain average, bucket views, fp16 and bf16 compression, accumulation with
// no_sync, unused parameters, the one rebuild and uneven inputs (join), and the parameters
// broadcast at construction and at the end of join. Gradients are written and read on the
// communicator's stream, as a trainer does. With NCCL: a world of one returns the gradients
// bit for bit, and on two GPUs (when there are) exact inputs give the exact average.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/ringzero.hpp"
#if RINGZERO_HAS_NCCL
#include "ringzero/backend/nccl.hpp"
#endif

using namespace ringzero;
using namespace ringzero::ddp;

namespace {

// Parameters of mixed sizes and dtypes; with 256-byte limits they form several buckets.
const std::vector<std::uint64_t> kCounts = {40, 7, 0, 33, 64, 5, 19, 100, 3000};
const std::vector<dtype> kTypes = {dtype::float32, dtype::float32, dtype::float32, dtype::float64, dtype::float32,
                                   dtype::float64, dtype::float32, dtype::float32, dtype::float32};

struct config {
  int ranks = 2;
  bool view = false;
  std::string hook = "none";  // none, fp16, bf16
  int accumulate = 1;
  bool find_unused = false;
  bool join = false;
  bool shuffled = false;  // rank-dependent marking order in the first step (drives the rebuild)
  bool exact = false;     // values whose averages are exact in any order (for NCCL's own sums)
};

/// Element k of parameter i's gradient on rank r in step s, micro-step `micro`.
double gradient_value(const config& cfg, int r, std::size_t i, std::size_t k, int s, int micro) {
  if (cfg.exact)
    return static_cast<double>(((r + 1) * 3 + static_cast<int>(i) * 5 + static_cast<int>(k % 7) + s * 2 + micro) % 29) /
           8.0;
  return 0.1 * (r + 1) + 0.013 * static_cast<double>(i) - 0.0007 * static_cast<double>(k % 1000) + 0.37 * s +
         0.011 * micro + (k % 3 == 0 ? 1e3 : 0.0);
}

/// Element k of parameter i's initial value on rank r (the reducer broadcasts rank 0's).
double initial_value(int r, std::size_t i, std::size_t k) {
  return 100.0 * r + static_cast<double>(i * 1000 + k % 997);
}

/// `values` as bytes of dtype `t`.
std::vector<unsigned char> as_bytes(const std::vector<double>& values, dtype t) {
  std::vector<unsigned char> out(values.size() * dtype_size(t));
  for (std::size_t k = 0; k < values.size(); ++k) {
    if (t == dtype::float64)
      std::memcpy(out.data() + 8 * k, &values[k], 8);
    else {
      const float f = static_cast<float>(values[k]);
      std::memcpy(out.data() + 4 * k, &f, 4);
    }
  }
  return out;
}

/// Every rank's gradient bytes after every synchronised step, then its parameter bytes.
using trace = std::vector<std::vector<unsigned char>>;

/// One rank's training loop, on host memory or on device memory ordered on `comm`'s stream.
void rank_body(communicator& comm, const config& cfg, trace& out) {
  const bool device = comm.space() == memory_space::cuda;
  const auto stream = static_cast<cudaStream_t>(comm.cuda_stream());
  const int r = comm.rank();
  const std::size_t n = kCounts.size();
  // The model's memory: host vectors, or device buffers of the communicator's device.
  std::vector<std::vector<unsigned char>> host_values(n), host_grads(n);
  std::vector<std::unique_ptr<gpu_test::device_buffer>> dev_values(n), dev_grads(n);
  std::vector<reducer_parameter> params;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> init(kCounts[i]);
    for (std::size_t k = 0; k < init.size(); ++k) init[k] = initial_value(r, i, k);
    const std::size_t bytes = kCounts[i] * dtype_size(kTypes[i]);
    reducer_parameter p;
    p.count = kCounts[i];
    p.type = kTypes[i];
    p.name = "p" + std::to_string(i);
    if (device) {
      dev_values[i] = std::make_unique<gpu_test::device_buffer>(bytes);
      dev_grads[i] = std::make_unique<gpu_test::device_buffer>(bytes);
      if (bytes) dev_values[i]->upload(as_bytes(init, kTypes[i]));
      p.data = dev_values[i]->get();
      p.grad = dev_grads[i]->get();
    } else {
      host_values[i] = as_bytes(init, kTypes[i]);
      host_grads[i].assign(bytes + 1, 0);
      p.data = host_values[i].data();
      p.grad = host_grads[i].data();
    }
    params.push_back(p);
  }
  // Writes and reads in stream order (cudaMemcpyAsync on the communicator's stream).
  auto put = [&](void* dst, const std::vector<unsigned char>& src) {
    if (src.empty()) return;
    if (!device)
      std::memcpy(dst, src.data(), src.size());
    else
      primitive::cudart::check(cudaMemcpyAsync(dst, src.data(), src.size(), cudaMemcpyDefault, stream),
                               "cudaMemcpyAsync (gradient)");
  };
  auto get = [&](const void* src, std::size_t bytes) {
    std::vector<unsigned char> v(bytes);
    if (bytes == 0) return v;
    if (!device)
      std::memcpy(v.data(), src, bytes);
    else {
      primitive::cudart::check(cudaMemcpyAsync(v.data(), src, bytes, cudaMemcpyDefault, stream),
                               "cudaMemcpyAsync (read back)");
      comm.synchronize();
    }
    return v;
  };

  reducer_options opt;
  opt.bucket_byte_limits = {256};
  opt.gradient_as_bucket_view = cfg.view;
  opt.find_unused_parameters = cfg.find_unused;
  opt.join = cfg.join;
  if (cfg.hook == "fp16") opt.hook = fp16_compress_hook();
  if (cfg.hook == "bf16") opt.hook = bf16_compress_hook();
  gradient_reducer red(comm, params, opt);
  const int steps = cfg.join ? 3 + r % 3 : 4;   // uneven inputs in join mode
  std::vector<std::vector<double>> written(n);  // what this rank wrote (no_sync leaves it)
  for (int s = 0; s < steps; ++s) {
    for (int micro = 0; micro < cfg.accumulate; ++micro) {
      red.set_require_gradient_sync(micro + 1 == cfg.accumulate);
      std::vector<std::size_t> order(n);
      for (std::size_t j = 0; j < n; ++j) order[j] = n - 1 - j;
      if (cfg.shuffled && s == 0) std::rotate(order.begin(), order.begin() + (r + 1) % 4, order.end());
      for (std::size_t i : order) {
        if (cfg.find_unused && i == 4 && s % 2 == 1) continue;  // parameter 4 unused in odd steps
        written[i].resize(kCounts[i]);
        for (std::size_t k = 0; k < kCounts[i]; ++k) {
          // Rounded to the parameter's dtype as the host's write would be, then accumulated.
          double v = gradient_value(cfg, r, i, k, s, micro);
          if (micro > 0) v += written[i][k];
          written[i][k] = kTypes[i] == dtype::float64 ? v : static_cast<double>(static_cast<float>(v));
        }
        put(red.gradient(i), as_bytes(written[i], kTypes[i]));
        red.mark_ready(i);
      }
      red.finish();
    }
    std::vector<unsigned char> grads;
    for (std::size_t i = 0; i < n; ++i) {
      const auto g = get(red.gradient(i), kCounts[i] * dtype_size(kTypes[i]));
      grads.insert(grads.end(), g.begin(), g.end());
    }
    out.push_back(std::move(grads));
  }
  if (cfg.join) red.join();
  std::vector<unsigned char> values;
  for (std::size_t i = 0; i < n; ++i) {
    const auto v = get(params[i].data, kCounts[i] * dtype_size(kTypes[i]));
    values.insert(values.end(), v.begin(), v.end());
  }
  out.push_back(std::move(values));
}

std::vector<trace> run_host(const config& cfg) {
  std::vector<trace> traces(static_cast<std::size_t>(cfg.ranks));
  local::launch(cfg.ranks, [&](communicator& comm) {
    comm.set_forced_algorithm(algorithm::ring);
    rank_body(comm, cfg, traces[static_cast<std::size_t>(comm.rank())]);
  });
  return traces;
}

std::vector<trace> run_local_cuda(const config& cfg) {
  std::vector<trace> traces(static_cast<std::size_t>(cfg.ranks));
  local::cuda_launch_options o;
  o.devices = {0};  // every rank on one GPU
  local::launch_cuda(
      cfg.ranks,
      [&](local::cuda_communicator& comm) {
        comm.set_forced_algorithm(algorithm::ring);
        rank_body(comm, cfg, traces[static_cast<std::size_t>(comm.rank())]);
      },
      o);
  return traces;
}

void check_same(const std::vector<trace>& want, const std::vector<trace>& got) {
  REQUIRE(want.size() == got.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    REQUIRE(want[r].size() == got[r].size());
    for (std::size_t s = 0; s < want[r].size(); ++s) {
      CAPTURE(r);
      CAPTURE(s);
      REQUIRE(want[r][s].size() == got[r][s].size());
      const long long at = gpu_test::first_difference(dtype::uint8, got[r][s], want[r][s], false);
      CHECK_MESSAGE(at == -1, "first differing byte " << at << " (step " << s << "; the last entry is the parameters)");
    }
  }
}

}  // namespace

TEST_CASE("device reducer == host reducer, bit for bit, on 1-4 ranks of one GPU") {
  std::vector<config> configs;
  for (int n : {1, 2, 3, 4})
    for (bool view : {false, true})
      for (const char* hook : {"none", "fp16", "bf16"}) {
        config c;
        c.ranks = n;
        c.view = view;
        c.hook = hook;
        configs.push_back(c);
      }
  {
    config c;
    c.ranks = 3;
    c.accumulate = 3;
    configs.push_back(c);
    c.view = true;
    c.hook = "bf16";
    configs.push_back(c);
  }
  {
    config c;
    c.ranks = 3;
    c.find_unused = true;
    configs.push_back(c);
  }
  {
    config c;
    c.ranks = 4;
    c.shuffled = true;
    configs.push_back(c);
    c.view = true;
    configs.push_back(c);
  }
  for (const char* hook : {"none", "fp16"})
    for (bool view : {false, true}) {
      config c;
      c.ranks = 3;
      c.join = true;
      c.hook = hook;
      c.view = view;
      configs.push_back(c);
    }
  for (const config& c : configs) {
    CAPTURE(c.ranks);
    CAPTURE(c.view);
    CAPTURE(c.hook);
    CAPTURE(c.accumulate);
    CAPTURE(c.find_unused);
    CAPTURE(c.join);
    CAPTURE(c.shuffled);
    check_same(run_host(c), run_local_cuda(c));
  }
}

#if RINGZERO_HAS_NCCL
TEST_CASE("device reducer on NCCL: a world of one keeps the gradients bit for bit; two GPUs average exactly") {
  for (bool view : {false, true})
    for (const char* hook : {"none", "bf16"}) {
      config c;
      c.ranks = 1;
      c.view = view;
      c.hook = hook;
      CAPTURE(view);
      CAPTURE(hook);
      std::vector<trace> got(1);
      nccl::launch({0}, [&](nccl::communicator& comm) { rank_body(comm, c, got[0]); });
      check_same(run_host(c), got);
    }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    MESSAGE("one GPU: the two-rank NCCL check is skipped");
    return;
  }
  for (bool view : {false, true}) {
    config c;
    c.ranks = 2;
    c.view = view;
    c.exact = true;  // NCCL sums in its own order and pre-divides: exact inputs make that irrelevant
    CAPTURE(view);
    std::vector<trace> got(2);
    nccl::launch({0, 1},
                 [&](nccl::communicator& comm) { rank_body(comm, c, got[static_cast<std::size_t>(comm.rank())]); });
    check_same(run_host(c), got);
  }
}
#endif

TEST_CASE("device reducer: a failing rank fails its peers promptly instead of hanging") {
  local::cuda_launch_options o;
  o.devices = {0};
  o.timeout = std::chrono::duration<double>(20.0);
  std::vector<std::string> errors(3);
  try {
    local::launch_cuda(
        3,
        [&](local::cuda_communicator& comm) {
          try {
            auto values = std::make_unique<gpu_test::device_buffer>(400);
            auto grads = std::make_unique<gpu_test::device_buffer>(400);
            std::vector<reducer_parameter> params;
            for (int i = 0; i < 4; ++i) {
              reducer_parameter p;
              p.data = values->get() + 100 * i;
              p.grad = grads->get() + 100 * i;
              p.count = 25;
              params.push_back(p);
            }
            reducer_options opt;
            opt.bucket_byte_limits = {100};
            gradient_reducer red(comm, params, opt);
            for (std::size_t i = 4; i-- > 0;)
              if (comm.rank() != 1 || i != 0) red.mark_ready(i);  // rank 1 never marks gradient 0
            red.finish();
          } catch (const std::exception& e) {
            errors[static_cast<std::size_t>(comm.rank())] = e.what();
            throw;
          }
        },
        o);
    FAIL("no error");
  } catch (const error&) {}
  CHECK(errors[1].find("never marked ready") != std::string::npos);
  for (auto& e : errors) CHECK_FALSE(e.empty());
}
