// DeviceBuffer: an owning, move-only allocation of device memory, counted against the Device's
// budget and freed on destruction.
#pragma once

#include <cstddef>
#include <utility>

#include "src/base/device.h"
#include "src/base/status.h"

namespace zinf {

class DeviceBuffer {
public:
    DeviceBuffer() noexcept = default;
    // Allocates size_bytes of device memory (nothing for 0), named `what` in the device's
    // accounting. Errors: Device::allocate's (kNoSpace when over the budget, naming `what`).
    static Result<DeviceBuffer> allocate(Device& device, std::size_t size_bytes, const char* what) {
        if (size_bytes == 0) return DeviceBuffer();
        auto ptr = device.allocate(size_bytes, what);
        if (!ptr.has_value()) return ptr.error();
        return DeviceBuffer(&device, *ptr, size_bytes);
    }
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(DeviceBuffer&& other) noexcept
        : device_(std::exchange(other.device_, nullptr)),
          data_(std::exchange(other.data_, nullptr)),
          size_bytes_(std::exchange(other.size_bytes_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
        if (this != &other) {
            reset();
            device_ = std::exchange(other.device_, nullptr);
            data_ = std::exchange(other.data_, nullptr);
            size_bytes_ = std::exchange(other.size_bytes_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    // The caller ensures no stream still uses the memory.
    void reset() noexcept {
        if (device_ != nullptr) device_->free(data_);
        device_ = nullptr;
        data_ = nullptr;
        size_bytes_ = 0;
    }

    void* data() const noexcept { return data_; }
    template <typename T>
    T* as() const noexcept {
        return static_cast<T*>(data_);
    }
    std::size_t size_bytes() const noexcept { return size_bytes_; }

private:
    DeviceBuffer(Device* device, void* data, std::size_t size_bytes) noexcept
        : device_(device), data_(data), size_bytes_(size_bytes) {}
    Device* device_ = nullptr;
    void* data_ = nullptr;
    std::size_t size_bytes_ = 0;
};

}  // namespace zinf
