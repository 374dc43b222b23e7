#include "src/engine/step_prediction.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/base/dtype.h"
#include "src/base/log.h"
#include "src/base/optimizer_descriptor.h"
#include "src/base/state_dtype.h"
#include "src/base/units.h"

namespace zinf::engine {

namespace {

using nlohmann::json;

std::string fixed(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

double log_distance(double a, double b) {
    const double d = std::log(std::max(a, 1.0)) - std::log(std::max(b, 1.0));
    return d * d;
}

std::array<double, 3> sorted_dims(std::uint64_t m, std::uint64_t n, std::uint64_t k) {
    std::array<double, 3> d{double(m), double(n), double(k)};
    std::sort(d.begin(), d.end());
    return d;
}

// Reads `key` of `j` as a number > 0 (or >= 0 where zero_ok), naming it in the error.
Result<double> positive_number(const json& j, std::string_view where, const char* key,
                               bool zero_ok = false) {
    if (!j.contains(key) || !j.at(key).is_number()) {
        return Status::invalid_argument(str_cat(where, ".", key, ": expected a number"));
    }
    const double v = j.at(key).get<double>();
    if (!std::isfinite(v) || v < 0 || (!zero_ok && v == 0)) {
        return Status::invalid_argument(str_cat(where, ".", key, ": expected a number ",
                                                zero_ok ? ">= 0" : "> 0", ", got ", v));
    }
    return v;
}

Result<json> array_of(const json& j, const char* key) {
    if (!j.contains(key) || !j.at(key).is_array() || j.at(key).empty()) {
        return Status::invalid_argument(str_cat(key, ": expected a non-empty array"));
    }
    return j.at(key);
}

Result<MachineProfile> parse_profile(const json& j) {
    MachineProfile p;
    if (!j.is_object() || j.value("format", std::string()) != kProfileFormat) {
        return Status::invalid_argument(str_cat("format: expected \"", kProfileFormat,
                                                "\" (a file written by zinfinity-bench profile)"));
    }
    p.machine = j.value("machine", std::string());
    ZINF_ASSIGN_OR_RETURN(const double threads, positive_number(j, "", "threads"));
    p.threads = static_cast<int>(threads);
    ZINF_ASSIGN_OR_RETURN(p.memory_copy_gb_per_s, positive_number(j, "", "memory_copy_gb_per_s"));
    ZINF_ASSIGN_OR_RETURN(const json gemm, array_of(j, "gemm"));
    for (std::size_t i = 0; i < gemm.size(); ++i) {
        const std::string where = str_cat("gemm[", i, "]");
        MachineProfile::Gemm g;
        ZINF_ASSIGN_OR_RETURN(const double m, positive_number(gemm[i], where, "m"));
        ZINF_ASSIGN_OR_RETURN(const double n, positive_number(gemm[i], where, "n"));
        ZINF_ASSIGN_OR_RETURN(const double k, positive_number(gemm[i], where, "k"));
        g.m = static_cast<std::uint64_t>(m);
        g.n = static_cast<std::uint64_t>(n);
        g.k = static_cast<std::uint64_t>(k);
        ZINF_ASSIGN_OR_RETURN(g.gflop_per_s, positive_number(gemm[i], where, "gflop_per_s"));
        p.gemm.push_back(g);
    }
    ZINF_ASSIGN_OR_RETURN(const json opt, array_of(j, "optimizer"));
    for (std::size_t i = 0; i < opt.size(); ++i) {
        const std::string where = str_cat("optimizer[", i, "]");
        MachineProfile::Optimizer o;
        o.type = opt[i].value("type", std::string());
        o.state_dtype = opt[i].value("state_dtype", std::string());
        if (o.type.empty() || o.state_dtype.empty()) {
            return Status::invalid_argument(str_cat(where, ": expected type and state_dtype"));
        }
        ZINF_ASSIGN_OR_RETURN(o.params_per_s, positive_number(opt[i], where, "params_per_s"));
        p.optimizer.push_back(o);
    }
    if (!j.contains("io") || !j.at("io").is_object()) {
        return Status::invalid_argument("io: expected an object");
    }
    const json& io = j.at("io");
    p.io_path = io.value("path", std::string());
    p.io_backend = io.value("backend", std::string());
    ZINF_ASSIGN_OR_RETURN(const json points, array_of(io, "points"));
    for (std::size_t i = 0; i < points.size(); ++i) {
        const std::string where = str_cat("io.points[", i, "]");
        MachineProfile::Io o;
        ZINF_ASSIGN_OR_RETURN(const double bs, positive_number(points[i], where, "block_size"));
        ZINF_ASSIGN_OR_RETURN(const double qd, positive_number(points[i], where, "queue_depth"));
        o.block_size_bytes = static_cast<std::uint64_t>(bs);
        o.queue_depth = static_cast<int>(qd);
        o.threads = points[i].value("threads", 1);
        ZINF_ASSIGN_OR_RETURN(o.read_gb_per_s, positive_number(points[i], where, "read_gb_per_s"));
        ZINF_ASSIGN_OR_RETURN(o.write_gb_per_s,
                              positive_number(points[i], where, "write_gb_per_s"));
        p.io.push_back(o);
    }
    if (j.contains("collectives")) {  // optional: zinfinity-bench comm --profile adds them
        const json& c = j.at("collectives");
        if (!c.is_array()) return Status::invalid_argument("collectives: expected an array");
        for (std::size_t i = 0; i < c.size(); ++i) {
            const std::string where = str_cat("collectives[", i, "]");
            MachineProfile::Collective o;
            o.op = c[i].value("op", std::string());
            if (o.op != "all_reduce" && o.op != "reduce_scatter" && o.op != "all_gather") {
                return Status::invalid_argument(
                    str_cat(where, ".op: expected all_reduce, reduce_scatter or all_gather"));
            }
            ZINF_ASSIGN_OR_RETURN(const double ranks, positive_number(c[i], where, "ranks"));
            ZINF_ASSIGN_OR_RETURN(const double bytes, positive_number(c[i], where, "bytes"));
            o.ranks = static_cast<int>(ranks);
            o.bytes = static_cast<std::uint64_t>(bytes);
            ZINF_ASSIGN_OR_RETURN(o.seconds, positive_number(c[i], where, "seconds"));
            p.collectives.push_back(o);
        }
    }
    return p;
}

// The GEMM seconds of `work` at the profile's rate for each shape.
double gemm_seconds(const std::vector<GemmWork>& work, const MachineProfile& profile) {
    double s = 0;
    for (const GemmWork& g : work) {
        const MachineProfile::Gemm* rate = profile.nearest_gemm(g.m, g.n, g.k);
        s += g.flops() / (rate->gflop_per_s * 1e9);
    }
    return s;
}

void add_linear(ModelWork& w, std::uint64_t rows, std::uint64_t in, std::uint64_t out,
                std::uint64_t count, bool input_gradient) {
    w.forward.push_back({rows, out, in, count});
    w.backward.push_back({out, in, rows, count});  // weight gradient
    if (input_gradient) w.backward.push_back({rows, in, out, count});
}

}  // namespace

const MachineProfile::Gemm* MachineProfile::nearest_gemm(std::uint64_t m, std::uint64_t n,
                                                         std::uint64_t k) const noexcept {
    const auto want = sorted_dims(m, n, k);
    const Gemm* best = nullptr;
    double best_d = std::numeric_limits<double>::infinity();
    for (const Gemm& g : gemm) {
        const auto have = sorted_dims(g.m, g.n, g.k);
        double d = 0;
        for (int i = 0; i < 3; ++i) d += log_distance(want[i], have[i]);
        if (d < best_d) {
            best_d = d;
            best = &g;
        }
    }
    return best;
}

const MachineProfile::Io* MachineProfile::nearest_io(std::uint64_t block_size_bytes,
                                                     int queue_depth) const noexcept {
    const Io* best = nullptr;
    double best_d = std::numeric_limits<double>::infinity();
    for (const Io& p : io) {
        const double d = log_distance(double(p.block_size_bytes), double(block_size_bytes)) +
                         log_distance(p.queue_depth, queue_depth);
        if (d < best_d) {
            best_d = d;
            best = &p;
        }
    }
    return best;
}

const MachineProfile::Optimizer* MachineProfile::find_optimizer(std::string_view type,
                                                                std::string_view dtype) const {
    for (const Optimizer& o : optimizer) {
        if (o.type == type && o.state_dtype == dtype) return &o;
    }
    return nullptr;
}

double MachineProfile::collective_seconds(std::string_view op, int ranks, double bytes) const {
    std::vector<const Collective*> points;
    for (const Collective& c : collectives) {
        if (c.op == op && c.ranks == ranks) points.push_back(&c);
    }
    if (points.empty()) return -1;
    std::sort(points.begin(), points.end(),
              [](const Collective* a, const Collective* b) { return a->bytes < b->bytes; });
    if (bytes <= double(points.front()->bytes)) return points.front()->seconds;
    const Collective* last = points.back();
    if (bytes >= double(last->bytes)) return last->seconds * bytes / double(last->bytes);
    for (std::size_t i = 1; i < points.size(); ++i) {
        const Collective* hi = points[i];
        if (bytes > double(hi->bytes)) continue;
        const Collective* lo = points[i - 1];
        const double f = (bytes - double(lo->bytes)) / double(hi->bytes - lo->bytes);
        return lo->seconds + f * (hi->seconds - lo->seconds);
    }
    return last->seconds;
}

std::string profile_to_json(const MachineProfile& p) {
    json j;
    j["format"] = kProfileFormat;
    j["machine"] = p.machine;
    j["threads"] = p.threads;
    j["memory_copy_gb_per_s"] = p.memory_copy_gb_per_s;
    j["gemm"] = json::array();
    for (const auto& g : p.gemm) {
        j["gemm"].push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"gflop_per_s", g.gflop_per_s}});
    }
    j["optimizer"] = json::array();
    for (const auto& o : p.optimizer) {
        j["optimizer"].push_back(
            {{"type", o.type}, {"state_dtype", o.state_dtype}, {"params_per_s", o.params_per_s}});
    }
    j["io"] = {{"path", p.io_path}, {"backend", p.io_backend}, {"points", json::array()}};
    for (const auto& o : p.io) {
        j["io"]["points"].push_back({{"block_size", o.block_size_bytes},
                                     {"queue_depth", o.queue_depth},
                                     {"threads", o.threads},
                                     {"read_gb_per_s", o.read_gb_per_s},
                                     {"write_gb_per_s", o.write_gb_per_s}});
    }
    if (!p.collectives.empty()) {
        j["collectives"] = json::array();
        for (const auto& c : p.collectives) {
            j["collectives"].push_back(
                {{"op", c.op}, {"ranks", c.ranks}, {"bytes", c.bytes}, {"seconds", c.seconds}});
        }
    }
    return j.dump(2);
}

Result<MachineProfile> profile_from_json(std::string_view json_text, std::string_view source_name) {
    json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
        return Status::invalid_argument(str_cat(source_name, ": not valid JSON"));
    }
    auto p = parse_profile(j);
    if (!p.has_value()) return p.error().with_context(std::string(source_name));
    return p;
}

Result<MachineProfile> load_profile(const std::string& path) {
    std::ifstream in(path);
    if (!in) return Status::not_found(str_cat("machine profile ", path, ": cannot be opened"));
    std::stringstream text;
    text << in.rdbuf();
    return profile_from_json(text.str(), str_cat("machine profile ", path));
}

Status save_profile(const MachineProfile& profile, const std::string& path) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << profile_to_json(profile) << "\n";
        out.flush();
        if (!out) {
            const int error = errno;
            std::remove(tmp.c_str());
            return Status::io_error(str_cat("machine profile: cannot write ", tmp), error);
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int error = errno;
        std::remove(tmp.c_str());
        return Status::from_errno(error,
                                  str_cat("machine profile: cannot rename ", tmp, " to ", path));
    }
    return Status::ok();
}

ModelWork model_work(const config::EngineConfig& config) {
    const config::ModelConfig& mc = config.model;
    const std::uint64_t rows = config.batch.train_micro_batch_size_per_gpu;
    ModelWork w;
    if (mc.type == config::ModelType::kMlp) {
        double act = 0;  // elements of hidden activations (each hidden layer's output)
        for (std::size_t i = 0; i + 1 < mc.layers.size(); ++i) {
            add_linear(w, rows, mc.layers[i], mc.layers[i + 1], 1, /*input_gradient=*/i > 0);
            act += double(rows) * double(mc.layers[i + 1]);
        }
        // Forward: bias, activation (and layer norm) read and write each output; backward reads
        // the output, its gradient and writes the input gradient, and sums the bias gradient.
        const double passes = mc.layernorm ? 3.0 : 2.0;
        w.forward_elementwise_bytes = act * 4.0 * 2.0 * passes;
        w.backward_elementwise_bytes = act * 4.0 * 4.0 * passes;
        return w;
    }
    // gpt: per block qkv, the attention per head, its projection and the 4x MLP; a byte
    // vocabulary head tied to the embedding.
    const std::uint64_t d = mc.d_model;
    const std::uint64_t s = mc.seq_len;
    const std::uint64_t t = rows * s;
    const std::uint64_t heads = mc.n_head;
    const std::uint64_t hd = d / std::max<std::uint64_t>(heads, 1);
    const std::uint64_t blocks = mc.n_layer;
    const std::uint64_t vocab = 256;
    add_linear(w, t, d, 3 * d, blocks, true);
    add_linear(w, t, d, d, blocks, true);
    add_linear(w, t, d, 4 * d, blocks, true);
    add_linear(w, t, 4 * d, d, blocks, true);
    const std::uint64_t per_head = blocks * rows * heads;
    w.forward.push_back({s, s, hd, per_head});   // scores = q k^T
    w.forward.push_back({s, hd, s, per_head});   // out = p v
    w.backward.push_back({s, s, hd, per_head});  // dp = do v^T
    w.backward.push_back({s, hd, s, per_head});  // dv = p^T do
    w.backward.push_back({s, hd, s, per_head});  // dq = ds k
    w.backward.push_back({s, hd, s, per_head});  // dk = ds^T q
    add_linear(w, t, d, vocab, 1, true);         // the head (logits = h wte^T)
    // Elementwise per token and block: two layer norms, two residual adds, bias adds, gelu over
    // 4d, and the causal softmax over the row of scores of each head.
    const double per_token_block = 26.0 * double(d) + 3.0 * double(heads) * double(s);
    w.forward_elementwise_bytes = 4.0 * per_token_block * double(t) * double(blocks);
    w.backward_elementwise_bytes = 2.0 * w.forward_elementwise_bytes;
    w.recompute_forward = mc.checkpoint_activations;
    if (mc.checkpoint_activations) w.checkpoint_bytes = t * d * sizeof(float) * blocks;
    return w;
}

// The collectives of one step over `world` ranks, as the ParameterCoordinator issues them, one
// call per parameter on the training thread (nothing overlaps them): stage 0 all-reduces the
// whole gradient once per step; stages 1-2 reduce-scatter each gradient (stage 1 once per step,
// stage 2 each micro-step) and all-gather each parameter after the step; stage 3
// reduce-scatters each gradient each micro-step and all-gathers each parameter at every fetch
// (forward, backward and a recomputed forward; persistent ones once per step). Plus the
// gradient statistics' all-reduce (clipping, overflow).
void add_collectives(const config::EngineConfig& config, const OffloadPlan& plan, int world,
                     const MachineProfile& profile, std::span<const std::size_t> numels,
                     bool recompute, StepPrediction& p) {
    if (numels.empty()) {
        p.notes.push_back("collectives between ranks are not counted (no parameter sizes given)");
        return;
    }
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
        if (profile.collective_seconds(op, world, 1) < 0) {
            p.notes.push_back(
                str_cat("collectives between ranks are not counted: the profile has no ", op,
                        " figures for ", world, " ranks (mpirun -np ", world,
                        " zinfinity-bench comm --profile FILE adds them)"));
            return;
        }
    }
    const double eb = double(dtype_size_bytes(plan.dtype));
    const double micro = double(config.batch.gradient_accumulation_steps);
    const auto call = [&](const char* op, double bytes, double count) {
        p.collective_calls += static_cast<std::uint64_t>(count);
        p.collective_bytes += bytes * count;
        p.collective_s += count * profile.collective_seconds(op, world, bytes);
    };
    double total = 0;
    for (const std::size_t n : numels) total += double(n);
    if (plan.stage == 0) call("all_reduce", total * eb, 1);
    const double fetches = recompute ? 3.0 : 2.0;
    for (const std::size_t n : numels) {
        const double bytes = double(n) * eb;
        if (plan.stage == 1 || plan.stage == 2) {
            call("reduce_scatter", bytes, plan.stage == 1 ? 1.0 : micro);
            call("all_gather", bytes, 1);
        } else if (plan.stage == 3) {
            call("reduce_scatter", bytes, micro);
            const bool persistent = n <= config.zero.stage3_param_persistence_threshold_numel;
            call("all_gather", bytes, persistent ? 1.0 : fetches * micro);
        }
    }
    call("all_reduce", 16, 1);
    p.notes.push_back(str_cat("collectives: ", p.collective_calls, " calls, ",
                              format_bytes(static_cast<std::uint64_t>(p.collective_bytes)), ", ",
                              fixed(p.collective_s * 1e3, 1), " ms at the profile's ", world,
                              "-rank figures (on the training thread, not overlapped)"));
}

Result<StepPrediction> predict_step(const config::EngineConfig& config, const OffloadPlan& plan,
                                    int world_size, const MachineProfile& profile,
                                    std::span<const std::size_t> parameter_numels) {
    if (config.device.type != "cpu") {
        return Status::not_supported(
            str_cat("step time: the machine profile has no figures for a ", config.device.type,
                    " device (GEMM FLOP/s and host-device copies are measured for the CPU "
                    "device only)"));
    }
    if (profile.gemm.empty() || profile.io.empty()) {
        return Status::invalid_argument(
            "step time: the machine profile has no GEMM or I/O figures");
    }
    StepPrediction p;
    const ModelWork w = model_work(config);
    const double micro = double(config.batch.gradient_accumulation_steps);
    const double mem = profile.memory_copy_gb_per_s * 1e9;

    // Compute: every micro-step's GEMMs at the profile's rate for their shapes, and the
    // elementwise passes at the copy bandwidth.
    const double fwd = gemm_seconds(w.forward, profile) + w.forward_elementwise_bytes / mem;
    const double bwd = gemm_seconds(w.backward, profile) + w.backward_elementwise_bytes / mem;
    // Offloaded parameters (stage 3): each micro-step's forward and backward copy every
    // gathered parameter from the host tier to the device tier (read + written), and backward
    // hands each gradient out of the device and adds it into the gradient partition (read the
    // sum and the new one, write the sum).
    double fetch_bytes = 0, grad_out_bytes = 0;
    if (plan.parameters_offloaded()) {
        const double model = double(plan.model_numel);
        const double pbytes = double(dtype_size_bytes(plan.dtype));
        fetch_bytes = 2.0 * model * pbytes;
        grad_out_bytes = model * (2.0 * pbytes + 12.0);
    }
    p.forward_s = micro * (fwd + 0.5 * fetch_bytes / mem);
    p.backward_s = micro * (bwd + (w.recompute_forward ? fwd : 0.0) +
                            (0.5 * fetch_bytes + grad_out_bytes) / mem);

    // The optimizer: the kernel over the domain, and the passes over the gradients (the norm for
    // clipping, the reduction into the optimizer domain) and the parameters' copy to the device.
    const std::string type(optimizer_kind_name(config.optimizer.type));
    const std::string dtype(state_dtype_name(plan.state_dtype));
    const MachineProfile::Optimizer* opt = profile.find_optimizer(type, dtype);
    if (opt == nullptr) {
        return Status::invalid_argument(str_cat(
            "step time: the machine profile has no figure for the ", type, " step with ", dtype,
            " states (run zinfinity-bench profile again; it measures every "
            "optimizer)"));
    }
    p.optimizer_params_per_s = opt->params_per_s;
    const double domain = double(plan.domain_numel);
    const double grad_bytes = double(dtype_size_bytes(plan.dtype));
    const double kernel_s = domain / opt->params_per_s;
    const double passes_s = domain * (3.0 * 4.0 + 2.0 * grad_bytes) / mem;
    p.optimizer_s = kernel_s + passes_s;

    // I/O per step, by kind.
    const MachineProfile::Io* io =
        profile.nearest_io(config.aio.block_size_bytes, config.aio.queue_depth);
    p.read_gb_per_s = io->read_gb_per_s;
    p.write_gb_per_s = io->write_gb_per_s;
    if (io->block_size_bytes != config.aio.block_size_bytes ||
        io->queue_depth != config.aio.queue_depth) {
        p.notes.push_back(str_cat(
            "I/O rates of the nearest profiled point (block ", format_bytes(io->block_size_bytes),
            ", queue depth ", io->queue_depth, ") for aio block ",
            format_bytes(config.aio.block_size_bytes), ", queue depth ", config.aio.queue_depth));
    }
    const double r = io->read_gb_per_s * 1e9;
    const double wr = io->write_gb_per_s * 1e9;
    double fb_read = 0, fb_write = 0, opt_read = 0, opt_write = 0;
    if (plan.optimizer_states == Home::kNvme) {
        const double states = domain * plan.state_bytes_per_element();
        p.flows.push_back({"optimizer states (read, updated, written back)", states, states});
        opt_read += states;
        opt_write += states;
    }
    if (plan.gradients == Home::kNvme) {
        const double grads = domain * 4.0;
        p.flows.push_back({"gradients (streamed out in backward, read by the step)", grads, grads});
        fb_write += grads;
        opt_read += grads;
    }
    if (plan.parameters == Home::kNvme) {
        const double world = double(std::max(1, world_size));
        const double params =
            double(plan.model_numel) / world * double(dtype_size_bytes(plan.dtype));
        const double cached = double(plan.parameter_host_tier_bytes);
        if (params > cached) {
            // Updated by the step and written back; each micro-step's forward and backward read
            // what the host tier does not hold (the first forward after a step reads them all).
            const double reads = params + (2.0 * micro - 1.0) * (params - cached);
            p.flows.push_back(
                {"parameters (fetched in forward and backward, written back after "
                 "the step)",
                 reads, params});
            fb_read += reads;
            opt_write += params;
        } else {
            p.notes.push_back(str_cat("parameters (", format_bytes(std::uint64_t(params)),
                                      ") stay in the host tier (",
                                      format_bytes(plan.parameter_host_tier_bytes),
                                      "): no parameter I/O after the first step"));
        }
    }
    if (w.checkpoint_bytes > 0 && config.activation_checkpointing.nvme_checkpointing) {
        const double kept = micro * double(w.checkpoint_bytes);
        p.flows.push_back(
            {"activation checkpoints (written in forward, read in backward)", kept, kept});
        fb_read += kept;
        fb_write += kept;
    }
    p.read_bytes = fb_read + opt_read;
    p.write_bytes = fb_write + opt_write;
    const double fb_io = fb_read / r + fb_write / wr;
    const double opt_io = opt_read / r + opt_write / wr;
    p.io_s = fb_io + opt_io;

    // Overlap. Forward and backward wait for their transfers: on the shipped configs the
    // engine's measured I/O stall equals the whole forward/backward transfer time (each layer's
    // compute is shorter than its fetch, so prefetch hides little), and the prediction counts
    // it as exposed. The optimizer pipeline overlaps sub-group i's kernel with the I/O of its
    // neighbours, so it takes the longer of the two plus one sub-group's read and write.
    const double compute_fb = p.forward_s + p.backward_s;
    const double exposed_fb = fb_io;
    double optimizer_phase = p.optimizer_s;
    if (opt_io > 0) {
        const double groups = std::max(
            1.0, std::ceil(domain / double(std::max<std::size_t>(plan.sub_group_numel, 1))));
        optimizer_phase = std::max(p.optimizer_s, opt_io) + (opt_io + kernel_s) / groups;
    }
    p.exposed_io_s = exposed_fb + (optimizer_phase - p.optimizer_s);
    if (world_size > 1) {
        add_collectives(config, plan, world_size, profile, parameter_numels, w.recompute_forward,
                        p);
        p.notes.push_back(str_cat("compute at the profile's rates for ", profile.threads,
                                  " threads per rank: where the ", world_size,
                                  " ranks share those cores, each computes slower"));
    }
    p.step_s = compute_fb + p.optimizer_s + p.exposed_io_s + p.collective_s;
    return p;
}

std::string StepPrediction::describe() const {
    auto ms = [](double s) { return str_cat(fixed(s * 1e3, 1), " ms"); };
    std::string out = str_cat(
        "  predicted step time ", ms(step_s), ": compute ",
        ms(forward_s + backward_s + optimizer_s), " (forward ", ms(forward_s), ", backward ",
        ms(backward_s), ", optimizer ", ms(optimizer_s), "), I/O ", ms(io_s), ", of it exposed ",
        ms(exposed_io_s),
        collective_calls > 0 ? str_cat(", collectives ", ms(collective_s)) : std::string(), "\n");
    if (read_bytes + write_bytes > 0) {
        out += str_cat("    I/O per step: read ", format_bytes(std::uint64_t(read_bytes)), " at ",
                       fixed(read_gb_per_s, 2), " GB/s, written ",
                       format_bytes(std::uint64_t(write_bytes)), " at ", fixed(write_gb_per_s, 2),
                       " GB/s\n");
        for (const Flow& f : flows) {
            out += str_cat("      ", f.what, ": read ", format_bytes(std::uint64_t(f.read_bytes)),
                           ", written ", format_bytes(std::uint64_t(f.write_bytes)), "\n");
        }
    }
    for (const std::string& n : notes) out += str_cat("    note: ", n, "\n");
    return out;
}

}  // namespace zinf::engine
