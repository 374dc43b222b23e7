// CurveRecorder: the --plot figures, kept per step and drawn with the shared SVG writer.
#include "tools/train/curves.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "src/base/file.h"
#include "tools/cli/svg_plot.h"

namespace zinf::train {
namespace {

cli::PlotSeries series_of(const char* name, const std::string& label, int color,
                          const std::vector<double>& xs, const std::vector<double>& ys) {
    ZINF_ASSERT(xs.size() == ys.size());
    cli::PlotSeries s;
    s.label = label;
    s.color = color;
    s.attributes = {{"series", name}, {"points", std::to_string(xs.size())}};
    s.points.reserve(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) s.points.emplace_back(xs[i], ys[i]);
    return s;
}

std::string format_step(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", x);
    return buf;
}

}  // namespace

void CurveRecorder::on_step_figures(const StepFigures& f) {
    steps_.push_back(static_cast<double>(f.step));
    loss_.push_back(static_cast<double>(f.loss));
    lr_.push_back(f.lr);
    samples_per_second_.push_back(f.samples_per_second);
    read_gb_per_second_.push_back(f.read_gb_per_second);
    write_gb_per_second_.push_back(f.write_gb_per_second);
}

void CurveRecorder::on_evaluation_figures(const EvaluationFigures& f) {
    eval_steps_.push_back(static_cast<double>(f.step));
    eval_loss_.push_back(f.loss);
    eval_on_test_ = f.test;
}

std::string CurveRecorder::render_svg(const std::string& title) const {
    std::vector<cli::PlotPanel> panels(4);
    panels[0].title = "loss";
    panels[0].y_label = "loss";
    panels[0].series.push_back(series_of(kSeriesLoss, "training", 0, steps_, loss_));
    if (!eval_steps_.empty()) {
        cli::PlotSeries eval =
            series_of(kSeriesEvalLoss, eval_on_test_ ? "validation" : "eval (train set)", 1,
                      eval_steps_, eval_loss_);
        eval.dashed = true;
        panels[0].series.push_back(std::move(eval));
    }
    panels[1].title = "learning rate";
    panels[1].y_label = "lr";
    panels[1].series.push_back(series_of(kSeriesLr, "lr", 2, steps_, lr_));
    panels[2].title = "throughput";
    panels[2].y_label = "samples/s";
    panels[2].series.push_back(
        series_of(kSeriesSamples, "samples/s", 3, steps_, samples_per_second_));
    panels[3].title = "I/O of the offloaded states";
    panels[3].y_label = "GB/s";
    panels[3].series.push_back(series_of(kSeriesRead, "read", 0, steps_, read_gb_per_second_));
    panels[3].series.push_back(series_of(kSeriesWrite, "written", 1, steps_, write_gb_per_second_));
    cli::PlotOptions options;
    options.title = title;
    options.x_label = "optimizer step";
    options.columns = 2;
    options.x_scale = cli::XScale::kLinear;
    options.format_x = format_step;
    return cli::render_svg_plot(options, panels);
}

Status check_plot_path(const std::string& path) {
    if (path.empty()) return Status::invalid_argument("--plot: empty path");
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        return Status::invalid_argument("--plot: " + path + " is a directory; name a file");
    }
    const auto slash = path.find_last_of('/');
    const std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    return check_writable_directory(dir).with_context("--plot " + path);
}

Status write_text_file(const std::string& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return Status::from_errno(errno, "open " + path);
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const int write_errno = errno;
    if (std::fclose(f) != 0 || !written) {
        return Status::io_error("write " + path, written ? EIO : write_errno);
    }
    return Status::ok();
}

}  // namespace zinf::train
