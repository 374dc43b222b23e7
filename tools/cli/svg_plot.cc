// The SVG writer of svg_plot.h: fixed-size panels laid out in a grid, a shared legend per panel.
#include "tools/cli/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string_view>

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

void render_panel(std::string& out, const PlotOptions& options, const PlotPanel& panel, double ox,
                  double oy) {
    const double left = ox + kMarginLeft;
    const double top = oy + kMarginTop;
    const double width = kPanelWidth - kMarginLeft - kMarginRight;
    const double height = kPanelHeight - kMarginTop - kMarginBottom;
    std::set<double> xs;
    double y_max = 0;
    for (const auto& s : panel.series) {
        for (const auto& [x, y] : s.points) {
            if (x > 0) xs.insert(x);
            y_max = std::max(y_max, y);
        }
    }
    const auto [axis_top, y_step] = nice_axis(y_max);
    const double y_top = axis_top;  // a variable, not a binding: the lambdas below capture it
    const double lx_min = xs.empty() ? 0 : std::log2(*xs.begin());
    const double lx_max = xs.empty() ? 1 : std::log2(*xs.rbegin());
    const auto px = [&](double x) {
        if (lx_max <= lx_min) return left + width / 2;
        return left + (std::log2(x) - lx_min) / (lx_max - lx_min) * width;
    };
    const auto py = [&](double y) { return top + height - y / y_top * height; };

    out += "<g class=\"panel\" data-title=\"" + xml_escape(panel.title) + "\">\n";
    out += "<text x=\"" + fmt(left + width / 2) + "\" y=\"" + fmt(oy + 20) +
           "\" text-anchor=\"middle\" font-weight=\"bold\">" + xml_escape(panel.title) +
           "</text>\n";
    out += "<rect x=\"" + fmt(left) + "\" y=\"" + fmt(top) + "\" width=\"" + fmt(width) +
           "\" height=\"" + fmt(height) + "\" fill=\"none\" stroke=\"#444\"/>\n";
    for (double y = 0; y <= y_top + y_step / 2; y += y_step) {
        out += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(py(y)) + "\" x2=\"" +
               fmt(left + width) + "\" y2=\"" + fmt(py(y)) + "\" stroke=\"#ddd\"/>\n";
        out += "<text x=\"" + fmt(left - 6) + "\" y=\"" + fmt(py(y) + 4) +
               "\" text-anchor=\"end\">" + xml_escape(default_format(std::round(y * 1000) / 1000)) +
               "</text>\n";
    }
    for (const double x : xs) {
        const std::string label =
            options.format_x != nullptr ? options.format_x(x) : default_format(x);
        out += "<line x1=\"" + fmt(px(x)) + "\" y1=\"" + fmt(top + height) + "\" x2=\"" +
               fmt(px(x)) + "\" y2=\"" + fmt(top + height + 4) + "\" stroke=\"#444\"/>\n";
        out += "<text x=\"" + fmt(px(x)) + "\" y=\"" + fmt(top + height + 18) +
               "\" text-anchor=\"middle\">" + xml_escape(label) + "</text>\n";
    }
    out += "<text x=\"" + fmt(left + width / 2) + "\" y=\"" + fmt(oy + kPanelHeight - 8) +
           "\" text-anchor=\"middle\">" + xml_escape(options.x_label) + "</text>\n";
    out += "<text transform=\"translate(" + fmt(ox + 14) + "," + fmt(top + height / 2) +
           ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(options.y_label) + "</text>\n";
    double legend_y = top + 4;
    for (const auto& s : panel.series) {
        const std::string_view colour =
            kPalette[static_cast<std::size_t>(s.color) % std::size(kPalette)];
        std::string points;
        for (const auto& [x, y] : s.points) {
            if (x <= 0) continue;
            if (!points.empty()) points += ' ';
            points += fmt(px(x)) + "," + fmt(py(y));
        }
        out += "<polyline class=\"series\"";
        for (const auto& [key, value] : s.attributes)
            out += " data-" + key + "=\"" + xml_escape(value) + "\"";
        out += " fill=\"none\" stroke=\"" + std::string(colour) + "\" stroke-width=\"2\"";
        if (s.dashed) out += " stroke-dasharray=\"6 4\"";
        out += " points=\"" + points + "\"><title>" + xml_escape(s.label) + "</title></polyline>\n";
        const double lx = left + width + 10;
        out += "<line x1=\"" + fmt(lx) + "\" y1=\"" + fmt(legend_y) + "\" x2=\"" + fmt(lx + 24) +
               "\" y2=\"" + fmt(legend_y) + "\" stroke=\"" + std::string(colour) +
               "\" stroke-width=\"2\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
        out += "<text x=\"" + fmt(lx + 30) + "\" y=\"" + fmt(legend_y + 4) + "\">" +
               xml_escape(s.label) + "</text>\n";
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
