// ParameterCoordinator over the single-rank communicator: every stage serves the initial values,
// accumulates gradients into the optimizer domain, publishes new values, and stage 3 frees what
// it gathered.
#include "zero/parameter_coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "zero/single_rank_communicator.h"

namespace zinf::zero {
namespace {

struct Fixture {
    std::unique_ptr<device::CpuDevice> device;
    std::unique_ptr<device::CpuCompute> compute;
    std::unique_ptr<SingleRankCommunicator> comm;
    Fixture() {
        device::CpuDeviceOptions o;
        o.budget_bytes = 64 << 20;
        device = std::move(device::CpuDevice::create(o)).value();
        compute = std::move(device::CpuCompute::create(device.get(), {1})).value();
        comm = std::make_unique<SingleRankCommunicator>(*device);
    }
};

float value_of(std::size_t index, std::size_t element) {
    return static_cast<float>(index) + static_cast<float>(element) * 0.25f;
}

// A stage-3 coordinator (fp32, nothing persistent) over `numels`, holding value_of.
Result<std::unique_ptr<ParameterCoordinator>> stage3_coordinator(
    Fixture& f, const std::vector<std::size_t>& numels) {
    CoordinatorOptions options;
    options.stage = 3;
    options.persistence_threshold_numel = 0;
    ZINF_ASSIGN_OR_RETURN(
        auto c, ParameterCoordinator::create(numels, options, *f.device, *f.compute, *f.comm));
    ZINF_TRY(c->initialize(
        [](std::size_t index, std::size_t offset, std::span<float> out) {
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = value_of(index, offset + i);
        },
        0));
    return c;
}

class CoordinatorTest : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(CoordinatorTest, FetchAccumulateReducePublish) {
    const auto [stage, dtype] = GetParam();
    Fixture f;
    const std::vector<std::size_t> numels = {3, 40, 17};
    CoordinatorOptions options;
    options.stage = stage;
    options.dtype = dtype;
    options.persistence_threshold_numel = 5;  // parameter 0 persists under stage 3
    auto c = ParameterCoordinator::create(numels, options, *f.device, *f.compute, *f.comm);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    auto& coord = **c;
    ASSERT_TRUE(coord.initialize(
        [](std::size_t index, std::size_t offset, std::span<float> out) {
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = value_of(index, offset + i);
        },
        0));
    coord.begin_accumulation();
    std::vector<float> grad(40);
    for (std::size_t p = 0; p < numels.size(); ++p) {
        auto v = coord.fetch(p, 0);
        ASSERT_TRUE(v.has_value()) << v.error().to_string();
        ASSERT_TRUE(f.device->synchronize(0));
        for (std::size_t i = 0; i < numels[p]; ++i) EXPECT_EQ((*v)[i], value_of(p, i));
        for (std::size_t i = 0; i < numels[p]; ++i) grad[i] = static_cast<float>(i + 1);
        ASSERT_TRUE(coord.accumulate_gradient(p, grad.data(), 0));
        if (p != 1) {
            ASSERT_TRUE(coord.accumulate_gradient(p, grad.data(), 0));  // twice: sums
        }
        ASSERT_TRUE(coord.release(p, 0));
    }
    if (stage == 3) {
        EXPECT_EQ(coord.live_numel(), 16u);  // only the persistent one (padded to 16)
        EXPECT_GE(coord.peak_live_numel(), 48u);
    }
    ASSERT_TRUE(coord.reduce_gradients(0));
    ASSERT_TRUE(f.device->synchronize(0));
    const auto& d = coord.domain();
    // Read the domain gradients back as fp32.
    std::vector<float> g(d.numel);
    ASSERT_TRUE(f.compute->cast(d.gradients, d.dtype, g.data(), DType::kFloat32, d.numel, 0));
    for (std::size_t p = 0; p < numels.size(); ++p) {
        const std::size_t off = coord.domain_offset_numel(p);
        for (std::size_t i = 0; i < numels[p]; ++i) {
            EXPECT_EQ(g[off + i], static_cast<float>((i + 1) * (p != 1 ? 2 : 1))) << p << " " << i;
        }
        for (std::size_t i = numels[p]; i < coord.partitioning().slot(p).slice_numel; ++i) {
            EXPECT_EQ(g[off + i], 0.0f);  // padding
        }
    }
    // The optimizer writes new values; the next fetch sees them.
    std::vector<float> fresh(d.numel, 2.5f);
    ASSERT_TRUE(f.compute->cast(fresh.data(), DType::kFloat32, d.parameters, d.dtype, d.numel, 0));
    ASSERT_TRUE(coord.publish_parameters(0));
    for (std::size_t p = 0; p < numels.size(); ++p) {
        auto v = coord.fetch(p, 0);
        ASSERT_TRUE(v.has_value());
        ASSERT_TRUE(f.device->synchronize(0));  // gathers are copies on the stream
        for (std::size_t i = 0; i < numels[p]; ++i) EXPECT_EQ((*v)[i], 2.5f);
        ASSERT_TRUE(coord.release(p, 0));
    }
    coord.begin_accumulation();
    coord.begin_accumulation();
    EXPECT_TRUE(coord.trace_complete());
    ASSERT_GE(coord.trace().size(), 3u);
    EXPECT_EQ(coord.trace()[0], 0u);
    EXPECT_EQ(coord.trace()[2], 2u);
}

INSTANTIATE_TEST_SUITE_P(Stages, CoordinatorTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)));

// Stage 3 hands a released gathered copy to the next gather of the same size instead of
// freeing it and allocating again, and never holds more than the gathered copies' own peak.
TEST(CoordinatorStage3, GatheredCopiesAreReusedWithinTheirPeak) {
    Fixture f;
    // Four layers of one shape (weight, bias), then a smaller head: fetched in pairs.
    std::vector<std::size_t> numels;
    for (int layer = 0; layer < 4; ++layer) {
        numels.push_back(64 * 32);
        numels.push_back(32);
    }
    numels.push_back(32 * 4);
    numels.push_back(4);
    auto c = stage3_coordinator(f, numels);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    auto& coord = **c;
    const std::size_t base = f.device->used_bytes();
    std::size_t live_device_peak = 0;  // device bytes while a layer is gathered (with rounding)
    const int windows = 3;
    for (int w = 0; w < windows; ++w) {
        coord.begin_accumulation();
        for (std::size_t p = 0; p < numels.size(); p += 2) {
            auto weight = coord.fetch(p, 0);
            auto bias = coord.fetch(p + 1, 0);
            ASSERT_TRUE(weight.has_value() && bias.has_value());
            ASSERT_TRUE(f.device->synchronize(0));
            // The first layer, the largest, gathered before any spare exists: the peak.
            if (w == 0 && p == 0) live_device_peak = f.device->used_bytes() - base;
            // A reused copy held another parameter's values: every element is gathered anew.
            for (std::size_t i = 0; i < numels[p]; ++i) ASSERT_EQ((*weight)[i], value_of(p, i));
            for (std::size_t i = 0; i < numels[p + 1]; ++i)
                ASSERT_EQ((*bias)[i], value_of(p + 1, i));
            ASSERT_TRUE(coord.release(p, 0));
            ASSERT_TRUE(coord.release(p + 1, 0));
        }
        EXPECT_EQ(coord.live_numel(), 0u);
        // What the spares hold stays within the gathered copies' peak.
        EXPECT_LE(f.device->used_bytes() - base, live_device_peak) << "window " << w;
        // The step: new values published (stage 3 drops what it gathered); spares stay.
        ASSERT_TRUE(coord.reduce_gradients(0));
        ASSERT_TRUE(coord.publish_parameters(0));
        EXPECT_LE(f.device->used_bytes() - base, live_device_peak) << "window " << w;
    }
    // The first layer allocates; the three like it reuse its copies; the head's shape change
    // costs at most two allocations each way per window.
    EXPECT_LE(coord.working_allocations(), 2u + 4u * windows);
    EXPECT_GE(coord.working_reuses(), 6u * windows - 2u);
    EXPECT_EQ(coord.working_allocations() + coord.working_reuses(), numels.size() * windows);
}

// When something else took the room the spares left (the budget is shared), a gather that
// meets kNoSpace frees the spares and tries again.
TEST(CoordinatorStage3, AGatherMeetingNoSpaceFreesTheSpares) {
    Fixture f;
    // A and B are gathered together (the peak), C alone, then E alone: sizes 8000, 64, 4032 and
    // 128 bytes.
    const std::vector<std::size_t> numels = {2000, 16, 1008, 32};
    auto c = stage3_coordinator(f, numels);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    auto& coord = **c;
    coord.begin_accumulation();
    ASSERT_TRUE(coord.fetch(0, 0).has_value());
    ASSERT_TRUE(coord.fetch(1, 0).has_value());
    ASSERT_TRUE(coord.release(0, 0));
    ASSERT_TRUE(coord.release(1, 0));
    ASSERT_TRUE(coord.fetch(2, 0).has_value());  // makes room from A's spare, keeps B's
    ASSERT_TRUE(coord.release(2, 0));
    // Spares: B and C, within the peak. Now the rest of the budget goes elsewhere.
    struct Filler {  // freed before the device goes, whatever the test's outcome
        Device& device;
        std::vector<void*> ptrs;
        ~Filler() {
            for (void* p : ptrs) device.free(p);
        }
    } filler{*f.device, {}};
    for (std::size_t chunk = std::size_t{32} << 20; chunk >= 64;) {
        auto p = f.device->allocate(chunk, "test");
        if (p.has_value()) {
            filler.ptrs.push_back(*p);
        } else {
            chunk /= 2;
        }
    }
    ASSERT_FALSE(f.device->allocate(64, "test").has_value());
    const std::uint64_t allocations = coord.working_allocations();
    auto e = coord.fetch(3, 0);  // no spare of its size, no room: frees the spares, then fits
    ASSERT_TRUE(e.has_value()) << e.error().to_string();
    ASSERT_TRUE(f.device->synchronize(0));
    for (std::size_t i = 0; i < numels[3]; ++i) EXPECT_EQ((*e)[i], value_of(3, i));
    EXPECT_EQ(coord.working_allocations(), allocations + 1);
    ASSERT_TRUE(coord.release(3, 0));
}

TEST(CoordinatorErrors, BudgetTooSmallIsNoSpace) {
    device::CpuDeviceOptions o;
    o.budget_bytes = 1024;
    auto device = std::move(device::CpuDevice::create(o)).value();
    auto compute = std::move(device::CpuCompute::create(device.get(), {1})).value();
    SingleRankCommunicator comm(*device);
    const std::vector<std::size_t> numels = {100000};
    auto c = ParameterCoordinator::create(numels, {}, *device, *compute, comm);
    ASSERT_FALSE(c.has_value());
    EXPECT_EQ(c.error().code(), StatusCode::kNoSpace);
    EXPECT_EQ(device->used_bytes(), 0u);
}

}  // namespace
}  // namespace zinf::zero
