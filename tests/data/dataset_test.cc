// Batcher (seeded shuffles, batching, drop_last) and SyntheticDataset (purity, any width).
#include "src/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "src/data/batcher.h"

namespace zinf::data {
namespace {

std::unique_ptr<InMemoryDataset> counting_dataset(std::size_t count, std::size_t features) {
    std::vector<float> inputs(count * features);
    std::vector<std::int32_t> labels(count);
    for (std::size_t i = 0; i < count; ++i) {
        for (std::size_t j = 0; j < features; ++j) {
            inputs[i * features + j] = static_cast<float>(i * 1000 + j);
        }
        labels[i] = static_cast<std::int32_t>(i % 3);
    }
    return std::make_unique<InMemoryDataset>(features, 3, std::move(inputs), std::move(labels));
}

std::vector<std::uint32_t> epoch_order(const Batcher& batcher) {
    std::vector<std::uint32_t> order;
    for (std::size_t b = 0; b < batcher.batches_per_epoch(); ++b) {
        const auto indices = batcher.batch_indices(b);
        order.insert(order.end(), indices.begin(), indices.end());
    }
    return order;
}

TEST(Batcher, ShufflesDeterministicallyPerSeedAndEpoch) {
    auto dataset = counting_dataset(1000, 2);
    BatcherOptions options;
    options.batch_rows = 100;
    options.seed = 11;
    auto a = Batcher::create(*dataset, options);
    auto b = Batcher::create(*dataset, options);
    ASSERT_TRUE(a.has_value());
    ASSERT_TRUE(b.has_value());
    const auto epoch0 = epoch_order(*a);
    EXPECT_EQ(epoch0, epoch_order(*b));
    // A permutation, and not the identity.
    auto sorted = epoch0;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::uint32_t> identity(1000);
    std::iota(identity.begin(), identity.end(), 0u);
    EXPECT_EQ(sorted, identity);
    EXPECT_NE(epoch0, identity);
    a->start_epoch(1);
    const auto epoch1 = epoch_order(*a);
    EXPECT_NE(epoch0, epoch1);
    a->start_epoch(0);
    EXPECT_EQ(epoch_order(*a), epoch0);
    options.seed = 12;
    auto c = Batcher::create(*dataset, options);
    EXPECT_NE(epoch_order(*c), epoch0);
    // Pinned values: the order is part of the reproducibility contract across platforms.
    auto pinned = Batcher::create(*counting_dataset(10, 1), BatcherOptions{10, true, true, 1234});
    ASSERT_TRUE(pinned.has_value());
    EXPECT_EQ(epoch_order(*pinned), (std::vector<std::uint32_t>{0, 9, 3, 6, 8, 7, 2, 1, 5, 4}));
}

TEST(Batcher, FillsBatchesAndHonoursDropLast) {
    auto dataset = counting_dataset(10, 3);
    BatcherOptions options;
    options.batch_rows = 4;
    options.shuffle = false;
    auto keep = Batcher::create(*dataset, BatcherOptions{4, false, false, 1});
    ASSERT_TRUE(keep.has_value());
    EXPECT_EQ(keep->batches_per_epoch(), 3u);
    std::vector<float> inputs(4 * 3);
    std::vector<std::int32_t> labels(4);
    EXPECT_EQ(keep->fill(2, inputs, labels), 2u);
    EXPECT_EQ(inputs[0], 8000.0f);
    EXPECT_EQ(inputs[5], 9002.0f);
    EXPECT_EQ(labels[1], 0);  // sample 9
    auto drop = Batcher::create(*dataset, BatcherOptions{4, true, true, 1});
    ASSERT_TRUE(drop.has_value());
    EXPECT_EQ(drop->batches_per_epoch(), 2u);
    EXPECT_EQ(drop->fill(1, inputs, labels), 4u);
    // Each gathered row is the sample its index names.
    const auto indices = drop->batch_indices(1);
    for (std::size_t r = 0; r < 4; ++r)
        EXPECT_EQ(inputs[r * 3], static_cast<float>(indices[r]) * 1000.0f);

    EXPECT_EQ(Batcher::create(*dataset, BatcherOptions{0, true, true, 1}).error().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(Batcher::create(*dataset, BatcherOptions{11, true, true, 1}).error().code(),
              StatusCode::kInvalidArgument);
}

// Sharded over 3 ranks with 4 rows each: every batch of the shards together is the batch of 12
// rows one batcher gives, in order, so the ranks see distinct samples and the same ones as a
// world of one rank with the global batch.
TEST(Batcher, ShardsSplitEachGlobalBatchInRankOrder) {
    auto dataset = counting_dataset(50, 1);
    BatcherOptions one{12, true, true, 7};
    auto whole = Batcher::create(*dataset, one);
    ASSERT_TRUE(whole.has_value());
    std::vector<Batcher> shards;
    for (std::size_t r = 0; r < 3; ++r) {
        BatcherOptions o{4, true, true, 7};
        o.shard_count = 3;
        o.shard_index = r;
        auto b = Batcher::create(*dataset, o);
        ASSERT_TRUE(b.has_value());
        shards.push_back(std::move(*b));
    }
    for (std::uint64_t epoch : {0u, 1u}) {
        whole->start_epoch(epoch);
        for (auto& s : shards) s.start_epoch(epoch);
        ASSERT_EQ(whole->batches_per_epoch(), 4u);
        for (std::size_t b = 0; b < 4; ++b) {
            std::vector<std::uint32_t> joined;
            for (auto& s : shards) {
                EXPECT_EQ(s.batches_per_epoch(), 4u);
                const auto part = s.batch_indices(b);
                EXPECT_EQ(part.size(), 4u);
                joined.insert(joined.end(), part.begin(), part.end());
            }
            const auto want = whole->batch_indices(b);
            EXPECT_EQ(joined, std::vector<std::uint32_t>(want.begin(), want.end()));
        }
    }
    // Without drop_last the last global batch (2 samples) leaves shards 1 and 2 empty.
    BatcherOptions keep{4, false, false, 1};
    keep.shard_count = 3;
    keep.shard_index = 2;
    auto last = Batcher::create(*dataset, keep);
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(last->batches_per_epoch(), 5u);
    std::vector<float> inputs(4);
    std::vector<std::int32_t> labels(4);
    EXPECT_EQ(last->fill(4, inputs, labels), 0u);
    EXPECT_EQ(last->fill(3, inputs, labels), 4u);
    EXPECT_EQ(inputs[0], 44000.0f);  // sample 44: batch 3 is 36..47, shard 2 has 44..47
    keep.shard_index = 3;
    EXPECT_EQ(Batcher::create(*dataset, keep).error().code(), StatusCode::kInvalidArgument);
    BatcherOptions too_few{20, true, true, 1};
    too_few.shard_count = 3;
    EXPECT_EQ(Batcher::create(*dataset, too_few).error().code(), StatusCode::kInvalidArgument);
}

TEST(SyntheticDataset, SamplesArePureFunctionsOfSeedAndIndex) {
    SyntheticOptions options;
    options.count = 500;
    options.features = 13;  // not a multiple of 4
    options.classes = 7;
    options.seed = 3;
    auto dataset = SyntheticDataset::create(options);
    ASSERT_TRUE(dataset.has_value());
    const std::vector<std::uint32_t> forward = {5, 6, 499}, backward = {499, 6, 5};
    std::vector<float> a(3 * 13), b(3 * 13);
    std::vector<std::int32_t> la(3), lb(3);
    (*dataset)->gather(forward, a, la);
    (*dataset)->gather(backward, b, lb);
    for (std::size_t r = 0; r < 3; ++r) {
        EXPECT_EQ(la[r], lb[2 - r]);
        for (std::size_t j = 0; j < 13; ++j) EXPECT_EQ(a[r * 13 + j], b[(2 - r) * 13 + j]);
    }
    std::set<std::int32_t> seen;
    for (std::uint32_t i = 0; i < 500; ++i) {
        const std::int32_t label = (*dataset)->label(i);
        ASSERT_GE(label, 0);
        ASSERT_LT(label, 7);
        seen.insert(label);
    }
    EXPECT_EQ(seen.size(), 7u);
    for (const float v : a) {
        EXPECT_GE(v, -2.0f);
        EXPECT_LT(v, 2.0f);
    }
    options.seed = 4;
    auto other = SyntheticDataset::create(options);
    std::vector<float> c(3 * 13);
    (*other)->gather(forward, c, la);
    EXPECT_NE(a, c);
    options.features = 0;
    EXPECT_EQ(SyntheticDataset::create(options).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::data
