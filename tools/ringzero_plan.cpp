// ringzero-plan: plans ZeRO stage 0-3 for a model without any hardware and prints the per-rank
// memory by category, the per-step traffic by collective, how the plan compares with the ZeRO
// paper's model, and whether it fits in a GPU's memory.
//
//   ringzero-plan --model gpt2-xl --world-size 64 --stage 3 --gpu-memory 80GiB
//   ringzero-plan --model llama-7b --world-size 1024 --replica-group-size 8 --precision bf16
//   ringzero-plan --model-file model.json --world-size 8 --json
//
// A model file is a JSON list of parameters (or an object with a "parameters" list), each
//   {"name": "h.0.attn.c_attn.weight", "shape": [768, 2304],
//    "dtype": "bfloat16", "trainable": true, "tie": "wte", "unit": "h.0"}
// where only name and shape are required. Exit status: 0 on success (whether or not the plan
// fits), 1 on a bad model or plan request, 2 on bad command-line usage.

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/zero/model_presets.hpp"
#include "ringzero/zero/paper_comparison.hpp"
#include "ringzero/zero/shard_plan.hpp"

namespace {

using ringzero::dtype;
using ringzero::zero::parameter_spec;
using ringzero::zero::shard_plan;

/// A failure the user can fix (bad file, bad value): printed as "ringzero-plan: error: ...".
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// "1,557,611,200".
std::string grouped(std::uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

/// "74.25 GiB", "512 B": bytes in the largest binary unit that keeps the value >= 1.
std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

/// The largest byte count, as the messages print it.
const std::string max_bytes_text = std::to_string(std::numeric_limits<std::uint64_t>::max()) + " bytes";

/// `text` as a whole number when it is nothing but decimal digits (exact up to 2^64 - 1),
/// std::nullopt when it is something else; a digit string above 2^64 - 1 is refused, naming
/// `option` and its value `given` (`text` itself unless it is part of a longer value).
std::optional<std::uint64_t> parse_digits(const std::string& text, const std::string& option,
                                          const std::string& given) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range)
    throw usage_error(option + " '" + given + "' does not fit in 64 bits (at most " + max_bytes_text + ")");
  return value;
}

/// Parses the value `text` of `option`: "80GiB", "40 GB", "1.5e9", "512MiB", "4096" (bytes;
/// decimal and binary suffixes). A whole number with an integer scale is exact; a fraction or an
/// exponent is rounded to the nearest byte. A value that is negative, not finite, or does not fit
/// in 64 bits is refused, naming the option and the value as given.
std::uint64_t parse_bytes(const std::string& text, const std::string& option) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw usage_error("cannot read a size from " + option + " '" + text + "' (examples: 80GiB, 40GB, 4096)");
  }
  std::string suffix;
  for (std::size_t i = used; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  const std::pair<const char*, std::uint64_t> table[] = {{"", 1},
                                                         {"b", 1},
                                                         {"kb", 1000},
                                                         {"mb", 1000000},
                                                         {"gb", 1000000000},
                                                         {"tb", 1000000000000},
                                                         {"k", 1ull << 10},
                                                         {"kib", 1ull << 10},
                                                         {"m", 1ull << 20},
                                                         {"mib", 1ull << 20},
                                                         {"g", 1ull << 30},
                                                         {"gib", 1ull << 30},
                                                         {"t", 1ull << 40},
                                                         {"tib", 1ull << 40}};
  for (const auto& [name, scale] : table) {
    if (suffix != name) continue;
    const std::string too_large = option + " '" + text + "' does not fit in 64 bits (at most " + max_bytes_text + ")";
    // The number without its unit and surrounding blanks: digits only is read exactly.
    std::string number = text.substr(0, used);
    number.erase(0, number.find_first_not_of(" \t\n\r\f\v"));
    if (const auto whole = parse_digits(number, option, text)) {
      const std::optional<std::uint64_t> bytes = ringzero::detail::checked_mul(*whole, scale);
      if (!bytes) throw usage_error(too_large);
      return *bytes;
    }
    if (!std::isfinite(value)) throw usage_error(option + " '" + text + "' is not a finite size");
    if (value < 0) throw usage_error(option + " '" + text + "' is negative");  // before rounding: -0.4 rounds to -0
    const double bytes = std::round(value * static_cast<double>(scale));
    if (bytes >= 0x1p64) throw usage_error(too_large);
    return static_cast<std::uint64_t>(bytes);  // exact: a double below 2^64 that is a whole number
  }
  throw usage_error("unknown size unit '" + suffix + "' in " + option + " '" + text +
                    "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

/// The dtypes the messages suggest.
constexpr const char* dtype_examples = "float32, bfloat16, float16, float64, int8, ...";

dtype parse_type(const std::string& text, const std::string& what) {
  if (auto t = ringzero::parse_dtype(text)) return *t;
  throw usage_error("unknown " + what + " dtype '" + text + "' (" + dtype_examples + ")");
}

/// The contents of the model file `path`, which must be a regular file. The file is opened
/// without blocking, so a FIFO or a device is refused at once instead of waiting for a writer.
std::string read_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw usage_error("cannot open model file '" + path + "': " + std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw usage_error("cannot read model file '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw usage_error("model file '" + path + "' is not a regular file");
  std::string text;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw usage_error("cannot read model file '" + path + "': " + std::strerror(errno));
    }
    text.append(chunk, static_cast<std::size_t>(n));
  }
  return text;
}

/// The deepest nesting of arrays and objects a model file may use. A model needs 4 (an object,
/// its "parameters" list, a parameter, its shape); the bound refuses a file nested thousands of
/// levels deep before anything recursive (nlohmann's dump, its destructor) sees it.
constexpr int max_model_file_depth = 64;

/// The most characters of a value from the model file that a message quotes.
constexpr std::size_t max_quoted_chars = 80;

/// `text` cut to at most `limit` bytes (at a UTF-8 character boundary) and "..." when longer: a
/// message quotes a value from the file without growing with it.
std::string shortened(const std::string& text, std::size_t limit = max_quoted_chars) {
  if (text.size() <= limit) return text;
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a continuation byte
  return text.substr(0, cut) + "...";
}

/// Builds the document of a model file from nlohmann's SAX events in one linear pass, refusing
/// a key given twice in one object (JSON leaves it undefined which one counts) and nesting
/// deeper than max_model_file_depth. (nlohmann::json::parse with a callback ran in time
/// quadratic in the parameters: its end_object searched the whole enclosing list each time.)
class model_document_builder : public nlohmann::json_sax<nlohmann::json> {
 public:
  nlohmann::json document;
  /// Why the parse stopped (refused or invalid JSON), empty while it goes on.
  std::string problem;

  explicit model_document_builder(const std::string& path) : path_(path) {}

  bool null() override { return add(nullptr); }
  bool boolean(bool v) override { return add(v); }
  bool number_integer(number_integer_t v) override { return add(v); }
  bool number_unsigned(number_unsigned_t v) override { return add(v); }
  bool number_float(number_float_t v, const string_t&) override { return add(v); }
  bool string(string_t& v) override { return add(std::move(v)); }
  bool binary(binary_t& v) override { return add(nlohmann::json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(nlohmann::json::object()); }
  bool start_array(std::size_t) override { return open(nlohmann::json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    if (open_.back()->contains(k)) {
      problem = "model file '" + path_ + "' gives the key '" + shortened(k) + "' twice in one object";
      return false;
    }
    key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) override {
    // nlohmann's message quotes the last token read, which may be a whole string of the file.
    problem = "model file '" + path_ + "' is not valid JSON: " + shortened(e.what(), 2 * max_quoted_chars);
    return false;
  }

 private:
  std::string path_;
  std::vector<nlohmann::json*> open_;  // the arrays and objects being filled, innermost last
  std::string key_;                    // the key of the next value of the innermost object

  /// Places `v` in the innermost open array or object (or as the document) and returns it.
  nlohmann::json* place(nlohmann::json&& v) {
    if (open_.empty()) {
      document = std::move(v);
      return &document;
    }
    nlohmann::json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    nlohmann::json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }

  bool add(nlohmann::json&& v) {
    place(std::move(v));
    return true;
  }

  // A pointer into the parent stays valid: only the innermost array or object grows.
  bool open(nlohmann::json&& empty) {
    if (open_.size() >= static_cast<std::size_t>(max_model_file_depth)) {
      problem = "model file '" + path_ + "' nests arrays and objects more than " +
                std::to_string(max_model_file_depth) + " levels deep (a model file needs at most 4)";
      return false;
    }
    open_.push_back(place(std::move(empty)));
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }
};

/// Reads a model file (see the file comment). A key given twice in one object is refused (JSON
/// leaves it undefined which one counts), and so is nesting deeper than max_model_file_depth.
std::vector<parameter_spec> read_model_file(const std::string& path) {
  const std::string text = read_regular_file(path);
  model_document_builder builder(path);
  if (!nlohmann::json::sax_parse(text, &builder))
    throw usage_error(builder.problem.empty() ? "model file '" + path + "' is not valid JSON" : builder.problem);
  const nlohmann::json& doc = builder.document;
  const nlohmann::json* list = &doc;
  if (doc.is_object()) {
    if (!doc.contains("parameters"))
      throw usage_error("model file '" + path + "': an object needs a \"parameters\" list");
    list = &doc.at("parameters");
  }
  if (!list->is_array()) throw usage_error("model file '" + path + "': expected a list of parameters");
  if (list->empty()) throw usage_error("model file '" + path + "' lists no parameters: there is nothing to plan");
  std::vector<parameter_spec> params;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& p = (*list)[i];
    std::string where = "model file '" + path + "', parameter " + std::to_string(i);
    if (!p.is_object()) throw usage_error(where + ": expected an object");
    if (const auto name = p.find("name"); name != p.end() && name->is_string())
      where += " ('" + shortened(name->get<std::string>()) + "')";
    parameter_spec s;
    for (const auto& [key, value] : p.items()) {
      if (key == "name" && value.is_string())
        s.name = value.get<std::string>();
      else if (key == "shape" && value.is_array()) {
        for (const auto& d : value) {
          if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<std::int64_t>() >= 0))
            throw usage_error(where + ": shape entries must be non-negative integers");
          s.shape.push_back(d.get<std::uint64_t>());
        }
      } else if (key == "dtype" && value.is_string()) {
        s.type = ringzero::parse_dtype(value.get<std::string>());
        if (!s.type)
          throw usage_error(where + ": unknown dtype '" + shortened(value.get<std::string>()) + "' (" + dtype_examples +
                            ")");
      } else if (key == "trainable" && value.is_boolean())
        s.trainable = value.get<bool>();
      else if ((key == "tie" || key == "tie_group") && value.is_string())
        s.tie_group = value.get<std::string>();
      else if (key == "unit" && value.is_string())
        s.unit = value.get<std::string>();
      else
        throw usage_error(where + ": unexpected key '" + shortened(key) + "' or value " + shortened(value.dump()));
    }
    if (!p.contains("name") || !p.contains("shape")) throw usage_error(where + ": \"name\" and \"shape\" are required");
    params.push_back(std::move(s));
  }
  return params;
}

struct options {
  std::string model = "";
  std::string model_file;
  std::string stage = "all";
  int world_size = 0;
  int replica_group_size = 0;
  std::string gpu_memory;
  std::string precision = "mixed";
  std::string param_dtype, grad_dtype, master_dtype, state_dtype;
  std::string optimizer = "adam";
  std::string alignment = "16";
  std::string unit_bytes = "25MiB";
  int accumulation_steps = 1;
  bool no_prefetch = false;
  std::string reshard_after_forward = "all";
  int max_inflight_reductions = 2;
  int max_inflight_gathers = 0;
  std::string space;  // empty: the plan_request's default (host)
  int show_rank = -1;
  bool json = false;
  std::string offload = "none";
  int ranks_per_node = 0;  // 0: min(world size, 8)
  std::string quantize_weights = "none", quantize_gradients = "none";
  bool accumulate_unsharded = false;
  std::uint32_t quantization_block = 256;
  std::string keep_frozen = "0";
};

/// --alignment: a whole number of bytes as digits, so "-16" is refused as given instead of
/// wrapping to 2^64 - 16 (the planner checks that it is a power of two).
std::uint64_t parse_alignment(const std::string& text) {
  if (const auto v = parse_digits(text, "--alignment", text)) return *v;
  throw usage_error("--alignment must be a whole number of bytes (a power of two), got '" + text + "'");
}

ringzero::zero::plan_request make_request(const options& o, std::vector<parameter_spec> params, int stage) {
  using ringzero::zero::precision;
  ringzero::zero::plan_request q;
  q.parameters = std::move(params);
  q.world_size = o.world_size;
  q.replica_group_size = o.replica_group_size;
  q.stage = stage;
  q.alignment_bytes = parse_alignment(o.alignment);
  if (o.precision == "mixed" || o.precision == "fp16")
    q.precision = precision::mixed_adam();
  else if (o.precision == "bf16")
    q.precision = precision::bfloat16_adam();
  else if (o.precision == "fp32")
    q.precision = precision::float32_adam();
  else
    throw usage_error("unknown precision '" + o.precision + "' (mixed, bf16 or fp32)");
  if (!o.param_dtype.empty()) q.precision.parameter = parse_type(o.param_dtype, "parameter");
  if (!o.grad_dtype.empty()) q.precision.gradient = parse_type(o.grad_dtype, "gradient");
  if (o.master_dtype == "none")
    q.precision.master.reset();
  else if (!o.master_dtype.empty())
    q.precision.master = parse_type(o.master_dtype, "master weight");
  if (!o.state_dtype.empty()) q.precision.optimizer_state = parse_type(o.state_dtype, "optimizer state");
  if (o.optimizer == "adam" || o.optimizer == "adamw")
    q.precision.optimizer_states = 2;
  else if (o.optimizer == "sgd-momentum")
    q.precision.optimizer_states = 1;
  else if (o.optimizer == "sgd")
    q.precision.optimizer_states = 0;
  else
    throw usage_error("unknown optimizer '" + o.optimizer + "' (adam, adamw, sgd-momentum or sgd)");
  q.unit_bytes = parse_bytes(o.unit_bytes, "--unit-bytes");
  q.accumulation_steps = o.accumulation_steps;
  q.accumulate_unsharded = o.accumulate_unsharded;
  q.keep_frozen_bytes =
      o.keep_frozen == "all" ? ringzero::zero::keep_all_frozen : parse_bytes(o.keep_frozen, "--keep-frozen");
  q.prefetch = !o.no_prefetch;
  const auto reshard = ringzero::zero::parse_reshard_policy(o.reshard_after_forward);
  if (!reshard)
    throw usage_error("--reshard-after-forward must be all, except_last or none, got '" + o.reshard_after_forward +
                      "'");
  q.reshard_after_forward = *reshard;
  q.max_inflight_reductions = o.max_inflight_reductions;
  q.max_inflight_gathers = o.max_inflight_gathers;
  if (o.space == "host")
    q.space = ringzero::primitive::memory_space::host;
  else if (o.space == "device")
    q.space = ringzero::primitive::memory_space::device;
  else if (!o.space.empty())
    throw usage_error("--space must be host or device, got '" + o.space + "'");
  const auto offload = ringzero::zero::parse_offload(o.offload);
  if (!offload) throw usage_error("--offload must be none, optimizer or parameters, got '" + o.offload + "'");
  q.offload = *offload;
  // Quantized communication: weights apply to stage 3's gathers, gradients to stages 1-3; the
  // comparison of every stage (--stage all) keeps each where it applies, an explicit stage is
  // refused by the planner when it does not.
  const auto weights = ringzero::zero::parse_quantized_bits(o.quantize_weights);
  const auto gradients = ringzero::zero::parse_quantized_bits(o.quantize_gradients);
  if (!weights) throw usage_error("--quantize-weights must be none, int8 or int4, got '" + o.quantize_weights + "'");
  if (!gradients)
    throw usage_error("--quantize-gradients must be none, int8 or int4, got '" + o.quantize_gradients + "'");
  const bool every_stage = o.stage == "all";
  q.quantization.weights = every_stage && stage != 3 ? ringzero::zero::quantized_bits::none : *weights;
  q.quantization.gradients = every_stage && stage == 0 ? ringzero::zero::quantized_bits::none : *gradients;
  q.quantization.block_size = o.quantization_block;
  return q;
}

std::string precision_text(const ringzero::zero::precision& p) {
  std::string s = fmt::format("parameters {}, gradients {}, master weights {}, optimizer states {} x {}",
                              ringzero::dtype_name(p.parameter),
                              p.gradient ? std::string(ringzero::dtype_name(*p.gradient)) : "as parameters",
                              p.master ? std::string(ringzero::dtype_name(*p.master)) : "none", p.optimizer_states,
                              ringzero::dtype_name(p.optimizer_state));
  return s + fmt::format(" (K = {})", p.optimizer_bytes_per_element(p.parameter));
}

nlohmann::json memory_json(const ringzero::zero::memory_breakdown& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"master_weights", m.master_weights},
          {"optimizer_states", m.optimizer_states},
          {"model_states", m.model_states()},
          {"communication_buffers", m.communication_buffers},
          {"total", m.total()}};
}

/// Stage 3's frozen flat buffers by policy: kept gathered (replicated) or gathered on demand.
struct frozen_split {
  std::uint64_t kept_bytes = 0, on_demand_bytes = 0;  ///< whole sizes
  nlohmann::json units = nlohmann::json::array();     ///< per frozen buffer: unit, policy, bytes
};

frozen_split split_frozen(const shard_plan& plan) {
  frozen_split out;
  if (plan.stage() != 3) return out;
  out.kept_bytes = plan.kept_frozen_bytes();
  for (const auto& f : plan.buffers()) {
    if (f.trainable || f.numel == 0) continue;
    const std::uint64_t bytes = f.numel * ringzero::dtype_size(f.type);
    if (!f.replicated) out.on_demand_bytes += bytes;
    out.units.push_back({{"unit", plan.units()[f.unit].name},
                         {"policy", f.replicated ? "kept_gathered" : "on_demand"},
                         {"bytes", bytes}});
  }
  return out;
}

nlohmann::json plan_json(const shard_plan& plan, std::optional<std::uint64_t> gpu, int show_rank, int ranks_per_node) {
  const auto c = ringzero::zero::compare_with_paper(plan);
  const auto& comm = plan.communication();
  nlohmann::json j;
  j["stage"] = plan.stage();
  j["world_size"] = plan.world_size();
  j["shards"] = plan.shards();
  j["replica_groups"] = plan.replica_groups();
  j["memory_per_rank"] = memory_json(plan.memory());
  j["offload"] = std::string(ringzero::zero::offload_name(plan.request().offload));
  j["reshard_after_forward"] = std::string(ringzero::zero::reshard_policy_name(plan.request().reshard_after_forward));
  j["sharded_gradients"] = plan.sharded_gradients();
  j["max_inflight_gathers"] = plan.stage() == 3 ? plan.request().max_inflight_gathers : 0;  // stage 3 only
  j["space"] = ringzero::primitive::to_string(plan.space());
  j["device_memory_per_rank"] = memory_json(plan.device_memory());
  j["host_memory_per_rank"] = memory_json(plan.host_memory());
  j["ranks_per_node"] = ranks_per_node;
  j["host_memory_per_node"] = static_cast<double>(plan.host_memory().total()) * ranks_per_node;  // may pass 2^64
  j["communication_buffers"] = {{"gather_buffers", comm.gather_buffers},
                                {"gather_buffer_bytes", comm.gather_buffer_bytes},
                                {"gradient_buckets", comm.gradient_buckets},
                                {"gradient_bucket_bytes", comm.gradient_bucket_bytes},
                                {"quantization_bytes", comm.quantization_bytes}};
  j["padding_elements"] = plan.padding_elements();
  j["paper"] = {{"psi", c.psi},
                {"devices", c.devices},
                {"model_states",
                 {{"parameters", c.paper.parameters},
                  {"gradients", c.paper.gradients},
                  {"optimizer_states", c.paper.optimizer_states},
                  {"total", c.paper.total()}}},
                {"unpadded_model_states", c.unpadded.total()},
                {"padding_bytes", c.padding_bytes},
                {"buffer_bytes", c.buffer_bytes},
                {"volume_elements", c.paper_volume},
                {"planned_volume_elements", c.planned_volume},
                {"replica_volume_elements", c.replica_volume}};
  nlohmann::json traffic = nlohmann::json::array();
  for (const auto& e : plan.traffic())
    traffic.push_back({{"collective", ringzero::collective_name(e.collective)},
                       {"group", ringzero::zero::rank_group_name(e.group)},
                       {"ranks", e.ranks},
                       {"purpose", e.purpose},
                       {"calls", e.calls},
                       {"elements", e.elements},
                       {"bytes", e.bytes},
                       {"unquantized_bytes", e.unquantized_bytes},
                       {"quantized", std::string(ringzero::zero::quantized_bits_name(e.quantized))},
                       {"volume_bytes", e.volume_bytes()},
                       {"ring_bytes_sent", e.ring_bytes_sent()}});
  j["traffic_per_step"] = traffic;
  const frozen_split frozen = split_frozen(plan);
  j["frozen"] = {{"kept_gathered_bytes", frozen.kept_bytes},
                 {"gathered_on_demand_bytes", frozen.on_demand_bytes},
                 {"buffers", frozen.units}};
  if (gpu) {
    j["gpu_memory"] = *gpu;
    j["fits"] = plan.device_memory().total() <= *gpu;  // what stays on the GPU
    j["headroom_bytes"] = static_cast<double>(*gpu) - static_cast<double>(plan.device_memory().total());
  }
  if (show_rank >= 0) {
    nlohmann::json frags = nlohmann::json::array();
    for (const auto& f : plan.fragments(show_rank))
      frags.push_back({{"parameter", plan.parameters()[f.parameter].name},
                       {"parameter_offset", f.parameter_offset},
                       {"count", f.count},
                       {"unit", plan.units()[plan.buffers()[f.buffer].unit].name},
                       {"shard_offset", f.shard_offset}});
    j["rank"] = {{"rank", show_rank}, {"shard", plan.shard_index(show_rank)}, {"fragments", frags}};
  }
  return j;
}

/// "world", "shard" or "replica" for the traffic table.
const char* short_group(ringzero::zero::rank_group g) {
  switch (g) {
    case ringzero::zero::rank_group::world: return "world";
    case ringzero::zero::rank_group::shard: return "shard";
    case ringzero::zero::rank_group::replica: return "replica";
  }
  return "?";
}

void print_plan(const shard_plan& plan, std::optional<std::uint64_t> gpu, int show_rank, int ranks_per_node) {
  const auto c = ringzero::zero::compare_with_paper(plan);
  const auto& m = plan.memory();
  const int stage = plan.stage();
  fmt::print("stage {} on {} ranks ({} replica group{} of {}; every buffer in {} shard{}), alignment {} B\n", stage,
             plan.world_size(), plan.replica_groups(), plan.replica_groups() == 1 ? "" : "s",
             plan.world_size() / plan.replica_groups(), plan.shards(), plan.shards() == 1 ? "" : "s",
             plan.request().alignment_bytes);
  fmt::print("precision: {}\n\n", precision_text(plan.request().precision));

  const char* formula[] = {"16 Psi", "4 Psi + 12 Psi/N", "2 Psi + 14 Psi/N", "16 Psi/N"};
  fmt::print("Memory per rank (identical on every rank)\n");
  fmt::print("  {:<24}{:>20}{:>14}{:>16}\n", "category", "bytes", "", "paper (K = 12)");
  auto row = [](const char* name, std::uint64_t bytes, std::optional<double> paper) {
    fmt::print("  {:<24}{:>20}{:>14}{:>16}\n", name, grouped(bytes), human(static_cast<double>(bytes)),
               paper ? human(*paper) : std::string());
  };
  row("parameters", m.parameters, c.paper.parameters);
  row("gradients", m.gradients, c.paper.gradients);
  row("master weights", m.master_weights, std::nullopt);
  row("optimizer states", m.optimizer_states, c.paper.optimizer_states);
  row("model states", m.model_states(), c.paper.total());
  row("communication buffers", m.communication_buffers, std::nullopt);
  row("total", m.total(), std::nullopt);
  fmt::print("  (the paper's K = 12 counts master weights and optimizer states together)\n");
  const auto& dm = plan.device_memory();
  const auto& hm = plan.host_memory();
  if (plan.request().offload == ringzero::zero::offload::optimizer)
    fmt::print(
        "  on the GPU {}; in pinned host memory (offload {}) {}: master weights {},\n"
        "  optimizer states {}, transfer buffers {} (the gradient and parameter shards of the CPU update)\n",
        human(static_cast<double>(dm.total())), ringzero::zero::offload_name(plan.request().offload),
        human(static_cast<double>(hm.total())), human(static_cast<double>(hm.master_weights)),
        human(static_cast<double>(hm.optimizer_states)), human(static_cast<double>(hm.communication_buffers)));
  if (plan.request().offload == ringzero::zero::offload::parameters)
    fmt::print(
        "  on the GPU {} (gather buffers, gradient buckets{}); in pinned host memory (offload {}) {}:\n"
        "  parameter shards {}, gradient shards {}, master weights {}, optimizer states {}\n",
        human(static_cast<double>(dm.total())), dm.parameters > 0 ? ", frozen parameters kept whole" : "",
        ringzero::zero::offload_name(plan.request().offload), human(static_cast<double>(hm.total())),
        human(static_cast<double>(hm.parameters)), human(static_cast<double>(hm.gradients)),
        human(static_cast<double>(hm.master_weights)), human(static_cast<double>(hm.optimizer_states)));
  if (plan.request().offload != ringzero::zero::offload::none)
    fmt::print("  pinned host memory per node ({} rank{} per node): {}\n", ranks_per_node,
               ranks_per_node == 1 ? "" : "s", human(static_cast<double>(hm.total()) * ranks_per_node));
  const auto& comm = plan.communication();
  if (stage == 3)
    fmt::print("  buffers: {} gather buffer{} of {} and ", comm.gather_buffers, comm.gather_buffers == 1 ? "" : "s",
               human(static_cast<double>(comm.gather_buffer_bytes)));
  else if (stage == 2)
    fmt::print("  buffers: ");
  if (stage >= 2 && !plan.sharded_gradients())
    fmt::print("no gradient buckets (gradients accumulated unsharded, reduced once per step)\n");
  else if (stage >= 2)
    fmt::print("{} gradient bucket{} of {} (each sized for the largest unit)\n", comm.gradient_buckets,
               comm.gradient_buckets == 1 ? "" : "s", human(static_cast<double>(comm.gradient_bucket_bytes)));
  if (comm.quantization_bytes > 0)
    fmt::print("  quantized communication's staging buffer: {}\n", human(static_cast<double>(comm.quantization_bytes)));
  if (const frozen_split frozen = split_frozen(plan); !frozen.units.empty())
    fmt::print(
        "  frozen parameters: {} kept gathered (whole on every rank, no traffic per step), {} gathered on "
        "demand with their units (--keep-frozen)\n",
        human(static_cast<double>(frozen.kept_bytes)), human(static_cast<double>(frozen.on_demand_bytes)));
  if (gpu) {
    const double left = static_cast<double>(*gpu) - static_cast<double>(dm.total());
    if (left >= 0)
      fmt::print("  fits in {}: yes, {} ({:.1f}%) left for activations and workspace\n",
                 human(static_cast<double>(*gpu)), human(left), 100.0 * left / static_cast<double>(*gpu));
    else
      fmt::print("  fits in {}: NO, {} short\n", human(static_cast<double>(*gpu)), human(-left));
  }

  fmt::print("\nTraffic per optimizer step, per rank\n");
  // One space before each right-aligned cell: a wide value pushes the row along instead of
  // running into its neighbour (same layout as before for values that fit).
  fmt::print("  {:<15}{:<15}{:<38}{:>7} {:>17} {:>13} {:>13}\n", "collective", "group", "purpose", "calls", "elements",
             "bytes", "ring sent");
  double sent = 0, unquantized = 0;  // summed as doubles: the entries are exact, their sum may not fit
  for (const auto& e : plan.traffic()) {
    const std::string purpose =
        e.quantized == ringzero::zero::quantized_bits::none
            ? e.purpose
            : fmt::format("{} ({})", e.purpose, ringzero::zero::quantized_bits_name(e.quantized));
    fmt::print("  {:<15}{:<15}{:<38}{:>7} {:>17} {:>13} {:>13}\n", ringzero::collective_name(e.collective),
               fmt::format("{} ({})", short_group(e.group), e.ranks), purpose, e.calls, grouped(e.elements),
               human(static_cast<double>(e.bytes)), human(e.ring_bytes_sent()));
    sent += static_cast<double>(e.bytes);
    unquantized += static_cast<double>(e.unquantized_bytes);
  }
  if (sent != unquantized)
    fmt::print("  quantized: {} per step instead of {} ({:.2f}x fewer bytes)\n", human(sent), human(unquantized),
               unquantized / sent);

  fmt::print("\nAgainst the ZeRO paper (Psi = {} parameters, N = {}, K = 12)\n", grouped(plan.parameter_elements()),
             c.devices);
  fmt::print("  model states: paper {} = {}; this precision without padding {}; planned {}\n", formula[stage],
             human(c.paper.total()), human(c.unpadded.total()), human(c.planned.total()));
  fmt::print("  padding: {} elements, {} per rank; communication buffers (not in the paper): {}\n",
             grouped(plan.padding_elements()), human(c.padding_bytes), human(static_cast<double>(c.buffer_bytes)));
  const double ratio = c.paper_volume > 0 ? static_cast<double>(c.planned_volume) / c.paper_volume : 1.0;
  fmt::print("  volume: paper {} Psi = {} elements; planned {} elements ({:+.2f}%)", stage == 3 ? 3 : 2,
             grouped(static_cast<std::uint64_t>(c.paper_volume)), grouped(c.planned_volume), 100.0 * (ratio - 1.0));
  if (c.replica_volume > 0) fmt::print(" + {} across replica groups", grouped(c.replica_volume));
  fmt::print("\n");

  if (show_rank >= 0) {
    fmt::print("\nRank {} (shard {}) owns:\n", show_rank, plan.shard_index(show_rank));
    if (plan.fragments(show_rank).empty()) fmt::print("  nothing (more ranks than parameter elements to shard)\n");
    for (const auto& f : plan.fragments(show_rank))
      fmt::print("  {:<48} [{}, {}) of {}\n", plan.parameters()[f.parameter].name, f.parameter_offset,
                 f.parameter_offset + f.count, plan.placements()[f.parameter].numel);
  }
}

void print_summary(const std::vector<shard_plan>& plans, std::optional<std::uint64_t> gpu, int ranks_per_node) {
  fmt::print("precision: {}\n\n", precision_text(plans.front().request().precision));
  fmt::print("Memory per rank and traffic per step, by stage ({} ranks, {} per replica group)\n",
             plans.front().world_size(), plans.back().shards());
  const bool offloaded = plans.front().request().offload != ringzero::zero::offload::none;
  fmt::print("  {:<6}{:>12}{:>12}{:>12}{:>12}{:>14}{:>14}{:>12}{:>12}{:>16}{}\n", "stage", "parameters", "gradients",
             "master", "optimizer", "model states", "paper (K=12)", "buffers", "total", "volume (elem)",
             gpu ? "  fits" : "");
  for (const shard_plan& plan : plans) {
    const auto& m = plan.memory();
    const auto c = ringzero::zero::compare_with_paper(plan);
    fmt::print("  {:<6}{:>12}{:>12}{:>12}{:>12}{:>14}{:>14}{:>12}{:>12}{:>16}{}\n", plan.stage(),
               human(static_cast<double>(m.parameters)), human(static_cast<double>(m.gradients)),
               human(static_cast<double>(m.master_weights)), human(static_cast<double>(m.optimizer_states)),
               human(static_cast<double>(m.model_states())), human(c.paper.total()),
               human(static_cast<double>(m.communication_buffers)), human(static_cast<double>(m.total())),
               grouped(c.planned_volume + c.replica_volume),
               gpu ? (plan.device_memory().total() <= *gpu ? "  yes" : "  NO") : "");
    if (offloaded)
      fmt::print("  {:<6}on the GPU {}, in pinned host memory {} ({} per node of {} ranks)\n", "",
                 human(static_cast<double>(plan.device_memory().total())),
                 human(static_cast<double>(plan.host_memory().total())),
                 human(static_cast<double>(plan.host_memory().total()) * ranks_per_node), ranks_per_node);
  }
  if (offloaded)
    fmt::print(
        "  (offload {}: master weights, optimizer states and transfer buffers in pinned host memory; fits: the\n"
        "   GPU's part)\n",
        ringzero::zero::offload_name(plans.front().request().offload));
  fmt::print(
      "  (paper: the ZeRO paper's model-state formula with K = 12; fits: total <= GPU memory, activations not\n"
      "   counted; volume: elements each rank moves per step in the paper's accounting; --stage N for details)\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringzero-plan: plan ZeRO stages 0-3 for a model, without hardware"};
  options o;
  auto* preset = app.add_option("-m,--model", o.model,
                                "Built-in model: gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-7b, llama-70b");
  auto* file = app.add_option("-f,--model-file", o.model_file, "JSON model description (see the documentation)");
  preset->excludes(file);
  app.add_option("-s,--stage", o.stage, "ZeRO stage 0, 1, 2, 3, or 'all' for a comparison")->capture_default_str();
  app.add_option("-n,--world-size", o.world_size, "Number of ranks (GPUs)")
      ->required()
      ->check(CLI::Range(1, 1 << 24, "an integer from 1 to 16777216"));
  app.add_option("-g,--replica-group-size", o.replica_group_size,
                 "Ranks per replica group for hybrid sharding (shard within, replicate across); default: all ranks");
  app.add_option("--gpu-memory", o.gpu_memory, "Memory per GPU, e.g. 80GiB or 40GB: says whether the plan fits");
  app.add_option("--precision", o.precision, "mixed (float16 + float32 master, the paper's), bf16, or fp32")
      ->capture_default_str();
  app.add_option("--param-dtype", o.param_dtype, "Parameter dtype (overrides --precision)");
  app.add_option("--grad-dtype", o.grad_dtype, "Gradient dtype (overrides --precision)");
  app.add_option("--master-dtype", o.master_dtype, "Master weight dtype, or 'none' (overrides --precision)");
  app.add_option("--state-dtype", o.state_dtype, "Optimizer state dtype (overrides --precision)");
  app.add_option("--optimizer", o.optimizer, "adam, adamw, sgd-momentum or sgd (sets the states per element)")
      ->capture_default_str();
  app.add_option("--alignment", o.alignment, "Alignment of parameters and shards in bytes (a power of two)")
      ->type_name("UINT")
      ->capture_default_str();
  app.add_option("--unit-bytes", o.unit_bytes,
                 "Largest automatic gather unit (for parameters without a unit; 0: one unit per such parameter)")
      ->capture_default_str();
  app.add_option("--accumulation-steps", o.accumulation_steps, "Micro-batches per optimizer step")
      ->capture_default_str();
  app.add_flag("--no-prefetch", o.no_prefetch, "Stage 3: do not gather the next unit ahead");
  app.add_option("--reshard-after-forward", o.reshard_after_forward,
                 "Stage 3: the units released after their forward: all, except_last (FSDP2's default) or none")
      ->capture_default_str();
  app.add_option("--max-inflight-reductions", o.max_inflight_reductions,
                 "Stages 2-3: gradient reductions in flight before a new bucket waits")
      ->capture_default_str();
  app.add_option("--max-inflight-gathers", o.max_inflight_gathers,
                 "Stage 3: the most units gathered at once that a prefetch may bring about (0: no bound)")
      ->capture_default_str();
  app.add_option("--space", o.space,
                 "Memory space of the model state, as the runtime will check it: host (default) or device");
  app.add_option("--show-rank", o.show_rank, "List the parameter fragments this rank owns");
  app.add_flag("--json", o.json, "Print JSON instead of tables");
  app.add_flag("--accumulate-unsharded", o.accumulate_unsharded,
               "Stages 2-3: accumulate micro-batches in full gradients, one reduce_scatter per step");
  app.add_option("--quantize-weights", o.quantize_weights,
                 "Stage 3: all_gather parameters as none, int8 or int4 blocks (ZeRO++'s qwZ)")
      ->capture_default_str();
  app.add_option("--quantize-gradients", o.quantize_gradients,
                 "Stages 1-3: reduce gradients as none, int8 or int4 blocks (ZeRO++'s qgZ)")
      ->capture_default_str();
  app.add_option("--quantization-block", o.quantization_block,
                 "Elements per quantization scale (a power of two from 8 to 65536)")
      ->capture_default_str();
  app.add_option("--keep-frozen", o.keep_frozen,
                 "Stage 3: bytes per rank of frozen parameters kept gathered (e.g. 2GiB, 0, or all), in unit order")
      ->capture_default_str();
  app.add_option("--offload", o.offload,
                 "none; optimizer: master weights and optimizer states in pinned host memory, updated on the CPU; "
                 "parameters (stage 3): the parameter and gradient shards there too")
      ->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "Ranks (GPUs) per node, for the pinned host memory per node with --offload (default: the world "
                 "size, at most 8)")
      ->check(CLI::Range(1, 16777216));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A value that does not convert or is out of range is a bad option value: status 1, as for
    // the values checked below; help, unknown and missing options keep CLI11's status.
    const int status = app.exit(e);
    return dynamic_cast<const CLI::ValidationError*>(&e) || dynamic_cast<const CLI::ConversionError*>(&e) ? 1 : status;
  }

  try {
    if (o.model.empty() && o.model_file.empty()) throw usage_error("give --model NAME or --model-file PATH");
    std::vector<parameter_spec> params;
    std::string model_name;
    if (!o.model.empty()) {
      auto p = ringzero::zero::preset_parameters(o.model);
      if (!p) {
        std::string names;
        for (auto n : ringzero::zero::preset_names) names += (names.empty() ? "" : ", ") + std::string(n);
        throw usage_error("unknown model '" + o.model + "' (built-in: " + names +
                          "; a JSON model file is given with --model-file PATH)");
      }
      params = std::move(*p);
      model_name = o.model;
    } else {
      params = read_model_file(o.model_file);
      model_name = o.model_file;
    }
    std::optional<std::uint64_t> gpu;
    if (app.count("--gpu-memory") > 0) {
      gpu = parse_bytes(o.gpu_memory, "--gpu-memory");
      if (*gpu == 0) throw usage_error("--gpu-memory must be more than 0 bytes, got '" + o.gpu_memory + "'");
      // A bare number below 1 MiB is almost surely a missing unit ("80" meant 80GiB).
      if (*gpu < (std::uint64_t{1} << 20) && o.gpu_memory.find_first_of("bBkKmMgGtT") == std::string::npos)
        throw usage_error("--gpu-memory '" + o.gpu_memory + "' reads as " + std::to_string(*gpu) +
                          " bytes; give a unit, e.g. " + o.gpu_memory + "GiB");
    }
    std::vector<int> stages;
    if (o.stage == "all")
      stages = {0, 1, 2, 3};
    else if (o.stage.size() == 1 && o.stage[0] >= '0' && o.stage[0] <= '3')
      stages = {o.stage[0] - '0'};
    else
      throw usage_error("--stage must be 0, 1, 2, 3 or all, got '" + o.stage + "'");
    if (app.count("--show-rank") > 0 && o.show_rank < 0)
      throw usage_error("--show-rank must be a rank from 0 to " + std::to_string(o.world_size - 1) + ", got " +
                        std::to_string(o.show_rank));
    if (o.show_rank >= o.world_size)
      throw usage_error("--show-rank " + std::to_string(o.show_rank) + " is not below the world size");

    if (o.offload == "parameters" && stages.size() > 1)
      throw usage_error(
          "--offload parameters plans stage 3 only (the parameter shards in host memory): pass --stage 3");
    if (app.count("--ranks-per-node") > 0 && o.offload == "none")
      throw usage_error(
          "--ranks-per-node counts the pinned host memory per node, which only --offload optimizer or "
          "--offload parameters uses: pass one of them, or leave --ranks-per-node out");
    if (o.ranks_per_node > o.world_size)
      throw usage_error("--ranks-per-node " + std::to_string(o.ranks_per_node) + " is more than the world size " +
                        std::to_string(o.world_size));
    const int ranks_per_node = o.ranks_per_node > 0 ? o.ranks_per_node : std::min(o.world_size, 8);
    std::vector<shard_plan> plans;
    for (int stage : stages) plans.emplace_back(make_request(o, params, stage));
    const shard_plan& first = plans.front();
    std::size_t tensors = params.size();
    if (o.json) {
      nlohmann::json out;
      out["model"] = {{"name", model_name},
                      {"tensors", tensors},
                      {"units", first.units().size()},
                      {"parameters", first.parameter_elements()},
                      {"trainable", first.trainable_elements()}};
      out["precision"] = precision_text(first.request().precision);
      out["plans"] = nlohmann::json::array();
      for (const shard_plan& p : plans) out["plans"].push_back(plan_json(p, gpu, o.show_rank, ranks_per_node));
      fmt::print("{}\n", out.dump(2));
      return 0;
    }
    fmt::print("ringzero-plan: {}: {} parameters ({} trainable) in {} tensors, {} gather units\n", model_name,
               grouped(first.parameter_elements()), grouped(first.trainable_elements()), tensors, first.units().size());
    if (plans.size() == 1)
      print_plan(first, gpu, o.show_rank, ranks_per_node);
    else
      print_summary(plans, gpu, ranks_per_node);
    return 0;
  } catch (const usage_error& e) {
    fmt::print(stderr, "ringzero-plan: error: {}\n", e.what());
    return 1;
  } catch (const ringzero::error& e) {
    fmt::print(stderr, "ringzero-plan: error: {}\n", e.what());
    return 1;
  }
}
