// PinnedPool: exhaustion waits, self-deadlock and timeouts are errors naming the pool.
#include "swap/pinned_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "src/base/aligned.h"

namespace zinf::swap {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<PinnedPool> make_pool(std::size_t count, std::size_t size,
                                      const char* name = "test") {
    PinnedPoolOptions options;
    options.name = name;
    options.buffer_count = count;
    options.buffer_size_bytes = size;
    options.allow_unlocked = true;  // CI may run without CAP_IPC_LOCK
    auto pool = PinnedPool::create(options);
    EXPECT_TRUE(pool.has_value()) << pool.status().to_string();
    return pool.has_value() ? std::move(*pool) : nullptr;
}

TEST(PinnedPool, BuffersAreDistinctAlignedAndReturned) {
    auto pool = make_pool(3, 10000);
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(pool->buffer_size_bytes(), 12288u);  // rounded up to pages
    {
        auto a = pool->try_acquire();
        auto b = pool->try_acquire();
        auto c = pool->try_acquire();
        ASSERT_TRUE(a.has_value() && b.has_value() && c.has_value());
        EXPECT_NE(a->data(), b->data());
        EXPECT_NE(b->data(), c->data());
        EXPECT_TRUE(is_aligned(a->data(), kPageBytes));
        EXPECT_EQ(pool->free_count(), 0u);
        auto d = pool->try_acquire();
        ASSERT_FALSE(d.has_value());
        EXPECT_EQ(d.error().code(), StatusCode::kBusy);
        a->reset();
        EXPECT_EQ(pool->free_count(), 1u);
    }
    EXPECT_EQ(pool->free_count(), 3u);
}

TEST(PinnedPool, RegionIsInHugePagesWhereTheKernelHasThem) {
    auto pool = make_pool(8, 1u << 20, "huge");
    ASSERT_NE(pool, nullptr);
    if (!transparent_huge_pages_available()) GTEST_SKIP() << "transparent huge pages are off here";
    auto huge = huge_page_bytes_backing(pool->region());
    ASSERT_TRUE(huge.has_value()) << huge.status().to_string();
    // 8 MiB hold at least three whole huge pages wherever the region starts; the kernel may fall
    // back to small pages for some under fragmentation, not for all.
    EXPECT_GE(*huge, kHugePageBytes);
}

TEST(PinnedPool, ExhaustionWaitsForARelease) {
    auto pool = make_pool(2, 4096);
    ASSERT_NE(pool, nullptr);
    std::vector<PinnedBuffer> held;
    std::atomic<bool> holding{false};
    std::atomic<bool> release{false};
    std::thread holder([&] {
        for (int i = 0; i < 2; ++i) held.push_back(std::move(*pool->acquire(1s)));
        holding = true;
        while (!release) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms);
        held.clear();
    });
    while (!holding) std::this_thread::sleep_for(1ms);
    release = true;
    const auto t0 = std::chrono::steady_clock::now();
    auto b = pool->acquire(10s);  // waits for the other thread's release
    ASSERT_TRUE(b.has_value()) << b.status().to_string();
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 20ms);
    holder.join();
}

TEST(PinnedPool, WaitingOnItselfIsAnErrorNotADeadlock) {
    auto pool = make_pool(2, 4096, "optimizer");
    ASSERT_NE(pool, nullptr);
    auto a = pool->acquire(1s);
    auto b = pool->acquire(1s);
    ASSERT_TRUE(a.has_value() && b.has_value());
    const auto t0 = std::chrono::steady_clock::now();
    auto c = pool->acquire(std::chrono::milliseconds(60'000));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);  // at once, not after the timeout
    ASSERT_FALSE(c.has_value());
    EXPECT_EQ(c.error().code(), StatusCode::kBusy);
    EXPECT_NE(c.error().message().find("'optimizer'"), std::string::npos) << c.error().message();
    EXPECT_NE(c.error().message().find("2 buffers"), std::string::npos) << c.error().message();
    EXPECT_NE(c.error().message().find("deadlock"), std::string::npos) << c.error().message();
}

TEST(PinnedPool, TimeoutIsAnErrorNamingThePool) {
    auto pool = make_pool(1, 4096, "params");
    ASSERT_NE(pool, nullptr);
    std::atomic<bool> holding{false};
    std::atomic<bool> done{false};
    std::thread holder([&] {
        auto a = pool->acquire(1s);
        holding = true;
        while (!done) std::this_thread::sleep_for(1ms);
    });
    while (!holding) std::this_thread::sleep_for(1ms);
    auto b = pool->acquire(50ms);
    done = true;
    holder.join();
    ASSERT_FALSE(b.has_value());
    EXPECT_EQ(b.error().code(), StatusCode::kTimeout);
    EXPECT_NE(b.error().message().find("'params'"), std::string::npos) << b.error().message();
    EXPECT_NE(b.error().message().find("1 buffers"), std::string::npos) << b.error().message();
}

TEST(PinnedPool, InvalidSizesAreRejected) {
    PinnedPoolOptions options;
    options.buffer_count = 0;
    options.buffer_size_bytes = 4096;
    EXPECT_EQ(PinnedPool::create(options).status().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedPool, LockedWhenRoot) {
    if (::geteuid() != 0) GTEST_SKIP() << "mlock of the pool needs root or CAP_IPC_LOCK here";
    auto pool = make_pool(2, 1 << 20);
    ASSERT_NE(pool, nullptr);
    EXPECT_TRUE(pool->is_locked());
}

}  // namespace
}  // namespace zinf::swap
