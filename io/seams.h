// io::Seams: two fault-injection points where a backend meets the kernel, for tests that must
// reach paths the kernel seldom takes: the submit system call (io_uring_enter, io_submit) and the
// raw result of each transfer. Options, not test macros (STYLE.md §9): null, the default, costs
// one branch per call. Set through BackendOptions::seams or EngineOptions::seams.
#pragma once

#include <cstddef>

namespace zinf::io {

struct Request;

// What one submit system call does, as the seam decides it.
struct SubmitCall {
    std::size_t limit = 0;  // the kernel takes at most this many of the entries offered
    int error = 0;          // nonzero: the call then fails with this errno
};

struct Seams {
    // Called on the owning thread before each system call that hands requests of
    // Backend::submit to the kernel (io_uring, libaio; posix and sim make none), with how many it
    // offers. The kernel then really gets only the first `limit`; with `error` set the call
    // reports that errno as its own result, after the kernel took what it took: exactly the state
    // of a submit that failed part way.
    SubmitCall (*submit)(void* context, std::size_t offered) noexcept = nullptr;
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
