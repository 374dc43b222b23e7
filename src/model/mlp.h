// Mlp: a multi-layer perceptron classifier built from the module library, with the activation
// and gradient memory of one batch of up to batch_rows_max rows allocated at creation. Each
// hidden layer is Linear -> [LayerNorm] -> activation -> [Dropout]; the last layer is a Linear
// whose logits feed the softmax cross-entropy loss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/device.h"
#include "src/base/device_buffer.h"
#include "src/base/status.h"
#include "src/model/layers.h"
#include "src/model/model.h"
#include "src/model/module.h"
#include "src/model/parameter.h"

namespace zinf::model {

enum class Activation : std::uint8_t { kRelu, kGelu };

struct MlpConfig {
    // Input width, hidden widths, classes: {784, 1024, 1024, 10}. At least two entries.
    std::vector<std::size_t> layer_sizes;
    Activation activation = Activation::kRelu;
    float dropout_prob = 0.0f;  // after each hidden activation; 0: no Dropout modules
    bool layer_norm = false;    // LayerNorm after each hidden Linear
    float layer_norm_eps = 1e-5f;
    std::size_t batch_rows_max = 128;
    // Seeds the dropout masks (per module: philox::mix64(seed ^ philox::mix64(index))).
    // Parameter initial values are seeded separately (DeviceParameterStore::initialize).
    std::uint64_t seed = 1234;
};

// Parameter names: "layers.<i>.weight" / "layers.<i>.bias" for the i-th Linear,
// "norms.<i>.weight" / "norms.<i>.bias" for the LayerNorm after it.
class Mlp final : public Model {
public:
    // Builds the modules and registers the parameters; allocates activations, gradients and
    // scratch on `device` (borrowed, outlives the model). Errors: kInvalidArgument for a bad
    // config (message names the field), kNoSpace from the device budget.
    static Result<std::unique_ptr<Mlp>> create(const MlpConfig& config, Device& device);
    ~Mlp() override;
    Mlp(const Mlp&) = delete;
    Mlp& operator=(const Mlp&) = delete;

    // ---- Model ----
    std::string_view name() const noexcept override { return "mlp"; }
    const ParameterRegistry& parameters() const noexcept override { return registry_; }
    BatchShape batch_shape() const noexcept override {
        return BatchShape{InputKind::kFloat32, in_features(), 1, classes()};
    }
    std::size_t batch_rows_max() const noexcept override { return config_.batch_rows_max; }
    std::size_t workspace_bytes() const noexcept override { return workspace_bytes_; }
    Status forward(const Context& ctx, const void* inputs, const std::int32_t* labels,
                   std::size_t rows) override {
        return forward(ctx, static_cast<const float*>(inputs), labels, rows);
    }
    Status backward(const Context& ctx, float grad_scale) override;
    Result<float> read_loss(StreamId stream) const override;
    Status count_correct(const Context& ctx, std::uint64_t* correct_count,
                         bool accumulate) const override;
    Status read_predictions(StreamId stream, std::span<std::int32_t> out) const override;

    const MlpConfig& config() const noexcept { return config_; }
    std::size_t in_features() const noexcept { return config_.layer_sizes.front(); }
    std::size_t classes() const noexcept { return config_.layer_sizes.back(); }
    std::size_t module_count() const noexcept { return modules_.size(); }
    const Module& module(std::size_t index) const {
        ZINF_ASSERT_LT(index, modules_.size());
        return *modules_[index];
    }
    // Runs the modules over x (rows x in_features, device memory, rows in [1, batch_rows_max]).
    // With labels (rows int32 in [0, classes), device memory) it also computes the mean loss
    // into loss_device(). x and labels stay borrowed until backward. The context's grad_scratch
    // is ignored (the model supplies its own).
    Status forward(const Context& ctx, const float* x, const std::int32_t* labels,
                   std::size_t rows);
    // Outputs of the last forward, in device memory.
    const float* logits() const noexcept { return activations_.back().as<float>(); }
    const float* loss_device() const noexcept { return scalars_.as<float>(); }

private:
    Mlp(const MlpConfig& config, Device& device) : config_(config), device_(device) {}
    // create's steps: the config's checks, the modules (registering their parameters) and the
    // loss, then the memory of one batch of batch_rows_max rows.
    static Status check_config(const MlpConfig& config);
    Status add_modules();
    Status allocate_buffers();
    Context with_scratch(const Context& ctx) const;

    MlpConfig config_;
    Device& device_;
    ParameterRegistry registry_;
    std::vector<std::unique_ptr<Module>> modules_;
    std::unique_ptr<SoftmaxCrossEntropy> loss_;
    std::vector<DeviceBuffer> activations_;  // output of each module, batch_rows_max rows
    DeviceBuffer grad_a_;                    // ping-pong input/output gradients
    DeviceBuffer grad_b_;
    DeviceBuffer grad_scratch_;
    DeviceBuffer scalars_;  // the loss (one float)
    std::size_t grad_scratch_numel_ = 0;
    std::size_t workspace_bytes_ = 0;
    const std::int32_t* labels_ = nullptr;
    std::size_t rows_ = 0;
    bool trained_forward_ = false;
};

}  // namespace zinf::model
