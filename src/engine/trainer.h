// Trainer: the training loop around an Engine — epochs of shuffled batches, gradient
// accumulation windows, the checkpoint cadence, evaluation after each epoch, and the figures
// (loss, throughput, I/O) — reported to a TrainerObserver, so that zinfinity-train is flag
// parsing and printing. Also evaluation and prediction from a checkpoint, and the overlap
// measurement (real vs I/O-only vs compute-only steps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/base/config.h"
#include "src/base/status.h"
#include "src/data/batcher.h"
#include "src/data/dataset.h"
#include "src/data/text.h"
#include "src/engine/csv_monitor.h"
#include "src/engine/engine.h"
#include "src/engine/stack.h"
#include "src/engine/trace.h"

namespace zinf {

// The datasets the `data` block names: train, and test (null: none; evaluation uses train).
// For text, test is the validation split, and the byte entropies of the training text are the
// figures a language model's validation loss is read against.
struct Datasets {
    std::unique_ptr<data::DataSource> train;
    std::unique_ptr<data::DataSource> test;
    std::optional<data::ByteEntropy> train_entropy;
    std::string description;  // "fortunes (/usr/share/games/fortunes): 2.5 MB, ..."
};
// Loads them (before the engine is built, so a missing dataset fails before anything large is
// allocated). Errors: the dataset's (kNotFound naming the path and the Debian package).
Result<Datasets> load_datasets(const config::EngineConfig& config);
// Checks them against the model's batch shape: kInvalidArgument naming model.layers (or
// model.seq_len, data.dataset) when the inputs, labels or classes disagree.
Status check_datasets(const Datasets& datasets, const model::BatchShape& shape);

struct TrainerOptions {
    std::uint64_t max_steps = 0;   // optimizer steps in total; 0: data.max_steps, then epochs
    std::string save_dir;          // empty: no checkpoints
    std::uint64_t save_every = 0;  // steps; 0: only at the end
    bool evaluate_each_epoch = true;
    std::uint64_t eval_every = 0;    // steps; 0: only after each epoch
    std::uint64_t eval_samples = 0;  // the first N evaluation samples, whole batches; 0: all
    TraceRecorder* trace = nullptr;  // borrowed; null: none
};

// One evaluation over the evaluation set.
struct EvaluationFigures {
    std::uint64_t epoch = 0;  // the epoch that ended, or the one in progress (eval_every)
    std::uint64_t step = 0;
    bool epoch_end = true;
    bool test = false;    // on the test (validation) set, not the training set
    double accuracy = 0;  // labels predicted right (next bytes for a language model)
    double loss = 0;      // mean loss per label (nats per byte for a language model)
    std::uint64_t labels = 0;
    std::uint64_t samples = 0;        // evaluated, over the ranks
    std::uint64_t samples_total = 0;  // in the evaluation set
};

// Figures of the last steps_per_print steps (or fewer at the end).
struct PrintFigures {
    std::uint64_t step = 0;
    float loss = 0;
    double mean_loss = 0;  // over the micro-steps since the last print
    double lr = 0;
    double grad_norm = 0;
    double loss_scale = 1;
    double samples_per_second = 0;
    IoFigures io;
    double read_gb_per_second = 0;  // since the last print
    double write_gb_per_second = 0;
    double data_seconds = 0;  // cumulative time spent gathering batches
};

// Figures of one optimizer step, reported after it, every step: the progress line's figures
// and what --plot and the csv_monitor draw from them.
struct StepFigures {
    std::uint64_t step = 0;  // optimizer steps taken, this one included
    std::uint64_t total_steps = 0;
    std::uint64_t global_samples = 0;  // samples of every rank, this step's included
    float loss = 0;                    // of the last micro-step (over the ranks)
    double lr = 0;                     // the learning rate this step used
    double next_lr = 0;                // the schedule's rate for the next step
    double loss_scale = 1;             // after this step (fp16 lowers it on overflow)
    bool overflow = false;             // fp16: skipped
    double samples_per_second = 0;     // since the run started
    IoFigures io;                      // cumulative
    double read_gb_per_second = 0;     // during this step
    double write_gb_per_second = 0;
};

struct TrainSummary {
    std::uint64_t steps_run = 0;
    std::uint64_t skipped_steps = 0;
    double seconds = 0;
    double samples_per_second = 0;
    float last_loss = 0;
    std::optional<double> accuracy;   // the last evaluation, if any ran
    std::optional<double> eval_loss;  // its mean loss per label
    bool accuracy_on_test = false;
    double data_seconds = 0;
};

// What the loop reports. Called on the training thread; the default does nothing.
class TrainerObserver {
public:
    virtual ~TrainerObserver() = default;
    // Every micro-step, with the engine's micro-step count after it.
    virtual Status on_micro_step(std::uint64_t /*micro_step*/, float /*loss*/) {
        return Status::ok();
    }
    // Every optimizer step (boundary), for a progress line.
    virtual void on_step(std::uint64_t /*step*/, std::uint64_t /*total_steps*/, float /*loss*/,
                         double /*samples_per_second*/) {}
    // Every optimizer step with all its figures; the default reports the ones above.
    virtual void on_step_figures(const StepFigures& f) {
        on_step(f.step, f.total_steps, f.loss, f.samples_per_second);
    }
    // Every steps_per_print steps.
    virtual void on_print(const PrintFigures& /*figures*/) {}
    virtual void on_evaluation(std::uint64_t /*epoch*/, double /*accuracy*/, bool /*test*/) {}
    // Every evaluation with all its figures; the default reports the accuracy above.
    virtual void on_evaluation_figures(const EvaluationFigures& f) {
        on_evaluation(f.epoch, f.accuracy, f.test);
    }
    virtual void on_checkpoint(const std::string& /*dir*/, const std::string& /*tag*/) {}
};

// Reports to two observers in turn (e.g. zinfinity-train's printer and its --plot recorder);
// on_micro_step returns the first's error, else the second's. Borrows both.
class ObserverPair final : public TrainerObserver {
public:
    ObserverPair(TrainerObserver& first, TrainerObserver& second) : a_(first), b_(second) {}
    Status on_micro_step(std::uint64_t micro_step, float loss) override;
    void on_step_figures(const StepFigures& f) override;
    void on_print(const PrintFigures& f) override;
    void on_evaluation_figures(const EvaluationFigures& f) override;
    void on_checkpoint(const std::string& dir, const std::string& tag) override;

private:
    TrainerObserver& a_;
    TrainerObserver& b_;
};

// One evaluated sample: its index in the evaluation set, its label and the prediction, and its
// inputs (features), for showing.
struct Prediction {
    std::uint32_t index = 0;
    std::int32_t label = 0;
    std::int32_t predicted = 0;
    std::vector<float> inputs;
};

// The three timings of --measure-overlap, seconds per step.
struct OverlapFigures {
    double real_seconds = 0;
    double io_only_seconds = 0;
    double compute_only_seconds = 0;
    // The compute-only pass: I/O operations it discarded, and the bytes the engine still read
    // or wrote during it (operations started before it, e.g. a prefetch; none on a quiet engine).
    std::uint64_t compute_only_ops_discarded = 0;
    std::uint64_t compute_only_bytes_moved = 0;
    // swap.overlap_step: the same steps with the step after backward (the sequential pass,
    // same run; 0 without it), and what the real pass's speculated steps became.
    double sequential_seconds = 0;
    engine::OverlapCounts overlap;
    double ratio() const noexcept {
        const double bound = std::max(io_only_seconds, compute_only_seconds);
        return bound > 0 ? real_seconds / bound : 0.0;
    }
};

class Trainer {
public:
    // Borrows the engine and the sources (they outlive the trainer); `eval` null: evaluate on
    // `train`. The config is the engine's; with csv_monitor.enabled, rank 0 creates its directory
    // here, before training. Errors: kInvalidArgument for an epoch shorter than one accumulation
    // window or a source too small for one batch; the csv_monitor directory's.
    static Result<Trainer> create(Engine& engine, const data::DataSource& train,
                                  const data::DataSource* eval, const TrainerOptions& options);
    Trainer(Trainer&&) noexcept;
    ~Trainer();

    std::uint64_t steps_per_epoch() const noexcept { return steps_per_epoch_; }
    // The step the run stops at: steps_per_epoch x data.epochs, capped by max_steps.
    std::uint64_t total_steps() const noexcept { return total_steps_; }

    // Trains from the engine's current step to total_steps(), evaluating after each epoch and
    // at the end (unless options say not to), saving checkpoints every save_every steps and at
    // the end. Errors: the engine's, the observer's, the checkpoints'.
    Result<TrainSummary> run(TrainerObserver& observer);
    // The fraction of the evaluation set predicted right.
    Result<double> evaluate();
    // Accuracy and mean loss over the evaluation set.
    Result<EvaluationFigures> evaluate_figures();
    // `count` samples of the evaluation set, drawn without replacement by `seed`, predicted.
    Result<std::vector<Prediction>> predict(std::size_t count, std::uint64_t seed);
    // Trains `steps` steps on, then times `steps` I/O-only steps (the same reads and writes, no
    // compute) and `steps` compute-only steps: the same engine, buffers and budgets with its I/O
    // discarded (Engine::set_io_discard), so that the measurement fits wherever training does.
    // Needs NVMe offload. Afterwards the engine refuses to go on until a checkpoint is loaded
    // (its states are the compute-only pass's).
    Result<OverlapFigures> measure_overlap(std::uint64_t steps);

private:
    Trainer(Engine& engine, const data::DataSource& train, const data::DataSource& eval,
            const TrainerOptions& options, data::Batcher batcher);
    Status train_steps(Engine& engine, data::Batcher& batcher, std::uint64_t steps);
    Status train_one(TrainerObserver& observer);
    Status after_step(TrainerObserver& observer);
    Status save(TrainerObserver& observer);
    Status evaluate_and_report(TrainerObserver& observer, std::uint64_t epoch, bool epoch_end);
    StepFigures step_figures(double samples_per_second);
    void report_print(TrainerObserver& observer, const StepFigures& step);

    Engine& engine_;
    const data::DataSource& train_;
    const data::DataSource& eval_;
    bool eval_is_test_ = false;
    TrainerOptions options_;
    data::Batcher batcher_;
    std::uint64_t steps_per_epoch_ = 0;
    std::uint64_t total_steps_ = 0;
    std::vector<float> inputs_;
    std::vector<std::int32_t> tokens_;
    std::vector<std::int32_t> labels_;

    // DeepSpeed's csv_monitor (rank 0, when enabled); null otherwise.
    std::unique_ptr<CsvMonitor> csv_monitor_;
    // Figures of the current run.
    struct RunState;
    std::unique_ptr<RunState> run_;
};

}  // namespace zinf
