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

// A transparent huge page (x86-64 PMD size).
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Asks the kernel to back the whole 2 MiB-aligned pages inside `region` with transparent huge
// pages (madvise MADV_HUGEPAGE), for memory not yet touched. Returns the bytes advised: 0 where
// the region holds no whole huge page or the kernel refuses (THP compiled out).
//
// Why I/O buffers want this: an O_DIRECT piece becomes one block-layer segment per physically
// contiguous run of its buffer, and a request holds at most the device's max_segments of them.
// In 4 KiB pages that happen to be scattered, a 1 MiB piece needs 256 segments, which a
// virtio disk (254) splits into two requests; in a huge page it is one segment, and adjacent
// pieces submitted together merge into larger requests. On the development machines' virtual
// disk the request count, not the bytes, sets the throughput: the same fio job ran at 0.9-1.3
// GB/s with 1.8-2.3 requests per MiB and our passes at 6-9 GB/s with 0.3 (PERFORMANCE.md).
std::size_t advise_huge_pages(std::span<std::byte> region) noexcept;

// Bytes of the mappings holding `region` that the kernel currently backs with transparent huge
// pages (AnonHugePages in /proc/self/smaps, summed over every mapping that overlaps the region,
// so it may count a neighbouring part of those mappings). For tests and diagnostics.
Result<std::size_t> huge_page_bytes_backing(std::span<const std::byte> region);

// True when the kernel hands out transparent huge pages to regions advised so ("always" or
// "madvise" in /sys/kernel/mm/transparent_hugepage/enabled).
bool transparent_huge_pages_available() noexcept;

// Marks the whole pages inside `region` as not inherited by a child process (MADV_DONTFORK), or
// inherited again (MADV_DOFORK; memory must be given back so before it is freed, since the
// allocator may hand its pages to anything). A fork (a torch DataLoader's workers) then neither
// shares the engine's buffers copy-on-write nor copies them. Returns the bytes advised.
std::size_t advise_dont_fork(std::span<std::byte> region, bool dont_fork) noexcept;
// Buffers from this size up are kept out of children (smaller ones are not worth a call).
inline constexpr std::size_t kDontForkMinBytes = std::size_t{1} << 20;

class AlignedBuffer {
public:
    AlignedBuffer() noexcept = default;
    // Allocates size_bytes (rounded up to the alignment); zero-filled when zero_fill.
    static Result<AlignedBuffer> allocate(std::size_t size_bytes,
                                          std::size_t alignment = kDefaultAlignmentBytes,
                                          bool zero_fill = false);
    // As allocate, for buffers that O_DIRECT I/O moves: from 2 MiB up, aligned to a huge page
    // and advised to be backed by huge pages (advise_huge_pages) before anything touches it.
    static Result<AlignedBuffer> allocate_for_io(std::size_t size_bytes, bool zero_fill = false);
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
    // advise_dont_fork on the buffer, undone before it is freed.
    void keep_out_of_children() noexcept;

private:
    void release() noexcept;
    AlignedBuffer(std::byte* data, std::size_t size_bytes) noexcept
        : data_(data), size_bytes_(size_bytes) {}
    std::byte* data_ = nullptr;
    std::size_t size_bytes_ = 0;
    bool dont_fork_ = false;
};

}  // namespace zinf
