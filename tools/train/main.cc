// zinfinity-train: trains the model a config describes on Fashion-MNIST or synthetic data with
// zinf::Engine, showing progress, periodic figures, evaluation accuracy after each epoch and a
// final summary; saves and resumes checkpoints; writes a Chrome trace on request.
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "src/base/config.h"
#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/data/batcher.h"
#include "src/data/dataset.h"
#include "src/engine/checkpoint_files.h"
#include "src/engine/stack.h"
#ifdef ZINF_TRAIN_HAVE_CUDA
#include "src/engine/cuda_stack.h"
#endif
#include "src/engine/trace.h"
#include "tools/cli/args.h"
#include "tools/cli/progress.h"

namespace {

using Clock = std::chrono::steady_clock;
using zinf::Status;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

double peak_rss_mib() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_maxrss) / 1024.0;
}

struct Datasets {
    std::unique_ptr<zinf::data::DataSource> train;
    std::unique_ptr<zinf::data::DataSource> test;  // null: evaluate on train
};

zinf::Result<Datasets> load_data(const zinf::config::EngineConfig& c) {
    Datasets d;
    if (c.data.dataset == "fashion-mnist") {
        zinf::data::FashionMnistOptions o;
        o.directory = c.data.path;
        o.split = zinf::data::Split::kTrain;
        ZINF_ASSIGN_OR_RETURN(d.train, zinf::data::load_fashion_mnist(o));
        o.split = zinf::data::Split::kTest;
        ZINF_ASSIGN_OR_RETURN(d.test, zinf::data::load_fashion_mnist(o));
    } else {
        zinf::data::SyntheticOptions o;
        o.count = c.data.synthetic_samples;
        o.features = c.model.layers.front();
        o.classes = c.model.layers.back();
        o.seed = c.seed;
        ZINF_ASSIGN_OR_RETURN(d.train, zinf::data::SyntheticDataset::create(o));
    }
    if (d.train->features() != c.model.layers.front()) {
        return Status::invalid_argument(
            "model.layers[0]: " + std::to_string(c.model.layers.front()) + " but the dataset has " +
            std::to_string(d.train->features()) + " features");
    }
    if (d.train->classes() != c.model.layers.back()) {
        return Status::invalid_argument(
            "model.layers[-1]: " + std::to_string(c.model.layers.back()) + " but the dataset has " +
            std::to_string(d.train->classes()) + " classes");
    }
    return d;
}

zinf::Result<double> evaluate(zinf::Engine& engine, const zinf::data::DataSource& source,
                              std::size_t rows_max, zinf::TraceRecorder* trace) {
    zinf::TraceScope span(trace, "evaluate", "compute", 0);
    zinf::data::BatcherOptions o;
    o.batch_rows = rows_max;
    o.shuffle = false;
    o.drop_last = false;
    ZINF_ASSIGN_OR_RETURN(auto batcher, zinf::data::Batcher::create(source, o));
    std::vector<float> x(rows_max * source.features());
    std::vector<std::int32_t> y(rows_max);
    std::uint64_t correct = 0, total = 0;
    for (std::size_t b = 0; b < batcher.batches_per_epoch(); ++b) {
        const std::size_t n = batcher.fill(b, x, y);
        zinf::Batch batch{std::span<const float>(x.data(), n * source.features()),
                          std::span<const std::int32_t>(y.data(), n), n};
        ZINF_ASSIGN_OR_RETURN(auto c, engine.evaluate(batch));
        correct += c;
        total += n;
    }
    return total == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(total);
}

int fail(const std::string& what, const Status& s) {
    std::fprintf(stderr, "zinfinity-train: %s: %s\n", what.c_str(), s.to_string().c_str());
    return 1;
}

// The stack the config's device.type asks for.
zinf::Result<zinf::TrainingStack> make_stack(const zinf::config::EngineConfig& config) {
    if (config.device.type == "cuda") {
#ifdef ZINF_TRAIN_HAVE_CUDA
        return zinf::create_cuda_training_stack(config);
#else
        return Status::not_supported(
            "device.type: \"cuda\": this zinfinity-train was built without CUDA (nvcc not "
            "found at build time)");
#endif
    }
    return zinf::TrainingStack::create(config);
}

// Trains `steps` optimizer steps on consecutive batches of `batcher` (wrapping epochs).
Status train_steps(zinf::Engine& engine, zinf::data::Batcher& batcher,
                   const zinf::data::DataSource& source, std::uint64_t steps) {
    const std::size_t rows = engine.train_micro_batch_size_per_gpu();
    std::vector<float> x(rows * source.features());
    std::vector<std::int32_t> y(rows);
    const std::uint64_t per_epoch = batcher.batches_per_epoch();
    for (std::uint64_t s = 0; s < steps * engine.gradient_accumulation_steps(); ++s) {
        const std::uint64_t micro = engine.micro_steps();
        if (batcher.epoch() != micro / per_epoch) batcher.start_epoch(micro / per_epoch);
        const std::size_t n = batcher.fill(micro % per_epoch, x, y);
        zinf::Batch batch{std::span<const float>(x.data(), n * source.features()),
                          std::span<const std::int32_t>(y.data(), n), n};
        ZINF_TRY(engine.forward(batch).status());
        ZINF_TRY(engine.backward());
        ZINF_TRY(engine.step());
    }
    return Status::ok();
}

// --measure-overlap: real steps, I/O-only steps and compute-only steps, timed in one run.
Status measure_overlap(const zinf::config::EngineConfig& config, zinf::Engine& engine,
                       zinf::data::Batcher& batcher, const zinf::data::DataSource& source,
                       std::uint64_t steps) {
    const auto& zc = config.zero;
    if (zc.offload_param.device != zinf::config::OffloadDevice::kNvme &&
        zc.offload_optimizer.device != zinf::config::OffloadDevice::kNvme) {
        return Status::invalid_argument(
            "needs offload_param or offload_optimizer on \"nvme\" (without I/O there is no "
            "I/O-only pass to compare with)");
    }
    std::printf("measure-overlap: %" PRIu64 " steps per pass\n", steps);
    std::fflush(stdout);
    auto t0 = Clock::now();
    ZINF_TRY(train_steps(engine, batcher, source, steps));
    const double real_s = seconds_since(t0) / static_cast<double>(steps);
    std::printf("  real steps:   %.3f s/step\n", real_s);
    std::fflush(stdout);
    ZINF_TRY(engine.io_only_step());  // warm-up, as the real pass had training before it
    t0 = Clock::now();
    for (std::uint64_t i = 0; i < steps; ++i) ZINF_TRY(engine.io_only_step());
    const double io_s = seconds_since(t0) / static_cast<double>(steps);
    std::printf("  I/O-only:     %.3f s/step (same reads and writes, no compute)\n", io_s);
    std::fflush(stdout);
    // Compute-only: the same model and arithmetic with every state in memory.
    zinf::config::EngineConfig c = config;
    c.zero.offload_param.device = zinf::config::OffloadDevice::kNone;
    c.zero.offload_optimizer.device = zinf::config::OffloadDevice::kCpu;
    // CPU device: a number (host memory is used as needed); GPU: what is free.
    c.device.memory_budget_bytes = c.device.type == "cuda" ? 0 : std::uint64_t{1} << 40;
    c.device.host_memory_budget_bytes = 0;
    const zinf::log::Level level = zinf::log::level();
    zinf::log::set_level(zinf::log::Level::kWarning);
    auto stack = make_stack(c);
    zinf::log::set_level(level);
    if (!stack.has_value()) return stack.error().with_context("compute-only engine");
    zinf::data::BatcherOptions bo;
    bo.batch_rows = c.batch.train_micro_batch_size_per_gpu;
    bo.shuffle = c.data.shuffle;
    bo.seed = c.seed;
    ZINF_ASSIGN_OR_RETURN(auto compute_batcher, zinf::data::Batcher::create(source, bo));
    ZINF_TRY(train_steps(*stack->engine, compute_batcher, source, 1));  // warm-up
    t0 = Clock::now();
    ZINF_TRY(train_steps(*stack->engine, compute_batcher, source, steps));
    const double compute_s = seconds_since(t0) / static_cast<double>(steps);
    std::printf("  compute-only: %.3f s/step (states in memory, offload off)\n", compute_s);
    const double bound = std::max(io_s, compute_s);
    std::printf("  real / max(compute-only, I/O-only) = %.3f (target <= 1.15: %s)\n",
                real_s / bound, real_s / bound <= 1.15 ? "met" : "NOT met");
    std::fflush(stdout);
    return Status::ok();
}

int run(int argc, char** argv) {
    zinf::cli::Args args(
        "zinfinity-train --config FILE [flags]",
        "Trains the model of a zinfinity/DeepSpeed-style config with zinf::Engine.");
    args.add("config", "", "config file (JSON, DeepSpeed key names; see docs/CONFIG.md)");
    args.add_list("set", "override a config key before validation: --set key.path=value");
    args.add("trace", "", "write a Chrome trace (Perfetto) of compute, I/O and optimizer spans");
    args.add("save-dir", "", "directory for checkpoints");
    args.add("save-every", "0", "save a checkpoint every N optimizer steps (0: only at the end)");
    args.add("resume", "", "resume from a checkpoint: DIR/TAG, or DIR (its 'latest' tag)");
    args.add("max-steps", "0",
             "stop after this many optimizer steps in total (0: data.max_steps/epochs)");
    args.add_switch("measure-overlap",
                    "after training, time --overlap-steps real steps, as many I/O-only steps "
                    "(the same reads and writes, no compute) and compute-only steps (a second "
                    "engine with offload off), and print all three and real / max(compute, I/O)");
    args.add("overlap-steps", "3", "steps per pass of --measure-overlap");
    args.add_switch("no-eval", "skip the evaluation after each epoch");
    args.add("loss-log", "",
             "write every micro-step's loss to FILE (step, loss, its fp32 bits in hex)");
    args.add("progress", "auto",
             "progress line on stderr for runs over two seconds: on, off,\n"
             "or auto (on when stderr is a terminal)");
    if (Status s = args.parse(argc - 1, argv + 1); !s.is_ok()) return fail("arguments", s);
    if (args.help_requested()) {
        std::printf("%s", args.help().c_str());
        return 0;
    }
    if (!args.given("config")) {
        std::fprintf(stderr, "zinfinity-train: --config FILE is required (see --help)\n");
        return 2;
    }
    zinf::config::LoadOptions lo;
    lo.overrides = args.get_list("set");
    auto loaded = zinf::config::load(args.get("config"), lo);
    if (!loaded.has_value()) return fail("config", loaded.error());
    auto& config = *loaded;
    auto max_steps_flag = args.get_count("max-steps");
    if (!max_steps_flag.has_value()) return fail("--max-steps", max_steps_flag.error());
    const std::uint64_t max_steps = *max_steps_flag != 0 ? *max_steps_flag : config.data.max_steps;
    bool show_progress = ::isatty(STDERR_FILENO) != 0;
    if (const std::string p = args.get("progress"); p == "on" || p == "off") {
        show_progress = p == "on";
    } else if (p != "auto") {
        return fail("arguments", Status::invalid_argument(
                                     "--progress: expected auto, on or off, got '" + p + "'"));
    }
    auto save_every = args.get_count("save-every");
    if (!save_every.has_value()) return fail("--save-every", save_every.error());
    const std::string save_dir = args.get("save-dir");
    if (!save_dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(save_dir, ec);
        if (Status s = zinf::check_writable_directory(save_dir); !s.is_ok())
            return fail("--save-dir", s);
        // Refused before training, not at the first save: another user must not be able to
        // replace the checkpoints (io::check_trusted_directory).
        auto opened = zinf::io::posix_file_system().open_directory(save_dir, true);
        if (!opened.has_value()) return fail("--save-dir", opened.error());
        if (Status s = zinf::io::check_trusted_directory(*opened, "--save-dir"); !s.is_ok())
            return fail("--save-dir", s);
    }

    // Data first: a missing dataset fails before gigabytes are allocated.
    auto data = load_data(config);
    if (!data.has_value()) return fail("data", data.error());
    auto stack = make_stack(config);
    if (!stack.has_value()) return fail("engine", stack.error());
    zinf::Engine& engine = *stack->engine;
    std::printf("%s\n", engine.summary().c_str());

    std::unique_ptr<zinf::TraceRecorder> trace;
    if (args.given("trace")) {
        trace = std::make_unique<zinf::TraceRecorder>();
        engine.set_trace(trace.get());
    }
    if (args.given("resume")) {
        std::string dir = args.get("resume"), tag;
        auto latest = zinf::engine::read_latest_tag(zinf::io::posix_file_system(), dir);
        if (latest.has_value()) {
            tag = *latest;
        } else if (latest.error().code() != zinf::StatusCode::kNotFound) {
            return fail("--resume", latest.error());
        } else {
            while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
            const auto slash = dir.find_last_of('/');
            if (slash == std::string::npos) {
                return fail("--resume", Status::invalid_argument(
                                            "expected DIR/TAG or DIR with a 'latest' file"));
            }
            tag = dir.substr(slash + 1);
            dir = slash == 0 ? std::string("/") : dir.substr(0, slash);
        }
        if (Status s = engine.load_checkpoint(dir, tag); !s.is_ok()) return fail("--resume", s);
        std::printf("resumed from %s/%s at step %" PRIu64 "\n", dir.c_str(), tag.c_str(),
                    engine.global_steps());
    }

    const std::size_t rows = config.batch.train_micro_batch_size_per_gpu;
    const std::uint64_t gas = config.batch.gradient_accumulation_steps;
    zinf::data::BatcherOptions bo;
    bo.batch_rows = rows;
    bo.shuffle = config.data.shuffle;
    bo.seed = config.seed;
    auto batcher_r = zinf::data::Batcher::create(*data->train, bo);
    if (!batcher_r.has_value()) return fail("data", batcher_r.error());
    auto& batcher = *batcher_r;
    const std::uint64_t per_epoch = batcher.batches_per_epoch();
    const std::uint64_t steps_per_epoch = per_epoch / gas;
    std::uint64_t total_steps = steps_per_epoch * config.data.epochs;
    if (max_steps != 0) total_steps = std::min<std::uint64_t>(total_steps, max_steps);
    if (steps_per_epoch == 0) {
        return fail("data",
                    Status::invalid_argument(
                        "an epoch has fewer micro-batches than gradient_accumulation_steps"));
    }
    const zinf::data::DataSource& eval_source = data->test ? *data->test : *data->train;
    std::printf("data: %s, %zu training samples, %" PRIu64 " steps per epoch, %" PRIu64
                " steps to run (from step %" PRIu64 ")\n",
                config.data.dataset.c_str(), data->train->count(), steps_per_epoch, total_steps,
                engine.global_steps());

    std::FILE* loss_log = nullptr;
    if (args.given("loss-log")) {
        loss_log = std::fopen(args.get("loss-log").c_str(), "w");
        if (loss_log == nullptr) {
            return fail("--loss-log", Status::from_errno(errno, "open " + args.get("loss-log")));
        }
    }
    std::vector<float> x(rows * data->train->features());
    std::vector<std::int32_t> y(rows);
    zinf::cli::Progress progress("train", static_cast<double>(total_steps), "steps", 1.0);
    const auto start = Clock::now();
    const std::uint64_t start_step = engine.global_steps();
    const std::uint64_t start_samples = engine.global_samples();
    double data_seconds = 0;
    zinf::IoFigures last_io = engine.io_figures();
    auto last_print = Clock::now();
    double loss_sum = 0;
    std::uint64_t loss_count = 0;
    float last_loss = 0;
    double last_accuracy = -1;
    auto print_accuracy = [&](std::uint64_t epoch) -> Status {
        ZINF_ASSIGN_OR_RETURN(last_accuracy, evaluate(engine, eval_source, rows, trace.get()));
        progress.clear_line();
        std::printf("epoch %" PRIu64 ": %s accuracy %.2f %%\n", epoch + 1,
                    data->test ? "test" : "train", 100.0 * last_accuracy);
        std::fflush(stdout);
        return Status::ok();
    };
    while (engine.global_steps() < total_steps) {
        const std::uint64_t micro = engine.micro_steps();
        const std::uint64_t epoch = micro / (steps_per_epoch * gas);
        const std::uint64_t index = micro % (steps_per_epoch * gas);
        if (batcher.epoch() != epoch || micro == 0) batcher.start_epoch(epoch);
        const auto t0 = Clock::now();
        const std::size_t n = batcher.fill(index, x, y);
        if (trace) trace->span("load batch", "data", t0, Clock::now(), 4);
        data_seconds += seconds_since(t0);
        zinf::Batch batch{std::span<const float>(x.data(), n * data->train->features()),
                          std::span<const std::int32_t>(y.data(), n), n};
        auto loss = engine.forward(batch);
        if (!loss.has_value()) return fail("forward", loss.error());
        if (Status s = engine.backward(); !s.is_ok()) return fail("backward", s);
        if (Status s = engine.step(); !s.is_ok()) return fail("step", s);
        last_loss = *loss;
        if (loss_log != nullptr) {
            std::uint32_t bits = 0;
            std::memcpy(&bits, &*loss, sizeof bits);
            std::fprintf(loss_log, "%" PRIu64 " %.9g %08x\n", engine.micro_steps(), *loss, bits);
        }
        loss_sum += *loss;
        ++loss_count;
        if (!engine.last_step().boundary) continue;
        const std::uint64_t step = engine.global_steps();
        const double elapsed = seconds_since(start);
        const double samples_per_s =
            static_cast<double>(engine.global_samples() - start_samples) / elapsed;
        char extra[96];
        std::snprintf(extra, sizeof extra, "loss %.4f, %.0f samples/s", *loss, samples_per_s);
        if (show_progress) progress.update(static_cast<double>(step), extra);
        if (step % config.steps_per_print == 0) {
            progress.clear_line();
            const zinf::IoFigures io = engine.io_figures();
            const double interval = std::max(1e-9, seconds_since(last_print));
            std::printf(
                "step %" PRIu64
                ": loss %.4f (mean %.4f), lr %.3g, grad norm %.3g%s, %.0f samples/s, I/O read "
                "%s (%.2f GB/s), written %s (%.2f GB/s), stalled on I/O %.2f s, on data %.2f s\n",
                step, *loss, loss_sum / static_cast<double>(loss_count), engine.last_step().lr,
                engine.last_step().grad_norm,
                config.fp16.enabled
                    ? (", loss scale " + std::to_string(engine.loss_scale())).c_str()
                    : "",
                samples_per_s, zinf::format_bytes(io.bytes_read).c_str(),
                static_cast<double>(io.bytes_read - last_io.bytes_read) / 1e9 / interval,
                zinf::format_bytes(io.bytes_written).c_str(),
                static_cast<double>(io.bytes_written - last_io.bytes_written) / 1e9 / interval,
                io.stall_seconds, data_seconds);
            std::fflush(stdout);
            last_io = io;
            last_print = Clock::now();
            loss_sum = 0;
            loss_count = 0;
        }
        if (!save_dir.empty() && *save_every != 0 && step % *save_every == 0) {
            if (Status s = engine.save_checkpoint(save_dir, "global_step" + std::to_string(step));
                !s.is_ok()) {
                return fail("checkpoint", s);
            }
        }
        const bool epoch_end = step % steps_per_epoch == 0;
        if (epoch_end && !args.get_switch("no-eval")) {
            if (Status s = print_accuracy(step / steps_per_epoch - 1); !s.is_ok())
                return fail("evaluate", s);
        }
    }
    progress.finish();
    if (loss_log != nullptr && std::fclose(loss_log) != 0) {
        return fail("--loss-log", Status::io_error("close " + args.get("loss-log"), EIO));
    }
    const double elapsed = seconds_since(start);
    if (last_accuracy < 0 && !args.get_switch("no-eval")) {
        if (Status s = print_accuracy(engine.global_steps() / steps_per_epoch); !s.is_ok())
            return fail("evaluate", s);
    }
    if (!save_dir.empty() &&
        (engine.global_steps() % std::max<std::uint64_t>(*save_every, 1) != 0 ||
         *save_every == 0)) {
        if (Status s = engine.save_checkpoint(
                save_dir, "global_step" + std::to_string(engine.global_steps()));
            !s.is_ok()) {
            return fail("checkpoint", s);
        }
    }
    if (trace) {
        if (Status s = trace->write(args.get("trace")); !s.is_ok()) return fail("--trace", s);
        std::printf("trace: %s (%zu spans)\n", args.get("trace").c_str(), trace->size());
    }
    const auto& t = engine.times();
    const std::uint64_t steps_run = engine.global_steps() - start_step;
    std::printf("summary: %" PRIu64 " steps (%" PRIu64
                " skipped) in %.1f s, %.1f ms/step, %.0f samples/s; "
                "last loss %.4f",
                steps_run, engine.skipped_steps(), elapsed,
                steps_run ? 1e3 * elapsed / static_cast<double>(steps_run) : 0.0,
                static_cast<double>(engine.global_samples() - start_samples) / elapsed, last_loss);
    if (last_accuracy >= 0)
        std::printf("; %s accuracy %.2f %%", data->test ? "test" : "train", 100.0 * last_accuracy);
    std::printf(
        "\n  time: forward %.1f s, backward %.1f s, optimizer %.1f s, data %.1f s, checkpoints "
        "%.1f s\n",
        t.forward_seconds, t.backward_seconds, t.optimizer_seconds, data_seconds,
        t.checkpoint_seconds);
    const zinf::IoFigures io = engine.io_figures();
    std::printf(
        "  memory: device peak %.1f MiB of %.1f MiB budget; pinned host %.1f MiB; host RSS peak "
        "%.1f MiB; I/O read %s, written %s, stalled on I/O %.2f s\n",
        static_cast<double>(stack->device->peak_bytes()) / (1 << 20),
        static_cast<double>(stack->device->budget_bytes()) / (1 << 20),
        static_cast<double>(engine.pinned_bytes()) / (1 << 20), peak_rss_mib(),
        zinf::format_bytes(io.bytes_read).c_str(), zinf::format_bytes(io.bytes_written).c_str(),
        io.stall_seconds);
    if (!engine.residency_summary().empty()) {
        std::printf("  parameter tiers: %s\n", engine.residency_summary().c_str());
    }
    std::fflush(stdout);
    if (args.get_switch("measure-overlap")) {
        auto k = args.get_count("overlap-steps");
        if (!k.has_value() || *k == 0) {
            return fail("--overlap-steps",
                        k.has_value() ? Status::invalid_argument("must be at least 1") : k.error());
        }
        if (Status s = measure_overlap(config, engine, batcher, *data->train, *k); !s.is_ok())
            return fail("--measure-overlap", s);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return run(argc, argv);
}
