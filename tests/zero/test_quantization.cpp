// Quantized communication (zero/quantization.hpp): the kernels against a reference written here
// (int8 and int4, float32 / bfloat16 / float16, blocks cut short, non-finite blocks, either
// launch order); the plan's bytes, staging buffer and refusals; and the runtime on 2-4 ranks:
// stage 3's gathered parameters are every shard quantized once and dequantized, the same on every
// rank; the reduced gradients are each contribution quantized once and added in float32 in rank
// order; the master shard stays in full precision; the bytes a step sends are the plan's; ranks
// that differ in their settings are refused on every rank.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "zero_test_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;
using namespace zero_test;

namespace {

/// The reference quantizer: one block of `x` (float values), int width `bits`, the values it
/// comes back as.
std::vector<float> q_reference_block(const std::vector<float>& x, quantized_bits bits) {
  const float most = bits == quantized_bits::int4 ? 7.0f : 127.0f;
  float amax = 0;
  bool nonfinite = false;
  for (float v : x) {
    if (!std::isfinite(v)) nonfinite = true;
    amax = std::max(amax, std::fabs(v));
  }
  const float scale = amax / most;
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (nonfinite) {
      out[i] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float q = scale > 0 ? std::clamp(std::nearbyint(x[i] / scale), -most, most) : 0.0f;
    out[i] = static_cast<float>(static_cast<int>(q)) * scale;  // an integer on the wire: no -0
  }
  return out;
}

/// `x` (one segment) quantized block by block and dequantized by the reference.
std::vector<float> q_reference(const std::vector<float>& x, quantized_bits bits, std::uint32_t block) {
  std::vector<float> out;
  for (std::size_t first = 0; first < x.size(); first += block) {
    const std::vector<float> part(
        x.begin() + static_cast<std::ptrdiff_t>(first),
        x.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(first + block, x.size())));
    for (float v : q_reference_block(part, bits)) out.push_back(v);
  }
  return out;
}

bool q_same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

template <class T>
std::vector<T> q_as(const std::vector<float>& v) {
  std::vector<T> out;
  for (float x : v) out.push_back(T(x));
  return out;
}

template <class T>
float q_float(T x) {
  return static_cast<float>(x);
}

}  // namespace

TEST_CASE("quantized layout: scales, integers and padding per segment") {
  CHECK(quantized_layout{quantized_bits::int8, 256, 1000, 1}.segment_bytes() == 4 * 4 + 1000);
  CHECK(quantized_layout{quantized_bits::int8, 256, 1001, 1}.segment_bytes() == 4 * 4 + 1004);
  CHECK(quantized_layout{quantized_bits::int4, 256, 1001, 3}.segment_bytes() == 4 * 4 + 504);
  CHECK(quantized_layout{quantized_bits::int4, 256, 1001, 3}.bytes() == 3 * (16 + 504));
  CHECK(quantized_layout{quantized_bits::int8, 8, 0, 2}.bytes() == 0);
  CHECK(valid_quantization_block(256));
  CHECK_FALSE(valid_quantization_block(100));
  CHECK_FALSE(valid_quantization_block(4));
  CHECK_FALSE(valid_quantization_block(1u << 17));
}

TEST_CASE_TEMPLATE("quantize and dequantize: the reference's values, either launch order", T, float, bfloat16,
                   float16) {
  for (quantized_bits bits : {quantized_bits::int8, quantized_bits::int4})
    for (std::uint64_t count : {1u, 7u, 8u, 37u, 300u, 1000u})
      for (std::uint32_t segments : {1u, 3u}) {
        CAPTURE(static_cast<int>(bits));
        CAPTURE(count);
        CAPTURE(segments);
        const std::uint32_t block = count > 100 ? 256 : 8;
        const quantized_layout l{bits, block, count, segments};
        std::vector<float> x(count * segments);
        for (std::size_t i = 0; i < x.size(); ++i)
          x[i] = static_cast<float>(static_cast<int>(mix(i + 77) % 2001) - 1000) / 97.0f * (i % 5 == 0 ? 3.0f : 1.0f);
        if (count == 37 && segments == 3)
          x[40] = std::numeric_limits<float>::infinity();  // segment 1, block 0 (elements 37-44)
        if (count == 300 && segments == 3) x[310] = std::numeric_limits<float>::quiet_NaN();  // segment 1, block 0
        const std::vector<T> in = q_as<T>(x);
        std::vector<unsigned char> wire(l.bytes(), 0xAB), wire_reversed(l.bytes(), 0xCD);
        REQUIRE(kernels::quantize_segments(primitive::kernels::host_launcher{}, l, in.data(), dtype_of<T>,
                                           wire.data()) == 0);
        REQUIRE(kernels::quantize_segments(primitive::kernels::host_launcher{4, true}, l, in.data(), dtype_of<T>,
                                           wire_reversed.data()) == 0);
        CHECK(wire == wire_reversed);                            // padding included: every byte on the wire is defined
        std::vector<unsigned char> wire_loops(l.bytes(), 0xEF);  // the host stream's plain loops
        REQUIRE(kernels::host_quantize_segments(l, in.data(), dtype_of<T>, wire_loops.data()) == 0);
        CHECK(wire == wire_loops);
        std::vector<T> out(x.size()), out_loops(x.size());
        REQUIRE(kernels::dequantize_segments(primitive::kernels::host_launcher{}, l, wire.data(), out.data(),
                                             dtype_of<T>) == 0);
        REQUIRE(kernels::host_dequantize_segments(l, wire.data(), out_loops.data(), dtype_of<T>, false, 0, nullptr) ==
                0);
        CHECK(std::memcmp(out.data(), out_loops.data(), out.size() * sizeof(T)) == 0);
        for (std::uint32_t s = 0; s < segments; ++s) {
          std::vector<float> seg;
          for (std::uint64_t i = 0; i < count; ++i) seg.push_back(q_float(in[s * count + i]));
          const std::vector<float> want = q_reference(seg, bits, block);
          for (std::uint64_t i = 0; i < count; ++i) {
            CAPTURE(s);
            CAPTURE(i);
            CHECK(q_same_bits(q_float(out[s * count + i]), q_float(T(want[i]))));
          }
        }
      }
}

TEST_CASE("quantize: the host loops' bytes are the kernels' at the ends of the float range") {
  // Blocks of 256 (the host loops' lanes and remainder) whose scales are subnormal, tiny, huge or
  // zero, with negative zeros and values near FLT_MAX: the host loops round by adding 1.5 * 2^23,
  // exact only while |x / scale| < 2^22, and the kernels divide and round directly.
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> magnitudes = {tiny,       2 * tiny,   3 * tiny, 10 * tiny, 127 * tiny,
                                         200 * tiny, 255 * tiny, 1e-42f,   3e-39f,    std::numeric_limits<float>::min(),
                                         1.0f,       1e30f,      big};
  for (quantized_bits bits : {quantized_bits::int8, quantized_bits::int4})
    for (float amax : magnitudes) {
      CAPTURE(static_cast<int>(bits));
      CAPTURE(amax);
      const quantized_layout l{bits, 256, 256 * 3 + 21, 2};
      std::vector<float> x(l.count * l.segments);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const float fraction = static_cast<float>(mix(i + 5) % 1001) / 1000.0f;  // 0 to 1
        x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (i % 7 == 0 ? amax : amax * fraction);
      }
      x[3] = -0.0f;
      for (std::size_t i = 256; i < 512; ++i) x[i] = i % 2 ? 0.0f : -0.0f;  // segment 0, block 1: scale 0
      std::vector<unsigned char> wire(l.bytes(), 0xAB), wire_loops(l.bytes(), 0xEF);
      REQUIRE(kernels::quantize_segments(primitive::kernels::host_launcher{}, l, x.data(), dtype::float32,
                                         wire.data()) == 0);
      REQUIRE(kernels::host_quantize_segments(l, x.data(), dtype::float32, wire_loops.data()) == 0);
      CHECK(wire == wire_loops);
      std::vector<float> out(x.size()), out_loops(x.size());
      REQUIRE(kernels::dequantize_segments(primitive::kernels::host_launcher{}, l, wire.data(), out.data(),
                                           dtype::float32) == 0);
      REQUIRE(kernels::host_dequantize_segments(l, wire.data(), out_loops.data(), dtype::float32, false, 0, nullptr) ==
              0);
      CHECK(std::memcmp(out.data(), out_loops.data(), out.size() * sizeof(float)) == 0);
      const std::vector<float> want = q_reference(std::vector<float>(x.begin(), x.begin() + 256), bits, 256);
      for (std::size_t i = 0; i < 256; ++i) {
        CAPTURE(i);
        CHECK(q_same_bits(out[i], want[i]));
      }
    }
}

TEST_CASE("dequantize into the average: own values unquantized, float32 sums in rank order") {
  // Blocks of 8 run the host loops' remainders only; blocks of 256 their lanes too.
  for (const quantized_bits bits : {quantized_bits::int8, quantized_bits::int4})
    for (const auto& [block, count] : {std::pair<std::uint32_t, std::uint64_t>{8, 21}, {256, 600}}) {
      CAPTURE(block);
      CAPTURE(static_cast<int>(bits));
      const quantized_layout l{bits, block, count, 4};
      const std::size_t per_rank = 4 * count;          // each rank's 4 segments
      std::vector<float> contributions(4 * per_rank);  // 4 ranks
      for (std::size_t i = 0; i < contributions.size(); ++i)
        contributions[i] = static_cast<float>(static_cast<int>(mix(i) % 1001) - 500) / 33.0f;
      for (std::uint32_t own = 0; own < 4; ++own) {
        std::vector<unsigned char> recv(l.bytes());
        for (std::uint32_t r = 0; r < 4; ++r) {  // segment r of recv: rank r's quantized segment `own`
          std::vector<unsigned char> wire(l.bytes());
          REQUIRE(kernels::quantize_segments(primitive::kernels::host_launcher{}, l, &contributions[r * per_rank],
                                             dtype::float32, wire.data()) == 0);
          std::memcpy(&recv[r * l.segment_bytes()], &wire[own * l.segment_bytes()], l.segment_bytes());
        }
        const auto segment_of = [&](std::uint32_t r) {
          const auto first = contributions.begin() + static_cast<std::ptrdiff_t>(r * per_rank + own * count);
          return std::vector<float>(first, first + static_cast<std::ptrdiff_t>(count));
        };
        std::vector<float> mine = segment_of(own);
        std::vector<float> loops = mine;
        REQUIRE(kernels::dequantize_segments(primitive::kernels::host_launcher{}, l, recv.data(), mine.data(),
                                             dtype::float32, true, own, mine.data()) == 0);
        REQUIRE(kernels::host_dequantize_segments(l, recv.data(), loops.data(), dtype::float32, true, own,
                                                  loops.data()) == 0);
        CHECK(std::memcmp(mine.data(), loops.data(), mine.size() * sizeof(float)) == 0);
        for (std::uint64_t e = 0; e < count; ++e) {
          float acc = 0;
          for (std::uint32_t r = 0; r < 4; ++r) {
            const std::vector<float> seg = segment_of(r);
            acc += r == own ? seg[e] : q_reference(seg, l.bits, l.block_size)[e];
          }
          CHECK(q_same_bits(mine[e], acc / 4.0f));
        }
      }
    }
}

TEST_CASE("quantization kernels refuse what they cannot do") {
  const quantized_layout l{quantized_bits::int8, 8, 16, 2};
  std::vector<double> x(32);
  std::vector<unsigned char> wire(l.bytes());
  CHECK(kernels::quantize_segments(primitive::kernels::host_launcher{}, l, x.data(), dtype::float64, wire.data()) ==
        primitive::kernels::launch_invalid_value);
  CHECK(kernels::dequantize_segments(primitive::kernels::host_launcher{}, l, wire.data(), x.data(), dtype::int32) ==
        primitive::kernels::launch_invalid_value);
  std::vector<float> y(16);
  CHECK(kernels::dequantize_segments(primitive::kernels::host_launcher{}, l, wire.data(), y.data(), dtype::float32,
                                     true, 2, y.data()) == primitive::kernels::launch_invalid_value);
  CHECK(kernels::host_quantize_segments(l, x.data(), dtype::float64, wire.data()) ==
        primitive::kernels::launch_invalid_value);
  CHECK(kernels::host_dequantize_segments(l, wire.data(), y.data(), dtype::float32, true, 2, y.data()) ==
        primitive::kernels::launch_invalid_value);
}

namespace {

plan_request q_request(int stage, int world, communication_quantization qz) {
  plan_request q;
  q.parameters = test_parameters();
  q.stage = stage;
  q.world_size = world;
  q.alignment_bytes = 16;
  q.quantization = qz;
  q.precision.optimizer_states = 0;  // SGD without momentum
  return q;
}

/// Gradient element j of storage p on rank r (written once per step).
float q_gradient(int rank, std::size_t p, std::uint64_t j) {
  return static_cast<float>(static_cast<int>(mix(static_cast<std::uint64_t>(rank) * 1000003 + p * 1009 + j) % 2001) -
                            1000) /
         256.0f;
}

/// Buffer b's flat values (padding zero) with `value(p, j)` at each storage's placement.
template <class F>
std::vector<float> q_flat(const shard_plan& plan, std::size_t b, F value) {
  std::vector<float> flat(plan.buffers()[b].numel, 0.0f);
  for (std::size_t p : plan.buffers()[b].parameters)
    for (std::uint64_t j = 0; j < plan.placements()[p].numel; ++j) flat[plan.placements()[p].offset + j] = value(p, j);
  return flat;
}

/// Shard s of `flat` (shard_numel elements).
std::vector<float> q_shard(const std::vector<float>& flat, const flat_buffer& f, int s) {
  const auto first = static_cast<std::ptrdiff_t>(f.shard(s).begin);
  return {flat.begin() + first, flat.begin() + first + static_cast<std::ptrdiff_t>(f.shard_numel)};
}

struct q_outcome {
  std::vector<std::vector<float>> gathered;  // per parameter, the stage-3 view in forward
  std::vector<std::vector<float>> after;     // per parameter, read_parameter after one step
  bool memory_as_planned = false;            // communication buffers (staging included) = the plan's
  bool held_read_full = true;                // read_parameter during forward gave the full-precision values
};

/// One SGD step (lr 1) of the test model with q_gradient, reading stage 3's gathered views.
q_outcome q_run(sharded_model& model, int rank) {
  const shard_plan& plan = model.plan();
  set_initial_parameters(model);
  q_outcome out;
  out.gathered.resize(plan.parameters().size());
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    model.pre_forward(u);
    if (plan.stage() == 3) {
      for (std::size_t p : plan.units()[u].members) {
        auto v = model.parameter<float>(p);
        out.gathered[p].assign(v.begin(), v.end());
      }
      // read_parameter of a held unit: full precision, and no gather slot more in the pool.
      const std::size_t p = plan.units()[u].members.front();
      const std::uint64_t before = model.memory_in_use().communication_buffers;
      std::vector<float> v(plan.placements()[p].numel);
      model.read_parameter(p, v);
      for (std::size_t j = 0; j < v.size(); ++j)
        if (v[j] != initial_value(plan.placements()[p].storage, j)) out.held_read_full = false;
      if (model.memory_in_use().communication_buffers != before) out.held_read_full = false;
    }
    model.post_forward(u);
  }
  for (std::size_t u = model.unit_count(); u-- > 0;) {
    model.pre_backward(u);
    for (std::size_t p : plan.units()[u].members) {
      const parameter_placement& pl = plan.placements()[p];
      if (pl.alias || pl.unit != u || !plan.parameters()[p].trainable) continue;
      auto g = model.gradient<float>(p);
      for (std::uint64_t j = 0; j < g.size(); ++j) g[j] += q_gradient(rank, p, j);
    }
    model.post_backward(u);
  }
  model.end_backward();
  model.step();
  for (std::size_t p = 0; p < plan.parameters().size(); ++p) {
    std::vector<float> v(plan.placements()[p].numel);
    model.read_parameter(p, v);
    out.after.push_back(std::move(v));
  }
  out.memory_as_planned = model.memory_in_use().communication_buffers == plan.memory().communication_buffers &&
                          model.memory_in_use(primitive::memory_space::host).communication_buffers ==
                              plan.device_memory().communication_buffers;
  return out;
}

sharded_model_options q_sgd() {
  sharded_model_options o;
  o.optimizer.kind = optimizer_kind::sgd;
  o.optimizer.lr = 1;
  return o;
}

}  // namespace

TEST_CASE("quantized runtime: stage 3's gathers and the gradient reduction are the reference's, bit for bit") {
  // Per world size 2-4, stage 1-3, widths: every rank's gathered views are the reference's
  // quantization of each shard (identical on every rank); the parameters after one SGD step (lr 1)
  // are w - (own gradient + the others' quantized gradients, in rank order) / n, read in full
  // precision: the quantized weights never reach the master shard.
  for (int world : {2, 3, 4})
    for (int stage : {1, 2, 3})
      for (quantized_bits weights : {quantized_bits::none, quantized_bits::int8, quantized_bits::int4})
        for (quantized_bits gradients : {quantized_bits::none, quantized_bits::int8, quantized_bits::int4}) {
          if ((weights != quantized_bits::none && stage != 3) || (!(weights == gradients) && world != 3)) continue;
          CAPTURE(world);
          CAPTURE(stage);
          CAPTURE(quantized_bits_name(weights));
          CAPTURE(quantized_bits_name(gradients));
          const communication_quantization qz{weights, gradients, 8};
          std::vector<q_outcome> outcomes(static_cast<std::size_t>(world));
          std::vector<traffic_counts> seen(static_cast<std::size_t>(world));
          local::launch(world, [&](communicator& comm) {
            comm.set_forced_algorithm(algorithm::ring);
            sharded_model model(comm, q_request(stage, world, qz), q_sgd());
            const traffic_counts before = comm.traffic();
            outcomes[static_cast<std::size_t>(comm.rank())] = q_run(model, comm.rank());
            seen[static_cast<std::size_t>(comm.rank())] = comm.traffic() - before;
          });
          const shard_plan plan(q_request(stage, world, qz));
          for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
            const flat_buffer& f = plan.buffers()[b];
            if (f.numel == 0) continue;
            CAPTURE(b);
            const std::vector<float> w =
                q_flat(plan, b, [](std::size_t p, std::uint64_t j) { return initial_value(p, j); });
            std::vector<float> gathered = w, updated = w;
            for (int s = 0; s < world; ++s) {
              const auto first = f.shard(s).begin;
              if (weights != quantized_bits::none) {
                const std::vector<float> back = q_reference(q_shard(w, f, s), weights, 8);
                std::copy(back.begin(), back.end(), gathered.begin() + static_cast<std::ptrdiff_t>(first));
              }
              if (!f.trainable) continue;
              std::vector<float> acc(f.shard_numel, 0.0f);
              for (int r = 0; r < world; ++r) {
                const std::vector<float> mine =
                    q_shard(q_flat(plan, b, [r](std::size_t p, std::uint64_t j) { return q_gradient(r, p, j); }), f, s);
                const std::vector<float> sent =
                    gradients == quantized_bits::none || r == s ? mine : q_reference(mine, gradients, 8);
                for (std::uint64_t e = 0; e < f.shard_numel; ++e) acc[e] += sent[e];
              }
              if (gradients != quantized_bits::none)
                for (std::uint64_t e = 0; e < f.shard_numel; ++e)
                  updated[first + e] -= acc[e] / static_cast<float>(world);
            }
            for (std::size_t p : f.parameters)
              for (std::uint64_t j = 0; j < plan.placements()[p].numel; ++j) {
                CAPTURE(plan.parameters()[p].name);
                CAPTURE(j);
                for (const q_outcome& o : outcomes) {
                  CHECK(o.memory_as_planned);
                  CHECK(o.held_read_full);
                  if (stage == 3) CHECK(q_same_bits(o.gathered[p][j], gathered[plan.placements()[p].offset + j]));
                  if (gradients != quantized_bits::none || !f.trainable)
                    CHECK(q_same_bits(o.after[p][j], updated[plan.placements()[p].offset + j]));
                }
              }
          }
          // The bytes sent: the plan's traffic (ring: volume (n-1)/n on each rank) plus the step's
          // agreement record (3 uint64) and global norm, the quantized collectives counted in segments.
          const auto n = static_cast<std::uint64_t>(world);
          std::uint64_t sent = 0, received = 0, planned = n * (n - 1) * 24 + 2 * (n - 1) * 8;
          for (const traffic_counts& t : seen) {
            sent += t.total().sent;
            received += t.total().received;
          }
          for (const traffic_entry& e : plan.traffic()) planned += e.volume_bytes() * (n - 1);
          // read_parameter after the step (stage 3): a full-precision all_gather of each parameter's buffer
          if (stage == 3) {
            for (const parameter_placement& pl : plan.placements())
              planned += plan.buffers()[pl.buffer].numel * 4 * (n - 1);
            // and during forward the first member of each unit: gathered again (held units are
            // read from their slot unless quantized)
            if (weights != quantized_bits::none)
              for (const gather_unit& u : plan.units())
                planned += plan.buffers()[plan.placements()[u.members.front()].buffer].numel * 4 * (n - 1);
          }
          CHECK(sent == planned);
          CHECK(received == sent);
        }
}

TEST_CASE("quantized plan: bytes per step with and without, the staging buffer, memory") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    // Untied, so that each buffer is gathered once before forward and once before backward.
    plan_request q = q_request(3, world, {});
    for (parameter_spec& p : q.parameters) p.tie_group.clear();
    const shard_plan full(q);
    q.quantization = {quantized_bits::int8, quantized_bits::int4, 8};
    const shard_plan quantized(q);
    REQUIRE(full.traffic().size() == quantized.traffic().size());
    std::uint64_t staging = 0;
    for (std::size_t i = 0; i < full.traffic().size(); ++i) {
      const traffic_entry& a = full.traffic()[i];
      const traffic_entry& e = quantized.traffic()[i];
      CAPTURE(e.purpose);
      CHECK(e.unquantized_bytes == a.bytes);
      CHECK(a.unquantized_bytes == a.bytes);
      CHECK(e.elements == a.elements);
      CHECK(e.calls == a.calls);
      const bool gradients = e.purpose == "gradients";
      CHECK(e.quantized == (gradients ? quantized_bits::int4 : quantized_bits::int8));
      CHECK(e.collective == (gradients ? collective_kind::all_to_all : collective_kind::all_gather));
      // The segments: per buffer (and call), shards x (scales + integers, padded to 4 bytes).
      std::uint64_t bytes = 0;
      for (const flat_buffer& f : quantized.buffers()) {
        if (f.numel == 0 || (gradients && !f.trainable)) continue;
        const std::uint64_t n = f.shard_numel, blocks = (n + 7) / 8;
        const std::uint64_t segment = (blocks * 4 + (gradients ? (n + 1) / 2 : n) + 3) / 4 * 4;
        bytes += segment * static_cast<std::uint64_t>(world);
        staging = std::max(staging, segment * static_cast<std::uint64_t>(world) * (gradients ? 2 : 1));
      }
      CHECK(e.bytes == bytes);
    }
    CHECK(quantized.communication().quantization_bytes == staging);
    CHECK(quantized.memory().communication_buffers == full.memory().communication_buffers + staging);
    CHECK(quantized.fingerprint() != full.fingerprint());
    CHECK(full.communication().quantization_bytes == 0);
  }
  // A shard group of one rank sends nothing: nothing is quantized, no staging buffer.
  const shard_plan alone(q_request(3, 1, {quantized_bits::int8, quantized_bits::int8, 8}));
  CHECK(alone.request().quantization.weights == quantized_bits::none);
  CHECK(alone.communication().quantization_bytes == 0);
  // At 256 elements per block the int8 wire is 1 + 4/256 bytes per element: 3.94x below float32.
  plan_request big = q_request(3, 4, {quantized_bits::int8, quantized_bits::int8, 256});
  big.parameters = {make_spec("w", {4096, 1024}, "a"), make_spec("v", {4096, 1024}, "b")};
  const shard_plan plan(big);
  for (const traffic_entry& e : plan.traffic())
    CHECK(static_cast<double>(e.unquantized_bytes) / static_cast<double>(e.bytes) ==
          doctest::Approx(4.0 / (1 + 4.0 / 256)));
}

TEST_CASE("quantization refusals: the plan, reproducible mode, ranks that differ") {
  auto refused = [](plan_request q, const std::string& text) {
    try {
      const shard_plan plan(std::move(q));
      FAIL("expected a refusal mentioning: " << text);
    } catch (const error& e) {
      INFO(e.what());
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  refused(q_request(3, 2, {quantized_bits::int8, quantized_bits::none, 100}),
          "the quantization block size must be a power of two from 8 to 65536, got 100");
  refused(q_request(3, 2, {quantized_bits::none, quantized_bits::int4, 4}), "got 4");
  refused(q_request(2, 2, {quantized_bits::int8, quantized_bits::none, 256}),
          "quantized weights (int8) need stage 3, whose all_gathers they apply to; the stage is 2");
  refused(q_request(0, 2, {quantized_bits::none, quantized_bits::int8, 256}),
          "quantized gradients (int8) need stage 1, 2 or 3");
  refused(q_request(3, 2, {static_cast<quantized_bits>(3), quantized_bits::none, 256}),
          "quantization widths must be none, int8 or int4, got values 3 (weights)");
  plan_request ints = q_request(3, 2, {quantized_bits::int8, quantized_bits::none, 256});
  ints.parameters.push_back(make_spec("steps", {4}, "u3", false));
  ints.parameters.back().type = dtype::int32;
  refused(ints, "quantized weights need float32, bfloat16 or float16 parameters; parameter 'steps' is int32");
  plan_request doubles = q_request(2, 2, {quantized_bits::none, quantized_bits::int8, 256});
  doubles.precision.gradient = dtype::float64;
  refused(doubles, "quantized gradients need float32, bfloat16 or float16 gradients");

  // Reproducible mode, and ranks with different settings: refused on every rank, naming the setting.
  std::vector<std::string> errors(2);
  local::launch(2, [&](communicator& comm) {
    sharded_model_options o = q_sgd();
    o.reproducible = true;
    try {
      sharded_model model(comm, q_request(2, 2, {quantized_bits::none, quantized_bits::int8, 256}), o);
    } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  for (const std::string& e : errors)
    CHECK(e.find("quantized gradients (int8) are refused with it") != std::string::npos);
  local::launch(2, [&](communicator& comm) {
    sharded_model_options o = q_sgd();
    o.reproducible = true;
    try {
      sharded_model model(comm, q_request(3, 2, {quantized_bits::int4, quantized_bits::none, 256}), o);
      errors[static_cast<std::size_t>(comm.rank())].clear();
    } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  for (const std::string& e : errors)
    CHECK(e.find("quantized weights (int4), whose blocks start at each shard, are refused with it") !=
          std::string::npos);
  local::launch(2, [&](communicator& comm) {
    const quantized_bits w = comm.rank() == 0 ? quantized_bits::int8 : quantized_bits::int4;
    try {
      sharded_model model(comm, q_request(3, 2, {w, quantized_bits::none, 256}), q_sgd());
      errors[static_cast<std::size_t>(comm.rank())].clear();
    } catch (const error& e) { errors[static_cast<std::size_t>(comm.rank())] = e.what(); }
  });
  for (const std::string& e : errors) {
    INFO(e);
    CHECK(e.find("the ranks differ in quantization.weights: rank 0: int8; rank 1: int4") != std::string::npos);
  }
}
