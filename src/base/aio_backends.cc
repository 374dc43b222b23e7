// The backend-name table's helpers.
#include "src/base/aio_backends.h"

namespace zinf {

std::vector<std::string_view> aio_backend_names(bool with_auto) {
    std::vector<std::string_view> names;
    if (with_auto) names.push_back(kAutoAioBackend);
    for (const AioBackendName& b : kAioBackends) names.push_back(b.name);
    return names;
}

std::string aio_backend_list(bool with_auto) {
    const std::vector<std::string_view> names = aio_backend_names(with_auto);
    std::string s;
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (i > 0) s += i + 1 == names.size() ? " or " : ", ";
        s += names[i];
    }
    return s;
}

std::vector<std::string_view> aio_backends_with_fio() {
    std::vector<std::string_view> names;
    for (const AioBackendName& b : kAioBackends) {
        if (!b.fio_engine.empty()) names.push_back(b.name);
    }
    return names;
}

std::string_view fio_engine_of(std::string_view backend) noexcept {
    for (const AioBackendName& b : kAioBackends) {
        if (b.name == backend) return b.fio_engine;
    }
    return {};
}

}  // namespace zinf
