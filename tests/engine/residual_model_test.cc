// The engine trains any model::Model: a model defined here (two Linear layers with a residual
// add around them, from the module library) trains through the engine, learns, and gives
// bitwise the same losses in every placement, NVMe offload of parameters and states included.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "src/base/device_buffer.h"
#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/engine/engine.h"
#include "src/engine/trainer.h"
#include "src/model/layers.h"
#include "src/model/model.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/test_seed.h"
#include "zero/single_rank_communicator.h"

namespace zinf {
namespace {

using test_support::load_config;
using test_support::small_config;

// y = x + fc2(relu(fc1(x))), d features in and out; the logits y feed a softmax cross-entropy
// over d classes.
class ResidualModel final : public model::Model {
public:
    static std::unique_ptr<ResidualModel> create(Device& device, std::size_t d,
                                                 std::size_t rows_max) {
        std::unique_ptr<ResidualModel> m(new ResidualModel(device, d, rows_max));
        m->fc1_ = model::Linear::create(m->registry_, "fc1", d, d);
        m->relu_ = std::make_unique<model::Relu>(d);
        m->fc2_ = model::Linear::create(m->registry_, "fc2", d, d);
        m->loss_ = std::move(model::SoftmaxCrossEntropy::create(device, d, rows_max)).value();
        const std::size_t act = rows_max * d * sizeof(float);
        for (DeviceBuffer* b : {&m->a_, &m->y_, &m->dy_, &m->dh_}) {
            *b = std::move(DeviceBuffer::allocate(device, act, "residual: activations")).value();
        }
        m->scratch_numel_ = m->fc1_->grad_scratch_numel();
        m->scratch_ = std::move(DeviceBuffer::allocate(device, m->scratch_numel_ * sizeof(float),
                                                       "residual: scratch"))
                          .value();
        m->loss_value_ = std::move(DeviceBuffer::allocate(device, 64, "residual: loss")).value();
        return m;
    }

    std::string_view name() const noexcept override { return "residual (test)"; }
    const model::ParameterRegistry& parameters() const noexcept override { return registry_; }
    model::BatchShape batch_shape() const noexcept override {
        return {model::InputKind::kFloat32, d_, 1, d_};
    }
    std::size_t batch_rows_max() const noexcept override { return rows_max_; }
    std::size_t workspace_bytes() const noexcept override { return 0; }

    Status forward(const model::Context& ctx, const void* inputs, const std::int32_t* labels,
                   std::size_t rows) override {
        const model::Context c = with_scratch(ctx);
        const auto* x = static_cast<const float*>(inputs);
        ZINF_TRY(fc1_->forward(c, x, a_.as<float>(), rows));
        ZINF_TRY(relu_->forward(c, a_.as<float>(), a_.as<float>(), rows));
        ZINF_TRY(fc2_->forward(c, a_.as<float>(), y_.as<float>(), rows));
        ZINF_TRY(c.compute.axpy(1.0f, x, y_.as<float>(), rows * d_, c.stream));  // the residual
        rows_ = rows;
        labels_ = labels;
        return loss_->forward(c, y_.as<float>(), labels, rows, loss_value_.as<float>());
    }
    Status backward(const model::Context& ctx, float grad_scale) override {
        const model::Context c = with_scratch(ctx);
        ZINF_TRY(loss_->backward(c, grad_scale, dy_.as<float>()));
        // The residual passes dy to the input unchanged; the input needs no gradient here.
        ZINF_TRY(fc2_->backward(c, dy_.as<float>(), dh_.as<float>()));
        ZINF_TRY(relu_->backward(c, dh_.as<float>(), dh_.as<float>()));
        return fc1_->backward(c, dh_.as<float>(), nullptr);
    }
    Result<float> read_loss(StreamId stream) const override {
        float loss = 0;
        ZINF_TRY(device_.copy_to_host(&loss, loss_value_.data(), sizeof loss, stream));
        ZINF_TRY(device_.synchronize(stream));
        return loss;
    }
    Status count_correct(const model::Context& ctx, std::uint64_t* correct,
                         bool accumulate) const override {
        return ctx.compute.count_correct(y_.as<float>(), labels_, rows_, d_, correct, accumulate,
                                         ctx.stream);
    }
    Status read_predictions(StreamId stream, std::span<std::int32_t> out) const override {
        std::vector<float> y(rows_ * d_);
        ZINF_TRY(device_.copy_to_host(y.data(), y_.data(), y.size() * sizeof(float), stream));
        ZINF_TRY(device_.synchronize(stream));
        for (std::size_t r = 0; r < rows_; ++r) {
            const float* row = y.data() + r * d_;
            out[r] = static_cast<std::int32_t>(std::max_element(row, row + d_) - row);
        }
        return Status::ok();
    }

private:
    ResidualModel(Device& device, std::size_t d, std::size_t rows_max)
        : device_(device), d_(d), rows_max_(rows_max) {}
    model::Context with_scratch(const model::Context& ctx) const {
        model::Context c = ctx;
        c.grad_scratch = scratch_.as<float>();
        c.grad_scratch_numel = scratch_numel_;
        return c;
    }

    Device& device_;
    std::size_t d_;
    std::size_t rows_max_;
    model::ParameterRegistry registry_;
    std::unique_ptr<model::Linear> fc1_;
    std::unique_ptr<model::Relu> relu_;
    std::unique_ptr<model::Linear> fc2_;
    std::unique_ptr<model::SoftmaxCrossEntropy> loss_;
    DeviceBuffer a_, y_, dy_, dh_, scratch_, loss_value_;
    std::size_t scratch_numel_ = 0;
    std::size_t rows_ = 0;
    const std::int32_t* labels_ = nullptr;
};

constexpr std::size_t kWidth = 12;

// The residual model trained `steps` steps under `zero` (a zero_optimization block): its losses,
// the engine's summary and the accuracy after training.
struct Outcome {
    std::vector<float> losses;
    std::string summary;
    double accuracy = 0;
};

Outcome train(const std::string& zero, const std::string& nvme_dir, std::uint64_t steps) {
    const auto config = load_config(test_support::with_nvme(small_config(zero), nvme_dir),
                                    {"model.layers=[12, 12]", "data.epochs=10"});
    device::CpuDeviceOptions o;
    o.budget_bytes = config.device.memory_budget_bytes;
    auto device = std::move(device::CpuDevice::create(o)).value();
    auto compute = std::move(device::CpuCompute::create(device.get(), {1})).value();
    zero::SingleRankCommunicator communicator(*device);
    auto model =
        ResidualModel::create(*device, kWidth, config.batch.train_micro_batch_size_per_gpu);
    auto engine = Engine::create(config, *model, *device, *compute, communicator);
    ZINF_ASSERT_MSG(engine.has_value(), engine.error().to_string());
    data::SyntheticOptions so;
    so.count = 256;
    so.features = kWidth;
    so.classes = kWidth;
    so.seed = config.seed;
    auto dataset = std::move(data::SyntheticDataset::create(so)).value();
    Outcome run;
    run.summary = (*engine)->summary();
    test_support::LossCollector observer(run.losses);
    TrainerOptions to;
    to.max_steps = steps;
    to.evaluate_each_epoch = false;
    auto t = Trainer::create(**engine, *dataset, nullptr, to);
    ZINF_ASSERT_MSG(t.has_value(), t.error().to_string());
    auto summary = t->run(observer);
    ZINF_ASSERT_MSG(summary.has_value(), summary.error().to_string());
    run.accuracy = std::move(t->evaluate()).value();
    return run;
}

TEST(ResidualModelThroughTheEngine, LearnsAndIsBitwiseTheSameInEveryPlacement) {
    test::TempDir dir("residual");
    const Outcome base = train(R"("zero_optimization": {"stage": 0},)", dir.path(), 60);
    ASSERT_EQ(base.losses.size(), 60u);
    EXPECT_NE(base.summary.find("model residual (test)"), std::string::npos) << base.summary;
    // It learns: the mean of the last 10 losses is well below the first.
    double tail = 0;
    for (std::size_t i = 50; i < 60; ++i) tail += base.losses[i];
    EXPECT_LT(tail / 10, 0.8 * base.losses[0]) << base.losses[0] << " -> " << tail / 10;
    EXPECT_GT(base.accuracy, 1.5 / kWidth);  // better than chance
    for (const char* zero :
         {R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},)",
          R"("zero_optimization": {"stage": 3, "sub_group_size": 64,)"
          R"( "stage3_param_persistence_threshold": 0,)"
          R"( "offload_param": {"device": "nvme", "nvme_path": "@NVME@", "buffer_count": 2,)"
          R"( "buffer_size": 256, "max_in_cpu": 512},)"
          R"( "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@"}},)"}) {
        const Outcome other = train(zero, dir.path(), 60);
        EXPECT_EQ(test_support::bits(other.losses), test_support::bits(base.losses)) << zero;
        EXPECT_EQ(other.accuracy, base.accuracy) << zero;
    }
}

}  // namespace
}  // namespace zinf
