// zinfinity-train --plot's picture: a well-formed SVG with one polyline per series, each found
// by its data-series and holding one point per recorded step (or evaluation); the linear x
// axis of the shared SVG writer; the path checked before training.
#include "tools/train/curves.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "tests/support/test_seed.h"
#include "tests/tools/svg_check.h"
#include "tools/cli/svg_plot.h"

namespace zinf {
namespace {

std::map<std::string, std::size_t> points_by_series(const test::SvgDocument& doc) {
    std::map<std::string, std::size_t> out;
    for (const auto& p : doc.polylines) {
        const std::size_t n = test::SvgDocument::point_count(p);
        EXPECT_EQ(p.at("data-points"), std::to_string(n)) << p.at("data-series");
        out[p.at("data-series")] = n;
    }
    return out;
}

TEST(Curves, EverySeriesHasAPointPerStepInAWellFormedSvg) {
    train::CurveRecorder curves;
    for (std::uint64_t step = 1; step <= 7; ++step) {
        StepFigures f;
        f.step = step;
        f.loss = 2.0f / static_cast<float>(step);
        f.lr = 1e-3 * static_cast<double>(step);
        f.samples_per_second = 1000.0 + static_cast<double>(step);
        f.read_gb_per_second = 0.5;
        f.write_gb_per_second = 0.25;
        curves.on_step_figures(f);
    }
    for (const std::uint64_t step : {3, 7}) {
        EvaluationFigures e;
        e.step = step;
        e.loss = 1.0;
        e.test = true;
        curves.on_evaluation_figures(e);
    }
    EXPECT_EQ(curves.steps(), 7u);
    const std::string svg = curves.render_svg("run <a & b>");
    const test::SvgDocument doc = test::check_svg(svg);
    ASSERT_EQ(doc.error, "") << svg.substr(0, 2000);
    ASSERT_EQ(doc.polylines.size(), 6u);
    const auto points = points_by_series(doc);
    EXPECT_EQ(points, (std::map<std::string, std::size_t>{{train::kSeriesLoss, 7},
                                                          {train::kSeriesEvalLoss, 2},
                                                          {train::kSeriesLr, 7},
                                                          {train::kSeriesSamples, 7},
                                                          {train::kSeriesRead, 7},
                                                          {train::kSeriesWrite, 7}}));
    EXPECT_NE(svg.find("run &lt;a &amp; b&gt;"), std::string::npos);
}

TEST(Curves, WithoutEvaluationsTheLossPanelHasOneSeries) {
    train::CurveRecorder curves;
    StepFigures f;
    f.step = 1;
    curves.on_step_figures(f);
    const test::SvgDocument doc = test::check_svg(curves.render_svg("one step"));
    ASSERT_EQ(doc.error, "");
    EXPECT_EQ(doc.polylines.size(), 5u);
    for (const auto& p : doc.polylines) EXPECT_EQ(test::SvgDocument::point_count(p), 1u);
}

// On a linear axis equal steps are equally spaced, and x = 0 is drawable (it is not on log2).
TEST(SvgPlot, LinearXAxisSpacesStepsEvenly) {
    cli::PlotPanel panel;
    panel.title = "p";
    cli::PlotSeries s;
    s.attributes = {{"series", "s"}};
    s.points = {{0, 1}, {10, 2}, {20, 3}};
    panel.series.push_back(s);
    cli::PlotOptions options;
    options.x_scale = cli::XScale::kLinear;
    const test::SvgDocument doc = test::check_svg(cli::render_svg_plot(options, {panel}));
    ASSERT_EQ(doc.error, "");
    ASSERT_EQ(doc.polylines.size(), 1u);
    std::istringstream in(doc.polylines[0].at("points"));
    std::vector<double> xs;
    for (std::string pair; in >> pair;) xs.push_back(std::stod(pair.substr(0, pair.find(','))));
    ASSERT_EQ(xs.size(), 3u);
    EXPECT_NEAR(xs[1] - xs[0], xs[2] - xs[1], 0.11);
    EXPECT_GT(xs[1], xs[0]);
    options.x_scale = cli::XScale::kLog2;  // x = 0 is left out on a log2 axis
    const test::SvgDocument log2 = test::check_svg(cli::render_svg_plot(options, {panel}));
    EXPECT_EQ(test::SvgDocument::point_count(log2.polylines.at(0)), 2u);
}

TEST(Curves, PlotPathIsCheckedBeforeTraining) {
    test::TempDir dir("curves");
    EXPECT_TRUE(train::check_plot_path(dir.file("plot.svg")).is_ok());
    const Status missing = train::check_plot_path(dir.file("no/such/dir/plot.svg"));
    EXPECT_FALSE(missing.is_ok());
    EXPECT_NE(missing.to_string().find("--plot"), std::string::npos) << missing.to_string();
    EXPECT_FALSE(train::check_plot_path(dir.path()).is_ok());
    EXPECT_FALSE(train::check_plot_path("").is_ok());
}

}  // namespace
}  // namespace zinf
