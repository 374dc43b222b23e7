// What EngineMover and StoreMover share besides their I/O: the table of move slots with its free
// list (no allocation after construction), and the host region's links to the I/O engine
// (fixed buffers) and the device (a stream, page-locking).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "io/engine.h"
#include "src/base/device.h"
#include "src/base/log.h"
#include "src/base/status.h"
#include "src/tier/mover.h"

namespace zinf::tier {

// `Slot` has a `bool busy`. Tokens index the table.
template <typename Slot>
class MoveSlots {
public:
    explicit MoveSlots(std::size_t count) : count_(count), slots_(new Slot[count]) {
        free_.reserve(count);
        for (std::size_t i = count; i > 0; --i) free_.push_back(static_cast<MoveToken>(i - 1));
    }
    // A free slot, marked busy; kBusy naming `who` when every slot is in flight.
    Result<MoveToken> take(const char* who) noexcept {
        if (free_.empty()) return Status::busy(str_cat(who, ": every move slot is in flight"));
        const MoveToken token = free_.back();
        free_.pop_back();
        Slot& s = slots_[token];
        ZINF_ASSERT(!s.busy);
        s.busy = true;
        return token;
    }
    // The busy slot of `token` (asserted).
    Slot& at(MoveToken token) {
        ZINF_ASSERT_LT(token, count_);
        Slot& s = slots_[token];
        ZINF_ASSERT(s.busy);
        return s;
    }
    void give_back(MoveToken token) noexcept {
        Slot& s = at(token);
        s.busy = false;
        ZINF_ASSERT_LT(free_.size(), free_.capacity());  // reserved: never reallocates
        free_.push_back(token);
    }
    bool all_free() const noexcept { return free_.size() == count_; }

private:
    std::size_t count_;
    std::unique_ptr<Slot[]> slots_;
    std::vector<MoveToken> free_;
};

// Registers a mover's host region with the I/O engine (a failure, e.g. RLIMIT_MEMLOCK, is logged:
// the engine then uses plain opcodes) and, with a device, creates the copy stream and registers
// the region with the device (page-locking on a GPU) when asked; unregisters it when destroyed.
class HostRegionLinks {
public:
    HostRegionLinks() = default;
    ~HostRegionLinks() {
        if (!device_registered_) return;
        const Status s = device_->unregister_host_memory(region_.data());
        if (!s.is_ok()) log::warning(who_, ": ", s.to_string());
    }
    HostRegionLinks(const HostRegionLinks&) = delete;
    HostRegionLinks& operator=(const HostRegionLinks&) = delete;

    Status link(const char* who, io::Engine& engine, Device* device, std::span<std::byte> region,
                bool register_with_device) {
        who_ = who;
        device_ = device;
        region_ = region;
        if (!region.empty()) {
            const Status registered = engine.register_buffers(region);
            if (!registered.is_ok()) {
                log::warning(who,
                             ": host region not registered with the I/O engine (plain "
                             "opcodes): ",
                             registered.to_string());
            }
        }
        if (device == nullptr) return Status::ok();
        ZINF_ASSIGN_OR_RETURN(stream_, device->create_stream());
        if (!region.empty() && register_with_device) {
            ZINF_TRY(device->register_host_memory(region).with_context(
                str_cat(who, ": registering the host region")));
            device_registered_ = true;
        }
        return Status::ok();
    }
    StreamId stream() const noexcept { return stream_; }

private:
    const char* who_ = "mover";
    Device* device_ = nullptr;
    std::span<std::byte> region_;
    StreamId stream_ = 0;
    bool device_registered_ = false;
};

}  // namespace zinf::tier
