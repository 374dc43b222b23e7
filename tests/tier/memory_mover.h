// MemoryMover: a tier::Mover for tests. "NVMe" is an in-memory byte array per partition; every
// move copies its bytes only when it completes, after a seeded random number of polls (so moves
// complete out of order, and a manager that reads a buffer before its move is done sees stale
// bytes); wait() completes at once. Device copies are plain memcpy (the device is a CpuDevice,
// whose memory is host memory). The n-th started move can be made to fail.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "src/base/aligned.h"
#include "src/tier/mover.h"

namespace zinf::tier::fake {

class MemoryMover final : public Mover {
public:
    MemoryMover(std::size_t host_region_bytes, std::uint64_t seed, std::size_t max_in_flight = 16)
        : region_(AlignedBuffer::allocate(host_region_bytes, kAlignment).value()),
          rng_(seed),
          slots_(max_in_flight) {}
    ~MemoryMover() override {
        for (const Slot& s : slots_) ZINF_ASSERT(!s.busy);
    }

    std::span<std::byte> host_region() noexcept override { return region_.span(); }
    std::size_t host_alignment_bytes() const noexcept override { return kAlignment; }
    std::size_t max_in_flight() const noexcept override { return slots_.size(); }

    Status reserve(PartitionId id, std::size_t size_bytes) override {
        if (id >= nvme_.size()) nvme_.resize(id + 1);
        if (!nvme_[id].empty()) return Status::invalid_argument("reserved twice");
        if (reserved_bytes_ + size_bytes > capacity_bytes_)
            return Status::no_space("memory mover full");
        reserved_bytes_ += size_bytes;
        nvme_[id].assign(size_bytes, std::byte{0});
        return Status::ok();
    }

    Result<MoveToken> start(const Move& move) noexcept override {
        ++started_;
        ++started_by_kind_[static_cast<int>(move.kind)];
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            if (slots_[i].busy) continue;
            Slot& s = slots_[i];
            s.busy = true;
            s.move = move;
            s.polls_left = std::uniform_int_distribution<int>(0, 3)(rng_);
            s.fail = fail_nth_ != 0 && started_ == fail_nth_;
            return static_cast<MoveToken>(i);
        }
        --started_;
        --started_by_kind_[static_cast<int>(move.kind)];
        return Status::busy("memory mover: all slots in flight");
    }

    Result<bool> poll(MoveToken token) noexcept override {
        Slot& s = slots_.at(token);
        ZINF_ASSERT(s.busy);
        if (s.polls_left > 0) {
            --s.polls_left;
            return false;
        }
        Status status = complete(s);
        if (!status.is_ok()) return status;
        return true;
    }

    Status wait(MoveToken token) noexcept override {
        Slot& s = slots_.at(token);
        ZINF_ASSERT(s.busy);
        return complete(s);
    }

    // Test hooks.
    std::vector<std::byte>& nvme(PartitionId id) { return nvme_.at(id); }
    void fail_nth(std::uint64_t n) { fail_nth_ = started_ + n; }
    void set_capacity(std::uint64_t bytes) { capacity_bytes_ = bytes; }
    std::uint64_t started(MoveKind kind) const { return started_by_kind_[static_cast<int>(kind)]; }
    std::size_t in_flight() const {
        std::size_t n = 0;
        for (const Slot& s : slots_) n += s.busy ? 1 : 0;
        return n;
    }

    static constexpr std::size_t kAlignment = 512;

private:
    struct Slot {
        bool busy = false;
        bool fail = false;
        int polls_left = 0;
        Move move;
    };

    Status complete(Slot& s) {
        s.busy = false;
        if (s.fail) return Status::io_error("injected failure", 5);
        const Move& m = s.move;
        switch (m.kind) {
            case MoveKind::kSwapIn:
                std::memcpy(m.host, nvme_.at(m.id).data(), m.size_bytes);
                break;
            case MoveKind::kSwapOut:
                std::memcpy(nvme_.at(m.id).data(), m.host, m.size_bytes);
                break;
            case MoveKind::kToDevice:
                std::memcpy(m.device, m.host, m.size_bytes);
                break;
            case MoveKind::kToHost:
                std::memcpy(m.host, m.device, m.size_bytes);
                break;
        }
        return Status::ok();
    }

    AlignedBuffer region_;
    std::mt19937_64 rng_;
    std::vector<Slot> slots_;
    std::vector<std::vector<std::byte>> nvme_;
    std::uint64_t reserved_bytes_ = 0;
    std::uint64_t capacity_bytes_ = ~std::uint64_t{0};
    std::uint64_t started_ = 0;
    std::uint64_t started_by_kind_[4] = {0, 0, 0, 0};
    std::uint64_t fail_nth_ = 0;
};

}  // namespace zinf::tier::fake
