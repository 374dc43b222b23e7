// zinf::Engine: composition of the ZeRO coordinator, the model and the CPU optimizer.
#include "src/engine/engine.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
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

// The NVMe optimizer's gradient source: the domain's gradients (host-readable on the CPU device),
// and the new parameters handed to the coordinator after each sub-group.
class Engine::SwapGradients final : public swap::GradientSource {
public:
    SwapGradients(Engine& e, const std::byte* grads) : e_(e), grads_(grads) {}
    Result<kernels::GradView> gradients(std::size_t, std::uint64_t offset,
                                        std::uint64_t numel) override {
        const auto& d = e_.coordinator_->domain();
        return kernels::GradView{grads_ + offset * dtype_size_bytes(d.dtype),
                                 static_cast<std::size_t>(numel), kernel_dtype(d.dtype)};
    }
    kernels::ParamCopy param_copy(std::size_t, std::uint64_t, std::uint64_t numel) override {
        const auto& d = e_.coordinator_->domain();
        if (d.dtype == DType::kFloat32) return kernels::ParamCopy::none();
        return kernels::ParamCopy{reinterpret_cast<std::uint16_t*>(e_.host_params_.data()),
                                  static_cast<std::size_t>(numel), kernel_dtype(d.dtype)};
    }
    Status updated(std::size_t, std::uint64_t offset, std::span<const float> params) override {
        const auto& d = e_.coordinator_->domain();
        std::span<const std::byte> bytes =
            d.dtype == DType::kFloat32
                ? std::as_bytes(params)
                : std::span<const std::byte>(e_.host_params_.data(),
                                             params.size() * dtype_size_bytes(d.dtype));
        return e_.coordinator_->write_domain_parameters(offset, bytes, e_.stream());
    }

private:
    Engine& e_;
    const std::byte* grads_;
};

namespace {

class FnParamSource final : public swap::ParamSource {
public:
    explicit FnParamSource(std::function<void(std::uint64_t, std::span<float>)> fn)
        : fn_(std::move(fn)) {}
    Status fill(std::size_t, std::uint64_t offset, std::span<float> params) override {
        fn_(offset, params);
        return Status::ok();
    }

private:
    std::function<void(std::uint64_t, std::span<float>)> fn_;
};

}  // namespace

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
    // Checks first, before anything is allocated (Offload::create checks its keys likewise).
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
    const bool offloading = zc.offload_param.device != config::OffloadDevice::kNone ||
                            zc.offload_optimizer.device == config::OffloadDevice::kNvme;
    if (offloading) {
        ZINF_ASSIGN_OR_RETURN(auto part, zero::Partitioning::create(
                                             numels, communicator.world_size(), communicator.rank()));
        const auto plan = zero::StagePlan::for_stage(zc.stage);
        const std::size_t domain_numel =
            plan.optimizer_partitioned ? part.partition_numel() : part.full_numel();
        ZINF_ASSIGN_OR_RETURN(e->offload_, engine::Offload::create(config, part, co.dtype,
                                                                   domain_numel, e->kernel_,
                                                                   device));
        co.offloaded_parameters = e->offload_->parameters();
        co.host_gradients = plan.optimizer_partitioned && device.kind() == DeviceKind::kCpu &&
                            (zc.offload_param.device != config::OffloadDevice::kNone ||
                             zc.offload_optimizer.device == config::OffloadDevice::kNvme);
    }
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
    e->nvme_states_ = zc.offload_optimizer.device == config::OffloadDevice::kNvme;
    // The CPU optimizer reads gradients in host memory: a GPU's are copied there for the step.
    e->host_gradient_copy_ =
        e->host_states_ || (e->nvme_states_ && device.kind() != DeviceKind::kCpu);
    ZINF_TRY(e->init_states());

    const std::size_t rows = config.batch.train_micro_batch_size_per_gpu;
    e->batch_rows_max_ = rows;
    ZINF_ASSIGN_OR_RETURN(e->inputs_device_,
                          device.allocate(rows * model.in_features() * sizeof(float)));
    ZINF_ASSIGN_OR_RETURN(e->labels_device_, device.allocate(rows * sizeof(std::int32_t)));
    ZINF_ASSIGN_OR_RETURN(e->correct_device_, device.allocate(sizeof(std::uint64_t)));
    e->build_summary();
    // zinfinity-train prints the summary itself; an embedding program may call summary().
    log::debug(e->summary_);
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

void Engine::initial_master(std::size_t offset, std::span<float> out) const {
    std::fill(out.begin(), out.end(), 0.0f);
    const auto& part = coordinator_->partitioning();
    const auto& registry = model_.parameters();
    const std::size_t end = offset + out.size();
    for (std::size_t i = 0; i < part.parameter_count(); ++i) {
        const std::size_t valid = coordinator_->domain_valid_numel(i);
        if (valid == 0) continue;
        const std::size_t at = coordinator_->domain_offset_numel(i);
        const std::size_t lo = std::max(offset, at);
        const std::size_t hi = std::min(end, at + valid);
        if (lo >= hi) continue;
        const std::size_t first = coordinator_->plan().optimizer_partitioned
                                      ? static_cast<std::size_t>(part.rank()) * part.slot(i).slice_numel
                                      : 0;
        model::initial_values(registry.info(static_cast<model::ParamId>(i)), config_.seed,
                              first + (lo - at), out.subspan(lo - offset, hi - lo));
    }
}

Status Engine::init_states() {
    const auto& d = coordinator_->domain();
    const auto kind = optimizer_params_.kind;
    const std::size_t eb = dtype_size_bytes(d.dtype);
    sub_group_numel_ = std::min<std::size_t>(
        d.numel, std::max<std::size_t>(16, config_.zero.sub_group_size_numel / 16 * 16));
    if (nvme_states_) {
        swap::OptimizerSwapper* sw = offload_->optimizer();
        sub_group_numel_ = static_cast<std::size_t>(sw->options().sub_group_numel);
        if (d.dtype != DType::kFloat32) {
            ZINF_ASSIGN_OR_RETURN(host_params_.host,
                                  AlignedBuffer::allocate(std::max<std::size_t>(
                                      sub_group_numel_ * eb, 64)));
            host_params_.size_bytes = sub_group_numel_ * eb;
        }
        if (host_gradient_copy_) {
            ZINF_ASSIGN_OR_RETURN(host_grads_.host, AlignedBuffer::allocate(std::max<std::size_t>(
                                                        d.numel * eb, 64)));
            host_grads_.size_bytes = d.numel * eb;
        }
        FnParamSource source(
            [this](std::uint64_t offset, std::span<float> out) { initial_master(offset, out); });
        return sw->initialize(source).with_context("offload_optimizer nvme: writing initial states");
    }
    ZINF_TRY(allocate_state(master_, d.numel * 4, "fp32 master parameters"));
    if (uses_exp_avg(kind)) ZINF_TRY(allocate_state(exp_avg_, d.numel * 4, "exp_avg"));
    if (uses_exp_avg_sq(kind)) ZINF_TRY(allocate_state(exp_avg_sq_, d.numel * 4, "exp_avg_sq"));
    if (host_states_) {
        // DeepSpeed's CPU offload keeps the gradient partition in host memory for the step.
        ZINF_TRY(allocate_state(host_grads_, d.numel * eb, "gradients"));
    }
    if (d.dtype != DType::kFloat32 && (host_states_ || coordinator_->parameters_offloaded())) {
        auto b = AlignedBuffer::allocate(std::max<std::size_t>(sub_group_numel_ * eb, 64));
        if (!b.has_value()) return b.error().with_context("host 16-bit parameters");
        host_params_.host = std::move(*b);
        host_params_.size_bytes = sub_group_numel_ * eb;
    }
    ZINF_TRY(device_.synchronize(stream()));
    // The master copy starts from the same fp32 initial values the parameters were rounded from.
    initial_master(0, std::span<float>(reinterpret_cast<float*>(master_.data()), d.numel));
    return Status::ok();
}

double Engine::current_lr() const noexcept {
    return engine::learning_rate(config_.scheduler, config_.optimizer.lr, optimizer_updates_);
}

Result<std::vector<float>> Engine::master_parameters() {
    const std::size_t n = coordinator_->domain().numel;
    std::vector<float> out(n);
    if (!nvme_states_) {
        std::memcpy(out.data(), master_.data(), n * sizeof(float));
        return out;
    }
    swap::OptimizerSwapper* sw = offload_->optimizer();
    for (std::size_t g = 0; g < sw->sub_group_count(); ++g) {
        const std::size_t at = static_cast<std::size_t>(sw->sub_group_offset_numel(g));
        const std::size_t len = static_cast<std::size_t>(sw->sub_group_numel(g));
        ZINF_TRY(sw->read_sub_group(g, std::span<float>(out.data() + at, len), {}, {}));
    }
    return out;
}

IoFigures Engine::io_figures() const {
    IoFigures f;
    if (!offload_) return f;
    const auto o = offload_->figures();
    f.bytes_read = o.bytes_read;
    f.bytes_written = o.bytes_written;
    f.stall_seconds = o.stall_seconds + optimizer_read_wait_seconds_;
    return f;
}

std::size_t Engine::pinned_bytes() const noexcept {
    return offload_ ? offload_->pinned_bytes() : 0;
}

std::string Engine::residency_summary() const {
    if (!offload_ || offload_->residency() == nullptr) return {};
    return offload_->residency()->stats_summary();
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
    const bool offloaded = coordinator_->parameters_offloaded();
    const std::size_t param_bytes =
        (coordinator_->plan().parameters_partitioned ? part.partition_numel() : part.full_numel()) *
        eb;
    if (offloaded) {
        s += "\n  parameters: partitions (" + mib(param_bytes) + ") under offload_param " +
             std::string(config::offload_device_name(zc.offload_param.device)) + ", gathered to " +
             std::string(device_.name()) + " per use";
    } else {
        s += "\n  parameters: " + std::string(device_.name()) + " (" + mib(param_bytes) +
             (coordinator_->plan().parameters_partitioned ? ", partitioned, gathered per use)"
                                                          : ")");
    }
    s += "\n  gradients: " +
         std::string(coordinator_->gradients_on_host() ? "host memory" : device_.name()) + " (" +
         mib((coordinator_->plan().gradients_partitioned ? part.partition_numel()
                                                         : part.full_numel()) *
             eb) +
         ")";
    if (nvme_states_) {
        s += "\n  optimizer states (fp32 master + moments): nvme (" +
             mib(d.numel * 4 * swap::OptimizerSwapper::state_count(optimizer_params_.kind)) + ")";
    } else {
        s += "\n  optimizer states (fp32 master + moments): " + std::string(states_at) + " (" +
             mib(state_bytes) + ")";
    }
    if (offload_) s += offload_->summary();
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

Status Engine::check_usable() const {
    if (broken_.empty()) return Status::ok();
    return Status::invalid_argument("engine unusable: " + broken_ +
                                    "; the states may disagree with each other: load a "
                                    "checkpoint (load_checkpoint) before continuing");
}

void Engine::end_iteration_if_open() noexcept {
    if (!in_iteration_) return;
    offload_->parameters()->end_iteration();
    in_iteration_ = false;
}

Result<float> Engine::forward(const Batch& batch) {
    ZINF_ASSERT_GE(batch.rows, 1u);
    ZINF_ASSERT_LE(batch.rows, batch_rows_max_);
    ZINF_ASSERT_EQ(batch.inputs.size(), batch.rows * model_.in_features());
    ZINF_ASSERT_EQ(batch.labels.size(), batch.rows);
    ZINF_TRY(check_usable());
    TraceScope span(trace_, "forward", "compute", 0);
    if (micro_steps_ % gradient_accumulation_steps() == 0 && !backward_done_ && !forward_done_) {
        coordinator_->begin_accumulation();
        window_scale_ = scaler_.scale();
    }
    ZINF_TRY(device_.copy_to_device(inputs_device_, batch.inputs.data(), batch.inputs.size_bytes(),
                                    stream()));
    ZINF_TRY(device_.copy_to_device(labels_device_, batch.labels.data(), batch.labels.size_bytes(),
                                    stream()));
    zero::PartitionStorage* storage = offload_ ? offload_->parameters() : nullptr;
    if (storage != nullptr && !in_iteration_) {
        storage->begin_iteration();
        in_iteration_ = true;
    }
    model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, true};
    Status fwd = model_.forward(ctx, static_cast<const float*>(inputs_device_),
                                static_cast<const std::int32_t*>(labels_device_), batch.rows);
    Result<float> loss = fwd.is_ok() ? model_.read_loss(stream()) : Result<float>(fwd);
    if (!loss.has_value()) {
        end_iteration_if_open();
        return loss.error();
    }
    forward_done_ = true;
    times_.forward_seconds += span.end();
    return *loss;
}

Status Engine::backward() {
    ZINF_ASSERT(forward_done_);
    TraceScope span(trace_, "backward", "compute", 0);
    model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, true};
    const double scale = window_scale_ / static_cast<double>(gradient_accumulation_steps());
    Status bwd = model_.backward(ctx, static_cast<float>(scale));
    if (bwd.is_ok()) bwd = device_.synchronize(stream());
    if (!bwd.is_ok()) {
        end_iteration_if_open();
        return bwd;
    }
    // One residency iteration per accumulation window (persistent parameters are gathered in
    // its first micro-step only): it ends at the boundary.
    if (is_gradient_accumulation_boundary()) end_iteration_if_open();
    forward_done_ = false;
    backward_done_ = true;
    times_.backward_seconds += span.end();
    return Status::ok();
}

Result<kernels::GradStats> Engine::gradient_stats() {
    const auto& d = coordinator_->domain();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    const std::byte* grads = static_cast<const std::byte*>(d.gradients);
    if (host_gradient_copy_) {
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
    const std::byte* grads =
        host_gradient_copy_ ? host_grads_.data() : static_cast<const std::byte*>(d.gradients);
    if (nvme_states_) {
        // On the CPU device the gradients are read in place; a GPU's were copied to the host.
        SwapGradients source(*this, grads);
        swap::OptimizerSwapper* sw = offload_->optimizer();
        const Status s = sw->step(p, source);
        optimizer_read_wait_seconds_ += sw->last_step_stats().read_wait_seconds;
        ZINF_TRY(s);
        return device_.synchronize(stream());
    }
    auto* master = reinterpret_cast<float*>(master_.data());
    auto* m = reinterpret_cast<float*>(exp_avg_.data());
    auto* v = reinterpret_cast<float*>(exp_avg_sq_.data());
    const bool via_host = host_states_ || coordinator_->parameters_offloaded();
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
            if (coordinator_->parameters_offloaded()) {
                ZINF_TRY(coordinator_->write_domain_parameters(
                    off, std::as_bytes(std::span<const float>(master + off, n)), stream()));
            } else {
                ZINF_TRY(device_.copy_to_device(params + off * 4, master + off, n * 4, stream()));
            }
        } else {
            auto* out = via_host ? reinterpret_cast<std::uint16_t*>(host_params_.data())
                                 : reinterpret_cast<std::uint16_t*>(params + off * eb);
            const kernels::ParamCopy copy{out, n, kernel_dtype(d.dtype)};
            ZINF_TRY(kernel_.step(p, state, g, copy));
            if (via_host) {
                // Blocks until copied: host_params_ is reused by the next sub-group.
                ZINF_TRY(coordinator_->write_domain_parameters(
                    off, std::span<const std::byte>(host_params_.data(), n * eb), stream()));
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
    if (Status s = optimizer_step(unscale * coef, last_step_.lr); !s.is_ok()) {
        broken_ = "the optimizer step " + std::to_string(global_steps_ + 1) + " failed part-way (" +
                  s.to_string() + ")";
        return s;
    }
    ZINF_TRY(coordinator_->publish_parameters(stream()));
    ZINF_TRY(device_.synchronize(stream()));
    scaler_.update(false);
    ++optimizer_updates_;
    ++global_steps_;
    last_step_.optimizer_seconds = span.end();
    times_.optimizer_seconds += last_step_.optimizer_seconds;
    return Status::ok();
}

Status Engine::io_only_step() {
    if (!offload_) return Status::ok();
    ZINF_TRY(check_usable());
    ZINF_ASSERT(!forward_done_);
    ZINF_ASSERT(!backward_done_);
    end_iteration_if_open();
    TraceScope span(trace_, "io-only step", "io", 1);
    zero::PartitionStorage* storage = offload_->parameters();
    // The parameters' reads of one step: the residency manager's recorded trace (one
    // accumulation window), replayed once.
    if (offload_->tiered_parameters() != nullptr) {
        ZINF_TRY(offload_->tiered_parameters()->replay_trace());
    }
    if (nvme_states_) ZINF_TRY(offload_->optimizer()->io_only_pass());
    if (storage != nullptr) {
        // The new parameters' write-back: the same values written back, sub-group by sub-group.
        const auto& d = coordinator_->domain();
        const std::size_t eb = dtype_size_bytes(d.dtype);
        std::vector<std::byte> piece(sub_group_numel_ * eb);
        for (std::size_t off = 0; off < d.numel; off += sub_group_numel_) {
            const std::size_t n = std::min(sub_group_numel_, d.numel - off);
            const auto bytes = std::span<std::byte>(piece.data(), n * eb);
            ZINF_TRY(coordinator_->read_domain_parameters(off, bytes, stream()));
            ZINF_TRY(coordinator_->write_domain_parameters(off, bytes, stream()));
        }
    }
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
    if (coordinator_->parameters_offloaded()) {
        // Persistent parameters gathered here would stay and shorten the next training step's
        // fetch sequence, which the tiered store would take for a change of access order.
        ZINF_TRY(coordinator_->drop_gathered(stream()));
    }
    return correct;
}

// Checkpoint files, written piece by piece so that states on NVMe never need to fit in memory:
// master.fp32, exp_avg.fp32, exp_avg_sq.fp32 (those the optimizer keeps) and parameters.<dtype>
// (the optimizer domain). The same files whatever the offload config, so a checkpoint resumes
// under any placement.
Status Engine::save_states(engine::CheckpointWriter& w) {
    const auto& d = coordinator_->domain();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    const auto kind = optimizer_params_.kind;
    const std::size_t chunk = std::max<std::size_t>(1, std::min(sub_group_numel_, d.numel));
    std::vector<float> pbuf(chunk), mbuf(uses_exp_avg(kind) ? chunk : 0),
        vbuf(uses_exp_avg_sq(kind) ? chunk : 0);
    ZINF_ASSIGN_OR_RETURN(auto fm, w.begin_file("master.fp32"));
    engine::CheckpointFile fa, fv;
    if (uses_exp_avg(kind)) {
        ZINF_ASSIGN_OR_RETURN(fa, w.begin_file("exp_avg.fp32"));
    }
    if (uses_exp_avg_sq(kind)) {
        ZINF_ASSIGN_OR_RETURN(fv, w.begin_file("exp_avg_sq.fp32"));
    }
    auto floats = [](const float* p, std::size_t n) {
        return std::as_bytes(std::span<const float>(p, n));
    };
    swap::OptimizerSwapper* sw = nvme_states_ ? offload_->optimizer() : nullptr;
    for (std::size_t off = 0; off < d.numel; off += chunk) {
        const std::size_t n = std::min(chunk, d.numel - off);
        const float* pm = nullptr;
        const float* pa = nullptr;
        const float* pv = nullptr;
        if (sw == nullptr) {
            pm = reinterpret_cast<const float*>(master_.data()) + off;
            if (uses_exp_avg(kind)) pa = reinterpret_cast<const float*>(exp_avg_.data()) + off;
            if (uses_exp_avg_sq(kind)) pv = reinterpret_cast<const float*>(exp_avg_sq_.data()) + off;
        } else {
            // chunk == the swapper's sub-group size: chunk k is sub-group k.
            ZINF_TRY(sw->read_sub_group(off / chunk, std::span<float>(pbuf.data(), n),
                                        std::span<float>(mbuf.data(), mbuf.empty() ? 0 : n),
                                        std::span<float>(vbuf.data(), vbuf.empty() ? 0 : n)));
            pm = pbuf.data();
            pa = mbuf.data();
            pv = vbuf.data();
        }
        ZINF_TRY(fm.append(floats(pm, n)));
        if (uses_exp_avg(kind)) ZINF_TRY(fa.append(floats(pa, n)));
        if (uses_exp_avg_sq(kind)) ZINF_TRY(fv.append(floats(pv, n)));
    }
    ZINF_TRY(w.end_file(fm));
    if (uses_exp_avg(kind)) ZINF_TRY(w.end_file(fa));
    if (uses_exp_avg_sq(kind)) ZINF_TRY(w.end_file(fv));
    // The parameters (the optimizer domain), in their dtype.
    std::vector<std::byte> params(chunk * eb);
    ZINF_ASSIGN_OR_RETURN(auto fp, w.begin_file("parameters." + std::string(dtype_name(d.dtype))));
    for (std::size_t off = 0; off < d.numel; off += chunk) {
        const std::size_t n = std::min(chunk, d.numel - off);
        const auto piece = std::span<std::byte>(params.data(), n * eb);
        ZINF_TRY(coordinator_->read_domain_parameters(off, piece, stream()));
        ZINF_TRY(fp.append(piece));
    }
    return w.end_file(fp);
}

Status Engine::load_states(const engine::CheckpointReader& r) {
    const auto& d = coordinator_->domain();
    const std::size_t eb = dtype_size_bytes(d.dtype);
    const auto kind = optimizer_params_.kind;
    const std::size_t chunk = std::max<std::size_t>(1, std::min(sub_group_numel_, d.numel));
    const std::uint64_t state_bytes = static_cast<std::uint64_t>(d.numel) * 4;
    std::vector<float> pbuf(chunk), mbuf(uses_exp_avg(kind) ? chunk : 0),
        vbuf(uses_exp_avg_sq(kind) ? chunk : 0);
    ZINF_ASSIGN_OR_RETURN(auto fm, r.open_file("master.fp32", state_bytes));
    engine::CheckpointFile fa, fv;
    if (uses_exp_avg(kind)) {
        ZINF_ASSIGN_OR_RETURN(fa, r.open_file("exp_avg.fp32", state_bytes));
    }
    if (uses_exp_avg_sq(kind)) {
        ZINF_ASSIGN_OR_RETURN(fv, r.open_file("exp_avg_sq.fp32", state_bytes));
    }
    auto floats = [](float* p, std::size_t n) { return std::as_writable_bytes(std::span<float>(p, n)); };
    swap::OptimizerSwapper* sw = nvme_states_ ? offload_->optimizer() : nullptr;
    for (std::size_t off = 0; off < d.numel; off += chunk) {
        const std::size_t n = std::min(chunk, d.numel - off);
        float* pm = sw ? pbuf.data() : reinterpret_cast<float*>(master_.data()) + off;
        float* pa = sw ? mbuf.data()
                       : (uses_exp_avg(kind) ? reinterpret_cast<float*>(exp_avg_.data()) + off
                                             : nullptr);
        float* pv = sw ? vbuf.data()
                       : (uses_exp_avg_sq(kind) ? reinterpret_cast<float*>(exp_avg_sq_.data()) + off
                                                : nullptr);
        ZINF_TRY(fm.read(floats(pm, n)));
        if (uses_exp_avg(kind)) ZINF_TRY(fa.read(floats(pa, n)));
        if (uses_exp_avg_sq(kind)) ZINF_TRY(fv.read(floats(pv, n)));
        if (sw != nullptr) {
            ZINF_TRY(sw->write_sub_group(off / chunk, std::span<const float>(pm, n),
                                         std::span<const float>(pa, pa ? n : 0),
                                         std::span<const float>(pv, pv ? n : 0)));
        }
    }
    ZINF_TRY(r.end_file(fm));
    if (uses_exp_avg(kind)) ZINF_TRY(r.end_file(fa));
    if (uses_exp_avg_sq(kind)) ZINF_TRY(r.end_file(fv));
    std::vector<std::byte> params(chunk * eb);
    ZINF_ASSIGN_OR_RETURN(auto fp, r.open_file("parameters." + std::string(dtype_name(d.dtype)),
                                               static_cast<std::uint64_t>(d.numel) * eb));
    for (std::size_t off = 0; off < d.numel; off += chunk) {
        const std::size_t n = std::min(chunk, d.numel - off);
        const auto piece = std::span<std::byte>(params.data(), n * eb);
        ZINF_TRY(fp.read(piece));
        ZINF_TRY(coordinator_->write_domain_parameters(off, piece, stream()));
    }
    return r.end_file(fp);
}

Status Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
    if (micro_steps_ % gradient_accumulation_steps() != 0 || forward_done_ || backward_done_) {
        return Status::invalid_argument(
            "save_checkpoint: only at a gradient accumulation boundary (after step())");
    }
    ZINF_TRY(check_usable());
    TraceScope span(trace_, "save_checkpoint", "io", 1);
    ZINF_TRY(device_.synchronize(stream()));
    const auto& d = coordinator_->domain();
    ZINF_ASSIGN_OR_RETURN(auto w, engine::CheckpointWriter::create(io::posix_file_system(), dir, tag));
    ZINF_TRY(save_states(w));
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
    ZINF_ASSIGN_OR_RETURN(auto r, engine::CheckpointReader::open(io::posix_file_system(), dir, tag));
    const auto& d = coordinator_->domain();
    const auto& part = coordinator_->partitioning();
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
    // From here on a failure leaves states half-restored.
    if (Status s = load_states(r); !s.is_ok()) {
        broken_ = "loading checkpoint " + r.path() + " failed part-way (" + s.to_string() + ")";
        return s;
    }
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
    broken_.clear();
    times_.checkpoint_seconds += span.end();
    log::info("checkpoint loaded: ", r.path(), " (step ", global_steps_, ")");
    return Status::ok();
}

}  // namespace zinf
