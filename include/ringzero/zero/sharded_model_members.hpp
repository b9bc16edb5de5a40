#pragma once
/// @file
/// The longer private members of `zero::sharded_model` (checking the registered parameters,
/// the cross-rank agreement, allocation, launching and completing reductions), defined out of
/// the class. Included by zero/sharded_model.hpp at its end; include that header, not this one.

#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::zero {

inline std::string sharded_model::check(std::span<const parameter_spec> registered) const {
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
  if (options_.reproducible) {
    std::string why =
        detail::reproducible_gradients_problem(plan_, options_.max_grad_norm, replica_ ? replica_->world_size() : 1);
    if (!why.empty()) return why;
  }
  return sharded_optimizer::problem(plan_, options_.optimizer);
}

inline std::vector<ringzero::detail::agreed_value> sharded_model::summary(bool refused) const {
  using ringzero::detail::setting_bits;
  using shown = ringzero::detail::agreed_value::shown;
  const auto optimizer_text = [](std::uint64_t bits) {
    return optimizer_name(static_cast<optimizer_kind>(bits)).data();
  };
  const plan_request& q = plan_.request();
  detail::fnv1a precision_hash;
  detail::hash_precision(precision_hash, q.precision);
  const optimizer_options& o = options_.optimizer;
  const bool sgd = o.kind == optimizer_kind::sgd;
  return {
      {"refused", refused ? 1u : 0u, shown::flag},
      {"plan world size", static_cast<std::uint64_t>(q.world_size), shown::integer},
      {"plan replica group size", static_cast<std::uint64_t>(q.replica_group_size), shown::integer},
      {"stage", static_cast<std::uint64_t>(q.stage), shown::integer},
      {"alignment_bytes", q.alignment_bytes, shown::integer},
      {"unit_bytes", q.unit_bytes, shown::integer},
      {"accumulation_steps", static_cast<std::uint64_t>(q.accumulation_steps), shown::integer},
      {"prefetch", q.prefetch ? 1u : 0u, shown::flag},
      {"max_inflight_reductions", static_cast<std::uint64_t>(q.max_inflight_reductions), shown::integer},
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
      {"loss_scaling.enabled", options_.loss_scaling.enabled ? 1u : 0u, shown::flag},
      {"loss_scaling.initial_scale", setting_bits(options_.loss_scaling.initial_scale), shown::real},
      {"loss_scaling.growth_factor", setting_bits(options_.loss_scaling.growth_factor), shown::real},
      {"loss_scaling.backoff_factor", setting_bits(options_.loss_scaling.backoff_factor), shown::real},
      {"loss_scaling.growth_interval", static_cast<std::uint64_t>(options_.loss_scaling.growth_interval),
       shown::integer},
      {"plan fingerprint", plan_.fingerprint(), shown::hash},
  };
}

inline std::string sharded_model::agree_over(communicator& c, bool refused, bool across_groups) {
  const int n = c.world_size();
  if (n == 1) return {};
  const std::vector<ringzero::detail::agreed_value> mine = summary(refused);
  const std::size_t fields = mine.size();
  const std::vector<std::uint64_t> row = ringzero::detail::agreement_row(mine);
  std::vector<std::uint64_t> gathered(fields * static_cast<std::size_t>(n));
  exchange(c, row.data(), gathered.data(), fields, tagged(call_purpose::agree, 0));
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

inline std::string sharded_model::first_parameter_difference(communicator& c) {
  const int n = c.world_size();
  const auto& ps = plan_.request().parameters;
  const std::size_t count = ps.size();
  std::vector<std::uint64_t> row(count), gathered(count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < count; ++i) row[i] = parameters_hash(i, i + 1);
  exchange(c, row.data(), gathered.data(), count, tagged(call_purpose::agree, 1));
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

inline void sharded_model::check_learning_rates() {
  std::uint64_t mine = ringzero::detail::setting_bits(optimizer_->options().lr);
  const ringzero::detail::agreed_value rate{"learning rate", mine, ringzero::detail::agreed_value::shown::real};
  std::string verdict;
  for (communicator* c : {&comm_, replica_}) {
    if (c == nullptr || c->world_size() == 1) continue;
    const int n = c->world_size();
    std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
    exchange(*c, &mine, all.data(), 1, tagged(call_purpose::agree, 3));
    bool same = true;
    for (std::uint64_t b : all) same = same && b == all[0];
    if (same || !verdict.empty()) continue;
    std::vector<std::string> values;
    for (std::uint64_t b : all) values.push_back(ringzero::detail::show(rate, b));
    verdict =
        std::string(c == replica_ ? "across replica groups, the ranks of the replica communicator" : "the ranks") +
        " hold different learning rates at step " + std::to_string(optimizer_->steps() + 1) + ": " +
        ringzero::detail::describe_values(values) + " (set_learning_rate must set the same value on every rank)";
  }
  if (!verdict.empty()) raise(verdict);
}

inline void sharded_model::allocate_everywhere() {
  std::string problem;
  try {
    allocate();
  } catch (const std::bad_alloc&) {
    problem = "cannot allocate the model state of this rank (std::bad_alloc)";
  } catch (const error& e) { problem = e.message(); }
  // Over the shard group, then across replica groups with "my group failed": every rank joins
  // both exchanges and learns of a failure anywhere.
  std::string verdict;
  for (communicator* c : {&comm_, replica_}) {
    if (c == nullptr || c->world_size() == 1) continue;
    const int n = c->world_size();
    std::uint64_t mine = problem.empty() && verdict.empty() ? 0 : 1;
    std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
    exchange(*c, &mine, all.data(), 1, tagged(call_purpose::agree, 2));
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
  if (!problem.empty()) ringzero::detail::raise(comm_, errc::internal, "zero::sharded_model: " + problem);
  if (!verdict.empty()) ringzero::detail::raise(comm_, errc::internal, "zero::sharded_model: " + verdict);
}

inline void sharded_model::allocate() {
  const auto& buffers = plan_.buffers();
  const bool stage3 = plan_.stage() == 3, shard_grads = plan_.stage() >= 2;
  params_.reserve(buffers.size());
  grads_.reserve(buffers.size());
  for (const flat_buffer& f : buffers) {
    params_.emplace_back(make_buffer((stage3 ? f.shard_numel : f.numel) * dtype_size(f.type)));
    grads_.emplace_back(
        make_buffer(f.trainable ? (shard_grads ? f.shard_numel : f.numel) * dtype_size(f.gradient_type) : 0));
  }
  if (offload_) {  // master weights and states in host memory, with transfer buffers (attach made it)
    const primitive::memory_space space = offload_->space;
    optimizer_.emplace(plan_, shard_index_, options_.optimizer, [this, space](std::uint64_t bytes) {
      return detail::optimizer_offload::allocate(space, bytes, &memory_counter_);
    });
    offload_->allocate_buffers(plan_, &memory_counter_);
  } else {
    optimizer_.emplace(plan_, shard_index_, options_.optimizer,
                       [this](std::uint64_t bytes) { return make_buffer(bytes); });
  }
  if (options_.reproducible) reproducible_.emplace(plan_);
  scaler_ = loss_scaler(options_.loss_scaling);
  const std::size_t units = plan_.units().size();
  unit_gather_.assign(units, npos);
  unit_bucket_.assign(units, npos);
  gather_work_.resize(units);
  reduce_work_.resize(units);
  marked_.assign(plan_.trainable_storages().size(), false);
  // The pools at the size the plan predicts for the canonical order, so that a rank short of
  // memory fails here (where allocate_everywhere tells every rank) rather than at its first
  // pre_forward or gradient; they grow only for a trainer that visits units in another order.
  const communication_buffers& cb = plan_.communication();
  for (std::uint64_t i = 0; i < cb.gather_buffers; ++i) {
    gathers_buffers_.emplace_back(make_buffer(cb.gather_buffer_bytes));
    gather_free_.push_back(gathers_buffers_.size() - 1);
  }
  for (std::uint64_t i = 0; i < cb.gradient_buckets; ++i) {
    buckets_.emplace_back(make_buffer(cb.gradient_bucket_bytes));
    bucket_free_.push_back(buckets_.size() - 1);
  }
  if (comm_stream_) {
    step_scalars_ = make_buffer(sizeof(step_scalars));  // not model state: outside memory_in_use
    for (std::size_t u = 0; u < units; ++u) gathered_.push_back(compute_->make_event());
    for (std::size_t i = 0; i < gathers_buffers_.size(); ++i) gather_slot_free_.push_back(compute_->make_event());
    for (std::size_t i = 0; i < buckets_.size(); ++i) bucket_free_event_.push_back(compute_->make_event());
    // The trainer's first writes (gradients at stages 0-1) come after the zeroing.
    comm_stream_->record(*comm_mark_);
    compute_->wait(*comm_mark_);
  }
}

inline void sharded_model::launch_reduction(std::size_t u) {
  const int stage = plan_.stage();
  if (reproducible_) {  // deposit this micro-batch; the view of the next one starts at zero
    for (std::size_t b : plan_.units()[u].buffers) {
      const flat_buffer& f = plan_.buffers()[b];
      if (!f.trainable || f.numel == 0) continue;
      unsigned char* full = stage <= 1 ? grads_[b].data() : buckets_[unit_bucket_[u]].data() + f.gradient_offset;
      reproducible_->deposit(b, full);
      if (stage <= 1) std::memset(full, 0, static_cast<std::size_t>(f.numel * dtype_size(f.gradient_type)));
    }
    return;
  }
  if (comm_stream_) comm_waits_for_compute();  // the trainer's gradients are complete
  for (std::size_t b : plan_.units()[u].buffers) {
    const flat_buffer& f = plan_.buffers()[b];
    if (!f.trainable || f.numel == 0) continue;
    const std::uint64_t gs = dtype_size(f.gradient_type);
    const std::uint64_t own = static_cast<std::uint64_t>(shard_index_) * f.shard_numel * gs;
    unsigned char* full = stage <= 1 ? grads_[b].data() : buckets_[unit_bucket_[u]].data() + f.gradient_offset;
    if (comm_stream_) {  // the blocking collective, in order on the communication stream
      const collective_options tag = tagged(call_purpose::reduce, b);
      if (stage == 0)
        comm_stream_->collective(
            [this, full, &f, tag] { all_reduce(comm_, full, full, f.numel, f.gradient_type, reduce_kind::avg, tag); });
      else
        comm_stream_->collective([this, full, own, &f, tag] {
          reduce_scatter(comm_, full, full + own, f.shard_numel, f.gradient_type, reduce_kind::avg, tag);
        });
      continue;
    }
    if (stage == 0)
      reduce_work_[u].push_back(all_reduce_async(comm_, full, full, f.numel, f.gradient_type, reduce_kind::avg,
                                                 tagged(call_purpose::reduce, b)));
    else
      reduce_work_[u].push_back(reduce_scatter_async(comm_, full, full + own, f.shard_numel, f.gradient_type,
                                                     reduce_kind::avg, tagged(call_purpose::reduce, b)));
  }
}

inline void sharded_model::complete_reduction(std::size_t u) {
  auto& list = reduce_work_[u];
  for (const work& w : list) w.wait();
  list.clear();
  if (plan_.stage() < 2) return;
  if (reproducible_) {  // deposited in launch_reduction: only the bucket is released
    bucket_free_.push_back(unit_bucket_[u]);
    unit_bucket_[u] = npos;
    return;
  }
  unsigned char* bucket = buckets_[unit_bucket_[u]].data();
  for (std::size_t b : plan_.units()[u].buffers) {
    const flat_buffer& f = plan_.buffers()[b];
    if (!f.trainable || f.numel == 0) continue;
    const std::uint64_t gs = dtype_size(f.gradient_type);
    const unsigned char* src =
        bucket + f.gradient_offset + static_cast<std::uint64_t>(shard_index_) * f.shard_numel * gs;
    unsigned char* dst = grads_[b].data();
    if (comm_stream_) {  // the same sum (in float for 16-bit types), as stream work
      primitive::reduce_spec sum;
      sum.type = f.gradient_type;
      sum.kind = reduce_kind::sum;
      comm_stream_->reduce(dst, dst, src, f.shard_numel, sum);
      continue;
    }
    visit_dtype(f.gradient_type, [&]<class T>() {
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
        T* d = reinterpret_cast<T*>(dst);
        const T* s = reinterpret_cast<const T*>(src);
        for (std::uint64_t j = 0; j < f.shard_numel; ++j)
          d[j] = static_cast<T>(static_cast<float>(d[j]) + static_cast<float>(s[j]));
      }
    });
  }
  if (comm_stream_) comm_stream_->record(*bucket_free_event_[unit_bucket_[u]]);
  bucket_free_.push_back(unit_bucket_[u]);
  unit_bucket_[u] = npos;
}

inline void sharded_model::exchange_restorable_state(std::vector<detail::host_buffer>& held, sharded_optimizer& spare) {
  bool fits = held.size() == params_.size() && spare.options().kind == optimizer_->options().kind;
  for (std::size_t b = 0; fits && b < params_.size(); ++b) {
    fits = held[b].bytes() == params_[b].bytes() && spare.owned_range(b).begin == owned_range(b).begin &&
           spare.owned_range(b).end == owned_range(b).end &&
           (spare.master(b) == nullptr) == (optimizer_->master(b) == nullptr);
    for (int k = 0; fits && k < optimizer_->options().state_count(); ++k)
      fits = (spare.state(b, k) == nullptr) == (optimizer_->state(b, k) == nullptr);
  }
  if (!fits) raise("exchange_restorable_state: the spare state does not have this rank's layout");
  const double lr = optimizer_->options().lr;
  params_.swap(held);
  std::swap(*optimizer_, spare);
  optimizer_->set_learning_rate(lr);  // valid: it was this optimizer's rate
}

inline step_result sharded_model::update_owned_shards(double squares) {
  const auto& buffers = plan_.buffers();
  step_scalars decided;
  decided.squares = squares;
  decided.inverse_scale = scaler_.inverse_scale();
  detail::decide_step(decided, options_.max_grad_norm, skips_nonfinite());
  step_result r;
  r.gradient_norm = decided.gradient_norm;
  r.clip_coefficient = decided.clip_coefficient;
  scaler_.update(decided.skipped != 0);  // every rank decided alike (one global norm)
  if (decided.skipped != 0) {
    r.skipped = true;
    r.steps = optimizer_->steps();
    return r;
  }
  optimizer_->begin_step();
  for (std::size_t b = 0; b < buffers.size(); ++b)
    if (buffers[b].trainable)
      optimizer_->update(b, owned_parameters(b), owned_gradient(b), static_cast<float>(decided.gradient_multiplier));
  r.steps = optimizer_->steps();
  return r;
}

}  // namespace ringzero::zero
