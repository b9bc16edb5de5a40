#pragma once
/// @file
/// `zero::detail::model_agreement`: what the ranks of a `sharded_model` must agree on, and the
/// exchanges that make every rank throw alike when they do not: the registered parameters
/// against the plan, the plan request, options and fingerprint at construction (`agree`), the
/// allocation of the model state (`agree_on_allocation`), and the learning rate at every step
/// (`check_step`, with the micro-batch count and gradient sync), and whether every rank's
/// arguments to a collective call passed their local checks (`agree_on_arguments`, over the
/// shard communicator only). Each exchange is one small all_gather over the shard
/// communicator, then over the replica communicator of hybrid sharding, staged through device memory when the
/// communicator's buffers are device memory. Errors: errc::invalid_argument (refusals and differences, naming the ranks
/// and each rank's value) or errc::internal (allocation), on every rank. Thread semantics: the model's (the rank's
/// thread, or the communication stream for the step's check). Also `call_purpose` and `tagged`, the tags of every
/// collective of the runtime. The manual: docs/zero.md, "The runtime in detail".

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/agreement.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/memory_counter.hpp"
#include "ringzero/primitive/memory_space.hpp"
#include "ringzero/zero/reproducible_gradients.hpp"
#include "ringzero/zero/shard_plan.hpp"
#include "ringzero/zero/sharded_model_options.hpp"
#include "ringzero/zero/sharded_optimizer.hpp"

namespace ringzero::zero::detail {

/// What a collective of the runtime is for; with the flat buffer's index it makes the call's
/// tag (collective_options::tag), so ranks that issue the same-shaped calls for different
/// purposes or buffers (two equal units gathered in different orders) fail with a tag
/// mismatch where the backend checks the contract, instead of mixing their data.
enum class call_purpose : std::uint64_t { agree = 1, gather, read, reduce, replica_average, norm, regather };
/// The runtime's collective that `tag` (made by `tagged` below) labels, named for the contract
/// check's errors (a tag_namer's function; `plan` is the model's shard_plan): e.g. "all_gather
/// of unit 'h.1' (buffer 3: h.1.w, h.1.b)". "" for a tag that is not the runtime's, which then
/// prints as a number. Pure: every rank with the same plan names a tag alike.
/// Where a rank of hybrid sharding sits in the whole job, for its errors ("global rank 5 (rank 1
/// of replica group 2): "; the shard communicator's own context names only the rank within its
/// replica group, the ranks that shard one copy): replica group q (the rank's place in its
/// replica communicator) holds global ranks q * group size + r, as `sharded_model::global_rank`.
/// "" without a replica communicator. Pure.
inline std::string hybrid_position(const communicator& shard, const communicator* replica) {
  if (replica == nullptr) return {};
  return "global rank " + std::to_string(replica->rank() * shard.world_size() + shard.rank()) + " (rank " +
         std::to_string(shard.rank()) + " of replica group " + std::to_string(replica->rank()) + "): ";
}

inline std::string name_model_tag(const void* plan, std::uint64_t tag) noexcept {
  try {
    const auto& p = *static_cast<const shard_plan*>(plan);
    const std::uint64_t purpose = tag >> 48;
    const std::uint64_t index = tag & ((std::uint64_t{1} << 48) - 1);
    if (purpose == static_cast<std::uint64_t>(call_purpose::agree))
      return index == 3   ? "the step's check (learning rate, micro-batch count, gradient sync)"
             : index == 4 ? "the check of a collective call's arguments (agree_on_arguments)"
                          : "the model agreement check (exchange " + std::to_string(index) + ")";
    if (purpose == static_cast<std::uint64_t>(call_purpose::norm)) return "the gradient norm's all_reduce";
    if (index >= p.buffers().size()) return {};
    const flat_buffer& f = p.buffers()[static_cast<std::size_t>(index)];
    std::string what;
    switch (static_cast<call_purpose>(purpose)) {
      case call_purpose::gather: what = "all_gather of unit"; break;
      case call_purpose::read: what = "all_gather (read_parameter or read_parameters_async) of unit"; break;
      case call_purpose::reduce: what = "gradient reduction of unit"; break;
      case call_purpose::replica_average: what = "replica average of the gradients of unit"; break;
      case call_purpose::regather: what = "all_gather after the step of unit"; break;
      default: return {};
    }
    std::string members;
    const std::size_t shown = 3;
    for (std::size_t k = 0; k < f.parameters.size() && k < shown; ++k)
      members += (k == 0 ? "" : ", ") + p.parameters()[f.parameters[k]].name;
    if (f.parameters.size() > shown) members += ", ... (" + std::to_string(f.parameters.size()) + " parameters)";
    return what + " '" + p.units()[f.unit].name + "' (buffer " + std::to_string(index) + ": " + members + ")";
  } catch (...) { return {}; }
}

/// The tag of a runtime collective for `purpose` and flat buffer (or exchange) `index`; with
/// `plan`, the tag's name for the contract check's errors (name_model_tag).
inline collective_options tagged(call_purpose purpose, std::size_t index, const shard_plan* plan = nullptr) noexcept {
  collective_options o;
  o.tag = (static_cast<std::uint64_t>(purpose) << 48) | static_cast<std::uint64_t>(index);
  if (plan != nullptr) o.tag_name = tag_namer{&name_model_tag, plan};
  return o;
}

/// all_gather of `count` uint64 values per rank from host memory `mine` into host memory `all`
/// over `c`; through one device buffer (counted in `counter`) on the communicator's stream when
/// `c`'s buffers are device memory. Collective; errors as the collective's, a CUDA failure
/// errc::backend_failure naming `who`.
inline void gather_values(communicator& c, const std::uint64_t* mine, std::uint64_t* all, std::size_t count,
                          const collective_options& options, primitive::memory_counter* counter,
                          const std::string& who) {
  const std::size_t n = static_cast<std::size_t>(c.world_size());
  if (c.space() == ringzero::memory_space::host) {
    all_gather(c, mine, all, count, dtype::uint64, options);
    return;
  }
  // Device memory: stage through one device buffer on the communicator's stream.
  const primitive::device_primitives& p = primitive::require_device_primitives();
  const std::uint64_t row = count * sizeof(std::uint64_t);
  primitive::memory_buffer staging = primitive::memory_buffer::allocate(
      primitive::memory_space::device, row * (n + 1), c.cuda_device(), primitive::host_alignment, counter);
  unsigned char* base = static_cast<unsigned char*>(staging.data());
  const auto checked = [&](int code, const char* what) {
    if (code != 0) ringzero::detail::raise(c, errc::backend_failure, who + ": " + what + ": " + p.error_name(code));
  };
  checked(p.copy(base, mine, row, c.cuda_stream()), "staging the exchanged values");
  all_gather(c, base, base + row, count, dtype::uint64, options);
  checked(p.copy(all, base + row, row * n, c.cuda_stream()), "reading the exchanged values");
  checked(p.synchronize(c.cuda_stream()), "synchronizing the exchange");
}

/// See the file comment. Holds references: the communicators, plan and options must outlive it.
class model_agreement {
 public:
  /// The agreement of a model running `plan` with `options` on `comm` (and `replica`, or
  /// nullptr); staging buffers for device-memory communicators are counted in `counter`.
  model_agreement(communicator& comm, communicator* replica, const shard_plan& plan,
                  const sharded_model_options& options, primitive::memory_counter* counter) noexcept
      : comm_(comm), replica_(replica), plan_(plan), options_(options), counter_(counter) {}

  /// The first reason why this rank cannot run the plan with `registered` parameters ("" when
  /// it can): parameters, world and group sizes, clipping, loss scaling, reproducible mode, the
  /// optimizer. Local.
  std::string problem(std::span<const parameter_spec> registered) const;

  /// Every rank learns every rank's `summary` (an all_gather over the shard communicator, then
  /// over the replica communicator) and throws alike on all of them: its own `problem` on a
  /// rank that refused, which ranks refused on the others, else the first value the ranks
  /// disagree on with each rank's value ("learning rate: rank 0: 0.5; rank 1: 0.25"), and for
  /// parameter lists of equal length the first parameter that differs.
  void agree(const std::string& problem) {
    std::string verdict = agree_over(comm_, !problem.empty(), false);
    if (replica_ != nullptr) {
      // "refused" now means "my shard group cannot start", so that the refusal reaches every
      // rank of every replica group.
      std::string across = agree_over(*replica_, !problem.empty() || !verdict.empty(), true);
      if (verdict.empty()) verdict = across;
    }
    if (!problem.empty()) raise(problem);
    if (!verdict.empty()) raise(verdict);
  }

  /// After each rank tried to allocate its state (`problem`: why it could not, or ""): one
  /// exchange so that a rank that could not makes every rank throw errc::internal (naming it)
  /// instead of leaving the others to time out in the first collective.
  void agree_on_allocation(const std::string& problem);

  /// Before a collective `call` whose arguments each rank checks locally (`refused`: this rank's
  /// were refused): one exchange over the shard communicator, so that the ranks whose arguments
  /// passed throw errc::invalid_argument naming the ranks that refused, instead of waiting in the
  /// collective until the communicator's timeout. Returns normally on a refusing rank (which
  /// throws its own error) and when no rank refused. Collective over the shard group.
  void agree_on_arguments(bool refused, const std::string& call);

  /// Every rank of both communicators learns every rank's learning rate `lr` (a scheduler that
  /// set different rates on different ranks would update the shards inconsistently), the number
  /// of micro-batches it ended in this step and whether it takes the step with gradient sync off
  /// (nothing reduced), and throws alike when a rank has sync off or the others differ, naming
  /// step `next_step` and each rank's value. Alone (world size 1) only sync off throws.
  void check_step(double lr, std::uint64_t next_step, std::uint64_t micro_batches, bool sync_off);

 private:
  [[noreturn]] void raise(const std::string& message, errc kind = errc::invalid_argument) const {
    ringzero::detail::raise(comm_, kind, "zero::sharded_model: " + hybrid_position(comm_, replica_) + message);
  }

  /// This rank's values of everything the ranks must share: its refusal, the plan request
  /// field by field (the parameter list as one hash), the optimizer options that its kind
  /// uses, the clipping settings, and the plan fingerprint last (anything not listed).
  std::vector<ringzero::detail::agreed_value> summary(bool refused) const;

  /// FNV-1a of parameters [first, last) of the plan request (as the fingerprint hashes them).
  std::uint64_t parameters_hash(std::size_t first, std::size_t last) const {
    detail::fnv1a h;
    const auto& ps = plan_.request().parameters;
    for (std::size_t i = first; i < last; ++i) detail::hash_parameter(h, ps[i]);
    return h.value();
  }

  /// The exchange of `agree` over `c`: the message every rank of `c` raises, or "".
  /// `across_groups`: `c` is the replica communicator, whose rank r stands for shard group r,
  /// and `refused` says that this rank's shard group cannot start.
  std::string agree_over(communicator& c, bool refused, bool across_groups);

  /// Where the ranks' parameter lists (of equal length, hashes differing) first differ: a second
  /// all_gather of one hash per parameter; names this rank's version of that parameter.
  std::string first_parameter_difference(communicator& c);

  /// all_gather of `count` uint64 values per rank over `c`, through device memory when `c`'s
  /// buffers are device memory.
  void exchange(communicator& c, const std::uint64_t* mine, std::uint64_t* all, std::size_t count,
                collective_options options);

  communicator& comm_;
  communicator* replica_;
  const shard_plan& plan_;
  const sharded_model_options& options_;
  primitive::memory_counter* counter_;
};

inline std::string model_agreement::problem(std::span<const parameter_spec> registered) const {
  const auto& planned = plan_.parameters();
  const zero::precision& pr = plan_.request().precision;
  if (registered.size() != planned.size())
    return "the plan has " + std::to_string(planned.size()) + " parameters but the trainer registered " +
           std::to_string(registered.size());
  for (std::size_t i = 0; i < planned.size(); ++i) {
    const parameter_spec& a = planned[i];
    const parameter_spec& b = registered[i];
    const std::string where = "parameter " + std::to_string(i) + ": the plan has ";
    if (a.name != b.name) return where + "'" + a.name + "' but the trainer registered '" + b.name + "'";
    if (a.shape != b.shape)
      return where + "'" + a.name + "' with shape " + shape_text(a.shape) + " but the trainer registered shape " +
             shape_text(b.shape);
    const dtype ta = pr.parameter_type(a.type), tb = pr.parameter_type(b.type);
    if (ta != tb)
      return where + "'" + a.name + "' as " + std::string(dtype_name(ta)) + " but the trainer registered " +
             (is_valid(tb) ? std::string(dtype_name(tb)) : "dtype value " + std::to_string(static_cast<unsigned>(tb)));
    if (a.trainable != b.trainable)
      return where + "'" + a.name + "' " + (a.trainable ? "trainable" : "frozen") + " but the trainer registered it " +
             (b.trainable ? "trainable" : "frozen");
    if (a.tie_group != b.tie_group)
      return where + "'" + a.name + "' in tie group '" + a.tie_group + "' but the trainer registered tie group '" +
             b.tie_group + "'";
    if (a.unit != b.unit)
      return where + "'" + a.name + "' in unit '" + a.unit + "' but the trainer registered unit '" + b.unit + "'";
  }
  const int total = comm_.world_size() * (replica_ ? replica_->world_size() : 1);
  if (plan_.world_size() != total)
    return "the plan is for " + std::to_string(plan_.world_size()) + " ranks but the communicators have " +
           std::to_string(total);
  if (plan_.stage() >= 1 && plan_.shards() != comm_.world_size())
    return "the plan shards over replica groups of " + std::to_string(plan_.shards()) +
           " ranks but the shard communicator has " + std::to_string(comm_.world_size());
  if (!(options_.max_grad_norm >= 0) || !std::isfinite(options_.max_grad_norm))
    return "max_grad_norm must be finite and >= 0, got " + std::to_string(options_.max_grad_norm);
  if (std::string why = loss_scaling_problem(options_.loss_scaling); !why.empty()) return why;
  if (options_.hook && plan_.request().quantization.any())
    return "the collective hook '" + hook_name(*options_.hook) +
           "' and quantized communication (plan_request::quantization) both replace the runtime's gathers and "
           "reductions: use one of them";
  if (options_.hook && options_.reproducible)
    return "reproducible mode reduces the gradients through its own accumulators, so the collective hook '" +
           hook_name(*options_.hook) + "' would not see them: use one of them";
  if (options_.reproducible) {
    std::string why =
        detail::reproducible_gradients_problem(plan_, options_.max_grad_norm, replica_ ? replica_->world_size() : 1);
    if (!why.empty()) return why;
  }
  return sharded_optimizer::problem(plan_, options_.optimizer);
}

inline std::vector<ringzero::detail::agreed_value> model_agreement::summary(bool refused) const {
  using ringzero::detail::setting_bits;
  using shown = ringzero::detail::agreed_value::shown;
  const auto optimizer_text = [](std::uint64_t bits) {
    return optimizer_name(static_cast<optimizer_kind>(bits)).data();
  };
  const auto quantized_text = [](std::uint64_t bits) {
    return quantized_bits_name(static_cast<quantized_bits>(bits)).data();
  };
  const plan_request& q = plan_.request();
  detail::fnv1a precision_hash;
  detail::hash_precision(precision_hash, q.precision);
  const optimizer_options& o = options_.optimizer;
  const bool sgd = o.kind == optimizer_kind::sgd;
  std::uint64_t hook_hash = 0;
  if (options_.hook) {
    detail::fnv1a h;
    h.text(hook_name(*options_.hook));
    hook_hash = h.value();
  }
  return {
      {"refused", refused ? 1u : 0u, shown::flag},
      {"plan world size", static_cast<std::uint64_t>(q.world_size), shown::integer},
      {"plan replica group size", static_cast<std::uint64_t>(q.replica_group_size), shown::integer},
      {"stage", static_cast<std::uint64_t>(q.stage), shown::integer},
      {"alignment_bytes", q.alignment_bytes, shown::integer},
      {"unit_bytes", q.unit_bytes, shown::integer},
      {"accumulation_steps", static_cast<std::uint64_t>(q.accumulation_steps), shown::integer},
      {"prefetch", q.prefetch ? 1u : 0u, shown::flag},
      {"reshard_after_forward", static_cast<std::uint64_t>(q.reshard_after_forward), shown::named,
       +[](std::uint64_t bits) { return reshard_policy_name(static_cast<reshard_policy>(bits)).data(); }},
      {"max_inflight_reductions", static_cast<std::uint64_t>(q.max_inflight_reductions), shown::integer},
      {"max_inflight_gathers", q.stage == 3 ? static_cast<std::uint64_t>(q.max_inflight_gathers) : 0u, shown::integer},
      {"accumulate_unsharded", q.stage >= 2 && q.accumulate_unsharded ? 1u : 0u, shown::flag},
      {"quantization.weights", static_cast<std::uint64_t>(q.quantization.weights), shown::named, +quantized_text},
      {"quantization.gradients", static_cast<std::uint64_t>(q.quantization.gradients), shown::named, +quantized_text},
      {"quantization.block_size", q.quantization.any() ? q.quantization.block_size : 0u, shown::integer},
      {"keep_frozen_bytes", q.stage == 3 ? q.keep_frozen_bytes : 0u, shown::integer},
      {"prefetch_lists (hash)", q.stage == 3 ? detail::hash_prefetch_lists(q.prefetch_lists) : 0u, shown::hash},
      {"precision (hash)", precision_hash.value(), shown::hash},
      {"parameter count", q.parameters.size(), shown::integer},
      {"parameters (hash of names, shapes, dtypes, flags, tie groups, units)", parameters_hash(0, q.parameters.size()),
       shown::hash},
      {"optimizer", static_cast<std::uint64_t>(o.kind), shown::named, +optimizer_text},
      {"learning rate", setting_bits(o.lr), shown::real},
      {"weight_decay", setting_bits(o.weight_decay), shown::real},
      {"momentum", sgd ? setting_bits(o.momentum) : 0, shown::real},
      {"dampening", sgd ? setting_bits(o.dampening) : 0, shown::real},
      {"nesterov", sgd && o.nesterov ? 1u : 0u, shown::flag},
      {"beta1", sgd ? 0 : setting_bits(o.beta1), shown::real},
      {"beta2", sgd ? 0 : setting_bits(o.beta2), shown::real},
      {"eps", sgd ? 0 : setting_bits(o.eps), shown::real},
      {"max_grad_norm", setting_bits(options_.max_grad_norm), shown::real},
      {"skip_nonfinite_steps", options_.skip_nonfinite_steps ? 1u : 0u, shown::flag},
      {"reproducible", options_.reproducible ? 1u : 0u, shown::flag},
      {"collective hook (hash of its name)", hook_hash, shown::hash},
      {"loss_scaling.enabled", options_.loss_scaling.enabled ? 1u : 0u, shown::flag},
      {"loss_scaling.initial_scale", setting_bits(options_.loss_scaling.initial_scale), shown::real},
      {"loss_scaling.growth_factor", setting_bits(options_.loss_scaling.growth_factor), shown::real},
      {"loss_scaling.backoff_factor", setting_bits(options_.loss_scaling.backoff_factor), shown::real},
      {"loss_scaling.growth_interval", static_cast<std::uint64_t>(options_.loss_scaling.growth_interval),
       shown::integer},
      {"offload", static_cast<std::uint64_t>(q.offload), shown::named,
       +[](std::uint64_t bits) { return offload_name(static_cast<offload>(bits)).data(); }},
      {"plan fingerprint", plan_.fingerprint(), shown::hash},
  };
}

inline std::string model_agreement::agree_over(communicator& c, bool refused, bool across_groups) {
  const int n = c.world_size();
  if (n == 1) return {};
  const std::vector<ringzero::detail::agreed_value> mine = summary(refused);
  const std::size_t fields = mine.size();
  const std::vector<std::uint64_t> row = ringzero::detail::agreement_row(mine);
  std::vector<std::uint64_t> gathered(fields * static_cast<std::size_t>(n));
  exchange(c, row.data(), gathered.data(), fields, tagged(call_purpose::agree, 0, &plan_));
  const ringzero::detail::agreement_table table(std::move(gathered), fields);
  const std::vector<int> refusing = table.ranks_where_not(0, 0);
  if (!refusing.empty() && across_groups)
    return "across replica groups: the shard group of replica-communicator " +
           ringzero::detail::describe_ranks(refusing) +
           " cannot start (a rank there refused the plan or its ranks differ; see the errors there); no rank starts";
  if (!refusing.empty())
    return ringzero::detail::describe_ranks(refusing) + " refused the plan (see " +
           (refusing.size() == 1 ? "that rank's error" : "those ranks' errors") + "); no rank starts";
  if (const std::size_t f = table.first_difference(1); f < fields) {
    std::string what =
        std::string(across_groups ? "across replica groups, the ranks of the replica communicator differ in "
                                  : "the ranks differ in ") +
        mine[f].what + ": " + table.by_rank(f, mine[f]);
    if (mine[f].what.starts_with("parameters (hash")) what += first_parameter_difference(c);
    return what + "; every rank must pass the same plan request and sharded_model_options";
  }
  return {};
}

inline std::string model_agreement::first_parameter_difference(communicator& c) {
  const int n = c.world_size();
  const auto& ps = plan_.request().parameters;
  const std::size_t count = ps.size();
  std::vector<std::uint64_t> row(count), gathered(count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < count; ++i) row[i] = parameters_hash(i, i + 1);
  exchange(c, row.data(), gathered.data(), count, tagged(call_purpose::agree, 1, &plan_));
  const ringzero::detail::agreement_table table(std::move(gathered), count);
  if (const std::size_t i = table.first_difference(); i < count) {
    const parameter_spec& p = ps[i];
    const ringzero::detail::agreed_value hash{"", 0, ringzero::detail::agreed_value::shown::hash};
    return "; first at parameter " + std::to_string(i) + ", here '" + p.name + "' " + shape_text(p.shape) + " " +
           (p.type ? std::string(dtype_name(*p.type)) : std::string("(precision's dtype)")) +
           (p.trainable ? " trainable" : " frozen") + " in unit '" + p.unit + "', tie group '" + p.tie_group +
           "' (its hash: " + table.by_rank(i, hash) + ")";
  }
  return {};
}

inline void model_agreement::check_step(double lr, std::uint64_t next_step, std::uint64_t micro_batches,
                                        bool sync_off) {
  using ringzero::detail::agreed_value;
  const std::uint64_t mine[3] = {ringzero::detail::setting_bits(lr), micro_batches, sync_off ? 1u : 0u};
  const std::string at = " at step " + std::to_string(next_step);
  const std::string off = "step() with gradient sync off (inside no_sync(), or after set_require_gradient_sync(false))";
  const std::string off_why =
      ": the gradients accumulated since the last step were never reduced; end the step's "
      "last micro-batch with sync on (close the no_sync scope before it)";
  std::string verdict;
  bool compared = false;
  for (communicator* c : {&comm_, replica_}) {
    if (c == nullptr || c->world_size() == 1) continue;
    compared = true;
    const auto n = static_cast<std::size_t>(c->world_size());
    std::vector<std::uint64_t> all(3 * n);
    exchange(*c, mine, all.data(), 3, tagged(call_purpose::agree, 3, &plan_));
    if (!verdict.empty()) continue;
    const std::string who =
        c == replica_ ? "across replica groups, the ranks of the replica communicator" : "the ranks";
    // One field at a time, most telling first: sync off, then the micro-batch count, then the rate.
    for (const std::size_t k : {std::size_t{2}, std::size_t{1}, std::size_t{0}}) {
      bool same = true;
      for (std::size_t r = 0; r < n; ++r) same = same && all[3 * r + k] == all[k];
      if (same && !(k == 2 && all[k] != 0)) continue;
      std::vector<std::string> values;
      const agreed_value shown{"", 0, k == 0 ? agreed_value::shown::real : agreed_value::shown::integer};
      for (std::size_t r = 0; r < n; ++r)
        values.push_back(k == 2 ? (all[3 * r + k] != 0 ? "sync off" : "sync on")
                                : ringzero::detail::show(shown, all[3 * r + k]));
      const std::string each = ringzero::detail::describe_values(values);
      verdict = k == 2 ? off + at + " (" + each + ")" + off_why
                : k == 1
                    ? who + " ended different numbers of micro-batches" + at + ": " + each +
                          " (every rank runs the step's micro-batches, and no_sync covers the same ones on every rank)"
                    : who + " hold different learning rates" + at + ": " + each +
                          " (set_learning_rate must set the same value on every rank)";
      break;
    }
  }
  if (verdict.empty() && sync_off && !compared) verdict = off + at + off_why;
  if (!verdict.empty()) raise(verdict);
}

inline void model_agreement::agree_on_allocation(const std::string& problem) {
  // Over the shard group, then across replica groups with "my group failed": every rank joins
  // both exchanges and learns of a failure anywhere.
  std::string verdict;
  for (communicator* c : {&comm_, replica_}) {
    if (c == nullptr || c->world_size() == 1) continue;
    const int n = c->world_size();
    std::uint64_t mine = problem.empty() && verdict.empty() ? 0 : 1;
    std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
    exchange(*c, &mine, all.data(), 1, tagged(call_purpose::agree, 2, &plan_));
    std::vector<int> failed;
    for (int r = 0; r < n; ++r)
      if (all[static_cast<std::size_t>(r)] != 0) failed.push_back(r);
    if (!failed.empty() && verdict.empty())
      verdict = c == replica_ ? "across replica groups: the shard group of replica-communicator " +
                                    ringzero::detail::describe_ranks(failed) +
                                    " could not allocate the model state (see the errors there); no rank starts"
                              : ringzero::detail::describe_ranks(failed) +
                                    " could not allocate the model state (see the error there); no rank starts";
  }
  if (!problem.empty()) raise(problem, errc::internal);
  if (!verdict.empty()) raise(verdict, errc::internal);
}

inline void model_agreement::agree_on_arguments(bool refused, const std::string& call) {
  if (comm_.world_size() == 1) return;
  const int n = comm_.world_size();
  std::uint64_t mine = refused ? 1 : 0;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
  exchange(comm_, &mine, all.data(), 1, tagged(call_purpose::agree, 4, &plan_));
  std::vector<int> failed;
  for (int r = 0; r < n; ++r)
    if (all[static_cast<std::size_t>(r)] != 0) failed.push_back(r);
  if (!refused && !failed.empty())
    raise(call + ": refused on " + ringzero::detail::describe_ranks(failed) +
          " (see the error there); nothing was copied on any rank");
}

inline void model_agreement::exchange(communicator& c, const std::uint64_t* mine, std::uint64_t* all, std::size_t count,
                                      collective_options options) {
  gather_values(c, mine, all, count, options, counter_, "zero::sharded_model");
}

}  // namespace ringzero::zero::detail
