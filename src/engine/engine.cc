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
using engine::kNormChunkNumel;  // src/engine/gradient_swap.h: the streamed norm uses it too

std::string mib(std::size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return buf;
}

// Bytes as MiB with three decimals (the memory table compares ranks and formulas).
std::string mib3(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / (1 << 20));
    return buf;
}

std::string exact(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

// "12", "6.004": bytes per element, three decimals where not whole.
std::string shortest(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.4g", v);
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
        if (overlap_ != nullptr) overlap_->accumulated(id);
        if (after_gradient_) after_gradient_(id);
        return s;
    }
    void set_overlap(engine::OverlapStep* overlap) noexcept { overlap_ = overlap; }
    void set_after_gradient(std::function<void(std::size_t)> fn) {
        after_gradient_ = std::move(fn);
    }

private:
    engine::OverlapStep* overlap_ = nullptr;
    std::function<void(std::size_t)> after_gradient_;
    zero::ParameterCoordinator& coordinator_;
    const model::ParameterRegistry& registry_;
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

Engine::Engine(const config::EngineConfig& config, engine::OffloadPlan plan, model::Model& model,
               Device& device, Compute& compute, zero::Communicator& communicator,
               kernels::OptimizerKernel kernel, const EngineOptions& options)
    : config_(config),
      plan_(std::move(plan)),
      model_(model),
      device_(device),
      compute_(compute),
      communicator_(communicator),
      kernel_(std::move(kernel)),
      options_(options),
      scaler_(config.fp16) {}

Engine::~Engine() {
    if (const Status s = wait_checkpoint(); !s.is_ok()) log::error(s.to_string());
    // Nothing may still run on the stream when buffers go.
    (void)device_.synchronize(stream());
}

io::FileSystem& Engine::file_system() const noexcept {
    return options_.file_system != nullptr ? *options_.file_system : io::posix_file_system();
}

Result<std::unique_ptr<Engine>> Engine::create(const config::EngineConfig& config,
                                               model::Model& model, Device& device,
                                               Compute& compute, zero::Communicator& communicator,
                                               const EngineOptions& options) {
    // Checks first, before anything is allocated (placement was checked by config::load).
    if (model.batch_rows_max() < config.batch.train_micro_batch_size_per_gpu) {
        return Status::invalid_argument(
            str_cat("train_micro_batch_size_per_gpu: ", config.batch.train_micro_batch_size_per_gpu,
                    " exceeds the model's batch_rows_max ", model.batch_rows_max()));
    }
    ZINF_TRY(engine::check_scheduler(config.scheduler));
    // One config serves every rank: each rank swaps under its own subdirectory.
    auto made = communicator.world_size() > 1
                    ? create_for_rank(engine::with_rank_swap_paths(config, communicator.rank()),
                                      model, device, compute, communicator, options)
                    : create_for_rank(config, model, device, compute, communicator, options);
    // The summary gathers every rank's figures: every rank created its engine, or none goes on
    // (a rank whose swap directory failed would otherwise leave the others waiting).
    ZINF_ASSIGN_OR_RETURN(const bool any_failed,
                          zero::any_over_ranks(communicator, !made.has_value()));
    if (!made.has_value()) return made.error();
    if (any_failed) {
        return zero::peer_failure("engine: creating the engine");
    }
    std::unique_ptr<Engine> e = std::move(made).value();
    ZINF_TRY(e->build_summary());
    // zinfinity-train prints the summary itself; an embedding program may call summary().
    log::debug(e->summary_);
    return e;
}

Result<std::unique_ptr<Engine>> Engine::create_for_rank(const config::EngineConfig& config,
                                                        model::Model& model, Device& device,
                                                        Compute& compute,
                                                        zero::Communicator& communicator,
                                                        const EngineOptions& options) {
    // The swap paths first (a bad one is named before a plan's error), then the plan and
    // admission, then the paths are made if missing (as DeepSpeed does): a refused config
    // creates nothing.
    ZINF_TRY(engine::check_swap_directories(config, /*create=*/false));
    const engine::PlanInputs in =
        engine::plan_inputs_for(model, device, communicator.world_size(), communicator.rank());
    ZINF_ASSIGN_OR_RETURN(engine::OffloadPlan plan, engine::make_offload_plan(config, in));
    // Admission, before a swap run directory or file is created: the predicted peaks against
    // the budgets. The gathered working set of a model that does not declare its fetch groups is a
    // lower bound there, so the device's own budget check at each allocation stays.
    ZINF_ASSIGN_OR_RETURN(
        engine::MemoryPrediction prediction,
        engine::predict_memory(config, plan, in, engine::prediction_inputs_for(model, device)));
    if (options.admission) ZINF_TRY(engine::admit(prediction));
    ZINF_TRY(engine::check_swap_directories(config, /*create=*/true));
    plan.io.file_system = options.file_system;
    plan.io.faults = options.io_faults;
    ZINF_TRY(kernels::validate(plan.optimizer));
    ZINF_ASSIGN_OR_RETURN(auto kernel,
                          kernels::OptimizerKernel::create(plan.cpu_isa, plan.cpu_threads));
    ZINF_ASSIGN_OR_RETURN(auto part,
                          zero::Partitioning::create(in.parameter_numels, in.world_size, in.rank,
                                                     plan.partition_align_numel));
    std::unique_ptr<Engine> e(new Engine(config, std::move(plan), model, device, compute,
                                         communicator, std::move(kernel), options));
    e->prediction_ = std::move(prediction);
    ZINF_TRY(e->build(part));
    return e;
}

// Wires what the plan describes: the offload (host and NVMe homes), the coordinator with the
// model's initial parameters, the optimizer's I/O and state store, the batch staging.
Status Engine::build(const zero::Partitioning& part) {
    zero::CoordinatorOptions co = plan_.coordinator;
    if (plan_.parameters_offloaded() || plan_.needs_io) {
        ZINF_ASSIGN_OR_RETURN(offload_, engine::Offload::create(plan_, part, kernel_, device_));
        co.offloaded_parameters = offload_->parameters();
    }
    if (plan_.gradients == engine::Home::kNvme) {
        ZINF_ASSERT(offload_ && offload_->optimizer_store() != nullptr);
        ZINF_ASSIGN_OR_RETURN(gradient_swap_, engine::GradientSwap::create(
                                                  *offload_->optimizer_store(), part, plan_.dtype,
                                                  plan_.sub_group_numel, device_, kernel_));
        co.gradient_storage = gradient_swap_.get();
    }
    std::vector<std::size_t> numels;
    for (const auto& info : model_.parameters().all()) numels.push_back(info.numel);
    ZINF_ASSIGN_OR_RETURN(coordinator_, zero::ParameterCoordinator::create(
                                            numels, co, device_, compute_, communicator_));
    adapter_ = std::make_unique<Adapter>(*coordinator_, model_.parameters());
    adapter_->set_after_gradient(options_.after_gradient);
    const auto& registry = model_.parameters();
    const std::uint64_t seed = config_.seed;
    ZINF_TRY(coordinator_->initialize(
        [&](std::size_t index, std::size_t offset, std::span<float> out) {
            model_.initial_values(registry.info(static_cast<model::ParamId>(index)), seed, offset,
                                  out);
        },
        stream()));
    ZINF_TRY(init_states());
    if (config_.swap.background_checkpoint && !background_checkpoints() &&
        communicator_.rank() == 0) {
        log::warning("swap.background_checkpoint: checkpoints are written in the foreground (",
                     communicator_.world_size() > 1 ? "several ranks"
                                                    : "the optimizer states are not on NVMe",
                     "; background copies need one rank and offload_optimizer nvme)");
    }

    if (config_.swap.optimizer_read_ahead != 1 && plan_.optimizer_states != engine::Home::kNvme &&
        communicator_.rank() == 0) {
        log::warning(
            "swap.optimizer_read_ahead: not used (the optimizer states are not on "
            "NVMe; the read-ahead is that of offload_optimizer nvme's sub-groups)");
    }

    if (config_.swap.overlap_step && !plan_.overlap_step && communicator_.rank() == 0) {
        log::warning("swap.overlap_step: the optimizer step runs after backward (",
                     plan_.overlap_step_reason,
                     "; the step beside backward needs one rank, ZeRO stage 2 or 3, "
                     "offload_optimizer nvme and the gradients in host memory)");
    }

    const std::size_t rows = config_.batch.train_micro_batch_size_per_gpu;
    const model::BatchShape shape = model_.batch_shape();
    batch_rows_max_ = rows;
    ZINF_ASSIGN_OR_RETURN(
        inputs_device_,
        DeviceBuffer::allocate(device_, rows * shape.input_numel * 4, "batch inputs"));
    ZINF_ASSIGN_OR_RETURN(
        labels_device_,
        DeviceBuffer::allocate(device_, rows * shape.label_numel * 4, "batch labels"));
    ZINF_ASSIGN_OR_RETURN(correct_device_,
                          DeviceBuffer::allocate(device_, sizeof(std::uint64_t), "accuracy"));
    return Status::ok();
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
        const std::size_t first =
            coordinator_->plan().optimizer_partitioned
                ? static_cast<std::size_t>(part.rank()) * part.slot(i).slice_numel
                : 0;
        model_.initial_values(registry.info(static_cast<model::ParamId>(i)), config_.seed,
                              first + (lo - at), out.subspan(lo - offset, hi - lo));
    }
}

// The optimizer's half: where it reads gradients and writes parameters, and the state store
// the plan asks for, initialised with the fp32 values the parameters were rounded from.
Status Engine::init_states() {
    ZINF_ASSERT_EQ(coordinator_->domain().numel, plan_.domain_numel);
    ZINF_ASSIGN_OR_RETURN(optimizer_io_, engine::OptimizerIo::create(plan_, *coordinator_, device_,
                                                                     gradient_swap_.get()));
    ZINF_ASSIGN_OR_RETURN(states_,
                          engine::make_state_store(plan_, device_, kernel_,
                                                   offload_ ? offload_->optimizer() : nullptr));
    if (plan_.overlap_step) {
        ZINF_ASSIGN_OR_RETURN(
            overlap_, engine::OverlapStep::create(
                          plan_, *coordinator_, *offload_->optimizer(), *optimizer_io_, device_,
                          // One rank holding its gradients in host memory: the norm's partial of a
                          // parameter is that of its domain slice, as gradient_stats takes it.
                          [this](std::size_t p) {
                              return slice_partial(
                                  static_cast<const std::byte*>(coordinator_->domain().gradients),
                                  coordinator_->domain_offset_numel(p),
                                  coordinator_->partitioning().slot(p).slice_numel);
                          }));
        adapter_->set_overlap(overlap_.get());
    }
    FnParamSource source(
        [this](std::uint64_t offset, std::span<float> out) { initial_master(offset, out); });
    return states_->initialize(source);
}

double Engine::current_lr() const noexcept {
    if (lr_override_.has_value()) return *lr_override_;
    return engine::learning_rate(config_.scheduler, config_.optimizer.lr, optimizer_updates_);
}

Result<std::vector<float>> Engine::master_parameters() {
    settle_overlap();
    std::vector<float> out(states_->numel());
    engine::ChunkBuffers buffers(states_->layout(), states_->chunk_numel());
    for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
        const std::size_t n = states_->chunk_length(k);
        engine::StateChunk c = buffers.chunk(n);
        c.master = std::span<float>(out.data() + k * states_->chunk_numel(), n);
        ZINF_TRY(states_->read_chunk(k, c));
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
    f.faults_injected = o.faults_injected;
    return f;
}

std::size_t Engine::pinned_bytes() const noexcept {
    return offload_ ? offload_->pinned_bytes() : 0;
}

std::string Engine::residency_summary() const {
    if (!offload_ || offload_->residency() == nullptr) return {};
    return offload_->residency()->stats_summary();
}

MemoryAccount Engine::memory_account() const {
    const auto& part = coordinator_->partitioning();
    MemoryAccount a;
    a.stage = plan_.stage;
    a.world_size = part.world_size();
    a.model_numel = part.model_numel();
    a.padding_numel = part.full_numel() - part.model_numel();
    a.b = dtype_size_bytes(plan_.dtype);
    a.k = plan_.state_bytes_per_element();
    a.held = coordinator_->memory_held();
    a.optimizer_states = states_->state_bytes();
    const double psi = static_cast<double>(a.model_numel);
    const double n = a.world_size;
    a.formula_parameters = static_cast<double>(a.b) * psi / (a.stage >= 3 ? n : 1.0);
    a.formula_gradients = static_cast<double>(a.b) * psi / (a.stage >= 2 ? n : 1.0);
    a.formula_states = a.k * psi / (a.stage >= 1 ? n : 1.0);
    return a;
}

// Every rank's account, as rows of a table (rank 0 prints the summary).
Result<std::string> Engine::memory_table() const {
    const MemoryAccount a = memory_account();
    const std::uint64_t mine[5] = {a.held.parameters, a.held.parameter_staging, a.held.gradients,
                                   a.held.gradient_staging, a.optimizer_states};
    const auto ws = static_cast<std::size_t>(a.world_size);
    std::vector<std::uint64_t> all(5 * ws);
    ZINF_TRY(communicator_.all_gather_host(std::as_bytes(std::span(mine)),
                                           std::as_writable_bytes(std::span(all))));
    std::string s =
        str_cat("\n  model states per rank (seed formulas, stage ", a.stage, ", N = ", a.world_size,
                ", Ψ = ", a.model_numel, ", b = ", a.b, ", K = ", shortest(a.k), "): parameters ",
                mib3(a.formula_parameters), ", gradients ", mib3(a.formula_gradients),
                ", optimizer states ", mib3(a.formula_states));
    for (std::size_t r = 0; r < ws; ++r) {
        const std::uint64_t* v = all.data() + 5 * r;
        s += str_cat("\n    rank ", r, ": parameters ", mib3(static_cast<double>(v[0])),
                     ", gradients ", mib3(static_cast<double>(v[2])), ", optimizer states ",
                     mib3(static_cast<double>(v[4])));
        if (v[1] > 0)
            s += str_cat(" + a parameter partition copy ", mib3(static_cast<double>(v[1])));
        if (v[3] > 0) {
            s += str_cat(" + the reduced gradient slices ", mib3(static_cast<double>(v[3])));
        }
    }
    return s;
}

Status Engine::build_summary() {
    const auto& part = coordinator_->partitioning();
    std::string s =
        str_cat("zinfinity engine: ", optimizer_kind_name(plan_.optimizer.kind), " (cpu kernel ",
                kernels::isa_name(kernel_.isa()), ", ", kernel_.threads(), " threads), lr ",
                exact(config_.optimizer.lr), "; model ", model_.name(), "; ZeRO stage ",
                plan_.stage, " over ", part.world_size(), " rank(s) (", communicator_.name(), ")");
    if (config_.fp16.enabled) {
        s += str_cat("; loss scale ", exact(scaler_.scale()),
                     scaler_.dynamic() ? " (dynamic)" : " (static)");
    }
    s += str_cat("\n", plan_.describe(), "\n  optimizer states held: ", mib(states_->state_bytes()),
                 " (", engine::home_name(states_->home()), ")");
    if (offload_) s += offload_->summary();
    s += str_cat("\n  device ", device_.name(), ": budget ", mib(device_.budget_bytes()),
                 ", in use ", mib(device_.used_bytes()), ", predicted peak ",
                 mib(prediction_.device.total_bytes()), "\n  batch: train_batch_size ",
                 train_batch_size(), " = micro ", train_micro_batch_size_per_gpu(),
                 " x accumulation ", gradient_accumulation_steps(), " x world ", part.world_size());
    if (config_.gradient_clipping > 0) {
        s += str_cat("; gradient clipping ", exact(config_.gradient_clipping));
    }
    ZINF_ASSIGN_OR_RETURN(auto table, memory_table());
    s += table;
    summary_ = std::move(s);
    return Status::ok();
}

Status Engine::set_io_discard(bool on) {
    ZINF_TRY(wait_checkpoint());
    ZINF_TRY(drop_io_only_params());
    if (offload_) offload_->set_io_discard(on);
    model_.set_io_discard(on);
    if (io_discard_ && !on) {
        broken_ =
            "steps ran with their I/O discarded (set_io_discard: the compute-only pass of "
            "--measure-overlap), so the states are not the trained ones";
    }
    io_discard_ = on;
    return Status::ok();
}

std::uint64_t Engine::io_ops_discarded() const {
    return offload_ ? offload_->io_ops_discarded() : 0;
}

Status Engine::check_usable() const {
    if (broken_.empty()) return Status::ok();
    return Status::invalid_argument("engine unusable: " + broken_ +
                                    "; the states may disagree with each other: load a "
                                    "checkpoint (load_checkpoint) before continuing");
}

void Engine::end_iteration_if_open() noexcept {
    if (!in_iteration_) return;
    coordinator_->end_iteration();
    in_iteration_ = false;
}

// Copies one micro-batch to the device, checked against the model's batch shape.
Status Engine::stage_batch(const Batch& batch) {
    const model::BatchShape shape = model_.batch_shape();
    ZINF_ASSERT_GE(batch.rows, 1u);
    ZINF_ASSERT_LE(batch.rows, batch_rows_max_);
    ZINF_ASSERT_EQ(batch.labels.size(), batch.rows * shape.label_numel);
    std::span<const std::byte> inputs;
    if (shape.input_kind == model::InputKind::kFloat32) {
        ZINF_ASSERT_EQ(batch.inputs.size(), batch.rows * shape.input_numel);
        inputs = std::as_bytes(batch.inputs);
    } else {
        ZINF_ASSERT_EQ(batch.tokens.size(), batch.rows * shape.input_numel);
        inputs = std::as_bytes(batch.tokens);
    }
    ZINF_TRY(device_.copy_to_device(inputs_device_.data(), inputs.data(), inputs.size(), stream()));
    ZINF_TRY(device_.copy_to_device(labels_device_.data(), batch.labels.data(),
                                    batch.labels.size_bytes(), stream()));
    // The copies read the caller's batch, which it may free or refill as soon as forward,
    // evaluate or predict returns, on an error too (a failed model forward returned before
    // anything waited for them: ThreadSanitizer, engine_fault_test). The stream is idle here
    // (each step and backward end synchronized), so this waits for these few KiB only.
    ZINF_TRY(device_.synchronize(stream()));
    rows_staged_ = batch.rows;
    return Status::ok();
}

Status Engine::open_training_forward() {
    ZINF_TRY(check_usable());
    if (micro_steps_ % gradient_accumulation_steps() == 0 && !backward_done_ && !forward_done_) {
        coordinator_->begin_accumulation();
        window_scale_ = scaler_.scale();
    }
    if (!in_iteration_) {
        coordinator_->begin_iteration();
        in_iteration_ = true;
    }
    // The step beside backward starts with the window's last forward: its thread reads the
    // first sub-groups' states while the forward computes (the forward reads only parameters,
    // so the disk has room), and steps each once backward makes its gradients final.
    begin_overlap();
    return Status::ok();
}

Result<float> Engine::forward(const Batch& batch) {
    ZINF_TRY(check_usable());
    TraceScope span(trace_, "forward", "compute", 0);
    ZINF_TRY(stage_batch(batch));
    ZINF_TRY(open_training_forward());
    model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, true};
    Status fwd =
        model_.forward(ctx, inputs_device_.data(), labels_device_.as<std::int32_t>(), batch.rows);
    Result<float> loss = fwd.is_ok() ? model_.read_loss(stream()) : Result<float>(fwd);
    if (!loss.has_value()) {
        if (overlap_) overlap_->abandon(engine::OverlapStep::Why::kFailed);
        end_iteration_if_open();
        return loss.error();
    }
    forward_done_ = true;
    times_.forward_seconds += span.end();
    return *loss;
}

// After the model's backward: the stream drained, the iteration closed at the boundary.
Status Engine::close_backward() {
    if (Status s = device_.synchronize(stream()); !s.is_ok()) {
        end_iteration_if_open();
        return s;
    }
    // One residency iteration per accumulation window (persistent parameters are gathered in
    // its first micro-step only): it ends at the boundary.
    if (is_gradient_accumulation_boundary()) end_iteration_if_open();
    forward_done_ = false;
    backward_done_ = true;
    return Status::ok();
}

Status Engine::backward() {
    ZINF_ASSERT(forward_done_);
    TraceScope span(trace_, "backward", "compute", 0);
    // The step beside backward writes its parameter buffer from here on: every parameter still
    // staged from it (one the forward did not read) is taken now.
    if (Status taken = coordinator_->take_staged_parameters(); !taken.is_ok()) {
        if (overlap_) overlap_->abandon(engine::OverlapStep::Why::kFailed);
        end_iteration_if_open();
        return taken;
    }
    model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, true};
    const double scale = window_scale_ / static_cast<double>(gradient_accumulation_steps());
    if (gradient_swap_) gradient_swap_->set_final_micro_step(is_gradient_accumulation_boundary());
    if (Status bwd = model_.backward(ctx, static_cast<float>(scale)); !bwd.is_ok()) {
        if (overlap_) overlap_->abandon(engine::OverlapStep::Why::kFailed);
        end_iteration_if_open();
        return bwd;
    }
    ZINF_TRY(close_backward());
    times_.backward_seconds += span.end();
    return Status::ok();
}

Status Engine::begin_forward(bool training) {
    if (driven_open_) {
        return Status::invalid_argument("begin_forward: the previous pass was not ended");
    }
    if (training) {
        if (backward_done_) {
            return Status::invalid_argument(
                "forward: backward ran since the last step(); call step() after each backward");
        }
        ZINF_TRY(open_training_forward());
    } else {
        ZINF_TRY(check_usable());
        if (forward_done_) {
            return Status::invalid_argument(
                "evaluation forward: a training forward awaits its backward");
        }
    }
    driven_open_ = true;
    driven_training_ = training;
    driven_started_ = std::chrono::steady_clock::now();
    return Status::ok();
}

Status Engine::end_forward(bool ok) {
    if (!driven_open_) return Status::invalid_argument("end_forward: no forward begun");
    driven_open_ = false;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - driven_started_;
    times_.forward_seconds += took.count();
    if (!driven_training_) {
        Status s = ok ? device_.synchronize(stream()) : Status::ok();
        const Status ended = coordinator_->end_evaluation(stream());
        return s.is_ok() ? ended : s;
    }
    if (ok) ok = device_.synchronize(stream()).is_ok();
    if (!ok) {
        if (overlap_) overlap_->abandon(engine::OverlapStep::Why::kFailed);
        end_iteration_if_open();
        return Status::ok();
    }
    forward_done_ = true;
    return Status::ok();
}

Result<double> Engine::begin_backward() {
    if (driven_open_) {
        return Status::invalid_argument("backward: a pass is still open (end_forward first)");
    }
    if (!forward_done_) {
        return Status::invalid_argument(backward_done_
                                            ? "backward: called twice without step() in between"
                                            : "backward: no training forward before it");
    }
    // As backward(): nothing stays staged from the buffer the step beside backward writes.
    if (Status taken = coordinator_->take_staged_parameters(); !taken.is_ok()) {
        if (overlap_) overlap_->abandon(engine::OverlapStep::Why::kFailed);
        end_iteration_if_open();
        return taken;
    }
    if (gradient_swap_) gradient_swap_->set_final_micro_step(is_gradient_accumulation_boundary());
    driven_open_ = true;
    driven_training_ = true;
    driven_started_ = std::chrono::steady_clock::now();
    return window_scale_ / static_cast<double>(gradient_accumulation_steps());
}

Status Engine::end_backward(bool ok) {
    if (!driven_open_) return Status::invalid_argument("end_backward: no backward begun");
    driven_open_ = false;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - driven_started_;
    times_.backward_seconds += took.count();
    if (!ok) {
        if (overlap_) overlap_->abandon(engine::OverlapStep::Why::kFailed);
        end_iteration_if_open();
        forward_done_ = false;
        return Status::ok();
    }
    return close_backward();
}

model::ParameterSource& Engine::parameter_source() noexcept {
    return *adapter_;
}
model::GradientSink& Engine::gradient_sink() noexcept {
    return *adapter_;
}

// The global gradient norm, the same bits under every stage and placement at one world size:
// one partial sum of squares per (parameter, rank slice), each over the slice in chunks of
// kNormChunkNumel from its start, added parameter by parameter and, within one, in rank order.
// Stage 0 holds every reduced gradient and computes every partial itself; under stages 1-3 each
// rank computes its slices' partials and the ranks exchange them (zero::sum_over_ranks adds the
// zeros of the other ranks' columns, which is exact), so every rank clips by the same norm.
Result<kernels::GradStats> Engine::gradient_stats() {
    const auto& part = coordinator_->partitioning();
    const bool partitioned = coordinator_->plan().optimizer_partitioned;
    const auto ws = static_cast<std::size_t>(part.world_size());
    const std::size_t params = part.parameter_count();
    // partials[p * ws + r]; the last element counts slices with an inf or NaN. Kept between
    // steps: the step allocates nothing.
    std::vector<double>& partials = norm_partials_;
    partials.assign(params * ws + 1, 0.0);
    if (gradient_swap_) {
        // Streamed: each slice's partial was taken from its final value as it was written, in
        // the same chunks as below.
        const auto r = static_cast<std::size_t>(part.rank());
        for (std::size_t p = 0; p < params; ++p) {
            partials[p * ws + r] = gradient_swap_->partial(p);
            partials.back() += static_cast<double>(gradient_swap_->nonfinite_chunks(p));
        }
        if (ws > 1) {
            ZINF_TRY(zero::sum_over_ranks(communicator_, partials)
                         .with_context("gradient norm over ranks"));
        }
        kernels::GradStats total;
        for (std::size_t k = 0; k < params * ws; ++k) total.sum_squares += partials[k];
        total.has_inf_nan = partials.back() != 0.0;
        return total;
    }
    ZINF_ASSIGN_OR_RETURN(const std::byte* grads, optimizer_io_->prepare(stream()));
    auto slice_sum = [&](std::size_t offset, std::size_t n) {
        const engine::NormPartial s = slice_partial(grads, offset, n);
        partials.back() += s.nonfinite_chunks;
        return s.sum_squares;
    };
    // The step beside backward took some partials already (the same function on its thread).
    const bool shared = overlap_ && overlap_->partials_usable();
    for (std::size_t p = 0; p < params; ++p) {
        const auto& slot = part.slot(p);
        if (partitioned) {
            const auto r = static_cast<std::size_t>(part.rank());
            engine::NormPartial s;
            if (!shared || !overlap_->take_partial(p, s)) {
                s = slice_partial(grads, slot.partition_offset_numel, slot.slice_numel);
            }
            partials[p * ws + r] = s.sum_squares;
            partials.back() += s.nonfinite_chunks;
        } else {
            for (std::size_t r = 0; r < ws; ++r) {
                partials[p * ws + r] =
                    slice_sum(slot.full_offset_numel + r * slot.slice_numel, slot.slice_numel);
            }
        }
    }
    if (partitioned && ws > 1) {
        ZINF_TRY(
            zero::sum_over_ranks(communicator_, partials).with_context("gradient norm over ranks"));
    }
    kernels::GradStats total;
    for (std::size_t k = 0; k < params * ws; ++k) total.sum_squares += partials[k];
    total.has_inf_nan = partials.back() != 0.0;
    return total;
}

// One slice's sum of squares, in chunks of kNormChunkNumel from its start, and how many chunks
// hold an inf or NaN.
engine::NormPartial Engine::slice_partial(const std::byte* grads, std::size_t offset_numel,
                                          std::size_t numel) const {
    const auto dtype = coordinator_->domain().dtype;
    const std::size_t eb = dtype_size_bytes(dtype);
    engine::NormPartial out;
    for (std::size_t at = 0; at < numel; at += kNormChunkNumel) {
        const std::size_t len = std::min(kNormChunkNumel, numel - at);
        const auto s =
            kernel_.grad_stats(kernels::GradView{grads + (offset_numel + at) * eb, len, dtype});
        if (s.has_inf_nan) out.nonfinite_chunks += 1.0;
        out.sum_squares += s.sum_squares;
    }
    return out;
}

// The optimizer part of a boundary step: overflow check, clipping, the store's step, publishing
// the new parameters. `unscale` turns the gradients' sum of squares into the true norm.
Status Engine::run_optimizer(double unscale) {
    TraceScope span(trace_, "optimizer", "optimizer", 2);
    // The parameters change: io_only_step's copy is stale.
    ZINF_TRY(drop_io_only_params());
    TraceScope norm_span(trace_, "gradient norm", "optimizer", 3);
    ZINF_ASSIGN_OR_RETURN(auto stats, gradient_stats());
    norm_span.end();
    last_step_.lr = current_lr();
    if (stats.has_inf_nan && config_.fp16.enabled) {
        overlap_last_stood_ = false;
        if (overlap_ && overlap_->speculating()) {
            overlap_->abandon(engine::OverlapStep::Why::kOverflow);
        }
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
    overlap_last_stood_ = coef == 1.0;
    const kernels::OptimizerParams p = step_params(unscale * coef);
    Status s = update_states(p);
    times_.checkpoint_wait_seconds = states_->snapshot_wait_seconds();
    if (s.is_ok()) s = device_.synchronize(stream());
    // publish_parameters is a collective: every rank enters it, or none does.
    ZINF_ASSIGN_OR_RETURN(const bool any_failed, zero::any_over_ranks(communicator_, !s.is_ok()));
    if (s.is_ok() && any_failed) {
        s = zero::peer_failure("the optimizer step");
    }
    if (!s.is_ok()) {
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

kernels::OptimizerParams Engine::step_params(double grad_scale) const {
    kernels::OptimizerParams p = plan_.optimizer;
    p.step = optimizer_updates_ + 1;
    p.lr = current_lr();
    p.grad_scale = grad_scale;
    // OneCycle cycles the momentum: DeepSpeed writes betas = (momentum, 0.99) into every
    // optimizer that has betas (Adagrad has none, and keeps its own).
    if (const auto beta1 = engine::momentum(config_.scheduler, optimizer_updates_);
        beta1.has_value() && optimizer_descriptor(p.kind).uses_betas) {
        p.beta1 = *beta1;
        p.beta2 = engine::kOneCycleBeta2;
    }
    return p;
}

void Engine::begin_overlap() {
    if (!overlap_ || !is_gradient_accumulation_boundary()) return;
    if (!overlap_enabled_) {
        overlap_->abandon(engine::OverlapStep::Why::kFailed);  // nothing running: no count
        return;
    }
    // Clipping and overflow come in runs (early training clips step after step): after a step
    // that a speculation would not have matched, the next one steps after backward, so that
    // a run of clipped steps costs no speculated I/O beside backward.
    if (!overlap_last_stood_ && !options_.speculate_every_window) {
        overlap_->skip_window();
        return;
    }
    // The step as it will be if the norm asks for no clipping (coefficient 1, no overflow).
    overlap_params_ = step_params(1.0 / (window_scale_ * communicator_.world_size()));
    overlap_->begin_window(overlap_params_, stream());
}

namespace {

// Whether two steps update the states alike (the speculated step against the one due).
bool same_step(const kernels::OptimizerParams& a, const kernels::OptimizerParams& b) noexcept {
    return a.kind == b.kind && a.step == b.step && a.lr == b.lr && a.beta1 == b.beta1 &&
           a.beta2 == b.beta2 && a.eps == b.eps && a.weight_decay == b.weight_decay &&
           a.grad_scale == b.grad_scale && a.bias_correction == b.bias_correction &&
           a.amsgrad == b.amsgrad && a.torch_rounding == b.torch_rounding;
}

}  // namespace

Status Engine::update_states(const kernels::OptimizerParams& p) {
    if (overlap_ && overlap_->speculating()) {
        if (same_step(p, overlap_params_)) {
            TraceScope wait_span(trace_, "speculated step: finish", "optimizer", 3);
            Status s = overlap_->finish();
            wait_span.end();
            if (s.is_ok()) {
                auto* swapper = offload_->optimizer();
                optimizer_read_wait_seconds_ += swapper->last_step_stats().read_wait_seconds;
                s = swapper->commit_speculation();
                TraceScope publish_span(trace_, "speculated step: publish", "optimizer", 3);
                if (s.is_ok()) s = overlap_->publish(stream());
                return s;
            }
            // Abandoned (kBusy: the backward changed its pattern): step sequentially below.
            if (s.code() != StatusCode::kBusy) return s;
        } else {
            // Clipping (or a learning rate set since the backward began): the speculated
            // states are discarded and the step taken again from the intact ones.
            overlap_->abandon(engine::OverlapStep::Why::kClipping);
        }
    }
    Status s = states_->step(p, *optimizer_io_);
    optimizer_read_wait_seconds_ += states_->last_read_wait_seconds();
    return s;
}

Status Engine::step() {
    if (!backward_done_) return Status::invalid_argument("step: no backward since the last step");
    backward_done_ = false;
    last_step_ = StepReport{};
    last_step_.loss_scale = window_scale_;
    const bool boundary = (micro_steps_ + 1) % gradient_accumulation_steps() == 0;
    ++micro_steps_;
    global_samples_ +=
        train_micro_batch_size_per_gpu() * static_cast<std::uint64_t>(communicator_.world_size());
    if (!boundary) return Status::ok();
    last_step_.boundary = true;
    ZINF_TRY(coordinator_->reduce_gradients(stream()));
    ZINF_TRY(device_.synchronize(stream()));
    if (overlap_) overlap_->gradients_final();
    return run_optimizer(1.0 / (window_scale_ * communicator_.world_size()));
}

Status Engine::drop_io_only_params() {
    if (io_only_params_.size() == 0) return Status::ok();
    ZINF_TRY(coordinator_->take_staged_parameters());
    io_only_params_ = AlignedBuffer();
    return Status::ok();
}

void Engine::settle_overlap() {
    if (overlap_ && overlap_->speculating()) overlap_->abandon(engine::OverlapStep::Why::kFailed);
}

Status Engine::io_only_step() {
    settle_overlap();
    if (!offload_) return Status::ok();
    ZINF_TRY(check_usable());
    ZINF_ASSERT(!forward_done_);
    ZINF_ASSERT(!backward_done_);
    end_iteration_if_open();
    TraceScope span(trace_, "io-only step", "io", 1);
    const std::size_t eb = dtype_size_bytes(plan_.dtype);
    const std::size_t numel = coordinator_->domain().numel;
    const std::size_t chunk = states_->chunk_numel();
    auto chunk_bytes = [&](std::size_t k) {
        return std::span<std::byte>(io_only_params_.data() + k * chunk * eb,
                                    states_->chunk_length(k) * eb);
    };
    // The new parameters' write-back: the same values written back as a step writes them (a
    // step replaces whole slices without reading them: the values written here come from a host
    // copy read by the first call, the warm-up, not from reads in every pass).
    if (offload_->parameters() != nullptr && io_only_params_.size() < numel * eb) {
        ZINF_ASSIGN_OR_RETURN(io_only_params_,
                              AlignedBuffer::allocate(std::max<std::size_t>(numel * eb, 64)));
        for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
            ZINF_TRY(coordinator_->read_domain_parameters(k * chunk, chunk_bytes(k), stream()));
        }
    }
    const bool staged = offload_->parameters() != nullptr && overlap_ && overlap_enabled_;
    Status replayed;
    if (staged) {
        // The step beside backward stages the whole domain (OverlapStep::publish): the next
        // forward's reads copy it and write it behind, as the replay below does.
        replayed = coordinator_->write_domain_parameters(
            0, std::span<const std::byte>(io_only_params_.data(), numel * eb), stream(),
            /*staged=*/true);
    }
    // The parameters' reads of one step: the residency manager's recorded trace (one
    // accumulation window), replayed once.
    if (replayed.is_ok() && offload_->tiered_parameters() != nullptr) {
        replayed = offload_->tiered_parameters()->replay_trace();
    }
    // Whatever happened, nothing stays staged from io_only_params_.
    if (staged) {
        const Status taken = coordinator_->take_staged_parameters();
        if (replayed.is_ok()) replayed = taken;
    }
    ZINF_TRY(replayed);
    // The streamed gradients' writes, read-backs and optimizer reads of one window.
    if (gradient_swap_ != nullptr) {
        ZINF_TRY(gradient_swap_->io_only_pass(gradient_accumulation_steps()));
    }
    ZINF_TRY(states_->io_only_pass());
    if (offload_->parameters() != nullptr && !staged) {
        // The sequential step writes chunk by chunk (a slice cut by a chunk is read).
        for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
            ZINF_TRY(coordinator_->write_domain_parameters(k * chunk, chunk_bytes(k), stream()));
        }
    }
    return Status::ok();
}

// A forward without training over one batch (evaluation, prediction).
Status Engine::inference_forward(const Batch& batch) {
    ZINF_ASSERT(!forward_done_);
    ZINF_TRY(check_usable());
    ZINF_TRY(stage_batch(batch));
    const model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, false};
    return model_.forward(ctx, inputs_device_.data(), labels_device_.as<std::int32_t>(),
                          batch.rows);
}

Result<std::uint64_t> Engine::evaluate(const Batch& batch) {
    ZINF_ASSIGN_OR_RETURN(const BatchEvaluation e, evaluate_with_loss(batch));
    return e.correct;
}

Result<Engine::BatchEvaluation> Engine::evaluate_with_loss(const Batch& batch) {
    ZINF_TRY(inference_forward(batch));
    const model::Context ctx{compute_, *adapter_, *adapter_, stream(), micro_steps_, false};
    ZINF_TRY(model_.count_correct(ctx, correct_device_.as<std::uint64_t>(), false));
    BatchEvaluation e;
    ZINF_TRY(device_.copy_to_host(&e.correct, correct_device_.data(), sizeof e.correct, stream()));
    ZINF_ASSIGN_OR_RETURN(e.loss, model_.read_loss(stream()));  // synchronizes the stream
    ZINF_TRY(coordinator_->end_evaluation(stream()));
    return e;
}

Result<std::vector<float>> Engine::logits(const Batch& batch) {
    ZINF_TRY(inference_forward(batch));
    const model::BatchShape shape = model_.batch_shape();
    std::vector<float> out(batch.rows * shape.label_numel * shape.classes);
    const Status read = model_.read_logits(stream(), out);
    const Status ended = coordinator_->end_evaluation(stream());
    ZINF_TRY(read);
    ZINF_TRY(ended);
    return out;
}

Result<std::vector<std::int32_t>> Engine::predict(const Batch& batch) {
    ZINF_TRY(inference_forward(batch));
    std::vector<std::int32_t> predicted(batch.rows * model_.batch_shape().label_numel);
    ZINF_TRY(model_.read_predictions(stream(), predicted));
    ZINF_TRY(coordinator_->end_evaluation(stream()));
    return predicted;
}

}  // namespace zinf
