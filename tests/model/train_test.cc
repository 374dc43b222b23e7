// Short training runs of the Mlp: loss falls on a Fashion-MNIST subset (Adam written here) and
// on the synthetic dataset (SGD), and a run is bitwise reproducible across thread counts.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "src/data/batcher.h"
#include "src/data/dataset.h"
#include "src/model/mlp.h"
#include "src/model/parameter_store.h"
#include "tests/model/model_test_support.h"

namespace zinf::model {
namespace {

using test_support::make_machine;

// Plain Adam over every parameter of the store (bias-corrected, no weight decay). The CPU
// device's memory is host memory: after synchronize the parameters are updated in place.
class TestAdam {
public:
    TestAdam(const DeviceParameterStore& store, float lr) : store_(store), lr_(lr) {
        for (const ParameterInfo& info : store.registry().all()) {
            m_.emplace_back(info.numel, 0.0f);
            v_.emplace_back(info.numel, 0.0f);
        }
    }
    void step() {
        ++t_;
        const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
        const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t_));
        const float c2 = 1.0f - std::pow(beta2, static_cast<float>(t_));
        for (const ParameterInfo& info : store_.registry().all()) {
            float* p = store_.parameter(info.id);
            const float* g = store_.gradient(info.id);
            auto& m = m_[info.id];
            auto& v = v_[info.id];
            for (std::size_t i = 0; i < info.numel; ++i) {
                m[i] = beta1 * m[i] + (1 - beta1) * g[i];
                v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
                p[i] -= lr_ * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
            }
        }
    }

private:
    const DeviceParameterStore& store_;
    float lr_;
    int t_ = 0;
    std::vector<std::vector<float>> m_, v_;
};

void sgd_step(const DeviceParameterStore& store, float lr) {
    for (const ParameterInfo& info : store.registry().all()) {
        float* p = store.parameter(info.id);
        const float* g = store.gradient(info.id);
        for (std::size_t i = 0; i < info.numel; ++i) p[i] -= lr * g[i];
    }
}

// One model, its store and device-side batch buffers.
struct Trainer {
    test_support::Machine machine;
    std::unique_ptr<Mlp> mlp;
    std::unique_ptr<DeviceParameterStore> store;
    DeviceBuffer x, labels;
    std::vector<float> host_x;
    std::vector<std::int32_t> host_labels;

    Trainer(const MlpConfig& config, int threads, std::uint64_t init_seed)
        : machine(make_machine(threads)) {
        auto created = Mlp::create(config, *machine.device);
        ZINF_ASSERT_MSG(created.has_value(), created.status().to_string());
        mlp = std::move(created).value();
        auto made =
            DeviceParameterStore::create(mlp->parameters(), *machine.device, *machine.compute);
        ZINF_ASSERT(made.has_value());
        store = std::move(made).value();
        ZINF_ASSERT(store->initialize(init_seed, 0));
        const std::size_t rows = config.batch_rows_max;
        x = std::move(DeviceBuffer::allocate(*machine.device, rows * mlp->in_features() * 4, "x"))
                .value();
        labels = std::move(DeviceBuffer::allocate(*machine.device, rows * 4, "labels")).value();
        host_x.resize(rows * mlp->in_features());
        host_labels.resize(rows);
    }
    ~Trainer() {
        // Device memory goes back before the device.
        x.reset();
        labels.reset();
        store.reset();
        mlp.reset();
    }

    // Forward and backward of one batch; returns the loss. Gradients are left in the store.
    float train_batch(const data::Batcher& batcher, std::size_t batch, std::uint64_t step) {
        const std::size_t rows = batcher.fill(batch, host_x, host_labels);
        Device& device = *machine.device;
        ZINF_ASSERT(
            device.copy_to_device(x.data(), host_x.data(), rows * mlp->in_features() * 4, 0));
        ZINF_ASSERT(device.copy_to_device(labels.data(), host_labels.data(), rows * 4, 0));
        ZINF_ASSERT(store->zero_gradients(0));
        Context ctx{*machine.compute, *store, *store};
        ctx.step = step;
        ZINF_ASSERT(mlp->forward(ctx, x.as<float>(), labels.as<std::int32_t>(), rows));
        ZINF_ASSERT(mlp->backward(ctx, 1.0f));
        const auto loss = mlp->read_loss(0);  // synchronizes stream 0
        ZINF_ASSERT(loss.has_value());
        return *loss;
    }

    // Accuracy over the whole source, in evaluation mode.
    double accuracy(const data::DataSource& source) {
        auto batcher = data::Batcher::create(
            source, data::BatcherOptions{mlp->config().batch_rows_max, false, false, 0});
        ZINF_ASSERT(batcher.has_value());
        auto counter = DeviceBuffer::allocate(*machine.device, 8, "count");
        ZINF_ASSERT(counter.has_value());
        Context ctx{*machine.compute, *store, *store};
        ctx.training = false;
        for (std::size_t b = 0; b < batcher->batches_per_epoch(); ++b) {
            const std::size_t rows = batcher->fill(b, host_x, host_labels);
            ZINF_ASSERT(machine.device->copy_to_device(x.data(), host_x.data(),
                                                       rows * mlp->in_features() * 4, 0));
            ZINF_ASSERT(
                machine.device->copy_to_device(labels.data(), host_labels.data(), rows * 4, 0));
            ZINF_ASSERT(mlp->forward(ctx, x.as<float>(), labels.as<std::int32_t>(), rows));
            ZINF_ASSERT(mlp->count_correct(ctx, counter->as<std::uint64_t>(), b > 0));
        }
        const auto correct =
            test_support::to_host(*machine.device, counter->as<std::uint64_t>(), 1);
        return static_cast<double>(correct[0]) / static_cast<double>(source.count());
    }
};

TEST(Training, LossFallsOnAFashionMnistSubset) {
    if (!std::filesystem::exists(std::string(data::kFashionMnistDirectory) +
                                 "/train-images-idx3-ubyte.gz")) {
        GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
    }
    data::FashionMnistOptions options;
    options.limit = 2000;
    auto dataset = data::load_fashion_mnist(options);
    ASSERT_TRUE(dataset.has_value()) << dataset.status().to_string();

    MlpConfig config;
    config.layer_sizes = {784, 128, 10};
    config.batch_rows_max = 64;
    Trainer trainer(config, 2, 42);
    TestAdam adam(*trainer.store, 1e-3f);
    auto batcher = data::Batcher::create(**dataset, data::BatcherOptions{64, true, true, 7});
    ASSERT_TRUE(batcher.has_value());
    const double accuracy_before = trainer.accuracy(**dataset);

    const std::size_t per_epoch = batcher->batches_per_epoch();  // 31
    const std::size_t epochs = 8;                                // 248 steps
    std::vector<double> epoch_loss(epochs, 0.0);
    std::uint64_t step = 0;
    for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
        batcher->start_epoch(epoch);
        for (std::size_t b = 0; b < per_epoch; ++b) {
            const float loss = trainer.train_batch(*batcher, b, step++);
            ASSERT_TRUE(std::isfinite(loss));
            epoch_loss[epoch] += loss / static_cast<double>(per_epoch);
            adam.step();
        }
    }
    const double accuracy_after = trainer.accuracy(**dataset);
    std::printf("fashion-mnist subset: epoch loss %.4f -> %.4f, accuracy %.3f -> %.3f\n",
                epoch_loss.front(), epoch_loss.back(), accuracy_before, accuracy_after);
    EXPECT_LT(epoch_loss.back(), 0.6 * epoch_loss.front());
    EXPECT_LT(epoch_loss.back(), 0.5);
    EXPECT_GT(accuracy_after, 0.85);
}

TEST(Training, LossFallsOnSyntheticDataWithEveryModule) {
    data::SyntheticOptions options;
    options.count = 1024;
    options.features = 96;
    options.classes = 8;
    options.seed = 9;
    options.noise = 1.5f;
    auto dataset = data::SyntheticDataset::create(options);
    ASSERT_TRUE(dataset.has_value());
    MlpConfig config;
    config.layer_sizes = {96, 64, 64, 8};
    config.activation = Activation::kGelu;
    config.layer_norm = true;
    config.dropout_prob = 0.1f;
    config.batch_rows_max = 32;
    Trainer trainer(config, 2, 3);
    auto batcher = data::Batcher::create(**dataset, data::BatcherOptions{32, true, true, 5});
    ASSERT_TRUE(batcher.has_value());
    double first = 0, last = 0;
    const std::size_t steps = 128, window = 16;
    for (std::size_t step = 0; step < steps; ++step) {
        const std::size_t b = step % batcher->batches_per_epoch();
        if (b == 0) batcher->start_epoch(step / batcher->batches_per_epoch());
        const float loss = trainer.train_batch(*batcher, b, step);
        if (step < window) first += loss / window;
        if (step >= steps - window) last += loss / window;
        sgd_step(*trainer.store, 0.1f);
    }
    std::printf("synthetic: loss %.4f -> %.4f\n", first, last);
    EXPECT_LT(last, 0.5 * first);
}

// Parameters after a few steps with dropout and LayerNorm, for one thread count.
std::vector<std::vector<double>> train_few_steps(int threads) {
    data::SyntheticOptions options;
    options.count = 256;
    options.features = 300;
    options.classes = 5;
    auto dataset = data::SyntheticDataset::create(options);
    ZINF_ASSERT(dataset.has_value());
    MlpConfig config;
    config.layer_sizes = {300, 520, 270, 5};  // GEMM tiles with remainders
    config.layer_norm = true;
    config.dropout_prob = 0.2f;
    config.batch_rows_max = 100;
    Trainer trainer(config, threads, 11);
    auto batcher = data::Batcher::create(**dataset, data::BatcherOptions{100, true, true, 1});
    ZINF_ASSERT(batcher.has_value());
    for (std::uint64_t step = 0; step < 4; ++step) {
        (void)trainer.train_batch(*batcher, step % 2, step);
        sgd_step(*trainer.store, 0.05f);
    }
    return test_support::host_parameters(*trainer.machine.device, *trainer.store);
}

TEST(Training, IsBitwiseReproducibleAcrossThreadCounts) {
    tbb::global_control parallelism(tbb::global_control::max_allowed_parallelism, 8);
    const auto reference = train_few_steps(1);
    for (const int threads : {2, 5}) {
        const auto params = train_few_steps(threads);
        ASSERT_EQ(params.size(), reference.size());
        for (std::size_t p = 0; p < params.size(); ++p) {
            ASSERT_EQ(params[p], reference[p]) << "parameter " << p << " threads " << threads;
        }
    }
}

// Prints the time of one training step of the 784-1024-1024-10 model at batch 128 (forward,
// backward and an SGD update; no assertion on time): the figure quoted in src/model/README.md.
TEST(Training, FullSizeStepRunsAndReportsItsTime) {
    data::SyntheticOptions options;
    options.count = 1024;
    auto dataset = data::SyntheticDataset::create(options);
    ASSERT_TRUE(dataset.has_value());
    MlpConfig config;
    config.layer_sizes = {784, 1024, 1024, 10};
    config.batch_rows_max = 128;
    Trainer trainer(config, 0, 1);
    auto batcher = data::Batcher::create(**dataset, data::BatcherOptions{128, true, true, 1});
    ASSERT_TRUE(batcher.has_value());
    const int steps = 10;
    double best_ms = 1e9;
    for (int step = 0; step < steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        const float loss = trainer.train_batch(*batcher, static_cast<std::size_t>(step) % 8,
                                               static_cast<std::uint64_t>(step));
        const auto mid = std::chrono::steady_clock::now();
        sgd_step(*trainer.store, 0.01f);
        ASSERT_TRUE(std::isfinite(loss));
        best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(mid - start).count());
    }
    std::printf("784-1024-1024-10, batch 128, %s: forward+backward best %.2f ms\n",
                std::string(trainer.machine.compute->name()).c_str(), best_ms);
}

}  // namespace
}  // namespace zinf::model
