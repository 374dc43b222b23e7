// predict_memory and admission: the shipped configs are admitted, the issue-32 crash shape is
// refused before a swap directory exists, and the predicted device peak bounds the measured one
// (CpuDevice::peak_bytes) from above, within 25 %.
#include "src/engine/memory_prediction.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/device/cpu_device.h"
#include "src/engine/model_registry.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf::engine {
namespace {

namespace fs = std::filesystem;

// A shipped config with its swap paths under `dir` and `extra` overrides.
config::EngineConfig shipped(const std::string& name, const std::string& dir,
                             std::vector<std::string> extra = {}) {
    return test_support::shipped_config(ZINF_CONFIG_DIR, name, dir, std::move(extra));
}

// The prediction for one config, the model built on a CPU device of the config's budget.
Result<MemoryPrediction> predict(const config::EngineConfig& c) {
    device::CpuDeviceOptions o;
    o.budget_bytes = c.device.memory_budget_bytes;
    ZINF_ASSIGN_OR_RETURN(auto device, device::CpuDevice::create(o));
    ZINF_ASSIGN_OR_RETURN(auto model, build_model(c, *device));
    const PlanInputs in = plan_inputs_for(*model, *device, 1, 0);
    ZINF_ASSIGN_OR_RETURN(OffloadPlan plan, make_offload_plan(c, in));
    return predict_memory(c, plan, in, prediction_inputs_for(*model, *device));
}

TEST(MemoryPrediction, EveryShippedConfigIsAdmitted) {
    test::TempDir dir("admit");
    std::size_t count = 0;
    for (const auto& entry : fs::directory_iterator(ZINF_CONFIG_DIR)) {
        if (entry.path().extension() != ".json") continue;
        SCOPED_TRACE(entry.path().string());
        const config::EngineConfig c = shipped(entry.path().filename().string(), dir.path());
        auto p = predict(c);
        ASSERT_TRUE(p.has_value()) << p.error().to_string();
        EXPECT_TRUE(admit(*p).is_ok()) << admit(*p).to_string() << "\n" << describe(*p);
        EXPECT_GT(p->device.total_bytes(), 0u);
        ++count;
    }
    EXPECT_GE(count, 6u);
}

// Issue 32: configs/big-mlp-nvme.json at two 8192 x 8192 layers with a 1 GiB device budget died
// of SIGSEGV after its swap files were created. Admission refuses it before any is, naming the
// key.
TEST(MemoryPrediction, CrashShapeIsRefusedBeforeAnySwapFileExists) {
    test::TempDir dir("crash");
    const std::string swap = dir.file("swap");
    const config::EngineConfig c =
        shipped("big-mlp-nvme.json", swap,
                {"model.layers=[1024, 8192, 8192, 8192, 10]", "device.memory_budget=1073741824",
                 "device.host_memory_budget=4294967296",
                 "zero_optimization.offload_param.buffer_size=67108864",
                 "zero_optimization.offload_param.max_in_cpu=134217728"});
    auto stack = TrainingStack::create(c);
    ASSERT_FALSE(stack.has_value());
    const Status& s = stack.error();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("device.memory_budget"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("predicted device peak"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("gathered parameters"), std::string::npos) << s.to_string();
    // Nothing written: the swap path (missing before) is not even created, so no run directory,
    // lock or file either.
    EXPECT_FALSE(fs::exists(swap)) << swap;
}

TEST(MemoryPrediction, ModulesAreFetchGroups) {
    model::ParameterRegistry r;
    const model::InitRule init;
    r.add("layers.0.weight", {4, 3}, init);
    r.add("layers.0.bias", {4}, init);
    r.add("norms.0.weight", {4}, init);
    r.add("norms.0.bias", {4}, init);
    r.add("head", {2, 4}, init);
    const auto groups = model::groups_by_module(r);
    ASSERT_EQ(groups.size(), 3u);
    EXPECT_EQ(groups[0], (std::vector<model::ParamId>{0, 1}));
    EXPECT_EQ(groups[1], (std::vector<model::ParamId>{2, 3}));
    EXPECT_EQ(groups[2], (std::vector<model::ParamId>{4}));
}

TEST(MemoryPrediction, UnknownFetchGroupsMakeTheDeviceFigureALowerBound) {
    test::TempDir dir("groups");
    const config::EngineConfig c = shipped("fashion-mnist-nvme.json", dir.path());
    device::CpuDeviceOptions o;
    o.budget_bytes = c.device.memory_budget_bytes;
    auto device = std::move(device::CpuDevice::create(o)).value();
    auto model = std::move(build_model(c, *device)).value();
    const PlanInputs in = plan_inputs_for(*model, *device, 1, 0);
    const OffloadPlan plan = std::move(make_offload_plan(c, in)).value();
    PredictionInputs known = prediction_inputs_for(*model, *device);
    PredictionInputs unknown = known;
    unknown.fetch_groups.clear();
    const MemoryPrediction a = std::move(predict_memory(c, plan, in, known)).value();
    const MemoryPrediction b = std::move(predict_memory(c, plan, in, unknown)).value();
    EXPECT_TRUE(a.device_inexact_reason.empty());
    EXPECT_FALSE(b.device_inexact_reason.empty());
    EXPECT_LE(b.device.total_bytes(), a.device.total_bytes());
}

TEST(MemoryPrediction, HostRefusalNamesTheHostBudget) {
    MemoryPrediction p;
    p.device_budget_bytes = 1 << 20;
    p.device.add(Holder::kBuffers, "batch inputs", 4096);
    p.host_budget_bytes = 8192;
    p.pinned_host.add(Holder::kOptimizerStates, "offload_optimizer pinned sub-groups", 16384);
    p.host_budgeted_bytes = 16384;
    const Status s = admit(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("device.host_memory_budget"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("16384"), std::string::npos) << s.to_string();
    p.host_budget_bytes = 16384;
    EXPECT_TRUE(admit(p).is_ok());
}

// Trains `steps` steps of a config and returns {predicted, measured} device peaks.
std::pair<std::uint64_t, std::uint64_t> mlp_peaks(const config::EngineConfig& c, int steps) {
    test_support::Trainer t(c);
    for (int i = 0; i < steps; ++i) {
        auto loss = t.try_step();
        EXPECT_TRUE(loss.has_value()) << loss.error().to_string();
    }
    return {t.engine().memory_prediction().device.total_bytes(), t.stack.device->peak_bytes()};
}

std::pair<std::uint64_t, std::uint64_t> gpt_peaks(const config::EngineConfig& c, int steps) {
    auto made = TrainingStack::create(c);
    ZINF_ASSERT_MSG(made.has_value(), made.error().to_string());
    TrainingStack stack = std::move(made).value();
    Engine& e = *stack.engine;
    const model::BatchShape shape = e.model().batch_shape();
    const std::size_t rows = c.batch.train_micro_batch_size_per_gpu;
    std::vector<std::int32_t> tokens(rows * shape.input_numel);
    std::vector<std::int32_t> labels(rows * shape.label_numel);
    std::uint64_t x = test::seed();
    for (int i = 0; i < steps * static_cast<int>(c.batch.gradient_accumulation_steps); ++i) {
        for (auto* v : {&tokens, &labels}) {
            for (auto& t : *v) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                t = static_cast<std::int32_t>((x >> 33) % shape.classes);
            }
        }
        auto loss = e.forward(Batch::of_tokens(tokens, labels, rows));
        EXPECT_TRUE(loss.has_value()) << loss.error().to_string();
        EXPECT_TRUE(e.backward().is_ok());
        EXPECT_TRUE(e.step().is_ok());
    }
    return {e.memory_prediction().device.total_bytes(), stack.device->peak_bytes()};
}

void expect_tight(std::pair<std::uint64_t, std::uint64_t> peaks) {
    const auto [predicted, measured] = peaks;
    EXPECT_GE(predicted, measured);
    EXPECT_LE(static_cast<double>(predicted), 1.25 * static_cast<double>(measured));
    std::printf("predicted device peak %llu, measured %llu (%.4fx)\n",
                static_cast<unsigned long long>(predicted),
                static_cast<unsigned long long>(measured),
                static_cast<double>(predicted) / static_cast<double>(measured));
}

const std::vector<std::string> kSynthetic = {"data.dataset=synthetic", "data.synthetic_samples=512",
                                             "cpu_optimizer.threads=1"};

TEST(MemoryPrediction, BoundsTheMeasuredPeakOfFashionMnist) {
    SCOPED_TRACE("fashion-mnist.json");
    test::TempDir dir("peak");
    expect_tight(mlp_peaks(shipped("fashion-mnist.json", dir.path(), kSynthetic), 3));
}

TEST(MemoryPrediction, BoundsTheMeasuredPeakOfFashionMnistCpu) {
    test::TempDir dir("peak");
    expect_tight(mlp_peaks(shipped("fashion-mnist-cpu.json", dir.path(), kSynthetic), 3));
}

TEST(MemoryPrediction, BoundsTheMeasuredPeakOfFashionMnistNvme) {
    test::TempDir dir("peak");
    expect_tight(mlp_peaks(shipped("fashion-mnist-nvme.json", dir.path(), kSynthetic), 3));
}

// Compressed moments on the device (stage 0, the CPU device): the prediction counts their stored
// bytes, still bounds the measured peak, and is smaller than fp32 states' by the moments' saving.
TEST(MemoryPrediction, BoundsTheMeasuredPeakWithCompressedStates) {
    test::TempDir dir("peak");
    auto with = [&](const char* dtype) {
        std::vector<std::string> o = kSynthetic;
        o.push_back(std::string("zero_optimization.offload_optimizer.state_dtype=") + dtype);
        return shipped("fashion-mnist.json", dir.path(), o);
    };
    const auto fp32 = mlp_peaks(with("fp32"), 2);
    const auto int8 = mlp_peaks(with("int8"), 2);
    expect_tight(int8);
    // The MLP's 1.86 M parameters: two moments of 4 B each become 1 B (plus a scale per 2048).
    EXPECT_LT(int8.first + 5'000'000, fp32.first);
    EXPECT_LT(int8.second + 5'000'000, fp32.second);
}

TEST(MemoryPrediction, BoundsTheMeasuredPeakOfGptSmall) {
    test::TempDir dir("peak");
    expect_tight(gpt_peaks(
        shipped("gpt-small.json", dir.path(), {"model.n_layer=2", "cpu_optimizer.threads=1"}), 2));
}

TEST(MemoryPrediction, BoundsTheMeasuredPeakOfGptNvme) {
    test::TempDir dir("peak");
    expect_tight(gpt_peaks(
        shipped("gpt-nvme.json", dir.path(),
                {"model.n_layer=4", "gradient_accumulation_steps=2", "cpu_optimizer.threads=1"}),
        2));
}

}  // namespace
}  // namespace zinf::engine
