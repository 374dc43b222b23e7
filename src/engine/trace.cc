// Chrome trace output.
#include "src/engine/trace.h"

#include <cerrno>
#include <cstdio>

namespace zinf {

TraceRecorder::TraceRecorder(std::size_t capacity) : origin_(Clock::now()), capacity_(capacity) {
    spans_.reserve(capacity);
}

void TraceRecorder::span(const char* name, const char* category, Clock::time_point start,
                         Clock::time_point end, int lane) noexcept {
    const auto us = [&](Clock::time_point t) {
        return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
    };
    std::lock_guard lock(mutex_);
    if (spans_.size() >= capacity_) {
        ++dropped_;
        return;
    }
    spans_.push_back({name, category, us(start), us(end) - us(start), lane});
}

std::size_t TraceRecorder::size() const noexcept {
    std::lock_guard lock(mutex_);
    return spans_.size();
}

Status TraceRecorder::write(const std::string& path) const {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return Status::from_errno(errno, "trace: open " + path);
    std::lock_guard lock(mutex_);
    std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    static const char* const kLanes[] = {"compute", "io", "optimizer", "prefetch", "data"};
    for (int lane = 0; lane < 5; ++lane) {
        std::fprintf(f,
                     "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                     "\"args\":{\"name\":\"%s\"}}\n",
                     lane == 0 ? "" : ",", lane, kLanes[lane]);
    }
    for (const auto& s : spans_) {
        std::fprintf(f,
                     ",{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,"
                     "\"pid\":1,\"tid\":%d}\n",
                     s.name, s.category, static_cast<long long>(s.start_us),
                     static_cast<long long>(s.duration_us), s.lane);
    }
    std::fprintf(f, "]}\n");
    const bool failed = std::ferror(f) != 0;
    if (std::fclose(f) != 0 || failed) return Status::io_error("trace: write " + path, EIO);
    return Status::ok();
}

}  // namespace zinf
