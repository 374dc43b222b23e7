// The parameter registry, seeded initialisation, the device parameter store, and the modules'
// and Mlp's gradients against finite differences of a double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "src/base/philox.h"
#include "src/model/mlp.h"
#include "src/model/parameter.h"
#include "src/model/parameter_store.h"
#include "tests/model/model_test_support.h"
#include "tests/support/test_seed.h"

namespace zinf::model {
namespace {

using test_support::make_machine;
using test_support::to_device;
using test_support::to_host;

TEST(ParameterRegistry, AssignsIdsNamesShapesAndCounts) {
    ParameterRegistry registry;
    const ParamId a = registry.add("layers.0.weight", {4, 3}, {InitKind::kUniform, 0.5f});
    const ParamId b = registry.add("layers.0.bias", {4}, {InitKind::kConstant, 0.0f});
    EXPECT_EQ(a, 0u);
    EXPECT_EQ(b, 1u);
    EXPECT_EQ(registry.size(), 2u);
    EXPECT_EQ(registry.info(a).numel, 12u);
    EXPECT_EQ(registry.info(b).name, "layers.0.bias");
    EXPECT_EQ(registry.total_numel(), 16u);
    EXPECT_EQ(registry.max_numel(), 12u);
    EXPECT_EQ(*registry.find("layers.0.bias"), b);
    EXPECT_EQ(registry.find("nope").error().code(), StatusCode::kNotFound);
}

TEST(InitialValues, AreSeededUniformAndPartitionable) {
    ParameterRegistry registry;
    const ParamId id = registry.add("w", {100, 100}, {InitKind::kUniform, 0.1f});
    const ParameterInfo& info = registry.info(id);
    std::vector<float> full(info.numel), again(info.numel), other(info.numel);
    initial_values(info, 7, 0, full);
    initial_values(info, 7, 0, again);
    initial_values(info, 8, 0, other);
    EXPECT_EQ(full, again);
    EXPECT_NE(full, other);
    double sum = 0, sum_sq = 0;
    for (const float v : full) {
        ASSERT_GE(v, -0.1f);
        ASSERT_LT(v, 0.1f);
        sum += v;
        sum_sq += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(full.size());
    EXPECT_NEAR(sum / n, 0.0, 0.003);
    EXPECT_NEAR(sum_sq / n, 0.01 / 3, 0.0003);  // variance of U[-b, b) is b^2 / 3
    // Any slice can be produced alone: a ZeRO rank initialises only its partition.
    std::vector<float> slice(777);
    initial_values(info, 7, 1234, slice);
    for (std::size_t i = 0; i < slice.size(); ++i) ASSERT_EQ(slice[i], full[1234 + i]);
    // Constants.
    const ParamId c = registry.add("gamma", {5}, {InitKind::kConstant, 1.0f});
    std::vector<float> ones(5);
    initial_values(registry.info(c), 7, 0, ones);
    for (const float v : ones) EXPECT_EQ(v, 1.0f);
}

TEST(Linear, InitialisesLikePyTorchAndNamesItsParameters) {
    ParameterRegistry registry;
    auto linear = Linear::create(registry, "layers.3", 400, 20);
    const ParameterInfo& w = registry.info(linear->weight_id());
    EXPECT_EQ(w.name, "layers.3.weight");
    EXPECT_EQ(w.shape, (std::vector<std::size_t>{20, 400}));
    EXPECT_EQ(w.init.kind, InitKind::kUniform);
    EXPECT_FLOAT_EQ(w.init.value, 0.05f);  // 1 / sqrt(fan_in)
    EXPECT_EQ(registry.info(linear->bias_id()).name, "layers.3.bias");
    EXPECT_FLOAT_EQ(registry.info(linear->bias_id()).init.value, 0.05f);
}

TEST(DeviceParameterStore, InitialisesFetchesAndAccumulates) {
    auto machine = make_machine();
    ParameterRegistry registry;
    const ParamId a = registry.add("a", {3, 5}, {InitKind::kUniform, 1.0f});
    const ParamId b = registry.add("b", {7}, {InitKind::kConstant, 2.0f});
    auto store = DeviceParameterStore::create(registry, *machine.device, *machine.compute);
    ASSERT_TRUE(store.has_value()) << store.status().to_string();
    ASSERT_TRUE((*store)->initialize(99, 0));
    std::vector<float> expected(15);
    initial_values(registry.info(a), 99, 0, expected);
    EXPECT_EQ(to_host(*machine.device, (*store)->parameter(a), 15), expected);
    EXPECT_EQ(to_host(*machine.device, (*store)->parameter(b), 7), std::vector<float>(7, 2.0f));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>((*store)->parameter(b)) %
                  DeviceParameterStore::kAlignmentBytes,
              0u);

    auto fetched = (*store)->fetch(b, 0);
    ASSERT_TRUE(fetched.has_value());
    EXPECT_EQ(*fetched, (*store)->parameter(b));
    EXPECT_EQ((*store)->live_fetch_count(), 1u);
    ASSERT_TRUE((*store)->release(b, 0));
    EXPECT_EQ((*store)->live_fetch_count(), 0u);

    const std::vector<float> grad = {1, 2, 3, 4, 5, 6, 7};
    auto grad_device = to_device(*machine.device, grad);
    ASSERT_TRUE((*store)->accumulate(b, grad_device.as<float>(), 0));
    ASSERT_TRUE((*store)->accumulate(b, grad_device.as<float>(), 0));
    const auto sum = to_host(*machine.device, (*store)->gradient(b), 7);
    for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(sum[i], 2 * grad[i]);
    ASSERT_TRUE((*store)->zero_gradients(0));
    EXPECT_EQ(to_host(*machine.device, (*store)->gradient(b), 7), std::vector<float>(7, 0.0f));
}

TEST(DeviceParameterStore, FailsCleanlyOverTheDeviceBudget) {
    device::CpuDeviceOptions options;
    options.budget_bytes = 1 << 20;
    auto device = device::CpuDevice::create(options);
    ASSERT_TRUE(device.has_value());
    auto compute = device::CpuCompute::create(device->get());
    ASSERT_TRUE(compute.has_value());
    ParameterRegistry registry;
    registry.add("big", {1024, 1024}, {InitKind::kConstant, 0.0f});
    auto store = DeviceParameterStore::create(registry, **device, **compute);
    ASSERT_FALSE(store.has_value());
    EXPECT_EQ(store.error().code(), StatusCode::kNoSpace);
    EXPECT_NE(store.error().message().find("parameter store"), std::string::npos);
    EXPECT_EQ((*device)->used_bytes(), 0u);
}

// ---- Gradient checks of the whole model -----------------------------------------------------

struct GradCheckCase {
    Activation activation;
    bool layer_norm;
    float dropout;
};

class MlpGradientTest : public ::testing::TestWithParam<GradCheckCase> {};

TEST_P(MlpGradientTest, BackwardMatchesFiniteDifferencesOfDoubleReference) {
    const GradCheckCase param = GetParam();
    auto machine = make_machine();
    MlpConfig config;
    config.layer_sizes = {6, 7, 5, 3};
    config.activation = param.activation;
    config.layer_norm = param.layer_norm;
    config.dropout_prob = param.dropout;
    config.batch_rows_max = 8;
    config.seed = 5;
    auto mlp = Mlp::create(config, *machine.device);
    ASSERT_TRUE(mlp.has_value()) << mlp.status().to_string();
    auto store =
        DeviceParameterStore::create((*mlp)->parameters(), *machine.device, *machine.compute);
    ASSERT_TRUE(store.has_value());
    ASSERT_TRUE((*store)->initialize(test::seed(), 0));

    const std::size_t rows = 5;
    std::mt19937_64 rng(test::seed());
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> x(rows * 6);
    for (float& v : x) v = dist(rng);
    const std::vector<std::int32_t> labels = {0, 2, 1, 2, 0};
    auto x_device = to_device(*machine.device, x);
    auto labels_device = to_device(*machine.device, labels);

    Context ctx{*machine.compute, **store, **store};
    ctx.step = 3;
    ASSERT_TRUE((*mlp)->forward(ctx, x_device.as<float>(), labels_device.as<std::int32_t>(), rows));
    auto loss = (*mlp)->read_loss(0);
    ASSERT_TRUE(loss.has_value());
    ASSERT_TRUE((*mlp)->backward(ctx, 1.0f));
    EXPECT_EQ((*store)->live_fetch_count(), 0u);

    // The masks the model drew, for the reference.
    std::vector<std::vector<std::uint8_t>> masks((*mlp)->module_count());
    for (std::size_t m = 0; m < (*mlp)->module_count(); ++m) {
        const Module& module = (*mlp)->module(m);
        if (module.kind() == "dropout") {
            const auto& dropout = static_cast<const Dropout&>(module);
            masks[m] = to_host(*machine.device, dropout.mask(), rows * module.out_features());
            // The mask is the documented Philox mask of (module seed, step, index).
            const std::uint32_t threshold = philox::dropout_threshold(dropout.p());
            for (std::size_t i = 0; i < masks[m].size(); ++i) {
                ASSERT_EQ(masks[m][i] != 0, philox::dropout_keep(dropout.seed(), 3, i, threshold));
            }
        }
    }

    auto params = test_support::host_parameters(*machine.device, **store);
    const std::vector<double> xd(x.begin(), x.end());
    const double loss_ref = test_support::reference_loss(**mlp, params, masks, xd, labels, rows);
    EXPECT_NEAR(*loss, loss_ref, 1e-5);

    const double h = 1e-6;
    for (const ParameterInfo& info : (*mlp)->parameters().all()) {
        const auto grad = to_host(*machine.device, (*store)->gradient(info.id), info.numel);
        for (std::size_t i = 0; i < info.numel; ++i) {
            const double saved = params[info.id][i];
            params[info.id][i] = saved + h;
            const double plus =
                test_support::reference_loss(**mlp, params, masks, xd, labels, rows);
            params[info.id][i] = saved - h;
            const double minus =
                test_support::reference_loss(**mlp, params, masks, xd, labels, rows);
            params[info.id][i] = saved;
            const double numeric = (plus - minus) / (2 * h);
            ASSERT_NEAR(grad[i], numeric, 1e-4 + 1e-3 * std::fabs(numeric))
                << info.name << "[" << i << "]";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Configs, MlpGradientTest,
                         ::testing::Values(GradCheckCase{Activation::kRelu, false, 0.0f},
                                           GradCheckCase{Activation::kGelu, true, 0.0f},
                                           GradCheckCase{Activation::kGelu, true, 0.3f},
                                           GradCheckCase{Activation::kRelu, true, 0.5f}));

TEST(Mlp, FetchesEachParameterAroundUseAndSkipsTheFirstInputGradient) {
    auto machine = make_machine();
    MlpConfig config;
    config.layer_sizes = {4, 8, 8, 2};
    config.layer_norm = true;
    config.batch_rows_max = 4;
    auto mlp = Mlp::create(config, *machine.device);
    ASSERT_TRUE(mlp.has_value());
    // 3 Linear (weight, bias) + 2 LayerNorm (weight, bias).
    EXPECT_EQ((*mlp)->parameters().size(), 10u);
    EXPECT_EQ((*mlp)->parameters().info(4).name, "layers.1.weight");
    EXPECT_EQ((*mlp)->parameters().info(2).name, "norms.0.weight");
    auto store =
        DeviceParameterStore::create((*mlp)->parameters(), *machine.device, *machine.compute);
    ASSERT_TRUE(store.has_value());
    ASSERT_TRUE((*store)->initialize(1, 0));
    auto x = to_device(*machine.device, std::vector<float>(16, 0.5f));
    auto labels = to_device(*machine.device, std::vector<std::int32_t>{0, 1, 1, 0});
    Context ctx{*machine.compute, **store, **store};
    ASSERT_TRUE((*mlp)->forward(ctx, x.as<float>(), labels.as<std::int32_t>(), 4));
    EXPECT_EQ((*store)->total_fetch_count(), 10u);  // every parameter once
    EXPECT_EQ((*store)->live_fetch_count(), 0u);
    ASSERT_TRUE((*mlp)->backward(ctx, 1.0f));
    // Backward fetches each Linear weight but the first (for dx) and each LayerNorm gamma.
    EXPECT_EQ((*store)->total_fetch_count(), 10u + 2u + 2u);
    EXPECT_EQ((*store)->live_fetch_count(), 0u);
}

// A ParameterSource whose n-th fetch fails, as a swap-in error would.
class FailingSource final : public ParameterSource {
public:
    FailingSource(ParameterSource& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
    Result<const float*> fetch(ParamId id, StreamId stream) override {
        if (fetches_++ == fail_at_) {
            return Status::io_error("injected swap-in failure", 5).mark_injected();
        }
        return inner_.fetch(id, stream);
    }
    Status release(ParamId id, StreamId stream) override { return inner_.release(id, stream); }

private:
    ParameterSource& inner_;
    int fail_at_;
    int fetches_ = 0;
};

TEST(Mlp, FetchFailuresReturnTheErrorAndLeaveNothingFetched) {
    auto machine = make_machine();
    MlpConfig config;
    config.layer_sizes = {4, 8, 2};
    config.layer_norm = true;
    config.batch_rows_max = 4;
    auto mlp = Mlp::create(config, *machine.device);
    ASSERT_TRUE(mlp.has_value());
    auto store =
        DeviceParameterStore::create((*mlp)->parameters(), *machine.device, *machine.compute);
    ASSERT_TRUE(store.has_value());
    ASSERT_TRUE((*store)->initialize(1, 0));
    auto x = to_device(*machine.device, std::vector<float>(16, 0.5f));
    auto labels = to_device(*machine.device, std::vector<std::int32_t>{0, 1, 1, 0});
    // Forward fetches 6 parameters and backward 2: fail each in turn.
    for (int n = 0; n < 8; ++n) {
        FailingSource source(**store, n);
        Context ctx{*machine.compute, source, **store};
        Status status = (*mlp)->forward(ctx, x.as<float>(), labels.as<std::int32_t>(), 4);
        if (status.is_ok()) status = (*mlp)->backward(ctx, 1.0f);
        ASSERT_FALSE(status.is_ok()) << "fetch " << n;
        EXPECT_EQ(status.code(), StatusCode::kIo);
        EXPECT_TRUE(status.is_injected()) << status.to_string();
        EXPECT_NE(status.message().find("module"), std::string::npos) << status.to_string();
        EXPECT_EQ((*store)->live_fetch_count(), 0u) << "fetch " << n;
    }
}

TEST(Mlp, RejectsBadConfigs) {
    auto machine = make_machine();
    MlpConfig config;
    config.layer_sizes = {4};
    EXPECT_EQ(Mlp::create(config, *machine.device).error().code(), StatusCode::kInvalidArgument);
    config.layer_sizes = {4, 0, 2};
    EXPECT_NE(Mlp::create(config, *machine.device).error().message().find("layer_sizes[1]"),
              std::string::npos);
    config.layer_sizes = {4, 2};
    config.dropout_prob = 1.0f;
    EXPECT_NE(Mlp::create(config, *machine.device).error().message().find("dropout_prob"),
              std::string::npos);
    EXPECT_EQ(machine.device->used_bytes(), 0u);
}

TEST(Dropout, IsTheIdentityOutsideTraining) {
    auto machine = make_machine();
    auto dropout = Dropout::create(*machine.device, 10, 3, 0.5f, 77);
    ASSERT_TRUE(dropout.has_value());
    ParameterRegistry registry;
    auto store = DeviceParameterStore::create(registry, *machine.device, *machine.compute);
    ASSERT_TRUE(store.has_value());
    std::vector<float> values(30);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    auto x = to_device(*machine.device, values);
    auto y = to_device(*machine.device, std::vector<float>(30, -1.0f));
    Context ctx{*machine.compute, **store, **store};
    ctx.training = false;
    ASSERT_TRUE((*dropout)->forward(ctx, x.as<float>(), y.as<float>(), 3));
    EXPECT_EQ(to_host(*machine.device, y.as<float>(), 30), values);
}

}  // namespace
}  // namespace zinf::model
