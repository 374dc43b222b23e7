// A progress line on stderr for long runs: shown only after two seconds, redrawn at most four
// times a second, with percentage, rate and ETA; erased when done.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace zinf::cli {

class Progress {
public:
    // `total` units of work (bytes, steps); `unit_label` e.g. "GB" with `unit_scale` 1e9.
    Progress(std::string label, double total, std::string unit_label, double unit_scale);
    ~Progress();
    // Reports that `done` units of the total are complete. Cheap when nothing is drawn.
    void update(double done, const std::string& extra = "");
    // Erases the line if one is drawn (before other output to the terminal); the next update
    // draws it again.
    void clear_line();
    void finish();

private:
    std::string label_;
    double total_;
    std::string unit_label_;
    double unit_scale_;
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_draw_;
    bool drawn_ = false;
    bool finished_ = false;
};

}  // namespace zinf::cli
