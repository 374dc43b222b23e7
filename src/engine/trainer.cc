// Trainer: the loop, its cadences and figures; evaluation, prediction, overlap measurement.
#include "src/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// Host buffers for batches of up to `rows` samples of `source`: fp32 inputs or int32 tokens,
// and labels.
struct HostBatch {
    std::vector<float> inputs;
    std::vector<std::int32_t> tokens;
    std::vector<std::int32_t> labels;
};

void size_for(const data::DataSource& source, std::size_t rows, std::vector<float>& inputs,
              std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& labels) {
    (source.token_inputs() ? tokens.resize(rows * source.features())
                           : inputs.resize(rows * source.features()));
    labels.resize(rows * source.label_numel());
}

HostBatch host_batch(const data::DataSource& source, std::size_t rows) {
    HostBatch b;
    size_for(source, rows, b.inputs, b.tokens, b.labels);
    return b;
}

// The Batch over the first `rows` samples of the buffers.
Batch batch_of(const data::DataSource& source, std::span<const float> inputs,
               std::span<const std::int32_t> tokens, std::span<const std::int32_t> labels,
               std::size_t rows) {
    const std::size_t n = rows * source.features();
    const auto y = labels.first(rows * source.label_numel());
    if (source.token_inputs()) return Batch::of_tokens(tokens.first(n), y, rows);
    return Batch(inputs.first(n), y, rows);
}
Batch batch_of(const data::DataSource& source, const HostBatch& b, std::size_t rows) {
    return batch_of(source, b.inputs, b.tokens, b.labels, rows);
}

std::size_t fill(const data::Batcher& batcher, const data::DataSource& source, std::size_t index,
                 std::vector<float>& inputs, std::vector<std::int32_t>& tokens,
                 std::vector<std::int32_t>& labels) {
    return source.token_inputs() ? batcher.fill_tokens(index, tokens, labels)
                                 : batcher.fill(index, inputs, labels);
}
std::size_t fill(const data::Batcher& batcher, const data::DataSource& source, std::size_t index,
                 HostBatch& b) {
    return fill(batcher, source, index, b.inputs, b.tokens, b.labels);
}

void gather(const data::DataSource& source, std::span<const std::uint32_t> indices, HostBatch& b) {
    const std::size_t n = indices.size();
    const auto y = std::span<std::int32_t>(b.labels).first(n * source.label_numel());
    if (source.token_inputs()) {
        source.gather_tokens(indices,
                             std::span<std::int32_t>(b.tokens).first(n * source.features()), y);
    } else {
        source.gather(indices, std::span<float>(b.inputs).first(n * source.features()), y);
    }
}

}  // namespace

Result<Datasets> load_datasets(const config::EngineConfig& c) {
    Datasets d;
    if (c.data.dataset == "fashion-mnist") {
        data::FashionMnistOptions o;
        o.directory = c.data.path;
        o.split = data::Split::kTrain;
        ZINF_ASSIGN_OR_RETURN(d.train, data::load_fashion_mnist(o));
        o.split = data::Split::kTest;
        ZINF_ASSIGN_OR_RETURN(d.test, data::load_fashion_mnist(o));
    } else if (c.data.dataset == "text") {
        data::TextOptions o;
        o.path = c.data.path;
        o.seq_len = c.model.seq_len;
        ZINF_ASSIGN_OR_RETURN(data::TextSplit split, data::load_text(o));
        d.train_entropy = split.train->entropy();
        d.description = str_cat(
            "text ", split.path, ": ", format_bytes(split.corpus_bytes), ", ", split.train->count(),
            " training and ", split.validation->count(), " validation windows of ", o.seq_len,
            " + 1 bytes; training text entropy: unigram ", d.train_entropy->unigram_nats,
            ", bigram (next byte given this one) ", d.train_entropy->bigram_nats, " nats/byte");
        d.train = std::move(split.train);
        d.test = std::move(split.validation);
    } else {
        data::SyntheticOptions o;
        o.count = c.data.synthetic_samples;
        o.features = c.model.layers.front();
        o.classes = c.model.layers.back();
        o.seed = c.seed;
        ZINF_ASSIGN_OR_RETURN(d.train, data::SyntheticDataset::create(o));
    }
    return d;
}

Status check_datasets(const Datasets& d, const model::BatchShape& shape) {
    const bool model_tokens = shape.input_kind == model::InputKind::kInt32;
    if (d.train->token_inputs() != model_tokens) {
        return Status::invalid_argument(str_cat(
            "data.dataset: the model takes ", model_tokens ? "token ids" : "fp32 features",
            " but the dataset gives ", d.train->token_inputs() ? "token ids" : "fp32 features",
            model_tokens ? " (use data.dataset \"text\" with model.type \"gpt\")"
                         : " (use model.type \"gpt\" with data.dataset \"text\")"));
    }
    if (model_tokens) {
        if (d.train->features() != shape.input_numel ||
            d.train->label_numel() != shape.label_numel) {
            return Status::invalid_argument(str_cat("model.seq_len: ", shape.input_numel,
                                                    " but the dataset's windows hold ",
                                                    d.train->features(), " tokens"));
        }
        if (d.train->classes() != shape.classes) {
            return Status::invalid_argument(str_cat("data.dataset: ", d.train->classes(),
                                                    " token values but the model's vocabulary "
                                                    "has ",
                                                    shape.classes));
        }
        return Status::ok();
    }
    if (d.train->features() != shape.input_numel) {
        return Status::invalid_argument(str_cat("model.layers[0]: ", shape.input_numel,
                                                " but the dataset has ", d.train->features(),
                                                " features"));
    }
    if (d.train->classes() != shape.classes) {
        return Status::invalid_argument(str_cat("model.layers[-1]: ", shape.classes,
                                                " but the dataset has ", d.train->classes(),
                                                " classes"));
    }
    return Status::ok();
}

// The figures of one run(), between prints.
struct Trainer::RunState {
    Clock::time_point start = Clock::now();
    Clock::time_point last_print = Clock::now();
    std::uint64_t start_step = 0;
    std::uint64_t start_samples = 0;
    IoFigures last_io;
    Clock::time_point last_step = Clock::now();
    IoFigures last_step_io;
    double loss_sum = 0;
    std::uint64_t loss_count = 0;
    float last_loss = 0;
    double data_seconds = 0;
    std::optional<double> accuracy;
    std::optional<double> eval_loss;
    std::uint64_t eval_step = 0;  // the step of the last evaluation
};

Trainer::Trainer(Engine& engine, const data::DataSource& train, const data::DataSource& eval,
                 const TrainerOptions& options, data::Batcher batcher)
    : engine_(engine),
      train_(train),
      eval_(eval),
      options_(options),
      batcher_(std::move(batcher)) {}

Trainer::Trainer(Trainer&&) noexcept = default;
Trainer::~Trainer() = default;

Result<Trainer> Trainer::create(Engine& engine, const data::DataSource& train,
                                const data::DataSource* eval, const TrainerOptions& options) {
    const config::EngineConfig& config = engine.config();
    data::BatcherOptions bo;
    bo.batch_rows = config.batch.train_micro_batch_size_per_gpu;
    bo.shuffle = config.data.shuffle;
    bo.seed = config.seed;
    // Every rank draws the same order; rank r takes rows [r x micro, (r + 1) x micro) of each
    // global micro-batch.
    bo.shard_count = static_cast<std::size_t>(engine.world_size());
    bo.shard_index = static_cast<std::size_t>(engine.rank());
    ZINF_ASSIGN_OR_RETURN(auto batcher, data::Batcher::create(train, bo));
    Trainer t(engine, train, eval != nullptr ? *eval : train, options, std::move(batcher));
    t.eval_is_test_ = eval != nullptr;
    const std::uint64_t gas = config.batch.gradient_accumulation_steps;
    t.steps_per_epoch_ = t.batcher_.batches_per_epoch() / gas;
    if (t.steps_per_epoch_ == 0) {
        return Status::invalid_argument(
            str_cat("gradient_accumulation_steps: ", gas, " is more than the ",
                    t.batcher_.batches_per_epoch(), " micro-batches of an epoch"));
    }
    t.total_steps_ = t.steps_per_epoch_ * config.data.epochs;
    const std::uint64_t max_steps =
        options.max_steps != 0 ? options.max_steps : config.data.max_steps;
    if (max_steps != 0) t.total_steps_ = std::min(t.total_steps_, max_steps);
    size_for(train, bo.batch_rows, t.inputs_, t.tokens_, t.labels_);
    if (config.csv_monitor.enabled && engine.rank() == 0) {
        ZINF_ASSIGN_OR_RETURN(t.csv_monitor_,
                              CsvMonitor::create(config.csv_monitor, config.batch.train_batch_size,
                                                 gas, config.fp16.enabled));
    }
    return t;
}

// One micro-step on the next batch of the epoch the engine's micro-step count is in (so a
// resumed run continues the same data order).
Status Trainer::train_one(TrainerObserver& observer) {
    const std::uint64_t gas = engine_.gradient_accumulation_steps();
    const std::uint64_t micro = engine_.micro_steps();
    const std::uint64_t epoch = micro / (steps_per_epoch_ * gas);
    const std::uint64_t index = micro % (steps_per_epoch_ * gas);
    if (batcher_.epoch() != epoch || micro == 0) batcher_.start_epoch(epoch);
    const auto t0 = Clock::now();
    const std::size_t n = fill(batcher_, train_, index, inputs_, tokens_, labels_);
    if (options_.trace != nullptr) options_.trace->span("load batch", "data", t0, Clock::now(), 4);
    run_->data_seconds += seconds_since(t0);
    ZINF_ASSIGN_OR_RETURN(const float rank_loss,
                          engine_.forward(batch_of(train_, inputs_, tokens_, labels_, n)));
    ZINF_TRY(engine_.backward().with_context("backward"));
    ZINF_TRY(engine_.step().with_context("step"));
    // The loss of the global micro-batch: the mean of the ranks' (equal-sized) losses.
    float loss = rank_loss;
    if (engine_.world_size() > 1) {
        double sum = rank_loss;
        ZINF_TRY(zero::sum_over_ranks(engine_.communicator(), std::span<double>(&sum, 1)));
        loss = static_cast<float>(sum / engine_.world_size());
    }
    run_->last_loss = loss;
    run_->loss_sum += loss;
    ++run_->loss_count;
    if (csv_monitor_) csv_monitor_->add_micro_loss(loss);
    return observer.on_micro_step(engine_.micro_steps(), loss);
}

// The figures of the step just taken; the per-step I/O rates since the previous step.
StepFigures Trainer::step_figures(double samples_per_second) {
    StepFigures f;
    f.step = engine_.global_steps();
    f.total_steps = total_steps_;
    f.global_samples = engine_.global_samples();
    f.loss = run_->last_loss;
    f.lr = engine_.last_step().lr;
    f.next_lr = engine_.current_lr();
    f.loss_scale = engine_.loss_scale();
    f.overflow = engine_.last_step().overflow;
    f.samples_per_second = samples_per_second;
    f.io = engine_.io_figures();
    const double interval = std::max(1e-9, seconds_since(run_->last_step));
    f.read_gb_per_second =
        static_cast<double>(f.io.bytes_read - run_->last_step_io.bytes_read) / 1e9 / interval;
    f.write_gb_per_second =
        static_cast<double>(f.io.bytes_written - run_->last_step_io.bytes_written) / 1e9 / interval;
    run_->last_step = Clock::now();
    run_->last_step_io = f.io;
    return f;
}

// Every steps_per_print steps: the figures since the last print.
void Trainer::report_print(TrainerObserver& observer, const StepFigures& step) {
    const double interval = std::max(1e-9, seconds_since(run_->last_print));
    PrintFigures f;
    f.step = step.step;
    f.loss = step.loss;
    f.mean_loss = run_->loss_sum / static_cast<double>(run_->loss_count);
    f.lr = step.lr;
    f.grad_norm = engine_.last_step().grad_norm;
    f.loss_scale = step.loss_scale;
    f.samples_per_second = step.samples_per_second;
    f.io = step.io;
    f.read_gb_per_second =
        static_cast<double>(f.io.bytes_read - run_->last_io.bytes_read) / 1e9 / interval;
    f.write_gb_per_second =
        static_cast<double>(f.io.bytes_written - run_->last_io.bytes_written) / 1e9 / interval;
    f.data_seconds = run_->data_seconds;
    observer.on_print(f);
    run_->last_io = f.io;
    run_->last_print = Clock::now();
    run_->loss_sum = 0;
    run_->loss_count = 0;
}

// After an optimizer step: progress, the csv_monitor's rows, the periodic print, the checkpoint
// and epoch cadences.
Status Trainer::after_step(TrainerObserver& observer) {
    const std::uint64_t step = engine_.global_steps();
    const double elapsed = seconds_since(run_->start);
    const double samples_per_s =
        static_cast<double>(engine_.global_samples() - run_->start_samples) / elapsed;
    const StepFigures figures = step_figures(samples_per_s);
    observer.on_step_figures(figures);
    if (csv_monitor_) ZINF_TRY(csv_monitor_->write_step(figures));
    if (step % engine_.config().steps_per_print == 0) report_print(observer, figures);
    if (!options_.save_dir.empty() && options_.save_every != 0 && step % options_.save_every == 0) {
        ZINF_TRY(save(observer));
    }
    if (step % steps_per_epoch_ == 0 && options_.evaluate_each_epoch) {
        ZINF_TRY(evaluate_and_report(observer, step / steps_per_epoch_ - 1, true));
    } else if (options_.eval_every != 0 && step % options_.eval_every == 0) {
        ZINF_TRY(evaluate_and_report(observer, step / steps_per_epoch_, false));
    }
    return Status::ok();
}

Status Trainer::save(TrainerObserver& observer) {
    const std::string tag = str_cat("global_step", engine_.global_steps());
    ZINF_TRY(engine_.save_checkpoint(options_.save_dir, tag).with_context("checkpoint"));
    observer.on_checkpoint(options_.save_dir, tag);
    return Status::ok();
}

Status Trainer::evaluate_and_report(TrainerObserver& observer, std::uint64_t epoch,
                                    bool epoch_end) {
    ZINF_ASSIGN_OR_RETURN(EvaluationFigures f, evaluate_figures());
    f.epoch = epoch;
    f.epoch_end = epoch_end;
    run_->accuracy = f.accuracy;
    run_->eval_loss = f.loss;
    run_->eval_step = engine_.global_steps();
    observer.on_evaluation_figures(f);
    if (csv_monitor_) ZINF_TRY(csv_monitor_->write_evaluation(f.loss, engine_.global_samples()));
    return Status::ok();
}

Result<TrainSummary> Trainer::run(TrainerObserver& observer) {
    run_ = std::make_unique<RunState>();
    run_->start_step = engine_.global_steps();
    run_->start_samples = engine_.global_samples();
    run_->last_io = engine_.io_figures();
    run_->last_step_io = run_->last_io;
    while (engine_.global_steps() < total_steps_) {
        ZINF_TRY(train_one(observer));
        if (engine_.last_step().boundary) ZINF_TRY(after_step(observer));
    }
    TrainSummary s;
    s.seconds = seconds_since(run_->start);
    // The trained model is evaluated at the end unless its last evaluation was at this step:
    // labelled as its epoch when none ran before, else by its step.
    if (options_.evaluate_each_epoch &&
        (!run_->accuracy.has_value() || run_->eval_step != engine_.global_steps())) {
        ZINF_TRY(evaluate_and_report(observer, engine_.global_steps() / steps_per_epoch_,
                                     !run_->accuracy.has_value()));
    }
    const std::uint64_t every = std::max<std::uint64_t>(options_.save_every, 1);
    if (!options_.save_dir.empty() &&
        (options_.save_every == 0 || engine_.global_steps() % every != 0)) {
        ZINF_TRY(save(observer));
    }
    // A checkpoint still being copied in the background completes (or reports) before the end.
    ZINF_TRY(engine_.wait_checkpoint().with_context("checkpoint"));
    s.steps_run = engine_.global_steps() - run_->start_step;
    s.skipped_steps = engine_.skipped_steps();
    s.samples_per_second =
        static_cast<double>(engine_.global_samples() - run_->start_samples) / s.seconds;
    s.last_loss = run_->last_loss;
    s.accuracy = run_->accuracy;
    s.eval_loss = run_->eval_loss;
    s.accuracy_on_test = eval_is_test_;
    s.data_seconds = run_->data_seconds;
    return s;
}

Status ObserverPair::on_micro_step(std::uint64_t micro_step, float loss) {
    const Status first = a_.on_micro_step(micro_step, loss);
    const Status second = b_.on_micro_step(micro_step, loss);
    return first.is_ok() ? second : first;
}
void ObserverPair::on_step_figures(const StepFigures& f) {
    a_.on_step_figures(f);
    b_.on_step_figures(f);
}
void ObserverPair::on_print(const PrintFigures& f) {
    a_.on_print(f);
    b_.on_print(f);
}
void ObserverPair::on_evaluation_figures(const EvaluationFigures& f) {
    a_.on_evaluation_figures(f);
    b_.on_evaluation_figures(f);
}
void ObserverPair::on_checkpoint(const std::string& dir, const std::string& tag) {
    a_.on_checkpoint(dir, tag);
    b_.on_checkpoint(dir, tag);
}

Result<double> Trainer::evaluate() {
    ZINF_ASSIGN_OR_RETURN(const EvaluationFigures f, evaluate_figures());
    return f.accuracy;
}

Result<EvaluationFigures> Trainer::evaluate_figures() {
    TraceScope span(options_.trace, "evaluate", "compute", 0);
    data::BatcherOptions o;
    o.batch_rows = engine_.train_micro_batch_size_per_gpu();
    o.shuffle = false;
    o.drop_last = false;
    o.shard_count = static_cast<std::size_t>(engine_.world_size());
    o.shard_index = static_cast<std::size_t>(engine_.rank());
    ZINF_ASSIGN_OR_RETURN(auto batcher, data::Batcher::create(eval_, o));
    HostBatch b = host_batch(eval_, o.batch_rows);
    const std::size_t per_row = eval_.label_numel();
    std::uint64_t counts[2] = {0, 0};  // correct, labels
    double loss_sum = 0;               // of loss x labels
    const std::uint32_t first_sample = 0;
    std::size_t batches = batcher.batches_per_epoch();
    if (options_.eval_samples > 0) {
        // The same count on every rank (each forward gathers collectively).
        const std::uint64_t per_batch = o.batch_rows * o.shard_count;
        batches = static_cast<std::size_t>(
            std::min<std::uint64_t>(batches, (options_.eval_samples + per_batch - 1) / per_batch));
    }
    std::uint64_t samples = 0;
    for (std::size_t i = 0; i < batches; ++i) {
        std::size_t n = fill(batcher, eval_, i, b);
        // Every rank runs as many forwards (stage 3 gathers parameters collectively): a rank
        // past the end of the last batch evaluates one sample and does not count it.
        const bool counted = n > 0;
        if (!counted) {
            gather(eval_, std::span<const std::uint32_t>(&first_sample, 1), b);
            n = 1;
        }
        ZINF_ASSIGN_OR_RETURN(const Engine::BatchEvaluation e,
                              engine_.evaluate_with_loss(batch_of(eval_, b, n)));
        if (counted) {
            counts[0] += e.correct;
            counts[1] += n * per_row;
            samples += n;
            loss_sum += static_cast<double>(e.loss) * static_cast<double>(n * per_row);
        }
    }
    ZINF_TRY(zero::sum_over_ranks(engine_.communicator(), counts));
    ZINF_TRY(zero::sum_over_ranks(engine_.communicator(), std::span<std::uint64_t>(&samples, 1)));
    ZINF_TRY(zero::sum_over_ranks(engine_.communicator(), std::span<double>(&loss_sum, 1)));
    EvaluationFigures f;
    f.step = engine_.global_steps();
    f.test = eval_is_test_;
    f.labels = counts[1];
    f.samples = samples;
    f.samples_total = eval_.count();
    if (counts[1] != 0) {
        f.accuracy = static_cast<double>(counts[0]) / static_cast<double>(counts[1]);
        f.loss = loss_sum / static_cast<double>(counts[1]);
    }
    return f;
}

Result<std::vector<Prediction>> Trainer::predict(std::size_t count, std::uint64_t seed) {
    count = std::min(count, eval_.count());
    std::vector<std::uint32_t> order(eval_.count());
    std::iota(order.begin(), order.end(), 0u);
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    const std::size_t rows_max = engine_.train_micro_batch_size_per_gpu();
    const std::size_t features = eval_.features();
    if (eval_.token_inputs() || eval_.label_numel() != 1) {
        return Status::not_supported(
            "--predict: samples of a classifier only (a language model samples with --generate)");
    }
    std::vector<Prediction> out;
    HostBatch b = host_batch(eval_, rows_max);
    for (std::size_t at = 0; at < count; at += rows_max) {
        const std::size_t n = std::min(rows_max, count - at);
        const auto indices = std::span<const std::uint32_t>(order).subspan(at, n);
        gather(eval_, indices, b);
        ZINF_ASSIGN_OR_RETURN(auto predicted, engine_.predict(batch_of(eval_, b, n)));
        for (std::size_t r = 0; r < n; ++r) {
            Prediction p;
            p.index = indices[r];
            p.label = b.labels[r];
            p.predicted = predicted[r];
            p.inputs.assign(b.inputs.begin() + static_cast<std::ptrdiff_t>(r * features),
                            b.inputs.begin() + static_cast<std::ptrdiff_t>((r + 1) * features));
            out.push_back(std::move(p));
        }
    }
    return out;
}

Status Trainer::train_steps(Engine& engine, data::Batcher& batcher, std::uint64_t steps) {
    const std::size_t rows = engine.train_micro_batch_size_per_gpu();
    HostBatch b = host_batch(train_, rows);
    const std::uint64_t per_epoch = batcher.batches_per_epoch();
    for (std::uint64_t s = 0; s < steps * engine.gradient_accumulation_steps(); ++s) {
        const std::uint64_t micro = engine.micro_steps();
        if (batcher.epoch() != micro / per_epoch) batcher.start_epoch(micro / per_epoch);
        const std::size_t n = fill(batcher, train_, micro % per_epoch, b);
        ZINF_TRY(engine.forward(batch_of(train_, b, n)).status());
        ZINF_TRY(engine.backward());
        ZINF_TRY(engine.step());
    }
    return Status::ok();
}

Result<OverlapFigures> Trainer::measure_overlap(std::uint64_t steps) {
    if (!engine_.plan().needs_io) {
        return Status::invalid_argument(
            "needs offload_param or offload_optimizer on \"nvme\" (without I/O there is no "
            "I/O-only pass to compare with)");
    }
    OverlapFigures f;
    auto t0 = Clock::now();
    const engine::OverlapCounts before =
        engine_.overlap_counts() != nullptr ? *engine_.overlap_counts() : engine::OverlapCounts{};
    ZINF_TRY(train_steps(engine_, batcher_, steps));
    f.real_seconds = seconds_since(t0) / static_cast<double>(steps);
    if (const engine::OverlapCounts* after = engine_.overlap_counts(); after != nullptr) {
        f.overlap.recorded = after->recorded - before.recorded;
        f.overlap.committed = after->committed - before.committed;
        f.overlap.redone = after->redone - before.redone;
        f.overlap.skipped = after->skipped - before.skipped;
        f.overlap.abandoned = after->abandoned - before.abandoned;
        f.overlap.not_speculated = after->not_speculated - before.not_speculated;
        // The sequential pass: the same engine with the step after backward.
        engine_.set_overlap_step(false);
        t0 = Clock::now();
        const Status sequential = train_steps(engine_, batcher_, steps);
        f.sequential_seconds = seconds_since(t0) / static_cast<double>(steps);
        engine_.set_overlap_step(true);
        ZINF_TRY(sequential);
    }
    ZINF_TRY(engine_.io_only_step());  // warm-up, as the real pass had training before it
    t0 = Clock::now();
    for (std::uint64_t i = 0; i < steps; ++i) ZINF_TRY(engine_.io_only_step());
    f.io_only_seconds = seconds_since(t0) / static_cast<double>(steps);
    // Compute-only: the same engine with its I/O discarded, so that it keeps to the budgets
    // training keeps to (a second engine with every state in memory would not fit where
    // offload is needed). One warm-up step, as for the other passes.
    ZINF_TRY(engine_.set_io_discard(true));
    ZINF_TRY(train_steps(engine_, batcher_, 1));
    const std::uint64_t discarded_before = engine_.io_ops_discarded();
    const IoFigures io_before = engine_.io_figures();
    t0 = Clock::now();
    const Status timed = train_steps(engine_, batcher_, steps);
    f.compute_only_seconds = seconds_since(t0) / static_cast<double>(steps);
    const IoFigures io_after = engine_.io_figures();
    f.compute_only_ops_discarded = engine_.io_ops_discarded() - discarded_before;
    f.compute_only_bytes_moved = (io_after.bytes_read - io_before.bytes_read) +
                                 (io_after.bytes_written - io_before.bytes_written);
    ZINF_TRY(engine_.set_io_discard(false));
    ZINF_TRY(timed);
    return f;
}

}  // namespace zinf
