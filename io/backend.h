// io::Backend: asynchronous block I/O on descriptors opened by io::Engine. One owning thread (a
// worker of io::Engine); never allocates or throws after creation. Backends complete every
// piece in full or report an error: they resubmit the rest of a short transfer and retry EINTR
// and EAGAIN up to a fixed limit; every other error goes to the piece's callback.
//
// Request life cycle, the same for every backend: the submitter fills a kIdle request (with
// done_bytes = 0) and hands it to submit(); the backend marks it kInFlight and transfers bytes
// [offset_bytes + done_bytes, offset_bytes + length_bytes); once it is finished the backend sets
// kIdle and runs the callback from inside reap() with Status::ok() (done_bytes == length_bytes)
// or with an error whose message is the bare cause (strerror, "unexpected end of file"); the
// engine adds the file, offset and length.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "io/engine.h"
#include "io/seams.h"
#include "src/base/status.h"

namespace zinf::io {

// One piece of I/O: contiguous, at most aio.block_size bytes. Owned by the submitter (the
// engine's worker keeps a fixed array of queue_depth of them); must stay alive until its
// callback has run.
struct Request {
    enum class State : std::uint8_t { kIdle, kInFlight };
    OpKind op = OpKind::kRead;
    int fd = -1;                // descriptor (or simulated file id)
    int fixed_file_index = -1;  // registered-file slot, -1 if none
    std::uint64_t offset_bytes = 0;
    std::uint32_t length_bytes = 0;
    std::byte* buffer = nullptr;
    int buffer_index = -1;              // registered-buffer slot, -1 if none
    std::uint32_t done_bytes = 0;       // progress of a resubmitted short transfer
    std::uint16_t retries = 0;          // EINTR / EAGAIN retries of this piece (for stats)
    std::uint16_t short_transfers = 0;  // short transfers resubmitted (for stats)
    // How the backend issued the piece, for the engine's statistics (so that a silent fallback
    // to plain opcodes shows): set when the backend takes it; false where it has no such thing.
    bool used_fixed_buffer = false;  // READ_FIXED / WRITE_FIXED on a registered buffer
    bool used_fixed_file = false;    // IOSQE_FIXED_FILE on a registered file
    State state = State::kIdle;
    // Runs inside reap() on the owning thread with the piece's final status.
    void (*callback)(Request& request, const Status& status) = nullptr;
    void* user = nullptr;
};

constexpr int kMaxRetries = 16;
// Slots in each backend's fixed-file table; the engine hands them out (two per stripe file).
constexpr int kFixedFileSlots = 1024;
// The largest buffer io_uring registers as one fixed buffer (larger fails with EFAULT).
constexpr std::size_t kMaxRegisteredBufferBytes = std::size_t{1} << 30;

class Backend {
public:
    virtual ~Backend() = default;  // implementations assert in_flight_count() == 0
    virtual std::string_view name() const noexcept = 0;
    // Registers fixed buffers (io_uring); others accept and ignore. Each region gets the slot
    // equal to its index. Regions larger than 1 GiB are refused (split them first).
    virtual Status register_buffers(std::span<const std::span<std::byte>> regions) = 0;
    // Puts `fd` into slot `slot` of the backend's fixed-file table (io_uring), or clears the slot
    // when fd is -1. Requests naming a slot the backend has not registered use their plain fd,
    // so a backend without the feature accepts and ignores this (the default).
    virtual Status register_file(int slot, int fd) {
        (void)slot;
        (void)fd;
        return Status::ok();
    }
    // Queues requests in order; returns how many were accepted: a prefix of `requests`, now
    // kInFlight and owned by the backend until their callbacks. The rest are returned untouched
    // (kIdle, never handed to the kernel, free to submit again): when the queue is full, when the
    // kernel takes fewer than offered, when a submit system call fails part way. None accepted is
    // an error that names the cause: Status::busy() when room will come back by reaping (the
    // queue is full, or the kernel said EAGAIN/EBUSY while this backend has requests in flight),
    // otherwise the submit system call's error (the kernel refused the first request). Never
    // blocks; never runs a callback.
    virtual Result<std::size_t> submit(std::span<Request* const> requests) noexcept = 0;
    // Completes at least min_count requests (or what is in flight, if fewer), calling each
    // request's callback; waits at most `timeout`. Returns how many completed.
    virtual Result<std::size_t> reap(std::size_t min_count,
                                     std::chrono::microseconds timeout) noexcept = 0;
    virtual std::size_t in_flight_count() const noexcept = 0;
    virtual std::size_t queue_depth() const noexcept = 0;
    // Makes a reap() blocked on the owning thread return early (with whatever completed, maybe
    // nothing), so that the owner can submit work that arrived meanwhile. The one call that any
    // thread may make; cheap; a wake with no reap blocked shortens the next one. The default
    // does nothing, and reap then returns at its timeout.
    virtual void wake() noexcept {}
};

struct BackendOptions {
    std::string kind = "auto";  // io_uring | libaio | posix | auto
    std::size_t queue_depth = 32;
    bool sqpoll = false;
    bool single_submit = false;
    Seams seams;  // fault injection at the kernel boundary (tests); none by default
};

// Creates a backend; for "auto" tries io_uring → libaio → posix and puts the reasons for each
// one passed over into *why (e.g. "io_uring: io_uring_setup: EPERM, likely seccomp").
Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options, std::string* why);

}  // namespace zinf::io
