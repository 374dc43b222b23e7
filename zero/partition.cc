// The ZeRO layout arithmetic.
#include "zero/partition.h"

#include <string>

namespace zinf::zero {

StagePlan StagePlan::for_stage(int stage) {
    ZINF_ASSERT_GE(stage, 0);
    ZINF_ASSERT_LE(stage, 3);
    StagePlan plan;
    plan.stage = stage;
    plan.optimizer_partitioned = stage >= 1;
    plan.gradients_partitioned = stage >= 2;
    plan.parameters_partitioned = stage >= 3;
    return plan;
}

std::size_t ParameterSlot::valid_numel(int rank) const noexcept {
    const std::size_t begin = static_cast<std::size_t>(rank) * slice_numel;
    if (begin >= numel) return 0;
    return std::min(slice_numel, numel - begin);
}

Result<Partitioning> Partitioning::create(std::span<const std::size_t> numels, int world_size,
                                          int rank, std::size_t align_numel) {
    if (world_size < 1) {
        return Status::invalid_argument("partitioning: world size must be at least 1, got " +
                                        std::to_string(world_size));
    }
    if (rank < 0 || rank >= world_size) {
        return Status::invalid_argument("partitioning: rank " + std::to_string(rank) +
                                        " outside [0, " + std::to_string(world_size) + ")");
    }
    if (align_numel == 0 || align_numel % kAlignNumel != 0) {
        return Status::invalid_argument("partitioning: alignment " + std::to_string(align_numel) +
                                        " is not a positive multiple of " +
                                        std::to_string(kAlignNumel) + " elements");
    }
    Partitioning p;
    p.world_size_ = world_size;
    p.rank_ = rank;
    p.align_numel_ = align_numel;
    p.slots_.reserve(numels.size());
    const std::size_t unit = align_numel * static_cast<std::size_t>(world_size);
    for (const std::size_t numel : numels) {
        ZINF_ASSERT_GT(numel, 0u);
        ParameterSlot s;
        s.numel = numel;
        s.padded_numel = (numel + unit - 1) / unit * unit;
        s.slice_numel = s.padded_numel / static_cast<std::size_t>(world_size);
        s.partition_offset_numel = p.partition_numel_;
        s.full_offset_numel = p.full_numel_;
        p.partition_numel_ += s.slice_numel;
        p.full_numel_ += s.padded_numel;
        p.model_numel_ += numel;
        p.slots_.push_back(s);
    }
    ZINF_ASSERT_EQ(p.partition_numel_ * static_cast<std::size_t>(world_size), p.full_numel_);
    return p;
}

const ParameterSlot& Partitioning::slot(std::size_t index) const {
    ZINF_ASSERT_LT(index, slots_.size());
    return slots_[index];
}

}  // namespace zinf::zero
