// Status formatting and errno mapping.
#include "src/base/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zinf {

std::string_view status_code_name(StatusCode code) noexcept {
    switch (code) {
        case StatusCode::kOk:
            return "OK";
        case StatusCode::kInvalidArgument:
            return "invalid argument";
        case StatusCode::kNotSupported:
            return "not supported";
        case StatusCode::kBusy:
            return "busy";
        case StatusCode::kIo:
            return "I/O error";
        case StatusCode::kNoSpace:
            return "no space";
        case StatusCode::kCorruption:
            return "corruption";
        case StatusCode::kCuda:
            return "CUDA error";
        case StatusCode::kNccl:
            return "NCCL error";
        case StatusCode::kInternal:
            return "internal error";
        case StatusCode::kNotFound:
            return "not found";
        case StatusCode::kTimeout:
            return "timeout";
    }
    return "unknown";
}

Status::Status(StatusCode code, std::string message, int errno_value) {
    ZINF_ASSERT(code != StatusCode::kOk);
    rep_ = std::make_unique<Rep>(Rep{code, errno_value, std::move(message), false});
}

Status Status::io_error(std::string message, int errno_value) {
    if (errno_value == ENOSPC || errno_value == EDQUOT) {
        return {StatusCode::kNoSpace, std::move(message), errno_value};
    }
    return {StatusCode::kIo, std::move(message), errno_value};
}

Status Status::from_errno(int errno_value, std::string_view what) {
    std::string message(what);
    message += ": ";
    message += std::strerror(errno_value);
    switch (errno_value) {
        case ENOENT:
            return not_found(std::move(message), errno_value);
        case ENOSPC:
        case EDQUOT:
            return no_space(std::move(message), errno_value);
        case EINVAL:
            return {StatusCode::kInvalidArgument, std::move(message), errno_value};
        case EOPNOTSUPP:
        case ENOSYS:
            return not_supported(std::move(message), errno_value);
        case EAGAIN:
            return {StatusCode::kBusy, std::move(message), errno_value};
        default:
            return {StatusCode::kIo, std::move(message), errno_value};
    }
}

const std::string& Status::message() const noexcept {
    static const std::string kEmpty;
    return rep_ ? rep_->message : kEmpty;
}

std::string Status::to_string() const {
    if (!rep_) return "OK";
    std::string out(status_code_name(rep_->code));
    out += ": ";
    out += rep_->message;
    return out;
}

Status Status::with_context(std::string_view context) const {
    if (!rep_) return Status();
    std::string message(context);
    message += ": ";
    message += rep_->message;
    Status out(rep_->code, std::move(message), rep_->errno_value);
    out.rep_->injected = rep_->injected;
    return out;
}

Status Status::mark_injected() && {
    ZINF_ASSERT_MSG(rep_ != nullptr, "mark_injected on an OK status");
    rep_->injected = true;
    return std::move(*this);
}

namespace detail {
void assert_fail(const char* expr, const char* file, int line, const std::string& detail) {
    std::fprintf(stderr, "zinfinity: assertion failed at %s:%d: %s%s%s\n", file, line, expr,
                 detail.empty() ? "" : " -- ", detail.c_str());
    std::fflush(stderr);
    std::abort();
}
}  // namespace detail

}  // namespace zinf
