// zinf::Engine: the public training API, in the shape of deepspeed.initialize's engine:
// forward(batch) returns the loss, backward(), step() (an optimizer step at each gradient
// accumulation boundary), save_checkpoint / load_checkpoint. It trains any model::Model: it
// computes an engine::OffloadPlan once, then composes the ZeRO parameter coordinator (zero/),
// the model (src/model), the CPU optimizer kernels (kernels/) and an engine::StateStore that
// holds the optimizer states where the plan puts them, with one code path for every placement.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "io/file_system.h"
#include "kernels/optimizer.h"
#include "src/base/compute.h"
#include "src/base/config.h"
#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/base/status.h"
#include "src/engine/checkpoint_files.h"
#include "src/engine/gradient_swap.h"
#include "src/engine/memory_prediction.h"
#include "src/engine/offload.h"
#include "src/engine/offload_plan.h"
#include "src/engine/overlap_step.h"
#include "src/engine/schedule.h"
#include "src/engine/state_store.h"
#include "src/engine/trace.h"
#include "src/model/model.h"
#include "zero/communicator.h"
#include "zero/parameter_coordinator.h"

namespace zinf {

// One micro-batch in host memory, shaped as the model's batch_shape() says: rows x input_numel
// float `inputs` (or int32 `tokens` for a model of token ids) and rows x label_numel labels.
struct Batch {
    Batch() = default;
    Batch(std::span<const float> inputs_, std::span<const std::int32_t> labels_,
          std::size_t rows_) noexcept
        : inputs(inputs_), labels(labels_), rows(rows_) {}
    static Batch of_tokens(std::span<const std::int32_t> tokens,
                           std::span<const std::int32_t> labels, std::size_t rows) noexcept {
        Batch b;
        b.tokens = tokens;
        b.labels = labels;
        b.rows = rows;
        return b;
    }

    std::span<const float> inputs;
    std::span<const std::int32_t> labels;
    std::size_t rows = 0;
    std::span<const std::int32_t> tokens;
};

// What an embedding program or a test may change besides the config.
struct EngineOptions {
    // Where checkpoints and swap files are opened, synced and renamed (borrowed; outlives the
    // engine). Null: the operating system's. A FaultyFileSystem here injects file faults.
    io::FileSystem* file_system = nullptr;
    // When set, the swap I/O engine's backends are wrapped in a FaultyBackend (io::FaultPlan).
    std::optional<io::FaultPlan> io_faults;
    // Admission (engine::admit): a config whose predicted memory exceeds a budget is refused
    // before anything is created. false skips it, leaving the runtime checks alone (tests of
    // those checks).
    bool admission = true;
    // Called after each gradient reached the coordinator (tests: a backward slowed this way lets
    // a step beside it run ahead of the gradients, which swap.overlap_step must not).
    std::function<void(std::size_t parameter)> after_gradient;
    // swap.overlap_step speculates in every window, also after a step that clipped or
    // overflowed (tests: more redone and skipped speculations than the default policy gives).
    bool speculate_every_window = false;
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
    double checkpoint_seconds = 0.0;  // training stopped for checkpoints
    // swap.background_checkpoint: the optimizer states' copies, on their own thread, and the
    // time steps waited for a part of a snapshot still being copied.
    double checkpoint_background_seconds = 0.0;
    double checkpoint_wait_seconds = 0.0;
};

// I/O of the offloaded states (parameters and optimizer on NVMe), cumulative since create.
struct IoFigures {
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
    // Compute blocked waiting for parameters plus the optimizer blocked waiting for reads.
    double stall_seconds = 0.0;
    // Faults injected into the swap I/O (EngineOptions::io_faults); 0 without a plan.
    std::uint64_t faults_injected = 0;
};

// One rank's model states by the ZeRO accounting beside the seed's formulas for its stage and
// world size (Ψ = model_numel, b = bytes per parameter element, K = optimizer bytes per element:
// the fp32 master and each moment as stored, 12 for Adam in fp32, 8 in bf16, about 6 in int8):
// parameters b·Ψ, or b·Ψ/N under stage 3; gradients b·Ψ, or b·Ψ/N under stages 2-3; optimizer
// states K·Ψ, or K·Ψ/N under stages 1-3. Held figures count the padded layout, so they exceed the
// formula by at most the padding.
struct MemoryAccount {
    int stage = 0;
    int world_size = 1;
    std::size_t model_numel = 0;
    std::size_t padding_numel = 0;  // padded layout minus model_numel (all ranks together)
    std::size_t b = 4;
    double k = 12;
    zero::MemoryHeld held;
    std::size_t optimizer_states = 0;
    double formula_parameters = 0;
    double formula_gradients = 0;
    double formula_states = 0;
};

class Engine {
public:
    // Creates the engine for `model` (its parameters registered, built on `device`). device,
    // compute, model and communicator are borrowed and outlive the engine. Plans every state's
    // place and size (engine::make_offload_plan), then allocates every buffer: parameters and
    // gradients on the device (per ZeRO stage), optimizer states in the plan's StateStore, host
    // staging. Initialises the parameters from config.seed. Errors: kInvalidArgument /
    // kNotSupported for a config this build cannot run (naming the key), kNoSpace from the
    // device budget.
    static Result<std::unique_ptr<Engine>> create(const config::EngineConfig& config,
                                                  model::Model& model, Device& device,
                                                  Compute& compute,
                                                  zero::Communicator& communicator,
                                                  const EngineOptions& options = {});
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

    // ---- a model driven from outside (model::ExternalModel: the PyTorch front end) ----------
    // The driver runs each pass itself between these calls, fetching and releasing parameters
    // through parameter_source() and handing each parameter's gradient to gradient_sink():
    //   begin_forward(true)  ... its forward ...  end_forward(ok)      (one or more per micro-step)
    //   begin_backward()     ... its backward ... end_backward(ok)
    //   step()
    // An evaluation forward is begin_forward(false) ... end_forward(ok), without a backward.
    // A pass that failed (ok false) ends the iteration as a failed forward or backward does.
    // Errors: kInvalidArgument for a call out of order (naming it), those of check_usable.
    Status begin_forward(bool training);
    Status end_forward(bool ok);
    // Returns the factor the driver multiplies its loss's gradient by: the loss scale of this
    // accumulation window over gradient_accumulation_steps().
    Result<double> begin_backward();
    Status end_backward(bool ok);
    model::ParameterSource& parameter_source() noexcept;
    model::GradientSink& gradient_sink() noexcept;
    // Files an embedding program adds to its checkpoints (the front end's client_state, module
    // buffers, scheduler state): save_checkpoint writes each (rank 0, listed and checksummed in
    // the checkpoint's manifest as "extra.<name>") until they are set again.
    void set_checkpoint_extras(std::vector<std::pair<std::string, std::string>> extras) {
        checkpoint_extras_ = std::move(extras);
    }
    // The extra file `name` of checkpoint <dir>/<tag>, verified. kNotFound when it has none.
    Result<std::string> read_checkpoint_extra(const std::string& dir, const std::string& tag,
                                              const std::string& name) const;

    // Evaluation: forward without training; returns the number of labels the prediction
    // matches.
    Result<std::uint64_t> evaluate(const Batch& batch);
    // The same, with the batch's mean loss over its labels (nats per label).
    struct BatchEvaluation {
        std::uint64_t correct = 0;
        float loss = 0;
    };
    Result<BatchEvaluation> evaluate_with_loss(const Batch& batch);
    // Forward without training; the logits (rows x label_numel x classes), for sampling from a
    // language model. kNotSupported when the model does not expose them.
    Result<std::vector<float>> logits(const Batch& batch);
    // Forward without training; the predicted label of each row (rows x label_numel).
    Result<std::vector<std::int32_t>> predict(const Batch& batch);

    // Writes every state to <dir>/<tag> atomically (see checkpoint_files.h). With several ranks
    // (a collective: every rank calls it) each writes its shard <dir>/<tag>/rank<r>, and the
    // checkpoint appears, with `latest` naming it, only once every shard is written.
    // With swap.background_checkpoint (one rank, optimizer states on NVMe) it writes the rest,
    // pins the states and returns; a thread copies the states from the snapshot while training
    // goes on, and the checkpoint appears (and `latest` names it) once that copy is complete.
    Status save_checkpoint(const std::string& dir, const std::string& tag);
    // Waits for a checkpoint still being written in the background and returns how it ended
    // (ok when none). save_checkpoint, load_checkpoint and the destructor wait first.
    Status wait_checkpoint();
    bool checkpoint_in_progress() const noexcept { return background_ != nullptr; }
    // Restores every state from <dir>/<tag>; the engine continues bitwise as the one that saved.
    // A checkpoint of another world size or ZeRO stage is re-partitioned: each rank reads every
    // shard it needs (whole, so that every checksum is verified) and takes its elements.
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
    // A learning rate set by the embedding program (a torch LR scheduler the PyTorch front end
    // was given) in place of the config's schedule, from the next step on; nullopt: the config's.
    void set_lr_override(std::optional<double> lr) noexcept { lr_override_ = lr; }
    const StepReport& last_step() const noexcept { return last_step_; }
    const EngineTimes& times() const noexcept { return times_; }
    const config::EngineConfig& config() const noexcept { return config_; }
    const engine::OffloadPlan& plan() const noexcept { return plan_; }
    // The memory predicted at create, which admission checked against the budgets.
    const engine::MemoryPrediction& memory_prediction() const noexcept { return prediction_; }
    const zero::ParameterCoordinator& coordinator() const noexcept { return *coordinator_; }
    // The streamed gradients (plan().gradients on NVMe); null otherwise.
    const engine::GradientSwap* gradient_swap() const noexcept { return gradient_swap_.get(); }
    const model::Model& model() const noexcept { return model_; }
    // The data-parallel world: this rank and the communicator every rank shares (host-side
    // agreements such as the mean loss go through zero::sum_over_ranks on it).
    int rank() const noexcept { return communicator_.rank(); }
    int world_size() const noexcept { return communicator_.world_size(); }
    zero::Communicator& communicator() const noexcept { return communicator_; }

    // The I/O of one optimizer step without its compute (zinfinity-train --measure-overlap):
    // every micro-step's parameter reads along the recorded fetch trace, the streamed gradients'
    // writes and reads (GradientSwap::io_only_pass), the optimizer states' reads and writes, and
    // the parameters' write-back, leaving every state unchanged. Kept activations on NVMe are
    // left out (a model's own store). Nothing to do without NVMe offload. With offloaded
    // parameters the first call reads the domain's parameters into a host copy (held until
    // set_io_discard), which later calls write back as a step does, without reading them.
    Status io_only_step();

    // Turns io::Engine::set_discard on or off for every I/O the engine and its model do, so
    // that steps run their compute, copies and bookkeeping with no I/O (the compute-only pass
    // of zinfinity-train --measure-overlap, within the same budgets as training). Reads then
    // leave stale bytes and writes are dropped: from the moment it is turned on, the states are
    // no longer the trained ones, so once it is turned off again the engine refuses to go on
    // (as after a failed step) until load_checkpoint succeeds. forward/backward/step work
    // while it is on (their results mean nothing); save_checkpoint refuses.
    // A checkpoint being copied in the background completes first (its error is returned).
    Status set_io_discard(bool on);
    bool io_discarding() const noexcept { return io_discard_; }
    // Operations completed without I/O while discarding, since create.
    std::uint64_t io_ops_discarded() const;

    // This rank's states against the seed's formulas.
    MemoryAccount memory_account() const;
    // The start-up summary (also logged by create): optimizer and variant, stage, where each
    // state lives, budgets, bytes per tier, and every rank's memory account (gathered: with
    // several ranks, create is a collective).
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
    // swap.overlap_step: speculated steps committed, redone, skipped and abandoned (null
    // without it), and whether it is on.
    const engine::OverlapCounts* overlap_counts() const noexcept {
        return overlap_ ? &overlap_->counts() : nullptr;
    }
    // Turns the step beside backward off (true: back on) from the next window, for the
    // sequential pass of zinfinity-train --measure-overlap. No effect without swap.overlap_step.
    void set_overlap_step(bool on) noexcept { overlap_enabled_ = on; }

private:
    class Adapter;

    static Result<std::unique_ptr<Engine>> create_for_rank(const config::EngineConfig& config,
                                                           model::Model& model, Device& device,
                                                           Compute& compute,
                                                           zero::Communicator& communicator,
                                                           const EngineOptions& options);
    Engine(const config::EngineConfig& config, engine::OffloadPlan plan, model::Model& model,
           Device& device, Compute& compute, zero::Communicator& communicator,
           kernels::OptimizerKernel kernel, const EngineOptions& options);
    Status build(const zero::Partitioning& part);
    Status init_states();
    // Initial master values of domain elements [offset, offset + out.size()) (padding: zero).
    void initial_master(std::size_t offset, std::span<float> out) const;
    // Checkpoints (engine_checkpoint.cc).
    Status save_states(engine::CheckpointWriter& w);
    Status save_state_files(
        engine::CheckpointWriter& w,
        const std::function<Status(std::size_t, const engine::StateChunk&)>& read,
        bool parameters_from_master) const;
    Status save_parameters(engine::CheckpointWriter& w);
    // A checkpoint whose optimizer states a thread of its own copies from a pinned snapshot
    // while training goes on (swap.background_checkpoint). The writer commits (manifest, fsync,
    // rename, `latest`) only once every file is written: until then the previous checkpoint is
    // the latest one, and a crash leaves it intact.
    struct BackgroundCheckpoint {
        engine::CheckpointWriter writer;
        std::string name;  // <dir>/<tag>
        std::uint64_t step = 0;
        std::thread thread;
        Status status;  // the thread's, read after join
        double copy_seconds = 0.0;
        BackgroundCheckpoint(engine::CheckpointWriter w, std::string n, std::uint64_t s)
            : writer(std::move(w)), name(std::move(n)), step(s) {}
    };
    bool background_checkpoints() const noexcept;
    Status start_background_save(const std::string& dir, const std::string& tag);
    void describe_states(engine::CheckpointWriter& w) const;
    Status save_sharded(const std::string& dir, const std::string& tag);
    // save_sharded's steps: rank 0 opens the checkpoint, every rank saves its shard, rank 0
    // finds every shard and commits.
    Status open_sharded_save(const std::string& dir, const std::string& tag,
                             std::optional<engine::CheckpointWriter>& top, std::span<char> shared);
    Status save_shard(const std::string& shard_dir, const std::string& nonce);
    Status commit_sharded_save(engine::CheckpointWriter& top, const std::string& dir,
                               const std::string& tag, const std::string& temp,
                               const std::string& nonce);
    Status find_shards(const std::string& dir, const std::string& tag, const std::string& temp,
                       const std::string& nonce) const;
    // How a checkpoint's states were laid out: its manifest's world_size, zero_stage,
    // partition_align and state_dtype (the last two absent before compressed states: 16, fp32).
    struct SavedShape {
        int world = 1;
        int stage = 0;
        std::size_t align_numel = zero::Partitioning::kAlignNumel;
        StateDType state_dtype = StateDType::kFp32;
    };
    bool same_layout(const SavedShape& saved) const noexcept;
    Status load_states(const engine::CheckpointReader& r, const SavedShape& saved);
    Status load_repartitioned(const std::vector<engine::CheckpointReader>& shards,
                              const SavedShape& shape);
    Result<std::vector<engine::CheckpointReader>> open_shards(const std::string& dir,
                                                              const std::string& tag,
                                                              SavedShape& saved) const;
    Status check_loadable(const engine::CheckpointReader& r, bool same) const;
    Status restore_counters(const engine::CheckpointReader& r);
    Status stage_batch(const Batch& batch);
    // What every training forward does before the model's: the accumulation window and the
    // residency iteration open; and what every backward does after it.
    Status open_training_forward();
    Status close_backward();
    Status write_checkpoint_extras(engine::CheckpointWriter& w) const;
    Status inference_forward(const Batch& batch);
    Status run_optimizer(double norm_unscale);
    // The step's optimizer parameters (this step's number, learning rate and momentum) with
    // gradients multiplied by grad_scale.
    kernels::OptimizerParams step_params(double grad_scale) const;
    // One gradient slice's part of the norm (gradient_stats; the step beside backward's thread
    // calls it too, for one rank's slices in host memory).
    engine::NormPartial slice_partial(const std::byte* grads, std::size_t offset_numel,
                                      std::size_t numel) const;
    // The window's last forward begins: the speculated step starts, reading states beside the
    // forward and stepping beside the backward (swap.overlap_step).
    void begin_overlap();
    // The optimizer's state update of a boundary step: the speculated one committed where it
    // stands, else the store's step with `p`.
    Status update_states(const kernels::OptimizerParams& p);
    // A speculated step whose window's step never came (it failed before the states were
    // updated) is forgotten before anything else reads or writes the states.
    void settle_overlap();
    Result<kernels::GradStats> gradient_stats();
    Status build_summary();
    Result<std::string> memory_table() const;
    Status check_usable() const;
    void end_iteration_if_open() noexcept;
    io::FileSystem& file_system() const noexcept;
    StreamId stream() const noexcept { return 0; }

    config::EngineConfig config_;
    engine::OffloadPlan plan_;
    engine::MemoryPrediction prediction_;
    model::Model& model_;
    Device& device_;
    Compute& compute_;
    zero::Communicator& communicator_;
    kernels::OptimizerKernel kernel_;
    EngineOptions options_;
    // Declared before the coordinator, which reads parameters through it: destroyed after.
    std::unique_ptr<engine::Offload> offload_;
    // Streamed gradients (plan gradients on NVMe): the coordinator stores into it, so it is
    // declared (and outlives) before the coordinator, after the store it writes to.
    std::unique_ptr<engine::GradientSwap> gradient_swap_;
    std::unique_ptr<zero::ParameterCoordinator> coordinator_;
    std::unique_ptr<Adapter> adapter_;
    std::unique_ptr<engine::StateStore> states_;
    std::unique_ptr<engine::OptimizerIo> optimizer_io_;
    // swap.overlap_step where the plan allows it: the step beside the window's last backward.
    std::unique_ptr<engine::OverlapStep> overlap_;
    kernels::OptimizerParams overlap_params_;  // what the speculated step was taken with
    engine::LossScaler scaler_;
    bool in_iteration_ = false;
    // A step or a checkpoint load failed part-way: the states may disagree with each other
    // (some sub-groups stepped, others not). forward/step/save refuse until a load succeeds.
    std::string broken_;
    bool io_discard_ = false;       // set_io_discard
    AlignedBuffer io_only_params_;  // io_only_step: the domain's parameters, host copy
    // Frees io_only_params_ once no parameter is staged from it (takes every staged one first).
    Status drop_io_only_params();
    bool overlap_enabled_ = true;     // set_overlap_step
    bool overlap_last_stood_ = true;  // the last step needed no clipping and had no overflow
    double optimizer_read_wait_seconds_ = 0.0;
    std::vector<double> norm_partials_;  // gradient_stats' partial sums

    // Device staging of one micro-batch.
    DeviceBuffer inputs_device_;
    DeviceBuffer labels_device_;
    DeviceBuffer correct_device_;
    std::size_t batch_rows_max_ = 0;
    std::size_t rows_staged_ = 0;

    std::uint64_t global_steps_ = 0;
    std::uint64_t micro_steps_ = 0;
    std::uint64_t skipped_steps_ = 0;
    std::uint64_t optimizer_updates_ = 0;  // steps applied (bias correction)
    std::uint64_t global_samples_ = 0;
    bool forward_done_ = false;
    bool backward_done_ = false;
    double window_scale_ = 1.0;  // the loss scale the current window's gradients carry
    // Driven passes (begin_forward ... end_backward): whether the open one trains, and since when.
    bool driven_training_ = false;
    bool driven_open_ = false;
    std::chrono::steady_clock::time_point driven_started_;
    std::vector<std::pair<std::string, std::string>> checkpoint_extras_;
    std::optional<double> lr_override_;
    StepReport last_step_;
    EngineTimes times_;
    std::string summary_;
    TraceRecorder* trace_ = nullptr;
    // Last, so that it is joined (in ~Engine) while everything it reads still exists.
    std::unique_ptr<BackgroundCheckpoint> background_;
};

}  // namespace zinf
