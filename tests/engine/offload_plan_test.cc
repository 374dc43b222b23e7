// OffloadPlan: placement and sizing from a config alone, with no I/O and no allocation (the nvme
// paths below do not exist), and the errors that name the key and the size needed.
#include "src/engine/offload_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/engine/engine_test_support.h"

namespace zinf::engine {
namespace {

using test_support::load_config;
using test_support::small_config;

// Four parameters: the largest is 5000 elements (20000 bytes in fp32, 10000 in bf16).
PlanInputs inputs(DeviceKind kind = DeviceKind::kCpu, std::uint64_t budget = 64u << 20) {
    PlanInputs in;
    in.parameter_numels = {5000, 50, 1000, 10};
    in.device_kind = kind;
    in.device_budget_bytes = budget;
    return in;
}

OffloadPlan plan_of(const std::string& extra, std::vector<std::string> overrides = {},
                    const PlanInputs& in = inputs()) {
    auto plan = make_offload_plan(load_config(small_config(extra), std::move(overrides)), in);
    EXPECT_TRUE(plan.has_value()) << plan.status().to_string();
    return plan.has_value() ? *plan : OffloadPlan{};
}

Status plan_error(const std::string& extra, std::vector<std::string> overrides = {},
                  const PlanInputs& in = inputs()) {
    auto plan = make_offload_plan(load_config(small_config(extra), std::move(overrides)), in);
    return plan.has_value() ? Status::ok() : plan.error();
}

constexpr const char* kNvmeBoth =
    R"("zero_optimization": {"stage": 3, "sub_group_size": 1000,)"
    R"( "stage3_max_live_parameters": 100000, "stage3_prefetch_bucket_size": 2000,)"
    R"( "offload_param": {"device": "nvme", "nvme_path": "/nonexistent/p", "buffer_count": 4,)"
    R"( "buffer_size": 6000, "max_in_cpu": 20000, "pin_memory": true},)"
    R"( "offload_optimizer": {"device": "nvme", "nvme_path": "/nonexistent/p"}},)";

TEST(OffloadPlan, NoOffloadKeepsEverythingOnTheDevice) {
    const OffloadPlan p = plan_of(R"("zero_optimization": {"stage": 0},)");
    EXPECT_EQ(p.parameters, Home::kDevice);
    EXPECT_EQ(p.gradients, Home::kDevice);
    EXPECT_EQ(p.optimizer_states, Home::kDevice);
    EXPECT_FALSE(p.gradients_copied_to_host);
    EXPECT_FALSE(p.needs_io);
    EXPECT_EQ(p.parameter_update, ParameterUpdate::kCopyMaster);
    // Stage 0: the whole (padded) model is the optimizer's domain.
    EXPECT_EQ(p.model_numel, 6060u);
    EXPECT_GE(p.domain_numel, p.model_numel);
    EXPECT_EQ(p.state_count, 3u);  // AdamW: master + two moments
    const OffloadPlan bf16 =
        plan_of(R"("zero_optimization": {"stage": 0}, "bf16": {"enabled": true},)");
    EXPECT_EQ(bf16.dtype, DType::kBFloat16);
    EXPECT_EQ(bf16.parameter_update, ParameterUpdate::kInPlace);
}

TEST(OffloadPlan, CpuOptimizerOffloadKeepsAHostGradientCopy) {
    const OffloadPlan p =
        plan_of(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)");
    EXPECT_EQ(p.optimizer_states, Home::kHost);
    EXPECT_TRUE(p.gradients_copied_to_host);
    EXPECT_FALSE(p.needs_io);
    EXPECT_EQ(p.optimizer_pinned_bytes(), 0u);
    // On a GPU the host-side optimizer cannot write the device's parameters: through the
    // coordinator, with the gradients copied to the host.
    const OffloadPlan gpu =
        plan_of(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)", {},
                inputs(DeviceKind::kCuda));
    EXPECT_EQ(gpu.parameter_update, ParameterUpdate::kThroughCoordinator);
    EXPECT_EQ(gpu.gradients, Home::kDevice);
}

// "auto": the gradient partition stays in host memory while it fits in the host budget beside
// the pinned buffers, and streams to NVMe one byte beyond; the summary says which and why.
TEST(OffloadPlan, GradientsStreamOnlyBeyondTheHostBudget) {
    const OffloadPlan unbounded = plan_of(kNvmeBoth, {"bf16.enabled=true"});
    const std::uint64_t pinned =
        unbounded.parameter_host_tier_bytes + unbounded.optimizer_pinned_bytes();
    const std::uint64_t gradients = unbounded.domain_numel * 2;
    ASSERT_GT(pinned, 0u);
    const auto with_budget = [&](std::uint64_t budget) {
        return plan_of(kNvmeBoth, {"bf16.enabled=true",
                                   "device.host_memory_budget=" + std::to_string(budget)});
    };
    const OffloadPlan fits = with_budget(pinned + gradients);
    EXPECT_EQ(fits.gradients, Home::kHost);
    EXPECT_TRUE(fits.coordinator.host_gradients);
    EXPECT_NE(fits.describe().find("fit in the host budget"), std::string::npos) << fits.describe();
    const OffloadPlan beyond = with_budget(pinned + gradients - 1);
    EXPECT_EQ(beyond.gradients, Home::kNvme);
    EXPECT_FALSE(beyond.coordinator.host_gradients);
    EXPECT_NE(beyond.describe().find("exceed the host budget"), std::string::npos)
        << beyond.describe();
}

TEST(OffloadPlan, NvmeOffloadSizesEveryTierAndPool) {
    const OffloadPlan p =
        plan_of(kNvmeBoth,
                {"bf16.enabled=true", "zero_optimization.offload_optimizer.stream_gradients=true"});
    EXPECT_EQ(p.parameters, Home::kNvme);
    EXPECT_EQ(p.optimizer_states, Home::kNvme);
    // Stage 3 with the optimizer on NVMe, streaming asked for: the gradients go to the swap files.
    EXPECT_EQ(p.gradients, Home::kNvme);
    EXPECT_FALSE(p.coordinator.host_gradients);
    EXPECT_FALSE(p.gradients_copied_to_host);
    // Asked to stay, or "auto" without a host budget: the CPU device keeps them in registered
    // host memory.
    for (const char* mode : {"false", "\"auto\""}) {
        const OffloadPlan held =
            plan_of(kNvmeBoth,
                    {"bf16.enabled=true",
                     std::string("zero_optimization.offload_optimizer.stream_gradients=") + mode});
        EXPECT_EQ(held.gradients, Home::kHost) << mode;
        EXPECT_TRUE(held.coordinator.host_gradients) << mode;
    }
    EXPECT_EQ(p.parameter_update, ParameterUpdate::kThroughCoordinator);
    EXPECT_TRUE(p.needs_io);
    EXPECT_TRUE(p.stores_shared);
    EXPECT_EQ(p.largest_partition_numel, 5008u);  // 5000 padded to a multiple of 16
    // Host tier: min(buffer_count x buffer_size, max_in_cpu) x 2 bytes, page-aligned.
    EXPECT_EQ(p.parameter_host_tier_bytes, 40960u);
    EXPECT_TRUE(p.lock_parameter_host_tier);
    // Device tier: min(max_live x 2, budget / 4), at least two of the largest slices.
    EXPECT_EQ(p.parameter_device_tier_bytes, 200000u);
    EXPECT_EQ(p.residency.host_budget_bytes, p.parameter_host_tier_bytes);
    EXPECT_EQ(p.residency.prefetch_depth_bytes(), 4000u);
    EXPECT_EQ(p.residency.partition_capacity, 4u);
    // The optimizer: sub-groups of 1000 elements, 3 fp32 arrays each, pipelined buffers.
    EXPECT_EQ(p.sub_group_numel, 1000u);
    EXPECT_EQ(p.optimizer_stack.swappers[0].sub_group_numel, 1000u);
    EXPECT_EQ(p.optimizer_stack.swappers[0].first_partition,
              4u);  // after the parameters' partitions
    EXPECT_EQ(p.optimizer_stack.pool.buffer_size_bytes,
              swap::OptimizerSwapper::buffer_size_bytes(1000, p.optimizer.kind));
    EXPECT_EQ(p.optimizer_pinned_bytes(),
              p.optimizer_stack.pool.buffer_count *
                  align_up(p.optimizer_stack.pool.buffer_size_bytes, 4096));
    EXPECT_EQ(p.parameter_store.paths, std::vector<std::string>{"/nonexistent/p"});
    EXPECT_EQ(p.io.aio.block_size_bytes, 1u << 20);
    const std::string d = p.describe();
    EXPECT_NE(d.find("parameters: nvme (/nonexistent/p"), std::string::npos) << d;
    EXPECT_NE(d.find("host tier 40.00 KiB pinned"), std::string::npos) << d;
    EXPECT_NE(d.find("optimizer states"), std::string::npos) << d;
    EXPECT_NE(d.find("sub-groups of 1000 elements"), std::string::npos) << d;
}

TEST(OffloadPlan, TinyHostTierIsRaisedToTwoPageAlignedPartitions) {
    const OffloadPlan p = plan_of(
        kNvmeBoth, {"zero_optimization.offload_param.buffer_size=5008",
                    "zero_optimization.offload_param.buffer_count=2",
                    "zero_optimization.offload_param.max_in_cpu=10016", "bf16.enabled=true"});
    // 2 x 5008 x 2 bytes = 20032 -> 20480 (page-aligned), below two page-aligned slices of
    // 10016 bytes: 2 x 12288.
    EXPECT_EQ(p.parameter_host_tier_bytes, 24576u);
}

TEST(OffloadPlan, SizeErrorsNameTheKeyAndTheSizeNeeded) {
    Status s = plan_error(kNvmeBoth, {"zero_optimization.offload_param.buffer_size=100"});
    EXPECT_NE(s.message().find("zero_optimization.offload_param.buffer_size: 100 elements"),
              std::string::npos)
        << s.to_string();
    EXPECT_NE(s.message().find("5008 elements"), std::string::npos) << s.to_string();
    s = plan_error(kNvmeBoth, {"zero_optimization.offload_param.max_in_cpu=6000"});
    EXPECT_NE(s.message().find("offload_param.max_in_cpu"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("at least 10016"), std::string::npos) << s.to_string();
    s = plan_error(kNvmeBoth, {"zero_optimization.offload_param.buffer_count=1"});
    EXPECT_NE(s.message().find("offload_param.buffer_count"), std::string::npos);
    s = plan_error(kNvmeBoth, {}, inputs(DeviceKind::kCpu, 40000));
    EXPECT_NE(s.message().find("device.memory_budget: 40000"), std::string::npos) << s.to_string();
    s = plan_error(kNvmeBoth, {"device.host_memory_budget=4096"});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("device.host_memory_budget: 4096"), std::string::npos);
    const OffloadPlan ok = plan_of(kNvmeBoth);
    const std::string needed =
        str_cat("at least ", ok.parameter_host_tier_bytes + ok.optimizer_pinned_bytes());
    EXPECT_NE(s.message().find(needed), std::string::npos) << s.to_string() << " / " << needed;
}

TEST(OffloadPlan, SeparatePathsMeanSeparateStores) {
    const OffloadPlan p = plan_of(kNvmeBoth, {"zero_optimization.offload_optimizer.nvme_path=/x"});
    EXPECT_FALSE(p.stores_shared);
    EXPECT_EQ(p.optimizer_store.paths, std::vector<std::string>{"/x"});
    EXPECT_EQ(p.optimizer_store.name, "optimizer");
}

// swap.background_checkpoint doubles the NVMe stores (copy-on-write) on one rank only: several
// ranks write their checkpoints in the foreground, and their stores stay single.
TEST(OffloadPlan, BackgroundCheckpointsMakeOneRanksStoresCopyOnWrite) {
    const std::vector<std::string> on = {"swap.background_checkpoint=true"};
    const OffloadPlan single = plan_of(kNvmeBoth, on);
    EXPECT_TRUE(single.stores_shared);
    EXPECT_TRUE(single.optimizer_store.copy_on_write);
    EXPECT_TRUE(single.parameter_store.copy_on_write);
    const OffloadPlan separate =
        plan_of(kNvmeBoth, {on[0], "zero_optimization.offload_optimizer.nvme_path=/x"});
    EXPECT_TRUE(separate.optimizer_store.copy_on_write);
    EXPECT_FALSE(separate.parameter_store.copy_on_write);
    EXPECT_FALSE(plan_of(kNvmeBoth).optimizer_store.copy_on_write);
    PlanInputs two = inputs();
    two.world_size = 2;
    const OffloadPlan ranks = plan_of(kNvmeBoth, on, two);
    EXPECT_FALSE(ranks.optimizer_store.copy_on_write);
    EXPECT_FALSE(ranks.parameter_store.copy_on_write);
}

// swap.optimizer_read_ahead: each sub-group read ahead holds a pinned buffer of its own, which
// the plan counts (the host budget sees it); it needs pipelined reads, and a value outside 1-8
// is refused by the loader, naming the key.
TEST(OffloadPlan, OptimizerReadAheadAddsPinnedBuffersAndNeedsPipelinedReads) {
    const std::string read = "zero_optimization.offload_optimizer.pipeline_read=true";
    const OffloadPlan one = plan_of(kNvmeBoth, {read});
    const OffloadPlan three = plan_of(kNvmeBoth, {read, "swap.optimizer_read_ahead=3"});
    ASSERT_EQ(one.optimizer_stack.swappers.size(), 1u);
    ASSERT_EQ(three.optimizer_stack.swappers.size(), 1u);
    EXPECT_EQ(one.optimizer_stack.swappers[0].read_ahead, 1u);
    EXPECT_EQ(three.optimizer_stack.swappers[0].read_ahead, 3u);
    EXPECT_EQ(one.optimizer_stack.pool.buffer_count, 2u);  // pipeline_write is off
    EXPECT_EQ(three.optimizer_stack.pool.buffer_count, 4u);
    EXPECT_EQ(three.optimizer_pinned_bytes(), 2 * one.optimizer_pinned_bytes());
    const Status s = plan_error(kNvmeBoth, {"swap.optimizer_read_ahead=2"});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("swap.optimizer_read_ahead 2"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("offload_optimizer.pipeline_read"), std::string::npos);
    config::LoadOptions o;
    o.log_warnings = false;
    for (const char* bad : {"swap.optimizer_read_ahead=0", "swap.optimizer_read_ahead=9"}) {
        o.overrides = {bad};
        auto c = config::load_from_string(small_config(kNvmeBoth), o, "test.json");
        ASSERT_FALSE(c.has_value()) << bad;
        EXPECT_NE(c.error().message().find("swap.optimizer_read_ahead"), std::string::npos)
            << c.error().to_string();
    }
}

// swap.overlap_step: one rank, stages 2-3, NVMe states, gradients in host memory; its states
// (and a store shared with the parameters) copy-on-write; elsewhere the reason is kept for the
// warning, and the stores stay single.
TEST(OffloadPlan, OverlapStepNeedsOneRankAndHostGradientsAndMakesTheStatesCopyOnWrite) {
    const std::string on = "swap.overlap_step=true";
    const std::string host = "zero_optimization.offload_optimizer.stream_gradients=false";
    const OffloadPlan p = plan_of(kNvmeBoth, {on, host});
    EXPECT_TRUE(p.overlap_step) << p.overlap_step_reason;
    EXPECT_TRUE(p.optimizer_store.copy_on_write);
    EXPECT_TRUE(p.parameter_store.copy_on_write);  // the same store
    EXPECT_NE(p.describe().find("the step runs beside backward"), std::string::npos);
    EXPECT_FALSE(plan_of(kNvmeBoth, {host}).overlap_step);
    EXPECT_FALSE(plan_of(kNvmeBoth, {host}).optimizer_store.copy_on_write);
    const OffloadPlan streamed =
        plan_of(kNvmeBoth, {on, "zero_optimization.offload_optimizer.stream_gradients=true"});
    EXPECT_FALSE(streamed.overlap_step);
    EXPECT_EQ(streamed.overlap_step_reason, "the gradients stream to NVMe");
    EXPECT_FALSE(streamed.optimizer_store.copy_on_write);
    const OffloadPlan stage1 =
        plan_of(R"("zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme",)"
                R"( "nvme_path": "/nonexistent/p"}},)",
                {on});
    EXPECT_FALSE(stage1.overlap_step);
    EXPECT_NE(stage1.overlap_step_reason.find("stage 1"), std::string::npos);
    const OffloadPlan cpu = plan_of(
        R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)", {on});
    EXPECT_EQ(cpu.overlap_step_reason, "the optimizer states are not on NVMe");
    PlanInputs two = inputs();
    two.world_size = 2;
    const OffloadPlan ranks = plan_of(kNvmeBoth, {on, host}, two);
    EXPECT_FALSE(ranks.overlap_step);
    EXPECT_EQ(ranks.overlap_step_reason, "several ranks");
    EXPECT_FALSE(ranks.optimizer_store.copy_on_write);
}

TEST(OffloadPlan, OptimizerNamesMapToTheKernelsKinds) {
    OffloadPlan p = plan_of("", {"optimizer.type=Adam", "optimizer.params.adam_w_mode=true"});
    EXPECT_EQ(p.optimizer.kind, kernels::OptimizerKind::kAdamW);
    p = plan_of("", {"optimizer.type=Adam", "optimizer.params.adam_w_mode=false"});
    EXPECT_EQ(p.optimizer.kind, kernels::OptimizerKind::kAdam);
    p = plan_of("", {"optimizer={\"type\": \"Lion\", \"params\": {\"lr\": 3e-4}}"});
    EXPECT_EQ(p.optimizer.kind, kernels::OptimizerKind::kLion);
    EXPECT_EQ(p.optimizer.lr, 3e-4);
    EXPECT_EQ(p.optimizer.beta2, 0.99);
    EXPECT_EQ(p.state_count, 2u);
    EXPECT_TRUE(kernels::validate(p.optimizer).is_ok());
}

TEST(OffloadPlan, AioBlockRoundTripsThroughTheIoOptions) {
    config::AioConfig c;
    c.block_size_bytes = 4u << 20;
    c.queue_depth = 8;
    c.backend = "libaio";
    c.use_direct = config::Tristate::kOn;
    c.single_submit = true;
    const io::AioOptions o = aio_options(c);
    EXPECT_EQ(o.block_size_bytes, 4u << 20);
    EXPECT_EQ(o.queue_depth, 8);
    EXPECT_EQ(o.backend, "libaio");
    EXPECT_EQ(o.use_direct, io::DirectMode::kOn);
    EXPECT_EQ(config::aio_to_json(aio_config(o)), config::aio_to_json(c));
}

}  // namespace
}  // namespace zinf::engine
