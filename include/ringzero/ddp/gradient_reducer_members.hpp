#pragma once
/// @file
/// The longer members of `gradient_reducer` (the cross-rank agreement at construction, the end
/// of a step and `join`, the bucket layout, launching and completing buckets, the one rebuild),
/// defined out of the class. Included by ddp/gradient_reducer.hpp at its end; include that header, not this one.

#include "ringzero/ddp/gradient_reducer.hpp"

namespace ringzero::ddp {

namespace detail {

/// "[256, 784]" (empty shape: "[]").
inline std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

/// FNV-1a of the dimensions (cross-rank comparison of registered shapes).
inline std::uint64_t shape_hash(std::span<const std::uint64_t> shape) noexcept {
  ringzero::detail::fnv1a h;
  h.u64(shape.size());
  for (std::uint64_t d : shape) h.u64(d);
  return h.value();
}

}  // namespace detail

inline std::string gradient_reducer::validate_locally() const {
  if (options_.bucket_byte_limits.empty()) return "reducer_options::bucket_byte_limits is empty";
  if (!options_.hook->supports(comm_.space()))
    return "the communication hook '" + options_.hook->name() + "' does not support " +
           (comm_.space() == memory_space::cuda ? "CUDA device memory" : "host memory") +
           " (the communicator's buffers); override comm_hook::supports in a hook that does";
  const std::size_t a = options_.alignment_bytes;
  if (a == 0 || (a & (a - 1)) != 0)
    return "reducer_options::alignment_bytes = " + std::to_string(a) + " is not a power of two";
  if (options_.reproducible) {
    std::vector<dtype> types;
    std::vector<std::string> names;
    for (const auto& p : params_) {
      types.push_back(p.type);
      names.push_back(p.name);
    }
    std::string why = detail::reproducible_reducer_problem(comm_.space(), options_.hook->name(),
                                                           options_.divide_by_initial_world_size, types, names);
    if (!why.empty()) return why;
  }
  const bool need_data = options_.broadcast_parameters || options_.join;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const reducer_parameter& p = params_[i];
    if (!is_valid(p.type))
      return "parameter " + describe(i) + " has unknown dtype value " + std::to_string(static_cast<unsigned>(p.type));
    if (p.count > (std::uint64_t{1} << 60) / dtype_size(p.type))
      return "parameter " + describe(i) + " has " + std::to_string(p.count) + " elements: its size overflows";
    if (!p.shape.empty()) {
      std::uint64_t product = 1;
      bool overflow = false;
      for (std::uint64_t d : p.shape) {
        if (d == 0) {  // any dimension of 0: no elements, whatever the others
          product = 0;
          overflow = false;
          break;
        }
        overflow = overflow || product > ~std::uint64_t{0} / d;
        product *= d;
      }
      if (overflow || product != p.count)
        return "parameter " + describe(i) + " has shape " + detail::shape_text(p.shape) + " (" +
               (overflow ? std::string("overflowing") : std::to_string(product)) + " elements) but count " +
               std::to_string(p.count);
    }
    if (p.count == 0) continue;
    if (!options_.gradient_as_bucket_view && p.grad == nullptr)
      return "parameter " + describe(i) + " has a null gradient pointer (and gradient_as_bucket_view is off)";
    if (need_data && p.data == nullptr)
      return "parameter " + describe(i) +
             " has a null data pointer (needed to broadcast parameters; set broadcast_parameters = false and join = "
             "false to omit it)";
  }
  return {};
}

inline void gradient_reducer::check_agreement(const std::string& problem) {
  using shown = ringzero::detail::agreed_value::shown;
  ringzero::detail::fnv1a shapes, limits, flags;
  std::uint64_t total = 0;
  for (const auto& p : params_) {
    total += p.count;
    shapes.u64(p.count);
    shapes.u64(static_cast<std::uint64_t>(p.type));
    shapes.u64(detail::shape_hash(p.shape));
  }
  for (std::uint64_t l : options_.bucket_byte_limits) limits.u64(l);
  limits.u64(options_.alignment_bytes);
  const std::string hook = options_.hook->name();
  ringzero::detail::fnv1a hook_hash;
  hook_hash.text(hook);
  flags.u64((options_.find_unused_parameters ? 1u : 0u) | (options_.rebuild_buckets ? 2u : 0u) |
            (options_.broadcast_parameters ? 4u : 0u) | (options_.join ? 8u : 0u) |
            (options_.divide_by_initial_world_size ? 16u : 0u) | (options_.reproducible ? 32u : 0u));
  const std::vector<ringzero::detail::agreed_value> mine = {
      {"arguments valid", problem.empty() ? 1u : 0u, shown::flag},
      {"parameter count", params_.size(), shown::integer},
      {"total elements", total, shown::integer},
      {"parameter shapes (hash)", shapes.value(), shown::hash},
      {"bucket_byte_limits and alignment_bytes (hash)", limits.value(), shown::hash},
      {"options (hash)", flags.value(), shown::hash},
      {"communication hook (hash)", hook_hash.value(), shown::hash},
  };
  const std::size_t fields = mine.size();
  const std::vector<std::uint64_t> row = ringzero::detail::agreement_row(mine);
  std::vector<std::uint64_t> gathered(fields * static_cast<std::size_t>(comm_.world_size()));
  gather_to_host(row.data(), gathered.data(), fields, dtype::uint64);
  const ringzero::detail::agreement_table table(std::move(gathered), fields);

  if (const std::vector<int> bad = table.ranks_where_not(0, 1); !bad.empty()) {
    std::string msg = "gradient_reducer: invalid arguments on " + ringzero::detail::describe_ranks(bad);
    if (!problem.empty())
      msg += ": " + problem;
    else
      msg += " (see the error raised there)";
    raise(errc::invalid_argument, msg);
  }
  if (!table.same(1))
    raise(errc::contract_mismatch, "gradient_reducer: ranks registered different parameter sets: parameter count " +
                                       table.by_rank(1, mine[1]) + "; total elements " + table.by_rank(2, mine[2]));
  const int n = comm_.world_size();
  if (!table.same(2) || !table.same(3)) {
    // Same count: find the first parameter that differs (a second, equally sized collective).
    constexpr std::size_t per = 3;  // count, dtype, shape hash
    std::vector<std::uint64_t> shape(per * params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      shape[per * i] = params_[i].count;
      shape[per * i + 1] = static_cast<std::uint64_t>(params_[i].type);
      shape[per * i + 2] = detail::shape_hash(params_[i].shape);
    }
    std::vector<std::uint64_t> every(shape.size() * static_cast<std::size_t>(n));
    gather_to_host(shape.data(), every.data(), shape.size(), dtype::uint64);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto field = [&](int r, std::size_t f) {
        return every[static_cast<std::size_t>(r) * shape.size() + per * i + f];
      };
      bool shapes_differ = false;
      for (int r = 1; r < n; ++r) shapes_differ = shapes_differ || field(r, 2) != field(0, 2);
      std::vector<std::string> v(static_cast<std::size_t>(n));
      bool same = !shapes_differ;
      for (int r = 0; r < n; ++r) {
        std::string& t = v[static_cast<std::size_t>(r)];
        t = std::to_string(field(r, 0)) + " x " + std::string(dtype_name(static_cast<dtype>(field(r, 1))));
        if (shapes_differ) t += ", shape hash " + ringzero::detail::show({"", 0, shown::hash}, field(r, 2));
        if (r > 0 && t != v[0]) same = false;
      }
      if (!same)
        raise(errc::contract_mismatch,
              "gradient_reducer: ranks registered different parameter sets: parameter " + describe(i) + ": " +
                  ringzero::detail::describe_values(v) +
                  (shapes_differ ? " (this rank: shape " + detail::shape_text(params_[i].shape) + ")" : std::string()));
    }
  }
  if (!table.same(4))
    raise(errc::contract_mismatch,
          "gradient_reducer: ranks passed different bucket_byte_limits or alignment_bytes (hashes differ: " +
              table.by_rank(4, mine[4]) + ")");
  if (!table.same(6))
    raise(errc::contract_mismatch,
          "gradient_reducer: ranks use different communication hooks or hook settings (name hashes: " +
              table.by_rank(6, mine[6]) + "); this rank uses '" + hook + "'");
  if (!table.same(5))
    raise(errc::contract_mismatch,
          "gradient_reducer: ranks passed different options (find_unused_parameters, rebuild_buckets, "
          "broadcast_parameters, join, divide_by_initial_world_size or reproducible)");
}

inline void gradient_reducer::finish() {
  check_usable();
  if (!require_sync_) {
    if (options_.reproducible) end_reproducible_micro_step();
    ++stats_.local_steps;
    unsynced_marks_ = 0;
    accumulating_ = true;
    return;
  }
  if (!step_open_) open_step();
  // Parameters never marked ready.
  std::vector<std::size_t> missing;
  for (std::size_t k = params_.size(); k-- > 0;)
    if (!ready_[k]) missing.push_back(k);
  if (!missing.empty()) {
    if (!options_.find_unused_parameters) {
      if (missing.size() == params_.size() && unsynced_marks_ > 0)
        fail(errc::invalid_argument, "finish() in step " + std::to_string(step_) +
                                         ": no gradient was marked ready since gradient sync was "
                                         "turned back on, but " +
                                         std::to_string(unsynced_marks_) +
                                         " were marked under no_sync: call finish() "
                                         "inside the no_sync scope (or not at all) for accumulation micro-steps");
      std::string names;
      for (std::size_t k = 0; k < missing.size() && k < 8; ++k) names += (k ? ", " : "") + describe(missing[k]);
      if (missing.size() > 8) names += ", ... (" + std::to_string(missing.size()) + " in all)";
      fail(errc::invalid_argument,
           "finish() in step " + std::to_string(step_) + ": parameter(s) " + names +
               " were never marked ready, so bucket " + std::to_string(bucket_of_[missing.front()]) +
               " can never be reduced; mark every gradient ready, or set find_unused_parameters");
    }
    for (std::size_t k : missing) mark(k, /*zero=*/true);
  }
  if (next_launch_ != buckets_.size())
    fail(errc::internal, "finish(): " + std::to_string(buckets_.size() - next_launch_) + " bucket(s) not launched");
  resolve_agreement();
  wait_and_complete(/*shadow=*/false);
  if (rebuild_pending()) rebuild(/*have_order=*/true);
  close_step();
  unsynced_marks_ = 0;
  accumulating_ = false;
}

inline void gradient_reducer::join() {
  check_usable();
  if (!options_.join)
    fail(errc::invalid_argument,
         "join() needs reducer_options::join = true on every rank (ranks ran out of data at different steps)");
  if (step_open_ || (options_.reproducible && unsynced_marks_ > 0))
    fail(errc::invalid_argument, "join() called in the middle of a step (call finish() first)");
  // Reproducible mode: micro-batches of an unfinished accumulation window are dropped (a
  // joined rank contributes nothing), as plain mode never reduces such a window either.
  if (options_.reproducible) {
    reproducible_.clear();
    reproducible_micro_steps_ = 0;
  }
  accumulating_ = false;
  for (;;) {
    const int active = agree(/*active=*/false);
    if (active == 0) break;
    // Shadow one synchronised step with zero gradients.
    ++step_;
    zero_buckets();
    step_contributors_ = active;
    next_launch_ = 0;
    shadowing_ = true;
    while (next_launch_ < buckets_.size()) launch(next_launch_++);
    wait_and_complete(/*shadow=*/true);
    shadowing_ = false;
    if (rebuild_pending()) rebuild(/*have_order=*/false);
    zero_buckets();
    ++stats_.synchronized_steps;
  }
  // Every rank has joined. Make the models equal again: broadcast from a rank that took part
  // in the last synchronised step (every rank saw the same agreements, so all pick the same).
  if (last_trained_rank_ >= 0 && params_have_data()) broadcast_parameters(last_trained_rank_);
  if (options_.gradient_as_bucket_view) zero_buckets();
  last_trained_rank_ = -1;
}

inline void gradient_reducer::install_layout(const std::vector<bucket_plan>& plans, bool carry_gradients) {
  std::vector<bucket> fresh(plans.size());
  std::vector<std::size_t> bucket_of(params_.size());
  std::vector<std::uint64_t> offset_of(params_.size());
  for (std::size_t k = 0; k < plans.size(); ++k) {
    const bucket_plan& p = plans[k];
    bucket& b = fresh[k];
    const std::uint64_t es = dtype_size(p.type);
    const std::uint64_t align = std::max<std::uint64_t>(1, options_.alignment_bytes / es);
    std::uint64_t at = 0;
    for (std::size_t i : p.tensors) {
      at = (at + align - 1) / align * align;
      b.info.parameters.push_back(i);
      b.info.offsets.push_back(at);
      b.gradients.push_back({i, at, params_[i].count, params_[i].shape, params_[i].name});
      bucket_of[i] = k;
      offset_of[i] = at;
      at += params_[i].count;
    }
    b.info.type = p.type;
    b.info.count = at;
    b.info.bytes = p.bytes;
    b.info.limit_bytes = p.limit_bytes;
    b.bytes_allocated = static_cast<std::size_t>((at * es + 63) / 64 * 64);
    try {
      b.storage = memory_.allocate(b.bytes_allocated, &memory_counter_);  // zeroed: every page touched once, here
    } catch (const error& e) {
      raise(e.kind(), "gradient_reducer: cannot allocate " + std::to_string(b.bytes_allocated) + " bytes for bucket " +
                          std::to_string(k) + ": " + e.what());
    }
    b.pending = p.tensors.size();
  }
  if (carry_gradients) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::size_t es = dtype_size(params_[i].type);
      const bucket& ob = buckets_[bucket_of_[i]];
      const auto* src = static_cast<const std::byte*>(ob.storage.data()) + offset_of_[i] * es;
      auto* dst = static_cast<std::byte*>(fresh[bucket_of[i]].storage.data()) + offset_of[i] * es;
      memory_.copy(dst, src, static_cast<std::size_t>(params_[i].count) * es);
    }
  }
  if (!buckets_.empty()) memory_.synchronize();  // device: nothing in flight reads the old buckets any more
  buckets_ = std::move(fresh);
  bucket_of_ = std::move(bucket_of);
  offset_of_ = std::move(offset_of);
  if (options_.reproducible) {
    std::vector<std::uint64_t> counts;
    std::vector<dtype> types;
    for (const auto& b : buckets_) {
      counts.push_back(b.info.count);
      types.push_back(b.info.type);
    }
    reproducible_.reset_layout(counts, types, options_.reproducible_stage_bytes);
  }
}

inline std::string gradient_reducer::describe_bucket(std::size_t k) const {
  std::string s;
  const auto& ps = buckets_[k].info.parameters;
  for (std::size_t j = 0; j < ps.size() && j < 6; ++j) s += (j ? ", " : "") + describe(ps[j]);
  if (ps.size() > 6) s += ", ...";
  return s;
}

inline std::vector<unsigned char> gradient_reducer::read_values(std::size_t i) {
  check_usable();
  if (step_open_) fail(errc::invalid_argument, "read_values called in the middle of a step (call finish() first)");
  if (i >= params_.size())
    fail(errc::invalid_argument,
         "read_values: parameter " + std::to_string(i) + " of " + std::to_string(params_.size()));
  const reducer_parameter& p = params_[i];
  const std::size_t bytes = static_cast<std::size_t>(p.count) * dtype_size(p.type);
  if (p.data == nullptr && bytes != 0)
    fail(errc::invalid_argument, "read_values: parameter " + describe(i) + " was registered without values");
  std::vector<unsigned char> out(bytes);
  if (bytes == 0) return out;
  try {
    memory_.to_host(out.data(), p.data, bytes);
  } catch (const std::exception& e) { fail_from(e, "read_values: copying parameter " + describe(i) + " to the host"); }
  return out;
}

inline std::string gradient_reducer::name_bucket_tag(const void* self, std::uint64_t tag) noexcept {
  try {
    const auto& r = *static_cast<const gradient_reducer*>(self);
    const std::uint64_t k = tag ^ bucket_tag_base;
    if ((tag >> 48) != (bucket_tag_base >> 48) || k >= r.buckets_.size()) return {};
    return "all_reduce of bucket " + std::to_string(k) + " (parameters " +
           r.describe_bucket(static_cast<std::size_t>(k)) + ")";
  } catch (...) { return {}; }
}

inline collective_options gradient_reducer::bucket_options(std::size_t k) const noexcept {
  collective_options o;
  o.tag = bucket_tag_base | k;
  o.tag_name = tag_namer{&name_bucket_tag, this};
  return o;
}

inline gradient_bucket gradient_reducer::view_of(std::size_t k) {
  bucket& b = buckets_[k];
  gradient_bucket g;
  g.index = k;
  g.bucket_count = buckets_.size();
  g.options = bucket_options(k);
  g.data = b.storage.data();
  g.count = b.info.count;
  g.type = b.info.type;
  g.parameters = b.info.parameters;
  g.offsets = b.info.offsets;
  g.gradients = b.gradients;
  g.world_size = comm_.world_size();
  g.contributors = step_contributors_;
  g.divisor = options_.divide_by_initial_world_size ? comm_.world_size() : std::max(1, step_contributors_);
  g.local_contributes = !shadowing_;
  g.space = memory_.space();
  g.cuda_stream = memory_.stream();
  g.cuda_device = memory_.device();
  return g;
}

inline void gradient_reducer::launch(std::size_t k) {
  resolve_agreement();
  bucket& b = buckets_[k];
  if (options_.reproducible && one_contribution_each_) {
    // Every rank holds one micro-batch: the reproducible all_reduce of the bucket itself, the
    // same function of the same contributions as the accumulator's, asynchronous.
    if (options_.collect_timings) b.launched_at = clock::now();
    collective_options reproducible = bucket_options(k);
    reproducible.reproducible = true;
    try {
      (void)(b.pending_work = all_reduce_async(comm_, b.storage.data(), b.storage.data(), b.info.count, b.info.type,
                                               reduce_op(reduce_kind::avg), reproducible));
    } catch (const std::exception& e) {
      fail_from(e, "step " + std::to_string(step_) + ": the reproducible all_reduce of bucket " + std::to_string(k) +
                       " failed to launch");
    }
    return;
  }
  if (options_.reproducible) {
    // Several micro-batches: the reproducible average of the bucket's accumulator, issued as
    // soon as its last deposit is done, so that it overlaps the rest of backward.
    if (options_.collect_timings) b.launched_at = clock::now();
    try {
      (void)(b.pending_work = reproducible_.reduce_async(comm_, k, b.storage.data()));
    } catch (const std::exception& e) {
      fail_from(e, "step " + std::to_string(step_) + ": the reproducible average of bucket " + std::to_string(k) +
                       " (parameters " + describe_bucket(k) + ") failed to launch");
    }
    return;
  }
  if (options_.collect_timings) b.launched_at = clock::now();
  try {
    (void)(b.pending_work = options_.hook->launch(comm_, view_of(k)));
  } catch (const std::exception& e) {
    fail_from(e, "step " + std::to_string(step_) + ": the '" + options_.hook->name() +
                     "' hook failed to launch bucket " + std::to_string(k));
  }
}

inline void gradient_reducer::wait_and_complete(bool shadow) {
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    bucket& b = buckets_[k];
    const auto t0 = clock::now();
    try {
      detail::await_work(b.pending_work);
    } catch (const std::exception& e) {
      // Uneven inputs show as a collective mismatch (a peer already in another collective), a
      // peer that never arrives (timeout) or one that left; other failures (an abort caused by
      // a failing rank, bad arguments, a library error) carry their own cause, and the join
      // hint would mislead.
      const auto* re = dynamic_cast<const error*>(&e);
      const bool maybe_uneven = re == nullptr || re->kind() == errc::contract_mismatch || re->kind() == errc::timeout ||
                                re->kind() == errc::peer_exited || re->kind() == errc::size_mismatch;
      fail_from(e, "step " + std::to_string(step_) + ": reducing bucket " + std::to_string(k) + " (parameters " +
                       describe_bucket(k) + ") failed" +
                       (maybe_uneven ? std::string(". If ranks run different numbers of synchronised steps (uneven "
                                                   "inputs), enable reducer_options::join and call join() when a "
                                                   "rank runs out of data")
                                     : std::string()));
    }
    if (options_.collect_timings) {
      const auto done = b.pending_work.valid() ? b.pending_work.completion_time() : b.launched_at;
      add_interval(b.launched_at, done);
    }
    (void)(b.pending_work = work{});
    if (options_.reproducible) {
      reproducible_.finish(k);  // the collective averaged the bucket itself; its accumulator is free again
    } else {
      try {
        options_.hook->complete(view_of(k));
      } catch (const std::exception& e) {
        fail_from(e, "step " + std::to_string(step_) + ": the '" + options_.hook->name() +
                         "' hook failed to complete bucket " + std::to_string(k));
      }
    }
    // Exposed: the wait, and what the hook's completion did after it (a second round of
    // communication, as PowerSGD's, included).
    if (options_.collect_timings) stats_.exposed_seconds += std::chrono::duration<double>(clock::now() - t0).count();
    ++stats_.buckets_reduced;
    if (!shadow && !options_.gradient_as_bucket_view) {
      const std::size_t es = dtype_size(b.info.type);
      const auto* base = static_cast<const std::byte*>(b.storage.data());
      try {
        for (std::size_t j = 0; j < b.info.parameters.size(); ++j) {
          const reducer_parameter& p = params_[b.info.parameters[j]];
          if (p.count) memory_.copy(p.grad, base + b.info.offsets[j] * es, static_cast<std::size_t>(p.count) * es);
        }
      } catch (const std::exception& e) {
        fail_from(e, "step " + std::to_string(step_) + ": copying the averaged gradients out of bucket " +
                         std::to_string(k) + " failed");
      }
    }
  }
  flush_intervals();
}

inline void gradient_reducer::rebuild(bool have_order) {
  rebuilt_ = true;
  const std::size_t n = params_.size();
  const std::size_t width = n + 1;
  std::vector<std::int64_t> mine(width, -1);
  if (have_order && ready_order_.size() == n) {
    mine[0] = 1;
    for (std::size_t k = 0; k < n; ++k) mine[k + 1] = static_cast<std::int64_t>(ready_order_[k]);
  } else {
    mine[0] = 0;
  }
  std::vector<std::int64_t> all(width * static_cast<std::size_t>(comm_.world_size()));
  try {
    gather_to_host(mine.data(), all.data(), width, dtype::int64);
  } catch (const std::exception& e) {
    fail_from(e, "rebuilding the buckets after step " + std::to_string(step_) + " failed");
  }
  ready_order_.clear();
  ready_order_.shrink_to_fit();
  for (int r = 0; r < comm_.world_size(); ++r) {
    const std::int64_t* row = all.data() + static_cast<std::size_t>(r) * width;
    if (row[0] != 1) continue;
    std::vector<std::size_t> order(n);
    for (std::size_t k = 0; k < n; ++k) order[k] = static_cast<std::size_t>(row[k + 1]);
    std::vector<bucket_plan> plans;
    try {
      plans = plan(order);
    } catch (const std::exception& e) {
      fail_from(e, "rank " + std::to_string(r) + " recorded an invalid ready order");
    }
    bool same = plans.size() == buckets_.size();
    for (std::size_t k = 0; same && k < plans.size(); ++k) same = plans[k].tensors == buckets_[k].info.parameters;
    if (!same) {
      install_layout(plans, /*carry_gradients=*/options_.gradient_as_bucket_view);
      ++generation_;
      ++stats_.rebuilds;
    }
    return;
  }
}

}  // namespace ringzero::ddp
