// Config loading: nlohmann::json is parsed here and nowhere else. Its exceptions are caught and
// turned into Status. Each object is read by an ObjectReader that knows the keys zinfinity
// implements and the DeepSpeed keys it does not: the latter draw one warning each, anything else
// is an error that names the key path and suggests the nearest valid key.
#include "src/base/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "src/base/aio_backends.h"
#include "src/base/config_keys.h"
#include "src/base/log.h"

namespace zinf::config {
namespace {

using Json = nlohmann::json;

std::string type_name(const Json& value) {
    if (value.is_boolean()) return "boolean";
    if (value.is_number_integer() || value.is_number_unsigned())
        return str_cat("integer ", value.dump());
    if (value.is_number_float()) return str_cat("number ", value.dump());
    if (value.is_string()) return str_cat("string \"", value.get<std::string>(), "\"");
    if (value.is_array()) return "array";
    if (value.is_object()) return "object";
    if (value.is_null()) return "null";
    return "value";
}

std::string join(std::string_view prefix, std::string_view key) {
    if (prefix.empty()) return std::string(key);
    return str_cat(prefix, ".", key);
}

std::string_view last_segment(std::string_view path) {
    const auto dot = path.rfind('.');
    return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

// Two JSON values equal as config values (1 and 1.0 are the same number).
bool same_value(const Json& a, const Json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
}

// Reads one JSON object through the key table (config_keys.h): tracks which keys were consumed,
// resolves aliases, and lets finish() apply the table to the rest: warned keys draw one warning,
// default-only keys are checked against DeepSpeed's default, blocks refused when enabled are
// checked, anything not in the table is an error suggesting the nearest valid key.
class ObjectReader {
public:
    ObjectReader(const Json& object, std::string path, std::vector<std::string>& warnings)
        : object_(object), path_(std::move(path)), warnings_(warnings) {}

    std::string path_of(std::string_view key) const { return join(path_, key); }

    // The value of `key` (or of an alias of it), null when absent. Errors: both spellings given.
    Status lookup(std::string_view key, const Json*& out) {
        const std::string path = path_of(key);
        ZINF_ASSERT_MSG(find_key(path) != nullptr,
                        str_cat("config key ", path, " missing from the key table"));
        known_.emplace(key);
        out = value_of(key);
        for (const KeyInfo& k : key_table()) {
            if (k.status != KeyStatus::kAlias || k.accepted != path) continue;
            const std::string_view alias = last_segment(k.path);
            known_.emplace(alias);
            const Json* other = value_of(alias);
            if (other == nullptr) continue;
            if (out != nullptr) {
                return Status::invalid_argument(
                    str_cat(path, " and ", k.path, " are two spellings of one key; keep one"));
            }
            out = other;
        }
        return Status::ok();
    }

    // As lookup, for callers that only test presence (aliases included).
    const Json* find(std::string_view key) {
        const Json* value = nullptr;
        pending_ = lookup(key, value);
        return pending_.is_ok() ? value : nullptr;
    }

    Status get_bool(std::string_view key, bool& out) {
        const Json* value = nullptr;
        ZINF_TRY(lookup(key, value));
        if (value == nullptr) return Status::ok();
        if (!value->is_boolean()) return type_error(key, "boolean (true or false)", *value);
        out = value->get<bool>();
        return Status::ok();
    }

    // true, false or "auto".
    Status get_tristate(std::string_view key, Tristate& out) {
        const Json* value = nullptr;
        ZINF_TRY(lookup(key, value));
        if (value == nullptr) return Status::ok();
        if (value->is_boolean()) {
            out = value->get<bool>() ? Tristate::kOn : Tristate::kOff;
        } else if (value->is_string() && value->get<std::string>() == "auto") {
            out = Tristate::kAuto;
        } else {
            return type_error(key, "true, false or \"auto\"", *value);
        }
        return Status::ok();
    }

    template <typename Int>
    Status get_int(std::string_view key, Int& out, std::int64_t min, std::int64_t max) {
        const Json* value = nullptr;
        ZINF_TRY(lookup(key, value));
        if (value == nullptr) return Status::ok();
        std::int64_t v = 0;
        if (value->is_number_integer()) {
            v = value->get<std::int64_t>();
        } else if (value->is_number_unsigned()) {
            const auto u = value->get<std::uint64_t>();
            if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
                return range_error(key, min, max, value->dump());
            }
            v = static_cast<std::int64_t>(u);
        } else if (value->is_number_float()) {
            // DeepSpeed configs often write element counts as 1e8; accept whole floats.
            const double d = value->get<double>();
            if (!std::isfinite(d) || std::floor(d) != d) {
                return type_error(key, str_cat("integer in [", min, ", ", max, "]"), *value);
            }
            if (d < static_cast<double>(min) || d > static_cast<double>(max)) {
                return range_error(key, min, max, value->dump());
            }
            v = static_cast<std::int64_t>(d);
        } else {
            return type_error(key, str_cat("integer in [", min, ", ", max, "]"), *value);
        }
        if (v < min || v > max) return range_error(key, min, max, str_cat(v));
        out = static_cast<Int>(v);
        return Status::ok();
    }

    Status get_double(std::string_view key, double& out, double min, double max) {
        const Json* value = nullptr;
        ZINF_TRY(lookup(key, value));
        if (value == nullptr) return Status::ok();
        if (!value->is_number())
            return type_error(key, str_cat("number in [", min, ", ", max, "]"), *value);
        const double v = value->get<double>();
        if (!std::isfinite(v) || v < min || v > max) {
            return Status::invalid_argument(
                str_cat(path_of(key), ": expected number in [", min, ", ", max, "], got ", v));
        }
        out = v;
        return Status::ok();
    }

    Status get_enum(std::string_view key, std::string& out,
                    std::initializer_list<std::string_view> choices) {
        return get_enum(key, out,
                        std::span<const std::string_view>(choices.begin(), choices.size()));
    }
    Status get_enum(std::string_view key, std::string& out,
                    std::span<const std::string_view> choices) {
        const Json* value = nullptr;
        ZINF_TRY(lookup(key, value));
        if (value == nullptr) return Status::ok();
        std::string choice_list;
        for (auto c : choices)
            choice_list += str_cat(choice_list.empty() ? "" : ", ", "\"", c, "\"");
        if (!value->is_string()) return type_error(key, str_cat("one of ", choice_list), *value);
        const auto s = value->get<std::string>();
        for (auto c : choices) {
            if (s == c) {
                out = s;
                return Status::ok();
            }
        }
        return Status::invalid_argument(
            str_cat(path_of(key), ": expected one of ", choice_list, ", got \"", s, "\""));
    }

    // A string (empty allowed).
    Status get_string(std::string_view key, std::string& out) {
        const Json* value = nullptr;
        ZINF_TRY(lookup(key, value));
        if (value == nullptr) return Status::ok();
        if (!value->is_string()) return type_error(key, "string", *value);
        out = value->get<std::string>();
        return Status::ok();
    }

    // A string or a list of non-empty strings.
    Status get_path_list(std::string_view key, std::vector<std::string>& out) {
        const Json* value = nullptr;
        ZINF_TRY(lookup(key, value));
        if (value == nullptr) return Status::ok();
        std::vector<std::string> paths;
        if (value->is_string()) {
            paths.push_back(value->get<std::string>());
        } else if (value->is_array()) {
            for (const auto& item : *value) {
                if (!item.is_string()) {
                    return type_error(key, "a path string or a list of path strings", *value);
                }
                paths.push_back(item.get<std::string>());
            }
        } else if (value->is_null()) {
            out.clear();
            return Status::ok();
        } else {
            return type_error(key, "a path string or a list of path strings", *value);
        }
        for (const auto& p : paths) {
            if (p.empty()) return Status::invalid_argument(str_cat(path_of(key), ": empty path"));
        }
        out = std::move(paths);
        return Status::ok();
    }

    // Returns the sub-object at key (null if absent) after checking that it is an object.
    Status get_object(std::string_view key, const Json*& out) {
        ZINF_TRY(lookup(key, out));
        if (out != nullptr && !out->is_object()) return type_error(key, "object", *out);
        return Status::ok();
    }

    // Applies the key table to every key that no get_* asked for.
    Status finish() {
        ZINF_TRY(pending_);
        for (auto it = object_.begin(); it != object_.end(); ++it) {
            const std::string& key = it.key();
            if (known_.contains(key)) continue;
            ZINF_TRY(apply_table(key, *it));
        }
        return Status::ok();
    }

private:
    const Json* value_of(std::string_view key) const {
        auto it = object_.find(std::string(key));
        return it == object_.end() ? nullptr : &*it;
    }

    Status apply_table(const std::string& key, const Json& value) {
        const std::string path = path_of(key);
        const KeyInfo* info = find_key(path);
        if (info != nullptr && info->status == KeyStatus::kAlias) {
            const std::string_view canonical = last_segment(info->accepted);
            if (value_of(canonical) != nullptr && !known_.contains(std::string(canonical))) {
                return Status::invalid_argument(str_cat(path, " and ", info->accepted,
                                                        " are two spellings of one key; keep one"));
            }
            info = find_key(info->accepted);
        }
        if (info == nullptr) return unknown_key(key);
        switch (info->status) {
            case KeyStatus::kWarned:
                warnings_.push_back(str_cat(path, ": DeepSpeed key not implemented by zinfinity (",
                                            info->note, "); ignored"));
                return Status::ok();
            case KeyStatus::kDefaultOnly: {
                const Json accepted = Json::parse(info->accepted);
                if (same_value(value, accepted)) return Status::ok();
                return Status::not_supported(
                    str_cat(path, ": zinfinity implements only DeepSpeed's default ",
                            info->accepted, " (", info->note, "); got ", value.dump()));
            }
            case KeyStatus::kRefusedIfEnabled: {
                const bool enabled = value.is_object() && value.contains("enabled") &&
                                     value["enabled"].is_boolean() && value["enabled"].get<bool>();
                if (!enabled) return Status::ok();  // disabled: DeepSpeed does nothing either
                return Status::not_supported(str_cat(path,
                                                     ".enabled: true, but not implemented by "
                                                     "zinfinity (",
                                                     info->note,
                                                     "); set it false or remove the block"));
            }
            default:
                // An implemented key the parser did not read: a bug in this file, caught by
                // ConfigKeys.EveryImplementedKeyIsRead.
                return Status::internal(str_cat(path, ": in the key table as ",
                                                key_status_name(info->status), " but not read"));
        }
    }

    Status unknown_key(const std::string& key) const {
        std::string best;
        std::size_t best_distance = std::numeric_limits<std::size_t>::max();
        std::string list = sibling_keys(path_);
        std::size_t start = 0;
        while (start < list.size()) {
            std::size_t comma = list.find(", ", start);
            if (comma == std::string::npos) comma = list.size();
            const std::string candidate = list.substr(start, comma - start);
            const std::size_t d = edit_distance(key, candidate);
            if (d < best_distance) {
                best_distance = d;
                best = candidate;
            }
            start = comma + 2;
        }
        std::string message = str_cat(path_of(key), ": unknown key");
        if (!best.empty() && best_distance <= std::max<std::size_t>(3, key.size() / 2)) {
            message += str_cat("; did you mean '", path_of(best), "'?");
        } else if (!list.empty()) {
            message += str_cat(" (valid keys here: ", list, ")");
        }
        return Status::invalid_argument(message);
    }

    Status type_error(std::string_view key, std::string_view expected, const Json& got) const {
        if (got.is_string() && got.get<std::string>() == "auto") {
            return Status::invalid_argument(str_cat(
                path_of(key), ": \"auto\" cannot be resolved by zinfinity here; give a value (",
                expected, ")"));
        }
        return Status::invalid_argument(
            str_cat(path_of(key), ": expected ", expected, ", got ", type_name(got)));
    }
    Status range_error(std::string_view key, std::int64_t min, std::int64_t max,
                       const std::string& got) const {
        return Status::invalid_argument(
            str_cat(path_of(key), ": expected integer in [", min, ", ", max, "], got ", got));
    }

    const Json& object_;
    std::string path_;
    std::vector<std::string>& warnings_;
    std::set<std::string, std::less<>> known_;
    Status pending_;
};

constexpr std::int64_t kMaxCount = std::numeric_limits<std::int64_t>::max();

Status read_aio(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                AioConfig& aio) {
    ObjectReader r(object, path, warnings);
    std::int64_t block_size = static_cast<std::int64_t>(aio.block_size_bytes);
    ZINF_TRY(r.get_int(std::string_view("block_size"), block_size, 512, std::int64_t{1} << 30));
    if (block_size % 512 != 0) {
        return Status::invalid_argument(
            str_cat(r.path_of("block_size"),
                    ": expected a multiple of 512 bytes (the smallest logical block "
                    "size of any file system), got ",
                    block_size));
    }
    aio.block_size_bytes = static_cast<std::uint64_t>(block_size);
    ZINF_TRY(r.get_int(std::string_view("queue_depth"), aio.queue_depth, 1, 4096));
    // `thread_count` is the older name (an alias in the key table): DeepSpeed now ignores it
    // silently, zinfinity honours it, and both at once is an error.
    ZINF_TRY(r.get_int(std::string_view("intra_op_parallelism"), aio.intra_op_parallelism, 1, 256));
    ZINF_TRY(r.get_bool("single_submit", aio.single_submit));
    ZINF_TRY(r.get_bool("overlap_events", aio.overlap_events));
    ZINF_TRY(r.get_enum("backend", aio.backend, aio_backend_names(/*with_auto=*/true)));
    ZINF_TRY(r.get_tristate("use_direct", aio.use_direct));
    ZINF_TRY(r.get_bool("register_buffers", aio.register_buffers));
    ZINF_TRY(r.get_bool("sqpoll", aio.sqpoll));
    return r.finish();
}

Status read_offload_device(ObjectReader& r, OffloadDevice& device) {
    std::string name = std::string(offload_device_name(device));
    ZINF_TRY(r.get_enum("device", name, {"none", "cpu", "nvme"}));
    device = name == "cpu"    ? OffloadDevice::kCpu
             : name == "nvme" ? OffloadDevice::kNvme
                              : OffloadDevice::kNone;
    return Status::ok();
}

Status read_offload_param(const Json& object, const std::string& path,
                          std::vector<std::string>& warnings, OffloadParamConfig& c) {
    ObjectReader r(object, path, warnings);
    ZINF_TRY(read_offload_device(r, c.device));
    ZINF_TRY(r.get_path_list("nvme_path", c.nvme_path));
    ZINF_TRY(r.get_int(std::string_view("buffer_count"), c.buffer_count, 0, 1024));
    ZINF_TRY(r.get_int(std::string_view("buffer_size"), c.buffer_size_numel, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("max_in_cpu"), c.max_in_cpu_numel, 0, kMaxCount));
    ZINF_TRY(r.get_bool("pin_memory", c.pin_memory));
    ZINF_TRY(r.finish());
    if (c.device == OffloadDevice::kNvme && c.nvme_path.empty()) {
        return Status::invalid_argument(
            str_cat(path, ".nvme_path: required when ", path, ".device is \"nvme\""));
    }
    return Status::ok();
}

Status read_offload_optimizer(const Json& object, const std::string& path,
                              std::vector<std::string>& warnings, OffloadOptimizerConfig& c) {
    ObjectReader r(object, path, warnings);
    ZINF_TRY(read_offload_device(r, c.device));
    ZINF_TRY(r.get_path_list("nvme_path", c.nvme_path));
    ZINF_TRY(r.get_bool("pin_memory", c.pin_memory));
    ZINF_TRY(r.get_bool("pipeline_read", c.pipeline_read));
    ZINF_TRY(r.get_bool("pipeline_write", c.pipeline_write));
    ZINF_TRY(r.get_tristate("stream_gradients", c.stream_gradients));
    std::string state_dtype(state_dtype_name(c.state_dtype));
    ZINF_TRY(r.get_enum("state_dtype", state_dtype, {"fp32", "bf16", "int8"}));
    c.state_dtype = *find_state_dtype(state_dtype);
    ZINF_TRY(r.finish());
    if (c.device == OffloadDevice::kNvme && c.nvme_path.empty()) {
        return Status::invalid_argument(
            str_cat(path, ".nvme_path: required when ", path, ".device is \"nvme\""));
    }
    return Status::ok();
}

// DeepSpeed's legacy offload switches, mapped to the sections that replaced them with a
// deprecation warning; a legacy switch beside its replacement is an error.
Status read_legacy_offload(ObjectReader& r, const std::string& path,
                           std::vector<std::string>& warnings, bool has_param, bool has_optimizer,
                           ZeroConfig& z) {
    bool cpu_offload = false, cpu_offload_param = false, pin = true;
    const bool has_pin = r.find("cpu_offload_use_pin_memory") != nullptr;
    ZINF_TRY(r.get_bool("cpu_offload", cpu_offload));
    ZINF_TRY(r.get_bool("cpu_offload_param", cpu_offload_param));
    ZINF_TRY(r.get_bool("cpu_offload_use_pin_memory", pin));
    struct Legacy {
        bool on;
        bool replaced_given;
        const char* name;
        const char* replacement;
        OffloadDevice* device;
        bool* pin_memory;
    };
    const Legacy legacy[] = {
        {cpu_offload, has_optimizer, "cpu_offload", "offload_optimizer",
         &z.offload_optimizer.device, &z.offload_optimizer.pin_memory},
        {cpu_offload_param, has_param, "cpu_offload_param", "offload_param",
         &z.offload_param.device, &z.offload_param.pin_memory},
    };
    bool mapped = false;
    for (const Legacy& l : legacy) {
        if (!l.on) continue;
        if (l.replaced_given) {
            return Status::invalid_argument(str_cat(path, ".", l.name, ": deprecated, and ", path,
                                                    ".", l.replacement, " is given too; keep ",
                                                    l.replacement));
        }
        *l.device = OffloadDevice::kCpu;
        if (has_pin) *l.pin_memory = pin;
        mapped = true;
        warnings.push_back(str_cat(
            path, ".", l.name, ": deprecated by DeepSpeed; read as ", path, ".", l.replacement,
            " {\"device\": \"cpu\", \"pin_memory\": ", *l.pin_memory ? "true" : "false", "}"));
    }
    if (has_pin && !mapped) {
        warnings.push_back(str_cat(path,
                                   ".cpu_offload_use_pin_memory: deprecated by DeepSpeed, and "
                                   "no legacy offload switch is on; no effect (use the "
                                   "pin_memory of offload_param / offload_optimizer)"));
    }
    return Status::ok();
}

// The stage's rules: offload_param below stage 3 is ignored by DeepSpeed (a warning here, and
// the parameters stay on the device); offload_optimizer needs a partitioned optimizer.
Status check_stage_offload(const std::string& path, std::vector<std::string>& warnings,
                           ZeroConfig& z) {
    if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
        warnings.push_back(str_cat(
            path, ".offload_param: parameters are offloaded only at stage 3 (partitioned), and ",
            path, ".stage is ", z.stage,
            "; as DeepSpeed does, offload_param is ignored and the "
            "parameters stay on the device"));
        z.offload_param.device = OffloadDevice::kNone;
    }
    if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0) {
        return Status::invalid_argument(str_cat(
            path, ".offload_optimizer.device: \"", offload_device_name(z.offload_optimizer.device),
            "\" needs ", path, ".stage 1, 2 or 3, got stage 0"));
    }
    return Status::ok();
}

Status read_zero(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                 ZeroConfig& z) {
    ObjectReader r(object, path, warnings);
    ZINF_TRY(r.get_int(std::string_view("stage"), z.stage, 0, 3));
    ZINF_TRY(r.get_int(std::string_view("sub_group_size"), z.sub_group_size_numel, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("stage3_prefetch_bucket_size"),
                       z.stage3_prefetch_bucket_size_numel, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("stage3_max_live_parameters"),
                       z.stage3_max_live_parameters_numel, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("stage3_param_persistence_threshold"),
                       z.stage3_param_persistence_threshold_numel, 0, kMaxCount));
    const Json* param = nullptr;
    const Json* optimizer = nullptr;
    ZINF_TRY(r.get_object("offload_param", param));
    ZINF_TRY(r.get_object("offload_optimizer", optimizer));
    if (param != nullptr) {
        ZINF_TRY(read_offload_param(*param, r.path_of("offload_param"), warnings, z.offload_param));
    }
    if (optimizer != nullptr) {
        ZINF_TRY(read_offload_optimizer(*optimizer, r.path_of("offload_optimizer"), warnings,
                                        z.offload_optimizer));
    }
    ZINF_TRY(read_legacy_offload(r, path, warnings, param != nullptr, optimizer != nullptr, z));
    ZINF_TRY(r.finish());
    return check_stage_offload(path, warnings, z);
}

Status read_betas(ObjectReader& p, OptimizerConfig& o) {
    const Json* betas = p.find("betas");
    if (betas == nullptr) return Status::ok();
    if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
        !(*betas)[1].is_number()) {
        return Status::invalid_argument(str_cat(
            p.path_of("betas"), ": expected a list of two numbers in [0, 1), got ", betas->dump()));
    }
    o.beta1 = (*betas)[0].get<double>();
    o.beta2 = (*betas)[1].get<double>();
    if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
        return Status::invalid_argument(
            str_cat(p.path_of("betas"), ": each must be in [0, 1), got ", betas->dump()));
    }
    return Status::ok();
}

Status read_optimizer_params(const Json& params, const std::string& ppath,
                             std::vector<std::string>& warnings, OptimizerConfig& o) {
    ObjectReader p(params, ppath, warnings);
    ZINF_TRY(p.get_double("lr", o.lr, 0.0, 1e6));
    ZINF_TRY(read_betas(p, o));
    ZINF_TRY(p.get_double("eps", o.eps, 0.0, 1.0));
    ZINF_TRY(p.get_double("weight_decay", o.weight_decay, 0.0, 1e3));
    ZINF_TRY(p.get_bool("adam_w_mode", o.adam_w_mode));
    // Keys the optimizer's descriptor says it has no use for are refused, not ignored.
    const OptimizerDescriptor& d = optimizer_descriptor(o.type);
    const std::pair<const char*, bool> owned[] = {{"bias_correction", d.has_bias_correction},
                                                  {"amsgrad", d.has_amsgrad},
                                                  {"torch_rounding", d.has_torch_rounding}};
    for (const auto& [key, has] : owned) {
        if (p.find(key) != nullptr && !has) {
            return Status::invalid_argument(
                str_cat(ppath, ".", key, ": only ",
                        key == std::string_view("amsgrad") ? optimizer_names_where(&has_amsgrad)
                        : key == std::string_view("torch_rounding")
                            ? optimizer_names_where(&has_torch_rounding)
                            : optimizer_names_where(&has_bias_correction),
                        " have it, "
                        "and the optimizer is ",
                        d.display_name));
        }
    }
    ZINF_TRY(p.get_bool("bias_correction", o.bias_correction));
    ZINF_TRY(p.get_bool("amsgrad", o.amsgrad));
    ZINF_TRY(p.get_bool("torch_rounding", o.torch_rounding));
    return p.finish();
}

Status read_optimizer(const Json& object, const std::string& path,
                      std::vector<std::string>& warnings, OptimizerConfig& o) {
    ObjectReader r(object, path, warnings);
    if (const Json* t = r.find("type")) {
        if (!t->is_string()) {
            return Status::invalid_argument(str_cat(r.path_of("type"), ": expected one of ",
                                                    optimizer_names(), ", got ", type_name(*t)));
        }
        const OptimizerDescriptor* d = find_optimizer(t->get<std::string>());
        if (d == nullptr) {
            return Status::invalid_argument(str_cat(r.path_of("type"), ": \"",
                                                    t->get<std::string>(), "\" is not one of ",
                                                    optimizer_names(), " (any case)"));
        }
        o.type = d->kind;
    }
    const OptimizerDescriptor& d = optimizer_descriptor(o.type);
    o.beta1 = d.default_beta1;
    o.beta2 = d.default_beta2;
    const Json* params = nullptr;
    ZINF_TRY(r.get_object("params", params));
    ZINF_TRY(r.finish());
    if (params == nullptr) return Status::ok();
    return read_optimizer_params(*params, join(path, "params"), warnings, o);
}

Status read_scheduler_params(const Json& params, const std::string& ppath,
                             std::vector<std::string>& warnings, SchedulerConfig& s) {
    ObjectReader p(params, ppath, warnings);
    ZINF_TRY(p.get_double("warmup_min_lr", s.warmup_min_lr, 0.0, 1e6));
    ZINF_TRY(p.get_double("warmup_max_lr", s.warmup_max_lr, 0.0, 1e6));
    ZINF_TRY(p.get_int(std::string_view("warmup_num_steps"), s.warmup_num_steps, 0, kMaxCount));
    std::string warmup_type = s.warmup_linear ? "linear" : "log";
    ZINF_TRY(p.get_enum("warmup_type", warmup_type, {"log", "linear"}));
    s.warmup_linear = warmup_type == "linear";
    ZINF_TRY(p.get_int(std::string_view("total_num_steps"), s.total_num_steps, 0, kMaxCount));
    ZINF_TRY(p.get_double("warmup_min_ratio", s.warmup_min_ratio, 0.0, 1e6));
    ZINF_TRY(p.get_double("cos_min_ratio", s.cos_min_ratio, 0.0, 1e6));
    ZINF_TRY(p.get_double("cycle_min_lr", s.cycle_min_lr, 0.0, 1e6));
    ZINF_TRY(p.get_double("cycle_max_lr", s.cycle_max_lr, 0.0, 1e6));
    ZINF_TRY(p.get_double("decay_lr_rate", s.decay_lr_rate, 0.0, 1e6));
    ZINF_TRY(p.get_int(std::string_view("cycle_first_step_size"), s.cycle_first_step_size, 1,
                       kMaxCount));
    s.cycle_second_step_size_given =
        p.find("cycle_second_step_size") != nullptr && !p.find("cycle_second_step_size")->is_null();
    if (s.cycle_second_step_size_given) {
        ZINF_TRY(p.get_int(std::string_view("cycle_second_step_size"), s.cycle_second_step_size, 1,
                           kMaxCount));
    }
    ZINF_TRY(p.get_int(std::string_view("cycle_first_stair_count"), s.cycle_first_stair_count, 0,
                       kMaxCount));
    s.cycle_second_stair_count_given = p.find("cycle_second_stair_count") != nullptr &&
                                       !p.find("cycle_second_stair_count")->is_null();
    if (s.cycle_second_stair_count_given) {
        ZINF_TRY(p.get_int(std::string_view("cycle_second_stair_count"), s.cycle_second_stair_count,
                           0, kMaxCount));
    }
    ZINF_TRY(p.get_int(std::string_view("decay_step_size"), s.decay_step_size, 0, kMaxCount));
    ZINF_TRY(p.get_bool("cycle_momentum", s.cycle_momentum));
    ZINF_TRY(p.get_double("cycle_min_mom", s.cycle_min_mom, 0.0, 1.0));
    ZINF_TRY(p.get_double("cycle_max_mom", s.cycle_max_mom, 0.0, 1.0));
    ZINF_TRY(p.get_double("decay_mom_rate", s.decay_mom_rate, 0.0, 1e6));
    ZINF_TRY(p.get_double("lr_range_test_min_lr", s.lr_range_test_min_lr, 0.0, 1e6));
    ZINF_TRY(p.get_int(std::string_view("lr_range_test_step_size"), s.lr_range_test_step_size, 1,
                       kMaxCount));
    ZINF_TRY(p.get_double("lr_range_test_step_rate", s.lr_range_test_step_rate, 0.0, 1e6));
    ZINF_TRY(p.get_bool("lr_range_test_staircase", s.lr_range_test_staircase));
    ZINF_TRY(p.finish());
    // Required parameters, per schedule.
    const bool needs_total =
        s.type == SchedulerType::kWarmupDecayLR || s.type == SchedulerType::kWarmupCosineLR;
    if (needs_total && p.find("total_num_steps") == nullptr) {
        return Status::invalid_argument(
            str_cat(ppath, ".total_num_steps: required by this schedule"));
    }
    if (s.type == SchedulerType::kOneCycle) {
        for (const char* key : {"cycle_min_lr", "cycle_max_lr"}) {
            if (p.find(key) == nullptr) {
                return Status::invalid_argument(str_cat(ppath, ".", key, ": required by OneCycle"));
            }
        }
    }
    return Status::ok();
}

Status read_scheduler(const Json& object, const std::string& path,
                      std::vector<std::string>& warnings, SchedulerConfig& s) {
    ObjectReader r(object, path, warnings);
    std::string type = "none";
    ZINF_TRY(r.get_enum(
        "type", type,
        {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest", "none"}));
    s.type = type == "WarmupLR"         ? SchedulerType::kWarmupLR
             : type == "WarmupDecayLR"  ? SchedulerType::kWarmupDecayLR
             : type == "WarmupCosineLR" ? SchedulerType::kWarmupCosineLR
             : type == "OneCycle"       ? SchedulerType::kOneCycle
             : type == "LRRangeTest"    ? SchedulerType::kLRRangeTest
                                        : SchedulerType::kNone;
    const Json* params = nullptr;
    ZINF_TRY(r.get_object("params", params));
    ZINF_TRY(r.finish());
    const Json empty = Json::object();
    ZINF_TRY(read_scheduler_params(params != nullptr ? *params : empty, join(path, "params"),
                                   warnings, s));
    if (s.type == SchedulerType::kWarmupDecayLR && s.total_num_steps < s.warmup_num_steps) {
        return Status::invalid_argument(str_cat(path,
                                                ".params.total_num_steps: ", s.total_num_steps,
                                                " is below warmup_num_steps ", s.warmup_num_steps));
    }
    return Status::ok();
}

Status read_model(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                  ModelConfig& m) {
    ObjectReader r(object, path, warnings);
    std::string type = "mlp";
    ZINF_TRY(r.get_enum("type", type, {"mlp", "gpt"}));
    m.type = type == "gpt" ? ModelType::kGpt : ModelType::kMlp;
    if (const Json* layers = r.find("layers")) {
        bool ok = layers->is_array() && layers->size() >= 2;
        std::vector<std::uint64_t> sizes;
        if (ok) {
            for (const auto& item : *layers) {
                if (!item.is_number_integer() && !item.is_number_unsigned()) {
                    ok = false;
                    break;
                }
                const auto v = item.get<std::int64_t>();
                if (v < 1 || v > (std::int64_t{1} << 31)) {
                    ok = false;
                    break;
                }
                sizes.push_back(static_cast<std::uint64_t>(v));
            }
        }
        if (!ok) {
            return Status::invalid_argument(str_cat(
                r.path_of("layers"),
                ": expected a list of at least two integers in [1, 2^31] (input, hidden..., "
                "classes), got ",
                layers->dump()));
        }
        m.layers = std::move(sizes);
    }
    ZINF_TRY(r.get_enum("activation", m.activation, {"relu", "gelu"}));
    ZINF_TRY(r.get_double("dropout", m.dropout, 0.0, 0.999));
    ZINF_TRY(r.get_bool("layernorm", m.layernorm));
    ZINF_TRY(r.get_int(std::string_view("n_layer"), m.n_layer, 1, 4096));
    ZINF_TRY(r.get_int(std::string_view("n_head"), m.n_head, 1, 4096));
    ZINF_TRY(r.get_int(std::string_view("d_model"), m.d_model, 1, 1 << 20));
    ZINF_TRY(r.get_int(std::string_view("seq_len"), m.seq_len, 1, 1 << 20));
    ZINF_TRY(r.get_bool("checkpoint_activations", m.checkpoint_activations));
    ZINF_TRY(r.finish());
    const bool gpt = m.type == ModelType::kGpt;
    for (const char* key : {"n_layer", "n_head", "d_model", "seq_len", "checkpoint_activations"}) {
        if (!gpt && object.contains(key)) {
            return Status::invalid_argument(
                str_cat(r.path_of(key), ": a key of model.type \"gpt\", not of \"mlp\""));
        }
    }
    for (const char* key : {"layers", "activation", "layernorm"}) {
        if (gpt && object.contains(key)) {
            return Status::invalid_argument(
                str_cat(r.path_of(key), ": a key of model.type \"mlp\", not of \"gpt\""));
        }
    }
    if (gpt && m.d_model % m.n_head != 0) {
        return Status::invalid_argument(str_cat(r.path_of("d_model"), ": ", m.d_model,
                                                " is not divisible by model.n_head (", m.n_head,
                                                ")"));
    }
    return Status::ok();
}

Status read_activation_checkpointing(const Json& object, const std::string& path,
                                     std::vector<std::string>& warnings,
                                     ActivationCheckpointingConfig& a) {
    ObjectReader r(object, path, warnings);
    ZINF_TRY(r.get_bool("partition_activations", a.partition_activations));
    ZINF_TRY(r.get_bool("cpu_checkpointing", a.cpu_checkpointing));
    ZINF_TRY(r.get_bool("contiguous_memory_optimization", a.contiguous_memory_optimization));
    if (const Json* n = r.find("number_checkpoints"); n != nullptr && !n->is_null()) {
        ZINF_TRY(
            r.get_int(std::string_view("number_checkpoints"), a.number_checkpoints, 1, 1 << 20));
    }
    ZINF_TRY(r.get_bool("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary));
    ZINF_TRY(r.get_bool("profile", a.profile));
    ZINF_TRY(r.get_bool("nvme_checkpointing", a.nvme_checkpointing));
    ZINF_TRY(r.get_path_list("nvme_path", a.nvme_path));
    ZINF_TRY(r.finish());
    if (a.nvme_checkpointing && a.cpu_checkpointing) {
        return Status::invalid_argument(str_cat(path, ".nvme_checkpointing and ", path,
                                                ".cpu_checkpointing: choose one place"));
    }
    if (a.nvme_checkpointing && a.nvme_path.empty()) {
        return Status::invalid_argument(
            str_cat(path, ".nvme_path: required when ", path, ".nvme_checkpointing is true"));
    }
    return Status::ok();
}

// What the activation_checkpointing block means for the model: warnings for what has no effect.
Status check_activation_checkpointing(const Json& root, EngineConfig& c) {
    const auto block = root.find("activation_checkpointing");
    if (block == root.end()) return Status::ok();
    const ActivationCheckpointingConfig& a = c.activation_checkpointing;
    if (c.model.type != ModelType::kGpt || !c.model.checkpoint_activations) {
        c.warnings.push_back(
            "activation_checkpointing: has no effect unless model.type is \"gpt\" and "
            "model.checkpoint_activations is true");
        return Status::ok();
    }
    if (a.partition_activations) {
        c.warnings.push_back(
            "activation_checkpointing.partition_activations: partitions activations over "
            "model-parallel ranks; zinfinity has no model parallelism (ignored)");
    }
    // Each store locks its directories for the run: the activations need their own.
    for (const auto* offload :
         {&c.zero.offload_param.nvme_path, &c.zero.offload_optimizer.nvme_path}) {
        for (const std::string& p : a.nvme_path) {
            if (std::find(offload->begin(), offload->end(), p) != offload->end()) {
                return Status::invalid_argument(
                    str_cat("activation_checkpointing.nvme_path: ", p,
                            " is also an offload nvme_path; "
                            "the activations need a directory of their own (e.g. ",
                            p, "/activations)"));
            }
        }
    }
    if (a.number_checkpoints != 0 && a.number_checkpoints != c.model.n_layer) {
        c.warnings.push_back(
            str_cat("activation_checkpointing.number_checkpoints: ", a.number_checkpoints,
                    " ignored; zinfinity keeps one per "
                    "block (model.n_layer = ",
                    c.model.n_layer, ")"));
    }
    return Status::ok();
}

Status read_data(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                 DataConfig& d) {
    ObjectReader r(object, path, warnings);
    ZINF_TRY(r.get_enum("dataset", d.dataset, {"fashion-mnist", "synthetic", "text"}));
    if (const Json* p = r.find("path")) {
        if (!p->is_string() || p->get<std::string>().empty()) {
            return Status::invalid_argument(
                str_cat(r.path_of("path"), ": expected a non-empty path string, got ", p->dump()));
        }
        d.path = p->get<std::string>();
    } else if (d.dataset == "text") {
        d.path = kFortunesPath;
    }
    ZINF_TRY(r.get_int(std::string_view("epochs"), d.epochs, 1, 1'000'000));
    ZINF_TRY(r.get_int(std::string_view("max_steps"), d.max_steps, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("synthetic_samples"), d.synthetic_samples, 1,
                       std::int64_t{1} << 32));
    ZINF_TRY(r.get_bool("shuffle", d.shuffle));
    ZINF_TRY(r.get_int(std::string_view("eval_samples"), d.eval_samples, 0, kMaxCount));
    return r.finish();
}

Status read_device(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                   DeviceConfig& d) {
    ObjectReader r(object, path, warnings);
    ZINF_TRY(r.get_enum("type", d.type, {"cpu", "cuda"}));
    ZINF_TRY(
        r.get_int(std::string_view("memory_budget"), d.memory_budget_bytes, 1 << 20, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("local_rank"), d.local_rank, 0, 1023));
    ZINF_TRY(r.get_int(std::string_view("host_memory_budget"), d.host_memory_budget_bytes, 0,
                       kMaxCount));
    return r.finish();
}

Status resolve_batch(const Json& root, int world_size, BatchConfig& b) {
    auto read = [&](const char* key, std::uint64_t& out, bool& present) -> Status {
        present = false;
        auto it = root.find(key);
        if (it == root.end()) return Status::ok();
        if (!it->is_number_integer() && !it->is_number_unsigned()) {
            return Status::invalid_argument(
                str_cat(key, ": expected a positive integer, got ", type_name(*it)));
        }
        const auto v = it->get<std::int64_t>();
        if (v <= 0) {
            return Status::invalid_argument(str_cat(key, ": expected a positive integer, got ", v));
        }
        out = static_cast<std::uint64_t>(v);
        present = true;
        return Status::ok();
    };
    bool has_total = false, has_micro = false, has_accum = false;
    ZINF_TRY(read("train_batch_size", b.train_batch_size, has_total));
    ZINF_TRY(read("train_micro_batch_size_per_gpu", b.train_micro_batch_size_per_gpu, has_micro));
    ZINF_TRY(read("gradient_accumulation_steps", b.gradient_accumulation_steps, has_accum));
    const auto ws = static_cast<std::uint64_t>(world_size);
    if (has_total && has_micro && has_accum) {
        if (b.train_batch_size !=
            b.train_micro_batch_size_per_gpu * b.gradient_accumulation_steps * ws) {
            return Status::invalid_argument(str_cat(
                "train_batch_size: ", b.train_batch_size, " != train_micro_batch_size_per_gpu ",
                b.train_micro_batch_size_per_gpu, " x gradient_accumulation_steps ",
                b.gradient_accumulation_steps, " x world size ", ws));
        }
    } else if (has_total && has_micro) {
        if (b.train_batch_size % (b.train_micro_batch_size_per_gpu * ws) != 0) {
            return Status::invalid_argument(
                str_cat("train_batch_size: ", b.train_batch_size,
                        " is not divisible by train_micro_batch_size_per_gpu ",
                        b.train_micro_batch_size_per_gpu, " x world size ", ws));
        }
        b.gradient_accumulation_steps =
            b.train_batch_size / (b.train_micro_batch_size_per_gpu * ws);
    } else if (has_total && has_accum) {
        if (b.train_batch_size % (b.gradient_accumulation_steps * ws) != 0) {
            return Status::invalid_argument(
                str_cat("train_batch_size: ", b.train_batch_size,
                        " is not divisible by gradient_accumulation_steps ",
                        b.gradient_accumulation_steps, " x world size ", ws));
        }
        b.train_micro_batch_size_per_gpu =
            b.train_batch_size / (b.gradient_accumulation_steps * ws);
    } else if (has_micro && has_accum) {
        b.train_batch_size = b.train_micro_batch_size_per_gpu * b.gradient_accumulation_steps * ws;
    } else if (has_total) {
        if (b.train_batch_size % ws != 0) {
            return Status::invalid_argument(str_cat("train_batch_size: ", b.train_batch_size,
                                                    " is not divisible by world size ", ws));
        }
        b.gradient_accumulation_steps = 1;
        b.train_micro_batch_size_per_gpu = b.train_batch_size / ws;
    } else if (has_micro) {
        b.gradient_accumulation_steps = 1;
        b.train_batch_size = b.train_micro_batch_size_per_gpu * ws;
    } else {
        // DeepSpeed requires one of them; a config used only for I/O (the bench) has none.
        b.train_micro_batch_size_per_gpu = 1;
        b.gradient_accumulation_steps = has_accum ? b.gradient_accumulation_steps : 1;
        b.train_batch_size = b.train_micro_batch_size_per_gpu * b.gradient_accumulation_steps * ws;
    }
    return Status::ok();
}

// Applies one `a.b.c=value` override; value is parsed as JSON, else taken as a string.
Status apply_override(Json& root, const std::string& assignment) {
    const auto eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
        return Status::invalid_argument(
            str_cat("--set ", assignment, ": expected key.path=value (e.g. aio.queue_depth=16)"));
    }
    const std::string key_path = assignment.substr(0, eq);
    const std::string text = assignment.substr(eq + 1);
    Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = text;
    Json* node = &root;
    std::size_t start = 0;
    while (true) {
        const auto dot = key_path.find('.', start);
        const std::string part =
            key_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (part.empty())
            return Status::invalid_argument(str_cat("--set ", assignment, ": empty key"));
        if (!node->is_object()) {
            return Status::invalid_argument(str_cat(
                "--set ", assignment, ": ", key_path.substr(0, start - 1), " is not an object"));
        }
        if (dot == std::string::npos) {
            (*node)[part] = value;
            return Status::ok();
        }
        node = &(*node)[part];
        if (node->is_null()) *node = Json::object();
        start = dot + 1;
    }
}

// What may combine with what, checked once here for every layer below: the engine's plan trusts
// it. (offload_param needs stage 3 and offload_optimizer stage 1-3: read_zero.)
Status check_placement(const EngineConfig& c) {
    const auto& zc = c.zero;
    if (c.device.type != "cpu" && zc.offload_optimizer.device == OffloadDevice::kNone) {
        return Status::not_supported(str_cat(
            "zero_optimization.offload_optimizer.device: \"none\" on device.type \"", c.device.type,
            "\" needs a device optimizer, not implemented yet; use \"cpu\" or "
            "\"nvme\""));
    }
    if (c.device.type != "cpu" && zc.offload_param.device == OffloadDevice::kCpu) {
        return Status::not_supported(str_cat(
            "zero_optimization.offload_param.device: \"cpu\" is implemented for device.type "
            "\"cpu\" only, got \"",
            c.device.type, "\"; use \"nvme\" or \"none\""));
    }
    const StateDType state_dtype = zc.offload_optimizer.state_dtype;
    if (state_dtype != StateDType::kFp32) {
        const OptimizerDescriptor& d = optimizer_descriptor(c.optimizer.type);
        if (!is_builtin(d)) {
            return Status::not_supported(str_cat(
                "zero_optimization.offload_optimizer.state_dtype: \"",
                state_dtype_name(state_dtype), "\" has kernels for the built-in optimizers (",
                optimizer_names_where(&is_builtin), ") only; ", d.display_name,
                " keeps fp32 states"));
        }
        if (c.optimizer.torch_rounding) {
            return Status::invalid_argument(str_cat(
                "zero_optimization.offload_optimizer.state_dtype: \"",
                state_dtype_name(state_dtype),
                "\" with optimizer.params.torch_rounding: torch.optim's rounding is defined for "
                "fp32 states only; drop one of them"));
        }
    }
    return Status::ok();
}

Status read_precision(ObjectReader& r, EngineConfig& c) {
    const Json* sub = nullptr;
    ZINF_TRY(r.get_object("bf16", sub));
    if (sub != nullptr) {
        ObjectReader b(*sub, "bf16", c.warnings);
        ZINF_TRY(b.get_bool("enabled", c.bf16.enabled));
        ZINF_TRY(b.finish());
    }
    ZINF_TRY(r.get_object("fp16", sub));
    if (sub != nullptr) {
        ObjectReader f(*sub, "fp16", c.warnings);
        ZINF_TRY(f.get_bool("enabled", c.fp16.enabled));
        ZINF_TRY(f.get_double("loss_scale", c.fp16.loss_scale, 0.0, 1e30));
        ZINF_TRY(
            f.get_int(std::string_view("initial_scale_power"), c.fp16.initial_scale_power, 0, 64));
        ZINF_TRY(f.get_int(std::string_view("loss_scale_window"), c.fp16.loss_scale_window, 1,
                           1'000'000'000));
        ZINF_TRY(f.get_int(std::string_view("hysteresis"), c.fp16.hysteresis, 1, 1'000'000));
        ZINF_TRY(f.get_double("min_loss_scale", c.fp16.min_loss_scale, 0.0, 1e30));
        ZINF_TRY(f.finish());
    }
    if (c.bf16.enabled && c.fp16.enabled) {
        return Status::invalid_argument("bf16.enabled and fp16.enabled: choose one");
    }
    ZINF_TRY(r.get_object("data_types", sub));
    if (sub != nullptr) {
        ObjectReader d(*sub, "data_types", c.warnings);
        ZINF_TRY(d.finish());  // grad_accum_dtype: default only
    }
    return Status::ok();
}

// DeepSpeed's `csv_monitor`: its keys and defaults (deepspeed/monitor/config.py, CSVConfig).
Status read_csv_monitor(ObjectReader& r, EngineConfig& c) {
    const Json* sub = nullptr;
    ZINF_TRY(r.get_object("csv_monitor", sub));
    if (sub == nullptr) return Status::ok();
    ObjectReader m(*sub, "csv_monitor", c.warnings);
    CsvMonitorConfig& o = c.csv_monitor;
    ZINF_TRY(m.get_bool("enabled", o.enabled));
    ZINF_TRY(m.get_string("output_path", o.output_path));
    ZINF_TRY(m.get_string("job_name", o.job_name));
    ZINF_TRY(m.finish());
    if (o.enabled && o.output_path.empty() && o.job_name.empty()) {
        // DeepSpeed would write its files into "/" (the join of two empty names, then "/").
        return Status::invalid_argument(
            "csv_monitor.output_path and csv_monitor.job_name: both empty; name a directory");
    }
    return Status::ok();
}

// zinfinity's own blocks.
Status read_zinfinity_blocks(ObjectReader& r, EngineConfig& c) {
    const Json* sub = nullptr;
    ZINF_TRY(r.get_object("swap", sub));
    if (sub != nullptr) {
        ObjectReader s(*sub, "swap", c.warnings);
        ZINF_TRY(s.get_bool("verify_checksums", c.swap.verify_checksums));
        ZINF_TRY(s.get_bool("background_checkpoint", c.swap.background_checkpoint));
        ZINF_TRY(s.get_bool("overlap_step", c.swap.overlap_step));
        // At most swap::OptimizerSwapper::kMaxReadAhead.
        ZINF_TRY(
            s.get_int(std::string_view("optimizer_read_ahead"), c.swap.optimizer_read_ahead, 1, 8));
        ZINF_TRY(s.finish());
    }
    ZINF_TRY(r.get_object("comm", sub));
    if (sub != nullptr) {
        ObjectReader s(*sub, "comm", c.warnings);
        ZINF_TRY(s.get_bool("deterministic", c.comm.deterministic));
        ZINF_TRY(s.get_int(std::string_view("timeout_s"), c.comm.timeout_s, 0,
                           std::int64_t{7} * 24 * 3600));
        ZINF_TRY(s.finish());
    }
    ZINF_TRY(r.get_object("model", sub));
    if (sub != nullptr) ZINF_TRY(read_model(*sub, "model", c.warnings, c.model));
    ZINF_TRY(r.get_object("data", sub));
    if (sub != nullptr) ZINF_TRY(read_data(*sub, "data", c.warnings, c.data));
    ZINF_TRY(r.get_object("activation_checkpointing", sub));
    if (sub != nullptr) {
        ZINF_TRY(read_activation_checkpointing(*sub, "activation_checkpointing", c.warnings,
                                               c.activation_checkpointing));
    }
    ZINF_TRY(r.get_object("device", sub));
    if (sub != nullptr) ZINF_TRY(read_device(*sub, "device", c.warnings, c.device));
    ZINF_TRY(r.get_object("cpu_optimizer", sub));
    if (sub != nullptr) {
        ObjectReader s(*sub, "cpu_optimizer", c.warnings);
        ZINF_TRY(s.get_enum("isa", c.cpu_optimizer.isa, {"auto", "avx512", "avx2", "scalar"}));
        ZINF_TRY(s.get_int(std::string_view("threads"), c.cpu_optimizer.threads, 0, 4096));
        ZINF_TRY(s.finish());
    }
    return Status::ok();
}

Status read_root(const Json& root, const LoadOptions& options, EngineConfig& c) {
    if (!root.is_object()) {
        return Status::invalid_argument(
            str_cat("expected a JSON object at top level, got ", type_name(root)));
    }
    ObjectReader r(root, "", c.warnings);
    // Batch keys are read by resolve_batch; mark them known here.
    r.find("train_batch_size");
    r.find("train_micro_batch_size_per_gpu");
    r.find("gradient_accumulation_steps");
    ZINF_TRY(resolve_batch(root, options.world_size, c.batch));
    ZINF_TRY(r.get_double("gradient_clipping", c.gradient_clipping, 0.0, 1e12));
    ZINF_TRY(r.get_int(std::string_view("steps_per_print"), c.steps_per_print, 1, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("seed"), c.seed, 0, kMaxCount));

    const Json* sub = nullptr;
    ZINF_TRY(r.get_object("aio", sub));
    if (sub != nullptr) ZINF_TRY(read_aio(*sub, "aio", c.warnings, c.aio));
    ZINF_TRY(r.get_object("zero_optimization", sub));
    if (sub != nullptr) ZINF_TRY(read_zero(*sub, "zero_optimization", c.warnings, c.zero));
    ZINF_TRY(read_precision(r, c));
    ZINF_TRY(r.get_object("optimizer", sub));
    if (sub != nullptr) ZINF_TRY(read_optimizer(*sub, "optimizer", c.warnings, c.optimizer));
    ZINF_TRY(r.get_object("scheduler", sub));
    if (sub != nullptr) ZINF_TRY(read_scheduler(*sub, "scheduler", c.warnings, c.scheduler));
    ZINF_TRY(read_csv_monitor(r, c));
    ZINF_TRY(read_zinfinity_blocks(r, c));
    ZINF_TRY(r.finish());
    ZINF_TRY(check_activation_checkpointing(root, c));
    return check_placement(c);
}

// ---- "auto" ---------------------------------------------------------------------------------
// Hugging Face's DeepSpeed configs are full of "auto", which its Trainer fills in from its own
// arguments. zinfinity resolves what it can determine (batch sizes from each other, bucket and
// prefetch sizes from the model's hidden size as Hugging Face does, optimizer hyperparameters
// and precision switches from their defaults), records each resolution, and leaves the rest:
// reading an "auto" left over is an error that names the key.

bool is_auto(const Json* v) {
    return v != nullptr && v->is_string() && v->get<std::string>() == "auto";
}

// The model's hidden size for Hugging Face's bucket formulas: a gpt's d_model, or the widest
// hidden layer of the MLP (its input width when it has none).
std::uint64_t hidden_size(const Json& root) {
    std::vector<std::uint64_t> layers = ModelConfig{}.layers;
    const auto model = root.find("model");
    if (model != root.end() && model->is_object()) {
        const auto type = model->find("type");
        if (type != model->end() && type->is_string() && type->get<std::string>() == "gpt") {
            const auto d = model->find("d_model");
            return d != model->end() && d->is_number_unsigned() ? d->get<std::uint64_t>()
                                                                : ModelConfig{}.d_model;
        }
        const auto l = model->find("layers");
        if (l != model->end() && l->is_array() && l->size() >= 2) {
            layers.clear();
            for (const auto& v : *l)
                layers.push_back(v.is_number_unsigned() ? v.get<std::uint64_t>() : 0);
        }
    }
    if (layers.size() <= 2) return layers.front();
    return *std::max_element(layers.begin() + 1, layers.end() - 1);
}

void resolve_optimizer_auto(Json& root, std::vector<std::string>& notes) {
    auto opt = root.find("optimizer");
    if (opt == root.end() || !opt->is_object()) return;
    auto params = opt->find("params");
    if (params == opt->end() || !params->is_object()) return;
    const auto type = opt->find("type");
    const bool lion = type != opt->end() && type->is_string() &&
                      (type->get<std::string>() == "Lion" || type->get<std::string>() == "lion");
    const OptimizerConfig defaults;
    const std::pair<const char*, Json> fill[] = {
        {"lr", defaults.lr},
        {"betas", Json::array({0.9, lion ? 0.99 : 0.999})},
        {"eps", defaults.eps},
        {"weight_decay", defaults.weight_decay},
    };
    for (const auto& [key, value] : fill) {
        auto it = params->find(key);
        if (it == params->end() || !is_auto(&*it)) continue;
        *it = value;
        notes.push_back(
            str_cat("optimizer.params.", key, ": auto -> ", value.dump(), " (the default)"));
    }
}

void resolve_block_auto(Json& root, std::vector<std::string>& notes) {
    for (const char* block : {"fp16", "bf16"}) {
        auto it = root.find(block);
        if (it == root.end() || !it->is_object()) continue;
        auto enabled = it->find("enabled");
        if (enabled == it->end() || !is_auto(&*enabled)) continue;
        *enabled = false;
        notes.push_back(str_cat(block,
                                ".enabled: auto -> false (DeepSpeed's default; set true to "
                                "train in ",
                                block, ")"));
    }
    auto zero = root.find("zero_optimization");
    if (zero != root.end() && zero->is_object()) {
        const std::uint64_t h = hidden_size(root);
        const std::pair<const char*, std::uint64_t> sizes[] = {
            {"reduce_bucket_size", h * h},
            {"stage3_prefetch_bucket_size",
             static_cast<std::uint64_t>(0.9 * static_cast<double>(h * h))},
            {"prefetch_bucket_size", static_cast<std::uint64_t>(0.9 * static_cast<double>(h * h))},
            {"stage3_param_persistence_threshold", 10 * h},
            {"param_persistence_threshold", 10 * h},
        };
        for (const auto& [key, value] : sizes) {
            auto it = zero->find(key);
            if (it == zero->end() || !is_auto(&*it)) continue;
            *it = value;
            notes.push_back(str_cat("zero_optimization.", key, ": auto -> ", value,
                                    " (from the model's hidden size ", h,
                                    ", as Hugging Face does)"));
        }
    }
    auto sched = root.find("scheduler");
    if (sched == root.end() || !sched->is_object()) return;
    auto params = sched->find("params");
    if (params == sched->end() || !params->is_object()) return;
    if (auto it = params->find("warmup_min_lr"); it != params->end() && is_auto(&*it)) {
        *it = 0.0;
        notes.push_back("scheduler.params.warmup_min_lr: auto -> 0 (the default)");
    }
    if (auto it = params->find("warmup_max_lr"); it != params->end() && is_auto(&*it)) {
        double lr = OptimizerConfig{}.lr;
        const auto opt = root.find("optimizer");
        if (opt != root.end() && opt->contains("params") && (*opt)["params"].contains("lr") &&
            (*opt)["params"]["lr"].is_number()) {
            lr = (*opt)["params"]["lr"].get<double>();
        }
        *it = lr;
        notes.push_back(
            str_cat("scheduler.params.warmup_max_lr: auto -> ", lr, " (optimizer.params.lr)"));
    }
}

// Batch keys: an "auto" is dropped so that resolve_batch derives it from the others;
// gradient_accumulation_steps falls back to 1 (DeepSpeed's default) when the others cannot give
// it. Returns the names dropped, for the notes once their values are known.
Result<std::vector<std::string>> resolve_batch_auto(Json& root) {
    std::vector<std::string> dropped;
    for (const char* key :
         {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
        auto it = root.find(key);
        if (it == root.end() || !is_auto(&*it)) continue;
        root.erase(it);
        dropped.emplace_back(key);
    }
    const auto has = [&](const char* key) { return root.contains(key); };
    const auto dropped_key = [&](const char* key) {
        return std::find(dropped.begin(), dropped.end(), key) != dropped.end();
    };
    if (dropped_key("gradient_accumulation_steps") &&
        !(has("train_batch_size") && has("train_micro_batch_size_per_gpu"))) {
        root["gradient_accumulation_steps"] = 1;
    }
    if (dropped_key("train_micro_batch_size_per_gpu") && !has("train_batch_size")) {
        return Status::invalid_argument(
            "train_micro_batch_size_per_gpu: \"auto\" cannot be resolved: give it, or give "
            "train_batch_size (zinfinity has no Hugging Face arguments to take it from)");
    }
    return dropped;
}

Result<EngineConfig> load_json(const Json& parsed, const LoadOptions& options,
                               std::string_view source_name) {
    if (options.world_size < 1) {
        return Status::invalid_argument(
            str_cat("world size must be at least 1, got ", options.world_size));
    }
    Json root = parsed;
    for (const auto& assignment : options.overrides) ZINF_TRY(apply_override(root, assignment));
    EngineConfig config;
    std::vector<std::string> dropped;
    if (root.is_object()) {
        resolve_optimizer_auto(root, config.resolved);
        resolve_block_auto(root, config.resolved);
        auto batch = resolve_batch_auto(root);
        if (!batch.has_value()) return batch.error().with_context(source_name);
        dropped = std::move(*batch);
    }
    Status status = read_root(root, options, config);
    if (!status.is_ok()) return status.with_context(source_name);
    for (const auto& key : dropped) {
        const std::uint64_t value = key == "train_batch_size" ? config.batch.train_batch_size
                                    : key == "train_micro_batch_size_per_gpu"
                                        ? config.batch.train_micro_batch_size_per_gpu
                                        : config.batch.gradient_accumulation_steps;
        config.resolved.push_back(str_cat(key, ": auto -> ", value,
                                          " (train_batch_size = micro x "
                                          "accumulation x world size ",
                                          options.world_size, ")"));
    }
    config.canonical_json = root.dump();  // nlohmann's object keeps keys sorted
    if (options.log_warnings) {
        for (const auto& w : config.warnings) log::warn_once(w, str_cat(source_name, ": ", w));
        for (const auto& n : config.resolved) log::info(source_name, ": ", n);
    }
    return config;
}

Result<Json> parse_text(std::string_view json_text, std::string_view source_name) {
    try {
        return Json::parse(json_text.begin(), json_text.end(), nullptr, true,
                           /*ignore_comments=*/true);
    } catch (const Json::parse_error& e) {
        return Status::invalid_argument(str_cat(source_name, ": not valid JSON: ", e.what()));
    } catch (const std::exception& e) {
        return Status::invalid_argument(str_cat(source_name, ": ", e.what()));
    }
}

}  // namespace

std::string_view offload_device_name(OffloadDevice device) noexcept {
    switch (device) {
        case OffloadDevice::kNone:
            return "none";
        case OffloadDevice::kCpu:
            return "cpu";
        case OffloadDevice::kNvme:
            return "nvme";
    }
    return "none";
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

Result<EngineConfig> load_from_string(std::string_view json_text, const LoadOptions& options,
                                      std::string_view source_name) {
    try {
        ZINF_ASSIGN_OR_RETURN(Json root, parse_text(json_text, source_name));
        return load_json(root, options, source_name);
    } catch (const std::exception& e) {
        return Status::invalid_argument(str_cat(source_name, ": ", e.what()));
    }
}

Result<EngineConfig> load(const std::string& path, const LoadOptions& options) {
    std::ifstream in(path);
    if (!in) {
        return Status::not_found(
            str_cat("config file ", path, ": cannot open (", std::strerror(errno), ")"), errno);
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    return load_from_string(buffer.str(), options, path);
}

Result<AioConfig> load_aio_from_string(std::string_view json_text, std::string_view source_name) {
    try {
        ZINF_ASSIGN_OR_RETURN(Json root, parse_text(json_text, source_name));
        // Accept both {"aio": {...}} and a bare {...} aio object.
        const Json* object = &root;
        if (root.is_object() && root.contains("aio") && root.size() == 1) object = &root["aio"];
        if (!object->is_object()) {
            return Status::invalid_argument(str_cat(source_name, ": expected an aio object"));
        }
        std::vector<std::string> warnings;
        AioConfig aio;
        Status status = read_aio(*object, "aio", warnings, aio);
        if (!status.is_ok()) return status.with_context(source_name);
        for (const auto& w : warnings) log::warn_once(w, str_cat(source_name, ": ", w));
        return aio;
    } catch (const std::exception& e) {
        return Status::invalid_argument(str_cat(source_name, ": ", e.what()));
    }
}

std::string aio_to_json(const AioConfig& aio, int indent) {
    Json j = Json::object();
    j["block_size"] = aio.block_size_bytes;
    j["queue_depth"] = aio.queue_depth;
    j["intra_op_parallelism"] = aio.intra_op_parallelism;
    j["single_submit"] = aio.single_submit;
    j["overlap_events"] = aio.overlap_events;
    j["backend"] = aio.backend;
    j["use_direct"] =
        aio.use_direct == Tristate::kAuto ? Json("auto") : Json(aio.use_direct == Tristate::kOn);
    j["register_buffers"] = aio.register_buffers;
    j["sqpoll"] = aio.sqpoll;
    Json root = Json::object();
    root["aio"] = j;
    return root.dump(indent);
}

Result<std::string> apply_overrides(std::string_view json_text,
                                    const std::vector<std::string>& overrides, int indent) {
    Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object()) {
        return Status::invalid_argument("not a JSON object");
    }
    for (const auto& assignment : overrides) ZINF_TRY(apply_override(root, assignment));
    return root.dump(indent);
}

}  // namespace zinf::config
