// CpuDevice: the `Device` of machines without a GPU. "Device memory" is host memory held to a
// configured budget; streams are FIFO queues of copies served by one worker thread (or run inline
// on the calling thread), so that every layer above src/base can be tested and benchmarked on a
// CPU-only machine with the same asynchrony it meets on a GPU.
//
// Self-contained on purpose: it links only zinf_base. The CUDA device lives in src/device/cuda.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "src/base/aligned.h"
#include "src/base/allocation_ledger.h"
#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf::device {

struct CpuDeviceOptions {
    // Hard limit on the bytes handed out by allocate() (rounded up to alignment_bytes each).
    std::size_t budget_bytes = 1ULL << 30;
    std::size_t alignment_bytes = kDefaultAlignmentBytes;
    // true: copies and fills run in FIFO order on one worker thread, so that they overlap with
    // the caller (as DMA engines do); events complete when the worker has passed them.
    // false: they run inline inside the call, and every event is complete when recorded.
    bool worker_thread = true;
    // Operations that may be queued before a submitting call waits for the worker (fixed at
    // create: the queue never grows).
    std::size_t queue_capacity = 1024;
    // Events that may be outstanding (recorded and not yet released) at once.
    std::size_t event_capacity = 4096;
    // The worker waits this long before each operation (worker_thread only): a slow copy
    // engine, under which a caller that reuses a host buffer before its copy has run reads or
    // publishes the wrong bytes, where a fast worker would usually hide the missing wait.
    std::chrono::microseconds op_delay{0};
};

// Thread-safe: any thread may call any member. Streams share one FIFO, which orders work more
// strictly than the Device contract requires (work on different streams never overlaps here),
// so stream_wait_event is satisfied by construction.
class CpuDevice final : public Device {
public:
    static Result<std::unique_ptr<CpuDevice>> create(const CpuDeviceOptions& options);
    // Drains the queue and stops the worker. Asserts that every allocation was freed and every
    // registered host region unregistered (a leak there is a bug in the caller's teardown).
    ~CpuDevice() override;
    CpuDevice(const CpuDevice&) = delete;
    CpuDevice& operator=(const CpuDevice&) = delete;

    DeviceKind kind() const noexcept override { return DeviceKind::kCpu; }
    std::string name() const override { return "cpu"; }

    // Allocates at init time (std::map node + aligned allocation); not for the hot path.
    Result<void*> allocate(std::size_t size_bytes, std::string_view what) override;
    void free(void* ptr) noexcept override;
    std::size_t budget_bytes() const noexcept override { return options_.budget_bytes; }
    std::size_t used_bytes() const noexcept override;
    std::size_t peak_bytes() const noexcept override;
    std::size_t allocation_granularity_bytes() const noexcept override {
        return options_.alignment_bytes;
    }

    Result<StreamId> create_stream() override;
    Result<EventId> record_event(StreamId stream) override;
    Status stream_wait_event(StreamId stream, EventId event) override;
    Status synchronize_event(EventId event) override;
    Result<bool> event_done(EventId event) override;
    void release_event(EventId event) noexcept override;
    Status synchronize(StreamId stream) override;

    // Each asserts that the device-side range lies inside one allocation of this device
    // (a programmer error otherwise) and that the sizes are non-zero or the call is a no-op.
    Status copy_to_device(void* device_dst, const void* host_src, std::size_t size_bytes,
                          StreamId stream) override;
    Status copy_to_host(void* host_dst, const void* device_src, std::size_t size_bytes,
                        StreamId stream) override;
    Status copy_on_device(void* device_dst, const void* device_src, std::size_t size_bytes,
                          StreamId stream) override;
    Status fill_zero(void* device_dst, std::size_t size_bytes, StreamId stream) override;

    // Registered host memory is accepted by the copies and fills as device memory (it is host
    // memory either way), outside the budget: offloaded states are used in place.
    Status register_host_memory(std::span<std::byte> region) override;
    Status unregister_host_memory(void* base) override;

    // Bytes moved by completed copies, for benches and tests.
    std::uint64_t bytes_copied() const noexcept;

private:
    struct Op {
        enum class Kind : std::uint8_t { kCopy, kFill } kind = Kind::kCopy;
        void* dst = nullptr;
        const void* src = nullptr;
        std::size_t size_bytes = 0;
    };

    explicit CpuDevice(const CpuDeviceOptions& options);
    void worker_main();
    // Queues (or runs inline) one operation; waits while the ring is full.
    Status enqueue(const Op& op, StreamId stream);
    static void run_op(const Op& op) noexcept;
    // True when [ptr, ptr + size) lies inside one allocation or one registered host region.
    // Caller holds mutex_.
    bool owns_range_locked(const void* ptr, std::size_t size_bytes) const;
    bool event_done_locked(EventId event) const;

    CpuDeviceOptions options_;
    mutable std::mutex mutex_;
    std::condition_variable work_cv_;  // worker: there is work, or stop
    std::condition_variable done_cv_;  // callers: the worker completed something
    std::map<std::uintptr_t, AlignedBuffer> allocations_;  // keyed by base address
    AllocationLedger ledger_;                              // what each allocation is for
    std::map<std::uintptr_t, std::size_t> host_regions_;
    std::size_t used_bytes_ = 0;
    std::size_t peak_bytes_ = 0;
    std::uint32_t stream_count_ = 1;  // stream 0 exists from the start

    // The FIFO: a fixed ring of queue_capacity ops. Sequence numbers count enqueued and
    // completed ops since creation; an event is "done" once completed_seq_ >= its sequence.
    std::vector<Op> ring_;
    std::uint64_t enqueued_seq_ = 0;
    std::uint64_t completed_seq_ = 0;
    std::uint64_t bytes_copied_ = 0;
    // Event table: the sequence each outstanding event waits for; kFreeEvent marks a free slot.
    static constexpr std::uint64_t kFreeEvent = ~0ULL;
    std::vector<std::uint64_t> events_;
    std::vector<EventId> free_events_;
    bool stop_ = false;
    std::thread worker_;
};

}  // namespace zinf::device
