// Aligned host memory: an owning, move-only buffer for O_DIRECT I/O and SIMD kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "src/base/assert.h"
#include "src/base/status.h"

namespace zinf {

constexpr std::size_t kPageBytes = 4096;
// Alignment of every buffer handed to I/O: covers any logical block size up to 4 KiB and
// the 64-byte lines AVX-512 loads prefer.
constexpr std::size_t kDefaultAlignmentBytes = 4096;

constexpr std::size_t align_up(std::size_t value, std::size_t alignment) noexcept {
    return (value + alignment - 1) / alignment * alignment;
}
constexpr std::size_t align_down(std::size_t value, std::size_t alignment) noexcept {
    return value / alignment * alignment;
}
constexpr bool is_aligned(std::size_t value, std::size_t alignment) noexcept {
    return value % alignment == 0;
}
inline bool is_aligned(const void* ptr, std::size_t alignment) noexcept {
    return reinterpret_cast<std::uintptr_t>(ptr) % alignment == 0;
}

class AlignedBuffer {
public:
    AlignedBuffer() noexcept = default;
    // Allocates size_bytes (rounded up to the alignment); zero-filled when zero_fill.
    static Result<AlignedBuffer> allocate(std::size_t size_bytes,
                                          std::size_t alignment = kDefaultAlignmentBytes,
                                          bool zero_fill = false);
    ~AlignedBuffer();
    AlignedBuffer(AlignedBuffer&& other) noexcept;
    AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
    AlignedBuffer(const AlignedBuffer&) = delete;
    AlignedBuffer& operator=(const AlignedBuffer&) = delete;

    std::byte* data() noexcept { return data_; }
    const std::byte* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_bytes_; }
    std::span<std::byte> span() noexcept { return {data_, size_bytes_}; }
    std::span<const std::byte> span() const noexcept { return {data_, size_bytes_}; }
    template <typename T>
    T* as() noexcept {
        return reinterpret_cast<T*>(data_);
    }
    bool empty() const noexcept { return size_bytes_ == 0; }

private:
    AlignedBuffer(std::byte* data, std::size_t size_bytes) noexcept : data_(data), size_bytes_(size_bytes) {}
    std::byte* data_ = nullptr;
    std::size_t size_bytes_ = 0;
};

}  // namespace zinf
