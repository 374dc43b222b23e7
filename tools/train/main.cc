// zinfinity-train: trains the model of a config with zinf::Engine and zinf::Trainer. This file is
// flag parsing and printing; the loop, its cadences and figures live in src/engine/trainer.h.
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/fault.h"
#include "io/file_system.h"
#include "src/base/config.h"
#include "src/base/config_keys.h"
#include "src/base/file.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/engine/checkpoint_files.h"
#include "src/engine/generate.h"
#include "src/engine/launch_stack.h"
#include "src/engine/trace.h"
#include "src/engine/trainer.h"
#include "src/model/gpt.h"
#include "swap/run_dir.h"
#include "tools/cli/args.h"
#include "tools/cli/progress.h"
#include "tools/cli/termination.h"
#include "tools/train/curves.h"
#include "tools/train/prediction_png.h"
#include "zero/communicator.h"
#ifdef ZINF_TRAIN_HAVE_MPI
#include "zero/mpi_communicator.h"
#endif

namespace {

using zinf::Status;

double peak_rss_mib() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// Where this process sits among the ranks (zero::detect_launch; one rank without MPI).
zinf::Launch g_launch;

// Set when this rank's error is only that another rank failed (zero::is_peer_failure): the
// failing rank ends the job, after printing the cause.
bool g_failed_for_a_peer = false;

// Errors carry the rank when there are several: every rank prints its own.
int fail(const std::string& what, const Status& s) {
    if (zinf::zero::is_peer_failure(s)) g_failed_for_a_peer = true;
    const std::string rank =
        g_launch.world_size > 1 ? "rank " + std::to_string(g_launch.rank) + ": " : "";
    std::fprintf(stderr, "zinfinity-train: %s%s: %s%s\n", rank.c_str(), what.c_str(),
                 s.to_string().c_str(), s.is_injected() ? " (a fault --io-faults injected)" : "");
    return 1;
}

// A termination signal: mpirun stopping this rank because another one failed (SIGTERM, then
// SIGKILL after a grace period), Ctrl-C, a hang-up. The swap run directories go with the process
// instead of staying until the next run on their path. Runs on the watcher thread
// (tools/cli/termination.h) while the others run on; the process then ends by the signal.
void remove_swap_on_termination(int signal) {
    const std::size_t removed_count = zinf::swap::remove_live_run_dirs_before_exit();
    if (removed_count > 0) {
        zinf::log::info("stopped by ", zinf::cli::termination_signal_name(signal), " (", signal,
                        "): removed ", removed_count, " swap run director",
                        removed_count == 1 ? "y" : "ies");
    }
}

void declare_flags(zinf::cli::Args& args) {
    args.add("config", "", "config file (JSON, DeepSpeed key names; see docs/CONFIG.md)");
    args.add_list("set", "override a config key before validation: --set key.path=value");
    args.add("trace", "", "write a Chrome trace (Perfetto) of compute, I/O and optimizer spans");
    args.add("save-dir", "", "directory for checkpoints");
    args.add("save-every", "0", "save a checkpoint every N optimizer steps (0: only at the end)");
    args.add("resume", "", "resume from a checkpoint: DIR/TAG, or DIR (its 'latest' tag)");
    args.add("max-steps", "0",
             "stop after this many optimizer steps in total (0: data.max_steps/epochs)");
    args.add_switch("eval-only",
                    "evaluate the checkpoint given with --resume on the test set and stop, "
                    "without training");
    args.add("predict", "0",
             "after training (or --eval-only), predict N random test samples and print their\n"
             "predicted and true labels; image data also goes to --predict-png");
    args.add("predict-png", "predictions.png",
             "where --predict writes the samples as a PNG grid, captioned P:<predicted> "
             "T:<true>");
    args.add_switch("config-keys",
                    "print every config key zinfinity knows (DeepSpeed's and its own) with what\n"
                    "zinfinity does with it, as a Markdown table, and exit");
    args.add_switch("measure-overlap",
                    "after training, time --overlap-steps real steps, as many I/O-only steps "
                    "(the same reads and writes, no compute) and compute-only steps (a second "
                    "engine with offload off), and print all three and real / max(compute, I/O)");
    args.add("overlap-steps", "3", "steps per pass of --measure-overlap");
    args.add_switch("no-eval", "skip the evaluation after each epoch");
    args.add("eval-every", "0",
             "also evaluate every N optimizer steps (0: only after each epoch); a language\n"
             "model prints its validation loss in nats per byte and its perplexity");
    args.add("eval-samples", "",
             "evaluate on the first N samples of the evaluation set, whole batches (0: all;\n"
             "default: data.eval_samples)");
    args.add("generate", "",
             "print a continuation of PROMPT by the language model of the checkpoint given\n"
             "with --resume (model.type gpt), without training");
    args.add("generate-bytes", "200", "bytes --generate appends to the prompt");
    args.add("temperature", "0.8",
             "--generate draws each byte from softmax(logits / T); 0: the most likely byte");
    args.add("loss-log", "",
             "write every micro-step's loss to FILE (step, loss, its fp32 bits in hex)");
    args.add("plot", "",
             "draw loss (and the evaluations' loss), learning rate, samples/s and I/O GB/s per\n"
             "optimizer step into FILE.svg (rank 0), at the end of training, or when it stops on\n"
             "an error");
    args.add("io-faults", "",
             "inject faults into the swap I/O (testing a deployment's error handling), e.g.\n"
             "fail_nth=40,errno=EIO or enospc_after=64MiB or read_error=0.001,seed=7; the\n"
             "run must then stop naming the injected fault (CPU device only)");
    args.add("progress", "auto",
             "progress line on stderr for runs over two seconds: on, off,\n"
             "or auto (on when stderr is a terminal)");
}

// What the flags say, checked before anything is loaded or allocated.
struct Flags {
    std::uint64_t max_steps = 0;
    std::uint64_t save_every = 0;
    std::uint64_t predict = 0;
    std::uint64_t overlap_steps = 0;
    std::uint64_t eval_every = 0;
    std::optional<std::uint64_t> eval_samples;  // --eval-samples, over data.eval_samples
    std::uint64_t generate_bytes = 0;
    double temperature = 0;
    bool show_progress = false;
    std::optional<zinf::io::FaultPlan> io_faults;  // --io-faults
};

zinf::Result<Flags> check_flags(const zinf::cli::Args& args) {
    Flags f;
    ZINF_ASSIGN_OR_RETURN(f.max_steps, args.get_count("max-steps"));
    ZINF_ASSIGN_OR_RETURN(f.save_every, args.get_count("save-every"));
    ZINF_ASSIGN_OR_RETURN(f.predict, args.get_count("predict"));
    ZINF_ASSIGN_OR_RETURN(f.overlap_steps, args.get_count("overlap-steps"));
    if (args.get_switch("measure-overlap") && f.overlap_steps == 0) {
        return Status::invalid_argument("--overlap-steps: must be at least 1");
    }
    ZINF_ASSIGN_OR_RETURN(f.eval_every, args.get_count("eval-every"));
    if (args.given("eval-samples")) {
        ZINF_ASSIGN_OR_RETURN(f.eval_samples, args.get_count("eval-samples"));
    }
    ZINF_ASSIGN_OR_RETURN(f.generate_bytes, args.get_count("generate-bytes"));
    {
        const std::string t = args.get("temperature");
        char* end = nullptr;
        errno = 0;
        f.temperature = std::strtod(t.c_str(), &end);
        if (t.empty() || end == nullptr || *end != '\0' || errno != 0 || !(f.temperature >= 0.0) ||
            !std::isfinite(f.temperature)) {
            return Status::invalid_argument(
                "--temperature: expected a number >= 0 (0: greedy), got '" + t + "'");
        }
    }
    if (args.given("generate")) {
        if (!args.given("resume")) {
            return Status::invalid_argument(
                "--generate: needs --resume DIR[/TAG] (the trained language model)");
        }
        if (args.get("generate").empty()) {
            return Status::invalid_argument("--generate: the prompt is empty");
        }
        if (f.generate_bytes == 0) {
            return Status::invalid_argument("--generate-bytes: must be at least 1");
        }
    }
    if (!args.get("io-faults").empty()) {
        auto plan = zinf::io::parse_fault_plan(args.get("io-faults"));
        if (!plan.has_value()) {
            return Status::invalid_argument("--io-faults: " + plan.error().message());
        }
        f.io_faults = *plan;
    }
    if (args.get_switch("eval-only") && !args.given("resume")) {
        return Status::invalid_argument(
            "--eval-only: needs --resume DIR[/TAG] (the checkpoint to evaluate)");
    }
    f.show_progress = ::isatty(STDERR_FILENO) != 0;
    const std::string p = args.get("progress");
    if (p == "on" || p == "off") {
        f.show_progress = p == "on";
    } else if (p != "auto") {
        return Status::invalid_argument("--progress: expected auto, on or off, got '" + p + "'");
    }
    // Refused before training, not after it: an hour of figures must not be lost to a typo.
    if (args.given("plot") && g_launch.rank == 0) {
        ZINF_TRY(zinf::train::check_plot_path(args.get("plot")));
    }
    const std::string save_dir = args.get("save-dir");
    if (!save_dir.empty()) {
        // Refused before training, not at the first save: another user must not be able to
        // replace the checkpoints (io::check_trusted_directory).
        ZINF_TRY(zinf::io::open_trusted_directory(zinf::io::posix_file_system(), save_dir,
                                                  "--save-dir", /*create=*/true)
                     .status());
    }
    return f;
}

// --resume DIR/TAG or DIR (its `latest`).
Status resume(zinf::Engine& engine, const std::string& flag) {
    std::string dir = flag, tag;
    auto latest = zinf::engine::read_latest_tag(zinf::io::posix_file_system(), dir);
    if (latest.has_value()) {
        tag = *latest;
    } else if (latest.error().code() != zinf::StatusCode::kNotFound) {
        return latest.error();
    } else {
        while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
        const auto slash = dir.find_last_of('/');
        if (slash == std::string::npos) {
            return Status::invalid_argument("expected DIR/TAG or DIR with a 'latest' file");
        }
        tag = dir.substr(slash + 1);
        dir = slash == 0 ? std::string("/") : dir.substr(0, slash);
    }
    ZINF_TRY(engine.load_checkpoint(dir, tag));
    std::printf("resumed from %s/%s at step %" PRIu64 "\n", dir.c_str(), tag.c_str(),
                engine.global_steps());
    return Status::ok();
}

// Prints the trainer's reports: progress line, periodic figures, evaluations; and the loss log.
class Printer final : public zinf::TrainerObserver {
public:
    Printer(const zinf::config::EngineConfig& config, const zinf::Engine& engine,
            const std::optional<zinf::data::ByteEntropy>& entropy, bool show_progress,
            std::FILE* loss_log, std::uint64_t total_steps)
        : fp16_(config.fp16.enabled),
          profile_(config.activation_checkpointing.profile),
          engine_(engine),
          entropy_(entropy),
          show_progress_(show_progress),
          loss_log_(loss_log),
          progress_("train", static_cast<double>(total_steps), "steps", 1.0) {}

    Status on_micro_step(std::uint64_t micro_step, float loss) override {
        if (loss_log_ == nullptr) return Status::ok();
        std::uint32_t bits = 0;
        std::memcpy(&bits, &loss, sizeof bits);
        std::fprintf(loss_log_, "%" PRIu64 " %.9g %08x\n", micro_step, loss, bits);
        return Status::ok();
    }
    void on_step(std::uint64_t step, std::uint64_t, float loss, double samples_per_s) override {
        if (!show_progress_) return;
        char extra[96];
        std::snprintf(extra, sizeof extra, "loss %.4f, %.0f samples/s", loss, samples_per_s);
        progress_.update(static_cast<double>(step), extra);
    }
    void on_print(const zinf::PrintFigures& f) override {
        progress_.clear_line();
        std::printf(
            "step %" PRIu64
            ": loss %.4f (mean %.4f), lr %.3g, grad norm %.3g%s, %.0f samples/s, I/O read "
            "%s (%.2f GB/s), written %s (%.2f GB/s), stalled on I/O %.2f s, on data %.2f s\n",
            f.step, f.loss, f.mean_loss, f.lr, f.grad_norm,
            fp16_ ? (", loss scale " + std::to_string(f.loss_scale)).c_str() : "",
            f.samples_per_second, zinf::format_bytes(f.io.bytes_read).c_str(), f.read_gb_per_second,
            zinf::format_bytes(f.io.bytes_written).c_str(), f.write_gb_per_second,
            f.io.stall_seconds, f.data_seconds);
        const auto* gpt = dynamic_cast<const zinf::model::Gpt*>(&engine_.model());
        if (profile_ && gpt != nullptr) {
            const zinf::model::CheckpointProfile& p = gpt->checkpoint_profile();
            std::printf(
                "  checkpointed blocks (activation_checkpointing.profile): forward %.3f s "
                "over %" PRIu64 " blocks, recompute %.3f s over %" PRIu64 ", backward %.3f s\n",
                p.forward_seconds, p.blocks_forward, p.recompute_seconds, p.blocks_recomputed,
                p.backward_seconds);
        }
        std::fflush(stdout);
    }
    void on_evaluation_figures(const zinf::EvaluationFigures& f) override {
        progress_.clear_line();
        const std::string when = f.epoch_end ? "epoch " + std::to_string(f.epoch + 1)
                                             : "step " + std::to_string(f.step) + " (epoch " +
                                                   std::to_string(f.epoch + 1) + ")";
        if (entropy_.has_value()) {
            // A byte-level language model: the loss is in nats per byte.
            std::printf(
                "%s: %s loss %.4f nats/byte, perplexity %.3f, next-byte accuracy %.2f %%"
                " (training text: unigram entropy %.4f, bigram %.4f nats/byte)%s\n",
                when.c_str(), f.test ? "validation" : "train", f.loss, std::exp(f.loss),
                100.0 * f.accuracy, entropy_->unigram_nats, entropy_->bigram_nats,
                subset(f).c_str());
        } else {
            std::printf("%s: %s accuracy %.2f %%%s\n", when.c_str(), f.test ? "test" : "train",
                        100.0 * f.accuracy, subset(f).c_str());
        }
        std::fflush(stdout);
    }
    void finish() { progress_.finish(); }
    // ", on the first N of M samples" when the evaluation covered part of its set.
    static std::string subset(const zinf::EvaluationFigures& f) {
        if (f.samples >= f.samples_total) return "";
        return ", on the first " + std::to_string(f.samples) + " of " +
               std::to_string(f.samples_total) + " samples";
    }

private:
    bool fp16_;
    bool profile_;
    const zinf::Engine& engine_;
    std::optional<zinf::data::ByteEntropy> entropy_;
    bool show_progress_;
    std::FILE* loss_log_;
    zinf::cli::Progress progress_;
};

void print_summary(const zinf::TrainSummary& s, const zinf::TrainingStack& stack,
                   bool language_model) {
    const zinf::Engine& engine = *stack.engine;
    std::printf("summary: %" PRIu64 " steps (%" PRIu64
                " skipped) in %.1f s, %.1f ms/step, %.0f samples/s; last loss %.4f",
                s.steps_run, s.skipped_steps, s.seconds,
                s.steps_run ? 1e3 * s.seconds / static_cast<double>(s.steps_run) : 0.0,
                s.samples_per_second, s.last_loss);
    if (language_model && s.eval_loss.has_value()) {
        std::printf("; %s loss %.4f nats/byte (perplexity %.3f)",
                    s.accuracy_on_test ? "validation" : "train", *s.eval_loss,
                    std::exp(*s.eval_loss));
    } else if (s.accuracy.has_value()) {
        std::printf("; %s accuracy %.2f %%", s.accuracy_on_test ? "test" : "train",
                    100.0 * *s.accuracy);
    }
    const auto& t = engine.times();
    std::printf(
        "\n  time: forward %.1f s, backward %.1f s, optimizer %.1f s, data %.1f s, checkpoints "
        "%.1f s\n",
        t.forward_seconds, t.backward_seconds, t.optimizer_seconds, s.data_seconds,
        t.checkpoint_seconds);
    if (t.checkpoint_background_seconds > 0) {
        std::printf(
            "  checkpoints in the background (swap.background_checkpoint): training stopped "
            "%.2f s, optimizer states copied beside training in %.2f s, steps waited %.2f s for "
            "the copy\n",
            t.checkpoint_seconds, t.checkpoint_background_seconds, t.checkpoint_wait_seconds);
    }
    if (const auto* o = engine.overlap_counts(); o != nullptr) {
        std::printf("  optimizer step beside backward (swap.overlap_step): %" PRIu64
                    " committed, %" PRIu64 " redone (clipping), %" PRIu64
                    " skipped (fp16 overflow), %" PRIu64 " abandoned; %" PRIu64
                    " after backward (the step before clipped or overflowed), %" PRIu64
                    " recording the order; rollback rate %.1f %%\n",
                    o->committed, o->redone, o->skipped, o->abandoned, o->not_speculated,
                    o->recorded, 100.0 * o->rollback_rate());
    }
    const zinf::IoFigures io = engine.io_figures();
    std::printf(
        "  memory: device peak %.1f MiB of %.1f MiB budget; pinned host %.1f MiB; host RSS peak "
        "%.1f MiB; I/O read %s, written %s, stalled on I/O %.2f s\n",
        static_cast<double>(stack.device->peak_bytes()) / (1 << 20),
        static_cast<double>(stack.device->budget_bytes()) / (1 << 20),
        static_cast<double>(engine.pinned_bytes()) / (1 << 20), peak_rss_mib(),
        zinf::format_bytes(io.bytes_read).c_str(), zinf::format_bytes(io.bytes_written).c_str(),
        io.stall_seconds);
    if (!engine.residency_summary().empty()) {
        std::printf("  parameter tiers: %s\n", engine.residency_summary().c_str());
    }
    const auto* gpt = dynamic_cast<const zinf::model::Gpt*>(&engine.model());
    if (gpt != nullptr && gpt->config().checkpoint_activations) {
        std::printf("  activation checkpoints: %s kept on the device",
                    zinf::format_bytes(gpt->kept_activation_bytes()).c_str());
        if (gpt->host_checkpoint_bytes() > 0) {
            std::printf(", %s in pinned host memory",
                        zinf::format_bytes(gpt->host_checkpoint_bytes()).c_str());
        }
        if (const zinf::model::ActivationStore* store = gpt->activation_store()) {
            std::printf(", on NVMe: written %s, read back %s",
                        zinf::format_bytes(store->bytes_written()).c_str(),
                        zinf::format_bytes(store->bytes_read()).c_str());
        }
        std::printf("\n");
    }
    std::fflush(stdout);
}

// --predict N: N random test samples, printed; image data drawn into a PNG grid.
Status predict(zinf::Trainer& trainer, std::uint64_t count, const zinf::config::EngineConfig& c,
               const std::string& png_path) {
    ZINF_ASSIGN_OR_RETURN(auto predictions, trainer.predict(count, c.seed));
    std::size_t right = 0;
    std::vector<zinf::train::PredictedImage> images;
    for (const auto& p : predictions) {
        std::printf("predict: sample %u: predicted %d, true %d%s\n", p.index, p.predicted, p.label,
                    p.predicted == p.label ? "" : "  (wrong)");
        right += p.predicted == p.label ? 1 : 0;
        images.push_back({p.inputs, 28, 28, p.predicted, p.label});
    }
    std::printf("predict: %zu of %zu right\n", right, predictions.size());
    if (c.data.dataset == "fashion-mnist" && !images.empty() && g_launch.rank == 0) {
        ZINF_TRY(
            zinf::train::write_prediction_grid(png_path, images).with_context("--predict-png"));
        std::printf("predict: %s (%zu images, captioned P:<predicted> T:<true>)\n",
                    png_path.c_str(), images.size());
    }
    std::fflush(stdout);
    return Status::ok();
}

void print_overlap(const zinf::OverlapFigures& f, std::uint64_t steps) {
    std::printf("measure-overlap: %" PRIu64 " steps per pass\n", steps);
    std::printf("  real steps:   %.3f s/step\n", f.real_seconds);
    if (f.sequential_seconds > 0) {
        const auto& o = f.overlap;
        std::printf(
            "  sequential:   %.3f s/step (swap.overlap_step off, same run); the real pass's "
            "steps beside backward: %" PRIu64 " committed, %" PRIu64 " redone (clipping), %" PRIu64
            " skipped (fp16 overflow), %" PRIu64 " abandoned; %" PRIu64
            " after backward (the step before clipped or overflowed), %" PRIu64
            " recording the order; rollback rate %.1f %%\n",
            f.sequential_seconds, o.committed, o.redone, o.skipped, o.abandoned, o.not_speculated,
            o.recorded, 100.0 * o.rollback_rate());
    }
    std::printf(
        "  I/O-only:     %.3f s/step (parameters, gradients, optimizer states; no compute)\n",
        f.io_only_seconds);
    std::printf(
        "  compute-only: %.3f s/step (the same engine and budgets, its I/O discarded: %" PRIu64
        " operations, %" PRIu64 " bytes still moved)\n",
        f.compute_only_seconds, f.compute_only_ops_discarded, f.compute_only_bytes_moved);
    std::printf("  real / max(compute-only, I/O-only) = %.3f (target <= 1.15: %s)\n", f.ratio(),
                f.ratio() <= 1.15 ? "met" : "NOT met");
    std::fflush(stdout);
}

// --eval-only: the checkpoint's accuracy (and a language model's loss), without a training step.
int evaluate_only(zinf::Trainer& trainer, const zinf::Engine& engine, bool on_test,
                  bool language_model) {
    auto f = trainer.evaluate_figures();
    if (!f.has_value()) return fail("evaluate", f.error());
    std::printf("evaluation only (no training) of the checkpoint at step %" PRIu64
                ": %s accuracy %.2f %%",
                engine.global_steps(), on_test ? (language_model ? "validation" : "test") : "train",
                100.0 * f->accuracy);
    if (language_model) {
        std::printf(", loss %.4f nats/byte, perplexity %.3f", f->loss, std::exp(f->loss));
    }
    std::printf("\n");
    return 0;
}

// --generate: the prompt, then the continuation as it is drawn.
int generate_text(zinf::Engine& engine, const std::string& prompt, const Flags& flags,
                  const zinf::config::EngineConfig& config) {
    if (g_launch.world_size > 1) {
        return fail("--generate", Status::not_supported("--generate: one rank only"));
    }
    zinf::GenerateOptions o;
    o.bytes = flags.generate_bytes;
    o.temperature = flags.temperature;
    o.seed = config.seed;
    o.on_byte = [](char c) {
        std::fputc(c, stdout);
        std::fflush(stdout);
    };
    std::printf(
        "generate (%zu bytes, %s):\n%s", o.bytes,
        o.temperature == 0.0 ? "greedy" : ("temperature " + std::to_string(o.temperature)).c_str(),
        prompt.c_str());
    std::fflush(stdout);
    auto text = zinf::generate(engine, prompt, o);
    std::printf("\n");
    if (!text.has_value()) return fail("--generate", text.error());
    return 0;
}

// --plot: the recorded figures as FILE.svg, on rank 0 (the figures are the global ones).
// Written whether training ended or stopped on an error, as long as a step was recorded.
Status write_plot(const zinf::cli::Args& args, const zinf::train::CurveRecorder& curves) {
    if (!args.given("plot") || g_launch.rank != 0 || curves.steps() == 0) return Status::ok();
    const std::string path = args.get("plot");
    ZINF_TRY(zinf::train::write_text_file(
        path, curves.render_svg("zinfinity-train " + args.get("config"))));
    std::printf("plot: %s (%zu steps)\n", path.c_str(), curves.steps());
    std::fflush(stdout);
    return Status::ok();
}

// Training with the loss log, the printer and the --plot recorder; the summary after it.
int train(zinf::Trainer& trainer, const zinf::cli::Args& args, const Flags& flags,
          const zinf::config::EngineConfig& config, const zinf::TrainingStack& stack,
          const std::optional<zinf::data::ByteEntropy>& entropy) {
    std::FILE* loss_log = nullptr;
    if (args.given("loss-log") && g_launch.rank == 0) {  // the losses are the global ones
        loss_log = std::fopen(args.get("loss-log").c_str(), "w");
        if (loss_log == nullptr) {
            return fail("--loss-log", Status::from_errno(errno, "open " + args.get("loss-log")));
        }
    }
    Printer printer(config, *stack.engine, entropy, flags.show_progress, loss_log,
                    trainer.total_steps());
    zinf::train::CurveRecorder curves;
    zinf::ObserverPair observers(printer, curves);
    auto summary = trainer.run(observers);
    printer.finish();
    const Status plotted = write_plot(args, curves);
    if (loss_log != nullptr && std::fclose(loss_log) != 0 && summary.has_value()) {
        return fail("--loss-log", Status::io_error("close " + args.get("loss-log"), EIO));
    }
    if (!summary.has_value()) {
        if (!plotted.is_ok()) (void)fail("--plot", plotted);
        return fail("train", summary.error());
    }
    if (!plotted.is_ok()) return fail("--plot", plotted);
    print_summary(*summary, stack, entropy.has_value());
    return 0;
}

// The config --config names, with the --set overrides, for this launch's world size.
zinf::Result<zinf::config::EngineConfig> load_config(const zinf::cli::Args& args) {
    zinf::config::LoadOptions lo;
    lo.overrides = args.get_list("set");
    lo.world_size = g_launch.world_size;
    // One rank reports the config's warnings; the others would repeat them.
    lo.log_warnings = g_launch.rank == 0;
    return zinf::config::load(args.get("config"), lo);
}

// What a run works with: the data, this rank's stack, the --trace recorder and the trainer.
// Members are destroyed in reverse order: the trainer before the engine and the data it borrows.
struct Session {
    zinf::Datasets data;
    zinf::TrainingStack stack;
    std::unique_ptr<zinf::TraceRecorder> trace;
    std::optional<zinf::Trainer> trainer;
};

// Set up: the data first (a missing dataset fails before gigabytes are allocated), then the
// stack (the device of device.type, the communicator of the launch's ranks) and its summary,
// --trace, --resume and the trainer. Returns 0, or the exit code of what failed (printed).
int set_up(const zinf::cli::Args& args, const Flags& flags,
           const zinf::config::EngineConfig& config, Session& s) {
    auto data = zinf::load_datasets(config);
    if (!data.has_value()) return fail("data", data.error());
    s.data = std::move(data).value();
    zinf::EngineOptions engine_options;
    engine_options.io_faults = flags.io_faults;
    auto stack = zinf::create_training_stack(config, g_launch, engine_options);
    if (!stack.has_value()) return fail("engine", stack.error());
    s.stack = std::move(stack).value();
    if (Status st = zinf::check_datasets(s.data, s.stack.model->batch_shape()); !st.is_ok()) {
        return fail("data", st);
    }
    zinf::Engine& engine = *s.stack.engine;
    std::printf("%s\n", engine.summary().c_str());
    if (args.given("trace")) {
        s.trace = std::make_unique<zinf::TraceRecorder>();
        engine.set_trace(s.trace.get());
    }
    if (args.given("resume")) {
        Status st = resume(engine, args.get("resume"));
        if (!st.is_ok()) return fail("--resume", st);
    }
    zinf::TrainerOptions to;
    to.max_steps = flags.max_steps;
    to.save_dir = args.get("save-dir");
    to.save_every = flags.save_every;
    to.evaluate_each_epoch = !args.get_switch("no-eval");
    to.eval_every = flags.eval_every;
    to.eval_samples = flags.eval_samples.value_or(config.data.eval_samples);
    to.trace = s.trace.get();
    auto trainer = zinf::Trainer::create(engine, *s.data.train, s.data.test.get(), to);
    if (!trainer.has_value()) return fail("data", trainer.error());
    s.trainer.emplace(std::move(trainer).value());
    return 0;
}

// The work: --eval-only's evaluation, or training.
int train_or_evaluate(const zinf::cli::Args& args, const Flags& flags,
                      const zinf::config::EngineConfig& config, Session& s) {
    zinf::Engine& engine = *s.stack.engine;
    if (args.get_switch("eval-only")) {
        const bool language_model = s.data.train_entropy.has_value();
        return evaluate_only(*s.trainer, engine, s.data.test != nullptr, language_model);
    }
    std::printf("data: %s, %zu training samples, %" PRIu64 " steps per epoch, %" PRIu64
                " steps to run (from step %" PRIu64 ")\n",
                config.data.dataset.c_str(), s.data.train->count(), s.trainer->steps_per_epoch(),
                s.trainer->total_steps(), engine.global_steps());
    return train(*s.trainer, args, flags, config, s.stack, s.data.train_entropy);
}

// After the work: the --trace file (one per rank), --predict, --measure-overlap.
int after_training(const zinf::cli::Args& args, const Flags& flags,
                   const zinf::config::EngineConfig& config, Session& s) {
    if (s.trace) {
        std::string path = args.get("trace");
        if (g_launch.rank != 0) path += ".rank" + std::to_string(g_launch.rank);
        if (Status st = s.trace->write(path); !st.is_ok()) return fail("--trace", st);
        std::printf("trace: %s (%zu spans%s)\n", path.c_str(), s.trace->size(),
                    g_launch.world_size > 1 ? "; other ranks: FILE.rank<r>" : "");
    }
    if (flags.predict > 0) {
        if (Status st = predict(*s.trainer, flags.predict, config, args.get("predict-png"));
            !st.is_ok()) {
            return fail("--predict", st);
        }
    }
    if (args.get_switch("measure-overlap")) {
        auto f = s.trainer->measure_overlap(flags.overlap_steps);
        if (!f.has_value()) return fail("--measure-overlap", f.error());
        print_overlap(*f, flags.overlap_steps);
    }
    return 0;
}

int run(int argc, char** argv) {
    zinf::cli::Args args(
        "zinfinity-train --config FILE [flags]",
        "Trains the model of a zinfinity/DeepSpeed-style config with zinf::Engine.\n"
        "On N ranks: mpirun -np N zinfinity-train --config FILE [flags] (Open MPI; as root set\n"
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1). Rank 0 prints; the\n"
        "config's batch is split over the ranks; see the comm block in docs/CONFIG.md.");
    declare_flags(args);
    if (auto exit_code = args.parse_or_exit(argc - 1, argv + 1, "zinfinity-train")) {
        return *exit_code;
    }
    if (args.get_switch("config-keys")) {
        std::printf("%s", zinf::config::key_table_markdown().c_str());
        return 0;
    }
    if (!args.given("config")) {
        std::fprintf(stderr, "zinfinity-train: --config FILE is required (see --help)\n");
        return 2;
    }
    auto loaded = load_config(args);
    if (!loaded.has_value()) return fail("config", loaded.error());
    const auto& config = *loaded;
    auto flags = check_flags(args);
    if (!flags.has_value()) return fail("arguments", flags.error());

    Session session;
    if (int rc = set_up(args, *flags, config, session); rc != 0) return rc;
    if (!session.data.description.empty()) {
        std::printf("data: %s\n", session.data.description.c_str());
    }
    if (args.given("generate")) {
        return generate_text(*session.stack.engine, args.get("generate"), *flags, config);
    }
    if (int rc = train_or_evaluate(args, *flags, config, session); rc != 0) return rc;
    return after_training(args, *flags, config, session);
}

}  // namespace

// The launch: one process, or rank r of an MPI job (mpirun -np N). With several ranks, rank 0
// prints the progress and the figures (the others' stdout is discarded, their errors and
// warnings keep their rank), and a rank that fails stops the whole job (MPI_Abort), so that no
// rank waits for it in a collective. A rank that fails removes its swap run directories as it
// returns from run(); one that the launcher stops with a signal, on the signal.
int main(int argc, char** argv) {
    // First, before MPI's threads and ours exist: they all inherit the blocked signals.
    if (Status s = zinf::cli::install_termination_watcher(remove_swap_on_termination); !s.is_ok()) {
        return fail("signals", s);
    }
#ifdef ZINF_TRAIN_HAVE_MPI
    auto launch = zinf::zero::detect_launch();
    if (!launch.has_value()) return fail("launch", launch.error());
    g_launch = {launch->rank, launch->world_size, launch->local_rank, launch->source};
    std::unique_ptr<zinf::zero::MpiSession> session;
    if (launch->under_mpi) {
        auto made = zinf::zero::MpiSession::init(&argc, &argv);
        if (!made.has_value()) return fail("MPI", made.error());
        session = std::move(*made);
        // MPI is authoritative; the launcher's variables must agree with it.
        if (launch->source != "PMIx" &&
            (session->rank() != launch->rank || session->world_size() != launch->world_size)) {
            return fail("launch",
                        Status::invalid_argument(zinf::str_cat(
                            launch->source, " says rank ", launch->rank, " of ", launch->world_size,
                            ", MPI says rank ", session->rank(), " of ", session->world_size())));
        }
        g_launch = {session->rank(), session->world_size(), session->local_rank(), launch->source};
    }
#else
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"}) {
        const char* n = std::getenv(v);
        if (n != nullptr && std::strcmp(n, "1") != 0 && std::strcmp(n, "") != 0) {
            return fail("launch", Status::not_supported(
                                      std::string(v) + "=" + n +
                                      ": this zinfinity-train was built without MPI (install "
                                      "libopenmpi-dev and rebuild): one rank only"));
        }
    }
#endif
    if (g_launch.world_size > 1) {
        zinf::log::set_line_prefix("rank " + std::to_string(g_launch.rank) + ": ");
        if (g_launch.rank != 0) {
            if (std::getenv("ZINF_LOG_LEVEL") == nullptr) {
                zinf::log::set_level(zinf::log::Level::kError);
            }
            if (std::freopen("/dev/null", "w", stdout) == nullptr) {
                return fail("stdout", Status::from_errno(errno, "reopen /dev/null"));
            }
        }
    }
    const int rc = run(argc, argv);
#ifdef ZINF_TRAIN_HAVE_MPI
    // A rank that failed ends the job (no rank may be left waiting in a collective). One that
    // stops because another failed leaves that to the failing rank, whose error would otherwise
    // race with the abort and, under load, be lost: it waits in MPI_Finalize until that rank's
    // abort ends the job.
    if (rc != 0 && g_launch.world_size > 1 && !g_failed_for_a_peer) {
        zinf::zero::MpiSession::abort_job(rc);
    }
#endif
    return rc;
}
