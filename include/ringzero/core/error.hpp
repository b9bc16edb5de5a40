#pragma once
/// @file
/// The one exception type of ringzero's public edge, `ringzero::error`, derived from
/// `std::system_error`, with its error codes (`errc`) and category.
///
/// Every error names where it happened: the backend, the rank and world size, and, for a
/// collective, its name and sequence number (the n-th collective this communicator issued,
/// counting from 0). The message also names the offending value and, for a cross-rank check,
/// each rank's value. Example:
///   "ringzero [local rank 2/4] all_reduce #0: count mismatch: rank 0: 2560; ranks 1-3: 5120"
/// Nothing is printed; errors are only thrown.

#include <cstdint>
#include <exception>
#include <string>
#include <system_error>
#include <utility>

namespace ringzero {

/// Error codes of `ringzero::error` (category `ringzero::error_category()`).
enum class errc {
  invalid_argument = 1,  ///< a bad argument: null buffer, overflowing count, bad root, dtype, op, overlap
  contract_mismatch,     ///< ranks called different collectives or with different count/dtype/op/root
  timeout,               ///< a collective or transfer waited past the communicator's timeout
  aborted,               ///< the communicator was aborted earlier (by a timeout or a failed rank)
  peer_exited,           ///< a rank left (returned or threw) while others still waited for it
  size_mismatch,         ///< a send and its matching receive disagree on the number of bytes
  unsupported,           ///< the request is valid but this backend or algorithm cannot do it
  no_device,             ///< a CUDA device was required and none is present
  backend_failure,       ///< the underlying library (MPI, NCCL, CUDA) reported an error
  io_error,              ///< reading or writing a file failed
  internal,              ///< an invariant of ringzero itself failed (a bug: please report it)
  replica_mismatch,      ///< replicas that must hold equal state do not (verify_replicas)
};

namespace detail {
class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ringzero"; }
  std::string message(int code) const override {
    switch (static_cast<errc>(code)) {
      case errc::invalid_argument: return "invalid argument";
      case errc::contract_mismatch: return "collective contract mismatch between ranks";
      case errc::timeout: return "timed out";
      case errc::aborted: return "communicator aborted";
      case errc::peer_exited: return "a peer rank exited";
      case errc::size_mismatch: return "send/recv size mismatch";
      case errc::unsupported: return "unsupported";
      case errc::no_device: return "no CUDA device";
      case errc::backend_failure: return "backend failure";
      case errc::io_error: return "I/O error";
      case errc::internal: return "internal error";
      case errc::replica_mismatch: return "replicas differ";
    }
    return "unknown ringzero error";
  }
};
}  // namespace detail

/// The error category of `errc` values (name "ringzero").
inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl category;
  return category;
}

/// Makes a `std::error_code` from an `errc` (found by argument-dependent lookup).
inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

/// Where an error happened. Unknown fields keep their defaults (-1 or empty).
struct error_context {
  std::string backend;         ///< "local", "mpi", "nccl", or empty outside a communicator
  int rank = -1;               ///< the rank that raised the error
  int world_size = -1;         ///< that communicator's world size
  std::string collective;      ///< e.g. "all_reduce", "send"; empty when not in a collective
  std::int64_t sequence = -1;  ///< the collective's sequence number on this communicator
};

/// The exception thrown by every public ringzero call. `code()` is an `errc`; `what()` starts
/// with the context ("ringzero [local rank 1/4] all_reduce #7: ") followed by the message.
/// Copying may throw std::bad_alloc only when the message does not fit in memory.
class error : public std::system_error {
 public:
  /// An error with code `code`, context `context` and a message naming the offending values.
  error(errc code, error_context context, const std::string& message)
      : std::system_error(make_error_code(code), message),
        what_(format(context, message)),
        message_(message),
        context_(std::move(context)) {}
  /// An error outside any communicator.
  error(errc code, const std::string& message) : error(code, error_context{}, message) {}

  /// The full message: context, then what was wrong (without std::system_error's appended
  /// category text, which would repeat the code).
  const char* what() const noexcept override { return what_.c_str(); }

  /// The error code as an `errc`.
  errc kind() const noexcept { return static_cast<errc>(code().value()); }
  /// Where it happened.
  const error_context& context() const noexcept { return context_; }
  /// What was wrong, without the context that `what()` starts with.
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string format(const error_context& c, const std::string& message) {
    std::string s = "ringzero";
    if (!c.backend.empty() || c.rank >= 0) {
      s.append(" [");
      if (!c.backend.empty()) s.append(c.backend).append(" ");
      s.append("rank ").append(std::to_string(c.rank));
      if (c.world_size >= 0) s.append("/").append(std::to_string(c.world_size));
      s.append("]");
    }
    if (!c.collective.empty()) {
      s.append(" ").append(c.collective);
      if (c.sequence >= 0) s.append(" #").append(std::to_string(c.sequence));
    }
    s.append(": ").append(message);
    return s;
  }

  std::string what_;
  std::string message_;
  error_context context_;
};

/// Rethrows `failure` (not null), caught on another thread, on the calling thread: a
/// `ringzero::error` as a copy that this thread owns, any other exception as it is. The copy
/// keeps the object that other threads still reference out of this thread's catch handlers, so
/// the thread that drops the last reference frees an object only it and earlier owners read
/// (std::rethrow_exception throws the shared object itself, whose reference count lives in the
/// C++ runtime, where ThreadSanitizer sees no ordering). May throw std::bad_alloc.
[[noreturn]] inline void rethrow_on_this_thread(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const error& e) { throw error(e); }
}

/// The text a program prints after its own name ("<program>: <text>") for `e`: a ringzero
/// error raised outside any communicator without its "ringzero: " prefix, so that a
/// command-line program names itself once; one that says where it happened (backend, rank,
/// collective) whole; any other exception's what(). Thread-safe; may throw std::bad_alloc.
inline std::string error_text(const std::exception& e) {
  if (const auto* r = dynamic_cast<const error*>(&e)) {
    const error_context& c = r->context();
    const bool located = !c.backend.empty() || c.rank >= 0 || !c.collective.empty();
    if (!located) return r->message();
  }
  return e.what();
}

}  // namespace ringzero

template <>
struct std::is_error_code_enum<ringzero::errc> : std::true_type {};
