// TensorSwapper: small partitions coalesced into one engine operation per pool buffer,
// write-back in place, sub-range reads.
#include "swap/tensor_swapper.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tests/support/test_seed.h"
#include "tests/swap/swap_test_util.h"

namespace zinf::swap {
namespace {

struct Fixture {
    zinf::test::TempDir dir{"tensor"};
    std::unique_ptr<io::Engine> engine = test::make_sim_engine(zinf::test::seed());
    std::unique_ptr<PinnedPool> pool;
    std::unique_ptr<SwapStore> store;

    explicit Fixture(std::size_t buffer_bytes, std::size_t buffers = 4) {
        PinnedPoolOptions po;
        po.name = "tensor";
        po.buffer_count = buffers;
        po.buffer_size_bytes = buffer_bytes;
        po.allow_unlocked = true;
        pool = std::move(*PinnedPool::create(po));
        EXPECT_TRUE(pool->register_with(*engine).is_ok());
        SwapStoreOptions so;
        so.paths = {dir.path()};
        store = std::move(*SwapStore::create(*engine, so));
    }
    ~Fixture() { store.reset(); }
};

TEST(TensorSwapper, SmallPartitionsAreCoalesced) {
    Fixture f(1 << 20);
    std::mt19937_64 rng(zinf::test::seed());
    constexpr PartitionId kCount = 300;
    std::vector<std::vector<std::byte>> truth(kCount);
    for (PartitionId p = 0; p < kCount; ++p) {
        truth[p] = test::random_bytes(1 + rng() % 6000, rng);
        ASSERT_TRUE(f.store->reserve(p, truth[p].size()).is_ok());
    }
    ASSERT_TRUE(f.store->commit().is_ok());
    TensorSwapper swapper(*f.store, *f.pool);

    std::vector<SwapOutItem> items;
    for (PartitionId p = 0; p < kCount; ++p) items.push_back({p, truth[p]});
    f.engine->reset_stats();
    std::size_t runs = 0;
    for (std::span<const SwapOutItem> rest(items); !rest.empty(); ++runs) {
        SwapTicket ticket;
        auto n = swapper.swap_out(rest, ticket);
        ASSERT_TRUE(n.has_value()) << n.status().to_string();
        ASSERT_TRUE(ticket.wait().is_ok());
        rest = rest.subspan(*n);
    }
    // 300 partitions of ~3 KiB (padded to 4 KiB) in 1 MiB buffers: 2 runs of at most 256.
    EXPECT_LE(runs, 3u);
    EXPECT_LE(f.engine->stats().requests_completed, 2 * runs);  // data + checksums per run

    std::vector<PartitionId> ids(kCount);
    for (PartitionId p = 0; p < kCount; ++p) ids[p] = p;
    SwapTicket tickets[3];
    std::size_t t = 0;
    std::size_t seen = 0;
    for (std::span<const PartitionId> rest(ids); !rest.empty(); ++t) {
        ASSERT_LT(t, 3u);
        auto n = swapper.swap_in(rest, tickets[t]);
        ASSERT_TRUE(n.has_value()) << n.status().to_string();
        rest = rest.subspan(*n);
    }
    for (std::size_t i = 0; i < t; ++i) {
        ASSERT_TRUE(tickets[i].wait().is_ok());
        for (std::size_t k = 0; k < tickets[i].count(); ++k) {
            const PartitionId p = tickets[i].partition(k);
            const auto d = tickets[i].data(k);
            ASSERT_EQ(d.size(), truth[p].size());
            EXPECT_TRUE(std::equal(d.begin(), d.end(), truth[p].begin())) << p;
            ++seen;
        }
        tickets[i].release();
    }
    EXPECT_EQ(seen, kCount);
    EXPECT_EQ(f.pool->free_count(), f.pool->buffer_count());
}

TEST(TensorSwapper, WriteBackInPlaceAndRanges) {
    Fixture f(1 << 20);
    std::mt19937_64 rng(zinf::test::seed());
    ASSERT_TRUE(f.store->reserve(10, 300'000).is_ok());
    ASSERT_TRUE(f.store->reserve(11, 5).is_ok());
    ASSERT_TRUE(f.store->reserve(12, 3'000'000).is_ok());  // larger than a buffer
    ASSERT_TRUE(f.store->commit().is_ok());
    TensorSwapper swapper(*f.store, *f.pool);

    auto a = test::random_bytes(300'000, rng);
    auto b = test::random_bytes(5, rng);
    const SwapOutItem items[] = {{10, a}, {11, b}};
    SwapTicket ticket;
    auto n = swapper.swap_out(items, ticket);
    ASSERT_TRUE(n.has_value());
    EXPECT_EQ(*n, 2u);
    ASSERT_TRUE(ticket.wait().is_ok());
    // Update in place and write back without a copy.
    for (auto& x : ticket.data(0)) x = static_cast<std::byte>(static_cast<unsigned>(x) ^ 0xffu);
    for (auto& x : a) x = static_cast<std::byte>(static_cast<unsigned>(x) ^ 0xffu);
    ASSERT_TRUE(swapper.write_back(ticket).is_ok());
    ASSERT_TRUE(ticket.wait().is_ok());
    ticket.release();

    for (int i = 0; i < 50; ++i) {
        const std::uint64_t off = rng() % a.size();
        const std::uint64_t len = 1 + rng() % (a.size() - off);
        ASSERT_TRUE(swapper.swap_in_range(10, off, len, ticket).is_ok());
        ASSERT_TRUE(ticket.wait().is_ok());
        const auto d = ticket.data(0);
        ASSERT_EQ(d.size(), len);
        EXPECT_TRUE(std::equal(d.begin(), d.end(), a.begin() + static_cast<std::ptrdiff_t>(off)));
    }
    ticket.release();

    const PartitionId big[] = {12};
    auto r = swapper.swap_in(big, ticket);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(f.pool->free_count(), f.pool->buffer_count());
}

}  // namespace
}  // namespace zinf::swap
