#pragma once
/// @file
/// `nccl::communicator`: one rank of an NCCL communicator (`ncclComm_t`) with the CUDA stream its
/// work is ordered on; buffers live in device memory (memory_space::cuda). NCCL's collectives are
/// the algorithm `native` (the cost model's choice); ring and halving_doubling run over
/// ncclSend/ncclRecv with ringzero's CUDA reduce kernels (registered by <ringzero/cuda.cuh>).
/// Stream semantics are NCCL's: a collective returns once enqueued on `stream()`.
/// Errors: a watchdog thread aborts the communicator (ncclCommAbort) when a collective passes
/// `timeout()` or NCCL reports an asynchronous error; later calls fail naming the first failure.
/// RINGZERO_CHECK=1 compares the ranks' descriptors before every collective.
/// Threads: one thread at a time (its owner or its progress thread); each call makes the rank's
/// device current. Requires NCCL and the CUDA runtime; nvcc only for algorithms other than native.
/// Construction: backend/nccl/init.hpp, adopting an ncclComm_t, or `split`. Manual: docs/gpu.md.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ringzero/backend/backend_communicator.hpp"
#include "ringzero/backend/nccl/id_file.hpp"
#include "ringzero/backend/nccl/options.hpp"
#include "ringzero/backend/nccl/types.hpp"
#include "ringzero/backend/nccl/work_events.hpp"
#include "ringzero/backend/protocol/contract_exchange.hpp"
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/backend/protocol/watchdog.hpp"
#include "ringzero/core/wait.hpp"
#include "ringzero/primitive/cudart/device_workspace.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"
#include "ringzero/primitive/cudart/stream.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/fill.hpp"

namespace ringzero::nccl {

/// The id of a new NCCL clique (ncclGetUniqueId). Throws errc::backend_failure.
inline id_bytes generate_id() {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) throw error(errc_of(r), "ncclGetUniqueId failed: " + result_text(r));
  id_bytes id{};
  static_assert(sizeof(uid) == id_size);
  std::memcpy(id.data(), &uid, id_size);
  return id;
}

/// One rank of an NCCL communicator. See the file comment.
class communicator final : public ringzero::detail::backend_communicator {
 public:
  /// Joins the clique `id` as rank `rank` of `world_size` on CUDA device `device`
  /// (ncclCommInitRankConfig); returns once every rank has joined. Throws errc::no_device (no
  /// CUDA device), errc::invalid_argument (bad rank or device), errc::timeout (the other ranks
  /// did not join within the timeout; the communicator is aborted), errc::backend_failure.
  communicator(const id_bytes& id, int rank, int world_size, int device, const options& opts = {})
      : backend_communicator(rank, world_size),
        device_(checked_device(device)),
        options_(opts),
        stream_(opts.stream ? primitive::cudart::stream::borrow(opts.stream)
                            : primitive::cudart::stream::create(device)),
        workspace_(device, stream_.get()) {
    configure();
    primitive::cudart::use_device(device_);
    ncclConfig_t config = make_config();
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), id_size);
    try {
      ncclResult_t r;
      {
        std::lock_guard<std::mutex> lock(api_mutex_);
        r = ncclCommInitRankConfig(&comm_, world_size, uid, rank, &config);
      }
      owned_ = true;
      complete(nullptr, r, "ncclCommInitRankConfig");
    } catch (...) {
      discard();
      throw;
    }
    start_watchdog();
  }

  /// Adopts `comm` (already initialised; in non-blocking mode its initialisation must have
  /// completed). `take_ownership`: destroy it with the communicator (otherwise the caller
  /// does, after this object is gone). Rank, size and device are NCCL's. Throws
  /// errc::backend_failure when NCCL cannot describe it.
  static std::unique_ptr<communicator> adopt(ncclComm_t comm, bool take_ownership, const options& opts = {}) {
    const auto shape = describe_comm(comm);
    return std::unique_ptr<communicator>(new communicator(shape, comm, take_ownership, opts));
  }

  ~communicator() override {
    stop_progress();
    stop_watchdog();
    if (!aborted_.load(std::memory_order_acquire)) {
      try {
        wait_stream(nullptr, "destroy");
      } catch (...) {}
    }
    workspace_.release();
    events_.release();
    if (owned_) destroy_comm();
  }

  backend_kind backend() const noexcept override { return backend_kind::nccl; }
  memory_space space() const noexcept override { return memory_space::cuda; }
  void* cuda_stream() const noexcept override { return static_cast<void*>(stream_.get()); }
  int cuda_device() const noexcept override { return device_; }

  /// The NCCL communicator (invalid once aborted).
  ncclComm_t handle() const noexcept { return comm_; }
  /// The stream collectives are enqueued on.
  cudaStream_t stream() const noexcept { return stream_.get(); }
  /// This rank's CUDA device.
  int device() const noexcept { return device_; }
  /// True once the communicator was aborted (by the watchdog, a failure, or `abort`).
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  /// Why it was aborted (empty when it was not).
  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(state_mutex_);
    return abort_reason_;
  }

  /// ring, halving_doubling (over send/recv) and native.
  bool supports(algorithm a, collective_kind) const noexcept override {
    return a == algorithm::ring || a == algorithm::halving_doubling || a == algorithm::native;
  }
  /// NCCL's collectives beat any schedule built from its send/recv: always native.
  bool prefers_native(collective_kind) const noexcept override { return true; }
  /// Costs for choosing between ring and halving_doubling when native is not wanted: ~10 us
  /// per NCCL group call and kernel, ~20 GB/s per link (a conservative inter-node figure).
  link_model link() const noexcept override {
    link_model m;
    m.alpha_us = 10.0;
    m.beta_us_per_byte = 1.0 / 20e3;
    m.gamma_us_per_byte = 1.0 / 1.5e6;
    return m;
  }

  void* scratch(int slot, std::size_t bytes) override { return workspace_.get(slot, bytes); }
  std::size_t scratch_bytes() const noexcept override { return workspace_.capacity_bytes(); }

  /// Waits for queued asynchronous work, then for the stream, polling NCCL's asynchronous
  /// error; after `timeout()` the communicator is aborted and errc::timeout raised.
  void synchronize() override {
    ringzero::communicator::synchronize();
    wait_stream(nullptr, "synchronize");
  }

  /// Raises the asynchronous error NCCL reported, if any (aborting the communicator first, as
  /// NCCL requires); nothing otherwise.
  void check_async_error() {
    ensure_alive(nullptr);
    const ncclResult_t state = comm_state();
    if (state != ncclSuccess && state != ncclInProgress) fail(nullptr, state, "asynchronous NCCL operation");
  }

  /// Aborts the communicator (ncclCommAbort): pending NCCL work stops, every later call fails
  /// with errc::aborted naming `reason`. Thread-safe, idempotent.
  void abort(const std::string& reason) noexcept override {
    abort_with(errc::aborted, "rank " + std::to_string(rank()) + ": " + reason);
  }

  /// Splits this communicator (ncclCommSplit, collective over all its ranks): ranks passing the
  /// same `color` form a new communicator, ordered by `key` (then by old rank). Returns nullptr
  /// on ranks that pass NCCL_SPLIT_NOCOLOR (-1). The new communicator gets its own stream (or
  /// `opts.stream`). Throws as the constructor.
  std::unique_ptr<communicator> split(int color, int key, const options& opts = {}) {
    ensure_alive(nullptr);
    primitive::cudart::use_device(device_);
    options o = opts;
    ncclConfig_t config = make_config_for(o);
    ncclComm_t child = nullptr;
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(api_mutex_);
      r = ncclCommSplit(comm_, color, key, &child, &config);
    }
    if (r != ncclSuccess && r != ncclInProgress) fail(nullptr, r, "ncclCommSplit");
    if (color == NCCL_SPLIT_NOCOLOR) {
      if (r == ncclInProgress) wait_ready(nullptr, comm_, "ncclCommSplit");
      return nullptr;
    }
    // A non-blocking split may store the new handle only when its asynchronous job ends (seen
    // with the NCCL of CUDA 13 on an H200: ncclCommSplit returned with the handle still null).
    // Wait for the parent to finish the job, then for the handle, within the timeout.
    wait_ready(nullptr, comm_, "ncclCommSplit");
    child = wait_for_handle(nullptr, child, "ncclCommSplit");
    wait_ready(nullptr, child, "ncclCommSplit (new communicator)");
    try {
      return adopt(child, true, o);
    } catch (...) {
      (void)ncclCommAbort(child);
      throw;
    }
  }

  void begin(const collective_descriptor& d) override {
    ensure_alive(&d);
    primitive::cudart::use_device(device_);
    if (check_contract_) {
      exchange_and_check(d);
    } else if (!d.invalid.empty()) {
      raise(&d, d.invalid_code,
            "invalid arguments on this rank: " + d.invalid +
                " (the NCCL backend does not tell the other ranks unless RINGZERO_CHECK=1)");
    }
  }

  void end(const collective_descriptor& d) override { watch(d.kind, d.sequence); }

 protected:
  void backend_sendrecv(const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to, void* recv,
                        std::uint64_t recv_bytes, int from) override {
    ringzero::detail::check_peer(*this, d, to, "send to");
    ringzero::detail::check_peer(*this, d, from, "receive from");
    ensure_alive(&d);
    primitive::cudart::use_device(device_);
    group_send_recv(&d, send, send_bytes, to, recv, recv_bytes, from);
    watch_transfer(d);
  }

  void backend_sendrecv_reduce(const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to,
                               const void* own, void* acc, std::uint64_t bytes, int from,
                               const combine_fn& combine) override {
    ringzero::detail::check_peer(*this, d, to, "send to");
    ringzero::detail::check_peer(*this, d, from, "receive from");
    ensure_alive(&d);
    primitive::cudart::use_device(device_);
    void* staging = nullptr;
    if (from >= 0 && bytes != 0)
      staging = workspace_.get(primitive::cudart::device_workspace::staging_slot, static_cast<std::size_t>(bytes));
    group_send_recv(&d, send, send_bytes, to, staging, from >= 0 ? bytes : 0, from);
    if (staging != nullptr) combine(acc, own, staging, bytes / combine.element_size);
    watch_transfer(d);
  }

 public:
  void run_native(const collective_descriptor& d) override {
    ensure_alive(&d);
    primitive::cudart::use_device(device_);
    const ncclDataType_t t = nccl_type(d.type);
    cudaStream_t s = stream_.get();
    if (world_size() == 1 && is_reduction(d.kind) &&
        (d.op.kind == reduce_kind::avg || d.op.kind == reduce_kind::premul_sum) && one_rank_reduce_is_broken())
      return world_of_one_reduction(d);
    switch (d.kind) {
      case collective_kind::all_reduce:
        return with_op(d, "ncclAllReduce",
                       [&](ncclRedOp_t op) { return ncclAllReduce(d.send, d.recv, d.count, t, op, comm_, s); });
      case collective_kind::reduce_scatter:
        return with_op(d, "ncclReduceScatter",
                       [&](ncclRedOp_t op) { return ncclReduceScatter(d.send, d.recv, d.count, t, op, comm_, s); });
      case collective_kind::reduce:
        return with_op(d, "ncclReduce",
                       [&](ncclRedOp_t op) { return ncclReduce(d.send, d.recv, d.count, t, op, d.root, comm_, s); });
      case collective_kind::all_gather:
        return call(&d, "ncclAllGather", [&] { return ncclAllGather(d.send, d.recv, d.count, t, comm_, s); });
      case collective_kind::broadcast:
        return call(&d, "ncclBroadcast", [&] { return ncclBroadcast(d.send, d.recv, d.count, t, d.root, comm_, s); });
      case collective_kind::all_to_all: return native_all_to_all(d, t);
      case collective_kind::barrier: return native_barrier(&d);
      default: break;
    }
    transport::run_native(d);
  }

 private:
  /// True when the loaded NCCL predates 2.29.7, whose one-rank avg / premul_sum kernel could
  /// skip the tail of the buffer (see the file comment).
  static bool one_rank_reduce_is_broken() noexcept {
    static const bool broken = [] {
      int version = 0;
      return ncclGetVersion(&version) != ncclSuccess || version < NCCL_VERSION(2, 29, 7);
    }();
    return broken;
  }

  /// all_reduce / reduce_scatter / reduce of a world of one with avg or premul_sum, done
  /// without NCCL's one-rank kernel: recv = send / 1 (a copy) or recv = scalar * send.
  void world_of_one_reduction(const collective_descriptor& d) {
    const std::uint64_t bytes = d.count * dtype_size(d.type);
    if (d.op.kind == reduce_kind::avg) {
      if (d.recv != d.send && bytes > 0)
        primitive::cudart::check(
            cudaMemcpyAsync(d.recv, d.send, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, stream_.get()),
            "cudaMemcpyAsync (world of one, avg)");
      return;
    }
    const primitive::device_primitives* k = primitive::registered_device_primitives();
    if (k == nullptr)
      raise(&d, errc::unsupported,
            std::string(collective_name(d.kind)) +
                " with premul_sum on a world of one: the loaded NCCL (before 2.29.7) can leave the "
                "end of the buffer unwritten (NCCL issue #1950); use NCCL 2.29.7 or newer, or "
                "compile <ringzero/cuda.cuh> into the program so that ringzero scales it itself");
    const int e = k->scale(d.recv, d.send, d.count, d.type, d.op.scalar, static_cast<void*>(stream_.get()));
    if (e != 0)
      raise(&d, errc::backend_failure,
            "world of one, premul_sum: the scale kernel failed (CUDA error " + std::to_string(e) + ")");
  }

  struct shape {
    int rank = 0;
    int size = 1;
    int device = 0;
  };

  communicator(const shape& s, ncclComm_t comm, bool owned, const options& opts)
      : backend_communicator(s.rank, s.size),
        device_(s.device),
        options_(opts),
        stream_(opts.stream ? primitive::cudart::stream::borrow(opts.stream)
                            : primitive::cudart::stream::create(s.device)),
        workspace_(s.device, stream_.get()),
        comm_(comm),
        owned_(owned) {
    configure();
    start_watchdog();
  }

  static shape describe_comm(ncclComm_t comm) {
    shape s;
    ncclResult_t r = ncclCommUserRank(comm, &s.rank);
    if (r == ncclSuccess) r = ncclCommCount(comm, &s.size);
    if (r == ncclSuccess) r = ncclCommCuDevice(comm, &s.device);
    if (r != ncclSuccess) throw error(errc_of(r), "cannot describe the NCCL communicator: " + result_text(r, comm));
    return s;
  }

  static int checked_device(int device) {
    primitive::cudart::require_device_index(device, "nccl::communicator");
    return device;
  }

  void configure() {
    if (options_.timeout) set_timeout(*options_.timeout);
    check_contract_ = options_.check_contract ? *options_.check_contract : env_check(false);
  }

  ncclConfig_t make_config_for(const options& o) const {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = o.blocking ? 1 : 0;
    if (!o.name.empty()) config.commName = o.name.c_str();
    return config;
  }
  ncclConfig_t make_config() const { return make_config_for(options_); }

  // ---- failure state ------------------------------------------------------------------

  /// Throws errc::aborted when the communicator was aborted earlier.
  void ensure_alive(const collective_descriptor* op) const {
    if (!aborted_.load(std::memory_order_acquire)) return;
    raise(op, errc::aborted, "the NCCL communicator was aborted earlier: " + abort_reason());
  }

  /// Raises the code of the abort that ended a wait.
  [[noreturn]] void raise_abort(const collective_descriptor* op) const {
    errc code;
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      code = abort_code_;
      reason = abort_reason_;
    }
    raise(op, code, "the NCCL communicator was aborted: " + reason);
  }

  /// Aborts with `code` and `reason` unless already aborted (the first reason wins).
  void abort_with(errc code, const std::string& reason) noexcept {
    std::lock_guard<std::mutex> api(api_mutex_);
    if (aborted_.load(std::memory_order_acquire)) return;
    try {
      std::lock_guard<std::mutex> lock(state_mutex_);
      abort_code_ = code;
      abort_reason_ = reason;
    } catch (...) {}
    // Flag first: waiters stop at once, while ncclCommAbort may take a while (it can wait for
    // device work to drain before freeing memory).
    aborted_.store(true, std::memory_order_release);
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  }

  /// NCCL failed with `r` in `what`: abort (NCCL requires it after an error) and raise.
  [[noreturn]] void fail(const collective_descriptor* op, ncclResult_t r, const std::string& what) {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(api_mutex_);
      text = result_text(r, aborted_.load() ? nullptr : comm_);
    }
    abort_with(errc_of(r), what + " failed: " + text);
    raise(op, errc_of(r), what + " failed: " + text + " (the communicator was aborted)");
  }

  /// NCCL's asynchronous state of `comm_` (ncclSuccess, ncclInProgress or an error).
  ncclResult_t comm_state() {
    std::lock_guard<std::mutex> lock(api_mutex_);
    if (aborted_.load(std::memory_order_acquire)) return ncclSuccess;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    return r == ncclSuccess ? state : r;
  }

  // ---- calling NCCL -------------------------------------------------------------------

  /// Calls `f()` (one NCCL call or group) under the API lock and completes it.
  template <class F>
  void call(const collective_descriptor* op, const char* what, F&& f) {
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(api_mutex_);
      if (aborted_.load(std::memory_order_acquire)) raise_abort(op);
      r = f();
    }
    complete(op, r, what);
  }

  /// Completes a call that returned `r`: polls while NCCL reports it in progress.
  void complete(const collective_descriptor* op, ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) fail(op, r, what);
    wait_ready(op, comm_, what);
  }

  /// Waits until `handle` (written by NCCL, possibly from its own thread) is non-null and
  /// returns it; errc::backend_failure naming `what` if it is still null at the timeout.
  ncclComm_t wait_for_handle(const collective_descriptor* op, ncclComm_t& handle, const char* what) {
    std::atomic_ref<ncclComm_t> slot(handle);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout());
    const status s = ringzero::detail::wait_until([&] { return slot.load(std::memory_order_acquire) != nullptr; },
                                                  [] { return status::ok; }, deadline, false);
    if (s != status::ok)
      raise(op, errc::backend_failure,
            std::string(what) + " completed but gave no communicator within " +
                ringzero::detail::seconds_text(timeout()) + " s");
    return slot.load(std::memory_order_acquire);
  }

  /// Polls `comm`'s state until it is no longer in progress; an error fails, the timeout
  /// aborts (errc::timeout).
  void wait_ready(const collective_descriptor* op, ncclComm_t comm, const char* what) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout());
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r;
      {
        std::lock_guard<std::mutex> lock(api_mutex_);
        if (aborted_.load(std::memory_order_acquire)) raise_abort(op);
        r = ncclCommGetAsyncError(comm, &state);
      }
      if (r != ncclSuccess) fail(op, r, std::string(what) + " (ncclCommGetAsyncError)");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(op, state, what);
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string msg = std::string(what) + " did not complete within " +
                                ringzero::detail::seconds_text(timeout()) +
                                " s (NCCL has no timeout of its own; did every rank call it?)";
        abort_with(errc::timeout, msg);
        raise(op, errc::timeout, msg + "; the communicator was aborted");
      }
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::microseconds(1000)) pause *= 2;
    }
  }

  /// Polls the stream until its work is done (see `synchronize`).
  void wait_stream(const collective_descriptor* op, const char* what) {
    primitive::cudart::use_device(device_);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout());
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      if (aborted_.load(std::memory_order_acquire)) raise_abort(op);
      const cudaError_t e = cudaStreamQuery(stream_.get());
      if (e == cudaSuccess) {
        if (aborted_.load(std::memory_order_acquire)) raise_abort(op);
        const ncclResult_t state = comm_state();
        if (state != ncclSuccess && state != ncclInProgress) fail(op, state, "asynchronous NCCL operation");
        return;
      }
      if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        const std::string msg =
            std::string(what) + ": device work on the NCCL stream failed: " + primitive::cudart::error_text(e);
        abort_with(errc::backend_failure, msg);
        raise(op, errc::backend_failure, msg);
      }
      (void)cudaGetLastError();
      const ncclResult_t state = comm_state();
      if (state != ncclSuccess && state != ncclInProgress) fail(op, state, "asynchronous NCCL operation");
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string msg = std::string(what) + ": the NCCL stream did not finish within " +
                                ringzero::detail::seconds_text(timeout()) +
                                " s (a rank probably never called a collective, or died)";
        abort_with(errc::timeout, msg);
        raise(op, errc::timeout, msg + "; the communicator was aborted");
      }
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::microseconds(1000)) pause *= 2;
    }
  }

  /// One NCCL group of a send and a receive (either may be absent).
  void group_send_recv(const collective_descriptor* op, const void* send, std::uint64_t send_bytes, int to, void* recv,
                       std::uint64_t recv_bytes, int from) {
    if (to < 0 && from < 0) return;
    cudaStream_t s = stream_.get();
    call(op, "ncclSend/ncclRecv", [&] {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      if (to >= 0) first = ncclSend(send, static_cast<std::size_t>(send_bytes), ncclUint8, to, comm_, s);
      if (from >= 0) {
        const ncclResult_t r = ncclRecv(recv, static_cast<std::size_t>(recv_bytes), ncclUint8, from, comm_, s);
        if (first == ncclSuccess) first = r;
      }
      const ncclResult_t end = ncclGroupEnd();
      return first == ncclSuccess ? end : first;
    });
  }

  /// Runs `f(op)` with the NCCL operator of `d`, creating (and destroying) a premul_sum
  /// operator with this rank's scalar in the collective's datatype.
  template <class F>
  void with_op(const collective_descriptor& d, const char* what, F&& f) {
    if (d.op.kind != reduce_kind::premul_sum) {
      const ncclRedOp_t op = nccl_op(d.op.kind);
      return call(&d, what, [&] { return f(op); });
    }
    std::uint64_t scalar = primitive::element_pattern(d.type, d.op.scalar);
    ncclRedOp_t op{};
    call(&d, "ncclRedOpCreatePreMulSum",
         [&] { return ncclRedOpCreatePreMulSum(&op, &scalar, nccl_type(d.type), ncclScalarHostImmediate, comm_); });
    call(&d, what, [&] { return f(op); });
    call(&d, "ncclRedOpDestroy", [&] { return ncclRedOpDestroy(op, comm_); });
  }

  void native_all_to_all(const collective_descriptor& d, ncclDataType_t t) {
    cudaStream_t s = stream_.get();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    call(&d, "ncclAlltoAll", [&] { return ncclAlltoAll(d.send, d.recv, d.count, t, comm_, s); });
#else
    const std::uint64_t block = d.count * dtype_size(d.type);
    call(&d, "ncclSend/ncclRecv (all_to_all)", [&] {
      ncclResult_t first = ncclGroupStart();
      for (int q = 0; q < world_size() && first == ncclSuccess; ++q) {
        first = ncclSend(static_cast<const unsigned char*>(d.send) + q * block, d.count, t, q, comm_, s);
        if (first == ncclSuccess)
          first = ncclRecv(static_cast<unsigned char*>(d.recv) + q * block, d.count, t, q, comm_, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return first == ncclSuccess ? end : first;
    });
#endif
  }

  /// NCCL has no barrier: a one-element all-reduce, then the host waits for the stream (as
  /// PyTorch's barrier does), so every rank returns only once every rank has entered it.
  void native_barrier(const collective_descriptor* op) {
    void* flag = workspace_.get(primitive::cudart::device_workspace::staging_slot, sizeof(std::int32_t));
    cudaStream_t s = stream_.get();
    call(op, "ncclAllReduce (barrier)", [&] { return ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm_, s); });
    wait_stream(op, "barrier");
  }

  // ---- contract check -----------------------------------------------------------------

  /// The check mode's contract exchange (backend/protocol/contract_exchange.hpp) with
  /// ncclAllGather as its byte exchange, through device staging memory.
  void exchange_and_check(const collective_descriptor& d) {
    const int n = world_size();
    auto all_gather = [&](std::vector<ringzero::detail::wire_record>& records) {
      constexpr std::size_t record_bytes = sizeof(ringzero::detail::wire_record);
      auto* dev = static_cast<unsigned char*>(workspace_.get(primitive::cudart::device_workspace::staging_slot,
                                                             record_bytes * static_cast<std::size_t>(n)));
      unsigned char* own = dev + record_bytes * static_cast<std::size_t>(rank());
      cudaStream_t s = stream_.get();
      primitive::cudart::check(
          cudaMemcpyAsync(own, &records[static_cast<std::size_t>(rank())], record_bytes, cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (contract check)");
      call(&d, "ncclAllGather (contract check)",
           [&] { return ncclAllGather(own, dev, record_bytes, ncclUint8, comm_, s); });
      primitive::cudart::check(
          cudaMemcpyAsync(records.data(), dev, record_bytes * records.size(), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (contract check)");
      wait_stream(&d, "contract check");
    };
    const auto verdict = ringzero::detail::exchange_contract(n, rank(), d, 0, records_, decoded_, all_gather);
    if (!verdict) return;
    if (verdict->abort) abort_with(verdict->code, "rank " + std::to_string(rank()) + ": " + verdict->message);
    raise(&d, verdict->code, verdict->message);
  }

  // ---- watchdog -----------------------------------------------------------------------

  /// Starts the watchdog thread (backend/protocol/watchdog.hpp) with `watchdog_step` as its
  /// tick, on this rank's device.
  void start_watchdog() {
    if (!options_.watchdog) return;
    watchdog_.start(options_.watchdog_interval, [this, device_set = false]() mutable {
      if (!device_set) {
        (void)cudaSetDevice(device_);
        device_set = true;
      }
      watchdog_step();
    });
  }

  void stop_watchdog() noexcept { watchdog_.stop(); }

  /// Records an event after collective #`sequence` for the watchdog.
  void watch(collective_kind kind, std::uint64_t sequence) {
    if (!options_.watchdog || aborted_.load(std::memory_order_acquire)) return;
    events_.record(kind, sequence, stream_.get());
  }

  /// Watches a point-to-point transfer issued outside any collective.
  void watch_transfer(const collective_descriptor& d) {
    if (d.kind == collective_kind::send || d.kind == collective_kind::recv) watch(d.kind, 0);
  }

  void watchdog_step() noexcept {
    if (aborted_.load(std::memory_order_acquire)) return;
    try {
      const ncclResult_t state = comm_state();
      if (state != ncclSuccess && state != ncclInProgress) {
        abort_with(errc_of(state), "NCCL reported an asynchronous error: " + result_text(state));
        return;
      }
      if (const auto late = events_.overdue(timeout()))
        abort_with(late->first, "rank " + std::to_string(rank()) + ": " + late->second);
    } catch (...) {}
  }

  // ---- teardown -----------------------------------------------------------------------

  /// Finalises (non-blocking: polled with the timeout) and destroys the communicator.
  void destroy_comm() noexcept {
    if (comm_ == nullptr || aborted_.load(std::memory_order_acquire)) return;
    try {
      ncclResult_t r;
      {
        std::lock_guard<std::mutex> lock(api_mutex_);
        r = ncclCommFinalize(comm_);
      }
      if (r == ncclInProgress)
        wait_ready(nullptr, comm_, "ncclCommFinalize");
      else if (r != ncclSuccess)
        throw error(errc_of(r), "ncclCommFinalize failed");
      std::lock_guard<std::mutex> lock(api_mutex_);
      (void)ncclCommDestroy(comm_);
      comm_ = nullptr;
    } catch (...) { abort_with(errc::aborted, "destroying the communicator failed"); }
  }

  /// Tears down a half-constructed communicator.
  void discard() noexcept {
    stop_watchdog();
    if (comm_ != nullptr && !aborted_.load()) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_.store(true);
  }

  int device_;
  options options_;
  primitive::cudart::stream stream_;
  primitive::cudart::device_workspace workspace_;
  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
  bool check_contract_ = false;
  std::vector<ringzero::detail::wire_record> records_;  ///< check mode: every rank's record
  std::vector<collective_descriptor> decoded_;

  std::mutex api_mutex_;  ///< serialises NCCL calls on comm_ (the watchdog may abort it)
  mutable std::mutex state_mutex_;
  std::atomic<bool> aborted_{false};
  errc abort_code_ = errc::aborted;
  std::string abort_reason_;

  detail::work_events events_;  ///< what the watchdog watches
  ringzero::detail::watchdog watchdog_;
};

}  // namespace ringzero::nccl
