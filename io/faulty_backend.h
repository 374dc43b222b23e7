// io::FaultyBackend: a Backend wrapper that injects the faults of an io::FaultPlan (failed pieces,
// ENOSPC, short transfers, corrupted reads, latency) into any backend. A feature, not a test
// macro: the engine stacks it on each worker's backend when EngineOptions::faults is set. A piece
// it fails carries a Status marked injected (Status::is_injected), which the engine keeps when it
// adds the file, offset and length.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "io/backend.h"
#include "io/fault.h"

namespace zinf::io {

class FaultyBackend final : public Backend {
public:
    // Counters shared by the wrappers that follow one plan (one per engine worker), so that
    // "the n-th piece" and "after N bytes written" count over the whole engine.
    struct Shared {
        std::atomic<std::uint64_t> pieces_submitted{0};
        std::atomic<std::uint64_t> bytes_written{0};
        std::atomic<std::uint64_t> faults_injected{0};
    };

    // Borrows `inner` and `shared`, which must outlive the wrapper. `stream` separates the random
    // streams of several wrappers following one plan.
    FaultyBackend(Backend& inner, const FaultPlan& plan, Shared& shared, std::uint64_t stream);
    ~FaultyBackend() override;

    std::string_view name() const noexcept override { return inner_.name(); }
    Status register_buffers(std::span<const std::span<std::byte>> regions) override {
        return inner_.register_buffers(regions);
    }
    Status register_file(int slot, int fd) override { return inner_.register_file(slot, fd); }
    Result<std::size_t> submit(std::span<Request* const> requests) noexcept override;
    Result<std::size_t> reap(std::size_t min_count,
                             std::chrono::microseconds timeout) noexcept override;
    std::size_t in_flight_count() const noexcept override { return in_use_; }
    std::size_t queue_depth() const noexcept override { return slots_.size(); }
    void wake() noexcept override { inner_.wake(); }

private:
    enum class SlotState : std::uint8_t { kFree, kInner, kFailed, kDelayed, kRetry };
    struct Slot {
        SlotState state = SlotState::kFree;
        Request* request = nullptr;
        void (*callback)(Request&, const Status&) = nullptr;
        void* user = nullptr;
        std::uint32_t real_length_bytes = 0;  // before a simulated short transfer
        int error = 0;                        // injected errno, or the inner error's errno
        Status status;                        // the outcome held back by a delay
        std::chrono::steady_clock::time_point due;
        FaultyBackend* owner = nullptr;
    };

    static void on_inner_complete(Request& request, const Status& status);
    void deliver(Slot& slot, const Status& status) noexcept;
    std::size_t deliver_ready(std::chrono::steady_clock::time_point now) noexcept;
    void flush_retries() noexcept;
    // Hands forward_[0, count) to the inner backend; keeps what it does not take for a retry.
    void forward(std::size_t count, std::chrono::steady_clock::time_point now) noexcept;
    std::chrono::microseconds latency() noexcept;
    bool chance(double probability) noexcept;

    Backend& inner_;
    const FaultPlan plan_;
    Shared& shared_;
    std::vector<Slot> slots_;
    std::vector<Request*> forward_;  // scratch for one submit
    std::size_t in_use_ = 0;
    std::size_t delivered_ = 0;  // callbacks run during the current reap
    std::mt19937_64 rng_;
};

}  // namespace zinf::io
