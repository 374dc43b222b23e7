// The names of the asynchronous I/O backends, in one place: the `aio.backend` config key, the
// I/O engine's choice for "auto" (this order: io_uring, else libaio, else posix), the bench's
// --backend flags and its fio comparisons (the fio engine each backend is compared with) all read
// this table. Whether a backend was built in is io/'s business (ZINF_HAVE_* stay private there).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace zinf {

struct AioBackendName {
    std::string_view name;
    std::string_view fio_engine;  // fio's ioengine doing the same syscalls; empty: none
};

// In "auto"'s order of preference.
inline constexpr std::array<AioBackendName, 3> kAioBackends = {{
    {"io_uring", "io_uring"},
    {"libaio", "libaio"},
    {"posix", ""},
}};
inline constexpr std::string_view kAutoAioBackend = "auto";

// The backend names, with "auto" first when asked: for choice lists.
std::vector<std::string_view> aio_backend_names(bool with_auto);
// "auto, io_uring, libaio or posix": for messages.
std::string aio_backend_list(bool with_auto);
// The backends fio can be compared with ("io_uring", "libaio").
std::vector<std::string_view> aio_backends_with_fio();
// The fio engine of `backend`, empty when it has none or is unknown.
std::string_view fio_engine_of(std::string_view backend) noexcept;

}  // namespace zinf
