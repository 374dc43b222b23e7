// ExtentAllocator: carves variable-sized, aligned extents out of one fixed region (a tier's
// budget), so that no partition is ever allocated on its own. Offsets only; the caller owns the
// memory. Best fit over an offset-sorted free list, coalescing on free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace zinf::tier {

class ExtentAllocator {
public:
    ExtentAllocator() = default;
    // A region of capacity_bytes (rounded down to alignment_bytes); at most max_extents
    // allocations outstanding at once. The free list is reserved here and never grows.
    ExtentAllocator(std::size_t capacity_bytes, std::size_t alignment_bytes,
                    std::size_t max_extents);

    // The offset of an extent of align_up(size_bytes) bytes, or nullopt when no free extent is
    // large enough (the caller evicts and retries). Never allocates memory.
    std::optional<std::size_t> allocate(std::size_t size_bytes) noexcept;
    // Returns an extent; size_bytes as given to allocate(). Asserts it was allocated (it must
    // not overlap any free extent).
    void free(std::size_t offset_bytes, std::size_t size_bytes) noexcept;

    std::size_t capacity_bytes() const noexcept { return capacity_bytes_; }
    std::size_t used_bytes() const noexcept { return used_bytes_; }
    std::size_t free_bytes() const noexcept { return capacity_bytes_ - used_bytes_; }
    std::size_t largest_free_bytes() const noexcept;
    std::size_t rounded(std::size_t size_bytes) const noexcept;
    std::size_t alignment_bytes() const noexcept { return alignment_bytes_; }

    struct Extent {
        std::size_t offset_bytes;
        std::size_t size_bytes;
    };
    // The free extents, by offset, coalesced.
    std::span<const Extent> free_extents() const noexcept { return free_; }

private:
    std::size_t capacity_bytes_ = 0;
    std::size_t alignment_bytes_ = 1;
    std::size_t used_bytes_ = 0;
    std::size_t outstanding_count_ = 0;
    std::size_t max_extents_ = 0;
    std::vector<Extent> free_;  // sorted by offset, never adjacent (coalesced)
};

}  // namespace zinf::tier
