// The asynchronous host stream (primitive/host_stream.hpp): ordering on one stream, events and
// cross-stream waits with CUDA's semantics, errors, destruction while busy, and the stale read a
// missing event wait produces. Paused streams make every interleaving deterministic.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/primitive/memory_ops.hpp"

using namespace ringzero;
using primitive::host_event;
using primitive::host_stream;
using primitive::host_stream_options;

namespace {

host_stream_options paused() {
  host_stream_options o;
  o.paused = true;
  return o;
}

}  // namespace

TEST_CASE("host_stream runs work later, in order, on its own thread") {
  host_stream s(paused());
  std::vector<int> seen;
  std::thread::id worker;
  for (int i = 0; i < 1000; ++i)
    s.enqueue([&seen, &worker, i] {
      seen.push_back(i);
      worker = std::this_thread::get_id();
    });
  CHECK_FALSE(s.query());  // nothing ran: the stream is paused, enqueue did not run the work
  s.resume();
  s.synchronize();
  CHECK(s.query());
  REQUIRE(seen.size() == 1000);
  for (int i = 0; i < 1000; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
  CHECK(worker != std::this_thread::get_id());
}

TEST_CASE("host_stream: a delay makes enqueued work visibly asynchronous") {
  host_stream_options o;
  o.delay = std::chrono::milliseconds(20);
  host_stream s(o);
  int value = 0;
  s.enqueue([&value] { value = 7; });
  CHECK_FALSE(s.query());
  s.synchronize();
  CHECK(value == 7);
}

TEST_CASE("host_event: query, synchronize, never recorded") {
  host_event never;
  CHECK(never.query());
  never.synchronize();

  host_stream s(paused());
  host_event e;
  int value = 0;
  s.enqueue([&value] { value = 1; });
  s.record(e);
  CHECK_FALSE(e.query());
  CHECK_FALSE(e.query());  // non-blocking, repeatable
  s.resume();
  e.synchronize();
  CHECK(e.query());
  CHECK(value == 1);
}

TEST_CASE("cross-stream waits: a chain of 2 to 4 streams, producer gated") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    std::vector<std::unique_ptr<host_stream>> streams;
    streams.push_back(std::make_unique<host_stream>(paused()));
    for (int i = 1; i < n; ++i) streams.push_back(std::make_unique<host_stream>());
    std::vector<host_event> events(static_cast<std::size_t>(n));
    // buffers[i] is written by stream i: stream 0 fills 1.5, stream i > 0 doubles buffers[i-1].
    const std::uint64_t count = 4099;
    std::vector<std::vector<float>> buffers(static_cast<std::size_t>(n), std::vector<float>(count, -1.0f));
    primitive::enqueue_fill(*streams[0], buffers[0].data(), count, dtype::float32, 1.5);
    streams[0]->record(events[0]);
    for (int i = 1; i < n; ++i) {
      const auto u = static_cast<std::size_t>(i);
      streams[u]->wait_event(events[u - 1]);
      primitive::enqueue_scale(*streams[u], buffers[u].data(), buffers[u - 1].data(), count, dtype::float32, 2.0);
      streams[u]->record(events[u]);
    }
    // Nothing downstream may run while the producer is held.
    for (int i = 1; i < n; ++i) CHECK_FALSE(streams[static_cast<std::size_t>(i)]->query());
    CHECK(buffers.back()[0] == -1.0f);
    streams[0]->resume();
    events.back().synchronize();
    float expected = 1.5f;
    for (int i = 0; i < n; ++i) {
      for (float x : buffers[static_cast<std::size_t>(i)]) REQUIRE(x == expected);
      expected *= 2.0f;
    }
  }
}

TEST_CASE("cross-stream waits: one producer, three consumers") {
  host_stream producer(paused());
  host_stream c1, c2, c3;
  host_event ready;
  std::vector<int> data(64, 0);
  std::vector<int> sums(3, 0);
  producer.enqueue([&data] {
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int>(i);
  });
  producer.record(ready);
  host_stream* consumers[3] = {&c1, &c2, &c3};
  for (int k = 0; k < 3; ++k) {
    consumers[k]->wait_event(ready);
    consumers[k]->enqueue([&data, &sums, k] {
      for (int x : data) sums[static_cast<std::size_t>(k)] += x * (k + 1);
    });
  }
  producer.resume();
  for (host_stream* c : consumers) c->synchronize();
  CHECK(sums[0] == 2016);
  CHECK(sums[1] == 4032);
  CHECK(sums[2] == 6048);
}

TEST_CASE("host_event recorded again moves; a wait keeps the point it saw") {
  host_stream a;
  host_stream b;
  host_event e;
  int first = 0;
  a.enqueue([&first] { first = 1; });
  a.record(e);
  e.synchronize();
  CHECK(e.query());

  b.wait_event(e);  // the first point (already reached)
  a.pause();
  int second = 0;
  a.enqueue([&second] { second = 2; });
  a.record(e);  // moves the event to a point not yet reached
  CHECK_FALSE(e.query());
  int seen_by_b = -1;
  b.enqueue([&seen_by_b, &first] { seen_by_b = first; });
  b.synchronize();  // does not wait for the second record: b's wait was made before it
  CHECK(seen_by_b == 1);

  host_stream c;
  c.wait_event(e);  // the second point
  int seen_by_c = -1;
  c.enqueue([&seen_by_c, &second] { seen_by_c = second; });
  CHECK_FALSE(c.query());
  a.resume();
  c.synchronize();
  CHECK(seen_by_c == 2);
  CHECK(e.query());
}

// What a trainer that forgets an event wait sees: the consumer reads the buffer before the
// producer wrote it. Deterministic: the producer is held until the consumer has finished.
TEST_CASE("a missing event wait reads stale data; the wait fixes it") {
  const std::uint64_t count = 1000;
  SUBCASE("without the wait: stale") {
    host_stream producer(paused());
    host_stream consumer;
    host_event written;
    std::vector<float> shared(count, 0.0f);
    std::vector<float> out(count, -1.0f);
    primitive::enqueue_fill(producer, shared.data(), count, dtype::float32, 42.0);
    producer.record(written);
    // consumer.wait_event(written) forgotten here
    primitive::enqueue_copy(consumer, out.data(), shared.data(), count * sizeof(float));
    consumer.synchronize();
    producer.resume();
    producer.synchronize();
    for (float x : out) REQUIRE(x == 0.0f);  // the stale contents, not 42
    for (float x : shared) REQUIRE(x == 42.0f);
  }
  SUBCASE("with the wait: fresh") {
    host_stream producer(paused());
    host_stream consumer;
    host_event written;
    std::vector<float> shared(count, 0.0f);
    std::vector<float> out(count, -1.0f);
    primitive::enqueue_fill(producer, shared.data(), count, dtype::float32, 42.0);
    producer.record(written);
    consumer.wait_event(written);
    primitive::enqueue_copy(consumer, out.data(), shared.data(), count * sizeof(float));
    CHECK_FALSE(consumer.query());
    producer.resume();
    consumer.synchronize();
    for (float x : out) REQUIRE(x == 42.0f);
  }
}

TEST_CASE("an error on the stream thread surfaces at synchronize with its message, then clears") {
  host_stream s(paused());
  host_event after;
  bool skipped_ran = false;
  s.enqueue([] { throw error(errc::invalid_argument, "task 3 failed: bad shard"); });
  s.enqueue([&skipped_ran] { skipped_ran = true; });
  s.record(after);
  host_stream waiter;
  waiter.wait_event(after);
  bool waiter_ran = false;
  waiter.enqueue([&waiter_ran] { waiter_ran = true; });
  s.resume();
  try {
    s.synchronize();
    FAIL("synchronize did not throw");
  } catch (const error& e) {
    CHECK(e.code() == make_error_code(errc::invalid_argument));
    CHECK(std::string(e.what()).find("task 3 failed: bad shard") != std::string::npos);
  }
  CHECK_FALSE(skipped_ran);  // skipped while the error was pending
  CHECK_THROWS_WITH_AS(after.query(), doctest::Contains("bad shard"), error);
  CHECK_THROWS_WITH_AS(after.synchronize(), doctest::Contains("bad shard"), error);
  // The waiting stream takes the error over and skips its work.
  CHECK_THROWS_WITH_AS(waiter.synchronize(), doctest::Contains("bad shard"), error);
  CHECK_FALSE(waiter_ran);
  // Reported once: both streams run again.
  int value = 0;
  s.enqueue([&value] { value = 5; });
  s.synchronize();
  CHECK(value == 5);
  CHECK(s.query());
  waiter.synchronize();

  // query reports it too, and a non-ringzero exception keeps its type.
  host_event done;
  s.enqueue([] { throw std::runtime_error("plain failure"); });
  s.record(done);
  CHECK_THROWS_WITH_AS(done.synchronize(), "plain failure", std::runtime_error);
  CHECK_THROWS_WITH_AS((void)s.query(), "plain failure", std::runtime_error);
  CHECK(s.query());
}

TEST_CASE("destroying a busy or paused stream drains it") {
  std::atomic<int> ran{0};
  {
    host_stream s(paused());
    for (int i = 0; i < 100; ++i) s.enqueue([&ran] { ran.fetch_add(1, std::memory_order_relaxed); });
  }
  CHECK(ran.load() == 100);
  {
    host_stream_options o;
    o.delay = std::chrono::milliseconds(1);
    host_stream s(o);
    for (int i = 0; i < 20; ++i) s.enqueue([&ran] { ran.fetch_add(1, std::memory_order_relaxed); });
  }
  CHECK(ran.load() == 120);
  {
    host_stream s;
    s.enqueue([] { throw std::runtime_error("never reported"); });
  }  // an unreported error is dropped, not thrown from the destructor
}

TEST_CASE("a host stream on the caller's thread runs each task before enqueue returns; errors reach the caller") {
  host_stream s(primitive::on_caller_thread);
  std::vector<int> seen;
  for (int i = 0; i < 5; ++i) {
    s.enqueue([&seen, i] { seen.push_back(i * 10); });
    REQUIRE(seen.size() == static_cast<std::size_t>(i + 1));  // ran at once, on this thread
  }
  CHECK(seen == std::vector<int>{0, 10, 20, 30, 40});
  CHECK(s.query());
  // A task's exception is thrown by its enqueue and not kept: the next task runs.
  CHECK_THROWS_WITH_AS(s.enqueue([] { throw error(errc::invalid_argument, "bad view"); }),
                       doctest::Contains("bad view"), error);
  s.enqueue([&seen] { seen.push_back(99); });
  CHECK(seen.back() == 99);
  s.synchronize();  // nothing kept to rethrow
  // A wait blocks the caller until the other stream passes the point, and throws its error.
  host_stream producer(paused());
  host_event ready;
  int value = 0;
  producer.enqueue([&value] { value = 3; });
  producer.record(ready);
  std::thread resumer([&producer] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    producer.resume();
  });
  s.wait_event(ready);
  CHECK(value == 3);  // the wait returned only after the producer's task
  resumer.join();
  host_event failed;
  producer.enqueue([] { throw error(errc::timeout, "the gather timed out"); });
  producer.record(failed);
  CHECK_THROWS_WITH_AS(s.wait_event(failed), doctest::Contains("the gather timed out"), error);
  CHECK_THROWS_WITH_AS(producer.synchronize(), doctest::Contains("the gather timed out"), error);
  CHECK_THROWS_AS(s.pause(), error);
  // Its records complete at once; another stream's wait on them does not block.
  host_event mark;
  s.record(mark);
  CHECK(mark.query());
}

TEST_CASE("a host stream driven by an executor runs each task once, in order, on the executor's thread") {
  // The executor: a queue served by one thread (as a communicator's progress engine is).
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> turns;
  bool stop = false;
  std::thread::id executor_thread;
  std::thread executor([&] {
    executor_thread = std::this_thread::get_id();
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return stop || !turns.empty(); });
        if (turns.empty()) return;
        f = std::move(turns.front());
        turns.pop_front();
      }
      f();
    }
  });
  std::vector<int> seen;
  std::atomic<int> elsewhere{0};
  {
    host_stream s(
        [&](std::function<void()> turn) {
          {
            std::lock_guard<std::mutex> lock(m);
            turns.push_back(std::move(turn));
          }
          cv.notify_one();
        },
        paused());
    for (int i = 0; i < 200; ++i)
      s.enqueue([&seen, &elsewhere, &executor_thread, i] {
        seen.push_back(i);
        if (std::this_thread::get_id() != executor_thread) elsewhere.fetch_add(1);
      });
    host_event done;
    s.record(done);
    CHECK_FALSE(done.query());  // paused: nothing ran
    // A paused stream does not hold the executor: its turns return, owed, and other work runs.
    std::atomic<bool> other_ran{false};
    {
      std::lock_guard<std::mutex> lock(m);
      turns.push_back([&other_ran] { other_ran = true; });
    }
    cv.notify_one();
    for (int i = 0; i < 2000 && !other_ran.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(other_ran.load());
    CHECK(seen.empty());
    s.resume();  // hands the owed turns back
    done.synchronize();
    REQUIRE(seen.size() == 200);
    for (int i = 0; i < 200; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
    CHECK(elsewhere.load() == 0);
    // Errors are kept as on a stream with its own thread.
    s.enqueue([] { throw error(errc::invalid_argument, "refused"); });
    bool skipped = true;
    s.enqueue([&skipped] { skipped = false; });
    CHECK_THROWS_WITH_AS(s.synchronize(), doctest::Contains("refused"), error);
    CHECK(skipped);
    for (int i = 0; i < 50; ++i) s.enqueue([&seen] { seen.push_back(-1); });
  }  // the destructor waits for the executor to run every task
  CHECK(seen.size() == 250);
  {
    std::lock_guard<std::mutex> lock(m);
    stop = true;
  }
  cv.notify_one();
  executor.join();
  CHECK_THROWS_AS(host_stream(primitive::host_executor{}, host_stream_options{}), error);
}
