// ExtentAllocator: best-fit allocation and coalescing free over a sorted free list.
#include "src/tier/extent_allocator.h"

#include <algorithm>

#include "src/base/assert.h"

namespace zinf::tier {

ExtentAllocator::ExtentAllocator(std::size_t capacity_bytes, std::size_t alignment_bytes,
                                 std::size_t max_extents)
    : capacity_bytes_(capacity_bytes / alignment_bytes * alignment_bytes),
      alignment_bytes_(alignment_bytes),
      max_extents_(max_extents) {
    ZINF_ASSERT_GT(alignment_bytes, 0u);
    // n allocations split the region into at most n + 1 free extents.
    free_.reserve(max_extents + 1);
    if (capacity_bytes_ > 0) free_.push_back({0, capacity_bytes_});
}

std::size_t ExtentAllocator::rounded(std::size_t size_bytes) const noexcept {
    return (size_bytes + alignment_bytes_ - 1) / alignment_bytes_ * alignment_bytes_;
}

std::size_t ExtentAllocator::largest_free_bytes() const noexcept {
    std::size_t largest = 0;
    for (const Extent& e : free_) largest = std::max(largest, e.size_bytes);
    return largest;
}

std::optional<std::size_t> ExtentAllocator::allocate(std::size_t size_bytes) noexcept {
    ZINF_ASSERT_GT(size_bytes, 0u);
    const std::size_t need = rounded(size_bytes);
    if (outstanding_count_ == max_extents_) return std::nullopt;
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].size_bytes >= need &&
            (best == free_.size() || free_[i].size_bytes < free_[best].size_bytes)) {
            best = i;
        }
    }
    if (best == free_.size()) return std::nullopt;
    const std::size_t offset = free_[best].offset_bytes;
    if (free_[best].size_bytes == need) {
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    } else {
        free_[best].offset_bytes += need;
        free_[best].size_bytes -= need;
    }
    used_bytes_ += need;
    ++outstanding_count_;
    ZINF_ASSERT_LE(used_bytes_, capacity_bytes_);
    ZINF_ASSERT_LE(offset + need, capacity_bytes_);
    return offset;
}

void ExtentAllocator::free(std::size_t offset_bytes, std::size_t size_bytes) noexcept {
    const std::size_t size = rounded(size_bytes);
    ZINF_ASSERT_LE(offset_bytes + size, capacity_bytes_);
    ZINF_ASSERT_GT(outstanding_count_, 0u);
    ZINF_ASSERT_GE(used_bytes_, size);
    // First free extent after the returned one.
    auto next =
        std::lower_bound(free_.begin(), free_.end(), offset_bytes,
                         [](const Extent& e, std::size_t off) { return e.offset_bytes < off; });
    // Negative space: the returned extent must not overlap a free one (double free).
    if (next != free_.end()) ZINF_ASSERT_LE(offset_bytes + size, next->offset_bytes);
    if (next != free_.begin()) {
        const Extent& prev = *(next - 1);
        ZINF_ASSERT_LE(prev.offset_bytes + prev.size_bytes, offset_bytes);
    }
    const bool merge_prev =
        next != free_.begin() && (next - 1)->offset_bytes + (next - 1)->size_bytes == offset_bytes;
    const bool merge_next = next != free_.end() && offset_bytes + size == next->offset_bytes;
    if (merge_prev && merge_next) {
        (next - 1)->size_bytes += size + next->size_bytes;
        free_.erase(next);
    } else if (merge_prev) {
        (next - 1)->size_bytes += size;
    } else if (merge_next) {
        next->offset_bytes = offset_bytes;
        next->size_bytes += size;
    } else {
        ZINF_ASSERT_LT(free_.size(), free_.capacity());  // reserved: insert never reallocates
        free_.insert(next, Extent{offset_bytes, size});
    }
    used_bytes_ -= size;
    --outstanding_count_;
}

}  // namespace zinf::tier
