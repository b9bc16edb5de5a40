#pragma once
/// @file
/// The umbrella header: core types, the local (threads) backend, every collective, DDP (bucket
/// assignment, the gradient reducer and its communication hooks) and ZeRO (shard planner,
/// memory and traffic model, sharded runtime). Not included: zero/model_presets.hpp and
/// zero/paper_comparison.hpp (for planning tools), the checkpoint layer and the backends below.
/// The MPI and NCCL backends are opt-in (backend/mpi.hpp, backend/nccl.hpp) so that including
/// this header needs no external library. Under RINGZERO_SEPARATE_COMPILATION
/// (docs/compile_time.md) it does not pull in the algorithms/ and primitive/ headers: include
/// those directly where they are used.
///
/// Quick start:
/// @code
///   #include <ringzero/ringzero.hpp>
///   ringzero::local::launch(4, [](ringzero::communicator& comm) {
///     std::vector<float> grad(1000, float(comm.rank()));
///     ringzero::all_reduce(comm, std::span<float>(grad), ringzero::reduce_kind::avg);
///   });
/// @endcode

#include "ringzero/core/algorithm.hpp"
#include "ringzero/core/config.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/env.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/core/reduce_op.hpp"
#include "ringzero/core/status.hpp"
#include "ringzero/core/workspace_pool.hpp"

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/local/launch.hpp"

#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/all_to_all.hpp"
#include "ringzero/collective/barrier.hpp"
#include "ringzero/collective/broadcast.hpp"
#include "ringzero/collective/reduce.hpp"
#include "ringzero/collective/reduce_scatter.hpp"
#include "ringzero/collective/reproducible_accumulator.hpp"
#include "ringzero/collective/selection.hpp"
#include "ringzero/collective/send_recv.hpp"

#include "ringzero/ddp/allreduce_hook.hpp"
#include "ringzero/ddp/bucket_assignment.hpp"
#include "ringzero/ddp/comm_hook.hpp"
#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/gradient_bucket.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/ddp/powersgd_hook.hpp"

#include "ringzero/zero/shard_plan.hpp"
#include "ringzero/zero/sharded_model.hpp"
