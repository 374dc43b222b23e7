// CudaDevice: the `Device` of a machine with an NVIDIA GPU. Device memory comes from plain
// cudaMalloc (never managed memory) held to a budget; StreamIds map to non-blocking CUDA streams
// and EventIds to a fixed pool of CUDA events; copies are cudaMemcpyAsync, truly asynchronous
// when the host side is pinned (the pinned pool registers its buffers with
// register_host_memory, or allocates them with cudaHostAlloc).
//
// Compiled only where CUDA is enabled (target zinf_device_cuda); this header names no CUDA type
// beyond the forward-declared stream handle, so that code above it stays plain C++.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/stream.h"
#include "src/base/allocation_ledger.h"
#include "src/base/device.h"
#include "src/base/status.h"

struct CUevent_st;  // cudaEvent_t is CUevent_st*

namespace zinf::device {

struct CudaDeviceOptions {
    // Selects the GPU: ordinal local_rank of the visible devices (one rank per GPU on a node);
    // local_rank_from_environment() reads it from the launcher. Must be < device count.
    int local_rank = 0;
    // Hard limit on allocate()'s bytes. 0: the memory free at creation less reserve_bytes.
    std::size_t budget_bytes = 0;
    // Left free for cuBLAS workspaces, NCCL buffers and the CUDA context when budget_bytes is 0.
    std::size_t reserve_bytes = std::size_t{2} << 30;
    // Streams besides stream 0, created on demand by create_stream() (the table never grows).
    std::uint32_t stream_count_max = 32;
    // Events outstanding at once (recorded and not yet released); created once at create().
    std::uint32_t event_count_max = 1024;
};

// Thread-safe: any thread may call any member. Each call makes the device current on the calling
// thread first (cudaSetDevice, a few nanoseconds when it already is), so I/O threads may copy
// without setting it themselves.
//
// Stream 0 is a non-blocking stream of this device, not CUDA's legacy default stream, so that
// work on it does not serialise with every other stream of the process.
class CudaDevice final : public Device {
public:
    // OK when a CUDA device is usable; else kCuda "no CUDA device: <cudaGetDeviceCount error>".
    static Status probe();
    // LOCAL_RANK (torchrun), OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), MPI_LOCALRANKID (MPICH) or
    // SLURM_LOCALID, in that order; 0 when none is set or it is not a number.
    static int local_rank_from_environment();

    // Selects the device, creates stream 0 and the event pool, and sizes the budget. Errors:
    // kCuda (no device, driver failure), kInvalidArgument (local_rank out of range, budget above
    // the device's memory), kNoSpace (the reserve exceeds free memory).
    static Result<std::unique_ptr<CudaDevice>> create(const CudaDeviceOptions& options);
    // Synchronises the device, then destroys events and streams. Memory still allocated or host
    // memory still registered is a bug in the caller's teardown: it is logged, then released.
    ~CudaDevice() override;
    CudaDevice(const CudaDevice&) = delete;
    CudaDevice& operator=(const CudaDevice&) = delete;

    DeviceKind kind() const noexcept override { return DeviceKind::kCuda; }
    std::string name() const override { return name_; }

    // cudaMalloc behind a budget check; takes a lock and a hash-map node: init time only, not
    // the hot path. Out of budget or out of device memory: kNoSpace with the device, the request,
    // the budget and the bytes in use.
    Result<void*> allocate(std::size_t size_bytes, std::string_view what) override;
    void free(void* ptr) noexcept override;
    std::size_t budget_bytes() const noexcept override { return budget_bytes_; }
    std::size_t used_bytes() const noexcept override;
    std::size_t peak_bytes() const noexcept override;

    // kNoSpace once stream_count_max streams exist.
    Result<StreamId> create_stream() override;
    // kBusy when all event_count_max events are outstanding (release some).
    Result<EventId> record_event(StreamId stream) override;
    Status stream_wait_event(StreamId stream, EventId event) override;
    Status synchronize_event(EventId event) override;
    Result<bool> event_done(EventId event) override;
    void release_event(EventId event) noexcept override;
    Status synchronize(StreamId stream) override;

    // cudaMemcpyAsync / cudaMemsetAsync on the stream. A pageable host buffer still works but the
    // copy is then staged by the driver and blocks the caller (debug builds log it once).
    Status copy_to_device(void* device_dst, const void* host_src, std::size_t size_bytes,
                          StreamId stream) override;
    Status copy_to_host(void* host_dst, const void* device_src, std::size_t size_bytes,
                        StreamId stream) override;
    Status copy_on_device(void* device_dst, const void* device_src, std::size_t size_bytes,
                          StreamId stream) override;
    Status fill_zero(void* device_dst, std::size_t size_bytes, StreamId stream) override;

    // cudaHostRegister (portable, so every device of the process sees it as pinned) /
    // cudaHostUnregister. Registering a region twice is kInvalidArgument.
    Status register_host_memory(std::span<std::byte> region) override;
    Status unregister_host_memory(void* base) override;
    // cudaDeviceGetPCIBusId; empty if the runtime cannot say.
    std::string pci_bus_id() const override;

    // CUDA-specific, for the kernels, cuBLAS and NCCL.
    int ordinal() const noexcept { return ordinal_; }
    // The CUDA stream behind `stream` (asserted valid); lives as long as the device.
    kernels::cuda::Stream cuda_stream(StreamId stream) const noexcept;
    // Makes this device current on the calling thread (cudaSetDevice).
    Status make_current() const;

private:
    CudaDevice(int ordinal, std::string name, std::size_t budget_bytes,
               const CudaDeviceOptions& options);
    Status check_event(EventId event) const;

    const int ordinal_;
    const std::string name_;
    const std::size_t budget_bytes_;
    const CudaDeviceOptions options_;

    mutable std::mutex mutex_;
    std::unordered_map<void*, std::size_t> allocations_;  // base -> bytes
    AllocationLedger ledger_;                             // what each allocation is for
    std::map<std::uintptr_t, std::size_t> host_regions_;  // registered base -> bytes
    std::size_t used_bytes_ = 0;
    std::size_t peak_bytes_ = 0;
    // streams_[id]; sized stream_count_max + 1 at create, filled on demand.
    std::vector<CUstream_st*> streams_;
    std::atomic<std::uint32_t> stream_count_{0};
    std::vector<CUevent_st*> events_;  // all created at create()
    std::vector<std::uint8_t> event_in_use_;
    std::vector<EventId> free_events_;  // capacity reserved at create: no growth
};

}  // namespace zinf::device
