// predict_step and the machine profile: the profile's JSON round trip and its refusals, the
// model's GEMM work against the shapes it is built with, and the step's arithmetic (bytes per
// step from the plan, time from the profile's rates, exposure) on the shipped NVMe configs.
#include "src/engine/step_prediction.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "src/device/cpu_device.h"
#include "src/engine/memory_prediction.h"
#include "src/engine/model_registry.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf::engine {
namespace {

config::EngineConfig shipped(const std::string& name, const std::string& dir,
                             std::vector<std::string> extra = {}) {
    return test_support::shipped_config(ZINF_CONFIG_DIR, name, dir, std::move(extra));
}

OffloadPlan plan_for(const config::EngineConfig& c) {
    device::CpuDeviceOptions o;
    o.budget_bytes = std::size_t{1} << 40;
    o.worker_thread = false;
    auto device = device::CpuDevice::create(o);
    ZINF_ASSERT(device.has_value());
    auto model = build_model(c, **device);
    ZINF_ASSERT_MSG(model.has_value(), model.error().to_string());
    auto plan = make_offload_plan(c, plan_inputs_for(**model, **device, 1, 0));
    ZINF_ASSERT_MSG(plan.has_value(), plan.error().to_string());
    return std::move(plan).value();
}

// Round figures, so that the expected times are easy to write down.
MachineProfile round_profile() {
    MachineProfile p;
    p.machine = "test";
    p.threads = 2;
    p.memory_copy_gb_per_s = 50;
    p.gemm = {{16, 512, 512, 50}, {256, 2048, 2048, 100}};
    p.optimizer = {{"adamw", "fp32", 1e9}, {"adamw", "int8", 2e9}};
    p.io_path = "/tmp";
    p.io_backend = "io_uring";
    p.io = {{1u << 20, 32, 1, 2.0, 1.0}, {256u << 10, 8, 1, 0.5, 0.5}};
    return p;
}

TEST(MachineProfile, JsonRoundTripKeepsEveryFigure) {
    const MachineProfile p = round_profile();
    auto back = profile_from_json(profile_to_json(p), "test");
    ASSERT_TRUE(back.has_value()) << back.error().to_string();
    EXPECT_EQ(back->machine, p.machine);
    EXPECT_EQ(back->threads, 2);
    EXPECT_EQ(back->memory_copy_gb_per_s, 50);
    ASSERT_EQ(back->gemm.size(), 2u);
    EXPECT_EQ(back->gemm[1].n, 2048u);
    EXPECT_EQ(back->gemm[1].gflop_per_s, 100);
    ASSERT_EQ(back->optimizer.size(), 2u);
    EXPECT_EQ(back->optimizer[1].state_dtype, "int8");
    ASSERT_EQ(back->io.size(), 2u);
    EXPECT_EQ(back->io[0].block_size_bytes, 1u << 20);
    EXPECT_EQ(back->io[0].read_gb_per_s, 2.0);
    EXPECT_EQ(back->io_backend, "io_uring");
}

TEST(MachineProfile, BadFilesAreRefusedNamingTheKey) {
    auto not_json = profile_from_json("{", "p.json");
    ASSERT_FALSE(not_json.has_value());
    EXPECT_NE(not_json.error().to_string().find("p.json"), std::string::npos);
    auto other = profile_from_json(R"({"format": "something else"})", "p.json");
    ASSERT_FALSE(other.has_value());
    EXPECT_NE(other.error().to_string().find("zinfinity-bench profile"), std::string::npos);
    std::string text = profile_to_json(round_profile());
    const std::string key = "\"read_gb_per_s\": 2.0";
    ASSERT_NE(text.find(key), std::string::npos) << text;
    text.replace(text.find(key), key.size(), "\"read_gb_per_s\": -1");
    auto negative = profile_from_json(text, "p.json");
    ASSERT_FALSE(negative.has_value());
    EXPECT_NE(negative.error().to_string().find("io.points[0].read_gb_per_s"), std::string::npos)
        << negative.error().to_string();
    EXPECT_FALSE(load_profile("/nonexistent/profile.json").has_value());
}

TEST(MachineProfile, NearestPointsAreChosenInLogDistance) {
    const MachineProfile p = round_profile();
    EXPECT_EQ(p.nearest_gemm(2048, 256, 2048)->gflop_per_s, 100);  // any order of dimensions
    EXPECT_EQ(p.nearest_gemm(8, 400, 600)->gflop_per_s, 50);
    EXPECT_EQ(p.nearest_io(1u << 20, 32)->read_gb_per_s, 2.0);
    EXPECT_EQ(p.nearest_io(128u << 10, 4)->read_gb_per_s, 0.5);
    EXPECT_NE(p.find_optimizer("adamw", "int8"), nullptr);
    EXPECT_EQ(p.find_optimizer("lion", "fp32"), nullptr);
}

double flops(const std::vector<GemmWork>& w) {
    double f = 0;
    for (const auto& g : w) f += g.flops();
    return f;
}

// An MLP's forward is 2 x rows x (its weights) FLOPs; backward twice that, less the first
// layer's input gradient (nothing consumes it).
TEST(ModelWork, MlpGemmFlopsFollowItsWeights) {
    test::TempDir dir("work");
    const config::EngineConfig c = shipped("fashion-mnist.json", dir.path());
    const ModelWork w = model_work(c);
    const double rows = 128;
    const double weights = 784.0 * 1024 + 1024.0 * 1024 + 1024.0 * 10;
    EXPECT_DOUBLE_EQ(flops(w.forward), 2 * rows * weights);
    EXPECT_DOUBLE_EQ(flops(w.backward), 4 * rows * weights - 2 * rows * 784.0 * 1024);
    EXPECT_FALSE(w.recompute_forward);
    EXPECT_EQ(w.checkpoint_bytes, 0u);
}

// A GPT's linear layers are 2 x tokens x (12 d^2 per block + the tied head) in forward; the
// attention adds 4 x seq^2 x d per sequence and block. gpt-nvme checkpoints each block's input.
TEST(ModelWork, GptCountsItsLinearLayersAttentionAndCheckpoints) {
    test::TempDir dir("work");
    const config::EngineConfig c = shipped("gpt-nvme.json", dir.path());
    const ModelWork w = model_work(c);
    const double d = 512, s = 128, rows = 2, blocks = 16, t = rows * s;
    const double linear = 2 * t * (12 * d * d * blocks + 256 * d);
    const double attention = 4 * s * s * d * rows * blocks;
    EXPECT_NEAR(flops(w.forward), linear + attention, 1e-9 * linear);
    EXPECT_NEAR(flops(w.backward), 2 * (linear + attention), 1e-9 * linear);
    EXPECT_TRUE(w.recompute_forward);
    EXPECT_EQ(w.checkpoint_bytes, static_cast<std::uint64_t>(t * d * 4 * blocks));
}

// fashion-mnist-nvme: the optimizer states (12 B per parameter) are read and written each step;
// the parameters stay in their host tier. Time follows the profile's rates.
TEST(StepPrediction, OptimizerStatesOnNvmeMoveTwelveBytesPerParameter) {
    test::TempDir dir("step");
    const config::EngineConfig c = shipped("fashion-mnist-nvme.json", dir.path());
    const OffloadPlan plan = plan_for(c);
    MachineProfile profile = round_profile();
    auto p = predict_step(c, plan, 1, profile);
    ASSERT_TRUE(p.has_value()) << p.error().to_string();
    const double states = 12.0 * double(plan.domain_numel);
    EXPECT_DOUBLE_EQ(p->read_bytes, states);
    EXPECT_DOUBLE_EQ(p->write_bytes, states);
    EXPECT_DOUBLE_EQ(p->io_s, states / 2e9 + states / 1e9);
    EXPECT_EQ(p->optimizer_params_per_s, 1e9);
    EXPECT_GT(p->forward_s, 0);
    EXPECT_GT(p->backward_s, p->forward_s);
    EXPECT_NEAR(p->step_s, p->forward_s + p->backward_s + p->optimizer_s + p->exposed_io_s, 1e-12);
    // The pipeline hides the kernel under the I/O here: the optimizer phase is the I/O.
    EXPECT_GE(p->exposed_io_s, p->io_s - p->optimizer_s - 1e-12);
    EXPECT_NE(p->describe().find("stay in the host tier"), std::string::npos) << p->describe();

    // Twice the disk: the I/O time halves, compute is unchanged.
    for (auto& io : profile.io) {
        io.read_gb_per_s *= 2;
        io.write_gb_per_s *= 2;
    }
    auto fast = predict_step(c, plan, 1, profile);
    ASSERT_TRUE(fast.has_value());
    EXPECT_DOUBLE_EQ(fast->io_s, p->io_s / 2);
    EXPECT_DOUBLE_EQ(fast->forward_s, p->forward_s);
    EXPECT_LT(fast->step_s, p->step_s);

    // int8 states move 6 B (and a scale per 2048) per parameter, at int8's own kernel rate.
    const config::EngineConfig c8 =
        shipped("fashion-mnist-nvme.json", dir.path(),
                {"zero_optimization.offload_optimizer.state_dtype=int8"});
    const OffloadPlan plan8 = plan_for(c8);
    auto p8 = predict_step(c8, plan8, 1, round_profile());
    ASSERT_TRUE(p8.has_value()) << p8.error().to_string();
    EXPECT_NEAR(p8->read_bytes / double(plan8.domain_numel), 6.0, 0.01);
    EXPECT_EQ(p8->optimizer_params_per_s, 2e9);
}

// gpt-nvme: parameters beyond the host tier are fetched in every micro-step's forward and
// backward and written back after the step; activation checkpoints go out and come back.
TEST(StepPrediction, StreamedParametersAndCheckpointsAreCounted) {
    test::TempDir dir("step");
    const config::EngineConfig c = shipped("gpt-nvme.json", dir.path());
    const OffloadPlan plan = plan_for(c);
    auto p = predict_step(c, plan, 1, round_profile());
    ASSERT_TRUE(p.has_value()) << p.error().to_string();
    const double params = double(plan.model_numel) * 2;  // bf16
    const double cached = double(plan.parameter_host_tier_bytes);
    const double micro = 8;
    ASSERT_GT(params, cached);
    const double states = plan.state_bytes_per_element() * double(plan.domain_numel);
    const double kept = micro * 2 * 128 * 512 * 4 * 16;
    EXPECT_DOUBLE_EQ(p->read_bytes, states + params + (2 * micro - 1) * (params - cached) + kept);
    EXPECT_DOUBLE_EQ(p->write_bytes, states + params + kept);
    ASSERT_EQ(p->flows.size(), 3u);
    EXPECT_NE(p->describe().find("activation checkpoints"), std::string::npos);
}

TEST(MachineProfile, CollectivesInterpolateBetweenMeasuredSizesAndRoundTrip) {
    MachineProfile p = round_profile();
    p.collectives = {{"all_gather", 2, 1024, 10e-6}, {"all_gather", 2, 1u << 20, 110e-6}};
    EXPECT_DOUBLE_EQ(p.collective_seconds("all_gather", 2, 512), 10e-6);  // latency below
    EXPECT_DOUBLE_EQ(p.collective_seconds("all_gather", 2, (1024.0 + (1u << 20)) / 2), 60e-6);
    EXPECT_DOUBLE_EQ(p.collective_seconds("all_gather", 2, 2.0 * (1u << 20)), 220e-6);
    EXPECT_LT(p.collective_seconds("all_gather", 3, 1024), 0);  // not measured at 3 ranks
    EXPECT_LT(p.collective_seconds("reduce_scatter", 2, 1024), 0);
    auto back = profile_from_json(profile_to_json(p), "test");
    ASSERT_TRUE(back.has_value()) << back.error().to_string();
    ASSERT_EQ(back->collectives.size(), 2u);
    EXPECT_EQ(back->collectives[1].op, "all_gather");
    EXPECT_EQ(back->collectives[1].ranks, 2);
    EXPECT_EQ(back->collectives[1].bytes, 1u << 20);
    EXPECT_EQ(back->collectives[1].seconds, 110e-6);
    // A profile without collectives (zinfinity-bench profile alone) still loads.
    EXPECT_TRUE(profile_from_json(profile_to_json(round_profile()), "test").has_value());
    std::string text = profile_to_json(p);
    const std::string op = "\"all_gather\"";
    text.replace(text.find(op), op.size(), "\"all_to_all\"");
    auto bad = profile_from_json(text, "p.json");
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().to_string().find("collectives[0].op"), std::string::npos)
        << bad.error().to_string();
}

// Over two ranks the step gains the coordinator's collectives, one call per parameter: here each
// collective takes a fixed time per call (1, 2 and 3 ms), so the calls can be counted.
TEST(StepPrediction, CollectivesOfSeveralRanksAreCountedPerStage) {
    test::TempDir dir("step");
    MachineProfile profile = round_profile();
    for (const auto& [op, t] : {std::pair{"all_reduce", 1e-3}, std::pair{"reduce_scatter", 2e-3},
                                std::pair{"all_gather", 3e-3}}) {
        profile.collectives.push_back({op, 2, 1, t});
        profile.collectives.push_back({op, 2, std::uint64_t{1} << 40, t});
    }
    // The fashion-mnist MLP: two weights above the persistence threshold (1e5 elements), the
    // last weight (10240) and the three biases below it.
    const std::vector<std::size_t> numels = {784 * 1024, 1024, 1024 * 1024, 1024, 1024 * 10, 10};
    struct Case {
        int stage;
        std::uint64_t calls;
        double seconds;
    };
    // Two micro-steps. Stage 0: the gradient's all-reduce; stage 2: each gradient
    // reduce-scattered per micro-step (12) and each parameter all-gathered after the step (6);
    // stage 3: reduce-scatters as stage 2, the two large weights gathered in forward and backward
    // of each micro-step (8), the persistent four once per step. Each adds the gradient
    // statistics' all-reduce.
    for (const Case& k : {Case{0, 2, 2e-3}, Case{2, 19, 12 * 2e-3 + 6 * 3e-3 + 1e-3},
                          Case{3, 25, 12 * 2e-3 + 12 * 3e-3 + 1e-3}}) {
        const config::EngineConfig c = shipped(
            "fashion-mnist.json", dir.path(),
            {str_cat("zero_optimization.stage=", k.stage), "gradient_accumulation_steps=2"});
        const OffloadPlan plan = plan_for(c);
        auto one = predict_step(c, plan, 1, profile, numels);
        auto two = predict_step(c, plan, 2, profile, numels);
        ASSERT_TRUE(one.has_value() && two.has_value()) << "stage " << k.stage;
        EXPECT_EQ(one->collective_calls, 0u);
        EXPECT_EQ(two->collective_calls, k.calls) << "stage " << k.stage;
        EXPECT_NEAR(two->collective_s, k.seconds, 1e-12) << "stage " << k.stage;
        EXPECT_NEAR(two->step_s - one->step_s, k.seconds, 1e-9) << "stage " << k.stage;
        EXPECT_NE(two->describe().find("collectives"), std::string::npos) << two->describe();
        // Three ranks were not measured: said, and nothing counted.
        auto three = predict_step(c, plan, 3, profile, numels);
        ASSERT_TRUE(three.has_value());
        EXPECT_EQ(three->collective_calls, 0u);
        EXPECT_NE(three->describe().find("no all_reduce figures for 3 ranks"), std::string::npos)
            << three->describe();
    }
}

TEST(StepPrediction, WhatTheProfileLacksIsNamed) {
    test::TempDir dir("step");
    const config::EngineConfig c =
        shipped("fashion-mnist-nvme.json", dir.path(), {"optimizer.type=Lion"});
    auto p = predict_step(c, plan_for(c), 1, round_profile());
    ASSERT_FALSE(p.has_value());
    EXPECT_NE(p.error().to_string().find("lion"), std::string::npos) << p.error().to_string();
    config::EngineConfig cuda = shipped("fashion-mnist.json", dir.path());
    const OffloadPlan plan = plan_for(cuda);
    cuda.device.type = "cuda";
    auto q = predict_step(cuda, plan, 1, round_profile());
    ASSERT_FALSE(q.has_value());
    EXPECT_EQ(q.error().code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace zinf::engine
