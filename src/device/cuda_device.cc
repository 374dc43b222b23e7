// CudaDevice: budgeted cudaMalloc, stream and event tables, asynchronous copies.
#include "src/device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cuda/cuda_status.h"
#include "src/base/log.h"

namespace zinf::device {
namespace {

using kernels::cuda::cuda_error_status;

bool parse_rank(const char* text, int& rank) {
    if (text == nullptr || *text == '\0') return false;
    const char* end = text + std::strlen(text);
    const auto [ptr, ec] = std::from_chars(text, end, rank);
    return ec == std::errc() && ptr == end && rank >= 0;
}

#ifndef NDEBUG
// Debug builds say once when a copy's host side is pageable: the driver then stages it through
// its own pinned buffer, synchronously, and the copy no longer overlaps with anything.
void warn_if_pageable(const void* host_ptr) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, host_ptr) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        return;
    }
    if (attributes.type == cudaMemoryTypeUnregistered) {
        log::warn_once("cuda-pageable-copy",
                       "CudaDevice: a copy uses pageable host memory; register it "
                       "(register_host_memory) for asynchronous transfers");
    }
}
#else
void warn_if_pageable(const void*) {}
#endif

}  // namespace

Status CudaDevice::probe() {
    return kernels::cuda::probe_device();
}

int CudaDevice::local_rank_from_environment() {
    for (const char* name :
         {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
        int rank = 0;
        if (parse_rank(std::getenv(name), rank)) return rank;
    }
    return 0;
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::create(const CudaDeviceOptions& options) {
    ZINF_ASSERT_GE(options.event_count_max, 1u);
    ZINF_TRY(probe());
    int count = 0;
    ZINF_CUDA_TRY(cudaGetDeviceCount(&count));
    if (options.local_rank < 0 || options.local_rank >= count) {
        return Status::invalid_argument(str_cat("CudaDevice: local rank ", options.local_rank,
                                                " has no GPU (", count, " visible)"));
    }
    const int ordinal = options.local_rank;
    ZINF_CUDA_TRY(cudaSetDevice(ordinal));
    cudaDeviceProp props{};
    ZINF_CUDA_TRY(cudaGetDeviceProperties(&props, ordinal));
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    ZINF_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));

    std::size_t budget = options.budget_bytes;
    if (budget == 0) {
        if (free_bytes <= options.reserve_bytes) {
            return Status::no_space(str_cat("CudaDevice cuda:", ordinal, ": ", free_bytes,
                                            " bytes free, less than the reserve of ",
                                            options.reserve_bytes));
        }
        budget = free_bytes - options.reserve_bytes;
    } else if (budget > total_bytes) {
        return Status::invalid_argument(str_cat("CudaDevice cuda:", ordinal, ": budget ", budget,
                                                " bytes exceeds the device's ", total_bytes));
    }

    std::unique_ptr<CudaDevice> device(
        new CudaDevice(ordinal, str_cat("cuda:", ordinal, " (", props.name, ")"), budget, options));
    // From here the destructor releases whatever was created if a later step fails.
    cudaStream_t stream0 = nullptr;
    ZINF_CUDA_TRY(cudaStreamCreateWithFlags(&stream0, cudaStreamNonBlocking));
    device->streams_[0] = stream0;
    device->stream_count_.store(1, std::memory_order_release);
    for (std::uint32_t e = 0; e < options.event_count_max; ++e) {
        cudaEvent_t event = nullptr;
        // Timing off: recording and waiting are cheaper, and nothing here reads elapsed times.
        ZINF_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        device->events_.push_back(event);
        device->event_in_use_.push_back(0);
    }
    // Hand out low ids first (pop from the back).
    for (std::uint32_t e = options.event_count_max; e > 0; --e)
        device->free_events_.push_back(e - 1);
    log::info("CudaDevice: ", device->name_, ", budget ", budget, " bytes of ", total_bytes, " (",
              free_bytes, " free), compute capability ", props.major, ".", props.minor);
    return device;
}

CudaDevice::CudaDevice(int ordinal, std::string name, std::size_t budget_bytes,
                       const CudaDeviceOptions& options)
    : ordinal_(ordinal), name_(std::move(name)), budget_bytes_(budget_bytes), options_(options) {
    streams_.assign(options.stream_count_max + 1, nullptr);
    events_.reserve(options.event_count_max);
    event_in_use_.reserve(options.event_count_max);
    free_events_.reserve(options.event_count_max);
}

CudaDevice::~CudaDevice() {
    if (cudaSetDevice(ordinal_) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        log::error("CudaDevice ", name_,
                   ": synchronize at teardown failed: ", cudaGetErrorString(cudaGetLastError()));
    }
    std::lock_guard lock(mutex_);
    if (!allocations_.empty()) {
        log::error("CudaDevice ", name_, ": ", allocations_.size(), " allocations (", used_bytes_,
                   " bytes) still held at teardown; freeing them");
        for (const auto& [ptr, size] : allocations_) static_cast<void>(cudaFree(ptr));
    }
    if (!host_regions_.empty()) {
        log::error("CudaDevice ", name_, ": ", host_regions_.size(),
                   " host regions still registered at teardown; unregistering them");
        for (const auto& [base, size] : host_regions_) {
            // The map's keys are the registered regions' own addresses.
            static_cast<void>(cudaHostUnregister(
                reinterpret_cast<void*>(base)));  // NOLINT(performance-no-int-to-ptr)
        }
    }
    for (cudaEvent_t event : events_) static_cast<void>(cudaEventDestroy(event));
    for (cudaStream_t stream : streams_) {
        if (stream != nullptr) static_cast<void>(cudaStreamDestroy(stream));
    }
    static_cast<void>(cudaGetLastError());
}

Status CudaDevice::make_current() const {
    ZINF_CUDA_TRY(cudaSetDevice(ordinal_));
    return Status::ok();
}

kernels::cuda::Stream CudaDevice::cuda_stream(StreamId stream) const noexcept {
    ZINF_ASSERT_LT(stream, stream_count_.load(std::memory_order_acquire));
    return streams_[stream];
}

Result<void*> CudaDevice::allocate(std::size_t size_bytes, std::string_view what) {
    ZINF_ASSERT_GT(size_bytes, std::size_t{0});
    ZINF_TRY(make_current());
    {
        std::lock_guard lock(mutex_);
        if (size_bytes > budget_bytes_ - used_bytes_) {
            return ledger_.over_budget(str_cat("CudaDevice ", name_), what, size_bytes,
                                       budget_bytes_, used_bytes_);
        }
        // Reserve under the lock so that two threads cannot both pass the check.
        used_bytes_ += size_bytes;
    }
    void* ptr = nullptr;
    const cudaError_t error = cudaMalloc(&ptr, size_bytes);
    std::lock_guard lock(mutex_);
    if (error != cudaSuccess) {
        used_bytes_ -= size_bytes;
        Status status = cuda_error_status(error, "cudaMalloc", __FILE__, __LINE__);
        return status.with_context(str_cat("CudaDevice ", name_, ": allocating ", size_bytes,
                                           " bytes for ", what, " (budget ", budget_bytes_, ", ",
                                           used_bytes_, " bytes ", ledger_.in_use(), ")"));
    }
    allocations_.emplace(ptr, size_bytes);
    ledger_.add(ptr, size_bytes, what);
    if (used_bytes_ > peak_bytes_) peak_bytes_ = used_bytes_;
    return ptr;
}

void CudaDevice::free(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::size_t size_bytes = 0;
    {
        std::lock_guard lock(mutex_);
        const auto it = allocations_.find(ptr);
        ZINF_ASSERT_MSG(it != allocations_.end(),
                        "CudaDevice::free of a pointer it did not allocate");
        size_bytes = it->second;
        allocations_.erase(it);
        ledger_.remove(ptr);
        ZINF_ASSERT_GE(used_bytes_, size_bytes);
        used_bytes_ -= size_bytes;
    }
    static_cast<void>(cudaSetDevice(ordinal_));
    const cudaError_t error = cudaFree(ptr);
    if (error != cudaSuccess) {
        // cudaFree fails only after a sticky error; the next stream call reports it as a Status.
        log::error("CudaDevice ", name_, ": cudaFree: ", cudaGetErrorString(error));
        static_cast<void>(cudaGetLastError());
    }
}

std::size_t CudaDevice::used_bytes() const noexcept {
    std::lock_guard lock(mutex_);
    return used_bytes_;
}

std::size_t CudaDevice::peak_bytes() const noexcept {
    std::lock_guard lock(mutex_);
    return peak_bytes_;
}

Result<StreamId> CudaDevice::create_stream() {
    ZINF_TRY(make_current());
    std::lock_guard lock(mutex_);
    const std::uint32_t id = stream_count_.load(std::memory_order_relaxed);
    if (id >= streams_.size()) {
        return Status::no_space(str_cat("CudaDevice ", name_, ": all ", options_.stream_count_max,
                                        " streams besides stream 0 exist (stream_count_max)"));
    }
    cudaStream_t stream = nullptr;
    ZINF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    streams_[id] = stream;
    // Publish after the slot is written: cuda_stream() reads it without the lock.
    stream_count_.store(id + 1, std::memory_order_release);
    return StreamId{id};
}

Status CudaDevice::check_event(EventId event) const {
    ZINF_ASSERT_LT(event, events_.size());
    ZINF_ASSERT_MSG(event_in_use_[event] != 0, "CudaDevice: event used after release");
    return Status::ok();
}

Result<EventId> CudaDevice::record_event(StreamId stream) {
    const cudaStream_t cuda_stream_handle = cuda_stream(stream);
    ZINF_TRY(make_current());
    EventId id = 0;
    {
        std::lock_guard lock(mutex_);
        if (free_events_.empty()) {
            return Status::busy(str_cat("CudaDevice ", name_, ": all ", events_.size(),
                                        " events are outstanding; release_event some"));
        }
        id = free_events_.back();
        free_events_.pop_back();
        ZINF_ASSERT_EQ(event_in_use_[id], 0);
        event_in_use_[id] = 1;
    }
    const cudaError_t error = cudaEventRecord(events_[id], cuda_stream_handle);
    if (error != cudaSuccess) {
        release_event(id);
        return cuda_error_status(error, "cudaEventRecord", __FILE__, __LINE__);
    }
    return id;
}

Status CudaDevice::stream_wait_event(StreamId stream, EventId event) {
    ZINF_TRY(check_event(event));
    ZINF_TRY(make_current());
    ZINF_CUDA_TRY(cudaStreamWaitEvent(cuda_stream(stream), events_[event], 0));
    return Status::ok();
}

Status CudaDevice::synchronize_event(EventId event) {
    ZINF_TRY(check_event(event));
    ZINF_TRY(make_current());
    ZINF_CUDA_TRY(cudaEventSynchronize(events_[event]));
    return Status::ok();
}

Result<bool> CudaDevice::event_done(EventId event) {
    ZINF_TRY(check_event(event));
    ZINF_TRY(make_current());
    const cudaError_t error = cudaEventQuery(events_[event]);
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) {
        // Not an error, but the runtime records it as this thread's last error: cleared, or the
        // next kernel launch's check (cudaGetLastError) would report it as its own failure.
        static_cast<void>(cudaGetLastError());
        return false;
    }
    return cuda_error_status(error, "cudaEventQuery", __FILE__, __LINE__);
}

void CudaDevice::release_event(EventId event) noexcept {
    std::lock_guard lock(mutex_);
    ZINF_ASSERT_LT(event, events_.size());
    ZINF_ASSERT_MSG(event_in_use_[event] != 0, "CudaDevice: event released twice");
    event_in_use_[event] = 0;
    // Never grows: capacity for every event was reserved at create.
    ZINF_ASSERT_LT(free_events_.size(), free_events_.capacity());
    free_events_.push_back(event);
}

Status CudaDevice::synchronize(StreamId stream) {
    ZINF_TRY(make_current());
    ZINF_CUDA_TRY(cudaStreamSynchronize(cuda_stream(stream)));
    return Status::ok();
}

Status CudaDevice::copy_to_device(void* device_dst, const void* host_src, std::size_t size_bytes,
                                  StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    ZINF_ASSERT(device_dst != nullptr);
    ZINF_ASSERT(host_src != nullptr);
    ZINF_TRY(make_current());
    warn_if_pageable(host_src);
    ZINF_CUDA_TRY(cudaMemcpyAsync(device_dst, host_src, size_bytes, cudaMemcpyHostToDevice,
                                  cuda_stream(stream)));
    return Status::ok();
}

Status CudaDevice::copy_to_host(void* host_dst, const void* device_src, std::size_t size_bytes,
                                StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    ZINF_ASSERT(host_dst != nullptr);
    ZINF_ASSERT(device_src != nullptr);
    ZINF_TRY(make_current());
    warn_if_pageable(host_dst);
    ZINF_CUDA_TRY(cudaMemcpyAsync(host_dst, device_src, size_bytes, cudaMemcpyDeviceToHost,
                                  cuda_stream(stream)));
    return Status::ok();
}

Status CudaDevice::copy_on_device(void* device_dst, const void* device_src, std::size_t size_bytes,
                                  StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    ZINF_ASSERT(device_dst != nullptr);
    ZINF_ASSERT(device_src != nullptr);
    ZINF_TRY(make_current());
    ZINF_CUDA_TRY(cudaMemcpyAsync(device_dst, device_src, size_bytes, cudaMemcpyDeviceToDevice,
                                  cuda_stream(stream)));
    return Status::ok();
}

Status CudaDevice::fill_zero(void* device_dst, std::size_t size_bytes, StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    ZINF_ASSERT(device_dst != nullptr);
    ZINF_TRY(make_current());
    ZINF_CUDA_TRY(cudaMemsetAsync(device_dst, 0, size_bytes, cuda_stream(stream)));
    return Status::ok();
}

std::string CudaDevice::pci_bus_id() const {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof id), ordinal_) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());  // no bus id is not an error of the next call
        return {};
    }
    return id;
}

Status CudaDevice::register_host_memory(std::span<std::byte> region) {
    ZINF_ASSERT(region.data() != nullptr);
    ZINF_ASSERT_GT(region.size(), std::size_t{0});
    ZINF_TRY(make_current());
    const auto base = reinterpret_cast<std::uintptr_t>(region.data());
    {
        std::lock_guard lock(mutex_);
        if (host_regions_.contains(base)) {
            return Status::invalid_argument(str_cat("CudaDevice ", name_, ": host region at 0x",
                                                    std::hex, base, " is already registered"));
        }
    }
    const cudaError_t error =
        cudaHostRegister(region.data(), region.size(), cudaHostRegisterPortable);
    if (error != cudaSuccess) {
        return cuda_error_status(error, "cudaHostRegister", __FILE__, __LINE__)
            .with_context(str_cat("CudaDevice ", name_, ": registering ", region.size(),
                                  " bytes of host memory"));
    }
    std::lock_guard lock(mutex_);
    host_regions_.emplace(base, region.size());
    return Status::ok();
}

Status CudaDevice::unregister_host_memory(void* base) {
    ZINF_ASSERT(base != nullptr);
    ZINF_TRY(make_current());
    {
        std::lock_guard lock(mutex_);
        const auto it = host_regions_.find(reinterpret_cast<std::uintptr_t>(base));
        if (it == host_regions_.end()) {
            return Status::invalid_argument(str_cat("CudaDevice ", name_,
                                                    ": unregistering host memory that was not "
                                                    "registered"));
        }
        host_regions_.erase(it);
    }
    ZINF_CUDA_TRY(cudaHostUnregister(base));
    return Status::ok();
}

}  // namespace zinf::device
