// Belady-with-write-back-penalty and LRU victim choice.
#include "src/tier/eviction.h"

#include "src/base/assert.h"

namespace zinf::tier {

namespace {

// Far beyond any real distance (a trace of < 2^32 accesses) and still exact in a double after
// subtracting a penalty, so "never used again" stays further than anything used again.
constexpr double kNeverDistance = 1e18;

}  // namespace

double belady_score(const EvictionCandidate& candidate, const EvictionPolicy& policy) noexcept {
    ZINF_ASSERT_GT(policy.bytes_per_access, 0.0);
    const double distance = candidate.next_use_distance == kNoNextUse
                                ? kNeverDistance
                                : static_cast<double>(candidate.next_use_distance);
    const double penalty = policy.dirty_weight * static_cast<double>(candidate.write_back_bytes) /
                           policy.bytes_per_access;
    return distance - penalty;
}

std::size_t choose_victim(std::span<const EvictionCandidate> candidates,
                          const EvictionPolicy& policy) noexcept {
    ZINF_ASSERT(!candidates.empty());
    std::size_t best = 0;
    if (policy.use_trace) {
        double best_score = belady_score(candidates[0], policy);
        for (std::size_t i = 1; i < candidates.size(); ++i) {
            const EvictionCandidate& c = candidates[i];
            const EvictionCandidate& b = candidates[best];
            const double score = belady_score(c, policy);
            bool better = score > best_score;
            if (score == best_score) {
                const bool c_clean = c.write_back_bytes == 0;
                const bool b_clean = b.write_back_bytes == 0;
                if (c_clean != b_clean) {
                    better = c_clean;
                } else if (c.last_use_tick != b.last_use_tick) {
                    better = c.last_use_tick < b.last_use_tick;
                } else {
                    better = c.id < b.id;
                }
            }
            if (better) {
                best = i;
                best_score = score;
            }
        }
        return best;
    }
    for (std::size_t i = 1; i < candidates.size(); ++i) {
        const EvictionCandidate& c = candidates[i];
        const EvictionCandidate& b = candidates[best];
        bool better = c.last_use_tick < b.last_use_tick;
        if (c.last_use_tick == b.last_use_tick) {
            const bool c_clean = c.write_back_bytes == 0;
            const bool b_clean = b.write_back_bytes == 0;
            better = c_clean != b_clean ? c_clean : c.id < b.id;
        }
        if (better) best = i;
    }
    return best;
}

}  // namespace zinf::tier
