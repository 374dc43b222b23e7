// io::make_backend: picks and sets up a system backend; for "auto", io_uring → libaio → posix.
#include "io/backend.h"
#include "io/detail/backends.h"
#include "src/base/aio_backends.h"
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
    // The table's order is auto's order of preference (src/base/aio_backends.h).
    using Make = Result<std::unique_ptr<Backend>> (*)(const BackendOptions&);
    static constexpr Make kMake[] = {&detail::make_uring_backend, &detail::make_aio_backend,
                                     &detail::make_posix_backend};
    static_assert(std::size(kMake) == kAioBackends.size());
    for (std::size_t i = 0; i < kAioBackends.size(); ++i) {
        if (options.kind == kAioBackends[i].name) return kMake[i](options);
    }
    if (options.kind != kAutoAioBackend) {
        return Status::invalid_argument(str_cat("io backend: unknown kind '", options.kind,
                                                "' (expected ", aio_backend_list(true), ")"));
    }
    std::string reasons;
    for (std::size_t i = 0; i + 1 < kAioBackends.size(); ++i) {
        auto made = kMake[i](options);
        if (made.has_value()) {
            if (why != nullptr) *why = reasons;
            return made;
        }
        if (!reasons.empty()) reasons += "; ";
        reasons += made.error().message();
    }
    if (why != nullptr) *why = reasons;
    return kMake[kAioBackends.size() - 1](options);  // posix: always there
}

}  // namespace zinf::io
