#pragma once
/// @file
/// The libtorch bridges in one include: `integration::torch_ddp` (data parallelism through the
/// gradient reducer, with `sync_batch_norm`) and `integration::torch_zero` (ZeRO stages 0-3
/// through `zero::sharded_model`). Needs libtorch (Debian's libtorch-dev); never included by
/// <ringzero/ringzero.hpp>. The manuals: docs/libtorch.md (DDP) and docs/libtorch_gpt.md (ZeRO).

#include "ringzero/integration/torch_ddp.hpp"
#include "ringzero/integration/torch_zero.hpp"
