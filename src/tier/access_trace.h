// AccessTrace: the order in which partitions were acquired during one recorded iteration, and
// the next-use distances that prefetch and Belady eviction read from it. Training repeats the
// same order every step, so the trace is treated as cyclic: after its last access comes its first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "src/base/assert.h"
#include "src/tier/types.h"

namespace zinf::tier {

// Distance of a partition that does not occur in the trace: further than any that does.
constexpr std::uint64_t kNoNextUse = std::numeric_limits<std::uint64_t>::max();

class AccessTrace {
public:
    AccessTrace() = default;

    // Replaces the trace with `accesses`. Every id must be < partition_capacity. Allocates
    // (per-partition position lists): called once per recording, never in the steady state.
    void assign(std::span<const Access> accesses, std::size_t partition_capacity);
    void clear() noexcept;

    bool empty() const noexcept { return accesses_.empty(); }
    std::size_t size() const noexcept { return accesses_.size(); }
    std::span<const Access> accesses() const noexcept { return accesses_; }
    const Access& at(std::size_t position) const {
        ZINF_ASSERT_LT(position, accesses_.size());
        return accesses_[position];
    }

    // Accesses from `cursor` (the position of the next access, in [0, size()]) to the next access
    // of `id`, cyclically: 0 when the access at `cursor` is `id`; a position before the cursor
    // counts as next iteration's. kNoNextUse when `id` is not in the trace. O(log k) for k
    // occurrences of `id`; never allocates.
    std::uint64_t next_use_distance(PartitionId id, std::size_t cursor) const noexcept;
    // How many times `id` occurs.
    std::size_t occurrences(PartitionId id) const noexcept;

private:
    std::vector<Access> accesses_;
    // Positions of each id, in CSR form: positions_[offsets_[id] .. offsets_[id + 1]), ascending.
    std::vector<std::uint32_t> offsets_;
    std::vector<std::uint32_t> positions_;
};

}  // namespace zinf::tier
