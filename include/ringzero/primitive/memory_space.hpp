#pragma once
/// @file
/// `memory_space` (host, pinned host, CUDA device) and `memory_buffer`, the RAII owner of one
/// allocation in a space. Host memory is 64-byte aligned (`operator new`; more on request); device and pinned
/// memory come from the registered CUDA primitives (primitive/device_primitives.hpp:
/// cudaMalloc, 256-byte aligned, and cudaMallocHost), so this header needs no CUDA header.
/// Sizes are in bytes; contents after allocation are unspecified.
/// Errors: errc::unsupported when device or pinned memory is asked for and no CUDA kernels are
/// registered; errc::backend_failure when the runtime refuses (out of memory included);
/// errc::internal when host memory is exhausted; errc::invalid_argument for a bad alignment.
/// Thread safety: a buffer is owned by one thread at a time; allocation may run on any thread.

#include <cstdint>
#include <new>
#include <string>
#include <utility>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/memory_counter.hpp"
#include "ringzero/primitive/memory_space_kind.hpp"

namespace ringzero::primitive {

/// Alignment of host allocations in bytes (a cache line; enough for every vector width used).
inline constexpr std::size_t host_alignment = 64;

/// One owned allocation: pointer, size in bytes, space and device (-1 outside device memory).
class memory_buffer {
 public:
  memory_buffer() = default;
  memory_buffer(memory_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        space_(other.space_),
        device_(std::exchange(other.device_, -1)),
        alignment_(std::exchange(other.alignment_, host_alignment)),
        counter_(std::exchange(other.counter_, nullptr)),
        free_(std::exchange(other.free_, nullptr)),
        context_(std::exchange(other.context_, nullptr)) {}
  memory_buffer& operator=(memory_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      space_ = other.space_;
      device_ = std::exchange(other.device_, -1);
      alignment_ = std::exchange(other.alignment_, host_alignment);
      counter_ = std::exchange(other.counter_, nullptr);
      free_ = std::exchange(other.free_, nullptr);
      context_ = std::exchange(other.context_, nullptr);
    }
    return *this;
  }
  memory_buffer(const memory_buffer&) = delete;
  memory_buffer& operator=(const memory_buffer&) = delete;
  ~memory_buffer() { release(); }

  /// Allocates `bytes` bytes in `space` (on CUDA device `device` for memory_space::device; the
  /// device is then current on the calling thread). Zero bytes give a null buffer. Host memory
  /// is aligned to `host_align` bytes (a power of two, at least `host_alignment`; page-aligned
  /// memory for O_DIRECT reads asks for 4096); the other spaces ignore it. With a `counter`,
  /// the allocation is added to it and taken off when the buffer frees it (primitive/memory_counter.hpp).
  static memory_buffer allocate(memory_space space, std::size_t bytes, int device = -1,
                                std::size_t host_align = host_alignment, memory_counter* counter = nullptr) {
    memory_buffer b;
    b.space_ = space;
    if (bytes == 0) return b;
    switch (space) {
      case memory_space::host: {
        if (host_align < host_alignment || (host_align & (host_align - 1)) != 0)
          throw error(errc::invalid_argument, "memory_buffer::allocate: host alignment " + std::to_string(host_align) +
                                                  " is not a power of two >= " + std::to_string(host_alignment));
        b.data_ = ::operator new (bytes, std::align_val_t{host_align}, std::nothrow);
        if (b.data_ == nullptr)
          throw error(errc::internal, "memory_buffer::allocate: " + std::to_string(bytes) +
                                          " bytes of host memory failed: out of memory");
        b.alignment_ = host_align;
        break;
      }
      case memory_space::pinned_host: {
        const device_primitives& p = require_device_primitives();
        check(p, p.allocate_pinned != nullptr ? p.allocate_pinned(&b.data_, bytes) : -1, space, bytes);
        break;
      }
      case memory_space::device: {
        const device_primitives& p = require_device_primitives();
        if (device < 0)
          throw error(errc::invalid_argument, "memory_buffer::allocate: device memory needs a device index >= 0");
        check(p, p.set_device(device), space, bytes);
        check(p, p.allocate(&b.data_, bytes), space, bytes);
        b.device_ = device;
        break;
      }
    }
    b.bytes_ = bytes;
    if (counter != nullptr) {
      counter->add(space, bytes);
      b.counter_ = counter;
    }
    return b;
  }

  /// How `adopt`ed memory is given back: `free(context, data, bytes, space)`; must not throw.
  using free_function = void (*)(void* context, void* data, std::size_t bytes, memory_space space) noexcept;

  /// Memory someone else allocated (`bytes` at `data` in `space`, on CUDA device `device` for
  /// device memory, else -1), given back through `free(context, ...)` when this buffer releases
  /// it. Counted in `counter` as `allocate` counts. Throws errc::invalid_argument for a null
  /// `data` with `bytes` > 0 or a null `free`.
  static memory_buffer adopt(void* data, std::size_t bytes, memory_space space, int device, free_function free,
                             void* context, memory_counter* counter = nullptr) {
    if ((data == nullptr && bytes > 0) || free == nullptr)
      throw error(errc::invalid_argument, "memory_buffer::adopt: a null pointer or free function");
    memory_buffer b;
    b.space_ = space;
    if (bytes == 0) {  // nothing to hold: given back at once
      if (data != nullptr) free(context, data, 0, space);
      return b;
    }
    b.data_ = data;
    b.bytes_ = bytes;
    b.device_ = space == memory_space::device ? device : -1;
    b.free_ = free;
    b.context_ = context;
    if (counter != nullptr) {
      counter->add(space, bytes);
      b.counter_ = counter;
    }
    return b;
  }

  void* data() const noexcept { return data_; }
  /// True when the buffer holds memory.
  explicit operator bool() const noexcept { return data_ != nullptr; }
  /// Frees the memory now (device memory: cudaFree, which waits for the device); the buffer is
  /// then empty.
  void reset() noexcept { release(); }
  std::size_t size_bytes() const noexcept { return bytes_; }
  memory_space space() const noexcept { return space_; }
  /// The CUDA device of device memory, -1 otherwise.
  int device() const noexcept { return device_; }

 private:
  static void check(const device_primitives& p, int code, memory_space space, std::size_t bytes) {
    if (code == 0) return;
    const std::string why = code < 0 ? std::string("this program's CUDA table has no pinned allocation")
                                     : std::string(p.error_name(code)) + ": " + p.error_string(code);
    throw error(errc::backend_failure, std::string("memory_buffer::allocate: ") + std::to_string(bytes) + " bytes of " +
                                           to_string(space) + " memory failed: " + why);
  }

  void release() noexcept {
    if (data_ == nullptr) return;
    if (counter_ != nullptr) std::exchange(counter_, nullptr)->remove(space_, bytes_);
    if (free_ != nullptr) {  // adopted: its owner's function gives it back
      std::exchange(free_, nullptr)(std::exchange(context_, nullptr), data_, bytes_, space_);
      data_ = nullptr;
      bytes_ = 0;
      return;
    }
    switch (space_) {
      case memory_space::host: ::operator delete (data_, std::align_val_t{alignment_}); break;
      case memory_space::pinned_host: {
        const device_primitives* p = registered_device_primitives();
        if (p != nullptr && p->deallocate_pinned != nullptr) (void)p->deallocate_pinned(data_);
        break;
      }
      case memory_space::device: {
        const device_primitives* p = registered_device_primitives();
        if (p != nullptr) {
          (void)p->set_device(device_);
          (void)p->deallocate(data_);
        }
        break;
      }
    }
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  memory_space space_ = memory_space::host;
  int device_ = -1;
  std::size_t alignment_ = host_alignment;  ///< host memory's alignment (for its deallocation)
  memory_counter* counter_ = nullptr;       ///< where the allocation is counted (none: not counted)
  free_function free_ = nullptr;            ///< adopted memory: how it is given back (else null)
  void* context_ = nullptr;                 ///< adopted memory: free_'s context
};

}  // namespace ringzero::primitive
