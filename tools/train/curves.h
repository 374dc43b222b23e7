// The picture behind `zinfinity-train --plot FILE.svg`: the figures the progress line and the
// periodic print show, per optimizer step (loss, learning rate, samples/s, I/O GB/s) and per
// evaluation (its loss), drawn as one SVG document of four panels over the step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/engine/trainer.h"

namespace zinf::train {

// Every polyline of the document has data-series (one of the names below) and data-points (its
// number of points), so that a reader or a test finds each series.
inline constexpr const char* kSeriesLoss = "loss";
inline constexpr const char* kSeriesEvalLoss = "eval_loss";
inline constexpr const char* kSeriesLr = "lr";
inline constexpr const char* kSeriesSamples = "samples_per_second";
inline constexpr const char* kSeriesRead = "read_gb_per_second";
inline constexpr const char* kSeriesWrite = "write_gb_per_second";

// Records the figures as the trainer reports them (its observer). Allocates per step (a few
// doubles); not thread-safe.
class CurveRecorder final : public TrainerObserver {
public:
    void on_step_figures(const StepFigures& f) override;
    void on_evaluation_figures(const EvaluationFigures& f) override;

    std::size_t steps() const noexcept { return steps_.size(); }
    // The SVG document: panels loss (and the evaluations' loss, dashed), learning rate, samples/s
    // and I/O GB/s (read and written), over the optimizer step. `title` heads it.
    std::string render_svg(const std::string& title) const;

private:
    std::vector<double> steps_;
    std::vector<double> loss_;
    std::vector<double> lr_;
    std::vector<double> samples_per_second_;
    std::vector<double> read_gb_per_second_;
    std::vector<double> write_gb_per_second_;
    std::vector<double> eval_steps_;
    std::vector<double> eval_loss_;
    bool eval_on_test_ = false;
};

// Checks, before training, that `path` can be written: not a directory, in an existing writable
// directory. Errors: kInvalidArgument naming --plot and the path.
Status check_plot_path(const std::string& path);
// Writes `text` to `path` (replacing it). Errors: kIo naming the path.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace zinf::train
