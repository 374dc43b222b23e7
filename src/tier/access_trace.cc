// AccessTrace: CSR position lists built once per recording; next-use queries by binary search.
#include "src/tier/access_trace.h"

#include <algorithm>

#include "src/base/assert.h"

namespace zinf::tier {

void AccessTrace::assign(std::span<const Access> accesses, std::size_t partition_capacity) {
    // Positions are stored as 32-bit values: a trace of 4e9 accesses per iteration is far beyond
    // any model (one access per partition per pass).
    ZINF_ASSERT_LT(accesses.size(), std::size_t{std::numeric_limits<std::uint32_t>::max()});
    accesses_.assign(accesses.begin(), accesses.end());
    offsets_.assign(partition_capacity + 1, 0);
    for (const Access& a : accesses_) {
        ZINF_ASSERT_LT(a.id, partition_capacity);
        ++offsets_[a.id + 1];
    }
    for (std::size_t i = 1; i < offsets_.size(); ++i) offsets_[i] += offsets_[i - 1];
    positions_.assign(accesses_.size(), 0);
    std::vector<std::uint32_t> fill(offsets_.begin(), offsets_.end() - 1);
    for (std::size_t pos = 0; pos < accesses_.size(); ++pos) {
        positions_[fill[accesses_[pos].id]++] = static_cast<std::uint32_t>(pos);
    }
}

void AccessTrace::clear() noexcept {
    accesses_.clear();
    offsets_.clear();
    positions_.clear();
}

std::size_t AccessTrace::occurrences(PartitionId id) const noexcept {
    if (static_cast<std::size_t>(id) + 1 >= offsets_.size()) return 0;
    return offsets_[id + 1] - offsets_[id];
}

std::uint64_t AccessTrace::next_use_distance(PartitionId id, std::size_t cursor) const noexcept {
    ZINF_ASSERT_LE(cursor, accesses_.size());
    if (occurrences(id) == 0) return kNoNextUse;
    const auto first = positions_.begin() + offsets_[id];
    const auto last = positions_.begin() + offsets_[id + 1];
    const auto it = std::lower_bound(first, last, static_cast<std::uint32_t>(cursor));
    if (it != last) return *it - cursor;
    // Wraps into the next iteration.
    return accesses_.size() - cursor + *first;
}

}  // namespace zinf::tier
