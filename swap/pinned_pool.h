// PinnedPool: a fixed number of fixed-size host buffers carved from one page-locked region,
// placed on the NUMA node closest to the device (or to the calling thread), registered with the
// I/O engine and, through a hook, with a device. Allocated once at init; acquire and release
// never allocate.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf::io {
class Engine;
}

namespace zinf::swap {

struct PinnedPoolOptions {
    std::string name = "pinned";        // named in every error message
    std::size_t buffer_count = 4;       // `buffer_count` of the offload section
    std::size_t buffer_size_bytes = 0;  // a multiple of 4096 (rounded up if not)
    // Place the region on the NUMA node hwloc reports closest to this device's PCI bus
    // (Device::pci_bus_id: a GPU); nullptr, a CPU device or an unknown bus: the node of the
    // calling thread.
    const Device* near_device = nullptr;
    // mlock failing (RLIMIT_MEMLOCK for non-root users) is an error unless this is set, in which
    // case the pool logs a warning and works unlocked (slower copies to a GPU, same results).
    bool allow_unlocked = false;
    // false: no mlock at all, a pageable region (offload_param with pin_memory false).
    bool lock = true;
};

class PinnedPool;

// A lease of one pool buffer: move-only; returns the buffer to its pool when destroyed or reset.
class PinnedBuffer {
public:
    PinnedBuffer() noexcept = default;
    ~PinnedBuffer() { reset(); }
    PinnedBuffer(PinnedBuffer&& other) noexcept;
    PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;

    bool valid() const noexcept { return pool_ != nullptr; }
    std::byte* data() const noexcept { return span_.data(); }
    std::size_t size() const noexcept { return span_.size(); }
    std::span<std::byte> span() const noexcept { return span_; }
    std::size_t index() const noexcept { return index_; }
    // Returns the buffer to the pool now (no-op when empty). Never blocks on I/O: the caller
    // makes sure no operation still uses the buffer.
    void reset() noexcept;

private:
    friend class PinnedPool;
    PinnedBuffer(PinnedPool* pool, std::size_t index, std::span<std::byte> span) noexcept
        : pool_(pool), index_(index), span_(span) {}
    PinnedPool* pool_ = nullptr;
    std::size_t index_ = 0;
    std::span<std::byte> span_;
};

class PinnedPool {
public:
    // Allocates count × size bytes on the chosen NUMA node (hwloc), touches every page, mlocks
    // the region. Init only: allocates. Errors: kInvalidArgument (zero count or size), kNoSpace
    // (allocation failed, naming the bytes), kNotSupported (mlock refused, without allow_unlocked).
    static Result<std::unique_ptr<PinnedPool>> create(const PinnedPoolOptions& options);
    // Precondition (asserted): every buffer has been returned. Unregisters from the device hook.
    ~PinnedPool();
    PinnedPool(const PinnedPool&) = delete;
    PinnedPool& operator=(const PinnedPool&) = delete;

    // Registers the region with the I/O engine as fixed buffers (io_uring); call once, before
    // I/O on the buffers, and keep the pool alive as long as the engine.
    Status register_with(io::Engine& engine);
    // The CUDA hook: page-locks and registers the region with `device` (cudaHostRegister on a
    // GPU); unregistered in the destructor, so the device must outlive the pool.
    Status register_with_device(Device& device);

    // Takes a free buffer; when none is free, waits up to `timeout` for one. Thread-safe; never
    // allocates. Errors (the message names the pool, its buffer count and size):
    //   kBusy     every buffer is held by the calling thread, so waiting could never end;
    //   kTimeout  no buffer came back within `timeout`.
    Result<PinnedBuffer> acquire(std::chrono::milliseconds timeout);
    // Takes a free buffer or fails at once with kBusy; never blocks.
    Result<PinnedBuffer> try_acquire();

    const std::string& name() const noexcept { return name_; }
    std::size_t buffer_count() const noexcept { return buffer_count_; }
    std::size_t buffer_size_bytes() const noexcept { return buffer_size_bytes_; }
    std::size_t total_bytes() const noexcept { return region_.size(); }
    std::span<std::byte> region() const noexcept { return region_; }
    std::size_t free_count() const;
    bool is_locked() const noexcept { return locked_; }
    // The NUMA node (hwloc logical index) the region is bound to; -1 when not bound.
    int numa_node() const noexcept { return numa_node_; }

private:
    friend class PinnedBuffer;
    PinnedPool() = default;
    void release(std::size_t index) noexcept;
    Status exhausted_error(StatusCode code, std::chrono::milliseconds timeout) const;
    PinnedBuffer take_locked(std::size_t index) noexcept;

    std::string name_;
    std::size_t buffer_count_ = 0;
    std::size_t buffer_size_bytes_ = 0;
    std::span<std::byte> region_;
    bool locked_ = false;
    int numa_node_ = -1;
    struct Memory;  // owner of the hwloc topology and allocation
    std::unique_ptr<Memory> memory_;
    Device* registered_device_ = nullptr;

    mutable std::mutex mutex_;
    std::condition_variable freed_cv_;
    std::vector<std::size_t> free_;         // stack of free indices, capacity buffer_count
    std::vector<std::thread::id> holders_;  // per buffer; default id when free
};

}  // namespace zinf::swap
