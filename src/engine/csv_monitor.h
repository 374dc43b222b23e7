// DeepSpeed's CSV monitor (the `csv_monitor` block), with DeepSpeed's file layout so that scripts
// written for it read zinfinity's files: one CSV file per event in <output_path>/<job_name>/,
// named after the event ("Train/Samples/train_loss" -> Train_Samples_train_loss.csv), a header
// row `step,<last part of the event name>`, then one `<global samples>,<value>` row per event,
// lines ended by "\r\n" and numbers written as Python writes them (csv.writer, repr).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "src/base/config.h"
#include "src/base/status.h"

namespace zinf {

struct StepFigures;

// The events, named as DeepSpeed's engine names them (deepspeed/runtime/engine.py, and
// pipe/engine.py for eval_loss).
inline constexpr std::string_view kCsvTrainLoss = "Train/Samples/train_loss";
inline constexpr std::string_view kCsvLr = "Train/Samples/lr";
inline constexpr std::string_view kCsvLossScale = "Train/Samples/loss_scale";
inline constexpr std::string_view kCsvEvalLoss = "Train/Samples/eval_loss";

// The file an event goes to: its name with '/' and ' ' replaced by '_', plus ".csv".
std::string csv_event_file_name(std::string_view event);
// The header's value column: the event name's last '/'-separated part.
std::string csv_event_header(std::string_view event);
// A double as Python's repr(float) writes it: the shortest digits that read back to the same
// double; positional for decimal exponents in [-4, 16) with at least one digit after the point
// ("2.0", "0.0001"), else scientific with a two-digit exponent at least ("1e-05", "1e+16").
std::string python_float_repr(double value);

// Writes the events of one run. Used on rank 0 only (the caller's choice, as DeepSpeed's).
// Not thread-safe; allocates when it writes (once per optimizer step, off the I/O hot path).
class CsvMonitor {
public:
    // Creates <output_path>/<job_name>/ (and its parents) and checks that it is writable, before
    // training. `train_batch_size` is the samples of one optimizer step over all ranks; `gas` the
    // micro-steps per step. Errors: kInvalidArgument (or the errno's code) naming the directory
    // and csv_monitor.output_path.
    static Result<std::unique_ptr<CsvMonitor>> create(const config::CsvMonitorConfig& config,
                                                      std::uint64_t train_batch_size,
                                                      std::uint64_t gas, bool fp16);
    CsvMonitor(const CsvMonitor&) = delete;
    CsvMonitor& operator=(const CsvMonitor&) = delete;

    const std::string& directory() const noexcept { return directory_; }

    // Every micro-step's loss, in order: the window's train_loss sums loss / gas in fp32 as
    // DeepSpeed's engine does (the loss unscaled when gas is 1).
    void add_micro_loss(float loss);
    // After an optimizer step: train_loss at the samples before the step (DeepSpeed writes it
    // in backward, before the step counts its samples), then lr (the next step's rate) and, with
    // fp16, loss_scale, at the samples after it. Errors: kIo naming the file.
    Status write_step(const StepFigures& f);
    // After an evaluation: eval_loss at the samples so far. Errors: kIo naming the file.
    Status write_evaluation(double loss, std::uint64_t global_samples);

private:
    CsvMonitor(std::string directory, std::uint64_t train_batch_size, std::uint64_t gas, bool fp16);
    Status write(std::string_view event, std::uint64_t x, const std::string& value);
    Status flush();

    std::string directory_;
    std::uint64_t train_batch_size_ = 0;
    std::uint64_t gas_ = 1;
    bool fp16_ = false;
    float window_loss_ = 0;
    bool window_started_ = false;
    // The loss scale is a Python int in DeepSpeed's scaler until it first changes.
    double first_loss_scale_ = 0;
    bool loss_scale_changed_ = false;
    bool loss_scale_seen_ = false;
    // Open files by event file name; each gets its header on this process's first row, as
    // DeepSpeed's (which appends to a file left by an earlier run).
    struct FileCloser {
        void operator()(std::FILE* f) const noexcept { std::fclose(f); }
    };
    std::map<std::string, std::unique_ptr<std::FILE, FileCloser>, std::less<>> files_;
};

}  // namespace zinf
