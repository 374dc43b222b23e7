// A small SVG line-chart writer shared by zinfinity-bench (its grids, over a log2 x axis) and
// zinfinity-train (--plot): panels of lines, one standalone document.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zinf::cli {

struct PlotSeries {
    std::string label;    // legend text, e.g. "ours qd 8"
    int color = 0;        // index into the palette (one colour per queue depth)
    bool dashed = false;  // the reference (fio) is dashed, ours solid
    // Written as data-* attributes of the <polyline>, so a reader (or a test) can find a series.
    std::vector<std::pair<std::string, std::string>> attributes;
    std::vector<std::pair<double, double>> points;  // (x, y); x > 0 on a log2 axis
};

struct PlotPanel {
    std::string title;
    std::string y_label;  // empty: PlotOptions::y_label
    std::vector<PlotSeries> series;
};

enum class XScale : std::uint8_t {
    kLog2,    // the x values present in the data are the ticks (sizes, queue depths)
    kLinear,  // evenly spaced "nice" ticks over [min x, max x] (steps)
};

struct PlotOptions {
    std::string title;
    std::string x_label;
    std::string y_label;  // each panel's own when it gives one
    int columns = 2;
    XScale x_scale = XScale::kLog2;
    // Formats an x tick value.
    std::string (*format_x)(double) = nullptr;
};

// Renders the panels into one standalone SVG document (UTF-8, no external references).
std::string render_svg_plot(const PlotOptions& options, const std::vector<PlotPanel>& panels);

// `text` with &, <, >, " and ' escaped for XML.
std::string xml_escape(const std::string& text);

}  // namespace zinf::cli
