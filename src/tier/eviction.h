// The eviction choice as a pure function: given the evictable residents of one tier, which one
// goes. Belady (furthest next use in the recorded trace) with a write-back penalty for dirty
// copies; LRU where there is no trace. Kept free of manager state so that it can be tested on
// hand-made candidate lists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "src/tier/access_trace.h"
#include "src/tier/types.h"

namespace zinf::tier {

struct EvictionCandidate {
    PartitionId id = kNoPartition;
    // Accesses until the next use (AccessTrace::next_use_distance); kNoNextUse if none.
    std::uint64_t next_use_distance = kNoNextUse;
    // LRU clock of the last acquire or release; smaller is older.
    std::uint64_t last_use_tick = 0;
    // Bytes that must be written to the tier below before the copy can be dropped: 0 when the
    // tier below already holds the same bytes (clean), the partition's size when dirty.
    std::uint64_t write_back_bytes = 0;
};

struct EvictionPolicy {
    // Belady along the trace when true; LRU when false (no trace recorded yet, or the access
    // order changed and the trace is being re-recorded).
    bool use_trace = false;
    // Average bytes per access of the trace (sum of the accessed partitions' sizes / trace
    // length). Converts write-back bytes into accesses. Must be > 0 when use_trace.
    double bytes_per_access = 1.0;
    // Scales the write-back penalty; 0 ignores dirtiness except as a tie-break.
    double dirty_weight = 1.0;
};

// The rule (Belady with write-back cost). Each candidate scores
//
//     score = next_use_distance - dirty_weight * write_back_bytes / bytes_per_access
//
// and the highest score is evicted. Rationale: evicting any copy costs one fetch at its next
// use, so pure Belady picks the furthest next use; evicting a dirty copy costs a write of its
// bytes *now* as well. Expressed in accesses (the time one average access's bytes take to move),
// that write is as bad as being needed `write_back_bytes / bytes_per_access` accesses sooner.
// So a dirty partition is chosen over a clean one only if its next use is further by more than
// its write-back cost. kNoNextUse counts as further than any distance, for dirty and clean alike.
// Ties (equal score) go to the clean candidate, then the least recently used, then the lower id,
// so that the choice is deterministic.
//
// LRU: the smallest last_use_tick; ties to clean, then lower id.
//
// Precondition: candidates is not empty. Returns an index into candidates. O(n), no allocation.
std::size_t choose_victim(std::span<const EvictionCandidate> candidates,
                          const EvictionPolicy& policy) noexcept;

// The Belady score above (exposed for tests and logs).
double belady_score(const EvictionCandidate& candidate, const EvictionPolicy& policy) noexcept;

}  // namespace zinf::tier
