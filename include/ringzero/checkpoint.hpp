#pragma once
/// @file
/// The checkpoint layer (opt-in, not part of <ringzero/ringzero.hpp>): sharded save, load and
/// reshard of a `zero::sharded_model` or a DDP trainer, in safetensors shard files plus a JSON
/// index, crash-safe, optionally in the background. Needs nlohmann/json and libxxhash (Debian
/// nlohmann-json3-dev and libxxhash-dev; the Meson dependency `ringzero-checkpoint`).
/// Manual: docs/checkpoint.md.
/// @code
///   ringzero::checkpoint::checkpointer ckpt("run/checkpoints", {.keep_last = 3});
///   ringzero::checkpoint::training_progress progress;
///   progress.epoch = epoch;
///   ckpt.async_save(model, progress);                  // after model.step()
///   ...
///   ckpt.wait();                                       // before exiting
///   auto progress = ringzero::checkpoint::load(model, "run/checkpoints");  // any world size
/// @endcode

#include "ringzero/checkpoint/checkpoint_directory.hpp"
#include "ringzero/checkpoint/checkpoint_index.hpp"
#include "ringzero/checkpoint/checkpointer.hpp"
#include "ringzero/checkpoint/consolidate.hpp"
#include "ringzero/checkpoint/fragment_reader.hpp"
#include "ringzero/checkpoint/load.hpp"
#include "ringzero/checkpoint/offline_reshard.hpp"
#include "ringzero/checkpoint/pretrained.hpp"
#include "ringzero/checkpoint/replicated_state.hpp"
#include "ringzero/checkpoint/root_lock.hpp"
#include "ringzero/checkpoint/safetensors.hpp"
