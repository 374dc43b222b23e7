// choose_victim: Belady with the write-back penalty, and LRU, on hand-made candidate lists.
#include "src/tier/eviction.h"

#include <gtest/gtest.h>

#include <vector>

namespace zinf::tier {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

EvictionPolicy belady(double bytes_per_access = kMiB, double dirty_weight = 1.0) {
    return EvictionPolicy{true, bytes_per_access, dirty_weight};
}

PartitionId victim(const std::vector<EvictionCandidate>& c, const EvictionPolicy& p) {
    return c[choose_victim(c, p)].id;
}

TEST(Eviction, BeladyChoosesTheFurthestNextUse) {
    const std::vector<EvictionCandidate> c = {
        {1, 3, 10, 0}, {2, 9, 11, 0}, {3, 5, 1, 0}, {4, 0, 0, 0}};
    EXPECT_EQ(victim(c, belady()), 2u);
}

TEST(Eviction, NeverUsedAgainGoesFirst) {
    const std::vector<EvictionCandidate> c = {
        {1, 1000000, 0, 0}, {2, kNoNextUse, 5, kMiB}, {3, 7, 0, 0}};
    // Even dirty: with no next use, its write-back is the only cost it will ever have.
    EXPECT_EQ(victim(c, belady()), 2u);
}

TEST(Eviction, ADirtyCopyMustBeFurtherByMoreThanItsWriteBack) {
    // 1 MiB partitions, 1 MiB per access: a write-back costs one access.
    // Dirty 2 at distance 6 scores 5; clean 1 at distance 5 scores 5: the tie goes to clean.
    EXPECT_EQ(victim({{1, 5, 0, 0}, {2, 6, 0, kMiB}}, belady()), 1u);
    // Dirty 2 at distance 7 scores 6 > 5: it is evicted (and written back).
    EXPECT_EQ(victim({{1, 5, 0, 0}, {2, 7, 0, kMiB}}, belady()), 2u);
    // A larger dirty partition costs more accesses: 4 MiB is four.
    EXPECT_EQ(victim({{1, 5, 0, 0}, {2, 9, 0, 4 * kMiB}}, belady()), 1u);
    EXPECT_EQ(victim({{1, 5, 0, 0}, {2, 10, 0, 4 * kMiB}}, belady()), 2u);
    // Weight 0: pure Belady; dirtiness only breaks ties.
    EXPECT_EQ(victim({{1, 5, 0, 0}, {2, 6, 0, kMiB}}, belady(kMiB, 0.0)), 2u);
    EXPECT_EQ(victim({{1, 6, 0, kMiB}, {2, 6, 0, 0}}, belady(kMiB, 0.0)), 2u);
    // Small accesses make the same write-back relatively dearer.
    EXPECT_EQ(victim({{1, 5, 0, 0}, {2, 7, 0, kMiB}}, belady(kMiB / 4)), 1u);
}

TEST(Eviction, TiesGoToCleanThenLeastRecentThenLowestId) {
    EXPECT_EQ(victim({{5, 4, 9, 0}, {6, 4, 3, 0}}, belady()), 6u);
    EXPECT_EQ(victim({{6, 4, 3, 0}, {5, 4, 3, 0}}, belady()), 5u);
    EXPECT_EQ(victim({{1, 4, 1, kMiB}, {2, 3, 9, 0}}, belady()), 2u);
}

TEST(Eviction, LruWithoutATrace) {
    const EvictionPolicy lru{false, 1.0, 1.0};
    // Distances are ignored: the least recently used goes.
    EXPECT_EQ(victim({{1, 0, 7, 0}, {2, 100, 9, 0}, {3, 50, 8, kMiB}}, lru), 1u);
    EXPECT_EQ(victim({{1, 0, 7, kMiB}, {2, 100, 7, 0}}, lru), 2u);
    EXPECT_EQ(victim({{4, 0, 7, 0}, {2, 100, 7, 0}}, lru), 2u);
}

}  // namespace
}  // namespace zinf::tier
