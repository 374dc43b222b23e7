// Factories of the system backends and small helpers they share. Private to io/: which backends
// were compiled in is known only here (ZINF_HAVE_LIBURING / ZINF_HAVE_LIBAIO).
#pragma once

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "io/backend.h"
#include "src/base/status.h"

namespace zinf::io::detail {

// Each returns kNotSupported, with the reason, when the backend cannot be set up here.
Result<std::unique_ptr<Backend>> make_uring_backend(const BackendOptions& options);
Result<std::unique_ptr<Backend>> make_aio_backend(const BackendOptions& options);
Result<std::unique_ptr<Backend>> make_posix_backend(const BackendOptions& options);

// The status a backend hands to a piece's callback for a failed transfer: the bare cause; the
// engine prefixes the operation, path, offset and length. Built only on error.
inline Status piece_error(int errno_value) {
    return Status::io_error(std::strerror(errno_value), errno_value);
}
// The error of a submit system call that took none of the requests offered: kIo (kNoSpace for
// ENOSPC), never kBusy, which tells the engine to wait for room; the message names the call.
inline Status submit_error(const char* call, int errno_value) {
    std::string message(call);
    message += ": ";
    message += std::strerror(errno_value);
    return Status::io_error(std::move(message), errno_value);
}
inline Status end_of_file_error() {
    return Status(StatusCode::kIo, "unexpected end of file", 0);
}

// Asserts that a request handed to submit() is well formed (STYLE.md §8: check at submit and at
// completion).
inline void check_submitted(const Request& request) {
    ZINF_ASSERT(request.state == Request::State::kIdle);
    ZINF_ASSERT(request.buffer != nullptr);
    ZINF_ASSERT(request.length_bytes > 0);
    ZINF_ASSERT_LT(request.done_bytes, request.length_bytes);
    ZINF_ASSERT(request.callback != nullptr);
    ZINF_ASSERT_GE(request.fd, 0);
}

// Marks a request finished and runs its callback (inside reap, on the owning thread).
inline void complete(Request& request, const Status& status) noexcept {
    ZINF_ASSERT(request.state == Request::State::kInFlight);
    if (status.is_ok()) ZINF_ASSERT_EQ(request.done_bytes, request.length_bytes);
    request.state = Request::State::kIdle;
    request.callback(request, status);
}

}  // namespace zinf::io::detail
