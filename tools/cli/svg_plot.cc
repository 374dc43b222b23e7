// The SVG writer of svg_plot.h: fixed-size panels laid out in a grid, a shared legend per panel.
#include "tools/cli/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string_view>
#include <tuple>

namespace zinf::cli {
namespace {

constexpr double kPanelWidth = 460;
constexpr double kPanelHeight = 300;
constexpr double kMarginLeft = 58;
constexpr double kMarginRight = 130;  // legend
constexpr double kMarginTop = 34;
constexpr double kMarginBottom = 44;
constexpr double kTitleHeight = 36;
constexpr std::string_view kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                         "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
}

std::string default_format(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// A tick value without the rounding noise of repeated addition (0.30000000000000004).
double round_tick(double v, double step) {
    if (step <= 0) return v;
    return std::round(v / step * 1000) / 1000 * step;
}

// A "nice" upper bound and tick step for [0, max].
std::pair<double, double> nice_axis(double max) {
    if (max <= 0) return {1, 0.2};
    const double raw = max / 5;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
        if (raw <= m * mag) {
            step = m * mag;
            break;
        }
    }
    return {std::ceil(max / step) * step, step};
}

// Where a panel's data lands: the plot area and the mapping of data to pixels.
struct Frame {
    double left = 0;
    double top = 0;
    double width = 0;
    double height = 0;
    XScale x_scale = XScale::kLog2;
    double x_min = 0;  // log2(x) on a log2 axis
    double x_max = 1;
    double y_top = 1;
    double y_step = 0.2;

    double px(double x) const {
        const double v = x_scale == XScale::kLog2 ? std::log2(x) : x;
        if (x_max <= x_min) return left + width / 2;
        return left + (v - x_min) / (x_max - x_min) * width;
    }
    double py(double y) const { return top + height - y / y_top * height; }
    // A point that can be drawn: finite, and positive on a log2 axis.
    bool drawable(double x, double y) const {
        return std::isfinite(x) && std::isfinite(y) && (x_scale == XScale::kLinear || x > 0);
    }
};

// The frame of a panel at (ox, oy), and its x ticks: on a log2 axis the x values of the data,
// on a linear one evenly spaced "nice" values within the data's range.
Frame frame_of(const PlotOptions& options, const PlotPanel& panel, double ox, double oy,
               std::vector<double>& x_ticks) {
    Frame f;
    f.left = ox + kMarginLeft;
    f.top = oy + kMarginTop;
    f.width = kPanelWidth - kMarginLeft - kMarginRight;
    f.height = kPanelHeight - kMarginTop - kMarginBottom;
    f.x_scale = options.x_scale;
    std::set<double> xs;
    double y_max = 0;
    for (const auto& s : panel.series) {
        for (const auto& [x, y] : s.points) {
            if (!f.drawable(x, y)) continue;
            xs.insert(x);
            y_max = std::max(y_max, y);
        }
    }
    std::tie(f.y_top, f.y_step) = nice_axis(y_max);
    x_ticks.clear();
    if (xs.empty()) return f;
    if (f.x_scale == XScale::kLog2) {
        f.x_min = std::log2(*xs.begin());
        f.x_max = std::log2(*xs.rbegin());
        x_ticks.assign(xs.begin(), xs.end());
        return f;
    }
    f.x_min = *xs.begin();
    f.x_max = *xs.rbegin();
    const double step = nice_axis(f.x_max - f.x_min).second;
    if (f.x_max <= f.x_min) {
        x_ticks.push_back(f.x_min);
        return f;
    }
    // At most a handful of ticks: nice_axis gives about five steps over the range.
    for (double x = std::ceil(f.x_min / step) * step; x <= f.x_max + step * 1e-9; x += step) {
        x_ticks.push_back(x);
    }
    return f;
}

// The panel's title, box, grid lines, tick labels and axis labels.
void render_axes(std::string& out, const PlotOptions& options, const PlotPanel& panel,
                 const Frame& f, const std::vector<double>& x_ticks, double ox, double oy) {
    out += "<text x=\"" + fmt(f.left + f.width / 2) + "\" y=\"" + fmt(oy + 20) +
           "\" text-anchor=\"middle\" font-weight=\"bold\">" + xml_escape(panel.title) +
           "</text>\n";
    out += "<rect x=\"" + fmt(f.left) + "\" y=\"" + fmt(f.top) + "\" width=\"" + fmt(f.width) +
           "\" height=\"" + fmt(f.height) + "\" fill=\"none\" stroke=\"#444\"/>\n";
    for (double y = 0; y <= f.y_top + f.y_step / 2; y += f.y_step) {
        out += "<line x1=\"" + fmt(f.left) + "\" y1=\"" + fmt(f.py(y)) + "\" x2=\"" +
               fmt(f.left + f.width) + "\" y2=\"" + fmt(f.py(y)) + "\" stroke=\"#ddd\"/>\n";
        out += "<text x=\"" + fmt(f.left - 6) + "\" y=\"" + fmt(f.py(y) + 4) +
               "\" text-anchor=\"end\">" + xml_escape(default_format(round_tick(y, f.y_step))) +
               "</text>\n";
    }
    const double bottom = f.top + f.height;
    for (const double x : x_ticks) {
        const std::string label =
            options.format_x != nullptr ? options.format_x(x) : default_format(x);
        out += "<line x1=\"" + fmt(f.px(x)) + "\" y1=\"" + fmt(bottom) + "\" x2=\"" + fmt(f.px(x)) +
               "\" y2=\"" + fmt(bottom + 4) + "\" stroke=\"#444\"/>\n";
        out += "<text x=\"" + fmt(f.px(x)) + "\" y=\"" + fmt(bottom + 18) +
               "\" text-anchor=\"middle\">" + xml_escape(label) + "</text>\n";
    }
    const std::string& y_label = panel.y_label.empty() ? options.y_label : panel.y_label;
    out += "<text x=\"" + fmt(f.left + f.width / 2) + "\" y=\"" + fmt(oy + kPanelHeight - 8) +
           "\" text-anchor=\"middle\">" + xml_escape(options.x_label) + "</text>\n";
    out += "<text transform=\"translate(" + fmt(ox + 14) + "," + fmt(f.top + f.height / 2) +
           ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(y_label) + "</text>\n";
}

// One series: its polyline (with its data-* attributes) and its legend entry.
void render_series(std::string& out, const PlotSeries& s, const Frame& f, double legend_y) {
    const std::string colour(kPalette[static_cast<std::size_t>(s.color) % std::size(kPalette)]);
    std::string points;
    for (const auto& [x, y] : s.points) {
        if (!f.drawable(x, y)) continue;
        if (!points.empty()) points += ' ';
        points += fmt(f.px(x)) + "," + fmt(f.py(y));
    }
    out += "<polyline class=\"series\"";
    for (const auto& [key, value] : s.attributes) {
        out += " data-" + key + "=\"" + xml_escape(value) + "\"";
    }
    out += " fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"2\"";
    if (s.dashed) out += " stroke-dasharray=\"6 4\"";
    out += " points=\"" + points + "\"><title>" + xml_escape(s.label) + "</title></polyline>\n";
    const double lx = f.left + f.width + 10;
    out += "<line x1=\"" + fmt(lx) + "\" y1=\"" + fmt(legend_y) + "\" x2=\"" + fmt(lx + 24) +
           "\" y2=\"" + fmt(legend_y) + "\" stroke=\"" + colour + "\" stroke-width=\"2\"" +
           (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
    out += "<text x=\"" + fmt(lx + 30) + "\" y=\"" + fmt(legend_y + 4) + "\">" +
           xml_escape(s.label) + "</text>\n";
}

void render_panel(std::string& out, const PlotOptions& options, const PlotPanel& panel, double ox,
                  double oy) {
    std::vector<double> x_ticks;
    const Frame f = frame_of(options, panel, ox, oy, x_ticks);
    out += "<g class=\"panel\" data-title=\"" + xml_escape(panel.title) + "\">\n";
    render_axes(out, options, panel, f, x_ticks, ox, oy);
    double legend_y = f.top + 4;
    for (const auto& s : panel.series) {
        render_series(out, s, f, legend_y);
        legend_y += 16;
    }
    out += "</g>\n";
}

}  // namespace

std::string xml_escape(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (const char ch : text) {
        switch (ch) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&apos;";
                break;
            default:
                out += ch;
        }
    }
    return out;
}

std::string render_svg_plot(const PlotOptions& options, const std::vector<PlotPanel>& panels) {
    const int columns = std::max(1, options.columns);
    const int rows = std::max<int>(1, (static_cast<int>(panels.size()) + columns - 1) / columns);
    const double width = kPanelWidth * columns;
    const double height = kTitleHeight + kPanelHeight * rows;
    std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt(width) + "\" height=\"" +
           fmt(height) + "\" viewBox=\"0 0 " + fmt(width) + " " + fmt(height) +
           "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    out += "<text x=\"" + fmt(width / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" +
           xml_escape(options.title) + "</text>\n";
    for (std::size_t i = 0; i < panels.size(); ++i) {
        const double ox = kPanelWidth * static_cast<double>(static_cast<int>(i) % columns);
        const int row = static_cast<int>(i) / columns;
        const double oy = kTitleHeight + kPanelHeight * static_cast<double>(row);
        render_panel(out, options, panels[i], ox, oy);
    }
    out += "</svg>\n";
    return out;
}

}  // namespace zinf::cli
