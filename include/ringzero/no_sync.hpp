#pragma once
/// @file
/// `no_sync_guard`: one scope type for gradient accumulation without communication, returned by
/// `ddp::gradient_reducer::no_sync()`, `zero::sharded_model::no_sync()` and the libtorch bridges
/// built on them (PyTorch DDP's `no_sync()` context; FSDP2's `set_requires_gradient_sync(False)`
/// until the scope ends). Constructing it turns the runtime's gradient synchronisation off
/// (`set_require_gradient_sync(false)`, which may throw what that throws); destroying it restores
/// the mode the runtime had before, without checks and without throwing. Code written against the
/// guard works with either runtime, e.g. a helper taking `auto& runtime` and doing
/// `{ ringzero::no_sync_guard g(runtime); ... }`. Thread semantics: the runtime's (its rank's
/// thread). Movable (the moved-from guard restores nothing), not copyable. Manual: docs/ddp.md
/// (the reducer) and docs/zero.md, "Accumulation without traffic".

#include <type_traits>
#include <utility>

namespace ringzero {

/// See the file comment. `Runtime` has `require_gradient_sync()`, `set_require_gradient_sync(bool)`
/// and a noexcept private `restore_gradient_sync(bool)` made visible to this class (a friend).
class no_sync_guard {
 public:
  /// Turns `runtime`'s gradient synchronisation off until this guard is destroyed. Throws what
  /// `runtime.set_require_gradient_sync(false)` throws (then nothing changes).
  template <class Runtime>
  requires(!std::is_same_v<std::remove_cv_t<Runtime>, no_sync_guard>) explicit no_sync_guard(Runtime& runtime)
      : target_(&runtime),
        restore_([](void* target, bool on) noexcept { static_cast<Runtime*>(target)->restore_gradient_sync(on); }),
        previous_(runtime.require_gradient_sync()) {
    runtime.set_require_gradient_sync(false);
  }
  no_sync_guard(no_sync_guard&& other) noexcept
      : target_(std::exchange(other.target_, nullptr)), restore_(other.restore_), previous_(other.previous_) {}
  no_sync_guard(const no_sync_guard&) = delete;
  no_sync_guard& operator=(const no_sync_guard&) = delete;
  no_sync_guard& operator=(no_sync_guard&&) = delete;
  /// Restores the synchronisation mode the runtime had when the guard was made.
  ~no_sync_guard() {
    if (target_ != nullptr) restore_(target_, previous_);
  }

 private:
  void* target_;
  void (*restore_)(void*, bool) noexcept;
  bool previous_;
};

}  // namespace ringzero
