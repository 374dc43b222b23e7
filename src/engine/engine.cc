// zinf::Engine: composition of the ZeRO coordinator, the model and the CPU optimizer.
#include "src/engine/engine.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "src/base/log.h"
#include "src/engine/checkpoint_files.h"

namespace zinf {
namespace {

// Gradient norms are summed over chunks of this many elements, at fixed offsets of the domain,
// in order, whatever the optimizer's sub-groups: offloading must not change the arithmetic.
constexpr std::size_t kNormChunkNumel = std::size_t{1} << 18;

kernels::Dtype kernel_dtype(DType dtype) noexcept {
    switch (dtype) {
        case DType::kFloat32:
            return kernels::Dtype::kFp32;
        case DType::kBFloat16:
            return kernels::Dtype::kBf16;
        case DType::kFloat16:
            return kernels::Dtype::kFp16;
    }
    return kernels::Dtype::kFp32;
}

bool uses_exp_avg(kernels::OptimizerKind kind) noexcept {
    return kind != kernels::OptimizerKind::kAdagrad;
}
bool uses_exp_avg_sq(kernels::OptimizerKind kind) noexcept {
    return kind != kernels::OptimizerKind::kLion;
}

std::string mib(std::size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return buf;
}

std::string exact(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

std::string hex64(std::uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return buf;
}

}  // namespace

// The model's ParameterSource and GradientSink, forwarding to the coordinator.
class Engine::Adapter final : public model::ParameterSource, public model::GradientSink {
public:
    Adapter(zero::ParameterCoordinator& coordinator, const model::ParameterRegistry& registry)
        : coordinator_(coordinator), registry_(registry) {}
    Result<const float*> fetch(model::ParamId id, StreamId stream) override {
        auto r = coordinator_.fetch(id, stream);
        if (!r.has_value()) return r.error().with_context("fetch " + registry_.info(id).name);
        return r;
    }
    Status release(model::ParamId id, StreamId stream) override {
        return coordinator_.release(id, stream);
    }
    Status accumulate(model::ParamId id, const float* grad, StreamId stream) override {
        Status s = coordinator_.accumulate_gradient(id, grad, stream);
        if (!s.is_ok()) return s.with_context("gradient of " + registry_.info(id).name);
        return s;
    }

private:
    zero::ParameterCoordinator& coordinator_;
    const model::ParameterRegistry& registry_;
};

std::byte* Engine::StateBuffer::data() const noexcept {
    if (device != nullptr) return static_cast<std::byte*>(device);
    return const_cast<std::byte*>(host.data());
}

Engine::Engine(const config::EngineConfig& config, model::Mlp& model, Device& device,
               Compute& compute, zero::Communicator& communicator, kernels::OptimizerKernel kernel)
    : config_(config),
      model_(model),
      device_(device),
      compute_(compute),
      communicator_(communicator),
      kernel_(std::move(kernel)),
      optimizer_params_(kernels::OptimizerParams::from_config(config.optimizer)),
      scaler_(config.fp16) {}

Engine::~Engine() {
    // Nothing may still run on the stream when buffers go.
    (void)device_.synchronize(stream());
    device_.free(inputs_device_);
    device_.free(labels_device_);
    device_.free(correct_device_);
    for (auto* b : {&master_, &exp_avg_, &exp_avg_sq_, &host_grads_, &host_params_}) {
        if (b->device != nullptr) device_.free(b->device);
    }
}

Result<std::unique_ptr<Engine>> Engine::create(const config::EngineConfig& config,
                                               model::Mlp& model, Device& device, Compute& compute,
                                               zero::Communicator& communicator) {
    const auto& zc = config.zero;
    // Checks first, before anything is allocated.
    if (zc.offload_param.device != config::OffloadDevice::kNone) {
        // TODO(engine): parameters on cpu/nvme through src/tier's ResidencyManager.
        return Status::not_supported(
            std::string("zero_optimization.offload_param.device: \"") +
            std::string(config::offload_device_name(zc.offload_param.device)) +
            "\" is not implemented by the engine yet; use \"none\"");
    }
    if (zc.offload_optimizer.device == config::OffloadDevice::kNvme) {
        // TODO(engine): optimizer states on NVMe through swap::OptimizerSwapper.
        return Status::not_supported(
            "zero_optimization.offload_optimizer.device: \"nvme\" is not implemented by the engine "
            "yet; use \"cpu\" or \"none\"");
    }
    if (device.kind() != DeviceKind::kCpu &&
        zc.offload_optimizer.device == config::OffloadDevice::kNone) {
        return Status::not_supported(
            "zero_optimization.offload_optimizer.device: \"none\" on a GPU needs a device "
            "optimizer, not implemented yet; use \"cpu\"");
    }
    if (model.config().batch_rows_max < config.batch.train_micro_batch_size_per_gpu) {
        return Status::invalid_argument(
            "train_micro_batch_size_per_gpu: " +
            std::to_string(config.batch.train_micro_batch_size_per_gpu) +
            " exceeds the model's batch_rows_max " + std::to_string(model.config().batch_rows_max));
    }
    ZINF_ASSIGN_OR_RETURN(auto kernel, kernels::OptimizerKernel::create(config.cpu_optimizer));
    std::unique_ptr<Engine> e(
        new Engine(config, model, device, compute, communicator, std::move(kernel)));
    ZINF_TRY(kernels::validate(e->optimizer_params_));

    zero::CoordinatorOptions co;
    co.stage = zc.stage;
    co.dtype = config.bf16.enabled   ? DType::kBFloat16
               : config.fp16.enabled ? DType::kFloat16
                                     : DType::kFloat32;
    co.persistence_threshold_numel = zc.stage3_param_persistence_threshold_numel;
    co.max_live_parameters_numel = zc.stage3_max_live_parameters_numel;
    std::vector<std::size_t> numels;
    for (const auto& info : model.parameters().all()) numels.push_back(info.numel);
    ZINF_ASSIGN_OR_RETURN(e->coordinator_, zero::ParameterCoordinator::create(
                                               numels, co, device, compute, communicator));
    e->adapter_ = std::make_unique<Adapter>(*e->coordinator_, model.parameters());
    const auto& registry = model.parameters();
    const std::uint64_t seed = config.seed;
    ZINF_TRY(e->coordinator_->initialize(
        [&](std::size_t index, std::size_t offset, std::span<float> out) {
            model::initial_values(registry.info(static_cast<model::ParamId>(index)), seed, offset,
                                  out);
        },
        e->stream()));
    e->host_states_ = zc.offload_optimizer.device == config::OffloadDevice::kCpu;
    ZINF_TRY(e->init_states());

    const std::size_t rows = config.batch.train_micro_batch_size_per_gpu;
    e->batch_rows_max_ = rows;
    ZINF_ASSIGN_OR_RETURN(e->inputs_device_,
                          device.allocate(rows * model.in_features() * sizeof(float)));
    ZINF_ASSIGN_OR_RETURN(e->labels_device_, device.allocate(rows * sizeof(std::int32_t)));
    ZINF_ASSIGN_OR_RETURN(e->correct_device_, device.allocate(sizeof(std::uint64_t)));
    e->build_summary();
    log::info(e->summary_);
    return e;
}

Status Engine::allocate_state(StateBuffer& buffer, std::size_t size_bytes, const char* what) {
    buffer.size_bytes = size_bytes;
    if (host_states_) {
        auto b = AlignedBuffer::allocate(std::max<std::size_t>(size_bytes, 64));
        if (!b.has_value()) return b.error().with_context(std::string("host ") + what);
        buffer.host = std::move(*b);
        std::memset(buffer.host.data(), 0, buffer.host.size());
        return Status::ok();
    }
    auto p = device_.allocate(std::max<std::size_t>(size_bytes, 64));
    if (!p.has_value()) return p.error().with_context(std::string("device ") + what);
    buffer.device = *p;
    return device_.fill_zero(buffer.device, size_bytes, stream());
}

Status Engine::init_states() {
    const auto& d = coordinator_->domain();
    const auto kind = optimizer_params_.kind;
    ZINF_TRY(allocate_state(master_, d.numel * 4, "fp32 master parameters"));
    if (uses_exp_avg(kind)) ZINF_TRY(allocate_state(exp_avg_, d.numel * 4, "exp_avg"));
    if (uses_exp_avg_sq(kind)) ZINF_TRY(allocate_state(exp_avg_sq_, d.numel * 4, "exp_avg_sq"));
    const std::size_t eb = dtype_size_bytes(d.dtype);
    sub_group_numel_ = std::min<std::size_t>(
        d.numel, std::max<std::size_t>(16, config_.zero.sub_group_size_numel / 16 * 16));
    if (host_states_) {
        // DeepSpeed's CPU offload keeps the gradient partition in host memory for the step.
        ZINF_TRY(allocate_state(host_grads_, d.numel * eb, "gradients"));
        if (d.dtype != DType::kFloat32) {
            ZINF_TRY(allocate_state(host_params_, sub_group_numel_ * eb, "16-bit parameters"));
        }
    }
    ZINF_TRY(device_.synchronize(stream()));
    // The master copy starts from the same fp32 initial values the parameters were rounded from.
    auto* master = reinterpret_cast<float*>(master_.data());
    const auto& part = coordinator_->partitioning();
    const auto& registry = model_.parameters();
    for (std::size_t i = 0; i < part.parameter_count(); ++i) {
        const std::size_t valid = coordinator_->domain_valid_numel(i);
        if (valid == 0) continue;
        const std::size_t first =
            coordinator_->plan().optimizer_partitioned
                ? static_cast<std::size_t>(part.rank()) * part.slot(i).slice_numel
                : 0;
        model::initial_values(
            registry.info(static_cast<model::ParamId>(i)), config_.seed, first,
            std::span<float>(master + coordinator_->domain_offset_numel(i), valid));
    }
    return Status::ok();
}

double Engine::current_lr() const noexcept {
    return engine::learning_rate(config_.scheduler, config_.optimizer.lr, optimizer_updates_);
}

std::span<const float> Engine::master_parameters() const noexcept {
    return {reinterpret_cast<const float*>(master_.data()), coordinator_->domain().numel};
}

void Engine::build_summary() {
    const auto& zc = config_.zero;
    const auto& d = coordinator_->domain();
    const auto& part = coordinator_->partitioning();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    const char* states_at = host_states_ ? "cpu" : "device";
    std::size_t state_bytes = master_.size_bytes + exp_avg_.size_bytes + exp_avg_sq_.size_bytes;
    std::string s;
    s += "zinfinity engine: ";
    s += std::string(kernels::optimizer_kind_name(optimizer_params_.kind)) + " (cpu kernel " +
         std::string(kernels::isa_name(kernel_.isa())) + ", " + std::to_string(kernel_.threads()) +
         " threads), lr " + exact(config_.optimizer.lr);
    s += "; ZeRO stage " + std::to_string(zc.stage) + " over " + std::to_string(part.world_size()) +
         " rank(s) (" + std::string(communicator_.name()) + ")";
    s += "; dtype " + std::string(dtype_name(d.dtype));
    if (config_.fp16.enabled)
        s += " (loss scale " + exact(scaler_.scale()) +
             (scaler_.dynamic() ? ", dynamic)" : ", static)");
    s += "\n  model: " + std::to_string(part.model_numel()) + " parameters in " +
         std::to_string(part.parameter_count()) + " tensors";
    s += "\n  parameters: " + std::string(device_.name()) + " (" +
         mib((coordinator_->plan().parameters_partitioned ? part.partition_numel()
                                                          : part.full_numel()) *
             eb) +
         (coordinator_->plan().parameters_partitioned ? ", partitioned, gathered per use)" : ")");
    s += "\n  gradients: " + std::string(device_.name()) + " (" +
         mib((coordinator_->plan().gradients_partitioned ? part.partition_numel()
                                                         : part.full_numel()) *
             eb) +
         ")";
    s += "\n  optimizer states (fp32 master + moments): " + std::string(states_at) + " (" +
         mib(state_bytes) + ")";
    s += "\n  device budget " + mib(device_.budget_bytes()) + ", in use " +
         mib(device_.used_bytes());
    s += "\n  batch: train_batch_size " + std::to_string(train_batch_size()) + " = micro " +
         std::to_string(train_micro_batch_size_per_gpu()) + " x accumulation " +
         std::to_string(gradient_accumulation_steps()) + " x world " +
         std::to_string(part.world_size());
    if (config_.gradient_clipping > 0)
        s += "; gradient clipping " + exact(config_.gradient_clipping);
    summary_ = std::move(s);
}

Result<float> Engine::forward(const Batch& batch) {
    ZINF_ASSERT_GE(batch.rows, 1u);
    ZINF_ASSERT_LE(batch.rows, batch_rows_max_);
    ZINF_ASSERT_EQ(batch.inputs.size(), batch.rows * model_.in_features());
    ZINF_ASSERT_EQ(batch.labels.size(), batch.rows);
    TraceScope span(trace_, "forward", "compute", 0);
    if (micro_steps_ % gradient_accumulation_steps() == 0 && !backward_done_ && !forward_done_) {
        coordinator_->begin_accumulation();
        window_scale_ = scaler_.scale();
    }
    ZINF_TRY(device_.copy_to_device(inputs_device_, batch.inputs.data(), batch.inputs.size_bytes(),
                                    stream()));
    ZINF_TRY(device_.copy_to_device(labels_device_, batch.labels.data(), batch.labels.size_bytes(),
                                    stream()));
    model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, true};
    ZINF_TRY(model_.forward(ctx, static_cast<const float*>(inputs_device_),
                            static_cast<const std::int32_t*>(labels_device_), batch.rows));
    ZINF_ASSIGN_OR_RETURN(float loss, model_.read_loss(stream()));
    forward_done_ = true;
    times_.forward_seconds += span.end();
    return loss;
}

Status Engine::backward() {
    ZINF_ASSERT(forward_done_);
    TraceScope span(trace_, "backward", "compute", 0);
    model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, true};
    const double scale = window_scale_ / static_cast<double>(gradient_accumulation_steps());
    ZINF_TRY(model_.backward(ctx, static_cast<float>(scale)));
    ZINF_TRY(device_.synchronize(stream()));
    forward_done_ = false;
    backward_done_ = true;
    times_.backward_seconds += span.end();
    return Status::ok();
}

Result<kernels::GradStats> Engine::gradient_stats() {
    const auto& d = coordinator_->domain();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    const std::byte* grads = static_cast<const std::byte*>(d.gradients);
    if (host_states_) {
        ZINF_TRY(device_.copy_to_host(host_grads_.data(), d.gradients, d.numel * eb, stream()));
        ZINF_TRY(device_.synchronize(stream()));
        grads = host_grads_.data();
    }
    kernels::GradStats total;
    for (std::size_t off = 0; off < d.numel; off += kNormChunkNumel) {
        const std::size_t n = std::min(kNormChunkNumel, d.numel - off);
        const auto s =
            kernel_.grad_stats(kernels::GradView{grads + off * eb, n, kernel_dtype(d.dtype)});
        total.has_inf_nan = total.has_inf_nan || s.has_inf_nan;
        total.sum_squares += s.sum_squares;
    }
    // TODO(zero): with several ranks, all-reduce the per-chunk partials (in chunk order) here.
    return total;
}

Status Engine::optimizer_step(double grad_scale, double lr) {
    const auto& d = coordinator_->domain();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    kernels::OptimizerParams p = optimizer_params_;
    p.step = optimizer_updates_ + 1;
    p.lr = lr;
    p.grad_scale = grad_scale;
    auto* master = reinterpret_cast<float*>(master_.data());
    auto* m = reinterpret_cast<float*>(exp_avg_.data());
    auto* v = reinterpret_cast<float*>(exp_avg_sq_.data());
    const std::byte* grads =
        host_states_ ? host_grads_.data() : static_cast<const std::byte*>(d.gradients);
    auto* params = static_cast<std::byte*>(d.parameters);
    for (std::size_t off = 0; off < d.numel; off += sub_group_numel_) {
        const std::size_t n = std::min(sub_group_numel_, d.numel - off);
        kernels::OptimizerState state;
        state.params = {master + off, n};
        if (m != nullptr && exp_avg_.size_bytes > 0) state.exp_avg = {m + off, n};
        if (v != nullptr && exp_avg_sq_.size_bytes > 0) state.exp_avg_sq = {v + off, n};
        const kernels::GradView g{grads + off * eb, n, kernel_dtype(d.dtype)};
        if (d.dtype == DType::kFloat32) {
            ZINF_TRY(kernel_.step(p, state, g));
            ZINF_TRY(device_.copy_to_device(params + off * 4, master + off, n * 4, stream()));
        } else {
            auto* out = host_states_ ? reinterpret_cast<std::uint16_t*>(host_params_.data())
                                     : reinterpret_cast<std::uint16_t*>(params + off * eb);
            const kernels::ParamCopy copy{out, n, kernel_dtype(d.dtype)};
            ZINF_TRY(kernel_.step(p, state, g, copy));
            if (host_states_) {
                ZINF_TRY(device_.copy_to_device(params + off * eb, out, n * eb, stream()));
                // host_params_ is reused by the next sub-group.
                ZINF_TRY(device_.synchronize(stream()));
            }
        }
    }
    return device_.synchronize(stream());
}

Status Engine::step() {
    ZINF_ASSERT(backward_done_);
    backward_done_ = false;
    last_step_ = StepReport{};
    last_step_.loss_scale = window_scale_;
    const bool boundary = (micro_steps_ + 1) % gradient_accumulation_steps() == 0;
    ++micro_steps_;
    global_samples_ +=
        train_micro_batch_size_per_gpu() * static_cast<std::uint64_t>(communicator_.world_size());
    if (!boundary) return Status::ok();
    last_step_.boundary = true;
    TraceScope span(trace_, "optimizer", "optimizer", 2);
    ZINF_TRY(coordinator_->reduce_gradients(stream()));
    ZINF_TRY(device_.synchronize(stream()));
    ZINF_ASSIGN_OR_RETURN(auto stats, gradient_stats());
    const double unscale = 1.0 / (window_scale_ * communicator_.world_size());
    last_step_.lr = current_lr();
    if (stats.has_inf_nan && config_.fp16.enabled) {
        const double before = scaler_.scale();
        scaler_.update(true);
        ++skipped_steps_;
        ++global_steps_;
        last_step_.overflow = true;
        last_step_.grad_norm = std::numeric_limits<double>::infinity();
        log::warning("fp16: gradient overflow at step ", global_steps_,
                     "; step skipped, loss scale ", before, " -> ", scaler_.scale());
        times_.optimizer_seconds += span.end();
        return Status::ok();
    }
    const double norm = std::sqrt(stats.sum_squares) * unscale;
    last_step_.grad_norm = norm;
    double coef = 1.0;
    if (config_.gradient_clipping > 0 && norm > config_.gradient_clipping) {
        coef = config_.gradient_clipping / (norm + 1e-6);
    }
    ZINF_TRY(optimizer_step(unscale * coef, last_step_.lr));
    ZINF_TRY(coordinator_->publish_parameters(stream()));
    ZINF_TRY(device_.synchronize(stream()));
    scaler_.update(false);
    ++optimizer_updates_;
    ++global_steps_;
    last_step_.optimizer_seconds = span.end();
    times_.optimizer_seconds += last_step_.optimizer_seconds;
    return Status::ok();
}

Result<std::uint64_t> Engine::evaluate(const Batch& batch) {
    ZINF_ASSERT_GE(batch.rows, 1u);
    ZINF_ASSERT_LE(batch.rows, batch_rows_max_);
    ZINF_ASSERT(!forward_done_);
    ZINF_TRY(device_.copy_to_device(inputs_device_, batch.inputs.data(), batch.inputs.size_bytes(),
                                    stream()));
    ZINF_TRY(device_.copy_to_device(labels_device_, batch.labels.data(), batch.labels.size_bytes(),
                                    stream()));
    model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, false};
    ZINF_TRY(model_.forward(ctx, static_cast<const float*>(inputs_device_),
                            static_cast<const std::int32_t*>(labels_device_), batch.rows));
    ZINF_TRY(model_.count_correct(ctx, static_cast<std::uint64_t*>(correct_device_), false));
    std::uint64_t correct = 0;
    ZINF_TRY(device_.copy_to_host(&correct, correct_device_, sizeof correct, stream()));
    ZINF_TRY(device_.synchronize(stream()));
    return correct;
}

Status Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
    if (micro_steps_ % gradient_accumulation_steps() != 0 || forward_done_ || backward_done_) {
        return Status::invalid_argument(
            "save_checkpoint: only at a gradient accumulation boundary (after step())");
    }
    TraceScope span(trace_, "save_checkpoint", "io", 1);
    ZINF_TRY(device_.synchronize(stream()));
    const auto& d = coordinator_->domain();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    ZINF_ASSIGN_OR_RETURN(auto w, engine::CheckpointWriter::create(dir, tag));
    auto bytes = [](const StateBuffer& b) {
        return std::span<const std::byte>(b.data(), b.size_bytes);
    };
    ZINF_TRY(w.write_file("master.fp32", bytes(master_)));
    if (exp_avg_.size_bytes > 0) ZINF_TRY(w.write_file("exp_avg.fp32", bytes(exp_avg_)));
    if (exp_avg_sq_.size_bytes > 0) ZINF_TRY(w.write_file("exp_avg_sq.fp32", bytes(exp_avg_sq_)));
    // The device's parameters (the optimizer domain), in their dtype.
    std::vector<std::byte> params(d.numel * eb);
    ZINF_TRY(device_.copy_to_host(params.data(), d.parameters, params.size(), stream()));
    ZINF_TRY(device_.synchronize(stream()));
    ZINF_TRY(w.write_file(std::string("parameters.") + std::string(dtype_name(d.dtype)), params));
    const auto& part = coordinator_->partitioning();
    w.set("step", std::to_string(global_steps_));
    w.set("micro_steps", std::to_string(micro_steps_));
    w.set("skipped_steps", std::to_string(skipped_steps_));
    w.set("optimizer_updates", std::to_string(optimizer_updates_));
    w.set("global_samples", std::to_string(global_samples_));
    const auto& ss = scaler_.state();
    w.set("loss_scale", exact(ss.scale));
    w.set("loss_scale_iteration", std::to_string(ss.iteration));
    w.set("loss_scale_last_overflow", std::to_string(ss.last_overflow_iteration));
    w.set("loss_scale_hysteresis_left", std::to_string(ss.hysteresis_left));
    w.set("config_digest", hex64(engine::checksum(std::as_bytes(std::span<const char>(
                               config_.canonical_json.data(), config_.canonical_json.size())))));
    w.set("world_size", std::to_string(part.world_size()));
    w.set("rank", std::to_string(part.rank()));
    w.set("zero_stage", std::to_string(config_.zero.stage));
    w.set("dtype", std::string(dtype_name(d.dtype)));
    w.set("master_dtype", "fp32");
    w.set("optimizer", std::string(kernels::optimizer_kind_name(optimizer_params_.kind)));
    w.set("domain_numel", std::to_string(d.numel));
    w.set("model_numel", std::to_string(part.model_numel()));
    ZINF_TRY(w.commit());
    times_.checkpoint_seconds += span.end();
    log::info("checkpoint saved: ", dir, "/", tag, " (step ", global_steps_, ")");
    return Status::ok();
}

Status Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
    ZINF_ASSERT(!forward_done_);
    ZINF_ASSERT(!backward_done_);
    TraceScope span(trace_, "load_checkpoint", "io", 1);
    ZINF_ASSIGN_OR_RETURN(auto r, engine::CheckpointReader::open(dir, tag));
    const auto& d = coordinator_->domain();
    const auto& part = coordinator_->partitioning();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    auto expect = [&](const char* key, const std::string& want) -> Status {
        ZINF_ASSIGN_OR_RETURN(auto got, r.get(key));
        if (got != want) {
            return Status::invalid_argument("checkpoint " + r.path() + ": " + key + " is " + got +
                                            ", this engine has " + want);
        }
        return Status::ok();
    };
    ZINF_TRY(expect("world_size", std::to_string(part.world_size())));
    ZINF_TRY(expect("dtype", std::string(dtype_name(d.dtype))));
    ZINF_TRY(
        expect("optimizer", std::string(kernels::optimizer_kind_name(optimizer_params_.kind))));
    ZINF_TRY(expect("domain_numel", std::to_string(d.numel)));
    ZINF_TRY(expect("model_numel", std::to_string(part.model_numel())));
    ZINF_ASSIGN_OR_RETURN(auto digest, r.get("config_digest"));
    const auto own = hex64(engine::checksum(std::as_bytes(
        std::span<const char>(config_.canonical_json.data(), config_.canonical_json.size()))));
    if (digest != own) {
        log::warning("checkpoint ", r.path(), ": saved with a different config (digest ", digest,
                     ", now ", own, "); continuing");
    }
    auto into = [](StateBuffer& b) { return std::span<std::byte>(b.data(), b.size_bytes); };
    ZINF_TRY(r.read_file("master.fp32", into(master_)));
    if (exp_avg_.size_bytes > 0) ZINF_TRY(r.read_file("exp_avg.fp32", into(exp_avg_)));
    if (exp_avg_sq_.size_bytes > 0) ZINF_TRY(r.read_file("exp_avg_sq.fp32", into(exp_avg_sq_)));
    std::vector<std::byte> params(d.numel * eb);
    ZINF_TRY(r.read_file(std::string("parameters.") + std::string(dtype_name(d.dtype)), params));
    ZINF_TRY(device_.copy_to_device(d.parameters, params.data(), params.size(), stream()));
    ZINF_TRY(coordinator_->publish_parameters(stream()));
    ZINF_TRY(device_.synchronize(stream()));
    ZINF_ASSIGN_OR_RETURN(global_steps_, r.get_u64("step"));
    ZINF_ASSIGN_OR_RETURN(micro_steps_, r.get_u64("micro_steps"));
    ZINF_ASSIGN_OR_RETURN(skipped_steps_, r.get_u64("skipped_steps"));
    ZINF_ASSIGN_OR_RETURN(optimizer_updates_, r.get_u64("optimizer_updates"));
    ZINF_ASSIGN_OR_RETURN(global_samples_, r.get_u64("global_samples"));
    engine::LossScaler::State ss;
    ZINF_ASSIGN_OR_RETURN(ss.scale, r.get_double("loss_scale"));
    ZINF_ASSIGN_OR_RETURN(ss.iteration, r.get_u64("loss_scale_iteration"));
    ZINF_ASSIGN_OR_RETURN(auto last, r.get("loss_scale_last_overflow"));
    ss.last_overflow_iteration = std::strtoll(last.c_str(), nullptr, 10);
    ZINF_ASSIGN_OR_RETURN(auto hyst, r.get_u64("loss_scale_hysteresis_left"));
    ss.hysteresis_left = static_cast<int>(hyst);
    scaler_.restore(ss);
    times_.checkpoint_seconds += span.end();
    log::info("checkpoint loaded: ", r.path(), " (step ", global_steps_, ")");
    return Status::ok();
}

}  // namespace zinf
