#pragma once
/// @file
/// `checkpoint::training_progress`: the scalars of a training run that a checkpoint keeps next to
/// the tensors — the optimizer step count, the loss scale and its good-step count, where the
/// sampler is (epoch, step in the epoch), the RNG seeds, and the user's key-value metadata — and
/// their JSON form in the index. A trainer that derives its randomness from (seed, epoch, step)
/// resumes exactly; one with a stateful engine can keep its serialised state (std::mt19937_64's
/// `operator<<`) in `metadata`. Every rank must pass the same values to a save (checked).
/// Needs nlohmann/json (the Meson dependency `ringzero-checkpoint`). Pure values.

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/core/error.hpp"

namespace ringzero::checkpoint {

/// See the file comment.
struct training_progress {
  /// Optimizer steps applied so far (Adam's bias correction continues from it). For a
  /// `zero::sharded_model` the save takes it from the model and the load sets the model's.
  std::uint64_t optimizer_steps = 0;
  std::uint64_t epoch = 0;          ///< the sampler's epoch
  std::uint64_t step_in_epoch = 0;  ///< batches of that epoch already consumed
  /// The loss scale of mixed-precision training (finite, > 0), when the trainer has one.
  /// For a `zero::sharded_model` with loss scaling the save takes it from the model and the
  /// load restores the model's (zero/loss_scaler.hpp).
  std::optional<double> loss_scale;
  /// Consecutive good steps of the loss scaler (GradScaler's growth tracker), taken and restored
  /// with `loss_scale`. Absent from indexes written before it existed: read as 0.
  std::uint64_t loss_scale_good_steps = 0;
  std::vector<std::uint64_t> rng_seeds;         ///< the trainer's RNG seeds
  std::map<std::string, std::string> metadata;  ///< anything else, as text

  friend bool operator==(const training_progress&, const training_progress&) = default;

  /// The first problem ("" when none): a loss scale that is not finite and > 0.
  std::string problem() const {
    if (loss_scale && !(std::isfinite(*loss_scale) && *loss_scale > 0))
      return "loss_scale must be finite and > 0, got " + std::to_string(*loss_scale);
    return {};
  }

  /// The JSON object the index stores.
  nlohmann::json to_json() const {
    nlohmann::json j = nlohmann::json::object();
    j["optimizer_steps"] = optimizer_steps;
    j["epoch"] = epoch;
    j["step_in_epoch"] = step_in_epoch;
    j["loss_scale"] = loss_scale ? nlohmann::json(*loss_scale) : nlohmann::json(nullptr);
    j["loss_scale_good_steps"] = loss_scale_good_steps;
    j["rng_seeds"] = rng_seeds;
    j["metadata"] = metadata;
    return j;
  }

  /// Parses `to_json` output; throws errc::io_error naming `where` and the field on a bad one.
  static training_progress from_json(const nlohmann::json& j, const std::string& where) {
    auto bad = [&](const std::string& field) -> error {
      return error(errc::io_error, where + ": the progress field '" + field + "' is missing or malformed");
    };
    if (!j.is_object()) throw bad("progress");
    training_progress p;
    auto count = [&](const char* field) {
      if (!j.contains(field) || !j[field].is_number_unsigned()) throw bad(field);
      return j[field].get<std::uint64_t>();
    };
    p.optimizer_steps = count("optimizer_steps");
    p.epoch = count("epoch");
    p.step_in_epoch = count("step_in_epoch");
    if (!j.contains("loss_scale")) throw bad("loss_scale");
    if (j["loss_scale"].is_number())
      p.loss_scale = j["loss_scale"].get<double>();
    else if (!j["loss_scale"].is_null())
      throw bad("loss_scale");
    if (j.contains("loss_scale_good_steps")) p.loss_scale_good_steps = count("loss_scale_good_steps");
    if (!j.contains("rng_seeds") || !j["rng_seeds"].is_array()) throw bad("rng_seeds");
    for (const auto& s : j["rng_seeds"]) {
      if (!s.is_number_unsigned()) throw bad("rng_seeds");
      p.rng_seeds.push_back(s.get<std::uint64_t>());
    }
    if (!j.contains("metadata") || !j["metadata"].is_object()) throw bad("metadata");
    for (const auto& [k, v] : j["metadata"].items()) {
      if (!v.is_string()) throw bad("metadata." + k);
      p.metadata[k] = v.get<std::string>();
    }
    return p;
  }
};

}  // namespace ringzero::checkpoint
