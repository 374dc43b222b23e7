// Partitioning arithmetic: padding, slices and offsets for several world sizes.
#include "zero/partition.h"

#include <gtest/gtest.h>

#include <vector>

namespace zinf::zero {
namespace {

TEST(PartitionTest, SlicesCoverEachParameterOnce) {
    const std::vector<std::size_t> numels = {1, 15, 16, 17, 1000, 4099};
    for (int world = 1; world <= 5; ++world) {
        std::size_t total_valid = 0;
        for (int rank = 0; rank < world; ++rank) {
            auto p = Partitioning::create(numels, world, rank);
            ASSERT_TRUE(p.has_value()) << p.error().to_string();
            ASSERT_EQ(p->parameter_count(), numels.size());
            std::size_t offset = 0;
            for (std::size_t i = 0; i < numels.size(); ++i) {
                const auto& s = p->slot(i);
                EXPECT_EQ(s.numel, numels[i]);
                EXPECT_EQ(s.padded_numel % (Partitioning::kAlignNumel * world), 0u);
                EXPECT_GE(s.padded_numel, s.numel);
                EXPECT_LT(s.padded_numel - s.numel, Partitioning::kAlignNumel * world);
                EXPECT_EQ(s.slice_numel * world, s.padded_numel);
                EXPECT_EQ(s.partition_offset_numel, offset);
                offset += s.slice_numel;
                total_valid += s.valid_numel(rank);
            }
            EXPECT_EQ(p->partition_numel(), offset);
            EXPECT_EQ(p->partition_numel() * world, p->full_numel());
        }
        std::size_t model = 0;
        for (auto n : numels) model += n;
        EXPECT_EQ(total_valid, model) << "world " << world;
    }
}

TEST(PartitionTest, RejectsBadWorld) {
    const std::vector<std::size_t> numels = {4};
    EXPECT_FALSE(Partitioning::create(numels, 0, 0).has_value());
    EXPECT_FALSE(Partitioning::create(numels, 2, 2).has_value());
    EXPECT_FALSE(Partitioning::create(numels, 2, -1).has_value());
}

TEST(PartitionTest, StagePlans) {
    EXPECT_FALSE(StagePlan::for_stage(0).optimizer_partitioned);
    EXPECT_TRUE(StagePlan::for_stage(1).optimizer_partitioned);
    EXPECT_FALSE(StagePlan::for_stage(1).gradients_partitioned);
    EXPECT_TRUE(StagePlan::for_stage(2).gradients_partitioned);
    EXPECT_FALSE(StagePlan::for_stage(2).parameters_partitioned);
    EXPECT_TRUE(StagePlan::for_stage(3).parameters_partitioned);
}

}  // namespace
}  // namespace zinf::zero
