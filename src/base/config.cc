// Config loading: nlohmann::json is parsed here and nowhere else. Its exceptions are caught and
// turned into Status. Each object is read by an ObjectReader that knows the keys zinfinity
// implements and the DeepSpeed keys it does not: the latter draw one warning each, anything else
// is an error that names the key path and suggests the nearest valid key.
#include "src/base/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/base/log.h"

namespace zinf::config {
namespace {

using Json = nlohmann::json;

std::string type_name(const Json& value) {
    if (value.is_boolean()) return "boolean";
    if (value.is_number_integer() || value.is_number_unsigned()) return "integer";
    if (value.is_number_float()) return "number";
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

// Reads one JSON object; tracks which keys were consumed so that `finish()` can flag the rest.
class ObjectReader {
public:
    ObjectReader(const Json& object, std::string path, std::vector<std::string>& warnings,
                 std::initializer_list<std::string_view> deepspeed_unimplemented)
        : object_(object), path_(std::move(path)), warnings_(warnings),
          deepspeed_unimplemented_(deepspeed_unimplemented) {}

    std::string path_of(std::string_view key) const { return join(path_, key); }

    const Json* find(std::string_view key) {
        known_.emplace(key);
        auto it = object_.find(std::string(key));
        if (it == object_.end()) return nullptr;
        return &*it;
    }

    Status get_bool(std::string_view key, bool& out) {
        const Json* value = find(key);
        if (value == nullptr) return Status::ok();
        if (!value->is_boolean()) return type_error(key, "boolean (true or false)", *value);
        out = value->get<bool>();
        return Status::ok();
    }

    template <typename Int>
    Status get_int(std::string_view key, Int& out, std::int64_t min, std::int64_t max) {
        const Json* value = find(key);
        if (value == nullptr) return Status::ok();
        std::int64_t v = 0;
        if (value->is_number_integer()) {
            v = value->get<std::int64_t>();
        } else if (value->is_number_unsigned()) {
            const auto u = value->get<std::uint64_t>();
            if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
                return range_error(key, min, max, str_cat(u));
            }
            v = static_cast<std::int64_t>(u);
        } else if (value->is_number_float()) {
            // DeepSpeed configs often write element counts as 1e8; accept whole floats.
            const double d = value->get<double>();
            if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.2e18) {
                return type_error(key, str_cat("integer in [", min, ", ", max, "]"), *value);
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
        const Json* value = find(key);
        if (value == nullptr) return Status::ok();
        if (!value->is_number()) return type_error(key, str_cat("number in [", min, ", ", max, "]"), *value);
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
        const Json* value = find(key);
        if (value == nullptr) return Status::ok();
        std::string choice_list;
        for (auto c : choices) choice_list += str_cat(choice_list.empty() ? "" : ", ", "\"", c, "\"");
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

    // A string or a list of non-empty strings.
    Status get_path_list(std::string_view key, std::vector<std::string>& out) {
        const Json* value = find(key);
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
        out = find(key);
        if (out != nullptr && !out->is_object()) return type_error(key, "object", *out);
        return Status::ok();
    }

    // Flags every key that no get_* asked for.
    Status finish() {
        for (auto it = object_.begin(); it != object_.end(); ++it) {
            const std::string& key = it.key();
            if (known_.count(key) != 0) continue;
            if (std::find(deepspeed_unimplemented_.begin(), deepspeed_unimplemented_.end(), key) !=
                deepspeed_unimplemented_.end()) {
                warnings_.push_back(str_cat(path_of(key),
                                            ": DeepSpeed key not implemented by zinfinity; ignored"));
                continue;
            }
            std::string best;
            std::size_t best_distance = std::numeric_limits<std::size_t>::max();
            auto consider = [&](std::string_view candidate) {
                const std::size_t d = edit_distance(key, candidate);
                if (d < best_distance) {
                    best_distance = d;
                    best = candidate;
                }
            };
            for (const auto& k : known_) consider(k);
            for (auto k : deepspeed_unimplemented_) consider(k);
            std::string message = str_cat(path_of(key), ": unknown key");
            if (!best.empty() && best_distance <= std::max<std::size_t>(3, key.size() / 2)) {
                message += str_cat("; did you mean '", path_of(best), "'?");
            } else if (!known_.empty()) {
                std::string list;
                for (const auto& k : known_) list += str_cat(list.empty() ? "" : ", ", k);
                message += str_cat(" (valid keys here: ", list, ")");
            }
            return Status::invalid_argument(message);
        }
        return Status::ok();
    }

private:
    Status type_error(std::string_view key, std::string_view expected, const Json& got) const {
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
    std::vector<std::string_view> deepspeed_unimplemented_;
    std::set<std::string, std::less<>> known_;
};

constexpr std::int64_t kMaxCount = std::numeric_limits<std::int64_t>::max();

Status read_aio(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                AioConfig& aio) {
    ObjectReader r(object, path, warnings, {"use_gds"});
    std::int64_t block_size = static_cast<std::int64_t>(aio.block_size_bytes);
    ZINF_TRY(r.get_int(std::string_view("block_size"), block_size, 512, std::int64_t{1} << 30));
    if (block_size % 512 != 0) {
        return Status::invalid_argument(str_cat(
            r.path_of("block_size"), ": expected a multiple of 512 bytes (the smallest logical block "
            "size of any file system), got ", block_size));
    }
    aio.block_size_bytes = static_cast<std::uint64_t>(block_size);
    ZINF_TRY(r.get_int(std::string_view("queue_depth"), aio.queue_depth, 1, 4096));
    // `thread_count` is the older name of `intra_op_parallelism`; DeepSpeed now ignores it
    // silently, zinfinity honours it (and refuses both at once when they disagree).
    int thread_count = 0;
    const bool has_thread_count = r.find("thread_count") != nullptr;
    const bool has_intra = r.find("intra_op_parallelism") != nullptr;
    ZINF_TRY(r.get_int(std::string_view("thread_count"), thread_count, 1, 256));
    ZINF_TRY(r.get_int(std::string_view("intra_op_parallelism"), aio.intra_op_parallelism, 1, 256));
    if (has_thread_count) {
        if (has_intra && thread_count != aio.intra_op_parallelism) {
            return Status::invalid_argument(str_cat(
                r.path_of("thread_count"), ": ", thread_count, " disagrees with ",
                r.path_of("intra_op_parallelism"), ": ", aio.intra_op_parallelism,
                " (thread_count is the older name of the same setting; keep one)"));
        }
        aio.intra_op_parallelism = thread_count;
    }
    ZINF_TRY(r.get_bool("single_submit", aio.single_submit));
    ZINF_TRY(r.get_bool("overlap_events", aio.overlap_events));
    ZINF_TRY(r.get_enum("backend", aio.backend, {"auto", "io_uring", "libaio", "posix"}));
    if (const Json* v = r.find("use_direct")) {
        if (v->is_boolean()) {
            aio.use_direct = v->get<bool>() ? Tristate::kOn : Tristate::kOff;
        } else if (v->is_string() && v->get<std::string>() == "auto") {
            aio.use_direct = Tristate::kAuto;
        } else {
            return Status::invalid_argument(str_cat(r.path_of("use_direct"),
                                                    ": expected true, false or \"auto\", got ",
                                                    type_name(*v)));
        }
    }
    ZINF_TRY(r.get_bool("register_buffers", aio.register_buffers));
    ZINF_TRY(r.get_bool("sqpoll", aio.sqpoll));
    return r.finish();
}

Status read_offload_device(ObjectReader& r, OffloadDevice& device) {
    std::string name = std::string(offload_device_name(device));
    ZINF_TRY(r.get_enum("device", name, {"none", "cpu", "nvme"}));
    device = name == "cpu" ? OffloadDevice::kCpu : name == "nvme" ? OffloadDevice::kNvme : OffloadDevice::kNone;
    return Status::ok();
}

Status read_offload_param(const Json& object, const std::string& path,
                          std::vector<std::string>& warnings, OffloadParamConfig& c) {
    ObjectReader r(object, path, warnings, {});
    ZINF_TRY(read_offload_device(r, c.device));
    ZINF_TRY(r.get_path_list("nvme_path", c.nvme_path));
    ZINF_TRY(r.get_int(std::string_view("buffer_count"), c.buffer_count, 1, 1024));
    ZINF_TRY(r.get_int(std::string_view("buffer_size"), c.buffer_size_numel, 1, kMaxCount));
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
    ObjectReader r(object, path, warnings, {"ratio"});
    ZINF_TRY(read_offload_device(r, c.device));
    ZINF_TRY(r.get_path_list("nvme_path", c.nvme_path));
    ZINF_TRY(r.get_int(std::string_view("buffer_count"), c.buffer_count, 1, 1024));
    ZINF_TRY(r.get_bool("pin_memory", c.pin_memory));
    ZINF_TRY(r.get_bool("pipeline_read", c.pipeline_read));
    ZINF_TRY(r.get_bool("pipeline_write", c.pipeline_write));
    ZINF_TRY(r.get_bool("fast_init", c.fast_init));
    ZINF_TRY(r.finish());
    if (c.device == OffloadDevice::kNvme && c.nvme_path.empty()) {
        return Status::invalid_argument(
            str_cat(path, ".nvme_path: required when ", path, ".device is \"nvme\""));
    }
    return Status::ok();
}

Status read_zero(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                 ZeroConfig& z) {
    ObjectReader r(object, path, warnings,
                   {"allgather_partitions", "reduce_scatter", "elastic_checkpoint",
                    "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save",
                    "stage3_gather_fp16_weights_on_model_save", "zero_hpz_partition_size",
                    "zero_quantized_weights", "zero_quantized_gradients", "ignore_unused_parameters",
                    "legacy_stage1", "cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory",
                    "memory_efficient_linear", "mics_shard_size", "mics_hierarchical_params_gather",
                    "stage3_model_persistence_threshold", "load_from_fp32_weights",
                    "use_multi_rank_bucket_allreduce", "module_granularity_threshold",
                    "log_trace_cache_warnings", "zeropp_loco_param", "use_all_reduce_for_fetch_params"});
    ZINF_TRY(r.get_int(std::string_view("stage"), z.stage, 0, 3));
    ZINF_TRY(r.get_bool("contiguous_gradients", z.contiguous_gradients));
    ZINF_TRY(r.get_bool("overlap_comm", z.overlap_comm));
    ZINF_TRY(r.get_int(std::string_view("reduce_bucket_size"), z.reduce_bucket_size_numel, 1, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("allgather_bucket_size"), z.allgather_bucket_size_numel, 1, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("sub_group_size"), z.sub_group_size_numel, 1, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("stage3_prefetch_bucket_size"),
                       z.stage3_prefetch_bucket_size_numel, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("stage3_max_live_parameters"),
                       z.stage3_max_live_parameters_numel, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("stage3_max_reuse_distance"),
                       z.stage3_max_reuse_distance_numel, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("stage3_param_persistence_threshold"),
                       z.stage3_param_persistence_threshold_numel, 0, kMaxCount));
    const Json* sub = nullptr;
    ZINF_TRY(r.get_object("offload_param", sub));
    if (sub != nullptr) {
        ZINF_TRY(read_offload_param(*sub, r.path_of("offload_param"), warnings, z.offload_param));
    }
    ZINF_TRY(r.get_object("offload_optimizer", sub));
    if (sub != nullptr) {
        ZINF_TRY(read_offload_optimizer(*sub, r.path_of("offload_optimizer"), warnings,
                                        z.offload_optimizer));
    }
    ZINF_TRY(r.finish());
    if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
        return Status::invalid_argument(str_cat(
            path, ".offload_param.device: \"", offload_device_name(z.offload_param.device),
            "\" needs ", path, ".stage 3 (parameters are offloaded only when partitioned), got stage ",
            z.stage));
    }
    if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0) {
        return Status::invalid_argument(str_cat(
            path, ".offload_optimizer.device: \"", offload_device_name(z.offload_optimizer.device),
            "\" needs ", path, ".stage 1, 2 or 3, got stage 0"));
    }
    return Status::ok();
}

Status read_optimizer(const Json& object, const std::string& path,
                      std::vector<std::string>& warnings, OptimizerConfig& o) {
    ObjectReader r(object, path, warnings, {"legacy_fusion"});
    std::string type = std::string(optimizer_type_name(o.type));
    ZINF_TRY(r.get_enum("type", type, {"Adam", "AdamW", "Adagrad", "Lion", "adam", "adamw",
                                       "adagrad", "lion"}));
    std::string lower = type;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) {
        return static_cast<char>(std::tolower(ch));
    });
    o.type = lower == "adam"    ? OptimizerType::kAdam
             : lower == "adamw" ? OptimizerType::kAdamW
             : lower == "adagrad" ? OptimizerType::kAdagrad
                                  : OptimizerType::kLion;
    if (o.type == OptimizerType::kLion) {
        o.beta1 = 0.9;
        o.beta2 = 0.99;
    }
    const Json* params = nullptr;
    ZINF_TRY(r.get_object("params", params));
    ZINF_TRY(r.finish());
    if (params != nullptr) {
        const std::string ppath = join(path, "params");
        ObjectReader p(*params, ppath, warnings, {"torch_adam", "bias_correction", "amsgrad",
                                                  "initial_accumulator_value", "lr_decay", "foreach",
                                                  "fused", "capturable", "maximize", "set_grad_none"});
        ZINF_TRY(p.get_double("lr", o.lr, 0.0, 1e6));
        if (const Json* betas = p.find("betas")) {
            if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
                !(*betas)[1].is_number()) {
                return Status::invalid_argument(
                    str_cat(ppath, ".betas: expected a list of two numbers in [0, 1), got ",
                            betas->dump()));
            }
            o.beta1 = (*betas)[0].get<double>();
            o.beta2 = (*betas)[1].get<double>();
            if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
                return Status::invalid_argument(
                    str_cat(ppath, ".betas: each must be in [0, 1), got ", betas->dump()));
            }
        }
        ZINF_TRY(p.get_double("eps", o.eps, 0.0, 1.0));
        ZINF_TRY(p.get_double("weight_decay", o.weight_decay, 0.0, 1e3));
        ZINF_TRY(p.get_bool("adam_w_mode", o.adam_w_mode));
        ZINF_TRY(p.finish());
    }
    return Status::ok();
}

Status read_scheduler(const Json& object, const std::string& path,
                      std::vector<std::string>& warnings, SchedulerConfig& s) {
    ObjectReader r(object, path, warnings, {});
    std::string type = "none";
    ZINF_TRY(r.get_enum("type", type, {"WarmupLR", "WarmupDecayLR", "none"}));
    s.type = type == "WarmupLR"        ? SchedulerType::kWarmupLR
             : type == "WarmupDecayLR" ? SchedulerType::kWarmupDecayLR
                                       : SchedulerType::kNone;
    const Json* params = nullptr;
    ZINF_TRY(r.get_object("params", params));
    ZINF_TRY(r.finish());
    if (params != nullptr) {
        const std::string ppath = join(path, "params");
        ObjectReader p(*params, ppath, warnings, {"last_batch_iteration"});
        ZINF_TRY(p.get_double("warmup_min_lr", s.warmup_min_lr, 0.0, 1e6));
        ZINF_TRY(p.get_double("warmup_max_lr", s.warmup_max_lr, 0.0, 1e6));
        ZINF_TRY(p.get_int(std::string_view("warmup_num_steps"), s.warmup_num_steps, 0, kMaxCount));
        std::string warmup_type = s.warmup_linear ? "linear" : "log";
        ZINF_TRY(p.get_enum("warmup_type", warmup_type, {"log", "linear"}));
        s.warmup_linear = warmup_type == "linear";
        ZINF_TRY(p.get_int(std::string_view("total_num_steps"), s.total_num_steps, 0, kMaxCount));
        ZINF_TRY(p.finish());
    }
    if (s.type == SchedulerType::kWarmupDecayLR && s.total_num_steps == 0) {
        return Status::invalid_argument(
            str_cat(path, ".params.total_num_steps: required by WarmupDecayLR"));
    }
    if (s.type == SchedulerType::kWarmupDecayLR && s.total_num_steps < s.warmup_num_steps) {
        return Status::invalid_argument(str_cat(path, ".params.total_num_steps: ", s.total_num_steps,
                                                " is below warmup_num_steps ", s.warmup_num_steps));
    }
    return Status::ok();
}

Status read_model(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                  ModelConfig& m) {
    ObjectReader r(object, path, warnings, {});
    std::string type = "mlp";
    ZINF_TRY(r.get_enum("type", type, {"mlp"}));
    m.type = ModelType::kMlp;
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
    return r.finish();
}

Status read_data(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                 DataConfig& d) {
    ObjectReader r(object, path, warnings, {});
    ZINF_TRY(r.get_enum("dataset", d.dataset, {"fashion-mnist", "synthetic"}));
    if (const Json* p = r.find("path")) {
        if (!p->is_string() || p->get<std::string>().empty()) {
            return Status::invalid_argument(
                str_cat(r.path_of("path"), ": expected a non-empty path string, got ", p->dump()));
        }
        d.path = p->get<std::string>();
    }
    ZINF_TRY(r.get_int(std::string_view("epochs"), d.epochs, 1, 1'000'000));
    ZINF_TRY(r.get_int(std::string_view("max_steps"), d.max_steps, 0, kMaxCount));
    ZINF_TRY(r.get_int(std::string_view("synthetic_samples"), d.synthetic_samples, 1,
                       std::int64_t{1} << 32));
    ZINF_TRY(r.get_bool("shuffle", d.shuffle));
    return r.finish();
}

Status read_device(const Json& object, const std::string& path, std::vector<std::string>& warnings,
                   DeviceConfig& d) {
    ObjectReader r(object, path, warnings, {});
    ZINF_TRY(r.get_enum("type", d.type, {"cpu", "cuda"}));
    ZINF_TRY(r.get_int(std::string_view("memory_budget"), d.memory_budget_bytes, 1 << 20,
                       kMaxCount));
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
        if (b.train_batch_size != b.train_micro_batch_size_per_gpu * b.gradient_accumulation_steps * ws) {
            return Status::invalid_argument(str_cat(
                "train_batch_size: ", b.train_batch_size, " != train_micro_batch_size_per_gpu ",
                b.train_micro_batch_size_per_gpu, " x gradient_accumulation_steps ",
                b.gradient_accumulation_steps, " x world size ", ws));
        }
    } else if (has_total && has_micro) {
        if (b.train_batch_size % (b.train_micro_batch_size_per_gpu * ws) != 0) {
            return Status::invalid_argument(str_cat(
                "train_batch_size: ", b.train_batch_size, " is not divisible by train_micro_batch_size_per_gpu ",
                b.train_micro_batch_size_per_gpu, " x world size ", ws));
        }
        b.gradient_accumulation_steps = b.train_batch_size / (b.train_micro_batch_size_per_gpu * ws);
    } else if (has_total && has_accum) {
        if (b.train_batch_size % (b.gradient_accumulation_steps * ws) != 0) {
            return Status::invalid_argument(str_cat(
                "train_batch_size: ", b.train_batch_size, " is not divisible by gradient_accumulation_steps ",
                b.gradient_accumulation_steps, " x world size ", ws));
        }
        b.train_micro_batch_size_per_gpu = b.train_batch_size / (b.gradient_accumulation_steps * ws);
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
        const std::string part = key_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (part.empty()) return Status::invalid_argument(str_cat("--set ", assignment, ": empty key"));
        if (!node->is_object()) {
            return Status::invalid_argument(
                str_cat("--set ", assignment, ": ", key_path.substr(0, start - 1), " is not an object"));
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
            "zero_optimization.offload_optimizer.device: \"none\" on device.type \"",
            c.device.type, "\" needs a device optimizer, not implemented yet; use \"cpu\" or "
            "\"nvme\""));
    }
    if (c.device.type != "cpu" && zc.offload_param.device == OffloadDevice::kCpu) {
        return Status::not_supported(str_cat(
            "zero_optimization.offload_param.device: \"cpu\" is implemented for device.type "
            "\"cpu\" only, got \"", c.device.type, "\"; use \"nvme\" or \"none\""));
    }
    return Status::ok();
}

Status read_root(const Json& root, const LoadOptions& options, EngineConfig& c) {
    if (!root.is_object()) {
        return Status::invalid_argument(str_cat("expected a JSON object at top level, got ", type_name(root)));
    }
    ObjectReader r(root, "", c.warnings,
                   {"wall_clock_breakdown", "prescale_gradients", "gradient_predivide_factor",
                    "sparse_gradients", "amp", "zero_allow_untested_optimizer", "memory_breakdown",
                    "flops_profiler", "activation_checkpointing", "tensorboard", "wandb",
                    "csv_monitor", "comet", "comms_logger", "autotuning", "elasticity", "pipeline",
                    "communication_data_type", "dump_state", "checkpoint", "data_efficiency",
                    "curriculum_learning", "compression_training", "sparse_attention",
                    "zero_force_ds_cpu_optimizer", "disable_allgather", "dataloader_drop_last",
                    "data_types", "nebula", "eigenvalue", "progressive_layer_drop",
                    "quantize_training", "hybrid_engine", "torch_autocast", "compile",
                    "weight_quantization", "seq_parallel_communication_data_type",
                    "use_data_before_expert_parallelism", "timers", "graph_harvesting",
                    "aio_config", "gradient_accumulation_dtype", "fp32_reduce_scatter"});
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
    ZINF_TRY(r.get_object("bf16", sub));
    if (sub != nullptr) {
        ObjectReader b(*sub, "bf16", c.warnings, {"immediate_grad_update", "check_grad_overflow"});
        ZINF_TRY(b.get_bool("enabled", c.bf16.enabled));
        ZINF_TRY(b.finish());
    }
    ZINF_TRY(r.get_object("fp16", sub));
    if (sub != nullptr) {
        ObjectReader f(*sub, "fp16", c.warnings, {"auto_cast", "consecutive_hysteresis",
                                                  "fp16_master_weights_and_grads"});
        ZINF_TRY(f.get_bool("enabled", c.fp16.enabled));
        ZINF_TRY(f.get_double("loss_scale", c.fp16.loss_scale, 0.0, 1e30));
        ZINF_TRY(f.get_int(std::string_view("initial_scale_power"), c.fp16.initial_scale_power, 0, 64));
        ZINF_TRY(f.get_int(std::string_view("loss_scale_window"), c.fp16.loss_scale_window, 1, 1'000'000'000));
        ZINF_TRY(f.get_int(std::string_view("hysteresis"), c.fp16.hysteresis, 1, 1'000'000));
        ZINF_TRY(f.get_double("min_loss_scale", c.fp16.min_loss_scale, 0.0, 1e30));
        ZINF_TRY(f.finish());
    }
    if (c.bf16.enabled && c.fp16.enabled) {
        return Status::invalid_argument("bf16.enabled and fp16.enabled: choose one");
    }
    ZINF_TRY(r.get_object("optimizer", sub));
    if (sub != nullptr) ZINF_TRY(read_optimizer(*sub, "optimizer", c.warnings, c.optimizer));
    ZINF_TRY(r.get_object("scheduler", sub));
    if (sub != nullptr) ZINF_TRY(read_scheduler(*sub, "scheduler", c.warnings, c.scheduler));
    ZINF_TRY(r.get_object("swap", sub));
    if (sub != nullptr) {
        ObjectReader s(*sub, "swap", c.warnings, {});
        ZINF_TRY(s.get_bool("verify_checksums", c.swap.verify_checksums));
        ZINF_TRY(s.finish());
    }
    ZINF_TRY(r.get_object("model", sub));
    if (sub != nullptr) ZINF_TRY(read_model(*sub, "model", c.warnings, c.model));
    ZINF_TRY(r.get_object("data", sub));
    if (sub != nullptr) ZINF_TRY(read_data(*sub, "data", c.warnings, c.data));
    ZINF_TRY(r.get_object("device", sub));
    if (sub != nullptr) ZINF_TRY(read_device(*sub, "device", c.warnings, c.device));
    ZINF_TRY(r.get_object("cpu_optimizer", sub));
    if (sub != nullptr) {
        ObjectReader s(*sub, "cpu_optimizer", c.warnings, {});
        ZINF_TRY(s.get_enum("isa", c.cpu_optimizer.isa, {"auto", "avx512", "avx2", "scalar"}));
        ZINF_TRY(s.get_int(std::string_view("threads"), c.cpu_optimizer.threads, 0, 4096));
        ZINF_TRY(s.finish());
    }
    ZINF_TRY(r.finish());
    return check_placement(c);
}

Result<EngineConfig> load_json(const Json& parsed, const LoadOptions& options,
                               std::string_view source_name) {
    if (options.world_size < 1) {
        return Status::invalid_argument(str_cat("world size must be at least 1, got ", options.world_size));
    }
    Json root = parsed;
    for (const auto& assignment : options.overrides) ZINF_TRY(apply_override(root, assignment));
    EngineConfig config;
    Status status = read_root(root, options, config);
    if (!status.is_ok()) return status.with_context(source_name);
    config.canonical_json = root.dump();  // nlohmann's object keeps keys sorted
    if (options.log_warnings) {
        for (const auto& w : config.warnings) log::warn_once(w, str_cat(source_name, ": ", w));
    }
    return config;
}

Result<Json> parse_text(std::string_view json_text, std::string_view source_name) {
    try {
        return Json::parse(json_text.begin(), json_text.end(), nullptr, true, /*ignore_comments=*/true);
    } catch (const Json::parse_error& e) {
        return Status::invalid_argument(str_cat(source_name, ": not valid JSON: ", e.what()));
    } catch (const std::exception& e) {
        return Status::invalid_argument(str_cat(source_name, ": ", e.what()));
    }
}

}  // namespace

std::string_view offload_device_name(OffloadDevice device) noexcept {
    switch (device) {
        case OffloadDevice::kNone: return "none";
        case OffloadDevice::kCpu: return "cpu";
        case OffloadDevice::kNvme: return "nvme";
    }
    return "none";
}

std::string_view optimizer_type_name(OptimizerType type) noexcept {
    switch (type) {
        case OptimizerType::kAdam: return "Adam";
        case OptimizerType::kAdamW: return "AdamW";
        case OptimizerType::kAdagrad: return "Adagrad";
        case OptimizerType::kLion: return "Lion";
    }
    return "AdamW";
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
        return Status::not_found(str_cat("config file ", path, ": cannot open (", std::strerror(errno), ")"),
                                 errno);
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
    j["use_direct"] = aio.use_direct == Tristate::kAuto ? Json("auto") : Json(aio.use_direct == Tristate::kOn);
    j["register_buffers"] = aio.register_buffers;
    j["sqpoll"] = aio.sqpoll;
    Json root = Json::object();
    root["aio"] = j;
    return root.dump(indent);
}

}  // namespace zinf::config
