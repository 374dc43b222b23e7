// AccessTrace: cyclic next-use distances.
#include "src/tier/access_trace.h"

#include <gtest/gtest.h>

#include <vector>

namespace zinf::tier {
namespace {

std::vector<Access> accesses(std::initializer_list<PartitionId> ids) {
    std::vector<Access> out;
    for (PartitionId id : ids) out.push_back({id, Tier::kDevice});
    return out;
}

TEST(AccessTrace, NextUseDistanceIsCyclic) {
    AccessTrace trace;
    EXPECT_TRUE(trace.empty());
    const auto a = accesses({0, 1, 2, 1, 3, 0});
    trace.assign(a, 8);
    ASSERT_EQ(trace.size(), 6u);
    EXPECT_EQ(trace.occurrences(0), 2u);
    EXPECT_EQ(trace.occurrences(1), 2u);
    EXPECT_EQ(trace.occurrences(4), 0u);
    // Cursor 0: the next access is partition 0 itself.
    EXPECT_EQ(trace.next_use_distance(0, 0), 0u);
    EXPECT_EQ(trace.next_use_distance(1, 0), 1u);
    EXPECT_EQ(trace.next_use_distance(3, 0), 4u);
    // Cursor 2: partition 1 next at position 3.
    EXPECT_EQ(trace.next_use_distance(1, 2), 1u);
    // Cursor 4: partition 2 wraps into the next iteration (position 2): 6 - 4 + 2.
    EXPECT_EQ(trace.next_use_distance(2, 4), 4u);
    // Cursor at the end: the next access is next iteration's first.
    EXPECT_EQ(trace.next_use_distance(0, 6), 0u);
    EXPECT_EQ(trace.next_use_distance(3, 6), 4u);
    // Not in the trace.
    EXPECT_EQ(trace.next_use_distance(4, 3), kNoNextUse);
    EXPECT_EQ(trace.next_use_distance(7, 0), kNoNextUse);
    trace.clear();
    EXPECT_TRUE(trace.empty());
    EXPECT_EQ(trace.next_use_distance(0, 0), kNoNextUse);
}

TEST(AccessTrace, MatchesABruteForceScan) {
    std::vector<Access> a;
    std::uint64_t x = 12345;
    for (int i = 0; i < 200; ++i) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        a.push_back({static_cast<PartitionId>((x >> 33) % 17), Tier::kHost});
    }
    AccessTrace trace;
    trace.assign(a, 20);
    for (PartitionId id = 0; id < 20; ++id) {
        for (std::size_t cursor = 0; cursor <= a.size(); ++cursor) {
            std::uint64_t expected = kNoNextUse;
            for (std::size_t d = 0; d < a.size(); ++d) {
                if (a[(cursor + d) % a.size()].id == id) {
                    expected = d;
                    break;
                }
            }
            ASSERT_EQ(trace.next_use_distance(id, cursor), expected)
                << "id " << id << " cursor " << cursor;
        }
    }
}

}  // namespace
}  // namespace zinf::tier
