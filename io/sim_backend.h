// io::SimDevice and io::SimBackend: an in-memory block device for fast, reproducible tests of the
// layers above io/. Requests complete out of order after a seeded, simulated latency; writes
// beyond the device's capacity fail with ENOSPC. io::SimStorage (sim_storage.h) hands the device
// to an io::Engine as its storage.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/backend.h"
#include "io/engine.h"

namespace zinf::io {

// The simulated device: named files of bytes, shared by the SimBackends of an engine's workers.
// Thread-safe. Unlike the backends it allocates (files grow on write): it is a test device.
class SimDevice {
public:
    explicit SimDevice(const SimOptions& options) : options_(options) {}
    SimDevice(const SimDevice&) = delete;
    SimDevice& operator=(const SimDevice&) = delete;

    // Opens (or, with options.create, creates) a file; returns its id. Errors as open(2) would
    // give them: kNotFound for a missing file without create, EEXIST with exclusive.
    Result<int> open(const std::string& path, const FileOptions& options);
    // Grows the file to at least size_bytes; kNoSpace beyond the capacity.
    Status reserve(int file, std::uint64_t size_bytes);
    // Copies out of / into a file. Returns the bytes transferred (a read stops at the end of the
    // file) or a negative errno (-ENOSPC beyond the capacity, -EBADF for an unknown id).
    long read(int file, std::uint64_t offset_bytes, std::byte* buffer, std::uint32_t length_bytes);
    long write(int file, std::uint64_t offset_bytes, const std::byte* buffer,
               std::uint32_t length_bytes);
    std::uint64_t size_bytes(int file) const;
    std::uint64_t used_bytes() const;
    const SimOptions& options() const noexcept { return options_; }

private:
    const SimOptions options_;
    mutable std::mutex mutex_;
    std::unordered_map<std::string, int> ids_;
    std::vector<std::vector<std::byte>> files_;
    std::uint64_t used_bytes_ = 0;
};

// One worker's view of a SimDevice. Owned by one thread, like every Backend; never allocates
// after construction (the device may, when a file grows). `stream` separates the random
// streams of several workers that share one seed. The bytes move when a request is due, and the
// system backends' rule (io/detail/completion.h) says what each result means; `seams.result`
// sees each one first (seams.submit does not apply: there is no submit system call).
class SimBackend final : public Backend {
public:
    SimBackend(SimDevice& device, std::size_t queue_depth, std::uint64_t stream,
               const Seams& seams = {});
    ~SimBackend() override;

    std::string_view name() const noexcept override { return "sim"; }
    Status register_buffers(std::span<const std::span<std::byte>> regions) override;
    Result<std::size_t> submit(std::span<Request* const> requests) noexcept override;
    // Delivers due requests in order of their simulated completion time, which differs from the
    // submission order; waits (sleeps) for at most `timeout` for min_count of them.
    Result<std::size_t> reap(std::size_t min_count,
                             std::chrono::microseconds timeout) noexcept override;
    std::size_t in_flight_count() const noexcept override { return in_flight_; }
    std::size_t queue_depth() const noexcept override { return slots_.size(); }
    void wake() noexcept override;

private:
    struct Slot {
        Request* request = nullptr;
        std::chrono::steady_clock::time_point due;
        std::uint64_t sequence = 0;  // tie-break, so that equal due times stay deterministic
    };
    std::size_t deliver_due(std::chrono::steady_clock::time_point now) noexcept;
    // Moves the request's bytes, resubmitting short transfers and retrying as the rule says.
    Status transfer(Request& request) noexcept;

    SimDevice& device_;
    const Seams seams_;
    std::vector<Slot> slots_;
    std::size_t in_flight_ = 0;
    std::mt19937_64 rng_;
    std::mutex wake_mutex_;  // the simulated wait, so that wake() can cut it short
    std::condition_variable wake_cv_;
    bool woken_ = false;
};

}  // namespace zinf::io
