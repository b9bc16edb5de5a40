#pragma once
/// @file
/// A `zero::gather_timing` (stage 3: the gathers' time on the communication stream and the
/// compute stream's waits for them; zero/gather_timing.hpp) as the examples' JSON records it:
/// `gathers`, `gather_seconds`, `waits`, `exposed_seconds`, `hidden_fraction`. Used by examples
/// 02 (per epoch) and 04 (per run).
#include <nlohmann/json.hpp>

#include "ringzero/zero/gather_timing.hpp"

namespace ringzero::examples {

/// `t` as a JSON object (seconds; `hidden_fraction` from 0 to 1).
inline nlohmann::json gather_timing_json(const zero::gather_timing& t) {
  return {{"gathers", t.gathers},
          {"gather_seconds", t.gather_seconds},
          {"waits", t.waits},
          {"exposed_seconds", t.exposed_seconds},
          {"hidden_fraction", t.hidden_fraction()}};
}

}  // namespace ringzero::examples
