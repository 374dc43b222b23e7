// zinf::Engine: the public training API, in the shape of deepspeed.initialize's engine:
// forward(batch) returns the loss, backward(), step() (an optimizer step at each gradient
// accumulation boundary), save_checkpoint / load_checkpoint. It composes the ZeRO parameter
// coordinator (zero/), the model (src/model) and the CPU optimizer kernels (kernels/), with the
// optimizer states where offload_optimizer puts them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "src/base/aligned.h"
#include "src/base/compute.h"
#include "src/base/config.h"
#include "src/base/device.h"
#include "src/base/status.h"
#include "src/engine/checkpoint_files.h"
#include "src/engine/offload.h"
#include "src/engine/schedule.h"
#include "src/engine/trace.h"
#include "src/model/mlp.h"
#include "zero/communicator.h"
#include "zero/parameter_coordinator.h"

namespace zinf {

// One micro-batch in host memory: rows x features inputs and rows labels.
struct Batch {
    std::span<const float> inputs;
    std::span<const std::int32_t> labels;
    std::size_t rows = 0;
};

// What the last step() did.
struct StepReport {
    bool boundary = false;    // an optimizer step was due (else step() only counted)
    bool overflow = false;    // fp16: inf/NaN gradients, step skipped
    double grad_norm = 0.0;   // global norm of the unscaled gradients, before clipping
    double lr = 0.0;          // learning rate used
    double loss_scale = 1.0;  // scale in effect during this step's backward passes
    double optimizer_seconds = 0.0;
};

// Cumulative time per phase, for the summary and the overlap figures.
struct EngineTimes {
    double forward_seconds = 0.0;
    double backward_seconds = 0.0;
    double optimizer_seconds = 0.0;
    double checkpoint_seconds = 0.0;
};

// I/O of the offloaded states (parameters and optimizer on NVMe), cumulative since create.
struct IoFigures {
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
    // Compute blocked waiting for parameters plus the optimizer blocked waiting for reads.
    double stall_seconds = 0.0;
};

class Engine {
public:
    // Creates the engine for `model` (its parameters registered, built on `device`). device,
    // compute, model and communicator are borrowed and outlive the engine. Allocates every
    // buffer now: parameters and gradients on the device (per ZeRO stage), optimizer states per
    // offload_optimizer, host staging. Initialises the parameters from config.seed. Errors:
    // kInvalidArgument/kNotSupported for a config this build cannot run (naming the key),
    // kNoSpace from the device budget.
    static Result<std::unique_ptr<Engine>> create(const config::EngineConfig& config,
                                                  model::Mlp& model, Device& device,
                                                  Compute& compute,
                                                  zero::Communicator& communicator);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Training forward of one micro-batch (rows <= train_micro_batch_size_per_gpu); returns the
    // mean loss over its rows (unscaled). Blocks until the loss is on the host.
    Result<float> forward(const Batch& batch);
    // Backward of the last forward; accumulates gradients (scaled by loss_scale / accumulation).
    Status backward();
    // Counts the micro-step; at an accumulation boundary reduces gradients, checks overflow,
    // clips, runs the optimizer, advances the schedule. Errors: those of the optimizer, device
    // and communicator.
    Status step();

    // Evaluation: forward without training; returns the number of rows whose prediction
    // equals the label.
    Result<std::uint64_t> evaluate(const Batch& batch);

    // Writes every state to <dir>/<tag> atomically (see checkpoint_files.h).
    Status save_checkpoint(const std::string& dir, const std::string& tag);
    // Restores every state from <dir>/<tag>; the engine continues bitwise as the one that saved.
    // Errors: kNotFound, kCorruption (checksum, size, layout mismatch), kIo.
    Status load_checkpoint(const std::string& dir, const std::string& tag);

    // ---- batch arithmetic and counters (DeepSpeed's names) ---------------------------------
    std::uint64_t train_batch_size() const noexcept { return config_.batch.train_batch_size; }
    std::uint64_t train_micro_batch_size_per_gpu() const noexcept {
        return config_.batch.train_micro_batch_size_per_gpu;
    }
    std::uint64_t gradient_accumulation_steps() const noexcept {
        return config_.batch.gradient_accumulation_steps;
    }
    // Optimizer steps taken (including skipped ones), micro-steps seen, skipped steps.
    std::uint64_t global_steps() const noexcept { return global_steps_; }
    std::uint64_t micro_steps() const noexcept { return micro_steps_; }
    std::uint64_t skipped_steps() const noexcept { return skipped_steps_; }
    std::uint64_t global_samples() const noexcept { return global_samples_; }
    bool is_gradient_accumulation_boundary() const noexcept {
        return (micro_steps_ + 1) % gradient_accumulation_steps() == 0;
    }
    double loss_scale() const noexcept { return scaler_.scale(); }
    double current_lr() const noexcept;
    const StepReport& last_step() const noexcept { return last_step_; }
    const EngineTimes& times() const noexcept { return times_; }
    const config::EngineConfig& config() const noexcept { return config_; }
    const zero::ParameterCoordinator& coordinator() const noexcept { return *coordinator_; }

    // The I/O of one optimizer step without its compute (zinfinity-train --measure-overlap):
    // every micro-step's parameter reads along the recorded fetch trace, the optimizer states'
    // reads and writes, and the parameters' write-back, moving the same bytes in the same order
    // and leaving every state unchanged. Nothing to do without NVMe offload.
    Status io_only_step();

    // The start-up summary (also logged by create): optimizer and variant, stage, where each
    // state lives, budgets, bytes per tier.
    const std::string& summary() const noexcept { return summary_; }
    // Spans of forward, backward and optimizer steps go to `recorder` (borrowed; null: none).
    // Offloaded parameters' moves (demand and prefetch) are drawn there too.
    void set_trace(TraceRecorder* recorder) {
        trace_ = recorder;
        if (offload_) offload_->set_trace(recorder);
    }

    // fp32 values of the domain's master parameters (the optimizer's copy, read back from NVMe
    // when it lives there), for tests and tools. Errors: the swap store's read errors.
    Result<std::vector<float>> master_parameters();
    // I/O figures (zero without NVMe offload), the pinned host bytes the offload holds, and the
    // residency manager's one-line statistics (empty without parameters on NVMe).
    IoFigures io_figures() const;
    std::size_t pinned_bytes() const noexcept;
    std::string residency_summary() const;

private:
    class Adapter;
    class SwapGradients;
    struct StateBuffer {
        // Exactly one is used: device memory (offload none) or host memory (offload cpu).
        void* device = nullptr;
        AlignedBuffer host;
        std::size_t size_bytes = 0;
        std::byte* data() const noexcept;
    };

    Engine(const config::EngineConfig& config, model::Mlp& model, Device& device, Compute& compute,
           zero::Communicator& communicator, kernels::OptimizerKernel kernel);
    Status init_states();
    // Initial master values of domain elements [offset, offset + out.size()) (padding: zero).
    void initial_master(std::size_t offset, std::span<float> out) const;
    Status save_states(engine::CheckpointWriter& w);
    Status load_states(const engine::CheckpointReader& r);
    Status allocate_state(StateBuffer& buffer, std::size_t size_bytes, const char* what);
    Status optimizer_step(double grad_scale, double lr);
    Result<kernels::GradStats> gradient_stats();
    void build_summary();
    StreamId stream() const noexcept { return 0; }

    config::EngineConfig config_;
    model::Mlp& model_;
    Device& device_;
    Compute& compute_;
    zero::Communicator& communicator_;
    kernels::OptimizerKernel kernel_;
    kernels::OptimizerParams optimizer_params_;
    // Declared before the coordinator, which reads parameters through it: destroyed after.
    std::unique_ptr<engine::Offload> offload_;
    std::unique_ptr<zero::ParameterCoordinator> coordinator_;
    std::unique_ptr<Adapter> adapter_;
    engine::LossScaler scaler_;
    bool host_states_ = false;  // offload_optimizer: cpu
    bool nvme_states_ = false;  // offload_optimizer: nvme (states in offload_->optimizer())
    bool host_gradient_copy_ = false;  // gradients copied to host_grads_ for the CPU optimizer
    bool in_iteration_ = false;
    // A step or a checkpoint load failed part-way: the states may disagree with each other
    // (some sub-groups stepped, others not). forward/step/save refuse until a load succeeds.
    std::string broken_;
    Status check_usable() const;
    void end_iteration_if_open() noexcept;
    double optimizer_read_wait_seconds_ = 0.0;

    StateBuffer master_;
    StateBuffer exp_avg_;
    StateBuffer exp_avg_sq_;
    StateBuffer host_grads_;   // offload cpu: the gradients of one sub-group, host copy
    // 16-bit dtype with offloaded states or parameters: new 16-bit values of a sub-group.
    StateBuffer host_params_;
    std::size_t sub_group_numel_ = 0;

    // Device staging of one micro-batch.
    void* inputs_device_ = nullptr;
    void* labels_device_ = nullptr;
    void* correct_device_ = nullptr;
    std::size_t batch_rows_max_ = 0;

    std::uint64_t global_steps_ = 0;
    std::uint64_t micro_steps_ = 0;
    std::uint64_t skipped_steps_ = 0;
    std::uint64_t optimizer_updates_ = 0;  // steps applied (bias correction)
    std::uint64_t global_samples_ = 0;
    bool forward_done_ = false;
    bool backward_done_ = false;
    double window_scale_ = 1.0;  // the loss scale the current window's gradients carry
    StepReport last_step_;
    EngineTimes times_;
    std::string summary_;
    TraceRecorder* trace_ = nullptr;
};

}  // namespace zinf
