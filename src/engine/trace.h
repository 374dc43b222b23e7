// TraceRecorder: spans (name, category, start, duration, thread lane) collected during a run and
// written as a Chrome trace (JSON "traceEvents", viewable in Perfetto or chrome://tracing).
// Spans are kept in a vector reserved at creation; when it is full, further spans are counted
// and dropped rather than growing it on the hot path.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "src/base/status.h"

namespace zinf {

class TraceRecorder {
public:
    using Clock = std::chrono::steady_clock;
    // `capacity` spans at most; names and categories must be string literals (kept as pointers).
    explicit TraceRecorder(std::size_t capacity = 1 << 20);

    Clock::time_point now() const noexcept { return Clock::now(); }
    // Thread-safe. `lane` separates rows in the viewer (0: compute, 1: I/O, 2: optimizer...).
    void span(const char* name, const char* category, Clock::time_point start,
              Clock::time_point end, int lane = 0) noexcept;
    std::size_t size() const noexcept;
    std::uint64_t dropped() const noexcept { return dropped_; }
    // Writes the Chrome trace JSON to `path`. Errors: kIo.
    Status write(const std::string& path) const;

private:
    struct Span {
        const char* name;
        const char* category;
        std::int64_t start_us;
        std::int64_t duration_us;
        int lane;
    };
    Clock::time_point origin_;
    std::size_t capacity_;
    mutable std::mutex mutex_;
    std::vector<Span> spans_;
    std::uint64_t dropped_ = 0;
};

// Records a span from construction to destruction (or end()) when a recorder is given.
class TraceScope {
public:
    TraceScope(TraceRecorder* recorder, const char* name, const char* category,
               int lane = 0) noexcept
        : recorder_(recorder),
          name_(name),
          category_(category),
          lane_(lane),
          start_(TraceRecorder::Clock::now()) {}
    ~TraceScope() { end(); }
    TraceScope(const TraceScope&) = delete;
    TraceScope& operator=(const TraceScope&) = delete;
    // Seconds since construction; records the span once.
    double end() noexcept {
        const auto t = TraceRecorder::Clock::now();
        if (!ended_ && recorder_ != nullptr) recorder_->span(name_, category_, start_, t, lane_);
        ended_ = true;
        return std::chrono::duration<double>(t - start_).count();
    }

private:
    TraceRecorder* recorder_;
    const char* name_;
    const char* category_;
    int lane_;
    TraceRecorder::Clock::time_point start_;
    bool ended_ = false;
};

}  // namespace zinf
