// io::make_backend: picks and sets up a system backend; for "auto", io_uring → libaio → posix.
#include "io/backend.h"
#include "io/detail/backends.h"
#include "src/base/log.h"

namespace zinf::io {
namespace detail {
#ifndef ZINF_HAVE_LIBURING
Result<std::unique_ptr<Backend>> make_uring_backend(const BackendOptions&) {
    return Status::not_supported("io_uring: zinfinity was built without liburing");
}
#endif
#ifndef ZINF_HAVE_LIBAIO
Result<std::unique_ptr<Backend>> make_aio_backend(const BackendOptions&) {
    return Status::not_supported("libaio: zinfinity was built without libaio");
}
#endif
}  // namespace detail

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options, std::string* why) {
    if (options.queue_depth == 0) {
        return Status::invalid_argument("io backend: queue_depth must be >= 1");
    }
    if (options.kind == "io_uring") return detail::make_uring_backend(options);
    if (options.kind == "libaio") return detail::make_aio_backend(options);
    if (options.kind == "posix") return detail::make_posix_backend(options);
    if (options.kind != "auto") {
        return Status::invalid_argument(str_cat("io backend: unknown kind '", options.kind,
                                                "' (expected auto, io_uring, libaio or posix)"));
    }
    std::string reasons;
    auto note = [&](const Status& status) {
        if (!reasons.empty()) reasons += "; ";
        reasons += status.message();
    };
    auto uring = detail::make_uring_backend(options);
    if (uring.has_value()) {
        if (why != nullptr) *why = reasons;
        return uring;
    }
    note(uring.error());
    auto aio = detail::make_aio_backend(options);
    if (aio.has_value()) {
        if (why != nullptr) *why = reasons;
        return aio;
    }
    note(aio.error());
    if (why != nullptr) *why = reasons;
    return detail::make_posix_backend(options);
}

}  // namespace zinf::io
