// io::Seams: fault-injection points where a backend meets the kernel, for tests that must reach
// paths the kernel seldom takes: the raw result of each transfer. Options, not test macros
// (STYLE.md §9): null, the default, costs one branch per call. Set through BackendOptions::seams
// or EngineOptions::seams.
#pragma once

#include <cstddef>

namespace zinf::io {

struct Request;

struct Seams {
    // Called with each transfer's raw result (bytes moved, or -errno) before the backend
    // classifies it (io/detail/completion.h); the backend goes on with what it returns, which
    // must be a result the kernel could give for that transfer (no more bytes than asked).
    // io_uring, libaio and sim call it on the owning thread, posix on its helper threads.
    long (*result)(void* context, const Request& request, long result) noexcept = nullptr;
    void* context = nullptr;  // borrowed; must outlive the backends
};

// The result a backend goes on with: `result` passed through seams.result, if set.
inline long seam_result(const Seams& seams, const Request& request, long result) noexcept {
    return seams.result == nullptr ? result : seams.result(seams.context, request, result);
}

}  // namespace zinf::io
