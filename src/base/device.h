// Device: the interface every layer above src/base uses for device memory, streams and copies.
// Two implementations live in src/device: the CPU device (host memory held to a configured
// budget, worker-thread streams) and the CUDA device. Writing every path against this interface
// lets the whole engine run and be tested on machines without a GPU.
//
// Calls are made per tensor or per batch, never per element. Memory is held to a hard budget:
// an allocation that would exceed it fails with kNoSpace naming the device and the budget; the
// peak is recorded so that benches and tests can report it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "src/base/status.h"

namespace zinf {

enum class DeviceKind : std::uint8_t { kCpu, kCuda };

// An ordered queue of device work; 0 is the default stream of the device.
using StreamId = std::uint32_t;
// A point in a stream that other streams or the host can wait for.
using EventId = std::uint32_t;

class Device {
public:
    virtual ~Device() = default;

    virtual DeviceKind kind() const noexcept = 0;
    // "cpu" or "cuda:0 (NVIDIA H200)".
    virtual std::string name() const = 0;

    // Device memory held to budget_bytes(); `what` names the allocation (kept while it lives).
    // Fails with kNoSpace rather than exceeding the budget, naming the device, the allocation,
    // its size, the budget and what holds the memory in use (by name, largest first).
    virtual Result<void*> allocate(std::size_t size_bytes, std::string_view what) = 0;
    // Frees memory from allocate(); nullptr is a no-op. Waits for the work already queued on
    // every stream first (cudaFree's implicit synchronisation), so an error path may free what
    // it just queued a copy or fill on; work queued after the call must not use the memory.
    virtual void free(void* ptr) noexcept = 0;
    virtual std::size_t budget_bytes() const noexcept = 0;
    virtual std::size_t used_bytes() const noexcept = 0;
    virtual std::size_t peak_bytes() const noexcept = 0;
    // What allocate() charges against the budget is the size rounded up to a multiple of this
    // (the planner predicts the charge: src/engine/memory_prediction.h).
    virtual std::size_t allocation_granularity_bytes() const noexcept { return 1; }

    // Streams and events. Ids are small integers owned by the device.
    virtual Result<StreamId> create_stream() = 0;
    virtual Result<EventId> record_event(StreamId stream) = 0;
    // Makes `stream` wait (on the device) until `event` has completed.
    virtual Status stream_wait_event(StreamId stream, EventId event) = 0;
    // Blocks the host until `event` has completed; returns the first error of the work before it.
    virtual Status synchronize_event(EventId event) = 0;
    virtual Result<bool> event_done(EventId event) = 0;
    virtual void release_event(EventId event) noexcept = 0;
    virtual Status synchronize(StreamId stream) = 0;

    // Asynchronous copies on `stream`. Host memory should be registered (pinned) for the copy
    // to be truly asynchronous on a GPU; on the CPU device these are memcpy on the stream.
    virtual Status copy_to_device(void* device_dst, const void* host_src, std::size_t size_bytes,
                                  StreamId stream) = 0;
    virtual Status copy_to_host(void* host_dst, const void* device_src, std::size_t size_bytes,
                                StreamId stream) = 0;
    virtual Status copy_on_device(void* device_dst, const void* device_src, std::size_t size_bytes,
                                  StreamId stream) = 0;
    virtual Status fill_zero(void* device_dst, std::size_t size_bytes, StreamId stream) = 0;

    // Page-locks and registers host memory for fast asynchronous copies (cudaHostRegister);
    // the CPU device accepts and records it. Unregister before freeing the memory.
    virtual Status register_host_memory(std::span<std::byte> region) = 0;
    virtual Status unregister_host_memory(void* base) = 0;

    // The device's PCI address ("0000:3b:00.0"), for placing host memory on the NUMA node
    // closest to it; empty when it has none (the CPU device).
    virtual std::string pci_bus_id() const { return {}; }
};

}  // namespace zinf
