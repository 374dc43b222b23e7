// CpuDevice: budgeted host memory as device memory, and one FIFO worker thread as its copy engine.
#include "src/device/cpu_device.h"

#include <cstring>
#include <utility>

#include "src/base/log.h"

namespace zinf::device {

Result<std::unique_ptr<CpuDevice>> CpuDevice::create(const CpuDeviceOptions& options) {
    if (options.alignment_bytes < sizeof(void*) ||
        (options.alignment_bytes & (options.alignment_bytes - 1)) != 0) {
        return Status::invalid_argument(
            str_cat("cpu device: alignment_bytes must be a power of two >= ", sizeof(void*),
                    ", got ", options.alignment_bytes));
    }
    if (options.queue_capacity == 0 || options.event_capacity == 0) {
        return Status::invalid_argument(
            "cpu device: queue_capacity and event_capacity must be > 0");
    }
    std::unique_ptr<CpuDevice> device(new CpuDevice(options));
    if (options.worker_thread)
        device->worker_ = std::thread([d = device.get()] { d->worker_main(); });
    return device;
}

CpuDevice::CpuDevice(const CpuDeviceOptions& options)
    : options_(options),
      ring_(options.queue_capacity),
      events_(options.event_capacity, kFreeEvent) {
    free_events_.reserve(options.event_capacity);
    // Hand out low ids first: pop_back takes from the end.
    for (std::size_t i = options.event_capacity; i > 0; --i)
        free_events_.push_back(static_cast<EventId>(i - 1));
}

CpuDevice::~CpuDevice() {
    {
        std::unique_lock lock(mutex_);
        stop_ = true;
    }
    work_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    ZINF_ASSERT_EQ(completed_seq_, enqueued_seq_);
    ZINF_ASSERT_MSG(allocations_.empty(),
                    str_cat("cpu device destroyed with ", allocations_.size(), " allocations (",
                            used_bytes_, " bytes) not freed"));
    ZINF_ASSERT_MSG(host_regions_.empty(),
                    "cpu device destroyed with host memory still registered");
}

Result<void*> CpuDevice::allocate(std::size_t size_bytes, std::string_view what) {
    if (size_bytes == 0) {
        return Status::invalid_argument(str_cat("cpu device: allocate of 0 bytes for ", what));
    }
    const std::size_t rounded = align_up(size_bytes, options_.alignment_bytes);
    std::unique_lock lock(mutex_);
    if (rounded > options_.budget_bytes - used_bytes_) {
        return ledger_.over_budget("cpu device", what, rounded, options_.budget_bytes, used_bytes_);
    }
    auto buffer = AlignedBuffer::allocate(rounded, options_.alignment_bytes);
    if (!buffer.has_value()) return buffer.error().with_context(str_cat("cpu device: ", what));
    if (rounded >= kDontForkMinBytes) buffer->keep_out_of_children();
    void* ptr = buffer->data();
    allocations_.emplace(reinterpret_cast<std::uintptr_t>(ptr), std::move(buffer).value());
    ledger_.add(ptr, rounded, what);
    used_bytes_ += rounded;
    if (used_bytes_ > peak_bytes_) peak_bytes_ = used_bytes_;
    ZINF_ASSERT_LE(used_bytes_, options_.budget_bytes);
    return ptr;
}

void CpuDevice::free(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::unique_lock lock(mutex_);
    // As cudaFree does, wait for the work queued so far: a copy or fill queued on the memory
    // (an error path that frees what it just filled) must not run on freed pages.
    const std::uint64_t target = enqueued_seq_;
    done_cv_.wait(lock, [&] { return completed_seq_ >= target; });
    auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(ptr));
    ZINF_ASSERT_MSG(it != allocations_.end(), "cpu device: free of a pointer it did not allocate");
    ZINF_ASSERT_GE(used_bytes_, it->second.size());
    used_bytes_ -= it->second.size();
    ledger_.remove(ptr);
    allocations_.erase(it);
}

std::size_t CpuDevice::used_bytes() const noexcept {
    std::unique_lock lock(mutex_);
    return used_bytes_;
}

std::size_t CpuDevice::peak_bytes() const noexcept {
    std::unique_lock lock(mutex_);
    return peak_bytes_;
}

std::uint64_t CpuDevice::bytes_copied() const noexcept {
    std::unique_lock lock(mutex_);
    return bytes_copied_;
}

Result<StreamId> CpuDevice::create_stream() {
    std::unique_lock lock(mutex_);
    return StreamId{stream_count_++};
}

Result<EventId> CpuDevice::record_event(StreamId stream) {
    std::unique_lock lock(mutex_);
    ZINF_ASSERT_LT(stream, stream_count_);
    if (free_events_.empty()) {
        return Status::busy(
            str_cat("cpu device: all ", options_.event_capacity, " events are outstanding"));
    }
    const EventId event = free_events_.back();
    free_events_.pop_back();
    ZINF_ASSERT_EQ(events_[event], kFreeEvent);
    // The one FIFO serves every stream, so the event waits for everything enqueued so far.
    events_[event] = enqueued_seq_;
    return event;
}

Status CpuDevice::stream_wait_event(StreamId stream, EventId event) {
    std::unique_lock lock(mutex_);
    ZINF_ASSERT_LT(stream, stream_count_);
    ZINF_ASSERT_LT(event, events_.size());
    ZINF_ASSERT_NE(events_[event], kFreeEvent);
    // Work queued on `stream` after this call runs after everything already in the FIFO.
    return Status::ok();
}

bool CpuDevice::event_done_locked(EventId event) const {
    ZINF_ASSERT_LT(event, events_.size());
    ZINF_ASSERT_NE(events_[event], kFreeEvent);
    return completed_seq_ >= events_[event];
}

Status CpuDevice::synchronize_event(EventId event) {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return event_done_locked(event); });
    return Status::ok();
}

Result<bool> CpuDevice::event_done(EventId event) {
    std::unique_lock lock(mutex_);
    return event_done_locked(event);
}

void CpuDevice::release_event(EventId event) noexcept {
    std::unique_lock lock(mutex_);
    ZINF_ASSERT_LT(event, events_.size());
    ZINF_ASSERT_NE(events_[event], kFreeEvent);
    events_[event] = kFreeEvent;
    free_events_.push_back(event);  // capacity reserved at construction: never reallocates
}

Status CpuDevice::synchronize(StreamId stream) {
    std::unique_lock lock(mutex_);
    ZINF_ASSERT_LT(stream, stream_count_);
    const std::uint64_t target = enqueued_seq_;
    done_cv_.wait(lock, [&] { return completed_seq_ >= target; });
    return Status::ok();
}

bool CpuDevice::owns_range_locked(const void* ptr, std::size_t size_bytes) const {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    auto it = allocations_.upper_bound(address);
    if (it != allocations_.begin()) {
        --it;
        if (address >= it->first && address + size_bytes <= it->first + it->second.size())
            return true;
    }
    // Registered host memory is device memory to the CPU device (outside its budget): host
    // copies of offloaded states are used in place.
    auto h = host_regions_.upper_bound(address);
    if (h == host_regions_.begin()) return false;
    --h;
    return address >= h->first && address + size_bytes <= h->first + h->second;
}

void CpuDevice::run_op(const Op& op) noexcept {
    if (op.kind == Op::Kind::kCopy) {
        std::memcpy(op.dst, op.src, op.size_bytes);
    } else {
        std::memset(op.dst, 0, op.size_bytes);
    }
}

Status CpuDevice::enqueue(const Op& op, StreamId stream) {
    std::unique_lock lock(mutex_);
    ZINF_ASSERT_LT(stream, stream_count_);
    if (!options_.worker_thread) {
        // Inline mode: run under the lock so that enqueue/complete counters stay consistent.
        run_op(op);
        ++enqueued_seq_;
        ++completed_seq_;
        if (op.kind == Op::Kind::kCopy) bytes_copied_ += op.size_bytes;
        return Status::ok();
    }
    // A full ring is backpressure; the worker always drains it, so the wait is bounded by the
    // time of queue_capacity copies.
    done_cv_.wait(lock, [&] { return enqueued_seq_ - completed_seq_ < ring_.size(); });
    ring_[enqueued_seq_ % ring_.size()] = op;
    ++enqueued_seq_;
    lock.unlock();
    work_cv_.notify_one();
    return Status::ok();
}

void CpuDevice::worker_main() {
    std::unique_lock lock(mutex_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stop_ || completed_seq_ < enqueued_seq_; });
        if (completed_seq_ == enqueued_seq_) {
            ZINF_ASSERT(stop_);
            return;
        }
        // The slot stays ours until completed_seq_ moves past it: enqueue never overwrites it.
        const Op op = ring_[completed_seq_ % ring_.size()];
        lock.unlock();
        if (options_.op_delay.count() > 0) std::this_thread::sleep_for(options_.op_delay);
        run_op(op);
        lock.lock();
        ++completed_seq_;
        if (op.kind == Op::Kind::kCopy) bytes_copied_ += op.size_bytes;
        done_cv_.notify_all();
    }
}

Status CpuDevice::copy_to_device(void* device_dst, const void* host_src, std::size_t size_bytes,
                                 StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    ZINF_ASSERT(host_src != nullptr);
    {
        std::unique_lock lock(mutex_);
        ZINF_ASSERT_MSG(owns_range_locked(device_dst, size_bytes),
                        "copy_to_device: destination is not inside one device allocation");
    }
    return enqueue(Op{Op::Kind::kCopy, device_dst, host_src, size_bytes}, stream);
}

Status CpuDevice::copy_to_host(void* host_dst, const void* device_src, std::size_t size_bytes,
                               StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    ZINF_ASSERT(host_dst != nullptr);
    {
        std::unique_lock lock(mutex_);
        ZINF_ASSERT_MSG(owns_range_locked(device_src, size_bytes),
                        "copy_to_host: source is not inside one device allocation");
    }
    return enqueue(Op{Op::Kind::kCopy, host_dst, device_src, size_bytes}, stream);
}

Status CpuDevice::copy_on_device(void* device_dst, const void* device_src, std::size_t size_bytes,
                                 StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    {
        std::unique_lock lock(mutex_);
        ZINF_ASSERT_MSG(owns_range_locked(device_dst, size_bytes),
                        "copy_on_device: destination is not inside one device allocation");
        ZINF_ASSERT_MSG(owns_range_locked(device_src, size_bytes),
                        "copy_on_device: source is not inside one device allocation");
    }
    return enqueue(Op{Op::Kind::kCopy, device_dst, device_src, size_bytes}, stream);
}

Status CpuDevice::fill_zero(void* device_dst, std::size_t size_bytes, StreamId stream) {
    if (size_bytes == 0) return Status::ok();
    {
        std::unique_lock lock(mutex_);
        ZINF_ASSERT_MSG(owns_range_locked(device_dst, size_bytes),
                        "fill_zero: destination is not inside one device allocation");
    }
    return enqueue(Op{Op::Kind::kFill, device_dst, nullptr, size_bytes}, stream);
}

Status CpuDevice::register_host_memory(std::span<std::byte> region) {
    if (region.empty())
        return Status::invalid_argument("cpu device: registering an empty host region");
    std::unique_lock lock(mutex_);
    const auto base = reinterpret_cast<std::uintptr_t>(region.data());
    if (!host_regions_.emplace(base, region.size()).second) {
        return Status::invalid_argument("cpu device: host region registered twice");
    }
    return Status::ok();
}

Status CpuDevice::unregister_host_memory(void* base) {
    std::unique_lock lock(mutex_);
    if (host_regions_.erase(reinterpret_cast<std::uintptr_t>(base)) == 0) {
        return Status::not_found("cpu device: unregistering host memory that was not registered");
    }
    return Status::ok();
}

}  // namespace zinf::device
