#pragma once
/// @file
/// `comm_hook`: the interface through which a gradient reducer communicates a bucket, so that
/// users can replace plain averaging (compression, other reductions, instrumentation). Follows
/// the idea of PyTorch's DDP communication hooks (`register_comm_hook`): a hook receives a bucket
/// and returns a handle to the asynchronous communication; a second phase turns the
/// communicated data back into averaged gradients (PyTorch's `Future.then`).
///
/// Built-in hooks: `allreduce_hook` (ddp/allreduce_hook.hpp, the default average),
/// `compression_hook` (ddp/compression_hook.hpp, fp16 / bf16 compression) and `powersgd_hook`
/// (ddp/powersgd_hook.hpp, low-rank compression).

#include <string>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/progress.hpp"
#include "ringzero/ddp/gradient_bucket.hpp"

namespace ringzero::ddp {

/// A communication hook. See the file comment.
///
/// Contract (the reducer relies on it to stay deadlock-free):
/// - `launch` is called once per bucket per synchronised step, on every rank, in the same
///   bucket order; it must issue the same collectives (asynchronous ones, `*_async`) on every
///   rank, must not block waiting for peers, and returns the `work` that completes when the
///   bucket's communication has finished (a default `work` when it communicated synchronously).
/// - `complete` is called in `finish()` after that work completed successfully, in bucket
///   order, on every rank (ranks that joined included); it leaves the averaged gradients in
///   `bucket.data` (e.g. decompresses). It may issue further collectives on the communicator
///   given to `launch`, the same on every rank (`powersgd_hook`'s second round does).
/// - Between `launch` and `complete` the hook may keep using `bucket.data` and its own scratch.
/// Thread semantics: both are called on the thread that drives the reducer (the training
/// thread); the collectives they issue run on the communicator's progress thread. A hook
/// object may be shared by reducers only if it is thread-safe; the built-in hooks keep
/// per-bucket scratch and are meant for one reducer.
/// Errors: exceptions propagate out of the reducer call that invoked the hook (`mark_ready`,
/// `finish`, `join`), after the reducer aborted the communicator so that no peer hangs.
/// Device memory: `launch` and `complete` enqueue their work on the bucket's stream and return
/// (the collectives' stream semantics); `complete` must leave the averaged gradients in place
/// in the order of that stream, not necessarily on the device yet.
class comm_hook {
 public:
  virtual ~comm_hook() = default;

  /// A short name ("allreduce", "fp16_compress", ...). Every rank must use hooks of the same
  /// name; the reducer checks it when it is constructed.
  virtual std::string name() const = 0;

  /// Starts the communication of `bucket` on `comm` and returns its handle (see the contract).
  virtual work launch(communicator& comm, const gradient_bucket& bucket) = 0;

  /// Finishes `bucket` after its communication completed. Default: nothing.
  virtual void complete(const gradient_bucket& bucket) { (void)bucket; }

  /// True when the hook can handle buckets in `space`. The reducer asks at construction and
  /// refuses (on every rank) a hook that cannot, instead of handing it device pointers it
  /// would read on the host. Default: host memory only; a hook for CUDA device memory
  /// enqueues its work on `gradient_bucket::cuda_stream` and overrides this.
  virtual bool supports(memory_space space) const { return space == memory_space::host; }
};

}  // namespace ringzero::ddp
