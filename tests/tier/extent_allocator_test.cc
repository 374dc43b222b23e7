// ExtentAllocator: against a brute-force occupancy map, under random allocate/free.
#include "src/tier/extent_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tests/support/test_seed.h"

namespace zinf::tier {
namespace {

TEST(ExtentAllocator, AllocatesAlignedAndCoalesces) {
    ExtentAllocator a(4096, 256, 8);
    EXPECT_EQ(a.capacity_bytes(), 4096u);
    auto x = a.allocate(1);
    auto y = a.allocate(1000);
    auto z = a.allocate(256);
    ASSERT_TRUE(x && y && z);
    EXPECT_EQ(a.used_bytes(), 256u + 1024u + 256u);
    EXPECT_EQ(*x % 256, 0u);
    EXPECT_EQ(*y % 256, 0u);
    a.free(*y, 1000);
    a.free(*x, 1);
    a.free(*z, 256);
    EXPECT_EQ(a.used_bytes(), 0u);
    EXPECT_EQ(a.largest_free_bytes(), 4096u);
    EXPECT_FALSE(a.allocate(4097).has_value());
    EXPECT_TRUE(a.allocate(4096).has_value());
}

TEST(ExtentAllocator, RespectsTheExtentCount) {
    ExtentAllocator a(1 << 20, 512, 2);
    ASSERT_TRUE(a.allocate(512));
    ASSERT_TRUE(a.allocate(512));
    EXPECT_FALSE(a.allocate(512).has_value());
}

TEST(ExtentAllocator, RandomisedAgainstAnOccupancyMap) {
    std::mt19937_64 rng(test::seed());
    const std::size_t unit = 512, capacity = 64 * unit;
    ExtentAllocator a(capacity, unit, 64);
    std::vector<int> owner(capacity / unit, -1);
    struct Live {
        std::size_t offset, size;
        int tag;
    };
    std::vector<Live> live;
    for (int step = 0; step < 20000; ++step) {
        if (live.empty() || rng() % 2 == 0) {
            const std::size_t size = 1 + rng() % (6 * unit);
            auto off = a.allocate(size);
            if (!off) {
                // Then no run of free units is long enough.
                const std::size_t need = (size + unit - 1) / unit;
                std::size_t run = 0, best = 0;
                for (int o : owner) {
                    run = o < 0 ? run + 1 : 0;
                    best = std::max(best, run);
                }
                ASSERT_LT(best, need);
                continue;
            }
            ASSERT_EQ(*off % unit, 0u);
            for (std::size_t u = *off / unit; u < (*off + size + unit - 1) / unit; ++u) {
                ASSERT_EQ(owner[u], -1) << "overlap at unit " << u;
                owner[u] = step;
            }
            live.push_back({*off, size, step});
        } else {
            const std::size_t i = rng() % live.size();
            const Live l = live[i];
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
            a.free(l.offset, l.size);
            for (std::size_t u = l.offset / unit; u < (l.offset + l.size + unit - 1) / unit; ++u)
                owner[u] = -1;
        }
        std::size_t used = 0;
        for (int o : owner) used += o >= 0 ? unit : 0;
        ASSERT_EQ(a.used_bytes(), used);
    }
}

}  // namespace
}  // namespace zinf::tier
