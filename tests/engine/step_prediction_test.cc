// predict_step and the machine profile: the profile's JSON round trip and its refusals, the
// model's GEMM work against the shapes it is built with, and the step's arithmetic (bytes per
// step from the plan, time from the profile's rates, exposure) on the shipped NVMe configs.
#include "src/engine/step_prediction.h"

#include <gtest/gtest.h>

#include <string>
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
