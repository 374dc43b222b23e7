// Partitioning of a model's parameters over the data-parallel ranks (ZeRO): the flat layout that
// every rank computes the same way, each parameter's slice on each rank, and what each ZeRO stage
// partitions. Pure arithmetic; no memory, no communication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "src/base/status.h"

namespace zinf::zero {

// What stage 0-3 partitions. Stage 1 partitions optimizer states, 2 also gradients, 3 also the
// parameters themselves (gathered for each use). Stage 0 partitions nothing: every rank keeps and
// updates every element.
struct StagePlan {
    int stage = 0;
    bool optimizer_partitioned = false;
    bool gradients_partitioned = false;
    bool parameters_partitioned = false;

    static StagePlan for_stage(int stage);
};

// One parameter's place in the layout. Each parameter is padded to padded_numel, a multiple of
// world_size * kAlignNumel, so every rank's slice of it (slice_numel = padded_numel / world_size)
// starts 64-byte aligned in every dtype; rank r owns elements [r * slice_numel, (r + 1) *
// slice_numel) of the padded parameter, of which valid_numel(r) are real (the rest is padding,
// kept at zero).
struct ParameterSlot {
    std::size_t numel = 0;
    std::size_t padded_numel = 0;
    std::size_t slice_numel = 0;
    // Where this parameter's slice starts in a rank's flat partition (the concatenation of the
    // rank's slices, in parameter order): the same offset on every rank.
    std::size_t partition_offset_numel = 0;
    // Where the whole (padded) parameter starts in the flat full layout.
    std::size_t full_offset_numel = 0;

    // Real elements in rank r's slice.
    std::size_t valid_numel(int rank) const noexcept;
};

// The layout of all parameters over world_size ranks, identical on every rank.
class Partitioning {
public:
    // 16 elements: 64 bytes of fp32, 32 of bf16/fp16; keeps SIMD loads aligned.
    static constexpr std::size_t kAlignNumel = 16;

    // `numels` in parameter order; each parameter is padded to a multiple of world_size *
    // align_numel (a multiple of kAlignNumel: compressed optimizer states use
    // kStateBlockNumel, so that every slice starts on a block of the global flat index).
    // Errors: kInvalidArgument for world_size < 1, rank outside [0, world_size) or an
    // align_numel that is not a positive multiple of kAlignNumel.
    static Result<Partitioning> create(std::span<const std::size_t> numels, int world_size,
                                       int rank, std::size_t align_numel = kAlignNumel);

    int world_size() const noexcept { return world_size_; }
    int rank() const noexcept { return rank_; }
    std::size_t align_numel() const noexcept { return align_numel_; }
    std::size_t parameter_count() const noexcept { return slots_.size(); }
    const ParameterSlot& slot(std::size_t index) const;
    // Elements of one rank's flat partition (sum of slice_numel).
    std::size_t partition_numel() const noexcept { return partition_numel_; }
    // Elements of the flat full layout (sum of padded_numel).
    std::size_t full_numel() const noexcept { return full_numel_; }
    // Sum of numel (real elements of the model).
    std::size_t model_numel() const noexcept { return model_numel_; }

private:
    Partitioning() = default;
    int world_size_ = 1;
    int rank_ = 0;
    std::size_t align_numel_ = kAlignNumel;
    std::vector<ParameterSlot> slots_;
    std::size_t partition_numel_ = 0;
    std::size_t full_numel_ = 0;
    std::size_t model_numel_ = 0;
};

}  // namespace zinf::zero
