// No warnings from the headers a GPU trainer includes, compiled with -Werror: by g++ with
// -Wall -Wextra -Wpedantic (tests/meson.build) and, as warning_check.cu, by nvcc with
// `-Werror all-warnings -Xcudafe --display_error_number` (cuda/meson.build). Also checks that
// CUDA's own 16-bit types are taken wherever ringzero's are (spans of __half / __nv_bfloat16).
#include <ringzero/ddp/gradient_reducer.hpp>
#include <ringzero/ringzero.hpp>
#include <ringzero/zero/sharded_model.hpp>
#if RINGZERO_HAS_NCCL
#include <ringzero/backend/nccl.hpp>
#endif
#if defined(__CUDACC__)
#include <ringzero/cuda.cuh>
#endif

#if __has_include(<cuda_bf16.h>) && __has_include(<cuda_fp16.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <span>

static_assert(ringzero::dtype_of<__nv_bfloat16> == ringzero::dtype::bfloat16);
static_assert(ringzero::dtype_of<const __half> == ringzero::dtype::float16);
static_assert(sizeof(__nv_bfloat16) == sizeof(ringzero::bfloat16) && sizeof(__half) == sizeof(ringzero::float16));

/// Spans of CUDA's types where a trainer hands its own memory to ringzero (never called).
void ringzero_warning_check_cuda_types(ringzero::communicator& comm, ringzero::zero::sharded_model& model,
                                       std::span<__nv_bfloat16> weights, std::span<__half> grads) {
  const auto p = ringzero::ddp::reducer_parameter::of(weights, weights, "w");
  (void)p;
  ringzero::all_reduce(comm, grads, ringzero::reduce_kind::sum);
  const std::span<__nv_bfloat16> view = model.parameter<__nv_bfloat16>(0);
  (void)view;
}
#endif
