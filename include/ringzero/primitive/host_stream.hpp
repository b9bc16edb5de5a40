#pragma once
/// @file
/// `host_stream` and `host_event`: an asynchronous stream for host memory that orders work the way
/// a CUDA stream does (CUDA Runtime API, "Stream Management" and "Event Management"). Work
/// enqueued on a stream runs later, in order, on the stream's own thread; an event marks a point
/// of a stream; `wait_event` makes later work of another stream run only after that point.
/// It is how the device code paths run without a GPU: a missing event wait reads stale data.
///
/// Errors: the first exception thrown by a task is kept; until it is reported, the stream skips
/// its further tasks (event records still complete, carrying the error, and a stream that waits
/// on such an event takes the error over). The next `synchronize()` or `query()` rethrows the
/// original exception and clears it. Thread safety: every member may be called from any thread.
/// Destruction resumes a paused stream, drains it (runs all queued work) and drops an unreported
/// error. The manual is docs/streams.md.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "ringzero/core/error.hpp"

namespace ringzero::primitive {

namespace detail {

/// What an event shares with the tasks that complete it and the streams that wait on it.
struct host_event_state {
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t recorded = 0;                     ///< generation of the last record (0: never recorded)
  std::uint64_t completed = 0;                    ///< highest generation whose point has been reached
  std::exception_ptr error;                       ///< the recording stream's pending error at that point
  std::chrono::steady_clock::time_point reached;  ///< when `completed` was reached
};

/// The delay before each task from RINGZERO_HOST_STREAM_DELAY_US (microseconds; 0 when unset).
inline std::chrono::microseconds host_stream_delay_from_environment() noexcept {
  const char* text = std::getenv("RINGZERO_HOST_STREAM_DELAY_US");
  if (text == nullptr || *text == '\0') return std::chrono::microseconds{0};
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  return std::chrono::microseconds{(end != nullptr && *end == '\0' && v > 0) ? v : 0};
}

}  // namespace detail

/// A point in a host stream's work (like `cudaEvent_t` without timing). Copies share the event.
/// `query` never blocks; `synchronize` blocks until the point of the last record is reached. An
/// event never recorded counts as complete. Both rethrow the error the stream had at that point.
class host_event {
 public:
  host_event() : state_(std::make_shared<detail::host_event_state>()) {}

  /// True when the work before the last record has completed (or the event was never recorded).
  bool query() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->completed < state_->recorded) return false;
    if (state_->error) rethrow_on_this_thread(state_->error);
    return true;
  }
  /// Blocks the calling thread until the point of the last record is reached.
  void synchronize() const { current_point().synchronize(); }

  /// The point of the last record as of this call, which later records do not move: for a wait
  /// that runs later elsewhere (a CUDA stream's host function, zero/cuda_execution_stream.hpp).
  class point {
   public:
    /// Blocks the calling thread until the point is reached; rethrows the stream's error there.
    void synchronize() const {
      std::unique_lock<std::mutex> lock(state_->mutex);
      state_->changed.wait(lock, [&] { return state_->completed >= target_; });
      if (state_->error) rethrow_on_this_thread(state_->error);
    }

   private:
    friend class host_event;
    point(std::shared_ptr<detail::host_event_state> s, std::uint64_t target) : state_(std::move(s)), target_(target) {}
    std::shared_ptr<detail::host_event_state> state_;
    std::uint64_t target_;
  };
  point current_point() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return point(state_, state_->recorded);
  }

  /// Seconds from the point of `start`'s last record to that of `end`'s (steady clock, taken
  /// when each point was reached; negative when `end`'s came first). Throws
  /// errc::invalid_argument when either was never recorded or its point is not reached yet.
  friend double elapsed_seconds(const host_event& start, const host_event& end) {
    const auto reached = [](const host_event& e, const char* which) {
      std::lock_guard<std::mutex> lock(e.state_->mutex);
      if (e.state_->recorded == 0 || e.state_->completed < e.state_->recorded)
        throw error(errc::invalid_argument, std::string("elapsed_seconds: the ") + which +
                                                " event was never recorded or its point is not reached yet");
      return e.state_->reached;
    };
    const auto a = reached(start, "start"), b = reached(end, "end");
    return std::chrono::duration<double>(b - a).count();
  }

 private:
  friend class host_stream;
  std::shared_ptr<detail::host_event_state> state_;
};

/// (The friend above, declared here for qualified calls.)
double elapsed_seconds(const host_event& start, const host_event& end);

/// Options of a host stream.
struct host_stream_options {
  /// Sleep before each task: makes every ordering mistake show as stale data (default from
  /// RINGZERO_HOST_STREAM_DELAY_US, for running a whole test suite slowed down).
  std::chrono::microseconds delay = detail::host_stream_delay_from_environment();
  /// Start paused: no task runs until `resume()`.
  bool paused = false;
};

/// Hands a host stream's tasks to an in-order executor (for `host_stream(host_executor, ...)`):
/// it must run every function it is given exactly once, in the order given, one at a time, and
/// outlive the stream (a communicator's progress engine: zero/execution_stream.hpp).
using host_executor = std::function<void(std::function<void()>)>;

/// Makes a host stream whose tasks run on the calling thread (`host_stream(on_caller_thread)`).
struct on_caller_thread_t {
  explicit on_caller_thread_t() = default;
};
/// See `on_caller_thread_t`.
inline constexpr on_caller_thread_t on_caller_thread{};

/// An in-order queue of host work (see the file comment), run by one of three drivers: a thread
/// of its own (the default), an executor it hands its tasks to, or the calling thread.
class host_stream {
 public:
  using task = std::function<void()>;

  /// Tasks run on a thread of the stream's own.
  explicit host_stream(host_stream_options options = {}) : options_(options), paused_(options.paused) {
    worker_ = std::thread([this] { run(); });
  }
  /// Tasks run on `executor`'s thread: each enqueue hands it one turn of the stream, which runs
  /// the oldest task. A turn that comes while the stream is paused returns at once, owed:
  /// `resume()` hands the owed turns to the executor again, so a pause never blocks it. An
  /// executor that throws from its call leaves the stream as before the enqueue (the task is
  /// taken back) and the enqueue rethrows. Enqueue from one thread at a time.
  host_stream(host_executor executor, host_stream_options options)
      : options_(options), executor_(std::move(executor)), paused_(options.paused) {
    if (!executor_) throw error(errc::invalid_argument, "host_stream: the executor is empty");
  }
  /// Tasks run on the thread that enqueues them, before the enqueue returns (the host path's
  /// compute stream: the trainer's thread is the stream). A task's exception is thrown by the
  /// call that enqueued it (a wait: the error of the stream waited on) and is not kept; waits
  /// block the caller; `pause` is refused (errc::invalid_argument). Enqueue from one thread at a
  /// time (the tasks run on it).
  explicit host_stream(on_caller_thread_t) : on_caller_(true) { options_.delay = std::chrono::microseconds{0}; }
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  /// Resumes, runs every queued task, then joins the thread (with an executor: waits until the
  /// executor has run every task).
  ~host_stream() {
    std::size_t owed = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      paused_ = false;
      owed = std::exchange(owed_turns_, 0);
    }
    changed_.notify_all();
    hand_over(owed);
    if (worker_.joinable()) {
      worker_.join();
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return completed_ == submitted_; });
  }

  /// Enqueues `work`; it runs after everything enqueued before it on this stream.
  void enqueue(task work) { push(std::move(work), false); }

  /// Records `e` at the current end of this stream (a later record of `e` moves the point).
  void record(host_event& e) {
    std::shared_ptr<detail::host_event_state> s = e.state_;
    std::uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      generation = ++s->recorded;
    }
    push(
        [this, s, generation] {
          // Both locks (stream, then event: the only nesting), so that a thread that sees the event
          // complete also sees the stream's progress, and the reverse.
          {
            std::lock_guard<std::mutex> lock(mutex_);
            std::lock_guard<std::mutex> event_lock(s->mutex);
            if (generation > s->completed) {
              s->completed = generation;
              s->error = error_;
              s->reached = std::chrono::steady_clock::now();
            }
            ++completed_;
            // Under the lock: once the count is seen, a stream driven by an executor may be
            // destroyed (its destructor waits for the count), so nothing of it is touched after.
            changed_.notify_all();
          }
          s->changed.notify_all();
        },
        true, true);
  }

  /// Makes work enqueued on this stream from now on run only after the point of the last
  /// record of `e` made before this call (nothing when `e` was never recorded). Does not block.
  void wait_event(const host_event& e) {
    std::shared_ptr<detail::host_event_state> s = e.state_;
    std::uint64_t target = 0;
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      target = s->recorded;
    }
    if (target == 0) return;
    push(
        [s, target] {
          std::unique_lock<std::mutex> lock(s->mutex);
          s->changed.wait(lock, [&] { return s->completed >= target; });
          if (s->error) rethrow_on_this_thread(s->error);
        },
        true);
  }

  /// True when every task enqueued so far has completed. Never blocks on the work; rethrows
  /// (and clears) the pending error.
  bool query() {
    std::unique_lock<std::mutex> lock(mutex_);
    take_error(lock);
    return completed_ == submitted_;
  }

  /// Blocks until every task enqueued so far has completed; rethrows (and clears) the pending
  /// error. A paused stream is not resumed: synchronizing it blocks until someone resumes it.
  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t target = submitted_;
    changed_.wait(lock, [&] { return completed_ >= target; });
    take_error(lock);
  }

  /// Holds back every task not yet started until `resume()` (a test knob that makes ordering
  /// mistakes deterministic).
  void pause() {
    if (on_caller_)
      throw error(errc::invalid_argument, "host_stream: a stream run on the caller's thread cannot pause");
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = true;
  }
  /// Lets held-back tasks run.
  void resume() {
    std::size_t owed = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      paused_ = false;
      owed = std::exchange(owed_turns_, 0);
    }
    changed_.notify_all();
    hand_over(owed);
  }

 private:
  struct item {
    task work;
    bool always;         ///< runs even while an error is pending (event records and waits)
    bool counts_itself;  ///< increments `completed_` itself (event records)
  };

  void push(task work, bool always, bool counts_itself = false) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(item{std::move(work), always, counts_itself});
      ++submitted_;
    }
    changed_.notify_all();
    if (on_caller_) {
      run_one(true);
    } else if (executor_) {
      try {
        executor_([this] { run_one(false); });
      } catch (...) {  // no turn for the task: take it back (one enqueuing thread: it is the last)
        {
          std::lock_guard<std::mutex> lock(mutex_);
          queue_.pop_back();
          --submitted_;
        }
        changed_.notify_all();
        throw;
      }
    }
  }

  /// Hands `turns` owed turns to the executor again (after a pause).
  void hand_over(std::size_t turns) {
    for (std::size_t i = 0; i < turns; ++i) executor_([this] { run_one(false); });
  }

  /// One turn of a stream without a thread of its own: runs the oldest queued task (after a
  /// pause, on the executor's thread). `throw_at_once`: the caller-thread driver, whose task's
  /// exception goes to the caller instead of being kept.
  void run_one(bool throw_at_once) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (paused_) {  // owed until resume(): the executor goes on with its other work
      ++owed_turns_;
      return;
    }
    item next = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = error_ && !next.always;
    lock.unlock();
    std::exception_ptr failure;
    if (!skip) {
      if (options_.delay.count() > 0) std::this_thread::sleep_for(options_.delay);
      try {
        next.work();
      } catch (...) { failure = std::current_exception(); }
    }
    // A task that counts itself (an event record) has completed; the destructor may already
    // have returned, so this stream is not touched again.
    if (next.counts_itself) return;
    next.work = nullptr;
    lock.lock();
    if (failure && !throw_at_once && !error_) error_ = failure;
    ++completed_;
    changed_.notify_all();  // under the lock, for the same reason
    lock.unlock();
    if (failure && throw_at_once) std::rethrow_exception(failure);
  }

  void take_error(std::unique_lock<std::mutex>& lock) {
    if (!error_) return;
    std::exception_ptr e = std::exchange(error_, nullptr);
    lock.unlock();
    std::rethrow_exception(e);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return (!paused_ && !queue_.empty()) || (stopping_ && queue_.empty()); });
      if (queue_.empty()) return;  // stopping and drained
      item next = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = error_ && !next.always;
      lock.unlock();
      if (!skip) {
        if (options_.delay.count() > 0) std::this_thread::sleep_for(options_.delay);
        try {
          next.work();
        } catch (...) {
          std::lock_guard<std::mutex> error_lock(mutex_);
          if (!error_) error_ = std::current_exception();
        }
      }
      const bool counted = next.counts_itself;
      next.work = nullptr;  // destroy the captures outside the lock
      lock.lock();
      if (!counted) {
        ++completed_;
        changed_.notify_all();
      }
    }
  }

  host_stream_options options_;
  host_executor executor_;      ///< drives the stream when set
  bool on_caller_ = false;      ///< the caller-thread driver
  std::size_t owed_turns_ = 0;  ///< executor turns that came while paused
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<item> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  std::exception_ptr error_;
  bool paused_ = false;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after every other member is initialised
};

}  // namespace ringzero::primitive
