#pragma once
/// @file
/// `detail::lingering`: the MPI communicators of destroyed `mpi::communicator`s that wait for a
/// late peer's departure notice before they are freed (control channel; docs/mpi.md).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "ringzero/backend/mpi/environment.hpp"
#include "ringzero/backend/mpi/wire.hpp"

namespace ringzero::mpi::detail {

/// The MPI communicators of destroyed `mpi::communicator`s whose destructor stopped waiting
/// before every peer had departed (after `failed_departure_wait` when aborted, else the timeout). Freeing them at once
/// would let MPI give their context to a later communicator while the late peer's departure notice is still on its way:
/// Open MPI files a message for a context that does not exist yet under that context and
/// delivers it to the next communicator that gets it, out of its message order (a later
/// message of that communicator would then be lost: a hang). So they linger here, and
/// `collect` frees each pair once every late peer's departure notice has arrived on it.
/// Process-wide; `collect` runs when an `mpi::communicator` is made or destroyed. Pairs whose
/// peers never depart (a process that died) stay until MPI_Finalize, which frees them.
class lingering {
 public:
  /// Adds the pair of a destroyed communicator of instance `instance`; `departed[p]` tells
  /// whether rank p's departure notice already arrived.
  static void add(MPI_Comm data, MPI_Comm control, std::uint64_t instance, std::vector<char> departed) {
    std::lock_guard<std::mutex> guard(mutex());
    items().push_back(item{data, control, instance, std::move(departed)});
  }

  /// Receives the departure notices that arrived on lingering pairs and frees every pair whose
  /// peers have all departed. Never throws; `serialize` as the caller's communicator.
  static void collect(bool serialize) noexcept {
    if (!is_active()) return;
    std::lock_guard<std::mutex> guard(mutex());
    auto& list = items();
    for (std::size_t i = 0; i < list.size();) {
      item& it = list[i];
      bool done = false;
      {
        call_lock lock(serialize);
        receive_departures(it);
        done = std::all_of(it.departed.begin(), it.departed.end(), [](char d) { return d != 0; });
        if (done) {
          MPI_Comm_free(&it.control);
          MPI_Comm_free(&it.data);
        }
      }
      if (done) {
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  /// Pairs still lingering (tests).
  static std::size_t size() {
    std::lock_guard<std::mutex> guard(mutex());
    return items().size();
  }

 private:
  struct item {
    MPI_Comm data;
    MPI_Comm control;
    std::uint64_t instance;
    std::vector<char> departed;
  };

  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<item>& items() {
    static std::vector<item> v;
    return v;
  }

  static void receive_departures(item& it) noexcept {
    std::vector<unsigned char> buffer;
    for (;;) {
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      if (MPI_Improbe(MPI_ANY_SOURCE, tag_notice, it.control, &flag, &message, &status) != MPI_SUCCESS || !flag) return;
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      buffer.assign(std::max<std::size_t>(sizeof(notice), static_cast<std::size_t>(std::max(bytes, 0))), 0);
      if (MPI_Mrecv(buffer.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      notice n;
      std::memcpy(&n, buffer.data(), std::min(sizeof n, static_cast<std::size_t>(std::max(bytes, 0))));
      const int from = status.MPI_SOURCE;
      if (from >= 0 && static_cast<std::size_t>(from) < it.departed.size() && n.instance == it.instance &&
          n.kind == notice_kind::depart)
        it.departed[static_cast<std::size_t>(from)] = 1;
    }
  }
};

}  // namespace ringzero::mpi::detail
