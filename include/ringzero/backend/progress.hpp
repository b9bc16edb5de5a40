#pragma once
/// @file
/// Asynchronous execution for host communicators: `work` (a handle to wait on) and the
/// per-communicator `progress_engine`, one background thread that runs submitted operations in
/// submission order.
///
/// Ordering: operations on one communicator complete in the order they were issued, async or
/// not (a blocking call issued while async work is pending is queued behind it). This is the
/// host analogue of issuing NCCL calls on one CUDA stream.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#if defined(__linux__)
#include <sched.h>
#include <unistd.h>
#endif

#include "ringzero/core/error.hpp"
#include "ringzero/core/wait.hpp"

namespace ringzero {

namespace detail {

/// Completion state shared by a `work` handle and the engine that runs the operation.
struct work_state {
  std::atomic<bool> done{false};
  std::exception_ptr failure;                           ///< written before `done` is set
  std::chrono::steady_clock::time_point finished_at{};  ///< written before `done` is set
  std::mutex mutex;
  std::condition_variable cv;

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      failure = std::move(e);
      finished_at = std::chrono::steady_clock::now();
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }

  /// Waits for `done`: a short spin (a few microseconds), then yielding the core for up to
  /// ~50 us (the progress thread may share it with the waiter), then blocking.
  void wait() {
    for (int i = 0; i < 64; ++i) {
      if (done.load(std::memory_order_acquire)) return;
      cpu_relax();
    }
    const auto yield_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (std::chrono::steady_clock::now() < yield_until) {
      if (done.load(std::memory_order_acquire)) return;
      std::this_thread::yield();
    }
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done.load(std::memory_order_acquire); });
  }
};

}  // namespace detail

/// A handle to an asynchronous operation (like `c10d::Work` or an MPI request).
/// A default-constructed `work` is empty and already complete. Copies share the same operation.
/// The operation reads and writes the caller's buffers until it has finished, and dropping the
/// handle neither waits nor cancels (as with `c10d::Work`), so the type is [[nodiscard]]: a
/// call whose handle is ignored draws a compiler warning.
/// Thread safety: `wait` and `test` may be called from any thread.
class [[nodiscard("wait() on it before the buffers it reads or writes go away")]] work {
 public:
  work() = default;
  /// Wraps a state created by a progress engine.
  explicit work(std::shared_ptr<detail::work_state> s) noexcept : state_(std::move(s)) {}

  /// Blocks until the operation finished; rethrows its `ringzero::error` if it failed
  /// (every `wait` on a failed operation rethrows the same error).
  void wait() const {
    if (!state_) return;
    state_->wait();
    if (state_->failure) rethrow_on_this_thread(state_->failure);
  }

  /// True when the operation finished (successfully or not); never blocks, never throws.
  bool test() const noexcept { return !state_ || state_->done.load(std::memory_order_acquire); }

  /// When the operation finished (steady clock), for instrumentation such as measuring how much
  /// communication overlapped computation. Meaningful once `test()` is true; a default-constructed
  /// handle returns the clock's epoch.
  std::chrono::steady_clock::time_point completion_time() const noexcept {
    if (!state_ || !state_->done.load(std::memory_order_acquire)) return {};
    return state_->finished_at;
  }

  /// False for a default-constructed handle.
  bool valid() const noexcept { return static_cast<bool>(state_); }

 private:
  std::shared_ptr<detail::work_state> state_;
};

namespace detail {

/// Gives the calling thread the affinity mask of the process's main thread (on Linux; elsewhere
/// nothing). A new thread inherits the affinity of the thread that creates it, and a progress
/// thread is created by its communicator's rank thread: when `local::launch` pins rank r to core r
/// (launch_options::pin_threads, RINGZERO_PIN), the progress thread would be pinned to that same
/// core and could only run its collectives when the rank's computation leaves the core, so
/// asynchronous work (DDP's bucket all_reduce, ZeRO stage 3's prefetched all_gather) would not
/// overlap computation at all. The main thread's mask is what the process was started with
/// (`taskset`, `mpirun --bind-to`, a cpuset), so that restriction is kept. Best effort: failure
/// leaves the inherited mask.
inline void unpin_to_process_affinity() noexcept {
#if defined(__linux__)
  cpu_set_t process;
  CPU_ZERO(&process);
  if (sched_getaffinity(getpid(), sizeof process, &process) != 0 || CPU_COUNT(&process) == 0) return;
  (void)sched_setaffinity(0, sizeof process, &process);
#endif
}

/// One background thread per communicator running tasks in FIFO order. The thread starts on
/// the first submission and may run on any CPU of the process, even when its owning thread is
/// pinned (see unpin_to_process_affinity). The destructor waits for every submitted task, then joins.
/// Thread safety: `submit`, `idle` and `drain` are called by the communicator's owning thread
/// (`submit` also by a stream it drives, zero/execution_stream.hpp, from the thread that enqueues).
class progress_engine {
 public:
  progress_engine() = default;
  progress_engine(const progress_engine&) = delete;
  progress_engine& operator=(const progress_engine&) = delete;
  ~progress_engine() { shutdown(); }

  /// Queues `task`; its exception (if any) is stored in the returned state.
  std::shared_ptr<work_state> submit(std::function<void()> task) {
    auto state = std::make_shared<work_state>();
    pending_.fetch_add(1, std::memory_order_acq_rel);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      queue_.push_back(item{std::move(task), state});
    }
    cv_.notify_one();
    return state;
  }

  /// True when no submitted task is queued or running.
  bool idle() const noexcept { return pending_.load(std::memory_order_acquire) == 0; }

  /// True on this engine's thread, inside one of its tasks (there a collective runs at once:
  /// queueing it behind the running task would wait for itself).
  bool running_here() const noexcept { return current() == this; }

  /// Waits until every submitted task has finished (their errors stay in their `work`).
  void drain() {
    if (idle()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [&] { return idle(); });
  }

  /// Finishes every queued task and stops the thread (idempotent).
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) return;
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  struct item {
    std::function<void()> task;
    std::shared_ptr<work_state> state;
  };

  static const progress_engine*& current() noexcept {
    thread_local const progress_engine* engine = nullptr;
    return engine;
  }

  void run() {
    unpin_to_process_affinity();  // not the owning rank thread's pinned core; see the function
    current() = this;
    for (;;) {
      item next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr failure;
      try {
        next.task();
      } catch (...) { failure = std::current_exception(); }
      next.task = nullptr;
      // Moved: this thread keeps no reference of its own once the waiter can rethrow it (the
      // waiter throws a copy: rethrow_on_this_thread).
      next.state->finish(std::move(failure));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
      idle_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<item> queue_;
  std::thread thread_;
  std::atomic<std::uint64_t> pending_{0};
  bool stop_ = false;
};

}  // namespace detail
}  // namespace ringzero
