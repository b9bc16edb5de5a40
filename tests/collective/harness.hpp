#pragma once
// Helpers of the collective tests outside the sweep: run a local world and keep what each rank
// saw (values, or the error it raised), then check it with doctest on the main thread (doctest's
// assertions are not made from the rank threads).

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

#include "ringzero/ringzero.hpp"

namespace rzt {

/// The algorithms every case runs on.
inline constexpr ringzero::algorithm every_algorithm[] = {ringzero::algorithm::ring, ringzero::algorithm::direct,
                                                          ringzero::algorithm::halving_doubling};

/// `collective_options` asking for `a`.
inline ringzero::collective_options with_algo(ringzero::algorithm a) {
  ringzero::collective_options o;
  o.algo = a;
  return o;
}

/// How one rank's call ended.
struct outcome {
  bool threw = false;        ///< the call threw
  bool is_ringzero = false;  ///< ... a ringzero::error
  ringzero::errc code{};     ///< its code
  std::string message;       ///< its what()

  /// Runs `f`, recording how it ended.
  template <class F>
  void capture(F&& f) {
    try {
      f();
    } catch (const ringzero::error& e) {
      threw = true;
      is_ringzero = true;
      code = e.kind();
      message = e.what();
    } catch (const std::exception& e) {
      threw = true;
      message = e.what();
    }
  }
};

/// `local::launch_options` with a timeout of `seconds`.
inline ringzero::local::launch_options timeout_after(double seconds) {
  ringzero::local::launch_options o;
  o.timeout = std::chrono::duration<double>(seconds);
  return o;
}

/// Runs `fn(comm)` on `world` ranks; returns what `launch` threw ("" when nothing). The default
/// timeout is short: a test that expects no waiting must not hang.
template <class F>
std::string launch_world(int world, F&& fn, double timeout_seconds = 30.0) {
  try {
    ringzero::local::launch(world, fn, timeout_after(timeout_seconds));
  } catch (const std::exception& e) { return e.what(); }
  return {};
}

/// True when `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Checks that rank r's outcome is a ringzero::error with `code` whose message names the rank
/// ("rank r/") and contains every string of `parts`.
inline void check_error(const outcome& o, int r, ringzero::errc code, std::initializer_list<std::string> parts) {
  INFO("rank " << r << ": " << o.message);
  CHECK(o.threw);
  CHECK(o.is_ringzero);
  CHECK(o.code == code);
  CHECK(contains(o.message, "rank " + std::to_string(r) + "/"));
  for (const auto& p : parts) CHECK_MESSAGE(contains(o.message, p), "missing \"" << p << "\"");
}

/// `check_error` on every rank.
inline void check_every_rank(const std::vector<outcome>& o, ringzero::errc code,
                             std::initializer_list<std::string> parts) {
  for (int r = 0; r < static_cast<int>(o.size()); ++r) check_error(o[static_cast<std::size_t>(r)], r, code, parts);
}

/// Sets an environment variable for the lifetime of the object, then restores its previous
/// value or removes it (tests run one at a time and launch joins its threads, so nothing reads
/// the environment concurrently).
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    ::setenv(name, value, 1);
  }
  ~scoped_env() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace rzt
