// Progress: a self-erasing status line on stderr for runs longer than two seconds.
#include "tools/cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace zinf::cli {

using Clock = std::chrono::steady_clock;

Progress::Progress(std::string label, double total, std::string unit_label, double unit_scale)
    : label_(std::move(label)),
      total_(total),
      unit_label_(std::move(unit_label)),
      unit_scale_(unit_scale),
      start_(Clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
    finish();
}

void Progress::update(double done, const std::string& extra) {
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed < 2.0 || now - last_draw_ < std::chrono::milliseconds(250)) return;
    last_draw_ = now;
    const double rate = done / elapsed;
    const double remaining = rate > 0 ? (total_ - done) / rate : 0;
    const double pct = total_ > 0 ? 100.0 * done / total_ : 0;
    std::fprintf(stderr, "\r%s %5.1f%% %.2f/%.2f %s  %.2f %s/s  ETA %.0fs %s\033[K", label_.c_str(),
                 pct, done / unit_scale_, total_ / unit_scale_, unit_label_.c_str(),
                 rate / unit_scale_, unit_label_.c_str(), remaining, extra.c_str());
    std::fflush(stderr);
    drawn_ = true;
}

void Progress::clear_line() {
    if (!drawn_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
}

void Progress::finish() {
    if (finished_) return;
    finished_ = true;
    clear_line();
}

}  // namespace zinf::cli
